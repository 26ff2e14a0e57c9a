//! Operators' webhooks: a JSON POST per notification (an event received,
//! its drain blocked, its approval accepted by IMDS, started, completed,
//! and a node's unexpected restart), in forewarn's own JSON or ready for a
//! Slack or Microsoft Teams incoming webhook.
//!
//! The endpoints come from a YAML file (`--webhooks-file`; in the chart a
//! Secret, since a webhook URL is a credential), read at start; a bad file
//! stops the controller with the file, the webhook and the reason. The
//! file is read again when its content changes ([`watch`]): a valid one is
//! put in force ([`Webhooks::reload`]), an invalid one is refused and the
//! webhooks in force stay:
//!
//! ```yaml
//! cluster: prod-westeurope-1     # optional: named in every message
//! webhooks:
//!   - name: oncall-slack         # DNS label, unique: the metric's `webhook` label
//!     url: https://hooks.slack.com/services/T0/B0/XXXX
//!     format: Slack              # JSON (default) | Slack | Teams
//!     notifications: [DrainBlocked, UnexpectedRestart]   # default: all six
//!   - name: audit
//!     url: https://events.example.com/forewarn
//!     headers: {Authorization: Bearer s3cr3t}            # optional
//!     timeoutSeconds: 10         # per attempt, 1..=60 (default 10)
//!     maxAttempts: 5             # 1..=10 (default 5)
//!     caFile: /etc/forewarn/webhooks/ca.pem              # optional: trust these roots only
//! ```
//!
//! Delivery: only the leader sends (the notifications come from its
//! reconciles). Each webhook has its own queue ([`QUEUE`] messages; when
//! full a message is dropped and counted) and its own worker, which sends
//! in order, one at a time, retrying a connection error, a timeout, a 408,
//! a 429 or a 5xx with exponential backoff (1 s doubling to 30 s, jittered;
//! never sooner than the answer's `Retry-After` in seconds, up to 60)
//! up to `maxAttempts` attempts; another 4xx is not retried. Every
//! outcome is counted in
//! `forewarn_controller_webhook_deliveries_total{webhook, notification,
//! result}` (`delivered`, `retried`: one per retry, `failed`: attempts
//! exhausted, `rejected`: a 4xx, `dropped`: queue full or stopping). Like
//! Kubernetes Events, notifications are best effort: the `ScheduledEvent`
//! status is the record. A stopping leader delivers what it has queued
//! for a bounded time ([`Webhooks::finish`]); what is left then is lost.
//! The URL is never logged (it carries the credential): logs name the
//! webhook.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, Utc};
use prometheus::IntCounterVec;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::{error, info, warn};

use crate::api::{ScheduledEvent, ScheduledEventStatus};

/// Messages that may wait for one webhook; beyond it new ones are dropped
/// (counted `dropped`).
pub const QUEUE: usize = 256;
/// At most this many webhooks.
pub const MAX_WEBHOOKS: usize = 16;
/// The longest `Retry-After` honoured; a longer one waits this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Nodes (and blockers) named in a message; the rest are counted.
pub const NAMED: usize = 20;

/// What a message is about.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum Notification {
    /// forewarn saw the event for the first time (its `ScheduledEvent`'s
    /// `status.firstSeen` was set).
    Received,
    /// A PodDisruptionBudget refused an eviction of the event's drain (the
    /// condition `DrainBlocked` became true): the message names each node,
    /// budget and pod.
    DrainBlocked,
    /// IMDS accepted the approval (Azure may start the event now).
    Approved,
    /// The event started (IMDS lists it `Started`).
    Started,
    /// The event is over: phase `Completed`, or `Cancelled` (the `phase`
    /// field says which).
    Completed,
    /// A node's `bootID` changed outside any event that announces a restart
    /// (the Warning Event `UnexpectedRestart`).
    UnexpectedRestart,
}

impl Notification {
    /// Every notification, in the order of an event's life.
    pub const ALL: [Notification; 6] = [
        Notification::Received,
        Notification::DrainBlocked,
        Notification::Approved,
        Notification::Started,
        Notification::Completed,
        Notification::UnexpectedRestart,
    ];

    /// Its name, as in the file and the metric.
    pub fn as_str(self) -> &'static str {
        match self {
            Notification::Received => "Received",
            Notification::DrainBlocked => "DrainBlocked",
            Notification::Approved => "Approved",
            Notification::Started => "Started",
            Notification::Completed => "Completed",
            Notification::UnexpectedRestart => "UnexpectedRestart",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Notification::Received => "event received",
            Notification::DrainBlocked => "drain blocked",
            Notification::Approved => "approved",
            Notification::Started => "event started",
            Notification::Completed => "event over",
            Notification::UnexpectedRestart => "unexpected node restart",
        }
    }
}

/// The body a webhook receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum Format {
    /// forewarn's own JSON document (README "Webhooks").
    #[default]
    #[serde(rename = "JSON")]
    Json,
    /// A Slack incoming webhook's `{"text": …}` (mrkdwn).
    Slack,
    /// A Microsoft Teams webhook (a Workflows "post to a channel when a
    /// webhook request is received" flow, or a connector): a message with
    /// one Adaptive Card (version 1.4).
    Teams,
}

/// One webhook of the file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Webhook {
    /// A DNS label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63), unique in
    /// the file: logs and the metric name the webhook by it.
    pub name: String,
    /// `https://` (or `http://`, e.g. a receiver in the cluster) URL the
    /// message is POSTed to. A credential: never logged.
    pub url: String,
    /// The body's format. Default `JSON`.
    #[serde(default)]
    pub format: Format,
    /// The notifications this webhook gets. Default: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<Vec<Notification>>,
    /// Extra request headers (e.g. `Authorization`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Seconds one attempt may take, 1 to 60. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60))]
    pub timeout_seconds: Option<u64>,
    /// Attempts per message, 1 to 10. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub max_attempts: Option<u32>,
    /// A PEM file of the only roots trusted for this webhook's TLS (a
    /// private CA). Default: the public roots (Mozilla's, built in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// The webhooks file.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// The cluster's name, given in every message (optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The webhooks, at most 16.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub webhooks: Vec<Webhook>,
}

/// A webhooks file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file cannot be read.
    #[error("cannot read the webhooks file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a webhooks file (YAML error, unknown key, bad type).
    #[error("the webhooks file {path} is invalid: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message.
        message: String,
    },
    /// A webhook's value is out of bounds.
    #[error("the webhooks file {path}: webhook {webhook:?}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// The webhook's name (or its position when it has none).
        webhook: String,
        /// Why.
        reason: String,
    },
}

