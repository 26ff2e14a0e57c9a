//! End-to-end tests of the drain lead time, the deadline policy and the fault domains, on a real local control
//! plane: a rule's drain lead time holds one event's cordon until
//! `NotBefore` minus it while another type drains at once; the deadline
//! policy `Hold` never approves a drain a PodDisruptionBudget blocks, while
//! `Approve` approves it at the deadline and records what was left; and the
//! fault-domain labels the controller writes from the agents' VM reports.
//! Every check reads what the API server holds (nodes from a watch, the
//! objects, their Events) or the IMDS mock's own log; forewarn's own word
//! (its metrics) only where nothing else can tell (a write that changes
//! nothing leaves no trace in the API server). They fail, never skip, when
//! the cluster cannot start.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forewarn::api::Phase;
use forewarn::topology::{
    FAULT_DOMAIN_LABEL, UPDATE_DOMAIN_LABEL, VirtualMachineReport, ZONE_LABEL,
};
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::inspect::{condition, event_notes, expect_scheduled_event as sev};
use forewarn_harness::options::RunOptions;
use forewarn_harness::report::{Report, summary};
use forewarn_harness::run::run_scenario;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// One cluster for the whole test binary; tests take turns on it.
fn cluster() -> Cluster {
    forewarn_harness::cluster::shared(
        &std::env::var("FOREWARN_POLICY_CLUSTER").unwrap_or_else(|_| "forewarn-policy".into()),
        3,
    )
}

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn shared_cluster() -> Cluster {
    tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked")
}

async fn play_with(file: &str, adjust: impl FnOnce(&mut RunOptions)) -> (Report, Cluster) {
    let cluster = shared_cluster().await;
    let mut opts = RunOptions::new(
        repo_root().join("tests/fixtures").join(file),
        PathBuf::from(env!("CARGO_BIN_EXE_forewarn")),
    );
    // A hang bound: the scenarios end within about a minute (their last
    // NotBefore plus the event's run); only a run that stopped progressing
    // takes 150 s.
    opts.timeout = Duration::from_secs(150);
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

/// A Deployment of `replicas` pods pinned to `node`.
fn pinned(name: &str, replicas: i32, node: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "terminationGracePeriodSeconds": 30,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            }},
        },
    })
}

/// A PodDisruptionBudget that lets none of `app`'s `replicas` pods go.
fn blocking_pdb(app: &str, replicas: i32) -> serde_json::Value {
    json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": app},
        "spec": {"minAvailable": replicas, "selector": {"matchLabels": {"app": app}}},
    })
}

