//! Log lines: tracing events on stderr, as text or JSON, filtered by `LEASEWRAP_LOG` (an
//! EnvFilter directive) or else by `-q`/`-v`. stdout belongs to the child and is never written.

use tracing_subscriber::EnvFilter;

use crate::cli::{LogArgs, LogFormat};

/// Install the subscriber for this process.
pub fn init(args: &LogArgs) {
    let level = match (args.quiet, args.verbose) {
        (true, _) => "error",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    let filter = std::env::var("LEASEWRAP_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(format!("leasewrap={level}")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match args.log_format {
        LogFormat::Text => builder.with_ansi(false).init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
