//! What a `ScheduledEvent`'s status says after a reconcile: pure, like
//! [`crate::controller::decide::plan`]. The record stays honest (docs/events.md): a node counts as
//! drained only when it really emptied, and once the event is over its
//! per-node record is frozen as it was, not recomputed from nothing.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use crate::api::{
    Acknowledgements, Approval, Condition, DryRun, EventStatus, NodeProgress, NodesNotListed,
    Phase, PreviousAppearance, ScheduledEvent, ScheduledEventStatus,
};
use crate::controller::decide::acknowledge::AckState;
use crate::controller::decide::manual::{self, Override};
use crate::controller::decide::plan::NodeWrite;
use crate::controller::decide::plan::{EvictionOutcome, Plan, must_leave, name_of};
use crate::controller::observe::observed::{Observed, ObservedNode};
use crate::text::{MESSAGE_LIMIT, NAMED_IN_MESSAGE, cut, listed_at_most, named};

/// One eviction's result: `(node, pod, outcome)`, the pod as
/// `namespace/name` (a node can hold pods of one name in two namespaces).
pub type Outcome = (String, String, EvictionOutcome);

/// Builds conditions, keeping each one's `lastTransitionTime` while its
/// status does not change.
struct Conditions<'a> {
    prev: &'a [Condition],
    out: Vec<Condition>,
    generation: Option<i64>,
    now: DateTime<Utc>,
}

impl Conditions<'_> {
    /// `type_` True with `(reason, message)` while `now` is `Some`; once it
    /// is `None`, False with `cleared` if it was True before, else absent.
    fn set_while(&mut self, type_: &str, now: Option<(&str, String)>, cleared: (&str, &str)) {
        if let Some((reason, message)) = now {
            self.set(type_, true, reason, message);
        } else if self
            .prev
            .iter()
            .any(|x| x.type_ == type_ && x.status == "True")
        {
            self.set(type_, false, cleared.0, cleared.1.into());
        }
    }

    fn set(&mut self, type_: &str, status: bool, reason: &str, message: String) {
        let status = if status { "True" } else { "False" }.to_string();
        let last_transition_time = self
            .prev
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map_or(self.now, |c| c.last_transition_time);
        self.out.retain(|c| c.type_ != type_);
        self.out.push(Condition {
            observed_generation: self.generation,
            type_: type_.into(),
            status,
            reason: reason.into(),
            message: cut(message, MESSAGE_LIMIT),
            last_transition_time,
        });
    }
}

/// What blocks the evictions on `node` this pass, if anything:
/// `(blocked_by text, budgets, pods a budget refused)`, the pods listed at
/// most [`BLOCKED_PODS_LISTED`]. Taken in the order of the pods' names, not
/// of the outcomes (the order in which their answers came): the same
/// refusals give the same record from pass to pass, and an unchanged status
/// writes nothing and asks for no pass.
fn blockers(node: &str, outcomes: &[Outcome]) -> (Option<String>, Vec<String>, Vec<String>) {
    let mut text = None;
    let mut budgets: Vec<String> = Vec::new();
    let mut pods: Vec<String> = Vec::new();
    let mut mine: Vec<&Outcome> = outcomes.iter().filter(|(n, _, _)| n == node).collect();
    mine.sort_by(|a, b| a.1.cmp(&b.1));
    for (n, pod, o) in mine {
        match o {
            EvictionOutcome::Blocked {
                budgets: b,
                message,
            } => {
                if !pods.contains(pod) {
                    pods.push(pod.clone());
                }
                for x in b {
                    if !budgets.contains(x) {
                        budgets.push(x.clone());
                    }
                }
                text.get_or_insert_with(|| {
                    format!("PodDisruptionBudget {}: {message}", b.join(", "))
                });
            }
            EvictionOutcome::Throttled {
                retry_after_seconds,
            } => {
                text.get_or_insert_with(|| {
                    format!("API server throttling (429, Retry-After {retry_after_seconds}s) while evicting {pod} on {n}")
                });
            }
            // Asked or waiting for its backoff, the same failure gives the
            // same record.
            EvictionOutcome::Retry(why) | EvictionOutcome::Waiting(why) => {
                text.get_or_insert_with(|| format!("Eviction of {pod} refused: {why}"));
            }
            _ => {}
        }
    }
    (
        text,
        budgets,
        listed_at_most(&pods, BLOCKED_PODS_LISTED, "pods refused"),
    )
}

/// How many pods refused by a PodDisruptionBudget a node's record names
/// (`blockedPods`); the rest are counted.
pub const BLOCKED_PODS_LISTED: usize = 3;

/// How many terminating pods a node's record names (`waitingFor`); the
/// rest are counted: with every pod of a large drain named, the status
/// would approach etcd's limit on the size of an object.
pub const WAITING_LISTED: usize = 3;

/// The record of one mapped node while the event is live.
#[allow(clippy::too_many_arguments)]
fn live_progress(
    me: &str,
    n: &ObservedNode,
    plan: &Plan,
    written: Option<&NodeWrite>,
    outcomes: &[Outcome],
    before: Option<&NodeProgress>,
    dry_run: bool,
    now: DateTime<Utc>,
) -> NodeProgress {
    let held_now = match written {
        Some(w) => w.holds().iter().any(|h| h == me),
        None => n.holds.iter().any(|h| h == me),
    };
    let remaining = n.pods.iter().filter(|p| must_leave(p, now)).count();
    let (blocked_by, blocking_budgets, blocked_pods) = blockers(&n.name, outcomes);
    let waiting_for: Vec<String> = n
        .pods
        .iter()
        .filter_map(|p| {
            let t = p.terminating.as_ref()?;
            let fin = if t.finalizers.is_empty() {
                String::new()
            } else {
                format!(", finalizers [{}]", t.finalizers.join(", "))
            };
            Some(if must_leave(p, now) {
                format!(
                    "{}: terminating until {}{fin}",
                    p.key(),
                    t.deadline.to_rfc3339()
                )
            } else {
                format!(
                    "{}: stuck terminating past its grace period{}; no longer waited for",
                    p.key(),
                    if fin.is_empty() {
                        " (kubelet unreachable?)".to_string()
                    } else {
                        fin
                    }
                )
            })
        })
        .collect();
    let waiting_for = listed_at_most(&waiting_for, WAITING_LISTED, "pods terminating");
    let drained_now =
        plan.action.drains() && crate::controller::decide::plan::node_drained(n, dry_run, now);
    NodeProgress {
        name: n.name.clone(),
        vm_name: n.vm_name.clone(),
        cordoned_by_us: held_now,
        already_cordoned: n.cordoned && n.holds.is_empty() && !held_now,
        pods_remaining: i32::try_from(remaining).unwrap_or(i32::MAX),
        blocked_by,
        blocking_budgets,
        // Filled in by the report from the writes refused.
        write_refused: None,
        blocked_pods,
        pods_kept: plan
            .kept
            .iter()
            .filter(|k| k.node == n.name)
            .map(|k| format!("{}: {}", k.pod, k.reason))
            .collect(),
        waiting_for,
        ended_at: None,
        deleted_at: None,
        drained_at: if drained_now {
            before.and_then(|b| b.drained_at).or(Some(now))
        } else {
            None
        },
        out_of_service_at: before.and_then(|b| b.out_of_service_at),
        // Carried over and filled in by `impact::record`.
        impact: None,
    }
}

