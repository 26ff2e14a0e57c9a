//! Plays one scenario end to end on a local cluster: a Deployment with a
//! PodDisruptionBudget, the IMDS mock, one agent per node and the
//! controller; prints a timeline; checks the rules in README, "How it works", from the
//! outside (nodes, pods and the mock's own log, never forewarn's word).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::cluster::Cluster;
use super::procs::{AgentRunner, Credentials, Fleet, FleetOptions, Proc};
use forewarn::api::holds;
use forewarn::api::{
    CONTROLLER_MANAGER, CORDONED_FOR_ANNOTATION, ScheduledEvent, ScheduledEventReport,
};
use forewarn::controller::observe::nodes::is_cordoned;
use forewarn::imds::mock::LogEntry;
use forewarn::imds::scenario::Scenario;
use forewarn::topology::{FAULT_DOMAIN_LABEL, UPDATE_DOMAIN_LABEL, VirtualMachineReport};

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
}

/// The part of a workload's containers the harness plays where KWOK runs
/// none (`examples/workload.rs notice` plays it on a real node): when a
/// notice annotation first appears on one of `pods` (the kubelet would
/// project it into the container's downward-API file), the container
/// "prepares" for `prepare`, then writes `ack.forewarn.dev/<event>:
/// <EventId>` on its own pod with a TokenRequest token of
/// `service_account` bound to that pod, as the container would with its
/// own token. Everything is on the timeline and in the [`Report`].
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

/// A notice annotation (`notice.forewarn.dev/<event>`) as the harness saw
/// it on a pod of the workload's namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct NoticeSeen {
    /// `namespace/name`.
    pub pod: String,
    /// Its UID.
    pub uid: String,
    /// The node it ran on.
    pub node: String,
    /// The `ScheduledEvent`'s name (the key's suffix).
    pub event: String,
    /// The value first seen, then the last one.
    pub first_value: String,
    /// The last value seen.
    pub last_value: String,
    /// When the watch first delivered it.
    pub first_seen: DateTime<Utc>,
    /// When a version of the pod without it was first delivered (the pod
    /// still there); `None` if it never was.
    pub removed_at: Option<DateTime<Utc>>,
    /// The field managers (`manager operation`) owning the key in the
    /// version it was first seen in.
    pub managers: Vec<String>,
}

/// An acknowledgement the harness wrote for a pod it plays.
#[derive(Debug, Clone, PartialEq)]
pub struct AckWritten {
    /// `namespace/name`.
    pub pod: String,
    /// The `ScheduledEvent`'s name.
    pub event: String,
    /// The `EventId` written.
    pub event_id: String,
    /// When the PATCH was sent: the acknowledgement cannot have been
    /// stored before. (Compare what must follow the acknowledgement with
    /// this: the answer may come late on a loaded machine, after the
    /// controller already acted on the stored acknowledgement.)
    pub sent: DateTime<Utc>,
    /// When the API server's answer to the PATCH was read: it was stored
    /// before.
    pub at: DateTime<Utc>,
}

/// A real stop of kube-apiserver during the run ([`Cluster::stop_api_server`],
/// then [`Cluster::start_api_server`]). From its start on, a controller
/// that exits is started again at once, as its kubelet would (the
/// controller stops acting, and exits, when it cannot renew its Lease).
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
        }
    }
}

/// What happened, and whether the rules held.
#[derive(Debug, Default)]
pub struct Report {
    /// Timeline lines, `[+  4.2s] who  what`.
    pub timeline: Vec<String>,
    /// Rules broken or expectations missed; empty when all is well.
    pub violations: Vec<String>,
    /// Whether every event reached its end and every node was released.
    pub finished: bool,
    /// Fewest ready workload pods seen at any sample.
    pub min_ready: i32,
    /// The PodDisruptionBudget's `minAvailable`.
    pub min_available: i32,
    /// Approvals IMDS received (from the mock's log).
    pub approvals: Vec<LogEntry>,
    /// Nodes seen cordoned at some point.
    pub cordoned: Vec<String>,
    /// `kubectl get scheduledevents -o wide` at the end.
    pub sev_table: String,
    /// Seconds from the scenario's start to the end.
    pub elapsed: f64,
    /// Where the processes' logs are.
    pub log_dir: PathBuf,
    /// Each process's `/metrics` text at the end, by process name.
    pub metrics: Vec<(String, String)>,
    /// When the scenario's clock started (its events' `at` count from here).
    pub started: DateTime<Utc>,
    /// Every pod deletion seen during the run, as the API server recorded it.
    pub deletions: Vec<PodDeletion>,
    /// Every change of a node's `spec.unschedulable`, as a watch delivered
    /// them: `(when seen, node, unschedulable)`.
    pub node_changes: Vec<(DateTime<Utc>, String, bool)>,
    /// Nodes deleted during the run ([`RunOptions::delete_node`]), and when.
    pub deleted_nodes: Vec<(DateTime<Utc>, String)>,
    /// The API server outage ([`RunOptions::api_server_outage`]): when it
    /// was stopped, and when `/readyz` first answered again (polled every
    /// 50 ms with kubectl: at most about 0.3 s late).
    pub api_server_outage: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// Processes that exited and were started again, with when and how.
    pub restarts: Vec<(DateTime<Utc>, String)>,
    /// The IMDS mock's whole log (phases it moved events to, approvals it
    /// received), as last read.
    pub imds_log: Vec<LogEntry>,
    /// Every notice annotation seen on a pod of the workload's namespace.
    pub notices: Vec<NoticeSeen>,
    /// The acknowledgements the harness wrote ([`RunOptions::acknowledgers`]).
    pub acks: Vec<AckWritten>,
}

/// A pod deletion as the API server applied it: the first version of the
/// pod with a `deletionTimestamp`.
#[derive(Debug, Clone, PartialEq)]
pub struct PodDeletion {
    /// `namespace/name`.
    pub pod: String,
    /// The node it ran on.
    pub node: String,
    /// `metadata.deletionGracePeriodSeconds` (0 is a force delete).
    pub grace_seconds: Option<i64>,
    /// `metadata.deletionTimestamp`: deletion time plus the grace period.
    pub deletion_timestamp: DateTime<Utc>,
    /// When the watch delivered it.
    pub seen_at: DateTime<Utc>,
}

impl Report {
    /// Whether the scenario completed and every rule held.
    pub fn ok(&self) -> bool {
        self.finished && self.violations.is_empty()
    }

    /// When `node` was first seen cordoned during the run (the harness's
    /// watch of nodes), if ever.
    pub fn first_cordon(&self, node: &str) -> Option<DateTime<Utc>> {
        self.node_changes
            .iter()
            .filter(|(_, n, cordoned)| n == node && *cordoned)
            .map(|(t, ..)| *t)
            .min()
    }

    /// The value of the sample `series` (its name and labels as exposed,
    /// e.g. `x_total{a="b"}`) in `process`'s `/metrics` at the end of the
    /// run (`controller`, or an agent's name); `None` when not exposed.
    pub fn metric(&self, process: &str, series: &str) -> Option<f64> {
        let (_, text) = self.metrics.iter().find(|(p, _)| p == process)?;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{series} ")))
            .and_then(|v| v.trim().parse().ok())
    }
}

/// A Deployment of `replicas` pause pods pinned to `node` (their
/// replacements stay Pending there once it is cordoned), with
/// `terminationGracePeriodSeconds` `grace`; `extra_objects` of a run
/// create it in the run's namespace.
pub fn pinned_deployment(name: &str, replicas: i32, grace: i64, node: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "terminationGracePeriodSeconds": grace,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            }},
        },
    })
}

/// Timeline lines, printed in the order things happened: each line carries
/// the time of the fact it reports (the mock's log, an Event's time, a status
/// timestamp), and lines wait a moment so that late observations sort in.
struct Timeline {
    origin: DateTime<Utc>,
    live: bool,
    lines: Vec<String>,
    pending: Vec<(DateTime<Utc>, String)>,
}

/// How long a line waits for earlier facts observed later.
const REORDER_WINDOW: chrono::TimeDelta = chrono::TimeDelta::milliseconds(1500);

