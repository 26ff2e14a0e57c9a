//! The chart's ServiceAccounts confined, with TokenRequest tokens of their
//! own (the agent's bound to its pod on a KWOK node): what each may and may
//! not do, RBAC and the admission policies alike, checked on what the API
//! server stored, and the trust model with a real controller.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::on_cluster::{
    ControllerProc, agent_pod_on, apply_report, apply_status, condition, install, report_yaml,
    report_yaml_named, sev_yaml, state_vms, token, token_kubeconfig, unschedulable,
};
use crate::{
    AGENT_POLICY, AGENT_SA, CONTROLLER_POD_POLICY, CONTROLLER_SA, DECISIONS_POLICY, Kubectl, NS,
    RELEASE, VM_ANNOTATION, admin, cluster, ensure_namespace, eventually, out_dir,
};

fn annotation(k: &Kubectl, node: &str) -> Option<String> {
    let n = k.json(&["get", "node", node]);
    n["metadata"]["annotations"][VM_ANNOTATION]
        .as_str()
        .map(str::to_string)
}

fn merge_patch(key: &str, value: &str) -> String {
    format!(r#"{{"metadata":{{"annotations":{{"{key}":"{value}"}}}}}}"#)
}

/// A JSON merge patch of the cluster-scoped object `name` of `resource`
/// (group, version, kind, plural) with the credentials of `kubeconfig`,
/// sent as the product sends its patches: with no read of the object
/// first (`kubectl patch` reads it, which neither role may).
fn merge_patch_as(
    kubeconfig: &Path,
    resource: (&str, &str, &str, &str),
    name: &str,
    body: Value,
) -> Result<(), String> {
    use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
    let (group, version, kind, plural) = resource;
    let ar = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = forewarn_harness::cluster::client_for(kubeconfig)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let api: Api<DynamicObject> = Api::all_with(client, &ar);
        api.patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(|_| ())
            .map_err(|e| match e {
                kube::Error::Api(s) => format!("{} ({}): {}", s.reason, s.code, s.message),
                e => e.to_string(),
            })
    })
}

/// A JSON merge patch of the pod `name` in `ns` with the credentials of
/// `kubeconfig`, as the controller writes a notice (field manager
/// `forewarn-controller`, no read first).
fn pod_merge_patch_as(kubeconfig: &Path, ns: &str, name: &str, body: Value) -> Result<(), String> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = forewarn_harness::cluster::client_for(kubeconfig)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let params = PatchParams {
            field_manager: Some(forewarn::api::CONTROLLER_MANAGER.into()),
            ..PatchParams::default()
        };
        Api::<Pod>::namespaced(client, ns)
            .patch(name, &params, &Patch::Merge(&body))
            .await
            .map(|_| ())
            .map_err(|e| match e {
                kube::Error::Api(s) => format!("{} ({}): {}", s.reason, s.code, s.message),
                e => e.to_string(),
            })
    })
}

