//! Reporting: the status write (server-side apply, only when it changed)
//! and the Kubernetes Events that mark progress.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder};
use kube::runtime::reflector;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::controller::decide::plan::Plan;
use crate::controller::decide::status::newly_true;
use crate::controller::{Context, Error, Result};
use std::collections::HashMap;

use crate::api::{CONTROLLER_MANAGER, NodeProgress, Phase, ScheduledEvent, ScheduledEventStatus};
use crate::metrics::type_label;

/// What an Event is about besides the `ScheduledEvent` itself.
pub enum Subject<'a> {
    /// Only the `ScheduledEvent`.
    Event,
    /// A node: the Event goes on the node too, each naming the other as related.
    Node(&'a str),
    /// Only the node, naming the `ScheduledEvent` as related (its own Event
    /// summarises many nodes).
    NodeOnly(&'a str),
}

/// Writes the status (only when it changed) and the Events that mark
/// progress. `ev` is the event as this pass read it (its status already
/// carrying what the agents report of the approval), `stored` its status
/// as the API server has it. `not_listed` are the records of a large event that the status
/// counts without listing ([`crate::controller::decide::status::next`]): their drains are
/// announced too, each once.
///
/// # Errors
/// [`Error::PatchStatus`] when the status cannot be written.
pub async fn report(
    ev: &ScheduledEvent,
    stored: Option<&ScheduledEventStatus>,
    plan: &Plan,
    status: &ScheduledEventStatus,
    not_listed: &[NodeProgress],
    ctx: &Context,
) -> Result<()> {
    let name = ev.name_any();
    let prev = ev.status.clone().unwrap_or_default();
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

    if let (None, Some(first_seen)) = (prev.first_seen, status.first_seen) {
        ctx.metrics.event_observed(ev, first_seen);
    }
    let before: HashMap<&str, &NodeProgress> = prev
        .nodes
        .iter()
        .flatten()
        .map(|p| (p.name.as_str(), p))
        .collect();
    let listed = status.nodes.iter().flatten().map(|n| (n, true));
    for (n, is_listed) in listed.chain(not_listed.iter().map(|n| (n, false))) {
        let before = before.get(n.name.as_str()).copied();
        if n.drained_at.is_some()
            && !plan.phase.is_final()
            && !ctx.drained_unlisted(ev, &n.name, !is_listed)
            && before.and_then(|b| b.drained_at).is_none()
        {
            info!(node = %n.name, "Node drained");
            if let (Some(first), Some(at)) = (status.first_seen, n.drained_at) {
                ctx.metrics.drained(ev, first, at);
            }
            let note = format!("{} drained for {} {name}", n.name, ev.spec.event_type);
            publish(
                ctx,
                ev,
                Subject::Node(&n.name),
                KubeEventType::Normal,
                "Drained",
                note,
            );
        }
        for kept in n
            .pods_kept
            .iter()
            .filter(|_| is_listed)
            .filter(|k| before.is_none_or(|b| !b.pods_kept.contains(k)))
        {
            warn!(node = %n.name, pod = %kept, "Pod kept on a node being drained");
            let note = format!("Not evicting {kept} from {}", n.name);
            publish(
                ctx,
                ev,
                Subject::Node(&n.name),
                KubeEventType::Warning,
                "PodKept",
                note,
            );
        }
    }
    if ctx.dry_run {
        report_dry_run(ev, &prev, status, ctx);
    }
    if let Some(message) = newly_true(&prev, status, "EndedWithoutObserver") {
        warn!(%message, "Ended without an observer");
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Warning,
            "EndedWithoutObserver",
            format!("{name}: {message}"),
        );
    }
    if let Some(message) = newly_true(&prev, status, "ReportsDisagree") {
        warn!(%message, "The agents of the VMs the event names report different events");
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Warning,
            "ReportsDisagree",
            format!("{name}: each node is handled on its own agent's report: {message}"),
        );
    }
    report_acknowledgements(ev, &prev, status, ctx);
    if let Some(message) = newly_true(&prev, status, "DrainScheduled") {
        info!(%message, "Drain scheduled");
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Normal,
            "DrainScheduled",
            format!("{name}: {message}"),
        );
    }
    if plan.decide_approval.is_some() && !ctx.dry_run {
        ctx.metrics.approval_decided(
            ev,
            status
                .approval
                .as_ref()
                .and_then(|a| a.decided_at)
                .unwrap_or_else(chrono::Utc::now),
        );
        let reason = plan.decide_approval.clone().unwrap_or_default();
        info!(%reason, "Approval decided");
        let note = format!("Approval of {name} decided: {reason}; an agent will send it to IMDS");
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Normal,
            "ApprovalDecided",
            note,
        );
    }
    if let Some(why) = newly_true(&prev, status, "DrainIncomplete") {
        ctx.metrics
            .drains_incomplete
            .with_label_values(&[type_label(&ev.spec.event_type)])
            .inc();
        warn!(%why, "Drain incomplete");
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Warning,
            "DrainIncomplete",
            format!("{name}: {why}"),
        );
    }
    notify_webhooks(ev, &prev, stored, status, plan, ctx);
    let prev_phase = prev.phase.map(Phase::as_str).unwrap_or_default();
    let phase = plan.phase.as_str();
    if prev_phase != phase {
        info!(from = %prev_phase, to = %phase, "Phase changed");
        if matches!(
            plan.phase,
            Phase::Started | Phase::Completed | Phase::Cancelled | Phase::Ignored
        ) {
            let note = format!("{} {name} is {}", ev.spec.event_type, phase.to_lowercase());
            publish(ctx, ev, Subject::Event, KubeEventType::Normal, phase, note);
        }
    }
    Ok(())
}

