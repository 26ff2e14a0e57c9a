//! Carrying out a pass's plan: the node writes (cordon, taint, holds,
//! release), several nodes at once and each conditional on the node read,
//! and the evictions within the pass's share of the rate budget; each
//! announced by Kubernetes Events and counted.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType as KubeEventType;
use tracing::{debug, info, warn};

use crate::api::ScheduledEvent;
use crate::controller::act::publish::Subject;
use crate::controller::act::refused::RefusedWrites;
use crate::controller::act::writers::Writers;
use crate::controller::act::{cordon, drain, publish};
use crate::controller::decide::plan::{EvictionOutcome, NodeWrite, Plan};
use crate::controller::decide::status::Outcome;
use crate::controller::error::Error;
use crate::metrics::controller::ControllerMetrics;
use crate::policy::TaintEffect;
use crate::text::named;

/// Node writes in flight at once for one event.
const NODE_WRITE_CONCURRENCY: usize = 32;

/// How long one pass may spend asking for evictions (waiting for the rate
/// budget) when they are on more than [`FEW_NODES`] nodes: the rest is
/// deferred to the next pass, so that a pass over a large event ends soon
/// and what changed meanwhile (a node's report came in) is acted on within
/// about this long.
const EVICTION_PASS: std::time::Duration = std::time::Duration::from_secs(1);

/// How long one pass may spend asking for evictions on at most
/// [`FEW_NODES`] nodes: a node's evictions are a few in flight at once
/// (`--max-evictions-per-node`), each a write of its PodDisruptionBudget's
/// status that the API server orders, and a pass's own reads and writes
/// take about a second between two windows; a longer window drains a
/// crowded node in fewer passes. An event of few nodes has few other
/// changes to wait for meanwhile.
const EVICTION_PASS_FEW: std::time::Duration = std::time::Duration::from_secs(3);

/// Up to how many nodes a pass may act on and still be one of few: its
/// evictions get [`EVICTION_PASS_FEW`], and the pods of the nodes it
/// cordons are asked to leave in the same pass (see the reconcile's act).
pub const FEW_NODES: usize = 8;

/// How many conflicts in a row a node write for one event loses before it
/// is warned of (a log line at WARN and a `NodeWriteRefused` Event): about
/// 3 s of losing with [`crate::controller::act::refused`]'s backoff. Events
/// that share a node lose races to each other's writes all the time.
const CONFLICTS_BEFORE_WARNING: u32 = 5;

/// How many pods or nodes an Event names before it counts the rest.
pub const NAMED_IN_EVENT: usize = 5;

/// The Event reason, metric label and note of a node write.
fn describe(ev: &ScheduledEvent, w: &NodeWrite) -> (&'static str, &'static str, String) {
    let node = w.node();
    let (ty, name) = (&ev.spec.event_type, ev.name_any());
    match w {
        NodeWrite::Cordon { .. } => (
            "cordon",
            "Cordoned",
            format!("Cordoned and tainted {node} for {ty} {name}"),
        ),
        NodeWrite::AddHold { .. } => (
            "cordon",
            "CordonShared",
            format!("{node} stays cordoned, now also for {ty} {name}"),
        ),
        NodeWrite::Release { uncordon: true, .. } => (
            "uncordon",
            "Uncordoned",
            format!("Uncordoned {node}: {ty} {name} is over"),
        ),
        NodeWrite::Release { holds, .. } => (
            "release",
            "CordonReleased",
            format!(
                "Released {name}'s hold on {node}; it stays cordoned for {}",
                holds.join(", ")
            ),
        ),
    }
}

/// The note of the `ScheduledEvent`'s Event for one kind of node write
/// (`reason`, as [`describe`] gives it) on several `nodes`: how many, and
/// the first [`NAMED_IN_EVENT`] by name.
fn nodes_note(ev: &ScheduledEvent, reason: &str, nodes: Vec<&str>) -> String {
    let (ty, name) = (&ev.spec.event_type, ev.name_any());
    let n = nodes.len();
    let listed = first_named(nodes);
    match reason {
        "Cordoned" => format!("Cordoned and tainted {n} nodes for {ty} {name}: {listed}"),
        "CordonShared" => format!("{n} nodes stay cordoned, now also for {ty} {name}: {listed}"),
        "Uncordoned" => format!("Uncordoned {n} nodes: {ty} {name} is over: {listed}"),
        _ => format!(
            "Released {name}'s hold on {n} nodes; they stay cordoned for other events: {listed}"
        ),
    }
}

