//! Only the controller's decisions are sent, against a real local control
//! plane with the chart installed: an approval an administrator writes by
//! hand into a `ScheduledEvent`'s status during the drain is neither sent
//! to IMDS by an agent nor carried on from by the controller (which removes
//! it and records who wrote it), and the chart's admission policy refuses
//! anyone but the controller's ServiceAccount a write as the controller's
//! field manager, so no one can make an approval read as the controller's.
//! On a cluster of its own. Fails, never skips, when the cluster cannot
//! start.

#[path = "support/trust_env.rs"]
mod trust_env;

use std::path::{Path, PathBuf};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use trust_env::{
    AGENT_POLICY, AGENT_SA, CONTROLLER_SA, Kubectl, NS, admin, agent_pod_on, eventually,
    install_with, token, token_kubeconfig,
};

use chrono::{DateTime, Utc};
use forewarn::api::{CONTROLLER_MANAGER, ScheduledEvent};
use forewarn_harness::cluster::Cluster;
use serde_json::{Value, json};

/// The chart's ValidatingAdmissionPolicy, and its binding (same name), by
/// which no one but the controller's ServiceAccount writes as its field
/// manager.
const DECISIONS_POLICY: &str = "forewarn-controller-decisions";
/// The event of tests/fixtures/platform-redeploy.yaml, and the node whose
/// VM it names.
const REDEPLOY: &str = "0C3B5B7E-2D0B-4D39-9B51-6A1F0E2D7A01";
const REDEPLOY_NODE: &str = "node-000001";
/// The start of the chart's admission policy's refusals of a write as the
/// controller's field manager.
const REFUSAL: &str = "only the forewarn controller (its ServiceAccount) may";

// ---------------------------------------------------------------------------
// Tools (the minimum of tests/chart/main.rs's)

const CLUSTER: &str = "forewarn-decisions";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One cluster for the whole test binary; the tests take turns on it.
fn cluster() -> (MutexGuard<'static, ()>, Cluster) {
    trust_env::cluster(CLUSTER, 3)
}

/// Installs (or upgrades) the release with default values, waits for it,
/// and waits for the decisions policy to be in force.
fn install(k: &Kubectl, c: &Cluster) {
    install_with(k, c, &[]);
    decisions_policy_in_force(k);
}

/// Waits until the chart's controller-decisions policy is type-checked,
/// without warnings, and in force: a server dry run of a create as the
/// controller's field manager by the administrator is refused. The API
/// server loads a new policy a moment after helm created it.
fn decisions_policy_in_force(k: &Kubectl) {
    let status = eventually("the policy type-checked", Duration::from_secs(60), || {
        let p = k.json(&["get", "validatingadmissionpolicy", DECISIONS_POLICY]);
        (p["status"]["observedGeneration"] == p["metadata"]["generation"])
            .then(|| p["status"].clone())
    });
    assert!(
        status["typeChecking"]["expressionWarnings"].is_null(),
        "{DECISIONS_POLICY}: type-checking warnings: {}",
        status["typeChecking"]
    );
    let probe = json!({
        "apiVersion": "forewarn.dev/v1alpha1", "kind": "ScheduledEvent",
        "metadata": {"name": "d0000000-0000-4000-8000-0000000000ff"},
        "spec": {"eventId": "D0000000-0000-4000-8000-0000000000FF", "eventType": "Reboot",
                 "eventStatus": "Scheduled", "resources": ["vm_0"]},
    })
    .to_string();
    eventually("the policy in force", Duration::from_secs(60), || {
        let out = k.run(
            &[
                "create",
                "--dry-run=server",
                "--field-manager",
                CONTROLLER_MANAGER,
                "-f",
                "-",
            ],
            Some(&probe),
        );
        (!out.ok && out.stderr.contains(REFUSAL)).then_some(())
    });
}

/// Options to play platform-redeploy.yaml with TokenRequest tokens of the
/// chart's ServiceAccounts: each agent's bound to the chart's agent pod on
/// its node, the controller's unbound.
fn chart_run_options(k: &Kubectl, run: &str, lease: &str) -> forewarn_harness::options::RunOptions {
    use forewarn_harness::options::RunOptions;
    use forewarn_harness::procs::Credentials;
    let mut agents = std::collections::BTreeMap::new();
    for node in ["node-000000", "node-000001", "node-000002"] {
        let (pod, uid) = agent_pod_on(k, node);
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
    opts.timeout = Duration::from_secs(150);
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

/// A client for the cluster of `kubeconfig` that sends `user_agent` (the
/// API server names the field manager of a write that names none after
/// it), if given.
async fn client(kubeconfig: &Path, user_agent: Option<&str>) -> kube::Client {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("client config");
    if let Some(ua) = user_agent {
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(ua).expect("user agent"),
        ));
    }
    kube::Client::try_from(config).expect("client")
}

