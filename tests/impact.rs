//! End-to-end tests of what the controller records of the impact and tells
//! operators on a real local control plane: a
//! node's restart inside a Reboot's window recorded on the event with its
//! time; a restart outside any event reported once (a Kubernetes Event on
//! the Node and the controller's metric), also across a controller
//! restart; a Freeze's gap in the node's Lease renewals recorded; the
//! `ForewarnScheduledEvent` Node condition set while the event affects the
//! node and cleared after, beside KWOK's own conditions; the opt-in
//! load-balancer exclusion label; a `User` Reboot approved at once by
//! policy. What is checked is what the API server stored (objects, Node
//! status, Events, Leases) and the real controller's `/metrics`. The
//! tests write the Node's `bootID` and the node's Lease as a kubelet
//! would; they fail, never skip, when the cluster cannot start.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use forewarn::api::holds;
use forewarn::api::{NodeImpact, ScheduledEvent};
use forewarn::controller::act::cordon::{LB_EXCLUDED_ANNOTATION, LB_EXCLUSION_LABEL};
use forewarn::controller::act::node_condition::CONDITION_TYPE;
use forewarn::controller::observe::nodes::is_cordoned;
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::options::RunOptions;
use forewarn_harness::report::{Report, summary};
use forewarn_harness::run::run_scenario;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The cluster's name: `forewarn-impact`, or `FOREWARN_IMPACT_CLUSTER`.
fn cluster_name() -> String {
    std::env::var("FOREWARN_IMPACT_CLUSTER").unwrap_or_else(|_| "forewarn-impact".into())
}

/// One cluster for the whole test binary; tests take turns on it.
fn cluster() -> Cluster {
    forewarn_harness::cluster::shared(&cluster_name(), 3)
}

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NODES: [&str; 3] = ["node-000000", "node-000001", "node-000002"];

/// Plays `file` with `adjust`ed options while `side` runs beside it (it is
/// told to stop, through its flag, once the run is over), and returns the
/// report with what `side` returned.
async fn play_beside<T, F>(
    file: &str,
    adjust: impl FnOnce(&mut RunOptions),
    side: impl FnOnce(Client, Arc<AtomicBool>) -> F,
) -> (Report, T, Cluster, Client)
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let cluster = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked");
    let client = cluster.client().await.expect("client");
    let mut opts = RunOptions::new(
        repo_root().join("tests/fixtures").join(file),
        PathBuf::from(env!("CARGO_BIN_EXE_forewarn")),
    );
    // A hang bound: these scenarios are over in 20 to 60 s; a healthy run
    // ends as soon as its events are over and its nodes released.
    opts.timeout = Duration::from_secs(240);
    adjust(&mut opts);
    let stop = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(side(client.clone(), stop.clone()));
    let report = run_scenario(&cluster, &opts).await;
    stop.store(true, Ordering::SeqCst);
    let seen = task.await.expect("the side task panicked");
    let report = report.unwrap_or_else(|e| panic!("{file}: could not run: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    assert!(
        report.ok(),
        "{file}:\n{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    (report, seen, cluster, client)
}

/// Writes a Node's `status.nodeInfo.bootID`, as its kubelet does when it
/// starts after a reboot.
async fn set_boot_id(client: &Client, node: &str, boot: &str) {
    Api::<Node>::all(client.clone())
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": boot}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("set the bootID of {node}: {e}"));
}

async fn set_label(client: &Client, node: &str, key: &str, value: Option<&str>) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("label {node}: {e}"));
}

/// A condition's `(status, reason, message)`.
type Cond = (String, String, String);

/// `(status, reason, message)` of a condition of the node.
fn condition(node: &Node, type_: &str) -> Option<Cond> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

fn condition_types(node: &Node) -> Vec<String> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.type_.clone())
        .collect()
}

