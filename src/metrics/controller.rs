//! The controller's metrics (see [`crate::metrics`] for the naming rules).
//!
//! The controller's gauges about the state of the cluster (active events,
//! cordoned nodes, blocked drains, events past `NotBefore` without
//! approval) are computed at scrape time from its caches of Nodes and
//! `ScheduledEvent`s ([`ControllerMetrics::watch_caches`]), and only by the
//! leader, so that standbys do not report the same events twice.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use crate::api::{ScheduledEvent, ScheduledEventStatus};
use crate::metrics::{TYPES, phase_label, series_names, source_label, type_label};

/// Buckets of notice (`NotBefore` minus first seen), seconds: Azure gives
/// 30 s (Preempt), 5 to 15 minutes (Freeze, Reboot, Redeploy, Terminate),
/// and up to days for user-initiated maintenance.
const NOTICE_SECONDS: &[f64] = &[
    0.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 21600.0, 86400.0, 604800.0,
];
/// Buckets of detection-to-cordon latency, seconds (goal: 1.5 s p99).
const CORDON_SECONDS: &[f64] = &[
    0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets of drain durations, seconds.
const DRAIN_SECONDS: &[f64] = &[
    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0,
];
/// Buckets of the time left before `NotBefore` when an approval is decided,
/// seconds (negative: decided after it).
const MARGIN_SECONDS: &[f64] = &[
    0.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0,
];

/// Metrics of the controller.
#[derive(Clone)]
pub struct ControllerMetrics {
    /// Reconciles by `result`: `ok`, `error`.
    pub reconciles: IntCounterVec,
    /// Failed reconciles by `category` ([`crate::controller::error::Error::category`]):
    /// `conflict`, `patch_node`, `list_pods`, `patch_status`, `delete_event`.
    pub reconcile_errors: IntCounterVec,
    /// Evictions by `result`: `evicted`, `blocked` (a PodDisruptionBudget
    /// refused it), `throttled` (429 without a budget), `gone`, `error`.
    pub evictions: IntCounterVec,
    /// Node writes by `action`: `cordon`, `uncordon`, `release`, and
    /// `condition` (the `ForewarnScheduledEvent` condition).
    pub node_writes: IntCounterVec,
    /// Restarts of nodes (a change of their `bootID`) that no event in its
    /// impact window announced, seen by the leader.
    pub unexpected_restarts: IntCounter,
    /// Approvals found in a `ScheduledEvent`'s status that the controller
    /// did not write, ignored and cleared (see [`crate::controller::act::foreign`]).
    pub foreign_decisions: IntCounter,
    /// Webhook deliveries by `webhook` (its name in the webhooks file),
    /// `notification` and `result`: `delivered`, `retried`, `failed`,
    /// `rejected`, `dropped` (see `forewarn::notify::webhooks`).
    pub webhook_deliveries: IntCounterVec,
    /// Approvals decided, by event `type`.
    pub approvals_decided: IntCounterVec,
    /// Events whose drain did not finish before its deadline, start or end, by `type`.
    pub drains_incomplete: IntCounterVec,
    /// Writes of pods' notice annotations by `result`: `written`,
    /// `removed`, `gone` (the pod was deleted or replaced), `failed`.
    pub notice_writes: IntCounterVec,
    /// Events whose acknowledgement deadline passed with pods that had not
    /// acknowledged (or whose notice was not stored), by `type`.
    pub acknowledgement_timeouts: IntCounterVec,
    /// Changes of the policy file by `result`: `loaded`, `refused`.
    pub policy_reloads: IntCounterVec,
    /// 1 while the policy file holds a policy that was refused (the policy
    /// in force is an older one), 0 once a valid file is loaded.
    pub policy_refused: IntGauge,
    /// Changes of the webhooks file by `result`: `loaded`, `refused`.
    pub webhooks_reloads: IntCounterVec,
    /// 1 while the webhooks file holds a file that was refused (the
    /// webhooks in force are older ones), 0 once a valid file is loaded.
    pub webhooks_refused: IntGauge,
    /// Kubernetes Events by `result`: `posted`, `failed` (the API server
    /// refused or did not answer), `dropped` (the queue was full).
    pub kube_events: IntCounterVec,
    /// Event appearances seen for the first time, by `type` and `source`.
    pub events_observed: IntCounterVec,
    /// Notice received: `NotBefore` minus the time the controller first saw
    /// the event, seconds, by `type` (events without `NotBefore` are not observed).
    pub notice: HistogramVec,
    /// Detection to cordon: from the `ScheduledEvent`'s `creationTimestamp`
    /// (whole seconds, so up to 1 s early) to the cordon write, seconds, by
    /// `type`; first appearances only.
    pub detection_to_cordon: HistogramVec,
    /// Drain duration: from the controller first seeing the event to an
    /// affected node having no pod left that must leave it, seconds, by `type`.
    pub drain_duration: HistogramVec,
    /// Time left before `NotBefore` when the approval was decided, seconds,
    /// by `type` (negative: decided after `NotBefore`).
    pub approval_margin: HistogramVec,
    /// 1 while this replica holds the leader-election Lease, else 0.
    pub leader: IntGauge,
    /// 1 when the admission policy that confines each agent to its own
    /// node's reports, and its binding, are installed and deny; else 0.
    pub agent_confinement: IntGauge,
    /// Requests to `/metrics` under `--metrics-auth kubernetes`, by
    /// `result` and `cached` ([`crate::metrics_auth::outcome_counter`]);
    /// every replica counts its own, leader or not.
    pub metrics_auth: IntCounterVec,
    /// Reports the controller ignores now, by `reason`: `over_cap` (live
    /// reports of a node beyond its cap), `misnamed` (not about their
    /// `EventId`'s object). See [`crate::controller::observe::intake`].
    pub reports_ignored: IntGaugeVec,
    /// Live reports ignored per `node` over its cap, for at most
    /// [`OVER_CAP_NODES_LISTED`] nodes (those with the most).
    pub reports_over_cap: IntGaugeVec,
    /// `ScheduledEvent`s that exist on the API server while the leader's
    /// cache lacks them, by `seen`: `create_conflict` (a create answered
    /// 409 AlreadyExists for an object the cache did not hold; the object
    /// is read and put in), `pass_without_object` (passes were asked for
    /// an event without an object in the cache for longer than a create's
    /// grace).
    pub cache_misses: IntCounterVec,
    caches: Caches,
    /// Objects (UID and appearance) already counted as observed: a
    /// reconcile that runs on a cached copy older than its own status
    /// write must not count the event again.
    counted: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<(String, u32)>>>,
}

impl ControllerMetrics {
    /// Creates and registers the controller's collectors, with the cache
    /// gauges, which report nothing until [`Self::watch_caches`].
    ///
    /// # Errors
    /// When a collector with the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self::new()?;
        for c in m.collectors()? {
            registry.register(c)?;
        }
        Ok(m)
    }

    fn new() -> prometheus::Result<Self> {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                &["type"],
            )
        };
        Ok(ControllerMetrics {
            reconciles: counter(
                "forewarn_controller_reconciles_total",
                "ScheduledEvent reconciles, by result",
                &["result"],
            )?,
            reconcile_errors: counter(
                "forewarn_controller_reconcile_errors_total",
                "Failed ScheduledEvent reconciles, by error category",
                &["category"],
            )?,
            evictions: counter(
                "forewarn_controller_evictions_total",
                "Pod evictions through the Eviction API, by result",
                &["result"],
            )?,
            node_writes: counter(
                "forewarn_controller_node_writes_total",
                "Node writes, by action: cordon, uncordon, release, condition, label, out_of_service",
                &["action"],
            )?,
            unexpected_restarts: IntCounter::new(
                "forewarn_controller_unexpected_restarts_total",
                "Node restarts (a change of the Node's bootID) outside the impact window of any event that announces one",
            )?,
            foreign_decisions: IntCounter::new(
                "forewarn_controller_foreign_decisions_total",
                "Approvals in a ScheduledEvent's status that the controller did not write, ignored and cleared",
            )?,
            webhook_deliveries: counter(
                "forewarn_controller_webhook_deliveries_total",
                "Webhook deliveries, by webhook, notification and result: delivered, retried (one per retry), failed (every attempt failed), rejected (a 4xx), dropped (queue full)",
                &["webhook", "notification", "result"],
            )?,
            approvals_decided: counter(
                "forewarn_controller_approvals_decided_total",
                "Approvals decided, by event type",
                &["type"],
            )?,
            drains_incomplete: counter(
                "forewarn_controller_drains_incomplete_total",
                "Events whose drain did not finish before the deadline, the start or the end, by event type",
                &["type"],
            )?,
            notice_writes: counter(
                "forewarn_controller_notice_writes_total",
                "Writes of the notice annotations of pods that take part, by result: written, removed, gone (pod deleted or replaced), failed",
                &["result"],
            )?,
            acknowledgement_timeouts: counter(
                "forewarn_controller_acknowledgement_timeouts_total",
                "Events whose acknowledgement deadline passed with pods that had not acknowledged, by event type",
                &["type"],
            )?,
            policy_reloads: counter(
                "forewarn_controller_policy_reloads_total",
                "Changes of the policy file, by result: loaded, or refused (invalid; the policy in force stays)",
                &["result"],
            )?,
            webhooks_reloads: counter(
                "forewarn_controller_webhooks_reloads_total",
                "Changes of the webhooks file, by result: loaded, or refused (invalid; the webhooks in force stay)",
                &["result"],
            )?,
            kube_events: counter(
                "forewarn_controller_kube_events_total",
                "Kubernetes Events, by result: posted, failed (refused or unanswered), dropped (the queue of Events to post was full)",
                &["result"],
            )?,
            events_observed: counter(
                "forewarn_controller_events_observed_total",
                "Event appearances first seen by the controller, by event type and source",
                &["type", "source"],
            )?,
            notice: histogram(
                "forewarn_controller_event_notice_seconds",
                "NotBefore minus the time the controller first saw the event, seconds",
                NOTICE_SECONDS,
            )?,
            detection_to_cordon: histogram(
                "forewarn_controller_detection_to_cordon_seconds",
                "From the ScheduledEvent's creation to the cordon write, seconds",
                CORDON_SECONDS,
            )?,
            drain_duration: histogram(
                "forewarn_controller_drain_duration_seconds",
                "From the event first seen to an affected node drained, seconds",
                DRAIN_SECONDS,
            )?,
            approval_margin: histogram(
                "forewarn_controller_approval_time_to_not_before_seconds",
                "Time left before NotBefore when the approval was decided, seconds",
                MARGIN_SECONDS,
            )?,
            policy_refused: IntGauge::new(
                "forewarn_controller_policy_file_refused",
                "1 while the policy file holds an invalid policy that was refused (an older policy is in force), else 0",
            )?,
            webhooks_refused: IntGauge::new(
                "forewarn_controller_webhooks_file_refused",
                "1 while the webhooks file holds an invalid file that was refused (older webhooks are in force), else 0",
            )?,
            leader: IntGauge::new(
                "forewarn_controller_leader",
                "1 while this replica holds the leader-election Lease",
            )?,
            agent_confinement: IntGauge::new(
                "forewarn_agent_confinement_installed",
                "1 when the admission policy confining each agent to its own node's reports is installed and denies",
            )?,
            metrics_auth: crate::metrics_auth::outcome_counter("controller")?,
            reports_ignored: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_reports_ignored",
                    "ScheduledEventReports the controller ignores, by reason: over_cap (live reports of a node beyond the most it takes into account), misnamed (scheduledEvent is not the object name of its EventId)",
                ),
                &["reason"],
            )?,
            reports_over_cap: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_reports_over_cap",
                    "Live ScheduledEventReports of a node that the controller ignores because the node has more than it takes into account, by node (at most 20 nodes, those with the most)",
                ),
                &["node"],
            )?,
            cache_misses: counter(
                "forewarn_controller_cache_misses_total",
                "ScheduledEvents on the API server that the controller's cache lacked, by how it was seen: create_conflict, pass_without_object",
                &["seen"],
            )?,
            caches: Caches::default(),
            counted: std::sync::Arc::default(),
        })
    }

    fn collectors(&self) -> prometheus::Result<Vec<Box<dyn Collector>>> {
        Ok(vec![
            Box::new(self.reconciles.clone()),
            Box::new(self.reconcile_errors.clone()),
            Box::new(self.evictions.clone()),
            Box::new(self.node_writes.clone()),
            Box::new(self.unexpected_restarts.clone()),
            Box::new(self.foreign_decisions.clone()),
            Box::new(self.webhook_deliveries.clone()),
            Box::new(self.approvals_decided.clone()),
            Box::new(self.drains_incomplete.clone()),
            Box::new(self.notice_writes.clone()),
            Box::new(self.acknowledgement_timeouts.clone()),
            Box::new(self.policy_reloads.clone()),
            Box::new(self.policy_refused.clone()),
            Box::new(self.webhooks_reloads.clone()),
            Box::new(self.webhooks_refused.clone()),
            Box::new(self.kube_events.clone()),
            Box::new(self.events_observed.clone()),
            Box::new(self.notice.clone()),
            Box::new(self.detection_to_cordon.clone()),
            Box::new(self.drain_duration.clone()),
            Box::new(self.approval_margin.clone()),
            Box::new(self.leader.clone()),
            Box::new(self.agent_confinement.clone()),
            Box::new(self.metrics_auth.clone()),
            Box::new(self.reports_ignored.clone()),
            Box::new(self.reports_over_cap.clone()),
            Box::new(self.cache_misses.clone()),
            Box::new(CacheCollector::new(self.caches.clone())?),
        ])
    }

    /// The names of every metric the controller exports, with each
    /// histogram's `_bucket`, `_sum` and `_count` series.
    pub fn names() -> Vec<String> {
        Self::new()
            .and_then(|m| m.collectors())
            .map(|c| series_names(&c))
            .unwrap_or_default()
    }

    /// From now on, every scrape computes the cache gauges from these caches
    /// (called by the leader once it leads).
    pub fn watch_caches(&self, nodes: Store<Node>, events: Store<ScheduledEvent>) {
        let mut c = self
            .caches
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *c = Some((nodes, events));
    }

    /// Sets the gauges of the reports ignored: `over_cap`, per node over
    /// its cap, how many of its live reports are ignored; `misnamed`, the
    /// reports whose `scheduledEvent` is not their `EventId`'s object name;
    /// a series per node for the [`OVER_CAP_NODES_LISTED`] nodes with the
    /// most ignored (then by name); every node counts in the totals.
    pub fn set_reports_ignored(&self, over_cap: &BTreeMap<String, usize>, misnamed: usize) {
        let over: usize = over_cap.values().sum();
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.reports_ignored
            .with_label_values(&["over_cap"])
            .set(gauge(over));
        self.reports_ignored
            .with_label_values(&["misnamed"])
            .set(gauge(misnamed));
        let mut nodes: Vec<(&String, &usize)> = over_cap.iter().collect();
        nodes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        self.reports_over_cap.reset();
        for (node, n) in nodes.into_iter().take(OVER_CAP_NODES_LISTED) {
            self.reports_over_cap
                .with_label_values(&[node.as_str()])
                .set(gauge(*n));
        }
    }

    /// Forgets the observed keys of objects whose UID is not in `live`.
    pub fn forget_observed_except(&self, live: &HashSet<String>) {
        self.counted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|(uid, _)| live.contains(uid));
    }

    /// How many objects' appearances are remembered as counted.
    #[cfg(test)]
    pub fn observed_remembered(&self) -> usize {
        self.counted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Records an event seen for the first time (`first_seen` just set):
    /// counts it and observes its notice.
    pub fn event_observed(&self, ev: &ScheduledEvent, first_seen: DateTime<Utc>) {
        let key = (
            ev.metadata.uid.clone().unwrap_or_default(),
            ev.spec.appearance,
        );
        let first = self
            .counted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key);
        if !first {
            return;
        }
        let ty = type_label(&ev.spec.event_type);
        self.events_observed
            .with_label_values(&[ty, source_label(&ev.spec.event_source)])
            .inc();
        if let Some(nb) = ev.spec.not_before {
            self.notice
                .with_label_values(&[ty])
                .observe(seconds_between(first_seen, nb));
        }
    }

    /// Observes a cordon written at `now` for `ev`, when it is the event's
    /// first appearance (the object was created for it; a returning
    /// `EventId` keeps its old `creationTimestamp`).
    pub fn cordoned(&self, ev: &ScheduledEvent, now: DateTime<Utc>) {
        if ev.spec.appearance > 1 {
            return;
        }
        if let Some(created) = ev
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| DateTime::from_timestamp_millis(t.0.as_millisecond()))
        {
            self.detection_to_cordon
                .with_label_values(&[type_label(&ev.spec.event_type)])
                .observe(seconds_between(created, now).max(0.0));
        }
    }

    /// Observes a node drained at `drained_at` of an event first seen at `first_seen`.
    pub fn drained(
        &self,
        ev: &ScheduledEvent,
        first_seen: DateTime<Utc>,
        drained_at: DateTime<Utc>,
    ) {
        self.drain_duration
            .with_label_values(&[type_label(&ev.spec.event_type)])
            .observe(seconds_between(first_seen, drained_at).max(0.0));
    }

    /// Observes an approval decided at `now`.
    pub fn approval_decided(&self, ev: &ScheduledEvent, now: DateTime<Utc>) {
        let ty = type_label(&ev.spec.event_type);
        self.approvals_decided.with_label_values(&[ty]).inc();
        if let Some(nb) = ev.spec.not_before {
            self.approval_margin
                .with_label_values(&[ty])
                .observe(seconds_between(now, nb));
        }
    }
}

