//! Notices: the pods that take part (docs/workload-authors.md)
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
//!   quotes or backslashes ([`crate::controller::observe::participants::render`]), so the kubelet's file (each
//!   annotation as `key="value"`, the value Go-quoted) needs no unescaping.
//! - Removed, with the pod's acknowledgement of it, when the event is over
//!   or no longer affects the pod's node, and by the sweep for events that
//!   are gone. The chart's admission policy lets the controller change
//!   nothing on a pod but these annotations (set or remove a notice,
//!   remove an acknowledgement).

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use crate::metrics::controller::ControllerMetrics;

use crate::api::CONTROLLER_MANAGER;
use crate::controller::observe::participants::{Participant, ack_key, notice_key};

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

/// Writes the notices ([`write_all`]); a failure is logged and counted,
/// and the write is tried again on a later pass (the approval waits for
/// the notice meanwhile, up to its deadline).
pub async fn write(
    event: &str,
    writes: &[NoticeWrite],
    client: &Client,
    metrics: &ControllerMetrics,
) {
    if writes.is_empty() {
        return;
    }
    for (w, outcome) in write_all(client, event, writes).await {
        let pod = w.pod.key();
        let label = match (&outcome, &w.notice) {
            (WriteOutcome::Written, Some(value)) => {
                info!(%pod, notice = %value, "Notice written");
                "written"
            }
            (WriteOutcome::Written, None) => {
                info!(%pod, "Notice removed");
                "removed"
            }
            (WriteOutcome::Gone, _) => "gone",
            (WriteOutcome::Failed(why), _) => {
                warn!(%pod, %why, "Could not write a notice; will retry");
                "failed"
            }
        };
        metrics.notice_writes.with_label_values(&[label]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Phase;
    use crate::controller::observe::participants::*;
    use crate::policy::Action;
    use chrono::{DateTime, Utc};

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
