//! The kubelet heartbeats of the nodes a `Freeze` affects: each renews
//! its Lease in `kube-node-lease` (every 10 s, a quarter of its 40 s
//! duration), and a frozen VM renews nothing, so the longest gap between
//! two renewals seen during the event's window is the observed freeze
//! ([`crate::controller::observe::impact`] records it).
//!
//! One watch per node, of that node's Lease only (field selector
//! `metadata.name`), from the first pass over the event until
//! [`crate::controller::observe::impact::SETTLE`] after it ended: a Freeze names the few VMs of
//! one host update, so this costs a handful of watches for minutes, where
//! a watch of the whole namespace would bring every node's renewals all
//! the time. At most [`MAX_WATCHED`] nodes are watched at once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, info, warn};

use futures::channel::mpsc::UnboundedSender;

use crate::api::ScheduledEvent;
use crate::controller::observe::watch::watch_backoff;

/// Asks for a reconcile of the `ScheduledEvent`s named (what a restart or a
/// freeze just changed in their record).
pub type Trigger = UnboundedSender<ObjectRef<ScheduledEvent>>;

/// The namespace of the nodes' Leases (the kubelet's heartbeats).
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// How long a node's Lease stays watched after the last pass over a live
/// `Freeze` that affects it (each pass renews it).
pub const TRACK_TTL: TimeDelta = TimeDelta::minutes(10);

/// The most nodes whose Leases are watched at once; a `Freeze` affecting
/// more records no heartbeat gap for the others.
pub const MAX_WATCHED: usize = 250;

/// How many renewals are kept per node (at one per 10 s, 85 minutes).
const KEPT: usize = 512;

/// A gap this many times the usual interval has the events that watch the
/// node reconciled at once, to record it.
const NOTABLE: f64 = 1.5;

/// How often watches past their time are stopped.
const EXPIRY_EVERY: Duration = Duration::from_secs(15);

/// The longest gap between two renewals in a window, and the usual
/// interval between renewals, seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gap {
    /// The longest interval between two consecutive renewals seen that
    /// ended inside the window.
    pub longest: f64,
    /// The usual interval: the median of every interval seen once there
    /// are three, else a quarter of the Lease's `leaseDurationSeconds`
    /// (the kubelet's renew interval).
    pub usual: f64,
}

/// The renewals seen of one node's Lease (its `spec.renewTime`s), oldest
/// first.
#[derive(Debug, Default)]
pub struct Renewals {
    times: VecDeque<DateTime<Utc>>,
    lease_seconds: Option<i32>,
}

impl Renewals {
    /// Takes in the Lease's `renewTime` as read (every version, and each
    /// relist: a time not later than the last one seen is ignored); returns
    /// the interval, seconds, from the previous renewal when it is new.
    pub fn push(&mut self, t: DateTime<Utc>, lease_seconds: Option<i32>) -> Option<f64> {
        if lease_seconds.is_some() {
            self.lease_seconds = lease_seconds;
        }
        let last = self.times.back().copied();
        if last.is_some_and(|l| t <= l) {
            return None;
        }
        self.times.push_back(t);
        while self.times.len() > KEPT {
            self.times.pop_front();
        }
        last.map(|l| seconds(t - l))
    }

    fn intervals(&self) -> impl Iterator<Item = (DateTime<Utc>, DateTime<Utc>)> + '_ {
        self.times
            .iter()
            .copied()
            .zip(self.times.iter().copied().skip(1))
    }

    /// The usual interval between renewals, seconds (see [`Gap::usual`]).
    pub fn usual(&self) -> Option<f64> {
        let mut all: Vec<f64> = self.intervals().map(|(a, b)| seconds(b - a)).collect();
        if all.len() >= 3 {
            all.sort_by(f64::total_cmp);
            return Some(all[all.len() / 2]);
        }
        self.lease_seconds
            .filter(|s| *s > 0)
            .map(|s| f64::from(s) / 4.0)
    }

    /// The longest interval that ended after `from` and began before `to`
    /// (if given), with the usual one; `None` when none did.
    pub fn gap(&self, from: DateTime<Utc>, to: Option<DateTime<Utc>>) -> Option<Gap> {
        let longest = self
            .intervals()
            .filter(|(a, b)| *b > from && to.is_none_or(|to| *a < to))
            .map(|(a, b)| seconds(b - a))
            .max_by(f64::total_cmp)?;
        Some(Gap {
            longest,
            usual: self.usual()?,
        })
    }
}

