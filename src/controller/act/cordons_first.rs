//! Cordons before the Kubernetes Events: while any pass has cordons in
//! flight, the controller's queued Events wait, so that the API server
//! takes the cordons of a large event (1,000 nodes in one event, or a Spot
//! wave of 200 events) without the Events of the cordons before them (one
//! per node) in between. A cordon keeps new pods off a node that is about
//! to go; an Event only tells of it, and a few seconds later is as good.
//!
//! Only the Events wait, being posted off the passes: a pass's own later
//! writes (its status, node conditions, labels) are part of it, and a pass
//! held there would hold back the next pass over its event.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The longest a write is held back for cordons: a steady stream of passes
/// that cordon (events arriving one after another for minutes) holds the
/// others back at most this long each.
pub const MAX_HELD: Duration = Duration::from_secs(10);

/// How many passes have cordons in flight, controller-wide. Cloning shares
/// the count.
#[derive(Clone)]
pub struct CordonsFirst(Arc<watch::Sender<usize>>);

impl Default for CordonsFirst {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(0)))
    }
}

/// Held while a pass's cordons are in flight; dropping it ends them.
#[must_use = "the cordons count as in flight only while this is held"]
pub struct Sending(Arc<watch::Sender<usize>>);

impl Drop for Sending {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl CordonsFirst {
    /// Counts a pass's cordons in flight until the returned guard drops.
    pub fn sending(&self) -> Sending {
        self.0.send_modify(|n| *n += 1);
        Sending(Arc::clone(&self.0))
    }

    /// How many passes have cordons in flight now.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        *self.0.borrow()
    }

    /// Returns once no pass has cordons in flight, or after [`MAX_HELD`].
    /// Returns `true` when it returned because none were in flight.
    pub async fn clear(&self) -> bool {
        let mut rx = self.0.subscribe();
        tokio::time::timeout(MAX_HELD, rx.wait_for(|n| *n == 0))
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn writes_wait_while_cordons_are_in_flight_and_go_when_they_end() {
        let first = CordonsFirst::default();
        // None in flight: at once.
        let at = tokio::time::Instant::now();
        assert!(first.clear().await);
        assert_eq!(at.elapsed(), Duration::ZERO);

        let a = first.sending();
        let b = first.sending();
        assert_eq!(first.in_flight(), 2);
        let waiting = tokio::spawn({
            let first = first.clone();
            async move {
                let at = tokio::time::Instant::now();
                let clear = first.clear().await;
                (clear, at.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(a);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !waiting.is_finished(),
            "one pass still has cordons in flight"
        );
        drop(b);
        let (clear, waited) = waiting.await.unwrap();
        assert!(clear);
        assert_eq!(waited, Duration::from_secs(2));
        assert_eq!(first.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_is_held_back_at_most_max_held() {
        let first = CordonsFirst::default();
        let _forever = first.sending();
        let at = tokio::time::Instant::now();
        assert!(!first.clear().await);
        assert_eq!(at.elapsed(), MAX_HELD);
    }
}
