//! Leader election of `forewarn controller`, with real processes on a real
//! local control plane: never two leaders at once, a hand-over at once on
//! SIGTERM, and a leader cut off from the API server stops acting before a
//! standby may take over (the renew deadline). Leadership is read from each
//! process's own `/metrics` (`forewarn_controller_leader`) and logs, and
//! from the Lease the API server holds. They fail, never skip, when the
//! cluster cannot start.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use forewarn_harness::cluster::Cluster;
use forewarn_harness::procs::Proc;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::ResourceExt;
use kube::api::Api;

/// The bound on every wait for something that happens within seconds (a
/// process started, a replica leading, a hand-over): a hang bound. Each
/// wait ends as soon as its condition holds; only a process that stopped
/// working waits this long, whatever the load on the machine.
const HANG: Duration = Duration::from_secs(120);

/// How long a controller may take to exit on SIGTERM: a hang bound too
/// (it exits within a second or two); only one that ignores SIGTERM or
/// hangs in its shutdown takes this long.
const STOP: Duration = Duration::from_secs(60);

/// The Lease's duration, `leaseDurationSeconds` as the controller writes
/// it (the product's default).
const LEASE_DURATION: Duration = Duration::from_secs(15);

fn cluster() -> Cluster {
    forewarn_harness::cluster::shared("forewarn-leader", 1)
}

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn log_dir(name: &str) -> PathBuf {
    let dir = forewarn_harness::cluster::repo_root()
        .join("target/forewarn-runs/leader")
        .join(name);
    std::fs::create_dir_all(&dir).expect("log dir");
    dir
}

/// A controller process and its metrics port.
struct Controller {
    proc: Proc,
    port: u16,
}

async fn start_controller(
    kubeconfig: &Path,
    lease: &str,
    identity: &str,
    dir: &Path,
) -> Controller {
    let args: Vec<String> = [
        "controller",
        "--metrics-addr",
        "127.0.0.1:0",
        "--lease-namespace",
        "default",
        "--lease-name",
        lease,
        "--identity",
        identity,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    let env = [
        ("KUBECONFIG", kubeconfig.as_str()),
        ("RUST_LOG", "info,kube=warn"),
    ];
    let (mut proc, _) = Proc::spawn(
        identity,
        Path::new(env!("CARGO_BIN_EXE_forewarn")),
        &args,
        &env,
        dir,
        identity,
    )
    .expect("start controller");
    let port = proc
        .metrics_port(HANG)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    Controller { proc, port }
}

/// An HTTP client for the processes' `/metrics` on loopback. They answer
/// at once; the timeout only ends a hang (a sample that timed out would
/// read as "not leading" or fail a probe check on a loaded machine).
fn metrics_client() -> reqwest::Client {
    forewarn::http::client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client")
}

/// `Some(true)` when the process reports that it leads, `None` when its
/// metrics cannot be read.
async fn leads(http: &reqwest::Client, port: u16) -> Option<bool> {
    let text = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with("forewarn_controller_leader "))
        .map(|l| l.ends_with(" 1"))
}

/// Every holder record the API server stored for the Lease `name`, in
/// order, from the version after `from` on, until one held by `until`
/// (the last one returned). A watch from a `resourceVersion` delivers every
/// write since it, whenever it is opened: nothing is missed, however late
/// this runs. Fails after [`HANG`].
async fn records_until(
    leases: Api<Lease>,
    name: String,
    from: String,
    until: String,
) -> Vec<LeaseSpec> {
    use futures::{StreamExt, TryStreamExt};
    use kube::api::{WatchEvent, WatchParams};
    let mut seen = Vec::new();
    let follow = async {
        let params = WatchParams::default().fields(&format!("metadata.name={name}"));
        let mut stream = leases
            .watch(&params, &from)
            .await
            .expect("watch the Lease")
            .boxed();
        while let Some(event) = stream.try_next().await.expect("the Lease's watch") {
            match event {
                WatchEvent::Added(l) | WatchEvent::Modified(l) => {
                    let spec = l.spec.unwrap_or_default();
                    let done = spec.holder_identity.as_deref() == Some(until.as_str());
                    seen.push(spec);
                    if done {
                        return;
                    }
                }
                WatchEvent::Error(e) => panic!("the Lease's watch: {e:?}"),
                WatchEvent::Deleted(_) | WatchEvent::Bookmark(_) => {}
            }
        }
        panic!("the Lease's watch ended before {until} held it");
    };
    tokio::time::timeout(HANG, follow)
        .await
        .unwrap_or_else(|_| panic!("{until} did not take the Lease {name} within {HANG:?}"));
    seen
}