/// The per-node records of a finished (or ignored) event: the last live
/// record of each node, frozen.
fn final_progress(seen: &Observed, prev: &[NodeProgress]) -> Vec<NodeProgress> {
    let mut nodes: Vec<NodeProgress> = prev.to_vec();
    for n in seen.nodes.iter().filter(|n| !n.vm_name.is_empty()) {
        if !nodes.iter().any(|p| p.name == n.name) {
            // Never recorded live (the event ended before we saw it): say
            // what is there now, and do not claim a drain.
            nodes.push(NodeProgress {
                name: n.name.clone(),
                vm_name: n.vm_name.clone(),
                already_cordoned: n.cordoned && n.holds.is_empty(),
                pods_remaining: i32::try_from(n.pods.len()).unwrap_or(i32::MAX),
                ..NodeProgress::default()
            });
        }
    }
    // `cordonedByUs` stays as recorded: the record says what forewarn did,
    // and the release is the node's own (its annotation and cordon).
    nodes
}

/// `ev` as the controller handles it: unchanged, or, when `spec.appearance`
/// went up since the status was written (the `EventId` came back after it
/// left IMDS), with a fresh status that keeps only the history, the earlier
/// appearance's record appended. The second value says whether it started over.
pub fn for_current_appearance(ev: &ScheduledEvent) -> (ScheduledEvent, bool) {
    let Some(old) = ev.status.as_ref() else {
        return (ev.clone(), false);
    };
    let recorded = old.appearance.unwrap_or(1);
    if ev.spec.appearance <= recorded {
        return (ev.clone(), false);
    }
    let mut previous = old.previous_appearances.clone();
    previous.push(PreviousAppearance {
        appearance: recorded,
        phase: old.phase,
        nodes_drained: old.nodes_drained.clone().unwrap_or_default(),
        first_seen: old.first_seen,
        finished_at: old.finished_at,
        approval: old.approval.as_ref().and_then(|a| {
            a.decided_at.map(|d| {
                format!(
                    "decided {}; {}",
                    d.to_rfc3339(),
                    a.result.clone().unwrap_or_else(|| "not sent".into())
                )
            })
        }),
    });
    let over = previous
        .len()
        .saturating_sub(crate::api::MAX_PREVIOUS_APPEARANCES);
    previous.drain(..over);
    let mut fresh = ev.clone();
    fresh.status = Some(ScheduledEventStatus {
        previous_appearances: previous,
        ..ScheduledEventStatus::default()
    });
    (fresh, true)
}

/// How many per-node records `status.nodes` lists; the rest are counted in
/// `status.nodesNotListed`. A record is at most about 580 bytes (three
/// terminating pods named, and a restart recorded with both bootIDs), so
/// 500 stay under 0.3 MB, and with the spec of
/// an event naming 10,000 VMs (about 0.36 MB of names) the object stays
/// under half of etcd's 1.5 MiB limit on a request (the unit test
/// measures it).
pub const NODE_RECORDS_LISTED: usize = 500;

/// How many `unmappedResources` are listed before `and N more VMs`.
pub const UNMAPPED_LISTED: usize = 100;

/// The status after a pass, and the per-node records it does not list.
#[derive(Debug)]
pub struct Next {
    /// The status to write: at most [`NODE_RECORDS_LISTED`] records.
    pub status: ScheduledEventStatus,
    /// The records beyond the bound, counted in `status.nodesNotListed`
    /// (the reporting announces their drains from these).
    pub not_listed: Vec<NodeProgress>,
}

/// The status after `plan` was carried out with `outcomes`: the per-node
/// records ([`node_records`]), the approval ([`approval_record`]), the
/// conditions ([`conditions`]) and the times. Every record, listed or not:
/// see [`next`] for the status as written.
pub fn next_status(
    ev: &ScheduledEvent,
    seen: &Observed,
    plan: &Plan,
    outcomes: &[Outcome],
    now: DateTime<Utc>,
) -> ScheduledEventStatus {
    let Next {
        mut status,
        not_listed,
    } = next(ev, seen, plan, outcomes, now);
    status.nodes.get_or_insert_with(Vec::new).extend(not_listed);
    status.nodes_not_listed = None;
    status
}

