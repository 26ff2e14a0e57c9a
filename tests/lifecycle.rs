//! End-to-end tests of the event lifecycle on a real local control
//! plane: events whose only observers vanish still end; a predicted failure
//! days ahead is not drained early; `--dry-run` touches nothing; the policy
//! file is re-read mid-run; forewarn's taint takes the policy's effect and
//! is removed whatever its effect; the API server itself refuses nonsense in a
//! `ScheduledEvent`. Every check reads what the API server holds (nodes from
//! a watch, pod deletions, the object, its Events) or the IMDS mock's own
//! log, never forewarn's word. They fail, never skip, when the cluster
//! cannot start.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use forewarn::api::{EventStatus, Phase, ScheduledEvent};
use forewarn::controller::act::cordon::TAINT_KEY;
use forewarn::imds::mock::LogEntry;
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::inspect::{condition, event_notes, scheduled_event as sev};
use forewarn_harness::options::{ApiServerOutage, NodeDeletion, RunOptions};
use forewarn_harness::report::{Report, summary};
use forewarn_harness::run::run_scenario;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

/// The cluster's name: `forewarn-life`, or `FOREWARN_LIFE_CLUSTER` (to run
/// this file beside `make test`, which uses `forewarn-life`).
fn cluster_name() -> String {
    std::env::var("FOREWARN_LIFE_CLUSTER").unwrap_or_else(|_| "forewarn-life".into())
}

/// One cluster for the whole test binary; tests take turns on it.
fn cluster() -> Cluster {
    forewarn_harness::cluster::shared(&cluster_name(), 3)
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
    // A hang bound: these scenarios are over in 30 to 70 s; a healthy run
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
    (report, cluster)
}

async fn holds_anywhere(client: &Client) -> Vec<String> {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list nodes")
        .items
        .iter()
        .filter(|n| !forewarn::api::holds(n).is_empty())
        .map(ResourceExt::name_any)
        .collect()
}

/// The scale set's last VM is deleted by its own
/// `Terminate`; its agent (the only one IMDS told) dies with it. The event
/// must still end `Completed` (condition `EndedWithoutObserver`, an Event
/// saying why), be deleted after its retention, and leave no hold behind.
#[tokio::test(flavor = "multi_thread")]
async fn last_vms_terminate_with_its_agent_gone_ends_completed_and_leaves_nothing_behind() {
    let _turn = TURN.lock().await;
    const ID: &str = "7A1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C01";
    let (report, cluster) = play_with("lifecycle-terminate-last-vm.yaml", |o| {
        o.delete_node = Some((NodeDeletion::WhenStarted, "node-000002".into()));
        o.policy = Some("orphanedAfterSeconds: 5\nretention: 5s\n".into());
        // Retention 5 s: the object goes, not only its nodes' holds.
        o.until_deleted = true;
    })
    .await;
    assert_eq!(report.deleted_nodes.len(), 1, "the node was deleted");
    let client = cluster.client().await.expect("client");
    assert!(
        sev(&client, ID).await.is_none(),
        "the ended Terminate is still there"
    );
    assert!(
        holds_anywhere(&client).await.is_empty(),
        "a node still holds a cordon"
    );
    let notes = event_notes(&client, ID, "EndedWithoutObserver").await;
    assert!(
        notes.iter().any(|n| n.contains("maps to a node any more")),
        "no EndedWithoutObserver Event saying why: {notes:?}"
    );
    assert!(
        report
            .timeline
            .iter()
            .any(|l| l.contains("phase Started -> Completed")),
        "the object did not go Started -> Completed:\n{}",
        report.timeline.join("\n")
    );
}

/// A node whose own part of a multi-VM event ends (its
/// VM's IMDS no longer lists it) while the event goes on for another node
/// keeps its cordon for `releaseDelaySeconds` after its part ended, not a
/// moment less (it was released at once as a stray), and keeps its record.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_whose_own_part_ends_is_released_after_the_release_delay() {
    let _turn = TURN.lock().await;
    const ID: &str = "9E1F2A3B-4C5D-4E6F-8A7B-9C0D1E2F3A05";
    let cluster = shared_cluster().await;
    let client = cluster.client().await.expect("client");
    let monitor = Monitor::start(&client, "shop").await;
    // A hang bound: the scenario is over about 65 s after its start.
    let (report, _) = play_with("lifecycle-part-ends.yaml", |o| {
        o.timeout = Duration::from_secs(240);
    })
    .await;
    // vmss_1's document leaves the event out from 25 s on (the mock's
    // clock starts just before the run's); its agent polls once a second.
    let part_ended = report.started + chrono::TimeDelta::seconds(25);
    let left: Vec<LogEntry> = ["Cancelled", "Finished"]
        .iter()
        .flat_map(|what| imds_entries(&report, ID, what))
        .collect();
    let end = left.first().map(|e| e.time).expect("the event left IMDS");
    let ev = sev(&client, ID).await.expect("the object");
    let st = ev.status.unwrap_or_default();
    let one = st
        .nodes
        .iter()
        .flatten()
        .find(|n| n.name == "node-000001")
        .expect("node-000001's record");
    println!("node-000001's record: {one:?}");
    // When the controller saw the part end: not before it did, and before
    // the event left IMDS (the fixture leaves 35 s between the two).
    let ended_at = one.ended_at.expect("endedAt");
    assert!(
        ended_at >= part_ended && ended_at < end,
        "endedAt {ended_at} is not between the part's end at {part_ended} and the event's at {end}"
    );
    assert!(
        one.cordoned_by_us,
        "the record lost that forewarn cordoned it"
    );
    // Held when its part ended, and for the whole release delay after the
    // end the controller recorded (the release delay counts from there):
    // the first release comes no earlier. Order, from the times alone: a
    // loaded machine only makes the release later.
    let delay = chrono::TimeDelta::seconds(
        i64::try_from(forewarn::policy::Policy::default().release_delay_seconds).expect("small"),
    );
    assert_eq!(
        monitor.node_at("node-000001", ended_at),
        Some((true, true)),
        "node-000001 was not held when its part ended"
    );
    let released = monitor
        .node_between("node-000001", ended_at, end)
        .into_iter()
        .find(|(_, unschedulable, tainted)| !*unschedulable && !*tainted)
        .map(|(t, ..)| t);
    println!(
        "node-000001: part ended (recorded) at {ended_at}, released at {released:?}, event gone at {end}"
    );
    let released = released.expect("node-000001 was still held when the event left IMDS");
    let held = monitor.node_between("node-000001", ended_at, ended_at + delay);
    assert!(
        released >= ended_at + delay
            && held
                .iter()
                .all(|(_, unschedulable, tainted)| *unschedulable && *tainted),
        "node-000001 was released at {released}, within the release delay after its part ended at {ended_at}: {held:?}"
    );
    // node-000002's part went on: held at that release and until the end.
    assert_eq!(
        monitor.node_at("node-000002", released),
        Some((true, true)),
        "node-000002 was not held when node-000001 was released"
    );
    let other = monitor.node_between("node-000002", released, end);
    assert!(
        other
            .iter()
            .all(|(_, unschedulable, tainted)| *unschedulable && *tainted),
        "node-000002 was released while its part went on: {other:?}"
    );
}