/// The operators' webhooks ([`crate::notify::webhooks`]) for what this status
/// write changed: the event first seen (`Received`), `DrainBlocked` newly
/// true (naming each blocked node's budgets and pods), the approval
/// accepted by IMDS (`Approved`), phase `Started`, phase `Completed` or
/// `Cancelled` (`Completed`). Each comes from a transition of the stored
/// status, so it is sent once, by the leader that wrote it.
fn notify_webhooks(
    ev: &ScheduledEvent,
    prev: &ScheduledEventStatus,
    stored: Option<&ScheduledEventStatus>,
    status: &ScheduledEventStatus,
    plan: &Plan,
    ctx: &Context,
) {
    use crate::notify::webhooks::{Blocker, Message, Notification};
    if !ctx.webhooks.is_enabled() {
        return;
    }
    let name = ev.name_any();
    let spec = &ev.spec;
    let about = |n: Notification, summary: String| Message::about(n, ev, status, summary);
    if prev.first_seen.is_none() && status.first_seen.is_some() {
        let when = spec.not_before.map_or_else(
            || "now".to_string(),
            |nb| format!("not before {}", nb.to_rfc3339()),
        );
        ctx.webhooks.notify(about(
            Notification::Received,
            format!(
                "{} {name} ({}) for {}, {when}; forewarn will {}",
                spec.event_type,
                spec.event_source,
                spec.resources.join(", "),
                plan.action.describe()
            ),
        ));
    }
    if let Some(message) = newly_true(prev, status, "DrainBlocked") {
        let mut m = about(
            Notification::DrainBlocked,
            format!(
                "The drain for {} {name} is blocked: {message}",
                spec.event_type
            ),
        );
        m.blockers = status
            .nodes
            .iter()
            .flatten()
            .filter(|n| n.blocked_by.is_some())
            .map(|n| Blocker {
                node: n.name.clone(),
                pod_disruption_budgets: n.blocking_budgets.clone(),
                pods: n.blocked_pods.clone(),
                reason: n.blocked_by.clone(),
            })
            .collect();
        ctx.webhooks.notify(m);
    }
    // The approval this status records as accepted, against what the API
    // server stored (`prev` already carries what the agents report: see
    // `reconcile::copy_sent_approval`): the same decision (appearance and
    // digest) accepted there already was told.
    let accepted = |s: Option<&ScheduledEventStatus>| {
        s.and_then(|s| s.approval.as_ref())
            .filter(|a| a.result.as_deref() == Some(crate::agent::approval::ACCEPTED))
            .map(|a| (a.appearance, a.digest.clone()))
    };
    if let Some(now) = accepted(Some(status))
        && accepted(stored) != Some(now)
    {
        let by = status
            .approval
            .as_ref()
            .and_then(|a| a.sent_by.as_deref())
            .unwrap_or("an agent");
        ctx.webhooks.notify(about(
            Notification::Approved,
            format!(
                "IMDS accepted the approval of {} {name} (sent by {by}): Azure may start it now",
                spec.event_type
            ),
        ));
    }
    if prev.phase != Some(plan.phase) {
        match plan.phase {
            Phase::Started => ctx.webhooks.notify(about(
                Notification::Started,
                format!("{} {name} started", spec.event_type),
            )),
            Phase::Completed | Phase::Cancelled => ctx.webhooks.notify(about(
                Notification::Completed,
                format!(
                    "{} {name} is {}",
                    spec.event_type,
                    plan.phase.as_str().to_lowercase()
                ),
            )),
            _ => {}
        }
    }
}

