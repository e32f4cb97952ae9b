//! Black-box tests of the built binary on real ZooKeeper 3.8 (issue 17): the etcd backend's
//! guarantees, kept on the other coordination service, through the CLI only.
//!
//! Tests share one standalone server (`zookeeper::shared`) and keep to their own lease name;
//! those that pause, cut off or kill members start an `Ensemble` of their own
//! (`zookeeper/ensemble.rs`). What the tests read of ZooKeeper itself comes from the server: the
//! lock nodes from its `dump` four-letter word, a node's czxid and data from its own CLI.
//! Children report through files as in the etcd tests, and the expectations are the etcd tests'
//! (exit codes, bounds, overlap 0 from heartbeats), shared with them where the check is the same.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::etcd::{
    assert_a_watchdog_between, assert_busy_and_ran_nothing, assert_log_has_one_holder_at_a_time,
    contend_in_rounds, fault_through_proxy, hand_over, last_beat_ns, ms, now_ns, read_ns,
    stop_for_two_ttls_while_c_takes_over, Stopped, TAKEOVER_BOUND, TTL, TTL_ARG,
};
use crate::support::proxy::{Mode, Proxy};
use crate::support::zookeeper::{self, Zk};
use crate::support::*;

mod ensemble;
mod layers;
mod neighbours;
mod seams;
mod secure;
mod sessions;
mod timeouts;

/// `--ttl 2s` (the session timeout asked; the test servers grant 0.4 s to 4 s) and debug logs,
/// which a failing test shows with leasewrap's stderr.
const ZK_ARGS: [&str; 3] = ["--ttl", TTL_ARG, "-vv"];

/// Lease `name` through `connect`, with the fault tests' timing.
fn zk_job(connect: &str, name: &str) -> Leasewrap {
    Leasewrap::new()
        .on_zookeeper(connect)
        .name(name)
        .args(&ZK_ARGS)
}

/// Where leasewrap keeps the lock nodes of lease `name`: the persistent parent.
fn lock_dir(name: &str) -> String {
    format!("/leasewrap/{name}")
}

/// The lock nodes of `name`, in queue order (by their sequence suffix), as the server on `port`
/// (standalone, or the leader) lists its sessions' ephemeral nodes; empty when there are none.
#[track_caller]
fn queue(port: u16, name: &str) -> Vec<String> {
    let nodes = zookeeper::ephemerals_under(port, &lock_dir(name));
    let mut nodes = nodes.unwrap_or_else(|e| panic!("dump: {e}"));
    nodes.sort_by_key(|n| sequence_of(n));
    nodes
}

/// The 10-digit sequence number ZooKeeper appends to a sequential node's name.
#[track_caller]
fn sequence_of(node: &str) -> u64 {
    let digits = node.get(node.len().saturating_sub(10)..).unwrap_or("");
    digits
        .parse()
        .unwrap_or_else(|e| panic!("lock node {node:?} has no sequence suffix: {e}"))
}

#[track_caller]
fn wait_for_queue_len(port: u16, name: &str, len: usize, bound: Duration) {
    wait_for_queue_len_at(|| port, name, len, bound);
}

/// Waits until `len` lock nodes of `name` show in the dump of the server on `port()` (asked
/// again on every look: an ensemble's leader may change meanwhile).
#[track_caller]
fn wait_for_queue_len_at(port: impl Fn() -> u16, name: &str, len: usize, bound: Duration) {
    let mut seen = Vec::new();
    let what = format!("{len} lock nodes under {}", lock_dir(name));
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        seen = queue(port(), name);
        if seen.len() == len {
            return;
        }
        thread::sleep(POLL);
    }
    panic!("timed out after {bound:?} waiting for {what}; saw {seen:?}");
}

/// A holder of a fresh name on the shared server, its child running.
fn held(sb: &Sandbox, test: &str) -> (&'static Zk, String, Job) {
    let zk = zookeeper::shared();
    let name = zookeeper::unique_name(test);
    let h = hold(zk_job(&zk.connect(), &name), sb, "h");
    (zk, name, h)
}