fn seconds(d: TimeDelta) -> f64 {
    d.num_microseconds().map_or(f64::MAX, |us| us as f64 / 1e6)
}

struct Watched {
    renewals: Arc<Mutex<Renewals>>,
    /// The `ScheduledEvent`s to reconcile when a notable gap ends.
    events: Arc<Mutex<HashSet<String>>>,
    until: DateTime<Utc>,
    task: tokio::task::AbortHandle,
}

/// The Lease watches of the nodes that live `Freeze`s affect.
pub struct Heartbeats {
    client: Client,
    trigger: Trigger,
    watched: Mutex<HashMap<String, Watched>>,
    warned_full: AtomicBool,
}

impl Heartbeats {
    /// No watch yet; notable gaps are sent to `trigger`.
    pub fn new(client: Client, trigger: Trigger) -> Arc<Self> {
        Arc::new(Heartbeats {
            client,
            trigger,
            watched: Mutex::new(HashMap::new()),
            warned_full: AtomicBool::new(false),
        })
    }

    /// Watches `node`'s Lease for the event `event` until `until` (at
    /// least; a later `until` extends it); starts the watch if it is not
    /// running. Must be called within the runtime.
    pub fn track(&self, node: &str, event: &str, until: DateTime<Utc>) {
        let mut watched = self
            .watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(w) = watched.get_mut(node) {
            w.until = w.until.max(until);
            w.events
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(event.to_string());
            return;
        }
        if watched.len() >= MAX_WATCHED {
            if !self.warned_full.swap(true, Ordering::Relaxed) {
                warn!(
                    node,
                    max = MAX_WATCHED,
                    "Too many nodes affected by Freeze events: their heartbeat gaps are not recorded beyond the first"
                );
            }
            return;
        }
        let renewals = Arc::new(Mutex::new(Renewals::default()));
        let events = Arc::new(Mutex::new(HashSet::from([event.to_string()])));
        let task = tokio::spawn(watch_lease(
            self.client.clone(),
            node.to_string(),
            renewals.clone(),
            events.clone(),
            self.trigger.clone(),
        ))
        .abort_handle();
        info!(node, event, "Watching the node's Lease for a Freeze");
        watched.insert(
            node.to_string(),
            Watched {
                renewals,
                events,
                until,
                task,
            },
        );
    }

    /// The longest gap between renewals of `node`'s Lease in the window
    /// from `from` to `to`, if it is watched and one was seen.
    pub fn gap(&self, node: &str, from: DateTime<Utc>, to: Option<DateTime<Utc>>) -> Option<Gap> {
        let watched = self
            .watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let w = watched.get(node)?;
        w.renewals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .gap(from, to)
    }

    /// Stops the watches whose time is over at `now`.
    pub fn expire(&self, now: DateTime<Utc>) {
        let mut watched = self
            .watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        watched.retain(|node, w| {
            let keep = w.until >= now;
            if !keep {
                w.task.abort();
                debug!(node = %node, "Stopped watching the node's Lease");
            }
            keep
        });
        if watched.len() < MAX_WATCHED {
            self.warned_full.store(false, Ordering::Relaxed);
        }
    }

