//! The chart installed on a local cluster and forewarn run with the chart's
//! own credentials, for the tests of the trust model (`tests/adversary.rs`):
//! kubectl and helm with the cluster's admin kubeconfig, TokenRequest tokens
//! of the chart's ServiceAccounts (an agent's bound to the chart's agent pod
//! on its node, so that it carries the node claim the admission policy
//! reads), and a [`Rig`]: the IMDS mock, real agents and a real controller
//! (the harness's [`Fleet`]) with those tokens, an attacker's client with a
//! node's agent token, watches of nodes, and a PodDisruptionBudget-guarded
//! workload whose eviction is refused.
//!
//! The first part (up to [`install_with`], [`agent_pod_on`]) is the same as
//! the helpers of `tests/chart/`.
#![allow(dead_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use forewarn::api::{AGENT_MANAGER, ScheduledEvent, ScheduledEventReport};
use forewarn::imds::mock::LogEntry;
use forewarn_harness::cluster::{Cluster, client_for, helm_bin};
use forewarn_harness::procs::{Credentials, Fleet, FleetOptions};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::Value;

pub const NS: &str = "forewarn";
pub const RELEASE: &str = "forewarn";
pub const AGENT_SA: &str = "forewarn-agent";
pub const CONTROLLER_SA: &str = "forewarn-controller";
/// The chart's ValidatingAdmissionPolicy (and its binding, same name) by
/// which an agent writes only its own node's reports.
pub const AGENT_POLICY: &str = "forewarn-agent-reports";
/// The controller's Lease, as the chart names it.
pub const LEASE: &str = "forewarn-controller";
/// The annotation naming the events forewarn holds a node for.
pub const CORDONED_FOR: &str = forewarn::api::CORDONED_FOR_ANNOTATION;

// ---------------------------------------------------------------------------
// Tools (as in tests/chart/main.rs)

/// What a command printed, and whether it succeeded.
#[derive(Debug)]
pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(bin: &Path, args: &[&str], env: &[(&str, &Path)], stdin: Option<&str>) -> Out {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("failed to start {}: {e}", bin.display()));
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(text.as_bytes())
            .expect("failed to write stdin");
    }
    let out = child.wait_with_output().expect("failed to wait");
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Files of these tests, in the target directory of the build that runs
/// them (`CARGO_TARGET_DIR` included), one directory per test binary.
pub fn out_dir() -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-test", env!("CARGO_CRATE_NAME")));
    std::fs::create_dir_all(&dir).expect("the tests' directory");
    dir
}

/// Runs helm with its caches and config inside target/, never in ~.
pub fn helm(args: &[&str]) -> Out {
    let home = out_dir().join("helm-home");
    std::fs::create_dir_all(&home).expect("helm home");
    let env: Vec<(&str, PathBuf)> = vec![
        ("HELM_CACHE_HOME", home.join("cache")),
        ("HELM_CONFIG_HOME", home.join("config")),
        ("HELM_DATA_HOME", home.join("data")),
    ];
    let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
    run(&helm_bin(), args, &env, None)
}

/// The chart of this checkout (the test crate's own, not the harness's
/// `repo_root`, which a target directory shared between checkouts may have
/// built from another).
pub fn chart_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("charts/forewarn")
        .to_string_lossy()
        .into_owned()
}

/// kubectl with a given kubeconfig.
#[derive(Clone)]
pub struct Kubectl {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let cache = self.bin.join("../kubectl-cache");
        run(
            &self.bin,
            args,
            &[
                ("KUBECONFIG", self.kubeconfig.as_path()),
                ("KUBECACHEDIR", cache.as_path()),
            ],
            stdin,
        )
    }

    /// Runs and panics on failure; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, None);
        assert!(out.ok, "kubectl {args:?} failed: {}", out.stderr.trim());
        out.stdout
    }

    pub fn ok_stdin(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run(args, Some(stdin));
        assert!(out.ok, "kubectl {args:?} failed: {}", out.stderr.trim());
        out.stdout
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ok(&a)).expect("kubectl printed JSON")
    }
}

/// The turn of a test that runs a cluster: one at a time.
pub fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

