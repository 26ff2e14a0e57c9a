use super::*;
use crate::api::{Approval, NodeProgress, ScheduledEventStatus};
use crate::controller::decide::status::next_status;
use crate::controller::observe::participants::Participant;
use crate::controller::observe::pod_list::Terminating;
use crate::fixtures;

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn now() -> DateTime<Utc> {
    t("2026-11-21T10:00:00Z")
}

fn event(type_: &str, status: &str, resources: &[&str]) -> ScheduledEvent {
    let mut ev = ScheduledEvent::new(
        "ev-1",
        fixtures::spec("EV-1")
            .event_type(type_)
            .status(serde_json::from_value(serde_json::json!(status)).unwrap())
            .vms(resources.iter().copied())
            .not_before((status == "Scheduled").then(|| t("2026-11-21T10:10:00Z")))
            .build(),
    );
    ev.status = None;
    ev
}

fn pod(name: &str) -> PodInfo {
    PodInfo {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        managed: true,
        grace_seconds: 30,
        ..PodInfo::default()
    }
}

fn node(name: &str, vm: &str, cordoned: bool, holds: &[&str], pods: Vec<PodInfo>) -> ObservedNode {
    ObservedNode {
        name: name.into(),
        vm_name: vm.into(),
        cordoned,
        holds: holds.iter().map(|s| s.to_string()).collect(),
        claimed_by: Vec::new(),
        pods: pods.into_iter().map(Arc::new).collect(),
        excluded: Vec::new(),
        ended: false,
        participants: Vec::new(),
    }
}

fn seen(nodes: Vec<ObservedNode>, unmapped: &[&str]) -> Observed {
    Observed {
        nodes,
        unmapped: unmapped.iter().map(|s| s.to_string()).collect(),
        ..Observed::default()
    }
}

fn with_status(mut ev: ScheduledEvent, status: ScheduledEventStatus) -> ScheduledEvent {
    ev.status = Some(status);
    ev
}

/// A `Completed` event that finished a minute ago (past the release delay).
fn ended(type_: &str, resources: &[&str]) -> ScheduledEvent {
    with_status(
        event(type_, "Completed", resources),
        ScheduledEventStatus {
            finished_at: Some(now() - chrono::Duration::minutes(1)),
            ..Default::default()
        },
    )
}

#[test]
fn scheduled_redeploy_cordons_and_evicts_without_approving() {
    let ev = event("Redeploy", "Scheduled", &["vm_1"]);
    let obs = seen(
        vec![node("node-1", "vm_1", false, &[], vec![pod("a"), pod("b")])],
        &[],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.action, Action::DrainAndApprove);
    assert_eq!(p.phase, Phase::Draining);
    assert_eq!(
        p.node_writes,
        vec![NodeWrite::Cordon {
            node: "node-1".into(),
            holds: vec!["ev-1".into()]
        }]
    );
    assert_eq!(p.evictions.len(), 2);
    assert_eq!(p.decide_approval, None);
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(st.nodes_drained.as_deref(), Some("0/1"));
    assert!(st.nodes.as_ref().unwrap()[0].cordoned_by_us);
    assert!(st.approval.is_none());
}

#[test]
fn approval_is_decided_only_when_every_affected_node_is_drained() {
    let ev = event("Reboot", "Scheduled", &["vm_1", "vm_2"]);
    let half = seen(
        vec![
            node("node-1", "vm_1", true, &["ev-1"], vec![]),
            node("node-2", "vm_2", true, &["ev-1"], vec![pod("a")]),
        ],
        &[],
    );
    let p = plan(&ev, &half, &Policy::default(), now());
    assert_eq!(p.decide_approval, None);
    assert_eq!(p.phase, Phase::Draining);

    let all = seen(
        vec![
            node("node-1", "vm_1", true, &["ev-1"], vec![]),
            node("node-2", "vm_2", true, &["ev-1"], vec![]),
        ],
        &[],
    );
    let p = plan(&ev, &all, &Policy::default(), now());
    assert_eq!(
        p.decide_approval.as_deref(),
        Some("all 2 affected nodes drained")
    );
    // Decided, not yet accepted by IMDS: the phase stays Drained.
    assert_eq!(p.phase, Phase::Drained);
    assert!(p.node_writes.is_empty());
    let st = next_status(&ev, &all, &p, &[], now());
    assert_eq!(st.approval.as_ref().unwrap().decided_at, Some(now()));
    assert_eq!(st.nodes_drained.as_deref(), Some("2/2"));
    assert_eq!(
        cond(&st, "ApprovalPending"),
        Some(("True".into(), "AwaitingAgent".into()))
    );
}

#[test]
fn node_cordoned_by_someone_else_is_drained_but_never_uncordoned() {
    let ev = event("Redeploy", "Scheduled", &["vm_1"]);
    let obs = seen(vec![node("node-1", "vm_1", true, &[], vec![pod("a")])], &[]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert!(p.node_writes.is_empty(), "{:?}", p.node_writes);
    assert_eq!(p.evictions.len(), 1);
    let st = next_status(&ev, &obs, &p, &[], now());
    let n = &st.nodes.unwrap()[0];
    assert!(n.already_cordoned && !n.cordoned_by_us);

    let done = event("Redeploy", "Completed", &["vm_1"]);
    let p = plan(
        &done,
        &seen(vec![node("node-1", "vm_1", true, &[], vec![])], &[]),
        &Policy::default(),
        now(),
    );
    assert!(p.node_writes.is_empty());
}

#[test]
fn cancelled_event_uncordons_what_it_cordoned() {
    let ev = ended("Reboot", &["vm_1"]);
    let obs = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![])], &[]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.phase, Phase::Cancelled);
    assert_eq!(
        p.node_writes,
        vec![NodeWrite::Release {
            node: "node-1".into(),
            holds: vec![],
            uncordon: true
        }]
    );
    assert!(!p.delete);
}

#[test]
fn completed_after_start_is_completed_not_cancelled() {
    let ev = with_status(
        event("Reboot", "Completed", &["vm_1"]),
        ScheduledEventStatus {
            started_at: Some(now()),
            ..Default::default()
        },
    );
    let p = plan(&ev, &seen(vec![], &[]), &Policy::default(), now());
    assert_eq!(p.phase, Phase::Completed);
}

#[test]
fn node_held_by_two_events_stays_cordoned_until_the_last_completes() {
    let ev = ended("Reboot", &["vm_1"]);
    let obs = seen(
        vec![node("node-1", "vm_1", true, &["ev-0", "ev-1"], vec![])],
        &[],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(
        p.node_writes,
        vec![NodeWrite::Release {
            node: "node-1".into(),
            holds: vec!["ev-0".into()],
            uncordon: false
        }]
    );

    let second = event("Freeze", "Scheduled", &["vm_1"]);
    let obs = seen(vec![node("node-1", "vm_1", true, &["ev-0"], vec![])], &[]);
    let p = plan(&second, &obs, &Policy::default(), now());
    assert_eq!(
        p.node_writes,
        vec![NodeWrite::AddHold {
            node: "node-1".into(),
            holds: vec!["ev-0".into(), "ev-1".into()]
        }]
    );
}

#[test]
fn foreign_vms_withhold_approval_unless_the_policy_allows() {
    let ev = event("Redeploy", "Scheduled", &["vm_1", "elsewhere_7"]);
    let obs = seen(
        vec![node("node-1", "vm_1", true, &["ev-1"], vec![])],
        &["elsewhere_7"],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.decide_approval, None);
    assert!(
        p.approval_withheld
            .as_deref()
            .unwrap()
            .contains("elsewhere_7")
    );
    assert_eq!(p.phase, Phase::Drained);
    let st = next_status(&ev, &obs, &p, &[], now());
    assert!(
        st.conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "ApprovalWithheld" && c.status == "True")
    );

    let lenient = Policy {
        approve_foreign_vms: true,
        ..Policy::default()
    };
    assert!(plan(&ev, &obs, &lenient, now()).decide_approval.is_some());
}

#[test]
fn event_naming_no_node_is_recorded_and_never_approved() {
    let ev = event("Reboot", "Scheduled", &["ghost_1"]);
    let obs = seen(vec![], &["ghost_1"]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.decide_approval, None);
    assert_eq!(p.phase, Phase::Pending);
    assert!(p.approval_withheld.is_some());
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(st.unmapped_resources, Some(vec!["ghost_1".to_string()]));
    assert_eq!(st.nodes_drained.as_deref(), Some("0/0"));
}

#[test]
fn hardware_failure_cordons_and_evicts_with_no_approval() {
    let ev = event("Reboot", "Started", &["vm_1"]);
    let obs = seen(
        vec![node("node-1", "vm_1", false, &[], vec![pod("a")])],
        &[],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.phase, Phase::Started);
    assert!(matches!(p.node_writes[0], NodeWrite::Cordon { .. }));
    assert_eq!(p.evictions.len(), 1);
    assert_eq!(
        p.evictions[0].grace_seconds, 30,
        "no NotBefore: the pod's own grace"
    );
    assert_eq!(p.decide_approval, None);
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(st.started_at, Some(now()));
    assert!(
        st.conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "DrainIncomplete" && c.status == "True")
    );
}

#[test]
fn short_freeze_is_approved_at_once_without_cordon() {
    let mut ev = event("Freeze", "Scheduled", &["vm_1"]);
    ev.spec.duration_seconds = 5;
    let obs = seen(
        vec![node("node-1", "vm_1", false, &[], vec![pod("a")])],
        &[],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.action, Action::Approve);
    assert!(p.node_writes.is_empty() && p.evictions.is_empty());
    assert!(p.decide_approval.is_some());
    assert_eq!(
        p.phase,
        Phase::Pending,
        "Approved only once IMDS accepted it"
    );
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(
        st.nodes_drained.as_deref(),
        Some("0/1"),
        "nothing was drained"
    );
}

