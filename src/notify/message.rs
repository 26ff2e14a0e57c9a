//! One notification's content ([`Message`]) from an event's facts, and the
//! fields its body template renders ([`Message::context`]).

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::api::{ScheduledEvent, ScheduledEventStatus};

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

    pub fn title(self) -> &'static str {
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

/// Nodes (and blockers) named in a message; the rest are counted.
pub const NAMED: usize = 20;

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

    /// The fields a body template renders ([`crate::notify::template`]),
    /// `cluster` being the webhooks file's:
    ///
    /// ```json
    /// {"notification": "DrainBlocked", "time": "2026-11-26T10:00:00Z",
    ///  "cluster": "prod", "dryRun": false, "summary": "…",
    ///  "title": "forewarn [prod]: drain blocked: Reboot <EventId>",
    ///  "event": {"name", "eventId", "type", "source", "status", "notBefore",
    ///            "durationSeconds", "resources", "phase"},
    ///  "nodes": ["…"], "nodesOmitted": 0,
    ///  "blockers": [{"node", "podDisruptionBudgets", "pods", "reason"}],
    ///  "bootId": {"old": "…", "new": "…"},
    ///  "facts": [{"name": "EventId", "value": "…"}]}
    /// ```
    ///
    /// `cluster`, `event` (and in it `notBefore` and `phase`), a blocker's
    /// `reason` and `bootId` are absent when they do not apply; `blockers`
    /// is then empty. At most [`NAMED`] nodes and blockers are listed;
    /// `time` and `notBefore` are RFC 3339 in UTC (`Z`).
    pub fn context(&self, cluster: Option<&str>) -> Value {
        let mut doc = json!({
            "notification": self.notification.as_str(),
            "time": self.time,
            "dryRun": self.dry_run,
            "summary": self.summary,
            "title": self.title(cluster),
            "nodes": self.nodes.iter().take(NAMED).collect::<Vec<_>>(),
            "nodesOmitted": self.nodes.len().saturating_sub(NAMED),
            "blockers": self.blockers.iter().take(NAMED).collect::<Vec<_>>(),
            "facts": self
                .facts()
                .into_iter()
                .map(|(name, value)| json!({"name": name, "value": value}))
                .collect::<Vec<_>>(),
        });
        let m = doc.as_object_mut().expect("an object");
        if let Some(c) = cluster {
            m.insert("cluster".into(), c.into());
        }
        if let Some(e) = &self.event {
            m.insert("event".into(), json!(e));
        }
        if let Some((old, new)) = &self.boot_id {
            m.insert("bootId".into(), json!({"old": old, "new": new}));
        }
        doc
    }

    /// The title line: `forewarn [cluster] (dry run): drain blocked:
    /// Reboot <EventId>`.
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
}

/// The first [`NAMED`] of `items`, comma-joined, and how many more.
pub fn listed(items: &[String]) -> String {
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
