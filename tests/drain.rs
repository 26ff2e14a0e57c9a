//! End-to-end tests of the drain on a real local control plane whose KWOK
//! nodes honour grace periods (hack/kwok-stages.yaml): an evicted pod stays
//! Terminating until its `deletionTimestamp`, as on a kubelet, so a grace of
//! 0 (a force delete) and a grace of 30 look different here. Every check
//! reads what the API server applied (the pod's `deletionGracePeriodSeconds`,
//! node versions from a watch, the object's status), never forewarn's word.
//! They fail, never skip, when the cluster cannot start.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forewarn::api::ScheduledEvent;
use forewarn::controller::act::drain;
use forewarn::controller::decide::plan::{Eviction, EvictionOutcome};
use forewarn::controller::observe::pod_list::{self, PodInfo};
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::options::RunOptions;
use forewarn_harness::report::{PodDeletion, Report, summary};
use forewarn_harness::run::run_scenario;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// One cluster for the whole test binary; tests take turns on it.
fn cluster() -> Cluster {
    forewarn_harness::cluster::shared(
        &std::env::var("FOREWARN_DRAIN_CLUSTER").unwrap_or_else(|_| "forewarn-drain".into()),
        3,
    )
}

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NODE: &str = "node-000001";

async fn play_with(file: &str, adjust: impl FnOnce(&mut RunOptions)) -> (Report, Cluster) {
    let cluster = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked");
    let mut opts = RunOptions::new(
        repo_root().join("tests/fixtures").join(file),
        PathBuf::from(env!("CARGO_BIN_EXE_forewarn")),
    );
    // A hang bound: these scenarios are over in 20 to 70 s; a healthy run
    // ends as soon as its events are over and its nodes released.
    opts.timeout = Duration::from_secs(240);
    adjust(&mut opts);
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
    assert!(
        report.min_ready >= report.min_available,
        "PodDisruptionBudget violated: {} ready",
        report.min_ready
    );
    (report, cluster)
}

/// A Deployment of `replicas` pods pinned to `node` (the replacements of
/// evicted pods stay Pending there, as the node is cordoned).
fn pinned(
    name: &str,
    replicas: i32,
    grace: i64,
    node: &str,
    extra_pod_spec: serde_json::Value,
) -> serde_json::Value {
    let mut spec = json!({
        "terminationGracePeriodSeconds": grace,
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
    });
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_pod_spec.as_object()) {
        s.extend(extra.clone());
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    })
}

fn pdb(name: &str, app: &str, min_available: i32) -> serde_json::Value {
    json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
    })
}

fn deletions_of<'a>(r: &'a Report, prefix: &str) -> Vec<&'a PodDeletion> {
    r.deletions
        .iter()
        .filter(|d| d.pod.starts_with(prefix))
        .collect()
}

async fn sev(client: &Client, id: &str) -> ScheduledEvent {
    Api::<ScheduledEvent>::all(client.clone())
        .get(&id.to_ascii_lowercase())
        .await
        .unwrap_or_else(|e| panic!("ScheduledEvent {id}: {e}"))
}