/// [`next_status`] as written: the counts and conditions over every
/// record, at most [`NODE_RECORDS_LISTED`] records listed (nodes whose
/// release is pending first, as their `endedAt` times the release; then
/// nodes not yet drained; then the others, in their order), the rest
/// counted in `nodesNotListed`.
pub fn next(
    ev: &ScheduledEvent,
    seen: &Observed,
    plan: &Plan,
    outcomes: &[Outcome],
    now: DateTime<Utc>,
) -> Next {
    let prev = ev.status.clone().unwrap_or_default();
    let finished = plan.phase.is_final() || plan.phase == Phase::Ignored;
    let mut nodes = node_records(ev, seen, plan, outcomes, finished, now);
    // Recorded once the taint is written (a failed write fails the pass
    // before its status is): never in a dry run, which writes no node.
    if !seen.dry_run {
        for n in nodes
            .iter_mut()
            .filter(|n| plan.out_of_service.contains(&n.name))
        {
            n.out_of_service_at = n.out_of_service_at.or(Some(now));
        }
    }
    // A node deleted from the cluster keeps its record, out of the count.
    let deleted: HashSet<&str> = seen.deleted.iter().map(String::as_str).collect();
    for n in nodes
        .iter_mut()
        .filter(|n| deleted.contains(n.name.as_str()))
    {
        n.deleted_at = n.deleted_at.or(Some(now));
    }
    // A finished event's records are frozen: those not listed before stay
    // counted as they were.
    let carried = if finished {
        prev.nodes_not_listed.clone()
    } else {
        None
    };
    let present = nodes.iter().filter(|n| n.deleted_at.is_none());
    let (mut drained, mut total) = present.fold((0, 0), |(d, t), n| {
        (d + usize::from(n.drained_at.is_some()), t + 1)
    });
    if let Some(c) = &carried {
        drained += usize::try_from(c.drained).unwrap_or(0);
        total += usize::try_from(c.count - c.deleted).unwrap_or(0);
    }
    let approval = approval_record(ev, plan, now);
    let acknowledgements = acknowledgement_record(ev, plan, finished, now);
    let conditions = conditions(ev, seen, plan, &nodes, approval.as_ref(), finished, now);
    let spec_started = ev.spec.event_status == EventStatus::Started;
    let releasing: HashSet<&str> = if finished {
        HashSet::new()
    } else {
        seen.nodes
            .iter()
            .filter(|n| n.ended)
            .map(|n| n.name.as_str())
            .collect()
    };
    let not_listed = list_at_most(&mut nodes, &releasing, NODE_RECORDS_LISTED);
    let nodes_not_listed = counted(carried, &not_listed);
    let status = ScheduledEventStatus {
        phase: Some(plan.phase),
        action: Some(plan.action),
        nodes_drained: Some(format!("{drained}/{total}")),
        nodes: Some(nodes),
        nodes_not_listed,
        unmapped_resources: Some(listed_at_most(&seen.unmapped, UNMAPPED_LISTED, "VMs")),
        unmanaged_nodes: (!seen.unmanaged.is_empty())
            .then(|| listed_at_most(&seen.unmanaged, UNMAPPED_LISTED, "nodes")),
        fault_domains: fault_domains(&prev, seen, finished),
        approval,
        acknowledgements,
        first_seen: prev.first_seen.or(Some(now)),
        // Bound to the appearance and content it was seen in: a start
        // built from other content (one agent's report naming other VMs)
        // is dropped once the spec is of this content again.
        started_at: ev.started_at().or_else(|| spec_started.then_some(now)),
        started_in: (ev.started_at().is_some() || spec_started).then(|| ev.spec.started_key()),
        finished_at: if plan.phase.is_final() {
            prev.finished_at.or(Some(now))
        } else {
            None
        },
        conditions: Some(conditions),
        dry_run: prev.dry_run,
        appearance: Some(ev.spec.appearance),
        previous_appearances: prev.previous_appearances,
    };
    Next { status, not_listed }
}

/// `status.faultDomains`: the most fault domains the event's nodes were
/// seen in (a node deleted mid-event still counts), frozen once it is over.
fn fault_domains(prev: &ScheduledEventStatus, seen: &Observed, finished: bool) -> Option<u32> {
    let now = seen.fault_domains.and_then(|n| u32::try_from(n).ok());
    if finished && prev.fault_domains.is_some() {
        return prev.fault_domains;
    }
    prev.fault_domains.max(now)
}

/// Each node's eviction outcomes.
fn by_node(outcomes: &[Outcome]) -> HashMap<&str, Vec<Outcome>> {
    let mut map: HashMap<&str, Vec<Outcome>> = HashMap::new();
    for o in outcomes {
        map.entry(o.0.as_str()).or_default().push(o.clone());
    }
    map
}

/// Keeps at most `limit` of `records` (all of them, in their order, when
/// they fit); returns the others. Beyond the bound the kept are, in order:
/// the nodes in `releasing` (their own part ended, their release pending),
/// the nodes not yet drained, then the rest; each group in its order.
fn list_at_most(
    records: &mut Vec<NodeProgress>,
    releasing: &HashSet<&str>,
    limit: usize,
) -> Vec<NodeProgress> {
    if records.len() <= limit {
        return Vec::new();
    }
    let rank = |n: &NodeProgress| {
        if releasing.contains(n.name.as_str()) {
            0
        } else if n.drained_at.is_none() && n.deleted_at.is_none() {
            1
        } else {
            2
        }
    };
    records.sort_by_key(rank);
    records.split_off(limit)
}

/// The counts of `not_listed`, added to those `carried` from before.
fn counted(carried: Option<NodesNotListed>, not_listed: &[NodeProgress]) -> Option<NodesNotListed> {
    if not_listed.is_empty() {
        return carried;
    }
    let n = |f: &dyn Fn(&NodeProgress) -> bool| {
        i32::try_from(not_listed.iter().filter(|r| f(r)).count()).unwrap_or(i32::MAX)
    };
    let mut c = carried.unwrap_or_default();
    c.count += n(&|_| true);
    c.drained += n(&|r| r.drained_at.is_some() && r.deleted_at.is_none());
    c.cordoned_by_us += n(&|r| r.cordoned_by_us);
    c.deleted += n(&|r| r.deleted_at.is_some());
    Some(c)
}

