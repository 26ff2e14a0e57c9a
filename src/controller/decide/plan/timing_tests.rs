//! The per-rule drain lead time and the deadline policy, and what the acknowledgements do at the deadline.

use super::*;
use crate::api::ScheduledEventStatus;
use crate::controller::decide::status::next_status;
use crate::fixtures;

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn now() -> DateTime<Utc> {
    t("2026-11-21T10:00:00Z")
}

/// A `Scheduled` event of `type_` naming `resources`, `NotBefore` in
/// `in_secs` seconds.
fn event(type_: &str, resources: &[&str], in_secs: i64) -> ScheduledEvent {
    ScheduledEvent::new(
        "ev-1",
        fixtures::spec("EV-1")
            .event_type(type_)
            .vms(resources.iter().copied())
            .not_before(now() + chrono::Duration::seconds(in_secs))
            .build(),
    )
}

fn pod(name: &str) -> Arc<PodInfo> {
    Arc::new(PodInfo {
        namespace: "shop".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        managed: true,
        grace_seconds: 30,
        ..PodInfo::default()
    })
}

/// `node-1`, the VM `vm_1`, cordoned for `ev-1` when `held`, with `pods`.
fn node(held: bool, pods: &[&str]) -> ObservedNode {
    ObservedNode {
        name: "node-1".into(),
        vm_name: "vm_1".into(),
        cordoned: held,
        holds: if held { vec!["ev-1".into()] } else { vec![] },
        pods: pods.iter().map(|p| pod(p)).collect(),
        ..ObservedNode::default()
    }
}

fn seen(n: ObservedNode) -> Observed {
    Observed {
        nodes: vec![n],
        ..Observed::default()
    }
}

fn condition(st: &ScheduledEventStatus, type_: &str) -> Option<(String, String, String)> {
    st.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn policy(yaml: &str) -> Policy {
    Policy::parse(yaml, "test").unwrap_or_else(|e| panic!("{e}"))
}

const CASE_STUDY: &str =
    "rules:\n- {eventType: Reboot, action: DrainAndApprove, drainLeadTimeSeconds: 30}\n";

#[test]
fn a_rules_lead_time_holds_the_cordon_until_not_before_minus_it() {
    let p = policy(CASE_STUDY);
    let reboot = event("Reboot", &["vm_1"], 120);
    let obs = seen(node(false, &["a"]));
    let plan_now = plan(&reboot, &obs, &p, now());
    assert_eq!(plan_now.phase, Phase::Pending);
    assert!(plan_now.node_writes.is_empty() && plan_now.evictions.is_empty());
    let start = now() + chrono::Duration::seconds(90);
    assert_eq!(plan_now.drain_starts_at, Some(start));
    assert_eq!(plan_now.requeue, Duration::from_secs(90));
    let st = next_status(&reboot, &obs, &plan_now, &[], now());
    let (status, reason, message) = condition(&st, "DrainScheduled").expect("DrainScheduled");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "WaitingForLeadTime")
    );
    assert!(
        message.contains(&start.to_rfc3339()) && message.contains("(30s"),
        "{message}"
    );
    // One second early: still waiting; at NotBefore - 30 s: cordon and drain.
    let early = plan(&reboot, &obs, &p, start - chrono::Duration::seconds(1));
    assert_eq!(early.phase, Phase::Pending);
    let at = plan(&reboot, &obs, &p, start);
    assert_eq!(at.phase, Phase::Draining);
    assert!(matches!(at.node_writes[..], [NodeWrite::Cordon { .. }]));
    // Another type, no rule of its own: the policy's hour, so at once.
    let redeploy = event("Redeploy", &["vm_1"], 120);
    let other = plan(&redeploy, &obs, &p, now());
    assert_eq!(other.phase, Phase::Draining);
    assert_eq!(other.drain_starts_at, None);
}

