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
    /// or a time in neither accepted format (logged by [`parse_document`]).
    pub not_before: Option<DateTime<Utc>>,
    /// Expected interruption in seconds; `-1` unknown.
    pub duration_seconds: i64,
    /// Free text.
    pub description: String,
}

impl Event {
    /// The Kubernetes object name for this event: the `EventId` in lower case.
    pub fn object_name(&self) -> String {
        self.event_id.to_ascii_lowercase()
    }

    /// Whether `vm` is listed in `Resources` (compared ignoring case).
    pub fn names_vm(&self, vm: &str) -> bool {
        self.resources.iter().any(|r| r.eq_ignore_ascii_case(vm))
    }
}

/// A parsed document.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// `DocumentIncarnation`: per VM, never to correlate across VMs.
    pub incarnation: i64,
    /// The events, in the order IMDS listed them.
    pub events: Vec<Event>,
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
}

/// Parses a Scheduled Events document.
///
/// `NotBefore` is accepted as RFC 1123 (`Mon, 11 Apr 2022 22:26:58 GMT`, what
/// real IMDS sends) or RFC 3339 (what some fakes send); the empty string means
/// the event has started. Any other value is logged and kept as `None`, so
/// one odd field never costs the whole event.
///
/// # Errors
/// [`ParseError::Json`] when the bytes are not a document of this shape.
pub fn parse_document(bytes: &[u8]) -> Result<Document, ParseError> {
    let raw: RawDocument =
        serde_json::from_slice(bytes).map_err(|source| ParseError::Json { source })?;
    Ok(Document::from(raw))
}

impl From<RawDocument> for Document {
    fn from(raw: RawDocument) -> Self {
        Document {
            incarnation: raw.document_incarnation,
            events: raw.events.into_iter().map(Event::from).collect(),
        }
    }
}

impl From<RawEvent> for Event {
    fn from(raw: RawEvent) -> Self {
        let not_before = match parse_not_before(&raw.not_before) {
            Ok(t) => t,
            Err(_) => {
                tracing::warn!(event = %raw.event_id, not_before = %raw.not_before, "Ignoring NotBefore in an unknown format");
                None
            }
        };
        Event {
            event_type: EventType::from(raw.event_type.as_str()),
            event_status: EventStatus::from(raw.event_status.as_str()),
            event_id: raw.event_id,
            event_source: raw.event_source,
            resource_type: raw.resource_type,
            resources: raw.resources,
            not_before,
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
    /// Platform fault domain, as a decimal string.
    #[serde(default)]
    pub platform_fault_domain: String,
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
        assert_eq!(ev.duration_seconds, -1);
        assert!(ev.resources.is_empty());
    }

    #[test]
    fn empty_events_and_missing_events_are_an_empty_list() {
        assert!(
            parse_document(br#"{"DocumentIncarnation":1,"Events":[]}"#)
                .unwrap()
                .events
                .is_empty()
        );
        assert!(
            parse_document(br#"{"DocumentIncarnation":1}"#)
                .unwrap()
                .events
                .is_empty()
        );
    }

    #[test]
    fn garbage_and_missing_incarnation_are_errors() {
        assert!(parse_document(b"<html>oops</html>").is_err());
        assert!(parse_document(br#"{"Events":[]}"#).is_err());
        assert!(parse_document(b"").is_err());
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
