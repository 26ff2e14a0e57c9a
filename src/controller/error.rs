//! The errors of one pass; every one is retried with backoff
//! ([`crate::controller::runtime::run::error_backoff`]).

use crate::controller::observe::pod_list;

/// Errors of one reconcile; all are retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Cordoning, uncordoning or recording a hold failed (409: someone wrote
    /// the node since it was read; retried at once).
    #[error("failed to patch node {node}: {source}")]
    PatchNode {
        /// Node name.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Listing a node's pods failed.
    #[error(transparent)]
    ListPods(#[from] pod_list::Error),
    /// Writing the status failed.
    #[error("failed to patch status of ScheduledEvent {name}: {source}")]
    PatchStatus {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Creating a `ScheduledEvent` or writing its spec failed.
    #[error("failed to write ScheduledEvent {name}: {source}")]
    WriteEvent {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Deleting an expired object failed.
    #[error("failed to delete ScheduledEvent {name}: {source}")]
    DeleteEvent {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// A short, closed-set name for metrics (`reason` label).
    pub fn category(&self) -> &'static str {
        match self {
            Error::PatchNode {
                source: kube::Error::Api(s),
                ..
            }
            | Error::PatchStatus {
                source: kube::Error::Api(s),
                ..
            }
            | Error::WriteEvent {
                source: kube::Error::Api(s),
                ..
            } if s.code == 409 => "conflict",
            Error::PatchNode { .. } => "patch_node",
            Error::ListPods(_) => "list_pods",
            Error::PatchStatus { .. } => "patch_status",
            Error::DeleteEvent { .. } => "delete_event",
            Error::WriteEvent { .. } => "write_event",
        }
    }
}

/// `Result` with the pass's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
