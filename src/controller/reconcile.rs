//! One pass over one `ScheduledEvent`: observe -> decide -> act -> report
//! (docs/architecture.md, "One pass"). Observe reads the caches and the
//! agents' reports ([`crate::controller::observe`]); decide is pure
//! ([`crate::controller::decide`]) but for one fresh read of the nodes'
//! pods before an approval; act writes what settling the stored object
//! asks (the spec the reports build, a cleared approval), then nodes,
//! notices and evictions ([`crate::controller::act`]); report writes the
//! status, the Events and the node condition, and says when to look again.
//! Nothing is written before the pass has decided.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::controller::Action as Requeue;
use tracing::{debug, info, instrument};

use crate::api::ScheduledEvent;
use crate::controller::act::{
    carry_out, drain, foreign, node_condition, notice, out_of_service, publish, spec,
};
use crate::controller::context::{Context, Memory};
use crate::controller::decide::pass::{self, DesiredNotice};
use crate::controller::decide::plan::{self, EvictionOutcome, NodeWrite, Plan};
use crate::controller::decide::requeue::{self, Evictions};
use crate::controller::decide::status::{self, Outcome};
use crate::controller::error::Result;
use crate::controller::observe::event::{self, Observation};
use crate::controller::observe::facts::Facts;
use crate::controller::observe::impact;
use crate::controller::observe::observed::Observed;
use crate::controller::observe::reports::reports_about;
use crate::controller::observe::trust;
use crate::policy::Policy;

/// How soon a reconcile that came before the caches synced is tried again.
const CACHE_SYNC_WAIT: Duration = Duration::from_millis(200);

