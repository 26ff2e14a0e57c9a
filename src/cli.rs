//! Command-line interface: flags with environment fallbacks.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// forewarn: Azure Scheduled Events -> cordon, drain, approve, uncordon.
///
/// A flag given twice takes its last value (`args_override_self`), as
/// kubectl's and most Kubernetes components' flags do: the chart's
/// `extraArgs` are appended after the flags it passes, so they override
/// them instead of stopping the process.
#[derive(Debug, Parser)]
#[command(name = "forewarn", version, about, args_override_self = true)]
pub struct Cli {
    /// Log format.
    #[arg(long, env = "FOREWARN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain, global = true)]
    pub log_format: LogFormat,
    /// Log filter in `EnvFilter` syntax (`RUST_LOG` wins when set).
    #[arg(
        long,
        env = "FOREWARN_LOG_LEVEL",
        default_value = "info",
        global = true
    )]
    pub log_level: String,
    /// The role to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// Who may read `/metrics` (`--metrics-auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MetricsAuth {
    /// Anyone who reaches the port.
    None,
    /// A bearer token reviewed by the API server (`TokenReview`, then
    /// `SubjectAccessReview` of `get` on `/metrics`).
    Kubernetes,
}

/// The roles.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Per-node agent: report this VM's IMDS Scheduled Events (ScheduledEventReport objects) and send the approvals the controller decides.
    Agent(AgentArgs),
    /// Controller: cordon, drain, decide approvals, uncordon.
    Controller(ControllerArgs),
    /// Print the ScheduledEvent CustomResourceDefinition as YAML.
    Crd {
        /// Print the ScheduledEventReport CustomResourceDefinition instead.
        #[arg(long, conflicts_with = "vm_reports")]
        reports: bool,
        /// Print the VirtualMachineReport CustomResourceDefinition instead.
        #[arg(long)]
        vm_reports: bool,
    },
    /// Install or upgrade the CustomResourceDefinitions this binary was
    /// built with (the chart's pre-install and pre-upgrade hook).
    Crds {
        /// What to do.
        #[command(subcommand)]
        action: CrdsAction,
    },
    /// Print the policy's JSON schema (the `controller.policy` part of the
    /// chart's values.schema.json), or that whole file with the part
    /// regenerated (`make generate`).
    #[command(hide = true)]
    ValuesSchema {
        /// The chart's values.schema.json: print it with its
        /// `controller.policy` replaced by the generated schema.
        #[arg(long, value_name = "FILE")]
        splice: Option<PathBuf>,
    },
    /// Serve a scenario-driven imitation of IMDS (demos, tests, game days).
    ImdsMock(ImdsMockArgs),
    /// Check an installed release (the chart's `helm test`): CRDs
    /// Established, a controller leading, every agent Ready.
    CheckInstall(CheckInstallArgs),
    /// Print what the policy would do if Azure announced an event for a
    /// node now: the action, the pods evicted (with their grace periods)
    /// and kept, the PodDisruptionBudgets that would block, and whether the
    /// approval would come before NotBefore. Reads the cluster with the
    /// kubeconfig, as kubectl does; writes nothing.
    WhatIf(WhatIfArgs),
    /// Hold the approval of a ScheduledEvent (annotation
    /// forewarn.dev/hold): the controller sends none; the drain goes on and
    /// Azure starts the event at NotBefore.
    Hold(EventArg),
    /// Remove the hold (annotation forewarn.dev/hold).
    ReleaseHold(EventArg),
    /// Send the approval of a ScheduledEvent now, whatever is left of the
    /// drain (annotation forewarn.dev/approve-now). Nothing is forced: no
    /// pod is force-deleted, no PodDisruptionBudget bypassed.
    Approve(EventArg),
}

/// The `ScheduledEvent` a command for people acts on.
#[derive(Debug, Clone, Args)]
pub struct EventArg {
    /// The ScheduledEvent's name (`kubectl get sev`), or its EventId in any case.
    pub event: String,
    /// Where to act.
    #[command(flatten)]
    pub target: TargetArgs,
    /// Do not ask for confirmation (`approve` asks, naming the cluster,
    /// and refuses without a terminal to ask on).
    #[arg(short = 'y', long)]
    pub yes: bool,
}

/// The cluster a command for people acts on, as kubectl takes it.
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// Path to the kubeconfig file (else `KUBECONFIG`, else
    /// `~/.kube/config`, else the in-cluster ServiceAccount).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (else its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl TargetArgs {
    /// As [`crate::kubeclient::PersonTarget`].
    pub fn target(&self) -> crate::kubeclient::PersonTarget {
        crate::kubeclient::PersonTarget {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
        }
    }
}