/// The per-node records: each handled node's live progress; once the
/// event is over (or ignored), the last records, frozen.
fn node_records(
    ev: &ScheduledEvent,
    seen: &Observed,
    plan: &Plan,
    outcomes: &[Outcome],
    finished: bool,
    now: DateTime<Utc>,
) -> Vec<NodeProgress> {
    let me = name_of(ev);
    let prev_nodes: &[NodeProgress] = ev
        .status
        .as_ref()
        .and_then(|s| s.nodes.as_deref())
        .unwrap_or_default();
    if finished {
        return final_progress(seen, prev_nodes);
    }
    let before: HashMap<&str, &NodeProgress> =
        prev_nodes.iter().map(|p| (p.name.as_str(), p)).collect();
    let outcomes_by_node = by_node(outcomes);
    let writes: HashMap<&str, &NodeWrite> =
        plan.node_writes.iter().map(|w| (w.node(), w)).collect();
    let mut live: Vec<NodeProgress> = seen
        .nodes
        .iter()
        .filter(|n| !n.vm_name.is_empty())
        .map(|n| {
            let before = before.get(n.name.as_str()).copied();
            if n.ended {
                // Its part is over: its record stays as it was, with
                // when it ended (the release delay counts from it).
                let mut p = before.cloned().unwrap_or_else(|| NodeProgress {
                    name: n.name.clone(),
                    vm_name: n.vm_name.clone(),
                    cordoned_by_us: true,
                    ..NodeProgress::default()
                });
                p.ended_at = p.ended_at.or(Some(now));
                return p;
            }
            let outcomes = outcomes_by_node
                .get(n.name.as_str())
                .map_or(&[][..], Vec::as_slice);
            let written = writes.get(n.name.as_str()).copied();
            live_progress(&me, n, plan, written, outcomes, before, seen.dry_run, now)
        })
        .collect();
    // A node no longer handled (gone from the cluster with its VM, or
    // released once its own part ended) keeps its last record, frozen:
    // the event did affect it, and that it had nodes is what lets it
    // end once none is left.
    let handled: HashSet<&str> = seen.nodes.iter().map(|n| n.name.as_str()).collect();
    for p in prev_nodes {
        if !p.vm_name.is_empty() && !handled.contains(p.name.as_str()) {
            live.push(p.clone());
        }
    }
    live
}

/// The approval: as recorded (with what its sender reported, copied onto
/// `ev` by the reconcile), or decided now, bound to the appearance and the
/// identity digest of the event it was decided on.
fn approval_record(ev: &ScheduledEvent, plan: &Plan, now: DateTime<Utc>) -> Option<Approval> {
    if plan.revoke_approval.is_some() {
        return None;
    }
    let mut approval = ev.status.as_ref().and_then(|s| s.approval.clone());
    if let Some(reason) = &plan.decide_approval {
        approval = Some(Approval {
            decided_at: Some(now),
            reason: Some(reason.clone()),
            appearance: Some(ev.spec.appearance),
            digest: Some(ev.spec.digest()),
            undrained_allowed: plan.decided_undrained.clone(),
            ..Default::default()
        });
    }
    approval
}

/// How many pods `acknowledgements.pending` names.
pub const ACK_PENDING_LISTED: usize = 10;

/// How many pods `acknowledgements.acknowledgedPods` names.
pub const ACKNOWLEDGED_LISTED: usize = 100;

/// The record of the wait for the pods that take part: as the plan saw it,
/// the pods that acknowledged added to those recorded (an acknowledged pod
/// evicted since still counts). Kept as it was while the plan has none
/// (the drain lead time), and frozen once the wait is over: it timed out
/// (the pods that did not answer stay named, though evicted since), the
/// approval was decided, or the event is no longer `Scheduled`.
fn acknowledgement_record(
    ev: &ScheduledEvent,
    plan: &Plan,
    finished: bool,
    now: DateTime<Utc>,
) -> Option<Acknowledgements> {
    let prev = ev.status.as_ref().and_then(|s| s.acknowledgements.clone());
    let decided = ev
        .status
        .as_ref()
        .and_then(|s| s.approval.as_ref())
        .is_some_and(|a| a.decided_at.is_some());
    let over = prev.as_ref().is_some_and(|p| {
        p.timed_out_at.is_some() || decided || ev.spec.event_status != EventStatus::Scheduled
    });
    let a = match (&plan.acknowledgement, finished || over) {
        (Some(a), false) => a,
        _ => return prev,
    };
    let before = prev.unwrap_or_default();
    let mut acked = before.acknowledged_pods.clone();
    for k in &a.acknowledged {
        if !acked.contains(k) {
            acked.push(k.clone());
        }
    }
    acked.sort();
    let count = usize::try_from(before.acknowledged_count)
        .unwrap_or(0)
        .max(acked.len());
    acked.truncate(ACKNOWLEDGED_LISTED);
    let asked = count + a.pending.len();
    let to_i32 = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    Some(Acknowledgements {
        acknowledged: if asked > 0 {
            Some(format!("{count}/{asked}"))
        } else {
            before.acknowledged
        },
        notified: if a.participants > 0 || before.notified.is_empty() {
            format!("{}/{}", a.notified, a.participants)
        } else {
            before.notified
        },
        since: Some(a.since),
        deadline: Some(a.deadline),
        pending: listed_at_most(&a.pending, ACK_PENDING_LISTED, "pods"),
        pending_count: to_i32(a.pending.len()),
        acknowledged_pods: acked,
        acknowledged_count: to_i32(count),
        timed_out_at: before.timed_out_at.or_else(|| a.timed_out.then_some(now)),
    })
}

/// `AcknowledgementPending`: `True` while the approval waits for the pods
/// that take part; once it no longer does, `False` with `Acknowledged`,
/// `TimedOut` or `NotAwaited` (the event started first).
fn acknowledgement_condition(c: &mut Conditions<'_>, ev: &ScheduledEvent, plan: &Plan) {
    let Some(a) = &plan.acknowledgement else {
        return;
    };
    if a.waiting {
        acknowledgement_awaited(c, ev, a);
        return;
    }
    let was = c
        .prev
        .iter()
        .find(|x| x.type_ == "AcknowledgementPending")
        .cloned();
    let (reason, message) = acknowledgement_over(a);
    // Once the wait is over, its account stays (the pods that acknowledged
    // may be evicted since).
    match was {
        Some(w) if w.status == "False" => c.out.push(w),
        Some(_) => c.set("AcknowledgementPending", false, reason, message),
        None if a.asked > 0 || a.timed_out => {
            c.set("AcknowledgementPending", false, reason, message);
        }
        None => {}
    }
}

/// `AcknowledgementPending` `True` while the wait `a` goes on, until its
/// deadline: `AwaitingPods` naming the pods yet to acknowledge (with the
/// annotation `ack.forewarn.dev/<event>: <EventId>` they write) and the
/// notices not stored yet, or `NoticePending` when only notices are
/// missing.
fn acknowledgement_awaited(c: &mut Conditions<'_>, ev: &ScheduledEvent, a: &AckState) {
    let name = name_of(ev);
    let until = a.deadline.to_rfc3339();
    let mut parts = Vec::new();
    if !a.pending.is_empty() {
        parts.push(format!(
            "{} to acknowledge (annotation ack.forewarn.dev/{name}: {})",
            named(&a.pending, NAMED_IN_MESSAGE, ", "),
            ev.spec.event_id
        ));
    }
    if !a.undelivered.is_empty() {
        parts.push(format!(
            "the notice of {} to be stored",
            named(&a.undelivered, NAMED_IN_MESSAGE, ", ")
        ));
    }
    let reason = if a.pending.is_empty() {
        "NoticePending"
    } else {
        "AwaitingPods"
    };
    c.set(
        "AcknowledgementPending",
        true,
        reason,
        format!(
            "forewarn waits (the approval, and by evictAfterAcknowledgement the eviction of the pods that asked) until {until} for {}",
            parts.join(" and ")
        ),
    );
}

