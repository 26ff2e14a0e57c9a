//! Wiring of the controller role: clients, metrics server, node cache,
//! leader election, and the kube-runtime `Controller` over `ScheduledEvent`s.
//!
//! [`run`] wires the steps in order; each task it starts is a function of
//! its own, taking only what it needs. A replica first stands by (node
//! cache, readiness, the Lease: [`Replica::stand_by`]), then leads (the
//! other caches, the reconciles and the tasks around them:
//! [`Replica::lead`]), then hands over ([`Replica::stop`]).

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::Api;
use kube::client::{Client, ClientBuilder};
use kube::runtime::controller::{self, Action as Requeue, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use prometheus::{IntCounterVec, Registry};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::api::{CONTROLLER_MANAGER, ScheduledEvent, ScheduledEventReport};
use crate::cli::ControllerArgs;
use crate::controller::act::cordons_first::CordonsFirst;
use crate::controller::act::kube_events::EventSink;
use crate::controller::act::spec;
use crate::controller::act::writers::Writers;
use crate::controller::act::{cordon, drain};
use crate::controller::context::{Blocked, Context, Memory};
use crate::controller::error::Error;
use crate::controller::observe::caches::Caches;
use crate::controller::observe::created::{self, Created};
use crate::controller::observe::heartbeats::{Heartbeats, Trigger};
use crate::controller::observe::impact::{BootIds, Change};
use crate::controller::observe::pods::PodCache;
use crate::controller::observe::watch::{cache, watch_backoff};
use crate::controller::reconcile::reconcile;
use crate::controller::runtime::gate::{self, Gate};
use crate::controller::runtime::lease;
use crate::controller::runtime::reload;
use crate::controller::runtime::sweep;
use crate::kubeclient::{self, Clients};
use crate::metrics::controller::ControllerMetrics;
use crate::notify::config::Config as WebhooksConfig;
use crate::notify::webhooks::Webhooks;
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
    let files = Files::read(args.policy_file.as_deref(), args.webhooks_file.as_deref())?;
    let identity = replica_identity(args.identity.clone());
    let config = kubeclient::request_config(kube::Config::infer().await?, "controller", &identity)?;
    let clients = Clients::from_request_config(config.clone())?;

    let registry = Registry::new();
    let metrics = ControllerMetrics::register(&registry)?;
    let replica = Replica {
        args,
        identity,
        clients,
        metrics,
        ready: Readiness::default(),
    };
    let heartbeat = replica.serve(registry).await?;

    let shutdown = crate::cli::shutdown_signal();
    tokio::pin!(shutdown);

    // The installed CRDs must carry every field this version writes and
    // reads, or the API server would silently drop them: exit with the
    // command that mends it (see `crds`). Before the Lease: a replica that
    // cannot work never leads.
    let needs = crate::api::install::controller_needs();
    tokio::select! {
        _ = &mut shutdown => return Ok(()),
        r = crate::api::install::require(&replica.clients.requests, &needs, "controller", || {}) => r?,
    }

    // Leader election on a thread of its own (see `lease`); every write of
    // this process passes its guard.
    let election = lease::spawn(
        config.clone(),
        &replica.args.lease_namespace,
        &replica.args.lease_name,
        &replica.identity,
        lease::Timing::default(),
    )?;
    let writes = Writes::guarded(config, &election.validity)?;

    // The node cache runs whether or not this replica leads: readiness means
    // "healthy and synced", so a standby is Ready and a rolling update with
    // maxUnavailable 0 never waits for a Lease it cannot get.
    let (nodes, node_task) = NodeCache::spawn(replica.clients.watches.clone());
    let confinement = tokio::spawn(crate::controller::runtime::confinement::watch(
        writes.client.clone(),
        replica.args.agent_policy.clone(),
        replica.metrics.agent_confinement.clone(),
    ));
    let standing = replica.stand_by(election, &nodes.store, &node_task, shutdown.as_mut());
    let Some(election) = standing.await? else {
        return Ok(());
    };
    let tasks = Tasks {
        nodes: Some(node_task),
        heartbeat: Some(heartbeat),
        confinement: Some(confinement),
        ..Tasks::default()
    };
    replica
        .lead(files, writes, nodes, election, tasks, shutdown)
        .await
}

/// This replica's identity in the Lease and in its Kubernetes Events:
/// `given` (`--identity`), else `<HOSTNAME>-<pid>` (`forewarn-<pid>`
/// without `HOSTNAME`).
fn replica_identity(given: Option<String>) -> String {
    given.unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "forewarn".into());
        format!("{host}-{}", std::process::id())
    })
}

/// The files the controller reads at start, each with its text (what its
/// reload task compares the file with).
struct Files {
    /// The policy in force at start ([`Policy::default`] without a file).
    policy: Policy,
    /// The policy file's text (empty without one).
    policy_text: String,
    /// The operators' webhooks at start (none without a file).
    webhooks: WebhooksConfig,
    /// The webhooks file's text (empty without one).
    webhooks_text: String,
}

