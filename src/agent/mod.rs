//! The per-node agent: polls this VM's IMDS once a second, mirrors every
//! event into its `ScheduledEvent` (server-side apply, field manager
//! `forewarn-agent`), records the VM name on its own Node, and carries out
//! approvals the controller decided.
//!
//! It writes to the API server only when its IMDS document changes, and
//! watches `ScheduledEvent`s only while its document lists a `Scheduled`
//! event, so an idle cluster costs the API server nothing per poll.

pub mod approval;
pub mod mirror;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use chrono::Utc;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use prometheus::Registry;
use serde_json::json;
use tokio::time::MissedTickBehavior;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::cli::AgentArgs;
use crate::crd::{AGENT_MANAGER, ScheduledEvent, ScheduledEventSpec, VM_NAME_ANNOTATION};
use crate::imds::client::Client as ImdsClient;
use crate::imds::model::{Document, Event, EventStatus};
use crate::metrics::AgentMetrics;
use crate::server::{self, Readiness};

/// Errors of the agent's Kubernetes side.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading a `ScheduledEvent` failed.
    #[error("failed to get ScheduledEvent {name}: {source}")]
    GetEvent {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Writing a `ScheduledEvent` failed.
    #[error("failed to apply ScheduledEvent {name}: {source}")]
    ApplyEvent {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Listing `ScheduledEvent`s failed.
    #[error("failed to list ScheduledEvents: {source}")]
    ListEvents {
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Writing the approval result failed.
    #[error("failed to record the approval of {name}: {source}")]
    RecordApproval {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Annotating this node with its VM name failed.
    #[error("failed to annotate node {node}: {source}")]
    AnnotateNode {
        /// Node name.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An event whose stored object is older than this and which names this VM
/// but is absent from this VM's document is taken as finished at start-up.
/// The age guard keeps a freshly created object (another VM's document can
/// change a moment before ours) from being completed by mistake.
const STALE_AFTER: chrono::TimeDelta = chrono::TimeDelta::seconds(30);
/// Time between start-up sweeps while some objects are too young to judge.
const SWEEP_RETRY: Duration = Duration::from_secs(5);
/// Minimum time between two approval attempts for one event.
const APPROVAL_RETRY: Duration = Duration::from_secs(5);

/// Runs the agent until SIGTERM.
///
/// # Errors
/// When the Kubernetes client or the metrics server cannot start; everything
/// after start-up is retried, never fatal.
pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let registry = Registry::new();
    let metrics = AgentMetrics::register(&registry)?;
    let ready = Readiness::default();
    server::spawn(args.metrics_addr, registry, ready.clone()).await?;
    let imds = ImdsClient::new(&args.imds_url, args.imds_timeout)?;

    let shutdown = crate::cli::shutdown_signal();
    tokio::pin!(shutdown);

    // The first request may take up to two minutes while IMDS enables
    // Scheduled Events for the VM; keep asking, with backoff, until SIGTERM.
    let compute = tokio::select! {
        _ = &mut shutdown => return Ok(()),
        c = (|| imds.fetch_compute())
            .retry(ExponentialBuilder::default().with_max_delay(Duration::from_secs(30)).without_max_times())
            .notify(|e, d| warn!(error = %e, retry_in = ?d, "IMDS compute metadata not available yet")) => c?,
    };
    info!(node = %args.node_name, vm = %compute.name, "Agent started");

    let mut agent = Agent {
        api: Api::all(client.clone()),
        nodes: Api::all(client),
        imds,
        node: args.node_name.clone(),
        vm: compute.name,
        metrics,
        fallback: args.approval_fallback,
        mirrored: None,
        swept: false,
        next_sweep: Instant::now(),
        annotated: false,
        watch: None,
        attempts: HashMap::new(),
    };

    let mut tick = tokio::time::interval(args.poll_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            _ = tick.tick() => {}
        }
        if !agent.annotated {
            match agent.annotate_node().await {
                Ok(()) => agent.annotated = true,
                Err(e) => warn!(error = %e, "Could not record the VM name on the node yet"),
            }
        }
        let span = info_span!("poll", node = %agent.node);
        agent.poll().instrument(span).await;
        ready.set(agent.annotated && agent.mirrored.is_some());
    }
    info!("Agent stopped");
    Ok(())
}

/// A reflector of `ScheduledEvent`s, aborted when dropped.
struct EventWatch {
    store: Store<ScheduledEvent>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EventWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Agent {
    api: Api<ScheduledEvent>,
    nodes: Api<Node>,
    imds: ImdsClient,
    node: String,
    vm: String,
    metrics: AgentMetrics,
    fallback: Duration,
    /// The last document whose events were all written successfully.
    mirrored: Option<Document>,
    /// Whether the start-up sweep of stale objects is done.
    swept: bool,
    /// Earliest time of the next sweep attempt.
    next_sweep: Instant,
    annotated: bool,
    watch: Option<EventWatch>,
    /// Last approval attempt per object name.
    attempts: HashMap<String, Instant>,
}

impl Agent {
    async fn poll(&mut self) {
        let doc = match self.imds.fetch_events().await {
            Ok(doc) => doc,
            Err(e) => {
                let result = match e {
                    crate::imds::client::Error::ParseEvents { .. } => "parse_error",
                    _ => "error",
                };
                self.metrics.polls.with_label_values(&[result]).inc();
                // Keep the last good state; try again on the next tick.
                warn!(error = %e, "IMDS poll failed; keeping the last good document");
                return;
            }
        };
        self.metrics.events.set(doc.events.len() as i64);
        let unchanged = self
            .mirrored
            .as_ref()
            .is_some_and(|m| m.incarnation == doc.incarnation && mirror::same_events(m, &doc));
        self.metrics
            .polls
            .with_label_values(&[if unchanged { "unchanged" } else { "ok" }])
            .inc();
        if !unchanged {
            info!(
                incarnation = doc.incarnation,
                events = doc.events.len(),
                "IMDS document changed"
            );
            match self.mirror(&doc).await {
                Ok(()) => {
                    self.metrics.mirror_writes.with_label_values(&["ok"]).inc();
                    self.mirrored = Some(doc.clone());
                }
                Err(e) => {
                    self.metrics
                        .mirror_writes
                        .with_label_values(&["error"])
                        .inc();
                    // Not recorded as mirrored: the next tick writes it again.
                    error!(error = %e, "Could not mirror the IMDS document; will retry");
                }
            }
        }
        if !self.swept && self.mirrored.is_some() && Instant::now() >= self.next_sweep {
            self.next_sweep = Instant::now() + SWEEP_RETRY;
            match self.sweep_stale(&doc).await {
                Ok(deferred) => self.swept = !deferred,
                Err(e) => warn!(error = %e, "Start-up sweep of finished events failed; will retry"),
            }
        }
        self.approve(&doc).await;
    }

    /// Writes every event of `doc` forward, and completes the ones that left it.
    async fn mirror(&mut self, doc: &Document) -> Result<()> {
        for ev in &doc.events {
            self.mirror_event(ev).await?;
        }
        if let Some(prev) = &self.mirrored {
            for name in mirror::vanished(prev, doc) {
                self.complete(&name).await?;
            }
        }
        Ok(())
    }

    /// Marks an event that left the document `Completed` (if it is not yet).
    async fn complete(&self, name: &str) -> Result<()> {
        let done = self
            .write_forward(name, |stored| stored.and_then(mirror::completed))
            .await?;
        if done {
            info!(event = %name, "Event left the IMDS document; marked Completed");
        }
        Ok(())
    }

    /// Mirrors one event of the document.
    async fn mirror_event(&self, ev: &Event) -> Result<()> {
        let name = ev.object_name();
        let seen = mirror::spec_for(ev);
        if self
            .write_forward(&name, |stored| mirror::merge_forward(stored, seen.clone()))
            .await?
        {
            info!(event = %name, r#type = %seen.event_type, status = %seen.event_status, resources = ?seen.resources, "Mirrored event");
        }
        Ok(())
    }

    /// Writes `next(stored spec)` when it is `Some`; returns whether it wrote.
    ///
    /// A new object is created (two agents creating it at once cannot
    /// overwrite each other: the second gets a 409 and merges); an existing
    /// one is applied only if nobody wrote it since it was read
    /// (`resourceVersion`), so a lagging agent never moves its status back.
    /// Conflicts, normal when several agents see one event, are re-read and
    /// merged a few times, then left to the next tick.
    async fn write_forward(
        &self,
        name: &str,
        next: impl Fn(Option<&ScheduledEventSpec>) -> Option<ScheduledEventSpec>,
    ) -> Result<bool> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let stored = self
                .api
                .get_opt(name)
                .await
                .map_err(|source| Error::GetEvent {
                    name: name.into(),
                    source,
                })?;
            let rv = stored
                .as_ref()
                .and_then(|o| o.meta().resource_version.clone());
            let Some(spec) = next(stored.as_ref().map(|o| &o.spec)) else {
                return Ok(false);
            };
            let written = match rv {
                None => self
                    .api
                    .create(
                        &PostParams {
                            field_manager: Some(AGENT_MANAGER.into()),
                            ..PostParams::default()
                        },
                        &ScheduledEvent::new(name, spec),
                    )
                    .await
                    .map(|_| ()),
                Some(rv) => self.apply_spec(name, &spec, rv).await,
            };
            match written {
                Ok(()) => return Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < 3 => {}
                Err(source) => {
                    return Err(Error::ApplyEvent {
                        name: name.into(),
                        source,
                    });
                }
            }
        }
    }

    /// Server-side apply of the spec, conditional on `resource_version`.
    async fn apply_spec(
        &self,
        name: &str,
        spec: &ScheduledEventSpec,
        resource_version: String,
    ) -> Result<(), kube::Error> {
        let body = json!({
            "apiVersion": ScheduledEvent::api_version(&()),
            "kind": ScheduledEvent::kind(&()),
            "metadata": { "name": name, "resourceVersion": resource_version },
            "spec": spec,
        });
        self.api
            .patch(
                name,
                &PatchParams::apply(AGENT_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map(|_| ())
    }

    /// After a restart the agent has no memory of its previous document:
    /// objects that name this VM, are not finished, and are absent from its
    /// document have left IMDS while it was away (IMDS delivers an event to
    /// every VM it names). Returns whether some were too young to judge and
    /// the sweep must run again later.
    async fn sweep_stale(&self, doc: &Document) -> Result<bool> {
        let all = self
            .api
            .list(&ListParams::default())
            .await
            .map_err(|source| Error::ListEvents { source })?;
        let now = Utc::now();
        let mut deferred = false;
        for obj in all {
            let name = obj.meta().name.clone().unwrap_or_default();
            let listed = doc.events.iter().any(|e| e.object_name() == name);
            let names_me = obj
                .spec
                .resources
                .iter()
                .any(|r| r.eq_ignore_ascii_case(&self.vm));
            let finished =
                EventStatus::from(obj.spec.event_status.as_str()) == EventStatus::Completed;
            if !names_me || listed || finished {
                continue;
            }
            let old = obj
                .meta()
                .creation_timestamp
                .as_ref()
                .is_some_and(|t| now.timestamp() - t.0.as_second() > STALE_AFTER.num_seconds());
            if old {
                self.complete(&name).await?;
            } else {
                deferred = true;
            }
        }
        Ok(deferred)
    }

    async fn annotate_node(&self) -> Result<()> {
        let body = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": self.node, "annotations": { VM_NAME_ANNOTATION: self.vm } },
        });
        self.nodes
            .patch(
                &self.node,
                &PatchParams::apply(AGENT_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|source| Error::AnnotateNode {
                node: self.node.clone(),
                source,
            })?;
        info!(node = %self.node, vm = %self.vm, "Recorded the VM name on the node");
        Ok(())
    }

    /// Carries out approvals the controller decided (DESIGN.md rule 3): only
    /// for events this VM's document lists as `Scheduled`; the agent of a VM
    /// the event names goes first, others step in after `fallback`; a
    /// `Terminate` is approved only by the VM it names (Azure's advice).
    async fn approve(&mut self, doc: &Document) {
        let scheduled: Vec<&Event> = doc
            .events
            .iter()
            .filter(|e| e.event_status == EventStatus::Scheduled)
            .collect();
        if scheduled.is_empty() {
            self.watch = None;
            self.attempts.clear();
            return;
        }
        let store = self.ensure_watch();
        if store.wait_until_ready().now_or_never().is_none() {
            return;
        }
        let now = Utc::now();
        for ev in scheduled {
            let name = ev.object_name();
            let Some(obj) = store.get(&ObjectRef::new(&name)) else {
                continue;
            };
            let approval = obj.status.as_ref().and_then(|s| s.approval.as_ref());
            if !approval::should_send(ev, approval, &self.vm, now, self.fallback) {
                continue;
            }
            if self
                .attempts
                .get(&name)
                .is_some_and(|t| t.elapsed() < APPROVAL_RETRY)
            {
                continue;
            }
            self.attempts.insert(name.clone(), Instant::now());
            let result = match self.imds.approve(std::slice::from_ref(&ev.event_id)).await {
                Ok(()) => {
                    self.metrics.approvals.with_label_values(&["ok"]).inc();
                    info!(event = %name, "Approved the event with IMDS (StartRequests)");
                    approval::ACCEPTED.to_string()
                }
                Err(e) => {
                    self.metrics.approvals.with_label_values(&["error"]).inc();
                    warn!(event = %name, error = %e, "IMDS refused or missed the approval; will retry");
                    format!("Failed: {e}")
                }
            };
            if let Err(e) = self.record_approval(&name, &result).await {
                warn!(error = %e, "Could not record the approval result");
            }
        }
    }

    fn ensure_watch(&mut self) -> Store<ScheduledEvent> {
        if let Some(w) = &self.watch
            && !w.task.is_finished()
        {
            return w.store.clone();
        }
        let (store, writer) = reflector::store();
        let stream = reflector::reflector(
            writer,
            watcher(self.api.clone(), watcher::Config::default()),
        )
        .default_backoff()
        .applied_objects();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                if let Err(e) = item {
                    debug!(error = %e, "ScheduledEvent watch error (retrying)");
                }
            }
        });
        debug!("Watching ScheduledEvents while events are scheduled");
        self.watch = Some(EventWatch {
            store: store.clone(),
            task,
        });
        store
    }

    async fn record_approval(&self, name: &str, result: &str) -> Result<()> {
        let body = json!({
            "apiVersion": ScheduledEvent::api_version(&()),
            "kind": ScheduledEvent::kind(&()),
            "metadata": { "name": name },
            "status": { "approval": {
                "sentAt": Utc::now(),
                "sentBy": self.node,
                "result": result,
            }},
        });
        self.api
            .patch_status(
                name,
                &PatchParams::apply(AGENT_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|source| Error::RecordApproval {
                name: name.into(),
                source,
            })?;
        Ok(())
    }
}
