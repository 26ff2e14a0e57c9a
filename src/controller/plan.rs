//! The pure heart of the controller: given an event and what the cluster
//! looks like, what to do next, and what the status should say afterwards.
//! No I/O here, so every rule of DESIGN.md is tested without a cluster.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::crd::{Approval, Condition, NodeProgress, Phase, ScheduledEvent, ScheduledEventStatus};
use crate::imds::model::{EventStatus, EventType};
use crate::policy::{Action, Policy};

/// A pod that must leave a node for it to count as drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, so that a pod recreated under the same name is not mistaken for it.
    pub uid: String,
    /// Already being deleted: wait for it, do not evict again.
    pub terminating: bool,
    /// `terminationGracePeriodSeconds` (Kubernetes default 30).
    pub grace_seconds: i64,
}

/// A node that matters to the event: mapped from `Resources`, or holding a
/// cordon for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedNode {
    /// Node name.
    pub name: String,
    /// The VM name from `Resources` that maps to it; empty if it is only here
    /// because it holds a cordon for the event.
    pub vm_name: String,
    /// `spec.unschedulable`.
    pub cordoned: bool,
    /// Events for which forewarn holds its cordon (annotation).
    pub holds: Vec<String>,
    /// Pods still to leave (DaemonSet, mirror and finished pods excluded).
    pub pods: Vec<PodInfo>,
}

/// What the controller saw for one event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Nodes mapped from `Resources`, then nodes holding a cordon for the event.
    pub nodes: Vec<ObservedNode>,
    /// Entries of `Resources` that map to no node.
    pub unmapped: Vec<String>,
}

/// A write to a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeWrite {
    /// Cordon the node and record the event as holding it.
    Cordon {
        /// Node name.
        node: String,
        /// The hold list to write.
        holds: Vec<String>,
    },
    /// The node is already cordoned by forewarn for other events: add this one.
    AddHold {
        /// Node name.
        node: String,
        /// The hold list to write.
        holds: Vec<String>,
    },
    /// Remove this event's hold; uncordon when no hold is left.
    Release {
        /// Node name.
        node: String,
        /// The hold list to write (empty: remove the annotation).
        holds: Vec<String>,
        /// Whether to uncordon (no other hold and the node is still cordoned).
        uncordon: bool,
    },
}

impl NodeWrite {
    /// The node written.
    pub fn node(&self) -> &str {
        match self {
            NodeWrite::Cordon { node, .. }
            | NodeWrite::AddHold { node, .. }
            | NodeWrite::Release { node, .. } => node,
        }
    }
}

/// One eviction to request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    /// Node the pod runs on.
    pub node: String,
    /// The pod.
    pub pod: PodInfo,
    /// Grace period to ask for: the pod's own, clipped to end by the drain deadline.
    pub grace_seconds: i64,
}

/// What to do next for one event.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The policy action.
    pub action: Action,
    /// The phase after this step.
    pub phase: Phase,
    /// Node writes (cordon, hold, release).
    pub node_writes: Vec<NodeWrite>,
    /// Evictions to request.
    pub evictions: Vec<Eviction>,
    /// `Some(reason)` when the approval is decided now.
    pub decide_approval: Option<String>,
    /// Why approval is withheld although the drain is done, if it is.
    pub approval_withheld: Option<String>,
    /// Delete the object: finished and past retention.
    pub delete: bool,
    /// When to look again.
    pub requeue: Duration,
}

/// How an eviction request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// Accepted: the pod is being deleted.
    Evicted,
    /// 429: a PodDisruptionBudget does not allow it now; the text names it.
    Blocked(String),
    /// 404: the pod is already gone.
    Gone,
    /// Anything else; retried on the next pass.
    Failed(String),
}

/// Seconds the drain may still take: `NotBefore - margin - now`, or `None`
/// without a `NotBefore` (the event has started; use the pods' own grace).
pub fn drain_budget(
    not_before: Option<DateTime<Utc>>,
    margin: Duration,
    now: DateTime<Utc>,
) -> Option<i64> {
    let nb = not_before?;
    let margin = chrono::Duration::from_std(margin).unwrap_or_else(|_| chrono::Duration::zero());
    Some((nb - margin - now).num_seconds().max(0))
}

