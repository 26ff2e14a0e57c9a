//! The deadline-ordered gate in front of the reconciles: at most `permits`
//! reconciles run at once, and when more are due, nodes take turns and,
//! within a turn, the one whose event's `NotBefore` is nearest goes next.
//!
//! kube-runtime's controller runs a due reconcile as soon as it has a free
//! slot, in the order its scheduler yields them, which is not the order of
//! the events' deadlines: under a flood, an event whose `NotBefore` is near
//! could wait behind events announced later with more notice. So the
//! controller runs kube-runtime without a limit of its own (it still never
//! reconciles one object twice at once) and every reconcile first takes a
//! [`Permit`] here, by [`Deadline`] and by the nodes whose agents report
//! the event (its lines, [`Gate::acquire`]), and holds it until its node
//! writes (cordons, releases) are sent: its evictions wait for the
//! controller-wide eviction rate budget instead, so that a wave's slow
//! evictions do not hold back the cordons of the events still to be
//! handled. The permit is taken before the pass reads its caches, not only
//! around its writes: the number of passes holding a snapshot of the
//! caches at once is bounded by the permits, whatever one node reports.
//!
//! Turns: every node's agent is one line, and each line has one pass in
//! each round (start-time fair queueing, a round being a virtual time): a
//! node's agent that reports hundreds of urgent events, each asking for
//! passes, puts one of them before another node's event in each round, not
//! all of them, as the creation of the objects takes turns by reporting
//! node. An event reported by several agents counts in the line of the one
//! with the fewest passes waiting, so that joining another node's event
//! costs that node nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;

use crate::api::{Phase, ScheduledEvent};

/// How long the remaining work of an event without a deadline (approved,
/// started, ended, ignored: following Azure's progress, releasing its
/// nodes) may wait behind events that have one: it is served as if its
/// deadline were this long after it asked, so a flood of events with
/// deadlines never starves the release of another event's nodes.
pub const NO_DEADLINE_SLACK: chrono::TimeDelta = chrono::TimeDelta::seconds(30);

/// The longest a pass waits behind passes asked after it: whatever its
/// event's deadline, it is served as if that deadline were at most this
/// long after it asked. A drain whose `NotBefore` is hours away would
/// otherwise wait behind every pass without a deadline
/// ([`NO_DEADLINE_SLACK`]) asked while it waits, for as long as they keep
/// coming.
pub const MAX_WAIT: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// How finely deadlines are told apart: deadlines within the same
/// [`GRANULARITY`] (of the Unix epoch) count as equal, and equal ones are
/// served in turn. A Spot wave's events appear within a second or two and
/// each then keeps asking for passes (its pods, its budgets, its own status
/// change); ordered to the millisecond, the first events' passes, however
/// little they achieve while their budgets are shut, would take every
/// permit from the last ones. Ten seconds is short beside any notice Azure
/// gives (30 s at the least) and long beside the spread of a wave.
pub const GRANULARITY: i64 = 10;

/// `at` rounded down to [`GRANULARITY`].
fn bucket(at: DateTime<Utc>) -> DateTime<Utc> {
    let s = at.timestamp();
    DateTime::from_timestamp(s - s.rem_euclid(GRANULARITY), 0).unwrap_or(at)
}

/// When an event must be handled by. The first pass of an event (no
/// phase yet: its nodes not yet cordoned, a write or two) goes before any
/// pass of an event under way (whose evictions may take a second): in a
/// wave, every node is cordoned before the drains already started take
/// the permits. Then nearest deadline first; then in their order of
/// arrival, so that an event reconciled again (its own writes trigger it)
/// goes behind those of the same deadline that have not had their turn
/// yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline {
    /// 0 for an event no pass has handled yet, 1 once one has.
    under_way: u8,
    at: DateTime<Utc>,
}

impl Deadline {
    /// The deadline `at` of an event a pass has handled already.
    pub fn new(at: DateTime<Utc>) -> Self {
        Self {
            at: bucket(at),
            under_way: 1,
        }
    }

    /// The deadline `at` of an event no pass has handled yet.
    pub fn first(at: DateTime<Utc>) -> Self {
        Self {
            at: bucket(at),
            under_way: 0,
        }
    }

