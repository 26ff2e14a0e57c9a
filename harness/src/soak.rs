//! The fault-injection soak behind `make soak` and `tests/soak.rs`: rounds
//! of random Azure scenarios (every event type, overlapping events on one
//! node, multi-VM events, cancellations, Spot preemptions) played over a
//! fleet of KWOK nodes with a workload under a PodDisruptionBudget, each
//! round with faults injected while its events run, and the invariants
//! checked after it from outside: the API server's audit log, the IMDS
//! mock's log, the objects and the processes' logs ([`check_round`], on
//! top of the rules every scenario run checks, [`crate::run`]).
//!
//! Everything random comes from one seed: round `i` of a soak with seed `s`
//! is generated from [`round_seed`]`(s, i)` alone, so a violation replays
//! with the same seed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng};
use serde_json::Value;

use crate::cluster::Cluster;
use crate::options::{NodeDeletion, RunOptions, TimedFault};
use crate::report::Report;

/// The kinds of fault the soak injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// kube-apiserver stopped and started again right after an event's
    /// object was created: every watch ends and relists.
    ApiRestart,
    /// The leader SIGKILLed mid-event; a new process takes over.
    LeaderKill,
    /// The leader paused (SIGSTOP) past its Lease, then resumed.
    LeaderPause,
    /// An agent SIGKILLed and started again.
    AgentRestart,
    /// An admission policy refusing the cordon of one node for a while.
    AdmissionNodes,
    /// An admission policy refusing every eviction of the workload for a
    /// while.
    AdmissionEvictions,
    /// IMDS answering 500 or hanging for a while.
    Imds,
    /// A node deleted mid-event (its VM gone).
    NodeDeleted,
}

impl FaultKind {
    /// Every kind, in the table's order.
    pub const ALL: [FaultKind; 8] = [
        FaultKind::ApiRestart,
        FaultKind::LeaderKill,
        FaultKind::LeaderPause,
        FaultKind::AgentRestart,
        FaultKind::AdmissionNodes,
        FaultKind::AdmissionEvictions,
        FaultKind::Imds,
        FaultKind::NodeDeleted,
    ];

    /// The kind's name, as `FAULTS=` takes it.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ApiRestart => "api-restart",
            FaultKind::LeaderKill => "leader-kill",
            FaultKind::LeaderPause => "leader-pause",
            FaultKind::AgentRestart => "agent-restart",
            FaultKind::AdmissionNodes => "admission-nodes",
            FaultKind::AdmissionEvictions => "admission-evictions",
            FaultKind::Imds => "imds",
            FaultKind::NodeDeleted => "node-deleted",
        }
    }

    /// The kinds named in `list` (comma-separated; `all` or empty for
    /// every kind).
    ///
    /// # Errors
    /// An unknown name, with the known ones.
    pub fn parse_list(list: &str) -> anyhow::Result<Vec<FaultKind>> {
        let list = list.trim();
        if list.is_empty() || list == "all" {
            return Ok(Self::ALL.to_vec());
        }
        list.split(',')
            .map(|n| {
                let n = n.trim();
                Self::ALL
                    .iter()
                    .copied()
                    .find(|k| k.name() == n)
                    .with_context(|| {
                        format!(
                            "unknown fault kind {n:?}; known: {}",
                            Self::ALL.map(FaultKind::name).join(", ")
                        )
                    })
            })
            .collect()
    }
}

/// How to soak.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The seed every round is generated from.
    pub seed: u64,
    /// Rounds start while the soak has run less than this...
    pub duration: Duration,
    /// ...or fewer rounds than this have run (at least one).
    pub min_rounds: usize,
    /// The fault kinds injected, each in turn.
    pub faults: Vec<FaultKind>,
    /// The `forewarn` binary.
    pub forewarn_bin: PathBuf,
    /// Where each round's logs go (a folder per round).
    pub log_dir: PathBuf,
    /// The nodes of the cluster (`node-000000` on).
    pub nodes: usize,
}

