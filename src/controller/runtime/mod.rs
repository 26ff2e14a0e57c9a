//! The process around the passes: wiring and tasks, leader election,
//! policy reloads, the sweep of orphaned holds, the confinement check.

pub mod confinement;
pub mod gate;
pub mod lease;
pub mod reload;
pub mod run;
pub mod sweep;
