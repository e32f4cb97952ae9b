//! Black-box tests of the built binary on the local backend (flock + token file, no etcd).
//!
//! Each test has its own sandbox (temp dir) and lease name, so they run in parallel threads.
//! Children report what they saw through files; the tests wait for those files, for pids to
//! die and for exits, always with a bound, never with a blind sleep.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::support::*;

/// `sh -c` body that prints the fencing token.
const PRINT_TOKEN: &str = "echo $LEASEWRAP_FENCING_TOKEN";

/// A command that does not exist anywhere on PATH.
const NO_SUCH_COMMAND: &str = "leasewrap-test-no-such-command";

/// The next holder of `name`, run with `-n` once the old holder's tree is gone, gets token 2.
#[track_caller]
fn assert_next_holder_gets_token_2(sb: &Sandbox, name: &str) {
    assert_eq!(token_run(sb, name, &["-n"]), 2, "token of the next holder");
}

/// `lw` run to the end with `sh -c SCRIPT` as its command.
fn sh_output(lw: Leasewrap, script: &str) -> Output {
    lw.cmd(&["sh", "-c", script]).output()
}

/// Runs a child that prints its token, asserts success, and returns the token.
#[track_caller]
fn token_run(sb: &Sandbox, name: &str, extra: &[&str]) -> u64 {
    let out = sh_output(sb.leasewrap().name(name).args(extra), PRINT_TOKEN);
    assert_exit(&out, 0);
    out.stdout
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("token {:?}: {e}", out.stdout))
}

