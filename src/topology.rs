//! Fault domains: each agent reports its VM's
//! `platformFaultDomain` and `platformUpdateDomain` from IMDS instance
//! metadata in its own [`VirtualMachineReport`] (one per node, whether or
//! not an event is under way); the controller labels the Node with them
//! ([`FAULT_DOMAIN_LABEL`], [`UPDATE_DOMAIN_LABEL`]) where no cloud provider
//! label already says the node's fault domain ([`provider_fault_domain`]),
//! so that workloads can spread their replicas over fault domains. The
//! decision is pure ([`labels_to_write`]); `controller::labels` writes it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The Node label forewarn sets to the VM's platform fault domain.
pub const FAULT_DOMAIN_LABEL: &str = "forewarn.dev/platform-fault-domain";
/// The Node label forewarn sets to the VM's platform update domain.
pub const UPDATE_DOMAIN_LABEL: &str = "forewarn.dev/platform-update-domain";
/// The well-known zone label.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The zone label before `topology.kubernetes.io/zone` (deprecated since
/// Kubernetes 1.17, still set by older cloud providers).
pub const BETA_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";

/// One forewarn agent's report of its own VM, from IMDS instance metadata
/// (`GET /metadata/instance/compute`). Named after the node; only the agent
/// of `node` may write it (the chart's admission policy). The controller
/// labels the node from it, and takes its `vm` as the VM of a node without
/// a `providerID`: the API server refuses to change it once written.
// Its own kind, not a field of the event reports: those exist only while an
// event does, and the labels are wanted before any event comes.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "forewarn.dev",
    version = "v1alpha1",
    kind = "VirtualMachineReport",
    plural = "virtualmachinereports",
    shortname = "vmr",
    doc = "One forewarn agent's report of its own VM from IMDS instance metadata (written only by that node's agent): the fault and update domain the controller labels the node with.",
    validation = Rule::new("self.metadata.name == self.spec.node").message("the name must be the node's"),
    validation = Rule::new("self.spec.vm == oldSelf.spec.vm").message("spec.vm is fixed once written: the controller takes it as the node's VM"),
    printcolumn(
        name = "VM",
        type_ = "string",
        json_path = ".spec.vm",
        description = "The VM's name (compute.name)"
    ),
    printcolumn(
        name = "FaultDomain",
        type_ = "string",
        json_path = ".spec.platformFaultDomain",
        description = "compute.platformFaultDomain"
    ),
    printcolumn(
        name = "UpdateDomain",
        type_ = "string",
        json_path = ".spec.platformUpdateDomain",
        description = "compute.platformUpdateDomain"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineReportSpec {
    /// The reporting agent's node (the node name its token carries), also
    /// the object's name.
    // A Node's name: a DNS subdomain, at most 253 characters.
    #[schemars(length(max = 253))]
    pub node: String,
    /// The VM's name (`compute.name`), as in an event's `Resources`; fixed
    /// once written (a change is refused).
    // As an event's `Resources` entries (`MAX_VM_NAME` of the API types).
    #[schemars(length(max = 128))]
    pub vm: String,
    /// `compute.platformFaultDomain`: a decimal number, or empty when IMDS
    /// gave none (or something else, which the agent does not pass on).
    #[serde(default)]
    #[schemars(length(max = 3), pattern(r"^[0-9]*$"))]
    pub platform_fault_domain: String,
    /// `compute.platformUpdateDomain`: a decimal number, or empty.
    #[serde(default)]
    #[schemars(length(max = 3), pattern(r"^[0-9]*$"))]
    pub platform_update_domain: String,
}

/// `value` when it is a domain number as IMDS serves it (1 to 3 decimal
/// digits), else the empty string: what an agent reports and what the
/// controller accepts, so that nothing else ever reaches a label.
pub fn domain(value: &str) -> String {
    let v = value.trim();
    if (1..=3).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_digit()) {
        v.to_string()
    } else {
        String::new()
    }
}

/// The node's fault domain as a cloud provider labels it, if it does: a
/// `topology.kubernetes.io/zone` (or `failure-domain.beta.kubernetes.io/zone`)
/// that is a decimal number. cloud-provider-azure sets the zone of a VM
/// outside availability zones (an availability set, a non-zonal scale set)
/// to its platform fault domain (`"0"`, `"1"`, ...), and of a zonal VM to
/// `<region>-<zone>` (`eastus-1`), which says nothing of the fault domain
/// inside the zone; any other value is someone else's zone, not a fault
/// domain either.
pub fn provider_fault_domain(node: &Node) -> Option<&str> {
    let labels = node.metadata.labels.as_ref()?;
    [ZONE_LABEL, BETA_ZONE_LABEL]
        .iter()
        .filter_map(|k| labels.get(*k))
        .map(String::as_str)
        .find(|v| !domain(v).is_empty())
}

/// The label changes that bring `node` to what `report` says, `None` for a
/// label to remove; empty when it already is so (no write). On a node whose
/// cloud provider labels its fault domain ([`provider_fault_domain`])
/// forewarn sets neither label and removes its own, so that a node never
/// carries two answers; without a report, forewarn leaves the node as it
/// is (an agent that has not reported yet, or a report deleted by hand).
pub fn labels_to_write(
    node: &Node,
    report: Option<&VirtualMachineReportSpec>,
) -> BTreeMap<String, Option<String>> {
    let mut out = BTreeMap::new();
    let Some(report) = report else {
        return out;
    };
    let by_provider = provider_fault_domain(node).is_some();
    let current = node.metadata.labels.as_ref();
    for (key, value) in [
        (FAULT_DOMAIN_LABEL, &report.platform_fault_domain),
        (UPDATE_DOMAIN_LABEL, &report.platform_update_domain),
    ] {
        let value = domain(value);
        let want = (!by_provider && !value.is_empty()).then_some(value);
        let have = current.and_then(|l| l.get(key)).cloned();
        if have != want {
            out.insert(key.to_string(), want);
        }
    }
    out
}

