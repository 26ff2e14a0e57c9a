//! When to look at an event again after a pass (pure): the plan's own
//! requeue, a throttled or blocked drain's backoff, deferred evictions,
//! and never past what falls due.

use std::time::Duration;

/// When to look again at an event whose evictions a budget refused.
const BLOCKED_REQUEUE: Duration = Duration::from_secs(1);

/// The longest pause between two passes over a blocked drain.
const MAX_BLOCKED_REQUEUE: Duration = Duration::from_secs(16);

/// When to look again at an event whose evictions were deferred (the rate
/// budget refills meanwhile; its burst carries the tokens over).
const DEFERRED_REQUEUE: Duration = Duration::from_millis(250);

/// The shortest pause before a pass for something that falls due.
const MIN_DUE_REQUEUE: Duration = Duration::from_millis(100);

/// The pause before looking again at a drain that a PodDisruptionBudget
/// blocked on `passes` passes in a row: 1 s doubling to
/// [`MAX_BLOCKED_REQUEUE`] (a budget allows again once a replacement is
/// Ready, usually within seconds; a budget that stays shut costs a pass per
/// 16 s, not per second).
pub fn blocked_backoff(passes: u32) -> Duration {
    let exp = passes.saturating_sub(1).min(8);
    (BLOCKED_REQUEUE * (1u32 << exp)).min(MAX_BLOCKED_REQUEUE)
}

/// The blocked passes in a row after one more a PodDisruptionBudget
/// blocked (`before` until then): one more, or 1 when the pass also evicted
/// a pod (`evicted`): a drain making progress is looked at again within
/// [`BLOCKED_REQUEUE`]; the backoff is for a budget that stays shut.
pub fn blocked_passes(before: u32, evicted: bool) -> u32 {
    if evicted { 1 } else { before.saturating_add(1) }
}

/// How the pass's evictions ended, for the requeue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evictions {
    /// The API server throttled them (429): wait as long as it asked.
    Throttled(Duration),
    /// A PodDisruptionBudget refused some, on this many passes in a row.
    Blocked {
        /// Consecutive blocked passes, this one included.
        passes: u32,
    },
    /// Neither.
    Open,
}

/// When to look at the event again: the plan's own `planned` requeue, no
/// sooner than a throttle asks, at the blocked drain's backoff while a
/// budget refuses (a budget allows again as soon as a replacement is Ready;
/// `polls_progress`: the plan only polls, so the backoff alone decides),
/// within [`DEFERRED_REQUEUE`] when evictions were `deferred` for lack of
/// time, and never past what falls `due` (the drain deadline under
/// `onDeadline: Approve`), also while a blocked drain is looked at less
/// often.
pub fn after(
    planned: Duration,
    polls_progress: bool,
    evictions: Evictions,
    deferred: usize,
    due: Option<Duration>,
) -> Duration {
    let requeue = match evictions {
        Evictions::Throttled(t) => t.max(planned),
        Evictions::Blocked { passes } if polls_progress => blocked_backoff(passes),
        Evictions::Blocked { passes } => planned.min(blocked_backoff(passes)),
        Evictions::Open => planned,
    };
    let requeue = if deferred > 0 {
        requeue.min(DEFERRED_REQUEUE)
    } else {
        requeue
    };
    match due {
        Some(due) => requeue.min(due.max(MIN_DUE_REQUEUE)),
        None => requeue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_drain_is_looked_at_less_often_the_longer_it_stays_blocked() {
        let d: Vec<u64> = (1..=7).map(|n| blocked_backoff(n).as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 8, 16, 16, 16]);
        assert_eq!(blocked_backoff(u32::MAX), Duration::from_secs(16));
        assert_eq!(blocked_passes(4, false), 5);
        assert_eq!(blocked_passes(u32::MAX, false), u32::MAX);
        assert_eq!(
            blocked_backoff(blocked_passes(5, true)),
            BLOCKED_REQUEUE,
            "a pass that evicted a pod starts the backoff over"
        );
    }

    #[test]
    fn the_requeue_takes_the_nearest_of_plan_backoff_deferral_and_due() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(after(s(30), false, Evictions::Open, 0, None), s(30));
        // A throttle is never cut short by the plan.
        assert_eq!(
            after(s(1), false, Evictions::Throttled(s(5)), 0, None),
            s(5)
        );
        assert_eq!(
            after(s(9), false, Evictions::Throttled(s(5)), 0, None),
            s(9)
        );
        // Blocked: the backoff, or the plan's if nearer.
        assert_eq!(
            after(s(30), false, Evictions::Blocked { passes: 3 }, 0, None),
            s(4)
        );
        assert_eq!(
            after(s(2), false, Evictions::Blocked { passes: 3 }, 0, None),
            s(2)
        );
        // A plan that only polls progress leaves it to the backoff.
        assert_eq!(
            after(s(2), true, Evictions::Blocked { passes: 5 }, 0, None),
            s(16)
        );
        // Deferred evictions come back within 250 ms.
        assert_eq!(after(s(30), false, Evictions::Open, 3, None), ms(250));
        // Never past what falls due, however blocked, and not sooner than 100 ms.
        assert_eq!(
            after(s(30), true, Evictions::Blocked { passes: 9 }, 0, Some(s(3))),
            s(3)
        );
        assert_eq!(
            after(s(30), false, Evictions::Open, 0, Some(ms(1))),
            ms(100)
        );
    }
}
