//! The timeout in force and no needless loss (issue 25 items 7, 8, 12): a move to a member that
//! negotiates a shorter session timeout brings `D` down at once, so nothing overlaps even when
//! the holder is then cut off; with ZooKeeper's default four-letter-word whitelist the smallest
//! TTL leasewrap accepts holds for a minute; a waiter rides out an ensemble without a quorum
//! until its wait runs out, and a stopped member costs a run nothing.

use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::hold;
use crate::etcd::{assert_no_overlap, last_beat_ns, ms, read_ns};
use crate::support::proxy::{Mode, Proxy};
use crate::support::zookeeper::{self, Ensemble, Setup, Zk};
use crate::support::*;

/// As ZooKeeper's own default (`srvr` only), `conf` is refused; the tests' own looks (`dump`,
/// `mntr`) are allowed.
const DEFAULT_WHITELIST: Setup = Setup {
    whitelist: Some("srvr,dump,mntr"),
    tick: None,
    extra: Vec::new(),
};

/// Item 8: member 0 grants at most 1 s, the others 8 s. A holds through member 1 (member 0's
/// proxy blackholed at first), B waits on member 2. Member 1 is killed, A's session moves to
/// member 0 at 1 s, and A's link is cut at once: the leader expires A's session 1 s after the
/// move (A cannot close it), and A's child, which ignores SIGTERM, must be dead before B's
/// starts.
#[test]
fn a_move_to_a_member_with_a_shorter_timeout_brings_d_down_and_nothing_overlaps() {
    let setup = Setup {
        extra: vec!["maxSessionTimeout=8000".into()],
        ..DEFAULT_WHITELIST
    };
    let mut ensemble = Ensemble::start_with(&setup, |i| match i {
        0 => vec!["maxSessionTimeout=1000".into()],
        _ => Vec::new(),
    });
    let to_0 = Proxy::start(ensemble.addr(0));
    to_0.set_mode(Mode::Blackhole);
    let name = zookeeper::unique_name("shorter");
    let sb = Sandbox::new();
    let args = [
        "--ttl",
        "8s",
        "--kill-after",
        "1s",
        "--margin",
        "300ms",
        "-vv",
    ];
    let a_at = format!("{},{}", ensemble.endpoint(1), to_0.addr());
    let mut a = holder_ignoring_term(&a_at, &name, &args, &sb);
    let a_child = a.child();
    let b = Leasewrap::new()
        .on_zookeeper(&ensemble.endpoint(2))
        .name(&name)
        .args(&args);
    let b = Job::spawn(b.args(&["-w", "120s"]), Marks::new(&sb, "b"), false);
    let leader = || ensemble.port(ensemble.leader_index());
    super::wait_for_queue_len_at(leader, &name, 2, STARTUP);
    to_0.heal();
    ensemble.kill(1);
    wait_until(
        Duration::from_secs(20),
        "A's session to move to member 0",
        || a.run.stderr().contains("shorter session timeout"),
    );
    to_0.set_mode(Mode::Blackhole);
    let moved = crate::etcd::now_ns();
    wait_until(Duration::from_secs(30), "B's child to start", || {
        assert_no_overlap(&a, &b, a_child, "a move to a shorter timeout");
        b.marks.started()
    });
    a_beat_last_before_b_started(&a, &b, moved);
    assert_eq!(a.wait(STARTUP).code(), Some(124), "{}", a.run.stderr());
    b.release();
}

/// A holder whose child ignores SIGTERM, so that only leasewrap's SIGKILL ends it.
fn holder_ignoring_term(at: &str, name: &str, args: &[&str], sb: &Sandbox) -> Job {
    let a = Leasewrap::new().on_zookeeper(at).name(name).args(args);
    // A's child ignores the stop signal: only the SIGKILL at the lowered D ends it.
    let marks = Marks::new(sb, "a");
    let script = format!("trap '' TERM; {}", marks.script(true));
    Job::with_script(a, marks, script)
}

