//! The agent against a real API server (local control plane, cluster
//! `forewarn-agent`) and the real `forewarn imds-mock`, both run as the
//! shipped binary: how the object is written (`managedFields`), and how the
//! agent rides out what IMDS does (slow first call, malformed entries,
//! incarnation going down, flaps, 429, odd ids), and when it sends an
//! approval. No controller runs: tests write the decision themselves. They
//! fail, never skip, when the cluster cannot start.
#![cfg(feature = "harness")]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use forewarn::crd::ScheduledEvent;
use forewarn::harness::cluster::{Cluster, repo_root};
use forewarn::harness::procs::{Proc, free_port, read_mock_address, wait_ready};
use forewarn::imds::mock::{LogEntry, RequestEntry};
use forewarn::imds::model::object_name;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

/// One cluster for the whole test binary.
fn cluster() -> Cluster {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            Cluster::start(
                &std::env::var("FOREWARN_AGENT_CLUSTER")
                    .unwrap_or_else(|_| "forewarn-agent".into()),
                3,
            )
            .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .unwrap_or_else(|e| panic!("the local cluster could not start: {e}"))
}

/// One test's processes: the mock and its agents.
struct Rig {
    name: String,
    cluster: Cluster,
    dir: PathBuf,
    base: String,
    mock: Proc,
    agents: Vec<(Proc, u16)>,
    api: Api<ScheduledEvent>,
    http: reqwest::Client,
}