/// One round: what it played, injected and found.
#[derive(Debug, Clone)]
pub struct Round {
    /// Its place in the soak (from 0).
    pub index: usize,
    /// The seed it was generated from.
    pub seed: u64,
    /// The fault kinds injected.
    pub faults: Vec<FaultKind>,
    /// The events it played.
    pub events: usize,
    /// The invariants checked, by fault kind of the round (each check of
    /// one invariant on one event, node or pause counts one).
    pub checks: usize,
    /// What broke an invariant.
    pub violations: Vec<String>,
    /// Wall time.
    pub elapsed: Duration,
    /// Its logs.
    pub log_dir: PathBuf,
}

/// The seed of round `index` of a soak seeded `seed` (splitmix64).
pub fn round_seed(seed: u64, index: usize) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(index as u64 + 1));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The event types played, with how often (weights).
const TYPES: [(&str, u32); 6] = [
    ("Reboot", 3),
    ("Redeploy", 3),
    ("Preempt", 2),
    ("Terminate", 1),
    ("Freeze", 1),
    ("FreezeLong", 1),
];

/// The workload's namespace.
pub const NAMESPACE: &str = "soak";

/// The policy of every round: an approval waits for the whole drain
/// (`onDeadline: Hold`), so that an approval that reaches IMDS with a
/// workload pod left is always a violation; an event whose every node was
/// deleted (no agent left to see it leave IMDS) ends 30 s after, not the
/// default 5 minutes, within the round.
const POLICY: &str = "onDeadline: Hold\nreleaseDelaySeconds: 5\norphanedAfterSeconds: 30\n";

/// A generated round: the scenario, the run's faults and what to check.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The scenario file's text.
    pub scenario: String,
    /// Faults at times of the run.
    pub timed: Vec<(Duration, TimedFault)>,
    /// A node deleted at a time of the run.
    pub delete_node: Option<(Duration, String)>,
    /// The fault kinds injected.
    pub faults: Vec<FaultKind>,
    /// The events, by id: their nodes, when they appear and their notice.
    pub events: Vec<PlannedEvent>,
    /// When a fault may hold forewarn back (from, to), after the scenario
    /// started: a cordon is due before `NotBefore` only for events whose
    /// notice no such window overlaps.
    pub fault_windows: Vec<(Duration, Duration)>,
    /// The node whose cordons an admission policy refuses, if any.
    pub refused_node: Option<String>,
    /// `minAvailable` of the workload's budget (of 6 replicas).
    pub min_available: i32,
}

/// One event of a round, as generated.
#[derive(Debug, Clone)]
pub struct PlannedEvent {
    /// `EventId`.
    pub id: String,
    /// `EventType`.
    pub event_type: String,
    /// The nodes of its VMs.
    pub nodes: Vec<String>,
    /// When it appears.
    pub at: Duration,
    /// Its notice.
    pub notice: Duration,
    /// Cancelled before it starts.
    pub cancelled: bool,
    /// Whether the default policy drains it.
    pub drains: bool,
}

fn node_name(i: usize) -> String {
    format!("node-{i:06}")
}

fn vm_name(i: usize) -> String {
    format!("soak_vm_{i}")
}