/// One pass over one event: observe -> decide -> act -> report. `permit`
/// (the pass's turn at the deadline-ordered gate) is held until the pass's
/// node writes are sent, then dropped: its evictions are paced by the
/// controller-wide eviction rate budget and its report is a few writes,
/// so a slow eviction (a PodDisruptionBudget's every eviction is a write of
/// its status) holds no other event's cordon back.
///
/// # Errors
/// Any failed read or write; the controller retries with backoff.
#[instrument(skip_all, fields(event = %stored.name_any()))]
pub async fn reconcile<P: Send>(
    stored: Arc<ScheduledEvent>,
    ctx: Arc<Context>,
    permit: P,
) -> Result<Requeue> {
    // The spec is built from the agents' reports, and the hand-over claims
    // from the other events, read from caches: before their first full list
    // a missing report would read as a silent agent, wait.
    if !ctx.caches.synced() {
        debug!("Waiting for the ScheduledEvent and report caches to sync");
        return Ok(Requeue::requeue(CACHE_SYNC_WAIT));
    }
    // The object as this controller's last status write left it, while the
    // cache still shows a version older than that write's answer
    // (crate::controller::act::latest): a pass on the older one would lose
    // its writes with 409.
    let stored = ctx.writers.latest.fresher(stored);
    let now = Utc::now();
    let policy = ctx.policy();
    // Observe: the event as its agents' reports build it, its nodes, their pods.
    let facts = Facts::read(&ctx.caches);
    let (reports, last_report) = reports_about(&facts.reports, &stored.name_any());
    let judged = trust::judge_reports(reports.iter().copied(), |n| facts.identity(n));
    // No report about it (deleted by hand, or of an earlier version): the
    // stored spec stands, and no node is confirmed by it.
    let built = trust::build(&judged).unwrap_or_else(|| trust::Built::stored(&stored.spec));
    let (mut ev, settled) = settle(&stored, &built);
    let foreign = settled.foreign.clone();
    event::copy_sent_approval(&mut ev, &reports, |n| facts.vm_of(n));
    let Observation {
        mut seen,
        mut dissent,
        snapshots,
    } = event::observe(
        &ev,
        &built,
        &judged,
        &facts,
        &ctx.caches,
        &policy,
        ctx.writers.dry_run,
        now,
    );
    seen.last_report = last_report.or_else(|| created(&ev));
    // The pods the policy keeps on their nodes (excludePods); the
    // namespaces' labels are read only when a node has pods to judge.
    let any_pods = seen
        .nodes
        .iter()
        .chain(dissent.iter().flat_map(|(_, nodes)| nodes))
        .any(|n| !n.pods.is_empty());
    let excluded_namespaces = if any_pods {
        ctx.caches
            .namespaces
            .selected(&ctx.writers.client, &policy)
            .await?
    } else {
        HashSet::new()
    };
    event::exclude_pods(&mut seen, &mut dissent, &policy, excluded_namespaces);
    // Decide.
    let (plan, notices) = decide(&ev, &mut seen, dissent, &policy, now, &ctx).await?;
    // Never while a node's own agent still lists the event: its report
    // would go with the object, and its hold with both.
    if plan.delete && !built.dissent_live() {
        forget_blocked(&ctx.memory, &ev.name_any());
        spec::delete(&ev, &reports, &ctx.writers.client).await?;
        return Ok(Requeue::await_change());
    }
    // Act: first what settling the stored object asks (its spec, a cleared
    // approval), each write conditional on the version the one before it
    // made, then the nodes and the pods.
    write_settled(&stored, &mut ev, &settled, &ctx).await?;
    let Acted {
        outcomes,
        deferred,
        not_written,
    } = act(&ev, &plan, notices, &snapshots, &policy, &ctx, permit).await?;
    // The report says what was written: a node whose write was refused
    // keeps the marks the cache shows, and its record says why.
    let mut plan = plan;
    plan.node_writes.retain(|w| !not_written.contains(w.node()));
    // Counted before the report's writes, so that a budget allowing a
    // disruption while they are sent wakes this drain (the budget watch
    // wakes the drains counted blocked).
    let mut next = next_pass(&ev.name_any(), &plan, &outcomes, deferred, &ctx.memory);
    if let Some(retry) = ctx
        .memory
        .refused
        .next_retry(&ev.name_any(), tokio::time::Instant::now())
    {
        next = next.min(retry.max(REFUSED_RETRY_FLOOR));
    }
    // Report.
    let pass = Pass {
        ev: &ev,
        seen: &seen,
        plan: &plan,
        outcomes: &outcomes,
        now,
    };
    report(&stored, &pass, foreign.as_deref(), &snapshots, &facts, &ctx).await?;
    Ok(Requeue::requeue(sooner_if_a_budget_allows(
        &ev.name_any(),
        next,
        &ctx,
    )))
}

/// The soonest a pass comes again for a node write that waits for its
/// backoff.
const REFUSED_RETRY_FLOOR: Duration = Duration::from_millis(100);

/// What a pass's act did: the eviction outcomes, how many evictions were
/// left to the next pass, and the nodes whose planned write was not made
/// (refused, or waiting for the backoff of an earlier refusal).
struct Acted {
    outcomes: Vec<Outcome>,
    deferred: usize,
    not_written: HashSet<String>,
}

/// How soon to pass again over a drain that allowed none when its pods were
/// refused but whose budgets allow a disruption now.
const BUDGET_ALLOWS_AGAIN: Duration = Duration::from_millis(100);

/// `next`, or [`BUDGET_ALLOWS_AGAIN`] when the event named `name` is a
/// blocked drain of which a budget allows a disruption in the cache now: it
/// changed after the refusal and before the drain was counted blocked, and
/// the budget watch, which wakes only the drains counted blocked, did not
/// wake this one.
fn sooner_if_a_budget_allows(name: &str, next: Duration, ctx: &Context) -> Duration {
    let budgets = ctx
        .memory
        .blocked
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(name)
        .map(|b| b.budgets.clone());
    match budgets {
        Some(b) if ctx.memory.refusals.any_allows(&ctx.caches.budgets, &b) => {
            next.min(BUDGET_ALLOWS_AGAIN)
        }
        _ => next,
    }
}

