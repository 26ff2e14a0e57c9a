//! The one writer of forewarn's marks on a node: cordon, taint, hold list
//! (`forewarn.dev/cordoned-for`) and the load-balancer exclusion, in one
//! merge patch a node. Who holds a node is read by
//! [`crate::controller::observe::nodes`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use kube::api::{Api, Patch};
use serde_json::json;

use crate::api::CORDONED_FOR_ANNOTATION;
use crate::policy::TaintEffect;

/// Key of the taint forewarn puts next to its cordon (effect the policy's
/// `taintEffect`, default `NoSchedule`), so that tools and people can tell
/// why a node is cordoned. Owned like the cordon: present exactly while
/// forewarn holds the node for some event.
pub const TAINT_KEY: &str = "forewarn.dev/scheduled-event";

/// [`taints_with`] the default effect (`NoSchedule`).
pub fn taints_for(node: &Node, held: bool) -> Option<Vec<Taint>> {
    taints_with(node, held, TaintEffect::default())
}

/// The node's taints with forewarn's taint present (`held`, added with
/// `effect` when missing) or absent, or `None` when they are already so.
/// A taint of forewarn's key counts as present whatever its effect: one
/// written under an earlier policy stays as written while the node is
/// held, and is removed on release all the same. Other taints are never
/// touched.
pub fn taints_with(node: &Node, held: bool, effect: TaintEffect) -> Option<Vec<Taint>> {
    let current: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let has = current.iter().any(|t| t.key == TAINT_KEY);
    if has == held {
        return None;
    }
    let mut taints: Vec<Taint> = current.into_iter().filter(|t| t.key != TAINT_KEY).collect();
    if held {
        taints.push(Taint {
            key: TAINT_KEY.into(),
            value: Some("true".into()),
            effect: effect.as_str().into(),
            time_added: None,
        });
    }
    Some(taints)
}

/// The label that takes a node out of the external load balancers'
/// backends (cloud-provider-azure, and the service controller of
/// Kubernetes itself, honour it), put on the nodes forewarn holds when the
/// policy's `excludeFromLoadBalancers` is on.
pub const LB_EXCLUSION_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Node annotation saying that forewarn added [`LB_EXCLUSION_LABEL`]
/// (value `"true"`): only then does it remove the label on release.
pub const LB_EXCLUDED_ANNOTATION: &str = "forewarn.dev/excluded-from-load-balancers";

/// The change to [`LB_EXCLUSION_LABEL`] and its ownership annotation that
/// a node needs, `(label, annotation)` as merge-patch values (`null`
/// removes), or `None` when it needs none. While forewarn holds the node
/// (`held`) and the policy asks for it (`enabled`), the label is added
/// with the annotation unless the node has the label already (someone
/// else's: left alone, never removed); otherwise the label is removed
/// only if the annotation says forewarn added it.
pub fn lb_exclusion_for(
    node: &Node,
    held: bool,
    enabled: bool,
) -> Option<(serde_json::Value, serde_json::Value)> {
    let labelled = node.labels().contains_key(LB_EXCLUSION_LABEL);
    let ours = node.annotations().contains_key(LB_EXCLUDED_ANNOTATION);
    match (held && enabled, labelled, ours) {
        (true, false, _) => Some((json!("true"), json!("true"))),
        (true, true, _) => None,
        // Released, or the policy turned off: take back only our own label.
        (false, true, true) => Some((json!(null), json!(null))),
        // Someone removed our label meanwhile: forget that we added it.
        (false, false, true) => Some((json!(null), json!(null))),
        (false, _, false) => None,
    }
}

/// The marks this controller last wrote to each node, and the version of
/// the node they were written on, so that a pass reading a node cache that
/// lags the API server (by seconds under a wave's load) does not send them
/// again: every node write is conditional on the `resourceVersion` read,
/// and the same write sent again on a version the cache still shows after
/// this controller's own write to it can only lose with 409 (281 times in
/// one 200-VM wave, each failing its pass).
///
/// An entry holds while the cache shows the version it was written on; it
/// is dropped once the cache shows another (the cache caught up and is
/// read again) or after [`WRITTEN_KEPT`].
#[derive(Clone, Default)]
pub struct WrittenMarks(Arc<Mutex<HashMap<String, Written>>>);

/// How long [`WrittenMarks`] keeps an entry the cache has not moved past:
/// far longer than a watch lags.
pub const WRITTEN_KEPT: Duration = Duration::from_secs(120);

