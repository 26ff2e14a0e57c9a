//! `metrics.auth.enabled`: what the chart renders, and the processes
//! reviewing scrapers' tokens with the chart's RBAC on a real API server.

use std::time::Duration;

use serde_json::Value;

use crate::install::install_monitoring_crds;
use crate::on_cluster::{ControllerProc, install_with, token, token_kubeconfig};
use crate::{
    AGENT_SA, CONTROLLER_SA, NS, RELEASE, VAP_API, admin, chart_dir, cluster, documents,
    ensure_namespace, eventually, find_doc, helm, render,
};

/// The container args of the workload `kind` in `docs`.
fn workload_args(docs: &[Value], kind: &str) -> Vec<String> {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

/// `metrics.auth.enabled`: on, both workloads run with
/// `--metrics-auth=kubernetes`, both roles may create TokenReviews and
/// SubjectAccessReviews, the ClusterRole `forewarn-metrics-reader` allows
/// `get` on `/metrics` (bound to the scraper's ServiceAccount when named),
/// the ServiceMonitors send Prometheus's own token and the PodMonitors the
/// chart's scraper token Secret (or the one named). Off (the default), none
/// of it renders.
#[test]
fn metrics_auth_renders_the_flag_rbac_reader_and_monitor_tokens_only_when_on() {
    let review_rule = |docs: &[Value], role: &str, group: &str, resource: &str| {
        find_doc(docs, "ClusterRole", &format!("forewarn-{role}"))
            .unwrap_or_else(|| panic!("no ClusterRole forewarn-{role}"))["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .any(|r| {
                r["apiGroups"] == serde_json::json!([group])
                    && r["resources"] == serde_json::json!([resource])
                    && r["verbs"] == serde_json::json!(["create"])
            })
    };
    let endpoints = |docs: &[Value], kind: &str| -> Vec<Value> {
        let field = if kind == "ServiceMonitor" {
            "endpoints"
        } else {
            "podMetricsEndpoints"
        };
        let found: Vec<Value> = docs
            .iter()
            .filter(|d| d["kind"] == kind)
            .map(|d| d["spec"][field][0].clone())
            .collect();
        assert_eq!(found.len(), 2, "one {kind} per role");
        found
    };
    let flag = "--metrics-auth=kubernetes".to_string();

    // Off: nothing of it, with either monitor.
    for monitor in ["serviceMonitor", "podMonitor"] {
        let docs = documents(&render(&[
            "--set",
            &format!("metrics.{monitor}.enabled=true"),
        ]));
        for kind in ["DaemonSet", "Deployment"] {
            assert!(
                !workload_args(&docs, kind)
                    .iter()
                    .any(|a| a.contains("metrics-auth")),
                "{kind}"
            );
        }
        for role in ["agent", "controller"] {
            assert!(!review_rule(
                &docs,
                role,
                "authentication.k8s.io",
                "tokenreviews"
            ));
            assert!(!review_rule(
                &docs,
                role,
                "authorization.k8s.io",
                "subjectaccessreviews"
            ));
        }
        let names: Vec<&str> = docs
            .iter()
            .filter_map(|d| d["metadata"]["name"].as_str())
            .collect();
        assert!(
            !names
                .iter()
                .any(|n| n.contains("metrics-reader") || n.contains("metrics-scraper")),
            "{names:?}"
        );
        let kind = if monitor == "serviceMonitor" {
            "ServiceMonitor"
        } else {
            "PodMonitor"
        };
        for e in endpoints(&docs, kind) {
            for key in ["bearerTokenFile", "authorization", "bearerTokenSecret"] {
                assert!(e.get(key).is_none(), "{kind} sends a token: {e}");
            }
        }
    }

    // On, with the ServiceMonitor and kube-prometheus-stack's Prometheus.
    let docs = documents(&render(&[
        "--set",
        "metrics.auth.enabled=true",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.auth.scraper.serviceAccount.name=kube-prometheus-stack-prometheus",
        "--set",
        "metrics.auth.scraper.serviceAccount.namespace=monitoring",
    ]));
    for kind in ["DaemonSet", "Deployment"] {
        assert!(workload_args(&docs, kind).contains(&flag), "{kind}");
    }
    for role in ["agent", "controller"] {
        assert!(
            review_rule(&docs, role, "authentication.k8s.io", "tokenreviews"),
            "{role}"
        );
        assert!(
            review_rule(&docs, role, "authorization.k8s.io", "subjectaccessreviews"),
            "{role}"
        );
    }
    let reader = find_doc(&docs, "ClusterRole", "forewarn-metrics-reader").expect("reader role");
    assert_eq!(
        reader["rules"],
        serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
    let binding =
        find_doc(&docs, "ClusterRoleBinding", "forewarn-metrics-reader").expect("reader binding");
    assert_eq!(binding["roleRef"]["name"], "forewarn-metrics-reader");
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "kube-prometheus-stack-prometheus", "namespace": "monitoring"}])
    );
    for e in endpoints(&docs, "ServiceMonitor") {
        assert_eq!(
            e["bearerTokenFile"], "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "{e}"
        );
    }
    assert!(find_doc(&docs, "Secret", "forewarn-metrics-scraper-token").is_none());

    // On, with the PodMonitor: the chart's scraper token, or the one named.
    let docs = documents(&render(&[
        "--set",
        "metrics.auth.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
    ]));
    assert!(
        find_doc(&docs, "ClusterRoleBinding", "forewarn-metrics-reader").is_none(),
        "a binding without a scraper named"
    );
    let secret = find_doc(&docs, "Secret", "forewarn-metrics-scraper-token").expect("token Secret");
    assert_eq!(secret["type"], "kubernetes.io/service-account-token");
    assert_eq!(
        secret["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "forewarn-metrics-scraper"
    );
    assert!(find_doc(&docs, "ServiceAccount", "forewarn-metrics-scraper").is_some());
    let scraper_binding =
        find_doc(&docs, "ClusterRoleBinding", "forewarn-metrics-scraper").expect("scraper binding");
    assert_eq!(
        scraper_binding["roleRef"]["name"],
        "forewarn-metrics-reader"
    );
    assert_eq!(
        scraper_binding["subjects"][0]["name"],
        "forewarn-metrics-scraper"
    );
    for e in endpoints(&docs, "PodMonitor") {
        assert_eq!(
            e["authorization"],
            serde_json::json!({"type": "Bearer", "credentials": {"name": "forewarn-metrics-scraper-token", "key": "token"}})
        );
    }
    let docs = documents(&render(&[
        "--set",
        "metrics.auth.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "metrics.auth.podMonitorToken.secretName=my-scraper-token",
        "--set",
        "metrics.auth.podMonitorToken.key=bearer",
    ]));
    assert!(find_doc(&docs, "Secret", "forewarn-metrics-scraper-token").is_none());
    assert!(find_doc(&docs, "ServiceAccount", "forewarn-metrics-scraper").is_none());
    for e in endpoints(&docs, "PodMonitor") {
        assert_eq!(
            e["authorization"]["credentials"],
            serde_json::json!({"name": "my-scraper-token", "key": "bearer"})
        );
    }

    // A scraper without its namespace, and wrong types, are refused.
    let chart = chart_dir();
    for (set, complaint) in [
        (
            "metrics.auth.scraper.serviceAccount.name=prometheus",
            "needs metrics.auth.scraper.serviceAccount.namespace",
        ),
        ("metrics.auth.enabled=maybe", "/metrics/auth/enabled"),
        ("metrics.auth.scraper.serviceAcount.name=x", "serviceAcount"),
        (
            "metrics.auth.podMonitorToken.key=",
            "/metrics/auth/podMonitorToken/key",
        ),
    ] {
        let out = helm(&[
            "template",
            RELEASE,
            &chart,
            "--api-versions",
            VAP_API,
            "--set",
            "metrics.auth.enabled=true",
            "--set",
            set,
        ]);
        assert!(!out.ok, "--set {set} was accepted");
        assert!(
            out.stderr.contains(complaint),
            "--set {set}: {}",
            out.stderr
        );
    }
}