/// Carries out the plan's node writes, several nodes at once; a node
/// taken is tainted with `taint_effect` (the policy's). A write the API
/// server refuses fails that node alone: it is recorded in `refused`
/// (announced by a `NodeWriteRefused` Warning the first time, counted in
/// `forewarn_controller_reconcile_errors_total`) and not tried again until
/// its backoff has passed ([`crate::controller::act::refused::backoff`]), while the other nodes'
/// writes go on. Returns the nodes whose planned write was not made this
/// pass (refused now, or still waiting for their backoff).
pub async fn write_nodes(
    ev: &ScheduledEvent,
    plan: &Plan,
    snapshots: &HashMap<String, Arc<Node>>,
    writers: &Writers,
    refused: &RefusedWrites,
    exclude_lb: bool,
    taint_effect: TaintEffect,
) -> HashSet<String> {
    let api: Api<Node> = Api::all(writers.client.clone());
    let versions = &writers.written_marks;
    let name = ev.name_any();
    let now = tokio::time::Instant::now();
    let mut not_written = HashSet::new();
    refused.keep_planned(
        &name,
        &plan.node_writes.iter().map(NodeWrite::node).collect(),
    );
    let mut writes = Vec::new();
    for w in &plan.node_writes {
        let Some(node) = snapshots.get(w.node()).cloned() else {
            continue;
        };
        if refused.waiting(&name, w.node(), now) {
            not_written.insert(w.node().to_owned());
            continue;
        }
        let (api, w) = (api.clone(), w.clone());
        writes.push(async move {
            let r = cordon::write_marks(
                &api,
                versions,
                &node,
                w.holds(),
                w.unschedulable(),
                exclude_lb,
                taint_effect,
            )
            .await;
            (w, r)
        });
    }
    // Counted while they are in flight when the pass cordons: the queued
    // Events of every pass wait for them.
    let sending = plan
        .node_writes
        .iter()
        .any(|w| matches!(w, NodeWrite::Cordon { .. }))
        .then(|| writers.cordons_first.sending());
    let results: Vec<(NodeWrite, std::result::Result<bool, kube::Error>)> =
        futures::stream::iter(writes)
            .buffer_unordered(NODE_WRITE_CONCURRENCY)
            .collect()
            .await;
    drop(sending);
    let mut written = Vec::new();
    for (w, r) in results {
        match r {
            Ok(true) => {
                refused.written(&name, w.node());
                written.push(w);
            }
            // Written by an earlier pass; the cache has not shown it yet.
            Ok(false) => refused.written(&name, w.node()),
            Err(source) => {
                let (label, _, _) = describe(ev, &w);
                let (failures, retry_in) =
                    refused.refused(&name, w.node(), label, &source, tokio::time::Instant::now());
                not_written.insert(w.node().to_owned());
                let e = Error::PatchNode {
                    node: w.node().into(),
                    source,
                };
                writers
                    .metrics
                    .reconcile_errors
                    .with_label_values(&[e.category()])
                    .inc();
                // A conflict is another writer's progress (often another
                // event's pass on the same node): said only once it lasts.
                let conflict = e.category() == "conflict";
                if conflict && failures < CONFLICTS_BEFORE_WARNING {
                    debug!(node = w.node(), error = %e, failures, ?retry_in,
                        "A node write lost a race; retried on its own backoff");
                } else {
                    warn!(node = w.node(), error = %e, failures, ?retry_in,
                        "A node write was refused; the event's other nodes go on");
                }
                let first = if conflict {
                    CONFLICTS_BEFORE_WARNING
                } else {
                    1
                };
                if failures == first {
                    publish::publish(
                        writers,
                        ev,
                        Subject::Node(w.node()),
                        KubeEventType::Warning,
                        "NodeWriteRefused",
                        format!(
                            "The {label} of {} for {name} was refused ({e}); retried with backoff while the event's other nodes go on",
                            w.node()
                        ),
                    );
                }
            }
        }
    }
    // One Event on each node written, and one per kind of write on the
    // `ScheduledEvent` (naming the first few nodes when there are many): a
    // 1,000-node event posts about 1,000 Events, not 2,000.
    let mut by_reason: Vec<(&'static str, Vec<(&str, String)>)> = Vec::new();
    for w in &written {
        let (label, reason, note) = describe(ev, w);
        writers
            .metrics
            .node_writes
            .with_label_values(&[label])
            .inc();
        if matches!(w, NodeWrite::Cordon { .. }) {
            writers.metrics.cordoned(ev, Utc::now());
        }
        info!(node = w.node(), reason, "{note}");
        publish::publish(
            writers,
            ev,
            Subject::NodeOnly(w.node()),
            KubeEventType::Normal,
            reason,
            note.clone(),
        );
        match by_reason.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, nodes)) => nodes.push((w.node(), note)),
            None => by_reason.push((reason, vec![(w.node(), note)])),
        }
    }
    for (reason, mut nodes) in by_reason {
        let note = match nodes.as_mut_slice() {
            [(_, note)] => std::mem::take(note),
            many => nodes_note(ev, reason, many.iter().map(|(n, _)| *n).collect()),
        };
        publish::publish(
            writers,
            ev,
            Subject::Event,
            KubeEventType::Normal,
            reason,
            note,
        );
    }
    not_written
}

