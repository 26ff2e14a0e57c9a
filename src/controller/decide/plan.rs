//! The pure heart of the controller: given an event and what the cluster
//! looks like, what to do next. No I/O here, so every rule in docs/how-it-works.md is
//! tested without a cluster; [`crate::controller::decide::status`] then says what the status
//! should record.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::api::{EventStatus, Phase, ScheduledEvent, ScheduledEventSpec};
use crate::controller::decide::acknowledge::{self, AckState};
use crate::controller::decide::manual::{self, Override};
use crate::controller::decide::out_of_service;
use crate::controller::observe::observed::{Observed, ObservedNode};
use crate::controller::observe::pod_list::PodInfo;
use crate::imds::model::EventType;
use crate::policy::{Action, DeadlineAction, Policy};
use crate::text::{NAMED_IN_MESSAGE, named};

/// How long after its `deletionTimestamp` a terminating pod is taken as
/// stopped although its object remains (a finalizer, a lost kubelet): its
/// containers have had their whole grace period, so the node no longer waits
/// for it. The same idea as `kubectl drain --skip-wait-for-delete-timeout`.
pub const STUCK_TERMINATING_AFTER: chrono::TimeDelta = chrono::TimeDelta::seconds(30);

/// A write to a Node's cordon, taint and hold list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeWrite {
    /// Cordon and taint the node and record the event as holding it.
    Cordon {
        /// Node name.
        node: String,
        /// The hold list to write.
        holds: Vec<String>,
    },
    /// The node is already cordoned by forewarn for other events: add this one.
    AddHold {
        /// Node name.
        node: String,
        /// The hold list to write.
        holds: Vec<String>,
    },
    /// Remove this event's hold; uncordon and untaint when no hold is left.
    Release {
        /// Node name.
        node: String,
        /// The hold list to write (empty: remove the annotation). Other
        /// events that claim the node are in it even if they had not written
        /// their hold yet, so the node is never schedulable in between.
        holds: Vec<String>,
        /// Whether to uncordon (no hold left and the node is still cordoned).
        uncordon: bool,
    },
}

impl NodeWrite {
    /// The node written.
    pub fn node(&self) -> &str {
        match self {
            NodeWrite::Cordon { node, .. }
            | NodeWrite::AddHold { node, .. }
            | NodeWrite::Release { node, .. } => node,
        }
    }

    /// The hold list written.
    pub fn holds(&self) -> &[String] {
        match self {
            NodeWrite::Cordon { holds, .. }
            | NodeWrite::AddHold { holds, .. }
            | NodeWrite::Release { holds, .. } => holds,
        }
    }

    /// `spec.unschedulable` to write, if it changes.
    pub fn unschedulable(&self) -> Option<bool> {
        match self {
            NodeWrite::Cordon { .. } | NodeWrite::AddHold { .. } => Some(true),
            NodeWrite::Release { uncordon, .. } => uncordon.then_some(false),
        }
    }
}

/// One eviction to request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    /// Node the pod runs on.
    pub node: String,
    /// The pod (shared with the observation it was planned from).
    pub pod: Arc<PodInfo>,
    /// Grace period to ask for, seconds: see [`eviction_grace`]. Never 0.
    pub grace_seconds: i64,
}

/// A pod the drain leaves on its node, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Node the pod runs on.
    pub node: String,
    /// `namespace/name`.
    pub pod: String,
    /// Why, e.g. `no controller`.
    pub reason: String,
    /// Kept because the policy's `excludePods` names it: the operator's
    /// choice, so the approval does not wait for it (a pod kept for want
    /// of a controller holds the drain up).
    pub excluded: bool,
}

/// What to do next for one event.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The policy action.
    pub action: Action,
    /// The phase after this step.
    pub phase: Phase,
    /// Node writes (cordon, hold, release).
    pub node_writes: Vec<NodeWrite>,
    /// Evictions to request.
    pub evictions: Vec<Eviction>,
    /// Pods left on their nodes on purpose (no controller), reported.
    pub kept: Vec<Kept>,
    /// The drain deadline (`NotBefore` minus the margin), if the event has one.
    pub deadline: Option<DateTime<Utc>>,
    /// `Some(reason)` when the approval is decided now.
    pub decide_approval: Option<String>,
    /// Why the approval decided now may be sent from a node not drained
    /// (the policy approves the event without a drain, the drain deadline
    /// passed under `onDeadline: Approve`, a person approved it now, or no
    /// VM it names is a node here); `None` when it was decided on every
    /// affected node drained.
    pub decided_undrained: Option<String>,
    /// Why the approval decided before is taken back (a doubt or a
    /// disagreement appeared after it, before IMDS accepted it): the status
    /// drops it, and agents that have not sent it do not.
    pub revoke_approval: Option<String>,
    /// Why approval is withheld although the drain is done, if it is.
    pub approval_withheld: Option<String>,
    /// A decided approval IMDS has not accepted yet: `(reason, message)`,
    /// e.g. `("AgentMissing", "...")`; the phase stays where it was.
    pub approval_pending: Option<(String, String)>,
    /// The cordon and drain wait until this time (`NotBefore` minus the
    /// drain lead time of the matching rule, or of the policy).
    pub drain_starts_at: Option<DateTime<Utc>>,
    /// The approval is decided at the drain deadline with things left
    /// (`onDeadline: Approve`): what was left, for `DrainIncomplete`.
    pub approved_incomplete: Option<String>,
    /// The drain deadline passed with things left and `onDeadline: Hold`
    /// withholds the approval: what was left (nodes not drained with their
    /// pods, pods kept, acknowledgements missing), for `DrainIncomplete`.
    pub held_incomplete: Option<String>,
    /// How long until something falls due whether or not anything else
    /// changes (the drain deadline of an approval that waits, where
    /// `onDeadline` decides): the reconcile looks again by then at the
    /// latest, also while a blocked drain is looked at less often.
    pub due: Option<Duration>,
    /// The controller ends the event itself, no agent being left to see it
    /// leave IMDS: `(reason, message)` for the `EndedWithoutObserver` condition.
    pub ended_unobserved: Option<(String, String)>,
    /// Nodes to taint `node.kubernetes.io/out-of-service` now (the policy's
    /// `outOfServiceTaint`): see [`out_of_service::to_taint`].
    pub out_of_service: Vec<String>,
    /// Delete the object: finished and past retention.
    pub delete: bool,
    /// When to look again.
    pub requeue: Duration,
    /// Whether `requeue` is only the drain's poll for progress (pods
    /// leaving), not a time something falls due: a drain that a
    /// PodDisruptionBudget blocks may then be looked at less often.
    pub polls_progress: bool,
    /// The wait for the pods that take part (notices stored,
    /// acknowledgements): see [`crate::controller::decide::acknowledge`]. `None` when no pod
    /// takes part and none did, or while the drain waits for its lead time.
    pub acknowledgement: Option<AckState>,
    /// An operator's hold or approve-now annotation on the event, as
    /// applied to this plan ([`crate::controller::decide::manual`]).
    pub manual: Option<Override>,
}

