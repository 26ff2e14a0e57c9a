//! The controller's writes of `ScheduledEvent` objects and specs: it alone
//! creates them, from the agents' reports (see [`super::trust::build`]), and
//! writes their spec (field manager `forewarn-controller`).
//!
//! A spec is written whole by a JSON merge patch that names every field
//! (an absent `notBefore` as `null`), so the spec stored is exactly the spec
//! built, with no field left behind; only the leader writes specs, so no
//! write needs a precondition.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use tracing::{info, warn};

use super::reconcile::Facts;
use super::{Context, Error, Result, reports_about, trust};
use crate::crd::{CONTROLLER_MANAGER, ScheduledEvent, ScheduledEventSpec};

/// How often the controller looks for events that have reports and no
/// object, besides each time a report changes: an object deleted by hand
/// while IMDS still lists its event is created again within this time.
const RESCAN: Duration = Duration::from_secs(1);

/// How long an object just created is taken to exist before the cache
/// shows it.
const CREATED_GRACE: Duration = Duration::from_secs(5);
/// At most this many creations in flight at once: a flood of events (issue
/// 14: 200 in one second) is created in parallel rather than one round
/// trip after another, which under load left the last events without an
/// object for a minute.
const CREATE_CONCURRENCY: usize = 8;

/// Creates the object `name` with `spec` (`stored` is `None`), or writes
/// `spec` over the stored one.
///
/// # Errors
/// [`Error::WriteEvent`] when the API server refuses; an object that
/// already exists when created is no error (another pass created it).
pub async fn write(
    ctx: &Context,
    name: &str,
    stored: Option<&ScheduledEvent>,
    spec: &ScheduledEventSpec,
) -> Result<()> {
    let api: Api<ScheduledEvent> = Api::all(ctx.client.clone());
    let failed = |source| Error::WriteEvent {
        name: name.into(),
        source,
    };
    if stored.is_none() {
        let params = PostParams {
            field_manager: Some(CONTROLLER_MANAGER.into()),
            ..PostParams::default()
        };
        return match api
            .create(&params, &ScheduledEvent::new(name, spec.clone()))
            .await
        {
            Ok(_) => {
                info!(event = %name, event_id = %spec.event_id, r#type = %spec.event_type,
                    status = %spec.event_status, resources = ?spec.resources, "Created ScheduledEvent from the agents' reports");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(failed(e)),
        };
    }
    let mut whole = serde_json::to_value(spec).map_err(|e| failed(kube::Error::SerdeError(e)))?;
    if let Some(fields) = whole.as_object_mut() {
        fields.entry("notBefore").or_insert(serde_json::Value::Null);
    }
    let params = PatchParams {
        field_manager: Some(CONTROLLER_MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(
        name,
        &params,
        &Patch::Merge(serde_json::json!({ "spec": whole })),
    )
    .await
    .map_err(failed)?;
    info!(event = %name, status = %spec.event_status, appearance = spec.appearance,
        resources = ?spec.resources, "Wrote the spec from the agents' reports");
    Ok(())
}

/// Runs until aborted: creates the `ScheduledEvent` of every event that
/// some agent reports listed and that has no object, each time `changed`
/// fires (a report changed) and every [`RESCAN`].
pub async fn create_missing(ctx: Arc<Context>, changed: Arc<tokio::sync::Notify>) {
    // Created a moment ago, not yet in the cache: not created again.
    let mut created: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::select! {
            () = changed.notified() => {}
            () = tokio::time::sleep(RESCAN) => {}
        }
        if !ctx.caches_synced() {
            continue;
        }
        let facts = Facts::read(&ctx);
        // Forgotten once the cache shows it: an object deleted after that
        // is created again at the next scan.
        created.retain(|name, at| {
            at.elapsed() < CREATED_GRACE && ctx.events.get(&ObjectRef::new(name)).is_none()
        });
        let mut missing: Vec<&String> = facts
            .reports
            .iter()
            .filter(|(name, rs)| {
                rs.iter().any(|r| r.spec.report.is_listed())
                    && ctx.events.get(&ObjectRef::new(name)).is_none()
                    && !created.contains_key(*name)
            })
            .map(|(name, _)| name)
            .collect();
        missing.sort();
        let specs: Vec<(String, ScheduledEventSpec)> = missing
            .into_iter()
            .filter_map(|name| {
                let (about, _) = reports_about(&facts.reports, name);
                let judged = trust::judge_reports(&about, |n| facts.identity(n));
                trust::build(&judged).map(|built| (name.clone(), built.spec))
            })
            .collect();
        let ctx = &ctx;
        let results: Vec<(String, Result<()>)> = futures::stream::iter(specs)
            .map(|(name, spec)| async move {
                let written = write(ctx, &name, None, &spec).await;
                (name, written)
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect()
            .await;
        for (name, written) in results {
            match written {
                Ok(()) => {
                    created.insert(name, Instant::now());
                }
                Err(e) => {
                    warn!(event = %name, error = %e, "Could not create the ScheduledEvent; will retry");
                }
            }
        }
    }
}
