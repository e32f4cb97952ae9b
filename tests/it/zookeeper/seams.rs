//! leasewrap's own ZooKeeper client at its seams, against a scripted server that misbehaves on
//! cue (`support::zkfake`): what a healthy ZooKeeper rarely sends, and when it sends it (a move
//! before the lease is kept, a Check whose op failed, a connection closed during authentication,
//! -124, bytes that are not ZooKeeper's, a step a member never answers, a move answered with
//! another session id, a connection lost while the chroot is made).

use std::time::{Duration, Instant};

use crate::support::http::HttpServer;
use crate::support::zkfake::{requested, sessions_given, Cue, FakeZk, Seen, Writer};
use crate::support::*;

/// Session timeouts every fake member grants unless told otherwise (ms): ZooKeeper's defaults
/// for a tickTime of 200 ms, which the probe session (asking 1 ms) learns from the minimum.
const MIN: i32 = 400;
const MAX: i32 = 8000;

/// A holder on `connect` with `--ttl ttl` and a kill-after and margin that leave room for a
/// 4 s timeout, its child reporting through `marks`.
fn holder(connect: &str, name: &str, ttl: &str, marks: Marks) -> Job {
    Job::spawn(holding(connect, name, ttl), marks, false)
}

fn holding(connect: &str, name: &str, ttl: &str) -> Leasewrap {
    let timing = ["--kill-after", "1s", "--margin", "300ms", "-vv"];
    let lw = Leasewrap::new().on_zookeeper(connect).name(name);
    lw.args(&["--ttl", ttl]).args(&timing)
}

/// The session id the fake gave leasewrap's main session (not the probe, which asks 1 ms).
fn main_session(fake: &FakeZk, member: usize, asked: i32) -> i64 {
    fake.seen()
        .iter()
        .find_map(|s| match s {
            Seen::Connect {
                member: m,
                asked: a,
                session: 0,
                given: Some((id, _)),
            } if *m == member && *a == asked => Some(*id),
            _ => None,
        })
        .expect("the main session was given")
}

/// Finding 1: the session moves to a member with a shorter timeout (4 s, from 8 s) while the
/// probe for tickTime is still out, before the lease is kept. `D` must count with 4 s from the
/// move on: once that member stops reading, the child is dead within 4 s of the last packet it
/// read (after which its expiry runs), as ZooKeeper's expiry would have it.
#[test]
fn a_move_to_a_shorter_timeout_before_the_lease_is_kept_brings_d_down() {
    let fake = FakeZk::start(2, MIN, MAX);
    fake.bounds(1, MIN, 4000);
    fake.cue(1, Cue::NotServing);
    fake.cue(0, Cue::HoldAsking(1));
    let sb = Sandbox::new();
    // Each member's share of the dial timeout is the probe's patience: 5 s.
    let lw = holding(&fake.connect(), "moved-early", "8s").args(&["--dial-timeout", "10s"]);
    let a = Job::spawn(lw, Marks::new(&sb, "a"), false);
    fake.wait_for(STARTUP, "the session on member 0", |seen| {
        sessions_given(seen, 0).iter().any(|g| g.1 == 8000)
    });
    let id = main_session(&fake, 0, 8000);
    fake.lift(1);
    fake.drop_connections(0);
    let moved = fake.saw_within(STARTUP, |seen| {
        sessions_given(seen, 1).contains(&(id, 4000))
    });
    assert!(
        moved,
        "the session did not move: {:?}\n{}",
        fake.seen(),
        a.run.stderr()
    );
    fake.lift(0);
    let child = a.child();
    let renewed = fake.saw_within(STARTUP, |seen| requested(seen, 1, 14));
    assert!(renewed, "no renewal on member 1\n{}", a.run.stderr());
    fake.cue(0, Cue::NotServing);
    fake.cue(1, Cue::StopReading);
    let stopped = Instant::now();
    wait_until(Duration::from_secs(10), "A's child to die", || {
        !pid_alive(child)
    });
    let dead_after = stopped.elapsed();
    assert!(
        dead_after < Duration::from_millis(4000),
        "A's child lived {dead_after:?} after its member stopped reading; the member's expiry \
         counts 4 s\n{}",
        a.run.stderr()
    );
}

