//! The agent's IMDS poll loop: one `GET /metadata/scheduledevents` per
//! interval (Azure recommends once a second), each bounded by the IMDS
//! client's timeout. It publishes each new document on a channel that keeps
//! only the latest, and waits for nothing else: the report writer and the
//! approval sender read the document when they are free.
//!
//! When IMDS asks to slow down (429, 410, 5xx, no answer) the loop backs off
//! exponentially with jitter up to `--imds-max-backoff`, keeping the last
//! good document. Each pass beats the agent's [`Liveness`], which `/healthz`
//! reports.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use chrono::Utc;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tracing::{info, warn};

use super::{error_chain, imds_result};
use crate::cli::AgentArgs;
use crate::imds::client::{Client as ImdsClient, parse_events};
use crate::imds::model::Document;
use crate::metrics::agent::AgentMetrics;
use crate::server::Liveness;

/// How long the poll loop may stay silent, given its longest request
/// `timeout` and its `interval`, before `/healthz` fails: the request plus
/// five intervals.
pub fn silence_allowed(timeout: Duration, interval: Duration) -> Duration {
    timeout + interval * 5
}

/// The poll loop's state.
pub struct Poller {
    imds: ImdsClient,
    metrics: AgentMetrics,
    interval: Duration,
    /// The longest request, for [`silence_allowed`].
    longest: Duration,
    backoff_policy: ExponentialBuilder,
    /// The longest pause between polls while backing off.
    max_backoff: Duration,
    /// While IMDS asks to slow down: the delays still to come, and the
    /// earliest time of the next poll.
    backoff: Option<(ExponentialBackoff, Instant)>,
    /// The last document IMDS served.
    last: Option<Arc<Document>>,
    /// Its bytes: the same bytes again are the same document, not parsed
    /// again (IMDS answers every poll, most of them unchanged).
    last_body: Option<bytes::Bytes>,
    /// Object names whose unparsable `NotBefore` has been warned about
    /// (only events the current document lists).
    warned_not_before: HashSet<String>,
    docs: watch::Sender<Option<Arc<Document>>>,
    live: Liveness,
}

impl Poller {
    /// A poll loop with the agent's flags, publishing on `docs`.
    pub fn new(
        args: &AgentArgs,
        imds: ImdsClient,
        metrics: AgentMetrics,
        docs: watch::Sender<Option<Arc<Document>>>,
        live: Liveness,
    ) -> Self {
        let max_backoff = args.imds_max_backoff.max(args.poll_interval);
        Poller {
            imds,
            metrics,
            interval: args.poll_interval,
            longest: args.imds_first_timeout.max(args.imds_timeout),
            backoff_policy: ExponentialBuilder::default()
                .with_min_delay(args.poll_interval)
                .with_max_delay(max_backoff)
                .with_jitter()
                .without_max_times(),
            max_backoff,
            backoff: None,
            last: None,
            last_body: None,
            warned_not_before: HashSet::new(),
            docs,
            live,
        }
    }

    /// Polls until the task is aborted.
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.live.beat(silence_allowed(self.longest, self.interval));
            self.poll().await;
        }
    }

    async fn poll(&mut self) {
        if let Some((_, until)) = &self.backoff
            && Instant::now() < *until
        {
            return;
        }
        let asked = Instant::now();
        let fetched = match self.imds.fetch_events_body().await {
            Ok(body) if self.last_body.as_ref() == Some(&body) => Ok(None),
            Ok(body) => parse_events(&body).map(|doc| Some((doc, body))),
            Err(e) => Err(e),
        };
        let took = asked.elapsed().as_secs_f64();
        let fetched = match fetched {
            Ok(fetched) => fetched,
            Err(e) => {
                self.metrics.imds_request(imds_result(&e), took);
                // Keep the last good state; try again on the next tick, or
                // after a pause when IMDS asks for one.
                if e.wants_backoff() {
                    let (delays, until) = self
                        .backoff
                        .get_or_insert_with(|| (self.backoff_policy.build(), Instant::now()));
                    // Jitter may double a delay; never pause longer than the maximum.
                    let delay = delays
                        .next()
                        .unwrap_or(self.max_backoff)
                        .min(self.max_backoff);
                    *until = Instant::now() + delay;
                    self.metrics.backoffs.inc();
                    warn!(error = %error_chain(&e), retry_in = ?delay, "IMDS poll failed; backing off and keeping the last good document");
                } else {
                    warn!(error = %error_chain(&e), "IMDS poll failed; keeping the last good document");
                }
                return;
            }
        };
        if self.backoff.take().is_some() {
            info!("IMDS answers again; polling at the normal interval");
        }
        let Some((doc, body)) = fetched else {
            self.metrics.imds_request("unchanged", took);
            self.metrics.imds_last_success.set(Utc::now().timestamp());
            return;
        };
        self.last_body = Some(body);
        self.metrics.events.set(doc.events.len() as i64);
        let changed = self.last.as_ref().is_none_or(|d| {
            d.incarnation != doc.incarnation || d.events != doc.events || d.rejected != doc.rejected
        });
        self.metrics
            .imds_request(if changed { "ok" } else { "unchanged" }, took);
        self.metrics.imds_last_success.set(Utc::now().timestamp());
        if !changed {
            return;
        }
        info!(
            incarnation = doc.incarnation,
            events = doc.events.len(),
            rejected = doc.rejected.len(),
            "IMDS document changed"
        );
        for r in &doc.rejected {
            self.metrics.events_rejected.inc();
            warn!(index = r.index, event_id = ?r.event_id, bytes = %r.bytes, reason = %r.reason,
                "Rejected a malformed entry of the IMDS document; reporting the other events");
        }
        // Warned once per event while it is listed with an odd NotBefore.
        self.warned_not_before.retain(|name| {
            doc.events
                .iter()
                .any(|e| e.not_before_unparsed.is_some() && e.object_name() == *name)
        });
        for ev in &doc.events {
            if let Some(text) = &ev.not_before_unparsed
                && self.warned_not_before.insert(ev.object_name())
            {
                warn!(event = %ev.event_id, not_before = %text, "Ignoring NotBefore in an unknown format");
            }
        }
        let doc = Arc::new(doc);
        self.last = Some(doc.clone());
        self.docs.send_replace(Some(doc));
    }
}
