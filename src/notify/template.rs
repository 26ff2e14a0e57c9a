//! A webhook's body as a template: MiniJinja (Jinja2's syntax) over the
//! fields of [`Message::context`]. The built-in formats are templates
//! shipped in the binary (`src/notify/templates/*.j2`: [`JSON`], [`SLACK`],
//! [`TEAMS`]); a webhook's own `template` is checked when the webhooks file
//! is loaded ([`BodyTemplate::compile`], then [`BodyTemplate::check`]), so
//! that a bad one is refused there, with its line and column, and not at
//! the first event.
//!
//! An absent field is undefined (MiniJinja's `SemiStrict`): `{% if event %}`
//! is false, but printing it, or a filter of it, is an error. Filters:
//! MiniJinja's built-in ones, `tojson` (JSON, every string escaped) and
//! `slack` (Slack mrkdwn's escapes of `&`, `<`, `>`).

use std::sync::{Arc, LazyLock};

use chrono::{DateTime, Utc};
use minijinja::{Environment, UndefinedBehavior};

use crate::notify::message::{Blocker, EventFacts, Message, NAMED, Notification};

/// forewarn's own JSON document (`format: JSON`).
pub const JSON: &str = include_str!("templates/json.j2");
/// A Slack incoming webhook's `{"text": …}` (`format: Slack`).
pub const SLACK: &str = include_str!("templates/slack.j2");
/// A Microsoft Teams message with one Adaptive Card (`format: Teams`).
pub const TEAMS: &str = include_str!("templates/teams.j2");

/// The name a template is known by in its environment (no extension: no
/// HTML auto-escaping).
const NAME: &str = "body";

/// A body template that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template does not parse.
    #[error("template line {line}, column {column}: {message}")]
    Syntax {
        /// 1-based line in the template's text.
        line: usize,
        /// 1-based column (in characters) in that line.
        column: usize,
        /// MiniJinja's reason.
        message: String,
    },
    /// Rendering failed (an absent field printed, an unknown filter, a
    /// filter's error): the
    /// notification it was rendering, and where in the template.
    #[error("template line {line}: rendering a {notification} message: {message}")]
    Render {
        /// The notification rendered.
        notification: &'static str,
        /// 1-based line in the template (0: unknown).
        line: usize,
        /// MiniJinja's reason.
        message: String,
    },
    /// The content type is JSON but the body rendered is not JSON.
    #[error(
        "rendering a {notification} message gave no JSON ({message}); print each field with |tojson"
    )]
    NotJson {
        /// The notification rendered.
        notification: &'static str,
        /// serde_json's reason, with the body's line and column.
        message: String,
    },
}

/// A compiled body template; cheap to share.
#[derive(Debug)]
pub struct BodyTemplate {
    env: Environment<'static>,
}

static BUILT_IN: LazyLock<[Arc<BodyTemplate>; 3]> = LazyLock::new(|| {
    [JSON, SLACK, TEAMS].map(|t| {
        Arc::new(BodyTemplate::compile(t).expect("the shipped templates compile (unit-tested)"))
    })
});

/// The built-in templates compiled: `[JSON, Slack, Teams]`.
pub fn built_in() -> &'static [Arc<BodyTemplate>; 3] {
    &BUILT_IN
}

/// Whether `content_type` (a `Content-Type` value) says JSON:
/// `application/json` or a `+json` type (RFC 6839), parameters aside.
pub fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

impl BodyTemplate {
    /// Parses `source`.
    ///
    /// # Errors
    /// [`TemplateError::Syntax`] with the line and column.
    pub fn compile(source: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.add_filter("slack", slack_escape);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| {
                let (line, column) = position(source, &e);
                TemplateError::Syntax {
                    line,
                    column,
                    message: reason(&e),
                }
            })?;
        Ok(BodyTemplate { env })
    }

    /// The body of `message` for the webhooks file's `cluster`.
    ///
    /// # Errors
    /// [`TemplateError::Render`].
    pub fn render(
        &self,
        message: &Message,
        cluster: Option<&str>,
    ) -> Result<String, TemplateError> {
        let failed = |e: minijinja::Error| TemplateError::Render {
            notification: message.notification.as_str(),
            line: e.line().unwrap_or(0),
            message: reason(&e),
        };
        let template = self.env.get_template(NAME).map_err(failed)?;
        let context = minijinja::Value::from(minijinja::value::Serde(message.context(cluster)));
        template.render(context).map_err(failed)
    }

    /// Renders a sample of each of `notifications` (with and without its
    /// optional fields, strings with quotes, backslashes and newlines) for
    /// `cluster`; with `json`, each body must parse as JSON.
    ///
    /// # Errors
    /// [`TemplateError::Render`] or [`TemplateError::NotJson`] for the
    /// first sample that fails.
    pub fn check(
        &self,
        notifications: &[Notification],
        cluster: Option<&str>,
        json: bool,
    ) -> Result<(), TemplateError> {
        for m in samples(notifications) {
            let body = self.render(&m, cluster)?;
            if json && let Err(e) = serde_json::from_str::<serde_json::Value>(&body) {
                return Err(TemplateError::NotJson {
                    notification: m.notification.as_str(),
                    message: e.to_string(),
                });
            }
        }
        Ok(())
    }
}

