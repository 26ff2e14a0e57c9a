//! The Scheduled Events document as IMDS serves it, and its parsed form.
//!
//! The wire shape follows `GET /metadata/scheduledevents?api-version=2020-07-01`
//! (Azure docs, "Azure Metadata Service: Scheduled Events for Linux VMs").
//! Parsing is lenient where Azure is loose (two `NotBefore` formats, unknown
//! event types and statuses are kept) and strict where a wrong guess would be
//! dangerous (a document that is not JSON, or lacks `DocumentIncarnation`, is
//! an error and the caller keeps its last good state).

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The JSON document exactly as IMDS sends it (`PascalCase` keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RawDocument {
    /// Per-VM counter that increases whenever anything in `Events` changes.
    pub document_incarnation: i64,
    /// The events currently announced to this VM.
    #[serde(default)]
    pub events: Vec<RawEvent>,
}

/// One entry of `Events` as IMDS sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RawEvent {
    /// GUID; the same event is delivered to every VM of the placement group.
    pub event_id: String,
    /// `Scheduled` or `Started`.
    pub event_status: String,
    /// `Freeze`, `Reboot`, `Redeploy`, `Preempt`, `Terminate`, or a newer value.
    pub event_type: String,
    /// `VirtualMachine`.
    #[serde(default)]
    pub resource_type: String,
    /// VM names (`compute.name`) the event affects.
    #[serde(default)]
    pub resources: Vec<String>,
    /// RFC 1123 time in GMT; the empty string once the event has started.
    #[serde(default)]
    pub not_before: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// `Platform` or `User`.
    #[serde(default)]
    pub event_source: String,
    /// Expected interruption in seconds; `0` none, `-1` unknown.
    #[serde(default = "unknown_duration")]
    pub duration_in_seconds: i64,
}

fn unknown_duration() -> i64 {
    -1
}

/// An `EventType`. Unknown values are kept verbatim and treated as impactful.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EventType {
    /// The VM is paused for a few seconds; memory and open files are kept.
    Freeze,
    /// The VM restarts; non-persistent memory is lost.
    Reboot,
    /// The VM moves to another host; the temporary disk is lost.
    Redeploy,
    /// A Spot VM is being deleted.
    Preempt,
    /// A scale-set VM is being deleted (terminate notification).
    Terminate,
    /// A value this version does not know.
    Other(String),
}

impl From<&str> for EventType {
    fn from(s: &str) -> Self {
        match s {
            s if s.eq_ignore_ascii_case("Freeze") => Self::Freeze,
            s if s.eq_ignore_ascii_case("Reboot") => Self::Reboot,
            s if s.eq_ignore_ascii_case("Redeploy") => Self::Redeploy,
            s if s.eq_ignore_ascii_case("Preempt") => Self::Preempt,
            s if s.eq_ignore_ascii_case("Terminate") => Self::Terminate,
            other => Self::Other(other.to_string()),
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Freeze => "Freeze",
            Self::Reboot => "Reboot",
            Self::Redeploy => "Redeploy",
            Self::Preempt => "Preempt",
            Self::Terminate => "Terminate",
            Self::Other(s) => s,
        })
    }
}

/// An `EventStatus`, plus `Completed`, which IMDS never sends: forewarn uses it
/// for an event that has left the document (finished or cancelled).
///
/// Ordered: a status only ever moves forward, `Scheduled < Started < Completed`.
/// An unknown value sorts with `Scheduled`, so it never moves a known one back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventStatus {
    /// Announced; `NotBefore` says when it may start.
    Scheduled,
    /// Under way (approved, `NotBefore` passed, or a hardware failure).
    Started,
    /// No longer listed by IMDS.
    Completed,
    /// A value this version does not know, kept verbatim.
    Other(String),
}

impl EventStatus {
    /// Position in the forward-only lifecycle.
    pub fn rank(&self) -> u8 {
        match self {
            Self::Scheduled | Self::Other(_) => 0,
            Self::Started => 1,
            Self::Completed => 2,
        }
    }

    /// The later of two statuses: what a mirror may move to without going back.
    pub fn forward_to(self, seen: EventStatus) -> EventStatus {
        if seen.rank() > self.rank() {
            seen
        } else {
            self
        }
    }
}

impl From<&str> for EventStatus {
    fn from(s: &str) -> Self {
        match s {
            s if s.eq_ignore_ascii_case("Scheduled") => Self::Scheduled,
            s if s.eq_ignore_ascii_case("Started") => Self::Started,
            s if s.eq_ignore_ascii_case("Completed") => Self::Completed,
            other => Self::Other(other.to_string()),
        }
    }
}

