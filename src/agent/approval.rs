//! Whether an agent sends an approval the controller decided (an approval
//! is bound to the event it was decided on).
//!
//! A decision is bound to the event it was made on: its appearance and the
//! identity digest of the event ([`crate::api::identity_digest`]). An agent
//! sends it only while its own current IMDS document lists the event
//! `Scheduled` with that digest (the caller checks `Scheduled`), and only
//! when its own report is of that appearance: a decision of an earlier
//! appearance, or about other content, is never sent, whatever the object
//! says.
//!
//! One agent goes first: that of the first VM the event names (in lower
//! case, sorted), so that an event naming a hundred VMs is approved once,
//! not by a hundred agents at the same instant; any other steps in after a
//! fallback delay (the first VM may be gone or not in the cluster), spread
//! per node over one to two times the configured delay
//! ([`fallback_for`]). A
//! `Terminate` or `Preempt` is approved only by a VM it names, as Azure
//! advises, since approving one VM's delete may hold back or release the
//! others'. Sending twice is harmless: IMDS answers 200 again.
//!
//! The fallback delay runs on the agent's own clock, from when it first saw
//! the decision, never from the controller's `decidedAt`: two machines'
//! clocks may disagree by more than the delay.
//!
//! Only the controller's decision is sent: anyone with write on the status
//! can write an approval, so the object's `metadata.managedFields` must
//! show that the controller's own status apply wrote every field of it
//! and no one else any ([`author`]). The chart's admission policy keeps
//! anyone but the controller's ServiceAccount from writing as the
//! controller's field manager, which the managed fields alone cannot tell.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::MissedTickBehavior;
use tracing::{debug, info, warn};

use super::{error_chain, event_reports, truncate};
use crate::api::{
    Approval, CONTROLLER_MANAGER, Report, ScheduledEvent, ScheduledEventStatus, SentApproval,
};
use crate::imds::client::Client as ImdsClient;
use crate::imds::model::{Document, Event, EventStatus, EventType};
use crate::kubeclient::watch_backoff;
use crate::metrics::agent::AgentMetrics;

/// The `result` the controller records when IMDS accepted an approval.
pub const ACCEPTED: &str = "Accepted";

/// The decision `approval` binds, if it is one: `(appearance, digest)`.
pub fn decision(approval: Option<&Approval>) -> Option<(u32, &str)> {
    let a = approval?;
    a.decided_at?;
    Some((a.appearance?, a.digest.as_deref()?))
}

/// Who wrote a `ScheduledEvent`'s `status.approval`, as its
/// `metadata.managedFields` record it ([`author`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Author {
    /// No approval, or one without a field.
    Nobody,
    /// The controller's own status apply, alone.
    Controller,
    /// Someone else, in whole or in part: each writer as `manager
    /// (operation, subresource)`, or `no field manager` when no entry owns
    /// a field the approval holds (`managedFields` cleared or rewritten).
    Foreign(Vec<String>),
}

impl Author {
    /// The writers named in one line, for logs, Events and conditions.
    pub fn describe(&self) -> String {
        match self {
            Author::Nobody => "nobody".into(),
            Author::Controller => format!("{CONTROLLER_MANAGER} (Apply, status)"),
            Author::Foreign(who) => who.join(", "),
        }
    }
}

/// Who wrote `approval`, the `status.approval` of an object whose
/// `metadata.managedFields` are `managed`: [`Author::Controller`] only when
/// the entry of manager `forewarn-controller`, operation `Apply`,
/// subresource `status` (the controller's status write) owns every field
/// the approval holds (`f:status` → `f:approval` → `f:<field>`) and no
/// other entry owns any field of it (a `kubectl patch --subresource status`
/// takes the fields it changes, a forced apply those it sets). An entry's
/// `.` (it made the approval exist) is not a field.
///
/// The managed fields name the manager a client chose: a write made as
/// `forewarn-controller` by someone else reads as the controller's, which
/// the chart's admission policy refuses.
pub fn author(managed: &[ManagedFieldsEntry], approval: Option<&Approval>) -> Author {
    let held: BTreeSet<String> = approval
        .and_then(|a| serde_json::to_value(a).ok())
        .and_then(|v| {
            v.as_object()
                .map(|m| m.keys().map(|k| format!("f:{k}")).collect())
        })
        .unwrap_or_default();
    if held.is_empty() {
        return Author::Nobody;
    }
    let mut by_controller: BTreeSet<&str> = BTreeSet::new();
    let mut foreign: BTreeSet<String> = BTreeSet::new();
    for entry in managed {
        let Some(fields) = entry
            .fields_v1
            .as_ref()
            .and_then(|f| f.0.get("f:status"))
            .and_then(|s| s.get("f:approval"))
            .and_then(serde_json::Value::as_object)
        else {
            continue;
        };
        let owned = fields.keys().filter(|k| k.as_str() != ".");
        let manager = entry.manager.as_deref().unwrap_or_default();
        let operation = entry.operation.as_deref().unwrap_or_default();
        let subresource = entry.subresource.as_deref().unwrap_or_default();
        if manager == CONTROLLER_MANAGER && operation == "Apply" && subresource == "status" {
            by_controller.extend(owned.map(String::as_str));
        } else if owned.count() > 0 {
            let subresource = if subresource.is_empty() {
                "main resource"
            } else {
                subresource
            };
            foreign.insert(format!("{manager} ({operation}, {subresource})"));
        }
    }
    if foreign.is_empty() && held.iter().all(|f| by_controller.contains(f.as_str())) {
        return Author::Controller;
    }
    if foreign.is_empty() {
        foreign.insert("no field manager".into());
    }
    Author::Foreign(foreign.into_iter().collect())
}

