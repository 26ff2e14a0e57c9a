//! `make bench-drain`: how long forewarn takes to drain a node of 105 pods,
//! against `kubectl drain --ignore-daemonsets --delete-emptydir-data
//! --force` (the kubectl built by hack/) draining an identical node, on the
//! same local cluster, alternating, `--runs` times each. The pods are kept
//! by a PodDisruptionBudget of `maxUnavailable: 10` and take 1-3 s to stop
//! after their eviction (shorter than their 30 s grace, as real servers do;
//! KWOK Stages, hack/kwok-stages.yaml). Prints both medians and
//! `drain_vs_kubectl_ratio=<forewarn/kubectl>`; a benchmark reports, it
//! does not fail on a slow figure.
//!
//! forewarn is timed from the moment the node is seen cordoned (an
//! IMDS `Redeploy` with a long notice, played by the mock) to the moment no
//! benchmark pod is left on it; kubectl from its start to its exit (it
//! cordons first too).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use forewarn_harness::cluster::Cluster;
use forewarn_harness::procs::{Fleet, FleetOptions};
use forewarn_harness::run::sibling_forewarn_bin;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// Drains a 105-pod node with forewarn and with kubectl, alternating.
#[derive(Parser)]
struct Args {
    /// Runs of each (at least 5 for a median worth quoting).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Pods on the drained node.
    #[arg(long, default_value_t = 105)]
    pods: i32,
    /// The forewarn executable (default: the one next to this program).
    #[arg(long)]
    forewarn_bin: Option<std::path::PathBuf>,
}

const NS: &str = "bench";
const TARGET: &str = "node-000000";
const VM: &str = "bench-vmss_0";

fn kubectl(cluster: &Cluster, args: &[&str]) -> anyhow::Result<String> {
    cluster.kubectl(args)
}

async fn set_cordon(client: &Client, node: &str, on: bool) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({"spec": {"unschedulable": if on { json!(true) } else { json!(null) }, "taints": null},
                       "metadata": {"annotations": {"forewarn.dev/cordoned-for": null}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn pods_on(client: &Client, node: &str) -> anyhow::Result<usize> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    Ok(pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?
        .items
        .len())
}

/// Puts `pods` pods of a fresh Deployment on `TARGET` (every other node
/// cordoned meanwhile), with a PodDisruptionBudget of maxUnavailable 10.
async fn prepare(
    cluster: &Cluster,
    client: &Client,
    pods: i32,
    nodes: &[String],
) -> anyhow::Result<()> {
    let _ = kubectl(
        cluster,
        &[
            "delete",
            "namespace",
            NS,
            "--wait=true",
            "--ignore-not-found",
        ],
    );
    for n in nodes {
        set_cordon(client, n, n != TARGET).await?;
    }
    let manifest = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "svc", "namespace": NS},
         "spec": {"replicas": pods, "selector": {"matchLabels": {"app": "svc"}},
                  "template": {"metadata": {"labels": {"app": "svc"},
                                            "annotations": {"forewarn.dev/stop-after": "1s", "forewarn.dev/stop-before": "3s"}},
                               "spec": {"terminationGracePeriodSeconds": 30,
                                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "svc", "namespace": NS},
         "spec": {"maxUnavailable": 10, "selector": {"matchLabels": {"app": "svc"}}}},
    ]});
    let file = std::env::temp_dir().join("forewarn-bench-drain.json");
    std::fs::write(&file, serde_json::to_vec(&manifest)?)?;
    kubectl(cluster, &["apply", "-f", &file.to_string_lossy()])?;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let ready = kubectl(
            cluster,
            &[
                "get",
                "deploy",
                "svc",
                "-n",
                NS,
                "-o",
                "jsonpath={.status.readyReplicas}",
            ],
        )?;
        let allowed = kubectl(
            cluster,
            &[
                "get",
                "pdb",
                "svc",
                "-n",
                NS,
                "-o",
                "jsonpath={.status.disruptionsAllowed}",
            ],
        )?;
        if ready.trim() == pods.to_string() && allowed.trim() == "10" {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the benchmark's pods were not ready within 180 s ({ready} ready, PDB allows {allowed})"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for n in nodes.iter().filter(|n| *n != TARGET) {
        set_cordon(client, n, false).await?;
    }
    Ok(())
}

