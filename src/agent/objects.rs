//! The agent's writes of `ScheduledEvent` specs: each listed event written
//! forward, each event that left the document completed, and the start-up
//! sweep of events that ended while the agent was away.
//!
//! A new object is created (`POST`), an existing one replaced whole (`PUT`)
//! conditional on the `resourceVersion` it was read at, both with field
//! manager `forewarn-agent`: the spec stored is exactly the spec written, so
//! a field IMDS dropped (`NotBefore` once `Started`) leaves the object and
//! `managedFields` with it. Server-side apply would not do: it removes only
//! fields its own Apply entry owns, and cannot create conditionally.

use std::collections::HashSet;

use chrono::Utc;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use tracing::{error, info};

use super::{Agent, Error, Result, STALE_AFTER, error_chain, mirror};
use crate::crd::{
    AGENT_MANAGER, Report, ScheduledEvent, ScheduledEventReport, ScheduledEventSpec, report_name,
    resources_digest,
};

/// The report an agent last wrote about an event, and the UID of the
/// `ScheduledEvent` object it is about (a new object of the same name is
/// reported afresh).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Reported {
    uid: String,
    report: Report,
}
use crate::imds::model::{Document, Event, EventStatus, object_name};

impl Agent {
    /// Writes each listed event forward and completes the ones that left,
    /// each on its own; returns the number of writes that failed (retried
    /// on the next tick).
    pub(super) async fn mirror(&mut self, work: mirror::Work) -> usize {
        let mut failures = 0;
        for (ev, new_here) in work.listed {
            let name = ev.object_name();
            match self.mirror_event(&ev, new_here).await {
                Ok(stored) => {
                    self.metrics.mirror_writes.with_label_values(&["ok"]).inc();
                    let mut reported = true;
                    let appearance = stored.as_ref().map(|o| o.spec.appearance);
                    if let Some(obj) = &stored {
                        let report = self.own_report(
                            &ev.resources,
                            (&ev.event_status).into(),
                            obj.spec.appearance,
                        );
                        let uid = obj.uid().unwrap_or_default();
                        if let Err(e) = self.report(&name, &uid, report).await {
                            failures += 1;
                            reported = false;
                            error!(event = %name, error = %error_chain(&e), "Could not write this agent's report; will retry");
                        }
                    }
                    // Not reported: listed again on the next tick.
                    self.tracked.insert(
                        name,
                        mirror::Tracked {
                            written: reported.then_some(ev),
                            appearance,
                            gone: false,
                        },
                    );
                }
                Err(e) => {
                    failures += 1;
                    self.metrics
                        .mirror_writes
                        .with_label_values(&["error"])
                        .inc();
                    error!(event = %name, error = %error_chain(&e), "Could not mirror the event; will retry");
                }
            }
        }
        for (name, known) in work.completions {
            if let Some(t) = self.tracked.get_mut(&name) {
                t.gone = true;
            }
            match self.complete(&name, known).await {
                Ok(()) => {
                    self.tracked.remove(&name);
                    self.reported.remove(&name);
                }
                Err(e) => {
                    failures += 1;
                    self.metrics
                        .mirror_writes
                        .with_label_values(&["error"])
                        .inc();
                    error!(event = %name, error = %error_chain(&e), "Could not mark the event Completed; will retry");
                }
            }
        }
        failures
    }

    /// Marks an event that left the document `Completed` (if it is not yet,
    /// and is not in an appearance later than `known`), and reports it
    /// ended in this agent's own entry.
    async fn complete(&mut self, name: &str, known: Option<u32>) -> Result<()> {
        let written = self
            .write_forward(name, |stored| {
                stored.and_then(|s| mirror::plan_completed(s, known))
            })
            .await;
        let (done, stored) = match written {
            Ok(w) => w,
            Err(e) => {
                // The spec write lost its races with other agents (or
                // failed): this agent's own word that the event left its
                // document does not wait for it. Retried on the next tick.
                let gone = self
                    .reported
                    .get(name)
                    .filter(|r| known.is_none_or(|k| k == r.report.appearance))
                    .map(|r| {
                        let report = Report {
                            event_status: crate::crd::EventStatus::Completed,
                            ..r.report.clone()
                        };
                        (r.uid.clone(), report)
                    });
                if let Some((uid, gone)) = gone
                    && let Err(report_error) = self.report(name, &uid, gone).await
                {
                    error!(event = %name, error = %error_chain(&report_error), "Could not write this agent's report; will retry");
                }
                return Err(e);
            }
        };
        if done {
            info!(event = %name, "Event left the IMDS document; marked Completed");
        }
        if let Some(obj) = stored
            && known.is_none_or(|k| k == obj.spec.appearance)
        {
            let report = self.own_report(
                &obj.spec.resources,
                crate::crd::EventStatus::Completed,
                obj.spec.appearance,
            );
            self.report(name, &obj.uid().unwrap_or_default(), report)
                .await?;
        }
        Ok(())
    }

    /// This agent's view of an event listed with `resources` and `status`.
    fn own_report(
        &self,
        resources: &[String],
        status: crate::crd::EventStatus,
        appearance: u32,
    ) -> Report {
        Report {
            node: self.node.clone(),
            vm: self.vm.clone(),
            named: resources.iter().any(|r| r.eq_ignore_ascii_case(&self.vm)),
            event_status: status,
            appearance,
            resources_digest: resources_digest(resources),
        }
    }