impl Config {
    /// Reads and validates the file at `path`; gives its text too (what a
    /// [`watch`] compares with).
    ///
    /// # Errors
    /// [`Error::Read`], [`Error::Parse`] or [`Error::Invalid`].
    pub fn load_text(path: &str) -> Result<(Config, String), Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.into(),
            source,
        })?;
        Ok((Self::parse(&text, path)?, text))
    }

    /// Parses and validates `text`, read from `path` (named in errors).
    ///
    /// # Errors
    /// [`Error::Parse`] or [`Error::Invalid`].
    pub fn parse(text: &str, path: &str) -> Result<Config, Error> {
        let config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| Error::Parse {
                path: path.into(),
                message: without_urls(&e.to_string()),
            })?
        };
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &str) -> Result<(), Error> {
        let invalid = |webhook: &str, reason: String| Error::Invalid {
            path: path.into(),
            webhook: webhook.into(),
            reason,
        };
        if self.webhooks.len() > MAX_WEBHOOKS {
            return Err(invalid(
                "",
                format!("{} webhooks, at most {MAX_WEBHOOKS}", self.webhooks.len()),
            ));
        }
        let mut names = HashSet::new();
        for (i, w) in self.webhooks.iter().enumerate() {
            let label = if w.name.is_empty() {
                format!("#{}", i + 1)
            } else {
                w.name.clone()
            };
            if !is_dns_label(&w.name) {
                return Err(invalid(
                    &label,
                    "name must be a DNS label: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters"
                        .into(),
                ));
            }
            if !names.insert(w.name.as_str()) {
                return Err(invalid(&label, "name used twice".into()));
            }
            // The URL itself is never shown: it carries the credential.
            let url = reqwest::Url::parse(&w.url)
                .map_err(|e| invalid(&label, format!("url is not a URL ({e})")))?;
            if !matches!(url.scheme(), "https" | "http") || url.host_str().is_none() {
                return Err(invalid(
                    &label,
                    "url must be an https:// (or http://) URL with a host".into(),
                ));
            }
            if w.timeout_seconds.is_some_and(|t| !(1..=60).contains(&t)) {
                return Err(invalid(&label, "timeoutSeconds must be 1 to 60".into()));
            }
            if w.max_attempts.is_some_and(|n| !(1..=10).contains(&n)) {
                return Err(invalid(&label, "maxAttempts must be 1 to 10".into()));
            }
            if w.notifications.as_ref().is_some_and(Vec::is_empty) {
                return Err(invalid(
                    &label,
                    "notifications is empty: leave it out for all, or remove the webhook".into(),
                ));
            }
            for (k, v) in &w.headers {
                if http::HeaderName::from_bytes(k.as_bytes()).is_err() {
                    return Err(invalid(
                        &label,
                        format!("header {k:?} is not a header name"),
                    ));
                }
                if http::HeaderValue::from_str(v).is_err() {
                    return Err(invalid(
                        &label,
                        format!("header {k:?} has a value that cannot be sent"),
                    ));
                }
            }
            if let Some(ca) = &w.ca_file {
                read_roots(ca).map_err(|reason| invalid(&label, reason))?;
            }
        }
        Ok(())
    }
}

/// The parser's message without what could show a URL (a credential): its
/// first line only (the rest quotes the file), and any `scheme://…` word
/// in it replaced by `<url>`.
fn without_urls(message: &str) -> String {
    message
        .lines()
        .next()
        .unwrap_or_default()
        .split(' ')
        .map(|w| if w.contains("://") { "<url>" } else { w })
        .collect::<Vec<_>>()
        .join(" ")
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn read_roots(path: &str) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("caFile {path}: {e}"))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("caFile {path} is not a PEM bundle: {}", e.without_url()))?;
    if certs.is_empty() {
        return Err(format!("caFile {path} holds no certificate"));
    }
    Ok(certs)
}

/// The facts of the event a message is about.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventFacts {
    /// The `ScheduledEvent`'s name.
    pub name: String,
    /// Azure's `EventId`.
    pub event_id: String,
    /// `EventType`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// `EventSource`.
    pub source: String,
    /// `EventStatus` as IMDS last said.
    pub status: String,
    /// `NotBefore` (absent once started).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    /// `DurationInSeconds` (-1: unknown).
    pub duration_seconds: i64,
    /// `Resources`: the VMs.
    pub resources: Vec<String>,
    /// forewarn's phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

impl EventFacts {
    /// The facts of `ev` with its new `status`.
    pub fn of(ev: &ScheduledEvent, status: Option<&ScheduledEventStatus>) -> Self {
        let s = &ev.spec;
        EventFacts {
            name: ev.metadata.name.clone().unwrap_or_default(),
            event_id: s.event_id.clone(),
            event_type: s.event_type.clone(),
            source: s.event_source.clone(),
            status: s.event_status.as_str().into(),
            not_before: s.not_before,
            duration_seconds: s.duration_seconds,
            resources: s.resources.clone(),
            phase: status.and_then(|st| st.phase).map(|p| p.as_str().into()),
        }
    }
}

/// What blocks a node's drain.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Blocker {
    /// The node.
    pub node: String,
    /// The PodDisruptionBudgets (`namespace/name`) that refused.
    pub pod_disruption_budgets: Vec<String>,
    /// The pods (`namespace/name`) whose eviction was refused.
    pub pods: Vec<String>,
    /// The API server's reason, as in the status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One notification's content.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// What it is about.
    pub notification: Notification,
    /// When forewarn saw it.
    pub time: DateTime<Utc>,
    /// One line of plain text.
    pub summary: String,
    /// The event (none for an unexpected restart outside any event).
    pub event: Option<EventFacts>,
    /// The nodes concerned.
    pub nodes: Vec<String>,
    /// What blocks the drain (`DrainBlocked`).
    pub blockers: Vec<Blocker>,
    /// The restarted node's old and new `bootID` (`UnexpectedRestart`).
    pub boot_id: Option<(String, String)>,
    /// Sent by a `--dry-run` controller (nothing was cordoned or approved).
    pub dry_run: bool,
}

impl Message {
    /// A message about `ev` whose status is now `status`.
    pub fn about(
        notification: Notification,
        ev: &ScheduledEvent,
        status: &ScheduledEventStatus,
        summary: String,
    ) -> Self {
        let mut nodes: Vec<String> = status
            .nodes
            .iter()
            .flatten()
            .map(|n| n.name.clone())
            .collect();
        nodes.sort();
        Message {
            notification,
            time: Utc::now(),
            summary,
            event: Some(EventFacts::of(ev, Some(status))),
            nodes,
            blockers: Vec::new(),
            boot_id: None,
            dry_run: false,
        }
    }

