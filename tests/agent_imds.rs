//! The agent against a real API server (local control plane, cluster
//! `forewarn-agent`) and the real `forewarn imds-mock`, both run as the
//! shipped binary: what each agent writes (only its own
//! `ScheduledEventReport` per event, `<event>.<node>`, and how the API
//! server stores it: `managedFields`), how it rides out what IMDS does (slow
//! first call, malformed entries, incarnation going down, flaps, 429, odd
//! ids), and when it sends an approval. No controller runs: the tests read
//! the reports themselves, and where a decision is needed they create the
//! `ScheduledEvent` and write the decision as the controller would. They
//! fail, never skip, when the cluster cannot start.
//!
//! Tests run in parallel, and an agent takes every report of its node as
//! its own (it reads them back at start and reports `Completed` what its
//! document no longer lists): the agents of each test have node names of
//! their own.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use forewarn::api::{
    AGENT_MANAGER, CONTROLLER_MANAGER, Report, ScheduledEvent, ScheduledEventReport,
    ScheduledEventSpec, identity_digest,
};
use forewarn::imds::mock::{LogEntry, RequestEntry};
use forewarn::imds::model::object_name;
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::procs::{Proc, free_port, read_mock_address, wait_ready};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

/// The bound on every wait for something that happens within a few
/// seconds (a report written, an approval sent, a process started): a hang
/// bound. Each wait ends as soon as its condition holds, so a healthy run is
/// not slowed; only an agent or mock that stopped working waits this long,
/// whatever the load on the machine.
const HANG: Duration = Duration::from_secs(120);

/// How long a process may take to exit on SIGTERM: a hang bound too (they
/// exit within a second or two); only one that ignores SIGTERM or hangs in
/// its shutdown takes this long.
const STOP: Duration = Duration::from_secs(60);

/// One cluster for the whole test binary.
fn cluster() -> Cluster {
    forewarn_harness::cluster::shared(
        &std::env::var("FOREWARN_AGENT_CLUSTER").unwrap_or_else(|_| "forewarn-agent".into()),
        3,
    )
}

/// The name of the report of `node` about the event `id`: `<event>.<node>`.
fn report_name(id: &str, node: &str) -> String {
    format!("{}.{node}", object_name(id))
}

/// One test's processes: the mock and its agents.
struct Rig {
    name: String,
    cluster: Cluster,
    dir: PathBuf,
    base: String,
    mock: Proc,
    agents: Vec<(Proc, u16)>,
    events: Api<ScheduledEvent>,
    reports: Api<ScheduledEventReport>,
    http: reqwest::Client,
}