/// Whether the agent of VM `my_vm`, whose own report about `event` is
/// `mine` and whose document lists it with identity digest `digest`, should
/// send the decided `approval` now, `seen_for` after it first saw the
/// decision (its own monotonic clock).
pub fn should_send(
    event: &Event,
    digest: &str,
    mine: &Report,
    approval: Option<&Approval>,
    my_vm: &str,
    seen_for: Duration,
    fallback: Duration,
) -> bool {
    let Some((appearance, decided_digest)) = decision(approval) else {
        return false;
    };
    if appearance != mine.appearance || decided_digest != digest {
        return false;
    }
    if mine
        .approvals
        .iter()
        .any(|s| s.appearance == appearance && s.digest == digest && s.status == 200)
    {
        return false;
    }
    let named = event.names_vm(my_vm);
    let first = named && first_named(event, my_vm);
    if matches!(event.event_type, EventType::Terminate | EventType::Preempt) {
        return named && (first || seen_for >= fallback);
    }
    first || seen_for >= fallback
}

/// Whether the status of a `ScheduledEvent` lets the agent of `node` send
/// its decided approval: the approval allows an undrained node
/// (`approval.undrainedAllowed`: the policy approves without a drain, the
/// deadline passed under `onDeadline: Approve`, a person approved it), or
/// the status records `node` drained (its record's `drainedAt`; a node
/// whose record is not listed counts when every record not listed is of a
/// node drained or deleted). An agent whose node the status does not
/// record drained sends nothing, whatever else the event's records say: an
/// approval decided on another node's drain is never sent from a node
/// whose pods still run.
pub fn own_node_cleared(status: Option<&ScheduledEventStatus>, node: &str) -> bool {
    let Some(status) = status else {
        return false;
    };
    if status
        .approval
        .as_ref()
        .is_some_and(|a| a.undrained_allowed.is_some())
    {
        return true;
    }
    let records = status.nodes.as_deref().unwrap_or_default();
    match records.iter().find(|r| r.name == node) {
        Some(r) => r.drained_at.is_some(),
        None => status
            .nodes_not_listed
            .as_ref()
            .is_some_and(|n| n.count > 0 && n.drained + n.deleted >= n.count),
    }
}

/// Whether `my_vm` is the first of the VMs `event` names, ignoring case.
fn first_named(event: &Event, my_vm: &str) -> bool {
    event
        .resources
        .iter()
        .map(|r| r.to_ascii_lowercase())
        .min()
        .is_some_and(|first| first == my_vm.to_ascii_lowercase())
}

/// The fallback delay of the agent on `node`: `base` stretched by a share
/// of up to 100% that the node's name fixes, so that the agents that step
/// in after the first named one do not all send in the same second.
pub fn fallback_for(node: &str, base: Duration) -> Duration {
    let digest = ring::digest::digest(&ring::digest::SHA256, node.as_bytes());
    let share = u16::from_be_bytes([digest.as_ref()[0], digest.as_ref()[1]]);
    base + base.mul_f64(f64::from(share) / f64::from(u16::MAX))
}

/// Minimum time between two approval attempts for one event.
const APPROVAL_RETRY: Duration = Duration::from_secs(5);

/// The most of IMDS's answer to an approval a report keeps, bytes.
const APPROVAL_BODY_BYTES: usize = 512;

/// The `ScheduledEvent`s this agent's document lists as `Scheduled`, as
/// their watches last showed them, by object name.
type Objects = Arc<Mutex<HashMap<String, Arc<ScheduledEvent>>>>;

/// The watch of one `ScheduledEvent` (a field selector on its name),
/// aborted when dropped.
struct ObjectWatch(tokio::task::JoinHandle<()>);

