//! Leader election on one `coordination.k8s.io/v1` Lease, the way client-go's
//! `leaderelection` package does it:
//!
//! - every write is a replace carrying the `resourceVersion` that was read,
//!   so of two replicas racing for a free Lease exactly one wins (the other
//!   gets 409 Conflict) and nobody ever overwrites a holder it has not seen;
//! - a Lease held by another replica counts as expired only when its record
//!   (holder, `renewTime`, duration) has not changed for
//!   `leaseDurationSeconds` on this process's own monotonic clock, never by
//!   comparing its `renewTime` with our wall clock, so clock skew between
//!   nodes cannot make two leaders;
//! - a leader stops acting once it has not renewed for the renew deadline,
//!   which is shorter than the duration a standby waits.
//!
//! The election runs on a thread of its own with its own runtime and its
//! own Kubernetes client ([`spawn`]), so that reconciles keeping the main
//! runtime busy can never delay a renewal; and every write the controller
//! sends passes [`WritesWhileLeading`], which refuses it unless the last
//! renewal is younger than the renew deadline ([`Validity`]). A process
//! paused past its lease (SIGSTOP, a stalled VM) and resumed sends no write:
//! its clock shows the validity passed before any request is sent.
//!
//! We write this ourselves because kube-lease-manager 0.13 releases a Lease
//! without a precondition: a standby dropping its manager, or "releasing an
//! expired lock" judged from a stale read or a skewed `renewTime`, cleared
//! the live leader's `holderIdentity` and then acquired it, so two replicas
//! led at once (seen in CI, `tests/leader.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::client::Body;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How the election is timed (client-go's `LeaseDuration`, `RenewDeadline`,
/// `RetryPeriod`; its defaults 15 s, 10 s, 2 s).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// A standby takes over a Lease whose record has not changed for this
    /// long (written to the Lease as `leaseDurationSeconds`, whole seconds).
    pub duration: Duration,
    /// A leader that has not renewed for this long stops acting. Must be
    /// shorter than `duration`, with room for one request.
    pub renew_deadline: Duration,
    /// The pause between two attempts to acquire or renew.
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The holder record last read, and when this process first saw it.
#[derive(Debug)]
struct Observed {
    holder: String,
    renew_time: Option<MicroTime>,
    duration_seconds: Option<i32>,
    at: Instant,
}

/// One replica's side of the election.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    observed: Option<Observed>,
    /// When the last write of our record that succeeded was sent.
    renewed: Option<Instant>,
}

/// What one attempt to acquire or renew found.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the Lease: it was written with our identity.
    Held,
    /// Another replica holds it and its record is still fresh.
    HeldBy(String),
    /// The write lost a race (409 Conflict) or the Lease was created by
    /// another replica first: read again next time.
    Raced,
}

impl Elector {
    /// An elector for the Lease `name` in `api`'s namespace, as `identity`.
    pub fn new(api: Api<Lease>, name: &str, identity: &str, timing: Timing) -> Self {
        Elector {
            api,
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            observed: None,
            renewed: None,
        }
    }

