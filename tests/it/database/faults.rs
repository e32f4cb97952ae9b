//! Faults of the database and of the hosts around the database lease, against a real
//! PostgreSQL 15: the server restarted within `L` and stopped for longer, another session
//! holding the lease's row lock, wall clocks hours apart and stepped, a waiter paused while the
//! holder crashed. The scenarios that need no server of their own are functions on any `Lease`,
//! which database::on_mariadb runs on MariaDB too.
//!
//! The tests that stop the server start one of their own (`Postgres::start`): the shared one
//! serves every test of the binary. Every wait is for a file a child writes, a log line, the
//! row's version or an exit, each with a bound; a fault's duration is the scenario itself.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{place, place_on, sigkill_and_time_the_takeover, wait_one_second, Lease, Place};
use crate::dbfence::wait_for_lock_wait;
use crate::etcd::{
    keep_fault_until, last_beat_ns, ms, now_ns, read_ns, ContinueOnDrop, Stopped, TAKEOVER_BOUND,
    TTL,
};
use crate::fence::{hours_off, json_timestamp};
use crate::postgres::{pg, session_holding};
use crate::support::postgres::Postgres;
use crate::support::*;

/// The latest `D` can be after the last renewal sent, at `L` = 2 s and the default `--drift`
/// (0.1) and margin (L/10): L/1.1 - L/10.
const D_AFTER_RENEWAL: Duration = Duration::from_millis(1618);

/// How late a death is seen after it happened: a few of `wait_until`'s polls on a loaded box.
const SEEN_WITHIN: Duration = Duration::from_millis(50);

/// The multi-threaded libfaketime (Debian package faketime).
const LIBFAKETIME_MT: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// A place of the test's own on the shared server, and a sandbox for its jobs' marks.
fn fresh(label: &str) -> (Place<'static>, Sandbox) {
    (place(label), Sandbox::new())
}

/// The row's version, from `Place::row`'s `version|token|held`.
#[track_caller]
pub(crate) fn version(p: &impl Lease) -> u64 {
    let row = p.lease_row();
    let v = row.split('|').next().unwrap_or_default();
    v.parse()
        .unwrap_or_else(|_| panic!("the lease's row is {row:?}"))
}

/// Waits until the row's version moved past `after` (a renewal, a take or a release committed);
/// returns the new one.
#[track_caller]
pub(crate) fn next_version(p: &impl Lease, after: u64, bound: Duration) -> u64 {
    let mut now = after;
    wait_until(bound, "the lease's row to move", || {
        now = version(p);
        now > after
    });
    now
}

/// Waits for the holder's next renewal to commit (one comes every L/3).
#[track_caller]
pub(crate) fn a_renewal(p: &impl Lease) {
    next_version(p, version(p), STARTUP);
}

/// Waits until `child` is dead; how long after `from` it was seen dead.
#[track_caller]
fn death_after(child: i32, from: Instant, bound: Duration) -> Duration {
    wait_until(bound, "the holder's child to die", || !pid_alive(child));
    from.elapsed()
}

/// A holder whose child beats every 20 ms (label `a`), once its child runs: the job, the
/// child's pid and the token.
#[track_caller]
pub(crate) fn beating_holder(lw: Leasewrap, sb: &Sandbox) -> (Job, i32, u64) {
    let a = Job::spawn(lw, Marks::new(sb, "a"), true);
    let (child, token) = (a.child(), a.token());
    (a, child, token)
}

/// `job` once it says it waits for the lease; its child has not run.
#[track_caller]
fn waiting(job: Job) -> Job {
    wait_until(STARTUP, "the waiter to wait", || {
        job.run.stderr().contains("waiting for the lease")
    });
    assert!(!job.marks.started(), "the waiter ran at once");
    job
}

// ---------------------------------------------------------------------------------------------
// The server restarted, or stopped for longer than L.

/// `L` of the restart test: a fast stop and a start (0.2 s on an idle machine) fit well within
/// the 2.4 s between a renewal and the stop time, on a loaded 2-core machine too.
const RESTART_TTL: &str = "4s";

#[test]
fn a_holder_rides_out_a_database_restarted_within_l_and_keeps_its_token() {
    let pg = Postgres::start();
    let p = place_on(&pg, "restart");
    let sb = Sandbox::new();
    let lw = p.job_with_ttl(&p.url(), RESTART_TTL);
    let (a, child, token) = beating_holder(lw, &sb);
    a_renewal(&p);
    let stopped = Instant::now();
    pg.stop("fast");
    pg.start_again();
    carried_on_after_a_restart(&p, (a, child, token), stopped, "pg_ctl stop -m fast, start");
}

