//! One reconcile of one `ScheduledEvent`: observe (from the caches and a
//! pod list per affected node), plan (pure), act (node writes and
//! evictions), report (status and Events).

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType as KubeEventType;
use tracing::{debug, info, instrument, warn};

use super::plan::{self, EvictionOutcome, NodeWrite, Observed, ObservedNode, Plan};
use super::report::{self, Subject};
use super::status::{self, Outcome};
use super::{Context, Error, ReportsByEvent, Result, drain, nodes, reports_about, trust};
use crate::crd::ScheduledEvent;

/// When to look again at an event whose evictions a budget refused.
const BLOCKED_REQUEUE: std::time::Duration = std::time::Duration::from_secs(1);

/// How soon a reconcile that came before the caches synced is tried again.
const CACHE_SYNC_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Kubernetes Events posted at once by one reconcile.
const EVENT_CONCURRENCY: usize = 16;

/// How many unconfirmed nodes the status names, each with its reason.
const UNCONFIRMED_LISTED: usize = 10;

/// Pod lists (one per affected node) in flight at once for one event.
const POD_LIST_CONCURRENCY: usize = 32;

/// Node writes in flight at once for one event.
const NODE_WRITE_CONCURRENCY: usize = 32;

/// One pass over one event: observe -> plan -> act -> report.
///
/// # Errors
/// Any failed read or write; the controller retries with backoff.
#[instrument(skip_all, fields(event = %stored.name_any()))]
pub async fn reconcile(stored: Arc<ScheduledEvent>, ctx: Arc<Context>) -> Result<Requeue> {
    // The trust assessment reads the agents' reports, and the hand-over
    // claims the other events, from caches. Before their first full list a
    // missing report would read as a silent agent, and a spec `Completed`
    // with no live report against it would release the node: wait.
    if !ctx.caches_synced() {
        debug!("Waiting for the ScheduledEvent and report caches to sync");
        return Ok(Requeue::requeue(CACHE_SYNC_WAIT));
    }
    let now = Utc::now();
    let (ev, anew) = status::for_current_appearance(&stored);
    if anew {
        info!(
            appearance = ev.spec.appearance,
            "The event is back in IMDS: handling it afresh"
        );
        report::clear_approval(&ev, &ctx).await?;
    }
    let policy = ctx.policy();
    let (ev, seen, snapshots) = observe(ev, &ctx, policy.trust_any_agent).await?;
    let plan = plan::plan(&ev, &seen, &policy, now);
    if plan.delete {
        let name = ev.name_any();
        Api::<ScheduledEvent>::all(ctx.client.clone())
            .delete(&name, &DeleteParams::default())
            .await
            .map_err(|source| Error::DeleteEvent {
                name: name.clone(),
                source,
            })?;
        info!("Deleted ScheduledEvent past its retention");
        return Ok(Requeue::await_change());
    }
    let outcomes = if ctx.dry_run {
        Vec::new()
    } else {
        write_nodes(&ev, &plan, &snapshots, &ctx).await?;
        evict(&ev, &plan, &ctx).await
    };
    let mut status = status::next_status(&ev, &seen, &plan, &outcomes, now);
    // `decidedAt` says when the decision was recorded, after this pass's
    // node writes and pod lists, not when the pass began (a pass over many
    // nodes takes seconds).
    if plan.decide_approval.is_some()
        && let Some(a) = status.approval.as_mut()
        && a.decided_at == Some(now)
    {
        a.decided_at = Some(Utc::now());
    }
    if ctx.dry_run {
        status::as_dry_run(&mut status, ev.status.as_ref(), &plan, now);
    }
    report::report(&ev, &plan, &status, &ctx).await?;
    ctx.metrics.reconciles.with_label_values(&["ok"]).inc();
    ctx.failures
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&ev.name_any());
    let requeue = match drain::throttled_for(&outcomes) {
        Some(t) => t.max(plan.requeue),
        // A PodDisruptionBudget allows again as soon as a replacement is
        // Ready: look again soon (the refused pods' siblings were not asked).
        None if outcomes
            .iter()
            .any(|(_, _, o)| matches!(o, EvictionOutcome::Blocked { .. })) =>
        {
            plan.requeue.min(BLOCKED_REQUEUE)
        }
        None => plan.requeue,
    };
    Ok(Requeue::requeue(requeue))
}

/// The other unfinished events that map to each node and whose policy
/// cordons it, from the controller's cache of `ScheduledEvent`s.
fn claims(
    me: &str,
    ctx: &Context,
    cached: &[Arc<Node>],
    reports: &ReportsByEvent,
) -> HashMap<String, Vec<String>> {
    let mut by_node: HashMap<String, Vec<String>> = HashMap::new();
    let policy = ctx.policy();
    for other in ctx.events.state() {
        let name = other.name_any();
        if name == me {
            continue;
        }
        let action = policy.decide(
            &other.spec.event_type.as_str().into(),
            &other.spec.event_source,
            other.spec.duration_seconds,
        );
        if !action.cordons() {
            continue;
        }
        // Only nodes the other event holds on trusted word (see `trust`),
        // and only while it is live on that word.
        let mapped =
            nodes::map_resources(&other.spec.resources, cached.iter().map(AsRef::as_ref)).mapped;
        let assessment = trust::assess(
            &other,
            &reports_about(reports, &other),
            mapped.iter().map(|(_, node)| node.as_str()),
            policy.trust_any_agent,
        );
        if plan::is_over(&assessment.effective((*other).clone())) {
            continue;
        }
        for (_, node) in mapped {
            if assessment
                .verdicts
                .get(&node)
                .is_some_and(trust::Verdict::is_live)
            {
                by_node.entry(node).or_default().push(name.clone());
            }
        }
    }
    by_node
}

