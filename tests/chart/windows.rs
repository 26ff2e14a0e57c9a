//! `agent.windows`: the HostProcess DaemonSet as rendered, and its pod on a
//! Windows KWOK node, confined like a Linux agent's.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::install::dry_run_apply;
use crate::on_cluster::{
    agent_pod_on, apply_report, install, install_with, report_yaml, token, token_kubeconfig,
};
use crate::{
    AGENT_POLICY, AGENT_SA, Kubectl, NS, admin, cluster, documents, ensure_namespace, eventually,
    find_doc, render,
};

/// securityContext fields the API server refuses in a pod whose `spec.os`
/// is windows (and which a HostProcess container cannot honour).
const LINUX_ONLY_SECURITY_FIELDS: [&str; 11] = [
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "fsGroup",
    "seccompProfile",
    "readOnlyRootFilesystem",
    "capabilities",
    "allowPrivilegeEscalation",
    "seLinuxOptions",
    "appArmorProfile",
    "privileged",
];

/// `agent.windows`: no Windows DaemonSet by default; with it on, a
/// HostProcess DaemonSet on Windows nodes that runs the Linux agent's flags,
/// environment and probes with its ServiceAccount, and no Linux-only
/// security field; the Linux DaemonSet stays on Linux nodes.
#[test]
fn windows_agents_render_only_when_enabled_as_host_process_pods() {
    let docs = documents(&render(&[]));
    assert!(
        find_doc(&docs, "DaemonSet", "forewarn-agent-windows").is_none(),
        "a Windows DaemonSet by default"
    );
    assert_eq!(
        docs.iter().filter(|d| d["kind"] == "DaemonSet").count(),
        1,
        "one DaemonSet by default"
    );

    // The Linux agents stay on Linux nodes whatever agent.nodeSelector says.
    let docs = documents(&render(&[
        "--set",
        "agent.windows.enabled=true",
        "--set-json",
        r#"agent.nodeSelector={"pool":"a","kubernetes.io/os":"windows"}"#,
    ]));
    let linux = find_doc(&docs, "DaemonSet", "forewarn-agent").expect("the Linux DaemonSet");
    assert_eq!(
        linux["spec"]["template"]["spec"]["nodeSelector"],
        serde_json::json!({"kubernetes.io/os": "linux", "pool": "a"})
    );
    let docs = documents(&render(&["--set", "agent.windows.enabled=true"]));
    let linux = find_doc(&docs, "DaemonSet", "forewarn-agent").expect("the Linux DaemonSet");
    let lpod = &linux["spec"]["template"]["spec"];
    assert_eq!(
        lpod["nodeSelector"],
        serde_json::json!({"kubernetes.io/os": "linux"})
    );
    let win =
        find_doc(&docs, "DaemonSet", "forewarn-agent-windows").expect("the Windows DaemonSet");
    let pod = &win["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["os"]["name"], "windows");
    assert_eq!(
        pod["nodeSelector"],
        serde_json::json!({"kubernetes.io/os": "windows"})
    );
    assert_eq!(pod["serviceAccountName"], lpod["serviceAccountName"]);
    assert_eq!(pod["serviceAccountName"], AGENT_SA);
    for k in [
        "tolerations",
        "priorityClassName",
        "dnsPolicy",
        "terminationGracePeriodSeconds",
        "automountServiceAccountToken",
    ] {
        assert_eq!(pod[k], lpod[k], "{k}");
    }
    let local_service = serde_json::json!({
        "hostProcess": true,
        "runAsUserName": "NT AUTHORITY\\Local service",
    });
    assert_eq!(
        pod["securityContext"],
        serde_json::json!({"windowsOptions": local_service})
    );
    let c = &pod["containers"][0];
    let lc = &lpod["containers"][0];
    assert_eq!(
        c["securityContext"],
        serde_json::json!({"windowsOptions": local_service})
    );
    for sc in [&pod["securityContext"], &c["securityContext"]] {
        for f in LINUX_ONLY_SECURITY_FIELDS {
            assert!(sc.get(f).is_none(), "{f} in {sc}");
        }
    }
    assert_eq!(
        c["command"],
        serde_json::json!(["$CONTAINER_SANDBOX_MOUNT_POINT/forewarn.exe"])
    );
    for k in [
        "image",
        "args",
        "env",
        "ports",
        "livenessProbe",
        "readinessProbe",
    ] {
        assert_eq!(c[k], lc[k], "{k}");
    }
    // Agent pods to the controller (src/controller/observe/pods.rs) and to
    // the metrics Service: the same role labels, plus the selector's own.
    let labels = &win["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/component"], "agent");
    assert_eq!(labels["app.kubernetes.io/part-of"], "forewarn");
    assert_eq!(
        win["spec"]["selector"]["matchLabels"]["forewarn.dev/os"],
        "windows"
    );
    assert_eq!(linux["spec"]["selector"], {
        let d = documents(&render(&[]));
        find_doc(&d, "DaemonSet", "forewarn-agent").expect("Linux DaemonSet")["spec"]["selector"]
            .clone()
    });
    // `helm test` checks both DaemonSets, and may read both.
    let test = documents(&render(&[
        "--set",
        "agent.windows.enabled=true",
        "--show-only",
        "templates/tests/check-install.yaml",
    ]));
    let pod = test
        .iter()
        .find(|d| d["kind"] == "Pod")
        .expect("the test Pod");
    let args: Vec<String> = pod["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    assert!(
        args.contains(&"--agent-daemonset=forewarn-agent".to_string())
            && args.contains(&"--agent-daemonset=forewarn-agent-windows".to_string()),
        "{args:?}"
    );
    let role = test.iter().find(|d| d["kind"] == "Role").expect("Role");
    assert!(
        role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .any(|r| r["resourceNames"]
                == serde_json::json!(["forewarn-agent", "forewarn-agent-windows"])),
        "{role}"
    );
}

