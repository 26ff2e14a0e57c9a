//! forewarn processes started by the harness: the IMDS mock, one agent per
//! node, the controller. Each logs to a file; all stop on SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A child process with its log file.
pub struct Proc {
    /// Short name, e.g. `agent node-000001`.
    pub name: String,
    /// Its stderr (and extra stdout) log.
    pub log: PathBuf,
    child: Child,
}

/// A free TCP port on 127.0.0.1 (bound and released; a tiny race is accepted).
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
        cmd.args(args)
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
            },
            stdout,
        ))
    }

    /// Sends SIGTERM and waits up to `within` for the process to exit.
    ///
    /// # Errors
    /// When it is still running after `within` (it is then killed).
    pub async fn terminate(&mut self, within: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("{} did not stop within {within:?} of SIGTERM", self.name)
            }
        }
    }

    /// Kills the process at once (SIGKILL) and reaps it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Whether the process has exited, and how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
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
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .context("the IMDS mock did not print its address within 20 s")??
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
    let http = reqwest::Client::builder()
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
