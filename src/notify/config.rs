//! The webhooks file (`--webhooks-file`): which endpoints get which
//! notifications, in which body format or template
//! ([`crate::notify::template`]), with which headers, timeout,
//! attempts and trusted roots ([`Config`]); parsed and checked whole, a bad
//! file refused with the webhook and the reason. Its schema is generated
//! into the chart's values schema.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::notify::message::Notification;
use crate::notify::template::{self, BodyTemplate, TemplateError};

/// At most this many webhooks.
pub const MAX_WEBHOOKS: usize = 16;
/// The body's `Content-Type` unless the webhook gives one.
pub const DEFAULT_CONTENT_TYPE: &str = "application/json";

impl Webhook {
    /// The body's `Content-Type`: `contentType`, else a `Content-Type` of
    /// `headers`, else [`DEFAULT_CONTENT_TYPE`].
    pub fn content_type(&self) -> &str {
        self.content_type
            .as_deref()
            .or_else(|| {
                self.headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                    .map(|(_, v)| v.as_str())
            })
            .unwrap_or(DEFAULT_CONTENT_TYPE)
    }

    /// The notifications this webhook gets.
    pub fn wanted(&self) -> Vec<Notification> {
        self.notifications
            .clone()
            .unwrap_or_else(|| Notification::ALL.to_vec())
    }

    /// Its body template: its own `template` compiled, or its format's
    /// shipped one.
    ///
    /// # Errors
    /// [`TemplateError::Syntax`] when `template` does not parse.
    pub fn body_template(&self) -> Result<Arc<BodyTemplate>, TemplateError> {
        let [json, slack, teams] = template::built_in();
        Ok(match (&self.template, self.format.unwrap_or_default()) {
            (Some(source), _) => Arc::new(BodyTemplate::compile(source)?),
            (None, Format::Json) => json.clone(),
            (None, Format::Slack) => slack.clone(),
            (None, Format::Teams) => teams.clone(),
        })
    }
}
/// The body a webhook receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum Format {
    /// forewarn's own JSON document (docs/events.md, "Webhooks").
    #[default]
    #[serde(rename = "JSON")]
    Json,
    /// A Slack incoming webhook's `{"text": …}` (mrkdwn).
    Slack,
    /// A Microsoft Teams webhook (a Workflows "post to a channel when a
    /// webhook request is received" flow, or a connector): a message with
    /// one Adaptive Card (version 1.4).
    Teams,
}

/// One webhook of the file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Webhook {
    /// A DNS label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63), unique in
    /// the file: logs and the metric name the webhook by it.
    pub name: String,
    /// `https://` (or `http://`, e.g. a receiver in the cluster) URL the
    /// message is POSTed to. A credential: never logged.
    pub url: String,
    /// The body's built-in format. Default `JSON`; not with `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<Format>,
    /// The body as a MiniJinja (Jinja2) template over the message's fields
    /// (docs/events.md, "Body templates"), instead of a built-in format. Checked at
    /// load: it must parse, render every notification the webhook gets,
    /// and, when `contentType` is JSON, render JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The body's `Content-Type`. Default `application/json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// The notifications this webhook gets. Default: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<Vec<Notification>>,
    /// Extra request headers (e.g. `Authorization`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Seconds one attempt may take, 1 to 60. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60))]
    pub timeout_seconds: Option<u64>,
    /// Attempts per message, 1 to 10. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub max_attempts: Option<u32>,
    /// A PEM file of the only roots trusted for this webhook's TLS (a
    /// private CA). Default: the public roots (Mozilla's, built in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// The webhooks file.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// The cluster's name, given in every message (optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The webhooks, at most 16.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub webhooks: Vec<Webhook>,
}

/// A webhooks file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file cannot be read.
    #[error("cannot read the webhooks file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a webhooks file (YAML error, unknown key, bad type).
    #[error("the webhooks file {path} is invalid: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message.
        message: String,
    },
    /// A webhook's value is out of bounds.
    #[error("the webhooks file {path}: webhook {webhook:?}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// The webhook's name (or its position when it has none).
        webhook: String,
        /// Why.
        reason: String,
    },
}

