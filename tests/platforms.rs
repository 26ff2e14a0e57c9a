//! The agent built for linux/arm64 and for windows/amd64
//! (`hack/build-platform.sh`, release: the binaries `make image` puts in
//! those platforms' images), each run as the agent of one node of a local
//! cluster through an emulator: `qemu-aarch64-static` (qemu-user) for
//! arm64, Wine for Windows. The IMDS mock, the controller and the other
//! nodes' agents are the normal Linux binary. A scenario is played end to
//! end for each, and checked from the outside: the report on the API server
//! written with the agent's field manager, the node cordoned and a pod
//! evicted (the API server's record of the deletion), the approval the mock
//! received once, the node released. The Windows agent must also stop
//! cleanly on a console control event.
//!
//! The toolchains come from `hack/toolchains.sh` (`make test` runs it
//! first); a missing tool fails the tests, naming it. The cluster is
//! `forewarn-platforms`, or `FOREWARN_PLATFORMS_CLUSTER` (to run this file
//! beside a `make test` that uses the default).
//!
//! What this does not prove: a real arm64 machine (qemu-user emulates the
//! instructions, the Linux kernel is this one), a real Windows node, and a
//! HostProcess container (Wine is not Windows: its console control events,
//! its network stack and its file system are its own).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chrono::Utc;
use forewarn::api::{AGENT_MANAGER, ScheduledEventReport};
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::options::RunOptions;
use forewarn_harness::procs::{AgentRunner, Proc, start_imds_mock, wait_ready};
use forewarn_harness::report::{Report, summary};
use forewarn_harness::run::run_scenario;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

/// The scenario: a user reboot of the VM of `NODE` (drained, approved,
/// released); the other two nodes' agents are the Linux binary.
const SCENARIO: &str = "user-reboot.yaml";
const NODE: &str = "node-000002";
const VM: &str = "aks-nodepool1-27351046-vmss_2";

/// A hang bound: the scenario is over within a minute or so (its notice is
/// 60 s; the drain and approval take seconds, emulated agents included);
/// only a run that stopped making progress reaches it.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a process may take to exit when asked to stop: a hang bound
/// (they exit within a second or two, Wine's included); only one that
/// ignores the request or hangs in its clean-up reaches it.
const STOP: Duration = Duration::from_secs(60);

fn cluster_name() -> String {
    std::env::var("FOREWARN_PLATFORMS_CLUSTER").unwrap_or_else(|_| "forewarn-platforms".into())
}

/// The cluster, started once, with the audit policy of `make test`
/// (hack/audit-policy.yaml: every request of a ServiceAccount logged) also
/// when this file runs alone: the sandbox test reads who wrote.
fn cluster() -> Cluster {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            let policy = repo_root().join("hack/audit-policy.yaml");
            Cluster::start_with(
                &cluster_name(),
                3,
                &[("FOREWARN_KUBE_AUDIT_POLICY", policy.as_path())],
            )
            .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .unwrap_or_else(|e| panic!("the local cluster {} could not start: {e}", cluster_name()))
}

/// One scenario on the cluster at a time.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn linux_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_forewarn"))
}

/// forewarn's cache root, as the hack/ scripts compute it.
fn cache_dir() -> PathBuf {
    if let Ok(c) = std::env::var("FOREWARN_CACHE") {
        return c.into();
    }
    let xdg = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache"));
    xdg.join("forewarn")
}

/// A program the tests need: its path, or a failure naming the script
/// that installs it.
fn tool(path: &str) -> PathBuf {
    let found = if path.contains('/') {
        Some(PathBuf::from(path)).filter(|p| p.is_file())
    } else {
        std::env::var_os("PATH").and_then(|dirs| {
            std::env::split_paths(&dirs)
                .map(|d| d.join(path))
                .find(|p| p.is_file())
        })
    };
    found.unwrap_or_else(|| panic!("{path} is missing: run hack/toolchains.sh (as root)"))
}

