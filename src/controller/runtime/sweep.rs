//! The leader's housekeeping ([`housekeeping`]): it releases cordons held
//! for `ScheduledEvent`s that no longer exist (deleted by hand before they
//! completed), as an event's end does, and removes the notices (and
//! acknowledgements) pods hold of them ([`sweep_orphaned_notices`]):
//! forewarn never leaves a node cordoned, or a notice standing, that
//! nothing will remove. It also brings forewarn's other marks on nodes in
//! line: the load-balancer exclusion label after the policy's
//! `excludeFromLoadBalancers` changed, the `ForewarnScheduledEvent`
//! condition of nodes no live event affects any more, and the
//! out-of-service taint forewarn put on a node that is Ready again; and it
//! makes each node's `VirtualMachineReport` owned by its Node
//! ([`own_vm_reports`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

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

/// The leader's housekeeping, at start and then every [`SWEEP_INTERVAL`]
/// (sooner when an orphaned hold's release falls due), in named steps:
/// [`Context::forget_deleted_events`], [`retire_node_conditions`],
/// [`sync_lb_labels`], the out-of-service taints of nodes Ready again
/// ([`crate::controller::act::out_of_service::untaint_returned`]),
/// [`release_orphaned_holds`] and [`own_vm_reports`]. In a dry run only the
/// first: it writes nothing.
pub async fn housekeeping(ctx: Arc<Context>) {
    let api: Api<Node> = Api::all(ctx.writers.client.clone());
    let events: Api<ScheduledEvent> = Api::all(ctx.writers.client.clone());
    let mut orphans = Orphans::default();
    loop {
        ctx.forget_deleted_events();
        let mut next = SWEEP_INTERVAL;
        if !ctx.writers.dry_run {
            let snapshot = ctx.caches.nodes.state();
            let names: HashSet<String> = snapshot.iter().map(|n| n.name_any()).collect();
            ctx.caches.boot_ids.retain(|n| names.contains(n));
            retire_node_conditions(&ctx, &snapshot).await;
            let exclude_lb = ctx.policy().exclude_from_load_balancers;
            sync_lb_labels(&api, &ctx.writers.written_marks, &snapshot, exclude_lb).await;
            crate::controller::act::out_of_service::untaint_returned(&ctx.writers, &snapshot).await;
            if let Some(due) = release_orphaned_holds(&ctx, &api, &events, &mut orphans).await {
                next = next.min(due);
            }
            own_vm_reports(&ctx, &snapshot).await;
        }
        tokio::time::sleep(next.max(Duration::from_secs(1))).await;
    }
}

/// How many `VirtualMachineReport`s one sweep gives an owner at most: a
/// large cluster's first sweep after an upgrade spreads its writes.
const OWNER_WRITES_PER_SWEEP: usize = 200;

/// The owner reference `report` should carry and does not: its Node, by the
/// UID the node cache shows, so that Kubernetes' garbage collector deletes
/// the report with the node, and a node created again under the same name
/// (a new UID) does not inherit its predecessor's VM. None when it carries
/// it already, when the node has no UID, or when the report is older than
/// the node (written for an earlier node of that name: left to its
/// predecessor's owner reference, if any, and never given the new one).
/// Agents cannot add owner references (the chart's admission policy): one
/// naming a made-up UID would have the report collected at once, and
/// written again with another VM.
pub fn vm_report_owner(
    report: &crate::topology::VirtualMachineReport,
    node: &Node,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    let uid = node.metadata.uid.clone()?;
    let owned = report
        .owner_references()
        .iter()
        .any(|o| o.kind == "Node" && o.uid == uid);
    let older = match (
        report.metadata.creation_timestamp.as_ref(),
        node.metadata.creation_timestamp.as_ref(),
    ) {
        (Some(r), Some(n)) => r.0 < n.0,
        _ => false,
    };
    (!owned && !older).then(
        || k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.name_any(),
            uid,
            ..Default::default()
        },
    )
}

