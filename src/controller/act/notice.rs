//! Notices: the pods that take part (README, "For workload authors")
//! receive each event that affects their node as an annotation on
//! themselves, which the kubelet projects into a downward-API file, so a
//! container learns of the maintenance without any Kubernetes access.
//!
//! - A pod takes part with the label `forewarn.dev/notice: "true"`, or
//!   `forewarn.dev/acknowledge: "true"` (which also asks forewarn to wait
//!   for it: see [`crate::controller::decide::acknowledge`]). A label, so that the pod cache
//!   keeps only these pods' few annotations ([`Participant`]) and the
//!   number of writes stays bounded by the workloads that asked.
//! - One annotation per event, `notice.forewarn.dev/<ScheduledEvent name>`,
//!   written (and removed) by a JSON merge patch of that key alone, so two
//!   events reconciled side by side on one node never overwrite each
//!   other. Its value is a line of `key=value` words without spaces,
//!   quotes or backslashes ([`render`]), so the kubelet's file (each
//!   annotation as `key="value"`, the value Go-quoted) needs no unescaping.
//! - Removed, with the pod's acknowledgement of it, when the event is over
//!   or no longer affects the pod's node, and by the sweep for events that
//!   are gone. The chart's admission policy lets the controller change
//!   nothing on a pod but these annotations (set or remove a notice,
//!   remove an acknowledgement).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::api::{CONTROLLER_MANAGER, EventStatus, Phase, ScheduledEventSpec};
use crate::controller::decide::acknowledge::AckState;
use crate::controller::decide::plan::ObservedNode;
use crate::policy::Action;

/// The label that asks for notices.
pub const NOTICE_LABEL: &str = "forewarn.dev/notice";
/// The label that asks for notices and for forewarn to wait for the pod's
/// acknowledgement.
pub const ACKNOWLEDGE_LABEL: &str = "forewarn.dev/acknowledge";
/// The prefix of the notice annotations; the `ScheduledEvent`'s name follows.
pub const NOTICE_PREFIX: &str = "notice.forewarn.dev/";
/// The prefix of the acknowledgement annotations; the `ScheduledEvent`'s
/// name follows, and the value is the `EventId`.
pub const ACK_PREFIX: &str = "ack.forewarn.dev/";

/// The longest annotation value the cache keeps of a pod (an
/// acknowledgement is an `EventId`, a notice about 250 bytes): a workload
/// cannot make the controller hold more.
const VALUE_KEPT: usize = 512;

/// A pod that takes part, as the pod cache keeps it: who it is, whether it
/// asked to be waited for, and its notice and acknowledgement annotations
/// only (no other annotation is kept).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Participant {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, sent with each write so that a pod recreated under the same
    /// name (a StatefulSet's) never gets its predecessor's notice.
    pub uid: String,
    /// Labelled `forewarn.dev/acknowledge: "true"`.
    pub acknowledges: bool,
    /// Being deleted: it still gets notices, but nothing waits for it.
    pub terminating: bool,
    /// Its `notice.forewarn.dev/*` and `ack.forewarn.dev/*` annotations.
    pub annotations: BTreeMap<String, String>,
}