struct Written {
    /// The version the node cache showed when the marks were written.
    read: String,
    /// The marks written (the merge patch without its version).
    marks: serde_json::Value,
    at: Instant,
}

impl WrittenMarks {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Written>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `marks` (a merge patch without its version) were written to
    /// `node` while the cache showed `read`, which it still shows: the
    /// write is done, and sending it again could only lose. A different
    /// write is sent, on `read` (it was computed from marks the node no
    /// longer holds: 409, and the pass runs again on a fresher cache).
    pub fn already_written(&self, node: &str, read: &str, marks: &serde_json::Value) -> bool {
        let mut map = self.lock();
        let Some(w) = map.get(node) else {
            return false;
        };
        if w.read != read || w.at.elapsed() >= WRITTEN_KEPT {
            map.remove(node);
            return false;
        }
        w.marks == *marks
    }

    /// Notes that `marks` were written to `node`, on the version `read`
    /// the cache showed.
    pub fn wrote(&self, node: &str, read: &str, marks: serde_json::Value) {
        let mut map = self.lock();
        map.retain(|_, w| w.at.elapsed() < WRITTEN_KEPT);
        map.insert(
            node.to_owned(),
            Written {
                read: read.to_owned(),
                marks,
                at: Instant::now(),
            },
        );
    }
}

/// [`write_marks`] with the default taint effect, for the writes that keep
/// or shrink a node's holds (the sweeps): they add no taint but where
/// forewarn's was removed by hand from a held node. Returns whether a
/// patch was sent.
///
/// # Errors
/// The API error; 409 when the node changed since it was read.
pub async fn write_holds(
    api: &Api<Node>,
    versions: &WrittenMarks,
    node: &Node,
    holds: &[String],
    unschedulable: Option<bool>,
    exclude_lb: bool,
) -> Result<bool, kube::Error> {
    write_marks(
        api,
        versions,
        node,
        holds,
        unschedulable,
        exclude_lb,
        TaintEffect::default(),
    )
    .await
}

