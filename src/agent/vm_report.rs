//! The agent's report of its own VM ([`VirtualMachineReport`], named after
//! its node): the fault and update domain IMDS instance metadata gives,
//! which the controller labels the node with (see [`crate::topology`]).
//! Written once per start, by server-side apply (field manager
//! `forewarn-agent`), retried with backoff until it is stored: a VM keeps
//! its domains while it runs, and a redeploy to another host restarts the
//! agent with the node. Owned by the agent's pod when the agent knows it
//! (`--pod-name`, `--pod-uid`), so that it goes with the pod when the node
//! is deleted.
//!
//! The API server keeps `spec.vm` as first written (the controller takes it
//! as the VM of a node without a `providerID`): a start that finds another
//! VM name in IMDS is refused, which the agent logs as an error and does
//! not retry; it goes on polling.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use tracing::{error, info, warn};

use super::error_chain;
use crate::api::AGENT_MANAGER;
use crate::imds::model::Compute;
use crate::topology::{VirtualMachineReport, VirtualMachineReportSpec, domain};

/// The report of `node`'s VM from its compute metadata: the domains only
/// when they are domain numbers (anything else IMDS might send is left
/// out, and said so in the log).
pub fn report_of(node: &str, compute: &Compute) -> VirtualMachineReportSpec {
    let checked = |what: &str, value: &str| {
        let d = domain(value);
        if d.is_empty() && !value.is_empty() {
            warn!(%what, value = %value, "IMDS gave a domain that is not a number; not reporting it");
        }
        d
    };
    VirtualMachineReportSpec {
        node: node.to_owned(),
        vm: compute.name.clone(),
        platform_fault_domain: checked("platformFaultDomain", &compute.platform_fault_domain),
        platform_update_domain: checked("platformUpdateDomain", &compute.platform_update_domain),
    }
}

/// The object applied: `report` named after its node. It carries no owner
/// reference: the controller makes the Node its owner
/// (`crate::controller::runtime::sweep::vm_report_owner`), and the chart's
/// admission policy refuses any an agent adds.
pub fn object(report: &VirtualMachineReportSpec) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": VirtualMachineReport::api_version(&()),
        "kind": VirtualMachineReport::kind(&()),
        "metadata": { "name": report.node },
        "spec": report,
    })
}

/// Whether the API server refused `e` because the report's VM differs
/// from the one it holds (the CRD's rule: `spec.vm` is fixed once written).
pub fn is_vm_fixed(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 422 && s.message.contains("spec.vm is fixed"))
}

/// Writes `report` (see [`object`]) until the API server stores it,
/// backing off from 1 s to 30 s with jitter; run as a task of its own, so
/// that it never holds back the polls. A refusal to change the VM
/// ([`is_vm_fixed`]) is logged and not retried.
pub async fn write(api: Api<VirtualMachineReport>, report: VirtualMachineReportSpec) {
    let body = object(&report);
    let apply = || async {
        api.patch(
            &report.node,
            &PatchParams::apply(AGENT_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    };
    let written = apply
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_secs(1))
                .with_max_delay(Duration::from_secs(30))
                .with_jitter()
                .without_max_times(),
        )
        .when(|e| !is_vm_fixed(e))
        .notify(|e, d| warn!(error = %error_chain(e), retry_in = ?d, "Could not write this VM's report; will retry"))
        .await;
    if let Err(e) = &written
        && is_vm_fixed(e)
    {
        error!(vm = %report.vm, node = %report.node, error = %error_chain(e),
            "The API server refuses this VM's report: this node's VirtualMachineReport already names another VM, \
             which cannot change. Until that report is deleted, the controller withholds \
             the events naming either VM on this node. Going on without it");
        return;
    }
    if written.is_ok() {
        info!(vm = %report.vm, fault_domain = %report.platform_fault_domain,
            update_domain = %report.platform_update_domain, "Reported this VM's fault and update domain");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compute(fd: &str, ud: &str) -> Compute {
        Compute {
            name: "vmss_3".into(),
            vm_scale_set_name: "vmss".into(),
            platform_fault_domain: fd.into(),
            platform_update_domain: ud.into(),
        }
    }

    #[test]
    fn the_report_carries_the_domains_imds_gave_and_only_numbers() {
        let r = report_of("node-3", &compute("2", "11"));
        assert_eq!(
            r,
            VirtualMachineReportSpec {
                node: "node-3".into(),
                vm: "vmss_3".into(),
                platform_fault_domain: "2".into(),
                platform_update_domain: "11".into(),
            }
        );
        let odd = report_of("node-3", &compute("", "x=1"));
        assert_eq!(
            (
                odd.platform_fault_domain.as_str(),
                odd.platform_update_domain.as_str()
            ),
            ("", "")
        );
    }

    #[test]
    fn the_object_is_named_after_the_node_and_claims_no_owner() {
        let r = report_of("node-3", &compute("2", "1"));
        let o = object(&r);
        assert_eq!(o["metadata"]["name"], "node-3");
        assert_eq!(o["kind"], "VirtualMachineReport");
        assert_eq!(o["apiVersion"], "forewarn.dev/v1alpha1");
        assert_eq!(o["spec"]["platformFaultDomain"], "2");
        assert!(o["metadata"]["ownerReferences"].is_null());
    }
}
