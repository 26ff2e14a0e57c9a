//! The `ScheduledEvent` cache takes each object this controller created as
//! the API server answered the create, without waiting for the watch to
//! show it: the watch delivers a new object a moment after the answer, up
//! to seconds under a Spot wave's load, and the first pass over a Spot
//! VM's event (its cordon) waited for it.
//!
//! The answer is the object as stored, with its `resourceVersion`; it is
//! put in the cache only while the cache holds no object of that name (a
//! watch that showed it first, or anything newer, wins), and the watch's
//! own showing of that same version is then passed over, so that the
//! object starts one pass, not two, unless the cache lost it meanwhile
//! (a relist's store, swapped in at its `InitDone`, lacks an object its
//! LIST did not show yet): the watch's showing then puts it back.

use std::collections::HashMap;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::api::ScheduledEvent;

/// Where the creator hands the API server's answers to its creates.
#[derive(Clone)]
pub struct Created(UnboundedSender<ScheduledEvent>);

impl Created {
    /// A channel of answers: the sender, and the receiver
    /// [`with_created`] reads.
    pub fn channel() -> (Self, UnboundedReceiver<ScheduledEvent>) {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        (Self(tx), rx)
    }

    /// Hands over `answer`, the object the API server returned for a
    /// create. Nothing happens once the cache's stream has ended.
    pub fn answered(&self, answer: ScheduledEvent) {
        let _ = self.0.unbounded_send(answer);
    }
}

/// The most objects remembered as put in: one the watch never mentions
/// (deleted while the watch was down, and so in no relist) is forgotten
/// with the rest when this many wait, at the cost of one more pass each.
const PUT_IN_KEPT: usize = 4096;

/// The name and `resourceVersion` of an object.
fn version_of(o: &ScheduledEvent) -> (String, String) {
    (o.name_any(), o.resource_version().unwrap_or_default())
}

/// The deletions the watch showed, by name, at which `resourceVersion`
/// (at most [`PUT_IN_KEPT`] remembered).
#[derive(Default)]
struct Deleted(HashMap<String, u64>);

impl Deleted {
    fn note(&mut self, o: &ScheduledEvent) {
        if let Some(v) = numeric_version(o) {
            if self.0.len() >= PUT_IN_KEPT {
                self.0.clear();
            }
            self.0.insert(o.name_any(), v);
        }
    }

    /// Whether the watch showed the deletion of `answer`'s object at its
    /// version or later. Versions compare as the etcd revisions the API
    /// server makes them (a version that is not a number never matches).
    fn since(&self, answer: &ScheduledEvent) -> bool {
        match (self.0.get(&answer.name_any()), numeric_version(answer)) {
            (Some(gone), Some(v)) => *gone >= v,
            _ => false,
        }
    }
}

fn numeric_version(o: &ScheduledEvent) -> Option<u64> {
    o.resource_version()?.parse().ok()
}

/// What the cache's stream is made of.
enum Input {
    Watch(Result<watcher::Event<ScheduledEvent>, watcher::Error>),
    Answer(ScheduledEvent),
    WatchEnded,
}