/// `Job::hold`, with leasewrap's stderr when its child does not start in time.
#[track_caller]
fn hold(lw: Leasewrap, sb: &Sandbox, label: &str) -> Job {
    let mut job = Job::spawn(lw, Marks::new(sb, label), false);
    let started = |job: &mut Job| job.marks.pid.exists() || job.run.try_status().is_some();
    let deadline = Instant::now() + STARTUP;
    while !started(&mut job) && Instant::now() < deadline {
        thread::sleep(POLL);
    }
    if !job.marks.pid.exists() {
        let status = job.run.try_status();
        panic!(
            "{label}'s child did not start within {STARTUP:?} (leasewrap: {status:?})\n{}",
            job.run.stderr()
        );
    }
    job.child();
    job
}

/// Only the holder's node is left, and its child still runs; then it finishes normally.
#[track_caller]
fn assert_only_the_holder_remains(zk: &Zk, name: &str, h: Job) {
    let nodes = queue(zk.port(), name);
    assert_eq!(nodes.len(), 1, "a waiter's node was left behind: {nodes:?}");
    assert!(pid_alive(h.child()), "the holder's child was disturbed");
    h.finish();
}

// ---------------------------------------------------------------------------------------------
// 1. The harness itself.
// ---------------------------------------------------------------------------------------------

#[test]
fn the_standalone_test_server_serves_with_the_test_tick_and_four_letter_words() {
    let started = Instant::now();
    let mut zk = Zk::start();
    let took = started.elapsed();
    let srvr = zk.srvr().expect("srvr answers");
    assert!(srvr.contains("Mode: standalone"), "{srvr}");
    assert!(srvr.contains("Zookeeper version: 3.8"), "{srvr}");
    let conf = zookeeper::four_letter(zk.addr().port(), "conf").expect("conf answers");
    assert!(conf.contains("tickTime=200"), "{conf}");
    assert!(conf.contains("maxSessionTimeout=4000"), "{conf}");
    let (rss, peak) = zookeeper::rss_kib(zk.pid().unwrap()).expect("its /proc/PID/status");
    eprintln!(
        "ZooKeeper standalone: serving {took:.2?} after spawn; RSS {} MiB (peak {} MiB)",
        rss / 1024,
        peak / 1024
    );
    zk.kill();
    assert!(zk.srvr().is_err(), "a killed server still answers");
}

#[test]
fn a_missing_jre_or_jar_is_a_failure_naming_the_debian_packages() {
    let jars = ["/usr/share/java/zookeeper.jar"];
    let no_java = zookeeper::missing(Path::new("/nonexistent/bin/java"), &jars);
    let no_jar = zookeeper::missing(&zookeeper::java(), &["/nonexistent/zookeeper.jar"]);
    for why in [no_java, no_jar] {
        let why = why.expect("a missing piece is reported");
        assert!(
            why.contains("zookeeper") && why.contains("default-jre-headless"),
            "{why}"
        );
        assert!(
            why.contains("/nonexistent/"),
            "names what is missing: {why}"
        );
    }
    let here = zookeeper::missing(&zookeeper::java(), &jars);
    assert_eq!(here, None, "this machine has the JRE and the jar");
}

#[test]
fn the_cli_sees_the_nodes_a_test_makes() {
    let zk = zookeeper::shared();
    let path = format!("/{}", zookeeper::unique_name("cli"));
    assert_eq!(zookeeper::stat(&zk.connect(), &path), None);
    zookeeper::cli_ok(&zk.connect(), &["create", &path, "x"]);
    let stat = zookeeper::stat(&zk.connect(), &path).expect("the node just created");
    assert!(stat.czxid > 0 && stat.ephemeral_owner == 0, "{stat:?}");
    assert_eq!(zookeeper::children(&zk.connect(), &path), Some(vec![]));
    zookeeper::cli_ok(&zk.connect(), &["delete", &path]);
}

