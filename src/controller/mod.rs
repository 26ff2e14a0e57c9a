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

    /// The cached reports about the `ScheduledEvent` named `event`.
    pub fn reports_of(&self, event: &str) -> Vec<Report> {
        self.reports
            .state()
            .iter()
            .filter(|r| r.spec.scheduled_event == event)
            .map(|r| r.spec.report.clone())
            .collect()
    }

    /// The cached reports, by the name of the `ScheduledEvent` they are about.
    pub fn reports_by_event(&self) -> HashMap<String, Vec<Report>> {
        let mut by_event: HashMap<String, Vec<Report>> = HashMap::new();
        for r in self.reports.state() {
            by_event
                .entry(r.spec.scheduled_event.clone())
                .or_default()
                .push(r.spec.report.clone());
        }
        by_event
    }
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