#[test]
fn grace_is_clipped_to_end_before_the_drain_deadline() {
    let mut ev = event("Preempt", "Scheduled", &["vm_1"]);
    ev.spec.not_before = Some(now() + chrono::Duration::seconds(20));
    let obs = seen(
        vec![node("node-1", "vm_1", true, &["ev-1"], vec![pod("a")])],
        &[],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(
        p.evictions[0].grace_seconds, 15,
        "20 s notice minus the 5 s margin"
    );
    ev.spec.not_before = Some(now() - chrono::Duration::seconds(20));
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(
        p.evictions[0].grace_seconds, 5,
        "past the deadline: the floor, never 0 (a force delete)"
    );
}

#[test]
fn terminating_pods_are_waited_for_not_evicted_again() {
    let ev = event("Redeploy", "Scheduled", &["vm_1"]);
    let mut a = pod("a");
    a.terminating = Some(Terminating {
        deadline: now() + chrono::Duration::seconds(20),
        finalizers: vec![],
    });
    let obs = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![a])], &[]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert!(p.evictions.is_empty());
    assert_eq!(p.phase, Phase::Draining);
}

#[test]
fn blocked_eviction_is_reported_as_a_condition_not_a_phase() {
    let ev = event("Redeploy", "Scheduled", &["vm_1"]);
    let obs = seen(
        vec![node("node-1", "vm_1", true, &["ev-1"], vec![pod("a")])],
        &[],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    let outcomes = vec![(
        "node-1".to_string(),
        "default/a".to_string(),
        EvictionOutcome::Blocked {
            budgets: vec!["default/web".into()],
            message: "The disruption budget web needs 5 healthy pods and has 5 currently".into(),
        },
    )];
    let st = next_status(&ev, &obs, &p, &outcomes, now());
    assert_eq!(st.phase, Some(Phase::Draining));
    let n = &st.nodes.as_ref().unwrap()[0];
    assert_eq!(
        n.blocked_by.as_deref(),
        Some(
            "PodDisruptionBudget default/web: The disruption budget web needs 5 healthy pods and has 5 currently"
        )
    );
    assert_eq!(n.blocking_budgets, vec!["default/web".to_string()]);
    assert_eq!(n.blocked_pods, ["default/a"], "the pod a budget refused");
    assert!(
        st.conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "DrainBlocked" && c.status == "True")
    );
}

#[test]
fn finished_event_is_deleted_after_retention() {
    let ev = with_status(
        event("Reboot", "Completed", &["vm_1"]),
        ScheduledEventStatus {
            finished_at: Some(now() - chrono::Duration::hours(25)),
            ..Default::default()
        },
    );
    assert!(plan(&ev, &seen(vec![], &[]), &Policy::default(), now()).delete);
    let fresh = with_status(
        event("Reboot", "Completed", &["vm_1"]),
        ScheduledEventStatus {
            finished_at: Some(now() - chrono::Duration::hours(1)),
            ..Default::default()
        },
    );
    let p = plan(&fresh, &seen(vec![], &[]), &Policy::default(), now());
    assert!(!p.delete);
    assert_eq!(
        p.requeue,
        Duration::from_secs(3600),
        "looked at again hourly at most"
    );
}

#[test]
fn the_decision_names_its_appearance_and_digest_and_is_never_rewritten() {
    let ev = event("Reboot", "Scheduled", &["vm_1"]);
    let obs = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![])], &[]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert!(p.decide_approval.is_some());
    let a = next_status(&ev, &obs, &p, &[], now()).approval.unwrap();
    assert_eq!(a.appearance, Some(ev.spec.appearance));
    assert_eq!(a.digest, Some(ev.spec.digest()));
    assert!(a.sent_at.is_none() && a.result.is_none());
    // Decided once; what the sender reported (copied by the reconcile) stays.
    let sent = Approval {
        sent_at: Some(now()),
        sent_by: Some("node-1".into()),
        result: Some("Failed: IMDS answered 500: down".into()),
        ..a.clone()
    };
    let ev = with_status(
        ev,
        ScheduledEventStatus {
            approval: Some(sent.clone()),
            ..Default::default()
        },
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.decide_approval, None, "decided once only");
    assert_eq!(next_status(&ev, &obs, &p, &[], now()).approval, Some(sent));
}

#[test]
fn eviction_grace_is_the_pods_own_clipped_to_the_deadline_with_a_floor() {
    // (own, seconds left, floor) -> grace asked for
    let cases = [
        (600, Some(25), 5, 25), // a long grace clipped to fit
        (30, None, 5, 30),      // no deadline (started, hardware failure): own
        (30, Some(60), 5, 30),  // never raised
        (25, Some(2), 5, 5),    // near the deadline: the floor
        (25, Some(-40), 5, 5),  // past the deadline: the floor, not 0
        (3, Some(0), 5, 3),     // a shorter own grace is kept, not raised to the floor
        (0, Some(10), 5, 1),    // 0 would be a force delete: 1, as kubectl does
        (0, None, 1, 1),
    ];
    for (own, left, floor, want) in cases {
        assert_eq!(
            eviction_grace(own, left, floor),
            want,
            "own {own}, left {left:?}, floor {floor}"
        );
    }
}

#[test]
fn thirty_second_preempt_gives_every_pod_a_nonzero_grace_ending_before_not_before() {
    let mut ev = event("Preempt", "Scheduled", &["vm_1"]);
    ev.spec.not_before = Some(now() + chrono::Duration::seconds(30));
    let pods: Vec<PodInfo> = (0..20)
        .map(|i| PodInfo {
            grace_seconds: 25,
            ..pod(&format!("p{i}"))
        })
        .collect();
    let obs = seen(vec![node("node-1", "vm_1", false, &[], pods)], &[]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.evictions.len(), 20);
    for e in &p.evictions {
        assert!(e.grace_seconds > 0 && e.grace_seconds <= 25, "{e:?}");
        assert!(now() + chrono::Duration::seconds(e.grace_seconds) <= ev.spec.not_before.unwrap());
    }
}

#[test]
fn pods_without_a_controller_are_kept_and_reported_unless_the_policy_evicts_them() {
    let ev = event("Terminate", "Scheduled", &["vm_1"]);
    let bare = PodInfo {
        managed: false,
        ..pod("bare")
    };
    let obs = seen(
        vec![node(
            "node-1",
            "vm_1",
            true,
            &["ev-1"],
            vec![bare.clone(), pod("web")],
        )],
        &[],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.evictions.len(), 1);
    assert_eq!(p.evictions[0].pod.name, "web");
    assert_eq!(p.kept.len(), 1);
    assert_eq!(p.kept[0].pod, "default/bare");
    let st = next_status(&ev, &obs, &p, &[], now());
    let n = &st.nodes.as_ref().unwrap()[0];
    assert!(
        n.pods_kept[0].starts_with("default/bare: no controller"),
        "{:?}",
        n.pods_kept
    );
    assert!(
        st.conditions
            .as_ref()
            .unwrap()
            .iter()
            .any(|c| c.type_ == "PodsKept" && c.status == "True")
    );

    // Only the bare pod is left: still not drained, approval withheld and says why.
    let obs = seen(
        vec![node("node-1", "vm_1", true, &["ev-1"], vec![bare])],
        &[],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.decide_approval, None);
    assert!(
        p.approval_withheld
            .as_deref()
            .unwrap()
            .contains("default/bare")
    );
    assert_eq!(p.phase, Phase::Draining);

    let forceful = Policy::parse("evictUnmanagedPods: [Terminate]\n", "p").unwrap();
    let p = plan(&ev, &obs, &forceful, now());
    assert_eq!(p.evictions.len(), 1);
    assert!(p.kept.is_empty());
}

#[test]
fn release_hands_the_cordon_over_to_another_event_that_claims_the_node() {
    let ev = ended("Reboot", &["vm_1"]);
    let mut n = node("node-1", "vm_1", true, &["ev-1"], vec![]);
    n.claimed_by = vec!["ev-2".into()];
    let p = plan(&ev, &seen(vec![n], &[]), &Policy::default(), now());
    assert_eq!(
        p.node_writes,
        vec![NodeWrite::Release {
            node: "node-1".into(),
            holds: vec!["ev-2".into()],
            uncordon: false
        }],
        "the next event has not written its hold yet; the node must stay cordoned"
    );
}

#[test]
fn finished_event_keeps_the_record_of_a_drain_that_never_finished() {
    // Live: the PDB blocks the last pod.
    let ev = event("Redeploy", "Scheduled", &["vm_1"]);
    let obs = seen(
        vec![node("node-1", "vm_1", true, &["ev-1"], vec![pod("a")])],
        &[],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    let outcomes = vec![(
        "node-1".to_string(),
        "default/a".to_string(),
        EvictionOutcome::Blocked {
            budgets: vec!["default/web".into()],
            message: "needs 5".into(),
        },
    )];
    let live = next_status(&ev, &obs, &p, &outcomes, now());
    // The event ends; observe no longer lists pods for a recorded node.
    let mut done = with_status(event("Redeploy", "Completed", &["vm_1"]), live);
    done.status.as_mut().unwrap().started_at = Some(now());
    done.status.as_mut().unwrap().finished_at = Some(now());
    let obs = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![])], &[]);
    let later = now() + chrono::Duration::minutes(10);
    let p = plan(&done, &obs, &Policy::default(), later);
    assert_eq!(p.phase, Phase::Completed);
    let st = next_status(&done, &obs, &p, &[], later);
    assert_eq!(st.nodes_drained.as_deref(), Some("0/1"));
    let n = &st.nodes.as_ref().unwrap()[0];
    assert_eq!(n.pods_remaining, 1);
    assert!(n.drained_at.is_none());
    assert_eq!(n.blocking_budgets, vec!["default/web".to_string()]);
    assert!(
        n.cordoned_by_us,
        "the final record keeps that forewarn cordoned the node"
    );
    let c = st.conditions.unwrap();
    assert!(
        c.iter().any(|c| c.type_ == "DrainIncomplete"
            && c.status == "True"
            && c.reason == "EndedBeforeDrained"),
        "{c:?}"
    );
}

