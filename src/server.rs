//! The HTTP endpoints every long-running role serves: `/metrics`
//! (Prometheus text format), `/healthz` (the process is alive) and `/readyz`
//! (the role has done its start-up work).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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

#[derive(Clone)]
struct AppState {
    registry: Registry,
    ready: Readiness,
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
/// bound address (port 0 picks a free one).
///
/// # Errors
/// When the address cannot be bound.
pub async fn spawn(
    addr: SocketAddr,
    registry: Registry,
    ready: Readiness,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { StatusCode::OK }))
        .route("/readyz", get(readyz))
        .with_state(AppState { registry, ready });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "Metrics server stopped");
        }
    });
    tracing::info!(addr = %bound, "Serving /metrics, /healthz and /readyz");
    Ok(bound)
}
