//! forewarn next to AKS node auto-drain, on a real local control plane.
//! AKS cordons and drains the nodes of a `Redeploy` or `Preempt` itself
//! and may taint them `remediator.kubernetes.azure.com/unschedulable`; the
//! test plays that remediator while forewarn runs as always:
//!
//! - on node-000001 the remediator is first: it cordons and taints the node
//!   before the event reaches the cluster, so the cordon is its own;
//! - on node-000002 forewarn is first: the remediator finds the node
//!   cordoned and only adds its taint;
//! - on both it evicts a pod itself, through the Eviction API (so the
//!   PodDisruptionBudget is honoured, as AKS's drain does), as soon as the
//!   node's agent reports the event;
//! - it lifts its marks (its taint, and the cordon it owns) some seconds
//!   after the event ended, after forewarn's release delay.
//!
//! Every check reads what the API server saw: the node versions from a
//! watch (ordered by `resourceVersion`), the pods' deletions, the
//! PodDisruptionBudget's ready count (the harness's watch), the event's
//! status and the IMDS mock's log of approvals. The test fails, never
//! skips, when the cluster cannot start.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use forewarn::api::{ScheduledEvent, ScheduledEventReport, holds};
use forewarn::controller::act::cordon::TAINT_KEY;
use forewarn::topology::VirtualMachineReport;
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::inspect::expect_scheduled_event as sev;
use forewarn_harness::options::RunOptions;
use forewarn_harness::report::{Report, summary};
use forewarn_harness::run::run_scenario;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The taint AKS node auto-drain puts on a node it cordons for a scheduled
/// event (AKS documentation, "node auto-drain").
const REMEDIATOR_TAINT: &str = "remediator.kubernetes.azure.com/unschedulable";
const EVENT: &str = "9C5EBF70-5162-4384-CE85-F60718293A01";
/// The node the remediator cordons before forewarn sees the event.
const AKS_FIRST: &str = "node-000001";
/// The node forewarn cordons before the remediator comes.
const FOREWARN_FIRST: &str = "node-000002";
/// How long the remediator keeps its marks after the event ended: longer
/// than forewarn's `releaseDelaySeconds` (5), so forewarn releases first
/// (10 s of room for a controller slowed by a loaded machine).
const LINGER: Duration = Duration::from_secs(15);

fn cluster() -> Cluster {
    forewarn_harness::cluster::shared(
        &std::env::var("FOREWARN_AKS_CLUSTER").unwrap_or_else(|_| "forewarn-aks".into()),
        3,
    )
}

/// One version of a node as the watch delivered it.
#[derive(Debug, Clone)]
struct Version {
    rv: u64,
    node: String,
    unschedulable: bool,
    taints: BTreeSet<String>,
    holds: Vec<String>,
}

impl Version {
    fn of(n: &Node) -> Self {
        Version {
            rv: rv(n),
            node: n.name_any(),
            unschedulable: n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            taints: taints(n).into_iter().map(|t| t.key).collect(),
            holds: holds(n),
        }
    }

    fn remediator(&self) -> bool {
        self.taints.contains(REMEDIATOR_TAINT)
    }
}

fn rv(n: &Node) -> u64 {
    n.resource_version()
        .and_then(|v| v.parse().ok())
        .expect("a numeric resourceVersion")
}

fn taints(n: &Node) -> Vec<Taint> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// What the remediator did, with the `resourceVersion` of each node write
/// as the API server answered it.
#[derive(Debug, Default, Clone)]
struct Acts {
    /// Its cordon and taint of [`AKS_FIRST`].
    cordoned_first: Option<u64>,
    /// Its taint of [`FOREWARN_FIRST`] (found cordoned: the cordon is not its own).
    tainted_second: Option<u64>,
    /// Whether [`FOREWARN_FIRST`] was cordoned when the remediator tainted it.
    second_was_cordoned: bool,
    /// Its release of each node: `(node, resourceVersion)`.
    released: Vec<(String, u64)>,
    /// The pods it evicted: `(node, namespace/name)`.
    evicted: Vec<(String, String)>,
    /// Evictions the API server refused for the budget (429).
    refused: usize,
    /// When it saw the event's `ScheduledEvent` Completed.
    ended_at: Option<DateTime<Utc>>,
}