#[test]
fn a_rules_timings_fall_back_to_the_policys() {
    let p = policy(
        "drainLeadTimeSeconds: 600\nonDeadline: Approve\nrules:\n- {eventType: Reboot, action: DrainAndApprove, drainLeadTimeSeconds: 30}\n- {eventType: Redeploy, action: Drain}\n- {eventType: Preempt, action: DrainAndApprove, onDeadline: Hold}\n",
    );
    let h = |ty: &str| p.handling(&EventType::from(ty), "Platform", -1);
    assert_eq!(
        h("Reboot"),
        crate::policy::Handling {
            action: Action::DrainAndApprove,
            drain_lead_time_seconds: 30,
            on_deadline: DeadlineAction::Approve,
        }
    );
    assert_eq!(h("Redeploy").drain_lead_time_seconds, 600);
    assert_eq!(h("Preempt").on_deadline, DeadlineAction::Hold);
    assert_eq!(h("Terminate").action, Action::DrainAndApprove);
    assert_eq!(h("Terminate").drain_lead_time_seconds, 600);
    assert_eq!(Policy::default().on_deadline, DeadlineAction::Hold);
}

#[test]
fn a_rules_timings_are_bounded_like_the_policys() {
    let refused = |yaml: &str, says: &str| {
        let e = Policy::parse(yaml, "p").expect_err(yaml).to_string();
        assert!(e.contains("rule 0") && e.contains(says), "{yaml}: {e}");
    };
    refused(
        "rules:\n- {eventType: Reboot, action: DrainAndApprove, drainLeadTimeSeconds: 4}\n",
        "shorter than drainMarginSeconds 5",
    );
    refused(
        "rules:\n- {eventType: Reboot, action: Drain, drainLeadTimeSeconds: 2419201}\n",
        "four weeks",
    );
    refused(
        "rules:\n- {eventType: Freeze, action: Approve, drainLeadTimeSeconds: 30}\n",
        "never cordons",
    );
    refused(
        "rules:\n- {eventType: Reboot, action: Drain, onDeadline: Approve}\n",
        "never approves",
    );
    assert!(Policy::parse("onDeadline: Sometimes\n", "p").is_err());
    // The margin counts as set in the file, whatever the key order.
    policy(
        "rules:\n- {eventType: Reboot, action: Drain, drainLeadTimeSeconds: 3}\ndrainMarginSeconds: 2\n",
    );
}

#[test]
fn approval_gate_waits_until_the_deadline_then_follows_on_deadline() {
    let deadline = Some(now());
    let left = ["node-1 not drained".to_string()];
    let before = now() - chrono::Duration::seconds(1);
    use DeadlineAction::{Approve, Hold};
    assert_eq!(approval_gate(&[], deadline, Hold, before), Gate::Open);
    assert_eq!(approval_gate(&left, deadline, Approve, before), Gate::Wait);
    assert_eq!(
        approval_gate(&left, deadline, Approve, now()),
        Gate::AtDeadline
    );
    assert_eq!(approval_gate(&left, deadline, Hold, now()), Gate::Wait);
    // No NotBefore (started): no deadline to approve at.
    assert_eq!(approval_gate(&left, None, Approve, now()), Gate::Wait);
}

#[test]
fn hold_never_approves_a_blocked_drain_past_the_deadline() {
    let p = Policy::default();
    // NotBefore in 3 s: the deadline (5 s before it) has passed.
    let ev = event("Redeploy", &["vm_1"], 3);
    let obs = seen(node(true, &["stuck-0"]));
    // Before the deadline it is due back then, as under Approve: the
    // record says when it passed.
    let early = plan(&ev, &obs, &p, now() - chrono::Duration::seconds(10));
    assert_eq!(early.due, Some(Duration::from_secs(8)));
    let pl = plan(&ev, &obs, &p, now());
    assert_eq!(pl.decide_approval, None);
    assert_eq!(pl.due, None);
    let why = pl.approval_withheld.clone().expect("withheld");
    assert!(
        why.contains("onDeadline is Hold") && why.contains("shop/stuck-0"),
        "{why}"
    );
    let st = next_status(&ev, &obs, &pl, &[], now());
    let (status, reason, _) = condition(&st, "DrainIncomplete").expect("DrainIncomplete");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "DeadlinePassed")
    );
    assert!(st.approval.is_none());
    // Until NotBefore, still nothing.
    let later = now() + chrono::Duration::seconds(2);
    assert_eq!(plan(&ev, &obs, &p, later).decide_approval, None);
    // The drain done before NotBefore: approved after all.
    let done = plan(&ev, &seen(node(true, &[])), &p, later);
    assert!(done.decide_approval.is_some());
    assert_eq!(done.approved_incomplete, None);
}

