//! Scenario files for `forewarn imds-mock`: a timeline of Azure events that
//! the mock plays, and the pure function that says what IMDS shows each VM at
//! a given moment.
//!
//! # Format (YAML)
//!
//! ```yaml
//! description: A platform Redeploy of one VM.   # free text, printed by the demo
//! vms:                     # the VMs of one placement group, all served at once
//!   - name: aks-pool-vmss_0     # compute.name; served at /vm/<name>/metadata/...
//!     node: node-000000         # optional: which Kubernetes node plays it (demo/tests)
//!     faultDomain: 0            # optional: compute.platformFaultDomain (default 0)
//!     updateDomain: 0           # optional: compute.platformUpdateDomain (default 0)
//!     firstRequestDelay: 90s    # optional: the VM's first scheduled events GET is answered this late
//!                               #   (the first call enables the service: up to two minutes on Azure)
//!     redeployAt: 20s           # optional: the VM is redeployed then; its DocumentIncarnation starts again at 1
//! events:
//!   - id: 6B7E9A52-5A2C-4B39-9E37-0E1B3AF5D001   # EventId
//!     type: Redeploy            # EventType, any string (unknown types are allowed)
//!     source: Platform          # EventSource (default Platform)
//!     resources: [aks-pool-vmss_1]
//!     durationSeconds: 10       # DurationInSeconds (default -1)
//!     description: ...
//!     at: 2s                    # appears this long after the scenario starts
//!     notice: 60s               # NotBefore = appearance + notice (default 15m)
//!     status: Scheduled         # first status: Scheduled (default) or Started (no notice)
//!     runFor: 5s                # once Started, it leaves the document after this long
//!     cancelAt: 10s             # optional: leaves the document at this time if still Scheduled
//!     notBeforeFormat: rfc1123  # rfc1123 (default, like Azure), rfc3339 (like some fakes) or invalid
//!     deliverTo: all            # all (default: every VM of the group) or resources (only the VMs named)
//!     approvalStartsAfter: 0s   # delay from approval to start (the platform may wait for other tenants)
//!     gone:                     # optional: IMDS flaps: the event is not listed in these windows, then
//!       - {at: 10s, for: 3s}    #   comes back with the same EventId (its timeline is not paused);
//!       - {at: 20s, for: 60s, vms: [aks-pool-vmss_1]}  # only these VMs' documents leave it out
//!     malformed: false          # true: listed with EventStatus a number and Resources a string (the
//!                               #   EventId kept), an entry a strict parser rejects
//!     expect:                   # optional, read by the demo and the tests, ignored by the mock
//!       phase: Completed        # the ScheduledEvent's final status.phase
//!       approved: true          # an approval must reach IMDS (false: must not; absent: either)
//!       approvedBy: [aks-pool-vmss_1]  # optional: the only VMs whose IMDS may receive it
//!       drained: true           # the named VMs' nodes must be cordoned and emptied (false: left alone; absent: either)
//! faults:                  # optional: IMDS misbehaving for a while
//!   - at: 3s
//!     for: 2s
//!     kind: status500           # status500 | status429 | garbage | nullEvents | hang | slow
//!     delay: 10s                # slow only: the right answer after this long (default 10s)
//!     vms: [aks-pool-vmss_0]    # optional, default all VMs
//! ```
//!
//! Lifecycle, as the platform behaves (see the Azure facts page): a
//! `Scheduled` event moves to `Started` when any VM approves it or when
//! `NotBefore` passes, keeping its `EventId`; it leaves the document `runFor`
//! after it started, or at `cancelAt` if it never started.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::model::{RawEvent, format_rfc1123};

/// A whole scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    /// Free text shown by the demo.
    #[serde(default)]
    pub description: String,
    /// The VMs of the placement group.
    pub vms: Vec<Vm>,
    /// The events the platform announces.
    #[serde(default)]
    pub events: Vec<ScenarioEvent>,
    /// Periods in which IMDS misbehaves.
    #[serde(default)]
    pub faults: Vec<Fault>,
}

