//! The adversary suite: one compromised node against the chart's trust model
//! on a real API server. The chart is installed (its RBAC and the admission
//! policy that confines each agent to its own node's reports); honest nodes
//! run the real `forewarn agent` against `forewarn imds-mock`, each with a
//! TokenRequest token bound to the chart's agent pod on its node; the real
//! controller runs with the controller's token. The attacker holds one
//! node's agent token and writes whatever reports the admission policy lets
//! that node write. One test per way in:
//!
//! 1. a lying agent's report (higher appearance, `Completed`, naming the
//!    victim's VM and its own) does not end the victim's event while the
//!    victim's own agent reports it live, with and without providerIDs;
//! 2. a VM claimed while its own agent restarts (nodes without providerIDs)
//!    takes no approval;
//! 3. an agent stating two VMs is not cordoned and released pass after pass,
//!    and its second VM's event holds nothing;
//! 4. a flood of one node's reports delays no other node's real event, and
//!    the excess is capped;
//! 5. an approval written by hand into the status is not sent before the
//!    drain ends;
//! 6. two agents reporting an event naming a node whose agent runs and does
//!    not list it do not drain that node;
//! 7. a report whose `scheduledEvent` is not its `EventId` is refused or
//!    ignored; oversize reports are refused;
//! 8. an urgent flood of one node's reports (`NotBefore` a second away)
//!    does not keep another node's real event from its cordon before its
//!    `NotBefore`;
//! 9. a report naming another node's VM, `Started` at a higher appearance
//!    and then withdrawn, skips no drain lead time of that node;
//! 10. no agent can give its `VirtualMachineReport` an owner reference or
//!     a finalizer (the garbage collector would delete it, and the agent
//!     could state another VM), and the controller makes each owned by its
//!     Node;
//! 11. an approval decided on another node's drain (that node claimed the
//!     victim's VM before the victim's agent ran) is not sent from the
//!     victim, whose pods still run;
//! 12. a forged record of an accepted approval in another node's report
//!     neither reads `Accepted` nor keeps the named node's agent from
//!     sending;
//! 13. a `VirtualMachineReport` stating a 100,000-character VM is refused.
//!
//! The victim node carries a pod whose PodDisruptionBudget allows no
//! eviction, so its drain cannot end while that pod stands: the victim
//! released, or an approval sent (the mock's log of `StartRequests`
//! POSTs), while that pod runs is the harm each test looks for. Each test
//! has nodes of its own (a node's stated VM is fixed at its first
//! statement, so the nodes of one test must not be another's), the
//! cluster is shared and the tests take turns. Fails, never skips, when
//! the cluster cannot start.

#[path = "support/trust_env.rs"]
mod trust_env;

use std::sync::{MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use forewarn::api::{Phase, ScheduledEvent};
use forewarn::imds::model::object_name;
use forewarn_harness::cluster::{Cluster, client_for};
use serde_json::{Value, json};
use trust_env::*;

const CLUSTER: &str = "forewarn-adversary";
/// node-000000 holds the chart's (KWOK) controller pods; each test has
/// nodes of its own among the others.
const NODES: usize = 27;
/// The nodes given Azure providerIDs (the rest have none, like a cluster
/// whose cloud provider sets none).
const WITH_PROVIDER_IDS: [usize; 5] = [1, 2, 12, 13, 14];

/// How long the product may take for what it does in a second or two (a
/// cordon on its own agent's report, an approval once a drain ended): a
/// bound for hangs only. The controller reacts to a report within about a
/// second on an idle machine; 60 s is far beyond what the load of a full
/// `make test` on 2 cores has stretched that to.
const HANG: Duration = Duration::from_secs(60);

/// How long a held state is watched once the attack is in the controller's
/// hands (its object exists). The harms each test looks for showed within
/// 7 s with the holes open (an agent's approval fallback of 5 s, the
/// policy's release delay of 5 s, a pending event's pass every 5 s); load
/// can only make a harm show later, never make a correct controller fail.
const OBSERVE: Duration = Duration::from_secs(12);

fn node(i: usize) -> String {
    format!("node-{i:06}")
}

/// The VM that node `i` is: the scale-set instance `advvmss_<i>`.
fn vm(i: usize) -> String {
    format!("advvmss_{i}")
}

fn provider_id(i: usize) -> String {
    format!(
        "azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachineScaleSets/advvmss/virtualMachines/{i}"
    )
}

/// The suite's cluster, the chart installed once (the controller's KWOK
/// pods on node-000000) and the providerIDs set.
fn suite() -> (MutexGuard<'static, ()>, Cluster) {
    static READY: OnceLock<()> = OnceLock::new();
    let (turn, c) = cluster(CLUSTER, NODES);
    READY.get_or_init(|| {
        let k = admin(&c);
        install_with(
            &k,
            &c,
            &[
                "--set-string",
                &format!(
                    "controller.nodeSelector.kubernetes\\.io/hostname={}",
                    node(0)
                ),
            ],
        );
        for i in WITH_PROVIDER_IDS {
            k.ok(&[
                "patch",
                "node",
                &node(i),
                "--type=merge",
                "-p",
                &json!({"spec": {"providerID": provider_id(i)}}).to_string(),
            ]);
        }
    });
    (turn, c)
}

/// A `ScheduledEventReport` of `node` (stating `vm`) about the event `id`,
/// as an agent writes it: a `Reboot` of `resources`, `Scheduled`, first
/// appearance, `NotBefore` in 15 minutes.
fn report(id: &str, node: &str, vm: &str, resources: &[&str]) -> Value {
    let name = object_name(id);
    let not_before = (Utc::now() + chrono::Duration::minutes(15))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    json!({
        "apiVersion": "forewarn.dev/v1alpha1",
        "kind": "ScheduledEventReport",
        "metadata": {"name": format!("{name}.{node}")},
        "spec": {
            "scheduledEvent": name,
            "report": {
                "node": node,
                "vm": vm,
                "named": resources.iter().any(|r| r.eq_ignore_ascii_case(vm)),
                "eventStatus": "Scheduled",
                "appearance": 1,
                "eventId": id,
                "eventType": "Reboot",
                "eventSource": "Platform",
                "resourceType": "VirtualMachine",
                "resources": resources,
                "notBefore": not_before,
                "durationSeconds": -1,
                "description": "",
                "documentIncarnation": 1,
            }
        }
    })
}

fn reboot<'a>(id: &'a str, resources: &[String], only_named: bool) -> MockEvent<'a> {
    MockEvent {
        id,
        event_type: "Reboot",
        resources: resources.to_vec(),
        notice: 900,
        only_named,
    }
}

