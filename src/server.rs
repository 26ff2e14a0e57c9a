//! The HTTP endpoints every long-running role serves: `/metrics`
//! (Prometheus text format), `/healthz` (the process is alive) and `/readyz`
//! (the role has done its start-up work).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

/// Set to true once the role is ready to do its job.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the role ready (or not).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }
    /// Whether the role is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// When a role's main loop last showed that it runs, and how long it may
/// then stay silent: `/healthz` fails once that is exceeded (the kubelet
/// restarts a process whose loop is stuck). Failures of what the loop talks
/// to (IMDS, the API server) do not count: restarting would not mend them.
#[derive(Clone, Debug)]
pub struct Liveness(Arc<LivenessInner>);

#[derive(Debug)]
struct LivenessInner {
    start: Instant,
    /// Milliseconds from `start` to the last beat.
    last: AtomicU64,
    /// Milliseconds the loop may stay silent after it.
    allowed: AtomicU64,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Liveness {
    /// Alive now, and for `allowed` without a beat.
    pub fn new(allowed: Duration) -> Self {
        let l = Liveness(Arc::new(LivenessInner {
            start: Instant::now(),
            last: AtomicU64::new(0),
            allowed: AtomicU64::new(0),
        }));
        l.beat(allowed);
        l
    }

    /// The loop runs now and will beat again within `allowed`.
    pub fn beat(&self, allowed: Duration) {
        self.0.allowed.store(millis(allowed), Ordering::Relaxed);
        self.0
            .last
            .store(millis(self.0.start.elapsed()), Ordering::Relaxed);
    }

    /// How long the loop has been silent beyond what it allowed itself,
    /// if it has.
    pub fn overdue(&self) -> Option<Duration> {
        let silent =
            millis(self.0.start.elapsed()).saturating_sub(self.0.last.load(Ordering::Relaxed));
        let over = silent.saturating_sub(self.0.allowed.load(Ordering::Relaxed));
        (over > 0).then(|| Duration::from_millis(over))
    }
}

#[derive(Clone)]
struct AppState {
    registry: Registry,
    ready: Readiness,
    live: Option<Liveness>,
}

async fn healthz(State(s): State<AppState>) -> (StatusCode, String) {
    match s.live.as_ref().and_then(Liveness::overdue) {
        None => (StatusCode::OK, "ok\n".into()),
        Some(over) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the main loop has not run for {over:?} longer than it allowed itself\n"),
        ),
    }
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    let mut buf = Vec::new();
    match TextEncoder::new().encode(&s.registry.gather(), &mut buf) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
            buf,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn readyz(State(s): State<AppState>) -> StatusCode {
    if s.ready.get() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// Binds `addr` and serves the endpoints in a background task. Returns the
/// bound address (port 0 picks a free one). `/healthz` follows `live` when
/// given, else answers 200 while the process serves.
///
/// # Errors
/// When the address cannot be bound.
pub async fn spawn(
    addr: SocketAddr,
    registry: Registry,
    ready: Readiness,
    live: Option<Liveness>,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            registry,
            ready,
            live,
        });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "Metrics server stopped");
        }
    });
    tracing::info!(addr = %bound, "Serving /metrics, /healthz and /readyz");
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_is_overdue_only_past_what_it_allowed_itself() {
        let l = Liveness::new(Duration::from_millis(50));
        assert_eq!(l.overdue(), None);
        std::thread::sleep(Duration::from_millis(80));
        assert!(l.overdue().is_some_and(|o| o >= Duration::from_millis(20)));
        l.beat(Duration::from_secs(60));
        assert_eq!(l.overdue(), None);
    }
}