/// Generates round `index` of a soak seeded `seed` over `nodes` nodes,
/// injecting `faults` (those of the kinds given, in turn: round `index`
/// injects the kind at `index` modulo their number, and one more at random).
pub fn plan_round(seed: u64, index: usize, nodes: usize, kinds: &[FaultKind]) -> Plan {
    let mut rng = StdRng::seed_from_u64(round_seed(seed, index));
    let secs = |s: u64| Duration::from_secs(s);
    let mut faults = Vec::new();
    if !kinds.is_empty() {
        faults.push(kinds[index % kinds.len()]);
        if kinds.len() > 1 && rng.random_bool(0.5) {
            let other = kinds[rng.random_range(0..kinds.len())];
            if !faults.contains(&other) {
                faults.push(other);
            }
        }
    }
    faults.sort();
    // The events: two to four, on one to three VMs each, overlapping by
    // chance (a node in two events at once).
    let count = rng.random_range(2..=4);
    let total: u32 = TYPES.iter().map(|(_, w)| w).sum();
    let mut events = Vec::new();
    let mut yaml_events = String::new();
    for e in 0..count {
        let mut pick = rng.random_range(0..total);
        let mut ty = TYPES[0].0;
        for (t, w) in TYPES {
            if pick < w {
                ty = t;
                break;
            }
            pick -= w;
        }
        let n = rng.random_range(1..=3usize.min(nodes));
        let mut vms: Vec<usize> = Vec::new();
        while vms.len() < n {
            let v = rng.random_range(0..nodes);
            if !vms.contains(&v) {
                vms.push(v);
            }
        }
        vms.sort_unstable();
        let at = secs(rng.random_range(0..=15));
        let notice = match ty {
            "Preempt" => secs(30),
            _ => secs(rng.random_range(40..=90)),
        };
        let run_for = secs(rng.random_range(5..=10));
        let cancelled = ty != "Preempt" && rng.random_bool(0.15);
        let (event_type, duration) = match ty {
            "Freeze" => ("Freeze", 5),
            "FreezeLong" => ("Freeze", 30),
            t => (t, -1),
        };
        let id = format!(
            "5A0C{:04X}-{:04X}-4000-8000-{:012X}",
            index % 0x1_0000,
            e,
            round_seed(seed, index) & 0xFFFF_FFFF_FFFF
        );
        let resources: Vec<String> = vms.iter().map(|v| vm_name(*v)).collect();
        yaml_events.push_str(&format!(
            "  - {{id: {id}, type: {event_type}, resources: [{}], durationSeconds: {duration}, at: {}s, notice: {}s, runFor: {}s{}}}\n",
            resources.join(", "),
            at.as_secs(),
            notice.as_secs(),
            run_for.as_secs(),
            if cancelled {
                format!(", cancelAt: {}s", at.as_secs() + notice.as_secs() / 2)
            } else {
                String::new()
            }
        ));
        events.push(PlannedEvent {
            id,
            event_type: event_type.into(),
            nodes: vms.iter().map(|v| node_name(*v)).collect(),
            at,
            notice,
            cancelled,
            drains: !(event_type == "Freeze" && duration <= 10),
        });
    }
    // Faults, each at a moment some event is under way.
    let mut timed = Vec::new();
    let mut delete_node = None;
    let mut windows = Vec::new();
    let mut refused_node = None;
    let mut imds_faults = String::new();
    let mut min_available = 5;
    let first = events[rng.random_range(0..events.len())].clone();
    for kind in &faults {
        let t = first.at + secs(rng.random_range(2..=12));
        match kind {
            FaultKind::ApiRestart => {
                // Right after the event's object was created: its agents
                // report within a second or two of its appearance.
                let at = first.at + Duration::from_millis(rng.random_range(1_500..=3_000));
                let down = secs(rng.random_range(2..=6));
                timed.push((at, TimedFault::RestartApiServer { down }));
                windows.push((at, at + down + secs(20)));
            }
            FaultKind::LeaderKill => {
                timed.push((t, TimedFault::KillController));
                windows.push((t, t + secs(30)));
            }
            FaultKind::LeaderPause => {
                let pause = secs(20);
                timed.push((t, TimedFault::PauseController { pause }));
                windows.push((t, t + pause + secs(30)));
            }
            FaultKind::AgentRestart => {
                let node = first.nodes[rng.random_range(0..first.nodes.len())].clone();
                let down = secs(rng.random_range(3..=10));
                timed.push((t, TimedFault::RestartAgent { node, down }));
                windows.push((t, t + down + secs(10)));
            }
            FaultKind::AdmissionNodes => {
                let node = first.nodes[rng.random_range(0..first.nodes.len())].clone();
                let from = first.at;
                let until = from + secs(rng.random_range(15..=30));
                timed.push((from, TimedFault::Kubectl(apply_args("nodes"))));
                timed.push((until, TimedFault::Kubectl(delete_args("nodes"))));
                windows.push((from, until + secs(70)));
                refused_node = Some(node);
            }
            FaultKind::AdmissionEvictions => {
                let from = t;
                let until = from + secs(rng.random_range(15..=30));
                timed.push((from, TimedFault::Kubectl(apply_args("evictions"))));
                timed.push((until, TimedFault::Kubectl(delete_args("evictions"))));
                windows.push((from, until + secs(70)));
            }
            FaultKind::Imds => {
                let vms: Vec<String> = first
                    .nodes
                    .iter()
                    .map(|n| vm_name(n.trim_start_matches("node-").parse().unwrap_or(0)))
                    .collect();
                let kind = if rng.random_bool(0.5) {
                    "status500"
                } else {
                    "hang"
                };
                let at = t.as_secs();
                let length = rng.random_range(3..=8);
                imds_faults.push_str(&format!(
                    "  - {{at: {at}s, for: {length}s, kind: {kind}, vms: [{}]}}\n",
                    vms.join(", ")
                ));
                windows.push((t, t + secs(length + 10)));
            }
            FaultKind::NodeDeleted => {
                let node = first.nodes[rng.random_range(0..first.nodes.len())].clone();
                delete_node = Some((t, node));
                // Its pods go without an eviction: the budget's room for
                // forewarn's one at a time stays.
                min_available = 4;
                windows.push((t, t + secs(10)));
            }
        }
    }
    timed.sort_by_key(|(at, _)| *at);
    let vms: String = (0..nodes)
        .map(|i| format!("  - {{name: {}, node: {}}}\n", vm_name(i), node_name(i)))
        .collect();
    let mut scenario = format!(
        "description: Soak round {index} of seed {seed}, faults {}\nvms:\n{vms}events:\n{yaml_events}",
        faults
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !imds_faults.is_empty() {
        scenario.push_str("faults:\n");
        scenario.push_str(&imds_faults);
    }
    Plan {
        scenario,
        timed,
        delete_node,
        faults,
        events,
        fault_windows: windows,
        refused_node,
        min_available,
    }
}

/// The admission policies the soak applies, by what they refuse, as
/// manifests written under the soak's log folder ([`write_policies`]).
fn policy_path(what: &str) -> PathBuf {
    crate::cluster::repo_root()
        .join("target/soak/policies")
        .join(format!("refuse-{what}.json"))
}

fn apply_args(what: &str) -> Vec<String> {
    vec![
        "apply".into(),
        "-f".into(),
        policy_path(what).to_string_lossy().into_owned(),
    ]
}

fn delete_args(what: &str) -> Vec<String> {
    vec![
        "delete".into(),
        "--ignore-not-found".into(),
        "-f".into(),
        policy_path(what).to_string_lossy().into_owned(),
    ]
}

/// Writes the admission policies (and bindings) of one round: one refusing
/// the cordon of `refused_node` (when given), one refusing every eviction
/// in the workload's namespace.
fn write_policies(refused_node: Option<&str>) -> anyhow::Result<()> {
    let node = refused_node.unwrap_or("none");
    let policy = crate::audit::refusing_policy;
    let nodes = policy(
        "forewarn-soak-refuse-nodes",
        serde_json::json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}),
        &format!(
            "object.metadata.name == '{node}' && has(object.spec.unschedulable) && object.spec.unschedulable"
        ),
        "the soak refuses this node's cordon for a while",
    );
    let evictions = policy(
        "forewarn-soak-refuse-evictions",
        serde_json::json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/eviction"]}),
        &format!("request.namespace == '{NAMESPACE}'"),
        "the soak refuses evictions for a while",
    );
    let dir = policy_path("x");
    std::fs::create_dir_all(dir.parent().context("policy dir")?)?;
    std::fs::write(policy_path("nodes"), nodes.to_string())?;
    std::fs::write(policy_path("evictions"), evictions.to_string())?;
    Ok(())
}

