//! Log lines: tracing events on stderr, as text or JSON, filtered by `LEASEWRAP_LOG` or else by
//! `-q`/`-v`. stdout belongs to the child and is never written.
//!
//! `LEASEWRAP_LOG` takes `target=level` directives separated by commas, and a bare level for
//! everything else (`debug`, `leasewrap=debug,h2=info`): tracing's `Targets` filter, which needs
//! no regular expressions and so keeps the process small.

use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

use crate::cli::{LogArgs, LogFormat};

/// Install the subscriber for this process.
pub fn init(args: &LogArgs) {
    let level = match (args.quiet, args.verbose) {
        (true, _) => "error",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    let filter: Targets = std::env::var("LEASEWRAP_LOG")
        .ok()
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| {
            format!("leasewrap={level}")
                .parse()
                .expect("a valid directive")
        });
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    let registry = tracing_subscriber::registry().with(filter);
    match args.log_format {
        LogFormat::Text => registry.with(fmt.with_ansi(false)).init(),
        LogFormat::Json => registry.with(fmt.json().flatten_event(true)).init(),
    }
}