/// How many nodes `forewarn_controller_reports_over_cap` names: a bound on
/// its series whatever names the reports carry.
pub const OVER_CAP_NODES_LISTED: usize = 20;

/// `to - from` in seconds, with milliseconds.
fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_milliseconds() as f64 / 1000.0
}

/// The leader's caches, once it leads.
#[derive(Clone, Default)]
struct Caches(Arc<RwLock<Option<NodesAndEvents>>>);

/// The leader's node cache and its cache of `ScheduledEvent`s.
type NodesAndEvents = (Store<Node>, Store<ScheduledEvent>);

/// The gauges computed at scrape time from the caches.
struct CacheCollector {
    caches: Caches,
    active: IntGaugeVec,
    cordoned: IntGaugeVec,
    blocked: GaugeVec,
    unapproved: IntGaugeVec,
    unconfirmed: IntGaugeVec,
    withheld: IntGaugeVec,
    awaiting_ack: IntGaugeVec,
    event_info: IntGaugeVec,
    held_node_info: IntGaugeVec,
    blocker_info: IntGaugeVec,
    info_omitted: IntGaugeVec,
    /// One scrape at a time resets and refills the gauges.
    lock: Mutex<()>,
}

impl CacheCollector {
    fn new(caches: Caches) -> prometheus::Result<Self> {
        Ok(CacheCollector {
            caches,
            active: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_active_events",
                    "ScheduledEvents not Completed or Cancelled, by event type and phase",
                ),
                &["type", "phase"],
            )?,
            cordoned: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_cordoned_nodes",
                    "Nodes cordoned by forewarn (forewarn.dev/cordoned-for), by whether an event that is not over still holds them (event_state active) or none does (ended)",
                ),
                &["event_state"],
            )?,
            blocked: GaugeVec::new(
                Opts::new(
                    "forewarn_controller_drain_blocked_time_to_not_before_seconds",
                    "Of the Scheduled events whose drain a PodDisruptionBudget blocks, the least time left before NotBefore, seconds (negative once passed), by event type",
                ),
                &["type"],
            )?,
            unapproved: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_events_unapproved_past_not_before",
                    "Events not over whose policy approves them, that reached NotBefore (or started after notice) without an approval accepted by IMDS, by event type",
                ),
                &["type"],
            )?,
            unconfirmed: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_events_unconfirmed",
                    "Events not over that name nodes left alone for want of a trusted report (condition NodesUnconfirmed), by event type",
                ),
                &["type"],
            )?,
            withheld: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_events_approval_withheld",
                    "Scheduled events not over whose approval is withheld although their policy approves them (condition ApprovalWithheld), by event type",
                ),
                &["type"],
            )?,
            awaiting_ack: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_pods_awaiting_acknowledgement",
                    "Pods the approval of an event not over waits for (condition AcknowledgementPending), by event type",
                ),
                &["type"],
            )?,
            event_info: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_event_info",
                    "1 per ScheduledEvent not Completed or Cancelled (at most 200, by name), with its object name, EventId, type, source and phase",
                ),
                &["event", "event_id", "type", "source", "phase"],
            )?,
            held_node_info: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_held_node_info",
                    "1 per node forewarn holds cordoned for a ScheduledEvent not over (at most 1000, by node), with the event's name and type and whether the node is drained (true, false, unknown when its record is not listed)",
                ),
                &["node", "event", "type", "drained"],
            )?,
            blocker_info: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_drain_blocker_info",
                    "1 per PodDisruptionBudget refusing an eviction on a node not yet drained of a Scheduled event (at most 200), with the event, the node, the budget (namespace/name) and a pod it refused (blocked_pod: a scrape target's own pod label would rename a label called pod)",
                ),
                &["event", "node", "pdb", "blocked_pod"],
            )?,
            info_omitted: IntGaugeVec::new(
                Opts::new(
                    "forewarn_controller_info_series_omitted",
                    "Series of a per-object info metric left out by its limit, by metric",
                ),
                &["metric"],
            )?,
            lock: Mutex::new(()),
        })
    }
}

