//! `forewarn imds-mock`: an imitation of IMDS for demos, tests and game days.
//!
//! It plays a [`Scenario`] for every VM of one placement group at once, each
//! VM under its own path prefix: `/vm/<name>/metadata/scheduledevents` and
//! `/vm/<name>/metadata/instance/compute`, so an agent's IMDS base URL is
//! `http://<listen>/vm/<name>`. Like the real service it answers 400 to a
//! request without `Metadata: true`, without `api-version`, or with
//! `X-Forwarded-For`; an approval `POST` moves a `Scheduled` event to
//! `Started` keeping its `EventId`, and `DocumentIncarnation` increases at
//! every change of a VM's document.
//!
//! With a root VM (`--root-vm NAME`) it also serves that VM at the root,
//! `/metadata/scheduledevents` and `/metadata/instance/compute`, as real IMDS
//! does at `http://169.254.169.254`: an agent then runs with its production
//! default URL (the real-node test, where the mock listens on that address).
//!
//! Control endpoints for harnesses: `POST /mock/start` starts the clock when
//! run with `--hold`; `GET /mock/log` returns what happened (approvals, every
//! status change and redeploy, with times); `GET /mock/requests` lists every
//! scheduled events request (VM, method, arrival, answer time and status),
//! the last [`MAX_REQUESTS`] of them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::model::StartRequests;
use super::scenario::{FaultKind, Phase, Scenario};

/// One line of the mock's log, as served by `GET /mock/log`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogEntry {
    /// When it happened.
    pub time: DateTime<Utc>,
    /// The `EventId`.
    pub event_id: String,
    /// `Approved` (a valid `StartRequests` entry), the event's new phase
    /// (`Scheduled`, `Started`, `Finished`, `Cancelled`, `Gone` while it
    /// flaps), or `Redeployed` (with an empty `eventId`).
    pub what: String,
    /// For `Approved`: the VM whose IMDS received the POST; for
    /// `Redeployed`: the VM redeployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
}

/// One scheduled events request, as served by `GET /mock/requests`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestEntry {
    /// Sequence number, from 0.
    pub seq: u64,
    /// When it arrived.
    pub arrived: DateTime<Utc>,
    /// When the answer was sent; `None` while in flight, or if the client
    /// gave up first (a timeout).
    pub answered: Option<DateTime<Utc>>,
    /// The VM whose IMDS it was sent to, as in the path.
    pub vm: String,
    /// `GET` or `POST`.
    pub method: String,
    /// The HTTP status answered; `None` while unanswered.
    pub status: Option<u16>,
}

/// How many requests `GET /mock/requests` keeps (the oldest are dropped).
pub const MAX_REQUESTS: usize = 100_000;

struct Clock {
    /// Monotonic start, and the wall-clock time it stands for.
    started: Option<(Instant, DateTime<Utc>)>,
}

#[derive(Default)]
struct VmDoc {
    incarnation: i64,
    /// What the last document listed: each event's index in the scenario
    /// and its phase (which, with the scenario, is all its entry says).
    last: Vec<(usize, Phase)>,
    /// The last document as sent, kept while what it lists is unchanged:
    /// a wave's 200 VMs each polling a document of 200 events once a
    /// second would otherwise have it rendered 200 times a second.
    body: Option<Bytes>,
    /// Whether its redeploy (if any) has happened.
    redeployed: bool,
    /// Whether its first request (and its delay, if any) has come.
    first_request_seen: bool,
}

struct Inner {
    scenario: Scenario,
    clock: Clock,
    /// First approval of each event, as an offset from the start.
    approvals: HashMap<String, Duration>,
    /// Last phase logged for each event.
    phases: HashMap<String, Phase>,
    docs: HashMap<String, VmDoc>,
    log: Vec<LogEntry>,
    requests: std::collections::VecDeque<RequestEntry>,
    next_seq: u64,
}

/// The mock's shared state.
#[derive(Clone)]
pub struct Mock {
    inner: Arc<Mutex<Inner>>,
    /// The VM served at the root paths, if any.
    root_vm: Option<String>,
}

