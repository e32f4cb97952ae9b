//! Log lines: tracing events on stderr, as text or JSON, filtered by `LEASEWRAP_LOG` or else by
//! `-q`/`-v`. stdout belongs to the child and is never written.
//!
//! A successful run is silent, as flock and timeout are: WARN and above by default, INFO with
//! `-v`, DEBUG with `-vv`, everything with `-vvv`, ERROR only with `-q`. When stderr is the
//! journal, text lines become journal entries (`journal`) and the default is INFO.
//!
//! `LEASEWRAP_LOG` takes `target=level` directives separated by commas, and a bare level for
//! everything else (`debug`, `leasewrap=debug,h2=info`): tracing's `Targets` filter, which needs
//! no regular expressions and so keeps the process small. A value that is not of that form is
//! named in one warning, and the default applies.

mod journal;

use std::fmt::Write as _;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{self, FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

use crate::cli::{LogArgs, LogFormat};

/// The LOGS section of the man page.
pub const MAN_SECTION: &[(&str, &str)] = &[
    (
        "Quiet success",
        "A run that goes well prints nothing on stderr, as flock(1) and timeout(1): by default leasewrap logs warnings and errors only. -v adds what it does (INFO: on the local backend first that the local backend is used, then waiting for the lease, acquired, released), -vv DEBUG (each renewal), -vvv everything; -q keeps errors only. When stderr is the journal the default is INFO.",
    ),
    (
        "The journal",
        "When stderr is the journal (JOURNAL_STREAM names the device and inode of fd 2, as systemd sets it) and the format is text, leasewrap writes native journal entries on /run/systemd/journal/socket: PRIORITY 3 for ERROR, 4 WARN, 6 INFO, 7 DEBUG and TRACE, SYSLOG_IDENTIFIER=leasewrap, no timestamp of its own, and, where known, LEASEWRAP_NAME, LEASEWRAP_FENCING_TOKEN and LEASEWRAP_LEASE_ID (etcd, hex), so journalctl -p warning and journalctl LEASEWRAP_NAME=NAME work. When that socket cannot be reached, lines on stderr prefixed <N> with the priority (sd-daemon(3)). --log-format json stays JSON lines.",
    ),
    (
        "LEASEWRAP_LOG",
        "Overrides -q and -v: a level (debug) or target=level directives separated by commas (leasewrap=debug,h2=info). Anything else gets one warning naming LEASEWRAP_LOG, and the default applies. A usage or configuration error (64, 78) is shown whatever it says, off included.",
    ),
    (
        "Why a run ended",
        "An error that ends the run is one line with neither time nor level: leasewrap: MESSAGE (with --log-format json an object at level ERROR; on the journal an entry at priority 3), shown even with -q. A run that starts nothing because the lease is held, the wait ran out or KEY is done says so in the same form at INFO, shown with -v (and on the journal): it is what every host but one does each night, and its exit status (75, or 0 with -E 0) says it. A connection failure names the endpoint and says what failed: etcd at 127.0.0.1:2379: connection refused (69); TLS handshake with 127.0.0.1:2379 failed: the server does not speak TLS? (77).",
    ),
    (
        "Waiting",
        "A waiter on etcd logs waiting for the lease with token_once_acquired=N: the fencing token it will hold once its turn comes, not the holder's.",
    ),
];

/// The variable that overrides `-q`/`-v`.
const FILTER_VAR: &str = "LEASEWRAP_LOG";

/// Install the subscriber for this process.
pub fn init(args: &LogArgs) {
    let journal = match args.log_format {
        LogFormat::Text => journal::Journal::for_stderr(),
        LogFormat::Json => None,
    };
    let default = default_level(args, journal.is_some());
    // An empty LEASEWRAP_LOG counts as unset, as the other variables do.
    let (filter, bad) = match std::env::var(FILTER_VAR).ok().filter(|t| !t.is_empty()) {
        Some(text) => match parse_filter(&text) {
            Some(filter) => (filter.with_target(ALWAYS, LevelFilter::ERROR), None),
            None => (only_ours(default), Some(text)),
        },
        None => (only_ours(default), None),
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    let registry = tracing_subscriber::registry().with(filter);
    match args.log_format {
        _ if journal.is_some() => registry.with(journal).init(),
        LogFormat::Text => {
            let lines = Lines {
                format: fmt::format().with_target(false).with_ansi(false),
                escape: crate::text::printable,
                bare_end: true,
            };
            registry.with(fmt.event_format(lines)).init()
        }
        LogFormat::Json => {
            let lines = Lines {
                format: fmt::format().json().flatten_event(true).with_target(false),
                escape: crate::text::json_printable,
                bare_end: false,
            };
            let fields = fmt::format::JsonFields::new();
            registry
                .with(fmt.fmt_fields(fields).event_format(lines))
                .init()
        }
    }
    if let Some(text) = bad {
        let text = crate::text::printable(&text);
        tracing::warn!(
            "{FILTER_VAR}: \"{text}\" is not a filter (write a level like debug, or target=level directives like leasewrap=debug,h2=info); using the default, {default}"
        );
    }
}

/// The target of the line that says why a run ended: printed as the bare `leasewrap: MESSAGE`
/// line (no time, no level), as flock, timeout and etcdctl print theirs.
pub const END: &str = "leasewrap::end";

/// The target of the end line of a usage or configuration error: shown whatever `LEASEWRAP_LOG`
/// says (`off` included), since nothing ran and nothing else would say why.
const ALWAYS: &str = "leasewrap::end::always";

/// How an end line is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The lease held, the wait run out, KEY done: the expected outcome on every host but the one
    /// that ran the job, as quiet as a success (its exit status says it; `-v` shows the line).
    Skip,
    /// An error: shown even with `-q`.
    Error,
    /// A usage or configuration error: shown even where `LEASEWRAP_LOG` silences everything.
    Refused,
}

/// Say why the run ended.
pub fn end(message: &dyn std::fmt::Display, how: Ending) {
    match how {
        Ending::Skip => tracing::info!(target: END, "{message}"),
        Ending::Error => tracing::error!(target: END, "{message}"),
        Ending::Refused => tracing::error!(target: ALWAYS, "{message}"),
    }
}

/// Lines of tracing's own format `F`, with the bare line for [`END`] in the text format, and
/// every character the one escaping rule (`escape`) would escape escaped: a server's error text,
/// a record's field or a path quoted in a message never reaches the terminal raw, whichever
/// format writes it. The line's own newline stays.
struct Lines<F> {
    format: F,
    escape: fn(&str) -> String,
    /// Whether [`END`] lines are the bare `leasewrap: MESSAGE` (text) or of the format (JSON).
    bare_end: bool,
}

impl<S, N, F> FormatEvent<S, N> for Lines<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut line = String::new();
        if self.bare_end && event.metadata().target().starts_with(END) {
            line = format!("leasewrap: {}", message(event));
        } else {
            self.format
                .format_event(ctx, Writer::new(&mut line), event)?;
        }
        let body = line.strip_suffix('\n').unwrap_or(&line);
        writeln!(writer, "{}", (self.escape)(body))
    }
}

