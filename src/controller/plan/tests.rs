use super::*;
use crate::crd::ScheduledEventSpec;

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn now() -> DateTime<Utc> {
    t("2026-11-21T10:00:00Z")
}

fn event(type_: &str, status: &str, resources: &[&str]) -> ScheduledEvent {
    let mut ev = ScheduledEvent::new(
        "ev-1",
        ScheduledEventSpec {
            event_id: "EV-1".into(),
            event_type: type_.into(),
            event_status: status.into(),
            event_source: "Platform".into(),
            resource_type: "VirtualMachine".into(),
            resources: resources.iter().map(|s| s.to_string()).collect(),
            not_before: (status == "Scheduled").then(|| t("2026-11-21T10:10:00Z")),
            duration_seconds: -1,
            description: String::new(),
            appearance: 1,
        },
    );
    ev.status = None;
    ev
}

fn pod(name: &str) -> PodInfo {
    PodInfo {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        terminating: false,
        grace_seconds: 30,
    }
}

fn node(name: &str, vm: &str, cordoned: bool, holds: &[&str], pods: Vec<PodInfo>) -> ObservedNode {
    ObservedNode {
        name: name.into(),
        vm_name: vm.into(),
        cordoned,
        holds: holds.iter().map(|s| s.to_string()).collect(),
        pods,
    }
}

fn seen(nodes: Vec<ObservedNode>, unmapped: &[&str]) -> Observed {
    Observed {
        nodes,
        unmapped: unmapped.iter().map(|s| s.to_string()).collect(),
    }
}

fn with_status(mut ev: ScheduledEvent, status: ScheduledEventStatus) -> ScheduledEvent {
    ev.status = Some(status);
    ev
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
    assert_eq!(p.phase, Phase::Approved);
    assert!(p.node_writes.is_empty());
    let st = next_status(&ev, &all, &p, &[], now());
    assert_eq!(st.approval.unwrap().decided_at, Some(now()));
    assert_eq!(st.nodes_drained.as_deref(), Some("2/2"));
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
    let ev = event("Reboot", "Completed", &["vm_1"]);
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
    let ev = event("Reboot", "Completed", &["vm_1"]);
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
    assert_eq!(p.phase, Phase::Approved);
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
    assert_eq!(p.evictions[0].grace_seconds, 0);
}

#[test]
fn terminating_pods_are_waited_for_not_evicted_again() {
    let ev = event("Redeploy", "Scheduled", &["vm_1"]);
    let mut a = pod("a");
    a.terminating = true;
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
        "a".to_string(),
        EvictionOutcome::Blocked("PodDisruptionBudget default/web".into()),
    )];
    let st = next_status(&ev, &obs, &p, &outcomes, now());
    assert_eq!(st.phase.as_deref(), Some("Draining"));
    assert_eq!(
        st.nodes.unwrap()[0].blocked_by.as_deref(),
        Some("PodDisruptionBudget default/web")
    );
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
    assert_eq!(p.requeue, Duration::from_secs(23 * 3600));
}

#[test]
fn controller_status_never_carries_the_agents_approval_fields() {
    let ev = with_status(
        event("Reboot", "Scheduled", &["vm_1"]),
        ScheduledEventStatus {
            approval: Some(Approval {
                decided_at: Some(now()),
                reason: Some("r".into()),
                sent_at: Some(now()),
                sent_by: Some("node-1".into()),
                result: Some("Failed: timeout".into()),
            }),
            ..Default::default()
        },
    );
    let obs = seen(vec![node("node-1", "vm_1", true, &["ev-1"], vec![])], &[]);
    let p = plan(&ev, &obs, &Policy::default(), now());
    assert_eq!(p.decide_approval, None, "decided once only");
    let a = next_status(&ev, &obs, &p, &[], now()).approval.unwrap();
    assert_eq!(a.decided_at, Some(now()));
    assert!(a.sent_at.is_none() && a.sent_by.is_none() && a.result.is_none());
}
