//! The pods that take part (docs/workload-authors.md), as the pod
//! cache keeps them ([`Participant`]), and the format of a notice: one
//! annotation per event, `notice.forewarn.dev/<ScheduledEvent name>`, a
//! line of `key=value` words ([`render`]); an acknowledgement,
//! `ack.forewarn.dev/<ScheduledEvent name>`, holds the `EventId`. The
//! writes are [`crate::controller::act::notice`]'s.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::api::Phase;
use crate::policy::Action;

/// The label that asks for notices.
pub const NOTICE_LABEL: &str = "forewarn.dev/notice";
/// The label that asks for notices and for forewarn to wait for the pod's
/// acknowledgement.
pub const ACKNOWLEDGE_LABEL: &str = "forewarn.dev/acknowledge";
/// The prefix of the notice annotations; the `ScheduledEvent`'s name follows.
pub const NOTICE_PREFIX: &str = "notice.forewarn.dev/";
/// The prefix of the acknowledgement annotations; the `ScheduledEvent`'s
/// name follows, and the value is the `EventId`.
pub const ACK_PREFIX: &str = "ack.forewarn.dev/";

/// The longest annotation value the cache keeps of a pod (an
/// acknowledgement is an `EventId`, a notice about 250 bytes): a workload
/// cannot make the controller hold more.
pub const VALUE_KEPT: usize = 512;

/// A pod that takes part, as the pod cache keeps it: who it is, whether it
/// asked to be waited for, and its notice and acknowledgement annotations
/// only (no other annotation is kept).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Participant {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, sent with each write so that a pod recreated under the same
    /// name (a StatefulSet's) never gets its predecessor's notice.
    pub uid: String,
    /// Labelled `forewarn.dev/acknowledge: "true"`.
    pub acknowledges: bool,
    /// Being deleted: it still gets notices, but nothing waits for it.
    pub terminating: bool,
    /// Its `notice.forewarn.dev/*` and `ack.forewarn.dev/*` annotations.
    pub annotations: BTreeMap<String, String>,
}

impl Participant {
    /// The pod as a participant, if it takes part: labelled, not a mirror
    /// pod, not finished.
    pub fn from_pod(pod: &Pod) -> Option<Participant> {
        let labels = pod.labels();
        let asked = |label: &str| labels.get(label).is_some_and(|v| v == "true");
        let acknowledges = asked(ACKNOWLEDGE_LABEL);
        if !acknowledges && !asked(NOTICE_LABEL) {
            return None;
        }
        let finished = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        if finished
            || pod
                .annotations()
                .contains_key("kubernetes.io/config.mirror")
        {
            return None;
        }
        let annotations = pod
            .annotations()
            .iter()
            .filter(|(k, _)| k.starts_with(NOTICE_PREFIX) || k.starts_with(ACK_PREFIX))
            .map(|(k, v)| (k.clone(), v.chars().take(VALUE_KEPT).collect()))
            .collect();
        Some(Participant {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
            acknowledges,
            terminating: pod.metadata.deletion_timestamp.is_some(),
            annotations,
        })
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Its notice of the event named `event`, if stored.
    pub fn notice(&self, event: &str) -> Option<&str> {
        self.annotations.get(&notice_key(event)).map(String::as_str)
    }

    /// Whether its notice of `event` is stored, for `event_id` (an earlier
    /// notice of another `EventId` under the same name does not count).
    pub fn notified(&self, event: &str, event_id: &str) -> bool {
        self.notice(event)
            .and_then(|n| field(n, "eventId"))
            .is_some_and(|id| id.eq_ignore_ascii_case(&token(event_id)))
    }

    /// Whether it acknowledged `event_id`: `ack.forewarn.dev/<event>` holds
    /// the `EventId` (any case, surrounding spaces ignored).
    pub fn acknowledged(&self, event: &str, event_id: &str) -> bool {
        self.annotations
            .get(&ack_key(event))
            .is_some_and(|v| v.trim().eq_ignore_ascii_case(event_id))
    }

    /// The names of the events it holds a notice or an acknowledgement of.
    pub fn events(&self) -> impl Iterator<Item = &str> {
        self.annotations.keys().filter_map(|k| {
            k.strip_prefix(NOTICE_PREFIX)
                .or_else(|| k.strip_prefix(ACK_PREFIX))
        })
    }

    /// Whether it holds a notice or an acknowledgement of `event`.
    pub fn holds(&self, event: &str) -> bool {
        self.events().any(|e| e == event)
    }
}

/// `notice.forewarn.dev/<event>`.
pub fn notice_key(event: &str) -> String {
    format!("{NOTICE_PREFIX}{event}")
}

/// `ack.forewarn.dev/<event>`.
pub fn ack_key(event: &str) -> String {
    format!("{ACK_PREFIX}{event}")
}

/// What a notice tells a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// `EventId` as IMDS spells it.
    pub event_id: String,
    /// `EventType`.
    pub event_type: String,
    /// `EventStatus` as the agents report it.
    pub status: String,
    /// `NotBefore`, absent once started.
    pub not_before: Option<DateTime<Utc>>,
    /// `DurationInSeconds`: `0` none, `-1` unknown.
    pub duration_seconds: i64,
    /// Forewarn's phase.
    pub phase: Phase,
    /// The policy's action.
    pub action: Action,
    /// Whether forewarn drains the pod's node (evicts its pods, DaemonSet
    /// and mirror pods aside).
    pub drain: bool,
    /// For a pod forewarn waits for: until when.
    pub acknowledge_by: Option<DateTime<Utc>>,
}

/// `s` with every character but ASCII letters, digits and `._:+-`
/// replaced by `_`: a value a line of `key=value` words can hold, and
/// that the kubelet's Go quoting leaves as it is.
fn token(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._:+-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The annotation's value: `eventId=... type=... status=... notBefore=...
/// durationSeconds=... phase=... action=... drain=true|false`, then
/// `acknowledgeBy=...` for a pod forewarn waits for. `notBefore` is empty
/// once the event started.
pub fn render(n: &Notice) -> String {
    let mut s = format!(
        "eventId={} type={} status={} notBefore={} durationSeconds={} phase={} action={} drain={}",
        token(&n.event_id),
        token(&n.event_type),
        token(&n.status),
        n.not_before.map(time).unwrap_or_default(),
        n.duration_seconds,
        n.phase.as_str(),
        n.action.as_str(),
        n.drain
    );
    if let Some(by) = n.acknowledge_by {
        s.push_str(&format!(" acknowledgeBy={}", time(by)));
    }
    s
}

/// The value of `key` in a rendered notice.
pub fn field<'a>(notice: &'a str, key: &str) -> Option<&'a str> {
    notice.split(' ').find_map(|w| {
        let (k, v) = w.split_once('=')?;
        (k == key).then_some(v)
    })
}
