//! Reporting: the status write (server-side apply, only when it changed)
//! and the Kubernetes Events that mark progress.

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType};
use kube::runtime::reflector;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use crate::controller::act::kube_events::within_note_limit;
use crate::controller::act::writers::{Writers, conditional_on};
use crate::controller::decide::plan::Plan;
use crate::controller::decide::status::newly_true;
use crate::controller::error::{Error, Result};
use std::collections::HashMap;

use crate::api::{CONTROLLER_MANAGER, NodeProgress, Phase, ScheduledEvent, ScheduledEventStatus};
use crate::metrics::type_label;
use crate::notify::config::Notification;
use crate::notify::message::Message;

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
/// Returns the API server's answer to the status write (the object as it
/// left it), or `None` when the status had not changed.
///
/// # Errors
/// [`Error::PatchStatus`] when the status cannot be written.
pub async fn report(
    ev: &ScheduledEvent,
    stored: Option<&ScheduledEventStatus>,
    plan: &Plan,
    status: &ScheduledEventStatus,
    not_listed: &[NodeProgress],
    writers: &Writers,
    announced: &Announced,
) -> Result<Option<ScheduledEvent>> {
    let prev = ev.status.clone().unwrap_or_default();
    if prev == *status {
        return Ok(None);
    }
    let answer = write_status(ev, status, writers).await?;
    if let (None, Some(first_seen)) = (prev.first_seen, status.first_seen) {
        writers.metrics.event_observed(ev, first_seen);
    }
    announce_nodes(ev, &prev, status, not_listed, plan, writers, announced);
    if writers.dry_run {
        report_dry_run(ev, &prev, status, writers);
    }
    announce_disagreement(ev, &prev, status, writers);
    announce_manual(ev, &prev, status, writers);
    report_acknowledgements(ev, &prev, status, writers);
    announce_drain(ev, &prev, status, plan, writers);
    notify_webhooks(ev, &prev, stored, status, plan, writers);
    announce_phase(ev, &prev, plan, writers);
    Ok(Some(answer))
}

/// Writes `status` by server-side apply (field manager
/// `forewarn-controller`, forced: the controller owns the status),
/// conditional on the `resourceVersion` of `ev`, the object the pass
/// decided on: a status built on a cache that had not yet shown the
/// previous pass's write (a loaded API server's watch lags by seconds) is
/// refused with 409 instead of overwriting it (it once turned a `Started`
/// event `Cancelled`), and the pass runs again on the newer object.
/// Returns the API server's answer: the object as the write left it.
///
/// # Errors
/// [`Error::PatchStatus`] when the API server refuses it (409 when the
/// object changed since `ev` was read) or is unreachable.
async fn write_status(
    ev: &ScheduledEvent,
    status: &ScheduledEventStatus,
    writers: &Writers,
) -> Result<ScheduledEvent> {
    let name = ev.name_any();
    let mut body = json!({
        "apiVersion": ScheduledEvent::api_version(&()),
        "kind": ScheduledEvent::kind(&()),
        "status": status,
    });
    conditional_on(&mut body, ev.metadata.resource_version.as_deref());
    Api::<ScheduledEvent>::all(writers.client.clone())
        .patch_status(
            &name,
            &PatchParams::apply(CONTROLLER_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| Error::PatchStatus {
            name: name.clone(),
            source,
        })
}

/// The Events of each node's progress that this write records anew: a node
/// drained (`Drained`, counted once a drain, also for a node the status
/// counts without listing) and a pod kept on a node being drained
/// (`PodKept`, a Warning).
fn announce_nodes(
    ev: &ScheduledEvent,
    prev: &ScheduledEventStatus,
    status: &ScheduledEventStatus,
    not_listed: &[NodeProgress],
    plan: &Plan,
    writers: &Writers,
    announced: &Announced,
) {
    let name = ev.name_any();
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
            && !announced.drained_unlisted(ev, &n.name, !is_listed)
            && before.and_then(|b| b.drained_at).is_none()
        {
            info!(node = %n.name, "Node drained");
            if let (Some(first), Some(at)) = (status.first_seen, n.drained_at) {
                writers.metrics.drained(ev, first, at);
            }
            let note = format!("{} drained for {} {name}", n.name, ev.spec.event_type);
            publish(
                writers,
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
                writers,
                ev,
                Subject::Node(&n.name),
                KubeEventType::Warning,
                "PodKept",
                note,
            );
        }
    }
}

