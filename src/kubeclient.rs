//! The Kubernetes clients both roles use, with timeouts, and the backoff
//! every watch resumes with.
//!
//! Two clients per process, because one read timeout cannot suit both: a
//! request (get, list, apply, patch, eviction) must fail within seconds
//! when the API server hangs, so that the work behind it is retried rather
//! than stuck; a watch legitimately stays silent for minutes, and kube's
//! watcher guards it with its own idle timeout (the server-side watch
//! timeout plus 5 s), after which it resumes.

use std::time::Duration;

use backon::ExponentialBuilder;
use kube::runtime::watcher;
use kube::{Client, Config};

/// Connect timeout of every client: the API server is on the cluster's own
/// network, so a connection that has not opened in 5 s will not.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Read and write timeout of the request client: the longest one request
/// (a list of every report of a large event included) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// A process's two clients, built from one configuration.
#[derive(Clone)]
pub struct Clients {
    /// Requests: connect, read and write timeouts ([`CONNECT_TIMEOUT`],
    /// [`REQUEST_TIMEOUT`], counted from when each request is sent).
    pub requests: Client,
    /// Watches only: a connect timeout; no read timeout (kube's watcher
    /// idle timeout stands in for it).
    pub watches: Client,
}

/// `config` with the request timeouts and a `User-Agent` that names the
/// role and the process (`forewarn/<version> (<role>; <identity>)`), so
/// that the API server's audit log and metrics tell the processes apart.
///
/// # Errors
/// `identity` cannot be sent in an HTTP header.
pub fn request_config(mut config: Config, role: &str, identity: &str) -> anyhow::Result<Config> {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    config.reset_reader_on_write = true;
    let agent = format!(
        "forewarn/{} ({role}; {identity})",
        env!("CARGO_PKG_VERSION")
    );
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&agent)
            .map_err(|e| anyhow::anyhow!("cannot send the User-Agent {agent:?}: {e}"))?,
    ));
    Ok(config)
}

impl Clients {
    /// Both clients from the inferred configuration (in-cluster, or
    /// `KUBECONFIG`), for `role` as `identity` (see [`request_config`]).
    ///
    /// # Errors
    /// No Kubernetes configuration, or a client that cannot be built.
    pub async fn infer(role: &str, identity: &str) -> anyhow::Result<Self> {
        let config = request_config(Config::infer().await?, role, identity)?;
        Self::from_request_config(config)
    }

    /// Both clients from a configuration made by [`request_config`].
    ///
    /// # Errors
    /// A client that cannot be built.
    pub fn from_request_config(config: Config) -> anyhow::Result<Self> {
        let mut watch = config.clone();
        watch.read_timeout = None;
        watch.write_timeout = Some(REQUEST_TIMEOUT);
        Ok(Clients {
            requests: Client::try_from(config)?,
            watches: Client::try_from(watch)?,
        })
    }
}

/// Watches resume quickly after an API server outage: from their
/// `resourceVersion` (kube's watcher relists only after `410 Gone`), after a
/// bounded backoff (0.5 s doubling to 2.5 s, plus backon's jitter of up to
/// 100%: at most 5 s, so a thousand agents do not come back in the same
/// instant) instead of kube's default, which waits up to minutes after a
/// `too old resource version`.
pub fn watch_backoff() -> watcher::ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_millis(2500))
        .with_jitter()
        .without_max_times()
        .into()
}
