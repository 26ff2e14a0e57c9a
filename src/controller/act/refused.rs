//! Node writes the API server refused, per event and node, so that one
//! node whose writes keep failing holds back no other: the pass carries
//! out the rest of its plan (the other nodes' cordons, their evictions,
//! its status), records why that node's write was refused, and writes that
//! node again only once its own backoff has passed.
//!
//! What refuses one node's write: an admission webhook or policy that
//! denies one pool's taints (403 or 422), a node deleted mid-event (404),
//! another controller that keeps changing the node (409 Conflict against
//! the version the write was conditional on), an overloaded API server
//! (429, 5xx).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The first retry after a conflict: another writer changed the node
/// since the cache showed it, and a fresh read usually wins the next try.
const CONFLICT_FIRST: Duration = Duration::from_millis(200);
/// The longest wait between two tries after conflicts.
const CONFLICT_MAX: Duration = Duration::from_secs(5);
/// The first retry after any other refusal.
const REFUSED_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two tries after other refusals.
const REFUSED_MAX: Duration = Duration::from_secs(60);

/// How long to wait before writing a node again after its `failures`-th
/// refusal in a row (1-based), before the jitter a conflict's wait gets
/// (up to as much again, at random): doubling from 200 ms up to 5 s after
/// conflicts, from 1 s up to 60 s after anything else.
pub fn backoff(conflict: bool, failures: u32) -> Duration {
    let (first, max) = if conflict {
        (CONFLICT_FIRST, CONFLICT_MAX)
    } else {
        (REFUSED_FIRST, REFUSED_MAX)
    };
    let exp = failures.saturating_sub(1).min(16);
    first.saturating_mul(1 << exp).min(max)
}

/// One node's refused writes for one event.
#[derive(Debug, Clone)]
struct Refused {
    failures: u32,
    retry_at: Instant,
    why: String,
}

/// The node writes refused, by `(event, node)`.
#[derive(Default)]
pub struct RefusedWrites(Mutex<HashMap<(String, String), Refused>>);

/// A refusal as the status records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRefusal {
    /// The node.
    pub node: String,
    /// Why, with how many refusals in a row: `cordon refused 3 times: ...`.
    pub why: String,
}

impl RefusedWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Refused>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the write of `node` for `event` waits for its backoff at
    /// `now`.
    pub fn waiting(&self, event: &str, node: &str, now: Instant) -> bool {
        self.lock()
            .get(&(event.to_owned(), node.to_owned()))
            .is_some_and(|r| r.retry_at > now)
    }

    /// Records that the write `what` (`cordon`, `release`...) of `node` for
    /// `event` was refused at `now` with `error`; returns how many times in
    /// a row and how long until it is tried again.
    pub fn refused(
        &self,
        event: &str,
        node: &str,
        what: &str,
        error: &kube::Error,
        now: Instant,
    ) -> (u32, Duration) {
        let conflict = matches!(error, kube::Error::Api(s) if s.code == 409);
        let mut all = self.lock();
        let r = all
            .entry((event.to_owned(), node.to_owned()))
            .or_insert(Refused {
                failures: 0,
                retry_at: now,
                why: String::new(),
            });
        r.failures = r.failures.saturating_add(1);
        let mut wait = backoff(conflict, r.failures);
        if conflict {
            // Writers that lost the same race do not meet again: up to as
            // much again, at random.
            wait += wait.mul_f32(fastrand::f32());
        }
        r.retry_at = now + wait;
        r.why = format!("{what} refused: {}", describe(error));
        (r.failures, wait)
    }

    /// Forgets the refusals of `node` for `event` (a write succeeded, or
    /// the node no longer needs one).
    pub fn written(&self, event: &str, node: &str) {
        self.lock().remove(&(event.to_owned(), node.to_owned()));
    }

    /// Forgets the refusals of `event`'s nodes that `planned` does not
    /// name: their write is no longer wanted (the node was deleted, or
    /// someone else made the change).
    pub fn keep_planned(&self, event: &str, planned: &std::collections::HashSet<&str>) {
        self.lock()
            .retain(|(e, node), _| e != event || planned.contains(node.as_str()));
    }

    /// The refusals standing for `event`, by node name.
    pub fn of_event(&self, event: &str) -> Vec<NodeRefusal> {
        let mut v: Vec<NodeRefusal> = self
            .lock()
            .iter()
            .filter(|((e, _), _)| e == event)
            .map(|((_, node), r)| NodeRefusal {
                node: node.clone(),
                why: if r.failures > 1 {
                    format!("{} (refused {} times in a row)", r.why, r.failures)
                } else {
                    r.why.clone()
                },
            })
            .collect();
        v.sort_by(|a, b| a.node.cmp(&b.node));
        v
    }

    /// How long until the first of `event`'s refused writes is due again,
    /// at `now`.
    pub fn next_retry(&self, event: &str, now: Instant) -> Option<Duration> {
        self.lock()
            .iter()
            .filter(|((e, _), _)| e == event)
            .map(|(_, r)| r.retry_at.saturating_duration_since(now))
            .min()
    }

    /// Keeps only the refusals of the events `live` names.
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        self.lock().retain(|(e, _), _| live.contains(e));
    }
}

/// The API server's answer in a line: `403 Forbidden: <message>`.
fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status {
                code,
                reason: "Forbidden".into(),
                message: message.into(),
                ..Default::default()
            }
            .boxed(),
        )
    }

    #[test]
    fn backoff_grows_to_a_cap() {
        let c: Vec<u64> = (1..=8)
            .map(|n| backoff(true, n).as_millis() as u64)
            .collect();
        assert_eq!(c, [200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        let r: Vec<u64> = (1..=8).map(|n| backoff(false, n).as_secs()).collect();
        assert_eq!(r, [1, 2, 4, 8, 16, 32, 60, 60]);
    }

    #[test]
    fn a_refused_node_waits_alone_and_is_forgotten_once_written() {
        let w = RefusedWrites::default();
        let t0 = Instant::now();
        let e = api_error(403, "denied by policy no-taints");
        assert_eq!(w.refused("ev", "n1", "cordon", &e, t0), (1, REFUSED_FIRST));
        assert!(w.waiting("ev", "n1", t0));
        assert!(!w.waiting("ev", "n2", t0));
        assert!(!w.waiting("other", "n1", t0));
        assert!(!w.waiting("ev", "n1", t0 + REFUSED_FIRST));
        let (n, wait) = w.refused("ev", "n1", "cordon", &e, t0 + REFUSED_FIRST);
        assert_eq!((n, wait), (2, REFUSED_FIRST * 2));
        let standing = w.of_event("ev");
        assert_eq!(standing.len(), 1);
        assert!(
            standing[0].why.contains("denied by policy no-taints"),
            "{standing:?}"
        );
        assert!(standing[0].why.contains("2 times"), "{standing:?}");
        assert_eq!(w.next_retry("ev", t0 + REFUSED_FIRST), Some(wait));
        w.written("ev", "n1");
        assert!(w.of_event("ev").is_empty());
        assert_eq!(w.next_retry("ev", t0), None);
    }
}
