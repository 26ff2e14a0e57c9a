//! Nodes as the controller sees them: which node an entry of `Resources`
//! names, who holds a node's cordon, whether it is cordoned. The writer of
//! forewarn's marks on a node is [`crate::controller::act::cordon`].

use k8s_openapi::api::core::v1::Node;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::controller::observe::trust::Identity;

/// Drops from a node, before the node cache stores it, what the controller
/// never reads: its `managedFields` (often the larger part of the object),
/// and of its status all but its conditions (`Ready` and forewarn's own)
/// and `nodeInfo.bootID` (restarts): the images it holds (dozens of names
/// and sizes on a real node), its volumes, addresses, capacity and
/// allocatable resources, daemon endpoints, runtime handlers, features
/// and the rest of `nodeInfo`. At 1,000 nodes the cache is the controller's
/// largest; every node write is a patch of the fields it changes,
/// conditional on the `resourceVersion`, never the cached object sent back.
pub fn trim(node: &mut Node) {
    use kube::ResourceExt;
    node.managed_fields_mut().clear();
    if let Some(s) = node.status.as_mut() {
        let boot_id = s.node_info.take().map(|i| i.boot_id);
        *s = k8s_openapi::api::core::v1::NodeStatus {
            conditions: s.conditions.take(),
            node_info: boot_id.map(|boot_id| k8s_openapi::api::core::v1::NodeSystemInfo {
                boot_id,
                ..Default::default()
            }),
            ..Default::default()
        };
    }
}

/// The VM name an Azure `providerID` stands for, as it appears in `Resources`.
///
/// `azure:///subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachineScaleSets/<vmss>/virtualMachines/<id>`
/// gives `<vmss>_<id>`; `.../virtualMachines/<name>` gives `<name>`
/// (AKS and cloud-provider-azure formats). Anything else gives `None`.
pub fn vm_name_from_provider_id(provider_id: &str) -> Option<String> {
    let rest = provider_id.strip_prefix("azure://")?;
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    let pos = |key: &str| parts.iter().position(|p| p.eq_ignore_ascii_case(key));
    let vm = parts.get(pos("virtualMachines")? + 1)?;
    match pos("virtualMachineScaleSets") {
        Some(i) => Some(format!("{}_{}", parts.get(i + 1)?, vm)),
        None => Some((*vm).to_string()),
    }
}

/// The VM name of a node's `spec.providerID` (set by the kubelet or the
/// cloud provider at registration), if it is an Azure one.
pub fn provider_vm(node: &Node) -> Option<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(vm_name_from_provider_id)
}

/// Every node's fixed VM, and the conflicts between it and what its agent
/// states (see [`identities`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identities {
    /// Per node name, its fixed VM.
    vms: BTreeMap<String, Identity>,
    /// `(VM name lower-cased, why)`: events naming that VM are withheld.
    conflicts: Vec<(String, String)>,
}

impl Identities {
    /// The fixed VM of `node`, if it has one.
    pub fn of(&self, node: &str) -> Option<&Identity> {
        self.vms.get(node)
    }
}

/// Each node's VM, fixed where its agent cannot rewrite it:
///
/// - its `spec.providerID`'s (set by the kubelet or the cloud provider at
///   registration; see [`provider_vm`]); a VM its agent states otherwise
///   in its reports (`stated`, by node) is a conflict that withholds the
///   events naming the providerID's VM;
/// - else the VM of its `VirtualMachineReport` (`fixed`, by node), which the
///   CRD keeps from being rewritten; a report stating another VM is a
///   conflict that withholds the events naming either VM (the controller
///   cannot tell which statement is true);
/// - else none: nothing maps to the node, and a VM its reports state is
///   ignored.
pub fn identities<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    fixed: &HashMap<String, String>,
    stated: &HashMap<String, BTreeSet<String>>,
) -> Identities {
    let mut ids = Identities::default();
    for n in nodes {
        let Some(name) = n.metadata.name.clone() else {
            continue;
        };
        let (vm, vouches) = match (provider_vm(n), fixed.get(&name).filter(|v| !v.is_empty())) {
            (Some(p), _) => (p, true),
            (None, Some(v)) => (v.clone(), false),
            (None, None) => continue,
        };
        let contrary: Vec<&str> = stated
            .get(&name)
            .into_iter()
            .flatten()
            .filter(|s| !s.is_empty() && !s.eq_ignore_ascii_case(&vm))
            .map(String::as_str)
            .collect();
        if !contrary.is_empty() {
            let states = contrary.join(", ");
            if vouches {
                ids.conflicts.push((
                    vm.to_ascii_lowercase(),
                    format!("the agent of node {name} states VM {states} but its providerID names {vm}; using {vm}"),
                ));
            } else {
                let why = format!(
                    "the agent of node {name} states VM {states} in its reports but its VirtualMachineReport fixed VM {vm}: events naming either are withheld"
                );
                for v in std::iter::once(vm.as_str()).chain(contrary.iter().copied()) {
                    ids.conflicts.push((v.to_ascii_lowercase(), why.clone()));
                }
            }
        }
        ids.vms.insert(name, Identity { vm, vouches });
    }
    ids
}

