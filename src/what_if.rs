//! `forewarn what-if`: what the policy would do if Azure announced an event
//! for a node now, read from the cluster and planned by the controller's
//! own pure code, without writing anything.
//!
//! The prediction ([`predict`]) is a function of what was read
//! ([`ClusterView`]) and the request: the same steps the controller takes
//! for a real event, with a `ScheduledEvent` made up for the node
//! ([`crate::controller::decide::plan::plan`] picks the action, the pods
//! to evict with their grace periods and the pods kept;
//! [`crate::controller::observe::pod_list`] says which pods the drain
//! leaves out and why). What the controller learns only from the API
//! server's answers, the PodDisruptionBudgets' refusals, is foreseen from
//! each budget's `status.disruptionsAllowed` as the Eviction API judges it
//! (k8s.io/kubernetes `pkg/registry/core/pod/storage/eviction.go`): an
//! eviction passes while the one budget selecting the pod allows a
//! disruption, and each eviction takes one; a pod that more than one budget
//! selects is refused whatever they allow. The approval is then planned on
//! the node as the drain would leave it: cordoned, with the pods kept and
//! the pods the budgets block.
//!
//! Not foreseen: pods that take part in the acknowledgement wait (label
//! `forewarn.dev/acknowledge`; the approval would wait for them), budgets'
//! `unhealthyPodEvictionPolicy`, and anything that changes between now and
//! the event (new pods, replacements that never become ready).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;

use crate::api::{EventStatus, ScheduledEvent, ScheduledEventSpec};
use crate::controller::act::drain::selects;
use crate::controller::decide::plan::{Plan, plan};
use crate::controller::observe::nodes::vm_name_from_provider_id;
use crate::controller::observe::observed::{Observed, ObservedNode};
use crate::controller::observe::pod_list::{PodInfo, classify_pod, left_out};
use crate::policy::{Action, Policy};
use crate::topology::VirtualMachineReport;

/// The name of the made-up `ScheduledEvent` the prediction plans.
const EVENT_NAME: &str = "what-if";

/// The key of the policy in the chart's ConfigMap
/// (`charts/forewarn/templates/policy-configmap.yaml`).
pub const POLICY_KEY: &str = "policy.yaml";

/// Errors of `forewarn what-if`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read or the client built.
    #[error("cannot reach the cluster: {0}")]
    Client(#[source] kube::Error),
    /// The prediction could not be written as YAML (a bug).
    #[error("failed to write YAML: {0}")]
    Yaml(String),
    /// A read from the API server failed.
    #[error("failed to read {what}: {source}")]
    Read {
        /// What was read.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The node does not exist.
    #[error("node {0} not found")]
    NoNode(String),
    /// The policy could not be read or is not valid.
    #[error(transparent)]
    Policy(#[from] crate::policy::Error),
    /// `--policy-configmap` is not `namespace/name`, or the ConfigMap
    /// holds no policy.
    #[error("{0}")]
    PolicyConfigMap(String),
    /// More than one installed policy ConfigMap was found.
    #[error(
        "found more than one forewarn policy ConfigMap ({0}): choose one with --policy-configmap NAMESPACE/NAME"
    )]
    SeveralPolicies(String),
    /// The prediction could not be written as JSON.
    #[error("cannot write the prediction as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The event to imagine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The node's name.
    pub node: String,
    /// `EventType`: `Reboot`, `Redeploy`, `Freeze`, `Preempt`, `Terminate`.
    pub event_type: String,
    /// `EventSource`: `Platform` or `User`.
    pub event_source: String,
    /// How long before `NotBefore` Azure announces it (most events: 5 to
    /// 15 minutes).
    pub notice: Duration,
    /// `DurationInSeconds`: `-1` unknown, `0` none, else seconds.
    pub duration_seconds: i64,
}

/// What was read from the cluster.
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// The node.
    pub node: Node,
    /// The VM its agent reported (its `VirtualMachineReport`), if read.
    pub reported_vm: Option<String>,
    /// The pods bound to it.
    pub pods: Vec<Pod>,
    /// The PodDisruptionBudgets of the namespaces of those pods.
    pub budgets: Vec<PodDisruptionBudget>,
    /// The policy in force.
    pub policy: Policy,
    /// Where the policy came from, for people: `ConfigMap forewarn/forewarn-policy`.
    pub policy_source: String,
}

