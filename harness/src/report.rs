//! What a run saw, and whether the rules held: the [`Report`] that
//! [`run_scenario`](crate::run::run_scenario) returns, and its summary.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use forewarn::imds::mock::LogEntry;

/// A notice annotation (`notice.forewarn.dev/<event>`) as the harness saw
/// it on a pod of the workload's namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct NoticeSeen {
    /// `namespace/name`.
    pub pod: String,
    /// Its UID.
    pub uid: String,
    /// The node it ran on.
    pub node: String,
    /// The `ScheduledEvent`'s name (the key's suffix).
    pub event: String,
    /// The value first seen, then the last one.
    pub first_value: String,
    /// The last value seen.
    pub last_value: String,
    /// When the watch first delivered it.
    pub first_seen: DateTime<Utc>,
    /// When a version of the pod without it was first delivered (the pod
    /// still there); `None` if it never was.
    pub removed_at: Option<DateTime<Utc>>,
    /// The field managers (`manager operation`) owning the key in the
    /// version it was first seen in.
    pub managers: Vec<String>,
}

/// An acknowledgement the harness wrote for a pod it plays.
#[derive(Debug, Clone, PartialEq)]
pub struct AckWritten {
    /// `namespace/name`.
    pub pod: String,
    /// The `ScheduledEvent`'s name.
    pub event: String,
    /// The `EventId` written.
    pub event_id: String,
    /// When the PATCH was sent: the acknowledgement cannot have been
    /// stored before. (Compare what must follow the acknowledgement with
    /// this: the answer may come late on a loaded machine, after the
    /// controller already acted on the stored acknowledgement.)
    pub sent: DateTime<Utc>,
    /// When the API server's answer to the PATCH was read: it was stored
    /// before.
    pub at: DateTime<Utc>,
}

/// What happened, and whether the rules held.
#[derive(Debug, Default)]
pub struct Report {
    /// Timeline lines, `[+  4.2s] who  what`.
    pub timeline: Vec<String>,
    /// Rules broken or expectations missed; empty when all is well.
    pub violations: Vec<String>,
    /// Whether every event reached its end and every node was released.
    pub finished: bool,
    /// Fewest ready workload pods seen at any sample.
    pub min_ready: i32,
    /// The PodDisruptionBudget's `minAvailable`.
    pub min_available: i32,
    /// Approvals IMDS received (from the mock's log).
    pub approvals: Vec<LogEntry>,
    /// Nodes seen cordoned at some point.
    pub cordoned: Vec<String>,
    /// `kubectl get scheduledevents -o wide` at the end.
    pub sev_table: String,
    /// Seconds from the scenario's start to the end.
    pub elapsed: f64,
    /// Where the processes' logs are.
    pub log_dir: PathBuf,
    /// Each process's `/metrics` text at the end, by process name.
    pub metrics: Vec<(String, String)>,
    /// When the scenario's clock started (its events' `at` count from here).
    pub started: DateTime<Utc>,
    /// Every pod deletion seen during the run, as the API server recorded it.
    pub deletions: Vec<PodDeletion>,
    /// Every change of a node's `spec.unschedulable`, as a watch delivered
    /// them: `(when seen, node, unschedulable)`.
    pub node_changes: Vec<(DateTime<Utc>, String, bool)>,
    /// Nodes deleted during the run
    /// ([`RunOptions::delete_node`](crate::options::RunOptions::delete_node)),
    /// and when.
    pub deleted_nodes: Vec<(DateTime<Utc>, String)>,
    /// The API server outage
    /// ([`RunOptions::api_server_outage`](crate::options::RunOptions::api_server_outage)):
    /// when it was stopped, and when `/readyz` first answered again (polled
    /// every 50 ms with kubectl: at most about 0.3 s late).
    pub api_server_outage: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// Processes that exited and were started again, with when and how.
    pub restarts: Vec<(DateTime<Utc>, String)>,
    /// The IMDS mock's whole log (phases it moved events to, approvals it
    /// received), as last read.
    pub imds_log: Vec<LogEntry>,
    /// Every notice annotation seen on a pod of the workload's namespace.
    pub notices: Vec<NoticeSeen>,
    /// Each event's `NotBefore` as first seen in its `ScheduledEvent` (the
    /// value the agents read from IMDS), by `EventId`.
    pub not_before: std::collections::BTreeMap<String, DateTime<Utc>>,
    /// The workload namespace's pods on each node when the scenario
    /// started (`namespace/name`, by node name).
    pub initial_pods: std::collections::BTreeMap<String, Vec<String>>,
    /// The acknowledgements the harness wrote
    /// ([`RunOptions::acknowledgers`](crate::options::RunOptions::acknowledgers)).
    pub acks: Vec<AckWritten>,
    /// Every version of every PodDisruptionBudget of the workload's
    /// namespace, in the order the watch saw them.
    pub budgets: Vec<BudgetSeen>,
    /// Each pause of the controller ([`crate::options::TimedFault::PauseController`]):
    /// when it was resumed and when the resumed process had exited (`None`
    /// when it did not exit in time), and its identity.
    pub pauses: Vec<(DateTime<Utc>, Option<DateTime<Utc>>, String)>,
    /// The faults injected, by when and what.
    pub faults: Vec<(DateTime<Utc>, String)>,
}

