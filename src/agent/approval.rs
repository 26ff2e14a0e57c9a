//! Which agent sends an approval the controller decided (DESIGN.md rule 3).
//!
//! Only an agent whose own IMDS document lists the event as `Scheduled` may
//! send it (the caller checks that). One agent goes first: that of the
//! first VM the event names (in lower case, sorted), so that an event
//! naming a hundred VMs is approved once, not by a hundred agents at the
//! same instant; any other steps in after a fallback delay (the first VM
//! may be gone or not in the cluster). A `Terminate` is approved only by a
//! VM it names, as Azure advises, since approving one VM's delete may hold
//! back or release the others'. Sending twice is harmless: IMDS answers 200
//! again.
//!
//! The fallback delay runs on the agent's own clock, from when it first saw
//! the decision, never from the controller's `decidedAt`: two machines'
//! clocks may disagree by more than the delay.

use std::time::Duration;

use crate::crd::Approval;
use crate::imds::model::{Event, EventType};

/// The `result` an agent records when IMDS accepted the approval.
pub const ACCEPTED: &str = "Accepted";

/// Whether the agent of VM `my_vm` should send the approval of `event` now,
/// `seen_for` after it first saw the decision (its own monotonic clock).
pub fn should_send(
    event: &Event,
    approval: Option<&Approval>,
    my_vm: &str,
    seen_for: Duration,
    fallback: Duration,
) -> bool {
    let Some(approval) = approval else {
        return false;
    };
    if approval.decided_at.is_none() {
        return false;
    }
    if approval.result.as_deref() == Some(ACCEPTED) {
        return false;
    }
    let mine = event.names_vm(my_vm);
    if event.event_type == EventType::Terminate {
        return mine && (first_named(event, my_vm) || seen_for >= fallback);
    }
    (mine && first_named(event, my_vm)) || seen_for >= fallback
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

#[cfg(test)]
mod tests {
    use super::*;
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

    fn decided(at: DateTime<Utc>) -> Approval {
        Approval {
            decided_at: Some(at),
            reason: Some("drained".into()),
            ..Default::default()
        }
    }

    const FALLBACK: Duration = Duration::from_secs(5);

    const JUST_SEEN: Duration = Duration::ZERO;

    #[test]
    fn nothing_is_sent_before_the_controller_decides() {
        let ev = event(EventType::Reboot);
        let long = Duration::from_secs(3600);
        assert!(!should_send(&ev, None, "vmss_1", long, FALLBACK));
        assert!(!should_send(
            &ev,
            Some(&Approval::default()),
            "vmss_1",
            long,
            FALLBACK
        ));
    }

    #[test]
    fn the_named_vm_sends_at_once_others_after_the_fallback() {
        let ev = event(EventType::Redeploy);
        let a = decided(Utc::now());
        assert!(should_send(&ev, Some(&a), "VMSS_1", JUST_SEEN, FALLBACK));
        assert!(!should_send(&ev, Some(&a), "vmss_0", JUST_SEEN, FALLBACK));
        let later = Duration::from_secs(6);
        assert!(should_send(&ev, Some(&a), "vmss_0", later, FALLBACK));
    }

    #[test]
    fn of_many_named_vms_the_first_sends_at_once_the_others_after_the_fallback() {
        let mut ev = event(EventType::Reboot);
        ev.resources = (0..100).rev().map(|i| format!("VMSS_{i:02}")).collect();
        let a = decided(Utc::now());
        assert!(should_send(&ev, Some(&a), "vmss_00", JUST_SEEN, FALLBACK));
        assert!(!should_send(&ev, Some(&a), "vmss_01", JUST_SEEN, FALLBACK));
        assert!(!should_send(&ev, Some(&a), "vmss_99", JUST_SEEN, FALLBACK));
        assert!(should_send(&ev, Some(&a), "vmss_99", FALLBACK, FALLBACK));
        // A Terminate likewise, but never by a VM it does not name.
        ev.event_type = EventType::Terminate;
        assert!(should_send(&ev, Some(&a), "vmss_00", JUST_SEEN, FALLBACK));
        assert!(!should_send(&ev, Some(&a), "vmss_01", JUST_SEEN, FALLBACK));
        assert!(should_send(&ev, Some(&a), "vmss_01", FALLBACK, FALLBACK));
        assert!(!should_send(&ev, Some(&a), "other", FALLBACK, FALLBACK));
    }

    #[test]
    fn the_fallback_ignores_the_controllers_clock() {
        let ev = event(EventType::Reboot);
        let now = Utc::now();
        // A decision stamped an hour ago (a clock behind) is still waited for;
        // one stamped an hour ahead is not waited for longer.
        for at in [
            now - chrono::Duration::hours(1),
            now + chrono::Duration::hours(1),
        ] {
            let a = decided(at);
            assert!(!should_send(
                &ev,
                Some(&a),
                "vmss_0",
                Duration::from_secs(4),
                FALLBACK
            ));
            assert!(should_send(&ev, Some(&a), "vmss_0", FALLBACK, FALLBACK));
        }
    }

    #[test]
    fn terminate_is_sent_only_by_the_vm_it_deletes() {
        let ev = event(EventType::Terminate);
        let a = decided(Utc::now() - chrono::Duration::hours(1));
        let long = Duration::from_secs(3600);
        assert!(should_send(&ev, Some(&a), "vmss_1", JUST_SEEN, FALLBACK));
        assert!(!should_send(&ev, Some(&a), "vmss_0", long, FALLBACK));
    }

    #[test]
    fn an_accepted_approval_is_not_sent_again_but_a_failed_one_is() {
        let ev = event(EventType::Reboot);
        let mut a = decided(Utc::now());
        a.result = Some(ACCEPTED.into());
        assert!(!should_send(&ev, Some(&a), "vmss_1", JUST_SEEN, FALLBACK));
        a.result = Some("Failed: IMDS answered 500".into());
        assert!(should_send(&ev, Some(&a), "vmss_1", JUST_SEEN, FALLBACK));
    }
}
