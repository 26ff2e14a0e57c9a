//! Operators' webhooks: a POST per notification (an event received, its
//! drain blocked, its approval accepted by IMDS, started, completed, and a
//! node's unexpected restart), its body forewarn's own JSON, ready for a
//! Slack or Microsoft Teams incoming webhook, or the webhook's own template
//! ([`crate::notify::template`]).
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
//!   - name: pager
//!     url: https://events.example.com/v2/enqueue
//!     contentType: application/json                     # the default
//!     template: |                                       # instead of format
//!       {"summary": {{ summary|tojson }}, "nodes": {{ nodes|tojson }}}
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

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use prometheus::IntCounterVec;
use tracing::{error, info, warn};

use crate::notify::config::{Config, Error, Notification, Webhook, read_roots};
use crate::notify::message::Message;
use crate::notify::template::{BodyTemplate, TemplateError};

/// Messages that may wait for one webhook; beyond it new ones are dropped
/// (counted `dropped`).
pub const QUEUE: usize = 256;
/// The longest `Retry-After` honoured; a longer one waits this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// One webhook's queue.
struct Endpoint {
    name: String,
    template: Arc<BodyTemplate>,
    notifications: HashSet<Notification>,
    queue: tokio::sync::mpsc::Sender<(Notification, String)>,
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

/// Why a webhooks file could not be put in force; the webhooks in force
/// stay.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The file is unreadable or invalid.
    #[error(transparent)]
    File(#[from] Error),
    /// A webhook's body template does not parse.
    #[error("webhook {webhook}: {source}")]
    Template {
        /// The webhook's name.
        webhook: String,
        /// Why.
        source: TemplateError,
    },
    /// A webhook's HTTP client cannot be built (its `caFile`).
    #[error("webhook {webhook}: {reason}")]
    Client {
        /// The webhook's name.
        webhook: String,
        /// Why, without the URL (it carries the credential).
        reason: String,
    },
    /// The webhooks are finishing ([`Webhooks::finish`]).
    #[error("the webhooks are stopping")]
    Stopping,
}

impl Webhooks {
    /// Starts one delivery worker per webhook of `config`, counting in
    /// `counted` (labels `webhook`, `notification`, `result`). Messages of
    /// a `dry_run` controller say so.
    ///
    /// # Errors
    /// [`ReloadError::Client`] when a webhook's HTTP client cannot be built
    /// (its `caFile`).
    pub fn start(
        config: Config,
        counted: IntCounterVec,
        dry_run: bool,
    ) -> Result<Self, ReloadError> {
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
    /// [`ReloadError::Client`] when a webhook's HTTP client cannot be built
    /// (its `caFile`), [`ReloadError::Stopping`] when the webhooks are
    /// finishing.
    pub fn reload(&self, config: Config) -> Result<(), ReloadError> {
        let shared = &self.shared;
        if *shared.closing.borrow() {
            return Err(ReloadError::Stopping);
        }
        if config.webhooks.is_empty() {
            *shared
                .active
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            return Ok(());
        }
        // Every client and template first: a webhook that cannot be built
        // leaves the set in force alone.
        let built = config
            .webhooks
            .into_iter()
            .map(|w| {
                let template = w.body_template().map_err(|source| ReloadError::Template {
                    webhook: w.name.clone(),
                    source,
                })?;
                client_for(&w).map(|c| (w, c, template))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (endpoints, started): (Vec<Endpoint>, Vec<_>) = built
            .into_iter()
            .map(|(w, client, template)| self.start_endpoint(w, client, template))
            .unzip();
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

    /// Starts the delivery worker of webhook `w` (sending with `client` the
    /// bodies `template` renders) and gives its endpoint,
    /// with the worker's name and task. Its delivered and failed series are
    /// created at 0 for every notification, so that an alert on a rate sees
    /// the first failure.
    fn start_endpoint(
        &self,
        w: Webhook,
        client: reqwest::Client,
        template: Arc<BodyTemplate>,
    ) -> (Endpoint, (String, tokio::task::JoinHandle<()>)) {
        let shared = &self.shared;
        let counted = &shared.counted;
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
        if let Ok(v) = http::HeaderValue::from_str(w.content_type()) {
            headers.insert(http::header::CONTENT_TYPE, v);
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
        let task = (
            w.name.clone(),
            tokio::spawn(worker.run(rx, shared.closing.subscribe())),
        );
        info!(webhook = %w.name, format = ?w.format, template = w.template.is_some(), "Webhook configured");
        let endpoint = Endpoint {
            name: w.name,
            template,
            notifications: w.notifications.map_or_else(
                || Notification::ALL.into_iter().collect(),
                |n| n.into_iter().collect(),
            ),
            queue: tx,
        };
        (endpoint, task)
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
            let body = match e.template.render(&message, inner.cluster.as_deref()) {
                Ok(body) => body,
                Err(err) => {
                    self.shared
                        .counted
                        .with_label_values(&[&e.name, n.as_str(), "failed"])
                        .inc();
                    error!(webhook = %e.name, notification = n.as_str(), error = %err, "The webhook's body template failed: a notification was dropped");
                    continue;
                }
            };
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

/// The HTTP client of webhook `w`: its `caFile`'s roots only (else the
/// public roots), its timeout per attempt (default 10 s; connecting at most
/// 5 s of it), and no redirect followed.
///
/// # Errors
/// [`ReloadError::Client`] when the roots cannot be read or the client
/// cannot be built.
fn client_for(w: &Webhook) -> Result<reqwest::Client, ReloadError> {
    let failed = |reason: String| ReloadError::Client {
        webhook: w.name.clone(),
        reason,
    };
    let roots = match &w.ca_file {
        Some(ca) => read_roots(ca).map_err(failed)?,
        None => crate::http::public_roots(),
    };
    let timeout = Duration::from_secs(w.timeout_seconds.unwrap_or(10));
    crate::http::bare_builder()
        .tls_certs_only(roots)
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| failed(e.without_url().to_string()))
}

/// Polls the webhooks file at `path` every
/// [`crate::file_watch::POLL_INTERVAL`] (a Secret volume swaps a symlink: the
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
    let mut changes = crate::file_watch::Changes::new(initial);
    let mut tick = tokio::time::interval(crate::file_watch::POLL_INTERVAL);
    loop {
        tick.tick().await;
        let Some(read) = changes.changed(crate::file_watch::read(&path).await) else {
            continue;
        };
        let loaded = read
            .map_err(|source| {
                ReloadError::from(Error::Read {
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
        mut rx: tokio::sync::mpsc::Receiver<(Notification, String)>,
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

    async fn attempt(&self, body: &str) -> Result<(), Failure> {
        let response = self
            .client
            .post(&self.url)
            .headers(self.headers.clone())
            .body(body.to_string())
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
    use crate::api::{NodeProgress, Phase, ScheduledEvent, ScheduledEventStatus};
    use crate::fixtures;
    use crate::notify::config::*;
    use crate::notify::message::*;
    use chrono::{DateTime, Utc};
    use serde_json::{Value, json};

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

    /// `m`'s body in the built-in `format`, parsed.
    fn body_of(m: &Message, format: Format, cluster: Option<&str>) -> Value {
        let w = Webhook {
            name: "w".into(),
            url: "https://example.com".into(),
            format: Some(format),
            template: None,
            content_type: None,
            notifications: None,
            headers: Default::default(),
            timeout_seconds: None,
            max_attempts: None,
            ca_file: None,
        };
        let text = w.body_template().unwrap().render(m, cluster).unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
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
        let doc = body_of(&blocked(), Format::Json, Some("prod"));
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
        let doc = body_of(&m, Format::Json, None);
        assert!(
            doc.get("cluster").is_none() && doc.get("event").is_none(),
            "{doc}"
        );
    }

    #[test]
    fn slack_gets_escaped_mrkdwn_text_and_teams_an_adaptive_card() {
        let m = blocked();
        let slack = body_of(&m, Format::Slack, Some("prod"));
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
        let teams = body_of(&m, Format::Teams, None);
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
            body_of(&dry, Format::Slack, None)["text"]
                .as_str()
                .unwrap()
                .contains("(dry run)")
        );
    }

    #[test]
    fn many_nodes_are_named_up_to_a_limit_and_counted() {
        let mut m = blocked();
        m.nodes = (0..25).map(|i| format!("node-{i:02}")).collect();
        let doc = body_of(&m, Format::Json, None);
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
        assert_eq!(c.webhooks[0].format, Some(Format::Slack));
        assert_eq!(
            c.webhooks[0].notifications,
            Some(vec![Notification::DrainBlocked])
        );
        assert_eq!(c.webhooks[1].format, None);
        assert_eq!(c.webhooks[1].content_type(), "application/json");
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
                format!(
                    "webhooks:\n- {{name: a, url: '{secret}', format: Slack, template: '{{{{ summary|tojson }}}}'}}\n"
                ),
                "not both",
            ),
            (
                format!(
                    "webhooks:\n- name: a\n  url: {secret}\n  template: |\n    {{\"a\": 1,\n     \"b\": {{{{ summary|tojson }}\n    }}\n"
                ),
                "webhook \"a\": template line 2, column 25: syntax error",
            ),
            (
                format!(
                    "webhooks:\n- {{name: a, url: '{secret}', template: '{{\"s\": \"{{{{ summary }}}}\"}}'}}\n"
                ),
                "gave no JSON",
            ),
            (
                format!("webhooks:\n- {{name: a, url: '{secret}', contentType: json}}\n"),
                "not a media type",
            ),
            (
                format!(
                    "webhooks:\n- {{name: a, url: '{secret}', contentType: text/plain, headers: {{content-type: text/plain}}}}\n"
                ),
                "contentType only",
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

    /// The file watch: a changed file that is invalid (its body template
    /// does not parse) is refused (the webhooks in force stay, the gauge
    /// says so); a valid one is put in force and clears the gauge.
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
        // A template that does not parse.
        std::fs::write(
            &path,
            format!("webhooks:\n- {{name: a, url: '{a_url}', template: '{{{{ summary'}}\n"),
        )
        .unwrap();
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