/// A `ScheduledEvent` deleted by hand while IMDS still
/// lists its event is created again from the agents' reports, and its
/// node stays cordoned throughout, until the event leaves IMDS. (How fast
/// it comes back is a speed figure, for `make bench`.)
#[tokio::test(flavor = "multi_thread")]
async fn a_scheduled_event_deleted_by_hand_is_created_again_and_its_node_stays_held() {
    let _turn = TURN.lock().await;
    const ID: &str = "9E1F2A3B-4C5D-4E6F-8A7B-9C0D1E2F3A06";
    let cluster = shared_cluster().await;
    let client = cluster.client().await.expect("client");
    let monitor = Monitor::start(&client, "shop").await;
    let api: Api<ScheduledEvent> = Api::all(client.clone());
    let name = ID.to_ascii_lowercase();
    // Once the event is drained and approved, delete its object, and wait
    // for its return. Both waits are hang bounds: each step takes a second
    // or two, and the event stays listed for a minute.
    let deleter = {
        let (api, name) = (api.clone(), name.clone());
        tokio::spawn(async move {
            let start = std::time::Instant::now();
            let old = loop {
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "no approved object"
                );
                if let Ok(Some(ev)) = api.get_opt(&name).await
                    && ev.status.as_ref().and_then(|s| s.phase) == Some(Phase::Approved)
                {
                    break ev;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            api.delete(&name, &Default::default())
                .await
                .expect("delete the object");
            let deleted = Utc::now();
            let back = loop {
                if let Ok(Some(ev)) = api.get_opt(&name).await
                    && ev.metadata.uid != old.metadata.uid
                {
                    break Utc::now();
                }
                assert!(
                    Utc::now() - deleted < chrono::TimeDelta::seconds(120),
                    "not created again within 120 s"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            (deleted, back)
        })
    };
    // A hang bound: the scenario is over about 65 s after its start.
    let (report, _) = play_with("lifecycle-deleted-object.yaml", |o| {
        o.timeout = Duration::from_secs(240);
    })
    .await;
    let (deleted, back) = deleter.await.expect("the deleter");
    println!(
        "deleted at +{:.1} s, created again {:.2} s later",
        secs(deleted - report.started),
        secs(back - deleted)
    );
    // The event left IMDS after the object came back (the mock's log): the
    // object was created again from the reports of an event still listed.
    let left = imds_entries(&report, ID, "Cancelled");
    let left = left.first().expect("the event left IMDS").time;
    assert!(
        back < left,
        "created again at {back}, after the event left IMDS at {left}"
    );
    // Held from the deletion until the event left IMDS: through the gap
    // and after the object came back.
    assert_eq!(
        monitor.node_at("node-000001", deleted),
        Some((true, true)),
        "node-000001 was not held when its event's object was deleted"
    );
    let held = monitor.node_between("node-000001", deleted, left);
    assert!(
        held.iter()
            .all(|(_, unschedulable, tainted)| *unschedulable && *tainted),
        "node-000001 was released before its event left IMDS (object deleted at {deleted}, back at {back}): {held:?}"
    );
}

/// An event that reached its `NotBefore`, ran and left
/// IMDS while IMDS throttled every agent (429s), with no approval, is
/// recorded as ended (`Completed`, `CompletedUnobserved`), not `Cancelled`;
/// `ApprovalPending` never reads `Accepted` for it.
#[tokio::test(flavor = "multi_thread")]
async fn event_that_ran_while_imds_throttled_the_agents_is_completed_not_cancelled() {
    let _turn = TURN.lock().await;
    const ID: &str = "9E1F2A3B-4C5D-4E6F-8A7B-9C0D1E2F3A07";
    let (report, cluster) = play_with("lifecycle-imds-throttled.yaml", |o| {
        o.timeout = Duration::from_secs(150);
        o.policy = Some("rules:\n- {eventType: reboot, action: Drain}\n".into());
    })
    .await;
    // The timing, from the mock's log: started and gone inside the fault
    // (the fixture's times: the 429s from 17 s to 42 s, NotBefore at 32 s,
    // gone at 35 s; all on the mock's clock, so load cannot move them).
    let fault = (
        report.started + chrono::TimeDelta::seconds(17),
        report.started + chrono::TimeDelta::seconds(42),
    );
    let started = imds_entries(&report, ID, "Started");
    let finished = imds_entries(&report, ID, "Finished");
    let (started, finished) = (
        started.first().expect("it started").time,
        finished.first().expect("it finished").time,
    );
    assert!(
        started > fault.0 && finished < fault.1,
        "the timing this test needs did not hold: started at +{:.1} s, gone at +{:.1} s",
        secs(started - report.started),
        secs(finished - report.started)
    );
    assert!(
        !report
            .timeline
            .iter()
            .any(|l| l.contains("Azure status Scheduled -> Started")),
        "an agent saw the event Started:\n{}",
        report.timeline.join("\n")
    );
    assert!(report.approvals.is_empty(), "the policy approves nothing");
    let client = cluster.client().await.expect("client");
    let ev = sev(&client, ID).await.expect("the object");
    let st = ev.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Some(Phase::Completed), "{st:?}");
    let (status, reason, message) =
        condition(&ev, "CompletedUnobserved").expect("no CompletedUnobserved condition");
    println!("CompletedUnobserved: {status} {reason}: {message}");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "NotBeforePassed")
    );
    if let Some((_, reason, _)) = condition(&ev, "ApprovalPending") {
        assert_ne!(reason, "Accepted", "an approval never sent reads Accepted");
    }
    assert!(
        holds_anywhere(&client).await.is_empty(),
        "a node still holds a cordon"
    );
}

/// An upgrade from the version whose agents wrote
/// `ScheduledEvent`s, with an event in progress and a node held. The
/// earlier version's object, its report (node, VM, status: no `EventId`)
/// and its hold are in place when the new processes start: the new
/// controller adopts the object (not created anew; its spec rewritten from
/// the new reports), the node stays cordoned and tainted until the event is
/// over, and nothing is left held.
#[tokio::test(flavor = "multi_thread")]
async fn upgrade_with_an_event_in_progress_adopts_it_and_keeps_the_node_held() {
    let _turn = TURN.lock().await;
    const ID: &str = "9E1F2A3B-4C5D-4E6F-8A7B-9C0D1E2F3A08";
    const NODE: &str = "node-000001";
    const VM: &str = "aks-nodepool1-27351046-vmss_1";
    let name = ID.to_ascii_lowercase();
    let cluster = shared_cluster().await;
    let client = cluster.client().await.expect("client");
    let monitor = Monitor::start(&client, "shop").await;
    let earlier_event = serde_json::json!({
        "apiVersion": "forewarn.dev/v1alpha1",
        "kind": "ScheduledEvent",
        "metadata": {"name": name},
        "spec": {
            "eventId": ID,
            "eventType": "Redeploy",
            "eventStatus": "Scheduled",
            "eventSource": "Platform",
            "resourceType": "VirtualMachine",
            "resources": [VM],
            "notBefore": "2020-01-01T00:00:00Z",
            "durationSeconds": -1,
            "description": "as an earlier forewarn agent wrote it",
            "appearance": 1,
        },
    });
    let earlier_report = serde_json::json!({
        "apiVersion": "forewarn.dev/v1alpha1",
        "kind": "ScheduledEventReport",
        "metadata": {"name": format!("{name}.{NODE}")},
        "spec": {
            "scheduledEvent": name,
            "report": {"node": NODE, "vm": VM, "named": true, "eventStatus": "Scheduled", "appearance": 1},
        },
    });
    let (report, _) = play_with("lifecycle-upgrade.yaml", |o| {
        o.timeout = Duration::from_secs(120);
        o.extra_objects = vec![earlier_event, earlier_report];
        o.prior_holds = vec![(NODE.into(), name.clone())];
    })
    .await;
    let finished = imds_entries(&report, ID, "Finished");
    let finished = finished.first().expect("the event ran and ended").time;

    // Held from the new processes' start to the event's end.
    let during = monitor.node_between(NODE, report.started, finished);
    println!("{NODE} from the start to the end (time, unschedulable, tainted): {during:?}");
    assert_eq!(monitor.node_at(NODE, report.started), Some((true, true)));
    assert!(
        during
            .iter()
            .all(|(_, unschedulable, tainted)| *unschedulable && *tainted),
        "{NODE} was released during the upgrade: {during:?}"
    );
    // The earlier object, adopted: created before the new processes, its
    // spec now what the new agents report.
    let ev = sev(&client, ID).await.expect("the object");
    let created = ev
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| jiff_to_chrono(&t.0))
        .expect("creationTimestamp");
    assert!(
        created <= report.started,
        "the object was created anew at {created}, after the start {}",
        report.started
    );
    assert_eq!(
        ev.spec.description, "Virtual machine is being redeployed to a different host.",
        "the spec was not rewritten from the new reports: {:?}",
        ev.spec
    );
    let st = ev.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Some(Phase::Completed), "{st:?}");
    let approval = st.approval.clone().expect("approval");
    assert_eq!(approval.sent_by.as_deref(), Some(NODE), "{approval:?}");
    // The earlier report, rewritten whole by the new agent.
    let reports: Api<forewarn::api::ScheduledEventReport> = Api::all(client.clone());
    let mine = reports
        .get(&format!("{name}.{NODE}"))
        .await
        .expect("the node's report");
    assert_eq!(mine.spec.report.event_id, ID, "{:?}", mine.spec.report);
    assert!(
        holds_anywhere(&client).await.is_empty(),
        "a node still holds a cordon"
    );
}

/// A GPU VM's own event (delivered to it alone) whose
/// VM and node are deleted while it is still `Scheduled`: it ends once
/// `NotBefore` passed, with the reason recorded.
#[tokio::test(flavor = "multi_thread")]
async fn gpu_only_event_whose_vm_is_deleted_ends_with_its_reason() {
    let _turn = TURN.lock().await;
    const ID: &str = "7A1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C02";
    let (report, cluster) = play_with("lifecycle-gpu-vm-deleted.yaml", |o| {
        // Deleted while the event is Scheduled (NotBefore at 63 s), once
        // the node is cordoned and drained (a few seconds after the event
        // appears at 3 s; the fixture leaves 27 s for it).
        o.delete_node = Some((
            NodeDeletion::After(Duration::from_secs(30)),
            "node-000001".into(),
        ));
        o.policy = Some("defaultAction: Drain\norphanedAfterSeconds: 4\n".into());
    })
    .await;
    assert_eq!(report.deleted_nodes.len(), 1);
    let client = cluster.client().await.expect("client");
    let ev = sev(&client, ID)
        .await
        .expect("the object is kept (retention 24h)");
    let st = ev.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Some(Phase::Completed));
    // Its spec still says what the last agent saw: nobody saw it end.
    assert_eq!(ev.spec.event_status, EventStatus::Scheduled);
    let (status, reason, message) = condition(&ev, "EndedWithoutObserver").expect("the reason");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "NoNodeLeft"));
    assert!(message.contains("aks-gpupool-55667788-vmss_1"), "{message}");
    // The deleted node keeps its record, out of the drained count.
    let gone = st
        .nodes
        .iter()
        .flatten()
        .find(|n| n.name == "node-000001")
        .expect("the deleted node's record");
    assert!(gone.deleted_at.is_some(), "{gone:?}");
    assert_eq!(st.nodes_drained.as_deref(), Some("0/0"), "{st:?}");
    // It ended after NotBefore (as its spec still holds it) plus the
    // orphan time; no tolerance: both times are the controller's.
    let finished = st.finished_at.expect("finishedAt");
    let not_before = ev.spec.not_before.expect("the spec's NotBefore");
    assert!(
        finished >= not_before + chrono::Duration::seconds(4),
        "ended at {finished}, before NotBefore {not_before} plus the orphan time"
    );
    assert!(holds_anywhere(&client).await.is_empty());
}

