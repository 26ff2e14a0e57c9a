//! One reconcile of one `ScheduledEvent`: observe (from the caches and a
//! pod list per affected node), plan (pure), act (node writes and
//! evictions), report (status and Events).

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType as KubeEventType;
use tracing::{debug, info, instrument, warn};

use crate::api::{
    Report, ScheduledEvent, ScheduledEventReport, ScheduledEventSpec, SentApproval, report_name,
};
use crate::controller::act::drain;
use crate::controller::act::nodes;
use crate::controller::act::notice;
use crate::controller::act::publish::{self, Subject};
use crate::controller::act::spec;
use crate::controller::decide::plan::{
    self, EvictionOutcome, NodeWrite, Observed, ObservedNode, Plan, PodInfo,
};
use crate::controller::decide::status::{self, Outcome};
use crate::controller::observe::trust;
use crate::controller::{
    Context, Error, ReportsByEvent, Result, fixed_vms, reports_about, stated_vms,
};
use crate::text::{listed_at_most, named};

/// When to look again at an event whose evictions a budget refused.
const BLOCKED_REQUEUE: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest pause between two passes over a blocked drain.
const MAX_BLOCKED_REQUEUE: std::time::Duration = std::time::Duration::from_secs(16);

/// How soon a reconcile that came before the caches synced is tried again.
const CACHE_SYNC_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// How long one pass may spend asking for evictions (waiting for the rate
/// budget): the rest is deferred to the next pass, so that a pass over a
/// large event ends soon and what changed meanwhile (a node's report came
/// in) is acted on within about this long.
const EVICTION_PASS: std::time::Duration = std::time::Duration::from_secs(1);

/// When to look again at an event whose evictions were deferred (the rate
/// budget refills meanwhile; its burst carries the tokens over).
const DEFERRED_REQUEUE: std::time::Duration = std::time::Duration::from_millis(250);

/// The shortest pause before a pass for something that falls due.
const MIN_DUE_REQUEUE: std::time::Duration = std::time::Duration::from_millis(100);

/// How many unconfirmed nodes the status names, each with its reason.
const UNCONFIRMED_LISTED: usize = 10;

