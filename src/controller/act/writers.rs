//! What the writes go through: the API clients, the eviction rate budget,
//! the Kubernetes Events and webhooks queues, and the metrics they count.

use std::sync::Arc;

use governor::DefaultDirectRateLimiter;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::reflector::Store;

use crate::controller::act::kube_events::EventSink;
use crate::metrics::controller::ControllerMetrics;
use crate::notify::webhooks::Webhooks;

/// The writers every pass shares.
#[derive(Clone)]
pub struct Writers {
    /// The controller's client.
    pub client: Client,
    /// A client that does not retry 429s itself, for evictions (see
    /// [`crate::controller::act::drain::evict`]).
    pub evict_client: Client,
    /// The controller-wide eviction rate budget.
    pub limiter: Arc<DefaultDirectRateLimiter>,
    /// Kubernetes Events to post (see [`crate::controller::act::publish::publish`]).
    pub kube_events: EventSink,
    /// The operators' webhooks (none unless `--webhooks-file`).
    pub webhooks: Webhooks,
    /// The controller's metrics.
    pub metrics: ControllerMetrics,
    /// The node cache, to name a node as an Event's subject.
    pub nodes: Store<Node>,
    /// `--dry-run`: decide and record, never write a node, evict or approve.
    pub dry_run: bool,
    /// What this controller wrote to nodes that the node cache may not
    /// show yet (see [`crate::controller::act::cordon::WrittenMarks`]).
    pub written_marks: crate::controller::act::cordon::WrittenMarks,
    /// The `ScheduledEvent`s as this controller's last status write left
    /// them (see [`crate::controller::act::latest`]).
    pub latest: crate::controller::act::latest::LatestWritten,
    /// The passes with cordons in flight, which the Kubernetes Events wait
    /// for (see
    /// [`crate::controller::act::cordons_first`]).
    pub cordons_first: crate::controller::act::cordons_first::CordonsFirst,
}

/// Makes the write `body` (a patch of a `ScheduledEvent`) conditional on
/// `version`, the `resourceVersion` the pass read, when it has one: the
/// API server refuses it with 409 Conflict if the object changed since.
/// Every write a pass makes to its event is, each handing the version it
/// made on to the next, so that a pass that read a lagging cache never
/// writes over what it did not see.
pub fn conditional_on(body: &mut serde_json::Value, version: Option<&str>) {
    if let Some(version) = version {
        body["metadata"] = serde_json::json!({ "resourceVersion": version });
    }
}
