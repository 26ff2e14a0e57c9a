//! A Spot wave: Azure takes many Spot VMs of a pool back at once, each with
//! its own `Preempt` event of 30 s notice (Azure's fixed notice for Spot
//! evictions), all appearing within one second. As Azure delivers them,
//! every VM of the placement group sees every event (the scenario format's
//! default `deliverTo: all`), so each agent lists all of them.
//!
//! What `tests/scenarios.rs` (50 VMs) and `make bench`'s `wave` part (200)
//! share: the scenario's text ([`scenario_yaml`]), the workload (10 pods
//! per node in one Deployment per node, each with a PodDisruptionBudget:
//! [`workload`]), the nodes a cluster needs beyond its own
//! ([`add_nodes`], [`remove_nodes`]), and the figures of each event read
//! from the API server's records ([`figures`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::report::{BudgetSeen, PodDeletion};

/// Azure's notice of a Spot eviction (`Preempt`): 30 s, fixed.
pub const SPOT_NOTICE: Duration = Duration::from_secs(30);

/// The taint spare nodes carry until the wave starts, so that the
/// workload's first pods all land on the wave's nodes (the replacements of
/// evicted pods land on the spares once it is lifted).
pub const SPARE_TAINT: &str = "forewarn.dev/test-spare";

/// The node of wave VM `i`: `node-000000`, … (the names `hack/cluster.sh`
/// gives its nodes, so a cluster's own nodes are the first ones).
pub fn node_name(i: usize) -> String {
    format!("node-{i:06}")
}

/// The VM of wave node `i`, in one scale set.
pub fn vm_name(i: usize) -> String {
    format!("aks-spot-38120954-vmss_{i}")
}

/// The `EventId` of the `Preempt` event of VM `i`: its first group
/// (what a timeline shows of an id) differs from the others'.
pub fn event_id(i: usize) -> String {
    format!("{:08X}-0000-4000-8000-5B0F7A000000", 0x5B0F_0000 + i)
}

/// When the event of VM `i` of `n` appears, from the scenario's start:
/// `first`, then evenly spread over the next second (the last one less
/// than a second after the first).
pub fn appears_at(first: Duration, i: usize, n: usize) -> Duration {
    first + Duration::from_millis((1000 * i / n.max(1)) as u64)
}

/// A scenario of `n` VMs (each played by node `node_name(i)`, fault
/// domains 0-2 in turn), each evicted by its own `Preempt` event of 30 s
/// notice appearing at [`appears_at`]`(first, i, n)` and delivered to the
/// whole group; each runs 15 s once started (long enough for every agent
/// to see `Started` from a mock that the whole wave's VMs keep busy on a
/// loaded test machine: real IMDS is each host's own). Every event must end
/// `Completed`, approved (if at all) only through its own VM. Whether each
/// node is emptied before the event ends is not asked here: the pace of a
/// drain under budgets is set by how fast the replacements become Ready,
/// which a loaded control plane stretches; a wave's test judges instead
/// how long a budget stayed open unused ([`figures`]).
pub fn scenario_yaml(n: usize, first: Duration) -> String {
    let mut s = format!(
        "description: >-\n  A Spot wave: {n} Spot VMs of one scale set evicted at once, each by its own\n  \
         Preempt event of 30 s notice, all appearing within one second and delivered\n  \
         to every VM of the placement group. Every node must be cordoned at once and\n  \
         drained as its budgets allow, every event end Completed, nothing stay cordoned.\n\
         vms:\n"
    );
    for i in 0..n {
        let _ = writeln!(
            s,
            "  - {{name: {}, node: {}, faultDomain: {}}}",
            vm_name(i),
            node_name(i),
            i % 3
        );
    }
    s.push_str("events:\n");
    for i in 0..n {
        let _ = writeln!(
            s,
            "  - {{id: {}, type: Preempt, resources: [{}], durationSeconds: -1, at: {}ms, notice: {}s, runFor: 15s, \
             description: Spot VM is being evicted because Azure needs the capacity back., \
             expect: {{phase: Completed, approvedBy: [{}]}}}}",
            event_id(i),
            vm_name(i),
            appears_at(first, i, n).as_millis(),
            SPOT_NOTICE.as_secs(),
            vm_name(i)
        );
    }
    s
}