impl Mock {
    /// A mock for `scenario`; its clock starts now unless `hold` is set, in
    /// which case it starts at `POST /mock/start`.
    pub fn new(scenario: Scenario, hold: bool) -> Self {
        let docs = scenario
            .vms
            .iter()
            .map(|v| {
                (
                    v.name.to_ascii_lowercase(),
                    VmDoc {
                        incarnation: 1,
                        ..VmDoc::default()
                    },
                )
            })
            .collect();
        let clock = Clock {
            started: (!hold).then(|| (Instant::now(), Utc::now())),
        };
        Mock {
            inner: Arc::new(Mutex::new(Inner {
                scenario,
                clock,
                approvals: HashMap::new(),
                phases: HashMap::new(),
                docs,
                log: Vec::new(),
                requests: std::collections::VecDeque::new(),
                next_seq: 0,
            })),
            root_vm: None,
        }
    }

    /// Also serves VM `vm` at the root paths (`/metadata/...`), as IMDS does
    /// for the VM that asks.
    #[must_use]
    pub fn with_root_vm(mut self, vm: Option<String>) -> Self {
        self.root_vm = vm;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the state half-written
        // in a way that matters to a mock; keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The HTTP routes.
    pub fn router(self) -> Router {
        let root = if self.root_vm.is_some() {
            Router::new()
                .route(
                    "/metadata/scheduledevents",
                    get(get_root_events).post(post_root_approval),
                )
                .route("/metadata/instance/compute", get(get_root_compute))
        } else {
            Router::new()
        };
        root.route(
            "/vm/{vm}/metadata/scheduledevents",
            get(get_events).post(post_approval),
        )
        .route("/vm/{vm}/metadata/instance/compute", get(get_compute))
        .route("/mock/start", post(start_clock))
        .route("/mock/log", get(get_log))
        .route("/mock/requests", get(get_requests))
        .with_state(self)
    }
}

impl Inner {
    fn elapsed(&self) -> Option<(Duration, DateTime<Utc>)> {
        self.clock.started.map(|(i, origin)| (i.elapsed(), origin))
    }

    /// Brings the log up to date with every event's phase.
    fn advance(&mut self, elapsed: Duration) {
        for ev in &self.scenario.events {
            let phase = ev.phase_at(elapsed, self.approvals.get(&ev.id).copied());
            let last = self.phases.get(&ev.id).copied().unwrap_or(Phase::NotYet);
            if phase != last {
                self.phases.insert(ev.id.clone(), phase);
                self.log.push(LogEntry {
                    time: Utc::now(),
                    event_id: ev.id.clone(),
                    what: format!("{phase:?}"),
                    vm: None,
                });
            }
        }
    }

    /// The scheduled events document `vm` is shown now, as JSON bytes; its
    /// `DocumentIncarnation` goes up each time what it lists changes.
    fn document(&mut self, vm: &str) -> Bytes {
        let elapsed = self.elapsed();
        let listed: Vec<(usize, Phase)> = match elapsed {
            None => Vec::new(),
            Some((elapsed, _)) => {
                self.advance(elapsed);
                self.scenario
                    .events
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.delivered_to(vm) && !e.gone_for(vm, elapsed))
                    .map(|(i, e)| (i, e.phase_at(elapsed, self.approvals.get(&e.id).copied())))
                    .filter(|(_, phase)| phase.is_listed())
                    .collect()
            }
        };
        let redeploy = self
            .scenario
            .vm(vm)
            .and_then(|v| v.redeploy_at)
            .zip(elapsed)
            .is_some_and(|(at, (e, _))| e >= at);
        let doc = self.docs.entry(vm.to_ascii_lowercase()).or_insert(VmDoc {
            incarnation: 1,
            ..VmDoc::default()
        });
        if redeploy && !doc.redeployed {
            // A redeployed VM's IMDS starts counting again.
            doc.redeployed = true;
            doc.incarnation = 1;
            doc.last = listed;
            doc.body = None;
            self.log.push(LogEntry {
                time: Utc::now(),
                event_id: String::new(),
                what: "Redeployed".into(),
                vm: Some(vm.to_string()),
            });
        } else if doc.last != listed {
            doc.incarnation += 1;
            doc.last = listed;
            doc.body = None;
        }
        if let Some(body) = &doc.body {
            return body.clone();
        }
        let origin = elapsed.map_or_else(Utc::now, |(_, origin)| origin);
        let events: Vec<serde_json::Value> = doc
            .last
            .iter()
            .filter_map(|(i, phase)| self.scenario.events.get(*i)?.render_json(*phase, origin))
            .collect();
        let body = Bytes::from(
            serde_json::to_vec(&serde_json::json!({
                "DocumentIncarnation": doc.incarnation,
                "Events": events,
            }))
            .unwrap_or_default(),
        );
        doc.body = Some(body.clone());
        body
    }

