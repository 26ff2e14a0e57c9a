//! Shared by the real-node tests (`tests/real_node.rs`,
//! `tests/real_node_chart.rs`): what `hack/real-node.sh` passes in, and small
//! helpers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use forewarn_harness::cluster::{Cluster, client_for};
use forewarn_harness::procs::{Proc, read_mock_address};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;

pub const VM: &str = "forewarn-real-vm-0";
pub const AGENT_IMAGE: &str = "ghcr.io/forewarn/forewarn:dev";

/// What `hack/real-node.sh test` passes in.
pub struct Env {
    pub cluster: Cluster,
    pub node: String,
    pub logs: PathBuf,
    pub forewarn: PathBuf,
    pub imds_ip: String,
    /// The network namespace `hack/real-node.sh test` started in (the machine's).
    pub host_netns: String,
    /// The kubelet's `--root-dir` (pod volumes, e.g. their tokens).
    pub kubelet_root: PathBuf,
}

pub fn env() -> Env {
    let var = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| {
            panic!(
                "{k} is not set: this test runs only inside the network namespace of \
                 `hack/real-node.sh test` (make test-real), which starts the cluster and the real node"
            )
        })
    };
    Env {
        cluster: Cluster {
            name: "forewarn-real".into(),
            kubeconfig: var("FOREWARN_REAL_KUBECONFIG").into(),
            bin_dir: var("FOREWARN_REAL_K8S_BIN").into(),
        },
        node: var("FOREWARN_REAL_NODE"),
        logs: var("FOREWARN_REAL_LOGS").into(),
        forewarn: var("FOREWARN_REAL_BIN").into(),
        imds_ip: var("FOREWARN_REAL_IMDS_IP"),
        host_netns: var("FOREWARN_REAL_HOST_NETNS"),
        kubelet_root: var("FOREWARN_REAL_KUBELET_ROOT").into(),
    }
}

pub async fn client(env: &Env) -> Client {
    client_for(&env.cluster.kubeconfig)
        .await
        .expect("client for the real-node cluster")
}

/// Port of the API server (pods get it as KUBERNETES_SERVICE_PORT).
pub fn api_port(env: &Env) -> String {
    let server = env
        .cluster
        .kubectl(&[
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ])
        .expect("kubectl config view");
    let port = server.rsplit(':').next().unwrap_or_default().trim();
    assert!(
        server.starts_with("https://127.0.0.1:") && port.parse::<u16>().is_ok(),
        "unexpected API server URL {server:?}"
    );
    port.to_string()
}

pub async fn apply<K>(api: &Api<K>, manifest: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = manifest["metadata"]["name"].as_str().unwrap().to_string();
    api.patch(
        &name,
        &PatchParams::apply("real-node-test").force(),
        &Patch::Apply(&manifest),
    )
    .await
    .unwrap_or_else(|e| panic!("failed to apply {name}: {e}"))
}

pub async fn wait_pod_ready(pods: &Api<Pod>, name: &str, within: Duration) -> Pod {
    let deadline = Instant::now() + within;
    loop {
        // A StatefulSet's or DaemonSet's pod may not exist yet.
        let pod = match pods.get_opt(name).await.expect("get pod") {
            Some(pod) => pod,
            None => {
                assert!(
                    Instant::now() < deadline,
                    "pod {name} not created within {within:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready {
            return pod;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} not Ready after {within:?}: {:#?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The process in this PID namespace whose command line is `cmdline`
/// (NUL-separated), with its `/proc/PID/status`.
pub fn find_process(cmdline: &str) -> Option<(u32, String)> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmd) == cmdline {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            return Some((pid, status));
        }
    }
    None
}

/// Starts the IMDS mock on 169.254.169.254:80 of the namespace, playing one
/// VM ([`VM`], on the real node) with no events, served at the root paths
/// as real IMDS serves the VM that asks.
pub async fn start_mock(env: &Env) -> Proc {
    start_mock_with(env, "events: []\n", false, "imds-mock").await
}

/// [`start_mock`] with the scenario's `events:` section given as YAML, and
/// with `--hold` (the clock starts at `POST /mock/start`) when `hold`.
pub async fn start_mock_with(env: &Env, events: &str, hold: bool, name: &str) -> Proc {
    let scenario = env.logs.join(format!("{name}-scenario.yaml"));
    std::fs::write(
        &scenario,
        format!(
            "description: one real VM\nvms:\n  - {{name: {VM}, node: {}, faultDomain: 0}}\n{events}",
            env.node
        ),
    )
    .expect("write scenario");
    let mut args: Vec<String> = vec![
        "imds-mock".into(),
        "--scenario".into(),
        scenario.to_string_lossy().into(),
        "--listen".into(),
        format!("{}:80", env.imds_ip),
        "--root-vm".into(),
        VM.into(),
    ];
    if hold {
        args.push("--hold".into());
    }
    let (mock, stdout) = Proc::spawn("imds-mock", &env.forewarn, &args, &[], &env.logs, name)
        .expect("start the IMDS mock");
    let base = read_mock_address(stdout.expect("mock stdout"), mock.log.clone())
        .await
        .expect("mock address");
    assert_eq!(base, format!("http://{}:80", env.imds_ip));
    mock
}

/// `kubectl logs -f` of a pod's container, read line by line on a thread
/// of its own: started while the container runs, it sees every line the
/// container writes until it exits (the stream ends then), however late
/// the test looks and however soon the pod object goes.
pub struct LogFollow {
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    child: std::process::Child,
    text: String,
}

impl LogFollow {
    pub fn start(env: &Env, ns: &str, pod: &str) -> Self {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(env.cluster.kubectl_path())
            .args(["logs", "-f", "-n", ns, pod])
            .env("KUBECONFIG", &env.cluster.kubeconfig)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start kubectl logs -f");
        let out = child.stdout.take().expect("kubectl stdout");
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        LogFollow {
            lines,
            child,
            text: String::new(),
        }
    }

    /// Waits for the first line (the stream is attached and the container
    /// has written); panics after `within`, a hang bound.
    pub async fn attached(&mut self, within: Duration) {
        let line = tokio::time::timeout(within, self.lines.recv())
            .await
            .unwrap_or_else(|_| panic!("kubectl logs -f printed nothing within {within:?}"))
            .expect("kubectl logs -f ended without a line");
        self.text.push_str(&line);
        self.text.push('\n');
    }

    /// Everything read until the stream ended (the container exited), or
    /// until `within` (a hang bound) if it did not.
    pub async fn finish(mut self, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        while let Ok(Some(line)) = tokio::time::timeout_at(deadline, self.lines.recv()).await {
            self.text.push_str(&line);
            self.text.push('\n');
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.text
    }
}

/// The RFC 3339 stamp of the first line of `logs` (the workload's own
/// log, every line stamped) that contains `what`.
pub fn log_stamp(logs: &str, what: &str) -> chrono::DateTime<chrono::Utc> {
    let line = logs
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("{what:?} not in the log:\n{logs}"));
    line_stamp(line)
}

/// The stamp of the workload's `exiting` line, its last (written after its
/// term delay, just before it exits 0), if it wrote one: a container the
/// kubelet killed at the end of its grace never does.
pub fn exit_stamp(logs: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    logs.lines()
        .find(|l| l.ends_with(" exiting"))
        .map(line_stamp)
}

fn line_stamp(line: &str) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(line.split_whitespace().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no stamp on {line:?}: {e}"))
        .with_timezone(&chrono::Utc)
}
