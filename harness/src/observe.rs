//! The observer of a run: it watches the cluster, the IMDS mock's log and
//! the processes while the scenario plays, puts what it sees on the
//! timeline, plays the faults the options ask for, and judges the rules and
//! the scenario's expectations from the outside.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::sync::oneshot;

use forewarn::api::holds;
use forewarn::api::{CONTROLLER_MANAGER, ScheduledEvent};
use forewarn::controller::observe::nodes::is_cordoned;
use forewarn::imds::mock::LogEntry;
use forewarn::imds::scenario::Scenario;

use crate::cluster::Cluster;
use crate::notices::{acknowledge, watch_notices};
use crate::options::{NodeDeletion, RunOptions};
use crate::outage::{api_server_outage, drain_in_progress, restart_exited_controller};
use crate::procs::Fleet;
use crate::report::{AckWritten, BudgetSeen, PodDeletion, Report};
use crate::timeline::{Timeline, chrono_time, short};
use crate::workload::{ready_pods, restore_node};

/// A background task, aborted when this is dropped.
pub struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a run sees of the cluster, every version from the watches (not
/// samples), each with the time it was seen: ScheduledEvents; pods of any
/// namespace being deleted; each node's cordon; the workload namespace's
/// pods (the notices forewarn writes on them, as the kubelet would project
/// them); its PodDisruptionBudgets (when each allowed a disruption that a
/// drain could take). Started before forewarn's processes, so that
/// nothing they do goes unseen: a pod forewarn evicts at once (a node held
/// before the run) and deleted by KWOK a second later was first seen by a
/// watch started after it in its last version only, with the grace 0 of
/// KWOK's final delete.
pub(crate) struct Watches {
    sev_rx: UnboundedReceiver<(DateTime<Utc>, ScheduledEvent)>,
    pod_rx: UnboundedReceiver<(DateTime<Utc>, Pod)>,
    node_rx: UnboundedReceiver<(DateTime<Utc>, String, bool)>,
    notice_rx: UnboundedReceiver<(DateTime<Utc>, Pod)>,
    budget_rx: UnboundedReceiver<BudgetSeen>,
    /// The client the watches use, for the run's other requests.
    client: Client,
    _tasks: Vec<AbortOnDrop>,
}

/// A hang bound for a watch's first list (it takes well under a second).
const WATCH_SYNC_WAIT: Duration = Duration::from_secs(60);

impl Watches {
    /// Starts the watches and returns once each has listed what exists.
    ///
    /// # Errors
    /// A watch that has not listed within [`WATCH_SYNC_WAIT`].
    pub(crate) async fn start(client: Client, ns: &str) -> anyhow::Result<Self> {
        let mut tasks = Vec::new();
        let mut synced = Vec::new();
        let (sev_tx, sev_rx) = unbounded_channel();
        let (t, s) = spawn_watch(Api::<ScheduledEvent>::all(client.clone()), move |sev| {
            sev_tx.send((Utc::now(), sev)).is_ok()
        });
        tasks.push(t);
        synced.push(("ScheduledEvents", s));
        let (pod_tx, pod_rx) = unbounded_channel();
        let (t, s) = spawn_watch(Api::<Pod>::all(client.clone()), move |p| {
            p.metadata.deletion_timestamp.is_none() || pod_tx.send((Utc::now(), p)).is_ok()
        });
        tasks.push(t);
        synced.push(("pods", s));
        let (node_tx, node_rx) = unbounded_channel();
        let (t, s) = spawn_watch(Api::<Node>::all(client.clone()), move |n| {
            node_tx
                .send((Utc::now(), n.name_any(), is_cordoned(&n)))
                .is_ok()
        });
        tasks.push(t);
        synced.push(("nodes", s));
        let (notice_tx, notice_rx) = unbounded_channel();
        let (t, s) = spawn_watch(Api::<Pod>::namespaced(client.clone(), ns), move |p| {
            notice_tx.send((Utc::now(), p)).is_ok()
        });
        tasks.push(t);
        synced.push(("the workload's pods", s));
        let (budget_tx, budget_rx) = unbounded_channel();
        let (t, s) = spawn_watch(
            Api::<PodDisruptionBudget>::namespaced(client.clone(), ns),
            move |b| budget_tx.send(BudgetSeen::of(&b, Utc::now())).is_ok(),
        );
        tasks.push(t);
        synced.push(("PodDisruptionBudgets", s));
        for (what, s) in synced {
            tokio::time::timeout(WATCH_SYNC_WAIT, s)
                .await
                .map_err(|_| {
                    anyhow::anyhow!("the watch of {what} did not list within {WATCH_SYNC_WAIT:?}")
                })?
                .map_err(|_| anyhow::anyhow!("the watch of {what} ended before it listed"))?;
        }
        Ok(Self {
            sev_rx,
            pod_rx,
            node_rx,
            notice_rx,
            budget_rx,
            client,
            _tasks: tasks,
        })
    }
}

/// Watches `api` (restarting with forewarn's own watch backoff) and hands
/// each version of an object to `seen`, until it returns false (its
/// receiver is gone). The receiver it returns is told once the first list
/// has been handed over.
pub fn spawn_watch<K>(
    api: Api<K>,
    mut seen: impl FnMut(K) -> bool + Send + 'static,
) -> (AbortOnDrop, oneshot::Receiver<()>)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let (synced_tx, synced_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut synced_tx = Some(synced_tx);
        let stream = watcher(api, watcher::Config::default())
            .backoff(forewarn::controller::observe::watch::watch_backoff());
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            let more = match item {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => seen(o),
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = synced_tx.take() {
                        let _ = tx.send(());
                    }
                    true
                }
                _ => true,
            };
            if !more {
                break;
            }
        }
    });
    (AbortOnDrop(task), synced_rx)
}

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

/// Per-event bookkeeping of the observer.
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
pub(crate) async fn observe(
    cluster: &Cluster,
    http: &reqwest::Client,
    scenario: &Scenario,
    opts: &RunOptions,
    tl: &mut Timeline,
    fleet: &mut Fleet,
    watches: Watches,
) -> anyhow::Result<Report> {
    let ns = &opts.namespace;
    let Watches {
        mut sev_rx,
        mut pod_rx,
        mut node_rx,
        mut notice_rx,
        mut budget_rx,
        client,
        _tasks,
    } = watches;
    let client = &client;
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
    let mut timed_faults = opts.timed_faults.clone();
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
    let mut initial_pods: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let initial_uids: HashMap<String, HashSet<String>> = {
        let mut m: HashMap<String, HashSet<String>> = HashMap::new();
        for p in pods_api.list(&ListParams::default()).await? {
            if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                initial_pods
                    .entry(node.clone())
                    .or_default()
                    .push(format!("{ns}/{}", p.name_any()));
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
        initial_pods,
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
            if let Some(nb) = sev.spec.not_before {
                report
                    .not_before
                    .entry(sev.spec.event_id.clone())
                    .or_insert(nb);
            }
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
        while let Ok(b) = budget_rx.try_recv() {
            report.budgets.push(b);
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
        for (_, fault) in timed_faults.iter().filter(|(at, _)| *at <= elapsed) {
            crate::faults::inject(cluster, fault, fleet, tl, &mut report).await?;
        }
        timed_faults.retain(|(at, _)| *at > elapsed);

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

        if outage_started || opts.restart_exited_controller {
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