impl fmt::Display for EventStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Scheduled => "Scheduled",
            Self::Started => "Started",
            Self::Completed => "Completed",
            Self::Other(s) => s,
        })
    }
}

/// A parsed event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The `EventId` in its original spelling; compare ignoring case.
    pub event_id: String,
    /// What will happen.
    pub event_type: EventType,
    /// Where the event is in its lifecycle.
    pub event_status: EventStatus,
    /// `Platform` or `User` (kept verbatim).
    pub event_source: String,
    /// `VirtualMachine` (kept verbatim).
    pub resource_type: String,
    /// VM names affected.
    pub resources: Vec<String>,
    /// Earliest start; `None` when IMDS sent an empty string (already started)
    /// or a time in neither accepted format (see `not_before_unparsed`).
    pub not_before: Option<DateTime<Utc>>,
    /// The `NotBefore` text when it is in neither accepted format; the caller
    /// decides how often to say so (the parser never logs).
    pub not_before_unparsed: Option<String>,
    /// Expected interruption in seconds; `-1` unknown.
    pub duration_seconds: i64,
    /// Free text.
    pub description: String,
}

impl Event {
    /// The Kubernetes object name for this event; see [`object_name`].
    pub fn object_name(&self) -> String {
        object_name(&self.event_id)
    }

    /// Whether `vm` is listed in `Resources` (compared ignoring case).
    pub fn names_vm(&self, vm: &str) -> bool {
        self.resources.iter().any(|r| r.eq_ignore_ascii_case(vm))
    }
}

/// Whether `id` is a GUID in the 8-4-4-4-12 hexadecimal form IMDS uses for
/// `EventId` (either case).
pub fn is_guid(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The Kubernetes object name of the `ScheduledEvent` for `event_id`.
///
/// A GUID (what Azure sends) becomes its lower-case spelling, so
/// `kubectl get sev <id>` works. Anything else (another IMDS implementation,
/// an id with characters or a length a Kubernetes name cannot hold) becomes
/// `sev-` and the first 20 hex digits of the SHA-256 of the exact id: always
/// a valid DNS-1123 subdomain, stable across agents and versions, and the
/// original id stays in `spec.eventId`.
pub fn object_name(event_id: &str) -> String {
    if is_guid(event_id) {
        return event_id.to_ascii_lowercase();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, event_id.as_bytes());
    let hex: String = digest.as_ref()[..10]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sev-{hex}")
}

/// A parsed document.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// `DocumentIncarnation`: per VM, never to correlate across VMs.
    pub incarnation: i64,
    /// The events that parsed, in the order IMDS listed them.
    pub events: Vec<Event>,
    /// Entries of `Events` that did not parse; the others are still usable.
    pub rejected: Vec<RejectedEvent>,
}

/// An entry of `Events` that is not an event of the documented shape.
#[derive(Debug, Clone, PartialEq)]
pub struct RejectedEvent {
    /// Position in `Events`, from 0.
    pub index: usize,
    /// Its `EventId` when that much could be read (so the event is not taken
    /// as gone from the document).
    pub event_id: Option<String>,
    /// The entry as IMDS sent it (compact JSON).
    pub bytes: String,
    /// Why it was rejected.
    pub reason: String,
}

/// Why a document could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not JSON, or missing a required field such as `DocumentIncarnation`.
    #[error("failed to parse scheduled events document: {source}")]
    Json {
        /// The decoder's complaint, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// `Events` is missing or `null`. IMDS always sends the list (empty
    /// when nothing is announced); a document without it says nothing about
    /// the events, and taking it as "no events" would end every event.
    #[error("failed to parse scheduled events document: `Events` is missing or null")]
    NoEvents,
}

/// The document with its events still unparsed, so one bad entry costs
/// only itself.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct LenientDocument {
    document_incarnation: i64,
    #[serde(default)]
    events: Option<Vec<serde_json::Value>>,
}

