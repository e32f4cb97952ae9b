//! leasewrap: run a command as the only holder of a named lease, and stop its whole process tree
//! before the lease can lapse.
//!
//! # Layout
//!
//! - `cli`: clap definitions and value parsers; no I/O.
//! - `config`: a checked `Config` from the command line and the environment.
//! - `error`: the one error enum and the one mapping to exit statuses.
//! - `clock`: CLOCK_BOOTTIME behind one small type.
//! - `lease::timing`: the pure deadline rules (instants and replies in, actions out).
//! - `lease::local`: the flock backend.
//! - `supervise`: the child's process tree, the watchdog that enforces deadlines, and reaping.
//! - `run`: the one loop that ties lease, child and signals together.
//! - `status`: `leasewrap status`, who holds what.
//! - `fence`: `fenced-write` and `fenced-put`, the resource side of fencing.
//! - `notify`: sd_notify messages for systemd.
//! - `log`: tracing on stderr.

pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod fence;
pub mod lease;
pub mod log;
pub mod notify;
pub mod run;
pub mod status;
pub mod supervise;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal};

use crate::config::{process_env, Config};
use crate::error::ExitCodes;
use crate::run::Exit;

/// Parse `args`, run, and say how to exit. Every failure is logged as one line here.
pub fn entry(args: Vec<OsString>) -> Exit {
    // An empty variable counts as unset, as config.rs reads the others; clap would refuse it.
    for key in [
        "LEASEWRAP_TTL",
        "LEASEWRAP_LOCAL_DIR",
        "LEASEWRAP_LOG_FORMAT",
    ] {
        if std::env::var_os(key).is_some_and(|v| v.is_empty()) {
            // Still single-threaded: nothing else reads the environment concurrently.
            std::env::remove_var(key);
        }
    }
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match cli.sub {
        None => run_command(&cli.run),
        Some(cli::Sub::Status(a)) => {
            log::init(&a.log);
            finish(
                block_on(status::run(&a, &process_env)),
                ExitCodes::default(),
            )
        }
        Some(cli::Sub::FencedWrite(a)) => {
            log::init(&a.log);
            finish(fence::write(&a).map(|()| 0), ExitCodes::default())
        }
        Some(cli::Sub::FencedPut(a)) => {
            log::init(&a.log);
            finish(
                block_on(fence::put(&a, &process_env)).map(|()| 0),
                ExitCodes::default(),
            )
        }
    }
}

fn run_command(args: &cli::RunArgs) -> Exit {
    log::init(&args.log);
    let cfg = match Config::from_args(args, &process_env) {
        Ok(cfg) => cfg,
        Err(e) => return fail(e, ExitCodes::default()),
    };
    match block_on(run::run(&cfg)) {
        Ok(exit) => exit,
        Err(e) => fail(e, cfg.codes),
    }
}

/// Run `fut` on a single-threaded runtime; a thread still blocked in flock does not delay exit.
fn block_on<T>(
    fut: impl std::future::Future<Output = Result<T, error::Error>>,
) -> Result<T, error::Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| error::Error::internal("starting the runtime", e))?;
    let result = runtime.block_on(fut);
    runtime.shutdown_background();
    result
}

fn finish(result: Result<u8, error::Error>, codes: ExitCodes) -> Exit {
    match result {
        Ok(code) => Exit::Code(code),
        Err(e) => fail(e, codes),
    }
}

fn usage_error(e: clap::Error) -> Exit {
    use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
    if matches!(e.kind(), DisplayHelp | DisplayVersion) {
        let _ = e.print();
        return Exit::Code(0);
    }
    eprintln!("leasewrap: {}", first_line(&e.to_string()));
    Exit::Code(64)
}

/// clap's message as one line: its first paragraph, which for "the following required arguments
/// were not provided:" includes the list of them.
fn first_line(text: &str) -> String {
    let para: Vec<&str> = text
        .trim_start()
        .lines()
        .map(str::trim)
        .take_while(|l| !l.is_empty())
        .collect();
    match para.join(" ").trim_start_matches("error: ") {
        "" => "bad usage".to_owned(),
        line => line.to_owned(),
    }
}

fn fail(e: error::Error, codes: ExitCodes) -> Exit {
    // A lost lease was logged, with its token, when it was noticed.
    if !matches!(e, error::Error::Lost { .. }) {
        tracing::error!("{e}");
    }
    Exit::Code(e.code(codes))
}

impl Exit {
    /// End the process: exit with the code, or die of the child's signal without a core dump.
    pub fn finish(self) -> ExitCode {
        match self {
            Exit::Code(c) => ExitCode::from(c),
            Exit::Signal(sig) => {
                reraise(sig);
                ExitCode::from(128u8.wrapping_add(sig as u8))
            }
        }
    }
}

/// Die of `sig` the way the child did, so a shell sees the same status. Returns only when the
/// signal does not kill (its default action is to ignore or stop).
fn reraise(sig: Signal) {
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit with a valid struct; lowering RLIMIT_CORE has no memory effects.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
    // SAFETY: restoring the default action installs no handler code.
    let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) };
    let mut set = SigSet::empty();
    set.add(sig);
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
    let _ = nix::sys::signal::raise(sig);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_usage_error_is_one_line_naming_what_is_missing() {
        let text = "error: the following required arguments were not provided:\n  --token <N>\n  <DEST>\n\nUsage: leasewrap fenced-write --token <N> <DEST>\n";
        assert_eq!(
            super::first_line(text),
            "the following required arguments were not provided: --token <N> <DEST>"
        );
        assert_eq!(
            super::first_line("error: unexpected argument '-x' found\n\n  tip: ...\n"),
            "unexpected argument '-x' found"
        );
    }
}
