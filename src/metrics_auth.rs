//! Who may read `/metrics` (`--metrics-auth kubernetes`): the scraper's
//! bearer token is checked by the API server, as kube-rbac-proxy does.
//!
//! For each request to `/metrics` the token of its `Authorization: Bearer`
//! header is sent in a `TokenReview` (authentication.k8s.io/v1, no
//! audiences: the API server's own), and the user it names (name, groups,
//! uid, extra) in a `SubjectAccessReview` (authorization.k8s.io/v1) of
//! `get` on the non-resource URL `/metrics`. RBAC grants that with a
//! ClusterRole rule `nonResourceURLs: ["/metrics"], verbs: ["get"]` (the
//! chart's `<fullname>-metrics-reader`). Answers ([`Outcome`]): the metrics
//! when allowed; 401 with `WWW-Authenticate: Bearer` when there is no
//! well-formed token or the API server does not authenticate it; 403 when
//! the review denies; 503 when the API server cannot be asked (metrics are
//! never served unverified). `/healthz` and `/readyz` stay open: the
//! kubelet's probes send no token.
//!
//! Verdicts are cached per token ([`VerdictCache`], keyed by the token's
//! SHA-256, [`CACHE_TTL`], at most [`CACHE_ENTRIES`]), so a scrape every
//! 15-30 s costs the API server about one `TokenReview` and one
//! `SubjectAccessReview` a minute per scraper token (two scrapes that miss
//! the cache at once each ask). Failures to ask are not cached.
//!
//! The process asks with its own request client (not the controller's
//! leader-guarded one), so a standby controller answers its scrapes too.
//! It needs `create` on `tokenreviews` and `subjectaccessreviews` (the
//! chart grants both when `metrics.auth.enabled`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use prometheus::{IntCounterVec, Opts};

/// The non-resource URL, and verb, a scraper must be allowed.
pub const METRICS_PATH: &str = "/metrics";

/// How long a verdict on a token is reused: a revoked binding or a deleted
/// ServiceAccount takes effect within this.
pub const CACHE_TTL: Duration = Duration::from_secs(60);

/// Tokens whose verdicts are remembered at once (a few scrapers in
/// practice; the bound keeps a flood of made-up tokens from growing it).
pub const CACHE_ENTRIES: usize = 256;

/// How long both reviews together may take before the scrape is answered
/// 503 (shorter than the chart's 10 s scrape timeout).
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest token accepted, bytes (ServiceAccount JWTs are about 1 KiB).
pub const MAX_TOKEN_BYTES: usize = 8192;

/// What the API server said about a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated, and allowed `get` on `/metrics`.
    Allowed,
    /// Authenticated, but not allowed.
    Denied,
    /// Not authenticated (unknown, expired or revoked token).
    Unauthenticated,
}

/// The answer to one request to `/metrics`.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A verdict on a well-formed token; `cached` when no review was sent.
    Verdict {
        /// The verdict.
        verdict: Verdict,
        /// Whether it came from the cache.
        cached: bool,
    },
    /// No `Authorization` header, or not one well-formed bearer token
    /// ([`bearer_token`]): no review is sent.
    NoToken,
    /// The API server could not be asked (no answer within
    /// [`REVIEW_TIMEOUT`], or an error status); the message is for the log.
    Unavailable(String),
}

impl Outcome {
    /// The `result` label of the outcome counter: `allowed`, `denied`,
    /// `unauthenticated`, `no_token`, `unavailable`.
    pub fn result_label(&self) -> &'static str {
        match self {
            Outcome::Verdict {
                verdict: Verdict::Allowed,
                ..
            } => "allowed",
            Outcome::Verdict {
                verdict: Verdict::Denied,
                ..
            } => "denied",
            Outcome::Verdict {
                verdict: Verdict::Unauthenticated,
                ..
            } => "unauthenticated",
            Outcome::NoToken => "no_token",
            Outcome::Unavailable(_) => "unavailable",
        }
    }
}