#[test]
fn approve_on_deadline_approves_at_the_deadline_and_records_what_was_left() {
    let p = policy("onDeadline: Approve\n");
    let ev = event("Redeploy", &["vm_1"], 65);
    let obs = seen(node(true, &["stuck-0", "stuck-1"]));
    // A minute before the deadline: waiting, and due back at the deadline.
    let pl = plan(&ev, &obs, &p, now());
    assert_eq!(pl.decide_approval, None);
    assert_eq!(pl.due, Some(Duration::from_secs(60)));
    assert!(pl.requeue <= Duration::from_secs(60));
    assert_eq!(pl.approval_withheld, None, "draining is not withholding");
    // At the deadline: approved, with what was left.
    let at = now() + chrono::Duration::seconds(60);
    let pl = plan(&ev, &obs, &p, at);
    let reason = pl
        .decide_approval
        .clone()
        .expect("approved at the deadline");
    assert!(reason.contains("onDeadline is Approve"), "{reason}");
    let left = pl.approved_incomplete.clone().expect("what was left");
    assert!(
        left.contains("node-1 not drained (2 pods left: shop/stuck-0, shop/stuck-1)"),
        "{left}"
    );
    assert_eq!(pl.phase, Phase::Draining, "the drain goes on");
    assert_eq!(pl.evictions.len(), 2);
    let st = next_status(&ev, &obs, &pl, &[], at);
    assert_eq!(
        st.approval.as_ref().and_then(|a| a.decided_at),
        Some(at),
        "{:?}",
        st.approval
    );
    let (status, reason, message) = condition(&st, "DrainIncomplete").expect("DrainIncomplete");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ApprovedIncomplete")
    );
    assert!(message.contains("shop/stuck-1"), "{message}");
    // The next pass keeps that account, decides nothing more.
    let then = ScheduledEvent {
        status: Some(st),
        ..ev.clone()
    };
    let next = plan(&then, &obs, &p, at + chrono::Duration::seconds(1));
    assert_eq!(next.decide_approval, None);
    let st = next_status(&then, &obs, &next, &[], at + chrono::Duration::seconds(1));
    let (_, reason, _) = condition(&st, "DrainIncomplete").expect("kept");
    assert_eq!(reason, "ApprovedIncomplete");
}

#[test]
fn a_rules_on_deadline_applies_to_its_type_only() {
    let p = policy("rules:\n- {eventType: Reboot, action: DrainAndApprove, onDeadline: Approve}\n");
    let obs = seen(node(true, &["stuck-0"]));
    let reboot = plan(&event("Reboot", &["vm_1"], 3), &obs, &p, now());
    assert!(reboot.decide_approval.is_some());
    let redeploy = plan(&event("Redeploy", &["vm_1"], 3), &obs, &p, now());
    assert_eq!(redeploy.decide_approval, None);
}

#[test]
fn approve_on_deadline_never_overrides_the_rest_of_rule_two() {
    let p = policy("onDeadline: Approve\n");
    let ev = event("Redeploy", &["vm_1", "elsewhere_1"], 3);
    let mut obs = seen(node(true, &["stuck-0"]));
    obs.unmapped = vec!["elsewhere_1".into()];
    let pl = plan(&ev, &obs, &p, now());
    assert_eq!((pl.decide_approval, pl.approved_incomplete), (None, None));
    // Drained, the foreign VM is what withholds it.
    let drained = Observed {
        unmapped: vec!["elsewhere_1".into()],
        ..seen(node(true, &[]))
    };
    let pl = plan(&ev, &drained, &p, now());
    assert_eq!(pl.decide_approval, None);
    assert!(
        pl.approval_withheld
            .as_deref()
            .is_some_and(|w| w.contains("elsewhere_1")),
        "{:?}",
        pl.approval_withheld
    );
    let mut doubted = seen(node(true, &["stuck-0"]));
    doubted.doubts = vec!["VM vm_1 is claimed by 2 nodes".into()];
    let pl = plan(&event("Redeploy", &["vm_1"], 3), &doubted, &p, now());
    assert_eq!(pl.decide_approval, None);
    // And a Drain never approves, whatever the deadline.
    let drain = policy("defaultAction: Drain\nonDeadline: Approve\n");
    let pl = plan(
        &event("Redeploy", &["vm_1"], 3),
        &seen(node(true, &["stuck-0"])),
        &drain,
        now(),
    );
    assert_eq!(pl.decide_approval, None);
}