/// After the server restarted (from `stopped`, by `how`): the holder `a` (its child `child`, its
/// token `token`) noticed, renewed again, its child untouched, and ends with its token kept.
#[track_caller]
pub(crate) fn carried_on_after_a_restart(
    p: &impl Lease,
    (a, child, token): (Job, i32, u64),
    stopped: Instant,
    how: &str,
) {
    let outage = stopped.elapsed();
    next_version(p, version(p), STARTUP * 2);
    let renewed = stopped.elapsed();
    assert!(pid_alive(child), "the child died: {}", a.run.stderr());
    assert!(
        a.run.stderr().contains("renewing the lease failed"),
        "the restart went unnoticed: {}",
        a.run.stderr()
    );
    eprintln!(
        "{} restarted ({how}) in {:.0} ms; the holder renewed {:.0} ms after the stop",
        p.server(),
        outage.as_secs_f64() * 1e3,
        renewed.as_secs_f64() * 1e3
    );
    a.finish();
    let row = p.lease_row();
    assert_eq!(
        row.split('|').nth(1),
        Some(token.to_string().as_str()),
        "{row}"
    );
}

#[test]
fn a_database_down_longer_than_l_kills_the_holder_s_child_by_d_and_a_waiter_takes_over_when_it_is_back(
) {
    let pg = Postgres::start();
    let p = place_on(&pg, "down");
    let (stop, start) = (|| pg.stop("immediate"), || pg.start_again());
    down_longer_than_l(&p, (&stop, &start), "pg_ctl stop -m immediate");
}

/// The scenario of the test above on the lease `p`, whose server `stop` stops (by `how`) and
/// `start` starts again: A's child dies by D and A exits 124; the waiter B, riding out the
/// outage, takes the next token once the server is back, never while it is down.
#[track_caller]
pub(crate) fn down_longer_than_l(p: &impl Lease, (stop, start): (&dyn Fn(), &dyn Fn()), how: &str) {
    let sb = Sandbox::new();
    let (mut a, child, token) = beating_holder(p.holder(), &sb);
    let lw = p.holder().args(&["--dial-timeout", "1s"]);
    let b = waiting(Job::spawn(lw, Marks::new(&sb, "b"), false));
    a_renewal(p);
    stop();
    // Every renewal that succeeded was sent before now: D is at most D_AFTER_RENEWAL ahead.
    let (down, down_ns) = (Instant::now(), now_ns());
    let dead = death_after(child, down, TTL + STARTUP);
    a.wait(STARTUP);
    assert_exit(&a.run, 124);
    let last_beat = ms(last_beat_ns(&a.marks.beat) - down_ns);
    assert!(
        dead < D_AFTER_RENEWAL + SEEN_WITHIN,
        "the child was seen dead {dead:?} after the server stopped, past D"
    );
    keep_fault_until(down + 2 * TTL);
    assert!(!b.marks.started(), "B ran while the database was down");
    start();
    let back_ns = now_ns();
    assert_eq!(b.token(), token + 1, "{}", b.run.stderr());
    let b_start = read_ns(&b.marks.start);
    eprintln!(
        "{} down for {:.0} ms ({how}): A's child beat last {last_beat:.0} ms and was seen dead {:.0} ms after the stop, A exit 124; B's child started {:.0} ms after the start",
        p.server(),
        ms(back_ns - down_ns),
        dead.as_secs_f64() * 1e3,
        ms(b_start - back_ns)
    );
    b.finish();
}

// ---------------------------------------------------------------------------------------------
// The row brought back: a promoted asynchronous replica, or a restore.

#[test]
fn a_row_brought_back_under_another_run_with_the_holder_s_token_is_lost_at_the_reconnect() {
    let (p, sb) = fresh("brought_back");
    brought_back(&p, &sb);
}

