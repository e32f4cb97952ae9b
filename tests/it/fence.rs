//! fenced-write and fenced-put seen from outside (SPEC §7, §9 F6, F10, F11): a stale token is
//! refused and changes nothing; concurrent or killed writers never leave DEST torn nor the
//! recorded token lower; a paused leader's late writes are refused while the next holder's data
//! survives; a clock running 5 % fast or slow, or a wall clock hours off, changes nothing.
//!
//! Tests that need etcd run against 3.4 and 3.5 on the `shared` servers, each under its own
//! prefix, and fail (never skip) when etcd or libfaketime is missing. Every wait is bounded and
//! waits for something observable.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::support::etcd::{self, Etcd, Version};
use crate::support::proxy::{Mode, Proxy};
use crate::support::{
    assert_all_die_within, assert_exit, atomically, clean_env, cmdline, comm, is_stopped,
    pid_alive, ppid_of, q, read_line_file, read_pid, run_bounded, wait_until, KillOnDrop,
    Leasewrap, Output, Running, Sandbox, BIN,
};

/// TTL of every lease here: etcd's minimum, so that each fault plays out in a few seconds.
const TTL: Duration = Duration::from_secs(2);

/// Bound on anything that should take about a TTL or less, generous for a loaded 2-core machine.
const BOUND: Duration = Duration::from_secs(15);

/// The multi-threaded libfaketime the `faketime -m` wrapper preloads (Debian package faketime).
const LIBFAKETIME_MT: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

// ---------------------------------------------------------------------------------------------
// fenced-write on its own: no lease, no etcd.

#[test]
fn a_stale_token_exits_73_names_both_tokens_and_leaves_dest_byte_identical() {
    let sandbox = Sandbox::new();
    let dest = sandbox.path("report.csv");
    assert_eq!(write(&dest, 10, b"old\n").status.code(), Some(0));
    let before = fs::metadata(&dest).unwrap();

    // The token comes from LEASEWRAP_FENCING_TOKEN when --token is not given.
    let path = dest.to_str().unwrap();
    let refused = Leasewrap::subcommand("fenced-write")
        .args(&[path])
        .env("LEASEWRAP_FENCING_TOKEN", "9")
        .stdin(*b"new\n")
        .output();
    assert_eq!(refused.status.code(), Some(73), "{}", refused.stderr);
    let lines: Vec<&str> = refused.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {:?}", refused.stderr);
    assert!(
        lines[0].contains("stale fencing token 9") && lines[0].contains("records token 10"),
        "names the given token and the one recorded: {}",
        lines[0]
    );
    assert_eq!(write(&dest, 3, b"new\n").status.code(), Some(73));

    let after = fs::metadata(&dest).unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"old\n");
    assert_eq!(
        (after.ino(), after.mtime_nsec()),
        (before.ino(), before.mtime_nsec())
    );
    assert_eq!(recorded(&dest), Some(10));

    // The same holder may write again: an equal token is not stale.
    assert_eq!(write(&dest, 10, b"again\n").status.code(), Some(0));
    assert_eq!(fs::read(&dest).unwrap(), b"again\n");
}

#[test]
fn eight_concurrent_writers_leave_the_highest_tokens_content_and_the_recorded_token_never_drops() {
    let sandbox = Sandbox::new();
    let dest = sandbox.path("report.csv");
    let mut rng = Rng::new("concurrent writers");
    let watcher = Watcher::start(&dest);
    let mut highest = 0;
    for round in 0..5 {
        let tokens: Vec<u64> = (0..8).map(|_| 1 + rng.below(1000)).collect();
        let writers: Vec<_> = tokens
            .iter()
            .map(|&token| {
                let dest = dest.clone();
                thread::spawn(move || (token, write(&dest, token, &content(token))))
            })
            .collect();
        let results: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        highest = highest.max(*tokens.iter().max().unwrap());
        for (token, ran) in results {
            match ran.status.code() {
                Some(0) => {}
                Some(73) => assert!(token < highest, "token {token} refused: {}", ran.stderr),
                _ => panic!(
                    "writer with token {token} ended {:?}: {}",
                    ran.status.code(),
                    ran.stderr
                ),
            }
        }
        let text = fs::read(&dest).unwrap();
        assert!(
            text == content(highest),
            "round {round}: DEST is not token {highest}'s"
        );
        assert_eq!(recorded(&dest), Some(highest), "round {round}");
    }
    let looks = watcher.stop();
    eprintln!("the watcher looked {looks} times");
    assert!(looks > 10, "the watcher looked only {looks} times");
    assert_eq!(
        files_in(&sandbox.path("")),
        ["report.csv", "report.csv.fence", "state"],
        "no temp file is left"
    );
}