/// The `message` field of `event`.
fn message(event: &Event<'_>) -> String {
    struct Message(String);
    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                let _ = write!(self.0, "{value:?}");
            }
        }
    }
    let mut found = Message(String::new());
    event.record(&mut found);
    found.0
}

/// What the run has learnt of its lease, for the journal's fields of every later entry.
#[derive(Default)]
struct Known {
    name: Option<String>,
    token: Option<u64>,
    /// The etcd lease id.
    lease: Option<i64>,
}

static KNOWN: Mutex<Known> = Mutex::new(Known {
    name: None,
    token: None,
    lease: None,
});

fn known() -> std::sync::MutexGuard<'static, Known> {
    KNOWN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Note the lease name, the token and the etcd lease id as they become known (None: not
/// changed), for the journal's LEASEWRAP_* fields.
pub fn note(name: Option<&str>, token: Option<u64>, lease: Option<i64>) {
    let mut known = known();
    if let Some(name) = name {
        known.name = Some(name.to_owned());
    }
    known.token = token.or(known.token);
    known.lease = lease.or(known.lease);
}

/// The level of leasewrap's own events when `LEASEWRAP_LOG` does not say; on the journal,
/// which keeps what it is given and shows what is asked for, INFO.
fn default_level(args: &LogArgs, journal: bool) -> LevelFilter {
    match (args.quiet, args.verbose) {
        (true, _) => LevelFilter::ERROR,
        (false, 0) if journal => LevelFilter::INFO,
        (false, 0) => LevelFilter::WARN,
        (false, 1) => LevelFilter::INFO,
        (false, 2) => LevelFilter::DEBUG,
        (false, _) => LevelFilter::TRACE,
    }
}

fn only_ours(level: LevelFilter) -> Targets {
    Targets::new().with_target("leasewrap", level)
}

/// `LEASEWRAP_LOG` as a filter, when every directive is `LEVEL` or `TARGET=LEVEL`. (`Targets`
/// alone would take a misspelt level, `verbose`, for a target, and so silence everything.)
fn parse_filter(text: &str) -> Option<Targets> {
    let is_level = |s: &str| !s.trim().is_empty() && s.trim().parse::<LevelFilter>().is_ok();
    let well_formed = text.split(',').all(|d| match d.split_once('=') {
        Some((target, level)) => !target.trim().is_empty() && is_level(level),
        None => is_level(d),
    });
    well_formed.then(|| text.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_is_levels_and_target_level_directives_only() {
        for good in [
            "debug",
            "leasewrap=debug,h2=info",
            "warn",
            "off",
            "leasewrap=trace",
        ] {
            assert!(parse_filter(good).is_some(), "{good:?} refused");
        }
        for bad in [
            "verbose",
            "JSON",
            "",
            "leasewrap=loud",
            "=debug",
            "debug,,info",
        ] {
            assert!(parse_filter(bad).is_none(), "{bad:?} accepted");
        }
    }

    #[test]
    fn success_is_silent_by_default_and_each_v_logs_more() {
        let args = |quiet, verbose| LogArgs {
            quiet,
            verbose,
            ..LogArgs::default()
        };
        let level = |quiet, verbose| default_level(&args(quiet, verbose), false);
        assert_eq!(level(false, 0), LevelFilter::WARN);
        assert_eq!(level(false, 1), LevelFilter::INFO);
        assert_eq!(level(false, 2), LevelFilter::DEBUG);
        assert_eq!(level(false, 3), LevelFilter::TRACE);
        assert_eq!(level(true, 0), LevelFilter::ERROR);
        let journal = |quiet, verbose| default_level(&args(quiet, verbose), true);
        assert_eq!(journal(false, 0), LevelFilter::INFO);
        assert_eq!(journal(false, 2), LevelFilter::DEBUG);
        assert_eq!(journal(true, 0), LevelFilter::ERROR);
    }
}
