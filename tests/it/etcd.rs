//! Black-box tests of the built binary against real etcd 3.4 and 3.5 servers (SPEC §4, §5, §9).
//!
//! Every behaviour runs on both versions: the body is `fn name(v: Version)` and `on_both_versions!`
//! makes `name::etcd_3_4` and `name::etcd_3_5`. Tests share one server per version and keep to
//! their own `unique_prefix`; those that kill, restart or lock down a server start their own.
//! Children report through files (pid, environment, wall-clock start and end in ns from
//! `date +%s%N`); the tests wait for those files, for pids to die, for keys in
//! `etcdctl get --prefix` and for exits, always with a bound. The few fixed waits are the scenario
//! itself (a fault begins half a TTL after the child started and lasts 2 x TTL) or the assertion
//! itself (a marker that must not appear within a bound).

use std::collections::HashMap;
use std::fs::{self, File};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::support::etcd::{self, Cluster, Etcd, Version};
use crate::support::proxy::{Mode, Proxy};
use crate::support::*;

/// The TTL of every timing-sensitive test: etcd's minimum.
pub(crate) const TTL: Duration = Duration::from_secs(2);
pub(crate) const TTL_ARG: &str = "2s";

/// `--ttl 2s`, and debug logs, which a failing fault test shows with leasewrap's stderr.
const FAULT_ARGS: [&str; 3] = ["--ttl", TTL_ARG, "-vv"];

/// Lease "job" under `prefix` through `endpoint`, with the fault tests' timing.
fn fault_job(endpoint: &str, prefix: &str) -> Leasewrap {
    Leasewrap::new()
        .on_etcd(endpoint, prefix)
        .name("job")
        .args(&FAULT_ARGS)
}

/// `fn NAME(v: Version)` becomes `NAME::etcd_3_4` and `NAME::etcd_3_5`.
macro_rules! on_both_versions {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[test]
            fn etcd_3_4() {
                super::$name(super::Version::V3_4)
            }
            #[test]
            fn etcd_3_5() {
                super::$name(super::Version::V3_5)
            }
        }
    )+};
}

on_both_versions!(
    fencing_token_is_the_lock_keys_create_revision,
    contenders_never_overlap_and_tokens_strictly_increase,
    next_waiter_starts_soon_after_the_holder_exits,
    revoking_the_lease_stops_the_child_and_exits_124,
    deleting_the_lock_key_stops_the_child_and_exits_124,
    losing_the_lease_while_the_watchdog_is_stopped_still_stops_the_child_and_exits_124,
    child_dies_before_server_expiry_when_etcd_is_blackholed,
    child_dies_before_the_next_holder_starts_when_replies_are_delayed,
    watchdog_kills_the_child_by_the_deadline_while_leasewrap_is_stopped,
    watchdog_kills_the_child_by_the_deadline_while_leasewrap_s_process_group_is_stopped,
    a_stop_waits_the_kill_after_of_the_granted_ttl,
    waiter_whose_lease_expired_in_the_queue_never_starts_its_child,
    killing_the_cluster_leader_keeps_the_lease_or_stops_the_child_and_tokens_stay_monotonic,
    child_is_stopped_at_the_deadline_while_etcd_is_down,
    etcdctl_lock_holder_makes_leasewrap_no_wait_exit_75,
    leasewrap_holder_makes_etcdctl_lock_wait_until_it_exits,
    password_from_file_or_environment_works_and_never_reaches_the_child,
    wrong_password_exits_77_and_runs_nothing,
    tls_with_the_servers_ca_works_and_a_wrong_or_missing_ca_exits_77,
    mtls_presents_the_client_certificate_and_exits_77_without_one,
    no_wait_on_a_held_lease_exits_75_and_leaves_no_key,
    bounded_wait_on_a_held_lease_exits_75_after_the_wait_and_leaves_no_key,
    sigterm_while_waiting_exits_143_starts_nothing_and_removes_the_key,
    a_job_that_gives_etcdctl_endpoints_runs_and_the_users_etcdctl_variables_reach_it,
);

// ---------------------------------------------------------------------------------------------
// Helpers: servers, keys, children that report through files.
// ---------------------------------------------------------------------------------------------

/// A single server or a cluster, as far as etcdctl goes.
trait Server {
    fn ctl(&self, args: &[&str]) -> std::process::Output;
}

impl Server for Etcd {
    fn ctl(&self, args: &[&str]) -> std::process::Output {
        self.etcdctl(args)
    }
}

impl Server for Cluster {
    fn ctl(&self, args: &[&str]) -> std::process::Output {
        self.etcdctl(args)
    }
}

/// etcdctl, panicking with its stderr on failure; returns stdout.
#[track_caller]
fn ctl_ok(server: &dyn Server, args: &[&str]) -> String {
    crate::support::etcd::checked(server.ctl(args), args)
}

/// One key as `etcdctl get -w json` shows it.
#[derive(Debug, Clone)]
struct Kv {
    key: String,
    value: String,
    create_revision: u64,
    lease: i64,
}

/// Every key under `prefix`, in key order.
#[track_caller]
fn kvs(server: &dyn Server, prefix: &str) -> Vec<Kv> {
    let out = ctl_ok(server, &["get", "--prefix", "-w", "json", prefix]);
    let json: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("etcdctl get -w json: {e}: {out}"));
    let Some(all) = json["kvs"].as_array() else {
        return Vec::new();
    };
    let text = |kv: &serde_json::Value, field: &str| {
        let raw = kv[field].as_str().unwrap_or_default();
        String::from_utf8_lossy(&base64_decode(raw)).into_owned()
    };
    all.iter()
        .map(|kv| Kv {
            key: text(kv, "key"),
            value: text(kv, "value"),
            create_revision: kv["create_revision"].as_u64().expect("create_revision"),
            lease: kv["lease"].as_i64().unwrap_or(0),
        })
        .collect()
}

/// The key names under `prefix`.
#[track_caller]
fn keys(server: &dyn Server, prefix: &str) -> Vec<String> {
    kvs(server, prefix).into_iter().map(|kv| kv.key).collect()
}

#[track_caller]
fn wait_for_key_count(server: &dyn Server, prefix: &str, count: usize, bound: Duration) {
    let what = format!("{count} key(s) under {prefix:?}");
    wait_until(bound, &what, || kvs(server, prefix).len() == count);
}

/// Whether etcd says the lease (hex id) is gone.
#[track_caller]
fn lease_is_gone(server: &dyn Server, lease_hex: &str) -> bool {
    let out = ctl_ok(server, &["lease", "timetolive", lease_hex]);
    out.contains("already expired")
}

/// etcdctl prints keys and values as standard base64.
fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0u32);
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = ALPHABET.iter().position(|&a| a == c);
        let v = v.unwrap_or_else(|| panic!("not base64: {text:?}")) as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// A lease name no other test uses, for `--prefix ''` (names hold no '/').
fn unique_name(test: &str) -> String {
    etcd::unique_prefix(test)
        .trim_end_matches('/')
        .replace('/', "-")
}

/// Nanoseconds on CLOCK_REALTIME, the clock `date +%s%N` reads.
pub(crate) fn now_ns() -> i128 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.expect("clock before 1970").as_nanos() as i128
}

pub(crate) fn ms(ns: i128) -> f64 {
    ns as f64 / 1e6
}

/// A `date +%s%N` stamp a child wrote.
#[track_caller]
pub(crate) fn read_ns(path: &Path) -> i128 {
    let text = read_line_file(path, STARTUP);
    text.parse()
        .unwrap_or_else(|e| panic!("{} holds {text:?}, not ns: {e}", path.display()))
}

