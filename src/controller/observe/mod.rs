//! What one pass knows: the caches of the cluster, the agents' reports
//! judged, the pods a drain considers, the nodes' heartbeats and restarts.
//! Read only: nothing here writes to the API server.

pub mod caches;
pub mod created;
pub mod event;
pub mod facts;
pub mod heartbeats;
pub mod impact;
pub mod intake;
pub mod namespaces;
pub mod nodes;
pub mod observed;
pub mod participants;
pub mod pod_list;
pub mod pods;
pub mod reports;
pub mod trust;
pub mod watch;
