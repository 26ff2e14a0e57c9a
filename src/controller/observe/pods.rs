//! The drain's cache of pods, by node: one watch of every pod (kube's
//! watcher, resuming from its `resourceVersion`), kept as the few fields
//! the drain reads ([`PodInfo`], a few hundred bytes a pod) and indexed by
//! node, so that a drain of a thousand nodes costs the API server no LIST
//! per node per pass, and the controller no copy of whole pods.
//!
//! A cache lags the API server by the watch's delay. For evictions that is
//! harmless (a pod already gone is evicted once more and answers 404; a pod
//! not yet seen is evicted on a later pass). For the approval it is not: a
//! pod bound to the node just before its cordon might not be in the cache
//! yet. So the approval decision reads each node's pods afresh (one LIST a
//! node, once) before it is recorded (see `reconcile`).
//!
//! The pods that take part (see [`crate::controller::act::notice`]), DaemonSet pods among
//! them, are indexed by node too, each with its notice and acknowledgement
//! annotations only; a change of a pod's acknowledgements wakes the event
//! it names ([`PodCache::with_ack_trigger`]).
//!
//! The forewarn agent's own pods are indexed by node with whether each is
//! Ready ([`PodCache::agent_up`]): an agent whose pod on its node is absent
//! or not Ready is silent (see `trust`). Its readiness is the pod's status,
//! which only that node's kubelet writes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::core::ApiResource;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tracing::warn;

use crate::controller::observe::participants::{ACK_PREFIX, Participant};
use crate::controller::observe::pod_list::{
    PartialPod, PodInfo, Terminating, as_pod, classify_pod,
};
use crate::kubeclient::watch_backoff;

/// Pods that count for a drain, by node, then by UID.
type ByNode = HashMap<String, HashMap<String, Arc<PodInfo>>>;

/// The label the chart gives each role's objects (`agent`, `controller`).
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";

/// The label the chart gives every object of forewarn (`forewarn`).
pub const PART_OF_LABEL: &str = "app.kubernetes.io/part-of";

/// Whether `pod` is a forewarn agent's (labels `app.kubernetes.io/part-of:
/// forewarn` and `app.kubernetes.io/component: agent`, controlled by a
/// DaemonSet), and if so whether it is up: Ready (its kubelet's word),
/// running and not being deleted.
pub fn agent_pod(pod: &Pod) -> Option<bool> {
    let labels = pod.metadata.labels.as_ref()?;
    let is = |k: &str, v: &str| labels.get(k).is_some_and(|l| l == v);
    let by_daemon_set = pod
        .owner_references()
        .iter()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    if !(is(PART_OF_LABEL, "forewarn") && is(COMPONENT_LABEL, "agent") && by_daemon_set) {
        return None;
    }
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    Some(ready && running && pod.metadata.deletion_timestamp.is_none())
}

#[derive(Default)]
struct State {
    by_node: ByNode,
    /// The node of each pod cached, by UID (to move or drop it).
    node_of: HashMap<String, String>,
    /// Whether a first list has completed.
    ready: bool,
    /// One copy of each label set cached pods carry (see [`PodInfo::labels`]).
    labels: HashSet<Arc<BTreeMap<String, String>>>,
    /// How many label sets were kept at the last purge of unused ones.
    labels_kept: usize,
    /// The pods that take part, by node, then by UID.
    participants: HashMap<String, HashMap<String, Arc<Participant>>>,
    /// The node of each participant cached, by UID.
    participant_node: HashMap<String, String>,
    /// The agent pods, by node, then by UID: `(namespace, up)`.
    agents: HashMap<String, HashMap<String, (String, bool)>>,
    /// The node of each agent pod cached, by UID.
    agent_node: HashMap<String, String>,
    /// Pods this controller evicted that the watch has not yet shown being
    /// deleted, by UID, each with its deadline (the eviction's time plus
    /// the grace it asked for): read as terminating ([`PodCache::evicted`]).
    evicted: HashMap<String, DateTime<Utc>>,
}

impl State {
    /// The cache's copy of `labels`, added if new. Copies no pod uses any
    /// more are dropped once the set doubled since the last purge.
    fn shared(&mut self, labels: Arc<BTreeMap<String, String>>) -> Arc<BTreeMap<String, String>> {
        if let Some(known) = self.labels.get(&labels) {
            return Arc::clone(known);
        }
        if self.labels.len() >= 2 * self.labels_kept.max(64) {
            self.labels.retain(|l| Arc::strong_count(l) > 1);
            self.labels_kept = self.labels.len();
        }
        self.labels.insert(Arc::clone(&labels));
        labels
    }