/// `watch` (a watcher of every `ScheduledEvent`, feeding the reflector
/// whose cache is `cache`) with each of `created` put in as an `Apply` when
/// the cache holds no object of its name at that moment, and the watch's
/// own `Apply` of an object put in so, at the same `resourceVersion`,
/// left out. Ends when `watch` ends.
pub fn with_created(
    watch: impl Stream<Item = Result<watcher::Event<ScheduledEvent>, watcher::Error>> + Send + 'static,
    created: UnboundedReceiver<ScheduledEvent>,
    cache: Store<ScheduledEvent>,
) -> impl Stream<Item = Result<watcher::Event<ScheduledEvent>, watcher::Error>> + Send + 'static {
    let watch = watch
        .map(Input::Watch)
        .chain(futures::stream::once(std::future::ready(Input::WatchEnded)));
    // The answers' channel, which every creator's handle keeps open, never
    // ends the stream.
    let answers = created.map(Input::Answer).chain(futures::stream::pending());
    // Put in, by name, at which version; forgotten at the watch's first
    // event about the name.
    let mut put_in: HashMap<String, String> = HashMap::new();
    let mut deleted = Deleted::default();
    futures::stream::select(watch, answers)
        .take_while(|input| std::future::ready(!matches!(input, Input::WatchEnded)))
        .filter_map(move |input| {
            let out = match input {
                Input::Watch(Ok(event)) => {
                    // The watch's own showing of a version put in is left out.
                    let put_in_so = match &event {
                        // Only while the cache still holds that very
                        // version: a relist (its `InitDone` swaps in a
                        // store built from a LIST, which the watch cache
                        // may serve from before the create) can have taken
                        // the object out since, and then the watch's own
                        // showing is the only way back in.
                        watcher::Event::Apply(o) => {
                            let (name, version) = version_of(o);
                            put_in.remove(&name).is_some_and(|v| v == version)
                                && cache.get(&ObjectRef::from_obj(o)).is_some_and(|c| {
                                    c.resource_version().as_deref() == Some(&*version)
                                })
                        }
                        watcher::Event::InitApply(o) => {
                            put_in.remove(&o.name_any());
                            false
                        }
                        watcher::Event::Delete(o) => {
                            put_in.remove(&o.name_any());
                            deleted.note(o);
                            false
                        }
                        watcher::Event::Init | watcher::Event::InitDone => false,
                    };
                    (!put_in_so).then_some(Ok(event))
                }
                Input::Watch(Err(e)) => Some(Err(e)),
                // Looked at as the answer's turn comes: every event the
                // watch gave before it is in the cache by then (the
                // reflector applies each as it passes).
                // An answer read before a deletion the watch has shown
                // already would bring back an object that is gone.
                Input::Answer(o) if deleted.since(&o) => None,
                Input::Answer(o) => cache.get(&ObjectRef::from_obj(&o)).is_none().then(|| {
                    if put_in.len() >= PUT_IN_KEPT {
                        put_in.clear();
                    }
                    put_in.insert(o.name_any(), version_of(&o).1);
                    Ok(watcher::Event::Apply(o))
                }),
                Input::WatchEnded => None,
            };
            std::future::ready(out)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::{WatchStreamExt, reflector::store};

    fn object(name: &str, version: &str) -> ScheduledEvent {
        let mut o = ScheduledEvent::new(name, crate::fixtures::spec(name).build());
        o.metadata.resource_version = Some(version.into());
        o
    }

    /// The objects the controller's trigger stream yields, by name and
    /// version, and the cache after them, for the watch's `events` given
    /// one by one with `answers` sent before the watch event at each index.
    async fn run(
        events: Vec<watcher::Event<ScheduledEvent>>,
        answers: Vec<(usize, ScheduledEvent)>,
    ) -> (Vec<(String, String)>, Store<ScheduledEvent>) {
        let (reader, writer) = store();
        let (created, rx) = Created::channel();
        let (watch_tx, watch_rx) = futures::channel::mpsc::unbounded();
        let stream = reflector::reflector(writer, with_created(watch_rx, rx, reader.clone()))
            .applied_objects();
        futures::pin_mut!(stream);
        let mut seen = Vec::new();
        // Each input is taken before the next is given (an input left
        // out yields nothing within the wait).
        let mut take = async |seen: &mut Vec<(String, String)>| {
            let wait = std::time::Duration::from_millis(50);
            if let Ok(Some(Ok(o))) = tokio::time::timeout(wait, stream.next()).await {
                seen.push(version_of(&o));
            }
        };
        let mut answers = answers.into_iter().peekable();
        for (i, e) in events.into_iter().enumerate() {
            while let Some((_, a)) = answers.next_if(|(at, _)| *at == i) {
                created.answered(a);
                take(&mut seen).await;
            }
            watch_tx.unbounded_send(Ok(e)).unwrap();
            take(&mut seen).await;
        }
        (seen, reader)
    }

    fn v(name: &str, version: &str) -> (String, String) {
        (name.into(), version.into())
    }

    #[tokio::test]
    async fn a_created_object_is_cached_at_once_and_passed_once() {
        let (seen, cache) = run(
            vec![
                watcher::Event::Apply(object("b", "7")),
                watcher::Event::Apply(object("a", "5")),
                watcher::Event::Apply(object("a", "6")),
            ],
            vec![(0, object("a", "5"))],
        )
        .await;
        // The answer before anything the watch showed after it; the
        // watch's own showing of version 5 started nothing; its next
        // version did.
        assert_eq!(seen, vec![v("a", "5"), v("b", "7"), v("a", "6")]);
        let cached = cache.get(&ObjectRef::new("a")).unwrap();
        assert_eq!(cached.resource_version().as_deref(), Some("6"));
    }

    #[tokio::test]
    async fn an_answer_never_replaces_what_the_watch_showed() {
        // The watch showed the object (and its next version) before the
        // create's answer came: the answer is dropped.
        let (seen, cache) = run(
            vec![
                watcher::Event::Apply(object("a", "5")),
                watcher::Event::Apply(object("a", "6")),
                watcher::Event::Apply(object("b", "9")),
            ],
            vec![(2, object("a", "5"))],
        )
        .await;
        assert_eq!(seen, vec![v("a", "5"), v("a", "6"), v("b", "9")]);
        let cached = cache.get(&ObjectRef::new("a")).unwrap();
        assert_eq!(cached.resource_version().as_deref(), Some("6"));
    }

    #[tokio::test]
    async fn an_answer_put_in_during_a_relist_that_missed_it_comes_back_with_the_watch() {
        // The answer comes between a relist's `Init` and `InitDone`; the
        // relist's LIST (served from the watch cache) was read before the
        // create, so its store, swapped in at `InitDone`, lacks the object;
        // the watch, started from that LIST's version, then shows its
        // `ADDED` at the answer's version.
        let (seen, cache) = run(
            vec![
                watcher::Event::Init,
                watcher::Event::InitApply(object("b", "7")),
                watcher::Event::InitDone,
                watcher::Event::Apply(object("a", "8")),
            ],
            vec![(1, object("a", "8"))],
        )
        .await;
        let cached = cache.get(&ObjectRef::new("a"));
        assert_eq!(
            cached.and_then(|c| c.resource_version()).as_deref(),
            Some("8"),
            "the object left the cache for good: {seen:?}"
        );
        assert!(seen.contains(&v("b", "7")));
    }

    #[tokio::test]
    async fn an_answer_put_in_just_before_a_relist_that_missed_it_comes_back() {
        // The answer is in the cache; a relist whose LIST lacks it swaps it
        // out; the watch's `ADDED` of the same version puts it back.
        let (_, cache) = run(
            vec![
                watcher::Event::Init,
                watcher::Event::InitDone,
                watcher::Event::Apply(object("a", "8")),
            ],
            vec![(0, object("a", "8"))],
        )
        .await;
        assert!(cache.get(&ObjectRef::new("a")).is_some());
    }

    #[tokio::test]
    async fn an_answer_older_than_a_deletion_shown_does_not_bring_the_object_back() {
        let (seen, cache) = run(
            vec![
                watcher::Event::Apply(object("a", "5")),
                watcher::Event::Delete(object("a", "6")),
                watcher::Event::Apply(object("b", "9")),
            ],
            vec![(2, object("a", "5"))],
        )
        .await;
        assert!(cache.get(&ObjectRef::new("a")).is_none(), "{seen:?}");
    }

    #[tokio::test]
    async fn a_deletion_after_the_answer_removes_the_object() {
        let (seen, cache) = run(
            vec![watcher::Event::Delete(object("a", "5"))],
            vec![(0, object("a", "5"))],
        )
        .await;
        assert_eq!(seen, vec![v("a", "5")]);
        assert!(cache.get(&ObjectRef::new("a")).is_none());
    }

    #[tokio::test]
    async fn the_stream_ends_with_the_watch() {
        let (reader, _writer) = store::<ScheduledEvent>();
        let (_created, rx) = Created::channel();
        let watch = futures::stream::iter(vec![Ok(watcher::Event::Apply(object("a", "1")))]);
        let all: Vec<_> = with_created(watch, rx, reader).collect().await;
        assert_eq!(all.len(), 1);
    }
}
