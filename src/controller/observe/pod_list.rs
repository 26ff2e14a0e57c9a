//! Which pods a drain considers, as the drain sees them ([`PodInfo`]), and
//! the two reads of them that bypass the cache: one node's pods and every
//! bound pod in pages.
//!
//! Follows `kubectl drain --ignore-daemonsets --delete-emptydir-data`
//! (k8s.io/kubectl `pkg/drain`): DaemonSet pods and mirror (static) pods
//! stay, finished pods do not count; what is done with the others is the
//! plan's ([`crate::controller::decide::plan`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus};
use kube::api::{Api, ListParams};
use kube::core::{ApiResource, Object};
use kube::{Client, ResourceExt};
use serde::Deserialize;

/// Annotation the kubelet puts on mirror pods of static pods.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Kubernetes' default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE_SECONDS: i64 = 30;
/// A pod that the drain has to consider on a node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, sent as the eviction's precondition so that a pod recreated
    /// under the same name is never evicted in its predecessor's place.
    pub uid: String,
    /// Labels, to find the PodDisruptionBudgets that select the pod;
    /// shared by the pods of one workload in the pod cache (the pods of a
    /// ReplicaSet carry the same labels: 10,000 pods' own copies were 4.3 MB).
    pub labels: Arc<BTreeMap<String, String>>,
    /// Whether a controller (ReplicaSet, StatefulSet, Job, ...) owns the pod
    /// and will recreate it elsewhere. `kubectl drain` refuses to delete
    /// pods without one unless `--force`: nothing would bring them back.
    pub managed: bool,
    /// Set when the pod is already being deleted: wait for it, never evict again.
    pub terminating: Option<Terminating>,
    /// `terminationGracePeriodSeconds` (Kubernetes default 30).
    pub grace_seconds: i64,
}

/// A pod being deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminating {
    /// `metadata.deletionTimestamp`: the time by which the kubelet must have
    /// stopped it (deletion time plus its grace period).
    pub deadline: DateTime<Utc>,
    /// `metadata.finalizers`: what keeps the object after its containers stopped.
    pub finalizers: Vec<String>,
}

impl PodInfo {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The fields of a pod's spec the drain reads; the rest of each watched pod
/// (containers, volumes...) is never built (kube's `Object` with local
/// structs: a 10,000-pod watch allocates a fraction of what whole `Pod`s
/// cost).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecFields {
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    termination_grace_period_seconds: Option<i64>,
}

/// The fields of a pod's status the drain and [`crate::controller::observe::pods::agent_pod`] read.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct StatusFields {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    conditions: Option<Vec<PodCondition>>,
}

/// A pod as the cache watches it: metadata, and the fields above.
pub type PartialPod = Object<SpecFields, StatusFields>;

/// `partial` as a `Pod` with only those fields, for [`classify_pod`].
pub fn as_pod(partial: PartialPod) -> Pod {
    Pod {
        metadata: partial.metadata,
        spec: Some(PodSpec {
            node_name: partial.spec.node_name,
            termination_grace_period_seconds: partial.spec.termination_grace_period_seconds,
            ..PodSpec::default()
        }),
        status: partial.status.map(|s| PodStatus {
            phase: s.phase,
            conditions: s.conditions,
            ..PodStatus::default()
        }),
    }
}

/// Errors of the drain's reads of pods.
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
    /// Listing the namespaces (for the policy's
    /// `excludePods.namespaceSelector`) failed.
    #[error("failed to list namespaces for excludePods.namespaceSelector: {0}")]
    ListNamespaces(#[source] kube::Error),
    /// The namespaces' watch (for the policy's
    /// `excludePods.namespaceSelector`) has not listed them yet.
    #[error(
        "the namespaces are not listed yet (excludePods.namespaceSelector needs their labels); is the controller allowed to list and watch them?"
    )]
    NamespacesNotListed,
}

/// Why a pod is left out of a drain altogether (`kubectl drain
/// --ignore-daemonsets`): it stays on its node, or it no longer counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftOut {
    /// Its controller is a DaemonSet: the DaemonSet controller ignores the
    /// cordon and would recreate it on the node at once.
    DaemonSet,
    /// A mirror pod of a static pod (annotation
    /// `kubernetes.io/config.mirror`): the kubelet runs it from a file, the
    /// API server cannot evict it.
    Mirror,
    /// Phase `Succeeded` or `Failed`: its containers have stopped.
    Finished,
}