/// Finding 1: a Check whose op failed is no renewal, though the reply's header says OK: -112
/// (the leader closing the session) loses the lease at once; another code fails the step, and
/// with every Check failing so, the lease runs out at its stop time.
#[test]
fn a_check_whose_op_failed_renews_nothing_and_minus_112_loses_the_lease() {
    for (code, loss) in [(-112, "session"), (-2, "no renewal")] {
        let fake = FakeZk::start(1, MIN, MAX);
        let sb = Sandbox::new();
        let mut a = holder(&fake.connect(), "failed-check", "4s", Marks::new(&sb, "a"));
        a.child();
        fake.wait_for(STARTUP, "a first renewal", |seen| requested(seen, 0, 14));
        fake.cue(0, Cue::FailChecks(code));
        let cued = Instant::now();
        a.wait(Duration::from_secs(8));
        assert_exit(&a.run, 124);
        assert!(
            a.run.stderr().to_lowercase().contains(loss),
            "op failed with {code}: {}",
            a.run.stderr()
        );
        eprintln!(
            "a Check failing with {code}: lease lost {:?} after",
            cued.elapsed()
        );
    }
}

/// Finding 2: a member that closes the connection during `addauth` or SASL does not serve: it
/// is not a refusal of the credentials (77). With the other member serving, the run goes on
/// there; alone, it is the ensemble not serving (69), which a waiter rides out.
#[test]
fn a_connection_closed_during_authentication_is_a_member_that_does_not_serve() {
    let sb = Sandbox::new();
    let password = sb.password_file("password", "secret");
    let auth = |sasl: bool| {
        let mut args = vec![
            "--user",
            "bob",
            "--password-file",
            password.to_str().unwrap(),
        ];
        if sasl {
            args.extend(["--zk-auth", "sasl"]);
        }
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>()
    };
    for sasl in [false, true] {
        let alone = FakeZk::start(1, MIN, MAX);
        alone.cue(0, Cue::CloseDuringAuth);
        let run = Leasewrap::new()
            .on_zookeeper(&alone.connect())
            .name("auth-closed")
            .args(&auth(sasl))
            .args(&["-n", "--dial-timeout", "1s"])
            .cmd(&["true"])
            .output();
        assert_exit(&run, 69);
        assert!(run.stderr.contains("not serving"), "{}", run.stderr);
        assert!(
            !run.stderr.contains("refused the credentials"),
            "{}",
            run.stderr
        );
    }
    let pair = FakeZk::start(2, MIN, MAX);
    pair.cue(0, Cue::CloseDuringAuth);
    for _ in 0..4 {
        let run = Leasewrap::new()
            .on_zookeeper(&pair.connect())
            .name("auth-closed")
            .args(&auth(false))
            .cmd(&["true"])
            .output();
        assert_exit(&run, 0);
    }
}

/// Finding 2: an ensemble that requires SASL of every client (zookeeper.enforce.auth) answers a
/// digest user's first request with -124 and closes: 77 at once, naming `--zk-auth sasl`, not
/// a wait that never ends.
#[test]
fn minus_124_is_77_at_once_naming_zk_auth_sasl() {
    let fake = FakeZk::start(1, MIN, MAX);
    fake.cue(0, Cue::RequireSasl);
    let sb = Sandbox::new();
    let password = sb.password_file("password", "secret");
    let run = Leasewrap::new()
        .on_zookeeper(&fake.connect())
        .name("needs-sasl")
        .args(&["--user", "bob", "--password-file"])
        .args(&[password])
        .cmd(&["true"])
        .output();
    assert_exit(&run, 77);
    assert!(run.stderr.contains("--zk-auth sasl"), "{}", run.stderr);
}