#[test]
fn a_writer_killed_mid_stream_leaves_dest_old_or_new_never_torn() {
    let sandbox = Sandbox::new();
    let dest = sandbox.path("report.csv");
    assert_eq!(write(&dest, 1, &content(1)).status.code(), Some(0));
    killed_while_spooling_leaves_dest_as_it_was(&sandbox, &dest);

    // Killed at random points, with its input cut anywhere or complete (then it may be renaming,
    // syncing or recording): DEST is whole, and new data never replaces DEST before its token is
    // recorded.
    let mut rng = Rng::new("kill points");
    let started = Instant::now();
    assert_eq!(write(&dest, 2, &content(2)).status.code(), Some(0));
    let whole_run = started.elapsed().as_micros() as u64;
    let mut points = KillPoints {
        current: 2,
        fence: 2,
        replaced: 0,
        ahead: 0,
    };
    for token in 3..23 {
        kill_a_writer_at_random(&mut rng, &dest, token, whole_run);
        points.check(&dest, token);
    }
    eprintln!(
        "kill points: {} of 20 writers killed within 2 x {whole_run} us had replaced DEST; \
         {} had recorded their token but not yet replaced DEST",
        points.replaced, points.ahead
    );
    assert_eq!(write(&dest, 99, &content(99)).status.code(), Some(0));
    assert!(fs::read(&dest).unwrap() == content(99));
    assert!(
        temp_files(&sandbox.path("")).is_empty(),
        "the last write removed leftover temp files"
    );
}

/// Killed with half of its input in the temp file: DEST is the old file (token 1's), the token
/// unchanged, and no file is left behind.
#[track_caller]
fn killed_while_spooling_leaves_dest_as_it_was(sandbox: &Sandbox, dest: &Path) {
    let mut writer = start_write(dest, 2);
    let new = content(2);
    let half = &new[..new.len() / 2];
    let mut stdin = writer.take_stdin();
    stdin.write_all(half).unwrap();
    wait_until(
        BOUND,
        "half the input in the writer's unnamed temp file",
        || {
            open_files(writer.pid())
                .iter()
                .any(|(_, m)| m.is_file() && m.len() >= half.len() as u64)
        },
    );
    writer.kill(Signal::SIGKILL);
    writer.wait_timeout(BOUND);
    drop(stdin);
    assert!(fs::read(dest).unwrap() == content(1), "DEST changed");
    assert_eq!(recorded(dest), Some(1));
    assert_eq!(
        files_in(&sandbox.path("")),
        ["report.csv", "report.csv.fence", "state"],
        "a writer killed while spooling leaves no file behind"
    );
}

/// Starts writer `token`, gives it all its input or a cut of it, and SIGKILLs it at a random
/// point within about two whole runs.
fn kill_a_writer_at_random(rng: &mut Rng, dest: &Path, token: u64, whole_run: u64) {
    let mut writer = start_write(dest, token);
    let data = content(token);
    let mut stdin = writer.take_stdin();
    if rng.below(3) == 0 {
        // Cut anywhere, the pipe still open when the kill comes.
        let cut = rng.below(data.len() as u64) as usize;
        let _ = stdin.write_all(&data[..cut]);
        std::mem::forget(stdin);
    } else {
        // All of it and EOF: the writer goes on to sync, rename and record.
        let _ = stdin.write_all(&data);
        drop(stdin);
    }
    // The kill point itself, not a wait for anything: anywhere in about two whole runs.
    thread::sleep(Duration::from_micros(rng.below(2 * whole_run)));
    writer.kill(Signal::SIGKILL);
    writer.wait_timeout(BOUND);
}

/// What the killed writers have left so far: the token whose data DEST holds, the token
/// recorded, how many writers had replaced DEST and how many had only recorded their token.
struct KillPoints {
    current: u64,
    fence: u64,
    replaced: usize,
    ahead: usize,
}

impl KillPoints {
    /// After writer `token` was killed, DEST is whole: its data with its token recorded, or
    /// the data before it with the fence at the old token or at `token`.
    #[track_caller]
    fn check(&mut self, dest: &Path, token: u64) {
        let now = fs::read(dest).unwrap();
        let seen = recorded(dest).unwrap();
        if now == content(token) {
            assert_eq!(
                seen, token,
                "token {token}'s data replaced DEST before its token was recorded"
            );
            self.current = token;
            self.replaced += 1;
        } else {
            assert!(
                now == content(self.current),
                "DEST is torn after killing writer {token}"
            );
            // The token is recorded before the rename: a kill in between leaves the fence ahead.
            assert!(
                seen == self.fence || seen == token,
                "token {seen} recorded by writer {token}"
            );
            self.ahead += usize::from(seen == token && seen != self.fence);
        }
        self.fence = seen;
    }
}

// ---------------------------------------------------------------------------------------------
// fenced-put against etcd.

#[test]
fn fenced_put_writes_only_while_the_lock_key_has_the_token_on_etcd_3_4() {
    fenced_put_checks_the_lock_key(Version::V3_4);
}

#[test]
fn fenced_put_writes_only_while_the_lock_key_has_the_token_on_etcd_3_5() {
    fenced_put_checks_the_lock_key(Version::V3_5);
}