/// A predicted-failure `Redeploy` with `NotBefore` a
/// week ahead: nothing is cordoned (the default drain lead time is an
/// hour); the status and an Event say when the drain would start.
#[tokio::test(flavor = "multi_thread")]
async fn predicted_failure_days_ahead_is_not_drained_early() {
    let _turn = TURN.lock().await;
    const ID: &str = "7A1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C03";
    let (report, cluster) = play_with("lifecycle-predicted-failure.yaml", |_| {}).await;
    assert!(
        !report.node_changes.iter().any(|(_, _, cordoned)| *cordoned),
        "a node was cordoned: {:?}",
        report.node_changes
    );
    assert!(
        report.deletions.is_empty(),
        "pods were deleted: {:?}",
        report.deletions
    );
    let client = cluster.client().await.expect("client");
    let notes = event_notes(&client, ID, "DrainScheduled").await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("the cordon and drain start at")),
        "no DrainScheduled Event: {notes:?}"
    );
    let ev = sev(&client, ID).await.expect("object");
    assert_eq!(
        ev.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Cancelled)
    );
    let (status, reason, _) = condition(&ev, "DrainScheduled").expect("DrainScheduled");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "EventEnded"));
    assert!(
        report.timeline.iter().any(|l| l.contains("phase Pending")),
        "it was not Pending while it waited"
    );
}

/// `forewarn controller --dry-run` cordons nothing,
/// evicts nothing and approves nothing, and says what it would have done.
#[tokio::test(flavor = "multi_thread")]
async fn dry_run_touches_nothing_and_records_what_it_would_do() {
    let _turn = TURN.lock().await;
    const REBOOT: &str = "7A1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C04";
    const FREEZE: &str = "7A1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C05";
    let (report, cluster) = play_with("lifecycle-dry-run.yaml", |o| {
        o.extra_env = vec![("FOREWARN_DRY_RUN".into(), "true".into())];
    })
    .await;
    assert!(
        !report.node_changes.iter().any(|(_, _, cordoned)| *cordoned),
        "a node was cordoned: {:?}",
        report.node_changes
    );
    assert!(
        report.deletions.is_empty(),
        "pods were deleted: {:?}",
        report.deletions
    );
    assert!(
        report.approvals.is_empty(),
        "IMDS got approvals: {:?}",
        report.approvals
    );
    let client = cluster.client().await.expect("client");

    let reboot = sev(&client, REBOOT).await.expect("Reboot object");
    let st = reboot.status.clone().unwrap_or_default();
    assert!(
        st.approval.is_none(),
        "a dry run wrote an approval agents would send"
    );
    let dry = st.dry_run.clone().expect("status.dryRun");
    assert_eq!(dry.would_cordon, ["node-000001"]);
    assert!(
        !dry.would_evict.is_empty(),
        "no would-be evictions recorded"
    );
    assert!(dry.would_evict.iter().all(|p| p.starts_with("shop/web-")));
    assert!(st.nodes.iter().flatten().all(|n| !n.cordoned_by_us));
    let (status, _, message) = condition(&reboot, "DryRun").expect("DryRun condition");
    assert_eq!(status, "True");
    assert!(message.contains("would cordon node-000001"), "{message}");
    assert!(
        event_notes(&client, REBOOT, "DryRunCordon")
            .await
            .iter()
            .any(|n| n.contains("would cordon and drain node-000001")),
        "no DryRunCordon Event"
    );
    assert!(!event_notes(&client, REBOOT, "DryRunEvict").await.is_empty());

    let freeze = sev(&client, FREEZE).await.expect("Freeze object");
    let st = freeze.status.clone().unwrap_or_default();
    assert!(st.approval.is_none());
    let dry = st.dry_run.clone().expect("status.dryRun");
    assert!(
        dry.would_approve_at.is_some(),
        "the would-be approval is not recorded: {dry:?}"
    );
    assert!(
        event_notes(&client, FREEZE, "DryRunApproval")
            .await
            .iter()
            .any(|n| n.contains("nothing is sent to IMDS")),
        "no DryRunApproval Event"
    );
}

/// The policy file is re-read mid-run. An invalid new
/// file is refused (logged, counted) and the policy in force stays; a valid
/// one takes over and the waiting event is drained and approved.
#[tokio::test(flavor = "multi_thread")]
async fn policy_file_changes_are_picked_up_and_an_invalid_one_is_refused() {
    let _turn = TURN.lock().await;
    let (report, _cluster) = play_with("lifecycle-policy-reload.yaml", |o| {
        // A hang bound: the scenario is over about a minute after its start.
        o.timeout = Duration::from_secs(240);
        o.policy = Some("defaultAction: Ignore\n".into());
        // Far apart: the event (at 3 s) must be Ignored before the invalid
        // file comes, and the controller (which reads the file every 2 s)
        // must have read the invalid file before the valid one replaces it:
        // 17 s and 25 s for steps of a second or two.
        o.timed_policy = vec![
            (Duration::from_secs(20), "defaultAction: Reboot\n".into()),
            (
                Duration::from_secs(45),
                "defaultAction: DrainAndApprove\n".into(),
            ),
        ];
    })
    .await;
    let timeline = report.timeline.join("\n");
    assert!(
        timeline.contains("phase Ignored"),
        "not Ignored first:\n{timeline}"
    );
    // Nothing cordoned under the old policy, also after the invalid file:
    // the harness wrote the valid one no earlier than 45 s after the start
    // (load only makes it later).
    let first_cordon = report
        .node_changes
        .iter()
        .find(|(_, _, c)| *c)
        .map(|(t, _, _)| *t)
        .expect("the node was cordoned once the valid policy came");
    assert!(
        first_cordon >= report.started + chrono::Duration::seconds(45),
        "cordoned at {first_cordon}, before the valid policy was written (start {})",
        report.started
    );
    let metrics = &report
        .metrics
        .iter()
        .find(|(name, _)| name == "controller")
        .expect("controller metrics")
        .1;
    assert!(
        metrics.contains("forewarn_controller_policy_reloads_total{result=\"refused\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("forewarn_controller_policy_reloads_total{result=\"loaded\"} 1"),
        "{metrics}"
    );
    let log =
        std::fs::read_to_string(report.log_dir.join("controller.log")).expect("controller log");
    assert!(
        log.contains("Refused the changed policy file")
            && log.contains("failed to parse policy file"),
        "the refusal is not logged with its cause"
    );
}

/// The schema lists the values, so the real API server
/// refuses a bogus `eventStatus` on create and on patch, and a bogus phase.
#[tokio::test(flavor = "multi_thread")]
async fn the_api_server_refuses_a_bogus_event_status_or_phase() {
    let _turn = TURN.lock().await;
    let cluster = shared_cluster().await;
    let dir = repo_root().join("target/forewarn-runs/lifecycle-bogus");
    std::fs::create_dir_all(&dir).expect("dir");
    let object = |status: &str| {
        format!(
            "apiVersion: forewarn.dev/v1alpha1\nkind: ScheduledEvent\nmetadata:\n  name: bogus-check\nspec:\n  eventId: BOGUS-CHECK\n  eventType: Reboot\n  eventStatus: {status}\n  resources: [nowhere_0]\n"
        )
    };
    let bogus = dir.join("bogus.yaml");
    std::fs::write(&bogus, object("Bogus")).expect("write");
    let _ = cluster.kubectl(&[
        "delete",
        "scheduledevent",
        "bogus-check",
        "--ignore-not-found",
    ]);
    let err = cluster
        .kubectl(&["create", "-f", &bogus.to_string_lossy()])
        .expect_err("the API server accepted eventStatus: Bogus");
    assert!(err.to_string().contains("Unsupported value"), "{err:#}");

    let good = dir.join("good.yaml");
    std::fs::write(&good, object("Scheduled")).expect("write");
    cluster
        .kubectl(&["create", "-f", &good.to_string_lossy()])
        .expect("a valid object is accepted");
    let err = cluster
        .kubectl(&[
            "patch",
            "scheduledevent",
            "bogus-check",
            "--type=merge",
            "-p",
            r#"{"spec":{"eventStatus":"Bogus"}}"#,
        ])
        .expect_err("the API server accepted a patch to eventStatus: Bogus");
    assert!(err.to_string().contains("Unsupported value"), "{err:#}");
    let err = cluster
        .kubectl(&[
            "patch",
            "scheduledevent",
            "bogus-check",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Approvedish","action":"Reboot"}}"#,
        ])
        .expect_err("the API server accepted status.phase: Approvedish");
    assert!(err.to_string().contains("Unsupported value"), "{err:#}");
    let client = cluster.client().await.expect("client");
    let stored = sev(&client, "bogus-check").await.expect("object");
    assert_eq!(stored.spec.event_status, EventStatus::Scheduled);
    cluster
        .kubectl(&["delete", "scheduledevent", "bogus-check"])
        .expect("delete");
}

/// The CRDs' limits and CEL rules install and hold: the API server refuses
/// a report with more `Resources` than the schema takes, a 1 MiB
/// description, a 1,000-character event type or VM name, and one filed under
/// another name than its `EventId`'s object name; the same report within
/// bounds and rightly named is accepted (a GUID's and another id's).
#[tokio::test(flavor = "multi_thread")]
async fn the_api_server_refuses_an_oversize_or_misnamed_report() {
    use forewarn::api::{
        MAX_RESOURCES, Report, ScheduledEventReport, ScheduledEventReportSpec, report_name,
    };
    use forewarn::imds::model::object_name;
    use kube::api::{DeleteParams, PostParams};

    let _turn = TURN.lock().await;
    let cluster = shared_cluster().await;
    let client = cluster.client().await.expect("client");
    let api: Api<ScheduledEventReport> = Api::all(client);
    const ID: &str = "7C1D2E3F-4A5B-4C6D-8E7F-9A0B1C2D3E4F";
    const NODE: &str = "intake-check";
    // The report of NODE about `id`, filed under `event`, changed by `change`.
    let report = |id: &str, event: &str, change: fn(&mut Report)| {
        let mut r = Report {
            node: NODE.into(),
            vm: "intake-check_0".into(),
            named: true,
            event_status: EventStatus::Scheduled,
            appearance: 1,
            event_id: id.into(),
            event_type: "Reboot".into(),
            event_source: "Platform".into(),
            resource_type: "VirtualMachine".into(),
            resources: vec!["intake-check_0".into()],
            not_before: Some(Utc::now() + chrono::Duration::hours(1)),
            duration_seconds: -1,
            description: "Virtual machine is going to be restarted.".into(),
            document_incarnation: 1,
            approvals: Vec::new(),
        };
        change(&mut r);
        ScheduledEventReport::new(
            &report_name(event, NODE).expect("name"),
            ScheduledEventReportSpec {
                scheduled_event: event.into(),
                report: r,
            },
        )
    };
    let name = ID.to_ascii_lowercase();
    let odd = object_name("FLEET-1");
    for event in [&name, &odd] {
        let _ = api
            .delete(
                &report_name(event, NODE).expect("name"),
                &DeleteParams::default(),
            )
            .await;
    }
    // (what, EventId, scheduledEvent, change to the report)
    type Case<'a> = (&'a str, &'a str, &'a str, fn(&mut Report));
    let refused: [Case<'_>; 7] = [
        ("one Resource too many", ID, &name, |r| {
            r.resources = (0..=MAX_RESOURCES).map(|i| format!("vmss_{i}")).collect()
        }),
        ("a 1 MiB description", ID, &name, |r| {
            r.description = "x".repeat(1 << 20)
        }),
        ("a 1,000-character event type", ID, &name, |r| {
            r.event_type = "R".repeat(1000)
        }),
        ("a 1,000-character VM name in Resources", ID, &name, |r| {
            r.resources = vec!["v".repeat(1000)]
        }),
        ("a 1,000-character VM", ID, &name, |r| {
            r.vm = "v".repeat(1000)
        }),
        // Under another GUID's name.
        (
            "another GUID's name",
            ID,
            "0b5e3b25-7a67-4c3e-a7c4-4a4bd34c4a4e",
            |_| {},
        ),
        // Another id under its lower-case spelling, not its sev- name.
        (
            "a non-GUID id under its own spelling",
            "FLEET-1",
            "fleet-1",
            |_| {},
        ),
    ];
    for (what, id, event, change) in refused {
        let err = api
            .create(&PostParams::default(), &report(id, event, change))
            .await
            .map(|_| ())
            .expect_err(what);
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 422),
            "{what}: {err}"
        );
    }
    // Within bounds and rightly named: accepted, the longest allowed too.
    for (id, event, change) in [
        (
            ID,
            &name,
            (|r| r.resources = (0..MAX_RESOURCES).map(|i| format!("vmss_{i}")).collect())
                as fn(&mut Report),
        ),
        ("FLEET-1", &odd, |_| {}),
    ] {
        api.create(&PostParams::default(), &report(id, event, change))
            .await
            .expect("a report within bounds");
        api.delete(
            &report_name(event, NODE).expect("name"),
            &DeleteParams::default(),
        )
        .await
        .expect("delete");
    }
}

