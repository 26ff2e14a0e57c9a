//! Confirmed impact: what actually happened to each
//! node. A change of a Node's `bootID` inside an event's impact window is
//! recorded on the event (`status.nodes[].impact`), and is the expected
//! impact of a `Reboot`, `Redeploy` or `Preempt`; any other change is an
//! unexpected restart (a Warning Event `UnexpectedRestart` on the Node and
//! `forewarn_controller_unexpected_restarts_total`). For a `Freeze`, the
//! gap in the node's Lease renewals is recorded ([`crate::controller::observe::heartbeats`]).
//!
//! The last `bootID` of every node is kept in memory ([`BootIds`]), fed by
//! the node cache of every replica, leader or not, and seeded from its
//! first list: neither a relist nor the first sight of a node counts as a
//! change, and a standby that takes over knows every `bootID` already, so
//! that no restart is reported twice. Only the leader reports; a restart
//! that no running replica saw (all were down) is not reported as
//! unexpected, while the event's record still shows an expected one (its
//! `bootId` is stored).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, TimeDelta, Utc};
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::api::{
    EventStatus, NodeImpact, ScheduledEvent, ScheduledEventSpec, ScheduledEventStatus,
};
use crate::controller::observe::heartbeats::Gap;
use crate::controller::observe::heartbeats::Heartbeats;
use crate::imds::model::EventType;

/// How long after an event left IMDS its impact window stays open: a
/// kubelet reports its new `bootID`, and renews its Lease, a little after
/// the VM is back, and IMDS may drop a short event at once.
pub const SETTLE: TimeDelta = TimeDelta::seconds(60);

/// Whether an event of this type announces a restart of its VMs: `Reboot`,
/// `Redeploy`, `Preempt`, and a type this version does not know (Azure's
/// docs say to treat it as impactful). `Freeze` keeps the VM running and
/// `Terminate` deletes it.
pub fn restart_expected(event_type: &str) -> bool {
    matches!(
        EventType::from(event_type),
        EventType::Reboot | EventType::Redeploy | EventType::Preempt | EventType::Other(_)
    )
}

/// An event's impact window: from the first of the approval decided, the
/// event seen `Started` and `NotBefore`, to [`SETTLE`] after it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// When it opened; `None`: not yet. `DateTime::MIN_UTC` for an event
    /// seen `Started` before any time was recorded (a hardware failure
    /// arrives `Started`: its impact may precede the event).
    pub start: Option<DateTime<Utc>>,
    /// When it closes; `None` while the event is live.
    pub end: Option<DateTime<Utc>>,
}

impl Window {
    /// The window of an event with `spec` and `status`.
    pub fn of(spec: &ScheduledEventSpec, status: Option<&ScheduledEventStatus>) -> Self {
        let decided = status
            .and_then(|s| s.approval.as_ref())
            .and_then(|a| a.decided_at);
        let started = status.and_then(|s| s.started_at);
        let mut start = [decided, started, spec.not_before]
            .into_iter()
            .flatten()
            .min();
        if spec.event_status == EventStatus::Started && started.is_none() {
            start = Some(DateTime::<Utc>::MIN_UTC);
        }
        let end = if is_over(spec, status) {
            status.and_then(|s| s.finished_at).map(|f| f + SETTLE)
        } else {
            None
        };
        Window { start, end }
    }

    /// Whether `t` falls inside it.
    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        self.start.is_some_and(|s| t >= s) && self.end.is_none_or(|e| t <= e)
    }

    /// Whether it has closed by `t`.
    pub fn closed(&self, t: DateTime<Utc>) -> bool {
        self.end.is_some_and(|e| t > e)
    }
}

/// Whether nothing more happens to the event in its current appearance
/// (as [`crate::controller::decide::plan::is_over`], from its parts).
pub fn is_over(spec: &ScheduledEventSpec, status: Option<&ScheduledEventStatus>) -> bool {
    spec.event_status == EventStatus::Completed
        || status.is_some_and(|s| {
            s.appearance.unwrap_or(1) == spec.appearance && s.phase.is_some_and(|p| p.is_final())
        })
}

/// Whether `ev` concerns a node whose VM is `vm` and whose hold list is
/// `holds`: `Resources` names its VM (ignoring case), or forewarn holds
/// the node for it.
pub fn affects(ev: &ScheduledEvent, vm: Option<&str>, holds: &[String]) -> bool {
    let name = ev.metadata.name.as_deref().unwrap_or_default();
    holds.iter().any(|h| h == name)
        || vm.is_some_and(|vm| ev.spec.resources.iter().any(|r| r.eq_ignore_ascii_case(vm)))
}