/// One VM of the placement group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Vm {
    /// `compute.name`, as it appears in `Resources`.
    pub name: String,
    /// The Kubernetes node that plays this VM in the demo and tests.
    #[serde(default)]
    pub node: Option<String>,
    /// `compute.platformFaultDomain`.
    #[serde(default)]
    pub fault_domain: u32,
    /// `compute.platformUpdateDomain`.
    #[serde(default)]
    pub update_domain: u32,
    /// How late the VM's first scheduled events `GET` is answered.
    #[serde(with = "humantime_serde", default)]
    pub first_request_delay: Option<Duration>,
    /// When the VM is redeployed (its `DocumentIncarnation` starts again at 1).
    #[serde(with = "humantime_serde", default)]
    pub redeploy_at: Option<Duration>,
    /// How late each approval (`POST`) is answered; the approval itself
    /// takes effect (and is logged) when it arrives.
    #[serde(with = "humantime_serde", default)]
    pub approval_answer_delay: Option<Duration>,
}

/// A window in which an event is not listed (an IMDS flap).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Window {
    /// Start, from the scenario's start.
    #[serde(with = "humantime_serde")]
    pub at: Duration,
    /// Length.
    #[serde(rename = "for", with = "humantime_serde")]
    pub duration: Duration,
    /// The VMs whose documents do not list it then (empty: every VM's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vms: Vec<String>,
}

impl Window {
    /// Whether `elapsed` falls in the window.
    pub fn contains(&self, elapsed: Duration) -> bool {
        elapsed >= self.at && elapsed < self.at + self.duration
    }
}

/// Which VMs see an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DeliverTo {
    /// Every VM of the group (availability set or placement group).
    #[default]
    All,
    /// Only the VMs in `Resources` (GPU scale sets with one fault domain).
    Resources,
}

/// How `NotBefore` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeFormat {
    /// `Mon, 11 Apr 2022 22:26:58 GMT`, as real IMDS sends.
    #[default]
    Rfc1123,
    /// `2022-04-11T22:26:58Z`, as some fakes send.
    Rfc3339,
    /// `next tuesday`: in no format a parser accepts.
    Invalid,
}

/// First status of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum InitialStatus {
    /// With notice.
    #[default]
    Scheduled,
    /// Without notice (hardware failure).
    Started,
}

/// One event of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioEvent {
    /// `EventId`.
    pub id: String,
    /// `EventType`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// `EventSource`.
    #[serde(default = "platform")]
    pub source: String,
    /// `Resources`.
    pub resources: Vec<String>,
    /// `DurationInSeconds`.
    #[serde(default = "minus_one")]
    pub duration_seconds: i64,
    /// `Description`.
    #[serde(default)]
    pub description: String,
    /// Appearance, from the scenario's start.
    #[serde(with = "humantime_serde", default)]
    pub at: Duration,
    /// `NotBefore` minus appearance.
    #[serde(with = "humantime_serde", default = "fifteen_minutes")]
    pub notice: Duration,
    /// First status.
    #[serde(default)]
    pub status: InitialStatus,
    /// Time from start to removal.
    #[serde(with = "humantime_serde", default = "ten_seconds")]
    pub run_for: Duration,
    /// Removal while still `Scheduled` (a cancelled maintenance).
    #[serde(with = "humantime_serde", default)]
    pub cancel_at: Option<Duration>,
    /// How `NotBefore` is written.
    #[serde(default)]
    pub not_before_format: TimeFormat,
    /// Which VMs see the event.
    #[serde(default)]
    pub deliver_to: DeliverTo,
    /// Delay from the first approval to the start.
    #[serde(with = "humantime_serde", default)]
    pub approval_starts_after: Duration,
    /// Windows in which the event is not listed (IMDS flaps).
    #[serde(default)]
    pub gone: Vec<Window>,
    /// Whether the entry is listed in a shape a strict parser rejects.
    #[serde(default)]
    pub malformed: bool,
    /// What forewarn must do about the event (for the demo and tests).
    #[serde(default)]
    pub expect: Option<Expect>,
}