fn fenced_put_checks_the_lock_key(version: Version) {
    let etcd = etcd::shared(version);
    let prefix = etcd::unique_prefix("fenced_put");
    let (lock_key, data_key) = (format!("{prefix}lock"), format!("{prefix}data"));
    etcd.etcdctl_ok(&["put", &lock_key, "holder"]);
    let token = create_revision(etcd, &lock_key).expect("lock key just put");
    let put = |token: i64, value: &str| {
        Leasewrap::subcommand("fenced-put")
            .args(&["--token", &token.to_string(), &data_key, value])
            .env("LEASEWRAP_ENDPOINTS", etcd.endpoint())
            .env("LEASEWRAP_KEY", &lock_key)
            .output()
    };
    let value = || {
        etcd.etcdctl_ok(&["get", "--print-value-only", &data_key])
            .trim()
            .to_owned()
    };

    assert_eq!(put(token, "one").status.code(), Some(0));
    assert_eq!(value(), "one");
    for wrong in [token - 1, token + 1] {
        let refused = put(wrong, "stale");
        assert_eq!(refused.status.code(), Some(73), "{}", refused.stderr);
        let line = refused.stderr.trim();
        assert!(
            line.contains(&format!("stale fencing token {wrong}"))
                && line.contains(&format!("create revision {token}")),
            "names the given token and the one seen: {line}"
        );
    }
    etcd.etcdctl_ok(&["del", &lock_key]);
    let refused = put(token, "after the lease");
    assert_eq!(refused.status.code(), Some(73));
    assert!(
        refused.stderr.contains("does not exist"),
        "{}",
        refused.stderr
    );
    assert_eq!(value(), "one", "nothing was written");
    without_endpoints_fenced_put_is_a_one_line_usage_error();
}

/// No endpoints anywhere: a usage error in one line, before any connection.
#[track_caller]
fn without_endpoints_fenced_put_is_a_one_line_usage_error() {
    let no_etcd = Leasewrap::subcommand("fenced-put")
        .args(&["--token", "5", "--lock-key", "k", "a", "b"])
        .output();
    assert_eq!(no_etcd.status.code(), Some(64));
    assert_eq!(
        no_etcd.stderr.trim().lines().count(),
        1,
        "{}",
        no_etcd.stderr
    );
    assert!(no_etcd.stderr.contains("needs etcd"), "{}", no_etcd.stderr);
}

// ---------------------------------------------------------------------------------------------
// F6: leasewrap, watchdog and child all paused for 2 x TTL.

#[test]
fn paused_leaders_stale_writes_are_refused_and_the_next_holders_data_survives_on_etcd_3_4() {
    paused_leader(Version::V3_4, Resume::ChildFirst);
    paused_leader(Version::V3_4, Resume::AllAtOnce);
}

#[test]
fn paused_leaders_stale_writes_are_refused_and_the_next_holders_data_survives_on_etcd_3_5() {
    paused_leader(Version::V3_5, Resume::ChildFirst);
    paused_leader(Version::V3_5, Resume::AllAtOnce);
}

/// How the paused holder comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resume {
    /// Its child first, the watchdog and leasewrap once the child's writes were answered: the
    /// stale writes surely get in before the watchdog can act, and must be refused.
    ChildFirst,
    /// Child, watchdog and leasewrap back to back, as when a whole host resumes; the child may
    /// or may not get a write in before it is killed.
    AllAtOnce,
}

fn paused_leader(version: Version, resume: Resume) {
    let etcd = etcd::shared(version);
    let prefix = etcd::unique_prefix("f6");
    let sandbox = Sandbox::new();
    let dest = sandbox.path("report.csv");
    fs::write(&dest, "v1 (before)\n").unwrap();
    let data_key = format!("{prefix}data");
    let p = |name: &str| sandbox.path(name);
    let mut a = report_lease(&sandbox, etcd, &prefix)
        .shell(&paused_holders_script(&sandbox, &dest, &data_key))
        .spawn();
    let child = read_pid(&p("a.pid"), BOUND);
    let a_token: u64 = read_line_file(&p("a.token"), BOUND).parse().unwrap();
    let watchdog = assert_watchdog_between(&a, child);
    let _cleanup = KillOnDrop(vec![child, watchdog]);

    // The opening case: everything of A stops at once.
    let paused = stop_all_of(&[a.pid(), watchdog], child);
    let b_token = next_holder_writes(&sandbox, etcd, &prefix, &data_key);
    assert!(
        b_token > a_token,
        "B's token {b_token} is not above A's {a_token}"
    );
    wait_until(3 * TTL, "2 x TTL since the pause", || {
        paused.elapsed() >= 2 * TTL
    });
    fs::write(p("go"), "").unwrap();

    let killed_after = resume_a(&sandbox, resume, (a.pid(), watchdog), child);
    let a_status = a.wait_timeout(BOUND);
    assert_only_bs_data_survived(&sandbox, etcd, &data_key, b_token);
    eprintln!(
        "F6 etcd {} {resume:?}: A's child dead {killed_after:?} after SIGCONT; A's writes: {:?} {:?}; \
         A's leasewrap ended {a_status}",
        version.number(),
        fs::read_to_string(p("a.write")).ok().map(|s| s.trim().to_owned()),
        fs::read_to_string(p("a.put")).ok().map(|s| s.trim().to_owned()),
    );
    assert_eq!(
        a_status.code(),
        Some(124),
        "A's leasewrap must say its lease was lost; its log:\n{}",
        a.stderr()
    );
}

/// The next holder B takes the lease and writes DEST and `data_key` (fenced); returns its token.
#[track_caller]
fn next_holder_writes(sandbox: &Sandbox, etcd: &Etcd, prefix: &str, data_key: &str) -> u64 {
    let b_script = format!(
        "{token}
         echo 'v2 (from B)' | {bin} fenced-write {dest} && {bin} fenced-put {data_key} 'from B'",
        token = atomically("echo $LEASEWRAP_FENCING_TOKEN", &sandbox.path("b.token")),
        bin = q(Path::new(BIN)),
        dest = q(&sandbox.path("report.csv")),
    );
    let mut b = report_lease(sandbox, etcd, prefix).shell(&b_script).spawn();
    b.wait_timeout(2 * TTL + BOUND);
    assert_exit(&b, 0);
    read_line_file(&sandbox.path("b.token"), BOUND)
        .parse()
        .unwrap()
}

