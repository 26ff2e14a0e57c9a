//! Whether the agents are confined (docs/trust.md): the controller checks
//! that the ValidatingAdmissionPolicy that lets an agent write only its own
//! node's reports, and its binding, are installed and deny, and exports it as
//! the gauge `forewarn_agent_confinement_installed` (the chart's alert
//! `ForewarnAgentsUnconfined` fires on 0).

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::Client;
use kube::api::Api;
use prometheus::IntGauge;
use tracing::{info, warn};

/// How often the check runs again (a policy deleted later is noticed).
const RECHECK: Duration = Duration::from_secs(60);

/// Whether the policy `name` and a binding of the same name that binds it
/// with the `Deny` action are installed; `Ok(false)` with the reason when
/// not (also when the API server does not serve the API).
///
/// # Errors
/// Any API error but 404 (forbidden, unreachable).
pub async fn check(client: &Client, name: Option<&str>) -> Result<Result<(), String>, kube::Error> {
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Ok(Err(
            "no --agent-policy given: the chart installs none (admissionPolicy.enabled is false)"
                .into(),
        ));
    };
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let not_found = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 404);
    match policies.get(name).await {
        Ok(_) => {}
        Err(e) if not_found(&e) => {
            return Ok(Err(format!(
                "ValidatingAdmissionPolicy {name} is not installed (or the API server does not serve admissionregistration.k8s.io/v1)"
            )));
        }
        Err(e) => return Err(e),
    }
    let binding = match bindings.get(name).await {
        Ok(b) => b,
        Err(e) if not_found(&e) => {
            return Ok(Err(format!(
                "ValidatingAdmissionPolicyBinding {name} is not installed"
            )));
        }
        Err(e) => return Err(e),
    };
    let spec = binding.spec;
    if spec.policy_name != name {
        return Ok(Err(format!(
            "ValidatingAdmissionPolicyBinding {name} binds {:?}, not the policy {name}",
            spec.policy_name
        )));
    }
    if !spec.validation_actions.iter().any(|a| a == "Deny") {
        return Ok(Err(format!(
            "ValidatingAdmissionPolicyBinding {name} does not deny (validationActions {:?})",
            spec.validation_actions
        )));
    }
    Ok(Ok(()))
}

/// Runs [`check`] now and every [`RECHECK`], setting `gauge` to 1 when the
/// agents are confined, 0 when not; an API error leaves it as it was.
pub async fn watch(client: Client, name: Option<String>, gauge: IntGauge) {
    let mut last = None;
    loop {
        match check(&client, name.as_deref()).await {
            Ok(now) => {
                gauge.set(i64::from(now.is_ok()));
                if last.as_ref() != Some(&now) {
                    match &now {
                        Ok(()) => {
                            info!(policy = ?name, "The agents' admission policy is installed: each agent may write only its own node's reports")
                        }
                        Err(why) => {
                            warn!(%why, "The agents are not confined: any agent may write any node's reports")
                        }
                    }
                }
                last = Some(now);
            }
            Err(e) => warn!(error = %e, "Could not check the agents' admission policy; will retry"),
        }
        tokio::time::sleep(RECHECK).await;
    }
}