/// A's child's last beat came before B's child started; both are printed from the move.
fn a_beat_last_before_b_started(a: &Job, b: &Job, moved: i128) {
    let (last_beat, b_start) = (last_beat_ns(&a.marks.beat), read_ns(&b.marks.start));
    assert!(
        last_beat < b_start,
        "A's child beat {:.1} ms after B's child started",
        ms(last_beat - b_start)
    );
    eprintln!(
        "ZooKeeper shorter timeout: A's last beat {:.0} ms, B's start {:.0} ms after the move",
        ms(last_beat - moved),
        ms(b_start - moved)
    );
}

/// Items 7 and 12: with two of three members stopped the ensemble has no quorum; a waiter rides
/// it out (`-w 60s`: no 69 after the dial timeout) and takes the lease once they continue, while
/// one whose wait runs out first exits 69 naming what timed out. Then with one follower stopped,
/// every run gets its session from the others.
#[test]
fn a_waiter_rides_out_an_ensemble_without_quorum_and_a_stopped_member_costs_nothing() {
    let mut ensemble = Ensemble::start();
    let leader = ensemble.leader_index();
    let others: Vec<usize> = (0..Ensemble::SIZE).filter(|&i| i != leader).collect();
    let name = zookeeper::unique_name("no_quorum");
    let sb = Sandbox::new();
    for &i in &others {
        ensemble.signal(i, Signal::SIGSTOP);
    }
    wait_until(
        Duration::from_secs(20),
        "the leader to stop serving",
        || ensemble.mode(leader).is_none(),
    );
    let connect = ensemble.connect();
    let lw = || Leasewrap::new().on_zookeeper(&connect).name(&name);
    let patient = lw().args(&["-w", "60s", "-vv"]);
    let patient = Job::spawn(patient, Marks::new(&sb, "patient"), false);
    let hasty = lw().args(&["-w", "3s"]).cmd(&["true"]).output();
    assert_exit(&hasty, 69);
    assert!(hasty.stderr.contains("gave up waiting"), "{}", hasty.stderr);
    assert!(hasty.stderr.contains("no session"), "{}", hasty.stderr);
    let mut patient = patient;
    let gave_up = patient.run.try_status();
    assert!(
        gave_up.is_none(),
        "the patient waiter gave up: {}",
        patient.run.stderr()
    );
    for &i in &others {
        ensemble.signal(i, Signal::SIGCONT);
    }
    wait_until(
        Duration::from_secs(40),
        "the patient waiter's child",
        || patient.marks.started(),
    );
    // Once taken, the lease may be lost while the members resync (a loss is no overlap).
    patient.release();
    let exit = patient.wait(Duration::from_secs(20)).code();
    assert!(
        matches!(exit, Some(0 | 124)),
        "the patient waiter: {exit:?}\n{}",
        patient.run.stderr()
    );
    a_stopped_follower_costs_no_run(&mut ensemble, &lw);
}

/// Once every member serves again, eight runs in a row succeed with one follower stopped.
fn a_stopped_follower_costs_no_run(ensemble: &mut Ensemble, lw: &dyn Fn() -> Leasewrap) {
    wait_until(
        Duration::from_secs(40),
        "every member to serve again",
        || (0..Ensemble::SIZE).all(|i| ensemble.mode(i).is_some()),
    );
    let follower = ensemble.other_than(&[ensemble.leader_index()]);
    ensemble.signal(follower, Signal::SIGSTOP);
    for _ in 0..8 {
        assert_exit(&lw().args(&["-n"]).cmd(&["true"]).output(), 0);
    }
    ensemble.signal(follower, Signal::SIGCONT);
}

