//! Nodes as the controller sees them: which node an entry of `Resources`
//! names, who holds a node's cordon, and the one writer of forewarn's marks
//! on a node (cordon, taint, hold list).

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::crd::{CORDONED_FOR_ANNOTATION, VM_NAME_ANNOTATION};

/// Key of the taint forewarn puts next to its cordon (effect `NoSchedule`),
/// so that tools and people can tell why a node is cordoned. Owned like the
/// cordon: present exactly while forewarn holds the node for some event.
pub const TAINT_KEY: &str = "forewarn.dev/scheduled-event";

/// The node's taints with forewarn's taint present (`held`) or absent, or
/// `None` when they are already so. Other taints are never touched.
pub fn taints_for(node: &Node, held: bool) -> Option<Vec<Taint>> {
    let current: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let has = current.iter().any(|t| t.key == TAINT_KEY);
    if has == held {
        return None;
    }
    let mut taints: Vec<Taint> = current.into_iter().filter(|t| t.key != TAINT_KEY).collect();
    if held {
        taints.push(Taint {
            key: TAINT_KEY.into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
    }
    Some(taints)
}

/// Writes a node's hold list (`forewarn.dev/cordoned-for`; removed when
/// empty), forewarn's taint (present while the list is not empty) and, if
/// given, `spec.unschedulable`, in one merge patch made conditional on the
/// `resourceVersion` of `node` as read: two writers editing one node's hold
/// list or taints cannot lose each other's change (the loser gets a 409 and
/// retries from a fresh read).
///
/// # Errors
/// The API error; 409 when the node changed since it was read.
pub async fn write_holds(
    api: &Api<Node>,
    node: &Node,
    holds: &[String],
    unschedulable: Option<bool>,
) -> Result<(), kube::Error> {
    let annotation = if holds.is_empty() {
        json!(null)
    } else {
        json!(holds.join(","))
    };
    let mut body = json!({
        "metadata": {
            "resourceVersion": node.resource_version().unwrap_or_default(),
            "annotations": { CORDONED_FOR_ANNOTATION: annotation },
        }
    });
    let mut spec = serde_json::Map::new();
    if let Some(u) = unschedulable {
        spec.insert("unschedulable".into(), json!(u));
    }
    if let Some(taints) = taints_for(node, !holds.is_empty()) {
        spec.insert("taints".into(), json!(taints));
    }
    if !spec.is_empty() {
        body["spec"] = serde_json::Value::Object(spec);
    }
    api.patch(
        &node.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&body),
    )
    .await
    .map(|_| ())
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

/// The VM name of a node: the agent's annotation, else its `providerID`.
pub fn vm_name(node: &Node) -> Option<String> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(VM_NAME_ANNOTATION))
        .filter(|v| !v.is_empty())
        .cloned()
        .or_else(|| {
            node.spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .and_then(vm_name_from_provider_id)
        })
}

/// Maps each entry of `resources` to a node, comparing ignoring case.
/// Returns `(vm, node name)` pairs for the mapped ones and the unmapped VM names.
pub fn map_resources<'a>(
    resources: &[String],
    nodes: impl IntoIterator<Item = &'a Node>,
) -> (Vec<(String, String)>, Vec<String>) {
    let known: Vec<(String, String)> = nodes
        .into_iter()
        .filter_map(|n| Some((vm_name(n)?.to_ascii_lowercase(), n.metadata.name.clone()?)))
        .collect();
    let mut mapped = Vec::new();
    let mut unmapped = Vec::new();
    for vm in resources {
        match known.iter().find(|(k, _)| k.eq_ignore_ascii_case(vm)) {
            Some((_, node)) => mapped.push((vm.clone(), node.clone())),
            None => unmapped.push(vm.clone()),
        }
    }
    (mapped, unmapped)
}

/// The `ScheduledEvent` names for which forewarn holds the node's cordon.
pub fn holds(node: &Node) -> Vec<String> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDONED_FOR_ANNOTATION))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
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
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::api::ObjectMeta;

    fn node(name: &str, annotation: Option<&str>, provider_id: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: annotation
                    .map(|a| [(VM_NAME_ANNOTATION.to_string(), a.to_string())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: provider_id.map(String::from),
                ..Default::default()
            }),
            status: None,
        }
    }

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
    fn annotation_wins_over_provider_id_and_mapping_ignores_case() {
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
        let (mapped, unmapped) = map_resources(
            &[
                "aks-pool-vmss_10".into(),
                "worker-1".into(),
                "other-vm".into(),
            ],
            &nodes,
        );
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
    fn taint_follows_the_holds_and_other_taints_stay() {
        let mut n = node("n", None, None);
        let theirs = Taint {
            key: "example.com/maintenance".into(),
            value: None,
            effect: "NoSchedule".into(),
            time_added: None,
        };
        n.spec.as_mut().unwrap().taints = Some(vec![theirs.clone()]);
        let added = taints_for(&n, true).unwrap();
        assert_eq!(added.len(), 2);
        assert_eq!(added[0], theirs);
        assert_eq!(added[1].key, TAINT_KEY);
        assert_eq!(taints_for(&n, false), None, "nothing of ours to remove");
        n.spec.as_mut().unwrap().taints = Some(added);
        assert_eq!(taints_for(&n, true), None, "already there");
        assert_eq!(taints_for(&n, false), Some(vec![theirs]));
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