#[test]
fn drain_incomplete_once_the_deadline_passes_with_pods_left() {
    let mut ev = event("Redeploy", "Scheduled", &["vm_1"]);
    ev.spec.not_before = Some(now() + chrono::Duration::seconds(3));
    let obs = seen(
        vec![node("node-1", "vm_1", true, &["ev-1"], vec![pod("a")])],
        &[],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    let st = next_status(&ev, &obs, &p, &[], now());
    let c = st.conditions.unwrap();
    assert!(
        c.iter().any(|c| c.type_ == "DrainIncomplete"
            && c.status == "True"
            && c.reason == "DeadlinePassed"),
        "{c:?}"
    );
    assert_eq!(p.decide_approval, None);
}

#[test]
fn a_pod_stuck_terminating_past_its_grace_no_longer_blocks_the_drain() {
    let ev = event("Redeploy", "Scheduled", &["vm_1"]);
    let mut a = pod("a");
    a.terminating = Some(Terminating {
        deadline: now() - chrono::Duration::seconds(31),
        finalizers: vec!["example.com/hold".into()],
    });
    let obs = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![a])], &[]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert!(p.evictions.is_empty());
    assert!(p.decide_approval.is_some());
    let st = next_status(&ev, &obs, &p, &[], now());
    let n = &st.nodes.unwrap()[0];
    assert_eq!(n.pods_remaining, 0);
    assert!(
        n.waiting_for[0].contains("stuck terminating")
            && n.waiting_for[0].contains("example.com/hold"),
        "{:?}",
        n.waiting_for
    );
}

#[test]
fn approve_action_obeys_rule_two_for_foreign_vms() {
    let mut ev = event("Freeze", "Scheduled", &["vm_1", "elsewhere_1"]);
    ev.spec.duration_seconds = 5;
    let obs = seen(
        vec![node("node-1", "vm_1", false, &[], vec![])],
        &["elsewhere_1"],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.action, Action::Approve);
    assert_eq!(p.decide_approval, None);
    assert!(p.approval_withheld.is_some());
    assert_eq!(p.phase, Phase::Pending);
}

#[test]
fn nodes_are_released_only_after_the_release_delay() {
    let ev = event("Reboot", "Completed", &["vm_1"]);
    let obs = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![])], &[]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert!(
        p.node_writes.is_empty(),
        "just ended: wait for a following event to claim the node"
    );
    assert_eq!(p.requeue, Duration::from_secs(5));
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(st.finished_at, Some(now()));
    let later = with_status(event("Reboot", "Completed", &["vm_1"]), st);
    let p = plan(
        &later,
        &obs,
        &Policy::default(),
        now() + chrono::Duration::seconds(5),
    );
    assert!(matches!(
        p.node_writes[..],
        [NodeWrite::Release { uncordon: true, .. }]
    ));
}