/// How an old holder's child gave way to a new one's after a fault, on CLOCK_REALTIME.
pub(crate) struct Takeover {
    /// When the fault began.
    pub(crate) fault_ns: i128,
    /// When the old child was first seen dead (it died within one poll before).
    pub(crate) old_dead_ns: i128,
    /// When the new child stamped its start.
    pub(crate) new_start_ns: i128,
}

impl Takeover {
    /// For the closing note: when each thing happened, and the gap between them.
    pub(crate) fn describe(&self) -> String {
        format!(
            "old child seen dead {:.0} ms after the fault, next child started {:.0} ms after it: \
             gap {:.1} ms",
            ms(self.old_dead_ns - self.fault_ns),
            ms(self.new_start_ns - self.fault_ns),
            ms(self.new_start_ns - self.old_dead_ns)
        )
    }
}

/// Watches the old holder's child die and the new one start; panics the moment both run at once,
/// or after `bound`, with both leasewraps' stderr.
#[track_caller]
fn watch_takeover(old: &Job, new: &Job, fault_ns: i128, bound: Duration) -> Takeover {
    match try_takeover(old.child(), &new.marks, bound) {
        Ok((old_dead_ns, new_start_ns)) => Takeover {
            fault_ns,
            old_dead_ns,
            new_start_ns,
        },
        Err(why) => panic!(
            "{why}\n--- old holder's stderr ---\n{}\n--- next holder's stderr ---\n{}",
            old.run.stderr(),
            new.run.stderr()
        ),
    }
}

/// Panics, with both leasewraps' stderr, if `next`'s child has started while `old`'s child
/// (pid `old_child`) still runs; `under` names the fault.
#[track_caller]
pub(crate) fn assert_no_overlap(old: &Job, next: &Job, old_child: i32, under: &str) {
    // In this order: a start seen before a live pid means both ran at the same instant.
    let started = next.marks.started();
    if started && pid_alive(old_child) {
        panic!(
            "OVERLAP under {under}: B's child started while A's (pid {old_child}) still runs\n\
             --- A's stderr ---\n{}\n--- B's stderr ---\n{}",
            old.run.stderr(),
            next.run.stderr()
        );
    }
}

/// `(old child seen dead, new child's start)`, or what went wrong.
fn try_takeover(old_child: i32, new: &Marks, bound: Duration) -> Result<(i128, i128), String> {
    let deadline = Instant::now() + bound;
    let mut old_dead_ns = None;
    loop {
        // In this order: a start seen before a live pid means both ran at the same instant.
        let started = new.started();
        let alive = pid_alive(old_child);
        let now = now_ns();
        if started && alive {
            return Err(format!(
                "OVERLAP: the next holder's child started while the old child (pid {old_child}) still runs"
            ));
        }
        if !alive && old_dead_ns.is_none() {
            old_dead_ns = Some(now);
        }
        if let (true, Some(old_dead_ns)) = (started, old_dead_ns) {
            let new_start_ns = read_ns(&new.start);
            return Ok((old_dead_ns, new_start_ns));
        }
        if Instant::now() >= deadline {
            let old = if alive { "still alive" } else { "dead" };
            let new = if started {
                "started"
            } else {
                "has not started"
            };
            return Err(format!(
                "after {bound:?}: the old child (pid {old_child}) is {old}, the next holder's child {new}"
            ));
        }
        thread::sleep(POLL);
    }
}

/// Waits until half a TTL after the child of `job` started, before a fault begins: past the first
/// renewal (TTL/3), before the second, so the deadline in force then comes from a keepalive reply
/// and not from the grant. A point in the scenario, not a wait for calm.
#[track_caller]
pub(crate) fn into_the_second_renewal_interval(job: &Job) {
    let at = read_ns(&job.marks.start) + TTL.as_nanos() as i128 / 2;
    let left = u64::try_from(at - now_ns()).unwrap_or(0);
    thread::sleep(Duration::from_nanos(left));
}

/// Keeps a fault on until `until`: the fault's duration is the scenario, not a wait for calm.
pub(crate) fn keep_fault_until(until: Instant) {
    thread::sleep(until.saturating_duration_since(Instant::now()));
}

/// The last complete line of a heartbeat file, in ns.
#[track_caller]
pub(crate) fn last_beat_ns(path: &Path) -> i128 {
    let text = fs::read_to_string(path).unwrap_or_default();
    let last = text.lines().rfind(|l| l.len() >= 19);
    let last = last.unwrap_or_else(|| panic!("no heartbeat in {}", path.display()));
    last.trim().parse().expect("heartbeat ns")
}

// ---------------------------------------------------------------------------------------------
// 1. Fencing token and key layout.
// ---------------------------------------------------------------------------------------------

fn fencing_token_is_the_lock_keys_create_revision(v: Version) {
    let etcd = etcd::shared(v);
    let prefix = etcd::unique_prefix("token_is_create_revision");
    let sb = Sandbox::new();
    let lw = Leasewrap::new()
        .on_etcd(&etcd.endpoint(), &prefix)
        .name("job");
    let mut holder = Job::spawn(lw, Marks::new(&sb, "a"), false);
    holder.child();
    let env = holder.env();
    let token = holder.token();

    let all = kvs(etcd, &prefix);
    assert_eq!(all.len(), 1, "one lock key while one holder runs: {all:?}");
    let kv = &all[0];
    let lease_hex = format!("{:x}", kv.lease);
    assert_eq!(
        kv.key,
        format!("{prefix}job/{lease_hex}"),
        "etcd's mutex layout"
    );
    assert_eq!(
        token, kv.create_revision,
        "token = the key's create revision"
    );
    let expect = [
        ("LEASEWRAP_KEY", kv.key.clone()),
        ("ETCD_LOCK_KEY", kv.key.clone()),
        ("ETCD_LOCK_REV", kv.create_revision.to_string()),
        ("LEASEWRAP_LEASE_ID", lease_hex.clone()),
        ("LEASEWRAP_NAME", "job".to_owned()),
        ("LEASEWRAP_ENDPOINTS", etcd.endpoint()),
        ("LEASEWRAP_PREFIX", prefix.clone()),
    ];
    assert_child_env_has(&env, &expect);
    assert_holder_record(kv, holder.run.pid());

    holder.release();
    holder.finish_with(0);
    assert!(keys(etcd, &prefix).is_empty(), "the key outlived the run");
    assert!(
        lease_is_gone(etcd, &lease_hex),
        "the lease was not revoked on exit"
    );
}

/// Scripts written for `etcdctl lock` give etcdctl `--endpoints`; etcdctl exits when a variable
/// and its flag are both given, so leasewrap must set no ETCDCTL_* variable of its own. A variable
/// the user set in leasewrap's environment still reaches the child.
fn a_job_that_gives_etcdctl_endpoints_runs_and_the_users_etcdctl_variables_reach_it(v: Version) {
    let etcd = etcd::shared(v);
    let prefix = etcd::unique_prefix("etcdctl_flag");
    let etcdctl = v.etcdctl();
    let script = format!(
        "{} --endpoints \"$LEASEWRAP_ENDPOINTS\" get --prefix --keys-only \"$LEASEWRAP_PREFIX\" \
         && printf 'endpoints=%s dial=%s\\n' \"${{ETCDCTL_ENDPOINTS-unset}}\" \"$ETCDCTL_DIAL_TIMEOUT\"",
        q(&etcdctl)
    );
    let out = Leasewrap::new()
        .on_etcd(&etcd.endpoint(), &prefix)
        .name("job")
        .shell(&script)
        .output();
    assert_exit(&out, 0);
    assert!(
        out.stdout.contains(&format!("{prefix}job/")),
        "etcdctl --endpoints in the job lists the own lock key: {}{}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stdout.contains("endpoints=unset dial=\n"),
        "no ETCDCTL_* variable made up for the child: {}",
        out.stdout
    );

    let out = Leasewrap::new()
        .on_etcd(&etcd.endpoint(), &prefix)
        .name("job")
        .env("ETCDCTL_DIAL_TIMEOUT", "3s")
        .shell(&script)
        .output();
    assert_exit(&out, 0);
    assert!(
        out.stdout.contains("dial=3s"),
        "the user's ETCDCTL_DIAL_TIMEOUT reaches the child: {}{}",
        out.stdout,
        out.stderr
    );
}

