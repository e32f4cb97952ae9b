//! Sessions and members (issue 25 items 7, 9, 11): every session leasewrap opens is closed when
//! it is done with it (the server's count of sessions is back where it was the moment leasewrap
//! exits), members are tried in turn, each within its share of the dial timeout, a failure
//! names each member's reason, and the smaller edges (a TTL past 24 days, slow round trips, a
//! chroot with a dot segment, debug logs).

use std::io::Read;
use std::net::TcpListener;
use std::thread;
use std::time::Duration;

use super::{hold, queue};
use crate::support::proxy::{Mode, Proxy};
use crate::support::zookeeper::{self, Zk};
use crate::support::*;

/// The server's count of global sessions, from `mntr`.
fn sessions(zk: &Zk) -> u64 {
    let mntr = zk.four_letter("mntr").expect("mntr answers");
    let line = mntr
        .lines()
        .find_map(|l| l.strip_prefix("zk_global_sessions"));
    let line = line.unwrap_or_else(|| panic!("no zk_global_sessions in mntr:\n{mntr}"));
    line.trim().parse().expect("a count of sessions")
}

/// Item 9: a run, a waiter that gives up, `status`, `status --once` and `fenced-put` each close
/// their session: the server's count is back to none the moment leasewrap exits (an unclosed
/// session would stay until its timeout expires it, its node blocking others).
#[test]
fn every_session_is_closed_the_moment_leasewrap_is_done_with_it() {
    let zk = Zk::start();
    let sb = Sandbox::new();
    let connect = zk.connect();
    let run = |args: &[&str], cmd: &[&str]| {
        Leasewrap::new()
            .on_zookeeper(&connect)
            .name("job")
            .args(args)
            .cmd(cmd)
            .output()
    };
    assert_exit(&run(&["--once", "k"], &["true"]), 0);
    assert_eq!(sessions(&zk), 0, "after a run");
    let holder = hold(
        Leasewrap::new().on_zookeeper(&connect).name("job"),
        &sb,
        "a",
    );
    assert_exit(&run(&["-w", "300ms"], &["true"]), 75);
    assert_eq!(
        sessions(&zk),
        1,
        "after a waiter gave up: the holder's alone"
    );
    assert_eq!(
        queue(zk.port(), "job").len(),
        1,
        "the waiter's node went with its session"
    );
    status_and_fenced_put_close_theirs(&zk, &holder.env());
    holder.finish();
    assert_eq!(
        sessions(&zk),
        0,
        "after the holder released by closing its session"
    );
    let free = run(&["-n"], &["true"]);
    assert_exit(&free, 0);
    assert!(
        !zk.log().contains("Expiring session"),
        "a session expired instead of being closed"
    );
}

/// `status`, `status --once` and `fenced-put` beside a holder leave only the holder's session.
fn status_and_fenced_put_close_theirs(zk: &Zk, env: &std::collections::HashMap<String, String>) {
    for args in [vec!["job"], vec!["--once", "k", "job"]] {
        let out = Leasewrap::subcommand("status")
            .on_zookeeper(&zk.connect())
            .args(&args)
            .output();
        assert!(out.status.code().is_some(), "{}", out.stderr);
        assert_eq!(sessions(zk), 1, "after status {args:?}");
    }
    let put = Leasewrap::subcommand("fenced-put")
        .on_zookeeper(&zk.connect())
        .env("LEASEWRAP_KEY", &env["LEASEWRAP_KEY"])
        .env("LEASEWRAP_FENCING_TOKEN", &env["LEASEWRAP_FENCING_TOKEN"])
        .args(&["/put-target", "v"])
        .output();
    assert_exit(&put, 0);
    assert_eq!(sessions(zk), 1, "after fenced-put");
}

/// A member that accepts connections and never answers, as a stopped JVM's kernel does.
fn hung_member() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a hung member");
    let at = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
    (listener, at)
}

/// A member that accepts a connection, reads the connect request and closes without a word, as
/// a member with no quorum does.
fn closing_member() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a closing member");
    let at = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
    thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 64];
            let _ = conn.read(&mut buf);
        }
    });
    at
}

/// Item 7: a member that accepts and never answers, listed anywhere in the connect string, costs
/// only its share of the dial timeout: every run, `status` and `fenced-put` gets its session
/// from the healthy member.
#[test]
fn a_hung_member_in_the_connect_string_costs_only_its_share_of_the_dial_timeout() {
    let zk = zookeeper::shared();
    let sb = Sandbox::new();
    let (_hung, at) = hung_member();
    let name = zookeeper::unique_name("hung");
    for connect in [
        format!("{at},{}", zk.connect()),
        format!("{},{at}", zk.connect()),
    ] {
        for _ in 0..4 {
            let out = Leasewrap::new()
                .on_zookeeper(&connect)
                .name(&name)
                .cmd(&["true"])
                .output();
            assert_exit(&out, 0);
        }
        let status = Leasewrap::subcommand("status")
            .on_zookeeper(&connect)
            .args(&[&name])
            .output();
        assert_exit(&status, 1);
    }
    let holder = hold(
        Leasewrap::new().on_zookeeper(&zk.connect()).name(&name),
        &sb,
        "a",
    );
    let env = holder.env();
    let put = Leasewrap::subcommand("fenced-put")
        .on_zookeeper(&format!("{at},{}", zk.connect()))
        .env("LEASEWRAP_KEY", &env["LEASEWRAP_KEY"])
        .env("LEASEWRAP_FENCING_TOKEN", &env["LEASEWRAP_FENCING_TOKEN"])
        .args(&[&format!("/{name}-put"), "v"])
        .output();
    assert_exit(&put, 0);
    holder.finish();
}