impl Config {
    /// Reads and validates the file at `path`; gives its text too (what a
    /// [`crate::notify::webhooks::watch`] compares with).
    ///
    /// # Errors
    /// [`Error::Read`], [`Error::Parse`] or [`Error::Invalid`].
    pub fn load_text(path: &str) -> Result<(Config, String), Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.into(),
            source,
        })?;
        Ok((Self::parse(&text, path)?, text))
    }

    /// Parses and validates `text`, read from `path` (named in errors).
    ///
    /// # Errors
    /// [`Error::Parse`] or [`Error::Invalid`].
    pub fn parse(text: &str, path: &str) -> Result<Config, Error> {
        let config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| Error::Parse {
                path: path.into(),
                message: without_urls(&e.to_string()),
            })?
        };
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &str) -> Result<(), Error> {
        let invalid = |webhook: &str, reason: String| Error::Invalid {
            path: path.into(),
            webhook: webhook.into(),
            reason,
        };
        if self.webhooks.len() > MAX_WEBHOOKS {
            return Err(invalid(
                "",
                format!("{} webhooks, at most {MAX_WEBHOOKS}", self.webhooks.len()),
            ));
        }
        let mut names = HashSet::new();
        for (i, w) in self.webhooks.iter().enumerate() {
            let label = if w.name.is_empty() {
                format!("#{}", i + 1)
            } else {
                w.name.clone()
            };
            if !is_dns_label(&w.name) {
                return Err(invalid(
                    &label,
                    "name must be a DNS label: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters"
                        .into(),
                ));
            }
            if !names.insert(w.name.as_str()) {
                return Err(invalid(&label, "name used twice".into()));
            }
            // The URL itself is never shown: it carries the credential.
            let url = reqwest::Url::parse(&w.url)
                .map_err(|e| invalid(&label, format!("url is not a URL ({e})")))?;
            if !matches!(url.scheme(), "https" | "http") || url.host_str().is_none() {
                return Err(invalid(
                    &label,
                    "url must be an https:// (or http://) URL with a host".into(),
                ));
            }
            if w.timeout_seconds.is_some_and(|t| !(1..=60).contains(&t)) {
                return Err(invalid(&label, "timeoutSeconds must be 1 to 60".into()));
            }
            if w.max_attempts.is_some_and(|n| !(1..=10).contains(&n)) {
                return Err(invalid(&label, "maxAttempts must be 1 to 10".into()));
            }
            if w.notifications.as_ref().is_some_and(Vec::is_empty) {
                return Err(invalid(
                    &label,
                    "notifications is empty: leave it out for all, or remove the webhook".into(),
                ));
            }
            for (k, v) in &w.headers {
                if http::HeaderName::from_bytes(k.as_bytes()).is_err() {
                    return Err(invalid(
                        &label,
                        format!("header {k:?} is not a header name"),
                    ));
                }
                if http::HeaderValue::from_str(v).is_err() {
                    return Err(invalid(
                        &label,
                        format!("header {k:?} has a value that cannot be sent"),
                    ));
                }
            }
            if w.template.is_some() && w.format.is_some() {
                return Err(invalid(&label, "give format or template, not both".into()));
            }
            if let Some(ct) = &w.content_type {
                if w.headers
                    .keys()
                    .any(|k| k.eq_ignore_ascii_case("content-type"))
                {
                    return Err(invalid(
                        &label,
                        "contentType and a Content-Type header: give contentType only".into(),
                    ));
                }
                if ct.parse::<http::HeaderValue>().is_err() || !ct.contains('/') {
                    return Err(invalid(
                        &label,
                        format!("contentType {ct:?} is not a media type"),
                    ));
                }
            }
            if w.template.is_some() {
                w.body_template()
                    .and_then(|t| {
                        t.check(
                            &w.wanted(),
                            self.cluster.as_deref(),
                            template::is_json(w.content_type()),
                        )
                    })
                    .map_err(|e| invalid(&label, e.to_string()))?;
            }
            if let Some(ca) = &w.ca_file {
                read_roots(ca).map_err(|reason| invalid(&label, reason))?;
            }
        }
        Ok(())
    }
}

/// The parser's message without what could show a URL (a credential): its
/// first line only (the rest quotes the file), and any `scheme://…` word
/// in it replaced by `<url>`.
fn without_urls(message: &str) -> String {
    message
        .lines()
        .next()
        .unwrap_or_default()
        .split(' ')
        .map(|w| if w.contains("://") { "<url>" } else { w })
        .collect::<Vec<_>>()
        .join(" ")
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub fn read_roots(path: &str) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("caFile {path}: {e}"))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("caFile {path} is not a PEM bundle: {}", e.without_url()))?;
    if certs.is_empty() {
        return Err(format!("caFile {path} holds no certificate"));
    }
    Ok(certs)
}