impl Timeline {
    fn new(live: bool) -> Self {
        Timeline {
            origin: Utc::now(),
            live,
            lines: Vec::new(),
            pending: Vec::new(),
        }
    }

    fn elapsed(&self) -> f64 {
        (Utc::now() - self.origin).as_seconds_f64()
    }

    fn at(&mut self, when: DateTime<Utc>, who: &str, what: impl AsRef<str>) {
        let secs = (when - self.origin).as_seconds_f64().max(0.0);
        self.pending
            .push((when, format!("[+{secs:6.1}s] {who:<10} {}", what.as_ref())));
    }

    fn say(&mut self, who: &str, what: impl AsRef<str>) {
        self.at(Utc::now(), who, what);
    }

    /// Emits the lines older than the reorder window (all with `all`).
    fn flush(&mut self, all: bool) {
        let cutoff = Utc::now() - REORDER_WINDOW;
        self.pending.sort_by_key(|(t, _)| *t);
        let n = if all {
            self.pending.len()
        } else {
            self.pending
                .iter()
                .take_while(|(t, _)| *t <= cutoff)
                .count()
        };
        for (_, line) in self.pending.drain(..n) {
            if self.live {
                println!("{line}");
            }
            self.lines.push(line);
        }
    }
}

fn chrono_time(t: &k8s_openapi::jiff::Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp(
        t.as_second(),
        u32::try_from(t.subsec_nanosecond()).unwrap_or(0),
    )
    .unwrap_or_else(Utc::now)
}

fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// Removes what earlier runs left: the workload namespace and, when
/// `objects`, ScheduledEvents, reports, forewarn's marks on nodes and
/// cordons.
async fn reset(client: &Client, namespace: &str, objects: bool) -> anyhow::Result<()> {
    if objects {
        reset_objects(client).await?;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(namespace).await?.is_some() {
        // Pods an earlier test left held by a finalizer would keep the
        // namespace terminating forever.
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        for p in pods.list(&ListParams::default()).await? {
            if !p.finalizers().is_empty() {
                let drop_finalizers = json!({"metadata": {"finalizers": null}});
                let _ = pods
                    .patch(
                        &p.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&drop_finalizers),
                    )
                    .await;
            }
        }
        let _ = namespaces.delete(namespace, &DeleteParams::default()).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        while namespaces.get_opt(namespace).await?.is_some() {
            if Instant::now() > deadline {
                bail!("namespace {namespace} from an earlier run was not deleted within 60 s");
            }
            // The earlier run's pods may have long grace periods, honoured
            // by KWOK; cleaning up after a test need not wait for them.
            for p in pods.list(&ListParams::default()).await? {
                let _ = pods
                    .delete(&p.name_any(), &DeleteParams::default().grace_period(0))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// Creates the workload: a Deployment `web` spread over the nodes and a
/// PodDisruptionBudget `web`; waits until every replica is ready.
async fn deploy_workload(client: &Client, opts: &RunOptions) -> anyhow::Result<()> {
    let ns = &opts.namespace;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": opts.replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": stop_annotations(opts)},
                "spec": {
                    "terminationGracePeriodSeconds": opts.workload_grace_seconds,
                    "topologySpreadConstraints": [{
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": {"app": "web"}},
                    }],
                    "containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &deployment)
        .await?;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"minAvailable": opts.min_available, "selector": {"matchLabels": {"app": "web"}}},
    }))?;
    Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pdb)
        .await?;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ready = ready_pods(client, ns).await?;
        let pdb = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
            .get("web")
            .await?;
        let allowed = pdb.status.and_then(|s| s.disruptions_allowed).unwrap_or(0);
        if ready >= opts.replicas && allowed > 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "workload not ready within 90 s ({ready}/{} ready, PDB allows {allowed})",
                opts.replicas
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The KWOK Stage annotations that make a pod stop a while after its
/// deletion (see hack/kwok-stages.yaml).
fn stop_annotations(opts: &RunOptions) -> serde_json::Value {
    match &opts.workload_stops_within {
        Some((after, before)) => {
            json!({"forewarn.dev/stop-after": after, "forewarn.dev/stop-before": before})
        }
        None => json!({}),
    }
}