/// Item 3: a rule gives `Reboot` a 30 s drain lead time. With the same
/// `NotBefore` 45 s ahead, the Redeploy's node is cordoned at once and the
/// Reboot's only at `NotBefore` minus 30 s (never before), while its
/// `ScheduledEvent` waits `Pending` with `DrainScheduled`.
#[tokio::test(flavor = "multi_thread")]
async fn a_rules_lead_time_holds_the_cordon_until_not_before_minus_it_while_another_type_drains_at_once()
 {
    let _turn = TURN.lock().await;
    const REBOOT: &str = "5E1A7B3C-1D2E-4F30-8A41-B2C3D4E5F601";
    const REDEPLOY: &str = "5E1A7B3C-1D2E-4F30-8A41-B2C3D4E5F602";
    let (report, cluster) = play_with("lead-time-per-type.yaml", |o| {
        o.policy = Some(
            "rules:\n- {eventType: Reboot, action: DrainAndApprove, drainLeadTimeSeconds: 30}\n"
                .into(),
        );
    })
    .await;
    let client = cluster.client().await.expect("client");
    let reboot = sev(&client, REBOOT).await;
    let redeploy = sev(&client, REDEPLOY).await;

    // The Reboot's NotBefore, from the DrainScheduled Event (the spec's
    // is gone once the event started).
    let notes = event_notes(&client, REBOOT, "DrainScheduled").await;
    let note = notes
        .iter()
        .find(|n| n.contains("the cordon and drain start at"))
        .unwrap_or_else(|| panic!("no DrainScheduled Event for the Reboot: {notes:?}"));
    assert!(note.contains("(30s"), "{note}");
    let nb_text = note
        .split("NotBefore is ")
        .nth(1)
        .and_then(|t| t.split(';').next())
        .expect("NotBefore in the note");
    let nb = DateTime::parse_from_rfc3339(nb_text)
        .expect("an RFC 3339 NotBefore")
        .with_timezone(&Utc);
    let start = nb - chrono::Duration::seconds(30);

    let reboot_cordon = report
        .first_cordon("node-000001")
        .expect("node-000001 was never cordoned");
    let redeploy_cordon = report
        .first_cordon("node-000002")
        .expect("node-000002 was never cordoned");
    println!(
        "NotBefore {nb}; Redeploy's node cordoned {:.1}s before it, Reboot's {:.1}s before it",
        (nb - redeploy_cordon).num_milliseconds() as f64 / 1000.0,
        (nb - reboot_cordon).num_milliseconds() as f64 / 1000.0
    );
    assert!(
        reboot_cordon >= start,
        "the Reboot's node was cordoned at {reboot_cordon}, before NotBefore - 30 s ({start})"
    );
    // Started when the lead time began, not at NotBefore (30 s later) nor at
    // some later pass: nominally within a second, seen by the harness's
    // watch of nodes. Half the lead time is a margin only a controller that
    // missed its timer (or stalled for 15 s) exceeds.
    assert!(
        reboot_cordon < start + chrono::Duration::seconds(15),
        "the Reboot's drain started late: {reboot_cordon}, lead time began {start}"
    );
    // Appeared 2 s in, NotBefore 45 s later: the Redeploy's drain starts at
    // once, some 15 s before the Reboot's may. Judged by order: cordoned
    // before the Reboot's lead time began (a Redeploy that waited for a
    // lead time too would be cordoned at it or later); only a controller
    // stalled for those 15 s fails it with the right rule.
    assert!(
        redeploy_cordon < start,
        "the Redeploy waited too: cordoned at {redeploy_cordon}, the Reboot's lead time began {start}"
    );
    // Both ran their course: drained, approved, completed.
    for ev in [&reboot, &redeploy] {
        assert_eq!(
            ev.status.as_ref().and_then(|s| s.phase),
            Some(Phase::Completed)
        );
    }
    let (status, reason, _) = condition(&reboot, "DrainScheduled").expect("DrainScheduled");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "LeadTimeReached")
    );
    assert!(
        condition(&redeploy, "DrainScheduled").is_none(),
        "the Redeploy waited for a lead time"
    );
    assert!(
        report.timeline.iter().any(|l| l.contains(&format!(
            "Reboot {} phase Pending",
            REBOOT[..8].to_ascii_lowercase()
        ))),
        "the Reboot was not Pending while it waited"
    );
}