/// Runs rounds for `opts.duration`, and at least `opts.min_rounds`, on
/// `cluster` (whose
/// kube-apiserver writes an audit log of every write), calling `each`
/// after every round.
///
/// # Errors
/// When a round cannot be set up (a violation is no error).
pub async fn run_soak(
    cluster: &Cluster,
    opts: &SoakOptions,
    mut each: impl FnMut(&Round),
) -> anyhow::Result<Vec<Round>> {
    let started = Instant::now();
    let mut rounds = Vec::new();
    let mut index = 0;
    while index < opts.min_rounds.max(1) || started.elapsed() < opts.duration {
        let round = run_round(cluster, opts, index).await?;
        each(&round);
        rounds.push(round);
        index += 1;
    }
    Ok(rounds)
}

/// Plays round `index` and checks it.
///
/// # Errors
/// When it cannot be set up.
pub async fn run_round(
    cluster: &Cluster,
    opts: &SoakOptions,
    index: usize,
) -> anyhow::Result<Round> {
    let plan = plan_round(opts.seed, index, opts.nodes, &opts.faults);
    let seed = round_seed(opts.seed, index);
    let log_dir = opts.log_dir.join(format!("round-{index:03}-{seed:016x}"));
    std::fs::create_dir_all(&log_dir)?;
    let scenario = log_dir.join("scenario.yaml");
    std::fs::write(&scenario, &plan.scenario)?;
    write_policies(plan.refused_node.as_deref())?;
    // No policy of an earlier round stays.
    for what in ["nodes", "evictions"] {
        let args = delete_args(what);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let _ = cluster.kubectl(&args);
    }
    let last_end = plan
        .events
        .iter()
        .map(|e| e.at + e.notice + Duration::from_secs(10))
        .max()
        .unwrap_or_default();
    let mut run = RunOptions::new(scenario, opts.forewarn_bin.clone());
    run.log_dir = log_dir.clone();
    run.namespace = NAMESPACE.into();
    run.min_available = plan.min_available;
    run.policy = Some(POLICY.into());
    run.restart_exited_controller = true;
    run.timed_faults = plan.timed.clone();
    run.delete_node = plan
        .delete_node
        .clone()
        .map(|(at, node)| (NodeDeletion::After(at), node));
    // Every event over, its nodes released past the release delay, with
    // room for the faults' own delays.
    run.timeout = last_end + Duration::from_secs(150);
    let begun = Instant::now();
    let started_at = Utc::now();
    let report = crate::run::run_scenario(cluster, &run).await?;
    let (checks, mut violations) = check_round(cluster, &plan, &report, started_at);
    violations.splice(0..0, report.violations.iter().cloned());
    let mut timeline = report.timeline.join("\n");
    timeline.push('\n');
    std::fs::write(log_dir.join("timeline.txt"), timeline)?;
    Ok(Round {
        index,
        seed,
        faults: injected(&plan, &report, begun.elapsed()),
        events: plan.events.len(),
        // The run's own rules, once per event (approval after the drain,
        // final phase, nodes released, no force delete, the budget), and
        // the soak's checks.
        checks: checks + plan.events.len() * 5,
        violations,
        elapsed: begun.elapsed(),
        log_dir,
    })
}