/// An event type `forewarn what-if` can imagine (Azure's `EventType`s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "PascalCase")]
pub enum WhatIfType {
    /// The VM restarts.
    Reboot,
    /// The VM moves to another host.
    Redeploy,
    /// The VM is paused (`--duration` seconds).
    Freeze,
    /// A Spot VM is deleted.
    Preempt,
    /// A scale-set VM is deleted.
    Terminate,
}

/// `EventSource` for `forewarn what-if`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "PascalCase")]
pub enum WhatIfSource {
    /// Azure's maintenance.
    Platform,
    /// The VM's owner.
    User,
}

/// Output format of the commands for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Readable text.
    Text,
    /// JSON, for machines.
    Json,
    /// YAML, the same fields as JSON.
    Yaml,
}

/// Flags of `forewarn what-if`.
#[derive(Debug, Clone, Args)]
pub struct WhatIfArgs {
    /// The node the event would name.
    #[arg(long)]
    pub node: String,
    /// The event's type.
    #[arg(long = "type", value_enum)]
    pub event_type: WhatIfType,
    /// The event's source.
    #[arg(long, value_enum, default_value_t = WhatIfSource::Platform)]
    pub source: WhatIfSource,
    /// How long before NotBefore the event is announced (humantime: 15m,
    /// 90s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15m")]
    pub notice: Duration,
    /// DurationInSeconds: the expected interruption in seconds (a Freeze's
    /// length), -1 for unknown.
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub duration: i64,
    /// Policy file (YAML, the controller's format); wins over the cluster's.
    #[arg(long, conflicts_with = "policy_configmap")]
    pub policy_file: Option<PathBuf>,
    /// The ConfigMap holding the policy (`NAMESPACE/NAME`, key
    /// `policy.yaml`). Without it and without `--policy-file`, the one the
    /// chart installed is looked for; none found: the built-in default.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub policy_configmap: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Where to read.
    #[command(flatten)]
    pub target: TargetArgs,
}

/// Flags of `forewarn check-install`.
#[derive(Debug, Clone, Args)]
pub struct CheckInstallArgs {
    /// Namespace of the release (its Lease and agent DaemonSet).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// Name of the controller's leader-election Lease.
    #[arg(long, default_value = "forewarn-controller")]
    pub lease_name: String,
    /// Name of an agents' DaemonSet; repeated for each (the Linux agents',
    /// and the Windows agents' when the chart runs them).
    #[arg(long, default_value = "forewarn-agent", num_args = 1)]
    pub agent_daemonset: Vec<String>,
}

/// Subcommands of `forewarn crds`.
#[derive(Debug, Subcommand)]
pub enum CrdsAction {
    /// Server-side apply the CRDs (field manager `forewarn-crds`, taking
    /// over the fields `helm install` created) and wait until the API
    /// server has established them with every field of this version.
    /// Credentials: in-cluster, or `KUBECONFIG`; needs `create` on
    /// customresourcedefinitions and `get`, `patch` on
    /// scheduledevents.forewarn.dev, scheduledeventreports.forewarn.dev and
    /// virtualmachinereports.forewarn.dev.
    Apply {
        /// Give up (exit non-zero) when the API server has not taken them all
        /// within this time; transient errors are retried until then.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "120s")]
        timeout: Duration,
    },
}