    /// Records the arrival of a scheduled events request; returns its number.
    fn arrive(&mut self, vm: &str, method: &str) -> u64 {
        if self.requests.len() >= MAX_REQUESTS {
            self.requests.pop_front();
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.requests.push_back(RequestEntry {
            seq,
            arrived: Utc::now(),
            answered: None,
            vm: vm.to_string(),
            method: method.into(),
            status: None,
        });
        seq
    }

    /// Records the answer to request `seq`.
    fn answer(&mut self, seq: u64, status: StatusCode) {
        if let Some(r) = self.requests.iter_mut().rev().find(|r| r.seq == seq) {
            r.answered = Some(Utc::now());
            r.status = Some(status.as_u16());
        }
    }
}

/// A 200 answer of JSON `body`.
fn json_body(body: Bytes) -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

fn bad_request(msg: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({"error": msg})),
    )
        .into_response()
}

/// Checks what real IMDS checks before anything else.
fn check_request(headers: &HeaderMap, query: &HashMap<String, String>) -> Option<Response> {
    let metadata_ok = headers
        .get("Metadata")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if !metadata_ok {
        return Some(bad_request(
            "Bad request. Required metadata header not specified",
        ));
    }
    if headers.contains_key("X-Forwarded-For") {
        return Some(bad_request(
            "Bad request. X-Forwarded-For header is not allowed",
        ));
    }
    if !query.contains_key("api-version") {
        return Some(bad_request(
            "Bad request. api-version was not specified in the request.",
        ));
    }
    None
}

async fn get_events(
    State(mock): State<Mock>,
    Path(vm): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let seq = mock.lock().arrive(&vm, "GET");
    let resp = answer_events(&mock, &vm, &query, &headers).await;
    mock.lock().answer(seq, resp.status());
    resp
}

