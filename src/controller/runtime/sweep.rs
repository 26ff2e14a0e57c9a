//! Releases cordons held for `ScheduledEvent`s that no longer exist
//! (deleted by hand before they completed), and removes the notices (and
//! acknowledgements) pods hold of them: forewarn never leaves a node
//! cordoned, or a notice standing, that nothing will remove. It also brings forewarn's other
//! marks on nodes in line: the load-balancer exclusion label after the
//! policy's `excludeFromLoadBalancers` changed, and the
//! `ForewarnScheduledEvent` condition of nodes no live event affects any
//! more, and the out-of-service taint forewarn put on a node that is Ready
//! again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tracing::{info, warn};

use crate::api::ScheduledEvent;
use crate::controller::act::cordon;
use crate::controller::act::notice;
use crate::controller::context::Context;
use crate::controller::observe::nodes;

/// How often nodes are checked for holds of deleted `ScheduledEvent`s.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

/// Runs at start and then every [`SWEEP_INTERVAL`] (in a dry run it only
/// forgets the bookkeeping of deleted events: it writes no node).
///
/// It lists `ScheduledEvent`s from the API server rather than reading the
/// controller's cache: an object deleted a moment ago may still be cached,
/// and one created a moment ago may not be yet; the API server's list is the
/// truth, and a hold is released only for a name it does not hold.
pub async fn sweep_orphaned_holds(ctx: Arc<Context>) {
    let api: Api<Node> = Api::all(ctx.writers.client.clone());
    let events: Api<ScheduledEvent> = Api::all(ctx.writers.client.clone());
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        tick.tick().await;
        ctx.forget_deleted_events();
        if ctx.writers.dry_run {
            continue;
        }
        let exclude_lb = ctx.policy().exclude_from_load_balancers;
        {
            let snapshot = ctx.caches.nodes.state();
            let names: HashSet<String> = snapshot.iter().map(|n| n.name_any()).collect();
            ctx.caches.boot_ids.retain(|n| names.contains(n));
            // Only on full caches: an event not listed yet would read as gone.
            if ctx.caches.synced() {
                let stale =
                    crate::controller::act::node_condition::nodes_with_condition_true(&snapshot);
                if !stale.is_empty() {
                    let facts = crate::controller::observe::facts::Facts::read(&ctx.caches);
                    crate::controller::act::node_condition::sync(
                        &ctx.writers,
                        &ctx.memory.node_conditions,
                        &ctx.caches,
                        &facts,
                        None,
                        &stale,
                    )
                    .await;
                }
            }
            sync_lb_labels(&api, &ctx.writers.written_marks, &snapshot, exclude_lb).await;
            crate::controller::act::out_of_service::untaint_returned(&ctx.writers, &snapshot).await;
        }
        // The nodes first, then the list: every hold in this snapshot was
        // written before the list was taken, by a reconcile of an event
        // that existed then, so the list holds that event unless it was
        // deleted since. Read the other way round, a hold written between
        // the list and the read (a new event's) would look orphaned.
        // Writes are conditional on the snapshot's resourceVersion.
        let snapshot = ctx.caches.nodes.state();
        if !snapshot.iter().any(|n| !crate::api::holds(n).is_empty()) {
            continue;
        }
        let Some(existing) = existing_events(&ctx, &events, "holds").await else {
            continue;
        };
        for node in snapshot {
            let holds = crate::api::holds(&node);
            let orphaned = nodes::orphaned_holds(&holds, |h| existing.contains(h));
            if orphaned.is_empty() {
                continue;
            }
            let name = node.name_any();
            let keep: Vec<String> = holds
                .iter()
                .filter(|h| !orphaned.contains(h))
                .cloned()
                .collect();
            let uncordon = (keep.is_empty() && nodes::is_cordoned(&node)).then_some(false);
            match cordon::write_holds(
                &api,
                &ctx.writers.written_marks,
                &node,
                &keep,
                uncordon,
                exclude_lb,
            )
            .await
            {
                // Written by an earlier sweep; the cache has not shown it yet.
                Ok(false) => {}
                Ok(true) => {
                    ctx.writers
                        .metrics
                        .node_writes
                        .with_label_values(&["uncordon"])
                        .inc();
                    info!(node = %name, events = ?orphaned, uncordoned = keep.is_empty(), "Released holds of ScheduledEvents that no longer exist");
                }
                // 409: the node changed; the next sweep looks again.
                Err(e) => {
                    warn!(node = %name, error = %e, "Could not release orphaned holds; will retry")
                }
            }
        }
    }
}