/// How an eviction request ended, classified from the API server's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// 201: accepted, the pod is being deleted with the grace asked for.
    Evicted,
    /// 429 with a `DisruptionBudget` cause, or 500 for a pod under more than
    /// one PodDisruptionBudget (the Eviction API refuses those): blocked by
    /// the budgets named (`namespace/name`), retried until the deadline.
    Blocked {
        /// The PodDisruptionBudgets that block it.
        budgets: Vec<String>,
        /// The API server's explanation.
        message: String,
    },
    /// 429 without a budget cause: API Priority and Fairness throttled us;
    /// wait `Retry-After` seconds.
    Throttled {
        /// Seconds to wait (the answer's `retryAfterSeconds`, at least 1).
        retry_after_seconds: u32,
    },
    /// 404, or 409 because the UID precondition failed: the pod planned is
    /// gone (perhaps replaced by a new pod of the same name, which is
    /// planned afresh on the next pass).
    Gone,
    /// Refused for another reason than a budget (403 from an admission
    /// webhook or policy that denies evictions, 422, 409 for another reason
    /// than the UID, 5xx) or a transport error: asked again once the pod's
    /// own backoff has passed (1 s doubling to 60 s).
    Retry(String),
    /// Not asked this pass: the pod's last evictions failed (`Retry`, whose
    /// reason this repeats) and its backoff has not passed.
    Waiting(String),
}

/// Seconds left until the drain deadline (`NotBefore` - margin - now), or
/// `None` without a `NotBefore` (started, or a hardware failure): the pods'
/// own grace periods apply. Negative once the deadline has passed.
pub fn drain_budget(deadline: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<i64> {
    deadline.map(|d| (d - now).num_seconds())
}

/// The grace period to ask for when evicting a pod whose own
/// `terminationGracePeriodSeconds` is `own`, with `budget` seconds left until
/// the drain deadline and a floor of `floor` seconds.
///
/// The pod's own grace, clipped so the pod can stop before the deadline, but
/// never below `floor` (a pod gets at least that to run its preStop hook
/// even when the deadline is near or past) and never raised above its own;
/// and never 0, which the API server treats as a force delete (no preStop,
/// no graceful stop, StatefulSet at-most-one broken). Like `kubectl delete
/// --grace-period=0`, a pod that asks for 0 gets 1.
pub fn eviction_grace(own: i64, budget: Option<i64>, floor: i64) -> i64 {
    let own = own.max(0);
    let clipped = budget.map_or(own, |b| own.min(b));
    clipped.max(floor.min(own)).max(1)
}

/// Whether an approving action may decide its approval now, as far as
/// readiness goes (rule 2's other conditions aside): see [`approval_gate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Nothing is left: approve.
    Open,
    /// Something is left and the deadline has not passed (or the policy
    /// holds): wait.
    Wait,
    /// Something is left, the drain deadline passed, and the policy's
    /// `onDeadline` is `Approve`: approve, and record what was left.
    AtDeadline,
}

/// The deadline decision: given what is `left` of
/// everything that must be done before the approval (nodes not drained,
/// pods kept, and the acknowledgements awaited: [`awaited`]),
/// the drain `deadline` (`NotBefore` minus `drainMarginSeconds`) and the
/// `onDeadline` that applies: approve when nothing is left; when something
/// is, wait, except past the deadline under `Approve`.
pub fn approval_gate(
    left: &[String],
    deadline: Option<DateTime<Utc>>,
    on_deadline: DeadlineAction,
    now: DateTime<Utc>,
) -> Gate {
    if left.is_empty() {
        Gate::Open
    } else if on_deadline == DeadlineAction::Approve && deadline.is_some_and(|d| now >= d) {
        Gate::AtDeadline
    } else {
        Gate::Wait
    }
}

/// What is left before an approval: each mapped node not drained (with
/// the pods that must still leave it, a few named), each pod kept (but
/// those the policy's `excludePods` keeps), and
/// each acknowledgement `awaiting` ([`awaited`]).
fn left_before_approval(
    mapped: &[&ObservedNode],
    kept: &[Kept],
    seen: &Observed,
    awaiting: &[String],
    now: DateTime<Utc>,
) -> Vec<String> {
    let mut left: Vec<String> = mapped
        .iter()
        .filter(|n| !node_drained(n, seen.dry_run, now))
        .map(|n| {
            let pods: Vec<String> = n
                .pods
                .iter()
                .filter(|p| must_leave(p, now))
                .map(|p| p.key())
                .collect();
            if pods.is_empty() {
                format!("{} not drained (not cordoned yet)", n.name)
            } else {
                format!(
                    "{} not drained ({} pods left: {})",
                    n.name,
                    pods.len(),
                    named(&pods, 3, ", ")
                )
            }
        })
        .collect();
    left.extend(
        kept.iter()
            .filter(|k| !k.excluded)
            .map(|k| format!("{} kept on {}", k.pod, k.node)),
    );
    left.extend(awaiting.iter().cloned());
    left
}

fn was_started(ev: &ScheduledEvent, spec_status: EventStatus) -> bool {
    // An accepted approval is not proof of a start: the platform may wait
    // for the host's other tenants, and the event may still be cancelled.
    spec_status == EventStatus::Started || ev.started_at().is_some()
}

/// Whether `ev`, as its agents report it now (`spec`: the content of one
/// of its appearances), still waits for its drain lead time at `now`: it
/// has a `NotBefore` later than now plus the lead time of the policy rule
/// it matches, it was not seen `Started`, no approval was decided, and no
/// pass of its own began its drain ([`drain_began`]). Such an event claims
/// no node (see [`release`]).
pub fn waits_for_lead_time(
    ev: &ScheduledEvent,
    spec: &ScheduledEventSpec,
    policy: &Policy,
    now: DateTime<Utc>,
) -> bool {
    let handling = policy.handling(
        &EventType::from(spec.event_type.as_str()),
        &spec.event_source,
        spec.duration_seconds,
    );
    spec.not_before
        .is_some_and(|nb| now < nb - Policy::seconds(handling.drain_lead_time_seconds))
        && !was_started(ev, spec.event_status)
        && !approval_decided(ev)
        && !drain_began(ev)
}

/// Whether a pass of `ev`'s own began its drain in its current appearance:
/// its status records a phase past `Pending`. A hold handed over by another
/// event that ended is not a drain begun.
pub fn drain_began(ev: &ScheduledEvent) -> bool {
    ev.status.as_ref().is_some_and(|s| {
        s.appearance.unwrap_or(1) == ev.spec.appearance
            && s.phase.is_some_and(|p| p != Phase::Pending)
    })
}

/// Whether nothing more will happen to the event in its current appearance:
/// an agent saw it leave IMDS, or the controller ended it (a final phase
/// recorded for this appearance).
pub fn is_over(ev: &ScheduledEvent) -> bool {
    ev.spec.event_status == EventStatus::Completed || final_phase(ev).is_some()
}