/// The status of an event of 10,000 nodes, every node
/// draining with terminating pods, is accepted by the real API server
/// (applied as the controller applies it) and stored far under etcd's
/// 1.5 MiB: 500 records listed, the rest counted in `nodesNotListed`,
/// which the CRD's schema keeps (a field it lacked would be pruned).
#[tokio::test(flavor = "multi_thread")]
async fn the_status_of_an_event_naming_ten_thousand_vms_is_stored_small() {
    use forewarn::api::CONTROLLER_MANAGER;
    use forewarn::controller::decide::plan::plan;
    use forewarn::controller::decide::status::{NODE_RECORDS_LISTED, next};
    use forewarn::controller::observe::observed::{Observed, ObservedNode};
    use forewarn::controller::observe::pod_list::{PodInfo, Terminating};
    use forewarn_harness::fixtures;
    use kube::api::{Patch, PatchParams, PostParams};

    let _turn = TURN.lock().await;
    let cluster = shared_cluster().await;
    let client = cluster.client().await.expect("client");
    let api: Api<ScheduledEvent> = Api::all(client.clone());
    let name = "fleet-10000";
    let _ = api.delete(name, &Default::default()).await;
    // An earlier run's object goes at once; 60 s is a hang bound.
    let gone_by = std::time::Instant::now() + Duration::from_secs(60);
    while sev(&client, name).await.is_some() && std::time::Instant::now() < gone_by {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let vm = |i: usize| format!("aks-nodepool1-12345678-vmss_{i}");
    // The spec names at most `MAX_RESOURCES` VMs (the schema's bound); the
    // status under test records 10,000 nodes all the same (the nodes of
    // several contents: its dissenting reports').
    let ev = ScheduledEvent::new(
        name,
        fixtures::spec("FLEET-10000")
            .vms((0..forewarn::api::MAX_RESOURCES).map(vm))
            .not_before(Utc::now() + chrono::Duration::minutes(15))
            .build(),
    );
    let ev = api
        .create(&PostParams::default(), &ev)
        .await
        .expect("the API server accepts a spec naming 1,000 VMs");
    let now = Utc::now();
    let nodes = (0..10_000)
        .map(|i| ObservedNode {
            name: format!("aks-nodepool1-12345678-vmss{i:06x}"),
            vm_name: vm(i),
            cordoned: true,
            holds: vec![name.to_string()],
            claimed_by: Vec::new(),
            pods: (0..10)
                .map(|p| PodInfo {
                    namespace: "shop".into(),
                    name: format!("web-6f999b7fc5-{i:05}{p:02}"),
                    uid: format!("uid-{i}-{p}"),
                    managed: true,
                    grace_seconds: 30,
                    terminating: Some(Terminating {
                        deadline: now + chrono::Duration::seconds(30),
                        finalizers: Vec::new(),
                    }),
                    ..PodInfo::default()
                })
                .map(Arc::new)
                .collect(),
            excluded: Vec::new(),
            ended: false,
            participants: Vec::new(),
        })
        .collect();
    let seen = Observed {
        nodes,
        ..Observed::default()
    };
    let p = plan(&ev, &seen, &forewarn::policy::Policy::default(), now);
    let status = next(&ev, &seen, &p, &[], now).status;
    let body = serde_json::json!({
        "apiVersion": "forewarn.dev/v1alpha1",
        "kind": "ScheduledEvent",
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(CONTROLLER_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .expect("the API server accepts the status of a 10,000-VM event");

    // What the API server stores, read back as raw JSON.
    let raw = client
        .request_text(
            http::Request::get(format!(
                "/apis/forewarn.dev/v1alpha1/scheduledevents/{name}"
            ))
            .body(Vec::new())
            .expect("request"),
        )
        .await
        .expect("read back");
    let stored: serde_json::Value = serde_json::from_str(&raw).expect("json");
    let st = &stored["status"];
    assert_eq!(
        st["nodes"].as_array().map(Vec::len),
        Some(NODE_RECORDS_LISTED),
        "records listed"
    );
    assert_eq!(
        st["nodesNotListed"]["count"].as_i64(),
        Some(10_000 - NODE_RECORDS_LISTED as i64),
        "the CRD keeps the count: {}",
        st["nodesNotListed"]
    );
    assert_eq!(st["nodesDrained"], "0/10000");
    assert!(
        raw.len() < 600 * 1024,
        "the stored object is {} bytes",
        raw.len()
    );
    eprintln!(
        "10,000-VM ScheduledEvent as stored: {} bytes (status {} bytes)",
        raw.len(),
        st.to_string().len()
    );
    api.delete(name, &Default::default()).await.expect("delete");
}

/// What a test's own watches saw, with the time each version arrived and
/// its `resourceVersion`: every version of every node (cordon and
/// forewarn's taint), and every pod of the workload's namespace bound to a
/// node. Independent of the harness and of forewarn. The resourceVersions
/// are the single etcd's revisions, in the order the API server applied
/// the writes, across kinds: they order a node's change and a pod's bind
/// exactly, where the arrival times of two watches may be skewed.
#[derive(Default)]
struct Seen {
    /// `(when, node, unschedulable, tainted forewarn.dev/scheduled-event,
    /// resourceVersion)`.
    nodes: Vec<(DateTime<Utc>, String, bool, bool, u64)>,
    /// Every pod first seen bound to a node.
    bound: Vec<Bound>,
}

/// `(when first seen bound, pod, node, created, resourceVersion of that
/// first bound version)`.
type Bound = (DateTime<Utc>, String, String, DateTime<Utc>, u64);

/// An object's `resourceVersion`, as the number it is on this cluster.
fn revision(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("a numeric resourceVersion")
}

/// Watches nodes and the pods of `namespace` until dropped.
struct Monitor {
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn jiff_to_chrono(t: &k8s_openapi::jiff::Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp(
        t.as_second(),
        u32::try_from(t.subsec_nanosecond()).unwrap_or(0),
    )
    .expect("a valid time")
}

impl Monitor {
    async fn start(client: &Client, namespace: &str) -> Monitor {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let nodes: Api<Node> = Api::all(client.clone());
        let s = seen.clone();
        let node_task = tokio::spawn(async move {
            let stream = watcher(nodes, watcher::Config::default())
                .backoff(forewarn::controller::observe::watch::watch_backoff())
                .applied_objects();
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                let Ok(n) = item else { continue };
                let tainted = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == TAINT_KEY));
                s.lock().expect("lock").nodes.push((
                    Utc::now(),
                    n.name_any(),
                    forewarn::controller::observe::nodes::is_cordoned(&n),
                    tainted,
                    revision(&n.metadata),
                ));
            }
        });
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let s = seen.clone();
        let pod_task = tokio::spawn(async move {
            let stream = watcher(pods, watcher::Config::default())
                .backoff(forewarn::controller::observe::watch::watch_backoff())
                .applied_objects();
            futures::pin_mut!(stream);
            let mut known = std::collections::HashSet::new();
            while let Some(item) = stream.next().await {
                let Ok(p) = item else { continue };
                let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                    continue;
                };
                if known.insert(p.uid().unwrap_or_default()) {
                    let created = p
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map_or_else(Utc::now, |t| jiff_to_chrono(&t.0));
                    s.lock().expect("lock").bound.push((
                        Utc::now(),
                        p.name_any(),
                        node,
                        created,
                        revision(&p.metadata),
                    ));
                }
            }
        });
        Monitor {
            seen,
            tasks: vec![node_task, pod_task],
        }
    }

    /// `node`'s (unschedulable, tainted) as last seen at or before `at`.
    fn node_at(&self, node: &str, at: DateTime<Utc>) -> Option<(bool, bool)> {
        let seen = self.seen.lock().expect("lock");
        seen.nodes
            .iter()
            .rfind(|(t, n, ..)| n == node && *t <= at)
            .map(|(_, _, c, t, _)| (*c, *t))
    }

    /// `node`'s versions seen in `[from, to]`.
    fn node_between(
        &self,
        node: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Vec<(DateTime<Utc>, bool, bool)> {
        let seen = self.seen.lock().expect("lock");
        seen.nodes
            .iter()
            .filter(|(t, n, ..)| n == node && *t >= from && *t <= to)
            .map(|(t, _, c, tainted, _)| (*t, *c, *tainted))
            .collect()
    }
}

/// The mock's log entries `what` for `id`, in order.
fn imds_entries(report: &Report, id: &str, what: &str) -> Vec<LogEntry> {
    report
        .imds_log
        .iter()
        .filter(|e| e.event_id.eq_ignore_ascii_case(id) && e.what == what)
        .cloned()
        .collect()
}

fn secs(d: chrono::TimeDelta) -> f64 {
    d.as_seconds_f64()
}

/// Kube-apiserver really stopped (its process ended,
/// its port refusing connections) for 20 s while a drain is in progress (a
/// pod held by a finalizer is terminating), then started again. Once it is
/// ready, the pod is finished as its kubelet would. After the return, in
/// this order: the drain notices, the approval reaches IMDS through the
/// affected VM's own agent (the mock's log names the VM), the event leaves
/// IMDS, the controller completes it and releases its node. An approval
/// left to the fallback agent fails it, and so does work that never
/// resumes. How soon it resumes (a second or two; kube's default backoff
/// after a `too old resource version` would make it up to half a minute)
/// is a speed figure, for `make bench`.
#[tokio::test(flavor = "multi_thread")]
// Named to sort last: the tests take turns in name order, and after a
// stopped API server kube-controller-manager may stay broken for the
// tests that would follow it on this cluster (namespace deletion hung).
async fn with_the_api_server_stopped_mid_drain_work_resumes_after_its_return() {
    let _turn = TURN.lock().await;
    const ID: &str = "9E1F2A3B-4C5D-4E6F-8A7B-9C0D1E2F3A01";
    const VM: &str = "aks-nodepool1-27351046-vmss_1";
    const NODE: &str = "node-000001";
    const HOLD: &str = "forewarn.dev/test-hold";
    let kubectl = |args: &[&str]| args.iter().map(|a| (*a).to_string()).collect::<Vec<_>>();
    let (report, cluster) = play_with("lifecycle-api-server-outage.yaml", |o| {
        // Both web pods of the node may go at once; the held pod is the one
        // the drain waits for.
        o.min_available = 4;
        o.timeout = Duration::from_secs(150);
        o.policy = Some("evictUnmanagedPods: [Redeploy]\n".into());
        o.extra_objects = vec![serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "held", "finalizers": [HOLD]},
            "spec": {
                "nodeName": NODE,
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            },
        })];
        o.api_server_outage = Some(ApiServerOutage {
            when_last_terminating: "held".into(),
            duration: Duration::from_secs(20),
            then_kubectl: vec![
                kubectl(&[
                    "patch",
                    "pod",
                    "held",
                    "-n",
                    "shop",
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]),
                kubectl(&[
                    "delete",
                    "pod",
                    "held",
                    "-n",
                    "shop",
                    "--grace-period=0",
                    "--force",
                    "--ignore-not-found",
                ]),
            ],
        });
    })
    .await;
    let (down, back) = report
        .api_server_outage
        .expect("the API server was never stopped: the drain was not seen in progress");
    println!(
        "kube-apiserver down at {down}, ready again at {back}: {:.1} s",
        secs(back - down)
    );
    for (t, what) in &report.restarts {
        println!(
            "restart at +{:.1} s after the return: {what}",
            secs(*t - back)
        );
    }
    assert!(
        back - down >= chrono::TimeDelta::seconds(20),
        "the outage lasted only {:.1} s",
        secs(back - down)
    );
    // The held pod was evicted (by forewarn, with a grace period) before the outage.
    let held = report
        .deletions
        .iter()
        .find(|d| d.pod == "shop/held")
        .expect("the held pod was never evicted");
    assert!(held.seen_at <= down, "held evicted after the outage began");
    assert!(held.grace_seconds.unwrap_or(0) > 0, "{held:?}");

    // The approval: only through the affected VM, after the return.
    let approvals = imds_entries(&report, ID, "Approved");
    assert!(!approvals.is_empty(), "IMDS received no approval");
    for a in &approvals {
        assert_eq!(
            a.vm.as_deref(),
            Some(VM),
            "approved through another VM's agent (the fallback): {approvals:?}"
        );
    }
    let approved_at = approvals[0].time;
    let approval_lag = approved_at - back;
    println!(
        "approval reached IMDS {:.2} s after the API server was ready again (via {VM})",
        secs(approval_lag)
    );
    assert!(
        approved_at > back,
        "approved at {approved_at}, before the held pod was gone ({back})"
    );
    // A hang bound: it comes a second or two after the return; only work
    // that stopped for good (or a backoff of a minute) takes 120 s.
    assert!(
        approval_lag <= chrono::TimeDelta::seconds(120),
        "the approval came {:.1} s after the API server's return: work did not resume",
        secs(approval_lag)
    );

    // The object, as the API server holds it.
    let client = cluster.client().await.expect("client");
    let ev = sev(&client, ID).await.expect("the object");
    let st = ev.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Some(Phase::Completed), "{st:?}");
    let node = st
        .nodes
        .iter()
        .flatten()
        .find(|n| n.name == NODE)
        .expect("the node's record");
    let drained_at = node.drained_at.expect("drainedAt");
    println!(
        "drain recorded complete {:.2} s after the return",
        secs(drained_at - back)
    );
    // The held pod was finished only after the return: the drain was
    // recorded complete after it, and before the approval was decided.
    assert!(
        drained_at >= back,
        "drainedAt {drained_at} is before the return {back}"
    );
    let decided_at = st
        .approval
        .as_ref()
        .and_then(|a| a.decided_at)
        .expect("approval.decidedAt");
    assert!(
        drained_at <= decided_at,
        "approval decided at {decided_at}, before the drain was recorded at {drained_at}"
    );
    let approval = st.approval.clone().expect("status.approval");
    assert_eq!(approval.sent_by.as_deref(), Some(NODE), "{approval:?}");
    assert_eq!(approval.result.as_deref(), Some("Accepted"), "{approval:?}");

    // Completion: the event leaves IMDS runFor (4 s) after the approval
    // started it (the mock's log); the agents must see that and the
    // controller finish it and release the node (the run ends only once
    // both are done): both after the event left.
    let left_imds = imds_entries(&report, ID, "Finished");
    let left_imds = left_imds.first().expect("the event left IMDS").time;
    let finished_at = st.finished_at.expect("finishedAt");
    println!(
        "completed {:.2} s after the event left IMDS",
        secs(finished_at - left_imds)
    );
    assert!(
        finished_at >= left_imds,
        "completed at {finished_at}, before the event left IMDS at {left_imds}"
    );
    let uncordoned = report
        .node_changes
        .iter()
        .rfind(|(_, n, cordoned)| n == NODE && !*cordoned)
        .map(|(t, _, _)| *t)
        .expect("the node was never uncordoned");
    let delay = forewarn::policy::Policy::default().release_delay_seconds;
    println!(
        "uncordoned {:.2} s after the event left IMDS (release delay {delay} s)",
        secs(uncordoned - left_imds)
    );
    assert!(
        uncordoned >= left_imds,
        "uncordoned at {uncordoned}, before the event left IMDS at {left_imds}"
    );
}

