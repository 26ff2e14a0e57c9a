//! Draining: which pods must leave a node, and evicting them through the
//! Eviction API so that PodDisruptionBudgets are honoured.
//!
//! Follows `kubectl drain` (k8s.io/kubectl `pkg/drain`): DaemonSet pods and
//! mirror (static) pods stay, finished pods do not count, a 429 is "blocked
//! by a PodDisruptionBudget, retry later" and never bypassed, a 404 means the
//! pod is already gone. Unlike kubectl, pods with `emptyDir` and pods without
//! a controller are evicted too: the VM is about to lose them anyway.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Preconditions};
use kube::{Client, ResourceExt};

use super::plan::{Eviction, EvictionOutcome, PodInfo};

/// Annotation the kubelet puts on mirror pods of static pods.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Kubernetes' default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// Errors of the drain's reads.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Listing a node's pods failed.
    #[error("failed to list pods of node {node}: {source}")]
    ListPods {
        /// Node name.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// The pod as the drain sees it, or `None` when the pod stays on the node or
/// does not count: owned by a DaemonSet, a mirror pod, or finished.
pub fn classify_pod(pod: &Pod) -> Option<PodInfo> {
    let daemonset = pod
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind == "DaemonSet");
    let mirror = pod.annotations().contains_key(MIRROR_ANNOTATION);
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    if daemonset || mirror || finished {
        return None;
    }
    Some(PodInfo {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        grace_seconds: pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(DEFAULT_GRACE_SECONDS),
    })
}

/// The pods that must leave `node`.
///
/// # Errors
/// [`Error::ListPods`] when the API server cannot be read.
pub async fn pods_to_drain(client: &Client, node: &str) -> Result<Vec<PodInfo>, Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|source| Error::ListPods {
            node: node.into(),
            source,
        })?;
    Ok(list.items.iter().filter_map(classify_pod).collect())
}

/// Requests one eviction. `client` must not retry 429s by itself (kube's
/// default retry policy would hide a blocking PodDisruptionBudget for minutes).
pub async fn evict(client: &Client, e: &Eviction) -> EvictionOutcome {
    let api: Api<Pod> = Api::namespaced(client.clone(), &e.pod.namespace);
    let params = EvictParams {
        delete_options: Some(DeleteParams {
            grace_period_seconds: Some(u32::try_from(e.grace_seconds.max(0)).unwrap_or(0)),
            preconditions: Some(Preconditions {
                uid: Some(e.pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        }),
        post_options: Default::default(),
    };
    match api.evict(&e.pod.name, &params).await {
        Ok(_) => EvictionOutcome::Evicted,
        Err(kube::Error::Api(s)) if s.code == 429 => {
            let cause = s
                .details
                .as_ref()
                .and_then(|d| d.causes.iter().find(|c| c.reason == "DisruptionBudget"))
                .map(|c| c.message.clone());
            EvictionOutcome::Blocked(format!(
                "PodDisruptionBudget: {}",
                cause.unwrap_or_else(|| s.message.clone())
            ))
        }
        // Gone, or recreated under the same name (UID precondition failed).
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => EvictionOutcome::Gone,
        Err(err) => EvictionOutcome::Failed(err.to_string()),
    }
}

/// Requests `evictions` concurrently, at most `per_node` at once per node,
/// and returns `(node, pod, outcome)` for each.
pub async fn evict_all(
    client: &Client,
    evictions: &[Eviction],
    per_node: usize,
) -> Vec<(String, String, EvictionOutcome)> {
    let mut by_node: Vec<(String, Vec<Eviction>)> = Vec::new();
    for e in evictions {
        match by_node.iter_mut().find(|(n, _)| *n == e.node) {
            Some((_, v)) => v.push(e.clone()),
            None => by_node.push((e.node.clone(), vec![e.clone()])),
        }
    }
    let per_node = per_node.max(1);
    let nodes = by_node.into_iter().map(|(_, list)| {
        let client = client.clone();
        async move {
            futures::stream::iter(list)
                .map(move |e| {
                    let client = client.clone();
                    async move {
                        let outcome = evict(&client, &e).await;
                        (e.node, e.pod.name, outcome)
                    }
                })
                .buffer_unordered(per_node)
                .collect::<Vec<_>>()
                .await
        }
    });
    futures::future::join_all(nodes)
        .await
        .into_iter()
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;

    fn pod(owner_kind: Option<&str>, phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                owner_references: owner_kind.map(|k| {
                    vec![OwnerReference {
                        api_version: "apps/v1".into(),
                        kind: k.into(),
                        name: "o".into(),
                        uid: "ou".into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            spec: Some(PodSpec {
                termination_grace_period_seconds: Some(45),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn replicaset_and_bare_pods_must_leave() {
        let info = classify_pod(&pod(Some("ReplicaSet"), "Running")).unwrap();
        assert_eq!((info.namespace.as_str(), info.grace_seconds), ("ns", 45));
        assert!(!info.terminating);
        assert!(classify_pod(&pod(None, "Running")).is_some());
    }

    #[test]
    fn daemonset_mirror_and_finished_pods_stay() {
        assert!(classify_pod(&pod(Some("DaemonSet"), "Running")).is_none());
        assert!(classify_pod(&pod(Some("ReplicaSet"), "Succeeded")).is_none());
        assert!(classify_pod(&pod(None, "Failed")).is_none());
        let mut m = pod(None, "Running");
        m.metadata.annotations = Some([(MIRROR_ANNOTATION.to_string(), "x".to_string())].into());
        assert!(classify_pod(&m).is_none());
    }
}