/// The Warning Events of an event that ended before any agent saw it
/// (`EndedWithoutObserver`) and of agents whose reports disagree
/// (`ReportsDisagree`), when their condition turns true.
/// The Events of an operator's annotation, each once it is newly
/// recorded: `ApprovalHeld` (the hold set) and `ApprovedByHand` (the
/// approval decided for approve-now), each naming who set it (see
/// [`crate::controller::decide::manual::setter`]).
fn announce_manual(
    ev: &ScheduledEvent,
    prev: &ScheduledEventStatus,
    status: &ScheduledEventStatus,
    writers: &Writers,
) {
    let name = ev.name_any();
    for reason in ["ApprovalHeld", "ApprovedByHand"] {
        if let Some(message) = newly_true(prev, status, reason) {
            info!(%message, "{reason}");
            publish(
                writers,
                ev,
                Subject::Event,
                KubeEventType::Normal,
                reason,
                format!("{name}: {message}"),
            );
        }
    }
}

fn announce_disagreement(
    ev: &ScheduledEvent,
    prev: &ScheduledEventStatus,
    status: &ScheduledEventStatus,
    writers: &Writers,
) {
    let name = ev.name_any();
    if let Some(message) = newly_true(prev, status, "EndedWithoutObserver") {
        warn!(%message, "Ended without an observer");
        publish(
            writers,
            ev,
            Subject::Event,
            KubeEventType::Warning,
            "EndedWithoutObserver",
            format!("{name}: {message}"),
        );
    }
    if let Some(message) = newly_true(prev, status, "ReportsDisagree") {
        warn!(%message, "The agents of the VMs the event names report different events");
        publish(
            writers,
            ev,
            Subject::Event,
            KubeEventType::Warning,
            "ReportsDisagree",
            format!("{name}: each node is handled on its own agent's report: {message}"),
        );
    }
}

/// The Events of the drain's course: scheduled (`DrainScheduled`), the
/// approval decided (`ApprovalDecided`, timed in the metrics) and the drain
/// incomplete at its deadline (`DrainIncomplete`, a Warning, counted by
/// type).
fn announce_drain(
    ev: &ScheduledEvent,
    prev: &ScheduledEventStatus,
    status: &ScheduledEventStatus,
    plan: &Plan,
    writers: &Writers,
) {
    let name = ev.name_any();
    if let Some(message) = newly_true(prev, status, "DrainScheduled") {
        info!(%message, "Drain scheduled");
        publish(
            writers,
            ev,
            Subject::Event,
            KubeEventType::Normal,
            "DrainScheduled",
            format!("{name}: {message}"),
        );
    }
    if plan.decide_approval.is_some() && !writers.dry_run {
        writers.metrics.approval_decided(
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
            writers,
            ev,
            Subject::Event,
            KubeEventType::Normal,
            "ApprovalDecided",
            note,
        );
    }
    if let Some(why) = newly_true(prev, status, "DrainIncomplete") {
        writers
            .metrics
            .drains_incomplete
            .with_label_values(&[type_label(&ev.spec.event_type)])
            .inc();
        warn!(%why, "Drain incomplete");
        publish(
            writers,
            ev,
            Subject::Event,
            KubeEventType::Warning,
            "DrainIncomplete",
            format!("{name}: {why}"),
        );
    }
}