/// How the entries of `Resources` map to nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mapping {
    /// `(vm, node name)` for every node that is the VM, in `Resources` order;
    /// a VM claimed by several nodes appears once per node.
    pub mapped: Vec<(String, String)>,
    /// Entries that map to no node.
    pub unmapped: Vec<String>,
    /// Why the mapping is not to be trusted for an approval: a VM fixed for
    /// more than one node, an agent stating another VM than its node's
    /// fixed one (see [`identities`]).
    pub doubts: Vec<String>,
}

/// Maps each entry of `resources` to the nodes whose fixed VM it is
/// (see [`identities`]), comparing ignoring case.
pub fn map_resources(resources: &[String], ids: &Identities) -> Mapping {
    let mut m = Mapping::default();
    for vm in resources {
        let nodes: Vec<&str> = ids
            .vms
            .iter()
            .filter(|(_, id)| id.vm.eq_ignore_ascii_case(vm))
            .map(|(n, _)| n.as_str())
            .collect();
        for (k, why) in &ids.conflicts {
            if k.eq_ignore_ascii_case(vm) && !m.doubts.contains(why) {
                m.doubts.push(why.clone());
            }
        }
        if nodes.is_empty() {
            m.unmapped.push(vm.clone());
            continue;
        }
        if nodes.len() > 1 {
            m.doubts.push(format!(
                "VM {vm} is claimed by {} nodes ({}): all are drained, approval is withheld",
                nodes.len(),
                nodes.join(", ")
            ));
        }
        for n in nodes {
            m.mapped.push((vm.clone(), n.to_owned()));
        }
    }
    m
}

/// The holds on a node that name no existing `ScheduledEvent` (deleted by
/// hand while the node was held): nothing would ever release them.
pub fn orphaned_holds(holds: &[String], exists: impl Fn(&str) -> bool) -> Vec<String> {
    holds.iter().filter(|h| !exists(h)).cloned().collect()
}

