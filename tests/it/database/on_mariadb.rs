//! The database lease on a real MariaDB 10.11 (`--database mariadb://`): taking, and fencing
//! with the row's token in the same server; the handover the holder's named lock wakes; a
//! crashed or stopped holder taken over only after `L`; `-n` and `status`; another user
//! refused; a wrong password; a server that is not MariaDB; no or an older installed SQL; and
//! of the faults (database::faults) the server restarted within `L` and stopped longer, another
//! session's row lock, wall clocks hours apart and stepped, a waiter paused while the holder
//! crashed, and the holder cut off or its answers delayed by the fault proxy (a server of its own
//! on loopback TCP).
//!
//! Every test has a user and a lease name of its own on the one shared server (the fence's,
//! `mariadb::maria`, with the SQL installed from the shipped file), reached over its socket.

use std::time::Instant;

use nix::sys::signal::Signal;

use super::faults::{a_renewal, beating_holder, carried_on_after_a_restart};
use super::{refused_in_one_line, Lease};
use crate::etcd::{TTL, TTL_ARG};
use crate::mariadb::{install, maria, user};
use crate::support::etcd::{self, Version};
use crate::support::mariadb::Mariadb;
use crate::support::proxy::{Mode, Proxy};
use crate::support::*;

/// A test's user, tied to its lease name, and the name.
struct Place<'a> {
    server: &'a Mariadb,
    user: String,
    name: String,
}

/// A fresh user tied to a lease name of its own.
fn place(label: &str) -> Place<'static> {
    let server = maria().0;
    let db = server.database(&format!("lease_{label}"));
    let user = user(server, &db, "job");
    let name = format!("{db}.job");
    server.sql_ok("", &format!("CALL leasewrap.allow('{user}', '{name}')"));
    Place { server, user, name }
}

/// The URL of `server`'s socket, as `user`.
fn url_of(server: &Mariadb, user: &str) -> String {
    let socket = server.socket().display().to_string().replace('/', "%2F");
    format!("mariadb://{user}@/?socket={socket}")
}

impl Place<'_> {
    fn url_as(&self, user: &str) -> String {
        url_of(self.server, user)
    }

    fn url(&self) -> String {
        self.url_as(&self.user)
    }

    /// A leasewrap on the lease, with the tests' TTL and debug logs (shown when a test fails).
    fn job(&self) -> Leasewrap {
        self.quiet(&self.url()).args(&["-vv"])
    }

    /// The same with the default logs: an error is its one line.
    fn quiet(&self, url: &str) -> Leasewrap {
        self.quiet_with_ttl(url, TTL_ARG)
    }

    fn quiet_with_ttl(&self, url: &str, ttl: &str) -> Leasewrap {
        Leasewrap::new()
            .args(&["--database", url, "--ttl", ttl])
            .name(&self.name)
    }

    /// The lease's row: `version|token|held`.
    fn row(&self) -> String {
        let sql = format!(
            "SELECT CONCAT(version, '|', token, '|', held) FROM leasewrap.lease WHERE name = '{}'",
            self.name
        );
        self.server.sql_ok("", &sql)
    }
}

#[test]
fn a_run_takes_the_row_with_a_token_the_fence_of_the_same_server_accepts() {
    let p = place("take");
    let fence = "START TRANSACTION; CALL leasewrap.fence('$LEASEWRAP_NAME', '$LEASEWRAP_FENCING_TOKEN'); COMMIT;";
    let client = format!(
        "{} --no-defaults --socket={} --user={} -e \"{fence}\"",
        crate::support::mariadb::CLIENT,
        q(p.server.socket()),
        p.user
    );
    for (run, token) in [(1, "1"), (2, "2")] {
        let out = p.job().shell(&client).output();
        assert_exit(&out, 0);
        let sql = format!(
            "SELECT token FROM leasewrap.fence WHERE name = '{}'",
            p.name
        );
        assert_eq!(
            p.server.sql_ok("", &sql),
            token,
            "run {run}: {}",
            out.stderr
        );
    }
    // Taken twice, renewed or not, released twice: free, with the last token.
    assert!(p.row().ends_with("|2|0"), "{}", p.row());
    // The first holder's token is stale now, in the very server that chose it.
    let stale = "START TRANSACTION; CALL leasewrap.fence(@n, '1'); COMMIT;";
    let out = p
        .server
        .sql_as(&p.user, "", &format!("SET @n = '{}'; {stale}", p.name));
    assert!(
        !out.status.success() && out.stderr.contains("stale fencing token 1"),
        "{}",
        out.stderr
    );
}