/// What the controller would do.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Prediction {
    /// The node.
    pub node: String,
    /// The VM name the event would name: from the node's `providerID`, else
    /// as its agent reported it, else the node's name.
    pub vm: String,
    /// The event imagined.
    pub event: EventView,
    /// The policy's choice.
    pub policy: PolicyView,
    /// When the cordon and drain would start (`NotBefore` minus the drain
    /// lead time; at once when the notice is shorter), if the action cordons.
    pub drain_starts_at: Option<DateTime<Utc>>,
    /// `NotBefore` minus `drainMarginSeconds`: the grace periods end by then.
    pub drain_deadline: Option<DateTime<Utc>>,
    /// Whether the node would be cordoned.
    pub cordons: bool,
    /// The pods that would be evicted, in the order asked for.
    pub evicted: Vec<EvictedPod>,
    /// The pods that would stay, and why.
    pub kept: Vec<KeptPod>,
    /// The PodDisruptionBudgets that select a pod the drain would evict.
    pub budgets: Vec<BudgetView>,
    /// The approval.
    pub approval: ApprovalView,
}

/// The event imagined.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    /// `EventType`.
    pub event_type: String,
    /// `EventSource`.
    pub event_source: String,
    /// `DurationInSeconds`.
    pub duration_seconds: i64,
    /// `NotBefore`: now plus the notice.
    pub not_before: DateTime<Utc>,
}

/// The policy's choice.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyView {
    /// Where the policy came from.
    pub source: String,
    /// The action (`status.action`).
    pub action: Action,
    /// What the action does, for people.
    pub description: String,
}

/// A pod the drain would evict.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictedPod {
    /// `namespace/name`.
    pub pod: String,
    /// The grace period the eviction would ask for, seconds
    /// ([`crate::controller::decide::plan::eviction_grace`]): what the API
    /// server records as `deletionGracePeriodSeconds`.
    pub grace_seconds: i64,
    /// The pod's own `terminationGracePeriodSeconds`.
    pub own_grace_seconds: i64,
    /// The budget it waits for, when its eviction passes only once a
    /// replacement elsewhere is ready: `namespace/name`.
    pub waits_for_budget: Option<String>,
}

/// A pod the drain would leave on the node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptPod {
    /// `namespace/name`.
    pub pod: String,
    /// Why.
    pub reason: String,
    /// Whether the approval waits for it (it counts against the drain: a
    /// pod without a controller, a pod a budget blocks), as opposed to a
    /// pod that stays without holding anything up (DaemonSet, mirror,
    /// finished).
    pub holds_the_drain: bool,
}

/// How a PodDisruptionBudget would hold the drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Blocking {
    /// It allows every eviction of its pods on the node.
    No,
    /// It allows some at once; the others pass one by one as replacements
    /// elsewhere become ready.
    UntilReplacementsReady,
    /// It allows none (`disruptionsAllowed: 0`): its pods on the node stay
    /// for as long as it stays so, at most until the drain deadline.
    WholeDrain,
    /// Another budget selects the same pods: the Eviction API refuses a pod
    /// under more than one budget, whatever they allow.
    MoreThanOneBudget,
}

/// A PodDisruptionBudget that selects a pod the drain would evict.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetView {
    /// `namespace/name`.
    pub name: String,
    /// Its `status.disruptionsAllowed` now.
    pub disruptions_allowed: i32,
    /// Its pods on the node the drain would evict.
    pub pods: Vec<String>,
    /// Those it lets go at once.
    pub at_once: usize,
    /// How it holds the drain.
    pub blocking: Blocking,
    /// For people.
    pub explanation: String,
}

/// When the approval would come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ApprovalWhen {
    /// At once, without a drain (`Approve`).
    AtOnce,
    /// Once the node is drained.
    AfterDrain,
    /// At the drain deadline with the drain incomplete (`onDeadline: Approve`).
    AtDeadline,
    /// Never: Azure starts the event at `NotBefore` itself.
    Never,
}

/// The approval.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalView {
    /// When.
    pub when: ApprovalWhen,
    /// Whether it would come before `NotBefore` (so the event starts early).
    pub before_not_before: bool,
    /// The latest time it would be decided by, if it is (the drain's end
    /// counts every evicted pod's whole grace period).
    pub by: Option<DateTime<Utc>>,
    /// The controller's own words (the reason it decides or withholds).
    pub reason: String,
}