/// A connect answered with a length of 2^31 (negative in jute), or cut short.
fn foreign_answers() -> Vec<(&'static str, Cue)> {
    let mut short = Writer::default();
    short.int(0).int(4000).long(7);
    let mut cut = short.framed();
    cut[3] += 20;
    vec![
        (
            "HTTP",
            Cue::Answer(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()),
        ),
        ("negative length", Cue::Answer(vec![0x80, 0, 0, 0, 1, 2, 3])),
        (
            "more than ZooKeeper sends",
            Cue::Answer(vec![0x7f, 0, 0, 0, 1]),
        ),
        ("inside a packet", Cue::Answer(cut)),
        ("ends early", Cue::Answer(short.framed())),
        ("HTTP", Cue::Drip(b"HTTP/1.1 400 Bad Request\r\n".to_vec())),
    ]
}

/// Finding 2: a server that is not ZooKeeper fails fast. Without `-n` or `-w` a run waits for
/// the ensemble to serve, but an answer that is not ZooKeeper's is 69 at once, with its reason;
/// listed beside a healthy member, it costs only its own turn.
#[test]
fn a_server_that_is_not_zookeeper_fails_fast_and_alone_is_69() {
    for (reason, cue) in foreign_answers() {
        let fake = FakeZk::start(2, MIN, MAX);
        fake.cue(0, cue);
        let run = Leasewrap::new()
            .on_zookeeper(&fake.addr(0))
            .name("not-zookeeper")
            .cmd(&["true"])
            .output();
        assert_exit(&run, 69);
        assert!(
            run.stderr.contains("not ZooKeeper"),
            "{reason}: {}",
            run.stderr
        );
        assert!(run.stderr.contains(reason), "{reason}: {}", run.stderr);
        let beside = Leasewrap::new()
            .on_zookeeper(&fake.connect())
            .name("not-zookeeper")
            .cmd(&["true"])
            .output();
        assert_exit(&beside, 0);
    }
}

/// Finding 2: a real HTTP server where a member should be waits for a line that never comes and
/// answers nothing: a member that does not answer, as a hung one. A run then says at once that it
/// waits for the ensemble to serve, never silently; with `-n`, 69 after the dial timeout.
#[test]
fn an_http_server_in_the_connect_string_is_a_member_that_does_not_answer_and_is_said_so() {
    let http = HttpServer::start();
    let at = http.addr();
    let lw = || Leasewrap::new().on_zookeeper(&at).name("http");
    let hasty = lw()
        .args(&["-n", "--dial-timeout", "1s"])
        .cmd(&["true"])
        .output();
    let mut patient = lw().args(&["--dial-timeout", "1s"]).cmd(&["true"]).spawn();
    wait_until(STARTUP, "the waiter to say it waits", || {
        patient
            .stderr()
            .contains("waiting for the ZooKeeper ensemble to serve")
    });
    patient.kill(nix::sys::signal::Signal::SIGTERM);
    let ended = patient.wait_timeout(STARTUP);
    assert_exit(&hasty, 69);
    assert!(
        hasty.stderr.contains("no answer within"),
        "{}",
        hasty.stderr
    );
    assert_eq!(ended.code(), Some(128 + 15), "{}", patient.stderr());
}

/// Finding 2: a waiter riding out an ensemble that does not serve says so, once (then at most
/// once a minute), with each member's reason; when its wait runs out, 69.
#[test]
fn a_waiter_riding_out_an_ensemble_that_does_not_serve_says_so_once() {
    let fake = FakeZk::start(2, MIN, MAX);
    fake.cue(0, Cue::NotServing);
    fake.cue(1, Cue::NotServing);
    let run = Leasewrap::new()
        .on_zookeeper(&fake.connect())
        .name("riding-out")
        .args(&["-w", "3s", "--dial-timeout", "500ms"])
        .cmd(&["true"])
        .output();
    assert_exit(&run, 69);
    let said = run
        .stderr
        .lines()
        .filter(|l| l.contains("waiting for the ZooKeeper ensemble to serve"))
        .collect::<Vec<_>>();
    assert_eq!(said.len(), 1, "{}", run.stderr);
    assert!(
        said[0].contains(&fake.addr(0)) && said[0].contains(&fake.addr(1)),
        "{}",
        said[0]
    );
    assert!(said[0].contains("not serving"), "{}", said[0]);
}

