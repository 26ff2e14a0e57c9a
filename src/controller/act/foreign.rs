//! Decisions the controller did not make. Anyone with write on a
//! `ScheduledEvent`'s status can write an approval there; the controller
//! carries on only from its own ([`crate::agent::approval::author`], the
//! same check the agents make before sending). One written, in whole or in
//! part, by another field manager is ignored (no phase `Approved`, no
//! acceptance taken from it), cleared, and reported: condition
//! `ForeignDecision`, a Warning Event naming who wrote it, and
//! `forewarn_controller_foreign_decisions_total`.

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType as KubeEventType;
use serde_json::json;
use tracing::warn;

use crate::agent::approval::{Author, author};
use crate::api::{CONTROLLER_MANAGER, Condition, ScheduledEvent, ScheduledEventStatus};
use crate::controller::act::publish::{Subject, publish};
use crate::controller::act::writers::{Writers, conditional_on};
use crate::controller::error::{Error, Result};

/// The condition that records a decision the controller did not make.
pub const CONDITION: &str = "ForeignDecision";

/// Who wrote the approval `stored` holds, when it is not the controller's
/// own (see [`author`]): e.g. `kubectl-patch (Update, status)`.
pub fn writer(stored: &ScheduledEvent) -> Option<String> {
    let by = author(
        stored
            .metadata
            .managed_fields
            .as_deref()
            .unwrap_or_default(),
        stored.status.as_ref().and_then(|s| s.approval.as_ref()),
    );
    matches!(by, Author::Foreign(_)).then(|| by.describe())
}

/// Ignores an approval of `stored` the controller did not write: takes it
/// out of `ev` (the event as this pass handles it). Returns who wrote it,
/// if anyone but the controller did; [`clear`] then removes it from the
/// stored status, with the pass's writes.
pub fn ignore(stored: &ScheduledEvent, ev: &mut ScheduledEvent) -> Option<String> {
    let by = writer(stored)?;
    warn!(written_by = %by, "Ignoring an approval the controller did not write");
    if let Some(s) = ev.status.as_mut() {
        s.approval = None;
    }
    Some(by)
}

/// Removes from the stored status the approval `by` wrote that [`ignore`]
/// took out of `ev` (the event as the pass handles it, whose version the
/// write is conditional on and then carries), counts and reports it.
///
/// # Errors
/// [`Error::PatchStatus`] when the approval cannot be removed.
pub async fn clear(
    stored: &ScheduledEvent,
    ev: &mut ScheduledEvent,
    writers: &Writers,
    by: &str,
) -> Result<()> {
    let name = ev.name_any();
    // A merge patch removes the approval whoever owns its fields (the
    // controller's own apply would leave another manager's fields). The
    // same write records the condition, so that it stays on record even if
    // this pass ends before its status write: the next pass no longer sees
    // the approval, only the condition it keeps.
    let mut recorded = stored.status.clone().unwrap_or_default();
    record(
        &mut recorded,
        stored.status.as_ref(),
        Some(by),
        stored.metadata.generation,
        chrono::Utc::now(),
    );
    let mut body = json!({"status": {"approval": null, "conditions": recorded.conditions}});
    conditional_on(&mut body, ev.metadata.resource_version.as_deref());
    let written = Api::<ScheduledEvent>::all(writers.client.clone())
        .patch_status(
            &name,
            &PatchParams {
                field_manager: Some(CONTROLLER_MANAGER.into()),
                ..PatchParams::default()
            },
            &Patch::Merge(&body),
        )
        .await
        .map_err(|source| Error::PatchStatus {
            name: name.clone(),
            source,
        })?;
    // The pass's status write is conditional on the version this one made.
    ev.metadata.resource_version = written.resource_version();
    writers.metrics.foreign_decisions.inc();
    publish(
        writers,
        ev,
        Subject::Event,
        KubeEventType::Warning,
        CONDITION,
        format!(
            "{name}: status.approval was written by {by}, not by the forewarn controller: ignored and removed"
        ),
    );
    Ok(())
}

