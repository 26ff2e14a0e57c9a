//! End-to-end tests: every scenario under `tests/fixtures/` played on a real
//! local control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, KWOK) with the real `forewarn` binary as agents,
//! controller and IMDS mock. They fail, never skip, when the cluster cannot
//! start.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use forewarn::api::{Phase, ScheduledEvent};
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::options::RunOptions;
use forewarn_harness::report::{Report, summary};
use forewarn_harness::run::run_scenario;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

/// The clusters of this test binary: scenarios run two at a time, each on
/// a cluster of its own (each started once, on first use):
/// `forewarn-test` and `forewarn-test-b`, or the two names, comma-separated,
/// in `FOREWARN_SCENARIO_CLUSTERS` (to run this file beside `make test`).
fn cluster_name(slot: usize) -> String {
    let names = std::env::var("FOREWARN_SCENARIO_CLUSTERS")
        .unwrap_or_else(|_| "forewarn-test,forewarn-test-b".into());
    let names: Vec<&str> = names.split(',').map(str::trim).collect();
    assert_eq!(
        names.len(),
        2,
        "FOREWARN_SCENARIO_CLUSTERS names two clusters: {names:?}"
    );
    names[slot].to_string()
}

fn cluster(slot: usize) -> Cluster {
    static CELLS: [OnceLock<Result<Cluster, String>>; 2] = [OnceLock::new(), OnceLock::new()];
    CELLS[slot]
        .get_or_init(|| Cluster::start(&cluster_name(slot), 3).map_err(|e| format!("{e:#}")))
        .clone()
        .unwrap_or_else(|e| {
            panic!(
                "the local cluster {} could not start: {e}",
                cluster_name(slot)
            )
        })
}

static SLOTS: [tokio::sync::Mutex<()>; 2] = [
    tokio::sync::Mutex::const_new(()),
    tokio::sync::Mutex::const_new(()),
];