/// A holder of `name` whose child (files labelled `label`) runs until `finish()`; returns once
/// the child runs.
#[track_caller]
fn hold(sb: &Sandbox, name: &str, label: &str) -> Job {
    Job::hold(sb.leasewrap().name(name), sb, label)
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

#[test]
fn fencing_token_grows_by_one_per_run_and_name_is_set() {
    let sb = Sandbox::new();
    for expected in 1..=3 {
        let out = sh_output(
            sb.leasewrap().name("tokens"),
            "echo $LEASEWRAP_FENCING_TOKEN $LEASEWRAP_NAME",
        );
        assert_exit(&out, 0);
        assert_eq!(
            out.stdout,
            format!("{expected} tokens\n"),
            "run {expected}{}",
            out.context()
        );
    }
    assert_eq!(sb.token("tokens"), Some(3), "token file after three runs");
}

/// Runs `touch MARKER` for `name` with `args` while another holder has `name`, asserts exit
/// `code` and that the command did not run, and returns the output once the holder is done.
#[track_caller]
fn refused_while_held(sb: &Sandbox, name: &str, args: &[&str], code: i32) -> Output {
    let holder = hold(sb, name, "first");
    let marker = sb.path("second.ran");
    let out = sb
        .leasewrap()
        .name(name)
        .args(args)
        .cmd(&["touch", path_str(&marker)])
        .output();
    assert_exit(&out, code);
    assert!(
        !marker.exists(),
        "the second command ran although the lease was held"
    );
    holder.finish();
    out
}

#[test]
fn no_wait_exits_75_while_the_lease_is_held() {
    let sb = Sandbox::new();
    refused_while_held(&sb, "busy", &["-n"], 75);
    assert_eq!(sb.token("busy"), Some(1), "the refused run moved the token");
}

#[test]
fn no_wait_with_conflict_exit_code_0_exits_0_without_running() {
    refused_while_held(&Sandbox::new(), "busy0", &["-n", "-E", "0"], 0);
}

#[test]
fn bounded_wait_gives_up_with_75_after_the_wait() {
    let out = refused_while_held(&Sandbox::new(), "waiting", &["-w", "300ms"], 75);
    assert!(
        out.elapsed >= Duration::from_millis(300),
        "gave up after {:?}",
        out.elapsed
    );
}

#[test]
fn child_exit_status_passes_through() {
    let sb = Sandbox::new();
    for code in [0, 7] {
        let out = sh_output(sb.leasewrap().name("status"), &format!("exit {code}"));
        assert_exit(&out, code);
    }
}

#[test]
fn child_killed_by_sigsegv_makes_leasewrap_die_of_sigsegv_without_core() {
    let out = sh_output(Leasewrap::new().name("segv"), "ulimit -c 0; kill -SEGV $$");
    assert_signaled(&out, Signal::SIGSEGV);
    assert!(
        !out.status.core_dumped(),
        "leasewrap dumped core re-raising SIGSEGV"
    );
}

#[test]
fn child_killed_by_sigkill_makes_leasewrap_die_of_sigkill() {
    let out = sh_output(Leasewrap::new().name("selfkill"), "kill -KILL $$");
    assert_signaled(&out, Signal::SIGKILL);
}

#[test]
fn a_shell_sees_139_and_137_when_the_child_dies_of_sigsegv_and_sigkill() {
    for (sig, shell_status) in [("SEGV", "139"), ("KILL", "137")] {
        let out = sh_output(
            Leasewrap::new().name("shellsees").via_shell(),
            &format!("ulimit -c 0; kill -{sig} $$"),
        );
        assert_exit(&out, 0);
        assert_eq!(
            out.stdout.lines().last(),
            Some(shell_status),
            "SIG{sig}{}",
            out.context()
        );
    }
}

/// Runs a command that does not exist for `name` and asserts exit 127.
#[track_caller]
fn missing_command_exits_127(sb: &Sandbox, name: &str) {
    let out = sb.leasewrap().name(name).cmd(&[NO_SUCH_COMMAND]).output();
    assert_exit(&out, 127);
}

#[test]
fn missing_command_exits_127_and_does_not_move_the_token() {
    let sb = Sandbox::new();
    for (before, next, what) in [(None, 1, "took a token"), (Some(1), 2, "moved the token")] {
        missing_command_exits_127(&sb, "missing");
        assert_eq!(
            sb.token("missing"),
            before,
            "a run that never started its command {what}"
        );
        assert_eq!(token_run(&sb, "missing", &[]), next);
    }
}

#[test]
fn non_executable_command_exits_126_and_acquires_nothing() {
    let sb = Sandbox::new();
    let marker = sb.path("ran");
    let file = sb.path("not-executable");
    fs::write(&file, format!("#!/bin/sh\ntouch {}\n", q(&marker))).expect("write file");
    fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = sb
        .leasewrap()
        .name("noexec")
        .cmd(&[path_str(&file)])
        .output();
    assert_exit(&out, 126);
    assert!(!marker.exists(), "the non-executable file ran");
    assert_eq!(
        sb.token("noexec"),
        None,
        "a run that never started its command took a token"
    );
}

#[test]
fn missing_command_is_reported_before_waiting_for_a_busy_lease() {
    let sb = Sandbox::new();
    let holder = hold(&sb, "checkfirst", "first");
    // No -n: if the command were resolved only after acquiring, this would wait for the holder.
    missing_command_exits_127(&sb, "checkfirst");
    holder.finish();
}

/// Sends `sig` to a holder whose child and grandchild trap it, with a second holder already
/// waiting: both traps run, the tree is gone when leasewrap exits with the child's status,
/// and the waiter starts at once with the next token.
fn stop_signal_reaches_the_tree_and_hands_over(sig: Signal) {
    let sb = Sandbox::new();
    let name = "handover";
    let child = trapping_child_and_grandchild(&sb, sig);
    let mut first = sb.leasewrap().name(name).cmd(&[path_str(&child)]).spawn();
    let child_pid = read_pid(&sb.path("child.pid"), STARTUP);
    let grandchild_pid = read_pid(&sb.path("grandchild.pid"), STARTUP);
    let _guard = KillOnDrop(vec![child_pid, grandchild_pid]);
    let watchdog = ppid_of(child_pid).expect("the child's parent");

    let second_token = sb.path("second.token");
    let mut second = sb
        .leasewrap()
        .name(name)
        .cmd(&["sh", "-c", &format!("{PRINT_TOKEN} > {}", q(&second_token))])
        .spawn();
    let lock = fs::canonicalize(sb.lock_file(name)).expect("lock file of the first holder");
    wait_until(
        STARTUP,
        "the second holder to open the lock file and queue",
        || has_open(second.pid(), &lock),
    );

    first.kill(sig);
    first.wait_timeout(STARTUP);
    assert_exit(&first, 42);
    assert!(sb.path("child.got").exists(), "the child never saw {sig}");
    assert!(
        sb.path("grandchild.got").exists(),
        "the grandchild never saw {sig}"
    );
    assert_none_outlived_leasewrap(&[
        ("child", child_pid),
        ("grandchild", grandchild_pid),
        ("watchdog", watchdog),
    ]);
    let token = read_line_file(&second_token, Duration::from_secs(2));
    assert_eq!(token, "2", "token of the waiter that took over");
    second.wait_timeout(STARTUP);
    assert_exit(&second, 0);
}

/// A child script whose child (the grandchild) runs in the foreground; both trap `sig`, record
/// it in child.got and grandchild.got, and exit (the child with 42). Each writes its pid.
fn trapping_child_and_grandchild(sb: &Sandbox, sig: Signal) -> PathBuf {
    let trap = &sig.as_str()["SIG".len()..];
    let grandchild = sb.script(
        "grandchild.sh",
        &format!(
            "trap 'echo $$ > {got}; exit 0' {trap}\n{pid}\nsleep 60\necho woke > {got}.late",
            got = q(&sb.path("grandchild.got")),
            pid = atomically("echo $$", &sb.path("grandchild.pid")),
        ),
    );
    // The grandchild runs in the foreground: a background job of sh would ignore SIGINT.
    sb.script(
        "child.sh",
        &format!(
            "trap 'echo $$ > {got}; exit 42' {trap}\n{pid}\n{gc}\necho woke > {got}.late",
            got = q(&sb.path("child.got")),
            pid = atomically("echo $$", &sb.path("child.pid")),
            gc = q(&grandchild),
        ),
    )
}

#[track_caller]
fn assert_none_outlived_leasewrap(procs: &[(&str, i32)]) {
    for &(what, pid) in procs {
        assert!(
            !pid_alive(pid),
            "{what} (pid {pid}) outlived leasewrap: {}",
            cmdline(pid)
        );
    }
}

#[test]
fn sigterm_reaches_child_and_grandchild_and_the_waiter_takes_over_at_once() {
    stop_signal_reaches_the_tree_and_hands_over(Signal::SIGTERM);
}

#[test]
fn sigint_reaches_child_and_grandchild_and_the_waiter_takes_over_at_once() {
    stop_signal_reaches_the_tree_and_hands_over(Signal::SIGINT);
}

#[test]
fn sighup_reaches_child_and_grandchild_and_the_waiter_takes_over_at_once() {
    stop_signal_reaches_the_tree_and_hands_over(Signal::SIGHUP);
}

/// Started from `nohup` or as a shell's background job, leasewrap has SIGHUP, SIGINT and SIGQUIT
/// ignored, and an ignored signal stays ignored across exec: the child must get every signal's
/// default action all the same, or the signal leasewrap forwards does nothing and the child is
/// killed only after kill-after.
#[test]
fn a_child_gets_default_signal_actions_though_leasewrap_was_started_with_them_ignored() {
    let forwarded = [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ];
    for sig in [Signal::SIGINT, Signal::SIGHUP] {
        let sb = Sandbox::new();
        let pid_file = sb.path("child.pid");
        let child = format!("{}; exec sleep 60", atomically("echo $$", &pid_file));
        let mut run = sb
            .leasewrap()
            .name("ignored")
            .args(&["--kill-after", "30s", "--ttl", "60s"])
            .ignoring(&forwarded)
            .cmd(&["sh", "-c", &child])
            .spawn();
        let pid = read_pid(&pid_file, STARTUP);
        let _guard = KillOnDrop(vec![pid]);
        wait_until(STARTUP, "the child to exec sleep", || comm(pid) == "sleep");
        let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("child's status");
        let ignored = status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .expect("SigIgn in the child's status");
        // Signals 1 to 31; 32 and up are the C library's and real-time ones, which a program's
        // own C library sets up.
        assert_eq!(
            ignored & 0x7fff_ffff,
            0,
            "the child ignores no standard signal: SigIgn {ignored:016x}"
        );
        run.kill(sig);
        // kill-after is 30 s: only the forwarded signal itself ends the child within the bound.
        run.wait_timeout(STARTUP);
        assert_signaled(&run, sig);
    }
}

/// A holder whose child ignores SIGTERM and has started a daemon (setsid + double fork,
/// also ignoring SIGTERM): the pids of leasewrap's whole tree.
#[test]
fn sigkill_to_leasewrap_kills_the_whole_tree_including_a_daemon() {
    sigkilled_leasewrap_leaves_no_tree("killed", false);
}

/// SIGKILL to leasewrap, or to its whole process group: the tree dies all the same, and the
/// next holder gets the next token.
fn sigkilled_leasewrap_leaves_no_tree(name: &str, whole_group: bool) {
    let sb = Sandbox::new();
    let lw = sb.leasewrap().name(name);
    let lw = if whole_group {
        lw.own_process_group()
    } else {
        lw
    };
    let mut tree = start_tree(&sb, lw);
    let leasewrap = Pid::from_raw(tree.leasewrap.pid());
    let killed = if whole_group {
        signal::killpg(leasewrap, Signal::SIGKILL)
    } else {
        signal::kill(leasewrap, Signal::SIGKILL)
    };
    killed.expect("SIGKILL leasewrap");
    tree.leasewrap.wait_timeout(Duration::from_secs(1));
    assert_signaled(&tree.leasewrap, Signal::SIGKILL);
    tree.assert_gone();
    assert_next_holder_gets_token_2(&sb, name);
}

#[test]
fn after_sigkill_to_leasewrap_the_queued_holder_starts_only_once_the_old_tree_is_gone() {
    let sb = Sandbox::new();
    let mut tree = start_tree(&sb, sb.leasewrap().name("handoff"));
    let seen = sb.path("seen");
    // The next holder's child lists whichever process of the old tree still has a /proc entry
    // (running, or a zombie not yet reaped) at the moment it starts.
    let check = format!(
        "for p in $(cat {} {}); do [ -e /proc/$p/stat ] && echo $p; done > {}.tmp; mv {}.tmp {}",
        q(&sb.path("child.pid")),
        q(&sb.path("daemon.pid")),
        q(&seen),
        q(&seen),
        q(&seen)
    );
    let mut next = sb
        .leasewrap()
        .name("handoff")
        .cmd(&["sh", "-c", &check])
        .spawn();
    let lock = fs::canonicalize(sb.lock_file("handoff")).expect("lock file of the first holder");
    wait_until(STARTUP, "the next holder to queue on the lock file", || {
        has_open(next.pid(), &lock)
    });
    // The watchdog is held still, so the old tree cannot die yet; leasewrap dies, and with it
    // its own descriptor of the lock file.
    let watchdog = Pid::from_raw(tree.watchdog);
    signal::kill(watchdog, Signal::SIGSTOP).expect("stop the watchdog");
    tree.leasewrap.kill(Signal::SIGKILL);
    tree.leasewrap.wait_timeout(STARTUP);
    // Waiting out a window is the assertion here: the lock must stay held as long as the old
    // tree can run.
    let window = Instant::now() + Duration::from_millis(500);
    while Instant::now() < window {
        assert!(
            !seen.exists(),
            "the next holder started while the old tree could still run"
        );
        std::thread::sleep(POLL);
    }
    signal::kill(watchdog, Signal::SIGCONT).expect("continue the watchdog");
    wait_for_file(&seen, STARTUP);
    next.wait_timeout(STARTUP);
    assert_exit(&next, 0);
    assert_eq!(
        fs::read_to_string(&seen).unwrap(),
        "",
        "the next holder started while the old child or daemon still existed"
    );
    tree.assert_gone();
}

#[test]
fn sigkill_to_the_watchdog_kills_the_whole_tree_including_a_daemon() {
    let sb = Sandbox::new();
    signal_the_watchdog(&sb, "watchdog", Signal::SIGKILL);
    assert_next_holder_gets_token_2(&sb, "watchdog");
}

/// Sends `sig` to the watchdog of a tree held as `name` (its child and daemon ignore SIGTERM),
/// asserts that the whole tree goes, and returns leasewrap once it has exited.
fn signal_the_watchdog(sb: &Sandbox, name: &str, sig: Signal) -> Running {
    let mut tree = start_tree(sb, sb.leasewrap().name(name));
    signal::kill(Pid::from_raw(tree.watchdog), sig).expect("signal the watchdog");
    tree.assert_gone();
    tree.leasewrap.wait_timeout(STARTUP);
    tree.leasewrap
}

#[test]
fn sigkill_to_leasewrap_s_process_group_kills_the_whole_tree_including_a_daemon() {
    // `kill -9 -- -PGID`, or `kill -9 %1` from a job-control shell: the watchdog is not in
    // leasewrap's group, so it lives on to kill the tree.
    sigkilled_leasewrap_leaves_no_tree("group", true);
}

#[test]
fn sigstop_to_leasewrap_s_process_group_leaves_the_watchdog_running() {
    // `kill -STOP -- -PGID`, or Ctrl-Z: leasewrap stops, the process that enforces D does not.
    let sb = Sandbox::new();
    let lw = sb.leasewrap().name("stopped").own_process_group();
    let tree = start_tree(&sb, lw);
    let group = Pid::from_raw(tree.leasewrap.pid());
    let _resume = ContinueGroupOnDrop(group);
    signal::killpg(group, Signal::SIGSTOP).expect("SIGSTOP leasewrap's process group");
    wait_until(STARTUP, "leasewrap to stop", || {
        is_stopped(tree.leasewrap.pid())
    });
    // The stop reached every process of the group; the watchdog is in none of them.
    assert!(
        !is_stopped(tree.watchdog),
        "the watchdog was stopped with leasewrap's group"
    );
    // Stopped or not, it still does its work: a stop signal sent to it stops the tree.
    signal::kill(Pid::from_raw(tree.watchdog), Signal::SIGTERM).expect("TERM the watchdog");
    tree.assert_gone();
}

#[test]
fn sigterm_to_leasewrap_while_the_watchdog_is_stopped_still_stops_the_whole_tree() {
    // The watchdog alone SIGSTOPped (by its pid) cannot stop anything: leasewrap must.
    let sb = Sandbox::new();
    let mut tree = start_tree(&sb, sb.leasewrap().name("stopped-watchdog"));
    let watchdog = Pid::from_raw(tree.watchdog);
    let _resume = ContinueGroupOnDrop(watchdog);
    signal::kill(watchdog, Signal::SIGSTOP).expect("SIGSTOP the watchdog");
    wait_until(STARTUP, "the watchdog to stop", || {
        is_stopped(tree.watchdog)
    });
    tree.leasewrap.kill(Signal::SIGTERM);
    tree.assert_gone();
    tree.leasewrap.wait_timeout(STARTUP);
    assert_exit(&tree.leasewrap, 125);
    assert_next_holder_gets_token_2(&sb, "stopped-watchdog");
}

#[test]
fn the_stop_signal_reaches_the_child_while_the_watchdog_is_stopped() {
    // leasewrap, standing in for a stopped watchdog, stops the child in order first.
    let sb = Sandbox::new();
    let (pid_file, got) = (sb.path("child.pid"), sb.path("got-term"));
    let script = format!(
        "trap 'echo TERM > {}; exit 0' TERM; {}; while :; do sleep 0.01; done",
        q(&got),
        atomically("echo $$", &pid_file)
    );
    let mut lw = sb
        .leasewrap()
        .name("orderly")
        .cmd(&["sh", "-c", &script])
        .spawn();
    let child = read_pid(&pid_file, STARTUP);
    let _guard = KillOnDrop(vec![child]);
    let watchdog = Pid::from_raw(ppid_of(child).expect("the child's parent"));
    let _resume = ContinueGroupOnDrop(watchdog);
    signal::kill(watchdog, Signal::SIGSTOP).expect("SIGSTOP the watchdog");
    wait_until(STARTUP, "the watchdog to stop", || {
        is_stopped(watchdog.as_raw())
    });
    lw.kill(Signal::SIGTERM);
    wait_for_file(&got, STARTUP);
    lw.wait_timeout(STARTUP);
    assert_exit(&lw, 125);
    assert!(!pid_alive(child), "the child outlived leasewrap");
}

/// SIGCONTs a process group on drop, so that a failed test leaves nothing stopped.
struct ContinueGroupOnDrop(Pid);

impl Drop for ContinueGroupOnDrop {
    fn drop(&mut self) {
        let _ = signal::killpg(self.0, Signal::SIGCONT);
    }
}

#[test]
fn sigterm_to_the_watchdog_itself_stops_the_whole_tree_in_order() {
    // `pkill -f leasewrap` matches the watchdog too (forked, it has leasewrap's command line; and
    // `pkill leasewrap` matches its name, leasewrap-wd). The child and
    // the daemon ignore SIGTERM: they are SIGKILLed after --kill-after, and all reaped.
    let sb = Sandbox::new();
    let leasewrap = signal_the_watchdog(&sb, "pkill", Signal::SIGTERM);
    assert_signaled(&leasewrap, Signal::SIGKILL);
    assert_next_holder_gets_token_2(&sb, "pkill");
}

/// The attack on the child's pid, as a script for `unshare --pid --fork --mount-proc`: in a pid
/// namespace of its own nothing else forks, so writing the pid before the child's to
/// ns_last_pid gives the next process exactly the child's pid if it is free (and rewinding pids
/// cannot hand another test's pids around). The child starts a daemon that ignores SIGTERM and
/// exits once told to; while the watchdog stops the daemon (its sweep lasts --kill-after), a process of the
/// second user asks for the child's pid, in a group of its own (and then, if asked, the watchdog
/// is SIGKILLed, so that leasewrap sweeps what it leaves). The script reports what the
/// child's pid was then, which pid the taker got, and whether the taker outlived leasewrap.
fn pid_attack_script(sb: &Sandbox, kill_the_watchdog: bool) -> String {
    let user = user::other();
    let daemon = daemon_script(sb);
    let child = sb.script(
        "child.sh",
        &format!(
            "{}\nsetsid sh -c '\"$0\" &' {} </dev/null >/dev/null 2>&1\n\
             while [ ! -e {} ]; do sleep 0.01; done\nexit 0",
            atomically("echo $$", &sb.path("child.pid")),
            q(&daemon),
            q(&sb.path("go")),
        ),
    );
    let state_of = "sed 's/.*) //' /proc/$c/stat 2>/dev/null | cut -d' ' -f1,2";
    let kill = ["", "kill -9 $wd\n"][usize::from(kill_the_watchdog)];
    format!(
        "{bin} --local-dir {state} --name reuse --kill-after 3s -- {child} &\n\
         lw=$!\n\
         i=0; while ! [ -e {child_pid} ] || ! [ -e {daemon_pid} ]; do\n\
           [ $i -lt 1000 ] || exit 3; sleep 0.01; i=$((i+1)); done\n\
         c=$(cat {child_pid}); wd=$({state_of} | cut -d' ' -f2)\n\
         : > {go}\n\
         i=0; while case \"$({state_of} | cut -c1)\" in S|R|D) true;; *) false;; esac \
           && [ $i -lt 1000 ]; do\n\
           sleep 0.01; i=$((i+1)); done\n\
         echo \"held=$({state_of}) watchdog=$wd\"\n\
         echo $((c - 1)) > /proc/sys/kernel/ns_last_pid\n\
         setpriv --reuid={uid} --regid={gid} --clear-groups setsid sleep 60 &\n\
         taker=$!\n\
         i=0; while [ \"$(sed 's/.*) //' /proc/$taker/stat | cut -d' ' -f3)\" != $taker ]; do\n\
           [ $i -lt 1000 ] || exit 4; sleep 0.01; i=$((i+1)); done\n\
         {kill}\
         wait $lw\n\
         st=$(sed 's/.*) //' /proc/$taker/stat 2>/dev/null | cut -c1)\n\
         if [ -n \"$st\" ] && [ \"$st\" != Z ]; then alive=yes; else alive=no; fi\n\
         echo \"child=$c taker=$taker alive=$alive\"\n\
         kill -9 $taker 2>/dev/null; exit 0\n",
        bin = q(Path::new(BIN)),
        state = q(&sb.state()),
        child = q(&child),
        child_pid = q(&sb.path("child.pid")),
        daemon_pid = q(&sb.path("daemon.pid")),
        go = q(&sb.path("go")),
        uid = user.uid,
        gid = user.gid,
    )
}

/// The child has exited while its daemon lives on: its pid must still be the watchdog's
/// zombie, so that nobody else can have it while the group is signalled, and a process of
/// another user that asks for it gets another one and is never signalled.
fn childs_pid_is_reserved_through_the_sweep(kill_the_watchdog: bool) {
    let sb = Sandbox::new();
    let mut unshare = Command::new("unshare");
    unshare
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c"])
        .arg(pid_attack_script(&sb, kill_the_watchdog));
    let out = run_bounded(unshare, Duration::from_secs(20));
    assert_exit(&out, 0);
    let report = |key: &str| {
        out.stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no {key}= in the report:\n{}{}", out.stdout, out.stderr))
    };
    assert_eq!(
        report("alive"),
        "yes",
        "the second user's process was signalled by the sweep:\n{}",
        out.stdout
    );
    assert_ne!(
        report("taker"),
        report("child"),
        "a process of the second user got the exited child's pid during the stop sweep"
    );
    let held = out.stdout.lines().next().unwrap_or_default();
    assert!(
        held.starts_with(&format!("held=Z {}", report("watchdog"))),
        "the exited child's pid was not held as the watchdog's zombie during the sweep: {held}"
    );
}

#[test]
fn a_process_that_takes_the_childs_pid_during_the_stop_sweep_is_never_signalled() {
    childs_pid_is_reserved_through_the_sweep(false);
}

#[test]
fn after_the_watchdog_dies_mid_sweep_leasewrap_spares_a_process_that_took_the_childs_pid() {
    childs_pid_is_reserved_through_the_sweep(true);
}

/// Spawns `lw` with a `sh -c` child that runs `setup`, writes its pid and execs `sleep 60`;
/// returns leasewrap, the child's pid once it is written, and a guard that kills the child.
fn spawn_sleeper(sb: &Sandbox, lw: Leasewrap, setup: &str) -> (Running, i32, KillOnDrop) {
    let pid_file = sb.path("child.pid");
    let script = format!(
        "{setup}; {}; exec sleep 60",
        atomically("echo $$", &pid_file)
    );
    let lw = lw.cmd(&["sh", "-c", &script]).spawn();
    let child = read_pid(&pid_file, STARTUP);
    (lw, child, KillOnDrop(vec![child]))
}

#[track_caller]
fn assert_child_gone(child: i32) {
    assert!(
        !pid_alive(child),
        "the child outlived leasewrap: {}",
        cmdline(child)
    );
}

#[test]
fn child_ignoring_sigterm_is_sigkilled_after_kill_after() {
    let sb = Sandbox::new();
    let lw = sb
        .leasewrap()
        .name("stubborn")
        .args(&["--kill-after", "1s"]);
    let (mut lw, child, _guard) = spawn_sleeper(&sb, lw, "trap '' TERM");
    let sent = Instant::now();
    lw.kill(Signal::SIGTERM);
    lw.wait_timeout(Duration::from_secs(4));
    let elapsed = sent.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1),
        "leasewrap exited {elapsed:?} after SIGTERM, before --kill-after"
    );
    assert_child_gone(child);
}

