//! The writer of the taint `node.kubernetes.io/out-of-service` (the
//! policy's `outOfServiceTaint`; which nodes, and when it is taken back,
//! are decided in [`crate::controller::decide::out_of_service`]): put by an
//! event's pass on the nodes its plan names ([`taint`]), taken back by the
//! sweep from every node forewarn put it on once the node is Ready again
//! ([`untaint_returned`]), also after the event's object is deleted: what
//! says the taint is forewarn's is the node's own annotation
//! `forewarn.dev/out-of-service`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use crate::api::{CONTROLLER_MANAGER, ScheduledEvent};
use crate::controller::act::publish::{self, Subject};
use crate::controller::act::writers::Writers;
use crate::controller::decide::out_of_service::{
    OWNED_ANNOTATION, Removal, TAINT_EFFECT, TAINT_KEY, TAINT_VALUE, removal, taints_with_ours,
};
use crate::controller::decide::plan::Plan;
use crate::controller::error::{Error, Result};

/// A merge patch of `body` on `node`, conditional on the `resourceVersion`
/// it was read at (two writers of a node's taints cannot lose each other's
/// change: the loser gets a 409 and tries again from a fresh read), as
/// forewarn's field manager ([`CONTROLLER_MANAGER`]).
async fn patch(api: &Api<Node>, node: &Node, mut body: serde_json::Value) -> kube::Result<()> {
    body["metadata"]["resourceVersion"] = json!(node.resource_version().unwrap_or_default());
    let params = PatchParams {
        field_manager: Some(CONTROLLER_MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(&node.name_any(), &params, &Patch::Merge(&body))
        .await
        .map(|_| ())
}

/// Counts one out-of-service write (taint or untaint) in
/// `forewarn_controller_node_writes_total{action="out_of_service"}`.
fn count_write(writers: &Writers) {
    writers
        .metrics
        .node_writes
        .with_label_values(&["out_of_service"])
        .inc();
}

/// Puts the out-of-service taint on each node `plan.out_of_service` names,
/// as the node cache has it, with the annotation that makes it forewarn's
/// (its value the event's name); a node that has a taint of the key by now
/// (someone else's) is left alone. The write is conditional on the node
/// as read: a node that turned Ready since (a newer `resourceVersion`) is
/// not tainted, and the next pass reads it afresh. Each node written gets a Warning Event
/// `OutOfServiceTainted` (on the node and the event) and counts in
/// `forewarn_controller_node_writes_total{action="out_of_service"}`.
///
/// # Errors
/// The first node write that failed ([`Error::PatchNode`]; 409 when the
/// node changed since it was read): the pass fails before its status
/// records the taint, and the next one tries again.
pub async fn taint(ev: &ScheduledEvent, plan: &Plan, writers: &Writers) -> Result<()> {
    let api: Api<Node> = Api::all(writers.client.clone());
    let name = ev.name_any();
    let mut first_error = None;
    for node_name in &plan.out_of_service {
        let Some(node) = writers.nodes.get(&ObjectRef::new(node_name)) else {
            continue;
        };
        let Some(taints) = taints_with_ours(&node) else {
            continue;
        };
        let body = json!({
            "metadata": {"annotations": {OWNED_ANNOTATION: name}},
            "spec": {"taints": taints},
        });
        match patch(&api, &node, body).await {
            Ok(()) => {
                count_write(writers);
                let note = format!(
                    "Tainted {node_name} {TAINT_KEY}={TAINT_VALUE}:{TAINT_EFFECT}: {} {name} ended its VM and the node is not Ready; Kubernetes force-deletes its pods and detaches their volumes",
                    ev.spec.event_type
                );
                info!(node = %node_name, "{note}");
                publish::publish(
                    writers,
                    ev,
                    Subject::Node(node_name),
                    KubeEventType::Warning,
                    "OutOfServiceTainted",
                    note,
                );
            }
            Err(source) => {
                first_error.get_or_insert(Error::PatchNode {
                    node: node_name.clone(),
                    source,
                });
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Takes back forewarn's out-of-service taint from each node of
/// `snapshot` that is Ready again, and forgets its mark where the taint
/// was removed by someone else ([`removal`]); a taint of the key on a node
/// without forewarn's annotation is never touched. Each node untainted
/// gets a Normal Event `OutOfServiceUntainted` and counts in
/// `forewarn_controller_node_writes_total{action="out_of_service"}`. A
/// failed write (409: the node changed) is logged and left to the next
/// sweep.
pub async fn untaint_returned(writers: &Writers, snapshot: &[Arc<Node>]) {
    let api: Api<Node> = Api::all(writers.client.clone());
    for node in snapshot {
        let Some(what) = removal(node) else {
            continue;
        };
        let name = node.name_any();
        let mut body = json!({"metadata": {"annotations": {OWNED_ANNOTATION: null}}});
        if let Removal::Untaint(taints) = &what {
            body["spec"] = json!({ "taints": taints });
        }
        match patch(&api, node, body).await {
            Ok(()) if what == Removal::Forget => {
                info!(node = %name, "The out-of-service taint forewarn put is gone already: forgot it");
            }
            Ok(()) => {
                count_write(writers);
                let note = format!(
                    "Removed the taint {TAINT_KEY} forewarn put on {name}: the node is Ready again"
                );
                info!(node = %name, "{note}");
                writers.kube_events.post(
                    KubeEvent {
                        type_: KubeEventType::Normal,
                        reason: "OutOfServiceUntainted".into(),
                        note: Some(note),
                        action: "OutOfServiceUntainted".into(),
                        secondary: None,
                    },
                    node.object_ref(&()),
                );
            }
            Err(e) => {
                warn!(node = %name, error = %e, "Could not remove the out-of-service taint; will retry")
            }
        }
    }
}