impl Collector for CacheCollector {
    fn desc(&self) -> Vec<&Desc> {
        [
            self.active.desc(),
            self.cordoned.desc(),
            self.blocked.desc(),
            self.unapproved.desc(),
            self.unconfirmed.desc(),
            self.withheld.desc(),
            self.awaiting_ack.desc(),
            self.event_info.desc(),
            self.held_node_info.desc(),
            self.blocker_info.desc(),
            self.info_omitted.desc(),
        ]
        .concat()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (nodes, events) = {
            let c = self
                .caches
                .0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match c.as_ref() {
                Some((n, e)) => (n.state(), e.state()),
                None => return Vec::new(),
            }
        };
        let g = CacheGauges::compute(&nodes, &events, Utc::now());
        let _one = self
            .lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.active.reset();
        self.cordoned.reset();
        self.blocked.reset();
        self.unapproved.reset();
        self.unconfirmed.reset();
        self.withheld.reset();
        self.awaiting_ack.reset();
        self.event_info.reset();
        self.held_node_info.reset();
        self.blocker_info.reset();
        self.info_omitted.reset();
        for ((ty, phase), n) in &g.active {
            self.active.with_label_values(&[*ty, *phase]).set(*n);
        }
        self.cordoned
            .with_label_values(&["active"])
            .set(g.cordoned_active);
        self.cordoned
            .with_label_values(&["ended"])
            .set(g.cordoned_ended);
        for (ty, s) in &g.blocked {
            self.blocked.with_label_values(&[*ty]).set(*s);
        }
        for (ty, n) in &g.unapproved {
            self.unapproved.with_label_values(&[*ty]).set(*n);
        }
        for (ty, n) in &g.unconfirmed {
            self.unconfirmed.with_label_values(&[*ty]).set(*n);
        }
        for (ty, n) in &g.withheld {
            self.withheld.with_label_values(&[*ty]).set(*n);
        }
        for (ty, n) in &g.awaiting_ack {
            self.awaiting_ack.with_label_values(&[*ty]).set(*n);
        }
        for labels in &g.event_info {
            self.event_info.with_label_values(labels).set(1);
        }
        for labels in &g.held_nodes {
            self.held_node_info.with_label_values(labels).set(1);
        }
        for labels in &g.blockers {
            self.blocker_info.with_label_values(labels).set(1);
        }
        for (metric, n) in &g.info_omitted {
            self.info_omitted.with_label_values(&[*metric]).set(*n);
        }
        [
            self.active.collect(),
            self.cordoned.collect(),
            self.blocked.collect(),
            self.unapproved.collect(),
            self.unconfirmed.collect(),
            self.withheld.collect(),
            self.awaiting_ack.collect(),
            self.event_info.collect(),
            self.held_node_info.collect(),
            self.blocker_info.collect(),
            self.info_omitted.collect(),
        ]
        .concat()
    }
}