/// The paused holder A's child: writes its pid and token, waits for `go`, then tries a
/// fenced-write of DEST and a fenced-put of `data_key`, recording each one's status.
fn paused_holders_script(sandbox: &Sandbox, dest: &Path, data_key: &str) -> String {
    let p = |name: &str| sandbox.path(name);
    format!(
        "{pid}; {token}
         i=0; while [ ! -e {go} ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i + 1)); done
         [ -e {go} ] || exit 99
         echo 'v2 (from A)' | {bin} fenced-write {dest}; {wrote}
         {bin} fenced-put {data_key} 'from A'; {put}
         exec sleep 1000",
        pid = atomically("echo $$", &p("a.pid")),
        token = atomically("echo $LEASEWRAP_FENCING_TOKEN", &p("a.token")),
        go = q(&p("go")),
        bin = q(Path::new(BIN)),
        dest = q(dest),
        wrote = atomically("echo $?", &p("a.write")),
        put = atomically("echo $?", &p("a.put")),
    )
}

/// The child's parent is the watchdog, itself the child of leasewrap `a`; returns its pid.
#[track_caller]
fn assert_watchdog_between(a: &Running, child: i32) -> i32 {
    let watchdog = ppid_of(child).expect("A's child has a parent");
    assert_eq!(
        comm(watchdog),
        "leasewrap-wd",
        "the child's parent is the watchdog: {}",
        cmdline(watchdog)
    );
    assert_eq!(
        ppid_of(watchdog),
        Some(a.pid()),
        "the watchdog is A's leasewrap's child"
    );
    watchdog
}

/// SIGSTOPs each of `pids` and the process group of `child`; returns when all of them are
/// stopped, with the instant the stops were sent.
fn stop_all_of(pids: &[i32], child: i32) -> Instant {
    for &pid in pids {
        kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
    }
    killpg(Pid::from_raw(child), Signal::SIGSTOP).unwrap();
    let paused = Instant::now();
    wait_until(BOUND, "A's tree to be stopped", || {
        pids.iter().chain([&child]).all(|&pid| is_stopped(pid))
    });
    paused
}

/// Resumes A as `resume` says (with ChildFirst, its stale writes are refused before the
/// watchdog and leasewrap go on); A's child is then dead within a second. Returns how long after
/// the watchdog's and leasewrap's SIGCONT it died.
#[track_caller]
fn resume_a(
    sandbox: &Sandbox,
    resume: Resume,
    (leasewrap, watchdog): (i32, i32),
    child: i32,
) -> Duration {
    killpg(Pid::from_raw(child), Signal::SIGCONT).unwrap();
    if resume == Resume::ChildFirst {
        for (what, file) in [("fenced-write", "a.write"), ("fenced-put", "a.put")] {
            let status = read_line_file(&sandbox.path(file), BOUND);
            assert_eq!(status, "73", "A's stale {what} was not refused");
        }
    }
    kill(Pid::from_raw(watchdog), Signal::SIGCONT).unwrap();
    kill(Pid::from_raw(leasewrap), Signal::SIGCONT).unwrap();
    let resumed = Instant::now();
    assert_all_die_within(Duration::from_secs(1), &[("A's child", child)]);
    resumed.elapsed()
}

/// Every write of A that got an answer was refused; DEST and `data_key` hold B's data, and the
/// fence B's token.
#[track_caller]
fn assert_only_bs_data_survived(sandbox: &Sandbox, etcd: &Etcd, data_key: &str, b_token: u64) {
    for file in ["a.write", "a.put"] {
        if let Ok(status) = fs::read_to_string(sandbox.path(file)) {
            assert_eq!(status.trim(), "73", "A's stale write ({file}) was accepted");
        }
    }
    let dest = sandbox.path("report.csv");
    assert_eq!(fs::read_to_string(&dest).unwrap(), "v2 (from B)\n");
    assert_eq!(recorded(&dest), Some(b_token));
    let value = etcd.etcdctl_ok(&["get", "--print-value-only", data_key]);
    assert_eq!(value.trim(), "from B");
}

// ---------------------------------------------------------------------------------------------
// The replay script of the opening case.

#[test]
fn the_paused_leader_replay_exits_0_on_etcd_3_4() {
    replay(Version::V3_4);
}

#[test]
fn the_paused_leader_replay_exits_0_on_etcd_3_5() {
    replay(Version::V3_5);
}

fn replay(version: Version) {
    let etcd = etcd::shared(version);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/paused-leader.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).arg(etcd.endpoint()).arg(BIN);
    clean_env(&mut cmd);
    cmd.env("LEASEWRAP_PREFIX", etcd::unique_prefix("replay"));
    let out = run_bounded(cmd, Duration::from_secs(90));
    let (stdout, stderr) = (&out.stdout, &out.stderr);
    eprintln!("--- replay on etcd {} ---\n{stdout}", version.number());
    assert!(
        out.status.success(),
        "replay failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for expected in [
        "refused (73)",
        "B's data is intact",
        "A's child is dead",
        "Both replays",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in:\n{stdout}");
    }
}

