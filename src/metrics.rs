//! Prometheus metrics. Each component registers its own collectors on the
//! one `Registry` built at start; names are `forewarn_<component>_<thing>_<unit>`
//! and labels come from small closed sets only (never a pod, node or event id).

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// Metrics of the agent.
#[derive(Clone)]
pub struct AgentMetrics {
    /// IMDS polls by `result`: `ok`, `unchanged`, `error`, `parse_error`.
    pub polls: IntCounterVec,
    /// Writes of `ScheduledEvent` objects by `result`: `ok`, `error`.
    pub mirror_writes: IntCounterVec,
    /// Approval POSTs by `result`: `ok`, `error`.
    pub approvals: IntCounterVec,
    /// Events in the last good IMDS document.
    pub events: IntGauge,
    /// Entries of `Events` rejected as malformed, counted once per document change.
    pub events_rejected: IntCounter,
    /// Times the agent paused its polls because IMDS answered 429, 410 or
    /// 5xx or did not answer.
    pub backoffs: IntCounter,
}

impl AgentMetrics {
    /// Creates and registers the agent's collectors.
    ///
    /// # Errors
    /// When a collector with the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = AgentMetrics {
            polls: IntCounterVec::new(
                Opts::new(
                    "forewarn_agent_imds_polls_total",
                    "IMDS scheduled events polls, by result",
                ),
                &["result"],
            )?,
            mirror_writes: IntCounterVec::new(
                Opts::new(
                    "forewarn_agent_mirror_writes_total",
                    "ScheduledEvent writes by the agent, by result",
                ),
                &["result"],
            )?,
            approvals: IntCounterVec::new(
                Opts::new(
                    "forewarn_agent_approvals_total",
                    "Approval (StartRequests) POSTs to IMDS, by result",
                ),
                &["result"],
            )?,
            events: IntGauge::new(
                "forewarn_agent_imds_events",
                "Events in the last good IMDS document",
            )?,
            events_rejected: IntCounter::new(
                "forewarn_agent_imds_events_rejected_total",
                "Malformed entries of Events in IMDS documents, counted once per document change",
            )?,
            backoffs: IntCounter::new(
                "forewarn_agent_imds_backoffs_total",
                "Pauses of the IMDS polls after a 429, 410, 5xx or no answer",
            )?,
        };
        registry.register(Box::new(m.polls.clone()))?;
        registry.register(Box::new(m.mirror_writes.clone()))?;
        registry.register(Box::new(m.approvals.clone()))?;
        registry.register(Box::new(m.events.clone()))?;
        registry.register(Box::new(m.events_rejected.clone()))?;
        registry.register(Box::new(m.backoffs.clone()))?;
        Ok(m)
    }
}

/// Metrics of the controller.
#[derive(Clone)]
pub struct ControllerMetrics {
    /// Reconciles by `result`: `ok`, `error`.
    pub reconciles: IntCounterVec,
    /// Evictions by `result`: `evicted`, `blocked`, `throttled`, `gone`, `error`.
    pub evictions: IntCounterVec,
    /// Cordon and uncordon writes by `action`: `cordon`, `uncordon`.
    pub node_writes: IntCounterVec,
    /// Approvals decided, by event `type`.
    pub approvals_decided: IntCounterVec,
    /// Events whose drain did not finish before its deadline, start or end.
    pub drains_incomplete: IntCounterVec,
    /// Changes of the policy file by `result`: `loaded`, `refused`.
    pub policy_reloads: IntCounterVec,
    /// 1 while this replica holds the leader-election Lease, else 0.
    pub leader: IntGauge,
}

impl ControllerMetrics {
    /// Creates and registers the controller's collectors.
    ///
    /// # Errors
    /// When a collector with the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = ControllerMetrics {
            reconciles: IntCounterVec::new(
                Opts::new(
                    "forewarn_controller_reconciles_total",
                    "ScheduledEvent reconciles, by result",
                ),
                &["result"],
            )?,
            evictions: IntCounterVec::new(
                Opts::new(
                    "forewarn_controller_evictions_total",
                    "Pod evictions through the Eviction API, by result",
                ),
                &["result"],
            )?,
            node_writes: IntCounterVec::new(
                Opts::new(
                    "forewarn_controller_node_writes_total",
                    "Cordon and uncordon writes, by action",
                ),
                &["action"],
            )?,
            approvals_decided: IntCounterVec::new(
                Opts::new(
                    "forewarn_controller_approvals_decided_total",
                    "Approvals decided, by event type",
                ),
                &["type"],
            )?,
            drains_incomplete: IntCounterVec::new(
                Opts::new(
                    "forewarn_controller_drains_incomplete_total",
                    "Events whose drain did not finish before the deadline, the start or the end, by event type",
                ),
                &["type"],
            )?,
            policy_reloads: IntCounterVec::new(
                Opts::new(
                    "forewarn_controller_policy_reloads_total",
                    "Changes of the policy file, by result: loaded, or refused (invalid; the policy in force stays)",
                ),
                &["result"],
            )?,
            leader: IntGauge::new(
                "forewarn_controller_leader",
                "1 while this replica holds the leader-election Lease",
            )?,
        };
        registry.register(Box::new(m.leader.clone()))?;
        for c in [
            &m.reconciles,
            &m.evictions,
            &m.node_writes,
            &m.approvals_decided,
            &m.drains_incomplete,
            &m.policy_reloads,
        ] {
            registry.register(Box::new(c.clone()))?;
        }
        Ok(m)
    }
}

/// Bounds the label value for an event type to the known set.
pub fn type_label(event_type: &str) -> &'static str {
    match event_type {
        "Freeze" => "Freeze",
        "Reboot" => "Reboot",
        "Redeploy" => "Redeploy",
        "Preempt" => "Preempt",
        "Terminate" => "Terminate",
        _ => "Other",
    }
}