/// The cache gauges' values at one instant.
#[derive(Debug, Default, PartialEq)]
pub struct CacheGauges {
    /// Events not over, by (type, phase); every type and live phase present, 0 when none.
    pub active: BTreeMap<(&'static str, &'static str), i64>,
    /// Nodes forewarn cordoned that an event not over holds.
    pub cordoned_active: i64,
    /// Nodes forewarn cordoned whose holding events are all over or deleted.
    pub cordoned_ended: i64,
    /// Per type with a blocked drain: the least seconds left before `NotBefore`.
    pub blocked: BTreeMap<&'static str, f64>,
    /// Events past `NotBefore` without an accepted approval, per type (every type, 0 when none).
    pub unapproved: BTreeMap<&'static str, i64>,
    /// Events not over with `NodesUnconfirmed` true, per type (every type, 0 when none).
    pub unconfirmed: BTreeMap<&'static str, i64>,
    /// `Scheduled` events not over with `ApprovalWithheld` true, per type
    /// (every type, 0 when none).
    pub withheld: BTreeMap<&'static str, i64>,
    /// Pods that live events wait for (`AcknowledgementPending` true), per
    /// type (every type, 0 when none).
    pub awaiting_ack: BTreeMap<&'static str, i64>,
    /// Events not over, `[event, event_id, type, source, phase]`, sorted,
    /// at most [`EVENT_INFO_LIMIT`].
    pub event_info: Vec<[String; 5]>,
    /// Nodes forewarn holds for an event not over, `[node, event, type,
    /// drained]`, sorted, at most [`HELD_NODE_INFO_LIMIT`].
    pub held_nodes: Vec<[String; 4]>,
    /// Budgets refusing evictions on nodes not yet drained of `Scheduled`
    /// events not over, `[event, node, pdb, pod]`, sorted, at most
    /// [`BLOCKER_INFO_LIMIT`].
    pub blockers: Vec<[String; 4]>,
    /// Series left out by those limits, by metric name (absent when none).
    pub info_omitted: BTreeMap<&'static str, i64>,
}