#[track_caller]
fn assert_child_env_has(env: &HashMap<String, String>, expect: &[(&str, String)]) {
    for (name, want) in expect {
        assert_eq!(
            env.get(*name),
            Some(want),
            "{name} in the child's environment"
        );
    }
}

/// The lock key's value is the holder record: JSON with host, pid, command and start, and the
/// pid is leasewrap's.
#[track_caller]
fn assert_holder_record(kv: &Kv, leasewrap_pid: i32) {
    let record: serde_json::Value = serde_json::from_str(&kv.value)
        .unwrap_or_else(|e| panic!("the key's value is not JSON ({e}): {:?}", kv.value));
    for field in ["host", "pid", "command", "start"] {
        assert!(
            !record[field].is_null(),
            "no {field} in the holder record {record}"
        );
    }
    assert_eq!(
        record["pid"].as_i64(),
        Some(leasewrap_pid as i64),
        "{record}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. F1: many contenders, many rounds.
// ---------------------------------------------------------------------------------------------

const CONTENDERS: usize = 8;
const ROUNDS: usize = 25;

fn contenders_never_overlap_and_tokens_strictly_increase(v: Version) {
    let etcd = etcd::shared(v);
    let prefix = etcd::unique_prefix("f1");
    let endpoint = etcd.endpoint();
    let lw = || Leasewrap::new().on_etcd(&endpoint, &prefix).name("job");
    let (text, took) = contend_in_rounds(&lw, CONTENDERS, ROUNDS);
    eprintln!(
        "F1 etcd {}: {CONTENDERS} contenders x {ROUNDS} rounds took {took:.2?} ({:.1} ms per holder)",
        v.number(),
        took.as_secs_f64() * 1e3 / (CONTENDERS * ROUNDS) as f64
    );
    assert_log_has_one_holder_at_a_time(&text, CONTENDERS * ROUNDS);
}

/// `contenders` threads each run `rounds` leasewraps from `lw`, one after another, each child
/// appending `start TOKEN NS` and `end TOKEN NS` to one log; returns the log and the time taken.
pub(crate) fn contend_in_rounds(
    lw: &(dyn Fn() -> Leasewrap + Sync),
    contenders: usize,
    rounds: usize,
) -> (String, Duration) {
    let sb = Sandbox::new();
    let log = sb.path("log");
    let script = format!(
        "echo start $LEASEWRAP_FENCING_TOKEN $(date +%s%N) >> {log}; \
         echo end $LEASEWRAP_FENCING_TOKEN $(date +%s%N) >> {log}",
        log = q(&log)
    );
    let began = Instant::now();
    thread::scope(|s| {
        for _ in 0..contenders {
            s.spawn(|| {
                for _ in 0..rounds {
                    let mut run = lw().cmd(&["sh", "-c", &script]).spawn();
                    run.wait_timeout(Duration::from_secs(60));
                    assert_exit(&run, 0);
                }
            });
        }
    });
    let took = began.elapsed();
    (fs::read_to_string(&log).expect("read log"), took)
}

/// Each holder's start and end lines in `text` are a pair, one pair after another, each
/// starting after the one before ended, with tokens strictly increasing.
#[track_caller]
pub(crate) fn assert_log_has_one_holder_at_a_time(text: &str, holders: usize) {
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), 2 * holders, "log:\n{text}");
    let mut last: Option<(u64, i128)> = None;
    for (i, pair) in lines.chunks(2).enumerate() {
        let [start, end] = pair else { unreachable!() };
        // Appends are serialised, so exclusive holders can only give start/end pairs in turn.
        assert!(
            start.len() == 3 && end.len() == 3 && start[0] == "start" && end[0] == "end",
            "holder {i}: lines {start:?} {end:?} are not one holder's start and end: intervals overlap"
        );
        assert_eq!(
            start[1], end[1],
            "holder {i}: another holder ended inside its interval"
        );
        let token: u64 = start[1].parse().expect("token");
        let (t0, t1): (i128, i128) = (start[2].parse().unwrap(), end[2].parse().unwrap());
        assert!(t0 <= t1, "holder {i}: ends before it starts");
        if let Some((prev_token, prev_end)) = last {
            assert!(
                token > prev_token,
                "holder {i}: token {token} after {prev_token}"
            );
            assert!(
                t0 > prev_end,
                "holder {i} started before holder {} ended",
                i - 1
            );
        }
        last = Some((token, t1));
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Handover.
// ---------------------------------------------------------------------------------------------

fn next_waiter_starts_soon_after_the_holder_exits(v: Version) {
    let etcd = etcd::shared(v);
    let prefix = etcd::unique_prefix("handover");
    let sb = Sandbox::new();
    let lw = || {
        Leasewrap::new()
            .on_etcd(&etcd.endpoint(), &prefix)
            .name("job")
    };
    let a = Job::spawn(lw(), Marks::new(&sb, "a"), false);
    a.child();
    let b = Job::spawn(lw(), Marks::new(&sb, "b"), false);
    wait_for_key_count(etcd, &prefix, 2, STARTUP);
    hand_over(a, b, &format!("etcd {}", v.number()));
}

/// Holder `a` lets its child end; queued `b`'s child must start after it, within a second, with
/// a greater token. Prints the gap under `label`.
#[track_caller]
pub(crate) fn hand_over(mut a: Job, mut b: Job, label: &str) {
    assert!(
        !b.marks.started(),
        "the waiter started while the lease was held"
    );
    a.release();
    let a_end = read_ns(&a.marks.end);
    let b_start = read_ns(&b.marks.start);
    a.finish_with(0);
    let gap = b_start - a_end;
    eprintln!(
        "handover {label}: {:.1} ms from the holder's child's last act to the next child's first",
        ms(gap)
    );
    assert!(
        gap > 0,
        "the next child started before the holder's child ended"
    );
    assert!(gap < 1_000_000_000, "handover took {:.1} ms", ms(gap));
    assert!(b.token() > a.token());
    b.release();
    b.finish_with(0);
}

// ---------------------------------------------------------------------------------------------
// 4. F4: the lease revoked or the key deleted by someone else.
// ---------------------------------------------------------------------------------------------

/// One renewal interval (TTL/3) + kill-after (TTL/5) + slack, at TTL 2 s.
const LOSS_BOUND: Duration = Duration::from_secs(3);

fn revoking_the_lease_stops_the_child_and_exits_124(v: Version) {
    lost_lease_stops_the_child(v, "revoke");
}

fn deleting_the_lock_key_stops_the_child_and_exits_124(v: Version) {
    lost_lease_stops_the_child(v, "del");
}

fn lost_lease_stops_the_child(v: Version, how: &str) {
    lost_lease_stops_the_child_with(v, how, false);
}

fn losing_the_lease_while_the_watchdog_is_stopped_still_stops_the_child_and_exits_124(v: Version) {
    // The watchdog alone SIGSTOPped (by its pid) cannot stop the child: leasewrap must.
    lost_lease_stops_the_child_with(v, "revoke", true);
}

fn lost_lease_stops_the_child_with(v: Version, how: &str, watchdog_stopped: bool) {
    let etcd = etcd::shared(v);
    let prefix = etcd::unique_prefix(how);
    let sb = Sandbox::new();
    let lw = Leasewrap::new()
        .on_etcd(&etcd.endpoint(), &prefix)
        .name("job");
    let mut a = Job::spawn(lw.args(&["--ttl", TTL_ARG]), Marks::new(&sb, "a"), false);
    let child = a.child();
    let lease = a.var("LEASEWRAP_LEASE_ID");
    let watchdog = ppid_of(child).expect("the child's parent");
    let _resume = ContinueOnDrop(Stopped::Leasewrap, watchdog);
    if watchdog_stopped {
        signal::kill(Pid::from_raw(watchdog), Signal::SIGSTOP).expect("SIGSTOP the watchdog");
        wait_until(STARTUP, "the watchdog to stop", || is_stopped(watchdog));
    }
    match how {
        "revoke" => ctl_ok(etcd, &["lease", "revoke", &lease]),
        "del" => ctl_ok(etcd, &["del", &a.var("LEASEWRAP_KEY")]),
        other => unreachable!("no way to lose a lease called {other:?}"),
    };
    let done = Instant::now();
    a.wait(LOSS_BOUND);
    let took = done.elapsed();
    assert_exit(&a.run, 124);
    assert!(!pid_alive(child), "leasewrap exited but its child runs");
    assert!(!a.marks.end.exists(), "the child finished on its own");
    eprintln!("F4 etcd {} {how}: exit 124 after {took:.2?}", v.number());
    assert!(
        lease_is_gone(etcd, &lease),
        "the lease was not revoked on exit"
    );
    assert!(keys(etcd, &prefix).is_empty());
}

// ---------------------------------------------------------------------------------------------
// 5-7. F2, F3, F5: the holder cut off or paused; the next holder connected directly.
// ---------------------------------------------------------------------------------------------

/// Bound on a takeover once the fault began: the lease runs out within TTL of the last renewal,
/// etcd's lessor looks every 500 ms; the rest is slack for a loaded box.
pub(crate) const TAKEOVER_BOUND: Duration = Duration::from_secs(8);

fn child_dies_before_server_expiry_when_etcd_is_blackholed(v: Version) {
    let takeover = holder_behind_proxy_dies_before_takeover(v, Mode::Blackhole, "f2");
    eprintln!("F2 etcd {} blackhole: {}", v.number(), takeover.describe());
}

fn child_dies_before_the_next_holder_starts_when_replies_are_delayed(v: Version) {
    let delay = TTL.mul_f64(0.6);
    let takeover = holder_behind_proxy_dies_before_takeover(v, Mode::DelayReplies(delay), "f3");
    eprintln!(
        "F3 etcd {} replies delayed {delay:?}: {}",
        v.number(),
        takeover.describe()
    );
}

/// Holder A talks through a proxy, contender C directly; the proxy turns to `fault` for 2 x TTL.
/// A's child must be dead before C's starts, A exits 124, C is not disturbed.
fn holder_behind_proxy_dies_before_takeover(v: Version, fault: Mode, label: &str) -> Takeover {
    let etcd = etcd::shared(v);
    let prefix = etcd::unique_prefix(label);
    let sb = Sandbox::new();
    let proxy = Proxy::start(etcd.addr());
    let lw = |endpoint: &str| fault_job(endpoint, &prefix);
    let mut a = Job::spawn(lw(&proxy.endpoint()), Marks::new(&sb, "a"), true);
    a.child();
    let mut c = Job::spawn(lw(&etcd.endpoint()), Marks::new(&sb, "c"), false);
    wait_for_key_count(etcd, &prefix, 2, STARTUP);

    let takeover = fault_through_proxy(&proxy, fault, &mut a, &c);
    assert_next_holder_undisturbed(etcd, &prefix, &c);
    assert!(c.token() > a.token());
    c.release();
    c.finish_with(0);
    takeover
}

/// Half a TTL into A's second renewal interval, the proxy A talks through turns to `fault` for
/// 2 x TTL; A's child must be dead before C's starts (every beat before it), and A exit 124.
#[track_caller]
pub(crate) fn fault_through_proxy(proxy: &Proxy, fault: Mode, a: &mut Job, c: &Job) -> Takeover {
    into_the_second_renewal_interval(a);
    proxy.set_mode(fault);
    let (fault_began, fault_ns) = (Instant::now(), now_ns());
    let takeover = watch_takeover(a, c, fault_ns, TAKEOVER_BOUND);
    assert!(
        last_beat_ns(&a.marks.beat) < takeover.new_start_ns,
        "the old child beat after the next child started"
    );
    keep_fault_until(fault_began + 2 * TTL);
    // Closes what the fault left half-delivered, as a partition long enough for TCP to give up.
    proxy.heal();
    a.wait(Duration::from_secs(5));
    assert_exit(&a.run, 124);
    takeover
}

/// After the old holder exited: the new holder's child still runs and its key is the only one.
#[track_caller]
fn assert_next_holder_undisturbed(server: &dyn Server, prefix: &str, next: &Job) {
    assert!(
        pid_alive(next.child()),
        "the next holder's child was disturbed"
    );
    assert!(!next.marks.end.exists(), "the next holder's child ended");
    let key = next.var("LEASEWRAP_KEY");
    let all = kvs(server, prefix);
    assert_eq!(all.len(), 1, "keys left: {all:?}");
    assert_eq!(all[0].key, key, "the next holder's key is gone");
    assert_eq!(all[0].create_revision, next.token());
}

/// Who gets SIGSTOP and SIGCONT: leasewrap alone, or its whole process group (`kill -STOP --
/// -PGID`, Ctrl-Z), of which the watchdog must not be part.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Stopped {
    Leasewrap,
    Group,
}

impl Stopped {
    pub(crate) fn signal(self, leasewrap: i32, sig: Signal) -> nix::Result<()> {
        match self {
            Stopped::Leasewrap => signal::kill(Pid::from_raw(leasewrap), sig),
            Stopped::Group => signal::killpg(Pid::from_raw(leasewrap), sig),
        }
    }
}

/// SIGCONTs what was stopped on drop, so a failing test leaves nothing stopped.
pub(crate) struct ContinueOnDrop(pub(crate) Stopped, pub(crate) i32);

impl Drop for ContinueOnDrop {
    fn drop(&mut self) {
        let _ = self.0.signal(self.1, Signal::SIGCONT);
    }
}

fn watchdog_kills_the_child_by_the_deadline_while_leasewrap_is_stopped(v: Version) {
    holder_stopped_for_two_ttls(v, Stopped::Leasewrap);
}

fn watchdog_kills_the_child_by_the_deadline_while_leasewrap_s_process_group_is_stopped(v: Version) {
    holder_stopped_for_two_ttls(v, Stopped::Group);
}

/// F5: the holder's leasewrap (or its group) SIGSTOPped for 2 x TTL.
fn holder_stopped_for_two_ttls(v: Version, stopped: Stopped) {
    let etcd = etcd::shared(v);
    let prefix = etcd::unique_prefix("f5");
    let sb = Sandbox::new();
    let lw = || fault_job(&etcd.endpoint(), &prefix);
    let mut a = Job::spawn(lw().own_process_group(), Marks::new(&sb, "a"), true);
    let a_child = a.child();
    let a_lease = a.var("LEASEWRAP_LEASE_ID");
    let leasewrap_pid = a.run.pid();
    assert_a_watchdog_between(leasewrap_pid, a_child);
    let mut c = Job::spawn(lw(), Marks::new(&sb, "c"), false);
    wait_for_key_count(etcd, &prefix, 2, STARTUP);

    let takeover = stop_for_two_ttls_while_c_takes_over(stopped, &a, &c);

    a.wait(Duration::from_secs(3));
    assert_exit(&a.run, 124);
    assert!(
        lease_is_gone(etcd, &a_lease),
        "the old lease was renewed after SIGCONT"
    );
    assert_next_holder_undisturbed(etcd, &prefix, &c);
    eprintln!(
        "F5 etcd {} {} SIGSTOPped: {}",
        v.number(),
        match stopped {
            Stopped::Leasewrap => "leasewrap",
            Stopped::Group => "leasewrap's process group",
        },
        takeover.describe()
    );
    c.release();
    c.finish_with(0);
}

/// The child's parent is a watchdog, and the watchdog is leasewrap's child.
#[track_caller]
pub(crate) fn assert_a_watchdog_between(leasewrap_pid: i32, child: i32) {
    let watchdog = ppid_of(child).expect("the child's parent");
    assert_ne!(
        watchdog, leasewrap_pid,
        "the child's parent is leasewrap, not a watchdog"
    );
    assert_eq!(
        ppid_of(watchdog),
        Some(leasewrap_pid),
        "the watchdog is not leasewrap's child"
    );
}

/// SIGSTOPs `a`'s leasewrap (or its group) in its second renewal interval, watches `c` take
/// over, and SIGCONTs it 2 x TTL after the stop, asserting it stayed stopped till then.
#[track_caller]
pub(crate) fn stop_for_two_ttls_while_c_takes_over(stopped: Stopped, a: &Job, c: &Job) -> Takeover {
    let leasewrap_pid = a.run.pid();
    let _resume = ContinueOnDrop(stopped, leasewrap_pid);
    into_the_second_renewal_interval(a);
    stopped
        .signal(leasewrap_pid, Signal::SIGSTOP)
        .expect("SIGSTOP");
    let (paused, paused_ns) = (Instant::now(), now_ns());
    wait_until(Duration::from_secs(1), "leasewrap to stop", || {
        proc_state(leasewrap_pid) == Some('T')
    });
    let takeover = watch_takeover(a, c, paused_ns, TAKEOVER_BOUND);
    keep_fault_until(paused + 2 * TTL);
    assert_eq!(
        proc_state(leasewrap_pid),
        Some('T'),
        "leasewrap was no longer stopped before SIGCONT"
    );
    stopped
        .signal(leasewrap_pid, Signal::SIGCONT)
        .expect("SIGCONT");
    takeover
}

fn a_stop_waits_the_kill_after_of_the_granted_ttl(v: Version) {
    // --ttl 1s is granted as 2s: kill-after is then 2s/5 = 400ms, not the 200ms of the TTL asked.
    let etcd = etcd::shared(v);
    let prefix = etcd::unique_prefix("granted_kill_after");
    let sb = Sandbox::new();
    let pid_file = sb.path("child.pid");
    let script = format!(
        "trap '' TERM; {}; while :; do sleep 0.02; done",
        atomically("echo $$", &pid_file)
    );
    let mut lw = Leasewrap::new()
        .on_etcd(&etcd.endpoint(), &prefix)
        .name("job")
        .args(&["--ttl", "1s"])
        .cmd(&["sh", "-c", &script])
        .spawn();
    let child = read_pid(&pid_file, STARTUP);
    let _guard = KillOnDrop(vec![child]);
    let sent = Instant::now();
    lw.kill(Signal::SIGTERM);
    lw.wait_timeout(STARTUP);
    let elapsed = sent.elapsed();
    assert!(
        elapsed >= Duration::from_millis(400),
        "the child that ignores SIGTERM was SIGKILLed {elapsed:?} after it, before the \
         kill-after of the granted TTL (400ms)\n{}",
        lw.stderr()
    );
    assert!(!pid_alive(child), "the child outlived leasewrap");
}

// ---------------------------------------------------------------------------------------------
// 8. F7: a waiter whose lease expires while it is queued.
// ---------------------------------------------------------------------------------------------

fn waiter_whose_lease_expired_in_the_queue_never_starts_its_child(v: Version) {
    let etcd = etcd::shared(v);
    let prefix = etcd::unique_prefix("f7");
    let sb = Sandbox::new();
    let proxy = Proxy::start(etcd.addr());
    let lw = |endpoint: &str| fault_job(endpoint, &prefix);
    let mut h = Job::spawn(lw(&etcd.endpoint()), Marks::new(&sb, "h"), false);
    h.child();
    let h_key = h.var("LEASEWRAP_KEY");
    let w = Job::spawn(lw(&proxy.endpoint()), Marks::new(&sb, "w"), false);
    wait_for_key_count(etcd, &prefix, 2, STARTUP);
    let w_key = keys(etcd, &prefix)
        .into_iter()
        .find(|k| *k != h_key)
        .unwrap();

    // The waiter is cut off until etcd expires its lease, and with it its queued key.
    proxy.set_mode(Mode::Blackhole);
    wait_until(TAKEOVER_BOUND, "the cut-off waiter's key to expire", || {
        !keys(etcd, &prefix).contains(&w_key)
    });
    let mut t = Job::spawn(lw(&etcd.endpoint()), Marks::new(&sb, "t"), false);
    wait_for_key_count(etcd, &prefix, 2, STARTUP);
    // Healed before the holder leaves: the waiter may now see the key ahead of it go.
    proxy.set_mode(Mode::Pass);

    h.release();
    h.finish_with(0);
    let h_gone = Instant::now();
    wait_for_file(&t.marks.start, STARTUP);
    // The assertion itself: for 2 x TTL after the holder left, the stale waiter starts nothing.
    while h_gone.elapsed() < 2 * TTL {
        assert!(
            !w.marks.started(),
            "OVERLAP: the waiter whose lease expired in the queue started its child"
        );
        thread::sleep(POLL);
    }
    assert!(t.token() > h.token());
    assert!(
        pid_alive(t.child()),
        "the third contender's child was disturbed"
    );
    t.release();
    t.finish_with(0);
    drop(w);
}

// ---------------------------------------------------------------------------------------------
// 9. F8: the leader of a 3-node cluster killed.
// ---------------------------------------------------------------------------------------------

/// Bound on leasewrap's exit once its child is stopped after the leader was killed.
const LEADER_KILL_BOUND: Duration = Duration::from_secs(8);

fn killing_the_cluster_leader_keeps_the_lease_or_stops_the_child_and_tokens_stay_monotonic(
    v: Version,
) {
    let mut cluster = Cluster::start(v);
    let prefix = etcd::unique_prefix("f8");
    let sb = Sandbox::new();
    let tokens = sb.path("tokens");
    let append_token = format!("echo $LEASEWRAP_FENCING_TOKEN >> {}", q(&tokens));
    let lw = || fault_job(&cluster.endpoints(), &prefix);
    let marks = Marks::new(&sb, "a");
    let script = format!("{append_token}; {}", marks.script(false));
    let mut a = Job::with_script(lw(), marks, script);
    let child = a.child();
    let lease = a.var("LEASEWRAP_LEASE_ID");

    let leader = cluster.leader_index();
    into_the_second_renewal_interval(&a);
    let killed = Instant::now();
    cluster.kill(leader);
    let outcome = after_the_leader_kill(&cluster, &mut a, child, &lease, killed);
    eprintln!(
        "F8 etcd {} leader (member {leader}) killed: {outcome}",
        v.number()
    );

    let next_run = |cluster: &Cluster| {
        let out = Leasewrap::new()
            .on_etcd(&cluster.endpoints(), &prefix)
            .name("job")
            .args(&["--ttl", TTL_ARG, "-w", "8s"])
            .cmd(&["sh", "-c", &append_token])
            .output();
        assert_exit(&out, 0);
    };
    // etcdctl copes with the same list, one member down: so must leasewrap.
    let put = ["put", &format!("{prefix}probe"), "x"];
    let probe = v.etcdctl_at(&cluster.endpoints(), &put);
    assert!(
        probe.status.success(),
        "etcdctl with one member down: {probe:?}"
    );
    next_run(&cluster);
    cluster.restart(leader);
    next_run(&cluster);
    assert_three_increasing_tokens(&tokens);
}

/// Follows `a` (its child and lease) after the leader was killed at `killed`: either leasewrap
/// stops the child and exits 124, or, past every deadline a renewal sent before the kill can
/// give, the child still runs on a lease etcd keeps and leasewrap ends well once released.
#[track_caller]
fn after_the_leader_kill(
    cluster: &Cluster,
    a: &mut Job,
    child: i32,
    lease: &str,
    killed: Instant,
) -> &'static str {
    // Past this instant no deadline given by a renewal sent before the kill can hold the child.
    let past_old_deadlines = killed + TTL + Duration::from_secs(1);
    loop {
        if a.run.try_status().is_some() {
            assert_exit(&a.run, 124);
            assert!(!pid_alive(child), "leasewrap exited, its child runs");
            return "stopped by the deadline (124)";
        }
        if Instant::now() >= past_old_deadlines && pid_alive(child) {
            assert!(
                !lease_is_gone(cluster, lease),
                "the child runs {:?} after the leader was killed but etcd has let the lease go",
                killed.elapsed()
            );
            a.release();
            a.wait(STARTUP);
            let code = a.run.try_status().and_then(|s| s.code());
            assert!(
                matches!(code, Some(0 | 124)),
                "after renewals carried on, leasewrap ended with {:?}{}",
                a.run.try_status(),
                a.run.stderr()
            );
            return "kept running: renewals carried on";
        }
        assert!(
            killed.elapsed() < LEADER_KILL_BOUND,
            "the child is {} but leasewrap still runs {:?} after the leader was killed",
            if pid_alive(child) { "alive" } else { "dead" },
            killed.elapsed()
        );
        thread::sleep(POLL);
    }
}