/// One cluster `name` of `nodes` KWOK nodes for the whole test binary; the
/// tests that use it take turns.
pub fn cluster(name: &str, nodes: usize) -> (MutexGuard<'static, ()>, Cluster) {
    static STARTED: OnceLock<Result<Cluster, String>> = OnceLock::new();
    let turn = turn();
    let cluster = STARTED
        .get_or_init(|| Cluster::start(name, nodes).map_err(|e| format!("{e:#}")))
        .clone()
        .unwrap_or_else(|e| panic!("the local cluster could not start: {e}"));
    (turn, cluster)
}

pub fn admin(c: &Cluster) -> Kubectl {
    Kubectl {
        bin: c.kubectl_path(),
        kubeconfig: c.kubeconfig.clone(),
    }
}

/// Polls `check` every 250 ms until it returns `Some` or `within` passes.
pub fn eventually<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The namespace the README tells users to create: the agent needs
/// hostNetwork, which Pod Security "baseline" forbids.
pub fn ensure_namespace(k: &Kubectl, name: &str, level: &str) {
    k.ok_stdin(
        &["apply", "--server-side", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n    pod-security.kubernetes.io/enforce: {level}\n"
        ),
    );
}

/// The API server's address and CA, from the admin kubeconfig.
pub fn server_and_ca(k: &Kubectl) -> (String, String) {
    let cfg = k.json(&["config", "view", "--raw", "--minify", "--flatten"]);
    let cluster = &cfg["clusters"][0]["cluster"];
    (
        cluster["server"].as_str().expect("server").to_string(),
        cluster["certificate-authority-data"]
            .as_str()
            .expect("certificate-authority-data")
            .to_string(),
    )
}

/// A kubeconfig that authenticates with `token` only.
pub fn token_kubeconfig(admin: &Kubectl, name: &str, token: &str) -> Kubectl {
    let (server, ca) = server_and_ca(admin);
    let path = out_dir().join(format!("{name}.kubeconfig"));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context:\n    cluster: local\n    user: {name}\n    namespace: {NS}\n\
         current-context: {name}\n"
    );
    std::fs::write(&path, text).expect("write kubeconfig");
    Kubectl {
        bin: admin.bin.clone(),
        kubeconfig: path,
    }
}

/// A TokenRequest token of `sa`, bound to `pod` when given.
pub fn token(k: &Kubectl, sa: &str, pod: Option<(&str, &str)>) -> String {
    let mut args = vec!["create", "token", sa, "-n", NS, "--duration", "1h"];
    if let Some((name, uid)) = pod {
        args.extend_from_slice(&[
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            name,
            "--bound-object-uid",
            uid,
        ]);
    }
    k.ok(&args).trim().to_string()
}

/// Installs (or upgrades) the release with default values and `extra`
/// arguments (e.g. `--set`), and waits for it. Without the CRD hook Job:
/// KWOK fakes pods, so the Job would claim an apply that never happened
/// (see tests/chart/on_cluster.rs).
pub fn install_with(k: &Kubectl, c: &Cluster, extra: &[&str]) {
    ensure_namespace(k, NS, "privileged");
    let chart = chart_dir();
    let kubeconfig = c.kubeconfig.to_string_lossy().into_owned();
    let mut args = vec![
        "upgrade",
        "--install",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--kubeconfig",
        &kubeconfig,
        "--set",
        "crds.upgradeJob.enabled=false",
        "--wait",
        "--timeout",
        "180s",
    ];
    args.extend_from_slice(extra);
    let out = helm(&args);
    assert!(out.ok, "helm install failed:\n{}{}", out.stdout, out.stderr);
}

/// The agent pod the DaemonSet put on `node`: (name, uid).
pub fn agent_pod_on(k: &Kubectl, node: &str) -> (String, String) {
    let pods = k.json(&[
        "get",
        "pods",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/component=agent",
        "--field-selector",
        &format!("spec.nodeName={node}"),
    ]);
    let p = &pods["items"][0];
    (
        p["metadata"]["name"]
            .as_str()
            .expect("agent pod on the node")
            .to_string(),
        p["metadata"]["uid"].as_str().expect("uid").to_string(),
    )
}