fn condition_true(ev: &ScheduledEvent, type_: &str) -> bool {
    ev.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == type_ && c.status == "True")
}

fn decided(ev: &ScheduledEvent) -> Option<DateTime<Utc>> {
    ev.status
        .as_ref()
        .and_then(|s| s.approval.as_ref())
        .and_then(|a| a.decided_at)
}

fn status_text(ev: Option<&ScheduledEvent>) -> String {
    ev.and_then(|e| e.status.as_ref())
        .map(|s| serde_json::to_string(s).unwrap_or_default())
        .unwrap_or_else(|| "(no object)".into())
}

/// Waits until node `n` is cordoned and held for `event`; returns how long
/// that took.
fn cordoned_for(rig: &Rig, n: &str, event: &str) -> Duration {
    let t = Instant::now();
    eventually(&format!("{n} cordoned for {event}"), HANG, || {
        let node = rig.node(n);
        (unschedulable(&node) && held_for(&node).iter().any(|e| e == event)).then_some(())
    });
    t.elapsed()
}

/// Checks for [`OBSERVE`] that `victim` stays cordoned and held for `event`
/// with its guarded pod `pod` running on it, and that IMDS received no
/// approval of `id`.
fn stays_held(rig: &Rig, victim: &str, pod: &str, event: &str, id: &str) {
    let end = Instant::now() + OBSERVE;
    while Instant::now() < end {
        let node = rig.node(victim);
        assert!(
            rig.guard_runs(victim, pod),
            "the guarded pod {pod} left {victim} though its budget allows no eviction"
        );
        assert!(
            unschedulable(&node) && held_for(&node).iter().any(|e| e == event),
            "{victim} released while its guarded pod {pod} still runs on it (held for {:?}); the event: {}",
            held_for(&node),
            status_text(rig.event(event).as_ref())
        );
        let sent = rig.approvals(id);
        assert!(
            sent.is_empty(),
            "an approval of {id} reached IMDS while {victim} is not drained ({pod} runs on it): {sent:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Lifts the guard of `victim` and waits for the approval of `id`; asserts
/// that IMDS received none before the guard was lifted (the drain could
/// not end before).
fn approved_only_once_drained(rig: &Rig, victim: &str, id: &str) {
    let lifted = unguard(&rig.k, victim);
    let sent = eventually(
        &format!("the approval of {id} once {victim} is drained"),
        HANG,
        || {
            let sent = rig.approvals(id);
            (!sent.is_empty()).then_some(sent)
        },
    );
    assert!(
        sent.iter().all(|e| e.time >= lifted),
        "an approval of {id} reached IMDS before the budget on {victim} was lifted at {lifted}: {sent:?}"
    );
    remove_guard(&rig.k, victim);
}

/// Hole 1 on nodes `a` (attacker) and `b` (victim).
fn lying_agent(test: &str, a: usize, b: usize, id: &str) {
    let (_turn, c) = suite();
    let (na, nb) = (node(a), node(b));
    let sev = object_name(id);
    let pod = guard(&admin(&c), &nb);
    let mut rig = Rig::start(
        &c,
        test,
        &[na.clone(), nb.clone()],
        &[(nb.clone(), vm(b))],
        &[reboot(id, &[vm(b)], true)],
    );
    // A's agent stated its VM at start, before the node was taken.
    let attacker = rig.attacker(&na);
    attacker
        .state_vm(&rig.rt, &vm(a))
        .expect("A's agent states its VM");
    let watch = rig.watch_node(&nb);
    rig.start_clock();
    let took = cordoned_for(&rig, &nb, &sev);
    println!("{nb} cordoned {took:?} after its agent's IMDS listed the event");
    eventually("the drain of B blocked by the budget", HANG, || {
        rig.event(&sev)
            .filter(|e| condition_true(e, "DrainBlocked"))
            .map(|_| ())
    });

    // A lies: the same EventId at a higher appearance, Completed, naming
    // B's VM and its own.
    let mut lie = report(id, &na, &vm(a), &[&vm(b), &vm(a)]);
    lie["spec"]["report"]["appearance"] = json!(7);
    lie["spec"]["report"]["eventStatus"] = json!("Completed");
    rig.write(&attacker, &lie)
        .expect("A may write its own report");
    stays_held(&rig, &nb, &pod, &sev, id);
    let ev = rig.event(&sev).expect("the event");
    let phase = ev.status.as_ref().and_then(|s| s.phase);
    assert!(
        !phase.is_some_and(Phase::is_final),
        "the event ended on A's word while B's agent lists it: {}",
        status_text(Some(&ev))
    );
    let own = rig.report(&format!("{sev}.{nb}")).expect("B's own report");
    assert_eq!(
        own.spec.report.event_status,
        forewarn::api::EventStatus::Scheduled,
        "B's own agent still lists the event"
    );

    approved_only_once_drained(&rig, &nb, id);
    assert_eq!(
        watch.cordons(),
        1,
        "{nb} was released and cordoned again: {:?}",
        watch.states()
    );
    rig.stop();
}

/// Hole 1, nodes with providerIDs: agent A reports B's event at a higher
/// appearance than any other, `Completed`, naming B's VM and its own; B's
/// own agent still lists it. B stays cordoned (its drain blocked by a
/// budget), the event does not end, no approval reaches IMDS until B's
/// guarded pod may go, and then one does.
#[test]
fn a_lying_agent_cannot_end_another_nodes_event_with_provider_ids() {
    lying_agent(
        "lying-agent-provider-ids",
        WITH_PROVIDER_IDS[0],
        WITH_PROVIDER_IDS[1],
        "A1000000-0000-4000-8000-000000000001",
    );
}

/// Hole 1 again on nodes without providerIDs (each node's VM is the one its
/// agent stated first).
#[test]
fn a_lying_agent_cannot_end_another_nodes_event_without_provider_ids() {
    lying_agent("lying-agent", 3, 4, "A1000000-0000-4000-8000-000000000002");
}

/// Hole 2, nodes without providerIDs: B's agent has run (stating its VM)
/// and is down; an event naming B's VM is listed by every VM's IMDS (an
/// honest bystander C reports it); A states B's VM as its own, in its VM
/// report and its report of the event. No approval is decided or sent
/// while B's pods run, and A's node is not held for B's event.
#[test]
fn a_vm_claimed_while_its_agent_restarts_takes_no_approval() {
    let (_turn, c) = suite();
    let (a, b, cc) = (5, 6, 7);
    let (na, nb, nc) = (node(a), node(b), node(cc));
    let id = "B2000000-0000-4000-8000-000000000001";
    let sev = object_name(id);
    let pod = guard(&admin(&c), &nb);
    let mut rig = Rig::start(
        &c,
        "claimed-vm",
        &[na.clone(), nb.clone(), nc.clone()],
        &[(nb.clone(), vm(b)), (nc.clone(), vm(cc))],
        &[reboot(id, &[vm(b)], false)],
    );
    // A's agent stated its VM at start, before the node was taken.
    let attacker = rig.attacker(&na);
    attacker
        .state_vm(&rig.rt, &vm(a))
        .expect("A's agent states its VM");
    // B's agent states its VM (its VM report, written at start), then stops.
    eventually("B's VM report", HANG, || {
        let out = rig
            .k
            .run(&["get", "virtualmachinereport", &nb, "-o", "json"], None);
        out.ok
            .then(|| serde_json::from_str::<Value>(&out.stdout).expect("JSON"))
            .filter(|r| r["spec"]["vm"] == vm(b).as_str())
    });
    rig.kill_agent(&nb);
    let watch_a = rig.watch_node(&na);
    let watch_b = rig.watch_node(&nb);
    rig.start_clock();
    let witness = eventually("C's report of the event", HANG, || {
        rig.report(&format!("{sev}.{nc}"))
    });

    // A claims B's VM: its VM report (the API server may refuse to change
    // it) and its report of the event (the content C's IMDS lists) state
    // B's VM.
    match attacker.state_vm(&rig.rt, &vm(b)) {
        Ok(()) => println!("A's VM report now states B's VM"),
        Err(e) => println!("A's VM report keeps its first VM: {e}"),
    }
    let mut claim = serde_json::to_value(&witness.spec.report).expect("report JSON");
    claim["node"] = json!(na);
    claim["vm"] = json!(vm(b));
    claim["named"] = json!(true);
    let claim = json!({
        "apiVersion": "forewarn.dev/v1alpha1",
        "kind": "ScheduledEventReport",
        "metadata": {"name": format!("{sev}.{na}")},
        "spec": {"scheduledEvent": sev, "report": claim},
    });
    rig.write(&attacker, &claim)
        .expect("A may write its own report");
    eventually("the event's object", HANG, || rig.event(&sev));

    let end = Instant::now() + OBSERVE;
    while Instant::now() < end {
        let ev = rig.event(&sev);
        assert!(
            ev.as_ref().and_then(decided).is_none(),
            "an approval of the event naming B's VM was decided while B's agent is down and {pod} runs on B: {}",
            status_text(ev.as_ref())
        );
        let sent = rig.approvals(id);
        assert!(
            sent.is_empty(),
            "an approval of the event naming B's VM reached IMDS while {pod} runs on B: {sent:?}"
        );
        assert!(
            rig.guard_runs(&nb, &pod),
            "{pod} left B while B's agent is down"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        watch_a.held_for(&sev).is_none(),
        "A's node was taken for the event naming B's VM: {:?}",
        watch_a.states()
    );
    println!("B while its agent is down: {:?}", watch_b.states());
    remove_guard(&rig.k, &nb);
    rig.stop();
}

/// Hole 2, the flip: an agent (node F, no providerID) states its own VM in
/// its report of one event, then another VM in its report of a second
/// event. F is cordoned once for its own event and not cordoned and
/// released pass after pass; the second event, which names only the other
/// VM, holds nothing and gets no approval.
#[test]
fn an_agent_stating_two_vms_is_not_flipped_pass_after_pass() {
    let (_turn, c) = suite();
    let f = 8;
    let nf = node(f);
    let (own, other) = (
        "C3000000-0000-4000-8000-000000000001",
        "C3000000-0000-4000-8000-000000000002",
    );
    let elsewhere = "advvmss-elsewhere";
    let mut rig = Rig::start(&c, "two-vms", std::slice::from_ref(&nf), &[], &[]);
    let watch = rig.watch_node(&nf);
    let attacker = rig.attacker(&nf);
    // F's agent stated its VM at start, before the node was taken.
    attacker
        .state_vm(&rig.rt, &vm(f))
        .expect("F's agent states its VM");
    rig.write(&attacker, &report(own, &nf, &vm(f), &[&vm(f)]))
        .expect("F may write its own report");
    let took = cordoned_for(&rig, &nf, &object_name(own));
    println!("F cordoned {took:?} after its report of its own VM's event");
    rig.write(&attacker, &report(other, &nf, elsewhere, &[elsewhere]))
        .expect("F may write its own report");
    eventually("the second event's object", HANG, || {
        rig.event(&object_name(other))
    });
    std::thread::sleep(OBSERVE);
    let states = watch.states();
    println!("F: {states:?}");
    assert!(
        watch.cordons() <= 1,
        "F was cordoned {} times: cordoned and released pass after pass as its stated VM flips: {states:?}",
        watch.cordons()
    );
    assert!(
        watch.held_for(&object_name(other)).is_none(),
        "F was held for the event naming {elsewhere}, a VM it stated second: {states:?}"
    );
    let ev = rig.event(&object_name(other));
    assert!(
        ev.as_ref().and_then(decided).is_none(),
        "an approval was decided for the event naming {elsewhere} on F's second statement: {}",
        status_text(ev.as_ref())
    );
    rig.stop();
}

/// Hole 3: node G's agent token writes 1,000 reports about made-up events
/// (half naming G's VM, half naming VMs of no node; `NotBefore` earlier
/// than the real event's), and B's own agent reports a real `Reboot`
/// (`NotBefore` +120 s), while the controller is down. When it starts
/// again, with every report in its caches, B's object is in its first
/// batch of creations (in the API server's order of storage): the flood
/// did not go first. The controller counts G's reports over the per-node
/// cap (`forewarn_controller_reports_over_cap`), and B is not released
/// while its guarded pod runs.
#[test]
fn a_flood_of_one_nodes_reports_delays_no_other_nodes_event() {
    // Above the per-node cap of live reports the controller takes (512),
    // twice the events a maintenance wave over one availability set lists.
    const FLOOD: usize = 1000;
    let (_turn, c) = suite();
    let (g, b) = (9, 10);
    let (ng, nb) = (node(g), node(b));
    let id = "F4000000-0000-4000-8000-000000000001";
    let sev = object_name(id);
    let pod = guard(&admin(&c), &nb);
    let mut rig = Rig::start(
        &c,
        "flood",
        &[ng.clone(), nb.clone()],
        &[(nb.clone(), vm(b))],
        &[MockEvent {
            id,
            event_type: "Reboot",
            resources: vec![vm(b)],
            notice: 120,
            only_named: true,
        }],
    );
    // Down while the flood and B's report are written.
    rig.kill_controller();
    let attacker = rig.attacker(&ng);
    // G's agent stated its VM at start, before the node was taken.
    attacker
        .state_vm(&rig.rt, &vm(g))
        .expect("G's agent states its VM");
    let soon = (Utc::now() + chrono::Duration::seconds(60))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let own_vm = vm(g);
    let flood: Vec<Value> = (0..FLOOD)
        .map(|i| {
            // Ids that sort before the real event's.
            let id = format!("00000000-0000-4000-8000-{i:012}");
            let foreign = format!("advvmss-flood-{i}");
            let named = if i % 2 == 0 {
                own_vm.as_str()
            } else {
                foreign.as_str()
            };
            let mut r = report(&id, &ng, &own_vm, &[named]);
            r["spec"]["report"]["notBefore"] = json!(soon);
            r
        })
        .collect();
    let t = Instant::now();
    let refused = rig.write_all(&attacker, &flood, 16);
    println!(
        "G wrote {} of {FLOOD} reports in {:?} ({} refused{})",
        FLOOD - refused.len(),
        t.elapsed(),
        refused.len(),
        refused
            .first()
            .map(|r| format!(", e.g. {r}"))
            .unwrap_or_default()
    );
    rig.start_clock();
    let b_report = format!("{sev}.{nb}");
    eventually("B's agent's report of its Reboot", HANG, || {
        rig.report(&b_report)
    });
    assert!(
        rig.events().is_empty(),
        "objects were created while the controller was down"
    );

    // The order of creation as the API server stored it (resourceVersions).
    let creations = rig.watch_creations::<ScheduledEvent>();
    rig.start_controller();
    let real_at = eventually(&format!("the object of {sev}"), HANG, || {
        creations.created(&sev)
    });
    let before: Vec<String> = creations
        .all()
        .into_iter()
        .filter(|(n, rv)| *n != sev && *rv < real_at)
        .map(|(n, _)| n)
        .collect();
    println!(
        "{} of the flood's objects were created before {sev}",
        before.len()
    );
    // In name order (the ids sort before the real event's), by `NotBefore`
    // (the flood's are earlier) or in the order the reports came, the
    // flood's objects the cap admits would all come first. The controller
    // creates the most urgent first, nodes taking turns, own VMs first,
    // with a fixed number in flight: B's is among the first it sends.
    assert!(
        before.len() < forewarn::controller::act::spec::CREATE_CONCURRENCY,
        "{} of the flood's objects were created before B's event object: the flood went first ({:?}…)",
        before.len(),
        &before[..before.len().min(5)]
    );
    assert!(
        rig.guard_runs(&nb, &pod) && rig.approvals(id).is_empty(),
        "an approval of the real event reached IMDS while {pod} runs on {nb}: {:?}",
        rig.approvals(id)
    );
    // The controller counts G's reports over the cap (a gauge per node).
    let over = |metrics: &str| -> Vec<String> {
        metrics
            .lines()
            .filter(|l| l.starts_with("forewarn_controller_reports_over_cap"))
            .map(str::to_string)
            .collect()
    };
    let counted = |lines: &[String]| {
        lines.iter().any(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v > 0.0)
        })
    };
    let start = Instant::now();
    let lines = loop {
        let lines = over(&rig.controller_metrics());
        if counted(&lines) || start.elapsed() > HANG {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    println!("{lines:?}");
    assert!(
        counted(&lines),
        "the controller counts none of G's {FLOOD} reports over the per-node cap (no forewarn_controller_reports_over_cap above 0): {lines:?}"
    );
    remove_guard(&rig.k, &nb);
    rig.stop();
}

/// Hole 4: an approval written into `status.approval` by someone else than
/// the controller (here the admin, another field manager), with the right
/// appearance and digest, mid-drain, is not sent to IMDS; the controller's
/// own approval is, once the drain ends.
#[test]
fn a_hand_written_approval_is_not_sent_before_the_drain_ends() {
    let (_turn, c) = suite();
    let b = 11;
    let nb = node(b);
    let id = "D5000000-0000-4000-8000-000000000001";
    let sev = object_name(id);
    let pod = guard(&admin(&c), &nb);
    let mut rig = Rig::start(
        &c,
        "hand-written",
        std::slice::from_ref(&nb),
        &[(nb.clone(), vm(b))],
        &[reboot(id, &[vm(b)], true)],
    );
    rig.start_clock();
    let took = cordoned_for(&rig, &nb, &sev);
    println!("{nb} cordoned {took:?} after its agent's IMDS listed the event");
    let ev = eventually("the drain blocked by the budget", HANG, || {
        rig.event(&sev)
            .filter(|e| condition_true(e, "DrainBlocked"))
    });
    let body = json!({
        "apiVersion": "forewarn.dev/v1alpha1",
        "kind": "ScheduledEvent",
        "metadata": {"name": sev},
        "status": {"approval": {
            "decidedAt": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "reason": "written by hand",
            "appearance": ev.spec.appearance,
            "digest": ev.spec.digest(),
        }},
    });
    let api: kube::Api<ScheduledEvent> = kube::Api::all(rig.client.clone());
    rig.rt
        .block_on(api.patch_status(
            &sev,
            &kube::api::PatchParams::apply("adversary-admin").force(),
            &kube::api::Patch::Apply(&body),
        ))
        .map_err(refusal)
        .expect("the admin may write the status");
    stays_held(&rig, &nb, &pod, &sev, id);
    approved_only_once_drained(&rig, &nb, id);
    rig.stop();
}

/// Hole 5: agents on L1 and L2 report an event naming only B's VM while B's
/// agent runs (its pod Ready, its IMDS answering) and its document does not
/// list the event: B is not cordoned for it. Then B's own IMDS lists a real
/// event: B is cordoned for that one within the hang bound.
#[test]
fn two_liars_cannot_drain_a_node_whose_agent_runs() {
    let (_turn, c) = suite();
    let (l1, l2, b) = (12, 13, 14);
    let nb = node(b);
    let (fake, real) = (
        "E6000000-0000-4000-8000-000000000001",
        "E6000000-0000-4000-8000-000000000002",
    );
    let pod = guard(&admin(&c), &nb);
    let mut rig = Rig::start(
        &c,
        "two-liars",
        &[node(l1), node(l2), nb.clone()],
        &[(nb.clone(), vm(b))],
        &[reboot(real, &[vm(b)], true)],
    );
    let watch = rig.watch_node(&nb);
    for l in [l1, l2] {
        let attacker = rig.attacker(&node(l));
        attacker
            .state_vm(&rig.rt, &vm(l))
            .expect("a liar's agent states its VM");
        rig.write(&attacker, &report(fake, &node(l), &vm(l), &[&vm(b)]))
            .expect("a liar may write its own report");
    }
    eventually("the fake event's object", HANG, || {
        rig.event(&object_name(fake))
    });
    let end = Instant::now() + OBSERVE;
    while Instant::now() < end {
        assert!(
            !rig.unschedulable(&nb),
            "{nb} cordoned on two other agents' word while its own agent runs and does not list the event: {}",
            status_text(rig.event(&object_name(fake)).as_ref())
        );
        assert!(rig.approvals(fake).is_empty());
        std::thread::sleep(Duration::from_millis(250));
    }
    rig.start_clock();
    let took = cordoned_for(&rig, &nb, &object_name(real));
    println!("{nb} cordoned {took:?} after its own IMDS listed a real event");
    assert!(
        watch.held_for(&object_name(fake)).is_none(),
        "{nb} was held for the fake event: {:?}",
        watch.states()
    );
    assert!(rig.guard_runs(&nb, &pod));
    remove_guard(&rig.k, &nb);
    rig.stop();
}

/// Reports whose `scheduledEvent` is not the object name of their `EventId`
/// (a GUID's lower-case spelling; another id's `sev-` hash) are refused by
/// the API server or ignored by the controller: no object of that name is
/// built from them and their node is not held for it. A report written
/// after them, of the right name, is acted on.
#[test]
fn a_report_whose_name_is_not_its_event_id_is_refused_or_ignored() {
    let (_turn, c) = suite();
    let a = 15;
    let na = node(a);
    let mut rig = Rig::start(&c, "misnamed", std::slice::from_ref(&na), &[], &[]);
    let watch = rig.watch_node(&na);
    let attacker = rig.attacker(&na);
    let own = vm(a);
    // A's agent stated its VM at start, before the node was taken.
    attacker
        .state_vm(&rig.rt, &own)
        .expect("A's agent states its VM");
    let mut accepted = Vec::new();
    // A GUID EventId under another GUID's name; an id that is no GUID under
    // a `sev-` name that is not its hash.
    let cases = [
        (
            "A7000000-0000-4000-8000-000000000001",
            "a7000000-0000-4000-8000-000000000002".to_string(),
        ),
        ("not-a-guid-event", "sev-0123456789abcdef0123".to_string()),
    ];
    for (id, name) in &cases {
        let mut r = report(id, &na, &own, &[&own]);
        r["metadata"]["name"] = json!(format!("{name}.{na}"));
        r["spec"]["scheduledEvent"] = json!(name);
        match rig.write(&attacker, &r) {
            Err(e) => println!("{name} with EventId {id}: refused: {e}"),
            Ok(()) => {
                println!("{name} with EventId {id}: stored; the controller must ignore it");
                accepted.push(name.clone());
            }
        }
    }
    let good = "A7000000-0000-4000-8000-000000000003";
    rig.write(&attacker, &report(good, &na, &own, &[&own]))
        .expect("a report of the right name");
    let took = cordoned_for(&rig, &na, &object_name(good));
    println!("{na} cordoned {took:?} after its report of the right name");
    std::thread::sleep(OBSERVE / 2);
    for name in &accepted {
        let ev = rig.event(name);
        assert!(
            ev.is_none(),
            "the controller built {name} from a report whose EventId is not its name: {:?}",
            ev.map(|e| e.spec)
        );
        assert!(
            watch.held_for(name).is_none(),
            "{na} was held for {name}, named after no EventId of its reports: {:?}",
            watch.states()
        );
    }
    rig.stop();
}

/// Oversize reports are refused by the API server: 10,000 `Resources`, a
/// 1 MiB description, a 1,000-character event type, each written by an
/// agent's token for its own node; the same report of ordinary size is
/// stored.
#[test]
fn oversize_reports_are_refused_by_the_api_server() {
    let (_turn, c) = suite();
    let a = 15;
    let na = node(a);
    let k = admin(&c);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let kc = agent_kubeconfig(&k, &na, "oversize-attacker");
    let client = rt.block_on(client_for(&kc.kubeconfig)).expect("client");
    let apply = |obj: &Value| -> Result<(), String> {
        let api: kube::Api<forewarn::api::ScheduledEventReport> = kube::Api::all(client.clone());
        let name = obj["metadata"]["name"].as_str().expect("name");
        rt.block_on(api.patch(
            name,
            &kube::api::PatchParams::apply(forewarn::api::AGENT_MANAGER).force(),
            &kube::api::Patch::Apply(obj),
        ))
        .map(|_| ())
        .map_err(refusal)
    };
    let id = "A8000000-0000-4000-8000-000000000001";
    let own = vm(a);
    let base = report(id, &na, &own, &[&own]);
    let many: Vec<String> = (0..10_000).map(|i| format!("advvmss-many_{i}")).collect();
    let cases: [(&str, &str, Value); 3] = [
        ("10,000 Resources", "resources", json!(many)),
        (
            "a 1 MiB description",
            "description",
            json!("x".repeat(1 << 20)),
        ),
        (
            "a 1,000-character type",
            "eventType",
            json!("R".repeat(1000)),
        ),
    ];
    let mut stored = Vec::new();
    for (what, field, value) in cases {
        let mut r = base.clone();
        r["spec"]["report"][field] = value;
        match apply(&r) {
            Ok(()) => stored.push(what),
            Err(e) => {
                let shown: String = e.chars().take(300).collect();
                println!("{what}: refused: {shown}");
                assert!(
                    e.contains(&format!("spec.report.{field}")),
                    "the refusal of {what} names another field: {shown}"
                );
            }
        }
    }
    assert!(
        stored.is_empty(),
        "the API server stored an agent's report with {}",
        stored.join(", with ")
    );
    apply(&base).expect("the same report of ordinary size is stored");
    k.run(
        &[
            "delete",
            "scheduledeventreports",
            &format!("{}.{na}", object_name(id)),
            "--ignore-not-found",
        ],
        None,
    );
}

/// Hole 8: agent G writes 600 `Reboot` reports of its own VM whose
/// `NotBefore` is a second away; then B's own IMDS lists a real `Reboot`
/// with 90 s of notice. B is cordoned well before its `NotBefore`: the
/// flood's passes take one turn a round at the gate, not every turn.
#[test]
fn an_urgent_flood_keeps_no_other_node_from_its_cordon() {
    const FLOOD: usize = 600;
    let (_turn, c) = suite();
    let (g, b) = (16, 17);
    let (ng, nb) = (node(g), node(b));
    let id = "F8000000-0000-4000-8000-000000000001";
    let sev = object_name(id);
    let mut rig = Rig::start(
        &c,
        "urgent-flood",
        &[ng.clone(), nb.clone()],
        &[(nb.clone(), vm(b))],
        &[MockEvent {
            id,
            event_type: "Reboot",
            resources: vec![vm(b)],
            notice: 90,
            only_named: true,
        }],
    );
    let attacker = rig.attacker(&ng);
    attacker
        .state_vm(&rig.rt, &vm(g))
        .expect("G's agent states its VM");
    let soon = (Utc::now() + chrono::Duration::seconds(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let own_vm = vm(g);
    let flood: Vec<Value> = (0..FLOOD)
        .map(|i| {
            let id = format!("08000000-0000-4000-8000-{i:012}");
            let mut r = report(&id, &ng, &own_vm, &[own_vm.as_str()]);
            r["spec"]["report"]["notBefore"] = json!(soon);
            r
        })
        .collect();
    let t = Instant::now();
    let refused = rig.write_all(&attacker, &flood, 16);
    println!(
        "G wrote {} of {FLOOD} urgent reports in {:?}",
        FLOOD - refused.len(),
        t.elapsed()
    );
    // The flood is in the controller's hands: its objects are being made.
    eventually("the flood's first objects", HANG, || {
        (rig.events().len() > 10).then_some(())
    });
    let clock = rig.start_clock();
    let not_before = clock + chrono::Duration::seconds(90);
    let took = cordoned_for(&rig, &nb, &sev);
    println!("{nb} cordoned {took:?} after its agent's IMDS listed the event");
    assert!(
        Utc::now() < not_before - chrono::Duration::seconds(20),
        "{nb} was cordoned {took:?} after the event appeared: not well before its NotBefore ({not_before})"
    );
    rig.stop();
}

/// Hole 9: B's real `Reboot` is three hours away, so its drain waits for
/// the one-hour lead time. Agent A reports the same `EventId` naming its
/// own VM and B's, `Started`, at appearance 5, then withdraws it. B is never
/// cordoned for it, and no approval reaches IMDS.
#[test]
fn a_start_another_node_reports_skips_no_lead_time() {
    let (_turn, c) = suite();
    let (a, b) = (18, 19);
    let (na, nb) = (node(a), node(b));
    let id = "F9000000-0000-4000-8000-000000000001";
    let sev = object_name(id);
    let mut rig = Rig::start(
        &c,
        "foreign-start",
        &[na.clone(), nb.clone()],
        &[(nb.clone(), vm(b))],
        &[MockEvent {
            id,
            event_type: "Reboot",
            resources: vec![vm(b)],
            notice: 3 * 3600,
            only_named: true,
        }],
    );
    let attacker = rig.attacker(&na);
    attacker
        .state_vm(&rig.rt, &vm(a))
        .expect("A's agent states its VM");
    let watch = rig.watch_node(&nb);
    rig.start_clock();
    eventually("the event, waiting for its lead time", HANG, || {
        rig.event(&sev)
            .filter(|e| e.status.as_ref().and_then(|s| s.phase) == Some(Phase::Pending))
            .map(|_| ())
    });
    let mut lie = report(id, &na, &vm(a), &[&vm(a), &vm(b)]);
    lie["spec"]["report"]["appearance"] = json!(5);
    lie["spec"]["report"]["eventStatus"] = json!("Started");
    lie["spec"]["report"]["notBefore"] = Value::Null;
    rig.write(&attacker, &lie)
        .expect("A may write its own report");
    std::thread::sleep(OBSERVE / 2);
    lie["spec"]["report"]["eventStatus"] = json!("Completed");
    rig.write(&attacker, &lie)
        .expect("A may withdraw its report");
    let end = Instant::now() + OBSERVE;
    while Instant::now() < end {
        assert!(
            watch.held_for(&sev).is_none(),
            "{nb} was cordoned for {sev} hours before its lead time, on A's word: {:?}; the event: {}",
            watch.states(),
            status_text(rig.event(&sev).as_ref())
        );
        let sent = rig.approvals(id);
        assert!(
            sent.is_empty(),
            "an approval of {id} reached IMDS: {sent:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let ev = rig.event(&sev).expect("the event");
    assert_eq!(
        ev.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Pending),
        "B's own event still waits for its lead time: {}",
        status_text(Some(&ev))
    );
    rig.stop();
}

/// Hole 10: an agent cannot give its `VirtualMachineReport` an owner
/// reference (one to a Node of a made-up UID had the garbage collector
/// delete the report, and the agent state another VM) or a finalizer; the
/// controller makes the report owned by its Node, by the node's UID.
#[test]
fn no_agent_can_own_or_hold_its_vm_report() {
    let (_turn, c) = suite();
    let a = 20;
    let na = node(a);
    let mut rig = Rig::start(
        &c,
        "vm-report-owner",
        std::slice::from_ref(&na),
        &[(na.clone(), vm(a))],
        &[],
    );
    let attacker = rig.attacker(&na);
    let body = |meta: Value| {
        json!({
            "apiVersion": "forewarn.dev/v1alpha1",
            "kind": "VirtualMachineReport",
            "metadata": meta,
            "spec": {"node": na, "vm": vm(a), "platformFaultDomain": "0", "platformUpdateDomain": "0"},
        })
    };
    let forged_owner = body(json!({"name": na, "ownerReferences": [{
        "apiVersion": "v1", "kind": "Node", "name": na,
        "uid": "00000000-0000-0000-0000-000000000000"}]}));
    let finalizer = body(json!({"name": na, "finalizers": ["example.com/keep"]}));
    let agent_api: kube::Api<forewarn::topology::VirtualMachineReport> =
        kube::Api::all(attacker.client.clone());
    for (what, obj) in [
        ("an owner reference", &forged_owner),
        ("a finalizer", &finalizer),
    ] {
        let r = rig.rt.block_on(agent_api.patch(
            &na,
            &kube::api::PatchParams::apply(forewarn::api::AGENT_MANAGER).force(),
            &kube::api::Patch::Apply(obj),
        ));
        match r {
            Err(e) => println!("{what}: refused: {}", refusal(e)),
            Ok(stored) => panic!(
                "{na}'s agent gave its VirtualMachineReport {what}: {:?} {:?}",
                stored.metadata.owner_references, stored.metadata.finalizers
            ),
        }
    }
    let uid = rig.node(&na).metadata.uid.expect("a node UID");
    let api: kube::Api<forewarn::topology::VirtualMachineReport> =
        kube::Api::all(rig.client.clone());
    let owners = eventually("the report owned by its node", HANG, || {
        let r = rig.rt.block_on(api.get_opt(&na)).expect("get")?;
        let owners = r.metadata.owner_references.clone().unwrap_or_default();
        owners
            .iter()
            .any(|o| o.kind == "Node" && o.name == na && o.uid == uid)
            .then_some(owners)
    });
    println!("{na}'s VirtualMachineReport owned by {owners:?}");
    std::thread::sleep(Duration::from_secs(2));
    let r = rig
        .rt
        .block_on(api.get_opt(&na))
        .expect("get")
        .expect("the report is still there");
    assert_eq!(r.spec.vm, vm(a));
    rig.stop();
}

/// Hole 11: B's agent has not run yet (no `VirtualMachineReport`) when
/// agent A, whose first statement was B's VM, reports B's event: the event
/// maps to A's empty node and its approval may be decided on A's drain.
/// When B's agent starts and reports the event, B's pods still run: no
/// approval reaches IMDS from B, and the decision is taken back.
#[test]
fn an_approval_decided_on_another_nodes_drain_is_not_sent_from_the_victim() {
    let (_turn, c) = suite();
    let (a, b) = (21, 22);
    let (na, nb) = (node(a), node(b));
    let id = "FB000000-0000-4000-8000-000000000001";
    let sev = object_name(id);
    let pod = guard(&admin(&c), &nb);
    let mut rig = Rig::start(
        &c,
        "laundered-vm",
        &[na.clone(), nb.clone()],
        &[(nb.clone(), vm(b))],
        &[reboot(id, &[vm(b)], true)],
    );
    // As if B's agent had not run yet: down, and no report of its VM.
    rig.kill_agent(&nb);
    rig.k.run(
        &["delete", "virtualmachinereport", &nb, "--ignore-not-found"],
        None,
    );
    let attacker = rig.attacker(&na);
    // A's first statement names B's VM.
    attacker
        .state_vm(&rig.rt, &vm(b))
        .expect("A's agent states a VM");
    rig.write(&attacker, &report(id, &na, &vm(b), &[&vm(b)]))
        .expect("A may write its own report");
    let decided_at = eventually("a decision (or a withheld one) on A's word", HANG, || {
        let ev = rig.event(&sev)?;
        decided(&ev)
            .map(|_| "decided")
            .or_else(|| condition_true(&ev, "ApprovalWithheld").then_some("withheld"))
    });
    println!("on A's report alone, the approval was {decided_at}");
    rig.start_agent(&nb);
    rig.start_clock();
    eventually("B's agent's report of the event", HANG, || {
        rig.report(&format!("{sev}.{nb}"))
    });
    stays_held_or_free(&rig, &nb, &pod, id);
    let ev = rig.event(&sev).expect("the event");
    assert!(
        decided(&ev).is_none(),
        "the approval decided before B's report is still standing: {}",
        status_text(Some(&ev))
    );
    remove_guard(&rig.k, &nb);
    rig.stop();
}

/// For [`OBSERVE`]: `pod` runs on `victim` and IMDS received no approval
/// of `id`.
fn stays_held_or_free(rig: &Rig, victim: &str, pod: &str, id: &str) {
    let end = Instant::now() + OBSERVE;
    while Instant::now() < end {
        assert!(
            rig.guard_runs(victim, pod),
            "the guarded pod {pod} left {victim} though its budget allows no eviction"
        );
        let sent = rig.approvals(id);
        assert!(
            sent.is_empty(),
            "an approval of {id} reached IMDS while {pod} runs on {victim}: {sent:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Hole 12: an event names C's VM and B's (C's first); both agents report
/// it and then C's agent goes down. Agent A, whose VM the event does not
/// name, writes into its own report a record of an accepted approval of
/// the very decision. The status never reads `Accepted` on A's word, and
/// B's agent sends the approval (after its fallback delay).
#[test]
fn a_forged_accepted_approval_keeps_no_agent_from_sending() {
    let (_turn, c) = suite();
    let (cc, b, a) = (23, 24, 25);
    let (nc, nb, na) = (node(cc), node(b), node(a));
    let id = "FC000000-0000-4000-8000-000000000001";
    let sev = object_name(id);
    let resources = [vm(cc), vm(b)];
    let mut rig = Rig::start(
        &c,
        "forged-accepted",
        &[nc.clone(), nb.clone(), na.clone()],
        &[(nc.clone(), vm(cc)), (nb.clone(), vm(b))],
        &[reboot(id, &resources, true)],
    );
    let attacker = rig.attacker(&na);
    attacker
        .state_vm(&rig.rt, &vm(a))
        .expect("A's agent states its VM");
    rig.start_clock();
    for n in [&nc, &nb] {
        eventually(&format!("{n}'s report"), HANG, || {
            rig.report(&format!("{sev}.{n}"))
        });
    }
    // C's agent, the first named, goes down before the decision.
    rig.kill_agent(&nc);
    let ev = eventually("the decision", HANG, || {
        rig.event(&sev).filter(|e| decided(e).is_some())
    });
    let approval = ev
        .status
        .as_ref()
        .and_then(|s| s.approval.clone())
        .expect("decided");
    let mut forged = report(id, &na, &vm(a), &[&vm(cc), &vm(b)]);
    forged["spec"]["report"]["approvals"] = json!([{
        "appearance": approval.appearance,
        "digest": approval.digest,
        "sentAt": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "status": 200,
        "body": "",
    }]);
    rig.write(&attacker, &forged)
        .expect("A may write its own report");
    let sent = eventually("an approval from B's agent", HANG, || {
        let sent = rig.approvals(id);
        (!sent.is_empty()).then_some(sent)
    });
    println!("approvals that reached IMDS: {sent:?}");
    let ev = rig.event(&sev).expect("the event");
    let a = ev
        .status
        .as_ref()
        .and_then(|s| s.approval.clone())
        .expect("decided");
    assert_ne!(
        a.sent_by.as_deref(),
        Some(na.as_str()),
        "the status reads A's word about an approval it could not send: {a:?}"
    );
    rig.stop();
}

/// Hole 13: a `VirtualMachineReport` stating a VM name of 100,000
/// characters is refused by the API server.
#[test]
fn an_oversize_vm_report_is_refused() {
    let (_turn, c) = suite();
    let a = 26;
    let na = node(a);
    let mut rig = Rig::start(&c, "oversize-vm", std::slice::from_ref(&na), &[], &[]);
    let attacker = rig.attacker(&na);
    match attacker.state_vm(&rig.rt, &"v".repeat(100_000)) {
        Err(e) => println!("refused: {}", &e[..e.len().min(300)]),
        Ok(()) => panic!("a VirtualMachineReport stating a 100,000-character VM was stored"),
    }
    rig.stop();
}

/// Hole 13 again: agent A writes 1,100 reports, each of an event already
/// `Completed` (outside the cap of live reports that count); the
/// controller's cache takes in at most its per-node share of them and says
/// so, whatever A writes.
#[test]
fn ended_reports_beyond_a_nodes_share_are_not_cached() {
    const ENDED: usize = 1100;
    let (_turn, c) = suite();
    let a = 26;
    let na = node(a);
    let mut rig = Rig::start(&c, "ended-flood", std::slice::from_ref(&na), &[], &[]);
    let attacker = rig.attacker(&na);
    let own = vm(a);
    let ended: Vec<Value> = (0..ENDED)
        .map(|i| {
            let id = format!("0d000000-0000-4000-8000-{i:012}");
            let mut r = report(&id, &na, &own, &[own.as_str()]);
            r["spec"]["report"]["eventStatus"] = json!("Completed");
            r
        })
        .collect();
    let refused = rig.write_all(&attacker, &ended, 16);
    assert!(
        refused.is_empty(),
        "A's own reports: {:?}",
        &refused[..refused.len().min(3)]
    );
    let cap = forewarn::controller::observe::intake::MAX_CACHED_REPORTS_PER_NODE;
    assert!(ENDED > cap);
    eventually(
        &format!("the controller saying it holds no more than {cap} of {na}'s reports"),
        HANG,
        || {
            rig.controller_log()
                .lines()
                .any(|l| l.contains("the newest are not taken in") && l.contains(&na))
                .then_some(())
        },
    );
    rig.stop();
}