/// How the wait `a`, no longer going on, ended, as `(reason, message)` of
/// `AcknowledgementPending` `False`: `TimedOut` (its deadline passed,
/// naming the pods that did not answer), `Acknowledged` (every pod that
/// asked did), `Notified` (every notice stored, no pod asked) or
/// `NotAwaited` (the event is no longer `Scheduled`).
fn acknowledgement_over(a: &AckState) -> (&'static str, String) {
    let until = a.deadline.to_rfc3339();
    if a.timed_out {
        let left: Vec<String> = a.pending.iter().chain(&a.undelivered).cloned().collect();
        (
            "TimedOut",
            format!(
                "the acknowledgement deadline {until} passed; forewarn went on without {}",
                named(&left, NAMED_IN_MESSAGE, ", ")
            ),
        )
    } else if a.asked > 0 && a.pending.is_empty() {
        (
            "Acknowledged",
            format!(
                "every pod that asked to be waited for acknowledged: {}",
                named(&a.acknowledged, NAMED_IN_MESSAGE, ", ")
            ),
        )
    } else if a.pending.is_empty() && a.undelivered.is_empty() {
        (
            "Notified",
            "every pod that takes part holds its notice; none asked to be waited for".into(),
        )
    } else {
        (
            "NotAwaited",
            "the event is no longer Scheduled: nothing waits for acknowledgements".into(),
        )
    }
}

/// The conditions, each keeping its `lastTransitionTime` while its status
/// holds; an event that is over keeps those it had.
fn conditions(
    ev: &ScheduledEvent,
    seen: &Observed,
    plan: &Plan,
    nodes: &[NodeProgress],
    approval: Option<&Approval>,
    finished: bool,
    now: DateTime<Utc>,
) -> Vec<Condition> {
    let prev = ev.status.clone().unwrap_or_default();
    let prev_conditions = prev.conditions.clone().unwrap_or_default();
    let mut c = Conditions {
        prev: &prev_conditions,
        out: if finished {
            prev_conditions.clone()
        } else {
            Vec::new()
        },
        generation: ev.metadata.generation,
        now,
    };
    if plan.action.drains() {
        drain_conditions(&mut c, nodes, plan, finished, now);
    }
    incomplete_at_deadline(&mut c, plan);
    completed_unobserved(&mut c, ev, plan, approval);
    approval_pending_condition(&mut c, plan, approval);
    drain_scheduled_condition(&mut c, ev, plan, finished);
    trust_conditions(&mut c, seen);
    unmanaged_condition(&mut c, ev, seen);
    if let Some((reason, message)) = &plan.ended_unobserved {
        c.set("EndedWithoutObserver", true, reason, message.clone());
    }
    if !finished {
        acknowledgement_condition(&mut c, ev, plan);
    }
    manual_conditions(&mut c, plan);
    if let Some(why) = &plan.approval_withheld {
        c.set(
            "ApprovalWithheld",
            true,
            "DrainOrResourcesNotReady",
            why.clone(),
        );
    }

    c.out
}

/// An operator's annotation ([`crate::controller::decide::manual`]):
/// `ApprovalHeld` `True` while the hold is set, `False` (`HoldReleased`)
/// once it is removed; `ApprovedByHand` `True` from the pass that decided
/// the approval for the approve-now annotation, kept as recorded after.
fn manual_conditions(c: &mut Conditions<'_>, plan: &Plan) {
    let now = c.now;
    let held = match &plan.manual {
        Some(o @ Override::Hold { .. }) => Some(manual::condition(o, now)),
        _ => None,
    };
    c.set_while(
        "ApprovalHeld",
        held.map(|(_, reason, message)| (reason, message)),
        (
            "HoldReleased",
            "the annotation forewarn.dev/hold was removed: the approval is decided as the policy says",
        ),
    );
    let kept = c
        .prev
        .iter()
        .find(|x| x.type_ == "ApprovedByHand" && x.status == "True")
        .cloned();
    match (&plan.manual, kept) {
        (_, Some(first)) => {
            c.out.retain(|x| x.type_ != "ApprovedByHand");
            c.out.push(first);
        }
        (Some(o @ Override::ApproveNow { decides: true, .. }), None) => {
            let (type_, reason, message) = manual::condition(o, now);
            c.set(type_, true, reason, message);
        }
        _ => {}
    }
}

/// `DrainIncomplete` as the drain deadline (`NotBefore` minus the margin)
/// left it, by the policy's `onDeadline`: `ApprovedIncomplete` when the
/// approval was decided there anyway (`Approve`), `DeadlinePassed` when it
/// is withheld (`Hold`; the platform starts the event at `NotBefore` on
/// its own), each with what was left. Under `Hold` the first account
/// stays (what was left when the deadline passed), as for an unfinished
/// drain; for an action that does not drain, a `True` one recorded before
/// (the approval at the deadline waited for something else) is kept as
/// it was.
fn incomplete_at_deadline(c: &mut Conditions<'_>, plan: &Plan) {
    if let Some(left) = &plan.approved_incomplete {
        c.set(
            "DrainIncomplete",
            true,
            "ApprovedIncomplete",
            format!(
                "approved at the drain deadline (the policy's onDeadline is Approve) with this left: {left}"
            ),
        );
    } else if let Some(left) = &plan.held_incomplete
        && !c
            .prev
            .iter()
            .any(|x| x.type_ == "DrainIncomplete" && x.status == "True")
    {
        // The first account stays (what was left when the deadline
        // passed), as for an unfinished drain.
        c.set(
            "DrainIncomplete",
            true,
            "DeadlinePassed",
            format!(
                "the drain deadline (NotBefore minus the margin) passed with this left, and the policy's onDeadline is Hold: no approval, the platform starts the event at NotBefore: {left}"
            ),
        );
    } else if !plan.action.drains()
        && let Some(first) = c
            .prev
            .iter()
            .find(|x| x.type_ == "DrainIncomplete" && x.status == "True")
    {
        // An approval at the deadline of an event not drained (what it
        // waited for was something else): kept as recorded.
        c.out.retain(|x| x.type_ != "DrainIncomplete");
        c.out.push(first.clone());
    }
}

