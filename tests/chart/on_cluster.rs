//! What the tests on the shared cluster have in common: the release
//! installed with the chart's defaults, TokenRequest tokens of the chart's
//! ServiceAccounts and kubeconfigs that hold them, the writes the agent and
//! the controller make (status, reports) and a real controller process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use forewarn_harness::cluster::Cluster;
use serde_json::Value;

use crate::{
    AGENT_POLICY, AGENT_SA, Kubectl, NS, Out, RELEASE, chart_dir, ensure_namespace, eventually,
    helm, out_dir,
};

/// (manager, operation) of each managedFields entry of `obj`.
pub fn managers(obj: &Value) -> Vec<(String, String)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["manager"].as_str().unwrap_or_default().to_string(),
                m["operation"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The API server's address and CA, from the admin kubeconfig.
fn server_and_ca(k: &Kubectl) -> (String, String) {
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

/// Installs (or upgrades) the release with default values and waits for it.
///
/// Without the CRD hook Job (`crds.upgradeJob.enabled=false`): KWOK fakes
/// pods, and kwok's pod-complete stage would mark the Job's pod Succeeded
/// without running anything, so the hook would claim an apply that never
/// happened. The tests run what the Job runs, `forewarn crds apply`, with
/// the hook's own ServiceAccount token instead (`crds_apply_*`), and the
/// real-node chart test runs the Job in a real pod.
pub fn install(k: &Kubectl, c: &Cluster) {
    install_with(k, c, &[]);
}

/// Installs (or upgrades) the release with default values and `extra`
/// arguments (e.g. `--set`), and waits for it.
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
    println!("{}", out.stdout);
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

/// Server-side apply of `status` on the ScheduledEvent `name` (status
/// subresource, field manager `manager`, forced), with the credentials
/// of `kubeconfig`: exactly the request the agent and controller make.
pub fn apply_status(
    kubeconfig: &Path,
    name: &str,
    status: Value,
    manager: &str,
) -> Result<(), String> {
    use forewarn::api::ScheduledEvent;
    use kube::api::{Api, Patch, PatchParams};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = forewarn_harness::cluster::client_for(kubeconfig)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let api: Api<ScheduledEvent> = Api::all(client);
        let body = serde_json::json!({
            "apiVersion": "forewarn.dev/v1alpha1",
            "kind": "ScheduledEvent",
            "metadata": { "name": name },
            "status": status,
        });
        api.patch_status(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&body),
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            kube::Error::Api(s) => format!("{} ({}): {}", s.reason, s.code, s.message),
            e => e.to_string(),
        })
    })
}

/// A `forewarn controller` process with `kubeconfig`'s credentials, stopped
/// (SIGTERM) when dropped.
pub struct ControllerProc {
    pub child: std::process::Child,
    pub log: PathBuf,
}

impl ControllerProc {
    /// A controller as the chart runs it (its Lease, `--agent-policy`),
    /// with the credentials of `kubeconfig`, named `name`.
    pub fn start(kubeconfig: &Path, name: &str) -> ControllerProc {
        Self::start_with(kubeconfig, name, &[])
    }

    /// [`ControllerProc::start`] with `extra` arguments.
    pub fn start_with(kubeconfig: &Path, name: &str, extra: &[&str]) -> ControllerProc {
        let agent_policy = format!("--agent-policy={AGENT_POLICY}");
        let mut args = vec![
            "controller",
            "--metrics-addr",
            "127.0.0.1:0",
            "--lease-namespace",
            NS,
            "--lease-name",
            "forewarn-controller",
            "--identity",
            name,
            &agent_policy,
        ];
        args.extend_from_slice(extra);
        Self::spawn(kubeconfig, name, &args)
    }

