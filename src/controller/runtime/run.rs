//! Wiring of the controller role: clients, metrics server, node cache,
//! leader election, and the kube-runtime `Controller` over `ScheduledEvent`s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::Api;
use kube::client::ClientBuilder;
use kube::runtime::controller::{self, Action as Requeue, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::watcher;
use prometheus::Registry;
use tracing::{info, warn};

use crate::api::{CONTROLLER_MANAGER, ScheduledEvent, ScheduledEventReport};
use crate::cli::ControllerArgs;
use crate::controller::act::drain;
use crate::controller::act::spec;
use crate::controller::act::writers::Writers;
use crate::controller::context::{Context, Memory};
use crate::controller::error::Error;
use crate::controller::observe::caches::Caches;
use crate::controller::observe::watch::{cache, watch_backoff};
use crate::controller::reconcile::reconcile;
use crate::controller::runtime::lease;
use crate::controller::runtime::reload;
use crate::controller::runtime::sweep;
use crate::kubeclient::{self, Clients};
use crate::metrics::controller::ControllerMetrics;
use crate::policy::Policy;
use crate::server::{self, Liveness, Readiness};
use crate::topology::VirtualMachineReport;

/// The longest a failing reconcile waits before it is tried again.
const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(60);

/// How long a stopping controller still delivers the webhook notifications
/// it has queued (well within the pod's 30 s termination grace period).
const WEBHOOK_FLUSH: Duration = Duration::from_secs(5);

/// How often the controller's runtime beats its liveness.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// How long the runtime may go without a beat before `/healthz` fails: far
/// beyond any pause a busy 2-core machine gives a task (the chart's
/// liveness probe then fails three times, 10 s apart, before a restart).
pub const HEARTBEAT_ALLOWED: Duration = Duration::from_secs(15);

/// Runs the controller until SIGTERM: keeps a node cache (ready once it is
/// synced, leader or not), waits for the Lease, then reconciles; exits (to
/// be restarted) if the Lease is lost, and releases it on SIGTERM so that a
/// standby takes over at once.
///
/// # Errors
/// A bad policy file, no Kubernetes configuration, or a metrics address that
/// cannot be bound; all later failures are retried.
pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let (policy, policy_text) = match &args.policy_file {
        Some(path) => {
            let shown = path.to_string_lossy();
            let text =
                std::fs::read_to_string(path).map_err(|source| crate::policy::Error::Read {
                    path: shown.to_string(),
                    source,
                })?;
            (Policy::parse(&text, &shown)?, text)
        }
        None => (Policy::default(), String::new()),
    };
    let (webhooks_config, webhooks_text) = match &args.webhooks_file {
        Some(path) => crate::notify::config::Config::load_text(&path.to_string_lossy())?,
        None => Default::default(),
    };
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "forewarn".into());
        format!("{host}-{}", std::process::id())
    });
    let config = kubeclient::request_config(kube::Config::infer().await?, "controller", &identity)?;
    let clients = Clients::from_request_config(config.clone())?;

    let registry = Registry::new();
    let metrics = ControllerMetrics::register(&registry)?;
    let ready = Readiness::default();
    // `/healthz` fails when the runtime that runs the reconciles has not
    // run this heartbeat for [`HEARTBEAT_ALLOWED`] (every worker blocked or
    // starved): the kubelet restarts the process. An API server that is
    // down does not count (restarting would not mend it); a leader that
    // cannot renew its Lease exits on its own (see `lease`).
    let live = Liveness::new(HEARTBEAT_ALLOWED);
    let heartbeat = tokio::spawn({
        let live = live.clone();
        async move {
            loop {
                live.beat(HEARTBEAT_ALLOWED);
                tokio::time::sleep(HEARTBEAT_EVERY).await;
            }
        }
    });
    // Tokens are reviewed through the unguarded request client: a standby
    // answers its scrapes too.
    let access = server::Access::new(args.metrics_auth, &clients.requests, &metrics.metrics_auth);
    server::spawn(
        args.metrics_addr,
        registry,
        ready.clone(),
        Some(live),
        access,
    )
    .await?;

    let shutdown = crate::cli::shutdown_signal();
    tokio::pin!(shutdown);

    // The installed CRDs must carry every field this version writes and
    // reads, or the API server would silently drop them: exit with the
    // command that mends it (see `crds`). Before the Lease: a replica that
    // cannot work never leads.
    let needs = crate::api::install::controller_needs();
    tokio::select! {
        _ = &mut shutdown => return Ok(()),
        r = crate::api::install::require(&clients.requests, &needs, "controller", || {}) => r?,
    }

    // Leader election on a thread of its own (see `lease`); every write of
    // this process passes its guard.
    let election = lease::spawn(
        config.clone(),
        &args.lease_namespace,
        &args.lease_name,
        &identity,
        lease::Timing::default(),
    )?;
    let guard = lease::WritesWhileLeading(election.validity.clone());
    let client = ClientBuilder::try_from(config.clone())?
        .with_layer(&guard)
        .build();
    let mut evict_config = config;
    evict_config.default_retry = false;
    let evict_client = ClientBuilder::try_from(evict_config)?
        .with_layer(&guard)
        .build();

    // The node cache runs whether or not this replica leads: readiness means
    // "healthy and synced", so a standby is Ready and a rolling update with
    // maxUnavailable 0 never waits for a Lease it cannot get.
    let (nodes, node_stream) = cache::<Node>(clients.watches.clone(), |n: &mut Node| {
        n.managed_fields_mut().clear();
    });
    // Every replica keeps each node's last bootID from its own cache, so
    // that one that takes over neither misses nor repeats a restart (see
    // `impact`); only the leader reports them. Each node change also wakes
    // the fault-domain labels (see `labels`).
    let (boot_ids, restarts) = crate::controller::observe::impact::BootIds::new();
    let topology_changed = Arc::new(tokio::sync::Notify::new());
    let node_stream = node_stream.for_each({
        let boot_ids = boot_ids.clone();
        let changed = topology_changed.clone();
        move |r| {
            match r {
                Ok(node) => {
                    boot_ids.observe(&node, chrono::Utc::now());
                    changed.notify_one();
                }
                Err(e) => warn!(error = %e, "Node watch error (retrying)"),
            }
            async {}
        }
    });
    let node_task = tokio::spawn(node_stream);
    let confinement = tokio::spawn(crate::controller::runtime::confinement::watch(
        client.clone(),
        args.agent_policy.clone(),
        metrics.agent_confinement.clone(),
    ));
    let mut leadership = election.state.clone();
    tokio::select! {
        _ = &mut shutdown => { node_task.abort(); election.release().await; return Ok(()) }
        r = nodes.wait_until_ready() => r?,
    }
    ready.set(true);

    // Leader election (client-go's algorithm, see `lease`): API errors are
    // retried, never a crash loop; a standby watching the Lease asks at once
    // when the leader releases it on SIGTERM.
    info!(%identity, lease = %args.lease_name, namespace = %args.lease_namespace, "Waiting for leadership");
    let leading = tokio::select! {
        _ = &mut shutdown => None,
        r = leadership.wait_for(|l| *l != lease::Leadership::Standby) => r.ok().map(|l| l.clone()),
    };
    match leading {
        Some(lease::Leadership::Leading) => {}
        Some(lease::Leadership::Lost(why)) => {
            node_task.abort();
            anyhow::bail!("leader election stopped: {why}");
        }
        _ => {
            node_task.abort();
            election.release().await;
            return Ok(());
        }
    }
    metrics.leader.set(1);
    boot_ids.lead();
    // Ready while leading only once the caches the reconciles read are
    // synced (a leader whose RBAC lacks pods, say, never is).
    ready.set(false);
    info!(%identity, ?policy, dry_run = args.dry_run, "Leading: reconciling ScheduledEvents");
    if args.dry_run {
        warn!(
            "--dry-run: deciding and recording only; no node is cordoned, no pod evicted, no approval sent"
        );
    }
    let shared: reload::Shared = Arc::new(std::sync::RwLock::new(Arc::new(policy)));
    // A valid new policy file has every event reconciled again at once.
    let (reload_tx, reload_rx) = futures::channel::mpsc::unbounded::<()>();
    let reload_task = args.policy_file.clone().map(|path| {
        tokio::spawn(reload::watch(
            path,
            policy_text,
            shared.clone(),
            metrics.clone(),
            move || {
                let _ = reload_tx.unbounded_send(());
            },
        ))
    });

    // The agents' reports: one reflector feeds both the cache the trust
    // assessment reads and the trigger of the event they are about, so a
    // reconcile a report triggers always sees that report.
    let (reports, report_stream) = cache::<ScheduledEventReport>(
        clients.watches.clone(),
        // Who last wrote it and when is read (see `reports_about`); which
        // fields, never.
        |r: &mut ScheduledEventReport| {
            for m in r.managed_fields_mut() {
                m.fields_v1 = None;
            }
        },
    );
    // The agents' reports of their VMs, for the fault-domain labels and
    // the VM of each node without a providerID (see `nodes::identities`):
    // a change has the events its node reported reconciled at once.
    let (vm_reports, vm_report_stream) =
        cache::<VirtualMachineReport>(clients.watches.clone(), |r: &mut VirtualMachineReport| {
            r.managed_fields_mut().clear()
        });
    let (vm_changed_tx, vm_changed) = futures::channel::mpsc::unbounded();
    let vm_report_task = tokio::spawn(vm_report_stream.for_each({
        let changed = topology_changed.clone();
        let reports = reports.clone();
        move |r| {
            match r {
                Ok(vmr) => {
                    changed.notify_one();
                    for r in reports.state() {
                        if r.spec.report.node == vmr.spec.node {
                            let _ = vm_changed_tx.unbounded_send(reflector::ObjectRef::<
                                ScheduledEvent,
                            >::new(
                                &r.spec.scheduled_event
                            ));
                        }
                    }
                }
                Err(e) => warn!(error = %e, "VirtualMachineReport watch error (retrying)"),
            }
            async {}
        }
    }));
    // The drain's pods, from one watch (see `pods`), while this replica leads;
    // a pod's acknowledgement wakes the event it names.
    let (ack_tx, ack_rx) = futures::channel::mpsc::unbounded::<String>();
    let pods = crate::controller::observe::pods::PodCache::default()
        .with_ack_trigger(ack_tx)
        .with_agent_namespace(&args.lease_namespace);
    let pod_task = tokio::spawn(pods.clone().run(clients.watches.clone()));
    // Each report change also wakes the task that creates the objects of
    // events that have reports and no object yet (see `spec`).
    let report_changed = Arc::new(tokio::sync::Notify::new());
    let notify = report_changed.clone();
    let report_stream = report_stream.inspect(move |_| notify.notify_one());
    let blocked: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let pdb_blocked = blocked.clone();
    // Reconciles asked for by a node's restart or the end of a freeze.
    let (trigger, triggered) = futures::channel::mpsc::unbounded();
    let controller = Controller::new(
        Api::<ScheduledEvent>::all(clients.watches.clone()),
        watcher::Config::default().any_semantic(),
    )
    .watches_stream(report_stream, |r: ScheduledEventReport| {
        std::iter::once(reflector::ObjectRef::new(&r.spec.scheduled_event))
    })
    // A blocked drain is looked at again as soon as a PodDisruptionBudget
    // changes (its status changes when a replacement pod becomes Ready, or
    // someone edits it), not only at its backoff's next pass.
    .watches(
        Api::<PodDisruptionBudget>::all(clients.watches.clone()),
        watcher::Config::default().any_semantic(),
        move |_budget| {
            pdb_blocked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .keys()
                .map(|name| reflector::ObjectRef::new(name))
                .collect::<Vec<_>>()
        },
    )
    .reconcile_on(triggered)
    .trigger_backoff(watch_backoff())
    .reconcile_on(ack_rx.map(|name| reflector::ObjectRef::new(&name)))
    .reconcile_on(vm_changed)
    .reconcile_all_on(reload_rx)
    .with_config(controller::Config::default().concurrency(args.reconcile_concurrency));
    let events = controller.store();
    metrics.watch_caches(nodes.clone(), events.clone());
    // Dry run: decide and record only; no node is labelled either.
    let labels_task = (!args.dry_run).then(|| {
        tokio::spawn(crate::controller::act::labels::run(
            client.clone(),
            nodes.clone(),
            vm_reports.clone(),
            topology_changed,
            metrics.clone(),
        ))
    });
    let (kube_events, event_task) = crate::controller::act::kube_events::EventSink::start(
        {
            let (client, identity) = (client.clone(), identity.clone());
            move || {
                Recorder::new(
                    client.clone(),
                    Reporter {
                        controller: CONTROLLER_MANAGER.into(),
                        instance: Some(identity.clone()),
                    },
                )
            }
        },
        metrics.kube_events.clone(),
    );
    let webhooks = crate::notify::webhooks::Webhooks::start(
        webhooks_config,
        metrics.webhook_deliveries.clone(),
        args.dry_run,
    )?;
    let webhooks_task = args.webhooks_file.clone().map(|path| {
        tokio::spawn(crate::notify::webhooks::watch(
            path,
            webhooks_text,
            webhooks.clone(),
            metrics.clone(),
        ))
    });
    let ctx = Arc::new(Context {
        caches: Caches {
            nodes: nodes.clone(),
            events,
            reports,
            vm_reports,
            pods: pods.clone(),
            boot_ids,
            heartbeats: crate::controller::observe::heartbeats::Heartbeats::new(
                client.clone(),
                trigger.clone(),
            ),
        },
        writers: Writers {
            client: client.clone(),
            evict_client,
            limiter: drain::rate_limiter(args.eviction_qps, args.eviction_burst),
            kube_events,
            webhooks: webhooks.clone(),
            metrics: metrics.clone(),
            nodes,
            dry_run: args.dry_run,
        },
        memory: Memory {
            blocked: blocked.clone(),
            ..Memory::default()
        },
        policy: shared,
        per_node: usize::from(args.max_evictions_per_node),
        trigger: trigger.clone(),
    });
    let restart_task = tokio::spawn(crate::controller::act::restarts::report_restarts(
        ctx.caches.clone(),
        ctx.writers.clone(),
        trigger,
        restarts,
    ));
    let heartbeat_task = tokio::spawn(ctx.caches.heartbeats.clone().run_expiry());

    let synced = tokio::spawn({
        let (ctx, ready) = (ctx.clone(), ready.clone());
        async move {
            loop {
                ready.set(ctx.caches.synced());
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });
    let leader_gauge = metrics.leader.clone();
    // A dry run writes no node, so it releases no hold either (its sweep
    // only forgets deleted events' bookkeeping).
    let sweep = tokio::spawn(sweep::sweep_orphaned_holds(ctx.clone()));
    let notice_sweep = tokio::spawn(sweep::sweep_orphaned_notices(ctx.clone()));
    let creator = tokio::spawn(spec::create_missing(
        ctx.caches.clone(),
        ctx.writers.clone(),
        report_changed,
    ));
    let controller = controller
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                warn!(error = %e, "Reconcile failed");
            }
        });
    let outcome = tokio::select! {
        _ = &mut shutdown => Ok(()),
        l = leadership.wait_for(|l| matches!(l, lease::Leadership::Lost(_))) => {
            let why = match l.as_deref() {
                Ok(lease::Leadership::Lost(why)) => why.clone(),
                _ => "the election thread stopped".into(),
            };
            Err(anyhow::anyhow!("stopped acting as leader: {why}; exiting so that a fresh process takes over"))
        }
        _ = controller => Ok(()),
    };
    node_task.abort();
    vm_report_task.abort();
    if let Some(t) = labels_task {
        t.abort();
    }
    pod_task.abort();
    event_task.abort();
    synced.abort();
    heartbeat.abort();
    creator.abort();
    confinement.abort();
    sweep.abort();
    notice_sweep.abort();
    restart_task.abort();
    heartbeat_task.abort();
    if let Some(reload) = reload_task {
        reload.abort();
    }
    if let Some(reload) = webhooks_task {
        reload.abort();
    }
    ready.set(false);
    // Releasing hands the Lease to a standby at once instead of after its
    // duration; only a Lease this replica still holds is released.
    if election.release().await {
        info!("Released the leader-election Lease");
    }
    // 1 while this replica holds the Lease: until it was released.
    leader_gauge.set(0);
    // The notifications of what this leader recorded are still sent, after
    // the Lease is handed over, within a bounded time.
    let left = webhooks.finish(WEBHOOK_FLUSH).await;
    if !left.is_empty() {
        warn!(webhooks = ?left, "Notifications were left unsent at shutdown");
    }
    info!("Controller stopped");
    outcome
}

