//! Workloads take part, end to end on a real
//! local control plane: the pods that opt in get each event as a notice
//! annotation, the approval waits for the pods that ask for it to
//! acknowledge (up to a timeout), and the notices are gone once the event
//! is over. The workload is `examples/notice-workload.yaml`; KWOK runs no
//! container, so the harness plays its container's part (it reads the
//! notice as the kubelet would project it and acknowledges with a
//! TokenRequest token of the workload's ServiceAccount bound to the pod).
//! Every order is checked from the outside: the pod versions a watch
//! delivered, the IMDS mock's log of approval POSTs, pod deletions, the
//! object and its Events. They fail, never skip, when the cluster cannot
//! start.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::inspect::{condition, event_notes, expect_scheduled_event as sev};
use forewarn_harness::options::{Acknowledgers, RunOptions};
use forewarn_harness::report::{Report, summary};
use forewarn_harness::run::run_scenario;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

/// The cluster's name: `forewarn-work`, or `FOREWARN_WORK_CLUSTER`.
fn cluster_name() -> String {
    std::env::var("FOREWARN_WORK_CLUSTER").unwrap_or_else(|_| "forewarn-work".into())
}

fn cluster() -> Cluster {
    forewarn_harness::cluster::shared(&cluster_name(), 3)
}

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const REBOOT: &str = "5D0E7A11-3C2B-4E8F-9A61-0B7C2D4E6F01";
const FREEZE: &str = "8E2F4B6D-1A3C-4D5E-8F70-2B4C6D8E0A12";
const DB: [&str; 3] = ["db-0", "db-1", "db-2"];
/// A `ScheduledEvent` name no object has.
const GONE: &str = "0000dead-0000-4000-8000-000000000016";

/// A Deployment of one pod that takes notices only, on `node`.
fn notice_only(name: &str, node: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "forewarn.dev/notice": "true"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    })
}

/// The example workload, its containers played by the harness; they
/// acknowledge 2 s after they read their notice.
fn with_example_workload(o: &mut RunOptions, silent: &[&str]) {
    with_example_workload_preparing(o, silent, Duration::from_secs(2));
}

/// The example workload, its containers played by the harness; they
/// acknowledge `prepare` after they read their notice.
fn with_example_workload_preparing(o: &mut RunOptions, silent: &[&str], prepare: Duration) {
    o.extra_manifests
        .push(repo_root().join("examples/notice-workload.yaml"));
    o.acknowledgers = Some(Acknowledgers {
        pods: DB.iter().map(|s| s.to_string()).collect(),
        service_account: "notice-workload".into(),
        prepare,
        silent: silent.iter().map(|s| s.to_string()).collect(),
    });
}

/// `NotBefore` as a notice's value gives it (the spec drops it once the
/// event started).
fn notice_not_before(value: &str) -> DateTime<Utc> {
    value
        .split_whitespace()
        .find_map(|w| w.strip_prefix("notBefore="))
        .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("no notBefore in the notice {value:?}"))
}

async fn play(file: &str, adjust: impl FnOnce(&mut RunOptions)) -> (Report, Client) {
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
    (report, cluster.client().await.expect("client"))
}

/// When IMDS first received an approval of `id` (the mock's log).
fn approved_at(report: &Report, id: &str) -> DateTime<Utc> {
    report
        .approvals
        .iter()
        .filter(|a| a.event_id == id)
        .map(|a| a.time)
        .min()
        .unwrap_or_else(|| panic!("no approval of {id} reached IMDS"))
}

/// When the mock moved `id` to `what` (`Finished`, ...).
fn mock_at(report: &Report, id: &str, what: &str) -> DateTime<Utc> {
    report
        .imds_log
        .iter()
        .find(|e| e.event_id == id && e.what == what)
        .map(|e| e.time)
        .unwrap_or_else(|| panic!("the mock never logged {id} {what}"))
}

/// The cell of column `header` in the row of `name` of a `kubectl get`
/// table (columns are aligned on the header's offsets).
fn column(table: &str, header: &str, name: &str) -> Option<String> {
    let mut lines = table.lines().skip_while(|l| !l.starts_with("NAME"));
    let head = lines.next()?;
    let at = head.find(header)?;
    let row = lines.find(|l| l.starts_with(name))?;
    row.get(at..).map(|rest| {
        rest.split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    })
}