/// What bringing the stored object in line with the reports writes, as
/// [`settle`] decides it and [`write_settled`] writes it.
struct Settled {
    /// The spec the reports build, when it differs from the stored one.
    spec: Option<crate::api::ScheduledEventSpec>,
    /// The event is back in IMDS: the earlier appearance's approval is
    /// cleared.
    anew: bool,
    /// Who wrote an approval the controller did not: ignored and cleared.
    foreign: Option<String>,
}

/// The event to handle and what settling the stored object writes: the
/// spec the reports build (written when it changed), the approval of an
/// earlier appearance cleared when the event is back in IMDS, and an
/// approval the controller did not write ignored (never carried on from,
/// removed and reported). Decided here, before the pass observes, and
/// written with the pass's other writes ([`write_settled`]).
fn settle(stored: &ScheduledEvent, built: &trust::Built) -> (ScheduledEvent, Settled) {
    let mut ev = stored.clone();
    let spec = trust::to_store(&built.spec, &stored.spec);
    let changed = (spec != stored.spec).then(|| spec.clone());
    ev.spec = spec;
    let (mut ev, anew) = status::for_current_appearance(&ev);
    if anew {
        info!(
            appearance = ev.spec.appearance,
            "The event is back in IMDS: handling it afresh"
        );
        let settled = Settled {
            spec: changed,
            anew,
            foreign: None,
        };
        return (ev, settled);
    }
    let foreign = foreign::ignore(stored, &mut ev);
    let settled = Settled {
        spec: changed,
        anew,
        foreign,
    };
    (ev, settled)
}

/// Writes what [`settle`] decided, each write conditional on the version
/// the one before it made (the spec on the stored version), `ev` carrying
/// the last version on to the pass's status write.
///
/// # Errors
/// A write the API server refused (409 when the object changed since the
/// pass read it: the pass runs again on the newer version).
async fn write_settled(
    stored: &ScheduledEvent,
    ev: &mut ScheduledEvent,
    settled: &Settled,
    ctx: &Context,
) -> Result<()> {
    let name = ev.name_any();
    if let Some(spec) = &settled.spec
        && let Some(version) = spec::write(&ctx.writers, &name, stored, spec).await?
    {
        ev.metadata.resource_version = Some(version);
    }
    if settled.anew
        && let Some(version) = publish::clear_approval(ev, &ctx.writers).await?
    {
        ev.metadata.resource_version = Some(version);
    }
    if let Some(by) = &settled.foreign {
        foreign::clear(stored, ev, &ctx.writers, by).await?;
    }
    Ok(())
}

/// When the object was created, for an event no agent wrote a report of.
fn created(ev: &ScheduledEvent) -> Option<DateTime<Utc>> {
    ev.metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0))
}

/// The plan of the pass and the notices the taking-part pods should hold.
/// The approval is decided on each node's pods as the API server has them
/// now, not as the cache last showed them (a pod bound just before the
/// cordon may not be cached yet): one LIST a node, at the decision, and
/// the plan made again when they differ. Each dissenting node's plan is
/// merged in ([`pass::merge_dissent`]).
async fn decide(
    ev: &ScheduledEvent,
    seen: &mut Observed,
    dissent: Vec<(
        crate::api::ScheduledEventSpec,
        Vec<crate::controller::observe::observed::ObservedNode>,
    )>,
    policy: &Policy,
    now: DateTime<Utc>,
    ctx: &Context,
) -> Result<(Plan, Vec<DesiredNotice>)> {
    let mut plan = plan::plan(ev, seen, policy, now);
    if plan.decide_approval.is_some()
        && !ctx.writers.dry_run
        && event::fresh_pods(ev, seen, &ctx.writers.client, policy).await?
    {
        debug!("A fresh read of the nodes' pods differs from the cache: planning again on it");
        plan = plan::plan(ev, seen, policy, now);
    }
    let mut notices = pass::notices(ev, &plan, seen);
    pass::merge_dissent(ev, dissent, policy, now, &mut plan, seen, &mut notices);
    Ok((plan, notices))
}