fn was_started(ev: &ScheduledEvent, spec_status: &EventStatus) -> bool {
    // An accepted approval is not proof of a start: the platform may wait
    // for the host's other tenants, and the event may still be cancelled.
    *spec_status == EventStatus::Started
        || ev.status.as_ref().is_some_and(|s| s.started_at.is_some())
}

fn approval_decided(ev: &ScheduledEvent) -> bool {
    ev.status
        .as_ref()
        .and_then(|s| s.approval.as_ref())
        .is_some_and(|a| a.decided_at.is_some())
}

/// The object's name.
fn name_of(ev: &ScheduledEvent) -> String {
    ev.metadata.name.clone().unwrap_or_default()
}

/// Plans the next step for `ev` (DESIGN.md, "Policy" and "Rules").
pub fn plan(ev: &ScheduledEvent, seen: &Observed, policy: &Policy, now: DateTime<Utc>) -> Plan {
    let me = name_of(ev);
    let spec_status = EventStatus::from(ev.spec.event_status.as_str());
    let event_type = EventType::from(ev.spec.event_type.as_str());
    let action = policy.decide(&event_type, &ev.spec.event_source, ev.spec.duration_seconds);
    let started = was_started(ev, &spec_status);
    let decided = approval_decided(ev);

    let release = |nodes: &[ObservedNode]| -> Vec<NodeWrite> {
        nodes
            .iter()
            .filter(|n| n.holds.contains(&me))
            .map(|n| {
                let holds: Vec<String> = n.holds.iter().filter(|h| **h != me).cloned().collect();
                NodeWrite::Release {
                    node: n.name.clone(),
                    uncordon: holds.is_empty() && n.cordoned,
                    holds,
                }
            })
            .collect()
    };

    let mut p = Plan {
        action,
        phase: Phase::Pending,
        node_writes: Vec::new(),
        evictions: Vec::new(),
        decide_approval: None,
        approval_withheld: None,
        delete: false,
        requeue: Duration::from_secs(5),
    };

    // Rules 5 and 8: the event left IMDS; release what it held.
    if spec_status == EventStatus::Completed {
        p.phase = if started {
            Phase::Completed
        } else {
            Phase::Cancelled
        };
        p.node_writes = release(&seen.nodes);
        let finished = ev
            .status
            .as_ref()
            .and_then(|s| s.finished_at)
            .unwrap_or(now);
        let keep = chrono::Duration::from_std(policy.retention).unwrap_or(chrono::Duration::MAX);
        let expires = finished + keep;
        p.delete = p.node_writes.is_empty() && now >= expires;
        p.requeue = if p.node_writes.is_empty() {
            (expires - now)
                .to_std()
                .unwrap_or(Duration::from_secs(1))
                .max(Duration::from_secs(1))
        } else {
            Duration::from_secs(1)
        };
        return p;
    }

    match action {
        Action::Ignore => {
            p.phase = Phase::Ignored;
            p.node_writes = release(&seen.nodes);
            p.requeue = Duration::from_secs(300);
            return p;
        }
        Action::Approve => {
            if !decided && spec_status == EventStatus::Scheduled {
                p.decide_approval = Some(format!(
                    "policy approves {} events of {}s at once",
                    ev.spec.event_type, ev.spec.duration_seconds
                ));
            }
            p.phase = if started {
                Phase::Started
            } else {
                Phase::Approved
            };
            p.node_writes = release(&seen.nodes);
            p.requeue = Duration::from_secs(10);
            return p;
        }
        Action::Cordon | Action::Drain | Action::DrainAndApprove => {}
    }

    let mapped: Vec<&ObservedNode> = seen
        .nodes
        .iter()
        .filter(|n| !n.vm_name.is_empty())
        .collect();
    let budget = drain_budget(
        ev.spec.not_before,
        Duration::from_secs(policy.drain_margin_seconds),
        now,
    );
    for n in &mapped {
        let held = n.holds.contains(&me);
        if !held {
            let mut holds = n.holds.clone();
            holds.push(me.clone());
            if !n.cordoned {
                p.node_writes.push(NodeWrite::Cordon {
                    node: n.name.clone(),
                    holds,
                });
            } else if !n.holds.is_empty() {
                // Cordoned by forewarn for another event: share the hold.
                p.node_writes.push(NodeWrite::AddHold {
                    node: n.name.clone(),
                    holds,
                });
            }
            // Else cordoned by someone else (rule 4): leave it so, record nothing.
        }
        if action.drains() {
            for pod in n.pods.iter().filter(|pod| !pod.terminating) {
                p.evictions.push(Eviction {
                    node: n.name.clone(),
                    grace_seconds: budget.map_or(pod.grace_seconds, |b| pod.grace_seconds.min(b)),
                    pod: pod.clone(),
                });
            }
        }
    }
    // Nodes that hold a cordon for the event but no longer map to it.
    let stray: Vec<ObservedNode> = seen
        .nodes
        .iter()
        .filter(|n| n.vm_name.is_empty())
        .cloned()
        .collect();
    p.node_writes.extend(release(&stray));

    let all_drained = !mapped.is_empty() && mapped.iter().all(|n| n.pods.is_empty());
    let foreign_ok = seen.unmapped.is_empty() || policy.approve_foreign_vms;
    if action == Action::DrainAndApprove && spec_status == EventStatus::Scheduled && !decided {
        if all_drained && foreign_ok {
            p.decide_approval = Some(format!("all {} affected nodes drained", mapped.len()));
        } else if mapped.is_empty() && !seen.unmapped.is_empty() && policy.approve_foreign_vms {
            p.decide_approval =
                Some("no affected node in this cluster; policy approves foreign VMs".into());
        } else if all_drained {
            p.approval_withheld = Some(format!(
                "Resources names VMs that are no node of this cluster: {}",
                seen.unmapped.join(", ")
            ));
        } else if mapped.is_empty() {
            p.approval_withheld = Some(format!(
                "no entry of Resources maps to a node of this cluster: {}",
                seen.unmapped.join(", ")
            ));
        }
    }

    p.phase = if started {
        Phase::Started
    } else if decided || p.decide_approval.is_some() {
        Phase::Approved
    } else if action.drains() && all_drained {
        Phase::Drained
    } else if action.drains() && !mapped.is_empty() {
        Phase::Draining
    } else {
        Phase::Pending
    };
    p.requeue = match p.phase {
        Phase::Draining => Duration::from_secs(2),
        Phase::Started if action.drains() && !all_drained => Duration::from_secs(2),
        Phase::Started => Duration::from_secs(10),
        _ => Duration::from_secs(5),
    };
    p
}

