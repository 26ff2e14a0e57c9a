//! Faults, with the shipped binary's real processes on a real local control
//! plane (cluster `forewarn-faults`) whose kube-apiserver writes an audit
//! log of every write: what each process sent is judged from what the API
//! server saw, by the `User-Agent` each process sends
//! (`forewarn/<version> (<role>; <identity>)`), not from the processes' own
//! metrics.
//!
//! - a hung API server (paused with SIGSTOP) delays no IMDS poll and loses
//!   no report;
//! - a leader paused (SIGSTOP) mid-drain past its lease, and resumed after
//!   the standby took over, sends no write;
//! - an agent SIGKILLed after IMDS received its approval and before it
//!   recorded it loses nothing and leaves no node cordoned.
//!
//! They take turns (one pauses the cluster's API server) and fail, never
//! skip, when the cluster cannot start.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use forewarn::api::{
    EventStatus, Phase, Report, ScheduledEvent, ScheduledEventReport, report_name,
};
use forewarn::imds::mock::{LogEntry, RequestEntry};
use forewarn::imds::model::object_name;
use forewarn_harness::audit::Write;
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::procs::{Proc, start_imds_mock, wait_ready};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const NODES: usize = 3;

/// The bound on every wait for something that happens within seconds (a
/// report written, a node cordoned, a Lease taken over): a hang bound.
/// Each wait ends as soon as its condition holds; only a process that
/// stopped working waits this long, whatever the load on the machine.
const HANG: Duration = Duration::from_secs(120);

/// How long a process may take to exit on SIGTERM: a hang bound too.
const STOP: Duration = Duration::from_secs(60);

fn cluster() -> Cluster {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            // FOREWARN_FAULTS_CLUSTER: another name, to run beside a
            // `make test` that uses the default one.
            let name = std::env::var("FOREWARN_FAULTS_CLUSTER")
                .unwrap_or_else(|_| "forewarn-faults".into());
            forewarn_harness::audit::start_cluster(&name, NODES, &repo_root().join("target/faults"))
                .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .unwrap_or_else(|e| panic!("the local cluster could not start: {e}"))
}

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_forewarn"))
}

fn dir(test: &str) -> PathBuf {
    let d = repo_root().join("target/faults").join(test);
    std::fs::create_dir_all(&d).expect("test dir");
    d
}

/// Loopback calls (the mock, the processes' probes) answered at once; the
/// timeout only ends a hang (a probe that timed out on a loaded machine
/// would read as a failed one).
fn http() -> reqwest::Client {
    forewarn::http::client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client")
}

/// Every write in the cluster's audit log (one per audit ID).
fn audit_writes(cluster: &Cluster) -> Vec<Write> {
    forewarn_harness::audit::writes(cluster).unwrap_or_else(|e| panic!("the audit log: {e:#}"))
}

/// The `User-Agent` a forewarn process of `role` with `identity` sends.
fn user_agent(role: &str, identity: &str) -> String {
    format!(
        "forewarn/{} ({role}; {identity})",
        env!("CARGO_PKG_VERSION")
    )
}

/// Polls `check` every 200 ms until it gives a value, failing after `within`.
async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Starts `forewarn imds-mock` (held) for `scenario`; returns it and its
/// base URL.
async fn start_mock(dir: &Path, scenario: &str) -> (Proc, String) {
    let file = dir.join("scenario.yaml");
    std::fs::write(&file, scenario).expect("scenario");
    start_imds_mock(
        &bin(),
        &file,
        "127.0.0.1:0",
        true,
        &[("RUST_LOG", "info")],
        dir,
    )
    .await
    .expect("start the mock")
}

