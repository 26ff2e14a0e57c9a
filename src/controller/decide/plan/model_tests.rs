//! Model-based tests of the decision core: random sequences of what the
//! controller observes (IMDS moving the event on, pods scheduled and
//! leaving, an administrator cordoning or uncordoning a node, time) drive
//! [`plan`] and [`next_status`] pass after pass, the plan's node writes and
//! evictions applied to a model of the nodes, and every plan is checked
//! against the rules that must always hold:
//!
//! - an approval is decided only when every node of a draining event is
//!   cordoned and empty;
//! - a pod is evicted only from a node that is cordoned, or cordoned in the
//!   same pass;
//! - no write takes another event's hold off a node, uncordons a node this
//!   event does not hold, or uncordons a node an administrator cordoned;
//! - nothing is cordoned or evicted before the drain's lead time;
//! - once the event is over and the release delay has passed, no node is
//!   left held for it.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::api::ScheduledEventStatus;
use crate::controller::decide::status::next_status;
use crate::fixtures;

const ME: &str = "ev-1";
const OTHER: &str = "ev-other";
const NODES: usize = 3;

/// One node of the model.
#[derive(Debug, Clone)]
struct NodeModel {
    cordoned: bool,
    holds: Vec<String>,
    /// Cordoned by an administrator before the event: never forewarn's to
    /// undo.
    by_admin: bool,
    pods: Vec<Arc<PodInfo>>,
}

/// What can happen between two passes.
#[derive(Debug, Clone)]
enum Step {
    /// A pass of the controller.
    Pass,
    /// Time goes on, seconds.
    Wait(u32),
    /// IMDS moves the event on: `Started` (after an approval or at
    /// `NotBefore`), or it leaves the document (`Completed`).
    Imds,
    /// A pod is scheduled on the node (only on an uncordoned one, as the
    /// scheduler does).
    PodArrives(usize),
    /// An administrator uncordons the node (forewarn's hold stays).
    AdminUncordons(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => Just(Step::Pass),
        3 => (1u32..900).prop_map(Step::Wait),
        2 => Just(Step::Imds),
        1 => (0..NODES).prop_map(Step::PodArrives),
        1 => (0..NODES).prop_map(Step::AdminUncordons),
    ]
}

/// The event: its type (and duration), the VMs it names, its notice.
#[derive(Debug, Clone)]
struct Start {
    event_type: &'static str,
    duration: i64,
    vms: Vec<usize>,
    notice_seconds: i64,
    admin_cordoned: Vec<bool>,
    other_holds: Vec<bool>,
    pods: Vec<usize>,
}

fn start() -> impl Strategy<Value = Start> {
    (
        prop_oneof![
            Just(("Reboot", -1)),
            Just(("Redeploy", -1)),
            Just(("Preempt", -1)),
            Just(("Terminate", -1)),
            Just(("Freeze", 5)),
            Just(("Freeze", 30)),
        ],
        proptest::sample::subsequence((0..NODES).collect::<Vec<_>>(), 1..=NODES),
        prop_oneof![Just(30i64), 60i64..900, 3000i64..20_000],
        proptest::collection::vec(proptest::bool::weighted(0.2), NODES),
        proptest::collection::vec(proptest::bool::weighted(0.2), NODES),
        proptest::collection::vec(0usize..3, NODES),
    )
        .prop_map(
            |((event_type, duration), vms, notice_seconds, admin_cordoned, other_holds, pods)| {
                Start {
                    event_type,
                    duration,
                    vms,
                    notice_seconds,
                    admin_cordoned,
                    other_holds,
                    pods,
                }
            },
        )
}

fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-21T10:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

fn node_name(i: usize) -> String {
    format!("node-{i}")
}

fn pod(node: usize, n: usize) -> Arc<PodInfo> {
    Arc::new(PodInfo {
        namespace: "shop".into(),
        name: format!("web-{node}-{n}"),
        uid: format!("uid-{node}-{n}"),
        managed: true,
        grace_seconds: 30,
        ..PodInfo::default()
    })
}