/// Up to how many nodes the approval's fresh read lists each node's pods
/// (by field selector); beyond, it lists every bound pod once, paginated
/// (a 1,000-node event: 20 requests instead of 1,000).
const LIST_PER_NODE_UP_TO: usize = 20;

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
    // The spec is built from the agents' reports, and the hand-over claims
    // from the other events, read from caches: before their first full list
    // a missing report would read as a silent agent, wait.
    if !ctx.caches_synced() {
        debug!("Waiting for the ScheduledEvent and report caches to sync");
        return Ok(Requeue::requeue(CACHE_SYNC_WAIT));
    }
    let now = Utc::now();
    let policy = ctx.policy();
    let facts = Facts::read(&ctx);
    let name = stored.name_any();
    let (reports, last_report) = reports_about(&facts.reports, &name);
    let judged = trust::judge_reports(&reports, |n| facts.identity(n));
    let built = match trust::build(&judged) {
        Some(built) => {
            if built.spec != stored.spec {
                spec::write(&ctx, &name, Some(&stored), &built.spec).await?;
            }
            built
        }
        // No report about it (deleted by hand, or of an earlier version):
        // the stored spec stands, and no node is confirmed by it.
        None => trust::Built {
            digest: stored.spec.digest(),
            spec: stored.spec.clone(),
            dissent: Vec::new(),
        },
    };
    let mut ev = (*stored).clone();
    ev.spec = built.spec.clone();
    let (mut ev, anew) = status::for_current_appearance(&ev);
    if anew {
        info!(
            appearance = ev.spec.appearance,
            "The event is back in IMDS: handling it afresh"
        );
        publish::clear_approval(&ev, &ctx).await?;
    }
    // An approval the controller did not write is no decision of its own:
    // never carried on from, removed and reported.
    let foreign = if anew {
        None
    } else {
        crate::controller::act::foreign::ignore(&stored, &mut ev, &ctx).await?
    };
    copy_sent_approval(&mut ev, &reports);
    let last_report = last_report.or_else(|| {
        ev.metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0))
    });
    let observed = observe(&ev, &built, &judged, &facts, &ctx, policy.trust_any_agent).await?;
    let Observation {
        mut seen,
        dissent,
        snapshots,
    } = observed;
    seen.last_report = last_report;
    let mut plan = plan::plan(&ev, &seen, &policy, now);
    // The approval is decided on each node's pods as the API server has
    // them now, not as the cache last showed them (a pod bound just before
    // the cordon may not be cached yet): one LIST a node, at the decision.
    if plan.decide_approval.is_some() && !ctx.dry_run && fresh_pods(&ev, &mut seen, &ctx).await? {
        debug!("A fresh read of the nodes' pods differs from the cache: planning again on it");
        plan = plan::plan(&ev, &seen, &policy, now);
    }
    // The notices each taking part pod should hold: of the spec's content
    // on its nodes, of a dissent's on its own (none once the event is over).
    let mut notices = if plan.phase.is_final() {
        Vec::new()
    } else {
        notice::desired(
            &ev.spec,
            plan.phase,
            plan.action,
            &seen.nodes,
            plan.acknowledgement.as_ref(),
        )
    };
    // Each dissenting node is handled on its own agent's report: its own
    // event type, duration and NotBefore decide its cordon and drain.
    for (spec, nodes) in dissent {
        // Their own record starts empty: the event's status (its phase,
        // its approval) is about the spec's content, not theirs.
        let mut theirs = ev.clone();
        theirs.spec = spec;
        theirs.status = None;
        let their_seen = Observed {
            nodes,
            dry_run: ctx.dry_run,
            ..Observed::default()
        };
        let their_plan = plan::plan(&theirs, &their_seen, &policy, now);
        if !their_plan.phase.is_final() {
            notices.extend(notice::desired(
                &theirs.spec,
                their_plan.phase,
                their_plan.action,
                &their_seen.nodes,
                their_plan.acknowledgement.as_ref(),
            ));
        }
        plan.node_writes.extend(their_plan.node_writes);
        plan.evictions.extend(their_plan.evictions);
        plan.kept.extend(their_plan.kept);
        plan.requeue = plan.requeue.min(their_plan.requeue);
        seen.nodes.extend(their_seen.nodes);
    }
    // Never while a node's own agent still lists the event: its report
    // would go with the object, and its hold with both.
    if plan.delete && !built.dissent_live() {
        delete(&ev, &reports, &ctx).await?;
        return Ok(Requeue::await_change());
    }
    let (outcomes, deferred) = if ctx.dry_run {
        (Vec::new(), 0)
    } else {
        // Notices first: a pod learns of the event before it is evicted.
        let writes = notice::writes(&name, notices, &ctx.pods.holders_of(&name));
        write_notices(&name, &writes, &ctx).await;
        write_nodes(&ev, &plan, &snapshots, &ctx).await?;
        // Cordon first, evict after: the pods of a node cordoned in this
        // pass are asked to leave from the next pass on (300 ms later), so
        // a pass over a 1,000-node event ends once its cordons are written
        // and the nodes reported meanwhile are cordoned at the next one.
        let cordoned_now: std::collections::HashSet<&str> = plan
            .node_writes
            .iter()
            .filter(|w| matches!(w, NodeWrite::Cordon { .. }))
            .map(NodeWrite::node)
            .collect();
        if cordoned_now.is_empty() {
            evict(&ev, &plan.evictions, &ctx).await
        } else {
            let now_evicted: Vec<crate::controller::decide::plan::Eviction> = plan
                .evictions
                .iter()
                .filter(|e| !cordoned_now.contains(e.node.as_str()))
                .cloned()
                .collect();
            let later = plan.evictions.len() - now_evicted.len();
            let (outcomes, deferred) = evict(&ev, &now_evicted, &ctx).await;
            (outcomes, deferred + later)
        }
    };
    let status::Next {
        mut status,
        not_listed,
    } = status::next(&ev, &seen, &plan, &outcomes, now);
    // `decidedAt` says when the decision was recorded, after this pass's
    // node writes and pod lists, not when the pass began (a pass over many
    // nodes takes seconds).
    if plan.decide_approval.is_some()
        && let Some(a) = status.approval.as_mut()
        && a.decided_at == Some(now)
    {
        a.decided_at = Some(Utc::now());
    }
    crate::controller::act::foreign::record(
        &mut status,
        ev.status.as_ref(),
        foreign.as_deref(),
        ev.metadata.generation,
        now,
    );
    // What happened to the nodes: restarts, and a freeze's heartbeat gap.
    crate::controller::observe::impact::observe_and_record(&ev, &mut status, &snapshots, &ctx, now);
    if ctx.dry_run {
        status::as_dry_run(&mut status, ev.status.as_ref(), &plan, now);
    }
    publish::report(
        &ev,
        stored.status.as_ref(),
        &plan,
        &status,
        &not_listed,
        &ctx,
    )
    .await?;
    // The Node condition of each node the event concerns or recorded (a
    // node whose part ended is no longer observed), from the live events
    // (this one as just written).
    let names: Vec<String> = seen
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .chain(status.nodes.iter().flatten().map(|r| r.name.clone()))
        .collect::<std::collections::BTreeSet<String>>()
        .into_iter()
        .collect();
    let mut fresh = ev.clone();
    fresh.status = Some(status);
    crate::controller::act::node_condition::sync(&ctx, &facts, Some(&fresh), &names).await;
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
            let passes = {
                let mut b = ctx
                    .blocked
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let n = b.entry(name.clone()).or_insert(0);
                *n = n.saturating_add(1);
                *n
            };
            if plan.polls_progress {
                blocked_backoff(passes)
            } else {
                plan.requeue.min(blocked_backoff(passes))
            }
        }
        None => {
            ctx.blocked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&name);
            plan.requeue
        }
    };
    // Evictions left for lack of time: the next pass, once the rate budget
    // has refilled a little.
    let requeue = if deferred > 0 {
        requeue.min(DEFERRED_REQUEUE)
    } else {
        requeue
    };
    // Never past what falls due (the drain deadline under `onDeadline:
    // Approve`), also while a blocked drain is looked at less often.
    let requeue = match plan.due {
        Some(due) => requeue.min(due.max(MIN_DUE_REQUEUE)),
        None => requeue,
    };
    Ok(Requeue::requeue(requeue))
}

