//! The controller's watches: the reflector caches it keeps, and the backoff
//! every watch of the controller (and its Lease watch) resumes with.

use std::time::Duration;

use backon::ExponentialBuilder;
use futures::Stream;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

/// A cache of every `K` in the cluster, and the stream that fills it (it
/// fills only while the stream is polled), yielding each object it touched;
/// watch errors back off with [`watch_backoff`].
pub fn cache<K>(client: Client) -> (Store<K>, impl Stream<Item = Result<K, watcher::Error>>)
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
        ),
    )
    .backoff(watch_backoff())
    .touched_objects();
    (store, stream)
}

/// Watches resume quickly after an API server outage: a bounded backoff
/// (0.5 s doubling to 2.5 s, plus backon's jitter of up to 100%: at most
/// 5 s) instead of kube's default, which waits up to minutes after a `too
/// old resource version`.
pub fn watch_backoff() -> watcher::ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_millis(2500))
        .with_jitter()
        .without_max_times()
        .into()
}
