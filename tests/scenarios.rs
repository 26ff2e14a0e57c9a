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

/// The VMs of the Spot wave (one node and agent each).
const WAVE_VMS: usize = 50;
/// Workload pods per node of the wave.
const WAVE_PODS_PER_NODE: usize = 10;
/// Nodes that take the evicted pods' replacements (the pool Azure does not
/// take back), created as the wave starts.
const WAVE_SPARES: usize = 3;

/// A Spot wave (harness/src/wave.rs): `WAVE_VMS` Spot VMs evicted at
/// once, each by its own `Preempt` event of 30 s notice, all appearing
/// within one second and delivered, as Azure does, to every VM of the
/// placement group (each agent, with a Ready pod as the chart runs it,
/// reports only its own VM's event: no witness is needed), with
/// `WAVE_PODS_PER_NODE` pods per node under PodDisruptionBudgets. Checked
/// from the API server's records and the IMDS mock's log, not timed: every
/// event ends `Completed` (`play`'s checks of the scenario's expectations)
/// with its node cordoned, nothing is left cordoned, every approval sent is in the mock's log and came through the
/// event's own VM, an event not approved is recorded `DrainIncomplete`,
/// and on every node cordoned early enough to leave (`TIME_TO_LEAVE`
/// before `NotBefore`) no PodDisruptionBudget that allowed an eviction
/// waited longer than `wave::BUDGET_TAKEN_WITHIN` for forewarn to ask for one
/// before the drain deadline (the budgets' versions, and each eviction's
/// `deletionTimestamp` minus the grace the API server applied); how many
/// pods still ran at `NotBefore` is printed (the bench's `wave` part
/// measures it).
///
/// The scenarios' clusters have 3 nodes; this test adds the wave's other
/// nodes before it plays and the spares as it starts, and deletes them
/// after, so the other scenarios keep their 3. The controller runs with an eviction
/// budget of 100/s (burst 200): at the default 20/s the 500 evictions of
/// the wave alone take 25 s of the 25 s before the drain deadline (see
/// docs/install.md, "Sizing").
#[tokio::test(flavor = "multi_thread")]
#[ignore = "run alone by make test once the other suites have ended (hack/test-all.sh), and by make test-wave: beside other suites on 2 cores the mock, the API server and 50 agents starve each other"]
async fn a_spot_wave_of_fifty_vms_is_cordoned_at_once_and_drained_as_budgets_allow() {
    use forewarn_harness::wave;
    let (cluster, _turn) = take_cluster().await;
    let client = cluster.client().await.expect("client");
    let wave_nodes: Vec<String> = (0..WAVE_VMS).map(wave::node_name).collect();
    let spares: Vec<String> = (WAVE_VMS..WAVE_VMS + WAVE_SPARES)
        .map(wave::node_name)
        .collect();
    let mut added = wave::add_nodes(&client, &wave_nodes, None)
        .await
        .expect("add the wave's nodes");
    // The spares come when the wave starts (the run's reset would take a
    // taint off): the workload's first pods all land on the wave's nodes.
    added.extend(spares.iter().cloned());
    let dir = repo_root().join("target/forewarn-runs/spot-wave");
    std::fs::create_dir_all(&dir).expect("run dir");
    let spare_file = dir.join("spare-nodes.json");
    let spare_list = wave::node_list(&client, &spares)
        .await
        .expect("the spare nodes");
    std::fs::write(&spare_file, spare_list.to_string()).expect("write the spare nodes");
    let file = dir.join("spot-wave.yaml");
    let first = Duration::from_secs(3);
    std::fs::write(&file, wave::scenario_yaml(WAVE_VMS, first)).expect("write the scenario");
    let mut opts = RunOptions::new(file, PathBuf::from(env!("CARGO_BIN_EXE_forewarn")));
    // A hang bound: the events end about 50 s in (3 s, 30 s of notice,
    // 15 s of running), then the release delay and the run's own checks.
    opts.timeout = Duration::from_secs(360);
    opts.log_dir = dir.join("run");
    opts.replicas = 2;
    opts.min_available = 1;
    opts.extra_objects = wave::workload(WAVE_VMS, WAVE_PODS_PER_NODE, &spares);
    opts.ready_before_start = Some(("wave=true".into(), WAVE_VMS * WAVE_PODS_PER_NODE));
    opts.extra_env = vec![
        ("FOREWARN_EVICTION_QPS".into(), "100".into()),
        ("FOREWARN_EVICTION_BURST".into(), "200".into()),
        // The mock plays 50 VMs' IMDS on the same 2 cores as the API
        // server, the controller and 50 agents while 500 pods move: an
        // answer can take seconds there (real IMDS is the host's own). A
        // slow answer is waited for rather than timed out and backed off
        // from, so that no agent misses an event's `Started`.
        ("FOREWARN_IMDS_TIMEOUT".into(), "6s".into()),
        ("FOREWARN_IMDS_MAX_BACKOFF".into(), "2s".into()),
    ];
    opts.timed_kubectl = vec![(
        Duration::ZERO,
        vec![
            "apply".into(),
            "-f".into(),
            spare_file.to_string_lossy().into_owned(),
        ],
    )];
    // As its kubelet would: a leader that could not renew its Lease on a
    // loaded machine exits (the run shows it), and carries on restarted.
    opts.restart_exited_controller = true;
    // Agents as the chart runs them (each with a Ready pod): each reports
    // its own VM's event, no witnesses are asked for, and the wave costs a
    // report per event, not one per event and agent.
    opts.agents_as_chart = true;
    let result = run_scenario(&cluster, &opts).await;
    // The cluster goes back to its 3 nodes whatever happened: the
    // workload first (its pods would outlive their nodes), then the nodes.
    let _ = cluster.kubectl(&["delete", "namespace", "shop", "--timeout=120s"]);
    let removed = wave::remove_nodes(&client, &added).await;
    let r = result.unwrap_or_else(|e| panic!("the Spot wave could not run: {e:#}"));
    removed.expect("remove the nodes added");
    println!("{}\n{}", r.timeline.join("\n"), summary(&r));
    // What a failure needs first: how late each node was cordoned.
    let mut late: Vec<f64> = (0..WAVE_VMS)
        .filter_map(|i| {
            let appeared = r.started
                + chrono::TimeDelta::from_std(wave::appears_at(first, i, WAVE_VMS)).ok()?;
            Some((r.first_cordon(&wave::node_name(i))? - appeared).as_seconds_f64())
        })
        .collect();
    late.sort_by(f64::total_cmp);
    println!(
        "Spot wave: {} of {WAVE_VMS} nodes cordoned, {} to {} s after their event appeared",
        late.len(),
        late.first().map_or("-".into(), |s| format!("{s:.1}")),
        late.last().map_or("-".into(), |s| format!("{s:.1}")),
    );
    for (at, what) in &r.restarts {
        println!("Spot wave: restarted at {at}: {what}");
    }
    assert!(r.ok(), "{}\n{}", r.timeline.join("\n"), summary(&r));
    assert!(
        r.min_ready >= r.min_available,
        "PodDisruptionBudget violated: {} ready",
        r.min_ready
    );
    every_object_is_final(&cluster, "spot-wave.yaml").await;
    let missing: Vec<&String> = wave_nodes
        .iter()
        .filter(|n| !r.cordoned.contains(n))
        .collect();
    assert!(missing.is_empty(), "never cordoned: {missing:?}");

    // Every event's NotBefore as the ScheduledEvent first showed it, within
    // a second of the scenario's own (IMDS writes whole seconds).
    let mut events = std::collections::BTreeMap::new();
    for i in 0..WAVE_VMS {
        let id = wave::event_id(i);
        let nb = *r
            .not_before
            .get(&id)
            .unwrap_or_else(|| panic!("no NotBefore seen for {id}"));
        let appeared =
            r.started + chrono::TimeDelta::from_std(wave::appears_at(first, i, WAVE_VMS)).unwrap();
        let scheduled = appeared + chrono::TimeDelta::from_std(wave::SPOT_NOTICE).unwrap();
        assert!(
            (nb - scheduled).num_milliseconds().abs() <= 1500,
            "{id}: NotBefore {nb}, the scenario says {scheduled}"
        );
        events.insert(wave::node_name(i), (appeared, nb));
    }
    let cordons: std::collections::BTreeMap<String, chrono::DateTime<chrono::Utc>> = wave_nodes
        .iter()
        .filter_map(|n| Some((n.clone(), r.first_cordon(n)?)))
        .collect();
    // The budget check below reads each node's budget history: one never
    // seen would read as a budget never open.
    for node in &wave_nodes {
        let budget = wave::budget_of(node).expect("a wave node's budget");
        assert!(
            r.budgets
                .iter()
                .any(|b| b.budget == format!("shop/{budget}")),
            "no version of PodDisruptionBudget shop/{budget} was seen"
        );
    }
    let figures = wave::figures(&events, &r.initial_pods, &r.deletions, &cordons, &r.budgets);
    let mut unused: Vec<f64> = figures.iter().map(|f| f.unused_budget).collect();
    unused.sort_by(f64::total_cmp);
    println!(
        "Spot wave: an open PodDisruptionBudget waited for its eviction at most {:.1} s (median {:.1} s)",
        unused.last().copied().unwrap_or_default(),
        unused.get(unused.len() / 2).copied().unwrap_or_default()
    );
    for f in &figures {
        let wave_pods = r.initial_pods.get(&f.node).map_or(0, |p| {
            p.iter().filter(|p| p.starts_with("shop/wave-")).count()
        });
        assert_eq!(
            wave_pods, WAVE_PODS_PER_NODE,
            "{}: the wave began with {wave_pods} of its pods there",
            f.node
        );
        // Every pod of a node cordoned in time was asked to leave as soon
        // as its PodDisruptionBudget allowed: the budget never stood open
        // longer than wave::BUDGET_TAKEN_WITHIN while the node had pods to evict
        // (from the cordon to the drain deadline; the API server's records:
        // the budget's versions, each eviction's deletionTimestamp minus
        // the grace it applied). A pod the budget kept until NotBefore
        // stays, as the budget asks; how many still ran at NotBefore is
        // printed below and is the bench's figure.
        if f.had_time {
            assert!(
                f.unused_budget <= wave::BUDGET_TAKEN_WITHIN.as_secs_f64(),
                "{} (cordoned {:?}, NotBefore {}): its PodDisruptionBudget allowed an eviction for {:.1} s that forewarn did not take (deletions ending after NotBefore: {:?})",
                f.node,
                f.cordoned,
                f.not_before,
                f.unused_budget,
                f.late
            );
        }
    }
    let had_time = figures.iter().filter(|f| f.had_time).count();
    let left: usize = figures
        .iter()
        .map(wave::EventFigures::left_at_not_before)
        .sum();
    println!(
        "Spot wave: {WAVE_VMS} events; {had_time} nodes cordoned at least {:?} before NotBefore; {left} pods still running at NotBefore",
        wave::TIME_TO_LEAVE
    );

    // No approval lost, none from another VM, and an event not approved
    // says why.
    let sevs = Api::<ScheduledEvent>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list ScheduledEvents");
    let mut approved = 0;
    for i in 0..WAVE_VMS {
        let id = wave::event_id(i);
        let ev = sevs
            .items
            .iter()
            .find(|e| e.spec.event_id.eq_ignore_ascii_case(&id))
            .unwrap_or_else(|| panic!("no ScheduledEvent for {id}"));
        let status = ev.status.clone().unwrap_or_default();
        let in_log: Vec<&forewarn::imds::mock::LogEntry> = r
            .approvals
            .iter()
            .filter(|a| a.event_id.eq_ignore_ascii_case(&id))
            .collect();
        let sent = status.approval.as_ref().and_then(|a| a.sent_at).is_some();
        if sent {
            assert!(
                !in_log.is_empty(),
                "{id}: an approval sent, none in the mock's log"
            );
        }
        for a in &in_log {
            assert_eq!(a.vm.as_deref(), Some(wave::vm_name(i).as_str()), "{id}");
        }
        if in_log.is_empty() {
            let incomplete = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "DrainIncomplete" && c.status == "True");
            assert!(
                incomplete,
                "{id}: neither approved nor recorded DrainIncomplete: {status:?}"
            );
        } else {
            approved += 1;
        }
    }
    println!("Spot wave: {approved} of {WAVE_VMS} events approved before their NotBefore");
}