    /// The same deadline for a pass over an event whose last pass failed:
    /// it goes behind the first passes of its round, as a pass of an event
    /// under way, so that an event whose every pass fails (its writes lose
    /// a race, or are refused) never keeps the place of a first pass.
    pub fn after_failure(self) -> Self {
        Self {
            under_way: 1,
            ..self
        }
    }
}

/// The deadline of `event` at `now`: its `NotBefore` (Azure starts the
/// event then, approved or not) while the approval it may need is not yet
/// accepted by IMDS (no phase yet, `Pending`, `Draining` or `Drained`);
/// else [`NO_DEADLINE_SLACK`] after `now`; never later than [`MAX_WAIT`]
/// after `now`, so that no pass starves. An event without a phase has had
/// no pass yet: [`Deadline::first`].
pub fn deadline_of(event: &ScheduledEvent, now: DateTime<Utc>) -> Deadline {
    let phase = event.status.as_ref().and_then(|s| s.phase.as_ref());
    let pending = matches!(
        phase,
        None | Some(Phase::Pending | Phase::Draining | Phase::Drained)
    );
    let at = event
        .spec
        .not_before
        .filter(|_| pending)
        .unwrap_or(now + NO_DEADLINE_SLACK)
        .min(now + MAX_WAIT);
    match phase {
        None => Deadline::first(at),
        Some(_) => Deadline::new(at),
    }
}

/// A reconcile's right to run; given back to the gate when dropped.
#[derive(Debug)]
pub struct Permit {
    /// `None` once it is known not to count (a permit whose waiter was
    /// gone when it was sent).
    gate: Option<Arc<Shared>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.release();
        }
    }
}

/// At most `permits` holders at once; waiters served round by round (one
/// pass a line a round), nearest deadline first within a round.
#[derive(Debug, Clone)]
pub struct Gate {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
}

/// Where a waiter stands: its round, then its deadline, then its arrival.
type Place = (u64, Deadline, u64);

#[derive(Debug)]
struct State {
    free: usize,
    /// Waiters by round, deadline, then arrival.
    waiting: BTreeMap<Place, oneshot::Sender<Permit>>,
    arrivals: u64,
    /// The round of the waiter served last (the virtual time): a line that
    /// had no pass for a while starts in it, not in its own past.
    round: u64,
    /// Each line's next round, kept only while ahead of `round`.
    next: HashMap<String, u64>,
}

impl State {
    /// The round of a pass of `lines` arriving now, taken from the line
    /// whose next round is the earliest (an empty `lines` is the one
    /// line of the events no agent reports).
    fn take_round(&mut self, lines: &[String]) -> u64 {
        let unnamed = [String::new()];
        let lines = if lines.is_empty() {
            &unnamed[..]
        } else {
            lines
        };
        let (line, next) = lines
            .iter()
            .map(|l| (l, self.next.get(l).copied().unwrap_or(0)))
            .min_by_key(|(_, n)| *n)
            .unwrap_or((&unnamed[0], 0));
        let round = next.max(self.round);
        self.next.insert(line.clone(), round + 1);
        round
    }

    /// Notes that a pass of `round` was served: the virtual time moves on,
    /// and the lines it left behind are forgotten.
    fn served(&mut self, round: u64) {
        if round > self.round {
            self.round = round;
            let now = self.round;
            self.next.retain(|_, n| *n > now);
        }
    }
}

