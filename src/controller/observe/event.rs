//! One event's observation: the contents its nodes are handled on (the
//! spec's and each dissent's), the nodes each maps to on trusted word, the
//! other events' claims on them, their pods and participants from the
//! caches, and, for the approval, their pods read afresh. Reads only.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{Client, ResourceExt};

use crate::api::{Report, ScheduledEvent, ScheduledEventSpec, SentApproval};
use crate::controller::decide::{out_of_service, plan};
use crate::controller::observe::caches::Caches;
use crate::controller::observe::facts::Facts;
use crate::controller::observe::nodes;
use crate::controller::observe::observed::{Observed, ObservedNode};
use crate::controller::observe::pod_list::{self, PodInfo};
use crate::controller::observe::reports::{ReportsByEvent, reports_about};
use crate::controller::observe::trust;
use crate::policy::Policy;
use crate::text::{listed_at_most, named};

/// How many unconfirmed nodes the status names, each with its reason.
const UNCONFIRMED_LISTED: usize = 10;

/// Up to how many nodes the approval's fresh read lists each node's pods
/// (by field selector); beyond, it lists every bound pod once, paginated
/// (a 1,000-node event: 20 requests instead of 1,000).
const LIST_PER_NODE_UP_TO: usize = 20;

/// Pod lists (one per affected node) in flight at once for one event.
const POD_LIST_CONCURRENCY: usize = 32;

/// The contents an event's nodes are handled on: the spec's, then each
/// dissent's, with their digests.
pub fn contents(built: &trust::Built) -> Vec<(&ScheduledEventSpec, &str)> {
    std::iter::once((&built.spec, built.digest.as_str()))
        .chain(built.dissent.iter().map(|d| (&d.spec, d.digest.as_str())))
        .collect()
}

/// The other unfinished events that map to each node and whose policy
/// cordons it, from the controller's cache of `ScheduledEvent`s (an event
/// whose spec is over still claims the nodes whose own agents report it
/// live, see [`trust::Dissent`]). Only the events whose reports name one of
/// `vms` (lower case: the VMs of the nodes this pass handles) are judged: a
/// pass does not judge every event of the cluster. A node forewarn does not
/// manage (`managed` false: outside the policy's `nodeSelector`) is claimed
/// by none: no event will hold it.
fn claims(
    me: &str,
    vms: &std::collections::HashSet<String>,
    caches: &Caches,
    policy: &Policy,
    facts: &Facts,
    managed: impl Fn(&str) -> bool,
    now: DateTime<Utc>,
) -> HashMap<String, Vec<String>> {
    let mut by_node: HashMap<String, Vec<String>> = HashMap::new();
    for other in caches.events.state() {
        let name = other.name_any();
        if name == me || !names_any(&facts.reports, &name, vms) {
            continue;
        }
        let (reports, _) = reports_about(&facts.reports, &name);
        let judged = trust::judge_reports(reports.iter().copied(), |n| facts.identity(n));
        let Some(built) = trust::build(&judged) else {
            continue;
        };
        let over = plan::is_over(&other);
        if over && !built.dissent_live() {
            continue;
        }
        let mut mapped = Vec::new();
        for (i, (spec, digest)) in contents(&built).into_iter().enumerate() {
            if i == 0 && over {
                continue;
            }
            let action = policy.decide(
                &spec.event_type.as_str().into(),
                &spec.event_source,
                spec.duration_seconds,
            );
            // An event still waiting for its drain lead time (a
            // predicted-failure Redeploy days away) claims no node yet:
            // handed a node now, it would find itself holding it and
            // drain at once.
            if action.cordons() && !plan::waits_for_lead_time(&other, spec, policy, now) {
                for (_, node) in facts.map(&spec.resources).mapped {
                    if managed(&node) {
                        mapped.push((node, spec.appearance, digest.to_owned()));
                    }
                }
            }
        }
        // Only nodes the other event holds on trusted word (see `trust`).
        let assessment = trust::assess(
            &built,
            &judged,
            mapped.iter().map(|(n, ..)| n.as_str()),
            policy.trust_any_agent,
            |n| caches.pods.agent_up(n),
        );
        for (node, appearance, digest) in mapped {
            if assessment
                .verdicts
                .get(&node)
                .is_some_and(|v| v.is_live_on(appearance, &digest))
            {
                let names = by_node.entry(node).or_default();
                if !names.contains(&name) {
                    names.push(name.clone());
                }
            }
        }
    }
    by_node
}

