//! A real node: forewarn's image in real containers on a real kubelet.
//!
//! KWOK nodes run nothing, so this test joins one kubelet (`real-node-0`,
//! containerd + runc) to the local control plane and checks what only a real
//! node shows: the image built by `hack/build-image.sh` starts, the agent's
//! pod (hostNetwork, read-only root filesystem, non-root, a pod-bound
//! ServiceAccount token) passes its `/readyz` probe and reports the event
//! it read from IMDS at its production address 169.254.169.254, and an
//! evicted container gets its `preStop` hook and SIGTERM within its grace.
//!
//! Everything runs in a network namespace of its own, which
//! `hack/real-node.sh test` (`make test-real`) creates, together with the
//! cluster and the node; run through anything else the test fails at once.
//! The IMDS mock is started here, on 169.254.169.254:80 of that namespace.
#![cfg(feature = "real-node")]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use forewarn_harness::cluster::repo_root;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::{
    AGENT_IMAGE, Env, LogFollow, VM, api_port, apply, client, env, exit_stamp, find_process,
    log_stamp, start_mock_with, wait_pod_ready,
};

#[path = "support/real_node.rs"]
mod support;

const NS: &str = "forewarn-real";
const WORKLOAD_IMAGE: &str = "forewarn.local/workload:dev";

/// The namespace, the CRD, and the agent's ServiceAccount with the rights
/// the agent uses.
async fn setup(env: &Env, client: &Client) {
    env.cluster
        .kubectl(&[
            "apply",
            "--server-side",
            "-f",
            &repo_root().join("crds").to_string_lossy(),
        ])
        .expect("apply the CRDs");
    // `kubectl wait` fails at once (not waits) while a CRD just applied has
    // no status conditions yet: ask again for a few seconds.
    let wait = || {
        env.cluster.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/scheduledevents.forewarn.dev",
            "crd/scheduledeventreports.forewarn.dev",
            "crd/virtualmachinereports.forewarn.dev",
        ])
    };
    let mut established = wait();
    for _ in 0..20 {
        if established.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
        established = wait();
    }
    established.expect("CRD established");
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    apply(
        &ns,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    )
    .await;
    let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), NS);
    apply(
        &sa,
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "forewarn-agent"}}),
    )
    .await;
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    apply(
        &roles,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "forewarn-real-agent"},
            "rules": [
                // The chart's agent rules (charts/forewarn/templates/rbac-agent.yaml).
                {"apiGroups": ["forewarn.dev"], "resources": ["scheduledevents"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["forewarn.dev"], "resources": ["scheduledeventreports"],
                 "verbs": ["create", "patch", "list", "watch"]},
                {"apiGroups": ["forewarn.dev"], "resources": ["virtualmachinereports"],
                 "verbs": ["create", "patch"]},
                {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                 "resourceNames": ["scheduledeventreports.forewarn.dev", "virtualmachinereports.forewarn.dev"], "verbs": ["get"]},
            ],
        }),
    )
    .await;
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client.clone());
    apply(&bindings, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "forewarn-real-agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "forewarn-real-agent"},
        "subjects": [{"kind": "ServiceAccount", "name": "forewarn-agent", "namespace": NS}],
    })).await;
}

#[tokio::test]
async fn nothing_leaves_the_namespace() {
    let env = env();
    // This process is not in the machine's network namespace.
    let own = std::fs::read_link("/proc/self/ns/net").expect("own netns");
    // (PID 1's namespaces are not readable on every machine.)
    assert!(env.host_netns.starts_with("net:["), "{}", env.host_netns);
    let machine = PathBuf::from(&env.host_netns);
    assert_ne!(
        own, machine,
        "the test runs in the machine's network namespace"
    );
    // Its interfaces (from procfs, which shows this namespace; /sys still
    // shows the machine's): loopback, the node's bridge and pod veths.
    let dev = std::fs::read_to_string("/proc/self/net/dev").expect("/proc/self/net/dev");
    let names: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    println!("interfaces: {names:?}");
    assert!(names.contains(&"lo") && names.contains(&"fwreal0"));
    for name in &names {
        assert!(
            *name == "lo" || *name == "fwreal0" || name.starts_with("veth"),
            "unexpected interface {name} in the namespace"
        );
    }
    // No default route: destination and mask 0 (hex, /proc/net/route).
    let routes = std::fs::read_to_string("/proc/self/net/route").expect("/proc/self/net/route");
    println!("routes:\n{routes}");
    assert!(
        !routes.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&"00000000") && f.get(7) == Some(&"00000000")
        }),
        "a default route in the namespace:\n{routes}"
    );
    // The `kubernetes` Service IP, which a pod would dial by default, is unreachable.
    let svc: Api<Service> = Api::namespaced(client(&env).await, "default");
    let svc = svc.get("kubernetes").await.expect("kubernetes Service");
    let ip = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("kubernetes Service has a ClusterIP");
    let addr: std::net::SocketAddr = format!("{ip}:443").parse().expect("ClusterIP");
    let started = Instant::now();
    let res = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3));
    let err = res.expect_err("a connection to the kubernetes Service IP succeeded");
    println!(
        "connect {addr}: {err} (kind {:?}) after {:?}",
        err.kind(),
        started.elapsed()
    );
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::NetworkUnreachable,
        "expected no route at all to {addr}"
    );
}