/// Flags of `forewarn agent`.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// This node's Kubernetes name (from the downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// IMDS base URL; the mock serves each VM at `http://<addr>/vm/<name>`.
    #[arg(long, env = "FOREWARN_IMDS_URL", default_value = crate::imds::client::DEFAULT_BASE_URL)]
    pub imds_url: String,
    /// Interval between IMDS polls (Azure recommends once a second).
    #[arg(long, env = "FOREWARN_POLL_INTERVAL", value_parser = humantime::parse_duration, default_value = "1s")]
    pub poll_interval: Duration,
    /// Timeout of one IMDS request, once IMDS has answered once.
    #[arg(long, env = "FOREWARN_IMDS_TIMEOUT", value_parser = humantime::parse_duration, default_value = "2s")]
    pub imds_timeout: Duration,
    /// Timeout of IMDS requests until the first successful answer: the first
    /// call enables Scheduled Events for the VM and may take up to two
    /// minutes (Azure docs).
    #[arg(long, env = "FOREWARN_IMDS_FIRST_TIMEOUT", value_parser = humantime::parse_duration, default_value = "120s")]
    pub imds_first_timeout: Duration,
    /// Longest pause between IMDS polls while IMDS answers 429, 410 or 5xx
    /// or does not answer (exponential backoff from the poll interval).
    #[arg(long, env = "FOREWARN_IMDS_MAX_BACKOFF", value_parser = humantime::parse_duration, default_value = "10s")]
    pub imds_max_backoff: Duration,
    /// How long an agent on a node the event does not name waits, after it
    /// first saw the approval decided (its own clock), before sending it
    /// itself (the affected node's agent goes first).
    #[arg(long, env = "FOREWARN_APPROVAL_FALLBACK", value_parser = humantime::parse_duration, default_value = "5s")]
    pub approval_fallback: Duration,
    /// The witnesses ConfigMap (`NAMESPACE/NAME`) the controller writes
    /// (its `--witnesses-configmap`, in its namespace): the agent reports
    /// the events naming its own VM, and those of other VMs only while
    /// the controller lists one of them as silent (see
    /// `forewarn::witnesses`). Absent: every event it sees.
    #[arg(long, env = "FOREWARN_WITNESSES")]
    pub witnesses: Option<crate::witnesses::ConfigMapRef>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "FOREWARN_METRICS_ADDR", default_value = "127.0.0.1:9101")]
    pub metrics_addr: SocketAddr,
    /// Listen on this IP (v4 or v6, no brackets) with the port of
    /// `--metrics-addr`: the chart passes the node's own IP (the downward
    /// API's `status.hostIP`), so that a hostNetwork agent does not serve
    /// its metrics on every address of the node.
    #[arg(long, env = "FOREWARN_METRICS_HOST")]
    pub metrics_host: Option<std::net::IpAddr>,
    /// Who may read `/metrics`: `none` (anyone who reaches the port), or
    /// `kubernetes` (a bearer token the API server authenticates, of a
    /// user allowed `get` on the non-resource URL `/metrics`, as
    /// kube-rbac-proxy checks; see [`crate::metrics_auth`]). `/healthz` and
    /// `/readyz` stay open.
    #[arg(long, env = "FOREWARN_METRICS_AUTH", value_enum, default_value_t = MetricsAuth::None)]
    pub metrics_auth: MetricsAuth,
}

impl AgentArgs {
    /// Where the agent serves /metrics, /healthz and /readyz:
    /// `--metrics-addr`, its IP replaced by `--metrics-host` when given.
    pub fn metrics_listen(&self) -> SocketAddr {
        match self.metrics_host {
            Some(ip) => SocketAddr::new(ip, self.metrics_addr.port()),
            None => self.metrics_addr,
        }
    }
}

/// Flags of `forewarn controller`.
#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    /// Policy file (YAML); without it the built-in defaults apply.
    #[arg(long, env = "FOREWARN_POLICY_FILE")]
    pub policy_file: Option<PathBuf>,
    /// Webhooks file (YAML; see `forewarn::notify::config`): where the
    /// leader POSTs its notifications. Read at start (a bad file stops the
    /// start) and again whenever its content changes (a changed file that
    /// is refused leaves the webhooks in force); without it none are sent.
    #[arg(long, env = "FOREWARN_WEBHOOKS_FILE")]
    pub webhooks_file: Option<PathBuf>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "FOREWARN_METRICS_ADDR", default_value = "127.0.0.1:9102")]
    pub metrics_addr: SocketAddr,
    /// Who may read `/metrics`: `none` (anyone who reaches the port), or
    /// `kubernetes` (a bearer token the API server authenticates, of a
    /// user allowed `get` on the non-resource URL `/metrics`, as
    /// kube-rbac-proxy checks; see [`crate::metrics_auth`]). `/healthz` and
    /// `/readyz` stay open.
    #[arg(long, env = "FOREWARN_METRICS_AUTH", value_enum, default_value_t = MetricsAuth::None)]
    pub metrics_auth: MetricsAuth,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "FOREWARN_LEASE_NAME",
        default_value = "forewarn-controller"
    )]
    pub lease_name: String,
    /// Name of the witnesses ConfigMap, in the Lease's namespace: the VMs
    /// whose agents are silent, whose events the other agents then report
    /// (the agents' `--witnesses`; see `forewarn::witnesses`).
    #[arg(long, env = "FOREWARN_WITNESSES_CONFIGMAP", default_value = crate::witnesses::DEFAULT_CONFIGMAP)]
    pub witnesses_configmap: String,
    /// This replica's identity in the Lease (default: the host name and process id).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Evictions in flight at once on one node.
    #[arg(long, env = "FOREWARN_MAX_EVICTIONS_PER_NODE", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_evictions_per_node: u16,
    /// Controller-wide eviction rate budget: evictions per second, over all
    /// events and nodes (the per-node bound applies too).
    #[arg(long, env = "FOREWARN_EVICTION_QPS", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub eviction_qps: u32,
    /// Evictions that may be sent at once above the rate before it applies.
    #[arg(long, env = "FOREWARN_EVICTION_BURST", default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..))]
    pub eviction_burst: u32,
    /// Decide and record what would be done (status, Events, logs) without
    /// cordoning, evicting or approving: no node is written, no eviction
    /// requested, and the would-be approval is recorded in `status.dryRun`,
    /// which no agent sends. Objects past their retention are still deleted
    /// (bookkeeping, not maintenance).
    #[arg(long, env = "FOREWARN_DRY_RUN")]
    pub dry_run: bool,
    /// The ValidatingAdmissionPolicy (and its binding, of the same name)
    /// that confines each agent to its own node's reports; the controller
    /// exports whether it is installed (`forewarn_agent_confinement_installed`).
    /// Absent: no policy is expected, and the gauge is 0.
    #[arg(long, env = "FOREWARN_AGENT_POLICY")]
    pub agent_policy: Option<String>,
    /// `ScheduledEvent`s reconciled at once; when more are due, the one
    /// whose deadline is nearest goes first (its `NotBefore` while its
    /// approval is not yet accepted).
    #[arg(long, env = "FOREWARN_RECONCILE_CONCURRENCY", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub reconcile_concurrency: u16,
}