/// `CompletedUnobserved`, set once: the event is `Completed` (it left
/// IMDS) without ever being seen `Started`. It is taken as run, not
/// cancelled: `ApprovedThenGone` when IMDS had accepted its `approval`,
/// else `NotBeforePassed`.
fn completed_unobserved(
    c: &mut Conditions<'_>,
    ev: &ScheduledEvent,
    plan: &Plan,
    approval: Option<&Approval>,
) {
    let started_at = ev.started_at();
    if plan.phase != Phase::Completed
        || started_at.is_some()
        || spec_started_ever(ev)
        || c.prev.iter().any(|x| x.type_ == "CompletedUnobserved")
    {
        return;
    }
    let accepted =
        approval.and_then(|a| a.result.as_deref()) == Some(crate::agent::approval::ACCEPTED);
    let (reason, message) = if accepted {
        (
            "ApprovedThenGone",
            "left IMDS after IMDS accepted its approval, without being seen Started: taken as run, not cancelled",
        )
    } else {
        (
            "NotBeforePassed",
            "left IMDS after its NotBefore, without being seen Started (no agent could read IMDS meanwhile?): taken as run, not cancelled",
        )
    };
    c.set("CompletedUnobserved", true, reason, message.into());
}

/// `ApprovalPending`: `True` with the plan's `(reason, message)` while a
/// decided approval waits for IMDS to accept it; once the event is
/// `Approved`, or it no longer waits, `False`: `Accepted` only on the
/// sender's own word that IMDS took its POST, else `NotSent`.
fn approval_pending_condition(c: &mut Conditions<'_>, plan: &Plan, approval: Option<&Approval>) {
    if let Some((reason, message)) = &plan.approval_pending {
        c.set("ApprovalPending", true, reason, message.clone());
    } else if plan.phase == Phase::Approved
        || c.prev
            .iter()
            .any(|x| x.type_ == "ApprovalPending" && x.status == "True")
    {
        // `Accepted` only on the sender's own word that IMDS took its POST.
        let (reason, message) = match approval.and_then(|a| a.result.as_deref()) {
            Some(crate::agent::approval::ACCEPTED) => (
                "Accepted",
                format!(
                    "IMDS accepted the approval sent by {}",
                    approval
                        .and_then(|a| a.sent_by.as_deref())
                        .unwrap_or("an agent")
                ),
            ),
            _ => (
                "NotSent",
                "no approval waits any more, and none was accepted: the event started or ended first".into(),
            ),
        };
        c.set("ApprovalPending", false, reason, message);
    }
}

/// `DrainScheduled`: `True` (`WaitingForLeadTime`) while the cordon and
/// drain wait for the drain lead time before `NotBefore`; then `False`,
/// `LeadTimeReached`, or `EventEnded` when the event is over first. Once
/// the wait is over its record stays: the drain started late on purpose,
/// and when.
fn drain_scheduled_condition(
    c: &mut Conditions<'_>,
    ev: &ScheduledEvent,
    plan: &Plan,
    finished: bool,
) {
    if let Some(start) = plan.drain_starts_at {
        c.set(
            "DrainScheduled",
            true,
            "WaitingForLeadTime",
            format!(
                "NotBefore is {}; the cordon and drain start at {}, the drain lead time ({}s: drainLeadTimeSeconds of the matching rule, or of the policy) before it",
                ev.spec.not_before.map(|t| t.to_rfc3339()).unwrap_or_default(),
                start.to_rfc3339(),
                ev.spec
                    .not_before
                    .map(|nb| (nb - start).num_seconds())
                    .unwrap_or_default()
            ),
        );
    } else if c
        .prev
        .iter()
        .any(|x| x.type_ == "DrainScheduled" && x.status == "True")
    {
        let (reason, message) = if finished {
            (
                "EventEnded",
                "the event ended before the drain lead time began",
            )
        } else {
            ("LeadTimeReached", "the drain lead time began")
        };
        c.set("DrainScheduled", false, reason, message.into());
    } else if let Some(ended) = c.prev.iter().find(|x| x.type_ == "DrainScheduled") {
        // Once the wait is over its record stays: the drain started late
        // on purpose, and when.
        c.out.retain(|x| x.type_ != "DrainScheduled");
        c.out.push(ended.clone());
    }
}

/// Trust (docs/trust.md): `NodesUnconfirmed` while nodes are
/// left alone for want of a trusted report (their own agent's, or two
/// other agents'), and `ReportsDisagree` while the agents of the VMs the
/// event names report different events; each `False` once it clears.
fn trust_conditions(c: &mut Conditions<'_>, seen: &Observed) {
    c.set_while(
        "NodesUnconfirmed",
        (!seen.unconfirmed.is_empty()).then(|| {
            (
                "NoTrustedReport",
                format!(
                    "not acted on without its own agent's report or two other agents': {}",
                    named(&seen.unconfirmed, NAMED_IN_MESSAGE, "; ")
                ),
            )
        }),
        (
            "Confirmed",
            "every node the event names is confirmed by a trusted report",
        ),
    );
    c.set_while(
        "ReportsDisagree",
        (!seen.disagreement.is_empty()).then(|| {
            (
                "OwnReportsDiffer",
                named(&seen.disagreement, NAMED_IN_MESSAGE, "; "),
            )
        }),
        (
            "Agree",
            "the agents of the VMs the event names report the same event",
        ),
    );
}

