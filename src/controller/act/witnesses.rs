//! The witnesses ConfigMap ([`crate::witnesses`]): the VMs whose agents are
//! silent, whose events the other agents then report too.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use crate::api::CONTROLLER_MANAGER;
use crate::controller::observe::caches::Caches;
use crate::controller::observe::nodes::provider_vm;
use crate::controller::observe::reports::fixed_vms;
use crate::witnesses::{SILENT_VMS_KEY, SilentVms};

/// How often the list is computed again: an agent that falls silent gets
/// witnesses within this, plus a poll of theirs.
const EVERY: Duration = Duration::from_secs(2);

/// The VMs of the nodes whose agents are silent (no Ready pod of the
/// agents' DaemonSet on them: [`crate::controller::observe::pods::PodCache::agent_up`]),
/// each by its fixed VM: the `providerID`'s, else its
/// `VirtualMachineReport`'s. A node of neither has no VM another agent's
/// report could name.
pub fn silent_vms(caches: &Caches) -> SilentVms {
    let fixed = fixed_vms(&caches.vm_reports.state());
    SilentVms::new(
        caches
            .nodes
            .state()
            .iter()
            .filter(|n| !caches.pods.agent_up(&n.name_any()))
            .filter_map(|n| provider_vm(n).or_else(|| fixed.get(&n.name_any()).cloned())),
    )
}

/// Keeps the ConfigMap `name` in `namespace` (written through `client`,
/// by server-side apply as [`CONTROLLER_MANAGER`]) at [`silent_vms`],
/// every [`EVERY`] once the caches are synced (before, every agent would
/// read as silent), writing only when the list changed. A failed write is
/// logged and tried again at the next round. Runs until aborted.
pub async fn publish(caches: Caches, client: kube::Client, namespace: String, name: String) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let mut written: Option<SilentVms> = None;
    loop {
        if caches.synced() {
            let silent = silent_vms(&caches);
            if written.as_ref() != Some(&silent) {
                let body = json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": name},
                    "data": {SILENT_VMS_KEY: silent.to_text()},
                });
                let params = PatchParams::apply(CONTROLLER_MANAGER).force();
                match api.patch(&name, &params, &Patch::Apply(&body)).await {
                    Ok(_) => {
                        info!(configmap = %name, silent_vms = silent.len(), "Published the VMs whose agents are silent");
                        written = Some(silent);
                    }
                    Err(e) => {
                        warn!(configmap = %name, error = %e, "Could not write the witnesses ConfigMap; trying again");
                    }
                }
            }
        }
        tokio::time::sleep(EVERY).await;
    }
}
