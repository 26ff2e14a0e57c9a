//! The Helm chart on a real node: `helm install charts/forewarn` with the
//! image built here, run as only a real kubelet shows it.
//!
//! - `chart_agent_runs_on_the_real_node`: the agent DaemonSet's pod on
//!   `real-node-0` is Ready through its probes, its Node is annotated with the
//!   VM name read from IMDS at 169.254.169.254, and the chart's admission
//!   policy applies to the pod-bound token the kubelet mounted (the agent may
//!   write its own Node's annotation, not another Node's).
//! - `chart_drives_a_redeploy_of_the_real_node`: the whole chart end to end.
//!   Agent and controller run as real pods on `real-node-0` (the controller
//!   with `controller.hostNetwork`, since pods reach the API server only on
//!   127.0.0.1 here), real workload containers run there next to KWOK pods
//!   under a PodDisruptionBudget, and the IMDS mock plays a `Redeploy` of the
//!   real node's VM: the event is mirrored, the node cordoned and drained
//!   (each real container gets its `preStop` and SIGTERM within its grace,
//!   read back with `kubectl logs`), the leader pod is deleted mid-drain and
//!   the standby replica takes over, the agent pod sends the approval, and
//!   the node is uncordoned.
//!
//!   One real node limits what can be shown: a controller never sees its own
//!   node drained while its pod runs there, and its replacement cannot run
//!   anywhere else here (KWOK nodes run nothing). So the controller pod is
//!   kept from evicting itself (test value: its PDB at `maxUnavailable: 0`)
//!   until the test deletes it, and the standby replica that takes over is
//!   the same binary with the chart's arguments and the chart's controller
//!   ServiceAccount token, run next to the cluster: it stands for the
//!   replica the chart's topology spread puts on another node. The deleted
//!   leader's replacement stays Pending on the cordoned node and runs there
//!   again after the uncordon.
//!
//! Run by `FOREWARN_REAL_TESTS="real_node real_node_chart" hack/real-node.sh
//! test` (`make test-real-chart`, and `make test`), inside the real node's
//! namespace; it needs `charts/forewarn` and `hack/build-helm.sh`.
#![cfg(feature = "real-node")]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use forewarn::api::AGENT_MANAGER;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use support::{AGENT_IMAGE, LogFollow, VM, api_port, client, env, exit_stamp, start_mock};

#[path = "support/real_node.rs"]
mod support;

const NS: &str = "forewarn-chart";