/// The final phase recorded for the current appearance, if any.
fn final_phase(ev: &ScheduledEvent) -> Option<Phase> {
    let s = ev.status.as_ref()?;
    if s.appearance.unwrap_or(1) != ev.spec.appearance {
        return None;
    }
    s.phase.filter(|p| p.is_final())
}

/// Whether the controller ends a live event itself (every object
/// reaches a final phase), with the condition's reason and message:
///
/// - `NoNodeLeft`: the event had mapped nodes (recorded in `status.nodes`),
///   none of its `Resources` maps to a node now, and `orphanedAfterSeconds`
///   have passed since it started (or `NotBefore` passed). The VMs were
///   deleted, and with them the agents that could see it end.
/// - `NoAgentUpdate`: no agent has written a report about it for
///   `staleAfterSeconds`, and as long has passed since it started (or
///   `NotBefore`, or its creation).
fn unobserved_end(
    ev: &ScheduledEvent,
    seen: &Observed,
    policy: &Policy,
    now: DateTime<Utc>,
) -> Option<(String, String)> {
    let status = ev.status.as_ref();
    let since = ev
        .started_at()
        .or(ev.spec.not_before.filter(|nb| *nb <= now));
    let had_nodes = status
        .and_then(|s| s.nodes.as_ref())
        .is_some_and(|n| n.iter().any(|n| !n.vm_name.is_empty()));
    let mapped_now = seen.nodes.iter().any(|n| !n.vm_name.is_empty());
    let orphaned = Policy::seconds(policy.orphaned_after_seconds);
    if had_nodes
        && !mapped_now
        && let Some(since) = since.filter(|s| now >= *s + orphaned)
    {
        return Some((
            "NoNodeLeft".into(),
            format!(
                "none of its Resources ({}) maps to a node any more, and it started or reached NotBefore at {}, {}s ago (orphanedAfterSeconds {}): no agent is left to see it leave IMDS",
                named(&ev.spec.resources, NAMED_IN_MESSAGE, ", "),
                since.to_rfc3339(),
                (now - since).num_seconds(),
                policy.orphaned_after_seconds
            ),
        ));
    }
    let stale = Policy::seconds(policy.stale_after_seconds);
    let last = seen.last_report?;
    let reference = since
        .or(ev.spec.not_before)
        .or(status.and_then(|s| s.first_seen))
        .unwrap_or(last);
    if now >= last + stale && now >= reference + stale {
        return Some((
            "NoAgentUpdate".into(),
            format!(
                "no agent has written it since {} and it started (or reached NotBefore, or was created) at {}; staleAfterSeconds is {}: every agent that reported it is gone",
                last.to_rfc3339(),
                reference.to_rfc3339(),
                policy.stale_after_seconds
            ),
        ));
    }
    None
}

/// Whether IMDS accepted an approval of the event (the agent's record).
fn approval_accepted(ev: &ScheduledEvent) -> bool {
    ev.status
        .as_ref()
        .and_then(|s| s.approval.as_ref())
        .and_then(|a| a.result.as_deref())
        .is_some_and(|r| r == crate::agent::approval::ACCEPTED)
}

fn approval_decided(ev: &ScheduledEvent) -> bool {
    ev.status
        .as_ref()
        .and_then(|s| s.approval.as_ref())
        .is_some_and(|a| a.decided_at.is_some())
}

/// The object's name.
pub(crate) fn name_of(ev: &ScheduledEvent) -> String {
    ev.metadata.name.clone().unwrap_or_default()
}

/// Releases `me`'s hold on every node that has it (forewarn undoes only what it did, and a node is released only when its last event is over):
/// the node stays cordoned while another event holds or claims it.
fn release(me: &str, nodes: &[ObservedNode]) -> Vec<NodeWrite> {
    nodes
        .iter()
        .filter(|n| n.holds.iter().any(|h| h == me))
        .map(|n| {
            let mut holds: Vec<String> = n.holds.iter().filter(|h| *h != me).cloned().collect();
            for other in &n.claimed_by {
                if other != me && !holds.contains(other) {
                    holds.push(other.clone());
                }
            }
            NodeWrite::Release {
                node: n.name.clone(),
                uncordon: holds.is_empty() && n.cordoned,
                holds,
            }
        })
        .collect()
}

/// The cordon writes for the mapped nodes (rule 4: a node cordoned by
/// someone else is left so, and nothing is recorded on it). A node that
/// holds the event's cordon but was uncordoned (by hand, during the event)
/// is cordoned again.
fn cordon(me: &str, mapped: &[&ObservedNode]) -> Vec<NodeWrite> {
    let mut writes = Vec::new();
    for n in mapped
        .iter()
        .filter(|n| n.holds.iter().any(|h| h == me) && !n.cordoned)
    {
        writes.push(NodeWrite::Cordon {
            node: n.name.clone(),
            holds: n.holds.clone(),
        });
    }
    for n in mapped.iter().filter(|n| !n.holds.iter().any(|h| h == me)) {
        let mut holds = n.holds.clone();
        holds.push(me.to_string());
        if !n.cordoned {
            writes.push(NodeWrite::Cordon {
                node: n.name.clone(),
                holds,
            });
        } else if !n.holds.is_empty() {
            writes.push(NodeWrite::AddHold {
                node: n.name.clone(),
                holds,
            });
        }
    }
    writes
}

/// Whether a pod still has to leave its node for the node to count as
/// drained: any pod not yet deleted, and a terminating pod until its grace
/// period (plus [`STUCK_TERMINATING_AFTER`]) is over.
pub fn must_leave(pod: &PodInfo, now: DateTime<Utc>) -> bool {
    pod.terminating
        .as_ref()
        .is_none_or(|t| now < t.deadline + STUCK_TERMINATING_AFTER)
}

/// Evictions and kept pods for the mapped nodes (`kubectl drain
/// --ignore-daemonsets --delete-emptydir-data`: DaemonSet and mirror pods
/// are not in `pods` at all; terminating pods are waited for; pods without a
/// controller are kept unless the policy evicts them for this event type).
/// The pods the policy's `excludePods` names (`excluded`) are kept too.
fn plan_evictions(
    mapped: &[&ObservedNode],
    budget: Option<i64>,
    floor: i64,
    evict_unmanaged: bool,
) -> (Vec<Eviction>, Vec<Kept>) {
    let mut evictions = Vec::new();
    let mut kept = Vec::new();
    for n in mapped {
        for pod in n.pods.iter().filter(|p| p.terminating.is_none()) {
            if !pod.managed && !evict_unmanaged {
                kept.push(Kept {
                    node: n.name.clone(),
                    pod: pod.key(),
                    reason: "no controller: nothing would recreate it (the policy's evictUnmanagedPods does not name this event type)".into(),
                    excluded: false,
                });
                continue;
            }
            evictions.push(Eviction {
                node: n.name.clone(),
                grace_seconds: eviction_grace(pod.grace_seconds, budget, floor),
                pod: Arc::clone(pod),
            });
        }
        kept.extend(n.excluded.iter().map(|(pod, why)| Kept {
            node: n.name.clone(),
            pod: pod.key(),
            reason: format!("excluded from eviction: {why}"),
            excluded: true,
        }));
    }
    (evictions, kept)
}

