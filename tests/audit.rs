//! Least privilege, proven both ways from what the API server saw. Every cluster of `make test` runs its API server with an audit
//! policy (`hack/audit-policy.yaml`: every request of a ServiceAccount at
//! level `Metadata`, RBAC bindings written with their bodies); when the
//! other suites have ended, `hack/test-all.sh` runs this one on the logs
//! they left in `target/test-logs/audit/` (`FOREWARN_AUDIT_DIR`). It
//! replays the requests of the product, forewarn's own processes holding
//! the chart's ServiceAccounts (tests/chart/, tests/real_node_chart.rs),
//! against the chart's RBAC as `helm template` renders it, and fails
//!
//! - on every permission the chart grants that no request of the product
//!   used (a verb to drop, or a code path no chart-credentials test takes);
//! - on every request of the product that RBAC refused, or that was
//!   answered 403 Forbidden for any reason but the chart's admission policy
//!   (which tests/chart/processes.rs provokes on purpose with swapped agent tokens).
//!
//! The product's requests are those whose user is a ServiceAccount that a
//! Helm release of the chart bound to its roles (the ClusterRoleBindings
//! and RoleBindings Helm created, read from the log with their subjects;
//! for the hooks' roles, also those kubectl applied from the rendered
//! chart, since their Job and Pod cannot run on KWOK) and whose
//! `User-Agent` is forewarn's own, `forewarn/<version> (<role>;
//! <identity>)` (src/kubeclient.rs), of the same role. The roles are the
//! agent, the controller, the CRD hook (`crds`) and the `helm test` Pod
//! (`check-install`). kubectl run with those tokens to prove denials is not
//! the product and does not count.
//!
//! Run by hack/test-all.sh (`make test`) only: `cargo test --test audit`
//! alone has no logs to read and fails, saying so; only the matcher's own
//! tests (`matcher_*`, on hand-written audit events) pass without them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use forewarn_harness::cluster::{helm_bin, repo_root};
use serde_json::Value;

/// The cluster of tests/chart/, where the harness's processes run with
/// the chart's tokens.
const CHART_CLUSTER: &str = "forewarn-chart";
/// The cluster of hack/real-node.sh, where the chart's own pods run on a
/// real kubelet (tests/real_node_chart.rs).
const REAL_CLUSTER: &str = "forewarn-real";
/// The release namespace the chart's RBAC is rendered in.
const RENDER_NAMESPACE: &str = "forewarn";
/// What `helm template` must be told the cluster serves for the chart to
/// render the admission policy (and the controller's rule to read it).
const VAP_API: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

// ---------------------------------------------------------------------------
// The matcher: pure functions of audit events and RBAC rules.

/// One request as the API server's audit log recorded it (its audit ID's
/// last stage logged).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    /// The cluster (the log file's name).
    cluster: String,
    audit_id: String,
    user: String,
    user_agent: String,
    verb: String,
    /// API group (`""` for the core group).
    group: String,
    /// Resource, with `/subresource` when there is one; `""` for a
    /// non-resource URL.
    resource: String,
    name: String,
    namespace: String,
    uri: String,
    code: Option<i64>,
    /// `authorization.k8s.io/decision`: `allow` or `forbid`.
    decision: String,
    /// Denied by a ValidatingAdmissionPolicy, not by RBAC: the response
    /// says so (`ValidatingAdmissionPolicy '<name>' with binding '<name>'
    /// denied request: ...`; at level `Metadata` the log keeps the
    /// response's status), or an audit annotation of
    /// `validation.policy.admission.k8s.io/` does.
    policy_denied: bool,
}

impl Request {
    /// The verbs RBAC authorized for it: its own, and `create` for a
    /// server-side apply that created its object (the API server checks
    /// `create` inside such a `patch`; the log shows it as a `patch`
    /// answered 201 Created).
    fn verbs(&self) -> Vec<&str> {
        let mut v = vec![self.verb.as_str()];
        if self.verb == "patch" && self.code == Some(201) {
            v.push("create");
        }
        v
    }

    /// Refused by RBAC, or answered 403 for any reason but an admission
    /// policy's denial.
    fn refused(&self) -> bool {
        self.decision == "forbid" || (self.code == Some(403) && !self.policy_denied)
    }