#[tokio::test]
async fn real_node_is_ready_and_not_kwok() {
    let env = env();
    let nodes: Api<Node> = Api::all(client(&env).await);
    let node = nodes.get(&env.node).await.expect("the real node exists");
    let status = node.status.clone().expect("node status");
    let ready = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(ready.status, "True", "{ready:?}");
    let info = status.node_info.expect("nodeInfo");
    println!(
        "{}: kubelet {}, runtime {}, kernel {}",
        env.node, info.kubelet_version, info.container_runtime_version, info.kernel_version
    );
    assert_eq!(info.kubelet_version, "v1.36.3");
    assert!(
        info.container_runtime_version.starts_with("containerd://"),
        "{}",
        info.container_runtime_version
    );
    // KWOK leaves it alone: not one of its fake nodes, and its kubelet port is real.
    assert!(
        !node.annotations().contains_key("kwok.x-k8s.io/node"),
        "the real node carries a KWOK annotation"
    );
    let port = status
        .daemon_endpoints
        .and_then(|d| d.kubelet_endpoint)
        .map(|e| e.port);
    assert_eq!(port, Some(10250));
    // The fake nodes are still there and Ready.
    let all = nodes.list(&Default::default()).await.expect("list nodes");
    assert!(
        all.items.len() >= 2,
        "expected KWOK nodes next to the real one"
    );
}