/// What the controller sees of one node now, for [`record`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeNow {
    /// Its `status.nodeInfo.bootID` (empty ones, as on KWOK's nodes, are
    /// `None`: nothing to compare).
    pub boot_id: Option<String>,
    /// When this process saw the node take that `bootID`, if it did.
    pub boot_changed_at: Option<DateTime<Utc>>,
    /// `Freeze` only: its Lease renewals' longest gap in the window.
    pub heartbeat: Option<Gap>,
}

/// A node's `status.nodeInfo.bootID`, if it has one.
pub fn boot_id(node: &Node) -> Option<String> {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .filter(|b| !b.is_empty())
}

/// Fills `status.nodes[].impact` (pure): each record keeps what `before`
/// recorded, and, until the window closed, gains what `now_of` shows:
///
/// - the first `bootID` seen is the baseline (`bootId`);
/// - another one seen inside the window (at the time this process saw the
///   change, else `now`) is the restart (`restartedAt`, `bootIdAfter`);
///   outside it (before the window opened) it becomes the baseline, unless
///   a restart was already recorded;
/// - for a `Freeze`, the longest heartbeat gap, updated only when a longer
///   one is seen (so the record is not rewritten at every renewal).
pub fn record(
    spec: &ScheduledEventSpec,
    before: Option<&ScheduledEventStatus>,
    status: &mut ScheduledEventStatus,
    now_of: &HashMap<String, NodeNow>,
    now: DateTime<Utc>,
) {
    let prev: HashMap<String, NodeImpact> = before
        .and_then(|s| s.nodes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|n| Some((n.name.clone(), n.impact.clone()?)))
        .collect();
    let window = Window::of(spec, Some(status));
    let frozen = window.closed(now);
    let freeze = EventType::from(spec.event_type.as_str()) == EventType::Freeze;
    for r in status.nodes.iter_mut().flatten() {
        let mut imp = r
            .impact
            .take()
            .or_else(|| prev.get(&r.name).cloned())
            .unwrap_or_default();
        if let Some(n) = now_of
            .get(&r.name)
            .filter(|_| !frozen && r.deleted_at.is_none())
        {
            note_boot(&mut imp, n, &window, now);
            if freeze && let Some(g) = n.heartbeat {
                note_gap(&mut imp, g);
            }
        }
        r.impact = (imp != NodeImpact::default()).then_some(imp);
    }
}

fn note_boot(imp: &mut NodeImpact, n: &NodeNow, window: &Window, now: DateTime<Utc>) {
    let Some(current) = n.boot_id.clone() else {
        return;
    };
    match imp.boot_id.as_deref() {
        None => imp.boot_id = Some(current),
        Some(b) if b == current => {}
        Some(_) if imp.boot_id_after.as_deref() == Some(current.as_str()) => {}
        Some(_) => {
            let at = n.boot_changed_at.unwrap_or(now);
            if window.contains(at) {
                imp.restarted_at.get_or_insert(at);
                imp.boot_id_after = Some(current);
            } else if imp.restarted_at.is_none() {
                imp.boot_id = Some(current);
            }
        }
    }
}

fn note_gap(imp: &mut NodeImpact, g: Gap) {
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let longer = imp
        .heartbeat_gap_seconds
        .is_none_or(|old| round(g.longest) > old);
    if longer {
        imp.heartbeat_gap_seconds = Some(round(g.longest));
        imp.observed_freeze_seconds = Some(round((g.longest - g.usual).max(0.0)));
    }
}

/// Fills the impact of `status`'s records from the node snapshots this
/// pass read, the `bootID` changes this process saw and, for a `Freeze`,
/// the Lease renewals it watches (each mapped node's watch is kept going
/// until [`SETTLE`] after the event ended; see [`crate::controller::observe::heartbeats`]).
pub fn observe_and_record(
    ev: &ScheduledEvent,
    status: &mut ScheduledEventStatus,
    snapshots: &HashMap<String, Arc<Node>>,
    heartbeats: &Heartbeats,
    boot_ids: &BootIds,
    now: DateTime<Utc>,
) {
    let window = Window::of(&ev.spec, Some(status));
    let freeze = EventType::from(ev.spec.event_type.as_str()) == EventType::Freeze;
    let me = ev.name_any();
    let mut now_of = HashMap::new();
    for r in status
        .nodes
        .iter()
        .flatten()
        .filter(|r| !r.vm_name.is_empty())
    {
        let Some(node) = snapshots.get(&r.name) else {
            continue;
        };
        let boot = boot_id(node);
        let heartbeat = if freeze && !window.closed(now) {
            let until = window
                .end
                .unwrap_or(now + crate::controller::observe::heartbeats::TRACK_TTL);
            heartbeats.track(&r.name, &me, until);
            window
                .start
                .and_then(|from| heartbeats.gap(&r.name, from, window.end))
        } else {
            None
        };
        now_of.insert(
            r.name.clone(),
            NodeNow {
                boot_changed_at: boot
                    .as_deref()
                    .and_then(|b| boot_ids.changed_at(&r.name, b)),
                boot_id: boot,
                heartbeat,
            },
        );
    }
    record(&ev.spec, ev.status.as_ref(), status, &now_of, now);
}