/// Whether a mapped node is drained: cordoned when it was read, and, in
/// the pod list taken after that, no pod left that must leave it. A node
/// cordoned in this very pass is not drained yet (its pods were listed
/// before the cordon, and a pod may have been scheduled since), nor is a
/// node someone uncordoned during the event.
///
/// In a dry run (`dry_run`), where nothing is ever cordoned, a node counts
/// as cordoned as it would be.
pub fn node_drained(n: &ObservedNode, dry_run: bool, now: DateTime<Utc>) -> bool {
    (n.cordoned || dry_run) && !n.pods.iter().any(|p| must_leave(p, now))
}

/// Whether the event's `NotBefore` had come by `at` (the platform starts an
/// event at `NotBefore` at the latest).
pub fn not_before_passed(ev: &ScheduledEvent, at: DateTime<Utc>) -> bool {
    ev.spec.not_before.is_some_and(|nb| nb <= at)
}

/// The plan of an event that left IMDS (rules 5 and 8): release what it
/// held, and delete the object once its retention is over.
fn plan_finished(
    p: &mut Plan,
    ev: &ScheduledEvent,
    seen: &Observed,
    policy: &Policy,
    now: DateTime<Utc>,
    started: bool,
) {
    let me = name_of(ev);
    let finished = ev
        .status
        .as_ref()
        .and_then(|s| s.finished_at)
        .unwrap_or(now);
    // After an accepted approval the platform may start the event at once,
    // and past `NotBefore` it starts it whether or not anyone approved: one
    // that then leaves IMDS unseen (an outage, IMDS throttling the agents,
    // a fast run) most likely ran: it is recorded as completed
    // (unobserved), not cancelled. A final phase once recorded for this
    // appearance stays.
    let ran = started || approval_accepted(ev) || not_before_passed(ev, finished);
    p.phase = final_phase(ev).unwrap_or(if ran {
        Phase::Completed
    } else {
        Phase::Cancelled
    });
    let release_at = finished
        + chrono::Duration::seconds(i64::try_from(policy.release_delay_seconds).unwrap_or(3600));
    let writes = release(&me, &seen.nodes);
    if !writes.is_empty() && now < release_at {
        // Give an event that follows on the same nodes time to claim them.
        p.requeue = (release_at - now)
            .to_std()
            .unwrap_or(Duration::from_secs(1));
        return;
    }
    p.node_writes = writes;
    let expires = policy.expiry(finished);
    p.delete = p.node_writes.is_empty() && now >= expires;
    p.requeue = if p.node_writes.is_empty() {
        (expires - now)
            .to_std()
            .unwrap_or(Duration::from_secs(1))
            .clamp(Duration::from_secs(1), Duration::from_secs(3600))
    } else {
        Duration::from_secs(1)
    };
}

/// How often an event that ended is looked at while one of its nodes may
/// yet be tainted out of service ([`out_of_service::may_yet_taint`]).
const OUT_OF_SERVICE_POLL: Duration = Duration::from_secs(15);

/// How long after an event ended its nodes are looked at every
/// [`OUT_OF_SERVICE_POLL`] for the out-of-service taint: well past the node
/// lifecycle controller's grace period. Later passes (the retention's)
/// still taint a node found not Ready.
const OUT_OF_SERVICE_WATCH: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// The out-of-service taint of an event that is over (the policy's
/// `outOfServiceTaint`): a `Terminate` or `Preempt` that ran (phase
/// `Completed`, not `Cancelled`; recorded by an action other than
/// `Ignore`) has each recorded node that is not Ready tainted
/// ([`out_of_service::to_taint`]), at most once per node; the object is
/// not deleted in the pass that taints. While a node of it is still
/// Ready, within [`OUT_OF_SERVICE_WATCH`] of the end, the plan looks again
/// every [`OUT_OF_SERVICE_POLL`].
fn plan_out_of_service(
    p: &mut Plan,
    ev: &ScheduledEvent,
    seen: &Observed,
    policy: &Policy,
    now: DateTime<Utc>,
) {
    let event_type = EventType::from(ev.spec.event_type.as_str());
    let ran = p.phase == Phase::Completed && p.action != Action::Ignore;
    let recorded = ev.status.as_ref().and_then(|s| s.nodes.as_deref());
    let done = |name: &str| {
        recorded
            .into_iter()
            .flatten()
            .any(|r| r.name == name && r.out_of_service_at.is_some())
    };
    let enabled = policy.out_of_service_taint;
    p.out_of_service = out_of_service::to_taint(enabled, &event_type, ran, &seen.recorded, done);
    if !p.out_of_service.is_empty() {
        p.delete = false;
        p.requeue = p.requeue.min(Duration::from_secs(1));
    }
    let ended = ev
        .status
        .as_ref()
        .and_then(|s| s.finished_at)
        .unwrap_or(now);
    if now < ended + OUT_OF_SERVICE_WATCH
        && out_of_service::may_yet_taint(enabled, &event_type, ran, &seen.recorded, done)
    {
        p.requeue = p.requeue.min(OUT_OF_SERVICE_POLL);
    }
}

/// What [`plan`] knows of the event before it chooses a branch.
struct Known {
    /// The object's name (what holds on nodes name).
    me: String,
    /// `spec.eventStatus`.
    spec_status: EventStatus,
    /// Seen `Started` now or before.
    started: bool,
    /// IMDS accepted an approval (a sender's word).
    accepted: bool,
    /// An approval was decided.
    decided: bool,
    /// The drain lead time of the matching rule, or of the policy, seconds.
    lead_time_seconds: u64,
    /// The deadline policy of the matching rule, or of the policy.
    on_deadline: DeadlineAction,
}