/// A kubeconfig with a token of the chart's agent ServiceAccount bound to
/// the chart's agent pod on `node`: what the agent of that node holds.
pub fn agent_kubeconfig(k: &Kubectl, node: &str, name: &str) -> Kubectl {
    let (pod, uid) = agent_pod_on(k, node);
    token_kubeconfig(k, name, &token(k, AGENT_SA, Some((&pod, &uid))))
}

// ---------------------------------------------------------------------------
// The processes: mock, agents and controller with the chart's credentials

/// An event of the IMDS mock's scenario (see `forewarn::imds::scenario`):
/// shown from the scenario's start (`POST /mock/start`), `NotBefore`
/// `notice` later.
pub struct MockEvent<'a> {
    pub id: &'a str,
    pub event_type: &'a str,
    pub resources: Vec<String>,
    /// `NotBefore` minus appearance, in seconds.
    pub notice: u64,
    /// `deliverTo: resources` (only the named VMs see it) instead of every
    /// VM of the scenario.
    pub only_named: bool,
}

/// One test's processes: the IMDS mock (held until [`Rig::start_clock`]),
/// the controller (the controller's token, `--agent-policy`, the chart's
/// Lease) and a real agent for each `(node, vm)` given (a token bound to
/// the chart's agent pod on that node), with the admin's client and kubectl.
pub struct Rig {
    pub name: String,
    pub rt: tokio::runtime::Runtime,
    pub fleet: Option<Fleet>,
    pub k: Kubectl,
    pub client: Client,
    pub http: reqwest::Client,
    pub dir: PathBuf,
}