/// Reads, from the node cache, the nodes the event maps to and those that
/// still hold a cordon for it, and lists the pods of the mapped ones. Node
/// writes are conditional on the `resourceVersion` read here, so a stale
/// cache costs a 409 and a retry, never a wrong write.
///
/// Returns the event as the controller acts on it (see
/// [`trust::Assessment::effective`]): a node that no trusted report confirms
/// is not among the mapped nodes (it is released if it holds the event's
/// cordon), and is listed in `Observed::unconfirmed`.
async fn observe(
    ev: ScheduledEvent,
    ctx: &Context,
    trust_any_agent: bool,
) -> Result<(ScheduledEvent, Observed, HashMap<String, Arc<Node>>)> {
    let me = ev.name_any();
    let cached = ctx.nodes.state();
    let reports = ctx.reports_by_event();
    let nodes::Mapping {
        mapped,
        unmapped,
        mut doubts,
    } = nodes::map_resources(&ev.spec.resources, cached.iter().map(AsRef::as_ref));
    let assessment = trust::assess(
        &ev,
        &reports_about(&reports, &ev),
        mapped.iter().map(|(_, node)| node.as_str()),
        trust_any_agent,
    );
    let ev = assessment.effective(ev);
    let ev = &ev;
    // Named in full for a few nodes; an event naming a thousand VMs must
    // not write a thousand reasons into its status.
    let mut unconfirmed = assessment.unconfirmed();
    if unconfirmed.len() > UNCONFIRMED_LISTED {
        let more = unconfirmed.len() - UNCONFIRMED_LISTED;
        unconfirmed.truncate(UNCONFIRMED_LISTED);
        unconfirmed.push(format!("and {more} more node(s)"));
    }
    if !unconfirmed.is_empty() {
        doubts.push(format!(
            "no trusted report for node {}",
            unconfirmed.join("; ")
        ));
    }
    // A node that already holds this event's cordon keeps it while it is
    // merely unconfirmed (its own agent has not yet reported a new
    // appearance of the event, say): the hold was taken on trusted word,
    // and dropping it would make the node schedulable for a moment. Only a
    // trusted end (or the event's) releases it.
    let by_name: HashMap<String, &Arc<Node>> = cached.iter().map(|n| (n.name_any(), n)).collect();
    let holds_it = |node: &str| {
        by_name
            .get(node)
            .is_some_and(|n| nodes::holds(n).contains(&me))
    };
    let mapped: Vec<(String, String)> = mapped
        .into_iter()
        .filter(|(_, node)| match assessment.verdicts.get(node) {
            Some(trust::Verdict::Live { .. }) => true,
            Some(trust::Verdict::Unconfirmed { .. }) => holds_it(node),
            _ => false,
        })
        .collect();
    let completed = plan::is_over(ev);
    let recorded = ev
        .status
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .is_some_and(|n| !n.is_empty());
    let action = ctx.policy().decide(
        &ev.spec.event_type.as_str().into(),
        &ev.spec.event_source,
        ev.spec.duration_seconds,
    );
    let claims = claims(&me, ctx, &cached, &reports);
    let mut wanted: Vec<(String, String)> =
        mapped.into_iter().map(|(vm, node)| (node, vm)).collect();
    for n in cached.iter().filter(|n| nodes::holds(n).contains(&me)) {
        let name = n.name_any();
        if !wanted.iter().any(|(w, _)| *w == name) {
            wanted.push((name, String::new()));
        }
    }
    let mut seen = Observed {
        nodes: Vec::new(),
        unmapped,
        doubts,
        unconfirmed,
        completion_unconfirmed: assessment.completion_unconfirmed.clone(),
    };
    // A finished event's record is frozen; pods are read only for nodes it
    // never recorded, so that the record says what was there. The lists
    // run side by side (an event may name hundreds of VMs), in order.
    let claims = &claims;
    let listed: Vec<Result<(ObservedNode, Arc<Node>)>> =
        futures::stream::iter(wanted.into_iter().filter_map(|(name, vm)| {
            // A node gone from the cache has nothing to drain or release.
            let node = Arc::clone(by_name.get(&name)?);
            Some((name, vm, node))
        }))
        .map(|(name, vm, node)| async move {
            let pods = if action.drains() && !vm.is_empty() && (!completed || !recorded) {
                drain::pods_on(&ctx.client, &name).await?
            } else {
                Vec::new()
            };
            let observed = ObservedNode {
                cordoned: nodes::is_cordoned(&node),
                holds: nodes::holds(&node),
                claimed_by: claims.get(&name).cloned().unwrap_or_default(),
                name,
                vm_name: vm,
                pods,
            };
            Ok((observed, node))
        })
        .buffered(POD_LIST_CONCURRENCY)
        .collect()
        .await;
    let mut snapshots = HashMap::new();
    for item in listed {
        let (observed, node) = item?;
        snapshots.insert(observed.name.clone(), node);
        seen.nodes.push(observed);
    }
    Ok((ev.clone(), seen, snapshots))
}

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