/// Adds (`mark`) or removes the remediator's taint on `node`, and sets
/// `spec.unschedulable` to `cordon` when given, in one merge patch
/// conditional on the `resourceVersion` read (a 409 reads again), so that
/// no other writer's taint is lost. Returns the node as written and
/// whether it was cordoned when read.
async fn write_marks(
    api: &Api<Node>,
    node: &str,
    mark: bool,
    cordon: Option<bool>,
) -> (Node, bool) {
    loop {
        let n = api.get(node).await.expect("read the node");
        let was_cordoned = n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let mut list: Vec<Taint> = taints(&n)
            .into_iter()
            .filter(|t| t.key != REMEDIATOR_TAINT)
            .collect();
        if mark {
            list.push(Taint {
                key: REMEDIATOR_TAINT.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            });
        }
        let mut spec = json!({"taints": list});
        if let Some(c) = cordon {
            spec["unschedulable"] = json!(c);
        }
        let body = json!({
            "metadata": {"resourceVersion": n.resource_version()},
            "spec": spec,
        });
        match api
            .patch(node, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(written) => return (written, was_cordoned),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("remediator: write {node}: {e}"),
        }
    }
}

/// Evicts one `web` pod of `node` through the Eviction API. Returns the
/// pod evicted, `Err(())` when the budget refused (429), `Ok(None)` when
/// none is left to evict.
async fn evict_one(client: &Client, node: &str) -> Result<Option<String>, ()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let list = pods
        .list(
            &ListParams::default()
                .labels("app=web")
                .fields(&format!("spec.nodeName={node}")),
        )
        .await
        .expect("list pods");
    let Some(pod) = list
        .items
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
    else {
        return Ok(None);
    };
    match pods.evict(&pod.name_any(), &EvictParams::default()).await {
        Ok(_) => Ok(Some(format!("shop/{}", pod.name_any()))),
        Err(kube::Error::Api(e)) if e.code == 429 => Err(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(None),
        Err(e) => panic!("remediator: evict on {node}: {e}"),
    }
}

/// Plays AKS's remediator for one run that began at `t0` (objects older
/// are an earlier run's): see the module's comment.
async fn remediate(client: Client, t0: DateTime<Utc>, acts: Arc<Mutex<Acts>>) {
    let nodes: Api<Node> = Api::all(client.clone());
    let vmrs: Api<VirtualMachineReport> = Api::all(client.clone());
    let reports: Api<ScheduledEventReport> = Api::all(client.clone());
    let sevs: Api<ScheduledEvent> = Api::all(client.clone());
    let fresh = |created: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        created.is_some_and(|t| t.0.as_second() >= t0.timestamp())
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    // The fleet is up (node-000001's agent wrote its VM report): AKS learns
    // of the event before forewarn does, and cordons node-000001.
    loop {
        assert!(Instant::now() < deadline, "remediator: no agent came up");
        let up = vmrs
            .get_opt(AKS_FIRST)
            .await
            .expect("read VirtualMachineReport")
            .is_some_and(|r| fresh(r.metadata.creation_timestamp.as_ref()));
        if up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (written, was_cordoned) = write_marks(&nodes, AKS_FIRST, true, Some(true)).await;
    assert!(
        !was_cordoned,
        "{AKS_FIRST} was cordoned before the remediator came"
    );
    acts.lock().unwrap().cordoned_first = Some(rv(&written));

    let name = EVENT.to_ascii_lowercase();
    let mut drained: BTreeSet<&str> = BTreeSet::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "remediator: the event never ended"
        );
        // node-000002: forewarn holds it; the remediator adds its taint.
        if acts.lock().unwrap().tainted_second.is_none() {
            let n = nodes.get(FOREWARN_FIRST).await.expect("read node");
            if !holds(&n).is_empty() {
                let (written, was_cordoned) = write_marks(&nodes, FOREWARN_FIRST, true, None).await;
                let mut a = acts.lock().unwrap();
                a.tainted_second = Some(rv(&written));
                a.second_was_cordoned = was_cordoned;
            }
        }
        // Each node whose agent lists the event: evict one pod there.
        let listed: BTreeSet<String> = reports
            .list(&ListParams::default())
            .await
            .expect("list reports")
            .items
            .into_iter()
            .filter(|r| fresh(r.metadata.creation_timestamp.as_ref()))
            .filter(|r| r.spec.scheduled_event == name && r.spec.report.is_listed())
            .map(|r| r.spec.report.node)
            .collect();
        for node in [AKS_FIRST, FOREWARN_FIRST] {
            if drained.contains(node) || !listed.contains(node) {
                continue;
            }
            match evict_one(&client, node).await {
                Ok(Some(pod)) => {
                    acts.lock().unwrap().evicted.push((node.to_string(), pod));
                    drained.insert(node);
                }
                Ok(None) => {
                    drained.insert(node);
                }
                Err(()) => acts.lock().unwrap().refused += 1,
            }
        }
        let ended = sevs
            .get_opt(&name)
            .await
            .expect("read the ScheduledEvent")
            .filter(|ev| fresh(ev.metadata.creation_timestamp.as_ref()))
            .and_then(|ev| ev.status.and_then(|s| s.phase))
            .is_some_and(|p| p == forewarn::api::Phase::Completed);
        if ended {
            acts.lock().unwrap().ended_at = Some(Utc::now());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It keeps its marks a while after the event, then lifts them: the
    // cordon only where it was its own.
    tokio::time::sleep(LINGER).await;
    let (first, _) = write_marks(&nodes, AKS_FIRST, false, Some(false)).await;
    let (second, _) = write_marks(&nodes, FOREWARN_FIRST, false, None).await;
    acts.lock().unwrap().released = vec![
        (AKS_FIRST.to_string(), rv(&first)),
        (FOREWARN_FIRST.to_string(), rv(&second)),
    ];
}

/// Every version of every node the API server sent while `run` ran.
async fn watching<T>(
    client: &Client,
    run: impl std::future::Future<Output = T>,
) -> (T, Vec<Version>) {
    let seen: Arc<Mutex<Vec<Version>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let nodes: Api<Node> = Api::all(client.clone());
    let task = tokio::spawn(async move {
        let stream = watcher(nodes, watcher::Config::default()).applied_objects();
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Ok(n) = item {
                sink.lock().unwrap().push(Version::of(&n));
            }
        }
    });
    let out = run.await;
    // The last writes' versions reach the watch a moment later.
    tokio::time::sleep(Duration::from_secs(1)).await;
    task.abort();
    let mut versions = seen.lock().unwrap().clone();
    versions.sort_by_key(|v| v.rv);
    versions.dedup_by_key(|v| (v.rv, v.node.clone()));
    (out, versions)
}

