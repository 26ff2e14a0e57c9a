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

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use forewarn::policy::Policy;
use forewarn_harness::cluster::{Cluster, helm_bin, repo_root};
use serde_json::Value;

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

    /// Runs and panics on failure; returns stdout.
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
            Cluster::start(&name, 3).map_err(|e| format!("{e:#}"))
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

// ---------------------------------------------------------------------------
// Without a cluster

#[test]
fn chart_lints_strict_clean() {
    for extra in [vec![], vec!["-f".to_string(), all_features_values()]] {
        let chart = chart_dir();
        let mut args = vec!["lint", "--strict", chart.as_str()];
        args.extend(extra.iter().map(String::as_str));
        let out = helm(&args);
        println!("{}", out.stdout);
        assert!(
            out.ok,
            "helm lint --strict failed:\n{}{}",
            out.stdout, out.stderr
        );
        assert!(out.stdout.contains("0 chart(s) failed"), "{}", out.stdout);
        for bad in ["[WARNING]", "[ERROR]"] {
            assert!(
                !out.stdout.contains(bad),
                "helm lint reports {bad}:\n{}",
                out.stdout
            );
        }
    }
}

#[test]
fn chart_crd_is_the_generated_crd() {
    for file in [
        "scheduledevents.forewarn.dev.yaml",
        "scheduledeventreports.forewarn.dev.yaml",
        "virtualmachinereports.forewarn.dev.yaml",
    ] {
        let top = std::fs::read(repo_root().join("crds").join(file)).expect(file);
        let chart = std::fs::read(repo_root().join("charts/forewarn/crds").join(file)).expect(file);
        assert!(
            top == chart,
            "charts/forewarn/crds/{file} differs from crds/: run `make generate manifests`"
        );
    }
}

#[test]
fn manifests_match_the_chart_defaults() {
    let out = run(
        Path::new("bash"),
        &[&repo_root()
            .join("hack/render-manifests.sh")
            .to_string_lossy()],
        &[("HELM", helm_bin().as_path())],
        None,
    );
    assert!(out.ok, "hack/render-manifests.sh failed: {}", out.stderr);
    let file = std::fs::read_to_string(repo_root().join("manifests/forewarn.yaml"))
        .expect("manifests/forewarn.yaml");
    assert!(
        out.stdout == file,
        "manifests/forewarn.yaml is not the chart rendered with its defaults: run `make manifests`"
    );
    // And it is what `helm template` gives, plus the namespace.
    let kinds: Vec<String> = documents(&file)
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    for k in [
        "Namespace",
        "CustomResourceDefinition",
        "DaemonSet",
        "Deployment",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(
            kinds.iter().any(|x| x == k),
            "no {k} in manifests/forewarn.yaml: {kinds:?}"
        );
    }
}

#[test]
fn values_schema_rejects_wrong_values() {
    let chart = chart_dir();
    for (set, complaint) in [
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("controller.replicaCount=0", "/controller/replicaCount"),
        (
            "controller.policy.defaultAction=Evict",
            "/controller/policy/defaultAction",
        ),
        ("agent.pollInterval=soon", "/agent/pollInterval"),
        (
            "admissionPolicy.validationActions={Allow}",
            "/admissionPolicy/validationActions",
        ),
        ("agent.metrics.port=70000", "/agent/metrics/port"),
        (
            "admissionPolicy.acknowledgeUnconfinedAgents=maybe",
            "/admissionPolicy/acknowledgeUnconfinedAgents",
        ),
        ("nosuchvalue=1", "nosuchvalue"),
        (
            "controller.policy.minGraceSeconds=0",
            "/controller/policy/minGraceSeconds",
        ),
        (
            "controller.policy.releaseDelaySeconds=3601",
            "/controller/policy/releaseDelaySeconds",
        ),
        (
            "controller.policy.staleAfterSeconds=2419201",
            "/controller/policy/staleAfterSeconds",
        ),
        (
            "controller.policy.trustAnyAgent=maybe",
            "/controller/policy/trustAnyAgent",
        ),
        ("agent.windows.enabled=maybe", "/agent/windows/enabled"),
        (
            "agent.windows.runAsUserName=",
            "/agent/windows/runAsUserName",
        ),
        ("agent.windows.hostProcess=false", "/agent/windows"),
    ] {
        let out = helm(&["template", RELEASE, &chart, "--set", set]);
        assert!(!out.ok, "--set {set} was accepted");
        assert!(
            out.stderr.contains(complaint),
            "--set {set}: the error does not name {complaint}: {}",
            out.stderr
        );
    }
}

#[test]
fn schema_has_no_remote_ref_and_every_value_is_documented() {
    let schema = std::fs::read_to_string(repo_root().join("charts/forewarn/values.schema.json"))
        .expect("values.schema.json");
    let v: Value = serde_json::from_str(&schema).expect("values.schema.json is JSON");
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k == "$ref" {
                        out.push(x.to_string());
                    }
                    refs(x, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    refs(&v, &mut found);
    assert!(
        found.iter().all(|r| r.starts_with("\"#")),
        "remote $ref in values.schema.json: {found:?}"
    );
    // Every value of values.yaml has a `# --` comment right above it; a
    // value so documented covers its whole block (e.g. `resources:`), while
    // a key without one is a mere section whose keys must be documented.
    let values = std::fs::read_to_string(repo_root().join("charts/forewarn/values.yaml"))
        .expect("values.yaml");
    let lines: Vec<&str> = values.lines().collect();
    let mut undocumented = Vec::new();
    let mut documented_block: Option<usize> = None;
    for (i, line) in lines.iter().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if let Some(d) = documented_block {
            if indent > d || t.starts_with('-') {
                continue;
            }
            documented_block = None;
        }
        let Some((key, rest)) = t.split_once(':') else {
            continue;
        };
        let doc = lines[..i]
            .iter()
            .rev()
            .take_while(|l| l.trim_start().starts_with('#'))
            .any(|l| l.trim_start().starts_with("# --"));
        if doc {
            documented_block = Some(indent);
        } else if !rest.trim().is_empty() {
            undocumented.push(format!("line {}: {key}", i + 1));
        }
    }
    assert!(
        undocumented.is_empty(),
        "values without a comment: {undocumented:#?}"
    );
}

/// `helm template` with `values` (YAML) as a values file and `extra`
/// arguments; the policy the ConfigMap then holds, as the controller loads it.
fn render_policy(name: &str, values: &str, extra: &[&str]) -> Policy {
    let file = out_dir().join(format!("{name}.values.yaml"));
    std::fs::write(&file, values).expect("values file");
    let file = file.to_string_lossy().into_owned();
    let mut args = vec!["-f", file.as_str()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-s", "templates/policy-configmap.yaml"]);
    let docs = documents(&render(&args));
    let text = docs[0]["data"]["policy.yaml"]
        .as_str()
        .expect("policy.yaml in the ConfigMap");
    Policy::parse(text, "ConfigMap policy.yaml")
        .unwrap_or_else(|e| panic!("{name}: the rendered policy does not load: {e}\n{text}"))
}

/// `text` indented by `n` spaces, line by line.
fn indent(text: &str, n: usize) -> String {
    text.lines().map(|l| format!("{:n$}{l}\n", "")).collect()
}

/// The policy example at the top of src/policy.rs (the format the README
/// points to), every key of the policy file given: as `controller.policy`
/// the chart takes it, and the controller loads what it renders as it
/// loads the example itself.
#[test]
fn policy_example_with_every_key_renders_and_loads() {
    let src = std::fs::read_to_string(repo_root().join("src/policy.rs")).expect("src/policy.rs");
    let example: String = src
        .lines()
        .map_while(|l| l.strip_prefix("//!"))
        .skip_while(|l| l.trim() != "```yaml")
        .skip(1)
        .take_while(|l| l.trim() != "```")
        .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l)))
        .collect();
    let expected = Policy::parse(&example, "src/policy.rs example")
        .unwrap_or_else(|e| panic!("the example does not load: {e}\n{example}"));
    for key in [
        "rules:",
        "minGraceSeconds:",
        "evictUnmanagedPods:",
        "releaseDelaySeconds:",
        "trustAnyAgent:",
        "drainLeadTimeSeconds:",
        "orphanedAfterSeconds:",
        "staleAfterSeconds:",
        "acknowledgeTimeoutSeconds:",
        "evictAfterAcknowledgement:",
        "excludeFromLoadBalancers:",
    ] {
        assert!(example.contains(key), "the example lacks {key}:\n{example}");
    }
    let values = format!("controller:\n  policy:\n{}", indent(&example, 4));
    let rendered = render_policy("policy-example", &values, &[]);
    assert_eq!(rendered, expected);
    // The same with some keys set on the command line, as an upgrade would.
    let rendered = render_policy(
        "policy-example-set",
        &values,
        &[
            "--set",
            "controller.policy.trustAnyAgent=true",
            "--set",
            "controller.policy.evictUnmanagedPods={Terminate,Preempt}",
            "--set",
            "controller.policy.retention=7d",
        ],
    );
    assert!(rendered.trust_any_agent);
    assert_eq!(rendered.evict_unmanaged_pods, ["Terminate", "Preempt"]);
    assert_eq!(rendered.retention, Duration::from_secs(7 * 86400));
}