/// `shop/db-0` on `n`, asking to be waited for, its notice of `ev-1`
/// stored; acknowledged when `acked`.
fn with_db_0(mut n: ObservedNode, acked: bool) -> ObservedNode {
    use crate::controller::observe::participants::{Participant, ack_key, notice_key};
    let mut annotations = std::collections::BTreeMap::from([(
        notice_key("ev-1"),
        "eventId=EV-1 type=Reboot".to_string(),
    )]);
    if acked {
        annotations.insert(ack_key("ev-1"), "EV-1".into());
    }
    n.participants.push(Arc::new(Participant {
        namespace: "shop".into(),
        name: "db-0".into(),
        uid: "uid-db-0".into(),
        acknowledges: true,
        terminating: false,
        annotations,
    }));
    n
}

#[test]
fn a_missing_acknowledgement_holds_the_approval_like_an_unfinished_drain() {
    // Drained, but shop/db-0 has not acknowledged; NotBefore in 65 s, so
    // the acknowledgement wait (300 s by default) ends at the drain
    // deadline, 60 s from now, where onDeadline decides.
    let obs = seen(with_db_0(node(true, &[]), false));
    let ev = event("Reboot", &["vm_1"], 65);
    let hold = Policy::default();
    let pl = plan(&ev, &obs, &hold, now());
    assert_eq!(pl.decide_approval, None);
    assert_eq!(pl.phase, Phase::Drained);
    assert!(pl.acknowledgement.as_ref().is_some_and(|a| a.waiting));
    let at = now() + chrono::Duration::seconds(60);
    let pl = plan(&ev, &obs, &hold, at);
    assert_eq!(pl.decide_approval, None, "Hold approved past the deadline");
    let st = next_status(&ev, &obs, &pl, &[], at);
    let (status, reason, message) = condition(&st, "DrainIncomplete").expect("DrainIncomplete");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "DeadlinePassed")
    );
    assert!(
        message.contains("shop/db-0 has not acknowledged"),
        "{message}"
    );
    let why = pl.approval_withheld.clone().expect("withheld");
    assert!(
        why.contains("shop/db-0 has not acknowledged") && why.contains("Hold"),
        "{why}"
    );
    let approve = policy("onDeadline: Approve\n");
    let pl = plan(&ev, &obs, &approve, at);
    assert!(pl.decide_approval.is_some());
    assert!(
        pl.approved_incomplete
            .as_deref()
            .is_some_and(|l| l.contains("shop/db-0 has not acknowledged")),
        "{:?}",
        pl.approved_incomplete
    );
    // Acknowledged: approved at once, as ever.
    let acked = seen(with_db_0(node(true, &[]), true));
    assert!(plan(&ev, &acked, &hold, now()).decide_approval.is_some());
}

#[test]
fn a_pod_that_never_acknowledged_holds_the_approval_after_its_eviction_too() {
    // The wait timed out at the drain deadline (now + 60 s) with shop/db-0
    // silent; it was evicted since and the node is drained: under Hold
    // still no approval, under Approve one naming the pod.
    let mut ev = event("Reboot", &["vm_1"], 65);
    let deadline = now() + chrono::Duration::seconds(60);
    ev.status = Some(ScheduledEventStatus {
        acknowledgements: Some(crate::api::Acknowledgements {
            since: Some(now()),
            deadline: Some(deadline),
            timed_out_at: Some(deadline),
            pending: vec!["shop/db-0".into()],
            pending_count: 1,
            ..Default::default()
        }),
        ..Default::default()
    });
    let drained = seen(node(true, &[]));
    let at = deadline + chrono::Duration::seconds(2);
    let pl = plan(&ev, &drained, &Policy::default(), at);
    assert_eq!(pl.decide_approval, None);
    assert!(
        pl.held_incomplete
            .as_deref()
            .is_some_and(|l| l.contains("shop/db-0 has not acknowledged")),
        "{:?}",
        pl.held_incomplete
    );
    let pl = plan(&ev, &drained, &policy("onDeadline: Approve\n"), at);
    assert!(
        pl.approved_incomplete
            .as_deref()
            .is_some_and(|l| l.contains("shop/db-0")),
        "{:?}",
        pl.approved_incomplete
    );
    // A wait that timed out at its own timeout, before the deadline, holds
    // nothing.
    if let Some(a) = ev.status.as_mut().and_then(|s| s.acknowledgements.as_mut()) {
        a.deadline = Some(now() + chrono::Duration::seconds(30));
        a.timed_out_at = a.deadline;
    }
    assert!(
        plan(&ev, &drained, &Policy::default(), at)
            .decide_approval
            .is_some()
    );
}