fn helm(args: &[&str], kubeconfig: &std::path::Path, home: &std::path::Path) -> String {
    let helm = std::env::var("FOREWARN_HELM")
        .ok()
        .filter(|h| !h.is_empty())
        .expect("FOREWARN_HELM is not set: run through FOREWARN_REAL_TESTS=\"real_node real_node_chart\" hack/real-node.sh test");
    let out = Command::new(&helm)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Uninstalls the release of `ns`, the processes of its pods first: the
/// DaemonSet and the Deployment are deleted, and once their pods on the
/// real node (the only ones that run a process; KWOK's take their whole
/// grace period to go, running nothing) are gone, `helm uninstall` takes
/// the RBAC away. So no process of the chart runs without its RBAC (a
/// request it sent then would be refused, which tests/audit.rs counts
/// against the chart's RBAC).
fn uninstall(env: &support::Env, ns: &str, home: &std::path::Path) {
    let release = "app.kubernetes.io/instance=forewarn";
    env.cluster
        .kubectl(&["delete", "daemonset,deployment", "-n", ns, "-l", release])
        .expect("delete the chart's workloads");
    let on_node = format!("spec.nodeName={}", env.node);
    // A hang bound: the chart's processes exit at once on SIGTERM (their
    // grace is 30 s); 180 s is only reached if one never goes.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let left = env
            .cluster
            .kubectl(&[
                "get",
                "pods",
                "-n",
                ns,
                "-l",
                release,
                "--field-selector",
                &on_node,
                "-o",
                "name",
            ])
            .expect("list the chart's pods");
        if left.trim().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the chart's pods on {} still there 180 s after their workloads were deleted: {left}",
            env.node
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    helm(
        &["uninstall", "forewarn", "--namespace", ns, "--wait"],
        &env.cluster.kubeconfig,
        home,
    );
}

/// `kubectl` with a bearer token instead of the admin credentials; returns
/// (success, stdout + stderr).
fn kubectl_as(env: &support::Env, token: &str, args: &[&str]) -> (bool, String) {
    let server = env
        .cluster
        .kubectl(&[
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ])
        .expect("server");
    let out = Command::new(env.cluster.kubectl_path())
        .args([
            "--kubeconfig=/dev/null",
            &format!("--server={server}"),
            "--insecure-skip-tls-verify=true",
            &format!("--token={token}"),
        ])
        .args(args)
        .output()
        .expect("run kubectl");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn chart_agent_runs_on_the_real_node() {
    let env = env();
    let client = client(&env).await;
    let release = release();
    let mut mock = start_mock(&env).await;
    env.cluster
        .kubectl(&["create", "namespace", NS])
        .expect("create namespace");
    // hostNetwork needs Pod Security "privileged" (the chart's NOTES say so).
    env.cluster
        .kubectl(&[
            "label",
            "namespace",
            NS,
            "pod-security.kubernetes.io/enforce=privileged",
        ])
        .expect("label namespace");
    let port = api_port(&env);
    let api_env = format!(
        r#"[{{"name":"KUBERNETES_SERVICE_HOST","value":"127.0.0.1"}},{{"name":"KUBERNETES_SERVICE_PORT","value":"{port}"}}]"#
    );
    let home = env.logs.join("helm");
    let from = forget_forewarn_image(&release);
    let started = Instant::now();
    // The chart as `make release` published it: from the registry, its
    // image pinned by digest in its own values (pulled IfNotPresent).
    helm(
        &[
            "install",
            "forewarn",
            &release.chart,
            "--version",
            &release.version,
            "--plain-http",
            "--namespace",
            NS,
            "--set-json",
            &format!("agent.extraEnv={api_env}"),
            "--set-json",
            &format!("controller.extraEnv={api_env}"),
            // The controller is not under test here (it is in
            // chart_drives_a_redeploy_of_the_real_node): its pods go to KWOK nodes.
            "--set-json",
            r#"controller.nodeSelector={"type":"kwok"}"#,
            "--set-json",
            r#"controller.tolerations=[{"operator":"Exists"}]"#,
            // Nor is the CRD hook Job, which runs where the controller
            // does: on a KWOK node its pod would be marked Succeeded without
            // running (kwok's pod-complete stage). The e2e test below runs
            // it on the real node.
            "--set",
            "crds.upgradeJob.enabled=false",
            "--wait",
            "--timeout",
            "120s",
        ],
        &env.cluster.kubeconfig,
        &home,
    );
    let installed = started.elapsed();

    // The DaemonSet's pod on the real node: Ready through its probes. A
    // hang bound: `helm install --wait` has waited for it already.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(180);
    let pod = loop {
        let list = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", env.node)))
            .await
            .expect("list pods");
        let ready = list.items.into_iter().find(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        if let Some(p) = ready {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "the chart's agent pod on {} is not Ready",
            env.node
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    println!(
        "helm install --wait returned after {installed:?}; agent pod {} Ready on {} after {:?}",
        pod.name_any(),
        env.node,
        started.elapsed()
    );
    let spec = pod.spec.clone().expect("pod spec");
    assert_eq!(spec.host_network, Some(true));
    let container = &spec.containers[0];
    assert_eq!(container.image.as_deref(), Some(release.image.as_str()));
    assert_pulled_from_registry(&release, &pod, from);
    assert!(
        !container
            .args
            .clone()
            .unwrap_or_default()
            .iter()
            .any(|a| a.contains("imds-url")),
        "the chart passes an IMDS URL: {:?}",
        container.args
    );
    let status = pod.status.clone().unwrap();
    let cs = &status.container_statuses.expect("container statuses")[0];
    assert_eq!(cs.restart_count, 0, "the agent container restarted");

    // The real process: the chart's user, read-only root filesystem.
    let (pid, proc_status) =
        find_process_prefix("/usr/local/bin/forewarn\0").expect("the agent's process");
    let uid = proc_status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap_or_default();
    assert!(
        uid.split_whitespace().skip(1).all(|u| u == "65532"),
        "{uid}"
    );
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("root mount");
    assert!(
        root.split_whitespace()
            .nth(5)
            .is_some_and(|o| o.split(',').any(|o| o == "ro")),
        "{root}"
    );

    // Agents write no Node (the controller maps VMs by providerID and the
    // agents' reports).
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(&env.node).await.expect("node");
    assert!(
        !node
            .managed_fields()
            .iter()
            .any(|m| m.manager.as_deref() == Some(AGENT_MANAGER)),
        "the agent wrote its Node: {:?}",
        node.managed_fields()
    );

    // The token the kubelet mounted into the agent pod: bound to the pod and
    // its node, so the chart's admission policy lets it write its own
    // node's reports and no other node's, and RBAC no Node at all.
    let uid = pod.uid().expect("pod uid");
    let volumes = env
        .kubelet_root
        .join(format!("pods/{uid}/volumes/kubernetes.io~projected"));
    let token_path = std::fs::read_dir(&volumes)
        .unwrap_or_else(|e| panic!("{}: {e}", volumes.display()))
        .flatten()
        .map(|d| d.path().join("token"))
        .find(|p| p.is_file())
        .expect("the pod's projected token");
    let token = std::fs::read_to_string(&token_path).expect("read the token");
    let (ok, out) = kubectl_as(&env, token.trim(), &["auth", "whoami", "-o", "json"]);
    assert!(ok, "{out}");
    println!("the agent pod's token: {out}");
    assert!(
        out.contains("authentication.kubernetes.io/node-name") && out.contains(&env.node),
        "the kubelet's token carries no node claim: {out}"
    );
    let other = nodes
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items
        .into_iter()
        .map(|n| n.name_any())
        .find(|n| *n != env.node)
        .expect("a KWOK node");
    let report = |node: &str| {
        format!(
            "apiVersion: forewarn.dev/v1alpha1\nkind: ScheduledEventReport\nmetadata:\n  name: d1000000-0000-4000-8000-0000000000d1.{node}\nspec:\n  scheduledEvent: d1000000-0000-4000-8000-0000000000d1\n  report:\n    node: {node}\n    vm: {VM}\n    named: false\n    eventStatus: Completed\n    eventId: d1000000-0000-4000-8000-0000000000d1\n    eventType: Reboot\n    resources: [elsewhere]\n"
        )
    };
    let apply = |yaml: String| {
        let file = env.logs.join("real-node-check-report.yaml");
        std::fs::write(&file, yaml).expect("write report");
        kubectl_as(
            &env,
            token.trim(),
            &[
                "apply",
                "--server-side",
                "--field-manager=forewarn-agent",
                "-f",
                &file.to_string_lossy(),
            ],
        )
    };
    let (ok, out) = apply(report(&env.node));
    assert!(
        ok,
        "the agent's token may not write its own node's report: {out}"
    );
    let (ok, out) = apply(report(&other));
    println!("writing {other}'s report with the agent pod's token: {out}");
    assert!(
        !ok && out.contains("may write only its own ScheduledEventReports"),
        "the agent's token wrote another node's report: {out}"
    );
    let (ok, out) = kubectl_as(
        &env,
        token.trim(),
        &[
            "annotate",
            "node",
            &env.node,
            "example.com/x=y",
            "--overwrite",
        ],
    );
    assert!(
        !ok && out.contains("forbidden"),
        "the agent's token annotated its node: {out}"
    );
    env.cluster
        .kubectl(&[
            "delete",
            "scheduledeventreport",
            &format!("d1000000-0000-4000-8000-0000000000d1.{}", env.node),
            "--ignore-not-found",
        ])
        .expect("delete the check's report");

    uninstall(&env, NS, &home);
    mock.terminate(Duration::from_secs(5)).await.ok();
}

/// Like [`find_process`], for a command line that starts with `prefix`.
fn find_process_prefix(prefix: &str) -> Option<(u32, String)> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.starts_with(prefix) && cmd.contains("\0agent\0") {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            return Some((pid, status));
        }
    }
    None
}

const E2E_NS: &str = "forewarn-e2e";
const WORKLOAD_IMAGE: &str = "forewarn.local/workload:dev";
const EVENT_ID: &str = "5E1C0DE0-0000-4000-8000-00000000C4A7";
/// Identity (POD_NAME) of the standby replica that runs off the real node.
const STANDBY: &str = "forewarn-controller-standby-offnode";

fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the workload's log ends with its own `exiting` line (written
/// after its SIGTERM delay, just before it exits 0).
fn exited_cleanly(logs: &str) -> bool {
    logs.lines().any(|l| l.ends_with(" exiting"))
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// A Deployment of the workload image: `serve` with `term_delay` seconds
/// after SIGTERM, a `preStop` exec hook sleeping `prestop` seconds.
fn workload(
    name: &str,
    replicas: i32,
    grace: i64,
    prestop: u64,
    term_delay: u64,
    node_selector: Option<&str>,
) -> serde_json::Value {
    let mut spec = serde_json::json!({
        "terminationGracePeriodSeconds": grace,
        "automountServiceAccountToken": false,
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "server",
            "image": WORKLOAD_IMAGE,
            "imagePullPolicy": "Never",
            "args": ["serve", "--port", "8080", "--term-delay", term_delay.to_string()],
            "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
            "lifecycle": {"preStop": {"exec": {"command":
                ["/usr/local/bin/workload", "prestop", "--sleep", prestop.to_string()]}}},
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
            },
        }],
    });
    match node_selector {
        Some(node) => spec["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": node}),
        None => {
            spec["topologySpreadConstraints"] = serde_json::json!([{
                "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": name}},
            }])
        }
    }
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    })
}

/// One real container evicted from the real node, as the test saw it.
#[derive(Default)]
struct RealPod {
    name: String,
    grace: i64,
    evicted: Option<Duration>,
    grace_sent: Option<i64>,
    /// The end of the grace the eviction gave, as the API server recorded
    /// it (`deletionTimestamp`, whole seconds rounded down).
    grace_ends: Option<chrono::DateTime<chrono::Utc>>,
    sigterm: Option<Duration>,
    exited: Option<Duration>,
    gone: Option<Duration>,
    logs: String,
    /// `kubectl logs -f` from before the Redeploy starts: the stream ends
    /// when the container exits, so it has every line even when the pod
    /// object is deleted before a poll could read it.
    follow: Option<LogFollow>,
}