async fn start_clock(base: &str) {
    http()
        .post(format!("{base}/mock/start"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("start the mock's clock");
}

async fn mock_requests(base: &str, vm: &str, method: &str) -> Vec<RequestEntry> {
    let all: Vec<RequestEntry> = http()
        .get(format!("{base}/mock/requests"))
        .send()
        .await
        .expect("mock requests")
        .json()
        .await
        .expect("mock requests JSON");
    all.into_iter()
        .filter(|r| r.vm == vm && r.method == method)
        .collect()
}

async fn mock_log(base: &str) -> Vec<LogEntry> {
    http()
        .get(format!("{base}/mock/log"))
        .send()
        .await
        .expect("mock log")
        .json()
        .await
        .expect("mock log JSON")
}

/// Starts an agent for `vm` on `node`; returns it and its metrics port.
async fn start_agent(
    cluster: &Cluster,
    dir: &Path,
    base: &str,
    node: &str,
    vm: &str,
) -> (Proc, u16) {
    start_agent_with(cluster, dir, base, node, vm, &[]).await
}

/// [`start_agent`] with `extra` arguments.
async fn start_agent_with(
    cluster: &Cluster,
    dir: &Path,
    base: &str,
    node: &str,
    vm: &str,
    extra: &[&str],
) -> (Proc, u16) {
    let args: Vec<String> = [
        "agent",
        "--node-name",
        node,
        "--imds-url",
        &format!("{base}/vm/{vm}"),
        "--metrics-addr",
        "127.0.0.1:0",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    let (mut p, _) = Proc::spawn(
        &format!("agent {node}"),
        &bin(),
        &args,
        &[("KUBECONFIG", &kubeconfig), ("RUST_LOG", "info,kube=warn")],
        dir,
        &format!("agent-{node}"),
    )
    .expect("start the agent");
    let port = p
        .metrics_port(HANG)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    (p, port)
}

/// Starts a controller with Lease `lease` as `identity`; returns it and its
/// metrics port.
async fn start_controller(
    cluster: &Cluster,
    dir: &Path,
    lease: &str,
    identity: &str,
) -> (Proc, u16) {
    start_controller_with(cluster, dir, lease, identity, &[]).await
}

/// [`start_controller`] with `extra` arguments.
async fn start_controller_with(
    cluster: &Cluster,
    dir: &Path,
    lease: &str,
    identity: &str,
    extra: &[&str],
) -> (Proc, u16) {
    let args: Vec<String> = [
        "controller",
        "--metrics-addr",
        "127.0.0.1:0",
        "--lease-namespace",
        "default",
        "--lease-name",
        lease,
        "--identity",
        identity,
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    let (mut p, _) = Proc::spawn(
        identity,
        &bin(),
        &args,
        &[("KUBECONFIG", &kubeconfig), ("RUST_LOG", "info,kube=warn")],
        dir,
        identity,
    )
    .expect("start the controller");
    let port = p
        .metrics_port(HANG)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    (p, port)
}

/// `kubectl apply -f -` of `doc` on `cluster`.
fn kubectl_apply(cluster: &Cluster, doc: &Value) {
    use std::io::Write as _;
    let mut child = std::process::Command::new(cluster.kubectl_path())
        .env("KUBECONFIG", &cluster.kubeconfig)
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child
        .stdin
        .take()
        .expect("kubectl stdin")
        .write_all(doc.to_string().as_bytes())
        .expect("write to kubectl");
    let out = child.wait_with_output().expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl apply failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn status(port: u16, path: &str) -> Option<u16> {
    http()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

/// Deletes the objects of the events `ids` (and every report about them)
/// left by an earlier run.
async fn clean(client: &kube::Client, ids: &[&str]) {
    let events: Api<ScheduledEvent> = Api::all(client.clone());
    let reports: Api<ScheduledEventReport> = Api::all(client.clone());
    let names: Vec<String> = ids.iter().map(|id| object_name(id)).collect();
    for n in &names {
        let _ = events.delete(n, &DeleteParams::default()).await;
    }
    for r in reports
        .list(&ListParams::default())
        .await
        .expect("list reports")
    {
        if names.contains(&r.spec.scheduled_event) {
            let _ = reports
                .delete(
                    r.metadata.name.as_deref().unwrap_or_default(),
                    &DeleteParams::default(),
                )
                .await;
        }
    }
}

async fn report(client: &kube::Client, id: &str, node: &str) -> Option<ScheduledEventReport> {
    let reports: Api<ScheduledEventReport> = Api::all(client.clone());
    reports
        .get_opt(&report_name(&object_name(id), node).expect("report name"))
        .await
        .ok()
        .flatten()
}

/// A kube-apiserver that hangs (SIGSTOP: connections open, nothing
/// answered) for 20 s delays no IMDS poll of an agent: its poll loop goes
/// on and `/healthz` stays 200; an agent started while it hangs is not
/// ready until it has read its reports; an event that appears while it
/// hangs is reported once it answers again. With the agent's former single
/// loop, the first hung write (of that event's report) stopped the polls
/// until the API server answered: the check of polls after the event
/// appeared fails. (How regular the interval stays is a speed figure, for
/// `make bench`.)
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_api_server_delays_no_imds_poll_and_loses_no_report() {
    let _turn = TURN.lock().await;
    const A: &str = "FA000000-0000-4000-8000-000000000001";
    const B: &str = "FA000000-0000-4000-8000-000000000002";
    let cluster = cluster();
    let client = cluster.client().await.expect("client");
    clean(&client, &[A, B]).await;
    let dir = dir("hung-api-server");
    let (_mock, base) = start_mock(
        &dir,
        &format!(
            "vms: [{{name: hg_0}}, {{name: hg_1}}]\nevents:\n  - {{id: {A}, type: Reboot, resources: [hg_0], at: 0s, notice: 1h}}\n  - {{id: {B}, type: Reboot, resources: [hg_0, hg_1], at: 10s, notice: 1h}}\n"
        ),
    )
    .await;
    let (mut agent, port) = start_agent(&cluster, &dir, &base, "hang-node-0", "hg_0").await;
    wait_ready(port, HANG)
        .await
        .unwrap_or_else(|e| panic!("agent not ready: {e}"));
    start_clock(&base).await;
    // The mock's clock started before this reading: B is listed by then.
    let b_listed = Utc::now() + chrono::TimeDelta::seconds(10);
    eventually("A reported", HANG, || async {
        report(&client, A, "hang-node-0")
            .await
            .filter(|r| r.spec.report.event_status == EventStatus::Scheduled)
    })
    .await;

    let paused = cluster.pause_api_server().expect("pause kube-apiserver");
    let paused_at = Utc::now();
    let since = Instant::now();
    // A second agent starts while the API server hangs.
    let (mut late, late_port) = start_agent(&cluster, &dir, &base, "hang-node-1", "hg_1").await;
    let mut health = Vec::new();
    let mut ready_late = Vec::new();
    // The pause: 20 s at least (load only lengthens it).
    while since.elapsed() < Duration::from_secs(20) {
        health.push(status(port, "/healthz").await);
        ready_late.push(status(late_port, "/readyz").await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let resumed_at = Utc::now();
    let restarted = tokio::task::block_in_place(|| cluster.resume_api_server(paused))
        .expect("resume kube-apiserver");
    println!("started again after the pause: {restarted:?}");
    println!("kube-apiserver paused {paused_at} .. {resumed_at}");

    assert!(
        health.iter().all(|h| *h == Some(200)),
        "/healthz while the API server hung: {health:?}"
    );
    assert!(
        ready_late.iter().all(|r| *r == Some(503)),
        "/readyz of the agent started while the API server hung: {ready_late:?}"
    );
    // Polls went on: both agents polled again after the poll that first
    // listed B, whose report's write hung, while the API server still hung
    // (by the mock's own clock). A loop blocked by that write polls no more
    // until the API server answers: none. Nominally some ten polls come in
    // that time (B is listed 10 s in, the pause lasts 20 s from about 1 s
    // in); two is a bound only an agent stalled for most of it misses.
    for vm in ["hg_0", "hg_1"] {
        let all: Vec<DateTime<Utc>> = mock_requests(&base, vm, "GET")
            .await
            .into_iter()
            .map(|r| r.arrived)
            .collect();
        let after_b = all
            .iter()
            .filter(|t| **t >= b_listed && **t <= resumed_at)
            .count();
        let gaps: Vec<f64> = all
            .windows(2)
            .map(|w| (w[1] - w[0]).num_milliseconds() as f64 / 1000.0)
            .collect();
        let longest = gaps.iter().copied().fold(0.0, f64::max);
        println!(
            "{vm}: {after_b} polls after B was listed while the API server hung; longest gap between polls {longest:.2} s"
        );
        assert!(
            after_b >= 2,
            "{vm}: {after_b} polls after B was listed ({b_listed}) and before the API server answered again ({resumed_at}): {all:?}"
        );
    }

    // B came while it hung: both agents report it once it answers again,
    // and the late agent turns ready.
    for node in ["hang-node-0", "hang-node-1"] {
        let r = eventually(&format!("B reported by {node}"), HANG, || async {
            report(&client, B, node).await
        })
        .await;
        assert_eq!(r.spec.report.event_status, EventStatus::Scheduled, "{r:?}");
    }
    wait_ready(late_port, HANG)
        .await
        .unwrap_or_else(|e| panic!("the late agent not ready after the API server returned: {e}"));
    let a = report(&client, A, "hang-node-0")
        .await
        .expect("A's report kept");
    assert_eq!(a.spec.report.event_status, EventStatus::Scheduled);
    // Stopped before the clean-up: an agent writes its live reports again.
    for p in [&mut agent, &mut late] {
        let status = p.terminate(STOP).await.expect("stop agent");
        assert!(status.success(), "{} exited with {status}", p.name);
    }
    clean(&client, &[A, B]).await;
}

/// The reports an agent on `node` would write for a `Reboot` named
/// `vm`, appearance 1.
fn reboot_report(id: &str, node: &str, vm: &str, status: EventStatus) -> Value {
    let report = Report {
        node: node.into(),
        vm: vm.into(),
        named: true,
        event_status: status,
        appearance: 1,
        event_id: id.into(),
        event_type: "Reboot".into(),
        event_source: "Platform".into(),
        resource_type: "VirtualMachine".into(),
        resources: vec![vm.into()],
        not_before: Some(Utc::now() + chrono::TimeDelta::hours(1)),
        duration_seconds: -1,
        description: "Fault test".into(),
        document_incarnation: 1,
        approvals: Vec::new(),
    };
    let name = object_name(id);
    json!({
        "apiVersion": "forewarn.dev/v1alpha1",
        "kind": "ScheduledEventReport",
        "metadata": {"name": report_name(&name, node).expect("report name")},
        "spec": {"scheduledEvent": name, "report": report},
    })
}

/// A Deployment `app` in `default` of `replicas` pause pods labelled
/// `app=<app>`, whose pod spec also has `placement` (`nodeName` or
/// `nodeSelector`).
fn deployment(app: &str, replicas: usize, placement: Value) -> Value {
    let mut spec = json!({"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]});
    if let (Some(s), Some(p)) = (spec.as_object_mut(), placement.as_object()) {
        s.extend(p.clone());
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": app, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app}}, "spec": spec},
        },
    })
}

/// Applies `doc`, a `ScheduledEventReport`, as its node's agent would
/// (server-side apply, written here by the test), after stating the
/// report's VM as the node's in its `VirtualMachineReport`, as the agent
/// does at start (the test's nodes have no providerID; the report's `vm`
/// alone is never taken as the node's).
async fn apply_report(client: &kube::Client, doc: Value) {
    use forewarn::topology::VirtualMachineReport;
    let node = doc["spec"]["report"]["node"].as_str().expect("node");
    let vm = doc["spec"]["report"]["vm"].as_str().expect("vm");
    let vm_reports = Api::<VirtualMachineReport>::all(client.clone());
    let stated = vm_reports.get_opt(node).await.expect("read the VM report");
    if stated.as_ref().map(|r| r.spec.vm.as_str()) != Some(vm) {
        // Its `vm` is kept as first written: another VM means a new report.
        if stated.is_some() {
            vm_reports
                .delete(node, &DeleteParams::default())
                .await
                .expect("delete the VM report");
        }
        vm_reports
            .patch(
                node,
                &PatchParams::apply("fault-test").force(),
                &Patch::Apply(json!({
                    "apiVersion": "forewarn.dev/v1alpha1", "kind": "VirtualMachineReport",
                    "metadata": {"name": node},
                    "spec": {"node": node, "vm": vm},
                })),
            )
            .await
            .expect("state the node's VM");
    }
    let name = doc["metadata"]["name"]
        .as_str()
        .expect("report name")
        .to_string();
    Api::<ScheduledEventReport>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply("fault-test").force(),
            &Patch::Apply(doc),
        )
        .await
        .expect("apply the report");
}

/// Whether `node` is cordoned, as the API server has it.
async fn is_cordoned(client: &kube::Client, node: &str) -> bool {
    Api::<Node>::all(client.clone())
        .get(node)
        .await
        .ok()
        .and_then(|n| n.spec?.unschedulable)
        .unwrap_or(false)
}

/// Waits until `count` pods labelled `app=<app>` in `default`, not
/// terminating, are bound to `node`.
async fn wait_for_pods(client: &kube::Client, app: &str, node: &str, count: usize) {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
    let selector = format!("app={app}");
    eventually("the pods exist", HANG, || async {
        let listed = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?;
        let live = listed
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .count();
        (live == count).then_some(())
    })
    .await;
}

/// A leader paused (SIGSTOP) while it drains a node whose pods' evictions the
/// API server keeps refusing, and resumed after the standby took the Lease over,
/// sends no write from then on: the audit log has no write with its
/// `User-Agent` received after it was resumed, while it had written before
/// the pause (so the check can fail) and the standby writes after taking
/// over. The resumed process exits, and the node is released when the event
/// ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_paused_past_its_lease_and_resumed_writes_nothing() {
    let _turn = TURN.lock().await;
    const ID: &str = "FA000000-0000-4000-8000-000000000010";
    const NODE: &str = "node-000000";
    const VM: &str = "fault_vm_0";
    const LEASE: &str = "forewarn-faults-paused";
    // In `default`, whose ServiceAccount exists from the start: in a new
    // namespace the ReplicaSet controller's pod creations fail until the
    // ServiceAccount controller made it, and its backoff outlasted 30 s in CI.
    const APP: &str = "paused-web";
    const APP_TWICE: &str = "paused-web-twice";
    let cluster = cluster();
    let client = cluster.client().await.expect("client");
    clean(&client, &[ID]).await;
    let dir = dir("paused-leader");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let _ = leases.delete(LEASE, &DeleteParams::default()).await;

    // Two pods of a Deployment on the node, each selected by two
    // PodDisruptionBudgets: both allow a disruption in the cache, so the
    // leader asks, and the API server refuses every eviction of a pod under
    // more than one budget (500): the drain is blocked and the leader keeps
    // trying. (A single budget allowing none would not do: a pod whose
    // budget the cache shows shut is not asked for.)
    let kubectl_apply = |doc: Value| kubectl_apply(&cluster, &doc);
    let _ = cluster.kubectl(&[
        "delete",
        "deployment,poddisruptionbudget",
        APP,
        APP_TWICE,
        "--ignore-not-found",
        "--wait=true",
    ]);
    kubectl_apply(deployment(APP, 2, json!({"nodeName": NODE})));
    for pdb in [APP, APP_TWICE] {
        kubectl_apply(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": pdb, "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": APP}}},
        }));
    }

    wait_for_pods(&client, APP, NODE, 2).await;
    let (mut first, _) = start_controller(&cluster, &dir, LEASE, "paused-a").await;
    let leader_of = || async {
        leases
            .get_opt(LEASE)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
    };
    eventually("paused-a leads", HANG, || async {
        (leader_of().await.as_deref() == Some("paused-a")).then_some(())
    })
    .await;
    let (mut second, _) = start_controller(&cluster, &dir, LEASE, "paused-b").await;

    // The node's own agent reports a Reboot (written here as that agent).
    let apply = |doc: Value| apply_report(&client, doc);
    apply(reboot_report(ID, NODE, VM, EventStatus::Scheduled)).await;
    let cordoned = || is_cordoned(&client, NODE);
    eventually("the node cordoned", HANG, || async {
        cordoned().await.then_some(())
    })
    .await;
    let ua_a = user_agent("controller", "paused-a");
    let ua_b = user_agent("controller", "paused-b");
    // The leader is draining: its evictions are refused (500, two budgets).
    eventually("paused-a evicting", HANG, || async {
        audit_writes(&cluster)
            .iter()
            .any(|w| w.user_agent == ua_a && w.uri.contains("/eviction"))
            .then_some(())
    })
    .await;

    first.signal("STOP").expect("SIGSTOP the leader");
    let stopped = Utc::now();
    eventually("paused-b takes over", HANG, || async {
        (leader_of().await.as_deref() == Some("paused-b")).then_some(())
    })
    .await;
    // Let the standby act (it writes: evictions, status) before resuming.
    eventually("paused-b writes", HANG, || async {
        audit_writes(&cluster)
            .iter()
            .any(|w| w.user_agent == ua_b && w.at > stopped)
            .then_some(())
    })
    .await;
    // What the old leader will find on resuming: a change to the node's
    // report (its watch delivers it at once), so that it reconciles the
    // draining event, and would evict again, the moment it runs.
    let mut changed = reboot_report(ID, NODE, VM, EventStatus::Scheduled);
    changed["spec"]["report"]["description"] =
        json!("Fault test, changed while the leader was paused");
    apply(changed).await;
    // No check follows this pause: it only lets the change wait for the
    // stopped process before it runs again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let resumed = Utc::now();
    first.signal("CONT").expect("SIGCONT the old leader");
    // It finds itself no longer leading and exits.
    let exited = eventually("the resumed process exits", HANG, || {
        let e = first.exited();
        async move { e }
    })
    .await;
    assert!(!exited.success(), "it exited with {exited}");
    // It has exited: nothing more can come from it. The pause gives the API
    // server time to log a write it would have sent before exiting (a
    // window of observation for a check that nothing came: load can only
    // hide such a write, never invent one).
    tokio::time::sleep(Duration::from_secs(3)).await;

    let writes = audit_writes(&cluster);
    let before: Vec<&Write> = writes
        .iter()
        .filter(|w| w.user_agent == ua_a && w.at < stopped)
        .collect();
    let after: Vec<&Write> = writes
        .iter()
        .filter(|w| w.user_agent == ua_a && w.at >= resumed)
        .collect();
    let by_b = writes.iter().filter(|w| w.user_agent == ua_b).count();
    println!(
        "paused-a wrote {} times before the pause, {} after its resume; paused-b {} times",
        before.len(),
        after.len(),
        by_b
    );
    assert!(
        before.len() >= 2,
        "the leader wrote nothing before the pause: the check proves nothing"
    );
    let sent: Vec<String> = after
        .iter()
        .map(|w| format!("{} {} {}", w.at, w.verb, w.uri))
        .collect();
    assert!(after.is_empty(), "the resumed old leader wrote: {sent:#?}");
    assert!(by_b > 0);
    let log = std::fs::read_to_string(&first.log).unwrap_or_default();
    assert!(log.contains("stopped acting as leader"), "{log}");

    // The event ends: the new leader releases the node.
    apply(reboot_report(ID, NODE, VM, EventStatus::Completed)).await;
    eventually("the node released", HANG, || async {
        (!cordoned().await).then_some(())
    })
    .await;
    let _ = second.terminate(STOP).await;
    clean(&client, &[ID]).await;
    let _ = cluster.kubectl(&[
        "delete",
        "deployment,poddisruptionbudget",
        APP,
        APP_TWICE,
        "--ignore-not-found",
        "--wait=false",
    ]);
}

/// An agent SIGKILLed after IMDS received its approval and before it
/// recorded it (IMDS answers the approval a minute late, the agent waits
/// that long for it, and is killed as soon as the mock logs the approval)
/// loses nothing: started again, it
/// reports the event as IMDS now lists it, the event runs to its end, and
/// the node is released. Nothing but the one approval reached IMDS from the
/// killed process.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_killed_between_sending_an_approval_and_recording_it_loses_nothing() {
    let _turn = TURN.lock().await;
    const ID: &str = "FA000000-0000-4000-8000-000000000020";
    const NODE: &str = "node-000001";
    const VM: &str = "kill_vm_1";
    const LEASE: &str = "forewarn-faults-kill";
    let cluster = cluster();
    let client = cluster.client().await.expect("client");
    clean(&client, &[ID]).await;
    let dir = dir("agent-killed-mid-approval");
    let (_mock, base) = start_mock(
        &dir,
        &format!(
            "vms: [{{name: {VM}, approvalAnswerDelay: 60s}}]\nevents:\n  - {{id: {ID}, type: Reboot, resources: [{VM}], at: 0s, notice: 10m, runFor: 6s}}\n"
        ),
    )
    .await;
    let (mut controller, _) = start_controller(&cluster, &dir, LEASE, "kill-controller").await;
    // A new agent pod states its VM afresh: the node's VirtualMachineReport
    // (owned by the agent's pod, which this test's agent has none of) left
    // by an earlier test goes first.
    let _ = Api::<forewarn::topology::VirtualMachineReport>::all(client.clone())
        .delete(NODE, &DeleteParams::default())
        .await;
    // The window between IMDS receiving the approval and the agent
    // recording it is the answer's delay (60 s), which the agent waits for
    // (its IMDS timeout is longer): this test kills it within that window
    // however loaded the machine (it does so within a second); with the
    // default 2 s timeout the agent would record a failed approval first.
    let (mut agent, port) =
        start_agent_with(&cluster, &dir, &base, NODE, VM, &["--imds-timeout", "90s"]).await;
    wait_ready(port, HANG)
        .await
        .unwrap_or_else(|e| panic!("agent not ready: {e}"));
    start_clock(&base).await;
    // The node has no pods: it is cordoned and the Reboot approved at once;
    // kill the agent the moment IMDS has the approval, long before IMDS
    // answers.
    eventually("IMDS received the approval", HANG, || async {
        mock_log(&base)
            .await
            .into_iter()
            .find(|e| e.event_id == ID && e.what == "Approved")
    })
    .await;
    agent.kill().await;
    let killed = Utc::now();
    let posts = mock_requests(&base, VM, "POST").await;
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert!(
        posts[0].answered.is_none(),
        "IMDS answered before the kill: {posts:?}"
    );
    let r = report(&client, ID, NODE).await.expect("the agent's report");
    assert!(
        r.spec.report.approvals.is_empty(),
        "recorded before the kill: {r:?}"
    );
    println!("agent killed at {killed}, its approval unanswered and unrecorded");

    let (mut agent, port) = start_agent(&cluster, &dir, &base, NODE, VM).await;
    wait_ready(port, HANG)
        .await
        .unwrap_or_else(|e| panic!("the restarted agent not ready: {e}"));
    // The event started (approved) and then left IMDS: the restarted agent
    // reports what IMDS lists, and the controller ends the event.
    let events: Api<ScheduledEvent> = Api::all(client.clone());
    eventually("the event Completed", HANG, || async {
        events
            .get_opt(&object_name(ID))
            .await
            .ok()
            .flatten()
            .and_then(|e| e.status?.phase)
            .filter(|p| matches!(p, Phase::Completed))
    })
    .await;
    // Released after the policy's release delay.
    let nodes: Api<Node> = Api::all(client.clone());
    eventually("the node released", HANG, || async {
        let node = nodes.get(NODE).await.ok()?;
        (node.spec.and_then(|s| s.unschedulable) != Some(true)).then_some(())
    })
    .await;
    let log = mock_log(&base).await;
    let approvals = log
        .iter()
        .filter(|e| e.event_id == ID && e.what == "Approved")
        .count();
    assert!(approvals >= 1, "{log:?}");
    let _ = agent.terminate(STOP).await;
    let _ = controller.terminate(STOP).await;
    clean(&client, &[ID]).await;
}

/// The write guard itself, against the real API server: a client built as
/// the controller builds its own refuses a write while its process does not
/// hold the Lease (another replica does), and the API server never sees
/// it; once the process holds the Lease, the same write goes through.
#[tokio::test(flavor = "multi_thread")]
async fn a_write_of_a_process_that_does_not_hold_the_lease_never_reaches_the_api_server() {
    use forewarn::controller::runtime::lease::{self, Leadership};
    let _turn = TURN.lock().await;
    const LEASE: &str = "forewarn-faults-guard";
    const IDENTITY: &str = "guard-test";
    let cluster = cluster();
    let client = cluster.client().await.expect("client");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "default");
    let _ = maps.delete("guard-probe", &DeleteParams::default()).await;
    // Another replica holds the Lease, renewing it.
    let _ = leases.delete(LEASE, &DeleteParams::default()).await;
    let holder = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": "default"},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 15,
                 "renewTime": Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()},
    });
    kubectl_apply(&cluster, &holder);
    // It renews every 2 s until it goes away below, so that the Lease stays
    // held however long this test takes to get there (a Lease written once
    // would expire 15 s later, and a slow run would see this process lead).
    let renewing = {
        let leases = leases.clone();
        tokio::spawn(async move {
            use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                if let Ok(mut l) = leases.get(LEASE).await {
                    if let Some(spec) = l.spec.as_mut() {
                        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
                    }
                    let _ = leases.replace(LEASE, &Default::default(), &l).await;
                }
            }
        })
    };

    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&cluster.kubeconfig).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    let config =
        forewarn::kubeclient::request_config(config, "controller", IDENTITY).expect("config");
    let election = lease::spawn(
        config.clone(),
        "default",
        LEASE,
        IDENTITY,
        lease::Timing::default(),
    )
    .expect("election");
    let guarded = kube::client::ClientBuilder::try_from(config)
        .expect("builder")
        .with_layer(&lease::WritesWhileLeading(election.validity.clone()))
        .build();
    let probe = |n: u32| -> k8s_openapi::api::core::v1::ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "guard-probe", "namespace": "default"}, "data": {"n": n.to_string()}}))
            .expect("configmap")
    };
    let guarded_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(guarded, "default");
    // A window of observation (load only lengthens it): a standby that took
    // a held Lease would be leading by then.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(*election.state.borrow(), Leadership::Standby);
    let refused = guarded_maps
        .create(&Default::default(), &probe(1))
        .await
        .expect_err("a standby's write went through");
    println!("refused: {refused}");
    assert!(refused.to_string().contains("renew deadline"), "{refused}");
    // Reads pass.
    guarded_maps
        .list(&ListParams::default())
        .await
        .expect("a standby may read");
    // Refused in this process: nothing can be on its way to the API server;
    // the pause is a window of observation.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ua = user_agent("controller", IDENTITY);
    let sent: Vec<String> = audit_writes(&cluster)
        .into_iter()
        .filter(|w| w.user_agent == ua && w.uri.contains("configmaps"))
        .map(|w| format!("{} {}", w.verb, w.uri))
        .collect();
    assert!(
        sent.is_empty(),
        "the API server saw the refused write: {sent:?}"
    );

    // The holder goes away: this process takes the Lease, and may write.
    renewing.abort();
    let _ = renewing.await;
    leases
        .delete(LEASE, &DeleteParams::default())
        .await
        .expect("free the Lease");
    let mut state = election.state.clone();
    tokio::time::timeout(HANG, state.wait_for(|l| *l == Leadership::Leading))
        .await
        .unwrap_or_else(|_| panic!("not leading within {HANG:?}"))
        .expect("election thread");
    guarded_maps
        .create(&Default::default(), &probe(2))
        .await
        .expect("the leader's write");
    // The audit log has the write once it is written (waited for, not
    // assumed after a sleep), and only that one.
    let seen = eventually("the leader's write in the audit log", HANG, || async {
        let n = audit_writes(&cluster)
            .into_iter()
            .filter(|w| w.user_agent == ua && w.uri.contains("configmaps"))
            .count();
        (n >= 1).then_some(n)
    })
    .await;
    assert_eq!(seen, 1, "the API server saw the leader's write once");
    assert!(election.release().await, "the Lease was released");
    let _ = maps.delete("guard-probe", &DeleteParams::default()).await;
}

