//! Tracing set-up shared by the binaries: `RUST_LOG` filter (default `info`), the Oxide SDK
//! capped at `info` whatever `RUST_LOG` says (unless `OXIDE_CONTROLLER_SDK_DEBUG=1`: at
//! `debug` it logs request bodies), human-readable output on a terminal, JSON lines otherwise (CronJob logs) or when asked. Logs go to stderr
//! so stdout stays for results (`--dry-run` tables, JSON output).

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Text on a terminal, JSON otherwise.
    #[default]
    Auto,
    Text,
    Json,
}

/// The variable that lets the Oxide SDK log at `debug` and below.
pub const SDK_DEBUG_ENV: &str = "OXIDE_CONTROLLER_SDK_DEBUG";

/// Installs the global subscriber. Safe to call more than once (later calls do nothing).
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let ansi = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let sdk_debug = std::env::var_os(SDK_DEBUG_ENV).is_some_and(|v| v == "1");
    if subscriber(filter, sdk_debug, json, ansi, std::io::stderr)
        .try_init()
        .is_ok()
        && sdk_debug
    {
        tracing::warn!(
            "{SDK_DEBUG_ENV}=1: the Oxide SDK logs request bodies (cloud-init user data, etcd snapshots) at debug; unset it when done"
        );
    }
}

/// The subscriber [`init`] installs: `filter` (from `RUST_LOG`), and below it a cap on the
/// Oxide SDK ([`sdk_cap`]) that no `RUST_LOG` lifts.
fn subscriber<W>(
    filter: tracing_subscriber::EnvFilter,
    sdk_debug: bool,
    json: bool,
    ansi: bool,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .with_target(false);
    if json {
        Box::new(
            builder
                .json()
                .flatten_event(true)
                .finish()
                .with(sdk_cap(sdk_debug)),
        )
    } else {
        Box::new(builder.finish().with(sdk_cap(sdk_debug)))
    }
}

/// Caps the Oxide SDK's own events and spans (target `oxide`: its `ClientHooks::exec` logs
/// the first KiB of every request body at `debug`, and request bodies carry cloud-init user
/// data and etcd snapshots) at `info`, unless `sdk_debug`. Not an `oxide=info` directive:
/// directive targets match by prefix, so that would cap `oxide_controller` too.
fn sdk_cap(
    sdk_debug: bool,
) -> tracing_subscriber::filter::FilterFn<impl Fn(&tracing::Metadata<'_>) -> bool> {
    tracing_subscriber::filter::filter_fn(move |meta| {
        let target = meta.target();
        let sdk = target == "oxide" || target.starts_with("oxide::");
        sdk_debug || !sdk || *meta.level() <= tracing::Level::INFO
    })
}

/// Whether text output may carry ANSI colours: only on a terminal, and not when `NO_COLOR`
/// is set to a non-empty value (no-color.org). Piped into a file or `less`, text logs are
/// plain.
pub fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }

    /// What a subscriber built by [`subscriber`] writes, one buffer shared with the test.
    #[derive(Clone, Default)]
    struct Capture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Events as the SDK's `ClientHooks::exec` and this crate emit them, through a
    /// subscriber with `RUST_LOG=<rust_log>`; what came out.
    fn logged(rust_log: &str, sdk_debug: bool, json: bool) -> String {
        let out = Capture::default();
        let writer = out.clone();
        let sub = subscriber(
            tracing_subscriber::EnvFilter::new(rust_log),
            sdk_debug,
            json,
            false,
            move || writer.clone(),
        );
        tracing::subscriber::with_default(sub, || {
            tracing::debug!(target: "oxide", operation_id = "instance_create", http.request.body = "BODY-SECRET", "request succeeded");
            tracing::info!(target: "oxide", "sdk info");
            tracing::warn!(target: "oxide::generated", "sdk warn");
            tracing::debug!(target: "oxide_controller::adapters::oxide_rack", "own debug");
            tracing::debug!(target: "scale", "binary debug");
        });
        let text = out.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8_lossy(&text).into_owned()
    }

    /// Audit L5: `RUST_LOG=debug` (or `oxide=trace`) does not make the SDK log request
    /// bodies; this crate's and the binaries' debug events still come through (an
    /// `oxide=info` directive would have capped `oxide_controller` too: prefix match).
    #[test]
    fn the_oxide_sdk_is_capped_at_info_whatever_rust_log_says() {
        for rust_log in ["debug", "trace", "oxide=trace,debug", "oxide=debug"] {
            for json in [false, true] {
                let text = logged(rust_log, false, json);
                assert!(!text.contains("BODY-SECRET"), "{rust_log}: {text}");
                assert!(text.contains("sdk info"), "{rust_log}: {text}");
                assert!(text.contains("sdk warn"), "{rust_log}: {text}");
                if rust_log != "oxide=debug" {
                    assert!(text.contains("own debug"), "{rust_log}: {text}");
                    assert!(text.contains("binary debug"), "{rust_log}: {text}");
                }
            }
        }
        // Asked for explicitly: the SDK's debug comes through.
        assert!(logged("debug", true, false).contains("BODY-SECRET"));
        // RUST_LOG still filters the SDK below the cap.
        assert!(!logged("warn", false, false).contains("sdk info"));
    }
}
