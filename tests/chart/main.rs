//! The Helm chart (`charts/forewarn`) against a real local control plane:
//! `helm lint --strict`, every rendered object accepted by the API server
//! (default values and every optional feature on), `manifests/` in step with
//! the chart, the CRDs on upgrade (the manual step, the hook's `forewarn
//! crds apply` with the hook's token, the start-up check, and an upgrade
//! from the previous release's chart with an event in progress, on a
//! cluster of its own), and, once installed, the chart's own
//! ServiceAccounts with TokenRequest tokens (the agent's bound to its pod on
//! a KWOK node): what each may and may not do, RBAC and the admission policy
//! alike, checked on what the server stored. helm is built from its Go
//! module by `hack/build-helm.sh`. Fails, never skips, when the cluster
//! cannot start.
//!
//! One test binary: the tests by topic in the modules below, the tools and
//! the one shared cluster here, the helpers of the tests on that cluster in
//! `on_cluster`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use forewarn_harness::cluster::{Cluster, helm_bin, repo_root};
use serde_json::Value;

mod crds;
mod image;
mod install;
mod metrics_auth;
mod on_cluster;
mod policy;
mod processes;
mod render;
mod trust;
mod upgrade;
mod webhooks;
mod windows;

const CLUSTER: &str = "forewarn-chart";
/// The cluster of `upgrade_from_the_previous_release_with_an_event_in_progress`.
const UPGRADE_CLUSTER: &str = "forewarn-chart-upgrade";
const NS: &str = "forewarn";
const RELEASE: &str = "forewarn";
const AGENT_SA: &str = "forewarn-agent";
const CONTROLLER_SA: &str = "forewarn-controller";
const VM_ANNOTATION: &str = "forewarn.dev/vm-name";
/// The chart's ValidatingAdmissionPolicy, and its binding (same name), by
/// which an agent writes only its own node's reports.
const AGENT_POLICY: &str = "forewarn-agent-reports";
/// The chart's ValidatingAdmissionPolicy, and its binding (same name), by
/// which the controller changes nothing on a pod but its notices.
const CONTROLLER_POD_POLICY: &str = "forewarn-controller-pod-notices";
/// The admission policy that lets only the controller write as its field
/// manager on `ScheduledEvent`s (their approval decisions).
const DECISIONS_POLICY: &str = "forewarn-controller-decisions";
/// What `helm template` must be told the cluster serves for the chart to
/// render the admission policy (`helm install` asks the cluster).
const VAP_API: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";
/// The start of the chart's refusal to render without the admission policy.
const UNCONFINED: &str = "refusing to install agents that are not confined to their own node";

// ---------------------------------------------------------------------------
// Tools

/// What a command printed, and whether it succeeded.
#[derive(Debug)]
struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn run(bin: &Path, args: &[&str], env: &[(&str, &Path)], stdin: Option<&str>) -> Out {
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

/// Runs helm with its caches and config inside target/, never in ~.
fn helm(args: &[&str]) -> Out {
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

fn chart_dir() -> String {
    repo_root()
        .join("charts/forewarn")
        .to_string_lossy()
        .into_owned()
}

fn all_features_values() -> String {
    repo_root()
        .join("tests/chart-fixtures/values-all-features.yaml")
        .to_string_lossy()
        .into_owned()
}

/// `helm template` of the release into NS with `extra` arguments, for a
/// cluster that serves the ValidatingAdmissionPolicy API.
fn render(extra: &[&str]) -> String {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--api-versions",
        VAP_API,
    ];
    args.extend_from_slice(extra);
    let out = helm(&args);
    assert!(
        out.ok,
        "helm template {extra:?} failed:\n{}{}",
        out.stdout, out.stderr
    );
    out.stdout
}

/// The YAML documents of a multi-document stream, as JSON values.
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---")
        .filter_map(|doc| {
            let v: Value = serde_yaml::from_str(doc).expect("rendered YAML parses");
            (!v.is_null()).then_some(v)
        })
        .collect()
}

/// Kubectl with a given kubeconfig.
#[derive(Clone)]
struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Out {
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

    /// Waits until every CRD named is `Established`. `kubectl wait` fails
    /// at once (it does not wait) while a CRD just applied has no status
    /// conditions yet, so it is asked again until it succeeds.
    fn wait_established(&self, crds: &[&str]) {
        let mut args = vec!["wait", "--for=condition=Established", "--timeout=60s"];
        args.extend(crds.iter().copied());
        eventually("CRDs established", Duration::from_secs(120), || {
            let out = self.run(&args, None);
            out.ok.then_some(())
        });
    }

    /// Runs and panics on failure; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, None);
        assert!(out.ok, "kubectl {args:?} failed: {}", out.stderr.trim());
        out.stdout
    }

    fn ok_stdin(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run(args, Some(stdin));
        assert!(out.ok, "kubectl {args:?} failed: {}", out.stderr.trim());
        out.stdout
    }

    /// Runs a request that must be refused; returns the refusal (stderr).
    /// `kubectl cordon` exits 0 when the server refuses the patch (it only
    /// prints `error: unable to cordon node`), so an `error:` on stderr
    /// counts as a refusal too; callers check the stored object as well.
    fn denied(&self, args: &[&str]) -> String {
        let out = self.run(args, None);
        assert!(
            !out.ok || out.stderr.contains("error:"),
            "kubectl {args:?} was allowed but must be refused: {}",
            out.stdout.trim()
        );
        out.stderr.trim().to_string()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ok(&a)).expect("kubectl printed JSON")
    }
}

/// The turn of a test that runs a cluster: one at a time.
fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

/// One cluster for the whole test binary; the tests that use it take turns.
fn cluster() -> (MutexGuard<'static, ()>, Cluster) {
    static STARTED: OnceLock<Result<Cluster, String>> = OnceLock::new();
    let turn = turn();
    let cluster = STARTED
        .get_or_init(|| {
            // FOREWARN_CHART_CLUSTER: another name, to run beside a
            // `make test` that uses the default one.
            let name = std::env::var("FOREWARN_CHART_CLUSTER").unwrap_or_else(|_| CLUSTER.into());
            // API Priority and Fairness on, as on a production API server:
            // the chart's FlowSchema is checked by where it puts requests.
            Cluster::start_with(&name, 3, &[("FOREWARN_KUBE_APF", Path::new("1"))])
                .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .unwrap_or_else(|e| panic!("the local cluster could not start: {e}"));
    (turn, cluster)
}

fn admin(c: &Cluster) -> Kubectl {
    Kubectl {
        bin: c.kubectl_path(),
        kubeconfig: c.kubeconfig.clone(),
    }
}

/// Files of these tests, in the target directory of the build that runs
/// them (`CARGO_TARGET_DIR` included).
fn out_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chart-test");
    std::fs::create_dir_all(&dir).expect("the chart tests' directory");
    dir
}

/// Polls `check` every 250 ms until it returns `Some` or `within` passes.
/// `within` is a hang bound, never a speed requirement: the callers give
/// 120 s (180 s for a rollout) for what takes a few seconds even on a loaded
/// machine, and the loop returns as soon as `check` holds.
fn eventually<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
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
fn ensure_namespace(k: &Kubectl, name: &str, level: &str) {
    k.ok_stdin(
        &["apply", "--server-side", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n    pod-security.kubernetes.io/enforce: {level}\n"
        ),
    );
}

/// `text` indented by `n` spaces, line by line.
fn indent(text: &str, n: usize) -> String {
    text.lines().map(|l| format!("{:n$}{l}\n", "")).collect()
}

/// The object of `kind` named `name` in `docs`, if any.
fn find_doc<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}