/// Why a request carries no usable token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// No `Authorization` header.
    #[error("no Authorization header")]
    Missing,
    /// Several headers, another scheme, an empty or overlong token, or one
    /// with characters outside RFC 6750's `b64token`.
    #[error("the Authorization header is not one bearer token")]
    Malformed,
}

/// The token of the request's one `Authorization: Bearer <token>` header.
/// The scheme is matched case-insensitively (RFC 7235 §2.1), spaces may
/// separate it from the token, and the token is RFC 6750 §2.1's
/// `b64token`: ASCII letters, digits, `-._~+/`, then any `=` padding; at
/// most [`MAX_TOKEN_BYTES`] bytes (ServiceAccount JWTs and bootstrap
/// tokens fit).
///
/// # Errors
/// [`TokenError::Missing`] without the header; [`TokenError::Malformed`]
/// for anything else that is not one such token.
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, TokenError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next().ok_or(TokenError::Missing)?;
    if values.next().is_some() {
        return Err(TokenError::Malformed);
    }
    let value = value.to_str().map_err(|_| TokenError::Malformed)?.trim();
    let (scheme, token) = value.split_once(' ').ok_or(TokenError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(TokenError::Malformed);
    }
    let token = token.trim_start_matches(' ');
    let body = token.trim_end_matches('=');
    let b64 = |c: char| c.is_ascii_alphanumeric() || "-._~+/".contains(c);
    if body.is_empty() || token.len() > MAX_TOKEN_BYTES || !body.chars().all(b64) {
        return Err(TokenError::Malformed);
    }
    Ok(token)
}

/// SHA-256 of a token: the cache keeps this, never the token.
pub fn token_key(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

/// Verdicts by token key ([`token_key`]), each kept for `ttl` from when it
/// was stored, at most `capacity` at once: a new key in a full cache first
/// drops the expired entries, then the oldest one.
#[derive(Debug)]
pub struct VerdictCache {
    ttl: Duration,
    capacity: usize,
    entries: HashMap<[u8; 32], (Verdict, Instant)>,
}

impl VerdictCache {
    /// An empty cache (`capacity` at least 1).
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        VerdictCache {
            ttl,
            capacity: capacity.max(1),
            entries: HashMap::new(),
        }
    }

    /// The verdict stored for `key` less than `ttl` before `now`; an
    /// expired one is dropped.
    pub fn get(&mut self, key: &[u8; 32], now: Instant) -> Option<Verdict> {
        let (verdict, at) = *self.entries.get(key)?;
        if now.saturating_duration_since(at) < self.ttl {
            return Some(verdict);
        }
        self.entries.remove(key);
        None
    }

    /// Stores `verdict` for `key` as of `now`.
    pub fn insert(&mut self, key: [u8; 32], verdict: Verdict, now: Instant) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            let ttl = self.ttl;
            self.entries
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < ttl);
            if self.entries.len() >= self.capacity
                && let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (verdict, now));
    }

    /// Entries held (expired ones included until dropped).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The counter of outcomes, `forewarn_<role>_metrics_auth_total` with the
/// labels `result` ([`Outcome::result_label`]) and `cached` (`true` when
/// the verdict came from the cache, else `false`). Each role registers its
/// own (`role`: `agent` or `controller`).
///
/// # Errors
/// An invalid name (a `role` that is not a metric name part).
pub fn outcome_counter(role: &str) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(
        Opts::new(
            format!("forewarn_{role}_metrics_auth_total"),
            "Requests to /metrics under --metrics-auth kubernetes, by result (allowed, denied, unauthenticated, no_token, unavailable) and whether the verdict was cached",
        ),
        &["result", "cached"],
    )
}

/// Reviews scrapers' tokens with the API server (see the module docs).
pub struct TokenReviewer {
    client: kube::Client,
    cache: Mutex<VerdictCache>,
    outcomes: IntCounterVec,
}

impl TokenReviewer {
    /// A reviewer asking through `client` (a request client, with
    /// timeouts), counting outcomes in `outcomes` ([`outcome_counter`]).
    pub fn new(client: kube::Client, outcomes: IntCounterVec) -> Self {
        TokenReviewer {
            client,
            cache: Mutex::new(VerdictCache::new(CACHE_ENTRIES, CACHE_TTL)),
            outcomes,
        }
    }