/// What the controller observes of the model: the nodes the event's VMs
/// map to, then those holding its cordon.
fn observe(ev: &ScheduledEvent, nodes: &[NodeModel]) -> Observed {
    let mapped: Vec<usize> = ev
        .spec
        .resources
        .iter()
        .filter_map(|vm| vm.strip_prefix("vm_")?.parse().ok())
        .collect();
    let mut seen = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let is_mapped = mapped.contains(&i);
        if !is_mapped && !n.holds.iter().any(|h| h == ME) {
            continue;
        }
        seen.push(ObservedNode {
            name: node_name(i),
            vm_name: if is_mapped {
                format!("vm_{i}")
            } else {
                String::new()
            },
            cordoned: n.cordoned,
            holds: n.holds.clone(),
            pods: n.pods.clone(),
            ..ObservedNode::default()
        });
    }
    Observed {
        nodes: seen,
        ..Observed::default()
    }
}

/// Checks one plan against the rules; applies it to the model.
fn check_and_apply(
    ev: &ScheduledEvent,
    seen: &Observed,
    p: &Plan,
    nodes: &mut [NodeModel],
    policy: &Policy,
    now: DateTime<Utc>,
) -> Result<(), TestCaseError> {
    let index = |name: &str| -> usize { name.trim_start_matches("node-").parse().unwrap() };
    // Approval only on cordoned, empty nodes (of a draining action).
    if p.decide_approval.is_some() && p.action.drains() {
        for n in seen
            .nodes
            .iter()
            .filter(|n| !n.vm_name.is_empty() && !n.ended)
        {
            let m = &nodes[index(&n.name)];
            prop_assert!(
                m.cordoned && m.pods.is_empty(),
                "approval decided with {} not cordoned and empty: {m:?}",
                n.name
            );
        }
    }
    // Evictions only from nodes cordoned, or cordoned in this pass.
    for e in &p.evictions {
        let cordoned_now = p
            .node_writes
            .iter()
            .any(|w| w.node() == e.node && w.unschedulable() == Some(true));
        let n = &nodes[index(&e.node)];
        prop_assert!(
            n.cordoned || cordoned_now,
            "evicted {} from uncordoned {}",
            e.pod.name,
            e.node
        );
    }
    // Nothing before the lead time.
    let lead = policy
        .handling(
            &EventType::from(ev.spec.event_type.as_str()),
            &ev.spec.event_source,
            ev.spec.duration_seconds,
        )
        .drain_lead_time_seconds;
    let before_lead = ev
        .spec
        .not_before
        .is_some_and(|nb| now < nb - Policy::seconds(lead))
        && ev.spec.event_status == EventStatus::Scheduled
        && !approval_decided(ev)
        && !drain_began(ev);
    if before_lead {
        prop_assert!(p.evictions.is_empty(), "evicted before the lead time");
        prop_assert!(
            !p.node_writes
                .iter()
                .any(|w| matches!(w, NodeWrite::Cordon { .. } | NodeWrite::AddHold { .. })),
            "cordoned before the lead time: {:?}",
            p.node_writes
        );
    }
    for w in &p.node_writes {
        let n = &nodes[index(w.node())];
        // No other event's hold is taken off.
        for h in n.holds.iter().filter(|h| *h != ME) {
            prop_assert!(w.holds().contains(h), "{w:?} drops {h}'s hold from {n:?}");
        }
        // A node some event holds stays cordoned.
        prop_assert!(
            w.unschedulable() != Some(false) || w.holds().is_empty(),
            "{w:?} uncordons a node still held"
        );
        if let NodeWrite::Release { uncordon: true, .. } = w {
            prop_assert!(
                n.holds.iter().any(|h| h == ME),
                "uncordoned a node {ME} does not hold: {n:?}"
            );
            prop_assert!(!n.by_admin, "uncordoned a node an administrator cordoned");
        }
    }
    // Applied.
    for w in &p.node_writes {
        let n = &mut nodes[index(w.node())];
        n.holds = w.holds().to_vec();
        if let Some(u) = w.unschedulable() {
            n.cordoned = u;
        }
    }
    for e in &p.evictions {
        nodes[index(&e.node)].pods.retain(|x| x.uid != e.pod.uid);
    }
    Ok(())
}