    fn describe(&self) -> String {
        let code = self.code.map_or("-".to_string(), |c| c.to_string());
        format!(
            "[{}] {} {} {} ({}) -> {code} {}: {} {}",
            self.cluster,
            self.user,
            self.verb,
            self.uri,
            self.user_agent,
            self.decision,
            self.audit_id,
            if self.policy_denied {
                "(admission policy)"
            } else {
                ""
            }
        )
    }
}

/// What one audit log holds: its requests (one per audit ID), the raw
/// events of the RBAC bindings written at level `Request`, and the numbers
/// of the lines that are not JSON but cannot be a ServiceAccount's request
/// (a line torn when an API server was killed mid-write, as the fault
/// tests do), left out.
struct Parsed {
    requests: Vec<Request>,
    bindings: Vec<Value>,
    torn: Vec<usize>,
}

/// Parses one audit log.
///
/// # Errors
/// A line that is not an audit event and may be a ServiceAccount's
/// request: it cannot be judged, so the log is refused.
fn parse_log(cluster: &str, text: &str) -> Result<Parsed, String> {
    let mut by_id: HashMap<String, Request> = HashMap::new();
    let mut order = Vec::new();
    let mut bindings = Vec::new();
    let mut torn = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: Value = match serde_json::from_str(line) {
            Ok(e) => e,
            Err(_) if !line.contains("serviceaccount") => {
                torn.push(i + 1);
                continue;
            }
            Err(err) => {
                return Err(format!(
                    "{cluster}: line {}: not JSON ({err}): {line}",
                    i + 1
                ));
            }
        };
        if e["kind"] != "Event" || e["apiVersion"] != "audit.k8s.io/v1" {
            return Err(format!(
                "{cluster}: line {}: not an audit event: {line}",
                i + 1
            ));
        }
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let o = &e["objectRef"];
        let resource = match (o["resource"].as_str(), o["subresource"].as_str()) {
            (Some(r), Some(sub)) if !sub.is_empty() => format!("{r}/{sub}"),
            (Some(r), _) => r.to_string(),
            (None, _) => String::new(),
        };
        let annotations = e["annotations"].as_object();
        let r = Request {
            cluster: cluster.to_string(),
            audit_id: s(&e["auditID"]),
            user: s(&e["user"]["username"]),
            user_agent: s(&e["userAgent"]),
            verb: s(&e["verb"]),
            group: s(&o["apiGroup"]),
            resource,
            name: s(&o["name"]),
            namespace: s(&o["namespace"]),
            uri: s(&e["requestURI"]),
            code: e["responseStatus"]["code"].as_i64(),
            decision: annotations
                .and_then(|a| a.get("authorization.k8s.io/decision"))
                .map(s)
                .unwrap_or_default(),
            policy_denied: annotations.is_some_and(|a| {
                a.keys()
                    .any(|k| k.starts_with("validation.policy.admission.k8s.io/"))
            }) || e["responseStatus"]["message"].as_str().is_some_and(|m| {
                m.contains("ValidatingAdmissionPolicy '") && m.contains("denied request")
            }),
        };
        if e["requestObject"].is_object()
            && matches!(r.resource.as_str(), "clusterrolebindings" | "rolebindings")
        {
            bindings.push(e.clone());
        }
        // A watch logs ResponseStarted, then (when it ended before the log
        // was kept) ResponseComplete: keep the last stage seen.
        if !by_id.contains_key(&r.audit_id) {
            order.push(r.audit_id.clone());
        }
        by_id.insert(r.audit_id.clone(), r);
    }
    let requests = order
        .into_iter()
        .filter_map(|id| by_id.remove(&id))
        .collect();
    Ok(Parsed {
        requests,
        bindings,
        torn,
    })
}

/// A ServiceAccount a Helm release of the chart bound to one of its roles.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Install {
    cluster: String,
    release: String,
    namespace: String,
    service_account: String,
    /// One of [`ROLES`] (the binding's `app.kubernetes.io/component`).
    role: String,
}

impl Install {
    fn user(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace, self.service_account
        )
    }
}

