//! The policy's `nodeSelector` and `excludePods` as the plan and the status
//! read them: a node outside the selector is left alone and named; an
//! excluded pod is kept, reported and not waited for.

use super::*;
use crate::api::ScheduledEventStatus;
use crate::controller::decide::status::next_status;
use crate::fixtures;

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-21T10:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

fn scheduled(type_: &str, resources: &[&str]) -> ScheduledEvent {
    let mut ev = ScheduledEvent::new(
        "ev-1",
        fixtures::spec("EV-1")
            .event_type(type_)
            .vms(resources.iter().copied())
            .not_before(Some(now() + chrono::Duration::minutes(10)))
            .build(),
    );
    ev.status = None;
    ev
}

fn pod(namespace: &str, name: &str) -> Arc<PodInfo> {
    Arc::new(PodInfo {
        namespace: namespace.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        managed: true,
        grace_seconds: 30,
        ..PodInfo::default()
    })
}

fn node(name: &str, vm: &str, held: bool, pods: Vec<Arc<PodInfo>>) -> ObservedNode {
    ObservedNode {
        name: name.into(),
        vm_name: vm.into(),
        cordoned: held,
        holds: if held { vec!["ev-1".into()] } else { vec![] },
        pods,
        ..ObservedNode::default()
    }
}

fn cond(st: &ScheduledEventStatus, type_: &str) -> Option<(String, String, String)> {
    st.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[test]
fn an_event_on_unmanaged_nodes_only_is_recorded_and_left_alone() {
    let ev = scheduled("Reboot", &["vm_spot", "vm_sys"]);
    let seen = Observed {
        unmanaged: vec!["node-spot".into(), "node-sys".into()],
        ..Observed::default()
    };
    for policy in [
        Policy::default(),
        Policy::parse("defaultAction: Approve\n", "p").unwrap(),
    ] {
        let p = plan(&ev, &seen, &policy, now());
        assert_eq!((p.action, p.phase), (Action::Ignore, Phase::Ignored));
        assert!(p.node_writes.is_empty() && p.evictions.is_empty());
        assert_eq!(p.decide_approval, None, "forewarn sends no approval");
        assert_eq!(p.requeue, Duration::from_secs(10));
        let st = next_status(&ev, &seen, &p, &[], now());
        assert_eq!(
            st.unmanaged_nodes,
            Some(vec!["node-spot".to_string(), "node-sys".to_string()])
        );
        assert!(st.approval.is_none());
        let (status, reason, message) = cond(&st, "NodesUnmanaged").unwrap();
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "NoManagedNode")
        );
        assert!(message.contains("node-spot"), "{message}");
    }
}

#[test]
fn a_node_whose_labels_left_the_selector_is_released() {
    // node-1 held the event's cordon, then its labels changed: it no longer
    // maps (observe puts it among the stray nodes, without a VM).
    let ev = scheduled("Reboot", &["vm_1"]);
    let seen = Observed {
        nodes: vec![node("node-1", "", true, vec![])],
        unmanaged: vec!["node-1".into()],
        ..Observed::default()
    };
    let p = plan(&ev, &seen, &Policy::default(), now());
    assert_eq!(
        p.node_writes,
        vec![NodeWrite::Release {
            node: "node-1".into(),
            holds: vec![],
            uncordon: true
        }]
    );
}

#[test]
fn the_approval_waits_for_the_managed_nodes_only() {
    let ev = scheduled("Reboot", &["vm_1", "vm_2"]);
    let draining = Observed {
        nodes: vec![node("node-1", "vm_1", true, vec![pod("shop", "web-0")])],
        unmanaged: vec!["node-2".into()],
        ..Observed::default()
    };
    let p = plan(&ev, &draining, &Policy::default(), now());
    assert_eq!(p.phase, Phase::Draining);
    assert_eq!(p.evictions.len(), 1);
    assert!(p.node_writes.iter().all(|w| w.node() == "node-1"));
    assert_eq!(p.decide_approval, None);

    let drained = Observed {
        nodes: vec![node("node-1", "vm_1", true, vec![])],
        ..draining.clone()
    };
    let p = plan(&ev, &drained, &Policy::default(), now());
    assert_eq!(
        p.decide_approval.as_deref(),
        Some("all 1 affected nodes drained")
    );
    let st = next_status(&ev, &drained, &p, &[], now());
    assert_eq!(st.unmanaged_nodes, Some(vec!["node-2".to_string()]));
    assert_eq!(st.nodes_drained.as_deref(), Some("1/1"));
    let (status, reason, _) = cond(&st, "NodesUnmanaged").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "OutsideNodeSelector")
    );

    // Every node managed again: the condition clears, the list goes.
    let managed = Observed {
        unmanaged: vec![],
        ..drained
    };
    let mut again = ev.clone();
    again.status = Some(st);
    let p = plan(&again, &managed, &Policy::default(), now());
    let st = next_status(&again, &managed, &p, &[], now());
    assert_eq!(st.unmanaged_nodes, None);
    assert_eq!(cond(&st, "NodesUnmanaged").unwrap().1, "AllManaged");
}

