//! The Kubernetes clients both roles use, with timeouts, and the backoff
//! every watch resumes with.
//!
//! Two clients per process, because one read timeout cannot suit both: a
//! request (get, list, apply, patch, eviction) must fail within seconds
//! when the API server hangs, so that the work behind it is retried rather
//! than stuck; a watch legitimately stays silent for minutes, and kube's
//! watcher guards it with its own idle timeout (the server-side watch
//! timeout plus 5 s), after which it resumes.

use std::path::PathBuf;
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

/// Why a process has no Kubernetes configuration or clients.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The role or identity (a host or node name, `--identity`) has a
    /// character an HTTP header cannot carry.
    #[error("cannot send the User-Agent {agent:?}: {source}")]
    UserAgent {
        /// The `User-Agent` that was to be sent.
        agent: String,
        /// Why it is not a header value.
        #[source]
        source: http::header::InvalidHeaderValue,
    },
    /// Neither a kubeconfig nor the in-cluster ServiceAccount was found or
    /// could be read.
    #[error(
        "no Kubernetes configuration (set KUBECONFIG, or run in a pod with a ServiceAccount token): {source}"
    )]
    Infer {
        /// What kube tried, and why each failed.
        #[source]
        source: kube::config::InferConfigError,
    },
    /// A client could not be built from the configuration (e.g. a CA or a
    /// client certificate it cannot use).
    #[error("failed to build the Kubernetes {client} client: {source}")]
    Client {
        /// Which one: `request` or `watch`.
        client: &'static str,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// An environment variable the in-cluster configuration needs is not
    /// set (or not Unicode): the process does not run in a pod.
    #[error("{name} is not set: not in a cluster ({source})")]
    NotInCluster {
        /// The variable.
        name: &'static str,
        /// Why it could not be read.
        #[source]
        source: std::env::VarError,
    },
    /// `KUBERNETES_SERVICE_PORT` is not a port number.
    #[error("KUBERNETES_SERVICE_PORT {port:?} is not a port: {source}")]
    Port {
        /// The value given.
        port: String,
        /// The parse error.
        #[source]
        source: std::num::ParseIntError,
    },
    /// The ServiceAccount's `namespace` file could not be read.
    #[error("failed to read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The ServiceAccount's `ca.crt` or `token` is not a file.
    #[error("{} is missing", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// The in-cluster kubeconfig built from the ServiceAccount's files does
    /// not deserialize (a path that is not valid there).
    #[error("failed to build the in-cluster kubeconfig for {}: {source}", dir.display())]
    Kubeconfig {
        /// The ServiceAccount directory.
        dir: PathBuf,
        /// The deserialization error.
        #[source]
        source: serde_json::Error,
    },
    /// kube refused the in-cluster kubeconfig (e.g. a CA that is not PEM).
    #[error("failed to load the in-cluster configuration from {}: {source}", dir.display())]
    InCluster {
        /// The ServiceAccount directory.
        dir: PathBuf,
        /// kube's error.
        #[source]
        source: kube::config::KubeconfigError,
    },
}

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
/// [`Error::UserAgent`]: `role` or `identity` cannot be sent in an HTTP
/// header.
pub fn request_config(mut config: Config, role: &str, identity: &str) -> Result<Config, Error> {
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
        http::HeaderValue::from_str(&agent).map_err(|source| Error::UserAgent {
            agent: agent.clone(),
            source,
        })?,
    ));
    Ok(config)
}

impl Clients {
    /// Both clients from the inferred configuration (in-cluster, or
    /// `KUBECONFIG`), for `role` as `identity` (see [`request_config`]).
    ///
    /// # Errors
    /// Those of [`infer_config`] (no Kubernetes configuration),
    /// [`Error::UserAgent`] (see [`request_config`]), and
    /// [`Error::Client`] (a client that cannot be built).
    pub async fn infer(role: &str, identity: &str) -> Result<Self, Error> {
        let config = request_config(infer_config().await?, role, identity)?;
        Self::from_request_config(config)
    }

    /// Both clients from a configuration made by [`request_config`].
    ///
    /// # Errors
    /// [`Error::Client`]: a client that cannot be built.
    pub fn from_request_config(config: Config) -> Result<Self, Error> {
        let mut watch = config.clone();
        watch.read_timeout = None;
        watch.write_timeout = Some(REQUEST_TIMEOUT);
        let build = |client, config| {
            Client::try_from(config).map_err(|source| Error::Client { client, source })
        };
        Ok(Clients {
            requests: build("request", config)?,
            watches: build("watch", watch)?,
        })
    }
}

/// The ServiceAccount directory of a pod, as a Linux container sees it
/// (kube's in-cluster configuration reads it at this absolute path).
pub const SERVICE_ACCOUNT_DIR: &str = "var/run/secrets/kubernetes.io/serviceaccount";