/// Carries out the plan: notices first (a pod learns of the event before
/// it is evicted), then the node writes, then the evictions, each only once
/// the writes before it succeeded. The pods of a node cordoned in this pass
/// are asked to leave in the same pass when it cordoned at most
/// [`carry_out::FEW_NODES`] nodes (a Spot VM's `Preempt`, with its 30 s of
/// notice, cannot wait a pass), and from the next pass on when it cordoned
/// more, so that a pass over a 1,000-node event ends once its cordons are
/// written and the nodes reported meanwhile are cordoned at the next one.
/// Evicting from a pod list read before the cordon is safe: the node is
/// drained only on a list read after it. `permit` is dropped once the node
/// writes are sent. Returns the eviction outcomes and how many evictions
/// were left to the next pass. Under `--dry-run` nothing is written.
async fn act<P>(
    ev: &ScheduledEvent,
    plan: &Plan,
    notices: Vec<DesiredNotice>,
    snapshots: &HashMap<String, Arc<Node>>,
    policy: &Policy,
    ctx: &Context,
    permit: P,
) -> Result<Acted> {
    let w = &ctx.writers;
    if w.dry_run {
        return Ok(Acted {
            outcomes: Vec::new(),
            deferred: 0,
            not_written: HashSet::new(),
        });
    }
    let name = ev.name_any();
    let writes = notice::writes(&name, notices, &ctx.caches.pods.holders_of(&name));
    notice::write(&name, &writes, &w.client, &w.metrics).await;
    let not_written = carry_out::write_nodes(
        ev,
        plan,
        snapshots,
        w,
        &ctx.memory.refused,
        policy.exclude_from_load_balancers,
        policy.taint_effect,
    )
    .await;
    out_of_service::taint(ev, plan, w).await?;
    drop(permit);
    let cordoned_now: HashSet<&str> = plan
        .node_writes
        .iter()
        .filter(|w| matches!(w, NodeWrite::Cordon { .. }))
        .map(NodeWrite::node)
        .collect();
    let evict_later = cordoned_now.len() > carry_out::FEW_NODES;
    // No pod leaves a node whose cordon or hold was not written: it would
    // be scheduled back on it.
    let now_evicted: Vec<plan::Eviction> = plan
        .evictions
        .iter()
        .filter(|e| !(evict_later && cordoned_now.contains(e.node.as_str())))
        .filter(|e| !not_written.contains(&e.node))
        .cloned()
        .collect();
    let later = plan.evictions.len() - now_evicted.len();
    let (outcomes, deferred) = carry_out::evict(
        ev,
        &now_evicted,
        w,
        (&ctx.caches.budgets, &ctx.memory.refusals),
        &ctx.caches.pods,
        ctx.per_node,
        &ctx.memory.blocks_announced,
    )
    .await;
    Ok(Acted {
        outcomes,
        deferred: deferred + later,
        not_written,
    })
}

/// What one pass saw, planned and did: what its report is written from.
struct Pass<'a> {
    ev: &'a ScheduledEvent,
    seen: &'a Observed,
    plan: &'a Plan,
    outcomes: &'a [Outcome],
    now: DateTime<Utc>,
}

