//! The local-cluster harness behind `make demo` and the integration tests
//! (feature `harness`, never in the shipped binary): start a real control
//! plane on loopback, play a scenario, and check the rules from outside.

pub mod cluster;
pub mod procs;
pub mod run;
