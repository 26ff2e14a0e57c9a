//! The controller: for every `ScheduledEvent`, cordon and drain the affected
//! nodes, decide the approval once they are drained, and uncordon them when
//! the event is over. Runs only while it holds the leader-election Lease.
//!
//! Each reconcile reads as observe -> plan -> act -> report; [`plan`] is pure.

pub mod drain;
pub mod nodes;
pub mod plan;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use kube_lease_manager::LeaseManagerBuilder;
use prometheus::Registry;
use serde_json::json;
use tracing::{info, instrument, warn};

use crate::cli::ControllerArgs;
use crate::crd::{
    CONTROLLER_MANAGER, CORDONED_FOR_ANNOTATION, Phase, ScheduledEvent, ScheduledEventStatus,
};
use crate::imds::model::EventStatus;
use crate::metrics::{ControllerMetrics, type_label};
use crate::policy::Policy;
use crate::server::{self, Readiness};
use plan::{EvictionOutcome, NodeWrite, Observed, ObservedNode, Plan};

/// Errors of one reconcile; all are retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading a node failed.
    #[error("failed to get node {node}: {source}")]
    GetNode {
        /// Node name.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Cordoning, uncordoning or recording a hold failed (409: someone wrote
    /// the node since it was read; retried at once).
    #[error("failed to patch node {node}: {source}")]
    PatchNode {
        /// Node name.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Listing a node's pods failed.
    #[error(transparent)]
    ListPods(#[from] drain::Error),
    /// Writing the status failed.
    #[error("failed to patch status of ScheduledEvent {name}: {source}")]
    PatchStatus {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Deleting an expired object failed.
    #[error("failed to delete ScheduledEvent {name}: {source}")]
    DeleteEvent {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What every reconcile shares.
pub struct Context {
    client: Client,
    /// A client that does not retry 429s itself, for evictions (see [`drain::evict`]).
    evict_client: Client,
    nodes: Store<Node>,
    policy: Policy,
    recorder: Recorder,
    metrics: ControllerMetrics,
    per_node: usize,
}

/// Runs the controller until SIGTERM: waits for the Lease, then reconciles;
/// exits (to be restarted) if the Lease is lost.
///
/// # Errors
/// A bad policy file, no Kubernetes configuration, or a metrics address that
/// cannot be bound; all later failures are retried.
pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let policy = match &args.policy_file {
        Some(path) => Policy::load(&path.to_string_lossy())?,
        None => Policy::default(),
    };
    let config = kube::Config::infer().await?;
    let client = Client::try_from(config.clone())?;
    let mut evict_config = config;
    evict_config.default_retry = false;
    let evict_client = Client::try_from(evict_config)?;

    let registry = Registry::new();
    let metrics = ControllerMetrics::register(&registry)?;
    let ready = Readiness::default();
    server::spawn(args.metrics_addr, registry, ready.clone()).await?;

    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "forewarn".into());
        format!("{host}-{}", std::process::id())
    });
    let shutdown = crate::cli::shutdown_signal();
    tokio::pin!(shutdown);

    // The API server may not answer yet (a restarting control plane): keep
    // trying instead of crash-looping.
    let build_lease = || {
        LeaseManagerBuilder::new(client.clone(), &args.lease_name)
            .with_namespace(&args.lease_namespace)
            .with_identity(&identity)
            .with_duration(15)
            .with_grace(5)
            .with_field_manager(CONTROLLER_MANAGER)
            .build()
    };
    let lease = tokio::select! {
        _ = &mut shutdown => return Ok(()),
        lease = build_lease
            .retry(ExponentialBuilder::default().with_max_delay(Duration::from_secs(30)).without_max_times())
            .notify(|e, d| warn!(error = %e, retry_in = ?d, "Cannot set up the leader-election Lease yet")) => lease?,
    };
    let (mut leader, lease_task) = lease.watch().await;
    info!(%identity, lease = %args.lease_name, namespace = %args.lease_namespace, "Waiting for leadership");
    loop {
        if *leader.borrow_and_update() {
            break;
        }
        tokio::select! {
            _ = &mut shutdown => {
                drop(leader);
                let _ = lease_task.await;
                return Ok(());
            }
            changed = leader.changed() => changed?,
        }
    }
    info!(%identity, ?policy, "Leading: reconciling ScheduledEvents");

    let (nodes, writer) = reflector::store();
    let node_stream = reflector::reflector(
        writer,
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .touched_objects()
    .for_each(|r| async {
        if let Err(e) = r {
            warn!(error = %e, "Node watch error (retrying)");
        }
    });
    let node_task = tokio::spawn(node_stream);
    nodes.wait_until_ready().await?;

    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER_MANAGER.into(),
                instance: Some(identity.clone()),
            },
        ),
        client: client.clone(),
        evict_client,
        nodes,
        policy,
        metrics,
        per_node: usize::from(args.max_evictions_per_node),
    });
    ready.set(true);

    let lost = async move {
        while leader.changed().await.is_ok() {
            if !*leader.borrow_and_update() {
                break;
            }
        }
        leader
    };
    let controller = Controller::new(
        Api::<ScheduledEvent>::all(client),
        watcher::Config::default(),
    );
    let sweep = tokio::spawn(sweep_orphaned_holds(ctx.clone()));
    let controller = controller
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                warn!(error = %e, "Reconcile failed");
            }
        });
    let outcome = tokio::select! {
        _ = &mut shutdown => Ok(()),
        leader = lost => {
            drop(leader);
            Err(anyhow::anyhow!("lost the leader-election Lease; exiting so that a fresh process takes over"))
        }
        _ = controller => Ok(()),
    };
    node_task.abort();
    sweep.abort();
    ready.set(false);
    let _ = lease_task.await;
    info!("Controller stopped");
    outcome
}