/// Writes the notices (see [`notice`]); a failure is logged and counted,
/// and the write is tried again on a later pass (the approval waits for
/// the notice meanwhile, up to its deadline).
async fn write_notices(event: &str, writes: &[notice::NoticeWrite], ctx: &Context) {
    if writes.is_empty() {
        return;
    }
    for (w, outcome) in notice::write_all(&ctx.client, event, writes).await {
        let pod = w.pod.key();
        let label = match (&outcome, &w.notice) {
            (notice::WriteOutcome::Written, Some(value)) => {
                info!(%pod, notice = %value, "Notice written");
                "written"
            }
            (notice::WriteOutcome::Written, None) => {
                info!(%pod, "Notice removed");
                "removed"
            }
            (notice::WriteOutcome::Gone, _) => "gone",
            (notice::WriteOutcome::Failed(why), _) => {
                warn!(%pod, %why, "Could not write a notice; will retry");
                "failed"
            }
        };
        ctx.metrics.notice_writes.with_label_values(&[label]).inc();
    }
}

/// The pause before looking again at a drain that a PodDisruptionBudget
/// blocked on `passes` passes in a row: 1 s doubling to
/// [`MAX_BLOCKED_REQUEUE`] (a budget allows again once a replacement is
/// Ready, usually within seconds; a budget that stays shut costs a pass per
/// 16 s, not per second).
pub fn blocked_backoff(passes: u32) -> std::time::Duration {
    let exp = passes.saturating_sub(1).min(8);
    (BLOCKED_REQUEUE * (1u32 << exp)).min(MAX_BLOCKED_REQUEUE)
}