/// The made-up event of `req` for the VM `vm`, announced at `now`.
fn imagined_event(req: &Request, vm: &str, now: DateTime<Utc>) -> ScheduledEvent {
    let notice = chrono::Duration::from_std(req.notice).unwrap_or(chrono::Duration::zero());
    ScheduledEvent::new(
        EVENT_NAME,
        ScheduledEventSpec {
            event_id: EVENT_NAME.to_ascii_uppercase(),
            event_type: req.event_type.clone(),
            event_status: EventStatus::Scheduled,
            event_source: req.event_source.clone(),
            resource_type: "VirtualMachine".into(),
            resources: vec![vm.to_string()],
            not_before: Some(now + notice),
            duration_seconds: req.duration_seconds,
            description: "forewarn what-if".into(),
            appearance: 1,
        },
    )
}

/// The one node, mapped to the event, as the plan observes it.
fn observed(
    name: &str,
    vm: &str,
    cordoned: bool,
    holds: Vec<String>,
    pods: Vec<Arc<PodInfo>>,
) -> Observed {
    Observed {
        nodes: vec![ObservedNode {
            name: name.into(),
            vm_name: vm.into(),
            cordoned,
            holds,
            pods,
            ..ObservedNode::default()
        }],
        ..Observed::default()
    }
}

/// The pods a budget blocks, and each budget's part, from the evictions
/// in `plan` and the budgets' `disruptionsAllowed`.
struct Budgets {
    views: Vec<BudgetView>,
    /// `namespace/name` of each pod refused for the whole drain, with why.
    blocked: BTreeMap<String, String>,
    /// `namespace/name` of each pod let go once a replacement is ready, with the budget.
    later: BTreeMap<String, String>,
}

/// A budget's `status.disruptionsAllowed`; 0 before the disruption
/// controller has written it (the Eviction API then refuses).
fn disruptions_allowed(b: &PodDisruptionBudget) -> i32 {
    b.status
        .as_ref()
        .and_then(|s| s.disruptions_allowed)
        .unwrap_or(0)
}

/// Foresees the Eviction API's answers to `plan`'s evictions in order (see
/// the module's doc).
fn foresee_budgets(plan: &Plan, budgets: &[PodDisruptionBudget]) -> Budgets {
    let key =
        |b: &PodDisruptionBudget| format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any());
    let mut allowed: BTreeMap<String, i32> = budgets
        .iter()
        .map(|b| (key(b), disruptions_allowed(b)))
        .collect();
    let mut pods_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut at_once: BTreeMap<String, usize> = BTreeMap::new();
    let mut multi: BTreeSet<String> = BTreeSet::new();
    let mut blocked = BTreeMap::new();
    let mut later = BTreeMap::new();
    for e in &plan.evictions {
        let selecting: Vec<String> = budgets
            .iter()
            .filter(|b| b.namespace().as_deref() == Some(e.pod.namespace.as_str()))
            .filter(|b| {
                b.spec
                    .as_ref()
                    .and_then(|s| s.selector.as_ref())
                    .is_some_and(|sel| selects(sel, &e.pod.labels))
            })
            .map(key)
            .collect();
        for b in &selecting {
            pods_of.entry(b.clone()).or_default().push(e.pod.key());
        }
        match selecting.as_slice() {
            [] => {}
            [one] => {
                let left = allowed.entry(one.clone()).or_insert(0);
                if *left > 0 {
                    *left -= 1;
                    *at_once.entry(one.clone()).or_insert(0) += 1;
                } else if budgets
                    .iter()
                    .find(|b| key(b) == *one)
                    .is_some_and(|b| disruptions_allowed(b) > 0)
                {
                    later.insert(e.pod.key(), one.clone());
                } else {
                    blocked.insert(
                        e.pod.key(),
                        format!(
                            "PodDisruptionBudget {one} allows no disruption (disruptionsAllowed 0)"
                        ),
                    );
                }
            }
            several => {
                multi.extend(several.iter().cloned());
                blocked.insert(
                    e.pod.key(),
                    format!(
                        "more than one PodDisruptionBudget selects it ({}): the Eviction API refuses such a pod",
                        several.join(", ")
                    ),
                );
            }
        }
    }
    let views = pods_of
        .into_iter()
        .map(|(name, pods)| {
            let d = budgets
                .iter()
                .find(|b| key(b) == name)
                .map_or(0, disruptions_allowed);
            let n = at_once.get(&name).copied().unwrap_or(0);
            let (blocking, explanation) = if multi.contains(&name) {
                (
                    Blocking::MoreThanOneBudget,
                    "another budget selects the same pods: their evictions are refused for the whole drain".to_string(),
                )
            } else if n == pods.len() {
                (Blocking::No, format!("allows {d}: every eviction passes"))
            } else if d > 0 {
                (
                    Blocking::UntilReplacementsReady,
                    format!(
                        "allows {d}: {n} of {} at once, each other once a replacement elsewhere is ready",
                        pods.len()
                    ),
                )
            } else {
                (
                    Blocking::WholeDrain,
                    "allows 0: every eviction refused for as long as it stays so, up to the drain deadline".to_string(),
                )
            };
            BudgetView {
                name,
                disruptions_allowed: d,
                at_once: n,
                pods,
                blocking,
                explanation,
            }
        })
        .collect();
    Budgets {
        views,
        blocked,
        later,
    }
}