/// `NodesUnmanaged` while nodes of the event are outside the policy's
/// `nodeSelector` (reason `OutsideNodeSelector`, or `NoManagedNode` when
/// every node is, and forewarn sends no approval); `False` once it clears.
fn unmanaged_condition(c: &mut Conditions<'_>, ev: &ScheduledEvent, seen: &Observed) {
    let every = crate::controller::decide::plan::all_unmanaged(ev, seen);
    c.set_while(
        "NodesUnmanaged",
        (!seen.unmanaged.is_empty()).then(|| {
            let nodes = named(&seen.unmanaged, NAMED_IN_MESSAGE, ", ");
            if every {
                (
                    "NoManagedNode",
                    format!(
                        "no node of the event matches the policy's nodeSelector, so forewarn leaves it alone: no cordon, no drain, no approval (the platform starts it at NotBefore): {nodes}"
                    ),
                )
            } else {
                (
                    "OutsideNodeSelector",
                    format!(
                        "left alone (not cordoned, not drained, not waited for by the approval), outside the policy's nodeSelector: {nodes}"
                    ),
                )
            }
        }),
        (
            "AllManaged",
            "every node of the event matches the policy's nodeSelector",
        ),
    );
}

fn spec_started_ever(ev: &ScheduledEvent) -> bool {
    ev.spec.event_status == EventStatus::Started
}

/// Turns the status of a pass that did nothing (`--dry-run`: no node
/// written, no pod evicted) into an honest record of what would have
/// happened: no node is recorded as cordoned by forewarn, the approval is
/// never written to `approval` (which agents send) but to `dryRun` (which
/// no agent reads), and the `DryRun` condition says it all.
pub fn as_dry_run(
    status: &mut ScheduledEventStatus,
    prev: Option<&ScheduledEventStatus>,
    plan: &Plan,
    now: DateTime<Utc>,
) {
    let before = prev.and_then(|p| p.dry_run.clone()).unwrap_or_default();
    let would_cordon = first_listed(
        &before.would_cordon,
        plan.node_writes
            .iter()
            .filter(|w| matches!(w, NodeWrite::Cordon { .. } | NodeWrite::AddHold { .. }))
            .map(|w| w.node().to_string()),
    );
    let would_evict = first_listed(
        &before.would_evict,
        plan.evictions.iter().map(|e| e.pod.key()),
    );
    let (would_approve_at, would_approve_reason) =
        match (&before.would_approve_at, &plan.decide_approval) {
            (Some(at), _) => (Some(*at), before.would_approve_reason.clone()),
            (None, Some(reason)) => (Some(now), Some(reason.clone())),
            (None, None) => (None, None),
        };
    let dry = DryRun {
        would_cordon,
        would_evict,
        would_evict_now: i32::try_from(plan.evictions.len()).unwrap_or(i32::MAX),
        would_approve_at,
        would_approve_reason,
    };
    for n in status.nodes.iter_mut().flatten() {
        n.cordoned_by_us = false;
    }
    if let Some(c) = status.nodes_not_listed.as_mut() {
        c.cordoned_by_us = 0;
    }
    // Only an approval decided by a real controller is ever written where agents read.
    status.approval = None;
    let mut parts = Vec::new();
    if !dry.would_cordon.is_empty() {
        parts.push(format!(
            "would cordon {}",
            named(&dry.would_cordon, NAMED_IN_MESSAGE, ", ")
        ));
    }
    if dry.would_evict_now > 0 {
        parts.push(format!("would evict {} pods", dry.would_evict_now));
    }
    if let Some(reason) = &dry.would_approve_reason {
        parts.push(format!("would approve ({reason})"));
    }
    if parts.is_empty() {
        parts.push("nothing to do yet".into());
    }
    let stored = prev.and_then(|p| p.conditions.clone()).unwrap_or_default();
    let out = status.conditions.clone().unwrap_or_default();
    let generation = out.first().and_then(|c| c.observed_generation);
    let mut c = Conditions {
        prev: &stored,
        out,
        generation,
        now,
    };
    c.set(
        "DryRun",
        true,
        "DryRun",
        format!(
            "controller in --dry-run: nothing was done; {}",
            parts.join("; ")
        ),
    );
    status.conditions = Some(c.out);
    status.dry_run = Some(dry);
}

/// How many nodes and pods `status.dryRun` names.
pub const DRY_RUN_LISTED: usize = 1000;

/// `listed` followed by the items of `new` it lacks, each once, at most
/// [`DRY_RUN_LISTED`] in all.
fn first_listed(listed: &[String], new: impl Iterator<Item = String>) -> Vec<String> {
    let mut out = listed.to_vec();
    let mut known: HashSet<String> = listed.iter().cloned().collect();
    for item in new {
        if out.len() >= DRY_RUN_LISTED {
            break;
        }
        if known.insert(item.clone()) {
            out.push(item);
        }
    }
    out
}

/// `Drained`, `DrainBlocked`, `PodsKept` while live; `DrainIncomplete`
/// once the deadline passed, the event started, or it ended, with pods left.
fn drain_conditions(
    c: &mut Conditions<'_>,
    nodes: &[NodeProgress],
    plan: &Plan,
    finished: bool,
    now: DateTime<Utc>,
) {
    let pending: Vec<String> = nodes
        .iter()
        .filter(|n| n.drained_at.is_none())
        .map(|n| format!("{} ({} pods)", n.name, n.pods_remaining))
        .collect();
    if !finished {
        progress_conditions(c, nodes, &pending);
    }
    // Keep the first account of an incomplete drain (the deadline passing
    // is reported as such, even after the event started or ended).
    if let Some(first) = c
        .prev
        .iter()
        .find(|x| x.type_ == "DrainIncomplete" && x.status == "True")
        .cloned()
    {
        c.out.retain(|x| x.type_ != "DrainIncomplete");
        c.out.push(first);
        return;
    }
    if pending.is_empty() || nodes.is_empty() {
        return;
    }
    let deadline_passed = plan.deadline.is_some_and(|d| now >= d);
    let (why, reason) = if finished {
        ("the event ended", "EndedBeforeDrained")
    } else if plan.phase == Phase::Started {
        ("the event started", "StartedBeforeDrained")
    } else if deadline_passed {
        (
            "the drain deadline (NotBefore minus the margin) passed",
            "DeadlinePassed",
        )
    } else {
        return;
    };
    c.set(
        "DrainIncomplete",
        true,
        reason,
        format!(
            "{why} with {} not drained",
            named(&pending, NAMED_IN_MESSAGE, ", ")
        ),
    );
}

/// What the record of a pod the policy's `excludePods` keeps says after
/// its name (see `plan_evictions`).
const EXCLUDED_MARK: &str = ": excluded from eviction: ";

