//! The Helm chart on a real node: `helm install charts/forewarn` with the
//! image built here, and the agent DaemonSet's pod on `real-node-0` checked
//! as only a real kubelet shows it: Ready through its probes, its Node
//! annotated with the VM name read from IMDS at 169.254.169.254, and the
//! chart's admission policy applied to the pod-bound token the kubelet
//! mounted (the agent may write its own Node's annotation, not another
//! Node's).
//!
//! Run by `FOREWARN_REAL_TESTS="real_node real_node_chart" hack/real-node.sh
//! test` (`make test-real-chart`), inside the real node's namespace; it needs
//! `charts/forewarn` and `hack/build-helm.sh`. The controller's pods go to
//! the KWOK nodes: bridge pods cannot reach the API server, which listens on
//! 127.0.0.1 only, and the chart has no hostNetwork setting for them.
#![cfg(feature = "real-node")]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use forewarn::crd::{AGENT_MANAGER, VM_NAME_ANNOTATION};
use forewarn::harness::cluster::repo_root;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use support::{AGENT_IMAGE, VM, api_port, client, env, start_mock};

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
    let chart = std::env::var("FOREWARN_REAL_CHART")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("charts/forewarn"));
    assert!(
        chart.join("Chart.yaml").is_file(),
        "no chart at {}",
        chart.display()
    );
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
    let (repo, tag) = AGENT_IMAGE.rsplit_once(':').unwrap();
    let home = env.logs.join("helm");
    let started = Instant::now();
    helm(
        &[
            "install",
            "forewarn",
            &chart.to_string_lossy(),
            "--namespace",
            NS,
            "--set",
            &format!("image.repository={repo}"),
            "--set",
            &format!("image.tag={tag}"),
            "--set",
            "image.pullPolicy=Never",
            "--set-json",
            &format!("agent.extraEnv={api_env}"),
            "--set-json",
            &format!("controller.extraEnv={api_env}"),
            "--set-json",
            r#"controller.nodeSelector={"type":"kwok"}"#,
            "--set-json",
            r#"controller.tolerations=[{"operator":"Exists"}]"#,
            "--wait",
            "--timeout",
            "120s",
        ],
        &env.cluster.kubeconfig,
        &home,
    );
    let installed = started.elapsed();

    // The DaemonSet's pod on the real node: Ready through its probes.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(90);
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
    assert_eq!(container.image.as_deref(), Some(AGENT_IMAGE));
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

    // Its Node carries the VM name, written by the agent's field manager.
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(&env.node).await.expect("node");
    assert_eq!(
        node.annotations()
            .get(VM_NAME_ANNOTATION)
            .map(String::as_str),
        Some(VM)
    );
    assert!(
        node.managed_fields()
            .iter()
            .any(|m| m.manager.as_deref() == Some(AGENT_MANAGER)),
        "no managedFields entry of {AGENT_MANAGER}"
    );

    // The token the kubelet mounted into the agent pod: bound to the pod and
    // its node, so the chart's admission policy lets it write its own Node's
    // annotation and nothing on another Node.
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
    let own = format!("{VM_NAME_ANNOTATION}={VM}");
    let (ok, out) = kubectl_as(
        &env,
        token.trim(),
        &["annotate", "node", &env.node, &own, "--overwrite"],
    );
    assert!(ok, "the agent's token may not annotate its own node: {out}");
    let other = nodes
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items
        .into_iter()
        .map(|n| n.name_any())
        .find(|n| *n != env.node)
        .expect("a KWOK node");
    let (ok, out) = kubectl_as(
        &env,
        token.trim(),
        &["annotate", "node", &other, &own, "--overwrite"],
    );
    println!("annotating {other} with the agent pod's token: {out}");
    assert!(!ok, "the agent's token annotated another node: {out}");
    assert!(
        out.contains("denied") || out.contains("forbidden") || out.contains("Forbidden"),
        "{out}"
    );
    let after = nodes.get(&other).await.expect("other node");
    assert!(
        !after.annotations().contains_key(VM_NAME_ANNOTATION),
        "{other} got the annotation"
    );

    helm(
        &["uninstall", "forewarn", "--namespace", NS, "--wait"],
        &env.cluster.kubeconfig,
        &home,
    );
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