/// MiniJinja's reason, without the position it adds in its `Display`.
fn reason(e: &minijinja::Error) -> String {
    match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    }
}

/// The 1-based line and column (in characters) of `e` in `source`: from the
/// error's byte range when it has one, else its line and column 1.
fn position(source: &str, e: &minijinja::Error) -> (usize, usize) {
    match e.range() {
        Some(r) if r.start <= source.len() && source.is_char_boundary(r.start) => {
            let before = &source[..r.start];
            let line = before.matches('\n').count() + 1;
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            (line, source[line_start..r.start].chars().count() + 1)
        }
        _ => (e.line().unwrap_or(1), 1),
    }
}

/// Slack's mrkdwn escapes: `&`, `<` and `>` (Slack's "Formatting text").
fn slack_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Messages a template is tried on at load: for each notification, one
/// with every optional field (an event with `NotBefore` and a phase, more
/// nodes than are named, a blocker with a reason, a dry run) and one with
/// none of them (`UnexpectedRestart`: no event; the others: an event
/// without `NotBefore` or phase); the strings hold quotes, a backslash, a
/// newline and `<&>`.
fn samples(notifications: &[Notification]) -> Vec<Message> {
    let time = DateTime::parse_from_rfc3339("2026-11-26T10:00:00.5Z")
        .expect("a time")
        .with_timezone(&Utc);
    let full_event = EventFacts {
        name: "5d0e7a11".into(),
        event_id: "5D0E7A11".into(),
        event_type: "Reboot".into(),
        source: "Platform".into(),
        status: "Scheduled".into(),
        not_before: Some(time + chrono::Duration::minutes(15)),
        duration_seconds: -1,
        resources: vec!["vmss_1".into()],
        phase: Some("Draining".into()),
    };
    let bare_event = EventFacts {
        not_before: None,
        phase: None,
        status: "Started".into(),
        ..full_event.clone()
    };
    let mut out = Vec::new();
    for &n in notifications {
        let restart = n == Notification::UnexpectedRestart;
        let full = Message {
            notification: n,
            time,
            summary: "node-1 \"a\\b\"\n<PodDisruptionBudget> shop/web & co".into(),
            event: Some(full_event.clone()),
            nodes: (0..NAMED + 2).map(|i| format!("node-{i}")).collect(),
            blockers: vec![Blocker {
                node: "node-1".into(),
                pod_disruption_budgets: vec!["shop/web".into()],
                pods: vec!["shop/web-1".into()],
                reason: Some("needs \"2\" healthy pods".into()),
            }],
            boot_id: restart.then(|| ("old".to_string(), "new".to_string())),
            dry_run: true,
        };
        let bare = Message {
            summary: "plain".into(),
            event: (!restart).then(|| bare_event.clone()),
            nodes: vec!["node-1".into()],
            blockers: Vec::new(),
            dry_run: false,
            ..full.clone()
        };
        out.push(full);
        out.push(bare);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The bodies as forewarn built them in code before they were
    /// templates: each shipped template must render the same document.
    mod before {
        use super::*;
        use crate::notify::message::listed;

        pub fn json(m: &Message, cluster: Option<&str>) -> Value {
            let mut doc = json!({
                "apiVersion": "forewarn.dev/v1",
                "kind": "Notification",
                "notification": m.notification.as_str(),
                "time": m.time,
                "dryRun": m.dry_run,
                "summary": m.summary,
                "nodes": m.nodes.iter().take(NAMED).collect::<Vec<_>>(),
                "nodesOmitted": m.nodes.len().saturating_sub(NAMED),
            });
            let o = doc.as_object_mut().unwrap();
            if let Some(c) = cluster {
                o.insert("cluster".into(), c.into());
            }
            if let Some(e) = &m.event {
                o.insert("event".into(), json!(e));
            }
            if !m.blockers.is_empty() {
                o.insert(
                    "blockers".into(),
                    json!(m.blockers.iter().take(NAMED).collect::<Vec<_>>()),
                );
            }
            if let Some((old, new)) = &m.boot_id {
                o.insert("bootId".into(), json!({"old": old, "new": new}));
            }
            doc
        }

        fn title(m: &Message, cluster: Option<&str>) -> String {
            let mut t = String::from("forewarn");
            if let Some(c) = cluster {
                t.push_str(&format!(" [{c}]"));
            }
            if m.dry_run {
                t.push_str(" (dry run)");
            }
            t.push_str(": ");
            t.push_str(m.notification.title());
            if let Some(e) = &m.event {
                t.push_str(&format!(": {} {}", e.event_type, e.event_id));
            }
            t
        }

        fn facts(m: &Message) -> Vec<(String, String)> {
            let mut f = Vec::new();
            if let Some(e) = &m.event {
                f.push(("EventId".into(), e.event_id.clone()));
                f.push(("Type".into(), format!("{} ({})", e.event_type, e.source)));
                if let Some(nb) = e.not_before {
                    f.push(("NotBefore".into(), nb.to_rfc3339()));
                }
                if let Some(p) = &e.phase {
                    f.push(("Phase".into(), p.clone()));
                }
            }
            if !m.nodes.is_empty() {
                f.push(("Nodes".into(), listed(&m.nodes)));
            }
            for b in m.blockers.iter().take(NAMED) {
                f.push((
                    format!("Blocked on {}", b.node),
                    format!(
                        "PodDisruptionBudget {}; pods {}",
                        b.pod_disruption_budgets.join(", "),
                        b.pods.join(", ")
                    ),
                ));
            }
            if let Some((old, new)) = &m.boot_id {
                f.push(("bootID".into(), format!("{old} -> {new}")));
            }
            f
        }

        fn slack_escape(s: &str) -> String {
            s.replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
        }

        pub fn slack(m: &Message, cluster: Option<&str>) -> Value {
            let mut text = format!(
                "*{}*\n{}",
                slack_escape(&title(m, cluster)),
                slack_escape(&m.summary)
            );
            for (k, v) in facts(m) {
                text.push_str(&format!("\n• *{}*: {}", slack_escape(&k), slack_escape(&v)));
            }
            json!({ "text": text })
        }

        pub fn teams(m: &Message, cluster: Option<&str>) -> Value {
            let facts: Vec<Value> = facts(m)
                .into_iter()
                .map(|(k, v)| json!({"title": k, "value": v}))
                .collect();
            json!({
                "type": "message",
                "attachments": [{
                    "contentType": "application/vnd.microsoft.card.adaptive",
                    "contentUrl": null,
                    "content": {
                        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                        "type": "AdaptiveCard",
                        "version": "1.4",
                        "body": [
                            {"type": "TextBlock", "size": "Medium", "weight": "Bolder",
                             "text": title(m, cluster), "wrap": true},
                            {"type": "TextBlock", "text": m.summary, "wrap": true},
                            {"type": "FactSet", "facts": facts},
                        ],
                    },
                }],
            })
        }
    }

    /// A body as the code built it.
    type Before = fn(&Message, Option<&str>) -> Value;

    /// The shipped templates, each with the code it replaced.
    fn shipped() -> [(&'static str, &'static BodyTemplate, Before); 3] {
        let [j, s, t] = built_in();
        [
            ("JSON", j, before::json),
            ("Slack", s, before::slack),
            ("Teams", t, before::teams),
        ]
    }

    /// Renders `m` with `t`; the body must be JSON.
    fn rendered(t: &BodyTemplate, m: &Message, cluster: Option<&str>) -> Value {
        let text = t.render(m, cluster).unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }

    #[test]
    fn the_shipped_templates_render_what_the_code_did() {
        for cluster in [None, Some("prod \"west\" <1> & \\2")] {
            for m in samples(&Notification::ALL) {
                for (name, t, old) in shipped() {
                    assert_eq!(rendered(t, &m, cluster), old(&m, cluster), "{name}: {m:?}");
                }
            }
        }
    }

    /// The exact Slack text of one message, and the JSON document's fields
    /// left out, not null, when they do not apply.
    #[test]
    fn the_slack_text_and_the_json_document_are_exact() {
        let [json, slack, _] = built_in();
        let m = samples(&[Notification::DrainBlocked]).remove(0);
        let text = rendered(slack, &m, Some("prod"))["text"].clone();
        let nodes: Vec<String> = (0..NAMED).map(|i| format!("node-{i}")).collect();
        assert_eq!(
            text,
            format!(
                "*forewarn [prod] (dry run): drain blocked: Reboot 5D0E7A11*\n\
                 node-1 \"a\\b\"\n&lt;PodDisruptionBudget&gt; shop/web &amp; co\n\
                 • *EventId*: 5D0E7A11\n\
                 • *Type*: Reboot (Platform)\n\
                 • *NotBefore*: 2026-11-26T10:15:00.500+00:00\n\
                 • *Phase*: Draining\n\
                 • *Nodes*: {} and 2 more\n\
                 • *Blocked on node-1*: PodDisruptionBudget shop/web; pods shop/web-1",
                nodes.join(", ")
            )
        );
        let restart = samples(&[Notification::UnexpectedRestart]).remove(1);
        let doc = rendered(json, &restart, None);
        for absent in ["cluster", "event", "blockers"] {
            assert!(doc.get(absent).is_none(), "{absent}: {doc}");
        }
        assert_eq!(doc["bootId"], json!({"old": "old", "new": "new"}));
        assert_eq!(doc["time"], "2026-11-26T10:00:00.500Z");
    }

    proptest::proptest! {
        /// Whatever the strings hold (quotes, backslashes, control
        /// characters, any Unicode), every shipped template renders valid
        /// JSON equal to the code's.
        #[test]
        fn any_strings_render_valid_json(
            summary in ".*",
            node in "\\PC*",
            cluster in proptest::option::of(".*"),
            reason in ".*",
        ) {
            let mut m = samples(&[Notification::DrainBlocked]).remove(0);
            m.summary = summary;
            m.nodes[0] = node.clone();
            m.blockers[0].node = node;
            m.blockers[0].reason = Some(reason);
            for (name, t, old) in shipped() {
                let text = t.render(&m, cluster.as_deref()).unwrap();
                let got: Value = serde_json::from_str(&text)
                    .map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{name}: {e}: {text}")))?;
                proptest::prop_assert_eq!(got, old(&m, cluster.as_deref()), "{}", name);
            }
        }
    }

    #[test]
    fn a_syntax_error_gives_its_line_and_column() {
        let e = BodyTemplate::compile("{\"a\": 1,\n \"b\": {{ summary | tojson }\n}").unwrap_err();
        let TemplateError::Syntax { line, column, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!((*line, *column), (2, 27), "{e}");
        assert!(
            e.to_string()
                .starts_with("template line 2, column 27: syntax error"),
            "{e}"
        );
        // An unknown filter is found when rendering: by the check at load.
        let e = BodyTemplate::compile("\n{{ summary|nosuchfilter }}")
            .unwrap()
            .check(&Notification::ALL, None, false)
            .unwrap_err();
        assert!(
            matches!(e, TemplateError::Render { line: 2, .. })
                && e.to_string().contains("unknown filter"),
            "{e}"
        );
    }

    #[test]
    fn a_template_that_prints_an_absent_field_or_makes_no_json_fails_its_check() {
        let all = Notification::ALL;
        // `event` is absent from an UnexpectedRestart outside any event.
        let t = BodyTemplate::compile("{\"id\": {{ event.eventId|tojson }}}").unwrap();
        let e = t.check(&all, None, true).unwrap_err();
        assert!(
            matches!(
                e,
                TemplateError::Render {
                    notification: "UnexpectedRestart",
                    line: 1,
                    ..
                }
            ),
            "{e:?}"
        );
        // ... which a webhook that does not get it need not test.
        t.check(
            &[Notification::DrainBlocked, Notification::Completed],
            None,
            true,
        )
        .unwrap();
        let t =
            BodyTemplate::compile("{\"id\": {{ (event.eventId if event else \"none\")|tojson }}}")
                .unwrap();
        t.check(&all, None, true).unwrap();
        // A summary printed without tojson: its quotes break the JSON.
        let t = BodyTemplate::compile("{\"summary\": \"{{ summary }}\"}").unwrap();
        let e = t.check(&all, None, true).unwrap_err();
        assert!(matches!(e, TemplateError::NotJson { .. }), "{e:?}");
        assert!(e.to_string().contains("|tojson"), "{e}");
        // The same as text/plain is fine.
        t.check(&all, None, false).unwrap();
        // The cluster printed where the file names none.
        let t = BodyTemplate::compile("{{ cluster }}").unwrap();
        assert!(t.check(&all, None, false).is_err());
        t.check(&all, Some("prod"), false).unwrap();
    }

    #[test]
    fn json_content_types() {
        for ct in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.api+json",
        ] {
            assert!(is_json(ct), "{ct}");
        }
        for ct in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "text/json+x",
        ] {
            assert!(!is_json(ct), "{ct}");
        }
    }
}