// ---------------------------------------------------------------------------------------------
// F10 and F11: leasewrap's clock, under libfaketime.
//
// How libfaketime 0.9.10 (Debian's `faketime`) treats what leasewrap uses, measured here with a
// probe and read in its source:
// - clock_gettime: with a rate ("x0.95"), CLOCK_REALTIME, CLOCK_MONOTONIC and CLOCK_BOOTTIME are
//   all faked, as start + (real elapsed) x rate, the monotonic clocks then reading wall-clock
//   values; FAKETIME_DONT_FAKE_MONOTONIC=1 (`faketime --exclude-monotonic`) leaves MONOTONIC,
//   MONOTONIC_RAW and BOOTTIME real and fakes CLOCK_REALTIME only.
// - Relative timeouts are divided by the rate: epoll_wait and poll (tokio's timers, the
//   watchdog's poll), nanosleep, and relative timerfd_settime (the watchdog's timer). An absolute
//   timerfd on CLOCK_BOOTTIME is not translated (it would hang), which is why the watchdog arms
//   its timer relative to its own reading. ppoll scales only timeouts of a second or more.
// - `faketime` (the wrapper) shares one start time among every process it starts
//   (FAKETIME_SHARED), so leasewrap, its watchdog and the child share one faked clock, as
//   processes on a host whose clock drifts do; a bare LD_PRELOAD starts each process's clock at
//   its own exec, which would skew the deadline leasewrap hands its watchdog by
//   (1 - rate) x the time between the two starts.
// So under `faketime -f "+0 x0.95"` leasewrap's clock, its timers and its watchdog all run 5 %
// slow against etcd's, consistently: the case the drift bound (--drift 0.1) is there for.

#[test]
fn a_holder_whose_clock_runs_5_percent_slow_or_fast_never_overlaps_the_next_on_etcd_3_4() {
    clock_rate_within_drift(Version::V3_4, "0.95");
    clock_rate_within_drift(Version::V3_4, "1.05");
}

#[test]
fn a_holder_whose_clock_runs_5_percent_slow_or_fast_never_overlaps_the_next_on_etcd_3_5() {
    clock_rate_within_drift(Version::V3_5, "0.95");
    clock_rate_within_drift(Version::V3_5, "1.05");
}

/// F10: the holder, its clock at `rate`, is cut off from etcd; a contender reaching etcd directly
/// must find the holder's child dead when its own child starts. The holder's child holds an
/// flock until it is dead, and the contender's child tries it without waiting.
fn clock_rate_within_drift(version: Version, rate: &str) {
    let etcd = etcd::shared(version);
    let proxy = Proxy::start(etcd.addr());
    let prefix = etcd::unique_prefix("f10");
    let sandbox = Sandbox::new();
    let p = |name: &str| sandbox.path(name);
    let lock = q(&p("holder.lock"));
    let holder_script = format!(
        "exec 9>>{lock}; flock -x 9; {}; exec sleep 1000",
        atomically("echo $$", &p("holder.pid"))
    );
    let mut holder = Faked::spawn(
        &sandbox,
        &["-f", &format!("+0 x{rate}")],
        &[&proxy.endpoint(), &prefix, &holder_script],
        &[],
    );
    let child = read_pid(&p("holder.pid"), BOUND);
    let _cleanup = KillOnDrop(vec![child]);
    holder.assert_faked();

    proxy.set_mode(Mode::Blackhole);
    let cut = Instant::now();
    let mut contender = spawn_contender(&sandbox, etcd, &prefix, &lock);
    let (died, started) = death_and_start_after(cut, child, &p("contender.result"));
    let result = read_line_file(&p("contender.result"), BOUND);
    assert_eq!(
        result, "ok",
        "the contender's child started while the holder's child held its lock"
    );
    assert!(
        died < started,
        "holder's child dead at {died:?}, contender started at {started:?}"
    );
    contender.wait_timeout(BOUND);
    assert_exit(&contender, 0);
    let status = holder.wait(BOUND);
    assert_eq!(status.code(), Some(124), "{}", holder.stderr());
    eprintln!(
        "F10 etcd {} rate {rate}: after the cut, holder's child dead at {:?}, contender's child at {:?}",
        version.number(),
        died,
        started
    );
}

/// A contender for the lease whose child tries the holder's flock `lock` without waiting and
/// records `ok` or `OVERLAP` in contender.result.
fn spawn_contender(sandbox: &Sandbox, etcd: &Etcd, prefix: &str, lock: &str) -> Running {
    let contender_script = format!(
        "exec 9>>{lock}; if flock -n -x 9; then r=ok; else r=OVERLAP; fi; {}",
        atomically("echo $r", &sandbox.path("contender.result"))
    );
    report_lease(sandbox, etcd, prefix)
        .shell(&contender_script)
        .spawn()
}

/// When, after `cut`, the holder's `child` was first seen dead and the contender's `result`
/// file first seen; returns once both were.
fn death_and_start_after(cut: Instant, child: i32, result: &Path) -> (Duration, Duration) {
    let (mut died, mut started) = (None, None);
    wait_until(
        3 * TTL + BOUND,
        "the holder's child to die and the contender to start",
        || {
            if died.is_none() && !pid_alive(child) {
                died = Some(cut.elapsed());
            }
            if started.is_none() && result.exists() {
                started = Some(cut.elapsed());
            }
            died.is_some() && started.is_some()
        },
    );
    (died.unwrap(), started.unwrap())
}