impl Rig {
    /// Starts the mock (held) for `scenario`, after deleting the objects of
    /// `ids` (`ScheduledEvent`s and every report about them).
    async fn start(name: &str, scenario: &str, ids: &[&str]) -> Rig {
        let cluster = tokio::task::spawn_blocking(cluster)
            .await
            .expect("cluster start panicked");
        let client = cluster.client().await.expect("client");
        let events: Api<ScheduledEvent> = Api::all(client.clone());
        let reports: Api<ScheduledEventReport> = Api::all(client);
        let names: Vec<String> = ids.iter().map(|id| object_name(id)).collect();
        let stale = || async {
            let mut left: Vec<String> = Vec::new();
            for n in &names {
                if events.get_opt(n).await.expect("get").is_some() {
                    left.push(n.clone());
                }
            }
            for r in reports.list(&ListParams::default()).await.expect("list") {
                if names.contains(&r.spec.scheduled_event) {
                    left.push(r.name_any());
                }
            }
            left
        };
        for n in &names {
            let _ = events.delete(n, &DeleteParams::default()).await;
        }
        for r in reports.list(&ListParams::default()).await.expect("list") {
            if names.contains(&r.spec.scheduled_event) {
                let _ = reports
                    .delete(&r.name_any(), &DeleteParams::default())
                    .await;
            }
        }
        let deadline = Instant::now() + HANG;
        loop {
            let left = stale().await;
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{left:?} from an earlier run not deleted"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
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
            events,
            reports,
            // Loopback calls answered at once; the timeout only ends a hang.
            http: forewarn::http::client_builder()
                .no_proxy()
                .timeout(Duration::from_secs(30))
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
            .metrics_port(HANG)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        self.agents.push((p, port));
        i
    }

    async fn ready(&self) {
        for (p, port) in &self.agents {
            if let Err(e) = wait_ready(*port, HANG).await {
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

    /// The requests the mock received for `vm` with `method` (`GET`: polls,
    /// `POST`: `StartRequests`).
    async fn requests_by(&self, vm: &str, method: &str) -> Vec<RequestEntry> {
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
            .filter(|r| r.vm == vm && r.method == method)
            .collect()
    }

    /// The scheduled events polls the mock received for `vm`.
    async fn requests(&self, vm: &str) -> Vec<RequestEntry> {
        self.requests_by(vm, "GET").await
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

    /// The report of `node` about the event `id`, as the API server holds it.
    async fn report(&self, id: &str, node: &str) -> Option<ScheduledEventReport> {
        self.reports.get_opt(&report_name(id, node)).await.unwrap()
    }

    /// Every report about the event `id`, whatever its object name.
    async fn reports_about(&self, id: &str) -> Vec<ScheduledEventReport> {
        let name = object_name(id);
        self.reports
            .list(&ListParams::default())
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.spec.scheduled_event == name)
            .collect()
    }

    /// Every report of `node`, whatever the event.
    async fn reports_of(&self, node: &str) -> Vec<ScheduledEventReport> {
        self.reports
            .list(&ListParams::default())
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.spec.report.node == node)
            .collect()
    }

    /// The report of `node` about `id` as the API server stores it,
    /// `managedFields` included.
    fn raw_report(&self, id: &str, node: &str) -> Value {
        let out = self
            .cluster
            .kubectl(&[
                "get",
                "scheduledeventreports",
                &report_name(id, node),
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

    /// Waits until the report of `node` about `id` satisfies `ok`; returns it.
    async fn wait_report_where(
        &self,
        id: &str,
        node: &str,
        what: &str,
        within: Duration,
        ok: impl Fn(&Report) -> bool,
    ) -> Report {
        let ok = &ok;
        self.wait_for(
            &format!("the report {} {what}", report_name(id, node)),
            within,
            || async move {
                self.report(id, node)
                    .await
                    .map(|r| r.spec.report)
                    .filter(ok)
            },
        )
        .await
    }

    /// Waits until the report of `node` about `id` has `eventStatus`
    /// `status`; returns its view.
    async fn wait_report(&self, id: &str, node: &str, status: &str, within: Duration) -> Report {
        self.wait_report_where(id, node, status, within, |r| r.event_status == status)
            .await
    }

    /// Stops every process; each must exit cleanly on SIGTERM.
    async fn stop(mut self) {
        for (p, _) in &mut self.agents {
            let status = p.terminate(STOP).await.unwrap();
            assert!(status.success(), "{} exited with {status}", p.name);
        }
        self.mock.terminate(STOP).await.unwrap();
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

/// Every `managedFields` entry, as `"manager"/"operation"`.
fn managers(raw: &Value) -> Vec<String> {
    raw["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| format!("{}/{}", m["manager"], m["operation"]))
        .collect()
}

/// The one entry of `managedFields` an agent's report has: its own apply.
fn agent_apply() -> String {
    format!(r#""{AGENT_MANAGER}"/"Apply""#)
}

#[tokio::test(flavor = "multi_thread")]
async fn started_event_keeps_no_not_before_and_no_stale_owner_of_it() {
    const ID: &str = "A1000000-0000-4000-8000-00000000000A";
    const NODES: [&str; 2] = ["nb-node-0", "nb-node-1"];
    let mut rig = Rig::start(
        "not-before",
        &format!(
            "vms: [{{name: nb_0}}, {{name: nb_1}}]\nevents:\n  - {{id: {ID}, type: Reboot, resources: [nb_0], at: 0s, notice: 20s, runFor: 1h}}\n"
        ),
        &[ID],
    )
    .await;
    // Two agents see the event at once; each writes its own report. The
    // 20 s notice is the window in which the agents must see it Scheduled
    // (they poll every second, so within a second or two): only an agent
    // stalled for the whole notice misses it.
    rig.agent(NODES[0], "nb_0", &[]).await;
    rig.agent(NODES[1], "nb_1", &[]).await;
    rig.ready().await;
    rig.start_clock().await;

    for node in NODES {
        let scheduled = rig.wait_report(ID, node, "Scheduled", HANG).await;
        assert!(
            scheduled.not_before.is_some(),
            "{node}: Scheduled without NotBefore"
        );
        assert_eq!(scheduled.appearance, 1, "{node}");
        let raw = rig.raw_report(ID, node);
        assert_eq!(
            owners_of(&raw, "f:notBefore"),
            [agent_apply()],
            "{node}: {raw:#}"
        );
    }

    for node in NODES {
        rig.wait_report(ID, node, "Started", HANG).await;
        let raw = rig.raw_report(ID, node);
        assert!(
            raw["spec"]["report"].get("notBefore").is_none(),
            "{node}: notBefore survived the start: {:#}",
            raw["spec"]
        );
        assert!(
            owners_of(&raw, "f:notBefore").is_empty(),
            "{node}: a stale owner of f:notBefore: {:#}",
            raw["metadata"]["managedFields"]
        );
        // One owner of the whole report, the agent's apply, and nothing else.
        assert_eq!(
            managers(&raw),
            [agent_apply()],
            "{node}: the report has one owner: {:#}",
            raw["metadata"]["managedFields"]
        );
    }
    // Each agent's report, as the API server holds it: named for the event
    // and its node, about this event, owned by no object.
    let out = rig
        .cluster
        .kubectl(&["get", "scheduledeventreports", "-o", "json"])
        .unwrap();
    let reports: Value = serde_json::from_str(&out).unwrap();
    let name = object_name(ID);
    let mut seen: Vec<(String, bool, String)> = Vec::new();
    for r in reports["items"].as_array().unwrap() {
        if r["spec"]["scheduledEvent"] != name.as_str() {
            continue;
        }
        let report = &r["spec"]["report"];
        let node = report["node"].as_str().unwrap().to_string();
        assert_eq!(r["metadata"]["name"], format!("{name}.{node}"), "{r:#}");
        assert!(
            r["metadata"].get("ownerReferences").is_none(),
            "a report with an owner: {r:#}"
        );
        assert_eq!(report["eventId"], ID, "{r:#}");
        assert_eq!(report["eventStatus"], "Started", "{r:#}");
        assert_eq!(report["appearance"], 1, "{r:#}");
        seen.push((
            node,
            report["named"].as_bool().unwrap(),
            report["vm"].as_str().unwrap().to_string(),
        ));
    }
    seen.sort();
    // nb_1's agent sees the event too (IMDS delivers it to the set), unnamed.
    assert_eq!(
        seen,
        [
            (NODES[0].to_string(), true, "nb_0".to_string()),
            (NODES[1].to_string(), false, "nb_1".to_string())
        ],
        "{reports:#}"
    );
    // Agents write no ScheduledEvent: that is the controller's, and none runs.
    assert!(
        rig.events.get_opt(&name).await.unwrap().is_none(),
        "an agent wrote the ScheduledEvent {name}"
    );
    for i in 0..2 {
        let log = rig.agent_log(i);
        assert!(
            !log.contains("Could not write this agent's report"),
            "agent {i} failed a write:\n{log}"
        );
        // One write per change of its view: first seen, then Started.
        let m = rig.metrics(i).await;
        assert_eq!(
            counter(&m, r#"forewarn_agent_mirror_writes_total{result="ok"}"#),
            2.0,
            "agent {i}: {m}"
        );
        assert_eq!(
            counter(&m, r#"forewarn_agent_mirror_writes_total{result="error"}"#),
            0.0,
            "agent {i}: {m}"
        );
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn first_imds_call_slower_than_the_short_timeout_succeeds() {
    const ID: &str = "A2000000-0000-4000-8000-00000000000B";
    const CONTROL_ID: &str = "A2000000-0000-4000-8000-00000000000C";
    const PATIENT: &str = "fc-node-0";
    const CONTROL: &str = "fc-node-1";
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
    let patient = rig.agent(PATIENT, "fc_0", &["--imds-timeout", "2s"]).await;
    // The control: 2 s from the first request on, as before.
    rig.agent(
        CONTROL,
        "fc_1",
        &["--imds-timeout", "2s", "--imds-first-timeout", "2s"],
    )
    .await;
    // Only the patient agent sees this event.
    let report = rig.wait_report(ID, PATIENT, "Scheduled", HANG).await;
    assert_eq!(report.event_id, ID);
    assert!(report.named);
    rig.wait_report(CONTROL_ID, CONTROL, "Scheduled", HANG)
        .await;
    let about: Vec<String> = rig
        .reports_about(ID)
        .await
        .iter()
        .map(|r| r.name_any())
        .collect();
    assert_eq!(about, [report_name(ID, PATIENT)]);

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
    const NODE: &str = "mf-node-0";
    let mut rig = Rig::start(
        "malformed",
        &format!(
            "vms: [{{name: mf_0}}]\nevents:\n  - {{id: {GOOD1}, type: Reboot, resources: [mf_0], at: 0s, notice: 1h}}\n  - {{id: {BAD}, type: Reboot, resources: [mf_0], at: 0s, notice: 1h, malformed: true}}\n  - {{id: {GOOD2}, type: Freeze, resources: [mf_0], at: 0s, notice: 1h, notBeforeFormat: invalid}}\n"
        ),
        &[GOOD1, BAD, GOOD2],
    )
    .await;
    let a = rig.agent(NODE, "mf_0", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    rig.wait_report(GOOD1, NODE, "Scheduled", HANG).await;
    rig.wait_report(GOOD2, NODE, "Scheduled", HANG).await;
    // Still no report on the malformed one a few seconds later (a window of
    // observation: load only lengthens it).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let bad = rig.reports_about(BAD).await;
    assert!(bad.is_empty(), "malformed event reported: {bad:?}");
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
    // GOOD2's NotBefore is in no known format: reported without it, and
    // said once, not on every poll.
    let good2 = rig.report(GOOD2, NODE).await.unwrap();
    assert_eq!(good2.spec.report.not_before, None);
    assert_eq!(good2.spec.report.event_status, "Scheduled");
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
    const NODE: &str = "inc-node-0";
    let mut rig = Rig::start(
        "incarnation",
        &format!(
            "vms: [{{name: inc_0, redeployAt: 14s}}]\nevents:\n  - {{id: {A}, type: Redeploy, resources: [inc_0], at: 0s, notice: 1h, cancelAt: 14s}}\n  - {{id: {C}, type: Freeze, resources: [inc_0], at: 2s, notice: 1h, cancelAt: 8s}}\n  - {{id: {B}, type: Reboot, resources: [inc_0], at: 16s, notice: 1h}}\n"
        ),
        &[A, B, C],
    )
    .await;
    // Each state of the document lasts at least 6 s, so that the agent
    // (polling every second) sees every one: only an agent stalled for 6 s
    // skips a state, which the incarnations below would show.
    let a = rig.agent(NODE, "inc_0", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    rig.wait_report(A, NODE, "Scheduled", HANG).await;
    // The document went 1 -> 2 (A) -> 3 (C) -> 4 (C cancelled), then the
    // redeploy restarts it at 1, and B makes it 2: lower than 4.
    let b = rig.wait_report(B, NODE, "Scheduled", HANG).await;
    assert_eq!(b.appearance, 1);
    let a_gone = rig.wait_report(A, NODE, "Completed", HANG).await;
    assert_eq!(a_gone.appearance, 1);
    let c_gone = rig.wait_report(C, NODE, "Completed", HANG).await;
    assert_eq!(c_gone.appearance, 1);
    let log = rig.log().await;
    assert!(
        log.iter()
            .any(|e| e.what == "Redeployed" && e.vm.as_deref() == Some("inc_0")),
        "{log:?}"
    );
    // Each report carries the incarnation of the document it came in: C
    // left in incarnation 4, A in the redeployed document's 1, and B came
    // in its 2; reports from the lower incarnations were written all the same.
    assert!(
        a_gone.document_incarnation < c_gone.document_incarnation
            && b.document_incarnation < c_gone.document_incarnation,
        "A gone in {}, B in {}, C gone in {}\n{}",
        a_gone.document_incarnation,
        b.document_incarnation,
        c_gone.document_incarnation,
        rig.agent_log(a)
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn flapping_event_returns_to_scheduled_with_appearance_two() {
    const F: &str = "A5000000-0000-4000-8000-00000000000F";
    const NODES: [&str; 2] = ["fl-node-0", "fl-node-1"];
    let mut rig = Rig::start(
        "flap",
        &format!(
            "vms: [{{name: fl_0}}, {{name: fl_1}}]\nevents:\n  - {{id: {F}, type: Reboot, resources: [fl_0], at: 0s, notice: 1h, gone: [{{at: 8s, for: 6s}}]}}\n"
        ),
        &[F],
    )
    .await;
    // Listed for 8 s, gone for 6 s, then back: each state lasts long enough
    // for the agents (polling every second) and this test (reading every
    // 200 ms) to see it; only a process stalled for 6 s misses one.
    rig.agent(NODES[0], "fl_0", &[]).await;
    rig.agent(NODES[1], "fl_1", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    let first = rig.wait_report(F, NODES[0], "Scheduled", HANG).await;
    assert_eq!(first.appearance, 1);
    let gone = rig.wait_report(F, NODES[0], "Completed", HANG).await;
    assert_eq!(gone.appearance, 1);
    // Gone from the document: reported Completed with the content it had.
    assert_eq!(gone.event_id, F);
    assert!(gone.named);
    let back = rig.wait_report(F, NODES[0], "Scheduled", HANG).await;
    assert_eq!(back.appearance, 2, "{back:?}");
    assert!(back.not_before.is_some());
    // Both agents saw it go and come back (waited for, not assumed after a
    // sleep)...
    for node in NODES {
        rig.wait_report_where(F, node, "back in its second appearance", HANG, |r| {
            r.appearance >= 2 && r.event_status == "Scheduled"
        })
        .await;
    }
    // ...and neither counts a third appearance in the seconds after (a
    // window of observation: load only lengthens it).
    tokio::time::sleep(Duration::from_secs(4)).await;
    for node in NODES {
        let settled = rig.report(F, node).await.unwrap().spec.report;
        assert_eq!(settled.appearance, 2, "{node}: {settled:?}");
        assert_eq!(settled.event_status, "Scheduled", "{node}: {settled:?}");
    }
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
    const NODE: &str = "id-node-0";
    let mut rig = Rig::start(
        "odd-id",
        &format!(
            "vms: [{{name: id_0}}]\nevents:\n  - {{id: '{ODD}', type: Reboot, resources: [id_0], at: 0s, notice: 1h}}\n  - {{id: {GOOD}, type: Reboot, resources: [id_0], at: 0s, notice: 1h}}\n"
        ),
        &[ODD, GOOD],
    )
    .await;
    rig.agent(NODE, "id_0", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    // Found by the id it carries, not by the name the test expects.
    let by_id = |id: &'static str| {
        let rig = &rig;
        async move {
            rig.wait_for(&format!("a report of {id}"), HANG, || async {
                rig.reports_of(NODE).await.into_iter().find(|r| {
                    r.spec.report.event_id == id && r.spec.report.event_status == "Scheduled"
                })
            })
            .await
        }
    };
    let odd = by_id(ODD).await;
    let event = odd.spec.scheduled_event.clone();
    assert!(event.starts_with("sev-"), "{event}");
    assert_eq!(event, object_name(ODD));
    assert_eq!(odd.name_any(), format!("{event}.{NODE}"));
    assert_eq!(odd.spec.report.event_id, ODD);
    let good = by_id(GOOD).await;
    assert_eq!(good.spec.scheduled_event, GOOD.to_lowercase());
    assert_eq!(good.name_any(), format!("{}.{NODE}", GOOD.to_lowercase()));
    assert_eq!(good.spec.report.event_id, GOOD);
    rig.stop().await;
}

/// The `ScheduledEvent` the controller would build from `r` (the report of
/// the only agent that sees the event), created as the controller does.
async fn create_event(rig: &Rig, r: &Report) {
    let spec = ScheduledEventSpec {
        event_id: r.event_id.clone(),
        event_type: r.event_type.clone(),
        event_status: r.event_status,
        event_source: r.event_source.clone(),
        resource_type: r.resource_type.clone(),
        resources: r.resources.clone(),
        not_before: r.not_before,
        duration_seconds: r.duration_seconds,
        description: r.description.clone(),
        appearance: r.appearance,
    };
    let params = PostParams {
        field_manager: Some(CONTROLLER_MANAGER.into()),
        ..Default::default()
    };
    rig.events
        .create(
            &params,
            &ScheduledEvent::new(&object_name(&r.event_id), spec),
        )
        .await
        .unwrap();
}

/// Writes the controller's approval decision on the event `id` through the
/// status subresource, with the node of every report about it recorded
/// drained (an agent sends a decision only while the status records its
/// own node drained); returns the time just before the write was sent: no
/// agent can have seen the decision earlier, whatever the load (a time
/// taken after the API server's answer may be later than an agent's
/// sighting by however long that answer took).
async fn decide(
    rig: &Rig,
    id: &str,
    at: DateTime<Utc>,
    appearance: u32,
    digest: &str,
) -> DateTime<Utc> {
    let nodes: Vec<Value> = rig
        .reports_about(id)
        .await
        .iter()
        .map(|r| {
            json!({
                "name": r.spec.report.node,
                "vmName": r.spec.report.vm,
                "drainedAt": at,
            })
        })
        .collect();
    let before = Utc::now();
    let body = json!({
        "apiVersion": "forewarn.dev/v1alpha1",
        "kind": "ScheduledEvent",
        "metadata": {"name": object_name(id)},
        "status": {
            "approval": {
                "decidedAt": at,
                "reason": "test: decided by hand",
                "appearance": appearance,
                "digest": digest,
            },
            "nodes": nodes,
        },
    });
    rig.events
        .patch_status(
            &object_name(id),
            &PatchParams::apply(CONTROLLER_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
    before
}

#[tokio::test(flavor = "multi_thread")]
async fn fallback_agent_waits_its_own_delay_whatever_the_decision_time() {
    const PAST: &str = "A7000000-0000-4000-8000-000000000001";
    const FUTURE: &str = "A7000000-0000-4000-8000-000000000002";
    const OTHER_DIGEST: &str = "A7000000-0000-4000-8000-000000000003";
    const OTHER_APPEARANCE: &str = "A7000000-0000-4000-8000-000000000004";
    const NODE: &str = "sk-node-0";
    // The events name sk_1, which has no agent: sk_0's agent is the fallback.
    let events: String = [PAST, FUTURE, OTHER_DIGEST, OTHER_APPEARANCE]
        .iter()
        .map(|id| {
            format!(
                "  - {{id: {id}, type: Redeploy, resources: [sk_1], at: 0s, notice: 1h, runFor: 1h}}\n"
            )
        })
        .collect();
    let mut rig = Rig::start(
        "skew",
        &format!("vms: [{{name: sk_0}}, {{name: sk_1}}]\nevents:\n{events}"),
        &[PAST, FUTURE, OTHER_DIGEST, OTHER_APPEARANCE],
    )
    .await;
    let a = rig
        .agent(NODE, "sk_0", &["--approval-fallback", "8s"])
        .await;
    rig.ready().await;
    rig.start_clock().await;
    // The controller's part: each ScheduledEvent from the agent's report.
    let mut reports = std::collections::HashMap::new();
    for id in [PAST, FUTURE, OTHER_DIGEST, OTHER_APPEARANCE] {
        let r = rig.wait_report(id, NODE, "Scheduled", HANG).await;
        assert!(!r.named, "{r:?}");
        assert!(r.approvals.is_empty(), "{r:?}");
        create_event(&rig, &r).await;
        reports.insert(id, r);
    }

    // Decisions this agent must never carry out: bound to other content (the
    // digest of a Freeze of the same id), or to another appearance.
    let r = &reports[OTHER_DIGEST];
    let freeze = identity_digest(
        &r.event_id,
        "Freeze",
        &r.event_source,
        &r.resource_type,
        &r.resources,
        r.duration_seconds,
    );
    assert_ne!(freeze, r.digest());
    let wrong_at = Instant::now();
    decide(&rig, OTHER_DIGEST, Utc::now(), r.appearance, &freeze).await;
    let r = &reports[OTHER_APPEARANCE];
    decide(
        &rig,
        OTHER_APPEARANCE,
        Utc::now(),
        r.appearance + 1,
        &r.digest(),
    )
    .await;

    // Decisions stamped by a controller whose clock is an hour behind, and
    // one an hour ahead, each bound to the event as the agent reported it.
    let r = &reports[PAST];
    let past_at = decide(
        &rig,
        PAST,
        Utc::now() - chrono::TimeDelta::hours(1),
        r.appearance,
        &r.digest(),
    )
    .await;
    let r = &reports[FUTURE];
    let future_at = decide(
        &rig,
        FUTURE,
        Utc::now() + chrono::TimeDelta::hours(1),
        r.appearance,
        &r.digest(),
    )
    .await;

    let approved = |id: &'static str| {
        let rig = &rig;
        async move {
            rig.wait_for(&format!("approval of {id}"), HANG, || async {
                rig.log()
                    .await
                    .into_iter()
                    .find(|e| e.event_id == id && e.what == "Approved")
            })
            .await
        }
    };
    // The node's own share of the spread: between 8 and 16 s (a pure
    // function of the node's name, no measured time).
    let fallback = forewarn::agent::approval::fallback_for(NODE, Duration::from_secs(8));
    assert!(fallback >= Duration::from_secs(8) && fallback <= Duration::from_secs(16));
    // Two clocks are read (this test's, before each write; the mock's, when
    // the POST came): they may disagree by milliseconds, never by more, and
    // load only widens the gap measured.
    let clocks = chrono::TimeDelta::milliseconds(200);
    for (id, decided_at) in [(PAST, past_at), (FUTURE, future_at)] {
        let entry = approved(id).await;
        assert_eq!(entry.vm.as_deref(), Some("sk_0"));
        let waited = (entry.time - decided_at).to_std().unwrap_or_default();
        println!(
            "{id}: approval sent {waited:?} after the skewed decision was written (fallback {fallback:?})"
        );
        // Never before the node's fallback delay on its own clock: `decided`
        // precedes the agent's sighting, so load cannot make this fail.
        let fallback_delta = chrono::TimeDelta::from_std(fallback).unwrap();
        assert!(
            entry.time + clocks >= decided_at + fallback_delta,
            "{id}: sent {waited:?} after the decision, before the node's fallback {fallback:?}"
        );
        // Not held back by the skewed `decidedAt`: an agent counting from it
        // would send the FUTURE one an hour late. A hang bound, far from
        // that hour, that only a stuck approver reaches (nominally the
        // fallback plus up to a poll interval).
        assert!(
            waited < fallback + HANG,
            "{id}: sent {waited:?} after the decision, expected the node's fallback {fallback:?}"
        );
        // The agent records the POST in its own report once IMDS has
        // answered: a moment after the mock logged the request.
        let decided = &reports[id];
        let mine = rig
            .wait_report_where(id, NODE, "with the approval it sent", HANG, |r| {
                !r.approvals.is_empty()
            })
            .await;
        assert_eq!(mine.approvals.len(), 1, "{mine:?}");
        let sent = &mine.approvals[0];
        assert_eq!(sent.status, 200, "{sent:?}");
        assert_eq!(sent.appearance, decided.appearance, "{sent:?}");
        assert_eq!(sent.digest, decided.digest(), "{sent:?}");
        // The report's time is the POST the mock logged: stamped by the
        // agent just before it sent it, after the fallback had passed since
        // the decision was written. Order only: load can delay the POST's
        // arrival, never move it before its stamp.
        assert!(
            sent.sent_at <= entry.time + clocks
                && sent.sent_at + clocks >= decided_at + fallback_delta,
            "sent at {} by the report, received at {} by the mock, decided at {decided_at}",
            sent.sent_at,
            entry.time
        );
    }

    // Well past the fallback since the wrong decisions were written (a
    // window of observation: load only lengthens it). They were written
    // before the good ones, which were sent after their own fallback: the
    // agent has had them past their fallback for some time already.
    let until = wrong_at + fallback + Duration::from_secs(4);
    tokio::time::sleep(until.saturating_duration_since(Instant::now())).await;
    let log = rig.log().await;
    let wrong: Vec<&LogEntry> = log
        .iter()
        .filter(|e| {
            e.what == "Approved" && [OTHER_DIGEST, OTHER_APPEARANCE].contains(&&*e.event_id)
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "a decision not bound to this event was sent: {wrong:?}"
    );
    // Exactly one StartRequests POST for each of the two good decisions.
    let posts = rig.requests_by("sk_0", "POST").await;
    assert_eq!(posts.len(), 2, "{posts:?}\n{log:?}");
    for id in [OTHER_DIGEST, OTHER_APPEARANCE] {
        let r = rig.report(id, NODE).await.unwrap().spec.report;
        assert_eq!(r.event_status, "Scheduled", "{id}: {r:?}");
        assert!(r.approvals.is_empty(), "{id}: {r:?}");
    }
    let m = rig.metrics(a).await;
    assert_eq!(counter(&m, "forewarn_agent_approvals_total"), 2.0, "{m}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn imds_429_is_backed_off_and_polling_resumes() {
    const EARLY: &str = "A8000000-0000-4000-8000-000000000001";
    const LATE: &str = "A8000000-0000-4000-8000-000000000002";
    const NODE: &str = "th-node-0";
    let mut rig = Rig::start(
        "throttle",
        &format!(
            "vms: [{{name: th_0}}]\nevents:\n  - {{id: {EARLY}, type: Freeze, resources: [th_0], at: 0s, notice: 1h}}\n  - {{id: {LATE}, type: Freeze, resources: [th_0], at: 22s, notice: 1h}}\nfaults:\n  - {{at: 3s, for: 20s, kind: status429}}\n"
        ),
        &[EARLY, LATE],
    )
    .await;
    let a = rig.agent(NODE, "th_0", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    rig.wait_report(EARLY, NODE, "Scheduled", HANG).await;
    // Polling resumed after the fault: LATE, listed only from 22 s on.
    rig.wait_report(LATE, NODE, "Scheduled", HANG).await;
    // The last good document was kept through the fault: EARLY never
    // reported gone.
    let early = rig.report(EARLY, NODE).await.unwrap().spec.report;
    assert_eq!(
        (early.event_status, early.appearance),
        (forewarn::api::EventStatus::Scheduled, 1),
        "{early:?}"
    );
    let reqs = rig.requests("th_0").await;
    let throttled: Vec<&RequestEntry> = reqs.iter().filter(|r| r.status == Some(429)).collect();
    println!(
        "{} requests answered 429 in the 20 s fault",
        throttled.len()
    );
    // One poll a second would have asked about 20 times in the window; the
    // backoff (doubling from 1 s, at most 10 s) asks about 4 times. The
    // upper bound is safe under load (a slower agent asks less often); the
    // lower one, two requests in 20 s, is a hang bound: the second comes
    // some 2 s after the first.
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

/// A report deleted by hand while its event is listed is written again by
/// its agent (it watches its own reports), with the same view: the
/// controller would otherwise lose that node's own word.
#[tokio::test(flavor = "multi_thread")]
async fn a_report_deleted_by_hand_is_written_again_by_its_agent() {
    const ID: &str = "A9000000-0000-4000-8000-000000000002";
    const NODE: &str = "dr-node-0";
    let mut rig = Rig::start(
        "deleted-report",
        &format!(
            "vms: [{{name: dr_0}}]\nevents:\n  - {{id: {ID}, type: Reboot, resources: [dr_0], at: 0s, notice: 1h}}\n"
        ),
        &[ID],
    )
    .await;
    rig.agent(NODE, "dr_0", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    let first = rig
        .wait_report(ID, NODE, "Scheduled", Duration::from_secs(10))
        .await;
    let old = rig.report(ID, NODE).await.expect("the report");
    let name = report_name(ID, NODE);
    rig.reports
        .delete(&name, &Default::default())
        .await
        .expect("delete the report");
    let deleted = Instant::now();
    let old_uid = &old.metadata.uid;
    let again = rig
        .wait_for("the deleted report written again", HANG, || async {
            rig.report(ID, NODE)
                .await
                .filter(|r| r.metadata.uid != *old_uid)
        })
        .await;
    println!(
        "report written again {:.2} s after it was deleted",
        deleted.elapsed().as_secs_f64()
    );
    assert_eq!(again.spec.report, first, "the view changed");
    rig.stop().await;
}

/// A document whose `Events` is `null` (or missing) is a parse error: the
/// agent counts and logs it with its bytes and keeps the last good state;
/// it never takes it as "no events" and reports the event gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_document_with_null_events_is_a_parse_error_not_no_events() {
    const ID: &str = "A9000000-0000-4000-8000-000000000001";
    const NODE: &str = "ne-node-0";
    let mut rig = Rig::start(
        "null-events",
        &format!(
            "vms: [{{name: ne_0}}]\nevents:\n  - {{id: {ID}, type: Reboot, resources: [ne_0], at: 0s, notice: 1h}}\nfaults:\n  - {{at: 3s, for: 6s, kind: nullEvents}}\n"
        ),
        &[ID],
    )
    .await;
    let a = rig.agent(NODE, "ne_0", &[]).await;
    rig.ready().await;
    rig.start_clock().await;
    // The mock's clock started before this reading, so its fault (3 s to
    // 9 s) is over by then.
    let fault_over = Utc::now() + chrono::TimeDelta::seconds(9);
    rig.wait_report(ID, NODE, "Scheduled", HANG).await;
    // Through the fault and past it, the report stays Scheduled in its
    // first appearance (a "no events" reading would report it Completed,
    // and its return a second appearance). Past it: the agent has polled
    // twice since the fault ended (waited for, not assumed after a sleep).
    rig.wait_for("two polls after the fault", HANG, || async {
        let after = rig
            .requests("ne_0")
            .await
            .iter()
            .filter(|r| r.arrived >= fault_over && r.answered.is_some())
            .count();
        (after >= 2).then_some(())
    })
    .await;
    let report = rig.report(ID, NODE).await.unwrap().spec.report;
    assert_eq!(
        (report.event_status, report.appearance),
        (forewarn::api::EventStatus::Scheduled, 1),
        "{report:?}"
    );
    let m = rig.metrics(a).await;
    let parse_errors: f64 = m
        .lines()
        .filter(|l| l.starts_with("forewarn_agent_imds_polls_total") && l.contains("parse_error"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    // The fault was read and counted: at least once (how many of its
    // 6 s of polls the agent made depends on the load, not on the product).
    assert!(parse_errors >= 1.0, "{m}");
    let log = rig.agent_log(a);
    assert!(
        log.contains("`Events` is missing or null") && log.contains("\\\"Events\\\": null"),
        "{log}"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connection_refused_is_kept_in_the_log() {
    const NODE: &str = "rf-node-0";
    let mut rig = Rig::start("refused", "vms: [{name: rf_0}]\n", &[]).await;
    // Nothing listens on this port.
    let port = free_port().unwrap();
    let a = rig
        .agent_at(NODE, &format!("http://127.0.0.1:{port}/vm/rf_0"), &[])
        .await;
    rig.wait_for("the refusal in the log", HANG, || async {
        rig.agent_log(a)
            .to_lowercase()
            .contains("connection refused")
            .then_some(())
    })
    .await;
    // Without IMDS, nothing to report.
    let mine = rig.reports_of(NODE).await;
    assert!(mine.is_empty(), "{mine:?}");
    rig.stop().await;
}

/// IMDS answering 10 s late on one node (fault `slow` for its VM) holds
/// back only that node's agent: the other agent reports its event first
/// and polls on while the slow node's requests are outstanding; the slow
/// one, whose IMDS timeout is above the delay, reports its event once IMDS
/// answers, and its `/healthz` stays 200 all along (its poll loop is slow,
/// not stuck). Judged by order (the API server's creation times, the
/// mock's request log), not by how many seconds anything took.
#[tokio::test(flavor = "multi_thread")]
async fn imds_answering_after_ten_seconds_on_one_node_leaves_the_others_unaffected() {
    const SLOW: &str = "A9000000-0000-4000-8000-000000000031";
    const FAST: &str = "A9000000-0000-4000-8000-000000000032";
    let mut rig = Rig::start(
        "slow-imds",
        &format!(
            "vms: [{{name: sl_0}}, {{name: sl_1}}]\nevents:\n  - {{id: {SLOW}, type: Reboot, resources: [sl_0], at: 2s, notice: 1h, deliverTo: resources}}\n  - {{id: {FAST}, type: Reboot, resources: [sl_1], at: 2s, notice: 1h, deliverTo: resources}}\nfaults:\n  - {{at: 0s, for: 60s, kind: slow, delay: 10s, vms: [sl_0]}}\n"
        ),
        &[SLOW, FAST],
    )
    .await;
    let slow = rig
        .agent("sl-node-0", "sl_0", &["--imds-timeout", "15s"])
        .await;
    rig.agent("sl-node-1", "sl_1", &[]).await;
    rig.ready().await;
    let started = rig.start_clock().await;
    let mut health = Vec::new();
    let mut fast_at = None;
    while started.elapsed() < HANG {
        let h = rig
            .http
            .get(format!("http://127.0.0.1:{}/healthz", rig.agents[slow].1))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .ok();
        health.push(h);
        if fast_at.is_none() && rig.report(FAST, "sl-node-1").await.is_some() {
            fast_at = Some(started.elapsed());
        }
        if fast_at.is_some() && rig.report(SLOW, "sl-node-0").await.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let fast_at = fast_at.expect("the fast node's event was never reported");
    println!("fast node's event reported {fast_at:?} after the start (listed at 2 s)");
    let r = rig.wait_report(SLOW, "sl-node-0", "Scheduled", HANG).await;
    assert_eq!(r.vm, "sl_0");
    // The fast node's report was created first, by the API server's clock:
    // the slow node's first answer listing its event comes some 10 s after
    // the fast node's (the delay), so only a fast agent held back by the
    // slow IMDS, or stalled for those 10 s, is not first. Whole seconds:
    // strictly earlier.
    let created = |id: &'static str, node: &'static str| {
        let rig = &rig;
        async move {
            rig.report(id, node)
                .await
                .and_then(|r| r.metadata.creation_timestamp)
                .expect("the report")
                .0
        }
    };
    let (fast_created, slow_created) = (
        created(FAST, "sl-node-1").await,
        created(SLOW, "sl-node-0").await,
    );
    assert!(
        fast_created < slow_created,
        "the fast node's report (created {fast_created}) waited for the slow IMDS (created {slow_created})"
    );
    println!(
        "slow node's event reported {:?} after the start",
        started.elapsed()
    );
    assert!(
        health.iter().all(|h| *h == Some(200)),
        "the slow agent's /healthz: {health:?}"
    );
    // The fast agent polled on meanwhile: while one of the slow VM's
    // requests was outstanding (10 s), the fast VM's IMDS got several of
    // its polls (nominally ten; two is a bound only an agent stalled for
    // 5 s of the 10 misses). The interval itself is a speed figure, not
    // checked here.
    let polls: Vec<DateTime<Utc>> = rig
        .requests("sl_1")
        .await
        .into_iter()
        .map(|r| r.arrived)
        .collect();
    let slow_polls = rig.requests("sl_0").await;
    let during = slow_polls
        .iter()
        .filter_map(|s| Some((s.arrived, s.answered?)))
        .map(|(from, to)| polls.iter().filter(|t| **t > from && **t < to).count())
        .max()
        .unwrap_or(0);
    assert!(
        during >= 2,
        "fast agent: {during} polls during the slow VM's longest outstanding request; all polls: {polls:?}\nslow: {slow_polls:?}"
    );
    // The slow VM's requests were answered 10 s late, so its agent polled
    // rarely (it waits for each answer); none was abandoned.
    assert!(
        slow_polls
            .iter()
            .filter(|r| r
                .answered
                .is_some_and(|a| (a - r.arrived).num_seconds() >= 9))
            .count()
            >= 1,
        "{slow_polls:?}"
    );
    rig.stop().await;
}
