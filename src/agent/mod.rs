//! The per-node agent: polls this VM's IMDS once a second, reports every
//! event in its own `ScheduledEventReport` (its only write; see
//! [`reports`]), and carries out the approvals the controller decided,
//! only while its own document lists the event as decided (see
//! [`approval`]).
//!
//! It writes to the API server only when its view of an event changes,
//! each event on its own (one failing write never holds back the others),
//! and watches `ScheduledEvent`s only while its document lists a
//! `Scheduled` event, so an idle cluster costs the API server nothing per
//! poll.

pub mod approval;
pub mod metrics;
pub mod reports;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};
use chrono::Utc;
use futures::{FutureExt, StreamExt};
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use prometheus::Registry;
use tokio::time::MissedTickBehavior;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::cli::AgentArgs;
use crate::crd::{MAX_SENT_APPROVALS, Report, ScheduledEvent, ScheduledEventReport, SentApproval};
use crate::imds::client::Client as ImdsClient;
use crate::imds::model::{Document, Event, EventStatus};
use crate::server::{self, Readiness};
use metrics::AgentMetrics;

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
    /// Listing `ScheduledEventReport`s (this agent's own, at start) failed.
    #[error("failed to list ScheduledEventReports: {source}")]
    ListReports {
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Minimum time between two approval attempts for one event.
const APPROVAL_RETRY: Duration = Duration::from_secs(5);

/// The most of IMDS's answer to an approval a report keeps, bytes.
const APPROVAL_BODY_BYTES: usize = 512;

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
        reports: Api::all(client),
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
        reported: HashMap::new(),
        restored: false,
        synced: false,
        warned_not_before: HashSet::new(),
        watch: None,
        report_watch: None,
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
        if !agent.restored {
            match agent.restore().await {
                Ok(()) => agent.restored = true,
                Err(e) => {
                    warn!(error = %error_chain(&e), "Could not read this agent's earlier reports yet; reporting waits for them");
                    continue;
                }
            }
        }
        let span = info_span!("poll", node = %agent.node);
        agent.poll().instrument(span).await;
        ready.set(agent.synced);
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

/// How long a failed `ScheduledEvent` watch waits before it lists again:
/// one IMDS poll (only agents with events to act on watch).
const WATCH_RESTART_DELAY: Duration = Duration::from_secs(1);

/// What the watch of this agent's own reports saw.
enum OwnReports {
    /// The report about this event (object name) was deleted.
    Deleted(String),
    /// A (re)list completed with reports about these events: one deleted
    /// before the list or while the watch was down gives no `Deleted`.
    Listed(HashSet<String>),
}

/// A watch of this agent's own reports (field selector on its node),
/// aborted when dropped.
struct ReportWatch {
    seen: tokio::sync::mpsc::UnboundedReceiver<OwnReports>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ReportWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
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
    reports: Api<ScheduledEventReport>,
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
    /// This agent's reports as last written (or read back at start), by
    /// event object name.
    reported: HashMap<String, Report>,
    /// Whether the reports this agent wrote before it started were read.
    restored: bool,
    /// Whether one document has been reported without a failure.
    synced: bool,
    /// Object names whose unparsable `NotBefore` has been warned about.
    warned_not_before: HashSet<String>,
    watch: Option<EventWatch>,
    /// While this agent has a live report: the watch of its own reports.
    report_watch: Option<ReportWatch>,
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
                    "Rejected a malformed entry of the IMDS document; reporting the other events");
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
        let failures = self.write_reports(&doc).await + self.reapply_deleted().await;
        self.metrics
            .imds_request(if changed { "ok" } else { "unchanged" }, took);
        self.metrics.imds_last_success.set(Utc::now().timestamp());
        if failures == 0 {
            self.synced = true;
        }
        self.approve(&doc).await;
        self.last_doc = Some(doc);
    }

    /// Carries out approvals the controller decided (DESIGN.md rule 3; see
    /// [`approval::should_send`]): only for events this VM's document lists
    /// as `Scheduled`, with this agent's own report of the same appearance
    /// written, and the decision bound to the same content.
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
            // Only what this agent has reported of this very listing: the
            // report carries its appearance.
            let Some(mine) = self.reported.get(&name).filter(|r| r.is_listed()).cloned() else {
                continue;
            };
            let digest = reports::digest_of(ev);
            let Some(obj) = store.get(&ObjectRef::new(&name)) else {
                continue;
            };
            let approval = obj.status.as_ref().and_then(|s| s.approval.as_ref());
            let key = (name.clone(), mine.appearance);
            if approval::decision(approval).is_none() {
                self.decisions.remove(&key);
                continue;
            }
            let first_seen = *self.decisions.entry(key).or_insert_with(|| {
                debug!(event = %name, "Saw the approval decided");
                Instant::now()
            });
            if !approval::should_send(
                ev,
                &digest,
                &mine,
                approval,
                &self.vm,
                first_seen.elapsed(),
                self.fallback,
            ) {
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
            let sent_at = Utc::now();
            let (status, body) = match self.imds.approve(std::slice::from_ref(&ev.event_id)).await {
                Ok(body) => {
                    self.metrics.approvals.with_label_values(&["ok"]).inc();
                    info!(event = %name, appearance = mine.appearance, %digest, "Approved the event with IMDS (StartRequests)");
                    (200, body)
                }
                Err(e) => {
                    self.metrics.approvals.with_label_values(&["error"]).inc();
                    warn!(event = %name, error = %error_chain(&e), "IMDS refused or missed the approval; will retry");
                    let status = match &e {
                        crate::imds::client::Error::Status { status, .. } => status.as_u16(),
                        _ => 0,
                    };
                    (status, error_chain(&e))
                }
            };
            let mut report = mine;
            report.approvals.push(SentApproval {
                appearance: report.appearance,
                digest,
                sent_at,
                status,
                body: truncate(&body, APPROVAL_BODY_BYTES),
            });
            let excess = report.approvals.len().saturating_sub(MAX_SENT_APPROVALS);
            report.approvals.drain(..excess);
            if let Err(e) = self.apply_report(&name, report).await {
                warn!(error = %error_chain(&e), "Could not record the approval in this agent's report; will retry");
            }
        }
    }

    /// Applies again each live report of this agent that someone deleted
    /// (seen by the watch of its own reports, which runs while it has a live
    /// report), and forgets an ended one (the controller deletes those with
    /// their event). Returns the number of writes that failed.
    async fn reapply_deleted(&mut self) -> usize {
        let live = self.reported.values().any(Report::is_listed);
        if !live {
            self.report_watch = None;
            return 0;
        }
        let watch = match &mut self.report_watch {
            Some(w) if !w.task.is_finished() => w,
            _ => self.report_watch.insert(self.watch_own_reports()),
        };
        let mut deleted = Vec::new();
        while let Ok(seen) = watch.seen.try_recv() {
            match seen {
                OwnReports::Deleted(name) => deleted.push(name),
                OwnReports::Listed(names) => deleted.extend(
                    self.reported
                        .iter()
                        .filter(|(n, r)| r.is_listed() && !names.contains(*n))
                        .map(|(n, _)| n.clone()),
                ),
            }
        }
        deleted.sort();
        deleted.dedup();
        let mut failures = 0;
        for name in deleted {
            match self.reported.get(&name).cloned() {
                Some(r) if r.is_listed() => {
                    warn!(event = %name, "This agent's report was deleted while the event is listed; writing it again");
                    if let Err(e) = self.apply_report(&name, r).await {
                        failures += 1;
                        warn!(event = %name, error = %error_chain(&e), "Could not write this agent's report; will retry");
                    }
                }
                _ => {
                    self.reported.remove(&name);
                }
            }
        }
        failures
    }

    fn watch_own_reports(&self) -> ReportWatch {
        let (tx, seen) = tokio::sync::mpsc::unbounded_channel();
        let api = self.reports.clone();
        let config = watcher::Config::default().fields(&crate::crd::reports_of_node(&self.node));
        let task = tokio::spawn(async move {
            loop {
                let stream = watcher(api.clone(), config.clone());
                futures::pin_mut!(stream);
                let mut listing = HashSet::new();
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(watcher::Event::Delete(r)) => {
                            let _ = tx.send(OwnReports::Deleted(r.spec.scheduled_event));
                        }
                        Ok(watcher::Event::Init) => listing.clear(),
                        Ok(watcher::Event::InitApply(r)) => {
                            listing.insert(r.spec.scheduled_event);
                        }
                        Ok(watcher::Event::InitDone) => {
                            let _ = tx.send(OwnReports::Listed(std::mem::take(&mut listing)));
                        }
                        Ok(watcher::Event::Apply(_)) => {}
                        Err(e) => {
                            warn!(error = %error_chain(&e), retry_in = ?WATCH_RESTART_DELAY, "Watch of this agent's reports failed; listing again");
                            break;
                        }
                    }
                }
                tokio::time::sleep(WATCH_RESTART_DELAY).await;
            }
        });
        debug!("Watching this agent's own reports while it has a live one");
        ReportWatch { seen, task }
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
}

/// The first `max` bytes of `text`, cut at a character boundary.
fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
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
