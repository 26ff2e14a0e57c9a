//! The pure part of the agent: what to write to the API server when this
//! VM's IMDS document changes.
//!
//! Rules (DESIGN.md, rules 1 and 9): one object per `EventId`; every agent
//! that sees an event converges on the same spec; within one `appearance`
//! `eventStatus` only moves forward (`Scheduled` -> `Started` ->
//! `Completed`), so an agent whose document lags behind another's never
//! moves an object back. An event listed again after its object recorded it
//! `Completed` starts a new appearance (`spec.appearance` + 1), but only when
//! the agent itself saw it absent: an agent whose document merely lags (it
//! still lists an event another agent saw leave) must not revive it.

use std::collections::{HashMap, HashSet};

use crate::crd::ScheduledEventSpec;
use crate::imds::model::{Document, Event, EventStatus};

/// The spec an agent writes for `event` as IMDS shows it now (first
/// appearance). An `EventStatus` this version does not know is written as
/// `Started` (the schema allows only the three known values; see
/// [`crate::crd::EventStatus`]): drained, never approved, never a crash.
pub fn spec_for(event: &Event) -> ScheduledEventSpec {
    ScheduledEventSpec {
        event_id: event.event_id.clone(),
        event_type: event.event_type.to_string(),
        event_status: (&event.event_status).into(),
        event_source: event.event_source.clone(),
        resource_type: event.resource_type.clone(),
        resources: event.resources.clone(),
        not_before: event.not_before,
        duration_seconds: event.duration_seconds,
        description: event.description.clone(),
        appearance: 1,
    }
}

/// What to write for an event this agent's document lists, given what IMDS
/// shows (`seen`), what is stored (`stored`), and whether the event is new to
/// this agent's document (`new_here`: absent from its previous document, or
/// the agent has just started); `None` when nothing needs writing.
///
/// - No object: `seen`, appearance 1.
/// - Stored `Completed`: if `new_here`, the event came back: `seen` with
///   appearance + 1; otherwise this agent's document lags behind the agent
///   that saw it leave, and nothing is written.
/// - Otherwise `seen` in the stored appearance, unless its status is behind
///   the stored one, or the spec is already equal.
pub fn plan_listed(
    stored: Option<&ScheduledEventSpec>,
    seen: ScheduledEventSpec,
    new_here: bool,
) -> Option<ScheduledEventSpec> {
    let Some(stored) = stored else {
        return Some(ScheduledEventSpec {
            appearance: 1,
            ..seen
        });
    };
    let stored_status = EventStatus::from(stored.event_status.as_str());
    if stored_status == EventStatus::Completed {
        let seen_status = EventStatus::from(seen.event_status.as_str());
        if new_here && seen_status != EventStatus::Completed {
            return Some(ScheduledEventSpec {
                appearance: stored.appearance.saturating_add(1),
                ..seen
            });
        }
        return None;
    }
    // Reports are each agent's own entries: carried over as stored.
    let seen = ScheduledEventSpec {
        appearance: stored.appearance,
        ..seen
    };
    let stored_rank = stored_status.rank();
    let seen_rank = EventStatus::from(seen.event_status.as_str()).rank();
    if seen_rank < stored_rank || (seen_rank == stored_rank && *stored == seen) {
        None
    } else {
        Some(seen)
    }
}

/// The stored spec moved to `Completed`, or `None` if it already is, or if
/// it is in a later appearance than `known` (the appearance this agent last
/// saw listed; `None` when it never saw the event, as in the start-up sweep):
/// this agent never saw that appearance, so it cannot say it ended.
pub fn plan_completed(
    stored: &ScheduledEventSpec,
    known: Option<u32>,
) -> Option<ScheduledEventSpec> {
    if EventStatus::from(stored.event_status.as_str()) == EventStatus::Completed {
        return None;
    }
    if known.is_some_and(|k| stored.appearance > k) {
        return None;
    }
    Some(ScheduledEventSpec {
        event_status: crate::crd::EventStatus::Completed,
        not_before: None,
        ..stored.clone()
    })
}