/// The tokens file holds three tokens, strictly increasing.
#[track_caller]
fn assert_three_increasing_tokens(tokens: &Path) {
    let text = fs::read_to_string(tokens).expect("read tokens");
    let seen: Vec<u64> = text.lines().map(|l| l.parse().expect("token")).collect();
    assert_eq!(seen.len(), 3, "tokens: {seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing: {seen:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 10. F9: etcd down longer than the TTL.
// ---------------------------------------------------------------------------------------------

fn child_is_stopped_at_the_deadline_while_etcd_is_down(v: Version) {
    let mut etcd = Etcd::start(v);
    let prefix = "lw/";
    let sb = Sandbox::new();
    let lw = fault_job(&etcd.endpoint(), prefix).args(&["--dial-timeout", "1s"]);
    let mut a = Job::spawn(lw, Marks::new(&sb, "a"), false);
    let child = a.child();
    let token = a.token();

    into_the_second_renewal_interval(&a);
    let killed = Instant::now();
    etcd.kill();
    let bound = TTL + Duration::from_secs(1);
    wait_until(bound, "the child to be stopped at D", || !pid_alive(child));
    let child_dead = killed.elapsed();
    a.wait(
        bound
            .saturating_sub(child_dead)
            .max(Duration::from_millis(1)),
    );
    let exited = killed.elapsed();
    assert_exit(&a.run, 124);
    eprintln!(
        "F9 etcd {} down: child dead {child_dead:.2?} and leasewrap exited {exited:.2?} after the kill",
        v.number()
    );

    etcd.restart();
    let out = Leasewrap::new()
        .on_etcd(&etcd.endpoint(), prefix)
        .name("job")
        .args(&["-w", "8s"])
        .cmd(&["sh", "-c", "echo $LEASEWRAP_FENCING_TOKEN"])
        .output();
    assert_exit(&out, 0);
    let next: u64 = out.stdout.trim().parse().expect("token");
    assert!(next > token, "token {next} after {token}");
}

// ---------------------------------------------------------------------------------------------
// 11. Interop with `etcdctl lock NAME`.
// ---------------------------------------------------------------------------------------------

/// `etcdctl lock NAME SCRIPT`, its output in the sandbox; killed on drop.
struct EtcdctlLock {
    child: std::process::Child,
}

impl EtcdctlLock {
    fn start(etcd: &Etcd, sb: &Sandbox, name: &str, script: &Path) -> EtcdctlLock {
        let mut cmd = etcd.version().etcdctl_for(&etcd.endpoint());
        let log = |what: &str| File::create(sb.path(&format!("etcdctl.{what}"))).unwrap();
        cmd.args(["lock", name])
            .arg(script)
            .stdin(Stdio::null())
            .stdout(log("out"))
            .stderr(log("err"));
        let child = cmd.spawn().expect("start etcdctl lock");
        EtcdctlLock { child }
    }

    #[track_caller]
    fn wait(&mut self, bound: Duration) -> ExitStatus {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait etcdctl") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "etcdctl lock still runs after {bound:?}"
            );
            thread::sleep(POLL);
        }
    }
}