impl Rig {
    /// Starts the mock (held) for `scenario`, after deleting the objects of `ids`.
    async fn start(name: &str, scenario: &str, ids: &[&str]) -> Rig {
        let cluster = tokio::task::spawn_blocking(cluster)
            .await
            .expect("cluster start panicked");
        let client = cluster.client().await.expect("client");
        let api: Api<ScheduledEvent> = Api::all(client);
        for id in ids {
            let _ = api.delete(&object_name(id), &DeleteParams::default()).await;
        }
        for id in ids {
            let n = object_name(id);
            let deadline = Instant::now() + Duration::from_secs(20);
            while api.get_opt(&n).await.expect("get").is_some() {
                assert!(
                    Instant::now() < deadline,
                    "{n} from an earlier run not deleted"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let dir = repo_root().join("target/agent-imds").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("scenario.yaml");
        std::fs::write(&file, scenario).unwrap();
        let (mock, stdout) = Proc::spawn(
            "imds-mock",
            &bin(),
            &[
                "imds-mock".into(),
                "--scenario".into(),
                file.to_string_lossy().into(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--hold".into(),
            ],
            &[("RUST_LOG", "info")],
            &dir,
            "imds-mock",
        )
        .unwrap();
        let base = read_mock_address(stdout.unwrap(), mock.log.clone())
            .await
            .unwrap();
        Rig {
            name: name.into(),
            cluster,
            dir,
            base,
            mock,
            agents: Vec::new(),
            api,
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap(),
        }
    }

    /// Starts an agent for `vm` on `node` with `extra` flags; returns its index.
    async fn agent(&mut self, node: &str, vm: &str, extra: &[&str]) -> usize {
        let url = format!("{}/vm/{vm}", self.base);
        self.agent_at(node, &url, extra).await
    }

    async fn agent_at(&mut self, node: &str, imds_url: &str, extra: &[&str]) -> usize {
        let mut args: Vec<String> = [
            "agent",
            "--node-name",
            node,
            "--imds-url",
            imds_url,
            "--metrics-addr",
            "127.0.0.1:0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let kubeconfig = self.cluster.kubeconfig.to_string_lossy().into_owned();
        let i = self.agents.len();
        let (mut p, _) = Proc::spawn(
            &format!("agent {node}"),
            &bin(),
            &args,
            &[
                // IMDS must be reached directly, never through a proxy.
                ("HTTP_PROXY", "http://127.0.0.1:9"),
                ("HTTPS_PROXY", "http://127.0.0.1:9"),
                ("NO_PROXY", "127.0.0.1,localhost"),
                ("KUBECONFIG", &kubeconfig),
                ("RUST_LOG", "info,kube=warn,tower=warn,hyper=warn"),
            ],
            &self.dir,
            &format!("agent-{i}"),
        )
        .unwrap();
        let port = p
            .metrics_port(Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        self.agents.push((p, port));
        i
    }

    async fn ready(&self) {
        for (p, port) in &self.agents {
            if let Err(e) = wait_ready(*port, Duration::from_secs(60)).await {
                panic!("{} not ready: {e}\n{}", p.name, p.log_tail(30));
            }
        }
    }

    async fn start_clock(&self) -> Instant {
        self.http
            .post(format!("{}/mock/start", self.base))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap();
        Instant::now()
    }

    async fn log(&self) -> Vec<LogEntry> {
        self.http
            .get(format!("{}/mock/log", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn requests(&self, vm: &str) -> Vec<RequestEntry> {
        let all: Vec<RequestEntry> = self
            .http
            .get(format!("{}/mock/requests", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        all.into_iter()
            .filter(|r| r.vm == vm && r.method == "GET")
            .collect()
    }

    async fn metrics(&self, agent: usize) -> String {
        self.http
            .get(format!("http://127.0.0.1:{}/metrics", self.agents[agent].1))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    fn agent_log(&self, agent: usize) -> String {
        std::fs::read_to_string(&self.agents[agent].0.log).unwrap_or_default()
    }

    async fn get(&self, id: &str) -> Option<ScheduledEvent> {
        self.api.get_opt(&object_name(id)).await.unwrap()
    }

    /// The object as the API server stores it, `managedFields` included.
    fn raw(&self, id: &str) -> Value {
        let out = self
            .cluster
            .kubectl(&[
                "get",
                "scheduledevents",
                &object_name(id),
                "-o",
                "json",
                "--show-managed-fields",
            ])
            .unwrap();
        serde_json::from_str(&out).unwrap()
    }

    /// Polls `check` every 200 ms until it returns `Some`, or panics after `within`.
    async fn wait_for<T, F, Fut>(&self, what: &str, within: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + within;
        loop {
            if let Some(v) = check().await {
                return v;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = (0..self.agents.len())
                    .map(|i| format!("--- agent {i} ---\n{}", self.agents[i].0.log_tail(25)))
                    .collect();
                panic!(
                    "{}: {what} did not happen within {within:?}\n{}",
                    self.name,
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the object of `id` has `eventStatus` `status`; returns it.
    async fn wait_status(&self, id: &str, status: &str, within: Duration) -> ScheduledEvent {
        self.wait_for(&format!("{id} {status}"), within, || async {
            self.get(id).await.filter(|o| o.spec.event_status == status)
        })
        .await
    }

    /// Stops every process; each must exit cleanly on SIGTERM.
    async fn stop(mut self) {
        for (p, _) in &mut self.agents {
            let status = p.terminate(Duration::from_secs(15)).await.unwrap();
            assert!(status.success(), "{} exited with {status}", p.name);
        }
        self.mock.terminate(Duration::from_secs(15)).await.unwrap();
    }
}

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_forewarn"))
}

fn counter(text: &str, metric: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(metric))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every `managedFields` entry whose fields include `field` (e.g. `f:notBefore`).
fn owners_of(raw: &Value, field: &str) -> Vec<String> {
    raw["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["fieldsV1"].to_string().contains(field))
        .map(|m| format!("{}/{}", m["manager"], m["operation"]))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn started_event_keeps_no_not_before_and_no_stale_owner_of_it() {
    const ID: &str = "A1000000-0000-4000-8000-00000000000A";
    let mut rig = Rig::start(
        "not-before",
        &format!(
            "vms: [{{name: nb_0}}, {{name: nb_1}}]\nevents:\n  - {{id: {ID}, type: Reboot, resources: [nb_0], at: 0s, notice: 10s, runFor: 1h}}\n"
        ),
        &[ID],
    )
    .await;
    // Two agents see the event at once: both race to create it.
    rig.agent("node-000000", "nb_0", &[]).await;
    rig.agent("node-000001", "nb_1", &[]).await;
    rig.ready().await;
    rig.start_clock().await;

    let scheduled = rig
        .wait_status(ID, "Scheduled", Duration::from_secs(20))
        .await;
    assert!(
        scheduled.spec.not_before.is_some(),
        "Scheduled without NotBefore"
    );
    assert_eq!(scheduled.spec.appearance, 1);
    let raw = rig.raw(ID);
    assert_eq!(
        owners_of(&raw, "f:notBefore"),
        [r#""forewarn-agent"/"Update""#],
        "{raw:#}"
    );

    rig.wait_status(ID, "Started", Duration::from_secs(30))
        .await;
    let raw = rig.raw(ID);
    assert!(
        raw["spec"].get("notBefore").is_none(),
        "notBefore survived the start: {:#}",
        raw["spec"]
    );
    assert!(
        owners_of(&raw, "f:notBefore").is_empty(),
        "a stale owner of f:notBefore: {:#}",
        raw["metadata"]["managedFields"]
    );
    // One owner of the spec, `forewarn-agent`, and nothing else: the
    // agents' reports are objects of their own.
    let fields = raw["metadata"]["managedFields"].as_array().unwrap();
    let managers: Vec<String> = fields
        .iter()
        .map(|m| format!("{}/{}", m["manager"], m["operation"]))
        .collect();
    assert_eq!(
        managers,
        [r#""forewarn-agent"/"Update""#],
        "spec has one owner"
    );
    // Each agent's report, as the API server holds it: named for the event
    // and its node, about this event, owned by this very object.
    let out = rig
        .cluster
        .kubectl(&["get", "scheduledeventreports", "-o", "json"])
        .unwrap();
    let reports: Value = serde_json::from_str(&out).unwrap();
    let name = object_name(ID);
    let mut nodes: Vec<String> = Vec::new();
    for r in reports["items"].as_array().unwrap() {
        if r["spec"]["scheduledEvent"] != name.as_str() {
            continue;
        }
        let node = r["spec"]["report"]["node"].as_str().unwrap().to_string();
        assert_eq!(r["metadata"]["name"], format!("{name}.{node}"), "{r:#}");
        assert_eq!(
            r["metadata"]["ownerReferences"][0]["uid"], raw["metadata"]["uid"],
            "{r:#}"
        );
        assert_eq!(
            r["metadata"]["ownerReferences"][0]["kind"], "ScheduledEvent",
            "{r:#}"
        );
        nodes.push(node);
    }
    nodes.sort();
    // nb_1's agent sees the event too (IMDS delivers it to the set), unnamed.
    assert_eq!(nodes, ["node-000000", "node-000001"], "{reports:#}");
    assert_eq!(raw["spec"]["eventId"], ID);
    for i in 0..2 {
        let log = rig.agent_log(i);
        assert!(
            !log.contains("Could not mirror"),
            "agent {i} failed a write:\n{log}"
        );
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn first_imds_call_slower_than_the_short_timeout_succeeds() {
    const ID: &str = "A2000000-0000-4000-8000-00000000000B";
    const CONTROL_ID: &str = "A2000000-0000-4000-8000-00000000000C";
    let mut rig = Rig::start(
        "first-call",
        &format!(
            "vms: [{{name: fc_0, firstRequestDelay: 6s}}, {{name: fc_1, firstRequestDelay: 6s}}]\nevents:\n  - {{id: {ID}, type: Freeze, resources: [fc_0], at: 0s, notice: 1h, deliverTo: resources}}\n  - {{id: {CONTROL_ID}, type: Freeze, resources: [fc_1], at: 0s, notice: 1h, deliverTo: resources}}\n"
        ),
        &[ID, CONTROL_ID],
    )
    .await;
    rig.start_clock().await;
    // The default: 2 s per request, 120 s until IMDS first answers.
    let patient = rig
        .agent("node-000000", "fc_0", &["--imds-timeout", "2s"])
        .await;
    // The control: 2 s from the first request on, as before.
    rig.agent(
        "node-000001",
        "fc_1",
        &["--imds-timeout", "2s", "--imds-first-timeout", "2s"],
    )
    .await;
    // Only the patient agent sees this event.
    let obj = rig
        .wait_status(ID, "Scheduled", Duration::from_secs(40))
        .await;
    assert_eq!(obj.spec.event_id, ID);
    rig.wait_status(CONTROL_ID, "Scheduled", Duration::from_secs(20))
        .await;

    let patient_reqs = rig.requests("fc_0").await;
    let first = &patient_reqs[0];
    let answered = first.answered.expect("first request never answered");
    assert_eq!(first.status, Some(200));
    assert!(
        answered - first.arrived >= chrono::TimeDelta::milliseconds(5500),
        "the mock did not delay: {first:?}"
    );
    let retried: Vec<&RequestEntry> = patient_reqs
        .iter()
        .filter(|r| r.seq != first.seq && r.arrived < answered)
        .collect();
    assert!(
        retried.is_empty(),
        "the agent gave up on the slow first call and asked again: {retried:?}"
    );
    assert!(
        !rig.agent_log(patient).contains("IMDS poll failed"),
        "{}",
        rig.agent_log(patient)
    );

    // The control agent did give up at 2 s and asked again before the answer.
    let control = rig.requests("fc_1").await;
    let c_first = &control[0];
    let c_answered = c_first.answered.unwrap_or_else(Utc::now);
    assert!(
        control
            .iter()
            .any(|r| r.seq != c_first.seq && r.arrived < c_answered),
        "the control agent did not time out: {control:?}"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_malformed_event_does_not_block_the_good_ones() {
    const GOOD1: &str = "A3000000-0000-4000-8000-000000000001";
    const BAD: &str = "A3000000-0000-4000-8000-000000000002";
    const GOOD2: &str = "A3000000-0000-4000-8000-000000000003";
    let mut rig = Rig::start(
        "malformed",
        &format!(
            "vms: [{{name: mf_0}}]\nevents:\n  - {{id: {GOOD1}, type: Reboot, resources: [mf_0], at: 0s, notice: 1h}}\n  - {{id: {BAD}, type: Reboot, resources: [mf_0], at: 0s, notice: 1h, malformed: true}}\n  - {{id: {GOOD2}, type: Freeze, resources: [mf_0], at: 0s, notice: 1h, notBeforeFormat: invalid}}\n"
        ),
        &[GOOD1, BAD, GOOD2],
    )
    .await;
    let a = rig.agent("node-000002", "mf_0", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    rig.wait_status(GOOD1, "Scheduled", Duration::from_secs(20))
        .await;
    rig.wait_status(GOOD2, "Scheduled", Duration::from_secs(20))
        .await;
    // Still no object for the malformed one a few polls later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(rig.get(BAD).await.is_none(), "malformed event mirrored");
    let log = rig.agent_log(a);
    let line = log
        .lines()
        .find(|l| l.contains("Rejected a malformed entry"))
        .unwrap_or_else(|| panic!("no rejection logged:\n{log}"));
    assert!(
        line.contains(BAD) && line.contains("42"),
        "the bytes are not in the log: {line}"
    );
    assert_eq!(
        log.matches("Rejected a malformed entry").count(),
        1,
        "logged more than once per document change"
    );
    // GOOD2's NotBefore is in no known format: mirrored without it, and
    // said once, not on every poll.
    let good2 = rig.get(GOOD2).await.unwrap();
    assert_eq!(good2.spec.not_before, None);
    assert_eq!(
        log.matches("Ignoring NotBefore in an unknown format")
            .count(),
        1,
        "{log}"
    );
    let m = rig.metrics(a).await;
    assert_eq!(
        counter(&m, "forewarn_agent_imds_events_rejected_total"),
        1.0,
        "{m}"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn incarnation_going_down_after_a_redeploy_is_handled() {
    const A: &str = "A4000000-0000-4000-8000-000000000001";
    const C: &str = "A4000000-0000-4000-8000-000000000002";
    const B: &str = "A4000000-0000-4000-8000-000000000003";
    let mut rig = Rig::start(
        "incarnation",
        &format!(
            "vms: [{{name: inc_0, redeployAt: 8s}}]\nevents:\n  - {{id: {A}, type: Redeploy, resources: [inc_0], at: 0s, notice: 1h, cancelAt: 8s}}\n  - {{id: {C}, type: Freeze, resources: [inc_0], at: 2s, notice: 1h, cancelAt: 4s}}\n  - {{id: {B}, type: Reboot, resources: [inc_0], at: 10s, notice: 1h}}\n"
        ),
        &[A, B, C],
    )
    .await;
    let a = rig.agent("node-000001", "inc_0", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    rig.wait_status(A, "Scheduled", Duration::from_secs(20))
        .await;
    // The document went 1 -> 2 (A) -> 3 (C) -> 4 (C cancelled), then the
    // redeploy restarts it at 1, and B makes it 2: lower than 4.
    let b = rig
        .wait_status(B, "Scheduled", Duration::from_secs(30))
        .await;
    assert_eq!(b.spec.appearance, 1);
    rig.wait_status(A, "Completed", Duration::from_secs(5))
        .await;
    rig.wait_status(C, "Completed", Duration::from_secs(5))
        .await;
    let log = rig.log().await;
    assert!(
        log.iter()
            .any(|e| e.what == "Redeployed" && e.vm.as_deref() == Some("inc_0")),
        "{log:?}"
    );
    assert!(
        rig.agent_log(a).contains("DocumentIncarnation went down"),
        "{}",
        rig.agent_log(a)
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn flapping_event_returns_to_scheduled_with_appearance_two() {
    const F: &str = "A5000000-0000-4000-8000-00000000000F";
    let mut rig = Rig::start(
        "flap",
        &format!(
            "vms: [{{name: fl_0}}, {{name: fl_1}}]\nevents:\n  - {{id: {F}, type: Reboot, resources: [fl_0], at: 0s, notice: 1h, gone: [{{at: 5s, for: 3s}}]}}\n"
        ),
        &[F],
    )
    .await;
    rig.agent("node-000000", "fl_0", &[]).await;
    rig.agent("node-000002", "fl_1", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    let first = rig
        .wait_status(F, "Scheduled", Duration::from_secs(20))
        .await;
    assert_eq!(first.spec.appearance, 1);
    let gone = rig
        .wait_status(F, "Completed", Duration::from_secs(20))
        .await;
    assert_eq!(gone.spec.appearance, 1);
    let back = rig
        .wait_for("the event back", Duration::from_secs(20), || async {
            rig.get(F)
                .await
                .filter(|o| o.spec.event_status == "Scheduled")
        })
        .await;
    assert_eq!(back.spec.appearance, 2, "{:?}", back.spec);
    assert!(back.spec.not_before.is_some());
    // Both agents saw it come back; neither counts a third appearance.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let settled = rig.get(F).await.unwrap();
    assert_eq!(settled.spec.appearance, 2);
    assert_eq!(settled.spec.event_status, "Scheduled");
    let log = rig.log().await;
    let phases: Vec<&str> = log
        .iter()
        .filter(|e| e.event_id == F)
        .map(|e| e.what.as_str())
        .collect();
    assert_eq!(phases, ["Scheduled", "Gone", "Scheduled"]);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn event_id_that_is_no_valid_name_gets_a_hashed_name_and_keeps_the_id() {
    const ODD: &str = "Maintenance/Reboot #7_Of_Pool";
    const GOOD: &str = "A6000000-0000-4000-8000-000000000001";
    let mut rig = Rig::start(
        "odd-id",
        &format!(
            "vms: [{{name: id_0}}]\nevents:\n  - {{id: '{ODD}', type: Reboot, resources: [id_0], at: 0s, notice: 1h}}\n  - {{id: {GOOD}, type: Reboot, resources: [id_0], at: 0s, notice: 1h}}\n"
        ),
        &[ODD, GOOD],
    )
    .await;
    rig.agent("node-000002", "id_0", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    let odd = rig
        .wait_status(ODD, "Scheduled", Duration::from_secs(20))
        .await;
    let name = odd.metadata.name.clone().unwrap();
    assert!(name.starts_with("sev-"), "{name}");
    assert_eq!(odd.spec.event_id, ODD);
    let good = rig
        .wait_status(GOOD, "Scheduled", Duration::from_secs(5))
        .await;
    assert_eq!(good.metadata.name.as_deref(), Some(&*GOOD.to_lowercase()));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fallback_agent_waits_its_own_delay_whatever_the_decision_time() {
    const PAST: &str = "A7000000-0000-4000-8000-000000000001";
    const FUTURE: &str = "A7000000-0000-4000-8000-000000000002";
    // The events name sk_1, which has no agent: sk_0's agent is the fallback.
    let mut rig = Rig::start(
        "skew",
        &format!(
            "vms: [{{name: sk_0}}, {{name: sk_1}}]\nevents:\n  - {{id: {PAST}, type: Redeploy, resources: [sk_1], at: 0s, notice: 1h, runFor: 1h}}\n  - {{id: {FUTURE}, type: Redeploy, resources: [sk_1], at: 0s, notice: 1h, runFor: 1h}}\n"
        ),
        &[PAST, FUTURE],
    )
    .await;
    rig.agent("node-000000", "sk_0", &["--approval-fallback", "8s"])
        .await;
    rig.ready().await;
    rig.start_clock().await;
    rig.wait_status(PAST, "Scheduled", Duration::from_secs(20))
        .await;
    rig.wait_status(FUTURE, "Scheduled", Duration::from_secs(20))
        .await;

    // Decisions stamped by a controller whose clock is an hour behind, and
    // one an hour ahead.
    let decide = |id: &'static str, at: DateTime<Utc>| {
        let api = rig.api.clone();
        async move {
            let body = json!({
                "apiVersion": "forewarn.dev/v1alpha1",
                "kind": "ScheduledEvent",
                "metadata": {"name": object_name(id)},
                "status": {"approval": {"decidedAt": at, "reason": "test: skewed clock"}},
            });
            api.patch_status(
                &object_name(id),
                &PatchParams::apply("forewarn-test").force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap();
            Utc::now()
        }
    };
    let past_at = decide(PAST, Utc::now() - chrono::TimeDelta::hours(1)).await;
    let future_at = decide(FUTURE, Utc::now() + chrono::TimeDelta::hours(1)).await;

    let approved = |id: &'static str| {
        let rig = &rig;
        async move {
            rig.wait_for(
                &format!("approval of {id}"),
                Duration::from_secs(30),
                || async {
                    rig.log()
                        .await
                        .into_iter()
                        .find(|e| e.event_id == id && e.what == "Approved")
                },
            )
            .await
        }
    };
    for (id, decided) in [(PAST, past_at), (FUTURE, future_at)] {
        let entry = approved(id).await;
        assert_eq!(entry.vm.as_deref(), Some("sk_0"));
        let waited = (entry.time - decided).to_std().unwrap_or_default();
        println!("{id}: approval sent {waited:?} after the skewed decision was written");
        assert!(
            waited >= Duration::from_millis(7500) && waited <= Duration::from_secs(13),
            "{id}: sent {waited:?} after the decision, expected the 8 s fallback"
        );
        // The agent records the result once IMDS has answered: a moment
        // after the mock logged the request.
        let a = rig
            .wait_for(
                &format!("the approval result of {id}"),
                Duration::from_secs(10),
                || async {
                    rig.get(id)
                        .await
                        .and_then(|o| o.status?.approval)
                        .filter(|a| a.result.is_some())
                },
            )
            .await;
        assert_eq!(a.sent_by.as_deref(), Some("node-000000"));
        assert_eq!(a.result.as_deref(), Some("Accepted"));
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn imds_429_is_backed_off_and_polling_resumes() {
    const EARLY: &str = "A8000000-0000-4000-8000-000000000001";
    const LATE: &str = "A8000000-0000-4000-8000-000000000002";
    let mut rig = Rig::start(
        "throttle",
        &format!(
            "vms: [{{name: th_0}}]\nevents:\n  - {{id: {EARLY}, type: Freeze, resources: [th_0], at: 0s, notice: 1h}}\n  - {{id: {LATE}, type: Freeze, resources: [th_0], at: 22s, notice: 1h}}\nfaults:\n  - {{at: 3s, for: 20s, kind: status429}}\n"
        ),
        &[EARLY, LATE],
    )
    .await;
    let a = rig.agent("node-000001", "th_0", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    rig.wait_status(EARLY, "Scheduled", Duration::from_secs(10))
        .await;
    rig.wait_status(LATE, "Scheduled", Duration::from_secs(45))
        .await;
    let reqs = rig.requests("th_0").await;
    let throttled: Vec<&RequestEntry> = reqs.iter().filter(|r| r.status == Some(429)).collect();
    println!(
        "{} requests answered 429 in the 20 s fault",
        throttled.len()
    );
    // One poll a second would have asked about 20 times in the window.
    assert!(
        (2..=8).contains(&throttled.len()),
        "{} requests answered 429 in 20 s: {throttled:?}",
        throttled.len()
    );
    let m = rig.metrics(a).await;
    assert!(
        counter(&m, "forewarn_agent_imds_backoffs_total") >= 2.0,
        "{m}"
    );
    let log = rig.agent_log(a);
    assert!(log.contains("backing off") && log.contains("429"), "{log}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connection_refused_is_kept_in_the_log() {
    let mut rig = Rig::start("refused", "vms: [{name: rf_0}]\n", &[]).await;
    // Nothing listens on this port.
    let port = free_port().unwrap();
    let a = rig
        .agent_at(
            "node-000002",
            &format!("http://127.0.0.1:{port}/vm/rf_0"),
            &[],
        )
        .await;
    rig.wait_for(
        "the refusal in the log",
        Duration::from_secs(20),
        || async {
            rig.agent_log(a)
                .to_lowercase()
                .contains("connection refused")
                .then_some(())
        },
    )
    .await;
    rig.stop().await;
}