/// Writes a node's hold list (`forewarn.dev/cordoned-for`; removed when
/// empty), forewarn's taint (present while the list is not empty, added
/// with `effect`: see [`taints_with`]), the
/// load-balancer exclusion label when `exclude_lb` asks for it (see
/// [`lb_exclusion_for`]) and, if given, `spec.unschedulable`, in one merge
/// patch made conditional on the `resourceVersion` of `node` as read: two
/// writers editing one node's hold list or taints cannot lose each other's
/// change (the loser gets a 409 and retries from a fresh read). The same
/// patch this controller already wrote on that version is not sent again
/// ([`WrittenMarks::already_written`]). Returns whether a patch was sent.
///
/// # Errors
/// The API error; 409 when the node changed since it was read.
pub async fn write_marks(
    api: &Api<Node>,
    versions: &WrittenMarks,
    node: &Node,
    holds: &[String],
    unschedulable: Option<bool>,
    exclude_lb: bool,
    effect: TaintEffect,
) -> Result<bool, kube::Error> {
    let annotation = if holds.is_empty() {
        json!(null)
    } else {
        json!(holds.join(","))
    };
    let mut body = json!({
        "metadata": {
            "annotations": { CORDONED_FOR_ANNOTATION: annotation },
        }
    });
    if let Some((label, owned)) = lb_exclusion_for(node, !holds.is_empty(), exclude_lb) {
        body["metadata"]["labels"] = json!({ LB_EXCLUSION_LABEL: label });
        body["metadata"]["annotations"][LB_EXCLUDED_ANNOTATION] = owned;
    }
    let mut spec = serde_json::Map::new();
    if let Some(u) = unschedulable {
        spec.insert("unschedulable".into(), json!(u));
    }
    if let Some(taints) = taints_with(node, !holds.is_empty(), effect) {
        spec.insert("taints".into(), json!(taints));
    }
    if !spec.is_empty() {
        body["spec"] = serde_json::Value::Object(spec);
    }
    let name = node.name_any();
    let read = node.resource_version().unwrap_or_default();
    if versions.already_written(&name, &read, &body) {
        return Ok(false);
    }
    let mut sent = body.clone();
    sent["metadata"]["resourceVersion"] = json!(read);
    crate::kubeclient::patch_discarding_answer(
        api,
        &name,
        None,
        &crate::api::controller_patch_params(),
        &Patch::Merge(&sent),
    )
    .await?;
    versions.wrote(&name, &read, body);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::api::ObjectMeta;

    fn node() -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: None,
        }
    }

    #[test]
    fn taint_follows_the_holds_and_other_taints_stay() {
        let mut n = node();
        let theirs = Taint {
            key: "example.com/maintenance".into(),
            value: None,
            effect: "NoSchedule".into(),
            time_added: None,
        };
        n.spec.as_mut().unwrap().taints = Some(vec![theirs.clone()]);
        let added = taints_for(&n, true).unwrap();
        assert_eq!(added.len(), 2);
        assert_eq!(added[0], theirs);
        assert_eq!(added[1].key, TAINT_KEY);
        assert_eq!(taints_for(&n, false), None, "nothing of ours to remove");
        n.spec.as_mut().unwrap().taints = Some(added);
        assert_eq!(taints_for(&n, true), None, "already there");
        assert_eq!(taints_for(&n, false), Some(vec![theirs]));
    }

    /// The policy's effect is used when tainting; a taint of forewarn's key
    /// written with another effect stays while held and goes on release.
    #[test]
    fn the_taint_takes_the_policys_effect_and_goes_whatever_its_effect() {
        let mut n = node();
        assert_eq!(taints_for(&n, true).unwrap()[0].effect, "NoSchedule");
        let added = taints_with(&n, true, TaintEffect::PreferNoSchedule).unwrap();
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].effect, "PreferNoSchedule");
        assert_eq!(added[0].key, TAINT_KEY);
        n.spec.as_mut().unwrap().taints = Some(added);
        assert_eq!(
            taints_with(&n, true, TaintEffect::NoSchedule),
            None,
            "rewritten while held"
        );
        assert_eq!(
            taints_with(&n, false, TaintEffect::NoSchedule),
            Some(Vec::new())
        );
        assert_eq!(taints_for(&n, false), Some(Vec::new()));
    }

    #[test]
    fn the_load_balancer_label_is_added_while_held_and_only_ours_is_removed() {
        let mut n = node();
        assert_eq!(lb_exclusion_for(&n, true, false), None, "not asked for");
        assert_eq!(lb_exclusion_for(&n, false, true), None, "not held");
        assert_eq!(
            lb_exclusion_for(&n, true, true),
            Some((json!("true"), json!("true")))
        );
        // Ours: kept while held, removed on release or when turned off.
        n.metadata.labels = Some([(LB_EXCLUSION_LABEL.to_string(), "true".to_string())].into());
        n.metadata.annotations =
            Some([(LB_EXCLUDED_ANNOTATION.to_string(), "true".to_string())].into());
        assert_eq!(lb_exclusion_for(&n, true, true), None);
        assert_eq!(
            lb_exclusion_for(&n, false, true),
            Some((json!(null), json!(null)))
        );
        assert_eq!(
            lb_exclusion_for(&n, true, false),
            Some((json!(null), json!(null)))
        );
        // An administrator's: never touched, held or not.
        n.metadata.annotations = None;
        for (held, enabled) in [(true, true), (false, true), (true, false), (false, false)] {
            assert_eq!(
                lb_exclusion_for(&n, held, enabled),
                None,
                "{held} {enabled}"
            );
        }
        // Our annotation without the label (someone removed it): forgotten.
        n.metadata.labels = None;
        n.metadata.annotations =
            Some([(LB_EXCLUDED_ANNOTATION.to_string(), "true".to_string())].into());
        assert_eq!(
            lb_exclusion_for(&n, false, true),
            Some((json!(null), json!(null)))
        );
    }

    /// A write the cache has not shown yet is not sent again; a different
    /// one is; once the cache shows another version, the entry is
    /// forgotten.
    #[test]
    fn the_same_marks_are_not_written_twice_on_one_cached_version() {
        let v = WrittenMarks::default();
        let cordon = json!({"spec": {"unschedulable": true}});
        let release = json!({"spec": {"unschedulable": false}});
        assert!(!v.already_written("n", "10", &cordon));
        v.wrote("n", "10", cordon.clone());
        assert!(v.already_written("n", "10", &cordon));
        assert!(!v.already_written("m", "10", &cordon), "another node");
        assert!(
            !v.already_written("n", "10", &release),
            "another write is sent (and loses on 10)"
        );
        assert!(
            !v.already_written("n", "11", &cordon),
            "the cache caught up"
        );
        assert!(
            !v.already_written("n", "10", &cordon),
            "and the entry is gone"
        );
    }
}