    /// Waits until this replica holds the Lease. Tries every retry period,
    /// and at once when a watch on the Lease shows it released; API errors
    /// are logged and retried, never returned.
    pub async fn acquire(&mut self) {
        let released = releases(self.api.clone(), self.name.clone());
        futures::pin_mut!(released);
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => {
                    info!(identity = %self.identity, lease = %self.name, "Acquired the leader-election Lease");
                    return;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    debug!(%holder, "The Lease is held by another replica")
                }
                Ok(Attempt::Raced) => debug!("Lost a race for the Lease; reading it again"),
                Err(e) => warn!(error = %e, "Cannot read or write the leader-election Lease yet"),
            }
            tokio::select! {
                () = tokio::time::sleep(self.timing.retry_period) => {}
                Some(()) = released.next() => info!("The Lease was released: asking for it now"),
            }
        }
    }

    /// Renews the Lease every retry period while this replica holds it;
    /// returns, with the reason, when it must stop acting as leader: another
    /// replica holds the Lease, or no renewal succeeded for the renew
    /// deadline (counted from the start of the last successful request, so
    /// the server's copy is never older than we think).
    pub async fn hold(&mut self, validity: &Validity) -> String {
        loop {
            if let Some(renewed) = self.renewed {
                validity.set_until(renewed + self.timing.renew_deadline);
            }
            tokio::time::sleep(self.timing.retry_period).await;
            let Some(renewed) = self.renewed else {
                return "this replica never held the Lease".into();
            };
            let deadline = renewed + self.timing.renew_deadline;
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Held)) => {}
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    return format!("the Lease is held by {holder}");
                }
                Ok(Ok(Attempt::Raced)) => {
                    debug!("A renewal raced another write; trying again")
                }
                Ok(Err(e)) => warn!(error = %e, "Cannot renew the leader-election Lease"),
                Err(_) => {}
            }
            if Instant::now() >= deadline {
                return format!(
                    "no renewal succeeded for {:?} (renew deadline)",
                    self.timing.renew_deadline
                );
            }
        }
    }

    /// Gives the Lease up if this replica still holds it, so that a standby
    /// takes over at once: the holder is cleared and the duration set to
    /// 1 s, by a replace conditional on the `resourceVersion` just read.
    /// Returns whether it released anything.
    ///
    /// # Errors
    /// The Lease cannot be read or written (a standby then takes over once
    /// the duration has passed).
    pub async fn release(&mut self) -> Result<bool, kube::Error> {
        let lease = self.api.get(&self.name).await?;
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(false);
        }
        let now = MicroTime(Timestamp::now());
        let released = Lease {
            metadata: lease.metadata,
            spec: Some(LeaseSpec {
                holder_identity: None,
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..spec
            }),
        };
        self.api
            .replace(&self.name, &PostParams::default(), &released)
            .await?;
        Ok(true)
    }

    /// One step of client-go's `tryAcquireOrRenew`: read; if another
    /// holder's record is fresh, stop; else write our record with the
    /// `resourceVersion` read (or create the Lease).
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let started = Instant::now();
        let now = MicroTime(Timestamp::now());
        let duration_seconds = i32::try_from(self.timing.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration_seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            let created = self.api.create(&PostParams::default(), &lease).await;
            return self.wrote(created, started);
        };
        self.observe(&lease);
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.identity;
        if !holder.is_empty() && !ours && self.fresh() {
            return Ok(Attempt::HeldBy(holder));
        }
        let record = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(duration_seconds),
            acquire_time: if ours {
                spec.acquire_time.clone()
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: if ours {
                spec.lease_transitions
            } else {
                Some(spec.lease_transitions.unwrap_or(0).saturating_add(1))
            },
            ..spec
        };
        let update = Lease {
            metadata: lease.metadata,
            spec: Some(record),
        };
        let replaced = self
            .api
            .replace(&self.name, &PostParams::default(), &update)
            .await;
        self.wrote(replaced, started)
    }

    /// The outcome of a write of our record sent at `started`: held (the
    /// record observed, the renewal timed from `started`), or a lost race
    /// (409: another replica created or wrote it first).
    fn wrote(
        &mut self,
        written: Result<Lease, kube::Error>,
        started: Instant,
    ) -> Result<Attempt, kube::Error> {
        match written {
            Ok(lease) => {
                self.observe(&lease);
                self.renewed = Some(started);
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Raced),
            Err(e) => Err(e),
        }
    }

    /// Records `lease`'s holder record, restarting the clock when it changed.
    fn observe(&mut self, lease: &Lease) {
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.unwrap_or_default();
        let same = self.observed.as_ref().is_some_and(|o| {
            o.holder == holder
                && o.renew_time == spec.renew_time
                && o.duration_seconds == spec.lease_duration_seconds
        });
        if !same {
            self.observed = Some(Observed {
                holder,
                renew_time: spec.renew_time,
                duration_seconds: spec.lease_duration_seconds,
                at: Instant::now(),
            });
        }
    }

    /// Whether the record last observed is younger than its own duration
    /// (or ours when it names none), on this process's clock.
    fn fresh(&self) -> bool {
        self.observed.as_ref().is_some_and(|o| {
            let secs = o
                .duration_seconds
                .and_then(|d| u64::try_from(d).ok())
                .map_or(self.timing.duration, Duration::from_secs);
            o.at.elapsed() < secs
        })
    }
}

