//! End-to-end test of the operators' webhooks on a real
//! local control plane: the real controller, given a webhooks file, POSTs
//! to receivers this test serves on loopback. Checked is what the
//! receivers got (bodies, order, retries), against the IMDS mock's log and
//! the controller's own `/metrics` and logs. It fails, never skips, when
//! the cluster cannot start.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use forewarn_harness::cluster::{Cluster, repo_root};
use forewarn_harness::options::RunOptions;
use forewarn_harness::report::{Report, summary};
use forewarn_harness::run::run_scenario;
use forewarn_harness::workload::pinned_deployment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

fn cluster() -> Cluster {
    forewarn_harness::cluster::shared(
        &std::env::var("FOREWARN_WEBHOOKS_CLUSTER").unwrap_or_else(|_| "forewarn-webhooks".into()),
        3,
    )
}

const EVENT: &str = "9B4E2D10-3C5A-4F7B-8E61-0A2B3C4D5E71";
/// The secret part of every URL: it must never reach a log.
const TOKEN: &str = "T0KEN-b4d5e6f7a8";

/// One request a receiver got.
#[derive(Debug, Clone)]
struct Got {
    at: DateTime<Utc>,
    path: String,
    /// The body parsed as JSON, or as a JSON string when it is not JSON.
    body: Value,
    content_type: String,
    answered: u16,
}

#[derive(Default)]
struct Receiver {
    got: Mutex<Vec<Got>>,
}

/// `/json/<token>` answers 503 to its first request, then 200; `/reject`
/// always 400; the others 200.
async fn receive(
    State(r): State<Arc<Receiver>>,
    Path(path): Path<String>,
    headers: axum::http::HeaderMap,
    body: String,
) -> StatusCode {
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = serde_json::from_str(&body).unwrap_or(Value::String(body));
    let mut got = r.got.lock().unwrap();
    let first_here = !got.iter().any(|g| g.path == path);
    let answered = if path.starts_with("reject") {
        400
    } else if path.starts_with("json") && first_here {
        503
    } else {
        200
    };
    got.push(Got {
        at: Utc::now(),
        path,
        body,
        content_type,
        answered,
    });
    StatusCode::from_u16(answered).unwrap()
}

/// The blocker of a notification's body that names the budget shop/stuck.
fn names_stuck(body: &Value) -> Option<Value> {
    body["blockers"]
        .as_array()?
        .iter()
        .find(|b| {
            b["podDisruptionBudgets"]
                .as_array()
                .is_some_and(|p| p.contains(&json!("shop/stuck")))
        })
        .cloned()
}

fn deliveries(report: &Report, webhook: &str, notification: &str, result: &str) -> f64 {
    report
        .metric(
            "controller",
            &format!(
                "forewarn_controller_webhook_deliveries_total{{notification=\"{notification}\",result=\"{result}\",webhook=\"{webhook}\"}}"
            ),
        )
        .unwrap_or(0.0)
}