/// Plans the next step for `ev` (docs/policy.md), in
/// order: an event that is over releases its nodes ([`plan_finished`]); one
/// no agent can see end any more is ended ([`unobserved_end`]); either
/// taints out of service the nodes its end left not Ready, when the policy
/// asks ([`plan_out_of_service`]); else the
/// policy's action decides: [`plan_ignored`], [`plan_approve_only`] or
/// [`plan_drain`] (cordon, drain, approval).
pub fn plan(ev: &ScheduledEvent, seen: &Observed, policy: &Policy, now: DateTime<Utc>) -> Plan {
    let spec_status = ev.spec.event_status;
    let event_type = EventType::from(ev.spec.event_type.as_str());
    let handling = policy.handling(&event_type, &ev.spec.event_source, ev.spec.duration_seconds);
    let action = handling.action;
    let known = Known {
        me: name_of(ev),
        spec_status,
        started: was_started(ev, spec_status),
        accepted: approval_accepted(ev),
        decided: approval_decided(ev),
        lead_time_seconds: handling.drain_lead_time_seconds,
        on_deadline: handling.on_deadline,
    };
    let deadline = ev.spec.not_before.map(|nb| {
        nb - chrono::Duration::seconds(
            i64::try_from(policy.drain_margin_seconds).unwrap_or(i64::MAX / 2),
        )
    });

    let mut p = Plan {
        action,
        phase: Phase::Pending,
        node_writes: Vec::new(),
        evictions: Vec::new(),
        kept: Vec::new(),
        deadline,
        decide_approval: None,
        decided_undrained: None,
        revoke_approval: None,
        approval_withheld: None,
        approval_pending: None,
        drain_starts_at: None,
        approved_incomplete: None,
        held_incomplete: None,
        due: None,
        ended_unobserved: None,
        out_of_service: Vec::new(),
        delete: false,
        requeue: Duration::from_secs(5),
        polls_progress: false,
        acknowledgement: None,
        manual: None,
    };

    // Every node of the event outside the policy's nodeSelector: recorded
    // as ignored, whatever the rule says, also once it is over.
    let unmanaged = all_unmanaged(ev, seen);
    if unmanaged {
        p.action = Action::Ignore;
    }
    if is_over(ev) {
        plan_finished(&mut p, ev, seen, policy, now, known.started);
        plan_out_of_service(&mut p, ev, seen, policy, now);
        apply_manual(&mut p, &known, ev, seen, false);
        return p;
    }
    if let Some(end) = unobserved_end(ev, seen, policy, now) {
        // Past NotBefore the platform starts the event whether or not anyone
        // approved it: taken as run. Before, it cannot have run.
        let ran = known.started || known.accepted || not_before_passed(ev, now);
        p.ended_unobserved = Some(end);
        plan_finished(&mut p, ev, seen, policy, now, ran);
        plan_out_of_service(&mut p, ev, seen, policy, now);
        apply_manual(&mut p, &known, ev, seen, false);
        return p;
    }
    if unmanaged {
        plan_ignored(&mut p, &known, seen);
        // Node changes wake no pass: look again soon, for a node labelled
        // into the selector meanwhile.
        p.requeue = UNMANAGED_POLL;
        return p;
    }
    match action {
        Action::Ignore => plan_ignored(&mut p, &known, seen),
        Action::Approve => plan_approve_only(&mut p, &known, ev, seen, policy, now),
        Action::Cordon | Action::Drain | Action::DrainAndApprove => {
            plan_drain(&mut p, &known, ev, seen, policy, &event_type, now);
        }
    }
    apply_manual(&mut p, &known, ev, seen, true);
    revoke_on_doubt(&mut p, &known, seen);
    p
}

/// Rule 2 holds after the decision too: an approval decided while nothing
/// was in doubt is taken back when a doubt (a node of unknown VM, a node
/// without a trusted report) or a disagreement appears before IMDS
/// accepted it and before the event started, unless it is decided again in
/// this very pass (a person's approve-now).
fn revoke_on_doubt(p: &mut Plan, known: &Known, seen: &Observed) {
    let in_doubt = !seen.disagreement.is_empty() || !seen.doubts.is_empty();
    if !known.decided || known.accepted || known.started || !in_doubt || p.decide_approval.is_some()
    {
        return;
    }
    let why = if seen.disagreement.is_empty() {
        named(&seen.doubts, NAMED_IN_MESSAGE, "; ")
    } else {
        disagreement_message(seen)
    };
    p.revoke_approval = Some(why.clone());
    p.approval_pending = None;
    p.approval_withheld = Some(format!("the approval decided before is taken back: {why}"));
}

/// An operator's hold or approve-now annotation ([`manual::read`]): on a
/// `live` event a hold takes back the approval this pass would decide and
/// an approve-now decides it; on one that is over it is only recorded
/// (the status keeps saying it was held).
fn apply_manual(p: &mut Plan, known: &Known, ev: &ScheduledEvent, seen: &Observed, live: bool) {
    let in_doubt = !seen.disagreement.is_empty() || !seen.doubts.is_empty();
    let deciding = p.decide_approval.is_some();
    let decided = known.decided || !live;
    let Some((o, effect)) = manual::read(ev, decided, known.started, in_doubt, deciding) else {
        return;
    };
    let effect = if live {
        effect
    } else {
        manual::Effect::Nothing
    };
    match effect {
        manual::Effect::Nothing => {}
        manual::Effect::Withhold => {
            p.decide_approval = None;
            p.decided_undrained = None;
            p.approved_incomplete = None;
        }
        manual::Effect::Decide(reason) => {
            if p.decide_approval.is_none() || p.decided_undrained.is_some() {
                p.decided_undrained = Some("approved by hand".into());
            }
            p.decide_approval = Some(reason);
            p.approval_withheld = None;
            p.approved_incomplete = None;
        }
    }
    p.manual = Some(o);
}

/// `Ignore`: record only; release whatever the event held.
fn plan_ignored(p: &mut Plan, known: &Known, seen: &Observed) {
    p.phase = Phase::Ignored;
    p.node_writes = release(&known.me, &seen.nodes);
    p.requeue = Duration::from_secs(300);
}

/// Whether every node the event maps to is outside the policy's
/// `nodeSelector`: some are, none is managed (mapped, awaiting a trusted
/// report, handled now or recorded before: a node released once its part
/// ended still counts). Such an event is
/// recorded and left alone, as `Ignore` would (no cordon, no drain, no
/// approval: the platform starts it at `NotBefore`); whatever it held is
/// released (a node whose labels changed during the event).
pub fn all_unmanaged(ev: &ScheduledEvent, seen: &Observed) -> bool {
    let recorded = ev
        .status
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .is_some_and(|nodes| nodes.iter().any(|n| !n.vm_name.is_empty()));
    !seen.unmanaged.is_empty()
        && !seen.any_managed
        && !recorded
        && seen.unconfirmed.is_empty()
        && seen.nodes.iter().all(|n| n.vm_name.is_empty())
}

/// `Approve`: decide the approval at once (rule 2 still holds: every VM
/// named in the cluster, no doubt, no disagreement), cordon nothing.
fn plan_approve_only(
    p: &mut Plan,
    known: &Known,
    ev: &ScheduledEvent,
    seen: &Observed,
    policy: &Policy,
    now: DateTime<Utc>,
) {
    let ack = acknowledgement(p, ev, seen, policy, now);
    let awaiting = awaited(ev, ack.as_ref(), p.deadline);
    if !known.decided && known.spec_status == EventStatus::Scheduled {
        let gate = approval_gate(&awaiting, p.deadline, known.on_deadline, now);
        if !seen.disagreement.is_empty() {
            p.approval_withheld = Some(disagreement_message(seen));
        } else if !seen.doubts.is_empty() {
            p.approval_withheld = Some(named(&seen.doubts, NAMED_IN_MESSAGE, "; "));
        } else if !seen.unmapped.is_empty() && !policy.approve_foreign_vms {
            p.approval_withheld = Some(foreign_message(&seen.unmapped));
        } else {
            match gate {
                Gate::Open => {
                    p.decide_approval = Some(format!(
                        "policy approves {} {} events (DurationInSeconds {}) at once",
                        ev.spec.event_source, ev.spec.event_type, ev.spec.duration_seconds
                    ));
                    p.decided_undrained = Some("the policy approves it without a drain".into());
                }
                Gate::AtDeadline => approve_at_deadline(p, &awaiting),
                Gate::Wait => {
                    p.approval_withheld = Some(waiting_message(&awaiting, p.deadline, known, now));
                    note_held(p, &awaiting, now);
                    note_deadline(p, now);
                }
            }
        }
    }
    hold_for_workloads(p, ack);
    p.phase = if known.started {
        Phase::Started
    } else if known.accepted {
        Phase::Approved
    } else {
        Phase::Pending
    };
    note_pending_approval(p, known, ev, seen);
    p.node_writes = release(&known.me, &seen.nodes);
    p.requeue = Duration::from_secs(10);
    requeue_for_workloads(p, now);
}