/// No pod of the workload's namespace holds a notice or an
/// acknowledgement any more: nothing is left behind.
async fn nothing_left_behind(client: &Client) {
    let pods = Api::<Pod>::namespaced(client.clone(), "shop")
        .list(&ListParams::default())
        .await
        .expect("list pods");
    for p in pods {
        let left: Vec<&String> = p
            .annotations()
            .keys()
            .filter(|k| k.starts_with("notice.forewarn.dev/") || k.starts_with("ack.forewarn.dev/"))
            .collect();
        assert!(left.is_empty(), "{} still holds {left:?}", p.name_any());
    }
}

/// Item 8's order, from the outside: the notice is stored on the pods that
/// opted in on the affected node (and on no other pod), the waited-for pod
/// acknowledges, its eviction comes after its acknowledgement while the
/// other pods of the node are evicted without waiting for it, and IMDS
/// receives the approval after all of it. The API server holds the notice
/// as written by forewarn-controller, status and Events say who
/// acknowledged, `kubectl get sev` shows `1/1`, and nothing is left behind.
#[tokio::test(flavor = "multi_thread")]
async fn notice_then_acknowledgement_then_eviction_then_approval() {
    let _turn = TURN.lock().await;
    let (report, client) = play("workloads-reboot.yaml", |o| {
        // The pod prepares 15 s before it acknowledges: the other pods'
        // evictions (which start with the drain, as the notice goes out)
        // then come before the acknowledgement whatever the load, unless
        // they wait for it.
        with_example_workload_preparing(o, &[], Duration::from_secs(15));
        o.extra_objects.push(notice_only("watcher", "node-000001"));
    })
    .await;
    let name = REBOOT.to_ascii_lowercase();
    // Notices: on the pods that opted in on node-000001 only.
    for n in &report.notices {
        assert_eq!(n.node, "node-000001", "a notice on another node: {n:?}");
        assert_eq!(n.event, name);
        assert!(
            n.pod.starts_with("shop/db-") || n.pod.starts_with("shop/watcher-"),
            "a notice on a pod that did not opt in: {n:?}"
        );
        assert_eq!(n.managers, ["forewarn-controller Update"], "{n:?}");
    }
    let db = report
        .notices
        .iter()
        .find(|n| n.pod.starts_with("shop/db-"))
        .expect("no notice on the StatefulSet's pod on node-000001");
    assert!(
        report
            .notices
            .iter()
            .any(|n| n.pod.starts_with("shop/watcher-")),
        "no notice on the notice-only pod"
    );
    for word in [
        &format!("eventId={REBOOT}") as &str,
        "type=Reboot",
        "status=Scheduled",
        "durationSeconds=-1",
        "action=DrainAndApprove",
        "drain=true",
        "acknowledgeBy=",
    ] {
        assert!(
            db.first_value.contains(word),
            "{word} not in {}",
            db.first_value
        );
    }
    // The acknowledgement, after the notice was there to read.
    let ack = report
        .acks
        .iter()
        .find(|a| a.pod == db.pod)
        .expect("the pod never acknowledged");
    assert_eq!(ack.event_id, REBOOT);
    assert!(ack.sent > db.first_seen);
    // Its eviction came after its acknowledgement; another pod of the node
    // was evicted before it (nothing else waits for the acknowledgement).
    let evicted = |pod: &str| {
        report
            .deletions
            .iter()
            .filter(|d| d.pod == pod && d.node == "node-000001")
            .map(|d| d.seen_at)
            .min()
    };
    let db_evicted = evicted(&db.pod).expect("the acknowledging pod was never evicted");
    // (Against when the acknowledgement was sent: it cannot have been
    // stored before, and the API server's answer may be read late.)
    assert!(
        db_evicted > ack.sent,
        "evicted at {db_evicted} before its acknowledgement was sent at {}",
        ack.sent
    );
    let web_first = report
        .deletions
        .iter()
        .filter(|d| d.node == "node-000001" && d.pod.starts_with("shop/web-"))
        .map(|d| d.seen_at)
        .min()
        .expect("no web pod evicted from node-000001");
    assert!(
        web_first < ack.sent,
        "the web pods waited for the acknowledgement"
    );
    // The approval POST came after the acknowledgement and every eviction.
    let approved = approved_at(&report, REBOOT);
    assert!(
        approved > ack.sent,
        "approved at {approved} before the acknowledgement was sent at {}",
        ack.sent
    );
    assert!(approved > db_evicted);
    // The record.
    let ev = sev(&client, REBOOT).await;
    let acks = ev
        .status
        .as_ref()
        .and_then(|s| s.acknowledgements.clone())
        .expect("no acknowledgements in the status");
    assert_eq!(acks.acknowledged.as_deref(), Some("1/1"), "{acks:?}");
    assert_eq!(acks.acknowledged_pods, std::slice::from_ref(&db.pod));
    assert!(
        acks.pending.is_empty() && acks.timed_out_at.is_none(),
        "{acks:?}"
    );
    let (status, reason, _) = condition(&ev, "AcknowledgementPending").expect("no condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "Acknowledged")
    );
    let waiting = event_notes(&client, REBOOT, "AwaitingAcknowledgement").await;
    assert!(
        waiting.iter().any(|n| n.contains(&db.pod)),
        "no AwaitingAcknowledgement Event naming {}: {waiting:?}",
        db.pod
    );
    assert!(
        !event_notes(&client, REBOOT, "Acknowledged")
            .await
            .is_empty()
    );
    assert_eq!(
        column(&report.sev_table, "ACKED", &name).as_deref(),
        Some("1/1"),
        "{}",
        report.sev_table
    );
    nothing_left_behind(&client).await;
}

