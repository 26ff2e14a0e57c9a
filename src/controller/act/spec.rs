//! The controller's writes of `ScheduledEvent` objects and specs: it alone
//! creates them, from the agents' reports (see [`crate::controller::observe::trust::build`]), and
//! writes their spec (field manager `forewarn-controller`).
//!
//! A spec is written whole by a JSON merge patch that names every field
//! (an absent `notBefore` as `null`), so the spec stored is exactly the spec
//! built, with no field left behind, conditional on the version the pass
//! read ([`spec_patch`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use crate::api::{
    CONTROLLER_MANAGER, Report, ScheduledEvent, ScheduledEventReport, ScheduledEventSpec,
    report_name,
};
use crate::controller::act::writers::{Writers, conditional_on};
use crate::controller::error::{Error, Result};
use crate::controller::observe::caches::Caches;
use crate::controller::observe::created::Created;
use crate::controller::observe::facts::Facts;
use crate::controller::observe::intake;
use crate::controller::observe::reports::reports_about;
use crate::controller::observe::trust;

/// How often the controller looks for events that have reports and no
/// object, besides each time a report changes: an object deleted by hand
/// while IMDS still lists its event is created again within this time.
const RESCAN: Duration = Duration::from_secs(1);

/// How long an object just created is taken to exist before the cache
/// shows it.
const CREATED_GRACE: Duration = Duration::from_secs(5);
/// At most this many creations in flight at once: a flood of events (200
/// in one second) is created in parallel rather than one round trip after
/// another, which under load left the last events without an object for a
/// minute (a create is a round trip of the API server's, not work of ours).
pub const CREATE_CONCURRENCY: usize = 32;

