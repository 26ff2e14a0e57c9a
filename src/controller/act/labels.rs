//! The fault-domain labels on Nodes: from each agent's
//! `VirtualMachineReport`, the controller (the leader) labels that
//! report's node with the VM's platform fault and update domain, where no
//! cloud provider label already gives its fault domain; the decision is
//! [`crate::topology::labels_to_write`]. A node is written only when its
//! labels differ from what they should be, so a steady cluster costs no
//! write, however often its nodes or reports change otherwise.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::metrics::controller::ControllerMetrics;
use crate::topology::{VirtualMachineReport, labels_to_write};

/// How long after a change the labels are looked at: one pass for a burst
/// of node and report changes.
const SETTLE: Duration = Duration::from_millis(500);

/// A pass over every report at least this often, whatever changed.
const RESYNC: Duration = Duration::from_secs(300);

/// The label writes one pass asks for: `(node, its resourceVersion as
/// read, the labels to set or remove)`, nodes without a report or whose
/// labels are right left out.
pub fn plan(
    nodes: &[Arc<Node>],
    reports: &[Arc<VirtualMachineReport>],
) -> Vec<(String, String, BTreeMap<String, Option<String>>)> {
    let by_name: HashMap<String, &Arc<Node>> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let mut out = Vec::new();
    for r in reports {
        // The CRD pins a report's name to its node; the name is what the
        // admission policy confines, so it is what counts.
        let name = r.name_any();
        if r.spec.node != name {
            continue;
        }
        let Some(node) = by_name.get(&name) else {
            continue;
        };
        let changes = labels_to_write(node, Some(&r.spec));
        if !changes.is_empty() {
            out.push((name, node.resource_version().unwrap_or_default(), changes));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Keeps the labels right until the task is aborted: a pass [`SETTLE`]
/// after each change of the caches (`changed`), and every [`RESYNC`].
/// Writes go through `client` (the leader's: they pass its guard).
pub async fn run(
    client: Client,
    nodes: Store<Node>,
    reports: Store<VirtualMachineReport>,
    changed: Arc<Notify>,
    metrics: ControllerMetrics,
) {
    if reports.wait_until_ready().await.is_err() || nodes.wait_until_ready().await.is_err() {
        return;
    }
    let api: Api<Node> = Api::all(client);
    // What was written, by node, with the node's resourceVersion it was
    // based on: a pass before the cache shows the write does not repeat it.
    let mut written: HashMap<String, (String, BTreeMap<String, Option<String>>)> = HashMap::new();
    loop {
        for (node, version, changes) in plan(&nodes.state(), &reports.state()) {
            if written.get(&node) == Some(&(version.clone(), changes.clone())) {
                continue;
            }
            let body = serde_json::json!({ "metadata": { "labels": changes } });
            match api
                .patch(
                    &node,
                    &crate::api::controller_patch_params(),
                    &Patch::Merge(&body),
                )
                .await
            {
                Ok(_) => {
                    metrics.node_writes.with_label_values(&["label"]).inc();
                    info!(%node, labels = ?changes, "Labelled the node with its VM's fault and update domain");
                    written.insert(node, (version, changes));
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    warn!(%node, error = %e, "Could not label the node with its fault domain; will retry");
                }
            }
        }
        written.retain(|n, _| {
            nodes
                .get(&kube::runtime::reflector::ObjectRef::new(n))
                .is_some()
        });
        tokio::select! {
            () = changed.notified() => tokio::time::sleep(SETTLE).await,
            () = tokio::time::sleep(RESYNC) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{FAULT_DOMAIN_LABEL, UPDATE_DOMAIN_LABEL, VirtualMachineReportSpec};

    fn node(name: &str, labels: &[(&str, &str)]) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.resource_version = Some("7".into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        Arc::new(n)
    }

    fn report(name: &str, node: &str, fd: &str) -> Arc<VirtualMachineReport> {
        Arc::new(VirtualMachineReport::new(
            name,
            VirtualMachineReportSpec {
                node: node.into(),
                vm: format!("vm-{node}"),
                platform_fault_domain: fd.into(),
                platform_update_domain: "1".into(),
            },
        ))
    }

    #[test]
    fn each_report_labels_its_own_node_once() {
        let nodes = [
            node("a", &[]),
            node(
                "b",
                &[(FAULT_DOMAIN_LABEL, "2"), (UPDATE_DOMAIN_LABEL, "1")],
            ),
            node("c", &[("topology.kubernetes.io/zone", "1")]),
        ];
        let reports = [
            report("a", "a", "0"),
            report("b", "b", "2"),
            report("c", "c", "1"),
            // A report of a node not in the cluster, and one whose name
            // is not its node's (the CRD refuses it; never acted on).
            report("gone", "gone", "1"),
            report("d", "a", "2"),
        ];
        let writes = plan(&nodes, &reports);
        assert_eq!(writes.len(), 1, "{writes:?}");
        let (name, version, changes) = &writes[0];
        assert_eq!((name.as_str(), version.as_str()), ("a", "7"));
        assert_eq!(changes[FAULT_DOMAIN_LABEL].as_deref(), Some("0"));
        assert_eq!(changes[UPDATE_DOMAIN_LABEL].as_deref(), Some("1"));
    }
}