/// AKS node auto-drain and forewarn on one `Redeploy`: neither undoes the
/// other's marks, budgets hold, the approval waits for forewarn's drain.
#[tokio::test(flavor = "multi_thread")]
async fn forewarn_and_aks_auto_drain_share_the_nodes_without_undoing_each_other() {
    let cluster = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked");
    let client = cluster.client().await.expect("client");
    let mut opts = RunOptions::new(
        repo_root().join("tests/fixtures/aks-auto-drain.yaml"),
        PathBuf::from(env!("CARGO_BIN_EXE_forewarn")),
    );
    opts.timeout = Duration::from_secs(150);
    let t0 = Utc::now();
    let acts: Arc<Mutex<Acts>> = Arc::default();
    let ((report, ()), versions) = watching(&client, async {
        let (report, ()) = tokio::join!(
            run_scenario(&cluster, &opts),
            remediate(client.clone(), t0, Arc::clone(&acts))
        );
        (report, ())
    })
    .await;
    let report: Report = report.unwrap_or_else(|e| panic!("could not run: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    let acts = acts.lock().unwrap().clone();
    println!("remediator: {acts:?}");
    assert!(
        report.ok(),
        "{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    let of = |node: &str| -> Vec<&Version> { versions.iter().filter(|v| v.node == node).collect() };
    let released = |node: &str| {
        acts.released
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, rv)| *rv)
            .unwrap_or_else(|| panic!("the remediator never released {node}"))
    };

    // node-000001: the remediator's cordon and taint, first, held in every
    // version until its own release; forewarn never took them for its own
    // (no hold, no taint of forewarn's on it, ever).
    let cordoned = acts
        .cordoned_first
        .expect("the remediator cordoned node-000001");
    let lifted = released(AKS_FIRST);
    let first = of(AKS_FIRST);
    for v in &first {
        assert!(
            v.holds.is_empty() && !v.taints.contains(TAINT_KEY),
            "forewarn marked {AKS_FIRST}, cordoned by the remediator first: {v:?}"
        );
        if v.rv >= cordoned && v.rv < lifted {
            assert!(
                v.unschedulable && v.remediator(),
                "the remediator's cordon or taint of {AKS_FIRST} was undone before it lifted them: {v:?}"
            );
        }
    }
    assert!(
        first.iter().any(|v| v.rv == cordoned) && acts.ended_at.is_some(),
        "the watch never saw the remediator's cordon of {AKS_FIRST}"
    );
    assert!(
        first
            .iter()
            .any(|v| v.rv == lifted && !v.unschedulable && !v.remediator()),
        "the watch never saw the remediator lift its marks of {AKS_FIRST}"
    );

    // node-000002: forewarn's cordon first; the remediator's taint, once
    // added, in every version until the remediator removed it; forewarn's
    // release (its hold gone) came first and left the taint.
    let tainted = acts
        .tainted_second
        .expect("the remediator tainted node-000002");
    assert!(
        acts.second_was_cordoned,
        "forewarn had not cordoned {FOREWARN_FIRST} first"
    );
    let untainted = released(FOREWARN_FIRST);
    let second = of(FOREWARN_FIRST);
    let held_first = second
        .iter()
        .find(|v| !v.holds.is_empty())
        .expect("forewarn never held node-000002");
    assert!(
        held_first.rv < tainted
            && held_first.unschedulable
            && held_first.taints.contains(TAINT_KEY)
    );
    for v in second
        .iter()
        .filter(|v| v.rv >= tainted && v.rv < untainted)
    {
        assert!(
            v.remediator(),
            "the remediator's taint of {FOREWARN_FIRST} was removed before it removed it: {v:?}"
        );
    }
    let release = second
        .iter()
        .filter(|v| v.rv > held_first.rv)
        .find(|v| v.holds.is_empty())
        .expect("forewarn never released node-000002");
    assert!(
        release.rv < untainted && release.remediator() && !release.taints.contains(TAINT_KEY),
        "forewarn's release of {FOREWARN_FIRST} took the remediator's taint or came after it: {release:?}"
    );

    // The end: nothing of either actor is left on any node.
    let nodes: Vec<Node> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items;
    for n in &nodes {
        let v = Version::of(n);
        assert!(
            !v.unschedulable && v.holds.is_empty() && v.taints.is_empty(),
            "{} is left marked: {v:?}",
            v.node
        );
    }

    // Pods: both evicted (the remediator at least one), through the
    // Eviction API; the budget held throughout (the harness's watch of the
    // ready pods; its `minAvailable` is 5 of 6).
    assert!(!acts.evicted.is_empty(), "the remediator evicted nothing");
    assert!(
        report.min_ready >= report.min_available,
        "PodDisruptionBudget violated: {} ready, minAvailable {}",
        report.min_ready,
        report.min_available
    );
    let by_forewarn: Vec<_> = report
        .deletions
        .iter()
        .filter(|d| d.node == AKS_FIRST || d.node == FOREWARN_FIRST)
        .filter(|d| !acts.evicted.iter().any(|(_, p)| *p == d.pod))
        .collect();
    assert!(!by_forewarn.is_empty(), "forewarn evicted nothing");

    // The approval: decided on forewarn's own drained state of both nodes,
    // the one the remediator cordoned included, and sent after it.
    let ev = sev(&client, EVENT).await;
    let st = ev.status.clone().expect("status");
    let decided = st
        .approval
        .as_ref()
        .and_then(|a| a.decided_at)
        .expect("an approval was decided");
    for node in [AKS_FIRST, FOREWARN_FIRST] {
        let record = st
            .nodes
            .iter()
            .flatten()
            .find(|n| n.name == node)
            .unwrap_or_else(|| panic!("no record of {node}"));
        let drained = record
            .drained_at
            .unwrap_or_else(|| panic!("{node} never recorded drained"));
        assert!(
            drained <= decided,
            "{node} drained at {drained}, approval decided at {decided}"
        );
        assert_eq!(
            (record.cordoned_by_us, record.already_cordoned),
            (node == FOREWARN_FIRST, node == AKS_FIRST),
            "{node}: {record:?}"
        );
    }
    let sent = report
        .imds_log
        .iter()
        .find(|e| e.event_id.eq_ignore_ascii_case(EVENT) && e.what == "Approved")
        .expect("the approval reached IMDS");
    assert!(
        sent.time >= decided,
        "approved at {} before it was decided ({decided})",
        sent.time
    );
}