impl Drop for ObjectWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The approval sender: a task of its own, so that a slow IMDS answer to
/// an approval delays neither a poll nor a report write. It wakes on a new
/// document, a new report written, a change of a watched `ScheduledEvent`,
/// and once per poll interval (fallback delays, retries).
pub struct Approver {
    imds: ImdsClient,
    api: Api<ScheduledEvent>,
    vm: String,
    metrics: AgentMetrics,
    fallback: Duration,
    interval: Duration,
    docs: watch::Receiver<Option<Arc<Document>>>,
    written: watch::Receiver<Arc<HashMap<String, Report>>>,
    sent: mpsc::UnboundedSender<(String, SentApproval)>,
    objects: Objects,
    object_changed: Arc<Notify>,
    /// One per event listed `Scheduled` that this agent reported (none
    /// while there is none), or one of every event while more than
    /// [`MAX_NAMED_WATCHES`] are.
    watches: Watches,
    /// Last approval attempt per event (only events listed `Scheduled`).
    attempts: HashMap<String, Instant>,
    /// When this agent first saw each decided approval, per event and
    /// appearance (its own monotonic clock, for the fallback delay; only
    /// events listed `Scheduled`).
    decisions: HashMap<(String, u32), Instant>,
    /// The object versions (name, resourceVersion) whose approval was
    /// refused as not the controller's, each logged and counted once (only
    /// events listed `Scheduled`).
    refused: HashSet<(String, String)>,
}

