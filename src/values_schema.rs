//! The chart's `values.schema.json` where the controller reads it: the
//! `controller.policy` part, generated from [`Policy`], and the
//! `controller.webhooks.config` part, from the webhooks file's [`Config`], so that Helm accepts
//! exactly the keys, values and ranges the controller accepts and refuses a
//! misspelt key. `forewarn values-schema` prints it, or splices it into the
//! chart's file (`make generate`); a unit test fails when the file drifts.
//!
//! Helm resolves no remote `$ref`, so every definition is inline. Checks
//! that span two keys (`drainLeadTimeSeconds >= drainMarginSeconds`, a
//! rule's minimum not above its maximum) and the 10-year bound of
//! `retention` are the controller's alone.

use std::ops::Range;

use serde_json::{Map, Value};

use crate::notify::config::Config;
use crate::policy::Policy;

/// Where the policy sits in `values.schema.json`.
pub const VALUES_PATH: [&str; 4] = ["properties", "controller", "properties", "policy"];

/// Where the webhooks file ([`Config`]) sits
/// in `values.schema.json` (`controller.webhooks.config`).
pub const WEBHOOKS_PATH: [&str; 6] = [
    "properties",
    "controller",
    "properties",
    "webhooks",
    "properties",
    "config",
];

/// A `values.schema.json` the policy's schema cannot be spliced into.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is not JSON.
    #[error("failed to parse values.schema.json: {0}")]
    Parse(#[from] serde_json::Error),
    /// The file has no `controller.policy` to replace.
    #[error("values.schema.json has no properties.controller.properties.policy to replace")]
    NoPolicy,
    /// The file has no `controller.webhooks.config` to replace.
    #[error(
        "values.schema.json has no properties.controller.properties.webhooks.properties.config to replace"
    )]
    NoWebhooks,
}

/// The policy's JSON schema (draft-07, every definition inline), as it
/// stands under `controller.policy` in the chart's `values.schema.json`.
pub fn policy_schema() -> Value {
    schema_of::<Policy>()
}

/// The webhooks file's JSON schema, as it stands under
/// `controller.webhooks.config` in the chart's `values.schema.json`.
pub fn webhooks_schema() -> Value {
    schema_of::<Config>()
}

fn schema_of<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft07()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    if let Value::Object(m) = &mut schema {
        m.remove("title");
    }
    tidy(&mut schema);
    schema
}

/// Makes the generated schema read well in Helm's messages and in an
/// editor: a string enum whose variants carry docs (a `oneOf` of `const`s)
/// becomes an `enum`, its variants' docs appended to the description; the
/// `int64`/`uint64` formats (no meaning in JSON schema) and `null`
/// defaults go; descriptions
/// are unwrapped (a single newline is a space, as in Markdown).
fn tidy(v: &mut Value) {
    match v {
        Value::Object(m) => {
            one_of_consts_to_enum(m);
            if m.get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| matches!(f, "int64" | "uint64"))
            {
                m.remove("format");
            }
            // `Option`s default to null: absent is the documented meaning.
            if m.get("default") == Some(&Value::Null) {
                m.remove("default");
            }
            if let Some(Value::String(d)) = m.get_mut("description") {
                *d = unwrap(d);
            }
            m.values_mut().for_each(tidy);
        }
        Value::Array(a) => a.iter_mut().for_each(tidy),
        _ => {}
    }
}

fn one_of_consts_to_enum(m: &mut Map<String, Value>) {
    let Some(Value::Array(variants)) = m.get("oneOf") else {
        return;
    };
    let consts: Option<Vec<(Value, Option<String>)>> = variants
        .iter()
        .map(|x| {
            let c = x.get("const").filter(|c| c.is_string())?.clone();
            let doc = x.get("description").and_then(Value::as_str).map(unwrap);
            Some((c, doc))
        })
        .collect();
    let Some(consts) = consts else { return };
    m.remove("oneOf");
    let docs: Vec<String> = consts
        .iter()
        .filter_map(|(c, d)| Some(format!("`{}`: {}", c.as_str()?, d.as_deref()?)))
        .collect();
    m.insert("type".into(), "string".into());
    m.insert(
        "enum".into(),
        consts
            .into_iter()
            .map(|(c, _)| c)
            .collect::<Vec<_>>()
            .into(),
    );
    if !docs.is_empty() {
        let mut d = m
            .get("description")
            .and_then(Value::as_str)
            .map(|d| format!("{d} "))
            .unwrap_or_default();
        d.push_str(&docs.join(" "));
        m.insert("description".into(), d.into());
    }
}

