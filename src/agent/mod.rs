//! The per-node agent: polls this VM's IMDS once a second, reports every
//! event in its own `ScheduledEventReport` (its only write; see
//! [`event_reports`]), and carries out the approvals the controller decided,
//! only while its own document lists the event as decided (see
//! [`approval`]).
//!
//! At start it also reports its VM's fault and update domain, once, in its
//! own `VirtualMachineReport` ([`vm_report`]).
//!
//! Polling, report writes and approval sends are three tasks that never
//! wait for each other (see [`run`]). It writes to the API server only when
//! its view of an event changes, each event on its own (one failing write
//! never holds back the others), backing off with jitter after a failure;
//! it watches only its own reports (a field selector on its node) while it
//! has any, and each `ScheduledEvent` its document lists as `Scheduled` (a
//! field selector on the name) while it does, so an idle cluster costs the
//! API server nothing per poll.

pub mod approval;
pub mod event_reports;
pub mod poll;
pub mod vm_report;
pub mod witnesses;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use kube::api::Api;
use prometheus::Registry;
use tokio::task::JoinHandle;
use tracing::{Instrument, info, info_span, warn};

use crate::cli::AgentArgs;
use crate::imds::client::Client as ImdsClient;
use crate::imds::model::Compute;
use crate::kubeclient::Clients;
use crate::metrics::agent::AgentMetrics;
use crate::server::{self, Liveness, Readiness};
use crate::witnesses::Witnessing;

/// Errors of the agent's Kubernetes side.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Writing this agent's own `ScheduledEventReport` failed.
    #[error("failed to write this agent's report on ScheduledEvent {name}: {source}")]
    WriteReport {
        /// Object name of the event.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The report's name, `<event>.<node>`, would be longer than an object
    /// name may be (253 bytes).
    #[error(
        "cannot report on ScheduledEvent {name}: the node name {node:?} is too long for a report name (<event>.<node>, at most 253 bytes); the controller treats this node as unconfirmed"
    )]
    ReportName {
        /// Object name of the event.
        name: String,
        /// This agent's node.
        node: String,
    },
    /// Listing `ScheduledEventReport`s (this agent's own, at start) failed.
    #[error("failed to list ScheduledEventReports: {source}")]
    ListReports {
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs the agent until SIGTERM: three tasks that never wait for each other
/// ([`poll`]: IMDS once per interval; [`event_reports`]: this agent's reports;
/// [`approval`]: approvals to IMDS), joined by channels that keep only the
/// latest document and the latest reports written. A hung or slow API
/// server never delays a poll, and a slow IMDS never delays a write.
///
/// # Errors
/// When the Kubernetes client or the metrics server cannot start; everything
/// after start-up is retried, never fatal.
pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let clients = Clients::infer("agent", &args.node_name).await?;
    let registry = Registry::new();
    let metrics = AgentMetrics::register(&registry)?;
    let ready = Readiness::default();
    let imds = ImdsClient::new(&args.imds_url, args.imds_timeout)?
        .with_first_timeout(args.imds_first_timeout);
    // The poll loop may be silent for one request at its longest timeout
    // (the first) plus a few intervals before /healthz fails.
    let live = Liveness::new(poll::silence_allowed(
        args.imds_first_timeout.max(args.imds_timeout),
        args.poll_interval,
    ));
    server::spawn(
        args.metrics_listen(),
        registry,
        ready.clone(),
        Some(live.clone()),
        server::Access::new(args.metrics_auth, &clients.requests, &metrics.metrics_auth),
    )
    .await?;

    let shutdown = crate::cli::shutdown_signal();
    tokio::pin!(shutdown);

    // The first request may take up to two minutes while IMDS enables
    // Scheduled Events for the VM; keep asking, with backoff, until SIGTERM.
    // Meanwhile, and after, the installed reports CRD must carry every field
    // this version writes, or the API server would silently drop them from
    // its reports: exit with the command that mends it (see `crds`) as soon
    // as that is known. The check never delays the polls: an API server
    // that hangs at start must not stop the agent from reading IMDS
    // (tests/faults.rs, `a_hung_api_server_delays_no_imds_poll_and_loses_no_report`).
    let allowed = poll::silence_allowed(
        args.imds_first_timeout.max(args.imds_timeout),
        args.poll_interval,
    ) + MAX_COMPUTE_BACKOFF;
    let needs = crate::api::install::agent_needs();
    let check = crate::api::install::require(&clients.requests, &needs, "agent", || {});
    tokio::pin!(check);
    let fetched = await_compute(&imds, &live, allowed, shutdown.as_mut(), check.as_mut());
    let Some((compute, checked)) = fetched.await? else {
        return Ok(());
    };
    info!(node = %args.node_name, vm = %compute.name, "Agent started");
    let vm_report = spawn_vm_report(clients.requests.clone(), &args, &compute);
    let started = Started {
        requests: clients.requests.clone(),
        watches: clients.watches,
        imds,
        metrics,
        ready,
        live,
        vm: compute.name,
    };
    let tasks = spawn_tasks(&args, started);
    if let Err(e) = until_shutdown(shutdown, check, checked).await {
        for t in &tasks {
            t.abort();
        }
        vm_report.abort();
        return Err(e);
    }
    vm_report.abort();
    for t in &tasks {
        t.abort();
    }
    info!("Agent stopped");
    Ok(())
}