impl Files {
    /// Reads `policy_file` (`--policy-file`), then `webhooks_file`
    /// (`--webhooks-file`); either absent gives the default and no text.
    ///
    /// # Errors
    /// A file that cannot be read or is not valid.
    fn read(policy_file: Option<&Path>, webhooks_file: Option<&Path>) -> anyhow::Result<Self> {
        let (policy, policy_text) = match policy_file {
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
        let (webhooks, webhooks_text) = match webhooks_file {
            Some(path) => WebhooksConfig::load_text(&path.to_string_lossy())?,
            None => Default::default(),
        };
        Ok(Files {
            policy,
            policy_text,
            webhooks,
            webhooks_text,
        })
    }
}

/// Requests of the write client waiting for the guarded stack to take them
/// (the stack takes each at once: it is ready while its connection pool is).
const WRITES_QUEUED: usize = 1024;

/// The clients this replica writes through, both behind the Lease guard
/// ([`lease::WritesWhileLeading`]): no write leaves a replica that does not
/// lead.
struct Writes {
    /// Every write but evictions.
    client: Client,
    /// Evictions: a client that does not retry 429s itself (see
    /// [`drain::evict`]).
    evict: Client,
}

impl Writes {
    /// Both clients, built from `config` and guarded by `validity` (the
    /// election's).
    ///
    /// # Errors
    /// A client cannot be built from `config`.
    /// The guard sits inside the retry layer: kube's retry of a 429, 503
    /// or 504 (for up to minutes, as `Retry-After` asks) is a new request
    /// that passes the guard again, so a replica whose lease lapsed while a
    /// write was being retried sends no further attempt.
    fn guarded(config: kube::Config, validity: &lease::Validity) -> anyhow::Result<Self> {
        let guard = lease::WritesWhileLeading(validity.clone());
        let mut config = config;
        let retry = config.default_retry;
        config.default_retry = false;
        let guarded = ClientBuilder::try_from(config.clone())?.with_layer(&guard);
        let client = if retry {
            // Retry clones the service it retries through; the buffer
            // (its worker hands each request to the guarded stack as it
            // comes, the answers are awaited by their callers) makes it so.
            guarded
                .with_layer(&tower::buffer::BufferLayer::new(WRITES_QUEUED))
                .with_layer(&tower::retry::RetryLayer::new(
                    kube::client::retry::RetryPolicy::server_retry(),
                ))
                .build()
        } else {
            guarded.build()
        };
        let evict = ClientBuilder::try_from(config)?.with_layer(&guard).build();
        Ok(Writes { client, evict })
    }
}

/// The node cache every replica keeps, leader or not, and what its watch
/// feeds besides.
struct NodeCache {
    /// Every Node, without its managed fields.
    store: Store<Node>,
    /// Each node's last bootID, kept by every replica from its own cache,
    /// so that one that takes over neither misses nor repeats a restart
    /// (see `impact`); only the leader reports them.
    boot_ids: Arc<BootIds>,
    /// The restarts `boot_ids` saw, for the leader to report.
    restarts: UnboundedReceiver<Change>,
    /// Woken by each node change (and each `VirtualMachineReport` change,
    /// see [`spawn_vm_reports`]): the fault-domain labels (see `labels`).
    topology_changed: Arc<Notify>,
}

impl NodeCache {
    /// Starts the watch of every Node on `client` (a watch client); each
    /// node it shows is observed for restarts and wakes the fault-domain
    /// labels; a watch error is logged and retried.
    ///
    /// Returns the cache and the watch's task.
    fn spawn(client: Client) -> (Self, JoinHandle<()>) {
        let (store, stream) = cache::<Node>(client, crate::controller::observe::nodes::trim);
        let (boot_ids, restarts) = BootIds::new();
        let topology_changed = Arc::new(Notify::new());
        let stream = stream.for_each({
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
        let task = tokio::spawn(stream);
        let cache = NodeCache {
            store,
            boot_ids,
            restarts,
            topology_changed,
        };
        (cache, task)
    }
}

/// The tasks a replica runs besides its controller loop, each kept once
/// started so that [`Tasks::abort`] stops them all when the replica stops.
#[derive(Default)]
struct Tasks {
    /// The node watch ([`NodeCache::spawn`]).
    nodes: Option<JoinHandle<()>>,
    /// The `VirtualMachineReport` watch ([`spawn_vm_reports`]).
    vm_reports: Option<JoinHandle<()>>,
    /// The fault-domain labels (none in a dry run).
    labels: Option<JoinHandle<()>>,
    /// The pod watch ([`PodCache::run`]).
    pods: Option<JoinHandle<()>>,
    /// The queue of Kubernetes Events ([`start_kube_events`]).
    kube_events: Option<JoinHandle<()>>,
    /// Readiness from the caches' sync ([`spawn_synced`]).
    synced: Option<JoinHandle<()>>,
    /// The runtime's liveness beat ([`spawn_heartbeat`]).
    heartbeat: Option<JoinHandle<()>>,
    /// The creation of the objects of reported events
    /// ([`spec::create_missing`]).
    creator: Option<JoinHandle<()>>,
    /// The check of the agents' confinement policy.
    confinement: Option<JoinHandle<()>>,
    /// The leader's housekeeping, the release of holds of deleted events
    /// among it ([`sweep::housekeeping`]).
    sweep: Option<JoinHandle<()>>,
    /// The sweep of pods' notices of deleted events
    /// ([`sweep::sweep_orphaned_notices`]).
    notice_sweep: Option<JoinHandle<()>>,
    /// The reports of node restarts.
    restarts: Option<JoinHandle<()>>,
    /// The expiry of the watches of nodes' Leases
    /// ([`Heartbeats::run_expiry`]).
    lease_watches: Option<JoinHandle<()>>,
    /// The policy file's reload ([`spawn_policy_reload`]; none without a file).
    policy_reload: Option<JoinHandle<()>>,
    /// The webhooks file's reload (none without a file).
    webhooks_reload: Option<JoinHandle<()>>,
    /// The witnesses ConfigMap ([`crate::controller::act::witnesses::publish`]).
    witnesses: Option<JoinHandle<()>>,
}

impl Tasks {
    /// Aborts every task started, in the order of the fields.
    fn abort(&self) {
        let all = [
            &self.nodes,
            &self.vm_reports,
            &self.labels,
            &self.pods,
            &self.kube_events,
            &self.synced,
            &self.heartbeat,
            &self.creator,
            &self.confinement,
            &self.sweep,
            &self.notice_sweep,
            &self.restarts,
            &self.lease_watches,
            &self.policy_reload,
            &self.webhooks_reload,
            &self.witnesses,
        ];
        for task in all.into_iter().flatten() {
            task.abort();
        }
    }
}

/// What a replica holds from start-up to stop, leader or not.
struct Replica {
    /// Its command line.
    args: ControllerArgs,
    /// Its identity in the Lease and in its Kubernetes Events.
    identity: String,
    /// The clients without the Lease guard: requests (the CRD check,
    /// token reviews) and watches.
    clients: Clients,
    /// Its metrics.
    metrics: ControllerMetrics,
    /// What `/readyz` answers.
    ready: Readiness,
}

impl Replica {
    /// Serves `/metrics` (from `registry`), `/healthz` and `/readyz` on
    /// `--metrics-addr`, and starts the heartbeat `/healthz` reads
    /// ([`spawn_heartbeat`]).
    ///
    /// Returns the heartbeat's task.
    ///
    /// # Errors
    /// The metrics address cannot be bound.
    async fn serve(&self, registry: Registry) -> anyhow::Result<JoinHandle<()>> {
        // `/healthz` fails when the runtime that runs the reconciles has not
        // run this heartbeat for [`HEARTBEAT_ALLOWED`] (every worker blocked or
        // starved): the kubelet restarts the process. An API server that is
        // down does not count (restarting would not mend it); a leader that
        // cannot renew its Lease exits on its own (see `lease`).
        let live = Liveness::new(HEARTBEAT_ALLOWED);
        let heartbeat = spawn_heartbeat(live.clone());
        // Tokens are reviewed through the unguarded request client: a standby
        // answers its scrapes too.
        let access = server::Access::new(
            self.args.metrics_auth,
            &self.clients.requests,
            &self.metrics.metrics_auth,
        );
        server::spawn(
            self.args.metrics_addr,
            registry,
            self.ready.clone(),
            Some(live),
            access,
        )
        .await?;
        Ok(heartbeat)
    }

    /// Stands by until this replica leads: Ready once `nodes` (the node
    /// cache) is synced, then waits for the Lease of `election`.
    ///
    /// Gives the election back once this replica leads; `None` on SIGTERM
    /// (`shutdown`), the node watch (`node_task`) aborted and the Lease
    /// released.
    ///
    /// # Errors
    /// The node cache cannot sync, or the election stopped before this
    /// replica led (the node watch aborted).
    async fn stand_by(
        &self,
        election: lease::Election,
        nodes: &Store<Node>,
        node_task: &JoinHandle<()>,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> anyhow::Result<Option<lease::Election>> {
        let mut leadership = election.state.clone();
        tokio::select! {
            _ = &mut shutdown => { node_task.abort(); election.release().await; return Ok(None) }
            r = nodes.wait_until_ready() => r?,
        }
        self.ready.set(true);

        // Leader election (client-go's algorithm, see `lease`): API errors
        // are retried, never a crash loop; a standby watching the Lease asks
        // at once when the leader releases it on SIGTERM.
        let args = &self.args;
        info!(identity = %self.identity, lease = %args.lease_name, namespace = %args.lease_namespace, "Waiting for leadership");
        let leading = tokio::select! {
            _ = &mut shutdown => None,
            r = leadership.wait_for(|l| *l != lease::Leadership::Standby) => r.ok().map(|l| l.clone()),
        };
        match leading {
            Some(lease::Leadership::Leading) => Ok(Some(election)),
            Some(lease::Leadership::Lost(why)) => {
                node_task.abort();
                anyhow::bail!("leader election stopped: {why}");
            }
            _ => {
                node_task.abort();
                election.release().await;
                Ok(None)
            }
        }
    }

    /// Leads until SIGTERM (`shutdown`) or the loss of the Lease of
    /// `election`: starts what only a leader runs
    /// ([`Replica::start_leading`]), runs the controller loop
    /// ([`reconcile_until_stopped`]), then aborts `tasks` (those started
    /// before too) and hands over ([`Replica::stop`]).
    ///
    /// # Errors
    /// The webhooks cannot start; the Lease was lost while leading (the
    /// process exits so that a fresh one takes over).
    async fn lead(
        self,
        files: Files,
        writes: Writes,
        nodes: NodeCache,
        election: lease::Election,
        mut tasks: Tasks,
        shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> anyhow::Result<()> {
        self.metrics.leader.set(1);
        nodes.boot_ids.lead();
        // Ready while leading only once the caches the reconciles read are
        // synced (a leader whose RBAC lacks pods, say, never is).
        self.ready.set(false);
        info!(identity = %self.identity, policy = ?files.policy, dry_run = self.args.dry_run, "Leading: reconciling ScheduledEvents");
        if self.args.dry_run {
            warn!(
                "--dry-run: deciding and recording only; no node is cordoned, no pod evicted, no approval sent"
            );
        }
        let (controller, ctx) = self.start_leading(files, writes, nodes, &mut tasks)?;
        let webhooks = ctx.writers.webhooks.clone();
        let leadership = election.state.clone();
        let gate = Gate::new(usize::from(self.args.reconcile_concurrency));
        let outcome = reconcile_until_stopped(controller, ctx, gate, leadership, shutdown).await;
        tasks.abort();
        self.stop(election, webhooks).await;
        outcome
    }

    /// Starts what only a leader runs, keeping each task in `tasks`: the
    /// policy in force (from `files`) and its reload, the caches besides
    /// `nodes` and the `Controller` they wake ([`Replica::watch`]), the
    /// fault-domain labels, the writers through `writes`
    /// ([`Replica::writers`]), and the tasks around the reconciles
    /// ([`spawn_leader_tasks`]).
    ///
    /// Returns the `Controller`, not yet running, and the context its
    /// reconciles share.
    ///
    /// # Errors
    /// The webhooks cannot start.
    fn start_leading(
        &self,
        files: Files,
        writes: Writes,
        nodes: NodeCache,
        tasks: &mut Tasks,
    ) -> anyhow::Result<(Controller<ScheduledEvent>, Arc<Context>)> {
        let shared: reload::Shared = Arc::new(std::sync::RwLock::new(Arc::new(files.policy)));
        // A valid new policy file has every event reconciled again at once.
        let (reload_tx, reload_rx) = futures::channel::mpsc::unbounded::<()>();
        tasks.policy_reload = self.args.policy_file.clone().map(|path| {
            let metrics = self.metrics.clone();
            spawn_policy_reload(path, files.policy_text, shared.clone(), metrics, reload_tx)
        });
        let watched = self.watch(&nodes, reload_rx, tasks);
        let events = watched.controller.store();
        self.metrics
            .watch_caches(nodes.store.clone(), events.clone());
        // Dry run: decide and record only; no node is labelled either.
        tasks.labels = (!self.args.dry_run).then(|| {
            tokio::spawn(crate::controller::act::labels::run(
                writes.client.clone(),
                nodes.store.clone(),
                watched.vm_reports.clone(),
                nodes.topology_changed,
                self.metrics.clone(),
            ))
        });
        let writers = self.writers(
            writes,
            nodes.store.clone(),
            files.webhooks,
            files.webhooks_text,
            tasks,
        )?;
        let ctx = Arc::new(Context {
            caches: Caches {
                nodes: nodes.store,
                events,
                reports: watched.reports,
                vm_reports: watched.vm_reports,
                pods: watched.pods,
                budgets: watched.budgets,
                boot_ids: nodes.boot_ids,
                heartbeats: Heartbeats::new(writers.client.clone(), watched.trigger.clone()),
                namespaces: Default::default(),
            },
            writers,
            memory: Memory {
                blocked: watched.blocked,
                refusals: watched.refusals,
                ..Memory::default()
            },
            policy: shared,
            per_node: usize::from(self.args.max_evictions_per_node),
            trigger: watched.trigger.clone(),
        });
        let (trigger, restarts) = (watched.trigger, nodes.restarts);
        let (report_changed, created) = (watched.report_changed, watched.created);
        spawn_leader_tasks(
            &ctx,
            &self.ready,
            trigger,
            restarts,
            report_changed,
            created,
            tasks,
        );
        tasks.witnesses = Some(tokio::spawn(crate::controller::act::witnesses::publish(
            ctx.caches.clone(),
            ctx.writers.client.clone(),
            self.args.lease_namespace.clone(),
            self.args.witnesses_configmap.clone(),
        )));
        Ok((watched.controller, ctx))
    }

    /// Starts the watches only a leader keeps besides the nodes' (the
    /// agents' reports, their VMs' reports, the drain's pods), keeping
    /// their tasks in `tasks`, and builds the `Controller` they wake
    /// ([`event_controller`]); `reload` has every event reconciled again,
    /// and each VM report change wakes `nodes`' fault-domain labels.
    fn watch(
        &self,
        nodes: &NodeCache,
        reload: UnboundedReceiver<()>,
        tasks: &mut Tasks,
    ) -> Watched {
        let watches = &self.clients.watches;
        // The agents' reports: one reflector feeds both the cache the trust
        // assessment reads and the trigger of the event they are about, so a
        // reconcile a report triggers always sees that report.
        // Each node's agent may create as many reports as it likes: at most
        // MAX_CACHED_REPORTS_PER_NODE of one node's are held, so that what
        // one node writes cannot grow the controller's memory without bound.
        let (reports, report_stream) =
            crate::controller::observe::watch::cache_capped::<ScheduledEventReport>(
                watches.clone(),
                // Who last wrote it and when is read (see `reports_about`); which
                // fields, never.
                |r: &mut ScheduledEventReport| {
                    for m in r.managed_fields_mut() {
                        m.fields_v1 = None;
                    }
                },
                crate::controller::observe::intake::MAX_CACHED_REPORTS_PER_NODE,
                |r| r.spec.report.node.clone(),
            );
        let changed = nodes.topology_changed.clone();
        let (vm_reports, vm_changed, vm_task) =
            spawn_vm_reports(watches.clone(), changed, reports.clone());
        tasks.vm_reports = Some(vm_task);
        // The drain's pods, from one watch (see `pods`), while this replica
        // leads; a pod's acknowledgement wakes the event it names.
        let (ack_tx, acks) = futures::channel::mpsc::unbounded::<String>();
        let pods = PodCache::default()
            .with_ack_trigger(ack_tx)
            .with_agent_namespace(&self.args.lease_namespace);
        tasks.pods = Some(tokio::spawn(pods.clone().run(watches.clone())));
        // Each report change also wakes the task that creates the objects of
        // events that have reports and no object yet (see `spec`).
        let report_changed = Arc::new(Notify::new());
        let notify = report_changed.clone();
        let report_stream = report_stream.inspect(move |_| notify.notify_one());
        let blocked: Blocked = Arc::default();
        // Reconciles asked for by a node's restart or the end of a freeze.
        let (trigger, triggered) = futures::channel::mpsc::unbounded();
        let (created, created_rx) = Created::channel();
        let wakes = Wakes {
            triggered,
            acks,
            vm_changed,
            reload,
            created: created_rx,
        };
        // The budgets: one reflector feeds both the cache the drain reads
        // and the wake of the drains they block.
        let (budgets, budget_stream) =
            cache::<PodDisruptionBudget>(watches.clone(), |b: &mut PodDisruptionBudget| {
                b.managed_fields_mut().clear()
            });
        // Evictions waiting for the cache to show a budget's next version
        // look again as soon as it does.
        let refusals = drain::Refusals::default();
        let seen = refusals.clone();
        let budget_stream = budget_stream.inspect(move |_| seen.budget_changed());
        let controller = event_controller(
            watches.clone(),
            report_stream,
            budget_stream,
            blocked.clone(),
            wakes,
        );
        Watched {
            controller,
            reports,
            vm_reports,
            pods,
            report_changed,
            created,
            blocked,
            budgets,
            refusals,
            trigger,
        }
    }

    /// What the reconciles write through: `writes`' clients, the eviction
    /// rate budget, the Kubernetes Events queue and the operators'
    /// webhooks (`webhooks`), the last two started here and their tasks
    /// kept in `tasks`; the webhooks file, if any, is watched from
    /// `webhooks_text` on. `nodes` names a node as an Event's subject.
    ///
    /// # Errors
    /// The webhooks cannot start.
    fn writers(
        &self,
        writes: Writes,
        nodes: Store<Node>,
        webhooks: WebhooksConfig,
        webhooks_text: String,
        tasks: &mut Tasks,
    ) -> anyhow::Result<Writers> {
        let cordons_first = CordonsFirst::default();
        let (kube_events, event_task) = start_kube_events(
            writes.client.clone(),
            self.identity.clone(),
            self.metrics.kube_events.clone(),
            cordons_first.clone(),
        );
        tasks.kube_events = Some(event_task);
        let webhooks = Webhooks::start(
            webhooks,
            self.metrics.webhook_deliveries.clone(),
            self.args.dry_run,
        )?;
        tasks.webhooks_reload = self.args.webhooks_file.clone().map(|path| {
            tokio::spawn(crate::notify::webhooks::watch(
                path,
                webhooks_text,
                webhooks.clone(),
                self.metrics.clone(),
            ))
        });
        Ok(Writers {
            client: writes.client,
            evict_client: writes.evict,
            limiter: drain::rate_limiter(self.args.eviction_qps, self.args.eviction_burst),
            kube_events,
            webhooks,
            metrics: self.metrics.clone(),
            nodes,
            dry_run: self.args.dry_run,
            written_marks: cordon::WrittenMarks::default(),
            latest: crate::controller::act::latest::LatestWritten::default(),
            cordons_first,
        })
    }

    /// Hands over once the controller loop ended: not Ready; the Lease of
    /// `election` released if this replica still holds it; the leader
    /// gauge back to 0; the notifications `webhooks` still has queued sent
    /// within [`WEBHOOK_FLUSH`].
    async fn stop(&self, election: lease::Election, webhooks: Webhooks) {
        self.ready.set(false);
        // Releasing hands the Lease to a standby at once instead of after its
        // duration; only a Lease this replica still holds is released.
        if election.release().await {
            info!("Released the leader-election Lease");
        }
        // 1 while this replica holds the Lease: until it was released.
        self.metrics.leader.set(0);
        // The notifications of what this leader recorded are still sent, after
        // the Lease is handed over, within a bounded time.
        let left = webhooks.finish(WEBHOOK_FLUSH).await;
        if !left.is_empty() {
            warn!(webhooks = ?left, "Notifications were left unsent at shutdown");
        }
        info!("Controller stopped");
    }
}

/// What a leader watches besides the nodes ([`Replica::watch`]).
struct Watched {
    /// The `Controller` over every `ScheduledEvent`, not yet running.
    controller: Controller<ScheduledEvent>,
    /// The agents' `ScheduledEventReport`s.
    reports: Store<ScheduledEventReport>,
    /// The agents' `VirtualMachineReport`s.
    vm_reports: Store<VirtualMachineReport>,
    /// The drain's pods.
    pods: PodCache,
    /// Woken by each report change: the creation of the objects of
    /// events that have reports and no object yet.
    report_changed: Arc<Notify>,
    /// Where that creation hands the objects it created to the
    /// `Controller`'s cache ([`created`]).
    created: Created,
    /// The blocked drains the PodDisruptionBudget watch wakes.
    blocked: Blocked,
    /// Every PodDisruptionBudget.
    budgets: Store<PodDisruptionBudget>,
    /// The refused pods and the budgets' turns, told of each budget change.
    refusals: drain::Refusals,
    /// Asks the `Controller` for a pass over an event.
    trigger: Trigger,
}

/// What has the `Controller` reconcile an event besides the event's own
/// changes, its reports' and the PodDisruptionBudgets'.
struct Wakes {
    /// A node's restart or the end of a freeze ([`Trigger`]).
    triggered: UnboundedReceiver<ObjectRef<ScheduledEvent>>,
    /// A pod's acknowledgement, by event name.
    acks: UnboundedReceiver<String>,
    /// A change of a VM report, the events its node reported
    /// ([`spawn_vm_reports`]).
    vm_changed: UnboundedReceiver<ObjectRef<ScheduledEvent>>,
    /// A new policy: every event.
    reload: UnboundedReceiver<()>,
    /// The objects this controller created, as the API server answered
    /// ([`created`]).
    created: UnboundedReceiver<ScheduledEvent>,
}

/// The kube-runtime `Controller` over every `ScheduledEvent`, watched on
/// `client`, running up to `concurrency` reconciles at once: an event is
/// reconciled when it changes, when one of its reports does (`reports`,
/// the reports cache's stream), when any PodDisruptionBudget does if its
/// drain is `blocked`, and when `wakes` ask. Its cache takes the objects
/// this controller created as the API server answered ([`created`]).
fn event_controller(
    client: Client,
    reports: impl Stream<Item = Result<ScheduledEventReport, watcher::Error>> + Send + 'static,
    budgets: impl Stream<Item = Result<PodDisruptionBudget, watcher::Error>> + Send + 'static,
    blocked: Blocked,
    wakes: Wakes,
) -> Controller<ScheduledEvent> {
    let (cache, writer) = reflector::store();
    let watch = watcher(
        Api::<ScheduledEvent>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    );
    let events = reflector::reflector(
        writer,
        created::with_created(watch, wakes.created, cache.clone()),
    )
    .applied_objects();
    Controller::for_stream(events, cache)
        .watches_stream(reports, |r: ScheduledEventReport| {
            std::iter::once(reflector::ObjectRef::new(&r.spec.scheduled_event))
        })
        // A blocked drain is looked at again as soon as a budget that blocks
        // it allows a disruption (its status changes when a replacement pod
        // becomes Ready, or someone edits it), not only at its backoff's next
        // pass; a change that still allows none wakes nothing.
        .watches_stream(budgets, move |budget: PodDisruptionBudget| {
            if drain::allows_none(&budget) {
                return Vec::new();
            }
            let key = format!(
                "{}/{}",
                budget.namespace().unwrap_or_default(),
                budget.name_any()
            );
            blocked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .filter(|(_, b)| b.budgets.is_empty() || b.budgets.contains(&key))
                .map(|(name, _)| reflector::ObjectRef::new(name))
                .collect::<Vec<_>>()
        })
        .reconcile_on(wakes.triggered)
        .trigger_backoff(watch_backoff())
        .reconcile_on(wakes.acks.map(|name| reflector::ObjectRef::new(&name)))
        .reconcile_on(wakes.vm_changed)
        .reconcile_all_on(wakes.reload)
        // No limit of kube-runtime's own: its scheduler hands out due
        // reconciles in an order unrelated to the events' deadlines, so every
        // reconcile waits at the deadline-ordered gate instead
        // ([`crate::controller::runtime::gate`]), which lets `concurrency` run
        // at once, nearest `NotBefore` first. kube-runtime still never runs two
        // reconciles of one object at once.
        .with_config(controller::Config::default().concurrency(0))
}

/// Beats `live` every [`HEARTBEAT_EVERY`], allowing [`HEARTBEAT_ALLOWED`]
/// each time, until aborted.
fn spawn_heartbeat(live: Liveness) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            live.beat(HEARTBEAT_ALLOWED);
            tokio::time::sleep(HEARTBEAT_EVERY).await;
        }
    })
}

/// Watches the policy file at `path` (read as `text` at start), putting
/// each valid new policy in force in `shared` and asking, on `reload`, for
/// every event to be reconciled again ([`reload::watch`]).
fn spawn_policy_reload(
    path: std::path::PathBuf,
    text: String,
    shared: reload::Shared,
    metrics: ControllerMetrics,
    reload: UnboundedSender<()>,
) -> JoinHandle<()> {
    tokio::spawn(reload::watch(path, text, shared, metrics, move || {
        let _ = reload.unbounded_send(());
    }))
}

/// The agents' reports of their VMs, watched on `client`, for the
/// fault-domain labels and the VM of each node without a providerID (see
/// `nodes::identities`): a change wakes the labels (`topology_changed`)
/// and has the events its node reported (in `reports`) reconciled at once.
/// A watch error is logged and retried.
///
/// Returns the cache, the events to reconcile, and the watch's task.
fn spawn_vm_reports(
    client: Client,
    topology_changed: Arc<Notify>,
    reports: Store<ScheduledEventReport>,
) -> (
    Store<VirtualMachineReport>,
    UnboundedReceiver<ObjectRef<ScheduledEvent>>,
    JoinHandle<()>,
) {
    let (vm_reports, vm_report_stream) =
        cache::<VirtualMachineReport>(client, |r: &mut VirtualMachineReport| {
            r.managed_fields_mut().clear()
        });
    let (vm_changed_tx, vm_changed) = futures::channel::mpsc::unbounded();
    let task = tokio::spawn(vm_report_stream.for_each(move |r| {
        match r {
            Ok(vmr) => {
                topology_changed.notify_one();
                for r in reports.state() {
                    if r.spec.report.node == vmr.spec.node {
                        let _ = vm_changed_tx.unbounded_send(
                            reflector::ObjectRef::<ScheduledEvent>::new(&r.spec.scheduled_event),
                        );
                    }
                }
            }
            Err(e) => warn!(error = %e, "VirtualMachineReport watch error (retrying)"),
        }
        async {}
    }));
    (vm_reports, vm_changed, task)
}

/// Starts the queue of Kubernetes Events, posted through `client` as
/// [`CONTROLLER_MANAGER`], instance `identity`, and counted in `counted`,
/// each held back while `cordons_first` counts cordons in flight.
///
/// Returns the queue and its task.
fn start_kube_events(
    client: Client,
    identity: String,
    counted: IntCounterVec,
    cordons_first: CordonsFirst,
) -> (EventSink, JoinHandle<()>) {
    EventSink::start(
        move || {
            Recorder::new(
                client.clone(),
                Reporter {
                    controller: CONTROLLER_MANAGER.into(),
                    instance: Some(identity.clone()),
                },
            )
        },
        counted,
        cordons_first,
    )
}

/// Starts the leader's tasks around the reconciles, each kept in `tasks`:
/// the reports of node restarts (`restarts`, asking passes on `trigger`),
/// the expiry of the watches of nodes' Leases, the readiness from the
/// caches' sync, the sweeps of deleted events' holds and notices, and the
/// creation of the objects of reported events (woken by `report_changed`,
/// handing each object created to the events' cache through `created`).
fn spawn_leader_tasks(
    ctx: &Arc<Context>,
    ready: &Readiness,
    trigger: Trigger,
    restarts: UnboundedReceiver<Change>,
    report_changed: Arc<Notify>,
    created: Created,
    tasks: &mut Tasks,
) {
    tasks.restarts = Some(tokio::spawn(
        crate::controller::act::restarts::report_restarts(
            ctx.caches.clone(),
            ctx.writers.clone(),
            trigger,
            restarts,
        ),
    ));
    tasks.lease_watches = Some(tokio::spawn(ctx.caches.heartbeats.clone().run_expiry()));
    tasks.synced = Some(spawn_synced(ctx.clone(), ready.clone()));
    // A dry run writes no node, so it releases no hold either (its sweep
    // only forgets deleted events' bookkeeping).
    tasks.sweep = Some(tokio::spawn(sweep::housekeeping(ctx.clone())));
    tasks.notice_sweep = Some(tokio::spawn(sweep::sweep_orphaned_notices(ctx.clone())));
    tasks.creator = Some(tokio::spawn(spec::create_missing(
        ctx.caches.clone(),
        ctx.writers.clone(),
        report_changed,
        created,
    )));
}

/// Keeps `ready` at whether the caches the reconciles read are synced
/// ([`Caches::synced`]), every 500 ms, until aborted.
fn spawn_synced(ctx: Arc<Context>, ready: Readiness) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            ready.set(ctx.caches.synced());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

/// Runs `controller`'s reconciles (sharing `ctx`; a failed one is logged,
/// and retried as [`error_policy`] says), each once it holds a permit of
/// `gate` ([`gated`]), until SIGTERM (`shutdown`), the loss of the Lease
/// (`leadership`), or the end of the controller's stream.
///
/// # Errors
/// The Lease was lost, or the election thread stopped: the process exits so
/// that a fresh one takes over.
async fn reconcile_until_stopped(
    controller: Controller<ScheduledEvent>,
    ctx: Arc<Context>,
    gate: Gate,
    mut leadership: watch::Receiver<lease::Leadership>,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> anyhow::Result<()> {
    let metrics = ctx.writers.metrics.clone();
    let mut unseen = Unseen::default();
    let controller = controller
        .run(
            move |ev, ctx| gated(ev, ctx, gate.clone()),
            error_policy,
            ctx,
        )
        .for_each(move |r| {
            match r {
                // A report's change asks for a pass over an event whose
                // object is not created yet (the creation, by its own
                // watch, asks again): nothing failed, unless it lasts.
                Err(controller::Error::ObjectNotFound(o)) => {
                    if unseen.asked(&o.name, Instant::now()) {
                        metrics.cache_misses.with_label_values(&["pass_without_object"]).inc();
                        warn!(event = %o.name, after = ?UNSEEN_WARN_AFTER,
                            "Passes are still asked for an event the controller's cache has no object of");
                    } else {
                        debug!(event = %o.name, "A pass was asked for an event with no object yet");
                    }
                }
                Err(e) => warn!(error = %e, "Reconcile failed"),
                Ok(_) => {}
            }
            std::future::ready(())
        });
    tokio::select! {
        _ = &mut shutdown => Ok(()),
        l = leadership.wait_for(|l| matches!(l, lease::Leadership::Lost(_))) => {
            let why = match l.as_deref() {
                Ok(lease::Leadership::Lost(why)) => why.clone(),
                _ => "the election thread stopped".into(),
            };
            Err(anyhow::anyhow!("stopped acting as leader: {why}; exiting so that a fresh process takes over"))
        }
        _ = controller => Ok(()),
    }
}

/// How long passes may be asked for an event whose object the cache lacks
/// before it is warned of: the creation's answer normally puts the object
/// in at once, and the creator reads it back after a create
/// conflict ([`spec::create_missing`]).
const UNSEEN_WARN_AFTER: Duration = Duration::from_secs(15);

/// The events passes were asked for without an object in the cache: when
/// each was first so, and whether it was warned of. Forgotten once no pass
/// was asked for them for [`UNSEEN_FORGET_AFTER`].
#[derive(Default)]
struct Unseen(HashMap<String, (Instant, Instant, bool)>);

/// How long an event passes are no longer asked for stays remembered.
const UNSEEN_FORGET_AFTER: Duration = Duration::from_secs(60);

impl Unseen {
    /// Notes a pass asked for `name` at `now`; true the first time it has
    /// lasted [`UNSEEN_WARN_AFTER`] (then again each time it lasts as long
    /// once more).
    fn asked(&mut self, name: &str, now: Instant) -> bool {
        self.0
            .retain(|_, (_, last, _)| now.duration_since(*last) < UNSEEN_FORGET_AFTER);
        let (first, last, _) = self.0.entry(name.to_owned()).or_insert((now, now, false));
        *last = now;
        if now.duration_since(*first) >= UNSEEN_WARN_AFTER {
            *first = now;
            return true;
        }
        false
    }
}

/// One pass over `ev` once it holds a permit of `gate` (its round in the
/// line of a node whose agent reports it, then nearest deadline first:
/// [`gate::deadline_of`], behind the first passes when its last pass
/// failed; held until the pass's node writes are sent, see [`reconcile`]),
/// over the event as the cache holds it then, not as it was when the pass
/// was asked for: a pass that waited behind others would otherwise act on
/// a version its own earlier pass, or Azure's progress, has since replaced.
/// An event deleted meanwhile needs no pass.
///
/// # Errors
/// As [`reconcile`].
async fn gated(ev: Arc<ScheduledEvent>, ctx: Arc<Context>, gate: Gate) -> Result<Requeue, Error> {
    let name = ev.name_any();
    let mut deadline = gate::deadline_of(&ev, chrono::Utc::now());
    let failed = ctx
        .memory
        .failures
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&name)
        .is_some_and(|n| *n > 0);
    if failed {
        deadline = deadline.after_failure();
    }
    let permit = gate.acquire(deadline, &reporters(&ctx, &name)).await;
    // The same store the pass was asked from: as new, or newer.
    match ctx.caches.events.get(&ObjectRef::from_obj(ev.as_ref())) {
        Some(current) => reconcile(current, ctx, permit).await,
        None => Ok(Requeue::await_change()),
    }
}

/// The nodes whose agents report the event `name` (each report's
/// `spec.report.node`, which the agents' admission policy holds to the
/// writer's own node), sorted: the lines the event's passes count in at
/// the gate.
fn reporters(ctx: &Context, name: &str) -> Vec<String> {
    let mut nodes: Vec<String> = ctx
        .caches
        .reports
        .state()
        .iter()
        .filter(|r| r.spec.scheduled_event == name)
        .map(|r| r.spec.report.node.clone())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}

/// The delay before retrying a failed reconcile, by the count of
/// consecutive failures of the same object (1-based): after a conflict
/// (the event's object changed since the cache showed it: another write
/// made progress) 200 ms doubling up to [`MAX_CONFLICT_BACKOFF`]; else
/// 1 s doubling up to [`MAX_ERROR_BACKOFF`]; each with backon's jitter (up
/// to as much again), so that passes that lost the same race do not meet
/// again. A node write that loses fails the node alone, not the pass
/// ([`crate::controller::act::refused`]).
pub fn error_backoff(err: &Error, failures: u32) -> Duration {
    use backon::BackoffBuilder as _;
    let (first, max) = if err.category() == "conflict" {
        (Duration::from_millis(200), MAX_CONFLICT_BACKOFF)
    } else {
        (Duration::from_secs(1), MAX_ERROR_BACKOFF)
    };
    let n = usize::try_from(failures.clamp(1, 32)).unwrap_or(1);
    backon::ExponentialBuilder::default()
        .with_min_delay(first)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
        .build()
        .nth(n - 1)
        .unwrap_or(max)
}

/// The longest [`error_backoff`] after conflicts, before its jitter.
pub const MAX_CONFLICT_BACKOFF: Duration = Duration::from_secs(5);

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