impl Participant {
    /// The pod as a participant, if it takes part: labelled, not a mirror
    /// pod, not finished.
    pub fn from_pod(pod: &Pod) -> Option<Participant> {
        let labels = pod.labels();
        let asked = |label: &str| labels.get(label).is_some_and(|v| v == "true");
        let acknowledges = asked(ACKNOWLEDGE_LABEL);
        if !acknowledges && !asked(NOTICE_LABEL) {
            return None;
        }
        let finished = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        if finished
            || pod
                .annotations()
                .contains_key("kubernetes.io/config.mirror")
        {
            return None;
        }
        let annotations = pod
            .annotations()
            .iter()
            .filter(|(k, _)| k.starts_with(NOTICE_PREFIX) || k.starts_with(ACK_PREFIX))
            .map(|(k, v)| (k.clone(), v.chars().take(VALUE_KEPT).collect()))
            .collect();
        Some(Participant {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
            acknowledges,
            terminating: pod.metadata.deletion_timestamp.is_some(),
            annotations,
        })
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Its notice of the event named `event`, if stored.
    pub fn notice(&self, event: &str) -> Option<&str> {
        self.annotations.get(&notice_key(event)).map(String::as_str)
    }

    /// Whether its notice of `event` is stored, for `event_id` (an earlier
    /// notice of another `EventId` under the same name does not count).
    pub fn notified(&self, event: &str, event_id: &str) -> bool {
        self.notice(event)
            .and_then(|n| field(n, "eventId"))
            .is_some_and(|id| id.eq_ignore_ascii_case(&token(event_id)))
    }

    /// Whether it acknowledged `event_id`: `ack.forewarn.dev/<event>` holds
    /// the `EventId` (any case, surrounding spaces ignored).
    pub fn acknowledged(&self, event: &str, event_id: &str) -> bool {
        self.annotations
            .get(&ack_key(event))
            .is_some_and(|v| v.trim().eq_ignore_ascii_case(event_id))
    }

    /// The names of the events it holds a notice or an acknowledgement of.
    pub fn events(&self) -> impl Iterator<Item = &str> {
        self.annotations.keys().filter_map(|k| {
            k.strip_prefix(NOTICE_PREFIX)
                .or_else(|| k.strip_prefix(ACK_PREFIX))
        })
    }

    /// Whether it holds a notice or an acknowledgement of `event`.
    pub fn holds(&self, event: &str) -> bool {
        self.events().any(|e| e == event)
    }
}

/// `notice.forewarn.dev/<event>`.
pub fn notice_key(event: &str) -> String {
    format!("{NOTICE_PREFIX}{event}")
}

/// `ack.forewarn.dev/<event>`.
pub fn ack_key(event: &str) -> String {
    format!("{ACK_PREFIX}{event}")
}

/// What a notice tells a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// `EventId` as IMDS spells it.
    pub event_id: String,
    /// `EventType`.
    pub event_type: String,
    /// `EventStatus` as the agents report it.
    pub status: String,
    /// `NotBefore`, absent once started.
    pub not_before: Option<DateTime<Utc>>,
    /// `DurationInSeconds`: `0` none, `-1` unknown.
    pub duration_seconds: i64,
    /// Forewarn's phase.
    pub phase: Phase,
    /// The policy's action.
    pub action: Action,
    /// Whether forewarn drains the pod's node (evicts its pods, DaemonSet
    /// and mirror pods aside).
    pub drain: bool,
    /// For a pod forewarn waits for: until when.
    pub acknowledge_by: Option<DateTime<Utc>>,
}

/// `s` with every character but ASCII letters, digits and `._:+-`
/// replaced by `_`: a value a line of `key=value` words can hold, and
/// that the kubelet's Go quoting leaves as it is.
fn token(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._:+-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The annotation's value: `eventId=... type=... status=... notBefore=...
/// durationSeconds=... phase=... action=... drain=true|false`, then
/// `acknowledgeBy=...` for a pod forewarn waits for. `notBefore` is empty
/// once the event started.
pub fn render(n: &Notice) -> String {
    let mut s = format!(
        "eventId={} type={} status={} notBefore={} durationSeconds={} phase={} action={} drain={}",
        token(&n.event_id),
        token(&n.event_type),
        token(&n.status),
        n.not_before.map(time).unwrap_or_default(),
        n.duration_seconds,
        n.phase.as_str(),
        n.action.as_str(),
        n.drain
    );
    if let Some(by) = n.acknowledge_by {
        s.push_str(&format!(" acknowledgeBy={}", time(by)));
    }
    s
}

/// The value of `key` in a rendered notice.
pub fn field<'a>(notice: &'a str, key: &str) -> Option<&'a str> {
    notice.split(' ').find_map(|w| {
        let (k, v) = w.split_once('=')?;
        (k == key).then_some(v)
    })
}

/// The notice each participant on `nodes` (the nodes handled live for the
/// content `spec`, with `phase` and `action`) should hold of the event
/// `event`, by participant.
pub fn desired(
    spec: &ScheduledEventSpec,
    phase: Phase,
    action: Action,
    nodes: &[ObservedNode],
    ack: Option<&AckState>,
) -> Vec<(Arc<Participant>, String)> {
    let mut out = Vec::new();
    for n in nodes.iter().filter(|n| !n.vm_name.is_empty() && !n.ended) {
        for p in &n.participants {
            let notice = Notice {
                event_id: spec.event_id.clone(),
                event_type: spec.event_type.clone(),
                status: spec.event_status.to_string(),
                not_before: spec.not_before,
                duration_seconds: spec.duration_seconds,
                phase,
                action,
                drain: action.drains(),
                // Only while the wait can matter (its deadline is stable then).
                acknowledge_by: ack
                    .filter(|_| p.acknowledges && spec.event_status == EventStatus::Scheduled)
                    .map(|a| a.deadline),
            };
            out.push((Arc::clone(p), render(&notice)));
        }
    }
    out
}