/// What the agent remembers of one event it mirrored.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracked {
    /// The event as last written (or found already written), `None` until a
    /// write of the current listing succeeded.
    pub written: Option<Event>,
    /// The object's `appearance` when last read or written.
    pub appearance: Option<u32>,
    /// The event left this agent's document and its completion is still to
    /// be written.
    pub gone: bool,
}

/// The work one document asks of an agent, from its memory `tracked`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Work {
    /// Listed events to write, with whether each is new to this agent's
    /// document (see [`plan_listed`]).
    pub listed: Vec<(Event, bool)>,
    /// Object names of events that left the document, to complete, with the
    /// appearance this agent knew (see [`plan_completed`]).
    pub completions: Vec<(String, Option<u32>)>,
}

/// What to do for `doc` given the agent's memory. `force` re-checks every
/// listed event even if unchanged (after the document incarnation went
/// down). An event whose entry was rejected by the parser but whose
/// `EventId` is readable is treated as still listed (neither written nor
/// completed).
pub fn plan_document(doc: &Document, tracked: &HashMap<String, Tracked>, force: bool) -> Work {
    let mut work = Work::default();
    let mut listed_names = HashSet::new();
    for ev in &doc.events {
        let name = ev.object_name();
        listed_names.insert(name.clone());
        match tracked.get(&name) {
            None => work.listed.push((ev.clone(), true)),
            Some(t) if t.gone => work.listed.push((ev.clone(), true)),
            Some(t) if force || t.written.as_ref() != Some(ev) => {
                work.listed.push((ev.clone(), false));
            }
            Some(_) => {}
        }
    }
    for r in &doc.rejected {
        if let Some(id) = &r.event_id {
            listed_names.insert(crate::imds::model::object_name(id));
        }
    }
    let mut gone: Vec<(String, Option<u32>)> = tracked
        .iter()
        .filter(|(name, _)| !listed_names.contains(*name))
        .map(|(name, t)| (name.clone(), t.appearance))
        .collect();
    gone.sort();
    work.completions = gone;
    work
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

    fn scheduled() -> ScheduledEventSpec {
        spec_for(&doc(SCHEDULED).events[0])
    }
    fn started() -> ScheduledEventSpec {
        spec_for(&doc(STARTED).events[0])
    }

    #[test]
    fn an_unknown_imds_status_is_mirrored_as_started_and_never_moves_back() {
        let paused = SCHEDULED.replace("\"Scheduled\"", "\"Paused\"");
        let spec = spec_for(&doc(&paused).events[0]);
        assert_eq!(spec.event_status, crate::crd::EventStatus::Started);
        // Stored Started (from the unknown status), IMDS then says Scheduled: kept.
        assert_eq!(plan_listed(Some(&spec), scheduled(), false), None);
    }

    #[test]
    fn new_event_is_written_as_seen() {
        let spec = plan_listed(None, scheduled(), true).unwrap();
        assert_eq!(spec.event_id, "ABC-1");
        assert_eq!(spec.event_status, "Scheduled");
        assert_eq!(spec.appearance, 1);
        assert!(spec.not_before.is_some());
    }

    #[test]
    fn lagging_agent_never_moves_status_back() {
        assert_eq!(plan_listed(Some(&started()), scheduled(), false), None);
        let done = plan_completed(&started(), Some(1)).unwrap();
        assert_eq!(plan_listed(Some(&done), started(), false), None);
    }

    #[test]
    fn forward_move_drops_not_before_and_identical_spec_is_not_written() {
        let next = plan_listed(Some(&scheduled()), started(), false).unwrap();
        assert_eq!(next, started());
        assert_eq!(next.not_before, None);
        assert_eq!(plan_listed(Some(&started()), started(), false), None);
    }

    #[test]
    fn event_back_after_completion_starts_a_new_appearance() {
        let done = plan_completed(&scheduled(), Some(1)).unwrap();
        let back = plan_listed(Some(&done), scheduled(), true).unwrap();
        assert_eq!(back.event_status, "Scheduled");
        assert_eq!(back.appearance, 2);
        assert!(back.not_before.is_some());
        // Within the new appearance the forward rule holds again.
        assert_eq!(plan_listed(Some(&back), scheduled(), false), None);
        let st = plan_listed(Some(&back), started(), false).unwrap();
        assert_eq!(st.appearance, 2);
    }

    #[test]
    fn an_agent_that_never_saw_a_later_appearance_does_not_complete_it() {
        let mut second = scheduled();
        second.appearance = 2;
        assert_eq!(plan_completed(&second, Some(1)), None);
        assert!(plan_completed(&second, Some(2)).is_some());
        assert!(plan_completed(&second, None).is_some());
    }

    #[test]
    fn document_plan_writes_changes_and_completes_what_left() {
        let mut tracked = HashMap::new();
        let w = plan_document(&doc(SCHEDULED), &tracked, false);
        assert_eq!(w.listed.len(), 1);
        assert!(w.listed[0].1, "new to this agent");
        tracked.insert(
            "sev-x".to_string(),
            Tracked {
                written: None,
                appearance: Some(1),
                gone: false,
            },
        );
        let name = doc(SCHEDULED).events[0].object_name();
        tracked.insert(
            name.clone(),
            Tracked {
                written: Some(doc(SCHEDULED).events[0].clone()),
                appearance: Some(1),
                gone: false,
            },
        );
        let w = plan_document(&doc(SCHEDULED), &tracked, false);
        assert!(w.listed.is_empty(), "unchanged");
        assert_eq!(w.completions, vec![("sev-x".to_string(), Some(1))]);
        let w = plan_document(&doc(SCHEDULED), &tracked, true);
        assert_eq!(w.listed.len(), 1, "forced");
        assert!(!w.listed[0].1);
        let w = plan_document(&doc(STARTED), &tracked, false);
        assert_eq!(w.listed.len(), 1);
        let w = plan_document(&doc(EMPTY), &tracked, false);
        assert_eq!(w.completions.len(), 2);
        tracked.get_mut(&name).unwrap().gone = true;
        let w = plan_document(&doc(SCHEDULED), &tracked, false);
        assert!(w.listed[0].1, "back after leaving");
    }

    #[test]
    fn a_rejected_entry_with_a_readable_id_is_not_completed() {
        let d = doc(
            r#"{"DocumentIncarnation":5,"Events":[{"EventId":"ABC-1","EventStatus":7,"EventType":"Reboot"}]}"#,
        );
        let name = doc(SCHEDULED).events[0].object_name();
        let tracked = HashMap::from([(
            name,
            Tracked {
                written: Some(doc(SCHEDULED).events[0].clone()),
                appearance: Some(1),
                gone: false,
            },
        )]);
        let w = plan_document(&d, &tracked, false);
        assert!(w.listed.is_empty() && w.completions.is_empty(), "{w:?}");
    }
}

