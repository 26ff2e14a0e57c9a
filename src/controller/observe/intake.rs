//! Which of the agents' reports the controller takes into account, and how
//! urgent each event it has no object for is.
//!
//! Each agent writes only its own node's reports (the chart's admission
//! policy), but it writes as many as it likes: a compromised agent could
//! flood the controller with thousands of events and starve every other
//! node's. So, per reporting node, at most [`MAX_LIVE_REPORTS_PER_NODE`]
//! live reports (the event still listed in its document) are taken into
//! account, the most urgent first ([`Urgency`]); the others are ignored
//! until room frees up, and counted. An admission policy cannot enforce
//! this cap: it sees one object at a time and cannot count the others.
//!
//! A report is also ignored, and counted, when its `scheduledEvent` is not
//! the object name of its own `EventId` ([`object_name`]): the API server
//! checks a GUID's (a CEL rule of the CRD) but cannot compute the hash of
//! any other id.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::api::{EventStatus, Report, ScheduledEventReport, ScheduledEventReportSpec};
use crate::controller::observe::reports::{ReportsByEvent, group_by_event};
use crate::imds::model::object_name;

/// How many live reports (`Scheduled` or `Started`) of one node the
/// controller takes into account at a time. Azure delivers every event of
/// an availability set (at most 200 VMs) or a scale-set placement group to
/// each of its VMs, and each agent reports every event its document lists:
/// a maintenance wave over a whole set may list a couple of hundred events
/// on every VM at once. An agent over this is malfunctioning or
/// compromised.
pub const MAX_LIVE_REPORTS_PER_NODE: usize = 512;

/// How many reports of one node, live or ended, the controller's cache
/// holds at most (the oldest taken in; see
/// [`crate::controller::observe::watch::PerOwnerCap`]): twice the live
/// cap, room for a wave's live reports and those of the wave before it
/// that await their events' retention. Each report is bounded by its CRD,
/// so one node's share of the cache is bounded too.
pub const MAX_CACHED_REPORTS_PER_NODE: usize = 2 * MAX_LIVE_REPORTS_PER_NODE;

/// How urgent a report, or an event, is; the lesser the more urgent:
/// first those about the reporting node's own VM, then by deadline, an
/// event `Started` or without `NotBefore` first, then the earliest
/// `NotBefore`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Urgency {
    /// `false` when the report names its node's own VM.
    not_own: bool,
    /// `None` (first) for an event `Started` or without `NotBefore`.
    deadline: Option<DateTime<Utc>>,
}

impl Urgency {
    /// Whether the report names its node's own VM.
    pub fn is_own(&self) -> bool {
        !self.not_own
    }

    /// The urgency of `report`: `own_vm` is the VM of the reporting node
    /// (its `providerID`'s, else the VM the report states).
    pub fn of(report: &Report, own_vm: &str) -> Self {
        let deadline = match report.event_status {
            EventStatus::Scheduled => report.not_before,
            EventStatus::Started | EventStatus::Completed => None,
        };
        Urgency {
            not_own: own_vm.is_empty()
                || !report
                    .resources
                    .iter()
                    .any(|r| r.eq_ignore_ascii_case(own_vm)),
            deadline,
        }
    }
}

/// The reports the controller ignores, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ignored {
    /// Per node over its cap, how many of its live reports are ignored.
    pub over_cap: BTreeMap<String, usize>,
    /// Reports whose `scheduledEvent` is not their `EventId`'s object name.
    pub misnamed: usize,
}

/// Whether a report is about the object its `EventId` names: its
/// `scheduledEvent` is [`object_name`] of its `EventId`. A report without
/// an `EventId` (of an earlier version) says nothing of any event's content
/// and passes.
pub fn name_matches(spec: &ScheduledEventReportSpec) -> bool {
    spec.report.event_id.is_empty() || object_name(&spec.report.event_id) == spec.scheduled_event
}

/// The reports taken into account, by event, and those ignored: misnamed
/// reports ([`name_matches`]), and per node the live reports beyond the
/// `cap` most urgent ([`Urgency`], then the event's name). Reports of
/// events no longer listed (`Completed`) are all kept: they only end
/// things, and create nothing. `provider_vm(node)` is the VM of a node's
/// `providerID`, if it has one.
pub fn admit(
    reports: impl IntoIterator<Item = Arc<ScheduledEventReport>>,
    cap: usize,
    provider_vm: impl Fn(&str) -> Option<String>,
) -> (ReportsByEvent, Ignored) {
    let mut ignored = Ignored::default();
    let mut kept = Vec::new();
    let mut live: HashMap<String, Vec<Arc<ScheduledEventReport>>> = HashMap::new();
    for r in reports {
        if !name_matches(&r.spec) {
            ignored.misnamed += 1;
        } else if r.spec.report.is_listed() {
            live.entry(r.spec.report.node.clone()).or_default().push(r);
        } else {
            kept.push(r);
        }
    }
    for (node, mut rs) in live {
        if rs.len() > cap {
            let own = provider_vm(&node);
            rs.sort_by_cached_key(|r| {
                let vm = own.as_deref().unwrap_or(&r.spec.report.vm);
                (
                    Urgency::of(&r.spec.report, vm),
                    r.spec.scheduled_event.clone(),
                )
            });
            ignored.over_cap.insert(node, rs.len() - cap);
            rs.truncate(cap);
        }
        kept.extend(rs);
    }
    (group_by_event(kept), ignored)
}