/// `ls -l /proc/PID/fd` output as (fd, target) pairs, by fd (ls sorts "10" before "2").
fn fd_table(listing: &str) -> Vec<(u32, String)> {
    let mut table: Vec<(u32, String)> = listing
        .lines()
        .filter_map(|line| {
            let (left, target) = line.split_once(" -> ")?;
            let fd = left.split_whitespace().last()?.parse().ok()?;
            Some((fd, target.to_owned()))
        })
        .collect();
    table.sort();
    table
}

#[test]
fn child_has_only_stdin_stdout_and_stderr_open() {
    // sh forks ls (not the last command, so no exec) and ls lists the shell's table.
    let list_fds = "ls -l /proc/$$/fd; :";
    let baseline = Command::new("sh")
        .args(["-c", list_fds])
        .stdin(Stdio::null())
        .output()
        .expect("run sh directly");
    // Whatever the test process itself lets children inherit is not leasewrap's doing.
    let inherited = fd_table(&String::from_utf8_lossy(&baseline.stdout));

    let out = sh_output(Leasewrap::new().name("fds"), list_fds);
    assert_exit(&out, 0);
    let table = fd_table(&out.stdout);
    let fds: Vec<u32> = table.iter().map(|(fd, _)| *fd).collect();
    assert!(
        fds.starts_with(&[0, 1, 2]),
        "child lacks one of 0, 1, 2:\n{}",
        out.stdout
    );
    let leaked: Vec<_> = table
        .iter()
        .filter(|e| e.0 > 2 && !inherited.contains(e))
        .collect();
    assert!(
        leaked.is_empty(),
        "leasewrap's fds leaked into the child: {leaked:?}\n{}",
        out.stdout
    );
}