/// Carries out the plan's node writes, several nodes at once.
async fn write_nodes(
    ev: &ScheduledEvent,
    plan: &Plan,
    snapshots: &HashMap<String, Arc<Node>>,
    ctx: &Context,
) -> Result<()> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut writes = Vec::new();
    for w in &plan.node_writes {
        let Some(node) = snapshots.get(w.node()).cloned() else {
            continue;
        };
        let (api, w) = (api.clone(), w.clone());
        writes.push(async move {
            let r = nodes::write_holds(&api, &node, w.holds(), w.unschedulable()).await;
            (w, r)
        });
    }
    let results: Vec<(NodeWrite, std::result::Result<(), kube::Error>)> =
        futures::stream::iter(writes)
            .buffer_unordered(NODE_WRITE_CONCURRENCY)
            .collect()
            .await;
    let mut first_error = None;
    let mut written = Vec::new();
    for (w, r) in results {
        match r {
            Ok(()) => written.push(w),
            Err(source) => {
                first_error.get_or_insert(Error::PatchNode {
                    node: w.node().into(),
                    source,
                });
            }
        }
    }
    let mut notes = Vec::new();
    for w in &written {
        let (label, reason, note) = describe(ev, w);
        ctx.metrics.node_writes.with_label_values(&[label]).inc();
        if matches!(w, NodeWrite::Cordon { .. }) {
            ctx.metrics.cordoned(ev, Utc::now());
        }
        info!(node = w.node(), reason, "{note}");
        notes.push(report::publish(
            ctx,
            ev,
            Subject::Node(w.node()),
            KubeEventType::Normal,
            reason,
            note,
        ));
    }
    // One Event per node write, posted side by side (an event may name
    // hundreds of VMs; one after another they held the pass for seconds).
    futures::stream::iter(notes)
        .buffer_unordered(EVENT_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
    first_error.map_or(Ok(()), Err)
}

/// Requests the plan's evictions and reports each outcome.
async fn evict(ev: &ScheduledEvent, plan: &Plan, ctx: &Context) -> Vec<Outcome> {
    let outcomes = drain::evict_all(
        &ctx.evict_client,
        &ctx.limiter,
        &plan.evictions,
        ctx.per_node,
    )
    .await;
    // Events are posted together, not one after another: a pass over a node
    // of 100 pods must not spend seconds on them. A refusal gets one Event
    // per node and set of budgets per pass, however many pods it holds back.
    let mut notes: Vec<(Subject<'_>, KubeEventType, &'static str, String)> = Vec::new();
    let mut blocked: Vec<(&str, &Vec<String>, &String, Vec<String>)> = Vec::new();
    for (node, pod, outcome) in &outcomes {
        let label = match outcome {
            EvictionOutcome::Evicted => "evicted",
            EvictionOutcome::Blocked { .. } => "blocked",
            EvictionOutcome::Throttled { .. } => "throttled",
            EvictionOutcome::Gone => "gone",
            EvictionOutcome::Retry(_) => "error",
        };
        ctx.metrics.evictions.with_label_values(&[label]).inc();
        let Some(e) = plan
            .evictions
            .iter()
            .find(|e| e.pod.name == *pod && e.node == *node)
        else {
            continue;
        };
        let key = e.pod.key();
        match outcome {
            EvictionOutcome::Evicted => {
                info!(node, pod = %key, grace_seconds = e.grace_seconds, "Evicted pod");
                notes.push((
                    Subject::Pod(&e.pod.namespace, &e.pod.name),
                    KubeEventType::Normal,
                    "Evicted",
                    format!(
                        "Evicted {key} from {node} with a grace period of {}s",
                        e.grace_seconds
                    ),
                ));
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
                warn!(node, pod = %key, %why, "Eviction failed; will retry")
            }
            EvictionOutcome::Gone => {}
        }
    }
    for (node, budgets, message, pods) in blocked {
        let more = match pods.len() {
            1 => String::new(),
            n => format!(" and {} more", n - 1),
        };
        notes.push((
            Subject::Node(node),
            KubeEventType::Warning,
            "EvictionBlocked",
            format!(
                "Eviction of {}{more} from {node} blocked by PodDisruptionBudget {}: {message}",
                pods[0],
                budgets.join(", ")
            ),
        ));
    }
    let mut posts = Vec::new();
    for (subject, type_, reason, note) in notes {
        posts.push(report::publish(ctx, ev, subject, type_, reason, note));
    }
    futures::stream::iter(posts)
        .buffer_unordered(EVENT_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
    outcomes
}
