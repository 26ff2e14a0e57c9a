//! The Node condition `ForewarnScheduledEvent`: `True`
//! while a live Azure Scheduled Event affects the node (reason its
//! `EventType`; the message names each event, its status and `NotBefore`),
//! `False` once none does, as node-problem-detector's `VMEventScheduled`
//! shows on AKS, under a type of forewarn's own so that the two never
//! overwrite each other.
//!
//! Written with a strategic merge patch of `nodes/status` that names only
//! this condition type: the list of conditions is merged by `type`, so the
//! kubelet's (and KWOK's) conditions and this one leave each other alone
//! (checked against what the API server stored, tests/impact.rs). Once set,
//! it is turned `False`, not removed, when the last event ends: its
//! `lastTransitionTime` then says when, and a reader sees that forewarn
//! looked. A node no event ever affected never gets it. It is written only
//! when its status, reason or message changes: one write per node per
//! change, never per pass (no heartbeat time is refreshed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::ResourceExt;
use kube::api::{Api, Patch};
use serde_json::json;
use tracing::{debug, warn};

use crate::api::{EventStatus, ScheduledEvent};
use crate::controller::act::writers::Writers;
use crate::controller::observe::caches::Caches;
use crate::controller::observe::facts::Facts;
use crate::controller::observe::impact::{affects, is_over};
use crate::text::cut;

/// The condition type.
pub const CONDITION_TYPE: &str = "ForewarnScheduledEvent";

/// The longest message written (the events are named until it is full).
const MESSAGE_LIMIT: usize = 1024;

/// How long an identical write is not repeated while the node cache has
/// not shown it yet.
const REWRITE_AFTER: Duration = Duration::from_secs(10);

/// How many condition writes of one pass are in flight at once.
const WRITE_CONCURRENCY: usize = 16;

/// What the condition should say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// `True` while an event affects the node.
    pub status: bool,
    /// The first event's `EventType` (by `NotBefore`; started ones
    /// first), as a PascalCase word; `NoScheduledEvent` when none.
    pub reason: String,
    /// Each event: type, `EventId`, status, `NotBefore`, object name.
    pub message: String,
}

/// The condition for a node that the live events `live` affect.
pub fn desired(live: &[&ScheduledEvent]) -> Desired {
    if live.is_empty() {
        return Desired {
            status: false,
            reason: "NoScheduledEvent".into(),
            message: "no Azure Scheduled Event affects the node".into(),
        };
    }
    let mut live = live.to_vec();
    live.sort_by_key(|e| {
        (
            e.spec.event_status != EventStatus::Started,
            e.spec.not_before,
            e.metadata.name.clone(),
        )
    });
    let parts: Vec<String> = live
        .iter()
        .map(|e| {
            let not_before = e
                .spec
                .not_before
                .map(|t| format!(", NotBefore {}", t.to_rfc3339()))
                .unwrap_or_default();
            format!(
                "{} {} ({}{not_before}; ScheduledEvent {})",
                e.spec.event_type,
                e.spec.event_id,
                e.spec.event_status,
                e.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    let reason: String = live[0]
        .spec
        .event_type
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    Desired {
        status: true,
        reason: if reason.is_empty() {
            "ScheduledEvent".into()
        } else {
            reason
        },
        message: cut(parts.join("; "), MESSAGE_LIMIT),
    }
}

/// The node's `ForewarnScheduledEvent` condition, if it has one.
pub fn current(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION_TYPE)
}

/// The strategic merge patch of `nodes/status` that makes `node`'s
/// condition say `want` at `now`, or `None` when it does already (or when
/// it would be `False` on a node that never had it). `lastTransitionTime`
/// stays while the status does.
pub fn patch_for(node: &Node, want: &Desired, now: DateTime<Utc>) -> Option<serde_json::Value> {
    let status = if want.status { "True" } else { "False" };
    let cur = current(node);
    match cur {
        None if !want.status => return None,
        Some(c)
            if c.status == status
                && c.reason.as_deref() == Some(want.reason.as_str())
                && c.message.as_deref() == Some(want.message.as_str()) =>
        {
            return None;
        }
        _ => {}
    }
    let transition = cur
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.as_ref())
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or_else(|| json!(now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)));
    Some(json!({"status": {"conditions": [{
        "type": CONDITION_TYPE,
        "status": status,
        "reason": want.reason,
        "message": want.message,
        "lastTransitionTime": transition,
        "lastHeartbeatTime": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    }]}}))
}