/// Joins the lines of each paragraph with a space; paragraphs stay apart.
fn unwrap(text: &str) -> String {
    text.split("\n\n")
        .map(|p| p.lines().map(str::trim).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// `values_schema` (the chart's `values.schema.json`) with its
/// `controller.policy` replaced by [`policy_schema`], indented to fit; the
/// rest of the file is kept byte for byte.
///
/// # Errors
/// [`Error::Parse`] when `values_schema` is not JSON, [`Error::NoPolicy`]
/// when it has no `controller.policy`.
pub fn splice(values_schema: &str) -> Result<String, Error> {
    let with_policy = splice_at(
        values_schema,
        &VALUES_PATH,
        &policy_schema(),
        Error::NoPolicy,
    )?;
    splice_at(
        &with_policy,
        &WEBHOOKS_PATH,
        &webhooks_schema(),
        Error::NoWebhooks,
    )
}

/// `values_schema` with the value at `path` replaced by `schema`, indented
/// to fit; `missing` when there is none.
fn splice_at(
    values_schema: &str,
    path: &[&str],
    schema: &Value,
    missing: Error,
) -> Result<String, Error> {
    serde_json::from_str::<Value>(values_schema)?;
    let span = value_span(values_schema, path).ok_or(missing)?;
    let line_start = values_schema[..span.start].rfind('\n').map_or(0, |i| i + 1);
    let indent: String = values_schema[line_start..span.start]
        .chars()
        .take_while(|c| *c == ' ')
        .collect();
    let generated = serde_json::to_string_pretty(schema)?.replace('\n', &format!("\n{indent}"));
    Ok(format!(
        "{}{generated}{}",
        &values_schema[..span.start],
        &values_schema[span.end..]
    ))
}

/// The byte range of the value at `path` (object keys) in the JSON `text`,
/// which must be valid JSON.
fn value_span(text: &str, path: &[&str]) -> Option<Range<usize>> {
    let mut pos = 0;
    find(text.as_bytes(), &mut pos, path)
}

fn find(b: &[u8], pos: &mut usize, path: &[&str]) -> Option<Range<usize>> {
    skip_ws(b, pos);
    let start = *pos;
    let Some((key, rest)) = path.split_first() else {
        skip_value(b, pos)?;
        return Some(start..*pos);
    };
    if b.get(*pos) != Some(&b'{') {
        return None;
    }
    *pos += 1;
    loop {
        skip_ws(b, pos);
        if b.get(*pos) != Some(&b'"') {
            return None;
        }
        let k = skip_string(b, pos)?;
        skip_ws(b, pos);
        if b.get(*pos) != Some(&b':') {
            return None;
        }
        *pos += 1;
        // Keys on the path are plain ASCII: compare them as written.
        if &b[k.start + 1..k.end - 1] == key.as_bytes() {
            return find(b, pos, rest);
        }
        skip_ws(b, pos);
        skip_value(b, pos)?;
        skip_ws(b, pos);
        match b.get(*pos) {
            Some(b',') => *pos += 1,
            _ => return None,
        }
    }
}

fn skip_ws(b: &[u8], pos: &mut usize) {
    while b.get(*pos).is_some_and(u8::is_ascii_whitespace) {
        *pos += 1;
    }
}

/// Skips the string starting at `pos` (a `"`); its span, quotes included.
fn skip_string(b: &[u8], pos: &mut usize) -> Option<Range<usize>> {
    let start = *pos;
    *pos += 1;
    loop {
        match b.get(*pos)? {
            b'\\' => *pos += 2,
            b'"' => {
                *pos += 1;
                return Some(start..*pos);
            }
            _ => *pos += 1,
        }
    }
}

fn skip_value(b: &[u8], pos: &mut usize) -> Option<()> {
    match b.get(*pos)? {
        b'"' => {
            skip_string(b, pos)?;
        }
        b'{' | b'[' => {
            let mut depth = 0usize;
            loop {
                match b.get(*pos)? {
                    b'"' => {
                        skip_string(b, pos)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            *pos += 1;
                            return Some(());
                        }
                    }
                    _ => {}
                }
                *pos += 1;
            }
        }
        _ => {
            while b
                .get(*pos)
                .is_some_and(|c| !matches!(c, b',' | b'}' | b']') && !c.is_ascii_whitespace())
            {
                *pos += 1;
            }
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHART_SCHEMA: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/forewarn/values.schema.json"
    );

    fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
        path.iter().fold(v, |v, k| &v[k])
    }

    #[test]
    fn chart_values_schema_holds_the_generated_policy_schema() {
        let text = std::fs::read_to_string(CHART_SCHEMA).expect("values.schema.json");
        let file: Value = serde_json::from_str(&text).expect("values.schema.json is JSON");
        assert!(
            at(&file, &VALUES_PATH) == &policy_schema(),
            "controller.policy in charts/forewarn/values.schema.json is not the schema of \
             forewarn::policy::Policy: run `make generate`"
        );
        assert!(
            splice(&text).expect("splice") == text,
            "charts/forewarn/values.schema.json is not as `make generate` writes it"
        );
    }

    #[test]
    fn policy_schema_takes_every_key_and_refuses_others() {
        let s = policy_schema();
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(
            s["properties"]["rules"]["items"]["additionalProperties"],
            false
        );
        assert_eq!(
            s["properties"]["rules"]["items"]["required"],
            serde_json::json!(["action"])
        );
        let default = serde_json::to_value(Policy::default()).expect("policy serializes");
        let keys: Vec<&String> = default.as_object().expect("an object").keys().collect();
        let props: Vec<&String> = s["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .collect();
        assert_eq!(keys, props, "keys of the policy file != keys of the schema");
        for (key, p) in s["properties"].as_object().expect("properties") {
            let d = p["description"].as_str().unwrap_or_default();
            assert!(d.len() > 40, "{key}: no real description: {d:?}");
        }
        let rule = s["properties"]["rules"]["items"]["properties"]
            .as_object()
            .expect("rule");
        for (key, p) in rule {
            let d = p["description"].as_str().unwrap_or_default();
            assert!(d.len() > 20, "rules[].{key}: no real description: {d:?}");
        }
        let text = s.to_string();
        assert!(
            !text.contains("$ref") && !text.contains("definitions"),
            "{text}"
        );
    }

    #[test]
    fn policy_schema_has_the_bounds_and_enums_the_controller_checks() {
        let s = policy_schema();
        let p = &s["properties"];
        let actions =
            serde_json::json!(["Ignore", "Approve", "Cordon", "Drain", "DrainAndApprove"]);
        assert_eq!(p["defaultAction"]["enum"], actions);
        assert_eq!(p["rules"]["items"]["properties"]["action"]["enum"], actions);
        assert!(
            p["defaultAction"]["description"]
                .as_str()
                .is_some_and(|d| d.contains("`Drain`: Cordon and drain")),
            "{}",
            p["defaultAction"]
        );
        assert_eq!(p["minGraceSeconds"]["minimum"], 1);
        assert_eq!(p["releaseDelaySeconds"]["maximum"], 3600);
        assert_eq!(p["drainMarginSeconds"]["maximum"], 604_800);
        for key in [
            "drainLeadTimeSeconds",
            "orphanedAfterSeconds",
            "staleAfterSeconds",
        ] {
            assert_eq!(p[key]["maximum"], 2_419_200, "{key}");
            assert_eq!(p[key]["minimum"], 0, "{key}");
        }
        assert_eq!(p["retention"]["pattern"], crate::policy::DURATION_PATTERN);
        assert_eq!(p["retention"]["default"], "24h");
        // Each bound is the controller's: one past it is refused on load.
        for (yaml, complaint) in [
            ("minGraceSeconds: 0", "minGraceSeconds"),
            ("releaseDelaySeconds: 3601", "releaseDelaySeconds"),
            (
                "drainMarginSeconds: 604801\ndrainLeadTimeSeconds: 2419200",
                "drainMarginSeconds",
            ),
            ("drainLeadTimeSeconds: 2419201", "drainLeadTimeSeconds"),
            ("orphanedAfterSeconds: 2419201", "orphanedAfterSeconds"),
            ("staleAfterSeconds: 2419201", "staleAfterSeconds"),
        ] {
            let e = Policy::parse(yaml, "p").expect_err(yaml);
            assert!(e.to_string().contains(complaint), "{yaml}: {e}");
        }
        for yaml in [
            "minGraceSeconds: 1",
            "releaseDelaySeconds: 3600",
            "drainMarginSeconds: 604800\ndrainLeadTimeSeconds: 604800",
            "drainLeadTimeSeconds: 2419200",
            "orphanedAfterSeconds: 2419200",
            "staleAfterSeconds: 2419200",
        ] {
            Policy::parse(yaml, "p").unwrap_or_else(|e| panic!("{yaml}: {e}"));
        }
    }

    #[test]
    fn splice_replaces_the_policy_and_keeps_the_rest_as_written() {
        let text = "{\n  \"a\": [1, {\"b\": \"}\\\"\"}],\n  \"properties\": {\n    \"controller\": {\n      \"properties\": {\n        \"x\": true,\n        \"webhooks\": {\"properties\": {\"config\": {}}},\n        \"policy\": {\"type\": \"object\"},\n        \"y\": 1\n      }\n    }\n  }\n}\n";
        let out = splice(text).expect("splice");
        let v: Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(at(&v, &VALUES_PATH), &policy_schema());
        assert_eq!(at(&v, &WEBHOOKS_PATH), &webhooks_schema());
        assert!(
            out.starts_with("{\n  \"a\": [1, {\"b\": \"}\\\"\"}],\n"),
            "{out}"
        );
        assert!(
            out.ends_with("\n        },\n        \"y\": 1\n      }\n    }\n  }\n}\n"),
            "{out}"
        );
        assert_eq!(
            splice(&out).expect("again"),
            out,
            "splicing twice changes nothing"
        );
        assert!(matches!(
            splice("{\"properties\": {}}"),
            Err(Error::NoPolicy)
        ));
        assert!(matches!(
            splice("{\"properties\": {\"controller\": {\"properties\": {\"policy\": {}}}}}"),
            Err(Error::NoWebhooks)
        ));
        assert!(matches!(splice("{"), Err(Error::Parse(_))));
    }
}