/// Gives each node's `VirtualMachineReport` its Node as owner
/// ([`vm_report_owner`]), at most [`OWNER_WRITES_PER_SWEEP`] a sweep, each
/// a merge patch conditional on the version cached (it replaces any owner
/// reference an earlier agent set: a cluster-scoped report owned by a
/// namespaced pod is never collected). Only on full caches.
async fn own_vm_reports(ctx: &Context, snapshot: &[Arc<Node>]) {
    if !ctx.caches.synced() {
        return;
    }
    let nodes: HashMap<String, &Arc<Node>> = snapshot.iter().map(|n| (n.name_any(), n)).collect();
    let api: Api<crate::topology::VirtualMachineReport> = Api::all(ctx.writers.client.clone());
    let wanted: Vec<_> = ctx
        .caches
        .vm_reports
        .state()
        .into_iter()
        .filter_map(|r| {
            let node = nodes.get(&r.name_any())?;
            vm_report_owner(&r, node).map(|o| (r, o))
        })
        .take(OWNER_WRITES_PER_SWEEP)
        .collect();
    for (report, owner) in wanted {
        let name = report.name_any();
        let body = serde_json::json!({"metadata": {
            "ownerReferences": [owner],
            "resourceVersion": report.resource_version(),
        }});
        match api
            .patch(
                &name,
                &crate::api::controller_patch_params(),
                &kube::api::Patch::Merge(&body),
            )
            .await
        {
            Ok(_) => {
                info!(node = %name, "The node's VirtualMachineReport is now owned by the node")
            }
            Err(e) => {
                warn!(node = %name, error = %e, "Could not make the node own its VirtualMachineReport; trying again at the next sweep")
            }
        }
    }
}

