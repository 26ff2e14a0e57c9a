//! Restarts reported: each `bootID` change the leader sees is announced,
//! as expected (an event that announces a restart affects the node and its
//! window is open) or as unexpected (a Warning Event, the metric
//! `forewarn_controller_unexpected_restarts_total` and a webhook), and the
//! events that affect the node are reconciled at once so that their
//! records show it ([`crate::controller::observe::impact`]).

use std::sync::Arc;

use futures::StreamExt;
use futures::channel::mpsc::UnboundedReceiver;
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use crate::api::ScheduledEvent;
use crate::controller::act::publish::{self, Subject};
use crate::controller::act::writers::Writers;
use crate::controller::observe::caches::Caches;
use crate::controller::observe::facts::Facts;
use crate::controller::observe::heartbeats::Trigger;
use crate::controller::observe::impact::{Change, Window, affects, restart_expected};

/// Reports each `bootID` change the leader sees: an expected restart (an
/// event that announces one affects the node and its window is open) is
/// announced on the event and the node; any other is an unexpected
/// restart. The events that affect the node are reconciled at once, so
/// their records show it.
pub async fn report_restarts(
    caches: Caches,
    writers: Writers,
    trigger: Trigger,
    mut changes: UnboundedReceiver<Change>,
) {
    while let Some(change) = changes.next().await {
        report_restart(&caches, &writers, &trigger, &change);
    }
}

fn report_restart(caches: &Caches, writers: &Writers, trigger: &Trigger, c: &Change) {
    let facts = Facts::read(caches);
    let node = caches.nodes.get(&ObjectRef::new(&c.node));
    let vm = node.as_ref().and_then(|_| facts.vm_of(&c.node));
    let holds = node.as_deref().map(crate::api::holds).unwrap_or_default();
    let events = caches.events.state();
    let affecting: Vec<&Arc<ScheduledEvent>> = events
        .iter()
        .filter(|e| affects(e, vm.as_deref(), &holds))
        .filter(|e| !Window::of(&e.spec, e.status.as_ref()).closed(c.at))
        .collect();
    for e in &affecting {
        let _ = trigger.unbounded_send(ObjectRef::from_obj(e.as_ref()));
    }
    let expected = affecting.iter().find(|e| {
        restart_expected(&e.spec.event_type)
            && Window::of(&e.spec, e.status.as_ref()).contains(c.at)
    });
    if let Some(ev) = expected {
        let note = format!(
            "{} restarted during {} {} (bootID {} -> {}), as the event announced",
            c.node,
            ev.spec.event_type,
            ev.name_any(),
            c.old,
            c.new
        );
        info!(node = %c.node, event = %ev.name_any(), old = %c.old, new = %c.new, "Node restarted, as its event announced");
        publish::publish(
            writers,
            ev,
            Subject::Node(&c.node),
            KubeEventType::Normal,
            "NodeRestarted",
            note,
        );
        return;
    }
    writers.metrics.unexpected_restarts.inc();
    let context = if affecting.is_empty() {
        "outside any Azure Scheduled Event".to_string()
    } else {
        let named: Vec<String> = affecting
            .iter()
            .map(|e| format!("{} {}", e.spec.event_type, e.name_any()))
            .collect();
        format!(
            "while {} affects it, but announces no restart or had not begun",
            named.join(", ")
        )
    };
    let note = format!(
        "{} restarted {context}: bootID {} -> {}",
        c.node, c.old, c.new
    );
    warn!(node = %c.node, old = %c.old, new = %c.new, "Unexpected node restart: {note}");
    if writers.webhooks.is_enabled() {
        writers
            .webhooks
            .notify(crate::notify::message::Message::unexpected_restart(
                &c.node,
                (&c.old, &c.new),
                affecting.first().map(|e| e.as_ref()),
                note.clone(),
            ));
    }
    if let Some(n) = node {
        writers.kube_events.post(
            KubeEvent {
                type_: KubeEventType::Warning,
                reason: "UnexpectedRestart".into(),
                note: Some(crate::controller::act::kube_events::within_note_limit(note)),
                action: "UnexpectedRestart".into(),
                secondary: None,
            },
            n.object_ref(&()),
        );
    }
}