/// The holder's session ends and its row comes back held under its own token by another run (a
/// promoted replica lost the take, and a take since counted to the same token): at its
/// reconnect the holder reads the row, loses the lease (its child stopped, exit 124) and leaves
/// the other run's row held. A compare-and-set on the token alone would renew it as its own.
#[track_caller]
pub(crate) fn brought_back(p: &impl Lease, sb: &Sandbox) {
    let (mut a, child, token) = beating_holder(p.holder(), sb);
    a_renewal(p);
    p.bring_back_under_another_run();
    let back = Instant::now();
    let dead = death_after(child, back, TTL + STARTUP);
    a.wait(STARTUP);
    assert_exit(&a.run, 124);
    let stderr = a.run.stderr();
    assert!(stderr.contains("the row was brought back"), "{stderr}");
    let row = p.lease_row();
    let fields: Vec<&str> = row.split('|').collect();
    assert!(
        fields[1..] == [token.to_string().as_str(), "true"]
            || fields[1..] == [token.to_string().as_str(), "1"],
        "the other run's row was not left held: {row}"
    );
    eprintln!(
        "{}: the row brought back under another run with token {token}; the holder's child was seen dead {:.0} ms after, the row left held",
        p.server(),
        dead.as_secs_f64() * 1e3
    );
}

// ---------------------------------------------------------------------------------------------
// Another session holding the lease's row lock.

/// `SELECT ... FOR UPDATE` of the lease's row in a psql session of the test's own, which holds
/// the lock until the file `lock.go` exists.
fn lock_the_row(p: &Place<'static>, sb: &Sandbox) -> thread::JoinHandle<Output> {
    let sql = format!(
        "SELECT version FROM leasewrap_data.lease WHERE name = '{}' FOR UPDATE;",
        p.name
    );
    session_holding(sb, (p.pg, &p.db), "lock", &sql)
}

/// Ends `lock_the_row`'s transaction; the instant it was told to (it commits within 10 ms).
#[track_caller]
pub(crate) fn unlock(sb: &Sandbox, session: thread::JoinHandle<Output>) -> i128 {
    let told = now_ns();
    std::fs::File::create(sb.path("lock.go")).unwrap();
    let out = session.join().expect("the locking session");
    assert!(out.status.success(), "{}", out.stderr);
    told
}

#[test]
fn a_take_behind_another_session_s_row_lock_gives_up_with_69_and_takes_once_the_lock_goes() {
    let (p, sb) = fresh("row_lock");
    a_take_behind_a_row_lock(&p, &sb, lock_the_row);
}

/// A run that took the lease once, then another session holding the row's lock (`lock`, which
/// `unlock` ends): `-w 1s` and `-n` are 69 in one line within L, running nothing; a waiter
/// takes the next token once the lock goes: the runs that gave up left no take to commit later.
pub(crate) fn a_take_behind_a_row_lock<P: Lease>(
    p: &P,
    sb: &Sandbox,
    lock: impl FnOnce(&P, &Sandbox) -> thread::JoinHandle<Output>,
) {
    assert_exit(&p.holder().shell("exit 0").output(), 0);
    let session = lock(p, sb);
    let ran = sb.path("ran");
    let (out, waited) = wait_one_second(p.quiet_run(), &ran);
    assert_exit(&out, 69);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(waited < TTL, "-w 1s took {waited:?}");
    assert!(!ran.exists());
    let started = Instant::now();
    let out = p.quiet_run().args(&["-n"]).shell("exit 3").output();
    assert_exit(&out, 69);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    let no_wait = started.elapsed();
    assert!(no_wait < TTL, "-n took {no_wait:?}");
    let b = Job::spawn(p.holder(), Marks::new(sb, "b"), false);
    wait_until(STARTUP, "the waiter's take to time out", || {
        b.run.stderr().contains("taking the lease failed")
    });
    assert!(!b.marks.started(), "B ran while the row was locked");
    let unlocked = unlock(sb, session);
    let took = ms(read_ns(&b.marks.start) - unlocked);
    eprintln!(
        "a take behind a row lock ({}): -w 1s exit 69 after {:.0} ms, -n exit 69 after {:.0} ms; the waiter's child started {took:.0} ms after the lock went",
        p.server(),
        waited.as_secs_f64() * 1e3,
        no_wait.as_secs_f64() * 1e3
    );
    // The token after the first run's: the run that gave up left no take to commit later.
    assert_eq!(b.token(), 2, "{}", p.lease_row());
    assert!(took < ms(TTL.as_nanos() as i128), "B took {took:.0} ms");
    b.finish();
}