/// The workload of a wave over nodes `0..n`: per node `i` a Deployment
/// `wave-<i>` of `per_node` pause pods whose required node affinity allows
/// node `i` and the `spares` (which must not take pods until the wave:
/// tainted with [`SPARE_TAINT`], or created when it starts, so that all
/// first land on node `i`; the replacements of evicted pods land on the
/// spares), with `terminationGracePeriodSeconds` 30 and KWOK's stop
/// annotations (a pod stops 0.3-1.2 s after its deletion, as a server that
/// handles SIGTERM), and a PodDisruptionBudget `wave-<i>` of
/// `maxUnavailable` half of them (at least 1): a drain goes in steps, as
/// replacements become Ready.
pub fn workload(n: usize, per_node: usize, spares: &[String]) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let max_unavailable = (per_node / 2).max(1);
    for i in 0..n {
        let name = format!("wave-{i:03}");
        let mut hosts = vec![node_name(i)];
        hosts.extend(spares.iter().cloned());
        out.push(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": per_node,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {
                        "labels": {"app": name, "wave": "true"},
                        "annotations": {"forewarn.dev/stop-after": "300ms", "forewarn.dev/stop-before": "1200ms"},
                    },
                    "spec": {
                        "terminationGracePeriodSeconds": 30,
                        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{
                                "key": "kubernetes.io/hostname", "operator": "In", "values": hosts,
                            }]}],
                        }}},
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                    },
                },
            },
        }));
        out.push(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": name}}},
        }));
    }
    out
}

/// A node named `name` as `hack/cluster.sh` makes them (KWOK manages
/// every node): the labels and KWOK's annotations of `template`, the
/// hostname label set, with `taint` (key, `NoSchedule`) when given.
///
/// # Errors
/// When the object cannot be built (it always can).
pub fn node_like(template: &Node, name: &str, taint: Option<&str>) -> anyhow::Result<Node> {
    let mut labels = template.metadata.labels.clone().unwrap_or_default();
    labels.insert("kubernetes.io/hostname".into(), name.into());
    let mut annotations = template.metadata.annotations.clone().unwrap_or_default();
    annotations.retain(|k, _| k.starts_with("kwok.x-k8s.io/") || k.starts_with("node.alpha"));
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        "spec": {"taints": taint.map(|t| vec![json!({"key": t, "effect": "NoSchedule"})])},
    }))?)
}

