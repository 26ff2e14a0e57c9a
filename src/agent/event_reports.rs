//! The agent's only write: its own `ScheduledEventReport` per event, its
//! complete view of the event from its own IMDS document (docs/trust.md).
//!
//! The pure part ([`reports_to_write`]) says which reports a document asks for, from
//! what the agent last wrote; the I/O part applies them by server-side apply
//! (field manager `forewarn-agent`) and, at start, reads back the reports
//! this agent wrote before it restarted ([`Reporter`], a task of its own:
//! a slow API server never delays a poll). One apply per change of its view
//! (first seen `Scheduled`, `Started`, gone from the document, an approval
//! sent); no read-modify-write, no conditional replace: no other writer
//! touches the object, so there is nothing to conflict with.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};
use futures::StreamExt;
use kube::Resource;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Error, Result, error_chain};
use crate::api::{
    AGENT_MANAGER, EventStatus as CrdStatus, MAX_DESCRIPTION, MAX_SENT_APPROVALS, Report,
    ScheduledEventReport, SentApproval, report_name,
};
use crate::imds::model::{Document, Event, object_name};
use crate::kubeclient::watch_backoff;
use crate::metrics::agent::AgentMetrics;
use crate::server::Readiness;
use crate::witnesses::Witnessing;

/// This agent's view of `ev`, listed in a document of `incarnation`, as
/// appearance `appearance`. An `EventStatus` this version does not know is
/// reported as `Started` (see [`crate::api::EventStatus`]).
pub fn view_of(ev: &Event, node: &str, vm: &str, incarnation: i64, appearance: u32) -> Report {
    Report {
        node: node.to_owned(),
        vm: vm.to_owned(),
        named: ev.names_vm(vm),
        event_status: (&ev.event_status).into(),
        appearance,
        event_id: ev.event_id.clone(),
        event_type: ev.event_type.to_string(),
        event_source: ev.event_source.clone(),
        resource_type: ev.resource_type.clone(),
        resources: ev.resources.clone(),
        not_before: ev.not_before,
        duration_seconds: ev.duration_seconds,
        // A longer text would have the API server refuse the whole report.
        description: ev.description.chars().take(MAX_DESCRIPTION).collect(),
        document_incarnation: incarnation,
        approvals: Vec::new(),
    }
}

/// The identity digest of `ev` as this agent would report it
/// ([`crate::api::identity_digest`]): what an approval decision is bound to.
pub fn digest_of(ev: &Event) -> String {
    crate::api::identity_digest(
        &ev.event_id,
        &ev.event_type.to_string(),
        &ev.event_source,
        &ev.resource_type,
        &ev.resources,
        ev.duration_seconds,
    )
}

/// Whether two views say the same of the event (the document incarnation
/// aside: it changes whenever any event of the document does).
fn same_view(a: &Report, b: &Report) -> bool {
    Report {
        document_incarnation: 0,
        ..a.clone()
    } == Report {
        document_incarnation: 0,
        ..b.clone()
    }
}