#[test]
fn a_holder_whose_renewal_waits_on_another_session_s_row_lock_loses_its_child_by_d_and_exits_124() {
    let (p, sb) = fresh("renew_lock");
    let (mut a, child, token) = beating_holder(p.job(&p.url()), &sb);
    a_renewal(&p);
    let session = lock_the_row(&p, &sb);
    // No renewal sent from now on can succeed: D is at most D_AFTER_RENEWAL ahead.
    let (locked, locked_ns) = (Instant::now(), now_ns());
    wait_for_lock_wait(&pg(), &p.db, "lease_renew", TTL);
    let dead = death_after(child, locked, TTL + STARTUP);
    a.wait(STARTUP);
    assert_exit(&a.run, 124);
    assert!(
        dead < D_AFTER_RENEWAL + SEEN_WITHIN,
        "the child was seen dead {dead:?} after the lock, past D"
    );
    let stderr = a.run.stderr();
    assert!(
        stderr.contains("no renewal came before the deadline"),
        "{stderr}"
    );
    let last_beat = ms(last_beat_ns(&a.marks.beat) - locked_ns);
    let unlocked = unlock(&sb, session);
    eprintln!(
        "a renewal behind a row lock: A's child beat last {last_beat:.0} ms and was seen dead {:.0} ms after the lock, A exit 124; the lock held {:.0} ms",
        dead.as_secs_f64() * 1e3,
        ms(unlocked - locked_ns)
    );
    // What A left queued behind the lock commits now, its release last: the row is free.
    wait_until(STARTUP, "A's queued release to commit", || {
        p.row().ends_with(&format!("|{token}|false"))
    });
    let next = p.job(&p.url()).args(&["-n"]).shell("exit 0").output();
    assert_exit(&next, 0);
    assert!(
        p.row().ends_with(&format!("|{}|false", token + 1)),
        "{}",
        p.row()
    );
}

// ---------------------------------------------------------------------------------------------
// Wall clocks hours off, and stepped.

/// `lw` with its wall clock faked by libfaketime as `env` says, logging JSON (its timestamps
/// show that clock).
fn faked(lw: Leasewrap, env: &[(&str, &str)]) -> Leasewrap {
    assert!(
        Path::new(LIBFAKETIME_MT).is_file(),
        "{LIBFAKETIME_MT} is needed (Debian package faketime; scripts/test.sh installs it)"
    );
    let lw = lw
        .args(&["--log-format", "json"])
        .env("LD_PRELOAD", LIBFAKETIME_MT);
    env.iter().fold(lw, |lw, (k, v)| lw.env(k, v))
}

/// The log line of `job` that holds `message` is stamped `hours` off the real wall clock.
#[track_caller]
fn assert_logged_hours_off(job: &Job, message: &str, hours: i64) {
    let log = job.run.stderr();
    let line = log.lines().find(|l| l.contains(message));
    let stamp = line.and_then(json_timestamp);
    let stamp = stamp.unwrap_or_else(|| panic!("no {message:?} line with a timestamp in {log}"));
    assert_eq!(hours_off(stamp), hours, "{message:?} in {log}");
}

/// A job whose child runs without libfaketime, so that its marks (`date`) are on the real
/// clock.
fn unfaked_job(lw: Leasewrap, sb: &Sandbox, label: &str) -> Job {
    let marks = Marks::new(sb, label);
    let script = format!("unset LD_PRELOAD; {}", marks.script(false));
    Job::with_script(lw, marks, script)
}

/// libfaketime is loaded into the leasewrap of `job`.
#[track_caller]
fn assert_faked(job: &Job) {
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", job.run.pid()));
    assert!(
        maps.unwrap_or_default().contains("libfaketime"),
        "libfaketime is not loaded in leasewrap"
    );
}

/// A holder whose wall clock is stepped 5 hours back and then 5 hours ahead while it renews
/// hands over at once on release to a waiter whose every clock runs 5 hours ahead; that one,
/// SIGKILLed, is taken over by a waiter whose wall clock is 5 hours behind only after `L`.
#[test]
fn wall_clocks_hours_apart_and_stepped_change_neither_the_handover_nor_the_ttl() {
    let (p, sb) = fresh("wall_clocks");
    wall_clocks_apart(&p, &sb);
}