/// The VM's compute metadata, asked of `imds` with backoff (at most
/// [`MAX_COMPUTE_BACKOFF`] between two requests) until it answers, `live`
/// beaten before each request (allowing `allowed` until the next);
/// meanwhile `check` (whether the installed CRD fits) runs to its end.
///
/// Returns `None` on SIGTERM (`shutdown`), else the metadata and whether
/// `check` passed already.
///
/// # Errors
/// `check` failed: the installed CRD lacks fields this version writes
/// (IMDS errors are retried, never returned).
async fn await_compute(
    imds: &ImdsClient,
    live: &Liveness,
    allowed: Duration,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    mut check: Pin<&mut impl Future<Output = Result<(), crate::api::install::Error>>>,
) -> anyhow::Result<Option<(Compute, bool)>> {
    let mut checked = false;
    let fetch = (|| async {
        live.beat(allowed);
        imds.fetch_compute().await
    })
    .retry(
        ExponentialBuilder::default()
            .with_max_delay(MAX_COMPUTE_BACKOFF)
            .with_jitter()
            .without_max_times(),
    )
    .notify(|e, d| warn!(error = %error_chain(e), retry_in = ?d, "IMDS compute metadata not available yet"));
    tokio::pin!(fetch);
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(None),
            r = &mut check, if !checked => {
                r?;
                checked = true;
            }
            r = &mut fetch => return Ok(Some((r?, checked))),
        }
    }
}

/// Writes this VM's `VirtualMachineReport` (from `compute`) once, in a
/// task of its own, through `client` ([`vm_report::write`]).
fn spawn_vm_report(client: kube::Client, args: &AgentArgs, compute: &Compute) -> JoinHandle<()> {
    tokio::spawn(
        vm_report::write(
            Api::all(client),
            vm_report::report_of(&args.node_name, compute),
        )
        .instrument(info_span!("vm_report", node = %args.node_name)),
    )
}

/// What the agent's three tasks share, once the VM's compute metadata is
/// known.
struct Started {
    /// The Kubernetes client for requests.
    requests: kube::Client,
    /// The Kubernetes client for watches.
    watches: kube::Client,
    /// The IMDS client.
    imds: ImdsClient,
    /// The agent's metrics.
    metrics: AgentMetrics,
    /// What `/readyz` answers (the report writer sets it).
    ready: Readiness,
    /// What `/healthz` reads (the poller beats it).
    live: Liveness,
    /// This VM's name.
    vm: String,
}