/// Parses a Scheduled Events document.
///
/// `NotBefore` is accepted as RFC 1123 (`Mon, 11 Apr 2022 22:26:58 GMT`, what
/// real IMDS sends) or RFC 3339 (what some fakes send); the empty string means
/// the event has started. Any other value is kept in
/// [`Event::not_before_unparsed`] with `not_before: None`, so one odd field
/// never costs the whole event. An entry of `Events` that is not an event
/// (a wrong type, no `EventId`) goes to [`Document::rejected`] and the other
/// entries are kept.
///
/// # Errors
/// [`ParseError::Json`] when the bytes are not JSON, lack
/// `DocumentIncarnation`, or `Events` is not a list.
pub fn parse_document(bytes: &[u8]) -> Result<Document, ParseError> {
    let raw: LenientDocument =
        serde_json::from_slice(bytes).map_err(|source| ParseError::Json { source })?;
    let mut events = Vec::new();
    let mut rejected = Vec::new();
    let listed = raw.events.ok_or(ParseError::NoEvents)?;
    for (index, value) in listed.into_iter().enumerate() {
        match RawEvent::deserialize(&value) {
            Ok(ev) => events.push(Event::from(ev)),
            Err(e) => rejected.push(RejectedEvent {
                index,
                event_id: value
                    .get("EventId")
                    .and_then(|v| v.as_str())
                    .map(str::to_string),
                bytes: value.to_string(),
                reason: e.to_string(),
            }),
        }
    }
    Ok(Document {
        incarnation: raw.document_incarnation,
        events,
        rejected,
    })
}

impl From<RawDocument> for Document {
    fn from(raw: RawDocument) -> Self {
        Document {
            incarnation: raw.document_incarnation,
            events: raw.events.into_iter().map(Event::from).collect(),
            rejected: Vec::new(),
        }
    }
}

impl From<RawEvent> for Event {
    fn from(raw: RawEvent) -> Self {
        let (not_before, not_before_unparsed) = match parse_not_before(&raw.not_before) {
            Ok(t) => (t, None),
            Err(_) => (None, Some(raw.not_before.clone())),
        };
        Event {
            event_type: EventType::from(raw.event_type.as_str()),
            event_status: EventStatus::from(raw.event_status.as_str()),
            event_id: raw.event_id,
            event_source: raw.event_source,
            resource_type: raw.resource_type,
            resources: raw.resources,
            not_before,
            not_before_unparsed,
            duration_seconds: raw.duration_in_seconds,
            description: raw.description,
        }
    }
}

/// Parses a `NotBefore` value: `Ok(None)` for the empty string.
///
/// # Errors
/// The RFC 3339 parser's complaint for a value in neither RFC 1123 nor RFC 3339.
pub fn parse_not_before(s: &str) -> Result<Option<DateTime<Utc>>, chrono::ParseError> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    DateTime::parse_from_rfc2822(s)
        .or_else(|_| DateTime::parse_from_rfc3339(s))
        .map(|t| Some(t.with_timezone(&Utc)))
}

/// Formats a time as IMDS does for `NotBefore` (RFC 1123, GMT).
pub fn format_rfc1123(t: DateTime<Utc>) -> String {
    t.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

/// The part of `GET /metadata/instance/compute` the agent needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Compute {
    /// The VM name, as it appears in an event's `Resources`.
    pub name: String,
    /// Scale-set name, empty for a standalone VM.
    #[serde(default)]
    pub vm_scale_set_name: String,
    /// Platform fault domain, as a decimal string (IMDS serves every
    /// primitive as a string, a missing value as the empty string).
    #[serde(default)]
    pub platform_fault_domain: String,
    /// Platform update domain, as a decimal string.
    #[serde(default)]
    pub platform_update_domain: String,
}

/// The body of an approval: `{"StartRequests": [{"EventId": "..."}]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct StartRequests {
    /// The events to start.
    pub start_requests: Vec<StartRequest>,
}

