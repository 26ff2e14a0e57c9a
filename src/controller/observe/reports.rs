//! The agents' `ScheduledEventReport`s grouped by the event they are
//! about, and what they state of each node's VM (never taken as the node's
//! VM: see [`crate::controller::observe::nodes`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::api::{AGENT_MANAGER, Report, ScheduledEventReport};
use crate::topology::VirtualMachineReport;

/// Reports by the name of the `ScheduledEvent` they are about.
pub type ReportsByEvent = HashMap<String, Vec<Arc<ScheduledEventReport>>>;

pub fn group_by_event(
    reports: impl IntoIterator<Item = Arc<ScheduledEventReport>>,
) -> ReportsByEvent {
    let mut by_event = ReportsByEvent::new();
    for r in reports {
        by_event
            .entry(r.spec.scheduled_event.clone())
            .or_default()
            .push(r);
    }
    by_event
}

/// The reports about the event named `name`, borrowed from `reports` (a
/// report of a 1,000-VM event holds 1,000 names, and every pass reads them:
/// none is copied), and when an agent last wrote one of them (its
/// `managedFields` time, else its creation).
pub fn reports_about<'a>(
    reports: &'a ReportsByEvent,
    name: &str,
) -> (Vec<&'a Report>, Option<DateTime<Utc>>) {
    let about = reports.get(name).map(Vec::as_slice).unwrap_or_default();
    let last = about.iter().filter_map(|r| last_write(r)).max();
    (about.iter().map(|r| &r.spec.report).collect(), last)
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
/// node's fixed one (see [`crate::controller::observe::nodes::identities`]).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::EventStatus;
    use crate::api::ScheduledEventReportSpec;

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
