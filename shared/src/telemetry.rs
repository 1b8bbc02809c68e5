//! Tracing set-up shared by the binaries: `RUST_LOG` filter (default `info`), human-readable
//! output on a terminal, JSON lines otherwise (CronJob logs) or when asked. Logs go to stderr
//! so stdout stays for results (`--dry-run` tables, JSON output).

use std::io::IsTerminal;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Text on a terminal, JSON otherwise.
    #[default]
    Auto,
    Text,
    Json,
}

/// Installs the global subscriber. Safe to call more than once (later calls do nothing).
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

/// Runs a binary's async body on a multi-threaded tokio runtime; a runtime that cannot start
/// is a retryable failure (exit 1).
pub fn block_on<F: std::future::Future<Output = std::process::ExitCode>>(
    body: F,
) -> std::process::ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(body),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
