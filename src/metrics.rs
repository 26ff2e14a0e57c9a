//! Prometheus metrics, what both roles share. Each role owns and registers
//! its own collectors on the one `Registry` built at its start
//! ([`crate::metrics::agent`], [`crate::metrics::controller`]); names are
//! `forewarn_<component>_<thing>_<unit>` and labels come from small closed
//! sets only (event `type` through [`type_label`], `source` through
//! [`source_label`], `phase` through [`phase_label`], `result`, `category`,
//! `event_state`): never a pod, node or event id. The per-node identity of
//! an agent's series comes from the scrape target (Prometheus's `instance`,
//! `pod`, `node` labels). The alerts in `charts/forewarn/files/alerts.yaml`
//! are written against these names.

pub mod agent;
pub mod controller;

use prometheus::core::Collector;

use crate::api::Phase;

/// Event types the `type` label takes ([`type_label`]).
pub const TYPES: [&str; 6] = [
    "Freeze",
    "Reboot",
    "Redeploy",
    "Preempt",
    "Terminate",
    "Other",
];

/// The names of the series the collectors export.
pub(crate) fn series_names(collectors: &[Box<dyn Collector>]) -> Vec<String> {
    let mut names = Vec::new();
    for c in collectors {
        for d in c.desc() {
            if HISTOGRAMS.contains(&d.fq_name.as_str()) {
                for s in ["_bucket", "_sum", "_count"] {
                    names.push(format!("{}{s}", d.fq_name));
                }
            } else {
                names.push(d.fq_name.clone());
            }
        }
    }
    names.sort();
    names
}

/// The histograms (whose series carry `_bucket`, `_sum`, `_count`).
const HISTOGRAMS: &[&str] = &[
    "forewarn_agent_imds_request_duration_seconds",
    "forewarn_controller_event_notice_seconds",
    "forewarn_controller_detection_to_cordon_seconds",
    "forewarn_controller_drain_duration_seconds",
    "forewarn_controller_approval_time_to_not_before_seconds",
];

/// Bounds the label value for an event type to the known set ([`TYPES`]).
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

/// Bounds the label value for an event source: `Platform`, `User` or `Other`.
pub fn source_label(source: &str) -> &'static str {
    match source {
        "Platform" => "Platform",
        "User" => "User",
        _ => "Other",
    }
}

/// Bounds the label value for a phase to [`Phase`]'s names, or `Other`.
pub fn phase_label(phase: &str) -> &'static str {
    [
        Phase::Pending,
        Phase::Draining,
        Phase::Drained,
        Phase::Approved,
        Phase::Started,
        Phase::Completed,
        Phase::Cancelled,
        Phase::Ignored,
    ]
    .into_iter()
    .map(Phase::as_str)
    .find(|p| *p == phase)
    .unwrap_or("Other")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::agent::AgentMetrics;
    use crate::metrics::controller::ControllerMetrics;
    use prometheus::Registry;

    #[test]
    fn labels_stay_in_closed_sets() {
        assert_eq!(type_label("Maintenance"), "Other");
        assert_eq!(source_label("Azure"), "Other");
        assert_eq!(phase_label("Draining"), "Draining");
        assert_eq!(phase_label("node-000001"), "Other");
    }

    #[test]
    fn registries_export_the_names_the_alerts_use() {
        let agent = AgentMetrics::names();
        let controller = ControllerMetrics::names();
        assert!(agent.contains(&"forewarn_agent_imds_request_duration_seconds_bucket".into()));
        assert!(agent.contains(&"forewarn_agent_imds_polls_total".into()));
        assert!(controller.contains(&"forewarn_controller_leader".into()));
        assert!(controller.contains(&"forewarn_controller_cordoned_nodes".into()));
        assert!(controller.contains(&"forewarn_controller_drain_duration_seconds_count".into()));
        // Registering twice in one registry fails: the names are unique.
        let r = Registry::new();
        assert!(ControllerMetrics::register(&r).is_ok());
        assert!(AgentMetrics::register(&r).is_ok());
        assert!(AgentMetrics::register(&r).is_err());
    }
}