/// Flags of `forewarn imds-mock`.
#[derive(Debug, Clone, Args)]
pub struct ImdsMockArgs {
    /// Scenario file (YAML); see the format in `forewarn::imds::scenario`.
    #[arg(long, env = "FOREWARN_SCENARIO")]
    pub scenario: String,
    /// Address to listen on (port 0 picks a free port, printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8089")]
    pub listen: SocketAddr,
    /// Wait for `POST /mock/start` before starting the scenario's clock.
    #[arg(long)]
    pub hold: bool,
    /// Also serve this scenario VM at the root paths (`/metadata/...`), as
    /// IMDS at `http://169.254.169.254` does, so an agent can use its default URL.
    #[arg(long)]
    pub root_vm: Option<String>,
}

/// Resolves when the process is asked to stop: on Unix, SIGTERM (the
/// kubelet's stop) or SIGINT (Ctrl-C); on Windows, any console control
/// event: CTRL_C, CTRL_BREAK, CTRL_CLOSE, CTRL_LOGOFF or CTRL_SHUTDOWN
/// (which one a Windows node sends on a container's stop depends on its
/// runtime: all are taken, since none is proven here; tests/platforms.rs
/// sends CTRL_C under Wine).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(windows)]
    {
        windows_stop().await;
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("Shutdown signal received");
}

/// The first console control event of any kind, by name. A listener that
/// cannot be installed is logged and left out. Windows ends the process
/// soon after the handler of a close, logoff or shutdown event returns (and
/// tokio's returns at once): the agent keeps nothing that needs flushing
/// (its reports are on the API server), so that is harmless.
#[cfg(windows)]
async fn windows_stop() {
    use tokio::signal::windows;
    macro_rules! on {
        ($kind:literal, $listener:expr) => {
            async {
                match $listener {
                    Ok(mut l) => {
                        l.recv().await;
                    }
                    Err(e) => {
                        tracing::warn!(event = $kind, error = %e, "Cannot listen for this console control event");
                        std::future::pending::<()>().await;
                    }
                }
            }
        };
    }
    let kind = tokio::select! {
        () = on!("CTRL_C", windows::ctrl_c()) => "CTRL_C",
        () = on!("CTRL_BREAK", windows::ctrl_break()) => "CTRL_BREAK",
        () = on!("CTRL_CLOSE", windows::ctrl_close()) => "CTRL_CLOSE",
        () = on!("CTRL_LOGOFF", windows::ctrl_logoff()) => "CTRL_LOGOFF",
        () = on!("CTRL_SHUTDOWN", windows::ctrl_shutdown()) => "CTRL_SHUTDOWN",
    };
    tracing::info!(event = kind, "Console control event received");
}

