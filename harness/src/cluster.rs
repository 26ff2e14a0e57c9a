//! A local Kubernetes control plane on loopback (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and KWOK), started and stopped by
//! `hack/cluster.sh`, which builds the components once from their Go modules.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The repository root (where `hack/` is).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// helm, built once from its Go module (and cached outside the repository)
/// by `hack/build-helm.sh`; the path is looked up once per process.
///
/// # Panics
/// When `hack/build-helm.sh` fails or leaves no helm binary: the chart,
/// alert and audit tests cannot run without it, and must fail loudly.
pub fn helm_bin() -> PathBuf {
    static HELM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    HELM.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo_root().join("hack/build-helm.sh"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("failed to run hack/build-helm.sh");
        assert!(out.status.success(), "hack/build-helm.sh failed");
        let dir = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string();
        let helm = PathBuf::from(dir).join("helm");
        assert!(helm.is_file(), "no helm at {}", helm.display());
        helm
    })
    .clone()
}

/// The cluster `name` of `nodes` KWOK nodes, started once per test
/// process by the first test that asks and shared by the others (which
/// take turns on it); later calls wait for the start. Panics, naming why,
/// when it cannot start: integration tests fail, never skip.
pub fn shared(name: &str, nodes: usize) -> Cluster {
    type Cell = std::sync::Arc<std::sync::OnceLock<Result<Cluster, String>>>;
    static CLUSTERS: std::sync::Mutex<Vec<(String, Cell)>> = std::sync::Mutex::new(Vec::new());
    let cell = {
        let mut all = CLUSTERS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match all.iter().find(|(n, _)| n == name) {
            Some((_, c)) => c.clone(),
            None => {
                let c = Cell::default();
                all.push((name.to_string(), c.clone()));
                c
            }
        }
    };
    cell.get_or_init(|| Cluster::start(name, nodes).map_err(|e| format!("{e:#}")))
        .clone()
        .unwrap_or_else(|e| panic!("the local cluster {name} could not start: {e}"))
}

/// A running local cluster.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The cluster's name (`kwokctl --name`).
    pub name: String,
    /// Path of its kubeconfig.
    pub kubeconfig: PathBuf,
    /// Directory of the Kubernetes binaries (kubectl and friends).
    pub bin_dir: PathBuf,
}

fn last_line(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn run_script(args: &[&str]) -> anyhow::Result<String> {
    run_script_with(args, &[])
}

fn run_script_with(args: &[&str], env: &[(&str, &Path)]) -> anyhow::Result<String> {
    let script = repo_root().join("hack").join(args[0]);
    let out = Command::new("bash")
        .arg(&script)
        .args(&args[1..])
        .envs(env.iter().copied())
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("failed to run {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} {} failed with {}",
            script.display(),
            args[1..].join(" "),
            out.status
        );
    }
    Ok(last_line(&out.stdout))
}

impl Cluster {
    /// Starts (or restarts from scratch) the cluster `name` with `nodes` KWOK
    /// nodes, installs the `ScheduledEvent` CRD and waits for it.
    ///
    /// # Errors
    /// When the components cannot be built or the cluster does not come up;
    /// the message says which step failed.
    pub fn start(name: &str, nodes: usize) -> anyhow::Result<Self> {
        Self::start_with(name, nodes, &[])
    }

