//! `controller.webhooks`: the webhooks file in a Secret the controller
//! mounts, and the schema that refuses a misspelt one.

use forewarn_harness::cluster::repo_root;
use serde_json::Value;

use crate::{NS, RELEASE, VAP_API, chart_dir, documents, helm, indent, out_dir, render};

/// The webhooks file of the module docs of src/notify/webhooks.rs (the
/// format the README points to), without its `caFile` (which names a file
/// of the pod).
fn webhooks_example() -> String {
    let src = std::fs::read_to_string(repo_root().join("src/notify/webhooks.rs"))
        .expect("src/notify/webhooks.rs");
    src.lines()
        .map_while(|l| l.strip_prefix("//!"))
        .skip_while(|l| l.trim() != "```yaml")
        .skip(1)
        .take_while(|l| l.trim() != "```")
        .filter(|l| !l.contains("caFile"))
        .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l)))
        .collect()
}

/// `controller.webhooks.config` lands in a Secret of the chart that the
/// controller mounts and is passed (`--webhooks-file`), and what it holds
/// loads as the file it came from; `existingSecret` mounts the operator's
/// own Secret instead (no Secret of the chart); neither: no webhook at all.
/// A body template passes through the values and the Secret unchanged.
/// With a NetworkPolicy, webhooks open their port and DNS.
#[test]
fn webhooks_come_from_a_secret_the_controller_mounts() {
    use forewarn::notify::config::Config;
    let example = webhooks_example();
    let expected = Config::parse(&example, "example").expect("the example loads");
    assert_eq!(expected.webhooks.len(), 3, "{example}");
    assert!(expected.webhooks[2].template.is_some(), "{example}");
    let file = out_dir().join("webhooks.values.yaml");
    std::fs::write(
        &file,
        format!(
            "networkPolicy: {{enabled: true}}\ncontroller:\n  webhooks:\n    config:\n{}",
            indent(&example, 6)
        ),
    )
    .expect("values file");
    let docs = documents(&render(&["-f", &file.to_string_lossy()]));
    let kind = |k: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == k && d["metadata"]["name"] == name)
            .cloned()
    };
    let secret = kind("Secret", &format!("{RELEASE}-webhooks")).expect("the webhooks Secret");
    let text = secret["stringData"]["webhooks.yaml"]
        .as_str()
        .expect("webhooks.yaml");
    assert_eq!(Config::parse(text, "the Secret").expect("loads"), expected);
    let deployment = kind("Deployment", &format!("{RELEASE}-controller")).expect("controller");
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    assert!(
        container["args"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(
                "--webhooks-file=/etc/forewarn-webhooks/webhooks.yaml"
            )),
        "{container}"
    );
    assert!(
        container["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!({"name": "webhooks", "mountPath": "/etc/forewarn-webhooks", "readOnly": true})),
        "{container}"
    );
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    assert!(
        volumes.contains(&serde_json::json!({"name": "webhooks", "secret": {"secretName": format!("{RELEASE}-webhooks")}})),
        "{volumes:?}"
    );
    assert!(pod["metadata"]["annotations"]["checksum/webhooks"].is_string());
    let egress = kind("NetworkPolicy", &format!("{RELEASE}-controller")).expect("NetworkPolicy")
        ["spec"]["egress"]
        .clone();
    let ports: Vec<Value> = egress
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| e["ports"].as_array().cloned().unwrap_or_default())
        .collect();
    for p in [
        serde_json::json!({"port": 443, "protocol": "TCP"}),
        serde_json::json!({"port": 53, "protocol": "UDP"}),
        serde_json::json!({"port": 53, "protocol": "TCP"}),
    ] {
        assert!(ports.contains(&p), "{p} not in {egress}");
    }

    // The operator's own Secret.
    let docs = documents(&render(&[
        "--set",
        "controller.webhooks.existingSecret=oncall-hooks",
    ]));
    assert!(
        !docs.iter().any(|d| d["kind"] == "Secret"),
        "the chart made a Secret of its own"
    );
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("controller");
    let pod = &deployment["spec"]["template"];
    assert!(
        pod["spec"]["volumes"].as_array().unwrap().contains(
            &serde_json::json!({"name": "webhooks", "secret": {"secretName": "oncall-hooks"}})
        ),
        "{pod}"
    );
    assert!(pod["metadata"]["annotations"]["checksum/webhooks"].is_null());

    // None.
    let plain = render(&[]);
    assert!(!plain.contains("webhooks"), "{plain}");
}

/// Values.schema.json types `controller.webhooks.config` as the controller
/// reads the file: an unknown format or key fails `helm template`.
#[test]
fn a_misspelt_webhook_fails_the_install() {
    let chart = chart_dir();
    for (set, expected) in [
        (
            "controller.webhooks.config.webhooks[0].name=a,controller.webhooks.config.webhooks[0].url=https://x,controller.webhooks.config.webhooks[0].format=Discord",
            "format",
        ),
        (
            "controller.webhooks.config.webhooks[0].name=a,controller.webhooks.config.webhooks[0].url=https://x,controller.webhooks.config.webhooks[0].retries=3",
            "retries",
        ),
        ("controller.webhooks.existingSecrets=x", "existingSecrets"),
    ] {
        let out = helm(&[
            "template",
            RELEASE,
            &chart,
            "--namespace",
            NS,
            "--api-versions",
            VAP_API,
            "--set",
            set,
        ]);
        assert!(!out.ok, "{set} was accepted");
        assert!(out.stderr.contains(expected), "{set}: {}", out.stderr);
    }
}
