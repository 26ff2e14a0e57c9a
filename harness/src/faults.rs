//! The faults a run injects at given times ([`TimedFault`]): what each
//! does to the cluster or to forewarn's processes, recorded in the
//! timeline and the report.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::Utc;

use crate::cluster::Cluster;
use crate::options::ApiServerOutage;
use crate::options::TimedFault;
use crate::outage::api_server_outage;
use crate::procs::Fleet;
use crate::report::Report;
use crate::timeline::Timeline;

/// How long a resumed controller may take to find its Lease lost and exit.
const EXIT_AFTER_RESUME: Duration = Duration::from_secs(30);

/// How long a pause waits for the controller to lead.
const LEADS_WITHIN: Duration = Duration::from_secs(60);

/// Whether the controller whose metrics are on `port` says it leads
/// (`forewarn_controller_leader 1`) within `within`.
async fn leads_within(port: u16, within: Duration) -> bool {
    let http = forewarn::http::client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build();
    let Ok(http) = http else {
        return false;
    };
    let since = Instant::now();
    while since.elapsed() < within {
        if let Ok(r) = http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            && let Ok(text) = r.text().await
            && text
                .lines()
                .any(|l| l.trim() == "forewarn_controller_leader 1")
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// Injects `fault`; returns once it is over (a restart done, a pause
/// resumed and the paused process gone).
///
/// # Errors
/// When the fault cannot be injected (a process cannot be signalled or
/// started, kube-apiserver cannot be stopped or started).
pub(crate) async fn inject(
    cluster: &Cluster,
    fault: &TimedFault,
    fleet: &mut Fleet,
    tl: &mut Timeline,
    report: &mut Report,
) -> anyhow::Result<()> {
    // Only a leader's pause is this fault: a standby paused and resumed (a
    // new process still waiting for the Lease after a kill) rightly goes
    // on and leads.
    if matches!(fault, TimedFault::PauseController { .. })
        && !leads_within(fleet.controller_port, LEADS_WITHIN).await
    {
        tl.say(
            "fault",
            format!("the controller did not lead within {LEADS_WITHIN:?}: not paused"),
        );
        return Ok(());
    }
    report.faults.push((Utc::now(), format!("{fault:?}")));
    match fault {
        TimedFault::RestartApiServer { down } => {
            let outage = ApiServerOutage {
                when_last_terminating: String::new(),
                duration: *down,
                then_kubectl: Vec::new(),
            };
            api_server_outage(cluster, &outage, fleet, tl, report).await?;
        }
        TimedFault::KillController => {
            fleet.restart_controller().await?;
            tl.say(
                "fault",
                "controller killed (SIGKILL); a new one started, it waits for the Lease",
            );
        }
        TimedFault::PauseController { pause } => {
            let identity = fleet.controller_identity.clone();
            fleet
                .controller
                .signal("STOP")
                .context("SIGSTOP the controller")?;
            tl.say(
                "fault",
                format!("controller paused (SIGSTOP) for {pause:?}"),
            );
            tokio::time::sleep(*pause).await;
            fleet
                .controller
                .signal("CONT")
                .context("SIGCONT the controller")?;
            let resumed = Utc::now();
            let since = Instant::now();
            let mut exited = None;
            while since.elapsed() < EXIT_AFTER_RESUME {
                if fleet.controller.exited().is_some() {
                    exited = Some(Utc::now());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            report.pauses.push((resumed, exited, identity));
            match exited {
                Some(_) => {
                    tl.say(
                        "fault",
                        "controller resumed (SIGCONT): it found its Lease lapsed and exited",
                    );
                    fleet.restart_controller_container().await?;
                }
                None => report.violations.push(format!(
                    "the controller paused past its Lease did not exit within {EXIT_AFTER_RESUME:?} of its resume"
                )),
            }
        }
        TimedFault::RestartAgent { node, down } => {
            fleet.kill_agent(node).await;
            tl.say(
                "fault",
                format!("agent on {node} killed (SIGKILL) for {down:?}"),
            );
            tokio::time::sleep(*down).await;
            fleet.start_agent(node).await?;
            tl.say("fault", format!("agent on {node} started again"));
        }
        TimedFault::Kubectl(args) => {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = cluster
                .kubectl(&args)
                .with_context(|| format!("kubectl {}", args.join(" ")))?;
            tl.say(
                "fault",
                format!("kubectl {}: {}", args.join(" "), out.trim()),
            );
        }
    }
    Ok(())
}
