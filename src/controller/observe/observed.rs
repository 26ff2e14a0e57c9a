//! What one pass observed of an event's nodes and their pods, as the plan
//! reads it ([`Observed`]): gathered by the reconcile from the caches and
//! the judged reports, never written back.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::controller::decide::out_of_service::RecordedNode;
use crate::controller::observe::participants::Participant;
use crate::controller::observe::pod_list::PodInfo;

/// A node that matters to the event: mapped from `Resources`, or holding a
/// cordon for it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObservedNode {
    /// Node name.
    pub name: String,
    /// The VM name from `Resources` that maps to it; empty if it is only here
    /// because it holds a cordon for the event.
    pub vm_name: String,
    /// `spec.unschedulable`.
    pub cordoned: bool,
    /// Events for which forewarn holds its cordon (annotation).
    pub holds: Vec<String>,
    /// Other unfinished `ScheduledEvent`s that map to this node and whose
    /// policy cordons it: a release hands the cordon over to them instead of
    /// uncordoning, whether or not they have written their hold yet.
    pub claimed_by: Vec<String>,
    /// Pods on the node that are not DaemonSet, mirror or finished pods,
    /// shared with the pod cache (a pass over 10,000 pods copies no pod);
    /// without those the policy's `excludePods` names (see `excluded`).
    pub pods: Vec<Arc<PodInfo>>,
    /// Pods on the node the policy's `excludePods` keeps, with why: never
    /// evicted, reported as kept, not waited for.
    pub excluded: Vec<(Arc<PodInfo>, &'static str)>,
    /// The node's own part of the event ended (see [`crate::controller::observe::trust`]) while
    /// it still holds the event's cordon: released after the release delay,
    /// not drained, not counted for the approval.
    pub ended: bool,
    /// Pods on the node that take part (see [`crate::controller::act::notice`]), DaemonSet
    /// pods included, shared with the pod cache.
    pub participants: Vec<Arc<Participant>>,
}

/// What the controller saw for one event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Nodes mapped from `Resources`, then nodes holding a cordon for the event.
    pub nodes: Vec<ObservedNode>,
    /// Entries of `Resources` that map to no node.
    pub unmapped: Vec<String>,
    /// Why the mapping cannot be trusted for an approval (a VM claimed by
    /// several nodes, an annotation contradicting a providerID, a node no
    /// trusted report confirms).
    pub doubts: Vec<String>,
    /// Nodes `Resources` maps to that no trusted report confirms (see
    /// [`crate::controller::observe::trust`]): left alone, listed as `node: why`.
    pub unconfirmed: Vec<String>,
    /// Nodes whose own agents report other content than the spec, one line
    /// each (see [`crate::controller::observe::trust::Built::disagreement`]): each is handled on
    /// its own report, and no approval is decided meanwhile.
    pub disagreement: Vec<String>,
    /// When an agent last wrote a report about the event (the API server's
    /// `managedFields` time), else when the first report was created.
    pub last_report: Option<DateTime<Utc>>,
    /// Nodes the status records that are no longer in the cluster.
    pub deleted: Vec<String>,
    /// The controller runs with `--dry-run`: it writes no node, so a node
    /// counts as cordoned as it would be (see [`crate::controller::decide::plan::node_drained`]).
    pub dry_run: bool,
    /// How many fault domains the nodes the event's `Resources` map to are
    /// in, as their labels say ([`crate::topology::fault_domain_of`]);
    /// `None` when no such node's is known.
    pub fault_domains: Option<usize>,
    /// Nodes the event's `Resources` map to that are outside the policy's
    /// `nodeSelector`: recorded, left alone (not cordoned, drained or
    /// waited for), sorted.
    pub unmanaged: Vec<String>,
    /// Whether the event's `Resources` (any content's) map to a node the
    /// policy's `nodeSelector` selects, trusted yet or not.
    pub any_managed: bool,
    /// Namespaces whose labels match the policy's
    /// `excludePods.namespaceSelector`, read for this pass (empty without
    /// one): their pods are never evicted.
    pub excluded_namespaces: std::collections::HashSet<String>,
    /// The nodes the event's status records (mapped from `Resources`) that
    /// are still in the cluster, with their `Ready` condition and whether
    /// they carry the out-of-service taint: see
    /// [`crate::controller::decide::out_of_service`].
    pub recorded: Vec<RecordedNode>,
}