/// How often nodes are checked for holds of deleted `ScheduledEvent`s.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

/// Releases cordons held for `ScheduledEvent`s that no longer exist (deleted
/// by hand before they completed), at start and then every [`SWEEP_INTERVAL`]:
/// forewarn never leaves a node cordoned that nothing will release.
///
/// It lists `ScheduledEvent`s from the API server rather than reading the
/// controller's cache: kube-runtime's `Store::wait_until_ready` keeps only one
/// waiter's waker, and the controller itself waits on that store.
async fn sweep_orphaned_holds(ctx: Arc<Context>) {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let events: Api<ScheduledEvent> = Api::all(ctx.client.clone());
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        tick.tick().await;
        if !ctx
            .nodes
            .state()
            .iter()
            .any(|n| !nodes::holds(n).is_empty())
        {
            continue;
        }
        let existing: HashSet<String> = match events.list_metadata(&ListParams::default()).await {
            Ok(list) => list.items.iter().map(ResourceExt::name_any).collect(),
            Err(e) => {
                warn!(error = %e, "Could not list ScheduledEvents to find orphaned holds; will retry");
                continue;
            }
        };
        for node in ctx.nodes.state() {
            let holds = nodes::holds(&node);
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
            let rv = node.resource_version().unwrap_or_default();
            match write_holds(&api, &name, &rv, &keep, uncordon).await {
                Ok(_) => {
                    ctx.metrics
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

/// Writes a node's hold list (`forewarn.dev/cordoned-for`; removed when
/// empty) and, if given, `spec.unschedulable`, in one merge patch made
/// conditional by `resource_version`: two writers editing one node's hold
/// list cannot lose each other's entry (the loser gets a 409 and retries).
async fn write_holds(
    api: &Api<Node>,
    node: &str,
    resource_version: &str,
    holds: &[String],
    unschedulable: Option<bool>,
) -> Result<(), kube::Error> {
    let annotation = if holds.is_empty() {
        json!(null)
    } else {
        json!(holds.join(","))
    };
    let mut body = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { CORDONED_FOR_ANNOTATION: annotation },
        }
    });
    if let Some(u) = unschedulable {
        body["spec"] = json!({ "unschedulable": u });
    }
    api.patch(node, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map(|_| ())
}

fn error_policy(ev: Arc<ScheduledEvent>, err: &Error, ctx: Arc<Context>) -> Requeue {
    ctx.metrics.reconciles.with_label_values(&["error"]).inc();
    warn!(event = %ev.name_any(), error = %err, "Reconcile error; retrying");
    let conflict =
        matches!(err, Error::PatchNode { source: kube::Error::Api(s), .. } if s.code == 409);
    Requeue::requeue(if conflict {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(3)
    })
}

/// One pass over one event: observe -> plan -> act -> report.
///
/// # Errors
/// Any failed read or write; the controller retries after a short delay.
#[instrument(skip_all, fields(event = %ev.name_any()))]
pub async fn reconcile(ev: Arc<ScheduledEvent>, ctx: Arc<Context>) -> Result<Requeue> {
    let now = Utc::now();
    let (seen, versions) = observe(&ev, &ctx).await?;
    let plan = plan::plan(&ev, &seen, &ctx.policy, now);
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
    let outcomes = act(&ev, &plan, &versions, &ctx).await?;
    let status = plan::next_status(&ev, &seen, &plan, &outcomes, now);
    report(&ev, &plan, &status, &ctx).await?;
    ctx.metrics.reconciles.with_label_values(&["ok"]).inc();
    Ok(Requeue::requeue(plan.requeue))
}

/// Reads the nodes the event maps to (fresh from the API server, since the
/// cordon decision must not rest on a stale cache), the nodes that still
/// hold a cordon for it, and the pods that must leave the mapped ones.
async fn observe(
    ev: &ScheduledEvent,
    ctx: &Context,
) -> Result<(Observed, HashMap<String, String>)> {
    let me = ev.name_any();
    let cached = ctx.nodes.state();
    let (mapped, unmapped) =
        nodes::map_resources(&ev.spec.resources, cached.iter().map(|n| n.as_ref()));
    let completed = EventStatus::from(ev.spec.event_status.as_str()) == EventStatus::Completed;
    let action = ctx.policy.decide(
        &ev.spec.event_type.as_str().into(),
        &ev.spec.event_source,
        ev.spec.duration_seconds,
    );
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut seen = Observed {
        nodes: Vec::new(),
        unmapped,
    };
    let mut versions = HashMap::new();
    let mut wanted: Vec<(String, String)> =
        mapped.into_iter().map(|(vm, node)| (node, vm)).collect();
    for n in cached.iter().filter(|n| nodes::holds(n).contains(&me)) {
        let name = n.name_any();
        if !wanted.iter().any(|(w, _)| *w == name) {
            wanted.push((name, String::new()));
        }
    }
    for (name, vm) in wanted {
        let Some(node) = api.get_opt(&name).await.map_err(|source| Error::GetNode {
            node: name.clone(),
            source,
        })?
        else {
            continue; // gone: nothing to drain or release
        };
        let pods = if action.drains() && !completed && !vm.is_empty() {
            drain::pods_to_drain(&ctx.client, &name).await?
        } else {
            Vec::new()
        };
        versions.insert(name.clone(), node.resource_version().unwrap_or_default());
        seen.nodes.push(ObservedNode {
            cordoned: nodes::is_cordoned(&node),
            holds: nodes::holds(&node),
            name,
            vm_name: vm,
            pods,
        });
    }
    Ok((seen, versions))
}

/// Carries out the plan's node writes and evictions; returns the evictions' outcomes.
async fn act(
    ev: &ScheduledEvent,
    plan: &Plan,
    versions: &HashMap<String, String>,
    ctx: &Context,
) -> Result<Vec<(String, String, EvictionOutcome)>> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    for w in &plan.node_writes {
        let node = w.node();
        let (holds, unschedulable) = match w {
            NodeWrite::Cordon { holds, .. } | NodeWrite::AddHold { holds, .. } => {
                (holds, Some(true))
            }
            NodeWrite::Release {
                holds, uncordon, ..
            } => (holds, uncordon.then_some(false)),
        };
        write_holds(
            &api,
            node,
            versions.get(node).map_or("", String::as_str),
            holds,
            unschedulable,
        )
        .await
        .map_err(|source| Error::PatchNode {
            node: node.into(),
            source,
        })?;
        let (action, reason, note) = match w {
            NodeWrite::Cordon { .. } => (
                "cordon",
                "Cordoned",
                format!(
                    "Cordoned {node} for {} {}",
                    ev.spec.event_type,
                    ev.name_any()
                ),
            ),
            NodeWrite::AddHold { .. } => (
                "cordon",
                "CordonShared",
                format!(
                    "{node} stays cordoned, now also for {} {}",
                    ev.spec.event_type,
                    ev.name_any()
                ),
            ),
            NodeWrite::Release { uncordon: true, .. } => (
                "uncordon",
                "Uncordoned",
                format!(
                    "Uncordoned {node}: {} {} is over",
                    ev.spec.event_type,
                    ev.name_any()
                ),
            ),
            NodeWrite::Release { .. } => (
                "uncordon",
                "CordonReleased",
                format!(
                    "Released {}'s hold on {node}; other events keep it cordoned",
                    ev.name_any()
                ),
            ),
        };
        ctx.metrics.node_writes.with_label_values(&[action]).inc();
        info!(node, reason, "{note}");
        publish(
            ctx,
            ev,
            Subject::Node(node),
            KubeEventType::Normal,
            reason,
            note,
        )
        .await;
    }
    let outcomes = drain::evict_all(&ctx.evict_client, &plan.evictions, ctx.per_node).await;
    for (node, pod, outcome) in &outcomes {
        let label = match outcome {
            EvictionOutcome::Evicted => "evicted",
            EvictionOutcome::Blocked(_) => "blocked",
            EvictionOutcome::Gone => "gone",
            EvictionOutcome::Failed(_) => "error",
        };
        ctx.metrics.evictions.with_label_values(&[label]).inc();
        let ns = plan
            .evictions
            .iter()
            .find(|e| e.pod.name == *pod && e.node == *node)
            .map(|e| e.pod.namespace.as_str())
            .unwrap_or_default();
        match outcome {
            EvictionOutcome::Evicted => {
                info!(node, pod = %format!("{ns}/{pod}"), "Evicted pod");
                publish(
                    ctx,
                    ev,
                    Subject::Pod(ns, pod),
                    KubeEventType::Normal,
                    "Evicted",
                    format!("Evicted {ns}/{pod} from {node}"),
                )
                .await;
            }
            EvictionOutcome::Blocked(why) => {
                info!(node, pod = %format!("{ns}/{pod}"), %why, "Eviction blocked; will retry");
                publish(
                    ctx,
                    ev,
                    Subject::Pod(ns, pod),
                    KubeEventType::Warning,
                    "EvictionBlocked",
                    format!("Eviction of {ns}/{pod} from {node} blocked: {why}"),
                )
                .await;
            }
            EvictionOutcome::Failed(why) => {
                warn!(node, pod = %format!("{ns}/{pod}"), %why, "Eviction failed; will retry");
            }
            EvictionOutcome::Gone => {}
        }
    }
    Ok(outcomes)
}

/// Writes the status (only when it changed) and the Events that mark progress.
async fn report(
    ev: &ScheduledEvent,
    plan: &Plan,
    status: &ScheduledEventStatus,
    ctx: &Context,
) -> Result<()> {
    let name = ev.name_any();
    let mut prev = ev.status.clone().unwrap_or_default();
    if let Some(a) = prev.approval.as_mut() {
        a.sent_at = None;
        a.sent_by = None;
        a.result = None;
    }
    if prev == *status {
        return Ok(());
    }
    let body = json!({
        "apiVersion": ScheduledEvent::api_version(&()),
        "kind": ScheduledEvent::kind(&()),
        "status": status,
    });
    Api::<ScheduledEvent>::all(ctx.client.clone())
        .patch_status(
            &name,
            &PatchParams::apply(CONTROLLER_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| Error::PatchStatus {
            name: name.clone(),
            source,
        })?;

    let prev_nodes = prev.nodes.clone().unwrap_or_default();
    for n in status.nodes.iter().flatten() {
        let before = prev_nodes.iter().find(|p| p.name == n.name);
        if n.drained_at.is_some()
            && before.and_then(|b| b.drained_at).is_none()
            && !plan.phase.is_final()
        {
            info!(node = %n.name, "Node drained");
            publish(
                ctx,
                ev,
                Subject::Node(&n.name),
                KubeEventType::Normal,
                "Drained",
                format!("{} drained for {} {name}", n.name, ev.spec.event_type),
            )
            .await;
        }
    }
    if plan.decide_approval.is_some() {
        ctx.metrics
            .approvals_decided
            .with_label_values(&[type_label(&ev.spec.event_type)])
            .inc();
        let reason = plan.decide_approval.clone().unwrap_or_default();
        info!(%reason, "Approval decided");
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Normal,
            "ApprovalDecided",
            format!("Approval of {name} decided: {reason}; an agent will send it to IMDS"),
        )
        .await;
    }
    let prev_phase = prev.phase.clone().unwrap_or_default();
    let phase = plan.phase.as_str();
    if prev_phase != phase {
        info!(from = %prev_phase, to = %phase, "Phase changed");
        let incomplete = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "DrainIncomplete" && c.status == "True");
        match plan.phase {
            Phase::Started if incomplete => {
                ctx.metrics
                    .drains_incomplete
                    .with_label_values(&[type_label(&ev.spec.event_type)])
                    .inc();
                publish(
                    ctx,
                    ev,
                    Subject::Event,
                    KubeEventType::Warning,
                    "DrainIncomplete",
                    format!("{name} started before its nodes were drained"),
                )
                .await;
            }
            Phase::Started | Phase::Completed | Phase::Cancelled | Phase::Ignored => {
                publish(
                    ctx,
                    ev,
                    Subject::Event,
                    KubeEventType::Normal,
                    phase,
                    format!("{} {name} is {}", ev.spec.event_type, phase.to_lowercase()),
                )
                .await;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Publishes a Kubernetes Event on the `ScheduledEvent`, and on the node if given.
/// Events are best effort: a failure is logged, never fails the reconcile.
/// What an Event is about besides the `ScheduledEvent` itself.
enum Subject<'a> {
    /// Only the `ScheduledEvent`.
    Event,
    /// A node: the Event goes on the node too, each naming the other as related.
    Node(&'a str),
    /// A pod (namespace, name), named as related so that each pod's Events
    /// are kept apart instead of folded into one series.
    Pod(&'a str, &'a str),
}

async fn publish(
    ctx: &Context,
    ev: &ScheduledEvent,
    subject: Subject<'_>,
    type_: KubeEventType,
    reason: &str,
    note: String,
) {
    let node = match subject {
        Subject::Node(name) => ctx.nodes.get(&reflector::ObjectRef::new(name)),
        _ => None,
    };
    let related = match subject {
        Subject::Event => None,
        Subject::Node(_) => node.as_ref().map(|n| n.object_ref(&())),
        Subject::Pod(namespace, name) => Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            ..ObjectReference::default()
        }),
    };
    let event = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: related,
    };
    if let Err(e) = ctx.recorder.publish(&event, &ev.object_ref(&())).await {
        warn!(error = %e, reason, "Could not publish an Event");
    }
    if let Some(n) = node {
        let on_node = KubeEvent {
            secondary: Some(ev.object_ref(&())),
            ..event
        };
        if let Err(e) = ctx.recorder.publish(&on_node, &n.object_ref(&())).await {
            warn!(error = %e, reason, "Could not publish an Event on the node");
        }
    }
}
