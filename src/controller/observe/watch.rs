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