/// The log line of a phase change, and the Event of the phases an operator
/// watches for: `Started`, `Completed`, `Cancelled`, `Ignored`.
fn announce_phase(
    ev: &ScheduledEvent,
    prev: &ScheduledEventStatus,
    plan: &Plan,
    writers: &Writers,
) {
    let name = ev.name_any();
    let prev_phase = prev.phase.map(Phase::as_str).unwrap_or_default();
    let phase = plan.phase.as_str();
    if prev_phase != phase {
        info!(from = %prev_phase, to = %phase, "Phase changed");
        if matches!(
            plan.phase,
            Phase::Started | Phase::Completed | Phase::Cancelled | Phase::Ignored
        ) {
            let note = format!("{} {name} is {}", ev.spec.event_type, phase.to_lowercase());
            publish(
                writers,
                ev,
                Subject::Event,
                KubeEventType::Normal,
                phase,
                note,
            );
        }
    }
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
    writers: &Writers,
) {
    if !writers.webhooks.is_enabled() {
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
        writers.webhooks.notify(about(
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
    notify_blocked(ev, prev, status, writers);
    notify_approved(ev, stored, status, writers);
    notify_phase(ev, prev, status, plan, writers);
}

/// `DrainBlocked` newly true: the webhooks' message names each blocked
/// node's budgets and pods.
fn notify_blocked(
    ev: &ScheduledEvent,
    prev: &ScheduledEventStatus,
    status: &ScheduledEventStatus,
    writers: &Writers,
) {
    use crate::notify::message::Blocker;
    let name = ev.name_any();
    let spec = &ev.spec;
    let about = |n: Notification, summary: String| Message::about(n, ev, status, summary);
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
        writers.webhooks.notify(m);
    }
}

/// The approval this status records as accepted by IMDS, told once per
/// decision (appearance and digest).
fn notify_approved(
    ev: &ScheduledEvent,
    stored: Option<&ScheduledEventStatus>,
    status: &ScheduledEventStatus,
    writers: &Writers,
) {
    let name = ev.name_any();
    let spec = &ev.spec;
    let about = |n: Notification, summary: String| Message::about(n, ev, status, summary);
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
        writers.webhooks.notify(about(
            Notification::Approved,
            format!(
                "IMDS accepted the approval of {} {name} (sent by {by}): Azure may start it now",
                spec.event_type
            ),
        ));
    }
}

/// Phase `Started`, and phase `Completed` or `Cancelled` (`Completed`).
fn notify_phase(
    ev: &ScheduledEvent,
    prev: &ScheduledEventStatus,
    status: &ScheduledEventStatus,
    plan: &Plan,
    writers: &Writers,
) {
    let name = ev.name_any();
    let spec = &ev.spec;
    let about = |n: Notification, summary: String| Message::about(n, ev, status, summary);
    if prev.phase != Some(plan.phase) {
        match plan.phase {
            Phase::Started => writers.webhooks.notify(about(
                Notification::Started,
                format!("{} {name} started", spec.event_type),
            )),
            Phase::Completed | Phase::Cancelled => writers.webhooks.notify(about(
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
    writers: &Writers,
) {
    let name = ev.name_any();
    if let Some(message) = newly_true(prev, status, "AcknowledgementPending") {
        info!(%message, "Waiting for the pods that take part");
        publish(
            writers,
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
            writers,
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
        writers
            .metrics
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
            writers,
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
    writers: &Writers,
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
            writers,
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
            writers,
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
            writers,
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
/// Returns the `resourceVersion` the write gave the object (the pass's
/// status write is conditional on it).
///
/// # Errors
/// [`Error::PatchStatus`] when the status cannot be written.
pub async fn clear_approval(ev: &ScheduledEvent, writers: &Writers) -> Result<Option<String>> {
    let name = ev.name_any();
    let body = cleared_for_new_appearance(ev);
    let written = Api::<ScheduledEvent>::all(writers.client.clone())
        .patch_status(
            &name,
            &crate::api::controller_patch_params(),
            &Patch::Merge(&body),
        )
        .await
        .map_err(|source| Error::PatchStatus { name, source })?;
    Ok(written.resource_version())
}

/// The merge patch of [`clear_approval`]: no approval, `ev`'s appearance,
/// and its history of earlier appearances.
fn cleared_for_new_appearance(ev: &ScheduledEvent) -> serde_json::Value {
    let history = ev
        .status
        .as_ref()
        .map(|s| s.previous_appearances.clone())
        .unwrap_or_default();
    let mut body = json!({"status": {
        "approval": null,
        "appearance": ev.spec.appearance,
        "previousAppearances": history,
    }});
    conditional_on(&mut body, ev.metadata.resource_version.as_deref());
    body
}

/// Publishes a Kubernetes Event on the `ScheduledEvent`, and on the node if
/// given, through the [`crate::controller::act::kube_events::EventSink`]: it returns at once, and a pass never
/// waits for Events (best effort, as client-go's recorder).
pub fn publish(
    writers: &Writers,
    ev: &ScheduledEvent,
    subject: Subject<'_>,
    type_: KubeEventType,
    reason: &str,
    note: String,
) {
    let node = match subject {
        Subject::Node(name) | Subject::NodeOnly(name) => {
            writers.nodes.get(&reflector::ObjectRef::new(name))
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
        writers.kube_events.post(event(related), ev.object_ref(&()));
    }
    if let Some(n) = node {
        writers
            .kube_events
            .post(event(Some(ev.object_ref(&()))), n.object_ref(&()));
    }
}

#[cfg(test)]
mod tests {
    use super::cleared_for_new_appearance;
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
        ev.metadata.resource_version = Some("41".into());
        let (fresh, anew) = for_current_appearance(&ev);
        assert!(anew);
        let patch = cleared_for_new_appearance(&fresh);
        assert!(patch["status"]["approval"].is_null());
        assert_eq!(
            patch["metadata"]["resourceVersion"], "41",
            "conditional on the version read: {patch}"
        );
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
}

/// Per event UID, the drained nodes that its status counts without listing
/// them (an event of more than
/// [`crate::controller::decide::status::NODE_RECORDS_LISTED`] nodes), so
/// that each node's drain is announced once (a listed node's record says
/// it). After a restart a drain not listed may be announced once more.
#[derive(Default)]
pub struct Announced(std::sync::Mutex<HashMap<String, std::collections::HashSet<String>>>);

impl Announced {
    /// Whether `node`'s drain in `ev` was seen while its record was not
    /// listed; remembers it when `unlisted`.
    pub fn drained_unlisted(&self, ev: &ScheduledEvent, node: &str, unlisted: bool) -> bool {
        let uid = ev.metadata.uid.clone().unwrap_or_default();
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if unlisted {
            !map.entry(uid).or_default().insert(node.to_string())
        } else {
            map.get(&uid).is_some_and(|s| s.contains(node))
        }
    }

    /// Forgets the events whose UID is not in `live`.
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|uid, _| live.contains(uid));
    }
}