/// The resource rows of `kubectl auth can-i --list`: (resource with its
/// group, resource names joined by spaces) to verbs. A row reads `resource
/// [non-resource URLs] [resource names] [verbs]`; rows of the same resource
/// and names are merged, non-resource URL rows (indented) left out.
fn can_i_rules(
    list: &str,
) -> std::collections::BTreeMap<(String, String), std::collections::BTreeSet<String>> {
    let mut rules = std::collections::BTreeMap::new();
    for line in list.lines() {
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let Some((resource, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let groups: Vec<Vec<&str>> = rest
            .split('[')
            .skip(1)
            .map(|g| {
                g.split(']')
                    .next()
                    .unwrap_or_default()
                    .split_whitespace()
                    .collect()
            })
            .collect();
        let [_, names, verbs] = groups.as_slice() else {
            continue;
        };
        rules
            .entry((resource.to_string(), names.join(" ")))
            .or_insert_with(std::collections::BTreeSet::new)
            .extend(verbs.iter().map(|v| v.to_string()));
    }
    rules
}

/// `helm install`, then the chart's ServiceAccounts with TokenRequest tokens:
/// each may do what its role needs and nothing more.
#[test]
fn installed_chart_confines_each_service_account() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let mut record = String::new();

    // What the release created.
    for (kind, name) in [
        ("daemonset", "forewarn-agent"),
        ("deployment", "forewarn-controller"),
        ("serviceaccount", AGENT_SA),
        ("serviceaccount", CONTROLLER_SA),
        ("configmap", "forewarn-policy"),
        ("service", "forewarn-agent-metrics"),
        ("service", "forewarn-controller-metrics"),
        ("poddisruptionbudget", "forewarn-controller"),
        ("role", "forewarn-controller-lease"),
        ("rolebinding", "forewarn-controller-lease"),
    ] {
        k.ok(&["get", "-n", NS, kind, name]);
    }
    for (kind, name) in [
        ("clusterrole", "forewarn-agent"),
        ("clusterrole", "forewarn-controller"),
        ("clusterrolebinding", "forewarn-agent"),
        ("clusterrolebinding", "forewarn-controller"),
        ("validatingadmissionpolicy", AGENT_POLICY),
        ("validatingadmissionpolicybinding", AGENT_POLICY),
        ("validatingadmissionpolicy", CONTROLLER_POD_POLICY),
        ("validatingadmissionpolicybinding", CONTROLLER_POD_POLICY),
        ("validatingadmissionpolicy", DECISIONS_POLICY),
        ("validatingadmissionpolicybinding", DECISIONS_POLICY),
        ("crd", "scheduledevents.forewarn.dev"),
        ("crd", "scheduledeventreports.forewarn.dev"),
        ("crd", "virtualmachinereports.forewarn.dev"),
    ] {
        k.ok(&["get", kind, name]);
    }
    // The agent-reports policy, and the controller's on pods: the only
    // writes RBAC cannot narrow enough.
    let vaps = k.json(&[
        "get",
        "validatingadmissionpolicies",
        "-l",
        &format!("app.kubernetes.io/instance={RELEASE}"),
    ]);
    let names: Vec<&str> = vaps["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [AGENT_POLICY, DECISIONS_POLICY, CONTROLLER_POD_POLICY],
        "the release's admission policies"
    );
    // The API server type-checked each policy's CEL against the real
    // schema (the CRD, the Pod) and found nothing to warn about.
    for policy in [AGENT_POLICY, CONTROLLER_POD_POLICY, DECISIONS_POLICY] {
        let status = eventually("policy type-checked", Duration::from_secs(120), || {
            let p = k.json(&["get", "validatingadmissionpolicy", policy]);
            (p["status"]["observedGeneration"] == p["metadata"]["generation"])
                .then(|| p["status"].clone())
        });
        assert!(
            status["typeChecking"]["expressionWarnings"].is_null(),
            "{policy}: type-checking warnings: {}",
            status["typeChecking"]
        );
    }
    let ds = k.json(&["get", "-n", NS, "daemonset", "forewarn-agent"]);
    assert_eq!(
        ds["status"]["numberReady"], 3,
        "one agent per node: {}",
        ds["status"]
    );
    let dep = k.json(&["get", "-n", NS, "deployment", "forewarn-controller"]);
    assert_eq!(dep["status"]["readyReplicas"], 2, "{}", dep["status"]);

    let nodes = ["node-000000", "node-000001", "node-000002"];
    let (agent_pod, agent_uid) = agent_pod_on(&k, nodes[0]);
    let agent = token_kubeconfig(
        &k,
        "agent",
        &token(&k, AGENT_SA, Some((&agent_pod, &agent_uid))),
    );
    let ctl_pods = k.json(&[
        "get",
        "pods",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/component=controller",
    ]);
    let ctl_pod = &ctl_pods["items"][0]["metadata"];
    let controller = token_kubeconfig(
        &k,
        "controller",
        &token(
            &k,
            CONTROLLER_SA,
            Some((
                ctl_pod["name"].as_str().unwrap(),
                ctl_pod["uid"].as_str().unwrap(),
            )),
        ),
    );
    let unbound_agent = token_kubeconfig(&k, "agent-unbound", &token(&k, AGENT_SA, None));

    // The fact the admission policy rests on: a pod-bound token carries the
    // node of the pod in the user's extra info.
    let who = agent.json(&["auth", "whoami"]);
    let info = &who["status"]["userInfo"];
    record += &format!(
        "agent token (bound to pod {agent_pod} on {}): {info}\n\n",
        nodes[0]
    );
    assert_eq!(
        info["username"],
        format!("system:serviceaccount:{NS}:{AGENT_SA}")
    );
    assert_eq!(
        info["extra"]["authentication.kubernetes.io/node-name"],
        serde_json::json!([nodes[0]]),
        "no node name in the pod-bound token: {info}"
    );
    let who = unbound_agent.json(&["auth", "whoami"]);
    assert!(
        who["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"].is_null(),
        "an unbound token carries a node name: {}",
        who["status"]["userInfo"]
    );

    // --- agent: its own node's reports, nothing else. Agents report, the
    // controller decides: no ScheduledEvent, no status, no Node.
    let denials = std::cell::RefCell::new(Vec::new());
    let deny = |who: &Kubectl, what: &str, args: &[&str], expect: &str| {
        let msg = who.denied(args);
        assert!(
            msg.contains(expect),
            "{what}: refused, but not for the expected reason ({expect}): {msg}"
        );
        denials.borrow_mut().push(format!("{what}:\n  {msg}"));
    };
    // Refused by RBAC (403 Forbidden: the role grants no such verb), before
    // any admission policy is asked.
    // RBAC's refusal of `verb`, or of the read kubectl makes first (`get`).
    let forbid = |who: &Kubectl, what: &str, args: &[&str], verb: &str, resource: &str| {
        let msg = who.denied(args);
        let refused = |v: &str| msg.contains(&format!("cannot {v} resource \"{resource}\""));
        assert!(
            refused(verb) || refused("get"),
            "{what}: refused, but not by RBAC (cannot {verb} resource \"{resource}\"): {msg}"
        );
        denials.borrow_mut().push(format!("{what}:\n  {msg}"));
    };
    let file = |name: &str, text: &str| {
        let path = out_dir().join(name);
        std::fs::write(&path, text).expect("write a request body");
        path.to_string_lossy().into_owned()
    };

    // Nodes: nothing at all (the controller maps VMs to nodes itself).
    forbid(
        &agent,
        "agent reads its own Node",
        &["get", "node", nodes[0]],
        "get",
        "nodes",
    );
    forbid(
        &agent,
        "agent annotates its own Node",
        &[
            "patch",
            "node",
            nodes[0],
            "--type=merge",
            "-p",
            &merge_patch(VM_ANNOTATION, "vm-chart-0"),
        ],
        "patch",
        "nodes",
    );
    forbid(
        &agent,
        "agent annotates another Node",
        &[
            "patch",
            "node",
            nodes[1],
            "--type=merge",
            "-p",
            &merge_patch(VM_ANNOTATION, "vm-chart-0"),
        ],
        "patch",
        "nodes",
    );
    let node_apply = file(
        "agent-node-apply.yaml",
        &format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {}\n  annotations:\n    {VM_ANNOTATION}: vm-chart-0\n",
            nodes[0]
        ),
    );
    forbid(
        &agent,
        "agent applies its own Node (server-side apply)",
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=forewarn-agent",
            "-f",
            &node_apply,
        ],
        "patch",
        "nodes",
    );
    forbid(
        &agent,
        "agent patches its own Node's status",
        &[
            "patch",
            "node",
            nodes[0],
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[]}}"#,
        ],
        "patch",
        "nodes/status",
    );
    let new_node = file(
        "agent-node-create.yaml",
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: chart-forged-node\n",
    );
    forbid(
        &agent,
        "agent creates a Node",
        &["create", "-f", &new_node],
        "create",
        "nodes",
    );
    forbid(
        &agent,
        "agent cordons its own node",
        &["cordon", nodes[0]],
        "get",
        "nodes",
    );
    forbid(
        &agent,
        "agent taints its own node",
        &["taint", "node", nodes[0], "forewarn.dev/x=y:NoSchedule"],
        "get",
        "nodes",
    );
    forbid(
        &unbound_agent,
        "agent token not bound to a pod annotates a Node",
        &[
            "patch",
            "node",
            nodes[0],
            "--type=merge",
            "-p",
            &merge_patch(VM_ANNOTATION, "vm-x"),
        ],
        "patch",
        "nodes",
    );
    let n0 = k.json(&["get", "node", nodes[0]]);
    assert!(
        n0["spec"]["unschedulable"].is_null() && n0["spec"]["taints"].is_null(),
        "{}",
        n0["spec"]
    );
    for n in [nodes[0], nodes[1]] {
        assert_eq!(annotation(&k, n), None, "{n} annotated by the agent");
    }
    assert!(
        !k.run(&["get", "node", "chart-forged-node"], None).ok,
        "the agent created a Node"
    );

    // A pod to evict.
    ensure_namespace(&k, "chart-victims", "baseline");
    k.ok_stdin(&["apply", "-f", "-"], "apiVersion: v1\nkind: Pod\nmetadata:\n  name: victim\n  namespace: chart-victims\nspec:\n  containers:\n  - name: c\n    image: example.invalid/app:1\n");
    let eviction = r#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"victim","namespace":"chart-victims"}}"#;
    let eviction_file = out_dir().join("eviction.json");
    std::fs::write(&eviction_file, eviction).unwrap();
    let ev = eviction_file.to_string_lossy().into_owned();
    deny(
        &agent,
        "agent evicts a pod",
        &[
            "create",
            "--raw",
            "/api/v1/namespaces/chart-victims/pods/victim/eviction",
            "-f",
            &ev,
        ],
        "forbidden",
    );
    deny(
        &agent,
        "agent reads secrets",
        &["get", "secrets", "-n", NS],
        "forbidden",
    );

    // A ScheduledEvent with the controller's status.
    let sev = "c0000000-0000-4000-8000-0000000000c7";
    k.run(
        &["delete", "scheduledevent", sev, "--ignore-not-found"],
        None,
    );
    for n in nodes {
        k.run(
            &[
                "delete",
                "scheduledeventreport",
                &format!("{sev}.{n}"),
                "--ignore-not-found",
            ],
            None,
        );
    }
    k.ok_stdin(&["create", "-f", "-"], &format!(
        r#"{{"apiVersion":"forewarn.dev/v1alpha1","kind":"ScheduledEvent","metadata":{{"name":"{sev}"}},
           "spec":{{"eventId":"{sev}","eventStatus":"Scheduled","eventType":"Reboot","resources":["vm-chart-1"]}}}}"#));
    k.ok(&[
        "patch",
        "scheduledevent",
        sev,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Draining","approval":{"reason":"waiting for the drain"}}}"#,
    ]);
    // Listing and watching events stays allowed: the agent sends the
    // approvals the controller decides, read from a watch of each event
    // (a field selector on its name). It never reads one by name.
    agent.ok(&["get", "scheduledevents"]);
    agent.ok(&[
        "get",
        "scheduledevents",
        "--field-selector",
        &format!("metadata.name={sev}"),
    ]);
    forbid(
        &agent,
        "agent reads a ScheduledEvent by name (get)",
        &["get", "scheduledevent", sev],
        "get",
        "scheduledevents",
    );

    // ScheduledEvents: no create, update, patch (server-side apply is a
    // patch) or delete, and nothing on their status.
    let forged = file(
        "agent-sev-create.yaml",
        &sev_yaml(&format!("{sev}-2"), "Scheduled", "vm-chart-1"),
    );
    forbid(
        &agent,
        "agent creates a ScheduledEvent",
        &["create", "-f", &forged],
        "create",
        "scheduledevents",
    );
    forbid(
        &agent,
        "agent applies a ScheduledEvent (server-side apply)",
        &[
            "apply",
            "--server-side",
            "--field-manager=forewarn-agent",
            "-f",
            &forged,
        ],
        "patch",
        "scheduledevents",
    );
    let mut changed = k.json(&["get", "scheduledevent", sev]);
    changed["spec"]["eventStatus"] = "Completed".into();
    let changed = file("agent-sev-replace.json", &changed.to_string());
    forbid(
        &agent,
        "agent replaces a ScheduledEvent (update)",
        &["replace", "-f", &changed],
        "update",
        "scheduledevents",
    );
    forbid(
        &agent,
        "agent patches a ScheduledEvent",
        &[
            "patch",
            "scheduledevent",
            sev,
            "--type=merge",
            "-p",
            r#"{"spec":{"eventStatus":"Completed"}}"#,
        ],
        "patch",
        "scheduledevents",
    );
    forbid(
        &agent,
        "agent deletes a ScheduledEvent",
        &["delete", "scheduledevent", sev],
        "delete",
        "scheduledevents",
    );
    forbid(
        &agent,
        "agent patches a ScheduledEvent's status",
        &[
            "patch",
            "scheduledevent",
            sev,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Approved"}}"#,
        ],
        "patch",
        "scheduledevents/status",
    );
    let mut status = k.json(&["get", "scheduledevent", sev]);
    status["status"]["phase"] = "Approved".into();
    let status = file("agent-sev-status.json", &status.to_string());
    forbid(
        &agent,
        "agent replaces a ScheduledEvent's status (update)",
        &["replace", "--subresource=status", "-f", &status],
        "update",
        "scheduledevents/status",
    );
    // As the agent once recorded a sent approval: server-side apply on the
    // status subresource (kube), with no GET first.
    let msg = apply_status(
        &agent.kubeconfig,
        sev,
        serde_json::json!({"approval": {"sentAt": "2026-01-01T00:00:01Z", "sentBy": nodes[0], "result": "Accepted"}}),
        forewarn::api::AGENT_MANAGER,
    )
    .expect_err("the agent applied a ScheduledEvent's status");
    assert!(
        msg.contains("403") && msg.contains("cannot patch resource \"scheduledevents/status\""),
        "agent applies a ScheduledEvent's status: not refused by RBAC: {msg}"
    );
    denials.borrow_mut().push(format!(
        "agent applies a ScheduledEvent's status (kube):\n  {msg}"
    ));
    let stored = k.json(&["get", "scheduledevent", sev]);
    assert_eq!(
        stored["spec"]["eventStatus"], "Scheduled",
        "{}",
        stored["spec"]
    );
    assert_eq!(
        stored["status"]["phase"], "Draining",
        "{}",
        stored["status"]
    );
    assert_eq!(
        stored["status"]["approval"]["reason"],
        "waiting for the drain"
    );
    assert!(
        stored["status"]["approval"]["sentBy"].is_null(),
        "{}",
        stored["status"]
    );
    assert!(
        !k.run(&["get", "scheduledevent", &format!("{sev}-2")], None)
            .ok,
        "the agent created a ScheduledEvent"
    );

    // Reports: its own node's, as the agent writes them (server-side
    // apply, a create and then a change); the admission policy refuses
    // another node's, and any from a token without a node name.
    let own = format!("{sev}.{}", nodes[0]);
    for status in ["Scheduled", "Started"] {
        let out = apply_report(
            &agent,
            &report_yaml(
                sev,
                nodes[0],
                "vm-chart-0",
                "Reboot",
                status,
                &["vm-chart-1"],
            ),
        );
        assert!(
            out.ok,
            "the agent may write its own report ({status}): {}",
            out.stderr
        );
    }
    let report = k.json(&["get", "scheduledeventreport", &own, "--show-managed-fields"]);
    assert_eq!(report["spec"]["report"]["node"], nodes[0]);
    assert_eq!(report["spec"]["report"]["eventStatus"], "Started");
    let managers: Vec<&str> = report["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert_eq!(managers, [forewarn::api::AGENT_MANAGER], "{managers:?}");
    agent.ok(&["get", "scheduledeventreports"]);
    let out = apply_report(
        &agent,
        &report_yaml(
            sev,
            nodes[1],
            "vm-chart-1",
            "Reboot",
            "Started",
            &["vm-chart-1"],
        ),
    );
    let expect = format!(
        "forewarn agent on node {} may write only its own ScheduledEventReports",
        nodes[0]
    );
    assert!(
        !out.ok && out.stderr.contains(&expect),
        "agent writes another node's report: not refused by the admission policy ({expect}): {}{}",
        out.stdout,
        out.stderr
    );
    denials.borrow_mut().push(format!(
        "agent writes another node's report:\n  {}",
        out.stderr.trim()
    ));
    let out = apply_report(
        &unbound_agent,
        &report_yaml(
            sev,
            nodes[0],
            "vm-chart-0",
            "Reboot",
            "Completed",
            &["vm-chart-1"],
        ),
    );
    assert!(
        !out.ok && out.stderr.contains("the token carries no node name"),
        "agent token not bound to a pod writes a report: {}{}",
        out.stdout,
        out.stderr
    );
    denials.borrow_mut().push(format!(
        "agent token not bound to a pod writes a report:\n  {}",
        out.stderr.trim()
    ));
    assert!(
        !k.run(
            &[
                "get",
                "scheduledeventreport",
                &format!("{sev}.{}", nodes[1])
            ],
            None
        )
        .ok,
        "the agent wrote another node's report"
    );
    assert_eq!(
        k.json(&["get", "scheduledeventreport", &own])["spec"]["report"]["eventStatus"],
        "Started"
    );
    forbid(
        &agent,
        "agent deletes its own report",
        &["delete", "scheduledeventreport", &own],
        "delete",
        "scheduledeventreports",
    );

    // Its VM's report (the fault and update domain the controller labels
    // its node with): its own node's, as the agent writes it (server-side
    // apply, a create and then a change); another node's is refused by
    // the admission policy, a name not its node's by the CRD, any from a
    // token without a node name; it may not read or delete one.
    let vm_report = |name: &str, node: &str, fd: &str| {
        format!(
            "apiVersion: forewarn.dev/v1alpha1\nkind: VirtualMachineReport\nmetadata:\n  name: {name}\nspec:\n  node: {node}\n  vm: vm-chart\n  platformFaultDomain: \"{fd}\"\n  platformUpdateDomain: \"0\"\n"
        )
    };
    for n in [nodes[0], nodes[1]] {
        k.run(
            &["delete", "virtualmachinereport", n, "--ignore-not-found"],
            None,
        );
    }
    for fd in ["1", "2"] {
        let out = apply_report(&agent, &vm_report(nodes[0], nodes[0], fd));
        assert!(
            out.ok,
            "the agent may write its own VM's report (fault domain {fd}): {}",
            out.stderr
        );
    }
    let stored = k.json(&[
        "get",
        "virtualmachinereport",
        nodes[0],
        "--show-managed-fields",
    ]);
    assert_eq!(stored["spec"]["platformFaultDomain"], "2", "{stored}");
    let out = apply_report(&agent, &vm_report(nodes[1], nodes[1], "0"));
    let expect = format!(
        "forewarn agent on node {} may write only its own VirtualMachineReports",
        nodes[0]
    );
    assert!(
        !out.ok && out.stderr.contains(&expect),
        "agent writes another node's VM report: not refused by the admission policy ({expect}): {}{}",
        out.stdout,
        out.stderr
    );
    denials.borrow_mut().push(format!(
        "agent writes another node's VM report:\n  {}",
        out.stderr.trim()
    ));
    let out = apply_report(&agent, &vm_report(nodes[1], nodes[0], "0"));
    assert!(
        !out.ok && out.stderr.contains("the name must be the node's"),
        "agent writes its VM report under another node's name: not refused by the CRD: {}{}",
        out.stdout,
        out.stderr
    );
    denials.borrow_mut().push(format!(
        "agent writes its VM report under another node's name:\n  {}",
        out.stderr.trim()
    ));
    let out = apply_report(&unbound_agent, &vm_report(nodes[0], nodes[0], "0"));
    assert!(
        !out.ok && out.stderr.contains("the token carries no node name"),
        "agent token not bound to a pod writes a VM report: {}{}",
        out.stdout,
        out.stderr
    );
    assert!(
        !k.run(&["get", "virtualmachinereport", nodes[1]], None).ok,
        "the agent wrote another node's VM report"
    );
    assert_eq!(
        k.json(&["get", "virtualmachinereport", nodes[0]])["spec"]["platformFaultDomain"],
        "2"
    );
    forbid(
        &agent,
        "agent lists VM reports",
        &["get", "virtualmachinereports"],
        "list",
        "virtualmachinereports",
    );
    forbid(
        &agent,
        "agent deletes its own VM report",
        &["delete", "virtualmachinereport", nodes[0]],
        "delete",
        "virtualmachinereports",
    );

    // --- controller: what it needs works, Secrets do not.
    deny(
        &controller,
        "controller reads secrets",
        &["get", "secrets", "-n", NS],
        "forbidden",
    );
    deny(
        &controller,
        "controller lists secrets cluster-wide",
        &["get", "secrets", "-A"],
        "forbidden",
    );
    let lease_file = out_dir().join("lease-default.yaml");
    std::fs::write(&lease_file, "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: forewarn-controller\n  namespace: default\n").unwrap();
    deny(
        &controller,
        "controller creates a Lease outside its namespace",
        &["create", "-f", &lease_file.to_string_lossy()],
        "forbidden",
    );
    deny(
        &controller,
        "controller creates a pod",
        &["run", "x", "--image=example.invalid/x", "-n", NS],
        "forbidden",
    );
    // A Node's cordon as the controller writes it: a merge patch, never a
    // read by name first (kubectl cordon and patch read it first, which
    // the controller may not: it knows Nodes from its watch).
    for unschedulable in [true, false] {
        merge_patch_as(
            &controller.kubeconfig,
            ("", "v1", "Node", "nodes"),
            nodes[2],
            serde_json::json!({"spec": {"unschedulable": unschedulable}}),
        )
        .unwrap_or_else(|e| panic!("the controller cannot cordon a node: {e}"));
        assert_eq!(
            k.json(&["get", "node", nodes[2]])["spec"]["unschedulable"] == true,
            unschedulable
        );
    }
    forbid(
        &controller,
        "controller reads a Node by name (get)",
        &["get", "node", nodes[2]],
        "get",
        "nodes",
    );
    controller.ok(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        &format!("spec.nodeName={}", nodes[2]),
    ]);
    controller.ok(&[
        "create",
        "--raw",
        "/api/v1/namespaces/chart-victims/pods/victim/eviction",
        "-f",
        &ev,
    ]);
    apply_status(
        &controller.kubeconfig,
        sev,
        serde_json::json!({"phase": "Approved", "approval": {"decidedAt": "2026-01-01T00:00:00Z"}}),
        forewarn::api::CONTROLLER_MANAGER,
    )
    .unwrap_or_else(|e| panic!("the controller cannot write the approval decision: {e}"));
    // It alone writes ScheduledEvents: creates one first reported by an
    // agent, patches its spec, deletes reports and events.
    controller.ok_stdin(
        &["create", "-f", "-"],
        &sev_yaml(&format!("{sev}-2"), "Scheduled", "vm-chart-0"),
    );
    merge_patch_as(
        &controller.kubeconfig,
        (
            "forewarn.dev",
            "v1alpha1",
            "ScheduledEvent",
            "scheduledevents",
        ),
        &format!("{sev}-2"),
        serde_json::json!({"spec": {"eventStatus": "Started"}}),
    )
    .unwrap_or_else(|e| panic!("the controller cannot patch a ScheduledEvent's spec: {e}"));
    forbid(
        &controller,
        "controller reads a ScheduledEvent by name (get)",
        &["get", "scheduledevent", sev],
        "get",
        "scheduledevents",
    );
    controller.ok(&["get", "scheduledeventreports"]);
    controller.ok(&["delete", "scheduledeventreport", &own]);
    // The agents' VM reports, and a node's fault-domain label as the
    // controller writes it (a merge patch of the label, no read first).
    controller.ok(&["get", "virtualmachinereports"]);
    merge_patch_as(
        &controller.kubeconfig,
        ("", "v1", "Node", "nodes"),
        nodes[2],
        serde_json::json!({"metadata": {"labels": {forewarn::topology::FAULT_DOMAIN_LABEL: "2"}}}),
    )
    .unwrap_or_else(|e| panic!("the controller cannot label a node: {e}"));
    merge_patch_as(
        &controller.kubeconfig,
        ("", "v1", "Node", "nodes"),
        nodes[2],
        serde_json::json!({"metadata": {"labels": {forewarn::topology::FAULT_DOMAIN_LABEL: null}}}),
    )
    .unwrap_or_else(|e| panic!("the controller cannot unlabel a node: {e}"));
    forbid(
        &controller,
        "controller deletes a VM report",
        &["delete", "virtualmachinereport", nodes[0]],
        "delete",
        "virtualmachinereports",
    );
    k.ok(&["delete", "virtualmachinereport", nodes[0]]);
    controller.ok(&["delete", "scheduledevent", sev, &format!("{sev}-2")]);
    // The admission policy that confines the agents, and its binding: it
    // may read those two (--agent-policy), nothing else of the kind.
    for kind in [
        "validatingadmissionpolicy",
        "validatingadmissionpolicybinding",
    ] {
        controller.ok(&["get", kind, AGENT_POLICY]);
    }
    forbid(
        &controller,
        "controller lists admission policies",
        &["get", "validatingadmissionpolicies"],
        "list",
        "validatingadmissionpolicies",
    );
    forbid(
        &controller,
        "controller reads another admission policy binding",
        &["get", "validatingadmissionpolicybinding", "other"],
        "get",
        "validatingadmissionpolicybindings",
    );
    // The Lease as the controller writes it: a create, then replaces.
    let lease = |holder: &str| {
        format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: forewarn-controller\n  namespace: {NS}\nspec:\n  holderIdentity: {holder}\n"
        )
    };
    // (Another test's controller may have left it, released.)
    k.ok(&[
        "delete",
        "lease",
        "-n",
        NS,
        "forewarn-controller",
        "--ignore-not-found",
    ]);
    controller.ok_stdin(&["create", "-f", "-"], &lease("chart-test"));
    controller.ok_stdin(&["replace", "-f", "-"], &lease("chart-test-2"));
    k.ok(&["delete", "lease", "-n", NS, "forewarn-controller"]);

    // What each ServiceAccount may do, as the API server sees it.
    for (name, who) in [("agent", &agent), ("controller", &controller)] {
        let list = who.ok(&["auth", "can-i", "--list", "-n", NS]);
        std::fs::write(out_dir().join(format!("can-i-{name}.txt")), &list).unwrap();
        record += &format!("kubectl auth can-i --list -n {NS} ({name} token):\n{list}\n");
        assert!(
            !list.contains("secrets"),
            "{name} may touch secrets:\n{list}"
        );
        assert!(
            !list.lines().any(|l| l.starts_with("*.*")),
            "{name} has a wildcard:\n{list}"
        );
        // Exactly the chart's rules (docs/security.md, "What each role may do"), plus
        // the self-reviews every authenticated user may create.
        let want: &[(&str, &str, &[&str])] = if name == "agent" {
            &[
                (
                    "scheduledeventreports.forewarn.dev",
                    "",
                    &["create", "list", "patch", "watch"],
                ),
                (
                    "virtualmachinereports.forewarn.dev",
                    "",
                    &["create", "patch"],
                ),
                ("scheduledevents.forewarn.dev", "", &["list", "watch"]),
                ("configmaps", "forewarn-witnesses", &["list", "watch"]),
                (
                    "customresourcedefinitions.apiextensions.k8s.io",
                    "scheduledeventreports.forewarn.dev",
                    &["get"],
                ),
                (
                    "customresourcedefinitions.apiextensions.k8s.io",
                    "virtualmachinereports.forewarn.dev",
                    &["get"],
                ),
            ]
        } else {
            &[
                (
                    "scheduledevents.forewarn.dev",
                    "",
                    &["create", "delete", "list", "patch", "watch"],
                ),
                ("scheduledevents.forewarn.dev/status", "", &["patch"]),
                (
                    "scheduledeventreports.forewarn.dev",
                    "",
                    &["delete", "list", "watch"],
                ),
                (
                    "virtualmachinereports.forewarn.dev",
                    "",
                    &["list", "patch", "watch"],
                ),
                ("nodes", "", &["list", "patch", "watch"]),
                ("nodes/status", "", &["patch"]),
                ("pods", "", &["list", "patch", "watch"]),
                ("pods/eviction", "", &["create"]),
                ("poddisruptionbudgets.policy", "", &["list", "watch"]),
                ("configmaps", "forewarn-witnesses", &["patch"]),
                ("events.events.k8s.io", "", &["create", "patch"]),
                (
                    "validatingadmissionpolicies.admissionregistration.k8s.io",
                    AGENT_POLICY,
                    &["get"],
                ),
                (
                    "validatingadmissionpolicybindings.admissionregistration.k8s.io",
                    AGENT_POLICY,
                    &["get"],
                ),
                (
                    "customresourcedefinitions.apiextensions.k8s.io",
                    "scheduledevents.forewarn.dev",
                    &["get"],
                ),
                (
                    "customresourcedefinitions.apiextensions.k8s.io",
                    "scheduledeventreports.forewarn.dev",
                    &["get"],
                ),
                (
                    "customresourcedefinitions.apiextensions.k8s.io",
                    "virtualmachinereports.forewarn.dev",
                    &["get"],
                ),
                ("leases.coordination.k8s.io", "", &["create"]),
                (
                    "leases.coordination.k8s.io",
                    "forewarn-controller",
                    &["get", "list", "update", "watch"],
                ),
            ]
        };
        let mut got = can_i_rules(&list);
        got.retain(|(resource, _), verbs| {
            !(resource.starts_with("selfsubject") && verbs.iter().eq(["create"]))
        });
        let want: std::collections::BTreeMap<(String, String), std::collections::BTreeSet<String>> =
            want.iter()
                .map(|(r, names, verbs)| {
                    (
                        (r.to_string(), names.to_string()),
                        verbs.iter().map(|v| v.to_string()).collect(),
                    )
                })
                .collect();
        assert_eq!(
            got, want,
            "{name}: kubectl auth can-i --list is not the chart's rules:\n{list}"
        );
    }
    record += &format!("denials:\n{}\n", denials.borrow().join("\n"));
    std::fs::write(out_dir().join("confinement.txt"), &record).unwrap();
    println!("{record}");
}

