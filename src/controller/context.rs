//! What the passes share, split by need: what they read
//! ([`Caches`]), what they write through ([`Writers`]), and what the
//! controller remembers between passes ([`Memory`]). Each step takes only
//! the part it uses; the reconcile and the runtime's tasks hold the whole.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use kube::ResourceExt;

use crate::controller::act::carry_out::BlocksAnnounced;
use crate::controller::act::drain;
use crate::controller::act::node_condition::Written;
use crate::controller::act::publish::Announced;
use crate::controller::act::writers::Writers;
use crate::controller::observe::caches::Caches;
use crate::controller::observe::heartbeats::Trigger;
use crate::controller::runtime::reload;
use crate::policy::Policy;

/// What every pass shares.
pub struct Context {
    /// What a pass reads.
    pub caches: Caches,
    /// What a pass writes through.
    pub writers: Writers,
    /// What the controller remembers between passes.
    pub memory: Memory,
    /// The policy in force; replaced whole when the file changes ([`reload`]).
    pub policy: reload::Shared,
    /// `--max-evictions-per-node`: evictions in flight on one node.
    pub per_node: usize,
    /// Asks for a pass over a `ScheduledEvent` (a restart or a freeze of
    /// one of its nodes just ended).
    pub trigger: Trigger,
}

/// A drain PodDisruptionBudgets block.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlockedDrain {
    /// Consecutive blocked passes, for the blocked drain's backoff.
    pub passes: u32,
    /// The budgets that refused its last pass's evictions,
    /// `namespace/name`.
    pub budgets: BTreeSet<String>,
}

/// The blocked drains, by event name.
pub type Blocked = Arc<Mutex<HashMap<String, BlockedDrain>>>;

/// The bookkeeping of passes, per event; forgotten with the event.
#[derive(Default)]
pub struct Memory {
    /// Consecutive failed passes per object, for exponential backoff.
    pub failures: Mutex<HashMap<String, u32>>,
    /// The events whose evictions a PodDisruptionBudget refused (an entry
    /// lives while the drain is blocked). Shared with the
    /// PodDisruptionBudget watch, which triggers a pass over an event here
    /// when one of the budgets that blocks it allows a disruption.
    pub blocked: Blocked,
    /// The pods a PodDisruptionBudget refused, not asked for again while
    /// their budgets allow none ([`drain::Refusals`]).
    pub refusals: drain::Refusals,
    /// The drains announced without a listed record.
    pub announced: Announced,
    /// The blocked drains announced by an `EvictionBlocked` Warning.
    pub blocks_announced: BlocksAnnounced,
    /// Recent writes of the node condition.
    pub node_conditions: Written,
    /// The node writes the API server refused, each node retried on its
    /// own backoff ([`crate::controller::act::refused`]).
    pub refused: crate::controller::act::refused::RefusedWrites,
}

impl Context {
    /// The policy in force now.
    pub fn policy(&self) -> Arc<Policy> {
        reload::current(&self.policy)
    }

    /// Forgets the bookkeeping of `ScheduledEvent`s no longer cached (deleted
    /// ones): failure counts, blocked-drain passes, drains announced and the
    /// keys of events already counted as observed. Run by the sweep, so these
    /// maps hold about as many entries as there are live events.
    pub fn forget_deleted_events(&self) {
        let live = self.caches.events.state();
        let names: HashSet<String> = live.iter().map(|e| e.name_any()).collect();
        let uids: HashSet<String> = live.iter().filter_map(|e| e.metadata.uid.clone()).collect();
        self.memory
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|name, _| names.contains(name));
        self.memory
            .blocked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|name, _| names.contains(name));
        // A refusal whose floor ended minutes ago is of a pod gone or a
        // drain over.
        self.memory.refusals.forget_older(
            tokio::time::Instant::now(),
            std::time::Duration::from_secs(300),
        );
        self.writers.latest.retain(&names);
        self.memory.refused.retain(&names);
        self.memory.announced.retain(&uids);
        self.memory.blocks_announced.retain(&uids);
        self.writers.metrics.forget_observed_except(&uids);
    }
}