/// Recent writes, by node: `(status, reason, message)` and when, so that a
/// pass that runs before the node cache shows a write does not repeat it.
#[derive(Default)]
pub struct Written(Mutex<HashMap<String, (String, Instant)>>);

impl Written {
    fn recently(&self, node: &str, key: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(node)
            .is_some_and(|(k, at)| k == key && at.elapsed() < REWRITE_AFTER)
    }

    fn note(&self, node: &str, key: String) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.retain(|_, (_, at)| at.elapsed() < REWRITE_AFTER);
        map.insert(node.to_string(), (key, Instant::now()));
    }
}

/// Brings the condition of each node named in `names` up to date with the
/// live events of the cache, `fresh` standing for its own cached version
/// (the pass's status was just written), the nodes and the VMs the agents
/// state as `facts` read them. Best effort: a failed write is logged, and
/// done again on a later pass or by the sweep.
pub async fn sync(
    writers: &Writers,
    written: &Written,
    caches: &Caches,
    facts: &Facts,
    fresh: Option<&ScheduledEvent>,
    names: &[String],
) {
    if writers.dry_run || names.is_empty() {
        return;
    }
    let mut events: Vec<Arc<ScheduledEvent>> = caches.events.state();
    if let Some(f) = fresh {
        events.retain(|e| e.metadata.name != f.metadata.name);
        events.push(Arc::new(f.clone()));
    }
    let live: Vec<&Arc<ScheduledEvent>> = events
        .iter()
        .filter(|e| !is_over(&e.spec, e.status.as_ref()))
        .collect();
    let by_name: HashMap<String, &Arc<Node>> =
        facts.nodes.iter().map(|n| (n.name_any(), n)).collect();
    let now = Utc::now();
    let api: Api<Node> = Api::all(writers.client.clone());
    let mut writes = Vec::new();
    for name in names {
        let Some(node) = by_name.get(name) else {
            continue;
        };
        let vm = facts.vm_of(name);
        let holds = crate::api::holds(node);
        let affecting: Vec<&ScheduledEvent> = live
            .iter()
            .filter(|e| affects(e, vm.as_deref(), &holds))
            .map(|e| e.as_ref())
            .collect();
        let want = desired(&affecting);
        let Some(body) = patch_for(node, &want, now) else {
            continue;
        };
        let key = format!("{}|{}|{}", want.status, want.reason, want.message);
        if written.recently(name, &key) {
            continue;
        }
        written.note(name, key);
        let api = api.clone();
        writes.push(async move {
            let r = crate::kubeclient::patch_discarding_answer(
                &api,
                name,
                Some("status"),
                &crate::api::controller_patch_params(),
                &Patch::Strategic(&body),
            )
            .await;
            (name, want, r)
        });
    }
    let results: Vec<_> = futures::stream::iter(writes)
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    for (name, want, r) in results {
        match r {
            Ok(_) => {
                writers
                    .metrics
                    .node_writes
                    .with_label_values(&["condition"])
                    .inc();
                debug!(node = %name, status = want.status, reason = %want.reason, "Node condition {CONDITION_TYPE} written");
            }
            Err(e) => {
                warn!(node = %name, error = %e, "Could not write the node condition {CONDITION_TYPE}; will retry");
            }
        }
    }
}

