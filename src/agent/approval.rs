//! Whether an agent sends an approval the controller decided (DESIGN.md
//! rule 3).
//!
//! A decision is bound to the event it was made on: its appearance and the
//! identity digest of the event ([`crate::crd::identity_digest`]). An agent
//! sends it only while its own current IMDS document lists the event
//! `Scheduled` with that digest (the caller checks `Scheduled`), and only
//! when its own report is of that appearance: a decision of an earlier
//! appearance, or about other content, is never sent, whatever the object
//! says.
//!
//! One agent goes first: that of the first VM the event names (in lower
//! case, sorted), so that an event naming a hundred VMs is approved once,
//! not by a hundred agents at the same instant; any other steps in after a
//! fallback delay (the first VM may be gone or not in the cluster). A
//! `Terminate` or `Preempt` is approved only by a VM it names, as Azure
//! advises, since approving one VM's delete may hold back or release the
//! others'. Sending twice is harmless: IMDS answers 200 again.
//!
//! The fallback delay runs on the agent's own clock, from when it first saw
//! the decision, never from the controller's `decidedAt`: two machines'
//! clocks may disagree by more than the delay.

use std::time::Duration;

use crate::crd::{Approval, Report};
use crate::imds::model::{Event, EventType};

/// The `result` the controller records when IMDS accepted an approval.
pub const ACCEPTED: &str = "Accepted";

/// The decision `approval` binds, if it is one: `(appearance, digest)`.
pub fn decision(approval: Option<&Approval>) -> Option<(u32, &str)> {
    let a = approval?;
    a.decided_at?;
    Some((a.appearance?, a.digest.as_deref()?))
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
    if approval.and_then(|a| a.result.as_deref()) == Some(ACCEPTED) {
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
    use crate::crd::SentApproval;
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
        crate::agent::reports::view_of(ev, "node", vm, 1, 1)
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
        let me = crate::agent::reports::view_of(&ev, "node", "vmss_1", 1, 2);
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
        a.result = Some(ACCEPTED.into());
        assert!(!send(&ev, Some(&a), "vmss_1", JUST_SEEN));
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
}
