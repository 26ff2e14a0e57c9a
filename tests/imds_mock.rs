//! The IMDS client against `forewarn imds-mock`'s server, in process on
//! loopback: the request rules real IMDS enforces, approval, incarnations.

use std::time::Duration;

use forewarn::imds::client::Client;
use forewarn::imds::mock::{LogEntry, Mock};
use forewarn::imds::model::{EventStatus, EventType};
use forewarn::imds::scenario::Scenario;

const SCENARIO: &str = r#"
vms:
  - {name: vmss_0}
  - {name: vmss_1}
events:
  - id: AAAAAAAA-0000-4000-8000-000000000001
    type: Redeploy
    resources: [vmss_1]
    at: 0s
    notice: 10m
    runFor: 1h
  - id: BBBBBBBB-0000-4000-8000-000000000002
    type: Reboot
    resources: [vmss_1]
    at: 0s
    status: Started
    runFor: 1h
    deliverTo: resources
"#;

/// The client timeout of the tests that do not test timeouts: the mock on
/// loopback answers at once, so it only ends a hang, however loaded the
/// machine.
const PATIENT: Duration = Duration::from_secs(30);

/// The client timeout of the tests that do: long enough that an in-process
/// answer with no delay beats it even on a loaded machine (it comes within
/// milliseconds; only a stall of seconds misses it), short enough to keep
/// the tests quick.
const SHORT: Duration = Duration::from_secs(5);

async fn serve(scenario: &str) -> String {
    let mock = Mock::new(Scenario::parse(scenario).unwrap(), false);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, mock.router()).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test]
async fn client_reads_the_placement_groups_events_per_vm() {
    let base = serve(SCENARIO).await;
    let vm0 = Client::new(&format!("{base}/vm/vmss_0"), PATIENT).unwrap();
    let vm1 = Client::new(&format!("{base}/vm/vmss_1"), PATIENT).unwrap();
    let d0 = vm0.fetch_events().await.unwrap();
    let d1 = vm1.fetch_events().await.unwrap();
    assert_eq!(d0.events.len(), 1, "vmss_0 sees only the group-wide event");
    assert_eq!(d1.events.len(), 2);
    let redeploy = &d1.events[0];
    assert_eq!(redeploy.event_type, EventType::Redeploy);
    assert_eq!(redeploy.event_status, EventStatus::Scheduled);
    assert!(redeploy.not_before.is_some());
    let reboot = &d1.events[1];
    assert_eq!(reboot.event_status, EventStatus::Started);
    assert_eq!(reboot.not_before, None, "NotBefore is empty once started");
    assert_eq!(vm1.fetch_compute().await.unwrap().name, "vmss_1");
}