/// Finding 2: a member that answers the Look and PINGs but never a Sync (a follower cut off from
/// its leader) costs one renewal: the stuck step is given up, the session moves to the other
/// member and the lease is renewed there, never lost while that member serves.
#[test]
fn a_step_a_member_never_answers_moves_the_session_and_the_lease_is_kept() {
    let fake = FakeZk::start(2, MIN, MAX);
    fake.cue(1, Cue::NotServing);
    let sb = Sandbox::new();
    let mut a = holder(&fake.connect(), "cut-off", "8s", Marks::new(&sb, "a"));
    let child = a.child();
    fake.wait_for(STARTUP, "a renewal on member 0", |seen| {
        requested(seen, 0, 14)
    });
    fake.lift(1);
    fake.cue(0, Cue::Stall(9));
    let stalled = Instant::now();
    let renewed = fake.saw_within(Duration::from_secs(10), |seen| requested(seen, 1, 14));
    assert!(renewed, "no renewal on member 1\n{}", a.run.stderr());
    // Three renewal periods (TTL/4) on the other member, the child running throughout.
    while stalled.elapsed() < Duration::from_secs(6) {
        assert!(pid_alive(child), "the lease was lost\n{}", a.run.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    a.release();
    a.finish_with(0);
}

/// Finding 2: a move that another session id answers has lost the session: the lease is lost,
/// not kept under a session that owns nothing.
#[test]
fn a_move_answered_with_another_session_id_loses_the_lease() {
    let fake = FakeZk::start(2, MIN, MAX);
    fake.cue(1, Cue::NotServing);
    let sb = Sandbox::new();
    let mut a = holder(&fake.connect(), "other-id", "4s", Marks::new(&sb, "a"));
    a.child();
    fake.lift(1);
    fake.cue(1, Cue::OtherSessionId);
    fake.cue(0, Cue::NotServing);
    fake.drop_connections(0);
    a.wait(Duration::from_secs(8));
    assert_exit(&a.run, 124);
    assert!(a.run.stderr().contains("session"), "{}", a.run.stderr());
}

/// A create of the lock's parents whose answer a moving connection lost is sent again on the
/// session's next member: the run goes on in the same session, not on a new one after a wait
/// for the ensemble (what the whole attempt started over used to do).
#[test]
fn a_parent_create_lost_to_a_move_is_sent_again_in_the_same_session() {
    let fake = FakeZk::start(2, MIN, MAX);
    for member in 0..2 {
        fake.cue(member, Cue::CloseOnCreateOf("/leasewrap".into()));
    }
    let mut run = holding(&fake.connect(), "parent-lost", "8s")
        .cmd(&["true"])
        .spawn();
    let status = run.wait_timeout(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", run.stderr());
    let seen = fake.seen();
    let (first, id) = seen
        .iter()
        .find_map(|s| match s {
            Seen::Connect {
                member,
                asked: 8000,
                session: 0,
                given: Some((id, _)),
            } => Some((*member, *id)),
            _ => None,
        })
        .expect("the main session was given");
    assert!(
        sessions_given(&seen, 1 - first).contains(&(id, 8000)),
        "the session did not move to the other member: {seen:?}\n{}",
        run.stderr()
    );
    assert!(
        !run.stderr().contains("waiting for the ZooKeeper ensemble"),
        "{}",
        run.stderr()
    );
    assert!(fake
        .children("/leasewrap")
        .contains(&"parent-lost".to_owned()));
}

/// Finding 2: a connection lost while the chroot is made is the ensemble's trouble, which a
/// waiter rides out, as everywhere else (not a refusal that ends the run).
#[test]
fn a_connection_lost_while_the_chroot_is_made_is_ridden_out() {
    let fake = FakeZk::start(1, MIN, MAX);
    fake.cue(0, Cue::CloseOn(15));
    let lw = Leasewrap::new()
        .on_zookeeper(&format!("{}/apps/chroot", fake.addr(0)))
        .name("chroot")
        .args(&["-w", "20s"])
        .cmd(&["true"]);
    let mut run = lw.spawn();
    fake.wait_for(STARTUP, "a create", |seen| requested(seen, 0, 15));
    fake.lift(0);
    let status = run.wait_timeout(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", run.stderr());
    assert!(fake.children("/apps").contains(&"chroot".to_owned()));
}
