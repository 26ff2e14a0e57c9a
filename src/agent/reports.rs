//! The agent's only write: its own `ScheduledEventReport` per event, its
//! complete view of the event from its own IMDS document (DESIGN.md, Trust).
//!
//! The pure part ([`plan`]) says which reports a document asks for, from
//! what the agent last wrote; the I/O part applies them by server-side apply
//! (field manager `forewarn-agent`) and, at start, reads back the reports
//! this agent wrote before it restarted. One apply per change of its view
//! (first seen `Scheduled`, `Started`, gone from the document, an approval
//! sent); no read-modify-write, no conditional replace: no other writer
//! touches the object, so there is nothing to conflict with.

use std::collections::{HashMap, HashSet};

use kube::Resource;
use kube::api::{ListParams, Patch, PatchParams};
use tracing::{info, warn};

use super::{Agent, Error, Result, error_chain};
use crate::crd::{
    AGENT_MANAGER, EventStatus as CrdStatus, Report, ScheduledEventReport, report_name,
};
use crate::imds::model::{Document, Event, object_name};

/// This agent's view of `ev`, listed in a document of `incarnation`, as
/// appearance `appearance`. An `EventStatus` this version does not know is
/// reported as `Started` (see [`crate::crd::EventStatus`]).
pub fn view_of(ev: &Event, node: &str, vm: &str, incarnation: i64, appearance: u32) -> Report {
    Report {
        node: node.to_owned(),
        vm: vm.to_owned(),
        named: ev.names_vm(vm),
        event_status: (&ev.event_status).into(),
        appearance,
        event_id: ev.event_id.clone(),
        event_type: ev.event_type.to_string(),
        event_source: ev.event_source.clone(),
        resource_type: ev.resource_type.clone(),
        resources: ev.resources.clone(),
        not_before: ev.not_before,
        duration_seconds: ev.duration_seconds,
        description: ev.description.clone(),
        document_incarnation: incarnation,
        approvals: Vec::new(),
    }
}

/// The identity digest of `ev` as this agent would report it
/// ([`crate::crd::identity_digest`]): what an approval decision is bound to.
pub fn digest_of(ev: &Event) -> String {
    crate::crd::identity_digest(
        &ev.event_id,
        &ev.event_type.to_string(),
        &ev.event_source,
        &ev.resource_type,
        &ev.resources,
        ev.duration_seconds,
    )
}

/// Whether two views say the same of the event (the document incarnation
/// aside: it changes whenever any event of the document does).
fn same_view(a: &Report, b: &Report) -> bool {
    Report {
        document_incarnation: 0,
        ..a.clone()
    } == Report {
        document_incarnation: 0,
        ..b.clone()
    }
}

/// The reports `doc` asks this agent to write, by event object name, given
/// the reports it last wrote (`reported`):
///
/// - a listed event not reported, or reported `Completed` (it came back:
///   the appearance goes up by one), or whose view changed;
/// - a reported live event the document no longer lists: `Completed`, with
///   the content it had. An entry the parser rejected but whose `EventId`
///   it could read counts as listed (neither written nor ended).
///
/// Approvals already sent stay in the report of the same appearance.
pub fn plan(
    doc: &Document,
    reported: &HashMap<String, Report>,
    node: &str,
    vm: &str,
) -> Vec<(String, Report)> {
    let mut out = Vec::new();
    let mut listed = HashSet::new();
    for ev in &doc.events {
        let name = ev.object_name();
        if !listed.insert(name.clone()) {
            continue;
        }
        let before = reported.get(&name);
        let appearance = match before {
            None => 1,
            Some(b) if !b.is_listed() => b.appearance.saturating_add(1),
            Some(b) => b.appearance,
        };
        let mut view = view_of(ev, node, vm, doc.incarnation, appearance);
        if let Some(b) = before.filter(|b| b.appearance == appearance) {
            view.approvals = b.approvals.clone();
        }
        if before.is_none_or(|b| !same_view(b, &view)) {
            out.push((name, view));
        }
    }
    for r in &doc.rejected {
        if let Some(id) = &r.event_id {
            listed.insert(object_name(id));
        }
    }
    let mut gone: Vec<(String, Report)> = reported
        .iter()
        .filter(|(name, r)| r.is_listed() && !listed.contains(*name))
        .map(|(name, r)| {
            (
                name.clone(),
                Report {
                    event_status: CrdStatus::Completed,
                    document_incarnation: doc.incarnation,
                    ..r.clone()
                },
            )
        })
        .collect();
    gone.sort_by(|a, b| a.0.cmp(&b.0));
    out.extend(gone);
    out
}