/// What the controller would do about `req` on the cluster `view` at
/// `now` (see the module's doc).
pub fn predict(req: &Request, view: &ClusterView, now: DateTime<Utc>) -> Prediction {
    let node_name = view.node.name_any();
    let vm = view
        .node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(vm_name_from_provider_id)
        .or_else(|| view.reported_vm.clone())
        .unwrap_or_else(|| node_name.clone());
    let ev = imagined_event(req, &vm, now);
    let not_before = ev.spec.not_before.unwrap_or(now);
    let cordoned = view
        .node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let infos: Vec<Arc<PodInfo>> = view
        .pods
        .iter()
        .filter_map(classify_pod)
        .map(Arc::new)
        .collect();
    let policy = &view.policy;
    let seen = observed(&node_name, &vm, cordoned, Vec::new(), infos.clone());
    let mut first = plan(&ev, &seen, policy, now);
    // Announced ahead of its lead time: the drain starts later, and its
    // grace periods are clipped from then.
    let start = first.drain_starts_at.unwrap_or(now);
    if first.drain_starts_at.is_some() {
        first = plan(&ev, &seen, policy, start);
    }
    let action = first.action;
    let foreseen = foresee_budgets(&first, &view.budgets);

    let mut kept: Vec<KeptPod> = view
        .pods
        .iter()
        .filter_map(|p| {
            left_out(p).map(|why| KeptPod {
                pod: format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
                reason: why.describe().into(),
                holds_the_drain: false,
            })
        })
        .collect();
    if action.drains() {
        kept.extend(first.kept.iter().map(|k| KeptPod {
            pod: k.pod.clone(),
            reason: k.reason.clone(),
            holds_the_drain: true,
        }));
        kept.extend(foreseen.blocked.iter().map(|(pod, why)| KeptPod {
            pod: pod.clone(),
            reason: why.clone(),
            holds_the_drain: true,
        }));
    }
    if action.drains() {
        kept.extend(
            infos
                .iter()
                .filter(|p| p.terminating.is_some())
                .map(|p| KeptPod {
                    pod: p.key(),
                    reason: "already terminating: the drain waits for it to go".into(),
                    holds_the_drain: false,
                }),
        );
    }
    let evicted: Vec<EvictedPod> = first
        .evictions
        .iter()
        .filter(|e| !foreseen.blocked.contains_key(&e.pod.key()))
        .map(|e| EvictedPod {
            pod: e.pod.key(),
            grace_seconds: e.grace_seconds,
            own_grace_seconds: e.pod.grace_seconds,
            waits_for_budget: foreseen.later.get(&e.pod.key()).cloned(),
        })
        .collect();

    let approval = foresee_approval(
        &ev, &node_name, &vm, &infos, &first, &foreseen, &evicted, policy, start,
    );
    Prediction {
        node: node_name,
        vm,
        event: EventView {
            event_type: req.event_type.clone(),
            event_source: req.event_source.clone(),
            duration_seconds: req.duration_seconds,
            not_before,
        },
        policy: PolicyView {
            source: view.policy_source.clone(),
            action,
            description: action.describe().into(),
        },
        drain_starts_at: action.cordons().then_some(start),
        drain_deadline: first.deadline,
        cordons: action.cordons(),
        evicted,
        kept,
        budgets: foreseen.views,
        approval,
    }
}