/// Reads the pods of each node whose pods this pass read from the cache
/// again from the API server (one LIST a node, side by side), replacing
/// them in `seen`. Returns whether any node's pods differ from the cache's.
async fn fresh_pods(ev: &ScheduledEvent, seen: &mut Observed, ctx: &Context) -> Result<bool> {
    let drains = ctx
        .policy()
        .decide(
            &ev.spec.event_type.as_str().into(),
            &ev.spec.event_source,
            ev.spec.duration_seconds,
        )
        .drains();
    if !drains {
        return Ok(false);
    }
    let wanted: Vec<(usize, String)> = seen
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| !n.vm_name.is_empty() && !n.ended)
        .map(|(i, n)| (i, n.name.clone()))
        .collect();
    let client = ctx.client.clone();
    let read: Vec<(usize, Vec<PodInfo>)> = if wanted.len() > LIST_PER_NODE_UP_TO {
        // Many nodes: one paginated list of every bound pod.
        let names: std::collections::HashSet<String> =
            wanted.iter().map(|(_, n)| n.clone()).collect();
        let mut by_node = drain::pods_by_node(&client, &names, drain::POD_LIST_PAGE).await?;
        wanted
            .into_iter()
            .map(|(i, n)| (i, by_node.remove(&n).unwrap_or_default()))
            .collect()
    } else {
        futures::stream::iter(wanted)
            .map(move |(i, node)| {
                let client = client.clone();
                async move { drain::pods_on(&client, &node).await.map(|p| (i, p)) }
            })
            .buffered(POD_LIST_CONCURRENCY)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()?
    };
    let mut changed = false;
    for (i, pods) in read {
        let mut pods: Vec<Arc<PodInfo>> = pods.into_iter().map(Arc::new).collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        if seen.nodes[i].pods != pods {
            changed = true;
            seen.nodes[i].pods = pods;
        }
    }
    Ok(changed)
}

/// Deletes an event past its retention, and the reports about it.
async fn delete(ev: &ScheduledEvent, reports: &[Report], ctx: &Context) -> Result<()> {
    let name = ev.name_any();
    ctx.blocked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&name);
    Api::<ScheduledEvent>::all(ctx.client.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|source| Error::DeleteEvent {
            name: name.clone(),
            source,
        })?;
    let api: Api<ScheduledEventReport> = Api::all(ctx.client.clone());
    for r in reports {
        let Some(object) = report_name(&name, &r.node) else {
            continue;
        };
        match api.delete(&object, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                warn!(report = %object, error = %e, "Could not delete a report of an expired event")
            }
        }
    }
    info!("Deleted ScheduledEvent past its retention, and its reports");
    Ok(())
}

/// Copies onto `ev`'s approval what the agents report of sending it: of the
/// POSTs that carried out this very decision (its appearance and digest),
/// the first IMDS accepted, else the latest. Only a sender's own word about
/// its own POST ever reads `Accepted`.
fn copy_sent_approval(ev: &mut ScheduledEvent, reports: &[Report]) {
    let Some(approval) = ev.status.as_mut().and_then(|s| s.approval.as_mut()) else {
        return;
    };
    let (Some(appearance), Some(digest)) = (approval.appearance, approval.digest.clone()) else {
        return;
    };
    let sent: Vec<(&str, &SentApproval)> = reports
        .iter()
        .flat_map(|r| r.approvals.iter().map(move |s| (r.node.as_str(), s)))
        .filter(|(_, s)| s.appearance == appearance && s.digest == digest)
        .collect();
    let pick = sent
        .iter()
        .filter(|(_, s)| s.status == 200)
        .min_by_key(|(_, s)| s.sent_at)
        .or_else(|| sent.iter().max_by_key(|(_, s)| s.sent_at));
    let Some((node, s)) = pick else {
        return;
    };
    approval.sent_at = Some(s.sent_at);
    approval.sent_by = Some((*node).to_owned());
    approval.result = Some(if s.status == 200 {
        crate::agent::approval::ACCEPTED.to_owned()
    } else {
        format!("Failed: IMDS answered {}: {}", s.status, s.body)
    });
}

/// What every event's pass reads from the caches once.
pub struct Facts {
    /// The node cache.
    pub nodes: Vec<Arc<Node>>,
    /// The reports taken into account, by event ([`crate::controller::observe::intake::admit`]).
    pub reports: ReportsByEvent,
    /// Every node's fixed VM (see [`nodes::identities`]).
    ids: nodes::Identities,
    /// The reports left out, counted.
    pub ignored: crate::controller::observe::intake::Ignored,
}

