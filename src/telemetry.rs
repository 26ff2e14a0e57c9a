//! Logging set-up: `tracing` with an `EnvFilter` and a plain or JSON format.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The filter is not `EnvFilter` syntax: correct `RUST_LOG` or
    /// `--log-level` (`FOREWARN_LOG_LEVEL`), whichever `from` names.
    #[error("invalid log filter {filter:?} (from {from}): {source}")]
    Filter {
        /// Where it came from: `RUST_LOG` or `--log-level`.
        from: &'static str,
        /// The filter given.
        filter: String,
        /// The parse error.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber is already set (`init` called twice).
    #[error("failed to install the log subscriber: {source}")]
    Install {
        /// `tracing`'s error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Installs the global subscriber. `level` is `EnvFilter` syntax
/// (e.g. `info,forewarn=debug`); `RUST_LOG`, when set, wins over it.
///
/// # Errors
/// [`Error::Filter`]: `RUST_LOG` or `level` is not valid filter syntax;
/// [`Error::Install`]: a subscriber is already set.
pub fn init(format: LogFormat, level: &str) -> Result<(), Error> {
    let (from, filter) = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => ("RUST_LOG", v),
        _ => ("--log-level", level.to_string()),
    };
    let filter = EnvFilter::try_new(&filter).map_err(|source| Error::Filter {
        from,
        filter,
        source,
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(|source| Error::Install { source })
}
