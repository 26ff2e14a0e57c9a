//! Hold and approve by hand: the annotations an operator sets on a
//! `ScheduledEvent` ([`HOLD_ANNOTATION`], [`APPROVE_NOW_ANNOTATION`]), what
//! they do to the plan ([`read`]), and who set them ([`setter`]).
//!
//! - `forewarn.dev/hold`: no approval is decided for the event while it is
//!   set; the cordon and drain go on, and the platform starts the event at
//!   `NotBefore` on its own (Azure's rule for an event nobody approves). An
//!   approval decided before the hold was set is not taken back (an agent
//!   may already have sent it).
//! - `forewarn.dev/approve-now`: the approval is decided now, whatever is
//!   left of the drain, the pods kept or the acknowledgements awaited. It
//!   only decides the approval: evictions go on as before, never forced,
//!   never past a PodDisruptionBudget. It does not override what says the
//!   event itself is in doubt (agents reporting different content, a VM
//!   claimed by two nodes). The hold wins when both are set.
//!
//! An annotation set to `"false"` (any case) counts as absent.
//!
//! The annotations are metadata: the controller's server-side applies write
//! only `status` (and `spec` by merge patch), so it never owns or removes
//! them.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

use crate::api::{EventStatus, ScheduledEvent};

/// Annotation that holds the approval back (any value but `"false"`).
pub const HOLD_ANNOTATION: &str = "forewarn.dev/hold";

/// Annotation that has the approval decided at once (any value but `"false"`).
pub const APPROVE_NOW_ANNOTATION: &str = "forewarn.dev/approve-now";

/// An operator's word on an event, and who gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Override {
    /// [`HOLD_ANNOTATION`] is set.
    Hold {
        /// Who set it ([`setter`]).
        by: String,
    },
    /// [`APPROVE_NOW_ANNOTATION`] is set (and no hold).
    ApproveNow {
        /// Who set it ([`setter`]).
        by: String,
        /// Whether this pass decides the approval because of it (else it
        /// was decided before, or the event is no longer `Scheduled`, or it
        /// is in doubt).
        decides: bool,
    },
}

/// Whether `ev` carries the annotation `key` with a value other than `"false"`.
pub fn is_set(ev: &ScheduledEvent, key: &str) -> bool {
    ev.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("false"))
}

/// Who set the annotation `key`, from the object's `managedFields`: the
/// field manager and operation of the last entry that owns
/// `metadata.annotations[key]`, e.g. `kubectl-annotate (Update,
/// 2026-11-27T10:00:00+00:00)`. The API server records the manager name the
/// client chose (kubectl: `kubectl-annotate`, `kubectl-patch`,
/// `kubectl-edit`, or what `--field-manager` says; `kubectl forewarn`
/// writes `kubectl-forewarn-<user>` with the user the API server
/// authenticated), not the authenticated user: the audit log holds that.
/// `unknown` when no entry owns it.
pub fn setter(ev: &ScheduledEvent, key: &str) -> String {
    owner_of(
        ev.metadata.managed_fields.as_deref().unwrap_or_default(),
        key,
    )
    .unwrap_or_else(|| "unknown (no managedFields entry owns it)".into())
}

fn owner_of(managed: &[ManagedFieldsEntry], key: &str) -> Option<String> {
    let field = format!("f:{key}");
    managed
        .iter()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:metadata"))
                .and_then(|m| m.get("f:annotations"))
                .and_then(|a| a.get(&field))
                .is_some()
        })
        .max_by_key(|m| m.time.as_ref().map(|t| t.0))
        .map(|m| {
            let time = m
                .time
                .as_ref()
                .map(|t| format!(", {}", t.0))
                .unwrap_or_default();
            format!(
                "{} ({}{time})",
                m.manager.as_deref().unwrap_or("unknown"),
                m.operation.as_deref().unwrap_or("unknown"),
            )
        })
}

/// What an operator's annotation does to the plan of a live event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Nothing changes (an approve-now on an event already decided,
    /// started, not `Scheduled`, or in doubt; or the plan decides anyway).
    Nothing,
    /// Take back the approval the plan would decide in this pass (a hold).
    Withhold,
    /// Decide the approval now, with this reason (an approve-now).
    Decide(String),
}

/// The annotation in force on `ev` and its effect: a hold takes back an
/// approval this pass would decide; an approve-now decides it while the
/// event is `Scheduled`, not yet `decided` nor `started`, not `in_doubt`,
/// and the plan does not decide it anyway (`deciding`).
pub fn read(
    ev: &ScheduledEvent,
    decided: bool,
    started: bool,
    in_doubt: bool,
    deciding: bool,
) -> Option<(Override, Effect)> {
    if is_set(ev, HOLD_ANNOTATION) {
        let by = setter(ev, HOLD_ANNOTATION);
        return Some((Override::Hold { by }, Effect::Withhold));
    }
    if !is_set(ev, APPROVE_NOW_ANNOTATION) {
        return None;
    }
    let by = setter(ev, APPROVE_NOW_ANNOTATION);
    let decides = !decided
        && !started
        && !in_doubt
        && !deciding
        && ev.spec.event_status == EventStatus::Scheduled;
    let effect = if decides {
        Effect::Decide(format!(
            "approved by hand: annotation {APPROVE_NOW_ANNOTATION} set by {by}"
        ))
    } else {
        Effect::Nothing
    };
    Some((Override::ApproveNow { by, decides }, effect))
}