/// The kinds of `plan`'s faults that the run injected (a fault planned
/// after the run's end was not; `elapsed`: how long the run took).
fn injected(plan: &Plan, report: &Report, elapsed: Duration) -> Vec<FaultKind> {
    let done = |prefix: &str, arg: Option<&str>| {
        report
            .faults
            .iter()
            .any(|(_, f)| f.starts_with(prefix) && arg.is_none_or(|a| f.contains(a)))
    };
    plan.faults
        .iter()
        .copied()
        .filter(|k| match k {
            FaultKind::ApiRestart => done("RestartApiServer", None),
            FaultKind::LeaderKill => done("KillController", None),
            FaultKind::LeaderPause => done("PauseController", None),
            FaultKind::AgentRestart => done("RestartAgent", None),
            FaultKind::AdmissionNodes => done("Kubectl", Some("refuse-nodes")),
            FaultKind::AdmissionEvictions => done("Kubectl", Some("refuse-evictions")),
            FaultKind::NodeDeleted => !report.deleted_nodes.is_empty(),
            // Played by the mock on its own clock: injected when the run
            // lasted past its start.
            FaultKind::Imds => plan.fault_windows.iter().any(|(from, _)| *from < elapsed),
        })
        .collect()
}

fn audited(cluster: &Cluster, since: DateTime<Utc>) -> Vec<crate::audit::Write> {
    crate::audit::writes(cluster)
        .unwrap_or_default()
        .into_iter()
        .filter(|w| w.at >= since)
        .collect()
}