impl Agent {
    /// Reads the reports this agent wrote before it (re)started, so that it
    /// goes on from them: an appearance continues, an event that left its
    /// document while it was away is reported `Completed` on the next poll.
    pub(super) async fn restore(&mut self) -> Result<()> {
        let all = self
            .reports
            .list(&ListParams::default())
            .await
            .map_err(|source| Error::ListReports { source })?;
        for r in all {
            if r.spec.report.node != self.node {
                continue;
            }
            self.reported
                .insert(r.spec.scheduled_event.clone(), r.spec.report.clone());
        }
        info!(
            reports = self.reported.len(),
            "Read this agent's earlier reports"
        );
        Ok(())
    }

    /// Applies each report `doc` asks for; returns how many failed (tried
    /// again on the next poll: what was not written is planned again).
    pub(super) async fn write_reports(&mut self, doc: &Document) -> usize {
        let mut failures = 0;
        for (name, report) in plan(doc, &self.reported, &self.node, &self.vm) {
            match self.apply_report(&name, report).await {
                Ok(()) => self.metrics.mirror_writes.with_label_values(&["ok"]).inc(),
                Err(e) => {
                    failures += 1;
                    self.metrics
                        .mirror_writes
                        .with_label_values(&["error"])
                        .inc();
                    warn!(event = %name, error = %error_chain(&e), "Could not write this agent's report; will retry");
                }
            }
        }
        failures
    }

