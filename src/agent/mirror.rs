//! The pure part of the agent: what to write to the API server when this
//! VM's IMDS document changes.
//!
//! Rules (DESIGN.md, rules 1 and 9): one object per `EventId`; every agent
//! that sees an event converges on the same spec; `eventStatus` only moves
//! forward (`Scheduled` -> `Started` -> `Completed`), so an agent whose
//! document lags behind another's never moves an object back.

use std::collections::HashMap;

use crate::crd::ScheduledEventSpec;
use crate::imds::model::{Document, Event, EventStatus};

/// The spec an agent writes for `event` as IMDS shows it now.
pub fn spec_for(event: &Event) -> ScheduledEventSpec {
    ScheduledEventSpec {
        event_id: event.event_id.clone(),
        event_type: event.event_type.to_string(),
        event_status: event.event_status.to_string(),
        event_source: event.event_source.clone(),
        resource_type: event.resource_type.clone(),
        resources: event.resources.clone(),
        not_before: event.not_before,
        duration_seconds: event.duration_seconds,
        description: event.description.clone(),
    }
}

/// What to write given what IMDS shows (`seen`) and what is stored
/// (`stored`), or `None` when the stored spec is already as new or newer.
pub fn merge_forward(
    stored: Option<&ScheduledEventSpec>,
    seen: ScheduledEventSpec,
) -> Option<ScheduledEventSpec> {
    let Some(stored) = stored else {
        return Some(seen);
    };
    let stored_rank = EventStatus::from(stored.event_status.as_str()).rank();
    let seen_rank = EventStatus::from(seen.event_status.as_str()).rank();
    if seen_rank < stored_rank || (seen_rank == stored_rank && *stored == seen) {
        None
    } else {
        Some(seen)
    }
}

/// The stored spec moved to `Completed`, or `None` if it already is.
pub fn completed(stored: &ScheduledEventSpec) -> Option<ScheduledEventSpec> {
    if EventStatus::from(stored.event_status.as_str()) == EventStatus::Completed {
        return None;
    }
    Some(ScheduledEventSpec {
        event_status: EventStatus::Completed.to_string(),
        ..stored.clone()
    })
}

/// Object names of the events listed in `previous` but no longer in
/// `current`: the platform finished or cancelled them.
pub fn vanished(previous: &Document, current: &Document) -> Vec<String> {
    let now: HashMap<String, ()> = current
        .events
        .iter()
        .map(|e| (e.object_name(), ()))
        .collect();
    previous
        .events
        .iter()
        .map(Event::object_name)
        .filter(|n| !now.contains_key(n))
        .collect()
}

/// Whether two documents list the same events (incarnation aside).
pub fn same_events(a: &Document, b: &Document) -> bool {
    a.events == b.events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::imds::model::parse_document;

    fn doc(json: &str) -> Document {
        parse_document(json.as_bytes()).unwrap()
    }

    const SCHEDULED: &str = r#"{"DocumentIncarnation":2,"Events":[{"EventId":"ABC-1","EventStatus":"Scheduled","EventType":"Reboot","ResourceType":"VirtualMachine","Resources":["vm_1"],"NotBefore":"Mon, 11 Apr 2022 22:26:58 GMT","Description":"d","EventSource":"Platform","DurationInSeconds":-1}]}"#;
    const STARTED: &str = r#"{"DocumentIncarnation":3,"Events":[{"EventId":"ABC-1","EventStatus":"Started","EventType":"Reboot","ResourceType":"VirtualMachine","Resources":["vm_1"],"NotBefore":"","Description":"d","EventSource":"Platform","DurationInSeconds":-1}]}"#;
    const EMPTY: &str = r#"{"DocumentIncarnation":4,"Events":[]}"#;

    #[test]
    fn new_event_is_written_as_seen() {
        let d = doc(SCHEDULED);
        let spec = merge_forward(None, spec_for(&d.events[0])).unwrap();
        assert_eq!(spec.event_id, "ABC-1");
        assert_eq!(spec.event_status, "Scheduled");
        assert!(spec.not_before.is_some());
    }

    #[test]
    fn lagging_agent_never_moves_status_back() {
        let started = spec_for(&doc(STARTED).events[0]);
        let scheduled = spec_for(&doc(SCHEDULED).events[0]);
        assert_eq!(merge_forward(Some(&started), scheduled), None);
        let done = completed(&started).unwrap();
        assert_eq!(merge_forward(Some(&done), started.clone()), None);
    }

    #[test]
    fn forward_move_is_written_and_identical_spec_is_not() {
        let started = spec_for(&doc(STARTED).events[0]);
        let scheduled = spec_for(&doc(SCHEDULED).events[0]);
        assert_eq!(
            merge_forward(Some(&scheduled), started.clone()),
            Some(started.clone())
        );
        assert_eq!(merge_forward(Some(&started), started.clone()), None);
    }

    #[test]
    fn event_that_left_the_document_is_completed_once() {
        let gone = vanished(&doc(STARTED), &doc(EMPTY));
        assert_eq!(gone, vec!["abc-1".to_string()]);
        let started = spec_for(&doc(STARTED).events[0]);
        let done = completed(&started).unwrap();
        assert_eq!(done.event_status, "Completed");
        assert_eq!(completed(&done), None);
        assert!(vanished(&doc(SCHEDULED), &doc(STARTED)).is_empty());
    }
}
