//! An upgrade from the previous release's chart with an event in progress,
//! on a cluster of its own.

use std::time::{Duration, Instant};

use forewarn_harness::cluster::{Cluster, repo_root};

use crate::crds::{crds_apply, hook_credentials};
use crate::on_cluster::apply_status;
use crate::processes::chart_run_options;
use crate::{
    NS, RELEASE, UPGRADE_CLUSTER, admin, chart_dir, ensure_namespace, eventually, helm, turn,
};

/// The chart of the previous release, `tests/chart-fixtures/previous-release`
/// (`hack/snapshot-previous-chart.sh`: `charts/forewarn` of 55729a8, the
/// commit before the reports CRD was added; no release tags exist).
fn previous_chart_dir() -> String {
    repo_root()
        .join("tests/chart-fixtures/previous-release")
        .to_string_lossy()
        .into_owned()
}

/// An upgrade from the previous release with an event in
/// progress. The previous chart is installed (its `crds/`: the events CRD
/// of that version, no reports CRD); a platform Redeploy of node-000001's
/// VM is in progress as that version left it (the object its agent
/// created, with its `spec.reports` entry, the status its controller
/// wrote while draining, the node cordoned, tainted and recorded in
/// `forewarn.dev/cordoned-for`, the agents' `forewarn.dev/vm-name`
/// annotations; the nodes carry Azure providerIDs, as AKS nodes do). Then
/// the upgrade as the chart does it: the CRD hook's `forewarn crds apply`
/// with the hook's own ServiceAccount token (the hook Job's command; KWOK
/// runs no container), `helm upgrade` to `charts/forewarn` with the hook
/// on (Helm creates and deletes the hook's objects; kwok marks the Job's
/// pod Succeeded without running it), and HEAD's agents and controller
/// with TokenRequest tokens of the chart's ServiceAccounts. Nothing is lost (the same
/// object, adopted and taken to Completed), no node is left cordoned (the
/// node stays held until the event is over, then released: without a
/// providerID it would be released until its agent reports, since the
/// earlier `forewarn.dev/vm-name` annotation is no longer read), and the new
/// fields work: the reports CRD exists and the agents' reports are in it,
/// the approval's `appearance` and `digest` (not in the previous schema,
/// and which an agent needs to send the approval) are stored, and so is
/// `nodesNotListed`.
#[test]
fn upgrade_from_the_previous_release_with_an_event_in_progress() {
    use forewarn_harness::report::summary;
    use forewarn_harness::run::run_scenario;
    const ID: &str = "9E1F2A3B-4C5D-4E6F-8A7B-9C0D1E2F3A08";
    const NODE: &str = "node-000001";
    const VM: &str = "aks-nodepool1-27351046-vmss_1";
    let name = ID.to_ascii_lowercase();
    // A cluster of its own: the test removes our CRDs and installs another
    // release, and gives the nodes Azure providerIDs (as AKS nodes have;
    // immutable once set), which the shared cluster's nodes must not have
    // (other tests state other VMs on them).
    let _turn = turn();
    let c = Cluster::start(UPGRADE_CLUSTER, 3)
        .unwrap_or_else(|e| panic!("the upgrade test's cluster could not start: {e:#}"));
    let k = admin(&c);
    let kubeconfig = c.kubeconfig.to_string_lossy().into_owned();
    let t0 = Instant::now();
    let step = |what: &str| println!("[upgrade test +{:.1}s] {what}", t0.elapsed().as_secs_f64());

    // As the previous release leaves a cluster: none of our CRDs before its
    // `helm install` (which creates its own, as it did then).
    k.ok(&[
        "delete",
        "crd",
        "scheduledevents.forewarn.dev",
        "scheduledeventreports.forewarn.dev",
        "virtualmachinereports.forewarn.dev",
        "--wait=true",
    ]);
    for i in 0..3 {
        let provider = format!(
            "azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachineScaleSets/aks-nodepool1-27351046-vmss/virtualMachines/{i}"
        );
        k.ok(&[
            "patch",
            "node",
            &format!("node-00000{i}"),
            "--type=merge",
            "-p",
            &serde_json::json!({"spec": {"providerID": provider}}).to_string(),
        ]);
    }
    step("helm install of the previous chart");
    ensure_namespace(&k, NS, "privileged");
    let previous = previous_chart_dir();
    // Pods of 1 s grace, so that the upgrade's rollout does not wait 30 s
    // per old agent pod (KWOK keeps a deleted pod until its grace ends);
    // the new pods get the chart's defaults.
    let out = helm(&[
        "install",
        RELEASE,
        &previous,
        "--namespace",
        NS,
        "--kubeconfig",
        &kubeconfig,
        "--set",
        "agent.terminationGracePeriodSeconds=1",
        "--set",
        "controller.terminationGracePeriodSeconds=1",
        "--wait",
        "--timeout",
        "180s",
    ]);
    assert!(
        out.ok,
        "helm install of the previous chart:\n{}{}",
        out.stdout, out.stderr
    );
    let chart = k.json(&["get", "crd", "scheduledevents.forewarn.dev"]);
    assert!(
        chart["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
            .get("nodesNotListed")
            .is_none(),
        "the previous chart's CRD has nodesNotListed"
    );
    assert!(
        !k.run(&["get", "crd", "scheduledeventreports.forewarn.dev"], None)
            .ok,
        "the previous chart installed a reports CRD"
    );
    assert!(
        !k.run(&["get", "crd", "virtualmachinereports.forewarn.dev"], None)
            .ok,
        "the previous chart installed a VM reports CRD"
    );

    // The event in progress, as the previous version wrote it: the object
    // created by the first agent (field manager forewarn-agent), each
    // agent's own entry of spec.reports (server-side apply as
    // forewarn-agent-<node>), the controller's status (server-side apply as
    // forewarn-controller), the hold on the node (below, once the workload
    // runs) and the agents' VM annotations.
    step("the event in progress, as the previous version wrote it");
    let now = chrono::Utc::now();
    let at = |secs: i64| {
        (now + chrono::Duration::seconds(secs))
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    let spec = serde_json::json!({
        "eventId": ID, "eventType": "Redeploy", "eventStatus": "Scheduled",
        "eventSource": "Platform", "resourceType": "VirtualMachine", "resources": [VM],
        "notBefore": at(40), "durationSeconds": -1,
        "description": "Virtual machine is being redeployed to a different host.",
        "appearance": 1,
    });
    let object = serde_json::json!({
        "apiVersion": "forewarn.dev/v1alpha1", "kind": "ScheduledEvent",
        "metadata": {"name": name}, "spec": spec,
    });
    k.ok_stdin(
        &["create", "--field-manager", "forewarn-agent", "-f", "-"],
        &object.to_string(),
    );
    // The previous `resources_digest`: SHA-256 of the lower-cased names, one
    // a line, its first 8 bytes in hex.
    let entry = serde_json::json!({
        "apiVersion": "forewarn.dev/v1alpha1", "kind": "ScheduledEvent",
        "metadata": {"name": name},
        "spec": {"reports": [{"node": NODE, "vm": VM, "named": true, "eventStatus": "Scheduled",
                              "appearance": 1, "resourcesDigest": "a254b2e791357a7f"}]},
    });
    k.ok_stdin(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            &format!("forewarn-agent-{NODE}"),
            "-f",
            "-",
        ],
        &entry.to_string(),
    );
    let old_status = serde_json::json!({
        "phase": "Draining", "action": "DrainAndApprove", "nodesDrained": "0/1",
        "nodes": [{"name": NODE, "vmName": VM, "cordonedByUs": true, "alreadyCordoned": false,
                   "podsRemaining": 2}],
        "firstSeen": at(-10), "appearance": 1,
        "conditions": [{"type": "Drained", "status": "False", "reason": "Draining",
                        "message": "0/1 affected nodes drained", "lastTransitionTime": at(-10),
                        "observedGeneration": 1}],
    });
    apply_status(&c.kubeconfig, &name, old_status, "forewarn-controller")
        .expect("the previous status");
    for i in 0..3 {
        k.ok(&[
            "annotate",
            "node",
            &format!("node-00000{i}"),
            &format!("forewarn.dev/vm-name=aks-nodepool1-27351046-vmss_{i}"),
            "--overwrite",
        ]);
    }
    let before = k.json(&["get", "scheduledevent", &name]);
    assert_eq!(
        before["spec"]["reports"][0]["node"], NODE,
        "{}",
        before["spec"]
    );
    assert_eq!(
        before["status"]["phase"], "Draining",
        "{}",
        before["status"]
    );
    let uid = before["metadata"]["uid"].as_str().expect("uid").to_string();

    // The upgrade. First what the pre-upgrade hook Job runs, with the
    // hook's RBAC and ServiceAccount token; then `helm upgrade` with the
    // hook on: on KWOK, Helm creates the hook's ServiceAccount, RBAC and Job,
    // waits for the Job (whose pod kwok's pod-complete stage marks
    // Succeeded without running it) and deletes them, which shows the
    // hook's objects, weights and delete policy work with Helm, not the
    // container (the real-node chart test runs that).
    step("the hook's forewarn crds apply");
    let hook = hook_credentials(&k, "upgrade-crds-hook");
    let out = crds_apply(&hook);
    println!(
        "forewarn crds apply (the hook's command):\n{}{}",
        out.stdout, out.stderr
    );
    assert!(out.ok, "forewarn crds apply:\n{}{}", out.stdout, out.stderr);
    step("helm upgrade to HEAD's chart");
    let chart = chart_dir();
    let out = helm(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--kubeconfig",
        &kubeconfig,
        "--wait",
        "--timeout",
        "240s",
    ]);
    assert!(
        out.ok,
        "helm upgrade to HEAD:\n{}{}",
        out.stdout, out.stderr
    );
    println!("{}", out.stdout);
    for (kind, ns) in [
        ("job", Some(NS)),
        ("serviceaccount", Some(NS)),
        ("clusterrole", None),
        ("clusterrolebinding", None),
    ] {
        let mut args = vec!["get", kind, "forewarn-crds"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let out = k.run(&args, None);
        assert!(
            !out.ok && out.stderr.contains("NotFound"),
            "the hook's {kind} is left: {}",
            out.stdout
        );
    }
    // Nothing lost: the same object, its status as the previous version
    // left it.
    let after = k.json(&["get", "scheduledevent", &name]);
    assert_eq!(after["metadata"]["uid"], uid.as_str());
    assert_eq!(after["status"]["phase"], "Draining", "{}", after["status"]);
    println!("the event after the upgrade: {}", after);
    // The new agents' pods (their tokens are bound to them) are the only ones.
    eventually(
        "one agent pod per node, none terminating",
        Duration::from_secs(180),
        || {
            let pods = k.json(&[
                "get",
                "pods",
                "-n",
                NS,
                "-l",
                "app.kubernetes.io/component=agent",
            ]);
            let items = pods["items"].as_array().cloned().unwrap_or_default();
            (items.len() == 3
                && items
                    .iter()
                    .all(|p| p["metadata"]["deletionTimestamp"].is_null()))
            .then_some(())
        },
    );

    // HEAD's agents and controller, with the chart's credentials, on the
    // event in progress.
    step("HEAD's agents and controller");
    let mut opts = chart_run_options(&k, "chart-upgrade", "forewarn-controller", false);
    opts.scenario = repo_root().join("tests/fixtures/lifecycle-upgrade.yaml");
    opts.keep_objects = true;
    opts.prior_holds = vec![(NODE.into(), name.clone())];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = rt
        .block_on(run_scenario(&c, &opts))
        .unwrap_or_else(|e| panic!("the event after the upgrade: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    assert!(
        report.ok(),
        "the event after the upgrade:\n{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    // The node was held from the start (the previous version's hold) to
    // the event's end, and no node is cordoned now.
    let finished = report
        .imds_log
        .iter()
        .find(|e| e.event_id.eq_ignore_ascii_case(ID) && e.what == "Finished")
        .map(|e| e.time)
        .expect("the event ran and ended");
    let changes: Vec<&(chrono::DateTime<chrono::Utc>, String, bool)> = report
        .node_changes
        .iter()
        .filter(|(_, n, _)| n == NODE)
        .collect();
    println!("{NODE} (time, unschedulable): {changes:?}; IMDS finished at {finished}");
    assert_eq!(
        changes.first().map(|c| c.2),
        Some(true),
        "{NODE} not held when the harness began to watch: {changes:?}"
    );
    assert!(
        changes
            .iter()
            .all(|(t, _, cordoned)| *cordoned || *t >= finished),
        "{NODE} was released before the event was over: {changes:?}"
    );
    // And before the harness watched: the controller released it once,
    // after the event was over (its log, RFC 3339 times first).
    let log =
        std::fs::read_to_string(report.log_dir.join("controller.log")).expect("controller log");
    let releases: Vec<chrono::DateTime<chrono::Utc>> = log
        .lines()
        .filter(|l| l.contains(&format!("Uncordoned {NODE}:")))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(
        releases.len() == 1 && releases[0] >= finished,
        "{NODE} released at {releases:?}, the event over at {finished}"
    );
    for i in 0..3 {
        let node = k.json(&["get", "node", &format!("node-00000{i}")]);
        assert!(
            node["spec"]["unschedulable"].is_null() || node["spec"]["unschedulable"] == false,
            "{}",
            node["spec"]
        );
        assert!(
            node["metadata"]["annotations"]["forewarn.dev/cordoned-for"].is_null(),
            "{}",
            node["metadata"]
        );
        assert!(
            !node["spec"]["taints"]
                .to_string()
                .contains("forewarn.dev/scheduled-event"),
            "{}",
            node["spec"]
        );
    }
    // The same object, adopted and finished, with the new fields stored.
    let ev = k.json(&["get", "scheduledevent", &name]);
    println!("the event at the end: {ev}");
    assert_eq!(
        ev["metadata"]["uid"],
        uid.as_str(),
        "the object was created anew"
    );
    let st = &ev["status"];
    assert_eq!(st["phase"], "Completed", "{st}");
    assert_eq!(st["approval"]["sentBy"], NODE, "{st}");
    assert_eq!(st["approval"]["appearance"], 1, "{st}");
    assert!(
        st["approval"]["digest"].is_string(),
        "no approval digest: {st}"
    );
    assert!(
        ev["spec"].get("reports").is_none(),
        "spec.reports kept: {}",
        ev["spec"]
    );
    let report_obj = k.json(&["get", "scheduledeventreport", &format!("{name}.{NODE}")]);
    assert_eq!(
        report_obj["spec"]["report"]["eventId"], ID,
        "{}",
        report_obj["spec"]
    );
    apply_status(
        &c.kubeconfig,
        &name,
        serde_json::json!({"nodesNotListed": {"count": 3, "drained": 3}}),
        "chart-test",
    )
    .expect("nodesNotListed");
    let ev = k.json(&["get", "scheduledevent", &name]);
    assert_eq!(
        ev["status"]["nodesNotListed"]["count"], 3,
        "{}",
        ev["status"]
    );
    if let Err(e) = c.stop() {
        println!("stopping {UPGRADE_CLUSTER}: {e:#}");
    }
}