/// A change of a node's `bootID`, as the node cache delivered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Node name.
    pub node: String,
    /// The `bootID` before.
    pub old: String,
    /// The `bootID` now.
    pub new: String,
    /// When this process saw it.
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
struct Seen {
    uid: String,
    boot_id: String,
    changed_at: Option<DateTime<Utc>>,
}

/// The last `bootID` of every node, as this process's node cache saw it.
pub struct BootIds {
    seen: Mutex<HashMap<String, Seen>>,
    leading: AtomicBool,
    changes: UnboundedSender<Change>,
}

impl BootIds {
    /// A tracker, and the changes it sees once it [`leads`](Self::lead).
    pub fn new() -> (Arc<Self>, UnboundedReceiver<Change>) {
        let (changes, rx) = futures::channel::mpsc::unbounded();
        (
            Arc::new(BootIds {
                seen: Mutex::new(HashMap::new()),
                leading: AtomicBool::new(false),
                changes,
            }),
            rx,
        )
    }

    /// From now on, changes are passed on to be reported (the replica
    /// leads); before, they only update what is known.
    pub fn lead(&self) {
        self.leading.store(true, Ordering::SeqCst);
    }

    /// Takes in a node from the cache's stream (every version, and every
    /// object of a relist) at `now`; returns the change it shows, if any,
    /// which is also passed on while leading. The first sight of a node (or
    /// of a new object of the same name: another UID) and a `bootID` that is
    /// empty or the same are no change.
    pub fn observe(&self, node: &Node, now: DateTime<Utc>) -> Option<Change> {
        let boot = boot_id(node)?;
        let name = node.name_any();
        let uid = node.uid().unwrap_or_default();
        let change = {
            let mut seen = self
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let entry = seen.entry(name.clone());
            match entry {
                std::collections::hash_map::Entry::Occupied(mut e) => {
                    let s = e.get_mut();
                    if s.uid != uid {
                        *s = Seen {
                            uid,
                            boot_id: boot,
                            changed_at: None,
                        };
                        None
                    } else if s.boot_id == boot {
                        None
                    } else {
                        let old = std::mem::replace(&mut s.boot_id, boot.clone());
                        s.changed_at = Some(now);
                        Some(Change {
                            node: name,
                            old,
                            new: boot,
                            at: now,
                        })
                    }
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(Seen {
                        uid,
                        boot_id: boot,
                        changed_at: None,
                    });
                    None
                }
            }
        };
        if let Some(c) = &change
            && self.leading.load(Ordering::SeqCst)
        {
            let _ = self.changes.unbounded_send(c.clone());
        }
        change
    }

    /// When this process saw `node` take `boot_id`, if it did (it is still
    /// its latest).
    pub fn changed_at(&self, node: &str, boot_id: &str) -> Option<DateTime<Utc>> {
        let seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.get(node)
            .filter(|s| s.boot_id == boot_id)
            .and_then(|s| s.changed_at)
    }

    /// Forgets the nodes for which `keep` is false (deleted ones).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|n, _| keep(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Approval, NodeProgress, Phase};
    use k8s_openapi::api::core::v1::{NodeStatus, NodeSystemInfo};
    use kube::api::ObjectMeta;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn spec(ty: &str, status: EventStatus, not_before: Option<i64>) -> ScheduledEventSpec {
        crate::fixtures::spec("ev")
            .event_type(ty)
            .status(status)
            .vms(["vm-a"])
            .not_before(not_before.map(t))
            .build()
    }