impl Drop for EtcdctlLock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn etcdctl_lock_holder_makes_leasewrap_no_wait_exit_75(v: Version) {
    let etcd = etcd::shared(v);
    let name = unique_name("interop_busy");
    let sb = Sandbox::new();
    let marks = Marks::new(&sb, "e");
    let script = sb.script("hold.sh", &marks.script(false));
    let mut lock = EtcdctlLock::start(etcd, &sb, &name, &script);
    let _child = KillOnDrop(vec![read_pid(&marks.pid, STARTUP)]);

    let ran = sb.path("ran");
    let out = Leasewrap::new()
        .on_etcd(&etcd.endpoint(), "")
        .name(&name)
        .args(&["-n"])
        .cmd(&["touch", ran.to_str().unwrap()])
        .output();
    assert_exit(&out, 75);
    assert!(
        !ran.exists(),
        "leasewrap ran its command while etcdctl lock held {name}"
    );
    assert_eq!(kvs(etcd, &format!("{name}/")).len(), 1, "a key left behind");

    File::create(&marks.release).unwrap();
    let status = lock.wait(STARTUP);
    assert!(status.success(), "etcdctl lock ended with {status}");
}

fn leasewrap_holder_makes_etcdctl_lock_wait_until_it_exits(v: Version) {
    let etcd = etcd::shared(v);
    let name = unique_name("interop_wait");
    let sb = Sandbox::new();
    let lw = Leasewrap::new().on_etcd(&etcd.endpoint(), "").name(&name);
    let mut a = Job::spawn(lw, Marks::new(&sb, "a"), false);
    a.child();
    let lease = a.var("LEASEWRAP_LEASE_ID");
    assert_eq!(
        a.var("LEASEWRAP_KEY"),
        format!("{name}/{lease}"),
        "etcdctl lock's layout"
    );

    let e = Marks::new(&sb, "e");
    let rev = sb.path("e.rev");
    let body = format!(
        "{}; {}",
        atomically("date +%s%N", &e.start),
        atomically("echo $ETCD_LOCK_REV", &rev)
    );
    let mut lock = EtcdctlLock::start(etcd, &sb, &name, &sb.script("e.sh", &body));
    wait_for_key_count(etcd, &format!("{name}/"), 2, STARTUP);
    assert!(
        !e.started(),
        "etcdctl lock ran its command while leasewrap held {name}"
    );

    a.release();
    a.finish_with(0);
    let a_end = read_ns(&a.marks.end);
    let e_start = read_ns(&e.start);
    assert!(
        e_start > a_end,
        "etcdctl's command started before leasewrap's child ended"
    );
    let e_rev: u64 = read_line_file(&rev, STARTUP)
        .parse()
        .expect("ETCD_LOCK_REV");
    assert!(
        e_rev > a.token(),
        "etcdctl's revision {e_rev} after token {}",
        a.token()
    );
    let status = lock.wait(STARTUP);
    assert!(status.success(), "etcdctl lock ended with {status}");
}

