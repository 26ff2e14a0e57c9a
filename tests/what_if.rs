//! `forewarn what-if` against a real local control plane (kube-apiserver,
//! kube-controller-manager, KWOK nodes): its prediction is made on the
//! cluster as it stands before the event, then the event comes (the IMDS
//! mock, the agents and the controller play it) and the prediction is
//! compared with what the API server recorded: the pods deleted with their
//! `deletionGracePeriodSeconds`, the budgets the controller found blocking,
//! the approvals the mock received. Fails, never skips, when the cluster
//! cannot start.

use std::path::PathBuf;
use std::time::Duration;

use forewarn::api::ScheduledEvent;
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::options::RunOptions;
use forewarn_harness::report::{Report, summary};
use forewarn_harness::run::run_scenario;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// One cluster for the whole test binary; tests take turns on it.
fn cluster() -> Cluster {
    forewarn_harness::cluster::shared(
        &std::env::var("FOREWARN_WHATIF_CLUSTER").unwrap_or_else(|_| "forewarn-whatif".into()),
        3,
    )
}

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NODE: &str = "node-000001";

fn pinned(name: &str, replicas: i32, grace: i64) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "terminationGracePeriodSeconds": grace,
                "nodeSelector": {"kubernetes.io/hostname": NODE},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            }},
        },
    })
}

fn pdb(name: &str, app: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": app}});
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name}, "spec": spec})
}

/// Every kind of pod a drain treats apart, on [`NODE`].
fn zoo() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "bare", "labels": {"app": "bare"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        }),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "static-web", "annotations": {"kubernetes.io/config.mirror": "abc", "kubernetes.io/config.source": "file"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        }),
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "everywhere"},
            "spec": {
                "selector": {"matchLabels": {"app": "everywhere"}},
                "template": {
                    "metadata": {"labels": {"app": "everywhere"}},
                    "spec": {
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                    },
                },
            },
        }),
        pinned("free", 2, 20),
        pinned("stuck", 2, 25),
        pdb("stuck", "stuck", json!({"minAvailable": 2})),
        pinned("two", 1, 15),
        pdb("two-a", "two", json!({"maxUnavailable": 1})),
        pdb("two-b", "two", json!({"maxUnavailable": 1})),
    ]
}

/// The names of the `objects` of `kind`.
fn names(objects: &[Value], kind: &str) -> Vec<String> {
    objects
        .iter()
        .filter(|o| o["kind"] == kind)
        .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
        .collect()
}

/// Waits until `objects` (Deployments, DaemonSets, Pods,
/// PodDisruptionBudgets) and the harness's `web` with its budget are up in
/// the namespace `shop` made for this run (created at or after `since`),
/// with every budget's status computed for its current generation.
async fn wait_for_workload(
    client: &Client,
    since: chrono::DateTime<chrono::Utc>,
    objects: &[Value],
) {
    let mut want_deployments = names(objects, "Deployment");
    want_deployments.push("web".into());
    let want_daemonsets = names(objects, "DaemonSet");
    let want_pods = names(objects, "Pod");
    let want_budgets = names(objects, "PodDisruptionBudget").len() + 1;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the workload was not up within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let fresh = Api::<Namespace>::all(client.clone())
            .get_opt("shop")
            .await
            .ok()
            .flatten()
            .and_then(|n| n.metadata.creation_timestamp)
            .is_some_and(|t| t.0.as_second() >= since.timestamp());
        if !fresh {
            continue;
        }
        let deployments = Api::<Deployment>::namespaced(client.clone(), "shop");
        let mut up = true;
        for name in &want_deployments {
            let ready = deployments
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .is_some_and(|d| {
                    let s = d.status.unwrap_or_default();
                    let want = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                    s.ready_replicas == Some(want) && s.updated_replicas == Some(want)
                });
            up &= ready;
        }
        let mut ds = true;
        for name in &want_daemonsets {
            ds &= Api::<DaemonSet>::namespaced(client.clone(), "shop")
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|d| d.status)
                .is_some_and(|s| s.number_ready == 3);
        }
        let pods = Api::<Pod>::namespaced(client.clone(), "shop")
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let running = |n: &str| {
            pods.iter().any(|p| {
                p.name_any() == n
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
        };
        let budgets = Api::<PodDisruptionBudget>::namespaced(client.clone(), "shop")
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let computed = budgets.len() == want_budgets
            && budgets.iter().all(|b| {
                let s = b.status.clone().unwrap_or_default();
                s.observed_generation == b.metadata.generation && s.expected_pods.unwrap_or(0) > 0
            });
        if up && ds && want_pods.iter().all(|p| running(p)) && computed {
            return;
        }
    }
}

