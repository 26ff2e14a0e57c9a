//! End-to-end tests of the event lifecycle (issue 6) on a real local control
//! plane: events whose only observers vanish still end; a predicted failure
//! days ahead is not drained early; `--dry-run` touches nothing; the policy
//! file is re-read mid-run; the API server itself refuses nonsense in a
//! `ScheduledEvent`. Every check reads what the API server holds (nodes from
//! a watch, pod deletions, the object, its Events) or the IMDS mock's own
//! log, never forewarn's word. They fail, never skip, when the cluster
//! cannot start.
#![cfg(feature = "harness")]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use forewarn::crd::{EventStatus, Phase, ScheduledEvent};
use forewarn::harness::cluster::{Cluster, repo_root};
use forewarn::harness::run::{NodeDeletion, Report, RunOptions, run_scenario, summary};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

/// One cluster for the whole test binary; tests take turns on it.
fn cluster() -> Cluster {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| Cluster::start("forewarn-life", 3).map_err(|e| format!("{e:#}")))
        .clone()
        .unwrap_or_else(|e| panic!("the local cluster could not start: {e}"))
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
    opts.timeout = Duration::from_secs(120);
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

async fn sev(client: &Client, id: &str) -> Option<ScheduledEvent> {
    Api::<ScheduledEvent>::all(client.clone())
        .get_opt(&id.to_ascii_lowercase())
        .await
        .unwrap_or_else(|e| panic!("ScheduledEvent {id}: {e}"))
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

/// Notes of the Events with `reason` about the `ScheduledEvent` `id`.
async fn event_notes(client: &Client, id: &str, reason: &str) -> Vec<String> {
    Api::<KubeEvent>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list Events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| {
            e.regarding
                .as_ref()
                .and_then(|r| r.name.as_deref())
                .is_some_and(|n| n.eq_ignore_ascii_case(id))
        })
        .filter_map(|e| e.note)
        .collect()
}

async fn holds_anywhere(client: &Client) -> Vec<String> {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list nodes")
        .items
        .iter()
        .filter(|n| !forewarn::controller::nodes::holds(n).is_empty())
        .map(ResourceExt::name_any)
        .collect()
}

/// Item 2 of issue 6: the scale set's last VM is deleted by its own
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

/// Item 2 of issue 6: a GPU VM's own event (delivered to it alone) whose
/// VM and node are deleted while it is still `Scheduled`: it ends once
/// `NotBefore` passed, with the reason recorded.
#[tokio::test(flavor = "multi_thread")]
async fn gpu_only_event_whose_vm_is_deleted_ends_with_its_reason() {
    let _turn = TURN.lock().await;
    const ID: &str = "7A1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C02";
    let (report, cluster) = play_with("lifecycle-gpu-vm-deleted.yaml", |o| {
        o.delete_node = Some((
            NodeDeletion::After(Duration::from_secs(13)),
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
    // It ended after NotBefore (28 s after the scenario's start) plus the orphan time.
    let finished = st.finished_at.expect("finishedAt");
    let not_before = report.started + chrono::Duration::seconds(28);
    assert!(
        finished >= not_before + chrono::Duration::seconds(4) - chrono::Duration::seconds(1),
        "ended at {finished}, before NotBefore {not_before} plus the orphan time"
    );
    assert!(holds_anywhere(&client).await.is_empty());
}

/// Item 4 of issue 6: a predicted-failure `Redeploy` with `NotBefore` a
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

/// Item 7 of issue 6: `forewarn controller --dry-run` cordons nothing,
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

/// Item 8 of issue 6: the policy file is re-read mid-run. An invalid new
/// file is refused (logged, counted) and the policy in force stays; a valid
/// one takes over and the waiting event is drained and approved.
#[tokio::test(flavor = "multi_thread")]
async fn policy_file_changes_are_picked_up_and_an_invalid_one_is_refused() {
    let _turn = TURN.lock().await;
    let (report, _cluster) = play_with("lifecycle-policy-reload.yaml", |o| {
        o.policy = Some("defaultAction: Ignore\n".into());
        o.timed_policy = vec![
            (Duration::from_secs(7), "defaultAction: Reboot\n".into()),
            (
                Duration::from_secs(14),
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
    // Nothing cordoned under the old policy, also after the invalid file.
    let first_cordon = report
        .node_changes
        .iter()
        .find(|(_, _, c)| *c)
        .map(|(t, _, _)| *t)
        .expect("the node was cordoned once the valid policy came");
    assert!(
        first_cordon >= report.started + chrono::Duration::seconds(14),
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

/// Item 6 of issue 6: the schema lists the values, so the real API server
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
