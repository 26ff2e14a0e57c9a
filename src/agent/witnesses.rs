//! The agent's watch of the witnesses ConfigMap ([`crate::witnesses`]):
//! which events of other VMs it reports.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{info, warn};

use super::error_chain;
use crate::kubeclient::watch_backoff;
use crate::witnesses::{ConfigMapRef, SilentVms, Witnessing};

/// Keeps `tx` at what the ConfigMap `at` says, watched by name through
/// `client` until aborted: no ConfigMap (not written yet, deleted) wants
/// no witness; a failed watch keeps the last list and resumes after a
/// backoff.
pub async fn watch(client: kube::Client, at: ConfigMapRef, tx: watch::Sender<Witnessing>) {
    let api: Api<ConfigMap> = Api::namespaced(client, &at.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", at.name));
    let stream = watcher(api, config).backoff(watch_backoff());
    futures::pin_mut!(stream);
    // The list being read, while a (re)list is under way.
    let mut listing: Option<SilentVms> = None;
    while let Some(item) = stream.next().await {
        let next = match item {
            Ok(watcher::Event::Apply(cm)) => Some(SilentVms::from_data(cm.data.as_ref())),
            Ok(watcher::Event::Delete(_)) => Some(SilentVms::default()),
            Ok(watcher::Event::Init) => {
                listing = Some(SilentVms::default());
                None
            }
            Ok(watcher::Event::InitApply(cm)) => {
                listing = Some(SilentVms::from_data(cm.data.as_ref()));
                None
            }
            Ok(watcher::Event::InitDone) => listing.take(),
            Err(e) => {
                warn!(error = %error_chain(&e), configmap = %at.name, "Watch of the witnesses ConfigMap failed; resuming after a backoff");
                None
            }
        };
        if let Some(silent) = next {
            let next = Witnessing::For(silent);
            tx.send_if_modified(|now| {
                if *now == next {
                    return false;
                }
                if let Witnessing::For(s) = &next {
                    info!(
                        silent_vms = s.len(),
                        "Witnesses wanted for the events of VMs whose agents are silent"
                    );
                }
                *now = next;
                true
            });
        }
    }
}