/// One write of a `ScheduledEvent` with the kube client (exactly the
/// request the controller makes, field manager and all).
enum Write {
    /// Server-side apply of `status` (status subresource, forced).
    ApplyStatus { status: Value, manager: String },
    /// Server-side apply of the object's `spec` (forced).
    ApplySpec { spec: Value, manager: String },
    /// A JSON merge patch of the status; the API server names the field
    /// manager after the user agent when `manager` is `None`.
    MergeStatus {
        body: Value,
        manager: Option<String>,
    },
    /// A JSON merge patch of the object (main resource).
    Merge { body: Value, manager: String },
    /// A create with field manager `manager`.
    Create { object: Value, manager: String },
}

/// Makes `write` on the `ScheduledEvent` `name` with the credentials of
/// `kubeconfig`; the stored object, or the API server's refusal as
/// `reason (code): message`.
fn write(
    kubeconfig: &Path,
    user_agent: Option<&str>,
    name: &str,
    write: Write,
) -> Result<Value, String> {
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let api: Api<kube::api::DynamicObject> = Api::all_with(
            client(kubeconfig, user_agent).await,
            &kube::api::ApiResource::erase::<ScheduledEvent>(&()),
        );
        let head = |rest: (&str, Value)| {
            json!({"apiVersion": "forewarn.dev/v1alpha1", "kind": "ScheduledEvent",
                   "metadata": {"name": name}, rest.0: rest.1})
        };
        let stored = match write {
            Write::ApplyStatus { status, manager } => {
                api.patch_status(
                    name,
                    &PatchParams::apply(&manager).force(),
                    &Patch::Apply(&head(("status", status))),
                )
                .await
            }
            Write::ApplySpec { spec, manager } => {
                api.patch(
                    name,
                    &PatchParams::apply(&manager).force(),
                    &Patch::Apply(&head(("spec", spec))),
                )
                .await
            }
            Write::MergeStatus { body, manager } => {
                let params = PatchParams {
                    field_manager: manager,
                    ..PatchParams::default()
                };
                api.patch_status(name, &params, &Patch::Merge(&body)).await
            }
            Write::Merge { body, manager } => {
                let params = PatchParams {
                    field_manager: Some(manager),
                    ..PatchParams::default()
                };
                api.patch(name, &params, &Patch::Merge(&body)).await
            }
            Write::Create { object, manager } => {
                let params = PostParams {
                    field_manager: Some(manager),
                    ..PostParams::default()
                };
                let object: kube::api::DynamicObject =
                    serde_json::from_value(object).expect("object");
                api.create(&params, &object).await
            }
        };
        stored
            .map(|o| serde_json::to_value(o).expect("JSON"))
            .map_err(|e| match e {
                kube::Error::Api(s) => format!("{} ({}): {}", s.reason, s.code, s.message),
                e => e.to_string(),
            })
    })
}

/// The `ScheduledEvent` `name` as JSON, if it exists.
fn get(k: &Kubectl, name: &str) -> Option<Value> {
    let out = k.run(
        &[
            "get",
            "scheduledevent",
            name,
            "-o",
            "json",
            "--show-managed-fields",
        ],
        None,
    );
    out.ok
        .then(|| serde_json::from_str(&out.stdout).expect("kubectl printed JSON"))
}

