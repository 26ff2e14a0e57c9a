//! `controller.policy`: what the chart renders is what the controller loads
//! (the example of src/policy.rs, the documentation's settings and commands,
//! the built-in defaults), and what the controller refuses the chart refuses.

use std::time::Duration;

use forewarn::policy::Policy;
use forewarn_harness::cluster::repo_root;

use crate::{
    RELEASE, VAP_API, all_features_values, chart_dir, documents, helm, indent, out_dir, render,
};

/// `helm template` with `values` (YAML) as a values file and `extra`
/// arguments; the policy the ConfigMap then holds, as the controller loads it.
fn render_policy(name: &str, values: &str, extra: &[&str]) -> Policy {
    let file = out_dir().join(format!("{name}.values.yaml"));
    std::fs::write(&file, values).expect("values file");
    let file = file.to_string_lossy().into_owned();
    let mut args = vec!["-f", file.as_str()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-s", "templates/policy-configmap.yaml"]);
    let docs = documents(&render(&args));
    let text = docs[0]["data"]["policy.yaml"]
        .as_str()
        .expect("policy.yaml in the ConfigMap");
    Policy::parse(text, "ConfigMap policy.yaml")
        .unwrap_or_else(|e| panic!("{name}: the rendered policy does not load: {e}\n{text}"))
}

/// The policy example at the top of src/policy.rs (the format docs/policy.md
/// points to), every key of the policy file given: as `controller.policy`
/// the chart takes it, and the controller loads what it renders as it
/// loads the example itself.
#[test]
fn policy_example_with_every_key_renders_and_loads() {
    let src = std::fs::read_to_string(repo_root().join("src/policy.rs")).expect("src/policy.rs");
    let example: String = src
        .lines()
        .map_while(|l| l.strip_prefix("//!"))
        .skip_while(|l| l.trim() != "```yaml")
        .skip(1)
        .take_while(|l| l.trim() != "```")
        .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l)))
        .collect();
    let expected = Policy::parse(&example, "src/policy.rs example")
        .unwrap_or_else(|e| panic!("the example does not load: {e}\n{example}"));
    for key in [
        "rules:",
        "minGraceSeconds:",
        "evictUnmanagedPods:",
        "releaseDelaySeconds:",
        "trustAnyAgent:",
        "drainLeadTimeSeconds:",
        "orphanedAfterSeconds:",
        "staleAfterSeconds:",
        "acknowledgeTimeoutSeconds:",
        "evictAfterAcknowledgement:",
        "excludeFromLoadBalancers:",
        "taintEffect:",
        "outOfServiceTaint:",
    ] {
        assert!(example.contains(key), "the example lacks {key}:\n{example}");
    }
    let values = format!("controller:\n  policy:\n{}", indent(&example, 4));
    let rendered = render_policy("policy-example", &values, &[]);
    assert_eq!(rendered, expected);
    // The same with some keys set on the command line, as an upgrade would.
    let rendered = render_policy(
        "policy-example-set",
        &values,
        &[
            "--set",
            "controller.policy.trustAnyAgent=true",
            "--set",
            "controller.policy.evictUnmanagedPods={Terminate,Preempt}",
            "--set",
            "controller.policy.retention=7d",
            "--set",
            "controller.policy.taintEffect=PreferNoSchedule",
            "--set",
            "controller.policy.outOfServiceTaint=true",
        ],
    );
    assert!(rendered.trust_any_agent);
    assert!(rendered.out_of_service_taint);
    assert_eq!(
        rendered.taint_effect,
        forewarn::policy::TaintEffect::PreferNoSchedule
    );
    assert_eq!(rendered.evict_unmanaged_pods, ["Terminate", "Preempt"]);
    assert_eq!(rendered.retention, Duration::from_secs(7 * 86400));
}

/// The user documentation, as one text: README.md, every page under docs/
/// and the chart's own README.
fn documentation() -> String {
    let root = repo_root();
    let mut files = vec![
        root.join("README.md"),
        root.join("charts/forewarn/README.md"),
    ];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(files.len() > 3, "no documentation pages: {files:?}");
    files
        .iter()
        .map(|f| {
            std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())) + "\n"
        })
        .collect()
}

