//! A real stop of kube-apiserver during a run
//! ([`ApiServerOutage`](crate::options::ApiServerOutage)): when it starts, the
//! stop and start, and the controller started again meanwhile as its kubelet
//! would.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::cluster::Cluster;
use crate::options::ApiServerOutage;
use crate::procs::Fleet;
use crate::report::Report;
use crate::timeline::Timeline;

/// Whether the pod `name` is terminating and is the last pod of its
/// namespace on its node.
pub(crate) async fn drain_in_progress(pods: &Api<Pod>, name: &str) -> anyhow::Result<bool> {
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
pub(crate) async fn restart_exited_controller(
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
pub(crate) async fn api_server_outage(
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
