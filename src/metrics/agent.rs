//! The agent's metrics (see [`crate::metrics`] for the naming rules).

use prometheus::core::Collector;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::metrics::series_names;

/// Buckets of IMDS request durations, seconds (a request times out after 2 s
/// by default, the first one after up to two minutes).
const IMDS_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Metrics of the agent.
#[derive(Clone)]
pub struct AgentMetrics {
    /// IMDS scheduled events requests by `result`: `ok` (a document that
    /// needed work), `unchanged`, `throttled` (429), `gone` (410),
    /// `server_error` (5xx), `client_error` (another non-success status),
    /// `unreachable` (no answer: refused, reset, timed out), `parse_error`
    /// (a body that is not a document, or larger than the limit: the
    /// document is rejected whole).
    pub polls: IntCounterVec,
    /// Duration of IMDS scheduled events requests, seconds, whatever the result.
    pub imds_duration: Histogram,
    /// Unix time, seconds, of the last IMDS scheduled events request that
    /// returned a document.
    pub imds_last_success: IntGauge,
    /// Writes of the agent's own `ScheduledEventReport`s by `result`: `ok`, `error`.
    pub mirror_writes: IntCounterVec,
    /// Approval (`StartRequests`) POSTs by `result`: `ok`, `error`.
    pub approvals: IntCounterVec,
    /// Approval decisions refused because the controller did not write
    /// them (see `forewarn::agent::approval::author`), once per object version.
    pub foreign_decisions: IntCounter,
    /// Events in the last good IMDS document.
    pub events: IntGauge,
    /// Entries of `Events` rejected as malformed, counted once per document change.
    pub events_rejected: IntCounter,
    /// Times the agent paused its polls because IMDS answered 429, 410 or
    /// 5xx or did not answer.
    pub backoffs: IntCounter,
    /// Requests to `/metrics` under `--metrics-auth kubernetes`, by
    /// `result` and `cached` ([`crate::metrics_auth::outcome_counter`]).
    pub metrics_auth: IntCounterVec,
}

impl AgentMetrics {
    /// Creates and registers the agent's collectors.
    ///
    /// # Errors
    /// When a collector with the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self::new()?;
        for c in m.collectors() {
            registry.register(c)?;
        }
        Ok(m)
    }

    fn new() -> prometheus::Result<Self> {
        Ok(AgentMetrics {
            polls: IntCounterVec::new(
                Opts::new(
                    "forewarn_agent_imds_polls_total",
                    "IMDS scheduled events requests, by result",
                ),
                &["result"],
            )?,
            imds_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "forewarn_agent_imds_request_duration_seconds",
                    "Duration of IMDS scheduled events requests, seconds",
                )
                .buckets(IMDS_SECONDS.to_vec()),
            )?,
            imds_last_success: IntGauge::new(
                "forewarn_agent_imds_last_success_timestamp_seconds",
                "Unix time of the last IMDS scheduled events request that returned a document",
            )?,
            mirror_writes: IntCounterVec::new(
                Opts::new(
                    "forewarn_agent_mirror_writes_total",
                    "Writes of the agent's own ScheduledEventReports, by result",
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
            foreign_decisions: IntCounter::new(
                "forewarn_agent_foreign_decisions_total",
                "Approval decisions in a ScheduledEvent's status that the controller did not write, refused (once per object version)",
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
            metrics_auth: crate::metrics_auth::outcome_counter("agent")?,
        })
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.polls.clone()),
            Box::new(self.imds_duration.clone()),
            Box::new(self.imds_last_success.clone()),
            Box::new(self.mirror_writes.clone()),
            Box::new(self.approvals.clone()),
            Box::new(self.foreign_decisions.clone()),
            Box::new(self.events.clone()),
            Box::new(self.events_rejected.clone()),
            Box::new(self.backoffs.clone()),
            Box::new(self.metrics_auth.clone()),
        ]
    }

    /// The names of every metric the agent exports, with each histogram's
    /// `_bucket`, `_sum` and `_count` series, e.g. for checking dashboards
    /// and alert rules against them.
    pub fn names() -> Vec<String> {
        Self::new()
            .map(|m| series_names(&m.collectors()))
            .unwrap_or_default()
    }

    /// Counts one IMDS scheduled events request: its `result` label and its duration.
    pub fn imds_request(&self, result: &str, seconds: f64) {
        self.polls.with_label_values(&[result]).inc();
        self.imds_duration.observe(seconds);
    }
}