impl Facts {
    /// Reads the caches.
    pub fn read(ctx: &Context) -> Self {
        let nodes = ctx.nodes.state();
        let vm_reports = ctx.vm_reports.state();
        let fixed = fixed_vms(&vm_reports);
        // The reports taken into account: a node's reports about its own
        // fixed VM first (providerID's, else its VirtualMachineReport's).
        let (reports, ignored) = crate::controller::observe::intake::admit(
            ctx.reports.state(),
            crate::controller::observe::intake::MAX_LIVE_REPORTS_PER_NODE,
            |n| {
                nodes
                    .iter()
                    .find(|x| x.name_any() == n)
                    .and_then(|x| nodes::provider_vm(x))
                    .or_else(|| fixed.get(n).cloned())
            },
        );
        let ids = nodes::identities(
            nodes.iter().map(AsRef::as_ref),
            &fixed,
            &stated_vms(&reports),
        );
        Facts {
            nodes,
            reports,
            ignored,
            ids,
        }
    }

    /// The fixed VM of a node, if it has one (see [`nodes::identities`]).
    pub fn identity(&self, node: &str) -> Option<trust::Identity> {
        self.ids.of(node).cloned()
    }

    /// The name of a node's fixed VM, if it has one.
    pub fn vm_of(&self, node: &str) -> Option<String> {
        self.ids.of(node).map(|id| id.vm.clone())
    }

    /// How `resources` map to nodes.
    fn map(&self, resources: &[String]) -> nodes::Mapping {
        nodes::map_resources(resources, &self.ids)
    }
}

/// The contents an event's nodes are handled on: the spec's, then each
/// dissent's, with their digests.
fn contents(built: &trust::Built) -> Vec<(&ScheduledEventSpec, &str)> {
    std::iter::once((&built.spec, built.digest.as_str()))
        .chain(built.dissent.iter().map(|d| (&d.spec, d.digest.as_str())))
        .collect()
}

/// The other unfinished events that map to each node and whose policy
/// cordons it, from the controller's cache of `ScheduledEvent`s (an event
/// whose spec is over still claims the nodes whose own agents report it
/// live, see [`trust::Dissent`]). Only the events whose reports name one of
/// `vms` (lower case: the VMs of the nodes this pass handles) are judged: a
/// pass does not judge every event of the cluster.
fn claims(
    me: &str,
    vms: &std::collections::HashSet<String>,
    ctx: &Context,
    facts: &Facts,
) -> HashMap<String, Vec<String>> {
    let mut by_node: HashMap<String, Vec<String>> = HashMap::new();
    let policy = ctx.policy();
    for other in ctx.events.state() {
        let name = other.name_any();
        if name == me || !names_any(&facts.reports, &name, vms) {
            continue;
        }
        let (reports, _) = reports_about(&facts.reports, &name);
        let judged = trust::judge_reports(&reports, |n| facts.identity(n));
        let Some(built) = trust::build(&judged) else {
            continue;
        };
        let over = plan::is_over(&other);
        if over && !built.dissent_live() {
            continue;
        }
        let mut mapped = Vec::new();
        for (i, (spec, digest)) in contents(&built).into_iter().enumerate() {
            if i == 0 && over {
                continue;
            }
            let action = policy.decide(
                &spec.event_type.as_str().into(),
                &spec.event_source,
                spec.duration_seconds,
            );
            if action.cordons() {
                for (_, node) in facts.map(&spec.resources).mapped {
                    mapped.push((node, spec.appearance, digest.to_owned()));
                }
            }
        }
        // Only nodes the other event holds on trusted word (see `trust`).
        let assessment = trust::assess(
            &built,
            &judged,
            mapped.iter().map(|(n, ..)| n.as_str()),
            policy.trust_any_agent,
            |n| ctx.pods.agent_up(n),
        );
        for (node, appearance, digest) in mapped {
            if assessment
                .verdicts
                .get(&node)
                .is_some_and(|v| v.is_live_on(appearance, &digest))
            {
                let names = by_node.entry(node).or_default();
                if !names.contains(&name) {
                    names.push(name.clone());
                }
            }
        }
    }
    by_node
}

/// Whether a report about the event `name` names one of `vms` (lower case)
/// among its `Resources`: every node an event's content maps to is so named.
fn names_any(
    reports: &ReportsByEvent,
    name: &str,
    vms: &std::collections::HashSet<String>,
) -> bool {
    reports.get(name).is_some_and(|rs| {
        rs.iter().any(|r| {
            r.spec
                .report
                .resources
                .iter()
                .any(|vm| vms.contains(&vm.to_ascii_lowercase()))
        })
    })
}

