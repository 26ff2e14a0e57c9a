//! The controller: for every `ScheduledEvent`, cordon and drain the affected
//! nodes, decide the approval once they are drained, and uncordon them when
//! the event is over. Acts only while it holds the leader-election Lease.
//!
//! One direction of flow (docs/architecture.md draws it): [`observe`] reads
//! what a pass knows, [`decide`] turns it into a plan and a status (pure),
//! [`act`] writes them; [`reconcile`] is one pass, observe -> decide -> act
//! -> report, and [`runtime`] is the process around the passes (wiring,
//! leader election, reloads, sweeps).

pub mod act;
pub mod context;
pub mod decide;
pub mod error;
pub mod observe;
pub mod reconcile;
pub mod runtime;

pub use runtime::run::run;
