//! The installed CustomResourceDefinitions against the ones this binary was
//! built with ([`crate::api`]): both roles check at start that the CRDs
//! they use carry every field they write or read, and `forewarn crds apply`
//! (the chart's pre-install and pre-upgrade hook) installs this binary's
//! CRDs by server-side apply.
//!
//! Helm installs a chart's `crds/` once and never upgrades them, so a
//! `helm upgrade` alone leaves the previous version's CRDs in place: the
//! API server then silently prunes every field they lack from what the new
//! processes write (a status field, a whole report), or refuses a new
//! phase. The start-up check turns that into one clear error and a
//! non-zero exit that names the command that mends it.

use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, CustomResourceExt};
use serde_json::Value;
use tracing::{info, warn};

use crate::api::{ScheduledEvent, ScheduledEventReport};
use crate::topology::VirtualMachineReport;

/// Name of the `ScheduledEvent` CRD.
pub const EVENTS_CRD: &str = "scheduledevents.forewarn.dev";
/// Name of the `ScheduledEventReport` CRD.
pub const REPORTS_CRD: &str = "scheduledeventreports.forewarn.dev";
/// Name of the `VirtualMachineReport` CRD.
pub const VM_REPORTS_CRD: &str = "virtualmachinereports.forewarn.dev";
/// Field manager of `forewarn crds apply`.
pub const APPLY_MANAGER: &str = "forewarn-crds";

/// How many missing fields the start-up error names before it counts the rest.
const NAMED: usize = 5;

/// The CRDs the controller uses: it writes `ScheduledEvent`s and reads the
/// agents' reports (of events and of their VMs).
pub fn controller_needs() -> Vec<CustomResourceDefinition> {
    vec![
        ScheduledEvent::crd(),
        ScheduledEventReport::crd(),
        VirtualMachineReport::crd(),
    ]
}

/// The CRDs the agent writes. It also reads `ScheduledEvent`s, but only the
/// approval fields the controller writes, which the controller's own check
/// covers.
pub fn agent_needs() -> Vec<CustomResourceDefinition> {
    vec![ScheduledEventReport::crd(), VirtualMachineReport::crd()]
}

/// Every CRD, as `forewarn crds apply` installs them.
pub fn all() -> Vec<CustomResourceDefinition> {
    controller_needs()
}

/// What `installed` lacks of what `wanted` (this binary's CRD) declares:
/// for each version of `wanted`, that the installed CRD serves it, has the
/// status subresource and the selectable fields when `wanted` has them,
/// and, in its schema, every property path of `wanted`'s schema (nested in
/// objects, array items and maps) and every `enum` value. Extra properties,
/// values and versions of `installed` are fine (a newer CRD), and so is a
/// missing property under `x-kubernetes-preserve-unknown-fields` (kept as
/// written). Empty when it fits.
///
/// Each entry is a field path (`status.nodes[].deletedAt`) or a short
/// sentence; a version the installed CRD does not serve is not looked into
/// further.
pub fn lacks(
    wanted: &CustomResourceDefinition,
    installed: &CustomResourceDefinition,
) -> Vec<String> {
    let mut out = Vec::new();
    for want in &wanted.spec.versions {
        let Some(have) = installed.spec.versions.iter().find(|v| v.name == want.name) else {
            out.push(format!("version {} (not defined)", want.name));
            continue;
        };
        if !have.served {
            out.push(format!("version {} (not served)", want.name));
            continue;
        }
        let status = |v: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion| {
            v.subresources.as_ref().is_some_and(|s| s.status.is_some())
        };
        if status(want) && !status(have) {
            out.push("the status subresource".into());
        }
        for field in want.selectable_fields.iter().flatten() {
            let present = have
                .selectable_fields
                .iter()
                .flatten()
                .any(|f| f.json_path == field.json_path);
            if !present {
                out.push(format!("selectable field {}", field.json_path));
            }
        }
        let schema = |v: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion| {
            v.schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| serde_json::to_value(s).ok())
                .unwrap_or(Value::Null)
        };
        schema_lacks(&schema(want), &schema(have), "", &mut out);
    }
    out
}