/// The Events of the wait for the pods that take part: when it begins
/// (`AwaitingAcknowledgement`), when every pod asked acknowledged
/// (`Acknowledged`), and when its deadline passes without them
/// (`AcknowledgementTimedOut`, a Warning, counted by type).
fn report_acknowledgements(
    ev: &ScheduledEvent,
    prev: &ScheduledEventStatus,
    status: &ScheduledEventStatus,
    ctx: &Context,
) {
    let name = ev.name_any();
    if let Some(message) = newly_true(prev, status, "AcknowledgementPending") {
        info!(%message, "Waiting for the pods that take part");
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Normal,
            "AwaitingAcknowledgement",
            format!("{name}: {message}"),
        );
    }
    let condition = |s: &ScheduledEventStatus| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "AcknowledgementPending")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    if let (Some((was, ..)), Some((now, reason, message))) = (condition(prev), condition(status))
        && was == "True"
        && now == "False"
        && reason == "Acknowledged"
    {
        info!(%message, "Every pod asked acknowledged");
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Normal,
            "Acknowledged",
            format!("{name}: {message}"),
        );
    }
    let timed_out =
        |s: &ScheduledEventStatus| s.acknowledgements.as_ref().and_then(|a| a.timed_out_at);
    if timed_out(prev).is_none()
        && timed_out(status).is_some()
        && let Some(a) = &status.acknowledgements
    {
        ctx.metrics
            .acknowledgement_timeouts
            .with_label_values(&[type_label(&ev.spec.event_type)])
            .inc();
        let message = condition(status)
            .filter(|(_, reason, _)| reason == "TimedOut")
            .map(|(.., m)| m)
            .unwrap_or_else(|| {
                format!(
                    "the acknowledgement deadline passed; forewarn went on without {}",
                    a.pending.join(", ")
                )
            });
        warn!(%message, "Acknowledgement timed out");
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Warning,
            "AcknowledgementTimedOut",
            format!("{name}: {message}"),
        );
    }
}

/// The Events of a `--dry-run` pass: what would have been done, each once
/// when it first appears in `status.dryRun`.
fn report_dry_run(
    ev: &ScheduledEvent,
    prev: &ScheduledEventStatus,
    status: &ScheduledEventStatus,
    ctx: &Context,
) {
    let name = ev.name_any();
    let (Some(now), before) = (
        status.dry_run.as_ref(),
        prev.dry_run.clone().unwrap_or_default(),
    ) else {
        return;
    };
    for node in now
        .would_cordon
        .iter()
        .filter(|n| !before.would_cordon.contains(n))
    {
        info!(node = %node, "Dry run: would cordon and drain");
        let note = format!(
            "Dry run: would cordon and drain {node} for {} {name}",
            ev.spec.event_type
        );
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Normal,
            "DryRunCordon",
            note,
        );
    }
    let fresh: Vec<&String> = now
        .would_evict
        .iter()
        .filter(|p| !before.would_evict.contains(p))
        .collect();
    if !fresh.is_empty() {
        info!(pods = ?fresh, "Dry run: would evict");
        let note = format!(
            "Dry run: would evict {}",
            fresh
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Normal,
            "DryRunEvict",
            note,
        );
    }
    if let (Some(reason), None) = (&now.would_approve_reason, &before.would_approve_at) {
        info!(%reason, "Dry run: would approve");
        let note = format!("Dry run: would approve {name} ({reason}); nothing is sent to IMDS");
        publish(
            ctx,
            ev,
            Subject::Event,
            KubeEventType::Normal,
            "DryRunApproval",
            note,
        );
    }
}

