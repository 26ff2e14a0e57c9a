//! The real agent and controller processes with nothing but the chart's
//! credentials: scenarios played to the end, leader election with the
//! chart's Role, and a drain past a PodDisruptionBudget to the event's
//! retention.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use forewarn_harness::cluster::repo_root;
use serde_json::Value;

use crate::on_cluster::{
    ControllerProc, agent_pod_on, apply_report, install, report_yaml, state_vms, token,
    token_kubeconfig, unschedulable,
};
use crate::{
    AGENT_POLICY, AGENT_SA, CONTROLLER_SA, Kubectl, NS, admin, cluster, ensure_namespace,
    eventually, out_dir,
};

/// Options to play platform-redeploy.yaml with TokenRequest tokens of the
/// chart's ServiceAccounts: each agent's bound to the chart's agent pod on
/// its node (with `swap`, the agents of node-000000 and node-000001 get
/// each other's token), the controller's unbound (the drain may evict the
/// controller's pods, and a bound token dies with its pod).
pub fn chart_run_options(
    k: &Kubectl,
    run: &str,
    lease: &str,
    swap: bool,
) -> forewarn_harness::options::RunOptions {
    use forewarn_harness::options::RunOptions;
    use forewarn_harness::procs::Credentials;
    let nodes = ["node-000000", "node-000001", "node-000002"];
    let mut agents = std::collections::BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        let bound_to = match (swap, i) {
            (true, 0) => nodes[1],
            (true, 1) => nodes[0],
            _ => node,
        };
        let (pod, uid) = agent_pod_on(k, bound_to);
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
    // A hang bound: these scenarios end within about 20 s (an approval
    // starts the event; at worst NotBefore, 90 s after the start, does);
    // the run returns as soon as they are over.
    opts.timeout = Duration::from_secs(300);
    // As the chart runs the controller (--agent-policy).
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

/// The control for the scenario test below: the same processes with the
/// tokens of the agents of node-000000 and node-000001 swapped are refused
/// by the API server when each records its VM name on its Node. So the
/// processes really authenticate with the tokens given (and a node's token
/// is no good on another node).
#[test]
fn swapped_agent_tokens_are_refused_during_a_scenario() {
    use forewarn_harness::procs::{Fleet, FleetOptions};
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let opts = chart_run_options(&k, "chart-swapped-tokens", "forewarn-controller", true);
    k.run(
        &["delete", "scheduledeventreports", "--all", "--wait=false"],
        None,
    );
    k.run(
        &["delete", "virtualmachinereports", "--all", "--wait=false"],
        None,
    );
    std::fs::create_dir_all(&opts.log_dir).expect("log dir");
    let vms: Vec<(String, String)> = (0..3)
        .map(|i| {
            (
                format!("node-00000{i}"),
                format!("aks-nodepool1-27351046-vmss_{i}"),
            )
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let log = opts.log_dir.join("agent-node-000001.log");
    let refusal = rt.block_on(async {
        let mut fleet = Fleet::start(FleetOptions {
            credentials: opts.credentials.clone(),
            witnesses: true,
            ..FleetOptions::new(
                &opts.forewarn_bin,
                &[("RUST_LOG", "info,kube=warn")],
                &opts.log_dir,
                &opts.scenario,
                "127.0.0.2:0",
                "unused",
                &vms,
            )
        })
        .await
        .expect("fleet starts");
        // The scenario's clock: the event appears, and each agent reports it.
        fleet
            .start_mock(&forewarn::http::client())
            .await
            .expect("the mock's clock starts");
        let start = Instant::now();
        let found = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(l) = text
                .lines()
                .find(|l| l.contains("may write only its own ScheduledEventReports"))
            {
                break Some(l.to_string());
            }
            // A hang bound: the first report is refused within seconds.
            if start.elapsed() > Duration::from_secs(120) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        for p in fleet.all_mut() {
            let _ = p.terminate(Duration::from_secs(10)).await;
        }
        found
    });
    let refusal = refusal.unwrap_or_else(|| {
        panic!(
            "no admission refusal in {}:\n{}",
            log.display(),
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    println!("agent of node-000001 holding node-000000's token: {refusal}");
    // And the API server holds no report of node-000001.
    let reports = k.json(&["get", "scheduledeventreports"]);
    let of_b: Vec<&Value> = reports["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["spec"]["report"]["node"] == "node-000001")
        .collect();
    assert!(
        of_b.is_empty(),
        "a report of node-000001 was stored: {of_b:?}"
    );
    // Nor its VM report: the agent holding node-000000's token was refused
    // there too (the agents' VM reports, written once at start).
    let vm_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        vm_log.contains("may write only its own VirtualMachineReports"),
        "no admission refusal of the VM report in {}:\n{vm_log}",
        log.display()
    );
    let vm_reports = k.json(&["get", "virtualmachinereports"]);
    let vm_of_b: Vec<&Value> = vm_reports["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["spec"]["node"] == "node-000001")
        .collect();
    assert!(
        vm_of_b.is_empty(),
        "a VM report of node-000001 was stored: {vm_of_b:?}"
    );
}

/// The real agent and controller processes of the harness, each with a
/// TokenRequest token of the chart's ServiceAccount (every agent's bound to
/// the chart's agent pod on its node, so it carries the node claim), play
/// `platform-redeploy.yaml` to the end: the chart's RBAC and admission
/// policies are enough for the whole cycle (annotate, mirror, cordon,
/// drain, approve, record the approval, uncordon).
#[test]
fn scenario_plays_with_the_chart_credentials() {
    use forewarn_harness::report::summary;
    use forewarn_harness::run::run_scenario;

    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let lease = "forewarn-controller";
    let mut opts = chart_run_options(&k, "chart-platform-redeploy", lease, false);
    // A pod that takes notices on the node drained: the controller writes
    // its notice with the chart's token, under the chart's admission policy.
    opts.extra_objects.push(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "watcher"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "watcher"}},
            "template": {
                "metadata": {"labels": {"app": "watcher", "forewarn.dev/notice": "true"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": "node-000001"},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = rt
        .block_on(run_scenario(&c, &opts))
        .unwrap_or_else(|e| panic!("platform-redeploy with the chart's credentials: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    assert!(
        report.ok(),
        "platform-redeploy with the chart's credentials:\n{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    assert!(
        report.min_ready >= report.min_available,
        "PodDisruptionBudget violated"
    );
    let noticed: Vec<_> = report
        .notices
        .iter()
        .filter(|n| n.pod.starts_with("shop/watcher-") && n.node == "node-000001")
        .collect();
    assert!(
        noticed
            .iter()
            .any(|n| n.managers == ["forewarn-controller Update"]),
        "no notice written by the controller with the chart's token: {:?}",
        report.notices
    );
    // Each agent reported its VM (the chart's agent RBAC and admission
    // policy let it), and the controller labelled each node with the fault
    // domain the mock served for its VM.
    for i in 0..3 {
        let node = format!("node-00000{i}");
        let vmr = k.json(&["get", "virtualmachinereport", &node]);
        assert_eq!(vmr["spec"]["platformFaultDomain"], i.to_string(), "{vmr}");
        let labels = &k.json(&["get", "node", &node])["metadata"]["labels"];
        assert_eq!(
            labels[forewarn::topology::FAULT_DOMAIN_LABEL],
            i.to_string(),
            "{node}: {labels}"
        );
    }
    // The controller took the chart's Lease, in the release namespace, and
    // released it on SIGTERM at the end: no holder, a duration of 1 s.
    let held = k.json(&["get", "lease", "-n", NS, lease]);
    assert!(
        held["spec"]["holderIdentity"].is_null()
            && held["spec"]["leaseDurationSeconds"] == 1
            && held["spec"]["acquireTime"].is_string(),
        "{}",
        held["spec"]
    );
    // The controller checked the chart's admission policy (--agent-policy,
    // as the chart runs it) with its token.
    let found = std::fs::read_dir(&opts.log_dir)
        .expect("log dir")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .any(|text| text.contains("The agents' admission policy is installed"));
    assert!(
        found,
        "no controller log in {} says the admission policy is installed",
        opts.log_dir.display()
    );
    // No process fell back to anything but its token: the logs show no
    // authorization failure.
    for entry in std::fs::read_dir(&opts.log_dir).expect("log dir") {
        let path = entry.expect("log entry").path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for bad in ["forbidden", "Forbidden", "ValidatingAdmissionPolicy"] {
            assert!(
                !text.contains(bad),
                "{}: {bad} in the log:\n{}",
                path.display(),
                text.lines()
                    .filter(|l| l.contains(bad))
                    .take(5)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}

/// A Freeze with the chart's credentials: the controller watches the
/// affected nodes' Leases in `kube-node-lease` (its Role there) and writes
/// their `ForewarnScheduledEvent` condition (`nodes/status`), with no
/// authorization failure; tests/audit.rs sees both verbs used.
#[test]
fn freeze_plays_with_the_chart_credentials() {
    use forewarn_harness::report::summary;
    use forewarn_harness::run::run_scenario;

    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let mut opts = chart_run_options(&k, "chart-freeze", "forewarn-controller", false);
    opts.scenario = repo_root().join("tests/fixtures/freeze-two-vms.yaml");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = rt
        .block_on(run_scenario(&c, &opts))
        .unwrap_or_else(|e| panic!("freeze-two-vms with the chart's credentials: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    assert!(
        report.ok(),
        "freeze-two-vms with the chart's credentials:\n{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    let log = std::fs::read_to_string(opts.log_dir.join("controller.log")).expect("log");
    assert!(
        log.contains("Watching the node's Lease"),
        "the controller watched no node's Lease:\n{log}"
    );
    for bad in [
        "forbidden",
        "Forbidden",
        "Cannot watch the node's Lease",
        "Could not write the node condition",
    ] {
        assert!(
            !log.contains(bad),
            "{bad} in the controller's log:\n{}",
            log.lines()
                .filter(|l| l.contains(bad))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    // The condition was written with the controller's token, next to
    // KWOK's, and says False now the Freeze is over.
    for node in ["node-000000", "node-000001"] {
        let n = k.json(&["get", "node", node]);
        let conds = n["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let ours = conds
            .iter()
            .find(|c| c["type"] == "ForewarnScheduledEvent")
            .unwrap_or_else(|| panic!("no ForewarnScheduledEvent condition on {node}: {conds:?}"));
        assert_eq!(ours["status"], "False", "{ours}");
        assert!(
            conds
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        );
    }
}

/// Leader election with the chart's Role: a standby holding the chart's
/// controller token waits on the Lease (reads it, and watches that one
/// Lease by a `metadata.name` field selector, which the Role's
/// `resourceNames` allow) and takes it over as soon as the leader releases
/// it on SIGTERM, well before the 15 s the Lease would take to expire.
#[test]
fn a_standby_with_the_chart_token_takes_over_the_released_lease() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    k.run(
        &[
            "delete",
            "lease",
            "-n",
            NS,
            "forewarn-controller",
            "--ignore-not-found",
        ],
        None,
    );
    let controller = token_kubeconfig(&k, "lease-controller", &token(&k, CONTROLLER_SA, None));
    // The chart's FlowSchema: the API server puts the controller's Lease
    // requests in its `leader-election` priority level (API Priority and
    // Fairness answers with the level's UID in a response header, which
    // kubectl prints at -v=8), and its other requests where they were.
    let level_uid = |args: &[&str]| -> String {
        let mut argv = vec!["-v=8"];
        argv.extend_from_slice(args);
        let out = controller.run(&argv, None);
        assert!(
            out.ok,
            "kubectl {args:?} with the controller's token: {}",
            out.stderr
        );
        out.stderr
            .lines()
            .find_map(|l| {
                let (_, v) = l.split_once("X-Kubernetes-Pf-Prioritylevel-Uid:")?;
                Some(v.trim().to_string())
            })
            .unwrap_or_else(|| {
                panic!(
                    "no priority level in the answer to {args:?}:\n{}",
                    out.stderr
                )
            })
    };
    let leader_election = k.json(&["get", "prioritylevelconfiguration", "leader-election"]);
    k.ok(&["get", "flowschema", "forewarn-leader-election"]);
    let lease_level = level_uid(&[
        "get",
        "lease",
        "forewarn-controller",
        "-n",
        NS,
        "--ignore-not-found",
    ]);
    assert_eq!(
        lease_level,
        leader_election["metadata"]["uid"].as_str().expect("uid"),
        "the controller's Lease requests are not in the leader-election level"
    );
    let other_level = level_uid(&["get", "scheduledevents"]);
    assert_ne!(
        other_level, lease_level,
        "the controller's other requests moved to the leader-election level too"
    );
    let leader = ControllerProc::start(&controller.kubeconfig, "lease-leader");
    eventually(
        "the first controller leads",
        Duration::from_secs(120),
        || leader.log().contains("Leading: reconciling").then_some(()),
    );
    let standby = ControllerProc::start(&controller.kubeconfig, "lease-standby");
    // Long enough for its first attempts to find the Lease held.
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        !standby.log().contains("Leading: reconciling"),
        "the standby leads while the leader holds the Lease:\n{}",
        standby.log()
    );
    let holder = k.json(&["get", "lease", "-n", NS, "forewarn-controller"]);
    assert_eq!(holder["spec"]["holderIdentity"], "lease-leader");
    let leader_log = leader.log.clone();
    let stopped = Instant::now();
    drop(leader);
    let took = stopped.elapsed();
    eventually("the standby leads", Duration::from_secs(120), || {
        standby.log().contains("Leading: reconciling").then_some(())
    });
    println!(
        "standby leads {:?} after the leader's SIGTERM ({took:?} to stop it); woken by the watch: {}",
        stopped.elapsed(),
        standby.log().contains("The Lease was released")
    );
    let holder = k.json(&["get", "lease", "-n", NS, "forewarn-controller"]);
    assert_eq!(holder["spec"]["holderIdentity"], "lease-standby");
    let leader_log = std::fs::read_to_string(&leader_log).unwrap_or_default();
    assert!(
        leader_log.contains("Released the leader-election Lease"),
        "the leader did not release the Lease on SIGTERM:\n{leader_log}"
    );
    // Taken over because of the release, not on the Lease's expiry: by the
    // two processes' own log times (RFC 3339, first on each line), the
    // standby acquired it less than 12 s after the leader released it. The
    // Lease's duration is 15 s and the leader renewed it every 2 s, so a
    // standby that missed the release could take it no sooner than 13 s
    // after; one that saw it (by its watch, or its next try 2 s later at
    // most) takes it within about a second. This is the one bound that
    // tells the two apart.
    let logged = |log: &str, what: &str| -> chrono::DateTime<chrono::Utc> {
        log.lines()
            .find(|l| l.contains(what))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no timed {what:?} in:\n{log}"))
    };
    let released = logged(&leader_log, "Released the leader-election Lease");
    let acquired = logged(&standby.log(), "Acquired the leader-election Lease");
    println!(
        "the standby acquired the Lease {:.2} s after the leader released it",
        (acquired - released).as_seconds_f64()
    );
    assert!(
        acquired - released < chrono::Duration::seconds(12),
        "the standby acquired the Lease {:.1} s after its release: on its expiry, not the release",
        (acquired - released).as_seconds_f64()
    );
    for (name, log) in [("leader", leader_log), ("standby", standby.log())] {
        assert!(
            !log.contains("forbidden") && !log.contains("Forbidden"),
            "{name}: refused:\n{log}"
        );
    }
    drop(standby);
    k.ok(&[
        "delete",
        "lease",
        "-n",
        NS,
        "forewarn-controller",
        "--ignore-not-found",
    ]);
}

/// The controller with the chart's token (and `--agent-policy`, as the
/// chart runs it) through a drain that a PodDisruptionBudget blocks, then
/// past the event's retention: the block is announced by one
/// `EvictionBlocked` Event, not one per pass (the passes go on, each
/// refused or not asking); once the node's
/// own agent reports the event gone the node is released, and 3 s later
/// (policy `retention: 3s`) the ScheduledEvent and its report are deleted.
#[test]
fn chart_controller_waits_on_a_budget_and_deletes_the_event_past_retention() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let (b, vm_b) = ("node-000001", "vm-budget-1");
    let (ns, sev) = ("budget-blocked", "b0000000-0000-4000-8000-0000000000be");
    for n in ["node-000000", b, "node-000002"] {
        k.run(&["uncordon", n], None);
    }
    k.run(
        &["delete", "scheduledevent", sev, "--ignore-not-found"],
        None,
    );
    k.run(
        &["delete", "scheduledeventreports", "--all", "--wait=false"],
        None,
    );
    k.run(
        &[
            "delete",
            "lease",
            "-n",
            NS,
            "forewarn-controller",
            "--ignore-not-found",
        ],
        None,
    );
    k.run(
        &[
            "delete",
            "namespace",
            ns,
            "--ignore-not-found",
            "--wait=true",
        ],
        None,
    );
    ensure_namespace(&k, ns, "baseline");
    // One pod on B that its budget lets no eviction take.
    k.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: blocker\n  namespace: {ns}\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: blocker}}\n  template:\n    metadata:\n      labels: {{app: blocker}}\n    spec:\n      nodeSelector: {{kubernetes.io/hostname: {b}}}\n      terminationGracePeriodSeconds: 0\n      containers:\n        - name: app\n          image: registry.invalid/blocker:1\n---\n\
             apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: blocker\n  namespace: {ns}\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels: {{app: blocker}}\n"
        ),
    );
    eventually(
        "the blocker runs on B and its budget allows no disruption",
        Duration::from_secs(120),
        || {
            let pdb = k.json(&["get", "pdb", "-n", ns, "blocker"]);
            (pdb["status"]["currentHealthy"] == 1 && pdb["status"]["disruptionsAllowed"] == 0)
                .then_some(())
        },
    );
    let policy = out_dir().join("budget-retention-policy.yaml");
    std::fs::write(&policy, "retention: 3s\n").expect("policy file");
    let policy_arg = format!("--policy-file={}", policy.display());
    let controller = token_kubeconfig(&k, "budget-controller", &token(&k, CONTROLLER_SA, None));
    let ctl =
        ControllerProc::start_with(&controller.kubeconfig, "budget-controller", &[&policy_arg]);
    eventually("the controller leads", Duration::from_secs(120), || {
        ctl.log().contains("Leading: reconciling").then_some(())
    });
    state_vms(&k, &[(b, vm_b)]);
    let (pod, uid) = agent_pod_on(&k, b);
    let agent_b = token_kubeconfig(
        &k,
        "budget-agent-b",
        &token(&k, AGENT_SA, Some((&pod, &uid))),
    );

    // 1. B's agent reports a Reboot of its VM: B is cordoned and its pod's
    //    eviction refused, pass after pass.
    let out = apply_report(
        &agent_b,
        &report_yaml(sev, b, vm_b, "Reboot", "Scheduled", &[vm_b]),
    );
    assert!(out.ok, "agent B may write its own report: {}", out.stderr);
    // The blocker's Event: the node may hold pods of earlier tests whose
    // budgets refuse an eviction for a moment too (one Event per node and
    // set of budgets).
    let blocker_budget = format!("blocked by PodDisruptionBudget {ns}/blocker");
    let blocker_events = || {
        let events = k.json(&[
            "get",
            "events.events.k8s.io",
            "-A",
            "--field-selector",
            "reason=EvictionBlocked",
        ]);
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| {
                e["regarding"]["name"] == sev
                    && e["note"]
                        .as_str()
                        .is_some_and(|n| n.contains(&blocker_budget))
            })
            .cloned()
            .collect::<Vec<_>>()
    };
    let blocked = eventually(
        "an EvictionBlocked Event of the event about the blocker",
        Duration::from_secs(120),
        || blocker_events().into_iter().next(),
    );
    println!("{}: {}", blocked["series"], blocked["note"]);
    // Passes go on while the budget stays shut (the controller logs each
    // pass's refusal); the block stays announced once.
    let passes = || {
        ctl.log()
            .lines()
            .filter(|l| {
                l.contains("Eviction blocked; will retry") && l.contains(&format!("pod={ns}/"))
            })
            .count()
    };
    let before = passes();
    eventually(
        "three more passes over the blocked drain",
        Duration::from_secs(120),
        || (passes() >= before + 3).then_some(()),
    );
    let events = blocker_events();
    assert_eq!(
        events.len(),
        1,
        "one EvictionBlocked Event about the blocker: {events:?}"
    );
    assert!(
        events[0]["series"].is_null(),
        "the block was announced again while it lasted: {}",
        events[0]
    );
    assert!(unschedulable(&k, b), "node B is not cordoned");
    let pods = k.json(&["get", "pods", "-n", ns, "-l", "app=blocker"]);
    assert_eq!(
        pods["items"].as_array().map(Vec::len),
        Some(1),
        "the blocked pod was evicted: {pods}"
    );

    // 2. B's agent reports the event gone: B is released, and the event
    //    and its report are deleted once its 3 s of retention are over.
    let out = apply_report(
        &agent_b,
        &report_yaml(sev, b, vm_b, "Reboot", "Completed", &[vm_b]),
    );
    assert!(out.ok, "agent B may write its own report: {}", out.stderr);
    eventually(
        "the ScheduledEvent deleted past its retention",
        Duration::from_secs(120),
        || {
            let out = k.run(&["get", "scheduledevent", sev], None);
            (!out.ok && out.stderr.contains("NotFound")).then_some(())
        },
    );
    eventually("its report deleted", Duration::from_secs(120), || {
        let out = k.run(
            &["get", "scheduledeventreport", &format!("{sev}.{b}")],
            None,
        );
        (!out.ok && out.stderr.contains("NotFound")).then_some(())
    });
    assert!(!unschedulable(&k, b), "node B is still cordoned");
    let log = ctl.log();
    drop(ctl);
    assert!(
        log.contains("The agents' admission policy is installed"),
        "the controller did not find the chart's admission policy:\n{log}"
    );
    for bad in ["forbidden", "Forbidden"] {
        assert!(!log.contains(bad), "the controller was refused:\n{log}");
    }
    // Gone before the next test: a later drain of B must not meet the
    // blocker in a terminating namespace (its eviction then answers 403
    // NamespaceTerminating, which tests/audit.rs would count).
    k.ok(&["delete", "namespace", ns, "--wait=true", "--timeout=120s"]);
    k.ok(&[
        "delete",
        "lease",
        "-n",
        NS,
        "forewarn-controller",
        "--ignore-not-found",
    ]);
}