/// When the approval would come: the plan of the node as the drain
/// would leave it (cordoned and held, with the pods kept and the pods the
/// budgets block), once the evicted pods' grace periods are over, and
/// failing that at the drain deadline (where `onDeadline` decides).
#[allow(clippy::too_many_arguments)]
fn foresee_approval(
    ev: &ScheduledEvent,
    node: &str,
    vm: &str,
    infos: &[Arc<PodInfo>],
    first: &Plan,
    foreseen: &Budgets,
    evicted: &[EvictedPod],
    policy: &Policy,
    start: DateTime<Utc>,
) -> ApprovalView {
    let not_before = ev.spec.not_before.unwrap_or(start);
    if !first.action.approves() {
        return ApprovalView {
            when: ApprovalWhen::Never,
            before_not_before: false,
            by: None,
            reason: format!(
                "the action {} never approves: Azure starts the event at NotBefore ({})",
                first.action.as_str(),
                not_before.to_rfc3339()
            ),
        };
    }
    if first.action == Action::Approve {
        return match &first.decide_approval {
            Some(r) => ApprovalView {
                when: ApprovalWhen::AtOnce,
                before_not_before: true,
                by: Some(start),
                reason: r.clone(),
            },
            None => never(first, not_before),
        };
    }
    let staying: Vec<Arc<PodInfo>> = infos
        .iter()
        .filter(|p| {
            foreseen.blocked.contains_key(&p.key()) || first.kept.iter().any(|k| k.pod == p.key())
        })
        .cloned()
        .collect();
    let drained = observed(node, vm, true, vec![EVENT_NAME.into()], staying);
    let longest = evicted.iter().map(|e| e.grace_seconds).max().unwrap_or(0);
    let done = start + chrono::Duration::seconds(longest);
    let deadline = first.deadline.unwrap_or(not_before);
    if done <= deadline {
        let p = plan(ev, &drained, policy, done);
        if let Some(r) = p.decide_approval {
            return ApprovalView {
                when: ApprovalWhen::AfterDrain,
                before_not_before: true,
                by: Some(done),
                reason: r,
            };
        }
    }
    let p = plan(ev, &drained, policy, deadline);
    match p.decide_approval {
        Some(r) => ApprovalView {
            when: ApprovalWhen::AtDeadline,
            before_not_before: true,
            by: Some(deadline),
            reason: r,
        },
        None => never(&p, not_before),
    }
}

/// No approval: the platform starts the event at `NotBefore`.
fn never(p: &Plan, not_before: DateTime<Utc>) -> ApprovalView {
    ApprovalView {
        when: ApprovalWhen::Never,
        before_not_before: false,
        by: None,
        reason: format!(
            "{}; Azure starts the event at NotBefore ({})",
            p.approval_withheld
                .clone()
                .unwrap_or_else(|| "no approval decided".into()),
            not_before.to_rfc3339()
        ),
    }
}

