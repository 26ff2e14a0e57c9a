//! The local-cluster harness behind `make demo`, `make bench` and the
//! integration tests, a crate of its own beside the product (never in the
//! shipped binary): start a real control plane on loopback, play a
//! scenario, and check the rules from outside.

pub mod cluster;
pub mod inspect;
pub mod procs;
pub mod run;
