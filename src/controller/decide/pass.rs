//! The decisions of one pass over one event (pure): the plan of the
//! event's own content, each dissenting node's plan merged into it, and the
//! notice each taking-part pod on the handled nodes should hold.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::api::{EventStatus, Phase, ScheduledEvent, ScheduledEventSpec};
use crate::controller::decide::acknowledge::AckState;
use crate::controller::decide::plan::{self, Plan};
use crate::controller::observe::observed::{Observed, ObservedNode};
use crate::controller::observe::participants::{Notice, Participant, render};
use crate::policy::{Action, Policy};

/// A notice to hold: the pod and the rendered notice.
pub type DesiredNotice = (Arc<Participant>, String);

/// The notice each participant on `nodes` (the nodes handled live for the
/// content `spec`, with `phase` and `action`) should hold of the event
/// `event`, by participant.
pub fn desired(
    spec: &ScheduledEventSpec,
    phase: Phase,
    action: Action,
    nodes: &[ObservedNode],
    ack: Option<&AckState>,
) -> Vec<(Arc<Participant>, String)> {
    let mut out = Vec::new();
    for n in nodes.iter().filter(|n| !n.vm_name.is_empty() && !n.ended) {
        for p in &n.participants {
            let notice = Notice {
                event_id: spec.event_id.clone(),
                event_type: spec.event_type.clone(),
                status: spec.event_status.to_string(),
                not_before: spec.not_before,
                duration_seconds: spec.duration_seconds,
                phase,
                action,
                drain: action.drains(),
                // Only while the wait can matter (its deadline is stable then).
                acknowledge_by: ack
                    .filter(|_| p.acknowledges && spec.event_status == EventStatus::Scheduled)
                    .map(|a| a.deadline),
            };
            out.push((Arc::clone(p), render(&notice)));
        }
    }
    out
}

/// The notices the taking-part pods on `seen`'s nodes should hold of the
/// event's own content under `plan` (none once the event is over).
pub fn notices(ev: &ScheduledEvent, plan: &Plan, seen: &Observed) -> Vec<DesiredNotice> {
    if plan.phase.is_final() {
        return Vec::new();
    }
    desired(
        &ev.spec,
        plan.phase,
        plan.action,
        &seen.nodes,
        plan.acknowledgement.as_ref(),
    )
}