/// An ephemeral node of a live CLI session shows in `dump` (what the polls use) until the
/// session ends.
#[test]
fn dump_lists_a_live_session_s_ephemeral_nodes() {
    let zk = zookeeper::shared();
    let parent = format!("/{}", zookeeper::unique_name("dump"));
    zookeeper::cli_ok(&zk.connect(), &["create", &parent, ""]);
    let mut session = zookeeper::cli_session(&zk.connect());
    let create = format!("create -e {parent}/node x\n");
    session.write_all(create.as_bytes());
    let port = zk.port();
    let listed = || zookeeper::ephemerals_under(port, &parent).expect("dump answers");
    wait_until(STARTUP, "the ephemeral node in dump", || {
        listed() == ["node"]
    });
    session.write_all(format!("stat -w {parent}/node\n").as_bytes());
    let watches = || zookeeper::total_watches(port).expect("wchs answers");
    wait_until(STARTUP, "the CLI's watch in wchs", || watches() >= 1);
    drop(session);
    wait_until(STARTUP, "the ephemeral node to go with its session", || {
        listed().is_empty()
    });
}

// ---------------------------------------------------------------------------------------------
// 2. Parity with etcd: one holder at a time, -n and -w, the token, the handover.
// ---------------------------------------------------------------------------------------------

/// The token is the holder's lock node's czxid; the node is an ephemeral sequential child of a
/// persistent parent, which stays when the holder leaves; the next holder's token is greater.
#[test]
fn fencing_token_is_the_lock_node_s_czxid_and_grows_with_every_holder() {
    let sb = Sandbox::new();
    let (zk, name, h) = held(&sb, "token");
    let token = h.token();
    let nodes = queue(zk.port(), &name);
    assert_eq!(
        nodes.len(),
        1,
        "one lock node while one holder runs: {nodes:?}"
    );
    let node = format!("{}/{}", lock_dir(&name), nodes[0]);
    let stat = zookeeper::stat(&zk.connect(), &node).expect("the holder's node");
    assert_eq!(token, stat.czxid, "token = the lock node's czxid");
    assert_ne!(stat.ephemeral_owner, 0, "the lock node is ephemeral");
    h.finish();

    assert!(
        queue(zk.port(), &name).is_empty(),
        "the node outlived the run"
    );
    let parent = zookeeper::stat(&zk.connect(), &lock_dir(&name));
    let parent = parent.expect("the parent outlives the holders");
    assert_eq!(parent.ephemeral_owner, 0, "the parent is persistent");
    let next = hold(zk_job(&zk.connect(), &name), &sb, "next");
    assert!(next.token() > token, "{} after {token}", next.token());
    next.finish();
}

const CONTENDERS: usize = 4;
const ROUNDS: usize = 10;

#[test]
fn contenders_never_overlap_and_tokens_strictly_increase() {
    let zk = zookeeper::shared();
    let name = zookeeper::unique_name("f1");
    let lw = || Leasewrap::new().on_zookeeper(&zk.connect()).name(&name);
    let (text, took) = contend_in_rounds(&lw, CONTENDERS, ROUNDS);
    eprintln!(
        "F1 ZooKeeper: {CONTENDERS} contenders x {ROUNDS} rounds took {took:.2?} ({:.1} ms per holder)",
        took.as_secs_f64() * 1e3 / (CONTENDERS * ROUNDS) as f64
    );
    assert_log_has_one_holder_at_a_time(&text, CONTENDERS * ROUNDS);
}

#[test]
fn no_wait_on_a_held_lease_exits_75_and_leaves_no_node() {
    let sb = Sandbox::new();
    let (zk, name, h) = held(&sb, "no_wait");
    let ran = sb.path("ran");
    let out = Leasewrap::new()
        .on_zookeeper(&zk.connect())
        .args(&["--name", &name, "-n"])
        .cmd(&["touch", ran.to_str().unwrap()])
        .output();
    assert_busy_and_ran_nothing(&out, &ran, None);
    assert_only_the_holder_remains(zk, &name, h);
}