#[test]
fn a_wall_clock_hours_off_or_stepped_changes_nothing_on_etcd_3_4() {
    wall_clock_hours_off(Version::V3_4);
}

#[test]
fn a_wall_clock_hours_off_or_stepped_changes_nothing_on_etcd_3_5() {
    wall_clock_hours_off(Version::V3_5);
}

/// How F11 fakes leasewrap's wall clock.
#[derive(Clone, Copy, Debug)]
enum Wall {
    /// `faketime -f -5h`: every clock, CLOCK_BOOTTIME too, 5 hours behind (no rate).
    AllClocksBehind,
    /// `faketime --exclude-monotonic -f +5h`: only CLOCK_REALTIME 5 hours ahead.
    OnlyWallAhead,
    /// CLOCK_REALTIME only, from a file libfaketime reads at every call: right at the start,
    /// stepped 5 hours back once the child runs, then 5 hours ahead a TTL later.
    Stepped,
}

/// F11: a run whose child outlives several TTLs and exits 7 ends 7 (renewals went on; a lost
/// lease would be 124), with keepalive replies all along, and leasewrap's own log timestamps
/// show the wall clock it was given.
fn wall_clock_hours_off(version: Version) {
    let etcd = etcd::shared(version);
    let runs: Vec<_> = [Wall::AllClocksBehind, Wall::OnlyWallAhead, Wall::Stepped]
        .into_iter()
        .map(|wall| WallRun::start(etcd, wall))
        .collect();
    for run in &runs {
        run.check_started();
    }
    for run in &runs {
        run.step();
    }
    for mut run in runs {
        run.check_end(etcd);
    }
}

/// One F11 run, started so that the three of a version run side by side.
struct WallRun {
    wall: Wall,
    sandbox: Sandbox,
    holder: Faked,
    /// The file the Stepped run's libfaketime reads the offset from.
    offset_file: PathBuf,
}

/// How long the child of a F11 run lives: 3.5 TTLs, many renewals.
const WALL_RUN_CHILD: &str = "7";

impl WallRun {
    fn start(etcd: &Etcd, wall: Wall) -> WallRun {
        let sandbox = Sandbox::new();
        let prefix = etcd::unique_prefix("f11");
        let offset_file = sandbox.path("faketime-offset");
        fs::write(&offset_file, "+0\n").unwrap();
        let script = format!(
            "{}; {}; sleep {WALL_RUN_CHILD}; exit 7",
            atomically("echo $$", &sandbox.path("child.pid")),
            atomically("echo $(date +%s)", &sandbox.path("child.wall"))
        );
        let conn = [etcd.endpoint(), prefix, script];
        let conn = [conn[0].as_str(), conn[1].as_str(), conn[2].as_str()];
        let offset = offset_file.to_str().unwrap();
        let holder = match wall {
            Wall::AllClocksBehind => Faked::spawn(&sandbox, &["-f", "-5h"], &conn, &[]),
            Wall::OnlyWallAhead => {
                Faked::spawn(&sandbox, &["--exclude-monotonic", "-f", "+5h"], &conn, &[])
            }
            Wall::Stepped => Faked::spawn(
                &sandbox,
                &[],
                &conn,
                &[
                    ("FAKETIME_TIMESTAMP_FILE", offset),
                    ("FAKETIME_NO_CACHE", "1"),
                    ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
                ],
            ),
        };
        WallRun {
            wall,
            sandbox,
            holder,
            offset_file,
        }
    }

    /// The child runs with the wall clock asked for, and leasewrap has libfaketime loaded.
    fn check_started(&self) {
        let wall = self.wall;
        read_pid(&self.sandbox.path("child.pid"), BOUND);
        self.holder.assert_faked();
        let child_wall: i64 = read_line_file(&self.sandbox.path("child.wall"), BOUND)
            .parse()
            .unwrap();
        let expected_child = match wall {
            Wall::AllClocksBehind => -5,
            Wall::OnlyWallAhead => 5,
            Wall::Stepped => 0,
        };
        assert_eq!(
            hours_off(child_wall),
            expected_child,
            "{wall:?}: the child's wall clock"
        );
    }

    /// The Stepped run's wall clock goes 5 hours back after a first renewal, and a TTL later 5
    /// hours ahead.
    fn step(&self) {
        if let Wall::Stepped = self.wall {
            wait_until(BOUND, "a keepalive reply before the step", || {
                self.holder.stderr().contains("keepalive reply")
            });
            let stepped = Instant::now();
            fs::write(&self.offset_file, "-5h\n").unwrap();
            wait_until(2 * TTL, "a TTL at 5 hours back", || {
                stepped.elapsed() >= TTL
            });
            fs::write(&self.offset_file, "+5h\n").unwrap();
        }
    }

