//! How to play a scenario: [`RunOptions`], and the parts of a run that
//! have options of their own (the containers the harness plays, an API
//! server outage, a node deletion).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::procs::{AgentRunner, Credentials};

/// How to play a scenario.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The scenario file.
    pub scenario: PathBuf,
    /// The `forewarn` binary.
    pub forewarn_bin: PathBuf,
    /// Give up (and fail) after this long: a hang bound, to be set well
    /// beyond the scenario's own length (its notices, run times, delays).
    pub timeout: Duration,
    /// Print timeline lines as they happen.
    pub live: bool,
    /// Where the processes' logs go.
    pub log_dir: PathBuf,
    /// Namespace of the workload.
    pub namespace: String,
    /// Replicas of the workload's Deployment.
    pub replicas: i32,
    /// The PodDisruptionBudget's `minAvailable`.
    pub min_available: i32,
    /// Nodes an "administrator" cordons before the scenario starts; forewarn
    /// must leave them cordoned (forewarn undoes only what it did).
    pub precordoned: Vec<String>,
    /// Nodes left cordoned by forewarn for a `ScheduledEvent` that was then
    /// deleted by hand; forewarn must release them.
    pub orphaned_holds: Vec<String>,
    /// `(node, event object name)`: nodes an earlier forewarn cordoned and
    /// tainted for an event that is still in progress (an upgrade): set on
    /// the node before the processes start, with `extra_objects` for the
    /// earlier version's objects.
    pub prior_holds: Vec<(String, String)>,
    /// Keep the `ScheduledEvent`s, reports and node holds the cluster
    /// holds when the run starts (no reset of them; the workload's
    /// namespace is still made afresh): an upgrade test leaves an earlier
    /// version's event in progress, written under the earlier CRDs, before
    /// it upgrades them and the new processes start.
    pub keep_objects: bool,
    /// SIGKILL the controller as soon as an event is seen `Started`, and
    /// start a new one (any process may die at any moment).
    pub kill_controller_on_start: bool,
    /// SIGKILL this node's agent as soon as an event is seen `Started`, and
    /// start it again once every event has left IMDS: the new agent must
    /// notice, with no memory, that its events are over.
    pub agent_down_across_finish: Option<String>,
    /// The controller's policy file, as YAML text; `None`: the defaults.
    pub policy: Option<String>,
    /// More objects to create in the workload's namespace before the
    /// scenario starts (Pods, Deployments, PodDisruptionBudgets...), as JSON.
    pub extra_objects: Vec<serde_json::Value>,
    /// `kubectl` commands (arguments) run this long after the scenario starts.
    pub timed_kubectl: Vec<(Duration, Vec<String>)>,
    /// The workload's `terminationGracePeriodSeconds`.
    pub workload_grace_seconds: i64,
    /// How long the workload's pods take to stop after their deletion, a
    /// random time in this range (KWOK's Stages read the pod annotations
    /// `forewarn.dev/stop-after`/`stop-before`); `None`: they use their
    /// whole grace period, like a server that ignores SIGTERM.
    pub workload_stops_within: Option<(String, String)>,
    /// Count any pod deletion with a grace period of 0 (a force delete) as a
    /// violation. Off only for tests that delete pods themselves.
    pub forbid_force_delete: bool,
    /// Who the controller and agents authenticate as (default: the
    /// cluster's admin kubeconfig); see [`Credentials`].
    pub credentials: Option<Credentials>,
    /// Once the fleet is ready, write its `/metrics` targets here as a
    /// Prometheus `file_sd_configs` file (JSON: each target with
    /// `__meta_forewarn_role` `agent` or `controller`, `namespace`, and an
    /// agent's `node`; no `job`), so that a Prometheus server started before
    /// the run scrapes it.
    pub prometheus_targets: Option<PathBuf>,
    /// More environment for every forewarn process, e.g.
    /// `FOREWARN_DRY_RUN=true` (read by the controller only).
    pub extra_env: Vec<(String, String)>,
    /// The VM of this node is deleted (a scale set's last VM, a GPU VM):
    /// when the trigger fires, its agent is SIGKILLed for good and its Node
    /// object deleted. The Node is created again (without forewarn's marks)
    /// after the run, so the cluster stays whole for the next test.
    pub delete_node: Option<(NodeDeletion, String)>,
    /// The policy file is rewritten with this text this long after the
    /// scenario starts (the controller must notice; an invalid text must be
    /// refused and the policy in force kept).
    pub timed_policy: Vec<(Duration, String)>,
    /// The run ends only once every `ScheduledEvent` is deleted too (its
    /// retention over), with the controller still running.
    pub until_deleted: bool,
    /// Stop the cluster's kube-apiserver for a while mid-drain (see
    /// [`ApiServerOutage`]).
    pub api_server_outage: Option<ApiServerOutage>,
    /// YAML manifests applied in the workload's namespace before the
    /// scenario starts (`kubectl apply -n NS -f`), e.g.
    /// `examples/notice-workload.yaml`.
    pub extra_manifests: Vec<PathBuf>,
    /// Pods whose container the harness plays (KWOK runs no container):
    /// each reads its notice and acknowledges it (see [`Acknowledgers`]).
    pub acknowledgers: Option<Acknowledgers>,
    /// Agents run otherwise, by node name: another platform's binary through
    /// an emulator (see [`AgentRunner`]).
    pub agent_runners: BTreeMap<String, AgentRunner>,
    /// `(label selector, count)`: once the extra objects are created, the
    /// run waits until this many pods of the workload's namespace matching
    /// the selector are Running and Ready before its processes start (a
    /// hang bound of 180 s), so that the scenario starts on a settled
    /// workload.
    pub ready_before_start: Option<(String, usize)>,
    /// A file the run waits for once its processes are ready, before the
    /// IMDS mock starts playing the scenario (a hang bound of 180 s): a
    /// test that must act before the first event appears (predict it with
    /// `forewarn what-if`, say) creates it when it is done, however long
    /// the loaded machine makes that take.
    pub start_gate: Option<PathBuf>,
    /// Start the controller again at once when it exits (a leader that
    /// could not renew its Lease in time on a loaded machine stops, and
    /// its kubelet restarts the container); each restart is in
    /// [`Report::restarts`](crate::report::Report::restarts). Off: an exit
    /// ends the run with an error.
    pub restart_exited_controller: bool,
    /// Agents as the chart runs them: each with a Ready pod of an agents'
    /// DaemonSet on its node ([`crate::agent_pods`]), so the controller
    /// reads it as up, and reporting other VMs' events only as the
    /// witnesses the controller asks for (`--witnesses`). Off: agents
    /// without pods (read as silent) that report every event they see.
    pub agents_as_chart: bool,
    /// Faults injected this long after the scenario started (the soak's:
    /// see [`TimedFault`]).
    pub timed_faults: Vec<(Duration, TimedFault)>,
}