/// One write of a pod's notice annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoticeWrite {
    /// The pod.
    pub pod: Arc<Participant>,
    /// The notice to set, or `None` to remove it (and the pod's
    /// acknowledgement of the event, if it has one).
    pub notice: Option<String>,
}

/// The writes that make the pods hold what `desired` says for the event
/// `event`: a notice set where it differs, and notices and
/// acknowledgements removed from the `holders` (pods holding either for
/// the event) that should hold none.
pub fn writes(
    event: &str,
    desired: Vec<(Arc<Participant>, String)>,
    holders: &[Arc<Participant>],
) -> Vec<NoticeWrite> {
    let mut out = Vec::new();
    let mut wanted: HashSet<&str> = HashSet::new();
    for (pod, value) in &desired {
        wanted.insert(pod.uid.as_str());
        if pod.notice(event) != Some(value.as_str())
            && !out.iter().any(|w: &NoticeWrite| w.pod.uid == pod.uid)
        {
            out.push(NoticeWrite {
                pod: Arc::clone(pod),
                notice: Some(value.clone()),
            });
        }
    }
    for pod in holders.iter().filter(|p| !wanted.contains(p.uid.as_str())) {
        if pod.holds(event) {
            out.push(NoticeWrite {
                pod: Arc::clone(pod),
                notice: None,
            });
        }
    }
    out
}

/// The JSON merge patch of a write about `event`: only its keys, and the
/// pod's UID (the API server refuses the patch if the pod under that name
/// is another).
pub fn patch_body(event: &str, w: &NoticeWrite) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    annotations.insert(
        notice_key(event),
        w.notice.clone().map_or(serde_json::Value::Null, Into::into),
    );
    if w.notice.is_none() && w.pod.annotations.contains_key(&ack_key(event)) {
        annotations.insert(ack_key(event), serde_json::Value::Null);
    }
    json!({"metadata": {"uid": w.pod.uid, "annotations": annotations}})
}

/// How a write ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Stored.
    Written,
    /// The pod is gone, or another pod has its name now (404; 409 or 422
    /// on its UID).
    Gone,
    /// Refused or not answered; tried again on a later pass.
    Failed(String),
}

/// How many notice writes are in flight at once.
const WRITE_CONCURRENCY: usize = 16;