    /// The run ended with its child's status, renewing all along at the wall clock it was given.
    fn check_end(&mut self, etcd: &Etcd) {
        let wall = self.wall;
        let child = read_pid(&self.sandbox.path("child.pid"), BOUND);
        let _cleanup = KillOnDrop(vec![child]);
        let status = self.holder.wait(Duration::from_secs(7) + BOUND);
        let log = self.holder.stderr();
        assert_eq!(
            status.code(),
            Some(7),
            "{wall:?} on etcd {}: {log}",
            etcd.version().number()
        );
        let renewals: Vec<i64> = log
            .lines()
            .filter(|l| l.contains("keepalive reply"))
            .filter_map(|l| json_timestamp(l).map(hours_off))
            .collect();
        assert!(
            renewals.len() >= 6,
            "{wall:?}: only {} keepalive replies:\n{log}",
            renewals.len()
        );
        let phases: Vec<i64> = renewals.iter().fold(Vec::new(), |mut v, &h| {
            if v.last() != Some(&h) {
                v.push(h);
            }
            v
        });
        let expected = match wall {
            Wall::AllClocksBehind => vec![-5],
            Wall::OnlyWallAhead => vec![5],
            Wall::Stepped => vec![0, -5, 5],
        };
        assert_eq!(
            phases, expected,
            "{wall:?}: leasewrap's wall clock, in its log timestamps"
        );
        eprintln!(
            "F11 etcd {} {wall:?}: exit 7 after {} keepalive replies, wall clock phases {phases:?} h",
            etcd.version().number(),
            renewals.len()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// `fenced-write --token TOKEN DEST` fed `data`.
#[track_caller]
fn write(dest: &Path, token: u64, data: &[u8]) -> Output {
    fenced_write(dest, token).stdin(data).output()
}

/// A fenced-write whose stdin the test feeds (and may never close).
fn start_write(dest: &Path, token: u64) -> Running {
    fenced_write(dest, token).stdin_pipe().spawn()
}

/// `fenced-write --token TOKEN DEST`.
fn fenced_write(dest: &Path, token: u64) -> Leasewrap {
    Leasewrap::subcommand("fenced-write")
        .args(&["--token", &token.to_string()])
        .args(&[dest])
}

/// The content a writer with `token` writes: about 50 KB, every line naming the token, so that a
/// mix of two writers' data shows.
fn content(token: u64) -> Vec<u8> {
    format!("written with token {token}\n")
        .repeat(2000)
        .into_bytes()
}

/// The token in a whole `content`, or None for anything else (a torn or foreign file).
fn content_token(data: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(data).ok()?;
    let token = text
        .lines()
        .next()?
        .strip_prefix("written with token ")?
        .parse()
        .ok()?;
    (data == content(token)).then_some(token)
}

/// The token recorded in `DEST.fence`, None before the first write.
#[track_caller]
fn recorded(dest: &Path) -> Option<u64> {
    let text = fs::read_to_string(fence_of(dest)).unwrap_or_default();
    match text.trim() {
        "" => None,
        t => Some(
            t.parse()
                .unwrap_or_else(|_| panic!("fence file holds {t:?}")),
        ),
    }
}

/// The recorded token read the way fenced-write reads it, under the lock (a shared one): a
/// pwrite in progress is never seen half done. 0 before the first write.
fn recorded_locked(dest: &Path) -> u64 {
    let Ok(file) = fs::File::open(fence_of(dest)) else {
        return 0;
    };
    let lock = Flock::lock(file, FlockArg::LockShared).expect("flock DEST.fence");
    let mut text = String::new();
    (&*lock).read_to_string(&mut text).expect("read DEST.fence");
    text.trim().parse().unwrap_or(0)
}

fn fence_of(dest: &Path) -> PathBuf {
    PathBuf::from(format!("{}.fence", dest.display()))
}

/// Sorted names of the files in `dir`.
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// What PID has open: each descriptor's target and metadata (a deleted or unnamed file too).
fn open_files(pid: i32) -> Vec<(PathBuf, fs::Metadata)> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|fd| {
            Some((
                fs::read_link(fd.path()).ok()?,
                fs::metadata(fd.path()).ok()?,
            ))
        })
        .collect()
}

/// fenced-write's temp files in `dir`.
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    files_in(dir)
        .into_iter()
        .filter(|n| n.contains(".fenced-write-"))
        .map(|n| dir.join(n))
        .collect()
}

/// A run on `etcd` under `prefix`, lease "report", TTL 2 s.
fn report_lease(sandbox: &Sandbox, etcd: &Etcd, prefix: &str) -> Leasewrap {
    let lw = sandbox.leasewrap().on_etcd(&etcd.endpoint(), prefix);
    lw.args(&["--ttl", "2s"]).name("report")
}

/// The create revision of `key`, or None when it does not exist.
fn create_revision(etcd: &Etcd, key: &str) -> Option<i64> {
    let out = etcd.etcdctl_ok(&["get", key, "-w", "json"]);
    let json: serde_json::Value = serde_json::from_str(&out).expect("etcdctl JSON");
    json["kvs"][0]["create_revision"].as_i64()
}

/// Whole hours between `epoch_secs` and now, rounded: how far off a faked wall clock is.
pub(crate) fn hours_off(epoch_secs: i64) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    ((epoch_secs - now) as f64 / 3600.0).round() as i64
}