impl Lease for Place<'_> {
    fn holder(&self) -> Leasewrap {
        self.job()
    }

    fn lease_url(&self) -> String {
        self.url()
    }

    fn lease_name(&self) -> &str {
        &self.name
    }

    fn server(&self) -> &'static str {
        "MariaDB"
    }

    fn quiet_run(&self) -> Leasewrap {
        self.quiet(&self.url())
    }

    fn lease_row(&self) -> String {
        self.row()
    }

    fn bring_back_under_another_run(&self) {
        let sql = format!(
            "UPDATE leasewrap.lease SET version = version + 1, holder = '{}' WHERE name = '{}'",
            super::ANOTHER_RUN,
            self.name
        );
        self.server.sql_ok("", &sql);
        let sql = format!(
            "SELECT id FROM information_schema.processlist WHERE user = '{}'",
            self.user
        );
        for id in self.server.sql_ok("", &sql).split_whitespace() {
            self.server.sql_ok("", &format!("KILL CONNECTION {id}"));
        }
    }
}

/// The lease's row locked by another session (root's: job users have no right on the table)
/// until `faults::unlock`.
fn lock_the_row(p: &Place, sb: &Sandbox) -> std::thread::JoinHandle<Output> {
    let script = format!(
        "START TRANSACTION;\nSELECT version FROM leasewrap.lease WHERE name = '{}' FOR UPDATE;\n{}\nCOMMIT;\n",
        p.name,
        crate::dbfence::wait_line(sb, "lock")
    );
    let mut cmd = std::process::Command::new("/bin/sh");
    let client = crate::support::mariadb::shell_words(&p.server.client(None));
    cmd.args(["-c", &format!("printf '%s\\n' \"$SCRIPT\" | {client}")])
        .env("SCRIPT", script);
    let session = std::thread::spawn(move || run_bounded(cmd, 4 * STARTUP));
    wait_for_file(&sb.path("lock.paused"), STARTUP);
    session
}

#[test]
fn a_take_behind_another_session_s_row_lock_gives_up_with_69_and_takes_once_the_lock_goes() {
    let p = place("row_lock");
    super::faults::a_take_behind_a_row_lock(&p, &Sandbox::new(), lock_the_row);
}

#[test]
fn wall_clocks_hours_apart_and_stepped_change_neither_the_handover_nor_the_ttl() {
    super::faults::wall_clocks_apart(&place("wall_clocks"), &Sandbox::new());
}

#[test]
fn a_waiter_paused_while_the_holder_crashed_takes_over_only_l_after_it_reads_again() {
    super::faults::paused_waiter(&place("paused_waiter"), &Sandbox::new());
}

#[test]
fn a_row_brought_back_under_another_run_with_the_holder_s_token_is_lost_at_the_reconnect() {
    super::faults::brought_back(&place("brought_back"), &Sandbox::new());
}

scenarios!("the holder's named lock");

#[test]
fn another_user_may_not_take_a_name_it_is_not_tied_to() {
    let p = place("other_user");
    let other = user(p.server, &format!("{}_o", p.user), "other");
    let out = p.quiet(&p.url_as(&other)).shell("exit 3").output();
    assert_exit(&out, 77);
    assert!(
        out.stderr.contains("is tied to no lease name"),
        "{}",
        out.stderr
    );
    // Tied to a name of its own, it may still not take the test's.
    let own = format!("{}.other", p.user);
    p.server
        .sql_ok("", &format!("CALL leasewrap.allow('{other}', '{own}')"));
    let out = p.quiet(&p.url_as(&other)).shell("exit 3").output();
    let refused = format!("user \"{other}\" may not use the lease \"{}\"", p.name);
    refused_in_one_line(&out, &refused);
    assert_eq!(p.row(), "", "the other user's run left a row");
}

#[test]
fn a_wrong_password_is_refused_with_77_and_nothing_taken() {
    let p = place("password");
    let sb = Sandbox::new();
    p.server.sql_ok(
        "",
        &format!("ALTER USER '{}'@'localhost' IDENTIFIED BY 'sesame'", p.user),
    );
    for (file, code) in [("not-it", 77), ("sesame", 3)] {
        let path = sb.password_file(file, file);
        let out = p
            .quiet(&p.url())
            .args(&["--password-file"])
            .args(&[&path])
            .shell("exit 3")
            .output();
        assert_exit(&out, code);
        if code == 77 {
            assert!(out.stderr.contains("Access denied"), "{}", out.stderr);
            assert_eq!(p.row(), "", "a refused run left a row");
        }
    }
}