/// One version of a PodDisruptionBudget, as the harness's watch saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetSeen {
    /// When the watch saw it.
    pub seen_at: DateTime<Utc>,
    /// `namespace/name`.
    pub budget: String,
    /// Its `status.disruptionsAllowed` (0 when not set yet).
    pub allowed: i32,
}

impl BudgetSeen {
    /// The version `budget` of a PodDisruptionBudget, seen at `seen_at`.
    pub fn of(
        budget: &k8s_openapi::api::policy::v1::PodDisruptionBudget,
        seen_at: DateTime<Utc>,
    ) -> Self {
        use kube::ResourceExt;
        Self {
            seen_at,
            budget: format!(
                "{}/{}",
                budget.namespace().unwrap_or_default(),
                budget.name_any()
            ),
            allowed: budget
                .status
                .as_ref()
                .and_then(|s| s.disruptions_allowed)
                .unwrap_or(0),
        }
    }
}

/// A pod deletion as the API server applied it: the first version of the
/// pod with a `deletionTimestamp`.
#[derive(Debug, Clone, PartialEq)]
pub struct PodDeletion {
    /// `namespace/name`.
    pub pod: String,
    /// The node it ran on.
    pub node: String,
    /// `metadata.deletionGracePeriodSeconds` (0 is a force delete).
    pub grace_seconds: Option<i64>,
    /// `metadata.deletionTimestamp`: deletion time plus the grace period.
    pub deletion_timestamp: DateTime<Utc>,
    /// When the watch delivered it.
    pub seen_at: DateTime<Utc>,
}

impl Report {
    /// Whether the scenario completed and every rule held.
    pub fn ok(&self) -> bool {
        self.finished && self.violations.is_empty()
    }

    /// When `node` was first seen cordoned during the run (the harness's
    /// watch of nodes), if ever.
    pub fn first_cordon(&self, node: &str) -> Option<DateTime<Utc>> {
        self.node_changes
            .iter()
            .filter(|(_, n, cordoned)| n == node && *cordoned)
            .map(|(t, ..)| *t)
            .min()
    }

    /// The value of the sample `series` (its name and labels as exposed,
    /// e.g. `x_total{a="b"}`) in `process`'s `/metrics` at the end of the
    /// run (`controller`, or an agent's name); `None` when not exposed.
    pub fn metric(&self, process: &str, series: &str) -> Option<f64> {
        let (_, text) = self.metrics.iter().find(|(p, _)| p == process)?;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{series} ")))
            .and_then(|v| v.trim().parse().ok())
    }
}

/// Renders the report's ending: the table and the verdict.
pub fn summary(report: &Report) -> String {
    let mut s = String::new();
    s.push_str("\n$ kubectl get scheduledevents -o wide\n");
    s.push_str(&report.sev_table);
    s.push_str(&format!(
        "\nfewest ready replicas during the run: {} (PodDisruptionBudget minAvailable {})\n",
        report.min_ready, report.min_available
    ));
    if report.ok() {
        s.push_str(&format!("PASS: scenario completed in {:.1}s; no PodDisruptionBudget violated, approvals only after drains, every node released\n", report.elapsed));
    } else {
        s.push_str("FAIL:\n");
        for v in &report.violations {
            s.push_str(&format!("  - {v}\n"));
        }
        s.push_str(&format!("logs: {}\n", report.log_dir.display()));
    }
    s
}
