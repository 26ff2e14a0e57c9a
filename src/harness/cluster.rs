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
    let script = repo_root().join("hack").join(args[0]);
    let out = Command::new("bash")
        .arg(&script)
        .args(&args[1..])
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
        let bin_dir = PathBuf::from(
            run_script(&["build-k8s.sh"])
                .context("building the Kubernetes components failed (see the log above)")?,
        );
        let kubeconfig = PathBuf::from(
            run_script(&[
                "cluster.sh",
                "up",
                "--name",
                name,
                "--nodes",
                &nodes.to_string(),
            ])
            .context("starting the local cluster failed (see the log above)")?,
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
        let crd = repo_root().join("crds/scheduledevents.forewarn.dev.yaml");
        cluster.kubectl(&["apply", "--server-side", "-f", &crd.to_string_lossy()])?;
        cluster.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/scheduledevents.forewarn.dev",
        ])?;
        Ok(cluster)
    }

    /// Deletes the cluster.
    ///
    /// # Errors
    /// When `hack/cluster.sh down` fails.
    pub fn stop(&self) -> anyhow::Result<()> {
        run_script(&["cluster.sh", "down", "--name", &self.name]).map(|_| ())
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

    /// A client for the cluster.
    ///
    /// # Errors
    /// When the kubeconfig cannot be read.
    pub async fn client(&self) -> anyhow::Result<Client> {
        client_for(&self.kubeconfig).await
    }
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