/// A pod that asked to be waited for and never answers: the approval
/// waits for the policy's acknowledgeTimeoutSeconds (8 s here), then goes
/// on; the status names the pod, a Warning Event says so, the metric
/// counts it, and the pod is evicted only once the wait is over.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_pod_holds_the_approval_until_its_timeout() {
    let _turn = TURN.lock().await;
    let (report, client) = play("workloads-reboot.yaml", |o| {
        with_example_workload(o, &DB);
        o.policy = Some("acknowledgeTimeoutSeconds: 8\n".into());
    })
    .await;
    assert!(report.acks.is_empty(), "{:?}", report.acks);
    let db = report
        .notices
        .iter()
        .find(|n| n.pod.starts_with("shop/db-"))
        .expect("no notice on the StatefulSet's pod on node-000001");
    let ev = sev(&client, REBOOT).await;
    let acks = ev
        .status
        .as_ref()
        .and_then(|s| s.acknowledgements.clone())
        .expect("no acknowledgements in the status");
    let (since, deadline) = (acks.since.expect("since"), acks.deadline.expect("deadline"));
    assert_eq!(deadline - since, chrono::TimeDelta::seconds(8));
    assert!(since <= db.first_seen);
    assert_eq!(acks.pending, std::slice::from_ref(&db.pod));
    assert_eq!(acks.acknowledged.as_deref(), Some("0/1"));
    let timed_out = acks.timed_out_at.expect("no timedOutAt");
    assert!(timed_out >= deadline);
    let approved = approved_at(&report, REBOOT);
    assert!(
        approved >= deadline,
        "approved at {approved}, before the acknowledgement deadline {deadline}"
    );
    let db_evicted = report
        .deletions
        .iter()
        .filter(|d| d.pod == db.pod)
        .map(|d| d.seen_at)
        .min()
        .expect("the silent pod was never evicted");
    assert!(
        db_evicted >= deadline,
        "evicted at {db_evicted} before {deadline}"
    );
    let (status, reason, message) = condition(&ev, "AcknowledgementPending").expect("no condition");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "TimedOut"));
    assert!(message.contains(&db.pod), "{message}");
    let notes = event_notes(&client, REBOOT, "AcknowledgementTimedOut").await;
    assert!(
        notes.iter().any(|n| n.contains(&db.pod)),
        "no AcknowledgementTimedOut Event naming {}: {notes:?}",
        db.pod
    );
    let controller = report
        .metrics
        .iter()
        .find(|(name, _)| name == "controller")
        .map(|(_, text)| text.as_str())
        .unwrap_or_default();
    assert!(
        controller
            .contains("forewarn_controller_acknowledgement_timeouts_total{type=\"Reboot\"} 1"),
        "{controller}"
    );
    nothing_left_behind(&client).await;
}