/// The controller's `pods patch` (the notices of the pods that take part)
/// is confined by the chart's admission policy
/// `<fullname>-controller-pod-notices`: with the chart's controller token,
/// a notice annotation can be set, changed and removed, and an
/// acknowledgement removed (what the API server stored is checked, with
/// its field manager); a label, another annotation, an acknowledgement
/// added or changed, the spec or a finalizer are refused by that policy.
/// Another account (the admin) is not confined by it.
#[test]
fn controller_may_change_nothing_on_a_pod_but_its_notices() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let ns = "chart-notices";
    ensure_namespace(&k, ns, "baseline");
    k.run(
        &[
            "delete",
            "pod",
            "-n",
            ns,
            "db-0",
            "--ignore-not-found",
            "--grace-period=1",
        ],
        None,
    );
    k.ok_stdin(
        &["create", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: db-0\n  namespace: {ns}\n  labels:\n    app: db\n    forewarn.dev/acknowledge: \"true\"\n  annotations:\n    team: storage\n    ack.forewarn.dev/ev0: EV0\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: db\n    image: registry.k8s.io/pause:3.10\n"
        ),
    );
    let controller = token_kubeconfig(&k, "notices-controller", &token(&k, CONTROLLER_SA, None));
    let patch = |body: Value| pod_merge_patch_as(&controller.kubeconfig, ns, "db-0", body);
    let annotations =
        || k.json(&["get", "pod", "-n", ns, "db-0"])["metadata"]["annotations"].clone();

    // Allowed: a notice set, changed; an acknowledgement removed.
    let key = "notice.forewarn.dev/ev1";
    patch(serde_json::json!({"metadata": {"annotations": {key: "eventId=EV1 phase=Pending"}}}))
        .unwrap_or_else(|e| panic!("the controller cannot write a notice: {e}"));
    patch(serde_json::json!({"metadata": {"annotations": {key: "eventId=EV1 phase=Draining"}}}))
        .unwrap_or_else(|e| panic!("the controller cannot change a notice: {e}"));
    assert_eq!(annotations()[key], "eventId=EV1 phase=Draining");
    let pod = k.json(&["get", "pod", "-n", ns, "db-0", "--show-managed-fields"]);
    let owners: Vec<String> = pod["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter(|m| m["fieldsV1"]["f:metadata"]["f:annotations"][format!("f:{key}")].is_object())
        .map(|m| {
            format!(
                "{} {}",
                m["manager"].as_str().unwrap_or(""),
                m["operation"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        owners,
        ["forewarn-controller Update"],
        "{}",
        pod["metadata"]["managedFields"]
    );

    // Refused by the policy, each leaving the pod as it was.
    let refused: [(&str, Value); 8] = [
        (
            "a label",
            serde_json::json!({"metadata": {"labels": {"forewarn.dev/acknowledge": "false"}}}),
        ),
        (
            "another annotation added",
            serde_json::json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        (
            "another annotation changed",
            serde_json::json!({"metadata": {"annotations": {"team": "web"}}}),
        ),
        (
            "another annotation removed",
            serde_json::json!({"metadata": {"annotations": {"team": null}}}),
        ),
        (
            "an acknowledgement written",
            serde_json::json!({"metadata": {"annotations": {"ack.forewarn.dev/ev1": "EV1"}}}),
        ),
        (
            "an acknowledgement changed",
            serde_json::json!({"metadata": {"annotations": {"ack.forewarn.dev/ev0": "EV9"}}}),
        ),
        (
            "the spec",
            serde_json::json!({"spec": {"activeDeadlineSeconds": 60}}),
        ),
        (
            "a finalizer",
            serde_json::json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        ),
    ];
    let before = k.json(&["get", "pod", "-n", ns, "db-0"]);
    for (what, body) in refused {
        let e = patch(body).expect_err(what);
        assert!(
            e.contains(CONTROLLER_POD_POLICY) && e.contains("(403)"),
            "{what}: refused, but not by {CONTROLLER_POD_POLICY}: {e}"
        );
    }
    let after = k.json(&["get", "pod", "-n", ns, "db-0"]);
    assert_eq!(
        before["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );

    // Removing the notice and an acknowledgement together, as the end of an event does.
    patch(
        serde_json::json!({"metadata": {"annotations": {key: null, "ack.forewarn.dev/ev0": null}}}),
    )
    .unwrap_or_else(|e| {
        panic!("the controller cannot remove a notice and its acknowledgement: {e}")
    });
    assert_eq!(annotations(), serde_json::json!({"team": "storage"}));
    // The policy confines the controller only.
    k.ok(&[
        "annotate",
        "pod",
        "-n",
        ns,
        "db-0",
        "ack.forewarn.dev/ev1=EV1",
        "x=y",
    ]);
    k.ok(&["delete", "namespace", ns, "--timeout=90s"]);
}

/// The trust model (docs/trust.md) with the chart's own tokens (each
/// agent's bound to the chart's agent pod on its node) and a real
/// controller process holding the controller's token: an agent may write no
/// `ScheduledEvent` and no other node's report; two other agents agreeing
/// on a 5 s `Freeze` do not override node B's own `Reboot` (B stays
/// cordoned, the approval stays bound to B's content), and their word that
/// it ended does not release B; an event agent A reports naming only B's VM
/// moves nothing; B's own agent's report that the event left releases B.
#[test]
fn one_nodes_agent_can_neither_drain_nor_release_another_node() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install(&k, &c);
    let (a, b, cc) = ("node-000000", "node-000001", "node-000002");
    let (vm_a, vm_b, vm_c) = ("vm-trust-0", "vm-trust-1", "vm-trust-2");
    for n in [a, b, cc] {
        k.run(&["uncordon", n], None);
    }
    let agent_token = |node: &str, name: &str| {
        let (pod, uid) = agent_pod_on(&k, node);
        token_kubeconfig(&k, name, &token(&k, AGENT_SA, Some((&pod, &uid))))
    };
    let agent_a = agent_token(a, "trust-agent-a");
    let agent_b = agent_token(b, "trust-agent-b");
    let agent_c = agent_token(cc, "trust-agent-c");
    let controller = token_kubeconfig(&k, "trust-controller", &token(&k, CONTROLLER_SA, None));
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
    let (forged, live) = (
        "f0000000-0000-4000-8000-0000000000fe",
        "e0000000-0000-4000-8000-0000000000e1",
    );
    let clean = || {
        k.run(
            &["delete", "scheduledeventreports", "--all", "--wait=false"],
            None,
        );
        for sev in [forged, live] {
            k.run(
                &["delete", "scheduledevent", sev, "--ignore-not-found"],
                None,
            );
        }
    };
    clean();
    // The nodes have no providerID: each node's VM is the one its agent
    // stated first in its VirtualMachineReport.
    state_vms(&k, &[(a, vm_a), (b, vm_b), (cc, vm_c)]);
    let ctl = ControllerProc::start(&controller.kubeconfig, "trust-controller");
    eventually("the controller leads", Duration::from_secs(120), || {
        ctl.log().contains("Leading: reconciling").then_some(())
    });

    // 0. No agent writes a ScheduledEvent: only the controller does.
    let out = agent_a.run(
        &["create", "-f", "-"],
        Some(&sev_yaml(forged, "Scheduled", vm_b)),
    );
    assert!(
        !out.ok && out.stderr.contains("forbidden"),
        "agent A created a ScheduledEvent: {}{}",
        out.stdout,
        out.stderr
    );

    // 1. B's own agent reports a Reboot of its VM: the controller creates
    //    the event from it and cordons B.
    let out = apply_report(
        &agent_b,
        &report_yaml(live, b, vm_b, "Reboot", "Scheduled", &[vm_b]),
    );
    assert!(out.ok, "agent B may write its own report: {}", out.stderr);
    eventually(
        "node B cordoned on its own agent's report",
        Duration::from_secs(120),
        || unschedulable(&k, b).then_some(()),
    );
    let ev = k.json(&["get", "scheduledevent", live]);
    assert_eq!(ev["spec"]["eventType"], "Reboot", "{}", ev["spec"]);
    let managers: Vec<String> = ev["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["manager"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        managers.iter().all(|m| m == "forewarn-controller"),
        "the ScheduledEvent has other writers: {managers:?}"
    );
    let reboot_digest = forewarn::api::identity_digest(
        live,
        "Reboot",
        "Platform",
        "VirtualMachine",
        &[vm_b.to_string()],
        -1,
    );

    // 2. Agents A and C report the same EventId as a 5 s Freeze of all three
    //    VMs (policy: approve at once, no cordon). B is handled on its own
    //    agent's report: it stays cordoned, and the event says they disagree.
    let all = [vm_a, vm_c, vm_b];
    for (agent, node, vm) in [(&agent_a, a, vm_a), (&agent_c, cc, vm_c)] {
        let out = apply_report(
            agent,
            &report_yaml(live, node, vm, "Freeze", "Scheduled", &all),
        );
        assert!(
            out.ok,
            "agent on {node} may write its own report: {}",
            out.stderr
        );
    }
    let why = eventually(
        "ReportsDisagree on the live event",
        Duration::from_secs(120),
        || condition(&k, live, "ReportsDisagree").filter(|c| c["status"] == "True"),
    );
    println!("disagreement: {why}");
    assert!(
        why["message"].as_str().unwrap_or_default().contains(b),
        "{why}"
    );
    let recorded = eventually("a ReportsDisagree Event", Duration::from_secs(120), || {
        let events = k.json(&[
            "get",
            "events.events.k8s.io",
            "-A",
            "--field-selector",
            "reason=ReportsDisagree",
        ]);
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["regarding"]["name"] == live)
            .cloned()
    });
    println!("Event: {}", recorded["note"]);
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        unschedulable(&k, b),
        "node B was released on other agents' Freeze"
    );
    let ev = k.json(&["get", "scheduledevent", live]);
    let digest = &ev["status"]["approval"]["digest"];
    assert!(
        digest.is_null() || *digest == reboot_digest.as_str(),
        "an approval was decided for other content than B's own: {}",
        ev["status"]
    );

    // 3. A and C say the event left their documents: B stays cordoned.
    for (agent, node, vm) in [(&agent_a, a, vm_a), (&agent_c, cc, vm_c)] {
        let out = apply_report(
            agent,
            &report_yaml(live, node, vm, "Freeze", "Completed", &all),
        );
        assert!(
            out.ok,
            "agent on {node} may write its own report: {}",
            out.stderr
        );
    }
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        unschedulable(&k, b),
        "node B was released on other agents' word alone"
    );

    // 4. Agent A reports an event naming only B's VM: B is not moved.
    let out = apply_report(
        &agent_a,
        &report_yaml(forged, a, vm_a, "Reboot", "Scheduled", &[vm_b]),
    );
    assert!(out.ok, "agent A may write its own report: {}", out.stderr);
    let unconfirmed = eventually(
        "NodesUnconfirmed on the forged event",
        Duration::from_secs(120),
        || condition(&k, forged, "NodesUnconfirmed").filter(|c| c["status"] == "True"),
    );
    println!("forged event: {unconfirmed}");
    assert!(
        unconfirmed["message"]
            .as_str()
            .unwrap_or_default()
            .contains(b)
    );
    std::thread::sleep(Duration::from_secs(5));
    let node_b = k.json(&["get", "node", b]);
    let held_for = node_b["metadata"]["annotations"]["forewarn.dev/cordoned-for"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        !held_for.contains(forged),
        "node B held for the forged event: {held_for}"
    );
    let ev = k.json(&["get", "scheduledevent", forged]);
    assert!(
        ev["status"]["approval"]["decidedAt"].is_null(),
        "an approval was decided for a forged event: {}",
        ev["status"]
    );

    // 5. Agent A may not write B's report, nor take its name.
    let out = apply_report(
        &agent_a,
        &report_yaml(live, b, vm_b, "Reboot", "Completed", &[vm_b]),
    );
    assert!(
        !out.ok
            && out.stderr.contains(&format!(
                "forewarn agent on node {a} may write only its own ScheduledEventReports"
            )),
        "agent A wrote node B's report: {}{}",
        out.stdout,
        out.stderr
    );
    let out = apply_report(
        &agent_a,
        &report_yaml_named(
            &format!("{forged}.{b}"),
            forged,
            a,
            vm_a,
            "Reboot",
            "Scheduled",
            &[vm_b],
        ),
    );
    assert!(
        !out.ok
            && out
                .stderr
                .contains("the name must be <scheduledEvent>.<node>"),
        "agent A took node B's report name: {}{}",
        out.stdout,
        out.stderr
    );

    // 6. B's own agent reports the event gone: now B is released.
    let out = apply_report(
        &agent_b,
        &report_yaml(live, b, vm_b, "Reboot", "Completed", &[vm_b]),
    );
    assert!(out.ok, "agent B may write its own report: {}", out.stderr);
    eventually(
        "node B released on its own agent's report",
        Duration::from_secs(120),
        || (!unschedulable(&k, b)).then_some(()),
    );
    drop(ctl);
    clean();
}