/// A drain that the eviction rate budget makes long holds up nothing
/// else: a node whose own agent reports the event while the first node's
/// evictions wait for the budget (1 a second, 12 pods) is cordoned at the
/// next pass, not after every eviction was asked for. Judged from the audit
/// log: when the second node's cordon reached the API server, most of the
/// first node's evictions had not (every one had, when a pass asked for all
/// of them before it ended). The drain then finishes, and both nodes are
/// released when the event ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_reported_during_a_long_drain_is_cordoned_without_waiting_for_it() {
    let _turn = TURN.lock().await;
    const ID: &str = "FA000000-0000-4000-8000-000000000030";
    const FIRST: &str = "node-000002";
    const FIRST_VM: &str = "fault_vm_2";
    const LATE: &str = "node-000001";
    const LATE_VM: &str = "fault_vm_1";
    const LEASE: &str = "forewarn-faults-long-drain";
    const APP: &str = "long-drain";
    const PODS: usize = 12;
    let cluster = cluster();
    let client = cluster.client().await.expect("client");
    clean(&client, &[ID]).await;
    let dir = dir("long-drain");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let _ = leases.delete(LEASE, &DeleteParams::default()).await;
    let _ = cluster.kubectl(&[
        "delete",
        "deployment",
        APP,
        "--ignore-not-found",
        "--wait=true",
    ]);
    kubectl_apply(
        &cluster,
        // Placed by the scheduler, so that the replacements of evicted pods
        // stay Pending while the node is cordoned.
        &deployment(
            APP,
            PODS,
            json!({"nodeSelector": {"kubernetes.io/hostname": FIRST}}),
        ),
    );
    wait_for_pods(&client, APP, FIRST, PODS).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
    let selector = format!("app={APP}");
    let (mut controller, _) = start_controller_with(
        &cluster,
        &dir,
        LEASE,
        "long-drain",
        &["--eviction-qps", "1", "--eviction-burst", "1"],
    )
    .await;
    let ua = user_agent("controller", "long-drain");

    // One event naming both VMs; each node's own agent reports it (written
    // here as those agents), the second one once the first drain is going.
    let apply = |node: &str, vm: &str, status: EventStatus| {
        let mut doc = reboot_report(ID, node, vm, status);
        doc["spec"]["report"]["resources"] = json!([FIRST_VM, LATE_VM]);
        apply_report(&client, doc)
    };
    let evictions = |cluster: &Cluster| {
        audit_writes(cluster)
            .into_iter()
            .filter(|w| w.user_agent == ua && w.uri.contains("/eviction"))
            .collect::<Vec<_>>()
    };
    apply(FIRST, FIRST_VM, EventStatus::Scheduled).await;
    eventually("the first node's drain started", HANG, || async {
        (evictions(&cluster).len() >= 2).then_some(())
    })
    .await;
    apply(LATE, LATE_VM, EventStatus::Scheduled).await;
    let cordoned = |node: &'static str| is_cordoned(&client, node);
    eventually("the late node cordoned", HANG, || async {
        cordoned(LATE).await.then_some(())
    })
    .await;
    let late_cordon = audit_writes(&cluster)
        .into_iter()
        .find(|w| {
            w.user_agent == ua && w.verb == "patch" && w.uri.contains(&format!("/nodes/{LATE}"))
        })
        .expect("the late node's cordon in the audit log");
    let before = evictions(&cluster)
        .iter()
        .filter(|w| w.at < late_cordon.at)
        .count();
    println!("{before} of {PODS} evictions reached the API server before the late node's cordon");
    // Nominally two to four. A pass that asks for every eviction before it
    // ends sends all of them first; anything less shows the cordon did not
    // wait for the drain. (At one eviction a second, reaching all of them
    // otherwise takes a controller stalled for some 10 s.)
    assert!(
        before < PODS,
        "the late node was cordoned only after {before} of {PODS} evictions: the drain held it up"
    );
    // The drain goes on to the end: every pod was asked to leave.
    eventually("every pod evicted", HANG, || async {
        let listed = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?;
        listed
            .items
            .iter()
            .all(|p| {
                p.metadata.deletion_timestamp.is_some()
                    || p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(FIRST)
            })
            .then_some(())
    })
    .await;
    apply(FIRST, FIRST_VM, EventStatus::Completed).await;
    apply(LATE, LATE_VM, EventStatus::Completed).await;
    eventually("both nodes released", HANG, || async {
        (!cordoned(FIRST).await && !cordoned(LATE).await).then_some(())
    })
    .await;
    let _ = controller.terminate(STOP).await;
    clean(&client, &[ID]).await;
    let _ = cluster.kubectl(&[
        "delete",
        "deployment",
        APP,
        "--ignore-not-found",
        "--wait=false",
    ]);
}

