//! The fault-injection soak's fixed seeds (forewarn_harness::soak, as
//! `make soak` runs it for longer): each seed plays one round of random
//! scenarios per fault kind it names (a few minutes) on a local cluster of
//! its own
//! (`forewarn-soak-test`, 6 KWOK nodes, every write in the audit log), with
//! the fault kinds it names injected in turn, and fails on any broken
//! invariant, or when a fault kind it names was never injected (a soak that
//! injected nothing proves nothing). A seed that once found a defect stays
//! here. Fails, never skips, when the cluster cannot start.

use std::sync::OnceLock;
use std::time::Duration;

use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::soak::{self, FaultKind, SoakOptions};

const NODES: usize = 6;

fn cluster() -> Cluster {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            forewarn_harness::audit::start_cluster(
                "forewarn-soak-test",
                NODES,
                &repo_root().join("target/soak-test"),
            )
            .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .unwrap_or_else(|e| panic!("the local cluster could not start: {e}"))
}

/// The seeds take turns on the one cluster.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn soak_seed(seed: u64, faults: &[FaultKind]) {
    let _turn = TURN.lock().await;
    let cluster = cluster();
    let opts = SoakOptions {
        seed,
        // One round a fault kind, each kind injected in its own round.
        duration: Duration::ZERO,
        min_rounds: faults.len(),
        faults: faults.to_vec(),
        forewarn_bin: std::path::PathBuf::from(env!("CARGO_BIN_EXE_forewarn")),
        log_dir: repo_root().join(format!("target/soak-test/seed-{seed}")),
        nodes: NODES,
    };
    let rounds = soak::run_soak(&cluster, &opts, |r| {
        println!(
            "round {} (seed {:016x}, faults {:?}): {} events, {} checks, {} violations in {:.0} s; logs {}",
            r.index,
            r.seed,
            r.faults,
            r.events,
            r.checks,
            r.violations.len(),
            r.elapsed.as_secs_f64(),
            r.log_dir.display()
        );
    })
    .await
    .unwrap_or_else(|e| panic!("the soak could not run: {e:#}"));
    println!("{}", soak::table_markdown(&rounds));
    let violations: Vec<String> = rounds
        .iter()
        .flat_map(|r| {
            r.violations
                .iter()
                .map(move |v| format!("round {} (seed {:016x}): {v}", r.index, r.seed))
        })
        .collect();
    assert!(
        violations.is_empty(),
        "seed {seed}: {} violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
    for kind in faults {
        assert!(
            rounds.iter().any(|r| r.faults.contains(kind)),
            "seed {seed}: {} was never injected",
            kind.name()
        );
    }
    let checks: usize = rounds.iter().map(|r| r.checks).sum();
    assert!(checks > 0, "seed {seed}: nothing was checked");
}

/// A relist right after a create (kube-apiserver restarted), a node's
/// cordon refused, IMDS failing.
#[tokio::test(flavor = "multi_thread")]
async fn seed_11_api_restart_admission_nodes_imds() {
    soak_seed(
        11,
        &[
            FaultKind::ApiRestart,
            FaultKind::AdmissionNodes,
            FaultKind::Imds,
        ],
    )
    .await;
}

/// The leader killed and paused past its Lease, a node deleted.
#[tokio::test(flavor = "multi_thread")]
async fn seed_23_leader_kill_pause_node_deleted() {
    soak_seed(
        23,
        &[
            FaultKind::LeaderKill,
            FaultKind::LeaderPause,
            FaultKind::NodeDeleted,
        ],
    )
    .await;
}

/// Agents restarted, evictions refused, the leader paused.
#[tokio::test(flavor = "multi_thread")]
async fn seed_37_agent_restart_admission_evictions_leader_pause() {
    soak_seed(
        37,
        &[
            FaultKind::AgentRestart,
            FaultKind::AdmissionEvictions,
            FaultKind::LeaderPause,
        ],
    )
    .await;
}