/// Records in `status` the approval written by `by` this pass (condition
/// [`CONDITION`] True naming the writer), or, when none was found, keeps
/// the condition as `prev` recorded it: a decision someone else made stays
/// on record for this appearance.
pub fn record(
    status: &mut ScheduledEventStatus,
    prev: Option<&ScheduledEventStatus>,
    by: Option<&str>,
    generation: Option<i64>,
    now: DateTime<Utc>,
) {
    let kept = prev
        .and_then(|p| p.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == CONDITION))
        .cloned();
    let condition = match (by, kept) {
        (Some(by), kept) => Condition {
            observed_generation: generation,
            type_: CONDITION.into(),
            status: "True".into(),
            reason: "NotWrittenByController".into(),
            message: format!(
                "status.approval was written by {by}, not by the forewarn controller's status apply: ignored and removed; agents send only the controller's decisions"
            ),
            last_transition_time: kept
                .filter(|c| c.status == "True")
                .map_or(now, |c| c.last_transition_time),
        },
        (None, Some(kept)) => kept,
        (None, None) => return,
    };
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    conditions.retain(|c| c.type_ != CONDITION);
    conditions.push(condition);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Approval;

    fn with_condition(message: &str, at: DateTime<Utc>) -> ScheduledEventStatus {
        ScheduledEventStatus {
            conditions: Some(vec![Condition {
                observed_generation: Some(1),
                type_: CONDITION.into(),
                status: "True".into(),
                reason: "NotWrittenByController".into(),
                message: message.into(),
                last_transition_time: at,
            }]),
            ..ScheduledEventStatus::default()
        }
    }

    #[test]
    fn a_foreign_decision_is_recorded_naming_its_writer_and_stays_recorded() {
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let t1 = t0 + chrono::Duration::seconds(30);
        let mut status = ScheduledEventStatus::default();
        record(
            &mut status,
            None,
            Some("kubectl-patch (Update, status)"),
            Some(1),
            t0,
        );
        let c = &status.conditions.as_ref().unwrap()[0];
        assert_eq!((c.type_.as_str(), c.status.as_str()), (CONDITION, "True"));
        assert!(c.message.contains("kubectl-patch (Update, status)"));
        assert_eq!(c.last_transition_time, t0);
        // A later pass finds none (it was cleared): the record stays as it was.
        let prev = status.clone();
        let mut next = ScheduledEventStatus::default();
        record(&mut next, Some(&prev), None, Some(1), t1);
        assert_eq!(next.conditions, prev.conditions);
        // Another one later: named, the transition time kept.
        let mut again = ScheduledEventStatus::default();
        record(
            &mut again,
            Some(&prev),
            Some("mallory (Update, status)"),
            Some(1),
            t1,
        );
        let c = &again.conditions.as_ref().unwrap()[0];
        assert!(c.message.contains("mallory"));
        assert_eq!(c.last_transition_time, t0);
        // Never recorded, none found: no condition.
        let mut none = ScheduledEventStatus::default();
        record(&mut none, None, None, Some(1), t1);
        assert!(none.conditions.is_none());
        // Other conditions are left alone.
        let mut other = with_condition("x", t0);
        other.conditions.as_mut().unwrap()[0].type_ = "DrainBlocked".into();
        record(&mut other, None, Some("m (Update, status)"), Some(1), t1);
        assert_eq!(other.conditions.as_ref().unwrap().len(), 2);
    }

    #[test]
    fn the_writer_is_read_from_the_managed_fields() {
        let mut ev = ScheduledEvent::new(
            "e",
            serde_json::from_value(json!({
                "eventId": "E", "eventType": "Reboot", "eventStatus": "Scheduled",
                "eventSource": "Platform", "resourceType": "VirtualMachine",
                "resources": ["vm_0"],
            }))
            .unwrap(),
        );
        assert_eq!(writer(&ev), None);
        ev.status = Some(ScheduledEventStatus {
            approval: Some(Approval {
                decided_at: Some(Utc::now()),
                ..Approval::default()
            }),
            ..ScheduledEventStatus::default()
        });
        ev.metadata.managed_fields = Some(
            serde_json::from_value(json!([{
                "manager": "kubectl-patch", "operation": "Update", "subresource": "status",
                "apiVersion": "forewarn.dev/v1alpha1", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:approval": {".": {}, "f:decidedAt": {}}}},
            }]))
            .unwrap(),
        );
        assert_eq!(
            writer(&ev).as_deref(),
            Some("kubectl-patch (Update, status)")
        );
        ev.metadata.managed_fields = Some(
            serde_json::from_value(json!([{
                "manager": CONTROLLER_MANAGER, "operation": "Apply", "subresource": "status",
                "apiVersion": "forewarn.dev/v1alpha1", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:approval": {"f:decidedAt": {}}}},
            }]))
            .unwrap(),
        );
        assert_eq!(writer(&ev), None);
    }
}