/// Item 4: two drains a PodDisruptionBudget blocks past the deadline. The
/// Redeploy's rule says `onDeadline: Approve`: IMDS gets its approval at
/// the deadline (`NotBefore` minus the 9 s margin this test sets), before
/// `NotBefore`, and `DrainIncomplete` says what was left. The Reboot is
/// held (the default): the mock's log has no approval of it, and it starts
/// at `NotBefore`.
#[tokio::test(flavor = "multi_thread")]
async fn hold_never_approves_a_blocked_drain_and_approve_approves_it_at_the_deadline() {
    let _turn = TURN.lock().await;
    const APPROVE: &str = "6F2B8C4D-2E3F-4051-9B52-C3D4E5F60701";
    const HOLD: &str = "6F2B8C4D-2E3F-4051-9B52-C3D4E5F60702";
    let (report, cluster) = play_with("deadline-hold-approve.yaml", |o| {
        o.policy = Some(
            // A margin of 9 s, not the default 5 s: the time between the
            // deadline and NotBefore is the room the checks below leave for
            // a loaded machine, and the blocked drain's backoff (passes 1,
            // 2, 4, 8, 16 s apart from 2 s in) still has no pass between
            // the deadline (18 s in) and NotBefore (27 s in), so a
            // controller that missed its deadline timer acts after NotBefore.
            "rules:\n- {eventType: Redeploy, action: DrainAndApprove, onDeadline: Approve}\ndrainMarginSeconds: 9\n"
                .into(),
        );
        o.extra_objects = vec![
            pinned("stuck-a", 2, "node-000001"),
            blocking_pdb("stuck-a", 2),
            pinned("stuck-h", 2, "node-000002"),
            blocking_pdb("stuck-h", 2),
        ];
    })
    .await;
    let client = cluster.client().await.expect("client");

    // Hold: no approval reached IMDS, none was decided.
    let held: Vec<_> = report
        .imds_log
        .iter()
        .filter(|e| e.event_id.eq_ignore_ascii_case(HOLD) && e.what == "Approved")
        .collect();
    assert!(held.is_empty(), "the held Reboot was approved: {held:?}");
    let hold = sev(&client, HOLD).await;
    let st = hold.status.clone().expect("status");
    assert!(st.approval.is_none(), "{:?}", st.approval);
    assert_eq!(st.nodes_drained.as_deref(), Some("0/1"));
    let (status, reason, message) = condition(&hold, "DrainIncomplete").expect("DrainIncomplete");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "DeadlinePassed"),
        "{message}"
    );
    // When the platform started the held Reboot, by the mock's own log: at
    // NotBefore (27 s in), or a poll later; the Redeploy has the same
    // NotBefore.
    let not_before_seen = report
        .imds_log
        .iter()
        .find(|e| e.event_id.eq_ignore_ascii_case(HOLD) && e.what == "Started")
        .map(|e| e.time)
        .expect("the held Reboot started at NotBefore");
    // Recorded at the deadline (18 s in), before NotBefore (27 s), not a
    // blocked drain's backoff later (33 s in). `report.started` is read
    // just after the mock's clock started, NotBefore is written in whole
    // seconds: `deadline` is at most a second early and may be late by that
    // reading's latency; 3 s of slack below it still catches a decision
    // taken when the drain blocked (2 s in). Above it: only the order
    // against NotBefore, as the mock saw it.
    let deadline = report.started + chrono::Duration::seconds(18);
    let recorded = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DrainIncomplete")
        .map(|c| c.last_transition_time)
        .expect("DrainIncomplete");
    assert!(
        recorded >= deadline - chrono::Duration::seconds(3) && recorded < not_before_seen,
        "DrainIncomplete recorded at {recorded}, the deadline was {deadline}, NotBefore came at {not_before_seen}"
    );

    // Approve: IMDS got the approval at the deadline: after NotBefore - 9 s,
    // before NotBefore.
    let approved: Vec<_> = report
        .imds_log
        .iter()
        .filter(|e| e.event_id.eq_ignore_ascii_case(APPROVE) && e.what == "Approved")
        .collect();
    let first = approved
        .first()
        .unwrap_or_else(|| panic!("no approval of the Redeploy reached IMDS"));
    let ev = sev(&client, APPROVE).await;
    let st = ev.status.clone().expect("status");
    let approval = st.approval.clone().expect("approval");
    let decided = approval.decided_at.expect("decidedAt");
    let reason = approval.reason.clone().unwrap_or_default();
    assert!(reason.contains("onDeadline is Approve"), "{reason}");
    // The deadline: appearance at 2 s, notice 25 s, margin 9 s: 18 s in
    // (the same slack below it as above).
    assert!(
        decided >= deadline - chrono::Duration::seconds(3),
        "decided at {decided}, before the deadline {deadline}"
    );
    // Before NotBefore, by the mock's clock for both.
    assert!(
        first.time < not_before_seen,
        "IMDS got the approval at {}, after NotBefore ({not_before_seen}): long after the deadline {deadline}",
        first.time
    );
    let (status, reason, message) = condition(&ev, "DrainIncomplete").expect("DrainIncomplete");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ApprovedIncomplete"),
        "{message}"
    );
    assert!(
        message.contains("node-000001 not drained") && message.contains("shop/stuck-a-"),
        "what was left is not named: {message}"
    );
    assert_eq!(st.nodes_drained.as_deref(), Some("0/1"));
    assert!(
        !event_notes(&client, APPROVE, "DrainIncomplete")
            .await
            .is_empty(),
        "no DrainIncomplete Event"
    );
}