/// The prediction as text for people.
pub fn render_text(p: &Prediction) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "What forewarn would do if Azure announced a {} {} event (DurationInSeconds {}) for node {} (VM {}) now, NotBefore {}:",
        p.event.event_source,
        p.event.event_type,
        p.event.duration_seconds,
        p.node,
        p.vm,
        p.event.not_before.to_rfc3339()
    );
    let _ = writeln!(
        s,
        "\nPolicy ({}): {}: {}",
        p.policy.source,
        p.policy.action.as_str(),
        p.policy.description
    );
    if let Some(start) = p.drain_starts_at {
        let _ = writeln!(s, "Cordon and drain start: {}", start.to_rfc3339());
    }
    if let Some(d) = p.drain_deadline.filter(|_| p.cordons) {
        let _ = writeln!(
            s,
            "Drain deadline (grace periods end by): {}",
            d.to_rfc3339()
        );
    }
    let _ = writeln!(s, "\nPods evicted ({}):", p.evicted.len());
    for e in &p.evicted {
        let _ = write!(
            s,
            "  {}  grace {}s (its own {}s)",
            e.pod, e.grace_seconds, e.own_grace_seconds
        );
        if let Some(b) = &e.waits_for_budget {
            let _ = write!(s, ", once PodDisruptionBudget {b} allows it again");
        }
        s.push('\n');
    }
    let _ = writeln!(s, "\nPods kept ({}):", p.kept.len());
    for k in &p.kept {
        let _ = writeln!(
            s,
            "  {}  {}{}",
            k.pod,
            k.reason,
            if k.holds_the_drain {
                " [holds the drain]"
            } else {
                ""
            }
        );
    }
    let _ = writeln!(s, "\nPodDisruptionBudgets ({}):", p.budgets.len());
    for b in &p.budgets {
        let _ = writeln!(
            s,
            "  {}  {:?}: {} ({} pods on the node: {})",
            b.name,
            b.blocking,
            b.explanation,
            b.pods.len(),
            b.pods.join(", ")
        );
    }
    let _ = writeln!(
        s,
        "\nApproval: {:?}{}{}: {}",
        p.approval.when,
        p.approval
            .by
            .map(|t| format!(" by {}", t.to_rfc3339()))
            .unwrap_or_default(),
        if p.approval.before_not_before {
            ", before NotBefore"
        } else {
            ", none before NotBefore"
        },
        p.approval.reason
    );
    s
}

/// Reads what [`predict`] needs: the node, its pods, the budgets of their
/// namespaces and the policy (`policy_file`, else the ConfigMap
/// `policy_configmap` (`namespace/name`), else the one the chart installed,
/// else the built-in default).
///
/// # Errors
/// [`Error::Read`], [`Error::NoNode`], [`Error::Policy`],
/// [`Error::PolicyConfigMap`], [`Error::SeveralPolicies`].
pub async fn read_cluster(
    client: &Client,
    node: &str,
    policy_file: Option<&str>,
    policy_configmap: Option<&str>,
) -> Result<ClusterView, Error> {
    let read = |what: String| move |source| Error::Read { what, source };
    let node_obj = Api::<Node>::all(client.clone())
        .get_opt(node)
        .await
        .map_err(read(format!("node {node}")))?
        .ok_or_else(|| Error::NoNode(node.into()))?;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(read(format!("the pods of node {node}")))?
        .items;
    let namespaces: BTreeSet<String> = pods.iter().filter_map(ResourceExt::namespace).collect();
    let mut budgets = Vec::new();
    for ns in namespaces {
        let list = Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .map_err(read(format!("the PodDisruptionBudgets of namespace {ns}")))?;
        budgets.extend(list.items);
    }
    // Only for display: a report that cannot be read leaves the node's name.
    let reported_vm = Api::<VirtualMachineReport>::all(client.clone())
        .get_opt(node)
        .await
        .ok()
        .flatten()
        .map(|r| r.spec.vm);
    let (policy, policy_source) = read_policy(client, policy_file, policy_configmap).await?;
    Ok(ClusterView {
        node: node_obj,
        reported_vm,
        pods,
        budgets,
        policy,
        policy_source,
    })
}

/// The policy and where it came from (see [`read_cluster`]). The chart's
/// ConfigMap is found by its labels (`app.kubernetes.io/part-of=forewarn`,
/// `app.kubernetes.io/component=controller`) and its key [`POLICY_KEY`];
/// when the user may not list ConfigMaps, the built-in default is used and
/// said so.
async fn read_policy(
    client: &Client,
    policy_file: Option<&str>,
    policy_configmap: Option<&str>,
) -> Result<(Policy, String), Error> {
    if let Some(path) = policy_file {
        return Ok((Policy::load(path)?, format!("file {path}")));
    }
    if let Some(nsname) = policy_configmap {
        let (ns, name) = nsname.split_once('/').ok_or_else(|| {
            Error::PolicyConfigMap(format!(
                "--policy-configmap {nsname}: expected NAMESPACE/NAME"
            ))
        })?;
        let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get(name)
            .await
            .map_err(|source| Error::Read {
                what: format!("ConfigMap {nsname}"),
                source,
            })?;
        return policy_of(&cm);
    }
    let found =
        Api::<ConfigMap>::all(client.clone())
            .list(&ListParams::default().labels(
                "app.kubernetes.io/part-of=forewarn,app.kubernetes.io/component=controller",
            ))
            .await;
    let found: Vec<ConfigMap> = match found {
        Ok(list) => list
            .items
            .into_iter()
            .filter(|c| c.data.as_ref().is_some_and(|d| d.contains_key(POLICY_KEY)))
            .collect(),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            return Ok((
                Policy::default(),
                "built-in default (not allowed to list ConfigMaps to find the installed one; give --policy-configmap or --policy-file)".into(),
            ));
        }
        Err(source) => {
            return Err(Error::Read {
                what: "the forewarn policy ConfigMaps".into(),
                source,
            });
        }
    };
    match found.as_slice() {
        [] => Ok((
            Policy::default(),
            "built-in default (no forewarn policy ConfigMap found)".into(),
        )),
        [one] => policy_of(one),
        several => Err(Error::SeveralPolicies(
            several
                .iter()
                .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
                .collect::<Vec<_>>()
                .join(", "),
        )),
    }
}