/// The delay before retrying a failed reconcile: 200 ms after a conflict
/// (someone wrote the node since it was read), else 1 s doubling per
/// consecutive failure of the same object, capped at [`MAX_ERROR_BACKOFF`].
pub fn error_backoff(err: &Error, failures: u32) -> Duration {
    if err.category() == "conflict" && failures < 5 {
        return Duration::from_millis(200);
    }
    let exp = failures.saturating_sub(1).min(16);
    Duration::from_secs(1u64 << exp).min(MAX_ERROR_BACKOFF)
}

fn error_policy(ev: Arc<ScheduledEvent>, err: &Error, ctx: Arc<Context>) -> Requeue {
    let name = ev.name_any();
    let failures = {
        let mut f = ctx
            .memory
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = f.entry(name.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    ctx.writers
        .metrics
        .reconciles
        .with_label_values(&["error"])
        .inc();
    ctx.writers
        .metrics
        .reconcile_errors
        .with_label_values(&[err.category()])
        .inc();
    let delay = error_backoff(err, failures);
    warn!(event = %name, error = %err, failures, retry_in = ?delay, "Reconcile error; retrying");
    Requeue::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_error(code: u16) -> Error {
        Error::PatchNode {
            node: "n".into(),
            source: kube::Error::Api(
                kube::core::Status {
                    code,
                    ..Default::default()
                }
                .boxed(),
            ),
        }
    }

    #[test]
    fn reconcile_errors_back_off_exponentially_with_a_cap() {
        let e = status_error(500);
        let d: Vec<u64> = (1..=9).map(|n| error_backoff(&e, n).as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(
            error_backoff(&status_error(409), 1),
            Duration::from_millis(200)
        );
        assert_eq!(
            error_backoff(&status_error(409), 6),
            Duration::from_secs(32)
        );
    }
}