/// The drain's progress over the per-node records `nodes`, while the event
/// is live: `Drained` (`True` once every node is, else `PodsRemaining`
/// naming the `pending` nodes with their pods left), `DrainBlocked` (what
/// refuses evictions: a PodDisruptionBudget, API server throttling) and
/// `PodsKept` (pods left on their nodes on purpose: `UnmanagedPods` for
/// pods without a controller, `ExcludedByPolicy` when every one kept is
/// one the policy's `excludePods` names).
fn progress_conditions(c: &mut Conditions<'_>, nodes: &[NodeProgress], pending: &[String]) {
    let done = pending.is_empty() && !nodes.is_empty();
    c.set(
        "Drained",
        done,
        if done {
            "AllNodesDrained"
        } else {
            "PodsRemaining"
        },
        named(pending, NAMED_IN_MESSAGE, ", "),
    );
    let blocked: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.blocked_by.as_ref().map(|b| format!("{}: {b}", n.name)))
        .collect();
    c.set(
        "DrainBlocked",
        !blocked.is_empty(),
        if blocked.is_empty() {
            "NotBlocked"
        } else {
            "EvictionRefused"
        },
        named(&blocked, NAMED_IN_MESSAGE, "; "),
    );
    let kept: Vec<&String> = nodes.iter().flat_map(|n| &n.pods_kept).collect();
    let only_excluded = kept.iter().all(|k| k.contains(EXCLUDED_MARK));
    c.set(
        "PodsKept",
        !kept.is_empty(),
        if kept.is_empty() {
            "NoneKept"
        } else if only_excluded {
            "ExcludedByPolicy"
        } else {
            "UnmanagedPods"
        },
        named(&kept, NAMED_IN_MESSAGE, "; "),
    );
}

/// The message of condition `type_` when this status write makes it `True`
/// (it was not `True` before), else `None`.
pub fn newly_true(
    prev: &ScheduledEventStatus,
    next: &ScheduledEventStatus,
    type_: &str,
) -> Option<String> {
    let message = |s: &ScheduledEventStatus| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_ && c.status == "True")
            .map(|c| c.message.clone())
    };
    message(next).filter(|_| message(prev).is_none())
}

#[cfg(test)]
mod size_tests {
    use super::{WAITING_LISTED, listed_at_most};
    use crate::api::NodeProgress;

    /// The records of a 1,000-node event mid-drain (every node with its
    /// terminating pods named) stay far under etcd's 1.5 MiB object limit;
    /// a drained node's record is about 150 bytes.
    #[test]
    fn a_thousand_node_records_mid_drain_stay_small() {
        let record = |i: usize| {
            NodeProgress {
            name: format!("aks-nodepool1-12345678-vmss{i:06x}"),
            vm_name: format!("aks-nodepool1-12345678-vmss_{i}"),
            cordoned_by_us: true,
            pods_remaining: 10,
            waiting_for: listed_at_most(
                &(0..10)
                    .map(|p| format!("shop/web-6f999b7fc5-{p:05}: terminating until 2026-11-26T01:29:11.440375067+00:00"))
                    .collect::<Vec<_>>(),
                WAITING_LISTED,
                "pods terminating",
            ),
            ..NodeProgress::default()
        }
        };
        let draining: Vec<NodeProgress> = (0..1000).map(record).collect();
        let size = serde_json::to_string(&draining).expect("json").len();
        assert!(size < 512 * 1024, "{size} bytes");
        let drained = NodeProgress {
            name: "aks-nodepool1-12345678-vmss00000a".into(),
            vm_name: "aks-nodepool1-12345678-vmss_10".into(),
            cordoned_by_us: true,
            drained_at: Some(chrono::Utc::now()),
            ..NodeProgress::default()
        };
        let one = serde_json::to_string(&drained).expect("json").len();
        assert!(
            one <= 160,
            "{one} bytes: {}",
            serde_json::to_string(&drained).unwrap()
        );
        // On a real node the record also keeps its bootID (a UUID), and
        // after a Reboot when and to what it changed: about 310 bytes.
        let rebooted = NodeProgress {
            impact: Some(crate::api::NodeImpact {
                boot_id: Some("0f5d1c7e-3b7a-4d0e-9b1f-6f6a2b7c9d10".into()),
                restarted_at: Some(chrono::Utc::now()),
                boot_id_after: Some("5a1e2f3c-8d9b-4c7a-a6e5-1b2c3d4e5f60".into()),
                ..Default::default()
            }),
            ..drained
        };
        let one = serde_json::to_string(&rebooted).expect("json").len();
        assert!(
            one <= 320,
            "{one} bytes: {}",
            serde_json::to_string(&rebooted).unwrap()
        );
        // A default field costs nothing: it is left out.
        assert!(
            !serde_json::to_string(&NodeProgress::default())
                .unwrap()
                .contains("podsRemaining")
        );
    }
}

#[cfg(test)]
mod blocker_tests {
    use super::{Outcome, blockers};
    use crate::controller::decide::plan::EvictionOutcome;

    /// The same refusals, answered in another order, give the same record:
    /// the text of the first pod by name, the budgets and the pods listed.
    #[test]
    fn a_nodes_blockers_do_not_depend_on_the_order_of_the_answers() {
        let refused = |pod: &str, budget: &str| -> Outcome {
            (
                "node-1".into(),
                format!("shop/{pod}"),
                EvictionOutcome::Blocked {
                    budgets: vec![format!("shop/{budget}")],
                    message: format!("refused {pod}"),
                },
            )
        };
        let mut outcomes: Vec<Outcome> = ["e", "b", "d", "a", "c"]
            .iter()
            .map(|p| refused(p, if *p < "c" { "web" } else { "api" }))
            .collect();
        outcomes.push(("node-2".into(), "shop/0".into(), EvictionOutcome::Evicted));
        let first = blockers("node-1", &outcomes);
        outcomes.reverse();
        assert_eq!(blockers("node-1", &outcomes), first);
        let (text, budgets, pods) = first;
        assert_eq!(
            text.as_deref(),
            Some("PodDisruptionBudget shop/web: refused a")
        );
        assert_eq!(budgets, ["shop/web", "shop/api"]);
        assert_eq!(
            pods,
            ["shop/a", "shop/b", "shop/c", "and 2 more pods refused"]
        );
    }
}