/// The urgency of an event from its reports: the most urgent of those that
/// list it, with the node that reports it so (the first by name among
/// equals); `None` when none lists it (nothing to create).
pub fn event_urgency(
    reports: &[Arc<ScheduledEventReport>],
    provider_vm: impl Fn(&str) -> Option<String>,
) -> Option<(Urgency, String)> {
    reports
        .iter()
        .map(|r| &r.spec.report)
        .filter(|r| r.is_listed())
        .map(|r| {
            let own = provider_vm(&r.node);
            (Urgency::of(r, own.as_deref().unwrap_or(&r.vm)), &r.node)
        })
        .min()
        .map(|(u, node)| (u, node.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ScheduledEventReportSpec;
    use chrono::TimeZone;

    const GUID: &str = "0B5E3B25-7A67-4C3E-A7C4-4A4BD34C4A4E";

    fn at(minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 12, minute, 0).unwrap()
    }

    /// A report of `node` (VM `vm-<node>`) about `id`, naming `resources`.
    fn report(
        id: &str,
        node: &str,
        resources: &[&str],
        status: EventStatus,
        not_before: Option<DateTime<Utc>>,
    ) -> Arc<ScheduledEventReport> {
        let name = object_name(id);
        Arc::new(ScheduledEventReport::new(
            &format!("{name}.{node}"),
            ScheduledEventReportSpec {
                scheduled_event: name,
                report: Report {
                    node: node.into(),
                    vm: format!("vm-{node}"),
                    named: true,
                    event_status: status,
                    appearance: 1,
                    event_id: id.into(),
                    event_type: "Reboot".into(),
                    event_source: "Platform".into(),
                    resource_type: "VirtualMachine".into(),
                    resources: resources.iter().map(|r| r.to_string()).collect(),
                    not_before,
                    duration_seconds: -1,
                    description: String::new(),
                    document_incarnation: 1,
                    approvals: Vec::new(),
                },
            },
        ))
    }

    fn no_provider(_: &str) -> Option<String> {
        None
    }

    fn names(by_event: &ReportsByEvent) -> Vec<String> {
        let mut n: Vec<String> = by_event.keys().cloned().collect();
        n.sort();
        n
    }

    #[test]
    fn own_vm_first_then_started_or_without_not_before_then_earliest_not_before() {
        let own =
            |status, nb| Urgency::of(&report("e", "a", &["vm-a"], status, nb).spec.report, "vm-a");
        let other =
            |status, nb| Urgency::of(&report("e", "a", &["vm-b"], status, nb).spec.report, "vm-a");
        let mut order = vec![
            other(EventStatus::Started, None),
            own(EventStatus::Scheduled, Some(at(30))),
            other(EventStatus::Scheduled, Some(at(1))),
            own(EventStatus::Scheduled, Some(at(5))),
            own(EventStatus::Scheduled, None),
            own(EventStatus::Started, None),
        ];
        order.sort();
        assert_eq!(
            order,
            [
                own(EventStatus::Started, None),
                own(EventStatus::Scheduled, None),
                own(EventStatus::Scheduled, Some(at(5))),
                own(EventStatus::Scheduled, Some(at(30))),
                other(EventStatus::Started, None),
                other(EventStatus::Scheduled, Some(at(1))),
            ]
        );
        assert_eq!(
            own(EventStatus::Started, None),
            own(EventStatus::Scheduled, None)
        );
        // VM names compare ignoring case; a node with no VM known names none.
        assert_eq!(
            Urgency::of(
                &report("e", "a", &["VM-A"], EventStatus::Started, None)
                    .spec
                    .report,
                "vm-a"
            ),
            own(EventStatus::Started, None)
        );
        assert_eq!(
            Urgency::of(
                &report("e", "a", &[""], EventStatus::Started, None)
                    .spec
                    .report,
                ""
            ),
            other(EventStatus::Started, None)
        );
    }

    #[test]
    fn a_node_over_its_cap_keeps_its_own_vms_and_most_urgent_events() {
        let mut all = vec![
            // Not about its own VM, and urgent: ignored before its own.
            report("flood-1", "a", &["vm-b"], EventStatus::Started, None),
            report(
                "flood-2",
                "a",
                &["vm-b"],
                EventStatus::Scheduled,
                Some(at(1)),
            ),
            report(
                "own-late",
                "a",
                &["vm-a"],
                EventStatus::Scheduled,
                Some(at(50)),
            ),
            report(
                "own-soon",
                "a",
                &["vm-a"],
                EventStatus::Scheduled,
                Some(at(10)),
            ),
            // Ended: kept whatever the cap.
            report("ended", "a", &["vm-b"], EventStatus::Completed, None),
        ];
        // Another node's reports are not counted against a's.
        all.push(report(
            "b-1",
            "b",
            &["vm-b"],
            EventStatus::Scheduled,
            Some(at(59)),
        ));
        all.push(report(
            "b-2",
            "b",
            &["vm-b"],
            EventStatus::Scheduled,
            Some(at(58)),
        ));
        all.push(report(
            "b-3",
            "b",
            &["vm-b"],
            EventStatus::Scheduled,
            Some(at(57)),
        ));
        let (kept, ignored) = admit(all.clone(), 3, no_provider);
        let mut want: Vec<String> = [
            "own-late", "own-soon", "flood-1", "ended", "b-1", "b-2", "b-3",
        ]
        .iter()
        .map(|id| object_name(id))
        .collect();
        want.sort();
        assert_eq!(names(&kept), want);
        assert_eq!(ignored.over_cap, BTreeMap::from([("a".to_string(), 1)]));
        assert_eq!(ignored.misnamed, 0);
        // At or under the cap, nothing is ignored.
        let (kept, ignored) = admit(all.clone(), 4, no_provider);
        assert_eq!(kept.values().map(Vec::len).sum::<usize>(), all.len());
        assert_eq!(ignored, Ignored::default());
        // The providerID's VM is the node's own, not the one its agent states.
        let (kept, _) = admit(all, 2, |n| (n == "a").then(|| "vm-b".to_string()));
        let a: Vec<String> = {
            let mut a: Vec<String> = kept
                .iter()
                .filter(|(_, rs)| rs.iter().any(|r| r.spec.report.node == "a"))
                .map(|(n, _)| n.clone())
                .collect();
            a.sort();
            a
        };
        let mut want = vec![
            object_name("flood-1"),
            object_name("flood-2"),
            object_name("ended"),
        ];
        want.sort();
        assert_eq!(a, want);
    }

    #[test]
    fn a_report_whose_name_is_not_its_event_ids_is_ignored() {
        let good = report(GUID, "a", &["vm-a"], EventStatus::Scheduled, None);
        assert_eq!(good.spec.scheduled_event, GUID.to_ascii_lowercase());
        assert!(name_matches(&good.spec));
        let odd = report("not-a-guid", "a", &["vm-a"], EventStatus::Scheduled, None);
        assert!(odd.spec.scheduled_event.starts_with("sev-"));
        assert!(name_matches(&odd.spec));
        // Another event's name, or the hash of another id.
        let mut other = (*good).clone();
        other.spec.scheduled_event = "1b5e3b25-7a67-4c3e-a7c4-4a4bd34c4a4e".into();
        assert!(!name_matches(&other.spec));
        let mut other_hash = (*odd).clone();
        other_hash.spec.scheduled_event = object_name("another-id");
        assert!(!name_matches(&other_hash.spec));
        // The GUID as IMDS spells it is not the object name.
        let mut upper = (*good).clone();
        upper.spec.scheduled_event = GUID.into();
        assert!(!name_matches(&upper.spec));
        // An earlier version's report has no EventId to check.
        let mut earlier = (*good).clone();
        earlier.spec.report.event_id = String::new();
        assert!(name_matches(&earlier.spec));

        let (kept, ignored) = admit(
            [
                good,
                odd,
                Arc::new(other),
                Arc::new(other_hash),
                Arc::new(upper),
            ],
            64,
            no_provider,
        );
        assert_eq!(ignored.misnamed, 3);
        let mut want = vec![GUID.to_ascii_lowercase(), object_name("not-a-guid")];
        want.sort();
        assert_eq!(names(&kept), want);
    }

    #[test]
    fn an_events_urgency_is_its_most_urgent_listed_report() {
        let rs = [
            report("e", "a", &["vm-b"], EventStatus::Started, None),
            report("e", "b", &["vm-b"], EventStatus::Scheduled, Some(at(20))),
            report("e", "c", &["vm-b"], EventStatus::Completed, None),
        ];
        assert_eq!(
            event_urgency(&rs, no_provider),
            Some((Urgency::of(&rs[1].spec.report, "vm-b"), "b".to_string()))
        );
        assert_eq!(event_urgency(&rs[2..], no_provider), None);
        assert_eq!(event_urgency(&[], no_provider), None);
    }
}