/// Item 12: on ZooKeeper's default whitelist (no `conf`) and tickTime 250 ms, the smallest TTL
/// leasewrap accepts (64 below it) holds the lease for 60 s with a waiter queued behind it, never
/// lost.
#[test]
fn on_the_default_whitelist_the_smallest_ttl_accepted_holds_for_a_minute() {
    let zk = Zk::start_with(&Setup {
        tick: Some(Duration::from_millis(250)),
        ..DEFAULT_WHITELIST
    });
    let name = "hold";
    let smallest = smallest_ttl_accepted(&zk, name);
    let sb = Sandbox::new();
    let lw = || {
        Leasewrap::new()
            .on_zookeeper(&zk.connect())
            .name(name)
            .args(&["--ttl", smallest])
    };
    let holder = hold(lw(), &sb, "a");
    let waiter = Job::spawn(lw(), Marks::new(&sb, "b"), false);
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(60) {
        assert!(
            pid_alive(holder.child()),
            "--ttl {smallest}: the lease was lost\n{}",
            holder.run.stderr()
        );
        assert!(
            !waiter.marks.started(),
            "--ttl {smallest}: the waiter started"
        );
        thread::sleep(Duration::from_millis(200));
    }
    eprintln!("ZooKeeper default whitelist, tickTime 250 ms: --ttl {smallest} held for 60 s");
    holder.finish();
    waiter.finish();
}

/// The smallest of a few TTLs that a free lease is taken with (64 and 69 below it).
fn smallest_ttl_accepted(zk: &Zk, name: &str) -> &'static str {
    let try_ttl = |ttl: &str| {
        let lw = Leasewrap::new().on_zookeeper(&zk.connect()).name(name);
        lw.args(&["--ttl", ttl, "-n"]).cmd(&["true"]).output()
    };
    let ttls = ["1s", "1500ms", "2s", "2500ms", "3s", "4s"];
    ttls.iter()
        .find(|t| {
            let out = try_ttl(t);
            // 64: the rule leaves no room; 69: the ensemble answered too slowly just now.
            let code = out.status.code();
            assert!(
                matches!(code, Some(0 | 64 | 69)),
                "--ttl {t}: {}",
                out.stderr
            );
            code == Some(0)
        })
        .expect("some TTL up to 4 s is accepted")
}

/// A follower cut off from its leader keeps answering reads and PINGs for syncLimit x tickTime
/// (here 5 x 2 s), never a sync. The holder's renewal stuck there is given up while a fresh one
/// still fits, its session moves to a member that serves, and the lease is kept: the child runs
/// on past the time the stuck renewal would have lost it (about 5 s with --ttl 8s) and past the
/// follower's own 10 s.
#[test]
fn a_renewal_stuck_on_a_cut_off_follower_moves_on_and_the_lease_is_kept() {
    let setup = Setup {
        tick: Some(Duration::from_secs(2)),
        extra: vec!["syncLimit=5".into()],
        ..Setup::default()
    };
    let ensemble = Ensemble::start_with(&setup, |_| Vec::new());
    let leader = ensemble.leader_index();
    let follower = ensemble.other_than(&[leader]);
    let to_other = Proxy::start(ensemble.addr(ensemble.other_than(&[leader, follower])));
    to_other.set_mode(Mode::Blackhole);
    let sb = Sandbox::new();
    let at = format!("{},{}", ensemble.endpoint(follower), to_other.addr());
    let lw = Leasewrap::new()
        .on_zookeeper(&at)
        .name(&zookeeper::unique_name("cut_off"))
        .args(&["--ttl", "8s", "-vv"]);
    let mut a = hold(lw, &sb, "a");
    let child = a.child();
    to_other.heal();
    ensemble.isolate(follower);
    let cut = Instant::now();
    while cut.elapsed() < Duration::from_secs(12) {
        assert!(
            pid_alive(child),
            "the lease was lost {:?} after the cut\n{}",
            cut.elapsed(),
            a.run.stderr()
        );
        thread::sleep(Duration::from_millis(100));
    }
    assert!(
        a.run.stderr().contains("trying the next member"),
        "{}",
        a.run.stderr()
    );
    ensemble.heal(follower);
    a.release();
    a.finish_with(0);
}