    /// A node's unexpected restart: its `bootID` went from `boot_id.0` to
    /// `boot_id.1`; `during` is an event that affects it without
    /// announcing a restart, if any.
    pub fn unexpected_restart(
        node: &str,
        boot_id: (&str, &str),
        during: Option<&ScheduledEvent>,
        summary: String,
    ) -> Self {
        Message {
            notification: Notification::UnexpectedRestart,
            time: Utc::now(),
            summary,
            event: during.map(|e| EventFacts::of(e, e.status.as_ref())),
            nodes: vec![node.to_string()],
            blockers: Vec::new(),
            boot_id: Some((boot_id.0.to_string(), boot_id.1.to_string())),
            dry_run: false,
        }
    }

    /// forewarn's JSON document (`format: JSON`):
    ///
    /// ```json
    /// {"apiVersion": "forewarn.dev/v1", "kind": "Notification",
    ///  "notification": "DrainBlocked", "time": "2026-11-26T10:00:00Z",
    ///  "cluster": "prod", "dryRun": false, "summary": "…",
    ///  "event": {"name", "eventId", "type", "source", "status", "notBefore",
    ///            "durationSeconds", "resources", "phase"},
    ///  "nodes": ["…"], "nodesOmitted": 0,
    ///  "blockers": [{"node", "podDisruptionBudgets", "pods", "reason"}],
    ///  "bootId": {"old": "…", "new": "…"}}
    /// ```
    ///
    /// `cluster`, `event`, `blockers` and `bootId` are left out when they
    /// do not apply; at most [`NAMED`] nodes and blockers are listed.
    pub fn json(&self, cluster: Option<&str>) -> Value {
        let mut doc = json!({
            "apiVersion": "forewarn.dev/v1",
            "kind": "Notification",
            "notification": self.notification.as_str(),
            "time": self.time,
            "dryRun": self.dry_run,
            "summary": self.summary,
            "nodes": self.nodes.iter().take(NAMED).collect::<Vec<_>>(),
            "nodesOmitted": self.nodes.len().saturating_sub(NAMED),
        });
        let m = doc.as_object_mut().expect("an object");
        if let Some(c) = cluster {
            m.insert("cluster".into(), c.into());
        }
        if let Some(e) = &self.event {
            m.insert("event".into(), json!(e));
        }
        if !self.blockers.is_empty() {
            m.insert(
                "blockers".into(),
                json!(self.blockers.iter().take(NAMED).collect::<Vec<_>>()),
            );
        }
        if let Some((old, new)) = &self.boot_id {
            m.insert("bootId".into(), json!({"old": old, "new": new}));
        }
        doc
    }

    /// The title line: `forewarn [cluster]: drain blocked: Reboot <EventId>`.
    fn title(&self, cluster: Option<&str>) -> String {
        let mut t = String::from("forewarn");
        if let Some(c) = cluster {
            t.push_str(&format!(" [{c}]"));
        }
        if self.dry_run {
            t.push_str(" (dry run)");
        }
        t.push_str(": ");
        t.push_str(self.notification.title());
        if let Some(e) = &self.event {
            t.push_str(&format!(": {} {}", e.event_type, e.event_id));
        }
        t
    }

    /// The facts listed under the summary, as `(name, value)`.
    fn facts(&self) -> Vec<(String, String)> {
        let mut f = Vec::new();
        if let Some(e) = &self.event {
            f.push(("EventId".into(), e.event_id.clone()));
            f.push(("Type".into(), format!("{} ({})", e.event_type, e.source)));
            if let Some(nb) = e.not_before {
                f.push(("NotBefore".into(), nb.to_rfc3339()));
            }
            if let Some(p) = &e.phase {
                f.push(("Phase".into(), p.clone()));
            }
        }
        if !self.nodes.is_empty() {
            f.push(("Nodes".into(), listed(&self.nodes)));
        }
        for b in self.blockers.iter().take(NAMED) {
            f.push((
                format!("Blocked on {}", b.node),
                format!(
                    "PodDisruptionBudget {}; pods {}",
                    b.pod_disruption_budgets.join(", "),
                    b.pods.join(", ")
                ),
            ));
        }
        if let Some((old, new)) = &self.boot_id {
            f.push(("bootID".into(), format!("{old} -> {new}")));
        }
        f
    }

    /// The body for `format`.
    pub fn body(&self, format: Format, cluster: Option<&str>) -> Value {
        match format {
            Format::Json => self.json(cluster),
            Format::Slack => {
                let mut text = format!(
                    "*{}*\n{}",
                    slack_escape(&self.title(cluster)),
                    slack_escape(&self.summary)
                );
                for (k, v) in self.facts() {
                    text.push_str(&format!("\n• *{}*: {}", slack_escape(&k), slack_escape(&v)));
                }
                json!({ "text": text })
            }
            Format::Teams => {
                let facts: Vec<Value> = self
                    .facts()
                    .into_iter()
                    .map(|(k, v)| json!({"title": k, "value": v}))
                    .collect();
                json!({
                    "type": "message",
                    "attachments": [{
                        "contentType": "application/vnd.microsoft.card.adaptive",
                        "contentUrl": null,
                        "content": {
                            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                            "type": "AdaptiveCard",
                            "version": "1.4",
                            "body": [
                                {"type": "TextBlock", "size": "Medium", "weight": "Bolder",
                                 "text": self.title(cluster), "wrap": true},
                                {"type": "TextBlock", "text": self.summary, "wrap": true},
                                {"type": "FactSet", "facts": facts},
                            ],
                        },
                    }],
                })
            }
        }
    }
}