    /// Writes this agent's `ScheduledEventReport` about the event `name`
    /// (object UID `uid`) when it differs from the one it last wrote: a
    /// server-side apply (field manager `forewarn-agent`) of the object
    /// `<event>.<node>`, owned by the event (deleted with it by the garbage
    /// collector). No other agent
    /// writes that object, so a hundred agents reporting one event never
    /// contend for one object.
    ///
    /// A move from `Scheduled` to `Started` is not written: the controller
    /// needs to know that a node's own agent lists the event, and when it
    /// stops listing it, so each agent writes its report twice per event
    /// (first seen, gone), not at every change of status.
    async fn report(&mut self, name: &str, uid: &str, report: Report) -> Result<()> {
        let live = |r: &Report| r.event_status != crate::crd::EventStatus::Completed;
        if self.reported.get(name).is_some_and(|had| {
            had.uid == uid
                && (had.report == report
                    || (had.report.appearance == report.appearance
                        && had.report.named == report.named
                        && had.report.resources_digest == report.resources_digest
                        && live(&had.report)
                        && live(&report)))
        }) {
            return Ok(());
        }
        let Some(object) = report_name(name, &self.node) else {
            return Err(Error::ReportName {
                name: name.into(),
                node: self.node.clone(),
            });
        };
        let body = serde_json::json!({
            "apiVersion": ScheduledEventReport::api_version(&()),
            "kind": ScheduledEventReport::kind(&()),
            "metadata": {
                "name": object,
                "ownerReferences": [{
                    "apiVersion": ScheduledEvent::api_version(&()),
                    "kind": ScheduledEvent::kind(&()),
                    "name": name,
                    "uid": uid,
                }],
            },
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
        self.reported.insert(
            name.into(),
            Reported {
                uid: uid.into(),
                report,
            },
        );
        Ok(())
    }

    /// Mirrors one listed event; returns the object as stored afterwards.
    async fn mirror_event(&self, ev: &Event, new_here: bool) -> Result<Option<ScheduledEvent>> {
        let name = ev.object_name();
        let seen = mirror::spec_for(ev);
        let (wrote, now) = self
            .write_forward(&name, |stored| {
                mirror::plan_listed(stored, seen.clone(), new_here)
            })
            .await?;
        if wrote && let Some(spec) = now.as_ref().map(|o| &o.spec) {
            if spec.appearance > 1 && new_here {
                info!(event = %name, appearance = spec.appearance, status = %spec.event_status,
                    "Event listed again after it was recorded Completed; new appearance");
            }
            info!(event = %name, event_id = %spec.event_id, r#type = %spec.event_type, status = %spec.event_status,
                appearance = spec.appearance, resources = ?spec.resources, "Mirrored event");
        }
        Ok(now)
    }

    /// Writes `next(stored spec)` when it is `Some`; returns whether it
    /// wrote, and the object now stored (`None`: no object).
    ///
    /// A new object is created (two agents creating it at once cannot
    /// overwrite each other: the second gets a 409 and merges); an existing
    /// one is replaced only if nobody wrote it since it was read
    /// (`resourceVersion`), so a lagging agent never moves its status back.
    /// Conflicts, normal when several agents see one event, are re-read and
    /// merged a few times, then left to the next tick.
    async fn write_forward(
        &self,
        name: &str,
        next: impl Fn(Option<&ScheduledEventSpec>) -> Option<ScheduledEventSpec>,
    ) -> Result<(bool, Option<ScheduledEvent>)> {
        let params = PostParams {
            field_manager: Some(AGENT_MANAGER.into()),
            ..PostParams::default()
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let stored = self
                .api
                .get_opt(name)
                .await
                .map_err(|source| Error::GetEvent {
                    name: name.into(),
                    source,
                })?;
            let Some(spec) = next(stored.as_ref().map(|o| &o.spec)) else {
                return Ok((false, stored));
            };
            let written = match stored {
                None => {
                    self.api
                        .create(&params, &ScheduledEvent::new(name, spec.clone()))
                        .await
                }
                Some(mut obj) => {
                    // The whole object as read, with the new spec: metadata
                    // others own is sent back unchanged, `status` is ignored
                    // on this endpoint (status subresource), and the
                    // `resourceVersion` makes it conditional.
                    obj.spec = spec.clone();
                    obj.metadata.managed_fields = None;
                    self.api.replace(name, &params, &obj).await
                }
            };
            match written {
                Ok(obj) => return Ok((true, Some(obj))),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < 3 => {}
                Err(source) => {
                    return Err(Error::WriteEvent {
                        name: name.into(),
                        source,
                    });
                }
            }
        }
    }

    /// After a restart the agent has no memory of its previous document:
    /// objects that name this VM, are not finished, and are absent from its
    /// document have left IMDS while it was away (IMDS delivers an event to
    /// every VM it names). Returns whether some were too young to judge and
    /// the sweep must run again later.
    pub(super) async fn sweep_stale(&mut self, doc: &Document) -> Result<bool> {
        let all = self
            .api
            .list(&ListParams::default())
            .await
            .map_err(|source| Error::ListEvents { source })?;
        let listed: HashSet<String> = doc
            .events
            .iter()
            .map(Event::object_name)
            .chain(
                doc.rejected
                    .iter()
                    .filter_map(|r| r.event_id.as_deref().map(object_name)),
            )
            .collect();
        let now = Utc::now();
        let mut deferred = false;
        for obj in all {
            let name = obj.meta().name.clone().unwrap_or_default();
            let names_me = obj
                .spec
                .resources
                .iter()
                .any(|r| r.eq_ignore_ascii_case(&self.vm));
            let finished =
                EventStatus::from(obj.spec.event_status.as_str()) == EventStatus::Completed;
            if !names_me || listed.contains(&name) || finished {
                continue;
            }
            let old = obj
                .meta()
                .creation_timestamp
                .as_ref()
                .is_some_and(|t| now.timestamp() - t.0.as_second() > STALE_AFTER.num_seconds());
            if old {
                self.complete(&name, None).await?;
            } else {
                deferred = true;
            }
        }
        Ok(deferred)
    }
}