/// The environment variable a Windows HostProcess container's runtime sets
/// to the directory where the container's volumes are mounted (e.g.
/// `C:\C\<container id>\`): its ServiceAccount files are under
/// `$CONTAINER_SANDBOX_MOUNT_POINT\var\run\secrets\...`, not at the path
/// kube reads. (Runtimes that bind-mount the volumes at their container
/// paths instead, containerd 1.7 and later, set it too, and the files are
/// then found there as well.)
pub const SANDBOX_MOUNT_POINT_ENV: &str = "CONTAINER_SANDBOX_MOUNT_POINT";

/// The process's Kubernetes configuration: kube's inference (`KUBECONFIG`
/// or `~/.kube/config`, else in-cluster), except in a Windows HostProcess
/// container with no `KUBECONFIG`, where the in-cluster files are read
/// under `$CONTAINER_SANDBOX_MOUNT_POINT` ([`in_cluster_under`]) when they
/// are there.
///
/// # Errors
/// [`Error::Infer`]: no configuration found, or one that cannot be read;
/// under a sandbox mount point, [`Error::NotInCluster`] and those of
/// [`in_cluster_under`].
pub async fn infer_config() -> Result<Config, Error> {
    #[cfg(windows)]
    {
        if std::env::var_os("KUBECONFIG").is_none()
            && let Some(root) = std::env::var_os(SANDBOX_MOUNT_POINT_ENV)
        {
            let root = std::path::PathBuf::from(root);
            if root.join(SERVICE_ACCOUNT_DIR).join("token").is_file() {
                tracing::info!(root = %root.display(), "In-cluster configuration under the container's sandbox mount point");
                let var = |name: &'static str| {
                    std::env::var(name).map_err(|source| Error::NotInCluster { name, source })
                };
                let (host, port) = (
                    var("KUBERNETES_SERVICE_HOST")?,
                    var("KUBERNETES_SERVICE_PORT")?,
                );
                return in_cluster_under(&root, &host, &port).await;
            }
        }
    }
    Config::infer()
        .await
        .map_err(|source| Error::Infer { source })
}

/// The in-cluster configuration with the ServiceAccount's files (`token`,
/// `ca.crt`, `namespace`) read from `root/var/run/secrets/kubernetes.io/
/// serviceaccount/` instead of the absolute path, and the API server from
/// `host` and `port` (the values of `KUBERNETES_SERVICE_HOST` and
/// `KUBERNETES_SERVICE_PORT`), as kube's [`Config::incluster`] does. The token is read again from its file as
/// kube does for in-cluster tokens (they are rotated).
///
/// # Errors
/// [`Error::Port`]: a port that is not one; [`Error::Read`]: the
/// namespace file unreadable; [`Error::Missing`]: no CA or token file;
/// [`Error::Kubeconfig`], [`Error::InCluster`]: a configuration kube
/// refuses (a CA that is not PEM).
pub async fn in_cluster_under(
    root: &std::path::Path,
    host: &str,
    port: &str,
) -> Result<Config, Error> {
    let dir = root.join(SERVICE_ACCOUNT_DIR);
    let port: u16 = port.parse().map_err(|source| Error::Port {
        port: port.to_string(),
        source,
    })?;
    let server = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => format!("https://{}", std::net::SocketAddr::new(ip, port)),
        Err(_) => format!("https://{host}:{port}"),
    };
    let namespace_file = dir.join("namespace");
    let namespace = std::fs::read_to_string(&namespace_file).map_err(|source| Error::Read {
        path: namespace_file,
        source,
    })?;
    let ca = dir.join("ca.crt");
    let token = dir.join("token");
    for f in [&ca, &token] {
        if !f.is_file() {
            return Err(Error::Missing { path: f.clone() });
        }
    }
    let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(serde_json::json!({
        "clusters": [{"name": "in-cluster", "cluster": {
            "server": server,
            "certificate-authority": ca.to_string_lossy(),
        }}],
        "users": [{"name": "service-account", "user": {"tokenFile": token.to_string_lossy()}}],
        "contexts": [{"name": "in-cluster", "context": {
            "cluster": "in-cluster",
            "user": "service-account",
            "namespace": namespace.trim(),
        }}],
        "current-context": "in-cluster",
    }))
    .map_err(|source| Error::Kubeconfig {
        dir: dir.clone(),
        source,
    })?;
    let mut config =
        Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|source| Error::InCluster { dir, source })?;
    // As kube's in-cluster configuration: the CA is read again when it
    // changes (rotation).
    config.root_cert_file = Some(ca);
    Ok(config)
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

