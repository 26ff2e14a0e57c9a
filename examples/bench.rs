//! `make bench`: the figures that say whether forewarn is fast and cheap,
//! measured from outside on local clusters (hack/cluster.sh: a real
//! kube-apiserver, KWOK nodes) with the release `forewarn` binary as IMDS
//! mock, controller and agents. A benchmark reports: a missed goal is
//! marked `MISSED` and never fails the run; a part that cannot run at all
//! (cluster down, timeout) is reported as such and makes the exit status
//! non-zero.
//!
//! The run writes `BENCHMARKS.md` (or `--out`; forewarn_harness::bench_report),
//! merged with what it holds: the runs of its parts (the command, the date,
//! the commit and whether the working tree differed from it, the machine
//! and its load averages), one table of every figure with its goal, where
//! the part measures one the reference measured in the same run, and the
//! run that measured it; the runs' notes; a sizing section computed from
//! the scale and wave parts' figures; and a `## History` of one line per
//! run (date, commit, headline figures with their goals), this run's line
//! first. A full run (no `--only`) replaces every part; a run of some
//! parts (`--only wave,scale`) replaces those and keeps the other parts'
//! figures and runs as they were. `--out ''` writes nothing.
//!
//! Parts (`--only` picks some):
//! - `detection`: one node per event, `--detection-events` events appearing
//!   at staggered times (deliverTo: resources, so only the named VM's agent
//!   sees each); from the moment the mock's document changes to the
//!   `ScheduledEvent` seen and to the node seen cordoned (watches held by
//!   this program), p50/p99/max at the default 1 s poll.
//! - `burst`: `--burst-vms` VMs named by one event, plus `--burst-bystanders`
//!   agents not named; first the agents idle for `--idle-seconds`
//!   (footprint: RSS and CPU from `/proc`; API requests per minute), then
//!   the event: all cordoned, approval decided (`status.approval.decidedAt`)
//!   and received by IMDS (the mock's `/mock/log`, counted), and the API
//!   load of the event counted by kube-apiserver's audit log, each process
//!   impersonating a user of its own (`bench:controller`,
//!   `bench:agent:<node>`).
//! - `scale`: `--scale-nodes` KWOK nodes with `--scale-pods` pods, agents on
//!   `--scale-agents` of them (every node gets an Azure `providerID`, as on
//!   AKS, so the controller maps their VMs and the agents vouch for the
//!   nodes without one); controller RSS idle, then
//!   one event naming every VM: time until all are cordoned, against its
//!   reference (this program's own cordons of every node, timed before the
//!   event), and the controller's peak RSS, CPU and requests over the event.
//! - `wave`: a Spot wave (forewarn_harness::wave): `--wave-vms` Spot VMs,
//!   each with its own agent and its own `Preempt` event of 30 s notice,
//!   all appearing within one second and delivered to every VM of the
//!   group, `--wave-pods-per-node` pods per node under PodDisruptionBudgets.
//!   Per event: from the IMDS change to its node cordoned and to its
//!   first eviction (the API server's answer granting it, from the audit
//!   log), the pods still running at `NotBefore` (their
//!   `deletionTimestamp` after it), the approvals IMDS received, the agents'
//!   report writes, and the API requests by verb and resource (the
//!   controller's and the agents', from the audit log); the controller's
//!   memory and CPU; the reference: this program's own cordons of the
//!   wave's nodes.
//! - `peer-wave`: the same wave of `--peer-wave-vms` VMs (20: the wave
//!   the goals of the wave part were set against, a node agent that
//!   cordons for itself measured on it), with spare nodes for its
//!   replacements and the controller's default eviction budget and
//!   reconcile concurrency.
//! - `size`: the size of the stripped release executable.
//! - `drain`: `bench_drain` (forewarn against `kubectl drain`, its
//!   reference), run as a child with the same executable.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use clap::Parser;
use forewarn::api::{CORDONED_FOR_ANNOTATION, ScheduledEvent};
use forewarn::imds::mock::LogEntry;
use forewarn_harness::bench_report::{self, Header, Report, Row, thousands};
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::procs::{Credentials, Fleet, FleetOptions};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

/// Runs the benchmarks; a full run writes BENCHMARKS.md, a run of some
/// parts `target/bench-<parts>.md`.
#[derive(Parser, Clone)]
struct Args {
    /// The forewarn executable to measure (default: `release/forewarn` in the
    /// target dir this program was built in).
    #[arg(long)]
    forewarn_bin: Option<PathBuf>,
    /// Parts to run, comma-separated, of: size, detection, burst, scale,
    /// wave, drain (default: all, a full run). A run of some parts
    /// replaces their figures in the document and keeps the others'.
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Events (and nodes) of the detection part.
    #[arg(long, default_value_t = 60)]
    detection_events: usize,
    /// VMs named by the burst event (one node and agent each).
    #[arg(long, default_value_t = 100)]
    burst_vms: usize,
    /// Times the burst event is played (one after another, 30 s apart).
    #[arg(long, default_value_t = 3)]
    burst_events: usize,
    /// Agents of the burst part on nodes the event does not name.
    #[arg(long, default_value_t = 20)]
    burst_bystanders: usize,
    /// Idle time measured before the burst event (footprint, idle API load).
    #[arg(long, default_value_t = 300)]
    idle_seconds: u64,
    /// Nodes of the scale part.
    #[arg(long, default_value_t = 1000)]
    scale_nodes: usize,
    /// Pods of the scale part (spread over the nodes by the scheduler).
    #[arg(long, default_value_t = 10_000)]
    scale_pods: usize,
    /// Agents of the scale part (the other nodes are annotated directly).
    #[arg(long, default_value_t = 100)]
    scale_agents: usize,
    /// Runs of each drain in the drain part.
    #[arg(long, default_value_t = 5)]
    drain_runs: usize,
    /// Spot VMs of the wave part (one node and agent each), each evicted
    /// by its own Preempt event.
    #[arg(long, default_value_t = 200)]
    wave_vms: usize,
    /// Workload pods per node of the wave part.
    #[arg(long, default_value_t = 10)]
    wave_pods_per_node: usize,
    /// Nodes of the wave part outside the wave (its pods' replacements go
    /// there). KWOK's nodes take 110 pods each: 20 hold every replacement
    /// of the default wave's 2,000 pods, so no budget stays closed for want
    /// of room.
    #[arg(long, default_value_t = 20)]
    wave_spares: usize,
    /// The controller's eviction rate budget in the wave part (per second;
    /// burst twice that): the sizing section's value for the wave's pods
    /// (docs/install.md, "Sizing").
    #[arg(long, default_value_t = 120)]
    wave_eviction_qps: u32,
    /// The controller's reconcile concurrency in the wave part
    /// (`--reconcile-concurrency`; 16 is its default): the sizing
    /// section's value for a Spot pool of 200 nodes, as the eviction
    /// budget is (from an event's object created to its cordon sent, at
    /// p99: 1.00-1.75 s at 16; 0.52-0.82 s at 48).
    #[arg(long, default_value_t = 48)]
    wave_reconcile_concurrency: u16,
    /// Spot VMs of the peer-wave part.
    #[arg(long, default_value_t = 20)]
    peer_wave_vms: usize,
    /// Where to write the document, relative to the repository, merged
    /// with what that file holds (empty: do not write; default:
    /// BENCHMARKS.md).
    #[arg(long)]
    out: Option<String>,
}

/// Cluster names of the benchmark (never used by `make test`).
const CLUSTER: &str = "forewarn-bench";
const CLUSTER_SCALE: &str = "forewarn-bench2";

/// Cluster name of the wave part (never used by `make test`);
/// `FOREWARN_BENCH_WAVE_CLUSTER` names another.
const CLUSTER_WAVE: &str = "forewarn-bench-wave";

/// The parts, in the order they run.
const PARTS: [&str; 7] = [
    "size",
    "detection",
    "burst",
    "scale",
    "wave",
    "peer-wave",
    "drain",
];

/// Pods one KWOK node takes (its `status.allocatable.pods`).
const KWOK_PODS_PER_NODE: usize = 110;

/// The peer-wave part's arguments: the wave part's, with
/// `--peer-wave-vms` VMs, spare nodes for all their pods' replacements and
/// one more, and the controller's defaults (eviction budget 20/s, burst
/// 40; reconcile concurrency 16): a pool of 20 needs no sizing.
fn peer_wave_args(args: &Args) -> Args {
    let vms = args.peer_wave_vms.max(1);
    Args {
        wave_vms: vms,
        wave_spares: (vms * args.wave_pods_per_node).div_ceil(KWOK_PODS_PER_NODE) + 1,
        wave_eviction_qps: 20,
        wave_reconcile_concurrency: 16,
        ..args.clone()
    }
}

/// The run's figures ([`Report`]), each printed as it comes (a full run
/// takes over half an hour).
#[derive(Default)]
struct Table(Report);

impl Table {
    fn add(
        &mut self,
        part: &str,
        figure: &str,
        measured: String,
        goal: &str,
        met: Option<bool>,
    ) -> &mut Row {
        println!(
            "[bench] {part}: {figure}: {measured}{}",
            if goal.is_empty() {
                String::new()
            } else {
                format!(" (goal {goal})")
            }
        );
        self.0.add(part, figure, measured, goal, met)
    }

    fn note(&mut self, text: String) {
        println!("[bench] note: {text}");
        self.0.note(text);
    }

    /// Records a figure as a number for the sizing section.
    fn figure(&mut self, name: &str, value: f64) {
        self.0.figure(name, value);
    }
}

// ---------------------------------------------------------------------------
// Clusters, processes, /proc

/// Starts (or re-creates) the local cluster `name` with `nodes` KWOK nodes,
/// with an audit log when `audit` is set (every request at level Metadata
/// but the node leases), and installs the CRD.
fn start_cluster(name: &str, nodes: usize, audit: bool) -> anyhow::Result<Cluster> {
    let policy = std::env::temp_dir().join(format!("forewarn-bench-audit-{name}.yaml"));
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: None\n  namespaces: [kube-node-lease]\n- level: Metadata\n",
    )?;
    let env = [("FOREWARN_KUBE_AUDIT_POLICY", policy.as_path())];
    Cluster::start_with(name, nodes, if audit { &env } else { &[] })
}

/// A copy of the cluster's kubeconfig that impersonates `user` (in group
/// `system:masters`, so every request is allowed, as with the admin's).
fn impersonating_kubeconfig(cluster: &Cluster, dir: &Path, user: &str) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(&cluster.kubeconfig)?;
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let users = doc
        .get_mut("users")
        .and_then(|u| u.as_sequence_mut())
        .context("kubeconfig without users")?;
    for u in users {
        let entry = u
            .get_mut("user")
            .and_then(|v| v.as_mapping_mut())
            .context("kubeconfig user without a `user` map")?;
        entry.insert("as".into(), user.into());
        entry.insert(
            "as-groups".into(),
            serde_yaml::Value::Sequence(vec!["system:masters".into()]),
        );
    }
    let path = dir.join(format!("kubeconfig-{}.yaml", user.replace(':', "-")));
    std::fs::write(&path, serde_yaml::to_string(&doc)?)?;
    Ok(path)
}

/// VmRSS, RssAnon and VmHWM (bytes), and utime+stime (seconds) of a process.
#[derive(Debug, Clone, Copy, Default)]
struct ProcStat {
    rss: u64,
    /// RssAnon: the part not backed by the executable's file pages.
    anon: u64,
    hwm: u64,
    cpu: f64,
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

fn proc_stat(pid: u32, ticks: f64) -> anyhow::Result<ProcStat> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime 15.
    let utime: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let stime: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    Ok(ProcStat {
        rss: kb("VmRSS:"),
        anon: kb("RssAnon:"),
        hwm: kb("VmHWM:"),
        cpu: (utime + stime) / ticks,
    })
}

/// CPU seconds (user + system) used so far by every process of this
/// machine, summed by kind: a Kubernetes component by its executable's
/// name, forewarn's processes by their role (`forewarn agent`,
/// `forewarn controller`, `forewarn imds-mock`), anything else as `other`.
/// Read at two moments, the difference says where the machine's CPU went
/// meanwhile (a process that ended between them is missed).
fn cpu_by_kind(ticks: f64) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let exe = args
            .first()
            .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
            .unwrap_or_default();
        let kind = match exe.as_str() {
            "forewarn" => format!("forewarn {}", args.get(1).cloned().unwrap_or_default()),
            "kube-apiserver" | "etcd" | "kube-controller-manager" | "kube-scheduler" | "kwok" => {
                exe
            }
            _ => "other".to_string(),
        };
        let Ok(p) = proc_stat(pid, ticks) else {
            continue;
        };
        *out.entry(kind).or_insert(0.0) += p.cpu;
    }
    out
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn forewarn_env(cluster: &Cluster) -> Vec<(String, String)> {
    vec![
        (
            "KUBECONFIG".into(),
            cluster.kubeconfig.to_string_lossy().into_owned(),
        ),
        ("RUST_LOG".into(), "info,kube=warn".into()),
    ]
}