/// The README's policy settings (`key` (default) in "Default policy")
/// and the values of its install and upgrade commands are all accepted,
/// and the settings are the controller's defaults.
#[test]
fn readme_policy_settings_and_install_values_are_accepted() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let start = readme
        .find("Default policy:")
        .expect("README: Default policy");
    let para = &readme[start..];
    let para = &para[..para.find("\n\n").unwrap_or(para.len())];
    // "`drainMarginSeconds` (5)", "`retention` (24h, every final phase)".
    let mut settings = Vec::new();
    for piece in para.split('`').collect::<Vec<_>>().windows(2) {
        let (key, after) = (piece[0], piece[1].trim_start());
        let Some(rest) = after.strip_prefix('(') else {
            continue;
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        let value = rest
            .split([')', ',', ':'])
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        settings.push((key.to_string(), value));
    }
    assert!(
        settings.len() >= 10,
        "README: fewer policy settings than expected: {settings:?}"
    );
    let values: String = settings
        .iter()
        .map(|(k, v)| format!("    {k}: {v}\n"))
        .collect();
    let rendered = render_policy(
        "readme-policy",
        &format!("controller:\n  policy:\n{values}"),
        &[],
    );
    let defaults = Policy {
        rules: rendered.rules.clone(),
        ..Policy::default()
    };
    assert_eq!(
        rendered, defaults,
        "README's policy settings are not the defaults: {settings:?}"
    );

    // Every `--set` of the README's helm commands (and the registry its
    // comment suggests).
    // Commands continued over lines (a trailing `\`) are read whole; the
    // placeholders `<your registry>` and `<digest>` take example values.
    let mut sets: Vec<String> = vec!["image.repository=registry.example.com/forewarn".into()];
    let mut commands: Vec<String> = Vec::new();
    let mut current = String::new();
    for line in readme.lines().map(str::trim) {
        let part = line.split(" #").next().unwrap_or_default();
        if current.is_empty()
            && !(part.starts_with("helm install") || part.starts_with("helm upgrade"))
        {
            continue;
        }
        match part.strip_suffix('\\') {
            Some(more) => current.push_str(more),
            None => {
                current.push_str(part);
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    for command in &commands {
        let words: Vec<&str> = command.split_whitespace().collect();
        for pair in words.windows(2) {
            if pair[0] == "--set" {
                sets.push(
                    pair[1]
                        .replace("<your registry>", "registry.example.com")
                        .replace("sha256:<digest>", &digest),
                );
            }
        }
    }
    // And the digest pin its prose suggests (`--set image.digest=sha256:...`).
    sets.push(format!("image.digest={digest}"));
    for key in [
        "crds.upgradeJob.enabled=",
        "metrics.serviceMonitor.enabled=",
    ] {
        assert!(
            sets.iter().any(|s| s.starts_with(key)),
            "README's helm commands set no {key}: {sets:?}"
        );
    }
    for set in &sets {
        render(&["--set", set]);
    }
    // And each command's settings together.
    for command in &commands {
        let words: Vec<&str> = command.split_whitespace().collect();
        let mut args: Vec<String> = Vec::new();
        for pair in words.windows(2) {
            if pair[0] == "--set" {
                args.push("--set".into());
                args.push(
                    pair[1]
                        .replace("<your registry>", "registry.example.com")
                        .replace("sha256:<digest>", &digest),
                );
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        render(&args);
    }
}

/// A misspelt policy key fails `helm template` (so `helm install`) with
/// the key and where it is, at the top level and in a rule, from `--set`
/// and from a values file alike.
#[test]
fn misspelt_policy_key_is_refused_naming_it() {
    let chart = chart_dir();
    let file = out_dir().join("misspelt-policy.values.yaml");
    std::fs::write(
        &file,
        "controller:\n  policy:\n    releaseDelaySecond: 10\n",
    )
    .expect("values file");
    let file = file.to_string_lossy().into_owned();
    let cases: [(&[&str], &str, &str); 3] = [
        (
            &["--set", "controller.policy.trustAnyAgnet=true"],
            "trustAnyAgnet",
            "/controller/policy",
        ),
        (
            &[
                "--set",
                "controller.policy.rules[0].action=Drain",
                "--set",
                "controller.policy.rules[0].evenType=Reboot",
            ],
            "evenType",
            "/controller/policy/rules/0",
        ),
        (&["-f", &file], "releaseDelaySecond", "/controller/policy"),
    ];
    for (extra, key, at) in cases {
        let mut args = vec![
            "template",
            RELEASE,
            chart.as_str(),
            "--api-versions",
            VAP_API,
        ];
        args.extend_from_slice(extra);
        let out = helm(&args);
        assert!(!out.ok, "{extra:?}: the misspelt key {key} was accepted");
        for needle in [key, at, "not allowed"] {
            assert!(
                out.stderr.contains(needle),
                "{extra:?}: the refusal does not say {needle:?}: {}",
                out.stderr
            );
        }
        // The controller refuses it as well.
        let yaml = format!("{key}: 1\n");
        assert!(Policy::parse(&yaml, "p").is_err(), "{key} loads");
    }
}

/// `retention` takes what the controller's humantime parser takes, and
/// refuses what it refuses.
#[test]
fn policy_retention_takes_what_the_controller_takes() {
    let chart = chart_dir();
    for (retention, ok) in [
        ("24h", true),
        ("1h 30m", true),
        ("1h30m", true),
        ("1.5h", true),
        ("7days", true),
        ("2 weeks", true),
        ("1M", true),
        ("9years", true),
        ("500ms", true),
        ("soon", false),
        ("24", false),
        ("-1h", false),
        ("1fortnight", false),
        ("1H", false),
        ("", false),
    ] {
        let yaml = format!("retention: \"{retention}\"\n");
        assert_eq!(
            Policy::parse(&yaml, "p").is_ok(),
            ok,
            "the controller on retention {retention:?}"
        );
        let set = format!("controller.policy.retention={retention}");
        let out = helm(&[
            "template",
            RELEASE,
            &chart,
            "--api-versions",
            VAP_API,
            "--set-string",
            &set,
        ]);
        assert_eq!(
            out.ok, ok,
            "helm on retention {retention:?}: {}",
            out.stderr
        );
        if !ok {
            assert!(
                out.stderr.contains("/controller/policy/retention"),
                "{retention:?}: {}",
                out.stderr
            );
        }
    }
}

/// A ServiceMonitor and a PodMonitor would scrape every pod twice: the
/// schema refuses both, naming them; either alone renders.
#[test]
fn service_monitor_and_pod_monitor_are_mutually_exclusive() {
    let chart = chart_dir();
    let both = [
        "template",
        RELEASE,
        chart.as_str(),
        "--api-versions",
        VAP_API,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
    ];
    let out = helm(&both);
    assert!(!out.ok, "both monitors rendered");
    assert!(
        out.stderr.contains("/metrics/podMonitor/enabled"),
        "the refusal does not name the value: {}",
        out.stderr
    );
    // Without the schema (--skip-schema-validation), the template says why.
    let mut skip = both.to_vec();
    skip.push("--skip-schema-validation");
    let out = helm(&skip);
    assert!(!out.ok, "both monitors rendered without the schema");
    assert!(
        out.stderr.contains(
            "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled are both true"
        ),
        "{}",
        out.stderr
    );
    for (set, kind) in [
        ("metrics.serviceMonitor.enabled=true", "ServiceMonitor"),
        ("metrics.podMonitor.enabled=true", "PodMonitor"),
    ] {
        let kinds: Vec<String> = documents(&render(&["--set", set]))
            .iter()
            .filter_map(|d| d["kind"].as_str().map(str::to_string))
            .filter(|k| k.ends_with("Monitor"))
            .collect();
        assert_eq!(kinds, [kind, kind], "--set {set}");
    }
}

/// The alerts render only where their metrics are scraped (a monitor on, or
/// the user says their own scrape configuration does it): otherwise
/// `absent()` and friends would fire for lack of data right after install.
/// Rendered, the rule is files/alerts.yaml with the release's agent
/// DaemonSet name, and both monitors set the `job` the rules select on;
/// every alert links its README runbook, which exists.
#[test]
fn alerts_render_only_where_scraped_and_follow_the_release_name() {
    let rule_of = |extra: &[&str]| -> Option<Value> {
        let mut args = vec!["--set", "metrics.prometheusRule.force=true"];
        args.extend_from_slice(extra);
        documents(&render(&args))
            .into_iter()
            .find(|d| d["kind"] == "PrometheusRule")
    };
    assert!(
        rule_of(&[]).is_none(),
        "a rule rendered with nothing scraped"
    );
    assert!(
        rule_of(&[
            "--set",
            "metrics.prometheusRule.enabled=false,metrics.podMonitor.enabled=true"
        ])
        .is_none(),
        "a rule rendered while disabled"
    );
    let file: Value = serde_yaml::from_str::<Value>(
        &std::fs::read_to_string(repo_root().join("charts/forewarn/files/alerts.yaml"))
            .expect("read alerts.yaml"),
    )
    .expect("alerts.yaml");
    for set in [
        "metrics.serviceMonitor.enabled=true",
        "metrics.podMonitor.enabled=true",
        "metrics.prometheusRule.scrapedWithoutMonitors=true",
    ] {
        let rule = rule_of(&["--set", set]).unwrap_or_else(|| panic!("no rule with {set}"));
        assert_eq!(
            rule["spec"], file,
            "with {set}, the rule is not alerts.yaml"
        );
    }
    // Another release name: only the DaemonSet matcher follows it.
    let rule = rule_of(&[
        "--set",
        "metrics.podMonitor.enabled=true,fullnameOverride=edge",
    ])
    .expect("a rule");
    let text = serde_json::to_string(&rule["spec"]).expect("json");
    assert!(
        text.contains(r#"daemonset=~\"edge-agent|edge-agent-windows\""#),
        "{text}"
    );
    assert!(!text.contains(r#"daemonset=~\"forewarn-agent"#), "{text}");
    assert_eq!(
        text.replace("edge-agent", "forewarn-agent"),
        serde_json::to_string(&file).expect("json")
    );
    // The monitors give every target the job the rules select on.
    for (set, kind, endpoints) in [
        (
            "metrics.serviceMonitor.enabled=true",
            "ServiceMonitor",
            "endpoints",
        ),
        (
            "metrics.podMonitor.enabled=true",
            "PodMonitor",
            "podMetricsEndpoints",
        ),
    ] {
        let monitors: Vec<Value> =
            documents(&render(&["--set", set, "--set", "fullnameOverride=edge"]))
                .into_iter()
                .filter(|d| d["kind"] == kind)
                .collect();
        assert_eq!(monitors.len(), 2, "{kind}");
        for m in monitors {
            let role = if m["metadata"]["name"] == "edge-agent" {
                "agent"
            } else {
                "controller"
            };
            assert_eq!(
                m["spec"][endpoints][0]["relabelings"],
                serde_json::json!([{"action": "replace", "targetLabel": "job", "replacement": format!("forewarn-{role}")}]),
                "{kind} {}",
                m["metadata"]["name"]
            );
        }
    }
    // Every alert's runbook is a README heading.
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README");
    let rules = file["groups"][0]["rules"].as_array().expect("rules");
    assert!(rules.len() >= 15, "{} alerts", rules.len());
    for r in rules {
        let name = r["alert"].as_str().expect("alert name");
        let url = r["annotations"]["runbook_url"].as_str().unwrap_or_default();
        assert_eq!(
            url,
            format!(
                "https://github.com/forewarn/forewarn/blob/main/README.md#{}",
                name.to_lowercase()
            ),
            "{name}"
        );
        assert!(
            readme.lines().any(|l| l == format!("### {name}")),
            "no README runbook heading for {name}"
        );
    }
}

/// The container args of the workload `kind` in `docs`.
fn workload_args(docs: &[Value], kind: &str) -> Vec<String> {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

/// The object of `kind` named `name` in `docs`, if any.
fn find_doc<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

/// `metrics.auth.enabled`: on, both workloads run with
/// `--metrics-auth=kubernetes`, both roles may create TokenReviews and
/// SubjectAccessReviews, the ClusterRole `forewarn-metrics-reader` allows
/// `get` on `/metrics` (bound to the scraper's ServiceAccount when named),
/// the ServiceMonitors send Prometheus's own token and the PodMonitors the
/// chart's scraper token Secret (or the one named). Off (the default), none
/// of it renders.
#[test]
fn metrics_auth_renders_the_flag_rbac_reader_and_monitor_tokens_only_when_on() {
    let review_rule = |docs: &[Value], role: &str, group: &str, resource: &str| {
        find_doc(docs, "ClusterRole", &format!("forewarn-{role}"))
            .unwrap_or_else(|| panic!("no ClusterRole forewarn-{role}"))["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .any(|r| {
                r["apiGroups"] == serde_json::json!([group])
                    && r["resources"] == serde_json::json!([resource])
                    && r["verbs"] == serde_json::json!(["create"])
            })
    };
    let endpoints = |docs: &[Value], kind: &str| -> Vec<Value> {
        let field = if kind == "ServiceMonitor" {
            "endpoints"
        } else {
            "podMetricsEndpoints"
        };
        let found: Vec<Value> = docs
            .iter()
            .filter(|d| d["kind"] == kind)
            .map(|d| d["spec"][field][0].clone())
            .collect();
        assert_eq!(found.len(), 2, "one {kind} per role");
        found
    };
    let flag = "--metrics-auth=kubernetes".to_string();

    // Off: nothing of it, with either monitor.
    for monitor in ["serviceMonitor", "podMonitor"] {
        let docs = documents(&render(&[
            "--set",
            &format!("metrics.{monitor}.enabled=true"),
        ]));
        for kind in ["DaemonSet", "Deployment"] {
            assert!(
                !workload_args(&docs, kind)
                    .iter()
                    .any(|a| a.contains("metrics-auth")),
                "{kind}"
            );
        }
        for role in ["agent", "controller"] {
            assert!(!review_rule(
                &docs,
                role,
                "authentication.k8s.io",
                "tokenreviews"
            ));
            assert!(!review_rule(
                &docs,
                role,
                "authorization.k8s.io",
                "subjectaccessreviews"
            ));
        }
        let names: Vec<&str> = docs
            .iter()
            .filter_map(|d| d["metadata"]["name"].as_str())
            .collect();
        assert!(
            !names
                .iter()
                .any(|n| n.contains("metrics-reader") || n.contains("metrics-scraper")),
            "{names:?}"
        );
        let kind = if monitor == "serviceMonitor" {
            "ServiceMonitor"
        } else {
            "PodMonitor"
        };
        for e in endpoints(&docs, kind) {
            for key in ["bearerTokenFile", "authorization", "bearerTokenSecret"] {
                assert!(e.get(key).is_none(), "{kind} sends a token: {e}");
            }
        }
    }

    // On, with the ServiceMonitor and kube-prometheus-stack's Prometheus.
    let docs = documents(&render(&[
        "--set",
        "metrics.auth.enabled=true",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.auth.scraper.serviceAccount.name=kube-prometheus-stack-prometheus",
        "--set",
        "metrics.auth.scraper.serviceAccount.namespace=monitoring",
    ]));
    for kind in ["DaemonSet", "Deployment"] {
        assert!(workload_args(&docs, kind).contains(&flag), "{kind}");
    }
    for role in ["agent", "controller"] {
        assert!(
            review_rule(&docs, role, "authentication.k8s.io", "tokenreviews"),
            "{role}"
        );
        assert!(
            review_rule(&docs, role, "authorization.k8s.io", "subjectaccessreviews"),
            "{role}"
        );
    }
    let reader = find_doc(&docs, "ClusterRole", "forewarn-metrics-reader").expect("reader role");
    assert_eq!(
        reader["rules"],
        serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
    let binding =
        find_doc(&docs, "ClusterRoleBinding", "forewarn-metrics-reader").expect("reader binding");
    assert_eq!(binding["roleRef"]["name"], "forewarn-metrics-reader");
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "kube-prometheus-stack-prometheus", "namespace": "monitoring"}])
    );
    for e in endpoints(&docs, "ServiceMonitor") {
        assert_eq!(
            e["bearerTokenFile"], "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "{e}"
        );
    }
    assert!(find_doc(&docs, "Secret", "forewarn-metrics-scraper-token").is_none());

    // On, with the PodMonitor: the chart's scraper token, or the one named.
    let docs = documents(&render(&[
        "--set",
        "metrics.auth.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
    ]));
    assert!(
        find_doc(&docs, "ClusterRoleBinding", "forewarn-metrics-reader").is_none(),
        "a binding without a scraper named"
    );
    let secret = find_doc(&docs, "Secret", "forewarn-metrics-scraper-token").expect("token Secret");
    assert_eq!(secret["type"], "kubernetes.io/service-account-token");
    assert_eq!(
        secret["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "forewarn-metrics-scraper"
    );
    assert!(find_doc(&docs, "ServiceAccount", "forewarn-metrics-scraper").is_some());
    let scraper_binding =
        find_doc(&docs, "ClusterRoleBinding", "forewarn-metrics-scraper").expect("scraper binding");
    assert_eq!(
        scraper_binding["roleRef"]["name"],
        "forewarn-metrics-reader"
    );
    assert_eq!(
        scraper_binding["subjects"][0]["name"],
        "forewarn-metrics-scraper"
    );
    for e in endpoints(&docs, "PodMonitor") {
        assert_eq!(
            e["authorization"],
            serde_json::json!({"type": "Bearer", "credentials": {"name": "forewarn-metrics-scraper-token", "key": "token"}})
        );
    }
    let docs = documents(&render(&[
        "--set",
        "metrics.auth.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "metrics.auth.podMonitorToken.secretName=my-scraper-token",
        "--set",
        "metrics.auth.podMonitorToken.key=bearer",
    ]));
    assert!(find_doc(&docs, "Secret", "forewarn-metrics-scraper-token").is_none());
    assert!(find_doc(&docs, "ServiceAccount", "forewarn-metrics-scraper").is_none());
    for e in endpoints(&docs, "PodMonitor") {
        assert_eq!(
            e["authorization"]["credentials"],
            serde_json::json!({"name": "my-scraper-token", "key": "bearer"})
        );
    }

    // A scraper without its namespace, and wrong types, are refused.
    let chart = chart_dir();
    for (set, complaint) in [
        (
            "metrics.auth.scraper.serviceAccount.name=prometheus",
            "needs metrics.auth.scraper.serviceAccount.namespace",
        ),
        ("metrics.auth.enabled=maybe", "/metrics/auth/enabled"),
        ("metrics.auth.scraper.serviceAcount.name=x", "serviceAcount"),
        (
            "metrics.auth.podMonitorToken.key=",
            "/metrics/auth/podMonitorToken/key",
        ),
    ] {
        let out = helm(&[
            "template",
            RELEASE,
            &chart,
            "--api-versions",
            VAP_API,
            "--set",
            "metrics.auth.enabled=true",
            "--set",
            set,
        ]);
        assert!(!out.ok, "--set {set} was accepted");
        assert!(
            out.stderr.contains(complaint),
            "--set {set}: {}",
            out.stderr
        );
    }
}

/// Fails closed: without the admission policy in force (off, an API
/// server that does not serve it, or no Deny) the chart refuses to render,
/// saying why and what to set, unless the user acknowledges unconfined
/// agents; with it, the one policy and its binding are rendered, the
/// controller is told their name and may read those two only.
#[test]
fn chart_refuses_unconfined_agents_unless_acknowledged() {
    let chart = chart_dir();
    let ack = "admissionPolicy.acknowledgeUnconfinedAgents=true";
    let cases: [(&str, &[&str], &str); 3] = [
        (
            "admissionPolicy.enabled=false",
            &[
                "--api-versions",
                VAP_API,
                "--set",
                "admissionPolicy.enabled=false",
            ],
            "admissionPolicy.enabled is false",
        ),
        (
            "no ValidatingAdmissionPolicy API",
            &[],
            "the cluster does not serve the admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy API",
        ),
        (
            "validationActions without Deny",
            &[
                "--api-versions",
                VAP_API,
                "--set",
                "admissionPolicy.validationActions={Warn,Audit}",
            ],
            "admissionPolicy.validationActions has no Deny",
        ),
    ];
    for (what, extra, why) in cases {
        let mut args = vec!["template", RELEASE, chart.as_str(), "--namespace", NS];
        args.extend_from_slice(extra);
        let out = helm(&args);
        assert!(!out.ok, "{what}: rendered without the acknowledgement");
        for needle in [
            UNCONFINED,
            why,
            "admissionPolicy.acknowledgeUnconfinedAgents=true",
        ] {
            assert!(
                out.stderr.contains(needle),
                "{what}: the refusal does not say {needle:?}: {}",
                out.stderr
            );
        }
        // Acknowledged, it renders; the policy only where it can run.
        args.extend_from_slice(&["--set", ack]);
        let out = helm(&args);
        assert!(
            out.ok,
            "{what}: acknowledged, yet not rendered: {}",
            out.stderr
        );
        let docs = documents(&out.stdout);
        let vaps = docs
            .iter()
            .filter(|d| {
                d["kind"]
                    .as_str()
                    .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
            })
            .count();
        let controller_args = docs
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("the controller Deployment")["spec"]["template"]["spec"]["containers"][0]
            ["args"]
            .to_string();
        if what == "validationActions without Deny" {
            assert_eq!(vaps, 6, "{what}: the three policies and their bindings");
            assert!(
                controller_args.contains("--agent-policy="),
                "{what}: {controller_args}"
            );
        } else {
            assert_eq!(vaps, 0, "{what}: an admission policy rendered");
        }
        if what == "admissionPolicy.enabled=false" {
            // No policy to check: the controller exports the gauge as 0, and
            // may read no admission policy.
            assert!(
                !controller_args.contains("--agent-policy"),
                "{what}: {controller_args}"
            );
            let role = docs
                .iter()
                .find(|d| {
                    d["kind"] == "ClusterRole" && d["metadata"]["name"] == "forewarn-controller"
                })
                .expect("the controller's ClusterRole");
            assert!(
                !role["rules"]
                    .to_string()
                    .contains("admissionregistration.k8s.io"),
                "{what}: the controller may still read admission policies: {}",
                role["rules"]
            );
        }
    }

    // Confined (render() tells helm the cluster serves the API).
    let docs = documents(&render(&[]));
    let named = |kind: &str| -> Vec<String> {
        docs.iter()
            .filter(|d| d["kind"] == kind)
            .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(
        named("ValidatingAdmissionPolicy"),
        [AGENT_POLICY, CONTROLLER_POD_POLICY, DECISIONS_POLICY]
    );
    assert_eq!(
        named("ValidatingAdmissionPolicyBinding"),
        [AGENT_POLICY, CONTROLLER_POD_POLICY, DECISIONS_POLICY]
    );
    // The decisions policy spares exactly the controller's ServiceAccount
    // and covers the objects and their status.
    let decisions = docs
        .iter()
        .find(|d| {
            d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == DECISIONS_POLICY
        })
        .expect("the decisions policy")
        .to_string();
    assert!(
        decisions.contains("system:serviceaccount:forewarn:forewarn-controller"),
        "{decisions}"
    );
    assert!(decisions.contains("scheduledevents/status"), "{decisions}");
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .expect("binding");
    assert_eq!(binding["spec"]["policyName"], AGENT_POLICY);
    assert_eq!(
        binding["spec"]["validationActions"],
        serde_json::json!(["Deny"])
    );
    let dep = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the controller Deployment");
    let args: Vec<&str> = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let flag = format!("--agent-policy={AGENT_POLICY}");
    assert!(args.contains(&flag.as_str()), "{args:?}");
    let rules = |role: &str| -> Value {
        docs.iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == role)
            .unwrap_or_else(|| panic!("no ClusterRole {role}"))["rules"]
            .clone()
    };
    assert_eq!(
        rules("forewarn-agent"),
        serde_json::json!([
            {"apiGroups": ["forewarn.dev"], "resources": ["scheduledeventreports"], "verbs": ["create", "patch", "list", "watch"]},
            {"apiGroups": ["forewarn.dev"], "resources": ["virtualmachinereports"], "verbs": ["create", "patch"]},
            {"apiGroups": ["forewarn.dev"], "resources": ["scheduledevents"], "verbs": ["list", "watch"]},
            {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "resourceNames": ["scheduledeventreports.forewarn.dev", "virtualmachinereports.forewarn.dev"], "verbs": ["get"]}
        ])
    );
    let controller = rules("forewarn-controller");
    let admission: Vec<&Value> = controller
        .as_array()
        .expect("rules")
        .iter()
        .filter(|r| r["apiGroups"] == serde_json::json!(["admissionregistration.k8s.io"]))
        .collect();
    assert_eq!(
        admission,
        [&serde_json::json!({
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
            "resourceNames": [AGENT_POLICY],
            "verbs": ["get"]
        })]
    );
}

#[test]
fn policy_configmap_is_the_built_in_policy() {
    let docs = documents(&render(&["-s", "templates/policy-configmap.yaml"]));
    let text = docs[0]["data"]["policy.yaml"]
        .as_str()
        .expect("policy.yaml in the ConfigMap");
    let policy = Policy::parse(text, "ConfigMap policy.yaml")
        .unwrap_or_else(|e| panic!("the chart's policy does not load: {e}"));
    assert_eq!(
        policy,
        Policy::default(),
        "chart default policy != built-in default"
    );
    // The all-features policy loads too.
    let docs = documents(&render(&[
        "-f",
        &all_features_values(),
        "-s",
        "templates/policy-configmap.yaml",
    ]));
    let text = docs[0]["data"]["policy.yaml"]
        .as_str()
        .expect("policy.yaml");
    let p = Policy::parse(text, "ConfigMap policy.yaml").expect("all-features policy loads");
    assert_eq!(p.rules.len(), 2);
    assert_eq!(p.retention, Duration::from_secs(3600));
}

#[test]
fn workloads_run_the_documented_flags_and_security_context() {
    let docs = documents(&render(&[]));
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
            .clone()
    };
    let ds = find("DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(
        pod["tolerations"],
        serde_json::json!([{"operator": "Exists"}])
    );
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "ghcr.io/forewarn/forewarn:0.1.0");
    assert_eq!(c["command"][0], "/usr/local/bin/forewarn");
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // The agent serves its metrics on the node's own IP only: the port from --metrics-addr, the IP from the downward API.
    assert!(
        args.contains(&"agent")
            && args.contains(&"--metrics-addr=0.0.0.0:9101")
            && args.contains(&"--metrics-host=$(HOST_IP)"),
        "{args:?}"
    );
    assert_eq!(
        c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert_eq!(c["env"][1]["name"], "HOST_IP");
    assert_eq!(
        c["env"][1]["valueFrom"]["fieldRef"]["fieldPath"],
        "status.hostIP"
    );
    // Its VirtualMachineReport is owned by its pod.
    assert_eq!(
        (
            &c["env"][2]["name"],
            &c["env"][2]["valueFrom"]["fieldRef"]["fieldPath"]
        ),
        (
            &serde_json::json!("POD_NAME"),
            &serde_json::json!("metadata.name")
        )
    );
    assert_eq!(
        (
            &c["env"][3]["name"],
            &c["env"][3]["valueFrom"]["fieldRef"]["fieldPath"]
        ),
        (
            &serde_json::json!("POD_UID"),
            &serde_json::json!("metadata.uid")
        )
    );
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");

    let dep = find("Deployment");
    assert_eq!(dep["spec"]["replicas"], 2);
    let pod = &dep["spec"]["template"]["spec"];
    // The controller's pods use the pod network unless controller.hostNetwork.
    assert!(pod.get("hostNetwork").is_none(), "{pod}");
    assert!(pod.get("dnsPolicy").is_none(), "{pod}");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert!(
        pod["topologySpreadConstraints"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
    );
    let c = &pod["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for a in [
        "controller",
        "--metrics-addr=0.0.0.0:9102",
        "--policy-file=/etc/forewarn/policy.yaml",
    ] {
        assert!(args.contains(&a), "controller args lack {a}: {args:?}");
    }
    let env: Vec<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    // The glibc malloc settings of `controller.mallocEnv` (the bench's
    // scale part runs the controller with the same).
    assert_eq!(
        env,
        [
            "POD_NAME",
            "POD_NAMESPACE",
            "MALLOC_ARENA_MAX",
            "MALLOC_MMAP_THRESHOLD_",
            "MALLOC_TRIM_THRESHOLD_"
        ]
    );

    for (kind, pod) in [("DaemonSet", &ds), ("Deployment", &dep)] {
        let sc = &pod["spec"]["template"]["spec"]["containers"][0]["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{kind}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{kind}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{kind}");
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{kind}"
        );
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{kind}");
        assert_eq!(sc["runAsUser"], 65532, "{kind}");
    }
    assert!(docs.iter().any(|d| d["kind"] == "PodDisruptionBudget"));
}

/// securityContext fields the API server refuses in a pod whose `spec.os`
/// is windows (and which a HostProcess container cannot honour).
const LINUX_ONLY_SECURITY_FIELDS: [&str; 11] = [
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "fsGroup",
    "seccompProfile",
    "readOnlyRootFilesystem",
    "capabilities",
    "allowPrivilegeEscalation",
    "seLinuxOptions",
    "appArmorProfile",
    "privileged",
];

/// `agent.windows`: no Windows DaemonSet by default; with it on, a
/// HostProcess DaemonSet on Windows nodes that runs the Linux agent's flags,
/// environment and probes with its ServiceAccount, and no Linux-only
/// security field; the Linux DaemonSet stays on Linux nodes.
#[test]
fn windows_agents_render_only_when_enabled_as_host_process_pods() {
    let docs = documents(&render(&[]));
    assert!(
        find_doc(&docs, "DaemonSet", "forewarn-agent-windows").is_none(),
        "a Windows DaemonSet by default"
    );
    assert_eq!(
        docs.iter().filter(|d| d["kind"] == "DaemonSet").count(),
        1,
        "one DaemonSet by default"
    );

    // The Linux agents stay on Linux nodes whatever agent.nodeSelector says.
    let docs = documents(&render(&[
        "--set",
        "agent.windows.enabled=true",
        "--set-json",
        r#"agent.nodeSelector={"pool":"a","kubernetes.io/os":"windows"}"#,
    ]));
    let linux = find_doc(&docs, "DaemonSet", "forewarn-agent").expect("the Linux DaemonSet");
    assert_eq!(
        linux["spec"]["template"]["spec"]["nodeSelector"],
        serde_json::json!({"kubernetes.io/os": "linux", "pool": "a"})
    );
    let docs = documents(&render(&["--set", "agent.windows.enabled=true"]));
    let linux = find_doc(&docs, "DaemonSet", "forewarn-agent").expect("the Linux DaemonSet");
    let lpod = &linux["spec"]["template"]["spec"];
    assert_eq!(
        lpod["nodeSelector"],
        serde_json::json!({"kubernetes.io/os": "linux"})
    );
    let win =
        find_doc(&docs, "DaemonSet", "forewarn-agent-windows").expect("the Windows DaemonSet");
    let pod = &win["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["os"]["name"], "windows");
    assert_eq!(
        pod["nodeSelector"],
        serde_json::json!({"kubernetes.io/os": "windows"})
    );
    assert_eq!(pod["serviceAccountName"], lpod["serviceAccountName"]);
    assert_eq!(pod["serviceAccountName"], AGENT_SA);
    for k in [
        "tolerations",
        "priorityClassName",
        "dnsPolicy",
        "terminationGracePeriodSeconds",
        "automountServiceAccountToken",
    ] {
        assert_eq!(pod[k], lpod[k], "{k}");
    }
    let local_service = serde_json::json!({
        "hostProcess": true,
        "runAsUserName": "NT AUTHORITY\\Local service",
    });
    assert_eq!(
        pod["securityContext"],
        serde_json::json!({"windowsOptions": local_service})
    );
    let c = &pod["containers"][0];
    let lc = &lpod["containers"][0];
    assert_eq!(
        c["securityContext"],
        serde_json::json!({"windowsOptions": local_service})
    );
    for sc in [&pod["securityContext"], &c["securityContext"]] {
        for f in LINUX_ONLY_SECURITY_FIELDS {
            assert!(sc.get(f).is_none(), "{f} in {sc}");
        }
    }
    assert_eq!(
        c["command"],
        serde_json::json!(["$CONTAINER_SANDBOX_MOUNT_POINT/forewarn.exe"])
    );
    for k in [
        "image",
        "args",
        "env",
        "ports",
        "livenessProbe",
        "readinessProbe",
    ] {
        assert_eq!(c[k], lc[k], "{k}");
    }
    // Agent pods to the controller (src/controller/pods.rs) and to the
    // metrics Service: the same role labels, plus the selector's own.
    let labels = &win["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/component"], "agent");
    assert_eq!(labels["app.kubernetes.io/part-of"], "forewarn");
    assert_eq!(
        win["spec"]["selector"]["matchLabels"]["forewarn.dev/os"],
        "windows"
    );
    assert_eq!(linux["spec"]["selector"], {
        let d = documents(&render(&[]));
        find_doc(&d, "DaemonSet", "forewarn-agent").expect("Linux DaemonSet")["spec"]["selector"]
            .clone()
    });
    // `helm test` checks both DaemonSets, and may read both.
    let test = documents(&render(&[
        "--set",
        "agent.windows.enabled=true",
        "--show-only",
        "templates/tests/check-install.yaml",
    ]));
    let pod = test
        .iter()
        .find(|d| d["kind"] == "Pod")
        .expect("the test Pod");
    let args: Vec<String> = pod["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    assert!(
        args.contains(&"--agent-daemonset=forewarn-agent".to_string())
            && args.contains(&"--agent-daemonset=forewarn-agent-windows".to_string()),
        "{args:?}"
    );
    let role = test.iter().find(|d| d["kind"] == "Role").expect("Role");
    assert!(
        role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .any(|r| r["resourceNames"]
                == serde_json::json!(["forewarn-agent", "forewarn-agent-windows"])),
        "{role}"
    );
}

// ---------------------------------------------------------------------------
// On the cluster

/// Installs the minimal prometheus-operator CRDs (tests/chart-fixtures/).
fn install_monitoring_crds(k: &Kubectl) {
    let file = repo_root().join("tests/chart-fixtures/prometheus-operator-crds.yaml");
    k.ok(&["apply", "--server-side", "-f", &file.to_string_lossy()]);
    k.wait_established(&[
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/podmonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
    ]);
}

/// `kubectl apply --dry-run=server` of `yaml`; asserts every document was
/// accepted (one "(server dry run)" line each). Conflicts of field
/// ownership with an installed release do not matter here, hence
/// `--force-conflicts`.
fn dry_run_apply(k: &Kubectl, yaml: &str) -> Vec<String> {
    let expected = documents(yaml).len();
    let out = k.run(
        &[
            "apply",
            "--dry-run=server",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(yaml),
    );
    assert!(
        out.ok,
        "the API server rejected the chart: {}",
        out.stderr.trim()
    );
    let lines: Vec<String> = out
        .stdout
        .lines()
        .filter(|l| l.ends_with("(server dry run)"))
        .map(str::to_string)
        .collect();
    assert_eq!(
        lines.len(),
        expected,
        "not every object was accepted:\n{}",
        out.stdout
    );
    lines
}

#[test]
fn rendered_manifests_are_accepted_by_the_api_server() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    ensure_namespace(&k, NS, "privileged");
    install_monitoring_crds(&k);
    // Default values, CRD included (manifests/ is exactly this plus the namespace).
    let defaults = render(&["--include-crds"]);
    let lines = dry_run_apply(&k, &defaults);
    println!("defaults:\n{}", lines.join("\n"));
    let file =
        std::fs::read_to_string(repo_root().join("manifests/forewarn.yaml")).expect("manifests");
    dry_run_apply(&k, &file);
    // Every optional feature on.
    let all = render(&["--include-crds", "-f", &all_features_values()]);
    let lines = dry_run_apply(&k, &all);
    println!("all features:\n{}", lines.join("\n"));
    // The PodMonitor excludes the ServiceMonitor (values.schema.json).
    let pod_monitor = render(&[
        "--include-crds",
        "-f",
        &all_features_values(),
        "--set",
        "metrics.serviceMonitor.enabled=false",
        "--set",
        "metrics.podMonitor.enabled=true",
    ]);
    let pod_monitor_lines = dry_run_apply(&k, &pod_monitor);
    println!("with the PodMonitor:\n{}", pod_monitor_lines.join("\n"));
    for (kind, lines) in [
        ("servicemonitor", &lines),
        ("podmonitor", &pod_monitor_lines),
        ("prometheusrule", &lines),
        ("prometheusrule", &pod_monitor_lines),
        ("networkpolicy", &lines),
        ("validatingadmissionpolicy", &lines),
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("{kind}."))),
            "no {kind} among the accepted objects:\n{}",
            lines.join("\n")
        );
    }
}

/// Pod (JSON) from the pod template of the workload `kind` in `rendered`,
/// after creating its ServiceAccount in `ns` so that only Pod Security decides.
fn pod_from_template(k: &Kubectl, rendered: &str, kind: &str, name: &str, ns: &str) -> String {
    let docs = documents(rendered);
    let w = docs.iter().find(|d| d["kind"] == kind).expect("workload");
    let sa = w["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    let sa = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}});
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": ns, "labels": w["spec"]["template"]["metadata"]["labels"] },
        "spec": w["spec"]["template"]["spec"],
    });
    k.ok_stdin(&["apply", "-f", "-"], &sa.to_string());
    pod.to_string()
}

#[test]
fn controller_meets_pod_security_restricted_and_agent_needs_privileged() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    let ns = "psa-restricted";
    ensure_namespace(&k, ns, "restricted");
    let rendered = render(&[]);
    let controller = pod_from_template(&k, &rendered, "Deployment", "controller-psa", ns);
    let out = k.run(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&controller),
    );
    assert!(
        out.ok,
        "the controller pod violates Pod Security restricted: {}",
        out.stderr
    );
    // The CRD hook Job's pod too: it runs in the release namespace, like
    // the controller's.
    let job = pod_from_template(&k, &rendered, "Job", "crds-psa", ns);
    let out = k.run(&["create", "--dry-run=server", "-f", "-"], Some(&job));
    assert!(
        out.ok,
        "the CRD hook Job's pod violates Pod Security restricted: {}",
        out.stderr
    );
    let agent = pod_from_template(&k, &rendered, "DaemonSet", "agent-psa", ns);
    let out = k.run(&["create", "--dry-run=server", "-f", "-"], Some(&agent));
    assert!(!out.ok, "the agent pod was admitted under restricted");
    println!("agent under restricted: {}", out.stderr.trim());
    assert!(out.stderr.contains("hostNetwork"), "{}", out.stderr);
    // The README's label lets it in.
    let ns = "psa-privileged";
    ensure_namespace(&k, ns, "privileged");
    let agent = pod_from_template(&k, &rendered, "DaemonSet", "agent-psa", ns);
    let out = k.run(&["create", "--dry-run=server", "-f", "-"], Some(&agent));
    assert!(
        out.ok,
        "the agent pod is refused under privileged: {}",
        out.stderr
    );
}

/// `v` with every whole number as an integer: the API server stores the
/// generated CRD's `minimum: 1.0` as `1`.
fn same_numbers(v: &Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => v.clone(),
        },
        Value::Array(a) => Value::Array(a.iter().map(same_numbers).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), same_numbers(x)))
                .collect(),
        ),
        _ => v.clone(),
    }
}