/// The Redeploy's drain is blocked by a PodDisruptionBudget until the test
/// relaxes it (once the webhooks were told it is blocked and the rewritten
/// webhooks file is in force), then it is drained, approved, started and
/// over; a node of no event restarts meanwhile (its `bootID` changes just
/// before the budget is relaxed). The JSON webhook gets all six
/// notifications, in the order of the event's life, the first retried
/// after a 503; the Slack and Teams webhooks only
/// those they asked for, in their formats; a webhook with its own body
/// template (a PagerDuty Events API v2 body) gets a trigger while the drain
/// is blocked and a resolve once it is over, and one with a `text/plain`
/// template gets that `Content-Type`; a 400 is not retried; every
/// outcome is counted; the URL's token reaches no log.
#[tokio::test(flavor = "multi_thread")]
async fn each_step_of_an_event_reaches_the_webhooks_in_order_retried_and_counted() {
    let receiver = Arc::new(Receiver::default());
    let app = axum::Router::new()
        .route("/{*path}", axum::routing::post(receive))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let cluster = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked");
    let client = cluster.client().await.expect("client");
    // The baseline bootID of a node no event affects; it changes at 8 s.
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .patch_status(
            "node-000000",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": "wh-boot-before"}}})),
        )
        .await
        .expect("set the bootID");

    let mut opts = RunOptions::new(
        repo_root().join("tests/fixtures/webhooks-blocked.yaml"),
        PathBuf::from(env!("CARGO_BIN_EXE_forewarn")),
    );
    // A hang bound: the scenario is over about 20 s after its start.
    opts.timeout = Duration::from_secs(240);
    let file = std::env::temp_dir().join(format!("forewarn-webhooks-{}.yaml", std::process::id()));
    // An Events API v2 body (PagerDuty's shape): a trigger while the drain
    // is blocked, a resolve once the event is over, one alert per event.
    let pagerduty = indent(
        r#"{"routing_key": "R0UT1NG-KEY",
 "event_action": {{ ("resolve" if notification == "Completed" else "trigger")|tojson }},
 "dedup_key": {{ event.eventId|tojson }},
 "payload": {
   "summary": {{ summary|tojson }},
   "source": {{ cluster|tojson }},
   "severity": {{ ("info" if notification == "Completed" else "warning")|tojson }},
   "timestamp": {{ time|tojson }},
   "custom_details": {"nodes": {{ nodes|tojson }}, "blockers": {{ blockers|tojson }},
                      "phase": {{ event.phase|default(none)|tojson }}}}}"#,
    );
    let webhooks = format!(
        "cluster: test-cluster\n\
         webhooks:\n\
         - {{name: json, url: '{base}/json/{TOKEN}', maxAttempts: 3}}\n\
         - {{name: slack, url: '{base}/slack/{TOKEN}', format: Slack, notifications: [DrainBlocked, Completed]}}\n\
         - {{name: teams, url: '{base}/teams/{TOKEN}', format: Teams, notifications: [Approved]}}\n\
         - {{name: reject, url: '{base}/reject/{TOKEN}', notifications: [Received]}}\n\
         - name: pagerduty\n  url: '{base}/pagerduty/{TOKEN}'\n  notifications: [DrainBlocked, Completed]\n  template: |\n{pagerduty}\n\
         - {{name: text, url: '{base}/text/{TOKEN}', notifications: [Approved], contentType: text/plain, template: '{{{{ title }}}}'}}\n"
    );
    std::fs::write(&file, &webhooks).expect("write the webhooks file");
    // Once the JSON webhook accepted Received, the file gains a webhook
    // `late` for Completed (written whole, then renamed in, as a Secret
    // volume swaps it): the running controller must put it in force by
    // itself. The event's drain stays blocked until the controller logged
    // that it did and the JSON webhook was told the drain is blocked by
    // shop/stuck; then node-000000 restarts and the budget is relaxed. So
    // each step follows the one it needs, however slow the machine.
    let controller_log = opts.log_dir.join("controller.log");
    let rewrite = tokio::spawn({
        let (receiver, file, client) = (receiver.clone(), file.clone(), client.clone());
        let late = format!(
            "{webhooks}- {{name: late, url: '{base}/late/{TOKEN}', notifications: [Completed]}}\n"
        );
        async move {
            let json_got = |accepts: &dyn Fn(&Got) -> bool| {
                receiver
                    .got
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|g| g.path.starts_with("json/") && accepts(g))
            };
            while !json_got(&|g| g.answered == 200) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let next = file.with_extension("next");
            std::fs::write(&next, late).expect("write the new webhooks file");
            std::fs::rename(&next, &file).expect("swap the webhooks file");
            let rewritten = Utc::now();
            // (The controller's log is written afresh when it starts, and
            // it has started: the JSON webhook got its Received.)
            while !std::fs::read_to_string(&controller_log)
                .unwrap_or_default()
                .contains("Webhooks file changed: the new webhooks are in force")
                || !json_got(&|g| {
                    g.body["notification"] == "DrainBlocked" && names_stuck(&g.body).is_some()
                })
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
                .patch_status(
                    "node-000000",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": "wh-boot-after"}}})),
                )
                .await
                .expect("restart node-000000");
            Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(client, "shop")
                .patch(
                    "stuck",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"minAvailable": 0}})),
                )
                .await
                .expect("relax the budget");
            rewritten
        }
    });
    opts.extra_env = vec![(
        "FOREWARN_WEBHOOKS_FILE".into(),
        file.to_string_lossy().into_owned(),
    )];
    opts.extra_objects = vec![
        pinned_deployment("stuck", 2, 2, "node-000001"),
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "stuck"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "stuck"}}},
        }),
    ];
    let report = run_scenario(&cluster, &opts)
        .await
        .unwrap_or_else(|e| panic!("could not run: {e:#}"));
    println!("{}\n{}", report.timeline.join("\n"), summary(&report));
    assert!(
        report.ok(),
        "{}\n{}",
        report.timeline.join("\n"),
        summary(&report)
    );
    // The controller has stopped (it delivers what it queued first): wait
    // until the receivers hold the event's Completed where it is due, a
    // hang bound (they are normally there already; a missing one fails the
    // checks below).
    let completed_everywhere = || {
        let got = receiver.got.lock().unwrap();
        ["json/", "slack/", "late/", "pagerduty/"]
            .iter()
            .all(|path| {
                got.iter().any(|g| {
                    g.path.starts_with(path)
                        && g.answered == 200
                        && (g.body["notification"] == "Completed"
                            || g.body["event_action"] == "resolve"
                            || g.body["text"]
                                .as_str()
                                .is_some_and(|t| t.contains(": event over: ")))
                })
            })
    };
    let by = std::time::Instant::now() + Duration::from_secs(60);
    while !completed_everywhere() && std::time::Instant::now() < by {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = receiver.got.lock().unwrap().clone();
    for g in &got {
        println!("{} {} {} {}", g.at, g.path, g.answered, g.body);
    }
    let at = |path: &str| -> Vec<Got> {
        got.iter()
            .filter(|g| g.path.starts_with(path))
            .cloned()
            .collect()
    };

    // JSON: the event's five notifications in order, each once accepted;
    // the first (Received) sent twice, after a 503.
    let json_got = at("json/");
    assert!(json_got.iter().all(|g| g.path == format!("json/{TOKEN}")));
    let ours: Vec<&Got> = json_got
        .iter()
        .filter(|g| g.body["event"]["eventId"] == EVENT)
        .collect();
    // (The run's own workload has a PodDisruptionBudget too, which may
    // block an eviction for a moment: DrainBlocked may come more than once.)
    let mut kinds: Vec<(&str, u16)> = ours
        .iter()
        .map(|g| (g.body["notification"].as_str().unwrap(), g.answered))
        .collect();
    kinds.dedup_by(|a, b| a.0 == "DrainBlocked" && b.0 == "DrainBlocked");
    assert_eq!(
        kinds,
        [
            ("Received", 503),
            ("Received", 200),
            ("DrainBlocked", 200),
            ("Approved", 200),
            ("Started", 200),
            ("Completed", 200)
        ],
        "{ours:#?}"
    );
    let received = &ours[1].body;
    assert_eq!(received["apiVersion"], "forewarn.dev/v1");
    assert_eq!(received["cluster"], "test-cluster");
    assert_eq!(received["event"]["type"], "Redeploy");
    assert_eq!(
        received["event"]["resources"],
        json!(["aks-nodepool1-27351046-vmss_1"])
    );
    assert_eq!(ours[0].body, ours[1].body, "the retry sends the same body");
    let by_stuck = ours
        .iter()
        .filter(|g| g.body["notification"] == "DrainBlocked")
        .find_map(|g| names_stuck(&g.body))
        .unwrap_or_else(|| panic!("no DrainBlocked names shop/stuck: {ours:#?}"));
    assert_eq!(by_stuck["node"], "node-000001", "{by_stuck}");
    assert!(
        by_stuck["pods"].as_array().is_some_and(|p| p
            .iter()
            .any(|p| p.as_str().unwrap().starts_with("shop/stuck-"))),
        "{by_stuck}"
    );
    let approved = ours
        .iter()
        .find(|g| g.body["notification"] == "Approved")
        .expect("Approved");
    let completed = ours.last().expect("Completed");
    // Approved is IMDS's acceptance: after the mock logged the POST.
    let approved_at = report
        .approvals
        .iter()
        .find(|a| a.event_id.eq_ignore_ascii_case(EVENT))
        .map(|a| a.time)
        .expect("the mock logged no approval");
    assert!(
        approved.at >= approved_at,
        "Approved told at {} before IMDS got it at {approved_at}",
        approved.at
    );
    assert_eq!(completed.body["event"]["phase"], "Completed");
    // The restart of node-000000, outside any event.
    let restart: Vec<&Got> = json_got
        .iter()
        .filter(|g| g.body["notification"] == "UnexpectedRestart")
        .collect();
    assert_eq!(restart.len(), 1, "{json_got:#?}");
    assert_eq!(restart[0].body["nodes"], json!(["node-000000"]));
    assert_eq!(
        restart[0].body["bootId"],
        json!({"old": "wh-boot-before", "new": "wh-boot-after"})
    );

    // Slack: only DrainBlocked and Completed, as mrkdwn text.
    let slack: Vec<String> = at("slack/")
        .iter()
        .map(|g| g.body["text"].as_str().expect("a text body").to_string())
        .collect();
    assert!(slack.len() >= 2, "{slack:#?}");
    assert!(
        slack[0].starts_with(&format!(
            "*forewarn [test-cluster]: drain blocked: Redeploy {EVENT}*"
        )),
        "{slack:#?}"
    );
    assert!(slack.iter().any(|t| t.contains("shop/stuck")), "{slack:#?}");
    assert!(
        slack[..slack.len() - 1]
            .iter()
            .all(|t| t.contains(": drain blocked: ")),
        "{slack:#?}"
    );
    assert!(
        slack[slack.len() - 1].starts_with(&format!(
            "*forewarn [test-cluster]: event over: Redeploy {EVENT}*"
        )),
        "{slack:#?}"
    );
    // Teams: only Approved, as an Adaptive Card.
    let teams = at("teams/");
    assert_eq!(teams.len(), 1, "{teams:#?}");
    let card = &teams[0].body["attachments"][0];
    assert_eq!(
        card["contentType"],
        "application/vnd.microsoft.card.adaptive"
    );
    assert_eq!(card["content"]["type"], "AdaptiveCard");
    // PagerDuty: triggers while the drain is blocked, then the resolve,
    // one alert (the EventId); the bodies as the Events API v2 has them.
    let pd = at("pagerduty/");
    assert!(pd.len() >= 2, "{pd:#?}");
    for g in &pd {
        assert_eq!(g.content_type, "application/json", "{g:?}");
        assert_eq!(g.body["routing_key"], "R0UT1NG-KEY", "{g:?}");
        assert_eq!(g.body["dedup_key"], EVENT, "{g:?}");
        assert_eq!(g.body["payload"]["source"], "test-cluster", "{g:?}");
    }
    let (resolve, triggers) = pd.split_last().unwrap();
    assert!(
        triggers.iter().all(|g| g.body["event_action"] == "trigger"
            && g.body["payload"]["severity"] == "warning"
            && g.body["payload"]["custom_details"]["phase"] == "Draining"),
        "{pd:#?}"
    );
    let pd_stuck = triggers
        .iter()
        .find_map(|g| names_stuck(&g.body["payload"]["custom_details"]))
        .unwrap_or_else(|| panic!("no trigger names shop/stuck: {pd:#?}"));
    assert_eq!(pd_stuck, by_stuck);
    assert_eq!(resolve.body["event_action"], "resolve", "{pd:#?}");
    assert_eq!(resolve.body["payload"]["severity"], "info");
    assert_eq!(
        resolve.body["payload"]["custom_details"]["phase"],
        "Completed"
    );
    assert_eq!(
        resolve.body["payload"]["summary"], completed.body["summary"],
        "the resolve carries the Completed message's summary"
    );
    assert_eq!(resolve.body["payload"]["timestamp"], completed.body["time"]);
    assert_eq!(
        resolve.body["payload"]["custom_details"]["nodes"],
        json!(["node-000001"])
    );
    // A text/plain template: the header says so, the body is the title.
    let text = at("text/");
    assert_eq!(text.len(), 1, "{text:#?}");
    assert_eq!(text[0].content_type, "text/plain");
    assert_eq!(
        text[0].body,
        json!(format!(
            "forewarn [test-cluster]: approved: Redeploy {EVENT}"
        ))
    );
    // A 400 is not retried.
    assert_eq!(at("reject/").len(), 1, "{:#?}", at("reject/"));
    // The webhook added to the file mid-run got the event's Completed, and
    // the reload was counted once, refused never.
    assert!(
        rewrite.is_finished(),
        "the budget was never relaxed by the test (the file rewritten, put in force and the drain told blocked?)"
    );
    let rewritten = rewrite.await.expect("the rewrite");
    let late: Vec<(String, Value)> = at("late/")
        .into_iter()
        .map(|g| {
            (
                g.body["notification"].as_str().unwrap_or_default().into(),
                g.body["event"]["eventId"].clone(),
            )
        })
        .collect();
    println!("webhooks file rewritten at {rewritten}");
    assert_eq!(late, [("Completed".to_string(), json!(EVENT))], "{late:#?}");
    assert_eq!(
        report.metric(
            "controller",
            "forewarn_controller_webhooks_reloads_total{result=\"loaded\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        report.metric("controller", "forewarn_controller_webhooks_file_refused"),
        Some(0.0)
    );

    // The controller counted each outcome.
    assert_eq!(deliveries(&report, "json", "Received", "retried"), 1.0);
    assert_eq!(deliveries(&report, "json", "Received", "delivered"), 1.0);
    assert_eq!(
        deliveries(&report, "json", "UnexpectedRestart", "delivered"),
        1.0
    );
    assert_eq!(deliveries(&report, "reject", "Received", "rejected"), 1.0);
    assert!(deliveries(&report, "slack", "DrainBlocked", "delivered") >= 1.0);
    assert_eq!(deliveries(&report, "teams", "Approved", "delivered"), 1.0);
    assert_eq!(deliveries(&report, "text", "Approved", "delivered"), 1.0);
    assert_eq!(
        deliveries(&report, "pagerduty", "Completed", "delivered"),
        1.0
    );
    assert_eq!(deliveries(&report, "json", "Received", "failed"), 0.0);

    // The URLs' token is in no log of the run.
    let mut logs = 0;
    for entry in std::fs::read_dir(&report.log_dir).expect("the run's logs") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "log") {
            logs += 1;
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                !text.contains(TOKEN),
                "{} shows a webhook URL",
                path.display()
            );
        }
    }
    assert!(logs > 0, "no log in {}", report.log_dir.display());
    let _ = std::fs::remove_file(file);
}

/// `text` indented by four spaces: a YAML block scalar's lines.
fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