    /// Forgets the pod `uid`; returns it as a participant, if it was one.
    fn remove(&mut self, uid: &str) -> Option<Arc<Participant>> {
        if let Some(node) = self.agent_node.remove(uid)
            && let Some(pods) = self.agents.get_mut(&node)
        {
            pods.remove(uid);
            if pods.is_empty() {
                self.agents.remove(&node);
            }
        }
        if let Some(node) = self.node_of.remove(uid)
            && let Some(pods) = self.by_node.get_mut(&node)
        {
            pods.remove(uid);
            if pods.is_empty() {
                self.by_node.remove(&node);
            }
        }
        let node = self.participant_node.remove(uid)?;
        let pods = self.participants.get_mut(&node)?;
        let was = pods.remove(uid);
        if pods.is_empty() {
            self.participants.remove(&node);
        }
        was
    }

    /// Forgets the pod `uid` the watch saw deleted, with its eviction's
    /// mark; returns it as a participant, if it was one.
    fn deleted(&mut self, uid: &str) -> Option<Arc<Participant>> {
        self.evicted.remove(uid);
        self.remove(uid)
    }

    /// Caches `pod` if it counts for a drain and is bound to a node, and
    /// as a participant if it takes part; forgets it otherwise (a pod that
    /// finished, say). Returns the events whose acknowledgement on it
    /// changed.
    fn apply(&mut self, pod: &Pod) -> Vec<String> {
        let uid = pod.uid().unwrap_or_default();
        let before = self.remove(&uid);
        let changed = self.cache(pod, &uid, before.as_deref());
        // The watch's own word on a pod this controller evicted replaces
        // the mark once it says more: the pod being deleted, or no longer
        // one the drain considers. An older version (the watch lagging
        // behind the eviction) keeps it.
        if self.cached(&uid).is_none_or(|p| p.terminating.is_some()) {
            self.evicted.remove(&uid);
        }
        changed
    }

    /// The pod `uid` as the drain considers it, if cached.
    fn cached(&self, uid: &str) -> Option<&Arc<PodInfo>> {
        self.by_node.get(self.node_of.get(uid)?)?.get(uid)
    }

    /// [`State::apply`] but for the eviction marks: `pod` (UID `uid`)
    /// cached afresh, `before` its participant record before.
    fn cache(&mut self, pod: &Pod, uid: &str, before: Option<&Participant>) -> Vec<String> {
        let uid = uid.to_owned();
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return acks_changed(before, None);
        };
        if let Some(mut info) = classify_pod(pod) {
            info.labels = self.shared(info.labels);
            self.node_of.insert(uid.clone(), node.clone());
            self.by_node
                .entry(node.clone())
                .or_default()
                .insert(uid.clone(), Arc::new(info));
        }
        if let Some(up) = agent_pod(pod) {
            let namespace = pod.namespace().unwrap_or_default();
            self.agent_node.insert(uid.clone(), node.clone());
            self.agents
                .entry(node.clone())
                .or_default()
                .insert(uid.clone(), (namespace, up));
        }
        let now = Participant::from_pod(pod).map(Arc::new);
        let changed = acks_changed(before, now.as_deref());
        if let Some(p) = now {
            self.participant_node.insert(uid.clone(), node.clone());
            self.participants.entry(node).or_default().insert(uid, p);
        }
        changed
    }
}

/// The events whose acknowledgement differs between two versions of a
/// participant (either may be absent).
fn acks_changed(before: Option<&Participant>, now: Option<&Participant>) -> Vec<String> {
    let acks = |p: Option<&Participant>| -> BTreeMap<String, String> {
        p.map(|p| {
            p.annotations
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(ACK_PREFIX)?.to_string(), v.clone())))
                .collect()
        })
        .unwrap_or_default()
    };
    let (a, b) = (acks(before), acks(now));
    let mut events: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(*v))
        .chain(b.iter().filter(|(k, v)| a.get(*k) != Some(*v)))
        .map(|(k, _)| k.clone())
        .collect();
    events.sort();
    events.dedup();
    events
}