#[test]
fn a_server_that_is_not_mariadb_is_69_in_one_line() {
    let etcd = etcd::shared(Version::V3_5);
    let addr = etcd.endpoint().trim_start_matches("http://").to_owned();
    let out = Leasewrap::new()
        .args(&[
            "--database",
            &format!("mariadb://job@{addr}"),
            "--name",
            "x",
        ])
        .args(&["--dial-timeout", "2s"])
        .shell("exit 3")
        .output();
    assert_exit(&out, 69);
    assert!(out.stderr.contains("is it MariaDB"), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
}

/// A server of its own: the shared one has the SQL installed for every test.
#[test]
fn a_server_without_the_sql_or_with_an_older_one_is_78_naming_fence_sql() {
    let server = Mariadb::start();
    server.sql_ok("", "CREATE USER 'job'@'localhost'");
    let run = || {
        Leasewrap::new()
            .args(&["--database", &url_of(&server, "job"), "--name", "x"])
            .shell("exit 3")
            .output()
    };
    let out = run();
    assert_exit(&out, 78);
    assert!(
        out.stderr.contains("leasewrap fence-sql mariadb"),
        "{}",
        out.stderr
    );
    install(&server);
    server.sql_ok(
        "",
        "CREATE OR REPLACE DEFINER = 'leasewrap_fence'@'localhost' PROCEDURE leasewrap.lease_sql() SELECT 2; CALL leasewrap.allow('job', 'x')",
    );
    let out = run();
    assert_exit(&out, 78);
    assert!(
        out.stderr.contains("version 2, older than the 3"),
        "{}",
        out.stderr
    );
}

/// A user of its own on `server`, tied to the lease name `LABEL.job`.
fn own_place<'a>(server: &'a Mariadb, label: &str) -> Place<'a> {
    install(server);
    let user = user(server, label, "job");
    let name = format!("{label}.job");
    server.sql_ok("", &format!("CALL leasewrap.allow('{user}', '{name}')"));
    Place { server, user, name }
}

/// The server restarted (SIGTERM, then mariadbd again: about 3 s) while a holder with a TTL of
/// 10 s runs: it reconnects and renews while D is ahead, its child untouched, its token kept.
/// A server of its own: the shared one serves every test.
#[test]
fn a_holder_rides_out_a_server_restarted_within_l_and_keeps_its_token() {
    let server = Mariadb::start();
    let p = own_place(&server, "restart");
    let sb = Sandbox::new();
    let lw = p.quiet_with_ttl(&p.url(), "10s").args(&["-vv"]);
    let holder = beating_holder(lw, &sb);
    a_renewal(&p);
    let stopped = Instant::now();
    server.restart();
    carried_on_after_a_restart(&p, holder, stopped, "SIGTERM, start");
}

/// The server stopped (SIGTERM) for 2 × L: the holder's child dies by D, and a waiter takes the
/// next token once the server is back. A server of its own.
#[test]
fn a_server_down_longer_than_l_kills_the_holder_s_child_by_d_and_a_waiter_takes_over_when_it_is_back(
) {
    let server = Mariadb::start();
    let p = own_place(&server, "down");
    let (stop, start) = (|| server.stop(Signal::SIGTERM), || server.start_again());
    super::faults::down_longer_than_l(&p, (&stop, &start), "SIGTERM, mariadbd again");
}

/// A holder through the fault proxy, blackholed past `L`, is dead before a waiter on the server
/// itself takes over. A server of its own, listening on loopback TCP for the proxy.
#[test]
fn a_holder_cut_off_from_the_server_is_dead_before_the_waiter_takes_over() {
    behind_the_proxy("partition", Mode::Blackhole);
}

/// The holder's answers 0.6 L late (its renewals reach the server): its child dies by D, before
/// the waiter takes over. A server of its own, as above.
#[test]
fn a_holder_whose_answers_are_delayed_past_d_is_dead_before_the_waiter_takes_over() {
    behind_the_proxy("delayed", Mode::DelayReplies(TTL.mul_f64(0.6)));
}

/// A holder through the fault proxy, its link turned to `fault`, on a server of its own.
#[track_caller]
fn behind_the_proxy(label: &str, fault: Mode) {
    let server = Mariadb::start_on_loopback();
    let p = own_place(&server, label);
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap());
    let through = p.quiet(&format!("mariadb://{}@{}/", p.user, proxy.addr()));
    super::cut_off(&p, &proxy, through.args(&["-vv"]), fault);
}