/// The `timestamp` of a JSON log line ("2026-11-30T14:37:40.551977Z"), as seconds since the epoch.
pub(crate) fn json_timestamp(line: &str) -> Option<i64> {
    let json: serde_json::Value = serde_json::from_str(line).ok()?;
    let ts = json["timestamp"].as_str()?;
    let num = |range: std::ops::Range<usize>| ts.get(range)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from 1970-01-01 to y-m-d (the proleptic Gregorian calendar).
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// leasewrap under libfaketime: through the `faketime -m` wrapper (one faked clock shared by
/// leasewrap, its watchdog and the child), or with the library preloaded directly when the
/// wrapper's arguments are empty. Runs `--endpoints E --prefix P --ttl 2s --name report -v
/// --log-format json -c SCRIPT`; stderr goes to a file of the sandbox.
struct Faked {
    /// The wrapper, or leasewrap itself.
    process: Child,
    /// leasewrap's pid (the wrapper's only child).
    leasewrap: i32,
    stderr: PathBuf,
}

impl Faked {
    /// `conn`: endpoint, prefix, script.
    fn spawn(
        sandbox: &Sandbox,
        faketime: &[&str],
        conn: &[&str; 3],
        envs: &[(&str, &str)],
    ) -> Faked {
        assert!(
            Path::new(LIBFAKETIME_MT).is_file() && Path::new("/usr/bin/faketime").is_file(),
            "libfaketime is missing: install the Debian package faketime"
        );
        let mut cmd = Faked::command(faketime);
        cmd.args(Faked::leasewrap_args(&sandbox.state(), conn));
        cmd.envs(envs.iter().copied());
        let stderr = sandbox.path("leasewrap.log");
        let log = fs::File::create(&stderr).unwrap();
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        let process = cmd.spawn().expect("spawn leasewrap under libfaketime");
        let pid = process.id() as i32;
        let mut leasewrap = pid;
        if !faketime.is_empty() {
            let children = format!("/proc/{pid}/task/{pid}/children");
            wait_until(BOUND, "faketime to start leasewrap", || {
                let text = fs::read_to_string(&children).unwrap_or_default();
                leasewrap = text.trim().parse().unwrap_or(0);
                leasewrap != 0
            });
        }
        Faked {
            process,
            leasewrap,
            stderr,
        }
    }

    /// leasewrap through `faketime -m FAKETIME...`, or with libfaketime preloaded when
    /// `faketime` is empty; in a clean environment without the test's own FAKETIME variables.
    fn command(faketime: &[&str]) -> Command {
        let mut cmd = if faketime.is_empty() {
            let mut c = Command::new(BIN);
            c.env("LD_PRELOAD", LIBFAKETIME_MT);
            c
        } else {
            let mut c = Command::new("faketime");
            c.arg("-m").args(faketime).arg(BIN);
            c
        };
        clean_env(&mut cmd);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("FAKETIME") {
                cmd.env_remove(&key);
            }
        }
        cmd
    }

    /// leasewrap's arguments for `conn` (endpoint, prefix, script), its state in `state`.
    fn leasewrap_args(state: &Path, conn: &[&str; 3]) -> Vec<String> {
        let [endpoint, prefix, script] = *conn;
        [
            "--local-dir",
            state.to_str().unwrap(),
            "--endpoints",
            endpoint,
            "--prefix",
            prefix,
            "--ttl",
            "2s",
            "--name",
            "report",
            "-vv",
            "--log-format",
            "json",
            "-c",
            script,
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// libfaketime is loaded into leasewrap (its clock calls go through it).
    #[track_caller]
    fn assert_faked(&self) {
        let maps = fs::read_to_string(format!("/proc/{}/maps", self.leasewrap)).unwrap_or_default();
        assert!(
            maps.contains("libfaketime"),
            "libfaketime is not loaded in leasewrap"
        );
    }

    #[track_caller]
    fn wait(&mut self, bound: Duration) -> ExitStatus {
        let mut status = None;
        wait_until(bound, "leasewrap under libfaketime to exit", || {
            status = self.process.try_wait().expect("try_wait");
            status.is_some()
        });
        status.unwrap()
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Faked {
    fn drop(&mut self) {
        if self.process.try_wait().ok().flatten().is_none() {
            let _ = kill(Pid::from_raw(self.leasewrap), Signal::SIGKILL);
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

/// Watches DEST and DEST.fence while writers run: the recorded token never drops, DEST is always
/// one writer's whole content, its token never drops, and never lags the token recorded at the
/// last moment no write was half done (the fence is read under its lock).
struct Watcher {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<usize>,
}

impl Watcher {
    fn start(dest: &Path) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let (dest, flag) = (dest.to_owned(), Arc::clone(&stop));
        let thread = thread::spawn(move || {
            let (mut fence_seen, mut data_seen, mut looks) = (0, 0, 0);
            while !flag.load(Ordering::Relaxed) {
                let fence = recorded_locked(&dest);
                assert!(
                    fence >= fence_seen,
                    "recorded token went from {fence_seen} to {fence}"
                );
                if let Ok(data) = fs::read(&dest) {
                    let token = content_token(&data).expect("DEST is one writer's whole content");
                    assert!(
                        token >= data_seen,
                        "DEST went from token {data_seen} to {token}"
                    );
                    assert!(
                        token >= fence,
                        "DEST holds token {token}, older than the {fence} recorded before"
                    );
                    data_seen = token;
                }
                fence_seen = fence;
                looks += 1;
            }
            looks
        });
        Watcher { stop, thread }
    }

    /// Stops watching; returns how many times it looked.
    fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the watcher saw something wrong")
    }
}

/// A small xorshift generator. The seed is printed, and LEASEWRAP_TEST_SEED replays one.
struct Rng(u64);

impl Rng {
    fn new(what: &str) -> Rng {
        let seed = std::env::var("LEASEWRAP_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
                t.as_nanos() as u64 ^ u64::from(std::process::id())
            });
        eprintln!("{what}: LEASEWRAP_TEST_SEED={seed}");
        Rng(seed | 1)
    }

    /// A number in 0..n.
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