/// [`lacks`] for one schema node at `path`.
fn schema_lacks(want: &Value, have: &Value, path: &str, out: &mut Vec<String>) {
    let empty = Value::Object(Default::default());
    let keeps_unknown = have
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true);
    if let Some(props) = want.get("properties").and_then(Value::as_object) {
        let have_props = have.get("properties").and_then(Value::as_object);
        for (name, w) in props {
            let here = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            match have_props.and_then(|p| p.get(name)) {
                Some(h) => schema_lacks(w, h, &here, out),
                None if keeps_unknown => {}
                None => out.push(here),
            }
        }
    }
    if let Some(w) = want.get("items") {
        schema_lacks(
            w,
            have.get("items").unwrap_or(&empty),
            &format!("{path}[]"),
            out,
        );
    }
    if let Some(w) = want.get("additionalProperties").filter(|w| w.is_object()) {
        let h = have
            .get("additionalProperties")
            .filter(|h| h.is_object())
            .unwrap_or(&empty);
        schema_lacks(w, h, &format!("{path}.*"), out);
    }
    if let (Some(w), Some(h)) = (
        want.get("enum").and_then(Value::as_array),
        have.get("enum").and_then(Value::as_array),
    ) {
        for value in w.iter().filter(|v| !h.contains(v)) {
            let shown = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_string);
            out.push(format!("{path} value {shown}"));
        }
    }
}

/// Why an installed CRD does not do for this binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
    /// Not installed (404).
    Absent,
    /// Installed without these (see [`lacks`]).
    Lacks(Vec<String>),
}

/// The installed CRD of `wanted`'s name against `wanted`: `Ok(None)` when
/// it fits.
///
/// # Errors
/// Any API error but 404 (403 included: the caller decides).
pub async fn inspect(
    api: &Api<CustomResourceDefinition>,
    wanted: &CustomResourceDefinition,
) -> Result<Option<Unfit>, kube::Error> {
    let name = wanted.metadata.name.as_deref().unwrap_or_default();
    match api.get(name).await {
        Ok(installed) => {
            let missing = lacks(wanted, &installed);
            Ok((!missing.is_empty()).then_some(Unfit::Lacks(missing)))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Some(Unfit::Absent)),
        Err(e) => Err(e),
    }
}

/// The command that mends unfit CRDs, as the start-up error gives it.
pub fn remedy() -> String {
    let v = env!("CARGO_PKG_VERSION");
    format!(
        "Apply the CRDs of forewarn {v}: helm show crds forewarn-{v}.tgz | kubectl apply --server-side --force-conflicts -f - \
         (`helm upgrade` to the chart {v} does it with its CRD hook on: crds.upgradeJob.enabled, the default)"
    )
}

/// One error message for every unfit CRD: what each lacks (the first
/// [`NAMED`] fields named, the rest counted) and [`remedy`].
pub fn refusal(unfit: &[(String, Unfit)]) -> String {
    let v = env!("CARGO_PKG_VERSION");
    let mut parts = Vec::new();
    for (name, why) in unfit {
        parts.push(match why {
            Unfit::Absent => format!("the CustomResourceDefinition {name} is not installed"),
            Unfit::Lacks(missing) => format!(
                "the installed CustomResourceDefinition {name} is older than forewarn {v}: it lacks {} {}: {}",
                missing.len(),
                if missing.len() == 1 { "field" } else { "fields" },
                crate::text::named(missing, NAMED, ", ")
            ),
        });
    }
    format!("{}. {}", parts.join("; "), remedy())
}

/// Why the start-up check refused to go on, or `forewarn crds apply`
/// failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading a CRD failed with an answer that will not change by itself
    /// (or, for [`apply`], any error once its timeout has passed).
    #[error("failed to read the CustomResourceDefinition {name}: {source}")]
    Read {
        /// The CRD's name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The server-side apply of a CRD was refused (403, 422, ...) or did
    /// not succeed before the timeout.
    #[error("failed to apply the CustomResourceDefinition {name}: {source}")]
    Apply {
        /// The CRD's name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// CRDs that are not installed or lack fields this binary uses: the
    /// message is [`refusal`]'s, which names them and the command that
    /// mends it.
    #[error("{}", refusal(crds))]
    Unfit {
        /// Each unfit CRD's name, and why.
        crds: Vec<(String, Unfit)>,
    },
    /// An applied CRD was not established, or did not fit, before the
    /// timeout.
    #[error("the CustomResourceDefinition {name} is not ready after {timeout:?}: {why}")]
    NotReady {
        /// The CRD's name.
        name: String,
        /// [`apply`]'s timeout.
        timeout: Duration,
        /// What it was still waiting for (a condition, missing fields, the
        /// last transient error).
        why: String,
    },
}

/// Whether a failed request is worth asking again: anything but an answer
/// that will not change by itself (400, 401, 403, 404, 422).
fn transient(e: &kube::Error) -> bool {
    !matches!(e, kube::Error::Api(s) if matches!(s.code, 400 | 401 | 403 | 404 | 422))
}

/// 0.5 s doubling to 2 s (plus backon's jitter): one GET per CRD, cheap to
/// repeat, and a controller restarted while the API server was away must
/// not sleep through its return (with a 10 s cap it started up to 20 s
/// late: `tests/lifecycle.rs`, the API server stopped mid-drain).
fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .without_max_times()
}