#[cfg(test)]
mod props {
    //! Properties of the mirror over random sequences of documents seen by
    //! several agents sharing one store (the API server), with lag.
    use super::*;
    use crate::imds::model::{EventType, object_name};
    use proptest::prelude::*;

    /// One agent's view of event `id` at a moment: absent, Scheduled or Started.
    fn event(id: usize, status: u8) -> Option<Event> {
        let status = match status {
            0 => return None,
            1 => EventStatus::Scheduled,
            _ => EventStatus::Started,
        };
        Some(Event {
            event_id: format!("id-{id}"),
            event_type: EventType::Reboot,
            not_before: (status == EventStatus::Scheduled)
                .then(|| chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default()),
            event_status: status,
            event_source: "Platform".into(),
            resource_type: "VirtualMachine".into(),
            resources: vec!["vm".into()],
            not_before_unparsed: None,
            duration_seconds: -1,
            description: String::new(),
        })
    }

    /// Applies one agent's document to the store, as the agent does, and
    /// checks every write against the rules.
    fn mirror(
        store: &mut HashMap<String, ScheduledEventSpec>,
        tracked: &mut HashMap<String, Tracked>,
        doc: &Document,
    ) -> Result<(), TestCaseError> {
        let work = plan_document(doc, tracked, false);
        for (ev, new_here) in work.listed {
            let name = ev.object_name();
            let old = store.get(&name).cloned();
            if let Some(next) = plan_listed(old.as_ref(), spec_for(&ev), new_here) {
                check_move(old.as_ref(), &next)?;
                store.insert(name.clone(), next);
            }
            let stored = &store[&name];
            // Every listed event is mirrored: an object exists, and unless a
            // lagging agent holds back, it shows what IMDS shows.
            if EventStatus::from(stored.event_status.as_str()) != EventStatus::Completed {
                prop_assert!(
                    EventStatus::from(stored.event_status.as_str()).rank()
                        >= ev.event_status.rank()
                );
            }
            tracked.insert(
                name,
                Tracked {
                    written: Some(ev),
                    appearance: Some(stored.appearance),
                    gone: false,
                },
            );
        }
        for (name, known) in work.completions {
            if let Some(old) = store.get(&name).cloned()
                && let Some(next) = plan_completed(&old, known)
            {
                check_move(Some(&old), &next)?;
                prop_assert_eq!(next.not_before, None);
                store.insert(name.clone(), next);
            }
            tracked.remove(&name);
        }
        Ok(())
    }