/// The nodes `names`, built by [`node_like`] from the cluster's
/// `node-000000`, as a `v1` `List` (for `kubectl apply` at a given
/// moment of a run).
///
/// # Errors
/// When the template node cannot be read.
pub async fn node_list(client: &Client, names: &[String]) -> anyhow::Result<serde_json::Value> {
    let template = Api::<Node>::all(client.clone())
        .get(&node_name(0))
        .await
        .context("the cluster has no node-000000 to copy")?;
    let items = names
        .iter()
        .map(|n| Ok(serde_json::to_value(node_like(&template, n, None)?)?))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

/// Creates the nodes `names` that the cluster lacks ([`node_like`] of
/// `node-000000`, with `taint` when given) and waits until every one is
/// Ready (a hang bound: KWOK makes a node Ready within a second or two).
/// Returns the names it created.
///
/// # Errors
/// When the template node is missing, a node cannot be created, or they
/// are not all Ready within 120 s.
pub async fn add_nodes(
    client: &Client,
    names: &[String],
    taint: Option<&str>,
) -> anyhow::Result<Vec<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let template = nodes
        .get(&node_name(0))
        .await
        .context("the cluster has no node-000000 to copy")?;
    let mut created = Vec::new();
    for name in names {
        if nodes.get_opt(name).await?.is_some() {
            continue;
        }
        nodes
            .create(&PostParams::default(), &node_like(&template, name, taint)?)
            .await
            .with_context(|| format!("failed to create node {name}"))?;
        created.push(name.clone());
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = nodes.list(&Default::default()).await?;
        let not_ready: Vec<&String> = names
            .iter()
            .filter(|n| {
                !listed.items.iter().any(|node| {
                    node.name_any() == **n
                        && node.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(
                            |c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"),
                        )
                        // KCM's not-ready taint is lifted a moment later.
                        && !node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| {
                            t.iter().any(|t| t.key.starts_with("node.kubernetes.io/"))
                        })
                })
            })
            .collect();
        if not_ready.is_empty() {
            return Ok(created);
        }
        if Instant::now() > deadline {
            bail!(
                "{} of the nodes added are not Ready within 120 s: {:?}",
                not_ready.len(),
                not_ready.iter().take(5).collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Deletes the nodes `names` (the cluster keeps its own), waiting until
/// they are gone (60 s at most, a hang bound).
///
/// # Errors
/// When a deletion fails or a node is still there after 60 s.
pub async fn remove_nodes(client: &Client, names: &[String]) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for name in names {
        match nodes.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("failed to delete node {name}")),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for name in names {
        while nodes.get_opt(name).await?.is_some() {
            if Instant::now() > deadline {
                bail!("node {name} still there 60 s after its deletion");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// How long before its `NotBefore` a node must have been cordoned for its
/// pods to count as having had time to leave: the drain margin (5 s: the
/// drain deadline is `NotBefore` minus it), the smallest grace forewarn
/// asks for (`minGraceSeconds`, 5 s), and 5 s for the evictions
/// themselves (10 per node, a controller-wide rate budget) and the
/// PodDisruptionBudget's steps.
pub const TIME_TO_LEAVE: Duration = Duration::from_secs(15);

/// What happened to one event of a wave, from the API server's records.
#[derive(Debug, Clone, PartialEq)]
pub struct EventFigures {
    /// The node.
    pub node: String,
    /// When IMDS first listed the event (the scenario's clock).
    pub appeared: DateTime<Utc>,
    /// `NotBefore` as IMDS wrote it.
    pub not_before: DateTime<Utc>,
    /// When the node was first seen cordoned.
    pub cordoned: Option<DateTime<Utc>>,
    /// The first pod deletion on the node (an eviction), as the watch saw it.
    pub first_eviction: Option<DateTime<Utc>>,
    /// The workload pods there when the wave began.
    pub pods: usize,
    /// Of those, the ones deleted with a `deletionTimestamp` (deletion time
    /// plus grace: when the kubelet kills it at the latest) at or before
    /// `NotBefore`.
    pub gone_by_not_before: usize,
    /// Whether the node was cordoned at least [`TIME_TO_LEAVE`] before
    /// `NotBefore`: its pods had time to leave.
    pub had_time: bool,
    /// Pods whose deletion ends after `NotBefore`, or that were not
    /// deleted: `namespace/name (deletionTimestamp or "not deleted")`.
    pub late: Vec<String>,
    /// The longest time, in seconds, that the node's PodDisruptionBudget
    /// allowed a disruption while the node still had pods to evict and no
    /// eviction of one of them came, between the cordon and the drain
    /// deadline ([`unused_budget`]): how long a budget that opened waited
    /// for the drain to take it.
    pub unused_budget: f64,
}

impl EventFigures {
    /// Pods still running at `NotBefore`.
    pub fn left_at_not_before(&self) -> usize {
        self.pods - self.gone_by_not_before
    }
}

/// The name of the PodDisruptionBudget of the pods of [`node_name`]`(i)`:
/// `wave-<i>` ([`workload`]).
pub fn budget_of(node: &str) -> Option<String> {
    let i: usize = node.strip_prefix("node-")?.parse().ok()?;
    Some(format!("wave-{i:03}"))
}

/// forewarn's drain margin by default: its drain deadline is `NotBefore`
/// minus this.
pub const DRAIN_MARGIN: Duration = Duration::from_secs(5);

/// How long a PodDisruptionBudget that allows an eviction may wait for
/// forewarn to ask for one of its node's pods: the budget watch's wake, a
/// pass's turn at the gate, its reads and its eviction request, on a test
/// machine that the wave's agents, the mock, the control plane and its
/// moving pods keep busy (up to about 7 s measured there at the end of
/// `make test` with 50 VMs). A drain the watch failed to wake waits for its
/// backoff, up to 16 s.
pub const BUDGET_TAKEN_WITHIN: Duration = Duration::from_secs(10);

/// When the budget of `node` ([`budget_of`]), in `budgets` (its versions in
/// the order seen), first allowed no disruption after `from` (the node's
/// cordon: its first evictions took what it allowed), and when it next
/// allowed one (the replacements of the pods evicted Ready): `None` when it
/// did not close, or did not reopen.
pub fn reopened(
    budgets: &[BudgetSeen],
    node: &str,
    from: DateTime<Utc>,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let name = budget_of(node)?;
    let mine: Vec<&BudgetSeen> = budgets
        .iter()
        .filter(|b| b.budget.split('/').nth(1) == Some(name.as_str()) && b.seen_at >= from)
        .collect();
    let closed = mine.iter().position(|b| b.allowed == 0)?;
    let open = mine[closed..].iter().find(|b| b.allowed > 0)?;
    Some((mine[closed].seen_at, open.seen_at))
}

/// The step at which [`unused_budget`] samples a budget's history.
const SAMPLE: chrono::TimeDelta = chrono::TimeDelta::milliseconds(100);

/// The longest time, in seconds, within `from..until` that a budget
/// allowed a disruption (`allowed`: its versions `(seen_at, allowed)` in
/// the order seen; none allowed before the first) while some of `pods`
/// were not yet asked to leave and none was asked for: a pod counts as
/// asked to leave from its eviction (`deletionTimestamp` minus the grace
/// the API server applied, in `deletions`); an eviction starts the count
/// again. Sampled every 100 ms.
pub fn unused_budget(
    allowed: &[(DateTime<Utc>, i32)],
    pods: &[String],
    deletions: &[PodDeletion],
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> f64 {
    let asked: Vec<DateTime<Utc>> = pods
        .iter()
        .filter_map(|p| deletions.iter().find(|d| d.pod == *p))
        .map(|d| d.deletion_timestamp - chrono::TimeDelta::seconds(d.grace_seconds.unwrap_or(0)))
        .collect();
    let unasked = pods.len() - asked.len();
    let (mut longest, mut idle) = (chrono::TimeDelta::zero(), chrono::TimeDelta::zero());
    let mut t = from;
    while t < until {
        let open = allowed
            .iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .is_some_and(|(_, n)| *n >= 1);
        let left = unasked + asked.iter().filter(|a| **a > t).count();
        let evicted_now = asked.iter().any(|a| *a > t - SAMPLE && *a <= t);
        if open && left > 0 && !evicted_now {
            idle += SAMPLE;
            longest = longest.max(idle);
        } else {
            idle = chrono::TimeDelta::zero();
        }
        t += SAMPLE;
    }
    longest.as_seconds_f64()
}

/// The figures of each event of a wave: `events` maps each node to
/// (appearance, `NotBefore`); `initial` maps each node to the workload
/// pods on it when the wave began (`namespace/name`); `deletions` are the
/// pod deletions the API server applied; `cordons` when each node was
/// first seen cordoned; `budgets` every version of the workload's
/// PodDisruptionBudgets (node `i`'s is `wave-<i>`, [`workload`]).
pub fn figures(
    events: &BTreeMap<String, (DateTime<Utc>, DateTime<Utc>)>,
    initial: &BTreeMap<String, Vec<String>>,
    deletions: &[PodDeletion],
    cordons: &BTreeMap<String, DateTime<Utc>>,
    budgets: &[BudgetSeen],
) -> Vec<EventFigures> {
    events
        .iter()
        .map(|(node, (appeared, not_before))| {
            let pods = initial.get(node).cloned().unwrap_or_default();
            let mut late = Vec::new();
            let mut gone = 0;
            for pod in &pods {
                match deletions.iter().find(|d| d.pod == *pod) {
                    Some(d) if d.deletion_timestamp <= *not_before => gone += 1,
                    Some(d) => late.push(format!("{pod} ({})", d.deletion_timestamp)),
                    None => late.push(format!("{pod} (not deleted)")),
                }
            }
            let first_eviction = deletions
                .iter()
                .filter(|d| d.node == *node && pods.contains(&d.pod))
                .map(|d| d.seen_at)
                .min();
            let cordoned = cordons.get(node).copied();
            let to_leave = chrono::TimeDelta::from_std(TIME_TO_LEAVE).unwrap_or_default();
            let margin = chrono::TimeDelta::from_std(DRAIN_MARGIN).unwrap_or_default();
            let budget = budget_of(node);
            let allowed: Vec<(DateTime<Utc>, i32)> = budgets
                .iter()
                .filter(|b| budget.as_deref() == b.budget.split('/').nth(1))
                .map(|b| (b.seen_at, b.allowed))
                .collect();
            let unused = cordoned.map_or(0.0, |c| {
                unused_budget(&allowed, &pods, deletions, c, *not_before - margin)
            });
            EventFigures {
                node: node.clone(),
                appeared: *appeared,
                not_before: *not_before,
                cordoned,
                first_eviction,
                pods: pods.len(),
                gone_by_not_before: gone,
                had_time: cordoned.is_some_and(|c| c + to_leave <= *not_before),
                late,
                unused_budget: unused,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap() + chrono::TimeDelta::milliseconds(ms)
    }

    fn evicted(pod: &str, at_ms: i64) -> PodDeletion {
        PodDeletion {
            pod: pod.into(),
            node: "node-000001".into(),
            grace_seconds: Some(10),
            deletion_timestamp: at(at_ms + 10_000),
            seen_at: at(at_ms + 50),
        }
    }

    #[test]
    fn an_open_budget_counts_until_an_eviction_takes_it() {
        let pods = ["shop/a".to_string(), "shop/b".to_string()];
        // Open at 1 s; a is asked for at 3 s (2 s unused), the budget
        // stays open, b at 4 s (1 s): the longest is 2 s.
        let allowed = [(at(0), 0), (at(1_000), 2)];
        let deletions = [evicted("shop/a", 3_000), evicted("shop/b", 4_000)];
        let u = unused_budget(&allowed, &pods, &deletions, at(0), at(20_000));
        assert!((u - 2.0).abs() < 0.15, "{u}");
        // A budget that never opens leaves nothing unused, however long.
        let shut = [(at(0), 0)];
        assert_eq!(unused_budget(&shut, &pods, &[], at(0), at(20_000)), 0.0);
        // Open and never taken: unused until the drain deadline.
        let u = unused_budget(&allowed, &pods, &[], at(0), at(6_000));
        assert!((u - 5.0).abs() < 0.15, "{u}");
        // Once every pod was asked for, an open budget is nobody's wait.
        let u = unused_budget(&allowed, &pods, &deletions, at(5_000), at(20_000));
        assert_eq!(u, 0.0);
        assert_eq!(budget_of("node-000029").as_deref(), Some("wave-029"));
    }
    use forewarn::imds::scenario::{DeliverTo, Scenario};

    #[test]
    fn the_scenario_is_one_preempt_per_vm_within_a_second_delivered_to_all() {
        let s = Scenario::parse(&scenario_yaml(50, Duration::from_secs(3))).expect("parses");
        assert_eq!(s.vms.len(), 50);
        assert_eq!(s.events.len(), 50);
        for (i, e) in s.events.iter().enumerate() {
            assert_eq!(e.event_type, "Preempt");
            assert_eq!(e.resources, [vm_name(i)]);
            assert_eq!(e.notice, SPOT_NOTICE);
            assert_eq!(e.deliver_to, DeliverTo::All);
            assert!(e.at >= Duration::from_secs(3) && e.at < Duration::from_secs(4));
            let x = e.expect.as_ref().expect("expect");
            assert_eq!(x.phase, "Completed");
            assert_eq!(x.drained, None);
            assert_eq!(x.approved_by, [vm_name(i)]);
        }
        assert_eq!(s.vms[49].node.as_deref(), Some("node-000049"));
    }

    #[test]
    fn the_workload_is_a_deployment_and_a_budget_per_node() {
        let w = workload(2, 10, &["node-000050".into()]);
        assert_eq!(w.len(), 4);
        assert_eq!(w[0]["spec"]["replicas"], 10);
        assert_eq!(
            w[0]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
            json!(["node-000000", "node-000050"])
        );
        assert_eq!(w[1]["spec"]["maxUnavailable"], 5);
        assert_eq!(w[3]["metadata"]["name"], "wave-001");
    }

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).expect("time")
    }

    fn deletion(pod: &str, node: &str, seen: i64, ends: i64) -> PodDeletion {
        PodDeletion {
            pod: pod.into(),
            node: node.into(),
            grace_seconds: Some(ends - seen),
            deletion_timestamp: t(ends),
            seen_at: t(seen),
        }
    }

    #[test]
    fn figures_count_the_pods_whose_deletion_ends_by_not_before() {
        let events = BTreeMap::from([
            ("n0".to_string(), (t(0), t(30))),
            ("n1".to_string(), (t(0), t(30))),
        ]);
        let initial = BTreeMap::from([
            ("n0".to_string(), vec!["ns/a".into(), "ns/b".into()]),
            ("n1".to_string(), vec!["ns/c".into(), "ns/d".into()]),
        ]);
        let deletions = [
            deletion("ns/a", "n0", 3, 25),
            deletion("ns/b", "n0", 4, 30),
            deletion("ns/c", "n1", 26, 31),
        ];
        let cordons = BTreeMap::from([("n0".to_string(), t(2)), ("n1".to_string(), t(16))]);
        let f = figures(&events, &initial, &deletions, &cordons, &[]);
        assert_eq!(f[0].gone_by_not_before, 2);
        assert_eq!(f[0].left_at_not_before(), 0);
        assert_eq!(f[0].first_eviction, Some(t(3)));
        assert!(f[0].had_time);
        assert!(f[0].late.is_empty());
        assert_eq!(f[1].gone_by_not_before, 0);
        assert_eq!(f[1].left_at_not_before(), 2);
        assert!(!f[1].had_time, "cordoned 14 s before NotBefore");
        assert_eq!(f[1].late.len(), 2);
        assert!(f[1].late[1].ends_with("(not deleted)"));
    }

    #[test]
    fn a_budget_reopens_when_it_allows_again_after_closing() {
        let v = |ms, name: &str, allowed| BudgetSeen {
            seen_at: at(ms),
            budget: format!("shop/{name}"),
            allowed,
        };
        let all = [
            v(0, "wave-001", 5),
            v(500, "wave-001", 0),
            v(600, "wave-002", 3),
            v(900, "wave-001", 0),
            v(4000, "wave-001", 2),
            v(5000, "wave-001", 0),
        ];
        assert_eq!(
            reopened(&all, &node_name(1), at(100)),
            Some((at(500), at(4000)))
        );
        // Only from the cordon on.
        assert_eq!(
            reopened(&all, &node_name(1), at(4500)),
            None,
            "closed at 5000, never reopened"
        );
        assert_eq!(reopened(&all, &node_name(2), at(0)), None, "never closed");
    }
}
