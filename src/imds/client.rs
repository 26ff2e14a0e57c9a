//! HTTP client for the VM's Instance Metadata Service.
//!
//! Every request carries `Metadata: true` and `api-version`, never goes
//! through a proxy (IMDS is link-local; Azure docs require bypassing
//! `HTTP(S)_PROXY`), never follows a redirect, and has an explicit timeout so
//! one slow answer cannot stall the once-a-second loop. The first request of
//! each kind gets a long timeout instead: the first call enables Scheduled
//! Events for the VM and may take up to two minutes (Azure docs). Bodies are
//! capped at [`MAX_BODY_BYTES`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;

use super::model::{Compute, Document, ParseError, StartRequest, StartRequests, parse_document};

/// The address of IMDS inside every Azure VM.
pub const DEFAULT_BASE_URL: &str = "http://169.254.169.254";
/// The Scheduled Events API version used (the newest GA; `Terminate` needs 2019-01-01+).
pub const SCHEDULED_EVENTS_API_VERSION: &str = "2020-07-01";
/// The instance metadata API version used for `compute.name`.
pub const COMPUTE_API_VERSION: &str = "2021-02-01";
/// The largest body accepted from IMDS, bytes. A real document is a few KiB.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Errors from talking to IMDS.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The HTTP client could not be built (TLS back end, bad settings).
    #[error("failed to build the IMDS HTTP client: {source}")]
    BuildClient {
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// The request did not complete: connection refused, timeout, reset.
    #[error("failed to {what} at {url}: {source}")]
    Request {
        /// What was being done, e.g. "fetch scheduled events".
        what: &'static str,
        /// The full URL.
        url: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// The body was larger than [`MAX_BODY_BYTES`].
    #[error("failed to {what} at {url}: the answer exceeds {MAX_BODY_BYTES} bytes")]
    TooLarge {
        /// What was being done.
        what: &'static str,
        /// The full URL.
        url: String,
    },
    /// IMDS answered with a non-success status (429, 410, 500 ... are retried by the caller).
    #[error("failed to {what}: IMDS answered {status}: {body}")]
    Status {
        /// What was being done.
        what: &'static str,
        /// The HTTP status.
        status: StatusCode,
        /// The start of the body, for the log.
        body: String,
    },
    /// IMDS answered 200 with a body that is not a scheduled events document.
    #[error("failed to parse scheduled events document ({len} bytes: {body:?}): {source}")]
    ParseEvents {
        /// Body length in bytes.
        len: usize,
        /// The start of the body, for the log.
        body: String,
        /// The parse error.
        #[source]
        source: ParseError,
    },
    /// IMDS answered 200 with a compute document that does not parse.
    #[error("failed to parse instance compute metadata: {source}")]
    ParseCompute {
        /// The decode error.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// Whether IMDS asked to slow down or is failing on its side: 429 (more
    /// than about 5 requests a second per VM), 410 (retry for up to about
    /// 70 s) or any 5xx, or the request did not complete. The caller backs off.
    pub fn wants_backoff(&self) -> bool {
        match self {
            Error::Status { status, .. } => {
                *status == StatusCode::TOO_MANY_REQUESTS
                    || *status == StatusCode::GONE
                    || status.is_server_error()
            }
            Error::Request { .. } => true,
            _ => false,
        }
    }
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A client for one VM's IMDS.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base_url: String,
    timeout: Duration,
    first_timeout: Duration,
    /// Whether the scheduled events and the compute endpoints have answered once.
    answered: Arc<[AtomicBool; 2]>,
}

/// Which endpoint a request goes to, for the first-answer timeout.
#[derive(Clone, Copy)]
enum Endpoint {
    Events = 0,
    Compute = 1,
}

/// How much of an odd body to keep in an error message.
const BODY_EXCERPT: usize = 512;

/// The scheduled events document in `bytes` (a body of
/// [`Client::fetch_events_body`]).
///
/// # Errors
/// [`Error::ParseEvents`], with the body's length and its start.
pub fn parse_events(bytes: &[u8]) -> Result<Document> {
    parse_document(bytes).map_err(|source| Error::ParseEvents {
        len: bytes.len(),
        body: excerpt(bytes),
        source,
    })
}

fn excerpt(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(&bytes[..bytes.len().min(BODY_EXCERPT)]);
    s.into_owned()
}

impl Client {
    /// A client for IMDS at `base_url` (e.g. `http://169.254.169.254`, or a
    /// `forewarn imds-mock` VM URL such as `http://127.0.0.1:8080/vm/vmss_0`),
    /// with `timeout` for each whole request (also the first: see
    /// [`Client::with_first_timeout`]).
    ///
    /// # Errors
    /// [`Error::BuildClient`] if the HTTP stack cannot be set up.
    pub fn new(base_url: &str, timeout: Duration) -> Result<Self> {
        let http = crate::http::client_builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(timeout.min(Duration::from_secs(2)))
            .build()
            .map_err(|source| Error::BuildClient { source })?;
        Ok(Client {
            http,
            base_url: base_url.trim_end_matches('/').to_string(),
            timeout,
            first_timeout: timeout,
            answered: Arc::new([AtomicBool::new(false), AtomicBool::new(false)]),
        })
    }

    /// The same client with `first` as the timeout of each endpoint's
    /// requests until it first answers successfully (Azure: the first call
    /// may take up to two minutes), the short timeout afterwards.
    pub fn with_first_timeout(mut self, first: Duration) -> Self {
        self.first_timeout = first;
        self
    }

    /// The timeout for the next request to `endpoint`.
    fn timeout_for(&self, endpoint: Endpoint) -> Duration {
        if self.answered[endpoint as usize].load(Ordering::Relaxed) {
            self.timeout
        } else {
            self.first_timeout.max(self.timeout)
        }
    }

    fn events_url(&self) -> String {
        format!(
            "{}/metadata/scheduledevents?api-version={SCHEDULED_EVENTS_API_VERSION}",
            self.base_url
        )
    }

    /// Sends `req` with `Metadata: true` and the endpoint's timeout, and
    /// returns the body of a success (at most [`MAX_BODY_BYTES`]).
    async fn send(
        &self,
        what: &'static str,
        endpoint: Endpoint,
        url: String,
        req: reqwest::RequestBuilder,
    ) -> Result<Bytes> {
        let mut resp = req
            .header("Metadata", "true")
            .timeout(self.timeout_for(endpoint))
            .send()
            .await
            .map_err(|source| Error::Request {
                what,
                url: url.clone(),
                source,
            })?;
        let status = resp.status();
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_BODY_BYTES as u64)
        {
            return Err(Error::TooLarge { what, url });
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|source| Error::Request {
            what,
            url: url.clone(),
            source,
        })? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(Error::TooLarge { what, url });
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(Error::Status {
                what,
                status,
                body: excerpt(&body),
            });
        }
        self.answered[endpoint as usize].store(true, Ordering::Relaxed);
        Ok(Bytes::from(body))
    }

    /// `GET /metadata/scheduledevents`: the current document.
    ///
    /// # Errors
    /// [`Error::Request`], [`Error::Status`] or [`Error::ParseEvents`]; the
    /// caller keeps its last good document and tries again on the next tick.
    pub async fn fetch_events(&self) -> Result<Document> {
        let bytes = self.fetch_events_body().await?;
        parse_events(&bytes)
    }

    /// `GET /metadata/scheduledevents`: the current document's bytes,
    /// unparsed (see [`parse_events`]), so that a poller can tell an
    /// unchanged document without parsing it again.
    ///
    /// # Errors
    /// [`Error::Request`] or [`Error::Status`].
    pub async fn fetch_events_body(&self) -> Result<Bytes> {
        let url = self.events_url();
        self.send(
            "fetch scheduled events",
            Endpoint::Events,
            url.clone(),
            self.http.get(&url),
        )
        .await
    }

    /// `GET /metadata/instance/compute`: this VM's identity.
    ///
    /// # Errors
    /// [`Error::Request`], [`Error::Status`] or [`Error::ParseCompute`].
    pub async fn fetch_compute(&self) -> Result<Compute> {
        let url = format!(
            "{}/metadata/instance/compute?api-version={COMPUTE_API_VERSION}",
            self.base_url
        );
        let bytes = self
            .send(
                "fetch instance compute metadata",
                Endpoint::Compute,
                url.clone(),
                self.http.get(&url),
            )
            .await?;
        serde_json::from_slice(&bytes).map_err(|source| Error::ParseCompute { source })
    }

    /// `POST /metadata/scheduledevents` with `StartRequests`: approves the
    /// events so that they may start before `NotBefore`.
    ///
    /// Idempotent on the Azure side: 200 for a valid id even if another VM
    /// already approved it.
    ///
    /// # Errors
    /// [`Error::Request`] or [`Error::Status`] (400 for a malformed body).
    pub async fn approve(&self, event_ids: &[String]) -> Result<String> {
        let url = self.events_url();
        let body = StartRequests {
            start_requests: event_ids
                .iter()
                .map(|id| StartRequest {
                    event_id: id.clone(),
                })
                .collect(),
        };
        let answer = self
            .send(
                "approve scheduled events",
                Endpoint::Events,
                url.clone(),
                self.http.post(&url).json(&body),
            )
            .await?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }
}
