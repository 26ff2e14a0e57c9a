//! The per-node agent: polls this VM's IMDS once a second, mirrors every
//! event into its `ScheduledEvent`, records the VM name on its own Node, and
//! carries out approvals the controller decided.
//!
//! Spec writes (see `objects`): created, or replaced whole conditional on
//! the `resourceVersion` read, with field manager `forewarn-agent`, so a
//! field IMDS dropped leaves the object, and two agents never overwrite
//! each other: the loser re-reads and merges forward (`mirror`).
//!
//! It writes to the API server only when its IMDS document changes, each
//! event on its own (one failing event never holds back the others), and
//! watches `ScheduledEvent`s only while its document lists a `Scheduled`
//! event, so an idle cluster costs the API server nothing per poll.

pub mod approval;
pub mod mirror;
mod objects;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};
use chrono::Utc;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource};
use prometheus::Registry;
use serde_json::json;
use tokio::time::MissedTickBehavior;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::cli::AgentArgs;
use crate::crd::{AGENT_MANAGER, ScheduledEvent, VM_NAME_ANNOTATION};
use crate::imds::client::Client as ImdsClient;
use crate::imds::model::{Document, Event, EventStatus};
use crate::metrics::AgentMetrics;
use crate::server::{self, Readiness};

/// Errors of the agent's Kubernetes side.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Writing this agent's own `ScheduledEventReport` failed.
    #[error("failed to write this agent's report on ScheduledEvent {name}: {source}")]
    WriteReport {
        /// Object name of the event.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The report's name, `<event>.<node>`, would be longer than an object
    /// name may be (253 bytes).
    #[error(
        "cannot report on ScheduledEvent {name}: the node name {node:?} is too long for a report name (<event>.<node>, at most 253 bytes); the controller treats this node as unconfirmed"
    )]
    ReportName {
        /// Object name of the event.
        name: String,
        /// This agent's node.
        node: String,
    },
    /// Reading a `ScheduledEvent` failed.
    #[error("failed to get ScheduledEvent {name}: {source}")]
    GetEvent {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Creating or replacing a `ScheduledEvent` failed.
    #[error("failed to write ScheduledEvent {name}: {source}")]
    WriteEvent {
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
    let imds = ImdsClient::new(&args.imds_url, args.imds_timeout)?
        .with_first_timeout(args.imds_first_timeout);

    let shutdown = crate::cli::shutdown_signal();
    tokio::pin!(shutdown);

    // The first request may take up to two minutes while IMDS enables
    // Scheduled Events for the VM; keep asking, with backoff, until SIGTERM.
    let compute = tokio::select! {
        _ = &mut shutdown => return Ok(()),
        c = (|| imds.fetch_compute())
            .retry(ExponentialBuilder::default().with_max_delay(Duration::from_secs(30)).without_max_times())
            .notify(|e, d| warn!(error = %error_chain(e), retry_in = ?d, "IMDS compute metadata not available yet")) => c?,
    };
    info!(node = %args.node_name, vm = %compute.name, "Agent started");

    let mut agent = Agent {
        api: Api::all(client.clone()),
        reports: Api::all(client.clone()),
        nodes: Api::all(client),
        imds,
        node: args.node_name.clone(),
        vm: compute.name,
        metrics,
        fallback: args.approval_fallback,
        max_backoff: args.imds_max_backoff.max(args.poll_interval),
        backoff_policy: ExponentialBuilder::default()
            .with_min_delay(args.poll_interval)
            .with_max_delay(args.imds_max_backoff.max(args.poll_interval))
            .with_jitter()
            .without_max_times(),
        backoff: None,
        last_doc: None,
        tracked: HashMap::new(),
        reported: HashMap::new(),
        synced: false,
        warned_not_before: HashSet::new(),
        swept: false,
        next_sweep: Instant::now(),
        annotated: false,
        watch: None,
        attempts: HashMap::new(),
        decisions: HashMap::new(),
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
                Err(e) => {
                    warn!(error = %error_chain(&e), "Could not record the VM name on the node yet")
                }
            }
        }
        let span = info_span!("poll", node = %agent.node);
        agent.poll().instrument(span).await;
        ready.set(agent.annotated && agent.synced);
    }
    info!("Agent stopped");
    Ok(())
}

/// `e` and every error under it, joined by `: ` (a cause whose text its
/// parent already shows is not repeated), so a log line keeps the root
/// cause, e.g. `... error sending request ...: client error (Connect): tcp
/// connect error: Connection refused (os error 111)`.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        cause = c.source();
    }
    text
}

/// The `result` label of a failed IMDS scheduled events request
/// ([`AgentMetrics::polls`]).
fn imds_result(e: &crate::imds::client::Error) -> &'static str {
    use crate::imds::client::Error as E;
    match e {
        E::ParseEvents { .. } | E::TooLarge { .. } => "parse_error",
        E::Status { status, .. } if status.as_u16() == 429 => "throttled",
        E::Status { status, .. } if status.as_u16() == 410 => "gone",
        E::Status { status, .. } if status.is_server_error() => "server_error",
        E::Status { .. } => "client_error",
        _ => "unreachable",
    }
}

