//! The run's workload and the cluster's state around a run: what earlier
//! runs left removed, the Deployment `web` and its PodDisruptionBudget, the
//! extra objects of the options, and a deleted node created again.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use forewarn::api::{CORDONED_FOR_ANNOTATION, ScheduledEvent, ScheduledEventReport};
use forewarn::topology::{FAULT_DOMAIN_LABEL, UPDATE_DOMAIN_LABEL, VirtualMachineReport};

use crate::cluster::Cluster;
use crate::options::RunOptions;
use crate::report::Report;

/// A Deployment of `replicas` pause pods pinned to `node` (their
/// replacements stay Pending there once it is cordoned), with
/// `terminationGracePeriodSeconds` `grace`; `extra_objects` of a run
/// create it in the run's namespace.
pub fn pinned_deployment(name: &str, replicas: i32, grace: i64, node: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "terminationGracePeriodSeconds": grace,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            }},
        },
    })
}

/// Removes what earlier runs left: the workload namespace and, when
/// `objects`, ScheduledEvents, reports, forewarn's marks on nodes and
/// cordons.
pub(crate) async fn reset(client: &Client, namespace: &str, objects: bool) -> anyhow::Result<()> {
    if objects {
        reset_objects(client).await?;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(namespace).await?.is_some() {
        // Pods an earlier test left held by a finalizer would keep the
        // namespace terminating forever.
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        for p in pods.list(&ListParams::default()).await? {
            if !p.finalizers().is_empty() {
                let drop_finalizers = json!({"metadata": {"finalizers": null}});
                let _ = pods
                    .patch(
                        &p.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&drop_finalizers),
                    )
                    .await;
            }
        }
        let _ = namespaces.delete(namespace, &DeleteParams::default()).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        while namespaces.get_opt(namespace).await?.is_some() {
            if Instant::now() > deadline {
                bail!("namespace {namespace} from an earlier run was not deleted within 60 s");
            }
            // The earlier run's pods may have long grace periods, honoured
            // by KWOK; cleaning up after a test need not wait for them.
            for p in pods.list(&ListParams::default()).await? {
                let _ = pods
                    .delete(&p.name_any(), &DeleteParams::default().grace_period(0))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// Creates the workload: a Deployment `web` spread over the nodes and a
/// PodDisruptionBudget `web`; waits until every replica is ready.
pub(crate) async fn deploy_workload(client: &Client, opts: &RunOptions) -> anyhow::Result<()> {
    let ns = &opts.namespace;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": opts.replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": stop_annotations(opts)},
                "spec": {
                    "terminationGracePeriodSeconds": opts.workload_grace_seconds,
                    "topologySpreadConstraints": [{
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": {"app": "web"}},
                    }],
                    "containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &deployment)
        .await?;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"minAvailable": opts.min_available, "selector": {"matchLabels": {"app": "web"}}},
    }))?;
    Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pdb)
        .await?;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ready = ready_pods(client, ns).await?;
        let pdb = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
            .get("web")
            .await?;
        let allowed = pdb.status.and_then(|s| s.disruptions_allowed).unwrap_or(0);
        if ready >= opts.replicas && allowed > 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "workload not ready within 90 s ({ready}/{} ready, PDB allows {allowed})",
                opts.replicas
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The KWOK Stage annotations that make a pod stop a while after its
/// deletion (see hack/kwok-stages.yaml).
fn stop_annotations(opts: &RunOptions) -> serde_json::Value {
    match &opts.workload_stops_within {
        Some((after, before)) => {
            json!({"forewarn.dev/stop-after": after, "forewarn.dev/stop-before": before})
        }
        None => json!({}),
    }
}

