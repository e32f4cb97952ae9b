//! A real PostgreSQL 15 server (Debian `postgresql-15`) for the tests of the database fence:
//! `initdb` and `pg_ctl` as the tests' unprivileged user (PostgreSQL refuses to run as root),
//! listening only on a Unix socket in a temp dir, with trust authentication for that user.
//!
//! One server per test binary (`shared`); each test makes a database of its own. The server is
//! stopped by its postmaster's pid (from postmaster.pid): at process exit for the shared one, on
//! drop for others; the dirs of test processes that died without stopping theirs are swept, and
//! their servers stopped, when the next one starts.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;
use tempfile::TempDir;

use super::dbserver::{self, as_user, expect_success, Kind};
use super::user::{self, OTHER};
use super::{run_bounded, Output};

/// Where Debian's postgresql-15 puts the server and client programs.
pub const BIN_DIR: &str = "/usr/lib/postgresql/15/bin";

/// The psql of that server.
pub const PSQL: &str = "/usr/lib/postgresql/15/bin/psql";

/// The scratch dirs of PostgreSQL servers; SIGQUIT is an immediate shutdown.
const KIND: Kind = Kind {
    slot: 0,
    root: "leasewrap-postgres",
    comm: "postgres",
    pid_in: |dir| postmaster_pid(&dir.join("data")),
    stop: Signal::SIGQUIT,
};

/// How long one psql of a test's own may run.
const PSQL_BOUND: Duration = Duration::from_secs(30);

/// A running server.
pub struct Postgres {
    /// The socket's directory: psql's `-h`.
    socket_dir: PathBuf,
    /// The port: the socket's name, and on loopback (`start_on_loopback`) the TCP port.
    port: u16,
    /// The postmaster's pid, from postmaster.pid; a new one after `start_again`.
    pid: AtomicI32,
    /// What `pg_ctl start` was given, to start it again the same way.
    options: String,
    /// Last, so it is removed only after the server is stopped.
    _dir: TempDir,
}

/// One server for the whole test binary, stopped when the process exits; on its socket and on
/// loopback (the lease's tests reach it through the fault proxy).
pub fn shared() -> &'static Postgres {
    static SHARED: OnceLock<Postgres> = OnceLock::new();
    dbserver::shared(&SHARED, &KIND, || {
        // Never stopped and started again (`start_again`): the exit hook keeps this pid.
        let pg = Postgres::start_on_loopback();
        let pid = pg.pid.load(Ordering::SeqCst);
        (pg, pid)
    })
}

impl Postgres {
    /// initdb and start a server as the tests' user on a Unix socket alone; fails with what to
    /// install when missing.
    #[track_caller]
    pub fn start() -> Postgres {
        Postgres::start_listening(None)
    }

    /// The same, listening on 127.0.0.1 too, on a free port.
    #[track_caller]
    pub fn start_on_loopback() -> Postgres {
        let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let port = free.local_addr().unwrap().port();
        drop(free);
        Postgres::start_listening(Some(port))
    }

    #[track_caller]
    fn start_listening(tcp_port: Option<u16>) -> Postgres {
        let runner = user::other();
        let dir = dbserver::scratch_dir(&KIND, runner);
        let data = dir.path().join("data");
        initdb(runner, &data);
        let (listen, port) = tcp_port.map_or(("", 5432), |p| ("127.0.0.1", p));
        let options = format!(
            "-k {} -c listen_addresses='{listen}' -p {port} -c fsync=off",
            dir.path().display()
        );
        let pg = Postgres {
            socket_dir: dir.path().to_owned(),
            port,
            pid: AtomicI32::new(0),
            options,
            _dir: dir,
        };
        pg.start_again();
        pg
    }

    /// `pg_ctl start` on the data dir, waiting until the server accepts connections.
    #[track_caller]
    pub fn start_again(&self) {
        let log = self.socket_dir.join("server.log");
        let mut start = self.pg_ctl();
        start
            .arg("-l")
            .arg(&log)
            .args(["-o", &self.options, "start"]);
        let what = format!("pg_ctl start (log: {})", log.display());
        expect_success(&what, start.output());
        let pid = postmaster_pid(&self.socket_dir.join("data"));
        self.pid.store(
            pid.expect("postmaster.pid names the server"),
            Ordering::SeqCst,
        );
    }

    /// `pg_ctl stop -m MODE` (`fast`: every session ended, a checkpoint; `immediate`: no
    /// checkpoint, a crash recovery at the next start), waiting until the server is gone. Only
    /// a server of the test's own: the shared one serves every test of the binary.
    #[track_caller]
    pub fn stop(&self, mode: &str) {
        let mut stop = self.pg_ctl();
        stop.args(["-m", mode, "stop"]);
        expect_success(&format!("pg_ctl stop -m {mode}"), stop.output());
    }

    /// `pg_ctl -w` on the data dir, as the server's user.
    fn pg_ctl(&self) -> Command {
        let mut cmd = as_user(
            user::other(),
            Command::new(Path::new(BIN_DIR).join("pg_ctl")),
        );
        cmd.args(["-w", "-t", "60", "-D"])
            .arg(self.socket_dir.join("data"));
        cmd
    }

    /// The socket's directory.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The port: of the socket, and of 127.0.0.1 for a `start_on_loopback` server.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The variables that point libpq at database `db` over TCP (a `start_on_loopback` server).
    pub fn tcp_env(&self, db: &str) -> Vec<(String, String)> {
        let mut env = self.env(db);
        env[0].1 = "127.0.0.1".into();
        env
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
            ("PGPORT".into(), self.port.to_string()),
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

    /// psql on `db` as `role` (another role of the same database) with `sql` as its one command.
    pub fn psql_as(&self, role: &str, db: &str, sql: &str) -> Output {
        let mut cmd = self.psql_command(db);
        cmd.env("PGUSER", role).args(["-c", sql]);
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
}

impl Drop for Postgres {
    fn drop(&mut self) {
        dbserver::stop(self.pid.load(Ordering::SeqCst), KIND.stop);
    }
}

/// initdb of `data` as `runner`, trusting every local connection; fails with what to install
/// when PostgreSQL is missing.
#[track_caller]
fn initdb(runner: user::User, data: &Path) {
    let initdb = Path::new(BIN_DIR).join("initdb");
    assert!(
        initdb.is_file() && Path::new(PSQL).is_file(),
        "PostgreSQL 15 is missing ({} not found): install the Debian package postgresql-15",
        initdb.display()
    );
    let init = as_user(runner, Command::new(&initdb))
        .args(["-A", "trust", "-U", OTHER, "-E", "UTF8", "--no-sync", "-D"])
        .arg(data)
        .output();
    expect_success("initdb", init);
}

/// The first line of DATA/postmaster.pid.
fn postmaster_pid(data: &Path) -> Option<i32> {
    let text = fs::read_to_string(data.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}