impl LeftOut {
    /// Why, for people: `DaemonSet pod`.
    pub fn describe(self) -> &'static str {
        match self {
            LeftOut::DaemonSet => {
                "DaemonSet pod: stays on its node (kubectl drain --ignore-daemonsets)"
            }
            LeftOut::Mirror => {
                "mirror pod of a static pod: the kubelet runs it, it cannot be evicted"
            }
            LeftOut::Finished => "finished (Succeeded or Failed): nothing left to stop",
        }
    }
}

/// Whether the drain leaves `pod` out altogether, and why; `None` when it
/// is the drain's to consider ([`classify_pod`]).
pub fn left_out(pod: &Pod) -> Option<LeftOut> {
    let daemonset = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .is_some_and(|o| o.kind == "DaemonSet");
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    if daemonset {
        Some(LeftOut::DaemonSet)
    } else if pod.annotations().contains_key(MIRROR_ANNOTATION) {
        Some(LeftOut::Mirror)
    } else if finished {
        Some(LeftOut::Finished)
    } else {
        None
    }
}

/// The pod as the drain sees it, or `None` when the pod stays on the node or
/// does not count ([`left_out`]): owned by a DaemonSet, a mirror pod, or finished.
pub fn classify_pod(pod: &Pod) -> Option<PodInfo> {
    if left_out(pod).is_some() {
        return None;
    }
    let controller = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    Some(PodInfo {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        labels: Arc::new(pod.labels().clone()),
        managed: controller.is_some(),
        terminating: pod
            .metadata
            .deletion_timestamp
            .as_ref()
            .map(|t| Terminating {
                deadline: chrono_time(&t.0),
                finalizers: pod.finalizers().to_vec(),
            }),
        grace_seconds: pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(DEFAULT_GRACE_SECONDS),
    })
}

pub fn chrono_time(t: &k8s_openapi::jiff::Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp(
        t.as_second(),
        u32::try_from(t.subsec_nanosecond()).unwrap_or(0),
    )
    .unwrap_or_else(Utc::now)
}

/// The pods on `node` that the drain considers.
///
/// # Errors
/// [`Error::ListPods`] when the API server cannot be read.
pub async fn pods_on(client: &Client, node: &str) -> Result<Vec<PodInfo>, Error> {
    let list = partial_pods(client)
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|source| Error::ListPods {
            node: node.into(),
            source,
        })?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|p| classify_pod(&as_pod(p)))
        .collect())
}

/// Pods read as the pod cache reads them ([`PartialPod`]: metadata, node,
/// grace, phase), so that a list of thousands builds no containers,
/// volumes or conditions.
fn partial_pods(client: &Client) -> Api<PartialPod> {
    Api::all_with(client.clone(), &ApiResource::erase::<Pod>(&()))
}

/// How many pods one page of [`pods_by_node`]'s list holds.
pub const POD_LIST_PAGE: u32 = 500;

/// The pods on each of `nodes` that the drain considers, from one
/// paginated list (`page` pods a request, e.g. [`POD_LIST_PAGE`]) of every
/// bound pod, a consistent read as [`pods_on`]'s: for an event of many
/// nodes, a few requests instead of one per node. A node without pods maps
/// to an empty list.
///
/// # Errors
/// [`Error::ListPods`] (naming the first node) when a page cannot be read.
pub async fn pods_by_node(
    client: &Client,
    nodes: &std::collections::HashSet<String>,
    page: u32,
) -> Result<HashMap<String, Vec<PodInfo>>, Error> {
    let api = partial_pods(client);
    let mut by_node: HashMap<String, Vec<PodInfo>> =
        nodes.iter().map(|n| (n.clone(), Vec::new())).collect();
    let mut params = ListParams::default()
        .fields("spec.nodeName!=")
        .limit(page.max(1));
    loop {
        let page = api.list(&params).await.map_err(|source| Error::ListPods {
            node: nodes.iter().next().cloned().unwrap_or_default(),
            source,
        })?;
        let next = page.metadata.continue_.filter(|c| !c.is_empty());
        for pod in page.items {
            let pod = as_pod(pod);
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            if let Some(pods) = node.and_then(|n| by_node.get_mut(n))
                && let Some(info) = classify_pod(&pod)
            {
                pods.push(info);
            }
        }
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(by_node),
        }
    }
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
    fn replicaset_pods_are_managed_and_bare_pods_are_not() {
        let info = classify_pod(&pod(Some("ReplicaSet"), "Running")).unwrap();
        assert_eq!((info.namespace.as_str(), info.grace_seconds), ("ns", 45));
        assert!(info.managed);
        assert!(info.terminating.is_none());
        let bare = classify_pod(&pod(None, "Running")).unwrap();
        assert!(!bare.managed);
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