// ---------------------------------------------------------------------------------------------
// 12. Authentication.
// ---------------------------------------------------------------------------------------------

const PASSWORD: &str = "alice-secret-pw";

/// An etcd with auth on and user alice (PASSWORD) allowed under `lw/`.
fn auth_etcd(v: Version) -> Etcd {
    let etcd = Etcd::start(v);
    etcd.enable_auth("root-secret-pw");
    etcd.add_user("alice", PASSWORD, "lw/");
    etcd
}

fn password_from_file_or_environment_works_and_never_reaches_the_child(v: Version) {
    let etcd = auth_etcd(v);
    let sb = Sandbox::new();
    let password_file = sb.path("password");
    fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let ways: [(&str, Leasewrap); 3] = [
        (
            "--password-file",
            Leasewrap::new().args(&["--password-file", password_file.to_str().unwrap()]),
        ),
        (
            "LEASEWRAP_PASSWORD",
            Leasewrap::new().env("LEASEWRAP_PASSWORD", PASSWORD),
        ),
        (
            "ETCDCTL_PASSWORD",
            Leasewrap::new().env("ETCDCTL_PASSWORD", PASSWORD),
        ),
    ];
    for (i, (way, lw)) in ways.into_iter().enumerate() {
        let env_file = sb.path(&format!("env{i}"));
        let out = lw
            .args(&["--endpoints", &etcd.endpoint(), "--prefix", "lw/"])
            .args(&["--name", "job", "--user", "alice"])
            .cmd(&["sh", "-c", &atomically("env", &env_file)])
            .output();
        assert_exit(&out, 0);
        let env = fs::read_to_string(&env_file).expect("the child wrote its environment");
        assert!(env.contains("LEASEWRAP_FENCING_TOKEN="), "{way}: no token");
        for line in env.lines() {
            assert!(
                !line.contains(PASSWORD),
                "{way}: the password reached the child: {line}"
            );
            let key = line.split('=').next().unwrap_or_default();
            assert!(!key.ends_with("_PASSWORD"), "{way}: the child has {key}");
        }
    }
}