fn listed(items: &[String]) -> String {
    let mut s = items
        .iter()
        .take(NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > NAMED {
        s.push_str(&format!(" and {} more", items.len() - NAMED));
    }
    s
}

/// Slack's mrkdwn escapes: `&`, `<` and `>` (Slack's "Formatting text").
fn slack_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One webhook's queue.
struct Endpoint {
    name: String,
    format: Format,
    notifications: HashSet<Notification>,
    queue: tokio::sync::mpsc::Sender<(Notification, Value)>,
}

/// The configured webhooks; cheap to clone (the clones share them).
#[derive(Clone)]
pub struct Webhooks {
    shared: Arc<Shared>,
}

struct Shared {
    /// The webhooks in force (none: `None`); [`Webhooks::reload`] swaps it.
    active: std::sync::RwLock<Option<Arc<Inner>>>,
    /// Every worker started, those of replaced sets included (each ends
    /// once its set is dropped and its queue emptied).
    workers: std::sync::Mutex<Vec<(String, tokio::task::JoinHandle<()>)>>,
    /// Turns true on [`Webhooks::finish`]: each worker then empties its
    /// queue and ends, and no set is started any more.
    closing: tokio::sync::watch::Sender<bool>,
    counted: IntCounterVec,
    dry_run: bool,
}

/// One set of webhooks (a file's), while in force.
struct Inner {
    cluster: Option<String>,
    endpoints: Vec<Endpoint>,
}

impl Webhooks {
    /// Starts one delivery worker per webhook of `config`, counting in
    /// `counted` (labels `webhook`, `notification`, `result`). Messages of
    /// a `dry_run` controller say so.
    ///
    /// # Errors
    /// When a webhook's HTTP client cannot be built (its `caFile`).
    pub fn start(config: Config, counted: IntCounterVec, dry_run: bool) -> anyhow::Result<Self> {
        let hooks = Webhooks {
            shared: Arc::new(Shared {
                active: std::sync::RwLock::new(None),
                workers: std::sync::Mutex::new(Vec::new()),
                closing: tokio::sync::watch::Sender::new(false),
                counted,
                dry_run,
            }),
        };
        hooks.reload(config)?;
        Ok(hooks)
    }

    /// Puts `config` in force: starts its workers, then swaps it for the
    /// set in force. The replaced set's workers still deliver what was
    /// queued for them, then end. A `config` whose clients cannot be
    /// built changes nothing.
    ///
    /// # Errors
    /// When a webhook's HTTP client cannot be built (its `caFile`), or the
    /// webhooks are finishing ([`Webhooks::finish`]).
    pub fn reload(&self, config: Config) -> anyhow::Result<()> {
        let shared = &self.shared;
        if *shared.closing.borrow() {
            anyhow::bail!("the webhooks are stopping");
        }
        if config.webhooks.is_empty() {
            *shared
                .active
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            return Ok(());
        }
        // Every client first: a webhook that cannot be built leaves the set
        // in force alone.
        let mut built = Vec::new();
        for w in config.webhooks {
            let roots = match &w.ca_file {
                Some(ca) => {
                    read_roots(ca).map_err(|e| anyhow::anyhow!("webhook {}: {e}", w.name))?
                }
                None => crate::http::public_roots(),
            };
            let timeout = Duration::from_secs(w.timeout_seconds.unwrap_or(10));
            let client = crate::http::bare_builder()
                .tls_certs_only(roots)
                .timeout(timeout)
                .connect_timeout(timeout.min(Duration::from_secs(5)))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| anyhow::anyhow!("webhook {}: {}", w.name, e.without_url()))?;
            built.push((w, client));
        }
        let counted = &shared.counted;
        let mut endpoints = Vec::new();
        let mut started = Vec::new();
        for (w, client) in built {
            let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
            let mut headers = http::HeaderMap::new();
            for (k, v) in &w.headers {
                if let (Ok(k), Ok(v)) = (
                    http::HeaderName::from_bytes(k.as_bytes()),
                    http::HeaderValue::from_str(v),
                ) {
                    headers.insert(k, v);
                }
            }
            for n in Notification::ALL {
                for r in ["delivered", "failed"] {
                    counted.with_label_values(&[&w.name, n.as_str(), r]);
                }
            }
            let worker = Worker {
                name: w.name.clone(),
                client,
                url: w.url.clone(),
                headers,
                attempts: w.max_attempts.unwrap_or(5),
                counted: counted.clone(),
            };
            started.push((
                w.name.clone(),
                tokio::spawn(worker.run(rx, shared.closing.subscribe())),
            ));
            info!(webhook = %w.name, format = ?w.format, "Webhook configured");
            endpoints.push(Endpoint {
                name: w.name,
                format: w.format,
                notifications: w.notifications.map_or_else(
                    || Notification::ALL.into_iter().collect(),
                    |n| n.into_iter().collect(),
                ),
                queue: tx,
            });
        }
        {
            let mut workers = shared
                .workers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            workers.retain(|(_, t)| !t.is_finished());
            workers.extend(started);
        }
        *shared
            .active
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(Inner {
            cluster: config.cluster,
            endpoints,
        }));
        Ok(())
    }

    /// The set in force, if any webhook is configured.
    fn active(&self) -> Option<Arc<Inner>> {
        self.shared
            .active
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether any webhook is configured: without one, nothing need build
    /// a [`Message`].
    pub fn is_enabled(&self) -> bool {
        self.active().is_some()
    }

    /// Queues `message` for every webhook that wants its notification; returns
    /// at once (a message that finds a queue full, or the webhooks stopping,
    /// is dropped and counted).
    pub fn notify(&self, mut message: Message) {
        let Some(inner) = self.active() else {
            return;
        };
        message.dry_run = self.shared.dry_run;
        let n = message.notification;
        for e in inner
            .endpoints
            .iter()
            .filter(|e| e.notifications.contains(&n))
        {
            let body = message.body(e.format, inner.cluster.as_deref());
            let why = match e.queue.try_send((n, body)) {
                Ok(()) => continue,
                Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                    "The webhook's queue is full: a notification was dropped"
                }
                Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {
                    "The controller is stopping: a notification was dropped"
                }
            };
            self.shared
                .counted
                .with_label_values(&[&e.name, n.as_str(), "dropped"])
                .inc();
            warn!(webhook = %e.name, notification = n.as_str(), "{why}");
        }
    }

    /// Delivers what is already queued, then stops the workers; waits at
    /// most `within` (a pod's termination grace period bounds it), then
    /// stops the rest. Messages queued after this call are dropped
    /// (counted).
    ///
    /// Returns the webhooks whose queued messages were not all tried (empty
    /// when every queue was emptied in time).
    pub async fn finish(&self, within: Duration) -> Vec<String> {
        // Each worker closes its queue and ends once it has tried what
        // was in it (retries included).
        self.shared.closing.send_replace(true);
        let workers = std::mem::take(
            &mut *self
                .shared
                .workers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let deadline = tokio::time::Instant::now() + within;
        let mut left = Vec::new();
        for (name, mut task) in workers {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                task.abort();
                warn!(webhook = %name, within = ?within, "Stopping with notifications still queued for this webhook: they are not sent");
                left.push(name);
            }
        }
        left
    }
}