/// One entry of [`StartRequests`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct StartRequest {
    /// The `EventId` to start.
    pub event_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{
      "DocumentIncarnation": 2,
      "Events": [{
        "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
        "EventStatus": "Scheduled",
        "EventType": "Freeze",
        "ResourceType": "VirtualMachine",
        "Resources": ["WestNO_0", "WestNO_1"],
        "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
        "Description": "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
        "EventSource": "Platform",
        "DurationInSeconds": 5
      }]
    }"#;

    #[test]
    fn documented_sample_parses_with_rfc1123_not_before() {
        let doc = parse_document(SAMPLE.as_bytes()).unwrap();
        assert_eq!(doc.incarnation, 2);
        let ev = &doc.events[0];
        assert_eq!(ev.event_type, EventType::Freeze);
        assert_eq!(ev.event_status, EventStatus::Scheduled);
        assert_eq!(ev.duration_seconds, 5);
        assert_eq!(ev.object_name(), "c7061bac-afdc-4513-b24b-aa5f13a16123");
        assert!(ev.names_vm("westno_1"));
        assert!(!ev.names_vm("WestNO_2"));
        assert_eq!(
            ev.not_before.unwrap().to_rfc3339(),
            "2022-04-11T22:26:58+00:00"
        );
    }

    #[test]
    fn rfc3339_and_empty_not_before_are_accepted() {
        assert_eq!(
            parse_not_before("2026-11-21T00:12:52Z")
                .unwrap()
                .unwrap()
                .to_rfc3339(),
            "2026-11-21T00:12:52+00:00"
        );
        assert_eq!(parse_not_before(""), Ok(None));
        assert!(parse_not_before("next tuesday").is_err());
    }

    #[test]
    fn rfc1123_round_trips() {
        let t = parse_not_before("Thu, 22 Jul 2021 04:50:17 GMT")
            .unwrap()
            .unwrap();
        assert_eq!(format_rfc1123(t), "Thu, 22 Jul 2021 04:50:17 GMT");
    }

    #[test]
    fn unknown_type_status_and_bad_not_before_are_kept_not_fatal() {
        let doc = parse_document(
            br#"{"DocumentIncarnation":7,"Events":[{"EventId":"a","EventStatus":"Paused",
            "EventType":"Hibernate","NotBefore":"soon","DurationInSeconds":-1}]}"#,
        )
        .unwrap();
        let ev = &doc.events[0];
        assert_eq!(ev.event_type, EventType::Other("Hibernate".into()));
        assert_eq!(ev.event_status, EventStatus::Other("Paused".into()));
        assert_eq!(ev.not_before, None);
        assert_eq!(ev.not_before_unparsed.as_deref(), Some("soon"));
        assert_eq!(ev.duration_seconds, -1);
        assert!(ev.resources.is_empty());
    }

    #[test]
    fn empty_events_are_an_empty_list_and_missing_or_null_events_an_error() {
        assert!(
            parse_document(br#"{"DocumentIncarnation":1,"Events":[]}"#)
                .unwrap()
                .events
                .is_empty()
        );
        for doc in [
            &br#"{"DocumentIncarnation":1}"#[..],
            br#"{"DocumentIncarnation":1,"Events":null}"#,
        ] {
            assert!(
                matches!(parse_document(doc), Err(ParseError::NoEvents)),
                "{}",
                String::from_utf8_lossy(doc)
            );
        }
    }

    #[test]
    fn garbage_and_missing_incarnation_are_errors() {
        assert!(parse_document(b"<html>oops</html>").is_err());
        assert!(parse_document(br#"{"Events":[]}"#).is_err());
        assert!(parse_document(b"").is_err());
        assert!(parse_document(br#"{"DocumentIncarnation":1,"Events":{}}"#).is_err());
    }

    #[test]
    fn one_malformed_event_is_rejected_and_the_others_kept() {
        let doc = parse_document(
            br#"{"DocumentIncarnation":3,"Events":[
            {"EventId":"A","EventStatus":"Scheduled","EventType":"Reboot"},
            {"EventId":"B","EventStatus":42,"EventType":"Reboot","Resources":"vm"},
            {"EventStatus":"Scheduled"},
            {"EventId":"D","EventStatus":"Started","EventType":"Freeze"}]}"#,
        )
        .unwrap();
        let ids: Vec<&str> = doc.events.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["A", "D"]);
        assert_eq!(doc.rejected.len(), 2);
        assert_eq!(doc.rejected[0].index, 1);
        assert_eq!(doc.rejected[0].event_id.as_deref(), Some("B"));
        assert!(
            doc.rejected[0].bytes.contains("42"),
            "{:?}",
            doc.rejected[0]
        );
        assert_eq!(doc.rejected[1].event_id, None);
    }

    #[test]
    fn guid_ids_keep_their_name_and_others_get_a_stable_valid_hash() {
        assert_eq!(
            object_name("C7061BAC-AFDC-4513-B24B-AA5F13A16123"),
            "c7061bac-afdc-4513-b24b-aa5f13a16123"
        );
        let odd = object_name("Event #1 / weird_ID");
        assert!(odd.starts_with("sev-") && odd.len() == 24, "{odd}");
        assert!(is_dns1123_subdomain(&odd));
        assert_eq!(odd, object_name("Event #1 / weird_ID"), "stable");
        assert_ne!(odd, object_name("event #1 / weird_id"), "case kept apart");
        assert!(object_name(&"a".repeat(300)).len() < 64);
        assert!(!is_guid("C7061BAC-AFDC-4513-B24B-AA5F13A1612"));
        assert!(!is_guid("G7061BAC-AFDC-4513-B24B-AA5F13A16123"));
    }

    /// What the API server accepts as a name (DNS-1123 subdomain).
    pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn status_only_moves_forward() {
        use EventStatus::*;
        assert_eq!(Scheduled.forward_to(Started), Started);
        assert_eq!(Started.forward_to(Scheduled), Started);
        assert_eq!(Completed.forward_to(Started), Completed);
        assert_eq!(Started.forward_to(Other("X".into())), Started);
    }

    #[test]
    fn start_requests_serialize_as_azure_expects() {
        let body = StartRequests {
            start_requests: vec![StartRequest {
                event_id: "ABC".into(),
            }],
        };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"StartRequests":[{"EventId":"ABC"}]}"#
        );
    }
}

