//! forewarn: Azure Scheduled Events turned into safe Kubernetes node maintenance.
//!
//! A per-node [`agent`] reports the VM's IMDS Scheduled Events in its own
//! [`api::ScheduledEventReport`]s and carries out approvals; a
//! leader-elected [`controller`] builds each cluster-scoped
//! [`api::ScheduledEvent`] from the reports, cordons and drains the affected nodes
//! (honouring PodDisruptionBudgets), decides the approval once they are
//! drained, and uncordons them when the event is over. Each agent also
//! reports its VM's fault and update domain ([`topology`]), which the
//! controller labels its node with. [`imds::mock`] plays Azure for demos
//! and tests.
#![forbid(unsafe_code)]
// The documentation is for maintainers and built with private items
// (`make lint`), so a public item may point at the private ones it uses.
#![allow(rustdoc::private_intra_doc_links)]

pub mod agent;
pub mod api;
pub mod by_hand;
pub mod cli;
pub mod controller;
pub mod file_watch;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
pub mod http;
pub mod imds;
pub mod install_check;
pub mod kubeclient;
pub mod label_selector;
pub mod metrics;
pub mod metrics_auth;
pub mod notify;
pub mod policy;
pub mod server;
pub mod telemetry;
pub mod text;
pub mod topology;
pub mod values_schema;
pub mod what_if;
pub mod witnesses;
