//! Acknowledgements: a pod can ask forewarn to wait for it before the
//! approval (label `forewarn.dev/acknowledge: "true"`), and answers once
//! it is prepared by writing `ack.forewarn.dev/<ScheduledEvent name>:
//! <EventId>` on itself, with its own ServiceAccount (one `kubectl
//! annotate`, or one PATCH from the container). An annotation rather than a
//! readiness gate: flipping a gate makes the pod not Ready, which takes it
//! out of its Services during the very maintenance it prepares for, and
//! needs `pods/status` rights and a condition patch that few workloads
//! know how to write.
//!
//! Pure, like [`crate::controller::decide::plan`]: [`assess`] says, for one pass, who has the
//! notice, who acknowledged, and until when forewarn waits; the plan holds
//! the approval (and the eviction of waited-for pods, by the policy's
//! `evictAfterAcknowledgement`) while it does.

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use crate::api::{EventStatus, ScheduledEvent};
use crate::controller::observe::observed::Observed;
use crate::imds::model::EventType;
use crate::policy::Policy;

/// The state of the wait for the pods that take part, in one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckState {
    /// When the wait began (recorded in the status).
    pub since: DateTime<Utc>,
    /// When forewarn stops waiting: `since` plus the type's timeout, never
    /// after the drain deadline.
    pub deadline: DateTime<Utc>,
    /// Pods taking part on the affected nodes (not terminating).
    pub participants: usize,
    /// Of those, whose notice of this event is stored.
    pub notified: usize,
    /// Pods on the affected nodes that asked to be waited for.
    pub asked: usize,
    /// Those that acknowledged (`namespace/name`), sorted.
    pub acknowledged: Vec<String>,
    /// Those that have not (`namespace/name`), sorted.
    pub pending: Vec<String>,
    /// Their UIDs (their eviction may wait).
    pub pending_uids: HashSet<String>,
    /// Pods whose notice is not stored yet (`namespace/name`), sorted.
    pub undelivered: Vec<String>,
    /// Whether forewarn still waits: the event is `Scheduled`, a notice is
    /// not stored or an acknowledgement is missing, and the deadline has
    /// not passed.
    pub waiting: bool,
    /// Whether the deadline passed while the event was `Scheduled` and a
    /// pod had not acknowledged (or its notice was not stored).
    pub timed_out: bool,
}