#[test]
fn child_environment_has_token_and_name_but_no_secrets() {
    let sb = Sandbox::new();
    let socket_path = sb.path("notify.sock");
    let _socket = UnixDatagram::bind(&socket_path).expect("bind notify socket");
    let out = sb
        .leasewrap()
        .name("envcheck")
        .env("LEASEWRAP_PASSWORD", "s3cret-leasewrap")
        .env("ETCDCTL_PASSWORD", "s3cret-etcdctl")
        .env("NOTIFY_SOCKET", &socket_path)
        .env("UNRELATED_VARIABLE", "kept")
        .cmd(&["env"])
        .output();
    assert_exit(&out, 0);
    let vars: Vec<(&str, &str)> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .collect();
    let get = |key: &str| vars.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    assert_eq!(get("LEASEWRAP_FENCING_TOKEN"), Some("1"), "{}", out.stdout);
    assert_eq!(get("LEASEWRAP_NAME"), Some("envcheck"), "{}", out.stdout);
    assert_eq!(get("UNRELATED_VARIABLE"), Some("kept"), "{}", out.stdout);
    for key in ["LEASEWRAP_PASSWORD", "ETCDCTL_PASSWORD", "NOTIFY_SOCKET"] {
        assert_eq!(get(key), None, "{key} reached the child");
    }
    assert!(
        !out.stdout.contains("s3cret"),
        "a password reached the child:\n{}",
        out.stdout
    );
}

