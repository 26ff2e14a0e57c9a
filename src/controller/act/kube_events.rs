//! Kubernetes Events posted off the passes: a bounded queue and the task
//! that posts them ([`EventSink`]), each note cut to what the API server
//! takes. Best effort, as client-go's recorder: the status is the record.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event as KubeEvent, Recorder};
use tracing::{debug, warn};

use crate::controller::act::cordons_first::CordonsFirst;

/// The longest note the API server takes (events.k8s.io/v1 `note`: at
/// most 1 KiB), in bytes.
pub const NOTE_LIMIT: usize = 1024;

/// `note`, cut at a character boundary to at most [`NOTE_LIMIT`] bytes
/// (ending in `…` when cut): the API server refuses a longer one.
pub fn within_note_limit(note: String) -> String {
    crate::text::cut(note, NOTE_LIMIT)
}

/// How many Kubernetes Events may wait to be posted; beyond it new ones are
/// dropped and counted (client-go's broadcaster also drops when its queue of
/// 1,000 is full: Events are best effort, the status is the record).
pub const EVENT_QUEUE: usize = 4096;

/// How many Events are posted at once.
const EVENT_CONCURRENCY: usize = 16;

/// How many Events one [`Recorder`] posts before the sink starts a fresh
/// one. kube's `Recorder` keeps every Event it posted for 6 minutes, as the
/// API server returned it (its `managedFields` among it: about 2 KiB each),
/// to fold repeats into a series, and scans them all on each post: a
/// 1,000-VM event posts thousands in that time. heaptrack found 17.7 MB of
/// a 53.7 MB heap peak there with no renewal, and 4.4 MB of a 40 MB peak
/// when renewed every 1,000 posts. client-go's correlator keeps at most
/// 4,096 (an LRU); a fresh recorder every 250 posts keeps at most about 500
/// (the old one lives until its posts in flight end). A repeat just after
/// the switch starts a new Event instead of a series.
pub const RECORDER_RENEWED_AFTER: usize = 250;

/// A bounded queue of Kubernetes Events and the task that posts them, so
/// that a pass that evicts hundreds of pods is not held up by their Events.
#[derive(Clone)]
pub struct EventSink {
    queue: tokio::sync::mpsc::Sender<(KubeEvent, ObjectReference)>,
    counted: prometheus::IntCounterVec,
}

impl EventSink {
    /// Starts the task that posts the queued Events with recorders made by
    /// `recorder` (series of the same Event are folded by each; a fresh one
    /// every [`RECORDER_RENEWED_AFTER`] posts), counting each in `counted`
    /// by result; each waits first while `cordons_first` counts cordons in
    /// flight. The task ends when every sink is dropped.
    pub fn start(
        recorder: impl Fn() -> Recorder + Send + Sync + 'static,
        counted: prometheus::IntCounterVec,
        cordons_first: CordonsFirst,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, mut rx) = tokio::sync::mpsc::channel(EVENT_QUEUE);
        let results = counted.clone();
        let task = tokio::spawn(async move {
            let queued = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
            let current = std::sync::Mutex::new((recorder(), 0usize));
            queued
                .for_each_concurrent(EVENT_CONCURRENCY, |(event, reference)| {
                    let recorder = {
                        let mut current = current
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        if current.1 >= RECORDER_RENEWED_AFTER {
                            *current = (recorder(), 0);
                        }
                        current.1 += 1;
                        current.0.clone()
                    };
                    let results = &results;
                    let cordons_first = &cordons_first;
                    async move {
                        let event: KubeEvent = event;
                        let reference: ObjectReference = reference;
                        cordons_first.clear().await;
                        match recorder.publish(&event, &reference).await {
                            Ok(()) => results.with_label_values(&["posted"]).inc(),
                            Err(e) => {
                                results.with_label_values(&["failed"]).inc();
                                warn!(error = %e, reason = %event.reason, kind = ?reference.kind, name = ?reference.name, "Could not publish an Event");
                            }
                        }
                    }
                })
                .await;
        });
        (Self { queue, counted }, task)
    }

    /// Queues `event` about `reference`; drops it (counted as `dropped`,
    /// logged at debug) when the queue is full.
    pub fn post(&self, event: KubeEvent, reference: ObjectReference) {
        if let Err(e) = self.queue.try_send((event, reference)) {
            self.counted.with_label_values(&["dropped"]).inc();
            let (event, _) = match e {
                tokio::sync::mpsc::error::TrySendError::Full(x)
                | tokio::sync::mpsc::error::TrySendError::Closed(x) => x,
            };
            debug!(reason = %event.reason, "The queue of Events to post is full: dropped one");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_to_what_the_api_server_takes() {
        assert_eq!(within_note_limit("short".into()), "short");
        let exact = "x".repeat(NOTE_LIMIT);
        assert_eq!(within_note_limit(exact.clone()), exact);
        // Multi-byte characters across the limit are never split.
        let long = "é".repeat(NOTE_LIMIT);
        let cut = within_note_limit(long);
        assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.len() > NOTE_LIMIT - 8);
    }
}
