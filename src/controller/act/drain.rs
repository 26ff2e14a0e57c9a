//! Draining: which pods a node holds, and evicting them through the
//! Eviction API so that PodDisruptionBudgets are honoured.
//!
//! Follows `kubectl drain --ignore-daemonsets --delete-emptydir-data`
//! (k8s.io/kubectl `pkg/drain`): DaemonSet pods and mirror (static) pods
//! stay, finished pods do not count, pods with `emptyDir` are evicted, pods
//! without a controller are kept unless the policy says otherwise (see
//! [`crate::controller::decide::plan`]). A PodDisruptionBudget is never bypassed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{Eviction as EvictionBody, PodDisruptionBudget};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, LabelSelector, Preconditions};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::core::Status;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};

use crate::controller::decide::plan::{Eviction, EvictionOutcome};
use crate::controller::decide::status::Outcome;
use crate::controller::observe::pod_list::{PodInfo, chrono_time};
use crate::controller::observe::pods::PodCache;

/// How long a PodDisruptionBudget may list a pod in `status.disruptedPods`
/// before we call it wedged: the disruption controller itself drops entries
/// after two minutes (`DeletionTimeout` in kube-controller-manager).
const WEDGED_AFTER: chrono::TimeDelta = chrono::TimeDelta::minutes(2);

/// The grace period an eviction of `e` asks for: the plan's, never 0 (a
/// force delete).
fn grace_sent(e: &Eviction) -> i64 {
    e.grace_seconds.max(1)
}