/// The release agent for `platform`, the binary `make image` puts in that
/// platform's image, built by `hack/build-platform.sh` (or taken from its
/// target dir in the cache when nothing changed). Builds run one at a
/// time: each uses both cores.
fn build(platform: &str) -> PathBuf {
    static BUILDS: Mutex<()> = Mutex::new(());
    let _one = BUILDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let out = Command::new("bash")
        .arg(repo_root().join("hack/build-platform.sh"))
        .args([platform, "release"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("failed to run hack/build-platform.sh");
    assert!(
        out.status.success(),
        "hack/build-platform.sh {platform} release failed ({}): see above; hack/toolchains.sh installs the toolchains",
        out.status
    );
    let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(bin.is_file(), "no binary at {}", bin.display());
    bin
}

/// The arm64 agent through qemu-user (this machine cannot run arm64
/// binaries directly: no binfmt_misc).
fn arm64_runner() -> AgentRunner {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    let bin = BIN.get_or_init(|| build("linux/arm64")).clone();
    let qemu = tool("qemu-aarch64-static");
    AgentRunner {
        prefix: vec![qemu.to_string_lossy().into_owned()],
        bin,
        env: Vec::new(),
        stop_signal: "TERM".into(),
    }
}

/// Wine's programs (Debian's wine64 package).
const WINE: &str = "/usr/lib/wine/wine64";
const WINESERVER: &str = "/usr/lib/wine/wineserver";

/// The Windows agent under Wine: the executable copied into a directory of
/// the test's own with the `bcryptprimitives.dll` shim beside it (built
/// here from tests/support/bcryptprimitives.c: Wine 8 lacks the
/// `ProcessPrng` Rust's standard library imports; the shim is never beside
/// the binary the image ships), in a Wine prefix of the cache made once.
fn windows_runner() -> AgentRunner {
    static SETUP: OnceLock<(PathBuf, Vec<(String, String)>)> = OnceLock::new();
    let (exe, env) = SETUP
        .get_or_init(|| {
            let built = build("windows/amd64");
            let wine = tool(WINE);
            let gcc = tool("x86_64-w64-mingw32-gcc");
            let dir = repo_root().join("target/platforms/windows");
            std::fs::create_dir_all(&dir).expect("test dir");
            let exe = dir.join("forewarn.exe");
            std::fs::copy(&built, &exe).expect("copy forewarn.exe");
            let shim = repo_root().join("tests/support/bcryptprimitives.c");
            let ok = Command::new(&gcc)
                .args(["-shared", "-O2", "-o"])
                .arg(dir.join("bcryptprimitives.dll"))
                .arg(&shim)
                .arg("-ladvapi32")
                .status()
                .expect("run x86_64-w64-mingw32-gcc")
                .success();
            assert!(ok, "building the bcryptprimitives.dll shim failed");
            let prefix = cache_dir().join("wine-prefix");
            let env = vec![
                (
                    "WINEPREFIX".to_string(),
                    prefix.to_string_lossy().into_owned(),
                ),
                // Wine's own diagnostics off: the log is the agent's.
                ("WINEDEBUG".into(), "-all".into()),
                // No Mono or Gecko installers on the prefix's creation.
                ("WINEDLLOVERRIDES".into(), "mscoree,mshtml=".into()),
            ];
            if !prefix.join("system.reg").is_file() {
                // The prefix is made once (tens of seconds), before any
                // agent is timed.
                let ok = Command::new(&wine)
                    .args(["wineboot", "--init"])
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .status()
                    .expect("run wineboot")
                    .success();
                assert!(ok, "wineboot --init failed");
                let _ = Command::new(tool(WINESERVER))
                    .arg("-w")
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .status();
            }
            (exe, env)
        })
        .clone();
    AgentRunner {
        prefix: vec![WINE.into()],
        bin: exe,
        env,
        // Wine turns SIGINT into CTRL_C; SIGTERM would end it at once.
        stop_signal: "INT".into(),
    }
}

/// A version of a report of `NODE` as the API server sent it.
#[derive(Debug, Clone)]
struct Seen {
    name: String,
    vm: String,
    /// `creationTimestamp`, in seconds since the epoch.
    created: Option<i64>,
    /// `(manager, operation)` of each `managedFields` entry.
    managers: Vec<(String, String)>,
}

/// Every version of a report of `NODE` the API server sends a watch,
/// until the task is aborted.
fn watch_reports(client: kube::Client, into: Arc<Mutex<Vec<Seen>>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<ScheduledEventReport> = Api::all(client);
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(r) = stream.next().await {
            let Ok(r) = r else { continue };
            if r.spec.report.node != NODE {
                continue;
            }
            let managers = r
                .meta()
                .managed_fields
                .iter()
                .flatten()
                .map(|m| {
                    (
                        m.manager.clone().unwrap_or_default(),
                        m.operation.clone().unwrap_or_default(),
                    )
                })
                .collect();
            into.lock().unwrap().push(Seen {
                name: r.name_any(),
                vm: r.spec.report.vm.clone(),
                created: r.creation_timestamp().map(|t| t.0.as_second()),
                managers,
            });
        }
    })
}