/// A KWOK node labelled `kubernetes.io/os: windows` (KWOK fakes its kubelet
/// and the pods put on it, as for the cluster's other nodes); deleted when
/// dropped.
struct WindowsNode {
    k: Kubectl,
    name: String,
}

impl WindowsNode {
    fn create(k: &Kubectl, name: &str) -> WindowsNode {
        let node = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "kubernetes.io/os": "windows",
                    "kubernetes.io/arch": "amd64",
                    "kubernetes.io/hostname": name,
                    "type": "kwok",
                },
            },
        });
        k.ok_stdin(&["apply", "-f", "-"], &node.to_string());
        WindowsNode {
            k: k.clone(),
            name: name.into(),
        }
    }
}

impl Drop for WindowsNode {
    fn drop(&mut self) {
        self.k.run(
            &[
                "delete",
                "node",
                &self.name,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

/// `agent.windows.enabled` on the API server: the rendered chart is accepted;
/// installed, the Windows DaemonSet puts one HostProcess pod on a Windows
/// node (and the Linux one none), the controller counts that pod as the
/// node's agent, `helm test`'s check reads both DaemonSets with its own
/// RBAC, and a token bound to that pod is confined by the same admission
/// policy as a Linux agent's: its own node's reports only.
#[test]
fn windows_agents_run_on_windows_nodes_and_are_confined_like_linux_agents() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    ensure_namespace(&k, NS, "privileged");
    let enabled = ["--set", "agent.windows.enabled=true"];
    let rendered = render(&[
        "--set",
        "agent.windows.enabled=true",
        "--show-only",
        "templates/agent-daemonset-windows.yaml",
    ]);
    let lines = dry_run_apply(&k, &rendered);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("daemonset.apps/forewarn-agent-windows ")),
        "{lines:?}"
    );
    install_with(&k, &c, &enabled);
    let win = WindowsNode::create(&k, "node-win-000000");
    let node = win.name.as_str();

    // One agent pod on the Windows node, Ready (KWOK), as the server stored it.
    let pod = eventually(
        "the Windows agent pod Ready",
        Duration::from_secs(120),
        || {
            let pods = k.json(&[
                "get",
                "pods",
                "-n",
                NS,
                "-l",
                "app.kubernetes.io/component=agent",
                "--field-selector",
                &format!("spec.nodeName={node}"),
            ]);
            let items = pods["items"].as_array()?.clone();
            let ready = |p: &Value| {
                p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            };
            (items.len() == 1 && ready(&items[0])).then(|| items[0].clone())
        },
    );
    let owner = &pod["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"]),
        (
            &serde_json::json!("DaemonSet"),
            &serde_json::json!("forewarn-agent-windows")
        )
    );
    let spec = &pod["spec"];
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["os"]["name"], "windows");
    assert_eq!(spec["serviceAccountName"], AGENT_SA);
    assert_eq!(
        spec["securityContext"]["windowsOptions"]["hostProcess"],
        true
    );
    let sc = &spec["containers"][0]["securityContext"];
    assert_eq!(sc["windowsOptions"]["hostProcess"], true);
    assert_eq!(
        sc["windowsOptions"]["runAsUserName"],
        "NT AUTHORITY\\Local service"
    );
    for s in [&spec["securityContext"], sc] {
        for f in LINUX_ONLY_SECURITY_FIELDS {
            assert!(s.get(f).is_none(), "the server stored {f}: {s}");
        }
    }
    let win_ds = k.json(&["get", "-n", NS, "daemonset", "forewarn-agent-windows"]);
    assert_eq!(
        win_ds["status"]["desiredNumberScheduled"], 1,
        "{}",
        win_ds["status"]
    );
    let linux_ds = k.json(&["get", "-n", NS, "daemonset", "forewarn-agent"]);
    assert_eq!(
        linux_ds["status"]["desiredNumberScheduled"], 3,
        "the Linux agents stay off the Windows node: {}",
        linux_ds["status"]
    );
    // The controller's notion of an agent up on its node.
    let typed: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(pod.clone()).expect("a Pod");
    assert_eq!(
        forewarn::controller::observe::pods::agent_pod(&typed),
        Some(true)
    );

    // `helm test`'s check, with the RBAC the chart gives it.
    let rbac: String = documents(&render(&[
        "--set",
        "agent.windows.enabled=true",
        "--show-only",
        "templates/tests/check-install.yaml",
    ]))
    .into_iter()
    .filter(|d| d["kind"] != "Pod")
    .map(|d| serde_json::to_string(&d).expect("json") + "\n")
    .collect();
    k.ok_stdin(&["apply", "--server-side", "-f", "-"], &rbac);
    let tester = token_kubeconfig(
        &k,
        "check-install-windows",
        &token(&k, "forewarn-test", None),
    );
    let out = eventually(
        "both agent DaemonSets Ready",
        Duration::from_secs(120),
        || {
            let out = Command::new(env!("CARGO_BIN_EXE_forewarn"))
                .args([
                    "check-install",
                    "--namespace",
                    NS,
                    "--agent-daemonset",
                    "forewarn-agent",
                    "--agent-daemonset",
                    "forewarn-agent-windows",
                ])
                .env("KUBECONFIG", &tester.kubeconfig)
                .output()
                .expect("run forewarn check-install");
            let out = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.contains("ok   agents (DaemonSet forewarn-agent): 3 of 3 Ready")
                && out.contains("ok   agents (DaemonSet forewarn-agent-windows): 1 of 1 Ready"))
            .then_some(out)
        },
    );
    println!("{out}");
    assert!(!out.contains("forbidden"), "{out}");

    // The pod-bound token names the Windows node; the agents' policy lets it
    // write that node's reports and no other's.
    let (pod_name, pod_uid) = agent_pod_on(&k, node);
    let agent = token_kubeconfig(
        &k,
        "windows-agent",
        &token(&k, AGENT_SA, Some((&pod_name, &pod_uid))),
    );
    let who = agent.json(&["auth", "whoami"]);
    assert_eq!(
        who["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"],
        serde_json::json!([node]),
        "{}",
        who["status"]
    );
    let event = "5f0f8a0e-3c1d-4b7a-9e2f-0123456789ab";
    let out = apply_report(
        &agent,
        &report_yaml(event, node, "vm-win", "Reboot", "Scheduled", &["vm-win"]),
    );
    assert!(out.ok, "its own node's report was refused: {}", out.stderr);
    let stored = k.json(&["get", "scheduledeventreport", &format!("{event}.{node}")]);
    assert_eq!(stored["spec"]["report"]["node"], node);
    let out = apply_report(
        &agent,
        &report_yaml(
            event,
            "node-000000",
            "vm-0",
            "Reboot",
            "Scheduled",
            &["vm-0"],
        ),
    );
    println!("another node's report: {}", out.stderr.trim());
    assert!(!out.ok, "the Windows agent wrote another node's report");
    assert!(
        out.stderr.contains(AGENT_POLICY)
            && out.stderr.contains(&format!(
                "forewarn agent on node {node} may write only its own"
            )),
        "refused, but not by the agents' policy: {}",
        out.stderr
    );
    let other = k.run(
        &[
            "get",
            "scheduledeventreport",
            &format!("{event}.node-000000"),
        ],
        None,
    );
    assert!(!other.ok, "another node's report was stored");
    // Another node's VirtualMachineReport, with the VM it already states
    // when one is stored (an earlier test's agent may have written it): the
    // CRD refuses a change of `spec.vm` before any admission policy sees
    // the write, so only an unchanged VM leaves the refusal to the agents'
    // policy, which is what this checks.
    let stored_vm = k.run(
        &[
            "get",
            "virtualmachinereport",
            "node-000001",
            "-o",
            "jsonpath={.spec.vm}",
        ],
        None,
    );
    let vm = match stored_vm.stdout.trim() {
        vm if stored_vm.ok && !vm.is_empty() => vm.to_string(),
        _ => "vm-1".to_string(),
    };
    let out = apply_report(
        &agent,
        &format!(
            "apiVersion: forewarn.dev/v1alpha1\nkind: VirtualMachineReport\nmetadata:\n  name: node-000001\nspec:\n  node: node-000001\n  vm: {vm}\n"
        ),
    );
    assert!(!out.ok, "the Windows agent stated another node's VM");
    assert!(out.stderr.contains(AGENT_POLICY), "{}", out.stderr);

    k.run(
        &[
            "delete",
            "scheduledeventreport",
            &format!("{event}.{node}"),
            "--ignore-not-found",
        ],
        None,
    );
    drop(win);
    // The other tests expect the default release.
    install(&k, &c);
}
