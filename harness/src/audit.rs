//! What a cluster's kube-apiserver saw, from its audit log: the writes,
//! one per audit ID, for the tests and the soak that judge forewarn by
//! what the server received rather than by what forewarn says it sent;
//! the admission policies those tests refuse requests with; the commit a
//! run was made on.

use std::collections::HashSet;
use std::path::Path;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::cluster::Cluster;

/// The audit policy of the clusters whose writes are judged: every write
/// at level `Metadata`, no read.
pub const WRITES_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: None\n    verbs: [get, list, watch]\n  - level: Metadata\n";

/// One write the API server's audit log recorded.
#[derive(Debug, Clone)]
pub struct Write {
    /// When the API server received it.
    pub at: DateTime<Utc>,
    /// `create`, `update`, `patch`, `delete`...
    pub verb: String,
    /// The request's path and query.
    pub uri: String,
    /// The client's `User-Agent`.
    pub user_agent: String,
    /// The answer's status code (0 when the log has none).
    pub code: u16,
}

/// Every write in `cluster`'s audit log (one per audit ID; a read is never
/// a write, whatever the policy logs).
///
/// # Errors
/// When the log cannot be read.
pub fn writes(cluster: &Cluster) -> anyhow::Result<Vec<Write>> {
    let text = cluster.audit_log()?;
    let mut seen = HashSet::new();
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| seen.insert(v["auditID"].as_str().unwrap_or_default().to_string()))
        .filter(|v| !matches!(v["verb"].as_str(), Some("get" | "list" | "watch")))
        .filter_map(|v| {
            Some(Write {
                at: v["requestReceivedTimestamp"].as_str()?.parse().ok()?,
                verb: v["verb"].as_str()?.to_string(),
                uri: v["requestURI"].as_str()?.to_string(),
                user_agent: v["userAgent"].as_str().unwrap_or_default().to_string(),
                code: v["responseStatus"]["code"]
                    .as_u64()
                    .and_then(|c| u16::try_from(c).ok())
                    .unwrap_or(0),
            })
        })
        .collect())
}

/// A ValidatingAdmissionPolicy `name` and its binding (same name,
/// denying), as one `List` to `kubectl apply`: it refuses the requests of
/// `rule` (a `resourceRules` entry) for which `refuse` (CEL) holds, with
/// `message`.
pub fn refusing_policy(name: &str, rule: Value, refuse: &str, message: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "List",
        "items": [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [rule]},
                    "validations": [{"expression": format!("!({refuse})"), "message": message}],
                },
            },
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": name},
                "spec": {"policyName": name, "validationActions": ["Deny"]},
            },
        ],
    })
}

/// The abbreviated commit checked out in the repository, and whether the
/// working tree (untracked files aside) differs from it.
pub fn checkout_commit() -> (String, bool) {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(crate::cluster::repo_root())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let commit = git(&["rev-parse", "--short", "HEAD"]);
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    (commit, dirty)
}

/// Starts (or starts again) the cluster `name` of `nodes` KWOK nodes whose
/// kube-apiserver logs every write ([`WRITES_POLICY`], written to `dir`).
///
/// # Errors
/// When the policy cannot be written or the cluster cannot start.
pub fn start_cluster(name: &str, nodes: usize, dir: &Path) -> anyhow::Result<Cluster> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(&policy, WRITES_POLICY)
        .with_context(|| format!("writing {}", policy.display()))?;
    Cluster::start_with(
        name,
        nodes,
        &[("FOREWARN_KUBE_AUDIT_POLICY", policy.as_path())],
    )
}
