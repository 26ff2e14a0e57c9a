//! The namespaces' labels, for the policy's `excludePods.namespaceSelector`
//! (the pods of the namespaces it selects are never evicted): a metadata
//! watch of every namespace, started by the first pass that needs their
//! labels, so that no pass lists every namespace of the cluster.
//!
//! Started on demand rather than with the controller: the chart grants the
//! controller the namespaces' `list` and `watch` only when its values set a
//! `namespaceSelector` (a policy file reloaded with one later gets the
//! API server's refusal, reported by the passes that need it).

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tracing::warn;

use crate::controller::observe::pod_list;
use crate::policy::Policy;

/// How long the first pass that needs the namespaces waits for their first
/// full list.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);

/// The namespaces' metadata, once a pass needed them.
#[derive(Clone, Default)]
pub struct NamespaceCache(Arc<OnceLock<Store<PartialObjectMeta<Namespace>>>>);

impl NamespaceCache {
    /// The names of the namespaces whose labels match `policy`'s
    /// `excludePods.namespaceSelector`; empty without a selector (and then
    /// nothing is watched). The first call with one starts the watch
    /// (through `client`) and waits for its first list.
    ///
    /// # Errors
    /// [`pod_list::Error::NamespacesNotListed`] while the watch has not
    /// listed them yet (the API server refused or did not answer within
    /// [`FIRST_LIST_WAIT`]; the pass is retried).
    pub async fn selected(
        &self,
        client: &Client,
        policy: &Policy,
    ) -> Result<HashSet<String>, pod_list::Error> {
        if !policy.exclude_pods.needs_namespace_labels() {
            return Ok(HashSet::new());
        }
        let store = self.0.get_or_init(|| start(client.clone()));
        tokio::time::timeout(FIRST_LIST_WAIT, store.wait_until_ready())
            .await
            .map_err(|_| pod_list::Error::NamespacesNotListed)?
            .map_err(|_| pod_list::Error::NamespacesNotListed)?;
        Ok(store
            .state()
            .iter()
            .filter(|ns| policy.exclude_pods.selects_namespace(ns.labels()))
            .map(|ns| ns.name_any())
            .collect())
    }
}

/// Starts the metadata watch of every namespace; returns its store.
fn start(client: Client) -> Store<PartialObjectMeta<Namespace>> {
    let (reader, writer) = reflector::store();
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    tokio::spawn(stream.for_each(|r| {
        if let Err(e) = r {
            warn!(error = %e, "Namespace watch error (retrying)");
        }
        async {}
    }));
    reader
}