    fn check_move(
        old: Option<&ScheduledEventSpec>,
        next: &ScheduledEventSpec,
    ) -> Result<(), TestCaseError> {
        let Some(old) = old else {
            prop_assert_eq!(next.appearance, 1);
            return Ok(());
        };
        prop_assert!(next.appearance >= old.appearance, "appearance went down");
        if next.appearance == old.appearance {
            prop_assert!(
                EventStatus::from(next.event_status.as_str()).rank()
                    >= EventStatus::from(old.event_status.as_str()).rank(),
                "status moved back within an appearance: {} -> {}",
                old.event_status,
                next.event_status
            );
        } else {
            prop_assert_eq!(next.appearance, old.appearance + 1);
            prop_assert_eq!(old.event_status.as_str(), "Completed");
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// Up to three agents, three events; each step one agent sees a
        /// document (each event absent, Scheduled or Started).
        #[test]
        fn status_never_moves_back_within_an_appearance_and_listed_events_are_mirrored(
            steps in proptest::collection::vec((0usize..3, proptest::collection::vec(0u8..3, 3)), 1..40)
        ) {
            let mut store = HashMap::new();
            let mut agents: Vec<HashMap<String, Tracked>> = vec![HashMap::new(); 3];
            for (i, (agent, statuses)) in steps.iter().enumerate() {
                let doc = Document {
                    incarnation: i as i64,
                    events: statuses.iter().enumerate().filter_map(|(id, s)| event(id, *s)).collect(),
                    rejected: Vec::new(),
                };
                mirror(&mut store, &mut agents[*agent], &doc)?;
                for ev in &doc.events {
                    prop_assert!(store.contains_key(&object_name(&ev.event_id)), "not mirrored");
                }
            }
        }

        /// With one agent the store is exactly its document: every listed
        /// event shows IMDS's status unless IMDS moved back within a listing.
        #[test]
        fn a_single_agent_mirrors_forward_moves_exactly(
            steps in proptest::collection::vec(proptest::collection::vec(0u8..3, 2), 1..30)
        ) {
            let mut store = HashMap::new();
            let mut tracked = HashMap::new();
            // The highest status seen in the current listing of each event.
            let mut peak: Vec<u8> = vec![0, 0];
            for (i, statuses) in steps.iter().enumerate() {
                let doc = Document {
                    incarnation: i as i64,
                    events: statuses.iter().enumerate().filter_map(|(id, s)| event(id, *s)).collect(),
                    rejected: Vec::new(),
                };
                mirror(&mut store, &mut tracked, &doc)?;
                for (id, s) in statuses.iter().enumerate() {
                    peak[id] = if *s == 0 { 0 } else { peak[id].max(*s) };
                    let name = object_name(&format!("id-{id}"));
                    let want = match peak[id] {
                        0 => "Completed",
                        1 => "Scheduled",
                        _ => "Started",
                    };
                    match store.get(&name) {
                        Some(spec) => prop_assert_eq!(spec.event_status.as_str(), want),
                        None => prop_assert_eq!(*s, 0, "listed event not mirrored"),
                    }
                }
            }
        }
    }
}