#[test]
fn an_acknowledgement_timeout_before_the_deadline_lets_the_approval_go_on() {
    // The wait began now and lasts 30 s (the policy's timeout), well
    // before the drain deadline (NotBefore in 600 s): past it the
    // approval goes on without shop/db-0, under Hold too, and is complete.
    let obs = seen(with_db_0(node(true, &[]), false));
    let mut ev = event("Reboot", &["vm_1"], 600);
    ev.status = Some(ScheduledEventStatus {
        acknowledgements: Some(crate::api::Acknowledgements {
            since: Some(now()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let p = policy("acknowledgeTimeoutSeconds: 30\n");
    let before = now() + chrono::Duration::seconds(29);
    assert_eq!(plan(&ev, &obs, &p, before).decide_approval, None);
    let after = now() + chrono::Duration::seconds(30);
    let pl = plan(&ev, &obs, &p, after);
    assert!(pl.decide_approval.is_some(), "{:?}", pl.approval_withheld);
    assert_eq!(pl.approved_incomplete, None);
}

#[test]
fn an_approve_action_waits_for_the_acknowledgements_too() {
    let p = policy("rules:\n- {eventType: Freeze, action: Approve, onDeadline: Approve}\n");
    let ev = event("Freeze", &["vm_1"], 65);
    let obs = seen(with_db_0(node(false, &["a"]), false));
    let pl = plan(&ev, &obs, &p, now());
    assert_eq!(pl.decide_approval, None);
    assert_eq!(pl.due, Some(Duration::from_secs(60)));
    let at = now() + chrono::Duration::seconds(60);
    let pl = plan(&ev, &obs, &p, at);
    assert!(pl.decide_approval.is_some());
    let st = next_status(&ev, &obs, &pl, &[], at);
    let (_, reason, message) = condition(&st, "DrainIncomplete").expect("DrainIncomplete");
    assert_eq!(reason, "ApprovedIncomplete");
    assert!(message.contains("shop/db-0"), "{message}");
    // Under Hold (the default), never approved past the deadline.
    let hold = policy("rules:\n- {eventType: Freeze, action: Approve}\n");
    assert_eq!(plan(&ev, &obs, &hold, at).decide_approval, None);
    let acked = seen(with_db_0(node(false, &["a"]), true));
    assert!(plan(&ev, &acked, &p, now()).decide_approval.is_some());
}

#[test]
fn the_fault_domains_an_event_touches_are_counted_and_kept() {
    let ev = event("Reboot", &["vm_1"], 600);
    let mut obs = seen(node(true, &[]));
    obs.fault_domains = Some(2);
    let p = plan(&ev, &obs, &Policy::default(), now());
    let st = next_status(&ev, &obs, &p, &[], now());
    assert_eq!(st.fault_domains, Some(2));
    // No longer known (nodes gone): the last count stays.
    let then = ScheduledEvent {
        status: Some(st),
        ..ev.clone()
    };
    obs.fault_domains = None;
    let st = next_status(
        &then,
        &obs,
        &plan(&then, &obs, &Policy::default(), now()),
        &[],
        now(),
    );
    assert_eq!(st.fault_domains, Some(2));
    // More seen later (a node's label came): the most; fewer: still the most.
    let mut then = ScheduledEvent {
        status: Some(st),
        ..ev.clone()
    };
    for (seen_now, kept) in [(3, 3), (1, 3)] {
        obs.fault_domains = Some(seen_now);
        let p = plan(&then, &obs, &Policy::default(), now());
        let st = next_status(&then, &obs, &p, &[], now());
        assert_eq!(st.fault_domains, Some(kept), "seen {seen_now}");
        then.status = Some(st);
    }
}

#[test]
fn the_end_of_a_drain_lead_time_stays_recorded() {
    let p = policy(CASE_STUDY);
    let ev = event("Reboot", &["vm_1"], 120);
    let waiting = seen(node(false, &["a"]));
    let st = next_status(&ev, &waiting, &plan(&ev, &waiting, &p, now()), &[], now());
    let mut then = ScheduledEvent {
        status: Some(st),
        ..ev.clone()
    };
    // The lead time began, then two more passes: False, LeadTimeReached,
    // with the time it turned.
    let held = seen(node(true, &[]));
    let mut turned = None;
    for secs in [90, 91, 92] {
        let at = now() + chrono::Duration::seconds(secs);
        let st = next_status(&then, &held, &plan(&then, &held, &p, at), &[], at);
        let c = st
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DrainScheduled")
            .cloned()
            .expect("DrainScheduled kept");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "LeadTimeReached")
        );
        let t = *turned.get_or_insert(c.last_transition_time);
        assert_eq!(c.last_transition_time, t);
        then.status = Some(st);
    }
}

#[test]
fn a_hold_handed_over_before_the_lead_time_does_not_start_the_drain() {
    // ev-2 (a Redeploy days away, lead time one hour) was handed node-1's
    // hold when the event before it ended: it has not begun its drain
    // (its status says Pending), so it lets the node go and waits.
    let p = Policy::default();
    let mut redeploy = event("Redeploy", &["vm_1"], 3 * 86400);
    redeploy.metadata.name = Some("ev-2".into());
    redeploy.status = Some(ScheduledEventStatus {
        phase: Some(Phase::Pending),
        ..Default::default()
    });
    let mut n = node(true, &["a"]);
    n.holds = vec!["ev-2".into()];
    let planned = plan(&redeploy, &seen(n.clone()), &p, now());
    assert_eq!(planned.phase, Phase::Pending);
    assert!(planned.evictions.is_empty(), "{:?}", planned.evictions);
    assert_eq!(
        planned.node_writes,
        vec![NodeWrite::Release {
            node: "node-1".into(),
            holds: vec![],
            uncordon: true
        }]
    );
    assert!(waits_for_lead_time(&redeploy, &redeploy.spec, &p, now()));
    // Within its lead time, the same event drains (and claims nodes).
    let soon = now() + chrono::Duration::seconds(3 * 86400 - 600);
    assert!(!waits_for_lead_time(&redeploy, &redeploy.spec, &p, soon));
    let draining = plan(&redeploy, &seen(n.clone()), &p, soon);
    assert_eq!(draining.phase, Phase::Draining);
    assert_eq!(draining.evictions.len(), 1);
    // A drain its own passes began goes on while it holds the node.
    let mut begun = redeploy.clone();
    begun.status = Some(ScheduledEventStatus {
        phase: Some(Phase::Draining),
        ..Default::default()
    });
    assert!(!waits_for_lead_time(&begun, &begun.spec, &p, now()));
    assert_eq!(plan(&begun, &seen(n), &p, now()).phase, Phase::Draining);
}

#[test]
fn a_start_seen_in_other_content_skips_no_lead_time() {
    // The event was seen Started while its spec was built from another
    // agent's report of other content (a higher appearance naming more
    // VMs); that agent withdrew it, and the spec is the named node's own
    // again: a Reboot three hours away, its lead time one hour.
    let p = Policy::default();
    let mut ev = event("Reboot", &["vm_1"], 3 * 3600);
    let mut other = ev.spec.clone();
    other.appearance = 5;
    other.resources.push("vm_attacker".into());
    ev.status = Some(ScheduledEventStatus {
        phase: Some(Phase::Pending),
        started_at: Some(now() - chrono::Duration::seconds(30)),
        started_in: Some(other.started_key()),
        appearance: Some(5),
        ..Default::default()
    });
    assert_eq!(ev.started_at(), None);
    assert!(waits_for_lead_time(&ev, &ev.spec, &p, now()));
    let n = node(true, &["a"]);
    let planned = plan(&ev, &seen(n.clone()), &p, now());
    assert!(planned.evictions.is_empty(), "{:?}", planned.evictions);
    assert!(
        !planned
            .node_writes
            .iter()
            .any(|w| matches!(w, NodeWrite::Cordon { .. })),
        "{:?}",
        planned.node_writes
    );
    // Seen Started in this very content: the lead time is over.
    ev.status.as_mut().unwrap().started_in = Some(ev.spec.started_key());
    assert!(ev.started_at().is_some());
    assert!(!waits_for_lead_time(&ev, &ev.spec, &p, now()));
}