/// `kwokctl` stops a cluster's components by SIGKILLing the pids their pid
/// files name, unchecked; a component that exited (or a cluster left by a
/// machine's earlier boot) leaves a pid the system may since have given to
/// any process, this test binary among them. Tearing a cluster down kills
/// its own components and nothing a stale pid file names.
#[tokio::test(flavor = "multi_thread")]
async fn tearing_a_cluster_down_kills_no_process_a_stale_pid_file_names() {
    let name = std::env::var("FOREWARN_FAULTS_CLUSTER").map_or_else(
        |_| "forewarn-stale-pids".into(),
        |n| format!("{n}-stale-pids"),
    );
    let cluster = Cluster::start(&name, 0).expect("the cluster starts");
    let dir = cluster
        .kubeconfig
        .parent()
        .expect("the kubeconfig has a directory")
        .to_path_buf();
    let pid_of = |component: &str| -> String {
        std::fs::read_to_string(dir.join(format!("pids/{component}.pid")))
            .unwrap_or_else(|e| panic!("no pid file of {component}: {e}"))
            .trim()
            .to_string()
    };
    // The scheduler exits; its pid goes to a process of somebody else's
    // (here a `sleep` of this test's).
    let scheduler = pid_of("kube-scheduler");
    assert!(
        std::process::Command::new("kill")
            .args(["-KILL", &scheduler])
            .status()
            .expect("kill runs")
            .success()
    );
    eventually("the scheduler has exited", HANG, || async {
        let state =
            std::fs::read_to_string(format!("/proc/{scheduler}/status")).unwrap_or_default();
        (state.is_empty()
            || state
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z')))
        .then_some(())
    })
    .await;
    let mut bystander = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("sleep starts");
    std::fs::write(
        dir.join("pids/kube-scheduler.pid"),
        bystander.id().to_string(),
    )
    .expect("the pid file is written");
    let api_server = pid_of("kube-apiserver");

    let stopped = cluster.stop();

    let alive = bystander.try_wait().expect("try_wait works").is_none();
    let _ = bystander.kill();
    let _ = bystander.wait();
    stopped.expect("hack/cluster.sh down succeeds");
    assert!(
        alive,
        "tearing the cluster down killed pid {}, which its stale kube-scheduler pid file named",
        bystander.id()
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{api_server}/cmdline")).exists()
            || !std::fs::read_to_string(format!("/proc/{api_server}/cmdline"))
                .unwrap_or_default()
                .contains(&*dir.to_string_lossy()),
        "the cluster's kube-apiserver (pid {api_server}) still runs after the teardown"
    );
    assert!(!dir.exists(), "{} is still there", dir.display());
}

/// A Reboot naming `vms`, as the agent of `node` (whose VM is `vm`)
/// reports it: `NotBefore` an hour ahead.
fn multi_reboot_report(id: &str, node: &str, vm: &str, vms: &[&str], status: EventStatus) -> Value {
    let mut doc = reboot_report(id, node, vm, status);
    doc["spec"]["report"]["resources"] = json!(vms);
    doc
}

/// A ValidatingAdmissionPolicy `name` (with its binding, denying) of
/// `rule` (a `resourceRules` entry) that refuses the requests for which
/// `refuse` (CEL) holds, with `message`; waits until the API server
/// enforces it, as `enforced` (a dry-run request that it must refuse)
/// shows.
async fn admission_policy<F, Fut>(
    cluster: &Cluster,
    name: &str,
    rule: Value,
    refuse: &str,
    message: &str,
    enforced: F,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    kubectl_apply(
        cluster,
        &forewarn_harness::audit::refusing_policy(name, rule, refuse, message),
    );
    eventually("the admission policy enforced", HANG, || async {
        enforced().await.then_some(())
    })
    .await;
}

/// Removes the admission policy `name` and its binding.
fn remove_admission_policy(cluster: &Cluster, name: &str) {
    let _ = cluster.kubectl(&[
        "delete",
        "validatingadmissionpolicybinding,validatingadmissionpolicy",
        name,
        "--ignore-not-found",
    ]);
}

/// The writes of the controller `identity` to `uri_part` in the audit log,
/// with their answers' codes, in order.
fn audit_writes_to(cluster: &Cluster, identity: &str, uri_part: &str) -> Vec<(DateTime<Utc>, u16)> {
    let ua = user_agent("controller", identity);
    let mut v: Vec<(DateTime<Utc>, u16)> = audit_writes(cluster)
        .into_iter()
        .filter(|w| w.user_agent == ua && w.uri.contains(uri_part))
        .map(|w| (w.at, w.code))
        .collect();
    v.sort();
    v
}

/// An admission policy refuses the cordon of one node of a three-node
/// Reboot: the other two are cordoned and drained at once (their pods
/// evicted, their records drained), the refused node's record says why
/// (`writeRefused`, with the policy's message), the event is not approved
/// while that node stays uncordoned (rule 2), and the refused write is
/// tried again on a growing backoff (the audit log's refused PATCHes of
/// that node come further and further apart). Once the policy is gone the
/// node is cordoned, and the event's end releases all three. With the
/// first refusal failing the whole pass, the other nodes' pods were never
/// evicted and their records never written.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_whose_cordon_is_refused_holds_back_no_other_node() {
    let _turn = TURN.lock().await;
    const ID: &str = "FA000000-0000-4000-8000-000000000030";
    const NODES3: [&str; 3] = ["node-000000", "node-000001", "node-000002"];
    const VMS: [&str; 3] = ["refused_vm_0", "refused_vm_1", "refused_vm_2"];
    const LEASE: &str = "forewarn-faults-refused";
    const POLICY: &str = "forewarn-test-refuse-cordon";
    const MESSAGE: &str = "cordons of node-000002 are refused by the test's policy";
    const APPS: [&str; 2] = ["refused-web-0", "refused-web-1"];
    let cluster = cluster();
    let client = cluster.client().await.expect("client");
    clean(&client, &[ID]).await;
    remove_admission_policy(&cluster, POLICY);
    let dir = dir("refused-cordon");
    let nodes: Api<Node> = Api::all(client.clone());
    let refused_node = NODES3[2];
    let refuse = format!(
        "object.metadata.name == '{refused_node}' && has(object.spec.unschedulable) && object.spec.unschedulable"
    );
    admission_policy(
        &cluster,
        POLICY,
        json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}),
        &refuse,
        MESSAGE,
        || async {
            nodes
                .patch(
                    refused_node,
                    &PatchParams {
                        dry_run: true,
                        ..PatchParams::default()
                    },
                    &Patch::Merge(json!({"spec": {"unschedulable": true}})),
                )
                .await
                .is_err()
        },
    )
    .await;
    // One pod on each of the first two nodes (a Deployment pinned by its
    // node selector: the replacement waits, Pending, while the node is
    // cordoned).
    for (app, node) in APPS.iter().zip(NODES3) {
        kubectl_apply(
            &cluster,
            &deployment(
                app,
                1,
                json!({"nodeSelector": {"kubernetes.io/hostname": node}}),
            ),
        );
        wait_for_pods(&client, app, node, 1).await;
    }
    let (mut controller, _) = start_controller(&cluster, &dir, LEASE, "refused-controller").await;
    for (node, vm) in NODES3.iter().zip(VMS) {
        apply_report(
            &client,
            multi_reboot_report(ID, node, vm, &VMS, EventStatus::Scheduled),
        )
        .await;
    }
    let events: Api<ScheduledEvent> = Api::all(client.clone());
    let record = |node: &'static str| {
        let events = events.clone();
        async move {
            let ev = events.get_opt(&object_name(ID)).await.ok().flatten()?;
            ev.status?.nodes?.into_iter().find(|r| r.name == node)
        }
    };
    for node in &NODES3[..2] {
        eventually("the other nodes cordoned and drained", HANG, || async {
            record(node).await.filter(|r| r.drained_at.is_some())
        })
        .await;
        assert!(is_cordoned(&client, node).await, "{node} not cordoned");
        // Every write of the controller's names its field manager: the API
        // server records none under the name it makes from the User-Agent.
        let managers: Vec<String> = nodes
            .get(node)
            .await
            .expect("the node")
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.manager)
            .collect();
        assert!(
            managers
                .iter()
                .any(|m| m == forewarn::api::CONTROLLER_MANAGER),
            "{node}: {managers:?}"
        );
        assert!(
            !managers.iter().any(|m| m == "forewarn"),
            "{node}: a write without a field manager: {managers:?}"
        );
    }
    let why = eventually("the refused node's record says why", HANG, || async {
        record(refused_node).await.and_then(|r| r.write_refused)
    })
    .await;
    assert!(why.contains(MESSAGE), "{why}");
    assert!(!is_cordoned(&client, refused_node).await);
    // Not approved while a node it affects is not cordoned.
    let ev = events.get(&object_name(ID)).await.expect("the event");
    let st = ev.status.expect("status");
    assert!(
        st.approval.as_ref().is_none_or(|a| a.decided_at.is_none()),
        "approved with {refused_node} uncordoned: {:?}",
        st.approval
    );
    assert_eq!(st.phase, Some(Phase::Draining));
    // Tried again, further and further apart: at least four refusals.
    let refused = eventually("four refused writes of the node", HANG, || async {
        let w: Vec<_> = audit_writes_to(
            &cluster,
            "refused-controller",
            &format!("/nodes/{refused_node}"),
        )
        .into_iter()
        .filter(|(_, code)| *code >= 400)
        .collect();
        (w.len() >= 4).then_some(w)
    })
    .await;
    let gaps: Vec<i64> = refused
        .windows(2)
        .map(|w| (w[1].0 - w[0].0).num_milliseconds())
        .collect();
    println!("refused writes of {refused_node}, ms apart: {gaps:?}");
    assert!(
        gaps[2] > gaps[0] && gaps[2] >= 3_000,
        "the refused node is not retried on a growing backoff: {gaps:?}"
    );
    // Its own backoff, not the event's: the pass went on and evicted the
    // other nodes' pods.
    let evictions = audit_writes_to(&cluster, "refused-controller", "/eviction");
    assert!(evictions.len() >= 2, "{evictions:?}");

    // The policy goes: the node is cordoned at its next try.
    remove_admission_policy(&cluster, POLICY);
    eventually("the refused node cordoned once allowed", HANG, || async {
        is_cordoned(&client, refused_node).await.then_some(())
    })
    .await;
    eventually("its record cleared", HANG, || async {
        record(refused_node)
            .await
            .filter(|r| r.write_refused.is_none())
    })
    .await;
    // The event ends: every node released.
    for (node, vm) in NODES3.iter().zip(VMS) {
        apply_report(
            &client,
            multi_reboot_report(ID, node, vm, &VMS, EventStatus::Completed),
        )
        .await;
    }
    for node in NODES3 {
        eventually("every node released", HANG, || async {
            (!is_cordoned(&client, node).await).then_some(())
        })
        .await;
    }
    let _ = controller.terminate(STOP).await;
    clean(&client, &[ID]).await;
    for app in APPS {
        let _ = cluster.kubectl(&[
            "delete",
            "deployment",
            app,
            "--ignore-not-found",
            "--wait=false",
        ]);
    }
}

