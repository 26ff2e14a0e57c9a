//! A mounted file watched for changes of its content: a ConfigMap or
//! Secret volume swaps a symlink, so the content, not the modification
//! time, is compared, once every [`POLL_INTERVAL`].

use std::time::Duration;

/// How often a watched file is read.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// The last content of a file looked at, to act once per change (of its
/// content or of its read error).
#[derive(Debug)]
pub struct Changes {
    /// The content last seen, or the read error's text.
    last: Result<String, String>,
}

impl Changes {
    /// Starts from `initial`, the content in force.
    pub fn new(initial: String) -> Self {
        Changes { last: Ok(initial) }
    }

    /// `read` when it differs from the last one looked at, else `None`.
    pub fn changed(&mut self, read: std::io::Result<String>) -> Option<std::io::Result<String>> {
        let now = read.as_ref().map(Clone::clone).map_err(ToString::to_string);
        if now == self.last {
            return None;
        }
        self.last = now;
        Some(read)
    }
}

/// Reads `path` off the runtime's threads.
pub async fn read(path: &std::path::Path) -> std::io::Result<String> {
    let file = path.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::read_to_string(file))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}