/// Runs `forewarn what-if` as a user would, with the cluster's kubeconfig.
fn what_if(cluster: &Cluster, args: &[&str]) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_forewarn"))
        .arg("what-if")
        .args(args)
        .args(["-o", "json"])
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY")
        .output()
        .expect("run forewarn what-if");
    assert!(
        out.status.success(),
        "what-if failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("what-if prints JSON")
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x[key].as_str().map(String::from))
        .collect()
}

/// Creates its file when dropped: the run's start gate opens once the
/// prediction ended, also when it panicked (its panic is then the test's
/// failure, not a run waiting for a gate).
struct OpensOnDrop(PathBuf);

impl Drop for OpensOnDrop {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = std::fs::write(&self.0, b"");
    }
}

async fn play(
    file: &str,
    objects: Vec<Value>,
    what_if_args: Vec<String>,
) -> (Report, Value, Cluster) {
    let cluster = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked");
    let client = cluster.client().await.expect("client");
    let since = chrono::Utc::now();
    let mut opts = RunOptions::new(
        repo_root().join("tests/fixtures").join(file),
        PathBuf::from(env!("CARGO_BIN_EXE_forewarn")),
    );
    opts.timeout = Duration::from_secs(240);
    opts.extra_objects = objects.clone();
    // The prediction is made before the event appears: the run starts the
    // IMDS mock only once the prediction opened its gate (done or failed),
    // however long the workload takes to come up on a loaded machine.
    // Checked below from the objects.
    let gate = opts.log_dir.join("prediction-done");
    let _ = std::fs::remove_file(&gate);
    opts.start_gate = Some(gate.clone());
    let predicting = {
        let cluster = cluster.clone();
        let client = client.clone();
        tokio::spawn(async move {
            let _open = OpensOnDrop(gate);
            wait_for_workload(&client, since, &objects).await;
            let args: Vec<&str> = what_if_args.iter().map(String::as_str).collect();
            let before = Api::<ScheduledEvent>::all(client.clone())
                .list(&ListParams::default())
                .await
                .expect("list ScheduledEvents")
                .items
                .len();
            let prediction = tokio::task::spawn_blocking({
                let cluster = cluster.clone();
                let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
                move || {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    what_if(&cluster, &args)
                }
            })
            .await
            .expect("what-if panicked");
            let after = Api::<ScheduledEvent>::all(client.clone())
                .list(&ListParams::default())
                .await
                .expect("list ScheduledEvents")
                .items
                .len();
            let cordoned = Api::<Node>::all(client.clone())
                .get(NODE)
                .await
                .expect("node")
                .spec
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            assert_eq!(
                (before, after, cordoned),
                (0, 0, false),
                "the prediction must be made before the event: ScheduledEvents before and after, node cordoned"
            );
            prediction
        })
    };
    let report = run_scenario(&cluster, &opts)
        .await
        .unwrap_or_else(|e| panic!("{file}: could not run: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    assert!(
        report.ok(),
        "{file}:\n{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    let prediction = predicting.await.expect("the prediction failed");
    println!(
        "prediction: {}",
        serde_json::to_string_pretty(&prediction).unwrap_or_default()
    );
    (report, prediction, cluster)
}

#[tokio::test(flavor = "multi_thread")]
async fn what_if_predicts_the_pods_evicted_the_budgets_blocking_and_no_approval() {
    let _turn = TURN.lock().await;
    let args = ["--node", NODE, "--type", "Reboot", "--notice", "45s"]
        .map(String::from)
        .to_vec();
    let (r, p, cluster) = play("what-if-reboot.yaml", zoo(), args).await;
    assert_eq!(p["policy"]["action"], "DrainAndApprove", "{p:#}");
    assert_eq!(p["cordons"], true);

    // The pods evicted, with their grace, as the API server applied them.
    let mut predicted: Vec<(String, i64)> = p["evicted"]
        .as_array()
        .expect("evicted")
        .iter()
        .map(|e| {
            (
                e["pod"].as_str().unwrap_or_default().to_string(),
                e["graceSeconds"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    predicted.sort();
    let mut deleted: Vec<(String, i64)> = r
        .deletions
        .iter()
        .filter(|d| d.node == NODE && d.pod.starts_with("shop/"))
        .map(|d| (d.pod.clone(), d.grace_seconds.unwrap_or(-1)))
        .collect();
    deleted.sort();
    assert_eq!(
        predicted, deleted,
        "predicted evictions (pod, grace) vs the deletions the API server recorded"
    );
    assert!(
        predicted.iter().any(|(p, _)| p.starts_with("shop/free-")),
        "the unblocked pods are predicted evicted: {predicted:?}"
    );

    // The pods kept, each for its reason.
    let kept: Vec<(String, String)> = p["kept"]
        .as_array()
        .expect("kept")
        .iter()
        .map(|k| {
            (
                k["pod"].as_str().unwrap_or_default().to_string(),
                k["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let reason_of = |prefix: &str| {
        kept.iter()
            .filter(|(p, _)| p.starts_with(prefix))
            .map(|(_, r)| r.clone())
            .collect::<Vec<_>>()
    };
    assert!(
        reason_of("shop/bare")[0].starts_with("no controller"),
        "{kept:?}"
    );
    assert!(
        reason_of("shop/static-web")[0].starts_with("mirror pod"),
        "{kept:?}"
    );
    assert!(
        reason_of("shop/everywhere-")[0].starts_with("DaemonSet pod"),
        "{kept:?}"
    );
    assert_eq!(reason_of("shop/stuck-").len(), 2, "{kept:?}");
    assert!(
        reason_of("shop/two-")[0].contains("more than one PodDisruptionBudget"),
        "{kept:?}"
    );

    // The budgets that hold the drain to its end are those the controller
    // found blocking in its last pass; `web` lets its pods go one by one.
    let budgets = p["budgets"].as_array().expect("budgets");
    let mut whole: Vec<String> = budgets
        .iter()
        .filter(|b| b["blocking"] == "WholeDrain" || b["blocking"] == "MoreThanOneBudget")
        .filter_map(|b| b["name"].as_str().map(String::from))
        .collect();
    whole.sort();
    let client = cluster.client().await.expect("client");
    let ev: ScheduledEvent = Api::all(client.clone())
        .get("7a1d0c3e-4b5f-4e60-8c71-92a3b4c5d6a1")
        .await
        .expect("ScheduledEvent");
    let status = ev.status.expect("status");
    let node = &status.nodes.as_ref().expect("nodes")[0];
    let mut recorded = node.blocking_budgets.clone();
    recorded.sort();
    assert_eq!(
        whole, recorded,
        "budgets predicted to hold the drain vs recorded"
    );
    assert_eq!(whole, ["shop/stuck", "shop/two-a", "shop/two-b"]);
    let web = budgets
        .iter()
        .find(|b| b["name"] == "shop/web")
        .expect("the budget web is named");
    let web_on_node = strings(&p["evicted"], "pod")
        .into_iter()
        .filter(|p| p.starts_with("shop/web-"))
        .count();
    assert_eq!(web["pods"].as_array().map(Vec::len), Some(web_on_node));
    if web_on_node > 1 {
        assert_eq!(web["blocking"], "UntilReplacementsReady", "{web:#}");
    }

    // No approval, as predicted: the mock's log holds none.
    assert_eq!(p["approval"]["when"], "Never", "{:#}", p["approval"]);
    assert_eq!(p["approval"]["beforeNotBefore"], false);
    assert!(r.approvals.is_empty(), "approved: {:?}", r.approvals);
}

/// Invoked as `kubectl-forewarn` (kubectl's plugin name, here a symlink),
/// the binary takes forewarn's subcommands and its help says `kubectl
/// forewarn`; invoked as `forewarn`, it says `forewarn`.
#[test]
fn invoked_as_kubectl_forewarn_it_is_a_kubectl_plugin() {
    let dir = repo_root().join("target/forewarn-runs/kubectl-plugin");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("plugin dir");
    let plugin = dir.join("kubectl-forewarn");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_forewarn"), &plugin).expect("symlink");
    let help = std::process::Command::new(&plugin)
        .args(["what-if", "--help"])
        .output()
        .expect("run kubectl-forewarn");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success(), "{text}");
    assert!(text.contains("Usage: kubectl forewarn what-if"), "{text}");
    assert!(text.contains("--notice"), "{text}");
    let wrong = std::process::Command::new(&plugin)
        .args(["what-if", "--node", "n", "--type", "Nap"])
        .output()
        .expect("run kubectl-forewarn");
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(err.contains("Reboot"), "the types are listed: {err}");
    let plain = std::process::Command::new(env!("CARGO_BIN_EXE_forewarn"))
        .args(["what-if", "--help"])
        .output()
        .expect("run forewarn");
    assert!(String::from_utf8_lossy(&plain.stdout).contains("Usage: forewarn what-if"));
}

/// Runs `forewarn ARGS` as an operator would, with the cluster's
/// kubeconfig (the admin's), and returns its output.
fn operator(cluster: &Cluster, args: &[&str]) -> String {
    // The kubeconfig by flag, as `kubectl forewarn --kubeconfig` passes
    // it; `approve` confirmed by flag (no terminal to ask on).
    let confirm: &[&str] = if args.first() == Some(&"approve") {
        &["--yes"]
    } else {
        &[]
    };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_forewarn"))
        .args(args)
        .args(confirm)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY")
        .output()
        .expect("run forewarn");
    assert!(
        out.status.success(),
        "forewarn {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits (polling the API server) until the ScheduledEvent `name` exists
/// and `ready` holds of it.
async fn wait_for_event(client: &Client, name: &str, ready: impl Fn(&ScheduledEvent) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "ScheduledEvent {name} not as awaited within 120 s"
        );
        if let Ok(Some(ev)) = Api::<ScheduledEvent>::all(client.clone())
            .get_opt(name)
            .await
            && ready(&ev)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Plays `file` while an operator runs `forewarn command EVENT` once `ready`
/// holds of the event; returns the report, the command's output and the
/// final object.
async fn play_by_hand(
    file: &str,
    event: &'static str,
    command: &'static str,
    ready: fn(&ScheduledEvent) -> bool,
    adjust: impl FnOnce(&mut RunOptions),
) -> (Report, String, ScheduledEvent, Cluster) {
    let cluster = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked");
    let client = cluster.client().await.expect("client");
    let mut opts = RunOptions::new(
        repo_root().join("tests/fixtures").join(file),
        PathBuf::from(env!("CARGO_BIN_EXE_forewarn")),
    );
    opts.timeout = Duration::from_secs(240);
    adjust(&mut opts);
    // An object of an earlier run of the same scenario is gone once the
    // run resets the cluster; wait for this run's.
    let _ = Api::<ScheduledEvent>::all(client.clone())
        .delete(event, &Default::default())
        .await;
    let acting = {
        let cluster = cluster.clone();
        let client = client.clone();
        tokio::spawn(async move {
            wait_for_event(&client, event, ready).await;
            tokio::task::spawn_blocking(move || operator(&cluster, &[command, event]))
                .await
                .expect("operator panicked")
        })
    };
    let report = run_scenario(&cluster, &opts)
        .await
        .unwrap_or_else(|e| panic!("{file}: could not run: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    let said = acting.await.expect("the operator's command failed");
    println!("operator: {said}");
    let ev = Api::<ScheduledEvent>::all(client)
        .get(event)
        .await
        .expect("ScheduledEvent");
    (report, said, ev, cluster)
}

fn condition(ev: &ScheduledEvent, type_: &str) -> Option<(String, String, String)> {
    ev.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn event_notes(client: &Client, reason: &str) -> Vec<String> {
    Api::<k8s_openapi::api::events::v1::Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list Events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

/// The field managers owning `metadata.annotations[key]` of `ev`, as the
/// API server recorded them.
fn annotation_owners(ev: &ScheduledEvent, key: &str) -> Vec<String> {
    ev.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:metadata"))
                .and_then(|m| m.get("f:annotations"))
                .and_then(|a| a.get(format!("f:{key}")))
                .is_some()
        })
        .filter_map(|m| m.manager.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hold_keeps_the_approval_back_and_the_drain_goes_on() {
    let _turn = TURN.lock().await;
    const EVENT: &str = "7a1d0c3e-4b5f-4e60-8c71-92a3b4c5d6a2";
    let (r, said, ev, cluster) = play_by_hand(
        "what-if-hold.yaml",
        EVENT,
        "hold",
        |_| true,
        |o| {
            o.policy = Some("drainLeadTimeSeconds: 20\n".into());
        },
    )
    .await;
    assert!(r.ok(), "{}\n{}", r.timeline.join("\n"), summary(&r));
    assert!(
        said.contains("forewarn.dev/hold set (as kubectl-forewarn/"),
        "{said}"
    );
    // No approval reached IMDS (the mock's log), and the drain happened.
    assert!(r.approvals.is_empty(), "approved: {:?}", r.approvals);
    assert!(
        r.deletions
            .iter()
            .any(|d| d.node == NODE && d.pod.starts_with("shop/web-")),
        "the held event's node was not drained: {:#?}",
        r.deletions
    );
    assert!(r.deletions.iter().all(|d| d.grace_seconds.unwrap_or(0) > 0));
    let status = ev.status.clone().expect("status");
    assert!(
        status
            .approval
            .as_ref()
            .is_none_or(|a| a.decided_at.is_none()),
        "{:?}",
        status.approval
    );
    let (st, reason, message) = condition(&ev, "ApprovalHeld").expect("ApprovalHeld");
    assert_eq!((st.as_str(), reason.as_str()), ("True", "HoldAnnotation"));
    assert!(message.contains("set by kubectl-forewarn/"), "{message}");
    // After every pass of the controller, the operator's annotation is
    // still there and still the operator's.
    assert_eq!(
        ev.annotations()
            .get("forewarn.dev/hold")
            .map(String::as_str),
        Some("true")
    );
    let owners = annotation_owners(&ev, "forewarn.dev/hold");
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert!(owners[0].starts_with("kubectl-forewarn/"), "{owners:?}");
    assert!(
        ev.metadata
            .managed_fields
            .iter()
            .flatten()
            .any(
                |m| m.manager.as_deref() == Some(forewarn::api::CONTROLLER_MANAGER)
                    && m.time.as_ref().is_some_and(|t| {
                        ev.metadata
                            .managed_fields
                            .iter()
                            .flatten()
                            .filter(|h| h.manager.as_deref() == Some(owners[0].as_str()))
                            .all(|h| h.time.as_ref().is_some_and(|h| h.0 < t.0))
                    })
            ),
        "the controller wrote after the hold: {:#?}",
        ev.metadata.managed_fields
    );
    let client = cluster.client().await.expect("client");
    let notes = event_notes(&client, "ApprovalHeld").await;
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with(EVENT) && n.contains("kubectl-forewarn/")),
        "no ApprovalHeld Event naming who: {notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn approve_now_sends_the_approval_while_a_budget_blocks_and_forces_nothing() {
    let _turn = TURN.lock().await;
    const EVENT: &str = "7a1d0c3e-4b5f-4e60-8c71-92a3b4c5d6a3";
    let blocked = |ev: &ScheduledEvent| {
        ev.status
            .as_ref()
            .and_then(|s| s.nodes.as_ref())
            .is_some_and(|n| {
                n.iter()
                    .any(|n| n.blocking_budgets.contains(&"shop/stuck".to_string()))
            })
    };
    let (r, said, ev, cluster) =
        play_by_hand("what-if-approve-now.yaml", EVENT, "approve", blocked, |o| {
            o.extra_objects = vec![
                pinned("stuck", 2, 25),
                pdb("stuck", "stuck", json!({"minAvailable": 2})),
            ];
        })
        .await;
    // The harness's own check of rule 2 sees the approval decided before the
    // drain: that is what approve-now is for; every other rule holds.
    assert!(r.finished, "{}\n{}", r.timeline.join("\n"), summary(&r));
    let others: Vec<&String> = r
        .violations
        .iter()
        .filter(|v| !(v.starts_with("rule 2: ") && v.contains("approval decided before")))
        .collect();
    assert!(others.is_empty(), "{others:#?}");
    assert!(
        said.contains("forewarn.dev/approve-now set (as kubectl-forewarn/"),
        "{said}"
    );
    // The approval reached IMDS (the mock's log).
    assert!(!r.approvals.is_empty(), "no approval reached IMDS");
    // The budget held: no pod it protects was deleted; nothing was forced.
    assert!(
        r.deletions
            .iter()
            .all(|d| !d.pod.starts_with("shop/stuck-")),
        "a pod of the blocking budget was deleted: {:#?}",
        r.deletions
    );
    assert!(
        r.deletions.iter().all(|d| d.grace_seconds.unwrap_or(0) > 0),
        "a force delete: {:#?}",
        r.deletions
    );
    let status = ev.status.clone().expect("status");
    let approval = status.approval.clone().expect("approval");
    assert!(
        approval.reason.as_deref().is_some_and(|r| r.starts_with(
            "approved by hand: annotation forewarn.dev/approve-now set by kubectl-forewarn/"
        )),
        "{approval:?}"
    );
    let (st, reason, _) = condition(&ev, "ApprovedByHand").expect("ApprovedByHand");
    assert_eq!(
        (st.as_str(), reason.as_str()),
        ("True", "ApproveNowAnnotation")
    );
    let owners = annotation_owners(&ev, "forewarn.dev/approve-now");
    assert!(
        owners.len() == 1 && owners[0].starts_with("kubectl-forewarn/"),
        "{owners:?}"
    );
    let client = cluster.client().await.expect("client");
    let notes = event_notes(&client, "ApprovedByHand").await;
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with(EVENT) && n.contains("kubectl-forewarn/")),
        "no ApprovedByHand Event naming who: {notes:?}"
    );
}

/// Whether the API server's authorizer lets `user` do `verb` on
/// `resource` (of forewarn.dev unless `group` says otherwise).
async fn may(client: &Client, user: &str, verb: &str, group: &str, resource: &str) -> bool {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {"user": user, "resourceAttributes": {
            "group": group, "resource": resource.split('/').next(),
            "subresource": resource.split('/').nth(1).unwrap_or(""), "verb": verb}}
    }))
    .expect("review");
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&Default::default(), &review)
        .await
        .expect("SubjectAccessReview")
        .status
        .is_some_and(|s| s.allowed)
}

/// A kubeconfig for `token` on `cluster`'s API server, written under target/.
fn kubeconfig_with_token(cluster: &Cluster, token: &str, name: &str) -> PathBuf {
    let raw = cluster
        .kubectl(&[
            "config",
            "view",
            "--raw",
            "--minify",
            "--flatten",
            "-o",
            "json",
        ])
        .expect("kubectl config view");
    let mut config: Value = serde_json::from_str(&raw).expect("kubeconfig JSON");
    config["users"] = json!([{"name": "u", "user": {"token": token}}]);
    let context = config["contexts"][0]["context"]["cluster"].clone();
    config["contexts"] = json!([{"name": "c", "context": {"cluster": context, "user": "u"}}]);
    config["current-context"] = json!("c");
    let path = repo_root().join(format!("target/forewarn-runs/{name}.kubeconfig"));
    std::fs::create_dir_all(path.parent().expect("dir")).expect("dir");
    std::fs::write(&path, config.to_string()).expect("write kubeconfig");
    path
}

/// The chart's on-call ClusterRole and agents' role on a real API server:
/// its authorizer lets the on-call role read and patch ScheduledEvents and
/// nothing else asked, and refuses the agents any write of one; `forewarn
/// hold` run with an on-call token annotates the event under the field
/// manager naming that user (the API server's own answer to who it is),
/// `release-hold` removes it, and `approve` run with an agent's token is
/// refused.
#[tokio::test(flavor = "multi_thread")]
async fn the_on_call_role_may_hold_an_event_and_the_agents_may_not() {
    let _turn = TURN.lock().await;
    let cluster = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked");
    let client = cluster.client().await.expect("client");
    let rendered = std::process::Command::new(forewarn_harness::cluster::helm_bin())
        .args(["template", "forewarn"])
        .arg(repo_root().join("charts/forewarn"))
        .args(["--namespace", "forewarn"])
        .args([
            "--api-versions",
            "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
        ])
        .args([
            "-s",
            "templates/rbac-oncall.yaml",
            "-s",
            "templates/rbac-agent.yaml",
        ])
        .args(["-s", "templates/serviceaccounts.yaml"])
        .output()
        .expect("helm template");
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let file = repo_root().join("target/forewarn-runs/on-call-rbac.yaml");
    std::fs::create_dir_all(file.parent().expect("dir")).expect("dir");
    std::fs::write(&file, &rendered.stdout).expect("write");
    let _ = cluster.kubectl(&["create", "namespace", "forewarn"]);
    cluster
        .kubectl(&["apply", "-f", &file.to_string_lossy()])
        .expect("apply the chart's RBAC");
    let _ = cluster.kubectl(&["create", "serviceaccount", "on-call", "-n", "forewarn"]);
    let _ = cluster.kubectl(&[
        "create",
        "clusterrolebinding",
        "forewarn-on-call",
        "--clusterrole=forewarn-on-call",
        "--serviceaccount=forewarn:on-call",
    ]);
    let on_call = "system:serviceaccount:forewarn:on-call";
    let agent = "system:serviceaccount:forewarn:forewarn-agent";
    for verb in ["get", "list", "watch", "patch"] {
        assert!(
            may(&client, on_call, verb, "forewarn.dev", "scheduledevents").await,
            "{verb}"
        );
    }
    for (verb, group, resource) in [
        ("update", "forewarn.dev", "scheduledevents"),
        ("delete", "forewarn.dev", "scheduledevents"),
        ("create", "forewarn.dev", "scheduledevents"),
        ("patch", "forewarn.dev", "scheduledevents/status"),
        ("patch", "forewarn.dev", "scheduledeventreports"),
        ("patch", "", "nodes"),
        ("create", "", "pods/eviction"),
    ] {
        assert!(
            !may(&client, on_call, verb, group, resource).await,
            "on-call may {verb} {resource}"
        );
    }
    for verb in ["patch", "update", "create", "delete"] {
        for resource in ["scheduledevents", "scheduledevents/status"] {
            assert!(
                !may(&client, agent, verb, "forewarn.dev", resource).await,
                "the agents may {verb} {resource}"
            );
        }
    }

    const NAME: &str = "on-call-check";
    let sevs = Api::<ScheduledEvent>::all(client.clone());
    let _ = sevs.delete(NAME, &Default::default()).await;
    let ev: ScheduledEvent = serde_json::from_value(json!({
        "apiVersion": "forewarn.dev/v1alpha1", "kind": "ScheduledEvent",
        "metadata": {"name": NAME},
        "spec": {"eventId": "ON-CALL-CHECK", "eventType": "Reboot", "eventStatus": "Scheduled",
                 "eventSource": "Platform", "resourceType": "VirtualMachine", "resources": ["vm-x"]},
    }))
    .expect("event");
    sevs.create(&Default::default(), &ev)
        .await
        .expect("create the event");
    let token = cluster
        .kubectl(&["create", "token", "on-call", "-n", "forewarn"])
        .expect("token");
    let config = kubeconfig_with_token(&cluster, token.trim(), "on-call");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_forewarn"))
        .args(["hold", NAME])
        .env("KUBECONFIG", &config)
        .output()
        .expect("forewarn hold");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stored = sevs.get(NAME).await.expect("the event");
    assert_eq!(
        annotation_owners(&stored, "forewarn.dev/hold"),
        [format!("kubectl-forewarn/{on_call}")]
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_forewarn"))
        .args(["release-hold", NAME])
        .env("KUBECONFIG", &config)
        .output()
        .expect("forewarn release-hold");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stored = sevs.get(NAME).await.expect("the event");
    assert!(!stored.annotations().contains_key("forewarn.dev/hold"));
    assert!(annotation_owners(&stored, "forewarn.dev/hold").is_empty());
    let agent_token = cluster
        .kubectl(&["create", "token", "forewarn-agent", "-n", "forewarn"])
        .expect("token");
    let config = kubeconfig_with_token(&cluster, agent_token.trim(), "agent");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_forewarn"))
        .args(["approve", NAME, "--yes"])
        .env("KUBECONFIG", &config)
        .output()
        .expect("forewarn approve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("forbidden"), "{err}");
    // Without --yes and without a terminal to ask on, approve writes
    // nothing and says how to confirm; an unknown context is refused.
    let on_call_config = kubeconfig_with_token(&cluster, token.trim(), "on-call");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_forewarn"))
        .args(["approve", NAME])
        .env("KUBECONFIG", &on_call_config)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("forewarn approve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--yes"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_forewarn"))
        .args(["hold", NAME, "--context", "no-such-context"])
        .arg("--kubeconfig")
        .arg(&on_call_config)
        .env_remove("KUBECONFIG")
        .output()
        .expect("forewarn hold");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no-such-context"),
        "{err}"
    );
    let stored = sevs.get(NAME).await.expect("the event");
    assert!(
        !stored
            .annotations()
            .contains_key("forewarn.dev/approve-now")
    );
    sevs.delete(NAME, &Default::default())
        .await
        .expect("delete");
}

#[tokio::test(flavor = "multi_thread")]
async fn what_if_predicts_a_drain_and_an_approval_before_not_before() {
    let _turn = TURN.lock().await;
    let args = ["--node", NODE, "--type", "Redeploy", "--notice", "45s"]
        .map(String::from)
        .to_vec();
    let (r, p, _cluster) = play("what-if-redeploy.yaml", vec![pinned("free", 2, 20)], args).await;
    assert_eq!(p["policy"]["action"], "DrainAndApprove", "{p:#}");
    let mut predicted: Vec<(String, i64)> = p["evicted"]
        .as_array()
        .expect("evicted")
        .iter()
        .map(|e| {
            (
                e["pod"].as_str().unwrap_or_default().to_string(),
                e["graceSeconds"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    predicted.sort();
    let mut deleted: Vec<(String, i64)> = r
        .deletions
        .iter()
        .filter(|d| d.node == NODE && d.pod.starts_with("shop/"))
        .map(|d| (d.pod.clone(), d.grace_seconds.unwrap_or(-1)))
        .collect();
    deleted.sort();
    assert_eq!(
        predicted, deleted,
        "predicted evictions vs the API server's deletions"
    );
    assert!(
        p["budgets"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|b| b["blocking"] == "No" || b["blocking"] == "UntilReplacementsReady"),
        "{:#}",
        p["budgets"]
    );
    assert_eq!(p["approval"]["when"], "AfterDrain", "{:#}", p["approval"]);
    assert_eq!(p["approval"]["beforeNotBefore"], true);
    // The approval reached IMDS before NotBefore, as predicted.
    let not_before = r.started + chrono::Duration::seconds(8 + 45);
    assert!(!r.approvals.is_empty(), "no approval reached IMDS");
    assert!(
        r.approvals.iter().all(|a| a.time < not_before),
        "approved at {:?}, NotBefore {not_before}",
        r.approvals.iter().map(|a| a.time).collect::<Vec<_>>()
    );
}