/// The start-up check of a role (`role` names it in the logs): every CRD of
/// `needs` must be installed and fit ([`lacks`]).
///
/// A transient API error (the API server unreachable, overloaded, timing
/// out; any answer but 400, 401, 403, 404 and 422) is retried with backoff
/// until it answers: the caller stops waiting on SIGTERM. A 403 (RBAC
/// without `get` on
/// `customresourcedefinitions` of these names, which the chart grants: a
/// ClusterRole of an earlier chart version, or RBAC made by hand) skips the
/// check with a warning: refusing to run for want of a read permission
/// would stop node maintenance while the CRDs may well be right.
///
/// `waiting` is called before each retry (the agent beats its liveness).
///
/// # Errors
/// [`Error::Unfit`]: a CRD that is not installed or lacks fields (its
/// message is [`refusal`]'s, which names them and the command to run);
/// [`Error::Read`]: an API error that is neither transient nor 403.
pub async fn require(
    client: &Client,
    needs: &[CustomResourceDefinition],
    role: &str,
    waiting: impl Fn(),
) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut unfit = Vec::new();
    for wanted in needs {
        let name = wanted.metadata.name.clone().unwrap_or_default();
        let found = (|| inspect(&api, wanted))
            .retry(backoff())
            .when(transient)
            .notify(|e, d| {
                waiting();
                warn!(crd = %name, error = %e, retry_in = ?d, "Could not read the installed CRD; will retry");
            })
            .await;
        match found {
            Ok(None) => {
                info!(crd = %name, %role, "The installed CRD has every field this version needs")
            }
            Ok(Some(why)) => unfit.push((name, why)),
            Err(kube::Error::Api(s)) if s.code == 403 => warn!(
                crd = %name,
                %role,
                error = %s.message,
                "Cannot check the installed CRD: no RBAC permission to get it (the chart's ClusterRole grants get on customresourcedefinitions of forewarn's names); going on unchecked"
            ),
            Err(source) => return Err(Error::Read { name, source }),
        }
    }
    if unfit.is_empty() {
        return Ok(());
    }
    let error = Error::Unfit { crds: unfit };
    tracing::error!(%role, "{error}");
    Err(error)
}

/// What [`apply`] did to one CRD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// It was not installed.
    Created,
    /// It was installed and differed.
    Updated,
    /// It was already exactly this (its `resourceVersion` did not move).
    Unchanged,
}

/// `forewarn crds apply`: server-side applies this binary's CRDs ([`all`])
/// with field manager [`APPLY_MANAGER`], forced (it takes over the fields
/// `helm install` created from the chart's `crds/`), then waits until each
/// is `Established` with its new generation and fits ([`lacks`]).
/// Transient API errors are retried until `timeout` has passed.
///
/// Needs `create` on `customresourcedefinitions` and `get`, `patch` on
/// these names (the chart's hook ClusterRole).
///
/// # Errors
/// [`Error::Read`], [`Error::Apply`]: a refusal (403, 422, ...), or a
/// transient error that lasted past `timeout`; [`Error::NotReady`]: a CRD
/// not established, or not fitting, when `timeout` has passed.
pub async fn apply(client: &Client, timeout: Duration) -> Result<Vec<(String, Applied)>, Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    let within = |what: String| {
        move |e: &kube::Error| {
            transient(e) && Instant::now() < deadline && {
                warn!(error = %e, "{what} failed; will retry");
                true
            }
        }
    };
    let mut done = Vec::new();
    for crd in all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let before = (|| async {
            match api.get(&name).await {
                Ok(c) => Ok(c.metadata.resource_version),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
                Err(e) => Err(e),
            }
        })
        .retry(backoff())
        .when(within(format!("Reading CRD {name}")))
        .await
        .map_err(|source| Error::Read {
            name: name.clone(),
            source,
        })?;
        let params = PatchParams::apply(APPLY_MANAGER).force();
        let patch = Patch::Apply(&crd);
        let after = (|| api.patch(&name, &params, &patch))
            .retry(backoff())
            .when(within(format!("Applying CRD {name}")))
            .await
            .map_err(|source| Error::Apply {
                name: name.clone(),
                source,
            })?;
        let applied = match before {
            None => Applied::Created,
            Some(rv) if Some(&rv) == after.metadata.resource_version.as_ref() => Applied::Unchanged,
            Some(_) => Applied::Updated,
        };
        info!(crd = %name, ?applied, manager = APPLY_MANAGER, "Applied the CRD");
        done.push((name, applied));
    }
    for crd in all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let why = match api.get(&name).await {
                Ok(installed) => match not_ready(&installed) {
                    None => {
                        let missing = lacks(&crd, &installed);
                        if missing.is_empty() {
                            info!(crd = %name, "The CRD is established and has every field of this version");
                            break;
                        }
                        // Another writer between the apply and this read.
                        format!("it lacks {}", crate::text::named(&missing, NAMED, ", "))
                    }
                    Some(why) => why,
                },
                Err(e) if transient(&e) => e.to_string(),
                Err(source) => return Err(Error::Read { name, source }),
            };
            if Instant::now() >= deadline {
                return Err(Error::NotReady { name, timeout, why });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(done)
}