/// Sets the `ForewarnScheduledEvent` condition of nodes no live event
/// affects any more back (`snapshot`: the node cache), only on full caches:
/// an event not listed yet would read as gone.
async fn retire_node_conditions(ctx: &Context, snapshot: &[Arc<Node>]) {
    if !ctx.caches.synced() {
        return;
    }
    let stale = crate::controller::act::node_condition::nodes_with_condition_true(snapshot);
    if stale.is_empty() {
        return;
    }
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

/// When each orphaned hold (by node and event) was first seen so.
#[derive(Default)]
struct Orphans(HashMap<(String, String), Instant>);

/// What to write to a node with orphaned holds, as [`orphan_release`]
/// decides it.
#[derive(Debug, PartialEq, Eq)]
pub struct OrphanWrite {
    /// The hold list to write.
    pub holds: Vec<String>,
    /// `Some(false)` to uncordon.
    pub unschedulable: Option<bool>,
}

/// What to do with a node whose `holds` include `orphaned` ones (of events
/// that no longer exist), orphaned since `since` (the earliest), at `now`:
/// as a hold released at an event's end ([`crate::controller::decide::plan`]'s
/// release), the node goes to the live events that claim it
/// (`claimers`: their drain began on it and goes on), at once, and stays
/// cordoned; when nothing holds or claims it any more it is uncordoned
/// (when `cordoned`) once `release_delay` has passed since the hold was
/// first seen orphaned. `None` while the release waits.
pub fn orphan_release(
    holds: &[String],
    orphaned: &[String],
    claimers: &[String],
    cordoned: bool,
    since: Instant,
    release_delay: Duration,
    now: Instant,
) -> Option<OrphanWrite> {
    let mut keep: Vec<String> = holds
        .iter()
        .filter(|h| !orphaned.contains(h))
        .cloned()
        .collect();
    for c in claimers {
        if !keep.contains(c) {
            keep.push(c.clone());
        }
    }
    if !keep.is_empty() {
        return Some(OrphanWrite {
            holds: keep,
            unschedulable: None,
        });
    }
    if now.saturating_duration_since(since) < release_delay {
        return None;
    }
    Some(OrphanWrite {
        holds: keep,
        unschedulable: cordoned.then_some(false),
    })
}

/// The live events that claim each node: not over, their drain begun by
/// their own passes, and the node among those their status records as
/// handled (not ended there, not deleted).
fn claimers_by_node(ctx: &Context) -> HashMap<String, Vec<String>> {
    let mut by_node: HashMap<String, Vec<String>> = HashMap::new();
    for ev in ctx.caches.events.state() {
        if crate::controller::decide::plan::is_over(&ev)
            || !crate::controller::decide::plan::drain_began(&ev)
        {
            continue;
        }
        let name = ev.name_any();
        for r in ev.status.iter().flat_map(|s| s.nodes.iter().flatten()) {
            if r.ended_at.is_none() && r.deleted_at.is_none() && r.cordoned_by_us {
                by_node
                    .entry(r.name.clone())
                    .or_default()
                    .push(name.clone());
            }
        }
    }
    by_node
}

/// Releases holds of `ScheduledEvent`s that no longer exist (deleted by
/// hand before they completed): forewarn never leaves a node cordoned
/// that nothing will release ([`orphan_release`]). Returns how long until
/// a release that waits falls due, if one does.
///
/// It lists `ScheduledEvent`s from the API server rather than reading the
/// controller's cache: an object deleted a moment ago may still be cached,
/// and one created a moment ago may not be yet; the API server's list is the
/// truth, and a hold is released only for a name it does not hold.
async fn release_orphaned_holds(
    ctx: &Context,
    api: &Api<Node>,
    events: &Api<ScheduledEvent>,
    orphans: &mut Orphans,
) -> Option<Duration> {
    // The nodes first, then the list: every hold in this snapshot was
    // written before the list was taken, by a reconcile of an event
    // that existed then, so the list holds that event unless it was
    // deleted since. Read the other way round, a hold written between
    // the list and the read (a new event's) would look orphaned.
    // Writes are conditional on the snapshot's resourceVersion.
    let snapshot = ctx.caches.nodes.state();
    if !snapshot.iter().any(|n| !crate::api::holds(n).is_empty()) {
        orphans.0.clear();
        return None;
    }
    // The claims are read from the events' cache: before its first full
    // list, a live event would read as claiming nothing.
    if !ctx.caches.synced() {
        return Some(Duration::from_secs(1));
    }
    let existing = existing_events(ctx, events, "holds").await?;
    let exclude_lb = ctx.policy().exclude_from_load_balancers;
    let release_delay = Duration::from_secs(ctx.policy().release_delay_seconds);
    let claimers = claimers_by_node(ctx);
    let now = Instant::now();
    let mut seen = HashSet::new();
    let mut due: Option<Duration> = None;
    for node in snapshot {
        let holds = crate::api::holds(&node);
        let orphaned = nodes::orphaned_holds(&holds, |h| existing.contains(h));
        if orphaned.is_empty() {
            continue;
        }
        let name = node.name_any();
        let since = orphaned
            .iter()
            .map(|e| {
                seen.insert((name.clone(), e.clone()));
                *orphans.0.entry((name.clone(), e.clone())).or_insert(now)
            })
            .min()
            .unwrap_or(now);
        let claimed = claimers.get(&name).map_or(&[][..], Vec::as_slice);
        let Some(write) = orphan_release(
            &holds,
            &orphaned,
            claimed,
            nodes::is_cordoned(&node),
            since,
            release_delay,
            now,
        ) else {
            let left = release_delay.saturating_sub(now.saturating_duration_since(since));
            due = Some(due.map_or(left, |d| d.min(left)));
            continue;
        };
        match cordon::write_holds(
            api,
            &ctx.writers.written_marks,
            &node,
            &write.holds,
            write.unschedulable,
            exclude_lb,
        )
        .await
        {
            // Written by an earlier sweep; the cache has not shown it yet.
            Ok(false) => {}
            Ok(true) => {
                let action = if write.unschedulable.is_some() {
                    "uncordon"
                } else {
                    "release"
                };
                ctx.writers
                    .metrics
                    .node_writes
                    .with_label_values(&[action])
                    .inc();
                info!(node = %name, events = ?orphaned, holds = ?write.holds, uncordoned = write.unschedulable.is_some(),
                    "Released holds of ScheduledEvents that no longer exist");
            }
            // 409: the node changed; the next sweep looks again.
            Err(e) => {
                warn!(node = %name, error = %e, "Could not release orphaned holds; will retry")
            }
        }
    }
    orphans.0.retain(|k, _| seen.contains(k));
    due
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

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_orphaned_hold_goes_to_the_claimers_at_once_and_is_released_after_the_delay() {
        let t0 = Instant::now();
        let delay = Duration::from_secs(5);
        // Another event's hold stays: the orphan's is dropped at once.
        assert_eq!(
            orphan_release(
                &names(&["gone", "b"]),
                &names(&["gone"]),
                &[],
                true,
                t0,
                delay,
                t0
            ),
            Some(OrphanWrite {
                holds: names(&["b"]),
                unschedulable: None
            })
        );
        // A live event whose drain holds the node (it has not written its
        // hold) gets it, at once: the node stays cordoned.
        assert_eq!(
            orphan_release(
                &names(&["gone"]),
                &names(&["gone"]),
                &names(&["c"]),
                true,
                t0,
                delay,
                t0
            ),
            Some(OrphanWrite {
                holds: names(&["c"]),
                unschedulable: None
            })
        );
        // Nothing else holds or claims it: uncordoned once the release
        // delay has passed, not before.
        let alone = |now| {
            orphan_release(
                &names(&["gone"]),
                &names(&["gone"]),
                &[],
                true,
                t0,
                delay,
                now,
            )
        };
        assert_eq!(alone(t0), None);
        assert_eq!(alone(t0 + delay - Duration::from_millis(1)), None);
        assert_eq!(
            alone(t0 + delay),
            Some(OrphanWrite {
                holds: vec![],
                unschedulable: Some(false)
            })
        );
        // A node someone uncordoned meanwhile: the hold goes, nothing else.
        assert_eq!(
            orphan_release(
                &names(&["gone"]),
                &names(&["gone"]),
                &[],
                false,
                t0,
                delay,
                t0 + delay
            ),
            Some(OrphanWrite {
                holds: vec![],
                unschedulable: None
            })
        );
    }

    /// A node's `VirtualMachineReport` is given its Node, by UID, as owner;
    /// not again once it has it; never when the report is older than the
    /// node (an earlier node's of the same name).
    #[test]
    fn a_vm_report_is_owned_by_its_node_of_the_same_age_or_older() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let time =
            |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + s).unwrap());
        let mut node = Node::default();
        node.metadata.name = Some("node-1".into());
        node.metadata.uid = Some("uid-1".into());
        node.metadata.creation_timestamp = Some(time(0));
        let mut report = crate::topology::VirtualMachineReport::new(
            "node-1",
            crate::topology::VirtualMachineReportSpec {
                node: "node-1".into(),
                vm: "vm_1".into(),
                platform_fault_domain: String::new(),
                platform_update_domain: String::new(),
            },
        );
        report.metadata.creation_timestamp = Some(time(5));
        let owner = vm_report_owner(&report, &node).expect("an owner");
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Node", "node-1", "uid-1")
        );
        report.metadata.owner_references = Some(vec![owner]);
        assert_eq!(vm_report_owner(&report, &node), None, "owned already");
        // The node was created again under the same name (a new UID): the
        // report, older than it, is its predecessor's.
        node.metadata.uid = Some("uid-2".into());
        node.metadata.creation_timestamp = Some(time(60));
        assert_eq!(vm_report_owner(&report, &node), None);
        // A report written after the new node was: given the new owner.
        report.metadata.creation_timestamp = Some(time(61));
        assert_eq!(
            vm_report_owner(&report, &node).map(|o| o.uid),
            Some("uid-2".into())
        );
    }
}
