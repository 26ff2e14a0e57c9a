//! The local-cluster harness behind `make demo`, `make bench` and the
//! integration tests, a crate of its own beside the product (never in the
//! shipped binary): start a real control plane on loopback, play a
//! scenario, and check the rules from outside.
//!
//! [`run::run_scenario`] plays a scenario as [`options::RunOptions`] say
//! and returns a [`report::Report`]; [`cluster`] starts the control plane,
//! [`procs`] forewarn's processes.

pub mod agent_pods;
pub mod audit;
pub mod bench_report;
pub mod cluster;
mod faults;
pub mod inspect;
mod notices;
mod observe;
pub mod options;
mod outage;
pub mod procs;
pub mod report;
pub mod run;
pub mod soak;
mod timeline;
pub mod wave;
pub mod workload;

/// A watch of every version of one kind, as the observer keeps them.
pub use observe::{AbortOnDrop, spawn_watch};

/// The tests' fixtures (a `ScheduledEventSpec` builder): the library's
/// own, which the harness turns on (feature `test-fixtures`).
pub use forewarn::fixtures;