#[test]
fn bounded_wait_on_a_held_lease_exits_75_after_the_wait_and_leaves_no_node() {
    let sb = Sandbox::new();
    let (zk, name, h) = held(&sb, "bounded_wait");
    let ran = sb.path("ran");
    let out = Leasewrap::new()
        .on_zookeeper(&zk.connect())
        .args(&["--name", &name, "-w", "500ms"])
        .cmd(&["touch", ran.to_str().unwrap()])
        .output();
    assert_busy_and_ran_nothing(&out, &ran, Some(Duration::from_millis(500)));
    assert_only_the_holder_remains(zk, &name, h);
}

#[test]
fn sigterm_while_waiting_exits_143_starts_nothing_and_removes_the_node() {
    let sb = Sandbox::new();
    let (zk, name, h) = held(&sb, "sigterm_waiting");
    let mut w = Job::spawn(zk_job(&zk.connect(), &name), Marks::new(&sb, "w"), false);
    wait_for_queue_len(zk.port(), &name, 2, STARTUP);
    w.run.kill(Signal::SIGTERM);
    w.wait(Duration::from_secs(3));
    assert_exit(&w.run, 143);
    assert!(!w.marks.started(), "the waiter started its child");
    assert_only_the_holder_remains(zk, &name, h);
}

#[test]
fn next_waiter_starts_within_milliseconds_of_the_holder_s_exit() {
    let sb = Sandbox::new();
    let (zk, name, a) = held(&sb, "handover");
    let b = Job::spawn(zk_job(&zk.connect(), &name), Marks::new(&sb, "b"), false);
    wait_for_queue_len(zk.port(), &name, 2, STARTUP);
    hand_over(a, b, "ZooKeeper");
}

// ---------------------------------------------------------------------------------------------
// 3. Losses: the holder SIGKILLed, SIGSTOPped, cut off from its server, its node deleted.
// ---------------------------------------------------------------------------------------------

/// SIGKILL of leasewrap: its child dies at once (the watchdog sees its parent go), and the
/// waiter starts only once ZooKeeper expired the dead holder's session, about a session
/// timeout later.
#[test]
fn sigkill_of_the_holder_kills_its_child_at_once_and_the_next_starts_after_the_session_timeout() {
    let sb = Sandbox::new();
    let (zk, name, mut a) = held(&sb, "sigkill");
    let a_child = a.child();
    // Read now: the child may be killed before it wrote its environment.
    let a_token = a.token();
    let mut b = Job::spawn(zk_job(&zk.connect(), &name), Marks::new(&sb, "b"), false);
    wait_for_queue_len(zk.port(), &name, 2, STARTUP);

    let killed_ns = now_ns();
    a.run.kill(Signal::SIGKILL);
    assert_all_die_within(Duration::from_secs(1), &[("A's child", a_child)]);
    let child_dead_ms = ms(now_ns() - killed_ns);
    a.wait(STARTUP);
    assert_signaled(&a.run, Signal::SIGKILL);
    let b_start = read_ns(&b.marks.start);
    let waited = ms(b_start - killed_ns);
    eprintln!(
        "ZooKeeper SIGKILL: A's child dead {child_dead_ms:.0} ms after the kill, B's child started \
         {waited:.0} ms after it (session timeout {TTL:?})"
    );
    // The session's last touch was at most a client ping interval (T/3) before the kill.
    let at_least = ms(TTL.as_nanos() as i128) / 2.0;
    assert!(
        waited >= at_least,
        "B started {waited:.0} ms after the kill: the session was not waited out"
    );
    assert!(
        waited < ms(TAKEOVER_BOUND.as_nanos() as i128),
        "B started only after {waited:.0} ms"
    );
    assert!(b.token() > a_token);
    b.release();
    b.finish_with(0);
}

#[test]
fn watchdog_kills_the_child_before_the_session_expires_while_leasewrap_is_stopped() {
    holder_stopped_for_two_timeouts(Stopped::Leasewrap);
}

#[test]
fn watchdog_kills_the_child_before_the_session_expires_while_leasewrap_s_group_is_stopped() {
    holder_stopped_for_two_timeouts(Stopped::Group);
}