fn wrong_password_exits_77_and_runs_nothing(v: Version) {
    let etcd = auth_etcd(v);
    let sb = Sandbox::new();
    let wrong_file = sb.path("wrong");
    fs::write(&wrong_file, "not-the-password\n").unwrap();
    let missing_file = sb.path("no-such-password-file");
    let ways: [(&str, Leasewrap, i32); 3] = [
        (
            "LEASEWRAP_PASSWORD",
            Leasewrap::new().env("LEASEWRAP_PASSWORD", "not-the-password"),
            77,
        ),
        (
            "--password-file",
            Leasewrap::new().args(&["--password-file", wrong_file.to_str().unwrap()]),
            77,
        ),
        (
            "missing --password-file",
            Leasewrap::new().args(&["--password-file", missing_file.to_str().unwrap()]),
            78,
        ),
    ];
    let ran = sb.path("ran");
    for (way, lw, code) in ways {
        let out = lw
            .args(&["--endpoints", &etcd.endpoint(), "--prefix", "lw/"])
            .args(&["--name", "job", "--user", "alice"])
            .cmd(&["touch", ran.to_str().unwrap()])
            .output();
        assert_exit(&out, code);
        assert!(!ran.exists(), "{way}: the command ran");
        assert!(
            !out.stderr.contains("not-the-password"),
            "{way}: the password was logged"
        );
    }
    assert!(keys(&etcd, "lw/").is_empty(), "something was acquired");
}

// ---------------------------------------------------------------------------------------------
// 13. Unreachable endpoints.
// ---------------------------------------------------------------------------------------------

/// No etcd version here: nothing answers at all.
#[test]
fn unreachable_endpoint_exits_69_within_the_dial_timeout_and_runs_nothing() {
    let closed = {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        listener.local_addr().unwrap()
    };
    // Accepts connections (the kernel completes them) and never says a word.
    let silent = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let sb = Sandbox::new();
    let ran = sb.path("ran");
    for (what, addr) in [("closed port", closed), ("silent listener", silent_addr)] {
        let out = Leasewrap::new()
            .on_etcd(&format!("http://{addr}"), "lw/")
            .args(&["--name", "job", "--dial-timeout", "1s"])
            .cmd(&["touch", ran.to_str().unwrap()])
            .output();
        assert_exit(&out, 69);
        assert!(!ran.exists(), "{what}: the command ran");
        for internals in ["tonic", "hyper", "ConnectError", "Os {"] {
            assert!(!out.stderr.contains(internals), "{what}: {}", out.stderr);
        }
        assert!(
            out.elapsed < Duration::from_secs(2),
            "{what}: took {:?} with --dial-timeout 1s",
            out.elapsed
        );
    }
    drop(silent);
}

#[test]
fn a_refused_connection_is_one_line_in_words_naming_the_endpoint_and_exits_69() {
    let out = Leasewrap::new()
        .on_etcd("http://127.0.0.1:1", "lw/")
        .name("job")
        .cmd(&["true"])
        .output();
    assert_exit(&out, 69);
    assert_eq!(
        out.stderr,
        "leasewrap: etcd at 127.0.0.1:1: connection refused\n"
    );
}

on_both_versions!(an_endpoint_that_is_not_etcd_beside_a_healthy_one_costs_a_run_nothing);
/// An HTTP server listed beside etcd (a wrong port, a health endpoint) answers the client's
/// HTTP/2 with HTTP/1: that endpoint's failure, so the run goes on with the other, every time.
/// Alone with a refusing endpoint, the failure names each endpoint and its own reason.
fn an_endpoint_that_is_not_etcd_beside_a_healthy_one_costs_a_run_nothing(v: Version) {
    let http = crate::support::http::HttpServer::start();
    let endpoints = format!("http://{},{}", http.addr(), etcd::shared(v).endpoint());
    for _ in 0..8 {
        let out = Leasewrap::new()
            .on_etcd(&endpoints, &etcd::unique_prefix("not-etcd"))
            .name("job")
            .cmd(&["true"])
            .output();
        assert_exit(&out, 0);
    }
    let neither = format!("http://{},http://127.0.0.1:1", http.addr());
    let out = Leasewrap::new()
        .on_etcd(&neither, "lw/")
        .args(&["--name", "job", "--dial-timeout", "1s"])
        .cmd(&["true"])
        .output();
    assert_exit(&out, 69);
    // The HTTP server's reason is what the HTTP/2 client made of its answer (a protocol error,
    // or a pipe it closed), each endpoint's reason after its URL.
    let each = [
        format!("http://{}: ", http.addr()),
        "; http://127.0.0.1:1: connection refused".to_owned(),
    ];
    for reason in each {
        assert!(out.stderr.contains(&reason), "{}", out.stderr);
    }
}

