//! A real PgBouncer (Debian `pgbouncer`) in transaction pooling mode in front of a PostgreSQL
//! server of the tests: as the tests' unprivileged user (PgBouncer refuses to run as root), on a
//! free loopback port, trusting every user, in a temp dir. Stopped by its pid on drop.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use tempfile::TempDir;

use super::dbserver::{as_user, scratch_dir, Kind, SERVER_BOUND};
use super::postgres::Postgres;
use super::user;
use super::wait_until;

/// Where Debian's pgbouncer puts its program.
const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// The scratch dirs of the tests' PgBouncers.
const KIND: Kind = Kind {
    slot: 0,
    root: "leasewrap-pgbouncer",
    comm: "pgbouncer",
    pid_in: |dir| {
        let text = std::fs::read_to_string(dir.join("pgbouncer.pid")).ok()?;
        text.trim().parse().ok()
    },
    stop: nix::sys::signal::Signal::SIGKILL,
};

/// A running PgBouncer.
pub struct PgBouncer {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl PgBouncer {
    /// Starts one in transaction pooling mode in front of `pg`, trusting `users` (PgBouncer's
    /// trust still wants each user in its auth_file); fails naming the Debian package when it is
    /// missing.
    #[track_caller]
    pub fn transaction_mode(pg: &Postgres, users: &[&str]) -> PgBouncer {
        assert!(
            Path::new(PGBOUNCER).is_file(),
            "PgBouncer is missing ({PGBOUNCER} not found): install the Debian package pgbouncer"
        );
        let runner = user::other();
        let dir = scratch_dir(&KIND, runner);
        let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let port = free.local_addr().unwrap().port();
        drop(free);
        let ini = dir.path().join("pgbouncer.ini");
        let d = dir.path().display();
        let config = format!(
            "[databases]\n* = host={} port={}\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
             unix_socket_dir =\nauth_type = trust\nauth_file = {d}/users.txt\npool_mode = transaction\nlogfile = {d}/pgbouncer.log\n\
             pidfile = {d}/pgbouncer.pid\nignore_startup_parameters = application_name\n",
            pg.socket_dir().display(),
            pg.port()
        );
        std::fs::write(&ini, config).unwrap();
        runner.owns(&ini);
        let listed: String = users.iter().map(|u| format!("\"{u}\" \"\"\n")).collect();
        let users_file = dir.path().join("users.txt");
        std::fs::write(&users_file, listed).unwrap();
        runner.owns(&users_file);
        let child = as_user(runner, Command::new(PGBOUNCER))
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        wait_until(SERVER_BOUND, "pgbouncer to listen", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        PgBouncer {
            child,
            port,
            _dir: dir,
        }
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