/// The chart's default `controller.mallocEnv` (charts/forewarn/values.yaml):
/// the glibc malloc settings the chart runs the controller with, as
/// `(name, value)`.
fn chart_malloc_env() -> anyhow::Result<Vec<(String, String)>> {
    let path = repo_root().join("charts/forewarn/values.yaml");
    let values: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    let env = values["controller"]["mallocEnv"]
        .as_mapping()
        .with_context(|| format!("{} has no controller.mallocEnv", path.display()))?;
    env.iter()
        .map(|(k, v)| {
            let (Some(k), Some(v)) = (k.as_str(), v.as_str()) else {
                anyhow::bail!(
                    "controller.mallocEnv in {} is not strings: {k:?}: {v:?}",
                    path.display()
                );
            };
            Ok((k.to_owned(), v.to_owned()))
        })
        .collect()
}

async fn start_fleet(
    cluster: &Cluster,
    bin: &Path,
    dir: &Path,
    scenario: &str,
    vms: &[(String, String)],
    credentials: Option<Credentials>,
    extra_env: &[(&str, &str)],
) -> anyhow::Result<Fleet> {
    std::fs::create_dir_all(dir)?;
    let file = dir.join("scenario.yaml");
    std::fs::write(&file, scenario)?;
    let env = forewarn_env(cluster);
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    env.extend_from_slice(extra_env);
    let lease = format!("bench-{}", std::process::id());
    let fleet = Fleet::start(FleetOptions {
        // The agents as the chart runs them.
        witnesses: true,
        credentials,
        ..FleetOptions::new(bin, &env, dir, &file, "127.0.0.1:0", &lease, vms)
    })
    .await?;
    fleet.wait_ready(Duration::from_secs(120)).await?;
    Ok(fleet)
}

async fn stop_fleet(mut fleet: Fleet) {
    for p in fleet.all_mut() {
        let _ = p.terminate(Duration::from_secs(15)).await;
    }
}

/// Starts the mock's clock; returns the time it stands for (the midpoint of
/// the request, within a millisecond or two on loopback).
async fn start_mock(http: &reqwest::Client, fleet: &Fleet) -> anyhow::Result<DateTime<Utc>> {
    let before = Utc::now();
    fleet.start_mock(http).await?;
    let after = Utc::now();
    Ok(before + (after - before) / 2)
}

// ---------------------------------------------------------------------------
// Watches held by the benchmark: when each node was seen cordoned and
// released by forewarn, when each ScheduledEvent was first seen and its
// approval decided.

#[derive(Default)]
struct Seen {
    /// Every time each node was seen turning held (cordoned by forewarn).
    cordoned: HashMap<String, Vec<DateTime<Utc>>>,
    /// Every time each node was seen released after a hold.
    released: HashMap<String, Vec<DateTime<Utc>>>,
    held: HashSet<String>,
    sev_first: HashMap<String, DateTime<Utc>>,
    approval_decided: HashMap<String, (DateTime<Utc>, Option<DateTime<Utc>>)>,
    phase: HashMap<String, String>,
    /// Each event's `NotBefore` as its `ScheduledEvent` first showed it.
    not_before: HashMap<String, DateTime<Utc>>,
    /// Whether both watches have listed once.
    nodes_synced: bool,
    sevs_synced: bool,
}