on_both_versions!(https_to_a_plain_http_etcd_is_a_failed_tls_handshake_and_exits_77);
fn https_to_a_plain_http_etcd_is_a_failed_tls_handshake_and_exits_77(v: Version) {
    let plain = etcd::shared(v).endpoint();
    let at = plain.trim_start_matches("http://");
    let out = Leasewrap::new()
        .on_etcd(&format!("https://{at}"), "lw/")
        .name("job")
        .cmd(&["true"])
        .output();
    assert_exit(&out, 77);
    assert_eq!(
        out.stderr,
        format!("leasewrap: TLS handshake with {at} failed: the server does not speak TLS?\n")
    );
}

// ---------------------------------------------------------------------------------------------
// 14. TLS.
// ---------------------------------------------------------------------------------------------

/// A CA of its own in `dir` that signed nothing the server has: `(certificate)`.
fn unrelated_ca(dir: &Path) -> PathBuf {
    let cnf = dir.join("other-ca.cnf");
    let text = "[req]\ndistinguished_name = dn\n[dn]\n[ca]\n\
                basicConstraints = critical,CA:TRUE\n\
                keyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n";
    fs::write(&cnf, text).unwrap();
    let crt = dir.join("other-ca.crt");
    let out = Command::new("openssl")
        .args(["req", "-x509", "-new", "-newkey", "ec"])
        .args(["-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
        .arg("-keyout")
        .arg(dir.join("other-ca.key"))
        .arg("-out")
        .arg(&crt)
        .args([
            "-subj",
            "/CN=unrelated test CA",
            "-days",
            "1",
            "-extensions",
            "ca",
        ])
        .arg("-config")
        .arg(&cnf)
        .output()
        .expect("cannot run openssl; install the openssl package");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    crt
}

fn tls_with_the_servers_ca_works_and_a_wrong_or_missing_ca_exits_77(v: Version) {
    let etcd = Etcd::start_tls(v);
    let tls = etcd.tls().expect("a TLS server");
    let sb = Sandbox::new();
    let lw = || {
        Leasewrap::new().on_etcd(&etcd.endpoint(), "lw/").args(&[
            "--name",
            "job",
            "--dial-timeout",
            "2s",
        ])
    };
    let out = lw()
        .args(&["--cacert", tls.ca.to_str().unwrap()])
        .cmd(&["sh", "-c", "echo $LEASEWRAP_FENCING_TOKEN"])
        .output();
    assert_exit(&out, 0);
    out.stdout.trim().parse::<u64>().expect("a token over TLS");

    let other = unrelated_ca(&sb.path(""));
    let ran = sb.path("ran");
    for (what, extra) in [
        (
            "a CA that did not sign the server",
            vec!["--cacert", other.to_str().unwrap()],
        ),
        ("no CA (system roots)", vec![]),
    ] {
        let out = lw()
            .args(&extra)
            .cmd(&["touch", ran.to_str().unwrap()])
            .output();
        assert_exit(&out, 77);
        assert!(!ran.exists(), "{what}: the command ran");
        assert!(
            out.elapsed < Duration::from_secs(3),
            "{what}: took {:?}",
            out.elapsed
        );
    }
}

fn mtls_presents_the_client_certificate_and_exits_77_without_one(v: Version) {
    let etcd = Etcd::start_mtls(v);
    let tls = etcd.tls().expect("a TLS server");
    let sb = Sandbox::new();
    let lw = || {
        Leasewrap::new()
            .on_etcd(&etcd.endpoint(), "lw/")
            .args(&["--name", "job", "--dial-timeout", "2s"])
            .args(&["--cacert", tls.ca.to_str().unwrap()])
    };
    let out = lw()
        .args(&[
            "--cert",
            tls.cert.to_str().unwrap(),
            "--key",
            tls.key.to_str().unwrap(),
        ])
        .cmd(&["true"])
        .output();
    assert_exit(&out, 0);
    let ran = sb.path("ran");
    let out = lw().cmd(&["touch", ran.to_str().unwrap()]).output();
    assert_exit(&out, 77);
    assert!(
        !ran.exists(),
        "the command ran without a client certificate"
    );
}

// ---------------------------------------------------------------------------------------------
// 15. Not acquiring leaves nothing behind.
// ---------------------------------------------------------------------------------------------

/// A holder of `job` under a fresh prefix of the shared server, its child running.
fn held(v: Version, sb: &Sandbox, test: &str) -> (&'static Etcd, String, Job) {
    let etcd = etcd::shared(v);
    let prefix = etcd::unique_prefix(test);
    let h = Job::spawn(
        Leasewrap::new()
            .on_etcd(&etcd.endpoint(), &prefix)
            .name("job"),
        Marks::new(sb, "h"),
        false,
    );
    h.child();
    (etcd, prefix, h)
}

/// Only the holder's key is left, and its child still runs; then it finishes normally.
#[track_caller]
fn assert_only_the_holder_remains(etcd: &Etcd, prefix: &str, mut h: Job) {
    assert_eq!(
        keys(etcd, prefix),
        vec![h.var("LEASEWRAP_KEY")],
        "a waiter key was left behind"
    );
    assert!(pid_alive(h.child()), "the holder's child was disturbed");
    h.release();
    h.finish_with(0);
}

fn no_wait_on_a_held_lease_exits_75_and_leaves_no_key(v: Version) {
    let sb = Sandbox::new();
    let (etcd, prefix, h) = held(v, &sb, "no_wait");
    let ran = sb.path("ran");
    let out = Leasewrap::new()
        .on_etcd(&etcd.endpoint(), &prefix)
        .args(&["--name", "job", "-n"])
        .cmd(&["touch", ran.to_str().unwrap()])
        .output();
    assert_busy_and_ran_nothing(&out, &ran, None);
    assert_only_the_holder_remains(etcd, &prefix, h);
}

fn bounded_wait_on_a_held_lease_exits_75_after_the_wait_and_leaves_no_key(v: Version) {
    let sb = Sandbox::new();
    let (etcd, prefix, h) = held(v, &sb, "bounded_wait");
    let ran = sb.path("ran");
    let out = Leasewrap::new()
        .on_etcd(&etcd.endpoint(), &prefix)
        .args(&["--name", "job", "-w", "500ms"])
        .cmd(&["touch", ran.to_str().unwrap()])
        .output();
    assert_busy_and_ran_nothing(&out, &ran, Some(Duration::from_millis(500)));
    assert_only_the_holder_remains(etcd, &prefix, h);
}

/// A run that found the lease held: exit 75, its command never ran (it would have created
/// `ran`), and with `-w WAIT` it gave up after WAIT, not much later.
#[track_caller]
pub(crate) fn assert_busy_and_ran_nothing(out: &Output, ran: &Path, waited: Option<Duration>) {
    assert_exit(out, 75);
    assert!(!ran.exists(), "the command ran");
    if let Some(wait) = waited {
        assert!(out.elapsed >= wait, "gave up after {:?}", out.elapsed);
        let late = wait + Duration::from_millis(2500);
        assert!(out.elapsed < late, "gave up only after {:?}", out.elapsed);
    }
}

fn sigterm_while_waiting_exits_143_starts_nothing_and_removes_the_key(v: Version) {
    let sb = Sandbox::new();
    let (etcd, prefix, h) = held(v, &sb, "sigterm_waiting");
    let mut w = Job::spawn(
        Leasewrap::new()
            .on_etcd(&etcd.endpoint(), &prefix)
            .name("job"),
        Marks::new(&sb, "w"),
        false,
    );
    wait_for_key_count(etcd, &prefix, 2, STARTUP);
    w.run.kill(Signal::SIGTERM);
    w.wait(Duration::from_secs(3));
    assert_exit(&w.run, 143);
    assert!(!w.marks.started(), "the waiter started its child");
    assert_only_the_holder_remains(etcd, &prefix, h);
}

// F14, in a module of its own: tests/it/etcd/quorum.rs.
mod quorum;
