//! `forewarn check-install`: what the chart's `helm test` Pod runs. It
//! checks, with the test's own read-only credentials, that an installed
//! release works: its CRDs are installed and `Established` and serve the
//! version this binary writes, a controller holds the leader-election Lease
//! and renews it, and every agent the DaemonSets should run is Ready (an
//! agent turns Ready once it has read its VM's IMDS document and listed its
//! own reports: `src/agent/event_reports.rs`). It prints one line per check and
//! fails when any check fails.

use anyhow::bail;
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

use crate::cli::CheckInstallArgs;

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// What was checked, e.g. `CRD scheduledevents.forewarn.dev`.
    pub name: String,
    /// Whether it holds.
    pub ok: bool,
    /// What was found.
    pub detail: String,
}

impl Check {
    fn new(name: impl Into<String>, ok: bool, detail: impl Into<String>) -> Self {
        Check {
            name: name.into(),
            ok,
            detail: detail.into(),
        }
    }
}

/// Runs the checks and prints them; fails when one fails.
///
/// # Errors
/// No Kubernetes configuration, or a check that failed (each is printed).
pub async fn run(args: CheckInstallArgs) -> anyhow::Result<()> {
    let clients = crate::kubeclient::Clients::infer("check-install", "helm-test").await?;
    let checks = check(&clients.requests, &args, Utc::now()).await;
    for c in &checks {
        println!(
            "{} {}: {}",
            if c.ok { "ok  " } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    let failed = checks.iter().filter(|c| !c.ok).count();
    if failed > 0 {
        bail!("{failed} of {} checks failed", checks.len());
    }
    Ok(())
}

/// The checks of the release `args` describes, at `now`.
pub async fn check(client: &Client, args: &CheckInstallArgs, now: DateTime<Utc>) -> Vec<Check> {
    let mut checks = Vec::new();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for want in crate::api::install::all() {
        let name = want.metadata.name.clone().unwrap_or_default();
        checks.push(match crds.get(&name).await {
            Ok(crd) => crd_check(&want, &crd),
            Err(e) => Check::new(format!("CRD {name}"), false, error_detail(&e)),
        });
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), &args.namespace);
    checks.push(match leases.get(&args.lease_name).await {
        Ok(lease) => lease_check(&args.lease_name, &lease, now),
        Err(e) => Check::new(
            format!("leader Lease {}", args.lease_name),
            false,
            error_detail(&e),
        ),
    });
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &args.namespace);
    // The first DaemonSet (the Linux agents') must run somewhere; another
    // (the Windows agents') may have no node to run on.
    for (i, name) in args.agent_daemonset.iter().enumerate() {
        checks.push(match daemonsets.get(name).await {
            Ok(ds) => agents_check(name, &ds, i > 0),
            Err(e) => Check::new(
                format!("agents (DaemonSet {name})"),
                false,
                error_detail(&e),
            ),
        });
    }
    checks
}

fn error_detail(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 404 => "not found".into(),
        kube::Error::Api(s) if s.code == 403 => format!("forbidden: {}", s.message),
        other => format!("cannot read it: {other}"),
    }
}

/// Installed, `Established`, and serving the version this binary writes.
pub fn crd_check(want: &CustomResourceDefinition, got: &CustomResourceDefinition) -> Check {
    let name = format!("CRD {}", want.metadata.name.clone().unwrap_or_default());
    let established = got
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
    if !established {
        return Check::new(name, false, "installed but not Established");
    }
    let served: Vec<&str> = got
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.as_str())
        .collect();
    let missing: Vec<&str> = want
        .spec
        .versions
        .iter()
        .map(|v| v.name.as_str())
        .filter(|v| !served.contains(v))
        .collect();
    if missing.is_empty() {
        Check::new(
            name,
            true,
            format!("Established, serves {}", served.join(", ")),
        )
    } else {
        Check::new(
            name,
            false,
            format!(
                "does not serve {} (serves {}): apply the chart's CRDs",
                missing.join(", "),
                served.join(", ")
            ),
        )
    }
}