/// How soon after a paused leader's resume the requests it was sending
/// when it was stopped reach the API server (they are sent as soon as it
/// runs again: milliseconds).
const IN_FLIGHT_AT_PAUSE: chrono::TimeDelta = chrono::TimeDelta::milliseconds(500);

/// The soak's own invariants on a round played by `plan` (`report`: what
/// the run saw; `since`: when it started), beyond the run's rules. Returns
/// how many checks were made and what broke:
/// - no controller write after its Lease deadline: nothing from a paused
///   leader's identity between its resume (and the requests it was already
///   sending, [`IN_FLIGHT_AT_PAUSE`]) and its exit;
/// - no pod deleted by the controller other than through an Eviction;
/// - every node of a drained event cordoned before its `NotBefore`, where
///   no fault held forewarn back during its notice;
/// - no node left cordoned or tainted by forewarn at the end;
/// - no panic in any process's log.
pub fn check_round(
    cluster: &Cluster,
    plan: &Plan,
    report: &Report,
    since: DateTime<Utc>,
) -> (usize, Vec<String>) {
    let mut checks = 0;
    let mut violations = Vec::new();
    let writes = audited(cluster, since);
    let version = env!("CARGO_PKG_VERSION");
    for (resumed, exited, identity) in &report.pauses {
        checks += 1;
        let ua = format!("forewarn/{version} (controller; {identity})");
        let until = exited.unwrap_or_else(Utc::now);
        // A request the process was already sending when it was stopped
        // reaches the server as it resumes (no client can recall it): one
        // that arrives later was sent after the resume.
        let in_flight = *resumed + IN_FLIGHT_AT_PAUSE;
        for w in writes
            .iter()
            .filter(|w| w.user_agent == ua && w.at >= in_flight && w.at <= until)
        {
            violations.push(format!(
                "a write from the paused leader {identity} after its Lease deadline: {} {} {} at {}",
                w.verb, w.uri, w.code, w.at
            ));
        }
    }
    for w in &writes {
        if w.user_agent.contains("(controller;")
            && w.verb == "delete"
            && w.uri.contains("/pods/")
            && !w.uri.contains("/eviction")
        {
            violations.push(format!(
                "the controller deleted a pod without an Eviction: {} at {}",
                w.uri, w.at
            ));
        }
    }
    checks += 1;
    // Cordoned before NotBefore, where the notice allowed.
    let first_cordon: HashMap<&str, Vec<DateTime<Utc>>> = report
        .node_changes
        .iter()
        .filter(|(_, _, c)| *c)
        .fold(HashMap::new(), |mut m, (at, n, _)| {
            m.entry(n.as_str()).or_default().push(*at);
            m
        });
    let deleted: HashSet<&str> = report
        .deleted_nodes
        .iter()
        .map(|(_, n)| n.as_str())
        .collect();
    let started = report.started;
    for e in plan.events.iter().filter(|e| e.drains && !e.cancelled) {
        let from = e.at;
        let to = e.at + e.notice;
        let held_back = plan.fault_windows.iter().any(|(a, b)| *a < to && *b > from);
        if held_back {
            continue;
        }
        // The mock's clock starts a moment after the run's observer.
        let Some(not_before) = report
            .not_before
            .get(&e.id)
            .or_else(|| report.not_before.get(&e.id.to_ascii_lowercase()))
            .copied()
            .or_else(|| chrono::Duration::from_std(to).ok().map(|d| started + d))
        else {
            continue;
        };
        for node in &e.nodes {
            if deleted.contains(node.as_str()) || plan.refused_node.as_deref() == Some(node) {
                continue;
            }
            checks += 1;
            let cordoned = first_cordon
                .get(node.as_str())
                .is_some_and(|ts| ts.iter().any(|t| *t <= not_before));
            if !cordoned {
                violations.push(format!(
                    "{} {}: {node} not cordoned before its NotBefore {not_before}",
                    e.event_type, e.id
                ));
            }
        }
    }
    // Nothing of forewarn's left on the nodes.
    if let Ok(out) = cluster.kubectl(&["get", "nodes", "-o", "json"]) {
        let nodes: Value = serde_json::from_str(&out).unwrap_or_default();
        for n in nodes["items"].as_array().into_iter().flatten() {
            checks += 1;
            let name = n["metadata"]["name"].as_str().unwrap_or_default();
            let held = n["metadata"]["annotations"][forewarn::api::CORDONED_FOR_ANNOTATION]
                .as_str()
                .is_some();
            let tainted = n["spec"]["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| {
                    t["key"]
                        .as_str()
                        .is_some_and(|k| k.starts_with("forewarn.dev/"))
                });
            let cordoned = n["spec"]["unschedulable"].as_bool() == Some(true);
            if held || tainted || cordoned {
                violations.push(format!(
                    "{name} left held ({held}), tainted ({tainted}) or cordoned ({cordoned}) at the end"
                ));
            }
        }
    }
    // No panic.
    if let Ok(dir) = std::fs::read_dir(&report.log_dir) {
        for f in dir.flatten() {
            let p = f.path();
            if p.extension().is_some_and(|e| e == "log") {
                checks += 1;
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                if let Some(line) = text.lines().find(|l| l.contains("panicked at")) {
                    violations.push(format!("{}: {line}", p.display()));
                }
            }
        }
    }
    (checks, violations)
}