    fn node(name: &str, uid: &str, boot: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: None,
            status: Some(NodeStatus {
                node_info: Some(NodeSystemInfo {
                    boot_id: boot.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_window_opens_at_the_first_of_decision_start_and_not_before_and_closes_after_the_end() {
        let s = spec("Reboot", EventStatus::Scheduled, Some(100));
        let mut st = ScheduledEventStatus::default();
        assert_eq!(Window::of(&s, Some(&st)).start, Some(t(100)));
        assert!(!Window::of(&s, Some(&st)).contains(t(99)));
        st.approval = Some(Approval {
            decided_at: Some(t(40)),
            ..Approval::default()
        });
        let w = Window::of(&s, Some(&st));
        assert!(w.contains(t(40)) && !w.contains(t(39)) && w.contains(t(10_000)));
        // No NotBefore, no decision: not open.
        let none = spec("Reboot", EventStatus::Scheduled, None);
        assert_eq!(Window::of(&none, None).start, None);
        // Seen Started before any time was recorded: open since always.
        let started = spec("Reboot", EventStatus::Started, None);
        assert!(Window::of(&started, None).contains(t(-1_000_000)));
        // Over: closes SETTLE after it finished.
        let done = spec("Reboot", EventStatus::Completed, Some(100));
        st.phase = Some(Phase::Completed);
        st.finished_at = Some(t(200));
        let w = Window::of(&done, Some(&st));
        assert!(w.contains(t(260)) && !w.contains(t(261)) && w.closed(t(261)));
    }

    #[test]
    fn only_events_that_announce_a_restart_expect_one() {
        for ty in ["Reboot", "Redeploy", "Preempt", "Hibernate"] {
            assert!(restart_expected(ty), "{ty}");
        }
        for ty in ["Freeze", "Terminate"] {
            assert!(!restart_expected(ty), "{ty}");
        }
    }

    fn status_with(name: &str, impact: Option<NodeImpact>) -> ScheduledEventStatus {
        ScheduledEventStatus {
            nodes: Some(vec![NodeProgress {
                name: name.into(),
                vm_name: "vm-a".into(),
                impact,
                ..NodeProgress::default()
            }]),
            ..ScheduledEventStatus::default()
        }
    }

    fn now_of(boot: &str, changed: Option<i64>) -> HashMap<String, NodeNow> {
        [(
            "n".to_string(),
            NodeNow {
                boot_id: Some(boot.into()),
                boot_changed_at: changed.map(t),
                heartbeat: None,
            },
        )]
        .into()
    }

    fn impact_of(st: &ScheduledEventStatus) -> Option<NodeImpact> {
        st.nodes.as_ref().unwrap()[0].impact.clone()
    }

    #[test]
    fn a_restart_inside_the_window_is_recorded_once_with_the_time_it_was_seen() {
        let s = spec("Reboot", EventStatus::Started, Some(100));
        let base = ScheduledEventStatus {
            started_at: Some(t(100)),
            ..status_with("n", None)
        };
        // First pass: the baseline.
        let mut st = base.clone();
        record(&s, None, &mut st, &now_of("a", None), t(50));
        assert_eq!(impact_of(&st).unwrap().boot_id.as_deref(), Some("a"));
        // The record is rebuilt from scratch by status::next: the baseline
        // is carried over from before.
        let before = st.clone();
        let mut st = base.clone();
        record(&s, Some(&before), &mut st, &now_of("b", Some(120)), t(125));
        let imp = impact_of(&st).unwrap();
        assert_eq!(imp.boot_id.as_deref(), Some("a"));
        assert_eq!(imp.restarted_at, Some(t(120)));
        assert_eq!(imp.boot_id_after.as_deref(), Some("b"));
        // Seen again later (no change time known any more): unchanged.
        let before = st.clone();
        let mut st = base.clone();
        record(&s, Some(&before), &mut st, &now_of("b", None), t(500));
        assert_eq!(impact_of(&st), Some(imp.clone()));
        // A second restart keeps the first time, with the latest bootID.
        let before = st.clone();
        let mut st = base;
        record(&s, Some(&before), &mut st, &now_of("c", Some(600)), t(601));
        let imp2 = impact_of(&st).unwrap();
        assert_eq!(imp2.restarted_at, Some(t(120)));
        assert_eq!(imp2.boot_id_after.as_deref(), Some("c"));
    }

    #[test]
    fn a_restart_before_the_window_moves_the_baseline_and_is_not_recorded() {
        let s = spec("Reboot", EventStatus::Scheduled, Some(100));
        let before = status_with(
            "n",
            Some(NodeImpact {
                boot_id: Some("a".into()),
                ..NodeImpact::default()
            }),
        );
        let mut st = status_with("n", None);
        record(&s, Some(&before), &mut st, &now_of("b", Some(30)), t(31));
        let imp = impact_of(&st).unwrap();
        assert_eq!(imp.boot_id.as_deref(), Some("b"));
        assert_eq!(imp.restarted_at, None);
        // Without a known change time it is dated now: before NotBefore too.
        let mut st = status_with("n", None);
        record(&s, Some(&before), &mut st, &now_of("b", None), t(31));
        assert_eq!(impact_of(&st).unwrap().restarted_at, None);
    }

    #[test]
    fn a_closed_window_freezes_the_record_and_empty_boot_ids_record_nothing() {
        let s = spec("Reboot", EventStatus::Completed, Some(100));
        let done = |imp| ScheduledEventStatus {
            phase: Some(Phase::Completed),
            finished_at: Some(t(200)),
            ..status_with("n", imp)
        };
        let before = done(Some(NodeImpact {
            boot_id: Some("a".into()),
            ..NodeImpact::default()
        }));
        let mut st = done(None);
        record(&s, Some(&before), &mut st, &now_of("b", Some(300)), t(301));
        assert_eq!(impact_of(&st), impact_of(&before), "frozen after SETTLE");
        let mut st = done(None);
        record(&s, Some(&before), &mut st, &now_of("b", Some(250)), t(251));
        assert_eq!(impact_of(&st).unwrap().restarted_at, Some(t(250)));
        // KWOK's nodes have no bootID: no impact object at all.
        let mut st = status_with("n", None);
        let empty: HashMap<String, NodeNow> = [("n".to_string(), NodeNow::default())].into();
        record(&s, None, &mut st, &empty, t(1));
        assert_eq!(impact_of(&st), None);
    }

    #[test]
    fn a_freeze_records_its_longest_heartbeat_gap_only_when_it_grows() {
        let s = spec("Freeze", EventStatus::Started, Some(100));
        let with_gap = |longest: f64| -> HashMap<String, NodeNow> {
            [(
                "n".to_string(),
                NodeNow {
                    heartbeat: Some(Gap {
                        longest,
                        usual: 10.04,
                    }),
                    ..NodeNow::default()
                },
            )]
            .into()
        };
        let mut st = status_with("n", None);
        record(&s, None, &mut st, &with_gap(16.53), t(130));
        let imp = impact_of(&st).unwrap();
        assert_eq!(imp.heartbeat_gap_seconds, Some(16.5));
        assert_eq!(imp.observed_freeze_seconds, Some(6.5));
        // A shorter (or the same) gap later changes nothing, even if the
        // usual interval moved.
        let before = st.clone();
        let mut st = status_with("n", None);
        record(&s, Some(&before), &mut st, &with_gap(16.5), t(140));
        assert_eq!(impact_of(&st), Some(imp));
        // A Reboot records no gap.
        let reboot = spec("Reboot", EventStatus::Started, Some(100));
        let mut st = status_with("n", None);
        record(&reboot, None, &mut st, &with_gap(30.0), t(130));
        assert_eq!(impact_of(&st), None);
    }

    #[test]
    fn boot_ids_count_a_change_once_and_never_the_first_sight_or_a_relist() {
        let (ids, mut rx) = BootIds::new();
        assert_eq!(
            ids.observe(&node("n", "u1", "a"), t(0)),
            None,
            "first sight"
        );
        assert_eq!(ids.observe(&node("n", "u1", "a"), t(1)), None, "relist");
        assert_eq!(ids.observe(&node("n", "u1", ""), t(2)), None, "no bootID");
        // Not leading: known, not passed on.
        let c = ids.observe(&node("n", "u1", "b"), t(3)).unwrap();
        assert_eq!((c.old.as_str(), c.new.as_str()), ("a", "b"));
        assert!(rx.try_recv().is_err(), "nothing passed on before leading");
        assert_eq!(ids.changed_at("n", "b"), Some(t(3)));
        assert_eq!(ids.changed_at("n", "a"), None);
        ids.lead();
        assert_eq!(ids.observe(&node("n", "u1", "b"), t(4)), None);
        let c = ids.observe(&node("n", "u1", "c"), t(5)).unwrap();
        assert_eq!(rx.try_recv().unwrap(), c);
        // A new Node object of the same name: a new sight, no change.
        assert_eq!(ids.observe(&node("n", "u2", "d"), t(6)), None);
        assert_eq!(ids.changed_at("n", "d"), None);
        ids.retain(|_| false);
        assert_eq!(ids.observe(&node("n", "u2", "e"), t(7)), None, "forgotten");
    }

    #[test]
    fn an_event_affects_the_nodes_its_resources_name_or_that_it_holds() {
        let ev = ScheduledEvent::new("ev", spec("Reboot", EventStatus::Scheduled, None));
        assert!(affects(&ev, Some("VM-A"), &[]));
        assert!(!affects(&ev, Some("vm-b"), &[]));
        assert!(!affects(&ev, None, &[]));
        assert!(affects(&ev, None, &["ev".into()]));
    }
}