fn set_condition(
    conditions: &mut Vec<Condition>,
    prev: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    now: DateTime<Utc>,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let last_transition_time = prev
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(now, |c| c.last_transition_time);
    conditions.push(Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message,
        last_transition_time,
    });
}

/// The status after `plan` was carried out with `outcomes`
/// (`(node, pod name, outcome)` of each eviction).
pub fn next_status(
    ev: &ScheduledEvent,
    seen: &Observed,
    plan: &Plan,
    outcomes: &[(String, String, EvictionOutcome)],
    now: DateTime<Utc>,
) -> ScheduledEventStatus {
    let me = name_of(ev);
    let prev = ev.status.clone().unwrap_or_default();
    let prev_nodes = prev.nodes.clone().unwrap_or_default();
    let prev_conditions = prev.conditions.clone().unwrap_or_default();
    let released: Vec<&str> = plan
        .node_writes
        .iter()
        .filter(|w| matches!(w, NodeWrite::Release { .. }))
        .map(NodeWrite::node)
        .collect();

    let mut nodes = Vec::new();
    for n in seen.nodes.iter().filter(|n| !n.vm_name.is_empty()) {
        let held_now = (n.holds.contains(&me)
            || plan
                .node_writes
                .iter()
                .any(|w| matches!(w, NodeWrite::Cordon { node, .. } | NodeWrite::AddHold { node, .. } if *node == n.name)))
            && !released.contains(&n.name.as_str());
        let blocked_by = outcomes
            .iter()
            .filter(|(node, _, _)| *node == n.name)
            .find_map(|(_, _, o)| match o {
                EvictionOutcome::Blocked(why) => Some(why.clone()),
                _ => None,
            });
        let before = prev_nodes.iter().find(|p| p.name == n.name);
        let drained_at = before
            .and_then(|b| b.drained_at)
            .or_else(|| (plan.action.drains() && n.pods.is_empty()).then_some(now));
        nodes.push(NodeProgress {
            name: n.name.clone(),
            vm_name: n.vm_name.clone(),
            cordoned_by_us: held_now,
            already_cordoned: n.cordoned && n.holds.is_empty() && !held_now,
            pods_remaining: i32::try_from(n.pods.len()).unwrap_or(i32::MAX),
            blocked_by,
            drained_at: if n.pods.is_empty() { drained_at } else { None },
        });
    }
    // Keep the record of nodes that were released or left the mapping.
    if plan.phase.is_final() || plan.phase == Phase::Ignored {
        for p in &prev_nodes {
            if !nodes.iter().any(|n| n.name == p.name) {
                nodes.push(NodeProgress {
                    cordoned_by_us: false,
                    ..p.clone()
                });
            }
        }
        for n in &mut nodes {
            if released.contains(&n.name.as_str()) {
                n.cordoned_by_us = false;
            }
        }
    }

    let drained = nodes.iter().filter(|n| n.drained_at.is_some()).count();
    let mut approval = prev.approval.clone().map(|a| Approval {
        sent_at: None,
        sent_by: None,
        result: None,
        ..a
    });
    if let Some(reason) = &plan.decide_approval {
        approval = Some(Approval {
            decided_at: Some(now),
            reason: Some(reason.clone()),
            ..Default::default()
        });
    }

    let mut conditions = Vec::new();
    if plan.action.drains() && !plan.phase.is_final() {
        let pending: Vec<String> = nodes
            .iter()
            .filter(|n| n.pods_remaining > 0)
            .map(|n| format!("{} ({} pods)", n.name, n.pods_remaining))
            .collect();
        set_condition(
            &mut conditions,
            &prev_conditions,
            "Drained",
            pending.is_empty() && !nodes.is_empty(),
            if pending.is_empty() {
                "AllNodesDrained"
            } else {
                "PodsRemaining"
            },
            if pending.is_empty() {
                String::new()
            } else {
                pending.join(", ")
            },
            now,
        );
        let blocked: Vec<String> = nodes
            .iter()
            .filter_map(|n| n.blocked_by.as_ref().map(|b| format!("{}: {b}", n.name)))
            .collect();
        set_condition(
            &mut conditions,
            &prev_conditions,
            "DrainBlocked",
            !blocked.is_empty(),
            if blocked.is_empty() {
                "NotBlocked"
            } else {
                "PodDisruptionBudget"
            },
            blocked.join("; "),
            now,
        );
        let incomplete = plan.phase == Phase::Started && !pending.is_empty();
        set_condition(
            &mut conditions,
            &prev_conditions,
            "DrainIncomplete",
            incomplete,
            if incomplete {
                "StartedBeforeDrained"
            } else {
                "NotStarted"
            },
            if incomplete {
                format!("event started with {} still draining", pending.join(", "))
            } else {
                String::new()
            },
            now,
        );
    }
    if let Some(why) = &plan.approval_withheld {
        set_condition(
            &mut conditions,
            &prev_conditions,
            "ApprovalWithheld",
            true,
            "ForeignResources",
            why.clone(),
            now,
        );
    }

    let spec_started = ev.spec.event_status == EventStatus::Started.to_string();
    ScheduledEventStatus {
        phase: Some(plan.phase.as_str().into()),
        action: Some(plan.action.as_str().into()),
        nodes_drained: Some(format!("{drained}/{}", nodes.len())),
        nodes: Some(nodes),
        unmapped_resources: Some(seen.unmapped.clone()),
        approval,
        first_seen: prev.first_seen.or(Some(now)),
        started_at: prev.started_at.or_else(|| spec_started.then_some(now)),
        finished_at: if plan.phase.is_final() {
            prev.finished_at.or(Some(now))
        } else {
            None
        },
        conditions: Some(conditions),
    }
}

#[cfg(test)]
mod tests;