/// The wait for `ev`'s taking part pods at `now`, given the drain deadline
/// `drain_deadline` (`NotBefore` minus the margin), or `None` when no pod
/// takes part on its affected nodes and none ever did (the status has no
/// record).
pub fn assess(
    ev: &ScheduledEvent,
    seen: &Observed,
    policy: &Policy,
    drain_deadline: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<AckState> {
    let name = ev.metadata.name.clone().unwrap_or_default();
    let id = &ev.spec.event_id;
    let record = ev.status.as_ref().and_then(|s| s.acknowledgements.as_ref());
    let pods: Vec<_> = seen
        .nodes
        .iter()
        .filter(|n| !n.vm_name.is_empty() && !n.ended)
        .flat_map(|n| &n.participants)
        .filter(|p| !p.terminating)
        .collect();
    if pods.is_empty() && record.is_none() {
        return None;
    }
    let since = record.and_then(|r| r.since).unwrap_or(now);
    let timeout = policy.acknowledge_timeout(
        &EventType::from(ev.spec.event_type.as_str()),
        &ev.spec.event_source,
        ev.spec.duration_seconds,
    );
    let deadline = drain_deadline.map_or(since + timeout, |d| d.min(since + timeout));
    let mut state = AckState {
        since,
        deadline,
        participants: pods.len(),
        notified: 0,
        asked: 0,
        acknowledged: Vec::new(),
        pending: Vec::new(),
        pending_uids: HashSet::new(),
        undelivered: Vec::new(),
        waiting: false,
        timed_out: false,
    };
    for p in pods {
        if p.notified(&name, id) {
            state.notified += 1;
        } else {
            state.undelivered.push(p.key());
        }
        if p.acknowledges {
            state.asked += 1;
            if p.acknowledged(&name, id) {
                state.acknowledged.push(p.key());
            } else {
                state.pending.push(p.key());
                state.pending_uids.insert(p.uid.clone());
            }
        }
    }
    state.acknowledged.sort();
    state.pending.sort();
    state.undelivered.sort();
    let missing = !state.pending.is_empty() || !state.undelivered.is_empty();
    let scheduled = ev.spec.event_status == EventStatus::Scheduled;
    state.waiting = scheduled && missing && now < deadline;
    state.timed_out = scheduled && missing && now >= deadline;
    Some(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Acknowledgements, ScheduledEventStatus};
    use crate::controller::observe::observed::ObservedNode;
    use crate::controller::observe::participants::Participant;
    use crate::fixtures;
    use std::sync::Arc;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn ev() -> ScheduledEvent {
        ScheduledEvent::new(
            "ev-1",
            fixtures::spec("EV-1")
                .vms(["vm_1"])
                .not_before(t("2026-11-21T10:15:00Z"))
                .build(),
        )
    }

    fn pod(name: &str, acknowledges: bool, annotations: &[(&str, &str)]) -> Arc<Participant> {
        Arc::new(Participant {
            namespace: "shop".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            acknowledges,
            terminating: false,
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
    }

    fn seen(participants: Vec<Arc<Participant>>) -> Observed {
        Observed {
            nodes: vec![ObservedNode {
                name: "n1".into(),
                vm_name: "vm_1".into(),
                participants,
                ..ObservedNode::default()
            }],
            ..Observed::default()
        }
    }

    const NOTICE: (&str, &str) = ("notice.forewarn.dev/ev-1", "eventId=EV-1 type=Reboot");

    #[test]
    fn nothing_is_recorded_where_no_pod_takes_part() {
        let now = t("2026-11-21T10:00:00Z");
        assert_eq!(
            assess(&ev(), &seen(vec![]), &Policy::default(), None, now),
            None
        );
    }

    #[test]
    fn the_wait_lasts_until_every_notice_is_stored_and_every_pod_acknowledged() {
        let now = t("2026-11-21T10:00:00Z");
        let policy = Policy::default();
        // The notice is not stored yet.
        let a = assess(
            &ev(),
            &seen(vec![pod("web", false, &[])]),
            &policy,
            None,
            now,
        )
        .unwrap();
        assert!(a.waiting && !a.timed_out);
        assert_eq!(a.undelivered, ["shop/web"]);
        assert_eq!(a.deadline, now + chrono::TimeDelta::seconds(300));
        // Stored, and nobody asked to be waited for.
        let a = assess(
            &ev(),
            &seen(vec![pod("web", false, &[NOTICE])]),
            &policy,
            None,
            now,
        )
        .unwrap();
        assert!(!a.waiting);
        assert_eq!((a.notified, a.participants, a.asked), (1, 1, 0));
        // One asked and did not answer; a wrong EventId is no answer.
        let pods = vec![
            pod("db-0", true, &[NOTICE, ("ack.forewarn.dev/ev-1", "ev-1")]),
            pod("db-1", true, &[NOTICE, ("ack.forewarn.dev/ev-1", "EV-2")]),
        ];
        let a = assess(&ev(), &seen(pods), &policy, None, now).unwrap();
        assert!(a.waiting);
        assert_eq!(a.acknowledged, ["shop/db-0"]);
        assert_eq!(a.pending, ["shop/db-1"]);
        assert!(a.pending_uids.contains("uid-db-1"));
    }

    #[test]
    fn the_wait_ends_at_the_types_timeout_or_the_drain_deadline_whichever_first() {
        let since = t("2026-11-21T10:00:00Z");
        let mut e = ev();
        e.status = Some(ScheduledEventStatus {
            acknowledgements: Some(Acknowledgements {
                since: Some(since),
                ..Acknowledgements::default()
            }),
            ..ScheduledEventStatus::default()
        });
        let policy = Policy::parse(
            "acknowledgeTimeoutSeconds: 600\nrules:\n- {eventType: Preempt, action: DrainAndApprove, acknowledgeTimeoutSeconds: 20}\n",
            "p",
        )
        .unwrap();
        let silent = || seen(vec![pod("db-0", true, &[NOTICE])]);
        let drain_deadline = t("2026-11-21T10:05:00Z");
        let a = assess(&e, &silent(), &policy, Some(drain_deadline), since).unwrap();
        assert_eq!(a.deadline, drain_deadline, "never past the drain deadline");
        let a = assess(&e, &silent(), &policy, Some(drain_deadline), drain_deadline).unwrap();
        assert!(!a.waiting && a.timed_out);
        e.spec.event_type = "Preempt".into();
        let a = assess(&e, &silent(), &policy, Some(drain_deadline), since).unwrap();
        assert_eq!(a.deadline, since + chrono::TimeDelta::seconds(20));
        // Once started, nothing is waited for, and nothing timed out.
        e.spec.event_status = EventStatus::Started;
        let a = assess(&e, &silent(), &policy, None, since).unwrap();
        assert!(!a.waiting && !a.timed_out);
    }

    #[test]
    fn terminating_pods_and_nodes_whose_part_ended_are_not_waited_for() {
        let now = t("2026-11-21T10:00:00Z");
        let mut gone = (*pod("db-0", true, &[NOTICE])).clone();
        gone.terminating = true;
        let mut s = seen(vec![Arc::new(gone)]);
        s.nodes.push(ObservedNode {
            name: "n2".into(),
            vm_name: "vm_2".into(),
            ended: true,
            participants: vec![pod("db-1", true, &[])],
            ..ObservedNode::default()
        });
        assert_eq!(assess(&ev(), &s, &Policy::default(), None, now), None);
    }
}