async fn wait_empty(client: &Client, node: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while pods_on(client, node).await? > 0 {
        if Instant::now() > deadline {
            bail!("{node} still has pods after {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// One drain by forewarn: mock, agent for the node, controller; a Redeploy
/// of its VM with 10 minutes' notice.
async fn drain_with_forewarn(
    cluster: &Cluster,
    client: &Client,
    bin: &Path,
    run: usize,
) -> anyhow::Result<Duration> {
    let dir = forewarn_harness::cluster::repo_root()
        .join(format!("target/forewarn-bench/forewarn-{run}"));
    std::fs::create_dir_all(&dir)?;
    let scenario = dir.join("scenario.yaml");
    std::fs::write(
        &scenario,
        format!(
            "vms:\n  - {{name: {VM}, node: {TARGET}}}\nevents:\n  - id: 00000000-0000-4000-8000-0000000000{run:02}\n    type: Redeploy\n    resources: [{VM}]\n    at: 1s\n    notice: 10m\n    runFor: 1s\n"
        ),
    )?;
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    let env = [
        ("KUBECONFIG", kubeconfig.as_str()),
        ("RUST_LOG", "info,kube=warn"),
    ];
    let lease = format!("bench-{}-{run}", std::process::id());
    let vms = [(TARGET.to_string(), VM.to_string())];
    let mut fleet = Fleet::start(FleetOptions::new(
        bin,
        &env,
        &dir,
        &scenario,
        "127.0.0.2:0",
        &lease,
        &vms,
    ))
    .await?;
    fleet.wait_ready(Duration::from_secs(60)).await?;
    let http = forewarn::http::client_builder().no_proxy().build()?;
    http.post(format!("{}/mock/start", fleet.imds_base()))
        .send()
        .await?
        .error_for_status()?;
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = nodes.get(TARGET).await?;
        if n.spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
        {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "forewarn did not cordon {TARGET} within 60 s (logs: {})",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    wait_empty(client, TARGET, Duration::from_secs(300)).await?;
    let took = started.elapsed();
    for p in fleet.all_mut() {
        let _ = p.terminate(Duration::from_secs(15)).await;
    }
    let _ = kubectl(cluster, &["delete", "scheduledevents", "--all"]);
    Ok(took)
}

fn drain_with_kubectl(cluster: &Cluster) -> anyhow::Result<Duration> {
    let started = Instant::now();
    kubectl(
        cluster,
        &[
            "drain",
            TARGET,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--force",
            "--timeout=300s",
        ],
    )
    .context("kubectl drain failed")?;
    Ok(started.elapsed())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

async fn bench(args: &Args) -> anyhow::Result<()> {
    let bin = args
        .forewarn_bin
        .clone()
        .or_else(sibling_forewarn_bin)
        .context("the forewarn binary is not built next to this example; run `make bench-drain`")?;
    let cluster = tokio::task::spawn_blocking(|| Cluster::start("forewarn-bench", 4)).await??;
    let client = cluster.client().await?;
    let nodes: Vec<String> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        for forewarn_first in [run % 2 == 0, run % 2 != 0] {
            prepare(&cluster, &client, args.pods, &nodes).await?;
            let (who, took) = if forewarn_first {
                (
                    "forewarn",
                    drain_with_forewarn(&cluster, &client, &bin, run).await?,
                )
            } else {
                (
                    "kubectl",
                    tokio::task::block_in_place(|| drain_with_kubectl(&cluster))?,
                )
            };
            println!(
                "run {run}: {who:<8} drained {} pods in {:6.2} s",
                args.pods,
                took.as_secs_f64()
            );
            if who == "forewarn" {
                ours.push(took.as_secs_f64());
            } else {
                theirs.push(took.as_secs_f64());
            }
            set_cordon(&client, TARGET, false).await?;
        }
    }
    let (m_ours, m_theirs) = (median(ours), median(theirs));
    println!("forewarn_drain_median_seconds={m_ours:.2}");
    println!("kubectl_drain_median_seconds={m_theirs:.2}");
    println!(
        "drain_vs_kubectl_ratio={:.2} (goal: at most 0.50)",
        m_ours / m_theirs
    );
    cluster.stop()?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match bench(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-drain: FAIL: {e:#}");
            ExitCode::FAILURE
        }
    }
}