/// A reflector of `ScheduledEvent`s, aborted when dropped.
/// How long a failed `ScheduledEvent` watch waits before it lists again:
/// one IMDS poll (only agents with events to act on watch).
const WATCH_RESTART_DELAY: Duration = Duration::from_secs(1);

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
    reports: Api<crate::crd::ScheduledEventReport>,
    nodes: Api<Node>,
    imds: ImdsClient,
    node: String,
    vm: String,
    metrics: AgentMetrics,
    fallback: Duration,
    backoff_policy: ExponentialBuilder,
    /// The longest pause between polls while backing off.
    max_backoff: Duration,
    /// While IMDS asks to slow down: the delays still to come, and the
    /// earliest time of the next poll.
    backoff: Option<(ExponentialBackoff, Instant)>,
    /// The last document IMDS served.
    last_doc: Option<Document>,
    /// What this agent mirrored, per object name.
    tracked: HashMap<String, mirror::Tracked>,
    /// This agent's report entry as last written, per object name.
    reported: HashMap<String, objects::Reported>,
    /// Whether one document has been mirrored without a failure.
    synced: bool,
    /// Object names whose unparsable `NotBefore` has been warned about.
    warned_not_before: HashSet<String>,
    /// Whether the start-up sweep of stale objects is done.
    swept: bool,
    /// Earliest time of the next sweep attempt.
    next_sweep: Instant,
    annotated: bool,
    watch: Option<EventWatch>,
    /// Last approval attempt per object name.
    attempts: HashMap<String, Instant>,
    /// When this agent first saw each decided approval, per object name and
    /// appearance (its own monotonic clock, for the fallback delay).
    decisions: HashMap<(String, u32), Instant>,
}

impl Agent {
    async fn poll(&mut self) {
        if let Some((_, until)) = &self.backoff
            && Instant::now() < *until
        {
            return;
        }
        let asked = Instant::now();
        let fetched = self.imds.fetch_events().await;
        let took = asked.elapsed().as_secs_f64();
        let doc = match fetched {
            Ok(doc) => doc,
            Err(e) => {
                self.metrics.imds_request(imds_result(&e), took);
                // Keep the last good state; try again on the next tick, or
                // after a pause when IMDS asks for one.
                if e.wants_backoff() {
                    let (delays, until) = self
                        .backoff
                        .get_or_insert_with(|| (self.backoff_policy.build(), Instant::now()));
                    // Jitter may double a delay; never pause longer than the maximum.
                    let delay = delays
                        .next()
                        .unwrap_or(self.max_backoff)
                        .min(self.max_backoff);
                    *until = Instant::now() + delay;
                    self.metrics.backoffs.inc();
                    warn!(error = %error_chain(&e), retry_in = ?delay, "IMDS poll failed; backing off and keeping the last good document");
                } else {
                    warn!(error = %error_chain(&e), "IMDS poll failed; keeping the last good document");
                }
                return;
            }
        };
        if self.backoff.take().is_some() {
            info!("IMDS answers again; polling at the normal interval");
        }
        self.metrics.events.set(doc.events.len() as i64);
        let changed = self.last_doc.as_ref().is_none_or(|d| {
            d.incarnation != doc.incarnation || d.events != doc.events || d.rejected != doc.rejected
        });
        let went_down = self
            .last_doc
            .as_ref()
            .is_some_and(|d| doc.incarnation < d.incarnation);
        if went_down {
            info!(
                from = self.last_doc.as_ref().map(|d| d.incarnation),
                to = doc.incarnation,
                "DocumentIncarnation went down (VM redeployed?); checking every listed event again"
            );
        }
        if changed {
            info!(
                incarnation = doc.incarnation,
                events = doc.events.len(),
                rejected = doc.rejected.len(),
                "IMDS document changed"
            );
            for r in &doc.rejected {
                self.metrics.events_rejected.inc();
                warn!(index = r.index, event_id = ?r.event_id, bytes = %r.bytes, reason = %r.reason,
                    "Rejected a malformed entry of the IMDS document; mirroring the other events");
            }
        }
        // Warned once per event while it is listed with an odd NotBefore.
        self.warned_not_before.retain(|name| {
            doc.events
                .iter()
                .any(|e| e.not_before_unparsed.is_some() && e.object_name() == *name)
        });
        for ev in &doc.events {
            if let Some(text) = &ev.not_before_unparsed
                && self.warned_not_before.insert(ev.object_name())
            {
                warn!(event = %ev.event_id, not_before = %text, "Ignoring NotBefore in an unknown format");
            }
        }
        let work = mirror::plan_document(&doc, &self.tracked, went_down);
        let idle = work.listed.is_empty() && work.completions.is_empty();
        self.metrics
            .imds_request(if idle && !changed { "unchanged" } else { "ok" }, took);
        self.metrics.imds_last_success.set(Utc::now().timestamp());
        if idle || self.mirror(work).await == 0 {
            self.synced = true;
        }
        if !self.swept && self.synced && Instant::now() >= self.next_sweep {
            self.next_sweep = Instant::now() + SWEEP_RETRY;
            match self.sweep_stale(&doc).await {
                Ok(deferred) => self.swept = !deferred,
                Err(e) => {
                    warn!(error = %error_chain(&e), "Start-up sweep of finished events failed; will retry")
                }
            }
        }
        self.approve(&doc).await;
        self.last_doc = Some(doc);
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
    /// the event names goes first, others step in `fallback` after they first
    /// saw the decision (their own clock); a `Terminate` is approved only by
    /// the VM it names (Azure's advice).
    async fn approve(&mut self, doc: &Document) {
        let scheduled: Vec<&Event> = doc
            .events
            .iter()
            .filter(|e| e.event_status == EventStatus::Scheduled)
            .collect();
        if scheduled.is_empty() {
            self.watch = None;
            self.attempts.clear();
            self.decisions.clear();
            return;
        }
        let store = self.ensure_watch();
        if store.wait_until_ready().now_or_never().is_none() {
            return;
        }
        for ev in scheduled {
            let name = ev.object_name();
            let Some(obj) = store.get(&ObjectRef::new(&name)) else {
                continue;
            };
            let approval = obj.status.as_ref().and_then(|s| s.approval.as_ref());
            let key = (name.clone(), obj.spec.appearance);
            if approval.and_then(|a| a.decided_at).is_none() {
                self.decisions.remove(&key);
                continue;
            }
            let first_seen = *self.decisions.entry(key).or_insert_with(|| {
                debug!(event = %name, "Saw the approval decided");
                Instant::now()
            });
            if !approval::should_send(ev, approval, &self.vm, first_seen.elapsed(), self.fallback) {
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
                    warn!(event = %name, error = %error_chain(&e), "IMDS refused or missed the approval; will retry");
                    format!("Failed: {e}")
                }
            };
            if let Err(e) = self.record_approval(&name, &result).await {
                warn!(error = %error_chain(&e), "Could not record the approval result");
            }
        }
    }