    /// `forewarn ARGS` with `kubeconfig`'s credentials, its output in
    /// `<name>.log`.
    pub fn spawn(kubeconfig: &Path, name: &str, args: &[&str]) -> ControllerProc {
        let log = out_dir().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_forewarn"))
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .env("RUST_LIB_BACKTRACE", "0")
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("start forewarn");
        ControllerProc { child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The port of its metrics server (started on `127.0.0.1:0`), from its
    /// log line `Serving /metrics, /healthz and /readyz ... addr=127.0.0.1:PORT`.
    pub fn metrics_port(&self) -> u16 {
        eventually(
            "the metrics server's address",
            Duration::from_secs(120),
            || {
                self.log()
                    .lines()
                    .filter(|l| l.contains("Serving /metrics"))
                    .find_map(|l| l.rsplit_once("addr=127.0.0.1:"))
                    .and_then(|(_, p)| p.trim().parse().ok())
            },
        )
    }

    /// The exit status once it has exited, within `within`; `None` while
    /// it runs.
    pub fn exit_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if start.elapsed() > within {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for ControllerProc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..100 {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
    }
}

pub fn sev_yaml(name: &str, status: &str, vm: &str) -> String {
    format!(
        "apiVersion: forewarn.dev/v1alpha1\nkind: ScheduledEvent\nmetadata:\n  name: {name}\nspec:\n  eventId: {name}\n  eventType: Reboot\n  eventStatus: {status}\n  eventSource: Platform\n  resourceType: VirtualMachine\n  resources: [{vm}]\n  durationSeconds: -1\n  appearance: 1\n"
    )
}

/// One agent's report about the event `name`, as the agent applies it:
/// the object `<name>.<node>`, its view of an event of `type_` (a `Freeze`
/// of 5 s, anything else of unknown duration) listing `resources`.
pub fn report_yaml(
    name: &str,
    node: &str,
    vm: &str,
    type_: &str,
    status: &str,
    resources: &[&str],
) -> String {
    report_yaml_named(
        &format!("{name}.{node}"),
        name,
        node,
        vm,
        type_,
        status,
        resources,
    )
}

/// A `ScheduledEventReport` object named `object`.
pub fn report_yaml_named(
    object: &str,
    name: &str,
    node: &str,
    vm: &str,
    type_: &str,
    status: &str,
    resources: &[&str],
) -> String {
    let named = resources.iter().any(|r| r.eq_ignore_ascii_case(vm));
    let duration = if type_ == "Freeze" { 5 } else { -1 };
    format!(
        "apiVersion: forewarn.dev/v1alpha1\nkind: ScheduledEventReport\nmetadata:\n  name: {object}\nspec:\n  scheduledEvent: {name}\n  report:\n    node: {node}\n    vm: {vm}\n    named: {named}\n    eventStatus: {status}\n    appearance: 1\n    eventId: {name}\n    eventType: {type_}\n    eventSource: Platform\n    resourceType: VirtualMachine\n    resources: [{}]\n    durationSeconds: {duration}\n    documentIncarnation: 1\n",
        resources.join(", ")
    )
}

/// Applies a report as the agent does (server-side apply, its field manager).
/// Makes each `(node, vm)` the node's VM as its agent states it at start:
/// the node's `VirtualMachineReport` (whose `vm` the API server keeps as
/// first written) deleted as admin, then written with the agent token bound
/// to the chart's agent pod on the node. The KWOK nodes have no providerID,
/// so this is how the controller knows their VMs.
pub fn state_vms(k: &Kubectl, vms: &[(&str, &str)]) {
    for (node, vm) in vms {
        k.run(
            &["delete", "virtualmachinereport", node, "--ignore-not-found"],
            None,
        );
        let (pod, uid) = agent_pod_on(k, node);
        let agent = token_kubeconfig(
            k,
            &format!("vm-report-{node}"),
            &token(k, AGENT_SA, Some((&pod, &uid))),
        );
        let out = apply_report(
            &agent,
            &format!(
                "apiVersion: forewarn.dev/v1alpha1\nkind: VirtualMachineReport\nmetadata:\n  name: {node}\nspec:\n  node: {node}\n  vm: {vm}\n"
            ),
        );
        assert!(out.ok, "agent on {node} may state its VM: {}", out.stderr);
    }
}

pub fn apply_report(who: &Kubectl, yaml: &str) -> Out {
    who.run(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=forewarn-agent",
            "-f",
            "-",
        ],
        Some(yaml),
    )
}

pub fn unschedulable(k: &Kubectl, node: &str) -> bool {
    k.json(&["get", "node", node])["spec"]["unschedulable"] == true
}

pub fn condition(k: &Kubectl, sev: &str, type_: &str) -> Option<Value> {
    let ev = k.json(&["get", "scheduledevent", sev]);
    ev["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}
