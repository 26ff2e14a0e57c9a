//! forewarn processes started by the harness: the IMDS mock, one agent per
//! node, the controller. Each logs to a file; all stop on SIGTERM.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use forewarn::imds::mock::LogEntry;

/// A child process with its log file.
pub struct Proc {
    /// Short name, e.g. `agent node-000001`.
    pub name: String,
    /// Its stderr (and extra stdout) log.
    pub log: PathBuf,
    child: Child,
    /// The signal [`Proc::terminate`] sends (a name `kill` knows).
    stop_signal: String,
}

/// A free TCP port on 127.0.0.1, bound and released: another process may
/// take it before the caller binds it (with many clients on loopback this
/// happened in CI), so forewarn processes are given `127.0.0.1:0` and their
/// port is read back with [`Proc::metrics_port`]. Only for servers that
/// cannot report the port they bound.
///
/// # Errors
/// When no port can be bound.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Proc {
    /// Starts `bin args` with `env`, stderr to `log_dir/<file>.log`.
    ///
    /// # Errors
    /// When the log file cannot be created or the binary cannot start.
    pub fn spawn(
        name: &str,
        bin: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log_dir: &Path,
        file: &str,
    ) -> anyhow::Result<(Self, Option<tokio::process::ChildStdout>)> {
        let log = log_dir.join(format!("{file}.log"));
        let err = std::fs::File::create(&log)
            .with_context(|| format!("failed to create {}", log.display()))?;
        let mut cmd = Command::new(bin);
        // An `anyhow` error printed at exit leads with its message; with a
        // library backtrace after it, a log tail showed frames only.
        cmd.args(args)
            .env("RUST_LIB_BACKTRACE", "0")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("failed to start {name} ({})", bin.display()))?;
        let stdout = child.stdout.take();
        Ok((
            Proc {
                name: name.into(),
                log,
                child,
                stop_signal: "TERM".into(),
            },
            stdout,
        ))
    }

    /// The process stopped by `signal` (a name `kill` knows, e.g. `INT`)
    /// instead of SIGTERM in [`Proc::terminate`]: under Wine, SIGINT is
    /// the Windows process's CTRL_C console control event, while SIGTERM
    /// ends it at once.
    #[must_use]
    pub fn with_stop_signal(mut self, signal: &str) -> Self {
        self.stop_signal = signal.into();
        self
    }

    /// Sends SIGTERM (or the signal of [`Proc::with_stop_signal`]) and
    /// waits up to `within` for the process to exit.
    ///
    /// # Errors
    /// When it is still running after `within` (it is then killed).
    pub async fn terminate(&mut self, within: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args([format!("-{}", self.stop_signal), pid.to_string()])
                .status()
                .await;
        }
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                let _ = self.child.kill().await;
                bail!(
                    "{} did not stop within {within:?} of SIG{}",
                    self.name,
                    self.stop_signal
                )
            }
        }
    }

    /// Kills the process at once (SIGKILL) and reaps it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Sends `signal` (a name `kill` knows: `STOP`, `CONT`, `KILL`) to the
    /// process.
    ///
    /// # Errors
    /// When it was reaped already or `kill` fails.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self
            .id()
            .ok_or_else(|| anyhow::anyhow!("{} has exited", self.name))?;
        let ok = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()?
            .success();
        anyhow::ensure!(ok, "kill -{signal} {pid} ({}) failed", self.name);
        Ok(())
    }

    /// Its process id while it runs (`None` once reaped); `make bench`
    /// reads its `/proc/<pid>/status` and `stat`.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether the process has exited, and how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The port of the metrics server a forewarn process started with
    /// `--metrics-addr 127.0.0.1:0`, from its log line `Serving /metrics,
    /// /healthz and /readyz addr=127.0.0.1:PORT`.
    ///
    /// # Errors
    /// When the process exits first or logs no such line within `within`;
    /// the message has the log's tail.
    pub async fn metrics_port(&mut self, within: Duration) -> anyhow::Result<u16> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(port) = text
                .lines()
                .filter(|l| l.contains("Serving /metrics"))
                .find_map(|l| l.rsplit_once("addr=127.0.0.1:"))
                .and_then(|(_, p)| p.trim().parse().ok())
            {
                return Ok(port);
            }
            if let Some(status) = self.exited() {
                bail!(
                    "{} exited ({status}) before serving metrics\n--- last log lines ({}) ---\n{}",
                    self.name,
                    self.log.display(),
                    self.log_tail(30)
                );
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "{} logged no metrics address within {within:?}\n--- last log lines ({}) ---\n{}",
                    self.name,
                    self.log.display(),
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// Reads the mock's first stdout line (`listening on http://ADDR`) and keeps
/// draining the rest into its log so the pipe never fills.
///
/// # Errors
/// When the mock exits or prints something else first.
pub async fn read_mock_address(
    stdout: tokio::process::ChildStdout,
    log: PathBuf,
) -> anyhow::Result<String> {
    let mut lines = BufReader::new(stdout).lines();
    // A hang bound: the mock prints its address as soon as it binds.
    let first = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .context("the IMDS mock did not print its address within 120 s")??
        .context("the IMDS mock exited before printing its address")?;
    let addr = first
        .strip_prefix("listening on ")
        .with_context(|| {
            format!(
                "unexpected first line from the IMDS mock: {first:?} (see {})",
                log.display()
            )
        })?
        .to_string();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(addr)
}

/// Waits until `GET http://127.0.0.1:<port>/readyz` answers 200.
///
/// # Errors
/// When it does not within `within`.
pub async fn wait_ready(port: u16, within: Duration) -> anyhow::Result<()> {
    let http = forewarn::http::client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(1))
        .build()?;
    let url = format!("http://127.0.0.1:{port}/readyz");
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Ok(r) = http.get(&url).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{url} was not ready within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Who each forewarn process authenticates as, instead of the kubeconfig
/// in the common environment: e.g. TokenRequest tokens of the chart's
/// ServiceAccounts, to play a scenario with exactly the chart's RBAC.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// Kubeconfig of the controller.
    pub controller: PathBuf,
    /// Kubeconfig of the agent of each node, by node name.
    pub agents: BTreeMap<String, PathBuf>,
    /// Namespace of the controller's Lease (the chart's Role covers only
    /// the release namespace).
    pub lease_namespace: String,
    /// Name of the controller's Lease (the chart's Role names it).
    pub lease_name: String,
}

