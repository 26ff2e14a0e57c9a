//! The controller's watches: the reflector caches it keeps, and the backoff
//! every watch of the controller (and its Lease watch) resumes with.

use futures::Stream;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

/// A cache of every `K` in the cluster, and the stream that fills it (it
/// fills only while the stream is polled), yielding each object it touched;
/// watch errors back off with [`watch_backoff`].
///
/// `trim` runs on each object before it is stored, to drop what nothing
/// reads (a Node's `managedFields`, often its larger part).
pub fn cache<K>(
    client: Client,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> (Store<K>, impl Stream<Item = Result<K, watcher::Error>>)
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(
            Api::<K>::all(client),
            watcher::Config::default().any_semantic(),
        )
        .modify(trim),
    )
    .backoff(watch_backoff())
    .touched_objects();
    (store, stream)
}

pub use crate::kubeclient::watch_backoff;

/// Takes at most `cap` objects of each owner (as `owner_of` names it) into
/// a cache: a watch event of an object the cache does not hold yet, when
/// its owner already has `cap`, is dropped before the cache (and before
/// the triggers) sees it; changes and deletions of objects it holds always
/// pass. A relist (from `Init` to `InitDone`) admits afresh, in the order
/// it lists. Bounds what one writer, allowed to create as many objects as
/// it likes, can make the cache hold.
pub struct PerOwnerCap<K> {
    cap: usize,
    owner_of: fn(&K) -> String,
    admitted: std::collections::HashMap<String, std::collections::HashSet<String>>,
    relisting: Option<std::collections::HashMap<String, std::collections::HashSet<String>>>,
    /// Owners already said to be over the cap (said once, until a relist).
    warned: std::collections::HashSet<String>,
}

impl<K: kube::Resource> PerOwnerCap<K> {
    /// At most `cap` objects of each owner.
    pub fn new(cap: usize, owner_of: fn(&K) -> String) -> Self {
        Self {
            cap,
            owner_of,
            admitted: std::collections::HashMap::new(),
            relisting: None,
            warned: std::collections::HashSet::new(),
        }
    }

    /// `event`, or `None` when it is dropped.
    pub fn pass(&mut self, event: watcher::Event<K>) -> Option<watcher::Event<K>> {
        use watcher::Event;
        let name = |o: &K| o.meta().name.clone().unwrap_or_default();
        match event {
            Event::Init => {
                self.relisting = Some(std::collections::HashMap::new());
                Some(Event::Init)
            }
            Event::InitApply(o) => {
                let (owner, n) = ((self.owner_of)(&o), name(&o));
                let set = self.relisting.get_or_insert_with(Default::default);
                let held = set.entry(owner.clone()).or_default();
                if held.contains(&n) || held.len() < self.cap {
                    held.insert(n);
                    return Some(Event::InitApply(o));
                }
                self.dropped(&owner);
                None
            }
            Event::InitDone => {
                self.admitted = self.relisting.take().unwrap_or_default();
                self.warned.clear();
                Some(Event::InitDone)
            }
            Event::Apply(o) => {
                let (owner, n) = ((self.owner_of)(&o), name(&o));
                let held = self.admitted.entry(owner.clone()).or_default();
                if held.contains(&n) || held.len() < self.cap {
                    held.insert(n);
                    return Some(Event::Apply(o));
                }
                self.dropped(&owner);
                None
            }
            Event::Delete(o) => {
                let owner = (self.owner_of)(&o);
                if let Some(held) = self.admitted.get_mut(&owner) {
                    held.remove(&name(&o));
                    if held.is_empty() {
                        self.admitted.remove(&owner);
                    }
                }
                Some(Event::Delete(o))
            }
        }
    }

    fn dropped(&mut self, owner: &str) {
        if self.warned.insert(owner.to_owned()) {
            tracing::warn!(
                owner,
                cap = self.cap,
                "A writer holds more objects than the controller caches for one; the newest are not taken in"
            );
        }
    }
}

/// [`cache`] with at most `cap` objects of each owner ([`PerOwnerCap`]).
pub fn cache_capped<K>(
    client: Client,
    trim: impl FnMut(&mut K) + Send + 'static,
    cap: usize,
    owner_of: fn(&K) -> String,
) -> (Store<K>, impl Stream<Item = Result<K, watcher::Error>>)
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    use futures::StreamExt as _;
    let (store, writer) = reflector::store();
    let mut capped = PerOwnerCap::new(cap, owner_of);
    let events = watcher(
        Api::<K>::all(client),
        watcher::Config::default().any_semantic(),
    )
    .modify(trim)
    .filter_map(move |e| {
        std::future::ready(match e {
            Ok(ev) => capped.pass(ev).map(Ok),
            Err(err) => Some(Err(err)),
        })
    });
    let stream = reflector::reflector(writer, events)
        .backoff(watch_backoff())
        .touched_objects();
    (store, stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use watcher::Event;

    fn obj(owner: &str, name: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.labels = Some([("owner".to_string(), owner.to_string())].into());
        c
    }

    fn owner(c: &ConfigMap) -> String {
        c.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("owner"))
            .cloned()
            .unwrap_or_default()
    }

    fn passed(cap: &mut PerOwnerCap<ConfigMap>, e: Event<ConfigMap>) -> bool {
        cap.pass(e).is_some()
    }

    /// One owner's objects beyond the cap are not taken in; another
    /// owner's are; changes and deletions of those held pass, and a
    /// deletion makes room.
    #[test]
    fn one_owner_fills_only_its_own_share() {
        let mut cap = PerOwnerCap::new(2, owner);
        assert!(passed(&mut cap, Event::Apply(obj("a", "a1"))));
        assert!(passed(&mut cap, Event::Apply(obj("a", "a2"))));
        assert!(
            !passed(&mut cap, Event::Apply(obj("a", "a3"))),
            "over the cap"
        );
        assert!(
            passed(&mut cap, Event::Apply(obj("b", "b1"))),
            "another owner"
        );
        assert!(
            passed(&mut cap, Event::Apply(obj("a", "a1"))),
            "a change of one held"
        );
        assert!(passed(&mut cap, Event::Delete(obj("a", "a2"))));
        assert!(passed(&mut cap, Event::Apply(obj("a", "a3"))), "room made");
        assert!(
            passed(&mut cap, Event::Delete(obj("a", "a9"))),
            "deletions always pass"
        );
    }

    /// A relist admits afresh, in its order; what it admitted is what is
    /// held after it.
    #[test]
    fn a_relist_admits_afresh() {
        let mut cap = PerOwnerCap::new(2, owner);
        assert!(passed(&mut cap, Event::Apply(obj("a", "a1"))));
        assert!(passed(&mut cap, Event::Apply(obj("a", "a2"))));
        assert!(passed(&mut cap, Event::Init));
        assert!(passed(&mut cap, Event::InitApply(obj("a", "a2"))));
        assert!(passed(&mut cap, Event::InitApply(obj("a", "a3"))));
        assert!(!passed(&mut cap, Event::InitApply(obj("a", "a4"))));
        assert!(passed(&mut cap, Event::InitDone));
        assert!(
            !passed(&mut cap, Event::Apply(obj("a", "a1"))),
            "not held since the relist"
        );
        assert!(passed(&mut cap, Event::Apply(obj("a", "a3"))));
    }
}