fn run(start: Start, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let policy = Policy::default();
    let mut now = t0();
    let not_before = now + chrono::Duration::seconds(start.notice_seconds);
    let mut ev = ScheduledEvent::new(
        ME,
        fixtures::spec("EV-1")
            .event_type(start.event_type)
            .vms(start.vms.iter().map(|v| format!("vm_{v}")))
            .not_before(not_before)
            .build(),
    );
    ev.spec.duration_seconds = start.duration;
    ev.status = None;
    let mut nodes: Vec<NodeModel> = (0..NODES)
        .map(|i| {
            let other = start.other_holds[i];
            let admin = start.admin_cordoned[i] && !other;
            NodeModel {
                cordoned: admin || other,
                holds: if other { vec![OTHER.into()] } else { vec![] },
                by_admin: admin,
                pods: (0..start.pods[i]).map(|n| pod(i, n)).collect(),
            }
        })
        .collect();
    let mut arrivals: BTreeMap<usize, usize> = BTreeMap::new();
    let pass = |ev: &mut ScheduledEvent,
                nodes: &mut Vec<NodeModel>,
                now: DateTime<Utc>|
     -> Result<(), TestCaseError> {
        let seen = observe(ev, nodes);
        let p = plan(ev, &seen, &policy, now);
        check_and_apply(ev, &seen, &p, nodes, &policy, now)?;
        let outcomes: Vec<crate::controller::decide::status::Outcome> = p
            .evictions
            .iter()
            .map(|e| (e.node.clone(), e.pod.key(), EvictionOutcome::Evicted))
            .collect();
        let status: ScheduledEventStatus = next_status(ev, &seen, &p, &outcomes, now);
        ev.status = Some(status);
        Ok(())
    };
    for s in steps {
        match s {
            Step::Pass => pass(&mut ev, &mut nodes, now)?,
            Step::Wait(secs) => now += chrono::Duration::seconds(i64::from(secs)),
            Step::Imds => match ev.spec.event_status {
                EventStatus::Scheduled if approval_decided(&ev) || now >= not_before => {
                    ev.spec.event_status = EventStatus::Started;
                }
                EventStatus::Scheduled | EventStatus::Started => {
                    ev.spec.event_status = EventStatus::Completed;
                }
                _ => {}
            },
            Step::PodArrives(i) => {
                if !nodes[i].cordoned {
                    let n = arrivals.entry(i).or_insert(10);
                    nodes[i].pods.push(pod(i, *n));
                    *n += 1;
                }
            }
            Step::AdminUncordons(i) => {
                nodes[i].cordoned = false;
                nodes[i].by_admin = false;
            }
        }
    }
    // Over: IMDS no longer lists it; passes past the release delay leave
    // nothing held for it.
    ev.spec.event_status = EventStatus::Completed;
    for _ in 0..3 {
        pass(&mut ev, &mut nodes, now)?;
        now +=
            chrono::Duration::seconds(i64::try_from(policy.release_delay_seconds).unwrap_or(5) + 1);
    }
    for (i, n) in nodes.iter().enumerate() {
        prop_assert!(
            !n.holds.iter().any(|h| h == ME),
            "node-{i} still held for {ME} after its end: {n:?}"
        );
        if n.holds.is_empty() && !n.by_admin {
            prop_assert!(!n.cordoned, "node-{i} left cordoned after the event: {n:?}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn every_plan_keeps_the_rules(
        s in start(),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        run(s, steps)?;
    }
}
