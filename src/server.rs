//! The HTTP endpoints every long-running role serves: `/metrics`
//! (Prometheus text format; open, or for reviewed bearer tokens only:
//! [`Access`]), `/healthz` (the process is alive) and `/readyz` (the role
//! has done its start-up work), both always open (the kubelet's probes send
//! no token).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::metrics_auth::{Outcome, TokenReviewer, Verdict};

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

/// Who may read `/metrics` (`--metrics-auth`).
#[derive(Clone)]
pub enum Access {
    /// Anyone who reaches the port.
    Open,
    /// Requests whose bearer token the API server authenticates and allows
    /// `get` on `/metrics` ([`crate::metrics_auth`]): else 401, 403 or 503.
    Reviewed(Arc<TokenReviewer>),
}

impl Access {
    /// The access of `mode`: with `kubernetes`, tokens reviewed through
    /// `client` (the process's request client), outcomes counted in
    /// `outcomes` ([`crate::metrics_auth::outcome_counter`]).
    pub fn new(
        mode: crate::cli::MetricsAuth,
        client: &kube::Client,
        outcomes: &prometheus::IntCounterVec,
    ) -> Self {
        match mode {
            crate::cli::MetricsAuth::None => Access::Open,
            crate::cli::MetricsAuth::Kubernetes => Access::Reviewed(Arc::new(TokenReviewer::new(
                client.clone(),
                outcomes.clone(),
            ))),
        }
    }
}

#[derive(Clone)]
struct AppState {
    registry: Registry,
    ready: Readiness,
    live: Option<Liveness>,
    access: Access,
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

/// The refusal of a request to `/metrics` that [`Access`] does not let
/// through: 401 (with `WWW-Authenticate: Bearer`, RFC 6750 §3) without an
/// authenticated token, 403 when the user may not `get` `/metrics`, 503
/// when the API server could not be asked. The bodies name no user and no
/// error detail (the log has them).
fn refusal(outcome: &Outcome) -> Option<axum::response::Response> {
    let unauthorized = || {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "Unauthorized: send a bearer token the Kubernetes API server authenticates\n",
        )
            .into_response()
    };
    match outcome {
        Outcome::Verdict {
            verdict: Verdict::Allowed,
            ..
        } => None,
        Outcome::NoToken
        | Outcome::Verdict {
            verdict: Verdict::Unauthenticated,
            ..
        } => Some(unauthorized()),
        Outcome::Verdict {
            verdict: Verdict::Denied,
            ..
        } => Some(
            (
                StatusCode::FORBIDDEN,
                "Forbidden: this user may not get the non-resource URL /metrics\n",
            )
                .into_response(),
        ),
        Outcome::Unavailable(e) => {
            tracing::warn!(error = %e, "/metrics refused (503): the scraper's token could not be reviewed");
            Some(
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Service Unavailable: the token could not be reviewed by the Kubernetes API server\n",
                )
                    .into_response(),
            )
        }
    }
}

async fn metrics(State(s): State<AppState>, headers: HeaderMap) -> impl IntoResponse {
    if let Access::Reviewed(reviewer) = &s.access
        && let Some(refused) = refusal(&reviewer.check(&headers).await)
    {
        return refused;
    }
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
/// given, else answers 200 while the process serves; `/metrics` answers as
/// `access` allows.
///
/// # Errors
/// When the address cannot be bound.
pub async fn spawn(
    addr: SocketAddr,
    registry: Registry,
    ready: Readiness,
    live: Option<Liveness>,
    access: Access,
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
            access: access.clone(),
        });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "Metrics server stopped");
        }
    });
    // `addr` last: the harness reads the port from the end of this line.
    let auth = match access {
        Access::Open => "none",
        Access::Reviewed(_) => "kubernetes",
    };
    tracing::info!(metrics_auth = auth, addr = %bound, "Serving /metrics, /healthz and /readyz");
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_is_overdue_only_past_what_it_allowed_itself() {
        // Within what it allowed itself: 60 s, which no pause of this
        // thread reaches (a 50 ms allowance could be, on a loaded machine,
        // between `new` and `overdue`).
        let l = Liveness::new(Duration::from_secs(60));
        assert_eq!(l.overdue(), None);
        // Past it: silent at least 80 ms with 50 ms allowed (a longer
        // pause only makes it more overdue).
        let l = Liveness::new(Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(80));
        assert!(l.overdue().is_some_and(|o| o >= Duration::from_millis(20)));
        l.beat(Duration::from_secs(60));
        assert_eq!(l.overdue(), None);
    }

    /// Under `--metrics-auth kubernetes` with an API server that cannot be
    /// reached (nothing listens on its port): no token is 401 with the
    /// challenge, a token that cannot be reviewed is 503 (never the
    /// metrics), and the probes stay open. The outcomes are counted.
    #[tokio::test]
    async fn reviewed_metrics_refuse_without_a_token_and_when_the_api_server_is_away() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let api = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let mut config = kube::Config::new(api.parse().unwrap());
        config.connect_timeout = Some(Duration::from_secs(1));
        let client = kube::Client::try_from(config).unwrap();
        let outcomes = crate::metrics_auth::outcome_counter("agent").unwrap();
        let access = Access::new(crate::cli::MetricsAuth::Kubernetes, &client, &outcomes);
        let registry = Registry::new();
        registry.register(Box::new(outcomes.clone())).unwrap();
        let ready = Readiness::default();
        ready.set(true);
        let addr = spawn(
            "127.0.0.1:0".parse().unwrap(),
            registry,
            ready,
            None,
            access,
        )
        .await
        .unwrap();
        let http = crate::http::client_builder().no_proxy().build().unwrap();
        let get = |path: &str, auth: Option<&str>| {
            let mut r = http.get(format!("http://{addr}{path}"));
            if let Some(a) = auth {
                r = r.header("Authorization", a);
            }
            r.send()
        };
        let r = get("/metrics", None).await.unwrap();
        assert_eq!(r.status(), 401);
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        let r = get("/metrics", Some("Basic dXNlcjpwYXNz")).await.unwrap();
        assert_eq!(r.status(), 401);
        let r = get("/metrics", Some("Bearer abc.def")).await.unwrap();
        assert_eq!(r.status(), 503);
        assert!(!r.text().await.unwrap().contains("forewarn_"));
        assert_eq!(get("/healthz", None).await.unwrap().status(), 200);
        assert_eq!(get("/readyz", None).await.unwrap().status(), 200);
        let count = |result: &str| outcomes.with_label_values(&[result, "false"]).get();
        assert_eq!((count("no_token"), count("unavailable")), (2, 1));
    }

    /// Without `--metrics-auth`, `/metrics` ignores any token.
    #[tokio::test]
    async fn open_metrics_serve_anyone() {
        let registry = Registry::new();
        let c = prometheus::IntCounter::new("forewarn_test_total", "a test").unwrap();
        registry.register(Box::new(c)).unwrap();
        let addr = spawn(
            "127.0.0.1:0".parse().unwrap(),
            registry,
            Readiness::default(),
            None,
            Access::Open,
        )
        .await
        .unwrap();
        let http = crate::http::client_builder().no_proxy().build().unwrap();
        let r = http
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.text().await.unwrap().contains("forewarn_test_total 0"));
    }
}