/// Most series of `forewarn_controller_event_info`: the per-object series
/// stay bounded however many events there are (a dashboard table of 200
/// events is already more than a person reads).
pub const EVENT_INFO_LIMIT: usize = 200;
/// Most series of `forewarn_controller_held_node_info`.
pub const HELD_NODE_INFO_LIMIT: usize = 1000;
/// Most series of `forewarn_controller_drain_blocker_info`.
pub const BLOCKER_INFO_LIMIT: usize = 200;

/// Sorts `rows`, keeps the first `limit` and records how many were left
/// out under `metric`.
fn bounded<const N: usize>(
    mut rows: Vec<[String; N]>,
    limit: usize,
    metric: &'static str,
    omitted: &mut BTreeMap<&'static str, i64>,
) -> Vec<[String; N]> {
    rows.sort();
    if rows.len() > limit {
        omitted.insert(
            metric,
            i64::try_from(rows.len() - limit).unwrap_or(i64::MAX),
        );
        rows.truncate(limit);
    }
    rows
}

/// Phases of events that are not over ([`crate::api::Phase::is_final`]).
const LIVE_PHASES: [&str; 6] = [
    "Pending", "Draining", "Drained", "Approved", "Started", "Ignored",
];

impl CacheGauges {
    /// Computes the gauges from the cached Nodes and `ScheduledEvent`s at `now`.
    ///
    /// An event is live while its `status.phase` is not `Completed` or
    /// `Cancelled` (no status yet counts as `Pending`). Its drain is blocked
    /// while its `DrainBlocked` condition is `True`. It is unapproved past
    /// `NotBefore` when its `status.action` approves (`Approve`,
    /// `DrainAndApprove`), no approval was accepted (`approval.result` is not
    /// `Accepted`), and either it is still `Scheduled` with `NotBefore` at
    /// or before `now`, or it started after the controller first saw it
    /// (an event that arrives `Started`, without notice, never counts).
    pub fn compute(
        nodes: &[Arc<Node>],
        events: &[Arc<ScheduledEvent>],
        now: DateTime<Utc>,
    ) -> Self {
        let mut g = CacheGauges::zeroed();
        let mut live: HashMap<String, &ScheduledEvent> = HashMap::new();
        let (mut event_info, mut blockers) = (Vec::new(), Vec::new());
        let none = ScheduledEventStatus::default();
        for ev in events {
            let status = ev.status.as_ref().unwrap_or(&none);
            let phase = phase_label(status.phase.map_or("Pending", |p| p.as_str()));
            if matches!(phase, "Completed" | "Cancelled") {
                continue;
            }
            live.insert(ev.name_any(), ev);
            let ty = type_label(&ev.spec.event_type);
            event_info.push([
                ev.name_any(),
                ev.spec.event_id.clone(),
                ty.to_string(),
                source_label(&ev.spec.event_source).to_string(),
                phase.to_string(),
            ]);
            *g.active.entry((ty, phase)).or_default() += 1;
            g.count_conditions(ev, status, ty, now);
            if ev.spec.event_status == "Scheduled" {
                blockers.extend(drain_blockers(ev, status));
            }
            if unapproved_past_not_before(ev, status, now) {
                *g.unapproved.entry(ty).or_default() += 1;
            }
        }
        let held_nodes = g.count_held_nodes(nodes, &live);
        let mut omitted = BTreeMap::new();
        g.event_info = bounded(
            event_info,
            EVENT_INFO_LIMIT,
            "forewarn_controller_event_info",
            &mut omitted,
        );
        g.held_nodes = bounded(
            held_nodes,
            HELD_NODE_INFO_LIMIT,
            "forewarn_controller_held_node_info",
            &mut omitted,
        );
        g.blockers = bounded(
            blockers,
            BLOCKER_INFO_LIMIT,
            "forewarn_controller_drain_blocker_info",
            &mut omitted,
        );
        g.info_omitted = omitted;
        g
    }