/// A fault injected at a time of the run ([`RunOptions::timed_faults`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimedFault {
    /// kube-apiserver stopped (every watch ends, every client relists) and
    /// started again `down` later.
    RestartApiServer {
        /// From its stop to its start.
        down: Duration,
    },
    /// The controller SIGKILLed; a new process (another identity) started
    /// at once, which waits for the Lease to expire.
    KillController,
    /// The controller paused (SIGSTOP) for `pause`, longer than its Lease,
    /// then resumed (SIGCONT): it must stop acting and exit without a
    /// write; its container is started again once it exited.
    PauseController {
        /// From SIGSTOP to SIGCONT.
        pause: Duration,
    },
    /// The agent of the node SIGKILLed and started again `down` later.
    RestartAgent {
        /// The node.
        node: String,
        /// From the kill to the start.
        down: Duration,
    },
    /// A `kubectl` command (its arguments): an admission policy applied or
    /// removed, say.
    Kubectl(Vec<String>),
}

/// The part of a workload's containers the harness plays where KWOK runs
/// none (`examples/workload.rs notice` plays it on a real node): when a
/// notice annotation first appears on one of `pods` (the kubelet would
/// project it into the container's downward-API file), the container
/// "prepares" for `prepare`, then writes `ack.forewarn.dev/<event>:
/// <EventId>` on its own pod with a TokenRequest token of
/// `service_account` bound to that pod, as the container would with its
/// own token. Everything is on the timeline and in the
/// [`Report`](crate::report::Report).
#[derive(Debug, Clone)]
pub struct Acknowledgers {
    /// The pods (names, in the workload's namespace); the run starts once
    /// each is Running and Ready.
    pub pods: Vec<String>,
    /// Their ServiceAccount.
    pub service_account: String,
    /// How long a container prepares before it acknowledges.
    pub prepare: Duration,
    /// Pods that read their notice and never acknowledge.
    pub silent: Vec<String>,
}

/// A real stop of kube-apiserver during the run
/// ([`Cluster::stop_api_server`](crate::cluster::Cluster::stop_api_server),
/// then [`Cluster::start_api_server`](crate::cluster::Cluster::start_api_server)).
/// From its start on, a controller that exits is started again at once, as
/// its kubelet would (the controller stops acting, and exits, when it cannot
/// renew its Lease).
#[derive(Debug, Clone)]
pub struct ApiServerOutage {
    /// The outage starts once this pod of the workload's namespace is
    /// terminating and is the namespace's last pod on its node: a drain in
    /// progress (e.g. a pod held by a finalizer).
    pub when_last_terminating: String,
    /// How long the API server stays down (from its stop to its start;
    /// it is ready a few seconds later).
    pub duration: Duration,
    /// `kubectl` commands (arguments) run as soon as it is ready again,
    /// e.g. to finish the held pod as its kubelet would.
    pub then_kubectl: Vec<Vec<String>>,
}

/// When [`RunOptions::delete_node`] deletes the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeDeletion {
    /// As soon as an event is seen `Started`.
    WhenStarted,
    /// This long after the scenario started.
    After(Duration),
}

impl RunOptions {
    /// Defaults for `scenario`: 6 replicas over the nodes, `minAvailable: 5`.
    pub fn new(scenario: PathBuf, forewarn_bin: PathBuf) -> Self {
        let stem = scenario
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scenario".into());
        RunOptions {
            log_dir: super::cluster::repo_root()
                .join("target/forewarn-runs")
                .join(&stem),
            scenario,
            forewarn_bin,
            timeout: Duration::from_secs(180),
            live: false,
            namespace: "shop".into(),
            replicas: 6,
            min_available: 5,
            precordoned: Vec::new(),
            orphaned_holds: Vec::new(),
            prior_holds: Vec::new(),
            keep_objects: false,
            kill_controller_on_start: false,
            agent_down_across_finish: None,
            policy: None,
            extra_objects: Vec::new(),
            timed_kubectl: Vec::new(),
            workload_grace_seconds: 30,
            workload_stops_within: Some(("300ms".into(), "1200ms".into())),
            forbid_force_delete: true,
            credentials: None,
            prometheus_targets: None,
            extra_env: Vec::new(),
            delete_node: None,
            timed_policy: Vec::new(),
            until_deleted: false,
            api_server_outage: None,
            extra_manifests: Vec::new(),
            acknowledgers: None,
            agent_runners: BTreeMap::new(),
            ready_before_start: None,
            start_gate: None,
            restart_exited_controller: false,
            agents_as_chart: false,
            timed_faults: Vec::new(),
        }
    }
}