/// Items 7 and 11: when no member gives a session, the one line names each member and what it
/// did (refused, unknown host, no answer, closed before answering), and the status is 69: at once
/// without a wait, once the wait runs out with one (a member that does not answer may be in an
/// election); the same for `status` and `fenced-put`.
#[test]
fn no_session_names_each_members_reason_and_exits_69() {
    let refused = format!("127.0.0.1:{}", crate::support::etcd::free_port());
    let (_hung, hung) = hung_member();
    let closing = closing_member();
    let connect = format!("{refused},no-such-host.invalid:2181,{hung},{closing}");
    let run = |wait: &[&str]| {
        let lw = Leasewrap::new().on_zookeeper(&connect).name("x").args(wait);
        lw.cmd(&["true"]).output()
    };
    let (no_wait, waited) = (run(&["-n"]), run(&["-w", "3s"]));
    let early = run(&["-w", "500ms"]);
    assert_exit(&early, 69);
    assert!(
        early.stderr.contains("no member has given a session yet"),
        "{}",
        early.stderr
    );
    assert!(
        waited.stderr.contains("gave up waiting"),
        "{} {}",
        waited.status,
        waited.stderr
    );
    let status = Leasewrap::subcommand("status")
        .on_zookeeper(&connect)
        .output();
    let put = Leasewrap::subcommand("fenced-put")
        .on_zookeeper(&connect)
        .env("LEASEWRAP_KEY", "/leasewrap/x/_c_n-lock-0000000001")
        .env("LEASEWRAP_FENCING_TOKEN", "1")
        .args(&["/k", "v"])
        .output();
    for out in [no_wait, waited, status, put] {
        assert_exit(&out, 69);
        let line = out
            .stderr
            .lines()
            .find(|l| l.starts_with("leasewrap: "))
            .unwrap_or_default();
        for said in [
            &format!("{refused}: connection refused"),
            "no-such-host.invalid:2181: unknown host",
            &format!("{hung}: no answer within"),
            &format!("{closing}: closed the connection before answering"),
        ] {
            assert!(line.contains(said), "{said:?} in {line:?}");
        }
    }
}

/// Item 11: round trips long next to the TTL: the rule counts a renewal's three round trips,
/// and a session whose connect took too long for the TTL is refused (69, with the numbers), not
/// a free lease reported as held (75).
#[test]
fn round_trips_too_slow_for_the_ttl_are_69_with_the_numbers_not_a_lease_held() {
    let zk = zookeeper::shared();
    let proxy = Proxy::start(zk.addr());
    proxy.set_mode(Mode::DelayReplies(Duration::from_millis(700)));
    let connect = proxy.addr().to_string();
    for wait in [&["-n"][..], &["-w", "2s"]] {
        let out = Leasewrap::new()
            .on_zookeeper(&connect)
            .name(&zookeeper::unique_name("slow"))
            .args(&["--ttl", "4s", "--dial-timeout", "5s", "-v"])
            .args(wait)
            .cmd(&["true"])
            .output();
        assert_exit(&out, 69);
        assert!(out.stderr.contains("round trips"), "{}", out.stderr);
    }
}

/// Item 11: a TTL past what 32 bits of milliseconds hold asks for the server's largest session
/// timeout, never wraps to its smallest.
#[test]
fn a_ttl_past_24_days_asks_for_the_servers_largest_timeout() {
    let zk = zookeeper::shared();
    let out = Leasewrap::new()
        .on_zookeeper(&zk.connect())
        .name(&zookeeper::unique_name("long"))
        .args(&["--ttl", "25d", "--kill-after", "1s", "--margin", "100ms"])
        .env("LEASEWRAP_LOG", "leasewrap=info")
        .cmd(&["true"])
        .output();
    assert_exit(&out, 0);
    assert!(out.stderr.contains("negotiated_ms=4000"), "{}", out.stderr);
}

/// Item 11: a chroot with a `.` segment is bad usage (64), as ZooKeeper's own client refuses it.
#[test]
fn a_chroot_with_a_dot_segment_is_bad_usage() {
    let out = Leasewrap::new()
        .on_zookeeper("127.0.0.1:2181/a/./b")
        .name("x")
        .cmd(&["true"])
        .output();
    assert_exit(&out, 64);
    assert!(out.stderr.contains("chroot"), "{}", out.stderr);
}

/// Item 11: debug logs print no raw control characters.
#[test]
fn debug_logs_of_a_zookeeper_run_print_no_raw_escape() {
    let zk = zookeeper::shared();
    let out = Leasewrap::new()
        .on_zookeeper(&zk.connect())
        .name(&zookeeper::unique_name("debug"))
        .env("LEASEWRAP_LOG", "debug")
        .cmd(&["true"])
        .output();
    assert_exit(&out, 0);
    assert!(out.stderr.lines().count() > 2, "{}", out.stderr);
    assert!(!out.stderr.contains('\u{1b}'), "{:?}", out.stderr);
}