struct Watches {
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Seen {
    /// When `node` was seen cordoned for the `k`-th time (from 0).
    fn cordon(&self, node: &str, k: usize) -> Option<DateTime<Utc>> {
        self.cordoned.get(node).and_then(|v| v.get(k)).copied()
    }

    /// When `node` was seen released for the `k`-th time (from 0).
    fn release(&self, node: &str, k: usize) -> Option<DateTime<Utc>> {
        self.released.get(node).and_then(|v| v.get(k)).copied()
    }
}

impl Watches {
    async fn start(client: &Client) -> anyhow::Result<Self> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let nodes: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
        let s = seen.clone();
        let node_task = tokio::spawn(async move {
            let mut stream = watcher::watcher(nodes, watcher::Config::default()).boxed();
            while let Some(ev) = stream.next().await {
                let now = Utc::now();
                let Ok(ev) = ev else { continue };
                let mut seen = s.lock().unwrap_or_else(|p| p.into_inner());
                match ev {
                    watcher::Event::Apply(m) | watcher::Event::InitApply(m) => {
                        let held = m
                            .annotations()
                            .get(CORDONED_FOR_ANNOTATION)
                            .is_some_and(|v| !v.is_empty());
                        let name = m.name_any();
                        if held && seen.held.insert(name.clone()) {
                            seen.cordoned.entry(name).or_default().push(now);
                        } else if !held && seen.held.remove(&name) {
                            seen.released.entry(name).or_default().push(now);
                        }
                    }
                    watcher::Event::InitDone => seen.nodes_synced = true,
                    _ => {}
                }
            }
        });
        let sevs: Api<ScheduledEvent> = Api::all(client.clone());
        let s = seen.clone();
        let sev_task = tokio::spawn(async move {
            let mut stream = watcher::watcher(sevs, watcher::Config::default()).boxed();
            while let Some(ev) = stream.next().await {
                let now = Utc::now();
                let Ok(ev) = ev else { continue };
                let mut seen = s.lock().unwrap_or_else(|p| p.into_inner());
                match ev {
                    watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                        let id = o.spec.event_id.to_ascii_lowercase();
                        seen.sev_first.entry(id.clone()).or_insert(now);
                        if let Some(nb) = o.spec.not_before {
                            seen.not_before.entry(id.clone()).or_insert(nb);
                        }
                        if let Some(status) = &o.status {
                            if let Some(a) = &status.approval
                                && a.decided_at.is_some()
                            {
                                seen.approval_decided
                                    .entry(id.clone())
                                    .or_insert((now, a.decided_at));
                            }
                            if let Some(p) = &status.phase {
                                seen.phase.insert(id, format!("{p:?}"));
                            }
                        }
                    }
                    watcher::Event::InitDone => seen.sevs_synced = true,
                    _ => {}
                }
            }
        });
        let w = Watches {
            seen,
            tasks: vec![node_task, sev_task],
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !w.with(|s| s.nodes_synced && s.sevs_synced) {
            if Instant::now() > deadline {
                bail!("the benchmark's watches did not list within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(w)
    }

    fn with<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Waits until `done` holds, up to `within`.
    async fn wait(
        &self,
        within: Duration,
        what: &str,
        done: impl Fn(&Seen) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        while !self.with(&done) {
            if Instant::now() > deadline {
                bail!("timed out after {within:?} waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

fn secs(d: chrono::TimeDelta) -> f64 {
    d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

fn event_id(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

fn node_name(i: usize) -> String {
    format!("node-{i:06}")
}

fn vm_name(i: usize) -> String {
    format!("bench-vmss_{i}")
}

fn vms_yaml(range: std::ops::Range<usize>, with_node: impl Fn(usize) -> bool) -> String {
    let mut s = String::from("vms:\n");
    for i in range {
        if with_node(i) {
            let _ = writeln!(s, "  - {{name: {}, node: {}}}", vm_name(i), node_name(i));
        } else {
            let _ = writeln!(s, "  - {{name: {}}}", vm_name(i));
        }
    }
    s
}

fn run_dir(part: &str) -> PathBuf {
    repo_root().join(format!("target/forewarn-bench/{part}"))
}

// ---------------------------------------------------------------------------
// 1. Detection

async fn detection(args: &Args, bin: &Path, table: &mut Table) -> anyhow::Result<()> {
    let n = args.detection_events;
    let cluster = tokio::task::spawn_blocking(move || start_cluster(CLUSTER, n, false)).await??;
    let client = cluster.client().await?;
    // Appearances 613 ms apart: every phase of the 1 s poll gets sampled.
    let at = |i: usize| Duration::from_millis(3000 + 613 * i as u64);
    let mut scenario = vms_yaml(0..n, |_| true);
    scenario.push_str("events:\n");
    for i in 0..n {
        let _ = writeln!(
            scenario,
            "  - {{id: {}, type: Redeploy, resources: [{}], at: {}ms, notice: 10m, runFor: 2s, deliverTo: resources}}",
            event_id(i),
            vm_name(i),
            at(i).as_millis()
        );
    }
    let vms: Vec<(String, String)> = (0..n).map(|i| (node_name(i), vm_name(i))).collect();
    let fleet = start_fleet(
        &cluster,
        bin,
        &run_dir("detection"),
        &scenario,
        &vms,
        None,
        &[],
    )
    .await?;
    let watches = Watches::start(&client).await?;
    let http = forewarn::http::client_builder().no_proxy().build()?;
    // Let the agents reach their steady poll first.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let origin = start_mock(&http, &fleet).await?;
    let within = at(n) + Duration::from_secs(60);
    let result = watches
        .wait(within, "every detection node cordoned", |s| {
            (0..n).all(|i| s.cordon(&node_name(i), 0).is_some())
        })
        .await;
    let (mut to_sev, mut to_cordon) = (Vec::new(), Vec::new());
    watches.with(|s| {
        for i in 0..n {
            let changed = origin + at(i);
            if let Some(t) = s.sev_first.get(&event_id(i)) {
                to_sev.push(secs(*t - changed));
            }
            if let Some(t) = s.cordon(&node_name(i), 0) {
                to_cordon.push(secs(t - changed));
            }
        }
    });
    stop_fleet(fleet).await;
    drop(watches);
    let _ = cluster.stop();
    result?;
    let (to_sev, to_cordon) = (sorted(to_sev), sorted(to_cordon));
    let fmt = |v: &[f64]| {
        format!(
            "p50 {:.2} s, p99 {:.2} s, max {:.2} s ({} events)",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.last().copied().unwrap_or(f64::NAN),
            v.len()
        )
    };
    table.add(
        "1 detection",
        "IMDS change → ScheduledEvent exists",
        fmt(&to_sev),
        "",
        None,
    );
    let p99 = percentile(&to_cordon, 0.99);
    table
        .add(
            "1 detection",
            "IMDS change → node cordoned",
            fmt(&to_cordon),
            "p99 ≤ 1.5 s",
            Some(p99 <= 1.5),
        )
        .headline(
            format!("node cordoned within {p99:.2} s of the IMDS change at p99"),
            None,
        );
    Ok(())
}

// ---------------------------------------------------------------------------
// Audit log

#[derive(Debug, Clone)]
struct Request {
    user: String,
    verb: String,
    resource: String,
    subresource: String,
    /// `objectRef.name` (empty for a list or a collection).
    name: String,
    /// The HTTP status answered (0 when the log has none).
    code: u64,
    at: DateTime<Utc>,
    /// How long the API server took to answer, in seconds: the audit
    /// event's `stageTimestamp` (its response) minus its
    /// `requestReceivedTimestamp` (none for a watch still open).
    took: Option<f64>,
}

impl Request {
    /// When the API server answered it: its receipt plus [`Self::took`]
    /// (the receipt when the log has no answer).
    fn answered(&self) -> DateTime<Utc> {
        self.at + chrono::TimeDelta::microseconds((self.took.unwrap_or(0.0) * 1e6) as i64)
    }

    /// `verb resource[/subresource]`, e.g. `create pods/eviction`.
    fn kind(&self) -> String {
        if self.subresource.is_empty() {
            format!("{} {}", self.verb, self.resource)
        } else {
            format!("{} {}/{}", self.verb, self.resource, self.subresource)
        }
    }
}

/// How many `requests` there are, and `kind count` of each kind
/// ([`Request::kind`]), the most frequent first, each count divided by
/// `per` and written with `decimals`, joined by commas.
fn by_kind<'a>(
    requests: impl Iterator<Item = &'a Request>,
    per: f64,
    decimals: usize,
) -> (usize, String) {
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut all = 0;
    for r in requests {
        all += 1;
        *kinds.entry(r.kind()).or_default() += 1;
    }
    let mut kinds: Vec<(String, usize)> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    let text = kinds
        .iter()
        .map(|(k, c)| format!("{k} {:.decimals$}", *c as f64 / per))
        .collect::<Vec<_>>()
        .join(", ");
    (all, text)
}

/// The requests made by impersonated `bench:` users, from the audit log
/// (one per audit ID, at its first stage logged).
fn audit_requests(cluster: &Cluster) -> anyhow::Result<Vec<Request>> {
    // Every file of it: at 100 MB kube-apiserver rotates it, and a 1,000-VM
    // event with 100 agents logs more than that (one run counted a fifth of
    // the controller's requests from `audit.log` alone).
    let text = cluster.audit_log()?;
    let mut ids = HashSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(user) = v
            .pointer("/impersonatedUser/username")
            .and_then(|u| u.as_str())
        else {
            continue;
        };
        if !user.starts_with("bench:") {
            continue;
        }
        let id = v["auditID"].as_str().unwrap_or_default().to_string();
        if !ids.insert(id) {
            continue;
        }
        let s = |p: &str| {
            v.pointer(p)
                .and_then(|x| x.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let Ok(at) = DateTime::parse_from_rfc3339(&s("/requestReceivedTimestamp")) else {
            continue;
        };
        out.push(Request {
            user: user.to_string(),
            verb: s("/verb"),
            resource: s("/objectRef/resource"),
            subresource: s("/objectRef/subresource"),
            name: s("/objectRef/name"),
            code: v
                .pointer("/responseStatus/code")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0),
            at: at.with_timezone(&Utc),
            took: DateTime::parse_from_rfc3339(&s("/stageTimestamp"))
                .ok()
                .filter(|_| s("/stage") == "ResponseComplete")
                .map(|end| secs(end.with_timezone(&Utc) - at.with_timezone(&Utc))),
        });
    }
    Ok(out)
}

fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

// ---------------------------------------------------------------------------
// 2. Burst (with 4. agent footprint and 5. API load)

async fn burst(args: &Args, bin: &Path, table: &mut Table) -> anyhow::Result<()> {
    let named = args.burst_vms;
    let n = named + args.burst_bystanders;
    let cluster = tokio::task::spawn_blocking(move || start_cluster(CLUSTER, n, true)).await??;
    let client = cluster.client().await?;
    let dir = run_dir("burst");
    std::fs::create_dir_all(&dir)?;
    let mut creds = Credentials {
        controller: impersonating_kubeconfig(&cluster, &dir, "bench:controller")?,
        agents: BTreeMap::new(),
        lease_namespace: "default".into(),
        lease_name: format!("bench-{}", std::process::id()),
    };
    for i in 0..n {
        creds.agents.insert(
            node_name(i),
            impersonating_kubeconfig(&cluster, &dir, &format!("bench:agent:{}", node_name(i)))?,
        );
    }
    // The same event `--burst-events` times (new EventIds), 30 s apart:
    // each is over (nodes released) within about 15 s.
    let period = Duration::from_secs(30);
    let events = args.burst_events.max(1);
    let at = |k: usize| Duration::from_secs(1) + period * k as u32;
    let ids: Vec<String> = (0..events).map(|k| event_id(900 + k)).collect();
    let resources: Vec<String> = (0..named).map(vm_name).collect();
    let mut scenario = vms_yaml(0..n, |_| true);
    scenario.push_str("events:\n");
    for (k, id) in ids.iter().enumerate() {
        let _ = writeln!(
            scenario,
            "  - {{id: {id}, type: Redeploy, resources: [{}], at: {}s, notice: 10m, runFor: 3s}}",
            resources.join(", "),
            at(k).as_secs()
        );
    }
    let vms: Vec<(String, String)> = (0..n).map(|i| (node_name(i), vm_name(i))).collect();
    let fleet = start_fleet(&cluster, bin, &dir, &scenario, &vms, Some(creds), &[]).await?;
    let watches = Watches::start(&client).await?;
    let http = forewarn::http::client_builder().no_proxy().build()?;

    // Idle: after start-up, agents polling an empty document.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let ticks = clock_ticks();
    let pids: Vec<u32> = fleet.agents.iter().filter_map(|a| a.proc.id()).collect();
    let idle_from = Utc::now();
    let before: Vec<ProcStat> = pids
        .iter()
        .map(|p| proc_stat(*p, ticks))
        .collect::<anyhow::Result<_>>()?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let after: Vec<ProcStat> = pids
        .iter()
        .map(|p| proc_stat(*p, ticks))
        .collect::<anyhow::Result<_>>()?;
    let idle_for = started.elapsed().as_secs_f64();
    let idle_to = Utc::now();
    let millicores = sorted(
        before
            .iter()
            .zip(&after)
            .map(|(b, a)| (a.cpu - b.cpu) / idle_for * 1000.0)
            .collect(),
    );
    let rss = sorted(after.iter().map(|a| mib(a.rss)).collect());
    let hwm = sorted(after.iter().map(|a| mib(a.hwm)).collect());
    let anon = sorted(after.iter().map(|a| mib(a.anon)).collect());

    // The events.
    let origin = start_mock(&http, &fleet).await?;
    let named_nodes: Vec<String> = (0..named).map(node_name).collect();
    let mut done = Vec::new();
    let mut result = Ok(());
    for k in 0..events {
        let r = async {
            watches
                .wait(period * 2, "every named node cordoned", |s| {
                    named_nodes.iter().all(|n| s.cordon(n, k).is_some())
                })
                .await?;
            watches
                .wait(period * 2, "every named node released", |s| {
                    named_nodes.iter().all(|n| s.release(n, k).is_some())
                })
                .await
        }
        .await;
        done.push(Utc::now());
        if let Err(e) = r {
            result = Err(e.context(format!("burst event {k}")));
            break;
        }
    }
    // Trailing writes (records of the release) land within a moment.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let event_hwm = pids
        .iter()
        .filter_map(|p| proc_stat(*p, ticks).ok())
        .map(|p| mib(p.hwm))
        .fold(0.0, f64::max);
    let log = fleet.mock_log(&http).await.unwrap_or_default();
    stop_fleet(fleet).await;
    let requests = audit_requests(&cluster);
    struct Burst {
        changed: DateTime<Utc>,
        seen: Option<DateTime<Utc>>,
        all_cordoned: Option<DateTime<Utc>>,
        decided: Option<(DateTime<Utc>, Option<DateTime<Utc>>)>,
        approvals: Vec<LogEntry>,
        until: DateTime<Utc>,
    }
    let bursts: Vec<Burst> = watches.with(|s| {
        ids.iter()
            .zip(&done)
            .enumerate()
            .map(|(k, (id, until))| Burst {
                changed: origin + at(k),
                seen: s.sev_first.get(id).copied(),
                all_cordoned: named_nodes.iter().map(|n| s.cordon(n, k)).max().flatten(),
                decided: s.approval_decided.get(id).copied(),
                approvals: log
                    .iter()
                    .filter(|e| e.what == "Approved" && e.event_id.eq_ignore_ascii_case(id))
                    .cloned()
                    .collect(),
                until: *until + chrono::TimeDelta::seconds(3),
            })
            .collect()
    });
    drop(watches);
    let _ = cluster.stop();
    result?;
    let requests = requests?;

    // 4. agent footprint at idle.
    table.add(
        "4 footprint",
        &format!("agent RSS idle ({} agents, release)", pids.len()),
        format!(
            "median {:.1} MiB, max {:.1} MiB (anonymous max {:.1} MiB; VmHWM max {:.1} MiB idle, {:.1} MiB after the events)",
            percentile(&rss, 0.5),
            rss.last().copied().unwrap_or(f64::NAN),
            anon.last().copied().unwrap_or(f64::NAN),
            hwm.last().copied().unwrap_or(f64::NAN),
            event_hwm
        ),
        "≤ 10 MiB",
        Some(rss.last().copied().unwrap_or(f64::INFINITY) <= 10.0),
    )
    .headline(
        format!(
            "agent RSS idle {:.1} MiB at most",
            rss.last().copied().unwrap_or(f64::NAN)
        ),
        None,
    );
    table.add(
        "4 footprint",
        &format!("agent CPU idle, 1 poll/s, over {idle_for:.0} s"),
        format!(
            "median {:.2} millicores, max {:.2}",
            percentile(&millicores, 0.5),
            millicores.last().copied().unwrap_or(f64::NAN)
        ),
        "≤ 1 millicore",
        Some(millicores.last().copied().unwrap_or(f64::INFINITY) <= 1.0),
    );

    // 5. idle API load.
    let idle_reqs = requests
        .iter()
        .filter(|r| r.user.starts_with("bench:agent:") && r.at >= idle_from && r.at <= idle_to)
        .count();
    let per_min = idle_reqs as f64 / (secs(idle_to - idle_from) / 60.0);
    table.add(
        "5 API load",
        &format!(
            "idle agents' requests ({} agents, after start-up)",
            pids.len()
        ),
        format!(
            "{per_min:.2}/min ({idle_reqs} in {:.0} s)",
            secs(idle_to - idle_from)
        ),
        "0",
        Some(idle_reqs == 0),
    );

    // 2. burst: one figure per event, in order.
    let list = |v: Vec<Option<f64>>| -> (String, f64) {
        let worst = v
            .iter()
            .map(|x| x.unwrap_or(f64::INFINITY))
            .fold(0.0, f64::max);
        let txt = v
            .iter()
            .map(|x| x.map_or("never".into(), |x| format!("{x:.2}")))
            .collect::<Vec<_>>()
            .join(", ");
        (txt, worst)
    };
    let (cordon_txt, worst) = list(
        bursts
            .iter()
            .map(|b| b.all_cordoned.map(|t| secs(t - b.changed)))
            .collect(),
    );
    let (after_seen_txt, _) = list(
        bursts
            .iter()
            .map(|b| b.all_cordoned.zip(b.seen).map(|(t, s)| secs(t - s)))
            .collect(),
    );
    table.add(
        "2 burst",
        &format!("one event naming {named} VMs, {events} times: all cordoned"),
        format!("{cordon_txt} s after the IMDS change ({after_seen_txt} s after the ScheduledEvent was seen)"),
        "≤ 1.5 s",
        Some(worst <= 1.5),
    )
    .headline(
        format!(
            "{} VMs cordoned in {cordon_txt} s",
            thousands(named)
        ),
        None,
    );
    let (decided_txt, _) = list(
        bursts
            .iter()
            .map(|b| b.decided.map(|(seen, _)| secs(seen - b.changed)))
            .collect(),
    );
    let (recorded_txt, _) = list(
        bursts
            .iter()
            .map(|b| {
                b.decided
                    .and_then(|(_, at)| at)
                    .map(|t| secs(t - b.changed))
            })
            .collect(),
    );
    table.add(
        "2 burst",
        "approval decided (seen in status.approval)",
        format!("{decided_txt} s after the IMDS change (status.approval.decidedAt records {recorded_txt} s)"),
        "",
        None,
    );
    let (received_txt, _) = list(
        bursts
            .iter()
            .map(|b| b.approvals.first().map(|a| secs(a.time - b.changed)))
            .collect(),
    );
    let counts: Vec<String> = bursts
        .iter()
        .map(|b| {
            let vms: Vec<String> = b.approvals.iter().filter_map(|a| a.vm.clone()).collect();
            if vms.len() > 1 {
                format!("{} (from {})", vms.len(), vms.join(", "))
            } else {
                vms.len().to_string()
            }
        })
        .collect();
    table.add(
        "2 burst",
        "approval received by IMDS (the mock's /mock/log)",
        format!(
            "{received_txt} s after the IMDS change; POSTs per event: {}",
            counts.join(", ")
        ),
        "exactly once",
        Some(bursts.iter().all(|b| b.approvals.len() == 1)),
    );

    // 5. API load of each event, from the IMDS change to 3 s after every
    // named node was released.
    let named_users: HashSet<String> = named_nodes
        .iter()
        .map(|n| format!("bench:agent:{n}"))
        .collect();
    let is_agent = |r: &Request| r.user.starts_with("bench:agent:");
    let per_event = |f: &dyn Fn(&Request) -> bool| -> Vec<usize> {
        bursts
            .iter()
            .map(|b| {
                requests
                    .iter()
                    .filter(|r| r.at >= b.changed && r.at <= b.until && f(r))
                    .count()
            })
            .collect()
    };
    let join = |v: &[usize]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    table.note(format!(
        "burst: each event's API load is counted from the IMDS change to 3 s after every named node was released ({} s)",
        bursts
            .iter()
            .map(|b| format!("{:.1}", secs(b.until - b.changed)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut max_writes = 0;
    let mut all_conflicts = 0;
    let mut summary = Vec::new();
    let mut kind_notes = Vec::new();
    for b in &bursts {
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for r in requests
            .iter()
            .filter(|r| r.at >= b.changed && r.at <= b.until && is_agent(r) && is_write(&r.verb))
        {
            *kinds
                .entry(format!("{} → {}", r.kind(), r.code))
                .or_default() += 1;
        }
        kind_notes.push(
            kinds
                .iter()
                .map(|(k, v)| format!("{v}× {k}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        let mut writes: BTreeMap<&str, usize> = BTreeMap::new();
        let mut conflicts = 0;
        for r in requests
            .iter()
            .filter(|r| r.at >= b.changed && r.at <= b.until && is_agent(r) && is_write(&r.verb))
        {
            *writes.entry(r.user.as_str()).or_default() += 1;
            if r.code == 409 {
                conflicts += 1;
            }
        }
        let most = writes.values().copied().max().unwrap_or(0);
        max_writes = max_writes.max(most);
        all_conflicts += conflicts;
        summary.push(format!(
            "max {most}, {} by {} agents ({conflicts} refused 409)",
            writes.values().sum::<usize>(),
            writes.len()
        ));
    }
    table.note(format!(
        "burst: the agents' writes of each event, by verb, resource and answer: {}",
        kind_notes.join("; ")
    ));
    table
        .add(
            "5 API load",
            // One apply per change of an agent's view: seen Scheduled,
            // Started, gone, and the approval it sent (the first named VM's).
            &format!(
                "event: writes per agent ({n} agents; one per change of its view: seen, Started, gone, the approval it sent)"
            ),
            summary.join("; "),
            "≤ 4, 0 × 409",
            Some(max_writes <= 4 && all_conflicts == 0),
        )
        .headline(
            format!("an agent's writes per event {max_writes} at most, {all_conflicts} × 409"),
            None,
        );
    let by_watch =
        per_event(&|r| is_agent(r) && !named_users.contains(&r.user) && r.verb == "watch");
    let by_list = per_event(&|r| is_agent(r) && !named_users.contains(&r.user) && r.verb == "list");
    let named_watch = per_event(&|r| named_users.contains(&r.user) && r.verb == "watch");
    table.add(
        "5 API load",
        &format!(
            "event: watches opened by the {} agents not named",
            args.burst_bystanders
        ),
        format!(
            "{} watches, {} lists (named agents: {} watches)",
            join(&by_watch),
            join(&by_list),
            join(&named_watch)
        ),
        "",
        None,
    );
    let node_gets =
        per_event(&|r| r.user == "bench:controller" && r.verb == "get" && r.resource == "nodes");
    table.add(
        "5 API load",
        "event: node GETs by the controller",
        join(&node_gets),
        "0",
        Some(node_gets.iter().all(|g| *g == 0)),
    );
    let events_posted = per_event(&|r| {
        r.user.starts_with("bench:") && r.resource == "events" && r.verb == "create"
    });
    let node_writes =
        per_event(&|r| r.user == "bench:controller" && r.resource == "nodes" && is_write(&r.verb));
    let ctl_all = per_event(&|r| r.user == "bench:controller");
    table.add(
        "5 API load",
        "event: Events posted; controller node writes; controller requests",
        format!(
            "{} Events; {} node writes; {} requests",
            join(&events_posted),
            join(&node_writes),
            join(&ctl_all)
        ),
        "",
        None,
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 6. Scale (with 4. controller footprint)

async fn scale(args: &Args, bin: &Path, table: &mut Table) -> anyhow::Result<()> {
    let n = args.scale_nodes;
    let agents = args.scale_agents.min(n);
    let cluster =
        tokio::task::spawn_blocking(move || start_cluster(CLUSTER_SCALE, n, true)).await??;
    let client = cluster.client().await?;
    let result = scale_on(args, bin, table, &cluster, &client, n, agents).await;
    let _ = cluster.stop();
    result
}

async fn scale_on(
    args: &Args,
    bin: &Path,
    table: &mut Table,
    cluster: &Cluster,
    client: &Client,
    n: usize,
    agents: usize,
) -> anyhow::Result<()> {
    // Pods: Deployments of at most 1,000 replicas, spread by the scheduler.
    let per = 1000.min(args.scale_pods.max(1));
    let deployments = args.scale_pods.div_ceil(per);
    let mut items =
        vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench-scale"}})];
    for d in 0..deployments {
        let replicas = per.min(args.scale_pods - d * per);
        items.push(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": format!("w{d}"), "namespace": "bench-scale"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": format!("w{d}")}},
                     "template": {"metadata": {"labels": {"app": format!("w{d}")}},
                                  "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}));
    }
    let file = std::env::temp_dir().join("forewarn-bench-scale.json");
    std::fs::write(
        &file,
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": items}))?,
    )?;
    let t = Instant::now();
    cluster.kubectl(&["apply", "-f", &file.to_string_lossy()])?;
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let ready = cluster.kubectl(&[
            "get",
            "deploy",
            "-n",
            "bench-scale",
            "-o",
            "jsonpath={.items[*].status.readyReplicas}",
        ])?;
        let ready: usize = ready
            .split_whitespace()
            .filter_map(|v| v.parse::<usize>().ok())
            .sum();
        if ready >= args.scale_pods {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "only {ready} of {} pods ready within 900 s",
                args.scale_pods
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    table.note(format!(
        "scale: {} pods in {deployments} Deployments ready on {n} KWOK nodes in {:.0} s",
        args.scale_pods,
        t.elapsed().as_secs_f64()
    ));
    // Every node's VM from its providerID, as on AKS: the nodes without an
    // agent are then confirmed by the agents of nodes with one (only an
    // agent whose node has a providerID vouches for another node).
    merge_patch_nodes(client, 0..n, |i| {
        json!({"spec": {"providerID": format!(
            "azure:///subscriptions/bench/resourceGroups/bench/providers/Microsoft.Compute/virtualMachineScaleSets/bench-vmss/virtualMachines/{i}"
        )}})
    })
    .await?;
    let id = event_id(901);
    let resources: Vec<String> = (0..n).map(vm_name).collect();
    let mut scenario = vms_yaml(0..n, |i| i < agents);
    let _ = writeln!(
        scenario,
        "events:\n  - {{id: {id}, type: Redeploy, resources: [{}], at: 1s, notice: 10m, runFor: 3s}}",
        resources.join(", ")
    );
    let vms: Vec<(String, String)> = (0..agents).map(|i| (node_name(i), vm_name(i))).collect();
    let dir = run_dir("scale");
    std::fs::create_dir_all(&dir)?;
    let mut creds = Credentials {
        controller: impersonating_kubeconfig(cluster, &dir, "bench:controller")?,
        agents: BTreeMap::new(),
        lease_namespace: "default".into(),
        lease_name: format!("bench-{}", std::process::id()),
    };
    for (node, _) in &vms {
        creds.agents.insert(
            node.clone(),
            impersonating_kubeconfig(cluster, &dir, &format!("bench:agent:{node}"))?,
        );
    }
    let qps = SCALE_EVICTION_QPS.to_string();
    let burst = (SCALE_EVICTION_QPS * 2).to_string();
    let malloc_env = chart_malloc_env()?;
    let mut fleet = start_fleet(
        cluster,
        bin,
        &dir,
        &scenario,
        &vms,
        Some(creds),
        &[
            ("FOREWARN_EVICTION_QPS", qps.as_str()),
            ("FOREWARN_EVICTION_BURST", burst.as_str()),
        ]
        .into_iter()
        // The chart's `controller.mallocEnv` defaults: the controller as
        // the chart runs it (the agents of this part are not measured).
        .chain(malloc_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .collect::<Vec<_>>(),
    )
    .await?;
    // The reference runs before this program's watches start: its cordons
    // are not the event's.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let reference = node_patch_reference(client, n).await?;
    let watches = Watches::start(client).await?;
    let http = forewarn::http::client_builder().no_proxy().build()?;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let ticks = clock_ticks();
    let ctl_pid = fleet.controller.id().context("the controller exited")?;
    let idle = proc_stat(ctl_pid, ticks)?;
    // VmHWM counts from the process's start: its first lists of every pod
    // and node may be its peak. Reset here (Linux: "5" to clear_refs), the
    // peak read after the event is the event's; the start-up peak is told
    // beside it.
    let hwm_reset = std::fs::write(format!("/proc/{ctl_pid}/clear_refs"), "5").is_ok();
    let origin = start_mock(&http, &fleet).await?;
    let changed = origin + Duration::from_secs(1);
    let all: Vec<String> = (0..n).map(node_name).collect();
    let result = watches
        .wait(Duration::from_secs(180), "every scale node cordoned", |s| {
            all.iter().all(|x| s.cordon(x, 0).is_some())
        })
        .await;
    let seen_at: BTreeMap<String, DateTime<Utc>> = watches.with(|s| {
        all.iter()
            .filter_map(|x| Some((x.clone(), s.cordon(x, 0)?)))
            .collect()
    });
    let (first, last, count) = (
        seen_at.values().min().copied(),
        seen_at.values().max().copied(),
        seen_at.len(),
    );
    let seen = watches.with(|s| s.sev_first.get(&id).copied());
    // The whole event: drained, approved, started, over and released.
    let events: Api<ScheduledEvent> = Api::all(client.clone());
    let object = forewarn::imds::model::object_name(&id);
    let ended = Instant::now() + Duration::from_secs(SCALE_EVENT_WITHIN);
    let mut done = None;
    // The controller's last figures while it ran, and how it ended if it
    // exited meanwhile (an exited process has no memory figures left: its
    // peak is then not measured).
    let mut busy = None;
    let mut exited = None;
    let mut sample = |fleet: &mut Fleet| {
        // Before `exited` reaps it: a process that has exited but is not
        // reaped still has its CPU times, not its memory.
        if let Ok(s) = proc_stat(ctl_pid, ticks) {
            busy = Some(s).filter(|s| s.hwm > 0).or(busy);
            busy = busy.map(|b| ProcStat { cpu: s.cpu, ..b });
        }
        fleet.controller.exited().map(|status| {
            format!(
                "the controller exited ({status}) during the event: {}",
                fleet.controller.log_tail(1).trim()
            )
        })
    };
    while Instant::now() < ended {
        exited = sample(&mut fleet);
        if exited.is_some() {
            break;
        }
        let phase = events
            .get_opt(&object)
            .await
            .ok()
            .flatten()
            .and_then(|e| e.status?.phase);
        if matches!(phase, Some(forewarn::api::Phase::Completed)) {
            done = Some(Utc::now());
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if exited.is_none() {
        exited = sample(&mut fleet);
    }
    let until = done.unwrap_or_else(Utc::now);
    stop_fleet(fleet).await;
    drop(watches);
    table
        .add(
            "4 footprint",
            &format!(
                "controller RSS, {n} nodes and {} pods, idle",
                args.scale_pods
            ),
            format!(
                "{:.1} MiB (anonymous {:.1} MiB)",
                mib(idle.rss),
                mib(idle.anon)
            ),
            "≤ 40 MiB",
            Some(mib(idle.rss) <= 40.0),
        )
        .headline(
            format!("controller RSS idle {:.1} MiB", mib(idle.rss)),
            None,
        );
    // The controller's requests, as the API server logged them; if it
    // exited, until its last.
    let everyone: Vec<Request> = audit_requests(cluster)?
        .into_iter()
        .filter(|r| r.at >= changed && r.at <= until)
        .collect();
    let requests: Vec<Request> = everyone
        .iter()
        .filter(|r| r.user == "bench:controller")
        .cloned()
        .collect();
    let until = if exited.is_some() {
        requests.iter().map(|r| r.at).max().unwrap_or(changed)
    } else {
        until
    };
    let whole = if exited.is_some() {
        format!(
            "the event until the controller exited (its last request {:.0} s after the IMDS change)",
            secs(until - changed)
        )
    } else if done.is_some() {
        format!("the whole event ({:.0} s)", secs(until - changed))
    } else {
        format!("the event's first {SCALE_EVENT_WITHIN} s (not over by then)")
    };
    let peak_figure = format!(
        "controller peak RSS (VmHWM) over {whole}, {n} VMs, {} pods",
        args.scale_pods
    );
    match busy.filter(|_| exited.is_none()) {
        Some(busy) => {
            table
                .add(
                    "4 footprint",
                    &peak_figure,
                    if hwm_reset {
                        format!(
                            "{:.1} MiB (its start-up until the event, the first lists of every node and pod among it: {:.1} MiB)",
                            mib(busy.hwm),
                            mib(idle.hwm)
                        )
                    } else {
                        format!(
                            "{:.1} MiB (from its start: the peak could not be reset before the event)",
                            mib(busy.hwm)
                        )
                    },
                    "≤ 64 MiB",
                    Some(mib(busy.hwm) <= 64.0),
                )
                .headline(
                    format!("controller peak RSS {:.1} MiB", mib(busy.hwm)),
                    None,
                );
        }
        None => {
            table
                .add(
                    "4 footprint",
                    &peak_figure,
                    "not measured: the controller exited".into(),
                    "≤ 64 MiB",
                    None,
                )
                .headline("controller peak RSS not measured (it exited)", None);
        }
    }
    let cpu = busy.map_or(f64::NAN, |b| b.cpu) - idle.cpu;
    table.figure("nodes", n as f64);
    table.figure("pods", args.scale_pods as f64);
    table.figure("idle_rss_mib", mib(idle.rss));
    table.figure("fixed_rss_mib", mib(idle.rss.saturating_sub(idle.anon)));
    if let (Some(busy), None) = (busy, &exited) {
        // The sizing's peak: the higher of start-up's and the event's
        // (a memory limit must hold both).
        table.figure("peak_rss_mib", mib(busy.hwm.max(idle.hwm)));
        if done.is_some() {
            table.figure("cpu_seconds", cpu);
        }
    }
    table.add(
        "6 scale",
        &format!("controller CPU over {whole}"),
        format!("{cpu:.1} CPU seconds"),
        "",
        None,
    );
    let span = secs(until - changed).max(1e-3);
    let node_gets = requests
        .iter()
        .filter(|r| r.verb == "get" && r.resource == "nodes")
        .count();
    let evictions = requests
        .iter()
        .filter(|r| r.resource == "pods" && r.subresource == "eviction")
        .count();
    let pod_lists = requests
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "pods")
        .count();
    table.add(
        "5 API load",
        &format!("controller Node GETs during the {n}-VM event"),
        node_gets.to_string(),
        "0 (node cache)",
        Some(node_gets == 0),
    );
    table.add(
        "5 API load",
        &format!("controller requests during the {n}-VM event"),
        format!(
            "{} in {span:.0} s: {:.1}/s, of which evictions {:.1}/s (rate budget {SCALE_EVICTION_QPS}/s, burst {}), pod LISTs {pod_lists}",
            requests.len(),
            requests.len() as f64 / span,
            evictions as f64 / span,
            SCALE_EVICTION_QPS * 2
        ),
        "evictions ≤ budget",
        Some(evictions as f64 / span <= f64::from(SCALE_EVICTION_QPS) * 1.1),
    );
    // On paper: AKS's limit is 5,000 nodes. Every figure above scaled by
    // 5,000 / n is an upper bound (part of the memory is the executable
    // and the runtime, which do not grow).
    if let (Some(busy), None) = (busy, &exited) {
        let k = 5000.0 / n as f64;
        table.note(format!(
            "sizing at 5,000 nodes and {} pods (the same pods per node), scaling this run's figures by {k:.0}: idle RSS ≤ {:.0} MiB, peak RSS ≤ {:.0} MiB, CPU ≤ {:.0} CPU seconds for an event naming every VM (upper bounds: the executable and runtime, about {:.0} MiB of the idle figure, do not grow)",
            args.scale_pods as f64 * k,
            mib(idle.rss) * k,
            mib(busy.hwm) * k,
            cpu * k,
            mib(idle.rss - idle.anon)
        ));
    }
    // The reference: this program's own cordons of every node, timed
    // before the event.
    let own = reference.as_secs_f64().max(1e-3);
    table.figure("reference_writes_per_s", n as f64 / own);
    let reference_txt = format!(
        "{n} cordons by this program (the same merge patch as forewarn's: unschedulable, a taint, an annotation; {REFERENCE_IN_FLIGHT} in flight, as the controller; the fleet running, before the event): {own:.2} s ({:.0} patches/s)",
        n as f64 / own
    );
    let figure = format!("one event naming {n} VMs ({agents} agents): all cordoned");
    // The cordons as the API server took them (audit): the reference is
    // timed from its first patch sent to its last answered, and so are
    // forewarn's, from the first cordon received to the last answered.
    // This program's node watch, which lags the server under the event's
    // load, is told beside.
    let since: BTreeMap<String, DateTime<Utc>> = all.iter().map(|x| (x.clone(), changed)).collect();
    let taken = cordons_taken(&requests, &since, &seen_at);
    let taken_span = (taken.len() == n)
        .then(|| {
            let first = taken.values().map(|t| t.0).min()?;
            let last = taken.values().map(|t| t.1).max()?;
            Some((first, last))
        })
        .flatten();
    if let Some((from, to)) = taken_span {
        // What else the API server took while forewarn's cordons were in
        // flight: the reference's cordons had it to themselves.
        let during = |f: &dyn Fn(&Request) -> bool| {
            let in_flight = everyone
                .iter()
                .filter(|r| r.at >= from && r.at <= to && f(r));
            match by_kind(in_flight, 1.0, 0) {
                (0, _) => "none".to_string(),
                (all, kinds) => format!("{all} ({kinds})"),
            }
        };
        let is_cordon =
            |r: &Request| r.verb == "patch" && r.resource == "nodes" && r.subresource.is_empty();
        table.add(
            "6 scale",
            "the API server's other requests while forewarn's cordons were in flight (audit, the first cordon received to the last answered)",
            format!(
                "the controller: {}; the agents: {}",
                during(&|r| r.user == "bench:controller" && !is_cordon(r)),
                during(&|r| r.user.starts_with("bench:agent:")),
            ),
            "",
            None,
        );
    }
    match (result, taken_span, first, last) {
        (Ok(()), Some((first_sent, last_answered)), Some(first), Some(last)) => {
            let ratio = secs(last_answered - first_sent) / own;
            table
                .add(
                    "6 scale",
                    &figure,
                    format!(
                        "{:.2} s after the IMDS change, as the API server answered the last cordon (ScheduledEvent seen at {:.2} s; first cordon sent at {:.2} s, then {:.0} nodes/s; this program's node watch saw the first at {:.2} s, the last at {:.2} s)",
                        secs(last_answered - changed),
                        seen.map_or(f64::NAN, |t| secs(t - changed)),
                        secs(first_sent - changed),
                        n as f64 / secs(last_answered - first_sent).max(1e-3),
                        secs(first - changed),
                        secs(last - changed),
                    ),
                    "≤ 1.2 × the reference",
                    Some(ratio <= 1.2),
                )
                .reference(format!(
                    "{reference_txt}; forewarn's cordons, the first received to the last answered (audit): {:.2} s, {ratio:.2} times the reference",
                    secs(last_answered - first_sent)
                ))
                .headline(
                    format!(
                        "{} VMs cordoned in {:.2} s",
                        thousands(n),
                        secs(last_answered - changed)
                    ),
                    Some(format!("{own:.2} s, forewarn's cordons {ratio:.2} × it")),
                );
        }
        (r, _, _, _) => {
            table
                .add(
                    "6 scale",
                    &figure,
                    format!(
                        "only {count} of {n} cordoned within 180 s ({} cordons in the audit log){}",
                        taken.len(),
                        r.err().map(|e| format!(" ({e})")).unwrap_or_default()
                    ),
                    "≤ 1.2 × the reference",
                    Some(false),
                )
                .reference(reference_txt)
                .headline(
                    format!("{} VMs: only {count} cordoned within 180 s", thousands(n)),
                    Some(format!("{own:.2} s")),
                );
        }
    }
    // The figures are in the table; the part itself failed.
    match exited {
        Some(why) => bail!(why),
        None => Ok(()),
    }
}

/// How many node patches the reference of the scale part keeps in flight:
/// as many as the controller's node writes (`NODE_WRITE_CONCURRENCY`).
const REFERENCE_IN_FLIGHT: usize = 32;

/// The reference for "all cordoned": how long this API server takes, now,
/// to cordon each of the `n` scale nodes as forewarn does (one merge patch
/// of `spec.unschedulable`, a NoSchedule taint and an annotation; the
/// bench's own keys, so that forewarn takes them for someone else's),
/// [`REFERENCE_IN_FLIGHT`] at a time, as the controller writes its
/// cordons. The cordons are then undone (not timed). A cordon can go no
/// faster than the API server takes them; the ratio says how close the
/// controller comes.
async fn node_patch_reference(client: &Client, n: usize) -> anyhow::Result<Duration> {
    let t = Instant::now();
    merge_patch_nodes(client, 0..n, |_| {
        json!({
            "metadata": {"annotations": {"bench.forewarn.dev/reference": "cordoned"}},
            "spec": {"unschedulable": true, "taints": [
                {"key": "bench.forewarn.dev/reference", "effect": "NoSchedule"}
            ]}
        })
    })
    .await?;
    let took = t.elapsed();
    merge_patch_nodes(client, 0..n, |_| {
        json!({
            "metadata": {"annotations": {"bench.forewarn.dev/reference": null}},
            "spec": {"unschedulable": null, "taints": null}
        })
    })
    .await?;
    Ok(took)
}

/// Merge-patches each scale node `node_name(i)` for `i` in `which` with
/// `patch(i)`, [`REFERENCE_IN_FLIGHT`] at a time.
async fn merge_patch_nodes(
    client: &Client,
    which: std::ops::Range<usize>,
    patch: impl Fn(usize) -> serde_json::Value,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    futures::stream::iter(which)
        .map(|i| {
            let (nodes, body) = (nodes.clone(), patch(i));
            async move {
                nodes
                    .patch(&node_name(i), &PatchParams::default(), &Patch::Merge(&body))
                    .await
            }
        })
        .buffer_unordered(REFERENCE_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    Ok(())
}

/// The controller's eviction rate budget in the scale part (evictions per
/// second; burst twice that): 10,000 pods at the default 20/s would take
/// over 8 minutes.
const SCALE_EVICTION_QPS: u32 = 100;

/// How long the scale part waits for its event to be over, seconds.
const SCALE_EVENT_WITHIN: u64 = 420;

// ---------------------------------------------------------------------------
// 7. Spot wave

/// The wave part's cluster: [`CLUSTER_WAVE`] or `FOREWARN_BENCH_WAVE_CLUSTER`.
fn wave_cluster_name() -> String {
    std::env::var("FOREWARN_BENCH_WAVE_CLUSTER")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| CLUSTER_WAVE.into())
}

/// How long the wave part waits for its nodes to be cordoned, then
/// released (a hang bound; a healthy wave is over about 60 s after it
/// starts: 30 s of notice, 15 s of running, the release delay).
const WAVE_WITHIN: Duration = Duration::from_secs(300);

async fn wave(args: &Args, bin: &Path, table: &mut Table) -> anyhow::Result<()> {
    let n = args.wave_vms.max(1);
    let total = n + args.wave_spares;
    let name = wave_cluster_name();
    let cluster = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || start_cluster(&name, total, true)).await??
    };
    let client = cluster.client().await?;
    let result = wave_on(args, bin, table, &cluster, &client).await;
    let _ = cluster.stop();
    result
}

/// The pods of `ns` as the API server deleted them: the first version of
/// each with a `deletionTimestamp`, as a watch delivered it.
fn watch_deletions(
    client: &Client,
    ns: &str,
) -> (
    Arc<Mutex<Vec<forewarn_harness::report::PodDeletion>>>,
    tokio::task::JoinHandle<()>,
) {
    use k8s_openapi::api::core::v1::Pod;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher::watcher(pods, watcher::Config::default()).boxed();
        let mut done = HashSet::new();
        while let Some(ev) = stream.next().await {
            let now = Utc::now();
            let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev else {
                continue;
            };
            let Some(ts) = p.metadata.deletion_timestamp.as_ref() else {
                continue;
            };
            let pod = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
            if !done.insert(pod.clone()) {
                continue;
            }
            out.lock().unwrap_or_else(|p| p.into_inner()).push(
                forewarn_harness::report::PodDeletion {
                    pod,
                    node: p
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default(),
                    grace_seconds: p.metadata.deletion_grace_period_seconds,
                    deletion_timestamp: DateTime::from_timestamp(
                        ts.0.as_second(),
                        u32::try_from(ts.0.subsec_nanosecond()).unwrap_or(0),
                    )
                    .unwrap_or(now),
                    seen_at: now,
                },
            );
        }
    });
    (seen, task)
}

/// Every version of the PodDisruptionBudgets of namespace `ns` as a watch
/// sees them (its `disruptionsAllowed`), until the watch is dropped.
fn watch_budgets(
    client: &Client,
    ns: &str,
) -> (
    Arc<Mutex<Vec<forewarn_harness::report::BudgetSeen>>>,
    forewarn_harness::AbortOnDrop,
) {
    use forewarn_harness::report::BudgetSeen;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    let (watch, _listed) = forewarn_harness::spawn_watch(
        Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(client.clone(), ns),
        move |b| {
            out.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(BudgetSeen::of(&b, Utc::now()));
            true
        },
    );
    (seen, watch)
}

/// The moment the API server answered the controller's first granted
/// eviction (201) of each node's pods (`initial`: node → `namespace/name`
/// of its workload pods at the start), from the audit log's `requests`.
fn first_evictions_taken(
    requests: &[Request],
    initial: &BTreeMap<String, Vec<String>>,
) -> HashMap<String, DateTime<Utc>> {
    let node_of: HashMap<&str, &str> = initial
        .iter()
        .flat_map(|(node, pods)| {
            pods.iter()
                .filter_map(|p| p.split_once('/'))
                .map(move |(_, name)| (name, node.as_str()))
        })
        .collect();
    let mut first: HashMap<String, DateTime<Utc>> = HashMap::new();
    for r in requests.iter().filter(|r| {
        r.user == "bench:controller"
            && r.resource == "pods"
            && r.subresource == "eviction"
            && r.code == 201
    }) {
        let (Some(node), Some(_)) = (node_of.get(r.name.as_str()), r.took) else {
            continue;
        };
        let at = r.answered();
        first
            .entry((*node).to_owned())
            .and_modify(|t| *t = (*t).min(at))
            .or_insert(at);
    }
    first
}

/// Each node's cordon as the API server took it (audit): the controller's
/// first granted `patch nodes` (not `nodes/status`) on the node at or after
/// `since` (its event's appearance), and answered no later than a second
/// after `seen` (this program's watch saw the node cordoned then; the
/// watch can hear of a write before its answer is sent, and a node write
/// well after that is not the cordon). Maps the node to `(request received, answered)`.
/// A node with no such request keeps no entry.
fn cordons_taken(
    requests: &[Request],
    since: &BTreeMap<String, DateTime<Utc>>,
    seen: &BTreeMap<String, DateTime<Utc>>,
) -> HashMap<String, (DateTime<Utc>, DateTime<Utc>)> {
    let mut first: HashMap<String, (DateTime<Utc>, DateTime<Utc>)> = HashMap::new();
    for r in requests.iter().filter(|r| {
        r.user == "bench:controller"
            && r.verb == "patch"
            && r.resource == "nodes"
            && r.subresource.is_empty()
            && r.code == 200
    }) {
        let (Some(from), Some(_)) = (since.get(&r.name), r.took) else {
            continue;
        };
        let answered = r.answered();
        if r.at < *from
            || seen
                .get(&r.name)
                .is_some_and(|s| answered > *s + chrono::TimeDelta::seconds(1))
        {
            continue;
        }
        first
            .entry(r.name.clone())
            .and_modify(|t| {
                if r.at < t.0 {
                    *t = (r.at, answered);
                }
            })
            .or_insert((r.at, answered));
    }
    first
}

/// `p50 … s, p99 … s, max … s` of sorted seconds (and how many).
fn spread(v: &[f64], of: usize) -> String {
    if v.is_empty() {
        return format!("none (0 of {of} events)");
    }
    format!(
        "p50 {:.2} s, p99 {:.2} s, max {:.2} s ({} of {of} events)",
        percentile(v, 0.5),
        percentile(v, 0.99),
        v.last().copied().unwrap_or(f64::NAN),
        v.len()
    )
}

/// Starts the controller again if it exited, as its kubelet would, and
/// says so in `restarts` (the wall-clock time, how it ended).
async fn restart_exited(fleet: &mut Fleet, restarts: &mut Vec<String>) -> anyhow::Result<()> {
    if let Some(status) = fleet.controller.exited() {
        let tail = fleet.controller.log_tail(1);
        fleet.restart_controller_container().await?;
        restarts.push(format!(
            "{} UTC ({status}: {})",
            Utc::now().format("%H:%M:%S"),
            tail.trim()
        ));
        println!("[bench] wave: the controller exited ({status}); started again");
    }
    Ok(())
}

/// Waits `for_` while restarting an exited controller.
async fn settle(
    fleet: &mut Fleet,
    for_: Duration,
    restarts: &mut Vec<String>,
) -> anyhow::Result<()> {
    let until = Instant::now() + for_;
    while Instant::now() < until {
        restart_exited(fleet, restarts).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// [`Watches::wait`] for [`WAVE_WITHIN`], restarting an exited controller.
async fn wait_restarting(
    watches: &Watches,
    fleet: &mut Fleet,
    restarts: &mut Vec<String>,
    what: &str,
    done: impl Fn(&Seen) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAVE_WITHIN;
    while !watches.with(&done) {
        if Instant::now() > deadline {
            bail!("timed out after {WAVE_WITHIN:?} waiting for {what}");
        }
        restart_exited(fleet, restarts).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[allow(clippy::too_many_lines)]
async fn wave_on(
    args: &Args,
    bin: &Path,
    table: &mut Table,
    cluster: &Cluster,
    client: &Client,
) -> anyhow::Result<()> {
    use forewarn_harness::wave;
    let n = args.wave_vms.max(1);
    let per_node = args.wave_pods_per_node.max(1);
    let spares: Vec<String> = (n..n + args.wave_spares).map(wave::node_name).collect();
    let ns = "bench-wave";
    // The spares are tainted while the workload settles: its first pods
    // all land on the wave's nodes.
    for s in &spares {
        cluster.kubectl(&[
            "taint",
            "nodes",
            s,
            &format!("{}=:NoSchedule", wave::SPARE_TAINT),
        ])?;
    }
    let mut items =
        vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})];
    for mut o in wave::workload(n, per_node, &spares) {
        o["metadata"]["namespace"] = json!(ns);
        items.push(o);
    }
    let file =
        std::env::temp_dir().join(format!("forewarn-bench-wave-{}.json", std::process::id()));
    std::fs::write(
        &file,
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": items}))?,
    )?;
    let t = Instant::now();
    cluster.kubectl(&["apply", "-f", &file.to_string_lossy()])?;
    let pods_api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let want = n * per_node;
    let deadline = Instant::now() + Duration::from_secs(900);
    let initial = loop {
        let listed = pods_api
            .list(&kube::api::ListParams::default().labels("wave=true"))
            .await?;
        let ready: Vec<&k8s_openapi::api::core::v1::Pod> = listed
            .items
            .iter()
            .filter(|p| {
                p.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                })
            })
            .collect();
        if ready.len() >= want {
            let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for p in ready {
                if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                    by_node
                        .entry(node)
                        .or_default()
                        .push(format!("{ns}/{}", p.name_any()));
                }
            }
            break by_node;
        }
        if Instant::now() > deadline {
            bail!(
                "only {} of {want} wave pods ready within 900 s",
                ready.len()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    table.note(format!(
        "{want} pods in {n} Deployments (one per node, each with a PodDisruptionBudget of maxUnavailable {}) ready on {n} KWOK nodes in {:.0} s, and {} spare nodes for their replacements",
        (per_node / 2).max(1),
        t.elapsed().as_secs_f64(),
        spares.len()
    ));
    for s in &spares {
        cluster.kubectl(&["taint", "nodes", s, &format!("{}-", wave::SPARE_TAINT)])?;
    }
    let first = Duration::from_secs(2);
    let scenario = wave::scenario_yaml(n, first);
    let vms: Vec<(String, String)> = (0..n)
        .map(|i| (wave::node_name(i), wave::vm_name(i)))
        .collect();
    let dir = run_dir("wave");
    // No log of an earlier run left beside this one's.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut creds = Credentials {
        controller: impersonating_kubeconfig(cluster, &dir, "bench:controller")?,
        agents: BTreeMap::new(),
        lease_namespace: "default".into(),
        lease_name: format!("bench-{}", std::process::id()),
    };
    for (node, _) in &vms {
        creds.agents.insert(
            node.clone(),
            impersonating_kubeconfig(cluster, &dir, &format!("bench:agent:{node}"))?,
        );
    }
    // Each agent with a Ready pod of an agents' DaemonSet, as the chart
    // runs them: the controller reads them as up and asks for no
    // witnesses, so each agent reports its own VM's event only.
    let agent_nodes: Vec<String> = vms.iter().map(|(n, _)| n.clone()).collect();
    forewarn_harness::agent_pods::start(client, "default", &agent_nodes, Duration::from_secs(300))
        .await?;
    let qps = args.wave_eviction_qps.to_string();
    let burst = (args.wave_eviction_qps * 2).to_string();
    let concurrency = args.wave_reconcile_concurrency.to_string();
    let malloc_env = chart_malloc_env()?;
    let mut fleet = start_fleet(
        cluster,
        bin,
        &dir,
        &scenario,
        &vms,
        Some(creds),
        &[
            ("FOREWARN_EVICTION_QPS", qps.as_str()),
            ("FOREWARN_EVICTION_BURST", burst.as_str()),
            ("FOREWARN_RECONCILE_CONCURRENCY", concurrency.as_str()),
        ]
        .into_iter()
        // The chart's `controller.mallocEnv` defaults.
        .chain(malloc_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .collect::<Vec<_>>(),
    )
    .await?;
    // The reference, before this program's watches start: its cordons are
    // not the wave's.
    let mut restarts = Vec::new();
    settle(&mut fleet, Duration::from_secs(10), &mut restarts).await?;
    let reference = node_patch_reference(client, n).await?;
    let watches = Watches::start(client).await?;
    let (deletions, deletion_task) = watch_deletions(client, ns);
    let (budgets, budget_watch) = watch_budgets(client, ns);
    let http = forewarn::http::client_builder().no_proxy().build()?;
    settle(&mut fleet, Duration::from_secs(10), &mut restarts).await?;
    let ticks = clock_ticks();
    let ctl_pid = fleet.controller.id().context("the controller exited")?;
    let idle = proc_stat(ctl_pid, ticks)?;
    let cpu_before = cpu_by_kind(ticks);
    let origin = start_mock(&http, &fleet).await?;
    let appeared = |i: usize| {
        origin + chrono::TimeDelta::from_std(wave::appears_at(first, i, n)).unwrap_or_default()
    };
    let nodes: Vec<String> = (0..n).map(wave::node_name).collect();
    let cordoned = wait_restarting(
        &watches,
        &mut fleet,
        &mut restarts,
        "every wave node cordoned",
        |s| nodes.iter().all(|x| s.cordon(x, 0).is_some()),
    )
    .await;
    let released = match &cordoned {
        Ok(()) => {
            wait_restarting(
                &watches,
                &mut fleet,
                &mut restarts,
                "every wave node released",
                |s| nodes.iter().all(|x| s.release(x, 0).is_some()),
            )
            .await
        }
        Err(_) => Ok(()),
    };
    let until = Utc::now();
    let cpu_after = cpu_by_kind(ticks);
    // Trailing writes (records of the release) land within a moment.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The controller's figures, if it is the process measured idle.
    let busy = proc_stat(ctl_pid, ticks).and_then(|b| {
        if fleet.controller.id() == Some(ctl_pid) {
            Ok(b)
        } else {
            bail!("the controller measured idle exited during the wave")
        }
    });
    let log = fleet.mock_log(&http).await.unwrap_or_default();
    stop_fleet(fleet).await;
    deletion_task.abort();
    drop(budget_watch);
    let deletions = deletions.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let budgets = budgets.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let requests: Vec<Request> = audit_requests(cluster)?
        .into_iter()
        .filter(|r| r.at >= origin && r.at <= until + chrono::TimeDelta::seconds(3))
        .collect();
    let (events, cordons, phases) = watches.with(|s| {
        let mut events = BTreeMap::new();
        let mut cordons = BTreeMap::new();
        for (i, node) in nodes.iter().enumerate() {
            let id = wave::event_id(i).to_ascii_lowercase();
            // NotBefore as IMDS wrote it (whole seconds), else the
            // scenario's.
            let nb = s.not_before.get(&id).copied().unwrap_or_else(|| {
                let t = appeared(i)
                    + chrono::TimeDelta::from_std(wave::SPOT_NOTICE).unwrap_or_default();
                DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
            });
            events.insert(node.clone(), (appeared(i), nb));
            if let Some(c) = s.cordon(node, 0) {
                cordons.insert(node.clone(), c);
            }
        }
        let phases: BTreeMap<String, usize> = s.phase.values().fold(BTreeMap::new(), |mut m, p| {
            *m.entry(p.clone()).or_default() += 1;
            m
        });
        (events, cordons, phases)
    });
    drop(watches);
    // Each node's cordon as the API server took it (audit), not as this
    // program's node watch saw it: under the wave's load that watch lags
    // the server (a node whose cordon the log does not show keeps the
    // watch's time). The watch's figure is printed beside.
    let since: BTreeMap<String, DateTime<Utc>> =
        events.iter().map(|(n, (a, _))| (n.clone(), *a)).collect();
    let taken_cordons = cordons_taken(&requests, &since, &cordons);
    let seen_cordons = cordons.clone();
    let cordons: BTreeMap<String, DateTime<Utc>> = cordons
        .into_iter()
        .map(|(n, seen)| {
            let at = taken_cordons.get(&n).map_or(seen, |t| t.1);
            (n, at)
        })
        .collect();
    let cordons_from_log = taken_cordons.len();
    let figures = wave::figures(&events, &initial, &deletions, &cordons, &budgets);
    let seen_to_cordon = sorted(
        figures
            .iter()
            .filter_map(|f| Some(secs(*seen_cordons.get(&f.node)? - f.appeared)))
            .collect(),
    );

    // Times from each event's IMDS change.
    let to_cordon = sorted(
        figures
            .iter()
            .filter_map(|f| Some(secs(f.cordoned? - f.appeared)))
            .collect(),
    );
    // The first eviction on each node as the API server took it (audit:
    // the answer to the controller's first eviction there that it
    // granted), not as this program's pod watch saw the deletion: under
    // the wave's load that watch lagged the server by seconds to tens of
    // seconds.
    let taken = first_evictions_taken(&requests, &initial);
    let to_evict = sorted(
        figures
            .iter()
            .filter_map(|f| Some(secs(*taken.get(&f.node)? - f.appeared)))
            .collect(),
    );
    let seen_evict = sorted(
        figures
            .iter()
            .filter_map(|f| Some(secs(f.first_eviction? - f.appeared)))
            .collect(),
    );
    let own = reference.as_secs_f64().max(1e-3);
    let cordon_p99 = percentile(&to_cordon, 0.99);
    let all_cordoned = to_cordon.len() == n;
    table
        .add(
            "7 wave",
            &format!("{n} Spot VMs evicted at once (Preempt, 30 s notice each, all within 1 s): IMDS change → its node cordoned (taken by the API server: the answer to the controller's cordon, audit)"),
            format!(
                "{} ({cordons_from_log} from the audit log; this program's node watch saw the cordons at {})",
                spread(&to_cordon, n),
                spread(&seen_to_cordon, n)
            ),
            "p99 ≤ 1.5 s",
            Some(all_cordoned && cordon_p99 <= 1.5),
        )
        .reference(format!(
            "{n} cordons by this program (the same merge patch as forewarn's, {REFERENCE_IN_FLIGHT} in flight, the fleet running, before the wave): {own:.2} s ({:.0} patches/s)",
            n as f64 / own
        ))
        .headline(
            if to_cordon.is_empty() {
                format!("Spot wave of {n}: none cordoned")
            } else {
                format!(
                    "Spot wave of {n}: {} cordoned, at p99 {cordon_p99:.2} s",
                    to_cordon.len()
                )
            },
            Some(format!("{own:.2} s for {n} cordons")),
        );
    let evict_p99 = percentile(&to_evict, 0.99);
    table
        .add(
            "7 wave",
            "IMDS change → first eviction on its node (taken by the API server: the answer to the controller's first granted eviction there, audit)",
            format!(
                "{} (this program's pod watch saw the first deletion at {})",
                spread(&to_evict, n),
                spread(&seen_evict, n)
            ),
            "p99 ≤ 2 s",
            Some(to_evict.len() == n && evict_p99 <= 2.0),
        )
        .headline(
            if to_evict.is_empty() {
                "no eviction".to_string()
            } else {
                format!("evictions started at p99 {evict_p99:.2} s")
            },
            None,
        );
    let pods: usize = figures.iter().map(|f| f.pods).sum();
    let left: usize = figures
        .iter()
        .map(wave::EventFigures::left_at_not_before)
        .sum();
    let left_late_cordon: usize = figures
        .iter()
        .filter(|f| !f.had_time)
        .map(wave::EventFigures::left_at_not_before)
        .sum();
    let to_leave = wave::TIME_TO_LEAVE.as_secs();
    // A pod its PodDisruptionBudget kept until NotBefore stays, as the
    // budget asks: forewarn is answerable for the pods of the nodes cordoned
    // in time whose budget stood open, unused, longer than the bound.
    let bound = wave::BUDGET_TAKEN_WITHIN.as_secs_f64();
    let missed: Vec<&wave::EventFigures> = figures
        .iter()
        .filter(|f| f.had_time && f.unused_budget > bound)
        .collect();
    let left_missed: usize = missed
        .iter()
        .map(|f| wave::EventFigures::left_at_not_before(f))
        .sum();
    let unused = sorted(figures.iter().map(|f| f.unused_budget).collect());
    let reopened = sorted(
        figures
            .iter()
            .filter_map(|f| {
                let (t0, t1) = wave::reopened(&budgets, &f.node, f.cordoned?)?;
                (t1 <= f.not_before).then(|| secs(t1 - t0))
            })
            .collect(),
    );
    table
        .add(
            "7 wave",
            "pods still running at NotBefore (a deletionTimestamp after it, or not deleted)",
            format!(
                "{left} of {pods}: {left_missed} on the {} nodes whose PodDisruptionBudget stood open unused more than {bound:.0} s; {left_late_cordon} on nodes cordoned less than {to_leave} s before NotBefore (30 s of notice, {to_leave} s needed: the drain margin, the smallest grace, 5 s to evict); the others kept by their budgets. A budget stood open unused at most {:.1} s (median {:.1} s); the budgets the first evictions closed reopened (their pods' replacements Ready) {} before NotBefore (this program's budget watch)",
                missed.len(),
                unused.last().copied().unwrap_or_default(),
                percentile(&unused, 0.5),
                spread(&reopened, n),
            ),
            &format!("0 that had time to leave (cordoned {to_leave} s before NotBefore, their budget open)"),
            Some(left_missed == 0 && pods == want),
        )
        .headline(format!("{left} pods left at NotBefore ({left_missed} that had time)"), None);
    let approvals: Vec<&LogEntry> = log.iter().filter(|e| e.what == "Approved").collect();
    let mut per_event: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in &approvals {
        per_event
            .entry(a.event_id.to_ascii_uppercase())
            .or_default()
            .push(a.vm.clone().unwrap_or_default());
    }
    let foreign = (0..n)
        .filter(|i| {
            per_event
                .get(&wave::event_id(*i))
                .is_some_and(|vms| vms.iter().any(|v| *v != wave::vm_name(*i)))
        })
        .count();
    let twice = per_event.values().filter(|v| v.len() > 1).count();
    table.add(
        "7 wave",
        "approvals received by IMDS (the mock's /mock/log)",
        format!(
            "{} POSTs for {} of {n} events ({twice} events approved more than once, {foreign} through another VM); final phases {}",
            approvals.len(),
            per_event.len(),
            phases
                .iter()
                .map(|(p, c)| format!("{c} {p}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        "",
        None,
    );
    // The agents' report writes, per agent and event (a report is
    // `<event>.<node>`): seen, Started, gone, and the approval the named
    // VM's agent records.
    let is_agent = |r: &Request| r.user.starts_with("bench:agent:");
    let mut report_writes: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for r in requests
        .iter()
        .filter(|r| is_agent(r) && r.resource == "scheduledeventreports" && is_write(&r.verb))
    {
        *report_writes.entry((&r.user, &r.name)).or_default() += 1;
    }
    let senders: HashSet<(String, String)> = (0..n)
        .map(|i| {
            (
                format!("bench:agent:{}", wave::node_name(i)),
                format!(
                    "{}.{}",
                    forewarn::imds::model::object_name(&wave::event_id(i)),
                    wave::node_name(i)
                ),
            )
        })
        .collect();
    let over = report_writes
        .iter()
        .filter(|((u, name), c)| {
            let own = senders.contains(&((*u).to_string(), (*name).to_string()));
            **c > if own { 4 } else { 3 }
        })
        .count();
    let own_reported = report_writes
        .keys()
        .filter(|(u, name)| senders.contains(&((*u).to_string(), (*name).to_string())))
        .count();
    let most = report_writes.values().copied().max().unwrap_or(0);
    let total_report_writes: usize = report_writes.values().sum();
    let per_event = total_report_writes as f64 / n as f64;
    table
        .add(
            "7 wave",
            "report writes per event (each agent reports its own VM's event; another VM's only while the controller lists that VM's agent as silent)",
            format!(
                "{per_event:.2} per event ({total_report_writes} in all, in {} reports, {own_reported} of them by the event's own VM's agent; at most {most} writes to one report, {over} reports over 3, or 4 with an approval)",
                report_writes.len(),
            ),
            "≤ 3 per event (seen, Started, gone; 4 with the approval the agent sent), every event reported by its own VM's agent",
            Some(over == 0 && own_reported == n && per_event <= 4.0),
        )
        .headline(format!("report writes per event {per_event:.2}"), None);
    // API requests of the wave by who, verb and resource.
    let breakdown =
        |f: &dyn Fn(&Request) -> bool| by_kind(requests.iter().filter(|r| f(r)), n as f64, 2);
    let span = secs(until - origin).max(1e-3);
    // Only the requests kube-apiserver took (an attempt that could not
    // connect is in no audit log).
    let (ctl, ctl_kinds) = breakdown(&|r| r.user == "bench:controller");
    // The controller's writes the API server refused as made on a version
    // no longer current: each is a pass redone.
    let (conflicts, conflict_kinds) = breakdown(&|r| r.user == "bench:controller" && r.code == 409);
    let (agents, agent_kinds) = breakdown(&is_agent);
    table.add(
        "7 wave",
        "API requests per event, the controller's (by verb and resource, per event)",
        format!(
            "{:.1} ({ctl} in {span:.0} s): {ctl_kinds}; of them refused with 409 Conflict: {conflicts} ({conflict_kinds})",
            ctl as f64 / n as f64
        ),
        "",
        None,
    );
    table.add(
        "7 wave",
        &format!("API requests per event, the {n} agents' (by verb and resource, per event)"),
        format!(
            "{:.1}, {:.2} per agent and event ({agents} in {span:.0} s): {agent_kinds}",
            agents as f64 / n as f64,
            agents as f64 / (n * n) as f64
        ),
        "",
        None,
    );
    // Where an event's time to its cordon went, every step as the API
    // server logged it: its own agent's first report write answered, the
    // controller's creation of its object answered, the controller's
    // cordon received, and answered.
    let created: HashMap<&str, DateTime<Utc>> = requests
        .iter()
        .filter(|r| {
            r.user == "bench:controller"
                && r.verb == "create"
                && r.resource == "scheduledevents"
                && r.code == 201
        })
        .map(|r| (r.name.as_str(), r.answered()))
        .collect();
    let mut to_report = Vec::new();
    let mut to_object = Vec::new();
    let mut to_cordon_sent = Vec::new();
    let mut to_cordon_answered = Vec::new();
    let index: HashMap<String, usize> = (0..n).map(|i| (wave::node_name(i), i)).collect();
    for f in &figures {
        let Some(&i) = index.get(&f.node) else {
            continue;
        };
        let agent = format!("bench:agent:{}", f.node);
        let reported = requests
            .iter()
            .filter(|r| {
                r.user == agent
                    && r.resource == "scheduledeventreports"
                    && is_write(&r.verb)
                    && r.at >= f.appeared
            })
            .map(Request::answered)
            .min();
        let object = forewarn::imds::model::object_name(&wave::event_id(i));
        let made = created.get(object.as_str()).copied();
        if let Some(r) = reported {
            to_report.push(secs(r - f.appeared));
            if let Some(o) = made {
                to_object.push(secs(o - r));
            }
        }
        if let (Some(o), Some((sent, took))) = (made, taken_cordons.get(&f.node)) {
            to_cordon_sent.push(secs(*sent - o));
            to_cordon_answered.push(secs(*took - *sent));
        }
    }
    let [to_report, to_object, to_cordon_sent, to_cordon_answered] =
        [to_report, to_object, to_cordon_sent, to_cordon_answered].map(sorted);
    if to_cordon_sent.len() == n {
        table.figure("object_to_cordon_p99_s", percentile(&to_cordon_sent, 0.99));
    }
    table.add(
        "7 wave",
        "where the time to a cordon went (audit): IMDS change → its own agent's report written; → its ScheduledEvent created by the controller; → the cordon sent; → the cordon answered",
        format!(
            "report {}; object {}; cordon sent {}; answered {}",
            spread(&to_report, n),
            spread(&to_object, n),
            spread(&to_cordon_sent, n),
            spread(&to_cordon_answered, n)
        ),
        "",
        None,
    );
    // How long the API server took to answer the controller: its Lease
    // writes (a renewal slower than the renew deadline stops the leader)
    // and its other requests.
    let took = |f: &dyn Fn(&Request) -> bool| -> Vec<f64> {
        sorted(
            requests
                .iter()
                .filter(|r| f(r))
                .filter_map(|r| r.took)
                .collect(),
        )
    };
    let lease_took =
        took(&|r| r.user == "bench:controller" && r.resource == "leases" && r.verb == "update");
    let other_took =
        took(&|r| r.user == "bench:controller" && r.resource != "leases" && r.verb != "watch");
    let answered = |v: &[f64]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            format!(
                "p50 {:.3} s, p99 {:.3} s, max {:.3} s ({})",
                percentile(v, 0.5),
                percentile(v, 0.99),
                v[v.len() - 1],
                v.len()
            )
        }
    };
    // The same by verb and resource, the kinds with the most requests.
    let mut by_kind: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in requests
        .iter()
        .filter(|r| r.user == "bench:controller" && r.verb != "watch")
    {
        if let Some(t) = r.took {
            by_kind.entry(r.kind()).or_default().push(t);
        }
    }
    let mut by_kind: Vec<(String, Vec<f64>)> =
        by_kind.into_iter().map(|(k, v)| (k, sorted(v))).collect();
    by_kind.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
    let kinds_text = by_kind
        .iter()
        .take(8)
        .map(|(k, v)| {
            format!(
                "{k} p50 {:.3} s, max {:.3} s ({})",
                percentile(v, 0.5),
                v[v.len() - 1],
                v.len()
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    table.add(
        "7 wave",
        "the API server's answers to the controller (audit: response minus receipt): its Lease renewals; its other requests; by kind",
        format!(
            "Lease {}; other {}; {kinds_text}",
            answered(&lease_took),
            answered(&other_took)
        ),
        "",
        None,
    );
    // Where the machine's two cores went during the wave.
    let mut spent: Vec<(String, f64)> = cpu_after
        .iter()
        .map(|(k, after)| (k.clone(), after - cpu_before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.05)
        .collect();
    spent.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = spent.iter().map(|(_, d)| d).sum();
    table.add(
        "7 wave",
        "CPU of the machine during the wave, by process (from /proc; every agent together)",
        format!(
            "{total:.1} CPU seconds in {span:.0} s: {}",
            spent
                .iter()
                .map(|(k, d)| format!("{k} {d:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        "",
        None,
    );
    let busy_text = match &busy {
        Ok(b) => format!("{:.1} MiB; {:.1} CPU seconds", mib(b.hwm), b.cpu - idle.cpu),
        Err(e) => format!("peak and CPU not measured ({e:#})"),
    };
    table.add(
        "7 wave",
        &format!("controller RSS idle ({} nodes, {} pods) / peak (VmHWM) over the wave; CPU over the wave", n + spares.len(), want),
        format!(
            "{:.1} MiB / {busy_text} in {span:.0} s (eviction budget {}/s, burst {}; reconcile concurrency {}{})",
            mib(idle.rss),
            args.wave_eviction_qps,
            args.wave_eviction_qps * 2,
            args.wave_reconcile_concurrency,
            if args.wave_reconcile_concurrency == 16 {
                ", the default"
            } else {
                ""
            }
        ),
        "",
        None,
    );
    // The sizing section reads these: only from a wave that ran to its end.
    if cordoned.is_ok() && released.is_ok() {
        table.figure("vms", n as f64);
        table.figure("nodes", (n + spares.len()) as f64);
        table.figure("pods", want as f64);
        table.figure("idle_rss_mib", mib(idle.rss));
        table.figure("fixed_rss_mib", mib(idle.rss.saturating_sub(idle.anon)));
        if let Ok(b) = &busy {
            table.figure("peak_rss_mib", mib(b.hwm));
            table.figure("cpu_seconds_wave", b.cpu - idle.cpu);
        }
        table.figure("ctl_requests_per_event", ctl as f64 / n as f64);
        table.figure(
            "agent_requests_per_agent_event",
            agents as f64 / (n * n) as f64,
        );
        table.figure(
            "reconcile_concurrency",
            f64::from(args.wave_reconcile_concurrency),
        );
        table.figure("cordon_p99_s", cordon_p99);
        table.figure("eviction_p99_s", evict_p99);
    }
    table.figure("reference_writes_per_s", n as f64 / own);
    let late: Vec<String> = figures
        .iter()
        .filter(|f| !f.late.is_empty())
        .map(|f| format!("{} ({} left)", f.node, f.late.len()))
        .take(10)
        .collect();
    if !late.is_empty() {
        table.note(format!(
            "nodes with pods left at NotBefore (first 10): {}",
            late.join(", ")
        ));
    }
    if !restarts.is_empty() {
        table.note(format!(
            "the controller exited {} times (a leader that cannot renew its Lease in time stops) and was started again at once, as its kubelet would: {}",
            restarts.len(),
            restarts.join("; ")
        ));
    }
    cordoned?;
    released
}

// ---------------------------------------------------------------------------
// 4. Executable size, 3. drain

fn size(bin: &Path, table: &mut Table) -> anyhow::Result<()> {
    let bytes = std::fs::metadata(bin)?.len();
    let stripped = Command::new("file")
        .arg(bin)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(", stripped"))
        .unwrap_or(false);
    table
        .add(
            "4 footprint",
            "release executable size",
            format!(
                "{:.1} MiB ({bytes} bytes{})",
                mib(bytes),
                if stripped {
                    ", stripped"
                } else {
                    ", NOT stripped"
                }
            ),
            "≤ 8 MiB stripped",
            Some(stripped && mib(bytes) <= 8.0),
        )
        .headline(format!("executable {:.1} MiB", mib(bytes)), None);
    Ok(())
}

fn drain(args: &Args, bin: &Path, table: &mut Table) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let bench_drain = exe.with_file_name("bench_drain");
    if !bench_drain.is_file() {
        bail!(
            "{} is not built (make bench builds it)",
            bench_drain.display()
        );
    }
    let mut child = Command::new(&bench_drain)
        .args(["--runs", &args.drain_runs.to_string(), "--forewarn-bin"])
        .arg(bin)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()?;
    // Its lines as they come (a run takes minutes), kept for the figures.
    let mut text = String::new();
    if let Some(out) = child.stdout.take() {
        for line in std::io::BufRead::lines(std::io::BufReader::new(out)) {
            let line = line?;
            println!("{line}");
            text.push_str(&line);
            text.push('\n');
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("bench_drain failed with {status}");
    }
    let value = |key: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    let ours = value("forewarn_drain_median_seconds=")
        .context("no forewarn median in bench_drain's output")?;
    let theirs = value("kubectl_drain_median_seconds=")
        .context("no kubectl median in bench_drain's output")?;
    let ratio = value("drain_vs_kubectl_ratio=").context("no ratio in bench_drain's output")?;
    let runs = args.drain_runs;
    table
        .add(
            "3 drain",
            "a node of 105 pods, PDB maxUnavailable 10, drained by forewarn (from the cordon to the last pod gone)",
            format!("median {ours:.2} s ({runs} runs)"),
            "ratio ≤ 0.50",
            Some(ratio <= 0.5),
        )
        .reference(format!(
            "`kubectl drain` of an identical node, alternating with forewarn's: median {theirs:.2} s ({runs} runs); ratio {ratio:.2}"
        ))
        .headline(
            format!("drain ratio {ratio:.2}"),
            Some(format!("`kubectl drain` {theirs:.2} s, forewarn {ours:.2} s")),
        );
    Ok(())
}

// ---------------------------------------------------------------------------

/// The load averages (1, 5, 15 min) now: `0.47, 1.92, 2.25`.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `nproc`, the memory and the CPU model.
fn machine() -> (String, String, String) {
    let nproc = Command::new("nproc")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| {
                    v.split_whitespace()
                        .next()
                        .and_then(|k| k.parse::<f64>().ok())
                })
        })
        .map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0))
        .unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    (nproc, mem, cpu)
}

/// `path` as the document shows it: relative to the repository, or to
/// `$CARGO_TARGET_DIR`, when under either (not this machine's layout).
fn shown_path(path: &Path) -> String {
    if let Ok(p) = path.strip_prefix(repo_root()) {
        return p.display().to_string();
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .and_then(|dir| path.strip_prefix(dir).ok())
        .map_or_else(
            || path.display().to_string(),
            |p| format!("$CARGO_TARGET_DIR/{}", p.display()),
        )
}

/// `release/forewarn` in the target dir this program was built in
/// (`<target>/debug/examples/bench`), which is not `target/` when
/// `CARGO_TARGET_DIR` is set; else the repository's `target/`.
fn default_forewarn_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join("release/forewarn")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| repo_root().join("target/release/forewarn"))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    // A full run is every part; `--only` picks some (in the order they run).
    let parts: Vec<&str> = match &args.only {
        None => PARTS.to_vec(),
        Some(only) => {
            if let Some(bad) = only.iter().find(|o| !PARTS.contains(&o.as_str())) {
                eprintln!("bench: no part `{bad}`; the parts are {}", PARTS.join(", "));
                return ExitCode::from(2);
            }
            PARTS
                .into_iter()
                .filter(|p| only.iter().any(|o| o == p))
                .collect()
        }
    };
    let full = parts.len() == PARTS.len();
    let out = args.out.clone().unwrap_or_else(|| "BENCHMARKS.md".into());
    let bin = args
        .forewarn_bin
        .clone()
        .unwrap_or_else(default_forewarn_bin);
    if !bin.is_file() {
        eprintln!(
            "bench: FAIL: {} is not built (make bench builds it: cargo build --release --bin forewarn)",
            bin.display()
        );
        return ExitCode::FAILURE;
    }
    let started = Utc::now();
    let load_start = load_average();
    let (commit, dirty) = forewarn_harness::audit::checkout_commit();
    let mut table = Table::default();
    for part in &parts {
        println!("[bench] === {part} ===");
        table.0.begin(part);
        table.note(format!(
            "load average (1, 5, 15 min) at the start of `{part}`: {}",
            load_average()
        ));
        let r = match *part {
            "size" => size(&bin, &mut table),
            "detection" => detection(&args, &bin, &mut table).await,
            "burst" => burst(&args, &bin, &mut table).await,
            "scale" => scale(&args, &bin, &mut table).await,
            "wave" => wave(&args, &bin, &mut table).await,
            "peer-wave" => wave(&peer_wave_args(&args), &bin, &mut table).await,
            _ => tokio::task::block_in_place(|| {
                // kubectl drain on a loaded machine has failed once without
                // a message (exit 1); one more try before giving up.
                drain(&args, &bin, &mut table).or_else(|e| {
                    table.note(format!("drain: first attempt failed ({e:#}); tried again"));
                    drain(&args, &bin, &mut table)
                })
            }),
        };
        if let Err(e) = r {
            eprintln!("[bench] {part}: FAILED: {e:#}");
            table.0.failed.push(format!("{part}: {e:#}"));
        }
    }
    let extra: Vec<String> = std::env::args().skip(1).collect();
    let command = if extra.is_empty() {
        "make bench".to_string()
    } else {
        format!("make bench BENCH_ARGS=\"{}\"", extra.join(" "))
    };
    let (nproc, memory, cpu) = machine();
    let header = Header {
        command,
        started: started.format("%Y-%m-%d %H:%M").to_string(),
        commit,
        dirty,
        executable: shown_path(&bin),
        nproc,
        memory,
        cpu,
        load_start,
        load_end: load_average(),
        partial: (!full).then(|| parts.iter().map(ToString::to_string).collect()),
    };
    // What the document holds now: the parts this run did not measure
    // are kept, and its history carried forward.
    let previous = (!out.is_empty())
        .then(|| std::fs::read_to_string(repo_root().join(&out)).ok())
        .flatten();
    let ran: Vec<String> = parts.iter().map(ToString::to_string).collect();
    let doc = bench_report::document(&header, &table.0, &ran, &PARTS, previous.as_deref());
    // The state at its end is for the next run, not for reading.
    let shown = doc
        .find(&format!("<!-- {}", bench_report::STATE_MARK))
        .map_or(doc.as_str(), |at| &doc[..at]);
    println!("\n{shown}");
    if !out.is_empty() {
        let path = repo_root().join(&out);
        if let Err(e) = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, &doc))
        {
            eprintln!("bench: FAIL: could not write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("[bench] written to {}", path.display());
    }
    if table.0.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
