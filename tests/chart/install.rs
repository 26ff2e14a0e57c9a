//! The chart on the API server: every rendered object accepted, Pod Security
//! for each workload, and `helm test` (its Pod, its RBAC and
//! `forewarn check-install` with its own token).

use std::process::Command;
use std::time::Duration;

use forewarn_harness::cluster::repo_root;

use crate::on_cluster::{ControllerProc, install, token, token_kubeconfig};
use crate::{
    CONTROLLER_SA, Kubectl, NS, admin, all_features_values, cluster, documents, ensure_namespace,
    eventually, find_doc, render,
};

/// Installs the minimal prometheus-operator CRDs (tests/chart-fixtures/).
pub fn install_monitoring_crds(k: &Kubectl) {
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
pub fn dry_run_apply(k: &Kubectl, yaml: &str) -> Vec<String> {
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