/// The nodes whose condition is `True` (for the sweep, which turns it
/// `False` once no live event affects them: an event deleted by hand, a
/// leader that died before its last pass).
pub fn nodes_with_condition_true(nodes: &[Arc<Node>]) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| current(n).is_some_and(|c| c.status == "True"))
        .map(|n| n.name_any())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use k8s_openapi::api::core::v1::NodeStatus;
    use kube::api::ObjectMeta;

    fn ev(name: &str, ty: &str, status: EventStatus, not_before: Option<&str>) -> ScheduledEvent {
        ScheduledEvent::new(
            name,
            fixtures::spec(name.to_uppercase())
                .event_type(ty)
                .status(status)
                .not_before(not_before.map(|t| t.parse::<DateTime<Utc>>().unwrap()))
                .build(),
        )
    }

    fn node(conditions: Vec<NodeCondition>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                ..Default::default()
            },
            spec: None,
            status: Some(NodeStatus {
                conditions: Some(conditions),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_condition_names_every_event_the_started_and_soonest_first() {
        let a = ev(
            "a",
            "Redeploy",
            EventStatus::Scheduled,
            Some("2026-11-21T10:30:00Z"),
        );
        let b = ev(
            "b",
            "Reboot",
            EventStatus::Scheduled,
            Some("2026-11-21T10:00:00Z"),
        );
        let d = desired(&[&a, &b]);
        assert!(d.status);
        assert_eq!(d.reason, "Reboot");
        assert_eq!(
            d.message,
            "Reboot B (Scheduled, NotBefore 2026-11-21T10:00:00+00:00; ScheduledEvent b); Redeploy A (Scheduled, NotBefore 2026-11-21T10:30:00+00:00; ScheduledEvent a)"
        );
        let c = ev("c", "Freeze", EventStatus::Started, None);
        assert_eq!(desired(&[&a, &b, &c]).reason, "Freeze");
        let none = desired(&[]);
        assert!(!none.status);
        assert_eq!(none.reason, "NoScheduledEvent");
        let odd = ev("o", "Hiber nate!", EventStatus::Scheduled, None);
        assert_eq!(desired(&[&odd]).reason, "Hibernate");
    }

    #[test]
    fn the_patch_names_only_this_condition_and_is_none_when_nothing_changes() {
        let now: DateTime<Utc> = "2026-11-21T10:00:00Z".parse().unwrap();
        let ready = NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        };
        let n = node(vec![ready.clone()]);
        let off = desired(&[]);
        assert_eq!(patch_for(&n, &off, now), None, "never affected: no write");
        let on = desired(&[&ev("a", "Reboot", EventStatus::Scheduled, None)]);
        let patch = patch_for(&n, &on, now).unwrap();
        let conds = patch["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 1, "{patch}");
        assert_eq!(conds[0]["type"], CONDITION_TYPE);
        assert_eq!(conds[0]["status"], "True");
        assert_eq!(conds[0]["reason"], "Reboot");
        assert_eq!(conds[0]["lastTransitionTime"], "2026-11-21T10:00:00Z");
        // As stored: no write; another message: a write keeping the
        // transition time; False: a new transition time.
        let stored: NodeCondition = serde_json::from_value(conds[0].clone()).unwrap();
        let n = node(vec![ready.clone(), stored]);
        let later: DateTime<Utc> = "2026-11-21T10:05:00Z".parse().unwrap();
        assert_eq!(patch_for(&n, &on, later), None);
        let other = desired(&[&ev("a", "Reboot", EventStatus::Started, None)]);
        let p = patch_for(&n, &other, later).unwrap();
        assert_eq!(
            p["status"]["conditions"][0]["lastTransitionTime"],
            "2026-11-21T10:00:00Z"
        );
        let p = patch_for(&n, &off, later).unwrap();
        assert_eq!(p["status"]["conditions"][0]["status"], "False");
        assert_eq!(
            p["status"]["conditions"][0]["lastTransitionTime"],
            "2026-11-21T10:05:00Z"
        );
        assert_eq!(
            nodes_with_condition_true(&[Arc::new(n)]),
            vec!["n".to_string()]
        );
    }
}