/// Merges into `plan`, `seen` and `notices` the plan of each dissenting
/// node: one whose own agent reports other content than the spec is
/// handled on its own report (its own event type, duration and
/// `NotBefore` decide its cordon and drain). Its record starts empty: the
/// event's status (its phase, its approval) is about the spec's content,
/// not theirs. Node writes, evictions and kept pods are added, the requeue
/// is the nearer of both, and the dissenting nodes join `seen`'s nodes.
pub fn merge_dissent(
    ev: &ScheduledEvent,
    dissent: Vec<(ScheduledEventSpec, Vec<ObservedNode>)>,
    policy: &Policy,
    now: DateTime<Utc>,
    plan: &mut Plan,
    seen: &mut Observed,
    notices: &mut Vec<DesiredNotice>,
) {
    for (spec, nodes) in dissent {
        let mut theirs = ev.clone();
        theirs.spec = spec;
        theirs.status = None;
        let their_seen = Observed {
            nodes,
            dry_run: seen.dry_run,
            ..Observed::default()
        };
        let their_plan = plan::plan(&theirs, &their_seen, policy, now);
        notices.extend(self::notices(&theirs, &their_plan, &their_seen));
        plan.node_writes.extend(their_plan.node_writes);
        plan.evictions.extend(their_plan.evictions);
        plan.kept.extend(their_plan.kept);
        plan.requeue = plan.requeue.min(their_plan.requeue);
        seen.nodes.extend(their_seen.nodes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::decide::plan::NodeWrite;
    use crate::controller::observe::pod_list::PodInfo;
    use crate::fixtures;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn spec(type_: &str, vms: &[&str], not_before: &str) -> ScheduledEventSpec {
        fixtures::spec("EV-1")
            .event_type(type_)
            .vms(vms.iter().copied())
            .not_before(t(not_before))
            .build()
    }

    fn node(name: &str, vm: &str, pod: &str, participant: bool) -> ObservedNode {
        ObservedNode {
            name: name.into(),
            vm_name: vm.into(),
            cordoned: false,
            holds: Vec::new(),
            claimed_by: Vec::new(),
            pods: vec![Arc::new(PodInfo {
                namespace: "default".into(),
                name: pod.into(),
                uid: format!("uid-{pod}"),
                managed: true,
                grace_seconds: 30,
                ..PodInfo::default()
            })],
            excluded: Vec::new(),
            ended: false,
            participants: participant
                .then(|| {
                    Arc::new(Participant {
                        namespace: "default".into(),
                        name: pod.into(),
                        uid: format!("uid-{pod}"),
                        ..Participant::default()
                    })
                })
                .into_iter()
                .collect(),
        }
    }

    #[test]
    fn a_dissenting_node_is_planned_on_its_own_report_and_merged() {
        let now = t("2026-11-21T10:00:00Z");
        let ev = ScheduledEvent::new("ev-1", spec("Freeze", &["vm-a"], "2026-11-21T10:10:00Z"));
        let policy = Policy::default();
        let mut seen = Observed {
            nodes: vec![node("a", "vm-a", "pa", false)],
            ..Observed::default()
        };
        let mut plan = plan::plan(&ev, &seen, &policy, now);
        let mut notices = notices(&ev, &plan, &seen);
        let own_writes = plan.node_writes.len();
        let own_requeue = plan.requeue;
        // Node b's own agent reports a Reboot due in a minute.
        let theirs = spec("Reboot", &["vm-b"], "2026-11-21T10:01:00Z");
        let mut alone = ev.clone();
        alone.spec = theirs.clone();
        let their_seen = Observed {
            nodes: vec![node("b", "vm-b", "pb", true)],
            ..Observed::default()
        };
        let their_plan = plan::plan(&alone, &their_seen, &policy, now);
        merge_dissent(
            &ev,
            vec![(theirs, vec![node("b", "vm-b", "pb", true)])],
            &policy,
            now,
            &mut plan,
            &mut seen,
            &mut notices,
        );
        let names: Vec<&str> = seen.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(
            plan.node_writes
                .iter()
                .any(|w| matches!(w, NodeWrite::Cordon { node, .. } if node == "b")),
            "b is cordoned on its own report: {:?}",
            plan.node_writes
        );
        assert_eq!(
            plan.node_writes.len(),
            own_writes + their_plan.node_writes.len()
        );
        assert_eq!(plan.requeue, own_requeue.min(their_plan.requeue));
        // b's pod holds a notice of b's own content, not the spec's.
        assert_eq!(notices.len(), 1);
        let notice = &notices[0].1;
        assert!(notice.contains(" type=Reboot "), "{notice}");
        assert!(
            notice.contains("notBefore=2026-11-21T10:01:00Z"),
            "{notice}"
        );
    }

    #[test]
    fn no_notice_once_the_event_is_over() {
        let now = t("2026-11-21T10:00:00Z");
        let mut ev = ScheduledEvent::new("ev-1", spec("Reboot", &["vm-a"], "2026-11-21T10:10:00Z"));
        let seen = Observed {
            nodes: vec![node("a", "vm-a", "pa", true)],
            ..Observed::default()
        };
        let policy = Policy::default();
        let plan = plan::plan(&ev, &seen, &policy, now);
        assert_eq!(notices(&ev, &plan, &seen).len(), 1);
        ev.spec.event_status = EventStatus::Completed;
        let plan = plan::plan(&ev, &seen, &policy, now);
        assert!(plan.phase.is_final(), "{:?}", plan.phase);
        assert!(notices(&ev, &plan, &seen).is_empty());
    }
}