/// The wait for the pods that take part at `now`: none in a dry run (it
/// writes no notice), nor for an action that neither approves nor evicts
/// (`Cordon`; `Drain` without `evictAfterAcknowledgement`), where nothing
/// would wait.
fn acknowledgement(
    p: &Plan,
    ev: &ScheduledEvent,
    seen: &Observed,
    policy: &Policy,
    now: DateTime<Utc>,
) -> Option<AckState> {
    let approves = matches!(p.action, Action::Approve | Action::DrainAndApprove);
    let evicts = p.action.drains() && policy.evict_after_acknowledgement;
    if seen.dry_run || !(approves || evicts) {
        return None;
    }
    acknowledge::assess(ev, seen, policy, p.deadline, now)
}

/// What the approval still waits for from the pods that take part, one
/// line each (`shop/db-0 has not acknowledged`, `notice to shop/web-1 not
/// stored`), for [`approval_gate`]: everything missing while the wait goes
/// on, and still at the drain deadline when the wait ended there (rather
/// than at the acknowledgement timeout, after which the approval goes on
/// without them), so that `onDeadline` decides: `Hold` never approves,
/// `Approve` lists them in `DrainIncomplete`.
///
/// Once the wait timed out at the drain deadline, the pods the status
/// recorded as not answering stay awaited, though evicted since (an
/// evicted pod no longer takes part): under `Hold` a workload that never
/// said it was prepared is never approved for.
fn awaited(
    ev: &ScheduledEvent,
    ack: Option<&AckState>,
    drain_deadline: Option<DateTime<Utc>>,
) -> Vec<String> {
    let recorded = ev
        .status
        .as_ref()
        .and_then(|s| s.acknowledgements.as_ref())
        .filter(|r| {
            r.timed_out_at.is_some()
                && r.deadline
                    .zip(drain_deadline)
                    .is_some_and(|(end, d)| end >= d)
        });
    if let Some(r) = recorded.filter(|r| !r.pending.is_empty()) {
        return r
            .pending
            .iter()
            .map(|k| format!("{k} has not acknowledged"))
            .collect();
    }
    let Some(a) = ack else {
        return Vec::new();
    };
    let ended_at_drain_deadline = drain_deadline.is_some_and(|d| a.deadline >= d);
    if !(a.waiting || (a.timed_out && ended_at_drain_deadline)) {
        return Vec::new();
    }
    let mut left: Vec<String> = a
        .pending
        .iter()
        .map(|k| format!("{k} has not acknowledged"))
        .collect();
    left.extend(
        a.undelivered
            .iter()
            .filter(|k| !a.pending.contains(k))
            .map(|k| format!("notice to {k} not stored")),
    );
    left
}

/// While forewarn waits for the pods that take part (a notice not stored,
/// an acknowledgement missing, before the acknowledgement deadline), the
/// approval is not decided; the wait is recorded in the plan.
fn hold_for_workloads(p: &mut Plan, ack: Option<AckState>) {
    if ack.as_ref().is_some_and(|a| a.waiting) {
        p.decide_approval = None;
    }
    p.acknowledgement = ack;
}

/// How soon to look again while forewarn waits for the pods that take
/// part: soon while a notice written in this pass is not yet seen stored,
/// else at the deadline (an acknowledgement wakes the event at once: see
/// [`crate::controller::observe::pods`]).
fn requeue_for_workloads(p: &mut Plan, now: DateTime<Utc>) {
    let Some(a) = p.acknowledgement.as_ref().filter(|a| a.waiting) else {
        return;
    };
    let until_deadline = (a.deadline - now)
        .to_std()
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_millis(100));
    let wait = if a.undelivered.is_empty() {
        until_deadline
    } else {
        until_deadline.min(NOTICE_POLL)
    };
    p.requeue = p.requeue.min(wait);
}

/// How soon a pass that wrote notices looks again for them in the cache.
const NOTICE_POLL: Duration = Duration::from_millis(500);

/// A decided approval IMDS has not accepted yet: why it waits.
fn note_pending_approval(p: &mut Plan, known: &Known, ev: &ScheduledEvent, seen: &Observed) {
    if !known.started && !known.accepted && (known.decided || p.decide_approval.is_some()) {
        p.approval_pending = Some(approval_pending(ev, seen));
    }
}

/// `Cordon`, `Drain`, `DrainAndApprove`: wait for the drain lead time, then
/// cordon the mapped nodes, release the strays, evict, decide the approval
/// once every mapped node is drained, and release nodes whose own part
/// ended after the release delay.
fn plan_drain(
    p: &mut Plan,
    known: &Known,
    ev: &ScheduledEvent,
    seen: &Observed,
    policy: &Policy,
    event_type: &EventType,
    now: DateTime<Utc>,
) {
    let me = &known.me;
    let action = p.action;
    let mapped: Vec<&ObservedNode> = seen
        .nodes
        .iter()
        .filter(|n| !n.vm_name.is_empty() && !n.ended)
        .collect();
    // Nodes that hold a cordon for the event but no longer map to it.
    let stray: Vec<ObservedNode> = seen
        .nodes
        .iter()
        .filter(|n| n.vm_name.is_empty())
        .cloned()
        .collect();
    if wait_for_lead_time(p, known, ev, &mapped, &stray, now) {
        return;
    }
    p.node_writes = cordon(me, &mapped);
    p.node_writes.extend(release(me, &stray));
    let ack = acknowledgement(p, ev, seen, policy, now);
    if action.drains() {
        plan_drain_evictions(p, &mapped, ack.as_ref(), policy, event_type, now);
    }

    let all_drained =
        !mapped.is_empty() && mapped.iter().all(|n| node_drained(n, seen.dry_run, now));
    if action == Action::DrainAndApprove
        && known.spec_status == EventStatus::Scheduled
        && !known.decided
    {
        let awaiting = awaited(ev, ack.as_ref(), p.deadline);
        decide_approval(p, known, &mapped, seen, &awaiting, policy, now);
    }
    hold_for_workloads(p, ack);
    note_pending_approval(p, known, ev, seen);
    p.phase = drain_phase(known, action, all_drained, !mapped.is_empty());
    requeue_drain(p, ev, seen, policy, all_drained, now);
}