/// Creates the object `name` with `spec`. Returns the object as the API
/// server stored it (its answer), or `None` when it already existed.
///
/// # Errors
/// [`Error::WriteEvent`] when the API server refuses; an object that
/// already exists is no error (another pass created it).
pub async fn create(
    writers: &Writers,
    name: &str,
    spec: &ScheduledEventSpec,
) -> Result<Option<ScheduledEvent>> {
    let api: Api<ScheduledEvent> = Api::all(writers.client.clone());
    let params = PostParams {
        field_manager: Some(CONTROLLER_MANAGER.into()),
        ..PostParams::default()
    };
    match api
        .create(&params, &ScheduledEvent::new(name, spec.clone()))
        .await
    {
        Ok(answer) => {
            info!(event = %name, event_id = %spec.event_id, r#type = %spec.event_type,
                status = %spec.event_status, resources = ?spec.resources, "Created ScheduledEvent from the agents' reports");
            Ok(Some(answer))
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
        Err(e) => Err(Error::WriteEvent {
            name: name.into(),
            source: e,
        }),
    }
}

/// Writes `spec` over the stored object `name` (`stored`). Returns the
/// `resourceVersion` the object got.
///
/// # Errors
/// [`Error::WriteEvent`] when the API server refuses (409 Conflict when the
/// object changed since `stored` was read).
pub async fn write(
    writers: &Writers,
    name: &str,
    stored: &ScheduledEvent,
    spec: &ScheduledEventSpec,
) -> Result<Option<String>> {
    let api: Api<ScheduledEvent> = Api::all(writers.client.clone());
    let failed = |source| Error::WriteEvent {
        name: name.into(),
        source,
    };
    let body = spec_patch(stored, spec).map_err(|e| failed(kube::Error::SerdeError(e)))?;
    let params = PatchParams {
        field_manager: Some(CONTROLLER_MANAGER.into()),
        ..PatchParams::default()
    };
    let written = api
        .patch(name, &params, &Patch::Merge(body))
        .await
        .map_err(failed)?;
    info!(event = %name, status = %spec.event_status, appearance = spec.appearance,
        resources = ?spec.resources, "Wrote the spec from the agents' reports");
    Ok(written.resource_version())
}

/// The merge patch that writes `spec` whole over the stored object: every
/// field named (an absent `notBefore` as `null`), and conditional on the
/// `resourceVersion` the pass read (`stored`'s, when it has one): the pass
/// goes on from the version this write makes, and its status write is
/// conditional on that, so this write must not succeed over a version the
/// pass did not see (a pass on a lagging cache took an event that had
/// `Started` for one still `Draining`, and wrote `Cancelled` over it).
/// A newer version gets 409 Conflict, and the pass runs again on it.
///
/// # Errors
/// When `spec` cannot be serialized (it always can).
pub fn spec_patch(
    stored: &ScheduledEvent,
    spec: &ScheduledEventSpec,
) -> serde_json::Result<serde_json::Value> {
    let mut whole = serde_json::to_value(spec)?;
    if let Some(fields) = whole.as_object_mut() {
        fields.entry("notBefore").or_insert(serde_json::Value::Null);
    }
    let mut body = serde_json::json!({ "spec": whole });
    conditional_on(&mut body, stored.metadata.resource_version.as_deref());
    Ok(body)
}

/// Runs until aborted: creates the `ScheduledEvent` of every event that
/// some agent reports listed and that has no object, each time `changed`
/// fires (a report changed), every [`RESCAN`], and each time a creation
/// ends while more wait: the most urgent first ([`creation_order`]), with
/// up to [`CREATE_CONCURRENCY`] creations in flight. Each slot that frees
/// takes the most urgent event missing at that moment, so an event
/// reported during a flood waits for one creation to end, not for a batch
/// (a batch waited for its slowest answer: under a 200-VM Spot wave's load
/// about 30 objects a second, against the API server's 0.1 s a create).
/// Each object created goes to the cache as the API server answered
/// (`created`), its first pass not waiting for the watch to show it.
pub async fn create_missing(
    caches: Caches,
    writers: Writers,
    changed: Arc<tokio::sync::Notify>,
    created_now: Created,
) {
    // Created a moment ago, not yet in the cache: not created again.
    let mut created: HashMap<String, Instant> = HashMap::new();
    let mut in_flight: HashSet<String> = HashSet::new();
    let mut creations = futures::stream::FuturesUnordered::new();
    let mut over_cap: BTreeMap<String, usize> = BTreeMap::new();
    let mut look = false;
    let writers = &writers;
    loop {
        if !look {
            tokio::select! {
                () = changed.notified() => {}
                () = tokio::time::sleep(RESCAN) => {}
                Some((name, written, more)) = creations.next(), if !creations.is_empty() => {
                    in_flight.remove(&name);
                    match written {
                        Ok(()) => {
                            created.insert(name, Instant::now());
                            // Progress: the next one at once.
                            look = more;
                        }
                        Err(e) => {
                            warn!(event = %name, error = %e, "Could not create the ScheduledEvent; will retry");
                        }
                    }
                    if !look {
                        continue;
                    }
                }
            }
        }
        look = false;
        if !caches.synced() {
            continue;
        }
        let facts = Facts::read(&caches);
        note_ignored(writers, &facts.ignored, &mut over_cap);
        // Forgotten once the cache shows it: an object deleted after that
        // is created again at the next scan.
        created.retain(|name, at| {
            at.elapsed() < CREATED_GRACE && caches.events.get(&ObjectRef::new(name)).is_none()
        });
        let missing = facts.reports.iter().filter_map(|(name, rs)| {
            if caches.events.get(&ObjectRef::new(name)).is_some()
                || created.contains_key(name)
                || in_flight.contains(name)
            {
                return None;
            }
            let (urgency, node) = intake::event_urgency(rs, |n| facts.vm_of(n))?;
            Some((name.as_str(), urgency, node))
        });
        let mut order = creation_order(missing).into_iter();
        // As many as free slots, of those the reports build a spec of.
        let specs: Vec<(String, ScheduledEventSpec)> = order
            .by_ref()
            .filter_map(|name| {
                let (about, _) = reports_about(&facts.reports, name);
                let judged = trust::judge_reports(about.iter().copied(), |n| facts.identity(n));
                trust::build(&judged).map(|built| (name.to_owned(), built.spec))
            })
            .take(CREATE_CONCURRENCY.saturating_sub(creations.len()))
            .collect();
        let more = order.len() > 0;
        for (name, spec) in specs {
            in_flight.insert(name.clone());
            let (created_now, caches) = (&created_now, &caches);
            creations.push(async move {
                let written = match create(writers, &name, &spec).await {
                    Ok(Some(answer)) => {
                        created_now.answered(answer);
                        Ok(())
                    }
                    Ok(None) => put_back(writers, caches, created_now, &name).await,
                    Err(e) => Err(e),
                };
                (name, written, more)
            });
        }
    }
}

/// After a create of `name` answered 409 AlreadyExists: when the cache
/// still lacks the object (it was missing for at least [`CREATED_GRACE`],
/// or a relist took it out), reads it from the API server and puts it in
/// the cache as a create's answer would (`created`), so that its passes
/// run; warned and counted (`forewarn_controller_cache_misses_total`), as
/// a cache that lacks an existing object drops the event's every pass.
///
/// # Errors
/// [`Error::WriteEvent`] when the read fails (the next scan tries again).
async fn put_back(writers: &Writers, caches: &Caches, created: &Created, name: &str) -> Result<()> {
    if caches.events.get(&ObjectRef::new(name)).is_some() {
        return Ok(());
    }
    let api: Api<ScheduledEvent> = Api::all(writers.client.clone());
    let stored = api
        .get_opt(name)
        .await
        .map_err(|source| Error::WriteEvent {
            name: name.into(),
            source,
        })?;
    if let Some(stored) = stored {
        writers
            .metrics
            .cache_misses
            .with_label_values(&["create_conflict"])
            .inc();
        warn!(event = %name, version = ?stored.resource_version(),
            "The ScheduledEvent exists but the controller's cache lacks it; putting the stored object in");
        created.answered(stored);
    }
    Ok(())
}

/// The names of the events to create, in turn by reporting node: `missing`
/// gives each event's name, urgency ([`intake::Urgency`]) and the node that
/// reports it so. Events nodes report about their own VM come first; among
/// them, and then among the others, each node's most urgent event, then
/// each node's second, and so on (by urgency, then name, within a turn).
/// So one node's flood, however urgent it says it is, puts at most one of
/// its events before another node's most urgent one.
pub fn creation_order<'a>(
    missing: impl IntoIterator<Item = (&'a str, intake::Urgency, String)>,
) -> Vec<&'a str> {
    let mut missing: Vec<(intake::Urgency, &str, String)> = missing
        .into_iter()
        .map(|(name, u, node)| (u, name, node))
        .collect();
    missing.sort_unstable();
    // Each event's turn: how many more urgent ones its node reports (of
    // the same kind: about its own VM or not).
    let mut turns: HashMap<(bool, String), usize> = HashMap::new();
    let mut ranked: Vec<(bool, usize, intake::Urgency, &str)> = missing
        .into_iter()
        .map(|(u, name, node)| {
            let turn = turns.entry((u.is_own(), node)).or_default();
            let key = (!u.is_own(), *turn, u, name);
            *turn += 1;
            key
        })
        .collect();
    ranked.sort_unstable();
    ranked.into_iter().map(|(.., name)| name).collect()
}