/// Starts the agent's three tasks (see [`run`]): the poller, the report
/// writer and the approval sender, joined by channels that keep only the
/// latest document and the latest reports written; and, with
/// `--witnesses`, the watch of the list of silent VMs whose events the
/// report writer reports too ([`crate::witnesses`]).
///
/// Returns their tasks, in that order.
fn spawn_tasks(args: &AgentArgs, started: Started) -> Vec<JoinHandle<()>> {
    let Started {
        requests,
        watches,
        imds,
        metrics,
        ready,
        live,
        vm,
    } = started;
    let (doc_tx, doc_rx) = tokio::sync::watch::channel(None);
    let (written_tx, written_rx) = tokio::sync::watch::channel(Default::default());
    let (sent_tx, sent_rx) = tokio::sync::mpsc::unbounded_channel();
    // Without a witnesses ConfigMap, every event seen is reported (the
    // sender then lives as long as the report writer).
    let (witness_tx, witness_rx) = tokio::sync::watch::channel(match &args.witnesses {
        Some(_) => Witnessing::For(Default::default()),
        None => Witnessing::All,
    });
    let witness_task = match &args.witnesses {
        Some(at) => tokio::spawn(witnesses::watch(watches.clone(), at.clone(), witness_tx)),
        None => tokio::spawn(async move {
            witness_tx.closed().await;
        }),
    };
    let poller = poll::Poller::new(args, imds.clone(), metrics.clone(), doc_tx, live);
    let reporter = event_reports::Reporter {
        api: Api::all(requests),
        watch_api: Api::all(watches.clone()),
        node: args.node_name.clone(),
        vm: vm.clone(),
        metrics: metrics.clone(),
        ready,
        docs: doc_rx.clone(),
        sent: sent_rx,
        written_tx,
        witnessing: witness_rx,
    };
    let approver = approval::Approver::new(
        imds,
        Api::all(watches),
        vm,
        metrics,
        approval::fallback_for(&args.node_name, args.approval_fallback),
        args.poll_interval,
        doc_rx,
        written_rx,
        sent_tx,
    );
    vec![
        tokio::spawn(
            poller
                .run()
                .instrument(info_span!("poll", node = %args.node_name)),
        ),
        tokio::spawn(
            reporter
                .run()
                .instrument(info_span!("report", node = %args.node_name)),
        ),
        tokio::spawn(
            approver
                .run()
                .instrument(info_span!("approve", node = %args.node_name)),
        ),
        witness_task,
    ]
}

/// Waits for SIGTERM (`shutdown`); meanwhile for `check` (whether the
/// installed CRD fits) too, unless it passed already (`checked`).
///
/// # Errors
/// `check` failed: the installed CRD lacks fields this version writes.
async fn until_shutdown(
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    check: Pin<&mut impl Future<Output = Result<(), crate::api::install::Error>>>,
    checked: bool,
) -> anyhow::Result<()> {
    if !checked {
        tokio::select! {
            _ = &mut shutdown => {}
            r = check => {
                r?;
                shutdown.await;
            }
        }
    } else {
        shutdown.await;
    }
    Ok(())
}

/// The longest pause between two requests for the VM's compute metadata at
/// start.
const MAX_COMPUTE_BACKOFF: Duration = Duration::from_secs(30);

/// `e` and every error under it, joined by `: ` (a cause whose text its
/// parent already shows is not repeated), so a log line keeps the root
/// cause, e.g. `... error sending request ...: client error (Connect): tcp
/// connect error: Connection refused (os error 111)`.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        cause = c.source();
    }
    text
}

/// The `result` label of a failed IMDS scheduled events request
/// ([`AgentMetrics::polls`]).
fn imds_result(e: &crate::imds::client::Error) -> &'static str {
    use crate::imds::client::Error as E;
    match e {
        E::ParseEvents { .. } | E::TooLarge { .. } => "parse_error",
        E::Status { status, .. } if status.as_u16() == 429 => "throttled",
        E::Status { status, .. } if status.as_u16() == 410 => "gone",
        E::Status { status, .. } if status.is_server_error() => "server_error",
        E::Status { .. } => "client_error",
        _ => "unreachable",
    }
}

/// The first `max` bytes of `text`, cut at a character boundary.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("failed to fetch scheduled events: {source}")]
    struct Outer {
        source: Middle,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("error sending request")]
    struct Middle {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn the_root_cause_is_kept_once() {
        let e = Outer {
            source: Middle {
                source: std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "Connection refused",
                ),
            },
        };
        assert_eq!(
            error_chain(&e),
            "failed to fetch scheduled events: error sending request: Connection refused"
        );
    }
}

#[cfg(test)]
mod imds_result_tests {
    use super::imds_result;
    use crate::imds::client::Error;
    use reqwest::StatusCode;

    fn status(code: u16) -> Error {
        Error::Status {
            what: "fetch scheduled events",
            status: StatusCode::from_u16(code).expect("status"),
            body: String::new(),
        }
    }

    #[test]
    fn failed_imds_requests_get_a_closed_set_result() {
        let got: Vec<&str> = [429, 410, 500, 503, 404]
            .map(|c| imds_result(&status(c)))
            .to_vec();
        assert_eq!(
            got,
            [
                "throttled",
                "gone",
                "server_error",
                "server_error",
                "client_error"
            ]
        );
        let too_large = Error::TooLarge {
            what: "fetch scheduled events",
            url: "http://169.254.169.254".into(),
        };
        assert_eq!(imds_result(&too_large), "parse_error");
    }
}
