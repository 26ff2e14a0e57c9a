//! `forewarn hold`, `release-hold` and `approve` (also `kubectl forewarn
//! ...`): an operator's annotations on a `ScheduledEvent` (see
//! [`crate::controller::decide::manual`] for what the controller does with
//! them), written with a merge patch under the field manager
//! `kubectl-forewarn/<user>`, the user being who the API server says the
//! caller is (a `SelfSubjectReview`), so that the object's `managedFields`,
//! the status and the controller's Kubernetes Event name them.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::api::ScheduledEvent;
use crate::controller::decide::manual::{APPROVE_NOW_ANNOTATION, HOLD_ANNOTATION, is_set};

/// The longest field manager name the API server takes, in characters.
const MANAGER_LIMIT: usize = 128;

/// Errors of the commands.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read or the client built.
    #[error("cannot reach the cluster: {0}")]
    Client(#[source] kube::Error),
    /// `approve` without `--yes` and no terminal to ask on.
    #[error(
        "approving scheduledevent/{name} at {place} sends the approval whatever is left of the drain: pass --yes to confirm (no terminal to ask on)"
    )]
    NoTerminal {
        /// The object's name.
        name: String,
        /// Where it would act.
        place: String,
    },
    /// `approve` answered no.
    #[error("scheduledevent/{name} at {place} not approved: not confirmed")]
    NotConfirmed {
        /// The object's name.
        name: String,
        /// Where it would have acted.
        place: String,
    },
    /// The annotation could not be written (no such event, or RBAC: the
    /// chart's on-call ClusterRole allows `patch` on scheduledevents).
    #[error("failed to annotate ScheduledEvent {name}: {source}")]
    Patch {
        /// The object's name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// What to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Set [`HOLD_ANNOTATION`].
    Hold,
    /// Remove [`HOLD_ANNOTATION`].
    ReleaseHold,
    /// Set [`APPROVE_NOW_ANNOTATION`].
    ApproveNow,
}

/// The field manager for `user`: `kubectl-forewarn/<user>`, cut to what
/// the API server takes.
pub fn manager_for(user: &str) -> String {
    format!("kubectl-forewarn/{user}")
        .chars()
        .take(MANAGER_LIMIT)
        .collect()
}

/// Who the API server says the caller is (`SelfSubjectReview`,
/// authentication.k8s.io/v1, Kubernetes >= 1.28); `unknown` when it cannot
/// tell.
async fn whoami(client: &Client) -> String {
    let review: SelfSubjectReview = SelfSubjectReview::default();
    Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .ok()
        .and_then(|r| r.status?.user_info?.username)
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Asks on the terminal whether to approve `name` now at `place`; an
/// answer other than `y` or `yes` is a no.
///
/// # Errors
/// [`Error::NoTerminal`] when standard input is not a terminal to ask on.
fn confirm(name: &str, place: &str) -> Result<bool, Error> {
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    if !std::io::stdin().is_terminal() {
        return Err(Error::NoTerminal {
            name: name.to_owned(),
            place: place.to_owned(),
        });
    }
    eprint!(
        "Approve scheduledevent/{name} now at {place}: the approval is sent whatever is left of the drain. Continue? [y/N] "
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|_| Error::NoTerminal {
            name: name.to_owned(),
            place: place.to_owned(),
        })?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

/// Writes `change` on the `ScheduledEvent` `event` (its name, or its
/// `EventId` in any case) at `target` (the kubeconfig and context, as
/// kubectl takes them); `approve` asks first unless `confirmed` (`--yes`).
/// Returns a line for people.
///
/// # Errors
/// [`Error::Client`], [`Error::Patch`]; for `approve` without `--yes`,
/// [`Error::NoTerminal`] or [`Error::NotConfirmed`].
pub async fn run(
    event: &str,
    change: Change,
    target: &crate::kubeclient::PersonTarget,
    confirmed: bool,
) -> Result<String, Error> {
    let (client, place) = crate::kubeclient::client_for_person(target)
        .await
        .map_err(Error::Client)?;
    let name = event.to_ascii_lowercase();
    if change == Change::ApproveNow && !confirmed && !confirm(&name, &place)? {
        return Err(Error::NotConfirmed { name, place });
    }
    let manager = manager_for(&whoami(&client).await);
    let (key, value) = match change {
        Change::Hold => (HOLD_ANNOTATION, json!("true")),
        Change::ReleaseHold => (HOLD_ANNOTATION, serde_json::Value::Null),
        Change::ApproveNow => (APPROVE_NOW_ANNOTATION, json!("true")),
    };
    let body = json!({"metadata": {"annotations": {key: value}}});
    let params = PatchParams {
        field_manager: Some(manager.clone()),
        ..PatchParams::default()
    };
    let ev = Api::<ScheduledEvent>::all(client)
        .patch(&name, &params, &Patch::Merge(&body))
        .await
        .map_err(|source| Error::Patch {
            name: name.clone(),
            source,
        })?;
    let mut line = match change {
        Change::Hold => format!(
            "scheduledevent/{name}: {HOLD_ANNOTATION} set (as {manager}): no approval is sent while it is set; the drain goes on, and Azure starts the event at NotBefore"
        ),
        Change::ReleaseHold => format!(
            "scheduledevent/{name}: {HOLD_ANNOTATION} removed (as {manager}): the approval is decided as the policy says"
        ),
        Change::ApproveNow => format!(
            "scheduledevent/{name}: {APPROVE_NOW_ANNOTATION} set (as {manager}): the approval is sent now, whatever is left of the drain"
        ),
    };
    if change == Change::ApproveNow && is_set(&ev, HOLD_ANNOTATION) {
        line.push_str(&format!(
            "\nnote: {HOLD_ANNOTATION} is set too, and wins: release it (kubectl forewarn release-hold {name}) for the approval to go"
        ));
    }
    Ok(line + "\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_field_manager_names_the_user_within_the_api_servers_limit() {
        assert_eq!(
            super::manager_for("alice@example.com"),
            "kubectl-forewarn/alice@example.com"
        );
        assert_eq!(super::manager_for(&"x".repeat(300)).chars().count(), 128);
    }
}
