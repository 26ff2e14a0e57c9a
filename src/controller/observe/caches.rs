//! What the passes read: the watch caches of the cluster (kube-runtime
//! reflectors, each fed by one watch) and what this process saw of the
//! nodes' restarts and heartbeats. Shared by every pass and task; nothing
//! here writes to the API server.

use std::sync::Arc;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::Store;

use crate::api::{ScheduledEvent, ScheduledEventReport};
use crate::controller::observe::heartbeats::Heartbeats;
use crate::controller::observe::impact::BootIds;
use crate::controller::observe::pods::PodCache;
use crate::controller::observe::reports::{ReportsByEvent, group_by_event};
use crate::topology::VirtualMachineReport;

/// The caches one pass reads.
#[derive(Clone)]
pub struct Caches {
    /// Every Node.
    pub nodes: Store<Node>,
    /// Every `ScheduledEvent`, to see which other events claim a node
    /// before releasing it.
    pub events: Store<ScheduledEvent>,
    /// The agents' `ScheduledEventReport`s (see
    /// [`crate::controller::observe::trust`]).
    pub reports: Store<ScheduledEventReport>,
    /// The agents' `VirtualMachineReport`s: the VM of a node without a
    /// `providerID` (see [`crate::controller::observe::nodes`]).
    pub vm_reports: Store<VirtualMachineReport>,
    /// The pods the drain considers, by node.
    pub pods: PodCache,
    /// Every PodDisruptionBudget: which budgets select a pod, whether they
    /// allow a disruption, and whether one is wedged, read without a
    /// request per refusal.
    pub budgets: Store<PodDisruptionBudget>,
    /// The last `bootID` of every node (see
    /// [`crate::controller::observe::impact`]).
    pub boot_ids: Arc<BootIds>,
    /// The Lease watches of the nodes live `Freeze`s affect.
    pub heartbeats: Arc<Heartbeats>,
    /// The namespaces' labels, watched once the policy's
    /// `excludePods.namespaceSelector` needs them.
    pub namespaces: crate::controller::observe::namespaces::NamespaceCache,
}

impl Caches {
    /// Whether the caches of `ScheduledEvent`s, of both kinds of reports, of
    /// nodes, of PodDisruptionBudgets and of pods hold their first full
    /// list (before, a missing report would read as a silent agent, a
    /// missing `VirtualMachineReport` as a node of no known VM, a missing
    /// budget as a pod no budget protects: the first passes after a
    /// takeover would evict without the budgets' turns).
    pub fn synced(&self) -> bool {
        let ready = |r: Option<Result<(), _>>| r.is_some_and(|r| r.is_ok());
        ready(self.events.wait_until_ready().now_or_never())
            && ready(self.reports.wait_until_ready().now_or_never())
            && ready(self.vm_reports.wait_until_ready().now_or_never())
            && ready(self.nodes.wait_until_ready().now_or_never())
            && ready(self.budgets.wait_until_ready().now_or_never())
            && self.pods.ready()
    }

    /// Every cached report, by the name of the `ScheduledEvent` it is
    /// about, none left out (the sweep keeps what any of them names; the
    /// passes read those taken into account,
    /// [`crate::controller::observe::facts::Facts`]).
    pub fn reports_by_event(&self) -> ReportsByEvent {
        group_by_event(self.reports.state())
    }
}