/// The fault domain a node is in, as its labels say: the cloud provider's
/// ([`provider_fault_domain`]) or forewarn's, the latter qualified by the
/// node's zone when it has one (fault domain 0 of zone 1 is not fault
/// domain 0 of zone 2). `None` when neither is there.
pub fn fault_domain_of(node: &Node) -> Option<String> {
    if let Some(fd) = provider_fault_domain(node) {
        return Some(fd.to_string());
    }
    let labels = node.metadata.labels.as_ref()?;
    let fd = labels.get(FAULT_DOMAIN_LABEL)?;
    Some(
        match labels.get(ZONE_LABEL).or(labels.get(BETA_ZONE_LABEL)) {
            Some(zone) => format!("{zone}/{fd}"),
            None => fd.clone(),
        },
    )
}

/// The CRD of `VirtualMachineReport`s as YAML, as `forewarn crd
/// --vm-reports` prints it and `crds/virtualmachinereports.forewarn.dev.yaml`
/// holds it.
///
/// # Errors
/// Only if serialization fails, which would be a bug.
pub fn vm_report_crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    let crd = VirtualMachineReport::crd();
    Ok(format!(
        "---\n# Generated by `forewarn crd --vm-reports`; do not edit. Regenerate with `make generate`.\n{}",
        serde_saphyr::to_string(&crd)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("node-1".into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n
    }

    fn report(fd: &str, ud: &str) -> VirtualMachineReportSpec {
        VirtualMachineReportSpec {
            node: "node-1".into(),
            vm: "vmss_1".into(),
            platform_fault_domain: fd.into(),
            platform_update_domain: ud.into(),
        }
    }

    fn set(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(String::from)))
            .collect()
    }

    #[test]
    fn an_unlabelled_node_gets_both_domains_once() {
        let bare = node(&[("kubernetes.io/hostname", "node-1")]);
        assert_eq!(
            labels_to_write(&bare, Some(&report("1", "4"))),
            set(&[
                (FAULT_DOMAIN_LABEL, Some("1")),
                (UPDATE_DOMAIN_LABEL, Some("4"))
            ])
        );
        let labelled = node(&[(FAULT_DOMAIN_LABEL, "1"), (UPDATE_DOMAIN_LABEL, "4")]);
        assert!(
            labels_to_write(&labelled, Some(&report("1", "4"))).is_empty(),
            "no write when unchanged"
        );
        // A change (a redeploy to another host) is written, only that label.
        assert_eq!(
            labels_to_write(&labelled, Some(&report("2", "4"))),
            set(&[(FAULT_DOMAIN_LABEL, Some("2"))])
        );
        // No report: the node is left as it is.
        assert!(labels_to_write(&labelled, None).is_empty());
    }

    #[test]
    fn a_cloud_providers_numeric_zone_is_a_fault_domain_and_wins() {
        for key in [ZONE_LABEL, BETA_ZONE_LABEL] {
            let avset = node(&[(key, "0")]);
            assert_eq!(provider_fault_domain(&avset), Some("0"));
            assert!(labels_to_write(&avset, Some(&report("0", "3"))).is_empty());
            // Labels forewarn wrote before the provider's came go.
            let both = node(&[(key, "1"), (FAULT_DOMAIN_LABEL, "1")]);
            assert_eq!(
                labels_to_write(&both, Some(&report("1", "3"))),
                set(&[(FAULT_DOMAIN_LABEL, None)])
            );
            assert_eq!(fault_domain_of(&both).as_deref(), Some("1"));
        }
    }

    #[test]
    fn an_availability_zone_is_not_a_fault_domain() {
        let zonal = node(&[(ZONE_LABEL, "eastus-1"), (BETA_ZONE_LABEL, "eastus-1")]);
        assert_eq!(provider_fault_domain(&zonal), None);
        assert_eq!(
            labels_to_write(&zonal, Some(&report("0", "0"))),
            set(&[
                (FAULT_DOMAIN_LABEL, Some("0")),
                (UPDATE_DOMAIN_LABEL, Some("0"))
            ])
        );
        let labelled = node(&[(ZONE_LABEL, "eastus-1"), (FAULT_DOMAIN_LABEL, "0")]);
        assert_eq!(fault_domain_of(&labelled).as_deref(), Some("eastus-1/0"));
        assert_eq!(fault_domain_of(&node(&[])), None);
        assert_eq!(fault_domain_of(&node(&[(ZONE_LABEL, "eastus-2")])), None);
    }

    #[test]
    fn only_a_domain_number_ever_reaches_a_label() {
        assert_eq!(domain(" 2 "), "2");
        assert_eq!(domain("12"), "12");
        for bad in ["", "-1", "1a", "1234", "0x1", "１"] {
            assert_eq!(domain(bad), "", "{bad:?}");
        }
        // A report with no (or a bad) value removes forewarn's label.
        let labelled = node(&[(FAULT_DOMAIN_LABEL, "1"), (UPDATE_DOMAIN_LABEL, "4")]);
        assert_eq!(
            labels_to_write(&labelled, Some(&report("", "evil=1"))),
            set(&[(FAULT_DOMAIN_LABEL, None), (UPDATE_DOMAIN_LABEL, None)])
        );
    }

    #[test]
    fn checked_in_crd_matches_the_rust_types() {
        let checked_in = include_str!("../crds/virtualmachinereports.forewarn.dev.yaml");
        assert!(
            vm_report_crd_yaml().unwrap() == checked_in,
            "crds/virtualmachinereports.forewarn.dev.yaml is stale: run `make generate`"
        );
    }
}