/// The reports `doc` asks this agent to write, by event object name, given
/// the reports it last wrote (`reported`):
///
/// - a listed event not reported, or reported `Completed` (it came back:
///   the appearance goes up by one), or whose view changed, if it names
///   this agent's VM, or `witnessing` wants it (it names a VM whose agent
///   is silent: [`crate::witnesses`]), or this agent reports it live
///   already (it follows what it reported to its end);
/// - a reported live event the document no longer lists: `Completed`, with
///   the content it had. An entry the parser rejected but whose `EventId`
///   it could read counts as listed (neither written nor ended).
///
/// Approvals already sent stay in the report of the same appearance.
pub fn reports_to_write(
    doc: &Document,
    reported: &HashMap<String, Report>,
    node: &str,
    vm: &str,
    witnessing: &Witnessing,
) -> Vec<(String, Report)> {
    let mut out = Vec::new();
    let mut listed = HashSet::new();
    for ev in &doc.events {
        let name = ev.object_name();
        if !listed.insert(name.clone()) {
            continue;
        }
        let before = reported.get(&name);
        let follows = before.is_some_and(Report::is_listed);
        if !(follows || ev.names_vm(vm) || witnessing.wanted(&ev.resources)) {
            continue;
        }
        let appearance = match before {
            None => 1,
            Some(b) if !b.is_listed() => b.appearance.saturating_add(1),
            Some(b) => b.appearance,
        };
        let mut view = view_of(ev, node, vm, doc.incarnation, appearance);
        if let Some(b) = before.filter(|b| b.appearance == appearance) {
            view.approvals = b.approvals.clone();
        }
        if before.is_none_or(|b| !same_view(b, &view)) {
            out.push((name, view));
        }
    }
    for r in &doc.rejected {
        if let Some(id) = &r.event_id {
            listed.insert(object_name(id));
        }
    }
    let mut gone: Vec<(String, Report)> = reported
        .iter()
        .filter(|(name, r)| r.is_listed() && !listed.contains(*name))
        .map(|(name, r)| {
            (
                name.clone(),
                Report {
                    event_status: CrdStatus::Completed,
                    document_incarnation: doc.incarnation,
                    ..r.clone()
                },
            )
        })
        .collect();
    gone.sort_by(|a, b| a.0.cmp(&b.0));
    out.extend(gone);
    out
}

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
struct OwnWatch {
    seen: mpsc::UnboundedReceiver<OwnReports>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OwnWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The report writer: the only task that writes to the API server. It
/// turns each new document into the reports it asks for ([`reports_to_write`]), records
/// the approvals the approval task sent, writes again a report someone
/// deleted while its event is listed, and forgets a report of an ended
/// event once the controller deleted it (so its memory is bounded by the
/// events the controller keeps).
pub struct Reporter {
    /// For requests (timeouts: [`crate::kubeclient::Clients`]).
    pub api: Api<ScheduledEventReport>,
    /// For the watch of this agent's own reports.
    pub watch_api: Api<ScheduledEventReport>,
    /// This agent's node.
    pub node: String,
    /// This agent's VM (`compute.name`).
    pub vm: String,
    /// The agent's metrics.
    pub metrics: AgentMetrics,
    /// Set once the earlier reports were read and a document came.
    pub ready: Readiness,
    /// The latest IMDS document.
    pub docs: watch::Receiver<Option<Arc<Document>>>,
    /// Approvals the approval task sent: the event's object name, and what
    /// to record.
    pub sent: mpsc::UnboundedReceiver<(String, SentApproval)>,
    /// Where the reports as last written are published (for the approval
    /// task: it sends only for an appearance this agent has reported).
    pub written_tx: watch::Sender<Arc<HashMap<String, Report>>>,
    /// Which events of other VMs to report ([`crate::witnesses`]): the
    /// latest list of silent VMs the controller published.
    pub witnessing: watch::Receiver<Witnessing>,
}

/// How long the record of an approval this agent sent waits before it is
/// written, unless the event changes meanwhile: IMDS usually starts an
/// approved event within a poll or two, and the approval and `Started`
/// then go in one write (a wave of N events costs N writes fewer). The
/// controller learns of the accepted approval that much later; it has
/// decided it already, and nothing waits on the record but the phase
/// `Approved`.
const APPROVAL_RECORD_WAIT: Duration = Duration::from_secs(2);

/// How long after this agent first has a report the watch of its own
/// reports starts (and after it has one again, once it had none). The
/// watch only finds a report someone deleted, to write it again, and its
/// first list finds one deleted before it; started at once, the list and
/// watch of every agent of a 1,000-VM event came in the middle of the
/// controller's 1,000 cordons (about 190 of the 450 requests the agents
/// made while the cordons were in flight).
const OWN_WATCH_AFTER: Duration = Duration::from_secs(10);

/// At most this many report writes are in flight at once.
const PARALLEL_WRITES: usize = 8;

/// Backoff of failed report writes: from 1 s, doubling, up to 30 s, with
/// jitter (so that agents that failed together do not retry together).
fn write_backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times()
}