/// The policy settings of docs/policy.md (`key` (default) in "Default
/// policy") and the values of the documentation's install and upgrade
/// commands (README.md, docs/, the chart's README) are all accepted, and the
/// settings are the controller's defaults.
#[test]
fn documented_policy_settings_and_install_values_are_accepted() {
    let policy_page =
        std::fs::read_to_string(repo_root().join("docs/policy.md")).expect("docs/policy.md");
    let start = policy_page
        .find("Default policy:")
        .expect("docs/policy.md: Default policy");
    let para = &policy_page[start..];
    let para = &para[..para.find("\n\n").unwrap_or(para.len())];
    // "`drainMarginSeconds` (5)", "`retention` (24h, every final phase)".
    let mut settings = Vec::new();
    for piece in para.split('`').collect::<Vec<_>>().windows(2) {
        let (key, after) = (piece[0], piece[1].trim_start());
        let Some(rest) = after.strip_prefix('(') else {
            continue;
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        let value = rest
            .split([')', ',', ':'])
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        settings.push((key.to_string(), value));
    }
    assert!(
        settings.len() >= 10,
        "docs/policy.md: fewer policy settings than expected: {settings:?}"
    );
    let values: String = settings
        .iter()
        .map(|(k, v)| format!("    {k}: {v}\n"))
        .collect();
    let rendered = render_policy(
        "docs-policy",
        &format!("controller:\n  policy:\n{values}"),
        &[],
    );
    let defaults = Policy {
        rules: rendered.rules.clone(),
        ..Policy::default()
    };
    assert_eq!(
        rendered, defaults,
        "docs/policy.md's policy settings are not the defaults: {settings:?}"
    );

    // Every `--set` of the documentation's helm commands (and the registry
    // its comment suggests).
    // Commands continued over lines (a trailing `\`) are read whole; the
    // placeholders `<your registry>` and `<digest>` take example values.
    let mut sets: Vec<String> = vec!["image.repository=registry.example.com/forewarn".into()];
    let mut commands: Vec<String> = Vec::new();
    let mut current = String::new();
    let docs = documentation();
    for line in docs.lines().map(str::trim) {
        let part = line.split(" #").next().unwrap_or_default();
        if current.is_empty()
            && !(part.starts_with("helm install") || part.starts_with("helm upgrade"))
        {
            continue;
        }
        match part.strip_suffix('\\') {
            Some(more) => current.push_str(more),
            None => {
                current.push_str(part);
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    for command in &commands {
        let words: Vec<&str> = command.split_whitespace().collect();
        for pair in words.windows(2) {
            if pair[0] == "--set" {
                sets.push(
                    pair[1]
                        .replace("<your registry>", "registry.example.com")
                        .replace("sha256:<digest>", &digest),
                );
            }
        }
    }
    // And the digest pin its prose suggests (`--set image.digest=sha256:...`).
    sets.push(format!("image.digest={digest}"));
    for key in [
        "crds.upgradeJob.enabled=",
        "metrics.serviceMonitor.enabled=",
    ] {
        assert!(
            sets.iter().any(|s| s.starts_with(key)),
            "the documentation's helm commands set no {key}: {sets:?}"
        );
    }
    for set in &sets {
        render(&["--set", set]);
    }
    // And each command's settings together.
    for command in &commands {
        let words: Vec<&str> = command.split_whitespace().collect();
        let mut args: Vec<String> = Vec::new();
        for pair in words.windows(2) {
            if pair[0] == "--set" {
                args.push("--set".into());
                args.push(
                    pair[1]
                        .replace("<your registry>", "registry.example.com")
                        .replace("sha256:<digest>", &digest),
                );
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        render(&args);
    }
}

/// A misspelt policy key fails `helm template` (so `helm install`) with
/// the key and where it is, at the top level and in a rule, from `--set`
/// and from a values file alike.
#[test]
fn misspelt_policy_key_is_refused_naming_it() {
    let chart = chart_dir();
    let file = out_dir().join("misspelt-policy.values.yaml");
    std::fs::write(
        &file,
        "controller:\n  policy:\n    releaseDelaySecond: 10\n",
    )
    .expect("values file");
    let file = file.to_string_lossy().into_owned();
    let cases: [(&[&str], &str, &str); 3] = [
        (
            &["--set", "controller.policy.trustAnyAgnet=true"],
            "trustAnyAgnet",
            "/controller/policy",
        ),
        (
            &[
                "--set",
                "controller.policy.rules[0].action=Drain",
                "--set",
                "controller.policy.rules[0].evenType=Reboot",
            ],
            "evenType",
            "/controller/policy/rules/0",
        ),
        (&["-f", &file], "releaseDelaySecond", "/controller/policy"),
    ];
    for (extra, key, at) in cases {
        let mut args = vec![
            "template",
            RELEASE,
            chart.as_str(),
            "--api-versions",
            VAP_API,
        ];
        args.extend_from_slice(extra);
        let out = helm(&args);
        assert!(!out.ok, "{extra:?}: the misspelt key {key} was accepted");
        for needle in [key, at, "not allowed"] {
            assert!(
                out.stderr.contains(needle),
                "{extra:?}: the refusal does not say {needle:?}: {}",
                out.stderr
            );
        }
        // The controller refuses it as well.
        let yaml = format!("{key}: 1\n");
        assert!(Policy::parse(&yaml, "p").is_err(), "{key} loads");
    }
}

/// `retention` takes what the controller's humantime parser takes, and
/// refuses what it refuses.
#[test]
fn policy_retention_takes_what_the_controller_takes() {
    let chart = chart_dir();
    for (retention, ok) in [
        ("24h", true),
        ("1h 30m", true),
        ("1h30m", true),
        ("1.5h", true),
        ("7days", true),
        ("2 weeks", true),
        ("1M", true),
        ("9years", true),
        ("500ms", true),
        ("soon", false),
        ("24", false),
        ("-1h", false),
        ("1fortnight", false),
        ("1H", false),
        ("", false),
    ] {
        let yaml = format!("retention: \"{retention}\"\n");
        assert_eq!(
            Policy::parse(&yaml, "p").is_ok(),
            ok,
            "the controller on retention {retention:?}"
        );
        let set = format!("controller.policy.retention={retention}");
        let out = helm(&[
            "template",
            RELEASE,
            &chart,
            "--api-versions",
            VAP_API,
            "--set-string",
            &set,
        ]);
        assert_eq!(
            out.ok, ok,
            "helm on retention {retention:?}: {}",
            out.stderr
        );
        if !ok {
            assert!(
                out.stderr.contains("/controller/policy/retention"),
                "{retention:?}: {}",
                out.stderr
            );
        }
    }
}

#[test]
fn policy_configmap_is_the_built_in_policy() {
    let docs = documents(&render(&["-s", "templates/policy-configmap.yaml"]));
    let text = docs[0]["data"]["policy.yaml"]
        .as_str()
        .expect("policy.yaml in the ConfigMap");
    let policy = Policy::parse(text, "ConfigMap policy.yaml")
        .unwrap_or_else(|e| panic!("the chart's policy does not load: {e}"));
    assert_eq!(
        policy,
        Policy::default(),
        "chart default policy != built-in default"
    );
    // The all-features policy loads too.
    let docs = documents(&render(&[
        "-f",
        &all_features_values(),
        "-s",
        "templates/policy-configmap.yaml",
    ]));
    let text = docs[0]["data"]["policy.yaml"]
        .as_str()
        .expect("policy.yaml");
    let p = Policy::parse(text, "ConfigMap policy.yaml").expect("all-features policy loads");
    assert_eq!(p.rules.len(), 2);
    assert_eq!(p.retention, Duration::from_secs(3600));
}