    /// How many nodes' Leases are watched.
    pub fn watched(&self) -> usize {
        self.watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Stops expired watches every [`EXPIRY_EVERY`], forever.
    pub async fn run_expiry(self: Arc<Self>) {
        let mut tick = tokio::time::interval(EXPIRY_EVERY);
        loop {
            tick.tick().await;
            self.expire(Utc::now());
        }
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        for w in self
            .watched
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
        {
            w.task.abort();
        }
    }
}

/// Follows one node's Lease, recording each renewal; a gap of at least
/// [`NOTABLE`] times the usual interval has `events` reconciled.
async fn watch_lease(
    client: Client,
    node: String,
    renewals: Arc<Mutex<Renewals>>,
    events: Arc<Mutex<HashSet<String>>>,
    trigger: Trigger,
) {
    let api: Api<Lease> = Api::namespaced(client, NODE_LEASE_NAMESPACE);
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let stream = watcher(api, config)
        .backoff(watch_backoff())
        .applied_objects();
    futures::pin_mut!(stream);
    let mut warned = false;
    while let Some(item) = stream.next().await {
        let lease = match item {
            Ok(lease) => lease,
            Err(e) => {
                if warned {
                    debug!(node, error = %e, "Node Lease watch error (retrying)");
                } else {
                    warned = true;
                    warn!(node, error = %e, "Cannot watch the node's Lease in kube-node-lease (retrying): no freeze length is recorded for it");
                }
                continue;
            }
        };
        let Some(spec) = lease.spec else { continue };
        let Some(t) = spec.renew_time.as_ref().and_then(|t| {
            DateTime::from_timestamp(
                t.0.as_second(),
                u32::try_from(t.0.subsec_nanosecond()).unwrap_or(0),
            )
        }) else {
            continue;
        };
        let (closed, usual) = {
            let mut r = renewals
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let closed = r.push(t, spec.lease_duration_seconds);
            (closed, r.usual())
        };
        if let (Some(gap), Some(usual)) = (closed, usual)
            && gap >= usual * NOTABLE
        {
            let names: Vec<String> = events
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .cloned()
                .collect();
            info!(node, gap_seconds = gap, usual_seconds = usual, events = ?names, "A gap in the node's heartbeats ended");
            for name in names {
                let _ = trigger.unbounded_send(ObjectRef::new(&name));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    #[test]
    fn renewals_ignore_repeats_and_report_the_interval_they_close() {
        let mut r = Renewals::default();
        assert_eq!(r.push(t(0), Some(40)), None, "the first has no interval");
        assert_eq!(r.push(t(0), None), None, "a relist");
        assert_eq!(r.push(t(10_000), None), Some(10.0));
        assert_eq!(r.push(t(5_000), None), None, "older than the last");
        // Fewer than three intervals: a quarter of the Lease's duration.
        assert_eq!(r.usual(), Some(10.0));
        for i in 2..=5 {
            r.push(t(i * 10_000 + i * 100), None);
        }
        // Median of 10.0, 10.2, 10.1, 10.1, 10.1.
        assert_eq!(r.usual(), Some(10.1));
    }

    #[test]
    fn the_longest_gap_counts_only_intervals_that_end_in_the_window() {
        let mut r = Renewals::default();
        // Renewals every 10 s, a 17 s gap (a 7 s freeze) ending at 47 s,
        // then a 25 s one ending at 92 s.
        for ms in [0, 10_000, 20_000, 30_000, 47_000, 57_000, 67_000, 92_000] {
            r.push(t(ms), Some(40));
        }
        let g = r.gap(t(35_000), Some(t(60_000))).unwrap();
        assert_eq!(g.longest, 17.0);
        assert_eq!(g.usual, 10.0);
        // The 25 s interval began before the window's end: it counts.
        assert_eq!(r.gap(t(35_000), Some(t(70_000))).unwrap().longest, 25.0);
        assert_eq!(r.gap(t(35_000), None).unwrap().longest, 25.0);
        // Nothing ended after the window opened.
        assert_eq!(r.gap(t(92_000), None), None);
        // Without a usual interval (no duration, too few intervals): none.
        let mut bare = Renewals::default();
        bare.push(t(0), None);
        bare.push(t(20_000), None);
        assert_eq!(bare.gap(t(0), None), None);
    }

    #[test]
    fn at_most_so_many_renewals_are_kept() {
        let mut r = Renewals::default();
        for i in 0..(KEPT as i64 + 10) {
            r.push(t(i * 1000), None);
        }
        assert_eq!(r.times.len(), KEPT);
        assert_eq!(r.times.front().copied(), Some(t(10_000)));
    }
}
