//! Agent pods for agents run as processes: a DaemonSet shaped as the
//! chart's agent (labels `app.kubernetes.io/part-of: forewarn`,
//! `app.kubernetes.io/component: agent`, in the controller's namespace) on
//! the nodes whose agents run, which KWOK reports Ready. The controller
//! then reads those agents as up (not silent), as it does on a cluster
//! where the chart runs them: each node is acted on by its own agent's
//! report, and no witnesses are asked for.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

/// The label that puts a node in the DaemonSet.
pub const AGENT_NODE_LABEL: &str = "forewarn-harness/agent";

/// Puts a Ready agent pod on each of `nodes` (in `namespace`, the
/// controller's), and waits until every one is Ready (at most `within`).
///
/// # Errors
/// A write refused, or the pods not Ready in time.
pub async fn start(
    client: &Client,
    namespace: &str,
    nodes: &[String],
    within: Duration,
) -> anyhow::Result<()> {
    let node_api: Api<Node> = Api::all(client.clone());
    let label = json!({"metadata": {"labels": {AGENT_NODE_LABEL: "true"}}});
    for n in nodes {
        node_api
            .patch(n, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .with_context(|| format!("labelling {n}"))?;
    }
    let labels = json!({
        "app.kubernetes.io/part-of": "forewarn",
        "app.kubernetes.io/component": "agent",
        "app.kubernetes.io/name": "forewarn-harness-agent",
    });
    let ds = json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "forewarn-harness-agent", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "forewarn-harness-agent"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {AGENT_NODE_LABEL: "true"},
                    "terminationGracePeriodSeconds": 0,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    });
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    api.patch(
        "forewarn-harness-agent",
        &PatchParams::apply("forewarn-harness").force(),
        &Patch::Apply(&ds),
    )
    .await
    .context("applying the agents' DaemonSet")?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + within;
    loop {
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=forewarn-harness-agent"))
            .await?;
        let ready = list
            .items
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready >= nodes.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{ready} of {} agent pods Ready within {within:?}",
                nodes.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Undoes [`start`]: the DaemonSet (its pods with it) and the label of
/// `nodes` (those that still exist), so that a later run on the same
/// cluster has agents without pods again.
///
/// # Errors
/// A write refused.
pub async fn stop(client: &Client, namespace: &str, nodes: &[String]) -> anyhow::Result<()> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    match api
        .delete("forewarn-harness-agent", &DeleteParams::foreground())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e).context("deleting the agents' DaemonSet"),
    }
    let node_api: Api<Node> = Api::all(client.clone());
    let unlabel = json!({"metadata": {"labels": {AGENT_NODE_LABEL: null}}});
    for n in nodes {
        match node_api
            .patch(n, &PatchParams::default(), &Patch::Merge(&unlabel))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("unlabelling {n}")),
        }
    }
    // Gone before the next run reads the agents as up.
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=forewarn-harness-agent"))
        .await?
        .items
        .is_empty()
    {
        if Instant::now() > deadline {
            bail!("the agent pods still exist 120 s after their DaemonSet was deleted");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