/// How long a new forewarn process may take to log its metrics address
/// (it binds before its first API or IMDS request; a loaded CI machine
/// starting dozens at once is slow). A hang bound: it takes well under a
/// second; the wait ends as soon as the line is there.
const PORT_WITHIN: Duration = Duration::from_secs(120);

/// How one node's agent is run instead of with the fleet's binary: a
/// binary of another platform, through a command that runs it here (an
/// emulator), e.g. `qemu-aarch64-static` with an arm64 binary or `wine64`
/// with a Windows one. Its arguments and environment are the other
/// agents'; its paths (kubeconfig, IMDS URL) too, so the emulator must map
/// this machine's paths (qemu-user and Wine's `Z:` drive do).
#[derive(Debug, Clone)]
pub struct AgentRunner {
    /// The command and its arguments, before the binary (not empty).
    pub prefix: Vec<String>,
    /// The agent's binary.
    pub bin: PathBuf,
    /// More environment for it (e.g. `WINEPREFIX`, `WINEDEBUG`), after the
    /// fleet's.
    pub env: Vec<(String, String)>,
    /// The signal that stops it cleanly, a name `kill` knows: `TERM`
    /// (qemu-user passes it on), `INT` under Wine (see
    /// [`Proc::with_stop_signal`]).
    pub stop_signal: String,
}

impl AgentRunner {
    /// `prefix bin args` as a program and its arguments.
    fn command(&self, args: &[String]) -> anyhow::Result<(PathBuf, Vec<String>)> {
        let (program, rest) = self
            .prefix
            .split_first()
            .context("an agent runner needs a command")?;
        let mut all = rest.to_vec();
        all.push(self.bin.to_string_lossy().into_owned());
        all.extend_from_slice(args);
        Ok((PathBuf::from(program), all))
    }
}

/// What it takes to start forewarn processes for one run.
struct Launch {
    bin: PathBuf,
    env: Vec<(String, String)>,
    log_dir: PathBuf,
    imds_base: String,
    lease: String,
    credentials: Option<Credentials>,
    /// Agents run otherwise, by node name.
    runners: BTreeMap<String, AgentRunner>,
    /// Whether the agents report other VMs' events only as witnesses.
    witnesses: bool,
}

