//! The taint `node.kubernetes.io/out-of-service` (Kubernetes' non-graceful
//! node shutdown), put by forewarn when the policy's `outOfServiceTaint`
//! is on: which nodes of an event that ended get it ([`to_taint`], read by
//! the plan), the taint written ([`taints_with_ours`]) and when forewarn's
//! own is taken back ([`removal`]). No I/O: the writer is
//! [`crate::controller::act::out_of_service`].
//!
//! With the taint on a node that is not Ready, kube-controller-manager's
//! pod garbage collector force-deletes the node's pods (a terminating pod
//! at once, without waiting for a kubelet that will never confirm) and the
//! attach-detach controller detaches their volumes without the six-minute
//! wait, so that a StatefulSet's pod comes back elsewhere. That is only
//! safe when the VM is really gone: a node whose kubelet is Ready runs its
//! pods, and force-deleting them would let two copies of a StatefulSet's
//! pod run at once. Hence the taint goes only on a node whose event ended
//! its VM (a `Terminate` or `Preempt` that ran) and whose `Ready`
//! condition is `False` or `Unknown`.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;

use crate::imds::model::EventType;

/// The taint's key, as Kubernetes' non-graceful node shutdown defines it
/// (`node.kubernetes.io/out-of-service`, GA in Kubernetes 1.28).
pub const TAINT_KEY: &str = "node.kubernetes.io/out-of-service";

/// The taint's value, as Kubernetes' documentation writes it.
pub const TAINT_VALUE: &str = "nodeshutdown";

/// The taint's effect: the pod garbage collector acts on the key with
/// `NoExecute` (and `NoSchedule`); `NoExecute` also evicts pods that do
/// not tolerate it.
pub const TAINT_EFFECT: &str = "NoExecute";

/// Node annotation saying that forewarn put [`TAINT_KEY`] on the node, its
/// value the `ScheduledEvent` it was put for: only with it does forewarn
/// remove the taint, so that one put by a person or another tool is never
/// touched.
pub const OWNED_ANNOTATION: &str = "forewarn.dev/out-of-service";

/// The node's `Ready` condition: `Some(true)` for `True`, `Some(false)`
/// for `False` or `Unknown` (the kubelet says it is not ready, or the node
/// lifecycle controller stopped hearing from it), `None` without one (a
/// node not yet reported on proves nothing).
pub fn ready(node: &Node) -> Option<bool> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    match c.status.as_str() {
        "True" => Some(true),
        "False" | "Unknown" => Some(false),
        _ => None,
    }
}

/// Whether the node has a taint of [`TAINT_KEY`], whoever put it.
pub fn tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_KEY))
}

/// Whether the taint [`TAINT_KEY`] on the node is forewarn's: the node
/// carries [`OWNED_ANNOTATION`].
pub fn ours(node: &Node) -> bool {
    node.annotations().contains_key(OWNED_ANNOTATION)
}

/// Whether an event of this type, once it ran, leaves its VMs gone for
/// good: `Terminate` deletes the VM; `Preempt` evicts a Spot VM
/// (deallocated or deleted, by the scale set's eviction policy).
pub fn ends_vms(event_type: &EventType) -> bool {
    matches!(event_type, EventType::Terminate | EventType::Preempt)
}

/// A node an event's status records, as it is now (see
/// [`crate::controller::observe::observed::Observed::recorded`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordedNode {
    /// Node name.
    pub name: String,
    /// Its `Ready` condition: see [`ready`].
    pub ready: Option<bool>,
    /// It has a taint of [`TAINT_KEY`], whoever put it.
    pub tainted: bool,
}

/// The nodes to taint out of service for an event of `event_type` that
/// `ran` and is over, when the policy asks (`enabled`): each of its
/// `recorded` nodes that still exists, is not Ready (`Some(false)`), has
/// no such taint yet (someone else's stays as it is, and forewarn then
/// does not claim it) and was never tainted for this event (`done`: a
/// node that came back Ready after it was untainted is not tainted again
/// by the same event).
pub fn to_taint(
    enabled: bool,
    event_type: &EventType,
    ran: bool,
    recorded: &[RecordedNode],
    done: impl Fn(&str) -> bool,
) -> Vec<String> {
    if !(enabled && ran && ends_vms(event_type)) {
        return Vec::new();
    }
    recorded
        .iter()
        .filter(|n| n.ready == Some(false) && !n.tainted && !done(&n.name))
        .map(|n| n.name.clone())
        .collect()
}