/// The scenario of the test above on the lease `p`.
#[track_caller]
pub(crate) fn wall_clocks_apart(p: &impl Lease, sb: &Sandbox) {
    let offset = sb.path("faketime-offset");
    std::fs::write(&offset, "+0\n").unwrap();
    let stepped = [
        ("FAKETIME_TIMESTAMP_FILE", offset.to_str().unwrap()),
        ("FAKETIME_NO_CACHE", "1"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let mut a = unfaked_job(faked(p.holder(), &stepped), sb, "a");
    a.child();
    let ahead = faked(p.holder(), &[("FAKETIME", "+5h")]);
    let b = waiting(unfaked_job(ahead, sb, "b"));
    assert_faked(&a);
    assert_faked(&b);
    for step in ["-5h\n", "+5h\n"] {
        std::fs::write(&offset, step).unwrap();
        a_renewal(p);
    }
    assert!(
        pid_alive(a.child()) && !b.marks.started(),
        "{}",
        p.lease_row()
    );
    a.release();
    let handover = ms(read_ns(&b.marks.start) - read_ns(&a.marks.end));
    a.finish_with(0);
    assert_eq!(b.token(), a.token() + 1);
    let behind = [("FAKETIME", "-5h"), ("FAKETIME_DONT_FAKE_MONOTONIC", "1")];
    let c = waiting(unfaked_job(faked(p.holder(), &behind), sb, "c"));
    assert_faked(&c);
    assert_logged_hours_off(&a, "acquired", 0);
    assert_logged_hours_off(&a, "released", 5);
    assert_logged_hours_off(&b, "waiting for the lease", 5);
    assert_logged_hours_off(&c, "waiting for the lease", -5);
    let waited = sigkill_and_time_the_takeover(b, &c);
    eprintln!(
        "wall clocks 5 h apart and stepped: handover {handover:.1} ms; C took over {waited:.0} ms after B was SIGKILLed (L {TTL:?})"
    );
    assert!(handover > 0.0 && handover < ms(TTL.as_nanos() as i128) / 2.0);
    c.finish();
}

// ---------------------------------------------------------------------------------------------
// A waiter paused while the holder crashed.

/// B is SIGSTOPped while it waits; A renews once more (a version B has not seen) and is
/// SIGKILLed; B stays stopped past `L` after the crash, so that a waiter counting from its read
/// before the pause, or from the crash, would take over at once. Resumed, B must read again
/// and count `L` from that read's answer.
#[test]
fn a_waiter_paused_while_the_holder_crashed_takes_over_only_l_after_it_reads_again() {
    let (p, sb) = fresh("paused_waiter");
    paused_waiter(&p, &sb);
}

/// The scenario of the test above on the lease `p`.
#[track_caller]
pub(crate) fn paused_waiter(p: &impl Lease, sb: &Sandbox) {
    let (mut a, a_child, a_token) = beating_holder(p.holder(), sb);
    let b = waiting(Job::spawn(p.holder(), Marks::new(sb, "b"), false));
    let b_pid = b.run.pid();
    let _resume = ContinueOnDrop(Stopped::Leasewrap, b_pid);
    Stopped::Leasewrap
        .signal(b_pid, Signal::SIGSTOP)
        .expect("SIGSTOP");
    let stopped = Instant::now();
    wait_until(STARTUP, "the waiter to stop", || is_stopped(b_pid));
    a_renewal(p);
    a.run.kill(Signal::SIGKILL);
    let killed = Instant::now();
    assert_all_die_within(Duration::from_secs(1), &[("A's child", a_child)]);
    a.wait(STARTUP);
    keep_fault_until(killed + TTL + TTL / 2);
    assert!(is_stopped(b_pid), "the waiter was resumed before SIGCONT");
    Stopped::Leasewrap
        .signal(b_pid, Signal::SIGCONT)
        .expect("SIGCONT");
    let (paused, resumed_ns) = (stopped.elapsed(), now_ns());
    let waited = ms(read_ns(&b.marks.start) - resumed_ns);
    eprintln!(
        "a waiter paused {:.0} ms while the holder crashed: its child started {waited:.0} ms after SIGCONT (L {TTL:?})",
        paused.as_secs_f64() * 1e3
    );
    assert!(
        last_beat_ns(&a.marks.beat) < read_ns(&b.marks.start),
        "A's child beat after B's started"
    );
    assert!(
        waited >= ms(TTL.as_nanos() as i128),
        "B took over {waited:.0} ms after it resumed, less than L"
    );
    assert!(waited < ms(TAKEOVER_BOUND.as_nanos() as i128));
    assert_eq!(b.token(), a_token + 1);
    b.finish();
}