/// How many Events with `reason` about the Node `node` were posted since
/// `since`, counting each Event's series (a repeat folded into one).
async fn node_events(
    client: &Client,
    node: &str,
    reason: &str,
    since: DateTime<Utc>,
) -> (usize, Vec<String>) {
    let events = Api::<KubeEvent>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list Events")
        .items;
    let mut count = 0;
    let mut notes = Vec::new();
    for e in events {
        let about = e
            .regarding
            .as_ref()
            .is_some_and(|r| r.kind.as_deref() == Some("Node") && r.name.as_deref() == Some(node));
        let when = e
            .event_time
            .as_ref()
            .map(|t| DateTime::from_timestamp_millis(t.0.as_millisecond()).unwrap_or_default());
        if !about || e.reason.as_deref() != Some(reason) || when.is_none_or(|w| w < since) {
            continue;
        }
        count += e
            .series
            .as_ref()
            .map_or(1, |s| usize::try_from(s.count).unwrap_or(1));
        notes.extend(e.note);
    }
    (count, notes)
}

/// Whether `e` is this run's object of the event `id` (the side tasks
/// start before the run deletes the objects earlier runs left).
fn ours(e: &ScheduledEvent, id: &str, since: DateTime<Utc>) -> bool {
    e.name_any() == id.to_ascii_lowercase()
        && e.metadata
            .creation_timestamp
            .as_ref()
            .is_some_and(|t| t.0.as_second() >= since.timestamp() - 2)
}

/// When the controller finished the event `id` (`status.finishedAt`).
async fn finished_at(client: &Client, id: &str) -> DateTime<Utc> {
    Api::<ScheduledEvent>::all(client.clone())
        .get(&id.to_ascii_lowercase())
        .await
        .expect("get the ScheduledEvent")
        .status
        .and_then(|s| s.finished_at)
        .expect("finishedAt")
}

async fn impact_of(client: &Client, event: &str, node: &str) -> Option<NodeImpact> {
    let ev = Api::<ScheduledEvent>::all(client.clone())
        .get(&event.to_ascii_lowercase())
        .await
        .expect("get the ScheduledEvent");
    ev.status?
        .nodes?
        .into_iter()
        .find(|n| n.name == node)
        .unwrap_or_else(|| panic!("no record of {node}"))
        .impact
}

/// What the side task of the Reboot test saw, from the API server.
#[derive(Debug, Default)]
struct RebootSeen {
    /// When node-000000's bootID was changed (no event affects it).
    unexpected_at: Option<DateTime<Utc>>,
    /// When node-000001's bootID change was sent (its event Started): it
    /// cannot have been seen before.
    expected_at: Option<DateTime<Utc>>,
    /// The condition seen `True` on a held node, with the other condition
    /// types stored beside it then.
    condition: HashMap<String, (Cond, Vec<String>)>,
    /// Label value and ownership annotation seen on a held node.
    label_while_held: HashMap<String, (Option<String>, bool)>,
    /// Whether KWOK, made to write the node's conditions again (its Ready
    /// condition set False), kept the condition.
    kept_by_kwok: Option<bool>,
    flipped: bool,
}

const REBOOT_ID: &str = "3C1D9E27-6A4B-4F0E-9D2C-7B8A6E5F4D31";