#[test]
fn removing_the_lock_file_stops_the_child_and_exits_124() {
    let sb = Sandbox::new();
    let lw = sb.leasewrap().name("unlinked").args(&["--ttl", "1s"]);
    let (mut lw, child, _guard) = spawn_sleeper(&sb, lw, ":");
    fs::remove_file(sb.lock_file("unlinked")).expect("remove the lock file");
    lw.wait_timeout(Duration::from_secs(3));
    assert_exit(&lw, 124);
    assert_child_gone(child);
}

#[test]
fn shell_string_without_a_name_exits_64_and_runs_nothing() {
    let sb = Sandbox::new();
    let marker = sb.path("ran");
    let out = sb
        .leasewrap()
        .shell(&format!("touch {}", q(&marker)))
        .output();
    assert_exit(&out, 64);
    assert!(!marker.exists(), "the shell string ran");
    assert!(
        sb.token_files().is_empty(),
        "acquired: {:?}",
        sb.token_files()
    );
}

#[test]
fn shell_string_runs_through_bin_sh() {
    let out = Leasewrap::new()
        .name("shellstr")
        .shell("echo hi; echo $((1 + 2))")
        .output();
    assert_exit(&out, 0);
    assert_eq!(out.stdout, "hi\n3\n");
}

/// Runs leasewrap with `args` (and, if `with_command`, a command leaving a marker) in a fresh
/// sandbox; returns its one stderr line, or everything that was wrong with the rejection.
pub(crate) fn rejection(args: &[&str], with_command: bool, code: i32) -> Result<String, String> {
    let sb = Sandbox::new();
    let marker = sb.path("ran");
    let mut lw = sb.leasewrap().args(args);
    if with_command {
        lw = lw.cmd(&["touch", path_str(&marker)]);
    }
    let out = lw.output();
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    let mut problems = Vec::new();
    if out.status.code() != Some(code) {
        problems.push(format!("{} instead of exit {code}", out.status));
    }
    if lines.len() != 1 {
        problems.push(format!("{} lines on stderr instead of 1", lines.len()));
    }
    if marker.exists() {
        problems.push("the command ran".to_owned());
    }
    if !sb.token_files().is_empty() {
        problems.push(format!("acquired: {:?}", sb.token_files()));
    }
    match problems.is_empty() {
        true => Ok(lines[0].to_owned()),
        false => Err(format!(
            "{args:?}: {}\n    stderr: {:?}",
            problems.join("; "),
            out.stderr
        )),
    }
}

