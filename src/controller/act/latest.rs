//! The `ScheduledEvent`s as this controller's own last status write left
//! them, for a pass that starts before the event cache shows that write.
//!
//! Every write a pass makes to its event is conditional on the
//! `resourceVersion` it read ([`crate::controller::act::writers::conditional_on`]).
//! Under load the watch behind the cache lags the API server by seconds, so
//! a pass woken by a pod's deletion or a budget's change would read the
//! version before its own previous write and lose its status write with
//! 409 Conflict (799 of 2,586 status writes in one 200-VM wave), its work
//! redone 200-600 ms later. The API server's answer to that write is the
//! object as it stands after it, and the write being conditional tells how
//! it orders against what the cache shows:
//!
//! - a write conditional on version `b` that the API server took was made
//!   on the newest version: every version this controller saw of the
//!   object before it (its cache's, earlier answers, `b`) is older than the
//!   answer;
//! - the cache shows versions in order, so one it shows that is none of
//!   those is the answer or newer.
//!
//! A pass therefore starts from the answer while the cache shows one of
//! the versions known older than it, and from the cache otherwise (the
//! entry is then dropped). Nothing is compared but equality of versions,
//! which Kubernetes leaves opaque.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::ScheduledEvent;

/// How long an entry holds while the cache does not move past it: far
/// longer than a watch lags.
pub const KEPT: Duration = Duration::from_secs(120);

/// How many versions known older than the answer an entry keeps (the
/// newest ones: a lagging cache shows a recent one).
pub const OLDER_KEPT: usize = 32;

/// The last status write of each `ScheduledEvent` (by name) that the API
/// server took, with the versions known older than its answer.
#[derive(Clone, Default)]
pub struct LatestWritten(Arc<Mutex<HashMap<String, Entry>>>);

struct Entry {
    /// The API server's answer to the write.
    answer: Arc<ScheduledEvent>,
    /// Versions of the object known older than `answer`, oldest first.
    older: Vec<String>,
    at: Instant,
}

impl LatestWritten {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The object a pass starts from: the answer to this controller's last
    /// write of `cached`'s event while the cache shows a version known older
    /// than it (the same object: same UID), else `cached` (the entry is then
    /// dropped: the cache caught up or moved past).
    pub fn fresher(&self, cached: Arc<ScheduledEvent>) -> Arc<ScheduledEvent> {
        let name = cached.name_any();
        let mut map = self.lock();
        let Some(entry) = map.get(&name) else {
            return cached;
        };
        let older = cached
            .resource_version()
            .is_some_and(|v| entry.older.contains(&v));
        if older && entry.at.elapsed() < KEPT && entry.answer.uid() == cached.uid() {
            return entry.answer.clone();
        }
        map.remove(&name);
        cached
    }

    /// Notes that a write conditional on the version `base` was taken and
    /// answered `answer`; `seen` are other versions of the object the pass
    /// read before it (the one it started from, when a spec write came
    /// between). The entry's versions known older carry over to the new
    /// answer, with the old answer's own.
    /// A write with no version in `answer` is not noted.
    pub fn wrote(&self, base: &str, seen: &[&str], answer: ScheduledEvent) {
        let name = answer.name_any();
        let Some(version) = answer.resource_version() else {
            return;
        };
        let mut map = self.lock();
        map.retain(|_, e| e.at.elapsed() < KEPT);
        let mut older = match map.remove(&name) {
            Some(e) if e.answer.uid() == answer.uid() => {
                let mut o = e.older;
                o.extend(e.answer.resource_version());
                o
            }
            _ => Vec::new(),
        };
        for v in seen.iter().chain([&base]) {
            if *v != version && !older.iter().any(|o| o == v) {
                older.push((*v).to_owned());
            }
        }
        // The newest are kept (oldest first).
        older.drain(..older.len().saturating_sub(OLDER_KEPT));
        map.insert(
            name,
            Entry {
                answer: Arc::new(answer),
                older,
                at: Instant::now(),
            },
        );
    }