/// The drain lead time: an event announced long ahead (a predicted
/// failure) is not drained until `NotBefore` minus the lead time. Before
/// then, while the event has not started, no approval is decided and no
/// `mapped` node holds the cordon for it (once begun, a drain goes on),
/// the plan only waits: `Pending`, with when the drain starts, the
/// `stray` nodes released, and a look again at the start (between 1 and
/// 300 seconds from `now`). Returns whether it waits.
fn wait_for_lead_time(
    p: &mut Plan,
    known: &Known,
    ev: &ScheduledEvent,
    mapped: &[&ObservedNode],
    stray: &[ObservedNode],
    now: DateTime<Utc>,
) -> bool {
    let me = &known.me;
    // Once begun by its own passes, a drain goes on (a policy reload that
    // lengthens the lead time stops none); a hold handed over before the
    // lead time is let go.
    let holding = mapped.iter().any(|n| n.holds.contains(me)) && drain_began(ev);
    let Some(start) = ev
        .spec
        .not_before
        .map(|nb| nb - Policy::seconds(known.lead_time_seconds))
        .filter(|start| now < *start && !known.started && !known.decided && !holding)
    else {
        return false;
    };
    p.drain_starts_at = Some(start);
    p.phase = Phase::Pending;
    let handed: Vec<ObservedNode> = mapped
        .iter()
        .filter(|n| n.holds.contains(me))
        .map(|n| (*n).clone())
        .collect();
    p.node_writes = release(me, stray);
    p.node_writes.extend(release(me, &handed));
    p.requeue = (start - now)
        .to_std()
        .unwrap_or(Duration::from_secs(1))
        .clamp(Duration::from_secs(1), Duration::from_secs(300));
    true
}

/// The evictions of a draining action: the pods of the `mapped` nodes,
/// their grace periods clipped to the drain deadline and floored at the
/// policy's `minGraceSeconds`, pods without a controller kept unless the
/// policy evicts them for `event_type`. A pod that asked to be waited for
/// leaves once it acknowledged (or the wait `ack` is over), by the
/// policy's `evictAfterAcknowledgement`.
fn plan_drain_evictions(
    p: &mut Plan,
    mapped: &[&ObservedNode],
    ack: Option<&AckState>,
    policy: &Policy,
    event_type: &EventType,
    now: DateTime<Utc>,
) {
    let (mut evictions, kept) = plan_evictions(
        mapped,
        drain_budget(p.deadline, now),
        policy.min_grace_seconds,
        policy.evicts_unmanaged(event_type),
    );
    if let Some(a) = ack.filter(|a| a.waiting && policy.evict_after_acknowledgement) {
        evictions.retain(|e| !a.pending_uids.contains(&e.pod.uid));
    }
    p.evictions = evictions;
    p.kept = kept;
}

/// The phase of a drain in progress. `Approved` means IMDS accepted the
/// approval; a decided approval that no agent has sent yet keeps the
/// phase where the drain is: `Drained` once every mapped node is
/// (`all_drained`), `Draining` while some node is mapped (`any_mapped`),
/// else `Pending`. `Started` comes first, whatever the drain.
fn drain_phase(known: &Known, action: Action, all_drained: bool, any_mapped: bool) -> Phase {
    if known.started {
        Phase::Started
    } else if known.accepted {
        Phase::Approved
    } else if action.drains() && all_drained {
        Phase::Drained
    } else if action.drains() && any_mapped {
        Phase::Draining
    } else {
        Phase::Pending
    }
}

/// When to look again at a drain in `p.phase`: every [`DRAIN_POLL`] while
/// pods leave (`Draining`, or `Started` with nodes not `all_drained`),
/// else 10 seconds once `Started`, else 5; sooner for a node due for
/// release ([`release_ended`], whose releases it adds to the plan), a
/// cordon written in this pass ([`AFTER_CORDON`]), something falling due
/// (`p.due`) or the pods that take part ([`requeue_for_workloads`]).
/// Sets `p.polls_progress` when the poll for progress decides.
fn requeue_drain(
    p: &mut Plan,
    ev: &ScheduledEvent,
    seen: &Observed,
    policy: &Policy,
    all_drained: bool,
    now: DateTime<Utc>,
) {
    let poll = match p.phase {
        Phase::Draining => Some(DRAIN_POLL),
        Phase::Started if p.action.drains() && !all_drained => Some(DRAIN_POLL),
        _ => None,
    };
    p.requeue = match p.phase {
        Phase::Started if poll.is_none() => Duration::from_secs(10),
        _ => poll.unwrap_or(Duration::from_secs(5)),
    };
    if let Some(wait) = release_ended(p, ev, seen, policy, now) {
        p.requeue = p.requeue.min(wait);
    }
    // A node cordoned in this pass counts as drained only on a pod list
    // taken after the cordon: look again soon.
    if p.node_writes
        .iter()
        .any(|w| matches!(w, NodeWrite::Cordon { .. }))
    {
        p.requeue = p.requeue.min(AFTER_CORDON);
    }
    if let Some(due) = p.due {
        p.requeue = p.requeue.min(due);
    }
    requeue_for_workloads(p, now);
    p.polls_progress = poll == Some(p.requeue);
}

/// How often an event none of whose nodes is managed is looked at: a node
/// labelled into the policy's `nodeSelector` is handled within this.
const UNMANAGED_POLL: Duration = Duration::from_secs(10);

/// How often a drain in progress is looked at while pods leave.
const DRAIN_POLL: Duration = Duration::from_secs(2);

/// Releases the nodes whose own part of the live event ended, each
/// `releaseDelaySeconds` after its record's `endedAt` (this pass for one
/// seen ended now), so that an event that comes back on that node, or
/// another that follows on it, finds it still cordoned (rules 4 and 5).
/// Returns how long until the next one is due, if one waits.
fn release_ended(
    p: &mut Plan,
    ev: &ScheduledEvent,
    seen: &Observed,
    policy: &Policy,
    now: DateTime<Utc>,
) -> Option<Duration> {
    let me = name_of(ev);
    let delay = Policy::seconds(policy.release_delay_seconds);
    let recorded = ev.status.as_ref().and_then(|s| s.nodes.as_ref());
    let mut wait: Option<Duration> = None;
    for n in seen.nodes.iter().filter(|n| n.ended) {
        let ended_at = recorded
            .and_then(|r| r.iter().find(|r| r.name == n.name))
            .and_then(|r| r.ended_at)
            .unwrap_or(now);
        let due = ended_at + delay;
        if now >= due {
            p.node_writes.extend(release(&me, std::slice::from_ref(n)));
        } else {
            let left = (due - now).to_std().unwrap_or(Duration::from_secs(1));
            wait = Some(wait.map_or(left, |w| w.min(left)));
        }
    }
    wait
}

/// How soon a pass that cordoned looks again (see [`node_drained`]).
const AFTER_CORDON: Duration = Duration::from_millis(300);