fn condition<'a>(ev: &'a Value, type_: &str) -> Option<&'a Value> {
    ev["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// The entries of `managedFields` of manager `forewarn-controller`.
fn controller_entries(ev: &Value) -> Vec<Value> {
    ev["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["manager"] == CONTROLLER_MANAGER)
        .cloned()
        .collect()
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

// ---------------------------------------------------------------------------
// A hand-written approval during the drain

/// What the administrator's hand did during the drain, and what it saw.
struct HandWritten {
    /// When the approval was written, the drain not over.
    written_at: DateTime<Utc>,
    /// The `ForeignDecision` condition the controller then recorded, and
    /// the stored approval at that moment; `None` if none within a minute.
    recorded: Option<(Value, Value)>,
}

/// Waits until the event is draining `REDEPLOY_NODE`, writes an approval
/// bound to its content (appearance, digest) by hand as the administrator
/// (`kubectl patch --subresource status`), then waits for the controller's
/// record of it.
fn write_approval_during_the_drain(k: &Kubectl) -> HandWritten {
    let name = REDEPLOY.to_ascii_lowercase();
    // Generous bounds: the cordon comes seconds after the event appears
    // (3 s into the scenario); no load stretches these to minutes.
    let ev: ScheduledEvent = eventually("the event draining", Duration::from_secs(120), || {
        let ev = get(k, &name)?;
        let node = ev["status"]["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["name"] == REDEPLOY_NODE)?
            .clone();
        (ev["status"]["phase"] == "Draining" && node["drainedAt"].is_null())
            .then(|| serde_json::from_value(ev).expect("a ScheduledEvent"))
    });
    let written_at = Utc::now();
    let patch = json!({"status": {"approval": {
        "decidedAt": rfc3339(written_at),
        "reason": "written by hand",
        "appearance": ev.spec.appearance,
        "digest": ev.spec.digest(),
    }}});
    let stored: Value = serde_json::from_str(&k.ok(&[
        "patch",
        "scheduledevent",
        &name,
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        &patch.to_string(),
        "-o",
        "json",
    ]))
    .expect("kubectl printed JSON");
    // What this test is about: the approval was written while the node
    // was still being drained.
    let node = stored["status"]["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["name"] == REDEPLOY_NODE)
        .cloned()
        .unwrap_or_default();
    assert!(
        node["drainedAt"].is_null(),
        "the drain was over before the approval was written by hand: {node}"
    );
    println!(
        "approval written by hand at {written_at}: {}",
        stored["status"]
    );
    // A minute: the controller reconciles on the object's change, within a
    // second on an idle machine.
    let start = Instant::now();
    let recorded = loop {
        let found = get(k, &name).and_then(|ev| {
            let c = condition(&ev, "ForeignDecision")?.clone();
            (c["status"] == "True").then(|| (c, ev["status"]["approval"].clone()))
        });
        if found.is_some() || start.elapsed() > Duration::from_secs(60) {
            break found;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    HandWritten {
        written_at,
        recorded,
    }
}

/// An approval an administrator writes by hand into the status, bound to
/// the event's own content, while the controller drains the node: no agent
/// sends it (the IMDS mock receives no approval before the node is
/// drained), and the controller does not carry on from it: it removes it,
/// records `ForeignDecision` naming `kubectl-patch`, counts it, and decides
/// and has sent its own approval once the drain is done.
#[test]
fn an_approval_written_by_hand_during_the_drain_is_neither_sent_nor_followed() {
    use forewarn_harness::report::summary;
    use forewarn_harness::run::run_scenario;
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let mut opts = chart_run_options(&k, "decisions-by-hand", "forewarn-controller");
    // The workload's pods take their whole grace period to stop: the drain
    // lasts 20 s or more after the cordon, ample time for an agent to send
    // an approval it accepted (it sends within a second).
    opts.workload_grace_seconds = 20;
    opts.workload_stops_within = None;
    let hand = {
        let k = k.clone();
        std::thread::spawn(move || write_approval_during_the_drain(&k))
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = rt
        .block_on(run_scenario(&c, &opts))
        .unwrap_or_else(|e| panic!("platform-redeploy: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    let hand = hand
        .join()
        .unwrap_or_else(|_| panic!("the hand-written approval (see above)"));
    // No approval reached IMDS before the node was drained (as the
    // object recorded it at the end; never, if the event started first);
    // the controller's own did after it.
    let ev = get(&k, &REDEPLOY.to_ascii_lowercase()).expect("the event at the end");
    let drained_at: Option<DateTime<Utc>> = ev["status"]["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["name"] == REDEPLOY_NODE)
        .and_then(|n| n["drainedAt"].as_str())
        .map(|t| DateTime::parse_from_rfc3339(t).expect("drainedAt").to_utc());
    let approvals: Vec<_> = report
        .imds_log
        .iter()
        .filter(|e| e.what == "Approved")
        .collect();
    for a in &approvals {
        assert!(
            drained_at.is_some_and(|d| a.time >= d),
            "an approval was sent at {}, the hand-written one written at {}, before the node was drained ({drained_at:?}): {approvals:?}",
            a.time,
            hand.written_at,
        );
    }
    assert!(
        !approvals.is_empty(),
        "the controller's own approval was never sent: {:?}",
        report.imds_log
    );
    // The controller recorded the decision it did not make, naming who
    // wrote it, and did not keep it.
    let (condition, approval_after) = hand
        .recorded
        .unwrap_or_else(|| panic!("no ForeignDecision condition: {}", ev["status"]));
    let message = condition["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("kubectl-patch (Update, status)"),
        "{condition}"
    );
    assert_ne!(
        approval_after["reason"], "written by hand",
        "the hand-written approval stayed: {approval_after}"
    );
    assert_eq!(
        self::condition(&ev, "ForeignDecision").map(|c| c["status"].clone()),
        Some(json!("True")),
        "the record of the foreign decision did not stay: {}",
        ev["status"]
    );
    assert!(
        report
            .metric("controller", "forewarn_controller_foreign_decisions_total")
            .is_some_and(|n| n >= 1.0),
        "{:?}",
        report.metrics
    );
    let events = k.json(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=ForeignDecision",
    ]);
    assert!(
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["message"]
                .as_str()
                .is_some_and(|m| m.contains("kubectl-patch"))),
        "no ForeignDecision Event naming kubectl-patch: {events}"
    );
    // The harness reads any approval with a `decidedAt` before the drain
    // ended as the controller breaking rule 2: the hand-written one is
    // that, on purpose; anything else must hold.
    let others: Vec<&String> = report
        .violations
        .iter()
        .filter(|v| !(v.starts_with("rule 2:") && v.contains("approval decided before")))
        .collect();
    assert!(
        report.finished && others.is_empty(),
        "{:?}\n{}",
        report.violations,
        summary(&report)
    );
}

// ---------------------------------------------------------------------------
// The admission policy

/// Writes as the controller's field manager by anyone but the controller's
/// ServiceAccount are refused by the chart's admission policy, however the
/// manager is named (the request's field manager, the client's user agent,
/// `managedFields` written in the body, a create); the controller's own
/// writes and an administrator's under its own name pass. Checked on the
/// stored object too.
#[test]
fn only_the_controller_may_write_as_its_field_manager() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let controller = token_kubeconfig(&k, "decisions-controller", &token(&k, CONTROLLER_SA, None));
    let id = "D0000000-0000-4000-8000-000000000001";
    let name = id.to_ascii_lowercase();
    k.run(
        &["delete", "scheduledevent", &name, "--ignore-not-found"],
        None,
    );
    let object = json!({
        "apiVersion": "forewarn.dev/v1alpha1", "kind": "ScheduledEvent",
        "metadata": {"name": name},
        "spec": {"eventId": id, "eventType": "Reboot", "eventStatus": "Scheduled",
                 "eventSource": "Platform", "resourceType": "VirtualMachine",
                 "resources": ["vm_0"], "durationSeconds": -1, "appearance": 1},
    });
    let admin_cfg = c.kubeconfig.clone();
    let as_controller = |m: &str| Write::Create {
        object: object.clone(),
        manager: m.into(),
    };
    // A create as the controller's field manager by the administrator.
    let refused = write(&admin_cfg, None, &name, as_controller(CONTROLLER_MANAGER))
        .expect_err("an administrator created a ScheduledEvent as forewarn-controller");
    assert!(refused.contains(REFUSAL), "{refused}");
    assert!(get(&k, &name).is_none(), "the refused create was stored");
    // The controller creates it and writes its status (no decision yet).
    write(
        &controller.kubeconfig,
        None,
        &name,
        as_controller(CONTROLLER_MANAGER),
    )
    .expect("the controller creates a ScheduledEvent");
    write(
        &controller.kubeconfig,
        None,
        &name,
        Write::ApplyStatus {
            status: json!({"phase": "Draining", "appearance": 1}),
            manager: CONTROLLER_MANAGER.into(),
        },
    )
    .expect("the controller writes the status");
    let before = get(&k, &name).expect("the event");
    let entries = controller_entries(&before);
    assert_eq!(
        entries.len(),
        2,
        "the controller's create and status apply: {entries:?}"
    );
    // The same second as the controller's own write, or not: the time of
    // its entry is not what refuses (below).
    let decision = json!({"approval": {"decidedAt": rfc3339(Utc::now()), "reason": "forged",
                                       "appearance": 1, "digest": "0000000000000000"}});
    let attempts: Vec<(&str, Option<&str>, Write)> = vec![
        (
            "kubectl apply --server-side --subresource status --field-manager forewarn-controller",
            None,
            Write::ApplyStatus {
                status: decision.clone(),
                manager: CONTROLLER_MANAGER.into(),
            },
        ),
        (
            "kubectl patch --subresource status --field-manager forewarn-controller",
            None,
            Write::MergeStatus {
                body: json!({"status": decision.clone()}),
                manager: Some(CONTROLLER_MANAGER.into()),
            },
        ),
        (
            "a status patch naming no field manager from a client whose user agent is forewarn-controller",
            Some("forewarn-controller/0.0.0"),
            Write::MergeStatus {
                body: json!({"status": decision.clone()}),
                manager: None,
            },
        ),
        (
            "a spec apply as forewarn-controller",
            None,
            Write::ApplySpec {
                spec: json!({"eventId": id, "eventType": "Reboot", "eventStatus": "Scheduled",
                             "resources": ["vm_0", "vm_1"]}),
                manager: CONTROLLER_MANAGER.into(),
            },
        ),
    ];
    for (what, ua, w) in attempts {
        let refused = write(&admin_cfg, ua, &name, w)
            .err()
            .unwrap_or_else(|| panic!("allowed, must be refused: {what}"));
        assert!(refused.contains(REFUSAL), "{what}: {refused}");
        println!("refused: {what}: {refused}");
        let now = get(&k, &name).expect("the event");
        assert!(
            now["status"]["approval"].is_null(),
            "{what}: {}",
            now["status"]
        );
        assert_eq!(now["spec"], before["spec"], "{what}");
        assert_eq!(controller_entries(&now), entries, "{what}");
    }

    // An administrator's approval under its own name is let through (the
    // agents and the controller refuse it: the test above)...
    let hand = write(
        &admin_cfg,
        None,
        &name,
        Write::MergeStatus {
            body: json!({"status": decision.clone()}),
            manager: Some("kubectl-patch".into()),
        },
    )
    .expect("an administrator's patch under its own name");
    // ...but not made to read as the controller's: `managedFields` written
    // in the body, the approval's fields moved from the administrator's
    // entry to the controller's status apply, times kept.
    let mut forged: Vec<Value> = hand["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter(|e| e["manager"] != "kubectl-patch")
        .cloned()
        .collect();
    let status_apply = forged
        .iter_mut()
        .find(|e| e["manager"] == CONTROLLER_MANAGER && e["subresource"] == "status")
        .expect("the controller's status apply");
    status_apply["fieldsV1"]["f:status"]["f:approval"] = json!({
        "f:decidedAt": {}, "f:reason": {}, "f:appearance": {}, "f:digest": {}});
    let refused = write(
        &admin_cfg,
        None,
        &name,
        Write::Merge {
            body: json!({"metadata": {"managedFields": forged}}),
            manager: "kubectl-patch".into(),
        },
    )
    .expect_err("managedFields naming the controller as the approval's writer were stored");
    assert!(refused.contains(REFUSAL), "{refused}");
    let now = get(&k, &name).expect("the event");
    assert_eq!(
        controller_entries(&now),
        controller_entries(&hand),
        "managedFields changed"
    );
    assert!(
        now["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["manager"] == "kubectl-patch"),
        "{}",
        now["metadata"]["managedFields"]
    );

    // An administrator may still take a field from the controller (its
    // entry loses it: the API server leaves its time as it was) and edit
    // the metadata.
    let taken = write(
        &admin_cfg,
        None,
        &name,
        Write::MergeStatus {
            body: json!({"status": {"phase": "Pending"}}),
            manager: Some("kubectl-patch".into()),
        },
    )
    .expect("an administrator takes a field the controller wrote");
    assert_eq!(taken["status"]["phase"], "Pending");
    k.ok(&["label", "scheduledevent", &name, "example.com/by-hand=yes"]);
    // The controller writes as itself, the approval included.
    write(
        &controller.kubeconfig,
        None,
        &name,
        Write::ApplyStatus {
            status: json!({"phase": "Approved", "appearance": 1,
                           "approval": {"decidedAt": rfc3339(Utc::now()), "reason": "drained",
                                        "appearance": 1, "digest": "0000000000000000"}}),
            manager: CONTROLLER_MANAGER.into(),
        },
    )
    .expect("the controller writes its decision");
    k.ok(&["delete", "scheduledevent", &name]);
}