/// A short Freeze the policy approves at once drains nothing, yet the
/// pods that opted in on the two VMs it names get the notice before IMDS
/// receives the approval, the approval waits for the acknowledging pods,
/// and the notices are removed from the pods (still there) once the event
/// is over; nobody on the third node hears of it. A pod that came with a
/// notice and an acknowledgement of an event that does not exist (its
/// object deleted by hand) loses both to the controller's sweep.
#[tokio::test(flavor = "multi_thread")]
async fn a_freeze_approved_at_once_is_noticed_before_its_approval() {
    let _turn = TURN.lock().await;
    let (report, client) = play("workloads-freeze.yaml", |o| {
        with_example_workload(o, &[]);
        for node in ["node-000000", "node-000001", "node-000002"] {
            o.extra_objects
                .push(notice_only(&format!("watcher-{}", &node[5..]), node));
        }
        let mut stale = notice_only("stale", "node-000002");
        stale["spec"]["template"]["metadata"]["annotations"] = serde_json::json!({
            format!("notice.forewarn.dev/{GONE}"): format!("eventId={} type=Reboot", GONE.to_ascii_uppercase()),
            format!("ack.forewarn.dev/{GONE}"): GONE.to_ascii_uppercase(),
        });
        o.extra_objects.push(stale);
    })
    .await;
    let approved = approved_at(&report, FREEZE);
    let finished = mock_at(&report, FREEZE, "Finished");
    let freeze = FREEZE.to_ascii_lowercase();
    let notices: Vec<_> = report
        .notices
        .iter()
        .filter(|n| n.event == freeze)
        .collect();
    let mut nodes: Vec<&str> = notices.iter().map(|n| n.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    assert_eq!(
        nodes,
        ["node-000000", "node-000001"],
        "{:?}",
        report.notices
    );
    // Two watchers and two db pods, each noticed before the approval.
    assert_eq!(notices.len(), 4, "{:?}", report.notices);
    for n in notices {
        assert!(
            n.first_seen < approved,
            "{} noticed at {} after the approval at {approved}",
            n.pod,
            n.first_seen
        );
        assert!(
            n.first_value.contains("action=Approve drain=false"),
            "{}",
            n.first_value
        );
        let removed = n
            .removed_at
            .unwrap_or_else(|| panic!("{}'s notice was never removed", n.pod));
        assert!(
            removed > finished,
            "{} lost its notice at {removed}, before the end at {finished}",
            n.pod
        );
    }
    // The acknowledging pods answered before the approval (it waited):
    // each acknowledgement was sent before the approval POST. (Not its
    // answer: on a loaded machine the answer was once read 66 ms after
    // the controller had acted on the stored acknowledgement.)
    assert_eq!(report.acks.len(), 2, "{:?}", report.acks);
    for a in &report.acks {
        assert!(
            a.sent < approved,
            "{} acknowledged at {} after the approval at {approved}",
            a.pod,
            a.sent
        );
    }
    assert!(
        report.deletions.is_empty(),
        "pods were evicted: {:?}",
        report.deletions
    );
    let ev = sev(&client, FREEZE).await;
    let acks = ev
        .status
        .as_ref()
        .and_then(|s| s.acknowledgements.clone())
        .expect("record");
    assert_eq!(acks.acknowledged.as_deref(), Some("2/2"), "{acks:?}");
    assert_eq!(acks.notified, "4/4", "{acks:?}");
    // The stale pod's notice and acknowledgement went with the sweep, as
    // every other notice went with its event.
    nothing_left_behind(&client).await;
}

/// A pod that asked to be waited for and never answers, with a notice so
/// short that the wait (300 s by default) ends at the drain deadline
/// (`NotBefore` minus the policy's `drainMarginSeconds`, 30 s here: what an
/// approval at the deadline has to reach IMDS before `NotBefore`) instead:
/// there the policy's `onDeadline` decides. `Approve`: the approval reaches IMDS at the
/// deadline, not before, and `DrainIncomplete` (`ApprovedIncomplete`)
/// names the pod. `Hold`: no approval reaches IMDS at all, and the
/// condition says the deadline passed with the pod unacknowledged.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_pod_at_the_drain_deadline_is_left_to_on_deadline() {
    let _turn = TURN.lock().await;
    for (file, on_deadline) in [
        ("workloads-deadline-approve.yaml", "Approve"),
        ("workloads-deadline-hold.yaml", "Hold"),
    ] {
        let (report, client) = play(file, |o| {
            with_example_workload(o, &DB);
            o.policy = Some(format!(
                "onDeadline: {on_deadline}\ndrainMarginSeconds: 30\n"
            ));
        })
        .await;
        assert!(report.acks.is_empty(), "{:?}", report.acks);
        let notice = report
            .notices
            .iter()
            .find(|n| n.pod.starts_with("shop/db-"))
            .expect("no notice on the StatefulSet's pod on node-000001");
        let db = notice.pod.clone();
        let not_before = notice_not_before(&notice.first_value);
        let ev = sev(&client, REBOOT).await;
        let status = ev.status.clone().expect("status");
        let acks = status.acknowledgements.clone().expect("acknowledgements");
        // The wait ended at the drain deadline, not at its own timeout.
        let first_seen = status.first_seen.expect("firstSeen");
        let since = acks.since.expect("since");
        let deadline = acks.deadline.expect("deadline");
        assert_eq!(
            deadline,
            not_before - chrono::TimeDelta::seconds(30),
            "the wait was not cut at the drain deadline: {since} .. {deadline}, NotBefore {not_before}"
        );
        assert!(deadline > first_seen, "{first_seen} .. {deadline}");
        let (_, reason, message) =
            condition(&ev, "DrainIncomplete").expect("no DrainIncomplete condition");
        assert!(
            message.contains(&format!("{db} has not acknowledged")),
            "{on_deadline}: {message}"
        );
        let approvals: Vec<_> = report
            .approvals
            .iter()
            .filter(|a| a.event_id.eq_ignore_ascii_case(REBOOT))
            .collect();
        if on_deadline == "Approve" {
            assert_eq!(reason, "ApprovedIncomplete", "{message}");
            let approved = approved_at(&report, REBOOT);
            assert!(
                approved >= deadline,
                "approved at {approved}, before the drain deadline {deadline}"
            );
        } else {
            assert_eq!(reason, "DeadlinePassed", "{message}");
            assert!(approvals.is_empty(), "Hold approved: {approvals:?}");
        }
        nothing_left_behind(&client).await;
    }
}