/// Why a decided approval has not been accepted by IMDS yet:
/// `(reason, message)`.
///
/// - `AgentMissing`: a `Terminate` is sent only by the agent of the VM it
///   names (Azure's advice; see `agent::approval`), and a VM it names maps
///   to no node (no node's providerID or agent names it: the agent never
///   ran there, or the node is gone).
/// - `Refused`: an agent sent it and IMDS answered with an error; agents retry.
/// - `AwaitingAgent`: decided, no agent has sent it yet.
fn approval_pending(ev: &ScheduledEvent, seen: &Observed) -> (String, String) {
    let approval = ev.status.as_ref().and_then(|s| s.approval.as_ref());
    if EventType::from(ev.spec.event_type.as_str()) == EventType::Terminate
        && !seen.unmapped.is_empty()
    {
        return (
            "AgentMissing".into(),
            format!(
                "only the agent of the VM a Terminate names may send its approval, and no node's providerID or agent names {}: the approval waits for that VM's agent",
                named(&seen.unmapped, NAMED_IN_MESSAGE, ", ")
            ),
        );
    }
    if let Some(result) = approval.and_then(|a| a.result.as_deref()) {
        return (
            "Refused".into(),
            format!(
                "IMDS answered the approval sent by {}: {result}; the agents try again",
                approval
                    .and_then(|a| a.sent_by.as_deref())
                    .unwrap_or("an agent")
            ),
        );
    }
    (
        "AwaitingAgent".into(),
        "decided; waiting for an agent whose IMDS lists the event Scheduled to send it".into(),
    )
}

fn disagreement_message(seen: &Observed) -> String {
    format!(
        "the agents of the VMs the event names report different events, each node is handled on its own agent's report: {}",
        named(&seen.disagreement, NAMED_IN_MESSAGE, "; ")
    )
}

fn foreign_message(unmapped: &[String]) -> String {
    format!(
        "Resources names VMs that are no node of this cluster: {}",
        named(unmapped, NAMED_IN_MESSAGE, ", ")
    )
}

/// Rule 2: approve only when every affected node is drained and every VM
/// named is a node of this cluster (unless the policy allows foreign VMs),
/// and no acknowledgement is awaited ([`awaited`]); past the
/// drain deadline, `onDeadline: Approve` approves with the drain (or the
/// rest) incomplete ([`approval_gate`]), never against the rest of rule 2.
fn decide_approval(
    p: &mut Plan,
    known: &Known,
    mapped: &[&ObservedNode],
    seen: &Observed,
    awaiting: &[String],
    policy: &Policy,
    now: DateTime<Utc>,
) {
    let all_drained =
        !mapped.is_empty() && mapped.iter().all(|n| node_drained(n, seen.dry_run, now));
    let foreign_ok = seen.unmapped.is_empty() || policy.approve_foreign_vms;
    let left = left_before_approval(mapped, &p.kept, seen, awaiting, now);
    let gate = approval_gate(&left, p.deadline, known.on_deadline, now);
    if !seen.disagreement.is_empty() {
        p.approval_withheld = Some(disagreement_message(seen));
    } else if !seen.doubts.is_empty() {
        p.approval_withheld = Some(named(&seen.doubts, NAMED_IN_MESSAGE, "; "));
    } else if all_drained && foreign_ok && gate == Gate::Open {
        p.decide_approval = Some(format!("all {} affected nodes drained", mapped.len()));
    } else if mapped.is_empty()
        && !seen.unmapped.is_empty()
        && policy.approve_foreign_vms
        && gate == Gate::Open
    {
        p.decide_approval =
            Some("no affected node in this cluster; policy approves foreign VMs".into());
        p.decided_undrained = Some("no VM it names is a node of this cluster".into());
    } else if all_drained && !foreign_ok {
        p.approval_withheld = Some(foreign_message(&seen.unmapped));
    } else if mapped.is_empty() && !(foreign_ok && gate == Gate::AtDeadline) {
        p.approval_withheld = Some(format!(
            "no entry of Resources maps to a node of this cluster: {}",
            named(&seen.unmapped, NAMED_IN_MESSAGE, ", ")
        ));
    } else if gate == Gate::AtDeadline && foreign_ok {
        approve_at_deadline(p, &left);
    } else if p.kept.iter().any(|k| !k.excluded) {
        p.approval_withheld = Some(format!(
            "pods without a controller stay on their nodes, so the drain cannot finish: {}",
            named(
                &p.kept
                    .iter()
                    .filter(|k| !k.excluded)
                    .map(|k| k.pod.as_str())
                    .collect::<Vec<_>>(),
                NAMED_IN_MESSAGE,
                ", "
            )
        ));
        note_deadline(p, now);
    } else {
        // Draining (the foreign VMs, if any, are named once it is done),
        // or drained with something else awaited.
        if foreign_ok
            && (p.deadline.is_some_and(|d| now >= d) || (all_drained && !awaiting.is_empty()))
        {
            p.approval_withheld = Some(waiting_message(&left, p.deadline, known, now));
            note_held(p, &left, now);
        }
        note_deadline(p, now);
    }
}

/// Decides the approval at the drain deadline with `left` not done
/// (`onDeadline: Approve`).
fn approve_at_deadline(p: &mut Plan, left: &[String]) {
    let what = named(left, NAMED_IN_MESSAGE, "; ");
    p.decide_approval = Some(format!(
        "the drain deadline passed and the policy's onDeadline is Approve; left: {what}"
    ));
    p.decided_undrained = Some("the drain deadline passed under onDeadline: Approve".into());
    p.approved_incomplete = Some(what);
}

/// Past the drain deadline with `left` not done, under `onDeadline:
/// Hold` (the caller's gate waits): recorded for `DrainIncomplete`.
fn note_held(p: &mut Plan, left: &[String], now: DateTime<Utc>) {
    if p.deadline.is_some_and(|d| now >= d) && !left.is_empty() {
        p.held_incomplete = Some(named(left, NAMED_IN_MESSAGE, "; "));
    }
}

/// While the approval waits: look again at the drain deadline, where
/// `onDeadline` decides (`Approve` approves; under `Hold` the record says
/// then, not a blocked drain's backoff later, that it passed).
fn note_deadline(p: &mut Plan, now: DateTime<Utc>) {
    if let Some(d) = p.deadline.filter(|d| *d > now) {
        p.due = Some((d - now).to_std().unwrap_or(Duration::from_secs(1)));
    }
}

/// Why an approval waits for what is `left`: before the deadline, what it
/// waits for and what happens at the deadline; past it under `Hold`, that
/// it is held.
fn waiting_message(
    left: &[String],
    deadline: Option<DateTime<Utc>>,
    known: &Known,
    now: DateTime<Utc>,
) -> String {
    let what = named(left, NAMED_IN_MESSAGE, "; ");
    match deadline {
        Some(d) if now >= d => format!(
            "the drain deadline ({}) passed with {what} left, and the policy's onDeadline is Hold: no approval; the platform starts the event at NotBefore",
            d.to_rfc3339()
        ),
        Some(d) => format!(
            "waiting for {what}; at the drain deadline ({}) the policy's onDeadline is {}",
            d.to_rfc3339(),
            known.on_deadline.as_str()
        ),
        None => format!("waiting for {what}"),
    }
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod selection_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod timing_tests;