#[cfg(test)]
mod tests {
    /// The commands for people take kubectl's `--kubeconfig` and
    /// `--context`, `approve` takes `--yes`, and `what-if` prints YAML too.
    #[test]
    fn the_commands_for_people_take_kubectls_flags() {
        use clap::Parser as _;
        let cli = super::Cli::try_parse_from([
            "forewarn",
            "approve",
            "ev",
            "--kubeconfig=/k",
            "--context=prod",
            "-y",
        ])
        .expect("parses");
        match cli.command {
            super::Command::Approve(e) => {
                assert!(e.yes);
                assert_eq!(e.target.context.as_deref(), Some("prod"));
                assert_eq!(e.target.kubeconfig, Some(std::path::PathBuf::from("/k")));
            }
            other => panic!("{other:?}"),
        }
        let cli = super::Cli::try_parse_from([
            "forewarn",
            "what-if",
            "--node=n",
            "--type=Reboot",
            "-o",
            "yaml",
            "--context=c",
        ])
        .expect("parses");
        match cli.command {
            super::Command::WhatIf(w) => assert_eq!(w.output, super::Output::Yaml),
            other => panic!("{other:?}"),
        }
    }

    /// A flag the chart passes and `extraArgs` repeat takes the later
    /// value, in every subcommand; it does not stop the process.
    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        use clap::Parser as _;
        let cli = super::Cli::try_parse_from([
            "forewarn",
            "agent",
            "--node-name=n",
            "--poll-interval=1s",
            "--poll-interval=2s",
        ])
        .expect("parses");
        match cli.command {
            super::Command::Agent(a) => {
                assert_eq!(a.poll_interval, std::time::Duration::from_secs(2));
            }
            other => panic!("{other:?}"),
        }
        let cli = super::Cli::try_parse_from([
            "forewarn",
            "controller",
            "--reconcile-concurrency=8",
            "--reconcile-concurrency=32",
        ])
        .expect("parses");
        match cli.command {
            super::Command::Controller(c) => assert_eq!(c.reconcile_concurrency, 32),
            other => panic!("{other:?}"),
        }
    }

    use super::{Cli, Command, MetricsAuth};
    use clap::Parser;

    fn agent(extra: &[&str]) -> Result<super::AgentArgs, clap::Error> {
        let mut argv = vec!["forewarn", "agent", "--node-name", "n1"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv)?.command {
            Command::Agent(a) => Ok(a),
            other => panic!("not the agent: {other:?}"),
        }
    }

    /// The chart passes the node's own IP as `--metrics-host` and the port
    /// in `--metrics-addr`: the agent listens on that IP alone, v4 or v6.
    #[test]
    fn the_agent_listens_on_the_metrics_host_with_the_port_of_metrics_addr() {
        let a = agent(&[
            "--metrics-addr",
            "0.0.0.0:9101",
            "--metrics-host",
            "10.224.0.4",
        ])
        .unwrap();
        assert_eq!(a.metrics_listen().to_string(), "10.224.0.4:9101");
        let a = agent(&[
            "--metrics-addr",
            "0.0.0.0:9101",
            "--metrics-host",
            "fd00::4",
        ])
        .unwrap();
        assert_eq!(a.metrics_listen().to_string(), "[fd00::4]:9101");
        let a = agent(&["--metrics-addr", "127.0.0.1:9555"]).unwrap();
        assert_eq!(a.metrics_listen().to_string(), "127.0.0.1:9555");
        let err = agent(&["--metrics-host", "node-1"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--metrics-host"), "{err}");
    }

    /// `--metrics-auth` (or `FOREWARN_METRICS_AUTH`) is off by default and
    /// taken by both roles.
    #[test]
    fn both_roles_take_metrics_auth_off_by_default() {
        assert_eq!(agent(&[]).unwrap().metrics_auth, MetricsAuth::None);
        assert_eq!(
            agent(&["--metrics-auth", "kubernetes"])
                .unwrap()
                .metrics_auth,
            MetricsAuth::Kubernetes
        );
        let err = agent(&["--metrics-auth", "basic"]).unwrap_err().to_string();
        assert!(err.contains("--metrics-auth"), "{err}");
        let controller = |extra: &[&str]| {
            let mut argv = vec!["forewarn", "controller"];
            argv.extend_from_slice(extra);
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Controller(c) => c.metrics_auth,
                other => panic!("not the controller: {other:?}"),
            }
        };
        assert_eq!(controller(&[]), MetricsAuth::None);
        assert_eq!(
            controller(&["--metrics-auth=kubernetes"]),
            MetricsAuth::Kubernetes
        );
    }
}