/// Waits until each of `pods` in `ns` is Running and Ready (60 s at most).
pub(crate) async fn wait_running(client: &Client, ns: &str, pods: &[String]) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = api.list(&ListParams::default()).await?;
        let missing: Vec<&String> = pods
            .iter()
            .filter(|name| {
                !listed
                    .items
                    .iter()
                    .any(|p| p.name_any() == **name && is_ready(p))
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("pods not Running and Ready within 60 s: {missing:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Waits until `count` pods in `ns` matching the label `selector` are
/// Running and Ready (180 s at most: a hang bound, as hundreds of pods
/// are scheduled and started by KWOK within seconds).
pub(crate) async fn wait_ready_count(
    client: &Client,
    ns: &str,
    selector: &str,
    count: usize,
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let listed = api.list(&ListParams::default().labels(selector)).await?;
        let ready = listed.items.iter().filter(|p| is_ready(p)).count();
        if ready >= count {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {ready} of {count} pods `{selector}` Running and Ready within 180 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Creates `opts.extra_objects` with `kubectl apply` (any kind, one call).
pub(crate) fn create_extra_objects(cluster: &Cluster, opts: &RunOptions) -> anyhow::Result<()> {
    if opts.extra_objects.is_empty() {
        return Ok(());
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": opts.extra_objects});
    let file = opts.log_dir.join("extra-objects.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&list)?)?;
    cluster
        .kubectl(&[
            "apply",
            "-n",
            &opts.namespace,
            "-f",
            &file.to_string_lossy(),
        ])
        .context("failed to create the extra objects")?;
    Ok(())
}

pub(crate) fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

pub(crate) async fn ready_pods(client: &Client, ns: &str) -> anyhow::Result<i32> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("app=web"))
        .await?;
    Ok(i32::try_from(pods.items.iter().filter(|p| is_ready(p)).count()).unwrap_or(i32::MAX))
}

/// Deletes every report and `ScheduledEvent`, releases every node, and
/// takes forewarn's fault-domain labels off (and the VM reports they came
/// from: each run's agents report again).
async fn reset_objects(client: &Client) -> anyhow::Result<()> {
    let vm_reports: Api<VirtualMachineReport> = Api::all(client.clone());
    vm_reports
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("failed to delete old VirtualMachineReports")?;
    // Reports first: the controller creates an event that has reports.
    let reports: Api<ScheduledEventReport> = Api::all(client.clone());
    reports
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("failed to delete old ScheduledEventReports")?;
    let sevs: Api<ScheduledEvent> = Api::all(client.clone());
    sevs.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("failed to delete old ScheduledEvents")?;
    let nodes: Api<Node> = Api::all(client.clone());
    for n in nodes.list(&ListParams::default()).await? {
        let patch = json!({
            "metadata": {
                "annotations": {CORDONED_FOR_ANNOTATION: null},
                "labels": {FAULT_DOMAIN_LABEL: null, UPDATE_DOMAIN_LABEL: null},
            },
            "spec": {"unschedulable": null, "taints": null},
        });
        nodes
            .patch(
                &n.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    Ok(())
}

/// Creates a deleted node again, without forewarn's marks, and waits until
/// it is Ready, so that the next test on the cluster has all its nodes.
pub(crate) async fn restore_node(nodes_api: &Api<Node>, node: Node, report: &mut Report) {
    let name = node.name_any();
    let mut annotations = node.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(CORDONED_FOR_ANNOTATION);
    let fresh = Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            labels: node.metadata.labels.clone(),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: node
            .spec
            .clone()
            .map(|s| k8s_openapi::api::core::v1::NodeSpec {
                unschedulable: None,
                taints: None,
                ..s
            }),
        status: None,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // The old object may still be going (finalizers are rare on nodes).
        match nodes_api.create(&PostParams::default(), &fresh).await {
            Ok(_) => break,
            Err(e) if Instant::now() > deadline => {
                report
                    .violations
                    .push(format!("harness: could not create node {name} again: {e}"));
                return;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    loop {
        let ready = nodes_api
            .get_opt(&name)
            .await
            .ok()
            .flatten()
            .is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
        if ready {
            return;
        }
        if Instant::now() > deadline {
            report.violations.push(format!(
                "harness: node {name} created again is not Ready within 30 s"
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
