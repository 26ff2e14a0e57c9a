//! Azure's Instance Metadata Service: the Scheduled Events document, a client
//! for it, and a scenario-driven imitation for demos and tests.

pub mod client;
pub mod mock;
pub mod model;
pub mod scenario;