/// Sets the metrics of the reports ignored and says in the log when a node
/// goes over its cap of live reports or back under (`before`: the nodes
/// over it at the previous scan, updated).
fn note_ignored(
    writers: &Writers,
    ignored: &intake::Ignored,
    before: &mut BTreeMap<String, usize>,
) {
    writers
        .metrics
        .set_reports_ignored(&ignored.over_cap, ignored.misnamed);
    for (node, n) in &ignored.over_cap {
        if !before.contains_key(node) {
            warn!(%node, ignored = n, cap = intake::MAX_LIVE_REPORTS_PER_NODE,
                "The node's agent reports more live events than the controller takes into account: the least urgent are ignored");
        }
    }
    for node in before.keys() {
        if !ignored.over_cap.contains_key(node) {
            info!(%node, "The node's live reports are back under the cap: all are taken into account");
        }
    }
    before.clone_from(&ignored.over_cap);
}

/// Deletes an event past its retention, and the reports about it.
///
/// # Errors
/// [`Error::DeleteEvent`] when the event cannot be deleted; a report that
/// cannot be is logged and left to the next sweep.
pub async fn delete(ev: &ScheduledEvent, reports: &[&Report], client: &Client) -> Result<()> {
    let name = ev.name_any();
    Api::<ScheduledEvent>::all(client.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|source| Error::DeleteEvent {
            name: name.clone(),
            source,
        })?;
    let api: Api<ScheduledEventReport> = Api::all(client.clone());
    for r in reports {
        let Some(object) = report_name(&name, &r.node) else {
            continue;
        };
        match api.delete(&object, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                warn!(report = %object, error = %e, "Could not delete a report of an expired event")
            }
        }
    }
    info!("Deleted ScheduledEvent past its retention, and its reports");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EventStatus, Report};
    use chrono::{DateTime, TimeZone, Utc};
    use intake::Urgency;

    /// A spec written over a stored object names every field (an absent
    /// `notBefore` as `null`) and is conditional on the version the pass
    /// read; an object read without a version gives none to be
    /// conditional on.
    #[test]
    fn a_spec_write_is_conditional_on_the_version_read() {
        let spec = crate::fixtures::spec("ev1").build();
        let mut stored = ScheduledEvent::new("ev1", spec.clone());
        stored.metadata.resource_version = Some("17".into());
        let body = spec_patch(&stored, &spec).unwrap();
        assert_eq!(body["metadata"]["resourceVersion"], "17", "{body}");
        assert!(body["spec"].get("notBefore").is_some(), "{body}");
        assert_eq!(body["spec"]["eventId"], spec.event_id.as_str());
        let unversioned = ScheduledEvent::new("ev1", spec.clone());
        assert!(
            spec_patch(&unversioned, &spec)
                .unwrap()
                .get("metadata")
                .is_none()
        );
    }

    fn urgency(own: bool, status: EventStatus, not_before: Option<DateTime<Utc>>) -> Urgency {
        let report = Report {
            node: "n".into(),
            vm: "vm-n".into(),
            named: own,
            event_status: status,
            appearance: 1,
            event_id: "e".into(),
            event_type: "Reboot".into(),
            event_source: "Platform".into(),
            resource_type: "VirtualMachine".into(),
            resources: vec![if own { "vm-n" } else { "vm-other" }.into()],
            not_before,
            duration_seconds: -1,
            description: String::new(),
            document_incarnation: 1,
            approvals: Vec::new(),
        };
        Urgency::of(&report, "vm-n")
    }

    fn at(minute: u32) -> Option<DateTime<Utc>> {
        Some(Utc.with_ymd_and_hms(2030, 1, 1, 12, minute, 0).unwrap())
    }

    #[test]
    fn the_most_urgent_missing_events_are_created_first() {
        use EventStatus::{Scheduled, Started};
        let one = |name, u| (name, u, "n".to_string());
        let order = creation_order([
            one("z-flood", urgency(false, Started, None)),
            one("b-own-late", urgency(true, Scheduled, at(30))),
            one("c-own-started", urgency(true, Started, None)),
            one("a-own-late", urgency(true, Scheduled, at(30))),
            one("d-own-soon", urgency(true, Scheduled, at(2))),
            one("e-other-soon", urgency(false, Scheduled, at(1))),
            one("f-own-unknown", urgency(true, Scheduled, None)),
        ]);
        assert_eq!(
            order,
            [
                "c-own-started",
                "f-own-unknown",
                "d-own-soon",
                "a-own-late",
                "b-own-late",
                "z-flood",
                "e-other-soon",
            ]
        );
    }

    #[test]
    fn nodes_take_turns_own_vms_first() {
        use EventStatus::{Scheduled, Started};
        let order = creation_order([
            ("a1", urgency(true, Started, None), "a".to_string()),
            ("a2", urgency(true, Started, None), "a".to_string()),
            ("a3", urgency(true, Scheduled, at(1)), "a".to_string()),
            ("b1", urgency(true, Scheduled, at(50)), "b".to_string()),
            ("b2", urgency(true, Scheduled, at(55)), "b".to_string()),
            ("c1", urgency(true, Scheduled, at(40)), "c".to_string()),
            ("a-other", urgency(false, Started, None), "a".to_string()),
            ("b-other", urgency(false, Scheduled, at(2)), "b".to_string()),
        ]);
        assert_eq!(
            order,
            ["a1", "c1", "b1", "a2", "b2", "a3", "a-other", "b-other"]
        );
    }

    /// One node floods 5,000 events about its own VM, all `Started` (the
    /// most urgent a report can say); another reports a Reboot of its own
    /// VM two minutes ahead: the controller takes at most the cap of the
    /// flood into account, and the other node's event is created second,
    /// in the first batch.
    #[test]
    fn a_flood_from_one_node_puts_one_event_before_anothers() {
        use crate::api::{ScheduledEventReport, ScheduledEventReportSpec};
        use crate::imds::model::object_name;
        use std::sync::Arc;
        let report = |id: &str, node: &str, status, not_before| {
            let name = object_name(id);
            Arc::new(ScheduledEventReport::new(
                &format!("{name}.{node}"),
                ScheduledEventReportSpec {
                    scheduled_event: name,
                    report: Report {
                        node: node.into(),
                        vm: format!("vm-{node}"),
                        named: true,
                        event_status: status,
                        appearance: 1,
                        event_id: id.into(),
                        event_type: "Reboot".into(),
                        event_source: "Platform".into(),
                        resource_type: "VirtualMachine".into(),
                        resources: vec![format!("vm-{node}")],
                        not_before,
                        duration_seconds: -1,
                        description: String::new(),
                        document_incarnation: 1,
                        approvals: Vec::new(),
                    },
                },
            ))
        };
        let mut all: Vec<Arc<ScheduledEventReport>> = (0..5000)
            .map(|i| report(&format!("flood-{i:04}"), "a", EventStatus::Started, None))
            .collect();
        let victim = object_name("victim");
        all.push(report("victim", "b", EventStatus::Scheduled, at(2)));
        let (reports, ignored) = intake::admit(all, intake::MAX_LIVE_REPORTS_PER_NODE, |_| None);
        assert_eq!(
            ignored.over_cap.get("a"),
            Some(&(5000 - intake::MAX_LIVE_REPORTS_PER_NODE))
        );
        let missing = reports.iter().filter_map(|(name, rs)| {
            let (u, node) = intake::event_urgency(rs, |_| None)?;
            Some((name.as_str(), u, node))
        });
        let order = creation_order(missing);
        assert_eq!(order.len(), intake::MAX_LIVE_REPORTS_PER_NODE + 1);
        assert_eq!(order[1], victim);
    }

    /// A flood of a thousand events one node reports about other VMs, all
    /// `Started`, does not hold up another node's event about its own VM.
    #[test]
    fn a_flood_about_other_vms_waits_behind_a_nodes_own_event() {
        let flood: Vec<String> = (0..1000).map(|i| format!("flood-{i:04}")).collect();
        let mut missing: Vec<(&str, Urgency, String)> = flood
            .iter()
            .map(|n| {
                let u = urgency(false, EventStatus::Started, None);
                (n.as_str(), u, "a".to_string())
            })
            .collect();
        let victim = urgency(true, EventStatus::Scheduled, at(59));
        missing.push(("victim", victim, "b".to_string()));
        let order = creation_order(missing);
        assert_eq!(order.len(), 1001);
        assert_eq!(order[0], "victim");
    }
}