/// Waits until each of `pods` in `ns` is Running and Ready (60 s at most).
async fn wait_running(client: &Client, ns: &str, pods: &[String]) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = api.list(&ListParams::default()).await?;
        let missing: Vec<&String> = pods
            .iter()
            .filter(|name| {
                !listed
                    .items
                    .iter()
                    .any(|p| p.name_any() == **name && is_ready(p))
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("pods not Running and Ready within 60 s: {missing:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Creates `opts.extra_objects` with `kubectl apply` (any kind, one call).
fn create_extra_objects(cluster: &Cluster, opts: &RunOptions) -> anyhow::Result<()> {
    if opts.extra_objects.is_empty() {
        return Ok(());
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": opts.extra_objects});
    let file = opts.log_dir.join("extra-objects.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&list)?)?;
    cluster
        .kubectl(&[
            "apply",
            "-n",
            &opts.namespace,
            "-f",
            &file.to_string_lossy(),
        ])
        .context("failed to create the extra objects")?;
    Ok(())
}

fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

async fn ready_pods(client: &Client, ns: &str) -> anyhow::Result<i32> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("app=web"))
        .await?;
    Ok(i32::try_from(pods.items.iter().filter(|p| is_ready(p)).count()).unwrap_or(i32::MAX))
}

/// Deletes every report and `ScheduledEvent`, releases every node, and
/// takes forewarn's fault-domain labels off (and the VM reports they came
/// from: each run's agents report again).
async fn reset_objects(client: &Client) -> anyhow::Result<()> {
    let vm_reports: Api<VirtualMachineReport> = Api::all(client.clone());
    vm_reports
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("failed to delete old VirtualMachineReports")?;
    // Reports first: the controller creates an event that has reports.
    let reports: Api<ScheduledEventReport> = Api::all(client.clone());
    reports
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("failed to delete old ScheduledEventReports")?;
    let sevs: Api<ScheduledEvent> = Api::all(client.clone());
    sevs.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("failed to delete old ScheduledEvents")?;
    let nodes: Api<Node> = Api::all(client.clone());
    for n in nodes.list(&ListParams::default()).await? {
        let patch = json!({
            "metadata": {
                "annotations": {CORDONED_FOR_ANNOTATION: null},
                "labels": {FAULT_DOMAIN_LABEL: null, UPDATE_DOMAIN_LABEL: null},
            },
            "spec": {"unschedulable": null, "taints": null},
        });
        nodes
            .patch(
                &n.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    Ok(())
}

/// Plays `opts.scenario` on `cluster` and checks the outcome.
///
/// # Errors
/// When the run cannot be set up (workload, processes); a run that breaks a
/// rule is not an error but a [`Report`] with violations.
pub async fn run_scenario(cluster: &Cluster, opts: &RunOptions) -> anyhow::Result<Report> {
    let scenario = Scenario::load(&opts.scenario.to_string_lossy())?;
    let client = cluster.client().await?;
    std::fs::create_dir_all(&opts.log_dir)?;
    reset(&client, &opts.namespace, !opts.keep_objects).await?;
    deploy_workload(&client, opts).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for node in &opts.precordoned {
        let cordon = json!({"spec": {"unschedulable": true}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&cordon))
            .await
            .with_context(|| format!("failed to cordon {node} as an administrator would"))?;
    }
    for node in &opts.orphaned_holds {
        let held = json!({
            "metadata": {"annotations": {CORDONED_FOR_ANNOTATION: "deleted-by-hand"}},
            "spec": {"unschedulable": true},
        });
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&held))
            .await
            .with_context(|| format!("failed to leave a stale hold on {node}"))?;
    }

    for (node, event) in &opts.prior_holds {
        let current = nodes.get(node).await?;
        let taints = forewarn::controller::act::cordon::taints_for(&current, true)
            .or_else(|| current.spec.as_ref().and_then(|s| s.taints.clone()));
        let held = json!({
            "metadata": {"annotations": {CORDONED_FOR_ANNOTATION: event}},
            "spec": {"unschedulable": true, "taints": taints},
        });
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&held))
            .await
            .with_context(|| {
                format!("failed to hold {node} for {event} as an earlier forewarn would")
            })?;
    }
    create_extra_objects(cluster, opts)?;
    for manifest in &opts.extra_manifests {
        cluster
            .kubectl(&[
                "apply",
                "-n",
                &opts.namespace,
                "-f",
                &manifest.to_string_lossy(),
            ])
            .with_context(|| format!("failed to apply {}", manifest.display()))?;
    }
    if let Some(a) = &opts.acknowledgers {
        wait_running(&client, &opts.namespace, &a.pods).await?;
    }
    let policy_file = opts.log_dir.join("policy.yaml");
    if let Some(policy) = &opts.policy {
        std::fs::write(&policy_file, policy)?;
    }
    let policy_path = policy_file.to_string_lossy().into_owned();
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    // The proxy variables point nowhere and exempt only the API server's
    // address: IMDS (the mock, on 127.0.0.2) must be reached directly, never
    // through a proxy (Azure docs), so the agents must ignore them.
    let mut env = vec![
        ("HTTP_PROXY", "http://127.0.0.1:9"),
        ("HTTPS_PROXY", "http://127.0.0.1:9"),
        ("NO_PROXY", "127.0.0.1,localhost"),
        ("KUBECONFIG", kubeconfig.as_str()),
        ("RUST_LOG", "info,kube=warn,tower=warn,hyper=warn"),
    ];
    if opts.policy.is_some() {
        env.push(("FOREWARN_POLICY_FILE", policy_path.as_str()));
    }
    for (k, v) in &opts.extra_env {
        env.push((k.as_str(), v.as_str()));
    }
    let stem = opts
        .log_dir
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let lease = format!("forewarn-{}-{stem}", std::process::id());
    let vms: Vec<(String, String)> = scenario
        .vms
        .iter()
        .filter_map(|v| Some((v.node.clone()?, v.name.clone())))
        .collect();
    let mut fleet = Fleet::start(FleetOptions {
        credentials: opts.credentials.clone(),
        runners: opts.agent_runners.clone(),
        ..FleetOptions::new(
            &opts.forewarn_bin,
            &env,
            &opts.log_dir,
            &opts.scenario,
            "127.0.0.2:0",
            &lease,
            &vms,
        )
    })
    .await?;
    // A hang bound: every process is ready within seconds of starting.
    fleet.wait_ready(Duration::from_secs(120)).await?;
    if let Some(path) = &opts.prometheus_targets {
        write_prometheus_targets(path, &fleet.metrics_ports())?;
    }

    let http = forewarn::http::client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()?;
    fleet.start_mock(&http).await?;
    let mut tl = Timeline::new(opts.live);
    tl.say(
        "harness",
        format!(
            "{} agents and the controller are ready; scenario started: {}",
            fleet.agents.len(),
            scenario.description.trim()
        ),
    );

    let report = observe(
        cluster, &client, &http, &scenario, opts, &mut tl, &mut fleet,
    )
    .await;
    tl.flush(true);

    let mut metrics = Vec::new();
    for (name, port) in fleet.metrics_ports() {
        let text = match http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => format!("unreachable: {e}"),
        };
        metrics.push((name, text));
    }
    let mut stop_problems = Vec::new();
    // The agents of deleted VMs were killed for good.
    let gone: Vec<String> = report
        .as_ref()
        .map(|r| {
            r.deleted_nodes
                .iter()
                .map(|(_, n)| format!("agent {n}"))
                .collect()
        })
        .unwrap_or_default();
    let procs: Vec<&mut Proc> = fleet
        .all_mut()
        .filter(|p| !gone.contains(&p.name))
        .collect();
    // The chart's terminationGracePeriodSeconds (30 s): the kubelet would
    // SIGKILL a process still running then. A healthy one exits within a
    // second or two of SIGTERM, loaded or not.
    for p in procs.into_iter().rev() {
        match p.terminate(Duration::from_secs(30)).await {
            Ok(s) if s.success() => {}
            Ok(s) => stop_problems.push(format!(
                "{} exited with {s} on SIGTERM (log: {})",
                p.name,
                p.log.display()
            )),
            Err(e) => stop_problems.push(e.to_string()),
        }
    }
    let mut report = report?;
    report.violations.extend(stop_problems);
    report.started = tl.origin;
    report.timeline = tl.lines;
    report.sev_table = cluster
        .kubectl(&["get", "scheduledevents", "-o", "wide"])
        .unwrap_or_else(|e| e.to_string());
    report.log_dir = opts.log_dir.clone();
    report.metrics = metrics;
    Ok(report)
}

