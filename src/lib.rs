//! leasewrap: run a command as the only holder of a named lease, and stop its whole process tree
//! before the lease can lapse.
//!
//! # Layout
//!
//! - `cli`: clap definitions and value parsers; no I/O.
//! - `config`: a checked `Config` from the command line and the environment.
//! - `config::database`: `--database URL`, the password from `--password-file` or `.pgpass`.
//! - `error`: the one error enum and the one mapping to exit statuses.
//! - `clock`: CLOCK_BOOTTIME behind one small type.
//! - `lease`: taking, keeping and giving back a lease on any backend; knows no processes.
//! - `lease::backend`: the one interface of a backend (lease, records, status, fenced-put).
//! - `lease::keeper`: what a keeper task publishes of its lease (`D`, trouble, loss).
//! - `lease::report`: what a backend reports of a lease (holder, token, waiters), and the holder
//!   record; below the backends and `status`, which renders it.
//! - `lease::timing`: the pure deadline rules (instants and replies in, actions out).
//! - `lease::timing::zk`: ZooKeeper's rule: a Look, a Sync after the leader's PING bound, a Check.
//! - `lease::timing::db`: the database's rule: `D` from a renewal's send; a waiter's takeover
//!   only after the row's version stood still for `L` since a read's answer arrived.
//! - `lease::etcd`: the etcd backend, split as etcd's own `concurrency` package is.
//! - `lease::etcd::client`: dialling, retries, telling 69 from 77, guarded transactions.
//! - `lease::etcd::session`: the lease and the keeper task that renews it.
//! - `lease::etcd::mutex`: queueing the lock key, waiting for the turn, the own-key watch.
//! - `lease::etcd::runs`, `lease::etcd::status`, `lease::etcd::fence`: its records, status, puts.
//! - `lease::local`: the flock backend; `lease::local::held`: its side of `lease::backend`.
//! - `lease::local::runs`, `lease::local::status`: its run records, and `status` of its locks.
//! - `lease::zk`: the ZooKeeper backend; `lease::zk::client`: sessions from the configuration,
//!   bounds, 69/77, the ACL of what it creates, `conf`.
//! - `lease::zk::wire`: ZooKeeper's packets (jute), as pure functions of bytes.
//! - `lease::zk::net`, `lease::zk::tls`, `lease::zk::sasl`: one connection to one member, TLS,
//!   SASL DIGEST-MD5, and the handshake.
//! - `lease::zk::session`: a session over one member at a time: requests, watches, moves, close.
//! - `lease::zk::lock`: the lock recipe (protected ephemeral sequential nodes, czxid token).
//! - `lease::zk::keeper`: the keeper that renews `D` by `timing::zk`.
//! - `lease::zk::runs`, `lease::zk::status`, `lease::zk::fence`: its records, status, puts.
//! - `lease::db`: the database backend (PostgreSQL, MariaDB): waiting, taking, the keeper, the
//!   release.
//! - `lease::db::postgres`: one connection to PostgreSQL and the lease's statements on it.
//! - `lease::db::mariadb`: one connection to MariaDB and the lease's statements on it.
//! - `lease::db::runs`: the run records of `--once` in the lease's database.
//! - `lease::db::status`: `status` of a lease's row.
//! - `supervise`: the child's process tree: resolving COMMAND, starting it, how it ended.
//! - `supervise::watchdog`: the process that is the child's parent and enforces each deadline.
//! - `supervise::kernel`: what the kernel must have (pidfd_open, ...), tried before anything.
//! - `supervise::oversight`: leasewrap's check that the watchdog is not stopped when it must act.
//! - `supervise::protocol`: the fixed frames between leasewrap and the watchdog.
//! - `supervise::spawn`: starting the child without copying the watchdog (a vfork-style clone).
//! - `supervise::tree`: finding, signalling and reaping every descendant.
//! - `run`: the one loop that ties lease, child and signals together.
//! - `runs`: once per scheduled run (--once, --once-per, --metrics-file); starts nothing.
//! - `runs::record`: the run record, its outcomes, and the decision taken from it (pure).
//! - `runs::slot`: the --once-per slot key (pure).
//! - `runs::book`: what one invocation reads, records and reports; the run loop's three calls.
//! - `runs::file`: whole-file replacement without following symlinks.
//! - `runs::metrics`: the node_exporter textfile.
//! - `status`: `leasewrap status`, who holds what; the holder record.
//! - `status::runs`: the last runs of each lease, and `status --once KEY`.
//! - `fence`: `fenced-write` and `fenced-put`, the resource side of fencing.
//! - `fence_sql`: `fence-sql`, the SQL of the database fence (sql/), printed.
//! - `files`: opening leasewrap's small files with no links, FIFOs or foreign files followed.
//! - `notify`: sd_notify messages for systemd.
//! - `log`: tracing on stderr; quiet success; the bare line that says why a run ended.
//! - `log::journal`: native journal entries when stderr is the journal.
//! - `text`: the one escaping rule for untrusted text printed, and argv as a shell types it.
//! - `usage`: bad usage in one line: clap's errors rephrased to say what to do.

pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod fence;
pub mod fence_sql;
pub mod files;
pub mod lease;
pub mod log;
pub mod notify;
pub mod run;
pub mod runs;
pub mod status;
pub mod supervise;
pub mod text;
pub mod usage;

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

use clap::Parser;
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal};

use crate::config::{process_env, Config};
use crate::error::ExitCodes;
use crate::supervise::Exit;

/// Parse `args`, run, and say how to exit. Every failure is logged as one line here.
pub fn entry(args: Vec<OsString>) -> Exit {
    // Not readable or traceable by other processes of the same user, the child included:
    // /proc/PID/environ may hold a password. The watchdog, forked, inherits it; the child
    // execs, which makes it dumpable again.
    let _ = nix::sys::prctl::set_dumpable(false);
    unset_empty_clap_variables();
    let cli = match cli::Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, &args),
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
            finish(fence::write(&a), ExitCodes::default())
        }
        Some(cli::Sub::FencedPut(a)) => {
            log::init(&a.log);
            finish(
                block_on(fence::put(&a, &process_env)).map(|()| 0),
                ExitCodes::default(),
            )
        }
        Some(cli::Sub::FenceSql(a)) => {
            // It has no logging options: a failure to print is logged the default way.
            log::init(&cli::LogArgs::default());
            finish(fence_sql::print(&a), ExitCodes::default())
        }
    }
}

/// An empty variable counts as unset, as config.rs reads the others; clap would refuse it. The
/// names are those clap itself reads (its `env = ...` fallbacks).
fn unset_empty_clap_variables() {
    // Most runs have no empty variable of ours: then the clap command need not be built.
    let ours = |k: &OsString| k.as_bytes().starts_with(cli::ENV_PREFIX.as_bytes());
    if !std::env::vars_os().any(|(k, v)| v.is_empty() && ours(&k)) {
        return;
    }
    for key in cli::env_fallbacks() {
        if std::env::var_os(&key).is_some_and(|v| v.is_empty()) {
            // Still single-threaded: nothing else reads the environment concurrently.
            std::env::remove_var(key);
        }
    }
}

/// Once read, the passwords leave our own environment (a USER:PASSWORD keeps its user), so
/// that nothing of ours passes them on, and their bytes are overwritten where
/// /proc/PID/environ reads them: the environment block leasewrap was started with, which the
/// watchdog, forked later, copies. PR_SET_DUMPABLE keeps that file from other processes of the
/// same user; this keeps the passwords from root's `ps e` and from the watchdog's copy.
fn forget_passwords() {
    wipe_passwords_in_place();
    for key in config::PASSWORD_VARS {
        // Still single-threaded: nothing else reads the environment concurrently.
        std::env::remove_var(key);
    }
    for key in config::USER_VARS {
        if let Some(value) = std::env::var_os(key) {
            std::env::set_var(key, config::user_part(&value));
        }
    }
}

/// Overwrite the password bytes of every `environ` string, in place. The strings leasewrap
/// started with are those of the block between the kernel's env_start and env_end, which
/// /proc/PID/environ reads (prctl PR_SET_MM_ENV_* would need CAP_SYS_RESOURCE); std keeps no
/// copy of its own, and what setenv added since is overwritten just the same.
fn wipe_passwords_in_place() {
    // SAFETY: still single-threaded, so nothing reads or changes the environment meanwhile.
    // `environ` is a NULL-terminated array of NUL-terminated, writable strings; each is
    // overwritten within its own length, and no pointer in the array is changed.
    unsafe {
        let mut entry = libc::environ;
        while !entry.is_null() && !(*entry).is_null() {
            let len = libc::strlen(*entry);
            let bytes = std::slice::from_raw_parts_mut((*entry).cast::<u8>(), len);
            if let Some(secret) = secret_of(bytes) {
                bytes[secret].fill(b'*');
            }
            entry = entry.add(1);
        }
    }
}

/// Where the password is in a `KEY=VALUE` string: all of the value of a `*_PASSWORD`, what
/// follows the first ':' of LEASEWRAP_USER or ETCDCTL_USER.
fn secret_of(entry: &[u8]) -> Option<std::ops::Range<usize>> {
    let eq = entry.iter().position(|b| *b == b'=')?;
    let (key, value) = (&entry[..eq], eq + 1..entry.len());
    if key.ends_with(b"_PASSWORD") {
        return Some(value);
    }
    if !config::USER_VARS.iter().any(|u| u.as_bytes() == key) {
        return None;
    }
    let colon = entry[value.clone()].iter().position(|b| *b == b':')?;
    Some(value.start + colon + 1..value.end)
}