impl Reporter {
    /// Runs until the task is aborted: reads this agent's earlier reports
    /// (retried with backoff; nothing is written before), then writes what
    /// each document, approval and deletion asks for.
    pub async fn run(mut self) {
        let mut written = (|| self.restore())
            .retry(write_backoff())
            .notify(|e, d| warn!(error = %error_chain(e), retry_in = ?d, "Could not read this agent's earlier reports yet; reporting waits for them"))
            .await
            .unwrap_or_default();
        // What the server should hold and does not yet, by event.
        let mut pending: BTreeMap<String, Report> = BTreeMap::new();
        // Per event: the delays still to come and the earliest next try,
        // after a failed write (one failing write holds back no other).
        let mut retry: HashMap<String, (ExponentialBackoff, Instant)> = HashMap::new();
        // Per event: until when the record of an approval just sent waits
        // for the change it usually brings (see [`APPROVAL_RECORD_WAIT`]).
        let mut held: HashMap<String, Instant> = HashMap::new();
        let mut own: Option<OwnWatch> = None;
        // When the watch of its own reports is to start, while it is not
        // running and this agent has reports.
        let mut own_from: Option<Instant> = None;
        self.docs.mark_changed();
        loop {
            let next_retry = retry
                .values()
                .map(|(_, at)| *at)
                .chain(held.values().copied())
                .chain(own_from.filter(|_| own.is_none()))
                .min();
            tokio::select! {
                changed = self.docs.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let doc = self.docs.borrow_and_update().clone();
                    if let Some(doc) = doc {
                        let witnessing = self.witnessing.borrow_and_update().clone();
                        let desired = desired(&written, &pending);
                        let changed = reports_to_write(&doc, &desired, &self.node, &self.vm, &witnessing);
                        // A change of the event itself goes at once, with
                        // any approval record held for it.
                        for (name, _) in &changed {
                            held.remove(name);
                        }
                        pending.extend(changed);
                        self.ready.set(true);
                    }
                }
                // New witnesses wanted: the latest document again.
                Ok(()) = self.witnessing.changed() => {
                    let witnessing = self.witnessing.borrow_and_update().clone();
                    let doc = self.docs.borrow().clone();
                    if let Some(doc) = doc {
                        let desired = desired(&written, &pending);
                        pending.extend(reports_to_write(&doc, &desired, &self.node, &self.vm, &witnessing));
                    }
                }
                Some((name, sent)) = self.sent.recv() => {
                    held.entry(name.clone()).or_insert_with(|| Instant::now() + APPROVAL_RECORD_WAIT);
                    self.record_sent(&written, &mut pending, name, sent);
                }
                Some(seen) = async { match &mut own { Some(w) => w.seen.recv().await, None => std::future::pending().await } } => {
                    self.own_reports_seen(&mut written, &mut pending, seen);
                }
                () = async { match next_retry { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {}
            }
            // Every message already queued is taken before writing, so one
            // burst of changes is one write per report.
            while let Ok((name, sent)) = self.sent.try_recv() {
                held.entry(name.clone())
                    .or_insert_with(|| Instant::now() + APPROVAL_RECORD_WAIT);
                self.record_sent(&written, &mut pending, name, sent);
            }
            retry.retain(|name, _| pending.contains_key(name));
            let now = Instant::now();
            held.retain(|name, until| pending.contains_key(name) && *until > now);
            let due: Vec<String> = pending
                .keys()
                .filter(|n| retry.get(*n).is_none_or(|(_, at)| *at <= now))
                .filter(|n| !held.contains_key(*n))
                .cloned()
                .collect();
            if !due.is_empty() {
                for name in self.write(&mut written, &mut pending, due).await {
                    let (delays, at) = retry
                        .entry(name.clone())
                        .or_insert_with(|| (write_backoff().build(), now));
                    let delay = delays.next().unwrap_or(Duration::from_secs(30));
                    *at = Instant::now() + delay;
                    debug!(event = %name, retry_in = ?delay, "Backing off before writing this report again");
                }
            }
            // The watch of its own reports runs while this agent has any,
            // from OWN_WATCH_AFTER on (at once again if it ended).
            if written.is_empty() && pending.is_empty() {
                own = None;
                own_from = None;
            } else if own.as_ref().is_none_or(|w| w.task.is_finished()) {
                let from = *own_from.get_or_insert_with(|| Instant::now() + OWN_WATCH_AFTER);
                if Instant::now() >= from {
                    own = Some(self.watch_own_reports());
                }
            }
        }
    }

    /// Reads the reports this agent wrote before it (re)started, so that it
    /// goes on from them: an appearance continues, an event that left its
    /// document while it was away is reported `Completed` on the next
    /// document.
    async fn restore(&self) -> Result<HashMap<String, Report>> {
        let lp = ListParams::default().fields(&crate::api::reports_of_node(&self.node));
        let all = self
            .api
            .list(&lp)
            .await
            .map_err(|source| Error::ListReports { source })?;
        let mine: HashMap<String, Report> = all
            .into_iter()
            .filter(|r| r.spec.report.node == self.node)
            .map(|r| (r.spec.scheduled_event, r.spec.report))
            .collect();
        info!(reports = mine.len(), "Read this agent's earlier reports");
        self.written_tx.send_replace(Arc::new(mine.clone()));
        Ok(mine)
    }

    /// Adds the approval `sent` to the report about `name` it was sent
    /// for (same appearance), keeping the last [`MAX_SENT_APPROVALS`].
    fn record_sent(
        &self,
        written: &HashMap<String, Report>,
        pending: &mut BTreeMap<String, Report>,
        name: String,
        sent: SentApproval,
    ) {
        let Some(mut report) = pending.get(&name).or_else(|| written.get(&name)).cloned() else {
            return;
        };
        if report.appearance != sent.appearance {
            return;
        }
        report.approvals.push(sent);
        let excess = report.approvals.len().saturating_sub(MAX_SENT_APPROVALS);
        report.approvals.drain(..excess);
        pending.insert(name, report);
    }

    /// A report of this agent's deleted (or missing from a relist): written
    /// again while its event is listed, forgotten once it ended.
    fn own_reports_seen(
        &self,
        written: &mut HashMap<String, Report>,
        pending: &mut BTreeMap<String, Report>,
        seen: OwnReports,
    ) {
        let gone: Vec<String> = match seen {
            OwnReports::Deleted(name) => vec![name],
            OwnReports::Listed(names) => written
                .keys()
                .filter(|n| !names.contains(*n))
                .cloned()
                .collect(),
        };
        for name in gone {
            let Some(last) = written.remove(&name) else {
                continue;
            };
            let want = pending.remove(&name).unwrap_or(last);
            if want.is_listed() {
                warn!(event = %name, "This agent's report was deleted while the event is listed; writing it again");
                pending.insert(name, want);
            } else {
                debug!(event = %name, "The report of an ended event was deleted; forgetting it");
            }
        }
        self.written_tx.send_replace(Arc::new(written.clone()));
    }

    /// Writes the pending reports about the events `due`, at most
    /// [`PARALLEL_WRITES`] at once; returns the events whose write failed
    /// (those stay pending).
    async fn write(
        &self,
        written: &mut HashMap<String, Report>,
        pending: &mut BTreeMap<String, Report>,
        due: Vec<String>,
    ) -> Vec<String> {
        let mut batch: Vec<(String, Report)> = due
            .into_iter()
            .filter_map(|n| pending.get(&n).cloned().map(|r| (n, r)))
            .collect();
        // The reports the controller acts on first: those naming this
        // agent's own VM (a node moves only on its own agent's report), by
        // the nearest `NotBefore`; a witness's after them.
        batch.sort_by_key(|(name, r)| {
            (!r.named, r.not_before.is_none(), r.not_before, name.clone())
        });
        let results: Vec<(String, Report, Result<()>)> = futures::stream::iter(batch)
            .map(|(name, report)| async move {
                let r = apply_report(&self.api, &self.node, &name, &report).await;
                (name, report, r)
            })
            .buffer_unordered(PARALLEL_WRITES)
            .collect()
            .await;
        let mut failed = Vec::new();
        for (name, report, result) in results {
            match result {
                Ok(()) => {
                    self.metrics.mirror_writes.with_label_values(&["ok"]).inc();
                    // A newer want may have come meanwhile: it stays pending.
                    if pending.get(&name) == Some(&report) {
                        pending.remove(&name);
                    }
                    written.insert(name, report);
                }
                Err(e) => {
                    self.metrics
                        .mirror_writes
                        .with_label_values(&["error"])
                        .inc();
                    warn!(event = %name, error = %error_chain(&e), "Could not write this agent's report; will retry after a backoff");
                    failed.push(name);
                }
            }
        }
        self.written_tx.send_replace(Arc::new(written.clone()));
        failed
    }

    fn watch_own_reports(&self) -> OwnWatch {
        let (tx, seen) = mpsc::unbounded_channel();
        let config = watcher::Config::default().fields(&crate::api::reports_of_node(&self.node));
        let stream = watcher(self.watch_api.clone(), config).backoff(watch_backoff());
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            let mut listing = HashSet::new();
            while let Some(item) = stream.next().await {
                let sent = match item {
                    Ok(watcher::Event::Delete(r)) => {
                        tx.send(OwnReports::Deleted(r.spec.scheduled_event))
                    }
                    Ok(watcher::Event::Init) => {
                        listing.clear();
                        Ok(())
                    }
                    Ok(watcher::Event::InitApply(r)) => {
                        listing.insert(r.spec.scheduled_event);
                        Ok(())
                    }
                    Ok(watcher::Event::InitDone) => {
                        tx.send(OwnReports::Listed(std::mem::take(&mut listing)))
                    }
                    Ok(watcher::Event::Apply(_)) => Ok(()),
                    Err(e) => {
                        warn!(error = %error_chain(&e), "Watch of this agent's reports failed; resuming after a backoff");
                        Ok(())
                    }
                };
                if sent.is_err() {
                    return;
                }
            }
        });
        debug!("Watching this agent's own reports while it has any");
        OwnWatch { seen, task }
    }
}

