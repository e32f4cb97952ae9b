//! A real MariaDB 10.11 server (Debian `mariadb-server`) for the tests of the database fence:
//! `mariadb-install-db` and `mariadbd` as the tests' unprivileged user, neither reading any
//! option file (`--no-defaults`), listening only on a Unix socket in a temp dir, with root's
//! password empty (`--auth-root-authentication-method=normal`).
//!
//! One server per test binary (`shared`); each test makes a database (and users) of its own.
//! The server is the tests' child, stopped by its pid: at process exit for the shared one, on
//! drop for others; the dirs of test processes that died without stopping theirs are swept,
//! and their servers stopped, when the next one starts.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;
use tempfile::TempDir;

use super::dbserver::{self, as_user, expect_success, Kind, SERVER_BOUND};
use super::user::{self, User};
use super::{run_bounded, wait_until, Output};

/// Debian's mariadb-server and mariadb-client put them here.
pub const MARIADBD: &str = "/usr/sbin/mariadbd";
pub const INSTALL_DB: &str = "/usr/bin/mariadb-install-db";
pub const CLIENT: &str = "/usr/bin/mariadb";

/// How long one client run of a test's own may take.
const CLIENT_BOUND: Duration = Duration::from_secs(30);

/// The scratch dirs of MariaDB servers; the data dir is thrown away, so SIGKILL stops it.
const KIND: Kind = Kind {
    slot: 1,
    root: "leasewrap-mariadb",
    comm: "mariadbd",
    pid_in: |dir| {
        fs::read_to_string(dir.join("mariadbd.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    },
    stop: Signal::SIGKILL,
};

/// A running server.
pub struct Mariadb {
    /// The server's Unix socket: the clients' `--socket`.
    socket: PathBuf,
    /// Its loopback TCP port, when it listens on one (`start_on_loopback`).
    port: Option<u16>,
    /// mariadbd's pid: the tests' child, reaped by `dbserver::stop`'s waitpid.
    pid: AtomicI32,
    /// Last, so it is removed only after the server is stopped.
    _dir: TempDir,
}

/// One server for the whole test binary, stopped when the process exits.
pub fn shared() -> &'static Mariadb {
    static SHARED: OnceLock<Mariadb> = OnceLock::new();
    dbserver::shared(&SHARED, &KIND, || {
        let db = Mariadb::start();
        let pid = db.pid.load(Ordering::SeqCst);
        (db, pid)
    })
}

impl Mariadb {
    /// Makes a data dir and starts a server on it as the tests' user; fails with what to
    /// install when MariaDB is missing.
    #[track_caller]
    pub fn start() -> Mariadb {
        Mariadb::start_with(None)
    }

    /// The same, listening on a free loopback TCP port too.
    #[track_caller]
    pub fn start_on_loopback() -> Mariadb {
        Mariadb::start_with(Some(super::etcd::free_port()))
    }

    #[track_caller]
    fn start_with(port: Option<u16>) -> Mariadb {
        assert!(
            [MARIADBD, INSTALL_DB, CLIENT]
                .iter()
                .all(|p| Path::new(p).is_file()),
            "MariaDB is missing ({MARIADBD}, {INSTALL_DB} or {CLIENT} not found): install the \
             Debian packages mariadb-server and mariadb-client"
        );
        let runner = user::other();
        let dir = dbserver::scratch_dir(&KIND, runner);
        let (data, socket) = (dir.path().join("data"), dir.path().join("mariadbd.sock"));
        let tmp = dir.path().join("tmp");
        fs::create_dir(&tmp).unwrap_or_else(|e| panic!("mkdir {}: {e}", tmp.display()));
        runner.owns(&tmp);
        // Bootstraps that share /tmp name their temporary tables alike and remove each
        // other's ("Unknown table 'mysql.tmp_user_sys'"): each server has a tmpdir of its own.
        let install = as_user(runner, Command::new(INSTALL_DB))
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .output();
        expect_success("mariadb-install-db", install);
        let log = dir.path().join("mariadbd.log");
        let server = mariadbd(runner, dir.path(), (&data, &socket, port));
        let db = Mariadb {
            socket,
            port,
            pid: AtomicI32::new(server),
            _dir: dir,
        };
        db.wait_answering(&format!("mariadbd to answer (log: {})", log.display()));
        db
    }

    /// Returns once the server answers a client.
    #[track_caller]
    fn wait_answering(&self, what: &str) {
        wait_until(SERVER_BOUND, what, || {
            self.client(None)
                .arg("-e")
                .arg("SELECT 1")
                .output()
                .is_ok_and(|o| o.status.success())
        });
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
        self.sql_ok("", &format!("CREATE DATABASE {db}"));
        db
    }

    /// Stops the server with `signal` (SIGTERM, as a service manager does: InnoDB shuts down
    /// cleanly) and returns once it is gone.
    pub fn stop(&self, signal: Signal) {
        dbserver::stop(self.pid.load(Ordering::SeqCst), signal);
    }

    /// Starts the server again on the same data dir and socket; returns once it answers.
    #[track_caller]
    pub fn start_again(&self) {
        let dir = self._dir.path();
        let data = dir.join("data");
        let server = mariadbd(user::other(), dir, (&data, &self.socket, self.port));
        self.pid.store(server, Ordering::SeqCst);
        self.wait_answering("mariadbd to answer again");
    }

    /// `stop` with SIGTERM, then `start_again`.
    #[track_caller]
    pub fn restart(&self) {
        self.stop(Signal::SIGTERM);
        self.start_again();
    }

    /// Its loopback TCP port (`start_on_loopback`).
    pub fn port(&self) -> u16 {
        self.port.expect("a server started with start_on_loopback")
    }

    /// The server's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The client as root on `db` (none: no default database), reading no option file, in
    /// batch mode (tab-separated, no column names), stopping at the first error.
    pub fn client(&self, db: Option<&str>) -> Command {
        self.client_as("root", db)
    }

    /// The same as `user`.
    pub fn client_as(&self, user: &str, db: Option<&str>) -> Command {
        let mut cmd = Command::new(CLIENT);
        cmd.arg("--no-defaults")
            .arg(format!("--socket={}", self.socket.display()))
            .arg(format!("--user={user}"))
            .args(["--batch", "--skip-column-names"]);
        cmd.args(db);
        cmd
    }

    /// `sql` on `db` as `user`.
    pub fn sql_as(&self, user: &str, db: &str, sql: &str) -> Output {
        let mut cmd = self.client_as(user, Some(db).filter(|d| !d.is_empty()));
        cmd.arg("-e").arg(sql);
        run_bounded(cmd, CLIENT_BOUND)
    }

    /// The output of `sql` on `db` as root, trimmed; panics with the client's stderr when it
    /// fails.
    #[track_caller]
    pub fn sql_ok(&self, db: &str, sql: &str) -> String {
        let out = self.sql_as("root", db, sql);
        assert!(
            out.status.success(),
            "mariadb {db} -e {sql:?}: {}",
            out.stderr
        );
        out.stdout.trim().to_owned()
    }

    /// The client as root on `db`, with the script `file` on its standard input.
    pub fn run_file(&self, db: Option<&str>, file: &Path) -> Output {
        let script = format!(
            "exec {} < {}",
            shell_words(&self.client(db)),
            super::q(file)
        );
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", &script]);
        run_bounded(cmd, CLIENT_BOUND)
    }
}

/// mariadbd as `runner` on `data`, listening on `socket` (and on loopback `port`, if any), its
/// pid file and log in `dir`; its pid.
fn mariadbd(runner: User, dir: &Path, (data, socket, port): (&Path, &Path, Option<u16>)) -> i32 {
    let path = |name: &str| dir.join(name).display().to_string();
    let mut cmd = as_user(runner, Command::new(MARIADBD));
    cmd.arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--tmpdir={}", path("tmp")))
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--pid-file={}", path("mariadbd.pid")))
        .arg(format!("--log-error={}", path("mariadbd.log")))
        // Like PostgreSQL's fsync=off in the tests: durability is not what is tested.
        .arg("--innodb-flush-log-at-trx-commit=0")
        .stdin(Stdio::null());
    match port {
        Some(port) => cmd.args(["--bind-address=127.0.0.1", &format!("--port={port}")]),
        None => cmd.arg("--skip-networking"),
    };
    // Reaped by pid: `dbserver::stop`'s waitpid.
    #[allow(clippy::zombie_processes)]
    let server = cmd.spawn();
    server
        .unwrap_or_else(|e| panic!("start {MARIADBD}: {e}"))
        .id() as i32
}

/// A command's program and arguments as one shell line (they hold no quote here).
pub fn shell_words(cmd: &Command) -> String {
    let words = std::iter::once(cmd.get_program()).chain(cmd.get_args());
    words
        .map(|w| format!("'{}'", w.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        dbserver::stop(self.pid.load(Ordering::SeqCst), KIND.stop);
    }
}