/// The chart's roles whose requests are replayed: the agent, the
/// controller, the CRD hook Job (`forewarn crds apply`) and the `helm test`
/// Pod (`forewarn check-install`); each is the `app.kubernetes.io/component`
/// of its RBAC and the role its `User-Agent` names.
const ROLES: [&str; 4] = ["agent", "controller", "crds", "check-install"];

/// The roles whose RBAC are Helm hooks. Their Job and Pod cannot run on
/// KWOK's nodes, so tests/chart/ applies their RBAC as rendered (`kubectl
/// apply --server-side`, the Helm labels included) and runs the command
/// with a token of their ServiceAccount; tests/real_node_chart.rs has Helm
/// run the CRD hook for real.
const HOOK_ROLES: [&str; 2] = ["crds", "check-install"];

/// The chart's ServiceAccounts, from the bindings with the chart's labels
/// that Helm created (allowed and answered 201), or for a hook's role,
/// that kubectl applied from the rendered chart.
fn installs(cluster: &str, bindings: &[Value]) -> BTreeSet<Install> {
    let mut out = BTreeSet::new();
    for e in bindings {
        let created = matches!(e["verb"].as_str(), Some("create" | "patch"))
            && e["responseStatus"]["code"] == 201;
        let ua = e["userAgent"].as_str().unwrap_or_default();
        let meta = &e["requestObject"]["metadata"];
        let labels = &meta["labels"];
        let Some(role) = labels["app.kubernetes.io/component"]
            .as_str()
            .filter(|r| ROLES.contains(r))
        else {
            continue;
        };
        let by_helm = ua.starts_with("Helm/") && e["verb"] == "create";
        let applied_hook = HOOK_ROLES.contains(&role) && ua.starts_with("kubectl/");
        if !created || !(by_helm || applied_hook) || labels["app.kubernetes.io/name"] != "forewarn"
        {
            continue;
        }
        let release = meta["annotations"]["meta.helm.sh/release-name"]
            .as_str()
            .or_else(|| labels["app.kubernetes.io/instance"].as_str())
            .unwrap_or_default();
        for s in e["requestObject"]["subjects"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if s["kind"] == "ServiceAccount" {
                out.insert(Install {
                    cluster: cluster.to_string(),
                    release: release.to_string(),
                    namespace: s["namespace"].as_str().unwrap_or_default().to_string(),
                    service_account: s["name"].as_str().unwrap_or_default().to_string(),
                    role: role.to_string(),
                });
            }
        }
    }
    out
}

/// One permission the chart grants a role: a verb on a resource, of one
/// name when the rule lists `resourceNames`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Permission {
    role: String,
    group: String,
    resource: String,
    verb: String,
    name: Option<String>,
    /// Granted by a Role: only in the release namespace, or in
    /// `other_namespace`.
    namespaced: bool,
    /// The namespace of a Role outside the release namespace (the
    /// controller's in `kube-node-lease`).
    other_namespace: Option<String>,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {group}/{}", self.verb, self.resource)?;
        if let Some(n) = &self.name {
            write!(f, " [{n}]")?;
        }
        match (&self.other_namespace, self.namespaced) {
            (Some(ns), _) => write!(f, " (namespace {ns})")?,
            (None, true) => write!(f, " (release namespace)")?,
            (None, false) => {}
        }
        Ok(())
    }
}

