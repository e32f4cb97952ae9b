//! A real PostgreSQL 15 server (Debian `postgresql-15`) for the tests of the database fence:
//! `initdb` and `pg_ctl` as the tests' unprivileged user (PostgreSQL refuses to run as root),
//! listening only on a Unix socket in a temp dir, with trust authentication for that user.
//!
//! One server per test binary (`shared`); each test makes a database of its own. The server is
//! stopped by its postmaster's pid (from postmaster.pid): at process exit for the shared one, on
//! drop for others; the dirs of test processes that died without stopping theirs are swept, and
//! their servers stopped, when the next one starts.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Once, OnceLock};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::user::{self, User, OTHER};
use super::{comm, dirs_of_dead_processes, proc_state, run_bounded, wait_until, Output};

/// Where Debian's postgresql-15 puts the server and client programs.
pub const BIN_DIR: &str = "/usr/lib/postgresql/15/bin";

/// The psql of that server.
pub const PSQL: &str = "/usr/lib/postgresql/15/bin/psql";

/// How long the server may take to start or stop on a loaded 2-core machine.
const SERVER_BOUND: Duration = Duration::from_secs(60);

/// How long one psql of a test's own may run.
const PSQL_BOUND: Duration = Duration::from_secs(30);

/// A running server.
pub struct Postgres {
    /// The socket's directory: psql's `-h`.
    socket_dir: PathBuf,
    /// The postmaster's pid, from postmaster.pid.
    pid: i32,
    /// Last, so it is removed only after the server is stopped.
    _dir: TempDir,
}

/// The shared server's postmaster, for the exit hook; 0 before it starts.
static SHARED_PID: AtomicI32 = AtomicI32::new(0);

/// One server for the whole test binary, stopped when the process exits.
pub fn shared() -> &'static Postgres {
    static SHARED: OnceLock<Postgres> = OnceLock::new();
    SHARED.get_or_init(|| {
        let pg = Postgres::start();
        SHARED_PID.store(pg.pid, Ordering::SeqCst);
        // SAFETY: registers a plain extern "C" function that takes no lock and allocates nothing.
        unsafe { libc::atexit(stop_shared_at_exit) };
        pg
    })
}

extern "C" fn stop_shared_at_exit() {
    let pid = SHARED_PID.load(Ordering::SeqCst);
    if pid > 0 {
        // Immediate shutdown: the data dir is thrown away anyway.
        let _ = kill(Pid::from_raw(pid), Signal::SIGQUIT);
    }
}

impl Postgres {
    /// initdb and start a server as the tests' user; fails with what to install when missing.
    #[track_caller]
    pub fn start() -> Postgres {
        let initdb = Path::new(BIN_DIR).join("initdb");
        assert!(
            initdb.is_file() && Path::new(PSQL).is_file(),
            "PostgreSQL 15 is missing ({} not found): install the Debian package postgresql-15",
            initdb.display()
        );
        let runner = user::other();
        let dir = scratch_dir(runner);
        let data = dir.path().join("data");
        let init = as_user(runner, Command::new(&initdb))
            .args(["-A", "trust", "-U", OTHER, "-E", "UTF8", "--no-sync", "-D"])
            .arg(&data)
            .output();
        expect_success("initdb", init);
        let log = dir.path().join("server.log");
        let options = format!(
            "-k {} -c listen_addresses='' -c fsync=off",
            dir.path().display()
        );
        let started = as_user(runner, Command::new(Path::new(BIN_DIR).join("pg_ctl")))
            .args(["-w", "-t", "60", "-D"])
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .args(["-o", &options, "start"])
            .output();
        expect_success(&format!("pg_ctl start (log: {})", log.display()), started);
        let pid = postmaster_pid(&data).expect("postmaster.pid names the server");
        Postgres {
            socket_dir: dir.path().to_owned(),
            pid,
            _dir: dir,
        }
    }

    /// A fresh database for one test, `label` in its name.
    #[track_caller]
    pub fn database(&self, label: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let db: String = format!("t_{label}_{n}")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(60)
            .collect();
        self.psql_ok("postgres", &format!("CREATE DATABASE {db}"));
        db
    }

    /// The variables that point psql (and anything built on libpq) at database `db`.
    pub fn env(&self, db: &str) -> Vec<(String, String)> {
        vec![
            ("PGHOST".into(), self.socket_dir.display().to_string()),
            ("PGUSER".into(), OTHER.into()),
            ("PGDATABASE".into(), db.into()),
        ]
    }