/// Checks every case and panics once, listing all the cases that were not rejected properly.
#[track_caller]
fn assert_all_rejected(cases: &[Vec<&str>], code: i32) {
    let failures: Vec<String> = cases
        .iter()
        .map(|args| {
            let mut args = args.clone();
            if !args.contains(&"--name") {
                args.extend(["--name", "bad-input"]);
            }
            rejection(&args, true, code)
        })
        .filter_map(Result::err)
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn nonsense_for_any_option_exits_64_with_one_line_and_acquires_nothing() {
    let long_name = "a".repeat(200);
    let cases: Vec<Vec<&str>> = vec![
        vec!["--ttl", "abc"],
        vec!["--ttl", "0"],
        vec!["--ttl", "0.000000002s"],
        vec!["--ttl", "999ms"],
        vec!["--wait", "xyz"],
        vec!["-E", "notanumber"],
        vec!["--kill-after", "-1"],
        vec!["-s", "NOTASIGNAL"],
        vec!["--margin", "x"],
        vec!["--drift", "-1"],
        vec!["--lost-exit-code", "999"],
        vec!["--name", "a/b"],
        vec!["--name", ""],
        vec!["--name", &long_name],
        vec!["--endpoints", "not a url"],
        vec!["--log-format", "xml"],
        vec!["--dial-timeout", "0x"],
    ];
    assert_all_rejected(&cases, 64);
}

#[test]
fn an_empty_variable_that_clap_reads_counts_as_unset() {
    let sb = Sandbox::new();
    let out = sb
        .leasewrap()
        .name("empty")
        .env("LEASEWRAP_TTL", "")
        .env("LEASEWRAP_LOG_FORMAT", "")
        .cmd(&["true"])
        .output();
    assert_exit(&out, 0);
}

#[test]
fn a_ttl_below_one_second_exits_64_naming_the_minimum_and_acquires_nothing() {
    // It used to pass the flags and panic once the lock and token were taken.
    for ttl in ["0.000000002s", "999ms"] {
        let line = rejection(&["--name", "tiny", "--ttl", ttl], true, 64)
            .unwrap_or_else(|problems| panic!("{problems}"));
        assert!(
            line.contains("1s"),
            "the message does not name the minimum: {line}"
        );
    }
}

#[test]
fn unreadable_cacert_or_password_file_exits_78_and_acquires_nothing() {
    let cases: Vec<Vec<&str>> = vec![
        vec!["--cacert", "/nonexistent/leasewrap-test-ca.pem"],
        vec!["--password-file", "/nonexistent/leasewrap-test-password"],
    ];
    assert_all_rejected(&cases, 78);
}

#[test]
fn unsafe_timing_combination_exits_64_and_spells_out_the_numbers() {
    // TTL/3 (667ms) + kill-after (2s) + margin (200ms) is not below TTL/1.1 (1.818s).
    let line = rejection(
        &["--name", "timing", "--ttl", "2s", "--kill-after", "2s"],
        true,
        64,
    )
    .unwrap_or_else(|problems| panic!("{problems}"));
    assert!(
        line.to_lowercase().contains("kill"),
        "message does not name kill-after: {line}"
    );
    assert!(
        line.contains("818") || line.contains("1.82"),
        "message lacks TTL/(1+drift) = 1.818s: {line}"
    );
}

#[test]
fn no_command_at_all_exits_64() {
    let cases: [&[&str]; 3] = [&[], &["--name", "nocmd"], &["--name", "nocmd", "--"]];
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|args| rejection(args, false, 64).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