/// What [`observe`] saw: the event's own view, the dissenting nodes with
/// the spec each is handled on, and the node objects read (node writes are
/// conditional on their `resourceVersion`).
struct Observation {
    seen: Observed,
    dissent: Vec<(ScheduledEventSpec, Vec<ObservedNode>)>,
    snapshots: HashMap<String, Arc<Node>>,
}

/// Reads, from the node cache, the nodes the event maps to and those that
/// still hold a cordon for it, and lists the pods of the mapped ones. Node
/// writes are conditional on the `resourceVersion` read here, so a stale
/// cache costs a 409 and a retry, never a wrong write.
///
/// A node that no trusted report confirms is not among the mapped nodes
/// (it is released if it holds the event's cordon), and is listed in
/// `Observed::unconfirmed`; a node whose own agent reports other content
/// than the spec is observed apart, with the spec it is handled on.
async fn observe(
    ev: &ScheduledEvent,
    built: &trust::Built,
    judged: &[trust::Judged<'_>],
    facts: &Facts,
    ctx: &Context,
    trust_any_agent: bool,
) -> Result<Observation> {
    let me = ev.name_any();
    let by_name: HashMap<String, &Arc<Node>> =
        facts.nodes.iter().map(|n| (n.name_any(), n)).collect();
    let contents = contents(built);
    let mappings: Vec<nodes::Mapping> = contents
        .iter()
        .map(|(spec, _)| facts.map(&spec.resources))
        .collect();
    let assessment = trust::assess(
        built,
        judged,
        mappings
            .iter()
            .flat_map(|m| m.mapped.iter().map(|(_, n)| n.as_str())),
        trust_any_agent,
        |n| ctx.pods.agent_up(n),
    );
    let nodes::Mapping {
        unmapped,
        mut doubts,
        ..
    } = mappings[0].clone();
    // Named in full for a few nodes; an event naming a thousand VMs must
    // not write a thousand reasons into its status.
    let unconfirmed = listed_at_most(&assessment.unconfirmed(), UNCONFIRMED_LISTED, "node(s)");
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
    let holds_it = |node: &str| {
        by_name
            .get(node)
            .is_some_and(|n| nodes::holds(n).contains(&me))
    };
    // (node, vm, which content, its own part ended) of every node handled,
    // each node once. A node whose own part ended while it holds the
    // event's cordon is handled with the event's own content: released
    // after the release delay (`plan::release_ended`).
    let mut wanted: Vec<(String, String, usize, bool)> = Vec::new();
    for (i, ((spec, digest), mapping)) in contents.iter().zip(&mappings).enumerate() {
        for (vm, node) in &mapping.mapped {
            let (take, content, ended) = match assessment.verdicts.get(node) {
                Some(v) if v.is_live_on(spec.appearance, digest) => (true, i, false),
                Some(trust::Verdict::Unconfirmed { .. }) => (i == 0 && holds_it(node), 0, false),
                Some(trust::Verdict::Ended { .. }) => (holds_it(node), 0, true),
                _ => (false, 0, false),
            };
            if take && !wanted.iter().any(|(w, ..)| w == node) {
                wanted.push((node.clone(), vm.clone(), content, ended));
            }
        }
    }
    for n in facts.nodes.iter().filter(|n| nodes::holds(n).contains(&me)) {
        let name = n.name_any();
        if wanted.iter().any(|(w, ..)| *w == name) {
            continue;
        }
        // A node whose VM the controller does not know (no providerID, and
        // its VirtualMachineReport not written yet, or gone with its agent's
        // pod until the new pod writes it again) while the event is live or
        // its own agent's last report lists it: it stays held as it is (and
        // no approval is decided, below). Without evidence either way, a
        // hold taken earlier (by an earlier version too) is kept, not
        // dropped for a moment; once the event is over it is released.
        let own_live = judged
            .iter()
            .any(|j| j.report.node == name && j.report.is_listed());
        if (own_live || !plan::is_over(ev)) && facts.identity(&name).is_none() {
            continue;
        }
        wanted.push((name, String::new(), 0, false));
    }
    // A node of the cluster whose agent lists the event while the
    // controller knows no VM of it may be one the event names: no approval
    // is decided until its VM is known.
    let unknown: Vec<&str> = judged
        .iter()
        .filter(|j| j.report.is_listed())
        .map(|j| j.report.node.as_str())
        .filter(|n| by_name.contains_key(*n) && facts.identity(n).is_none())
        .collect();
    if !unknown.is_empty() {
        doubts.push(format!(
            "the VM of node {} is unknown (no providerID, no VirtualMachineReport) while its agent lists the event",
            named(&unknown, UNCONFIRMED_LISTED, ", ")
        ));
    }
    // Only the spec's content can be over: a dissent is handled while its
    // node's own agent lists it.
    let completed = plan::is_over(ev);
    let recorded = ev
        .status
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .is_some_and(|n| !n.is_empty());
    let policy = ctx.policy();
    let drains: Vec<bool> = contents
        .iter()
        .map(|(spec, _)| {
            policy
                .decide(
                    &spec.event_type.as_str().into(),
                    &spec.event_source,
                    spec.duration_seconds,
                )
                .drains()
        })
        .collect();
    // The VMs a node handled here may go by (mapped, stated, providerID's).
    let vms: std::collections::HashSet<String> = wanted
        .iter()
        .flat_map(|(node, vm, ..)| [Some(vm.clone()), facts.vm_of(node)])
        .flatten()
        .filter(|vm| !vm.is_empty())
        .map(|vm| vm.to_ascii_lowercase())
        .collect();
    let claims = claims(&me, &vms, ctx, facts);
    // A finished event's record is frozen; pods are read only for nodes it
    // never recorded, so that the record says what was there. The lists
    // run side by side (an event may name hundreds of VMs), in order.
    let claims = &claims;
    let drains = &drains;
    let listed: Vec<Result<(ObservedNode, usize, Arc<Node>)>> =
        futures::stream::iter(wanted.into_iter().filter_map(|(name, vm, i, ended)| {
            // A node gone from the cache has nothing to drain or release.
            let node = Arc::clone(by_name.get(&name)?);
            Some((name, vm, i, ended, node))
        }))
        .map(|(name, vm, i, ended, node)| async move {
            let completed = completed && i == 0;
            let pods = if drains[i] && !vm.is_empty() && !ended && (!completed || !recorded) {
                ctx.pods.on_node(&name)
            } else {
                Vec::new()
            };
            let participants = if !vm.is_empty() && !ended && !completed {
                ctx.pods.participants_on(&name)
            } else {
                Vec::new()
            };
            let observed = ObservedNode {
                participants,
                cordoned: nodes::is_cordoned(&node),
                holds: nodes::holds(&node),
                claimed_by: claims.get(&name).cloned().unwrap_or_default(),
                name,
                vm_name: vm,
                pods,
                ended,
            };
            Ok((observed, i, node))
        })
        .buffered(POD_LIST_CONCURRENCY)
        .collect()
        .await;
    let deleted = ev
        .status
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .into_iter()
        .flatten()
        .filter(|n| !by_name.contains_key(&n.name))
        .map(|n| n.name.clone())
        .collect();
    let mut seen = Observed {
        nodes: Vec::new(),
        unmapped,
        doubts,
        unconfirmed,
        disagreement: built.disagreement(),
        last_report: None,
        deleted,
        dry_run: ctx.dry_run,
        fault_domains: None,
    };
    let mut dissent: Vec<(ScheduledEventSpec, Vec<ObservedNode>)> = contents[1..]
        .iter()
        .map(|(spec, _)| ((*spec).clone(), Vec::new()))
        .collect();
    let mut snapshots = HashMap::new();
    for item in listed {
        let (observed, i, node) = item?;
        snapshots.insert(observed.name.clone(), node);
        if i == 0 {
            seen.nodes.push(observed);
        } else {
            dissent[i - 1].1.push(observed);
        }
    }
    dissent.retain(|(_, nodes)| !nodes.is_empty());
    // Every node the event's Resources map to, trusted yet or not: where
    // the event lands, not what forewarn acts on.
    let domains: std::collections::BTreeSet<String> = mappings[0]
        .mapped
        .iter()
        .filter_map(|(_, n)| by_name.get(n))
        .filter_map(|n| crate::topology::fault_domain_of(n))
        .collect();
    seen.fault_domains = (!domains.is_empty()).then_some(domains.len());
    Ok(Observation {
        seen,
        dissent,
        snapshots,
    })
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

/// Carries out the plan's node writes, several nodes at once.
async fn write_nodes(
    ev: &ScheduledEvent,
    plan: &Plan,
    snapshots: &HashMap<String, Arc<Node>>,
    ctx: &Context,
) -> Result<()> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let exclude_lb = ctx.policy().exclude_from_load_balancers;
    let mut writes = Vec::new();
    for w in &plan.node_writes {
        let Some(node) = snapshots.get(w.node()).cloned() else {
            continue;
        };
        let (api, w) = (api.clone(), w.clone());
        writes.push(async move {
            let r = nodes::write_holds(&api, &node, w.holds(), w.unschedulable(), exclude_lb).await;
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
    // One Event on each node written, and one per kind of write on the
    // `ScheduledEvent` (naming the first few nodes when there are many): a
    // 1,000-node event posts about 1,000 Events, not 2,000.
    let mut by_reason: Vec<(&'static str, Vec<(&str, String)>)> = Vec::new();
    for w in &written {
        let (label, reason, note) = describe(ev, w);
        ctx.metrics.node_writes.with_label_values(&[label]).inc();
        if matches!(w, NodeWrite::Cordon { .. }) {
            ctx.metrics.cordoned(ev, Utc::now());
        }
        info!(node = w.node(), reason, "{note}");
        publish::publish(
            ctx,
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
        publish::publish(ctx, ev, Subject::Event, KubeEventType::Normal, reason, note);
    }
    first_error.map_or(Ok(()), Err)
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

/// How many pods or nodes an Event names before it counts the rest.
const NAMED_IN_EVENT: usize = 5;

/// Requests `evictions` for at most [`EVICTION_PASS`] and reports
/// each outcome; returns the outcomes and how many were deferred to the next
/// pass.
async fn evict(
    ev: &ScheduledEvent,
    evictions: &[crate::controller::decide::plan::Eviction],
    ctx: &Context,
) -> (Vec<Outcome>, usize) {
    let drain::Evicted { outcomes, deferred } = drain::evict_all(
        &ctx.evict_client,
        &ctx.limiter,
        evictions,
        ctx.per_node,
        tokio::time::Instant::now() + EVICTION_PASS,
    )
    .await;
    let planned: HashMap<(&str, &str), &crate::controller::decide::plan::Eviction> = evictions
        .iter()
        .map(|e| ((e.node.as_str(), e.pod.name.as_str()), e))
        .collect();
    // One Event per node and pass for the pods evicted from it (on the
    // `ScheduledEvent` and the node), and one per node and set of budgets
    // for those a budget refused, however many pods: a drain of 10,000 pods
    // posts hundreds of Events, not tens of thousands.
    let mut evicted: Vec<(&str, Vec<(String, i64)>)> = Vec::new();
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
        let Some(e) = planned.get(&(node.as_str(), pod.as_str())) else {
            continue;
        };
        let key = e.pod.key();
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
                warn!(node, pod = %key, %why, "Eviction failed; will retry")
            }
            EvictionOutcome::Gone => {}
        }
    }
    for (node, pods) in evicted {
        publish::publish(
            ctx,
            ev,
            Subject::Node(node),
            KubeEventType::Normal,
            "Evicted",
            evicted_note(node, &pods),
        );
    }
    for (node, budgets, message, pods) in blocked {
        let more = match pods.len() {
            1 => String::new(),
            n => format!(" and {} more", n - 1),
        };
        publish::publish(
            ctx,
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
    if deferred > 0 {
        debug!(
            deferred,
            asked = outcomes.len(),
            "The pass's time for evictions ran out: the rest in the next pass"
        );
    }
    (outcomes, deferred)
}

#[cfg(test)]
mod tests {
    use super::{blocked_backoff, evicted_note, nodes_note};
    use crate::api::ScheduledEvent;
    use crate::fixtures;
    use std::time::Duration;

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

    #[test]
    fn a_blocked_drain_is_looked_at_less_often_the_longer_it_stays_blocked() {
        let d: Vec<u64> = (1..=7).map(|n| blocked_backoff(n).as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 8, 16, 16, 16]);
        assert_eq!(blocked_backoff(u32::MAX), Duration::from_secs(16));
    }
}