#[test]
fn event_gone_after_an_accepted_approval_is_completed_unobserved_not_cancelled() {
    let ev = with_status(
        event("Reboot", "Completed", &["vm_1"]),
        ScheduledEventStatus {
            approval: Some(Approval {
                decided_at: Some(now()),
                result: Some("Accepted".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    let obs = seen(vec![], &[]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.phase, Phase::Completed);
    let st = next_status(&ev, &obs, &p, &[], now());
    assert!(
        st.conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "CompletedUnobserved" && c.status == "True")
    );
    // Decided but never accepted: cancelled.
    let mut ev = ev;
    ev.status
        .as_mut()
        .unwrap()
        .approval
        .as_mut()
        .unwrap()
        .result = Some("Failed: timeout".into());
    assert_eq!(
        plan(&ev, &obs, &Policy::default(), now()).phase,
        Phase::Cancelled
    );
}

#[test]
fn an_event_that_comes_back_is_handled_afresh_with_its_history_kept() {
    use crate::controller::decide::status::for_current_appearance;
    let mut ev = with_status(
        event("Reboot", "Scheduled", &["vm_1"]),
        ScheduledEventStatus {
            phase: Some(Phase::Cancelled),
            nodes_drained: Some("1/1".into()),
            finished_at: Some(now()),
            approval: Some(Approval {
                decided_at: Some(now()),
                result: Some("Accepted".into()),
                ..Default::default()
            }),
            appearance: Some(1),
            ..Default::default()
        },
    );
    ev.spec.appearance = 2;
    let (fresh, anew) = for_current_appearance(&ev);
    assert!(anew);
    let st = fresh.status.as_ref().unwrap();
    assert!(st.approval.is_none() && st.finished_at.is_none() && st.phase.is_none());
    assert_eq!(st.previous_appearances.len(), 1);
    assert_eq!(st.previous_appearances[0].phase, Some(Phase::Cancelled));
    let obs = seen(
        vec![node("node-1", "vm_1", false, &[], vec![pod("a")])],
        &[],
    );
    let p = plan(&fresh, &obs, &Policy::default(), now());
    assert!(
        matches!(p.node_writes[..], [NodeWrite::Cordon { .. }]),
        "cordoned again"
    );
    let next = next_status(&fresh, &obs, &p, &[], now());
    assert_eq!(next.appearance, Some(2));
    assert_eq!(next.previous_appearances.len(), 1);
    let (_, again) = for_current_appearance(&with_status(fresh.clone(), next));
    assert!(!again, "one start-over per appearance");
}

fn cond(st: &ScheduledEventStatus, type_: &str) -> Option<(String, String)> {
    st.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn decided(at: DateTime<Utc>, result: Option<&str>) -> Approval {
    Approval {
        decided_at: Some(at),
        reason: Some("all 1 affected nodes drained".into()),
        appearance: Some(1),
        digest: Some("d".into()),
        sent_at: result.map(|_| at),
        sent_by: result.map(|_| "node-1".into()),
        result: result.map(String::from),
        undrained_allowed: None,
    }
}

#[test]
fn approved_means_imds_accepted_and_the_decision_is_never_rewritten() {
    let ev = event("Reboot", "Scheduled", &["vm_1"]);
    let drained = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![])], &[]);
    let first = now() - chrono::Duration::seconds(30);
    // Decided 30 s ago, not sent: Drained, ApprovalPending, decision kept.
    let waiting = with_status(
        ev.clone(),
        ScheduledEventStatus {
            approval: Some(decided(first, None)),
            ..Default::default()
        },
    );
    let p = plan(&waiting, &drained, &Policy::default(), now());
    assert_eq!(p.phase, Phase::Drained);
    assert_eq!(p.decide_approval, None, "decided once, never again");
    let st = next_status(&waiting, &drained, &p, &[], now());
    assert_eq!(st.approval.as_ref().unwrap().decided_at, Some(first));
    assert_eq!(
        cond(&st, "ApprovalPending"),
        Some(("True".into(), "AwaitingAgent".into()))
    );
    // IMDS refused it: still not Approved, and the reason says so.
    let refused = with_status(
        ev.clone(),
        ScheduledEventStatus {
            approval: Some(decided(first, Some("HTTP 400: bad request"))),
            ..Default::default()
        },
    );
    let p = plan(&refused, &drained, &Policy::default(), now());
    assert_eq!(p.phase, Phase::Drained);
    assert_eq!(p.approval_pending.as_ref().unwrap().0, "Refused");
    // Accepted: Approved, the decision still the first one.
    let accepted = with_status(
        ev,
        ScheduledEventStatus {
            approval: Some(decided(first, Some("Accepted"))),
            ..Default::default()
        },
    );
    let p = plan(&accepted, &drained, &Policy::default(), now());
    assert_eq!(p.phase, Phase::Approved);
    assert_eq!(p.decide_approval, None);
    assert_eq!(p.approval_pending, None);
    let st = next_status(&accepted, &drained, &p, &[], now());
    assert_eq!(st.approval.as_ref().unwrap().decided_at, Some(first));
    assert_eq!(
        cond(&st, "ApprovalPending"),
        Some(("False".into(), "Accepted".into()))
    );
}

#[test]
fn a_terminate_whose_vm_has_no_agent_waits_and_says_why() {
    let ev = with_status(
        event("Terminate", "Scheduled", &["vmss_2"]),
        ScheduledEventStatus {
            approval: Some(decided(now() - chrono::Duration::seconds(10), None)),
            nodes: Some(vec![NodeProgress {
                name: "node-2".into(),
                vm_name: "vmss_2".into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
    );
    // The node went (or no providerID or agent names its VM any more).
    let obs = seen(vec![], &["vmss_2"]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_ne!(p.phase, Phase::Approved);
    let (reason, message) = p.approval_pending.clone().unwrap();
    assert_eq!(reason, "AgentMissing");
    assert!(
        message.contains("vmss_2") && message.contains("no node's providerID or agent names"),
        "{message}"
    );
}

#[test]
fn the_drain_waits_for_not_before_minus_the_lead_time() {
    let mut ev = event("Redeploy", "Scheduled", &["vm_1"]);
    ev.spec.not_before = Some(now() + chrono::Duration::days(5));
    let obs = seen(
        vec![node("node-1", "vm_1", false, &[], vec![pod("a")])],
        &[],
    );
    let policy = Policy::default();
    let p = plan(&ev, &obs, &policy, now());
    assert_eq!(p.phase, Phase::Pending);
    assert!(p.node_writes.is_empty() && p.evictions.is_empty());
    assert_eq!(p.decide_approval, None);
    let start = now() + chrono::Duration::days(5) - chrono::Duration::hours(1);
    assert_eq!(p.drain_starts_at, Some(start));
    assert_eq!(
        p.requeue,
        Duration::from_secs(300),
        "looks again within 5 min"
    );
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(
        cond(&st, "DrainScheduled"),
        Some(("True".into(), "WaitingForLeadTime".into()))
    );
    let msg = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DrainScheduled")
        .unwrap()
        .message
        .clone();
    assert!(msg.contains(&start.to_rfc3339()), "{msg}");
    // Close to the start the requeue is exact.
    let later = start - chrono::Duration::seconds(40);
    assert_eq!(
        plan(&ev, &obs, &policy, later).requeue,
        Duration::from_secs(40)
    );
    // Within the lead time the drain starts, and the condition turns False.
    let then = with_status(ev.clone(), st);
    let p = plan(&then, &obs, &policy, start);
    assert_eq!(p.phase, Phase::Draining);
    assert_eq!(p.evictions.len(), 1);
    let st = next_status(&then, &obs, &p, &[], start);
    assert_eq!(
        cond(&st, "DrainScheduled"),
        Some(("False".into(), "LeadTimeReached".into()))
    );
    // An ordinary 15-minute notice drains at once with the default lead time.
    let mut soon = event("Redeploy", "Scheduled", &["vm_1"]);
    soon.spec.not_before = Some(now() + chrono::Duration::minutes(15));
    assert_eq!(plan(&soon, &obs, &policy, now()).phase, Phase::Draining);
}

#[test]
fn the_lead_time_is_a_policy_setting_with_limits() {
    let p = Policy::parse("drainLeadTimeSeconds: 600\n", "p").unwrap();
    assert_eq!(p.drain_lead_time_seconds, 600);
    assert_eq!(Policy::default().drain_lead_time_seconds, 3600);
    let e = Policy::parse("drainLeadTimeSeconds: 2\ndrainMarginSeconds: 5\n", "p").unwrap_err();
    assert!(e.to_string().contains("drainLeadTimeSeconds"), "{e}");
    let e = Policy::parse("orphanedAfterSeconds: 99999999\n", "p").unwrap_err();
    assert!(e.to_string().contains("four weeks"), "{e}");
}

/// A started Terminate whose node is gone: the VM was deleted with its agent.
fn orphan(started_secs_ago: i64) -> ScheduledEvent {
    with_status(
        event("Terminate", "Started", &["vmss_2"]),
        ScheduledEventStatus {
            phase: Some(Phase::Started),
            started_at: Some(now() - chrono::Duration::seconds(started_secs_ago)),
            first_seen: Some(now() - chrono::Duration::seconds(started_secs_ago + 60)),
            nodes: Some(vec![NodeProgress {
                name: "node-2".into(),
                vm_name: "vmss_2".into(),
                drained_at: Some(now() - chrono::Duration::seconds(started_secs_ago + 5)),
                ..Default::default()
            }]),
            approval: Some(decided(
                now() - chrono::Duration::seconds(started_secs_ago + 2),
                Some("Accepted"),
            )),
            appearance: Some(1),
            ..Default::default()
        },
    )
}

#[test]
fn an_event_whose_nodes_are_all_gone_ends_after_the_orphan_time() {
    let policy = Policy::parse("orphanedAfterSeconds: 60\n", "p").unwrap();
    let gone = seen(vec![], &["vmss_2"]);
    // Not yet: started 30 s ago.
    let p = plan(&orphan(30), &gone, &policy, now());
    assert_eq!(p.phase, Phase::Started);
    assert_eq!(p.ended_unobserved, None);
    // 61 s after it started: Completed, with the reason.
    let ev = orphan(61);
    let p = plan(&ev, &gone, &policy, now());
    assert_eq!(p.phase, Phase::Completed);
    assert_eq!(p.ended_unobserved.as_ref().unwrap().0, "NoNodeLeft");
    let st = next_status(&ev, &gone, &p, &[], now());
    assert_eq!(st.finished_at, Some(now()));
    assert_eq!(
        cond(&st, "EndedWithoutObserver"),
        Some(("True".into(), "NoNodeLeft".into()))
    );
    // Afterwards it is over: it stays Completed (its spec still says
    // Started), claims no node, and is deleted after the retention.
    let ended = with_status(ev, st);
    assert!(is_over(&ended));
    let later = now() + chrono::Duration::hours(25);
    let p = plan(&ended, &gone, &policy, later);
    assert_eq!(p.phase, Phase::Completed);
    assert!(
        p.delete,
        "retention applies to an event ended without observer"
    );
    // A node that still maps keeps it alive.
    let here = seen(vec![node("node-2", "vmss_2", true, &["ev-1"], vec![])], &[]);
    assert_eq!(
        plan(&orphan(600), &here, &policy, now()).phase,
        Phase::Started
    );
}

#[test]
fn a_scheduled_event_whose_node_went_ends_once_not_before_and_the_orphan_time_passed() {
    let policy = Policy::parse("orphanedAfterSeconds: 60\n", "p").unwrap();
    let mut ev = with_status(
        event("Reboot", "Scheduled", &["gpu_1"]),
        ScheduledEventStatus {
            phase: Some(Phase::Draining),
            nodes: Some(vec![NodeProgress {
                name: "node-1".into(),
                vm_name: "gpu_1".into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
    );
    ev.spec.not_before = Some(now() - chrono::Duration::seconds(61));
    let gone = seen(vec![], &["gpu_1"]);
    let p = plan(&ev, &gone, &policy, now());
    assert_eq!(
        p.phase,
        Phase::Completed,
        "past NotBefore the platform ran it"
    );
    assert_eq!(p.ended_unobserved.as_ref().unwrap().0, "NoNodeLeft");
    // NotBefore ahead: it waits, and its record keeps the vanished node,
    // so that it still ends once NotBefore and the orphan time passed.
    ev.spec.not_before = Some(now() + chrono::Duration::seconds(30));
    let p = plan(&ev, &gone, &policy, now());
    assert_eq!(p.ended_unobserved, None);
    let st = next_status(&ev, &gone, &p, &[], now());
    assert_eq!(st.nodes.as_ref().unwrap()[0].name, "node-1");
    let waited = with_status(ev, st);
    let later = now() + chrono::Duration::seconds(91);
    let p = plan(&waited, &gone, &policy, later);
    assert_eq!(p.phase, Phase::Completed);
    assert_eq!(p.ended_unobserved.as_ref().unwrap().0, "NoNodeLeft");
}

#[test]
fn an_event_no_agent_has_written_for_the_ttl_ends_whatever_its_phase() {
    let policy = Policy::parse("staleAfterSeconds: 3600\n", "p").unwrap();
    // The last report an agent wrote about it, `ago` seconds ago.
    let written = |ago: i64| Observed {
        last_report: Some(now() - chrono::Duration::seconds(ago)),
        ..seen(vec![], &["elsewhere_0"])
    };
    // An ignored Freeze, seen Started 2 h ago by agents that are all gone:
    // no mapped node was ever recorded (it names foreign VMs only).
    let ev = with_status(
        event("Freeze", "Started", &["elsewhere_0"]),
        ScheduledEventStatus {
            started_at: Some(now() - chrono::Duration::hours(2)),
            ..Default::default()
        },
    );
    let policy_ignore = Policy {
        default_action: Action::Ignore,
        rules: Vec::new(),
        ..policy.clone()
    };
    let p = plan(&ev, &written(2 * 3600), &policy_ignore, now());
    assert_eq!(p.phase, Phase::Completed);
    assert_eq!(p.ended_unobserved.as_ref().unwrap().0, "NoAgentUpdate");
    // Written by an agent 10 min ago: alive.
    assert_eq!(
        plan(&ev, &written(600), &policy_ignore, now()).phase,
        Phase::Ignored
    );
    // A Scheduled event announced days ahead is not stale before its NotBefore.
    let mut far = event("Redeploy", "Scheduled", &["elsewhere_0"]);
    far.spec.not_before = Some(now() + chrono::Duration::days(3));
    assert_eq!(
        plan(&far, &written(2 * 24 * 3600), &policy, now()).ended_unobserved,
        None
    );
    // Stale and never started, NotBefore 2 h ago: the platform ran it.
    far.spec.not_before = Some(now() - chrono::Duration::hours(2));
    let p = plan(&far, &written(2 * 24 * 3600), &policy, now());
    assert_eq!(p.phase, Phase::Completed);
}

#[test]
fn an_ignored_event_that_ended_is_deleted_after_the_retention() {
    let policy = Policy {
        default_action: Action::Ignore,
        rules: Vec::new(),
        ..Policy::default()
    };
    let ev = ended("Reboot", &["vm_1"]);
    let p = plan(
        &ev,
        &seen(vec![], &[]),
        &policy,
        now() + chrono::Duration::hours(25),
    );
    assert_eq!(p.action, Action::Ignore);
    assert!(p.phase.is_final());
    assert!(p.delete);
}

#[test]
fn a_dry_run_records_what_it_would_do_and_never_an_approval_agents_send() {
    use crate::controller::decide::status::as_dry_run;
    let ev = event("Reboot", "Scheduled", &["vm_1"]);
    let obs = seen(
        vec![node("node-1", "vm_1", false, &[], vec![pod("a")])],
        &[],
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    let mut st = next_status(&ev, &obs, &p, &[], now());
    as_dry_run(&mut st, None, &p, now());
    let dry = st.dry_run.clone().unwrap();
    assert_eq!(dry.would_cordon, ["node-1"]);
    assert_eq!(dry.would_evict, ["default/a"]);
    assert!(!st.nodes.as_ref().unwrap()[0].cordoned_by_us);
    assert_eq!(cond(&st, "DryRun"), Some(("True".into(), "DryRun".into())));
    // Empty node (nothing to evict): the approval is decided, recorded in
    // dryRun only, with its first time kept.
    // (A dry run's node counts as cordoned as it would be.)
    let empty = Observed {
        dry_run: true,
        ..seen(vec![node("node-1", "vm_1", false, &[], vec![])], &[])
    };
    let before = with_status(ev.clone(), st.clone());
    let p = plan(&before, &empty, &Policy::default(), now());
    assert!(p.decide_approval.is_some());
    let mut st2 = next_status(&before, &empty, &p, &[], now());
    as_dry_run(&mut st2, before.status.as_ref(), &p, now());
    assert_eq!(
        st2.approval, None,
        "agents must never see a dry-run approval"
    );
    assert_eq!(st2.dry_run.as_ref().unwrap().would_approve_at, Some(now()));
    let again = with_status(ev, st2.clone());
    let later = now() + chrono::Duration::seconds(5);
    let p = plan(&again, &empty, &Policy::default(), later);
    let mut st3 = next_status(&again, &empty, &p, &[], later);
    as_dry_run(&mut st3, again.status.as_ref(), &p, later);
    assert_eq!(st3.dry_run.as_ref().unwrap().would_approve_at, Some(now()));
    assert_eq!(st3.approval, None);
    let dry_cond = |s: &ScheduledEventStatus| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DryRun")
            .unwrap()
            .last_transition_time
    };
    assert_eq!(
        dry_cond(&st3),
        dry_cond(&st2),
        "a steady dry run does not rewrite its condition"
    );
}

#[test]
fn unknown_imds_statuses_are_mirrored_as_started_and_bogus_spec_values_do_not_parse() {
    use crate::imds::model::EventStatus as Imds;
    assert_eq!(
        EventStatus::from(&Imds::Other("Paused".into())),
        EventStatus::Started
    );
    assert_eq!(EventStatus::from(&Imds::Scheduled), EventStatus::Scheduled);
    assert!(serde_json::from_value::<EventStatus>(serde_json::json!("Bogus")).is_err());
    assert!(serde_json::from_value::<Phase>(serde_json::json!("Approvedish")).is_err());
    assert_eq!(serde_json::to_value(Phase::Drained).unwrap(), "Drained");
    assert_eq!(
        serde_json::to_value(Action::DrainAndApprove).unwrap(),
        "DrainAndApprove"
    );
}

#[test]
fn a_doubtful_mapping_withholds_approval_though_every_node_is_drained() {
    let ev = event("Reboot", "Scheduled", &["vm_1"]);
    let mut obs = seen(
        vec![
            node("node-1", "vm_1", true, &["ev-1"], vec![]),
            node("node-2", "vm_1", true, &["ev-1"], vec![]),
        ],
        &[],
    );
    obs.doubts = vec!["VM vm_1 is claimed by 2 nodes (node-1, node-2)".into()];
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.decide_approval, None);
    assert!(
        p.approval_withheld
            .as_deref()
            .unwrap()
            .contains("claimed by 2 nodes")
    );
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(st.nodes_drained.as_deref(), Some("2/2"), "both drained");
}

/// Named VMs' agents that report different events: each node is handled on
/// its own report (the reconcile plans the dissenting ones apart), and no
/// approval is decided while they disagree.
#[test]
fn disagreeing_reports_withhold_the_approval_and_say_why() {
    let mut obs = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![])], &[]);
    obs.disagreement = vec!["node-2 reports Freeze of 5s for [vm_2]".into()];
    let ev = event("Reboot", "Scheduled", &["vm_1"]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.decide_approval, None);
    assert!(
        p.approval_withheld
            .as_deref()
            .unwrap()
            .contains("node-2 reports Freeze"),
        "{:?}",
        p.approval_withheld
    );
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(
        cond(&st, "ReportsDisagree"),
        Some(("True".into(), "OwnReportsDiffer".into()))
    );
    obs.disagreement.clear();
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert!(p.decide_approval.is_some());
}

/// The approval is decided only on a pod list taken after the cordon: the
/// pass that cordons lists the pods before its own cordon (a pod may be
/// scheduled in between), so it never counts the node drained.
#[test]
fn the_pass_that_cordons_never_decides_the_approval() {
    let ev = event("Reboot", "Scheduled", &["vm_1"]);
    let fresh = seen(vec![node("node-1", "vm_1", false, &[], vec![])], &[]);
    let p = plan(&ev, &fresh, &Policy::default(), now());
    assert!(
        matches!(p.node_writes[..], [NodeWrite::Cordon { .. }]),
        "{:?}",
        p.node_writes
    );
    assert_eq!(p.decide_approval, None);
    assert_ne!(p.phase, Phase::Drained);
    assert!(p.requeue <= Duration::from_millis(300), "{:?}", p.requeue);
    let st = next_status(&ev, &fresh, &p, &[], now());
    assert_eq!(st.nodes_drained.as_deref(), Some("0/1"));
    // The next pass sees it cordoned, with an empty pod list: drained.
    let held = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![])], &[]);
    let p = plan(&ev, &held, &Policy::default(), now());
    assert!(p.decide_approval.is_some());
    assert_eq!(p.phase, Phase::Drained);
}

/// A node that holds the event's cordon but was uncordoned by hand during
/// the event is cordoned again, and is not counted drained meanwhile.
#[test]
fn a_held_node_uncordoned_by_hand_is_cordoned_again_and_not_drained() {
    let ev = event("Reboot", "Scheduled", &["vm_1"]);
    let drained = with_status(
        ev.clone(),
        ScheduledEventStatus {
            nodes: Some(vec![NodeProgress {
                name: "node-1".into(),
                vm_name: "vm_1".into(),
                cordoned_by_us: true,
                drained_at: Some(now()),
                ..NodeProgress::default()
            }]),
            ..Default::default()
        },
    );
    let uncordoned = seen(vec![node("node-1", "vm_1", false, &["ev-1"], vec![])], &[]);
    let p = plan(&drained, &uncordoned, &Policy::default(), now());
    assert_eq!(
        p.node_writes,
        [NodeWrite::Cordon {
            node: "node-1".into(),
            holds: vec!["ev-1".into()],
        }]
    );
    assert_eq!(p.decide_approval, None);
    let st = next_status(&drained, &uncordoned, &p, &[], now());
    assert_eq!(st.nodes_drained.as_deref(), Some("0/1"));
    assert_eq!(st.nodes.unwrap()[0].drained_at, None);
}

/// A node whose own part of a multi-VM event ended (its agent no longer
/// lists it) while the event goes on elsewhere keeps its cordon for the
/// release delay, counted from when its part ended, and its record.
#[test]
fn a_node_whose_own_part_ended_is_released_only_after_the_release_delay() {
    let ev = event("Reboot", "Started", &["vm_1", "vm_2"]);
    let mut ended = node("node-1", "vm_1", true, &["ev-1"], vec![]);
    ended.ended = true;
    let live = node("node-2", "vm_2", true, &["ev-1"], vec![pod("a")]);
    let obs = seen(vec![ended, live], &[]);
    let policy = Policy::default();
    let p = plan(&ev, &obs, &policy, now());
    assert!(
        !p.node_writes.iter().any(|w| w.node() == "node-1"),
        "released at once: {:?}",
        p.node_writes
    );
    assert!(p.evictions.iter().all(|e| e.node == "node-2"));
    assert!(p.requeue <= Duration::from_secs(policy.release_delay_seconds));
    let st = next_status(&ev, &obs, &p, &[], now());
    let record = st.nodes.as_ref().unwrap();
    let one = record
        .iter()
        .find(|n| n.name == "node-1")
        .expect("its record kept");
    assert_eq!(one.ended_at, Some(now()));
    assert!(one.cordoned_by_us);
    // Within the delay: still held; after it: released.
    let ev = with_status(ev, st);
    let soon = now() + chrono::Duration::seconds(2);
    assert!(
        !plan(&ev, &obs, &policy, soon)
            .node_writes
            .iter()
            .any(|w| w.node() == "node-1")
    );
    let later = now() + Policy::seconds(policy.release_delay_seconds);
    let p = plan(&ev, &obs, &policy, later);
    assert!(
        p.node_writes.iter().any(|w| matches!(
            w,
            NodeWrite::Release { node, uncordon: true, .. } if node == "node-1"
        )),
        "{:?}",
        p.node_writes
    );
    assert_eq!(
        next_status(&ev, &obs, &p, &[], later).nodes.unwrap()[0].ended_at,
        Some(now()),
        "endedAt is kept"
    );
}

/// `ApprovalPending` reads `Accepted` only when a sender reported that IMDS
/// accepted its POST; an approval that was never sent reads `NotSent`.
#[test]
fn approval_pending_never_reads_accepted_for_an_approval_never_sent() {
    let pending = crate::api::Condition {
        observed_generation: None,
        type_: "ApprovalPending".into(),
        status: "True".into(),
        reason: "AwaitingAgent".into(),
        message: String::new(),
        last_transition_time: now(),
    };
    let obs = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![])], &[]);
    let ev = with_status(
        event("Reboot", "Started", &["vm_1"]),
        ScheduledEventStatus {
            approval: Some(decided(now(), None)),
            conditions: Some(vec![pending.clone()]),
            ..Default::default()
        },
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(
        cond(&st, "ApprovalPending"),
        Some(("False".into(), "NotSent".into()))
    );
    let ev = with_status(
        event("Reboot", "Started", &["vm_1"]),
        ScheduledEventStatus {
            approval: Some(decided(now(), Some("Accepted"))),
            conditions: Some(vec![pending]),
            ..Default::default()
        },
    );
    let p = plan(&ev, &obs, &Policy::default(), now());
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(
        cond(&st, "ApprovalPending"),
        Some(("False".into(), "Accepted".into()))
    );
}

/// An event that left IMDS after its `NotBefore` ran (the platform starts
/// it then at the latest), even unseen and unapproved: `Completed`, not
/// `Cancelled`; one that left before it was cancelled.
#[test]
fn an_event_gone_after_its_not_before_ran_and_one_gone_before_was_cancelled() {
    let obs = seen(vec![], &[]);
    let mut ev = event("Reboot", "Completed", &["vm_1"]);
    ev.spec.not_before = Some(now() - chrono::Duration::seconds(10));
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.phase, Phase::Completed);
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(
        cond(&st, "CompletedUnobserved"),
        Some(("True".into(), "NotBeforePassed".into()))
    );
    ev.spec.not_before = Some(now() + chrono::Duration::seconds(10));
    assert_eq!(
        plan(&ev, &obs, &Policy::default(), now()).phase,
        Phase::Cancelled
    );
}

/// A node deleted from the cluster (its VM gone) keeps its record, marked
/// `deletedAt`, and leaves the drained count.
#[test]
fn a_deleted_node_keeps_its_record_and_leaves_the_drained_count() {
    let ev = with_status(
        event("Reboot", "Started", &["vm_1", "vm_2"]),
        ScheduledEventStatus {
            nodes: Some(vec![
                NodeProgress {
                    name: "node-1".into(),
                    vm_name: "vm_1".into(),
                    cordoned_by_us: true,
                    ..NodeProgress::default()
                },
                NodeProgress {
                    name: "node-2".into(),
                    vm_name: "vm_2".into(),
                    cordoned_by_us: true,
                    drained_at: Some(now()),
                    ..NodeProgress::default()
                },
            ]),
            ..Default::default()
        },
    );
    let obs = Observed {
        deleted: vec!["node-1".into()],
        ..seen(vec![node("node-2", "vm_2", true, &["ev-1"], vec![])], &[])
    };
    let p = plan(&ev, &obs, &Policy::default(), now());
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(st.nodes_drained.as_deref(), Some("1/1"));
    let one = st
        .nodes
        .iter()
        .flatten()
        .find(|n| n.name == "node-1")
        .expect("its record kept");
    assert_eq!(one.deleted_at, Some(now()));
    assert!(one.cordoned_by_us);
}

/// An event naming `n` VMs, each a node of the cluster cordoned for it with
/// `pods` terminating pods (the largest record a node can have), except
/// the nodes `drained` says are empty.
fn fleet(n: usize, pods: usize, drained: impl Fn(usize) -> bool) -> (ScheduledEvent, Observed) {
    let vm = |i: usize| format!("aks-nodepool1-12345678-vmss_{i}");
    let resources: Vec<String> = (0..n).map(vm).collect();
    let refs: Vec<&str> = resources.iter().map(String::as_str).collect();
    let ev = event("Reboot", "Scheduled", &refs);
    let nodes = (0..n)
        .map(|i| {
            let on_it = if drained(i) { 0 } else { pods };
            let pods = (0..on_it)
                .map(|p| PodInfo {
                    terminating: Some(Terminating {
                        deadline: now() + chrono::Duration::seconds(30),
                        finalizers: Vec::new(),
                    }),
                    ..pod(&format!("web-6f999b7fc5-{i:05}{p:02}"))
                })
                .collect();
            node(
                &format!("aks-nodepool1-12345678-vmss{i:06x}"),
                &vm(i),
                true,
                &["ev-1"],
                pods,
            )
        })
        .collect();
    (ev, seen(nodes, &[]))
}

/// An event naming 10,000 VMs, every node with
/// terminating pods, gives an object (spec and status) far under etcd's
/// 1.5 MiB (under 600 KiB): 500 records listed, the rest counted, every
/// message bounded.
#[test]
fn an_event_naming_ten_thousand_vms_stays_far_under_the_object_limit() {
    use crate::controller::decide::status::{NODE_RECORDS_LISTED, next};
    use crate::text::MESSAGE_LIMIT;

    let (mut ev, obs) = fleet(10_000, 10, |_| false);
    let p = plan(&ev, &obs, &Policy::default(), now());
    let out = next(&ev, &obs, &p, &[], now());
    let st = &out.status;
    assert_eq!(st.nodes.as_ref().unwrap().len(), NODE_RECORDS_LISTED);
    assert_eq!(out.not_listed.len(), 10_000 - NODE_RECORDS_LISTED);
    let counted = st.nodes_not_listed.clone().expect("counted");
    let beyond = i32::try_from(10_000 - NODE_RECORDS_LISTED).unwrap();
    assert_eq!(counted.count, beyond);
    assert_eq!(counted.drained, 0);
    assert_eq!(st.nodes_drained.as_deref(), Some("0/10000"));
    for c in st.conditions.iter().flatten() {
        assert!(
            c.message.len() <= MESSAGE_LIMIT,
            "{}: {}",
            c.type_,
            c.message.len()
        );
    }
    assert!(
        cond(st, "Drained") == Some(("False".into(), "PodsRemaining".into())),
        "{:?}",
        st.conditions
    );
    ev.status = Some(st.clone());
    let size = serde_json::to_vec(&ev).expect("json").len();
    eprintln!("10,000 VMs: {size} bytes");
    assert!(size < 600 * 1024, "{size} bytes for 10,000 VMs");

    // The next pass: the even nodes drained, three odd ones whose own part
    // ended (their release pending). Those three are listed first, then
    // the nodes still draining; the counts cover every node.
    let (_, mut obs) = fleet(10_000, 10, |i| i % 2 == 0);
    for i in [9_001, 9_003, 9_005] {
        obs.nodes[i].ended = true;
        obs.nodes[i].pods.clear();
    }
    let p = plan(&ev, &obs, &Policy::default(), now());
    let out = next(&ev, &obs, &p, &[], now());
    let st = &out.status;
    let listed = st.nodes.as_ref().unwrap();
    assert_eq!(listed.len(), NODE_RECORDS_LISTED);
    let ended: Vec<&str> = listed[..3].iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        ended,
        [
            obs.nodes[9_001].name.as_str(),
            obs.nodes[9_003].name.as_str(),
            obs.nodes[9_005].name.as_str()
        ]
    );
    assert!(listed[..3].iter().all(|n| n.ended_at == Some(now())));
    assert!(listed[3..].iter().all(|n| n.drained_at.is_none()));
    assert_eq!(st.nodes_drained.as_deref(), Some("5000/10000"));
    let counted = st.nodes_not_listed.clone().expect("counted");
    assert_eq!((counted.count, counted.drained), (beyond, 5_000));
    assert_eq!(counted.cordoned_by_us, beyond);
    ev.status = Some(st.clone());
    let size = serde_json::to_vec(&ev).expect("json").len();
    eprintln!("10,000 VMs: {size} bytes");
    assert!(size < 600 * 1024, "{size} bytes for 10,000 VMs");

    // A pass that keeps the released node's `endedAt` finds it listed.
    let out = next(&ev, &obs, &p, &[], now() + chrono::Duration::seconds(5));
    let again = out.status.nodes.unwrap();
    assert_eq!(
        again[0].ended_at,
        Some(now()),
        "endedAt kept from the record"
    );
}