/// `later - earlier`, two `MicroTime`s of a Lease, as a signed duration.
fn between(
    earlier: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>,
    later: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>,
) -> k8s_openapi::jiff::SignedDuration {
    let (Some(a), Some(b)) = (earlier, later) else {
        panic!("a Lease record without its time: {earlier:?} {later:?}");
    };
    b.0.duration_since(a.0)
}

fn count_in_log(p: &Proc, needle: &str) -> usize {
    std::fs::read_to_string(&p.log)
        .unwrap_or_default()
        .matches(needle)
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_controllers_started_together_never_lead_at_once_and_hand_over_on_sigterm() {
    let _turn = TURN.lock().await;
    let cluster = tokio::task::spawn_blocking(cluster).await.expect("cluster");
    let http = metrics_client();
    let leases: Api<Lease> = Api::namespaced(cluster.client().await.unwrap(), "default");
    let mut handovers = Vec::new();
    for round in 0..20 {
        let lease = format!("together-{round}");
        let dir = log_dir(&lease);
        let mut a = start_controller(&cluster.kubeconfig, &lease, "replica-a", &dir).await;
        let mut b = start_controller(&cluster.kubeconfig, &lease, "replica-b", &dir).await;
        // Samples every 50 ms for at least 3 s (a window of observation:
        // load only lengthens it) and until one leads: never both leading.
        // One leads within a second or two; HANG is only a hang bound.
        let mut someone = false;
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(3) || !someone {
            assert!(
                began.elapsed() < HANG,
                "round {round}: no replica leads after {HANG:?} (logs in {})",
                dir.display()
            );
            let (la, lb) = (leads(&http, a.port).await, leads(&http, b.port).await);
            assert!(
                !(la == Some(true) && lb == Some(true)),
                "round {round}: both replicas lead at once (logs in {})",
                dir.display()
            );
            someone |= la == Some(true) || lb == Some(true);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let leading = count_in_log(&a.proc, "Leading: reconciling")
            + count_in_log(&b.proc, "Leading: reconciling");
        assert_eq!(
            leading, 1,
            "round {round}: {leading} replicas logged that they lead"
        );
        let held = leases.get(&lease).await.unwrap();
        let holder = held
            .spec
            .clone()
            .unwrap()
            .holder_identity
            .unwrap_or_default();
        let (leader, standby) = if leads(&http, a.port).await == Some(true) {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        assert_eq!(
            holder, leader.proc.name,
            "round {round}: the Lease names another holder"
        );
        // SIGTERM: the Lease is handed over at once, not after its 15 s.
        // Judged from the Lease's records as the API server stored them
        // (followed from the version read above), not from this test's
        // clock: the leader released it (no holder, a 1 s duration), and
        // the standby took it from that released record.
        let follow = tokio::spawn(records_until(
            leases.clone(),
            lease.clone(),
            held.resource_version().expect("resourceVersion"),
            standby.proc.name.clone(),
        ));
        leader
            .proc
            .terminate(STOP)
            .await
            .expect("leader stops on SIGTERM");
        let records = follow.await.expect("the Lease's watch");
        let (taken, before) = records.split_last().expect("a record");
        let released = before.last().unwrap_or_else(|| {
            panic!(
                "round {round}: the standby took the Lease from no released record: {records:#?}"
            )
        });
        assert!(
            released
                .holder_identity
                .as_deref()
                .unwrap_or_default()
                .is_empty()
                && released.lease_duration_seconds == Some(1),
            "round {round}: the standby did not take a released Lease: {records:#?}"
        );
        // Before the release, only the old leader (its renewals) held it.
        assert!(
            before[..before.len() - 1]
                .iter()
                .all(|r| r.holder_identity.as_deref() == Some(leader.proc.name.as_str())),
            "round {round}: another holder between the leader and the standby: {records:#?}"
        );
        assert_eq!(
            count_in_log(&leader.proc, "Released the leader-election Lease"),
            1,
            "round {round}: the leader did not log its release (logs in {})",
            dir.display()
        );
        // Taken at once from the released record, by the two processes'
        // own stamps: the standby acts on the release within its retry
        // period (2 s) or at once from its watch. An expired Lease could
        // not be taken before the 15 s duration; only a standby stalled
        // for most of those 15 s reaches it with the release.
        let gap = between(released.renew_time.as_ref(), taken.acquire_time.as_ref());
        assert!(
            gap < k8s_openapi::jiff::SignedDuration::try_from(LEASE_DURATION).unwrap(),
            "round {round}: the standby took the Lease {gap:?} after its release, as if it had waited for it to expire"
        );
        handovers.push(gap.as_secs_f64());
        // The standby says so too (a hang bound: it follows its write).
        let t = Instant::now();
        while leads(&http, standby.port).await != Some(true) {
            assert!(
                t.elapsed() < HANG,
                "round {round}: the standby holds the Lease but does not lead (logs in {})",
                dir.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        standby.proc.terminate(STOP).await.expect("standby stops");
    }
    handovers.sort_by(f64::total_cmp);
    println!(
        "20 rounds, never two leaders; the Lease taken after its release: median {:.2} s, max {:.2} s",
        handovers[handovers.len() / 2],
        handovers[handovers.len() - 1]
    );
}

/// A TCP proxy to `target` on a free loopback port, until `stop` is sent:
/// then it drops its listener and every connection at once.
async fn proxy(target: String) -> (u16, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                _ = &mut rx => break,
                accepted = listener.accept() => {
                    let Ok((mut inbound, _)) = accepted else { continue };
                    let target = target.clone();
                    conns.spawn(async move {
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                }
            }
        }
        conns.abort_all();
    });
    (port, tx)
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_cut_off_from_the_api_server_stops_before_a_standby_may_lead() {
    let _turn = TURN.lock().await;
    let cluster = tokio::task::spawn_blocking(cluster).await.expect("cluster");
    let http = metrics_client();
    let kubeconfig = std::fs::read_to_string(&cluster.kubeconfig).unwrap();
    let server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .expect("server in kubeconfig")
        .to_string();
    let (port, cut) = proxy(server.clone()).await;
    let dir = log_dir("cut-off");
    // The serving certificate names 127.0.0.1: another port is fine.
    let proxied = dir.join("kubeconfig-proxied.yaml");
    std::fs::write(
        &proxied,
        kubeconfig.replace(
            &format!("https://{server}"),
            &format!("https://127.0.0.1:{port}"),
        ),
    )
    .unwrap();
    let lease = "cut-off";
    let mut leader = start_controller(&proxied, lease, "replica-far", &dir).await;
    let deadline = Instant::now() + HANG;
    while leads(&http, leader.port).await != Some(true) {
        assert!(Instant::now() < deadline, "the proxied replica never led");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut standby = start_controller(&cluster.kubeconfig, lease, "replica-near", &dir).await;
    // A window of observation (load only lengthens it).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        leads(&http, standby.port).await,
        Some(false),
        "the standby leads while the leader is healthy"
    );

    // Every record of the Lease from here on, as the API server stores it.
    let held = leases_of(&cluster).await.get(lease).await.unwrap();
    let follow = tokio::spawn(records_until(
        leases_of(&cluster).await,
        lease.to_string(),
        held.resource_version().expect("resourceVersion"),
        standby.proc.name.clone(),
    ));
    cut.send(()).unwrap();
    let cut_at = Instant::now();
    // The first time the standby is seen leading, the cut-off leader has
    // already exited: it stops at its renew deadline (10 s after its last
    // renewal), the standby may take over only after the Lease's 15 s.
    // Checked at that sighting, which comes after the standby led, so this
    // test's own pace cannot order the two wrongly; the 5 s between them is
    // the product's margin (only a leader whose exit stalled for 5 s past
    // its deadline, a malfunction, fails it). HANG is only a hang bound.
    let mut stopped = None;
    let led = loop {
        assert!(
            cut_at.elapsed() < HANG,
            "no resolution within {HANG:?} (logs in {})",
            dir.display()
        );
        if stopped.is_none() && leader.proc.exited().is_some() {
            stopped = Some(cut_at.elapsed());
        }
        if leads(&http, standby.port).await == Some(true) {
            let led = cut_at.elapsed();
            assert!(
                leader.proc.exited().is_some(),
                "the standby led at {led:?}, while the cut-off leader still ran (logs in {})",
                dir.display()
            );
            break led;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "cut off at 0 s: the old leader was seen stopped at {stopped:?}, the standby led at {led:?}"
    );
    // The Lease: the standby's acquiring record directly follows the cut-off
    // leader's last renewal, and was stamped at least the Lease's duration
    // after it (both processes' own clocks, as stored): a lower bound, which
    // load can only widen.
    // The record read before the cut comes first: the leader may have
    // renewed no more between that read and the cut.
    let records: Vec<LeaseSpec> = std::iter::once(held.spec.clone().unwrap_or_default())
        .chain(follow.await.expect("the Lease's watch"))
        .collect();
    let (taken, before) = records.split_last().expect("a record");
    let last = before.last().expect("the leader's last renewal");
    assert_eq!(
        last.holder_identity.as_deref(),
        Some("replica-far"),
        "{records:#?}"
    );
    let gap = between(last.renew_time.as_ref(), taken.acquire_time.as_ref());
    println!("the standby took the Lease {gap:?} after the cut-off leader's last renewal");
    assert!(
        gap >= k8s_openapi::jiff::SignedDuration::try_from(LEASE_DURATION).unwrap(),
        "the standby took the Lease {gap:?} after the leader's last renewal, within its duration: {records:#?}"
    );
    assert!(
        count_in_log(&leader.proc, "renew deadline") >= 1,
        "the old leader did not stop for its renew deadline:\n{}",
        leader.proc.log_tail(10)
    );
    standby.proc.terminate(STOP).await.expect("standby stops");
}

/// The Leases of `default` on `cluster`.
async fn leases_of(cluster: &Cluster) -> Api<Lease> {
    Api::namespaced(cluster.client().await.unwrap(), "default")
}

/// Writes the Lease `name` as held by `holder`, renewed at `renew`.
async fn write_holder(
    leases: &Api<Lease>,
    name: &str,
    holder: &str,
    renew: k8s_openapi::jiff::Timestamp,
) {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let spec = LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(15),
        acquire_time: Some(MicroTime(renew)),
        renew_time: Some(MicroTime(renew)),
        ..LeaseSpec::default()
    };
    match leases.get_opt(name).await.expect("read Lease") {
        Some(mut lease) => {
            lease.spec = Some(spec);
            leases
                .replace(name, &kube::api::PostParams::default(), &lease)
                .await
                .expect("renew the Lease");
        }
        None => {
            let lease = Lease {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            leases
                .create(&kube::api::PostParams::default(), &lease)
                .await
                .expect("create the Lease");
        }
    }
}

/// A leader whose clock is an hour behind still renews every 2 s: its
/// `renewTime` looks an hour old, and a standby that judged expiry by
/// comparing it with its own clock would take over (two leaders). Then it
/// dies with a clock an hour ahead: a standby trusting `renewTime` would
/// wait an hour. Expiry counted on the standby's own clock from the last
/// change it saw gets both right.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_with_a_skewed_clock_keeps_the_lease_while_it_renews_and_loses_it_after_its_duration()
 {
    let _turn = TURN.lock().await;
    let cluster = tokio::task::spawn_blocking(cluster).await.expect("cluster");
    let http = metrics_client();
    let leases: Api<Lease> = Api::namespaced(cluster.client().await.unwrap(), "default");
    let lease = "skewed";
    let hour = k8s_openapi::jiff::SignedDuration::from_hours(1);
    let dir = log_dir(lease);
    write_holder(
        &leases,
        lease,
        "ghost-behind",
        k8s_openapi::jiff::Timestamp::now() - hour,
    )
    .await;
    let mut standby = start_controller(&cluster.kubeconfig, lease, "replica-honest", &dir).await;
    // 20 s of renewals from a clock an hour behind: the standby never leads
    // (a window of observation: load only lengthens it). The renewals come
    // every 2 s against the Lease's 15 s: only this test stalling for some
    // 13 s would let the Lease expire.
    let end = Instant::now() + Duration::from_secs(20);
    let mut next_renewal = Instant::now();
    while Instant::now() < end {
        if Instant::now() >= next_renewal {
            write_holder(
                &leases,
                lease,
                "ghost-behind",
                k8s_openapi::jiff::Timestamp::now() - hour,
            )
            .await;
            next_renewal += Duration::from_secs(2);
        }
        assert_ne!(
            leads(&http, standby.port).await,
            Some(true),
            "the standby took a Lease that its holder keeps renewing (logs in {})",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let holder = leases
        .get(lease)
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_eq!(
        holder.as_deref(),
        Some("ghost-behind"),
        "the Lease was taken over"
    );
    // The holder's last renewal, stamped an hour ahead, then silence.
    // `silent` is read before the write is sent: the standby cannot see the
    // record earlier, so its 15 s on its own clock end after `silent` +
    // 15 s, whatever the load (a lower bound with no tolerance).
    let silent = Instant::now();
    write_holder(
        &leases,
        lease,
        "ghost-ahead",
        k8s_openapi::jiff::Timestamp::now() + hour,
    )
    .await;
    // A standby trusting the skewed `renewTime` would wait an hour; HANG
    // is a hang bound far below that hour (it takes over some 15 to 17 s
    // after the write).
    while leads(&http, standby.port).await != Some(true) {
        assert!(
            silent.elapsed() < HANG,
            "the standby did not take over within {HANG:?} of the holder's last renewal (logs in {})",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = silent.elapsed();
    println!("holder silent at 0 s (renewTime an hour ahead): the standby led at {took:?}");
    assert!(
        took >= LEASE_DURATION,
        "the standby took over {took:?} after the last renewal, before the Lease's 15 s had passed"
    );
    let holder = leases
        .get(lease)
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_eq!(holder.as_deref(), Some("replica-honest"));
    standby.proc.terminate(STOP).await.expect("standby stops");
}

/// A kubeconfig for `cluster` that impersonates `user` (in no group but
/// `system:authenticated`): what it may do is what RBAC grants `user`.
fn impersonating(cluster: &Cluster, dir: &Path, user: &str) -> PathBuf {
    let text = std::fs::read_to_string(&cluster.kubeconfig).expect("kubeconfig");
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig yaml");
    for u in doc["users"].as_sequence_mut().expect("users") {
        let entry = u["user"].as_mapping_mut().expect("user map");
        entry.insert("as".into(), user.into());
    }
    let path = dir.join(format!("kubeconfig-{}.yaml", user.replace(':', "-")));
    std::fs::write(&path, serde_yaml::to_string(&doc).expect("yaml")).expect("write");
    path
}

/// What `/readyz` and `/healthz` of the process on `port` answer.
async fn probes(http: &reqwest::Client, port: u16) -> (Option<u16>, Option<u16>) {
    let status = |path: &'static str| async move {
        http.get(format!("http://127.0.0.1:{port}/{path}"))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    };
    (status("readyz").await, status("healthz").await)
}

/// Readiness says whether the controller could act. A
/// leader with the controller's permissions turns Ready; one whose RBAC
/// lacks pods leads (its metric) but, unable to sync its pod cache, stays
/// not Ready for three times as long as the first took, while `/healthz`
/// stays 200 (its loop runs; a restart would not mend RBAC).
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_that_cannot_watch_pods_leads_but_is_never_ready() {
    let _turn = TURN.lock().await;
    let cluster = tokio::task::spawn_blocking(cluster)
        .await
        .expect("cluster start panicked");
    let dir = log_dir("readiness");
    let user = "leader-test:no-pods";
    // The controller's ClusterRole of the chart, without pods.
    let rbac = format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: leader-test-no-pods}}
rules:
  - {{apiGroups: [forewarn.dev], resources: [scheduledevents], verbs: [list, watch, create, patch, delete]}}
  - {{apiGroups: [forewarn.dev], resources: [scheduledevents/status], verbs: [patch]}}
  - {{apiGroups: [forewarn.dev], resources: [scheduledeventreports], verbs: [list, watch, delete]}}
  - {{apiGroups: [forewarn.dev], resources: [virtualmachinereports], verbs: [list, watch]}}
  - {{apiGroups: [""], resources: [nodes], verbs: [list, watch, patch]}}
  - {{apiGroups: [policy], resources: [poddisruptionbudgets], verbs: [get, list, watch]}}
  - {{apiGroups: [events.k8s.io], resources: [events], verbs: [create, patch]}}
  - {{apiGroups: [apiextensions.k8s.io], resources: [customresourcedefinitions], resourceNames: [scheduledevents.forewarn.dev, scheduledeventreports.forewarn.dev, virtualmachinereports.forewarn.dev], verbs: [get]}}
  - {{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, list, watch, create, update]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: leader-test-no-pods}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: leader-test-no-pods}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: "{user}"}}]
"#
    );
    let file = dir.join("rbac.yaml");
    std::fs::write(&file, rbac).expect("write rbac");
    cluster
        .kubectl(&["apply", "-f", &file.to_string_lossy()])
        .expect("apply rbac");
    let http = metrics_client();

    // The control: the controller's permissions (the admin's), Ready.
    let mut full = start_controller(&cluster.kubeconfig, "ready-full", "full-0", &dir).await;
    let t = Instant::now();
    loop {
        if leads(&http, full.port).await == Some(true)
            && probes(&http, full.port).await == (Some(200), Some(200))
        {
            break;
        }
        assert!(
            t.elapsed() < HANG,
            "a leader with every permission was not Ready within {HANG:?}:\n{}",
            full.proc.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = t.elapsed();
    full.proc.terminate(STOP).await.ok();

    let kubeconfig = impersonating(&cluster, &dir, user);
    let mut lame = start_controller(&kubeconfig, "ready-no-pods", "no-pods-0", &dir).await;
    let t = Instant::now();
    while leads(&http, lame.port).await != Some(true) {
        assert!(
            t.elapsed() < HANG,
            "the controller without pods never led:\n{}",
            lame.proc.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let watch = (took * 3).max(Duration::from_secs(10));
    let t = Instant::now();
    while t.elapsed() < watch {
        assert_eq!(
            probes(&http, lame.port).await,
            (Some(503), Some(200)),
            "a leader that cannot watch pods must lead unready and alive, {:?} after it led:\n{}",
            t.elapsed(),
            lame.proc.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(leads(&http, lame.port).await, Some(true), "still leading");
    lame.proc.terminate(STOP).await.ok();
    cluster
        .kubectl(&["delete", "-f", &file.to_string_lossy()])
        .expect("delete rbac");
}