/// Polls the webhooks file at `path` every
/// [`crate::controller::runtime::reload::POLL_INTERVAL`] (a Secret volume swaps a symlink: the
/// content is compared, from `initial`, the text in force) and puts each
/// valid new file in force ([`Webhooks::reload`]). A file that cannot be
/// used (unreadable, invalid, a client that cannot be built) is refused
/// with an error log, `forewarn_controller_webhooks_reloads_total{result=
/// "refused"}` and `forewarn_controller_webhooks_file_refused` 1 until a
/// valid file is loaded; the webhooks in force stay. A change of a
/// `caFile` alone is not seen: the webhooks file must change too.
pub async fn watch(
    path: std::path::PathBuf,
    initial: String,
    webhooks: Webhooks,
    metrics: crate::metrics::controller::ControllerMetrics,
) {
    let shown = path.to_string_lossy().to_string();
    let mut changes = crate::controller::runtime::reload::Changes::new(initial);
    let mut tick = tokio::time::interval(crate::controller::runtime::reload::POLL_INTERVAL);
    loop {
        tick.tick().await;
        let Some(read) = changes.changed(crate::controller::runtime::reload::read(&path).await)
        else {
            continue;
        };
        let loaded = read
            .map_err(|source| {
                anyhow::Error::from(Error::Read {
                    path: shown.clone(),
                    source,
                })
            })
            .and_then(|text| Ok(Config::parse(&text, &shown)?))
            .and_then(|config| {
                let names: Vec<String> = config.webhooks.iter().map(|w| w.name.clone()).collect();
                webhooks.reload(config)?;
                Ok(names)
            });
        match loaded {
            Ok(names) => {
                info!(webhooks = ?names, "Webhooks file changed: the new webhooks are in force");
                metrics
                    .webhooks_reloads
                    .with_label_values(&["loaded"])
                    .inc();
                metrics.webhooks_refused.set(0);
            }
            Err(e) => {
                error!(error = %e, "Refused the changed webhooks file; the webhooks in force stay until the file is fixed");
                metrics
                    .webhooks_reloads
                    .with_label_values(&["refused"])
                    .inc();
                metrics.webhooks_refused.set(1);
            }
        }
    }
}

/// Delivers one webhook's messages, in order.
struct Worker {
    name: String,
    client: reqwest::Client,
    url: String,
    headers: http::HeaderMap,
    attempts: u32,
    counted: IntCounterVec,
}

/// Why an attempt failed.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// The answer's status, and its `Retry-After` (in seconds: what Slack
    /// and Teams send with a 429), at most [`MAX_RETRY_AFTER`].
    #[error("the receiver answered {0}")]
    Status(u16, Option<Duration>),
    #[error("{0}")]
    Transport(String),
}

impl Failure {
    /// Worth another attempt: no answer, or 408, 429 or 5xx.
    fn retryable(&self) -> bool {
        match self {
            Failure::Status(code, _) => matches!(code, 408 | 429 | 500..=599),
            Failure::Transport(_) => true,
        }
    }
}

impl Worker {
    /// Delivers each message of `rx` in turn; once `closing` turns true,
    /// delivers what is queued and returns.
    async fn run(
        self,
        mut rx: tokio::sync::mpsc::Receiver<(Notification, Value)>,
        mut closing: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut watching = true;
        loop {
            let next = if watching {
                tokio::select! {
                    next = rx.recv() => next,
                    closed = closing.wait_for(|c| *c) => {
                        watching = false;
                        // Closing (not every `Webhooks` dropped): take
                        // nothing more; what is queued is still received.
                        if closed.is_ok() {
                            rx.close();
                        }
                        continue;
                    }
                }
            } else {
                rx.recv().await
            };
            let Some((n, body)) = next else {
                return;
            };
            let count = |result: &str| {
                self.counted
                    .with_label_values(&[&self.name, n.as_str(), result])
                    .inc();
            };
            let sent = (|| self.attempt(&body))
                .retry(
                    ExponentialBuilder::default()
                        .with_min_delay(Duration::from_secs(1))
                        .with_max_delay(Duration::from_secs(30))
                        .with_jitter()
                        .with_max_times(self.attempts.saturating_sub(1) as usize),
                )
                .when(Failure::retryable)
                // A receiver that says when to come back is not asked sooner.
                .adjust(|e, d| match (e, d) {
                    (Failure::Status(_, Some(after)), Some(d)) => Some(d.max(*after)),
                    _ => d,
                })
                .notify(|e, d| {
                    count("retried");
                    warn!(webhook = %self.name, notification = n.as_str(), error = %e, retry_in = ?d, "Webhook delivery failed; will retry");
                })
                .await;
            match sent {
                Ok(()) => {
                    count("delivered");
                    info!(webhook = %self.name, notification = n.as_str(), "Webhook delivered");
                }
                Err(e) if e.retryable() => {
                    count("failed");
                    warn!(webhook = %self.name, notification = n.as_str(), error = %e, attempts = self.attempts, "Webhook delivery failed after every attempt; dropped");
                }
                Err(e) => {
                    count("rejected");
                    warn!(webhook = %self.name, notification = n.as_str(), error = %e, "The webhook's receiver refused the notification (not retried)");
                }
            }
        }
    }

    async fn attempt(&self, body: &Value) -> Result<(), Failure> {
        let response = self
            .client
            .post(&self.url)
            .headers(self.headers.clone())
            .json(body)
            .send()
            .await
            .map_err(|e| Failure::Transport(error_chain(&e.without_url())))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER));
        Err(Failure::Status(status.as_u16(), retry_after))
    }
}