/// Whether some of the `recorded` nodes of such an event (see
/// [`to_taint`]) may still be tainted: not tainted, not `done`, and Ready
/// (or not reported on) for now. The node lifecycle controller marks a
/// node whose kubelet stopped `Unknown` only after its grace period
/// (`--node-monitor-grace-period`, 40 s by default, 50 s since Kubernetes
/// 1.32), and node changes wake no pass of the event: the plan looks again.
pub fn may_yet_taint(
    enabled: bool,
    event_type: &EventType,
    ran: bool,
    recorded: &[RecordedNode],
    done: impl Fn(&str) -> bool,
) -> bool {
    enabled
        && ran
        && ends_vms(event_type)
        && recorded
            .iter()
            .any(|n| n.ready != Some(false) && !n.tainted && !done(&n.name))
}

/// The node's taints with forewarn's out-of-service taint added, or `None`
/// when it has a taint of that key already. Other taints are kept as they
/// are.
pub fn taints_with_ours(node: &Node) -> Option<Vec<Taint>> {
    if tainted(node) {
        return None;
    }
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    taints.push(Taint {
        key: TAINT_KEY.into(),
        value: Some(TAINT_VALUE.into()),
        effect: TAINT_EFFECT.into(),
        time_added: None,
    });
    Some(taints)
}

/// What becomes of forewarn's out-of-service taint on a node.
#[derive(Debug, Clone, PartialEq)]
pub enum Removal {
    /// The node is Ready again: write these taints (ours gone, the others
    /// as they are) and drop [`OWNED_ANNOTATION`].
    Untaint(Vec<Taint>),
    /// The taint is gone already (someone removed it): drop
    /// [`OWNED_ANNOTATION`] only.
    Forget,
}

/// Whether forewarn takes back its out-of-service taint on `node`: only a
/// node that carries [`OWNED_ANNOTATION`] (a taint of the key on a node
/// without it is someone else's and is never touched) and whose kubelet
/// is Ready again (the VM came back: a deallocated Spot VM started again,
/// or a new VM registered under the node's name); a node still not Ready
/// keeps it.
pub fn removal(node: &Node) -> Option<Removal> {
    if !ours(node) {
        return None;
    }
    if !tainted(node) {
        return Some(Removal::Forget);
    }
    if ready(node) != Some(true) {
        return None;
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != TAINT_KEY)
        .collect();
    Some(Removal::Untaint(taints))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    use kube::api::ObjectMeta;

    fn node(ready: Option<&str>, taints: &[&str], ours: bool) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                annotations: ours
                    .then(|| [(OWNED_ANNOTATION.to_string(), "ev1".to_string())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(
                    taints
                        .iter()
                        .map(|k| Taint {
                            key: (*k).into(),
                            value: None,
                            effect: "NoExecute".into(),
                            time_added: None,
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: ready.map(|s| {
                    vec![NodeCondition {
                        type_: "Ready".into(),
                        status: s.into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn ready_reads_the_kubelets_condition_and_unknown_is_not_ready() {
        assert_eq!(ready(&node(Some("True"), &[], false)), Some(true));
        assert_eq!(ready(&node(Some("False"), &[], false)), Some(false));
        assert_eq!(ready(&node(Some("Unknown"), &[], false)), Some(false));
        assert_eq!(ready(&node(None, &[], false)), None);
    }

    #[test]
    fn the_taint_is_added_once_beside_the_other_taints() {
        let n = node(Some("Unknown"), &["example.com/x"], false);
        let t = taints_with_ours(&n).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].key, "example.com/x");
        assert_eq!(
            (
                t[1].key.as_str(),
                t[1].value.as_deref(),
                t[1].effect.as_str()
            ),
            (TAINT_KEY, Some("nodeshutdown"), "NoExecute")
        );
        let n = node(Some("Unknown"), &[TAINT_KEY], false);
        assert_eq!(taints_with_ours(&n), None, "someone's taint is left as is");
    }

    /// Only forewarn's own taint is removed, and only once the node is
    /// Ready again; someone else's stays whatever the node's state.
    #[test]
    fn only_our_taint_is_removed_and_only_once_the_node_is_ready() {
        let theirs = node(Some("True"), &[TAINT_KEY, "example.com/x"], false);
        assert_eq!(removal(&theirs), None);
        let ours_down = node(Some("Unknown"), &[TAINT_KEY], true);
        assert_eq!(removal(&ours_down), None);
        let ours_unreported = node(None, &[TAINT_KEY], true);
        assert_eq!(removal(&ours_unreported), None);
        let ours_back = node(Some("True"), &[TAINT_KEY, "example.com/x"], true);
        match removal(&ours_back) {
            Some(Removal::Untaint(t)) => {
                assert_eq!(t.len(), 1);
                assert_eq!(t[0].key, "example.com/x");
            }
            other => panic!("{other:?}"),
        }
        // Our mark without the taint (removed by hand): forgotten, Ready
        // or not.
        assert_eq!(
            removal(&node(Some("False"), &[], true)),
            Some(Removal::Forget)
        );
        assert_eq!(removal(&node(Some("True"), &[], false)), None);
    }
}