/// Every permission of the ClusterRoles and Roles among `docs` (rendered
/// objects as JSON), each role named by its `app.kubernetes.io/component`.
fn permissions(docs: &[Value]) -> BTreeSet<Permission> {
    let mut out = BTreeSet::new();
    for d in docs {
        let namespaced = match d["kind"].as_str() {
            Some("ClusterRole") => false,
            Some("Role") => true,
            _ => continue,
        };
        // Rendered with `--namespace forewarn` (see `render_rbac`): a Role
        // elsewhere is in a namespace of its own, whatever the release's.
        let other_namespace = d["metadata"]["namespace"]
            .as_str()
            .filter(|ns| namespaced && *ns != RENDER_NAMESPACE)
            .map(str::to_string);
        let role = d["metadata"]["labels"]["app.kubernetes.io/component"]
            .as_str()
            .unwrap_or_else(|| panic!("a role without its component label: {d}"))
            .to_string();
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        };
        for rule in d["rules"].as_array().into_iter().flatten() {
            let names: Vec<Option<String>> = match strings(&rule["resourceNames"]) {
                n if n.is_empty() => vec![None],
                n => n.into_iter().map(Some).collect(),
            };
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        for name in &names {
                            out.insert(Permission {
                                role: role.clone(),
                                group: group.clone(),
                                resource: resource.clone(),
                                verb: verb.clone(),
                                name: name.clone(),
                                namespaced,
                                other_namespace: other_namespace.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

/// Whether `p` authorizes `r`, a request of the ServiceAccount `install`.
fn grants(p: &Permission, r: &Request, install: &Install) -> bool {
    p.role == install.role
        && p.group == r.group
        && p.resource == r.resource
        && r.verbs().contains(&p.verb.as_str())
        && p.name.as_ref().is_none_or(|n| *n == r.name)
        && (!p.namespaced
            || r.namespace == *p.other_namespace.as_ref().unwrap_or(&install.namespace))
}

/// The product's requests: those of a chart ServiceAccount of the same
/// cluster sent by forewarn (its `User-Agent`) as that account's role.
fn product<'a>(
    requests: &'a [Request],
    installs: &'a BTreeSet<Install>,
) -> Vec<(&'a Request, &'a Install)> {
    let by_user: HashMap<(String, String), &Install> = installs
        .iter()
        .map(|i| ((i.cluster.clone(), i.user()), i))
        .collect();
    requests
        .iter()
        .filter_map(|r| {
            let i = by_user.get(&(r.cluster.clone(), r.user.clone()))?;
            let ua = r.user_agent.strip_prefix("forewarn/")?;
            ua.contains(&format!("({};", i.role)).then_some((r, *i))
        })
        .collect()
}

/// What the replay found.
#[derive(Debug, Default)]
struct Verdict {
    /// Requests of the product each permission authorized.
    used: BTreeMap<Permission, usize>,
    /// Permissions no request of the product used.
    unused: Vec<Permission>,
    /// Requests of the product refused (RBAC, or 403 but by the policy).
    refused: Vec<Request>,
    /// Requests of the product an admission policy denied (not RBAC).
    policy_denied: Vec<Request>,
    /// Requests of the product allowed by something that is not the
    /// chart's RBAC (the cluster's default roles, e.g. discovery).
    unexplained: Vec<Request>,
}

fn replay(
    perms: &BTreeSet<Permission>,
    requests: &[Request],
    installs: &BTreeSet<Install>,
) -> Verdict {
    let mut v = Verdict {
        used: perms.iter().map(|p| (p.clone(), 0)).collect(),
        ..Verdict::default()
    };
    for (r, i) in product(requests, installs) {
        if r.refused() {
            v.refused.push(r.clone());
            continue;
        }
        if r.policy_denied {
            v.policy_denied.push(r.clone());
        }
        let mut explained = false;
        for p in perms.iter().filter(|p| grants(p, r, i)) {
            *v.used.get_mut(p).expect("every permission counted") += 1;
            explained = true;
        }
        if !explained {
            v.unexplained.push(r.clone());
        }
    }
    v.unused = v
        .used
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(p, _)| p.clone())
        .collect();
    v
}

// ---------------------------------------------------------------------------
// Inputs: the kept audit logs and the chart rendered by helm.

/// The chart's ClusterRoles and Roles of release `release`, rendered with
/// `values` (a values file, or none for the defaults).
fn render_rbac(helm: &Path, release: &str, values: Option<&Path>) -> Vec<Value> {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("audit-helm-home");
    let chart = repo_root().join("charts/forewarn");
    let mut cmd = Command::new(helm);
    cmd.args(["template", release])
        .arg(&chart)
        .args(["--namespace", RENDER_NAMESPACE, "--api-versions", VAP_API])
        .args([
            "-s",
            "templates/rbac-agent.yaml",
            "-s",
            "templates/rbac-controller.yaml",
            "-s",
            "templates/crds-upgrade-job.yaml",
            "-s",
            "templates/tests/check-install.yaml",
        ])
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    if let Some(v) = values {
        cmd.arg("-f").arg(v);
    }
    let out = cmd.output().expect("failed to run helm template");
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split("\n---")
        .filter_map(|doc| {
            let v: Value = serde_yaml::from_str(doc).expect("rendered YAML parses");
            (!v.is_null()).then_some(v)
        })
        .collect()
}

/// Every `*.audit.log` in `FOREWARN_AUDIT_DIR`: (cluster, text).
fn audit_logs() -> Vec<(String, String)> {
    const HOW: &str = "run by hack/test-all.sh (make test), which runs this suite after every \
                       other one on the audit logs of their clusters";
    let dir = std::env::var_os("FOREWARN_AUDIT_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("FOREWARN_AUDIT_DIR is not set: {HOW}"));
    let mut logs: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "cannot read FOREWARN_AUDIT_DIR {}: {e}; {HOW}",
                dir.display()
            )
        })
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p
                .file_name()?
                .to_str()?
                .strip_suffix(".audit.log")?
                .to_string();
            Some((name, p))
        })
        .map(|(name, p)| {
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            (name, text)
        })
        .collect();
    logs.sort();
    assert!(
        !logs.is_empty(),
        "no *.audit.log in FOREWARN_AUDIT_DIR {}: {HOW}",
        dir.display()
    );
    logs
}

