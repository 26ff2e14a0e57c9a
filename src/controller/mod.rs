//! The controller: for every `ScheduledEvent`, cordon and drain the affected
//! nodes, decide the approval once they are drained, and uncordon them when
//! the event is over. Acts only while it holds the leader-election Lease.
//!
//! Each reconcile reads as observe -> plan -> act -> report:
//! [`reconcile`] observes and acts, [`plan`] and [`status`] are pure,
//! [`report`] writes the status and the Events; [`run`] wires it all and
//! [`sweep`] releases holds of deleted objects.

pub mod drain;
pub mod lease;
pub mod nodes;
pub mod plan;
pub mod reconcile;
pub mod reload;
pub mod report;
pub mod run;
pub mod status;
pub mod sweep;
pub mod trust;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use governor::DefaultDirectRateLimiter;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use crate::crd::{Report, ScheduledEvent, ScheduledEventReport};
use crate::metrics::ControllerMetrics;
use crate::policy::Policy;

pub use run::run;

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
        }
    }
}

impl Context {
    /// The policy in force now.
    pub fn policy(&self) -> Arc<Policy> {
        reload::current(&self.policy)
    }

    /// Whether the caches of `ScheduledEvent`s and of reports hold their
    /// first full list.
    pub fn caches_synced(&self) -> bool {
        use futures::FutureExt;
        let ready = |r: Option<Result<(), _>>| r.is_some_and(|r| r.is_ok());
        ready(self.events.wait_until_ready().now_or_never())
            && ready(self.reports.wait_until_ready().now_or_never())
    }

    /// The cached reports, by the name of the `ScheduledEvent` they are
    /// about (read once per reconcile: the event's own and the other
    /// events' assessments share it).
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

/// The reports about the object `ev`: named for it and, when they carry an
/// owner reference (agents always set one), owned by this very object, so
/// the reports of an earlier object of the same name, until the garbage
/// collector deletes them, do not count for a new one.
pub fn reports_about(reports: &ReportsByEvent, ev: &ScheduledEvent) -> Vec<Report> {
    let name = ev.metadata.name.as_deref().unwrap_or_default();
    let uid = ev.metadata.uid.as_deref();
    reports
        .get(name)
        .into_iter()
        .flatten()
        .filter(|r| {
            let owners = r.metadata.owner_references.as_deref().unwrap_or_default();
            owners.is_empty() || owners.iter().any(|o| Some(o.uid.as_str()) == uid)
        })
        .map(|r| r.spec.report.clone())
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
    /// The agents' `ScheduledEventReport`s (see [`trust`]).
    reports: Store<ScheduledEventReport>,
    /// The policy in force; replaced whole when the file changes ([`reload`]).
    policy: reload::Shared,
    /// `--dry-run`: decide and record, never write a node, evict or approve.
    dry_run: bool,
    recorder: Recorder,
    metrics: ControllerMetrics,
    per_node: usize,
    /// The controller-wide eviction rate budget.
    limiter: Arc<DefaultDirectRateLimiter>,
    /// Consecutive failed reconciles per object, for exponential backoff.
    failures: Mutex<HashMap<String, u32>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{EventStatus, ScheduledEventReportSpec, ScheduledEventSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn report(event: &str, node: &str, owner: Option<&str>) -> Arc<ScheduledEventReport> {
        let mut r = ScheduledEventReport::new(
            &format!("{event}.{node}"),
            ScheduledEventReportSpec {
                scheduled_event: event.into(),
                report: Report {
                    node: node.into(),
                    vm: format!("vm-{node}"),
                    named: true,
                    event_status: EventStatus::Scheduled,
                    appearance: 1,
                    resources_digest: String::new(),
                },
            },
        );
        r.metadata.owner_references = owner.map(|uid| {
            vec![OwnerReference {
                api_version: "forewarn.dev/v1alpha1".into(),
                kind: "ScheduledEvent".into(),
                name: event.into(),
                uid: uid.into(),
                ..OwnerReference::default()
            }]
        });
        Arc::new(r)
    }

    #[test]
    fn only_reports_about_this_very_object_count() {
        let mut ev = ScheduledEvent::new(
            "ev",
            ScheduledEventSpec {
                event_id: "EV".into(),
                event_type: "Reboot".into(),
                event_status: EventStatus::Scheduled,
                event_source: "Platform".into(),
                resource_type: "VirtualMachine".into(),
                resources: vec!["vm-a".into()],
                not_before: None,
                duration_seconds: -1,
                description: String::new(),
                appearance: 1,
            },
        );
        ev.metadata.uid = Some("uid-new".into());
        let all = [
            report("ev", "a", Some("uid-new")),
            // Of an earlier object of the same name, not yet collected.
            report("ev", "b", Some("uid-old")),
            // Written by hand, without an owner: named for it, it counts.
            report("ev", "c", None),
            report("other", "d", Some("uid-new")),
        ];
        let nodes: Vec<String> = reports_about(&group_by_event(all), &ev)
            .into_iter()
            .map(|r| r.node)
            .collect();
        assert_eq!(nodes, ["a", "c"]);
    }
}