/// Removes the notices (and acknowledgements) pods hold of
/// `ScheduledEvent`s that no longer exist: once the pod cache is synced,
/// then every [`SWEEP_INTERVAL`] (never in a dry run, which writes no
/// notice). As for holds, the pods are read before the list of
/// `ScheduledEvent`s, and an object an agent still reports counts as
/// existing.
pub async fn sweep_orphaned_notices(ctx: Arc<Context>) {
    if ctx.writers.dry_run {
        return;
    }
    let events: Api<ScheduledEvent> = Api::all(ctx.writers.client.clone());
    while !ctx.caches.pods.ready() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        tick.tick().await;
        let holders = ctx.caches.pods.holders();
        if holders.is_empty() {
            continue;
        }
        let Some(existing) = existing_events(&ctx, &events, "notices").await else {
            continue;
        };
        remove_orphaned_notices(&ctx, &holders, |e| existing.contains(e)).await;
    }
}

/// The names of the `ScheduledEvent`s that count as existing for a sweep
/// of orphaned `what`: those the API server lists now, and those an agent
/// still reports listed (an object deleted by hand then is created again
/// by `spec::create_missing`, so what it holds stays). `None`, logged,
/// when the list fails: the sweep tries again next time.
async fn existing_events(
    ctx: &Context,
    api: &Api<ScheduledEvent>,
    what: &str,
) -> Option<HashSet<String>> {
    let mut names: HashSet<String> = match api.list_metadata(&ListParams::default()).await {
        Ok(list) => list.items.iter().map(ResourceExt::name_any).collect(),
        Err(e) => {
            warn!(error = %e, "Could not list ScheduledEvents to find orphaned {what}; will retry");
            return None;
        }
    };
    names.extend(
        ctx.caches
            .reports_by_event()
            .into_iter()
            .filter(|(_, rs)| rs.iter().any(|r| r.spec.report.is_listed()))
            .map(|(name, _)| name),
    );
    Some(names)
}

/// Removes from `holders` the notices and acknowledgements of events that
/// do not exist (`exists` says which do).
async fn remove_orphaned_notices(
    ctx: &Context,
    holders: &[Arc<crate::controller::observe::participants::Participant>],
    exists: impl Fn(&str) -> bool,
) {
    let mut orphaned: Vec<String> = holders
        .iter()
        .flat_map(|p| p.events())
        .filter(|e| !exists(e))
        .map(str::to_string)
        .collect();
    orphaned.sort();
    orphaned.dedup();
    for event in orphaned {
        let writes = notice::writes(&event, Vec::new(), holders);
        for (w, outcome) in notice::write_all(&ctx.writers.client, &event, &writes).await {
            let label = match outcome {
                notice::WriteOutcome::Written => {
                    info!(pod = %w.pod.key(), %event, "Removed the notice of a ScheduledEvent that no longer exists");
                    "removed"
                }
                notice::WriteOutcome::Gone => "gone",
                notice::WriteOutcome::Failed(why) => {
                    warn!(pod = %w.pod.key(), %event, %why, "Could not remove an orphaned notice; will retry");
                    "failed"
                }
            };
            ctx.writers
                .metrics
                .notice_writes
                .with_label_values(&[label])
                .inc();
        }
    }
}

/// Adds or removes the load-balancer exclusion label where the node's
/// holds and the policy call for it and no hold write did it (the policy
/// changed while nodes were held): one conditional write per such node.
async fn sync_lb_labels(
    api: &Api<Node>,
    versions: &cordon::WrittenMarks,
    snapshot: &[Arc<Node>],
    enabled: bool,
) {
    for node in snapshot {
        let holds = crate::api::holds(node);
        if cordon::lb_exclusion_for(node, !holds.is_empty(), enabled).is_none() {
            continue;
        }
        let name = node.name_any();
        match cordon::write_holds(api, versions, node, &holds, None, enabled).await {
            Ok(false) => {}
            Ok(true) => {
                info!(node = %name, enabled, "Load-balancer exclusion label brought in line with the policy")
            }
            // 409: the node changed; the next sweep looks again.
            Err(e) => {
                warn!(node = %name, error = %e, "Could not update the load-balancer exclusion label; will retry")
            }
        }
    }
}