/// Yields once each time the Lease `name` is seen with no holder (its leader
/// released it), from a watch on that one object.
fn releases(api: Api<Lease>, name: String) -> impl futures::Stream<Item = ()> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watcher(api, config)
        .backoff(crate::controller::observe::watch::watch_backoff())
        .applied_objects()
        .filter_map(|item| async move {
            let lease = item.ok()?;
            let free = lease
                .spec
                .and_then(|s| s.holder_identity)
                .is_none_or(|h| h.is_empty());
            free.then_some(())
        })
}

/// Until when this process may write as the leader: the start of its last
/// successful renewal plus the renew deadline, on its own monotonic clock.
/// Shared by the election thread (which sets it) and the write guard (which
/// reads it); a process that never led, or lost the Lease, may not write.
#[derive(Clone, Debug)]
pub struct Validity(Arc<ValidityInner>);

#[derive(Debug)]
struct ValidityInner {
    origin: Instant,
    /// Milliseconds from `origin`; 0: not leading.
    until: AtomicU64,
}

impl Default for Validity {
    fn default() -> Self {
        Validity(Arc::new(ValidityInner {
            origin: Instant::now(),
            until: AtomicU64::new(0),
        }))
    }
}

impl Validity {
    fn set_until(&self, until: Instant) {
        let ms = u64::try_from(until.saturating_duration_since(self.0.origin).as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.0.until.store(ms, Ordering::SeqCst);
    }

    /// Leading for `d` from now (tests of the writes' guard).
    #[cfg(test)]
    pub fn leading_for(&self, d: Duration) {
        self.set_until(Instant::now() + d);
    }

    /// No longer leading.
    pub fn clear(&self) {
        self.0.until.store(0, Ordering::SeqCst);
    }

    /// Whether this process holds a Lease renewed within the renew deadline.
    pub fn valid(&self) -> bool {
        let now = u64::try_from(self.0.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        now < self.0.until.load(Ordering::SeqCst)
    }
}

/// The error a write gets when this process may not write as the leader.
#[derive(Debug, thiserror::Error)]
#[error(
    "refused to send {method} {path}: this process has not renewed the leader-election Lease within the renew deadline"
)]
pub struct NotLeading {
    method: http::Method,
    path: String,
}

/// A tower layer that refuses every request but `GET` (reads, lists and
/// watches) unless [`Validity::valid`]: no write of a process that is not
/// the leader (any longer) reaches the API server, whichever code path
/// sends it.
#[derive(Clone, Debug)]
pub struct WritesWhileLeading(pub Validity);

impl<S> tower::Layer<S> for WritesWhileLeading {
    type Service = GuardedWrites<S>;
    fn layer(&self, inner: S) -> Self::Service {
        GuardedWrites {
            inner,
            validity: self.0.clone(),
        }
    }
}

/// The service of [`WritesWhileLeading`].
#[derive(Clone, Debug)]
pub struct GuardedWrites<S> {
    inner: S,
    validity: Validity,
}

impl<S, B> tower::Service<http::Request<Body>> for GuardedWrites<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    /// Checked when the request is handed over and again when it is first
    /// polled, the moment the client begins to send it: a process stopped
    /// between the two (SIGSTOP, a stalled VM) sends nothing once resumed
    /// past its Lease. A request already being sent when the process
    /// stopped is sent when it resumes: no client can recall it.
    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let write = req.method() != http::Method::GET;
        let refused = NotLeading {
            method: req.method().clone(),
            path: req.uri().path().to_owned(),
        };
        if write && !self.validity.valid() {
            return Box::pin(async move { Err(refused.into()) });
        }
        let validity = self.validity.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            if write && !validity.valid() {
                return Err(refused.into());
            }
            fut.await.map_err(Into::into)
        })
    }
}

/// Where the election stands, as the election thread publishes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// Waiting for the Lease.
    Standby,
    /// Holding it.
    Leading,
    /// Lost it (or could not run the election), with the reason.
    Lost(String),
}

/// The election thread, seen from the rest of the process.
pub struct Election {
    /// Until when this process may write as the leader.
    pub validity: Validity,
    /// Where the election stands.
    pub state: watch::Receiver<Leadership>,
    release: Option<oneshot::Sender<oneshot::Sender<bool>>>,
}