    /// psql on `db`, unaligned, quiet and verbose in its errors (they show the SQLSTATE), stopping
    /// at the first error; as root, connecting as the tests' user.
    pub fn psql_command(&self, db: &str) -> Command {
        let mut cmd = Command::new(PSQL);
        cmd.args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "VERBOSITY=verbose",
        ])
        .envs(self.env(db));
        cmd
    }

    /// psql on `db` with `sql` as its one command.
    pub fn psql(&self, db: &str, sql: &str) -> Output {
        let mut cmd = self.psql_command(db);
        cmd.args(["-c", sql]);
        run_bounded(cmd, PSQL_BOUND)
    }

    /// psql on `db` running the script `file`, with the psql variables `vars`.
    pub fn psql_file(&self, db: &str, vars: &[(&str, &str)], file: &Path) -> Output {
        let mut cmd = self.psql_command(db);
        for (name, value) in vars {
            cmd.arg("-v").arg(format!("{name}={value}"));
        }
        cmd.arg("-f").arg(file);
        run_bounded(cmd, PSQL_BOUND)
    }

    /// The output of `sql` on `db`, trimmed; panics with psql's stderr when it fails.
    #[track_caller]
    pub fn psql_ok(&self, db: &str, sql: &str) -> String {
        let out = self.psql(db, sql);
        assert!(out.status.success(), "psql {db} -c {sql:?}: {}", out.stderr);
        out.stdout.trim().to_owned()
    }

    /// Waits until a session of `db` waits for a lock (pg_stat_activity's wait_event_type Lock)
    /// in a statement that contains `query`.
    #[track_caller]
    pub fn wait_for_lock_wait(&self, db: &str, query: &str, bound: Duration) {
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND strpos(query, '{}') > 0",
            query.replace('\'', "''")
        );
        wait_until(
            bound,
            &format!("a session of {db} waiting on a lock in {query}"),
            || self.psql_ok(db, &sql) != "0",
        );
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        stop(self.pid);
    }
}

/// SIGQUIT (immediate shutdown) by pid, then wait until it is gone. A process that is a child
/// subreaper (the benchmarks are) inherits the daemonized postmaster: then it is reaped here.
fn stop(pid: i32) {
    if kill(Pid::from_raw(pid), Signal::SIGQUIT).is_ok() {
        wait_until(SERVER_BOUND, "the PostgreSQL server to stop", || {
            let flag = Some(nix::sys::wait::WaitPidFlag::WNOHANG);
            let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), flag);
            kill(Pid::from_raw(pid), None).is_err() || proc_state(pid) == Some('Z')
        });
    }
}

/// The first line of DATA/postmaster.pid.
fn postmaster_pid(data: &Path) -> Option<i32> {
    let text = fs::read_to_string(data.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// `cmd` run as `runner`, from a directory it can read.
fn as_user(runner: User, mut cmd: Command) -> Command {
    cmd.uid(runner.uid).gid(runner.gid).current_dir("/");
    cmd
}

#[track_caller]
fn expect_success(what: &str, out: std::io::Result<std::process::Output>) {
    let out = out.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temp dir owned by `runner`, named `<pid>-...` under one root; the dirs of dead test
/// processes are removed first, their servers stopped.
fn scratch_dir(runner: User) -> TempDir {
    static SWEEP: Once = Once::new();
    let root = std::env::temp_dir().join("leasewrap-postgres");
    fs::create_dir_all(&root).unwrap_or_else(|e| panic!("cannot create {}: {e}", root.display()));
    user::chmod(&root, 0o755);
    SWEEP.call_once(|| sweep(&root));
    let prefix = format!("{}-", std::process::id());
    let dir = tempfile::Builder::new().prefix(&prefix).tempdir_in(&root);
    let dir = dir.unwrap_or_else(|e| panic!("cannot create a temp dir in {}: {e}", root.display()));
    runner.owns(dir.path());
    dir
}

fn sweep(root: &Path) {
    for dir in dirs_of_dead_processes(root) {
        // The pid may have been given to another process since.
        let server = postmaster_pid(&dir.join("data"));
        if let Some(server) = server.filter(|&p| comm(p) == "postgres") {
            stop(server);
        }
        let _ = fs::remove_dir_all(dir);
    }
}