#[cfg(test)]
mod props {
    //! The parser against generated documents: it never panics, and a valid
    //! document round-trips.
    use super::*;
    use proptest::prelude::*;

    fn raw_event() -> impl Strategy<Value = RawEvent> {
        (
            "[A-Za-z0-9-]{1,40}",
            prop_oneof!["Scheduled", "Started", "[A-Za-z]{0,10}"],
            prop_oneof![
                "Freeze",
                "Reboot",
                "Redeploy",
                "Preempt",
                "Terminate",
                "[A-Za-z]{0,10}"
            ],
            proptest::collection::vec("[A-Za-z0-9_]{1,20}", 0..4),
            prop_oneof![
                Just(String::new()),
                (0i64..4_000_000_000).prop_map(|s| format_rfc1123(
                    DateTime::from_timestamp(s, 0).unwrap_or_default()
                )),
                ".{0,20}",
            ],
            ".{0,40}",
            -1i64..100_000,
        )
            .prop_map(
                |(id, status, type_, resources, nb, description, duration)| RawEvent {
                    event_id: id,
                    event_status: status,
                    event_type: type_,
                    resource_type: "VirtualMachine".into(),
                    resources,
                    not_before: nb,
                    description,
                    event_source: "Platform".into(),
                    duration_in_seconds: duration,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_document(&bytes);
        }

        #[test]
        fn arbitrary_json_never_panics(
            incarnation in any::<i64>(),
            events in proptest::collection::vec(
                prop_oneof![
                    Just(serde_json::json!(null)),
                    any::<i64>().prop_map(|n| serde_json::json!(n)),
                    ".{0,10}".prop_map(|s| serde_json::json!({"EventId": s, "EventStatus": 1})),
                    ".{0,10}".prop_map(|s| serde_json::json!({"EventId": s, "EventStatus": "Scheduled", "EventType": s})),
                ],
                0..5,
            )
        ) {
            let doc = serde_json::json!({"DocumentIncarnation": incarnation, "Events": events});
            let parsed = parse_document(doc.to_string().as_bytes()).unwrap();
            prop_assert_eq!(parsed.events.len() + parsed.rejected.len(), events.len());
        }

        #[test]
        fn valid_documents_round_trip(
            incarnation in any::<i64>(),
            events in proptest::collection::vec(raw_event(), 0..5),
        ) {
            let raw = RawDocument { document_incarnation: incarnation, events };
            let bytes = serde_json::to_vec(&raw).unwrap();
            let parsed = parse_document(&bytes).unwrap();
            prop_assert!(parsed.rejected.is_empty());
            prop_assert_eq!(parsed.incarnation, incarnation);
            prop_assert_eq!(parsed.events.len(), raw.events.len());
            for (p, r) in parsed.events.iter().zip(&raw.events) {
                prop_assert_eq!(&p.event_id, &r.event_id);
                prop_assert!(p.event_status.to_string().eq_ignore_ascii_case(&r.event_status));
                prop_assert!(p.event_type.to_string().eq_ignore_ascii_case(&r.event_type));
                prop_assert_eq!(&p.resources, &r.resources);
                prop_assert_eq!(&p.description, &r.description);
                prop_assert_eq!(p.duration_seconds, r.duration_in_seconds);
                match &p.not_before {
                    Some(t) => prop_assert_eq!(parse_not_before(&r.not_before).ok().flatten(), Some(*t)),
                    None => prop_assert!(r.not_before.trim().is_empty() || p.not_before_unparsed.as_deref() == Some(r.not_before.as_str())),
                }
                let name = p.object_name();
                prop_assert!(tests::is_dns1123_subdomain(&name), "{}", name);
            }
        }
    }
}