/// Patches the object `name` of `api`'s resource (its `subresource`, e.g.
/// `status`, when given) and reads nothing of the answer but its status:
/// the object the API server sends back is never built. A Node comes back
/// whole, `managedFields` and all (about 28 KB for a small one): a pass that
/// wrote the condition of 1,000 nodes and kept the answers held most of the
/// controller's peak memory for them, and parsing them cost CPU the
/// cordons of the same pass wait for.
///
/// # Errors
/// As [`kube::Api::patch`]: the API's refusal ([`kube::Error::Api`], e.g.
/// 409 when the patch's `resourceVersion` precondition failed), or the
/// request's failure.
pub async fn patch_discarding_answer<K, P>(
    api: &kube::Api<K>,
    name: &str,
    subresource: Option<&str>,
    params: &kube::api::PatchParams,
    patch: &kube::api::Patch<P>,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone,
    P: serde::Serialize + std::fmt::Debug,
{
    let request = kube::core::Request::new(api.resource_url());
    let mut req = match subresource {
        Some(sub) => request.patch_subresource(sub, name, params, patch),
        None => request.patch(name, params, patch),
    }
    .map_err(kube::Error::BuildRequest)?;
    // The name kube's own `patch`/`patch_status` give the request's span.
    req.extensions_mut().insert(if subresource.is_some() {
        "patch_status"
    } else {
        "patch"
    });
    api.clone()
        .into_client()
        .request::<serde::de::IgnoredAny>(req)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::{SERVICE_ACCOUNT_DIR, in_cluster_under};

    /// A HostProcess container's layout: the ServiceAccount's files under
    /// the sandbox mount point are what the configuration uses.
    #[tokio::test]
    async fn the_in_cluster_configuration_is_read_under_a_sandbox_mount_point() {
        let root = std::env::temp_dir().join(format!("forewarn-sandbox-{}", std::process::id()));
        let dir = root.join(SERVICE_ACCOUNT_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["kubernetes".into()]).unwrap();
        std::fs::write(dir.join("ca.crt"), ca.cert.pem()).unwrap();
        std::fs::write(dir.join("token"), "the-token").unwrap();
        std::fs::write(dir.join("namespace"), "forewarn\n").unwrap();

        let config = in_cluster_under(&root, "fd00::1", "6443").await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://[fd00::1]:6443/");
        assert_eq!(config.default_namespace, "forewarn");
        assert_eq!(config.root_cert.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            config.root_cert_file.as_deref(),
            Some(dir.join("ca.crt").as_path())
        );
        let token_file = dir.join("token").to_string_lossy().into_owned();
        assert_eq!(
            config.auth_info.token_file.as_deref(),
            Some(token_file.as_str())
        );
        let v4 = in_cluster_under(&root, "10.0.0.1", "443").await.unwrap();
        assert_eq!(v4.cluster_url.host(), Some("10.0.0.1"));

        assert!(in_cluster_under(&root, "10.0.0.1", "https").await.is_err());
        std::fs::remove_file(dir.join("token")).unwrap();
        let missing = in_cluster_under(&root, "10.0.0.1", "443")
            .await
            .unwrap_err();
        assert!(
            matches!(&missing, super::Error::Missing { path } if path.ends_with("token")),
            "{missing}"
        );
        assert!(missing.to_string().contains("token"), "{missing}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}

/// Where a command run by a person acts: the kubeconfig file and context
/// it was given (`--kubeconfig`, `--context`, as kubectl takes them; when
/// kubectl runs the binary as its plugin, it passes on neither, and the
/// plugin reads them like kubectl: `KUBECONFIG`, else `~/.kube/config`,
/// else the in-cluster ServiceAccount).
#[derive(Debug, Clone, Default)]
pub struct PersonTarget {
    /// A kubeconfig file instead of `KUBECONFIG` and `~/.kube/config`.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// A context of that kubeconfig instead of its current one.
    pub context: Option<String>,
}

/// A client for a command run by a person, at `target`, and a line naming
/// where it acts (the context, when a kubeconfig gave one, and the API
/// server's URL), for confirmations and messages.
///
/// # Errors
/// The kubeconfig cannot be read, names no such context, or no
/// configuration is found; the client cannot be built.
pub async fn client_for_person(target: &PersonTarget) -> Result<(Client, String), kube::Error> {
    let options = kube::config::KubeConfigOptions {
        context: target.context.clone(),
        ..Default::default()
    };
    let (config, context) = match (&target.kubeconfig, &target.context) {
        (Some(path), _) => {
            let file = kube::config::Kubeconfig::read_from(path)?;
            let context = target.context.clone().or(file.current_context.clone());
            (
                Config::from_custom_kubeconfig(file, &options).await?,
                context,
            )
        }
        (None, Some(context)) => (
            Config::from_kubeconfig(&options).await?,
            Some(context.clone()),
        ),
        (None, None) => {
            let context = kube::config::Kubeconfig::read()
                .ok()
                .and_then(|k| k.current_context);
            (
                Config::infer().await.map_err(kube::Error::InferConfig)?,
                context,
            )
        }
    };
    let place = match context {
        Some(c) => format!("context {c} ({})", config.cluster_url),
        None => format!("{}", config.cluster_url),
    };
    Ok((Client::try_from(config)?, place))
}