async fn watch_reboot(client: Client, stop: Arc<AtomicBool>, since: DateTime<Utc>) -> RebootSeen {
    let sevs: Api<ScheduledEvent> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let mut seen = RebootSeen::default();
    while !stop.load(Ordering::SeqCst) {
        let list = sevs.list(&ListParams::default()).await.expect("list sev");
        let mine: Vec<&ScheduledEvent> = list
            .items
            .iter()
            .filter(|e| ours(e, REBOOT_ID, since))
            .collect();
        let leading = mine
            .iter()
            .any(|e| e.status.as_ref().is_some_and(|s| s.phase.is_some()));
        if leading && seen.unexpected_at.is_none() {
            // The controller leads and has read every Node: a restart of a
            // node that no event affects.
            set_boot_id(&client, "node-000000", "boot-0-after").await;
            seen.unexpected_at = Some(Utc::now());
        }
        let started = mine
            .iter()
            .any(|e| e.spec.event_status.as_str() == "Started");
        if started && seen.expected_at.is_none() {
            seen.expected_at = Some(Utc::now());
            set_boot_id(&client, "node-000001", "boot-1-after").await;
        }
        for name in ["node-000001", "node-000002"] {
            let n = nodes.get(name).await.expect("get node");
            if !is_cordoned(&n) || holds(&n).is_empty() {
                continue;
            }
            seen.label_while_held.entry(name.into()).or_insert((
                n.labels().get(LB_EXCLUSION_LABEL).cloned(),
                n.annotations().contains_key(LB_EXCLUDED_ANNOTATION),
            ));
            if let Some(c) = condition(&n, CONDITION_TYPE).filter(|c| c.0 == "True") {
                seen.condition
                    .entry(name.into())
                    .or_insert((c, condition_types(&n)));
                // Have KWOK write the node's status again, as its stages do
                // (a strategic merge patch of its own conditions).
                if name == "node-000001" && !seen.flipped {
                    seen.flipped = true;
                    nodes
                        .patch_status(
                            name,
                            &PatchParams::default(),
                            &Patch::Strategic(json!({"status": {"conditions": [
                                {"type": "Ready", "status": "False", "reason": "ImpactTest", "message": "test"}
                            ]}})),
                        )
                        .await
                        .expect("set Ready False");
                }
            }
            if name == "node-000001" && seen.flipped && seen.kept_by_kwok.is_none() {
                let ready = condition(&n, "Ready");
                if ready.as_ref().is_some_and(|r| r.1 == "KubeletReady") {
                    seen.kept_by_kwok = Some(condition(&n, CONDITION_TYPE).is_some());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

/// A Reboot of node-000001 and node-000002 with `excludeFromLoadBalancers`
/// on; node-000002 carries an administrator's load-balancer exclusion
/// label. node-000000, which no event affects, restarts as soon as the
/// controller leads; node-000001 restarts once the event is `Started`.
#[tokio::test(flavor = "multi_thread")]
async fn a_reboot_records_its_restart_an_unexpected_one_is_reported_and_operators_see_it_on_the_node()
 {
    let _turn = TURN.lock().await;
    let setup = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked")
        .client()
        .await
        .expect("client");
    for (i, n) in NODES.iter().enumerate() {
        set_boot_id(&setup, n, &format!("boot-{i}-before")).await;
        set_label(&setup, n, LB_EXCLUSION_LABEL, None).await;
    }
    set_label(&setup, "node-000002", LB_EXCLUSION_LABEL, Some("admin")).await;
    let since = Utc::now();
    let (report, seen, _cluster, client) = play_beside(
        "impact-reboot.yaml",
        |o| o.policy = Some("excludeFromLoadBalancers: true\n".into()),
        move |client, stop| watch_reboot(client, stop, since),
    )
    .await;
    println!("side task saw: {seen:?}");

    // The expected restart, recorded on the event with the time it was seen.
    let t1 = seen.expected_at.expect("node-000001 restarted");
    let imp = impact_of(&client, REBOOT_ID, "node-000001")
        .await
        .expect("node-000001's impact recorded");
    assert_eq!(imp.boot_id.as_deref(), Some("boot-1-before"), "{imp:?}");
    assert_eq!(
        imp.boot_id_after.as_deref(),
        Some("boot-1-after"),
        "{imp:?}"
    );
    // Dated when the controller saw it: after the change was sent (less a
    // second, in case the time is stored to the second) and before the
    // event was over. Order only: a loaded machine sees it later.
    let at = imp.restarted_at.expect("restartedAt");
    let over = finished_at(&client, REBOOT_ID).await;
    assert!(
        at >= t1 - chrono::Duration::seconds(1) && at <= over,
        "restartedAt {at}, bootID change sent at {t1}, event finished at {over}"
    );
    let other = impact_of(&client, REBOOT_ID, "node-000002")
        .await
        .expect("node-000002's baseline recorded");
    assert_eq!(other.boot_id.as_deref(), Some("boot-2-before"));
    assert_eq!(other.restarted_at, None, "node-000002 never restarted");
    let (expected, _) = node_events(&client, "node-000001", "NodeRestarted", since).await;
    assert!(expected >= 1, "no NodeRestarted Event on node-000001");
    let (wrong, notes) = node_events(&client, "node-000001", "UnexpectedRestart", since).await;
    assert_eq!(
        wrong, 0,
        "the announced restart was called unexpected: {notes:?}"
    );

    // The unexpected one: one Event on the Node, one in the metric.
    assert!(seen.unexpected_at.is_some());
    let (n, notes) = node_events(&client, "node-000000", "UnexpectedRestart", since).await;
    assert_eq!(n, 1, "{notes:?}");
    assert!(
        notes[0].contains("boot-0-before -> boot-0-after")
            && notes[0].contains("outside any Azure Scheduled Event"),
        "{notes:?}"
    );
    assert_eq!(
        report.metric(
            "controller",
            "forewarn_controller_unexpected_restarts_total"
        ),
        Some(1.0)
    );

    // The Node condition while held, next to KWOK's, kept when KWOK wrote
    // its own again, and False after.
    for node in ["node-000001", "node-000002"] {
        let ((status, reason, message), types) = seen
            .condition
            .get(node)
            .unwrap_or_else(|| panic!("{CONDITION_TYPE} never True on {node}: {seen:?}"));
        assert_eq!((status.as_str(), reason.as_str()), ("True", "Reboot"));
        assert!(
            message.contains(REBOOT_ID) && message.contains("NotBefore"),
            "{message}"
        );
        for kwok in ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"] {
            assert!(types.iter().any(|t| t == kwok), "{kwok} missing: {types:?}");
        }
    }
    assert_eq!(seen.kept_by_kwok, Some(true), "{seen:?}");
    let nodes: Api<Node> = Api::all(client.clone());
    for node in NODES {
        let n = nodes.get(node).await.expect("node");
        let ours = condition(&n, CONDITION_TYPE);
        if node == "node-000000" {
            assert_eq!(ours, None, "no event affected {node}");
        } else {
            let (status, reason, _) = ours.expect("the condition stays, False");
            assert_eq!(
                (status.as_str(), reason.as_str()),
                ("False", "NoScheduledEvent")
            );
        }
        let ready = condition(&n, "Ready").expect("KWOK's Ready condition");
        assert_eq!(
            (ready.0.as_str(), ready.1.as_str()),
            ("True", "KubeletReady")
        );
    }

    // The load-balancer label: added to and removed from node-000001;
    // the administrator's on node-000002 left as it was, held or not.
    assert_eq!(
        seen.label_while_held.get("node-000001"),
        Some(&(Some("true".to_string()), true)),
        "{seen:?}"
    );
    assert_eq!(
        seen.label_while_held.get("node-000002"),
        Some(&(Some("admin".to_string()), false)),
        "{seen:?}"
    );
    let n1 = nodes.get("node-000001").await.expect("node");
    assert!(
        !n1.labels().contains_key(LB_EXCLUSION_LABEL)
            && !n1.annotations().contains_key(LB_EXCLUDED_ANNOTATION),
        "{:?} {:?}",
        n1.labels(),
        n1.annotations()
    );
    let n2 = nodes.get("node-000002").await.expect("node");
    assert_eq!(
        n2.labels().get(LB_EXCLUSION_LABEL).map(String::as_str),
        Some("admin")
    );
    set_label(&client, "node-000002", LB_EXCLUSION_LABEL, None).await;
}

/// What the side task of the controller-restart test saw.
#[derive(Debug, Default)]
struct RestartSeen {
    unexpected_at: Option<DateTime<Utc>>,
    expected_at: Option<DateTime<Utc>>,
    labelled: bool,
}

const REDEPLOY_ID: &str = "0C3B5B7E-2D0B-4D39-9B51-6A1F0E2D7A01";

/// A restart counted by one controller is not counted again by the next
/// one (SIGKILLed as the event starts; the new one lists every Node
/// afresh), and the expected restart is recorded once. The policy leaves
/// `excludeFromLoadBalancers` off: no label.
#[tokio::test(flavor = "multi_thread")]
async fn a_controller_restart_counts_no_restart_twice() {
    let _turn = TURN.lock().await;
    let setup = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked")
        .client()
        .await
        .expect("client");
    for (i, n) in NODES.iter().enumerate() {
        set_boot_id(&setup, n, &format!("boot-{i}-r1")).await;
    }
    let since = Utc::now();
    let (report, seen, _cluster, client) = play_beside(
        "platform-redeploy.yaml",
        |o| o.kill_controller_on_start = true,
        move |client: Client, stop: Arc<AtomicBool>| async move {
            let sevs: Api<ScheduledEvent> = Api::all(client.clone());
            let nodes: Api<Node> = Api::all(client.clone());
            let mut seen = RestartSeen::default();
            while !stop.load(Ordering::SeqCst) {
                let list = sevs.list(&ListParams::default()).await.expect("list");
                let mine: Vec<&ScheduledEvent> = list
                    .items
                    .iter()
                    .filter(|e| ours(e, REDEPLOY_ID, since))
                    .collect();
                if seen.unexpected_at.is_none()
                    && mine
                        .iter()
                        .any(|e| e.status.as_ref().is_some_and(|s| s.phase.is_some()))
                {
                    set_boot_id(&client, "node-000000", "boot-0-r2").await;
                    seen.unexpected_at = Some(Utc::now());
                }
                if seen.expected_at.is_none()
                    && mine
                        .iter()
                        .any(|e| e.spec.event_status.as_str() == "Started")
                {
                    seen.expected_at = Some(Utc::now());
                    set_boot_id(&client, "node-000001", "boot-1-r2").await;
                }
                let n = nodes.get("node-000001").await.expect("node");
                seen.labelled |= n.labels().contains_key(LB_EXCLUSION_LABEL);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        },
    )
    .await;
    println!("side task saw: {seen:?}");
    assert!(
        report
            .timeline
            .iter()
            .any(|l| l.contains("controller killed")),
        "the controller was not killed"
    );
    let (n, notes) = node_events(&client, "node-000000", "UnexpectedRestart", since).await;
    assert_eq!(n, 1, "one restart, counted {n} times: {notes:?}");
    // The controller that ran last saw no change of its own.
    assert_eq!(
        report.metric(
            "controller",
            "forewarn_controller_unexpected_restarts_total"
        ),
        Some(0.0)
    );
    let (wrong, notes) = node_events(&client, "node-000001", "UnexpectedRestart", since).await;
    assert_eq!(wrong, 0, "{notes:?}");
    let imp = impact_of(&client, REDEPLOY_ID, "node-000001")
        .await
        .expect("impact recorded");
    assert_eq!(imp.boot_id.as_deref(), Some("boot-1-r1"), "{imp:?}");
    assert_eq!(imp.boot_id_after.as_deref(), Some("boot-1-r2"), "{imp:?}");
    // Written as the old controller was killed: the new one, which waits
    // for the killed one's Lease to expire (15 s), may be the first to see
    // it, and dates it when it does: after the change was sent (less a
    // second, in case the time is stored to the second) and before the
    // event was over. Order only: a loaded machine sees it later.
    let at = imp.restarted_at.expect("restartedAt");
    let t1 = seen.expected_at.expect("restarted");
    let over = finished_at(&client, REDEPLOY_ID).await;
    assert!(
        at >= t1 - chrono::Duration::seconds(1) && at <= over,
        "restartedAt {at}, bootID change sent at {t1}, event finished at {over}"
    );
    assert!(!seen.labelled, "labelled although the policy does not ask");
}

/// Who renews node-000001's Lease during the Freeze test, instead of KWOK.
const TEST_HOLDER: &str = "impact-test-kubelet";

/// Renews node-000001's Lease now as `holder`, as a kubelet does, and
/// returns the `renewTime` written (to the microsecond, as written).
async fn renew(leases: &Api<Lease>, holder: &str, duration: i32) -> DateTime<Utc> {
    let written = Utc::now();
    let now = written.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    leases
        .patch(
            "node-000001",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration,
                "renewTime": now,
            }})),
        )
        .await
        .expect("renew the Lease");
    DateTime::parse_from_rfc3339(&now)
        .expect("the time written")
        .with_timezone(&Utc)
}

const FREEZE_ID: &str = "8E2F4A61-0B3C-4D5E-9F70-1A2B3C4D5E62";

/// How long the test's "kubelet" on node-000001 stops renewing its Lease.
const HELD_STILL: Duration = Duration::from_secs(6);

/// A Freeze of node-000001: its Lease, renewed every 500 ms by the test
/// from before the event (KWOK leaves a Lease another holder renews
/// alone), is not renewed for 6 s while the event runs; the record shows
/// the gap and the freeze, as the renewal times the test wrote give them
/// (not as the test's clock meant them: a loaded machine stretches the
/// intervals between renewals, and the record must follow).
#[tokio::test(flavor = "multi_thread")]
async fn a_freeze_records_the_gap_in_the_nodes_heartbeats() {
    let _turn = TURN.lock().await;
    let setup = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked")
        .client()
        .await
        .expect("client");
    let leases: Api<Lease> = Api::namespaced(setup.clone(), "kube-node-lease");
    let before = leases
        .get("node-000001")
        .await
        .expect("node-000001's Lease");
    let spec = before.spec.clone().unwrap_or_default();
    let kwok_holder = spec.holder_identity.clone().unwrap_or_default();
    let kwok_duration = spec.lease_duration_seconds.unwrap_or(40);
    let since = Utc::now();
    let held = Arc::new(Mutex::new(None::<(DateTime<Utc>, DateTime<Utc>)>));
    let held_side = held.clone();
    let written = Arc::new(Mutex::new(Vec::<DateTime<Utc>>::new()));
    let written_side = written.clone();
    let result = play_beside(
        "impact-freeze.yaml",
        |_| {},
        move |client: Client, stop: Arc<AtomicBool>| async move {
            let sevs: Api<ScheduledEvent> = Api::all(client.clone());
            let pods: Api<k8s_openapi::api::core::v1::Pod> =
                Api::namespaced(client.clone(), "shop");
            let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
            // KWOK runs the pods only of the nodes whose Lease it holds: the
            // test's kubelet takes node-000001's over once this run's
            // workload is up (not the last run's, being deleted), before
            // the event appears.
            let begun = Utc::now() - chrono::Duration::seconds(1);
            loop {
                let ready = pods
                    .list(&ListParams::default().labels("app=web"))
                    .await
                    .map(|l| {
                        l.items
                            .iter()
                            .filter(|p| {
                                p.metadata
                                    .creation_timestamp
                                    .as_ref()
                                    .is_some_and(|t| t.0.as_second() >= begun.timestamp())
                                    && p.status.as_ref().is_some_and(|s| {
                                        s.conditions
                                            .iter()
                                            .flatten()
                                            .any(|c| c.type_ == "Ready" && c.status == "True")
                                    })
                            })
                            .count()
                    })
                    .unwrap_or(0);
                if ready >= 6 || stop.load(Ordering::SeqCst) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let mut pause: Option<tokio::time::Instant> = None;
            while !stop.load(Ordering::SeqCst) {
                let started = sevs
                    .list(&ListParams::default())
                    .await
                    .expect("list")
                    .items
                    .iter()
                    .filter(|e| ours(e, FREEZE_ID, since))
                    .any(|e| e.spec.event_status.as_str() == "Started");
                if started && pause.is_none() {
                    pause = Some(tokio::time::Instant::now() + Duration::from_secs(2));
                }
                let now = tokio::time::Instant::now();
                let frozen = pause.is_some_and(|p| now >= p && now < p + HELD_STILL);
                if frozen {
                    let mut h = held_side.lock().unwrap();
                    let t = Utc::now();
                    *h = Some(h.map_or((t, t), |(a, _)| (a, t)));
                } else {
                    let at = renew(&leases, TEST_HOLDER, 40).await;
                    written_side.lock().unwrap().push(at);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            // Give the Lease back to KWOK, whatever happened to the run.
            renew(&leases, &kwok_holder, kwok_duration).await;
        },
    )
    .await;
    let (_report, (), _cluster, client) = result;
    let (from, to) = held.lock().unwrap().expect("the Lease was held still");
    println!("Lease held still from {from} to {to}");
    // The intervals between the renewals the test wrote: the one across
    // the hold, the others (every ~500 ms, longer under load).
    let written = written.lock().unwrap().clone();
    let intervals: Vec<(DateTime<Utc>, f64)> = written
        .windows(2)
        .map(|w| (w[0], (w[1] - w[0]).as_seconds_f64()))
        .collect();
    // The interval across the hold starts at the last renewal before it.
    let at = intervals
        .iter()
        .rposition(|(start, _)| *start < from)
        .expect("no renewal before the hold");
    let across = intervals[at].1;
    let others: Vec<f64> = intervals
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != at)
        .map(|(_, (_, d))| *d)
        .collect();
    let longest = intervals.iter().map(|(_, d)| *d).fold(0.0, f64::max);
    let (usual_min, usual_max) = (
        others.iter().copied().fold(f64::MAX, f64::min),
        others.iter().copied().fold(0.0, f64::max),
    );
    println!(
        "renewals written: {}; across the hold {across:.3} s, longest {longest:.3} s, others {usual_min:.3}..{usual_max:.3} s",
        written.len()
    );
    let imp = impact_of(&client, FREEZE_ID, "node-000001")
        .await
        .expect("impact recorded");
    let gap = imp.heartbeat_gap_seconds.expect("heartbeatGapSeconds");
    let freeze = imp.observed_freeze_seconds.expect("observedFreezeSeconds");
    // Recorded to 0.1 s: the gap across the hold was seen (a longer one
    // only if the test wrote one), and the freeze is that gap less a usual
    // interval (the median of those seen, so between the shortest and the
    // longest of the others written).
    let tenth = 0.1 + 1e-9;
    assert!(
        gap >= across - tenth && gap <= longest + tenth,
        "gap {gap}, renewals written {across:.3} s apart across the hold, at most {longest:.3} s: {imp:?}"
    );
    assert!(
        freeze < gap && freeze >= gap - usual_max - tenth && freeze <= gap - usual_min + tenth,
        "freeze {freeze}, gap {gap}, usual intervals written {usual_min:.3}..{usual_max:.3} s: {imp:?}"
    );
    assert_eq!(imp.restarted_at, None);
}

/// `rules: [{eventSource: User, action: Approve}]` approves a `User`
/// Reboot at once: no cordon, no eviction (the harness checks the node and
/// its pods were left alone), an approval that reaches IMDS.
#[tokio::test(flavor = "multi_thread")]
async fn a_user_reboot_is_approved_at_once_by_policy() {
    let _turn = TURN.lock().await;
    let (report, (), _cluster, client) = play_beside(
        "user-reboot-approved-at-once.yaml",
        |o| o.policy = Some("rules:\n- {eventSource: User, action: Approve}\n".into()),
        |_, _| async {},
    )
    .await;
    assert!(report.cordoned.is_empty(), "cordoned {:?}", report.cordoned);
    assert!(!report.approvals.is_empty());
    let ev = Api::<ScheduledEvent>::all(client)
        .get("1f6a2c3d-4b5e-4f70-8a9b-0c1d2e3f4a16")
        .await
        .expect("the ScheduledEvent");
    let status = ev.status.expect("status");
    assert_eq!(status.action.map(|a| a.as_str()), Some("Approve"));
    let reason = status.approval.and_then(|a| a.reason).unwrap_or_default();
    assert!(reason.contains("User Reboot"), "{reason}");
}