impl Election {
    /// Stops the election and, if this process still holds the Lease,
    /// releases it (a standby takes over at once instead of after the
    /// duration); returns whether it released it.
    pub async fn release(mut self) -> bool {
        self.validity.clear();
        let Some(tx) = self.release.take() else {
            return false;
        };
        let (done_tx, done) = oneshot::channel();
        if tx.send(done_tx).is_err() {
            return false;
        }
        tokio::time::timeout(Duration::from_secs(5), done)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(false)
    }
}

/// Runs the election for the Lease `namespace/name` as `identity` on a
/// thread of its own, with its own single-threaded runtime and a client
/// built there from `config` (kube's client runs its connection tasks on the
/// runtime that built it, so one built on the main runtime would wait for
/// it).
///
/// # Errors
/// The thread cannot be started.
pub fn spawn(
    config: kube::Config,
    namespace: &str,
    name: &str,
    identity: &str,
    timing: Timing,
) -> std::io::Result<Election> {
    let validity = Validity::default();
    let (state_tx, state) = watch::channel(Leadership::Standby);
    let (release, mut release_rx) = oneshot::channel::<oneshot::Sender<bool>>();
    let (namespace, name, identity) = (namespace.to_owned(), name.to_owned(), identity.to_owned());
    let shared = validity.clone();
    std::thread::Builder::new()
        .name("lease".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = state_tx.send(Leadership::Lost(format!("cannot start the election's runtime: {e}")));
                    return;
                }
            };
            rt.block_on(async move {
                let client = match kube::Client::try_from(config) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = state_tx.send(Leadership::Lost(format!("cannot build the election's client: {e}")));
                        return;
                    }
                };
                let mut elector = Elector::new(Api::namespaced(client, &namespace), &name, &identity, timing);
                tokio::select! {
                    () = elector.acquire() => {}
                    r = &mut release_rx => {
                        if let Ok(done) = r { let _ = done.send(false); }
                        return;
                    }
                }
                // Valid from the acquiring write on, before anyone is told.
                if let Some(renewed) = elector.renewed {
                    shared.set_until(renewed + timing.renew_deadline);
                }
                let _ = state_tx.send(Leadership::Leading);
                let lost = tokio::select! {
                    why = elector.hold(&shared) => Some(why),
                    r = &mut release_rx => {
                        shared.clear();
                        let released = match elector.release().await {
                            Ok(r) => r,
                            Err(e) => {
                                warn!(error = %e, "Could not release the Lease; a standby takes over when it expires");
                                false
                            }
                        };
                        if let Ok(done) = r { let _ = done.send(released); }
                        None
                    }
                };
                if let Some(why) = lost {
                    shared.clear();
                    let _ = state_tx.send(Leadership::Lost(why));
                    // Nothing to release: the Lease is another's, or was not
                    // renewed; answer the release request when it comes.
                    if let Ok(done) = release_rx.await {
                        let _ = done.send(false);
                    }
                }
            });
        })?;
    Ok(Election {
        validity,
        state,
        release: Some(release),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tower::{Layer as _, Service as _};

    /// A write handed over while the Lease is valid, and first polled once
    /// it is not (the process was stopped in between), is never given to
    /// the client below: nothing is sent.
    #[tokio::test]
    async fn a_write_first_polled_after_the_lease_lapsed_is_not_sent() {
        let validity = Validity::default();
        validity.leading_for(Duration::from_secs(60));
        let sent = Arc::new(AtomicUsize::new(0));
        let inner = {
            let sent = sent.clone();
            tower::service_fn(move |_req: http::Request<Body>| {
                let sent = sent.clone();
                async move {
                    sent.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::convert::Infallible>(http::Response::new(()))
                }
            })
        };
        let mut guarded = WritesWhileLeading(validity.clone()).layer(inner);
        let req = || {
            http::Request::builder()
                .method(http::Method::PATCH)
                .uri("/api/v1/nodes/n")
                .body(Body::empty())
                .unwrap()
        };
        std::future::poll_fn(|cx| guarded.poll_ready(cx))
            .await
            .unwrap();
        let handed_over = guarded.call(req());
        validity.clear();
        let refused = handed_over.await.expect_err("refused");
        assert!(refused.to_string().contains("renew"), "{refused}");
        assert_eq!(sent.load(Ordering::SeqCst), 0);
        // Valid again: handed over and sent.
        validity.leading_for(Duration::from_secs(60));
        guarded.call(req()).await.expect("sent");
        assert_eq!(sent.load(Ordering::SeqCst), 1);
    }
}