/// The node's labels.
async fn labels(client: &Client, node: &str) -> std::collections::BTreeMap<String, String> {
    Api::<Node>::all(client.clone())
        .get(node)
        .await
        .expect("node")
        .metadata
        .labels
        .unwrap_or_default()
}

/// Item 6: every agent reports its VM's fault and update domain as the
/// mock serves them; the controller labels the nodes with them, except
/// node-000002, whose zone label already is its fault domain (as
/// cloud-provider-azure sets it on an availability set), and not
/// node-000000's availability zone (`eastus-1`, no fault domain); it writes
/// each label once, however often the nodes change; `kubectl get sev -o
/// wide` shows how many fault domains the event touches.
#[tokio::test(flavor = "multi_thread")]
async fn agents_report_fault_domains_and_the_controller_labels_the_nodes_once() {
    let _turn = TURN.lock().await;
    const ID: &str = "7A3C9D5E-3F40-4162-8C63-D4E5F6071801";
    let cluster = shared_cluster().await;
    let set_zones = |zones: [Option<&str>; 2]| {
        for (node, zone) in [("node-000000", zones[0]), ("node-000002", zones[1])] {
            let label = match zone {
                Some(z) => format!("{ZONE_LABEL}={z}"),
                None => format!("{ZONE_LABEL}-"),
            };
            cluster
                .kubectl(&["label", "node", node, &label, "--overwrite"])
                .expect("label the node's zone");
        }
    };
    set_zones([Some("eastus-1"), Some("1")]);
    // Nodes change meanwhile (someone labels one, twice): each change wakes
    // the labeller, which must not write again.
    let poke = |v: &str| {
        [
            "label",
            "node",
            "node-000001",
            &format!("example.com/poke={v}"),
            "--overwrite",
        ]
        .map(String::from)
        .to_vec()
    };
    let run = std::panic::AssertUnwindSafe(play_with("fault-domains.yaml", |o| {
        o.timed_kubectl = vec![
            (Duration::from_secs(3), poke("1")),
            (Duration::from_secs(5), poke("2")),
        ];
    }));
    let outcome = futures::FutureExt::catch_unwind(run).await;
    let client = cluster.client().await.expect("client");
    let got: Vec<_> = {
        let mut v = Vec::new();
        for n in ["node-000000", "node-000001", "node-000002"] {
            v.push((n, labels(&client, n).await));
        }
        v
    };
    let vm_reports = Api::<VirtualMachineReport>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list VirtualMachineReports");
    // The shared cluster's other tests see no zones.
    set_zones([None, None]);
    let _ = cluster.kubectl(&["label", "node", "node-000001", "example.com/poke-"]);
    let (report, _) = match outcome {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    };

    // What each agent reported: the values the mock served its VM.
    let reported: Vec<(String, String, String, String)> = vm_reports
        .items
        .iter()
        .map(|r| {
            (
                r.name_any(),
                r.spec.vm.clone(),
                r.spec.platform_fault_domain.clone(),
                r.spec.platform_update_domain.clone(),
            )
        })
        .collect();
    let want = |n: &str, vm: &str, fd: &str, ud: &str| {
        (
            n.to_string(),
            vm.to_string(),
            fd.to_string(),
            ud.to_string(),
        )
    };
    assert_eq!(
        reported,
        [
            want("node-000000", "aks-nodepool1-16180339-vmss_0", "0", "3"),
            want("node-000001", "aks-nodepool1-16180339-vmss_1", "1", "4"),
            want("node-000002", "aks-nodepool1-16180339-vmss_2", "1", "0"),
        ]
    );
    // The labels: the reported values, but none on node-000002.
    let label = |i: usize, key: &str| got[i].1.get(key).cloned();
    assert_eq!(
        (label(0, FAULT_DOMAIN_LABEL), label(0, UPDATE_DOMAIN_LABEL)),
        (Some("0".into()), Some("3".into())),
        "node-000000 (zone eastus-1): {:?}",
        got[0].1
    );
    assert_eq!(
        (label(1, FAULT_DOMAIN_LABEL), label(1, UPDATE_DOMAIN_LABEL)),
        (Some("1".into()), Some("4".into())),
        "node-000001: {:?}",
        got[1].1
    );
    assert_eq!(
        (label(2, FAULT_DOMAIN_LABEL), label(2, UPDATE_DOMAIN_LABEL)),
        (None, None),
        "node-000002 has the cloud provider's fault domain: {:?}",
        got[2].1
    );
    assert_eq!(label(1, "example.com/poke").as_deref(), Some("2"));
    // Two nodes labelled, one write each, though every node change (the
    // pokes, KWOK's status updates) woke the labeller again. A write that
    // changes nothing leaves no trace in the API server: its own count.
    let metrics = &report
        .metrics
        .iter()
        .find(|(name, _)| name == "controller")
        .expect("controller metrics")
        .1;
    assert!(
        metrics.contains("forewarn_controller_node_writes_total{action=\"label\"} 2\n"),
        "not exactly two label writes:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("node_writes"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let log =
        std::fs::read_to_string(report.log_dir.join("controller.log")).expect("controller log");
    assert_eq!(
        log.matches("Labelled the node with its VM's fault and update domain")
            .count(),
        2,
        "{log}"
    );

    // `kubectl get sev -o wide`: the Freeze touches fault domains
    // eastus-1/0 and 1 (node-000001's and node-000002's): 2.
    let table = &report.sev_table;
    println!("{table}");
    let header = table.lines().next().expect("header");
    let col = header.find("FAULTDOMAINS").expect("a FAULTDOMAINS column");
    let row = table
        .lines()
        .find(|l| l.starts_with(&ID.to_ascii_lowercase()))
        .expect("the event's row");
    let cell: String = row[col..].split_whitespace().next().unwrap_or("").into();
    assert_eq!(cell, "2", "{table}");
    let ev = sev(&client, ID).await;
    assert_eq!(ev.status.and_then(|s| s.fault_domains), Some(2));
}

/// The label that puts a node under forewarn in
/// [`only_selected_nodes_are_drained_and_excluded_pods_stay`]'s policy.
const POOL_LABEL: &str = "forewarn-test/pool";

/// A Deployment of one pod labelled `app: name` in `ns`, pinned to `node`.
fn pinned_in(ns: &str, name: &str, node: &str) -> serde_json::Value {
    let mut d = pinned(name, 1, node);
    d["metadata"]["namespace"] = json!(ns);
    d
}

/// The pods of `ns` as the API server has them: `(name, uid, node,
/// deletionTimestamp set)`.
async fn pods_of(client: &Client, ns: &str) -> Vec<(String, String, String, bool)> {
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list pods")
        .items
        .into_iter()
        .map(|p| {
            (
                p.name_any(),
                p.uid().unwrap_or_default(),
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
                p.metadata.deletion_timestamp.is_some(),
            )
        })
        .collect()
}

/// Waits until every pod of `ns` is bound and running (60 s at most).
async fn wait_bound(client: &Client, ns: &str, count: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .expect("list pods");
        let running = pods
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running >= count {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{ns}: {running}/{count} pods running after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The policy's `nodeSelector` and `excludePods`, on the API server. Only
/// node-000001 carries the pool label the selector asks for. A Reboot
/// names node-000001 and node-000002: node-000001 is cordoned and drained
/// but for the pods the policy excludes (by namespace name, by namespace
/// label, by pod label), which keep their uid and never get a
/// deletionTimestamp; node-000002 is never cordoned, tainted or drained;
/// the approval reaches IMDS once node-000001 is drained. A Redeploy
/// naming only node-000000 (unmanaged) is recorded with `NoManagedNode`,
/// no approval reaches IMDS, and the platform starts it at `NotBefore`.
#[tokio::test(flavor = "multi_thread")]
async fn only_selected_nodes_are_drained_and_excluded_pods_stay() {
    let _turn = TURN.lock().await;
    const MIXED: &str = "8B4DAE6F-4051-4273-BD74-E5F607182901";
    const UNMANAGED: &str = "8B4DAE6F-4051-4273-BD74-E5F607182902";
    const BY_NAME: &str = "sel-left-alone";
    const BY_LABEL: &str = "sel-labelled";
    let cluster = shared_cluster().await;
    let client = cluster.client().await.expect("client");
    cluster
        .kubectl(&[
            "label",
            "node",
            "node-000001",
            &format!("{POOL_LABEL}=spot"),
            "--overwrite",
        ])
        .expect("label node-000001");
    // Two namespaces of pods the policy excludes, each pod on node-000001.
    for (ns, labels) in [
        (BY_NAME, json!({})),
        (BY_LABEL, json!({"forewarn-test/drain": "skip"})),
    ] {
        let _ = cluster.kubectl(&["delete", "namespace", ns, "--wait=true"]);
        let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}},
            pinned_in(ns, "kept", "node-000001"),
        ]});
        let file = std::env::temp_dir().join(format!("forewarn-{ns}.json"));
        std::fs::write(&file, objects.to_string()).expect("write objects");
        cluster
            .kubectl(&["apply", "-f", &file.to_string_lossy()])
            .expect("create the namespace and its Deployment");
    }
    wait_bound(&client, BY_NAME, 1).await;
    wait_bound(&client, BY_LABEL, 1).await;
    let before: Vec<_> = [
        pods_of(&client, BY_NAME).await,
        pods_of(&client, BY_LABEL).await,
    ]
    .concat();

    let run = std::panic::AssertUnwindSafe(play_with("selection.yaml", |o| {
        o.policy = Some(format!(
            "nodeSelector:\n  matchExpressions: [{{key: {POOL_LABEL}, operator: In, values: [spot]}}]\nexcludePods:\n  namespaces: [{BY_NAME}]\n  namespaceSelector: {{matchLabels: {{forewarn-test/drain: skip}}}}\n  podSelector: {{matchLabels: {{app: cache}}}}\n"
        ));
        // The workload namespace's own excluded pod, by its label.
        o.extra_objects = vec![pinned("cache", 1, "node-000001")];
    }));
    let outcome = futures::FutureExt::catch_unwind(run).await;
    let after_shop = pods_of(&client, "shop").await;
    let after: Vec<_> = [
        pods_of(&client, BY_NAME).await,
        pods_of(&client, BY_LABEL).await,
    ]
    .concat();
    let nodes: Vec<Node> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items;
    let mixed = sev(&client, MIXED).await;
    let unmanaged = sev(&client, UNMANAGED).await;
    // The shared cluster's other tests see neither.
    let _ = cluster.kubectl(&["label", "node", "node-000001", &format!("{POOL_LABEL}-")]);
    for ns in [BY_NAME, BY_LABEL] {
        let _ = cluster.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    }
    let (report, _) = match outcome {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    };

    // Nodes, from the harness's watch: only node-000001 was ever cordoned.
    assert!(
        report.first_cordon("node-000001").is_some(),
        "node-000001 was never cordoned"
    );
    for n in ["node-000000", "node-000002"] {
        assert_eq!(
            report.first_cordon(n),
            None,
            "{n} is unmanaged, but was cordoned"
        );
    }
    // And as stored at the end: no taint, no hold on any node.
    for n in &nodes {
        let taints = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        assert!(
            !taints
                .iter()
                .any(|t| t.key == forewarn::controller::act::cordon::TAINT_KEY),
            "{} keeps forewarn's taint: {taints:?}",
            n.name_any()
        );
        assert!(
            !n.annotations()
                .contains_key(forewarn::api::CORDONED_FOR_ANNOTATION),
            "{} keeps a hold",
            n.name_any()
        );
    }
    // Pods: nothing evicted on the unmanaged nodes, the workload's pods
    // evicted from node-000001 but for the excluded one.
    for d in &report.deletions {
        assert_eq!(
            d.node, "node-000001",
            "{} deleted on an unmanaged node",
            d.pod
        );
        assert!(
            d.pod.starts_with("shop/web-"),
            "{} was evicted, but is excluded",
            d.pod
        );
    }
    assert!(
        report
            .deletions
            .iter()
            .any(|d| d.pod.starts_with("shop/web-")),
        "no workload pod was evicted from node-000001"
    );
    let cache: Vec<_> = after_shop
        .iter()
        .filter(|p| p.0.starts_with("cache-"))
        .collect();
    assert!(
        cache.len() == 1 && cache[0].2 == "node-000001" && !cache[0].3,
        "the excluded shop/cache pod did not stay: {cache:?}"
    );
    assert_eq!(before, after, "the pods of the excluded namespaces changed");
    assert!(
        after.iter().all(|p| p.2 == "node-000001" && !p.3),
        "{after:?}"
    );

    // The mixed event: approved on node-000001's drain alone; node-000002
    // named as unmanaged, the excluded pods as kept.
    let st = mixed.status.clone().expect("status");
    assert_eq!(st.unmanaged_nodes, Some(vec!["node-000002".to_string()]));
    assert_eq!(st.nodes_drained.as_deref(), Some("1/1"));
    let (status, reason, _) = condition(&mixed, "NodesUnmanaged").expect("NodesUnmanaged");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "OutsideNodeSelector")
    );
    let record = st
        .nodes
        .iter()
        .flatten()
        .find(|n| n.name == "node-000001")
        .expect("node-000001's record");
    let kept = record.pods_kept.join("\n");
    for (what, why) in [
        (format!("{BY_NAME}/kept-"), "excludePods.namespaces"),
        (format!("{BY_LABEL}/kept-"), "excludePods.namespaceSelector"),
        ("shop/cache-".to_string(), "excludePods.podSelector"),
    ] {
        assert!(
            kept.lines()
                .any(|l| l.starts_with(&what) && l.contains(why)),
            "{what} not reported kept for {why}:\n{kept}"
        );
    }
    assert!(
        st.approval.as_ref().and_then(|a| a.reason.as_deref())
            == Some("all 1 affected nodes drained"),
        "{:?}",
        st.approval
    );

    // The unmanaged event: recorded, ignored, never approved by forewarn
    // (the scenario's expectation, from the mock's log), started by the
    // platform at NotBefore.
    let st = unmanaged.status.clone().expect("status");
    assert_eq!(st.unmanaged_nodes, Some(vec!["node-000000".to_string()]));
    assert_eq!(st.action, Some(forewarn::policy::Action::Ignore));
    assert!(st.approval.is_none(), "{:?}", st.approval);
    let (status, reason, _) = condition(&unmanaged, "NodesUnmanaged").expect("NodesUnmanaged");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "NoManagedNode")
    );
    assert!(
        report
            .imds_log
            .iter()
            .any(|e| e.event_id.eq_ignore_ascii_case(UNMANAGED) && e.what == "Started"),
        "the platform never started the unmanaged event"
    );
}