/// What forewarn must do about an event; checked by the demo and the tests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Expect {
    /// The `ScheduledEvent`'s final `status.phase`.
    pub phase: String,
    /// Whether an approval must reach IMDS (`false`: must not; absent: either).
    #[serde(default)]
    pub approved: Option<bool>,
    /// The only VMs whose IMDS may receive the approval (empty: any).
    #[serde(default)]
    pub approved_by: Vec<String>,
    /// Whether the named VMs' nodes must be cordoned and drained (`false`:
    /// left alone; absent: the test checks for itself, e.g. a drain that a
    /// PodDisruptionBudget blocks).
    #[serde(default)]
    pub drained: Option<bool>,
}

fn platform() -> String {
    "Platform".into()
}
fn minus_one() -> i64 {
    -1
}
fn fifteen_minutes() -> Duration {
    Duration::from_secs(15 * 60)
}
fn ten_seconds() -> Duration {
    Duration::from_secs(10)
}

/// How IMDS misbehaves during a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FaultKind {
    /// 500 Internal Server Error.
    Status500,
    /// 429 Too Many Requests.
    Status429,
    /// 200 with a body that is not JSON.
    Garbage,
    /// 200 with a document whose `Events` is `null`.
    NullEvents,
    /// No answer for 30 s.
    Hang,
    /// The right answer, after the fault's `delay`.
    Slow,
}

/// A period of misbehaviour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fault {
    /// Start, from the scenario's start.
    #[serde(with = "humantime_serde")]
    pub at: Duration,
    /// Length.
    #[serde(rename = "for", with = "humantime_serde")]
    pub duration: Duration,
    /// What IMDS does.
    pub kind: FaultKind,
    /// How long a `slow` answer takes (default 10 s).
    #[serde(default = "ten_seconds", with = "humantime_serde")]
    pub delay: Duration,
    /// The VMs affected; empty means all.
    #[serde(default)]
    pub vms: Vec<String>,
}

/// A scenario that cannot be played.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("failed to read scenario {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML does not match the format.
    #[error("failed to parse scenario {path}: {source}")]
    Parse {
        /// The path given.
        path: String,
        /// The YAML error, with line and column.
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// The YAML parses but makes no sense.
    #[error("invalid scenario {path}: {reason}")]
    Invalid {
        /// The path given.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

impl Scenario {
    /// Reads and validates a scenario file.
    ///
    /// # Errors
    /// [`Error::Read`], [`Error::Parse`] or [`Error::Invalid`] (no VMs, a
    /// duplicate VM or `EventId`, an event naming no resource).
    pub fn load(path: &str) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            Error::Parse { source, .. } => Error::Parse {
                path: path.into(),
                source,
            },
            Error::Invalid { reason, .. } => Error::Invalid {
                path: path.into(),
                reason,
            },
            other => other,
        })
    }

    /// Parses and validates scenario YAML.
    ///
    /// # Errors
    /// As [`Scenario::load`], with an empty path.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let s: Scenario = serde_saphyr::from_str(text).map_err(|source| Error::Parse {
            path: String::new(),
            source: Box::new(source),
        })?;
        let invalid = |reason: String| Error::Invalid {
            path: String::new(),
            reason,
        };
        if s.vms.is_empty() {
            return Err(invalid("a scenario needs at least one VM".into()));
        }
        let mut names: Vec<String> = s.vms.iter().map(|v| v.name.to_ascii_lowercase()).collect();
        names.sort();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("VM names must be unique".into()));
        }
        let mut ids: Vec<String> = s.events.iter().map(|e| e.id.to_ascii_lowercase()).collect();
        ids.sort();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("event ids must be unique".into()));
        }
        if let Some(e) = s.events.iter().find(|e| e.resources.is_empty()) {
            return Err(invalid(format!("event {} names no resources", e.id)));
        }
        Ok(s)
    }

    /// The VM named `name` (ignoring case).
    pub fn vm(&self, name: &str) -> Option<&Vm> {
        self.vms.iter().find(|v| v.name.eq_ignore_ascii_case(name))
    }

    /// The fault in force for `vm` at `elapsed`, if any.
    pub fn fault_at(&self, vm: &str, elapsed: Duration) -> Option<&Fault> {
        self.faults.iter().find(|f| {
            elapsed >= f.at
                && elapsed < f.at + f.duration
                && (f.vms.is_empty() || f.vms.iter().any(|v| v.eq_ignore_ascii_case(vm)))
        })
    }
}