fn run_command(args: &cli::RunArgs) -> Exit {
    log::init(&args.log);
    let cfg = match Config::from_args(args, &process_env) {
        Ok(cfg) => cfg,
        Err(e) => return fail(e, ExitCodes::default()),
    };
    forget_passwords();
    log::note(Some(&cfg.name), None, None);
    match run::run(&cfg) {
        Ok(exit) => exit,
        Err(e) => fail(e, cfg.codes),
    }
}

/// Run `fut` on a single-threaded runtime; a thread still blocked in flock does not delay exit.
pub(crate) fn block_on<T>(
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

fn usage_error(e: clap::Error, args: &[OsString]) -> Exit {
    use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
    if matches!(e.kind(), DisplayHelp | DisplayVersion) {
        let _ = e.print();
        return Exit::Code(0);
    }
    let line = from_a_variable(&e, args)
        .or_else(|| usage::line(&e, args))
        .unwrap_or_else(|| first_line(&e.to_string()));
    let e = error::Error::Usage(line);
    // The command line did not say how to log: the defaults, so that the journal gets it too.
    log::init(&cli::LogArgs::default());
    log::end(&e, log::Ending::Refused);
    Exit::Code(e.code(ExitCodes::default()))
}

/// clap's message as one line under the variable's name, when the bad value came from the
/// environment: clap names the flag (`--log-format`) even when the user never typed it.
fn from_a_variable(e: &clap::Error, args: &[OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    // `arg` is as clap prints it: "--log-format <FORMAT>".
    let flag = arg.split(' ').next().unwrap_or_default();
    let var = flag.strip_prefix("--").and_then(variable_of)?;
    let typed = args.iter().any(|a| {
        let a = a.as_bytes();
        a == flag.as_bytes() || (a.starts_with(flag.as_bytes()) && a.get(flag.len()) == Some(&b'='))
    });
    if typed || std::env::var_os(&var).is_none() {
        return None;
    }
    let line = first_line(&e.to_string());
    Some(format!(
        "{var}: {}",
        line.replacen(&format!(" for '{arg}'"), "", 1)
    ))
}

/// The variable clap reads for the option `--long`, in any subcommand.
fn variable_of(long: &str) -> Option<String> {
    fn walk(cmd: &clap::Command, long: &str) -> Option<String> {
        let arg = cmd.get_arguments().find(|a| a.get_long() == Some(long));
        let env = arg.and_then(clap::Arg::get_env);
        let found = env.map(|v| v.to_string_lossy().into_owned());
        found.or_else(|| cmd.get_subcommands().find_map(|sub| walk(sub, long)))
    }
    walk(&<cli::Cli as clap::CommandFactory>::command(), long)
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
    // A skip (the lease held, or KEY done) is what a fleet does every night: not an error, and
    // as quiet as a success. A lost lease was also logged, with its token, when it was noticed.
    let how = match e {
        error::Error::Usage(_) | error::Error::Config(_) => log::Ending::Refused,
        _ if e.is_skip() => log::Ending::Skip,
        _ => log::Ending::Error,
    };
    log::end(&e, how);
    Exit::Code(e.code(codes))
}

impl Exit {
    /// End the process: exit with the code, or die of the child's signal without a core dump.
    pub fn finish(self) -> ExitCode {
        match self {
            Exit::Code(c) => ExitCode::from(c),
            Exit::Signal(sig) => {
                reraise(sig);
                ExitCode::from(self.status())
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
    use std::path::Path;

    /// Every module file under src/, as a path like `lease::timing`.
    fn modules(dir: &Path, prefix: &str, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let name = format!("{prefix}{stem}");
            if path.is_dir() {
                modules(&path, &format!("{name}::"), found);
            } else if !["lib", "main", "mod"].contains(&stem.as_str()) {
                found.push(name);
            }
        }
    }

    #[test]
    fn the_layout_names_every_module() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = Vec::new();
        modules(&src, "", &mut found);
        let lib = include_str!("lib.rs");
        let layout: Vec<&str> = lib
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .filter(|l| l.starts_with("//! - "))
            .collect();
        for module in found {
            assert!(
                layout.iter().any(|l| l.contains(&format!("`{module}`"))),
                "lib.rs's `//! # Layout` does not name {module}"
            );
        }
    }

    #[test]
    fn the_secret_of_an_environment_string_is_a_password_s_value_or_after_user_colon() {
        fn secret(e: &str) -> Option<&str> {
            super::secret_of(e.as_bytes()).map(|r| &e[r])
        }
        assert_eq!(secret("LEASEWRAP_PASSWORD=s3cret"), Some("s3cret"));
        assert_eq!(secret("MYSQL_PASSWORD=a=b"), Some("a=b"));
        assert_eq!(secret("ETCDCTL_USER=alice:pa:ss"), Some("pa:ss"));
        assert_eq!(secret("LEASEWRAP_USER=alice"), None);
        assert_eq!(secret("OTHER_USER=alice:x"), None);
        assert_eq!(secret("PASSWORD_HINT=x"), None);
        assert_eq!(secret("NOEQUALS"), None);
    }

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
