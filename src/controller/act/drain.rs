//! Draining: which pods a node holds, and evicting them through the
//! Eviction API so that PodDisruptionBudgets are honoured.
//!
//! Follows `kubectl drain --ignore-daemonsets --delete-emptydir-data`
//! (k8s.io/kubectl `pkg/drain`): DaemonSet pods and mirror (static) pods
//! stay, finished pods do not count, pods with `emptyDir` are evicted, pods
//! without a controller are kept unless the policy says otherwise (see
//! [`crate::controller::decide::plan`]). A PodDisruptionBudget is never bypassed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{Eviction as EvictionBody, PodDisruptionBudget};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, LabelSelector, Preconditions};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::core::Status;
use kube::{Client, ResourceExt};

use crate::controller::decide::plan::{Eviction, EvictionOutcome};
use crate::controller::observe::pod_list::{PodInfo, chrono_time};

/// How long a PodDisruptionBudget may list a pod in `status.disruptedPods`
/// before we call it wedged: the disruption controller itself drops entries
/// after two minutes (`DeletionTimeout` in kube-controller-manager).
const WEDGED_AFTER: chrono::TimeDelta = chrono::TimeDelta::minutes(2);

/// The `policy/v1` Eviction we send: the grace period and the pod-UID
/// precondition in `deleteOptions`.
///
/// Built here rather than with kube's `EvictParams`: kube-core 5.0.0
/// serialises its options under the key `delete_options`, which the API
/// server drops as an unknown field, so neither the grace nor the
/// precondition would apply.
pub fn eviction_body(e: &Eviction) -> EvictionBody {
    EvictionBody {
        metadata: ObjectMeta {
            name: Some(e.pod.name.clone()),
            namespace: Some(e.pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        delete_options: Some(DeleteOptions {
            grace_period_seconds: Some(e.grace_seconds.max(1)),
            preconditions: Some(Preconditions {
                uid: Some(e.pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteOptions::default()
        }),
    }
}

/// Classifies the API server's refusal of an eviction.
pub fn classify_refusal(s: &Status) -> EvictionOutcome {
    let msg = s.message.clone();
    match s.code {
        429 => {
            let causes: Vec<&kube::core::response::StatusCause> = s
                .details
                .iter()
                .flat_map(|d| &d.causes)
                .filter(|c| c.reason == "DisruptionBudget")
                .collect();
            match causes.first() {
                Some(first) => EvictionOutcome::Blocked {
                    budgets: causes
                        .iter()
                        .filter_map(|c| budget_name(&c.message))
                        .collect(),
                    message: first.message.clone(),
                },
                None => EvictionOutcome::Throttled {
                    retry_after_seconds: s
                        .details
                        .as_ref()
                        .map_or(1, |d| d.retry_after_seconds)
                        .max(1),
                },
            }
        }
        404 => EvictionOutcome::Gone,
        // The pod-UID precondition failed: the pod planned is gone, and the
        // one of the same name is another pod (planned afresh next pass).
        409 if msg.contains("UID in the precondition") || msg.contains("Precondition failed") => {
            EvictionOutcome::Gone
        }
        500 if msg.contains("more than one PodDisruptionBudget") => EvictionOutcome::Blocked {
            budgets: Vec::new(), // named by the caller, which can list them
            message: msg,
        },
        _ => EvictionOutcome::Retry(format!("{} {}: {msg}", s.code, s.reason)),
    }
}

/// The budget's name in the API server's cause message, e.g. `web` in
/// "The disruption budget web needs 5 healthy pods and has 5 currently".
fn budget_name(message: &str) -> Option<String> {
    let rest = message.strip_prefix("The disruption budget ")?;
    rest.split_whitespace().next().map(String::from)
}

/// Whether `selector` selects a pod with `labels` (matchLabels and
/// matchExpressions, as in `metav1.LabelSelectorAsSelector`).
pub fn selects(
    selector: &LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// The PodDisruptionBudgets of `namespace` that select `pod`, `namespace/name`.
async fn budgets_of(client: &Client, pod: &PodInfo) -> Vec<String> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &pod.namespace);
    match api.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .iter()
            .filter(|b| {
                b.spec
                    .as_ref()
                    .and_then(|s| s.selector.as_ref())
                    // An empty selector selects every pod of the namespace (policy/v1).
                    .is_some_and(|sel| selects(sel, &pod.labels))
            })
            .map(|b| format!("{}/{}", pod.namespace, b.name_any()))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// A note when a budget has been wedged by a pod it still lists as
/// disrupted long after the eviction (the pod never went away).
async fn wedged_note(
    client: &Client,
    namespace: &str,
    budget: &str,
    now: DateTime<Utc>,
) -> Option<String> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    let pdb = api.get_opt(budget).await.ok()??;
    let stale: Vec<String> = pdb
        .status?
        .disrupted_pods?
        .iter()
        .filter(|(_, t)| now - chrono_time(&t.0) > WEDGED_AFTER)
        .map(|(p, t)| format!("{p} (since {})", chrono_time(&t.0).to_rfc3339()))
        .collect();
    (!stale.is_empty()).then(|| {
        format!(
            "PodDisruptionBudget {namespace}/{budget} looks wedged: it still counts {} as disrupted",
            stale.join(", ")
        )
    })
}

/// Requests one eviction and classifies the answer. `client` must not retry
/// 429s by itself (kube's default retry policy would hide a blocking
/// PodDisruptionBudget for minutes).
pub async fn evict(client: &Client, e: &Eviction) -> EvictionOutcome {
    let api: Api<Pod> = Api::namespaced(client.clone(), &e.pod.namespace);
    let body = eviction_body(e);
    let outcome = match api
        .create_subresource::<_, serde_json::Value>(
            "eviction",
            &e.pod.name,
            &PostParams::default(),
            &body,
        )
        .await
    {
        Ok(_) => EvictionOutcome::Evicted,
        Err(kube::Error::Api(s)) => classify_refusal(&s),
        Err(err) => EvictionOutcome::Retry(err.to_string()),
    };
    match outcome {
        EvictionOutcome::Blocked { budgets, message } => {
            let budgets = if budgets.is_empty() {
                budgets_of(client, &e.pod).await
            } else {
                budgets
                    .into_iter()
                    .map(|b| format!("{}/{b}", e.pod.namespace))
                    .collect()
            };
            let mut message = message;
            for b in &budgets {
                let name = b.rsplit('/').next().unwrap_or(b);
                if let Some(note) = wedged_note(client, &e.pod.namespace, name, Utc::now()).await {
                    message = format!("{message}; {note}");
                }
            }
            EvictionOutcome::Blocked { budgets, message }
        }
        other => other,
    }
}

/// The controller-wide eviction rate budget: a token bucket of `qps`
/// evictions a second with bursts of `burst`, shared by every reconcile.
pub fn rate_limiter(qps: u32, burst: u32) -> Arc<DefaultDirectRateLimiter> {
    let qps = std::num::NonZeroU32::new(qps.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
    let burst = std::num::NonZeroU32::new(burst.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
    Arc::new(RateLimiter::direct(
        Quota::per_second(qps).allow_burst(burst),
    ))
}

/// The refusal to reuse for `pod` when a pod with the same labels (the same
/// workload, so the same PodDisruptionBudgets) was refused by a budget
/// earlier in this pass: asking again at once would get the same 429 and
/// spend the rate budget for nothing.
fn refused_alike(
    refused: &std::sync::Mutex<Vec<(Arc<PodInfo>, EvictionOutcome)>>,
    pod: &PodInfo,
) -> Option<EvictionOutcome> {
    let refused = refused
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    refused
        .iter()
        .find(|(p, _)| {
            p.namespace == pod.namespace && p.labels == pod.labels && !p.labels.is_empty()
        })
        .map(|(_, o)| o.clone())
}

/// How many nodes' evictions are asked for at once in a pass (each with
/// up to `--max-evictions-per-node` in flight).
pub const NODES_EVICTED_AT_ONCE: usize = 16;

/// What one pass of evictions did.
#[derive(Debug, Default)]
pub struct Evicted {
    /// `(node, pod, outcome)` of each eviction asked for.
    pub outcomes: Vec<(String, String, EvictionOutcome)>,
    /// Evictions not asked for because the pass's time ran out while they
    /// waited for the rate budget: the next pass plans them again.
    pub deferred: usize,
}

/// Requests `evictions` concurrently, at most `per_node` at once per node,
/// each after a token of `limiter`, until `until`: an eviction still waiting
/// for a token then is deferred to the next pass (so a pass over a
/// 1,000-node event ends within seconds and a node whose report came in
/// meanwhile is cordoned at the next one, instead of after every pod was
/// asked for). Once a PodDisruptionBudget refuses a pod, the pods with the
/// same labels on that node are not asked for in this pass: they share its
/// outcome (see [`refused_alike`]); the next pass asks again.
pub async fn evict_all(
    client: &Client,
    limiter: &DefaultDirectRateLimiter,
    evictions: &[Eviction],
    per_node: usize,
    until: tokio::time::Instant,
) -> Evicted {
    // Indices, by node in the plan's order: an eviction is copied only when
    // it is asked for (a 10,000-pod plan copied whole cost megabytes a pass).
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut by_node: Vec<Vec<usize>> = Vec::new();
    for (i, e) in evictions.iter().enumerate() {
        let n = *index.entry(e.node.as_str()).or_insert_with(|| {
            by_node.push(Vec::new());
            by_node.len() - 1
        });
        by_node[n].push(i);
    }
    drop(index);
    let per_node = per_node.max(1);
    let node = |list: Vec<usize>| async move {
        let refused = std::sync::Mutex::new(Vec::new());
        let refused = &refused;
        futures::stream::iter(list)
            .map(|i| {
                let e = evictions[i].clone();
                async move {
                    if let Some(o) = refused_alike(refused, &e.pod) {
                        return Some((e.node, e.pod.name.clone(), o));
                    }
                    // Past the pass's time, nothing more is asked for (a
                    // token already there would otherwise be spent).
                    // Waiting for a token is cancel-safe: a deferred
                    // eviction spends none.
                    if tokio::time::Instant::now() >= until {
                        return None;
                    }
                    tokio::time::timeout_at(until, limiter.until_ready())
                        .await
                        .ok()?;
                    let outcome = evict(client, &e).await;
                    if matches!(outcome, EvictionOutcome::Blocked { .. }) {
                        refused
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push((e.pod.clone(), outcome.clone()));
                    }
                    Some((e.node, e.pod.name.clone(), outcome))
                }
            })
            .buffer_unordered(per_node)
            .collect::<Vec<_>>()
            .await
    };
    // A few nodes at once, not every node of the event: 1,000 nodes with 8
    // evictions in flight each held 23 MB of request state and opened
    // hundreds of connections, for a rate budget of about 100 a second.
    let results: Vec<Vec<_>> = futures::stream::iter(by_node)
        .map(node)
        .buffer_unordered(NODES_EVICTED_AT_ONCE)
        .collect()
        .await;
    let mut evicted = Evicted::default();
    for o in results.into_iter().flatten() {
        match o {
            Some(o) => evicted.outcomes.push(o),
            None => evicted.deferred += 1,
        }
    }
    evicted
}

/// The longest `Retry-After` among throttled evictions, if any.
pub fn throttled_for(outcomes: &[(String, String, EvictionOutcome)]) -> Option<Duration> {
    outcomes
        .iter()
        .filter_map(|(_, _, o)| match o {
            EvictionOutcome::Throttled {
                retry_after_seconds,
            } => Some(Duration::from_secs(u64::from(*retry_after_seconds))),
            _ => None,
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use kube::core::response::{StatusCause, StatusDetails};

    #[test]
    fn eviction_body_carries_grace_and_uid_under_delete_options() {
        let e = Eviction {
            node: "n".into(),
            pod: Arc::new(PodInfo {
                namespace: "ns".into(),
                name: "p".into(),
                uid: "uid-1".into(),
                ..PodInfo::default()
            }),
            grace_seconds: 7,
        };
        let v = serde_json::to_value(eviction_body(&e)).unwrap();
        assert_eq!(v["apiVersion"], "policy/v1");
        assert_eq!(v["kind"], "Eviction");
        assert_eq!(v["deleteOptions"]["gracePeriodSeconds"], 7);
        assert_eq!(v["deleteOptions"]["preconditions"]["uid"], "uid-1");
        assert!(v.get("delete_options").is_none());
    }

    fn status(code: u16, message: &str, causes: Vec<(&str, &str)>, retry: u32) -> Status {
        Status {
            code,
            message: message.into(),
            reason: "r".into(),
            details: Some(StatusDetails {
                causes: causes
                    .into_iter()
                    .map(|(r, m)| StatusCause {
                        reason: r.into(),
                        message: m.into(),
                        field: String::new(),
                    })
                    .collect(),
                retry_after_seconds: retry,
                name: String::new(),
                group: String::new(),
                kind: String::new(),
                uid: String::new(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn refusals_are_classified_from_the_answer() {
        let pdb = status(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            vec![(
                "DisruptionBudget",
                "The disruption budget web needs 5 healthy pods and has 5 currently",
            )],
            10,
        );
        assert_eq!(
            classify_refusal(&pdb),
            EvictionOutcome::Blocked {
                budgets: vec!["web".into()],
                message: "The disruption budget web needs 5 healthy pods and has 5 currently"
                    .into()
            }
        );
        let apf = status(429, "Too many requests, please try again later.", vec![], 3);
        assert_eq!(
            classify_refusal(&apf),
            EvictionOutcome::Throttled {
                retry_after_seconds: 3
            }
        );
        let uid = status(
            409,
            // The API server's own words (v1.36), seen on the local cluster.
            "Operation cannot be fulfilled on Pod \"p\": the UID in the precondition (5d28) does not match the UID in record (57d4). The object might have been deleted and then recreated",
            vec![],
            0,
        );
        assert_eq!(classify_refusal(&uid), EvictionOutcome::Gone);
        let conflict = status(
            409,
            "Operation cannot be fulfilled on poddisruptionbudgets",
            vec![],
            0,
        );
        assert!(matches!(
            classify_refusal(&conflict),
            EvictionOutcome::Retry(_)
        ));
        let two = status(
            500,
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            vec![],
            0,
        );
        assert!(matches!(
            classify_refusal(&two),
            EvictionOutcome::Blocked { .. }
        ));
        assert_eq!(
            classify_refusal(&status(404, "not found", vec![], 0)),
            EvictionOutcome::Gone
        );
    }

    #[test]
    fn a_refusal_stands_for_pods_of_the_same_workload_only() {
        let web = |name: &str| PodInfo {
            namespace: "shop".into(),
            name: name.into(),
            labels: Arc::new([("app".to_string(), "web".to_string())].into()),
            ..PodInfo::default()
        };
        let blocked = EvictionOutcome::Blocked {
            budgets: vec!["shop/web".into()],
            message: "needs 5".into(),
        };
        let refused = std::sync::Mutex::new(vec![(Arc::new(web("web-1")), blocked.clone())]);
        assert_eq!(refused_alike(&refused, &web("web-2")), Some(blocked));
        let other = PodInfo {
            labels: Arc::new([("app".to_string(), "db".to_string())].into()),
            ..web("db-1")
        };
        assert_eq!(refused_alike(&refused, &other), None);
        let bare = PodInfo {
            labels: Default::default(),
            ..web("x")
        };
        assert_eq!(
            refused_alike(&refused, &bare),
            None,
            "no labels: nothing in common"
        );
    }

    #[test]
    fn label_selectors_match_like_the_api_server() {
        let labels = [
            ("app".to_string(), "web".to_string()),
            ("tier".to_string(), "a".to_string()),
        ]
        .into();
        let sel = |ml: Option<Vec<(&str, &str)>>, ex: Vec<(&str, &str, Vec<&str>)>| LabelSelector {
            match_labels: ml.map(|v| {
                v.into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            match_expressions: Some(
                ex.into_iter()
                    .map(|(k, op, vs)| LabelSelectorRequirement {
                        key: k.into(),
                        operator: op.into(),
                        values: Some(vs.into_iter().map(String::from).collect()),
                    })
                    .collect(),
            ),
        };
        assert!(selects(&sel(Some(vec![("app", "web")]), vec![]), &labels));
        assert!(!selects(&sel(Some(vec![("app", "db")]), vec![]), &labels));
        assert!(selects(
            &sel(None, vec![("tier", "In", vec!["a", "b"])]),
            &labels
        ));
        assert!(!selects(
            &sel(None, vec![("tier", "NotIn", vec!["a"])]),
            &labels
        ));
        assert!(selects(
            &sel(None, vec![("zone", "DoesNotExist", vec![])]),
            &labels
        ));
        assert!(
            selects(&sel(None, vec![]), &labels),
            "an empty selector selects every pod"
        );
    }
}
