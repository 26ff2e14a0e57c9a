//! The notices forewarn writes on the workload's pods, as the harness sees
//! them, and the acknowledgements of the containers it plays.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cluster::Cluster;
use crate::options::RunOptions;
use crate::report::{NoticeSeen, Report};
use crate::timeline::{Timeline, short};

/// Records the notices on one version of a pod of the workload's
/// namespace (new ones, changes of phase, removals) and, for a pod the
/// harness plays, schedules its acknowledgement of each new notice.
pub(crate) fn watch_notices(
    seen_at: DateTime<Utc>,
    pod: &Pod,
    opts: &RunOptions,
    tl: &mut Timeline,
    report: &mut Report,
    acks_due: &mut Vec<(Instant, Pod, String, String)>,
) {
    use forewarn::controller::observe::participants::{NOTICE_PREFIX, field};
    let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
    let uid = pod.uid().unwrap_or_default();
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let notices: BTreeMap<String, String> = pod
        .annotations()
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(NOTICE_PREFIX)?.to_string(), v.clone())))
        .collect();
    for (event, value) in &notices {
        let known = report
            .notices
            .iter_mut()
            .find(|n| n.uid == uid && n.event == *event && n.removed_at.is_none());
        match known {
            Some(n) => {
                if n.last_value != *value {
                    let phase = |v: &str| field(v, "phase").unwrap_or_default().to_string();
                    if phase(&n.last_value) != phase(value) {
                        tl.at(
                            seen_at,
                            "workload",
                            format!("{key}'s notice of {}: phase {}", short(event), phase(value)),
                        );
                    }
                    n.last_value = value.clone();
                }
            }
            None => {
                let managers = managers_of(pod, &format!("{NOTICE_PREFIX}{event}"));
                let played = opts
                    .acknowledgers
                    .as_ref()
                    .filter(|a| a.pods.contains(&pod.name_any()));
                tl.at(
                    seen_at,
                    "workload",
                    format!(
                        "{key} ({node}) holds a notice{}: {value}",
                        if played.is_some() {
                            "; its container reads it from its downward-API file (played by the harness)"
                        } else {
                            ""
                        }
                    ),
                );
                if let Some(a) = played.filter(|a| !a.silent.contains(&pod.name_any())) {
                    let id = field(value, "eventId").unwrap_or_default().to_string();
                    acks_due.push((Instant::now() + a.prepare, pod.clone(), event.clone(), id));
                }
                report.notices.push(NoticeSeen {
                    pod: key.clone(),
                    uid: uid.clone(),
                    node: node.clone(),
                    event: event.clone(),
                    first_value: value.clone(),
                    last_value: value.clone(),
                    first_seen: seen_at,
                    removed_at: None,
                    managers,
                });
            }
        }
    }
    for n in report
        .notices
        .iter_mut()
        .filter(|n| n.uid == uid && n.removed_at.is_none() && !notices.contains_key(&n.event))
    {
        n.removed_at = Some(seen_at);
        tl.at(
            seen_at,
            "workload",
            format!("{key}'s notice of {} removed", short(&n.event)),
        );
    }
}

/// The field managers (`manager operation`) owning the annotation `key`
/// of `pod`.
fn managers_of(pod: &Pod, key: &str) -> Vec<String> {
    pod.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1.as_ref().is_some_and(|f| {
                f.0.get("f:metadata")
                    .and_then(|m| m.get("f:annotations"))
                    .and_then(|a| a.get(format!("f:{key}")))
                    .is_some()
            })
        })
        .map(|m| {
            format!(
                "{} {}",
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default()
            )
        })
        .collect()
}

/// Writes `ack.forewarn.dev/<event>: <event_id>` on `pod` as its container
/// would: a merge patch of that key, with a TokenRequest token of the
/// pod's ServiceAccount bound to the pod. Returns when the PATCH was sent
/// and when the API server's answer was read.
pub(crate) async fn acknowledge(
    cluster: &Cluster,
    opts: &RunOptions,
    pod: &Pod,
    event: &str,
    event_id: &str,
) -> anyhow::Result<(DateTime<Utc>, DateTime<Utc>)> {
    let sa = opts
        .acknowledgers
        .as_ref()
        .map(|a| a.service_account.clone())
        .unwrap_or_default();
    let (name, uid) = (pod.name_any(), pod.uid().unwrap_or_default());
    // A TokenRequest bound to the pod (as `kubectl create token
    // --bound-object-kind Pod`), through the API rather than a kubectl
    // process that would hold up the harness's loop.
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [],
                "expirationSeconds": 600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
            },
        }))?;
    let token = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
        cluster.client().await?,
        &opts.namespace,
    )
    .create_token_request(&sa, &PostParams::default(), &request)
    .await
    .with_context(|| format!("TokenRequest of {}/{sa}", opts.namespace))?
    .status
    .and_then(|s| s.token)
    .context("the TokenRequest came back without a token")?;
    let client = cluster.client_with_token(&token).await?;
    let body = json!({"metadata": {"annotations": {
        forewarn::controller::observe::participants::ack_key(event): event_id,
    }}});
    let params = PatchParams {
        field_manager: Some("workload".into()),
        ..PatchParams::default()
    };
    let sent = Utc::now();
    Api::<Pod>::namespaced(client, &opts.namespace)
        .patch(&name, &params, &Patch::Merge(&body))
        .await?;
    Ok((sent, Utc::now()))
}