async fn answer_events(
    mock: &Mock,
    vm: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Response {
    if let Some(r) = check_request(headers, query) {
        return r;
    }
    let delay = {
        let mut inner = mock.lock();
        let Some(v) = inner.scenario.vm(vm) else {
            return (StatusCode::NOT_FOUND, "no such VM in the scenario").into_response();
        };
        let delay = v.first_request_delay;
        let doc = inner.docs.entry(vm.to_ascii_lowercase()).or_insert(VmDoc {
            incarnation: 1,
            ..VmDoc::default()
        });
        let first = !doc.first_request_seen;
        doc.first_request_seen = true;
        delay.filter(|_| first)
    };
    if let Some(d) = delay {
        // The first call enables Scheduled Events for the VM (Azure: up to two minutes).
        tokio::time::sleep(d).await;
    }
    let fault = {
        let mut inner = mock.lock();
        let fault = inner
            .elapsed()
            .and_then(|(e, _)| inner.scenario.fault_at(vm, e).cloned());
        match fault {
            None => return json_body(inner.document(vm)),
            Some(f) => f,
        }
    };
    match fault.kind {
        FaultKind::Status500 => {
            (StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error").into_response()
        }
        FaultKind::Status429 => {
            (StatusCode::TOO_MANY_REQUESTS, "Too many requests").into_response()
        }
        FaultKind::Garbage => {
            (StatusCode::OK, "{\"DocumentIncarnation\": <html>garbage").into_response()
        }
        FaultKind::NullEvents => (
            StatusCode::OK,
            "{\"DocumentIncarnation\": 99, \"Events\": null}",
        )
            .into_response(),
        FaultKind::Slow => {
            tokio::time::sleep(fault.delay).await;
            json_body(mock.lock().document(vm))
        }
        FaultKind::Hang => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            (StatusCode::GATEWAY_TIMEOUT, "hung").into_response()
        }
    }
}

async fn post_approval(
    State(mock): State<Mock>,
    Path(vm): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let seq = mock.lock().arrive(&vm, "POST");
    let resp = answer_approval(&mock, &vm, &query, &headers, &body);
    let delay = mock
        .lock()
        .scenario
        .vm(&vm)
        .and_then(|v| v.approval_answer_delay);
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    mock.lock().answer(seq, resp.status());
    resp
}

fn answer_approval(
    mock: &Mock,
    vm: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    if let Some(r) = check_request(headers, query) {
        return r;
    }
    let Ok(req) = serde_json::from_slice::<StartRequests>(body) else {
        return bad_request("Bad request. Malformed StartRequests body");
    };
    let mut inner = mock.lock();
    if inner.scenario.vm(vm).is_none() {
        return (StatusCode::NOT_FOUND, "no such VM in the scenario").into_response();
    }
    let Some((elapsed, _)) = inner.elapsed() else {
        return bad_request("Bad request. No such event");
    };
    inner.advance(elapsed);
    for r in &req.start_requests {
        let Some(ev) = inner
            .scenario
            .events
            .iter()
            .find(|e| e.id.eq_ignore_ascii_case(&r.event_id))
            .cloned()
        else {
            return bad_request(&format!("Bad request. Unknown EventId {}", r.event_id));
        };
        let phase = ev.phase_at(elapsed, inner.approvals.get(&ev.id).copied());
        if !ev.delivered_to(vm) || !phase.is_listed() {
            return bad_request(&format!("Bad request. Unknown EventId {}", r.event_id));
        }
        inner.approvals.entry(ev.id.clone()).or_insert(elapsed);
        inner.log.push(LogEntry {
            time: Utc::now(),
            event_id: ev.id.clone(),
            what: "Approved".into(),
            vm: Some(vm.to_string()),
        });
    }
    inner.advance(elapsed);
    StatusCode::OK.into_response()
}

async fn get_compute(
    State(mock): State<Mock>,
    Path(vm): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = check_request(&headers, &query) {
        return r;
    }
    let inner = mock.lock();
    match inner.scenario.vm(&vm) {
        None => (StatusCode::NOT_FOUND, "no such VM in the scenario").into_response(),
        Some(v) => {
            let scale_set = v.name.rsplit_once('_').map(|(s, _)| s).unwrap_or("");
            Json(serde_json::json!({
                "name": v.name,
                "vmScaleSetName": scale_set,
                "platformFaultDomain": v.fault_domain.to_string(),
                "platformUpdateDomain": v.update_domain.to_string(),
                "azEnvironment": "AzurePublicCloud",
            }))
            .into_response()
        }
    }
}

/// The root VM's name (the root routes exist only when it is set).
fn root_vm(mock: &Mock) -> Path<String> {
    Path(mock.root_vm.clone().unwrap_or_default())
}

async fn get_root_events(
    State(mock): State<Mock>,
    query: Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let vm = root_vm(&mock);
    get_events(State(mock), vm, query, headers).await
}

async fn post_root_approval(
    State(mock): State<Mock>,
    query: Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let vm = root_vm(&mock);
    post_approval(State(mock), vm, query, headers, body).await
}

async fn get_root_compute(
    State(mock): State<Mock>,
    query: Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let vm = root_vm(&mock);
    get_compute(State(mock), vm, query, headers).await
}

async fn start_clock(State(mock): State<Mock>) -> StatusCode {
    let mut inner = mock.lock();
    if inner.clock.started.is_none() {
        inner.clock.started = Some((Instant::now(), Utc::now()));
    }
    StatusCode::OK
}

async fn get_log(State(mock): State<Mock>) -> Json<Vec<LogEntry>> {
    let mut inner = mock.lock();
    if let Some((elapsed, _)) = inner.elapsed() {
        inner.advance(elapsed);
    }
    Json(inner.log.clone())
}

async fn get_requests(State(mock): State<Mock>) -> Json<Vec<RequestEntry>> {
    Json(mock.lock().requests.iter().cloned().collect())
}

/// Serves `scenario` on `listen` until `shutdown` resolves, with `root_vm`
/// also at the root paths (see the module docs). Prints
/// `listening on http://<addr>` on stdout once bound (port 0 picks a free one).
///
/// # Errors
/// When the address cannot be bound or the server fails.
pub async fn serve(
    scenario: Scenario,
    listen: SocketAddr,
    hold: bool,
    root_vm: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    tracing::info!(%addr, vms = scenario.vms.len(), events = scenario.events.len(), hold, "IMDS mock listening");
    let app = Mock::new(scenario, hold).with_root_vm(root_vm).router();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