/// The `policy/v1` Eviction we send: the grace period and the pod-UID
/// precondition in `deleteOptions`.
///
/// Built here rather than with kube's `EvictParams`: kube-core 5.0.0
/// serialises its options under the key `delete_options`, which the API
/// server drops as an unknown field, so neither the grace nor the
/// precondition would apply.
pub fn eviction_body(e: &Eviction) -> EvictionBody {
    EvictionBody {
        metadata: ObjectMeta {
            name: Some(e.pod.name.clone()),
            namespace: Some(e.pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        delete_options: Some(DeleteOptions {
            grace_period_seconds: Some(grace_sent(e)),
            preconditions: Some(Preconditions {
                uid: Some(e.pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteOptions::default()
        }),
    }
}

/// Classifies the API server's refusal of an eviction.
pub fn classify_refusal(s: &Status) -> EvictionOutcome {
    let msg = s.message.clone();
    match s.code {
        429 => {
            let causes: Vec<&kube::core::response::StatusCause> = s
                .details
                .iter()
                .flat_map(|d| &d.causes)
                .filter(|c| c.reason == "DisruptionBudget")
                .collect();
            match causes.first() {
                Some(first) => EvictionOutcome::Blocked {
                    budgets: causes
                        .iter()
                        .filter_map(|c| budget_name(&c.message))
                        .collect(),
                    message: first.message.clone(),
                },
                None => EvictionOutcome::Throttled {
                    retry_after_seconds: s
                        .details
                        .as_ref()
                        .map_or(1, |d| d.retry_after_seconds)
                        .max(1),
                },
            }
        }
        404 => EvictionOutcome::Gone,
        // The pod-UID precondition failed: the pod planned is gone, and the
        // one of the same name is another pod (planned afresh next pass).
        409 if msg.contains("UID in the precondition") || msg.contains("Precondition failed") => {
            EvictionOutcome::Gone
        }
        500 if msg.contains(MULTIPLE_BUDGETS) => EvictionOutcome::Blocked {
            budgets: Vec::new(), // named by the caller, which can list them
            message: msg,
        },
        _ => EvictionOutcome::Retry(format!("{} {}: {msg}", s.code, s.reason)),
    }
}

/// The budget's name in the API server's cause message, e.g. `web` in
/// "The disruption budget web needs 5 healthy pods and has 5 currently".
fn budget_name(message: &str) -> Option<String> {
    let rest = message.strip_prefix("The disruption budget ")?;
    rest.split_whitespace().next().map(String::from)
}

/// Whether `selector` selects a pod with `labels` (matchLabels and
/// matchExpressions, as in `metav1.LabelSelectorAsSelector`).
pub fn selects(
    selector: &LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// The PodDisruptionBudgets of the pod's namespace that select `pod`, as
/// the cache `budgets` holds them.
pub fn budgets_of(
    budgets: &Store<PodDisruptionBudget>,
    pod: &PodInfo,
) -> Vec<Arc<PodDisruptionBudget>> {
    budgets
        .state()
        .into_iter()
        .filter(|b| b.namespace().as_deref() == Some(pod.namespace.as_str()))
        .filter(|b| {
            b.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                // An empty selector selects every pod of the namespace (policy/v1).
                .is_some_and(|sel| selects(sel, &pod.labels))
        })
        .collect()
}

/// `namespace/name` of a budget.
fn budget_key(b: &PodDisruptionBudget) -> String {
    format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any())
}

/// `b`'s status if the disruption controller computed it for `b`'s current
/// generation (`status.observedGeneration` equals `metadata.generation`);
/// an older status says nothing of the budget as it is now.
fn current_status(
    b: &PodDisruptionBudget,
) -> Option<&k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus> {
    b.status.as_ref().filter(|s| {
        s.observed_generation.is_some() && s.observed_generation == b.metadata.generation
    })
}

/// Whether `b`'s status, as of its current generation, allows no
/// disruption (`status.disruptionsAllowed` 0). A status the disruption
/// controller has not yet computed for this generation says nothing.
pub fn allows_none(b: &PodDisruptionBudget) -> bool {
    current_status(b).is_some_and(|s| s.disruptions_allowed.unwrap_or(0) <= 0)
}

/// A note when the budget `pdb` has been wedged by a pod it still lists as
/// disrupted long after the eviction (the pod never went away).
fn wedged_note(pdb: &PodDisruptionBudget, now: DateTime<Utc>) -> Option<String> {
    let stale: Vec<String> = pdb
        .status
        .as_ref()?
        .disrupted_pods
        .as_ref()?
        .iter()
        .filter(|(_, t)| now - chrono_time(&t.0) > WEDGED_AFTER)
        .map(|(p, t)| format!("{p} (since {})", chrono_time(&t.0).to_rfc3339()))
        .collect();
    (!stale.is_empty()).then(|| {
        format!(
            "PodDisruptionBudget {} looks wedged: it still counts {} as disrupted",
            budget_key(pdb),
            stale.join(", ")
        )
    })
}

/// What the API server's refusal of a pod under several
/// PodDisruptionBudgets says (500: the Eviction API does not evict such a
/// pod, whatever the budgets allow).
const MULTIPLE_BUDGETS: &str = "more than one PodDisruptionBudget";

/// Whether `o` is the refusal of a pod under several budgets: no change of
/// a budget's status lets it go (only removing a budget does), so it is
/// asked again on the pod's own backoff, as a failure
/// ([`Refusals::failing`]), and wakes no drain when a budget allows a
/// disruption.
pub fn under_several_budgets(o: &EvictionOutcome) -> bool {
    matches!(o, EvictionOutcome::Blocked { message, .. } if message.contains(MULTIPLE_BUDGETS))
}

/// Requests one eviction and classifies the answer. `client` must not retry
/// 429s by itself (kube's default retry policy would hide a blocking
/// PodDisruptionBudget for minutes).
pub async fn evict(
    client: &Client,
    e: &Eviction,
    budgets: &Store<PodDisruptionBudget>,
) -> EvictionOutcome {
    let api: Api<Pod> = Api::namespaced(client.clone(), &e.pod.namespace);
    let body = eviction_body(e);
    let outcome = match api
        .create_subresource::<_, serde_json::Value>(
            "eviction",
            &e.pod.name,
            &PostParams::default(),
            &body,
        )
        .await
    {
        Ok(_) => EvictionOutcome::Evicted,
        Err(kube::Error::Api(s)) => classify_refusal(&s),
        Err(err) => EvictionOutcome::Retry(err.to_string()),
    };
    match outcome {
        // The budgets and their state from the cache: no read per refusal.
        EvictionOutcome::Blocked {
            budgets: named,
            message,
        } => {
            let selecting = budgets_of(budgets, &e.pod);
            let named = if named.is_empty() {
                selecting.iter().map(|b| budget_key(b)).collect()
            } else {
                named
                    .into_iter()
                    .map(|b| format!("{}/{b}", e.pod.namespace))
                    .collect::<Vec<_>>()
            };
            let mut message = message;
            let now = Utc::now();
            for b in selecting.iter().filter(|b| named.contains(&budget_key(b))) {
                if let Some(note) = wedged_note(b, now) {
                    message = format!("{message}; {note}");
                }
            }
            EvictionOutcome::Blocked {
                budgets: named,
                message,
            }
        }
        other => other,
    }
}

/// The pods a PodDisruptionBudget refused, so that they are not asked for
/// again on every pass while their budgets still allow no disruption: a
/// refused pod is asked again as soon as the budget cache shows one of its
/// budgets allowing a disruption (the budget watch then also triggers a
/// pass). Otherwise it is asked again only when its budgets stayed as the
/// cache had them at the refusal for a backoff of its own (1 s doubling to
/// 16 s): a floor against a cache that missed a change, not a retry on a
/// timer. A cached version newer than the refusal that still allows none
/// is news the refusal did not have, and is believed (the floor starts
/// again from it); a pod whose budgets the cache shows allowing none is
/// not asked at all, refused before or not (asking would only be told so,
/// and each eviction costs the API server a read of every budget of the
/// namespace).
///
/// It also gives each PodDisruptionBudget its turn ([`Refusals::turn`]):
/// one eviction in flight per budget, controller-wide, and more side by
/// side only while the controller has few in flight.
#[derive(Debug, Default, Clone)]
pub struct Refusals {
    refused: Arc<std::sync::Mutex<HashMap<String, Refused>>>,
    /// The budgets' turns and the evictions in flight.
    turns: Arc<std::sync::Mutex<Turns>>,
    /// Per budget, the `resourceVersion` the cache showed when this
    /// controller last evicted under it and how many it evicted since that
    /// version: the API server took one disruption for each, which the
    /// cache shows only once the budget's next version arrives.
    taken: Arc<std::sync::Mutex<HashMap<String, Taken>>>,
    /// Notified at each change of the budget cache.
    changed: Arc<tokio::sync::Notify>,
    /// The pods whose evictions failed for another reason than a budget,
    /// by pod: each not asked again before its own backoff has passed
    /// ([`Refusals::failing`]).
    failed: Arc<std::sync::Mutex<HashMap<String, Failed>>>,
}

/// A pod's evictions failed in a row for another reason than a budget's
/// allowance: its last outcome, given without asking until `next`.
#[derive(Debug, Clone)]
struct Failed {
    count: u32,
    next: tokio::time::Instant,
    last: EvictionOutcome,
}

/// The `resourceVersion` of a budget as the cache had it at an eviction,
/// and the evictions made under it since.
type Taken = (Option<String>, i32);

/// The budgets' turns ([`Refusals::turn`]).
#[derive(Debug, Default)]
struct Turns {
    /// One permit per budget (`namespace/name`): its own turn, held by one
    /// eviction in flight on it.
    own: HashMap<String, Arc<tokio::sync::Semaphore>>,
    /// Per budget, the turns held (its own and those side by side): the
    /// evictions about to be sent or in flight under it.
    in_flight: HashMap<String, i32>,
    /// Per budget, the earliest moment its next turn may begin
    /// ([`TURN_SPACING`] after the last one began).
    next_start: HashMap<String, tokio::time::Instant>,
}

/// The least time between the beginnings of two turns under one budget:
/// evictions sent together under one budget all read its status at one
/// version, one wins the conditional write of it and every other waits
/// 500 ms to read it again (kube-apiserver's `EvictionsRetry`); ten sent
/// at once were answered over 3.5 s. Spaced, each reads the version the
/// one before it wrote.
pub const TURN_SPACING: Duration = Duration::from_millis(50);

/// Up to how many evictions in flight, controller-wide, a budget whose own
/// turn is taken may have more side by side (as many as its cached status
/// allows beyond those in flight): one node's drain under one budget
/// then is not one round trip at a time, each of which the disruption
/// controller's own writes of the budget's status can make lose its race
/// and wait for kube-apiserver's eviction retry (`EvictionsRetry`); a wave
/// of many budgets keeps one in flight each.
pub const SIDE_BY_SIDE_UNDER: usize = 16;

/// A budget's turn to have an eviction in flight ([`Refusals::turn`]),
/// held until its answer; given back when dropped.
#[derive(Debug)]
pub struct Turn {
    budget: String,
    turns: Arc<std::sync::Mutex<Turns>>,
    /// The budget's own permit; `None` for a turn side by side.
    _own: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Turns {
    /// The turns held, every budget together.
    fn total(&self) -> i32 {
        self.in_flight.values().sum()
    }

    /// Counts a turn of `budget` (its own `permit`, or none side by side)
    /// held from `turns` (this, locked).
    fn hold(
        &mut self,
        turns: &Arc<std::sync::Mutex<Turns>>,
        budget: String,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Turn {
        *self.in_flight.entry(budget.clone()).or_default() += 1;
        Turn {
            budget,
            turns: turns.clone(),
            _own: permit,
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut turns = self
            .turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = turns.in_flight.get_mut(&self.budget) {
            *n -= 1;
            if *n <= 0 {
                turns.in_flight.remove(&self.budget);
            }
        }
    }
}

/// One refused pod's backoff.
#[derive(Debug, Clone, Copy)]
struct Refused {
    /// Refusals in a row.
    count: u32,
    /// Not asked again before this, while its budgets allow none.
    next: tokio::time::Instant,
    /// The versions of the budgets selecting the pod as the cache had them
    /// when the floor began ([`versions_of`]).
    seen: u64,
}

/// A fingerprint of the budgets `selecting` a pod as the cache has them:
/// their names and `resourceVersion`s, in the order of their names.
fn versions_of(selecting: &[Arc<PodDisruptionBudget>]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut versions: Vec<(String, Option<&String>)> = selecting
        .iter()
        .map(|b| (budget_key(b), b.metadata.resource_version.as_ref()))
        .collect();
    versions.sort_unstable();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    versions.hash(&mut h);
    h.finish()
}

/// The floor after `count` refusals in a row: 1 s doubling to 16 s.
fn floor_after(count: u32) -> Duration {
    (REFUSED_FLOOR * (1u32 << count.saturating_sub(1).min(8))).min(MAX_REFUSED_FLOOR)
}

/// What the PodDisruptionBudgets selecting a pod allow now, as this
/// controller sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allows {
    /// A disruption (or no budget selects the pod): it is asked for.
    Some,
    /// Every budget allows none, and some only because this controller's
    /// evictions took what the cached status allows: the cache shows the
    /// budget's next version within moments, which says more.
    CatchingUp,
    /// Every budget's status allows none: a replacement must become Ready
    /// first, which may take minutes.
    None,
}

/// The first pause after a refusal; it doubles with each refusal in a row.
const REFUSED_FLOOR: Duration = Duration::from_secs(1);

/// The longest pause between two asks of a refused pod.
const MAX_REFUSED_FLOOR: Duration = Duration::from_secs(16);

impl Refusals {
    fn key(pod: &PodInfo) -> String {
        format!("{}/{}/{}", pod.namespace, pod.name, pod.uid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Refused>> {
        self.refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn failed_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Failed>> {
        self.failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The outcome of `pod` without asking at `now`, while its last
    /// evictions failed for another reason than a budget and its backoff
    /// (1 s doubling to 60 s, as a refused node write's:
    /// [`crate::controller::act::refused::backoff`]) has not passed: an
    /// admission webhook that denies every eviction in a namespace is asked
    /// a few times a minute, not on every drain poll, each ask spending a
    /// token of the controller's eviction budget.
    pub fn failing(&self, pod: &PodInfo, now: tokio::time::Instant) -> Option<EvictionOutcome> {
        let all = self.failed_lock();
        let f = all.get(&Self::key(pod)).filter(|f| now < f.next)?;
        Some(match &f.last {
            EvictionOutcome::Retry(why) => EvictionOutcome::Waiting(why.clone()),
            // The refusal of a pod under several budgets, as it stands.
            other => other.clone(),
        })
    }

    /// Waits for the turn of the budget selecting a pod (`selecting`, from
    /// the cache; the first by name when several do, which the API server
    /// refuses anyway), and returns it, to hold while its eviction is in
    /// flight; `None` at once for a pod no budget selects.
    ///
    /// The API server decrements a budget's `disruptionsAllowed` by a write
    /// of its status conditional on the version it read (after a read of
    /// every budget of the pod's namespace), and an eviction that loses
    /// that race reads the budget again after 500 ms, up to 20 times
    /// (kube-apiserver's `EvictionsRetry`): 16 evictions in flight on one
    /// budget took seconds each and, with 200 budgets in a namespace,
    /// saturated the API server until its answers passed the client's 15 s
    /// timeout. Even as many side by side as each budget allowed (5 of 10
    /// pods, 200 budgets) doubled the wave's eviction answers (p50 15 s
    /// against 6.8 s one at a time, on the same machine) and left events
    /// unapproved. So each budget has its own turn, one at a time; when it
    /// is taken, a pod whose one budget's cached status allows more
    /// disruptions than are in flight under it goes side by side, while
    /// the controller has fewer than [`SIDE_BY_SIDE_UNDER`] evictions in
    /// flight in all. One at a time, a drain under one budget lost the
    /// race to the disruption controller's own status writes on one
    /// eviction in four, 500 ms each, with nothing else in flight.
    pub async fn turn(&self, selecting: &[Arc<PodDisruptionBudget>]) -> Option<Turn> {
        let key = selecting.iter().map(|b| budget_key(b)).min()?;
        let own = {
            let mut turns = self
                .turns
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Budgets nobody waits for or holds are forgotten.
            let Turns { own, in_flight, .. } = &mut *turns;
            own.retain(|k, t| *k == key || Arc::strong_count(t) > 1);
            self.taken_lock()
                .retain(|k, _| own.contains_key(k) || in_flight.contains_key(k));
            own.entry(key.clone())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(1)))
                .clone()
        };
        let turn = if let Ok(permit) = own.clone().try_acquire_owned() {
            self.hold(key, permit)
        } else if let [b] = selecting
            && let Some(turn) = self.side_by_side(&key, b)
        {
            turn
        } else {
            let permit = own.acquire_owned().await.ok()?;
            self.hold(key, permit)
        };
        tokio::time::sleep_until(self.start_of(&turn.budget)).await;
        Some(turn)
    }

    /// When a turn under `budget` beginning now may send its eviction
    /// ([`TURN_SPACING`] after the one before it), counted as begun then.
    fn start_of(&self, budget: &str) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let mut turns = self
            .turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Turns {
            next_start,
            own,
            in_flight,
            ..
        } = &mut *turns;
        next_start.retain(|k, t| *t > now || own.contains_key(k) || in_flight.contains_key(k));
        let at = next_start.get(budget).copied().unwrap_or(now).max(now);
        next_start.insert(budget.to_owned(), at + TURN_SPACING);
        at
    }

    /// Counts a turn of `budget` under its own `permit`.
    fn hold(&self, budget: String, permit: tokio::sync::OwnedSemaphorePermit) -> Turn {
        self.turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .hold(&self.turns, budget, Some(permit))
    }

    /// A turn side by side under `b` (keyed `key`), when the controller
    /// has fewer than [`SIDE_BY_SIDE_UNDER`] evictions in flight and `b`'s
    /// cached status allows more disruptions than this controller took
    /// under that version and has in flight under it.
    fn side_by_side(&self, key: &str, b: &PodDisruptionBudget) -> Option<Turn> {
        let allowed = current_status(b)?.disruptions_allowed.unwrap_or(0);
        let mut turns = self
            .turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let in_flight = turns.in_flight.get(key).copied().unwrap_or(0);
        if usize::try_from(turns.total()).unwrap_or(0) >= SIDE_BY_SIDE_UNDER
            || allowed - self.taken_under(b) - in_flight <= 0
        {
            return None;
        }
        Some(turns.hold(&self.turns, key.to_owned(), None))
    }

    /// The evictions this controller made under `b`'s cached version.
    fn taken_under(&self, b: &PodDisruptionBudget) -> i32 {
        self.taken_lock()
            .get(&budget_key(b))
            .filter(|(version, _)| *version == b.metadata.resource_version)
            .map_or(0, |(_, n)| *n)
    }

    /// The turns held under the budget `key`, but `mine` (the caller's own).
    fn in_flight_besides(&self, key: &str, mine: Option<&Turn>) -> i32 {
        let held = self
            .turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .in_flight
            .get(key)
            .copied()
            .unwrap_or(0);
        held - i32::from(mine.is_some_and(|t| t.budget == key))
    }

    fn taken_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Taken>> {
        self.taken
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `b` allows no disruption now: its status as of its current
    /// generation says so ([`allows_none`]), or says it allows as many as
    /// this controller has evicted under it since the cache got that
    /// version and has in flight under it (besides `mine`, the caller's
    /// own turn).
    fn allows_none_now(&self, b: &PodDisruptionBudget, mine: Option<&Turn>) -> bool {
        let Some(status) = current_status(b) else {
            return false;
        };
        let taken = self.taken_under(b) + self.in_flight_besides(&budget_key(b), mine);
        status.disruptions_allowed.unwrap_or(0) - taken <= 0
    }

    /// What the budgets selecting a pod (`selecting`, from the cache) allow
    /// now to the holder of `mine`: see [`Allows`].
    fn allows(&self, selecting: &[Arc<PodDisruptionBudget>], mine: Option<&Turn>) -> Allows {
        if selecting.is_empty() || !selecting.iter().all(|b| self.allows_none_now(b, mine)) {
            Allows::Some
        } else if selecting.iter().any(|b| !allows_none(b)) {
            Allows::CatchingUp
        } else {
            Allows::None
        }
    }

    /// Whether one of `budgets` (`namespace/name`) allows a disruption in
    /// `cache` now, counting this controller's evictions under its cached
    /// version ([`Refusals::allows`]).
    pub fn any_allows(
        &self,
        cache: &Store<PodDisruptionBudget>,
        budgets: &std::collections::BTreeSet<String>,
    ) -> bool {
        budgets.iter().any(|key| {
            let Some((ns, name)) = key.split_once('/') else {
                return false;
            };
            cache
                .get(&ObjectRef::new(name).within(ns))
                .is_some_and(|b| !self.allows_none_now(&b, None))
        })
    }

    /// Tells the evictions waiting for the budget cache to show a
    /// budget's next version that it changed (called by the budget watch,
    /// after the cache took the change).
    pub fn budget_changed(&self) {
        self.changed.notify_waiters();
    }

    /// Whether `pod` is to be asked for whatever the cache says of its
    /// budgets (`selecting`, from the cache) at `now`: the API server
    /// refused it, and the cache has shown no version of its budgets since,
    /// for the whole of its floor. When the cache shows another version,
    /// that version is believed over the refusal and the floor starts again
    /// from it (its length unchanged).
    fn insist(
        &self,
        pod: &PodInfo,
        selecting: &[Arc<PodDisruptionBudget>],
        now: tokio::time::Instant,
    ) -> bool {
        let mut map = self.lock();
        let Some(r) = map.get_mut(&Self::key(pod)) else {
            return false;
        };
        let seen = versions_of(selecting);
        if seen != r.seen {
            r.seen = seen;
            r.next = now + floor_after(r.count);
            return false;
        }
        now >= r.next
    }

    /// Notes an eviction under `b` (as the cache had it when it was sent).
    fn took(&self, b: &PodDisruptionBudget) {
        let mut taken = self.taken_lock();
        match taken.get_mut(&budget_key(b)) {
            Some((version, n)) if *version == b.metadata.resource_version => *n += 1,
            _ => {
                taken.insert(budget_key(b), (b.metadata.resource_version.clone(), 1));
            }
        }
    }

    /// The refusal that stands for `pod` now, without asking: every budget
    /// selecting it (`selecting`, from the cache; at least one) allows no
    /// disruption, and it is not to be asked regardless ([`Self::insist`]).
    fn standing(
        &self,
        pod: &PodInfo,
        selecting: &[Arc<PodDisruptionBudget>],
        now: tokio::time::Instant,
    ) -> Option<EvictionOutcome> {
        if selecting.is_empty()
            || !selecting.iter().all(|b| allows_none(b))
            || self.insist(pod, selecting, now)
        {
            return None;
        }
        Some(not_asked(selecting))
    }

    /// Records the API server's answer to asking for `pod`'s eviction at
    /// `now` (`selecting`: its budgets as the cache has them then). A pod
    /// not asked for is not recorded: only a refusal by the API server
    /// starts or doubles a floor.
    fn record(
        &self,
        pod: &PodInfo,
        outcome: &EvictionOutcome,
        selecting: &[Arc<PodDisruptionBudget>],
        now: tokio::time::Instant,
    ) {
        let key = Self::key(pod);
        {
            let mut failed = self.failed_lock();
            if matches!(outcome, EvictionOutcome::Retry(_)) || under_several_budgets(outcome) {
                let count = failed.get(&key).map_or(0, |f| f.count).saturating_add(1);
                let next = now + crate::controller::act::refused::backoff(false, count);
                failed.insert(
                    key.clone(),
                    Failed {
                        count,
                        next,
                        last: outcome.clone(),
                    },
                );
            } else {
                failed.remove(&key);
            }
        }
        let mut map = self.lock();
        if matches!(outcome, EvictionOutcome::Blocked { .. }) {
            let count = map.get(&key).map_or(0, |r| r.count).saturating_add(1);
            map.insert(
                key,
                Refused {
                    count,
                    next: now + floor_after(count),
                    seen: versions_of(selecting),
                },
            );
        } else {
            map.remove(&key);
        }
    }

    /// Forgets refusals whose floor ended more than `after` before `now`
    /// (pods gone or drains over), so that the map stays as small as the
    /// drains under way.
    pub fn forget_older(&self, now: tokio::time::Instant, after: Duration) {
        self.lock().retain(|_, r| r.next + after > now);
        self.failed_lock().retain(|_, f| f.next + after > now);
    }

    /// Whether no pod is remembered.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// The refusal of a pod not asked for because every budget selecting it
/// (`selecting`) allows no disruption in the cache. Its message is the same
/// from pass to pass while that lasts: it goes into the event's status, and
/// a status that changed would have the object's watch ask for another pass.
fn not_asked(selecting: &[Arc<PodDisruptionBudget>]) -> EvictionOutcome {
    let budgets: Vec<String> = selecting.iter().map(|b| budget_key(b)).collect();
    EvictionOutcome::Blocked {
        message: format!(
            "not asked: PodDisruptionBudget {} allows no disruption now (asked again as soon as one does)",
            budgets.join(", ")
        ),
        budgets,
    }
}

/// The controller-wide eviction rate budget: a token bucket of `qps`
/// evictions a second with bursts of `burst`, shared by every reconcile.
pub fn rate_limiter(qps: u32, burst: u32) -> Arc<DefaultDirectRateLimiter> {
    let qps = std::num::NonZeroU32::new(qps.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
    let burst = std::num::NonZeroU32::new(burst.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
    Arc::new(RateLimiter::direct(
        Quota::per_second(qps).allow_burst(burst),
    ))
}

/// The refusal to reuse for `pod` when a pod with the same labels (the same
/// workload, so the same PodDisruptionBudgets) was refused by a budget
/// earlier in this pass: asking again at once would get the same 429 and
/// spend the rate budget for nothing.
fn refused_alike(
    refused: &std::sync::Mutex<Vec<(Arc<PodInfo>, EvictionOutcome)>>,
    pod: &PodInfo,
) -> Option<EvictionOutcome> {
    let refused = refused
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    refused
        .iter()
        .find(|(p, _)| {
            p.namespace == pod.namespace && p.labels == pod.labels && !p.labels.is_empty()
        })
        .map(|(_, o)| o.clone())
}

/// How often an eviction waiting for its budget to allow a disruption
/// looks at the budget cache again.
const BUDGET_LOOK_AGAIN: Duration = Duration::from_millis(100);

/// How many nodes' evictions are asked for at once in a pass (each with
/// up to `--max-evictions-per-node` in flight).
pub const NODES_EVICTED_AT_ONCE: usize = 16;

/// What one pass of evictions did.
#[derive(Debug, Default)]
pub struct Evicted {
    /// Each eviction asked for, as [`Outcome`]s.
    pub outcomes: Vec<Outcome>,
    /// Evictions not asked for because the pass's time ran out while they
    /// waited for the rate budget: the next pass plans them again.
    pub deferred: usize,
}

/// Requests `evictions` concurrently, at most `per_node` at once per node,
/// each after a token of `limiter`, until `until`: an eviction still waiting
/// for a token then is deferred to the next pass (so a pass over a
/// 1,000-node event ends within seconds and a node whose report came in
/// meanwhile is cordoned at the next one, instead of after every pod was
/// asked for). Once a PodDisruptionBudget refuses a pod, the pods with the
/// same labels on that node are not asked for in this pass: they share its
/// outcome (see [`refused_alike`]); the next pass asks again. Each pod
/// the API server took the eviction of is marked in `pods` as being
/// deleted ([`PodCache::evicted`]), so that no pass evicts it again before
/// the watch shows it.
pub async fn evict_all(
    client: &Client,
    limiter: &DefaultDirectRateLimiter,
    budgets: (&Store<PodDisruptionBudget>, &Refusals),
    pods: &PodCache,
    evictions: &[Eviction],
    per_node: usize,
    until: tokio::time::Instant,
) -> Evicted {
    let (cache, refusals) = budgets;
    // Indices, by node in the plan's order: an eviction is copied only when
    // it is asked for (a 10,000-pod plan copied whole cost megabytes a pass).
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut by_node: Vec<Vec<usize>> = Vec::new();
    for (i, e) in evictions.iter().enumerate() {
        let n = *index.entry(e.node.as_str()).or_insert_with(|| {
            by_node.push(Vec::new());
            by_node.len() - 1
        });
        by_node[n].push(i);
    }
    drop(index);
    let per_node = per_node.max(1);
    let node = |list: Vec<usize>| async move {
        let refused = std::sync::Mutex::new(Vec::new());
        let refused = &refused;
        futures::stream::iter(list)
            .map(|i| {
                let e = evictions[i].clone();
                async move {
                    if let Some(o) = refused_alike(refused, &e.pod) {
                        return Some((e.node, e.pod.key(), o));
                    }
                    let now = tokio::time::Instant::now();
                    if let Some(o) = refusals.failing(&e.pod, now) {
                        return Some((e.node, e.pod.key(), o));
                    }
                    let selecting = budgets_of(cache, &e.pod);
                    if let Some(o) = refusals.standing(&e.pod, &selecting, now) {
                        return Some((e.node, e.pod.key(), o));
                    }
                    // Past the pass's time, nothing more is asked for (a
                    // token already there would otherwise be spent).
                    // Waiting for the budget's turn or a token is
                    // cancel-safe: a deferred eviction spends neither.
                    if tokio::time::Instant::now() >= until {
                        return None;
                    }
                    let turn = tokio::time::timeout_at(until, refusals.turn(&selecting))
                        .await
                        .ok()?;
                    // A pod whose budgets allow none is not asked: it
                    // counts as refused at once and the pass goes on to its
                    // status write (the budget watch wakes the drain when
                    // one allows a disruption again: a replacement becoming
                    // Ready, which may take minutes). It waits, within the
                    // pass's time, only while the budget's status still
                    // allows what this controller's evictions before it in
                    // the budget's turn took: the cache shows the budget's
                    // next version within moments, and the budget watch
                    // tells the waiting pod at once (`changed`). A refused
                    // pod whose budgets the cache has not shown change for
                    // its whole floor is asked whatever the cache says: the
                    // floor stands against a cache that missed a change.
                    let insist = refusals.insist(&e.pod, &selecting, tokio::time::Instant::now());
                    let (selecting, allows) = loop {
                        let changed = refusals.changed.notified();
                        tokio::pin!(changed);
                        // Registered before the look: a change after it
                        // ends the wait below.
                        changed.as_mut().enable();
                        let selecting = budgets_of(cache, &e.pod);
                        let allows = if insist {
                            Allows::Some
                        } else {
                            refusals.allows(&selecting, turn.as_ref())
                        };
                        if allows != Allows::CatchingUp || tokio::time::Instant::now() >= until {
                            break (selecting, allows);
                        }
                        let _ = tokio::time::timeout_at(
                            (tokio::time::Instant::now() + BUDGET_LOOK_AGAIN).min(until),
                            changed,
                        )
                        .await;
                    };
                    let refused_now = |o: &EvictionOutcome| {
                        if matches!(o, EvictionOutcome::Blocked { .. }) {
                            refused
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .push((e.pod.clone(), o.clone()));
                        }
                    };
                    if allows != Allows::Some {
                        let o = not_asked(&selecting);
                        refused_now(&o);
                        return Some((e.node, e.pod.key(), o));
                    }
                    tokio::time::timeout_at(until, limiter.until_ready())
                        .await
                        .ok()?;
                    let sent_under = budgets_of(cache, &e.pod);
                    let outcome = evict(client, &e, cache).await;
                    // The next eviction in the budget's turn counts this
                    // one's disruption until the cache shows the budget's
                    // next version (asking on the stale count would be
                    // refused).
                    if matches!(outcome, EvictionOutcome::Evicted) {
                        for b in &sent_under {
                            refusals.took(b);
                        }
                        let deadline = Utc::now() + chrono::TimeDelta::seconds(grace_sent(&e));
                        pods.evicted(&e.pod.uid, deadline);
                    }
                    drop(turn);
                    refusals.record(
                        &e.pod,
                        &outcome,
                        &budgets_of(cache, &e.pod),
                        tokio::time::Instant::now(),
                    );
                    refused_now(&outcome);
                    Some((e.node, e.pod.key(), outcome))
                }
            })
            .buffer_unordered(per_node)
            .collect::<Vec<_>>()
            .await
    };
    // A few nodes at once, not every node of the event: 1,000 nodes with 8
    // evictions in flight each held 23 MB of request state and opened
    // hundreds of connections, for a rate budget of about 100 a second.
    let results: Vec<Vec<_>> = futures::stream::iter(by_node)
        .map(node)
        .buffer_unordered(NODES_EVICTED_AT_ONCE)
        .collect()
        .await;
    let mut evicted = Evicted::default();
    for o in results.into_iter().flatten() {
        match o {
            Some(o) => evicted.outcomes.push(o),
            None => evicted.deferred += 1,
        }
    }
    evicted
}

/// The longest `Retry-After` among throttled evictions, if any.
pub fn throttled_for(outcomes: &[Outcome]) -> Option<Duration> {
    outcomes
        .iter()
        .filter_map(|(_, _, o)| match o {
            EvictionOutcome::Throttled {
                retry_after_seconds,
            } => Some(Duration::from_secs(u64::from(*retry_after_seconds))),
            _ => None,
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use kube::core::response::{StatusCause, StatusDetails};

    #[test]
    fn eviction_body_carries_grace_and_uid_under_delete_options() {
        let e = Eviction {
            node: "n".into(),
            pod: Arc::new(PodInfo {
                namespace: "ns".into(),
                name: "p".into(),
                uid: "uid-1".into(),
                ..PodInfo::default()
            }),
            grace_seconds: 7,
        };
        let v = serde_json::to_value(eviction_body(&e)).unwrap();
        assert_eq!(v["apiVersion"], "policy/v1");
        assert_eq!(v["kind"], "Eviction");
        assert_eq!(v["deleteOptions"]["gracePeriodSeconds"], 7);
        assert_eq!(v["deleteOptions"]["preconditions"]["uid"], "uid-1");
        assert!(v.get("delete_options").is_none());
    }

    fn status(code: u16, message: &str, causes: Vec<(&str, &str)>, retry: u32) -> Status {
        Status {
            code,
            message: message.into(),
            reason: "r".into(),
            details: Some(StatusDetails {
                causes: causes
                    .into_iter()
                    .map(|(r, m)| StatusCause {
                        reason: r.into(),
                        message: m.into(),
                        field: String::new(),
                    })
                    .collect(),
                retry_after_seconds: retry,
                name: String::new(),
                group: String::new(),
                kind: String::new(),
                uid: String::new(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn refusals_are_classified_from_the_answer() {
        let pdb = status(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            vec![(
                "DisruptionBudget",
                "The disruption budget web needs 5 healthy pods and has 5 currently",
            )],
            10,
        );
        assert_eq!(
            classify_refusal(&pdb),
            EvictionOutcome::Blocked {
                budgets: vec!["web".into()],
                message: "The disruption budget web needs 5 healthy pods and has 5 currently"
                    .into()
            }
        );
        let apf = status(429, "Too many requests, please try again later.", vec![], 3);
        assert_eq!(
            classify_refusal(&apf),
            EvictionOutcome::Throttled {
                retry_after_seconds: 3
            }
        );
        let uid = status(
            409,
            // The API server's own words (v1.36), seen on the local cluster.
            "Operation cannot be fulfilled on Pod \"p\": the UID in the precondition (5d28) does not match the UID in record (57d4). The object might have been deleted and then recreated",
            vec![],
            0,
        );
        assert_eq!(classify_refusal(&uid), EvictionOutcome::Gone);
        let conflict = status(
            409,
            "Operation cannot be fulfilled on poddisruptionbudgets",
            vec![],
            0,
        );
        assert!(matches!(
            classify_refusal(&conflict),
            EvictionOutcome::Retry(_)
        ));
        let two = status(
            500,
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            vec![],
            0,
        );
        assert!(matches!(
            classify_refusal(&two),
            EvictionOutcome::Blocked { .. }
        ));
        assert_eq!(
            classify_refusal(&status(404, "not found", vec![], 0)),
            EvictionOutcome::Gone
        );
    }

    #[test]
    fn a_refusal_stands_for_pods_of_the_same_workload_only() {
        let web = |name: &str| PodInfo {
            namespace: "shop".into(),
            name: name.into(),
            labels: Arc::new([("app".to_string(), "web".to_string())].into()),
            ..PodInfo::default()
        };
        let blocked = EvictionOutcome::Blocked {
            budgets: vec!["shop/web".into()],
            message: "needs 5".into(),
        };
        let refused = std::sync::Mutex::new(vec![(Arc::new(web("web-1")), blocked.clone())]);
        assert_eq!(refused_alike(&refused, &web("web-2")), Some(blocked));
        let other = PodInfo {
            labels: Arc::new([("app".to_string(), "db".to_string())].into()),
            ..web("db-1")
        };
        assert_eq!(refused_alike(&refused, &other), None);
        let bare = PodInfo {
            labels: Default::default(),
            ..web("x")
        };
        assert_eq!(
            refused_alike(&refused, &bare),
            None,
            "no labels: nothing in common"
        );
    }

    #[test]
    fn label_selectors_match_like_the_api_server() {
        let labels = [
            ("app".to_string(), "web".to_string()),
            ("tier".to_string(), "a".to_string()),
        ]
        .into();
        let sel = |ml: Option<Vec<(&str, &str)>>, ex: Vec<(&str, &str, Vec<&str>)>| LabelSelector {
            match_labels: ml.map(|v| {
                v.into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            match_expressions: Some(
                ex.into_iter()
                    .map(|(k, op, vs)| LabelSelectorRequirement {
                        key: k.into(),
                        operator: op.into(),
                        values: Some(vs.into_iter().map(String::from).collect()),
                    })
                    .collect(),
            ),
        };
        assert!(selects(&sel(Some(vec![("app", "web")]), vec![]), &labels));
        assert!(!selects(&sel(Some(vec![("app", "db")]), vec![]), &labels));
        assert!(selects(
            &sel(None, vec![("tier", "In", vec!["a", "b"])]),
            &labels
        ));
        assert!(!selects(
            &sel(None, vec![("tier", "NotIn", vec!["a"])]),
            &labels
        ));
        assert!(selects(
            &sel(None, vec![("zone", "DoesNotExist", vec![])]),
            &labels
        ));
        assert!(
            selects(&sel(None, vec![]), &labels),
            "an empty selector selects every pod"
        );
    }

    fn budget(
        name: &str,
        allowed: i32,
        generation: i64,
        observed: Option<i64>,
    ) -> PodDisruptionBudget {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "generation": generation},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "maxUnavailable": 1},
            "status": {"disruptionsAllowed": allowed, "observedGeneration": observed,
                       "currentHealthy": 3, "desiredHealthy": 3, "expectedPods": 3},
        }))
        .unwrap()
    }

    fn web_pod() -> PodInfo {
        PodInfo {
            namespace: "shop".into(),
            name: "web-1".into(),
            uid: "u1".into(),
            labels: Arc::new([("app".to_string(), "web".to_string())].into()),
            ..PodInfo::default()
        }
    }

    #[test]
    fn a_budget_allows_none_only_by_a_status_of_its_current_generation() {
        assert!(allows_none(&budget("b", 0, 2, Some(2))));
        assert!(!allows_none(&budget("b", 1, 2, Some(2))));
        assert!(
            !allows_none(&budget("b", 0, 3, Some(2))),
            "a status of an older spec"
        );
        assert!(
            !allows_none(&budget("b", 0, 2, None)),
            "no status computed yet"
        );
    }

    #[test]
    fn budgets_are_read_from_the_cache_by_namespace_and_selector() {
        let (reader, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(budget(
            "web",
            0,
            1,
            Some(1),
        )));
        let mut other = budget("elsewhere", 0, 1, Some(1));
        other.metadata.namespace = Some("other".into());
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(other));
        let found: Vec<String> = budgets_of(&reader, &web_pod())
            .iter()
            .map(|b| budget_key(b))
            .collect();
        assert_eq!(found, ["shop/web"]);
    }

    /// A blocked drain's budgets are looked up in the cache by
    /// `namespace/name`: one allowing a disruption (not yet taken by this
    /// controller) is found, a shut one, an unknown one or a malformed key
    /// is not.
    #[test]
    fn a_blocked_drains_budgets_are_looked_up_in_the_cache() {
        let (reader, mut writer) = kube::runtime::reflector::store();
        let mut open = budget("web", 1, 1, Some(1));
        open.metadata.resource_version = Some("7".into());
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(open.clone()));
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(budget(
            "api",
            0,
            1,
            Some(1),
        )));
        let refusals = Refusals::default();
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect();
        assert!(refusals.any_allows(&reader, &keys(&["shop/api", "shop/web"])));
        assert!(!refusals.any_allows(&reader, &keys(&["shop/api", "shop/gone", "web"])));
        refusals.took(&open);
        assert!(
            !refusals.any_allows(&reader, &keys(&["shop/web"])),
            "its one disruption taken by this controller"
        );
    }

    /// One eviction in flight per budget (its own turn), and more side by
    /// side only while its cached status allows more than are in flight
    /// under it: a second pod of a budget allowing one waits until the
    /// first one's turn is dropped; another budget's pod and a pod of no
    /// budget never wait; a budget nobody holds is forgotten.
    #[tokio::test]
    async fn each_budget_has_its_turn_and_more_only_while_it_allows_them() {
        let refusals = Refusals::default();
        let web = [Arc::new(budget("web", 1, 1, Some(1)))];
        let api = [Arc::new(budget("api", 5, 1, Some(1)))];
        let first = refusals.turn(&web).await.expect("a budget's turn");
        assert!(refusals.turn(&[]).await.is_none(), "no budget: no turn");
        let other = tokio::time::timeout(Duration::from_secs(5), refusals.turn(&api))
            .await
            .expect("another budget does not wait")
            .expect("another budget's turn");
        assert_eq!(
            refusals.allows(&web, Some(&first)),
            Allows::Some,
            "its own turn counts itself out"
        );
        assert_eq!(
            refusals.allows(&web, None),
            Allows::CatchingUp,
            "another pod waits while its one disruption is in flight"
        );
        let second = tokio::spawn({
            let refusals = refusals.clone();
            async move { refusals.turn(&web).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !second.is_finished(),
            "a budget allowing one gave a second turn"
        );
        drop(first);
        let got = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("the second turn comes once the first is dropped")
            .expect("joined");
        assert!(got);
        // "api" allows 5: four more side by side, then none.
        let mut beside = Vec::new();
        for _ in 0..4 {
            let t = tokio::time::timeout(Duration::from_millis(100), refusals.turn(&api))
                .await
                .expect("side by side while the budget allows more")
                .expect("a turn");
            assert!(t._own.is_none(), "a turn side by side");
            beside.push(t);
        }
        assert_eq!(
            refusals.allows(&api, beside.first()),
            Allows::Some,
            "five in flight under five allowed: each may go"
        );
        assert_ne!(
            refusals.allows(&api, None),
            Allows::Some,
            "a sixth would overdraw the budget"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(50), refusals.turn(&api))
                .await
                .is_err(),
            "a sixth turn while five are in flight under five allowed"
        );
        drop(other);
        drop(beside);
        let db = refusals
            .turn(&[Arc::new(budget("db", 1, 1, Some(1)))])
            .await;
        let turns = refusals.turns.lock().unwrap();
        let kept: Vec<&String> = turns.own.keys().collect();
        assert_eq!(kept, ["shop/db"], "budgets nobody holds are forgotten");
        assert_eq!(turns.total(), 1, "only the dropped turns given back");
        assert_eq!(turns.in_flight.len(), 1, "{:?}", turns.in_flight);
        drop(turns);
        drop(db);
        assert_eq!(refusals.turns.lock().unwrap().total(), 0);
    }

    /// Past [`SIDE_BY_SIDE_UNDER`] evictions in flight controller-wide, a
    /// budget gets no turn side by side, however many it allows: a wave of
    /// many budgets keeps one eviction in flight each.
    #[tokio::test]
    async fn no_turn_side_by_side_while_many_are_in_flight() {
        let refusals = Refusals::default();
        let mut held = Vec::new();
        for i in 0..SIDE_BY_SIDE_UNDER {
            let b = [Arc::new(budget(&format!("b{i}"), 1, 1, Some(1)))];
            held.push(refusals.turn(&b).await.expect("its own turn"));
        }
        let wide = [Arc::new(budget("wide", 50, 1, Some(1)))];
        let own = refusals.turn(&wide).await.expect("its own turn");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), refusals.turn(&wide))
                .await
                .is_err(),
            "a turn side by side with {} in flight",
            SIDE_BY_SIDE_UNDER + 1
        );
        held.truncate(1);
        let beside = tokio::time::timeout(Duration::from_millis(100), refusals.turn(&wide))
            .await
            .expect("side by side once few are in flight")
            .expect("a turn");
        assert!(beside._own.is_none());
        drop(own);
    }

    /// The evictions this controller made under a budget count against
    /// what the cached version allows until the cache shows a newer one.
    #[test]
    fn evictions_count_against_the_cached_budget_until_its_next_version() {
        let refusals = Refusals::default();
        let mut b = budget("web", 2, 1, Some(1));
        b.metadata.resource_version = Some("10".into());
        assert!(!refusals.allows_none_now(&b, None));
        refusals.took(&b);
        assert!(!refusals.allows_none_now(&b, None), "one of two taken");
        refusals.took(&b);
        assert!(
            refusals.allows_none_now(&b, None),
            "both taken, the cache not caught up"
        );
        let mut next = budget("web", 1, 1, Some(1));
        next.metadata.resource_version = Some("11".into());
        assert!(
            !refusals.allows_none_now(&next, None),
            "a newer version counts afresh"
        );
        let stale = budget("web", 3, 2, Some(1));
        assert!(
            !refusals.allows_none_now(&stale, None),
            "a status of an older generation says nothing"
        );
    }

    /// A pod is asked for while a budget allows a disruption; it waits for
    /// the cache only while this controller's own evictions took what the
    /// cached status allows, and not when the status itself allows none.
    #[test]
    fn a_pod_waits_for_the_cache_only_after_its_budgets_own_evictions() {
        let refusals = Refusals::default();
        let mut open = budget("web", 1, 1, Some(1));
        open.metadata.resource_version = Some("10".into());
        let open = [Arc::new(open)];
        assert_eq!(refusals.allows(&open, None), Allows::Some);
        assert_eq!(refusals.allows(&[], None), Allows::Some, "no budget");
        refusals.took(&open[0]);
        assert_eq!(refusals.allows(&open, None), Allows::CatchingUp);
        let mut after = budget("web", 0, 1, Some(1));
        after.metadata.resource_version = Some("11".into());
        assert_eq!(
            refusals.allows(&[Arc::new(after.clone())], None),
            Allows::None
        );
        let other = Arc::new(budget("api", 1, 1, Some(1)));
        assert_eq!(
            refusals.allows(&[Arc::new(after), other], None),
            Allows::Some,
            "another budget allows one"
        );
    }

    /// `b` as the cache holds it at `resourceVersion` `version`.
    fn at_version(mut b: PodDisruptionBudget, version: &str) -> Arc<PodDisruptionBudget> {
        b.metadata.resource_version = Some(version.into());
        Arc::new(b)
    }

    /// A pod whose budgets allow none is not asked, refused before or not.
    /// A refused pod is asked again at once when the cache shows a budget
    /// allowing one; whatever the cache says only once its budgets stayed
    /// at the version of the refusal for its whole floor (1 s doubling to
    /// 16 s); a newer version allowing none is believed and starts the floor
    /// again. Forgotten once evicted.
    #[test]
    fn a_refused_pod_waits_for_its_budget_or_an_unchanged_cache_for_its_floor() {
        let refusals = Refusals::default();
        let pod = web_pod();
        let shut = [at_version(budget("web", 0, 1, Some(1)), "10")];
        let shut_later = [at_version(budget("web", 0, 1, Some(1)), "11")];
        let open = [at_version(budget("web", 1, 1, Some(1)), "12")];
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        assert!(
            refusals.standing(&pod, &shut, t0).is_some(),
            "never refused, but the cache says none: not asked"
        );
        assert_eq!(
            refusals.standing(&pod, &open, t0),
            None,
            "never refused, the budget allows one: asked"
        );
        let refused = EvictionOutcome::Blocked {
            budgets: vec!["shop/web".into()],
            message: "m".into(),
        };
        refusals.record(&pod, &refused, &shut, t0);
        let standing = refusals.standing(&pod, &shut, t0 + ms(500));
        assert!(
            matches!(&standing, Some(EvictionOutcome::Blocked { budgets, .. }) if budgets == &["shop/web"]),
            "{standing:?}"
        );
        assert_eq!(
            refusals.standing(&pod, &open, t0),
            None,
            "the budget allows one: asked at once"
        );
        assert_eq!(
            refusals.standing(&pod, &[], t0),
            None,
            "no budget known: asked"
        );
        assert_eq!(
            refusals.standing(&pod, &shut, t0 + ms(1_000)),
            None,
            "the cache stayed at the refusal's version for the floor: asked"
        );
        // A version after the refusal that allows none is believed: the
        // floor starts again from when the cache showed it.
        assert!(refusals.standing(&pod, &shut_later, t0 + ms(600)).is_some());
        assert!(
            refusals
                .standing(&pod, &shut_later, t0 + ms(1_599))
                .is_some(),
            "the floor started again at 600 ms"
        );
        assert_eq!(
            refusals.standing(&pod, &shut_later, t0 + ms(1_600)),
            None,
            "unchanged since for a floor: asked"
        );
        // Refused again: the floor doubles, up to 16 s.
        for (n, floor) in [(2, 2), (3, 4), (4, 8), (5, 16), (6, 16)] {
            let t = t0 + Duration::from_secs(100 * n);
            refusals.record(&pod, &refused, &shut, t);
            assert!(
                refusals
                    .standing(&pod, &shut, t + Duration::from_secs(floor) - ms(1))
                    .is_some(),
                "refusal {n}"
            );
            assert_eq!(
                refusals.standing(&pod, &shut, t + Duration::from_secs(floor)),
                None,
                "refusal {n}"
            );
        }
        refusals.record(&pod, &EvictionOutcome::Evicted, &shut, t0);
        assert!(refusals.is_empty());
        refusals.record(&pod, &refused, &shut, t0);
        refusals.forget_older(t0 + Duration::from_secs(400), Duration::from_secs(300));
        assert!(refusals.is_empty(), "a refusal long over is forgotten");
    }

    #[test]
    fn a_pod_whose_eviction_a_webhook_denies_is_asked_again_on_a_growing_backoff() {
        let refusals = Refusals::default();
        let pod = web_pod();
        let t0 = tokio::time::Instant::now();
        let denied = classify_refusal(&Status {
            code: 403,
            reason: "Forbidden".into(),
            message: "admission webhook \"deny-evictions.example.com\" denied the request".into(),
            ..Status::default()
        });
        assert!(matches!(denied, EvictionOutcome::Retry(_)), "{denied:?}");
        assert_eq!(refusals.failing(&pod, t0), None, "never failed: asked");
        // Polled every second for ten minutes: asked at 1, 2, 4... s apart,
        // up to a minute; a failure counts only when asked.
        let mut asked = 0;
        let mut t = t0;
        let end = t0 + Duration::from_secs(600);
        while t < end {
            if refusals.failing(&pod, t).is_none() {
                asked += 1;
                refusals.record(&pod, &denied, &[], t);
            } else {
                let w = refusals.failing(&pod, t).unwrap();
                assert!(
                    matches!(&w, EvictionOutcome::Waiting(why) if why.contains("deny-evictions")),
                    "{w:?}"
                );
            }
            t += Duration::from_secs(1);
        }
        assert!(
            (8..=16).contains(&asked),
            "asked {asked} times in ten minutes of one-second polls"
        );
        // Evicted at last (the webhook let it go): forgotten.
        refusals.record(&pod, &EvictionOutcome::Evicted, &[], end);
        assert_eq!(refusals.failing(&pod, end), None);
        // A budget's refusal is not a failure of this kind.
        let blocked = EvictionOutcome::Blocked {
            budgets: vec!["shop/web".into()],
            message: "m".into(),
        };
        refusals.record(&pod, &blocked, &[], end);
        assert_eq!(refusals.failing(&pod, end), None);
        // A pod under several budgets is: no budget's allowance lets it
        // go, and it is given its refusal as it stands until its backoff
        // passed, not asked again at every pass while both budgets allow a
        // disruption.
        let several = classify_refusal(&Status {
            code: 500,
            reason: "InternalError".into(),
            message: "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into(),
            ..Status::default()
        });
        assert!(under_several_budgets(&several), "{several:?}");
        refusals.record(&pod, &several, &[], end);
        assert_eq!(refusals.failing(&pod, end), Some(several.clone()));
        assert_eq!(
            refusals.failing(&pod, end + Duration::from_secs(1)),
            None,
            "asked again after a second"
        );
        assert!(!under_several_budgets(&blocked));
    }
}