impl Rig {
    /// Deletes every `ScheduledEvent`, report and the Lease, gives `nodes`
    /// back their schedulability (no cordon, taint or annotation of
    /// forewarn), then starts the processes of `agents` for `events`.
    pub fn start(
        c: &Cluster,
        name: &str,
        nodes: &[String],
        agents: &[(String, String)],
        events: &[MockEvent<'_>],
    ) -> Rig {
        let k = admin(c);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let client = rt.block_on(c.client()).expect("admin client");
        let dir = out_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("log dir");

        rt.block_on(delete_all::<ScheduledEvent>(&client));
        rt.block_on(delete_all::<ScheduledEventReport>(&client));
        k.run(
            &["delete", "lease", "-n", NS, LEASE, "--ignore-not-found"],
            None,
        );
        for n in nodes {
            reset_node(&k, n);
        }

        let mut creds = Credentials {
            controller: token_kubeconfig(
                &k,
                &format!("{name}-controller"),
                &token(&k, CONTROLLER_SA, None),
            )
            .kubeconfig,
            agents: Default::default(),
            lease_namespace: NS.into(),
            lease_name: LEASE.into(),
        };
        for (node, _) in agents {
            creds.agents.insert(
                node.clone(),
                agent_kubeconfig(&k, node, &format!("{name}-agent-{node}")).kubeconfig,
            );
        }
        let scenario = dir.join("scenario.yaml");
        std::fs::write(&scenario, scenario_yaml(agents, events)).expect("scenario");
        let fleet = rt.block_on(async {
            let fleet = Fleet::start(FleetOptions {
                credentials: Some(creds),
                ..FleetOptions::new(
                    Path::new(env!("CARGO_BIN_EXE_forewarn")),
                    &[
                        ("RUST_LOG", "info,kube=warn,tower=warn,hyper=warn"),
                        // As the chart runs the controller (--agent-policy).
                        ("FOREWARN_AGENT_POLICY", AGENT_POLICY),
                    ],
                    &dir,
                    &scenario,
                    "127.0.0.1:0",
                    LEASE,
                    agents,
                )
            })
            .await
            .unwrap_or_else(|e| panic!("{name}: the processes did not start: {e:#}"));
            if let Err(e) = fleet.wait_ready(Duration::from_secs(90)).await {
                panic!("{name}: {e:#}");
            }
            fleet
        });
        let rig = Rig {
            name: name.into(),
            rt,
            fleet: Some(fleet),
            k,
            client,
            http: forewarn::http::client_builder()
                .no_proxy()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("http client"),
            dir,
        };
        eventually("the controller leads", Duration::from_secs(60), || {
            rig.controller_log()
                .contains("Leading: reconciling")
                .then_some(())
        });
        rig
    }

    pub fn fleet(&self) -> &Fleet {
        self.fleet.as_ref().expect("running")
    }

    pub fn controller_log(&self) -> String {
        std::fs::read_to_string(&self.fleet().controller.log).unwrap_or_default()
    }

    /// Starts the mock's clock: its events appear in the documents.
    pub fn start_clock(&self) -> DateTime<Utc> {
        let at = Utc::now();
        self.rt
            .block_on(self.fleet().start_mock(&self.http))
            .expect("the mock's clock starts");
        at
    }

    /// The mock's log (`GET /mock/log`).
    pub fn mock_log(&self) -> Vec<LogEntry> {
        self.rt
            .block_on(self.fleet().mock_log(&self.http))
            .expect("the mock's log")
    }

    /// The approvals (`StartRequests` POSTs) IMDS received for `id`.
    pub fn approvals(&self, id: &str) -> Vec<LogEntry> {
        self.mock_log()
            .into_iter()
            .filter(|e| e.what == "Approved" && e.event_id.eq_ignore_ascii_case(id))
            .collect()
    }

    /// Stops (SIGKILL) the agent of `node`.
    pub fn kill_agent(&mut self, node: &str) {
        let fleet = self.fleet.as_mut().expect("running");
        self.rt.block_on(fleet.kill_agent(node));
    }

    /// Starts the agent of `node` again after [`Rig::kill_agent`].
    pub fn start_agent(&mut self, node: &str) {
        let fleet = self.fleet.as_mut().expect("running");
        self.rt
            .block_on(fleet.start_agent(node))
            .expect("the agent starts again");
    }

    /// Stops (SIGKILL) the controller; it stays down until
    /// [`Rig::start_controller`].
    pub fn kill_controller(&mut self) {
        let fleet = self.fleet.as_mut().expect("running");
        self.rt.block_on(fleet.controller.kill());
    }

    /// Starts the controller again after [`Rig::kill_controller`], as its
    /// kubelet restarts the container (the same Lease identity, so it leads
    /// again at once), and waits until it leads (120 s: a hang bound, a
    /// start takes seconds even on a loaded machine).
    pub fn start_controller(&mut self) {
        let fleet = self.fleet.as_mut().expect("running");
        self.rt
            .block_on(fleet.restart_controller_container())
            .expect("the controller starts again");
        eventually(
            "the controller leads again",
            Duration::from_secs(120),
            || {
                self.controller_log()
                    .contains("Leading: reconciling")
                    .then_some(())
            },
        );
    }

    /// The controller's `/metrics` text.
    pub fn controller_metrics(&self) -> String {
        let (_, port) = self.fleet().metrics_ports()[0].clone();
        self.rt.block_on(async {
            self.http
                .get(format!("http://127.0.0.1:{port}/metrics"))
                .send()
                .await
                .expect("the controller's /metrics")
                .text()
                .await
                .expect("metrics text")
        })
    }

    /// The node `name`.
    pub fn node(&self, name: &str) -> Node {
        let api: Api<Node> = Api::all(self.client.clone());
        self.rt.block_on(api.get(name)).expect("get node")
    }

    /// Whether the pod `pod` of [`WORK_NS`] runs on `node` (not deleted).
    pub fn guard_runs(&self, node: &str, pod: &str) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), WORK_NS);
        let Some(p) = self.rt.block_on(api.get_opt(pod)).expect("get pod") else {
            return false;
        };
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
            && p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    }

    /// Whether `node` is cordoned.
    pub fn unschedulable(&self, node: &str) -> bool {
        unschedulable(&self.node(node))
    }

    /// The `ScheduledEvent` `name`, if any.
    pub fn event(&self, name: &str) -> Option<ScheduledEvent> {
        let api: Api<ScheduledEvent> = Api::all(self.client.clone());
        self.rt.block_on(api.get_opt(name)).expect("get event")
    }

    /// Every `ScheduledEvent`.
    pub fn events(&self) -> Vec<ScheduledEvent> {
        let api: Api<ScheduledEvent> = Api::all(self.client.clone());
        self.rt
            .block_on(api.list(&ListParams::default()))
            .expect("list events")
            .items
    }

    /// The report `name`, if any.
    pub fn report(&self, name: &str) -> Option<ScheduledEventReport> {
        let api: Api<ScheduledEventReport> = Api::all(self.client.clone());
        self.rt.block_on(api.get_opt(name)).expect("get report")
    }

    /// A client with the token of the chart's agent pod on `node`: what an
    /// attacker who took that node holds.
    pub fn attacker(&self, node: &str) -> Attacker {
        let kc = agent_kubeconfig(&self.k, node, &format!("{}-attacker-{node}", self.name));
        let client = self
            .rt
            .block_on(client_for(&kc.kubeconfig))
            .expect("attacker client");
        Attacker {
            node: node.into(),
            client,
        }
    }

    /// Writes `obj` (a `ScheduledEventReport`) as `who`, as the agent
    /// writes its reports (server-side apply, the agent's field manager).
    pub fn write(&self, who: &Attacker, obj: &Value) -> Result<(), String> {
        self.rt.block_on(who.apply_report(obj))
    }

    /// Writes `objs` as `who`, `parallel` requests at a time; the refusals.
    pub fn write_all(&self, who: &Attacker, objs: &[Value], parallel: usize) -> Vec<String> {
        use futures::StreamExt as _;
        self.rt.block_on(async {
            futures::stream::iter(objs.iter().map(|o| who.apply_report(o)))
                .buffer_unordered(parallel)
                .filter_map(|r| async move { r.err() })
                .collect::<Vec<_>>()
                .await
        })
    }

    /// Starts recording every state of `node` (cordon and the events
    /// forewarn holds it for), from now.
    pub fn watch_node(&self, node: &str) -> NodeWatch {
        let seen: Arc<Mutex<Vec<NodeState>>> = Arc::default();
        let api: Api<Node> = Api::all(self.client.clone());
        let record = seen.clone();
        let name = node.to_string();
        let task = self.rt.spawn(async move {
            use futures::StreamExt as _;
            use kube::runtime::watcher;
            let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let mut stream = std::pin::pin!(watcher::watcher(api, config));
            while let Some(ev) = stream.next().await {
                let nodes = match ev {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => vec![n],
                    _ => continue,
                };
                let mut seen = record.lock().unwrap_or_else(|p| p.into_inner());
                for n in nodes {
                    seen.push(NodeState {
                        at: Utc::now(),
                        unschedulable: unschedulable(&n),
                        held_for: held_for(&n),
                    });
                }
            }
        });
        NodeWatch {
            node: node.into(),
            seen,
            task,
        }
    }

    /// Starts recording, from now, the order in which objects of kind `K`
    /// are created, as the API server stored them: each name with the
    /// resourceVersion of the first state the watch delivered (for an
    /// object created after the watch started, its creation's). The
    /// resourceVersions of one etcd are one sequence, so two kinds' records
    /// can be compared.
    pub fn watch_creations<K>(&self) -> CreationWatch
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + Send
            + 'static,
    {
        let seen: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
        let api: Api<K> = Api::all(self.client.clone());
        let record = seen.clone();
        let task = self.rt.spawn(async move {
            use futures::StreamExt as _;
            use kube::runtime::watcher;
            let mut stream = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
            while let Some(ev) = stream.next().await {
                let obj = match ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                    _ => continue,
                };
                let meta = obj.meta();
                let (Some(name), Some(rv)) = (
                    meta.name.clone(),
                    meta.resource_version
                        .as_deref()
                        .and_then(|v| v.parse().ok()),
                ) else {
                    continue;
                };
                let mut seen = record.lock().unwrap_or_else(|p| p.into_inner());
                if !seen.iter().any(|(n, _)| *n == name) {
                    seen.push((name, rv));
                }
            }
        });
        CreationWatch { seen, task }
    }

    /// Stops the processes (SIGTERM, so that the controller gives up its
    /// Lease).
    pub fn stop(&mut self) {
        if let Some(mut fleet) = self.fleet.take() {
            self.rt.block_on(async {
                for p in fleet.all_mut() {
                    let _ = p.terminate(Duration::from_secs(10)).await;
                }
            });
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Deletes every object of kind `K` (one collection delete: a flood's
/// thousand reports one by one would take kubectl minutes) and waits until
/// none is left.
async fn delete_all<K>(client: &Client)
where
    K: kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let kind = K::kind(&());
    api.delete_collection(&kube::api::DeleteParams::default(), &ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete every {kind}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = api
            .list_metadata(&ListParams::default().limit(1))
            .await
            .unwrap_or_else(|e| panic!("list {kind}: {e}"));
        if left.items.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{kind}s left 60 s after their deletion"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The mock's scenario: the VMs of `agents` and `events`.
fn scenario_yaml(agents: &[(String, String)], events: &[MockEvent<'_>]) -> String {
    let mut s = String::from("description: adversary suite\nvms:\n");
    for (node, vm) in agents {
        s += &format!("  - name: {vm}\n    node: {node}\n");
    }
    if agents.is_empty() {
        // A scenario needs a VM; no agent reads this one.
        s += "  - name: unread-vm\n";
    }
    if events.is_empty() {
        s += "events: []\n";
    } else {
        s += "events:\n";
    }
    for e in events {
        s += &format!(
            "  - id: {}\n    type: {}\n    resources: [{}]\n    at: 0s\n    notice: {}s\n    runFor: 5s\n    deliverTo: {}\n",
            e.id,
            e.event_type,
            e.resources.join(", "),
            e.notice,
            if e.only_named { "resources" } else { "all" }
        );
    }
    s
}

/// A client with one node's agent token.
pub struct Attacker {
    pub node: String,
    pub client: Client,
}

impl Attacker {
    async fn apply_report(&self, obj: &Value) -> Result<(), String> {
        let api: Api<ScheduledEventReport> = Api::all(self.client.clone());
        let name = obj["metadata"]["name"].as_str().expect("a named report");
        api.patch(
            name,
            &PatchParams::apply(AGENT_MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await
        .map(|_| ())
        .map_err(refusal)
    }

    /// Writes this node's `VirtualMachineReport` stating `vm`, as its
    /// agent does at start.
    pub fn state_vm(&self, rt: &tokio::runtime::Runtime, vm: &str) -> Result<(), String> {
        let api: Api<forewarn::topology::VirtualMachineReport> = Api::all(self.client.clone());
        let obj = serde_json::json!({
            "apiVersion": "forewarn.dev/v1alpha1",
            "kind": "VirtualMachineReport",
            "metadata": {"name": self.node},
            "spec": {"node": self.node, "vm": vm, "platformFaultDomain": "0", "platformUpdateDomain": "0"},
        });
        rt.block_on(api.patch(
            &self.node,
            &PatchParams::apply(AGENT_MANAGER).force(),
            &Patch::Apply(&obj),
        ))
        .map(|_| ())
        .map_err(refusal)
    }
}

/// An API error as the server gave it.
pub fn refusal(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({}): {}", s.reason, s.code, s.message),
        e => e.to_string(),
    }
}

/// The creations of one kind since [`Rig::watch_creations`].
pub struct CreationWatch {
    seen: Arc<Mutex<Vec<(String, u64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CreationWatch {
    /// The resourceVersion at which `name` was first seen, if it was.
    pub fn created(&self, name: &str) -> Option<u64> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter().find(|(n, _)| n == name).map(|(_, rv)| *rv)
    }

    /// Every name seen, with its first resourceVersion.
    pub fn all(&self) -> Vec<(String, u64)> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for CreationWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One state of a watched node.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub at: DateTime<Utc>,
    pub unschedulable: bool,
    /// The events forewarn holds it for (its annotation).
    pub held_for: Vec<String>,
}

/// The states of a node since [`Rig::watch_node`].
pub struct NodeWatch {
    pub node: String,
    seen: Arc<Mutex<Vec<NodeState>>>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeWatch {
    pub fn states(&self) -> Vec<NodeState> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many times it went from schedulable to cordoned (a cordon in
    /// force when the watch started counts as one).
    pub fn cordons(&self) -> usize {
        let mut was = false;
        let mut n = 0;
        for s in self.states() {
            if s.unschedulable && !was {
                n += 1;
            }
            was = s.unschedulable;
        }
        n
    }

    /// The first state in which forewarn held it for `event`, if any.
    pub fn held_for(&self, event: &str) -> Option<NodeState> {
        self.states()
            .into_iter()
            .find(|s| s.held_for.iter().any(|e| e == event))
    }
}

impl Drop for NodeWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn unschedulable(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// The events forewarn holds `n` for, from its annotation (a list of
/// names, separated by commas).
pub fn held_for(n: &Node) -> Vec<String> {
    n.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDONED_FOR))
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// Gives `node` back as forewarn found it: schedulable, without its taint
/// and annotation.
pub fn reset_node(k: &Kubectl, node: &str) {
    let n = k.json(&["get", "node", node]);
    let taints: Vec<Value> = n["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["key"] != forewarn::controller::act::cordon::TAINT_KEY)
        .cloned()
        .collect();
    let patch = serde_json::json!({
        "metadata": {"annotations": {CORDONED_FOR: null}},
        "spec": {"unschedulable": null, "taints": taints},
    });
    k.ok(&[
        "patch",
        "node",
        node,
        "--type=merge",
        "-p",
        &patch.to_string(),
    ]);
}

// ---------------------------------------------------------------------------
// A workload whose eviction is refused

/// The namespace of the guarded workloads.
pub const WORK_NS: &str = "adversary-work";

/// A Deployment of one pod on `node` with a PodDisruptionBudget that allows
/// no disruption, so that forewarn's drain of `node` cannot end while it
/// stands: a node released while its pod runs was released before it was
/// drained. Returns the pod's name once it runs and the budget says so.
pub fn guard(k: &Kubectl, node: &str) -> String {
    ensure_namespace(k, WORK_NS, "baseline");
    let name = format!("guard-{node}");
    k.ok_stdin(
        &["apply", "--server-side", "-f", "-"],
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {WORK_NS}\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      nodeSelector: {{kubernetes.io/hostname: {node}}}\n      containers:\n        - name: app\n          image: registry.k8s.io/pause:3.10\n\
             ---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: {name}\n  namespace: {WORK_NS}\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels: {{app: {name}}}\n"
        ),
    );
    let pod = eventually(
        &format!("the guarded pod running on {node}"),
        Duration::from_secs(60),
        || {
            let pods = k.json(&["get", "pods", "-n", WORK_NS, "-l", &format!("app={name}")]);
            pods["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| {
                    p["spec"]["nodeName"] == node
                        && p["metadata"]["deletionTimestamp"].is_null()
                        && p["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
                .and_then(|p| p["metadata"]["name"].as_str().map(str::to_string))
        },
    );
    eventually(
        &format!("the budget of {name} allowing no disruption"),
        Duration::from_secs(60),
        || {
            let pdb = k.json(&["get", "pdb", "-n", WORK_NS, &name]);
            let s = &pdb["status"];
            (s["currentHealthy"] == 1
                && s["disruptionsAllowed"] == 0
                && s["observedGeneration"] == pdb["metadata"]["generation"])
                .then_some(())
        },
    );
    pod
}

/// Lifts the guard of `node`: its budget goes (so the drain may evict the
/// pod), then its Deployment. Returns when the budget was deleted.
pub fn unguard(k: &Kubectl, node: &str) -> DateTime<Utc> {
    let name = format!("guard-{node}");
    let at = Utc::now();
    k.ok(&["delete", "pdb", "-n", WORK_NS, &name, "--wait=true"]);
    at
}

/// Deletes the guard's Deployment of `node` (after [`unguard`]).
pub fn remove_guard(k: &Kubectl, node: &str) {
    let name = format!("guard-{node}");
    k.run(
        &[
            "delete",
            "deployment,pdb",
            "-n",
            WORK_NS,
            &name,
            "--ignore-not-found",
            "--wait=false",
        ],
        None,
    );
}