/// The soak's table: per fault kind, rounds that injected it, events,
/// invariants checked, violations.
pub fn table(rounds: &[Round]) -> Vec<(String, usize, usize, usize, usize)> {
    let mut by: BTreeMap<FaultKind, (usize, usize, usize, usize)> = BTreeMap::new();
    for r in rounds {
        for f in &r.faults {
            let e = by.entry(*f).or_default();
            e.0 += 1;
            e.1 += r.events;
            e.2 += r.checks;
            e.3 += r.violations.len();
        }
    }
    let mut rows: Vec<(String, usize, usize, usize, usize)> = by
        .into_iter()
        .map(|(k, (i, e, c, v))| (k.name().to_string(), i, e, c, v))
        .collect();
    rows.push((
        "all rounds".into(),
        rounds.len(),
        rounds.iter().map(|r| r.events).sum(),
        rounds.iter().map(|r| r.checks).sum(),
        rounds.iter().map(|r| r.violations.len()).sum(),
    ));
    rows
}

/// The table as Markdown.
pub fn table_markdown(rounds: &[Round]) -> String {
    let mut s = String::from(
        "| fault kind | injected (rounds) | events | invariants checked | violations |\n|---|---:|---:|---:|---:|\n",
    );
    for (k, i, e, c, v) in table(rounds) {
        s.push_str(&format!("| {k} | {i} | {e} | {c} | {v} |\n"));
    }
    s
}

/// Where the soak's logs go by default.
pub fn default_log_dir() -> PathBuf {
    crate::cluster::repo_root().join("target/soak")
}