/// Where one event is at a moment, given when (if ever) it was approved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not yet announced.
    NotYet,
    /// Announced, waiting for approval or `NotBefore`.
    Scheduled,
    /// Under way.
    Started,
    /// Left the document after starting.
    Finished,
    /// Left the document without starting.
    Cancelled,
    /// Scheduled or started, but not listed for a while (an IMDS flap).
    Gone,
}

impl Phase {
    /// Whether IMDS lists an event in this phase.
    pub fn is_listed(self) -> bool {
        matches!(self, Phase::Scheduled | Phase::Started)
    }
}

impl ScenarioEvent {
    /// `NotBefore`, as an offset from the scenario's start (only for `Scheduled` events).
    pub fn not_before_offset(&self) -> Option<Duration> {
        match self.status {
            InitialStatus::Scheduled => Some(self.at + self.notice),
            InitialStatus::Started => None,
        }
    }

    /// When the event started, as an offset from the start, given the offset
    /// of the first approval; `None` if it has not started by `elapsed`.
    pub fn started_offset(
        &self,
        elapsed: Duration,
        approved: Option<Duration>,
    ) -> Option<Duration> {
        let start = match self.status {
            InitialStatus::Started => self.at,
            InitialStatus::Scheduled => {
                let nb = self.at + self.notice;
                match approved {
                    Some(a) => (a.max(self.at) + self.approval_starts_after).min(nb),
                    None => nb,
                }
            }
        };
        if let Some(cancel) = self.cancel_at
            && cancel <= start
        {
            return None;
        }
        (elapsed >= start).then_some(start)
    }

    /// Whether `vm`'s document leaves the event out at `elapsed` (a window
    /// of [`Self::gone`] that names it).
    pub fn gone_for(&self, vm: &str, elapsed: Duration) -> bool {
        self.gone
            .iter()
            .any(|w| w.contains(elapsed) && w.vms.iter().any(|v| v.eq_ignore_ascii_case(vm)))
    }

    /// The event's phase at `elapsed`, given the offset of its first approval.
    pub fn phase_at(&self, elapsed: Duration, approved: Option<Duration>) -> Phase {
        match self.lifecycle_at(elapsed, approved) {
            Phase::Scheduled | Phase::Started
                if self
                    .gone
                    .iter()
                    .any(|w| w.vms.is_empty() && w.contains(elapsed)) =>
            {
                Phase::Gone
            }
            phase => phase,
        }
    }

    /// The phase at `elapsed` ignoring flaps.
    fn lifecycle_at(&self, elapsed: Duration, approved: Option<Duration>) -> Phase {
        if elapsed < self.at {
            return Phase::NotYet;
        }
        match self.started_offset(elapsed, approved) {
            Some(start) if elapsed >= start + self.run_for => Phase::Finished,
            Some(_) => Phase::Started,
            None => match self.cancel_at {
                Some(c) if elapsed >= c => Phase::Cancelled,
                _ => Phase::Scheduled,
            },
        }
    }