/// Writes `ports` (process name, port) as a Prometheus file service
/// discovery file, atomically (a temporary file renamed over it). Each
/// target carries what Kubernetes service discovery would tell
/// prometheus-operator about the pod: its role in `__meta_forewarn_role`
/// (`agent`, `controller`; dropped after relabeling), its `namespace`
/// (`forewarn`) and, for agents, its `node`. The `job` label is left to the
/// scrape configuration, as the chart's monitors set it.
///
/// # Errors
/// When the file cannot be written.
fn write_prometheus_targets(path: &Path, ports: &[(String, u16)]) -> anyhow::Result<()> {
    let groups: Vec<serde_json::Value> = ports
        .iter()
        .map(|(name, port)| {
            let labels = match name.strip_prefix("agent ") {
                Some(node) => json!({
                    "__meta_forewarn_role": "agent",
                    "namespace": "forewarn",
                    "node": node,
                }),
                None => json!({"__meta_forewarn_role": "controller", "namespace": "forewarn"}),
            };
            json!({"targets": [format!("127.0.0.1:{port}")], "labels": labels})
        })
        .collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&groups)?)
        .with_context(|| format!("failed to write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("failed to write {}", path.display()))?;
    Ok(())
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Per-event bookkeeping of the observer.
/// Whether the policy the run gives the controller lets it approve the
/// event `spec` with its drain incomplete at `decided_at`: its
/// `onDeadline` is `Approve` and the drain deadline (`NotBefore` minus
/// `drainMarginSeconds`) had come. From the policy file and the event's
/// `NotBefore`, not from anything the controller says.
fn approved_at_deadline(
    opts: &RunOptions,
    spec: &forewarn::api::ScheduledEventSpec,
    decided_at: DateTime<Utc>,
) -> bool {
    use forewarn::policy::{DeadlineAction, Policy};
    let policy = match &opts.policy {
        Some(text) => match Policy::parse(text, "the run's policy") {
            Ok(p) => p,
            Err(_) => return false,
        },
        None => Policy::default(),
    };
    let handling = policy.handling(
        &spec.event_type.as_str().into(),
        &spec.event_source,
        spec.duration_seconds,
    );
    handling.on_deadline == DeadlineAction::Approve
        && spec
            .not_before
            .is_some_and(|nb| decided_at >= nb - Policy::seconds(policy.drain_margin_seconds))
}

#[derive(Default)]
struct SevSeen {
    spec_status: String,
    phase: String,
    drained: String,
    decided: bool,
    sent: Option<String>,
    drained_nodes: HashSet<String>,
    /// The nodes its status lists.
    nodes: HashSet<String>,
}

/// How long the end of a run waits, once everything else is over, for the
/// controller's Event of each release it made (Events are posted by a
/// queue of their own, after the node writes). A hang bound: they come
/// within a second or so; a run with one missing ends after this with a
/// timeline line saying so (a test that needs the Event then fails on it).
const RELEASE_EVENT_WAIT: Duration = Duration::from_secs(60);

#[allow(clippy::too_many_lines)]
async fn observe(
    cluster: &Cluster,
    client: &Client,
    http: &reqwest::Client,
    scenario: &Scenario,
    opts: &RunOptions,
    tl: &mut Timeline,
    fleet: &mut Fleet,
) -> anyhow::Result<Report> {
    let ns = &opts.namespace;
    let sevs: Api<ScheduledEvent> = Api::all(client.clone());
    let (sev_tx, mut sev_rx) = tokio::sync::mpsc::unbounded_channel();
    let sev_watch = tokio::spawn(async move {
        let stream = watcher(sevs, watcher::Config::default())
            .backoff(forewarn::controller::observe::watch::watch_backoff())
            .applied_objects();
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Ok(sev) = item
                && sev_tx.send((Utc::now(), sev)).is_err()
            {
                break;
            }
        }
    });
    let _abort_watch = AbortOnDrop(sev_watch);
    // Pod deletions and node cordons, from watches: every version, not samples.
    let (pod_tx, mut pod_rx) = tokio::sync::mpsc::unbounded_channel();
    let pods_all: Api<Pod> = Api::all(client.clone());
    let _abort_pods = AbortOnDrop(tokio::spawn(async move {
        let stream = watcher(pods_all, watcher::Config::default())
            .backoff(forewarn::controller::observe::watch::watch_backoff())
            .applied_objects();
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Ok(p) = item
                && p.metadata.deletion_timestamp.is_some()
                && pod_tx.send((Utc::now(), p)).is_err()
            {
                break;
            }
        }
    }));
    let (node_tx, mut node_rx) = tokio::sync::mpsc::unbounded_channel();
    let nodes_all: Api<Node> = Api::all(client.clone());
    let _abort_nodes = AbortOnDrop(tokio::spawn(async move {
        let stream = watcher(nodes_all, watcher::Config::default())
            .backoff(forewarn::controller::observe::watch::watch_backoff())
            .applied_objects();
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Ok(n) = item
                && node_tx
                    .send((Utc::now(), n.name_any(), is_cordoned(&n)))
                    .is_err()
            {
                break;
            }
        }
    }));
    // The workload namespace's pods, every version: the notices forewarn
    // writes on them, as the kubelet would project them.
    let (notice_tx, mut notice_rx) = tokio::sync::mpsc::unbounded_channel();
    let pods_ns: Api<Pod> = Api::namespaced(client.clone(), ns);
    let _abort_notices = AbortOnDrop(tokio::spawn(async move {
        let stream = watcher(pods_ns, watcher::Config::default())
            .backoff(forewarn::controller::observe::watch::watch_backoff())
            .applied_objects();
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Ok(p) = item
                && notice_tx.send((Utc::now(), p)).is_err()
            {
                break;
            }
        }
    }));
    let mut acks_due: Vec<(Instant, Pod, String, String)> = Vec::new();
    let mut settling = false;
    let mut settle_since: Option<Instant> = None;
    // ScheduledEvents the controller posted a cordon Event about, and those
    // it posted a release Event about (this run's Events).
    let mut cordon_events: HashSet<String> = HashSet::new();
    let mut release_events: HashSet<String> = HashSet::new();
    let mut deleted: HashSet<String> = HashSet::new();
    let mut unschedulable: HashMap<String, bool> = HashMap::new();
    let mut timed: Vec<(Duration, Vec<String>)> = opts.timed_kubectl.clone();
    let started_at = Instant::now();
    let nodes_api: Api<Node> = Api::all(client.clone());
    let events_api: Api<KubeEvent> = Api::all(client.clone());
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let vm_node: HashMap<String, String> = scenario
        .vms
        .iter()
        .filter_map(|v| Some((v.name.to_ascii_lowercase(), v.node.clone()?)))
        .collect();
    let affected = |id: &str| -> Vec<String> {
        scenario
            .events
            .iter()
            .find(|e| e.id.eq_ignore_ascii_case(id))
            .map(|e| {
                e.resources
                    .iter()
                    .filter_map(|r| vm_node.get(&r.to_ascii_lowercase()).cloned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let initial_uids: HashMap<String, HashSet<String>> = {
        let mut m: HashMap<String, HashSet<String>> = HashMap::new();
        for p in pods_api.list(&ListParams::default()).await? {
            if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                m.entry(node)
                    .or_default()
                    .insert(p.uid().unwrap_or_default());
            }
        }
        m
    };

    let mut report = Report {
        min_ready: i32::MAX,
        min_available: opts.min_available,
        ..Default::default()
    };
    let mut seen_log = 0usize;
    let mut seen_events: HashSet<String> = HashSet::new();
    let mut sev_state: BTreeMap<String, SevSeen> = BTreeMap::new();
    let mut cordoned_now: HashSet<String> = HashSet::new();
    let mut cordoned_ever: HashSet<String> = HashSet::new();
    // Pods deleted with grace 0 while bound to a node, with their creation
    // time (judged at the end).
    let mut force_deletes: Vec<(PodDeletion, Option<DateTime<Utc>>)> = Vec::new();
    let mut left_nodes: HashSet<String> = HashSet::new();
    let mut mock_phase: HashMap<String, String> = HashMap::new();
    let mut killed = false;
    let mut deleted_node: Option<Node> = None;
    let mut timed_policy = opts.timed_policy.clone();
    let mut agent_down = false;
    let mut agent_back = false;
    let mut outage_started = false;
    let deadline = Instant::now() + opts.timeout;

    loop {
        if let Some(outage) = opts.api_server_outage.as_ref().filter(|_| !outage_started)
            && drain_in_progress(&pods_api, &outage.when_last_terminating).await?
        {
            outage_started = true;
            report.api_server_outage =
                Some(api_server_outage(cluster, outage, fleet, tl, &mut report).await?);
        }

        // IMDS side, from the mock's own log.
        let log = fleet.mock_log(http).await.unwrap_or_default();
        for entry in log.iter().skip(seen_log) {
            let id = short(&entry.event_id);
            let ev = scenario.events.iter().find(|e| e.id == entry.event_id);
            let ty = ev.map(|e| e.event_type.as_str()).unwrap_or("?");
            match entry.what.as_str() {
                "Approved" => {
                    let vm = entry.vm.clone().unwrap_or_default();
                    tl.at(
                        entry.time,
                        "imds",
                        format!("{ty} {id} approved (StartRequests POST via {vm})"),
                    );
                    let expect_drained = ev
                        .and_then(|e| e.expect.as_ref())
                        .is_some_and(|x| x.drained == Some(true));
                    if expect_drained {
                        for node in affected(&entry.event_id) {
                            // Pods there at the approval: this pass may read
                            // the mock's log late, after the event ended and
                            // the node was released, when new pods may have
                            // come (created after the approval; whole
                            // seconds, so one of the approval's own second
                            // still counts). One whose containers have all
                            // exited is gone, for the drain as for the
                            // kubelet.
                            let on_node = pods_api
                                .list(
                                    &ListParams::default().fields(&format!("spec.nodeName={node}")),
                                )
                                .await?
                                .items
                                .iter()
                                .filter(|p| {
                                    p.metadata
                                        .creation_timestamp
                                        .as_ref()
                                        .is_none_or(|t| chrono_time(&t.0) <= entry.time)
                                })
                                .filter(|p| {
                                    !p.status.as_ref().is_some_and(|s| {
                                        matches!(s.phase.as_deref(), Some("Succeeded" | "Failed"))
                                    })
                                })
                                .count();
                            if on_node > 0 {
                                report.violations.push(format!(
                                    "rule 2: {ty} {id} was approved while {node} still had {on_node} workload pods"
                                ));
                            }
                        }
                    }
                    report.approvals.push(entry.clone());
                }
                phase => {
                    mock_phase.insert(entry.event_id.clone(), phase.to_string());
                    let extra = match phase {
                        "Scheduled" => ev
                            .map(|e| format!(" (notice {:?})", e.notice))
                            .unwrap_or_default(),
                        _ => String::new(),
                    };
                    let what = match phase {
                        "Finished" => "finished: gone from IMDS".to_string(),
                        "Cancelled" => "cancelled: gone from IMDS without starting".to_string(),
                        other => other.to_string(),
                    };
                    tl.at(entry.time, "imds", format!("{ty} {id} {what}{extra}"));
                }
            }
        }
        seen_log = log.len();
        if log.len() >= report.imds_log.len() {
            report.imds_log = log;
        }

        // forewarn's objects, as the watch delivered them, with the time each
        // version arrived (a poll would blur the order of fast steps).
        while let Ok((seen_at, sev)) = sev_rx.try_recv() {
            let name = sev.name_any();
            let st = sev_state.entry(name.clone()).or_default();
            let id = short(&name).to_string();
            if sev.spec.event_status.as_str() != st.spec_status {
                if st.spec_status.is_empty() {
                    tl.at(
                        seen_at,
                        "controller",
                        format!(
                            "{} {id}: ScheduledEvent/{name} created from the agents' reports ({})",
                            sev.spec.event_type, sev.spec.event_status
                        ),
                    );
                } else {
                    tl.at(
                        seen_at,
                        "controller",
                        format!(
                            "{} {id} Azure status {} -> {} (as the named VMs' agents report it)",
                            sev.spec.event_type, st.spec_status, sev.spec.event_status
                        ),
                    );
                }
                st.spec_status = sev.spec.event_status.to_string();
            }
            let status = sev.status.clone().unwrap_or_default();
            let phase = status.phase.map(|p| p.to_string()).unwrap_or_default();
            if phase != st.phase && !phase.is_empty() {
                tl.at(
                    seen_at,
                    "controller",
                    format!(
                        "{} {id} phase {}{}",
                        sev.spec.event_type,
                        if st.phase.is_empty() {
                            String::new()
                        } else {
                            format!("{} -> ", st.phase)
                        },
                        phase
                    ),
                );
                st.phase = phase;
            }
            let drained = status.nodes_drained.clone().unwrap_or_default();
            if drained != st.drained && !drained.is_empty() {
                st.drained = drained;
            }
            let approval = status.approval.clone().unwrap_or_default();
            st.nodes
                .extend(status.nodes.iter().flatten().map(|n| n.name.clone()));
            for n in status.nodes.iter().flatten() {
                if let Some(at) = n.drained_at
                    && st.drained_nodes.insert(n.name.clone())
                    && status
                        .action
                        .is_some_and(|a| a.as_str().starts_with("Drain"))
                {
                    tl.at(
                        at,
                        "controller",
                        format!("{} drained ({} {id})", n.name, sev.spec.event_type),
                    );
                }
            }
            if let Some(decided_at) = approval.decided_at.filter(|_| !st.decided) {
                st.decided = true;
                tl.at(
                    decided_at,
                    "controller",
                    format!(
                        "{} {id} approval decided: {}",
                        sev.spec.event_type,
                        approval.reason.clone().unwrap_or_default()
                    ),
                );
                let undrained: Vec<String> = status
                    .nodes
                    .iter()
                    .flatten()
                    .filter(|n| n.drained_at.is_none_or(|d| Some(d) > approval.decided_at))
                    .map(|n| n.name.clone())
                    .collect();
                let needs_drain = status.action == Some(forewarn::policy::Action::DrainAndApprove);
                if needs_drain
                    && !undrained.is_empty()
                    && !approved_at_deadline(opts, &sev.spec, decided_at)
                {
                    report.violations.push(format!(
                        "rule 2: {id} approval decided before {} drained",
                        undrained.join(", ")
                    ));
                }
            }
            if let (Some(by), Some(result)) = (&approval.sent_by, &approval.result) {
                let sent = format!("{by}: {result}");
                if st.sent.as_deref() != Some(sent.as_str()) {
                    tl.at(
                        approval.sent_at.unwrap_or_else(Utc::now),
                        "agent",
                        format!(
                            "{} {id} approval sent to IMDS by the agent on {by} ({result})",
                            sev.spec.event_type
                        ),
                    );
                    st.sent = Some(sent);
                }
            }
        }

        // The notices on the workload's pods, and the containers the
        // harness plays.
        while let Ok((seen_at, pod)) = notice_rx.try_recv() {
            watch_notices(seen_at, &pod, opts, tl, &mut report, &mut acks_due);
        }
        let now = Instant::now();
        let due: Vec<(Instant, Pod, String, String)> = acks_due
            .iter()
            .filter(|(at, ..)| *at <= now)
            .cloned()
            .collect();
        acks_due.retain(|(at, ..)| *at > now);
        for (_, pod, event, event_id) in due {
            match acknowledge(cluster, opts, &pod, &event, &event_id).await {
                Ok((sent, at)) => {
                    tl.at(
                        at,
                        "workload",
                        format!(
                            "{}/{} acknowledged {} (ack.forewarn.dev/{event}, written with its ServiceAccount's token)",
                            ns,
                            pod.name_any(),
                            short(&event_id)
                        ),
                    );
                    report.acks.push(AckWritten {
                        pod: format!("{ns}/{}", pod.name_any()),
                        event,
                        event_id,
                        sent,
                        at,
                    });
                }
                Err(e) => report.violations.push(format!(
                    "harness: {}/{} could not acknowledge {event}: {e:#}",
                    ns,
                    pod.name_any()
                )),
            }
        }

        // The controller's Kubernetes Events.
        let fresh: Vec<KubeEvent> = events_api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.reporting_controller.as_deref() == Some(CONTROLLER_MANAGER))
            .filter(|e| {
                e.regarding
                    .as_ref()
                    .is_some_and(|r| r.kind.as_deref() == Some("ScheduledEvent"))
            })
            // Events of earlier runs on the same cluster are not this run's.
            .filter(|e| {
                e.event_time
                    .as_ref()
                    .is_some_and(|t| chrono_time(&t.0) >= tl.origin)
            })
            .filter(|e| seen_events.insert(e.name_any()))
            .collect();
        for e in fresh {
            let reason = e.reason.clone().unwrap_or_default();
            let about = e
                .regarding
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_default();
            match reason.as_str() {
                "Cordoned" | "CordonShared" => {
                    cordon_events.insert(about);
                }
                "Uncordoned" | "CordonReleased" => {
                    release_events.insert(about);
                }
                _ => {}
            }
            // Drained and ApprovalDecided come from the status timestamps above.
            if matches!(
                reason.as_str(),
                "Cordoned"
                    | "CordonShared"
                    | "Evicted"
                    | "EvictionBlocked"
                    | "Uncordoned"
                    | "CordonReleased"
                    | "DrainIncomplete"
                    | "AwaitingAcknowledgement"
                    | "Acknowledged"
                    | "AcknowledgementTimedOut"
            ) {
                let when = e
                    .event_time
                    .as_ref()
                    .map_or_else(Utc::now, |t| chrono_time(&t.0));
                tl.at(
                    when,
                    "controller",
                    format!("{reason}: {}", e.note.clone().unwrap_or_default()),
                );
            }
        }

        // Nodes, from the API server.
        let nodes = nodes_api.list(&ListParams::default()).await?;
        // A deleted node is no longer cordoned by anyone.
        cordoned_now.retain(|c| nodes.iter().any(|n| n.name_any() == *c));
        for n in &nodes {
            let name = n.name_any();
            let cordoned = is_cordoned(n);
            if cordoned && cordoned_now.insert(name.clone()) {
                cordoned_ever.insert(name);
            } else if !cordoned && cordoned_now.remove(&name) {
                left_nodes.insert(name);
            }
        }

        // A controller killed while the event runs: its successor must release
        // the node from what is stored in the API server (rule 4's record).
        let started = sev_state.values().any(|s| s.spec_status == "Started");
        if opts.kill_controller_on_start && !killed && started {
            killed = true;
            fleet.restart_controller().await?;
            tl.say(
                "harness",
                "controller killed (SIGKILL) mid-drain; a new one started, it waits for the Lease",
            );
        }

        if let Some(node) = &opts.agent_down_across_finish {
            let over = scenario.events.iter().all(|e| {
                matches!(
                    mock_phase.get(&e.id).map(String::as_str),
                    Some("Finished" | "Cancelled")
                )
            });
            if started && !agent_down {
                agent_down = true;
                fleet.kill_agent(node).await;
                tl.say(
                    "harness",
                    format!("agent on {node} killed (SIGKILL) while the event runs"),
                );
            } else if agent_down && !agent_back && over {
                agent_back = true;
                fleet.start_agent(node).await?;
                tl.say(
                    "harness",
                    format!("agent on {node} started again, after the event left IMDS"),
                );
            }
        }

        if let Some((when, node)) = &opts.delete_node {
            let due = match when {
                NodeDeletion::WhenStarted => started,
                NodeDeletion::After(d) => started_at.elapsed() >= *d,
            };
            if due && deleted_node.is_none() {
                fleet.kill_agent(node).await;
                deleted_node = Some(nodes_api.get(node).await?);
                nodes_api
                    .delete(node, &DeleteParams::default())
                    .await
                    .with_context(|| format!("failed to delete node {node}"))?;
                report.deleted_nodes.push((Utc::now(), node.clone()));
                tl.say(
                    "harness",
                    format!("the VM of {node} is deleted: its agent killed (SIGKILL) for good, its Node object deleted"),
                );
            }
        }
        let elapsed_now = started_at.elapsed();
        for (_, text) in timed_policy.iter().filter(|(at, _)| *at <= elapsed_now) {
            std::fs::write(opts.log_dir.join("policy.yaml"), text)?;
            tl.say(
                "harness",
                format!("policy file rewritten: {}", text.trim().replace('\n', "; ")),
            );
        }
        timed_policy.retain(|(at, _)| *at > elapsed_now);

        while let Ok((seen_at, p)) = pod_rx.try_recv() {
            if p.namespace().as_deref() == Some("kube-system")
                || !deleted.insert(p.uid().unwrap_or_default())
            {
                continue;
            }
            let d = PodDeletion {
                pod: format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
                node: p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
                grace_seconds: p.metadata.deletion_grace_period_seconds,
                deletion_timestamp: p
                    .metadata
                    .deletion_timestamp
                    .as_ref()
                    .map_or(seen_at, |t| chrono_time(&t.0)),
                seen_at,
            };
            let uid = p.uid().unwrap_or_default();
            if report.notices.iter().any(|n| n.uid == uid) {
                tl.at(
                    seen_at,
                    "workload",
                    format!(
                        "{} (which held a notice) is being deleted: grace {}s",
                        d.pod,
                        d.grace_seconds.unwrap_or_default()
                    ),
                );
            }
            // A pod bound to no node (Pending) is deleted at once by the API
            // server whatever grace was asked, with grace 0: nothing ran
            // there to be cut short, so that is not a force delete (seen
            // when a StatefulSet's replacement pod, Pending on its cordoned
            // node, was removed with its namespace at the end of a run).
            // Judged at the end, on the nodes forewarn cordoned (see there).
            if opts.forbid_force_delete && d.grace_seconds.unwrap_or(0) <= 0 && !d.node.is_empty() {
                let created = p
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| chrono_time(&t.0));
                force_deletes.push((d.clone(), created));
            }
            report.deletions.push(d);
        }
        while let Ok((seen_at, node, cordoned)) = node_rx.try_recv() {
            if unschedulable.insert(node.clone(), cordoned) != Some(cordoned) {
                report.node_changes.push((seen_at, node, cordoned));
            }
        }
        let elapsed = started_at.elapsed();
        for (_, args) in timed.iter().filter(|(at, _)| *at <= elapsed) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match cluster.kubectl(&args) {
                Ok(out) => tl.say(
                    "harness",
                    format!("kubectl {}: {}", args.join(" "), out.trim()),
                ),
                Err(e) => report
                    .violations
                    .push(format!("kubectl {} failed: {e:#}", args.join(" "))),
            }
        }
        timed.retain(|(at, _)| *at > elapsed);

        // The workload, against its PodDisruptionBudget (rule 6).
        let ready = ready_pods(client, ns).await?;
        if ready < report.min_ready {
            report.min_ready = ready;
        }
        if ready < opts.min_available {
            report.violations.push(format!(
                "rule 6: only {ready} ready pods, below the PodDisruptionBudget's minAvailable {}",
                opts.min_available
            ));
        }

        if outage_started {
            restart_exited_controller(fleet, tl, &mut report).await?;
        }
        let down = opts
            .agent_down_across_finish
            .as_ref()
            .filter(|_| agent_down && !agent_back)
            .map(|n| format!("agent {n}"));
        let dead: Vec<String> = report
            .deleted_nodes
            .iter()
            .map(|(_, n)| format!("agent {n}"))
            .collect();
        for p in fleet.all_mut() {
            if down.as_deref() == Some(p.name.as_str()) || dead.contains(&p.name) {
                continue;
            }
            if let Some(status) = p.exited() {
                report.violations.push(format!(
                    "{} exited unexpectedly ({status}); log: {}",
                    p.name,
                    p.log.display()
                ));
                bail!(
                    "{} exited unexpectedly ({status})\n--- last log lines ---\n{}",
                    p.name,
                    p.log_tail(30)
                );
            }
        }

        let events_over = scenario.events.iter().all(|e| {
            matches!(
                mock_phase.get(&e.id).map(String::as_str),
                Some("Finished" | "Cancelled")
            )
        });
        let sevs_over = !sev_state.is_empty()
            && sev_state
                .values()
                .all(|s| matches!(s.phase.as_str(), "Completed" | "Cancelled" | "Ignored"));
        let nodes_released = cordoned_now.iter().all(|n| opts.precordoned.contains(n))
            && nodes.iter().all(|n| holds(n).is_empty());
        let sevs_deleted = !opts.until_deleted
            || Api::<ScheduledEvent>::all(client.clone())
                .list_metadata(&ListParams::default())
                .await?
                .items
                .is_empty();
        if events_over && sevs_over && nodes_released && sevs_deleted {
            // The Events that mark the last steps are posted just after the
            // writes this pass saw: wait for the release Event of each
            // ScheduledEvent that cordoned a node seen released (the
            // observable fact, however late the queue posts it)...
            let unreleased: Vec<&String> = cordon_events
                .iter()
                .filter(|name| !release_events.contains(*name))
                .filter(|name| {
                    sev_state
                        .get(*name)
                        .is_some_and(|st| st.nodes.iter().any(|n| left_nodes.contains(n)))
                })
                .collect();
            let since = *settle_since.get_or_insert_with(Instant::now);
            if !unreleased.is_empty() {
                if since.elapsed() < RELEASE_EVENT_WAIT {
                    tl.flush(false);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                tl.say(
                    "harness",
                    format!(
                        "no Uncordoned or CordonReleased Event about {unreleased:?} within {RELEASE_EVENT_WAIT:?} of the end"
                    ),
                );
                cordon_events.clear();
            }
            // ...then one more pass after a moment, for any other Event of
            // the last pass (nothing waits on it).
            if settling {
                report.finished = true;
                break;
            }
            settling = true;
            tokio::time::sleep(Duration::from_millis(1000)).await;
            continue;
        }
        settling = false;
        settle_since = None;
        if Instant::now() > deadline {
            report.violations.push(format!(
                "time bound of {:?} reached: events over {events_over}, ScheduledEvents final {sevs_over}, nodes released {nodes_released}, ScheduledEvents deleted (if asked) {sevs_deleted}",
                opts.timeout
            ));
            break;
        }
        tl.flush(false);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    report.elapsed = tl.elapsed();
    if let Some(node) = deleted_node {
        restore_node(&nodes_api, node, &mut report).await;
    }
    for n in &left_nodes {
        tl.say("check", format!("{n} is schedulable again"));
    }
    for n in &opts.orphaned_holds {
        let node = nodes_api.get(n).await?;
        let held = is_cordoned(&node) || !holds(&node).is_empty();
        if held {
            report.violations.push(format!(
                "{n} is still cordoned for a ScheduledEvent that no longer exists"
            ));
        } else {
            tl.say(
                "check",
                format!("{n}'s hold for a deleted ScheduledEvent was released"),
            );
        }
    }
    for n in &opts.precordoned {
        if cordoned_now.contains(n) {
            tl.say(
                "check",
                format!("{n} stays cordoned, as its administrator left it"),
            );
        } else {
            report.violations.push(format!(
                "rule 4: {n} was cordoned by an administrator and forewarn uncordoned it"
            ));
        }
    }

    // Expectations written in the scenario.
    for ev in &scenario.events {
        let Some(x) = &ev.expect else { continue };
        let id = short(&ev.id);
        let name = forewarn::imds::model::object_name(&ev.id);
        let phase = sev_state
            .get(&name)
            .map(|s| s.phase.clone())
            .unwrap_or_default();
        if phase != x.phase {
            report.violations.push(format!(
                "{} {id}: final phase {phase:?}, expected {:?}",
                ev.event_type, x.phase
            ));
        }
        let approvals: Vec<&LogEntry> = report
            .approvals
            .iter()
            .filter(|a| a.event_id == ev.id)
            .collect();
        match x.approved {
            Some(true) if approvals.is_empty() => report
                .violations
                .push(format!("{} {id}: no approval reached IMDS", ev.event_type)),
            Some(false) if !approvals.is_empty() => report
                .violations
                .push(format!("{} {id}: approved, but must not be", ev.event_type)),
            _ => {}
        }
        if !x.approved_by.is_empty() {
            for a in &approvals {
                let vm = a.vm.clone().unwrap_or_default();
                if !x.approved_by.iter().any(|v| v.eq_ignore_ascii_case(&vm)) {
                    report.violations.push(format!(
                        "{} {id}: approved through {vm}, only {:?} may",
                        ev.event_type, x.approved_by
                    ));
                }
            }
        }
        for node in affected(&ev.id) {
            let was_cordoned = cordoned_ever.contains(&node);
            // Evicted pods may still be terminating (their grace period).
            let remaining: HashSet<String> = pods_api
                .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
                .await?
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter_map(|p| p.uid())
                .collect();
            let original = initial_uids.get(&node).cloned().unwrap_or_default();
            if x.drained == Some(true) {
                if !was_cordoned {
                    report
                        .violations
                        .push(format!("{} {id}: {node} was never cordoned", ev.event_type));
                }
                if let Some(left) = original.intersection(&remaining).next() {
                    report.violations.push(format!(
                        "{} {id}: pod {left} was never evicted from {node}",
                        ev.event_type
                    ));
                }
            } else if x.drained == Some(false) {
                if was_cordoned {
                    report.violations.push(format!(
                        "{} {id}: {node} was cordoned, but must be left alone",
                        ev.event_type
                    ));
                }
                if original != remaining {
                    report.violations.push(format!(
                        "{} {id}: pods on {node} were disturbed, but must be left alone",
                        ev.event_type
                    ));
                }
            }
        }
    }
    // A force delete counts on a node that was cordoned during the run (or
    // before it): forewarn evicts only there. Elsewhere a grace of 0 is
    // the cluster's own churn, not the product's, and so is the deletion of
    // a pod created once the node was uncordoned again (forewarn evicts
    // only pods that were there while it held the node). That churn:
    // KWOK finishes a graceful deletion by deleting the pod *by name* with
    // grace 0, at times twice (the audit log shows the second get a 404 a
    // few ms later); a StatefulSet's replacement pod, which takes the same
    // name, created in between is force-deleted by KWOK moments after its
    // creation (seen once under load, on a node no event affected).
    for (d, created) in force_deletes {
        let held = cordoned_ever.contains(&d.node) || opts.precordoned.contains(&d.node);
        if held && !created_after_release(&d, created, &report.node_changes) {
            report.violations.push(format!(
                "pod {} on {} was deleted with grace {:?}: a force delete",
                d.pod, d.node, d.grace_seconds
            ));
        } else {
            tl.at(
                d.seen_at,
                "harness",
                format!(
                    "pod {} on {} (no drain there, or created after its release) was deleted with grace {:?}; not forewarn's",
                    d.pod, d.node, d.grace_seconds
                ),
            );
        }
    }
    report.cordoned = cordoned_ever.into_iter().collect();
    report.cordoned.sort();
    Ok(report)
}

/// Whether the pod of a grace-0 deletion `d`, created at `created` (whole
/// seconds, from its `creationTimestamp`), came after its node was last
/// released: the node's state as last seen before the deletion (in
/// `node_changes`, `(seen, node, cordoned)` in the order seen) is
/// uncordoned after a cordon, and the pod was created no earlier than a
/// second before that. forewarn evicts only pods that were on the node
/// while it held it.
fn created_after_release(
    d: &PodDeletion,
    created: Option<DateTime<Utc>>,
    node_changes: &[(DateTime<Utc>, String, bool)],
) -> bool {
    let changes: Vec<&(DateTime<Utc>, String, bool)> = node_changes
        .iter()
        .filter(|(at, n, _)| *n == d.node && *at <= d.seen_at)
        .collect();
    let released_at = match changes.split_last() {
        Some(((at, _, false), before)) if before.iter().any(|(_, _, c)| *c) => Some(*at),
        _ => None,
    };
    released_at
        .zip(created)
        .is_some_and(|(u, c)| c >= u - chrono::TimeDelta::seconds(1))
}

/// Records the notices on one version of a pod of the workload's
/// namespace (new ones, changes of phase, removals) and, for a pod the
/// harness plays, schedules its acknowledgement of each new notice.
fn watch_notices(
    seen_at: DateTime<Utc>,
    pod: &Pod,
    opts: &RunOptions,
    tl: &mut Timeline,
    report: &mut Report,
    acks_due: &mut Vec<(Instant, Pod, String, String)>,
) {
    use forewarn::controller::observe::participants::{NOTICE_PREFIX, field};
    let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
    let uid = pod.uid().unwrap_or_default();
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let notices: BTreeMap<String, String> = pod
        .annotations()
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(NOTICE_PREFIX)?.to_string(), v.clone())))
        .collect();
    for (event, value) in &notices {
        let known = report
            .notices
            .iter_mut()
            .find(|n| n.uid == uid && n.event == *event && n.removed_at.is_none());
        match known {
            Some(n) => {
                if n.last_value != *value {
                    let phase = |v: &str| field(v, "phase").unwrap_or_default().to_string();
                    if phase(&n.last_value) != phase(value) {
                        tl.at(
                            seen_at,
                            "workload",
                            format!("{key}'s notice of {}: phase {}", short(event), phase(value)),
                        );
                    }
                    n.last_value = value.clone();
                }
            }
            None => {
                let managers = managers_of(pod, &format!("{NOTICE_PREFIX}{event}"));
                let played = opts
                    .acknowledgers
                    .as_ref()
                    .filter(|a| a.pods.contains(&pod.name_any()));
                tl.at(
                    seen_at,
                    "workload",
                    format!(
                        "{key} ({node}) holds a notice{}: {value}",
                        if played.is_some() {
                            "; its container reads it from its downward-API file (played by the harness)"
                        } else {
                            ""
                        }
                    ),
                );
                if let Some(a) = played.filter(|a| !a.silent.contains(&pod.name_any())) {
                    let id = field(value, "eventId").unwrap_or_default().to_string();
                    acks_due.push((Instant::now() + a.prepare, pod.clone(), event.clone(), id));
                }
                report.notices.push(NoticeSeen {
                    pod: key.clone(),
                    uid: uid.clone(),
                    node: node.clone(),
                    event: event.clone(),
                    first_value: value.clone(),
                    last_value: value.clone(),
                    first_seen: seen_at,
                    removed_at: None,
                    managers,
                });
            }
        }
    }
    for n in report
        .notices
        .iter_mut()
        .filter(|n| n.uid == uid && n.removed_at.is_none() && !notices.contains_key(&n.event))
    {
        n.removed_at = Some(seen_at);
        tl.at(
            seen_at,
            "workload",
            format!("{key}'s notice of {} removed", short(&n.event)),
        );
    }
}