impl Approver {
    /// An approval sender for VM `vm`; `api` is used for watches only.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        imds: ImdsClient,
        api: Api<ScheduledEvent>,
        vm: String,
        metrics: AgentMetrics,
        fallback: Duration,
        interval: Duration,
        docs: watch::Receiver<Option<Arc<Document>>>,
        written: watch::Receiver<Arc<HashMap<String, Report>>>,
        sent: mpsc::UnboundedSender<(String, SentApproval)>,
    ) -> Self {
        Approver {
            imds,
            api,
            vm,
            metrics,
            fallback,
            interval,
            docs,
            written,
            sent,
            objects: Arc::default(),
            object_changed: Arc::new(Notify::new()),
            watches: Watches::Named(HashMap::new()),
            attempts: HashMap::new(),
            decisions: HashMap::new(),
            refused: HashSet::new(),
        }
    }

    /// Runs until the task is aborted.
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let changed = self.object_changed.clone();
        loop {
            tokio::select! {
                r = self.docs.changed() => if r.is_err() { return },
                r = self.written.changed() => if r.is_err() { return },
                () = changed.notified() => {}
                _ = tick.tick() => {}
            }
            self.step().await;
        }
    }

    /// Carries out the approvals the controller decided (an approval is bound to the event it was decided on;
    /// see [`should_send`]): only for events this VM's document lists as
    /// `Scheduled`, with this agent's own report of the same appearance
    /// written, and the decision bound to the same content.
    ///
    /// Only those events' objects are watched: Azure lists a placement
    /// group's events in the document of every VM of it, and a Spot wave of
    /// N VMs watched by every agent would cost the API server N² watch
    /// events; an agent reports (and so may approve) its own VM's events,
    /// and another VM's only as a witness the controller asked for.
    async fn step(&mut self) {
        let doc = self.docs.borrow_and_update().clone();
        let written = self.written.borrow_and_update().clone();
        let reported = scheduled_and_reported(doc.as_deref(), &written);
        let scheduled: Vec<&Event> = reported.iter().map(|(e, _)| *e).collect();
        self.keep_only(&scheduled);
        for (ev, mine) in reported {
            let name = ev.object_name();
            let digest = event_reports::digest_of(ev);
            if self.due(ev, &name, &digest, mine) {
                self.send(ev, name, mine.appearance, digest).await;
            }
        }
    }

    /// Watches the events of `scheduled` (those the document lists as
    /// `Scheduled` and this agent reported) and none other, and forgets the attempts, decisions and
    /// refusals of any other.
    fn keep_only(&mut self, scheduled: &[&Event]) {
        let names: HashSet<String> = scheduled.iter().map(|e| e.object_name()).collect();
        self.watch_only(&names);
        self.attempts.retain(|n, _| names.contains(n));
        self.decisions.retain(|(n, _), _| names.contains(n));
        self.refused.retain(|(n, _)| names.contains(n));
    }

    /// Whether to send now the approval decided on the event `ev` (object
    /// `name`, identity digest `digest`), this agent's report of which is
    /// `mine`: the watched object holds a decision the controller alone
    /// wrote ([`Approver::refuse_foreign`]), [`should_send`] says so (the
    /// fallback delay counted from when this agent first saw the
    /// decision), and the last attempt is [`APPROVAL_RETRY`] old.
    fn due(&mut self, ev: &Event, name: &str, digest: &str, mine: &Report) -> bool {
        let Some(obj) = self.object(name) else {
            return false;
        };
        let approval = obj.status.as_ref().and_then(|s| s.approval.as_ref());
        let key = (name.to_owned(), mine.appearance);
        if decision(approval).is_none() {
            self.decisions.remove(&key);
            return false;
        }
        if let Author::Foreign(_) = self.refuse_foreign(name, &obj, approval) {
            return false;
        }
        let first_seen = *self.decisions.entry(key).or_insert_with(|| {
            debug!(event = %name, "Saw the approval decided");
            Instant::now()
        });
        if !should_send(
            ev,
            digest,
            mine,
            approval,
            &self.vm,
            first_seen.elapsed(),
            self.fallback,
        ) {
            return false;
        }
        if !own_node_cleared(obj.status.as_ref(), &mine.node) {
            debug!(event = %name, node = %mine.node,
                "The approval is decided but the status does not record this node drained: not sent from here");
            return false;
        }
        self.attempts
            .get(name)
            .is_none_or(|t| t.elapsed() >= APPROVAL_RETRY)
    }

    /// Sends the approval of the event `ev` (object `name`, as reported in
    /// its appearance `appearance`, identity digest `digest`) to IMDS, and
    /// hands IMDS's answer (status 0 when there was none) to the report
    /// writer, which records it in this agent's report.
    async fn send(&mut self, ev: &Event, name: String, appearance: u32, digest: String) {
        self.attempts.insert(name.clone(), Instant::now());
        let sent_at = Utc::now();
        let (status, body) = match self.imds.approve(std::slice::from_ref(&ev.event_id)).await {
            Ok(body) => {
                self.metrics.approvals.with_label_values(&["ok"]).inc();
                info!(event = %name, appearance, %digest, "Approved the event with IMDS (StartRequests)");
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
        // Recorded in this agent's report by the report writer.
        let _ = self.sent.send((
            name,
            SentApproval {
                appearance,
                digest,
                sent_at,
                status,
                body: truncate(&body, APPROVAL_BODY_BYTES),
            },
        ));
    }

    /// Who wrote the approval of `obj` ([`author`]); a decision someone
    /// other than the controller wrote is refused, logged and counted once
    /// per version of the object.
    fn refuse_foreign(
        &mut self,
        name: &str,
        obj: &ScheduledEvent,
        approval: Option<&Approval>,
    ) -> Author {
        let by = author(
            obj.metadata.managed_fields.as_deref().unwrap_or_default(),
            approval,
        );
        if let Author::Foreign(_) = &by {
            let version = obj.metadata.resource_version.clone().unwrap_or_default();
            if self.refused.insert((name.to_owned(), version)) {
                self.metrics.foreign_decisions.inc();
                warn!(
                    event = %name,
                    written_by = %by.describe(),
                    "Refusing to send an approval the controller did not write (status.approval is not its field manager's alone)"
                );
            }
        }
        by
    }

    fn object(&self, name: &str) -> Option<Arc<ScheduledEvent>> {
        self.objects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// Keeps one watch per event in `names` and none other, or, while
    /// there are more than [`MAX_NAMED_WATCHES`], one watch of them all.
    fn watch_only(&mut self, names: &HashSet<String>) {
        self.objects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|n, _| names.contains(n));
        if names.len() > MAX_NAMED_WATCHES {
            match &self.watches {
                Watches::All { wanted, .. } => {
                    *wanted
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = names.clone();
                }
                Watches::Named(_) => {
                    debug!(
                        events = names.len(),
                        "Watching every ScheduledEvent while this many are scheduled"
                    );
                    let wanted = Arc::new(Mutex::new(names.clone()));
                    let task = tokio::spawn(watch_objects(
                        self.api.clone(),
                        None,
                        wanted.clone(),
                        self.objects.clone(),
                        self.object_changed.clone(),
                    ));
                    self.watches = Watches::All {
                        wanted,
                        _watch: ObjectWatch(task),
                    };
                }
            }
            return;
        }
        if matches!(self.watches, Watches::All { .. }) {
            self.watches = Watches::Named(HashMap::new());
        }
        let Watches::Named(watches) = &mut self.watches else {
            return;
        };
        watches.retain(|n, _| names.contains(n));
        for name in names {
            if watches.contains_key(name) {
                continue;
            }
            debug!(event = %name, "Watching the ScheduledEvent while it is scheduled");
            let task = tokio::spawn(watch_objects(
                self.api.clone(),
                Some(name.clone()),
                Arc::new(Mutex::new(HashSet::from([name.clone()]))),
                self.objects.clone(),
                self.object_changed.clone(),
            ));
            watches.insert(name.clone(), ObjectWatch(task));
        }
    }
}

/// The events `doc` lists as `Scheduled` that this agent reported, each
/// with its report of this very listing (`written`, by object name: the
/// report carries the appearance the approval is bound to). Nothing while
/// there is no document.
fn scheduled_and_reported<'a>(
    doc: Option<&'a Document>,
    written: &'a HashMap<String, Report>,
) -> Vec<(&'a Event, &'a Report)> {
    doc.map(|d| {
        d.events
            .iter()
            .filter(|e| e.event_status == EventStatus::Scheduled)
            .filter_map(|e| {
                let mine = written.get(&e.object_name()).filter(|r| r.is_listed())?;
                Some((e, mine))
            })
            .collect()
    })
    .unwrap_or_default()
}