/// An admission policy refuses every eviction in one namespace: the
/// drain asks for that pod on a growing backoff of its own (the audit log
/// has a few refused evictions of it over half a minute, not one every
/// drain poll), the node's record says why, and the pod of another
/// namespace on the same node is evicted at once. With every failure asked
/// again at each drain poll, the bound on the asks fails.
#[tokio::test(flavor = "multi_thread")]
async fn an_eviction_an_admission_policy_refuses_is_asked_again_on_a_backoff() {
    let _turn = TURN.lock().await;
    const ID: &str = "FA000000-0000-4000-8000-000000000040";
    const NODE: &str = "node-000001";
    const VM: &str = "denied_vm_1";
    const LEASE: &str = "forewarn-faults-denied";
    const POLICY: &str = "forewarn-test-refuse-evictions";
    const NS: &str = "evictions-refused";
    const MESSAGE: &str = "evictions in this namespace are refused by the test's policy";
    let cluster = cluster();
    let client = cluster.client().await.expect("client");
    clean(&client, &[ID]).await;
    remove_admission_policy(&cluster, POLICY);
    let dir = dir("refused-evictions");
    let _ = cluster.kubectl(&["create", "namespace", NS]);
    // A bare pod in the namespace (evicted whatever its controller; the
    // test's policy evicts pods without a controller for Reboot) and a
    // Deployment's pod in `default`, both on the node.
    let pod = |ns: &str, name: &str| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        })
    };
    // The ServiceAccount controller makes the namespace's default account
    // a moment after the namespace: the pod's creation waits for it.
    let pods_in_ns: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    let _ = pods_in_ns
        .delete("denied", &DeleteParams::default().grace_period(0))
        .await;
    eventually("the denied pod created", HANG, || async {
        let doc = serde_json::from_value(pod(NS, "denied")).expect("a pod");
        match pods_in_ns
            .create(&kube::api::PostParams::default(), &doc)
            .await
        {
            Ok(_) => Some(()),
            Err(kube::Error::Api(s)) if s.code == 409 => None,
            Err(_) => None,
        }
    })
    .await;
    kubectl_apply(
        &cluster,
        &deployment(
            "allowed-web",
            1,
            json!({"nodeSelector": {"kubernetes.io/hostname": NODE}}),
        ),
    );
    wait_for_pods(&client, "allowed-web", NODE, 1).await;
    admission_policy(
        &cluster,
        POLICY,
        json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/eviction"]}),
        &format!("request.namespace == '{NS}'"),
        MESSAGE,
        || async {
            // A dry-run eviction of the pod is refused once enforced.
            pods_in_ns
                .create_subresource::<_, Value>(
                    "eviction",
                    "denied",
                    &kube::api::PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    &json!({
                        "apiVersion": "policy/v1", "kind": "Eviction",
                        "metadata": {"name": "denied", "namespace": NS},
                    }),
                )
                .await
                .is_err()
        },
    )
    .await;
    let policy_file = dir.join("policy.yaml");
    std::fs::write(&policy_file, "evictUnmanagedPods: [Reboot]\n").expect("policy");
    let (mut controller, _) = start_controller_with(
        &cluster,
        &dir,
        LEASE,
        "denied-controller",
        &["--policy-file", policy_file.to_str().expect("path")],
    )
    .await;
    apply_report(&client, reboot_report(ID, NODE, VM, EventStatus::Scheduled)).await;
    let events: Api<ScheduledEvent> = Api::all(client.clone());
    let denied_uri = format!("/namespaces/{NS}/pods/denied/eviction");
    let first = eventually("a refused eviction of the pod", HANG, || async {
        audit_writes_to(&cluster, "denied-controller", &denied_uri)
            .first()
            .map(|(at, _)| *at)
    })
    .await;
    // The other namespace's pod is evicted.
    let allowed = eventually("the allowed pod evicted", HANG, || async {
        let w = audit_writes_to(&cluster, "denied-controller", "/namespaces/default/pods/");
        w.iter().any(|(_, code)| *code < 300).then_some(w)
    })
    .await;
    assert!(!allowed.is_empty());
    tokio::time::sleep(Duration::from_secs(30)).await;
    let denied = audit_writes_to(&cluster, "denied-controller", &denied_uri);
    let in_window = denied
        .iter()
        .filter(|(at, _)| *at <= first + chrono::TimeDelta::seconds(30))
        .count();
    println!(
        "refused evictions of the pod: {} in all, {in_window} in the 30 s from the first",
        denied.len()
    );
    // A ValidatingAdmissionPolicy's denial is 422 Invalid (a webhook's is
    // 403): refused by admission, never by a budget (429).
    assert!(
        denied
            .iter()
            .all(|(_, code)| (400..500).contains(code) && *code != 429),
        "{denied:?}"
    );
    assert!(
        in_window <= 6,
        "the refused pod was asked {in_window} times in 30 s: {denied:?}"
    );
    let why = eventually("the node's record says why", HANG, || async {
        let ev = events.get_opt(&object_name(ID)).await.ok().flatten()?;
        let r = ev.status?.nodes?.into_iter().find(|r| r.name == NODE)?;
        r.blocked_by.filter(|b| b.contains(MESSAGE))
    })
    .await;
    println!("blocked by: {why}");
    remove_admission_policy(&cluster, POLICY);
    apply_report(&client, reboot_report(ID, NODE, VM, EventStatus::Completed)).await;
    eventually("the node released", HANG, || async {
        (!is_cordoned(&client, NODE).await).then_some(())
    })
    .await;
    let _ = controller.terminate(STOP).await;
    clean(&client, &[ID]).await;
    let _ = cluster.kubectl(&["delete", "namespace", NS, "--wait=false"]);
    let _ = cluster.kubectl(&[
        "delete",
        "deployment",
        "allowed-web",
        "--ignore-not-found",
        "--wait=false",
    ]);
}