/// Held, and renewed within its duration (a holder that stopped renewing
/// has lost it, whatever `holderIdentity` still says).
pub fn lease_check(name: &str, lease: &Lease, now: DateTime<Utc>) -> Check {
    let name = format!("leader Lease {name}");
    let Some(spec) = lease.spec.as_ref() else {
        return Check::new(name, false, "no spec: no controller ever led");
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder.is_empty() {
        return Check::new(name, false, "no holder: no controller leads");
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let Some(renewed) = spec
        .renew_time
        .as_ref()
        .and_then(|t| DateTime::from_timestamp_millis(t.0.as_millisecond()))
    else {
        return Check::new(name, false, format!("held by {holder} but never renewed"));
    };
    let age = (now - renewed).num_seconds();
    if age > duration {
        Check::new(
            name,
            false,
            format!(
                "held by {holder}, last renewed {age} s ago (lease {duration} s): that controller stopped"
            ),
        )
    } else {
        Check::new(
            name,
            true,
            format!("held by {holder}, renewed {age} s ago (lease {duration} s)"),
        )
    }
}

/// Every agent the DaemonSet should run is up to date and Ready. A
/// DaemonSet that should run on no node fails, unless `may_run_nowhere`
/// (the Windows agents' on a cluster without Windows nodes).
pub fn agents_check(name: &str, ds: &DaemonSet, may_run_nowhere: bool) -> Check {
    let name = format!("agents (DaemonSet {name})");
    let Some(s) = ds.status.as_ref() else {
        return Check::new(name, false, "no status yet");
    };
    let desired = s.desired_number_scheduled;
    let ready = s.number_ready;
    let updated = s.updated_number_scheduled.unwrap_or(0);
    let current =
        ds.metadata.generation.is_some() && s.observed_generation == ds.metadata.generation;
    let detail = format!(
        "{ready} of {desired} Ready (each has read its VM's IMDS document and listed its own reports), {updated} up to date"
    );
    let ok = desired > 0 && ready == desired && updated == desired && current;
    if desired == 0 && may_run_nowhere && current {
        return Check::new(
            name,
            true,
            "no node to run on (no node matches its nodeSelector)",
        );
    }
    if desired == 0 {
        return Check::new(
            name,
            false,
            "the DaemonSet runs on no node: check its nodeSelector and tolerations",
        );
    }
    Check::new(name, ok, detail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSetStatus;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: Option<&str>, renewed_ago: Option<i64>, now: DateTime<Utc>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(String::from),
                lease_duration_seconds: Some(15),
                renew_time: renewed_ago.map(|s| {
                    MicroTime(
                        k8s_openapi::jiff::Timestamp::from_millisecond(
                            (now - chrono::Duration::seconds(s)).timestamp_millis(),
                        )
                        .expect("time"),
                    )
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_counts_only_while_renewed() {
        let now = Utc::now();
        assert!(lease_check("l", &lease(Some("c-1"), Some(3), now), now).ok);
        let stale = lease_check("l", &lease(Some("c-1"), Some(60), now), now);
        assert!(!stale.ok && stale.detail.contains("stopped"), "{stale:?}");
        assert!(!lease_check("l", &lease(None, None, now), now).ok);
        assert!(!lease_check("l", &lease(Some("c-1"), None, now), now).ok);
    }

    #[test]
    fn every_desired_agent_must_be_ready_and_current() {
        let ds = |desired, ready, updated| DaemonSet {
            metadata: kube::api::ObjectMeta {
                generation: Some(2),
                ..Default::default()
            },
            status: Some(DaemonSetStatus {
                desired_number_scheduled: desired,
                number_ready: ready,
                updated_number_scheduled: Some(updated),
                observed_generation: Some(2),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(agents_check("a", &ds(3, 3, 3), false).ok);
        assert!(!agents_check("a", &ds(3, 2, 3), false).ok);
        assert!(!agents_check("a", &ds(3, 3, 2), false).ok);
        assert!(!agents_check("a", &ds(0, 0, 0), false).ok);
        // The Windows agents' DaemonSet on a cluster without Windows nodes.
        assert!(agents_check("a", &ds(0, 0, 0), true).ok);
        assert!(!agents_check("a", &ds(3, 2, 3), true).ok);
    }

    #[test]
    fn a_crd_must_be_established_and_serve_our_version() {
        use kube::CustomResourceExt;
        let want = crate::api::ScheduledEvent::crd();
        let mut got = want.clone();
        assert!(!crd_check(&want, &got).ok, "no status: not Established");
        got.status = Some(
            serde_json::from_value(serde_json::json!({
                "conditions": [{"type": "Established", "status": "True"}]
            }))
            .expect("status"),
        );
        assert!(crd_check(&want, &got).ok);
        got.spec.versions[0].served = false;
        let c = crd_check(&want, &got);
        assert!(!c.ok && c.detail.contains("does not serve"), "{c:?}");
    }
}