    /// Every series of every type (and live phase) at 0, so that a type
    /// without events reads 0 rather than no series.
    fn zeroed() -> Self {
        let mut g = CacheGauges::default();
        for ty in TYPES {
            g.unapproved.insert(ty, 0);
            g.unconfirmed.insert(ty, 0);
            g.withheld.insert(ty, 0);
            g.awaiting_ack.insert(ty, 0);
            for phase in LIVE_PHASES {
                g.active.insert((ty, phase), 0);
            }
        }
        g
    }

    /// Counts a live event of type `ty` by its conditions: nodes
    /// unconfirmed, approval withheld (while `Scheduled`), the pods awaited
    /// for an acknowledgement, and, while `Scheduled` and `DrainBlocked`,
    /// the seconds left until its `NotBefore` (the least per type).
    fn count_conditions(
        &mut self,
        ev: &ScheduledEvent,
        status: &ScheduledEventStatus,
        ty: &'static str,
        now: DateTime<Utc>,
    ) {
        let scheduled = ev.spec.event_status == "Scheduled";
        let holds = |type_: &str| {
            status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == type_ && c.status == "True")
        };
        if holds("NodesUnconfirmed") {
            *self.unconfirmed.entry(ty).or_default() += 1;
        }
        if scheduled && holds("ApprovalWithheld") {
            *self.withheld.entry(ty).or_default() += 1;
        }
        if holds("AcknowledgementPending") {
            let pods = status
                .acknowledgements
                .as_ref()
                .map_or(0, |a| i64::from(a.pending_count));
            *self.awaiting_ack.entry(ty).or_default() += pods;
        }
        if let (true, true, Some(nb)) = (scheduled, holds("DrainBlocked"), ev.spec.not_before) {
            let left = seconds_between(now, nb);
            self.blocked
                .entry(ty)
                .and_modify(|s| *s = s.min(left))
                .or_insert(left);
        }
    }

    /// Counts the nodes forewarn holds, for a live event (`cordoned_active`)
    /// or only for ended or deleted ones (`cordoned_ended`); returns the
    /// series of `forewarn_controller_held_node_info` (node, event, type,
    /// drained: `true`, `false` or `unknown` when its record is not listed).
    fn count_held_nodes(
        &mut self,
        nodes: &[Arc<Node>],
        live: &HashMap<String, &ScheduledEvent>,
    ) -> Vec<[String; 4]> {
        let mut held_nodes = Vec::new();
        for n in nodes {
            let holds = crate::api::holds(n);
            if holds.is_empty() {
                continue;
            }
            let node = n.name_any();
            let mut held = false;
            for h in &holds {
                let Some(ev) = live.get(h) else { continue };
                held = true;
                let drained = ev
                    .status
                    .as_ref()
                    .and_then(|s| s.nodes.as_ref())
                    .and_then(|r| r.iter().find(|r| r.name == node))
                    .map_or("unknown", |r| {
                        if r.drained_at.is_some() {
                            "true"
                        } else {
                            "false"
                        }
                    });
                held_nodes.push([
                    node.clone(),
                    h.clone(),
                    type_label(&ev.spec.event_type).to_string(),
                    drained.to_string(),
                ]);
            }
            if held {
                self.cordoned_active += 1;
            } else {
                self.cordoned_ended += 1;
            }
        }
        held_nodes
    }
}

/// The series of `forewarn_controller_drain_blocker_info` of one event:
/// (event, node, PodDisruptionBudget, a pod of its namespace it blocks) for
/// each budget blocking a node not yet drained or deleted.
fn drain_blockers(ev: &ScheduledEvent, status: &ScheduledEventStatus) -> Vec<[String; 4]> {
    let mut blockers = Vec::new();
    for n in status.nodes.iter().flatten() {
        if n.drained_at.is_some() || n.deleted_at.is_some() {
            continue;
        }
        for pdb in &n.blocking_budgets {
            let ns = pdb.split_once('/').map_or("", |(ns, _)| ns);
            let pod = n
                .blocked_pods
                .iter()
                .find(|p| p.split_once('/').is_some_and(|(pns, _)| pns == ns))
                .cloned()
                .unwrap_or_default();
            blockers.push([ev.name_any(), n.name.clone(), pdb.clone(), pod]);
        }
    }
    blockers
}

