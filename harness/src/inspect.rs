//! What the integration tests read back from the API server about a run:
//! a `ScheduledEvent`, one of its conditions, the Kubernetes Events about
//! it. One copy for every suite (what the API server stored, never what
//! forewarn believes it wrote).

use forewarn::api::ScheduledEvent;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::Client;
use kube::api::{Api, ListParams};

/// The `ScheduledEvent` of `EventId` `id` (named after it, lowercased), or
/// `None` when there is none.
///
/// # Panics
/// When the API server cannot be asked.
pub async fn scheduled_event(client: &Client, id: &str) -> Option<ScheduledEvent> {
    Api::<ScheduledEvent>::all(client.clone())
        .get_opt(&id.to_ascii_lowercase())
        .await
        .unwrap_or_else(|e| panic!("ScheduledEvent {id}: {e}"))
}

/// The `ScheduledEvent` of `EventId` `id`, which must exist.
///
/// # Panics
/// When there is none, or the API server cannot be asked.
pub async fn expect_scheduled_event(client: &Client, id: &str) -> ScheduledEvent {
    scheduled_event(client, id)
        .await
        .unwrap_or_else(|| panic!("no ScheduledEvent {id}"))
}

/// `(status, reason, message)` of `ev`'s condition `type_`, if it has one.
pub fn condition(ev: &ScheduledEvent, type_: &str) -> Option<(String, String, String)> {
    ev.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The notes of the Kubernetes Events with `reason` about the
/// `ScheduledEvent` `id`.
///
/// # Panics
/// When the API server cannot be asked.
pub async fn event_notes(client: &Client, id: &str, reason: &str) -> Vec<String> {
    Api::<KubeEvent>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list Events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| {
            e.regarding
                .as_ref()
                .and_then(|r| r.name.as_deref())
                .is_some_and(|n| n.eq_ignore_ascii_case(id))
        })
        .filter_map(|e| e.note)
        .collect()
}