/// The field managers (`manager operation`) owning the annotation `key`
/// of `pod`.
fn managers_of(pod: &Pod, key: &str) -> Vec<String> {
    pod.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1.as_ref().is_some_and(|f| {
                f.0.get("f:metadata")
                    .and_then(|m| m.get("f:annotations"))
                    .and_then(|a| a.get(format!("f:{key}")))
                    .is_some()
            })
        })
        .map(|m| {
            format!(
                "{} {}",
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default()
            )
        })
        .collect()
}

/// Writes `ack.forewarn.dev/<event>: <event_id>` on `pod` as its container
/// would: a merge patch of that key, with a TokenRequest token of the
/// pod's ServiceAccount bound to the pod. Returns when the PATCH was sent
/// and when the API server's answer was read.
async fn acknowledge(
    cluster: &Cluster,
    opts: &RunOptions,
    pod: &Pod,
    event: &str,
    event_id: &str,
) -> anyhow::Result<(DateTime<Utc>, DateTime<Utc>)> {
    let sa = opts
        .acknowledgers
        .as_ref()
        .map(|a| a.service_account.clone())
        .unwrap_or_default();
    let (name, uid) = (pod.name_any(), pod.uid().unwrap_or_default());
    // A TokenRequest bound to the pod (as `kubectl create token
    // --bound-object-kind Pod`), through the API rather than a kubectl
    // process that would hold up the harness's loop.
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [],
                "expirationSeconds": 600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
            },
        }))?;
    let token = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
        cluster.client().await?,
        &opts.namespace,
    )
    .create_token_request(&sa, &PostParams::default(), &request)
    .await
    .with_context(|| format!("TokenRequest of {}/{sa}", opts.namespace))?
    .status
    .and_then(|s| s.token)
    .context("the TokenRequest came back without a token")?;
    let client = cluster.client_with_token(&token).await?;
    let body = json!({"metadata": {"annotations": {
        forewarn::controller::observe::participants::ack_key(event): event_id,
    }}});
    let params = PatchParams {
        field_manager: Some("workload".into()),
        ..PatchParams::default()
    };
    let sent = Utc::now();
    Api::<Pod>::namespaced(client, &opts.namespace)
        .patch(&name, &params, &Patch::Merge(&body))
        .await?;
    Ok((sent, Utc::now()))
}