/// Carries out `writes` about the event `event`, several at once (field
/// manager `forewarn-controller`).
pub async fn write_all(
    client: &Client,
    event: &str,
    writes: &[NoticeWrite],
) -> Vec<(NoticeWrite, WriteOutcome)> {
    let params = PatchParams {
        field_manager: Some(CONTROLLER_MANAGER.into()),
        ..PatchParams::default()
    };
    futures::stream::iter(writes.iter().cloned())
        .map(|w| {
            let api: Api<Pod> = Api::namespaced(client.clone(), &w.pod.namespace);
            let body = patch_body(event, &w);
            let params = params.clone();
            async move {
                let outcome = match api.patch(&w.pod.name, &params, &Patch::Merge(&body)).await {
                    Ok(_) => WriteOutcome::Written,
                    // 422 on `metadata.uid`: another pod has the name now.
                    Err(kube::Error::Api(s))
                        if s.code == 404
                            || s.code == 409
                            || (s.code == 422 && s.message.contains("metadata.uid")) =>
                    {
                        WriteOutcome::Gone
                    }
                    Err(e) => WriteOutcome::Failed(e.to_string()),
                };
                (w, outcome)
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(labels: serde_json::Value, annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "db-0", "namespace": "shop", "uid": "u0",
                "labels": labels, "annotations": annotations},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": "Running"},
        }))
        .expect("pod")
    }

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn only_labelled_pods_take_part_and_only_their_notices_are_kept() {
        assert_eq!(
            Participant::from_pod(&pod(json!({"app": "db"}), json!({}))),
            None
        );
        assert_eq!(
            Participant::from_pod(&pod(json!({NOTICE_LABEL: "false"}), json!({}))),
            None
        );
        let p = Participant::from_pod(&pod(
            json!({ACKNOWLEDGE_LABEL: "true"}),
            json!({"notice.forewarn.dev/ev1": "eventId=EV1 type=Reboot", "ack.forewarn.dev/ev1": " ev1 ",
                   "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(5000)}),
        ))
        .expect("takes part");
        assert!(p.acknowledges);
        assert_eq!(p.annotations.len(), 2, "{:?}", p.annotations);
        assert!(p.notified("ev1", "EV1"));
        assert!(!p.notified("ev1", "EV2"));
        assert!(p.acknowledged("ev1", "EV1"));
        assert!(!p.acknowledged("ev2", "EV1"));
        assert_eq!(p.events().collect::<Vec<_>>(), ["ev1", "ev1"]);
        let n = Participant::from_pod(&pod(json!({NOTICE_LABEL: "true"}), json!({}))).unwrap();
        assert!(!n.acknowledges);
        // A workload's long value is cut: the cache holds little per pod.
        let big = Participant::from_pod(&pod(
            json!({NOTICE_LABEL: "true"}),
            json!({"ack.forewarn.dev/ev1": "y".repeat(100_000)}),
        ))
        .unwrap();
        assert_eq!(big.annotations["ack.forewarn.dev/ev1"].len(), VALUE_KEPT);
    }

    #[test]
    fn a_notice_is_one_line_of_words_the_kubelets_quoting_leaves_alone() {
        let n = Notice {
            event_id: "C7061BAC-AFDC-4513-B24B-AA5F13A16123".into(),
            event_type: "Live \"Migration\"\\x".into(),
            status: "Scheduled".into(),
            not_before: Some(t("2026-11-21T10:10:00Z")),
            duration_seconds: 5,
            phase: Phase::Pending,
            action: Action::Approve,
            drain: false,
            acknowledge_by: Some(t("2026-11-21T10:05:00.123Z")),
        };
        let v = render(&n);
        assert_eq!(
            v,
            "eventId=C7061BAC-AFDC-4513-B24B-AA5F13A16123 type=Live__Migration__x status=Scheduled notBefore=2026-11-21T10:10:00Z durationSeconds=5 phase=Pending action=Approve drain=false acknowledgeBy=2026-11-21T10:05:00Z"
        );
        assert!(!v.contains(['"', '\\', '\n']));
        assert_eq!(field(&v, "notBefore"), Some("2026-11-21T10:10:00Z"));
        assert_eq!(field(&v, "phase"), Some("Pending"));
        let started = render(&Notice {
            not_before: None,
            acknowledge_by: None,
            ..n
        });
        assert_eq!(field(&started, "notBefore"), Some(""));
        assert_eq!(field(&started, "acknowledgeBy"), None);
    }

    fn participant(uid: &str, annotations: &[(&str, &str)]) -> Arc<Participant> {
        Arc::new(Participant {
            namespace: "shop".into(),
            name: format!("p-{uid}"),
            uid: uid.into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Participant::default()
        })
    }

    #[test]
    fn writes_set_what_differs_and_remove_what_is_no_longer_wanted() {
        let same = participant("a", &[("notice.forewarn.dev/ev1", "v1")]);
        let stale = participant("b", &[("notice.forewarn.dev/ev1", "old")]);
        let fresh = participant("c", &[]);
        let left = participant(
            "d",
            &[
                ("notice.forewarn.dev/ev1", "v1"),
                ("ack.forewarn.dev/ev1", "EV1"),
            ],
        );
        let other = participant("e", &[("notice.forewarn.dev/ev2", "v2")]);
        let w = writes(
            "ev1",
            vec![
                (same.clone(), "v1".into()),
                (stale.clone(), "v1".into()),
                (fresh.clone(), "v1".into()),
            ],
            &[same, stale.clone(), left.clone(), other],
        );
        let got: Vec<(&str, Option<&str>)> = w
            .iter()
            .map(|w| (w.pod.uid.as_str(), w.notice.as_deref()))
            .collect();
        assert_eq!(got, [("b", Some("v1")), ("c", Some("v1")), ("d", None)]);
        // A removal takes the pod's acknowledgement along; a set touches the notice only.
        assert_eq!(
            patch_body("ev1", &w[2]),
            json!({"metadata": {"uid": "d", "annotations": {
                "notice.forewarn.dev/ev1": null, "ack.forewarn.dev/ev1": null}}})
        );
        assert_eq!(
            patch_body("ev1", &w[0]),
            json!({"metadata": {"uid": "b", "annotations": {"notice.forewarn.dev/ev1": "v1"}}})
        );
    }
}