    fn ensure_watch(&mut self) -> Store<ScheduledEvent> {
        if let Some(w) = &self.watch
            && !w.task.is_finished()
        {
            return w.store.clone();
        }
        let (store, mut writer) = reflector::store();
        let api = self.api.clone();
        // A failed watch is not resumed but started afresh (a new list)
        // after [`WATCH_RESTART_DELAY`]. kube's watcher resumes from the last
        // resourceVersion, which after an API server restart meets `410 too
        // old resource version` (the new server's watch cache begins later)
        // seconds after the return, and then a backoff before it lists: the
        // approval decision reached this agent 12 s after a 20 s outage
        // (tests/lifecycle.rs). The store keeps what it holds until a new
        // list is complete, so a decision seen before an outage still counts.
        let task = tokio::spawn(async move {
            loop {
                let stream = watcher(api.clone(), watcher::Config::default());
                futures::pin_mut!(stream);
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(event) => writer.apply_watcher_event(&event),
                        Err(e) => {
                            // Missing RBAC or an unreachable API server stops
                            // every approval: say so loudly.
                            warn!(error = %error_chain(&e), retry_in = ?WATCH_RESTART_DELAY, "ScheduledEvent watch failed; listing again");
                            break;
                        }
                    }
                }
                tokio::time::sleep(WATCH_RESTART_DELAY).await;
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

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("failed to fetch scheduled events: {source}")]
    struct Outer {
        source: Middle,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("error sending request")]
    struct Middle {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn the_root_cause_is_kept_once() {
        let e = Outer {
            source: Middle {
                source: std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "Connection refused",
                ),
            },
        };
        assert_eq!(
            error_chain(&e),
            "failed to fetch scheduled events: error sending request: Connection refused"
        );
    }
}

#[cfg(test)]
mod imds_result_tests {
    use super::imds_result;
    use crate::imds::client::Error;
    use reqwest::StatusCode;

    fn status(code: u16) -> Error {
        Error::Status {
            what: "fetch scheduled events",
            status: StatusCode::from_u16(code).expect("status"),
            body: String::new(),
        }
    }

    #[test]
    fn failed_imds_requests_get_a_closed_set_result() {
        let got: Vec<&str> = [429, 410, 500, 503, 404]
            .map(|c| imds_result(&status(c)))
            .to_vec();
        assert_eq!(
            got,
            [
                "throttled",
                "gone",
                "server_error",
                "server_error",
                "client_error"
            ]
        );
        let too_large = Error::TooLarge {
            what: "fetch scheduled events",
            url: "http://169.254.169.254".into(),
        };
        assert_eq!(imds_result(&too_large), "parse_error");
    }
}