fn condition(ev: &ScheduledEvent, type_: &str) -> Option<(String, String)> {
    ev.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

async fn event_notes(client: &Client, reason: &str) -> Vec<String> {
    Api::<KubeEvent>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list Events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn short_notice_preempt_gives_every_pod_a_nonzero_grace_that_ends_before_not_before() {
    let _turn = TURN.lock().await;
    // 20 pods of 25 s grace, and one of 600 s, all stopping only when their
    // grace runs out; 30 s notice.
    let (r, cluster) = play_with("drain-short-notice.yaml", |o| {
        o.extra_objects = vec![
            pinned("slow", 20, 25, NODE, json!({})),
            pinned("longest", 1, 600, NODE, json!({})),
        ];
    })
    .await;
    let not_before: DateTime<Utc> = r.started + chrono::Duration::seconds(2 + 30);
    let evicted: Vec<&PodDeletion> = r
        .deletions
        .iter()
        .filter(|d| d.pod.starts_with("shop/slow-") || d.pod.starts_with("shop/longest-"))
        .collect();
    assert_eq!(
        evicted.len(),
        21,
        "every pinned pod evicted once: {evicted:#?}"
    );
    for d in &evicted {
        let grace = d.grace_seconds.expect("a deletion has a grace period");
        assert!(grace >= 1, "{} got grace {grace}: a force delete", d.pod);
        assert!(
            grace <= 25,
            "{} got grace {grace}, longer than the time left",
            d.pod
        );
        assert!(
            d.deletion_timestamp <= not_before,
            "{} may run until {}, after NotBefore {not_before}",
            d.pod,
            d.deletion_timestamp
        );
    }
    // At the drain deadline: approved only once drained (the harness
    // checks no pod was left on the node when IMDS got the approval, and
    // that the approval was decided after the drain), else held with the
    // drain recorded incomplete, and then not drained when that was
    // recorded. Whether the drain beat the deadline depends on the load.
    let client = cluster.client().await.expect("client");
    let ev = sev(&client, "7A1D0C3E-4B5F-4E60-8C71-92A3B4C5D601").await;
    let status = ev.status.clone().expect("status");
    let incomplete = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DrainIncomplete" && c.status == "True")
        .cloned();
    let drained_at = status.nodes.iter().flatten().find_map(|n| n.drained_at);
    println!(
        "approvals {:?}; drainedAt {drained_at:?}; DrainIncomplete {incomplete:?}",
        r.approvals
    );
    if r.approvals.is_empty() {
        let c = incomplete.expect("neither approved nor recorded DrainIncomplete");
        // (Less a second: the condition's time may be stored to the second.)
        let at = c.last_transition_time - chrono::Duration::seconds(1);
        assert!(
            drained_at.is_none_or(|d| d >= at),
            "held with the drain recorded incomplete at {}, though it was done at {drained_at:?}",
            c.last_transition_time
        );
    } else {
        let decided = status
            .approval
            .as_ref()
            .and_then(|a| a.decided_at)
            .expect("approval.decidedAt");
        assert!(
            drained_at.is_some_and(|d| d <= decided),
            "approved (decided at {decided}) with the drain done at {drained_at:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hardware_failure_evicts_with_the_pods_own_grace_period() {
    let _turn = TURN.lock().await;
    let (r, _) = play_with("hardware-failure.yaml", |o| {
        o.extra_objects = vec![pinned("own", 2, 17, "node-000002", json!({}))];
    })
    .await;
    let own = deletions_of(&r, "shop/own-");
    assert_eq!(own.len(), 2, "{:#?}", r.deletions);
    for d in own {
        assert_eq!(
            d.grace_seconds,
            Some(17),
            "no NotBefore: the pod's own grace, as the API server applied it"
        );
    }
    let web: Vec<&PodDeletion> = deletions_of(&r, "shop/web-")
        .into_iter()
        .filter(|d| d.node == "node-000002")
        .collect();
    assert!(!web.is_empty());
    assert!(web.iter().all(|d| d.grace_seconds == Some(30)), "{web:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn pdb_blocked_past_the_deadline_is_never_approved_and_stays_recorded_as_not_drained() {
    let _turn = TURN.lock().await;
    // The PDB allows nothing until 24 s (past the deadline of 2 + 25 - 5 =
    // 22 s); then it lets one pod go, which must get the grace floor (5 s),
    // not 0; the other stays blocked until the event runs.
    let (r, cluster) = play_with("drain-blocked.yaml", |o| {
        o.extra_objects = vec![
            pinned("stuck", 2, 30, NODE, json!({})),
            pdb("stuck", "stuck", 2),
        ];
        o.timed_kubectl = vec![(
            Duration::from_secs(24),
            [
                "patch",
                "pdb",
                "stuck",
                "-n",
                "shop",
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"minAvailable":1}}"#,
            ]
            .map(String::from)
            .to_vec(),
        )];
    })
    .await;
    assert!(r.approvals.is_empty(), "approved: {:?}", r.approvals);
    let stuck = deletions_of(&r, "shop/stuck-");
    assert_eq!(
        stuck.len(),
        1,
        "exactly the one pod the PDB allowed: {stuck:#?}"
    );
    assert_eq!(
        stuck[0].grace_seconds,
        Some(5),
        "past the deadline: the floor, never a force delete"
    );
    let client = cluster.client().await.expect("client");
    let ev = sev(&client, "7A1D0C3E-4B5F-4E60-8C71-92A3B4C5D602").await;
    let status = ev.status.clone().expect("status");
    assert_eq!(status.phase, Some(forewarn::api::Phase::Completed));
    assert_eq!(status.nodes_drained.as_deref(), Some("0/1"));
    let node = &status.nodes.as_ref().expect("nodes")[0];
    assert!(node.drained_at.is_none(), "{node:?}");
    assert!(node.pods_remaining >= 1, "{node:?}");
    assert_eq!(
        node.blocking_budgets,
        vec!["shop/stuck".to_string()],
        "{node:?}"
    );
    let (st, reason) = condition(&ev, "DrainIncomplete").expect("DrainIncomplete");
    assert_eq!((st.as_str(), reason.as_str()), ("True", "DeadlinePassed"));
    assert!(
        r.timeline.iter().any(|l| l.contains("DrainIncomplete")),
        "no DrainIncomplete Event in the timeline"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_keeps_bare_daemonset_and_mirror_pods_and_names_every_blocker() {
    let _turn = TURN.lock().await;
    let bare = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "bare", "labels": {"app": "bare"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    });
    let mirror = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "static-web", "annotations": {"kubernetes.io/config.mirror": "abc", "kubernetes.io/config.source": "file"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    });
    let daemonset = json!({
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
    });
    // A ReplicaSet copies its template's finalizers to its pods
    // (GetPodFromTemplate): this pod stays Terminating after its 2 s grace.
    let mut held = pinned("held", 1, 2, NODE, json!({}));
    held["spec"]["template"]["metadata"]["finalizers"] = json!(["forewarn.dev/test-hold"]);
    let (r, cluster) = play_with("drain-zoo.yaml", |o| {
        o.extra_objects = vec![
            bare,
            mirror,
            daemonset,
            pinned("two", 1, 30, NODE, json!({})),
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "two-a"},
                   "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "two"}}}}),
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "two-b"},
                   "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "two"}}}}),
            pinned("scratch", 1, 30, NODE, json!({"volumes": [{"name": "tmp", "emptyDir": {}}]})),
            held,
        ];
    })
    .await;
    let client = cluster.client().await.expect("client");
    let ev = sev(&client, "7A1D0C3E-4B5F-4E60-8C71-92A3B4C5D603").await;
    let status = ev.status.clone().expect("status");
    let node = &status.nodes.as_ref().expect("nodes")[0];
    assert!(
        node.pods_kept
            .iter()
            .any(|k| k.starts_with("shop/bare: no controller")),
        "{node:?}"
    );
    for b in ["shop/two-a", "shop/two-b"] {
        assert!(
            node.blocking_budgets.contains(&b.to_string()),
            "{b} not named: {node:?}"
        );
    }
    assert!(r.approvals.is_empty(), "a bare pod stays: no approval");
    assert!(
        deletions_of(&r, "shop/bare").is_empty(),
        "the bare pod was deleted"
    );
    assert!(
        deletions_of(&r, "shop/static-web").is_empty(),
        "the mirror pod was deleted"
    );
    assert!(
        deletions_of(&r, "shop/everywhere-").is_empty(),
        "a DaemonSet pod was deleted"
    );
    assert!(
        deletions_of(&r, "shop/two-").is_empty(),
        "the pod under two PDBs was deleted"
    );
    assert_eq!(
        deletions_of(&r, "shop/scratch-").len(),
        1,
        "the emptyDir pod was not evicted"
    );
    assert_eq!(
        deletions_of(&r, "shop/held-").len(),
        1,
        "the finalizer pod was not evicted"
    );
    assert!(
        node.waiting_for.iter().any(|w| w.starts_with("shop/held-")
            && w.contains("stuck terminating")
            && w.contains("forewarn.dev/test-hold")),
        "the finalizer holding the pod is not shown: {node:?}"
    );
    assert!(
        event_notes(&client, "PodKept")
            .await
            .iter()
            .any(|n| n.contains("shop/bare")),
        "no PodKept Event"
    );
    assert!(
        event_notes(&client, "EvictionBlocked")
            .await
            .iter()
            .any(|n| n.contains("shop/two-a") && n.contains("shop/two-b")),
        "no EvictionBlocked Event naming both PDBs"
    );
    let (st, _) = condition(&ev, "DrainIncomplete").expect("DrainIncomplete");
    assert_eq!(st, "True");
}

#[tokio::test(flavor = "multi_thread")]
async fn terminate_evicts_a_bare_pod_when_the_policy_says_so() {
    let _turn = TURN.lock().await;
    let (r, _) = play_with("drain-terminate-bare.yaml", |o| {
        o.policy = Some("evictUnmanagedPods: [Terminate]\n".into());
        o.extra_objects = vec![json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "bare", "annotations": {"forewarn.dev/stop-after": "500ms"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        })];
    })
    .await;
    let bare = deletions_of(&r, "shop/bare");
    assert_eq!(bare.len(), 1, "{:#?}", r.deletions);
    assert_eq!(bare[0].grace_seconds, Some(30));
    assert!(!r.approvals.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn node_stays_cordoned_when_one_event_hands_over_to_the_next() {
    let _turn = TURN.lock().await;
    let (r, _) = play_with("handover.yaml", |_| {}).await;
    let changes: Vec<bool> = r
        .node_changes
        .iter()
        .filter(|(_, n, _)| n == NODE)
        .map(|(_, _, c)| *c)
        .collect();
    // The watch's first delivery is the node as it was (schedulable); then
    // exactly one cordon and one uncordon, at the very end.
    assert_eq!(changes, [false, true, false], "{:#?}", r.node_changes);
    // Uncordoned only after the Reboot, which appeared at 30 s, ran and
    // ended (the mock's log).
    let uncordoned = r
        .node_changes
        .iter()
        .rev()
        .find(|(_, n, _)| n == NODE)
        .map(|(t, _, _)| *t);
    let reboot_over = r
        .imds_log
        .iter()
        .find(|e| e.event_id == "7A1D0C3E-4B5F-4E60-8C71-92A3B4C5D606" && e.what == "Finished")
        .map(|e| e.time)
        .expect("the Reboot ran and ended");
    assert!(
        uncordoned.is_some_and(|t| t >= reboot_over),
        "uncordoned before the Reboot ended at {reboot_over}: {:#?}",
        r.node_changes
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn node_with_a_hundred_and_ten_pods_drains_completely() {
    let _turn = TURN.lock().await;
    let (r, _) = play_with("platform-redeploy.yaml", |o| {
        o.extra_objects = vec![pinned("many", 108, 30, NODE, json!({}))];
        // Pods that stop 0.5-1.5 s after eviction, like servers.
        if let Some(d) = o.extra_objects[0]["spec"]["template"]["metadata"].as_object_mut() {
            d.insert(
                "annotations".into(),
                json!({"forewarn.dev/stop-after": "500ms", "forewarn.dev/stop-before": "1500ms"}),
            );
        }
    })
    .await;
    assert_eq!(deletions_of(&r, "shop/many-").len(), 108);
    assert!(!r.approvals.is_empty());
}

/// Namespace `ns`, empty: deleted first if an earlier run left it (waiting
/// until it is gone), then created.
async fn fresh_namespace(client: &Client, ns: &str) -> Api<Namespace> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    // A hang bound: an empty namespace goes within seconds.
    let by = std::time::Instant::now() + Duration::from_secs(120);
    while namespaces.get_opt(ns).await.expect("get ns").is_some() {
        assert!(
            std::time::Instant::now() < by,
            "namespace {ns} from an earlier run not deleted within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .expect("namespace");
    namespaces
}

#[tokio::test(flavor = "multi_thread")]
async fn eviction_reaches_the_api_server_with_its_grace_and_uid_precondition() {
    let _turn = TURN.lock().await;
    let cluster = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked");
    let client = cluster.client().await.expect("client");
    let ns = "evict-direct";
    let namespaces = fresh_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": ns},
        "spec": {"nodeName": "node-000000", "terminationGracePeriodSeconds": 600,
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }))
    .unwrap();
    let first = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create p");
    let old_uid = first.uid().unwrap();
    // Deleted and recreated under the same name between planning and eviction.
    pods.delete("p", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete p");
    for _ in 0..40 {
        if pods.get_opt("p").await.expect("get").is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Recreated under the same name, and Running: the API server deletes a
    // pod that never ran at once, whatever the grace. KWOK may still finish
    // the old pod's deletion against the new one: then create it again.
    // A hang bound: KWOK runs a pod within a second or two.
    let mut second = None;
    let by = std::time::Instant::now() + Duration::from_secs(120);
    while std::time::Instant::now() < by {
        match pods.get_opt("p").await.expect("get p") {
            None => {
                pods.create(&PostParams::default(), &pod)
                    .await
                    .expect("recreate p");
            }
            Some(p)
                if p.uid() != Some(old_uid.clone())
                    && p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") =>
            {
                second = Some(p);
                break;
            }
            Some(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = second.expect("the recreated pod p never ran");
    let evict_client = {
        let mut config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&cluster.kubeconfig).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
        config.default_retry = false;
        Client::try_from(config).unwrap()
    };
    let planned = |uid: String| Eviction {
        node: "node-000000".into(),
        pod: std::sync::Arc::new(PodInfo {
            namespace: ns.into(),
            name: "p".into(),
            uid,
            managed: true,
            grace_seconds: 600,
            ..PodInfo::default()
        }),
        grace_seconds: 7,
    };
    // No budget selects p: an empty budget cache says as much.
    let no_budgets = kube::runtime::reflector::store::Writer::<
        k8s_openapi::api::policy::v1::PodDisruptionBudget,
    >::default()
    .as_reader();
    let outcome = drain::evict(&evict_client, &planned(old_uid), &no_budgets).await;
    assert_eq!(
        outcome,
        EvictionOutcome::Gone,
        "the UID precondition must refuse the new pod"
    );
    let still = pods.get("p").await.expect("p");
    assert!(
        still.metadata.deletion_timestamp.is_none(),
        "the recreated pod was evicted in its predecessor's place"
    );

    let outcome = drain::evict(&evict_client, &planned(second.uid().unwrap()), &no_budgets).await;
    assert_eq!(outcome, EvictionOutcome::Evicted);
    let evicted = pods.get("p").await.expect("p terminating");
    assert_eq!(
        evicted.metadata.deletion_grace_period_seconds,
        Some(7),
        "the grace asked for (not the pod's 600 s) is the grace the API server applied"
    );
    let _ = pods
        .delete("p", &DeleteParams::default().grace_period(0))
        .await;
    let _ = namespaces.delete(ns, &DeleteParams::default()).await;
}

/// The approval's fresh read of a large event's pods (one paginated list
/// of every bound pod) finds on each node exactly what a list by that
/// node's field selector finds, across pages (2 pods a page here), and an
/// empty list for a node without pods; nodes not asked for are left out.
#[tokio::test(flavor = "multi_thread")]
async fn one_paginated_list_finds_each_nodes_pods_as_a_list_per_node_does() {
    let _turn = TURN.lock().await;
    let cluster = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked");
    let client = cluster.client().await.expect("client");
    let ns = "list-all";
    fresh_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for (name, node) in [
        ("a1", "node-000001"),
        ("a2", "node-000001"),
        ("a3", "node-000001"),
        ("b1", "node-000002"),
    ] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": node,
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create a pod");
    }
    let asked: std::collections::HashSet<String> =
        ["node-000001", "node-absent"].map(String::from).into();
    let by_node = pod_list::pods_by_node(&client, &asked, 2)
        .await
        .expect("one paginated list");
    assert_eq!(by_node.len(), 2, "{by_node:#?}");
    let sorted = |mut v: Vec<PodInfo>| {
        v.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        v
    };
    for node in ["node-000001", "node-absent"] {
        let one = sorted(
            pod_list::pods_on(&client, node)
                .await
                .expect("list by node"),
        );
        let all = sorted(by_node.get(node).cloned().unwrap_or_default());
        assert_eq!(all, one, "{node}");
    }
    let ours = |node: &str| {
        by_node
            .get(node)
            .map(|v| v.iter().filter(|p| p.namespace == ns).count())
            .unwrap_or(0)
    };
    assert_eq!(ours("node-000001"), 3);
    assert!(by_node["node-absent"].iter().all(|p| p.namespace != ns));
    // Gone before the next test: a bare pod on a node would be kept there
    // by its drain.
    for name in ["a1", "a2", "a3", "b1"] {
        let _ = pods
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
    }
    // A hang bound: pods deleted with grace 0 go at once.
    let by = std::time::Instant::now() + Duration::from_secs(120);
    while std::time::Instant::now() < by {
        if pods
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the test's pods were not deleted within 120 s");
}