/// A late start keeps the node in service, not the pods
/// in the dark: with a Reboot rule's `drainLeadTimeSeconds: 30` and 80 s of
/// notice, the notice is stored on the pods that opted in before the lead
/// time begins (it does not wait for the drain), while the cordon waits
/// until `NotBefore` minus 30 s; the pod still acknowledges before the
/// approval.
#[tokio::test(flavor = "multi_thread")]
async fn a_late_start_sends_the_notice_at_once_and_cordons_later() {
    let _turn = TURN.lock().await;
    let (report, client) = play("workloads-reboot-lead.yaml", |o| {
        with_example_workload(o, &[]);
        o.policy = Some(
            "rules:\n- {eventType: Reboot, action: DrainAndApprove, drainLeadTimeSeconds: 30}\n"
                .into(),
        );
    })
    .await;
    let ev = sev(&client, REBOOT).await;
    let status = ev.status.clone().expect("status");
    let first_seen = status.first_seen.expect("firstSeen");
    let db = report
        .notices
        .iter()
        .find(|n| n.pod.starts_with("shop/db-") && n.node == "node-000001")
        .expect("no notice on the StatefulSet's pod on node-000001");
    let not_before = notice_not_before(&db.first_value);
    let cordoned = report
        .first_cordon("node-000001")
        .expect("node-000001 was never cordoned");
    let lead_begins = not_before - chrono::TimeDelta::seconds(30);
    println!(
        "first seen at {first_seen}, notice at {}, lead time from {lead_begins}, cordon at {cordoned}",
        db.first_seen
    );
    // The order: the event seen, the notice on the pod before the lead
    // time began (50 s after the event appeared: the notice did not wait
    // for the drain), the cordon only once it began (to the notice's
    // one-second resolution of NotBefore).
    assert!(
        first_seen <= db.first_seen,
        "notice at {}, before the event was first seen at {first_seen}",
        db.first_seen
    );
    assert!(
        db.first_seen < lead_begins,
        "notice stored at {}, not before the lead time began at {lead_begins}",
        db.first_seen
    );
    assert!(
        cordoned >= lead_begins - chrono::TimeDelta::seconds(1),
        "cordoned at {cordoned}, before NotBefore {not_before} minus the lead time"
    );
    let ack = report
        .acks
        .iter()
        .find(|a| a.pod == db.pod)
        .expect("the pod did not acknowledge");
    assert!(ack.sent < approved_at(&report, REBOOT));
    nothing_left_behind(&client).await;
}