/// F5 on ZooKeeper: the holder's leasewrap (or its group) SIGSTOPped for 2 x the session
/// timeout; its child is dead before the next holder's starts.
fn holder_stopped_for_two_timeouts(stopped: Stopped) {
    let zk = zookeeper::shared();
    let name = zookeeper::unique_name("f5");
    let sb = Sandbox::new();
    let lw = || zk_job(&zk.connect(), &name);
    let mut a = Job::spawn(lw().own_process_group(), Marks::new(&sb, "a"), true);
    let a_child = a.child();
    assert_a_watchdog_between(a.run.pid(), a_child);
    let mut c = Job::spawn(lw(), Marks::new(&sb, "c"), false);
    wait_for_queue_len(zk.port(), &name, 2, STARTUP);

    let takeover = stop_for_two_ttls_while_c_takes_over(stopped, &a, &c);
    assert!(
        last_beat_ns(&a.marks.beat) < takeover.new_start_ns,
        "the old child beat after the next child started"
    );
    a.wait(Duration::from_secs(5));
    assert_exit(&a.run, 124);
    assert_next_holder_undisturbed(zk, &name, &c);
    eprintln!(
        "F5 ZooKeeper {stopped:?} SIGSTOPped: {}",
        takeover.describe()
    );
    c.release();
    c.finish_with(0);
}

/// After the old holder exited: the next holder's child still runs, its node is the only one,
/// and its token is that node's czxid.
#[track_caller]
fn assert_next_holder_undisturbed(zk: &Zk, name: &str, next: &Job) {
    assert!(
        pid_alive(next.child()),
        "the next holder's child was disturbed"
    );
    assert!(!next.marks.end.exists(), "the next holder's child ended");
    let nodes = queue(zk.port(), name);
    assert_eq!(nodes.len(), 1, "nodes left: {nodes:?}");
    let node = format!("{}/{}", lock_dir(name), nodes[0]);
    let stat = zookeeper::stat(&zk.connect(), &node).expect("the next holder's node");
    assert_eq!(
        stat.czxid,
        next.token(),
        "the node left is the next holder's"
    );
}

#[test]
fn holder_behind_a_blackholed_client_link_is_dead_before_the_next_holder_starts() {
    let takeover = client_link_fault(Mode::Blackhole, "client_blackhole");
    eprintln!("ZooKeeper client link blackholed: {}", takeover.describe());
}

#[test]
fn holder_whose_replies_are_delayed_is_dead_before_the_next_holder_starts() {
    let delay = TTL.mul_f64(0.6);
    let takeover = client_link_fault(Mode::DelayReplies(delay), "client_delay");
    eprintln!(
        "ZooKeeper replies delayed {delay:?}: {}",
        takeover.describe()
    );
}

/// Holder A reaches the server through a proxy, contender C directly; the proxy turns to
/// `fault` for 2 x the session timeout. A's child is dead before C's starts; A exits 124.
fn client_link_fault(fault: Mode, label: &str) -> crate::etcd::Takeover {
    let zk = zookeeper::shared();
    let name = zookeeper::unique_name(label);
    let sb = Sandbox::new();
    let proxy = Proxy::start(zk.addr());
    let through = proxy.addr().to_string();
    let mut a = Job::spawn(zk_job(&through, &name), Marks::new(&sb, "a"), true);
    a.child();
    let mut c = Job::spawn(zk_job(&zk.connect(), &name), Marks::new(&sb, "c"), false);
    wait_for_queue_len(zk.port(), &name, 2, STARTUP);

    let takeover = fault_through_proxy(&proxy, fault, &mut a, &c);
    assert_next_holder_undisturbed(zk, &name, &c);
    assert!(c.token() > a.token());
    c.release();
    c.finish_with(0);
    takeover
}