/// Whether the pod `name` is terminating and is the last pod of its
/// namespace on its node.
async fn drain_in_progress(pods: &Api<Pod>, name: &str) -> anyhow::Result<bool> {
    let Some(pod) = pods.get_opt(name).await? else {
        return Ok(false);
    };
    if pod.metadata.deletion_timestamp.is_none() {
        return Ok(false);
    }
    let node = pod
        .spec
        .and_then(|s| s.node_name)
        .with_context(|| format!("pod {name} is on no node"))?;
    let others = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?
        .items
        .iter()
        .filter(|p| p.name_any() != name)
        .count();
    Ok(others == 0)
}

/// Starts the controller again if it exited, as its kubelet would.
async fn restart_exited_controller(
    fleet: &mut Fleet,
    tl: &mut Timeline,
    report: &mut Report,
) -> anyhow::Result<()> {
    if let Some(status) = fleet.controller.exited() {
        fleet.restart_controller_container().await?;
        tl.say(
            "harness",
            format!("controller exited ({status}); its container started again (same Lease identity), as its kubelet would"),
        );
        report
            .restarts
            .push((Utc::now(), format!("controller exited ({status})")));
    }
    Ok(())
}

/// Stops kube-apiserver for `outage.duration`, starts it again and waits
/// until it is ready, then runs `outage.then_kubectl`; restarts the
/// controller meanwhile if it exits. Returns when it stopped and when it
/// was ready again.
async fn api_server_outage(
    cluster: &Cluster,
    outage: &ApiServerOutage,
    fleet: &mut Fleet,
    tl: &mut Timeline,
    report: &mut Report,
) -> anyhow::Result<(DateTime<Utc>, DateTime<Utc>)> {
    let c = cluster.clone();
    let stopped = tokio::task::spawn_blocking(move || c.stop_api_server()).await??;
    let down = Utc::now();
    let started_at = Instant::now();
    tl.say(
        "harness",
        format!(
            "kube-apiserver stopped (SIGTERM{}; its port closes every connection) for {:?}, mid-drain",
            if stopped.killed { ", then SIGKILL" } else { "" },
            outage.duration
        ),
    );
    while started_at.elapsed() < outage.duration {
        restart_exited_controller(fleet, tl, report).await?;
        tl.flush(false);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let c = cluster.clone();
    let restarted = tokio::task::spawn_blocking(move || c.start_api_server(stopped)).await??;
    let back = Utc::now();
    tl.say(
        "harness",
        format!(
            "kube-apiserver started again; ready (/readyz) {:.1} s after it stopped",
            (back - down).as_seconds_f64()
        ),
    );
    for name in restarted {
        tl.say(
            "harness",
            format!("{name} had exited during the outage (its leader Lease lost); started again"),
        );
        report
            .restarts
            .push((Utc::now(), format!("{name} exited during the outage")));
    }
    for args in &outage.then_kubectl {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = cluster
            .kubectl(&args)
            .with_context(|| format!("kubectl {} after the outage", args.join(" ")))?;
        tl.say(
            "harness",
            format!("kubectl {}: {}", args.join(" "), out.trim()),
        );
    }
    Ok((down, back))
}

/// Creates a deleted node again, without forewarn's marks, and waits until
/// it is Ready, so that the next test on the cluster has all its nodes.
async fn restore_node(nodes_api: &Api<Node>, node: Node, report: &mut Report) {
    let name = node.name_any();
    let mut annotations = node.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(CORDONED_FOR_ANNOTATION);
    let fresh = Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            labels: node.metadata.labels.clone(),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: node
            .spec
            .clone()
            .map(|s| k8s_openapi::api::core::v1::NodeSpec {
                unschedulable: None,
                taints: None,
                ..s
            }),
        status: None,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // The old object may still be going (finalizers are rare on nodes).
        match nodes_api.create(&PostParams::default(), &fresh).await {
            Ok(_) => break,
            Err(e) if Instant::now() > deadline => {
                report
                    .violations
                    .push(format!("harness: could not create node {name} again: {e}"));
                return;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    loop {
        let ready = nodes_api
            .get_opt(&name)
            .await
            .ok()
            .flatten()
            .is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
        if ready {
            return;
        }
        if Instant::now() > deadline {
            report.violations.push(format!(
                "harness: node {name} created again is not Ready within 30 s"
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Renders the report's ending: the table and the verdict.
pub fn summary(report: &Report) -> String {
    let mut s = String::new();
    s.push_str("\n$ kubectl get scheduledevents -o wide\n");
    s.push_str(&report.sev_table);
    s.push_str(&format!(
        "\nfewest ready replicas during the run: {} (PodDisruptionBudget minAvailable {})\n",
        report.min_ready, report.min_available
    ));
    if report.ok() {
        s.push_str(&format!("PASS: scenario completed in {:.1}s; no PodDisruptionBudget violated, approvals only after drains, every node released\n", report.elapsed));
    } else {
        s.push_str("FAIL:\n");
        for v in &report.violations {
            s.push_str(&format!("  - {v}\n"));
        }
        s.push_str(&format!("logs: {}\n", report.log_dir.display()));
    }
    s
}

/// Path of the `forewarn` binary next to the running executable
/// (`target/<profile>/forewarn` for `target/<profile>/examples/demo`).
pub fn sibling_forewarn_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let dir: &Path = if dir.ends_with("examples") || dir.ends_with("deps") {
        dir.parent()?
    } else {
        dir
    };
    let bin = dir.join("forewarn");
    bin.is_file().then_some(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn deletion(seen: i64) -> PodDeletion {
        PodDeletion {
            pod: "shop/db-0".into(),
            node: "node-000001".into(),
            grace_seconds: Some(0),
            deletion_timestamp: t(seen),
            seen_at: t(seen),
        }
    }

    /// Only a pod created after its node's release is let off: one that
    /// was there while the node was held, or deleted while it still is,
    /// counts as a force delete.
    #[test]
    fn a_force_delete_is_let_off_only_for_a_pod_created_after_the_release() {
        let n = |at, c| (t(at), "node-000001".to_string(), c);
        let released = [n(0, false), n(10, true), n(30, false)];
        // Created after the release (KWOK's by-name delete of a
        // StatefulSet's replacement): not forewarn's.
        assert!(created_after_release(&deletion(31), Some(t(30)), &released));
        assert!(created_after_release(&deletion(31), Some(t(29)), &released));
        // There while the node was held: forewarn's.
        assert!(!created_after_release(&deletion(31), Some(t(5)), &released));
        // Deleted while the node is still held, whenever created.
        assert!(!created_after_release(
            &deletion(20),
            Some(t(15)),
            &released
        ));
        // The initial uncordoned state is no release.
        assert!(!created_after_release(
            &deletion(5),
            Some(t(1)),
            &[n(0, false), n(10, true)]
        ));
        // No creation time: counted.
        assert!(!created_after_release(&deletion(31), None, &released));
        // Another node's release does not count.
        let other = [
            n(0, false),
            n(10, true),
            (t(30), "node-000002".into(), false),
        ];
        assert!(!created_after_release(&deletion(31), Some(t(30)), &other));
    }
}