#[tokio::test]
async fn approval_starts_the_event_and_bumps_the_incarnation() {
    let base = serve(SCENARIO).await;
    let vm0 = Client::new(&format!("{base}/vm/vmss_0"), PATIENT).unwrap();
    let before = vm0.fetch_events().await.unwrap();
    let unchanged = vm0.fetch_events().await.unwrap();
    assert_eq!(before.incarnation, unchanged.incarnation);
    // An unchanged document comes as the same bytes (the agent skips
    // parsing those).
    let body = vm0.fetch_events_body().await.unwrap();
    assert_eq!(body, vm0.fetch_events_body().await.unwrap());
    let id = before.events[0].event_id.clone();
    vm0.approve(std::slice::from_ref(&id)).await.unwrap();
    vm0.approve(std::slice::from_ref(&id)).await.unwrap(); // idempotent, like Azure
    let after_body = vm0.fetch_events_body().await.unwrap();
    assert_ne!(after_body, body, "the approval changed the document");
    let after = forewarn::imds::client::parse_events(&after_body).unwrap();
    assert!(after.incarnation > before.incarnation);
    assert_eq!(after.events[0].event_id, id, "the EventId is kept");
    assert_eq!(after.events[0].event_status, EventStatus::Started);

    let log: Vec<LogEntry> = reqwest::get(format!("{base}/mock/log"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(log.iter().filter(|e| e.what == "Approved").count(), 2);
    assert!(log.iter().any(|e| e.what == "Started" && e.event_id == id));
}

#[tokio::test]
async fn approval_of_an_unknown_event_is_refused() {
    let base = serve(SCENARIO).await;
    let vm0 = Client::new(&format!("{base}/vm/vmss_0"), PATIENT).unwrap();
    let err = vm0.approve(&["not-an-event".into()]).await.unwrap_err();
    assert!(err.to_string().contains("400"), "{err}");
}

#[tokio::test]
async fn mock_answers_400_like_imds_without_metadata_header_or_api_version() {
    let base = serve(SCENARIO).await;
    let http = forewarn::http::client();
    let url = format!("{base}/vm/vmss_0/metadata/scheduledevents");
    let no_header = http
        .get(format!("{url}?api-version=2020-07-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(no_header.status(), 400);
    let no_version = http
        .get(&url)
        .header("Metadata", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(no_version.status(), 400);
    let forwarded = http
        .get(format!("{url}?api-version=2020-07-01"))
        .header("Metadata", "true")
        .header("X-Forwarded-For", "10.0.0.1")
        .send()
        .await
        .unwrap();
    assert_eq!(forwarded.status(), 400);
    let ok = http
        .get(format!("{url}?api-version=2020-07-01"))
        .header("Metadata", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn garbage_500_and_hang_are_errors_not_panics() {
    let base = serve(
        r#"
vms: [{name: a}, {name: b}, {name: c}]
faults:
  - {at: 0s, for: 1h, kind: garbage, vms: [a]}
  - {at: 0s, for: 1h, kind: status500, vms: [b]}
  - {at: 0s, for: 1h, kind: hang, vms: [c]}
"#,
    )
    .await;
    let client = |vm: &str, timeout| Client::new(&format!("{base}/vm/{vm}"), timeout).unwrap();
    // Garbage and 500 come at once: a patient client, so that a loaded
    // machine cannot turn them into timeouts.
    let garbage = client("a", PATIENT).fetch_events().await.unwrap_err();
    assert!(garbage.to_string().contains("failed to parse"), "{garbage}");
    let status = client("b", PATIENT).fetch_events().await.unwrap_err();
    assert!(status.to_string().contains("500"), "{status}");
    // The hang lasts an hour: a client that honours its 500 ms timeout
    // gives up within it; 60 s is a hang bound, reached only when the
    // timeout is not applied.
    let hang = tokio::time::timeout(
        Duration::from_secs(60),
        client("c", Duration::from_millis(500)).fetch_events(),
    )
    .await
    .expect("timeout not honoured: still waiting for the hung IMDS after 60 s")
    .unwrap_err();
    assert!(hang.to_string().contains("failed to fetch"), "{hang}");
}

/// A server answering every scheduled events GET with `body` after `delays[i]`
/// (the last delay repeats).
async fn serve_raw(body: Vec<u8>, delays: Vec<Duration>) -> String {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let n = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/metadata/scheduledevents",
        axum::routing::get(move || {
            let body = body.clone();
            let i = n.fetch_add(1, Ordering::SeqCst);
            let d = delays[i.min(delays.len() - 1)];
            async move {
                tokio::time::sleep(d).await;
                body
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test]
async fn the_first_call_may_be_slow_but_later_ones_may_not() {
    let doc = br#"{"DocumentIncarnation":1,"Events":[]}"#.to_vec();
    // The first answer comes after the short timeout (never before it,
    // whatever the load), well within the first call's (a hang bound); the
    // second at once; the third never (an hour).
    let first = SHORT + Duration::from_secs(1);
    let never = Duration::from_secs(3600);
    let base = serve_raw(doc, vec![first, Duration::ZERO, never]).await;
    let client = Client::new(&base, SHORT)
        .unwrap()
        .with_first_timeout(Duration::from_secs(120));
    client
        .fetch_events()
        .await
        .expect("the slow first call is waited for");
    client.fetch_events().await.unwrap();
    let err = client.fetch_events().await.unwrap_err();
    assert!(err.wants_backoff(), "{err}");
    // Without the long first timeout the first slow call fails.
    let base = serve_raw(br#"{"DocumentIncarnation":1}"#.to_vec(), vec![never]).await;
    let impatient = Client::new(&base, SHORT).unwrap();
    assert!(impatient.fetch_events().await.is_err());
}

#[tokio::test]
async fn an_oversized_answer_is_refused() {
    let mut big = br#"{"DocumentIncarnation":1,"Events":[],"Pad":""#.to_vec();
    big.extend(std::iter::repeat_n(
        b'x',
        forewarn::imds::client::MAX_BODY_BYTES,
    ));
    big.extend(br#""}"#);
    let base = serve_raw(big, vec![Duration::ZERO]).await;
    let client = Client::new(&base, PATIENT).unwrap();
    let err = client.fetch_events().await.unwrap_err();
    assert!(err.to_string().contains("exceeds"), "{err}");
}

#[tokio::test]
async fn root_vm_is_served_at_the_imds_root_paths() {
    let mock =
        Mock::new(Scenario::parse(SCENARIO).unwrap(), false).with_root_vm(Some("vmss_1".into()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, mock.router()).await.unwrap() });
    let base = format!("http://{addr}");
    // The base URL an agent uses against real IMDS: no /vm/<name> prefix.
    let root = Client::new(&base, PATIENT).unwrap();
    assert_eq!(root.fetch_compute().await.unwrap().name, "vmss_1");
    let doc = root.fetch_events().await.unwrap();
    assert_eq!(doc.events.len(), 2, "vmss_1's document");
    let id = doc.events[0].event_id.clone();
    root.approve(std::slice::from_ref(&id)).await.unwrap();
    let log: Vec<LogEntry> = reqwest::get(format!("{base}/mock/log"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        log.iter()
            .any(|e| e.what == "Approved" && e.vm.as_deref() == Some("vmss_1")),
        "{log:?}"
    );
    // Without a root VM there are no root paths.
    let plain = serve(SCENARIO).await;
    let none = Client::new(&plain, PATIENT).unwrap();
    assert!(none.fetch_compute().await.is_err());
}

/// The compute document serves each VM's fault and update domain from the
/// scenario, as IMDS does: strings, at `GET /metadata/instance/compute`
/// with `Metadata: true` (400 without, as for scheduled events).
#[tokio::test]
async fn compute_document_serves_each_vms_fault_and_update_domain_as_strings() {
    let base = serve(
        "vms:\n  - {name: vmss_0, faultDomain: 2, updateDomain: 7}\n  - {name: vmss_1}\nevents: []\n",
    )
    .await;
    let http = forewarn::http::client();
    let url = |vm: &str| format!("{base}/vm/{vm}/metadata/instance/compute?api-version=2021-02-01");
    let raw: serde_json::Value = http
        .get(url("vmss_0"))
        .header("Metadata", "true")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(raw["platformFaultDomain"], "2", "{raw}");
    assert_eq!(raw["platformUpdateDomain"], "7", "{raw}");
    let bare = http.get(url("vmss_0")).send().await.unwrap();
    assert_eq!(bare.status(), reqwest::StatusCode::BAD_REQUEST);
    let vm1 = Client::new(&format!("{base}/vm/vmss_1"), PATIENT).unwrap();
    let c = vm1.fetch_compute().await.unwrap();
    assert_eq!(
        (
            c.platform_fault_domain.as_str(),
            c.platform_update_domain.as_str()
        ),
        ("0", "0"),
        "the defaults"
    );
}