impl Launch {
    /// Starts `args` (through `runner` when given); `kubeconfig`, when
    /// given, replaces `KUBECONFIG`.
    fn spawn(
        &self,
        name: &str,
        args: &[String],
        file: &str,
        kubeconfig: Option<&Path>,
        runner: Option<&AgentRunner>,
    ) -> anyhow::Result<Proc> {
        let kubeconfig = kubeconfig.map(|p| p.to_string_lossy().into_owned());
        let mut env: Vec<(&str, &str)> = self
            .env
            .iter()
            .filter(|(k, _)| kubeconfig.is_none() || k != "KUBECONFIG")
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if let Some(k) = &kubeconfig {
            env.push(("KUBECONFIG", k));
        }
        let Some(runner) = runner else {
            return Ok(Proc::spawn(name, &self.bin, args, &env, &self.log_dir, file)?.0);
        };
        env.extend(runner.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let (program, args) = runner.command(args)?;
        Ok(
            Proc::spawn(name, &program, &args, &env, &self.log_dir, file)?
                .0
                .with_stop_signal(&runner.stop_signal),
        )
    }

    /// Starts a controller with Lease identity `identity` (as a pod's name
    /// and process id would give it: a container restarted in the same pod
    /// keeps it, a new pod has another).
    async fn controller(&self, file: &str, identity: &str) -> anyhow::Result<(Proc, u16)> {
        let args = [
            "controller".to_string(),
            "--metrics-addr".into(),
            "127.0.0.1:0".into(),
            "--lease-namespace".into(),
            self.credentials
                .as_ref()
                .map_or("default".into(), |c| c.lease_namespace.clone()),
            "--lease-name".into(),
            self.credentials
                .as_ref()
                .map_or(self.lease.clone(), |c| c.lease_name.clone()),
            "--identity".into(),
            identity.into(),
        ];
        let kubeconfig = self.credentials.as_ref().map(|c| c.controller.as_path());
        let mut proc = self.spawn("controller", &args, file, kubeconfig, None)?;
        let port = proc.metrics_port(PORT_WITHIN).await?;
        Ok((proc, port))
    }

    /// Starts the agent of `node`; its port is read with
    /// [`Proc::metrics_port`], after all are started when there are many.
    ///
    /// With [`FleetOptions::witnesses`] it runs as the chart runs it: it
    /// reports other VMs' events only as a witness the controller asks for
    /// (`--witnesses`, the controller's default ConfigMap in the Lease's
    /// namespace).
    fn agent(&self, node: &str, vm: &str, file: &str) -> anyhow::Result<Proc> {
        let mut args = vec![
            "agent".to_string(),
            "--node-name".into(),
            node.into(),
            "--imds-url".into(),
            format!("{}/vm/{vm}", self.imds_base),
            "--metrics-addr".into(),
            "127.0.0.1:0".into(),
        ];
        if self.witnesses {
            let namespace = self
                .credentials
                .as_ref()
                .map_or("default", |c| c.lease_namespace.as_str());
            args.push("--witnesses".into());
            args.push(format!(
                "{namespace}/{}",
                forewarn::witnesses::DEFAULT_CONFIGMAP
            ));
        }
        let kubeconfig = match &self.credentials {
            Some(c) => Some(
                c.agents
                    .get(node)
                    .with_context(|| format!("no credentials for the agent of {node}"))?
                    .as_path(),
            ),
            None => None,
        };
        self.spawn(
            &format!("agent {node}"),
            &args,
            file,
            kubeconfig,
            self.runners.get(node),
        )
    }
}

/// One agent of a [`Fleet`].
pub struct Agent {
    /// Node name.
    pub node: String,
    /// VM name it plays.
    pub vm: String,
    /// The process.
    pub proc: Proc,
    /// Its metrics port.
    pub port: u16,
}

/// The forewarn processes of one run: the IMDS mock, the controller and one
/// agent per node, with what it takes to start each again.
pub struct Fleet {
    launch: Launch,
    /// The IMDS mock.
    pub mock: Proc,
    /// The controller.
    pub controller: Proc,
    /// The metrics port of the controller now running.
    pub controller_port: u16,
    /// The controller's Lease identity.
    /// The Lease identity of the controller now running.
    pub controller_identity: String,
    /// The agents.
    pub agents: Vec<Agent>,
    restarts: u32,
}

/// What a [`Fleet`] runs: the binary and its environment, the scenario,
/// the processes' identities, and how the agents run.
pub struct FleetOptions<'a> {
    /// The forewarn binary (the mock, the controller and every agent
    /// without a runner).
    pub bin: &'a Path,
    /// Environment of every process.
    pub env: &'a [(&'a str, &'a str)],
    /// Where each process's log goes.
    pub log_dir: &'a Path,
    /// The mock's scenario file.
    pub scenario: &'a Path,
    /// The mock's listen address (`host:0` for any free port).
    pub listen: &'a str,
    /// The controller's Lease name.
    pub lease: &'a str,
    /// One agent per `(node, vm)`.
    pub vms: &'a [(String, String)],
    /// The controller and the agents authenticate as these when given (the
    /// mock needs none).
    pub credentials: Option<Credentials>,
    /// The agents of these nodes run by their [`AgentRunner`] (another
    /// platform's binary).
    pub runners: BTreeMap<String, AgentRunner>,
    /// The agents report other VMs' events only as the witnesses the
    /// controller asks for (`--witnesses`), as the chart runs them. Off:
    /// every event they see, as an agent run without the flag does (the
    /// trust model's tests, whose killed agents keep a Ready pod, need
    /// their honest bystanders' reports).
    pub witnesses: bool,
}