/// Whether an event whose action approves has no accepted approval past
/// its `NotBefore` (still `Scheduled`), or started after the controller
/// first saw it (one that arrives `Started`, without notice, never counts).
fn unapproved_past_not_before(
    ev: &ScheduledEvent,
    status: &ScheduledEventStatus,
    now: DateTime<Utc>,
) -> bool {
    let approves = matches!(
        status.action,
        Some(crate::policy::Action::Approve | crate::policy::Action::DrainAndApprove)
    );
    let accepted = status.approval.as_ref().and_then(|a| a.result.as_deref()) == Some("Accepted");
    let past = if ev.spec.event_status == "Scheduled" {
        ev.spec.not_before.is_some_and(|nb| nb <= now)
    } else {
        ev.spec.event_status == "Started"
            && matches!((status.first_seen, status.started_at), (Some(f), Some(s)) if s > f)
    };
    approves && !accepted && past
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Approval, Condition};
    use crate::fixtures;
    use chrono::Duration;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap as Map;

    fn event(
        name: &str,
        ty: &str,
        status: &str,
        not_before: Option<DateTime<Utc>>,
        st: ScheduledEventStatus,
    ) -> Arc<ScheduledEvent> {
        let mut ev = ScheduledEvent::new(
            name,
            fixtures::spec(name)
                .event_type(ty)
                .status(
                    serde_json::from_value(serde_json::json!(status)).expect("a known eventStatus"),
                )
                .not_before(not_before)
                .build(),
        );
        ev.status = Some(st);
        Arc::new(ev)
    }

    fn node(name: &str, holds: Option<&str>) -> Arc<Node> {
        let mut annotations = Map::new();
        if let Some(h) = holds {
            annotations.insert(
                crate::api::CORDONED_FOR_ANNOTATION.to_string(),
                h.to_string(),
            );
        }
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: Some(annotations),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn blocked_condition(now: DateTime<Utc>) -> Condition {
        condition("DrainBlocked", "True", now)
    }

    fn condition(type_: &str, status: &str, now: DateTime<Utc>) -> Condition {
        Condition {
            observed_generation: None,
            type_: type_.into(),
            status: status.into(),
            reason: "EvictionRefused".into(),
            message: String::new(),
            last_transition_time: now,
        }
    }

    #[test]
    fn observed_events_are_counted_once_and_forgotten_once_deleted() {
        let m = ControllerMetrics::new().expect("metrics");
        let with_uid = |name: &str, uid: &str| {
            let mut ev = (*event(
                name,
                "Reboot",
                "Scheduled",
                None,
                ScheduledEventStatus::default(),
            ))
            .clone();
            ev.metadata.uid = Some(uid.into());
            ev
        };
        let (a, b) = (with_uid("a", "uid-a"), with_uid("b", "uid-b"));
        let now = Utc::now();
        m.event_observed(&a, now);
        m.event_observed(&a, now);
        m.event_observed(&b, now);
        let counted = m
            .events_observed
            .with_label_values(&["Reboot", "Platform"])
            .get();
        assert_eq!(counted, 2);
        assert_eq!(m.observed_remembered(), 2);
        // `b` was deleted: only `a` is remembered.
        m.forget_observed_except(&HashSet::from(["uid-a".to_string()]));
        assert_eq!(m.observed_remembered(), 1);
        m.event_observed(&a, now);
        assert_eq!(
            m.events_observed
                .with_label_values(&["Reboot", "Platform"])
                .get(),
            2
        );
    }

    #[test]
    fn cache_gauges_count_blocked_unapproved_and_orphaned_cordons() {
        let now = Utc::now();
        let live = |phase: &str, action: &str| ScheduledEventStatus {
            phase: Some(serde_json::from_value(serde_json::json!(phase)).expect("a phase")),
            action: Some(serde_json::from_value(serde_json::json!(action)).expect("an action")),
            first_seen: Some(now - Duration::seconds(60)),
            ..Default::default()
        };
        let mut blocked = live("Draining", "DrainAndApprove");
        blocked.conditions = Some(vec![blocked_condition(now)]);
        let mut accepted = live("Approved", "DrainAndApprove");
        accepted.approval = Some(Approval {
            result: Some("Accepted".into()),
            ..Default::default()
        });
        let mut started_after_notice = live("Started", "DrainAndApprove");
        started_after_notice.started_at = Some(now - Duration::seconds(5));
        let mut started_without_notice = live("Started", "DrainAndApprove");
        started_without_notice.started_at = started_without_notice.first_seen;
        let events = vec![
            // Blocked, 40 s and 10 s before NotBefore: the least counts.
            event(
                "a",
                "Redeploy",
                "Scheduled",
                Some(now + Duration::seconds(40)),
                blocked.clone(),
            ),
            event(
                "b",
                "Redeploy",
                "Scheduled",
                Some(now + Duration::seconds(10)),
                blocked.clone(),
            ),
            // Blocked and past NotBefore, still Scheduled: both gauges.
            event(
                "c",
                "Reboot",
                "Scheduled",
                Some(now - Duration::seconds(3)),
                blocked,
            ),
            // Past NotBefore but approved and accepted: neither.
            event(
                "d",
                "Reboot",
                "Scheduled",
                Some(now - Duration::seconds(3)),
                accepted,
            ),
            // Past NotBefore, policy does not approve: not unapproved.
            event(
                "e",
                "Freeze",
                "Scheduled",
                Some(now - Duration::seconds(3)),
                live("Draining", "Drain"),
            ),
            event("f", "Terminate", "Started", None, started_after_notice),
            event("g", "Preempt", "Started", None, started_without_notice),
            event(
                "h",
                "Freeze",
                "Completed",
                None,
                live("Completed", "DrainAndApprove"),
            ),
        ];
        let nodes = vec![
            node("n0", None),
            node("n1", Some("a")),
            node("n2", Some("h")),
            node("n3", Some("gone,h")),
            node("n4", Some("h,f")),
        ];
        let g = CacheGauges::compute(&nodes, &events, now);
        assert_eq!(g.blocked.len(), 2, "{:?}", g.blocked);
        assert!((g.blocked["Redeploy"] - 10.0).abs() < 0.01);
        assert!((g.blocked["Reboot"] + 3.0).abs() < 0.01);
        let unapproved: Vec<(&str, i64)> = g
            .unapproved
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(t, n)| (*t, *n))
            .collect();
        assert_eq!(unapproved, [("Reboot", 1), ("Terminate", 1)]);
        assert_eq!((g.cordoned_active, g.cordoned_ended), (2, 2));
        assert_eq!(g.active[&("Redeploy", "Draining")], 2);
        assert_eq!(g.active[&("Freeze", "Draining")], 1);
        assert_eq!(g.active.values().sum::<i64>(), 7, "h is over");
    }

    #[test]
    fn cache_gauges_are_silent_until_the_caches_are_watched() {
        let r = Registry::new();
        let m = ControllerMetrics::register(&r).expect("register");
        m.leader.set(1);
        let names: Vec<String> = r.gather().iter().map(|f| f.name().to_string()).collect();
        assert_eq!(
            names,
            [
                "forewarn_agent_confinement_installed",
                "forewarn_controller_foreign_decisions_total",
                "forewarn_controller_leader",
                "forewarn_controller_policy_file_refused",
                "forewarn_controller_unexpected_restarts_total",
                "forewarn_controller_webhooks_file_refused"
            ]
        );
    }

    #[test]
    fn reports_over_cap_name_at_most_twenty_nodes_and_count_them_all() {
        let r = Registry::new();
        let m = ControllerMetrics::register(&r).expect("register");
        let over_cap: BTreeMap<String, usize> =
            (0..25).map(|i| (format!("node-{i:02}"), i + 1)).collect();
        m.set_reports_ignored(&over_cap, 3);
        let total = |reason: &str| m.reports_ignored.with_label_values(&[reason]).get();
        assert_eq!(total("over_cap"), (1..=25).sum::<i64>());
        assert_eq!(total("misnamed"), 3);
        let family = r
            .gather()
            .into_iter()
            .find(|f| f.name() == "forewarn_controller_reports_over_cap")
            .expect("the per-node gauge");
        assert_eq!(family.get_metric().len(), OVER_CAP_NODES_LISTED);
        // Those with the most: node-24 (25) down to node-05 (6).
        let most = m.reports_over_cap.with_label_values(&["node-24"]).get();
        assert_eq!(most, 25);
        // Back under the cap: no node series left, totals 0.
        m.set_reports_ignored(&BTreeMap::new(), 0);
        assert_eq!(total("over_cap"), 0);
        assert!(
            r.gather()
                .iter()
                .all(|f| f.name() != "forewarn_controller_reports_over_cap")
        );
    }

    #[test]
    fn info_series_name_live_events_held_nodes_and_blockers_within_their_limits() {
        use crate::api::NodeProgress;
        let now = Utc::now();
        let nb = Some(now + Duration::seconds(600));
        let record = |name: &str, drained: bool, budgets: &[&str], pods: &[&str]| NodeProgress {
            name: name.into(),
            blocking_budgets: budgets.iter().map(|b| b.to_string()).collect(),
            blocked_pods: pods.iter().map(|p| p.to_string()).collect(),
            drained_at: drained.then_some(now),
            ..Default::default()
        };
        let status = |phase: &str, nodes: Vec<NodeProgress>| ScheduledEventStatus {
            phase: Some(serde_json::from_value(serde_json::json!(phase)).expect("a phase")),
            nodes: Some(nodes),
            ..Default::default()
        };
        let events = vec![
            event(
                "a",
                "Reboot",
                "Scheduled",
                nb,
                status(
                    "Draining",
                    vec![
                        record(
                            "n1",
                            false,
                            &["shop/web", "db/pg"],
                            &["shop/web-0", "db/pg-1"],
                        ),
                        // Drained: what blocked it no longer does.
                        record("n2", true, &["shop/web"], &["shop/web-1"]),
                    ],
                ),
            ),
            event(
                "b",
                "Freeze",
                "Completed",
                nb,
                status(
                    "Completed",
                    vec![record("n3", false, &["shop/web"], &["shop/web-2"])],
                ),
            ),
        ];
        let nodes = vec![
            node("n1", Some("a")),
            node("n2", Some("a,b")),
            node("n3", Some("b")),
            node("n4", Some("a")),
        ];
        let g = CacheGauges::compute(&nodes, &events, now);
        let rows = |r: &[[String; 4]]| r.iter().map(|r| r.join(" ")).collect::<Vec<_>>();
        assert_eq!(
            g.event_info,
            [["a", "a", "Reboot", "Platform", "Draining"].map(String::from)],
            "b is over"
        );
        assert_eq!(
            rows(&g.held_nodes),
            [
                "n1 a Reboot false",
                "n2 a Reboot true",
                "n4 a Reboot unknown"
            ],
            "n3 is held by an event that is over"
        );
        assert_eq!(
            rows(&g.blockers),
            ["a n1 db/pg db/pg-1", "a n1 shop/web shop/web-0"]
        );
        assert!(g.info_omitted.is_empty());
        // 250 live events: 200 series, 50 counted as left out.
        let many: Vec<Arc<ScheduledEvent>> = (0..250)
            .map(|i| {
                event(
                    &format!("ev-{i:03}"),
                    "Freeze",
                    "Scheduled",
                    nb,
                    ScheduledEventStatus::default(),
                )
            })
            .collect();
        let g = CacheGauges::compute(&[], &many, now);
        assert_eq!(g.event_info.len(), EVENT_INFO_LIMIT);
        assert_eq!(g.event_info[0][0], "ev-000");
        assert_eq!(g.info_omitted["forewarn_controller_event_info"], 50);
    }

    #[test]
    fn cache_gauges_count_unconfirmed_and_withheld_events_not_over() {
        let now = Utc::now();
        let with = |phase: &str, conditions: Vec<Condition>| ScheduledEventStatus {
            phase: Some(serde_json::from_value(serde_json::json!(phase)).expect("a phase")),
            conditions: Some(conditions),
            ..Default::default()
        };
        let nb = Some(now + Duration::seconds(600));
        let events = vec![
            event(
                "a",
                "Reboot",
                "Scheduled",
                nb,
                with("Drained", vec![condition("ApprovalWithheld", "True", now)]),
            ),
            // Withheld once, no longer.
            event(
                "b",
                "Reboot",
                "Scheduled",
                nb,
                with("Drained", vec![condition("ApprovalWithheld", "False", now)]),
            ),
            // Started: the approval no longer matters.
            event(
                "c",
                "Reboot",
                "Started",
                nb,
                with("Started", vec![condition("ApprovalWithheld", "True", now)]),
            ),
            event(
                "d",
                "Freeze",
                "Scheduled",
                nb,
                with("Pending", vec![condition("NodesUnconfirmed", "True", now)]),
            ),
            event(
                "e",
                "Freeze",
                "Scheduled",
                nb,
                with(
                    "Draining",
                    vec![condition("NodesUnconfirmed", "False", now)],
                ),
            ),
            // Over: neither.
            event(
                "f",
                "Freeze",
                "Completed",
                nb,
                with(
                    "Completed",
                    vec![
                        condition("NodesUnconfirmed", "True", now),
                        condition("ApprovalWithheld", "True", now),
                    ],
                ),
            ),
        ];
        let g = CacheGauges::compute(&[], &events, now);
        let nonzero = |m: &BTreeMap<&'static str, i64>| -> Vec<(&'static str, i64)> {
            m.iter()
                .filter(|(_, n)| **n > 0)
                .map(|(t, n)| (*t, *n))
                .collect()
        };
        assert_eq!(nonzero(&g.withheld), [("Reboot", 1)]);
        assert_eq!(nonzero(&g.unconfirmed), [("Freeze", 1)]);
        assert_eq!(g.withheld.len(), TYPES.len(), "every type, 0 when none");
    }
}
