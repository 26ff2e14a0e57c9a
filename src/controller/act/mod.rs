//! The writes: nodes cordoned, tainted and released, pods evicted, the
//! `ScheduledEvent`'s spec and status, notices to workloads, the node
//! condition, the topology labels, Kubernetes Events and webhooks.

pub mod carry_out;
pub mod cordon;
pub mod cordons_first;
pub mod drain;
pub mod foreign;
pub mod kube_events;
pub mod labels;
pub mod latest;
pub mod node_condition;
pub mod notice;
pub mod out_of_service;
pub mod publish;
pub mod refused;
pub mod restarts;
pub mod spec;
pub mod witnesses;
pub mod writers;