/// Removes `status.approval` altogether, the agent's fields too (a
/// server-side apply cannot remove fields another manager owns): an
/// approval of an earlier appearance must not stand for the new one.
///
/// `ev` is the event as [`crate::controller::decide::status::for_current_appearance`] started
/// it over: the same write records its appearance and history
/// ([`cleared_for_new_appearance`]), so that a pass that reads the object
/// between this write and the pass's status write sees the new appearance
/// already, not the old one without its approval (it took that for a
/// second start-over, and the history lost the first appearance's
/// approval).
///
/// # Errors
/// [`Error::PatchStatus`] when the status cannot be written.
pub async fn clear_approval(ev: &ScheduledEvent, ctx: &Context) -> Result<()> {
    let name = ev.name_any();
    let body = cleared_for_new_appearance(ev);
    Api::<ScheduledEvent>::all(ctx.client.clone())
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(|source| Error::PatchStatus { name, source })?;
    Ok(())
}

/// The merge patch of [`clear_approval`]: no approval, `ev`'s appearance,
/// and its history of earlier appearances.
fn cleared_for_new_appearance(ev: &ScheduledEvent) -> serde_json::Value {
    let history = ev
        .status
        .as_ref()
        .map(|s| s.previous_appearances.clone())
        .unwrap_or_default();
    json!({"status": {
        "approval": null,
        "appearance": ev.spec.appearance,
        "previousAppearances": history,
    }})
}

/// Publishes a Kubernetes Event on the `ScheduledEvent`, and on the node if
/// given, through the [`EventSink`]: it returns at once, and a pass never
/// waits for Events (best effort, as client-go's recorder).
pub fn publish(
    ctx: &Context,
    ev: &ScheduledEvent,
    subject: Subject<'_>,
    type_: KubeEventType,
    reason: &str,
    note: String,
) {
    let node = match subject {
        Subject::Node(name) | Subject::NodeOnly(name) => {
            ctx.nodes.get(&reflector::ObjectRef::new(name))
        }
        _ => None,
    };
    let related = match subject {
        Subject::Event | Subject::NodeOnly(_) => None,
        Subject::Node(_) => node.as_ref().map(|n| n.object_ref(&())),
    };
    let note = within_note_limit(note);
    let event = |secondary| KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note.clone()),
        action: reason.into(),
        secondary,
    };
    if !matches!(subject, Subject::NodeOnly(_)) {
        ctx.kube_events.post(event(related), ev.object_ref(&()));
    }
    if let Some(n) = node {
        ctx.kube_events
            .post(event(Some(ev.object_ref(&()))), n.object_ref(&()));
    }
}

/// The longest note the API server takes (events.k8s.io/v1 `note`: at
/// most 1 KiB), in bytes.
pub const NOTE_LIMIT: usize = 1024;

/// `note`, cut at a character boundary to at most [`NOTE_LIMIT`] bytes
/// (ending in `…` when cut): the API server refuses a longer one.
pub fn within_note_limit(note: String) -> String {
    crate::text::cut(note, NOTE_LIMIT)
}

/// How many Kubernetes Events may wait to be posted; beyond it new ones are
/// dropped and counted (client-go's broadcaster also drops when its queue of
/// 1,000 is full: Events are best effort, the status is the record).
pub const EVENT_QUEUE: usize = 4096;

/// How many Events are posted at once.
const EVENT_CONCURRENCY: usize = 16;

/// How many Events one [`Recorder`] posts before the sink starts a fresh
/// one. kube's `Recorder` keeps every Event it posted for 6 minutes (to
/// fold repeats into a series) and scans them all on each post: a 1,000-VM
/// event posts thousands in that time, and heaptrack found 17.7 MB of the
/// controller's 53.7 MB heap peak in that cache. client-go's correlator
/// keeps at most 4,096 (an LRU); a fresh recorder every 1,000 posts keeps
/// at most about 2,000 (the old one lives until its posts in flight end).
/// A repeat just after the switch starts a new Event instead of a series.
pub const RECORDER_RENEWED_AFTER: usize = 1000;

/// A bounded queue of Kubernetes Events and the task that posts them, so
/// that a pass that evicts hundreds of pods is not held up by their Events.
#[derive(Clone)]
pub struct EventSink {
    queue: tokio::sync::mpsc::Sender<(KubeEvent, ObjectReference)>,
    counted: prometheus::IntCounterVec,
}