    /// Writes `report` as this agent's `ScheduledEventReport` about the
    /// event `name`: a server-side apply of the whole object
    /// `<event>.<node>` (field manager `forewarn-agent`, forced: no other
    /// writer owns its fields).
    pub(super) async fn apply_report(&mut self, name: &str, report: Report) -> Result<()> {
        let Some(object) = report_name(name, &self.node) else {
            return Err(Error::ReportName {
                name: name.into(),
                node: self.node.clone(),
            });
        };
        let body = serde_json::json!({
            "apiVersion": ScheduledEventReport::api_version(&()),
            "kind": ScheduledEventReport::kind(&()),
            "metadata": { "name": object },
            "spec": { "scheduledEvent": name, "report": report },
        });
        self.reports
            .patch(
                &object,
                &PatchParams::apply(AGENT_MANAGER).force(),
                &Patch::Apply(body),
            )
            .await
            .map_err(|source| Error::WriteReport {
                name: name.into(),
                source,
            })?;
        if report.event_status == CrdStatus::Completed {
            info!(event = %name, appearance = report.appearance, "Reported the event gone from this VM's document");
        } else {
            info!(event = %name, event_id = %report.event_id, r#type = %report.event_type,
                status = %report.event_status, appearance = report.appearance,
                resources = ?report.resources, "Reported the event");
        }
        self.reported.insert(name.into(), report);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::imds::model::parse_document;

    fn doc(json: &str) -> Document {
        parse_document(json.as_bytes()).unwrap()
    }

    const SCHEDULED: &str = r#"{"DocumentIncarnation":2,"Events":[{"EventId":"ABC-1","EventStatus":"Scheduled","EventType":"Reboot","ResourceType":"VirtualMachine","Resources":["vm_1"],"NotBefore":"Mon, 11 Apr 2022 22:26:58 GMT","Description":"d","EventSource":"Platform","DurationInSeconds":-1}]}"#;
    const STARTED: &str = r#"{"DocumentIncarnation":3,"Events":[{"EventId":"ABC-1","EventStatus":"Started","EventType":"Reboot","ResourceType":"VirtualMachine","Resources":["vm_1"],"NotBefore":"","Description":"d","EventSource":"Platform","DurationInSeconds":-1}]}"#;
    const EMPTY: &str = r#"{"DocumentIncarnation":4,"Events":[]}"#;

    fn apply(reported: &mut HashMap<String, Report>, writes: &[(String, Report)]) {
        for (n, r) in writes {
            reported.insert(n.clone(), r.clone());
        }
    }

    #[test]
    fn one_write_per_change_of_the_view() {
        let mut reported = HashMap::new();
        let first = plan(&doc(SCHEDULED), &reported, "n1", "vm_1");
        assert_eq!(first.len(), 1);
        let (name, r) = &first[0];
        assert_eq!(name, &object_name("ABC-1"));
        assert_eq!(
            (r.event_status, r.appearance, r.named),
            (CrdStatus::Scheduled, 1, true)
        );
        assert_eq!(r.event_id, "ABC-1");
        assert_eq!(r.document_incarnation, 2);
        assert!(r.not_before.is_some());
        apply(&mut reported, &first);
        // The same document again, or another incarnation with the same
        // event: nothing to write.
        assert!(plan(&doc(SCHEDULED), &reported, "n1", "vm_1").is_empty());
        let other_incarnation =
            SCHEDULED.replace("\"DocumentIncarnation\":2", "\"DocumentIncarnation\":7");
        assert!(plan(&doc(&other_incarnation), &reported, "n1", "vm_1").is_empty());
        // Started: one write, NotBefore gone.
        let started = plan(&doc(STARTED), &reported, "n1", "vm_1");
        assert_eq!(started.len(), 1);
        assert_eq!(started[0].1.event_status, CrdStatus::Started);
        assert_eq!(started[0].1.not_before, None);
        apply(&mut reported, &started);
        // Gone: one write, Completed, same appearance.
        let gone = plan(&doc(EMPTY), &reported, "n1", "vm_1");
        assert_eq!(gone.len(), 1);
        assert_eq!(
            (gone[0].1.event_status, gone[0].1.appearance),
            (CrdStatus::Completed, 1)
        );
        apply(&mut reported, &gone);
        assert!(plan(&doc(EMPTY), &reported, "n1", "vm_1").is_empty());
        // Back: a new appearance.
        let back = plan(&doc(SCHEDULED), &reported, "n1", "vm_1");
        assert_eq!(
            (back[0].1.event_status, back[0].1.appearance),
            (CrdStatus::Scheduled, 2)
        );
    }

    #[test]
    fn an_events_digest_is_its_reports() {
        let d = doc(SCHEDULED);
        let ev = &d.events[0];
        assert_eq!(digest_of(ev), view_of(ev, "n1", "vm_1", 2, 1).digest());
        let started = doc(STARTED);
        assert_eq!(
            digest_of(ev),
            digest_of(&started.events[0]),
            "status is no part of it"
        );
    }

    #[test]
    fn an_unknown_status_is_reported_as_started_and_a_rejected_entry_is_not_gone() {
        let paused = SCHEDULED.replace("\"Scheduled\"", "\"Paused\"");
        let w = plan(&doc(&paused), &HashMap::new(), "n1", "vm_1");
        assert_eq!(w[0].1.event_status, CrdStatus::Started);
        let mut reported = HashMap::new();
        apply(&mut reported, &w);
        // The same event, now unparsable (its EventId still readable).
        let broken = r#"{"DocumentIncarnation":5,"Events":[{"EventId":"ABC-1","EventStatus":"Scheduled","EventType":"Reboot","ResourceType":"VirtualMachine","Resources":"not a list"}]}"#;
        assert!(plan(&doc(broken), &reported, "n1", "vm_1").is_empty());
    }

    #[test]
    fn approvals_sent_stay_in_the_report_of_their_appearance_only() {
        let mut reported = HashMap::new();
        let first = plan(&doc(SCHEDULED), &reported, "n1", "vm_9");
        assert!(!first[0].1.named);
        apply(&mut reported, &first);
        let name = first[0].0.clone();
        reported
            .get_mut(&name)
            .unwrap()
            .approvals
            .push(crate::crd::SentApproval {
                appearance: 1,
                digest: "d".into(),
                sent_at: chrono::Utc::now(),
                status: 200,
                body: String::new(),
            });
        let started = plan(&doc(STARTED), &reported, "n1", "vm_9");
        assert_eq!(started[0].1.approvals.len(), 1);
        apply(&mut reported, &started);
        let gone = plan(&doc(EMPTY), &reported, "n1", "vm_9");
        apply(&mut reported, &gone);
        let back = plan(&doc(SCHEDULED), &reported, "n1", "vm_9");
        assert_eq!(back[0].1.appearance, 2);
        assert!(back[0].1.approvals.is_empty());
    }
}