/// The replay of every request of the product in the logs of `make test`
/// against the chart's RBAC: no permission unused, no request refused.
#[test]
fn chart_rbac_is_exactly_what_the_product_uses() {
    let logs = audit_logs();
    let names: Vec<&str> = logs.iter().map(|(n, _)| n.as_str()).collect();
    let mut required = vec![CHART_CLUSTER];
    if std::env::var("FOREWARN_SKIP_REAL_NODE").as_deref() != Ok("1") {
        required.push(REAL_CLUSTER);
    }
    for c in &required {
        assert!(
            names.contains(c),
            "no audit log of the cluster {c} among {names:?}: its suite did not run, or \
             hack/cluster.sh down did not keep its log (FOREWARN_AUDIT_KEEP)"
        );
    }

    let mut requests = Vec::new();
    let mut installed = BTreeSet::new();
    for (cluster, text) in &logs {
        let Parsed {
            requests: r,
            bindings: b,
            torn,
        } = parse_log(cluster, text).unwrap_or_else(|e| panic!("{e}"));
        if !torn.is_empty() {
            println!("{cluster}: lines left out, torn and of no ServiceAccount: {torn:?}");
        }
        let found = installs(cluster, &b);
        println!(
            "{cluster}: {} requests logged, chart ServiceAccounts: {:?}",
            r.len(),
            found
                .iter()
                .map(|i| format!("{} ({})", i.user(), i.role))
                .collect::<Vec<_>>()
        );
        requests.extend(r);
        installed.extend(found);
    }
    for c in &required {
        assert!(
            installed.iter().any(|i| i.cluster == *c),
            "the log of {c} shows no Helm release of the chart binding its ServiceAccounts \
             (was the cluster started with hack/audit-policy.yaml?)"
        );
    }

    // The chart's RBAC: default values, and every optional feature on
    // (the union; the admission policy's rule is on by default).
    let helm = helm_bin();
    let all_features = repo_root().join("tests/chart-fixtures/values-all-features.yaml");
    let releases: BTreeSet<&str> = installed.iter().map(|i| i.release.as_str()).collect();
    let mut perms = BTreeSet::new();
    for release in releases {
        for values in [None, Some(all_features.as_path())] {
            perms.extend(permissions(&render_rbac(&helm, release, values)));
        }
    }
    for role in ROLES {
        assert!(
            perms.iter().any(|p| p.role == role),
            "the rendered chart grants the {role} nothing: {perms:?}"
        );
    }

    let v = replay(&perms, &requests, &installed);
    let mut per_role: BTreeMap<String, usize> = BTreeMap::new();
    for (_, i) in product(&requests, &installed) {
        *per_role.entry(i.role.clone()).or_default() += 1;
    }
    println!("\nrequests of the product by role: {per_role:?}\n");
    println!("{:<11} {:<72} {:>8}", "role", "permission", "requests");
    for (p, n) in &v.used {
        println!("{:<11} {:<72} {n:>8}", p.role, p.to_string());
    }
    for r in &v.policy_denied {
        println!(
            "denied by the admission policy (not RBAC): {}",
            r.describe()
        );
    }
    for r in &v.unexplained {
        println!(
            "allowed by the cluster's default roles, not the chart's: {}",
            r.describe()
        );
    }
    for role in ROLES {
        assert!(
            per_role.get(role).is_some_and(|n| *n > 0),
            "no request of the product as the {role} in the logs {names:?}"
        );
    }
    let mut failures = Vec::new();
    if !v.unused.is_empty() {
        failures.push(format!(
            "granted by the chart, never used by the product ({}):\n  {}",
            v.unused.len(),
            v.unused
                .iter()
                .map(|p| format!("{}: {p}", p.role))
                .collect::<Vec<_>>()
                .join("\n  ")
        ));
    }
    if !v.refused.is_empty() {
        failures.push(format!(
            "requests of the product refused ({}):\n  {}",
            v.refused.len(),
            v.refused
                .iter()
                .map(Request::describe)
                .collect::<Vec<_>>()
                .join("\n  ")
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------
// The matcher on hand-written audit events.

fn event(
    id: &str,
    user: &str,
    ua: &str,
    verb: &str,
    object: Value,
    code: i64,
    annotations: Value,
) -> String {
    serde_json::json!({
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
        "auditID": id, "stage": "ResponseComplete", "requestURI": "/x", "verb": verb,
        "user": {"username": user}, "userAgent": ua, "objectRef": object,
        "responseStatus": {"code": code}, "annotations": annotations,
    })
    .to_string()
}

fn binding(id: &str, kind: &str, role: &str, sa: &str, ns: &str) -> String {
    serde_json::json!({
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Request",
        "auditID": id, "stage": "ResponseComplete", "verb": "create",
        "user": {"username": "kwok-admin"}, "userAgent": "Helm/3.22.0",
        "objectRef": {"resource": kind, "apiGroup": "rbac.authorization.k8s.io"},
        "responseStatus": {"code": 201},
        "requestObject": {
            "metadata": {
                "labels": {"app.kubernetes.io/name": "forewarn", "app.kubernetes.io/component": role},
                "annotations": {"meta.helm.sh/release-name": "forewarn"},
            },
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
        },
        "annotations": {"authorization.k8s.io/decision": "allow"},
    })
    .to_string()
}

#[test]
fn matcher_finds_unused_verbs_and_refused_requests_of_the_product_only() {
    let allow = serde_json::json!({"authorization.k8s.io/decision": "allow"});
    let forbid = serde_json::json!({"authorization.k8s.io/decision": "forbid"});
    let agent = "system:serviceaccount:fw:forewarn-agent";
    let ctl = "system:serviceaccount:fw:forewarn-controller";
    let agent_ua = "forewarn/0.1.0 (agent; node-0)";
    let ctl_ua = "forewarn/0.1.0 (controller; pod-1)";
    let reports = |name: &str| serde_json::json!({"apiGroup": "forewarn.dev", "resource": "scheduledeventreports", "name": name});
    let lease = |ns: &str| serde_json::json!({"apiGroup": "coordination.k8s.io", "resource": "leases", "name": "fw-lease", "namespace": ns});
    let log = [
        binding("b1", "clusterrolebindings", "agent", "forewarn-agent", "fw"),
        binding(
            "b2",
            "clusterrolebindings",
            "controller",
            "forewarn-controller",
            "fw",
        ),
        // A server-side apply that created the report: patch and create.
        event(
            "1",
            agent,
            agent_ua,
            "patch",
            reports("r.node-0"),
            201,
            allow.clone(),
        ),
        // Two stages of one watch count once.
        event(
            "2",
            agent,
            agent_ua,
            "watch",
            reports(""),
            200,
            allow.clone(),
        ),
        event(
            "2",
            agent,
            agent_ua,
            "watch",
            reports(""),
            200,
            allow.clone(),
        ),
        // Another node's report, denied by the admission policy: not RBAC.
        event("3", agent, agent_ua, "patch", reports("r.node-1"), 403, allow.clone()).replace(
            r#""code":403"#,
            r#""code":403,"message":"scheduledeventreports.forewarn.dev \"r.node-1\" is forbidden: ValidatingAdmissionPolicy 'fw-agent-reports' with binding 'fw-agent-reports' denied request: no""#,
        ),
        // kubectl with the agent's token, refused on purpose: not the product.
        event(
            "4",
            agent,
            "kubectl/v1.36.3",
            "delete",
            reports("r.node-0"),
            403,
            forbid.clone(),
        ),
        // The controller's lease in the release namespace, and elsewhere.
        event("5", ctl, ctl_ua, "update", lease("fw"), 200, allow.clone()),
        event(
            "6",
            ctl,
            ctl_ua,
            "update",
            lease("other"),
            403,
            forbid.clone(),
        ),
        // The agent's token with the controller's User-Agent: neither.
        event("7", agent, ctl_ua, "list", reports(""), 200, allow.clone()),
        // A node's Lease, watched under the Role in kube-node-lease.
        event(
            "8",
            ctl,
            ctl_ua,
            "watch",
            serde_json::json!({"apiGroup": "coordination.k8s.io", "resource": "leases", "namespace": "kube-node-lease"}),
            200,
            allow.clone(),
        ),
    ]
    .join("\n");
    let Parsed {
        requests,
        bindings,
        torn,
    } = parse_log("c", &log).expect("parses");
    assert!(torn.is_empty());
    assert_eq!(requests.len(), 10, "one request per audit ID");
    let installed = installs("c", &bindings);
    assert_eq!(installed.len(), 2, "{installed:?}");
    let rbac: Vec<Value> = serde_yaml::from_str::<Vec<Value>>(
        r#"
- kind: ClusterRole
  metadata: {labels: {app.kubernetes.io/component: agent}}
  rules:
    - apiGroups: [forewarn.dev]
      resources: [scheduledeventreports]
      verbs: [create, patch, list, watch]
- kind: Role
  metadata: {labels: {app.kubernetes.io/component: controller}}
  rules:
    - apiGroups: [coordination.k8s.io]
      resources: [leases]
      resourceNames: [fw-lease, old-lease]
      verbs: [update]
- kind: Role
  metadata: {namespace: kube-node-lease, labels: {app.kubernetes.io/component: controller}}
  rules:
    - apiGroups: [coordination.k8s.io]
      resources: [leases]
      verbs: [watch, list]
"#,
    )
    .expect("rules");
    let perms = permissions(&rbac);
    assert_eq!(perms.len(), 8, "{perms:?}");
    let v = replay(&perms, &requests, &installed);
    let unused: Vec<String> = v
        .unused
        .iter()
        .map(|p| format!("{}: {p}", p.role))
        .collect();
    assert_eq!(
        unused,
        [
            "agent: list forewarn.dev/scheduledeventreports",
            "controller: list coordination.k8s.io/leases (namespace kube-node-lease)",
            "controller: update coordination.k8s.io/leases [old-lease] (release namespace)",
        ]
    );
    let refused: Vec<&str> = v.refused.iter().map(|r| r.audit_id.as_str()).collect();
    assert_eq!(refused, ["6"]);
    let denied: Vec<&str> = v
        .policy_denied
        .iter()
        .map(|r| r.audit_id.as_str())
        .collect();
    assert_eq!(denied, ["3"]);
    assert_eq!(v.used.values().sum::<usize>(), 6, "{:?}", v.used);
}

#[test]
fn matcher_refuses_a_torn_line_that_may_be_a_service_accounts_request() {
    let good = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","auditID":"1"}"#;
    let admin =
        r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","user":{"username":"kwok-admin"},"#;
    let parsed = parse_log("c", &format!("{good}\n{admin}\n{good}\n")).expect("left out");
    assert_eq!(parsed.torn, [2]);
    let sa = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","user":{"username":"system:serviceaccount:fw:forewarn-agent"#;
    let err = match parse_log("c", &format!("{good}\n{sa}\n")) {
        Ok(_) => panic!("a torn line of a ServiceAccount was left out"),
        Err(e) => e,
    };
    assert!(err.contains("line 2"), "{err}");
    let err = match parse_log("c", r#"{"kind":"Status","apiVersion":"v1"}"#) {
        Ok(_) => panic!("a line that is no audit event was read"),
        Err(e) => e,
    };
    assert!(err.contains("not an audit event"), "{err}");
}