/// Whether a report about the event `name` names one of `vms` (lower case)
/// among its `Resources`: every node an event's content maps to is so named.
fn names_any(
    reports: &ReportsByEvent,
    name: &str,
    vms: &std::collections::HashSet<String>,
) -> bool {
    reports.get(name).is_some_and(|rs| {
        rs.iter().any(|r| {
            r.spec
                .report
                .resources
                .iter()
                .any(|vm| vms.contains(&vm.to_ascii_lowercase()))
        })
    })
}

/// What [`observe`] saw: the event's own view, the dissenting nodes with
/// the spec each is handled on, and the node objects read (node writes are
/// conditional on their `resourceVersion`).
pub struct Observation {
    /// The event's own view of its nodes.
    pub seen: Observed,
    /// The dissenting nodes, with the spec each is handled on.
    pub dissent: Vec<(ScheduledEventSpec, Vec<ObservedNode>)>,
    /// The node objects read, by name.
    pub snapshots: HashMap<String, Arc<Node>>,
}

/// Reads, from the node cache, the nodes the event maps to and those that
/// still hold a cordon for it, and the pods and participants of the mapped
/// ones from the pod cache. Node writes are conditional on the
/// `resourceVersion` read here, so a stale cache costs a 409 and a retry,
/// never a wrong write.
///
/// A node that no trusted report confirms is not among the mapped nodes
/// (it is released if it holds the event's cordon), and is listed in
/// `Observed::unconfirmed`; a node whose own agent reports other content
/// than the spec is observed apart, with the spec it is handled on.
#[allow(clippy::too_many_arguments)]
pub fn observe(
    ev: &ScheduledEvent,
    built: &trust::Built,
    judged: &[trust::Judged<'_>],
    facts: &Facts,
    caches: &Caches,
    policy: &Policy,
    dry_run: bool,
    now: DateTime<Utc>,
) -> Observation {
    let me = ev.name_any();
    let by_name: HashMap<String, &Arc<Node>> =
        facts.nodes.iter().map(|n| (n.name_any(), n)).collect();
    let contents = contents(built);
    let mut mappings: Vec<nodes::Mapping> = contents
        .iter()
        .map(|(spec, _)| facts.map(&spec.resources))
        .collect();
    // Where the event lands, managed or not.
    let domains = fault_domains(&mappings[0], &by_name);
    let managed = |node: &str| by_name.get(node).is_none_or(|n| policy.manages(n.labels()));
    let unmanaged = leave_unmanaged(&mut mappings, managed);
    let any_managed = mappings.iter().any(|m| !m.mapped.is_empty());
    let assessment = trust::assess(
        built,
        judged,
        mappings
            .iter()
            .flat_map(|m| m.mapped.iter().map(|(_, n)| n.as_str())),
        policy.trust_any_agent,
        |n| caches.pods.agent_up(n),
    );
    let nodes::Mapping {
        unmapped,
        mut doubts,
        ..
    } = mappings[0].clone();
    // Named in full for a few nodes; an event naming a thousand VMs must
    // not write a thousand reasons into its status.
    let unconfirmed = listed_at_most(&assessment.unconfirmed(), UNCONFIRMED_LISTED, "node(s)");
    if !unconfirmed.is_empty() {
        doubts.push(format!(
            "no trusted report for node {}",
            unconfirmed.join("; ")
        ));
    }
    let mut wanted = mapped_nodes(&me, &contents, &mappings, &assessment, &by_name);
    held_nodes(ev, &me, judged, facts, &mut wanted);
    doubts.extend(unknown_vms(judged, facts, &by_name, !unmapped.is_empty()));
    // The VMs a node handled here may go by (mapped, stated, providerID's).
    let vms: HashSet<String> = wanted
        .iter()
        .flat_map(|h| [Some(h.vm.clone()), facts.vm_of(&h.node)])
        .flatten()
        .filter(|vm| !vm.is_empty())
        .map(|vm| vm.to_ascii_lowercase())
        .collect();
    let claims = claims(&me, &vms, caches, policy, facts, managed, now);
    let read = read_nodes(ev, wanted, &contents, &claims, &by_name, caches, policy);
    let mut seen = Observed {
        nodes: Vec::new(),
        unmapped,
        doubts,
        unconfirmed,
        disagreement: built.disagreement(),
        last_report: None,
        deleted: deleted_nodes(ev, &by_name),
        recorded: recorded_nodes(ev, &by_name),
        dry_run,
        fault_domains: domains,
        unmanaged,
        any_managed,
        excluded_namespaces: HashSet::new(),
    };
    let mut dissent: Vec<(ScheduledEventSpec, Vec<ObservedNode>)> = contents[1..]
        .iter()
        .map(|(spec, _)| ((*spec).clone(), Vec::new()))
        .collect();
    let mut snapshots = HashMap::new();
    for (observed, i, node) in read {
        snapshots.insert(observed.name.clone(), node);
        if i == 0 {
            seen.nodes.push(observed);
        } else {
            dissent[i - 1].1.push(observed);
        }
    }
    dissent.retain(|(_, nodes)| !nodes.is_empty());
    Observation {
        seen,
        dissent,
        snapshots,
    }
}

/// Takes out of each mapping the nodes forewarn does not manage (`managed`
/// false: outside the policy's `nodeSelector`), so that they are neither
/// judged, cordoned, drained nor waited for; a node among them that still
/// holds this event's cordon (its labels changed during the event) is
/// released as any node that no longer maps to it ([`held_nodes`]). Returns
/// their names, each once, sorted.
fn leave_unmanaged(mappings: &mut [nodes::Mapping], managed: impl Fn(&str) -> bool) -> Vec<String> {
    let mut unmanaged: Vec<String> = Vec::new();
    for m in mappings.iter_mut() {
        m.mapped.retain(|(_, node)| {
            let keep = managed(node);
            if !keep && !unmanaged.contains(node) {
                unmanaged.push(node.clone());
            }
            keep
        });
    }
    unmanaged.sort();
    unmanaged
}

/// A node a pass handles: its name, its VM (empty when unknown), which
/// content it is handled on (0: the spec's, else a dissent's, in
/// [`contents`] order), and whether its own part ended.
struct Handled {
    node: String,
    vm: String,
    content: usize,
    ended: bool,
}

/// The nodes the contents map to that the pass handles, each node once:
/// one whose verdict is live on a content, on that content; one merely
/// unconfirmed that already holds this event's cordon, on the spec's (its
/// own agent has not yet reported a new appearance of the event, say: the
/// hold was taken on trusted word, and dropping it would make the node
/// schedulable for a moment; only a trusted end, or the event's, releases
/// it); and one whose own part ended while it holds the event's cordon,
/// on the spec's, to be released after the release delay
/// (`plan::release_ended`).
fn mapped_nodes(
    me: &str,
    contents: &[(&ScheduledEventSpec, &str)],
    mappings: &[nodes::Mapping],
    assessment: &trust::Assessment,
    by_name: &HashMap<String, &Arc<Node>>,
) -> Vec<Handled> {
    let holds_it = |node: &str| {
        by_name
            .get(node)
            .is_some_and(|n| crate::api::holds(n).iter().any(|h| h == me))
    };
    let mut wanted: Vec<Handled> = Vec::new();
    for (i, ((spec, digest), mapping)) in contents.iter().zip(mappings).enumerate() {
        for (vm, node) in &mapping.mapped {
            let (take, content, ended) = match assessment.verdicts.get(node) {
                Some(v) if v.is_live_on(spec.appearance, digest) => (true, i, false),
                Some(trust::Verdict::Unconfirmed { .. }) => (i == 0 && holds_it(node), 0, false),
                Some(trust::Verdict::Ended { .. }) => (holds_it(node), 0, true),
                _ => (false, 0, false),
            };
            if take && !wanted.iter().any(|h| h.node == *node) {
                wanted.push(Handled {
                    node: node.clone(),
                    vm: vm.clone(),
                    content,
                    ended,
                });
            }
        }
    }
    wanted
}

/// Adds to `wanted` the other nodes that hold this event's cordon, to be
/// released, but for a node whose VM the controller does not know (no
/// providerID, and its VirtualMachineReport not written yet, or gone with
/// its agent's pod until the new pod writes it again) while the event is
/// live or its own agent's last report lists it: it stays held as it is
/// (and no approval is decided: [`unknown_vms`]). Without evidence either
/// way, a hold taken earlier (by an earlier version too) is kept, not
/// dropped for a moment; once the event is over it is released.
fn held_nodes(
    ev: &ScheduledEvent,
    me: &str,
    judged: &[trust::Judged<'_>],
    facts: &Facts,
    wanted: &mut Vec<Handled>,
) {
    for n in facts
        .nodes
        .iter()
        .filter(|n| crate::api::holds(n).iter().any(|h| h == me))
    {
        let name = n.name_any();
        if wanted.iter().any(|h| h.node == name) {
            continue;
        }
        let own_live = judged
            .iter()
            .any(|j| j.report.node == name && j.report.is_listed());
        if (own_live || !plan::is_over(ev)) && facts.identity(&name).is_none() {
            continue;
        }
        wanted.push(Handled {
            node: name,
            vm: String::new(),
            content: 0,
            ended: false,
        });
    }
}

/// The doubt a node of the cluster raises whose VM the controller does not
/// know (no providerID, no VirtualMachineReport): while its agent lists the
/// event, or, when the event names VMs that map to no node
/// (`names_unmapped`), whatever its agent lists (its agent may not have run
/// yet), since the VM may be one the event names: no approval is decided
/// until its VM is known.
fn unknown_vms(
    judged: &[trust::Judged<'_>],
    facts: &Facts,
    by_name: &HashMap<String, &Arc<Node>>,
    names_unmapped: bool,
) -> Option<String> {
    let mut unknown: Vec<&str> = if names_unmapped {
        by_name
            .keys()
            .map(String::as_str)
            .filter(|n| facts.identity(n).is_none())
            .collect()
    } else {
        judged
            .iter()
            .filter(|j| j.report.is_listed())
            .map(|j| j.report.node.as_str())
            .filter(|n| by_name.contains_key(*n) && facts.identity(n).is_none())
            .collect()
    };
    unknown.sort_unstable();
    unknown.dedup();
    (!unknown.is_empty()).then(|| {
        let why = if names_unmapped {
            "while the event names VMs that map to no node"
        } else {
            "while its agent lists the event"
        };
        format!(
            "the VM of node {} is unknown (no providerID, no VirtualMachineReport) {why}",
            named(&unknown, UNCONFIRMED_LISTED, ", ")
        )
    })
}

/// Each handled node as the plan reads it, with the content it is handled
/// on and its object, in `wanted`'s order; a node gone from the cache has
/// nothing to drain or release and is left out. Only the spec's content can
/// be over (a dissent is handled while its node's own agent lists it); a
/// finished event's record is frozen, so pods are read only for nodes it
/// never recorded, so that the record says what was there.
fn read_nodes(
    ev: &ScheduledEvent,
    wanted: Vec<Handled>,
    contents: &[(&ScheduledEventSpec, &str)],
    claims: &HashMap<String, Vec<String>>,
    by_name: &HashMap<String, &Arc<Node>>,
    caches: &Caches,
    policy: &Policy,
) -> Vec<(ObservedNode, usize, Arc<Node>)> {
    let completed = plan::is_over(ev);
    let recorded = ev
        .status
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .is_some_and(|n| !n.is_empty());
    let drains: Vec<bool> = contents
        .iter()
        .map(|(spec, _)| {
            policy
                .decide(
                    &spec.event_type.as_str().into(),
                    &spec.event_source,
                    spec.duration_seconds,
                )
                .drains()
        })
        .collect();
    wanted
        .into_iter()
        .filter_map(|h| {
            let node = Arc::clone(by_name.get(&h.node)?);
            let i = h.content;
            let completed = completed && i == 0;
            let known = !h.vm.is_empty() && !h.ended;
            let pods = if drains[i] && known && (!completed || !recorded) {
                caches.pods.on_node(&h.node)
            } else {
                Vec::new()
            };
            let participants = if known && !completed {
                caches.pods.participants_on(&h.node)
            } else {
                Vec::new()
            };
            let observed = ObservedNode {
                participants,
                cordoned: nodes::is_cordoned(&node),
                holds: crate::api::holds(&node),
                claimed_by: claims.get(&h.node).cloned().unwrap_or_default(),
                name: h.node,
                vm_name: h.vm,
                pods,
                excluded: Vec::new(),
                ended: h.ended,
            };
            Some((observed, i, node))
        })
        .collect()
}

/// The nodes `ev`'s status records that are no longer in the cluster.
fn deleted_nodes(ev: &ScheduledEvent, by_name: &HashMap<String, &Arc<Node>>) -> Vec<String> {
    ev.status
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .into_iter()
        .flatten()
        .filter(|n| !by_name.contains_key(&n.name))
        .map(|n| n.name.clone())
        .collect()
}

/// The nodes `ev`'s status records (mapped from `Resources`) that are
/// still in the cluster, as they are now: see [`out_of_service::to_taint`].
fn recorded_nodes(
    ev: &ScheduledEvent,
    by_name: &HashMap<String, &Arc<Node>>,
) -> Vec<out_of_service::RecordedNode> {
    ev.status
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .into_iter()
        .flatten()
        .filter(|n| !n.vm_name.is_empty())
        .filter_map(|n| {
            let node = by_name.get(&n.name)?;
            Some(out_of_service::RecordedNode {
                name: n.name.clone(),
                ready: out_of_service::ready(node),
                tainted: out_of_service::tainted(node),
            })
        })
        .collect()
}

/// How many fault domains the nodes `mapping` maps to are in, as their
/// labels say: every node the event's `Resources` map to, trusted yet or
/// not (where the event lands, not what forewarn acts on); `None` when no
/// such node's is known.
fn fault_domains(mapping: &nodes::Mapping, by_name: &HashMap<String, &Arc<Node>>) -> Option<usize> {
    let domains: std::collections::BTreeSet<String> = mapping
        .mapped
        .iter()
        .filter_map(|(_, n)| by_name.get(n))
        .filter_map(|n| crate::topology::fault_domain_of(n))
        .collect();
    (!domains.is_empty()).then_some(domains.len())
}

/// Sets the pods the policy's `excludePods` keeps apart on every node of
/// `seen` and `dissent`: out of `pods` (so they are neither evicted nor
/// waited for) into `excluded`, with why. `excluded_namespaces`: the
/// namespaces whose labels match `excludePods.namespaceSelector`, as read
/// for this pass ([`crate::controller::observe::namespaces::NamespaceCache::selected`]).
pub fn exclude_pods(
    seen: &mut Observed,
    dissent: &mut [(ScheduledEventSpec, Vec<ObservedNode>)],
    policy: &Policy,
    excluded_namespaces: HashSet<String>,
) {
    seen.excluded_namespaces = excluded_namespaces;
    let rule = &policy.exclude_pods;
    if rule.is_empty() {
        return;
    }
    let namespaces = &seen.excluded_namespaces;
    for node in seen
        .nodes
        .iter_mut()
        .chain(dissent.iter_mut().flat_map(|(_, nodes)| nodes.iter_mut()))
    {
        split_excluded(node, rule, namespaces);
    }
}

/// Moves `node`'s pods that `rule` excludes from `pods` to `excluded`.
fn split_excluded(
    node: &mut ObservedNode,
    rule: &crate::policy::PodExclusion,
    namespaces: &HashSet<String>,
) {
    let (kept, evictable): (Vec<_>, Vec<_>) = std::mem::take(&mut node.pods)
        .into_iter()
        .map(|p| {
            let why = rule.excludes(&p.namespace, namespaces.contains(&p.namespace), &p.labels);
            (p, why)
        })
        .partition(|(_, why)| why.is_some());
    node.pods = evictable.into_iter().map(|(p, _)| p).collect();
    node.excluded = kept
        .into_iter()
        .filter_map(|(p, why)| why.map(|w| (p, w)))
        .collect();
}

/// Reads the pods of each node whose pods this pass read from the cache
/// again from the API server (one LIST a node, side by side), replacing
/// them in `seen`. Returns whether any node's pods differ from the cache's.
pub async fn fresh_pods(
    ev: &ScheduledEvent,
    seen: &mut Observed,
    client: &Client,
    policy: &Policy,
) -> Result<bool, pod_list::Error> {
    let drains = policy
        .decide(
            &ev.spec.event_type.as_str().into(),
            &ev.spec.event_source,
            ev.spec.duration_seconds,
        )
        .drains();
    if !drains {
        return Ok(false);
    }
    let wanted: Vec<(usize, String)> = seen
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| !n.vm_name.is_empty() && !n.ended)
        .map(|(i, n)| (i, n.name.clone()))
        .collect();
    let client = client.clone();
    let read: Vec<(usize, Vec<PodInfo>)> = if wanted.len() > LIST_PER_NODE_UP_TO {
        // Many nodes: one paginated list of every bound pod.
        let names: std::collections::HashSet<String> =
            wanted.iter().map(|(_, n)| n.clone()).collect();
        let mut by_node = pod_list::pods_by_node(&client, &names, pod_list::POD_LIST_PAGE).await?;
        wanted
            .into_iter()
            .map(|(i, n)| (i, by_node.remove(&n).unwrap_or_default()))
            .collect()
    } else {
        futures::stream::iter(wanted)
            .map(move |(i, node)| {
                let client = client.clone();
                async move { pod_list::pods_on(&client, &node).await.map(|p| (i, p)) }
            })
            .buffered(POD_LIST_CONCURRENCY)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()?
    };
    let mut changed = false;
    for (i, pods) in read {
        let mut pods: Vec<Arc<PodInfo>> = pods.into_iter().map(Arc::new).collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let mut fresh = ObservedNode {
            pods,
            ..ObservedNode::default()
        };
        split_excluded(&mut fresh, &policy.exclude_pods, &seen.excluded_namespaces);
        let node = &mut seen.nodes[i];
        if node.pods != fresh.pods || node.excluded != fresh.excluded {
            changed = true;
            node.pods = fresh.pods;
            node.excluded = fresh.excluded;
        }
    }
    Ok(changed)
}

/// Copies onto `ev`'s approval what the agents report of sending it: of the
/// POSTs that carried out this very decision (its appearance and digest),
/// the first IMDS accepted, else the latest. Only a sender's own word about
/// its own POST ever reads `Accepted`.
pub fn copy_sent_approval(
    ev: &mut ScheduledEvent,
    reports: &[&Report],
    vm_of: impl Fn(&str) -> Option<String>,
) {
    let names = |vm: &str| ev.spec.resources.iter().any(|r| r.eq_ignore_ascii_case(vm));
    // Only a node whose fixed VM the event names sends its approval: any
    // other node's record of one is not a sender's word.
    let senders: Vec<&&Report> = reports
        .iter()
        .filter(|r| vm_of(&r.node).is_some_and(|vm| names(&vm)))
        .collect();
    let Some(approval) = ev.status.as_mut().and_then(|s| s.approval.as_mut()) else {
        return;
    };
    let (Some(appearance), Some(digest)) = (approval.appearance, approval.digest.clone()) else {
        return;
    };
    let sent: Vec<(&str, &SentApproval)> = senders
        .iter()
        .flat_map(|r| r.approvals.iter().map(move |s| (r.node.as_str(), s)))
        .filter(|(_, s)| s.appearance == appearance && s.digest == digest)
        .collect();
    let pick = sent
        .iter()
        .filter(|(_, s)| s.status == 200)
        .min_by_key(|(_, s)| s.sent_at)
        .or_else(|| sent.iter().max_by_key(|(_, s)| s.sent_at));
    let Some((node, s)) = pick else {
        return;
    };
    approval.sent_at = Some(s.sent_at);
    approval.sent_by = Some((*node).to_owned());
    approval.result = Some(if s.status == 200 {
        crate::agent::approval::ACCEPTED.to_owned()
    } else {
        format!("Failed: IMDS answered {}: {}", s.status, s.body)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PodExclusion;

    fn mapping(nodes: &[&str]) -> nodes::Mapping {
        nodes::Mapping {
            mapped: nodes
                .iter()
                .map(|n| (format!("vm-{n}"), (*n).to_owned()))
                .collect(),
            ..nodes::Mapping::default()
        }
    }

    #[test]
    fn unmanaged_nodes_are_taken_out_of_every_content_and_named_once() {
        let mut mappings = vec![mapping(&["a", "b", "c"]), mapping(&["c", "d"])];
        let unmanaged = leave_unmanaged(&mut mappings, |n| n == "a" || n == "d");
        assert_eq!(unmanaged, ["b", "c"]);
        let left: Vec<Vec<&str>> = mappings
            .iter()
            .map(|m| m.mapped.iter().map(|(_, n)| n.as_str()).collect())
            .collect();
        assert_eq!(left, [vec!["a"], vec!["d"]]);
    }

    #[test]
    fn excluded_pods_move_out_of_the_drain_with_their_reason() {
        let pod = |ns: &str, name: &str, app: &str| {
            Arc::new(PodInfo {
                namespace: ns.into(),
                name: name.into(),
                labels: Arc::new([("app".to_owned(), app.to_owned())].into()),
                ..PodInfo::default()
            })
        };
        let mut node = ObservedNode {
            pods: vec![
                pod("shop", "web-0", "web"),
                pod("monitoring", "prom-0", "prom"),
                pod("batch", "job-0", "job"),
                pod("shop", "cache-0", "cache"),
            ],
            ..ObservedNode::default()
        };
        let rule: PodExclusion = serde_saphyr::from_str(
            "namespaces: [monitoring]\nnamespaceSelector: {matchLabels: {drain: skip}}\npodSelector: {matchLabels: {app: cache}}\n",
        )
        .unwrap();
        let selected: HashSet<String> = ["batch".to_owned()].into();
        split_excluded(&mut node, &rule, &selected);
        let left: Vec<String> = node.pods.iter().map(|p| p.key()).collect();
        assert_eq!(left, ["shop/web-0"]);
        let kept: Vec<(String, &str)> = node.excluded.iter().map(|(p, w)| (p.key(), *w)).collect();
        assert_eq!(kept.len(), 3);
        assert!(kept[0].0 == "monitoring/prom-0" && kept[0].1.contains("namespaces"));
        assert!(kept[1].0 == "batch/job-0" && kept[1].1.contains("namespaceSelector"));
        assert!(kept[2].0 == "shop/cache-0" && kept[2].1.contains("podSelector"));
    }

    /// A sender's record is taken only from the report of a node whose
    /// fixed VM the event names: another node's agent writing an accepted
    /// POST into its own report makes nothing `Accepted`.
    #[test]
    fn a_sent_approval_is_read_only_from_a_node_whose_vm_the_event_names() {
        let mut ev = ScheduledEvent::new("e", crate::fixtures::spec("E").vms(["vm_b"]).build());
        let sent = SentApproval {
            appearance: ev.spec.appearance,
            digest: ev.spec.digest(),
            sent_at: Utc::now(),
            status: 200,
            body: String::new(),
        };
        ev.status = Some(crate::api::ScheduledEventStatus {
            approval: Some(crate::api::Approval {
                decided_at: Some(Utc::now()),
                appearance: Some(ev.spec.appearance),
                digest: Some(ev.spec.digest()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let spec = ev.spec.clone();
        let report = |node: &str, vm: &str| Report {
            node: node.into(),
            vm: vm.into(),
            named: spec.resources.iter().any(|r| r == vm),
            event_status: spec.event_status,
            appearance: spec.appearance,
            event_id: spec.event_id.clone(),
            event_type: spec.event_type.clone(),
            event_source: spec.event_source.clone(),
            resource_type: spec.resource_type.clone(),
            resources: spec.resources.clone(),
            not_before: spec.not_before,
            duration_seconds: spec.duration_seconds,
            description: String::new(),
            document_incarnation: 1,
            approvals: vec![sent.clone()],
        };
        let vms = |n: &str| match n {
            "node-a" => Some("vm_a".to_string()),
            "node-b" => Some("vm_b".to_string()),
            _ => None,
        };
        let forged = report("node-a", "vm_a");
        let mut copy = ev.clone();
        copy_sent_approval(&mut copy, &[&forged], vms);
        let a = copy.status.unwrap().approval.unwrap();
        assert_eq!((a.result, a.sent_by), (None, None));
        let own = report("node-b", "vm_b");
        copy_sent_approval(&mut ev, &[&forged, &own], vms);
        let a = ev.status.unwrap().approval.unwrap();
        assert_eq!(a.result.as_deref(), Some(crate::agent::approval::ACCEPTED));
        assert_eq!(a.sent_by.as_deref(), Some("node-b"));
    }
}