/// A cache of the pods the drain considers, by node, of the pods that
/// take part, and of the agent's pods (of the namespace given, if any).
#[derive(Clone, Default)]
pub struct PodCache(Arc<RwLock<State>>, Option<AckTrigger>, Option<Arc<str>>);

/// Where the names of events whose acknowledgements changed are sent.
type AckTrigger = futures::channel::mpsc::UnboundedSender<String>;

impl PodCache {
    /// This cache, sending the name of the `ScheduledEvent` an
    /// acknowledgement names to `trigger` whenever one is written or
    /// removed (the controller reconciles that event at once).
    pub fn with_ack_trigger(self, trigger: AckTrigger) -> Self {
        PodCache(self.0, Some(trigger), self.2)
    }

    /// This cache, taking as the agent's only the pods of `namespace` (the
    /// controller's own: the chart installs both there), so that a pod
    /// someone labels alike elsewhere says nothing of an agent.
    pub fn with_agent_namespace(self, namespace: &str) -> Self {
        PodCache(self.0, self.1, Some(Arc::from(namespace)))
    }

    /// Whether the agent of `node` is up: a pod of the agent's DaemonSet on
    /// it is Ready (see [`agent_pod`]). An agent without one is silent.
    pub fn agent_up(&self, node: &str) -> bool {
        self.read().agents.get(node).is_some_and(|pods| {
            pods.values()
                .any(|(ns, up)| *up && self.2.as_deref().is_none_or(|want| want == ns))
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The pods on `node` that take part, in name order.
    pub fn participants_on(&self, node: &str) -> Vec<Arc<Participant>> {
        let mut pods: Vec<Arc<Participant>> = self
            .read()
            .participants
            .get(node)
            .map(|p| p.values().cloned().collect())
            .unwrap_or_default();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        pods
    }

    /// The participants holding a notice or an acknowledgement of the
    /// event `event`, wherever they are.
    pub fn holders_of(&self, event: &str) -> Vec<Arc<Participant>> {
        self.read()
            .participants
            .values()
            .flat_map(HashMap::values)
            .filter(|p| p.holds(event))
            .cloned()
            .collect()
    }

    /// Every participant holding a notice or an acknowledgement of any
    /// event (for the sweep).
    pub fn holders(&self) -> Vec<Arc<Participant>> {
        self.read()
            .participants
            .values()
            .flat_map(HashMap::values)
            .filter(|p| !p.annotations.is_empty())
            .cloned()
            .collect()
    }

    /// The pods on `node` that the drain considers, as last watched, in
    /// name order.
    pub fn on_node(&self, node: &str) -> Vec<Arc<PodInfo>> {
        let state = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut pods: Vec<Arc<PodInfo>> = state
            .by_node
            .get(node)
            .map(|p| {
                p.values()
                    .map(|pod| match state.evicted.get(&pod.uid) {
                        Some(deadline) if pod.terminating.is_none() => Arc::new(PodInfo {
                            terminating: Some(Terminating {
                                deadline: *deadline,
                                finalizers: Vec::new(),
                            }),
                            ..PodInfo::clone(pod)
                        }),
                        _ => Arc::clone(pod),
                    })
                    .collect()
            })
            .unwrap_or_default();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        pods
    }

    /// Takes the cached pod `uid` as being deleted, by `deadline`, until the
    /// watch shows it so (or gone): this controller evicted it and the API
    /// server accepted (201), which sets the pod's `deletionTimestamp`
    /// (the eviction's time plus the grace asked for, `deadline`). The
    /// watch shows that version later, under load seconds later (a 200-VM
    /// Spot wave: 7 s and more), and a pass meanwhile would evict the pod
    /// again: a request spent in its budget's turn, and a shorter grace
    /// than the one it was given (each eviction of a terminating pod sets
    /// it afresh). A pod not cached is left alone (its first version seen
    /// will say it is being deleted).
    pub fn evicted(&self, uid: &str, deadline: DateTime<Utc>) {
        let mut state = self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.cached(uid).is_some_and(|p| p.terminating.is_none()) {
            state.evicted.insert(uid.to_owned(), deadline);
        }
    }

    /// Whether a first list has completed.
    pub fn ready(&self) -> bool {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .ready
    }

    /// How many pods are cached.
    pub fn len(&self) -> usize {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .node_of
            .len()
    }

    /// Whether no pod is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn trigger(&self, events: Vec<String>) {
        if let Some(t) = &self.1 {
            for e in events {
                let _ = t.unbounded_send(e);
            }
        }
    }

    /// Fills the cache from a watch of every pod until the task is aborted;
    /// errors are logged and the watch resumes after [`watch_backoff`].
    pub async fn run(self, client: Client) {
        // A consistent, paginated list (the default): `resourceVersion=0`
        // would have the API server send every pod of the cluster in one
        // response.
        let api: Api<PartialPod> = Api::all_with(client, &ApiResource::erase::<Pod>(&()));
        let stream = watcher(api, watcher::Config::default()).backoff(watch_backoff());
        futures::pin_mut!(stream);
        // A relist builds a fresh index, swapped in whole when complete.
        let mut fresh: Option<State> = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok(watcher::Event::Init) => fresh = Some(State::default()),
                Ok(watcher::Event::InitApply(pod)) => {
                    if let Some(f) = fresh.as_mut() {
                        f.apply(&as_pod(pod));
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(mut f) = fresh.take() {
                        f.ready = true;
                        *self
                            .0
                            .write()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = f;
                    }
                }
                Ok(watcher::Event::Apply(pod)) => {
                    let pod = as_pod(pod);
                    let changed = self
                        .0
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .apply(&pod);
                    self.trigger(changed);
                }
                Ok(watcher::Event::Delete(pod)) => {
                    let was = self
                        .0
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .deleted(&pod.uid().unwrap_or_default());
                    self.trigger(acks_changed(was.as_deref(), None));
                }
                Err(e) => warn!(error = %e, "Pod watch failed; resuming after a backoff"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, node: Option<&str>, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("p-{uid}"), "namespace": "ns", "uid": uid,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "o", "controller": true}]},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase},
        }))
        .expect("pod")
    }

    /// A whole pod, as the API server sends it, read as the partial object
    /// the cache watches, gives the drain the same view as the whole `Pod`:
    /// no field it reads is lost.
    #[test]
    fn a_partial_pod_gives_the_drain_what_the_whole_pod_does() {
        let full = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u1",
                "labels": {"app": "web", "pod-template-hash": "6f9"},
                "annotations": {"a": "b"},
                "deletionTimestamp": "2026-11-26T01:29:11Z",
                "finalizers": ["example.com/hold"],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-6f9", "uid": "o", "controller": true}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 45,
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                    "env": [{"name": "X", "value": "1"}]}],
                "volumes": [{"name": "v", "emptyDir": {}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}]},
        });
        let whole: Pod = serde_json::from_value(full.clone()).expect("pod");
        let partial: PartialPod = serde_json::from_value(full).expect("partial pod");
        let from_partial = classify_pod(&as_pod(partial)).expect("counts for the drain");
        assert_eq!(Some(from_partial.clone()), classify_pod(&whole));
        assert_eq!(from_partial.grace_seconds, 45);
        assert!(from_partial.managed && from_partial.terminating.is_some());
        // A DaemonSet's pod, a finished pod: left out either way.
        let mut ds = serde_json::to_value(&whole).expect("json");
        ds["metadata"]["ownerReferences"][0]["kind"] = "DaemonSet".into();
        let ds_partial: PartialPod = serde_json::from_value(ds).expect("partial");
        assert_eq!(classify_pod(&as_pod(ds_partial)), None);
        let mut done = serde_json::to_value(&whole).expect("json");
        done["status"]["phase"] = "Succeeded".into();
        let done_partial: PartialPod = serde_json::from_value(done).expect("partial");
        assert_eq!(classify_pod(&as_pod(done_partial)), None);
    }

    #[test]
    fn pods_are_indexed_by_node_and_moved_or_dropped_as_they_change() {
        let mut s = State::default();
        s.apply(&pod("a", Some("n1"), "Running"));
        s.apply(&pod("b", Some("n1"), "Running"));
        s.apply(&pod("c", None, "Pending"));
        let cache = PodCache(Arc::new(RwLock::new(s)), None, None);
        assert_eq!(cache.on_node("n1").len(), 2);
        assert_eq!(cache.len(), 2, "an unbound pod is on no node");
        {
            let mut s = cache.0.write().unwrap();
            // Finished: it no longer counts.
            s.apply(&pod("a", Some("n1"), "Succeeded"));
            s.apply(&pod("c", Some("n2"), "Running"));
        }
        assert_eq!(
            cache
                .on_node("n1")
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["p-b"]
        );
        assert_eq!(cache.on_node("n2").len(), 1);
        cache.0.write().unwrap().remove("b");
        assert!(cache.on_node("n1").is_empty());
        assert!(
            !cache.0.read().unwrap().by_node.contains_key("n1"),
            "no empty entry kept"
        );
    }

    /// A pod this controller evicted reads as terminating, by the deadline
    /// its eviction set, until the watch says more: a version from before
    /// the eviction (the watch lagging) keeps the mark; the version being
    /// deleted replaces it with the API server's own deadline; the pod's
    /// deletion drops it. A pod not cached, or one the watch already shows
    /// being deleted, is not marked.
    #[test]
    fn an_evicted_pod_reads_as_terminating_until_the_watch_shows_it() {
        let cache = PodCache::default();
        let apply = |p: &Pod| cache.0.write().unwrap().apply(p);
        let terminating = |uid: &str| {
            cache
                .on_node("n1")
                .iter()
                .find(|p| p.uid == uid)
                .and_then(|p| p.terminating.clone())
        };
        apply(&pod("a", Some("n1"), "Running"));
        apply(&pod("b", Some("n1"), "Running"));
        let deadline = chrono::DateTime::parse_from_rfc3339("2026-11-28T01:00:22Z")
            .unwrap()
            .with_timezone(&Utc);
        cache.evicted("a", deadline);
        cache.evicted("unknown", deadline);
        assert_eq!(terminating("a").map(|t| t.deadline), Some(deadline));
        assert_eq!(terminating("b"), None, "only the pod evicted");
        assert!(!cache.0.read().unwrap().evicted.contains_key("unknown"));
        // A status change from before the eviction, seen after it.
        let mut older = pod("a", Some("n1"), "Running");
        older.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        apply(&older);
        assert_eq!(terminating("a").map(|t| t.deadline), Some(deadline));
        // The version being deleted: the API server's deadline.
        let mut deleting = pod("a", Some("n1"), "Running");
        let real = deadline - chrono::TimeDelta::seconds(1);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(real.timestamp()).unwrap(),
            ));
        apply(&deleting);
        assert_eq!(terminating("a").map(|t| t.deadline), Some(real));
        assert!(cache.0.read().unwrap().evicted.is_empty());
        // Already being deleted: nothing to mark.
        cache.evicted("a", deadline);
        assert!(cache.0.read().unwrap().evicted.is_empty());
        // Marked, then deleted: the mark goes with it.
        cache.evicted("b", deadline);
        assert!(terminating("b").is_some());
        let mut s = cache.0.write().unwrap();
        s.deleted("b");
        assert!(s.evicted.is_empty() && !s.node_of.contains_key("b"));
    }

    /// Pods that take part are indexed by node, DaemonSet pods too, with
    /// their notice and acknowledgement annotations only; a change of an
    /// acknowledgement names its event, a notice change does not.
    #[test]
    fn participants_are_indexed_and_acknowledgement_changes_name_their_event() {
        let part = |uid: &str, kind: &str, annotations: serde_json::Value| {
            let mut p = pod(uid, Some("n1"), "Running");
            p.metadata.labels = Some(
                [(
                    crate::controller::observe::participants::ACKNOWLEDGE_LABEL.to_string(),
                    "true".to_string(),
                )]
                .into(),
            );
            p.metadata.owner_references.as_mut().unwrap()[0].kind = kind.into();
            p.metadata.annotations = serde_json::from_value(annotations).unwrap();
            p
        };
        let mut s = State::default();
        assert!(
            s.apply(&part("a", "DaemonSet", serde_json::json!({"other": "x"})))
                .is_empty()
        );
        assert!(s.apply(&pod("b", Some("n1"), "Running")).is_empty());
        let cache = PodCache(Arc::new(RwLock::new(s)), None, None);
        assert_eq!(
            cache.on_node("n1").len(),
            1,
            "the DaemonSet's pod is not drained"
        );
        let on = cache.participants_on("n1");
        assert_eq!(on.len(), 1);
        assert!(
            on[0].annotations.is_empty(),
            "other annotations are not kept"
        );
        let mut s = cache.0.write().unwrap();
        let notice = serde_json::json!({"notice.forewarn.dev/ev1": "eventId=EV1"});
        assert!(s.apply(&part("a", "DaemonSet", notice)).is_empty());
        let acked = serde_json::json!({"notice.forewarn.dev/ev1": "eventId=EV1", "ack.forewarn.dev/ev1": "EV1"});
        assert_eq!(s.apply(&part("a", "DaemonSet", acked.clone())), ["ev1"]);
        assert!(
            s.apply(&part("a", "DaemonSet", acked)).is_empty(),
            "unchanged"
        );
        drop(s);
        assert_eq!(cache.holders_of("ev1").len(), 1);
        assert!(cache.holders_of("ev2").is_empty());
        let was = cache.0.write().unwrap().remove("a");
        assert_eq!(acks_changed(was.as_deref(), None), ["ev1"]);
        assert!(cache.participants_on("n1").is_empty());
        assert!(cache.holders().is_empty());
    }

    /// The pods of one workload share one copy of their labels, and a
    /// label set no pod uses any more is dropped at the next purge.
    #[test]
    fn pods_with_the_same_labels_share_one_copy() {
        let labelled = |uid: &str, app: &str| {
            let mut p = pod(uid, Some("n1"), "Running");
            p.metadata.labels = Some([("app".to_string(), app.to_string())].into());
            p
        };
        let mut s = State::default();
        s.apply(&labelled("a", "web"));
        s.apply(&labelled("b", "web"));
        s.apply(&labelled("c", "db"));
        let pods = &s.by_node["n1"];
        assert!(Arc::ptr_eq(&pods["a"].labels, &pods["b"].labels));
        assert!(!Arc::ptr_eq(&pods["a"].labels, &pods["c"].labels));
        assert_eq!(s.labels.len(), 2);
        // 200 workloads come and go: unused label sets do not pile up.
        for i in 0..200 {
            s.apply(&labelled(&format!("x{i}"), &format!("app{i}")));
            s.remove(&format!("x{i}"));
        }
        assert!(s.labels.len() <= 130, "{} label sets kept", s.labels.len());
        assert!(
            s.labels
                .iter()
                .any(|l| l.get("app").is_some_and(|a| a == "web"))
        );
    }

    /// An agent is up only while its DaemonSet's pod on its node, in the
    /// controller's namespace, is Ready; absent, not Ready, being deleted,
    /// or a look-alike (elsewhere, or not a DaemonSet's), it is silent.
    #[test]
    fn an_agent_is_up_only_while_its_daemon_set_pod_on_the_node_is_ready() {
        let agent = |uid: &str, node: &str, ns: &str, kind: &str, ready: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("agent-{uid}"), "namespace": ns, "uid": uid,
                    "labels": {COMPONENT_LABEL: "agent", PART_OF_LABEL: "forewarn"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": "forewarn-agent", "uid": "ds", "controller": true}]},
                "spec": {"nodeName": node, "containers": []},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]},
            }))
            .expect("pod")
        };
        // Read as the cache watches it: the Ready condition is kept.
        let partial: PartialPod = serde_json::from_value(
            serde_json::to_value(agent("x", "n1", "forewarn", "DaemonSet", "True")).unwrap(),
        )
        .unwrap();
        assert_eq!(agent_pod(&as_pod(partial)), Some(true));
        assert_eq!(agent_pod(&pod("p", Some("n1"), "Running")), None);
        let mut s = State::default();
        s.apply(&agent("a", "n1", "forewarn", "DaemonSet", "True"));
        s.apply(&agent("b", "n2", "forewarn", "DaemonSet", "False"));
        s.apply(&agent("c", "n3", "elsewhere", "DaemonSet", "True"));
        s.apply(&agent("d", "n4", "forewarn", "ReplicaSet", "True"));
        let cache = PodCache(Arc::new(RwLock::new(s)), None, None).with_agent_namespace("forewarn");
        assert!(cache.agent_up("n1"));
        for silent in ["n2", "n3", "n4", "n5"] {
            assert!(!cache.agent_up(silent), "{silent}");
        }
        assert_eq!(cache.on_node("n1").len(), 0, "the agent is never drained");
        let mut deleting = agent("a", "n1", "forewarn", "DaemonSet", "True");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        cache.0.write().unwrap().apply(&deleting);
        assert!(!cache.agent_up("n1"), "being deleted");
        cache.0.write().unwrap().remove("a");
        assert!(!cache.agent_up("n1"), "gone");
        assert!(
            !cache.0.read().unwrap().agents.contains_key("n1"),
            "no empty entry kept"
        );
    }
}