/// The reports as they will be once every pending write is done.
fn desired(
    written: &HashMap<String, Report>,
    pending: &BTreeMap<String, Report>,
) -> HashMap<String, Report> {
    let mut all = written.clone();
    all.extend(pending.iter().map(|(n, r)| (n.clone(), r.clone())));
    all
}

/// Writes `report` as `node`'s agent's `ScheduledEventReport` about the
/// event `name`: a server-side apply of the whole object `<event>.<node>`
/// (field manager `forewarn-agent`, forced: no other writer owns its
/// fields).
///
/// # Errors
/// [`Error::ReportName`] when the name would be too long,
/// [`Error::WriteReport`] when the API server refuses or does not answer.
pub async fn apply_report(
    api: &Api<ScheduledEventReport>,
    node: &str,
    name: &str,
    report: &Report,
) -> Result<()> {
    let Some(object) = report_name(name, node) else {
        return Err(Error::ReportName {
            name: name.into(),
            node: node.to_owned(),
        });
    };
    let body = serde_json::json!({
        "apiVersion": ScheduledEventReport::api_version(&()),
        "kind": ScheduledEventReport::kind(&()),
        "metadata": { "name": object },
        "spec": { "scheduledEvent": name, "report": report },
    });
    api.patch(
        &object,
        &PatchParams::apply(AGENT_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await
    .map_err(|source| Error::WriteReport {
        name: name.into(),
        source,
    })?;
    if report.event_status == CrdStatus::Completed {
        info!(event = %name, appearance = report.appearance, "Reported the event gone from this VM's document");
    } else {
        info!(event = %name, event_id = %report.event_id, r#type = %report.event_type,
            status = %report.event_status, appearance = report.appearance,
            approvals = report.approvals.len(), resources = ?report.resources, "Reported the event");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::imds::model::parse_document;
    use crate::witnesses::SilentVms;

    fn doc(json: &str) -> Document {
        parse_document(json.as_bytes()).unwrap()
    }

    const SCHEDULED: &str = r#"{"DocumentIncarnation":2,"Events":[{"EventId":"ABC-1","EventStatus":"Scheduled","EventType":"Reboot","ResourceType":"VirtualMachine","Resources":["vm_1"],"NotBefore":"Mon, 11 Apr 2022 22:26:58 GMT","Description":"d","EventSource":"Platform","DurationInSeconds":-1}]}"#;
    const STARTED: &str = r#"{"DocumentIncarnation":3,"Events":[{"EventId":"ABC-1","EventStatus":"Started","EventType":"Reboot","ResourceType":"VirtualMachine","Resources":["vm_1"],"NotBefore":"","Description":"d","EventSource":"Platform","DurationInSeconds":-1}]}"#;
    const EMPTY: &str = r#"{"DocumentIncarnation":4,"Events":[]}"#;

    fn apply(reported: &mut HashMap<String, Report>, writes: &[(String, Report)]) {
        for (n, r) in writes {
            reported.insert(n.clone(), r.clone());
        }
    }

    #[test]
    fn one_write_per_change_of_the_view() {
        let mut reported = HashMap::new();
        let first = reports_to_write(&doc(SCHEDULED), &reported, "n1", "vm_1", &Witnessing::All);
        assert_eq!(first.len(), 1);
        let (name, r) = &first[0];
        assert_eq!(name, &object_name("ABC-1"));
        assert_eq!(
            (r.event_status, r.appearance, r.named),
            (CrdStatus::Scheduled, 1, true)
        );
        assert_eq!(r.event_id, "ABC-1");
        assert_eq!(r.document_incarnation, 2);
        assert!(r.not_before.is_some());
        apply(&mut reported, &first);
        // The same document again, or another incarnation with the same
        // event: nothing to write.
        assert!(
            reports_to_write(&doc(SCHEDULED), &reported, "n1", "vm_1", &Witnessing::All).is_empty()
        );
        let other_incarnation =
            SCHEDULED.replace("\"DocumentIncarnation\":2", "\"DocumentIncarnation\":7");
        assert!(
            reports_to_write(
                &doc(&other_incarnation),
                &reported,
                "n1",
                "vm_1",
                &Witnessing::All
            )
            .is_empty()
        );
        // Started: one write, NotBefore gone.
        let started = reports_to_write(&doc(STARTED), &reported, "n1", "vm_1", &Witnessing::All);
        assert_eq!(started.len(), 1);
        assert_eq!(started[0].1.event_status, CrdStatus::Started);
        assert_eq!(started[0].1.not_before, None);
        apply(&mut reported, &started);
        // Gone: one write, Completed, same appearance.
        let gone = reports_to_write(&doc(EMPTY), &reported, "n1", "vm_1", &Witnessing::All);
        assert_eq!(gone.len(), 1);
        assert_eq!(
            (gone[0].1.event_status, gone[0].1.appearance),
            (CrdStatus::Completed, 1)
        );
        apply(&mut reported, &gone);
        assert!(
            reports_to_write(&doc(EMPTY), &reported, "n1", "vm_1", &Witnessing::All).is_empty()
        );
        // Back: a new appearance.
        let back = reports_to_write(&doc(SCHEDULED), &reported, "n1", "vm_1", &Witnessing::All);
        assert_eq!(
            (back[0].1.event_status, back[0].1.appearance),
            (CrdStatus::Scheduled, 2)
        );
    }

    #[test]
    fn an_events_digest_is_its_reports() {
        let d = doc(SCHEDULED);
        let ev = &d.events[0];
        assert_eq!(digest_of(ev), view_of(ev, "n1", "vm_1", 2, 1).digest());
        let started = doc(STARTED);
        assert_eq!(
            digest_of(ev),
            digest_of(&started.events[0]),
            "status is no part of it"
        );
    }

    #[test]
    fn a_long_description_is_reported_clipped_to_what_the_schema_takes() {
        let long = "é".repeat(MAX_DESCRIPTION + 10);
        let json = SCHEDULED.replace(
            "\"Description\":\"d\"",
            &format!("\"Description\":\"{long}\""),
        );
        let d = doc(&json);
        let r = view_of(&d.events[0], "n1", "vm_1", 2, 1);
        assert_eq!(r.description.chars().count(), MAX_DESCRIPTION);
        assert!(long.starts_with(&r.description));
        // The description is no part of what an approval is bound to.
        assert_eq!(r.digest(), digest_of(&d.events[0]));
    }

    #[test]
    fn an_unknown_status_is_reported_as_started_and_a_rejected_entry_is_not_gone() {
        let paused = SCHEDULED.replace("\"Scheduled\"", "\"Paused\"");
        let w = reports_to_write(
            &doc(&paused),
            &HashMap::new(),
            "n1",
            "vm_1",
            &Witnessing::All,
        );
        assert_eq!(w[0].1.event_status, CrdStatus::Started);
        let mut reported = HashMap::new();
        apply(&mut reported, &w);
        // The same event, now unparsable (its EventId still readable).
        let broken = r#"{"DocumentIncarnation":5,"Events":[{"EventId":"ABC-1","EventStatus":"Scheduled","EventType":"Reboot","ResourceType":"VirtualMachine","Resources":"not a list"}]}"#;
        assert!(
            reports_to_write(&doc(broken), &reported, "n1", "vm_1", &Witnessing::All).is_empty()
        );
    }

    #[test]
    fn approvals_sent_stay_in_the_report_of_their_appearance_only() {
        let mut reported = HashMap::new();
        let first = reports_to_write(&doc(SCHEDULED), &reported, "n1", "vm_9", &Witnessing::All);
        assert!(!first[0].1.named);
        apply(&mut reported, &first);
        let name = first[0].0.clone();
        reported
            .get_mut(&name)
            .unwrap()
            .approvals
            .push(crate::api::SentApproval {
                appearance: 1,
                digest: "d".into(),
                sent_at: chrono::Utc::now(),
                status: 200,
                body: String::new(),
            });
        let started = reports_to_write(&doc(STARTED), &reported, "n1", "vm_9", &Witnessing::All);
        assert_eq!(started[0].1.approvals.len(), 1);
        apply(&mut reported, &started);
        let gone = reports_to_write(&doc(EMPTY), &reported, "n1", "vm_9", &Witnessing::All);
        apply(&mut reported, &gone);
        let back = reports_to_write(&doc(SCHEDULED), &reported, "n1", "vm_9", &Witnessing::All);
        assert_eq!(back[0].1.appearance, 2);
        assert!(back[0].1.approvals.is_empty());
    }

    /// A wave: every agent sees every event of its placement group, and
    /// writes only the one that names its own VM, until the controller
    /// asks for witnesses of a silent VM; an event it reports, it follows
    /// to its end even once no witness is wanted any more.
    #[test]
    fn events_of_other_vms_are_reported_only_as_witnesses_of_a_silent_vm() {
        let wave = r#"{"DocumentIncarnation":2,"Events":[
            {"EventId":"E-1","EventStatus":"Scheduled","EventType":"Preempt","ResourceType":"VirtualMachine","Resources":["vm_1"],"NotBefore":"Mon, 11 Apr 2022 22:26:58 GMT","Description":"","EventSource":"Platform","DurationInSeconds":-1},
            {"EventId":"E-2","EventStatus":"Scheduled","EventType":"Preempt","ResourceType":"VirtualMachine","Resources":["VM_2"],"NotBefore":"Mon, 11 Apr 2022 22:26:58 GMT","Description":"","EventSource":"Platform","DurationInSeconds":-1},
            {"EventId":"E-3","EventStatus":"Scheduled","EventType":"Preempt","ResourceType":"VirtualMachine","Resources":["vm_3"],"NotBefore":"Mon, 11 Apr 2022 22:26:58 GMT","Description":"","EventSource":"Platform","DurationInSeconds":-1}]}"#;
        let ids = |w: &[(String, Report)]| -> Vec<String> {
            w.iter().map(|(_, r)| r.event_id.clone()).collect()
        };
        let none = Witnessing::For(SilentVms::default());
        let mut reported = HashMap::new();
        let own = reports_to_write(&doc(wave), &reported, "n1", "vm_1", &none);
        assert_eq!(ids(&own), ["E-1"], "only its own VM's event");
        apply(&mut reported, &own);
        assert!(reports_to_write(&doc(wave), &reported, "n1", "vm_1", &none).is_empty());
        // The controller lists vm_2 as silent: its event gets this witness.
        let silent = Witnessing::For(SilentVms::new(["vm_2"]));
        let witness = reports_to_write(&doc(wave), &reported, "n1", "vm_1", &silent);
        assert_eq!(ids(&witness), ["E-2"]);
        assert!(!witness[0].1.named);
        apply(&mut reported, &witness);
        // vm_2's agent is back: the report already written is still
        // ended when the event leaves the document, and nothing else is
        // written meanwhile.
        assert!(reports_to_write(&doc(wave), &reported, "n1", "vm_1", &none).is_empty());
        let gone = reports_to_write(&doc(EMPTY), &reported, "n1", "vm_1", &none);
        let mut ended = ids(&gone);
        ended.sort();
        assert_eq!(ended, ["E-1", "E-2"]);
        assert!(gone.iter().all(|(_, r)| !r.is_listed()));
        // Without a witnesses ConfigMap, every event is reported.
        let all = reports_to_write(&doc(wave), &HashMap::new(), "n1", "vm_1", &Witnessing::All);
        assert_eq!(ids(&all), ["E-1", "E-2", "E-3"]);
    }
}