    /// [`Cluster::start`] with `env` set for `hack/cluster.sh up` (e.g.
    /// `FOREWARN_KUBE_AUDIT_POLICY`).
    ///
    /// # Errors
    /// As [`Cluster::start`].
    pub fn start_with(name: &str, nodes: usize, env: &[(&str, &Path)]) -> anyhow::Result<Self> {
        let bin_dir = PathBuf::from(
            run_script(&["build-k8s.sh"])
                .context("building the Kubernetes components failed (see the log above)")?,
        );
        // kwokctl picks free ports when it creates the cluster; with other
        // clusters and test servers starting side by side, one may be taken
        // before its component binds it (etcd: `bind: address already in
        // use`, seen once in `make test`). A second creation picks others.
        let up = || {
            run_script_with(
                &[
                    "cluster.sh",
                    "up",
                    "--name",
                    name,
                    "--nodes",
                    &nodes.to_string(),
                ],
                env,
            )
        };
        let kubeconfig = PathBuf::from(
            up().or_else(|e| {
                eprintln!(
                    "[harness] creating cluster {name} failed ({e:#}); creating it once more"
                );
                up()
            })
            .context("starting the local cluster failed twice (see the log above)")?,
        );
        if !kubeconfig.is_file() {
            bail!(
                "hack/cluster.sh up did not produce a kubeconfig at {}",
                kubeconfig.display()
            );
        }
        let cluster = Cluster {
            name: name.into(),
            kubeconfig,
            bin_dir,
        };
        let crds = repo_root().join("crds");
        cluster.kubectl(&["apply", "--server-side", "-f", &crds.to_string_lossy()])?;
        // `kubectl wait` fails at once (it does not wait) while a CRD just
        // applied has no status conditions yet: ask again until it answers.
        // A hang bound: established within a second or so.
        let started = std::time::Instant::now();
        loop {
            match cluster.kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/scheduledevents.forewarn.dev",
                "crd/scheduledeventreports.forewarn.dev",
                "crd/virtualmachinereports.forewarn.dev",
            ]) {
                Ok(_) => break,
                Err(e) if started.elapsed() > std::time::Duration::from_secs(60) => return Err(e),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
            }
        }
        Ok(cluster)
    }

    /// Deletes the cluster.
    ///
    /// # Errors
    /// When `hack/cluster.sh down` fails.
    pub fn stop(&self) -> anyhow::Result<()> {
        run_script(&["cluster.sh", "down", "--name", &self.name]).map(|_| ())
    }

    /// The API server's audit log (of a cluster started with
    /// `FOREWARN_KUBE_AUDIT_POLICY`), one JSON line per entry, oldest first:
    /// the files kube-apiserver rotated away (`audit-<time>.log`, at 100 MB
    /// each by default), then `audit.log`.
    ///
    /// # Errors
    /// When the log directory or a file cannot be read, or there is no log.
    pub fn audit_log(&self) -> anyhow::Result<String> {
        let dir = self
            .kubeconfig
            .parent()
            .context("the cluster's directory")?
            .join("logs");
        let mut rotated: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("failed to read {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("audit-") && n.ends_with(".log"))
            })
            .collect();
        rotated.sort();
        rotated.push(dir.join("audit.log"));
        let mut text = String::new();
        for file in rotated {
            text.push_str(
                &std::fs::read_to_string(&file)
                    .with_context(|| format!("no audit log at {}", file.display()))?,
            );
        }
        Ok(text)
    }

    /// Path of `kubectl`.
    pub fn kubectl_path(&self) -> PathBuf {
        self.bin_dir.join("kubectl")
    }

    /// Runs kubectl against the cluster and returns its stdout.
    ///
    /// # Errors
    /// When kubectl exits non-zero (its stderr is in the message).
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(self.kubectl_path())
            .env("KUBECONFIG", &self.kubeconfig)
            // Keep kubectl's discovery cache out of ~/.kube.
            .env("KUBECACHEDIR", self.bin_dir.join("../kubectl-cache"))
            .args(args)
            .output()
            .context("failed to run kubectl")?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Stops the cluster's kube-apiserver process for real: SIGTERM, then
    /// SIGKILL as soon as it stopped listening (its graceful shutdown would
    /// keep serving open watches for up to a minute); etcd, the other
    /// components and KWOK keep running. The process is the one `kwokctl`
    /// (binary runtime) started and named in `pids/kube-apiserver.pid` of the
    /// cluster's directory. While it is down its port is held by a listener
    /// that closes every connection at once (clients fail at once, as
    /// behind a load balancer with no server left), so that no other
    /// cluster created meanwhile takes the port: a socket merely bound would
    /// not stop another `SO_REUSEADDR` listener (etcd's, say).
    /// [`Cluster::start_api_server`] starts it again with the same command
    /// line.
    ///
    /// # Errors
    /// When the pid file names no running kube-apiserver of this cluster, or
    /// the process does not exit.
    pub fn stop_api_server(&self) -> anyhow::Result<StoppedApiServer> {
        let dir = self
            .kubeconfig
            .parent()
            .context("the kubeconfig has no parent directory")?
            .to_path_buf();
        let Component { pid, argv, .. } = Component::read(&dir, "kube-apiserver")?;
        let others = restartable(&dir);
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let flag = |name: &str| {
            argv.iter()
                .find_map(|a| a.strip_prefix(&format!("--{name}=")))
                .map(str::to_string)
        };
        let addr: std::net::SocketAddr = format!(
            "{}:{}",
            flag("bind-address").unwrap_or_else(|| "127.0.0.1".into()),
            flag("secure-port").context("kube-apiserver has no --secure-port")?
        )
        .parse()
        .context("failed to parse kube-apiserver's address")?;
        let signal = |sig: &str| {
            Command::new("kill")
                .args([sig, &pid])
                .status()
                .with_context(|| format!("failed to run kill {sig} {pid}"))
        };
        signal("-TERM")?;
        let started = std::time::Instant::now();
        let mut placeholder = None;
        let mut killed = false;
        loop {
            let exited = !proc_dir.exists() || is_zombie(&proc_dir);
            if placeholder.is_none() {
                // Free as soon as it stops listening, before it exits.
                placeholder = hold_port(addr).ok();
            }
            if exited && placeholder.is_some() {
                break;
            }
            // Its graceful shutdown would serve open watches for up to a
            // minute: once it stopped listening (or after a second), kill it.
            if !exited
                && !killed
                && (placeholder.is_some() || started.elapsed() > std::time::Duration::from_secs(1))
            {
                signal("-KILL")?;
                killed = true;
            }
            // A hang bound: SIGKILLed within a second, it is gone at once.
            if started.elapsed() > std::time::Duration::from_secs(60) {
                bail!(
                    "kube-apiserver (pid {pid}) did not exit or free {addr} within 60 s (exited: {exited})"
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(StoppedApiServer {
            dir,
            argv,
            placeholder,
            killed,
            others,
        })
    }

    /// Pauses the cluster's kube-apiserver (SIGSTOP): its port stays open
    /// and connections are accepted by the kernel, but no request is
    /// answered, as with an API server that hangs. Resumed (SIGCONT) by
    /// [`PausedApiServer::resume`] or when the guard is dropped.
    ///
    /// # Errors
    /// When the pid file names no running kube-apiserver of this cluster.
    pub fn pause_api_server(&self) -> anyhow::Result<PausedApiServer> {
        let dir = self
            .kubeconfig
            .parent()
            .context("the kubeconfig has no parent directory")?
            .to_path_buf();
        let Component { pid, .. } = Component::read(&dir, "kube-apiserver")?;
        let others = restartable(&dir);
        let ok = Command::new("kill")
            .args(["-STOP", &pid])
            .status()?
            .success();
        anyhow::ensure!(ok, "kill -STOP {pid} (kube-apiserver) failed");
        Ok(PausedApiServer { pid, dir, others })
    }

    /// Resumes a kube-apiserver paused by [`Cluster::pause_api_server`],
    /// waits until `/readyz` answers, and starts again every other
    /// component that exited meanwhile (see [`Cluster::start_api_server`]);
    /// returns their names.
    ///
    /// # Errors
    /// When it is not ready within 120 s or a component cannot start.
    pub fn resume_api_server(&self, paused: PausedApiServer) -> anyhow::Result<Vec<String>> {
        let (dir, others) = (paused.dir.clone(), paused.others.clone());
        drop(paused);
        // A hang bound: ready within a second or two of SIGCONT.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while self.kubectl(&["get", "--raw", "/readyz"]).is_err() {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "kube-apiserver resumed is not ready within 120 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        keep_running(&dir, others)
    }

    /// Starts a kube-apiserver stopped by [`Cluster::stop_api_server`] again
    /// (same binary and flags, same directory, output appended to its log,
    /// in a process group of its own as kwokctl starts it), records its pid
    /// in the cluster's pid file (so that `hack/cluster.sh down` stops it),
    /// and waits until `/readyz` answers. Then starts again, the same way,
    /// every other component that exited meanwhile, as their kubelet or
    /// service manager would; returns their names.
    ///
    /// # Errors
    /// When it cannot start or is not ready within 180 s, or another
    /// component cannot start.
    pub fn start_api_server(&self, mut stopped: StoppedApiServer) -> anyhow::Result<Vec<String>> {
        // Free the port for it.
        drop(stopped.placeholder.take());
        let log_path = stopped.dir.join("logs/kube-apiserver.log");
        Component {
            name: "kube-apiserver".into(),
            pid: String::new(),
            argv: stopped.argv.clone(),
        }
        .spawn(&stopped.dir)?;
        // A hang bound: it starts in a few seconds (longer on a loaded
        // machine); the wait ends as soon as `/readyz` answers.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        while self.kubectl(&["get", "--raw", "/readyz"]).is_err() {
            if std::time::Instant::now() > deadline {
                bail!(
                    "kube-apiserver started again is not ready within 180 s (log: {})",
                    log_path.display()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        keep_running(&stopped.dir, stopped.others.clone())
    }

    /// A client for the cluster.
    ///
    /// # Errors
    /// When the kubeconfig cannot be read.
    pub async fn client(&self) -> anyhow::Result<Client> {
        client_for(&self.kubeconfig).await
    }

    /// A client for the cluster that authenticates with `token` only (a
    /// TokenRequest token of a ServiceAccount, say).
    ///
    /// # Errors
    /// When the kubeconfig cannot be read.
    pub async fn client_with_token(&self, token: &str) -> anyhow::Result<Client> {
        let mut kc = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("failed to read {}", self.kubeconfig.display()))?;
        let auth: kube::config::AuthInfo =
            serde_json::from_value(serde_json::json!({ "token": token }))?;
        for a in &mut kc.auth_infos {
            a.auth_info = Some(auth.clone());
        }
        let config =
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }
}

/// kube-controller-manager and kube-scheduler may exit during an API
/// server outage (their leader Lease lost) or as it ends, and one started
/// again may exit at once (its port not yet free): watches `others` until
/// all have run for 5 s in a row (at most 30 s), starting again any that is
/// not running, as their kubelet would. Returns the names started again.
/// The components that may exit while the API server is down or paused
/// (a client that gives up, or one run with leader election, which exits
/// when it cannot renew its Lease), to start again when it is back.
fn restartable(dir: &Path) -> Vec<Component> {
    [
        "kube-controller-manager",
        "kube-scheduler",
        "kwok-controller",
    ]
    .iter()
    .filter_map(|name| Component::read(dir, name).ok())
    .collect()
}

fn keep_running(dir: &Path, mut others: Vec<Component>) -> anyhow::Result<Vec<String>> {
    let mut restarted = Vec::new();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut steady_since = std::time::Instant::now();
    loop {
        for c in &mut others {
            if !c.running() {
                c.pid = c.spawn(dir)?;
                restarted.push(c.name.clone());
                steady_since = std::time::Instant::now();
            }
        }
        let now = std::time::Instant::now();
        if now.duration_since(steady_since) >= std::time::Duration::from_secs(5) || now > until {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    Ok(restarted)
}

/// A client for the cluster of `kubeconfig`.
///
/// # Errors
/// When the kubeconfig cannot be read or used.
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("failed to read {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// A kube-apiserver paused by [`Cluster::pause_api_server`]; resumed by
/// [`Cluster::resume_api_server`], or (without restarting what exited) when
/// dropped.
#[derive(Debug)]
pub struct PausedApiServer {
    pid: String,
    dir: PathBuf,
    others: Vec<Component>,
}

impl Drop for PausedApiServer {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.pid]).status();
    }
}

/// A kube-apiserver stopped by [`Cluster::stop_api_server`]: what it takes
/// to start it again.
#[derive(Debug)]
pub struct StoppedApiServer {
    /// The cluster's directory (its working directory).
    pub dir: PathBuf,
    /// Its command line.
    pub argv: Vec<String>,
    /// The listener holding its port until it starts.
    placeholder: Option<PortHolder>,
    /// Whether it was still running after SIGTERM and was killed (SIGKILL).
    pub killed: bool,
    /// The other components, as they ran when it was stopped.
    others: Vec<Component>,
}

/// A process of the cluster that kwokctl started, as its pid file and
/// `/proc` show it.
#[derive(Debug, Clone)]
struct Component {
    name: String,
    pid: String,
    argv: Vec<String>,
}

impl Component {
    /// The running component `name` of the cluster in `dir`.
    fn read(dir: &Path, name: &str) -> anyhow::Result<Self> {
        let pid_file = dir.join(format!("pids/{name}.pid"));
        let pid = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("failed to read {}", pid_file.display()))?
            .trim()
            .to_string();
        let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
            .with_context(|| format!("{name} (pid {pid}) is not running"))?
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let dir_text = dir.to_string_lossy();
        if !argv.first().is_some_and(|a| a.ends_with(name))
            || !argv.iter().any(|a| a.contains(dir_text.as_ref()))
        {
            bail!("pid {pid} is no {name} of the cluster in {dir_text}: {argv:?}");
        }
        Ok(Component {
            name: name.into(),
            pid,
            argv,
        })
    }

    /// Whether the process read is still running.
    fn running(&self) -> bool {
        let proc_dir = PathBuf::from(format!("/proc/{}", self.pid));
        proc_dir.exists() && !is_zombie(&proc_dir)
    }

    /// Starts it again as kwokctl does: in `dir`, output appended to
    /// `logs/<name>.log`, in a process group of its own, its pid in
    /// `pids/<name>.pid`; returns the pid.
    fn spawn(&self, dir: &Path) -> anyhow::Result<String> {
        use std::os::unix::process::CommandExt as _;
        let log_path = dir.join(format!("logs/{}.log", self.name));
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&log_path)
            .with_context(|| format!("failed to open {}", log_path.display()))?;
        let child = Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("failed to start {} again", self.name))?;
        let pid = child.id().to_string();
        std::fs::write(dir.join(format!("pids/{}.pid", self.name)), &pid)?;
        Ok(pid)
    }
}

/// A listener on a stopped server's port that closes every connection it
/// accepts; dropping it frees the port.
#[derive(Debug)]
struct PortHolder {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for PortHolder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Listens on `addr` (std sets `SO_REUSEADDR`, so connections of the old
/// process in TIME_WAIT do not block it) and closes what it accepts.
fn hold_port(addr: std::net::SocketAddr) -> std::io::Result<PortHolder> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            match listener.accept() {
                Ok((conn, _)) => drop(conn),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    });
    Ok(PortHolder {
        stop,
        thread: Some(thread),
    })
}

/// Whether the process of `/proc/<pid>` has exited and awaits its reaping.
fn is_zombie(proc_dir: &Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}
