//! What every event's pass reads from the caches once ([`Facts`]): the
//! nodes, the reports taken into account, and each node's fixed VM.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::controller::observe::caches::Caches;
use crate::controller::observe::intake;
use crate::controller::observe::nodes;
use crate::controller::observe::reports::{ReportsByEvent, fixed_vms, stated_vms};
use crate::controller::observe::trust;

/// What every event's pass reads from the caches once.
pub struct Facts {
    /// The node cache.
    pub nodes: Vec<Arc<Node>>,
    /// The reports taken into account, by event ([`intake::admit`]).
    pub reports: ReportsByEvent,
    /// Every node's fixed VM (see [`nodes::identities`]).
    ids: nodes::Identities,
    /// The reports left out, counted.
    pub ignored: intake::Ignored,
}

impl Facts {
    /// Reads the caches.
    pub fn read(caches: &Caches) -> Self {
        let nodes = caches.nodes.state();
        let vm_reports = caches.vm_reports.state();
        let fixed = fixed_vms(&vm_reports);
        // The reports taken into account: a node's reports about its own
        // fixed VM first (providerID's, else its VirtualMachineReport's).
        let (reports, ignored) = intake::admit(
            caches.reports.state(),
            intake::MAX_LIVE_REPORTS_PER_NODE,
            |n| {
                nodes
                    .iter()
                    .find(|x| x.name_any() == n)
                    .and_then(|x| nodes::provider_vm(x))
                    .or_else(|| fixed.get(n).cloned())
            },
        );
        let ids = nodes::identities(
            nodes.iter().map(AsRef::as_ref),
            &fixed,
            &stated_vms(&reports),
        );
        Facts {
            nodes,
            reports,
            ignored,
            ids,
        }
    }

    /// The fixed VM of a node, if it has one (see [`nodes::identities`]).
    pub fn identity(&self, node: &str) -> Option<trust::Identity> {
        self.ids.of(node).cloned()
    }

    /// The name of a node's fixed VM, if it has one.
    pub fn vm_of(&self, node: &str) -> Option<String> {
        self.ids.of(node).map(|id| id.vm.clone())
    }

    /// How `resources` map to nodes.
    pub fn map(&self, resources: &[String]) -> nodes::Mapping {
        nodes::map_resources(resources, &self.ids)
    }
}