/// `metrics.auth.enabled` on a real API server: the
/// chart installed with it (and the PodMonitor, so with the chart's
/// scraper token Secret), a real controller and a real agent run with
/// `--metrics-auth kubernetes` and TokenRequest tokens of the chart's
/// ServiceAccounts only, so the chart's RBAC must let them create the
/// TokenReviews and SubjectAccessReviews. Each answers `/metrics` with 401
/// (and the Bearer challenge) without a token or with one the API server
/// does not authenticate, 403 for a ServiceAccount not bound to
/// `forewarn-metrics-reader`, and the metrics for the scraper the chart
/// bound to it and for the chart's scraper token; the verdict is cached
/// (the counter says so); `/healthz` stays open.
#[test]
fn metrics_auth_reviews_scrapers_tokens_with_the_chart_rbac() {
    let (_turn, c) = cluster();
    let k = admin(&c);
    install_monitoring_crds(&k);
    ensure_namespace(&k, NS, "privileged");
    let (reader, stranger) = ("forewarn-test-scraper", "forewarn-test-stranger");
    for sa in [reader, stranger] {
        k.ok_stdin(
            &["apply", "--server-side", "-f", "-"],
            &format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {sa}\n  namespace: {NS}\n"
            ),
        );
    }
    let name = format!("metrics.auth.scraper.serviceAccount.name={reader}");
    let namespace = format!("metrics.auth.scraper.serviceAccount.namespace={NS}");
    install_with(
        &k,
        &c,
        &[
            "--set",
            "metrics.auth.enabled=true",
            "--set",
            &name,
            "--set",
            &namespace,
            "--set",
            "metrics.podMonitor.enabled=true",
        ],
    );
    let agent = token_kubeconfig(&k, "metrics-auth-agent", &token(&k, AGENT_SA, None));
    let controller = token_kubeconfig(
        &k,
        "metrics-auth-controller",
        &token(&k, CONTROLLER_SA, None),
    );
    let reader_token = token(&k, reader, None);
    let stranger_token = token(&k, stranger, None);
    // The chart's own scraper token, which kube-controller-manager fills in.
    let chart_scraper_token = eventually(
        "the token Secret forewarn-metrics-scraper-token filled in",
        Duration::from_secs(120),
        || {
            let out = k.run(
                &[
                    "get",
                    "secret",
                    "-n",
                    NS,
                    "forewarn-metrics-scraper-token",
                    "-o",
                    "go-template={{if .data}}{{if .data.token}}{{.data.token | base64decode}}{{end}}{{end}}",
                ],
                None,
            );
            let t = out.stdout.trim().to_string();
            (out.ok && !t.is_empty()).then_some(t)
        },
    );
    k.run(
        &[
            "delete",
            "lease",
            "-n",
            NS,
            "forewarn-controller",
            "--ignore-not-found",
        ],
        None,
    );
    let procs = [
        (
            "controller",
            ControllerProc::spawn(
                &controller.kubeconfig,
                "metrics-auth-controller",
                &[
                    "controller",
                    "--metrics-addr",
                    "127.0.0.1:0",
                    "--metrics-auth",
                    "kubernetes",
                    "--dry-run",
                    "--lease-namespace",
                    NS,
                    "--lease-name",
                    "forewarn-controller",
                    "--identity",
                    "metrics-auth-controller",
                ],
            ),
        ),
        (
            "agent",
            ControllerProc::spawn(
                &agent.kubeconfig,
                "metrics-auth-agent",
                &[
                    "agent",
                    "--node-name",
                    "node-000000",
                    // Nothing answers there: the agent serves its metrics all the same.
                    "--imds-url",
                    "http://127.0.0.1:9",
                    "--metrics-addr",
                    "127.0.0.1:0",
                    "--metrics-auth",
                    "kubernetes",
                ],
            ),
        ),
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // A hang bound: a TokenReview or SubjectAccessReview takes
    // milliseconds; only a process that stopped answering takes a minute.
    let http = forewarn::http::client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("HTTP client");
    let get = |port: u16, path: &str, auth: Option<&str>| {
        rt.block_on(async {
            let mut req = http.get(format!("http://127.0.0.1:{port}{path}"));
            if let Some(a) = auth {
                req = req.header("Authorization", a);
            }
            let r = req.send().await.expect("an answer");
            let status = r.status().as_u16();
            let challenge = r
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            (status, challenge, r.text().await.unwrap_or_default())
        })
    };
    let bearer = |t: &str| format!("Bearer {t}");
    for (role, proc) in &procs {
        let port = proc.metrics_port();
        let log = || proc.log();
        // Open: the probes.
        let (status, _, _) = get(port, "/healthz", None);
        assert_eq!(status, 200, "{role} /healthz:\n{}", log());
        let (status, _, _) = get(port, "/readyz", None);
        assert_ne!(status, 401, "{role} /readyz asks for a token");
        // No token, another scheme, a token the API server does not know: 401.
        for auth in [
            None,
            Some("Basic dXNlcjpwYXNz".to_string()),
            Some(bearer("not-a-token")),
        ] {
            let (status, challenge, body) = get(port, "/metrics", auth.as_deref());
            assert_eq!(
                status,
                401,
                "{role} /metrics with {auth:?}: {body}\n{}",
                log()
            );
            assert_eq!(challenge.as_deref(), Some("Bearer"), "{role}");
            assert!(!body.contains("forewarn_"), "{role}: {body}");
        }
        // Authenticated but not bound to the reader role: 403.
        let (status, _, body) = get(port, "/metrics", Some(&bearer(&stranger_token)));
        assert_eq!(
            status,
            403,
            "{role} /metrics, unbound ServiceAccount: {body}\n{}",
            log()
        );
        assert!(!body.contains("forewarn_"), "{role}: {body}");
        // The scraper the chart bound, and the chart's own scraper token: 200.
        for (who, t) in [
            ("scraper", &reader_token),
            ("chart scraper", &chart_scraper_token),
        ] {
            let (status, _, body) = get(port, "/metrics", Some(&bearer(t)));
            assert_eq!(status, 200, "{role} /metrics, {who}: {body}\n{}", log());
            assert!(
                body.contains(&format!("forewarn_{role}_")),
                "{role}: {body}"
            );
        }
        // Asked again within the minute: from the cache, no review sent.
        let (status, _, body) = get(port, "/metrics", Some(&bearer(&reader_token)));
        assert_eq!(status, 200, "{role}");
        let count = |result: &str, cached: &str| -> u64 {
            let series = format!(
                "forewarn_{role}_metrics_auth_total{{cached=\"{cached}\",result=\"{result}\"}} "
            );
            body.lines()
                .find_map(|l| l.strip_prefix(&series))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        assert_eq!(count("allowed", "true"), 1, "{role}:\n{body}");
        assert_eq!(count("allowed", "false"), 2, "{role}:\n{body}");
        assert_eq!(count("denied", "false"), 1, "{role}:\n{body}");
        assert_eq!(count("unauthenticated", "false"), 1, "{role}:\n{body}");
        assert_eq!(count("no_token", "false"), 2, "{role}:\n{body}");
        assert_eq!(count("unavailable", "false"), 0, "{role}:\n{body}");
        // The chart's RBAC sufficed: no review was refused.
        let text = log();
        assert!(
            !text.contains("could not be reviewed") && !text.contains("forbidden"),
            "{role}:\n{text}"
        );
    }
    drop(procs);
    for sa in [reader, stranger] {
        k.run(
            &[
                "delete",
                "serviceaccount",
                "-n",
                NS,
                sa,
                "--ignore-not-found",
            ],
            None,
        );
    }
}