/// Writes what the pass did: the status (with a foreign approval's
/// condition, the nodes' restarts and a freeze's heartbeat gap, and under
/// `--dry-run` what would have been done), its Events and webhooks, and the
/// node condition of each node the event concerns or recorded.
async fn report(
    stored: &ScheduledEvent,
    pass: &Pass<'_>,
    foreign_writer: Option<&str>,
    snapshots: &HashMap<String, Arc<Node>>,
    facts: &Facts,
    ctx: &Context,
) -> Result<()> {
    let Pass {
        ev,
        seen,
        plan,
        outcomes,
        now,
    } = *pass;
    let status::Next {
        mut status,
        not_listed,
    } = status::next(ev, seen, plan, outcomes, now);
    // `decidedAt` says when the decision was recorded, after this pass's
    // node writes and pod lists, not when the pass began (a pass over many
    // nodes takes seconds).
    if plan.decide_approval.is_some()
        && let Some(a) = status.approval.as_mut()
        && a.decided_at == Some(now)
    {
        a.decided_at = Some(Utc::now());
    }
    for refusal in ctx.memory.refused.of_event(&ev.name_any()) {
        if let Some(r) = status
            .nodes
            .iter_mut()
            .flatten()
            .find(|r| r.name == refusal.node)
        {
            r.write_refused = Some(refusal.why);
        }
    }
    foreign::record(
        &mut status,
        ev.status.as_ref(),
        foreign_writer,
        ev.metadata.generation,
        now,
    );
    let c = &ctx.caches;
    impact::observe_and_record(ev, &mut status, snapshots, &c.heartbeats, &c.boot_ids, now);
    if ctx.writers.dry_run {
        status::as_dry_run(&mut status, ev.status.as_ref(), plan, now);
    }
    let prev = stored.status.as_ref();
    let answer = publish::report(
        ev,
        prev,
        plan,
        &status,
        &not_listed,
        &ctx.writers,
        &ctx.memory.announced,
    )
    .await?;
    // The write was conditional on `ev`'s version: the version the pass
    // started from (a spec write may come between) is older than its answer.
    // When the pass started from an earlier answer, the version the cache
    // showed is among those that answer's entry already holds.
    if let (Some(answer), Some(base)) = (answer, ev.metadata.resource_version.as_deref()) {
        let started: Vec<&str> = stored
            .metadata
            .resource_version
            .as_deref()
            .into_iter()
            .collect();
        ctx.writers.latest.wrote(base, &started, answer);
    }
    // A node whose part ended is no longer observed: its record names it.
    let names: Vec<String> = seen
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .chain(status.nodes.iter().flatten().map(|r| r.name.clone()))
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect();
    let mut fresh = ev.clone();
    fresh.status = Some(status);
    node_condition::sync(
        &ctx.writers,
        &ctx.memory.node_conditions,
        &ctx.caches,
        facts,
        Some(&fresh),
        &names,
    )
    .await;
    ctx.writers
        .metrics
        .reconciles
        .with_label_values(&["ok"])
        .inc();
    ctx.memory
        .failures
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&ev.name_any());
    Ok(())
}

/// When to look at the event named `name` again ([`requeue::after`]),
/// counting its blocked passes in `memory` (forgotten once its drain is no
/// longer blocked).
fn next_pass(
    name: &str,
    plan: &Plan,
    outcomes: &[Outcome],
    deferred: usize,
    memory: &Memory,
) -> Duration {
    let blocked = outcomes
        .iter()
        .any(|(_, _, o)| matches!(o, EvictionOutcome::Blocked { .. }));
    let evictions = match drain::throttled_for(outcomes) {
        Some(t) => Evictions::Throttled(t),
        None if blocked => {
            let mut b = memory
                .blocked
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let entry = b.entry(name.to_owned()).or_default();
            let evicted = outcomes
                .iter()
                .any(|(_, _, o)| matches!(o, EvictionOutcome::Evicted));
            entry.passes = requeue::blocked_passes(entry.passes, evicted);
            // A pod under several budgets waits for its own backoff, not
            // for a budget to allow a disruption.
            entry.budgets = outcomes
                .iter()
                .filter(|(_, _, o)| !drain::under_several_budgets(o))
                .filter_map(|(_, _, o)| match o {
                    EvictionOutcome::Blocked { budgets, .. } => Some(budgets.iter().cloned()),
                    _ => None,
                })
                .flatten()
                .collect();
            Evictions::Blocked {
                passes: entry.passes,
            }
        }
        None => {
            forget_blocked(memory, name);
            Evictions::Open
        }
    };
    requeue::after(
        plan.requeue,
        plan.polls_progress,
        evictions,
        deferred,
        plan.due,
    )
}

/// Forgets the blocked passes of the event named `name`.
fn forget_blocked(memory: &Memory, name: &str) {
    memory
        .blocked
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(name);
}