impl<'a> FleetOptions<'a> {
    /// The options with no credentials and no runners.
    pub fn new(
        bin: &'a Path,
        env: &'a [(&'a str, &'a str)],
        log_dir: &'a Path,
        scenario: &'a Path,
        listen: &'a str,
        lease: &'a str,
        vms: &'a [(String, String)],
    ) -> Self {
        Self {
            bin,
            env,
            log_dir,
            scenario,
            listen,
            lease,
            vms,
            credentials: None,
            runners: BTreeMap::new(),
            witnesses: false,
        }
    }
}

/// Starts `forewarn imds-mock` for `scenario` on `listen` (held until
/// `POST /mock/start` when `hold`), its log in `log_dir`; returns it and its
/// base URL, read from its first line.
///
/// # Errors
/// When it cannot start or prints no address.
pub async fn start_imds_mock(
    bin: &Path,
    scenario: &Path,
    listen: &str,
    hold: bool,
    env: &[(&str, &str)],
    log_dir: &Path,
) -> anyhow::Result<(Proc, String)> {
    let mut args = vec![
        "imds-mock".to_string(),
        "--scenario".into(),
        scenario.to_string_lossy().into(),
        "--listen".into(),
        listen.into(),
    ];
    if hold {
        args.push("--hold".into());
    }
    let (mock, stdout) = Proc::spawn("imds-mock", bin, &args, env, log_dir, "imds-mock")?;
    let base = read_mock_address(stdout.context("mock stdout")?, mock.log.clone()).await?;
    Ok((mock, base))
}