/// Why `crd` is not yet in force: its `Established` or `NamesAccepted`
/// condition not `True` for its current generation (when the API server
/// reports the condition's generation). `None` once it is.
fn not_ready(crd: &CustomResourceDefinition) -> Option<String> {
    let generation = crd.metadata.generation;
    let conditions = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    for wanted in ["NamesAccepted", "Established"] {
        let Some(c) = conditions.iter().find(|c| c.type_ == wanted) else {
            return Some(format!("no {wanted} condition yet"));
        };
        if c.status != "True" {
            return Some(format!(
                "{wanted} is {}: {}",
                c.status,
                c.message.as_deref().unwrap_or_default()
            ));
        }
        if let (Some(seen), Some(current)) = (c.observed_generation, generation)
            && seen < current
        {
            return Some(format!("{wanted} is of generation {seen}, not {current}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `crd` as JSON, changed by `edit`, and back.
    fn edited(
        crd: &CustomResourceDefinition,
        edit: impl FnOnce(&mut Value),
    ) -> CustomResourceDefinition {
        let mut v = serde_json::to_value(crd).unwrap();
        edit(&mut v);
        serde_json::from_value(v).unwrap()
    }

    fn schema(v: &mut Value) -> &mut Value {
        &mut v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    }

    #[test]
    fn the_crds_this_binary_was_built_with_fit_themselves() {
        for crd in all() {
            assert_eq!(lacks(&crd, &crd), Vec::<String>::new());
        }
        let names: Vec<_> = all()
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, [EVENTS_CRD, REPORTS_CRD, VM_REPORTS_CRD]);
    }

    #[test]
    fn a_missing_nested_field_is_named_with_its_path() {
        let wanted = ScheduledEvent::crd();
        let old = edited(&wanted, |v| {
            let status = &mut schema(v)["properties"]["status"]["properties"];
            status
                .as_object_mut()
                .unwrap()
                .remove("nodesNotListed")
                .unwrap();
            status["nodes"]["items"]["properties"]
                .as_object_mut()
                .unwrap()
                .remove("deletedAt")
                .unwrap();
        });
        let mut missing = lacks(&wanted, &old);
        missing.sort();
        assert_eq!(
            missing,
            ["status.nodesNotListed", "status.nodes[].deletedAt"]
        );
    }

    #[test]
    fn extra_installed_fields_values_and_versions_are_fine() {
        let wanted = ScheduledEvent::crd();
        let newer = edited(&wanted, |v| {
            let s = schema(v);
            s["properties"]["status"]["properties"]["somethingNew"] =
                serde_json::json!({"type": "string"});
            s["properties"]["status"]["properties"]["phase"]["enum"]
                .as_array_mut()
                .unwrap()
                .push("Paused".into());
            let mut v2 = v["spec"]["versions"][0].clone();
            v2["name"] = "v1beta1".into();
            v2["storage"] = true.into();
            v["spec"]["versions"][0]["storage"] = false.into();
            v["spec"]["versions"].as_array_mut().unwrap().push(v2);
        });
        assert_eq!(lacks(&wanted, &newer), Vec::<String>::new());
    }

    #[test]
    fn a_missing_enum_value_subresource_selectable_field_or_version_is_named() {
        let wanted = ScheduledEvent::crd();
        let old = edited(&wanted, |v| {
            let phase = &mut schema(v)["properties"]["status"]["properties"]["phase"]["enum"];
            phase.as_array_mut().unwrap().retain(|p| p != "Ignored");
            v["spec"]["versions"][0]["subresources"] = serde_json::json!({});
        });
        assert_eq!(
            lacks(&wanted, &old),
            ["the status subresource", "status.phase value Ignored"]
        );
        let wanted = ScheduledEventReport::crd();
        let old = edited(&wanted, |v| {
            v["spec"]["versions"][0]["selectableFields"] = serde_json::json!([]);
        });
        assert_eq!(lacks(&wanted, &old), ["selectable field .spec.report.node"]);
        let old = edited(&wanted, |v| {
            v["spec"]["versions"][0]["served"] = false.into();
        });
        assert_eq!(lacks(&wanted, &old), ["version v1alpha1 (not served)"]);
        let old = edited(&wanted, |v| {
            v["spec"]["versions"][0]["name"] = "v0".into();
        });
        assert_eq!(lacks(&wanted, &old), ["version v1alpha1 (not defined)"]);
    }

    #[test]
    fn a_missing_object_is_every_field_under_it_and_unknown_fields_kept_are_fine() {
        let wanted = ScheduledEventReport::crd();
        let old = edited(&wanted, |v| {
            schema(v)["properties"]["spec"]["properties"]["report"] =
                serde_json::json!({"type": "object", "properties": {"node": {"type": "string"}}});
        });
        let missing = lacks(&wanted, &old);
        assert!(
            missing.contains(&"spec.report.vm".to_string()),
            "{missing:?}"
        );
        assert!(
            missing.contains(&"spec.report.approvals".to_string()),
            "{missing:?}"
        );
        assert!(
            !missing.contains(&"spec.report.node".to_string()),
            "{missing:?}"
        );
        let open = edited(&wanted, |v| {
            schema(v)["properties"]["spec"]["properties"]["report"] = serde_json::json!({
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "properties": {"node": {"type": "string"}}
            });
        });
        assert_eq!(lacks(&wanted, &open), Vec::<String>::new());
    }

    #[test]
    fn the_refusal_names_the_crd_the_first_fields_and_the_command() {
        let missing: Vec<String> = (0..8).map(|i| format!("status.f{i}")).collect();
        let text = refusal(&[
            (EVENTS_CRD.into(), Unfit::Lacks(missing)),
            (REPORTS_CRD.into(), Unfit::Absent),
        ]);
        assert!(
            text.contains(
                "CustomResourceDefinition scheduledevents.forewarn.dev is older than forewarn"
            ),
            "{text}"
        );
        assert!(
            text.contains("it lacks 8 fields: status.f0, status.f1, status.f2, status.f3, status.f4 and 3 more"),
            "{text}"
        );
        assert!(
            text.contains(
                "CustomResourceDefinition scheduledeventreports.forewarn.dev is not installed"
            ),
            "{text}"
        );
        assert!(
            text.contains("kubectl apply --server-side --force-conflicts -f -"),
            "{text}"
        );
        assert!(text.contains("crds.upgradeJob.enabled"), "{text}");
        let error = Error::Unfit {
            crds: vec![(REPORTS_CRD.into(), Unfit::Absent)],
        };
        assert_eq!(
            error.to_string(),
            refusal(&[(REPORTS_CRD.into(), Unfit::Absent)])
        );
    }

    #[test]
    fn the_chart_and_the_message_speak_of_the_same_version() {
        let chart = include_str!("../../charts/forewarn/Chart.yaml");
        let v = env!("CARGO_PKG_VERSION");
        assert!(
            chart.contains(&format!("\nversion: {v}\n")),
            "Chart.yaml version is not {v}"
        );
        assert!(
            chart.contains(&format!("\nappVersion: \"{v}\"\n")),
            "Chart.yaml appVersion is not {v}"
        );
    }

    #[test]
    fn only_lasting_refusals_are_not_retried() {
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            )
        };
        for code in [400, 401, 403, 404, 422] {
            assert!(!transient(&api(code)), "{code}");
        }
        for code in [409, 429, 500, 503, 504] {
            assert!(transient(&api(code)), "{code}");
        }
    }
}