impl EventSink {
    /// Starts the task that posts the queued Events with recorders made by
    /// `recorder` (series of the same Event are folded by each; a fresh one
    /// every [`RECORDER_RENEWED_AFTER`] posts), counting each in `counted`
    /// by result. The task ends when every sink is dropped.
    pub fn start(
        recorder: impl Fn() -> Recorder + Send + Sync + 'static,
        counted: prometheus::IntCounterVec,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, mut rx) = tokio::sync::mpsc::channel(EVENT_QUEUE);
        let results = counted.clone();
        let task = tokio::spawn(async move {
            let queued = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
            let current = std::sync::Mutex::new((recorder(), 0usize));
            queued
                .for_each_concurrent(EVENT_CONCURRENCY, |(event, reference)| {
                    let recorder = {
                        let mut current = current
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        if current.1 >= RECORDER_RENEWED_AFTER {
                            *current = (recorder(), 0);
                        }
                        current.1 += 1;
                        current.0.clone()
                    };
                    let results = &results;
                    async move {
                        let event: KubeEvent = event;
                        let reference: ObjectReference = reference;
                        match recorder.publish(&event, &reference).await {
                            Ok(()) => results.with_label_values(&["posted"]).inc(),
                            Err(e) => {
                                results.with_label_values(&["failed"]).inc();
                                warn!(error = %e, reason = %event.reason, kind = ?reference.kind, name = ?reference.name, "Could not publish an Event");
                            }
                        }
                    }
                })
                .await;
        });
        (Self { queue, counted }, task)
    }

    /// Queues `event` about `reference`; drops it (counted as `dropped`,
    /// logged at debug) when the queue is full.
    pub fn post(&self, event: KubeEvent, reference: ObjectReference) {
        if let Err(e) = self.queue.try_send((event, reference)) {
            self.counted.with_label_values(&["dropped"]).inc();
            let (event, _) = match e {
                tokio::sync::mpsc::error::TrySendError::Full(x)
                | tokio::sync::mpsc::error::TrySendError::Closed(x) => x,
            };
            debug!(reason = %event.reason, "The queue of Events to post is full: dropped one");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{NOTE_LIMIT, cleared_for_new_appearance, within_note_limit};
    use crate::api::{Approval, Phase, ScheduledEvent, ScheduledEventStatus};
    use crate::controller::decide::status::for_current_appearance;
    use crate::fixtures;

    /// The write that clears an earlier appearance's approval also says
    /// which appearance the status is now about, with the history: read
    /// back, the object is not started over a second time.
    #[test]
    fn clearing_the_approval_records_the_new_appearance_and_its_history() {
        let mut ev = ScheduledEvent::new("ev1", fixtures::spec("ev1").appearance(2).build());
        ev.status = Some(ScheduledEventStatus {
            appearance: Some(1),
            phase: Some(Phase::Completed),
            approval: Some(Approval {
                decided_at: Some(chrono::Utc::now()),
                result: Some("Accepted".into()),
                ..Approval::default()
            }),
            ..ScheduledEventStatus::default()
        });
        let (fresh, anew) = for_current_appearance(&ev);
        assert!(anew);
        let patch = cleared_for_new_appearance(&fresh);
        assert!(patch["status"]["approval"].is_null());
        assert_eq!(patch["status"]["appearance"], 2);
        let history = &patch["status"]["previousAppearances"];
        assert_eq!(history.as_array().map(Vec::len), Some(1), "{patch}");
        assert!(
            history[0]["approval"]
                .as_str()
                .unwrap_or_default()
                .contains("Accepted")
        );
        // The object as that write leaves it: the same appearance, nothing
        // started over again.
        let mut after = ev.clone();
        let st = after.status.as_mut().unwrap();
        st.approval = None;
        st.appearance = Some(2);
        st.previous_appearances = serde_json::from_value(history.clone()).unwrap();
        assert!(!for_current_appearance(&after).1);
    }

    #[test]
    fn notes_are_cut_to_what_the_api_server_takes() {
        assert_eq!(within_note_limit("short".into()), "short");
        let exact = "x".repeat(NOTE_LIMIT);
        assert_eq!(within_note_limit(exact.clone()), exact);
        // Multi-byte characters across the limit are never split.
        let long = "é".repeat(NOTE_LIMIT);
        let cut = within_note_limit(long);
        assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.len() > NOTE_LIMIT - 8);
    }
}