#[test]
fn excluded_pods_are_kept_reported_and_not_waited_for() {
    let ev = scheduled("Reboot", &["vm_1"]);
    let mut n = node("node-1", "vm_1", true, vec![pod("shop", "web-0")]);
    n.excluded = vec![(
        pod("monitoring", "agent-0"),
        "its namespace is in the policy's excludePods.namespaces",
    )];
    let seen = Observed {
        nodes: vec![n.clone()],
        ..Observed::default()
    };
    let p = plan(&ev, &seen, &Policy::default(), now());
    let evicted: Vec<String> = p.evictions.iter().map(|e| e.pod.key()).collect();
    assert_eq!(evicted, ["shop/web-0"]);
    assert_eq!(p.kept.len(), 1);
    assert!(p.kept[0].excluded && p.kept[0].pod == "monitoring/agent-0");

    // Once the evicted pod is gone the node is drained with the excluded
    // pod still on it, and the approval is decided.
    n.pods.clear();
    let seen = Observed {
        nodes: vec![n],
        ..Observed::default()
    };
    let p = plan(&ev, &seen, &Policy::default(), now());
    assert!(p.evictions.is_empty());
    assert_eq!(
        p.decide_approval.as_deref(),
        Some("all 1 affected nodes drained")
    );
    let st = next_status(&ev, &seen, &p, &[], now());
    let kept = &st.nodes.as_ref().unwrap()[0].pods_kept;
    assert_eq!(kept.len(), 1);
    assert!(
        kept[0].starts_with("monitoring/agent-0: excluded from eviction"),
        "{kept:?}"
    );
    let (status, reason, _) = cond(&st, "PodsKept").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ExcludedByPolicy")
    );
}

#[test]
fn a_pod_without_a_controller_still_holds_the_approval_beside_an_excluded_one() {
    let ev = scheduled("Reboot", &["vm_1"]);
    let mut bare = (*pod("shop", "bare")).clone();
    bare.managed = false;
    let mut n = node("node-1", "vm_1", true, vec![Arc::new(bare)]);
    n.excluded = vec![(pod("monitoring", "agent-0"), "excluded")];
    let seen = Observed {
        nodes: vec![n],
        ..Observed::default()
    };
    let p = plan(&ev, &seen, &Policy::default(), now());
    assert_eq!(p.decide_approval, None);
    let why = p.approval_withheld.unwrap();
    assert!(
        why.contains("shop/bare") && !why.contains("agent-0"),
        "{why}"
    );
}

#[test]
fn a_mixed_event_keeps_its_action_once_its_managed_node_is_released() {
    // Over, its managed node released (no longer handled): the record of
    // node-1 says the event had a managed node.
    let mut ev = scheduled("Reboot", &["vm_1", "vm_2"]);
    ev.spec.event_status = crate::api::EventStatus::Completed;
    ev.status = Some(ScheduledEventStatus {
        nodes: Some(vec![crate::api::NodeProgress {
            name: "node-1".into(),
            vm_name: "vm_1".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let seen = Observed {
        unmanaged: vec!["node-2".into()],
        ..Observed::default()
    };
    let p = plan(&ev, &seen, &Policy::default(), now());
    assert_eq!(p.action, Action::DrainAndApprove);
    let st = next_status(&ev, &seen, &p, &[], now());
    assert_eq!(
        cond(&st, "NodesUnmanaged").unwrap().1,
        "OutsideNodeSelector"
    );
    // While it is live, a managed node awaiting its trusted report counts.
    let mut live = scheduled("Reboot", &["vm_1", "vm_2"]);
    live.status = None;
    let waiting = Observed {
        unmanaged: vec!["node-2".into()],
        any_managed: true,
        ..Observed::default()
    };
    assert_eq!(
        plan(&live, &waiting, &Policy::default(), now()).action,
        Action::DrainAndApprove
    );
}

#[test]
fn a_cordon_someone_else_lifts_mid_event_is_taken_over() {
    // AKS cordoned node-1 first (forewarn recorded nothing on it), then
    // lifted its cordon while the event is live: forewarn cordons it, its
    // own cordon now.
    let ev = scheduled("Redeploy", &["vm_1"]);
    let aks_first = Observed {
        nodes: vec![node("node-1", "vm_1", false, vec![])],
        ..Observed::default()
    };
    let mut theirs = aks_first.clone();
    theirs.nodes[0].cordoned = true;
    assert!(
        plan(&ev, &theirs, &Policy::default(), now())
            .node_writes
            .is_empty()
    );
    assert_eq!(
        plan(&ev, &aks_first, &Policy::default(), now()).node_writes,
        vec![NodeWrite::Cordon {
            node: "node-1".into(),
            holds: vec!["ev-1".into()]
        }]
    );
}
