//! Policy reload: the policy file is read again when its content changes
//! (polled every [`POLL_INTERVAL`]; a ConfigMap volume swaps a symlink, so
//! the content, not the modification time, is compared). A new file that
//! is not a valid policy is refused with an error log and the metric
//! `forewarn_controller_policy_reloads_total{result="refused"}` (and
//! `forewarn_controller_policy_file_refused` is 1 until a valid file is
//! loaded: the alert `ForewarnPolicyReloadRefused`); the policy
//! in force stays until a valid file replaces it.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use tracing::{error, info};

use crate::file_watch::{Changes, POLL_INTERVAL, read};

use crate::metrics::controller::ControllerMetrics;
use crate::policy::{self, Policy};

/// What a look at the file found.
#[derive(Debug)]
pub enum Reload {
    /// The same content as last time (valid or not): nothing to do.
    Unchanged,
    /// New content, a valid policy: put it in force.
    Loaded(Box<Policy>),
    /// New content that cannot be used (unreadable, not YAML, invalid): the
    /// policy in force stays.
    Refused(policy::Error),
}

/// The last policy content looked at, to act once per change.
#[derive(Debug)]
pub struct Watch {
    path: String,
    changes: Changes,
}

impl Watch {
    /// Starts from `initial`, the content the policy in force was read from.
    pub fn new(path: impl Into<String>, initial: String) -> Self {
        Watch {
            path: path.into(),
            changes: Changes::new(initial),
        }
    }

    /// Looks at what reading the file gave: pure, for tests.
    pub fn check(&mut self, read: std::io::Result<String>) -> Reload {
        let Some(read) = self.changes.changed(read) else {
            return Reload::Unchanged;
        };
        match read {
            Err(source) => Reload::Refused(policy::Error::Read {
                path: self.path.clone(),
                source,
            }),
            Ok(text) => match Policy::parse(&text, &self.path) {
                Ok(p) => Reload::Loaded(Box::new(p)),
                Err(e) => Reload::Refused(e),
            },
        }
    }
}

/// The policy in force, shared by the reconciles and the reload task.
pub type Shared = Arc<RwLock<Arc<Policy>>>;

/// The policy in force now.
pub fn current(shared: &Shared) -> Arc<Policy> {
    shared
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// Polls `path` forever; puts each valid new policy in force and calls
/// `changed` (which has every event reconciled again).
pub async fn watch(
    path: PathBuf,
    initial: String,
    shared: Shared,
    metrics: ControllerMetrics,
    changed: impl Fn(),
) {
    let mut w = Watch::new(path.to_string_lossy(), initial);
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    loop {
        tick.tick().await;
        match w.check(read(&path).await) {
            Reload::Unchanged => {}
            Reload::Loaded(p) => {
                info!(policy = ?p, "Policy file changed: the new policy is in force");
                *shared
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(*p);
                metrics.policy_reloads.with_label_values(&["loaded"]).inc();
                metrics.policy_refused.set(0);
                changed();
            }
            Reload::Refused(e) => {
                error!(error = %e, "Refused the changed policy file; the policy in force stays until the file is fixed");
                metrics.policy_reloads.with_label_values(&["refused"]).inc();
                metrics.policy_refused.set(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Action;

    #[test]
    fn a_change_is_loaded_once_and_an_invalid_file_is_refused_until_fixed() {
        let mut w = Watch::new("p.yaml", "defaultAction: Ignore\n".into());
        assert!(matches!(
            w.check(Ok("defaultAction: Ignore\n".into())),
            Reload::Unchanged
        ));
        match w.check(Ok("defaultAction: Drain\n".into())) {
            Reload::Loaded(p) => assert_eq!(p.default_action, Action::Drain),
            other => panic!("expected Loaded, got {other:?}"),
        }
        assert!(matches!(
            w.check(Ok("defaultAction: Drain\n".into())),
            Reload::Unchanged
        ));
        match w.check(Ok("defaultAction: Reboot\n".into())) {
            Reload::Refused(e) => assert!(e.to_string().contains("p.yaml"), "{e}"),
            other => panic!("expected Refused, got {other:?}"),
        }
        // The same bad content is refused once, not on every poll.
        assert!(matches!(
            w.check(Ok("defaultAction: Reboot\n".into())),
            Reload::Unchanged
        ));
        match w.check(Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "gone",
        ))) {
            Reload::Refused(e) => assert!(e.to_string().contains("failed to read"), "{e}"),
            other => panic!("expected Refused, got {other:?}"),
        }
        match w.check(Ok("minGraceSeconds: 0\n".into())) {
            Reload::Refused(e) => assert!(e.to_string().contains("force delete"), "{e}"),
            other => panic!("expected Refused, got {other:?}"),
        }
        match w.check(Ok("defaultAction: DrainAndApprove\n".into())) {
            Reload::Loaded(p) => assert_eq!(p.default_action, Action::DrainAndApprove),
            other => panic!("expected Loaded, got {other:?}"),
        }
    }

    #[test]
    fn the_shared_policy_is_swapped_whole() {
        let shared: Shared = Arc::new(RwLock::new(Arc::new(Policy::default())));
        let before = current(&shared);
        *shared.write().unwrap() = Arc::new(Policy {
            default_action: Action::Ignore,
            ..Policy::default()
        });
        assert_eq!(before.default_action, Action::DrainAndApprove);
        assert_eq!(current(&shared).default_action, Action::Ignore);
    }
}
