//! The chart rendered without a cluster: `helm lint --strict`, the CRDs and
//! `manifests/` in step with the sources, the values schema, the monitors
//! and alerts, the admission policy it refuses to go without, and the
//! workloads' flags and security contexts.

use std::path::Path;

use forewarn_harness::cluster::{helm_bin, repo_root};
use serde_json::Value;

use crate::{
    AGENT_POLICY, CONTROLLER_POD_POLICY, DECISIONS_POLICY, NS, RELEASE, UNCONFINED, VAP_API,
    all_features_values, chart_dir, documents, helm, render, run,
};

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
/// DaemonSet name and every runbook_url at the chart's version, and both
/// monitors set the `job` the rules select on; every alert links its
/// runbook page (docs/runbooks/<alert>.md), which exists and is listed.
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
    let text = std::fs::read_to_string(repo_root().join("charts/forewarn/files/alerts.yaml"))
        .expect("read alerts.yaml");
    let file: Value = serde_yaml::from_str::<Value>(&text).expect("alerts.yaml");
    // The file names main's runbooks; the chart renders those of its own
    // version, the release's tag.
    let chart_yaml: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("charts/forewarn/Chart.yaml"))
            .expect("read Chart.yaml"),
    )
    .expect("Chart.yaml");
    let version = chart_yaml["version"].as_str().expect("Chart.yaml version");
    let main_runbooks = "https://github.com/forewarn/forewarn/blob/main/docs/runbooks/";
    let versioned_runbooks =
        format!("https://github.com/forewarn/forewarn/blob/v{version}/docs/runbooks/");
    assert!(text.contains(main_runbooks), "alerts.yaml links no runbook");
    let expected: Value =
        serde_yaml::from_str::<Value>(&text.replace(main_runbooks, &versioned_runbooks))
            .expect("alerts.yaml, versioned");
    for set in [
        "metrics.serviceMonitor.enabled=true",
        "metrics.podMonitor.enabled=true",
        "metrics.prometheusRule.scrapedWithoutMonitors=true",
    ] {
        let rule = rule_of(&["--set", set]).unwrap_or_else(|| panic!("no rule with {set}"));
        assert_eq!(
            rule["spec"], expected,
            "with {set}, the rule is not alerts.yaml (runbooks at v{version})"
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
        serde_json::to_string(&expected).expect("json")
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
    // Every alert's runbook is a page of docs/runbooks/ (a link that
    // resolves in the repository), titled with the alert's name, listed in
    // the runbooks' index and in docs/monitoring.md's table of alerts; and
    // every runbook page is an alert's.
    let read_doc = |path: &str| {
        std::fs::read_to_string(repo_root().join(path))
            .unwrap_or_else(|e| panic!("read {path}: {e}"))
    };
    let index = read_doc("docs/runbooks/README.md");
    let monitoring = read_doc("docs/monitoring.md");
    let rules = file["groups"][0]["rules"].as_array().expect("rules");
    let rendered = rule_of(&["--set", "metrics.podMonitor.enabled=true"]).expect("a rule");
    let rendered = rendered["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rendered rules");
    assert!(rules.len() >= 18, "{} alerts", rules.len());
    assert_eq!(rules.len(), rendered.len());
    let mut names = std::collections::BTreeSet::new();
    for (r, rr) in rules.iter().zip(rendered) {
        let name = r["alert"].as_str().expect("alert name");
        names.insert(name.to_string());
        let page = format!("docs/runbooks/{name}.md");
        let url = r["annotations"]["runbook_url"].as_str().unwrap_or_default();
        assert_eq!(
            url,
            format!("https://github.com/forewarn/forewarn/blob/main/{page}"),
            "{name}"
        );
        let url = rr["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(
            url,
            format!("https://github.com/forewarn/forewarn/blob/v{version}/{page}"),
            "{name}, rendered"
        );
        let runbook = read_doc(&page);
        assert_eq!(
            runbook.lines().next(),
            Some(format!("# {name}").as_str()),
            "{page} is not titled {name}"
        );
        assert!(
            index.contains(&format!("[{name}]({name}.md)")),
            "docs/runbooks/README.md does not list {name}"
        );
        assert!(
            monitoring.contains(&format!("[{name}](runbooks/{name}.md)")),
            "docs/monitoring.md's table of alerts does not list {name}"
        );
    }
    let pages: std::collections::BTreeSet<String> =
        std::fs::read_dir(repo_root().join("docs/runbooks"))
            .expect("docs/runbooks")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter_map(|f| f.strip_suffix(".md").map(str::to_string))
            .filter(|f| f != "README")
            .collect();
    assert_eq!(
        pages, names,
        "runbook pages without an alert, or alerts without a page"
    );
}

/// The chart's example values files (charts/forewarn/examples/, which its
/// README and docs/install.md point to) each pass `helm lint --strict` and
/// render the agent and the controller.
#[test]
fn example_values_files_lint_and_render() {
    let dir = repo_root().join("charts/forewarn/examples");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert!(files.len() >= 2, "example values files: {files:?}");
    let chart = chart_dir();
    for file in &files {
        let out = helm(&["lint", "--strict", chart.as_str(), "-f", file]);
        assert!(
            out.ok && !out.stdout.contains("[WARNING]") && !out.stdout.contains("[ERROR]"),
            "helm lint --strict -f {file}:\n{}{}",
            out.stdout,
            out.stderr
        );
        let kinds: Vec<Value> = documents(&render(&["-f", file]))
            .into_iter()
            .map(|d| d["kind"].clone())
            .collect();
        for kind in ["DaemonSet", "Deployment"] {
            assert!(kinds.contains(&Value::from(kind)), "{file}: no {kind}");
        }
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
    // The on-call humans' role: what `kubectl forewarn hold|approve` and
    // `kubectl get sev` need, nothing more.
    assert_eq!(
        rules("forewarn-on-call"),
        serde_json::json!([
            {"apiGroups": ["forewarn.dev"], "resources": ["scheduledevents"], "verbs": ["get", "list", "watch", "patch"]}
        ])
    );
    // No role of the agents may patch (or otherwise write) a
    // ScheduledEvent: the hold and approve-now annotations are the humans'.
    for d in docs.iter().filter(|d| {
        d["kind"] == "ClusterRole"
            && d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("forewarn-agent"))
    }) {
        for r in d["rules"].as_array().into_iter().flatten() {
            let events = r["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|x| x == "scheduledevents" || x == "*");
            let writes = r["verbs"].as_array().into_iter().flatten().any(|v| {
                ["patch", "update", "create", "delete", "*"].contains(&v.as_str().unwrap_or(""))
            });
            assert!(!(events && writes), "{}: {r}", d["metadata"]["name"]);
        }
    }
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
    // Nothing else: its VirtualMachineReport claims no owner (the
    // controller makes the Node its owner).
    assert_eq!(c["env"].as_array().map(Vec::len), Some(2), "{}", c["env"]);
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

/// The controller may list namespaces only when the policy's
/// `excludePods.namespaceSelector` needs their labels; a namespace
/// selector the controller would refuse is refused by the schema.
#[test]
fn namespaces_are_listed_only_for_a_namespace_selector() {
    let namespace_rules = |extra: &[&str]| -> Vec<Value> {
        documents(&render(extra))
            .into_iter()
            .filter(|d| d["kind"] == "ClusterRole")
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().any(|x| x == "namespaces"))
            })
            .collect()
    };
    assert!(
        namespace_rules(&[]).is_empty(),
        "namespaces granted by default"
    );
    assert!(
        namespace_rules(&[
            "--set-json",
            r#"controller.policy.excludePods={"namespaces":["monitoring"]}"#
        ])
        .is_empty(),
        "namespaces granted for names alone"
    );
    for selector in ["{}", r#"{"matchLabels":{"forewarn.dev/drain":"skip"}}"#] {
        let rules = namespace_rules(&[
            "--set-json",
            &format!(r#"controller.policy.excludePods={{"namespaceSelector":{selector}}}"#),
        ]);
        assert_eq!(rules.len(), 1, "{selector}: {rules:?}");
        assert_eq!(
            rules[0]["verbs"],
            serde_json::json!(["list", "watch"]),
            "{selector}"
        );
    }
    let chart = chart_dir();
    let out = helm(&[
        "template",
        RELEASE,
        &chart,
        "--api-versions",
        VAP_API,
        "--set-json",
        r#"controller.policy.nodeSelector={"matchExpressions":[{"key":"a","operator":"in","values":["b"]}]}"#,
    ]);
    assert!(!out.ok, "an unknown operator was accepted");
    assert!(out.stderr.contains("operator"), "{}", out.stderr);
}

/// `controller.dryRun: true` puts `--dry-run` on the controller's command
/// line, which the binary's own parser reads as a dry run; the default
/// (false) leaves it off; the schema types it.
#[test]
fn controller_dry_run_is_a_value_that_reaches_the_container() {
    use clap::Parser as _;
    use forewarn::cli::{Cli, Command};
    for (extra, expected) in [
        (&[][..], false),
        (&["--set", "controller.dryRun=true"][..], true),
        (&["--set", "controller.dryRun=false"][..], false),
    ] {
        let docs = documents(&render(extra));
        let dep = docs
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("the controller's Deployment");
        let c = &dep["spec"]["template"]["spec"]["containers"][0];
        let argv: Vec<String> = c["command"]
            .as_array()
            .into_iter()
            .chain(c["args"].as_array())
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        assert_eq!(
            argv.iter().filter(|a| *a == "--dry-run").count(),
            usize::from(expected),
            "{extra:?}: {argv:?}"
        );
        let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        let Command::Controller(args) = cli.command else {
            panic!("not the controller: {argv:?}");
        };
        assert_eq!(args.dry_run, expected, "{extra:?}: {argv:?}");
    }
    let out = helm(&[
        "template",
        RELEASE,
        &chart_dir(),
        "--set-string",
        "controller.dryRun=yes",
    ]);
    assert!(!out.ok, "a string controller.dryRun was accepted");
    assert!(out.stderr.contains("dryRun"), "{}", out.stderr);
}
