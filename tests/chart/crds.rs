//! The CRDs on upgrade: the README's manual step, the start-up check of the
//! processes facing older CRDs, and the CRD hook (its Job, and its `forewarn
//! crds apply` with nothing but the hook's credentials).

use std::path::Path;
use std::time::Duration;

use forewarn_harness::cluster::repo_root;
use serde_json::Value;

use crate::on_cluster::{
    ControllerProc, agent_pod_on, apply_status, install, managers, report_yaml, sev_yaml, token,
    token_kubeconfig,
};
use crate::{
    AGENT_SA, CONTROLLER_SA, Kubectl, NS, Out, RELEASE, VAP_API, admin, all_features_values,
    chart_dir, cluster, documents, ensure_namespace, eventually, helm, render, run,
};

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

/// The start-up check (src/api/install.rs), with the chart's credentials:
/// facing CRDs older than the binary (a status field and a report field
/// missing), the controller and the agent exit non-zero with one error
/// naming the CRD, the field and the command that applies the new CRDs,
/// before the controller touches its Lease; with the current CRDs both go
/// on. A token without the chart's `get` on the CRDs is let through with a
/// warning.
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
pub fn hook_credentials(k: &Kubectl, name: &str) -> Kubectl {
    ensure_namespace(k, NS, "privileged");
    let docs = documents(&render(&["--show-only", "templates/crds-upgrade-job.yaml"]));
    for d in docs.iter().filter(|d| d["kind"] != "Job") {
        k.ok_stdin(&["apply", "--server-side", "-f", "-"], &d.to_string());
    }
    token_kubeconfig(k, name, &token(k, "forewarn-crds", None))
}

/// `forewarn crds apply` (what the hook Job runs) with `who`'s credentials.
pub fn crds_apply(who: &Kubectl) -> Out {
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