/// The note of the Event for `pods` (`namespace/name`, grace seconds)
/// evicted from `node` in one pass: the first [`NAMED_IN_EVENT`] named (an
/// Event's note holds at most 1 KiB).
fn evicted_note(node: &str, pods: &[(String, i64)]) -> String {
    let mut graces: Vec<i64> = pods.iter().map(|(_, g)| *g).collect();
    graces.sort_unstable();
    graces.dedup();
    let graces = graces
        .iter()
        .map(|g| format!("{g}s"))
        .collect::<Vec<_>>()
        .join(", ");
    if let [(pod, grace)] = pods {
        return format!("Evicted {pod} from {node} with a grace period of {grace}s");
    }
    format!(
        "Evicted {} pods from {node} (grace periods {graces}): {}",
        pods.len(),
        first_named(pods.iter().map(|(p, _)| p.as_str()).collect())
    )
}

/// `names` sorted, the first [`NAMED_IN_EVENT`] joined and the rest counted:
/// `a, b, c, d, e and 7 more`.
fn first_named(mut names: Vec<&str>) -> String {
    names.sort_unstable();
    named(&names, NAMED_IN_EVENT, ", ")
}

/// Requests `evictions` for at most [`EVICTION_PASS`], or
/// [`EVICTION_PASS_FEW`] when they are on few nodes (the budgets
/// from the cache, and the pods they refused, `budgets`; the pods the API
/// server took the eviction of are marked in `pods` as being deleted) and
/// reports each outcome (a block once while it lasts: `announced`);
/// returns the outcomes and how many were deferred to the next pass.
pub async fn evict(
    ev: &ScheduledEvent,
    evictions: &[crate::controller::decide::plan::Eviction],
    writers: &Writers,
    budgets: (
        &kube::runtime::reflector::Store<k8s_openapi::api::policy::v1::PodDisruptionBudget>,
        &drain::Refusals,
    ),
    pods: &crate::controller::observe::pods::PodCache,
    per_node: usize,
    announced: &BlocksAnnounced,
) -> (Vec<Outcome>, usize) {
    let nodes: std::collections::HashSet<&str> =
        evictions.iter().map(|e| e.node.as_str()).collect();
    let window = if nodes.len() <= FEW_NODES {
        EVICTION_PASS_FEW
    } else {
        EVICTION_PASS
    };
    let drain::Evicted { outcomes, deferred } = drain::evict_all(
        &writers.evict_client,
        &writers.limiter,
        budgets,
        pods,
        evictions,
        per_node,
        tokio::time::Instant::now() + window,
    )
    .await;
    let (evicted, blocked) = sort_outcomes(evictions, &outcomes, &writers.metrics);
    announce_evictions(ev, evicted, blocked, writers, announced);
    if deferred > 0 {
        debug!(
            deferred,
            asked = outcomes.len(),
            "The pass's time for evictions ran out: the rest in the next pass"
        );
    }
    (outcomes, deferred)
}