/// The CRD upgrade step of the README and NOTES.txt (`helm show crds CHART |
/// kubectl apply --server-side --force-conflicts -f -`) replaces an older CRD that
/// `helm install` created, and the API server then serves the new schema.
#[test]
fn crd_upgrade_step_serves_the_new_schema() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    let crd_file = repo_root().join("charts/forewarn/crds/scheduledevents.forewarn.dev.yaml");
    let mut old: Value =
        serde_yaml::from_str(&std::fs::read_to_string(&crd_file).expect("CRD")).expect("CRD YAML");
    // The "old" CRD: without spec.resourceType, with an extra printer column.
    let spec_props = &mut old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"];
    assert!(
        spec_props
            .as_object_mut()
            .unwrap()
            .remove("resourceType")
            .is_some()
    );
    old["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "Old", "type": "string", "jsonPath": ".spec.eventId"}));
    // Created the way helm creates crds/ (a plain create, not an apply).
    k.run(
        &[
            "delete",
            "crd",
            "scheduledevents.forewarn.dev",
            "--wait=true",
        ],
        None,
    );
    k.ok_stdin(&["create", "-f", "-"], &old.to_string());
    k.wait_established(&["crd/scheduledevents.forewarn.dev"]);
    let event = r#"{"apiVersion":"forewarn.dev/v1alpha1","kind":"ScheduledEvent","metadata":{"name":"crd-upgrade-probe"},
        "spec":{"eventId":"crd-upgrade-probe","eventStatus":"Scheduled","eventType":"Reboot","resourceType":"VirtualMachine"}}"#;
    let before = eventually("old schema served", Duration::from_secs(120), || {
        let out = k.run(
            &["create", "--dry-run=server", "--validate=strict", "-f", "-"],
            Some(event),
        );
        (!out.ok && out.stderr.contains("resourceType")).then_some(out.stderr)
    });
    println!("old CRD refuses the new field: {}", before.trim());

    // The upgrade step, as NOTES.txt and the README give it: the chart's
    // own CRDs (`helm show crds CHART`), applied server-side.
    let crds = helm(&["show", "crds", &chart_dir()]);
    assert!(crds.ok, "helm show crds: {}", crds.stderr);
    assert!(
        crds.stdout.contains("name: scheduledevents.forewarn.dev")
            && crds
                .stdout
                .contains("name: scheduledeventreports.forewarn.dev"),
        "helm show crds prints both CRDs"
    );
    let step = k.ok_stdin(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &crds.stdout,
    );
    println!("upgrade step: {}", step.trim());
    // One object per CRD: `helm show crds` joins the files as they are, so
    // each must start a document of its own, or only the last one applies.
    for name in [
        "scheduledevents.forewarn.dev",
        "scheduledeventreports.forewarn.dev",
    ] {
        assert!(
            step.contains(&format!(
                "customresourcedefinition.apiextensions.k8s.io/{name}"
            )),
            "the upgrade step did not apply {name}: {step}"
        );
    }
    k.wait_established(&["crd/scheduledevents.forewarn.dev"]);
    // The stored CRD is the chart's, the extra column is gone...
    let stored = k.json(&["get", "crd", "scheduledevents.forewarn.dev"]);
    let new: Value = serde_yaml::from_str(&std::fs::read_to_string(&crd_file).unwrap()).unwrap();
    assert_eq!(
        same_numbers(&stored["spec"]["versions"][0]["schema"]),
        same_numbers(&new["spec"]["versions"][0]["schema"])
    );
    assert_eq!(
        stored["spec"]["versions"][0]["additionalPrinterColumns"],
        new["spec"]["versions"][0]["additionalPrinterColumns"]
    );
    // ... and the served schema (OpenAPI v3 and validation) is the new one.
    eventually("new schema served", Duration::from_secs(120), || {
        let openapi = k.run(
            &["get", "--raw", "/openapi/v3/apis/forewarn.dev/v1alpha1"],
            None,
        );
        let out = k.run(
            &["create", "--dry-run=server", "--validate=strict", "-f", "-"],
            Some(event),
        );
        (openapi.ok && openapi.stdout.contains("resourceType") && out.ok).then_some(())
    });
}

/// A CRD of `crds/` (`file`) as JSON, changed by `edit`.
fn crd_edited(file: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let text = std::fs::read_to_string(repo_root().join("crds").join(file)).expect("CRD");
    let mut v: Value = serde_yaml::from_str(&text).expect("CRD YAML");
    edit(&mut v);
    v
}

/// The `properties` of the schema of `crd` (JSON) at `path` (property
/// names; `[]` steps into array items).
fn props<'a>(crd: &'a mut Value, path: &[&str]) -> &'a mut serde_json::Map<String, Value> {
    let mut v = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for step in path {
        v = if *step == "[]" {
            &mut v["items"]
        } else {
            &mut v["properties"][*step]
        };
    }
    v["properties"].as_object_mut().expect("properties")
}

/// Installs `crd` (JSON) over the installed one: server-side, forced.
fn put_crd(k: &Kubectl, crd: &Value) {
    k.ok_stdin(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "chart-test-older-crd",
            "-f",
            "-",
        ],
        &crd.to_string(),
    );
}

/// The CRDs of `crds/`, put back as the harness installed them (on drop,
/// so that a failed test leaves the shared cluster's CRDs whole).
struct RestoreCrds(Kubectl);

impl RestoreCrds {
    fn now(&self) {
        let dir = repo_root().join("crds");
        self.0.ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &dir.to_string_lossy(),
        ]);
        self.0.wait_established(&[
            "crd/scheduledevents.forewarn.dev",
            "crd/scheduledeventreports.forewarn.dev",
            "crd/virtualmachinereports.forewarn.dev",
        ]);
    }
}

impl Drop for RestoreCrds {
    fn drop(&mut self) {
        self.now();
    }
}