/// The most events watched one by one (a field selector on each name);
/// beyond, one watch of every `ScheduledEvent` costs the API server less.
const MAX_NAMED_WATCHES: usize = 8;

/// The approval sender's watches of `ScheduledEvent`s.
enum Watches {
    /// One per event, by name.
    Named(HashMap<String, ObjectWatch>),
    /// One of every event, keeping those `wanted`.
    All {
        wanted: Arc<Mutex<HashSet<String>>>,
        _watch: ObjectWatch,
    },
}

/// Keeps `objects` as a watch shows the `ScheduledEvent`s `wanted`: of
/// the one named `only` (a field selector on its name), or of every one.
/// An object absent from a completed (re)list is dropped; errors resume
/// after [`watch_backoff`]; `changed` is notified on every change.
async fn watch_objects(
    api: Api<ScheduledEvent>,
    only: Option<String>,
    wanted: Arc<Mutex<HashSet<String>>>,
    objects: Objects,
    changed: Arc<Notify>,
) {
    let mut config = watcher::Config::default();
    if let Some(name) = &only {
        config = config.fields(&format!("metadata.name={name}"));
    }
    let stream = watcher(api, config).backoff(watch_backoff());
    futures::pin_mut!(stream);
    let is_wanted = |name: &str| {
        wanted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(name)
    };
    let lock = || {
        objects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    // The names a (re)list in progress showed.
    let mut listed: HashSet<String> = HashSet::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(watcher::Event::Apply(o)) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                if is_wanted(&name) {
                    lock().insert(name, Arc::new(o));
                    changed.notify_one();
                }
            }
            Ok(watcher::Event::InitApply(o)) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                listed.insert(name.clone());
                if is_wanted(&name) {
                    lock().insert(name, Arc::new(o));
                    changed.notify_one();
                }
            }
            Ok(watcher::Event::Delete(o)) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                if lock().remove(&name).is_some() {
                    changed.notify_one();
                }
            }
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitDone) => {
                lock().retain(|n, _| {
                    listed.contains(n) || (only.is_some() && only.as_deref() != Some(n.as_str()))
                });
                listed.clear();
                changed.notify_one();
            }
            // Missing RBAC or an unreachable API server stops every
            // approval: say so loudly.
            Err(e) => {
                warn!(event = ?only, error = %error_chain(&e), "ScheduledEvent watch failed; resuming after a backoff")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SentApproval;
    use crate::imds::model::EventStatus;
    use chrono::{DateTime, Utc};

    fn event(type_: EventType) -> Event {
        Event {
            event_id: "E".into(),
            event_type: type_,
            event_status: EventStatus::Scheduled,
            event_source: "Platform".into(),
            resource_type: "VirtualMachine".into(),
            resources: vec!["vmss_1".into()],
            not_before: None,
            not_before_unparsed: None,
            duration_seconds: -1,
            description: String::new(),
        }
    }

    fn mine(ev: &Event, vm: &str) -> Report {
        crate::agent::event_reports::view_of(ev, "node", vm, 1, 1)
    }

    fn decided(at: DateTime<Utc>, ev: &Event) -> Approval {
        Approval {
            decided_at: Some(at),
            reason: Some("drained".into()),
            appearance: Some(1),
            digest: Some(mine(ev, "x").digest()),
            ..Default::default()
        }
    }

    fn send(ev: &Event, a: Option<&Approval>, vm: &str, seen_for: Duration) -> bool {
        let me = mine(ev, vm);
        should_send(ev, &me.digest(), &me, a, vm, seen_for, FALLBACK)
    }

    const FALLBACK: Duration = Duration::from_secs(5);

    const JUST_SEEN: Duration = Duration::ZERO;

    /// `metadata.managedFields` as the API server writes them.
    fn managed(entries: serde_json::Value) -> Vec<ManagedFieldsEntry> {
        serde_json::from_value(entries).expect("managedFields")
    }

    fn decision_fields() -> Approval {
        Approval {
            decided_at: Some(Utc::now()),
            reason: Some("all 1 affected nodes drained".into()),
            appearance: Some(1),
            digest: Some("d".into()),
            ..Default::default()
        }
    }

    /// The controller's writes: its spec apply (main resource) and its
    /// status apply (subresource `status`), the latter owning the approval.
    fn controller_entries() -> serde_json::Value {
        serde_json::json!([
            {"manager": "forewarn-controller", "operation": "Apply",
             "apiVersion": "forewarn.dev/v1alpha1", "time": "2026-01-01T00:00:00Z",
             "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:eventId": {}, "f:eventType": {}, "f:resources": {}}}},
            {"manager": "forewarn-controller", "operation": "Apply",
             "apiVersion": "forewarn.dev/v1alpha1", "time": "2026-01-01T00:00:05Z",
             "fieldsType": "FieldsV1", "subresource": "status",
             "fieldsV1": {"f:status": {"f:phase": {}, "f:approval": {
                 "f:appearance": {}, "f:decidedAt": {}, "f:digest": {}, "f:reason": {}}}}},
        ])
    }

    #[test]
    fn the_controllers_status_apply_is_its_decision() {
        let a = decision_fields();
        let m = managed(controller_entries());
        assert_eq!(author(&m, Some(&a)), Author::Controller);
        // No approval, or an empty one: nobody's decision.
        assert_eq!(author(&m, None), Author::Nobody);
        assert_eq!(author(&m, Some(&Approval::default())), Author::Nobody);
        // The controller's entry must own every field held: one it does
        // not own (sentBy) makes the approval not its own.
        let mut more = a.clone();
        more.sent_by = Some("node-0".into());
        assert_eq!(
            author(&m, Some(&more)),
            Author::Foreign(vec!["no field manager".into()])
        );
        // managedFields cleared by someone: no proof of the writer.
        assert_eq!(
            author(&[], Some(&a)),
            Author::Foreign(vec!["no field manager".into()])
        );
    }

    #[test]
    fn a_status_patch_by_hand_is_not_the_controllers_decision() {
        let a = decision_fields();
        // `kubectl patch --subresource status --type merge` of a whole
        // approval on a status the controller wrote without one.
        let mut entries = controller_entries();
        entries[1]["fieldsV1"] = serde_json::json!({"f:status": {"f:phase": {}}});
        entries.as_array_mut().unwrap().push(serde_json::json!(
            {"manager": "kubectl-patch", "operation": "Update",
             "apiVersion": "forewarn.dev/v1alpha1", "time": "2026-01-01T00:00:07Z",
             "fieldsType": "FieldsV1", "subresource": "status",
             "fieldsV1": {"f:status": {"f:approval": {
                 ".": {}, "f:appearance": {}, "f:decidedAt": {}, "f:digest": {}, "f:reason": {}}}}}
        ));
        assert_eq!(
            author(&managed(entries), Some(&a)),
            Author::Foreign(vec!["kubectl-patch (Update, status)".into()])
        );
        // The same patch of one field of the controller's decision (its
        // digest): the patch takes that field, the rest stays the
        // controller's; still not its decision.
        let mut entries = controller_entries();
        entries[1]["fieldsV1"]["f:status"]["f:approval"]
            .as_object_mut()
            .unwrap()
            .remove("f:digest");
        entries.as_array_mut().unwrap().push(serde_json::json!(
            {"manager": "kubectl-patch", "operation": "Update",
             "apiVersion": "forewarn.dev/v1alpha1", "time": "2026-01-01T00:00:07Z",
             "fieldsType": "FieldsV1", "subresource": "status",
             "fieldsV1": {"f:status": {"f:approval": {"f:digest": {}}}}}
        ));
        assert_eq!(
            author(&managed(entries), Some(&a)),
            Author::Foreign(vec!["kubectl-patch (Update, status)".into()])
        );
        // A patch as `--field-manager forewarn-controller`: an Update, not
        // the controller's apply.
        let mut entries = controller_entries();
        entries[1]["fieldsV1"] = serde_json::json!({"f:status": {"f:phase": {}}});
        entries.as_array_mut().unwrap().push(serde_json::json!(
            {"manager": "forewarn-controller", "operation": "Update",
             "apiVersion": "forewarn.dev/v1alpha1", "time": "2026-01-01T00:00:07Z",
             "fieldsType": "FieldsV1", "subresource": "status",
             "fieldsV1": {"f:status": {"f:approval": {
                 ".": {}, "f:appearance": {}, "f:decidedAt": {}, "f:digest": {}, "f:reason": {}}}}}
        ));
        assert_eq!(
            author(&managed(entries), Some(&a)),
            Author::Foreign(vec!["forewarn-controller (Update, status)".into()])
        );
        // A forced apply by another manager of one field: co-owned, not the
        // controller's alone.
        let mut entries = controller_entries();
        entries.as_array_mut().unwrap().push(serde_json::json!(
            {"manager": "mallory", "operation": "Apply",
             "apiVersion": "forewarn.dev/v1alpha1", "time": "2026-01-01T00:00:07Z",
             "fieldsType": "FieldsV1", "subresource": "status",
             "fieldsV1": {"f:status": {"f:approval": {"f:reason": {}}}}}
        ));
        assert_eq!(
            author(&managed(entries), Some(&a)),
            Author::Foreign(vec!["mallory (Apply, status)".into()])
        );
        // Another manager that made the approval exist (`.`) and owns none
        // of its fields any more does not taint it.
        let mut entries = controller_entries();
        entries.as_array_mut().unwrap().push(serde_json::json!(
            {"manager": "kubectl-patch", "operation": "Update",
             "apiVersion": "forewarn.dev/v1alpha1", "time": "2026-01-01T00:00:07Z",
             "fieldsType": "FieldsV1", "subresource": "status",
             "fieldsV1": {"f:status": {"f:approval": {".": {}}}}}
        ));
        assert_eq!(author(&managed(entries), Some(&a)), Author::Controller);
    }

    #[test]
    fn an_apply_as_the_controllers_field_manager_cannot_be_told_apart() {
        // `kubectl apply --server-side --subresource status --field-manager
        // forewarn-controller --force-conflicts` by someone else merges into
        // the controller's own entry: the managed fields read as the
        // controller's decision. The chart's admission policy refuses such
        // a write from anyone but the controller's ServiceAccount.
        let a = decision_fields();
        let entries = controller_entries();
        assert_eq!(author(&managed(entries), Some(&a)), Author::Controller);
    }

    #[test]
    fn fallback_delays_are_spread_over_one_to_two_times_the_base() {
        let base = Duration::from_secs(5);
        let delays: Vec<Duration> = (0..200)
            .map(|i| fallback_for(&format!("aks-pool-{i:06}"), base))
            .collect();
        assert!(delays.iter().all(|d| *d >= base && *d <= base * 2));
        // The same node always gets the same delay; nodes get different ones.
        assert_eq!(fallback_for("aks-pool-000001", base), delays[1]);
        let distinct: std::collections::BTreeSet<_> =
            delays.iter().map(|d| d.as_millis() / 500).collect();
        assert!(
            distinct.len() >= 8,
            "200 nodes in {} half-second slots",
            distinct.len()
        );
    }

    #[test]
    fn only_the_scheduled_events_this_agent_reported_are_watched() {
        let own = event(EventType::Preempt);
        let other = Event {
            event_id: "F".into(),
            resources: vec!["vmss_2".into()],
            ..event(EventType::Preempt)
        };
        let started = Event {
            event_id: "G".into(),
            event_status: EventStatus::Started,
            ..event(EventType::Preempt)
        };
        let doc = Document {
            incarnation: 1,
            events: vec![own.clone(), other.clone(), started.clone()],
            rejected: Vec::new(),
        };
        // Azure lists the placement group's events in every VM's document:
        // this agent reported its own VM's and the started one only.
        let written: HashMap<String, Report> = [&own, &started]
            .into_iter()
            .map(|e| (e.object_name(), mine(e, "vmss_1")))
            .collect();
        let picked: Vec<&str> = scheduled_and_reported(Some(&doc), &written)
            .iter()
            .map(|(e, _)| e.event_id.as_str())
            .collect();
        assert_eq!(picked, ["E"]);
        assert!(scheduled_and_reported(None, &written).is_empty());
        // Reported as a witness when the controller asked: watched too.
        let mut with_witness = written.clone();
        with_witness.insert(other.object_name(), mine(&other, "vmss_1"));
        assert_eq!(scheduled_and_reported(Some(&doc), &with_witness).len(), 2);
    }

    #[test]
    fn nothing_is_sent_before_the_controller_decides() {
        let ev = event(EventType::Reboot);
        let long = Duration::from_secs(3600);
        assert!(!send(&ev, None, "vmss_1", long));
        assert!(!send(&ev, Some(&Approval::default()), "vmss_1", long));
        // A decision that binds no appearance or digest is no decision.
        let mut unbound = decided(Utc::now(), &ev);
        unbound.digest = None;
        assert!(!send(&ev, Some(&unbound), "vmss_1", long));
    }

    #[test]
    fn a_decision_about_other_content_or_another_appearance_is_never_sent() {
        let ev = event(EventType::Reboot);
        let a = decided(Utc::now(), &ev);
        let long = Duration::from_secs(3600);
        assert!(send(&ev, Some(&a), "vmss_1", JUST_SEEN));
        // The object was rewritten into a Freeze of 5 s: its digest differs.
        let mut freeze = event(EventType::Freeze);
        freeze.duration_seconds = 5;
        assert!(!send(
            &ev,
            Some(&decided(Utc::now(), &freeze)),
            "vmss_1",
            long
        ));
        // Other Resources, another duration: other digests.
        let mut more = ev.clone();
        more.resources.push("vmss_2".into());
        assert!(!send(
            &ev,
            Some(&decided(Utc::now(), &more)),
            "vmss_1",
            long
        ));
        // A decision of appearance 1 while this agent's report is of appearance 2.
        let me = crate::agent::event_reports::view_of(&ev, "node", "vmss_1", 1, 2);
        assert!(!should_send(
            &ev,
            &me.digest(),
            &me,
            Some(&a),
            "vmss_1",
            long,
            FALLBACK
        ));
    }

    #[test]
    fn the_named_vm_sends_at_once_others_after_the_fallback() {
        let ev = event(EventType::Redeploy);
        let a = decided(Utc::now(), &ev);
        assert!(send(&ev, Some(&a), "VMSS_1", JUST_SEEN));
        assert!(!send(&ev, Some(&a), "vmss_0", JUST_SEEN));
        assert!(send(&ev, Some(&a), "vmss_0", Duration::from_secs(6)));
    }

    #[test]
    fn of_many_named_vms_the_first_sends_at_once_the_others_after_the_fallback() {
        let mut ev = event(EventType::Reboot);
        ev.resources = (0..100).rev().map(|i| format!("VMSS_{i:02}")).collect();
        let a = decided(Utc::now(), &ev);
        assert!(send(&ev, Some(&a), "vmss_00", JUST_SEEN));
        assert!(!send(&ev, Some(&a), "vmss_01", JUST_SEEN));
        assert!(!send(&ev, Some(&a), "vmss_99", JUST_SEEN));
        assert!(send(&ev, Some(&a), "vmss_99", FALLBACK));
        // A Terminate or Preempt likewise, but never by a VM it does not name.
        for t in [EventType::Terminate, EventType::Preempt] {
            ev.event_type = t;
            let a = decided(Utc::now(), &ev);
            assert!(send(&ev, Some(&a), "vmss_00", JUST_SEEN));
            assert!(!send(&ev, Some(&a), "vmss_01", JUST_SEEN));
            assert!(send(&ev, Some(&a), "vmss_01", FALLBACK));
            assert!(!send(&ev, Some(&a), "other", FALLBACK));
        }
    }

    #[test]
    fn the_fallback_ignores_the_controllers_clock() {
        let ev = event(EventType::Reboot);
        let now = Utc::now();
        for at in [
            now - chrono::Duration::hours(1),
            now + chrono::Duration::hours(1),
        ] {
            let a = decided(at, &ev);
            assert!(!send(&ev, Some(&a), "vmss_0", Duration::from_secs(4)));
            assert!(send(&ev, Some(&a), "vmss_0", FALLBACK));
        }
    }

    #[test]
    fn an_accepted_approval_is_not_sent_again_but_a_failed_one_is() {
        let ev = event(EventType::Reboot);
        let mut a = decided(Utc::now(), &ev);
        // The status's word that IMDS accepted it is another agent's:
        // this agent sends unless its own record says so.
        a.result = Some(ACCEPTED.into());
        assert!(send(&ev, Some(&a), "vmss_1", JUST_SEEN));
        a.result = Some("Failed: IMDS answered 500".into());
        assert!(send(&ev, Some(&a), "vmss_1", JUST_SEEN));
        // This agent's own accepted POST of the same decision: not again.
        let mut me = mine(&ev, "vmss_1");
        me.approvals.push(SentApproval {
            appearance: 1,
            digest: me.digest(),
            sent_at: Utc::now(),
            status: 200,
            body: String::new(),
        });
        assert!(!should_send(
            &ev,
            &me.digest(),
            &me,
            Some(&a),
            "vmss_1",
            JUST_SEEN,
            FALLBACK
        ));
    }

    /// An agent sends only while the status records its own node drained,
    /// or the approval allows undrained nodes.
    #[test]
    fn an_approval_is_sent_only_from_a_node_the_status_records_drained() {
        use crate::api::{NodeProgress, NodesNotListed};
        let record = |name: &str, drained: bool| NodeProgress {
            name: name.into(),
            drained_at: drained.then(Utc::now),
            ..NodeProgress::default()
        };
        let ev = event(EventType::Reboot);
        let mut status = ScheduledEventStatus {
            approval: Some(decided(Utc::now(), &ev)),
            nodes: Some(vec![record("node-a", true), record("node-b", false)]),
            ..ScheduledEventStatus::default()
        };
        assert!(!own_node_cleared(None, "node-a"));
        assert!(own_node_cleared(Some(&status), "node-a"));
        assert!(!own_node_cleared(Some(&status), "node-b"), "pods still run");
        assert!(
            !own_node_cleared(Some(&status), "node-c"),
            "decided on other nodes' drains: no record of this one"
        );
        // Records not listed, all of nodes drained (or deleted).
        status.nodes_not_listed = Some(NodesNotListed {
            count: 3,
            drained: 2,
            deleted: 1,
            ..NodesNotListed::default()
        });
        assert!(own_node_cleared(Some(&status), "node-c"));
        status.nodes_not_listed.as_mut().unwrap().drained = 1;
        assert!(!own_node_cleared(Some(&status), "node-c"));
        // An approval the policy, the deadline or a person allowed
        // undrained.
        status.approval.as_mut().unwrap().undrained_allowed = Some("approved by hand".into());
        assert!(own_node_cleared(Some(&status), "node-b"));
        assert!(own_node_cleared(Some(&status), "node-c"));
    }
}
