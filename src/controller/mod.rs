//! The controller: for every `ScheduledEvent`, cordon and drain the affected
//! nodes, decide the approval once they are drained, and uncordon them when
//! the event is over. Acts only while it holds the leader-election Lease.
//!
//! One direction of flow (docs/architecture.md draws it): [`observe`] reads
//! what a pass knows, [`decide`] turns it into a plan and a status (pure),
//! [`act`] writes them; [`reconcile`] is one pass, observe -> decide -> act
//! -> report, and [`runtime`] is the process around the passes (wiring,
//! leader election, reloads, sweeps).

pub mod act;
pub mod decide;
pub mod observe;
pub mod reconcile;
pub mod runtime;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use governor::DefaultDirectRateLimiter;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::reflector::Store;

use chrono::{DateTime, Utc};

use crate::api::{AGENT_MANAGER, Report, ScheduledEvent, ScheduledEventReport};
use crate::controller::act::{drain, node_condition, publish};
use crate::controller::observe::{heartbeats, impact, pods};
use crate::controller::runtime::reload;
use crate::metrics::controller::ControllerMetrics;
use crate::notify::webhooks;
use crate::policy::Policy;
use crate::topology::VirtualMachineReport;

pub use runtime::run::run;

/// Errors of one reconcile; all are retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Cordoning, uncordoning or recording a hold failed (409: someone wrote
    /// the node since it was read; retried at once).
    #[error("failed to patch node {node}: {source}")]
    PatchNode {
        /// Node name.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Listing a node's pods failed.
    #[error(transparent)]
    ListPods(#[from] drain::Error),
    /// Writing the status failed.
    #[error("failed to patch status of ScheduledEvent {name}: {source}")]
    PatchStatus {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Creating a `ScheduledEvent` or writing its spec failed.
    #[error("failed to write ScheduledEvent {name}: {source}")]
    WriteEvent {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Deleting an expired object failed.
    #[error("failed to delete ScheduledEvent {name}: {source}")]
    DeleteEvent {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// A short, closed-set name for metrics (`reason` label).
    pub fn category(&self) -> &'static str {
        match self {
            Error::PatchNode {
                source: kube::Error::Api(s),
                ..
            } if s.code == 409 => "conflict",
            Error::PatchNode { .. } => "patch_node",
            Error::ListPods(_) => "list_pods",
            Error::PatchStatus { .. } => "patch_status",
            Error::DeleteEvent { .. } => "delete_event",
            Error::WriteEvent { .. } => "write_event",
        }
    }
}

impl Context {
    /// Forgets the bookkeeping of `ScheduledEvent`s no longer cached (deleted
    /// ones): failure counts, blocked-drain passes and the keys of events
    /// already counted as observed. Run by the sweep, so these maps hold
    /// about as many entries as there are live events.
    pub fn forget_deleted_events(&self) {
        let live = self.events.state();
        let names: std::collections::HashSet<String> = live
            .iter()
            .map(|e| kube::ResourceExt::name_any(e.as_ref()))
            .collect();
        let uids: std::collections::HashSet<String> =
            live.iter().filter_map(|e| e.metadata.uid.clone()).collect();
        for map in [&self.failures, &*self.blocked] {
            map.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|name, _| names.contains(name));
        }
        self.drained_unlisted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|uid, _| uids.contains(uid));
        self.metrics.forget_observed_except(&uids);
    }

    /// Whether `node`'s drain in `ev` was seen while its record was not
    /// listed; remembers it when `unlisted` (see `drained_unlisted`). After
    /// a restart a drain not listed may be announced once more.
    pub fn drained_unlisted(&self, ev: &ScheduledEvent, node: &str, unlisted: bool) -> bool {
        let uid = ev.metadata.uid.clone().unwrap_or_default();
        let mut map = self
            .drained_unlisted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if unlisted {
            !map.entry(uid).or_default().insert(node.to_string())
        } else {
            map.get(&uid).is_some_and(|s| s.contains(node))
        }
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<Policy> {
        reload::current(&self.policy)
    }

    /// Whether the caches of `ScheduledEvent`s, of both kinds of reports and
    /// of pods hold their first full list (before, a missing report would
    /// read as a silent agent, a missing `VirtualMachineReport` as a node
    /// of no known VM).
    pub fn caches_synced(&self) -> bool {
        use futures::FutureExt;
        let ready = |r: Option<Result<(), _>>| r.is_some_and(|r| r.is_ok());
        ready(self.events.wait_until_ready().now_or_never())
            && ready(self.reports.wait_until_ready().now_or_never())
            && ready(self.vm_reports.wait_until_ready().now_or_never())
            && self.pods.ready()
    }

    /// Every cached report, by the name of the `ScheduledEvent` it is
    /// about, none left out (the sweep keeps what any of them names; the
    /// passes read those taken into account, [`reconcile::Facts`]).
    pub fn reports_by_event(&self) -> ReportsByEvent {
        group_by_event(self.reports.state())
    }
}

/// Reports by the name of the `ScheduledEvent` they are about.
pub type ReportsByEvent = HashMap<String, Vec<Arc<ScheduledEventReport>>>;

fn group_by_event(reports: impl IntoIterator<Item = Arc<ScheduledEventReport>>) -> ReportsByEvent {
    let mut by_event = ReportsByEvent::new();
    for r in reports {
        by_event
            .entry(r.spec.scheduled_event.clone())
            .or_default()
            .push(r);
    }
    by_event
}

/// The reports about the event named `name`, and when an agent last wrote
/// one of them (its `managedFields` time, else its creation).
pub fn reports_about(reports: &ReportsByEvent, name: &str) -> (Vec<Report>, Option<DateTime<Utc>>) {
    let about = reports.get(name).map(Vec::as_slice).unwrap_or_default();
    let last = about.iter().filter_map(|r| last_write(r)).max();
    (about.iter().map(|r| r.spec.report.clone()).collect(), last)
}

fn last_write(r: &ScheduledEventReport) -> Option<DateTime<Utc>> {
    let to_chrono = |t: &k8s_openapi::jiff::Timestamp| {
        DateTime::from_timestamp(
            t.as_second(),
            u32::try_from(t.subsec_nanosecond()).unwrap_or(0),
        )
    };
    r.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some(AGENT_MANAGER))
        .filter_map(|m| m.time.as_ref().and_then(|t| to_chrono(&t.0)))
        .max()
        .or_else(|| {
            r.metadata
                .creation_timestamp
                .as_ref()
                .and_then(|t| to_chrono(&t.0))
        })
}

/// Every VM each node's agent states in its reports, by node name: the
/// controller never takes one as the node's VM, it compares them with the
/// node's fixed one (see [`act::nodes::identities`]).
pub fn stated_vms(reports: &ReportsByEvent) -> HashMap<String, BTreeSet<String>> {
    let mut stated: HashMap<String, BTreeSet<String>> = HashMap::new();
    for r in reports.values().flatten() {
        let r = &r.spec.report;
        stated
            .entry(r.node.clone())
            .or_default()
            .insert(r.vm.clone());
    }
    stated
}

/// The VM each node's `VirtualMachineReport` fixed, by node name (a report
/// whose name is not its node's is left out; the CRD refuses one anyway).
pub fn fixed_vms(reports: &[Arc<VirtualMachineReport>]) -> HashMap<String, String> {
    reports
        .iter()
        .filter(|r| r.metadata.name.as_deref() == Some(r.spec.node.as_str()))
        .map(|r| (r.spec.node.clone(), r.spec.vm.clone()))
        .collect()
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What every reconcile shares.
pub struct Context {
    client: Client,
    /// A client that does not retry 429s itself, for evictions (see [`drain::evict`]).
    evict_client: Client,
    nodes: Store<Node>,
    /// The controller's own cache of `ScheduledEvent`s, to see which other
    /// events claim a node before releasing it.
    events: Store<ScheduledEvent>,
    /// The agents' `ScheduledEventReport`s (see [`observe::trust`]).
    reports: Store<ScheduledEventReport>,
    /// The agents' `VirtualMachineReport`s: the VM of a node without a
    /// `providerID` (see [`act::nodes::identities`]).
    vm_reports: Store<VirtualMachineReport>,
    /// The policy in force; replaced whole when the file changes ([`reload`]).
    policy: reload::Shared,
    /// `--dry-run`: decide and record, never write a node, evict or approve.
    dry_run: bool,
    /// Kubernetes Events to post (see [`publish::publish`]).
    kube_events: publish::EventSink,
    metrics: ControllerMetrics,
    per_node: usize,
    /// The controller-wide eviction rate budget.
    limiter: Arc<DefaultDirectRateLimiter>,
    /// Consecutive failed reconciles per object, for exponential backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The pods the drain considers, by node (see [`pods`]).
    pods: pods::PodCache,
    /// Consecutive passes per event whose evictions a PodDisruptionBudget
    /// refused, for the blocked drain's backoff (an entry lives while its
    /// drain is blocked).
    /// Shared with the PodDisruptionBudget watch, which triggers a pass
    /// over every event in it when a budget changes.
    blocked: Arc<Mutex<HashMap<String, u32>>>,
    /// Per event UID, the drained nodes that its status counts without
    /// listing them (an event of more than
    /// [`decide::status::NODE_RECORDS_LISTED`] nodes), so that each node's drain is
    /// announced once (a listed node's record says it). Forgotten with the
    /// event.
    drained_unlisted: Mutex<HashMap<String, std::collections::HashSet<String>>>,
    /// The last `bootID` of every node (see [`impact`]).
    boot_ids: Arc<impact::BootIds>,
    /// The Lease watches of the nodes live `Freeze`s affect (see [`heartbeats`]).
    heartbeats: Arc<heartbeats::Heartbeats>,
    /// Recent writes of the node condition (see [`node_condition`]).
    node_conditions: node_condition::Written,
    /// Asks for a reconcile of a `ScheduledEvent` (a restart or a freeze
    /// of one of its nodes just ended).
    trigger: impact::Trigger,
    /// The operators' webhooks (none unless `--webhooks-file`).
    webhooks: webhooks::Webhooks,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EventStatus, ScheduledEventReportSpec};

    fn report(event: &str, node: &str) -> Arc<ScheduledEventReport> {
        Arc::new(ScheduledEventReport::new(
            &format!("{event}.{node}"),
            ScheduledEventReportSpec {
                scheduled_event: event.into(),
                report: Report {
                    node: node.into(),
                    vm: format!("vm-{node}"),
                    named: true,
                    event_status: EventStatus::Scheduled,
                    appearance: 1,
                    event_id: event.into(),
                    event_type: "Reboot".into(),
                    event_source: "Platform".into(),
                    resource_type: "VirtualMachine".into(),
                    resources: vec![format!("vm-{node}")],
                    not_before: None,
                    duration_seconds: -1,
                    description: String::new(),
                    document_incarnation: 1,
                    approvals: Vec::new(),
                },
            },
        ))
    }

    #[test]
    fn reports_are_grouped_by_event_and_state_each_nodes_vm() {
        let all = group_by_event([report("ev", "a"), report("ev", "c"), report("other", "d")]);
        let (about, _) = reports_about(&all, "ev");
        let nodes: Vec<&str> = about.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(nodes, ["a", "c"]);
        assert!(reports_about(&all, "none").0.is_empty());
        let vms = stated_vms(&all);
        assert_eq!(vms["d"], BTreeSet::from(["vm-d".to_string()]));
        assert_eq!(vms.len(), 3);
        // An agent stating two VMs: both kept, for the conflict.
        let mut flip = report("other", "a");
        Arc::make_mut(&mut flip).spec.report.vm = "vm-b".into();
        let vms = stated_vms(&group_by_event([report("ev", "a"), flip]));
        assert_eq!(
            vms["a"],
            BTreeSet::from(["vm-a".to_string(), "vm-b".to_string()])
        );
    }
}