/// An event of fewer than the bound lists every record in its order.
#[test]
fn an_event_within_the_bound_lists_every_record_in_order() {
    let (ev, obs) = fleet(50, 2, |i| i % 3 == 0);
    let p = plan(&ev, &obs, &Policy::default(), now());
    let st = crate::controller::decide::status::next(&ev, &obs, &p, &[], now()).status;
    let names: Vec<&str> = st.nodes.iter().flatten().map(|n| n.name.as_str()).collect();
    let observed: Vec<&str> = obs.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, observed);
    assert_eq!(st.nodes_not_listed, None);
}

// Workloads take part (notices, acknowledgements).

fn participant(name: &str, acknowledges: bool, annotations: &[(&str, &str)]) -> Arc<Participant> {
    Arc::new(Participant {
        namespace: "default".into(),
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

const NOTICE: (&str, &str) = ("notice.forewarn.dev/ev-1", "eventId=EV-1 type=Freeze");
const ACK: (&str, &str) = ("ack.forewarn.dev/ev-1", "EV-1");

fn short_freeze() -> ScheduledEvent {
    let mut ev = event("Freeze", "Scheduled", &["vm_1"]);
    ev.spec.duration_seconds = 5;
    ev
}

fn with_participants(mut n: ObservedNode, p: Vec<Arc<Participant>>) -> ObservedNode {
    n.participants = p;
    n
}

/// A short Freeze is approved at once, but only once the notice of every
/// pod that takes part is stored: the notice goes out before the approval.
#[test]
fn an_approve_at_once_event_waits_for_its_notices_to_be_stored() {
    let ev = short_freeze();
    let unnoticed = seen(
        vec![with_participants(
            node("node-1", "vm_1", false, &[], vec![]),
            vec![participant("web", false, &[])],
        )],
        &[],
    );
    let p = plan(&ev, &unnoticed, &Policy::default(), now());
    assert_eq!(p.action, Action::Approve);
    assert_eq!(
        p.decide_approval, None,
        "decided before the notice was stored"
    );
    assert!(p.requeue <= Duration::from_millis(500), "{:?}", p.requeue);
    let st = next_status(&ev, &unnoticed, &p, &[], now());
    assert_eq!(
        cond(&st, "AcknowledgementPending"),
        Some(("True".into(), "NoticePending".into()))
    );
    let ack = st.acknowledgements.clone().unwrap();
    assert_eq!(ack.notified, "0/1");
    assert_eq!(ack.acknowledged, None, "no pod asked to be waited for");
    assert_eq!(ack.since, Some(now()));

    let ev = with_status(ev, st);
    let noticed = seen(
        vec![with_participants(
            node("node-1", "vm_1", false, &[], vec![]),
            vec![participant("web", false, &[NOTICE])],
        )],
        &[],
    );
    let later = now() + chrono::Duration::seconds(1);
    let p = plan(&ev, &noticed, &Policy::default(), later);
    assert!(p.decide_approval.is_some());
    let st = next_status(&ev, &noticed, &p, &[], later);
    assert_eq!(
        cond(&st, "AcknowledgementPending"),
        Some(("False".into(), "Notified".into()))
    );
    assert_eq!(st.acknowledgements.unwrap().notified, "1/1");
}

/// A pod that asked to be waited for holds the approval until it
/// acknowledges the EventId; then the approval is decided.
#[test]
fn the_approval_waits_for_the_pods_acknowledgement() {
    let ev = short_freeze();
    let obs = |acked: bool| {
        let mut a = vec![NOTICE];
        if acked {
            a.push(ACK);
        }
        seen(
            vec![with_participants(
                node("node-1", "vm_1", false, &[], vec![]),
                vec![
                    participant("db-0", true, &a),
                    participant("web", false, &[NOTICE]),
                ],
            )],
            &[],
        )
    };
    let p = plan(&ev, &obs(false), &Policy::default(), now());
    assert_eq!(p.decide_approval, None);
    // Woken by the acknowledgement itself; else at the deadline.
    assert_eq!(p.requeue, Duration::from_secs(10));
    let st = next_status(&ev, &obs(false), &p, &[], now());
    let a = st.acknowledgements.clone().unwrap();
    assert_eq!(a.acknowledged.as_deref(), Some("0/1"));
    assert_eq!(a.pending, ["default/db-0"]);
    assert_eq!(a.pending_count, 1);
    assert_eq!(a.deadline, Some(now() + chrono::Duration::seconds(300)));
    assert_eq!(
        cond(&st, "AcknowledgementPending"),
        Some(("True".into(), "AwaitingPods".into()))
    );

    let ev = with_status(ev, st);
    let later = now() + chrono::Duration::seconds(3);
    let p = plan(&ev, &obs(true), &Policy::default(), later);
    assert!(p.decide_approval.is_some());
    let st = next_status(&ev, &obs(true), &p, &[], later);
    let a = st.acknowledgements.clone().unwrap();
    assert_eq!(a.acknowledged.as_deref(), Some("1/1"));
    assert_eq!(a.acknowledged_pods, ["default/db-0"]);
    assert!(a.pending.is_empty() && a.timed_out_at.is_none());
    assert_eq!(
        cond(&st, "AcknowledgementPending"),
        Some(("False".into(), "Acknowledged".into()))
    );
    // The pod evicted since still counts as acknowledged; the account stays.
    let ev = with_status(ev, st);
    let gone = seen(vec![node("node-1", "vm_1", false, &[], vec![])], &[]);
    let p = plan(&ev, &gone, &Policy::default(), later);
    let st = next_status(&ev, &gone, &p, &[], later);
    assert_eq!(
        st.acknowledgements.clone().unwrap().acknowledged.as_deref(),
        Some("1/1")
    );
    assert_eq!(
        cond(&st, "AcknowledgementPending"),
        Some(("False".into(), "Acknowledged".into()))
    );
}

/// A pod that never answers holds the approval until the type's timeout,
/// then forewarn goes on without it and records the timeout once.
#[test]
fn a_silent_pod_is_waited_for_until_the_timeout_then_named() {
    let ev = short_freeze();
    let policy = Policy {
        acknowledge_timeout_seconds: 30,
        ..Policy::default()
    };
    let obs = seen(
        vec![with_participants(
            node("node-1", "vm_1", false, &[], vec![]),
            vec![participant("db-0", true, &[NOTICE])],
        )],
        &[],
    );
    let p = plan(&ev, &obs, &policy, now());
    assert_eq!(p.decide_approval, None);
    let st = next_status(&ev, &obs, &p, &[], now());
    let ev = with_status(ev, st);
    let before = now() + chrono::Duration::seconds(29);
    let p = plan(&ev, &obs, &policy, before);
    assert_eq!(p.decide_approval, None);
    assert_eq!(
        p.requeue,
        Duration::from_secs(1),
        "looks again at the deadline"
    );
    let after = now() + chrono::Duration::seconds(30);
    let p = plan(&ev, &obs, &policy, after);
    assert!(p.decide_approval.is_some(), "not decided at the timeout");
    let st = next_status(&ev, &obs, &p, &[], after);
    let a = st.acknowledgements.clone().unwrap();
    assert_eq!(a.timed_out_at, Some(after));
    assert_eq!(a.pending, ["default/db-0"]);
    assert_eq!(
        cond(&st, "AcknowledgementPending"),
        Some(("False".into(), "TimedOut".into()))
    );
    let msg = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "AcknowledgementPending")
        .map(|c| c.message.clone())
        .unwrap();
    assert!(msg.contains("default/db-0"), "{msg}");
    // Recorded once.
    let ev = with_status(ev, st);
    let p = plan(&ev, &obs, &policy, after + chrono::Duration::seconds(5));
    let st = next_status(&ev, &obs, &p, &[], after + chrono::Duration::seconds(5));
    assert_eq!(st.acknowledgements.unwrap().timed_out_at, Some(after));
}

/// In a drain, a pod that asked to be waited for is evicted only once it
/// acknowledged (by default); the others go at once. With the policy's
/// evictAfterAcknowledgement off it goes with them.
#[test]
fn a_waited_for_pod_is_evicted_after_its_acknowledgement() {
    let ev = event("Reboot", "Scheduled", &["vm_1"]);
    let obs = |acked: bool| {
        let mut a = vec![("notice.forewarn.dev/ev-1", "eventId=EV-1")];
        if acked {
            a.push(ACK);
        }
        let mut db = pod("db-0");
        db.uid = "uid-db-0".into();
        seen(
            vec![with_participants(
                node("node-1", "vm_1", true, &["ev-1"], vec![db, pod("web")]),
                vec![participant("db-0", true, &a)],
            )],
            &[],
        )
    };
    let evicted =
        |p: &Plan| -> Vec<String> { p.evictions.iter().map(|e| e.pod.name.clone()).collect() };
    let p = plan(&ev, &obs(false), &Policy::default(), now());
    assert_eq!(evicted(&p), ["web"]);
    let p = plan(&ev, &obs(true), &Policy::default(), now());
    assert_eq!(evicted(&p), ["db-0", "web"]);
    let eager = Policy::parse("evictAfterAcknowledgement: false\n", "p").unwrap();
    let p = plan(&ev, &obs(false), &eager, now());
    assert_eq!(evicted(&p), ["db-0", "web"]);
    // Past the drain deadline (NotBefore minus the margin) nothing waits.
    let late = t("2026-11-21T10:09:56Z");
    let p = plan(&ev, &obs(false), &Policy::default(), late);
    assert_eq!(evicted(&p), ["db-0", "web"]);
}

/// An event the policy only cordons waits for nobody: nothing would wait.
#[test]
fn a_cordon_only_event_waits_for_no_acknowledgement() {
    let ev = event("Reboot", "Scheduled", &["vm_1"]);
    let policy = Policy::parse("defaultAction: Cordon\n", "p").unwrap();
    let obs = seen(
        vec![with_participants(
            node("node-1", "vm_1", false, &[], vec![]),
            vec![participant("db-0", true, &[])],
        )],
        &[],
    );
    let p = plan(&ev, &obs, &policy, now());
    assert!(p.acknowledgement.is_none());
    let st = next_status(&ev, &obs, &p, &[], now());
    assert!(st.acknowledgements.is_none());
    assert_eq!(cond(&st, "AcknowledgementPending"), None);
}

/// A dry run writes no notice, so it waits for none.
#[test]
fn a_dry_run_waits_for_no_notice() {
    let ev = short_freeze();
    let mut obs = seen(
        vec![with_participants(
            node("node-1", "vm_1", false, &[], vec![]),
            vec![participant("db-0", true, &[])],
        )],
        &[],
    );
    obs.dry_run = true;
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert!(p.decide_approval.is_some());
    assert!(p.acknowledgement.is_none());
}

#[test]
fn a_user_reboot_is_approved_at_once_when_the_policy_says_so() {
    let policy = Policy::parse("rules:\n- {eventSource: User, action: Approve}\n", "p").unwrap();
    let mut ev = event("Reboot", "Scheduled", &["vm_1"]);
    ev.spec.event_source = "User".into();
    let obs = seen(
        vec![node("node-1", "vm_1", false, &[], vec![pod("a")])],
        &[],
    );
    let p = plan(&ev, &obs, &policy, now());
    assert_eq!(p.action, Action::Approve);
    assert_eq!(
        p.decide_approval.as_deref(),
        Some("policy approves User Reboot events (DurationInSeconds -1) at once")
    );
    assert!(p.node_writes.is_empty() && p.evictions.is_empty(), "{p:?}");
    // A platform Reboot is still drained first.
    ev.spec.event_source = "Platform".into();
    let p = plan(&ev, &obs, &policy, now());
    assert_eq!(p.action, Action::DrainAndApprove);
    assert_eq!(p.decide_approval, None);
}

/// A node the event's status records, as `Observed::recorded` has it.
fn recorded(name: &str, ready: Option<bool>, tainted: bool) -> out_of_service::RecordedNode {
    out_of_service::RecordedNode {
        name: name.into(),
        ready,
        tainted,
    }
}

/// A `type_` event that started and left IMDS a minute ago, its status
/// recording `nodes` (node-N mapped from vm_N).
fn ran_and_ended(type_: &str, nodes: &[&str]) -> ScheduledEvent {
    let vms: Vec<String> = nodes.iter().map(|n| n.replace("node", "vm")).collect();
    let vms: Vec<&str> = vms.iter().map(String::as_str).collect();
    with_status(
        event(type_, "Completed", &vms),
        ScheduledEventStatus {
            started_at: Some(now() - chrono::Duration::minutes(3)),
            finished_at: Some(now() - chrono::Duration::minutes(1)),
            nodes: Some(
                nodes
                    .iter()
                    .zip(&vms)
                    .map(|(n, vm)| NodeProgress {
                        name: (*n).into(),
                        vm_name: (*vm).into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            appearance: Some(1),
            ..Default::default()
        },
    )
}

fn out_of_service_on() -> Policy {
    Policy::parse("outOfServiceTaint: true\n", "p").unwrap()
}

/// The out-of-service taint goes only on a node that is not Ready (its
/// `Ready` condition `False` or `Unknown`), of a `Terminate` or `Preempt`
/// that ran and ended, when the policy asks: never on a Ready node or one
/// not reported on, never on one someone else tainted so already, never
/// for another event type, a cancelled or a live event.
#[test]
fn the_out_of_service_taint_goes_only_on_not_ready_nodes_of_a_terminate_or_preempt_that_ran() {
    let nodes = ["node-1", "node-2", "node-3", "node-4"];
    let obs = Observed {
        recorded: vec![
            recorded("node-1", Some(false), false),
            recorded("node-2", Some(true), false),
            recorded("node-3", None, false),
            // Someone else's out-of-service taint: left as it is.
            recorded("node-4", Some(false), true),
        ],
        ..seen(vec![], &[])
    };
    let on = out_of_service_on();
    for type_ in ["Terminate", "Preempt"] {
        let p = plan(&ran_and_ended(type_, &nodes), &obs, &on, now());
        assert_eq!(p.phase, Phase::Completed);
        assert_eq!(p.out_of_service, vec!["node-1".to_string()], "{type_}");
        // Off by default.
        let p = plan(
            &ran_and_ended(type_, &nodes),
            &obs,
            &Policy::default(),
            now(),
        );
        assert!(p.out_of_service.is_empty(), "{type_} with the policy off");
    }
    for type_ in ["Reboot", "Redeploy", "Freeze"] {
        let p = plan(&ran_and_ended(type_, &nodes), &obs, &on, now());
        assert!(p.out_of_service.is_empty(), "{type_} leaves its VMs");
    }
    // Left IMDS without having run: cancelled, the VM is still there.
    let mut cancelled = ran_and_ended("Terminate", &nodes);
    cancelled.status.as_mut().unwrap().started_at = None;
    let p = plan(&cancelled, &obs, &on, now());
    assert_eq!(p.phase, Phase::Cancelled);
    assert!(p.out_of_service.is_empty());
    // Still live (Started, its agents reporting): not yet.
    let mut live = ran_and_ended("Terminate", &nodes);
    live.spec.event_status = EventStatus::Started;
    live.status.as_mut().unwrap().finished_at = None;
    let p = plan(&live, &obs, &on, now());
    assert_ne!(p.phase, Phase::Completed);
    assert!(p.out_of_service.is_empty());
    // Ignored by the policy: recorded only.
    let ignore = Policy {
        default_action: Action::Ignore,
        rules: Vec::new(),
        ..on.clone()
    };
    let p = plan(&ran_and_ended("Terminate", &nodes), &obs, &ignore, now());
    assert!(p.out_of_service.is_empty());
}

/// The status records the taint on the node's entry; the node is then
/// never tainted again for the event (it came back Ready and forewarn
/// took the taint back: a later outage is not this event's). The pass
/// that taints deletes nothing, and while a node may still go not Ready
/// the event is looked at every 15 s, for ten minutes after it ended.
#[test]
fn the_out_of_service_taint_is_recorded_put_once_and_waited_for_a_while() {
    let on = out_of_service_on();
    let ev = ran_and_ended("Terminate", &["node-1", "node-2"]);
    let obs = Observed {
        recorded: vec![
            recorded("node-1", Some(false), false),
            recorded("node-2", Some(true), false),
        ],
        ..seen(vec![], &[])
    };
    let p = plan(&ev, &obs, &on, now());
    assert_eq!(p.out_of_service, vec!["node-1".to_string()]);
    assert!(p.requeue <= Duration::from_secs(1));
    let st = next_status(&ev, &obs, &p, &[], now());
    let at = |st: &ScheduledEventStatus, n: &str| {
        st.nodes
            .iter()
            .flatten()
            .find(|r| r.name == n)
            .unwrap()
            .out_of_service_at
    };
    assert_eq!(at(&st, "node-1"), Some(now()));
    assert_eq!(at(&st, "node-2"), None, "a Ready node is not tainted");
    // In a dry run nothing is written, nor recorded.
    let dry = Observed {
        dry_run: true,
        ..obs.clone()
    };
    assert_eq!(at(&next_status(&ev, &dry, &p, &[], now()), "node-1"), None);

    // Next pass: node-1 was untainted since (Ready again, then down once
    // more): not tainted again. node-2 still Ready: looked at in 15 s.
    let ev = with_status(ev, st);
    let obs = Observed {
        recorded: vec![
            recorded("node-1", Some(false), false),
            recorded("node-2", Some(true), false),
        ],
        ..seen(vec![], &[])
    };
    let later = now() + chrono::Duration::seconds(30);
    let p = plan(&ev, &obs, &on, later);
    assert!(p.out_of_service.is_empty());
    assert_eq!(p.requeue, Duration::from_secs(15));
    // Ten minutes after the end the poll stops; a node found not Ready
    // by a later pass is still tainted, and the object is kept for it
    // past its retention.
    let p = plan(&ev, &obs, &on, now() + chrono::Duration::minutes(10));
    assert!(p.requeue > Duration::from_secs(15), "{:?}", p.requeue);
    let down = Observed {
        recorded: vec![recorded("node-2", Some(false), false)],
        ..seen(vec![], &[])
    };
    let past_retention = now() + chrono::Duration::hours(25);
    let p = plan(&ev, &down, &on, past_retention);
    assert_eq!(p.out_of_service, vec!["node-2".to_string()]);
    assert!(!p.delete);
    assert!(plan(&ev, &obs, &on, past_retention).delete);
}

/// An event the controller ends itself, no agent being left to see it
/// leave IMDS (`NoAgentUpdate` here), taints as one seen to leave.
#[test]
fn an_event_ended_unobserved_taints_its_not_ready_nodes_out_of_service() {
    let on = Policy::parse("outOfServiceTaint: true\nstaleAfterSeconds: 3600\n", "p").unwrap();
    let mut ev = ran_and_ended("Preempt", &["node-1"]);
    ev.spec.event_status = EventStatus::Started;
    let status = ev.status.as_mut().unwrap();
    status.finished_at = None;
    status.started_at = Some(now() - chrono::Duration::hours(2));
    let obs = Observed {
        last_report: Some(now() - chrono::Duration::hours(2)),
        recorded: vec![recorded("node-1", Some(false), false)],
        // The Node outlived its VM: it still maps, so the agents' silence
        // ends the event.
        ..seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![])], &[])
    };
    let p = plan(&ev, &obs, &on, now());
    assert_eq!(p.ended_unobserved.as_ref().unwrap().0, "NoAgentUpdate");
    assert_eq!(p.phase, Phase::Completed);
    assert_eq!(p.out_of_service, vec!["node-1".to_string()]);
}

/// A doubt that appears after the approval was decided (a node of unknown
/// VM whose agent now lists the event) takes the decision back while IMDS
/// has not accepted it; once accepted, it stands.
#[test]
fn a_doubt_after_the_decision_takes_the_approval_back() {
    let ev = event("Reboot", "Scheduled", &["vm_1"]);
    let mut doubted = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![])], &[]);
    doubted
        .doubts
        .push("the VM of node node-2 is unknown (no providerID, no VirtualMachineReport) while its agent lists the event".into());
    let first = now() - chrono::Duration::seconds(30);
    let waiting = with_status(
        ev.clone(),
        ScheduledEventStatus {
            approval: Some(decided(first, None)),
            ..Default::default()
        },
    );
    let p = plan(&waiting, &doubted, &Policy::default(), now());
    assert!(p.revoke_approval.is_some(), "{p:?}");
    let st = next_status(&waiting, &doubted, &p, &[], now());
    assert_eq!(st.approval, None, "the decision is dropped from the status");
    assert_eq!(
        cond(&st, "ApprovalWithheld").map(|c| c.0),
        Some("True".into())
    );
    // The next pass, with the doubt still there, decides nothing.
    let revoked = with_status(ev.clone(), st);
    let p = plan(&revoked, &doubted, &Policy::default(), now());
    assert_eq!(p.decide_approval, None);
    // Accepted by IMDS before the doubt: nothing to take back.
    let accepted = with_status(
        ev,
        ScheduledEventStatus {
            approval: Some(decided(first, Some("Accepted"))),
            ..Default::default()
        },
    );
    let p = plan(&accepted, &doubted, &Policy::default(), now());
    assert_eq!(p.revoke_approval, None);
}