/// The pods evicted from each node in one pass, with their grace periods.
type EvictedByNode<'a> = Vec<(&'a str, Vec<(String, i64)>)>;

/// The pods a set of budgets refused on each node: node, budgets, the
/// refusal's message, pods.
type BlockedByNode<'a> = Vec<(&'a str, &'a Vec<String>, &'a String, Vec<String>)>;

/// Counts each eviction's outcome (`forewarn_controller_evictions_total`),
/// logs it, and gathers the pods evicted per node and those refused per
/// node and set of budgets, for one Event each.
fn sort_outcomes<'a>(
    evictions: &[crate::controller::decide::plan::Eviction],
    outcomes: &'a [Outcome],
    metrics: &ControllerMetrics,
) -> (EvictedByNode<'a>, BlockedByNode<'a>) {
    // By node, namespace and name: a node can hold pods of one name in
    // two namespaces.
    type Key<'k> = (&'k str, &'k str, &'k str);
    let planned: HashMap<Key<'_>, &crate::controller::decide::plan::Eviction> = evictions
        .iter()
        .map(|e| {
            (
                (
                    e.node.as_str(),
                    e.pod.namespace.as_str(),
                    e.pod.name.as_str(),
                ),
                e,
            )
        })
        .collect();
    // One Event per node and pass for the pods evicted from it (on the
    // `ScheduledEvent` and the node), and one per node and set of budgets
    // for those a budget refused, however many pods: a drain of 10,000 pods
    // posts hundreds of Events, not tens of thousands.
    let mut evicted: EvictedByNode<'a> = Vec::new();
    let mut blocked: BlockedByNode<'a> = Vec::new();
    for (node, pod, outcome) in outcomes {
        let label = match outcome {
            EvictionOutcome::Evicted => "evicted",
            EvictionOutcome::Blocked { .. } => "blocked",
            EvictionOutcome::Throttled { .. } => "throttled",
            EvictionOutcome::Gone => "gone",
            EvictionOutcome::Retry(_) => "error",
            // Not asked: no request to count.
            EvictionOutcome::Waiting(_) => "",
        };
        if !label.is_empty() {
            metrics.evictions.with_label_values(&[label]).inc();
        }
        let Some((namespace, name)) = pod.split_once('/') else {
            continue;
        };
        let Some(e) = planned.get(&(node.as_str(), namespace, name)) else {
            continue;
        };
        let key = pod.clone();
        match outcome {
            EvictionOutcome::Evicted => {
                info!(node, pod = %key, grace_seconds = e.grace_seconds, "Evicted pod");
                match evicted.iter_mut().find(|(n, _)| n == node) {
                    Some((_, pods)) => pods.push((key, e.grace_seconds)),
                    None => evicted.push((node.as_str(), vec![(key, e.grace_seconds)])),
                }
            }
            EvictionOutcome::Blocked { budgets, message } => {
                info!(node, pod = %key, ?budgets, %message, "Eviction blocked; will retry");
                match blocked
                    .iter_mut()
                    .find(|(n, b, _, _)| n == node && *b == budgets)
                {
                    Some((_, _, _, pods)) => pods.push(key),
                    None => blocked.push((node.as_str(), budgets, message, vec![key])),
                }
            }
            EvictionOutcome::Throttled {
                retry_after_seconds,
            } => {
                warn!(node, pod = %key, retry_after_seconds, "Eviction throttled by the API server; backing off");
            }
            EvictionOutcome::Retry(why) => {
                warn!(node, pod = %key, %why, "Eviction failed; asked again after a backoff of its own")
            }
            EvictionOutcome::Waiting(why) => {
                debug!(node, pod = %key, %why, "Eviction not asked: waiting for its backoff")
            }
            EvictionOutcome::Gone => {}
        }
    }
    (evicted, blocked)
}

