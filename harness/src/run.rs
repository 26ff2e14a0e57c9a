//! Plays one scenario end to end on a local cluster: a Deployment with a
//! PodDisruptionBudget, the IMDS mock, one agent per node and the
//! controller; prints a timeline; checks the rules in docs/how-it-works.md from the
//! outside (nodes, pods and the mock's own log, never forewarn's word).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use forewarn::api::CORDONED_FOR_ANNOTATION;
use forewarn::imds::scenario::Scenario;

use crate::cluster::Cluster;
use crate::observe::{Watches, observe};
use crate::options::RunOptions;
use crate::procs::{Fleet, FleetOptions, Proc};
use crate::report::Report;
use crate::timeline::Timeline;
use crate::workload::{
    create_extra_objects, deploy_workload, reset, wait_ready_count, wait_running,
};

/// Plays `opts.scenario` on `cluster` and checks the outcome.
///
/// # Errors
/// When the run cannot be set up (workload, processes); a run that breaks a
/// rule is not an error but a [`Report`] with violations.
pub async fn run_scenario(cluster: &Cluster, opts: &RunOptions) -> anyhow::Result<Report> {
    let scenario = Scenario::load(&opts.scenario.to_string_lossy())?;
    let client = cluster.client().await?;
    std::fs::create_dir_all(&opts.log_dir)?;
    reset(&client, &opts.namespace, !opts.keep_objects).await?;
    deploy_workload(&client, opts).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for node in &opts.precordoned {
        let cordon = json!({"spec": {"unschedulable": true}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&cordon))
            .await
            .with_context(|| format!("failed to cordon {node} as an administrator would"))?;
    }
    for node in &opts.orphaned_holds {
        let held = json!({
            "metadata": {"annotations": {CORDONED_FOR_ANNOTATION: "deleted-by-hand"}},
            "spec": {"unschedulable": true},
        });
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&held))
            .await
            .with_context(|| format!("failed to leave a stale hold on {node}"))?;
    }

    for (node, event) in &opts.prior_holds {
        let current = nodes.get(node).await?;
        let taints = forewarn::controller::act::cordon::taints_for(&current, true)
            .or_else(|| current.spec.as_ref().and_then(|s| s.taints.clone()));
        let held = json!({
            "metadata": {"annotations": {CORDONED_FOR_ANNOTATION: event}},
            "spec": {"unschedulable": true, "taints": taints},
        });
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&held))
            .await
            .with_context(|| {
                format!("failed to hold {node} for {event} as an earlier forewarn would")
            })?;
    }
    create_extra_objects(cluster, opts)?;
    for manifest in &opts.extra_manifests {
        cluster
            .kubectl(&[
                "apply",
                "-n",
                &opts.namespace,
                "-f",
                &manifest.to_string_lossy(),
            ])
            .with_context(|| format!("failed to apply {}", manifest.display()))?;
    }
    if let Some(a) = &opts.acknowledgers {
        wait_running(&client, &opts.namespace, &a.pods).await?;
    }
    if let Some((selector, count)) = &opts.ready_before_start {
        wait_ready_count(&client, &opts.namespace, selector, *count).await?;
    }
    let policy_file = opts.log_dir.join("policy.yaml");
    if let Some(policy) = &opts.policy {
        std::fs::write(&policy_file, policy)?;
    }
    let policy_path = policy_file.to_string_lossy().into_owned();
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    // The proxy variables point nowhere and exempt only the API server's
    // address: IMDS (the mock, on 127.0.0.2) must be reached directly, never
    // through a proxy (Azure docs), so the agents must ignore them.
    let mut env = vec![
        ("HTTP_PROXY", "http://127.0.0.1:9"),
        ("HTTPS_PROXY", "http://127.0.0.1:9"),
        ("NO_PROXY", "127.0.0.1,localhost"),
        ("KUBECONFIG", kubeconfig.as_str()),
        ("RUST_LOG", "info,kube=warn,tower=warn,hyper=warn"),
    ];
    if opts.policy.is_some() {
        env.push(("FOREWARN_POLICY_FILE", policy_path.as_str()));
    }
    for (k, v) in &opts.extra_env {
        env.push((k.as_str(), v.as_str()));
    }
    let stem = opts
        .log_dir
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let lease = format!("forewarn-{}-{stem}", std::process::id());
    let vms: Vec<(String, String)> = scenario
        .vms
        .iter()
        .filter_map(|v| Some((v.node.clone()?, v.name.clone())))
        .collect();
    // Watching from before forewarn starts: it may act at once (a node
    // held before the run is drained as soon as the controller leads).
    let watches = Watches::start(client.clone(), &opts.namespace).await?;
    if opts.agents_as_chart {
        let namespace = opts
            .credentials
            .as_ref()
            .map_or("default".to_string(), |c| c.lease_namespace.clone());
        let nodes: Vec<String> = vms.iter().map(|(n, _)| n.clone()).collect();
        crate::agent_pods::start(&client, &namespace, &nodes, Duration::from_secs(180)).await?;
    }
    let mut fleet = Fleet::start(FleetOptions {
        credentials: opts.credentials.clone(),
        runners: opts.agent_runners.clone(),
        // With the chart's credentials, or agents as the chart runs them.
        witnesses: opts.agents_as_chart || opts.credentials.is_some(),
        ..FleetOptions::new(
            &opts.forewarn_bin,
            &env,
            &opts.log_dir,
            &opts.scenario,
            "127.0.0.2:0",
            &lease,
            &vms,
        )
    })
    .await?;
    // A hang bound: every process is ready within seconds of starting.
    fleet.wait_ready(Duration::from_secs(120)).await?;
    if let Some(path) = &opts.prometheus_targets {
        write_prometheus_targets(path, &fleet.metrics_ports())?;
    }

    if let Some(gate) = &opts.start_gate {
        let bound = tokio::time::Instant::now() + Duration::from_secs(180);
        while !gate.exists() {
            anyhow::ensure!(
                tokio::time::Instant::now() < bound,
                "the start gate {} was not opened within 180 s",
                gate.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let http = forewarn::http::client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()?;
    fleet.start_mock(&http).await?;
    let mut tl = Timeline::new(opts.live);
    tl.say(
        "harness",
        format!(
            "{} agents and the controller are ready; scenario started: {}",
            fleet.agents.len(),
            scenario.description.trim()
        ),
    );

    let report = observe(
        cluster, &http, &scenario, opts, &mut tl, &mut fleet, watches,
    )
    .await;
    tl.flush(true);

    let mut metrics = Vec::new();
    for (name, port) in fleet.metrics_ports() {
        let text = match http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => format!("unreachable: {e}"),
        };
        metrics.push((name, text));
    }
    let mut stop_problems = Vec::new();
    // The agents of deleted VMs were killed for good.
    let gone: Vec<String> = report
        .as_ref()
        .map(|r| {
            r.deleted_nodes
                .iter()
                .map(|(_, n)| format!("agent {n}"))
                .collect()
        })
        .unwrap_or_default();
    let procs: Vec<&mut Proc> = fleet
        .all_mut()
        .filter(|p| !gone.contains(&p.name))
        .collect();
    // The chart's terminationGracePeriodSeconds (30 s): the kubelet would
    // SIGKILL a process still running then. A healthy one exits within a
    // second or two of SIGTERM, loaded or not.
    for p in procs.into_iter().rev() {
        match p.terminate(Duration::from_secs(30)).await {
            Ok(s) if s.success() => {}
            Ok(s) => stop_problems.push(format!(
                "{} exited with {s} on SIGTERM (log: {})",
                p.name,
                p.log.display()
            )),
            Err(e) => stop_problems.push(e.to_string()),
        }
    }
    if opts.agents_as_chart {
        let namespace = opts
            .credentials
            .as_ref()
            .map_or("default".to_string(), |c| c.lease_namespace.clone());
        let nodes: Vec<String> = vms.iter().map(|(n, _)| n.clone()).collect();
        if let Err(e) = crate::agent_pods::stop(&client, &namespace, &nodes).await {
            stop_problems.push(format!("removing the agent pods: {e:#}"));
        }
    }
    let mut report = report?;
    report.violations.extend(stop_problems);
    report.started = tl.origin;
    report.timeline = tl.lines;
    report.sev_table = cluster
        .kubectl(&["get", "scheduledevents", "-o", "wide"])
        .unwrap_or_else(|e| e.to_string());
    report.log_dir = opts.log_dir.clone();
    report.metrics = metrics;
    Ok(report)
}

/// Writes `ports` (process name, port) as a Prometheus file service
/// discovery file, atomically (a temporary file renamed over it). Each
/// target carries what Kubernetes service discovery would tell
/// prometheus-operator about the pod: its role in `__meta_forewarn_role`
/// (`agent`, `controller`; dropped after relabeling), its `namespace`
/// (`forewarn`) and, for agents, its `node`. The `job` label is left to the
/// scrape configuration, as the chart's monitors set it.
///
/// # Errors
/// When the file cannot be written.
fn write_prometheus_targets(path: &Path, ports: &[(String, u16)]) -> anyhow::Result<()> {
    let groups: Vec<serde_json::Value> = ports
        .iter()
        .map(|(name, port)| {
            let labels = match name.strip_prefix("agent ") {
                Some(node) => json!({
                    "__meta_forewarn_role": "agent",
                    "namespace": "forewarn",
                    "node": node,
                }),
                None => json!({"__meta_forewarn_role": "controller", "namespace": "forewarn"}),
            };
            json!({"targets": [format!("127.0.0.1:{port}")], "labels": labels})
        })
        .collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&groups)?)
        .with_context(|| format!("failed to write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("failed to write {}", path.display()))?;
    Ok(())
}

/// Path of the `forewarn` binary next to the running executable
/// (`target/<profile>/forewarn` for `target/<profile>/examples/demo`).
pub fn sibling_forewarn_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let dir: &Path = if dir.ends_with("examples") || dir.ends_with("deps") {
        dir.parent()?
    } else {
        dir
    };
    let bin = dir.join("forewarn");
    bin.is_file().then_some(bin)
}
