//! Logging set-up: `tracing` with an `EnvFilter` and a plain or JSON format.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Installs the global subscriber. `level` is `EnvFilter` syntax
/// (e.g. `info,forewarn=debug`); `RUST_LOG`, when set, wins over it.
///
/// # Errors
/// When `level` is not valid filter syntax, or a subscriber is already set.
pub fn init(format: LogFormat, level: &str) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(v)?,
        _ => EnvFilter::try_new(level)?,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(|e| anyhow::anyhow!("failed to install the log subscriber: {e}"))
}