/// Someone deletes the holder's lock node: leasewrap stops its child and exits 124, as on etcd
/// when the lock key is deleted.
#[test]
fn deleting_the_lock_node_stops_the_child_and_exits_124() {
    let sb = Sandbox::new();
    let (zk, name, mut h) = held(&sb, "deleted");
    let child = h.child();
    let nodes = queue(zk.port(), &name);
    let node = format!("{}/{}", lock_dir(&name), nodes[0]);
    let deleting = Instant::now();
    zookeeper::cli_ok(&zk.connect(), &["delete", &node]);
    h.wait(Duration::from_secs(4));
    assert_exit(&h.run, 124);
    assert!(!pid_alive(child), "leasewrap exited but its child runs");
    assert!(!h.marks.end.exists(), "the child finished on its own");
    eprintln!(
        "ZooKeeper lock node deleted: exit 124 {:.2?} after the CLI was started to delete it",
        deleting.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Guarded writes: fenced-put and --once.
// ---------------------------------------------------------------------------------------------

/// The child's view of its lease (LEASEWRAP_* and the ZooKeeper variables), for running a
/// subcommand as the child would.
fn lease_env(job: &Job) -> HashMap<String, String> {
    let env = job.env();
    env.into_iter()
        .filter(|(k, _)| k.starts_with("LEASEWRAP_") || k.starts_with("ZOO"))
        .collect()
}

/// `leasewrap fenced-put KEY VALUE` with the holder's environment and token.
fn fenced_put(env: &HashMap<String, String>, key: &str, value: &str) -> Output {
    let token = &env["LEASEWRAP_FENCING_TOKEN"];
    let mut lw = Leasewrap::subcommand("fenced-put").args(&["--token", token, key, value]);
    for (k, v) in env {
        lw = lw.env(k, v);
    }
    lw.output()
}

/// A fenced-put with the holder's token writes while it holds; once its session is gone (its
/// leasewrap SIGKILLed, the session expired) the same put is refused with 73 and writes
/// nothing, also after another holder took the lease.
#[test]
fn fenced_put_writes_while_the_lock_is_held_and_is_refused_after_a_loss() {
    let sb = Sandbox::new();
    let (zk, name, mut a) = held(&sb, "fenced_put");
    let env = lease_env(&a);
    let key = format!("/{name}-data");
    let put = fenced_put(&env, &key, "one");
    assert_exit(&put, 0);
    let value = || zookeeper::cli_ok(&zk.connect(), &["get", &key]);
    assert!(value().contains("one"), "{}", value());

    a.run.kill(Signal::SIGKILL);
    a.wait(STARTUP);
    wait_until(TAKEOVER_BOUND, "the dead holder's node to go", || {
        queue(zk.port(), &name).is_empty()
    });
    let refused = fenced_put(&env, &key, "after the loss");
    assert_exit(&refused, 73);
    let next = hold(zk_job(&zk.connect(), &name), &sb, "next");
    let refused = fenced_put(&env, &key, "after the next holder came");
    assert_exit(&refused, 73);
    assert!(
        value().contains("one") && !value().contains("after"),
        "{}",
        value()
    );
    next.finish();
}

/// Two hosts with `--once-per 1h -w 30s`: the job runs once; the second host finds it done.
#[test]
fn once_per_slot_runs_the_job_once_across_two_holders() {
    let zk = zookeeper::shared();
    let name = zookeeper::unique_name("once");
    let sb = Sandbox::new();
    let runs_file = sb.path("runs");
    let job = format!("echo ran >> {}; sleep 0.3", q(&runs_file));
    let mut runs: Vec<Running> = (0..2)
        .map(|_| {
            Leasewrap::new()
                .on_zookeeper(&zk.connect())
                .name(&name)
                .args(&["--ttl", TTL_ARG, "-w", "30s", "--once-per", "1h"])
                .cmd(&["sh", "-c", &job])
                .spawn()
        })
        .collect();
    let mut codes: Vec<i32> = runs
        .iter_mut()
        .map(|r| r.wait_timeout(Duration::from_secs(40)).code().unwrap_or(-1))
        .collect();
    codes.sort();
    let stderr: Vec<String> = runs.iter().map(Running::stderr).collect();
    let ran = fs::read_to_string(&runs_file).unwrap_or_default();
    assert_eq!(
        ran.lines().count(),
        1,
        "runs: {ran:?}\n{}",
        stderr.join("\n")
    );
    assert_eq!(codes, [0, 75], "{}", stderr.join("\n"));
}