/// The policy a ConfigMap holds under [`POLICY_KEY`].
fn policy_of(cm: &ConfigMap) -> Result<(Policy, String), Error> {
    let name = format!(
        "ConfigMap {}/{}",
        cm.namespace().unwrap_or_default(),
        cm.name_any()
    );
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(POLICY_KEY))
        .ok_or_else(|| Error::PolicyConfigMap(format!("{name} has no key {POLICY_KEY}")))?;
    Ok((Policy::parse(text, &name)?, name))
}

/// Runs `forewarn what-if`: reads the cluster at `target` (as kubectl
/// does: `--kubeconfig` and `--context`, else `KUBECONFIG`, else
/// `~/.kube/config`, else in-cluster), predicts, and returns the text, JSON
/// or YAML to print.
///
/// # Errors
/// [`Error::Client`] and those of [`read_cluster`]; [`Error::Json`].
pub async fn run(
    req: &Request,
    policy_file: Option<&str>,
    policy_configmap: Option<&str>,
    output: crate::cli::Output,
    target: &crate::kubeclient::PersonTarget,
) -> Result<String, Error> {
    let (client, _) = crate::kubeclient::client_for_person(target)
        .await
        .map_err(Error::Client)?;
    let view = read_cluster(&client, &req.node, policy_file, policy_configmap).await?;
    let p = predict(req, &view, Utc::now());
    match output {
        crate::cli::Output::Json => Ok(serde_json::to_string_pretty(&p)? + "\n"),
        crate::cli::Output::Yaml => {
            serde_saphyr::to_string(&p).map_err(|e| Error::Yaml(e.to_string()))
        }
        crate::cli::Output::Text => Ok(render_text(&p)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, app: &str, owner: Option<&str>, grace: i64) -> Pod {
        let owners = owner.map(|k| {
            json!([{"apiVersion": "apps/v1", "kind": k, "name": "o", "uid": "u", "controller": true}])
        });
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "uid": name, "labels": {"app": app},
                         "ownerReferences": owners.unwrap_or(json!([]))},
            "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": grace, "containers": []},
            "status": {"phase": "Running"},
        }))
        .unwrap()
    }

    fn budget(name: &str, app: &str, allowed: i32) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0},
        }))
        .unwrap()
    }

    fn view(pods: Vec<Pod>, budgets: Vec<PodDisruptionBudget>, policy: Policy) -> ClusterView {
        ClusterView {
            node: serde_json::from_value(json!({"metadata": {"name": "n1"},
                "spec": {"providerID": "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/vmss/virtualMachines/3"}}))
            .unwrap(),
            reported_vm: None,
            pods,
            budgets,
            policy,
            policy_source: "test".into(),
        }
    }

    fn request(event_type: &str, notice_secs: u64, duration: i64) -> Request {
        Request {
            node: "n1".into(),
            event_type: event_type.into(),
            event_source: "Platform".into(),
            notice: Duration::from_secs(notice_secs),
            duration_seconds: duration,
        }
    }

    fn now() -> DateTime<Utc> {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    /// Budgets are foreseen in the plan's order: the one allowing 1 lets
    /// one of its two pods go at once and the other later; the drain is
    /// then done when the longest grace is over, before NotBefore, and the
    /// approval is the controller's own decision.
    #[test]
    fn a_drain_nothing_blocks_for_good_is_approved_before_not_before() {
        let v = view(
            vec![
                pod("web-1", "web", Some("ReplicaSet"), 30),
                pod("web-2", "web", Some("ReplicaSet"), 30),
                pod("db-0", "db", Some("StatefulSet"), 600),
                pod("agent-x", "agent", Some("DaemonSet"), 30),
            ],
            vec![budget("web", "web", 1)],
            Policy::default(),
        );
        let p = predict(&request("Reboot", 600, -1), &v, now());
        assert_eq!(p.vm, "vmss_3");
        assert_eq!(p.policy.action, Action::DrainAndApprove);
        let graces: Vec<(&str, i64, Option<&str>)> = p
            .evicted
            .iter()
            .map(|e| {
                (
                    e.pod.as_str(),
                    e.grace_seconds,
                    e.waits_for_budget.as_deref(),
                )
            })
            .collect();
        // NotBefore in 600 s, margin 5: the 600 s grace is clipped to 595.
        assert_eq!(
            graces,
            [
                ("shop/web-1", 30, None),
                ("shop/web-2", 30, Some("shop/web")),
                ("shop/db-0", 595, None)
            ]
        );
        assert_eq!(p.budgets.len(), 1);
        assert_eq!(p.budgets[0].blocking, Blocking::UntilReplacementsReady);
        assert_eq!(p.kept.len(), 1);
        assert!(p.kept[0].reason.starts_with("DaemonSet pod"));
        assert_eq!(p.approval.when, ApprovalWhen::AfterDrain);
        assert!(p.approval.before_not_before);
        assert_eq!(p.approval.by, Some(now() + chrono::Duration::seconds(595)));
    }

    /// A budget allowing none and a pod under two budgets hold the drain
    /// to the deadline: under the default `onDeadline: Hold` no approval;
    /// under `Approve`, at the deadline.
    #[test]
    fn blocked_budgets_hold_the_approval_by_the_policy_on_deadline() {
        let pods = vec![
            pod("stuck-1", "stuck", Some("ReplicaSet"), 30),
            pod("two-1", "two", Some("ReplicaSet"), 30),
        ];
        let budgets = vec![
            budget("stuck", "stuck", 0),
            budget("two-a", "two", 1),
            budget("two-b", "two", 1),
        ];
        let v = view(pods.clone(), budgets.clone(), Policy::default());
        let p = predict(&request("Redeploy", 900, -1), &v, now());
        assert!(p.evicted.is_empty(), "{:?}", p.evicted);
        let blocking: Vec<(&str, Blocking)> = p
            .budgets
            .iter()
            .map(|b| (b.name.as_str(), b.blocking))
            .collect();
        assert_eq!(
            blocking,
            [
                ("shop/stuck", Blocking::WholeDrain),
                ("shop/two-a", Blocking::MoreThanOneBudget),
                ("shop/two-b", Blocking::MoreThanOneBudget)
            ]
        );
        assert!(p.kept.iter().all(|k| k.holds_the_drain));
        assert_eq!(p.approval.when, ApprovalWhen::Never);
        let approve = Policy::parse("onDeadline: Approve", "t").unwrap();
        let p = predict(
            &request("Redeploy", 900, -1),
            &view(pods, budgets, approve),
            now(),
        );
        assert_eq!(p.approval.when, ApprovalWhen::AtDeadline);
        assert_eq!(p.approval.by, p.drain_deadline);
    }

    /// The built-in policy approves a short Freeze at once, without a
    /// drain; a long notice waits for the drain lead time, and the grace
    /// periods are clipped from then.
    #[test]
    fn short_freeze_is_approved_at_once_and_a_long_notice_drains_later() {
        let v = view(
            vec![pod("web-1", "web", Some("ReplicaSet"), 30)],
            vec![],
            Policy::default(),
        );
        let p = predict(&request("Freeze", 900, 5), &v, now());
        assert_eq!(p.policy.action, Action::Approve);
        assert!(p.evicted.is_empty() && !p.cordons);
        assert_eq!(p.approval.when, ApprovalWhen::AtOnce);
        // Two hours' notice, lead time one hour.
        let p = predict(&request("Reboot", 7200, -1), &v, now());
        assert_eq!(
            p.drain_starts_at,
            Some(now() + chrono::Duration::seconds(3600))
        );
        assert_eq!(p.evicted[0].grace_seconds, 30);
        assert_eq!(p.approval.when, ApprovalWhen::AfterDrain);
    }
}