    /// Whether the VM named `vm` is told about this event.
    pub fn delivered_to(&self, vm: &str) -> bool {
        match self.deliver_to {
            DeliverTo::All => true,
            DeliverTo::Resources => self.resources.iter().any(|r| r.eq_ignore_ascii_case(vm)),
        }
    }

    /// The entry IMDS lists for this event in `phase` as JSON (broken on
    /// purpose when `malformed`), or `None` when it is not listed.
    pub fn render_json(&self, phase: Phase, origin: DateTime<Utc>) -> Option<serde_json::Value> {
        let raw = self.render(phase, origin)?;
        let mut v = serde_json::to_value(raw).ok()?;
        if self.malformed {
            v["EventStatus"] = serde_json::json!(42);
            v["Resources"] = serde_json::json!(self.resources.join(","));
        }
        Some(v)
    }

    /// The entry IMDS lists for this event in `phase`, or `None` when it is not listed.
    pub fn render(&self, phase: Phase, origin: DateTime<Utc>) -> Option<RawEvent> {
        let status = match phase {
            Phase::Scheduled => "Scheduled",
            Phase::Started => "Started",
            Phase::NotYet | Phase::Finished | Phase::Cancelled | Phase::Gone => return None,
        };
        let not_before = match (phase, self.not_before_offset()) {
            (Phase::Scheduled, Some(nb)) => {
                let t = origin
                    + chrono::Duration::from_std(nb).unwrap_or_else(|_| chrono::Duration::zero());
                // IMDS has one-second resolution.
                let t = DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t);
                match self.not_before_format {
                    TimeFormat::Rfc1123 => format_rfc1123(t),
                    TimeFormat::Rfc3339 => t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    TimeFormat::Invalid => "next tuesday".into(),
                }
            }
            // The empty string once the event has started.
            _ => String::new(),
        };
        Some(RawEvent {
            event_id: self.id.clone(),
            event_status: status.into(),
            event_type: self.event_type.clone(),
            resource_type: "VirtualMachine".into(),
            resources: self.resources.clone(),
            not_before,
            description: self.description.clone(),
            event_source: self.source.clone(),
            duration_in_seconds: self.duration_seconds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    const YAML: &str = r#"
vms:
  - name: vmss_0
  - name: vmss_1
events:
  - id: AAAA
    type: Redeploy
    resources: [vmss_1]
    at: 2s
    notice: 60s
    runFor: 5s
  - id: BBBB
    type: Reboot
    resources: [vmss_0]
    at: 1s
    notice: 30s
    cancelAt: 10s
    deliverTo: resources
  - id: CCCC
    type: Reboot
    status: Started
    resources: [vmss_0]
    at: 3s
    runFor: 4s
faults:
  - at: 5s
    for: 2s
    kind: garbage
    vms: [vmss_1]
"#;

    #[test]
    fn scheduled_event_starts_at_not_before_without_approval() {
        let s = Scenario::parse(YAML).unwrap();
        let e = &s.events[0];
        assert_eq!(e.phase_at(secs(1), None), Phase::NotYet);
        assert_eq!(e.phase_at(secs(2), None), Phase::Scheduled);
        assert_eq!(e.phase_at(secs(61), None), Phase::Scheduled);
        assert_eq!(e.phase_at(secs(62), None), Phase::Started);
        assert_eq!(e.phase_at(secs(67), None), Phase::Finished);
    }

    #[test]
    fn approval_starts_a_scheduled_event_early() {
        let s = Scenario::parse(YAML).unwrap();
        let e = &s.events[0];
        assert_eq!(e.phase_at(secs(9), Some(secs(8))), Phase::Started);
        assert_eq!(e.phase_at(secs(13), Some(secs(8))), Phase::Finished);
    }

    #[test]
    fn cancelled_event_leaves_without_starting() {
        let s = Scenario::parse(YAML).unwrap();
        let e = &s.events[1];
        assert_eq!(e.phase_at(secs(9), None), Phase::Scheduled);
        assert_eq!(e.phase_at(secs(10), None), Phase::Cancelled);
        assert!(e.delivered_to("VMSS_0"));
        assert!(!e.delivered_to("vmss_1"));
    }

    #[test]
    fn hardware_failure_appears_started_with_empty_not_before() {
        let s = Scenario::parse(YAML).unwrap();
        let e = &s.events[2];
        assert_eq!(e.phase_at(secs(3), None), Phase::Started);
        assert_eq!(e.phase_at(secs(7), None), Phase::Finished);
        let raw = e.render(Phase::Started, Utc::now()).unwrap();
        assert_eq!(raw.event_status, "Started");
        assert_eq!(raw.not_before, "");
    }

    #[test]
    fn scheduled_render_has_rfc1123_not_before() {
        let s = Scenario::parse(YAML).unwrap();
        let origin = DateTime::parse_from_rfc3339("2026-11-21T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let raw = s.events[0].render(Phase::Scheduled, origin).unwrap();
        assert_eq!(raw.not_before, "Sat, 21 Nov 2026 00:01:02 GMT");
        assert!(s.events[0].render(Phase::Finished, origin).is_none());
    }

    #[test]
    fn a_flapping_event_is_unlisted_in_its_windows_and_keeps_its_timeline() {
        let s = Scenario::parse(
            "vms: [{name: a, firstRequestDelay: 90s, redeployAt: 20s}]\nevents:\n  - {id: F, type: Reboot, resources: [a], at: 1s, notice: 60s, gone: [{at: 5s, for: 3s}], malformed: true}",
        )
        .unwrap();
        let e = &s.events[0];
        assert_eq!(e.phase_at(secs(4), None), Phase::Scheduled);
        assert_eq!(e.phase_at(secs(5), None), Phase::Gone);
        assert_eq!(e.phase_at(secs(7), None), Phase::Gone);
        assert_eq!(e.phase_at(secs(8), None), Phase::Scheduled);
        assert!(e.render(Phase::Gone, Utc::now()).is_none());
        let v = e.render_json(Phase::Scheduled, Utc::now()).unwrap();
        assert_eq!(v["EventId"], "F");
        assert_eq!(v["EventStatus"], 42);
        assert_eq!(s.vms[0].first_request_delay, Some(secs(90)));
        assert_eq!(s.vms[0].redeploy_at, Some(secs(20)));
    }

    #[test]
    fn faults_apply_to_their_vms_and_window() {
        let s = Scenario::parse(YAML).unwrap();
        assert_eq!(
            s.fault_at("vmss_1", secs(6)).map(|f| f.kind),
            Some(FaultKind::Garbage)
        );
        assert_eq!(s.fault_at("vmss_0", secs(6)), None);
        assert_eq!(s.fault_at("vmss_1", secs(7)), None);
    }

    #[test]
    fn every_fixture_parses_and_states_its_expectations() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let s = Scenario::load(&path.to_string_lossy()).unwrap();
            assert!(s.vms.iter().all(|v| v.node.is_some()), "{}", path.display());
            assert!(
                s.events.iter().all(|e| e.expect.is_some()),
                "{}",
                path.display()
            );
            n += 1;
        }
        assert!(n >= 7, "only {n} fixtures");
    }

    #[test]
    fn invalid_scenarios_are_rejected_with_a_reason() {
        assert!(Scenario::parse("vms: []").is_err());
        assert!(Scenario::parse("vms: [{name: a}, {name: A}]").is_err());
        assert!(
            Scenario::parse("vms: [{name: a}]\nevents: [{id: x, type: Reboot, resources: []}]")
                .is_err()
        );
        assert!(Scenario::parse("vms: [{name: a}]\nbogus: 1").is_err());
    }
}