/// How long an `EvictionBlocked` Warning stands for the same block (the
/// same node of the same event, blocked by the same budgets) before it is
/// posted again: the `DrainBlocked` condition and `blockedPods` say at
/// every moment what blocks the drain; the Event marks that it began, and
/// reminds of it while it lasts.
pub const BLOCK_ANNOUNCED_AGAIN: std::time::Duration = std::time::Duration::from_secs(300);

/// The blocks of drains announced by an `EvictionBlocked` Warning: per
/// event UID and node, the budgets named and when. A drain refused on every
/// pass (each budget step of a Spot wave's node, while its replacements
/// start) posts one Warning, not one per pass: in a 200-VM wave, Events
/// (these Warnings among them, not counted apart) were 31 of the
/// controller's 74 requests per event.
#[derive(Default)]
pub struct BlocksAnnounced(std::sync::Mutex<HashMap<(String, String), Announcement>>);

/// The budgets an `EvictionBlocked` Warning named, and when it was posted.
type Announcement = (Vec<String>, tokio::time::Instant);

impl BlocksAnnounced {
    /// Whether the block of `node`'s drain in the event `uid` by `budgets`
    /// is to be announced at `now`: not announced yet, announced naming
    /// other budgets, or [`BLOCK_ANNOUNCED_AGAIN`] ago; remembered as
    /// announced when it is.
    pub fn announce(
        &self,
        uid: &str,
        node: &str,
        budgets: &[String],
        now: tokio::time::Instant,
    ) -> bool {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (uid.to_string(), node.to_string());
        if let Some((named, at)) = map.get(&key)
            && named == budgets
            && now < *at + BLOCK_ANNOUNCED_AGAIN
        {
            return false;
        }
        map.insert(key, (budgets.to_vec(), now));
        true
    }

    /// Forgets the events whose UID is not in `live`.
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|(uid, _), _| live.contains(uid));
    }
}

