//! `make demo`: a local cluster with 3 nodes, a Deployment spread over them
//! with a PodDisruptionBudget, the workload of `examples/notice-workload.yaml`
//! (a StatefulSet whose pods take part: they get each event as a notice and
//! forewarn waits for their acknowledgement), the IMDS mock playing an Azure
//! scenario, one agent per node and the controller, with a live timeline.
//! KWOK runs no container, so the harness plays the StatefulSet's
//! containers (it reads each notice and acknowledges it with the pod's
//! ServiceAccount token, as `examples/workload.rs notice` does on a real
//! node). Exits 0 only if the scenario completed and the rules held.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::options::{Acknowledgers, RunOptions};
use forewarn_harness::report::summary;
use forewarn_harness::run::{run_scenario, sibling_forewarn_bin};

/// Plays an Azure Scheduled Events scenario against a local cluster.
#[derive(Parser)]
struct Args {
    /// Scenario file (see tests/fixtures/).
    #[arg(long, default_value = "tests/fixtures/platform-redeploy.yaml")]
    scenario: PathBuf,
    /// Fail if the scenario has not completed after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3m")]
    timeout: Duration,
    /// Leave the cluster running afterwards (`hack/cluster.sh env` to use it).
    #[arg(long)]
    keep: bool,
    /// Leave out the workload that takes part (examples/notice-workload.yaml).
    #[arg(long)]
    no_notice_workload: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let scenario = if args.scenario.is_absolute() {
        args.scenario.clone()
    } else {
        repo_root().join(&args.scenario)
    };
    let Some(bin) = sibling_forewarn_bin() else {
        eprintln!("demo: the forewarn binary is not built next to this example; run `make demo`");
        return ExitCode::FAILURE;
    };
    println!("forewarn demo: {}", scenario.display());
    println!(
        "starting a local cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK) with 3 nodes..."
    );
    let cluster = match tokio::task::spawn_blocking(|| Cluster::start("forewarn-demo", 3)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            eprintln!("demo: FAIL: the local cluster could not start: {e:#}");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("demo: FAIL: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut opts = RunOptions::new(scenario, bin);
    opts.live = true;
    opts.timeout = args.timeout;
    if args.no_notice_workload {
        println!(
            "cluster up; deploying shop/web (6 replicas, PodDisruptionBudget minAvailable 5)\n"
        );
    } else {
        println!(
            "cluster up; deploying shop/web (6 replicas, PodDisruptionBudget minAvailable 5) and \
             shop/db (examples/notice-workload.yaml: 3 pods labelled forewarn.dev/acknowledge; the \
             harness plays their containers, which acknowledge each notice after 3 s)\n"
        );
        opts.extra_manifests
            .push(repo_root().join("examples/notice-workload.yaml"));
        opts.acknowledgers = Some(Acknowledgers {
            pods: ["db-0", "db-1", "db-2"].map(String::from).to_vec(),
            service_account: "notice-workload".into(),
            prepare: Duration::from_secs(3),
            silent: Vec::new(),
        });
    }
    let result = run_scenario(&cluster, &opts).await;
    let code = match &result {
        Ok(report) => {
            print!("{}", summary(report));
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("demo: FAIL: {e:#}");
            ExitCode::FAILURE
        }
    };
    if args.keep {
        println!("cluster kept: eval \"$(hack/cluster.sh env --name forewarn-demo)\"");
    } else if let Err(e) = cluster.stop() {
        eprintln!("demo: could not delete the cluster: {e:#}");
    }
    code
}