    /// A write the API server throttles (429 with `Retry-After`) while
    /// the Lease lapses is not sent again: the guard sits inside kube's
    /// retry layer, so the retry finds the Lease lapsed. The server on
    /// loopback (axum, as the metrics server) answers every request 429
    /// and ends the Lease's validity as it answers the first; with the
    /// guard outside the retry layer, the retries it sent kept coming.
    #[tokio::test]
    async fn a_write_retried_after_the_lease_lapsed_is_not_sent_again() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let validity = lease::Validity::default();
        validity.leading_for(Duration::from_secs(60));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let answer = {
            let (validity, received) = (validity.clone(), received.clone());
            move || {
                received.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                validity.clear();
                let status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                    "status": "Failure", "message": "throttled", "reason": "TooManyRequests", "code": 429});
                std::future::ready((
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    [(axum::http::header::RETRY_AFTER, "1")],
                    axum::Json(status),
                ))
            }
        };
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, axum::Router::new().fallback(answer)).await;
        });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        assert!(config.default_retry);
        let writes = Writes::guarded(config, &validity).unwrap();
        let api: Api<ConfigMap> = Api::namespaced(writes.client, "default");
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("c".into());
        let sent = tokio::time::timeout(
            Duration::from_secs(8),
            api.create(&kube::api::PostParams::default(), &cm),
        )
        .await;
        server.abort();
        let n = received.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(n, 1, "requests the server received: {n} ({sent:?})");
        let refused = sent.expect("the retry is refused at once, not waited out");
        assert!(
            refused.is_err_and(|e| e.to_string().contains("renewed")),
            "the write failed with the guard's refusal"
        );
    }

    #[test]
    fn passes_asked_without_an_object_are_warned_of_once_they_last() {
        let mut u = Unseen::default();
        let t0 = Instant::now();
        assert!(!u.asked("a", t0));
        assert!(!u.asked("a", t0 + Duration::from_secs(5)));
        assert!(u.asked("a", t0 + UNSEEN_WARN_AFTER));
        assert!(!u.asked("a", t0 + UNSEEN_WARN_AFTER + Duration::from_secs(1)));
        // Asked again long after the last: a new beginning.
        let later = t0 + UNSEEN_WARN_AFTER + UNSEEN_FORGET_AFTER * 2;
        assert!(!u.asked("a", later));
    }

    #[test]
    fn reconcile_errors_back_off_exponentially_with_jitter_and_a_cap() {
        let within = |d: Duration, base: Duration| d >= base && d <= base * 2;
        let e = status_error(500);
        for (n, base) in [1u64, 2, 4, 8, 16, 32, 60, 60, 60].into_iter().enumerate() {
            let d = error_backoff(&e, u32::try_from(n).unwrap() + 1);
            assert!(within(d, Duration::from_secs(base)), "{}: {d:?}", n + 1);
        }
        // Conflicts: 200 ms doubling to 5 s.
        for (n, base) in [200u64, 400, 800, 1600, 3200, 5000, 5000]
            .into_iter()
            .enumerate()
        {
            let d = error_backoff(&status_error(409), u32::try_from(n).unwrap() + 1);
            assert!(within(d, Duration::from_millis(base)), "{}: {d:?}", n + 1);
        }
        // Jitter: passes that lost the same race do not all come back
        // together.
        let spread: std::collections::HashSet<Duration> = (0..20)
            .map(|_| error_backoff(&status_error(409), 3))
            .collect();
        assert!(spread.len() > 1, "{spread:?}");
        // A spec write conditional on a version the pass read that is no
        // longer current is a conflict too.
        let stale_spec = Error::WriteEvent {
            name: "ev".into(),
            source: kube::Error::Api(
                kube::core::Status {
                    code: 409,
                    ..Default::default()
                }
                .boxed(),
            ),
        };
        assert_eq!(stale_spec.category(), "conflict");
        assert!(error_backoff(&stale_spec, 1) <= Duration::from_millis(400));
    }
}
