//! forewarn: Azure Scheduled Events turned into safe Kubernetes node maintenance.
//!
//! A per-node [`agent`] mirrors the VM's IMDS Scheduled Events into
//! cluster-scoped [`crd::ScheduledEvent`] objects and carries out approvals; a
//! leader-elected [`controller`] cordons and drains the affected nodes
//! (honouring PodDisruptionBudgets), decides the approval once they are
//! drained, and uncordons them when the event is over. [`imds::mock`] plays
//! Azure for demos and tests.
#![forbid(unsafe_code)]

pub mod agent;
pub mod cli;
pub mod controller;
pub mod crd;
#[cfg(feature = "harness")]
pub mod harness;
pub mod imds;
pub mod metrics;
pub mod policy;
pub mod server;
pub mod telemetry;