/// The message of the condition recording `o` (see
/// [`crate::controller::decide::status`]): `(type, reason, message)`.
pub fn condition(o: &Override, now: DateTime<Utc>) -> (&'static str, &'static str, String) {
    match o {
        Override::Hold { by } => (
            "ApprovalHeld",
            "HoldAnnotation",
            format!(
                "annotation {HOLD_ANNOTATION} set by {by}: no approval is decided while it is set; the drain goes on, and the platform starts the event at NotBefore"
            ),
        ),
        Override::ApproveNow { by, .. } => (
            "ApprovedByHand",
            "ApproveNowAnnotation",
            format!(
                "annotation {APPROVE_NOW_ANNOTATION} set by {by}: approval decided without waiting for the drain (seen {}); evictions go on as before, never forced, never past a PodDisruptionBudget",
                now.to_rfc3339()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(annotations: serde_json::Value, managed: serde_json::Value) -> ScheduledEvent {
        serde_json::from_value(json!({
            "apiVersion": "forewarn.dev/v1alpha1", "kind": "ScheduledEvent",
            "metadata": {"name": "e", "annotations": annotations, "managedFields": managed},
            "spec": {"eventId": "E", "eventType": "Reboot", "eventStatus": "Scheduled"},
        }))
        .unwrap()
    }

    #[test]
    fn the_setter_is_the_last_manager_owning_the_annotation() {
        let ev = event(
            json!({"forewarn.dev/hold": "true"}),
            json!([
                {"manager": "forewarn-controller", "operation": "Apply", "subresource": "status",
                 "time": "2026-11-27T10:00:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:status": {"f:phase": {}}}},
                {"manager": "kubectl-annotate", "operation": "Update",
                 "time": "2026-11-27T10:01:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:forewarn.dev/hold": {}}}}},
            ]),
        );
        assert!(is_set(&ev, HOLD_ANNOTATION));
        assert!(!is_set(&ev, APPROVE_NOW_ANNOTATION));
        assert_eq!(
            setter(&ev, HOLD_ANNOTATION),
            "kubectl-annotate (Update, 2026-11-27T10:01:00Z)"
        );
        assert!(setter(&ev, APPROVE_NOW_ANNOTATION).starts_with("unknown"));
        let off = event(json!({"forewarn.dev/hold": "False"}), json!([]));
        assert!(!is_set(&off, HOLD_ANNOTATION));
    }

    fn planned(
        event_type: &str,
        duration: i64,
        annotations: serde_json::Value,
    ) -> crate::controller::decide::plan::Plan {
        use crate::controller::observe::observed::{Observed, ObservedNode};
        let now: chrono::DateTime<chrono::Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        let ev: ScheduledEvent = serde_json::from_value(json!({
            "apiVersion": "forewarn.dev/v1alpha1", "kind": "ScheduledEvent",
            "metadata": {"name": "e", "annotations": annotations},
            "spec": {"eventId": "E", "eventType": event_type, "eventStatus": "Scheduled",
                     "eventSource": "Platform", "resources": ["vm1"], "durationSeconds": duration,
                     "notBefore": "2026-01-01T00:10:00Z"},
        }))
        .unwrap();
        // A node with a pod left: not drained.
        let pod = std::sync::Arc::new(crate::controller::observe::pod_list::PodInfo {
            namespace: "shop".into(),
            name: "web-1".into(),
            managed: true,
            grace_seconds: 30,
            ..Default::default()
        });
        let seen = Observed {
            nodes: vec![ObservedNode {
                name: "n1".into(),
                vm_name: "vm1".into(),
                cordoned: true,
                holds: vec!["e".into()],
                pods: vec![pod],
                ..Default::default()
            }],
            ..Default::default()
        };
        crate::controller::decide::plan::plan(&ev, &seen, &crate::policy::Policy::default(), now)
    }

    /// A hold takes back an approval the policy decides at once (a short
    /// Freeze), and wins over approve-now; approve-now decides the
    /// approval of a drain not finished, and the evictions stay planned.
    #[test]
    fn hold_withholds_and_approve_now_decides_without_touching_the_drain() {
        assert!(planned("Freeze", 5, json!({})).decide_approval.is_some());
        let held = planned("Freeze", 5, json!({"forewarn.dev/hold": "true"}));
        assert_eq!(held.decide_approval, None);
        assert!(matches!(held.manual, Some(Override::Hold { .. })));
        let both = planned(
            "Reboot",
            -1,
            json!({"forewarn.dev/hold": "true", "forewarn.dev/approve-now": "true"}),
        );
        assert_eq!(both.decide_approval, None);
        let draining = planned("Reboot", -1, json!({}));
        assert_eq!(draining.decide_approval, None);
        let now = planned("Reboot", -1, json!({"forewarn.dev/approve-now": "true"}));
        assert!(
            now.decide_approval
                .as_deref()
                .is_some_and(|r| r.starts_with(
                    "approved by hand: annotation forewarn.dev/approve-now set by unknown"
                )),
            "{:?}",
            now.decide_approval
        );
        assert!(matches!(
            now.manual,
            Some(Override::ApproveNow { decides: true, .. })
        ));
        assert_eq!(now.evictions, draining.evictions, "the drain is unchanged");
        assert_eq!(now.evictions.len(), 1);
    }
}