#[tokio::test]
async fn chart_drives_a_redeploy_of_the_real_node() {
    use forewarn::api::ScheduledEvent;
    use forewarn::imds::mock::LogEntry;
    use forewarn_harness::procs::{Proc, wait_ready};
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use kube::api::{DeleteParams, Patch, PatchParams};

    let env = env();
    let client = client(&env).await;
    let release = release();
    let pods: Api<Pod> = Api::namespaced(client.clone(), E2E_NS);
    let nodes: Api<Node> = Api::all(client.clone());
    let sevs: Api<ScheduledEvent> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), E2E_NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), E2E_NS);
    let apply = |name: &str| {
        (
            name.to_string(),
            PatchParams::apply("real-node-chart-test").force(),
        )
    };

    // IMDS: a platform Redeploy of the real node's VM, its clock held until
    // the chart and the workload are in place.
    let mut mock = support::start_mock_with(
        &env,
        &format!(
            "events:\n  - id: {EVENT_ID}\n    type: Redeploy\n    source: Platform\n    resources: [{VM}]\n    durationSeconds: -1\n    description: Virtual machine is being redeployed to a different host.\n    at: 1s\n    notice: 120s\n    runFor: 5s\n"
        ),
        true,
        "imds-mock-chart-redeploy",
    )
    .await;

    env.cluster
        .kubectl(&["create", "namespace", E2E_NS])
        .expect("create namespace");
    env.cluster
        .kubectl(&[
            "label",
            "namespace",
            E2E_NS,
            "pod-security.kubernetes.io/enforce=privileged",
        ])
        .expect("label namespace");

    // The chart, with values for this one-real-node cluster only (the
    // defaults are untouched): the local image; the API server's address
    // (no kube-proxy); both roles on the real node (the agent's KWOK copies
    // would be Ready without running anything); the controller in the
    // node's network namespace (bridge pods cannot reach 127.0.0.1), one
    // replica there (a second hostNetwork replica cannot share the node's
    // metrics port) and a PodDisruptionBudget that keeps the drain from
    // evicting it, so that the test decides when the leader goes.
    let port = api_port(&env);
    let api_env = format!(
        r#"[{{"name":"KUBERNETES_SERVICE_HOST","value":"127.0.0.1"}},{{"name":"KUBERNETES_SERVICE_PORT","value":"{port}"}}]"#
    );
    let real = r#"{"forewarn.dev/real-node":"true"}"#;
    let home = env.logs.join("helm-e2e");
    let from = forget_forewarn_image(&release);
    let started = Instant::now();
    // The chart as `make release` published it, from the registry, with
    // its image pinned by digest in its own values.
    helm(
        &[
            "install",
            "forewarn",
            &release.chart,
            "--version",
            &release.version,
            "--plain-http",
            "--namespace",
            E2E_NS,
            "--set",
            "logFormat=plain",
            "--set-json",
            &format!("agent.extraEnv={api_env}"),
            "--set-json",
            &format!("agent.nodeSelector={real}"),
            "--set",
            "controller.hostNetwork=true",
            "--set",
            "controller.replicaCount=1",
            "--set-json",
            &format!("controller.extraEnv={api_env}"),
            "--set-json",
            &format!("controller.nodeSelector={real}"),
            "--set",
            "controller.podDisruptionBudget.maxUnavailable=0",
            "--wait",
            "--timeout",
            "120s",
        ],
        &env.cluster.kubeconfig,
        &home,
    );
    println!("helm install --wait returned after {:?}", started.elapsed());

    // The CRD hook ran in a real pod on the real node (the pre-install Job,
    // placed like the controller: `forewarn crds apply` from the image,
    // with the hook's own ServiceAccount, hostNetwork and the API server's
    // address from controller.extraEnv): every CRD carries its field
    // manager, and the Job is gone once it succeeded (hook-succeeded).
    {
        use forewarn::api::install::{APPLY_MANAGER, EVENTS_CRD, REPORTS_CRD, VM_REPORTS_CRD};
        use k8s_openapi::api::batch::v1::Job;
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for name in [EVENTS_CRD, REPORTS_CRD, VM_REPORTS_CRD] {
            let crd = crds.get(name).await.expect("the CRD");
            let managers: Vec<(Option<String>, Option<String>)> = crd
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .map(|m| (m.manager.clone(), m.operation.clone()))
                .collect();
            assert!(
                managers
                    .iter()
                    .any(|(m, op)| m.as_deref() == Some(APPLY_MANAGER)
                        && op.as_deref() == Some("Apply")),
                "{name}: the hook Job did not apply it: {managers:?}"
            );
        }
        let jobs: Api<Job> = Api::namespaced(client.clone(), E2E_NS);
        assert!(
            jobs.get_opt("forewarn-crds").await.expect("jobs").is_none(),
            "the CRD hook Job was not deleted after it succeeded"
        );
    }

    // Both roles Ready on the real node through their probes; the
    // controller pod holds the Lease under its pod name.
    let role = |r: &str| {
        ListParams::default().labels(&format!(
            "app.kubernetes.io/instance=forewarn,app.kubernetes.io/component={r}"
        ))
    };
    // A hang bound: `helm install --wait` has waited for both; the Lease
    // is taken within seconds.
    let deadline = Instant::now() + Duration::from_secs(180);
    let (agent, leader) = loop {
        let agents = pods.list(&role("agent")).await.expect("agent pods").items;
        let controllers = pods
            .list(&role("controller"))
            .await
            .expect("controller pods")
            .items;
        let holder = leases
            .get_opt("forewarn-controller")
            .await
            .expect("lease")
            .and_then(|l| l.spec.and_then(|s| s.holder_identity));
        let agent = agents
            .iter()
            .find(|p| is_ready(p) && node_of(p) == Some(env.node.as_str()));
        let leader = controllers.iter().find(|p| {
            is_ready(p)
                && node_of(p) == Some(env.node.as_str())
                && holder.as_deref() == Some(p.name_any().as_str())
        });
        if let (Some(a), Some(l)) = (agent, leader) {
            assert_eq!(agents.len(), 1, "agent pods off the real node");
            break (a.clone(), l.clone());
        }
        assert!(
            Instant::now() < deadline,
            "agent or controller not Ready on {} (Lease holder {holder:?})",
            env.node
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let leader_name = leader.name_any();
    println!(
        "agent pod {} and controller pod {leader_name} (Lease holder) Ready on {} after {:?}",
        agent.name_any(),
        env.node,
        started.elapsed()
    );
    for (p, path) in [(&agent, "/readyz"), (&leader, "/readyz")] {
        let c = &p.spec.as_ref().unwrap().containers[0];
        let probe = c.readiness_probe.as_ref().expect("readiness probe");
        assert_eq!(
            probe.http_get.as_ref().and_then(|h| h.path.as_deref()),
            Some(path)
        );
        assert_eq!(c.image.as_deref(), Some(release.image.as_str()));
        assert_eq!(p.spec.as_ref().unwrap().host_network, Some(true));
    }
    // The first of these pods made containerd pull the image (the
    // pre-install CRD Job's pod ran from it before them).
    assert_pulled_from_registry(&release, &agent, from);
    assert_eq!(
        leader.spec.as_ref().unwrap().dns_policy.as_deref(),
        Some("ClusterFirstWithHostNet")
    );

    // `helm test`: the chart's test Pod runs `forewarn check-install` in a
    // real container on the real node, with its own get-only
    // ServiceAccount, and passes (CRDs established, the Lease held and
    // renewed, every agent Ready): helm exits 0 only then. Helm deletes
    // the Pod once it passed (so no `--logs`: helm would look for the
    // deleted Pod's logs and fail).
    let tested = Instant::now();
    let out = helm(
        &[
            "test",
            "forewarn",
            "--namespace",
            E2E_NS,
            "--timeout",
            "120s",
        ],
        &env.cluster.kubeconfig,
        &home,
    );
    println!("helm test passed after {:?}:\n{out}", tested.elapsed());
    assert!(out.contains("Succeeded"), "{out}");
    assert!(
        pods.get_opt("forewarn-test").await.expect("pods").is_none(),
        "the test Pod was not deleted after it passed"
    );

    // The workload: real containers on the real node (one `web` replica,
    // spread with the KWOK ones under a PDB; one `worker`, no PDB), with
    // their own grace, preStop and SIGTERM handling.
    let (web_grace, web_prestop, web_term) = (30, 2, 3);
    let (worker_grace, worker_prestop, worker_term) = (10, 1, 2);
    for d in [
        workload("web", 3, web_grace, web_prestop, web_term, None),
        workload(
            "worker",
            1,
            worker_grace,
            worker_prestop,
            worker_term,
            Some(&env.node),
        ),
    ] {
        let (name, pp) = apply(d["metadata"]["name"].as_str().unwrap());
        deployments
            .patch(&name, &pp, &Patch::Apply(&d))
            .await
            .expect("apply workload");
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), E2E_NS);
    let (name, pp) = apply("web");
    pdbs.patch(
        &name,
        &pp,
        &Patch::Apply(serde_json::json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
        })),
    )
    .await
    .expect("apply PDB");
    // A hang bound: the images are on the node and KWOK's pods are Ready
    // at once; 180 s is only reached if a pod never starts.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut real_pods: Vec<RealPod> = loop {
        let web = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .expect("web")
            .items;
        let worker = pods
            .list(&ListParams::default().labels("app=worker"))
            .await
            .expect("worker")
            .items;
        let ready = web.iter().filter(|p| is_ready(p)).count() == 3
            && worker.iter().filter(|p| is_ready(p)).count() == 1;
        let on_real: Vec<&Pod> = web
            .iter()
            .chain(worker.iter())
            .filter(|p| node_of(p) == Some(env.node.as_str()))
            .collect();
        if ready && on_real.len() == 2 {
            break on_real
                .iter()
                .map(|p| RealPod {
                    name: p.name_any(),
                    grace: p
                        .spec
                        .as_ref()
                        .and_then(|s| s.termination_grace_period_seconds)
                        .unwrap_or(30),
                    ..RealPod::default()
                })
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "workload not Ready: {:?}",
            web.iter()
                .chain(worker.iter())
                .map(|p| (p.name_any(), node_of(p).map(str::to_string), is_ready(p)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // Each real container's whole log, followed from now to its exit.
    for rp in real_pods.iter_mut() {
        let mut follow = LogFollow::start(&env, E2E_NS, &rp.name);
        follow.attached(Duration::from_secs(60)).await;
        rp.follow = Some(follow);
    }

    // The standby replica. The chart spreads replicas over nodes; this
    // cluster has one real node, where a second hostNetwork replica cannot
    // bind the same port, and KWOK nodes run nothing. So the replica "on
    // another node" is the same binary with the chart's container arguments
    // and the chart's controller ServiceAccount (a TokenRequest token, so
    // exactly the chart's RBAC), run next to the cluster.
    let dep = deployments
        .get("forewarn-controller")
        .await
        .expect("controller Deployment");
    let container = dep.spec.unwrap().template.spec.unwrap().containers[0].clone();
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), E2E_NS);
    let policy = configmaps
        .get("forewarn-policy")
        .await
        .expect("policy ConfigMap")
        .data
        .and_then(|d| d.get("policy.yaml").cloned())
        .expect("policy.yaml");
    let policy_file = env.logs.join("chart-policy.yaml");
    std::fs::write(&policy_file, policy).expect("write policy");
    let args: Vec<String> = container
        .args
        .unwrap_or_default()
        .into_iter()
        .map(|a| {
            if a.starts_with("--metrics-addr=") {
                "--metrics-addr=127.0.0.1:0".to_string()
            } else if a.starts_with("--policy-file=") {
                format!("--policy-file={}", policy_file.display())
            } else {
                a
            }
        })
        .collect();
    let token = env
        .cluster
        .kubectl(&[
            "create",
            "token",
            "forewarn-controller",
            "-n",
            E2E_NS,
            "--duration",
            "1h",
        ])
        .expect("controller token");
    let server = env
        .cluster
        .kubectl(&[
            "config",
            "view",
            "--raw",
            "--minify",
            "--flatten",
            "-o",
            "jsonpath={.clusters[0].cluster.server} {.clusters[0].cluster.certificate-authority-data}",
        ])
        .expect("server and CA");
    let (server, ca) = server.trim().split_once(' ').expect("server and CA");
    let kubeconfig = env.logs.join("standby-controller.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
             users:\n- name: controller\n  user:\n    token: {}\ncontexts:\n- name: controller\n  context:\n    cluster: local\n    user: controller\n\
             current-context: controller\n",
            token.trim()
        ),
    )
    .expect("write kubeconfig");
    let (mut standby, _) = Proc::spawn(
        "standby controller",
        &env.forewarn,
        &args,
        &[
            ("KUBECONFIG", &kubeconfig.to_string_lossy()),
            ("POD_NAME", STANDBY),
            ("POD_NAMESPACE", E2E_NS),
        ],
        &env.logs,
        "standby-controller",
    )
    .expect("start the standby controller");
    // Hang bounds: it serves and is ready within a second or two.
    let metrics = standby
        .metrics_port(Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    wait_ready(metrics, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("{e}; log:\n{}", standby.log_tail(20)));

    // The Redeploy starts; one round reads IMDS, pods, the Lease, the node
    // and the event, in the reverse of the causal order, so that a step seen
    // in a round implies its causes are seen too.
    let http = forewarn::http::client();
    let mock_url = format!("http://{}", env.imds_ip);
    http.post(format!("{mock_url}/mock/start"))
        .send()
        .await
        .expect("start the mock's clock");
    let t0 = Instant::now();
    let event_name = EVENT_ID.to_lowercase();
    let mut round: Vec<String> = Vec::new();
    let (mut seen, mut cordoned, mut approved, mut uncordoned) = (None, None, None, None);
    let (mut leader_deleted, mut takeover, mut drained): (Option<Duration>, _, _) =
        (None, None, None);
    let mut holder = Some(leader_name.clone());
    let mut phase = String::new();
    let mut min_web_ready = usize::MAX;
    let mut agent_samples = 0;
    // A hang bound: the cycle (drain, takeover, approval, the event, the
    // release delay) takes about a minute; 300 s is only reached if a step
    // never comes.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let now = t0.elapsed();
        if approved.is_none() {
            let log: Vec<LogEntry> = http
                .get(format!("{mock_url}/mock/log"))
                .send()
                .await
                .expect("mock log")
                .json()
                .await
                .expect("mock log json");
            if let Some(a) = log.iter().find(|e| e.what == "Approved") {
                approved = Some(now);
                round.push(format!("approval reached IMDS for {:?}", a.vm));
                assert_eq!(a.vm.as_deref(), Some(VM), "approved for another VM");
            }
        }
        let all = pods.list(&ListParams::default()).await.expect("pods").items;
        min_web_ready = min_web_ready.min(
            all.iter()
                .filter(|p| p.labels().get("app").map(String::as_str) == Some("web") && is_ready(p))
                .count(),
        );
        // Every agent pod of the chart stays Ready throughout.
        let agents: Vec<&Pod> = all
            .iter()
            .filter(|p| {
                p.labels()
                    .get("app.kubernetes.io/component")
                    .map(String::as_str)
                    == Some("agent")
            })
            .collect();
        assert!(
            !agents.is_empty() && agents.iter().all(|p| is_ready(p)),
            "an agent pod is not Ready at {now:?}"
        );
        agent_samples += 1;
        // The leader pod is Ready until the test deletes it.
        if leader_deleted.is_none() {
            assert!(
                all.iter()
                    .any(|p| p.name_any() == leader_name && is_ready(p)),
                "the controller pod {leader_name} is not Ready at {now:?}"
            );
        }
        for rp in real_pods.iter_mut() {
            match all.iter().find(|p| p.name_any() == rp.name) {
                Some(p) => {
                    let exited =
                        p.status.as_ref().is_some_and(|st| {
                            matches!(st.phase.as_deref(), Some("Succeeded" | "Failed"))
                                || st.container_statuses.iter().flatten().any(|c| {
                                    c.state.as_ref().is_some_and(|s| s.terminated.is_some())
                                })
                        });
                    if exited && rp.exited.is_none() {
                        rp.exited = Some(now);
                        round.push(format!("{}: container exited", rp.name));
                    }
                    if let Some(t) = &p.metadata.deletion_timestamp
                        && rp.evicted.is_none()
                    {
                        rp.evicted = Some(now);
                        rp.grace_sent = p.metadata.deletion_grace_period_seconds;
                        rp.grace_ends = Some(
                            chrono::DateTime::parse_from_rfc3339(&t.0.to_string())
                                .expect("deletionTimestamp")
                                .with_timezone(&chrono::Utc),
                        );
                        round.push(format!(
                            "{} evicted (deletionGracePeriodSeconds {:?})",
                            rp.name, rp.grace_sent
                        ));
                    }
                    // Read until the container has exited (its last line).
                    // A log only grows: a read that does not extend the last
                    // one is not the container's log (once the container is
                    // removed, the kubelet answers 200 with its own error,
                    // `failed to try resolving symlinks in path ...`).
                    if rp.evicted.is_some()
                        && (rp.sigterm.is_none() || !exited_cleanly(&rp.logs))
                        && let Ok(l) = env.cluster.kubectl(&["logs", "-n", E2E_NS, &rp.name])
                        && l.starts_with(rp.logs.as_str())
                    {
                        rp.logs = l;
                        if rp.sigterm.is_none() && rp.logs.contains("SIGTERM received") {
                            rp.sigterm = Some(now);
                            round.push(format!("{}: SIGTERM received (kubectl logs)", rp.name));
                        }
                    }
                }
                None if rp.gone.is_none() => {
                    rp.gone = Some(now);
                    rp.exited = rp.exited.or(Some(now));
                    round.push(format!("{} gone from {}", rp.name, env.node));
                }
                None => {}
            }
        }
        if drained.is_none() && real_pods.iter().all(|rp| rp.exited.is_some()) {
            drained = Some(now);
            round.push(format!(
                "{}: every real workload container stopped",
                env.node
            ));
        }
        // Mid-drain (a real container evicted, not yet stopped), the leader
        // pod is deleted, as an operator or a rollout would.
        if leader_deleted.is_none()
            && real_pods
                .iter()
                .any(|rp| rp.evicted.is_some() && rp.exited.is_none())
        {
            let l = leases.get("forewarn-controller").await.expect("lease");
            let h = l.spec.and_then(|s| s.holder_identity);
            assert_eq!(
                h.as_deref(),
                Some(leader_name.as_str()),
                "the leader changed before the test deleted it"
            );
            env.cluster
                .kubectl(&["delete", "pod", "-n", E2E_NS, &leader_name, "--wait=false"])
                .expect("delete the leader pod");
            leader_deleted = Some(now);
            round.push(format!(
                "leader pod {leader_name} deleted (kubectl delete pod)"
            ));
        }
        let h = leases
            .get("forewarn-controller")
            .await
            .expect("lease")
            .spec
            .and_then(|s| s.holder_identity);
        if h != holder {
            round.push(format!("Lease holder {h:?}"));
            if h.as_deref() == Some(STANDBY) && takeover.is_none() {
                takeover = Some(now);
            }
            holder = h;
        }
        let node = nodes.get(&env.node).await.expect("node");
        let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
        if unschedulable && cordoned.is_none() {
            cordoned = Some(now);
            round.push(format!("{} cordoned", env.node));
        }
        if !unschedulable && cordoned.is_some() && uncordoned.is_none() {
            uncordoned = Some(now);
            round.push(format!("{} uncordoned", env.node));
        }
        if let Some(ev) = sevs.get_opt(&event_name).await.expect("sev") {
            if seen.is_none() {
                seen = Some(now);
                round.push(format!("ScheduledEvent {event_name} seen"));
            }
            let p = ev
                .status
                .as_ref()
                .and_then(|s| s.phase.map(|p| p.to_string()))
                .unwrap_or_default();
            if p != phase {
                round.push(format!("phase {p}"));
                phase = p;
            }
        }
        for what in round.drain(..).rev() {
            println!("{:>7.2}s  {what}", now.as_secs_f64());
        }
        if uncordoned.is_some() && phase == "Completed" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no full cycle within 300 s; standby controller log:\n{}",
            standby.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let at = |o: Option<Duration>, what: &str| o.unwrap_or_else(|| panic!("never {what}"));
    let (seen, cordoned, approved, uncordoned) = (
        at(seen, "seen"),
        at(cordoned, "cordoned"),
        at(approved, "approved"),
        at(uncordoned, "uncordoned"),
    );
    let (leader_deleted, takeover, drained) = (
        at(leader_deleted, "deleted the leader"),
        at(takeover, "taken over by the standby"),
        at(drained, "drained"),
    );
    for rp in real_pods.iter_mut() {
        // Every container has exited: the stream has ended (a hang bound).
        if let Some(follow) = rp.follow.take() {
            let followed = follow.finish(Duration::from_secs(60)).await;
            if followed.len() > rp.logs.len() {
                rp.logs = followed;
            }
        }
    }
    for rp in &real_pods {
        println!("{} logs:\n{}", rp.name, rp.logs);
        let evicted = at(rp.evicted, "evicted");
        let exited = at(rp.exited, "exited");
        // Order only: each round reads in the reverse of the causal order.
        assert!(seen <= cordoned && cordoned <= evicted && evicted <= exited);
        assert!(exited <= approved, "{}", rp.name);
        // A SIGTERM seen by a round came between the eviction and the exit
        // (a slow round may see neither: the followed log has it then).
        if let Some(sigterm) = rp.sigterm {
            assert!(evicted <= sigterm && sigterm <= exited, "{}", rp.name);
        }
        // Its own grace, whole (the deadline is far): the eviction asked for it.
        assert_eq!(rp.grace_sent, Some(rp.grace), "{}", rp.name);
        assert!(
            rp.logs.find("preStop hook done") < rp.logs.find("SIGTERM received"),
            "{}: preStop did not run before SIGTERM:\n{}",
            rp.name,
            rp.logs
        );
        assert!(
            exited_cleanly(&rp.logs),
            "{}: no clean exit after SIGTERM:\n{}",
            rp.name,
            rp.logs
        );
        // Within its grace, on the API server's clock (the same machine's):
        // the container's own `exiting` line (which a container killed at
        // the end of its grace never writes) comes a few seconds into a
        // grace of 10 or 30 s, before its end as the API server recorded it.
        let (exit, grace_ends) = (
            exit_stamp(&rp.logs).expect("checked above"),
            rp.grace_ends.expect("recorded with the eviction"),
        );
        assert!(
            exit < grace_ends,
            "{}: exited at {exit}, after the end of its grace ({}s) at {grace_ends}",
            rp.name,
            rp.grace
        );
    }
    assert!(
        leader_deleted < drained,
        "the leader was deleted after the drain"
    );
    assert!(leader_deleted <= takeover && takeover <= approved);
    assert!(drained <= approved && approved <= uncordoned);
    assert!(
        min_web_ready >= 2,
        "PodDisruptionBudget violated: {min_web_ready} web pods Ready"
    );
    // The approval was decided by the standby and sent by the real node's agent pod.
    let ev = sevs.get(&event_name).await.expect("sev");
    let approval = ev.status.and_then(|s| s.approval).expect("approval");
    println!("approval: {approval:?}");
    assert_eq!(approval.sent_by.as_deref(), Some(env.node.as_str()));
    // The deleted leader's replacement waited for the uncordon, then runs
    // on the real node again, Ready, as a standby.
    // A hang bound: scheduled once the node is uncordoned, Ready within
    // seconds.
    let deadline = Instant::now() + Duration::from_secs(180);
    let replacement = loop {
        let c = pods.list(&role("controller")).await.expect("pods").items;
        if let Some(p) = c
            .iter()
            .find(|p| is_ready(p) && node_of(p) == Some(env.node.as_str()))
        {
            break p.name_any();
        }
        assert!(
            Instant::now() < deadline,
            "no controller pod Ready after the event"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_ne!(replacement, leader_name);
    println!(
        "timeline: event seen {:.2}s, cordoned {:.2}s, SIGTERM received {}, leader pod deleted {:.2}s, \
         standby leads {:.2}s, drained {:.2}s, approved {:.2}s, uncordoned {:.2}s; agent pods Ready in all \
         {agent_samples} samples; replacement controller pod {replacement} Ready on {}",
        seen.as_secs_f64(),
        cordoned.as_secs_f64(),
        real_pods
            .iter()
            .map(|rp| match rp.sigterm {
                Some(t) => format!("{:.2}s ({})", t.as_secs_f64(), rp.name),
                None => format!("unseen by a round ({})", rp.name),
            })
            .collect::<Vec<_>>()
            .join(", "),
        leader_deleted.as_secs_f64(),
        takeover.as_secs_f64(),
        drained.as_secs_f64(),
        approved.as_secs_f64(),
        uncordoned.as_secs_f64(),
        env.node
    );

    standby.terminate(Duration::from_secs(10)).await.ok();
    mock.terminate(Duration::from_secs(5)).await.ok();
    for d in ["web", "worker"] {
        deployments.delete(d, &DeleteParams::default()).await.ok();
    }
    uninstall(&env, E2E_NS, &home);
}

// ---------------------------------------------------------------------------
// `make release` on the real node: hack/real-node.sh serves an OCI registry
// (CNCF distribution) on the namespace's 127.0.0.1 and runs hack/release.sh
// against it before these tests; the chart tests above install from it.

/// What hack/real-node.sh passes in about the registry and what
/// hack/release.sh published there.
struct Release {
    /// `127.0.0.1:<port>`
    registry: String,
    /// The image reference the chart pins: `<registry>/<repository>:<tag>@<digest>`.
    image: String,
    /// The image's path in the registry (`forewarn-test/forewarn`).
    repository: String,
    tag: String,
    digest: String,
    /// `oci://<registry>/<path>/charts/forewarn`, for `helm install`.
    chart: String,
    /// The chart's path in the registry (`forewarn-test/charts/forewarn`).
    chart_repository: String,
    /// The chart digest `helm push` printed.
    chart_digest: String,
    version: String,
    /// forewarn's OCI archive as `make image` wrote it.
    archive: PathBuf,
    /// The registry's log: one access-log line per request it served.
    registry_log: PathBuf,
    /// The real node's containerd socket.
    containerd: PathBuf,
}

fn release() -> Release {
    let var = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| {
            panic!(
                "{k} is not set: run through FOREWARN_REAL_TESTS=\"real_node real_node_chart\" \
                 hack/real-node.sh test, which starts the registry and runs hack/release.sh"
            )
        })
    };
    let registry = var("FOREWARN_REAL_REGISTRY");
    let image = var("FOREWARN_REAL_RELEASE_IMAGE");
    let (name, digest) = image
        .split_once('@')
        .unwrap_or_else(|| panic!("the released image is not pinned by digest: {image}"));
    let (path, tag) = name.rsplit_once(':').expect("the released image's tag");
    let repository = path
        .strip_prefix(&format!("{registry}/"))
        .unwrap_or_else(|| panic!("{image} is not in the registry {registry}"))
        .to_string();
    // oci://<registry>/<path>/charts/forewarn:<tag>@sha256:...
    let chart_ref = var("FOREWARN_REAL_RELEASE_CHART");
    let (chart_name, chart_digest) = chart_ref.split_once('@').expect("the chart's digest");
    let chart = chart_name
        .rsplit_once(':')
        .expect("the chart's tag")
        .0
        .to_string();
    let chart_repository = chart
        .strip_prefix(&format!("oci://{registry}/"))
        .unwrap_or_else(|| panic!("{chart} is not in the registry {registry}"))
        .to_string();
    Release {
        image: image.clone(),
        repository,
        tag: tag.to_string(),
        digest: digest.to_string(),
        chart,
        chart_repository,
        chart_digest: chart_digest.to_string(),
        version: var("FOREWARN_REAL_RELEASE_VERSION"),
        archive: var("FOREWARN_REAL_IMAGE_ARCHIVE").into(),
        registry_log: var("FOREWARN_REAL_REGISTRY_LOG").into(),
        containerd: var("FOREWARN_REAL_CONTAINERD_SOCK").into(),
        registry,
    }
}

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn sha256(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// One file of an OCI archive (a tar of an image layout), by `tar`.
fn archive_file(archive: &std::path::Path, name: &str) -> Vec<u8> {
    for member in [name.to_string(), format!("./{name}")] {
        let out = Command::new("tar")
            .arg("-xOf")
            .arg(archive)
            .arg(&member)
            .output()
            .expect("run tar");
        if out.status.success() {
            return out.stdout;
        }
    }
    panic!("{} holds no {name}", archive.display())
}

/// A blob of the archive, checked against its digest.
fn archive_blob(archive: &std::path::Path, digest: &str) -> Vec<u8> {
    let blob = archive_file(archive, &format!("blobs/{}", digest.replacen(':', "/", 1)));
    assert_eq!(sha256(&blob), digest, "a blob of the archive");
    blob
}

/// A manifest of the archive with its digest and media type.
struct Manifest {
    digest: String,
    media_type: String,
    bytes: Vec<u8>,
    json: serde_json::Value,
}

/// What the archive `make image` wrote holds: what its tag must name (the
/// one entry of index.json, or index.json itself when it lists several
/// manifests), and the linux/amd64 image manifest the real node runs.
struct Archive {
    top: Manifest,
    /// The image manifests under `top` (`top` itself for a single image),
    /// each with its platform as `os/architecture`.
    images: Vec<(String, Manifest)>,
}

impl Archive {
    fn amd64(&self) -> &Manifest {
        &self
            .images
            .iter()
            .find(|(p, _)| p == "linux/amd64")
            .unwrap_or_else(|| panic!("the archive has no linux/amd64 image"))
            .1
    }
}

fn read_archive(archive: &std::path::Path) -> Archive {
    let index_json = archive_file(archive, "index.json");
    let index: serde_json::Value = serde_json::from_slice(&index_json).expect("index.json");
    let entries = index["manifests"]
        .as_array()
        .expect("index.json's manifests");
    let manifest = |digest: &str, media_type: &str| {
        let bytes = archive_blob(archive, digest);
        Manifest {
            digest: digest.to_string(),
            media_type: media_type.to_string(),
            json: serde_json::from_slice(&bytes).expect("a manifest"),
            bytes,
        }
    };
    let top = if entries.len() == 1 {
        manifest(
            entries[0]["digest"].as_str().expect("digest"),
            entries[0]["mediaType"].as_str().expect("mediaType"),
        )
    } else {
        Manifest {
            digest: sha256(&index_json),
            media_type: OCI_INDEX.to_string(),
            json: index.clone(),
            bytes: index_json,
        }
    };
    let images = if top.media_type == OCI_INDEX {
        top.json["manifests"]
            .as_array()
            .expect("the index's manifests")
            .iter()
            .map(|m| {
                let platform = format!(
                    "{}/{}",
                    m["platform"]["os"].as_str().unwrap_or("?"),
                    m["platform"]["architecture"].as_str().unwrap_or("?")
                );
                let digest = m["digest"].as_str().expect("digest");
                (
                    platform,
                    manifest(digest, m["mediaType"].as_str().expect("mediaType")),
                )
            })
            .collect()
    } else {
        // One image: its platform is in its config.
        let config = archive_blob(
            archive,
            top.json["config"]["digest"].as_str().expect("config"),
        );
        let config: serde_json::Value = serde_json::from_slice(&config).expect("config");
        let platform = format!(
            "{}/{}",
            config["os"].as_str().unwrap_or("?"),
            config["architecture"].as_str().unwrap_or("?")
        );
        vec![(
            platform,
            Manifest {
                digest: top.digest.clone(),
                media_type: top.media_type.clone(),
                bytes: top.bytes.clone(),
                json: top.json.clone(),
            },
        )]
    };
    Archive { top, images }
}

/// The blobs (config, layers) of an image manifest, with their sizes.
fn blobs(m: &Manifest) -> Vec<(String, u64)> {
    std::iter::once(&m.json["config"])
        .chain(m.json["layers"].as_array().expect("layers"))
        .map(|d| {
            (
                d["digest"].as_str().expect("digest").to_string(),
                d["size"].as_u64().expect("size"),
            )
        })
        .collect()
}

/// `make image` wrote one image index of linux/amd64, linux/arm64 and
/// windows/amd64, each image's layer holding the binary built for its
/// platform: read from the layer's bytes, an x86-64 or AArch64 ELF (its
/// `e_machine`) at /usr/local/bin/forewarn, an x86-64 PE executable (its
/// COFF `Machine`) at C:\forewarn.exe (`Files/forewarn.exe`) beside the
/// registry hives of a Windows base layer.
fn assert_platform_binaries(archive: &std::path::Path, a: &Archive) {
    assert_eq!(
        a.top.media_type, OCI_INDEX,
        "make image's image is not an index"
    );
    let platforms: Vec<&str> = a.images.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        platforms,
        ["linux/amd64", "linux/arm64", "windows/amd64"],
        "the image index's platforms"
    );
    // One file of a gzip layer, through tar.
    let layer_file = |layer: &[u8], path: &str| -> Vec<u8> {
        let mut child = Command::new("tar")
            .args(["-xzOf", "-", path])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run tar");
        let mut stdin = child.stdin.take().expect("stdin");
        let bytes = layer.to_vec();
        let feed = std::thread::spawn(move || {
            use std::io::Write as _;
            let _ = stdin.write_all(&bytes);
        });
        let out = child.wait_with_output().expect("tar");
        feed.join().expect("feed tar");
        assert!(
            out.status.success(),
            "the layer holds no {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    for (platform, m) in &a.images {
        let layers = m.json["layers"].as_array().expect("layers");
        assert_eq!(layers.len(), 1, "{platform}: one layer, no base image");
        let layer = archive_blob(archive, layers[0]["digest"].as_str().expect("digest"));
        let what = match platform.as_str() {
            "linux/amd64" | "linux/arm64" => {
                let bin = layer_file(&layer, "usr/local/bin/forewarn");
                assert_eq!(&bin[..4], b"\x7fELF", "{platform}: not an ELF file");
                let machine = u16_at(&bin, 18);
                let want = if platform == "linux/amd64" { 62 } else { 183 };
                assert_eq!(machine, want, "{platform}: ELF e_machine {machine}");
                format!("ELF e_machine {machine}, {} bytes", bin.len())
            }
            _ => {
                let exe = layer_file(&layer, "Files/forewarn.exe");
                assert_eq!(&exe[..2], b"MZ", "{platform}: not a PE file");
                let pe = u32::from_le_bytes(exe[0x3c..0x40].try_into().expect("e_lfanew")) as usize;
                assert_eq!(&exe[pe..pe + 4], b"PE\0\0", "{platform}: no PE signature");
                let machine = u16_at(&exe, pe + 4);
                assert_eq!(machine, 0x8664, "{platform}: COFF Machine {machine:#x}");
                for hive in ["DEFAULT", "SAM", "SECURITY", "SOFTWARE", "SYSTEM"] {
                    let h = layer_file(&layer, &format!("Files/Windows/System32/config/{hive}"));
                    assert_eq!(
                        &h[..4],
                        b"regf",
                        "{platform}: {hive} is not a registry hive"
                    );
                }
                format!("PE Machine {machine:#x}, {} bytes, five hives", exe.len())
            }
        };
        println!("make image: {platform} {}: {what}", m.digest);
    }
}

/// `ctr` against the real node's containerd, in the CRI's namespace.
fn ctr(r: &Release, args: &[&str]) -> String {
    let out = Command::new("ctr")
        .arg("-a")
        .arg(&r.containerd)
        .args(["-n", "k8s.io"])
        .args(args)
        .output()
        .expect("run ctr");
    assert!(
        out.status.success(),
        "ctr {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Removes every copy of forewarn's image from the real node's containerd
/// (the one hack/real-node.sh imported for tests/real_node.rs, and one an
/// earlier test pulled from the registry) with a synchronous garbage
/// collection, and checks that the content store no longer holds the
/// linux/amd64 image's config and layers: the chart's pods can then only
/// run once containerd has pulled them from the registry. Returns the
/// length of the registry's log so far (the pull is read after it).
fn forget_forewarn_image(r: &Release) -> u64 {
    let a = read_archive(&r.archive);
    let amd64 = a.amd64();
    let config = blobs(amd64)[0].0.clone();
    let pulled = format!("{}/{}", r.registry, r.repository);
    let refs: Vec<String> = ctr(r, &["images", "ls", "-q"])
        .lines()
        .map(str::trim)
        .filter(|l| *l == AGENT_IMAGE || l.starts_with(&pulled) || *l == config)
        .map(String::from)
        .collect();
    if !refs.is_empty() {
        let mut args = vec!["images", "rm", "--sync"];
        args.extend(refs.iter().map(String::as_str));
        ctr(r, &args);
        println!("removed from containerd: {}", refs.join(" "));
    }
    let content = ctr(r, &["content", "ls", "-q"]);
    for (d, _) in blobs(amd64) {
        assert!(
            !content.lines().any(|l| l.trim() == d),
            "containerd still holds {d} of forewarn's image after removing it"
        );
    }
    std::fs::metadata(&r.registry_log)
        .expect("the registry's log")
        .len()
}

/// One request of the registry's access log (combined log format:
/// `host - - [date] "METHOD PATH PROTO" STATUS SIZE "REFERER" "USER AGENT"`):
/// method, path, status, user agent.
fn access(line: &str) -> Option<(String, String, u16, String)> {
    let q: Vec<&str> = line.split('"').collect();
    if q.len() < 7 {
        return None;
    }
    let mut req = q[1].split_whitespace();
    let (method, path) = (req.next()?, req.next()?);
    let status = q[2].split_whitespace().next()?.parse().ok()?;
    Some((method.into(), path.into(), status, q[5].into()))
}

/// Checks that containerd pulled forewarn's image from the registry, by
/// digest, for `pod` (which runs it): the pod's image ID, containerd's image
/// list, its content store, and the requests the registry served since
/// `from` (forget_forewarn_image).
fn assert_pulled_from_registry(r: &Release, pod: &Pod, from: u64) {
    let a = read_archive(&r.archive);
    let amd64 = a.amd64();
    let repo = format!("{}/{}", r.registry, r.repository);
    assert_eq!(
        r.digest, a.top.digest,
        "the chart pins another digest than the archive's"
    );

    // The kubelet's view: the image ID the runtime reported for the pod's
    // container.
    let status = pod.status.as_ref().expect("pod status");
    let image_id = &status.container_statuses.as_ref().expect("statuses")[0].image_id;
    println!("{}: imageID {image_id}", pod.name_any());
    assert!(
        *image_id == format!("{repo}@{}", a.top.digest)
            || *image_id == format!("{repo}@{}", amd64.digest),
        "the pod's imageID {image_id} is not {repo}@{} (or its linux/amd64 manifest {})",
        a.top.digest,
        amd64.digest
    );

    // containerd's image list: the image under the registry's name, by the
    // digest the registry serves; the imported copy is not back.
    let list = ctr(r, &["images", "ls"]);
    let want = format!("{repo}@{}", a.top.digest);
    let line = list
        .lines()
        .find(|l| l.split_whitespace().next() == Some(want.as_str()))
        .unwrap_or_else(|| panic!("containerd lists no {want}:\n{list}"));
    println!("containerd: {line}");
    assert_eq!(line.split_whitespace().nth(2), Some(a.top.digest.as_str()));
    assert!(
        !list
            .lines()
            .any(|l| l.split_whitespace().next() == Some(AGENT_IMAGE)),
        "the imported {AGENT_IMAGE} is back in containerd:\n{list}"
    );
    let content = ctr(r, &["content", "ls", "-q"]);
    for (d, _) in blobs(amd64) {
        assert!(
            content.lines().any(|l| l.trim() == d),
            "containerd's content store lacks {d}"
        );
    }

    // The registry's side: what containerd asked it for since the image
    // was removed. Every manifest by digest (none by tag), the linux/amd64
    // image's config and layers fetched, and no blob of another platform.
    let log = std::fs::read(&r.registry_log).expect("the registry's log");
    let log = String::from_utf8_lossy(&log[from as usize..]).into_owned();
    let served: Vec<(String, String, u16, String)> = log
        .lines()
        .filter_map(access)
        .filter(|(_, p, _, ua)| {
            p.starts_with(&format!("/v2/{}/", r.repository)) && ua.contains("containerd")
        })
        .collect();
    for (m, p, s, ua) in &served {
        println!("registry served containerd: {m} {p} {s} ({ua})");
    }
    let got = |method: &str, path: &str| {
        served
            .iter()
            .any(|(m, p, s, _)| m == method && p == path && *s == 200)
    };
    let manifests = format!("/v2/{}/manifests/", r.repository);
    let blob_path = |d: &str| format!("/v2/{}/blobs/{d}", r.repository);
    assert!(
        served
            .iter()
            .filter(|(_, p, _, _)| p.starts_with(&manifests))
            .all(|(_, p, _, _)| p[manifests.len()..].starts_with("sha256:")),
        "containerd asked for a manifest by tag, not by digest"
    );
    for d in [&a.top.digest, &amd64.digest] {
        assert!(
            got("GET", &format!("{manifests}{d}")),
            "containerd did not GET the manifest {d} from the registry"
        );
    }
    for (d, _) in blobs(amd64) {
        assert!(
            got("GET", &blob_path(&d)),
            "containerd did not GET the blob {d} from the registry"
        );
    }
    let ours: Vec<String> = blobs(amd64).into_iter().map(|(d, _)| d).collect();
    for (platform, m) in &a.images {
        for (d, _) in blobs(m) {
            if !ours.contains(&d) {
                assert!(
                    !served.iter().any(|(_, p, _, _)| *p == blob_path(&d)),
                    "containerd fetched {d} of the {platform} image"
                );
            }
        }
    }
}

/// `make release`'s push keeps every digest: what the registry serves for
/// the released tag, asked over its /v2/ API with OCI Accept headers, is
/// byte for byte what the archive `make image` wrote holds (the index and
/// each platform's manifest), every blob is there at its size, and the
/// chart pushed next to it pins that digest.
#[tokio::test]
async fn release_push_preserves_digests() {
    use reqwest::header::{ACCEPT, CONTENT_TYPE};
    let r = release();
    let a = read_archive(&r.archive);
    let http = forewarn::http::client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client");
    let base = format!("http://{}/v2", r.registry);
    let accept = format!("{OCI_INDEX}, {OCI_MANIFEST}");
    println!(
        "archive {}: {} {} ({} image(s): {})",
        r.archive.display(),
        a.top.media_type,
        a.top.digest,
        a.images.len(),
        a.images
            .iter()
            .map(|(p, m)| format!("{p} {}", m.digest))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert_eq!(
        r.digest, a.top.digest,
        "hack/release.sh pinned another digest than the archive's"
    );
    assert_platform_binaries(&r.archive, &a);

    // The tag: HEAD gives the digest and media type, GET the same bytes.
    let url = format!("{base}/{}/manifests/{}", r.repository, r.tag);
    let head = http
        .head(&url)
        .header(ACCEPT, &accept)
        .send()
        .await
        .expect("HEAD the tag");
    assert_eq!(head.status(), 200, "HEAD {url}");
    let header = |resp: &reqwest::Response, h: &str| {
        resp.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        header(&head, "docker-content-digest"),
        a.top.digest,
        "HEAD {url}"
    );
    assert_eq!(
        header(&head, CONTENT_TYPE.as_str()),
        a.top.media_type,
        "HEAD {url}"
    );
    let get = http
        .get(&url)
        .header(ACCEPT, &accept)
        .send()
        .await
        .expect("GET the tag");
    assert_eq!(get.status(), 200, "GET {url}");
    assert_eq!(header(&get, "docker-content-digest"), a.top.digest);
    let body = get.bytes().await.expect("the manifest");
    assert_eq!(sha256(&body), a.top.digest, "GET {url}: the bytes' digest");
    assert_eq!(
        body.as_ref(),
        a.top.bytes.as_slice(),
        "GET {url}: the bytes"
    );
    println!("registry: {} {url} -> {}", a.top.media_type, a.top.digest);

    // Each platform's manifest by digest, and its blobs.
    for (platform, m) in &a.images {
        let url = format!("{base}/{}/manifests/{}", r.repository, m.digest);
        let get = http
            .get(&url)
            .header(ACCEPT, &accept)
            .send()
            .await
            .expect("GET a manifest");
        assert_eq!(get.status(), 200, "GET {url}");
        let body = get.bytes().await.expect("the manifest");
        assert_eq!(body.as_ref(), m.bytes.as_slice(), "{platform}: GET {url}");
        for (d, size) in blobs(m) {
            let url = format!("{base}/{}/blobs/{d}", r.repository);
            let head = http.head(&url).send().await.expect("HEAD a blob");
            assert_eq!(head.status(), 200, "{platform}: HEAD {url}");
            assert_eq!(
                header(&head, "content-length"),
                size.to_string(),
                "{platform}: HEAD {url}"
            );
        }
        println!(
            "registry: {platform} {} and its {} blobs",
            m.digest,
            blobs(m).len()
        );
    }

    // The chart: an OCI artifact whose values pin that image by digest.
    let url = format!("{base}/{}/manifests/{}", r.chart_repository, r.version);
    let get = http
        .get(&url)
        .header(ACCEPT, OCI_MANIFEST)
        .send()
        .await
        .expect("GET the chart");
    assert_eq!(get.status(), 200, "GET {url}");
    assert_eq!(header(&get, "docker-content-digest"), r.chart_digest);
    let manifest: serde_json::Value = get.json().await.expect("the chart's manifest");
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.cncf.helm.config.v1+json"
    );
    let layer = manifest["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .find(|l| l["mediaType"] == "application/vnd.cncf.helm.chart.content.v1.tar+gzip")
        .expect("the chart's content layer");
    let url = format!(
        "{base}/{}/blobs/{}",
        r.chart_repository,
        layer["digest"].as_str().unwrap()
    );
    let tgz = http
        .get(&url)
        .send()
        .await
        .expect("GET the chart")
        .bytes()
        .await
        .expect("the chart");
    assert_eq!(sha256(&tgz), layer["digest"].as_str().unwrap());
    let file = r_logs_file("released-chart.tgz");
    std::fs::write(&file, &tgz).expect("write the chart");
    let read = |name: &str| {
        let out = Command::new("tar")
            .arg("-xzOf")
            .arg(&file)
            .arg(name)
            .output()
            .expect("run tar");
        assert!(out.status.success(), "the chart has no {name}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let values = read("forewarn/values.yaml");
    let chart_yaml = read("forewarn/Chart.yaml");
    for want in [
        format!("  repository: {}/{}\n", r.registry, r.repository),
        format!("  digest: \"{}\"\n", a.top.digest),
    ] {
        assert!(
            values.contains(&want),
            "the chart's values.yaml lacks {want:?}"
        );
    }
    for key in ["version", "appVersion"] {
        let value = chart_yaml
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}: ")))
            .map(|v| v.trim().trim_matches('"'));
        assert_eq!(
            value,
            Some(r.version.as_str()),
            "the chart's {key}:\n{chart_yaml}"
        );
    }
    println!("registry: chart {} {} pins {}", r.chart, r.version, r.image);
}

/// A file in the real-node run's log dir.
fn r_logs_file(name: &str) -> PathBuf {
    PathBuf::from(std::env::var("FOREWARN_REAL_LOGS").expect("FOREWARN_REAL_LOGS")).join(name)
}