/// An `EventId` gone from the document
/// for 3 s and back (a flap), with the controller in the loop. The second
/// appearance is handled afresh (`spec.appearance` 2, the first recorded in
/// `status.previousAppearances`); the node is cordoned and tainted
/// `forewarn.dev/scheduled-event` when the event is back and stays so until
/// it is over; a pod created pending (it fits only that node) is never
/// bound to the node before the event's end, nor is any other new pod.
#[tokio::test(flavor = "multi_thread")]
async fn flapping_event_keeps_its_node_cordoned_and_workload_off() {
    let _turn = TURN.lock().await;
    const ID: &str = "9E1F2A3B-4C5D-4E6F-8A7B-9C0D1E2F3A02";
    const NODE: &str = "node-000001";
    let cluster = shared_cluster().await;
    let client = cluster.client().await.expect("client");
    let waiting: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "waiting", "namespace": "shop", "labels": {"app": "waiting"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }))
    .expect("the waiting pod");
    let monitor = Monitor::start(&client, "shop").await;
    // The waiting pod is created once this test's watch saw the node
    // cordoned for this run (a cordon after a version without one: the
    // run starts from released nodes), whenever that is.
    let creator = {
        let (seen, pods) = (
            monitor.seen.clone(),
            Api::<Pod>::namespaced(client.clone(), "shop"),
        );
        tokio::spawn(async move {
            loop {
                let cordoned = {
                    let seen = seen.lock().expect("lock");
                    let mine: Vec<bool> = seen
                        .nodes
                        .iter()
                        .filter(|(_, n, ..)| n == NODE)
                        .map(|(_, _, c, ..)| *c)
                        .collect();
                    mine.iter()
                        .position(|c| !c)
                        .is_some_and(|free| mine[free..].iter().any(|c| *c))
                };
                if cordoned {
                    return pods
                        .create(&kube::api::PostParams::default(), &waiting)
                        .await
                        .map(|_| Utc::now())
                        .map_err(|e| e.to_string());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let (report, _) = play_with("lifecycle-flap.yaml", |o| {
        // A hang bound: the scenario is over about 70 s after its start.
        o.timeout = Duration::from_secs(240);
    })
    .await;
    assert!(
        creator.is_finished(),
        "the node was never seen cordoned: the waiting pod was not created"
    );
    let created = creator
        .await
        .expect("the creator")
        .expect("create the waiting pod");
    println!("the waiting pod was created at {created}");

    // The flap, from the mock's log.
    let gone = imds_entries(&report, ID, "Gone");
    let scheduled = imds_entries(&report, ID, "Scheduled");
    let finished = imds_entries(&report, ID, "Finished");
    assert_eq!(gone.len(), 1, "{:?}", report.imds_log);
    assert_eq!(
        scheduled.len(),
        2,
        "not listed again: {:?}",
        report.imds_log
    );
    assert_eq!(finished.len(), 1, "{:?}", report.imds_log);
    let (gone_at, back_at, end_at) = (gone[0].time, scheduled[1].time, finished[0].time);
    println!(
        "gone at +{:.1} s, back at +{:.1} s, over at +{:.1} s",
        secs(gone_at - report.started),
        secs(back_at - report.started),
        secs(end_at - report.started)
    );

    // The object: second appearance, first one in the history.
    let ev = sev(&client, ID).await.expect("the object");
    assert_eq!(ev.spec.appearance, 2, "{:?}", ev.spec);
    let st = ev.status.clone().unwrap_or_default();
    assert_eq!(st.appearance, Some(2), "{st:?}");
    assert_eq!(st.phase, Some(Phase::Completed), "{st:?}");
    assert_eq!(st.previous_appearances.len(), 1, "{st:?}");
    let first = &st.previous_appearances[0];
    assert_eq!(first.appearance, 1);
    // IMDS had accepted the first appearance's approval: it ended
    // completed (unobserved), not cancelled.
    assert_eq!(first.phase, Some(Phase::Completed), "{first:?}");
    assert!(
        first
            .approval
            .as_deref()
            .is_some_and(|a| a.contains("Accepted")),
        "{first:?}"
    );

    // The node: cordoned and tainted when the event is back, and until it is over.
    let during = monitor.node_between(NODE, gone_at, end_at);
    println!("{NODE} from the flap to the end (time, unschedulable, tainted): {during:?}");
    let at_back = monitor
        .node_at(NODE, back_at)
        .expect("no version of the node seen before the event came back");
    assert_eq!(
        at_back,
        (true, true),
        "{NODE} was not cordoned and tainted when the event came back"
    );
    let after_back = monitor.node_between(NODE, back_at, end_at);
    assert!(
        after_back.iter().all(|(_, c, t)| *c && *t),
        "{NODE} was released during the second appearance: {after_back:?}"
    );

    // Workload kept off: no pod created after the first cordon landed on
    // the node before it was finally uncordoned.
    let first_cordon = report
        .first_cordon(NODE)
        .expect("the node was never cordoned");
    let released = report
        .node_changes
        .iter()
        .rfind(|(_, n, c)| n == NODE && !*c)
        .map(|(t, _, _)| *t)
        .expect("the node was never uncordoned");
    assert!(released >= end_at, "uncordoned before the event was over");
    // The final release, as this test's node watch saw it: the last
    // version that uncordoned the node, by its resourceVersion.
    let released_rv = {
        let seen = monitor.seen.lock().expect("lock");
        let mine: Vec<(bool, u64)> = seen
            .nodes
            .iter()
            .filter(|(_, n, ..)| n == NODE)
            .map(|(_, _, c, _, rv)| (*c, *rv))
            .collect();
        mine.windows(2)
            .rfind(|w| w[0].0 && !w[1].0)
            .map(|w| w[1].1)
            .expect("the test's watch never saw the node uncordoned")
    };
    // If the waiting pod was bound by now, wait until the pod watch
    // delivered its bind (a hang bound: it is delivered at once).
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let waiting_node = pods
        .get("waiting")
        .await
        .expect("the waiting pod")
        .spec
        .and_then(|s| s.node_name);
    if waiting_node.is_some() {
        let by = std::time::Instant::now() + Duration::from_secs(60);
        while !monitor
            .seen
            .lock()
            .expect("lock")
            .bound
            .iter()
            .any(|(_, pod, ..)| pod == "waiting")
        {
            assert!(
                std::time::Instant::now() < by,
                "the waiting pod is bound to {waiting_node:?}, and the test's watch never saw it"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let bound: Vec<_> = monitor
        .seen
        .lock()
        .expect("lock")
        .bound
        .iter()
        .filter(|(_, pod, node, created, _)| {
            node == NODE && (*created >= first_cordon || pod == "waiting")
        })
        .cloned()
        .collect();
    println!(
        "pods bound to {NODE} after its first cordon: {bound:?}; the node released at {released} (resourceVersion {released_rv}); the waiting pod on {waiting_node:?}"
    );
    // Each bind came after the final release, in the order the API server
    // applied them (resourceVersions), not by two watches' arrival times.
    assert!(
        bound.iter().all(|(.., rv)| *rv > released_rv),
        "a pod landed on {NODE} before the event was over (uncordoned at resourceVersion {released_rv}): {bound:?}"
    );
    // Handled afresh: drained (nothing left) and approved again.
    let approvals = imds_entries(&report, ID, "Approved");
    assert!(
        approvals.iter().any(|a| a.time > back_at),
        "the second appearance was not approved again: {approvals:?}"
    );
}

/// An approved event that starts and leaves IMDS while
/// IMDS answers only 500s (25 s). Nobody saw it run; IMDS had accepted the
/// approval, so it is `Completed` with the condition `CompletedUnobserved`,
/// not `Cancelled`, and its node is released.
#[tokio::test(flavor = "multi_thread")]
async fn approved_event_that_ran_during_an_imds_outage_is_completed_unobserved() {
    let _turn = TURN.lock().await;
    const ID: &str = "9E1F2A3B-4C5D-4E6F-8A7B-9C0D1E2F3A03";
    const NODE: &str = "node-000002";
    // A hang bound: the scenario is over about a minute after its start.
    let (report, cluster) = play_with("lifecycle-imds-outage.yaml", |o| {
        o.timeout = Duration::from_secs(240);
    })
    .await;

    // The scenario's timing held (from the mock's log): approved before
    // the outage, started (22 s after the approval) and gone (3 s later)
    // inside it. The mock's clock starts just before `report.started`.
    // The fixture holds for any approval from 5 s to 25 s after the start:
    // the drain takes a few seconds.
    let outage = (
        report.started + chrono::TimeDelta::seconds(26),
        report.started + chrono::TimeDelta::seconds(51),
    );
    let approvals = imds_entries(&report, ID, "Approved");
    let approved_at = approvals.first().expect("IMDS received no approval").time;
    let started = approved_at + chrono::TimeDelta::seconds(22);
    let left = started + chrono::TimeDelta::seconds(3);
    println!(
        "approved at +{:.1} s, started at +{:.1} s, gone at +{:.1} s; IMDS out from +26 s to +51 s",
        secs(approved_at - report.started),
        secs(started - report.started),
        secs(left - report.started)
    );
    let margin = chrono::TimeDelta::milliseconds(500);
    assert!(
        approved_at + margin < outage.0 && started > outage.0 + margin && left + margin < outage.1,
        "the timing this test needs did not hold (the drain took too long?): approved at +{:.1} s",
        secs(approved_at - report.started)
    );
    assert!(
        !report
            .timeline
            .iter()
            .any(|l| l.contains("Azure status Scheduled -> Started")),
        "an agent saw the event Started: it did not run unseen\n{}",
        report.timeline.join("\n")
    );

    let client = cluster.client().await.expect("client");
    let ev = sev(&client, ID).await.expect("the object");
    let st = ev.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Some(Phase::Completed), "{st:?}");
    assert_eq!(ev.spec.event_status, EventStatus::Completed);
    let (status, reason, message) =
        condition(&ev, "CompletedUnobserved").expect("no CompletedUnobserved condition");
    println!("CompletedUnobserved: {status} {reason}: {message}");
    assert_eq!(status, "True");
    assert_eq!(
        st.approval.as_ref().and_then(|a| a.result.as_deref()),
        Some("Accepted")
    );
    assert!(
        !report
            .timeline
            .iter()
            .any(|l| l.contains(" phase ") && l.contains("Cancelled")),
        "recorded Cancelled at some point:\n{}",
        report.timeline.join("\n")
    );
    // The node: cordoned for the event, released after it (the outage ended first).
    let changes: Vec<_> = report
        .node_changes
        .iter()
        .filter(|(_, n, _)| n == NODE)
        .collect();
    assert!(
        changes.iter().any(|(_, _, cordoned)| *cordoned),
        "{NODE} was never cordoned: {changes:?}"
    );
    let (released, _, cordoned) = changes.last().expect("node changes");
    assert!(!cordoned, "{NODE} is still cordoned");
    assert!(
        *released >= outage.1 - margin,
        "released before IMDS was back"
    );
    assert!(holds_anywhere(&client).await.is_empty());
}

/// The taint's effect comes from the policy: with `taintEffect:
/// PreferNoSchedule` both nodes of the Reboot are tainted so, as the API
/// server stores them; the policy then turns to `NoSchedule` (12 s in,
/// while both are held) and neither taint is rewritten; each is removed on
/// release all the same, leaving no taint of forewarn's key on any node.
#[tokio::test(flavor = "multi_thread")]
async fn the_taint_takes_the_policys_effect_and_is_removed_whatever_its_effect() {
    use k8s_openapi::api::core::v1::Taint;
    let _turn = TURN.lock().await;
    let cluster = shared_cluster().await;
    let client = cluster.client().await.expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    // Every version of each node, with its taints, as the watch gave it.
    type Versions = Vec<(DateTime<Utc>, String, Vec<Taint>)>;
    let seen: Arc<Mutex<Versions>> = Arc::default();
    let watch = tokio::spawn({
        let (seen, nodes) = (seen.clone(), nodes.clone());
        async move {
            let stream = watcher(nodes, watcher::Config::default())
                .backoff(forewarn::controller::observe::watch::watch_backoff())
                .applied_objects();
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                let Ok(n) = item else { continue };
                let taints = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default();
                seen.lock()
                    .expect("lock")
                    .push((Utc::now(), n.name_any(), taints));
            }
        }
    });
    // A hang bound: the scenario is over about 65 s after its start.
    let (report, _) = play_with("lifecycle-part-ends.yaml", |o| {
        o.policy = Some("taintEffect: PreferNoSchedule\n".into());
        o.timed_policy = vec![(Duration::from_secs(12), "taintEffect: NoSchedule\n".into())];
    })
    .await;
    watch.abort();
    let seen = seen.lock().expect("lock").clone();
    let ours = |t: &[Taint]| -> Vec<String> {
        t.iter()
            .filter(|t| t.key == TAINT_KEY)
            .map(|t| t.effect.clone())
            .collect()
    };
    for node in ["node-000001", "node-000002"] {
        let versions: Vec<(DateTime<Utc>, Vec<String>)> = seen
            .iter()
            .filter(|(_, n, _)| n == node)
            .map(|(at, _, t)| (*at, ours(t)))
            .collect();
        println!("{node}: {versions:?}");
        assert!(
            versions
                .iter()
                .any(|(_, e)| e.as_slice() == ["PreferNoSchedule"]),
            "{node} was never tainted PreferNoSchedule: {versions:?}"
        );
        assert!(
            versions
                .iter()
                .all(|(_, e)| e.is_empty() || e.as_slice() == ["PreferNoSchedule"]),
            "{node} got another effect, or two taints of forewarn's key: {versions:?}"
        );
        // Held, with its taint as written, after the new policy was put in
        // force (read every 2 s; a few seconds of slack).
        let after_change = report.started + chrono::TimeDelta::seconds(18);
        let held_after = versions
            .iter()
            .rfind(|(at, _)| *at <= after_change)
            .map(|(_, e)| e.clone());
        assert_eq!(
            held_after.as_deref(),
            Some(&["PreferNoSchedule".to_string()][..]),
            "{node} was not held with its taint when the policy changed"
        );
    }
    let metrics = &report
        .metrics
        .iter()
        .find(|(name, _)| name == "controller")
        .expect("controller metrics")
        .1;
    assert!(
        metrics.contains("forewarn_controller_policy_reloads_total{result=\"loaded\"} 1"),
        "the NoSchedule policy was never loaded: {metrics}"
    );
    // Released: no node carries forewarn's taint.
    for n in nodes.list(&ListParams::default()).await.expect("nodes") {
        let taints = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        assert!(ours(&taints).is_empty(), "{}: {taints:?}", n.name_any());
    }
}

/// One version of a node as the watch gave it, for the out-of-service
/// taint: when, its name, its `node.kubernetes.io/out-of-service` taints
/// (`key=value:effect`), forewarn's mark on it, and the manager of the
/// newest `managedFields` entry that owns `spec.taints`.
#[derive(Debug, Clone)]
struct OosVersion {
    at: DateTime<Utc>,
    node: String,
    taints: Vec<String>,
    mark: Option<String>,
    taints_manager: Option<String>,
}

fn oos_version(n: &Node) -> OosVersion {
    use forewarn::controller::decide::out_of_service::{OWNED_ANNOTATION, TAINT_KEY as OOS};
    let taints = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key == OOS)
        .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
        .collect();
    let taints_manager = n
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0["f:spec"].get("f:taints").is_some())
        })
        .max_by_key(|m| m.time.as_ref().map(|t| t.0.as_second()))
        .and_then(|m| m.manager.clone());
    OosVersion {
        at: Utc::now(),
        node: n.name_any(),
        taints,
        mark: n.annotations().get(OWNED_ANNOTATION).cloned(),
        taints_manager,
    }
}

/// With the policy's `outOfServiceTaint`, a Terminate of two VMs runs and
/// leaves IMDS; then (30 s in) the first VM is played gone for good under
/// its Node object (kwok stops managing the node, which the test writes
/// `Ready: Unknown`, as the node lifecycle controller does), the second
/// stays Ready, and a person's `node.kubernetes.io/out-of-service` taint
/// goes on node-000000 (no part of the event). From every version of the
/// nodes the API server stored: only node-000001 gets forewarn's taint
/// (`nodeshutdown:NoExecute`, written by forewarn's field manager, with
/// forewarn's mark naming the event), node-000002 never has one; the
/// status records it and an `OutOfServiceTainted` Event says so; a bare
/// pod bound to node-000001 (600 s of grace) is taken off it by
/// kube-controller-manager within seconds of the taint (deleted by the
/// taint manager, then force-deleted by the pod garbage collector). At 75 s
/// the VM comes back (kwok makes the node Ready again): forewarn's taint
/// and mark are gone by the end, the person's taint is still there.
#[tokio::test(flavor = "multi_thread")]
async fn the_out_of_service_taint_goes_on_a_gone_vms_node_only_and_leaves_when_it_returns() {
    use forewarn::controller::decide::out_of_service::TAINT_KEY as OOS;
    let _turn = TURN.lock().await;
    const ID: &str = "3C4D5E6F-7A8B-4C9D-8E0F-1A2B3C4D5E07";
    let name = ID.to_ascii_lowercase();
    let cluster = shared_cluster().await;
    let client = cluster.client().await.expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    let seen: Arc<Mutex<Vec<OosVersion>>> = Arc::default();
    let recorded: Arc<Mutex<Vec<Option<DateTime<Utc>>>>> = Arc::default();
    let watch = tokio::spawn({
        let (seen, nodes) = (seen.clone(), nodes.clone());
        async move {
            let stream = watcher(nodes, watcher::Config::default())
                .backoff(forewarn::controller::observe::watch::watch_backoff())
                .applied_objects();
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                let Ok(n) = item else { continue };
                seen.lock().expect("lock").push(oos_version(&n));
            }
        }
    });
    // node-000001's record in every version of the object (it is deleted
    // by its retention before the run ends).
    let events_watch = tokio::spawn({
        let recorded = recorded.clone();
        let api: Api<ScheduledEvent> = Api::all(client.clone());
        async move {
            let stream = watcher(api, watcher::Config::default())
                .backoff(forewarn::controller::observe::watch::watch_backoff())
                .applied_objects();
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                let Ok(ev) = item else { continue };
                let at = ev
                    .status
                    .and_then(|s| s.nodes)
                    .into_iter()
                    .flatten()
                    .find(|n| n.name == "node-000001")
                    .and_then(|n| n.out_of_service_at);
                recorded.lock().expect("lock").push(at);
            }
        }
    });
    // The bare pod the test binds to node-000001 once the event is over
    // (outside the workload's namespace, which the harness watches for
    // force deletes): every version, and when its deletion was seen.
    type PodSeen = (DateTime<Utc>, Option<DateTime<Utc>>, bool);
    let victim: Arc<Mutex<Vec<PodSeen>>> = Arc::default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let _ = pods
        .delete(
            "oos-victim",
            &kube::api::DeleteParams::default().grace_period(0),
        )
        .await;
    let pods_watch = tokio::spawn({
        let (victim, pods) = (victim.clone(), pods.clone());
        async move {
            let config = watcher::Config::default().fields("metadata.name=oos-victim");
            let stream = watcher(pods, config)
                .backoff(forewarn::controller::observe::watch::watch_backoff());
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                let (p, deleted) = match item {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                    Ok(watcher::Event::Delete(p)) => (p, true),
                    _ => continue,
                };
                let until = p
                    .metadata
                    .deletion_timestamp
                    .as_ref()
                    .map(|t| jiff_to_chrono(&t.0));
                victim
                    .lock()
                    .expect("lock")
                    .push((Utc::now(), until, deleted));
            }
        }
    });
    let kubectl = |args: &[&str]| -> Vec<String> { args.iter().map(|a| a.to_string()).collect() };
    // Bound to the node directly (the scheduler and the cordon play no
    // part), 600 s of grace: kwok would keep it Terminating that long.
    let bound = r#"{"apiVersion":"v1","spec":{"nodeName":"node-000001","terminationGracePeriodSeconds":600}}"#;
    let gone = r#"{"status":{"conditions":[{"type":"Ready","status":"Unknown","reason":"NodeStatusUnknown","message":"Kubelet stopped posting node status."}]}}"#;
    let foreign = r#"{"spec":{"taints":[{"key":"node.kubernetes.io/out-of-service","value":"by-hand","effect":"NoSchedule"}]}}"#;
    let (report, _) = play_with("lifecycle-out-of-service.yaml", |o| {
        o.policy = Some("outOfServiceTaint: true\nretention: 150s\n".into());
        // The object goes at its retention (150 s after the end): the run
        // lasts that long, the controller running, so that the taint is
        // put and removed meanwhile.
        o.until_deleted = true;
        o.timeout = Duration::from_secs(300);
        let at = Duration::from_secs(30);
        o.timed_kubectl = vec![
            (
                Duration::from_secs(26),
                kubectl(&[
                    "run",
                    "oos-victim",
                    "-n",
                    "default",
                    "--restart=Never",
                    "--image=registry.k8s.io/pause:3.10",
                    "--overrides",
                    bound,
                ]),
            ),
            (
                at,
                kubectl(&[
                    "annotate",
                    "node",
                    "node-000001",
                    "forewarn.dev/vm-gone=true",
                ]),
            ),
            (
                at,
                kubectl(&[
                    "patch",
                    "node",
                    "node-000001",
                    "--subresource=status",
                    "-p",
                    gone,
                ]),
            ),
            (
                at,
                kubectl(&[
                    "patch",
                    "node",
                    "node-000000",
                    "--type=merge",
                    "-p",
                    foreign,
                ]),
            ),
            (
                Duration::from_secs(75),
                kubectl(&["annotate", "node", "node-000001", "forewarn.dev/vm-gone-"]),
            ),
        ];
    })
    .await;
    watch.abort();
    events_watch.abort();
    pods_watch.abort();
    let victim = victim.lock().expect("lock").clone();
    let _ = pods
        .delete(
            "oos-victim",
            &kube::api::DeleteParams::default().grace_period(0),
        )
        .await;
    let seen = seen.lock().expect("lock").clone();
    let now: Vec<Node> = nodes
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items;
    // Put the cluster back before asserting: the person's taint off
    // node-000000 (the next tests schedule there).
    let _ = nodes
        .patch(
            "node-000000",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"taints": null}})),
        )
        .await;
    let of = |node: &str| -> Vec<&OosVersion> { seen.iter().filter(|v| v.node == node).collect() };
    for v in of("node-000001") {
        println!("{v:?}");
    }
    let ours = format!("{OOS}=nodeshutdown:NoExecute");
    let tainted: Vec<&OosVersion> = of("node-000001")
        .into_iter()
        .filter(|v| v.taints.contains(&ours))
        .collect();
    let first = tainted
        .first()
        .unwrap_or_else(|| panic!("node-000001 never got {ours}"));
    assert_eq!(
        first.taints_manager.as_deref(),
        Some(forewarn::api::CONTROLLER_MANAGER),
        "the taint was not written by forewarn's field manager: {first:?}"
    );
    assert_eq!(first.mark.as_deref(), Some(name.as_str()), "{first:?}");
    assert!(
        first.at >= report.started + chrono::TimeDelta::seconds(30),
        "tainted before the VM went at 30 s: {first:?}"
    );
    assert!(
        of("node-000001").iter().all(|v| v.taints.len() <= 1),
        "two out-of-service taints on node-000001"
    );
    // The Ready node of the same event: never tainted.
    let ready = of("node-000002");
    assert!(!ready.is_empty());
    assert!(
        ready
            .iter()
            .all(|v| v.taints.is_empty() && v.mark.is_none()),
        "node-000002 (Ready) was tainted: {:?}",
        ready.iter().find(|v| !v.taints.is_empty())
    );
    // At the end: node-000001 Ready, without forewarn's taint or mark;
    // the person's taint on node-000000 untouched.
    let last = |node: &str| now.iter().find(|n| n.name_any() == node).expect(node);
    let back = oos_version(last("node-000001"));
    assert!(
        back.taints.is_empty() && back.mark.is_none(),
        "forewarn's taint stayed on node-000001 after it came back: {back:?}"
    );
    assert_eq!(
        forewarn::controller::decide::out_of_service::ready(last("node-000001")),
        Some(true),
        "node-000001 did not come back Ready"
    );
    let untainted = of("node-000001")
        .into_iter()
        .rfind(|v| v.taints.contains(&ours))
        .map(|v| v.at)
        .expect("tainted");
    println!(
        "node-000001 tainted at {}, untainted after {untainted}",
        first.at
    );
    let theirs = oos_version(last("node-000000"));
    assert_eq!(
        theirs.taints,
        [format!("{OOS}=by-hand:NoSchedule")],
        "the person's out-of-service taint on node-000000 was touched"
    );
    assert_eq!(theirs.mark, None);
    assert!(
        of("node-000000").iter().all(|v| v.mark.is_none()),
        "forewarn marked the person's taint as its own"
    );
    // The real effect: the taint lets kube-controller-manager take the
    // pod off the gone node (the taint manager deletes it, as it does not
    // tolerate the taint; the pod garbage collector force-deletes a
    // terminating pod on a not-Ready node with the taint) long before its
    // 600 s of grace, which kwok would otherwise have it use.
    println!("oos-victim: {victim:?}");
    let gone_at = victim
        .iter()
        .find(|(_, _, deleted)| *deleted)
        .map(|(at, ..)| *at)
        .unwrap_or_else(|| panic!("oos-victim was never deleted: {victim:?}"));
    // The end of its grace as its graceful deletion set it (a force
    // delete then moves it to the moment of deletion).
    let until = victim.iter().find_map(|(_, until, _)| *until);
    assert!(
        gone_at >= first.at,
        "oos-victim went at {gone_at}, before node-000001 was tainted at {}",
        first.at
    );
    let until = until.expect("oos-victim was deleted without a deletionTimestamp");
    assert!(
        gone_at + chrono::TimeDelta::seconds(300) < until,
        "oos-victim was not force-deleted: gone at {gone_at}, its grace ran until {until}"
    );
    // Recorded, and announced on the node.
    let recorded = recorded.lock().expect("lock").clone();
    assert!(
        recorded.iter().flatten().next().is_some(),
        "status.nodes[node-000001].outOfServiceAt never set: {recorded:?}"
    );
    let notes = event_notes(&client, "node-000001", "OutOfServiceTainted").await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains(&name) && n.contains("not Ready")),
        "no OutOfServiceTainted Event on node-000001: {notes:?}"
    );
    let notes = event_notes(&client, "node-000001", "OutOfServiceUntainted").await;
    assert!(
        notes.iter().any(|n| n.contains("Ready again")),
        "no OutOfServiceUntainted Event on node-000001: {notes:?}"
    );
}