/// Whether the node is cordoned (`spec.unschedulable`).
pub fn is_cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CORDONED_FOR_ANNOTATION, holds};
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::api::ObjectMeta;

    #[test]
    fn a_trimmed_node_keeps_what_the_controller_reads() {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "aks-spot-1", "resourceVersion": "7", "uid": "u",
                "labels": {"kubernetes.io/hostname": "aks-spot-1"},
                "annotations": {CORDONED_FOR_ANNOTATION: "e"},
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
            "spec": {
                "providerID": "azure:///subscriptions/s/resourceGroups/r/providers/Microsoft.Compute/virtualMachineScaleSets/aks-spot/virtualMachines/1",
                "unschedulable": true,
                "taints": [{"key": "forewarn.dev/scheduled-event", "effect": "NoSchedule"}],
                "podCIDR": "10.0.0.0/24",
            },
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "ForewarnScheduledEvent", "status": "True"},
                ],
                "nodeInfo": {
                    "bootID": "b-1", "machineID": "m", "systemUUID": "s", "kernelVersion": "6.8",
                    "osImage": "Ubuntu", "containerRuntimeVersion": "containerd://2.0",
                    "kubeletVersion": "v1.33.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                    "architecture": "amd64",
                },
                "addresses": [{"type": "InternalIP", "address": "10.224.0.4"}],
                "capacity": {"cpu": "4", "pods": "110"},
                "allocatable": {"cpu": "3860m", "pods": "110"},
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320_000}],
                "volumesInUse": ["kubernetes.io/csi/disk.csi.azure.com^d"],
                "phase": "Running",
            },
        }))
        .unwrap();
        let before = n.clone();
        trim(&mut n);
        // What the controller reads is as it was.
        assert_eq!(n.metadata.name, before.metadata.name);
        assert_eq!(
            n.metadata.resource_version,
            before.metadata.resource_version
        );
        assert_eq!(n.metadata.labels, before.metadata.labels);
        assert_eq!(n.metadata.annotations, before.metadata.annotations);
        assert_eq!(n.spec, before.spec);
        assert_eq!(provider_vm(&n).as_deref(), Some("aks-spot_1"));
        assert!(is_cordoned(&n));
        let status = n.status.clone().unwrap();
        assert_eq!(status.conditions, before.status.unwrap().conditions);
        assert_eq!(
            crate::controller::observe::impact::boot_id(&n).as_deref(),
            Some("b-1")
        );
        assert_eq!(
            crate::controller::decide::out_of_service::ready(&n),
            Some(true)
        );
        // The rest is gone.
        assert!(n.metadata.managed_fields.is_none_or(|m| m.is_empty()));
        let kept = serde_json::to_value(&status).unwrap();
        assert_eq!(
            kept,
            serde_json::json!({
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "ForewarnScheduledEvent", "status": "True"},
                ],
                "nodeInfo": {
                    "bootID": "b-1", "machineID": "", "systemUUID": "", "kernelVersion": "",
                    "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "",
                    "kubeProxyVersion": "", "operatingSystem": "", "architecture": "",
                },
            })
        );
    }

    /// A node, and the VM its `VirtualMachineReport` fixed (`vmr`),
    /// recorded in [`FIXED`] for [`fixed`].
    fn node(name: &str, vmr: Option<&str>, provider_id: Option<&str>) -> Node {
        if let Some(a) = vmr {
            FIXED.with(|s| s.borrow_mut().insert(name.to_string(), a.to_string()));
        }
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: provider_id.map(String::from),
                ..Default::default()
            }),
            status: None,
        }
    }

    thread_local! {
        static FIXED: std::cell::RefCell<HashMap<String, String>> = Default::default();
    }

    fn fixed() -> HashMap<String, String> {
        FIXED.with(|s| s.borrow().clone())
    }

    fn stated(pairs: &[(&str, &str)]) -> HashMap<String, BTreeSet<String>> {
        let mut m: HashMap<String, BTreeSet<String>> = HashMap::new();
        for (n, vm) in pairs {
            m.entry(n.to_string()).or_default().insert(vm.to_string());
        }
        m
    }

    fn ids(nodes: &[&Node], stated_vms: &[(&str, &str)]) -> Identities {
        identities(nodes.iter().copied(), &fixed(), &stated(stated_vms))
    }

    const OWN_VM: &str = "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/own-vm";

    #[test]
    fn provider_id_of_scale_set_and_standalone_vm() {
        assert_eq!(
            vm_name_from_provider_id(
                "azure:///subscriptions/s/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachineScaleSets/aks-pool-123-vmss/virtualMachines/10"
            ),
            Some("aks-pool-123-vmss_10".into())
        );
        assert_eq!(
            vm_name_from_provider_id(
                "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/worker-1"
            ),
            Some("worker-1".into())
        );
        assert_eq!(vm_name_from_provider_id("kwok://node-0"), None);
        assert_eq!(vm_name_from_provider_id(""), None);
    }

    #[test]
    fn a_stated_vm_contradicting_the_provider_id_is_overruled_and_reported() {
        let liar = node("node-a", Some("victim-vm"), Some(OWN_VM));
        let ids = ids(&[&liar], &[("node-a", "victim-vm")]);
        assert_eq!(
            ids.of("node-a"),
            Some(&Identity {
                vm: "own-vm".into(),
                vouches: true
            })
        );
        let m = map_resources(&["victim-vm".into()], &ids);
        assert!(m.mapped.is_empty(), "{m:?}");
        assert_eq!(m.unmapped, vec!["victim-vm".to_string()]);
        let m = map_resources(&["own-vm".into()], &ids);
        assert_eq!(m.mapped, vec![("own-vm".to_string(), "node-a".to_string())]);
        assert!(m.doubts[0].contains("victim-vm"), "{m:?}");
    }

    /// The second hole: without providerIDs, a's agent states b's VM as
    /// its own (while b's agent restarts, say). a's VM stays the one its
    /// VirtualMachineReport fixed; the events naming either VM are
    /// withheld; a vouches for nobody.
    #[test]
    fn a_claimed_vm_without_a_provider_id_maps_nothing_and_withholds_both() {
        let a = node("node-a", Some("vm-a"), None);
        // b's VirtualMachineReport is gone with its agent's pod.
        let b = node("node-b", None, None);
        let ids = ids(&[&a, &b], &[("node-a", "vm-a"), ("node-a", "vm-b")]);
        assert_eq!(
            ids.of("node-a"),
            Some(&Identity {
                vm: "vm-a".into(),
                vouches: false
            })
        );
        assert_eq!(ids.of("node-b"), None, "no VM known for b");
        let m = map_resources(&["vm-b".into()], &ids);
        assert!(m.mapped.is_empty(), "b's VM does not map to a: {m:?}");
        assert!(m.doubts[0].contains("fixed VM vm-a"), "{m:?}");
        let m = map_resources(&["vm-a".into()], &ids);
        assert_eq!(m.mapped, vec![("vm-a".to_string(), "node-a".to_string())]);
        assert!(m.doubts[0].contains("states VM vm-b"), "{m:?}");
        // Without a VirtualMachineReport, a stated VM is nothing.
        let c = node("node-c", None, None);
        let ids = identities([&c], &HashMap::new(), &stated(&[("node-c", "vm-b")]));
        assert_eq!(ids.of("node-c"), None);
        assert_eq!(map_resources(&["vm-b".into()], &ids).unmapped, ["vm-b"]);
    }

    /// An agent that states two VMs in its reports no longer flips its
    /// node's VM from pass to pass: it is the fixed one, and the conflict
    /// is the same on every pass.
    #[test]
    fn flipping_claims_change_nothing_from_pass_to_pass() {
        let a = node("node-a", Some("vm-a"), None);
        let first = ids(&[&a], &[("node-a", "vm-x"), ("node-a", "vm-a")]);
        let second = ids(&[&a], &[("node-a", "vm-a"), ("node-a", "vm-x")]);
        assert_eq!(first, second);
        assert_eq!(first.of("node-a").map(|i| i.vm.as_str()), Some("vm-a"));
        for vm in ["vm-a", "vm-x"] {
            assert!(
                !map_resources(&[vm.into()], &first).doubts.is_empty(),
                "{vm}"
            );
        }
    }

    #[test]
    fn a_vm_fixed_for_two_nodes_maps_to_both_and_is_doubted() {
        let a = node("node-a", Some("vm-1"), None);
        let b = node("node-b", Some("VM-1"), None);
        let m = map_resources(&["vm-1".into()], &ids(&[&a, &b], &[]));
        assert_eq!(
            m.mapped,
            vec![
                ("vm-1".to_string(), "node-a".to_string()),
                ("vm-1".to_string(), "node-b".to_string())
            ]
        );
        assert!(m.doubts[0].contains("claimed by 2 nodes"), "{m:?}");
    }

    #[test]
    fn a_vm_report_agreeing_with_the_provider_id_and_mapping_ignores_case() {
        let nodes = [
            node("aks-pool-00000a", Some("AKS-Pool-vmss_10"), None),
            node(
                "worker-1",
                None,
                Some(
                    "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/Worker-1",
                ),
            ),
            node("fresh", None, None),
        ];
        let Mapping {
            mapped,
            unmapped,
            doubts,
        } = map_resources(
            &[
                "aks-pool-vmss_10".into(),
                "worker-1".into(),
                "other-vm".into(),
            ],
            &ids(
                &nodes.iter().collect::<Vec<_>>(),
                &[
                    ("worker-1", "WORKER-1"),
                    ("aks-pool-00000a", "aks-pool-vmss_10"),
                ],
            ),
        );
        assert!(doubts.is_empty(), "{doubts:?}");
        assert_eq!(
            mapped,
            vec![
                (
                    "aks-pool-vmss_10".to_string(),
                    "aks-pool-00000a".to_string()
                ),
                ("worker-1".to_string(), "worker-1".to_string())
            ]
        );
        assert_eq!(unmapped, vec!["other-vm".to_string()]);
    }

    #[test]
    fn holds_of_deleted_events_are_orphaned() {
        let holds = vec!["gone".to_string(), "live".to_string()];
        assert_eq!(
            orphaned_holds(&holds, |h| h == "live"),
            vec!["gone".to_string()]
        );
        assert!(orphaned_holds(&holds, |_| true).is_empty());
    }

    #[test]
    fn holds_parse_the_annotation() {
        let mut n = node("n", None, None);
        assert!(holds(&n).is_empty());
        n.metadata.annotations =
            Some([(CORDONED_FOR_ANNOTATION.to_string(), "a, b,".to_string())].into());
        assert_eq!(holds(&n), vec!["a".to_string(), "b".to_string()]);
    }
}