    /// Forgets the entries of events not in `live` (deleted ones).
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        self.lock().retain(|name, _| live.contains(name));
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn at(version: &str, uid: &str, note: &str) -> ScheduledEvent {
        let mut ev = ScheduledEvent::new("e", crate::fixtures::spec("e").build());
        ev.metadata = ObjectMeta {
            name: Some("e".into()),
            uid: Some(uid.into()),
            resource_version: Some(version.into()),
            annotations: Some([("note".to_string(), note.to_string())].into()),
            ..Default::default()
        };
        ev
    }

    fn note(ev: &ScheduledEvent) -> String {
        ev.annotations()["note"].clone()
    }

    #[test]
    fn a_pass_starts_from_its_last_answer_while_the_cache_lags() {
        let latest = LatestWritten::default();
        // Nothing written: the cache.
        assert_eq!(
            note(&latest.fresher(Arc::new(at("10", "u", "cache")))),
            "cache"
        );
        latest.wrote("10", &[], at("11", "u", "answer 11"));
        // The cache still shows the version written on.
        assert_eq!(
            note(&latest.fresher(Arc::new(at("10", "u", "cache")))),
            "answer 11"
        );
        // A second write on the answer: the cache showing either older
        // version yields the newest answer.
        latest.wrote("11", &["10"], at("12", "u", "answer 12"));
        assert_eq!(
            note(&latest.fresher(Arc::new(at("10", "u", "cache")))),
            "answer 12"
        );
        assert_eq!(
            note(&latest.fresher(Arc::new(at("11", "u", "cache")))),
            "answer 12"
        );
        // The cache caught up: it is read again, and the entry is gone.
        assert_eq!(
            note(&latest.fresher(Arc::new(at("12", "u", "cache 12")))),
            "cache 12"
        );
        assert!(latest.is_empty());
    }

    #[test]
    fn a_version_never_seen_is_newer_and_the_cache_wins() {
        let latest = LatestWritten::default();
        latest.wrote("10", &[], at("11", "u", "answer"));
        // Someone wrote after the answer: the cache shows it.
        assert_eq!(
            note(&latest.fresher(Arc::new(at("13", "u", "cache 13")))),
            "cache 13"
        );
        assert!(latest.is_empty());
        // Then a version written on before is not taken for the answer's.
        assert_eq!(
            note(&latest.fresher(Arc::new(at("10", "u", "cache")))),
            "cache"
        );
    }

    #[test]
    fn a_recreated_event_is_never_answered_by_the_old_one() {
        let latest = LatestWritten::default();
        latest.wrote("10", &[], at("11", "old", "old answer"));
        assert_eq!(
            note(&latest.fresher(Arc::new(at("10", "new", "new")))),
            "new"
        );
        // A write of the new object does not inherit the old one's versions.
        latest.wrote("20", &[], at("21", "new", "new answer"));
        latest.wrote("5", &[], at("22", "other", "x"));
        assert_eq!(note(&latest.fresher(Arc::new(at("11", "other", "c")))), "c");
    }

    #[test]
    fn versions_seen_before_the_write_are_older_too() {
        let latest = LatestWritten::default();
        // The pass read 10 from the cache, wrote the spec (11) and then the
        // status on 11 (answer 12).
        latest.wrote("11", &["10"], at("12", "u", "answer"));
        assert_eq!(
            note(&latest.fresher(Arc::new(at("10", "u", "c")))),
            "answer"
        );
        assert_eq!(
            note(&latest.fresher(Arc::new(at("11", "u", "c")))),
            "answer"
        );
    }

    #[test]
    fn the_versions_kept_are_bounded_and_the_newest() {
        let latest = LatestWritten::default();
        for v in 0..100u32 {
            latest.wrote(&v.to_string(), &[], at(&(v + 1).to_string(), "u", "a"));
        }
        let map = latest.lock();
        let e = &map["e"];
        assert_eq!(e.older.len(), OLDER_KEPT);
        assert_eq!(e.older.last().map(String::as_str), Some("99"));
        assert!(!e.older.contains(&"100".to_string()));
    }
}