/// Plays `SCENARIO` with `runner` as `NODE`'s agent and checks, from the
/// API server and the mock, that it did its part.
async fn play(platform: &str, runner: AgentRunner) -> Report {
    let runner_desc = format!("{} {}", runner.prefix.join(" "), runner.bin.display());
    let _turn = TURN.lock().await;
    let cluster = tokio::task::spawn_blocking(cluster).await.expect("cluster");
    let client = cluster.client().await.expect("client");
    // Reports of an earlier run are older than this (creation times have
    // one-second resolution: the second this run starts in counts).
    let since = Utc::now().timestamp() - 1;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let watch = watch_reports(client.clone(), seen.clone());

    let mut opts = RunOptions::new(
        repo_root().join("tests/fixtures").join(SCENARIO),
        linux_bin(),
    );
    opts.timeout = RUN_TIMEOUT;
    opts.log_dir = repo_root()
        .join("target/forewarn-runs")
        .join(format!("platforms-{}", platform.replace('/', "-")));
    opts.agent_runners = BTreeMap::from([(NODE.to_string(), runner)]);
    let report = run_scenario(&cluster, &opts)
        .await
        .unwrap_or_else(|e| panic!("{platform}: could not run {SCENARIO}: {e:#}"));
    watch.abort();
    println!(
        "{platform} agent ({runner_desc}) on {NODE}:\n{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    let agent_log = std::fs::read_to_string(report.log_dir.join(format!("agent-{NODE}.log")))
        .unwrap_or_default();
    assert!(
        report.ok(),
        "{platform}: {SCENARIO} failed:\n{}\n{}\n--- the {platform} agent's log ---\n{agent_log}",
        report.timeline.join("\n"),
        summary(&report)
    );

    // The report: on the API server, written by the agent's field manager
    // with server-side apply, about its own VM.
    let seen = seen.lock().unwrap().clone();
    let ours: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.created.is_some_and(|c| c >= since))
        .collect();
    assert!(
        !ours.is_empty(),
        "{platform}: no report of {NODE} reached the API server during the run: {seen:?}\n--- agent log ---\n{agent_log}"
    );
    for s in &ours {
        assert_eq!(s.vm, VM, "{platform}: report {} names another VM", s.name);
        assert!(
            s.managers
                .iter()
                .any(|(m, op)| m == AGENT_MANAGER && op == "Apply"),
            "{platform}: report {} not applied by {AGENT_MANAGER}: {:?}",
            s.name,
            s.managers
        );
    }

    // Cordoned, then a pod of the node evicted (the API server's record of
    // its deletion, with its grace period: not forced).
    let cordoned = report
        .first_cordon(NODE)
        .unwrap_or_else(|| panic!("{platform}: {NODE} was never cordoned"));
    let evicted: Vec<_> = report.deletions.iter().filter(|d| d.node == NODE).collect();
    assert!(
        !evicted.is_empty(),
        "{platform}: no pod of {NODE} was deleted (drained): {:?}",
        report.deletions
    );
    assert!(
        evicted.iter().all(|d| d.grace_seconds != Some(0)),
        "{platform}: a pod of {NODE} was force-deleted: {evicted:?}"
    );

    // The approval: one POST to the VM's IMDS, in the mock's own log, after
    // the cordon.
    let approvals: Vec<_> = report
        .imds_log
        .iter()
        .filter(|e| e.what == "Approved" && e.vm.as_deref() == Some(VM))
        .collect();
    assert_eq!(
        approvals.len(),
        1,
        "{platform}: approvals of {VM} in the mock's log: {:?}",
        report.imds_log
    );
    assert!(
        approvals[0].time > cordoned,
        "{platform}: approved at {} before the cordon at {cordoned}",
        approvals[0].time
    );

    // Released: uncordoned on the API server now.
    let node = Api::<Node>::all(client).get(NODE).await.expect("get node");
    assert_ne!(
        node.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "{platform}: {NODE} is still cordoned"
    );
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_arm64_agent_plays_its_node_through_a_user_reboot() {
    let runner = tokio::task::spawn_blocking(arm64_runner)
        .await
        .expect("build");
    play("linux/arm64", runner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_windows_agent_plays_its_node_through_a_user_reboot() {
    let runner = tokio::task::spawn_blocking(windows_runner)
        .await
        .expect("build");
    play("windows/amd64", runner).await;
}

/// Where each Windows-only test starts: the Windows agent's runner, this
/// file's turn on the cluster, a client, no report left by an earlier test,
/// and an empty log dir `target/forewarn-runs/<name>`.
async fn windows_stage(
    name: &str,
) -> (
    AgentRunner,
    tokio::sync::MutexGuard<'static, ()>,
    Cluster,
    kube::Client,
    PathBuf,
) {
    let runner = tokio::task::spawn_blocking(windows_runner)
        .await
        .expect("build");
    let turn = TURN.lock().await;
    let cluster = tokio::task::spawn_blocking(cluster).await.expect("cluster");
    let client = cluster.client().await.expect("client");
    cluster
        .kubectl(&["delete", "scheduledeventreports", "--all", "--wait"])
        .expect("delete earlier reports");
    let dir = repo_root().join("target/forewarn-runs").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("log dir");
    (runner, turn, cluster, client, dir)
}

/// The IMDS mock playing `SCENARIO` at once, its logs in `dir`; returns
/// it and its base URL.
async fn start_mock(dir: &Path) -> (Proc, String) {
    let scenario = repo_root().join("tests/fixtures").join(SCENARIO);
    start_imds_mock(&linux_bin(), &scenario, "127.0.0.2:0", false, &[], dir)
        .await
        .expect("start the mock")
}

/// The Windows agent of `NODE` alone, under Wine, polling `imds`, with
/// `env` besides Wine's; waits until it is ready.
async fn start_windows_agent(
    runner: &AgentRunner,
    dir: &Path,
    imds: &str,
    env: &[(&str, &str)],
) -> Proc {
    let mut args = runner.prefix[1..].to_vec();
    args.extend([
        runner.bin.to_string_lossy().into_owned(),
        "agent".into(),
        "--node-name".into(),
        NODE.into(),
        "--imds-url".into(),
        format!("{imds}/vm/{VM}"),
        "--metrics-addr".into(),
        "127.0.0.1:0".into(),
    ]);
    let mut all: Vec<(&str, &str)> = runner
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    all.extend_from_slice(env);
    let (mut agent, _) = Proc::spawn(
        "windows agent",
        Path::new(&runner.prefix[0]),
        &args,
        &all,
        dir,
        "agent",
    )
    .expect("start the Windows agent");
    // Hang bounds: the agent serves and turns ready within seconds, Wine's
    // start included.
    let port = agent
        .metrics_port(Duration::from_secs(120))
        .await
        .expect("metrics port");
    wait_ready(port, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the Windows agent is not ready: {e}\n{}",
                agent.log_tail(30)
            )
        });
    agent
}

/// The name of the first report of `NODE` on the API server, waited for
/// (a hang bound: the event is listed 3 s into the scenario and reported
/// within a second or two).
async fn first_report(client: &kube::Client, agent: &Proc) -> String {
    let reports: Api<ScheduledEventReport> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let list = reports
            .list(&Default::default())
            .await
            .expect("list reports");
        if let Some(r) = list.items.iter().find(|r| r.spec.report.node == NODE) {
            return r.name_any();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Windows agent wrote no report within 120 s\n{}",
            agent.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (a hang bound, see [`STOP`]) for `p` to exit after a signal.
async fn exit_of(p: &mut Proc) -> std::process::ExitStatus {
    tokio::time::timeout(STOP, async {
        loop {
            if let Some(s) = p.exited() {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{} did not stop within {STOP:?}\n{}",
            p.name,
            p.log_tail(30)
        )
    })
}

/// The Windows agent's stop: Wine turns a SIGINT into the process's
/// CTRL_C console control event (its console control handlers run, as
/// Windows runs them); the agent must log the event, stop, exit 0, and
/// leave its report on the API server (an agent stopped for an update must
/// not take its node's reports with it). Which control event a real
/// Windows node sends on a container's stop is not proven here.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_windows_agent_stops_cleanly_on_a_console_control_event() {
    let (runner, _turn, cluster, client, dir) = windows_stage("platforms-windows-stop").await;
    let (mut mock, imds) = start_mock(&dir).await;
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    let mut agent = start_windows_agent(&runner, &dir, &imds, &[("KUBECONFIG", &kubeconfig)]).await;
    let name = first_report(&client, &agent).await;

    agent.signal("INT").expect("SIGINT to the Wine process");
    let status = exit_of(&mut agent).await;
    let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
    assert!(
        status.success(),
        "the Windows agent exited with {status}\n{log}"
    );
    assert!(
        log.contains("Console control event received") && log.contains("CTRL_C"),
        "the agent did not log the control event:\n{log}"
    );
    assert!(
        log.contains("Agent stopped"),
        "no clean stop in the log:\n{log}"
    );
    let kept = Api::<ScheduledEventReport>::all(client)
        .get_opt(&name)
        .await
        .expect("get report");
    assert!(kept.is_some(), "the report {name} went with the agent");
    mock.terminate(STOP).await.expect("stop the mock");
}

/// A HostProcess container's layout, under Wine: no `KUBECONFIG`, the
/// ServiceAccount's token, CA and namespace under
/// `$CONTAINER_SANDBOX_MOUNT_POINT\var\run\secrets\kubernetes.io\serviceaccount\`
/// and the API server in `KUBERNETES_SERVICE_HOST`/`_PORT`: the Windows
/// agent must authenticate with that token (a TokenRequest token of a
/// ServiceAccount of the test's own) and write its report. Only the
/// layout is played: a real HostProcess container is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_windows_agent_reads_its_service_account_under_the_sandbox_mount_point() {
    let (runner, _turn, cluster, client, dir) = windows_stage("platforms-windows-sandbox").await;
    let sa_dir = dir.join("sandbox/var/run/secrets/kubernetes.io/serviceaccount");
    std::fs::create_dir_all(&sa_dir).expect("sandbox dir");
    // A ServiceAccount of the test's own, allowed everything (the chart's
    // RBAC is tests/chart/'s subject, not this one's).
    let sa = "forewarn-platforms-agent";
    let _ = cluster.kubectl(&["create", "serviceaccount", "-n", "default", sa]);
    let _ = cluster.kubectl(&[
        "create",
        "clusterrolebinding",
        sa,
        "--clusterrole=cluster-admin",
        &format!("--serviceaccount=default:{sa}"),
    ]);
    let token = cluster
        .kubectl(&["create", "token", "-n", "default", sa, "--duration=1h"])
        .expect("a TokenRequest token");
    std::fs::write(sa_dir.join("token"), token.trim()).expect("token");
    std::fs::write(sa_dir.join("namespace"), "default").expect("namespace");
    let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).expect("kubeconfig");
    let local = kubeconfig.clusters[0]
        .cluster
        .clone()
        .expect("the kubeconfig's cluster");
    let ca = local
        .certificate_authority
        .expect("the kubeconfig's CA file");
    std::fs::copy(ca, sa_dir.join("ca.crt")).expect("ca.crt");
    let server: http::Uri = local.server.expect("server").parse().expect("server URL");
    let host = server.host().expect("host").to_string();
    let port = server.port_u16().expect("port").to_string();
    // The mount point as Windows names it: Wine's Z: is this machine's /.
    let sandbox = format!(
        "Z:{}",
        dir.join("sandbox").to_string_lossy().replace('/', "\\")
    );

    let (mut mock, imds) = start_mock(&dir).await;
    let mut agent = start_windows_agent(
        &runner,
        &dir,
        &imds,
        &[
            ("CONTAINER_SANDBOX_MOUNT_POINT", &sandbox),
            ("KUBERNETES_SERVICE_HOST", &host),
            ("KUBERNETES_SERVICE_PORT", &port),
        ],
    )
    .await;
    let name = first_report(&client, &agent).await;
    let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
    assert!(
        log.contains("In-cluster configuration under the container's sandbox mount point"),
        "the agent did not use the sandbox's ServiceAccount:\n{log}"
    );
    let report = Api::<ScheduledEventReport>::all(client)
        .get(&name)
        .await
        .expect("get report");
    assert_eq!(report.spec.report.vm, VM);
    // The API server's word: the report was applied by the agent's process
    // (its User-Agent) authenticated as that ServiceAccount.
    let user = format!("system:serviceaccount:default:{sa}");
    let agent_ua = format!("forewarn/{} (agent; {NODE})", env!("CARGO_PKG_VERSION"));
    let audit = cluster.audit_log().expect("the audit log");
    let applied = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|e| {
            e["user"]["username"] == user.as_str()
                && e["userAgent"] == agent_ua.as_str()
                && e["verb"] == "patch"
                && e["objectRef"]["resource"] == "scheduledeventreports"
                && e["objectRef"]["name"] == name.as_str()
                && e["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(|c| (200..300).contains(&c))
        });
    assert!(
        applied,
        "no patch of {name} by {user} with User-Agent {agent_ua:?} in the audit log"
    );
    agent.signal("INT").expect("SIGINT to the Wine process");
    let status = exit_of(&mut agent).await;
    assert!(status.success(), "the Windows agent exited with {status}");
    mock.terminate(STOP).await.expect("stop the mock");
}