#[tokio::test]
async fn agent_pod_reads_imds_and_reports_its_event() {
    const ID: &str = "5E1C0DE0-0000-4000-8000-00000000A101";
    let env = env();
    let client = client(&env).await;
    setup(&env, &client).await;
    let nodes: Api<Node> = Api::all(client.clone());

    // The mock plays IMDS at its real address, serving the VM at the root,
    // with one event announced an hour ahead.
    let mut mock = start_mock_with(
        &env,
        &format!("events:\n  - id: {ID}\n    type: Reboot\n    source: Platform\n    resources: [{VM}]\n    durationSeconds: -1\n    at: 0s\n    notice: 3600s\n    runFor: 5s\n"),
        false,
        "imds-mock",
    )
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let started = Instant::now();
    let pod = apply(&pods, json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "forewarn-agent", "labels": {"app": "forewarn-agent"}},
        "spec": {
            "serviceAccountName": "forewarn-agent",
            "hostNetwork": true,
            "dnsPolicy": "ClusterFirstWithHostNet",
            "nodeSelector": {"kubernetes.io/hostname": env.node},
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "agent",
                "image": AGENT_IMAGE,
                "imagePullPolicy": "Never",
                "args": ["agent"],
                "env": [
                    {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    // No kube-proxy here: give the API server's real address.
                    {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": api_port(&env)},
                    {"name": "FOREWARN_METRICS_ADDR", "value": "0.0.0.0:9101"},
                ],
                "ports": [{"name": "metrics", "containerPort": 9101}],
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9101}, "periodSeconds": 1},
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 9101}, "periodSeconds": 5},
                "securityContext": {
                    "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    })).await;
    // The agent is told nothing about IMDS: it uses its production default.
    let spec = serde_json::to_string(&pod.spec).unwrap();
    assert!(!spec.contains("imds-url") && !spec.contains("FOREWARN_IMDS_URL"));

    let pod = wait_pod_ready(&pods, "forewarn-agent", Duration::from_secs(90)).await;
    let ready_after = started.elapsed();
    let status = pod.status.clone().unwrap();
    println!(
        "agent pod Ready after {ready_after:?} on {:?}, pod IP {:?}",
        pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        status.pod_ip
    );
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(env.node.as_str())
    );
    let cs = &status.container_statuses.expect("container statuses")[0];
    assert!(cs.ready && cs.started == Some(true), "{cs:?}");
    assert_eq!(cs.restart_count, 0, "the agent container restarted");
    assert_eq!(cs.image, AGENT_IMAGE);

    // The process really runs as 65532 on a read-only root filesystem.
    let (pid, proc_status) =
        find_process("/usr/local/bin/forewarn\0agent\0").expect("the agent's process");
    let uid_line = proc_status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap_or_default();
    assert!(
        uid_line.split_whitespace().skip(1).all(|u| u == "65532"),
        "agent uid: {uid_line}"
    );
    let mountinfo =
        std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("agent mountinfo");
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("root mount");
    assert!(
        root.split_whitespace()
            .nth(5)
            .is_some_and(|o| o.split(',').any(|o| o == "ro")),
        "root filesystem not read-only: {root}"
    );
    let token_mount = mountinfo
        .lines()
        .find(|l| l.contains("/var/run/secrets/kubernetes.io/serviceaccount"));
    assert!(
        token_mount.is_some(),
        "no ServiceAccount token mounted:\n{mountinfo}"
    );

    // Its report of the event it read from IMDS at 169.254.169.254, with
    // the VM name IMDS gave, written by the agent's field manager alone.
    let reports: Api<forewarn::api::ScheduledEventReport> = Api::all(client.clone());
    let name = format!("{}.{}", ID.to_ascii_lowercase(), env.node);
    let report = {
        let start = Instant::now();
        loop {
            if let Some(r) = reports.get_opt(&name).await.expect("get report") {
                break r;
            }
            // A hang bound: the agent reports within a second or two of
            // being Ready; 120 s is only reached if it never does.
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "no report {name} from the agent within 120 s"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    assert_eq!(report.spec.report.vm, VM, "{report:?}");
    assert_eq!(report.spec.report.node, env.node);
    assert!(report.spec.report.named);
    assert_eq!(report.spec.report.event_id, ID);
    let managers: Vec<Option<String>> = report
        .managed_fields()
        .iter()
        .map(|m| m.manager.clone())
        .collect();
    assert_eq!(managers, [Some(forewarn::api::AGENT_MANAGER.to_string())]);
    // Agents write no Node.
    let node = nodes.get(&env.node).await.expect("node");
    assert!(
        !node
            .managed_fields()
            .iter()
            .any(|m| m.manager.as_deref() == Some(forewarn::api::AGENT_MANAGER)),
        "the agent wrote its Node: {:?}",
        node.managed_fields()
    );
    let logs = env
        .cluster
        .kubectl(&["logs", "-n", NS, "forewarn-agent"])
        .expect("kubectl logs of the agent");
    println!("agent logs:\n{logs}");
    assert!(
        logs.contains("Agent started") && logs.contains(VM),
        "agent logs: {logs}"
    );

    pods.delete("forewarn-agent", &DeleteParams::default())
        .await
        .expect("delete the agent pod");
    // Gone before the next test's agent takes its host port. A hang bound:
    // its grace is 5 s and the agent exits at once on SIGTERM.
    let deadline = Instant::now() + Duration::from_secs(120);
    while pods.get_opt("forewarn-agent").await.expect("get").is_some() {
        assert!(Instant::now() < deadline, "the agent pod was not deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    mock.terminate(Duration::from_secs(5)).await.ok();
}

#[tokio::test]
async fn evicted_container_gets_prestop_and_sigterm() {
    const GRACE: i64 = 20;
    const PRESTOP_SLEEP: u64 = 2;
    const TERM_DELAY: u64 = 3;
    let env = env();
    let client = client(&env).await;
    setup(&env, &client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    apply(&pods, json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "workload", "labels": {"app": "workload"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": env.node},
            "terminationGracePeriodSeconds": 30,
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "server",
                "image": WORKLOAD_IMAGE,
                "imagePullPolicy": "Never",
                "args": ["serve", "--port", "8080", "--term-delay", TERM_DELAY.to_string()],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
                "lifecycle": {"preStop": {"exec": {"command":
                    ["/usr/local/bin/workload", "prestop", "--sleep", PRESTOP_SLEEP.to_string()]}}},
                "securityContext": {
                    "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    }))
    .await;
    // A hang bound: the image is on the node; Ready within a few seconds.
    let pod = wait_pod_ready(&pods, "workload", Duration::from_secs(120)).await;
    // A bridge pod, reachable from the node through CNI.
    let ip = pod.status.and_then(|s| s.pod_ip).expect("pod IP");
    assert!(ip.starts_with("10.244.77."), "pod IP {ip}");
    let body = reqwest::get(format!("http://{ip}:8080/"))
        .await
        .expect("GET the workload")
        .text()
        .await
        .expect("body");
    assert_eq!(body.trim(), "ok");
    // Its whole log, followed from before the eviction to its exit.
    let mut follow = LogFollow::start(&env, NS, "workload");
    follow.attached(Duration::from_secs(60)).await;

    // The Eviction is written out: kube 5.0.0's `Api::evict` serializes its
    // DeleteOptions as `delete_options`, which the API server ignores (the
    // grace period and preconditions are dropped; seen here as the pod's own
    // 30 s instead of the 20 s asked for).
    let eviction = json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "workload", "namespace": NS},
        "deleteOptions": {"gracePeriodSeconds": GRACE},
    });
    let evicted = Instant::now();
    let _: Value = pods
        .create_subresource("eviction", "workload", &PostParams::default(), &eviction)
        .await
        .expect("evict the workload");
    // What the server recorded: the grace asked for, and its end
    // (`deletionTimestamp`: the eviction's time plus the grace, in whole
    // seconds, rounded down).
    let terminating = pods.get("workload").await.expect("pod after eviction");
    assert_eq!(
        terminating.metadata.deletion_grace_period_seconds,
        Some(GRACE)
    );
    let grace_ends = terminating
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| {
            chrono::DateTime::parse_from_rfc3339(&t.0.to_string())
                .expect("deletionTimestamp")
                .with_timezone(&chrono::Utc)
        })
        .expect("no deletionTimestamp after the eviction");

    // Gone once the container exited. A hang bound: the kubelet kills the
    // container at the end of its grace (20 s) at the latest and then
    // removes the pod; 180 s is only reached if it never does.
    let deadline = Instant::now() + Duration::from_secs(180);
    while pods.get_opt("workload").await.expect("get").is_some() {
        assert!(
            Instant::now() < deadline,
            "the workload pod was never deleted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone = evicted.elapsed();
    // The stream ended with the container; a hang bound as above.
    let logs = follow.finish(Duration::from_secs(60)).await;
    println!("workload logs (kubectl logs -f):\n{logs}");
    let pos = |s: &str| {
        logs.find(s)
            .unwrap_or_else(|| panic!("{s:?} missing from:\n{logs}"))
    };
    assert!(pos("preStop hook started") < pos("preStop hook done"));
    assert!(
        pos("preStop hook done") < pos("SIGTERM received"),
        "SIGTERM before the preStop hook finished"
    );
    // `exiting` is the workload's last line, after its term delay: a
    // container the kubelet killed at the end of its grace never writes it.
    let exited = exit_stamp(&logs).unwrap_or_else(|| {
        panic!("the container did not exit by itself after SIGTERM (killed at the end of its grace?):\n{logs}")
    });
    // The container's own clock (lower bounds: load only lengthens them).
    let hook = log_stamp(&logs, "SIGTERM received") - log_stamp(&logs, "preStop hook started");
    assert!(
        hook >= chrono::TimeDelta::milliseconds(PRESTOP_SLEEP as i64 * 1000 - 100),
        "the preStop hook ran only {hook}"
    );
    let term = exited - log_stamp(&logs, "SIGTERM received");
    assert!(
        term >= chrono::TimeDelta::milliseconds(TERM_DELAY as i64 * 1000 - 100),
        "the container had only {term} after its SIGTERM"
    );
    // Within its grace, on the API server's clock (the same machine's): the
    // container exits about 5 s into a 20 s grace, and the kubelet would
    // have killed it at the end, before it could write `exiting`.
    println!(
        "evicted with grace {GRACE}s (ends {grace_ends}): exited at {exited}, pod gone after {gone:?}"
    );
    assert!(
        exited < grace_ends,
        "exited at {exited}, after the end of its grace at {grace_ends}"
    );
    // A lower bound on the test's clock (taken before the eviction was
    // sent): load only lengthens it.
    assert!(
        gone >= Duration::from_secs(PRESTOP_SLEEP + TERM_DELAY),
        "pod gone after {gone:?}: the container did not get its time"
    );
}

/// The agent as a DaemonSet on the real node (a drain leaves DaemonSet pods
/// alone), same container as in `agent_pod_reads_imds_and_reports_its_event`.
async fn agent_daemonset(env: &Env, client: &Client) {
    let ds: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(client.clone(), NS);
    apply(&ds, json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "forewarn-agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "forewarn-agent-ds"}},
            "template": {
                "metadata": {"labels": {"app": "forewarn-agent-ds"}},
                "spec": {
                    "serviceAccountName": "forewarn-agent",
                    "hostNetwork": true,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "nodeSelector": {"kubernetes.io/hostname": env.node},
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "agent",
                        "image": AGENT_IMAGE,
                        "imagePullPolicy": "Never",
                        "args": ["agent"],
                        "env": [
                            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                            {"name": "KUBERNETES_SERVICE_PORT", "value": api_port(env)},
                            {"name": "FOREWARN_METRICS_ADDR", "value": "0.0.0.0:9101"},
                        ],
                        "ports": [{"name": "metrics", "containerPort": 9101}],
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9101}, "periodSeconds": 1},
                        "securityContext": {
                            "readOnlyRootFilesystem": true,
                            "allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }],
                },
            },
        },
    }))
    .await;
}

fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn redeploy_drains_the_real_node_with_real_grace() {
    use forewarn::api::ScheduledEvent;
    use forewarn::imds::mock::LogEntry;
    use forewarn_harness::procs::Proc;
    use kube::api::ListParams;

    let env = env();
    let client = client(&env).await;
    setup(&env, &client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let nodes: Api<Node> = Api::all(client.clone());
    let sevs: Api<ScheduledEvent> = Api::all(client.clone());

    // IMDS: a platform Redeploy of the real node's VM, its clock held until
    // the agent and the workload are in place.
    let mut mock = start_mock_with(
        &env,
        &format!(
            "events:\n  - id: 5E1C0DE0-0000-4000-8000-00000000A001\n    type: Redeploy\n    source: Platform\n    resources: [{VM}]\n    durationSeconds: -1\n    description: Virtual machine is being redeployed to a different host.\n    at: 1s\n    notice: 120s\n    runFor: 5s\n"
        ),
        true,
        "imds-mock-redeploy",
    )
    .await;
    agent_daemonset(&env, &client).await;

    // A workload spread over the real node and the KWOK nodes, with a PDB.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), NS);
    apply(&deployments, json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 30,
                    "automountServiceAccountToken": false,
                    "topologySpreadConstraints": [{
                        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app": "web"}},
                    }],
                    "securityContext": {"runAsNonRoot": true},
                    "containers": [{
                        "name": "server",
                        "image": WORKLOAD_IMAGE,
                        "imagePullPolicy": "Never",
                        "args": ["serve", "--port", "8080", "--term-delay", "3"],
                        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
                        "lifecycle": {"preStop": {"exec": {"command":
                            ["/usr/local/bin/workload", "prestop", "--sleep", "2"]}}},
                    }],
                },
            },
        },
    }))
    .await;
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(client.clone(), NS);
    apply(
        &pdbs,
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
        }),
    )
    .await;

    // Wait: the agent Ready on the real node, 3 web pods Ready, one of them
    // real. A hang bound: the images are on the node and KWOK's pods are
    // Ready at once; this takes a few seconds, 180 s only if a pod never
    // starts.
    let deadline = Instant::now() + Duration::from_secs(180);
    let real_pod = loop {
        let agent_ready = pods
            .list(&ListParams::default().labels("app=forewarn-agent-ds"))
            .await
            .expect("agent pods")
            .items
            .iter()
            .any(is_ready);
        let web = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .expect("web pods")
            .items;
        let on_real = web
            .iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&env.node));
        if let Some(p) = on_real.filter(|p| {
            agent_ready && is_ready(p) && web.iter().filter(|p| is_ready(p)).count() == 3
        }) {
            break p.name_any();
        }
        assert!(
            Instant::now() < deadline,
            "agent or workload not Ready: agent {agent_ready}, web {:?}",
            web.iter()
                .map(|p| (
                    p.name_any(),
                    p.spec.as_ref().and_then(|s| s.node_name.clone()),
                    is_ready(p)
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // The real container's whole log, followed from now to its exit.
    let mut follow = LogFollow::start(&env, NS, &real_pod);
    follow.attached(Duration::from_secs(60)).await;

    // The controller, as a process next to the cluster.
    let (mut controller, _) = Proc::spawn(
        "controller",
        &env.forewarn,
        &[
            "controller".into(),
            "--metrics-addr".into(),
            "127.0.0.1:0".into(),
            "--lease-namespace".into(),
            NS.into(),
        ],
        &[("KUBECONFIG", &env.cluster.kubeconfig.to_string_lossy())],
        &env.logs,
        "controller",
    )
    .expect("start the controller");

    let http = forewarn::http::client();
    let mock_url = format!("http://{}", env.imds_ip);
    http.post(format!("{mock_url}/mock/start"))
        .send()
        .await
        .expect("start the mock's clock");
    let t0 = Instant::now();
    // What one round saw, in reading order (the reverse of the causal order);
    // printed reversed at the end of the round, stamped with its start.
    let mut round: Vec<String> = Vec::new();
    let (mut seen, mut cordoned, mut evicted, mut sigterm, mut gone, mut approved, mut uncordoned) =
        (None, None, None, None, None, None, None);
    let mut stopped = None;
    let mut grace_sent = None;
    let mut logs = String::new();
    let mut phase = String::new();
    let mut min_ready = usize::MAX;
    // A hang bound: the cycle (drain, approval, the event's 5 s, the
    // release delay) takes about half a minute; 300 s is only reached if a
    // step never comes.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let now = t0.elapsed();
        // Read in the reverse of the causal order (IMDS, pods, node, events),
        // so that a step seen in one round implies its causes are seen too.
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
                round.push(format!("approval reached IMDS from {:?}", a.vm));
                assert_eq!(a.vm.as_deref(), Some(VM), "approved by another VM");
            }
        }
        let web = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .expect("web")
            .items;
        min_ready = min_ready.min(web.iter().filter(|p| is_ready(p)).count());
        let agent_ready = pods
            .list(&ListParams::default().labels("app=forewarn-agent-ds"))
            .await
            .expect("agent")
            .items
            .iter()
            .any(is_ready);
        assert!(agent_ready, "the agent pod stopped being Ready at {now:?}");
        match web.iter().find(|p| p.name_any() == real_pod) {
            Some(p) => {
                let exited = p.status.as_ref().is_some_and(|st| {
                    matches!(st.phase.as_deref(), Some("Succeeded" | "Failed"))
                        || st
                            .container_statuses
                            .iter()
                            .flatten()
                            .any(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
                });
                if exited && stopped.is_none() {
                    stopped = Some(now);
                    round.push(format!("{real_pod}: container exited"));
                }
                if p.metadata.deletion_timestamp.is_some() && evicted.is_none() {
                    evicted = Some(now);
                    grace_sent = p.metadata.deletion_grace_period_seconds;
                    round.push(format!(
                        "{real_pod} evicted (deletionGracePeriodSeconds {grace_sent:?})"
                    ));
                }
                if evicted.is_some()
                    && sigterm.is_none()
                    && let Ok(l) = env.cluster.kubectl(&["logs", "-n", NS, &real_pod])
                {
                    logs = l;
                    if logs.contains("SIGTERM received") {
                        sigterm = Some(now);
                        round.push(format!("{real_pod}: SIGTERM received (kubectl logs)"));
                    }
                }
            }
            None if gone.is_none() => {
                gone = Some(now);
                stopped = stopped.or(Some(now));
                round.push(format!("{real_pod} gone: the real node is drained"));
            }
            None => {}
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
        let sev = sevs.list(&ListParams::default()).await.expect("sevs").items;
        if let Some(ev) = sev.first() {
            if seen.is_none() {
                seen = Some(now);
                round.push(format!("ScheduledEvent {} seen", ev.name_any()));
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
            "no full cycle within 300 s; controller log:\n{}",
            controller.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The container has exited: its followed log is whole (a hang bound).
    let followed = follow.finish(Duration::from_secs(60)).await;
    if followed.len() > logs.len() {
        logs = followed;
    }
    println!("{real_pod} logs:\n{logs}");
    let at = |o: Option<Duration>, what: &str| o.unwrap_or_else(|| panic!("never {what}"));
    let (seen, cordoned, evicted, stopped, gone, approved, uncordoned) = (
        at(seen, "seen"),
        at(cordoned, "cordoned"),
        at(evicted, "evicted"),
        at(stopped, "exited"),
        at(gone, "drained"),
        at(approved, "approved"),
        at(uncordoned, "uncordoned"),
    );
    // Order only: each round reads in the reverse of the causal order.
    assert!(seen <= cordoned && cordoned <= evicted && evicted <= stopped && stopped <= gone);
    // A SIGTERM seen by a round came between the eviction and the exit (a
    // slow round may see neither before the container is gone: the
    // followed log below has it then).
    if let Some(sigterm) = sigterm {
        assert!(evicted <= sigterm && sigterm <= stopped);
    }
    // The controller counts an evicted pod whose containers have all exited
    // (phase Succeeded/Failed) as gone; the kubelet deletes the object a
    // moment later. The approval must follow the container's exit.
    assert!(
        stopped <= approved && approved <= uncordoned,
        "approval at {approved:?}, the real container exited at {stopped:?}"
    );
    // The container got its time: an eviction with a grace, not a force
    // delete, and the container's own log (its clock, lower bounds: load
    // only lengthens them) shows the preStop hook's 2 s, then SIGTERM, then
    // its 3 s, then its own exit (a container killed at the end of its
    // grace never writes `exiting`).
    assert!(
        grace_sent.is_some_and(|g| g >= 5),
        "evicted with deletionGracePeriodSeconds {grace_sent:?}: less than the container needs"
    );
    let pos = |s: &str| {
        logs.find(s)
            .unwrap_or_else(|| panic!("{s:?} missing from:\n{logs}"))
    };
    assert!(pos("preStop hook started") < pos("preStop hook done"));
    assert!(
        pos("preStop hook done") < pos("SIGTERM received"),
        "SIGTERM before the preStop hook finished"
    );
    let exited = exit_stamp(&logs).unwrap_or_else(|| {
        panic!("the real container did not exit by itself after SIGTERM:\n{logs}")
    });
    let lived = exited - log_stamp(&logs, "preStop hook started");
    assert!(
        lived >= chrono::TimeDelta::milliseconds(4800),
        "the real container had {lived} from its preStop hook to its exit (preStop 2 s + 3 s after SIGTERM)"
    );
    assert!(
        min_ready >= 2,
        "PodDisruptionBudget violated: {min_ready} ready"
    );
    controller.terminate(Duration::from_secs(10)).await.ok();
    mock.terminate(Duration::from_secs(5)).await.ok();
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .ok();
    // The agent DaemonSet holds port 9101 of the real node (hostNetwork):
    // gone before tests/real_node_chart.rs installs the chart's agent there.
    let ds: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(client.clone(), NS);
    ds.delete("forewarn-agent", &DeleteParams::foreground())
        .await
        .expect("delete the agent DaemonSet");
    // A hang bound: the agent's grace is 5 s and it exits at once on SIGTERM.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pods
        .list(&ListParams::default().labels("app=forewarn-agent-ds"))
        .await
        .expect("agent pods")
        .items
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the agent DaemonSet's pod stayed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// With the real container: the example workload
/// (`examples/notice-workload.yaml`, one replica on the real node) reads
/// its notice from the downward-API file the kubelet keeps up to date,
/// prepares, and acknowledges with its own ServiceAccount token; IMDS
/// receives the approval only after that, and the pod is evicted after
/// its acknowledgement. The container's own log lines (RFC 3339 stamps)
/// and the IMDS mock's log give the order. The pod reaches the API server
/// as the agent does here (hostNetwork, 127.0.0.1: no kube-proxy on this
/// node).
///
/// Written for `make test-real`; not run by the change that added it.
#[tokio::test]
async fn a_real_container_reads_its_notice_and_acknowledges_before_the_approval() {
    use forewarn::api::ScheduledEvent;
    use forewarn::imds::mock::LogEntry;
    use forewarn_harness::procs::Proc;
    use kube::api::ListParams;

    const ID: &str = "5E1C0DE0-0000-4000-8000-00000000A016";
    let env = env();
    let client = client(&env).await;
    setup(&env, &client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let sevs: Api<ScheduledEvent> = Api::all(client.clone());
    let mut mock = start_mock_with(
        &env,
        &format!(
            "events:\n  - id: {ID}\n    type: Reboot\n    source: Platform\n    resources: [{VM}]\n    durationSeconds: -1\n    description: Virtual machine is going to be restarted.\n    at: 1s\n    notice: 120s\n    runFor: 5s\n"
        ),
        true,
        "imds-mock-notice",
    )
    .await;
    agent_daemonset(&env, &client).await;

    // The example as it is, but for the StatefulSet: one replica on the
    // real node, with the API server at 127.0.0.1.
    let text = std::fs::read_to_string(repo_root().join("examples/notice-workload.yaml"))
        .expect("examples/notice-workload.yaml");
    let mut docs: Vec<Value> = text
        .split("\n---")
        .map(|d| serde_yaml::from_str::<Value>(d).expect("YAML"))
        .filter(|d| !d.is_null())
        .collect();
    for d in docs.iter_mut().filter(|d| d["kind"] == "StatefulSet") {
        d["spec"]["replicas"] = json!(1);
        let spec = &mut d["spec"]["template"]["spec"];
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": env.node});
        spec["hostNetwork"] = json!(true);
        spec["dnsPolicy"] = json!("ClusterFirstWithHostNet");
        let container = &mut spec["containers"][0];
        container["env"].as_array_mut().expect("env").extend([
            json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}),
            json!({"name": "KUBERNETES_SERVICE_PORT", "value": api_port(&env)}),
        ]);
    }
    let file = env.logs.join("notice-workload.json");
    std::fs::write(
        &file,
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": docs}))
            .expect("json"),
    )
    .expect("write the workload");
    env.cluster
        .kubectl(&["apply", "-n", NS, "-f", &file.to_string_lossy()])
        .expect("apply the example workload");
    // Hang bounds: both are Ready within seconds.
    wait_pod_ready(&pods, "db-0", Duration::from_secs(180)).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pods
        .list(&ListParams::default().labels("app=forewarn-agent-ds"))
        .await
        .expect("agent pods")
        .items
        .iter()
        .any(is_ready)
    {
        assert!(Instant::now() < deadline, "the agent is not Ready");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (mut controller, _) = Proc::spawn(
        "controller",
        &env.forewarn,
        &[
            "controller".into(),
            "--metrics-addr".into(),
            "127.0.0.1:0".into(),
            "--lease-namespace".into(),
            NS.into(),
        ],
        &[("KUBECONFIG", &env.cluster.kubeconfig.to_string_lossy())],
        &env.logs,
        "controller-notice",
    )
    .expect("start the controller");

    let http = forewarn::http::client();
    let mock_url = format!("http://{}", env.imds_ip);
    http.post(format!("{mock_url}/mock/start"))
        .send()
        .await
        .expect("start the mock's clock");
    // Every version of db-0, as the API server stored them in order: the
    // eviction must come after the acknowledgement, on the first db-0.
    let (_watch, mut db0) = {
        use futures::StreamExt as _;
        use kube::runtime::{WatchStreamExt as _, watcher};
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Pod>();
        let stream = watcher(
            pods.clone(),
            watcher::Config::default().fields("metadata.name=db-0"),
        )
        .applied_objects();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                if let Ok(p) = item
                    && tx.send(p).is_err()
                {
                    break;
                }
            }
        });
        (AbortOnDrop(task), rx)
    };
    let first_uid = pods
        .get("db-0")
        .await
        .expect("db-0")
        .metadata
        .uid
        .expect("db-0's uid");
    let ack_key = forewarn::controller::observe::participants::ack_key(&ID.to_ascii_lowercase());
    // Versions of the first db-0 with a deletionTimestamp, each with its
    // acknowledgement then (None: none yet).
    let mut terminating: Vec<Option<String>> = Vec::new();
    let read_versions = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<Pod>,
                         terminating: &mut Vec<Option<String>>| {
        while let Ok(p) = rx.try_recv() {
            if p.metadata.uid.as_deref() == Some(first_uid.as_str())
                && p.metadata.deletion_timestamp.is_some()
            {
                terminating.push(p.annotations().get(&ack_key).cloned());
            }
        }
    };

    // Until the event is over: the container's log and the mock's log.
    let name = ID.to_ascii_lowercase();
    let mut logs = String::new();
    let mut approval: Option<chrono::DateTime<chrono::Utc>> = None;
    // A hang bound: the cycle takes about half a minute; 300 s is only
    // reached if a step never comes.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Ok(l) = env.cluster.kubectl(&["logs", "-n", NS, "db-0"]) {
            // The first db-0's log; its successor (after the eviction) starts afresh.
            if logs.is_empty() || l.contains(&format!("acknowledged {name}")) {
                logs = l;
            }
        }
        read_versions(&mut db0, &mut terminating);
        let log: Vec<LogEntry> = http
            .get(format!("{mock_url}/mock/log"))
            .send()
            .await
            .expect("mock log")
            .json()
            .await
            .expect("mock log json");
        approval = approval.or(log.iter().find(|e| e.what == "Approved").map(|e| e.time));
        let over = sevs
            .get_opt(&name)
            .await
            .expect("get the ScheduledEvent")
            .and_then(|ev| ev.status.and_then(|s| s.phase))
            .is_some_and(|p| p.is_final());
        if over {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the event did not end within 300 s; db-0 log:\n{logs}\ncontroller log:\n{}",
            controller.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The eviction came before the event ended: its version is delivered
    // by now, or soon (a hang bound; nothing is waited for when it is).
    let deadline = Instant::now() + Duration::from_secs(60);
    read_versions(&mut db0, &mut terminating);
    while terminating.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        read_versions(&mut db0, &mut terminating);
    }
    println!("db-0 logs:\n{logs}");
    let stamp = |what: &str| {
        let line = logs
            .lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("{what:?} not in db-0's log:\n{logs}"));
        chrono::DateTime::parse_from_rfc3339(line.split_whitespace().next().unwrap_or_default())
            .expect("stamp")
            .with_timezone(&chrono::Utc)
    };
    let noticed = stamp(&format!("notice {name}: eventId={ID}"));
    let acked = stamp(&format!("acknowledged {name}"));
    let approval = approval.expect("no approval reached IMDS");
    assert!(noticed < acked, "acknowledged before the notice was read");
    // `acknowledged` is logged once the API server answered the PATCH; the
    // container exits (on its SIGTERM) only after that, and the approval
    // follows its exit: an order, whatever the load.
    assert!(
        acked < approval,
        "IMDS got the approval at {approval}, before the acknowledgement at {acked}"
    );
    // The eviction, in the order the API server stored db-0's versions:
    // the first version with a deletionTimestamp already carries the
    // acknowledgement of this event.
    assert!(!terminating.is_empty(), "db-0 was never evicted");
    assert_eq!(
        terminating[0].as_deref(),
        Some(ID),
        "db-0 was evicted before its acknowledgement ({ack_key}) was stored"
    );
    // The release comes `releaseDelaySeconds` after the end: the controller
    // must still run then, or the real node stays cordoned for the tests
    // that follow.
    // A hang bound: the release comes releaseDelaySeconds (5 s) after the
    // end; 180 s is only reached if it never does.
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let node = nodes.get(&env.node).await.expect("the real node");
        if !node.spec.and_then(|s| s.unschedulable).unwrap_or(false) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the real node was not uncordoned after the event; controller log:\n{}",
            controller.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    controller.terminate(Duration::from_secs(10)).await.ok();
    mock.terminate(Duration::from_secs(5)).await.ok();
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(client.clone(), NS);
    sts.delete("db", &DeleteParams::default()).await.ok();
    // The agent DaemonSet holds port 9101 of the real node (hostNetwork).
    let ds: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(client.clone(), NS);
    ds.delete("forewarn-agent", &DeleteParams::foreground())
        .await
        .expect("delete the agent DaemonSet");
    // A hang bound: the agent's grace is 5 s and it exits at once on SIGTERM.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pods
        .list(&ListParams::default().labels("app=forewarn-agent-ds"))
        .await
        .expect("agent pods")
        .items
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the agent DaemonSet's pod stayed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
