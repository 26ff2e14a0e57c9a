//! Which agent sends an approval the controller decided (DESIGN.md rule 3).
//!
//! Only an agent whose own IMDS document lists the event as `Scheduled` may
//! send it (the caller checks that); the agent of a VM the event names goes
//! first, any other steps in after a fallback delay (the named VMs may be
//! gone or not in the cluster); a `Terminate` is approved only by the VM it
//! names, as Azure advises, since approving one VM's delete may hold back or
//! release the others'. Sending twice is harmless: IMDS answers 200 again.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::crd::Approval;
use crate::imds::model::{Event, EventType};

/// The `result` an agent records when IMDS accepted the approval.
pub const ACCEPTED: &str = "Accepted";

/// Whether the agent of VM `my_vm` should send the approval of `event` now.
pub fn should_send(
    event: &Event,
    approval: Option<&Approval>,
    my_vm: &str,
    now: DateTime<Utc>,
    fallback: Duration,
) -> bool {
    let Some(approval) = approval else {
        return false;
    };
    let Some(decided) = approval.decided_at else {
        return false;
    };
    if approval.result.as_deref() == Some(ACCEPTED) {
        return false;
    }
    let mine = event.names_vm(my_vm);
    if event.event_type == EventType::Terminate {
        return mine;
    }
    mine || (now - decided).to_std().unwrap_or_default() >= fallback
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::imds::model::EventStatus;

    fn event(type_: EventType) -> Event {
        Event {
            event_id: "E".into(),
            event_type: type_,
            event_status: EventStatus::Scheduled,
            event_source: "Platform".into(),
            resource_type: "VirtualMachine".into(),
            resources: vec!["vmss_1".into()],
            not_before: None,
            duration_seconds: -1,
            description: String::new(),
        }
    }

    fn decided(at: DateTime<Utc>) -> Approval {
        Approval {
            decided_at: Some(at),
            reason: Some("drained".into()),
            ..Default::default()
        }
    }

    const FALLBACK: Duration = Duration::from_secs(5);

    #[test]
    fn nothing_is_sent_before_the_controller_decides() {
        let now = Utc::now();
        let ev = event(EventType::Reboot);
        assert!(!should_send(&ev, None, "vmss_1", now, FALLBACK));
        assert!(!should_send(
            &ev,
            Some(&Approval::default()),
            "vmss_1",
            now,
            FALLBACK
        ));
    }

    #[test]
    fn the_named_vm_sends_at_once_others_after_the_fallback() {
        let now = Utc::now();
        let ev = event(EventType::Redeploy);
        let a = decided(now);
        assert!(should_send(&ev, Some(&a), "VMSS_1", now, FALLBACK));
        assert!(!should_send(&ev, Some(&a), "vmss_0", now, FALLBACK));
        let later = now + chrono::Duration::seconds(6);
        assert!(should_send(&ev, Some(&a), "vmss_0", later, FALLBACK));
    }

    #[test]
    fn terminate_is_sent_only_by_the_vm_it_deletes() {
        let now = Utc::now();
        let ev = event(EventType::Terminate);
        let a = decided(now - chrono::Duration::hours(1));
        assert!(should_send(&ev, Some(&a), "vmss_1", now, FALLBACK));
        assert!(!should_send(&ev, Some(&a), "vmss_0", now, FALLBACK));
    }

    #[test]
    fn an_accepted_approval_is_not_sent_again_but_a_failed_one_is() {
        let now = Utc::now();
        let ev = event(EventType::Reboot);
        let mut a = decided(now);
        a.result = Some(ACCEPTED.into());
        assert!(!should_send(&ev, Some(&a), "vmss_1", now, FALLBACK));
        a.result = Some("Failed: IMDS answered 500".into());
        assert!(should_send(&ev, Some(&a), "vmss_1", now, FALLBACK));
    }
}