    /// The outcome for a request with `headers`, counted.
    pub async fn check(&self, headers: &HeaderMap) -> Outcome {
        let outcome = self.decide(headers).await;
        let cached = matches!(outcome, Outcome::Verdict { cached: true, .. });
        self.outcomes
            .with_label_values(&[
                outcome.result_label(),
                if cached { "true" } else { "false" },
            ])
            .inc();
        outcome
    }

    async fn decide(&self, headers: &HeaderMap) -> Outcome {
        let Ok(token) = bearer_token(headers) else {
            return Outcome::NoToken;
        };
        let key = token_key(token);
        if let Some(verdict) = self.lock().get(&key, Instant::now()) {
            return Outcome::Verdict {
                verdict,
                cached: true,
            };
        }
        match tokio::time::timeout(REVIEW_TIMEOUT, self.review(token)).await {
            Ok(Ok(verdict)) => {
                self.lock().insert(key, verdict, Instant::now());
                Outcome::Verdict {
                    verdict,
                    cached: false,
                }
            }
            Ok(Err(e)) => Outcome::Unavailable(e),
            Err(_) => Outcome::Unavailable(format!(
                "the API server did not answer the reviews within {REVIEW_TIMEOUT:?}"
            )),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VerdictCache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The `TokenReview`, then, for an authenticated user, the
    /// `SubjectAccessReview`.
    async fn review(&self, token: &str) -> Result<Verdict, String> {
        let pp = PostParams::default();
        let tr = TokenReview {
            spec: TokenReviewSpec {
                audiences: None,
                token: token.to_owned(),
            },
            ..Default::default()
        };
        let tr = Api::<TokenReview>::all(self.client.clone())
            .create(&pp, &tr)
            .await
            .map_err(|e| format!("TokenReview failed: {e}"))?;
        let status = tr.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => {
                tracing::debug!(error = ?status.error, "/metrics: token not authenticated");
                return Ok(Verdict::Unauthenticated);
            }
        };
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.into()),
                    verb: Some("get".into()),
                }),
                resource_attributes: None,
            },
            ..Default::default()
        };
        let sar = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&pp, &sar)
            .await
            .map_err(|e| format!("SubjectAccessReview failed: {e}"))?;
        let status = sar.status.unwrap_or_default();
        if status.allowed {
            Ok(Verdict::Allowed)
        } else {
            tracing::debug!(
                user = ?user.username,
                reason = ?status.reason,
                error = ?status.evaluation_error,
                "/metrics: get not allowed"
            );
            Ok(Verdict::Denied)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use prometheus::core::Collector;

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                header::AUTHORIZATION,
                HeaderValue::from_bytes(v).expect("a header value"),
            );
        }
        h
    }

    #[test]
    fn a_bearer_token_is_read_out_of_one_authorization_header() {
        let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_";
        let ok = |v: &str| bearer_token(&headers(&[v.as_bytes()])).map(str::to_owned);
        assert_eq!(ok(&format!("Bearer {jwt}")).as_deref(), Ok(jwt));
        assert_eq!(ok(&format!("bearer {jwt}")).as_deref(), Ok(jwt));
        assert_eq!(ok(&format!("BEARER   {jwt}")).as_deref(), Ok(jwt));
        assert_eq!(
            ok("Bearer abcdef.0123456789abcdef").as_deref(),
            Ok("abcdef.0123456789abcdef")
        );
        assert_eq!(ok("Bearer YWJj+/==").as_deref(), Ok("YWJj+/=="));
        assert_eq!(bearer_token(&HeaderMap::new()), Err(TokenError::Missing));
        for bad in [
            "Bearer",
            "Bearer ",
            "Bearer ===",
            "Basic dXNlcjpwYXNz",
            "Token abc",
            "Bearerabc",
            "Bearer abc def",
            "Bearer a=b",
            "Bearer abc\"",
            "Bearer abc,def",
        ] {
            assert_eq!(ok(bad), Err(TokenError::Malformed), "{bad:?}");
        }
        assert_eq!(
            ok(&format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1))),
            Err(TokenError::Malformed)
        );
        assert!(ok(&format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES))).is_ok());
        // Not ASCII, and two headers (which token would be meant?).
        assert_eq!(
            bearer_token(&headers(&[b"Bearer \xc3\xa9t\xc3\xa9"])),
            Err(TokenError::Malformed)
        );
        assert_eq!(
            bearer_token(&headers(&[b"Bearer abc", b"Bearer def"])),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn tokens_are_keyed_by_their_sha256() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        let key = token_key("abc");
        assert_eq!(key[..4], [0xba, 0x78, 0x16, 0xbf]);
        assert_eq!(key[28..], [0xf2, 0x00, 0x15, 0xad]);
        assert_ne!(token_key("abd"), key);
    }

    #[test]
    fn cached_verdicts_expire_after_the_ttl() {
        let ttl = Duration::from_secs(60);
        let mut c = VerdictCache::new(4, ttl);
        let t0 = Instant::now();
        let (a, b) = (token_key("a"), token_key("b"));
        c.insert(a, Verdict::Allowed, t0);
        c.insert(b, Verdict::Denied, t0);
        assert_eq!(c.get(&a, t0), Some(Verdict::Allowed));
        assert_eq!(
            c.get(&b, t0 + ttl - Duration::from_millis(1)),
            Some(Verdict::Denied)
        );
        assert_eq!(c.get(&a, t0 + ttl), None);
        assert_eq!(c.len(), 1, "the expired entry is dropped when read");
        // Storing again renews it.
        c.insert(a, Verdict::Denied, t0 + ttl);
        assert_eq!(c.get(&a, t0 + ttl + ttl / 2), Some(Verdict::Denied));
        assert_eq!(c.get(&token_key("c"), t0), None);
    }

    #[test]
    fn the_cache_is_bounded_dropping_expired_then_oldest_entries() {
        let ttl = Duration::from_secs(60);
        let mut c = VerdictCache::new(3, ttl);
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
            c.insert(token_key(k), Verdict::Allowed, t0 + s * i as u32);
        }
        assert_eq!(c.len(), 3);
        // Full: the oldest ("a") goes.
        c.insert(token_key("d"), Verdict::Denied, t0 + s * 3);
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&token_key("a"), t0 + s * 3), None);
        for k in ["b", "c", "d"] {
            assert!(c.get(&token_key(k), t0 + s * 3).is_some(), "{k}");
        }
        // Updating a present key never evicts another.
        c.insert(token_key("b"), Verdict::Denied, t0 + s * 4);
        assert_eq!(c.len(), 3);
        // Once "c" and "d" have expired, a new key drops both.
        c.insert(token_key("e"), Verdict::Allowed, t0 + s * 3 + ttl);
        assert_eq!(c.len(), 2);
        assert_eq!(
            c.get(&token_key("b"), t0 + s * 3 + ttl),
            Some(Verdict::Denied)
        );
        assert_eq!(
            c.get(&token_key("e"), t0 + s * 3 + ttl),
            Some(Verdict::Allowed)
        );
        // Many made-up tokens never grow it past the bound.
        for i in 0..1000 {
            c.insert(
                token_key(&i.to_string()),
                Verdict::Unauthenticated,
                t0 + ttl * 2,
            );
        }
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn outcomes_name_their_result() {
        let v = |verdict| Outcome::Verdict {
            verdict,
            cached: false,
        };
        assert_eq!(v(Verdict::Allowed).result_label(), "allowed");
        assert_eq!(v(Verdict::Denied).result_label(), "denied");
        assert_eq!(
            v(Verdict::Unauthenticated).result_label(),
            "unauthenticated"
        );
        assert_eq!(Outcome::NoToken.result_label(), "no_token");
        assert_eq!(
            Outcome::Unavailable(String::new()).result_label(),
            "unavailable"
        );
        assert_eq!(
            outcome_counter("agent").unwrap().desc()[0].fq_name,
            "forewarn_agent_metrics_auth_total"
        );
    }
}