impl Fleet {
    /// Starts the mock (held until `POST /mock/start`) for the scenario,
    /// then the controller (its Lease) and one agent per `(node, vm)`.
    ///
    /// # Errors
    /// When a process cannot start, the mock prints no address, a node's
    /// agent has no credentials, or a runner is for a node without a VM.
    pub async fn start(o: FleetOptions<'_>) -> anyhow::Result<Self> {
        let FleetOptions {
            bin,
            env,
            log_dir,
            scenario,
            listen,
            lease,
            vms,
            credentials,
            runners,
            witnesses,
        } = o;
        if let Some(node) = runners.keys().find(|n| !vms.iter().any(|(v, _)| v == *n)) {
            bail!("an agent runner for {node}, which has no VM in the scenario");
        }
        let (mock, imds_base) = start_imds_mock(bin, scenario, listen, true, env, log_dir).await?;
        let launch = Launch {
            bin: bin.to_path_buf(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
            log_dir: log_dir.to_path_buf(),
            imds_base,
            lease: lease.into(),
            witnesses,
            credentials,
            runners,
        };
        let controller_identity = "controller-0".to_string();
        let (controller, controller_port) = launch
            .controller("controller", &controller_identity)
            .await?;
        let mut agents = Vec::new();
        for (node, vm) in vms {
            agents.push(Agent {
                node: node.clone(),
                vm: vm.clone(),
                proc: launch.agent(node, vm, &format!("agent-{node}"))?,
                port: 0,
            });
        }
        for a in &mut agents {
            a.port = a.proc.metrics_port(PORT_WITHIN).await?;
        }
        Ok(Fleet {
            launch,
            mock,
            controller,
            controller_port,
            controller_identity,
            agents,
            restarts: 0,
        })
    }

    /// The mock's base URL, `http://ADDR`.
    pub fn imds_base(&self) -> &str {
        &self.launch.imds_base
    }

    /// Starts the mock's scenario clock (`POST /mock/start`).
    ///
    /// # Errors
    /// When the mock does not answer 2xx.
    pub async fn start_mock(&self, http: &reqwest::Client) -> anyhow::Result<()> {
        http.post(format!("{}/mock/start", self.imds_base()))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// The mock's log of what IMDS did (`GET /mock/log`).
    ///
    /// # Errors
    /// When the mock does not answer 2xx with its JSON log.
    pub async fn mock_log(&self, http: &reqwest::Client) -> anyhow::Result<Vec<LogEntry>> {
        Ok(http
            .get(format!("{}/mock/log", self.imds_base()))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// Waits until the controller and every agent answer `/readyz`.
    ///
    /// # Errors
    /// When one is not ready within `within`; the message has its log's tail.
    pub async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        let all = std::iter::once((&self.controller, self.controller_port))
            .chain(self.agents.iter().map(|a| (&a.proc, a.port)));
        for (p, port) in all {
            if let Err(e) = wait_ready(port, within).await {
                bail!(
                    "{} did not become ready: {e}\n--- last log lines ({}) ---\n{}",
                    p.name,
                    p.log.display(),
                    p.log_tail(30)
                );
            }
        }
        Ok(())
    }

    /// SIGKILLs the controller and starts a new one, as a new pod would
    /// (another Lease identity).
    ///
    /// # Errors
    /// When the new one cannot start.
    pub async fn restart_controller(&mut self) -> anyhow::Result<()> {
        self.controller.kill().await;
        self.restarts += 1;
        let file = format!("controller-{}", self.restarts);
        self.controller_identity.clone_from(&file);
        (self.controller, self.controller_port) = self
            .launch
            .controller(&file, &self.controller_identity)
            .await?;
        Ok(())
    }

    /// Starts the controller again after it exited, as its kubelet restarts
    /// the container in the same pod: the same Lease identity (the chart's
    /// default identity is the pod name and the process id, 1 in the
    /// container), so it may take back its own Lease at once.
    ///
    /// # Errors
    /// When it cannot start.
    pub async fn restart_controller_container(&mut self) -> anyhow::Result<()> {
        self.controller.kill().await;
        self.restarts += 1;
        (self.controller, self.controller_port) = self
            .launch
            .controller(
                &format!("controller-{}", self.restarts),
                &self.controller_identity,
            )
            .await?;
        Ok(())
    }

    /// SIGKILLs the agent of `node`; it stays down until [`Fleet::start_agent`].
    pub async fn kill_agent(&mut self, node: &str) {
        if let Some(a) = self.agents.iter_mut().find(|a| a.node == node) {
            a.proc.kill().await;
        }
    }

    /// Starts the agent of `node` again after [`Fleet::kill_agent`].
    ///
    /// # Errors
    /// When there is no such agent or it cannot start.
    pub async fn start_agent(&mut self, node: &str) -> anyhow::Result<()> {
        self.restarts += 1;
        let file = format!("agent-{node}-{}", self.restarts);
        let Some(a) = self.agents.iter_mut().find(|a| a.node == node) else {
            bail!("no agent for {node}");
        };
        a.proc = self.launch.agent(node, &a.vm, &file)?;
        a.port = a.proc.metrics_port(PORT_WITHIN).await?;
        Ok(())
    }

    /// Every process (mock first).
    pub fn all_mut(&mut self) -> impl Iterator<Item = &mut Proc> {
        std::iter::once(&mut self.mock)
            .chain(std::iter::once(&mut self.controller))
            .chain(self.agents.iter_mut().map(|a| &mut a.proc))
    }

    /// Process names with their metrics ports (controller first).
    pub fn metrics_ports(&self) -> Vec<(String, u16)> {
        std::iter::once((self.controller.name.clone(), self.controller_port))
            .chain(self.agents.iter().map(|a| (a.proc.name.clone(), a.port)))
            .collect()
    }
}