/// The start-up check (src/crds.rs), with the chart's credentials: facing
/// CRDs older than the binary (a status field and a report field missing),
/// the controller and the agent exit non-zero with one error naming the
/// CRD, the field and the command that applies the new CRDs, before the
/// controller touches its Lease; with the current CRDs both go on. A token
/// without the chart's `get` on the CRDs is let through with a warning.
#[test]
fn processes_facing_older_crds_exit_naming_the_missing_field_and_the_command() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let restore = RestoreCrds(k.clone());
    let controller = token_kubeconfig(&k, "crd-check-controller", &token(&k, CONTROLLER_SA, None));
    let (pod, uid) = agent_pod_on(&k, "node-000000");
    let agent = token_kubeconfig(
        &k,
        "crd-check-agent",
        &token(&k, AGENT_SA, Some((&pod, &uid))),
    );
    // A Lease held by someone else: a controller that passes the check
    // stands by and reconciles nothing of the other tests' objects.
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "forewarn-controller", "namespace": NS},
        "spec": {"holderIdentity": "crd-check-holder", "leaseDurationSeconds": 3600,
                 "renewTime": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()},
    });
    k.run(
        &[
            "delete",
            "lease",
            "-n",
            NS,
            "forewarn-controller",
            "--ignore-not-found",
        ],
        None,
    );
    k.ok_stdin(&["create", "-f", "-"], &lease.to_string());
    let agent_args = [
        "agent",
        "--node-name",
        "node-000000",
        "--metrics-addr",
        "127.0.0.1:0",
        "--imds-url",
        "http://127.0.0.1:9/",
    ];

    put_crd(
        &k,
        &crd_edited("scheduledevents.forewarn.dev.yaml", |v| {
            props(v, &["status"])
                .remove("nodesNotListed")
                .expect("nodesNotListed");
        }),
    );
    put_crd(
        &k,
        &crd_edited("scheduledeventreports.forewarn.dev.yaml", |v| {
            props(v, &["spec", "report"])
                .remove("approvals")
                .expect("approvals");
        }),
    );
    let mut ctl = ControllerProc::start(&controller.kubeconfig, "crd-check-controller-older");
    let status = ctl
        .exit_within(Duration::from_secs(120))
        .unwrap_or_else(|| panic!("the controller runs on older CRDs:\n{}", ctl.log()));
    let log = ctl.log();
    println!("controller on older CRDs ({status}):\n{log}");
    assert!(!status.success(), "{log}");
    for want in [
        "CustomResourceDefinition scheduledevents.forewarn.dev is older than forewarn",
        "it lacks 1 field: status.nodesNotListed",
        "CustomResourceDefinition scheduledeventreports.forewarn.dev is older than forewarn",
        "it lacks 1 field: spec.report.approvals",
        "helm show crds forewarn-0.1.0.tgz | kubectl apply --server-side --force-conflicts -f -",
    ] {
        assert!(log.contains(want), "no {want:?} in:\n{log}");
    }
    assert!(!log.contains("forbidden"), "{log}");
    assert!(!log.contains("Lease"), "it went on to the Lease:\n{log}");
    let mut ag = ControllerProc::spawn(&agent.kubeconfig, "crd-check-agent-older", &agent_args);
    let status = ag
        .exit_within(Duration::from_secs(120))
        .unwrap_or_else(|| panic!("the agent runs on an older CRD:\n{}", ag.log()));
    let log = ag.log();
    println!("agent on older CRDs ({status}):\n{log}");
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("it lacks 1 field: spec.report.approvals"),
        "{log}"
    );
    assert!(
        log.contains("kubectl apply --server-side --force-conflicts"),
        "{log}"
    );
    // The agent checks the CRD it writes, not the controller's.
    assert!(
        !log.contains("scheduledevents.forewarn.dev is older"),
        "{log}"
    );

    // The current CRDs: both pass the check and run on.
    restore.now();
    let mut ctl = ControllerProc::start(&controller.kubeconfig, "crd-check-controller-current");
    let mut ag = ControllerProc::spawn(&agent.kubeconfig, "crd-check-agent-current", &agent_args);
    let passed = "The installed CRD has every field this version needs";
    eventually(
        "the controller passes the check",
        Duration::from_secs(120),
        || {
            (ctl.log().matches(passed).count() == 3 && ctl.log().contains("Waiting for leadership"))
                .then_some(())
        },
    );
    eventually(
        "the agent passes the check",
        Duration::from_secs(120),
        || ag.log().contains(passed).then_some(()),
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(ctl.exit_within(Duration::ZERO).is_none(), "{}", ctl.log());
    assert!(ag.exit_within(Duration::ZERO).is_none(), "{}", ag.log());
    drop((ctl, ag));

    // A token whose RBAC lacks the chart's rule: a warning, and it runs on.
    k.run(
        &["create", "serviceaccount", "-n", NS, "crd-check-no-rbac"],
        None,
    );
    let bare = token_kubeconfig(
        &k,
        "crd-check-no-rbac",
        &token(&k, "crd-check-no-rbac", None),
    );
    let mut ag = ControllerProc::spawn(&bare.kubeconfig, "crd-check-agent-no-rbac", &agent_args);
    eventually(
        "the agent warns that it cannot check",
        Duration::from_secs(120),
        || {
            ag.log()
                .contains("Cannot check the installed CRD")
                .then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(ag.exit_within(Duration::ZERO).is_none(), "{}", ag.log());
    drop(ag);
    k.run(
        &["delete", "serviceaccount", "-n", NS, "crd-check-no-rbac"],
        None,
    );
    k.run(
        &[
            "delete",
            "lease",
            "-n",
            NS,
            "forewarn-controller",
            "--ignore-not-found",
        ],
        None,
    );
}

/// The CRD hook's ServiceAccount and RBAC (helm creates them before its
/// Job), applied from `helm template`, and a kubeconfig with a
/// TokenRequest token of that ServiceAccount: what the Job's pod holds.
fn hook_credentials(k: &Kubectl, name: &str) -> Kubectl {
    ensure_namespace(k, NS, "privileged");
    let docs = documents(&render(&["--show-only", "templates/crds-upgrade-job.yaml"]));
    for d in docs.iter().filter(|d| d["kind"] != "Job") {
        k.ok_stdin(&["apply", "--server-side", "-f", "-"], &d.to_string());
    }
    token_kubeconfig(k, name, &token(k, "forewarn-crds", None))
}

/// `forewarn crds apply` (what the hook Job runs) with `who`'s credentials.
fn crds_apply(who: &Kubectl) -> Out {
    run(
        Path::new(env!("CARGO_BIN_EXE_forewarn")),
        &["crds", "apply", "--timeout", "60s"],
        &[
            ("KUBECONFIG", who.kubeconfig.as_path()),
            ("RUST_LIB_BACKTRACE", Path::new("0")),
        ],
        None,
    )
}

/// (manager, operation) of each managedFields entry of `obj`.
fn managers(obj: &Value) -> Vec<(String, String)> {
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

/// The CRD hook's `forewarn crds apply`, with nothing but the hook's RBAC
/// (a TokenRequest token of its ServiceAccount), over older CRDs as Helm
/// leaves them (the reports CRD absent; the events CRD created by a plain
/// create, without `status.nodesNotListed` and with a field since
/// removed): it creates the one, replaces the other's schema whole (the
/// removed field gone), under its field manager, waits until both are
/// established, and the new fields work; run again, it changes nothing.
/// The hook's token may do nothing else to CRDs.
#[test]
fn crds_apply_with_the_hook_credentials_installs_the_new_crds() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    let restore = RestoreCrds(k.clone());
    let hook = hook_credentials(&k, "crds-hook");
    for (verb, what, allowed) in [
        ("create", "customresourcedefinitions", "yes"),
        (
            "get",
            "customresourcedefinitions/scheduledevents.forewarn.dev",
            "yes",
        ),
        (
            "patch",
            "customresourcedefinitions/scheduledeventreports.forewarn.dev",
            "yes",
        ),
        (
            "delete",
            "customresourcedefinitions/scheduledevents.forewarn.dev",
            "no",
        ),
        (
            "update",
            "customresourcedefinitions/scheduledevents.forewarn.dev",
            "no",
        ),
        (
            "patch",
            "customresourcedefinitions/servicemonitors.monitoring.coreos.com",
            "no",
        ),
        ("list", "customresourcedefinitions", "no"),
        ("get", "scheduledevents", "no"),
    ] {
        let out = hook.run(&["auth", "can-i", verb, what], None);
        assert_eq!(out.stdout.trim(), allowed, "the hook may {verb} {what}?");
    }

    // The older CRDs, as `helm install` of an earlier chart leaves them.
    k.ok(&[
        "delete",
        "crd",
        "scheduledeventreports.forewarn.dev",
        "virtualmachinereports.forewarn.dev",
        "scheduledevents.forewarn.dev",
        "--wait=true",
    ]);
    let older = crd_edited("scheduledevents.forewarn.dev.yaml", |v| {
        props(v, &["status"])
            .remove("nodesNotListed")
            .expect("nodesNotListed");
        props(v, &["spec"]).insert(
            "removedSince".into(),
            serde_json::json!({"type": "string", "description": "gone in the new CRD"}),
        );
    });
    k.ok_stdin(&["create", "-f", "-"], &older.to_string());
    k.wait_established(&["crd/scheduledevents.forewarn.dev"]);

    let out = crds_apply(&hook);
    println!("forewarn crds apply:\n{}{}", out.stdout, out.stderr);
    assert!(
        out.ok,
        "forewarn crds apply failed:\n{}{}",
        out.stdout, out.stderr
    );
    let log = format!("{}{}", out.stdout, out.stderr);
    assert!(
        log.contains("crd=scheduledevents.forewarn.dev applied=Updated")
            && log.contains("crd=scheduledeventreports.forewarn.dev applied=Created")
            && log.contains("crd=virtualmachinereports.forewarn.dev applied=Created"),
        "{log}"
    );
    assert_eq!(log.matches("The CRD is established").count(), 3, "{log}");
    let versions = || -> Vec<String> {
        [
            "scheduledevents.forewarn.dev",
            "scheduledeventreports.forewarn.dev",
            "virtualmachinereports.forewarn.dev",
        ]
        .iter()
        .map(|name| {
            let crd = k.json(&["get", "crd", name, "--show-managed-fields"]);
            assert!(
                managers(&crd).contains(&("forewarn-crds".into(), "Apply".into())),
                "{name}: no forewarn-crds apply in {:?}",
                managers(&crd)
            );
            crd["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
    };
    let first = versions();
    // The stored schemas are this version's, whole: the removed field gone.
    for file in [
        "scheduledevents.forewarn.dev.yaml",
        "scheduledeventreports.forewarn.dev.yaml",
        "virtualmachinereports.forewarn.dev.yaml",
    ] {
        let want = crd_edited(file, |_| {});
        let name = want["metadata"]["name"].as_str().unwrap();
        let stored = k.json(&["get", "crd", name]);
        assert_eq!(
            same_numbers(&stored["spec"]["versions"][0]["schema"]),
            same_numbers(&want["spec"]["versions"][0]["schema"]),
            "{name}: the stored schema is not this version's"
        );
    }
    // The new fields work: a report is accepted, a status with
    // nodesNotListed is stored as written.
    eventually("the new schema served", Duration::from_secs(120), || {
        let report = report_yaml(
            "c0000000-0000-4000-8000-00000000c0de",
            "node-000000",
            "vm-0",
            "Reboot",
            "Scheduled",
            &["vm-0"],
        );
        let out = k.run(
            &["create", "--dry-run=server", "--validate=strict", "-f", "-"],
            Some(&report),
        );
        out.ok.then_some(())
    });
    k.run(
        &[
            "delete",
            "scheduledevent",
            "c0000000-0000-4000-8000-00000000c0de",
            "--ignore-not-found",
        ],
        None,
    );
    k.ok_stdin(
        &["create", "-f", "-"],
        &sev_yaml("c0000000-0000-4000-8000-00000000c0de", "Scheduled", "vm-0"),
    );
    apply_status(
        &c.kubeconfig,
        "c0000000-0000-4000-8000-00000000c0de",
        serde_json::json!({"phase": "Draining", "nodesNotListed": {"count": 7, "drained": 2}}),
        "chart-test",
    )
    .expect("status with nodesNotListed");
    let ev = k.json(&[
        "get",
        "scheduledevent",
        "c0000000-0000-4000-8000-00000000c0de",
    ]);
    assert_eq!(
        ev["status"]["nodesNotListed"],
        serde_json::json!({"count": 7, "drained": 2}),
        "{}",
        ev["status"]
    );
    k.ok(&[
        "delete",
        "scheduledevent",
        "c0000000-0000-4000-8000-00000000c0de",
    ]);

    // Again: nothing to do.
    let out = crds_apply(&hook);
    let log = format!("{}{}", out.stdout, out.stderr);
    assert!(out.ok, "{log}");
    assert_eq!(log.matches("applied=Unchanged").count(), 3, "{log}");
    assert_eq!(versions(), first, "a second apply changed the CRDs");

    for kind in ["clusterrolebinding", "clusterrole"] {
        k.run(
            &["delete", kind, "forewarn-crds", "--ignore-not-found"],
            None,
        );
    }
    k.run(
        &[
            "delete",
            "serviceaccount",
            "-n",
            NS,
            "forewarn-crds",
            "--ignore-not-found",
        ],
        None,
    );
    drop(restore);
}

/// The chart of the previous release, `tests/chart-fixtures/previous-release`
/// (`hack/snapshot-previous-chart.sh`: `charts/forewarn` of 55729a8, the
/// commit before the reports CRD was added; no release tags exist).
fn previous_chart_dir() -> String {
    repo_root()
        .join("tests/chart-fixtures/previous-release")
        .to_string_lossy()
        .into_owned()
}

/// An upgrade from the previous release with an event in
/// progress. The previous chart is installed (its `crds/`: the events CRD
/// of that version, no reports CRD); a platform Redeploy of node-000001's
/// VM is in progress as that version left it (the object its agent
/// created, with its `spec.reports` entry, the status its controller
/// wrote while draining, the node cordoned, tainted and recorded in
/// `forewarn.dev/cordoned-for`, the agents' `forewarn.dev/vm-name`
/// annotations; the nodes carry Azure providerIDs, as AKS nodes do). Then
/// the upgrade as the chart does it: the CRD hook's `forewarn crds apply`
/// with the hook's own ServiceAccount token (the hook Job's command; KWOK
/// runs no container), `helm upgrade` to `charts/forewarn` with the hook
/// on (Helm creates and deletes the hook's objects; kwok marks the Job's
/// pod Succeeded without running it), and HEAD's agents and controller
/// with TokenRequest tokens of the chart's ServiceAccounts. Nothing is lost (the same
/// object, adopted and taken to Completed), no node is left cordoned (the
/// node stays held until the event is over, then released: without a
/// providerID it would be released until its agent reports, since the
/// earlier `forewarn.dev/vm-name` annotation is no longer read), and the new
/// fields work: the reports CRD exists and the agents' reports are in it,
/// the approval's `appearance` and `digest` (not in the previous schema,
/// and which an agent needs to send the approval) are stored, and so is
/// `nodesNotListed`.
#[test]
fn upgrade_from_the_previous_release_with_an_event_in_progress() {
    use forewarn_harness::run::{run_scenario, summary};
    const ID: &str = "9E1F2A3B-4C5D-4E6F-8A7B-9C0D1E2F3A08";
    const NODE: &str = "node-000001";
    const VM: &str = "aks-nodepool1-27351046-vmss_1";
    let name = ID.to_ascii_lowercase();
    // A cluster of its own: the test removes our CRDs and installs another
    // release, and gives the nodes Azure providerIDs (as AKS nodes have;
    // immutable once set), which the shared cluster's nodes must not have
    // (other tests state other VMs on them).
    let _turn = turn();
    let c = Cluster::start(UPGRADE_CLUSTER, 3)
        .unwrap_or_else(|e| panic!("the upgrade test's cluster could not start: {e:#}"));
    let k = admin(&c);
    let kubeconfig = c.kubeconfig.to_string_lossy().into_owned();
    let t0 = Instant::now();
    let step = |what: &str| println!("[upgrade test +{:.1}s] {what}", t0.elapsed().as_secs_f64());

    // As the previous release leaves a cluster: none of our CRDs before its
    // `helm install` (which creates its own, as it did then).
    k.ok(&[
        "delete",
        "crd",
        "scheduledevents.forewarn.dev",
        "scheduledeventreports.forewarn.dev",
        "virtualmachinereports.forewarn.dev",
        "--wait=true",
    ]);
    for i in 0..3 {
        let provider = format!(
            "azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachineScaleSets/aks-nodepool1-27351046-vmss/virtualMachines/{i}"
        );
        k.ok(&[
            "patch",
            "node",
            &format!("node-00000{i}"),
            "--type=merge",
            "-p",
            &serde_json::json!({"spec": {"providerID": provider}}).to_string(),
        ]);
    }
    step("helm install of the previous chart");
    ensure_namespace(&k, NS, "privileged");
    let previous = previous_chart_dir();
    // Pods of 1 s grace, so that the upgrade's rollout does not wait 30 s
    // per old agent pod (KWOK keeps a deleted pod until its grace ends);
    // the new pods get the chart's defaults.
    let out = helm(&[
        "install",
        RELEASE,
        &previous,
        "--namespace",
        NS,
        "--kubeconfig",
        &kubeconfig,
        "--set",
        "agent.terminationGracePeriodSeconds=1",
        "--set",
        "controller.terminationGracePeriodSeconds=1",
        "--wait",
        "--timeout",
        "180s",
    ]);
    assert!(
        out.ok,
        "helm install of the previous chart:\n{}{}",
        out.stdout, out.stderr
    );
    let chart = k.json(&["get", "crd", "scheduledevents.forewarn.dev"]);
    assert!(
        chart["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
            .get("nodesNotListed")
            .is_none(),
        "the previous chart's CRD has nodesNotListed"
    );
    assert!(
        !k.run(&["get", "crd", "scheduledeventreports.forewarn.dev"], None)
            .ok,
        "the previous chart installed a reports CRD"
    );
    assert!(
        !k.run(&["get", "crd", "virtualmachinereports.forewarn.dev"], None)
            .ok,
        "the previous chart installed a VM reports CRD"
    );

    // The event in progress, as the previous version wrote it: the object
    // created by the first agent (field manager forewarn-agent), each
    // agent's own entry of spec.reports (server-side apply as
    // forewarn-agent-<node>), the controller's status (server-side apply as
    // forewarn-controller), the hold on the node (below, once the workload
    // runs) and the agents' VM annotations.
    step("the event in progress, as the previous version wrote it");
    let now = chrono::Utc::now();
    let at = |secs: i64| {
        (now + chrono::Duration::seconds(secs))
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    let spec = serde_json::json!({
        "eventId": ID, "eventType": "Redeploy", "eventStatus": "Scheduled",
        "eventSource": "Platform", "resourceType": "VirtualMachine", "resources": [VM],
        "notBefore": at(40), "durationSeconds": -1,
        "description": "Virtual machine is being redeployed to a different host.",
        "appearance": 1,
    });
    let object = serde_json::json!({
        "apiVersion": "forewarn.dev/v1alpha1", "kind": "ScheduledEvent",
        "metadata": {"name": name}, "spec": spec,
    });
    k.ok_stdin(
        &["create", "--field-manager", "forewarn-agent", "-f", "-"],
        &object.to_string(),
    );
    // The previous `resources_digest`: SHA-256 of the lower-cased names, one
    // a line, its first 8 bytes in hex.
    let entry = serde_json::json!({
        "apiVersion": "forewarn.dev/v1alpha1", "kind": "ScheduledEvent",
        "metadata": {"name": name},
        "spec": {"reports": [{"node": NODE, "vm": VM, "named": true, "eventStatus": "Scheduled",
                              "appearance": 1, "resourcesDigest": "a254b2e791357a7f"}]},
    });
    k.ok_stdin(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            &format!("forewarn-agent-{NODE}"),
            "-f",
            "-",
        ],
        &entry.to_string(),
    );
    let old_status = serde_json::json!({
        "phase": "Draining", "action": "DrainAndApprove", "nodesDrained": "0/1",
        "nodes": [{"name": NODE, "vmName": VM, "cordonedByUs": true, "alreadyCordoned": false,
                   "podsRemaining": 2}],
        "firstSeen": at(-10), "appearance": 1,
        "conditions": [{"type": "Drained", "status": "False", "reason": "Draining",
                        "message": "0/1 affected nodes drained", "lastTransitionTime": at(-10),
                        "observedGeneration": 1}],
    });
    apply_status(&c.kubeconfig, &name, old_status, "forewarn-controller")
        .expect("the previous status");
    for i in 0..3 {
        k.ok(&[
            "annotate",
            "node",
            &format!("node-00000{i}"),
            &format!("forewarn.dev/vm-name=aks-nodepool1-27351046-vmss_{i}"),
            "--overwrite",
        ]);
    }
    let before = k.json(&["get", "scheduledevent", &name]);
    assert_eq!(
        before["spec"]["reports"][0]["node"], NODE,
        "{}",
        before["spec"]
    );
    assert_eq!(
        before["status"]["phase"], "Draining",
        "{}",
        before["status"]
    );
    let uid = before["metadata"]["uid"].as_str().expect("uid").to_string();

    // The upgrade. First what the pre-upgrade hook Job runs, with the
    // hook's RBAC and ServiceAccount token; then `helm upgrade` with the
    // hook on: on KWOK, Helm creates the hook's ServiceAccount, RBAC and Job,
    // waits for the Job (whose pod kwok's pod-complete stage marks
    // Succeeded without running it) and deletes them, which shows the
    // hook's objects, weights and delete policy work with Helm, not the
    // container (the real-node chart test runs that).
    step("the hook's forewarn crds apply");
    let hook = hook_credentials(&k, "upgrade-crds-hook");
    let out = crds_apply(&hook);
    println!(
        "forewarn crds apply (the hook's command):\n{}{}",
        out.stdout, out.stderr
    );
    assert!(out.ok, "forewarn crds apply:\n{}{}", out.stdout, out.stderr);
    step("helm upgrade to HEAD's chart");
    let chart = chart_dir();
    let out = helm(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--kubeconfig",
        &kubeconfig,
        "--wait",
        "--timeout",
        "240s",
    ]);
    assert!(
        out.ok,
        "helm upgrade to HEAD:\n{}{}",
        out.stdout, out.stderr
    );
    println!("{}", out.stdout);
    for (kind, ns) in [
        ("job", Some(NS)),
        ("serviceaccount", Some(NS)),
        ("clusterrole", None),
        ("clusterrolebinding", None),
    ] {
        let mut args = vec!["get", kind, "forewarn-crds"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let out = k.run(&args, None);
        assert!(
            !out.ok && out.stderr.contains("NotFound"),
            "the hook's {kind} is left: {}",
            out.stdout
        );
    }
    // Nothing lost: the same object, its status as the previous version
    // left it.
    let after = k.json(&["get", "scheduledevent", &name]);
    assert_eq!(after["metadata"]["uid"], uid.as_str());
    assert_eq!(after["status"]["phase"], "Draining", "{}", after["status"]);
    println!("the event after the upgrade: {}", after);
    // The new agents' pods (their tokens are bound to them) are the only ones.
    eventually(
        "one agent pod per node, none terminating",
        Duration::from_secs(180),
        || {
            let pods = k.json(&[
                "get",
                "pods",
                "-n",
                NS,
                "-l",
                "app.kubernetes.io/component=agent",
            ]);
            let items = pods["items"].as_array().cloned().unwrap_or_default();
            (items.len() == 3
                && items
                    .iter()
                    .all(|p| p["metadata"]["deletionTimestamp"].is_null()))
            .then_some(())
        },
    );

    // HEAD's agents and controller, with the chart's credentials, on the
    // event in progress.
    step("HEAD's agents and controller");
    let mut opts = chart_run_options(&k, "chart-upgrade", "forewarn-controller", false);
    opts.scenario = repo_root().join("tests/fixtures/lifecycle-upgrade.yaml");
    opts.keep_objects = true;
    opts.prior_holds = vec![(NODE.into(), name.clone())];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = rt
        .block_on(run_scenario(&c, &opts))
        .unwrap_or_else(|e| panic!("the event after the upgrade: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    assert!(
        report.ok(),
        "the event after the upgrade:\n{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    // The node was held from the start (the previous version's hold) to
    // the event's end, and no node is cordoned now.
    let finished = report
        .imds_log
        .iter()
        .find(|e| e.event_id.eq_ignore_ascii_case(ID) && e.what == "Finished")
        .map(|e| e.time)
        .expect("the event ran and ended");
    let changes: Vec<&(chrono::DateTime<chrono::Utc>, String, bool)> = report
        .node_changes
        .iter()
        .filter(|(_, n, _)| n == NODE)
        .collect();
    println!("{NODE} (time, unschedulable): {changes:?}; IMDS finished at {finished}");
    assert_eq!(
        changes.first().map(|c| c.2),
        Some(true),
        "{NODE} not held when the harness began to watch: {changes:?}"
    );
    assert!(
        changes
            .iter()
            .all(|(t, _, cordoned)| *cordoned || *t >= finished),
        "{NODE} was released before the event was over: {changes:?}"
    );
    // And before the harness watched: the controller released it once,
    // after the event was over (its log, RFC 3339 times first).
    let log =
        std::fs::read_to_string(report.log_dir.join("controller.log")).expect("controller log");
    let releases: Vec<chrono::DateTime<chrono::Utc>> = log
        .lines()
        .filter(|l| l.contains(&format!("Uncordoned {NODE}:")))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(
        releases.len() == 1 && releases[0] >= finished,
        "{NODE} released at {releases:?}, the event over at {finished}"
    );
    for i in 0..3 {
        let node = k.json(&["get", "node", &format!("node-00000{i}")]);
        assert!(
            node["spec"]["unschedulable"].is_null() || node["spec"]["unschedulable"] == false,
            "{}",
            node["spec"]
        );
        assert!(
            node["metadata"]["annotations"]["forewarn.dev/cordoned-for"].is_null(),
            "{}",
            node["metadata"]
        );
        assert!(
            !node["spec"]["taints"]
                .to_string()
                .contains("forewarn.dev/scheduled-event"),
            "{}",
            node["spec"]
        );
    }
    // The same object, adopted and finished, with the new fields stored.
    let ev = k.json(&["get", "scheduledevent", &name]);
    println!("the event at the end: {ev}");
    assert_eq!(
        ev["metadata"]["uid"],
        uid.as_str(),
        "the object was created anew"
    );
    let st = &ev["status"];
    assert_eq!(st["phase"], "Completed", "{st}");
    assert_eq!(st["approval"]["sentBy"], NODE, "{st}");
    assert_eq!(st["approval"]["appearance"], 1, "{st}");
    assert!(
        st["approval"]["digest"].is_string(),
        "no approval digest: {st}"
    );
    assert!(
        ev["spec"].get("reports").is_none(),
        "spec.reports kept: {}",
        ev["spec"]
    );
    let report_obj = k.json(&["get", "scheduledeventreport", &format!("{name}.{NODE}")]);
    assert_eq!(
        report_obj["spec"]["report"]["eventId"], ID,
        "{}",
        report_obj["spec"]
    );
    apply_status(
        &c.kubeconfig,
        &name,
        serde_json::json!({"nodesNotListed": {"count": 3, "drained": 3}}),
        "chart-test",
    )
    .expect("nodesNotListed");
    let ev = k.json(&["get", "scheduledevent", &name]);
    assert_eq!(
        ev["status"]["nodesNotListed"]["count"], 3,
        "{}",
        ev["status"]
    );
    if let Err(e) = c.stop() {
        println!("stopping {UPGRADE_CLUSTER}: {e:#}");
    }
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
fn token_kubeconfig(admin: &Kubectl, name: &str, token: &str) -> Kubectl {
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
fn token(k: &Kubectl, sa: &str, pod: Option<(&str, &str)>) -> String {
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
fn install(k: &Kubectl, c: &Cluster) {
    install_with(k, c, &[]);
}

/// Installs (or upgrades) the release with default values and `extra`
/// arguments (e.g. `--set`), and waits for it.
fn install_with(k: &Kubectl, c: &Cluster, extra: &[&str]) {
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
fn agent_pod_on(k: &Kubectl, node: &str) -> (String, String) {
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

fn annotation(k: &Kubectl, node: &str) -> Option<String> {
    let n = k.json(&["get", "node", node]);
    n["metadata"]["annotations"][VM_ANNOTATION]
        .as_str()
        .map(str::to_string)
}

fn merge_patch(key: &str, value: &str) -> String {
    format!(r#"{{"metadata":{{"annotations":{{"{key}":"{value}"}}}}}}"#)
}

/// Server-side apply of `status` on the ScheduledEvent `name` (status
/// subresource, field manager `manager`, forced), with the credentials
/// of `kubeconfig`: exactly the request the agent and controller make.
fn apply_status(kubeconfig: &Path, name: &str, status: Value, manager: &str) -> Result<(), String> {
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

/// A JSON merge patch of the cluster-scoped object `name` of `resource`
/// (group, version, kind, plural) with the credentials of `kubeconfig`,
/// sent as the product sends its patches: with no read of the object
/// first (`kubectl patch` reads it, which neither role may).
fn merge_patch_as(
    kubeconfig: &Path,
    resource: (&str, &str, &str, &str),
    name: &str,
    body: Value,
) -> Result<(), String> {
    use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
    let (group, version, kind, plural) = resource;
    let ar = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = forewarn_harness::cluster::client_for(kubeconfig)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let api: Api<DynamicObject> = Api::all_with(client, &ar);
        api.patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(|_| ())
            .map_err(|e| match e {
                kube::Error::Api(s) => format!("{} ({}): {}", s.reason, s.code, s.message),
                e => e.to_string(),
            })
    })
}

/// A JSON merge patch of the pod `name` in `ns` with the credentials of
/// `kubeconfig`, as the controller writes a notice (field manager
/// `forewarn-controller`, no read first).
fn pod_merge_patch_as(kubeconfig: &Path, ns: &str, name: &str, body: Value) -> Result<(), String> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = forewarn_harness::cluster::client_for(kubeconfig)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let params = PatchParams {
            field_manager: Some(forewarn::api::CONTROLLER_MANAGER.into()),
            ..PatchParams::default()
        };
        Api::<Pod>::namespaced(client, ns)
            .patch(name, &params, &Patch::Merge(&body))
            .await
            .map(|_| ())
            .map_err(|e| match e {
                kube::Error::Api(s) => format!("{} ({}): {}", s.reason, s.code, s.message),
                e => e.to_string(),
            })
    })
}

/// The resource rows of `kubectl auth can-i --list`: (resource with its
/// group, resource names joined by spaces) to verbs. A row reads `resource
/// [non-resource URLs] [resource names] [verbs]`; rows of the same resource
/// and names are merged, non-resource URL rows (indented) left out.
fn can_i_rules(
    list: &str,
) -> std::collections::BTreeMap<(String, String), std::collections::BTreeSet<String>> {
    let mut rules = std::collections::BTreeMap::new();
    for line in list.lines() {
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let Some((resource, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let groups: Vec<Vec<&str>> = rest
            .split('[')
            .skip(1)
            .map(|g| {
                g.split(']')
                    .next()
                    .unwrap_or_default()
                    .split_whitespace()
                    .collect()
            })
            .collect();
        let [_, names, verbs] = groups.as_slice() else {
            continue;
        };
        rules
            .entry((resource.to_string(), names.join(" ")))
            .or_insert_with(std::collections::BTreeSet::new)
            .extend(verbs.iter().map(|v| v.to_string()));
    }
    rules
}

/// `helm install`, then the chart's ServiceAccounts with TokenRequest tokens:
/// each may do what its role needs and nothing more.
#[test]
fn installed_chart_confines_each_service_account() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let mut record = String::new();

    // What the release created.
    for (kind, name) in [
        ("daemonset", "forewarn-agent"),
        ("deployment", "forewarn-controller"),
        ("serviceaccount", AGENT_SA),
        ("serviceaccount", CONTROLLER_SA),
        ("configmap", "forewarn-policy"),
        ("service", "forewarn-agent-metrics"),
        ("service", "forewarn-controller-metrics"),
        ("poddisruptionbudget", "forewarn-controller"),
        ("role", "forewarn-controller-lease"),
        ("rolebinding", "forewarn-controller-lease"),
    ] {
        k.ok(&["get", "-n", NS, kind, name]);
    }
    for (kind, name) in [
        ("clusterrole", "forewarn-agent"),
        ("clusterrole", "forewarn-controller"),
        ("clusterrolebinding", "forewarn-agent"),
        ("clusterrolebinding", "forewarn-controller"),
        ("validatingadmissionpolicy", AGENT_POLICY),
        ("validatingadmissionpolicybinding", AGENT_POLICY),
        ("validatingadmissionpolicy", CONTROLLER_POD_POLICY),
        ("validatingadmissionpolicybinding", CONTROLLER_POD_POLICY),
        ("validatingadmissionpolicy", DECISIONS_POLICY),
        ("validatingadmissionpolicybinding", DECISIONS_POLICY),
        ("crd", "scheduledevents.forewarn.dev"),
        ("crd", "scheduledeventreports.forewarn.dev"),
        ("crd", "virtualmachinereports.forewarn.dev"),
    ] {
        k.ok(&["get", kind, name]);
    }
    // The agent-reports policy, and the controller's on pods: the only
    // writes RBAC cannot narrow enough.
    let vaps = k.json(&[
        "get",
        "validatingadmissionpolicies",
        "-l",
        &format!("app.kubernetes.io/instance={RELEASE}"),
    ]);
    let names: Vec<&str> = vaps["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [AGENT_POLICY, DECISIONS_POLICY, CONTROLLER_POD_POLICY],
        "the release's admission policies"
    );
    // The API server type-checked each policy's CEL against the real
    // schema (the CRD, the Pod) and found nothing to warn about.
    for policy in [AGENT_POLICY, CONTROLLER_POD_POLICY, DECISIONS_POLICY] {
        let status = eventually("policy type-checked", Duration::from_secs(120), || {
            let p = k.json(&["get", "validatingadmissionpolicy", policy]);
            (p["status"]["observedGeneration"] == p["metadata"]["generation"])
                .then(|| p["status"].clone())
        });
        assert!(
            status["typeChecking"]["expressionWarnings"].is_null(),
            "{policy}: type-checking warnings: {}",
            status["typeChecking"]
        );
    }
    let ds = k.json(&["get", "-n", NS, "daemonset", "forewarn-agent"]);
    assert_eq!(
        ds["status"]["numberReady"], 3,
        "one agent per node: {}",
        ds["status"]
    );
    let dep = k.json(&["get", "-n", NS, "deployment", "forewarn-controller"]);
    assert_eq!(dep["status"]["readyReplicas"], 2, "{}", dep["status"]);

    let nodes = ["node-000000", "node-000001", "node-000002"];
    let (agent_pod, agent_uid) = agent_pod_on(&k, nodes[0]);
    let agent = token_kubeconfig(
        &k,
        "agent",
        &token(&k, AGENT_SA, Some((&agent_pod, &agent_uid))),
    );
    let ctl_pods = k.json(&[
        "get",
        "pods",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/component=controller",
    ]);
    let ctl_pod = &ctl_pods["items"][0]["metadata"];
    let controller = token_kubeconfig(
        &k,
        "controller",
        &token(
            &k,
            CONTROLLER_SA,
            Some((
                ctl_pod["name"].as_str().unwrap(),
                ctl_pod["uid"].as_str().unwrap(),
            )),
        ),
    );
    let unbound_agent = token_kubeconfig(&k, "agent-unbound", &token(&k, AGENT_SA, None));

    // The fact the admission policy rests on: a pod-bound token carries the
    // node of the pod in the user's extra info.
    let who = agent.json(&["auth", "whoami"]);
    let info = &who["status"]["userInfo"];
    record += &format!(
        "agent token (bound to pod {agent_pod} on {}): {info}\n\n",
        nodes[0]
    );
    assert_eq!(
        info["username"],
        format!("system:serviceaccount:{NS}:{AGENT_SA}")
    );
    assert_eq!(
        info["extra"]["authentication.kubernetes.io/node-name"],
        serde_json::json!([nodes[0]]),
        "no node name in the pod-bound token: {info}"
    );
    let who = unbound_agent.json(&["auth", "whoami"]);
    assert!(
        who["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"].is_null(),
        "an unbound token carries a node name: {}",
        who["status"]["userInfo"]
    );

    // --- agent: its own node's reports, nothing else. Agents report, the
    // controller decides: no ScheduledEvent, no status, no Node.
    let denials = std::cell::RefCell::new(Vec::new());
    let deny = |who: &Kubectl, what: &str, args: &[&str], expect: &str| {
        let msg = who.denied(args);
        assert!(
            msg.contains(expect),
            "{what}: refused, but not for the expected reason ({expect}): {msg}"
        );
        denials.borrow_mut().push(format!("{what}:\n  {msg}"));
    };
    // Refused by RBAC (403 Forbidden: the role grants no such verb), before
    // any admission policy is asked.
    // RBAC's refusal of `verb`, or of the read kubectl makes first (`get`).
    let forbid = |who: &Kubectl, what: &str, args: &[&str], verb: &str, resource: &str| {
        let msg = who.denied(args);
        let refused = |v: &str| msg.contains(&format!("cannot {v} resource \"{resource}\""));
        assert!(
            refused(verb) || refused("get"),
            "{what}: refused, but not by RBAC (cannot {verb} resource \"{resource}\"): {msg}"
        );
        denials.borrow_mut().push(format!("{what}:\n  {msg}"));
    };
    let file = |name: &str, text: &str| {
        let path = out_dir().join(name);
        std::fs::write(&path, text).expect("write a request body");
        path.to_string_lossy().into_owned()
    };

    // Nodes: nothing at all (the controller maps VMs to nodes itself).
    forbid(
        &agent,
        "agent reads its own Node",
        &["get", "node", nodes[0]],
        "get",
        "nodes",
    );
    forbid(
        &agent,
        "agent annotates its own Node",
        &[
            "patch",
            "node",
            nodes[0],
            "--type=merge",
            "-p",
            &merge_patch(VM_ANNOTATION, "vm-chart-0"),
        ],
        "patch",
        "nodes",
    );
    forbid(
        &agent,
        "agent annotates another Node",
        &[
            "patch",
            "node",
            nodes[1],
            "--type=merge",
            "-p",
            &merge_patch(VM_ANNOTATION, "vm-chart-0"),
        ],
        "patch",
        "nodes",
    );
    let node_apply = file(
        "agent-node-apply.yaml",
        &format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {}\n  annotations:\n    {VM_ANNOTATION}: vm-chart-0\n",
            nodes[0]
        ),
    );
    forbid(
        &agent,
        "agent applies its own Node (server-side apply)",
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=forewarn-agent",
            "-f",
            &node_apply,
        ],
        "patch",
        "nodes",
    );
    forbid(
        &agent,
        "agent patches its own Node's status",
        &[
            "patch",
            "node",
            nodes[0],
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[]}}"#,
        ],
        "patch",
        "nodes/status",
    );
    let new_node = file(
        "agent-node-create.yaml",
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: chart-forged-node\n",
    );
    forbid(
        &agent,
        "agent creates a Node",
        &["create", "-f", &new_node],
        "create",
        "nodes",
    );
    forbid(
        &agent,
        "agent cordons its own node",
        &["cordon", nodes[0]],
        "get",
        "nodes",
    );
    forbid(
        &agent,
        "agent taints its own node",
        &["taint", "node", nodes[0], "forewarn.dev/x=y:NoSchedule"],
        "get",
        "nodes",
    );
    forbid(
        &unbound_agent,
        "agent token not bound to a pod annotates a Node",
        &[
            "patch",
            "node",
            nodes[0],
            "--type=merge",
            "-p",
            &merge_patch(VM_ANNOTATION, "vm-x"),
        ],
        "patch",
        "nodes",
    );
    let n0 = k.json(&["get", "node", nodes[0]]);
    assert!(
        n0["spec"]["unschedulable"].is_null() && n0["spec"]["taints"].is_null(),
        "{}",
        n0["spec"]
    );
    for n in [nodes[0], nodes[1]] {
        assert_eq!(annotation(&k, n), None, "{n} annotated by the agent");
    }
    assert!(
        !k.run(&["get", "node", "chart-forged-node"], None).ok,
        "the agent created a Node"
    );

    // A pod to evict.
    ensure_namespace(&k, "chart-victims", "baseline");
    k.ok_stdin(&["apply", "-f", "-"], "apiVersion: v1\nkind: Pod\nmetadata:\n  name: victim\n  namespace: chart-victims\nspec:\n  containers:\n  - name: c\n    image: example.invalid/app:1\n");
    let eviction = r#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"victim","namespace":"chart-victims"}}"#;
    let eviction_file = out_dir().join("eviction.json");
    std::fs::write(&eviction_file, eviction).unwrap();
    let ev = eviction_file.to_string_lossy().into_owned();
    deny(
        &agent,
        "agent evicts a pod",
        &[
            "create",
            "--raw",
            "/api/v1/namespaces/chart-victims/pods/victim/eviction",
            "-f",
            &ev,
        ],
        "forbidden",
    );
    deny(
        &agent,
        "agent reads secrets",
        &["get", "secrets", "-n", NS],
        "forbidden",
    );

    // A ScheduledEvent with the controller's status.
    let sev = "c0000000-0000-4000-8000-0000000000c7";
    k.run(
        &["delete", "scheduledevent", sev, "--ignore-not-found"],
        None,
    );
    for n in nodes {
        k.run(
            &[
                "delete",
                "scheduledeventreport",
                &format!("{sev}.{n}"),
                "--ignore-not-found",
            ],
            None,
        );
    }
    k.ok_stdin(&["create", "-f", "-"], &format!(
        r#"{{"apiVersion":"forewarn.dev/v1alpha1","kind":"ScheduledEvent","metadata":{{"name":"{sev}"}},
           "spec":{{"eventId":"{sev}","eventStatus":"Scheduled","eventType":"Reboot","resources":["vm-chart-1"]}}}}"#));
    k.ok(&[
        "patch",
        "scheduledevent",
        sev,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Draining","approval":{"reason":"waiting for the drain"}}}"#,
    ]);
    // Listing and watching events stays allowed: the agent sends the
    // approvals the controller decides, read from a watch of each event
    // (a field selector on its name). It never reads one by name.
    agent.ok(&["get", "scheduledevents"]);
    agent.ok(&[
        "get",
        "scheduledevents",
        "--field-selector",
        &format!("metadata.name={sev}"),
    ]);
    forbid(
        &agent,
        "agent reads a ScheduledEvent by name (get)",
        &["get", "scheduledevent", sev],
        "get",
        "scheduledevents",
    );

    // ScheduledEvents: no create, update, patch (server-side apply is a
    // patch) or delete, and nothing on their status.
    let forged = file(
        "agent-sev-create.yaml",
        &sev_yaml(&format!("{sev}-2"), "Scheduled", "vm-chart-1"),
    );
    forbid(
        &agent,
        "agent creates a ScheduledEvent",
        &["create", "-f", &forged],
        "create",
        "scheduledevents",
    );
    forbid(
        &agent,
        "agent applies a ScheduledEvent (server-side apply)",
        &[
            "apply",
            "--server-side",
            "--field-manager=forewarn-agent",
            "-f",
            &forged,
        ],
        "patch",
        "scheduledevents",
    );
    let mut changed = k.json(&["get", "scheduledevent", sev]);
    changed["spec"]["eventStatus"] = "Completed".into();
    let changed = file("agent-sev-replace.json", &changed.to_string());
    forbid(
        &agent,
        "agent replaces a ScheduledEvent (update)",
        &["replace", "-f", &changed],
        "update",
        "scheduledevents",
    );
    forbid(
        &agent,
        "agent patches a ScheduledEvent",
        &[
            "patch",
            "scheduledevent",
            sev,
            "--type=merge",
            "-p",
            r#"{"spec":{"eventStatus":"Completed"}}"#,
        ],
        "patch",
        "scheduledevents",
    );
    forbid(
        &agent,
        "agent deletes a ScheduledEvent",
        &["delete", "scheduledevent", sev],
        "delete",
        "scheduledevents",
    );
    forbid(
        &agent,
        "agent patches a ScheduledEvent's status",
        &[
            "patch",
            "scheduledevent",
            sev,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Approved"}}"#,
        ],
        "patch",
        "scheduledevents/status",
    );
    let mut status = k.json(&["get", "scheduledevent", sev]);
    status["status"]["phase"] = "Approved".into();
    let status = file("agent-sev-status.json", &status.to_string());
    forbid(
        &agent,
        "agent replaces a ScheduledEvent's status (update)",
        &["replace", "--subresource=status", "-f", &status],
        "update",
        "scheduledevents/status",
    );
    // As the agent once recorded a sent approval: server-side apply on the
    // status subresource (kube), with no GET first.
    let msg = apply_status(
        &agent.kubeconfig,
        sev,
        serde_json::json!({"approval": {"sentAt": "2026-01-01T00:00:01Z", "sentBy": nodes[0], "result": "Accepted"}}),
        forewarn::api::AGENT_MANAGER,
    )
    .expect_err("the agent applied a ScheduledEvent's status");
    assert!(
        msg.contains("403") && msg.contains("cannot patch resource \"scheduledevents/status\""),
        "agent applies a ScheduledEvent's status: not refused by RBAC: {msg}"
    );
    denials.borrow_mut().push(format!(
        "agent applies a ScheduledEvent's status (kube):\n  {msg}"
    ));
    let stored = k.json(&["get", "scheduledevent", sev]);
    assert_eq!(
        stored["spec"]["eventStatus"], "Scheduled",
        "{}",
        stored["spec"]
    );
    assert_eq!(
        stored["status"]["phase"], "Draining",
        "{}",
        stored["status"]
    );
    assert_eq!(
        stored["status"]["approval"]["reason"],
        "waiting for the drain"
    );
    assert!(
        stored["status"]["approval"]["sentBy"].is_null(),
        "{}",
        stored["status"]
    );
    assert!(
        !k.run(&["get", "scheduledevent", &format!("{sev}-2")], None)
            .ok,
        "the agent created a ScheduledEvent"
    );

    // Reports: its own node's, as the agent writes them (server-side
    // apply, a create and then a change); the admission policy refuses
    // another node's, and any from a token without a node name.
    let own = format!("{sev}.{}", nodes[0]);
    for status in ["Scheduled", "Started"] {
        let out = apply_report(
            &agent,
            &report_yaml(
                sev,
                nodes[0],
                "vm-chart-0",
                "Reboot",
                status,
                &["vm-chart-1"],
            ),
        );
        assert!(
            out.ok,
            "the agent may write its own report ({status}): {}",
            out.stderr
        );
    }
    let report = k.json(&["get", "scheduledeventreport", &own, "--show-managed-fields"]);
    assert_eq!(report["spec"]["report"]["node"], nodes[0]);
    assert_eq!(report["spec"]["report"]["eventStatus"], "Started");
    let managers: Vec<&str> = report["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert_eq!(managers, [forewarn::api::AGENT_MANAGER], "{managers:?}");
    agent.ok(&["get", "scheduledeventreports"]);
    let out = apply_report(
        &agent,
        &report_yaml(
            sev,
            nodes[1],
            "vm-chart-1",
            "Reboot",
            "Started",
            &["vm-chart-1"],
        ),
    );
    let expect = format!(
        "forewarn agent on node {} may write only its own ScheduledEventReports",
        nodes[0]
    );
    assert!(
        !out.ok && out.stderr.contains(&expect),
        "agent writes another node's report: not refused by the admission policy ({expect}): {}{}",
        out.stdout,
        out.stderr
    );
    denials.borrow_mut().push(format!(
        "agent writes another node's report:\n  {}",
        out.stderr.trim()
    ));
    let out = apply_report(
        &unbound_agent,
        &report_yaml(
            sev,
            nodes[0],
            "vm-chart-0",
            "Reboot",
            "Completed",
            &["vm-chart-1"],
        ),
    );
    assert!(
        !out.ok && out.stderr.contains("the token carries no node name"),
        "agent token not bound to a pod writes a report: {}{}",
        out.stdout,
        out.stderr
    );
    denials.borrow_mut().push(format!(
        "agent token not bound to a pod writes a report:\n  {}",
        out.stderr.trim()
    ));
    assert!(
        !k.run(
            &[
                "get",
                "scheduledeventreport",
                &format!("{sev}.{}", nodes[1])
            ],
            None
        )
        .ok,
        "the agent wrote another node's report"
    );
    assert_eq!(
        k.json(&["get", "scheduledeventreport", &own])["spec"]["report"]["eventStatus"],
        "Started"
    );
    forbid(
        &agent,
        "agent deletes its own report",
        &["delete", "scheduledeventreport", &own],
        "delete",
        "scheduledeventreports",
    );

    // Its VM's report (the fault and update domain the controller labels
    // its node with): its own node's, as the agent writes it (server-side
    // apply, a create and then a change); another node's is refused by
    // the admission policy, a name not its node's by the CRD, any from a
    // token without a node name; it may not read or delete one.
    let vm_report = |name: &str, node: &str, fd: &str| {
        format!(
            "apiVersion: forewarn.dev/v1alpha1\nkind: VirtualMachineReport\nmetadata:\n  name: {name}\nspec:\n  node: {node}\n  vm: vm-chart\n  platformFaultDomain: \"{fd}\"\n  platformUpdateDomain: \"0\"\n"
        )
    };
    for n in [nodes[0], nodes[1]] {
        k.run(
            &["delete", "virtualmachinereport", n, "--ignore-not-found"],
            None,
        );
    }
    for fd in ["1", "2"] {
        let out = apply_report(&agent, &vm_report(nodes[0], nodes[0], fd));
        assert!(
            out.ok,
            "the agent may write its own VM's report (fault domain {fd}): {}",
            out.stderr
        );
    }
    let stored = k.json(&[
        "get",
        "virtualmachinereport",
        nodes[0],
        "--show-managed-fields",
    ]);
    assert_eq!(stored["spec"]["platformFaultDomain"], "2", "{stored}");
    let out = apply_report(&agent, &vm_report(nodes[1], nodes[1], "0"));
    let expect = format!(
        "forewarn agent on node {} may write only its own VirtualMachineReports",
        nodes[0]
    );
    assert!(
        !out.ok && out.stderr.contains(&expect),
        "agent writes another node's VM report: not refused by the admission policy ({expect}): {}{}",
        out.stdout,
        out.stderr
    );
    denials.borrow_mut().push(format!(
        "agent writes another node's VM report:\n  {}",
        out.stderr.trim()
    ));
    let out = apply_report(&agent, &vm_report(nodes[1], nodes[0], "0"));
    assert!(
        !out.ok && out.stderr.contains("the name must be the node's"),
        "agent writes its VM report under another node's name: not refused by the CRD: {}{}",
        out.stdout,
        out.stderr
    );
    denials.borrow_mut().push(format!(
        "agent writes its VM report under another node's name:\n  {}",
        out.stderr.trim()
    ));
    let out = apply_report(&unbound_agent, &vm_report(nodes[0], nodes[0], "0"));
    assert!(
        !out.ok && out.stderr.contains("the token carries no node name"),
        "agent token not bound to a pod writes a VM report: {}{}",
        out.stdout,
        out.stderr
    );
    assert!(
        !k.run(&["get", "virtualmachinereport", nodes[1]], None).ok,
        "the agent wrote another node's VM report"
    );
    assert_eq!(
        k.json(&["get", "virtualmachinereport", nodes[0]])["spec"]["platformFaultDomain"],
        "2"
    );
    forbid(
        &agent,
        "agent lists VM reports",
        &["get", "virtualmachinereports"],
        "list",
        "virtualmachinereports",
    );
    forbid(
        &agent,
        "agent deletes its own VM report",
        &["delete", "virtualmachinereport", nodes[0]],
        "delete",
        "virtualmachinereports",
    );

    // --- controller: what it needs works, Secrets do not.
    deny(
        &controller,
        "controller reads secrets",
        &["get", "secrets", "-n", NS],
        "forbidden",
    );
    deny(
        &controller,
        "controller lists secrets cluster-wide",
        &["get", "secrets", "-A"],
        "forbidden",
    );
    let lease_file = out_dir().join("lease-default.yaml");
    std::fs::write(&lease_file, "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: forewarn-controller\n  namespace: default\n").unwrap();
    deny(
        &controller,
        "controller creates a Lease outside its namespace",
        &["create", "-f", &lease_file.to_string_lossy()],
        "forbidden",
    );
    deny(
        &controller,
        "controller creates a pod",
        &["run", "x", "--image=example.invalid/x", "-n", NS],
        "forbidden",
    );
    // A Node's cordon as the controller writes it: a merge patch, never a
    // read by name first (kubectl cordon and patch read it first, which
    // the controller may not: it knows Nodes from its watch).
    for unschedulable in [true, false] {
        merge_patch_as(
            &controller.kubeconfig,
            ("", "v1", "Node", "nodes"),
            nodes[2],
            serde_json::json!({"spec": {"unschedulable": unschedulable}}),
        )
        .unwrap_or_else(|e| panic!("the controller cannot cordon a node: {e}"));
        assert_eq!(
            k.json(&["get", "node", nodes[2]])["spec"]["unschedulable"] == true,
            unschedulable
        );
    }
    forbid(
        &controller,
        "controller reads a Node by name (get)",
        &["get", "node", nodes[2]],
        "get",
        "nodes",
    );
    controller.ok(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        &format!("spec.nodeName={}", nodes[2]),
    ]);
    controller.ok(&[
        "create",
        "--raw",
        "/api/v1/namespaces/chart-victims/pods/victim/eviction",
        "-f",
        &ev,
    ]);
    apply_status(
        &controller.kubeconfig,
        sev,
        serde_json::json!({"phase": "Approved", "approval": {"decidedAt": "2026-01-01T00:00:00Z"}}),
        forewarn::api::CONTROLLER_MANAGER,
    )
    .unwrap_or_else(|e| panic!("the controller cannot write the approval decision: {e}"));
    // It alone writes ScheduledEvents: creates one first reported by an
    // agent, patches its spec, deletes reports and events.
    controller.ok_stdin(
        &["create", "-f", "-"],
        &sev_yaml(&format!("{sev}-2"), "Scheduled", "vm-chart-0"),
    );
    merge_patch_as(
        &controller.kubeconfig,
        (
            "forewarn.dev",
            "v1alpha1",
            "ScheduledEvent",
            "scheduledevents",
        ),
        &format!("{sev}-2"),
        serde_json::json!({"spec": {"eventStatus": "Started"}}),
    )
    .unwrap_or_else(|e| panic!("the controller cannot patch a ScheduledEvent's spec: {e}"));
    forbid(
        &controller,
        "controller reads a ScheduledEvent by name (get)",
        &["get", "scheduledevent", sev],
        "get",
        "scheduledevents",
    );
    controller.ok(&["get", "scheduledeventreports"]);
    controller.ok(&["delete", "scheduledeventreport", &own]);
    // The agents' VM reports, and a node's fault-domain label as the
    // controller writes it (a merge patch of the label, no read first).
    controller.ok(&["get", "virtualmachinereports"]);
    merge_patch_as(
        &controller.kubeconfig,
        ("", "v1", "Node", "nodes"),
        nodes[2],
        serde_json::json!({"metadata": {"labels": {forewarn::topology::FAULT_DOMAIN_LABEL: "2"}}}),
    )
    .unwrap_or_else(|e| panic!("the controller cannot label a node: {e}"));
    merge_patch_as(
        &controller.kubeconfig,
        ("", "v1", "Node", "nodes"),
        nodes[2],
        serde_json::json!({"metadata": {"labels": {forewarn::topology::FAULT_DOMAIN_LABEL: null}}}),
    )
    .unwrap_or_else(|e| panic!("the controller cannot unlabel a node: {e}"));
    forbid(
        &controller,
        "controller deletes a VM report",
        &["delete", "virtualmachinereport", nodes[0]],
        "delete",
        "virtualmachinereports",
    );
    k.ok(&["delete", "virtualmachinereport", nodes[0]]);
    controller.ok(&["delete", "scheduledevent", sev, &format!("{sev}-2")]);
    // The admission policy that confines the agents, and its binding: it
    // may read those two (--agent-policy), nothing else of the kind.
    for kind in [
        "validatingadmissionpolicy",
        "validatingadmissionpolicybinding",
    ] {
        controller.ok(&["get", kind, AGENT_POLICY]);
    }
    forbid(
        &controller,
        "controller lists admission policies",
        &["get", "validatingadmissionpolicies"],
        "list",
        "validatingadmissionpolicies",
    );
    forbid(
        &controller,
        "controller reads another admission policy binding",
        &["get", "validatingadmissionpolicybinding", "other"],
        "get",
        "validatingadmissionpolicybindings",
    );
    // The Lease as the controller writes it: a create, then replaces.
    let lease = |holder: &str| {
        format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: forewarn-controller\n  namespace: {NS}\nspec:\n  holderIdentity: {holder}\n"
        )
    };
    // (Another test's controller may have left it, released.)
    k.ok(&[
        "delete",
        "lease",
        "-n",
        NS,
        "forewarn-controller",
        "--ignore-not-found",
    ]);
    controller.ok_stdin(&["create", "-f", "-"], &lease("chart-test"));
    controller.ok_stdin(&["replace", "-f", "-"], &lease("chart-test-2"));
    k.ok(&["delete", "lease", "-n", NS, "forewarn-controller"]);

    // What each ServiceAccount may do, as the API server sees it.
    for (name, who) in [("agent", &agent), ("controller", &controller)] {
        let list = who.ok(&["auth", "can-i", "--list", "-n", NS]);
        std::fs::write(out_dir().join(format!("can-i-{name}.txt")), &list).unwrap();
        record += &format!("kubectl auth can-i --list -n {NS} ({name} token):\n{list}\n");
        assert!(
            !list.contains("secrets"),
            "{name} may touch secrets:\n{list}"
        );
        assert!(
            !list.lines().any(|l| l.starts_with("*.*")),
            "{name} has a wildcard:\n{list}"
        );
        // Exactly the chart's rules (README, "What each role may do"), plus
        // the self-reviews every authenticated user may create.
        let want: &[(&str, &str, &[&str])] = if name == "agent" {
            &[
                (
                    "scheduledeventreports.forewarn.dev",
                    "",
                    &["create", "list", "patch", "watch"],
                ),
                (
                    "virtualmachinereports.forewarn.dev",
                    "",
                    &["create", "patch"],
                ),
                ("scheduledevents.forewarn.dev", "", &["list", "watch"]),
                (
                    "customresourcedefinitions.apiextensions.k8s.io",
                    "scheduledeventreports.forewarn.dev",
                    &["get"],
                ),
                (
                    "customresourcedefinitions.apiextensions.k8s.io",
                    "virtualmachinereports.forewarn.dev",
                    &["get"],
                ),
            ]
        } else {
            &[
                (
                    "scheduledevents.forewarn.dev",
                    "",
                    &["create", "delete", "list", "patch", "watch"],
                ),
                ("scheduledevents.forewarn.dev/status", "", &["patch"]),
                (
                    "scheduledeventreports.forewarn.dev",
                    "",
                    &["delete", "list", "watch"],
                ),
                ("virtualmachinereports.forewarn.dev", "", &["list", "watch"]),
                ("nodes", "", &["list", "patch", "watch"]),
                ("nodes/status", "", &["patch"]),
                ("pods", "", &["list", "patch", "watch"]),
                ("pods/eviction", "", &["create"]),
                ("poddisruptionbudgets.policy", "", &["get", "list", "watch"]),
                ("events.events.k8s.io", "", &["create", "patch"]),
                (
                    "validatingadmissionpolicies.admissionregistration.k8s.io",
                    AGENT_POLICY,
                    &["get"],
                ),
                (
                    "validatingadmissionpolicybindings.admissionregistration.k8s.io",
                    AGENT_POLICY,
                    &["get"],
                ),
                (
                    "customresourcedefinitions.apiextensions.k8s.io",
                    "scheduledevents.forewarn.dev",
                    &["get"],
                ),
                (
                    "customresourcedefinitions.apiextensions.k8s.io",
                    "scheduledeventreports.forewarn.dev",
                    &["get"],
                ),
                (
                    "customresourcedefinitions.apiextensions.k8s.io",
                    "virtualmachinereports.forewarn.dev",
                    &["get"],
                ),
                ("leases.coordination.k8s.io", "", &["create"]),
                (
                    "leases.coordination.k8s.io",
                    "forewarn-controller",
                    &["get", "list", "update", "watch"],
                ),
            ]
        };
        let mut got = can_i_rules(&list);
        got.retain(|(resource, _), verbs| {
            !(resource.starts_with("selfsubject") && verbs.iter().eq(["create"]))
        });
        let want: std::collections::BTreeMap<(String, String), std::collections::BTreeSet<String>> =
            want.iter()
                .map(|(r, names, verbs)| {
                    (
                        (r.to_string(), names.to_string()),
                        verbs.iter().map(|v| v.to_string()).collect(),
                    )
                })
                .collect();
        assert_eq!(
            got, want,
            "{name}: kubectl auth can-i --list is not the chart's rules:\n{list}"
        );
    }
    record += &format!("denials:\n{}\n", denials.borrow().join("\n"));
    std::fs::write(out_dir().join("confinement.txt"), &record).unwrap();
    println!("{record}");
}

/// The controller's `pods patch` (the notices of the pods that take part)
/// is confined by the chart's admission policy
/// `<fullname>-controller-pod-notices`: with the chart's controller token,
/// a notice annotation can be set, changed and removed, and an
/// acknowledgement removed (what the API server stored is checked, with
/// its field manager); a label, another annotation, an acknowledgement
/// added or changed, the spec or a finalizer are refused by that policy.
/// Another account (the admin) is not confined by it.
#[test]
fn controller_may_change_nothing_on_a_pod_but_its_notices() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let ns = "chart-notices";
    ensure_namespace(&k, ns, "baseline");
    k.run(
        &[
            "delete",
            "pod",
            "-n",
            ns,
            "db-0",
            "--ignore-not-found",
            "--grace-period=1",
        ],
        None,
    );
    k.ok_stdin(
        &["create", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: db-0\n  namespace: {ns}\n  labels:\n    app: db\n    forewarn.dev/acknowledge: \"true\"\n  annotations:\n    team: storage\n    ack.forewarn.dev/ev0: EV0\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: db\n    image: registry.k8s.io/pause:3.10\n"
        ),
    );
    let controller = token_kubeconfig(&k, "notices-controller", &token(&k, CONTROLLER_SA, None));
    let patch = |body: Value| pod_merge_patch_as(&controller.kubeconfig, ns, "db-0", body);
    let annotations =
        || k.json(&["get", "pod", "-n", ns, "db-0"])["metadata"]["annotations"].clone();

    // Allowed: a notice set, changed; an acknowledgement removed.
    let key = "notice.forewarn.dev/ev1";
    patch(serde_json::json!({"metadata": {"annotations": {key: "eventId=EV1 phase=Pending"}}}))
        .unwrap_or_else(|e| panic!("the controller cannot write a notice: {e}"));
    patch(serde_json::json!({"metadata": {"annotations": {key: "eventId=EV1 phase=Draining"}}}))
        .unwrap_or_else(|e| panic!("the controller cannot change a notice: {e}"));
    assert_eq!(annotations()[key], "eventId=EV1 phase=Draining");
    let pod = k.json(&["get", "pod", "-n", ns, "db-0", "--show-managed-fields"]);
    let owners: Vec<String> = pod["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter(|m| m["fieldsV1"]["f:metadata"]["f:annotations"][format!("f:{key}")].is_object())
        .map(|m| {
            format!(
                "{} {}",
                m["manager"].as_str().unwrap_or(""),
                m["operation"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        owners,
        ["forewarn-controller Update"],
        "{}",
        pod["metadata"]["managedFields"]
    );

    // Refused by the policy, each leaving the pod as it was.
    let refused: [(&str, Value); 8] = [
        (
            "a label",
            serde_json::json!({"metadata": {"labels": {"forewarn.dev/acknowledge": "false"}}}),
        ),
        (
            "another annotation added",
            serde_json::json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        (
            "another annotation changed",
            serde_json::json!({"metadata": {"annotations": {"team": "web"}}}),
        ),
        (
            "another annotation removed",
            serde_json::json!({"metadata": {"annotations": {"team": null}}}),
        ),
        (
            "an acknowledgement written",
            serde_json::json!({"metadata": {"annotations": {"ack.forewarn.dev/ev1": "EV1"}}}),
        ),
        (
            "an acknowledgement changed",
            serde_json::json!({"metadata": {"annotations": {"ack.forewarn.dev/ev0": "EV9"}}}),
        ),
        (
            "the spec",
            serde_json::json!({"spec": {"activeDeadlineSeconds": 60}}),
        ),
        (
            "a finalizer",
            serde_json::json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        ),
    ];
    let before = k.json(&["get", "pod", "-n", ns, "db-0"]);
    for (what, body) in refused {
        let e = patch(body).expect_err(what);
        assert!(
            e.contains(CONTROLLER_POD_POLICY) && e.contains("(403)"),
            "{what}: refused, but not by {CONTROLLER_POD_POLICY}: {e}"
        );
    }
    let after = k.json(&["get", "pod", "-n", ns, "db-0"]);
    assert_eq!(
        before["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );

    // Removing the notice and an acknowledgement together, as the end of an event does.
    patch(
        serde_json::json!({"metadata": {"annotations": {key: null, "ack.forewarn.dev/ev0": null}}}),
    )
    .unwrap_or_else(|e| {
        panic!("the controller cannot remove a notice and its acknowledgement: {e}")
    });
    assert_eq!(annotations(), serde_json::json!({"team": "storage"}));
    // The policy confines the controller only.
    k.ok(&[
        "annotate",
        "pod",
        "-n",
        ns,
        "db-0",
        "ack.forewarn.dev/ev1=EV1",
        "x=y",
    ]);
    k.ok(&["delete", "namespace", ns, "--timeout=90s"]);
}

/// Options to play platform-redeploy.yaml with TokenRequest tokens of the
/// chart's ServiceAccounts: each agent's bound to the chart's agent pod on
/// its node (with `swap`, the agents of node-000000 and node-000001 get
/// each other's token), the controller's unbound (the drain may evict the
/// controller's pods, and a bound token dies with its pod).
fn chart_run_options(
    k: &Kubectl,
    run: &str,
    lease: &str,
    swap: bool,
) -> forewarn_harness::run::RunOptions {
    use forewarn_harness::procs::Credentials;
    use forewarn_harness::run::RunOptions;
    let nodes = ["node-000000", "node-000001", "node-000002"];
    let mut agents = std::collections::BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        let bound_to = match (swap, i) {
            (true, 0) => nodes[1],
            (true, 1) => nodes[0],
            _ => node,
        };
        let (pod, uid) = agent_pod_on(k, bound_to);
        let kc = token_kubeconfig(
            k,
            &format!("{run}-agent-{node}"),
            &token(k, AGENT_SA, Some((&pod, &uid))),
        );
        agents.insert(node.to_string(), kc.kubeconfig);
    }
    let controller = token_kubeconfig(
        k,
        &format!("{run}-controller"),
        &token(k, CONTROLLER_SA, None),
    );
    k.run(
        &["delete", "lease", "-n", NS, lease, "--ignore-not-found"],
        None,
    );
    let mut opts = RunOptions::new(
        repo_root().join("tests/fixtures/platform-redeploy.yaml"),
        PathBuf::from(env!("CARGO_BIN_EXE_forewarn")),
    );
    opts.log_dir = repo_root().join("target/forewarn-runs").join(run);
    // A hang bound: these scenarios end within about 20 s (an approval
    // starts the event; at worst NotBefore, 90 s after the start, does);
    // the run returns as soon as they are over.
    opts.timeout = Duration::from_secs(300);
    // As the chart runs the controller (--agent-policy).
    opts.extra_env
        .push(("FOREWARN_AGENT_POLICY".into(), AGENT_POLICY.into()));
    opts.credentials = Some(Credentials {
        controller: controller.kubeconfig,
        agents,
        lease_namespace: NS.into(),
        lease_name: lease.into(),
    });
    opts
}

/// The control for the scenario test below: the same processes with the
/// tokens of the agents of node-000000 and node-000001 swapped are refused
/// by the API server when each records its VM name on its Node. So the
/// processes really authenticate with the tokens given (and a node's token
/// is no good on another node).
#[test]
fn swapped_agent_tokens_are_refused_during_a_scenario() {
    use forewarn_harness::procs::{Fleet, FleetOptions};
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let opts = chart_run_options(&k, "chart-swapped-tokens", "forewarn-controller", true);
    k.run(
        &["delete", "scheduledeventreports", "--all", "--wait=false"],
        None,
    );
    k.run(
        &["delete", "virtualmachinereports", "--all", "--wait=false"],
        None,
    );
    std::fs::create_dir_all(&opts.log_dir).expect("log dir");
    let vms: Vec<(String, String)> = (0..3)
        .map(|i| {
            (
                format!("node-00000{i}"),
                format!("aks-nodepool1-27351046-vmss_{i}"),
            )
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let log = opts.log_dir.join("agent-node-000001.log");
    let refusal = rt.block_on(async {
        let mut fleet = Fleet::start(FleetOptions {
            credentials: opts.credentials.clone(),
            ..FleetOptions::new(
                &opts.forewarn_bin,
                &[("RUST_LOG", "info,kube=warn")],
                &opts.log_dir,
                &opts.scenario,
                "127.0.0.2:0",
                "unused",
                &vms,
            )
        })
        .await
        .expect("fleet starts");
        // The scenario's clock: the event appears, and each agent reports it.
        fleet
            .start_mock(&forewarn::http::client())
            .await
            .expect("the mock's clock starts");
        let start = Instant::now();
        let found = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(l) = text
                .lines()
                .find(|l| l.contains("may write only its own ScheduledEventReports"))
            {
                break Some(l.to_string());
            }
            // A hang bound: the first report is refused within seconds.
            if start.elapsed() > Duration::from_secs(120) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        for p in fleet.all_mut() {
            let _ = p.terminate(Duration::from_secs(10)).await;
        }
        found
    });
    let refusal = refusal.unwrap_or_else(|| {
        panic!(
            "no admission refusal in {}:\n{}",
            log.display(),
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    println!("agent of node-000001 holding node-000000's token: {refusal}");
    // And the API server holds no report of node-000001.
    let reports = k.json(&["get", "scheduledeventreports"]);
    let of_b: Vec<&Value> = reports["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["spec"]["report"]["node"] == "node-000001")
        .collect();
    assert!(
        of_b.is_empty(),
        "a report of node-000001 was stored: {of_b:?}"
    );
    // Nor its VM report: the agent holding node-000000's token was refused
    // there too (the agents' VM reports, written once at start).
    let vm_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        vm_log.contains("may write only its own VirtualMachineReports"),
        "no admission refusal of the VM report in {}:\n{vm_log}",
        log.display()
    );
    let vm_reports = k.json(&["get", "virtualmachinereports"]);
    let vm_of_b: Vec<&Value> = vm_reports["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["spec"]["node"] == "node-000001")
        .collect();
    assert!(
        vm_of_b.is_empty(),
        "a VM report of node-000001 was stored: {vm_of_b:?}"
    );
}

/// The real agent and controller processes of the harness, each with a
/// TokenRequest token of the chart's ServiceAccount (every agent's bound to
/// the chart's agent pod on its node, so it carries the node claim), play
/// `platform-redeploy.yaml` to the end: the chart's RBAC and admission
/// policies are enough for the whole cycle (annotate, mirror, cordon,
/// drain, approve, record the approval, uncordon).
#[test]
fn scenario_plays_with_the_chart_credentials() {
    use forewarn_harness::run::{run_scenario, summary};

    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let lease = "forewarn-controller";
    let mut opts = chart_run_options(&k, "chart-platform-redeploy", lease, false);
    // A pod that takes notices on the node drained: the controller writes
    // its notice with the chart's token, under the chart's admission policy.
    opts.extra_objects.push(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "watcher"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "watcher"}},
            "template": {
                "metadata": {"labels": {"app": "watcher", "forewarn.dev/notice": "true"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": "node-000001"},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = rt
        .block_on(run_scenario(&c, &opts))
        .unwrap_or_else(|e| panic!("platform-redeploy with the chart's credentials: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    assert!(
        report.ok(),
        "platform-redeploy with the chart's credentials:\n{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    assert!(
        report.min_ready >= report.min_available,
        "PodDisruptionBudget violated"
    );
    let noticed: Vec<_> = report
        .notices
        .iter()
        .filter(|n| n.pod.starts_with("shop/watcher-") && n.node == "node-000001")
        .collect();
    assert!(
        noticed
            .iter()
            .any(|n| n.managers == ["forewarn-controller Update"]),
        "no notice written by the controller with the chart's token: {:?}",
        report.notices
    );
    // Each agent reported its VM (the chart's agent RBAC and admission
    // policy let it), and the controller labelled each node with the fault
    // domain the mock served for its VM.
    for i in 0..3 {
        let node = format!("node-00000{i}");
        let vmr = k.json(&["get", "virtualmachinereport", &node]);
        assert_eq!(vmr["spec"]["platformFaultDomain"], i.to_string(), "{vmr}");
        let labels = &k.json(&["get", "node", &node])["metadata"]["labels"];
        assert_eq!(
            labels[forewarn::topology::FAULT_DOMAIN_LABEL],
            i.to_string(),
            "{node}: {labels}"
        );
    }
    // The controller took the chart's Lease, in the release namespace, and
    // released it on SIGTERM at the end: no holder, a duration of 1 s.
    let held = k.json(&["get", "lease", "-n", NS, lease]);
    assert!(
        held["spec"]["holderIdentity"].is_null()
            && held["spec"]["leaseDurationSeconds"] == 1
            && held["spec"]["acquireTime"].is_string(),
        "{}",
        held["spec"]
    );
    // The controller checked the chart's admission policy (--agent-policy,
    // as the chart runs it) with its token.
    let found = std::fs::read_dir(&opts.log_dir)
        .expect("log dir")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .any(|text| text.contains("The agents' admission policy is installed"));
    assert!(
        found,
        "no controller log in {} says the admission policy is installed",
        opts.log_dir.display()
    );
    // No process fell back to anything but its token: the logs show no
    // authorization failure.
    for entry in std::fs::read_dir(&opts.log_dir).expect("log dir") {
        let path = entry.expect("log entry").path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for bad in ["forbidden", "Forbidden", "ValidatingAdmissionPolicy"] {
            assert!(
                !text.contains(bad),
                "{}: {bad} in the log:\n{}",
                path.display(),
                text.lines()
                    .filter(|l| l.contains(bad))
                    .take(5)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}

/// A Freeze with the chart's credentials: the controller watches the
/// affected nodes' Leases in `kube-node-lease` (its Role there) and writes
/// their `ForewarnScheduledEvent` condition (`nodes/status`), with no
/// authorization failure; tests/audit.rs sees both verbs used.
#[test]
fn freeze_plays_with_the_chart_credentials() {
    use forewarn_harness::run::{run_scenario, summary};

    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let mut opts = chart_run_options(&k, "chart-freeze", "forewarn-controller", false);
    opts.scenario = repo_root().join("tests/fixtures/freeze-two-vms.yaml");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = rt
        .block_on(run_scenario(&c, &opts))
        .unwrap_or_else(|e| panic!("freeze-two-vms with the chart's credentials: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    assert!(
        report.ok(),
        "freeze-two-vms with the chart's credentials:\n{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    let log = std::fs::read_to_string(opts.log_dir.join("controller.log")).expect("log");
    assert!(
        log.contains("Watching the node's Lease"),
        "the controller watched no node's Lease:\n{log}"
    );
    for bad in [
        "forbidden",
        "Forbidden",
        "Cannot watch the node's Lease",
        "Could not write the node condition",
    ] {
        assert!(
            !log.contains(bad),
            "{bad} in the controller's log:\n{}",
            log.lines()
                .filter(|l| l.contains(bad))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    // The condition was written with the controller's token, next to
    // KWOK's, and says False now the Freeze is over.
    for node in ["node-000000", "node-000001"] {
        let n = k.json(&["get", "node", node]);
        let conds = n["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let ours = conds
            .iter()
            .find(|c| c["type"] == "ForewarnScheduledEvent")
            .unwrap_or_else(|| panic!("no ForewarnScheduledEvent condition on {node}: {conds:?}"));
        assert_eq!(ours["status"], "False", "{ours}");
        assert!(
            conds
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        );
    }
}

/// The CRD hook (templates/crds-upgrade-job.yaml): a pre-install and
/// pre-upgrade Job running `forewarn crds apply` whose pod runs like the
/// controller's (image, pull secrets, security contexts, placement,
/// hostNetwork, extraEnv, resources), after its own ServiceAccount and RBAC
/// (lower hook weight), all deleted once it succeeded; off with
/// `crds.upgradeJob.enabled=false`.
#[test]
fn crd_hook_job_runs_like_the_controller() {
    let hook = |d: &Value| d["metadata"]["annotations"]["helm.sh/hook"].clone();
    for extra in [
        vec![],
        vec![
            "-f".to_string(),
            all_features_values(),
            "--set".into(),
            "controller.hostNetwork=true".into(),
            "--set-json".into(),
            r#"controller.nodeSelector={"pool":"system"}"#.into(),
            "--set-json".into(),
            r#"controller.tolerations=[{"key":"CriticalAddonsOnly","operator":"Exists"}]"#.into(),
            "--set".into(),
            "image.repository=registry.example.com/forewarn".into(),
            "--set".into(),
            "image.tag=9.9.9".into(),
        ],
    ] {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let docs = documents(&render(&extra));
        let find = |kind: &str| {
            docs.iter()
                .find(|d| d["kind"] == kind)
                .unwrap_or_else(|| panic!("no {kind}"))
                .clone()
        };
        let (dep, job) = (find("Deployment"), find("Job"));
        let (ctl, pod) = (
            &dep["spec"]["template"]["spec"],
            &job["spec"]["template"]["spec"],
        );
        for key in [
            "imagePullSecrets",
            "securityContext",
            "nodeSelector",
            "tolerations",
            "affinity",
            "hostNetwork",
            "dnsPolicy",
        ] {
            assert_eq!(pod[key], ctl[key], "{extra:?}: the Job's {key}");
        }
        let (cc, jc) = (&ctl["containers"][0], &pod["containers"][0]);
        for key in [
            "image",
            "imagePullPolicy",
            "command",
            "securityContext",
            "resources",
        ] {
            assert_eq!(jc[key], cc[key], "{extra:?}: the Job container's {key}");
        }
        let ctl_env: Vec<&Value> = cc["env"].as_array().unwrap().iter().collect();
        for e in jc["env"].as_array().into_iter().flatten() {
            assert!(
                ctl_env.contains(&e),
                "{extra:?}: the Job's env {e} is not the controller's"
            );
        }
        let args: Vec<&str> = jc["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(&args[2..], ["crds", "apply", "--timeout=120s"], "{args:?}");
        assert_eq!(
            args[..2],
            cc["args"].as_array().unwrap()[..2]
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()[..]
        );
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(pod["serviceAccountName"], "forewarn-crds");
        assert_eq!(job["spec"]["backoffLimit"], 1);
        assert_eq!(job["spec"]["activeDeadlineSeconds"], 270);
        // The hook's objects: its own ServiceAccount and RBAC first (the
        // `helm test` hook's objects, `test`, are another hook's).
        let hooks: Vec<(String, String, String)> = docs
            .iter()
            .filter(|d| !hook(d).is_null() && hook(d) != "test")
            .map(|d| {
                assert_eq!(hook(d), "pre-install,pre-upgrade", "{}", d["metadata"]);
                assert_eq!(
                    d["metadata"]["annotations"]["helm.sh/hook-delete-policy"],
                    "before-hook-creation,hook-succeeded"
                );
                (
                    d["kind"].as_str().unwrap().to_string(),
                    d["metadata"]["name"].as_str().unwrap().to_string(),
                    d["metadata"]["annotations"]["helm.sh/hook-weight"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                )
            })
            .collect();
        let want: Vec<(String, String, String)> = [
            ("ServiceAccount", "-10"),
            ("ClusterRole", "-10"),
            ("ClusterRoleBinding", "-10"),
            ("Job", "-5"),
        ]
        .iter()
        .map(|(k, w)| (k.to_string(), "forewarn-crds".to_string(), w.to_string()))
        .collect();
        assert_eq!(hooks, want, "the chart's hooks");
        let role = docs
            .iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "forewarn-crds")
            .unwrap();
        assert_eq!(
            role["rules"],
            serde_json::json!([
                {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["create"]},
                {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                 "resourceNames": ["scheduledevents.forewarn.dev", "scheduledeventreports.forewarn.dev", "virtualmachinereports.forewarn.dev"],
                 "verbs": ["get", "patch"]}
            ])
        );
    }
    // Off: no CRD hook at all (the `helm test` hook is another value's).
    let docs = documents(&render(&["--set", "crds.upgradeJob.enabled=false"]));
    assert!(
        docs.iter().all(|d| {
            let hook = &d["metadata"]["annotations"]["helm.sh/hook"];
            hook.is_null() || hook == "test"
        }),
        "a hook is rendered with crds.upgradeJob.enabled=false"
    );
    // The schema types its values.
    let chart = chart_dir();
    for bad in [
        "crds.upgradeJob.enabled=yes",
        "crds.upgradeJob.timeoutSeconds=2",
        "crds.upgradeJob.bogus=1",
    ] {
        let out = helm(&[
            "template",
            RELEASE,
            &chart,
            "--api-versions",
            VAP_API,
            "--set",
            bad,
        ]);
        assert!(!out.ok, "{bad} was accepted");
    }
}

#[test]
fn controller_host_network_is_opt_in_and_keeps_its_own_port() {
    let docs = documents(&render(&["--set", "controller.hostNetwork=true"]));
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
            .clone()
    };
    let (dep, ds) = (find("Deployment"), find("DaemonSet"));
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    // Both roles then listen on ports of the same node: they must differ.
    let port = |w: &Value| {
        w["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"].clone()
    };
    assert_eq!(port(&dep), 9102);
    assert_eq!(port(&ds), 9101);
    // The schema types it.
    let chart = chart_dir();
    let out = helm(&[
        "template",
        RELEASE,
        &chart,
        "--set-string",
        "controller.hostNetwork=yes",
    ]);
    assert!(!out.ok, "a string controller.hostNetwork was accepted");
    assert!(out.stderr.contains("hostNetwork"), "{}", out.stderr);
}

/// A `forewarn controller` process with `kubeconfig`'s credentials, stopped
/// (SIGTERM) when dropped.
struct ControllerProc {
    child: std::process::Child,
    log: PathBuf,
}

impl ControllerProc {
    /// A controller as the chart runs it (its Lease, `--agent-policy`),
    /// with the credentials of `kubeconfig`, named `name`.
    fn start(kubeconfig: &Path, name: &str) -> ControllerProc {
        Self::start_with(kubeconfig, name, &[])
    }

    /// [`ControllerProc::start`] with `extra` arguments.
    fn start_with(kubeconfig: &Path, name: &str, extra: &[&str]) -> ControllerProc {
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
    fn spawn(kubeconfig: &Path, name: &str, args: &[&str]) -> ControllerProc {
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

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The port of its metrics server (started on `127.0.0.1:0`), from its
    /// log line `Serving /metrics, /healthz and /readyz ... addr=127.0.0.1:PORT`.
    fn metrics_port(&self) -> u16 {
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
    fn exit_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
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

/// `metrics.auth.enabled` on a real API server: the
/// chart installed with it (and the PodMonitor, so with the chart's
/// scraper token Secret), a real controller and a real agent run with
/// `--metrics-auth kubernetes` and TokenRequest tokens of the chart's
/// ServiceAccounts only, so the chart's RBAC must let them create the
/// TokenReviews and SubjectAccessReviews. Each answers `/metrics` with 401
/// (and the Bearer challenge) without a token or with one the API server
/// does not authenticate, 403 for a ServiceAccount not bound to
/// `forewarn-metrics-reader`, and the metrics for the scraper the chart
/// bound to it and for the chart's scraper token; the verdict is cached
/// (the counter says so); `/healthz` stays open.
#[test]
fn metrics_auth_reviews_scrapers_tokens_with_the_chart_rbac() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install_monitoring_crds(&k);
    ensure_namespace(&k, NS, "privileged");
    let (reader, stranger) = ("forewarn-test-scraper", "forewarn-test-stranger");
    for sa in [reader, stranger] {
        k.ok_stdin(
            &["apply", "--server-side", "-f", "-"],
            &format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {sa}\n  namespace: {NS}\n"
            ),
        );
    }
    let name = format!("metrics.auth.scraper.serviceAccount.name={reader}");
    let namespace = format!("metrics.auth.scraper.serviceAccount.namespace={NS}");
    install_with(
        &k,
        &c,
        &[
            "--set",
            "metrics.auth.enabled=true",
            "--set",
            &name,
            "--set",
            &namespace,
            "--set",
            "metrics.podMonitor.enabled=true",
        ],
    );
    let agent = token_kubeconfig(&k, "metrics-auth-agent", &token(&k, AGENT_SA, None));
    let controller = token_kubeconfig(
        &k,
        "metrics-auth-controller",
        &token(&k, CONTROLLER_SA, None),
    );
    let reader_token = token(&k, reader, None);
    let stranger_token = token(&k, stranger, None);
    // The chart's own scraper token, which kube-controller-manager fills in.
    let chart_scraper_token = eventually(
        "the token Secret forewarn-metrics-scraper-token filled in",
        Duration::from_secs(120),
        || {
            let out = k.run(
                &[
                    "get",
                    "secret",
                    "-n",
                    NS,
                    "forewarn-metrics-scraper-token",
                    "-o",
                    "go-template={{if .data}}{{if .data.token}}{{.data.token | base64decode}}{{end}}{{end}}",
                ],
                None,
            );
            let t = out.stdout.trim().to_string();
            (out.ok && !t.is_empty()).then_some(t)
        },
    );
    k.run(
        &[
            "delete",
            "lease",
            "-n",
            NS,
            "forewarn-controller",
            "--ignore-not-found",
        ],
        None,
    );
    let procs = [
        (
            "controller",
            ControllerProc::spawn(
                &controller.kubeconfig,
                "metrics-auth-controller",
                &[
                    "controller",
                    "--metrics-addr",
                    "127.0.0.1:0",
                    "--metrics-auth",
                    "kubernetes",
                    "--dry-run",
                    "--lease-namespace",
                    NS,
                    "--lease-name",
                    "forewarn-controller",
                    "--identity",
                    "metrics-auth-controller",
                ],
            ),
        ),
        (
            "agent",
            ControllerProc::spawn(
                &agent.kubeconfig,
                "metrics-auth-agent",
                &[
                    "agent",
                    "--node-name",
                    "node-000000",
                    // Nothing answers there: the agent serves its metrics all the same.
                    "--imds-url",
                    "http://127.0.0.1:9",
                    "--metrics-addr",
                    "127.0.0.1:0",
                    "--metrics-auth",
                    "kubernetes",
                ],
            ),
        ),
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // A hang bound: a TokenReview or SubjectAccessReview takes
    // milliseconds; only a process that stopped answering takes a minute.
    let http = forewarn::http::client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("HTTP client");
    let get = |port: u16, path: &str, auth: Option<&str>| {
        rt.block_on(async {
            let mut req = http.get(format!("http://127.0.0.1:{port}{path}"));
            if let Some(a) = auth {
                req = req.header("Authorization", a);
            }
            let r = req.send().await.expect("an answer");
            let status = r.status().as_u16();
            let challenge = r
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            (status, challenge, r.text().await.unwrap_or_default())
        })
    };
    let bearer = |t: &str| format!("Bearer {t}");
    for (role, proc) in &procs {
        let port = proc.metrics_port();
        let log = || proc.log();
        // Open: the probes.
        let (status, _, _) = get(port, "/healthz", None);
        assert_eq!(status, 200, "{role} /healthz:\n{}", log());
        let (status, _, _) = get(port, "/readyz", None);
        assert_ne!(status, 401, "{role} /readyz asks for a token");
        // No token, another scheme, a token the API server does not know: 401.
        for auth in [
            None,
            Some("Basic dXNlcjpwYXNz".to_string()),
            Some(bearer("not-a-token")),
        ] {
            let (status, challenge, body) = get(port, "/metrics", auth.as_deref());
            assert_eq!(
                status,
                401,
                "{role} /metrics with {auth:?}: {body}\n{}",
                log()
            );
            assert_eq!(challenge.as_deref(), Some("Bearer"), "{role}");
            assert!(!body.contains("forewarn_"), "{role}: {body}");
        }
        // Authenticated but not bound to the reader role: 403.
        let (status, _, body) = get(port, "/metrics", Some(&bearer(&stranger_token)));
        assert_eq!(
            status,
            403,
            "{role} /metrics, unbound ServiceAccount: {body}\n{}",
            log()
        );
        assert!(!body.contains("forewarn_"), "{role}: {body}");
        // The scraper the chart bound, and the chart's own scraper token: 200.
        for (who, t) in [
            ("scraper", &reader_token),
            ("chart scraper", &chart_scraper_token),
        ] {
            let (status, _, body) = get(port, "/metrics", Some(&bearer(t)));
            assert_eq!(status, 200, "{role} /metrics, {who}: {body}\n{}", log());
            assert!(
                body.contains(&format!("forewarn_{role}_")),
                "{role}: {body}"
            );
        }
        // Asked again within the minute: from the cache, no review sent.
        let (status, _, body) = get(port, "/metrics", Some(&bearer(&reader_token)));
        assert_eq!(status, 200, "{role}");
        let count = |result: &str, cached: &str| -> u64 {
            let series = format!(
                "forewarn_{role}_metrics_auth_total{{cached=\"{cached}\",result=\"{result}\"}} "
            );
            body.lines()
                .find_map(|l| l.strip_prefix(&series))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        assert_eq!(count("allowed", "true"), 1, "{role}:\n{body}");
        assert_eq!(count("allowed", "false"), 2, "{role}:\n{body}");
        assert_eq!(count("denied", "false"), 1, "{role}:\n{body}");
        assert_eq!(count("unauthenticated", "false"), 1, "{role}:\n{body}");
        assert_eq!(count("no_token", "false"), 2, "{role}:\n{body}");
        assert_eq!(count("unavailable", "false"), 0, "{role}:\n{body}");
        // The chart's RBAC sufficed: no review was refused.
        let text = log();
        assert!(
            !text.contains("could not be reviewed") && !text.contains("forbidden"),
            "{role}:\n{text}"
        );
    }
    drop(procs);
    for sa in [reader, stranger] {
        k.run(
            &[
                "delete",
                "serviceaccount",
                "-n",
                NS,
                sa,
                "--ignore-not-found",
            ],
            None,
        );
    }
}

fn sev_yaml(name: &str, status: &str, vm: &str) -> String {
    format!(
        "apiVersion: forewarn.dev/v1alpha1\nkind: ScheduledEvent\nmetadata:\n  name: {name}\nspec:\n  eventId: {name}\n  eventType: Reboot\n  eventStatus: {status}\n  eventSource: Platform\n  resourceType: VirtualMachine\n  resources: [{vm}]\n  durationSeconds: -1\n  appearance: 1\n"
    )
}

/// One agent's report about the event `name`, as the agent applies it:
/// the object `<name>.<node>`, its view of an event of `type_` (a `Freeze`
/// of 5 s, anything else of unknown duration) listing `resources`.
fn report_yaml(
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
fn report_yaml_named(
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
fn state_vms(k: &Kubectl, vms: &[(&str, &str)]) {
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

fn apply_report(who: &Kubectl, yaml: &str) -> Out {
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

fn unschedulable(k: &Kubectl, node: &str) -> bool {
    k.json(&["get", "node", node])["spec"]["unschedulable"] == true
}

fn condition(k: &Kubectl, sev: &str, type_: &str) -> Option<Value> {
    let ev = k.json(&["get", "scheduledevent", sev]);
    ev["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// The trust model (README, "The trust model") with the chart's own tokens (each
/// agent's bound to the chart's agent pod on its node) and a real
/// controller process holding the controller's token: an agent may write no
/// `ScheduledEvent` and no other node's report; two other agents agreeing
/// on a 5 s `Freeze` do not override node B's own `Reboot` (B stays
/// cordoned, the approval stays bound to B's content), and their word that
/// it ended does not release B; an event agent A reports naming only B's VM
/// moves nothing; B's own agent's report that the event left releases B.
#[test]
fn one_nodes_agent_can_neither_drain_nor_release_another_node() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let (a, b, cc) = ("node-000000", "node-000001", "node-000002");
    let (vm_a, vm_b, vm_c) = ("vm-trust-0", "vm-trust-1", "vm-trust-2");
    for n in [a, b, cc] {
        k.run(&["uncordon", n], None);
    }
    let agent_token = |node: &str, name: &str| {
        let (pod, uid) = agent_pod_on(&k, node);
        token_kubeconfig(&k, name, &token(&k, AGENT_SA, Some((&pod, &uid))))
    };
    let agent_a = agent_token(a, "trust-agent-a");
    let agent_b = agent_token(b, "trust-agent-b");
    let agent_c = agent_token(cc, "trust-agent-c");
    let controller = token_kubeconfig(&k, "trust-controller", &token(&k, CONTROLLER_SA, None));
    k.run(
        &[
            "delete",
            "lease",
            "-n",
            NS,
            "forewarn-controller",
            "--ignore-not-found",
        ],
        None,
    );
    let (forged, live) = (
        "f0000000-0000-4000-8000-0000000000fe",
        "e0000000-0000-4000-8000-0000000000e1",
    );
    let clean = || {
        k.run(
            &["delete", "scheduledeventreports", "--all", "--wait=false"],
            None,
        );
        for sev in [forged, live] {
            k.run(
                &["delete", "scheduledevent", sev, "--ignore-not-found"],
                None,
            );
        }
    };
    clean();
    // The nodes have no providerID: each node's VM is the one its agent
    // stated first in its VirtualMachineReport.
    state_vms(&k, &[(a, vm_a), (b, vm_b), (cc, vm_c)]);
    let ctl = ControllerProc::start(&controller.kubeconfig, "trust-controller");
    eventually("the controller leads", Duration::from_secs(120), || {
        ctl.log().contains("Leading: reconciling").then_some(())
    });

    // 0. No agent writes a ScheduledEvent: only the controller does.
    let out = agent_a.run(
        &["create", "-f", "-"],
        Some(&sev_yaml(forged, "Scheduled", vm_b)),
    );
    assert!(
        !out.ok && out.stderr.contains("forbidden"),
        "agent A created a ScheduledEvent: {}{}",
        out.stdout,
        out.stderr
    );

    // 1. B's own agent reports a Reboot of its VM: the controller creates
    //    the event from it and cordons B.
    let out = apply_report(
        &agent_b,
        &report_yaml(live, b, vm_b, "Reboot", "Scheduled", &[vm_b]),
    );
    assert!(out.ok, "agent B may write its own report: {}", out.stderr);
    eventually(
        "node B cordoned on its own agent's report",
        Duration::from_secs(120),
        || unschedulable(&k, b).then_some(()),
    );
    let ev = k.json(&["get", "scheduledevent", live]);
    assert_eq!(ev["spec"]["eventType"], "Reboot", "{}", ev["spec"]);
    let managers: Vec<String> = ev["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["manager"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        managers.iter().all(|m| m == "forewarn-controller"),
        "the ScheduledEvent has other writers: {managers:?}"
    );
    let reboot_digest = forewarn::api::identity_digest(
        live,
        "Reboot",
        "Platform",
        "VirtualMachine",
        &[vm_b.to_string()],
        -1,
    );

    // 2. Agents A and C report the same EventId as a 5 s Freeze of all three
    //    VMs (policy: approve at once, no cordon). B is handled on its own
    //    agent's report: it stays cordoned, and the event says they disagree.
    let all = [vm_a, vm_c, vm_b];
    for (agent, node, vm) in [(&agent_a, a, vm_a), (&agent_c, cc, vm_c)] {
        let out = apply_report(
            agent,
            &report_yaml(live, node, vm, "Freeze", "Scheduled", &all),
        );
        assert!(
            out.ok,
            "agent on {node} may write its own report: {}",
            out.stderr
        );
    }
    let why = eventually(
        "ReportsDisagree on the live event",
        Duration::from_secs(120),
        || condition(&k, live, "ReportsDisagree").filter(|c| c["status"] == "True"),
    );
    println!("disagreement: {why}");
    assert!(
        why["message"].as_str().unwrap_or_default().contains(b),
        "{why}"
    );
    let recorded = eventually("a ReportsDisagree Event", Duration::from_secs(120), || {
        let events = k.json(&[
            "get",
            "events.events.k8s.io",
            "-A",
            "--field-selector",
            "reason=ReportsDisagree",
        ]);
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["regarding"]["name"] == live)
            .cloned()
    });
    println!("Event: {}", recorded["note"]);
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        unschedulable(&k, b),
        "node B was released on other agents' Freeze"
    );
    let ev = k.json(&["get", "scheduledevent", live]);
    let digest = &ev["status"]["approval"]["digest"];
    assert!(
        digest.is_null() || *digest == reboot_digest.as_str(),
        "an approval was decided for other content than B's own: {}",
        ev["status"]
    );

    // 3. A and C say the event left their documents: B stays cordoned.
    for (agent, node, vm) in [(&agent_a, a, vm_a), (&agent_c, cc, vm_c)] {
        let out = apply_report(
            agent,
            &report_yaml(live, node, vm, "Freeze", "Completed", &all),
        );
        assert!(
            out.ok,
            "agent on {node} may write its own report: {}",
            out.stderr
        );
    }
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        unschedulable(&k, b),
        "node B was released on other agents' word alone"
    );

    // 4. Agent A reports an event naming only B's VM: B is not moved.
    let out = apply_report(
        &agent_a,
        &report_yaml(forged, a, vm_a, "Reboot", "Scheduled", &[vm_b]),
    );
    assert!(out.ok, "agent A may write its own report: {}", out.stderr);
    let unconfirmed = eventually(
        "NodesUnconfirmed on the forged event",
        Duration::from_secs(120),
        || condition(&k, forged, "NodesUnconfirmed").filter(|c| c["status"] == "True"),
    );
    println!("forged event: {unconfirmed}");
    assert!(
        unconfirmed["message"]
            .as_str()
            .unwrap_or_default()
            .contains(b)
    );
    std::thread::sleep(Duration::from_secs(5));
    let node_b = k.json(&["get", "node", b]);
    let held_for = node_b["metadata"]["annotations"]["forewarn.dev/cordoned-for"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        !held_for.contains(forged),
        "node B held for the forged event: {held_for}"
    );
    let ev = k.json(&["get", "scheduledevent", forged]);
    assert!(
        ev["status"]["approval"]["decidedAt"].is_null(),
        "an approval was decided for a forged event: {}",
        ev["status"]
    );

    // 5. Agent A may not write B's report, nor take its name.
    let out = apply_report(
        &agent_a,
        &report_yaml(live, b, vm_b, "Reboot", "Completed", &[vm_b]),
    );
    assert!(
        !out.ok
            && out.stderr.contains(&format!(
                "forewarn agent on node {a} may write only its own ScheduledEventReports"
            )),
        "agent A wrote node B's report: {}{}",
        out.stdout,
        out.stderr
    );
    let out = apply_report(
        &agent_a,
        &report_yaml_named(
            &format!("{forged}.{b}"),
            forged,
            a,
            vm_a,
            "Reboot",
            "Scheduled",
            &[vm_b],
        ),
    );
    assert!(
        !out.ok
            && out
                .stderr
                .contains("the name must be <scheduledEvent>.<node>"),
        "agent A took node B's report name: {}{}",
        out.stdout,
        out.stderr
    );

    // 6. B's own agent reports the event gone: now B is released.
    let out = apply_report(
        &agent_b,
        &report_yaml(live, b, vm_b, "Reboot", "Completed", &[vm_b]),
    );
    assert!(out.ok, "agent B may write its own report: {}", out.stderr);
    eventually(
        "node B released on its own agent's report",
        Duration::from_secs(120),
        || (!unschedulable(&k, b)).then_some(()),
    );
    drop(ctl);
    clean();
}

/// The `helm test` Pod: rendered only with
/// `helmTest.enabled`, as a `test` hook, with the controller's image
/// (pinned by `image.digest` like every workload), security context and
/// placement, and RBAC that can only `get` the objects it checks.
#[test]
fn helm_test_pod_runs_like_the_controller_and_reads_only_what_it_checks() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let docs = documents(&render(&["--set", &format!("image.digest={digest}")]));
    let pod = find_doc(&docs, "Pod", "forewarn-test").expect("the helm test Pod");
    let controller = find_doc(&docs, "Deployment", "forewarn-controller").expect("controller");
    assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
    let container = &pod["spec"]["containers"][0];
    let controller_container = &controller["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], controller_container["image"]);
    assert_eq!(
        container["image"],
        format!("ghcr.io/forewarn/forewarn:0.1.0@{digest}").as_str(),
        "image.digest pins the image"
    );
    for d in &docs {
        for c in d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert!(
                c["image"].as_str().is_some_and(|i| i.ends_with(&digest)),
                "{} {} is not pinned: {}",
                d["kind"],
                d["metadata"]["name"],
                c["image"]
            );
        }
    }
    assert_eq!(
        container["securityContext"],
        controller_container["securityContext"]
    );
    assert_eq!(
        pod["spec"]["securityContext"],
        controller["spec"]["template"]["spec"]["securityContext"]
    );
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert_eq!(container["command"], controller_container["command"]);
    assert!(pod["spec"]["hostNetwork"].is_null());
    // With the controller on the host network and extra env (e.g. the API
    // server's address where no kube-proxy runs), the test Pod follows,
    // or it could not reach the API server the controller reaches.
    let env = r#"[{"name":"KUBERNETES_SERVICE_HOST","value":"10.0.0.1"}]"#;
    let host = documents(&render(&[
        "--set",
        "controller.hostNetwork=true",
        "--set-json",
        &format!("controller.extraEnv={env}"),
    ]));
    let host_pod = find_doc(&host, "Pod", "forewarn-test").expect("the helm test Pod");
    assert_eq!(host_pod["spec"]["hostNetwork"], true);
    assert_eq!(host_pod["spec"]["dnsPolicy"], "ClusterFirstWithHostNet");
    assert!(
        host_pod["spec"]["containers"][0]["env"]
            .as_array()
            .is_some_and(|e| e.contains(
                &serde_json::json!({"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"})
            )),
        "{host_pod}"
    );
    assert_eq!(
        container["args"],
        serde_json::json!([
            "check-install",
            "--lease-name=forewarn-controller",
            "--agent-daemonset=forewarn-agent"
        ])
    );
    // Its RBAC: get, on named objects only, and every one a test hook.
    for (kind, name) in [
        ("ServiceAccount", "forewarn-test"),
        ("ClusterRole", "forewarn-test"),
        ("ClusterRoleBinding", "forewarn-test"),
        ("Role", "forewarn-test"),
        ("RoleBinding", "forewarn-test"),
    ] {
        let d = find_doc(&docs, kind, name).unwrap_or_else(|| panic!("no {kind} {name}"));
        assert_eq!(
            d["metadata"]["annotations"]["helm.sh/hook"], "test",
            "{kind}"
        );
    }
    for kind in ["ClusterRole", "Role"] {
        for rule in find_doc(&docs, kind, "forewarn-test").expect("role")["rules"]
            .as_array()
            .expect("rules")
        {
            assert_eq!(rule["verbs"], serde_json::json!(["get"]), "{kind}: {rule}");
            assert!(
                rule["resourceNames"]
                    .as_array()
                    .is_some_and(|n| !n.is_empty()),
                "{kind}: {rule}"
            );
        }
    }
    let off = documents(&render(&["--set", "helmTest.enabled=false"]));
    assert!(
        !off.iter()
            .any(|d| d["metadata"]["name"].as_str() == Some("forewarn-test")),
        "helmTest.enabled=false still renders the test"
    );
}

/// `forewarn check-install`, as the `helm test` Pod runs it, with the test
/// ServiceAccount's own token (so its RBAC is proven enough): it fails while
/// no controller leads, naming the Lease, and passes once one does, with
/// the CRDs Established and every agent of the DaemonSet Ready.
#[test]
fn check_install_passes_only_with_a_leader_and_every_agent_ready() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    // The test hook's RBAC, applied as `helm test` would create it (the Pod
    // itself cannot run on KWOK's nodes: the process runs here instead).
    let rbac: String = documents(&render(&[
        "--show-only",
        "templates/tests/check-install.yaml",
    ]))
    .into_iter()
    .filter(|d| d["kind"] != "Pod")
    .map(|d| serde_json::to_string(&d).expect("json") + "\n")
    .collect();
    k.ok_stdin(&["apply", "--server-side", "-f", "-"], &rbac);
    let tester = token_kubeconfig(&k, "check-install", &token(&k, "forewarn-test", None));
    let check = || {
        let out = Command::new(env!("CARGO_BIN_EXE_forewarn"))
            .args(["check-install", "--namespace", NS])
            .env("KUBECONFIG", &tester.kubeconfig)
            .output()
            .expect("run forewarn check-install");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    // No controller has led in this namespace's Lease for a while (other
    // tests' controllers stopped): it fails, and says which check.
    k.run(
        &[
            "delete",
            "lease",
            "-n",
            NS,
            "forewarn-controller",
            "--ignore-not-found",
        ],
        None,
    );
    let (ok, out) = check();
    println!("{out}");
    assert!(!ok, "passed with no leader:\n{out}");
    assert!(
        out.contains("FAIL leader Lease forewarn-controller"),
        "{out}"
    );
    assert!(
        out.contains("ok   CRD scheduledevents.forewarn.dev"),
        "{out}"
    );
    assert!(
        out.contains("ok   CRD scheduledeventreports.forewarn.dev"),
        "{out}"
    );
    assert!(
        out.contains("ok   CRD virtualmachinereports.forewarn.dev"),
        "{out}"
    );
    assert!(
        !out.contains("forbidden"),
        "the test's RBAC is not enough:\n{out}"
    );
    // A controller with the chart's credentials leads: every check passes.
    let controller = token_kubeconfig(
        &k,
        "check-install-controller",
        &token(&k, CONTROLLER_SA, None),
    );
    let proc = ControllerProc::start(&controller.kubeconfig, "check-install-leader");
    let out = eventually("check-install passes", Duration::from_secs(120), || {
        let (ok, out) = check();
        ok.then_some(out)
    });
    println!("{out}");
    drop(proc);
    assert!(
        out.contains("ok   leader Lease forewarn-controller: held by check-install-leader"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("ok   agents (DaemonSet forewarn-agent): 3 of 3 Ready")),
        "{out}"
    );
}

/// A KWOK node labelled `kubernetes.io/os: windows` (KWOK fakes its kubelet
/// and the pods put on it, as for the cluster's other nodes); deleted when
/// dropped.
struct WindowsNode {
    k: Kubectl,
    name: String,
}

impl WindowsNode {
    fn create(k: &Kubectl, name: &str) -> WindowsNode {
        let node = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "kubernetes.io/os": "windows",
                    "kubernetes.io/arch": "amd64",
                    "kubernetes.io/hostname": name,
                    "type": "kwok",
                },
            },
        });
        k.ok_stdin(&["apply", "-f", "-"], &node.to_string());
        WindowsNode {
            k: k.clone(),
            name: name.into(),
        }
    }
}

impl Drop for WindowsNode {
    fn drop(&mut self) {
        self.k.run(
            &[
                "delete",
                "node",
                &self.name,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

/// `agent.windows.enabled` on the API server: the rendered chart is accepted;
/// installed, the Windows DaemonSet puts one HostProcess pod on a Windows
/// node (and the Linux one none), the controller counts that pod as the
/// node's agent, `helm test`'s check reads both DaemonSets with its own
/// RBAC, and a token bound to that pod is confined by the same admission
/// policy as a Linux agent's: its own node's reports only.
#[test]
fn windows_agents_run_on_windows_nodes_and_are_confined_like_linux_agents() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    ensure_namespace(&k, NS, "privileged");
    let enabled = ["--set", "agent.windows.enabled=true"];
    let rendered = render(&[
        "--set",
        "agent.windows.enabled=true",
        "--show-only",
        "templates/agent-daemonset-windows.yaml",
    ]);
    let lines = dry_run_apply(&k, &rendered);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("daemonset.apps/forewarn-agent-windows ")),
        "{lines:?}"
    );
    install_with(&k, &c, &enabled);
    let win = WindowsNode::create(&k, "node-win-000000");
    let node = win.name.as_str();

    // One agent pod on the Windows node, Ready (KWOK), as the server stored it.
    let pod = eventually(
        "the Windows agent pod Ready",
        Duration::from_secs(120),
        || {
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
            let items = pods["items"].as_array()?.clone();
            let ready = |p: &Value| {
                p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            };
            (items.len() == 1 && ready(&items[0])).then(|| items[0].clone())
        },
    );
    let owner = &pod["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"]),
        (
            &serde_json::json!("DaemonSet"),
            &serde_json::json!("forewarn-agent-windows")
        )
    );
    let spec = &pod["spec"];
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["os"]["name"], "windows");
    assert_eq!(spec["serviceAccountName"], AGENT_SA);
    assert_eq!(
        spec["securityContext"]["windowsOptions"]["hostProcess"],
        true
    );
    let sc = &spec["containers"][0]["securityContext"];
    assert_eq!(sc["windowsOptions"]["hostProcess"], true);
    assert_eq!(
        sc["windowsOptions"]["runAsUserName"],
        "NT AUTHORITY\\Local service"
    );
    for s in [&spec["securityContext"], sc] {
        for f in LINUX_ONLY_SECURITY_FIELDS {
            assert!(s.get(f).is_none(), "the server stored {f}: {s}");
        }
    }
    let win_ds = k.json(&["get", "-n", NS, "daemonset", "forewarn-agent-windows"]);
    assert_eq!(
        win_ds["status"]["desiredNumberScheduled"], 1,
        "{}",
        win_ds["status"]
    );
    let linux_ds = k.json(&["get", "-n", NS, "daemonset", "forewarn-agent"]);
    assert_eq!(
        linux_ds["status"]["desiredNumberScheduled"], 3,
        "the Linux agents stay off the Windows node: {}",
        linux_ds["status"]
    );
    // The controller's notion of an agent up on its node.
    let typed: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(pod.clone()).expect("a Pod");
    assert_eq!(
        forewarn::controller::observe::pods::agent_pod(&typed),
        Some(true)
    );

    // `helm test`'s check, with the RBAC the chart gives it.
    let rbac: String = documents(&render(&[
        "--set",
        "agent.windows.enabled=true",
        "--show-only",
        "templates/tests/check-install.yaml",
    ]))
    .into_iter()
    .filter(|d| d["kind"] != "Pod")
    .map(|d| serde_json::to_string(&d).expect("json") + "\n")
    .collect();
    k.ok_stdin(&["apply", "--server-side", "-f", "-"], &rbac);
    let tester = token_kubeconfig(
        &k,
        "check-install-windows",
        &token(&k, "forewarn-test", None),
    );
    let out = eventually(
        "both agent DaemonSets Ready",
        Duration::from_secs(120),
        || {
            let out = Command::new(env!("CARGO_BIN_EXE_forewarn"))
                .args([
                    "check-install",
                    "--namespace",
                    NS,
                    "--agent-daemonset",
                    "forewarn-agent",
                    "--agent-daemonset",
                    "forewarn-agent-windows",
                ])
                .env("KUBECONFIG", &tester.kubeconfig)
                .output()
                .expect("run forewarn check-install");
            let out = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.contains("ok   agents (DaemonSet forewarn-agent): 3 of 3 Ready")
                && out.contains("ok   agents (DaemonSet forewarn-agent-windows): 1 of 1 Ready"))
            .then_some(out)
        },
    );
    println!("{out}");
    assert!(!out.contains("forbidden"), "{out}");

    // The pod-bound token names the Windows node; the agents' policy lets it
    // write that node's reports and no other's.
    let (pod_name, pod_uid) = agent_pod_on(&k, node);
    let agent = token_kubeconfig(
        &k,
        "windows-agent",
        &token(&k, AGENT_SA, Some((&pod_name, &pod_uid))),
    );
    let who = agent.json(&["auth", "whoami"]);
    assert_eq!(
        who["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"],
        serde_json::json!([node]),
        "{}",
        who["status"]
    );
    let event = "5f0f8a0e-3c1d-4b7a-9e2f-0123456789ab";
    let out = apply_report(
        &agent,
        &report_yaml(event, node, "vm-win", "Reboot", "Scheduled", &["vm-win"]),
    );
    assert!(out.ok, "its own node's report was refused: {}", out.stderr);
    let stored = k.json(&["get", "scheduledeventreport", &format!("{event}.{node}")]);
    assert_eq!(stored["spec"]["report"]["node"], node);
    let out = apply_report(
        &agent,
        &report_yaml(
            event,
            "node-000000",
            "vm-0",
            "Reboot",
            "Scheduled",
            &["vm-0"],
        ),
    );
    println!("another node's report: {}", out.stderr.trim());
    assert!(!out.ok, "the Windows agent wrote another node's report");
    assert!(
        out.stderr.contains(AGENT_POLICY)
            && out.stderr.contains(&format!(
                "forewarn agent on node {node} may write only its own"
            )),
        "refused, but not by the agents' policy: {}",
        out.stderr
    );
    let other = k.run(
        &[
            "get",
            "scheduledeventreport",
            &format!("{event}.node-000000"),
        ],
        None,
    );
    assert!(!other.ok, "another node's report was stored");
    let out = apply_report(
        &agent,
        "apiVersion: forewarn.dev/v1alpha1\nkind: VirtualMachineReport\nmetadata:\n  name: node-000001\nspec:\n  node: node-000001\n  vm: vm-1\n",
    );
    assert!(!out.ok, "the Windows agent stated another node's VM");
    assert!(out.stderr.contains(AGENT_POLICY), "{}", out.stderr);

    k.run(
        &[
            "delete",
            "scheduledeventreport",
            &format!("{event}.{node}"),
            "--ignore-not-found",
        ],
        None,
    );
    drop(win);
    // The other tests expect the default release.
    install(&k, &c);
}

/// `make image`'s packer (hack/oci-image.py) is reproducible: the same binary and SOURCE_DATE_EPOCH give the same archive
/// byte for byte whenever it is packed; every file of the archive and of
/// the layer, and the config's `created`, carry the epoch; another epoch
/// gives another digest.
#[test]
fn image_archives_are_reproducible_from_the_binary_and_source_date_epoch() {
    let dir = out_dir().join("image-repro");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let pack = |name: &str, epoch: &str| -> Vec<u8> {
        let out = dir.join(name);
        let run = Command::new("python3")
            .arg(repo_root().join("hack/oci-image.py"))
            .args(["--name", "ghcr.io/forewarn/forewarn:test", "--out"])
            .arg(&out)
            .arg("--file")
            .arg(format!(
                "{}:/usr/local/bin/forewarn",
                env!("CARGO_BIN_EXE_forewarn")
            ))
            .args([
                "--entrypoint",
                "/usr/local/bin/forewarn",
                "--label",
                "org.opencontainers.image.revision=abc",
            ])
            .env("SOURCE_DATE_EPOCH", epoch)
            .output()
            .expect("run hack/oci-image.py");
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        std::fs::read(&out).expect("the archive")
    };
    let first = pack("a.tar", "1700000000");
    std::thread::sleep(Duration::from_millis(1100));
    let second = pack("b.tar", "1700000000");
    assert!(first == second, "the same inputs gave different archives");
    let other = pack("c.tar", "1700000001");
    assert!(first != other, "the epoch changed nothing");
    // What is inside, read by Python's tarfile (the archive and its layer).
    let seen = python_json(
        r#"
import gzip, io, json, sys, tarfile
t = tarfile.open(sys.argv[1])
index = json.load(t.extractfile("index.json"))
manifest = json.load(t.extractfile("blobs/sha256/" + index["manifests"][0]["digest"][7:]))
config = json.load(t.extractfile("blobs/sha256/" + manifest["config"]["digest"][7:]))
layer = tarfile.open(fileobj=io.BytesIO(gzip.decompress(t.extractfile("blobs/sha256/" + manifest["layers"][0]["digest"][7:]).read())))
print(json.dumps({
    "outer": sorted({m.mtime for m in t.getmembers()}),
    "layer": sorted({m.mtime for m in layer.getmembers()}),
    "created": config["created"],
    "labels": config["config"].get("Labels"),
    "user": config["config"]["User"],
}))
"#,
        &[dir.join("a.tar").as_os_str()],
    );
    assert_eq!(
        seen,
        serde_json::json!({
            "outer": [1700000000],
            "layer": [1700000000],
            "created": "2023-11-14T22:13:20Z",
            "labels": {"org.opencontainers.image.revision": "abc"},
            "user": "65532:65532",
        })
    );
}

/// Runs a Python script (`python3 -c`) with `args` and parses the JSON it
/// prints; panics with its stderr when it fails.
fn python_json(script: &str, args: &[&std::ffi::OsStr]) -> Value {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script's JSON")
}

/// `make image`'s index (hack/oci-image.py --index-of): one image per
/// platform, linux/amd64, linux/arm64 and windows/amd64, under one image
/// index that index.json names; packed twice, the same bytes. The Windows
/// image is a HostProcess base layer: its files under `Files/` (C:\ in the
/// container) and the five registry hives a base layer must carry, which
/// hivex opens as hives, and can write a key into and read it back (what a
/// loader that validates them needs: a checksummed base block, a hive bin,
/// a root key with its security cell). Nothing but Windows can say whether
/// Windows imports the layer: that is not proven here.
#[test]
fn the_image_index_holds_linux_amd64_arm64_and_a_windows_host_process_base_layer() {
    let dir = out_dir().join("image-index");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let exe = dir.join("forewarn.exe");
    std::fs::write(&exe, b"MZ not really a Windows executable").expect("exe");
    let oci = |args: &[String]| -> std::process::Output {
        Command::new("python3")
            .arg(repo_root().join("hack/oci-image.py"))
            .args(["--name", "ghcr.io/forewarn/forewarn:test"])
            .args(args)
            .env("SOURCE_DATE_EPOCH", "1700000000")
            .output()
            .expect("run hack/oci-image.py")
    };
    let ok = |args: &[String]| {
        let out = oci(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let path = |name: &str| dir.join(name).display().to_string();
    // Stand-ins for the binaries (what is packed is checked by its first
    // bytes; the real ones go through tests/real_node_chart.rs).
    let elf = dir.join("forewarn");
    std::fs::write(&elf, b"\x7fELF not really a Linux executable").expect("elf");
    let linux = elf.display().to_string();
    for (file, platform, bin, dest) in [
        (
            "amd64.tar",
            "linux/amd64",
            linux.to_string(),
            "/usr/local/bin/forewarn",
        ),
        (
            "arm64.tar",
            "linux/arm64",
            linux.to_string(),
            "/usr/local/bin/forewarn",
        ),
        (
            "windows.tar",
            "windows/amd64",
            exe.display().to_string(),
            "/forewarn.exe",
        ),
    ] {
        ok(&[
            "--out".into(),
            path(file),
            "--platform".into(),
            platform.into(),
            "--file".into(),
            format!("{bin}:{dest}"),
            "--entrypoint".into(),
            dest.into(),
        ]);
    }
    let index_of = |out: &str| -> Vec<String> {
        let mut args = vec!["--out".to_string(), path(out)];
        for f in ["windows.tar", "amd64.tar", "arm64.tar"] {
            args.extend(["--index-of".to_string(), path(f)]);
        }
        args
    };
    ok(&index_of("index.tar"));
    std::thread::sleep(Duration::from_millis(1100));
    ok(&index_of("again.tar"));
    assert!(
        std::fs::read(dir.join("index.tar")).expect("index")
            == std::fs::read(dir.join("again.tar")).expect("again"),
        "the same images gave two different index archives"
    );
    // Two images of one platform, or an index with options of an image:
    // refused, with a reason.
    let twice = oci(&[
        "--out".into(),
        path("bad.tar"),
        "--index-of".into(),
        path("amd64.tar"),
        "--index-of".into(),
        path("amd64.tar"),
    ]);
    assert!(
        !twice.status.success(),
        "an index of two linux/amd64 images was written"
    );
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("two images for linux/amd64"),
        "{}",
        String::from_utf8_lossy(&twice.stderr)
    );

    // What is inside, read by Python's tarfile; the hives are written out
    // for hivex.
    let hives = dir.join("hives");
    let seen = python_json(
        r#"
import gzip, io, json, os, sys, tarfile
t = tarfile.open(sys.argv[1])
blob = lambda d: t.extractfile("blobs/sha256/" + d[7:]).read()
top = json.load(t.extractfile("index.json"))["manifests"]
index = json.loads(blob(top[0]["digest"]))
out = {"top": [(e["mediaType"], e["annotations"]["io.containerd.image.name"]) for e in top], "images": {}}
os.makedirs(sys.argv[2], exist_ok=True)
for m in index["manifests"]:
    manifest = json.loads(blob(m["digest"]))
    config = json.loads(blob(manifest["config"]["digest"]))
    layer = tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(manifest["layers"][0]["digest"]))))
    files = {}
    for e in layer.getmembers():
        if e.isfile():
            data = layer.extractfile(e).read()
            files[e.name] = data[:4].hex()
            if "/config/" in e.name:
                open(os.path.join(sys.argv[2], os.path.basename(e.name)), "wb").write(data)
    platform = m["platform"]["os"] + "/" + m["platform"]["architecture"]
    out["images"][platform] = {
        "config": config["os"] + "/" + config["architecture"],
        "entrypoint": config["config"]["Entrypoint"],
        "user": config["config"].get("User"),
        "files": files,
    }
print(json.dumps(out))
"#,
        &[dir.join("index.tar").as_os_str(), hives.as_os_str()],
    );
    println!("{seen:#}");
    assert_eq!(
        seen["top"],
        serde_json::json!([[
            "application/vnd.oci.image.index.v1+json",
            "ghcr.io/forewarn/forewarn:test"
        ]])
    );
    let elf = "7f454c46";
    let regf = "72656766";
    assert_eq!(
        seen["images"],
        serde_json::json!({
            "linux/amd64": {
                "config": "linux/amd64",
                "entrypoint": ["/usr/local/bin/forewarn"],
                "user": "65532:65532",
                "files": {"usr/local/bin/forewarn": elf},
            },
            "linux/arm64": {
                "config": "linux/arm64",
                "entrypoint": ["/usr/local/bin/forewarn"],
                "user": "65532:65532",
                "files": {"usr/local/bin/forewarn": elf},
            },
            "windows/amd64": {
                "config": "windows/amd64",
                "entrypoint": ["/forewarn.exe"],
                "user": null,
                "files": {
                    "Files/forewarn.exe": "4d5a206e",
                    "Files/Windows/System32/config/DEFAULT": regf,
                    "Files/Windows/System32/config/SAM": regf,
                    "Files/Windows/System32/config/SECURITY": regf,
                    "Files/Windows/System32/config/SOFTWARE": regf,
                    "Files/Windows/System32/config/SYSTEM": regf,
                },
            },
        })
    );

    // Each hive, through hivex: opened, its root key named for the hive
    // and empty; then a key and a value written into it and read back.
    let hivexsh = |args: &[&str], script: &str| -> String {
        let mut child = Command::new("hivexsh")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run hivexsh (libhivex-bin: hack/toolchains.sh installs it)");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(script.as_bytes())
            .expect("write to hivexsh");
        let out = child.wait_with_output().expect("hivexsh");
        assert!(
            out.status.success(),
            "hivexsh {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for name in ["DEFAULT", "SAM", "SECURITY", "SOFTWARE", "SYSTEM"] {
        let hive = hives.join(name);
        let hive = hive.to_str().expect("path");
        let root = hivexsh(&[hive], "ls\nlsval\n");
        assert_eq!(root.trim(), "", "{name}: the root key holds something");
        let xml = Command::new("hivexml")
            .arg(hive)
            .output()
            .expect("run hivexml");
        assert!(
            xml.status.success(),
            "hivexml {name}: {}",
            String::from_utf8_lossy(&xml.stderr)
        );
        let xml = String::from_utf8_lossy(&xml.stdout);
        assert!(
            xml.contains(&format!("<node name=\"{name}\" root=\"1\">")),
            "{name}: hivexml reads no root key named {name}: {xml}"
        );
        let written = format!("{hive}.written");
        hivexsh(
            &["-w", hive],
            &format!(
                "add forewarn\ncd forewarn\nsetval 1\nprobe\nstring:written\ncommit {written}\n"
            ),
        );
        let back = hivexsh(&[&written], "cd forewarn\nlsval\n");
        assert_eq!(
            back.trim(),
            "\"probe\"=\"written\"",
            "{name}: the key written into the hive"
        );
    }
}

/// Leader election with the chart's Role: a standby holding the chart's
/// controller token waits on the Lease (reads it, and watches that one
/// Lease by a `metadata.name` field selector, which the Role's
/// `resourceNames` allow) and takes it over as soon as the leader releases
/// it on SIGTERM, well before the 15 s the Lease would take to expire.
#[test]
fn a_standby_with_the_chart_token_takes_over_the_released_lease() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    k.run(
        &[
            "delete",
            "lease",
            "-n",
            NS,
            "forewarn-controller",
            "--ignore-not-found",
        ],
        None,
    );
    let controller = token_kubeconfig(&k, "lease-controller", &token(&k, CONTROLLER_SA, None));
    let leader = ControllerProc::start(&controller.kubeconfig, "lease-leader");
    eventually(
        "the first controller leads",
        Duration::from_secs(120),
        || leader.log().contains("Leading: reconciling").then_some(()),
    );
    let standby = ControllerProc::start(&controller.kubeconfig, "lease-standby");
    // Long enough for its first attempts to find the Lease held.
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        !standby.log().contains("Leading: reconciling"),
        "the standby leads while the leader holds the Lease:\n{}",
        standby.log()
    );
    let holder = k.json(&["get", "lease", "-n", NS, "forewarn-controller"]);
    assert_eq!(holder["spec"]["holderIdentity"], "lease-leader");
    let leader_log = leader.log.clone();
    let stopped = Instant::now();
    drop(leader);
    let took = stopped.elapsed();
    eventually("the standby leads", Duration::from_secs(120), || {
        standby.log().contains("Leading: reconciling").then_some(())
    });
    println!(
        "standby leads {:?} after the leader's SIGTERM ({took:?} to stop it); woken by the watch: {}",
        stopped.elapsed(),
        standby.log().contains("The Lease was released")
    );
    let holder = k.json(&["get", "lease", "-n", NS, "forewarn-controller"]);
    assert_eq!(holder["spec"]["holderIdentity"], "lease-standby");
    let leader_log = std::fs::read_to_string(&leader_log).unwrap_or_default();
    assert!(
        leader_log.contains("Released the leader-election Lease"),
        "the leader did not release the Lease on SIGTERM:\n{leader_log}"
    );
    // Taken over because of the release, not on the Lease's expiry: by the
    // two processes' own log times (RFC 3339, first on each line), the
    // standby acquired it less than 12 s after the leader released it. The
    // Lease's duration is 15 s and the leader renewed it every 2 s, so a
    // standby that missed the release could take it no sooner than 13 s
    // after; one that saw it (by its watch, or its next try 2 s later at
    // most) takes it within about a second. This is the one bound that
    // tells the two apart.
    let logged = |log: &str, what: &str| -> chrono::DateTime<chrono::Utc> {
        log.lines()
            .find(|l| l.contains(what))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no timed {what:?} in:\n{log}"))
    };
    let released = logged(&leader_log, "Released the leader-election Lease");
    let acquired = logged(&standby.log(), "Acquired the leader-election Lease");
    println!(
        "the standby acquired the Lease {:.2} s after the leader released it",
        (acquired - released).as_seconds_f64()
    );
    assert!(
        acquired - released < chrono::Duration::seconds(12),
        "the standby acquired the Lease {:.1} s after its release: on its expiry, not the release",
        (acquired - released).as_seconds_f64()
    );
    for (name, log) in [("leader", leader_log), ("standby", standby.log())] {
        assert!(
            !log.contains("forbidden") && !log.contains("Forbidden"),
            "{name}: refused:\n{log}"
        );
    }
    drop(standby);
    k.ok(&[
        "delete",
        "lease",
        "-n",
        NS,
        "forewarn-controller",
        "--ignore-not-found",
    ]);
}

/// The controller with the chart's token (and `--agent-policy`, as the
/// chart runs it) through a drain that a PodDisruptionBudget blocks, then
/// past the event's retention: each refused eviction (429) makes it read
/// the budget (is it wedged?) and post `EvictionBlocked` again, which kube's
/// Recorder folds into one Event by patching its series; once the node's
/// own agent reports the event gone the node is released, and 3 s later
/// (policy `retention: 3s`) the ScheduledEvent and its report are deleted.
#[test]
fn chart_controller_waits_on_a_budget_and_deletes_the_event_past_retention() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let (b, vm_b) = ("node-000001", "vm-budget-1");
    let (ns, sev) = ("budget-blocked", "b0000000-0000-4000-8000-0000000000be");
    for n in ["node-000000", b, "node-000002"] {
        k.run(&["uncordon", n], None);
    }
    k.run(
        &["delete", "scheduledevent", sev, "--ignore-not-found"],
        None,
    );
    k.run(
        &["delete", "scheduledeventreports", "--all", "--wait=false"],
        None,
    );
    k.run(
        &[
            "delete",
            "lease",
            "-n",
            NS,
            "forewarn-controller",
            "--ignore-not-found",
        ],
        None,
    );
    k.run(
        &[
            "delete",
            "namespace",
            ns,
            "--ignore-not-found",
            "--wait=true",
        ],
        None,
    );
    ensure_namespace(&k, ns, "baseline");
    // One pod on B that its budget lets no eviction take.
    k.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: blocker\n  namespace: {ns}\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: blocker}}\n  template:\n    metadata:\n      labels: {{app: blocker}}\n    spec:\n      nodeSelector: {{kubernetes.io/hostname: {b}}}\n      terminationGracePeriodSeconds: 0\n      containers:\n        - name: app\n          image: registry.invalid/blocker:1\n---\n\
             apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: blocker\n  namespace: {ns}\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels: {{app: blocker}}\n"
        ),
    );
    eventually(
        "the blocker runs on B and its budget allows no disruption",
        Duration::from_secs(120),
        || {
            let pdb = k.json(&["get", "pdb", "-n", ns, "blocker"]);
            (pdb["status"]["currentHealthy"] == 1 && pdb["status"]["disruptionsAllowed"] == 0)
                .then_some(())
        },
    );
    let policy = out_dir().join("budget-retention-policy.yaml");
    std::fs::write(&policy, "retention: 3s\n").expect("policy file");
    let policy_arg = format!("--policy-file={}", policy.display());
    let controller = token_kubeconfig(&k, "budget-controller", &token(&k, CONTROLLER_SA, None));
    let ctl =
        ControllerProc::start_with(&controller.kubeconfig, "budget-controller", &[&policy_arg]);
    eventually("the controller leads", Duration::from_secs(120), || {
        ctl.log().contains("Leading: reconciling").then_some(())
    });
    state_vms(&k, &[(b, vm_b)]);
    let (pod, uid) = agent_pod_on(&k, b);
    let agent_b = token_kubeconfig(
        &k,
        "budget-agent-b",
        &token(&k, AGENT_SA, Some((&pod, &uid))),
    );

    // 1. B's agent reports a Reboot of its VM: B is cordoned and its pod's
    //    eviction refused, pass after pass.
    let out = apply_report(
        &agent_b,
        &report_yaml(sev, b, vm_b, "Reboot", "Scheduled", &[vm_b]),
    );
    assert!(out.ok, "agent B may write its own report: {}", out.stderr);
    let blocked = eventually(
        "an EvictionBlocked Event of the event seen twice (its series patched)",
        Duration::from_secs(120),
        || {
            let events = k.json(&[
                "get",
                "events.events.k8s.io",
                "-A",
                "--field-selector",
                "reason=EvictionBlocked",
            ]);
            events["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["regarding"]["name"] == sev && e["series"]["count"].as_i64() >= Some(2))
                .cloned()
        },
    );
    println!("{}: {}", blocked["series"], blocked["note"]);
    assert!(
        blocked["note"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("blocked by PodDisruptionBudget {ns}/blocker")),
        "{}",
        blocked["note"]
    );
    assert!(unschedulable(&k, b), "node B is not cordoned");
    let pods = k.json(&["get", "pods", "-n", ns, "-l", "app=blocker"]);
    assert_eq!(
        pods["items"].as_array().map(Vec::len),
        Some(1),
        "the blocked pod was evicted: {pods}"
    );

    // 2. B's agent reports the event gone: B is released, and the event
    //    and its report are deleted once its 3 s of retention are over.
    let out = apply_report(
        &agent_b,
        &report_yaml(sev, b, vm_b, "Reboot", "Completed", &[vm_b]),
    );
    assert!(out.ok, "agent B may write its own report: {}", out.stderr);
    eventually(
        "the ScheduledEvent deleted past its retention",
        Duration::from_secs(120),
        || {
            let out = k.run(&["get", "scheduledevent", sev], None);
            (!out.ok && out.stderr.contains("NotFound")).then_some(())
        },
    );
    eventually("its report deleted", Duration::from_secs(120), || {
        let out = k.run(
            &["get", "scheduledeventreport", &format!("{sev}.{b}")],
            None,
        );
        (!out.ok && out.stderr.contains("NotFound")).then_some(())
    });
    assert!(!unschedulable(&k, b), "node B is still cordoned");
    let log = ctl.log();
    drop(ctl);
    assert!(
        log.contains("The agents' admission policy is installed"),
        "the controller did not find the chart's admission policy:\n{log}"
    );
    for bad in ["forbidden", "Forbidden"] {
        assert!(!log.contains(bad), "the controller was refused:\n{log}");
    }
    // Gone before the next test: a later drain of B must not meet the
    // blocker in a terminating namespace (its eviction then answers 403
    // NamespaceTerminating, which tests/audit.rs would count).
    k.ok(&["delete", "namespace", ns, "--wait=true", "--timeout=120s"]);
    k.ok(&[
        "delete",
        "lease",
        "-n",
        NS,
        "forewarn-controller",
        "--ignore-not-found",
    ]);
}

/// The webhooks file of the module docs of src/controller/webhooks.rs (the
/// format the README points to), without its `caFile` (which names a file
/// of the pod).
fn webhooks_example() -> String {
    let src = std::fs::read_to_string(repo_root().join("src/controller/webhooks.rs"))
        .expect("src/controller/webhooks.rs");
    src.lines()
        .map_while(|l| l.strip_prefix("//!"))
        .skip_while(|l| l.trim() != "```yaml")
        .skip(1)
        .take_while(|l| l.trim() != "```")
        .filter(|l| !l.contains("caFile"))
        .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l)))
        .collect()
}

/// `controller.webhooks.config` lands in a Secret of the chart that the
/// controller mounts and is passed (`--webhooks-file`), and what it holds
/// loads as the file it came from; `existingSecret` mounts the operator's
/// own Secret instead (no Secret of the chart); neither: no webhook at all.
/// With a NetworkPolicy, webhooks open their port and DNS.
#[test]
fn webhooks_come_from_a_secret_the_controller_mounts() {
    use forewarn::notify::webhooks::Config;
    let example = webhooks_example();
    let expected = Config::parse(&example, "example").expect("the example loads");
    assert_eq!(expected.webhooks.len(), 2, "{example}");
    let file = out_dir().join("webhooks.values.yaml");
    std::fs::write(
        &file,
        format!(
            "networkPolicy: {{enabled: true}}\ncontroller:\n  webhooks:\n    config:\n{}",
            indent(&example, 6)
        ),
    )
    .expect("values file");
    let docs = documents(&render(&["-f", &file.to_string_lossy()]));
    let kind = |k: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == k && d["metadata"]["name"] == name)
            .cloned()
    };
    let secret = kind("Secret", &format!("{RELEASE}-webhooks")).expect("the webhooks Secret");
    let text = secret["stringData"]["webhooks.yaml"]
        .as_str()
        .expect("webhooks.yaml");
    assert_eq!(Config::parse(text, "the Secret").expect("loads"), expected);
    let deployment = kind("Deployment", &format!("{RELEASE}-controller")).expect("controller");
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    assert!(
        container["args"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(
                "--webhooks-file=/etc/forewarn-webhooks/webhooks.yaml"
            )),
        "{container}"
    );
    assert!(
        container["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!({"name": "webhooks", "mountPath": "/etc/forewarn-webhooks", "readOnly": true})),
        "{container}"
    );
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    assert!(
        volumes.contains(&serde_json::json!({"name": "webhooks", "secret": {"secretName": format!("{RELEASE}-webhooks")}})),
        "{volumes:?}"
    );
    assert!(pod["metadata"]["annotations"]["checksum/webhooks"].is_string());
    let egress = kind("NetworkPolicy", &format!("{RELEASE}-controller")).expect("NetworkPolicy")
        ["spec"]["egress"]
        .clone();
    let ports: Vec<Value> = egress
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| e["ports"].as_array().cloned().unwrap_or_default())
        .collect();
    for p in [
        serde_json::json!({"port": 443, "protocol": "TCP"}),
        serde_json::json!({"port": 53, "protocol": "UDP"}),
        serde_json::json!({"port": 53, "protocol": "TCP"}),
    ] {
        assert!(ports.contains(&p), "{p} not in {egress}");
    }

    // The operator's own Secret.
    let docs = documents(&render(&[
        "--set",
        "controller.webhooks.existingSecret=oncall-hooks",
    ]));
    assert!(
        !docs.iter().any(|d| d["kind"] == "Secret"),
        "the chart made a Secret of its own"
    );
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("controller");
    let pod = &deployment["spec"]["template"];
    assert!(
        pod["spec"]["volumes"].as_array().unwrap().contains(
            &serde_json::json!({"name": "webhooks", "secret": {"secretName": "oncall-hooks"}})
        ),
        "{pod}"
    );
    assert!(pod["metadata"]["annotations"]["checksum/webhooks"].is_null());

    // None.
    let plain = render(&[]);
    assert!(!plain.contains("webhooks"), "{plain}");
}

/// Values.schema.json types `controller.webhooks.config` as the controller
/// reads the file: an unknown format or key fails `helm template`.
#[test]
fn a_misspelt_webhook_fails_the_install() {
    let chart = chart_dir();
    for (set, expected) in [
        (
            "controller.webhooks.config.webhooks[0].name=a,controller.webhooks.config.webhooks[0].url=https://x,controller.webhooks.config.webhooks[0].format=Discord",
            "format",
        ),
        (
            "controller.webhooks.config.webhooks[0].name=a,controller.webhooks.config.webhooks[0].url=https://x,controller.webhooks.config.webhooks[0].retries=3",
            "retries",
        ),
        ("controller.webhooks.existingSecrets=x", "existingSecrets"),
    ] {
        let out = helm(&[
            "template",
            RELEASE,
            &chart,
            "--namespace",
            NS,
            "--api-versions",
            VAP_API,
            "--set",
            set,
        ]);
        assert!(!out.ok, "{set} was accepted");
        assert!(out.stderr.contains(expected), "{set}: {}", out.stderr);
    }
}