/// One Event per node for the pods evicted from it in this pass (on the
/// `ScheduledEvent` and the node), and one Warning per node and set of
/// budgets for those a budget refused, however many pods, when that block
/// is new ([`BlocksAnnounced`]): a drain of 10,000 pods posts hundreds of
/// Events, not tens of thousands.
fn announce_evictions(
    ev: &ScheduledEvent,
    evicted: EvictedByNode<'_>,
    blocked: BlockedByNode<'_>,
    writers: &Writers,
    announced: &BlocksAnnounced,
) {
    let uid = ev.metadata.uid.as_deref().unwrap_or_default();
    let now = tokio::time::Instant::now();
    for (node, pods) in evicted {
        publish::publish(
            writers,
            ev,
            Subject::Node(node),
            KubeEventType::Normal,
            "Evicted",
            evicted_note(node, &pods),
        );
    }
    for (node, budgets, message, pods) in blocked {
        if !announced.announce(uid, node, budgets, now) {
            continue;
        }
        let more = match pods.len() {
            1 => String::new(),
            n => format!(" and {} more", n - 1),
        };
        publish::publish(
            writers,
            ev,
            Subject::Node(node),
            KubeEventType::Warning,
            "EvictionBlocked",
            format!(
                "Eviction of {}{more} from {node} blocked by PodDisruptionBudget {}: {message}",
                pods[0],
                budgets.join(", ")
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::time::Duration;

    use super::{BLOCK_ANNOUNCED_AGAIN, BlocksAnnounced, evicted_note, nodes_note, sort_outcomes};
    use crate::api::ScheduledEvent;
    use crate::controller::decide::plan::{Eviction, EvictionOutcome};
    use crate::controller::observe::pod_list::PodInfo;
    use crate::fixtures;
    use crate::metrics::controller::ControllerMetrics;

    /// Two pods of one name in two namespaces on one node: each outcome is
    /// told of its own pod, with its own grace period.
    #[test]
    fn outcomes_of_pods_of_one_name_in_two_namespaces_stay_apart() {
        let eviction = |namespace: &str, grace_seconds: i64| Eviction {
            node: "n1".into(),
            pod: Arc::new(PodInfo {
                namespace: namespace.into(),
                name: "web-0".into(),
                uid: format!("uid-{namespace}"),
                ..PodInfo::default()
            }),
            grace_seconds,
        };
        let evictions = [eviction("shop", 30), eviction("blog", 5)];
        let outcomes = vec![
            (
                "n1".to_string(),
                "blog/web-0".to_string(),
                EvictionOutcome::Evicted,
            ),
            (
                "n1".to_string(),
                "shop/web-0".to_string(),
                EvictionOutcome::Blocked {
                    budgets: vec!["shop/web".into()],
                    message: "needs 2".into(),
                },
            ),
        ];
        let registry = prometheus::Registry::new();
        let metrics = ControllerMetrics::register(&registry).expect("metrics register");
        let (evicted, blocked) = sort_outcomes(&evictions, &outcomes, &metrics);
        assert_eq!(evicted, vec![("n1", vec![("blog/web-0".to_string(), 5)])]);
        assert_eq!(blocked.len(), 1);
        assert_eq!(blocked[0].3, vec!["shop/web-0".to_string()]);
    }

    /// A block is announced once while it lasts: again only when other
    /// budgets block the node, after [`BLOCK_ANNOUNCED_AGAIN`], or for
    /// another node or event; forgotten with its event.
    #[test]
    fn a_block_is_announced_once_while_it_lasts() {
        let announced = BlocksAnnounced::default();
        let t0 = tokio::time::Instant::now();
        let web = vec!["shop/web".to_string()];
        let both = vec!["shop/db".to_string(), "shop/web".to_string()];
        assert!(announced.announce("u1", "n1", &web, t0));
        assert!(!announced.announce("u1", "n1", &web, t0 + Duration::from_secs(1)));
        assert!(announced.announce("u1", "n2", &web, t0), "another node");
        assert!(announced.announce("u2", "n1", &web, t0), "another event");
        assert!(
            announced.announce("u1", "n1", &both, t0 + Duration::from_secs(2)),
            "other budgets"
        );
        assert!(!announced.announce("u1", "n1", &both, t0 + Duration::from_secs(3)));
        assert!(
            announced.announce(
                "u1",
                "n1",
                &both,
                t0 + Duration::from_secs(2) + BLOCK_ANNOUNCED_AGAIN
            ),
            "a reminder while it lasts"
        );
        announced.retain(&["u2".to_string()].into());
        assert!(
            announced.announce("u1", "n2", &web, t0),
            "forgotten with its event"
        );
    }

    #[test]
    fn one_evicted_event_per_node_names_a_few_pods_and_counts_the_rest() {
        assert_eq!(
            evicted_note("n1", &[("ns/a".into(), 30)]),
            "Evicted ns/a from n1 with a grace period of 30s"
        );
        let pods: Vec<(String, i64)> = (0..12)
            .map(|i| (format!("ns/p{i:02}"), if i % 2 == 0 { 30 } else { 5 }))
            .collect();
        let note = evicted_note("n1", &pods);
        assert_eq!(
            note,
            "Evicted 12 pods from n1 (grace periods 5s, 30s): ns/p00, ns/p01, ns/p02, ns/p03, ns/p04 and 7 more"
        );
    }

    #[test]
    fn one_event_note_for_many_nodes_counts_them_and_names_five() {
        let ev = ScheduledEvent::new("ev1", fixtures::spec("ev1").build());
        let nodes: Vec<String> = (0..7).rev().map(|i| format!("n{i}")).collect();
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        assert_eq!(
            nodes_note(&ev, "Cordoned", nodes.clone()),
            "Cordoned and tainted 7 nodes for Reboot ev1: n0, n1, n2, n3, n4 and 2 more"
        );
        assert_eq!(
            nodes_note(&ev, "Uncordoned", nodes[..2].to_vec()),
            "Uncordoned 2 nodes: Reboot ev1 is over: n5, n6"
        );
    }
}