/// Waits for a free cluster and holds it for the caller's scenario.
async fn take_cluster() -> (Cluster, tokio::sync::MutexGuard<'static, ()>) {
    loop {
        for (slot, lock) in SLOTS.iter().enumerate() {
            if let Ok(guard) = lock.try_lock() {
                let cluster = tokio::task::spawn_blocking(move || cluster(slot))
                    .await
                    .expect("cluster start panicked");
                return (cluster, guard);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn play(file: &str) -> Report {
    play_with(file, |_| {}).await
}

async fn play_with(file: &str, adjust: impl FnOnce(&mut RunOptions)) -> Report {
    let (cluster, _turn) = take_cluster().await;
    let mut opts = RunOptions::new(
        repo_root().join("tests/fixtures").join(file),
        PathBuf::from(env!("CARGO_BIN_EXE_forewarn")),
    );
    // A hang bound: these scenarios are over in 15 to 60 s; a healthy run
    // ends as soon as its events are over and its nodes released.
    opts.timeout = Duration::from_secs(240);
    // Runs of one fixture may overlap on the two clusters: a log dir each.
    static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = opts
        .log_dir
        .file_name()
        .map(|f| format!("{}-{n}", f.to_string_lossy()))
        .unwrap_or_default();
    opts.log_dir = opts.log_dir.with_file_name(dir);
    adjust(&mut opts);
    let report = run_scenario(&cluster, &opts)
        .await
        .unwrap_or_else(|e| panic!("{file}: could not run: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    assert!(
        report.ok(),
        "{file}:\n{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    assert!(
        report.min_ready >= report.min_available,
        "PodDisruptionBudget violated: {} ready",
        report.min_ready
    );
    every_object_is_final(&cluster, file).await;
    report
}

/// The final phases: nothing more happens to such an event.
const FINAL: [Phase; 3] = [Phase::Completed, Phase::Cancelled, Phase::Ignored];

/// After a scenario, with its processes stopped and before the next one on
/// the cluster (which deletes them): `kubectl get sev -o wide` is printed,
/// and every `ScheduledEvent` on the cluster must be in a final phase, in
/// the table's PHASE column and in the stored `status.phase`.
async fn every_object_is_final(cluster: &Cluster, file: &str) {
    let table = cluster
        .kubectl(&["get", "scheduledevents", "-o", "wide"])
        .unwrap_or_else(|e| panic!("{file}: kubectl get scheduledevents: {e:#}"));
    println!(
        "$ kubectl get sev -o wide   # after {file}, on {}\n{table}",
        cluster.name
    );
    let client = cluster.client().await.expect("client");
    let sevs = Api::<ScheduledEvent>::all(client)
        .list(&ListParams::default())
        .await
        .expect("list ScheduledEvents");
    assert!(
        !sevs.items.is_empty(),
        "{file}: no ScheduledEvent on the cluster after the scenario"
    );
    let not_final: Vec<String> = sevs
        .items
        .iter()
        .filter(|ev| {
            !ev.status
                .as_ref()
                .and_then(|s| s.phase)
                .is_some_and(|p| FINAL.contains(&p))
        })
        .map(|ev| {
            format!(
                "{} ({:?})",
                ev.name_any(),
                ev.status.as_ref().and_then(|s| s.phase)
            )
        })
        .collect();
    assert!(
        not_final.is_empty(),
        "{file}: ScheduledEvents not in a final phase after the scenario: {not_final:?}\n{table}"
    );
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let column = header
        .iter()
        .position(|h| *h == "PHASE")
        .unwrap_or_else(|| panic!("no PHASE column in:\n{table}"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), sevs.items.len(), "{table}");
    for row in rows {
        let phase = row.get(column).copied().unwrap_or_default();
        assert!(
            FINAL.iter().any(|p| p.as_str() == phase),
            "{file}: {} shows phase {phase:?} in:\n{table}",
            row.first().copied().unwrap_or_default()
        );
    }
}

fn approved_via(r: &Report) -> Vec<String> {
    r.approvals.iter().filter_map(|a| a.vm.clone()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn platform_redeploy_drains_then_approves_then_uncordons() {
    let r = play("platform-redeploy.yaml").await;
    assert_eq!(r.cordoned, ["node-000001"]);
    assert!(!r.approvals.is_empty());
    assert!(
        r.timeline.iter().any(|l| l.contains("Evicted")),
        "no eviction in the timeline"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn short_freeze_of_two_vms_is_approved_without_cordon() {
    let r = play("freeze-two-vms.yaml").await;
    assert!(r.cordoned.is_empty(), "cordoned {:?}", r.cordoned);
    assert!(!r.approvals.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn long_freeze_of_two_vms_waits_for_both_drains() {
    let r = play("freeze-long-two-vms.yaml").await;
    assert_eq!(r.cordoned, ["node-000000", "node-000002"]);
    assert!(!r.approvals.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn user_reboot_is_drained_and_approved() {
    let r = play("user-reboot.yaml").await;
    assert_eq!(r.cordoned, ["node-000002"]);
    assert!(!r.approvals.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelled_maintenance_uncordons_the_node() {
    let r = play("cancelled-maintenance.yaml").await;
    assert_eq!(r.cordoned, ["node-000000"]);
    assert!(
        r.timeline
            .iter()
            .any(|l| l.contains("cancelled: gone from IMDS"))
    );
    assert!(r.timeline.iter().any(|l| l.contains("Uncordoned")));
}

#[tokio::test(flavor = "multi_thread")]
async fn hardware_failure_cordons_at_once_with_no_approval() {
    let r = play("hardware-failure.yaml").await;
    assert_eq!(r.cordoned, ["node-000002"]);
    assert!(r.approvals.is_empty(), "approved: {:?}", r.approvals);
}

/// The 30 s notice is the point: the node is drained, and what happens at
/// the drain deadline (NotBefore minus 5 s) depends on whether the drain
/// beat it, which depends on the machine's load: approved once drained
/// (the harness checks that nothing was left on the node when IMDS got
/// the approval, and that it was decided after the drain), or held with
/// the drain recorded incomplete (a `DrainIncomplete` Event).
#[tokio::test(flavor = "multi_thread")]
async fn spot_preempt_with_thirty_seconds_notice_is_drained_then_approved_or_held_at_the_deadline()
{
    let r = play("spot-preempt.yaml").await;
    assert_eq!(r.cordoned, ["node-000000"]);
    assert!(
        !r.approvals.is_empty() || r.timeline.iter().any(|l| l.contains("DrainIncomplete")),
        "neither approved nor recorded DrainIncomplete:\n{}",
        r.timeline.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn scale_set_terminate_is_approved_only_by_the_vm_it_deletes() {
    let r = play("scaleset-terminate.yaml").await;
    assert_eq!(r.cordoned, ["node-000002"]);
    let via = approved_via(&r);
    assert!(!via.is_empty());
    assert!(
        via.iter().all(|v| v == "aks-nodepool1-27351046-vmss_2"),
        "approved via {via:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn event_naming_a_foreign_vm_is_drained_but_never_approved() {
    let r = play("foreign-vm.yaml").await;
    assert_eq!(r.cordoned, ["node-000001"]);
    assert!(r.approvals.is_empty(), "approved: {:?}", r.approvals);
}

/// The counter value of `metric` with `label` in a Prometheus text exposition.
fn counter(text: &str, metric: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(metric) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_ride_out_garbage_errors_and_hangs_from_imds() {
    let r = play("imds-faults.yaml").await;
    assert_eq!(r.cordoned, ["node-000001"]);
    assert!(!r.approvals.is_empty());
    let agents: Vec<&(String, String)> = r
        .metrics
        .iter()
        .filter(|(n, _)| n.starts_with("agent"))
        .collect();
    assert_eq!(agents.len(), 3);
    for (name, text) in agents {
        let parse_errors = counter(
            text,
            "forewarn_agent_imds_polls_total",
            "result=\"parse_error\"",
        );
        assert!(
            parse_errors >= 1.0,
            "{name} counted no unparsable document:\n{text}"
        );
    }
    let failures: f64 = r
        .metrics
        .iter()
        .map(|(_, t)| {
            counter(
                t,
                "forewarn_agent_imds_polls_total",
                "result=\"server_error\"",
            ) + counter(
                t,
                "forewarn_agent_imds_polls_total",
                "result=\"unreachable\"",
            )
        })
        .sum();
    assert!(failures >= 2.0, "the 500s and the hang were not counted");
}

#[tokio::test(flavor = "multi_thread")]
async fn node_cordoned_by_an_administrator_stays_cordoned_after_the_event() {
    let r = play_with("platform-redeploy.yaml", |o| {
        o.precordoned = vec!["node-000001".into()];
    })
    .await;
    assert_eq!(r.cordoned, ["node-000001"]);
    assert!(!r.approvals.is_empty(), "drained and approved all the same");
    assert!(
        r.timeline.iter().any(|l| l.contains("stays cordoned")),
        "{}",
        r.timeline.join("\n")
    );
    assert!(!r.timeline.iter().any(|l| l.contains("Uncordoned")));
}

#[tokio::test(flavor = "multi_thread")]
async fn cordon_held_for_a_deleted_scheduled_event_is_released() {
    let r = play_with("freeze-two-vms.yaml", |o| {
        o.orphaned_holds = vec!["node-000002".into()];
    })
    .await;
    // The controller releases it at start, before the scenario begins.
    assert!(
        r.timeline
            .iter()
            .any(|l| l.contains("node-000002's hold for a deleted ScheduledEvent was released")),
        "{}",
        r.timeline.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_killed_during_the_event_is_replaced_and_its_successor_uncordons() {
    // Killed once the event has started; the event then completes while no
    // controller leads (the Lease has not expired yet), and the successor
    // must release the node from the hold recorded on it.
    let r = play_with("platform-redeploy.yaml", |o| {
        o.kill_controller_on_start = true;
    })
    .await;
    assert!(r.timeline.iter().any(|l| l.contains("controller killed")));
    assert_eq!(r.cordoned, ["node-000001"]);
    assert!(!r.approvals.is_empty());
    assert!(r.timeline.iter().any(|l| l.contains("Uncordoned")));
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_restarted_after_its_event_left_imds_marks_it_completed() {
    // Only the named VM sees this event; its agent is down when the event
    // leaves IMDS, so the new agent must work out from the stored object and
    // its own empty document that the event is over, and the node is released.
    let r = play_with("gpu-reboot-own-events.yaml", |o| {
        o.agent_down_across_finish = Some("node-000001".into());
    })
    .await;
    assert!(r.timeline.iter().any(|l| l.contains("started again")));
    assert_eq!(r.cordoned, ["node-000001"]);
    assert!(r.timeline.iter().any(|l| l.contains("Uncordoned")));
}

#[tokio::test(flavor = "multi_thread")]
async fn event_delivered_only_to_the_vm_it_names_is_handled() {
    let r = play("gpu-reboot-own-events.yaml").await;
    assert_eq!(r.cordoned, ["node-000001"]);
    assert_eq!(approved_via(&r), ["aks-gpupool-41220931-vmss_1"]);
}

/// A flood of 200 events in the same second, each with 90 s of notice:
/// every one is approved once drained (the 190 short Freezes at once, the
/// 10 Reboots of the first VM once it is drained), before its `NotBefore`,
/// and reaches Completed (`play` checks each event's expectations and that
/// no node is left cordoned), and only the first VM's node was ever
/// cordoned. All 200 share one deadline: this checks that among equal
/// deadlines the controller takes them in turn, so that none waits behind
/// the others' repeated passes. (The timeout is a hang bound: the
/// scenario's events end about 96 s after it starts, whatever the load;
/// the rest covers the release delay and the play's own checks.)
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_two_hundred_events_at_once_loses_none_and_leaves_nothing_cordoned() {
    let r = play_with("flood-200.yaml", |o| o.timeout = Duration::from_secs(300)).await;
    let approved: std::collections::BTreeSet<&str> =
        r.approvals.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(approved.len(), 200, "approved: {approved:?}");
    // Every event appears 3 s after the clock starts, with 90 s of notice:
    // each approval reached IMDS before its event's `NotBefore` (the
    // mock's own log; after it, Azure would have started the event
    // unapproved).
    let not_before = r.started + chrono::Duration::seconds(3 + 90);
    let late: Vec<String> = r
        .approvals
        .iter()
        .filter(|a| a.time >= not_before)
        .map(|a| format!("{} at {}", a.event_id, a.time))
        .collect();
    assert!(
        late.is_empty(),
        "approvals at or after NotBefore ({not_before}): {late:?}"
    );
    assert_eq!(r.cordoned, ["node-000000"]);
    println!("200 events played in {:.1} s", r.elapsed);
}