/// An error and its sources, `: `-joined (reqwest's own text is terse).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NodeProgress, Phase};
    use crate::fixtures;

    fn ev() -> ScheduledEvent {
        ScheduledEvent::new(
            "5d0e7a11",
            fixtures::spec("5D0E7A11")
                .vms(["vmss_1"])
                .not_before(
                    DateTime::parse_from_rfc3339("2026-11-26T10:15:00Z")
                        .unwrap()
                        .with_timezone(&Utc),
                )
                .build(),
        )
    }

    fn blocked() -> Message {
        let status = ScheduledEventStatus {
            phase: Some(Phase::Draining),
            nodes: Some(vec![NodeProgress {
                name: "node-1".into(),
                ..NodeProgress::default()
            }]),
            ..ScheduledEventStatus::default()
        };
        let mut m = Message::about(
            Notification::DrainBlocked,
            &ev(),
            &status,
            "drain of node-1 blocked by <PodDisruptionBudget> shop/web & co".into(),
        );
        m.blockers = vec![Blocker {
            node: "node-1".into(),
            pod_disruption_budgets: vec!["shop/web".into()],
            pods: vec!["shop/web-1".into()],
            reason: Some("needs 2 healthy pods".into()),
        }];
        m
    }

    #[test]
    fn the_json_document_carries_the_event_the_nodes_and_the_blockers() {
        let doc = blocked().json(Some("prod"));
        assert_eq!(doc["apiVersion"], "forewarn.dev/v1");
        assert_eq!(doc["notification"], "DrainBlocked");
        assert_eq!(doc["cluster"], "prod");
        assert_eq!(doc["event"]["eventId"], "5D0E7A11");
        assert_eq!(doc["event"]["type"], "Reboot");
        assert_eq!(doc["event"]["notBefore"], "2026-11-26T10:15:00Z");
        assert_eq!(doc["event"]["phase"], "Draining");
        assert_eq!(doc["nodes"], json!(["node-1"]));
        assert_eq!(
            doc["blockers"][0]["podDisruptionBudgets"],
            json!(["shop/web"])
        );
        assert_eq!(doc["blockers"][0]["pods"], json!(["shop/web-1"]));
        assert!(doc.get("bootId").is_none());
        // No cluster, no event: left out, not null.
        let mut m = blocked();
        m.event = None;
        let doc = m.json(None);
        assert!(
            doc.get("cluster").is_none() && doc.get("event").is_none(),
            "{doc}"
        );
    }

    #[test]
    fn slack_gets_escaped_mrkdwn_text_and_teams_an_adaptive_card() {
        let m = blocked();
        let slack = m.body(Format::Slack, Some("prod"));
        let text = slack["text"].as_str().unwrap();
        assert!(
            text.starts_with("*forewarn [prod]: drain blocked: Reboot 5D0E7A11*\n"),
            "{text}"
        );
        assert!(
            text.contains("&lt;PodDisruptionBudget&gt; shop/web &amp; co"),
            "{text}"
        );
        assert!(
            text.contains("*Blocked on node-1*: PodDisruptionBudget shop/web; pods shop/web-1"),
            "{text}"
        );
        assert_eq!(slack.as_object().unwrap().len(), 1, "{slack}");
        let teams = m.body(Format::Teams, None);
        assert_eq!(teams["type"], "message");
        let card = &teams["attachments"][0];
        assert_eq!(
            card["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        assert_eq!(card["content"]["type"], "AdaptiveCard");
        assert_eq!(card["content"]["version"], "1.4");
        let body = card["content"]["body"].as_array().unwrap();
        assert_eq!(body[0]["text"], "forewarn: drain blocked: Reboot 5D0E7A11");
        let facts = body[2]["facts"].as_array().unwrap();
        assert!(
            facts
                .iter()
                .any(|f| f["title"] == "EventId" && f["value"] == "5D0E7A11"),
            "{facts:?}"
        );
        // A dry run says so in the title.
        let mut dry = blocked();
        dry.dry_run = true;
        assert!(
            dry.body(Format::Slack, None)["text"]
                .as_str()
                .unwrap()
                .contains("(dry run)")
        );
    }

    #[test]
    fn many_nodes_are_named_up_to_a_limit_and_counted() {
        let mut m = blocked();
        m.nodes = (0..25).map(|i| format!("node-{i:02}")).collect();
        let doc = m.json(None);
        assert_eq!(doc["nodes"].as_array().unwrap().len(), NAMED);
        assert_eq!(doc["nodesOmitted"], 5);
        assert!(listed(&m.nodes).ends_with("and 5 more"));
    }

    #[test]
    fn a_good_file_parses_with_its_defaults() {
        let c = Config::parse(
            "cluster: prod\nwebhooks:\n- {name: oncall, url: 'https://hooks.slack.com/services/T/B/X', format: Slack, notifications: [DrainBlocked]}\n- {name: audit, url: 'http://receiver.monitoring:8080/x', headers: {Authorization: Bearer t}}\n",
            "w.yaml",
        )
        .unwrap();
        assert_eq!(c.cluster.as_deref(), Some("prod"));
        assert_eq!(c.webhooks[0].format, Format::Slack);
        assert_eq!(
            c.webhooks[0].notifications,
            Some(vec![Notification::DrainBlocked])
        );
        assert_eq!(c.webhooks[1].format, Format::Json);
        assert_eq!(c.webhooks[1].notifications, None);
        assert_eq!(Config::parse("", "w.yaml").unwrap(), Config::default());
    }

    #[test]
    fn a_bad_file_is_refused_naming_the_webhook_and_never_its_url() {
        let bad = |yaml: &str| Config::parse(yaml, "w.yaml").unwrap_err().to_string();
        let secret = "https://hooks.slack.com/services/T/B/SECRET";
        for (yaml, expected) in [
            (
                format!("webhooks:\n- {{name: Oncall, url: '{secret}'}}\n"),
                "DNS label",
            ),
            (
                format!(
                    "webhooks:\n- {{name: a, url: '{secret}'}}\n- {{name: a, url: '{secret}'}}\n"
                ),
                "used twice",
            ),
            (
                "webhooks:\n- {name: a, url: 'ftp://x/SECRET'}\n".to_string(),
                "https://",
            ),
            (
                "webhooks:\n- {name: a, url: 'SECRET'}\n".to_string(),
                "not a URL",
            ),
            (
                format!("webhooks:\n- {{name: a, url: '{secret}', format: Discord}}\n"),
                "w.yaml",
            ),
            (
                format!("webhooks:\n- {{name: a, url: '{secret}', timeoutSeconds: 0}}\n"),
                "timeoutSeconds",
            ),
            (
                format!("webhooks:\n- {{name: a, url: '{secret}', maxAttempts: 11}}\n"),
                "maxAttempts",
            ),
            (
                format!("webhooks:\n- {{name: a, url: '{secret}', notifications: []}}\n"),
                "notifications is empty",
            ),
            (
                format!("webhooks:\n- {{name: a, url: '{secret}', notifications: [Rebooted]}}\n"),
                "w.yaml",
            ),
            (
                format!(
                    "webhooks:\n- {{name: a, url: '{secret}', headers: {{'Bad Header': x}}}}\n"
                ),
                "header",
            ),
            (
                format!("webhooks:\n- {{name: a, url: '{secret}', caFile: /nonexistent/ca.pem}}\n"),
                "caFile",
            ),
            (
                format!("webhooks:\n- {{name: a, url: '{secret}', colour: red}}\n"),
                "colour",
            ),
            (
                format!("webhooks:\n- {{name: a, url: ['{secret}']}}\n"),
                "w.yaml",
            ),
            (
                format!("webhooks:\n- name: a\n  url: {secret}\n  timeoutSeconds: {secret}\n"),
                "w.yaml",
            ),
        ] {
            let e = bad(&yaml);
            assert!(e.contains(expected), "{yaml}: {e}");
            assert!(!e.contains("SECRET"), "the URL leaked: {e}");
        }
    }

    /// A private CA, and a certificate for `localhost` it signed:
    /// `(CA PEM, leaf DER, leaf key DER)`.
    fn private_ca() -> (String, Vec<u8>, Vec<u8>) {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&leaf_key, &ca)
            .unwrap();
        (ca.pem(), leaf.der().to_vec(), leaf_key.serialize_der())
    }

    /// An HTTPS receiver on loopback with `cert`: answers 200 to each
    /// request and sends its body on; a handshake it refuses sends nothing.
    async fn https_receiver(
        cert: Vec<u8>,
        key: Vec<u8>,
    ) -> (u16, tokio::sync::mpsc::UnboundedReceiver<Value>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        crate::http::ensure_crypto_provider();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.into()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    continue;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let body = loop {
                    let n = tls.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break None;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let length = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if body.len() >= length {
                            break Some(body.to_string());
                        }
                    }
                };
                if let Some(body) = body {
                    let _ = tls
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                    let _ = tls.shutdown().await;
                    let _ = tx.send(serde_json::from_str(&body).unwrap_or(Value::Null));
                }
            }
        });
        (port, rx)
    }

    /// Over HTTPS: a webhook that trusts the private CA (`caFile`) is
    /// delivered; one left with the public roots refuses the receiver's
    /// certificate and delivers nothing (counted `failed`).
    #[tokio::test]
    async fn https_is_verified_against_the_public_roots_or_the_ca_file() {
        let (ca_pem, cert, key) = private_ca();
        let (port, mut got) = https_receiver(cert, key).await;
        let dir =
            std::env::temp_dir().join(format!("forewarn-webhooks-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca_pem).unwrap();
        let config = Config::parse(
            &format!(
                "webhooks:\n- {{name: private, url: 'https://localhost:{port}/hook', caFile: '{}', maxAttempts: 1}}\n- {{name: public, url: 'https://localhost:{port}/hook', maxAttempts: 1}}\n",
                ca_file.display()
            ),
            "w.yaml",
        )
        .expect("config");
        let counted = deliveries_counter();
        let hooks = Webhooks::start(config, counted.clone(), false).expect("start");
        hooks.notify(blocked());
        // A hang bound: delivered within a second or so on loopback.
        let body = tokio::time::timeout(Duration::from_secs(60), got.recv())
            .await
            .expect("nothing delivered over HTTPS")
            .expect("receiver gone");
        assert_eq!(body["notification"], "DrainBlocked", "{body}");
        let count = |w: &str, r: &str| counted.with_label_values(&[w, "DrainBlocked", r]).get();
        wait_until(|| count("private", "delivered") + count("public", "failed") == 2).await;
        assert_eq!(count("private", "delivered"), 1);
        assert_eq!(count("public", "failed"), 1);
        assert_eq!(count("public", "delivered"), 0);
        assert!(got.try_recv().is_err(), "the unverified webhook delivered");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A 429 with `Retry-After: 3` is tried again no sooner than 3 s later
    /// (the backoff alone would be 1 to 2 s), then delivered.
    #[tokio::test]
    async fn a_retry_after_is_honoured() {
        let times: Arc<std::sync::Mutex<Vec<std::time::Instant>>> = Arc::default();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post({
                let times = times.clone();
                move || {
                    let first = {
                        let mut t = times.lock().unwrap();
                        t.push(std::time::Instant::now());
                        t.len() == 1
                    };
                    async move {
                        if first {
                            (
                                http::StatusCode::TOO_MANY_REQUESTS,
                                [(http::header::RETRY_AFTER, "3")],
                            )
                        } else {
                            (http::StatusCode::OK, [(http::header::RETRY_AFTER, "0")])
                        }
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = Config::parse(
            &format!("webhooks:\n- {{name: slow, url: '{url}', maxAttempts: 2}}\n"),
            "w.yaml",
        )
        .unwrap();
        let counted = deliveries_counter();
        let hooks = Webhooks::start(config, counted.clone(), false).unwrap();
        hooks.notify(blocked());
        let delivered = || {
            counted
                .with_label_values(&["slow", "DrainBlocked", "delivered"])
                .get()
        };
        wait_until(|| delivered() == 1).await;
        assert_eq!(delivered(), 1);
        let t = times.lock().unwrap().clone();
        assert_eq!(t.len(), 2, "{t:?}");
        let gap = t[1] - t[0];
        assert!(gap >= Duration::from_millis(2950), "retried after {gap:?}");
    }

    /// A receiver on loopback that answers 200 after `delay` (forever when
    /// `None`) and counts the requests it took.
    async fn slow_receiver(
        delay: Option<Duration>,
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let got = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post({
                let got = got.clone();
                move || {
                    got.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async move {
                        match delay {
                            Some(d) => tokio::time::sleep(d).await,
                            None => std::future::pending::<()>().await,
                        }
                        http::StatusCode::OK
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, got)
    }

    fn deliveries_counter() -> IntCounterVec {
        IntCounterVec::new(
            prometheus::Opts::new("deliveries", "test"),
            &["webhook", "notification", "result"],
        )
        .unwrap()
    }

    /// A stopping controller still delivers what it queued: three messages
    /// queued just before `finish` all reach a receiver that takes 300 ms
    /// each; one queued after it is dropped and counted.
    #[tokio::test]
    async fn finishing_delivers_what_is_queued_then_takes_no_more() {
        let (url, got) = slow_receiver(Some(Duration::from_millis(300))).await;
        let config = Config::parse(
            &format!("webhooks:\n- {{name: ops, url: '{url}'}}\n"),
            "w.yaml",
        )
        .unwrap();
        let counted = deliveries_counter();
        let hooks = Webhooks::start(config, counted.clone(), false).unwrap();
        for _ in 0..3 {
            hooks.notify(blocked());
        }
        let started = std::time::Instant::now();
        // A hang bound: the three deliveries take about 0.9 s; `finish`
        // returns as soon as they are done.
        let left = hooks.finish(Duration::from_secs(60)).await;
        assert!(left.is_empty(), "left: {left:?}");
        let count = |r: &str| counted.with_label_values(&["ops", "DrainBlocked", r]).get();
        assert_eq!(count("delivered"), 3);
        assert_eq!(got.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert!(
            started.elapsed() >= Duration::from_millis(850),
            "finished after {:?}, before the three deliveries could",
            started.elapsed()
        );
        hooks.notify(blocked());
        assert_eq!(count("dropped"), 1);
    }

    /// A receiver that never answers does not hold a stopping controller
    /// beyond `within`: `finish` names the webhook left with messages.
    #[tokio::test]
    async fn finishing_is_bounded_by_its_time() {
        let (url, got) = slow_receiver(None).await;
        let config = Config::parse(
            &format!("webhooks:\n- {{name: stuck, url: '{url}', timeoutSeconds: 60}}\n"),
            "w.yaml",
        )
        .unwrap();
        let hooks = Webhooks::start(config, deliveries_counter(), false).unwrap();
        hooks.notify(blocked());
        hooks.notify(blocked());
        // `finish` gives up after its 1 s and names the webhook it left:
        // the receiver never answers, so nothing was delivered and the
        // attempt (60 s timeout) was cut short. A hang bound: 30 s is far
        // beyond the 1 s (load cannot reach it) and short of the attempt's
        // 60 s, which a `finish` that waited for the attempt would need.
        let left = tokio::time::timeout(
            Duration::from_secs(30),
            hooks.finish(Duration::from_secs(1)),
        )
        .await
        .expect("finish waited for the attempt, beyond its own time");
        assert_eq!(left, ["stuck"]);
        assert_eq!(got.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// Waits up to 60 s for `f` to hold; whether it did. A hang bound: the
    /// conditions waited for are loopback deliveries that hold within a
    /// second or two; the wait ends as soon as `f` holds.
    async fn wait_until(f: impl Fn() -> bool) -> bool {
        for _ in 0..1200 {
            if f() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        f()
    }

    /// Waits up to 60 s for `f` to hold, or fails naming `what`.
    async fn eventually(what: &str, f: impl Fn() -> bool) {
        assert!(wait_until(f).await, "not within 60 s: {what}");
    }

    /// A reload swaps the set: what was queued for the old webhook is still
    /// delivered, later messages go to the new one only, and the old
    /// worker ends once its queue is empty.
    #[tokio::test]
    async fn a_reload_swaps_the_webhooks_and_the_old_queue_is_still_delivered() {
        use std::sync::atomic::Ordering::SeqCst;
        let (old_url, old_got) = slow_receiver(Some(Duration::from_millis(300))).await;
        let (new_url, new_got) = slow_receiver(Some(Duration::ZERO)).await;
        let counted = deliveries_counter();
        let hooks = Webhooks::start(
            Config::parse(
                &format!("webhooks:\n- {{name: old, url: '{old_url}'}}\n"),
                "w.yaml",
            )
            .unwrap(),
            counted.clone(),
            false,
        )
        .unwrap();
        hooks.notify(blocked());
        hooks.notify(blocked());
        hooks
            .reload(
                Config::parse(
                    &format!("webhooks:\n- {{name: new, url: '{new_url}'}}\n"),
                    "w.yaml",
                )
                .unwrap(),
            )
            .unwrap();
        hooks.notify(blocked());
        let count = |w: &str| {
            counted
                .with_label_values(&[w, "DrainBlocked", "delivered"])
                .get()
        };
        eventually("both old and the new delivered", || {
            count("old") == 2 && count("new") == 1
        })
        .await;
        assert_eq!(old_got.load(SeqCst), 2);
        assert_eq!(new_got.load(SeqCst), 1);
        eventually("the old worker ended", || {
            let workers = hooks.shared.workers.lock().unwrap();
            workers
                .iter()
                .filter(|(n, t)| n == "old" && !t.is_finished())
                .count()
                == 0
        })
        .await;
        // An empty file: no webhook any more.
        hooks.reload(Config::default()).unwrap();
        assert!(!hooks.is_enabled());
        hooks.notify(blocked());
        // A hang bound: nothing is queued, so `finish` returns at once.
        assert!(hooks.finish(Duration::from_secs(60)).await.is_empty());
        assert_eq!(new_got.load(SeqCst), 1);
    }

    /// The file watch: a changed file that is invalid is refused (the
    /// webhooks in force stay, the gauge says so); a valid one is put in
    /// force and clears the gauge.
    #[tokio::test]
    async fn a_changed_webhooks_file_is_loaded_and_an_invalid_one_refused() {
        use std::sync::atomic::Ordering::SeqCst;
        let (a_url, a_got) = slow_receiver(Some(Duration::ZERO)).await;
        let (b_url, b_got) = slow_receiver(Some(Duration::ZERO)).await;
        let dir =
            std::env::temp_dir().join(format!("forewarn-webhooks-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("webhooks.yaml");
        let first = format!("webhooks:\n- {{name: a, url: '{a_url}'}}\n");
        std::fs::write(&path, &first).unwrap();
        let metrics =
            crate::metrics::controller::ControllerMetrics::register(&prometheus::Registry::new())
                .unwrap();
        let (config, text) = Config::load_text(&path.to_string_lossy()).unwrap();
        let hooks = Webhooks::start(config, metrics.webhook_deliveries.clone(), false).unwrap();
        let task = tokio::spawn(watch(path.clone(), text, hooks.clone(), metrics.clone()));
        std::fs::write(&path, "webhooks:\n- {name: a, url: 'ftp://x'}\n").unwrap();
        eventually("the invalid file refused", || {
            metrics.webhooks_refused.get() == 1
        })
        .await;
        assert_eq!(
            metrics
                .webhooks_reloads
                .with_label_values(&["refused"])
                .get(),
            1
        );
        hooks.notify(blocked());
        eventually("delivered to a, still in force", || a_got.load(SeqCst) == 1).await;
        std::fs::write(&path, format!("webhooks:\n- {{name: b, url: '{b_url}'}}\n")).unwrap();
        eventually("the valid file loaded", || {
            metrics.webhooks_refused.get() == 0
        })
        .await;
        assert_eq!(
            metrics
                .webhooks_reloads
                .with_label_values(&["loaded"])
                .get(),
            1
        );
        hooks.notify(blocked());
        eventually("delivered to b", || b_got.load(SeqCst) == 1).await;
        assert_eq!(a_got.load(SeqCst), 1);
        task.abort();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn only_no_answer_and_408_429_5xx_are_retried() {
        assert!(Failure::Transport("connection refused".into()).retryable());
        for code in [408, 429, 500, 502, 503] {
            assert!(Failure::Status(code, None).retryable(), "{code}");
        }
        for code in [400, 401, 403, 404, 410] {
            assert!(!Failure::Status(code, None).retryable(), "{code}");
        }
    }
}