impl Gate {
    /// A gate of `permits` (at least 1) holders at once.
    pub fn new(permits: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    free: permits.max(1),
                    waiting: BTreeMap::new(),
                    arrivals: 0,
                    round: 0,
                    next: HashMap::new(),
                }),
            }),
        }
    }

    /// Waits for a permit for a pass whose event is reported by the agents
    /// of `lines` (node names; none for an event no agent reports any
    /// longer). The pass takes the next round of the line among `lines`
    /// that is least ahead; waiters are served by round, then nearest
    /// `deadline`, then arrival. Cancel-safe: a waiter dropped before it is
    /// served takes no permit, and one dropped with a permit on its way
    /// gives it back.
    pub async fn acquire(&self, deadline: Deadline, lines: &[String]) -> Permit {
        let rx = {
            let mut state = self.shared.lock();
            let round = state.take_round(lines);
            if state.free > 0 && state.waiting.is_empty() {
                state.free -= 1;
                state.served(round);
                return Permit {
                    gate: Some(self.shared.clone()),
                };
            }
            let (tx, rx) = oneshot::channel();
            state.arrivals += 1;
            let arrival = state.arrivals;
            state.waiting.insert((round, deadline, arrival), tx);
            rx
        };
        match rx.await {
            Ok(permit) => permit,
            // The sender is only dropped with a permit sent or by the gate
            // itself, which lives as long as `self`.
            Err(_) => unreachable!("a waiter's sender is dropped only after sending"),
        }
    }

    /// How many reconciles wait for a permit.
    pub fn waiting(&self) -> usize {
        self.shared.lock().waiting.len()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A permit came back: to the nearest waiter still there, else free.
    fn release(self: &Arc<Self>) {
        loop {
            let next = {
                let mut state = self.lock();
                match state.waiting.pop_first() {
                    Some(((round, ..), tx)) => {
                        state.served(round);
                        tx
                    }
                    None => {
                        state.free += 1;
                        return;
                    }
                }
            };
            // Sent outside the lock: a permit that comes back at once (its
            // waiter gone) releases again.
            let permit = Permit {
                gate: Some(self.clone()),
            };
            match next.send(permit) {
                Ok(()) => return,
                Err(mut permit) => {
                    // The waiter was dropped: the next one. This permit
                    // does not count, so its drop releases nothing.
                    permit.gate = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;
    use std::time::Duration;

    fn at(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap()
    }

    fn d(s: i64) -> Deadline {
        Deadline::new(at(s))
    }

    impl Gate {
        /// A permit for a pass of an event no agent reports.
        async fn acquire_any(&self, deadline: Deadline) -> Permit {
            self.acquire(deadline, &[]).await
        }
    }

    /// Waiters queued while the only permit is held, in arrival order
    /// (each waits before the next arrives); returns the order they were
    /// served in once the permit comes back.
    async fn served_order(waiters: Vec<(Deadline, Vec<String>, String)>) -> Vec<String> {
        let gate = Gate::new(1);
        let held = gate.acquire_any(d(0)).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (deadline, lines, name) in waiters {
            let (g, order) = (gate.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = g.acquire(deadline, &lines).await;
                order.lock().unwrap().push(name);
            }));
            while gate.waiting() < tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        order.lock().unwrap().clone()
    }

    /// One node's agent reports 500 events whose `NotBefore` is a second
    /// away, each asking for its first pass; another node's event, with
    /// 90 s of notice, asks after all of them: it is served in the first
    /// round, after one of the flood's, not after all 500.
    #[tokio::test]
    async fn one_nodes_flood_puts_one_pass_a_round_before_another_nodes_event() {
        let a = vec!["node-a".to_string()];
        let mut waiters: Vec<(Deadline, Vec<String>, String)> = (0..500)
            .map(|i| (Deadline::first(at(1)), a.clone(), format!("flood-{i}")))
            .collect();
        waiters.push((
            Deadline::first(at(90)),
            vec!["node-b".to_string()],
            "b".into(),
        ));
        let order = served_order(waiters).await;
        let b = order.iter().position(|n| n == "b").unwrap();
        assert_eq!(b, 1, "{:?}", &order[..5]);
        // The flood's own passes keep their order of arrival.
        assert_eq!(order[0], "flood-0");
        assert_eq!(order[2], "flood-1");
    }

    /// An event two agents report counts in the line of the one with
    /// fewer passes waiting: node A's agent, flooding, also reports B's
    /// event; that costs B nothing.
    #[tokio::test]
    async fn joining_another_nodes_event_costs_that_node_nothing() {
        let a = vec!["node-a".to_string()];
        let mut waiters: Vec<(Deadline, Vec<String>, String)> = (0..50)
            .map(|i| (Deadline::first(at(1)), a.clone(), format!("flood-{i}")))
            .collect();
        waiters.push((
            Deadline::first(at(90)),
            vec!["node-a".to_string(), "node-b".to_string()],
            "b".into(),
        ));
        let order = served_order(waiters).await;
        assert_eq!(order.iter().position(|n| n == "b"), Some(1), "{order:?}");
    }

    /// Within a round, nearest deadline first, and a pass whose last pass
    /// failed goes behind the first passes of its round.
    #[tokio::test]
    async fn a_failed_pass_goes_behind_the_first_passes_of_its_round() {
        let line = |n: &str| vec![n.to_string()];
        let order = served_order(vec![
            (
                Deadline::first(at(1)).after_failure(),
                line("x"),
                "failed".into(),
            ),
            (Deadline::first(at(50)), line("y"), "first".into()),
            (Deadline::new(at(20)), line("z"), "under-way".into()),
        ])
        .await;
        assert_eq!(order, ["first", "failed", "under-way"]);
    }

    /// A line that had no pass for a while starts in the current round:
    /// its idle time is not credited (it cannot jump ahead of every line
    /// for as many rounds as it was idle).
    #[test]
    fn an_idle_line_starts_in_the_current_round() {
        let gate = Gate::new(1);
        let mut state = gate.shared.lock();
        for _ in 0..10 {
            let r = state.take_round(&["busy".to_string()]);
            state.served(r);
        }
        assert_eq!(state.round, 9);
        assert_eq!(state.take_round(&["idle".to_string()]), 9);
        assert_eq!(state.take_round(&["idle".to_string()]), 10);
        assert_eq!(state.take_round(&["busy".to_string()]), 10);
        // Lines behind the virtual time are forgotten.
        state.served(12);
        assert!(state.next.is_empty(), "{:?}", state.next);
    }

    #[test]
    fn an_event_has_its_not_before_as_deadline_until_imds_accepts_its_approval() {
        let now = at(0);
        let mut ev = ScheduledEvent::new(
            "e",
            crate::fixtures::spec("E")
                .vms(["vm_1"])
                .not_before(at(60))
                .build(),
        );
        assert_eq!(
            deadline_of(&ev, now),
            Deadline::first(at(60)),
            "no status yet"
        );
        assert!(Deadline::first(at(60)) < d(60), "first passes go first");
        assert!(
            Deadline::first(at(60)) < d(1),
            "even before a nearer deadline's later pass"
        );
        assert!(Deadline::first(at(1)) < Deadline::first(at(60)));
        // Within one GRANULARITY, deadlines are equal (served in turn).
        assert_eq!(d(51), d(59));
        assert!(d(59) < d(60));
        for phase in [Phase::Pending, Phase::Draining, Phase::Drained] {
            ev.status = Some(crate::api::ScheduledEventStatus {
                phase: Some(phase),
                ..Default::default()
            });
            assert_eq!(deadline_of(&ev, now), d(60), "{phase:?}");
        }
        for phase in [
            Phase::Approved,
            Phase::Started,
            Phase::Completed,
            Phase::Cancelled,
            Phase::Ignored,
        ] {
            ev.status = Some(crate::api::ScheduledEventStatus {
                phase: Some(phase),
                ..Default::default()
            });
            assert_eq!(deadline_of(&ev, now), d(30), "{phase:?}: the slack");
        }
        ev.status = Some(crate::api::ScheduledEventStatus {
            phase: Some(Phase::Started),
            ..Default::default()
        });
        ev.spec.not_before = None;
        assert_eq!(deadline_of(&ev, now), d(30), "started: no NotBefore");
    }

    /// A drain whose `NotBefore` is hours away, asked first, is not left
    /// behind the passes without a deadline asked after it for longer than
    /// [`MAX_WAIT`]: those asked more than `MAX_WAIT - NO_DEADLINE_SLACK`
    /// after it go behind it.
    #[test]
    fn a_far_deadline_waits_at_most_max_wait_behind_later_passes() {
        let mut far = ScheduledEvent::new(
            "far",
            crate::fixtures::spec("F")
                .vms(["vm_1"])
                .not_before(at(7200))
                .build(),
        );
        far.status = Some(crate::api::ScheduledEventStatus {
            phase: Some(Phase::Draining),
            ..Default::default()
        });
        let mut ended = far.clone();
        ended.status = Some(crate::api::ScheduledEventStatus {
            phase: Some(Phase::Completed),
            ..Default::default()
        });
        let drain = deadline_of(&far, at(0));
        assert_eq!(drain, d(60));
        assert!(deadline_of(&ended, at(0)) < drain, "asked at once: first");
        assert!(
            deadline_of(&ended, at(40)) > drain,
            "asked 40 s later: behind the drain that waited"
        );
        // A nearer NotBefore is untouched.
        far.spec.not_before = Some(at(20));
        assert_eq!(deadline_of(&far, at(0)), d(20));
    }

    /// While the only permit is held, waiters arrive in an order unrelated
    /// to their deadlines (latest first, the way a scheduler that yields
    /// the newest trigger first would hand them out); once it is given
    /// back they run one at a time, nearest deadline first, and those of
    /// the same deadline (to [`GRANULARITY`]: tie1, e5 and tie2) in their
    /// order of arrival.
    #[tokio::test]
    async fn waiters_are_served_nearest_deadline_first_whatever_their_arrival() {
        let gate = Gate::new(1);
        let held = gate.acquire_any(d(0)).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        // Arrival order: a tie, an ended event (deadline +200 s), +90 s ..
        // +10 s, +5 s, the tie's second.
        let arrivals: Vec<(DateTime<Utc>, String)> = [(at(55), "tie1".to_string())]
            .into_iter()
            .chain(std::iter::once((at(200), "ended".to_string())))
            .chain((1..=9).rev().map(|i| (at(i * 10), format!("e{i}"))))
            .chain([(at(5), "urgent".into()), (at(55), "tie2".into())])
            .collect();
        for (nb, name) in arrivals {
            let (g, order) = (gate.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                // Each of its own node: one line each.
                let _permit = g
                    .acquire(Deadline::new(nb), std::slice::from_ref(&name))
                    .await;
                order.lock().unwrap().push(name);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }));
            // Each waits before the next arrives.
            while gate.waiting() < tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let expected: Vec<String> = std::iter::once("urgent".to_string())
            .chain((1..=4).map(|i| format!("e{i}")))
            .chain(["tie1".into(), "e5".into(), "tie2".into()])
            .chain((6..=9).map(|i| format!("e{i}")))
            .chain(std::iter::once("ended".to_string()))
            .collect();
        assert_eq!(order, expected);
        assert_eq!(gate.waiting(), 0);
    }

    /// A waiter cancelled before its turn takes no permit: the permits
    /// all come back, and the gate serves as many holders as before.
    #[tokio::test]
    async fn a_cancelled_waiter_leaks_no_permit() {
        let gate = Gate::new(2);
        let a = gate.acquire_any(d(1)).await;
        let b = gate.acquire_any(d(2)).await;
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire_any(d(3)).await }
        });
        while gate.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        drop(a);
        drop(b);
        // Both permits are free again: two holders at once, no waiting.
        let x = tokio::time::timeout(Duration::from_secs(5), gate.acquire_any(d(100)))
            .await
            .expect("a free permit");
        let y = tokio::time::timeout(Duration::from_secs(5), gate.acquire_any(d(100)))
            .await
            .expect("a second free permit");
        assert_eq!(gate.shared.lock().free, 0);
        drop((x, y));
        assert_eq!(gate.shared.lock().free, 2);
    }

    /// More holders than permits never run at once.
    #[tokio::test]
    async fn never_more_holders_than_permits() {
        let gate = Gate::new(3);
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks: Vec<_> = (0..40)
            .map(|i| {
                let (gate, running, peak) = (gate.clone(), running.clone(), peak.clone());
                tokio::spawn(async move {
                    let _p = gate.acquire_any(d(i % 7)).await;
                    let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    peak.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
        assert!((2..=3).contains(&peak), "{peak} holders at once");
        assert_eq!(gate.shared.lock().free, 3);
    }
}
