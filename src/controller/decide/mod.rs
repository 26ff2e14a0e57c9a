//! Pure decisions: from what a pass observed, the plan (which nodes to
//! cordon or release, which pods to evict, whether to approve), the
//! workloads' acknowledgements, and the status to write. No I/O.

pub mod acknowledge;
pub mod manual;
pub mod out_of_service;
pub mod pass;
pub mod plan;
pub mod requeue;
pub mod status;
