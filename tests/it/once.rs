//! Once per scheduled run (SPEC §10): `--once`, `--once-per`, `--max-attempts`, `--max-runtime`
//! and `--metrics-file`, against the local backend and real etcd 3.4 and 3.5.
//!
//! Every behaviour that depends on the backend runs on all three: the body is `fn name(on: On)`
//! and `on_every_backend!` makes `name::local`, `name::etcd_3_4` and `name::etcd_3_5`. The
//! "hosts" of a fleet are leasewrap processes sharing one backend (one local directory, or one
//! etcd prefix). Jobs append a line to the fleet's `runs` file, so the number of runs is the
//! number of lines. Waits are bounded and wait for exits, files and process states; the only
//! fixed pauses are the 40 ms between the five hosts' starts, which is the scenario itself.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::etcd::{self, Version};
use crate::support::*;

/// Where a fleet keeps its lease and its run records.
#[derive(Clone, Copy, Debug)]
enum On {
    Local,
    Etcd(Version),
}

/// `fn NAME(on: On)` becomes `NAME::local`, `NAME::etcd_3_4` and `NAME::etcd_3_5`.
macro_rules! on_every_backend {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[test]
            fn local() {
                super::$name(super::On::Local)
            }
            #[test]
            fn etcd_3_4() {
                super::$name(super::On::Etcd(super::Version::V3_4))
            }
            #[test]
            fn etcd_3_5() {
                super::$name(super::On::Etcd(super::Version::V3_5))
            }
        }
    )+};
}

on_every_backend!(
    five_hosts_40ms_apart_run_the_job_once_with_no_wait_and_with_wait,
    a_failed_run_is_retried_by_the_next_holder_and_then_skipped,
    after_the_holder_is_sigkilled_a_waiter_runs_key_and_the_dead_run_records_nothing,
    max_attempts_2_gives_up_after_two_failed_runs,
    max_runtime_stops_a_tree_that_ignores_sigterm_and_forks_a_daemon,
    a_record_is_gone_after_keep_and_key_runs_again,
    bad_once_input_exits_64_with_one_line_and_acquires_nothing,
    a_foreign_record_exits_78_and_runs_nothing,
    a_record_with_a_time_out_of_range_exits_78_releases_the_lease_and_shows_in_status,
    a_damaged_records_text_reaches_no_terminal_raw_in_any_log_format,
    status_lists_the_runs_of_names_nobody_holds_with_every_time_in_unix_seconds,
    keep_beyond_its_bound_or_shorter_than_the_slot_exits_64_naming_the_bound,
    without_keep_a_once_per_slot_longer_than_a_week_is_kept_twice_the_slot,
    a_child_that_runs_longer_than_keep_records_its_success_kept_from_its_end,
);

/// The lease TTL of these tests: etcd's minimum, so a SIGKILLed holder's lease runs out soon.
const TTL: &str = "2s";

/// One lease name on one backend, and the hosts that share it.
struct Fleet {
    on: On,
    sandbox: Sandbox,
    /// The etcd key prefix of this fleet; unused on the local backend.
    prefix: String,
    name: &'static str,
}

impl Fleet {
    fn new(on: On, name: &'static str) -> Fleet {
        Fleet {
            on,
            sandbox: Sandbox::new(),
            prefix: etcd::unique_prefix(name),
            name,
        }
    }

    /// A leasewrap on this fleet's backend and name, with `--ttl 2s`.
    fn lw(&self) -> Leasewrap {
        let lw = match self.on {
            On::Local => self.sandbox.leasewrap(),
            On::Etcd(v) => Leasewrap::new().on_etcd(&etcd::shared(v).endpoint(), &self.prefix),
        };
        lw.name(self.name).args(&["--ttl", TTL])
    }

    /// `leasewrap status ARGS... NAME` on this fleet's backend.
    fn status(&self, args: &[&str]) -> Output {
        self.status_all(&[args, &[self.name]].concat())
    }

    /// `leasewrap status ARGS...` on this fleet's backend: every name when ARGS name none.
    fn status_all(&self, args: &[&str]) -> Output {
        let lw = Leasewrap::subcommand("status");
        let lw = match self.on {
            On::Local => lw.local_dir(self.sandbox.state()),
            On::Etcd(v) => lw.on_etcd(&etcd::shared(v).endpoint(), &self.prefix),
        };
        lw.args(args).output()
    }

    /// The file every job appends a line to.
    fn runs_file(&self) -> PathBuf {
        self.sandbox.path("runs")
    }

    /// A job that appends `line` (expanded by the shell) to the runs file, sleeps 20 ms and
    /// exits `code`.
    fn job(&self, line: &str, code: i32) -> Vec<String> {
        let script = format!(
            "echo \"{line}\" >> {}; sleep 0.02; exit {code}",
            q(&self.runs_file())
        );
        vec!["sh".into(), "-c".into(), script]
    }

    /// The lines the jobs wrote.
    fn runs(&self) -> Vec<String> {
        let text = fs::read_to_string(self.runs_file()).unwrap_or_default();
        text.lines().map(str::to_owned).collect()
    }

    /// The run record of `key` as the backend stores it, at the documented place.
    fn record(&self, key: &str) -> Option<Value> {
        let text = match self.on {
            On::Local => {
                let path = self
                    .sandbox
                    .state()
                    .join(format!("runs/{}/{key}.json", self.name));
                fs::read_to_string(path).ok()?
            }
            On::Etcd(v) => {
                let at = format!("{}/runs/{}/{key}", self.prefix, self.name);
                let value = etcd::shared(v).etcdctl_ok(&["get", "--print-value-only", &at]);
                Some(value).filter(|v| !v.trim().is_empty())?
            }
        };
        Some(serde_json::from_str(&text).expect("a run record is JSON"))
    }

    /// Where a foreign value for `key` goes, written by hand.
    fn plant_record(&self, key: &str, value: &str) {
        match self.on {
            On::Local => {
                let dir = self.sandbox.state().join(format!("runs/{}", self.name));
                fs::create_dir_all(&dir).unwrap();
                fs::write(dir.join(format!("{key}.json")), value).unwrap();
            }
            On::Etcd(v) => {
                let at = format!("{}/runs/{}/{key}", self.prefix, self.name);
                etcd::shared(v).etcdctl_ok(&["put", &at, value]);
            }
        }
    }

    /// What the backend holds for this fleet's name: lock keys or lock and token files.
    fn lease_state(&self) -> Vec<String> {
        match self.on {
            On::Local => fs::read_dir(self.sandbox.state())
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            On::Etcd(v) => {
                let keys =
                    etcd::shared(v).etcdctl_ok(&["get", "--prefix", &self.prefix, "--keys-only"]);
                keys.lines()
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned)
                    .collect()
            }
        }
    }

    /// Whether the lease is free: a `-n` run gets it and exits 0.
    #[track_caller]
    fn assert_lease_free(&self) {
        let out = self.lw().args(&["-n"]).cmd(&["true"]).output();
        assert_exit(&out, 0);
    }
}

/// Waits for each run's exit and returns the statuses, in order.
#[track_caller]
fn exits(runs: &mut [Running]) -> Vec<i32> {
    runs.iter_mut()
        .map(|r| r.wait_timeout(RUN_BOUND * 3).code().unwrap_or(-1))
        .collect()
}

fn five_hosts_40ms_apart_run_the_job_once_with_no_wait_and_with_wait(on: On) {
    for mode in [&["-n", "-E", "0"][..], &["-w", "30s"]] {
        let fleet = Fleet::new(on, "five");
        let mut runs: Vec<Running> = (0..5)
            .map(|i| {
                if i > 0 {
                    thread::sleep(Duration::from_millis(40));
                }
                let job = fleet.job("ran", 0);
                fleet
                    .lw()
                    .args(mode)
                    .args(&["--once-per", "1h"])
                    .cmd(&job)
                    .spawn()
            })
            .collect();
        let mut codes = exits(&mut runs);
        let stderr: Vec<String> = runs.iter().map(Running::stderr).collect();
        assert_eq!(
            fleet.runs().len(),
            1,
            "{mode:?}: runs {:?}\n{}",
            fleet.runs(),
            stderr.join("\n")
        );
        codes.sort();
        let want = if mode[0] == "-n" {
            [0; 5]
        } else {
            [0, 75, 75, 75, 75]
        };
        assert_eq!(codes, want, "{mode:?}\n{}", stderr.join("\n"));
    }
}

fn a_failed_run_is_retried_by_the_next_holder_and_then_skipped(on: On) {
    let fleet = Fleet::new(on, "retry");
    let once = ["--once", "nightly"];
    let first = fleet.lw().args(&once).cmd(&fleet.job("first", 3)).output();
    assert_exit(&first, 3);
    let failed = fleet
        .record("nightly")
        .expect("a failed run leaves a record");
    assert_eq!(
        (failed["outcome"].as_str(), failed["attempts"].as_u64()),
        (Some("failed"), Some(1))
    );
    assert_eq!(failed["exit_status"], 3);
    the_second_runs_and_later_ones_are_skipped(&fleet, &once);
    let runs = fleet.runs();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let done = fleet.record("nightly").unwrap();
    assert_eq!(
        (done["outcome"].as_str(), done["attempts"].as_u64()),
        (Some("ran-ok"), Some(2))
    );
    assert_eq!(
        runs[1],
        format!("second {}", done["token"]),
        "the record names the run that succeeded"
    );
    assert!(done["token"].as_u64() > failed["token"].as_u64());
    assert_status_shows_the_retried_run(&fleet, &done);
}

/// After a failed run of `once`, the next run runs (exit 0) and the ones after it are skipped
/// (75, "already ran"), silently under `-q -E 0`.
#[track_caller]
fn the_second_runs_and_later_ones_are_skipped(fleet: &Fleet, once: &[&str]) {
    let second = fleet
        .lw()
        .args(once)
        .cmd(&fleet.job("second $LEASEWRAP_FENCING_TOKEN", 0))
        .output();
    assert_exit(&second, 0);
    let third = fleet
        .lw()
        .args(once)
        .args(&["-v"])
        .cmd(&fleet.job("third", 0));
    let third = third.output();
    assert_exit(&third, 75);
    assert!(third.stderr.contains("already ran"), "{}", third.stderr);
    let quiet = fleet
        .lw()
        .args(once)
        .args(&["-q", "-E", "0"])
        .cmd(&fleet.job("fourth", 0))
        .output();
    assert_exit(&quiet, 0);
    assert_eq!(
        quiet.stderr, "",
        "a skip under -q -E 0 is silent, so cron mails nothing"
    );
}

/// `leasewrap status` (table, --json and --once) shows the "nightly" run of the "retry" fleet
/// as done in 2 attempts, with the token of record `done`.
#[track_caller]
fn assert_status_shows_the_retried_run(fleet: &Fleet, done: &Value) {
    let status = fleet.status(&[]);
    let row: Vec<&str> = status
        .stdout
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..5],
        [
            "retry",
            "nightly",
            "ran-ok",
            "2",
            &done["token"].to_string()
        ],
        "{}",
        status.stdout
    );
    let json: Value = serde_json::from_str(&fleet.status(&["--json"]).stdout).unwrap();
    assert_eq!(json["runs"][0]["attempts"], 2);
    let asked = fleet.status(&["--once", "nightly"]);
    assert_exit(&asked, 0);
    assert!(
        asked.stdout.starts_with("retry nightly: done"),
        "{}",
        asked.stdout
    );
    assert_exit(&fleet.status(&["--once", "other"]), 1);
}

fn after_the_holder_is_sigkilled_a_waiter_runs_key_and_the_dead_run_records_nothing(on: On) {
    let fleet = Fleet::new(on, "takeover");
    let once = ["--once", "k"];
    let holder = Job::hold(fleet.lw().args(&once), &fleet.sandbox, "holder");
    let job = fleet.job("waiter $LEASEWRAP_FENCING_TOKEN", 0);
    let mut waiter = fleet
        .lw()
        .args(&once)
        .args(&["-w", "30s"])
        .cmd(&job)
        .spawn();
    holder.run.kill(Signal::SIGKILL);
    waiter.wait_timeout(RUN_BOUND * 2);
    assert_exit(&waiter, 0);
    assert_eq!(fleet.runs().len(), 1, "{:?}", fleet.runs());
    let record = fleet.record("k").expect("the waiter's success is recorded");
    assert_eq!(record["outcome"], "ran-ok");
    assert_eq!(record["attempts"], 1, "the SIGKILLed run recorded nothing");
    assert_eq!(record["pid"], waiter.pid());
    assert_eq!(fleet.runs()[0], format!("waiter {}", record["token"]));
}

fn max_attempts_2_gives_up_after_two_failed_runs(on: On) {
    let fleet = Fleet::new(on, "attempts");
    let args = ["--once", "k", "--max-attempts", "2"];
    let codes: Vec<i32> = (0..4)
        .map(|_| fleet.lw().args(&args).cmd(&fleet.job("ran", 1)).output())
        .map(|out| out.status.code().unwrap_or(-1))
        .collect();
    assert_eq!(codes, [1, 1, 75, 75]);
    assert_eq!(fleet.runs().len(), 2);
    let last = fleet
        .lw()
        .args(&args)
        .args(&["-E", "0"])
        .cmd(&fleet.job("ran", 1))
        .output();
    assert_exit(&last, 0);
    assert!(
        last.stderr.contains("given up after 2 runs"),
        "{}",
        last.stderr
    );
    assert_eq!(fleet.record("k").unwrap()["attempts"], 2);
}

fn max_runtime_stops_a_tree_that_ignores_sigterm_and_forks_a_daemon(on: On) {
    let fleet = Fleet::new(on, "runtime");
    let lw = fleet.lw().args(&["--max-runtime", "1s", "--once", "k"]);
    let mut tree = start_tree(&fleet.sandbox, lw);
    let started = Instant::now();
    tree.leasewrap.wait_timeout(RUN_BOUND);
    assert_exit(&tree.leasewrap, 123);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "stopped before --max-runtime"
    );
    // The issue's bound: the tree is gone within kill-after + 1 s of --max-runtime.
    assert!(
        took < Duration::from_secs(1) + TREE_KILL_AFTER + Duration::from_secs(1),
        "took {took:?}"
    );
    // The tree is reaped before leasewrap exits: nothing may be left by now.
    tree.assert_gone_within(Duration::ZERO);
    let stderr = tree.leasewrap.stderr();
    assert!(stderr.contains("--max-runtime"), "{stderr}");
    assert_eq!(fleet.record("k").unwrap()["outcome"], "timed-out");
    fleet.assert_lease_free();
}

fn a_record_is_gone_after_keep_and_key_runs_again(on: On) {
    let fleet = Fleet::new(on, "keep");
    let args = ["--once", "k", "--keep", "2s"];
    assert_exit(
        &fleet.lw().args(&args).cmd(&fleet.job("first", 0)).output(),
        0,
    );
    assert_exit(
        &fleet
            .lw()
            .args(&args)
            .cmd(&fleet.job("skipped", 0))
            .output(),
        75,
    );
    if let On::Etcd(v) = fleet.on {
        let at = format!("{}/runs/keep/k", fleet.prefix);
        let json = etcd::shared(v).etcdctl_ok(&["get", "-w", "json", &at]);
        let kv: Value = serde_json::from_str(&json).unwrap();
        assert_ne!(
            kv["kvs"][0]["lease"], 0,
            "the record has a lease of its own: {json}"
        );
    }
    // Expiry is the scenario: wait for it, bounded, by asking status.
    wait_until(Duration::from_secs(10), "the record to expire", || {
        fleet.status(&["--once", "k"]).status.code() == Some(1)
    });
    assert_exit(
        &fleet.lw().args(&args).cmd(&fleet.job("again", 0)).output(),
        0,
    );
    assert_eq!(fleet.runs(), ["first", "again"]);
}

fn bad_once_input_exits_64_with_one_line_and_acquires_nothing(on: On) {
    let fleet = Fleet::new(on, "bad");
    let long = "k".repeat(129);
    let cases: &[&[&str]] = &[
        &["--once", ""],
        &["--once", "a/b"],
        &["--once", "bell\u{7}"],
        &["--once", &long],
        &["--once-per", "0"],
        &["--once-per", "-1h"],
        &["--once-per", "500ms"],
        &["--once", "k", "--once-per", "1h"],
        &["--once", "k", "--max-attempts", "0"],
        &["--max-attempts", "2"],
        &["--once", "k", "--keep", "0"],
        &["--max-runtime", "0"],
        &["--max-runtime", "1s", "--kill-after", "1s"],
        &["--metrics-file", "/nonexistent/dir/job.prom"],
        &["--metrics-file", "/tmp/"],
    ];
    for case in cases {
        let out = fleet.lw().args(case).cmd(&fleet.job("ran", 0)).output();
        assert_exit(&out, 64);
        assert_eq!(
            out.stderr.trim_end().lines().count(),
            1,
            "{case:?}: {}",
            out.stderr
        );
    }
    assert!(fleet.runs().is_empty());
    assert!(fleet.lease_state().is_empty(), "{:?}", fleet.lease_state());
}

fn keep_beyond_its_bound_or_shorter_than_the_slot_exits_64_naming_the_bound(on: On) {
    let fleet = Fleet::new(on, "bounds");
    let cases: [(&[&str], &str); 5] = [
        (
            &["--once", "k", "--keep", "9223372036854775807"],
            "10years at most",
        ),
        (&["--once", "k", "--keep", "300y"], "10years at most"),
        (
            &["--once-per", "1d", "--keep", "1s"],
            "shorter than the --once-per slot (1day)",
        ),
        (
            &["--once-per", "30d", "--keep", "7d"],
            "shorter than the --once-per slot (30days)",
        ),
        (&["--once-per", "11y"], "10years at most"),
    ];
    for (case, says) in cases {
        let out = fleet.lw().args(case).cmd(&fleet.job("ran", 0)).output();
        assert_exit(&out, 64);
        let lines: Vec<&str> = out.stderr.trim_end().lines().collect();
        assert_eq!(lines.len(), 1, "{case:?}: {}", out.stderr);
        assert!(lines[0].contains(says), "{case:?}: {}", out.stderr);
    }
    assert!(fleet.runs().is_empty());
    assert!(fleet.lease_state().is_empty(), "{:?}", fleet.lease_state());
    let at_the_bound = fleet.lw().args(&["--once", "k", "--keep", "10y"]);
    assert_exit(&at_the_bound.cmd(&fleet.job("ran", 0)).output(), 0);
}

/// Seconds the record of `key` is kept after its run's end, as it says.
#[track_caller]
fn kept_after_end(fleet: &Fleet, key: &str) -> f64 {
    let record = fleet.record(key).expect("the run left a record");
    record["keep_until"].as_f64().unwrap() - record["end"].as_f64().unwrap()
}

fn without_keep_a_once_per_slot_longer_than_a_week_is_kept_twice_the_slot(on: On) {
    let fleet = Fleet::new(on, "longslot");
    const DAY: f64 = 86_400.0;
    let out = fleet
        .lw()
        .args(&["--once-per", "30d", "-v"])
        .cmd(&fleet.job("ran", 0))
        .output();
    assert_exit(&out, 0);
    let key = slot_key_of(&fleet, "30d");
    let kept = kept_after_end(&fleet, &key);
    assert!((kept - 60.0 * DAY).abs() < 1.0, "kept {kept} s");
    assert_exit(
        &fleet.lw().args(&["--once", "k"]).cmd(&["true"]).output(),
        0,
    );
    let kept = kept_after_end(&fleet, "k");
    assert!(
        (kept - 7.0 * DAY).abs() < 1.0,
        "--once alone keeps 7 days: {kept} s"
    );
}

/// The KEY the one --once-per `per` run of `fleet` recorded (the only key under its name).
#[track_caller]
fn slot_key_of(fleet: &Fleet, per: &str) -> String {
    let json: Value = serde_json::from_str(&fleet.status(&["--json"]).stdout).unwrap();
    let key = json["runs"][0]["key"].as_str();
    key.unwrap_or_else(|| panic!("a --once-per {per} record in status: {json}"))
        .to_owned()
}

fn a_child_that_runs_longer_than_keep_records_its_success_kept_from_its_end(on: On) {
    let fleet = Fleet::new(on, "longrun");
    let args = ["--once", "k2", "--keep", "2s"];
    let script = format!("echo ran >> {}; sleep 2.5", q(&fleet.runs_file()));
    let first = fleet.lw().args(&args).cmd(&["sh", "-c", &script]).output();
    assert_exit(&first, 0);
    let second = fleet.lw().args(&args).cmd(&["sh", "-c", &script]).output();
    assert_exit(&second, 75);
    assert_eq!(fleet.runs(), ["ran"]);
    assert_eq!(fleet.record("k2").unwrap()["outcome"], "ran-ok");
    assert!((kept_after_end(&fleet, "k2") - 2.0).abs() < 0.01);
    if let On::Etcd(v) = on {
        a_lease_granted_at_the_childs_start_is_renewed_as_the_record_is_written(&fleet, v);
    }
}

/// A child of 2.5 s with --keep 4s: the record's lease, granted as the child started, has 4 s
/// left again when the record is written, not the 1.5 s its grant would have left.
#[track_caller]
fn a_lease_granted_at_the_childs_start_is_renewed_as_the_record_is_written(
    fleet: &Fleet,
    v: Version,
) {
    let args = ["--once", "k3", "--keep", "4s"];
    assert_exit(&fleet.lw().args(&args).cmd(&["sleep", "2.5"]).output(), 0);
    let at = format!("{}/runs/{}/k3", fleet.prefix, fleet.name);
    let kv: Value =
        serde_json::from_str(&etcd::shared(v).etcdctl_ok(&["get", "-w", "json", &at])).unwrap();
    let lease = format!(
        "{:x}",
        kv["kvs"][0]["lease"]
            .as_i64()
            .expect("the record has a lease")
    );
    let ttl: Value = serde_json::from_str(&etcd::shared(v).etcdctl_ok(&[
        "lease",
        "timetolive",
        "-w",
        "json",
        &lease,
    ]))
    .unwrap();
    assert!(
        ttl["ttl"].as_i64().unwrap() >= 2,
        "the record's lease was not renewed at its write: {ttl}"
    );
}

#[test]
fn a_metrics_file_in_a_folder_the_user_cannot_write_exits_64_and_runs_nothing() {
    let other = crate::support::user::other();
    let sb = Sandbox::new();
    let theirs = sb.path("theirs");
    fs::create_dir(&theirs).unwrap();
    other.owns(&theirs);
    // The sandbox itself is root's (0755): the second user may enter it, not write in it.
    crate::support::user::chmod(&sb.path(""), 0o755);
    let prom = sb.path("job.prom");
    let ran = theirs.join("ran");
    let out = Leasewrap::new()
        .run_as(other)
        .local_dir(&theirs)
        .name("job")
        .args(&["--metrics-file", prom.to_str().unwrap()])
        .cmd(&["touch", ran.to_str().unwrap()])
        .output();
    assert_exit(&out, 64);
    assert_eq!(out.stderr.trim_end().lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("cannot write in"), "{}", out.stderr);
    assert!(!ran.exists());
    assert!(!theirs.join("job.lock").exists(), "nothing was acquired");
}

fn a_foreign_record_exits_78_and_runs_nothing(on: On) {
    let fleet = Fleet::new(on, "foreign");
    fleet.plant_record("k", "done\n");
    let out = fleet
        .lw()
        .args(&["--once", "k"])
        .cmd(&fleet.job("ran", 0))
        .output();
    assert_exit(&out, 78);
    assert!(
        out.stderr.contains("not a leasewrap run record"),
        "{}",
        out.stderr
    );
    assert!(fleet.runs().is_empty());
    fleet.assert_lease_free();
}

// ---------------------------------------------------------------------------------------------
// etcd only: a stale holder cannot record a success.
// ---------------------------------------------------------------------------------------------

#[test]
fn a_paused_holders_late_success_is_refused_and_the_new_holders_record_stands_on_etcd_3_4() {
    late_success_of_a_paused_holder(Version::V3_4);
}

#[test]
fn a_paused_holders_late_success_is_refused_and_the_new_holders_record_stands_on_etcd_3_5() {
    late_success_of_a_paused_holder(Version::V3_5);
}

/// Holder A's child stops A's leasewrap (SIGSTOP) and exits 0, so A holds a success it has not
/// recorded while its lease runs out; B takes over, runs KEY and records it. When A resumes, its
/// success must not be recorded: it exits 124 and B's record stands.
fn late_success_of_a_paused_holder(v: Version) {
    let fleet = Fleet::new(On::Etcd(v), "stale");
    let once = ["--once", "k"];
    // The child's parent is the watchdog, whose parent is leasewrap (field 4 of /proc/PID/stat).
    let stop_leasewrap = "kill -STOP $(cut -d' ' -f4 /proc/$PPID/stat)";
    let script = format!(
        "echo a >> {}; {stop_leasewrap}; exit 0",
        q(&fleet.runs_file())
    );
    let mut a = fleet.lw().args(&once).cmd(&["sh", "-c", &script]).spawn();
    wait_until(STARTUP, "holder A stopped by its child", || {
        is_stopped(a.pid())
    });
    let job = fleet.job("b $LEASEWRAP_FENCING_TOKEN", 0);
    let mut b = fleet
        .lw()
        .args(&once)
        .args(&["-w", "30s"])
        .cmd(&job)
        .spawn();
    b.wait_timeout(RUN_BOUND);
    assert_exit(&b, 0);
    a.kill(Signal::SIGCONT);
    a.wait_timeout(RUN_BOUND);
    assert_exit(&a, 124);
    let why = a.stderr();
    assert!(
        why.contains("not recorded") || why.contains("lease lost"),
        "{why}"
    );
    let record = fleet.record("k").unwrap();
    assert_eq!(record["outcome"], "ran-ok");
    assert_eq!(record["pid"], b.pid(), "B's record stands");
    assert_eq!(
        fleet.runs(),
        ["a".to_owned(), format!("b {}", record["token"])]
    );
}

// ---------------------------------------------------------------------------------------------
// The local backend: a write sweeps a name's records once per eighth of its keep, not every time.
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// etcd only: a holder of another lock cannot write a record, or into a lock's queue.
// ---------------------------------------------------------------------------------------------

#[test]
fn the_holder_of_another_lock_cannot_mark_a_job_done_through_fenced_put_on_etcd_3_4() {
    fenced_put_cannot_forge_a_record(Version::V3_4);
}

#[test]
fn the_holder_of_another_lock_cannot_mark_a_job_done_through_fenced_put_on_etcd_3_5() {
    fenced_put_cannot_forge_a_record(Version::V3_5);
}

/// A child of lock `other` tries `fenced-put` of a forged success of `victim`'s KEY, and of a
/// key in `victim`'s lock queue: both are refused (64), and `victim` then runs KEY.
fn fenced_put_cannot_forge_a_record(v: Version) {
    let fleet = Fleet::new(On::Etcd(v), "victim");
    let forged = r#"{"format":"leasewrap-run/1","name":"victim","key":"k","outcome":"ran-ok","attempts":1,"host":"h","pid":1,"token":1,"start":0,"end":0,"exit_status":0,"signal":null,"keep_until":4e9}"#;
    let (codes, bin) = (fleet.sandbox.path("codes"), crate::support::BIN);
    let script = format!(
        "{bin} fenced-put \"$LEASEWRAP_PREFIX/runs/victim/k\" '{forged}'; echo $? >> {codes}; \
         {bin} fenced-put \"${{LEASEWRAP_PREFIX}}victim/x\" v; echo $? >> {codes}",
        codes = q(&codes)
    );
    let attacker = Leasewrap::new()
        .on_etcd(&etcd::shared(v).endpoint(), &fleet.prefix)
        .name("other")
        .cmd(&["sh", "-c", &script]);
    let out = attacker.output();
    assert_exit(&out, 0);
    assert_eq!(
        fs::read_to_string(&codes).unwrap(),
        "64\n64\n",
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("run records"), "{}", out.stderr);
    assert_eq!(fleet.record("k"), None);
    let victim = fleet
        .lw()
        .args(&["--once", "k", "-n"])
        .cmd(&fleet.job("ran", 0))
        .output();
    assert_exit(&victim, 0);
    assert_eq!(fleet.runs(), ["ran"]);
    assert_eq!(fleet.record("k").unwrap()["outcome"], "ran-ok");
}

// ---------------------------------------------------------------------------------------------
// etcd only: status reads the newest records of a name, not all of them.
// ---------------------------------------------------------------------------------------------

#[test]
fn status_reads_only_the_newest_runs_of_a_name_with_5_mb_of_records_on_etcd_3_5() {
    let fleet = Fleet::new(On::Etcd(Version::V3_5), "many");
    // 50 records of 100 kB (one argument's most): more than a client takes in one answer (4 MB).
    let host = "h".repeat(100_000);
    for i in 0..50 {
        let key = format!("k{i:02}");
        let record = serde_json::json!({
            "format": "leasewrap-run/1", "name": "many", "key": key, "outcome": "ran-ok",
            "attempts": 1, "host": host, "pid": 1, "token": i + 1, "start": 1.8e9 + f64::from(i),
            "end": 1.8e9 + f64::from(i), "exit_status": 0, "signal": null, "keep_until": 4e9,
        });
        fleet.plant_record(&key, &record.to_string());
    }
    let status = fleet.status(&["--json"]);
    let json: Value = serde_json::from_str(&status.stdout).unwrap_or_else(|_| {
        let stderr: String = status.stderr.chars().take(2000).collect();
        panic!("status --json printed no JSON: {stderr}")
    });
    let keys: Vec<&str> = json["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    let newest: Vec<String> = (40..50).rev().map(|i| format!("k{i}")).collect();
    assert_eq!(keys, newest);
    // Listing every lease reads the lock queues, not the records between them.
    let holder = Job::hold(fleet.lw(), &fleet.sandbox, "holder");
    let every = Leasewrap::subcommand("status")
        .on_etcd(&etcd::shared(Version::V3_5).endpoint(), &fleet.prefix)
        .args(&["--json"])
        .output();
    let names: Vec<Value> = serde_json::from_str(&every.stdout).unwrap_or_default();
    assert_eq!(
        names.len(),
        1,
        "{}",
        every.stderr.chars().take(2000).collect::<String>()
    );
    assert_eq!(
        (names[0]["name"].as_str(), names[0]["held"].as_bool()),
        (Some("many"), Some(true))
    );
    drop(holder);
}

// ---------------------------------------------------------------------------------------------
// etcd only: what --once costs in requests.
// ---------------------------------------------------------------------------------------------

#[test]
fn once_reads_its_record_in_the_lock_transaction_with_no_request_of_its_own_on_etcd_3_4() {
    once_costs_no_read_of_its_own(Version::V3_4);
}

#[test]
fn once_reads_its_record_in_the_lock_transaction_with_no_request_of_its_own_on_etcd_3_5() {
    once_costs_no_read_of_its_own(Version::V3_5);
}

/// The requests one run of `lw` made to `server` (its own etcd: no other test's requests),
/// by method (`started[Range]`, ...).
fn requests_of(server: &etcd::Etcd, lw: Leasewrap, code: i32) -> BTreeMap<String, f64> {
    let scrape = || crate::bench_prom::Scrape::parse(&server.metrics());
    let before = scrape();
    assert_exit(&lw.output(), code);
    let mut delta = scrape().counters_since(&before);
    delta.retain(|k, _| k.starts_with("started["));
    delta
}

/// A first --once run, and one that finds KEY done, make no Range request: the record is read
/// in the lock transaction. The first one's record write is a Txn, a LeaseGrant and the renewal
/// of that lease; the skip makes the plain run's requests and nothing more (the watch of the
/// own key aside, which may or may not start before a skip releases the lease).
fn once_costs_no_read_of_its_own(v: Version) {
    let server = etcd::Etcd::start(v);
    let prefix = etcd::unique_prefix("cost");
    let lw = || {
        Leasewrap::new()
            .on_etcd(&server.endpoint(), &prefix)
            .name("cost")
    };
    let plain = requests_of(&server, lw().cmd(&["true"]), 0);
    let first = requests_of(&server, lw().args(&["--once", "k"]).cmd(&["true"]), 0);
    let skip = requests_of(&server, lw().args(&["--once", "k"]).cmd(&["true"]), 75);
    for run in [&plain, &first, &skip] {
        assert_eq!(run.get("started[Range]"), None, "{run:?}");
    }
    let more =
        |m: &str| first.get(m).copied().unwrap_or(0.0) - plain.get(m).copied().unwrap_or(0.0);
    assert_eq!(
        (
            more("started[Txn]"),
            more("started[LeaseGrant]"),
            more("started[LeaseKeepAlive]")
        ),
        (1.0, 1.0, 1.0),
        "plain {plain:?}, --once {first:?}"
    );
    let mut skip = skip;
    let mut plain = plain;
    // The watch on the own key starts as the lease is ours, racing a skip's release.
    for run in [&mut skip, &mut plain] {
        run.remove("started[Watch]");
    }
    assert_eq!(skip, plain, "a skip costs what a plain run does");
}

// ---------------------------------------------------------------------------------------------
// --once-per under libfaketime: hosts whose clocks differ.
// ---------------------------------------------------------------------------------------------

/// The multi-threaded libfaketime (Debian package faketime).
const LIBFAKETIME_MT: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// A leasewrap of `fleet` whose wall clock starts at `at` (UTC) when it execs; its monotonic
/// clocks, and so its deadlines, stay real.
fn at_wall_clock(fleet: &Fleet, at: &str) -> Leasewrap {
    faked_wall_clock(fleet.lw(), &format!("@{at}"))
}

/// `lw` with its wall clock faked as libfaketime's FAKETIME `spec` says (`@2026-12-01
/// 02:00:00`, `+30d`); its monotonic clocks stay real.
fn faked_wall_clock(lw: Leasewrap, spec: &str) -> Leasewrap {
    assert!(
        std::path::Path::new(LIBFAKETIME_MT).is_file(),
        "{LIBFAKETIME_MT} is needed (Debian package faketime; scripts/test.sh installs it)"
    );
    lw.env("LD_PRELOAD", LIBFAKETIME_MT)
        .env("FAKETIME", spec)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("TZ", "UTC")
}

on_every_backend!(
    hosts_a_quarter_period_apart_share_the_once_per_key_and_sixty_percent_apart_do_not
);

fn hosts_a_quarter_period_apart_share_the_once_per_key_and_sixty_percent_apart_do_not(on: On) {
    let fleet = Fleet::new(on, "slots");
    // 02:00 is the boundary: 15 min either side is DUR/4, 36 min is 0.6 x DUR.
    for (at, code) in [
        ("2026-12-01 01:45:00", 0),
        ("2026-12-01 02:15:00", 75),
        ("2026-12-01 02:00:00", 75),
        ("2026-12-01 01:24:00", 0),
        ("2026-12-01 02:36:00", 0),
    ] {
        let lw = at_wall_clock(&fleet, at).args(&["--once-per", "1h"]);
        let out = lw.cmd(&fleet.job(at, 0)).output();
        assert_exit(&out, code);
    }
    assert_eq!(
        fleet.runs(),
        [
            "2026-12-01 01:45:00",
            "2026-12-01 01:24:00",
            "2026-12-01 02:36:00"
        ]
    );
    for key in [
        "2026-12-01T01:00:00Z",
        "2026-12-01T02:00:00Z",
        "2026-12-01T03:00:00Z",
    ] {
        assert_eq!(fleet.record(key).expect(key)["outcome"], "ran-ok", "{key}");
    }
}

/// A run by hand at 19:39 UTC of a job with --once-per 1d, as in issue 21: it takes the slot of
/// the next midnight, 4h21m ahead.
const BY_HAND: &str = "2026-12-01 19:39:00";

#[test]
fn a_run_by_hand_ahead_of_its_once_per_slot_warns_that_it_uses_the_slot_up() {
    let fleet = Fleet::new(On::Local, "nightly");
    let warning = "this run counts for slot 2026-12-02T00:00:00Z, which starts in 4h21m; a run by hand now uses up that slot (pass --once KEY to choose another)";
    // The scheduled run that night finds the slot done, and after its boundary is not warned;
    // nor is one near its boundary (DUR/20 is 72 minutes).
    for (run, at, code, warned) in [
        ("by hand", BY_HAND, 0, true),
        ("scheduled", "2026-12-02 02:30:00", 75, false),
        ("early", "2026-12-02 23:00:00", 0, false),
    ] {
        let lw = at_wall_clock(&fleet, at).args(&["--once-per", "1d"]);
        let out = lw.cmd(&fleet.job(run, 0)).output();
        assert_exit(&out, code);
        let said = out.stderr.contains("this run counts for slot");
        assert_eq!(said, warned, "{run}:\n{}", out.stderr);
        assert!(!warned || out.stderr.contains(warning), "{}", out.stderr);
    }
    assert_eq!(fleet.runs(), ["by hand", "early"]);
}

#[test]
fn status_once_per_tells_which_key_a_run_now_would_use_and_whether_it_is_done() {
    let fleet = Fleet::new(On::Local, "nightly");
    let status = || {
        let lw = Leasewrap::subcommand("status").local_dir(fleet.sandbox.state());
        faked_wall_clock(lw, &format!("@{BY_HAND}")).args(&["--once-per", "1d", fleet.name])
    };
    let before = status().output();
    assert_exit(&before, 1);
    assert_eq!(before.stdout, "nightly 2026-12-02T00:00:00Z: not run yet\n");
    let by_hand = at_wall_clock(&fleet, BY_HAND).args(&["--once-per", "1d"]);
    assert_exit(&by_hand.cmd(&fleet.job("by hand", 0)).output(), 0);
    let after = status().output();
    assert_exit(&after, 0);
    assert!(
        after
            .stdout
            .starts_with("nightly 2026-12-02T00:00:00Z: done (host "),
        "{}",
        after.stdout
    );
    let json = status().args(&["--json"]).output();
    assert_exit(&json, 0);
    let json: Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(
        (&json["key"], &json["done"]),
        (&"2026-12-02T00:00:00Z".into(), &true.into())
    );
}

// ---------------------------------------------------------------------------------------------
// --metrics-file, read with Prometheus's own parser.
// ---------------------------------------------------------------------------------------------

/// The families of a metrics file as Prometheus's Python parser reads them.
#[track_caller]
fn parse_metrics(text: &str) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/parse-metrics.py");
    let mut command = Command::new("python3");
    command.arg(script);
    let out = run_bounded_with_stdin(command, text);
    assert!(
        out.status.success(),
        "the parser refused the file ({}; prometheus_client is needed, scripts/test.sh installs it):\n{text}",
        out.stderr
    );
    serde_json::from_str(&out.stdout).unwrap()
}

/// `command` fed `input` on stdin, run to its end.
fn run_bounded_with_stdin(mut command: Command, input: &str) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 is needed to parse the metrics file");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Output {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: started.elapsed(),
    }
}

/// The outcome the metrics file reports: the one `leasewrap_outcome` series at 1.
#[track_caller]
fn reported_outcome(path: &std::path::Path) -> String {
    let families = parse_metrics(&fs::read_to_string(path).expect("the metrics file exists"));
    let outcome = families
        .iter()
        .find(|f| f["name"] == "leasewrap_outcome")
        .expect("leasewrap_outcome");
    let set: Vec<&Value> = outcome["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["value"] == 1.0)
        .collect();
    assert_eq!(set.len(), 1, "exactly one outcome is set: {outcome}");
    assert!(families
        .iter()
        .all(|f| f["type"] == "gauge" && f["help"] != ""));
    set[0]["labels"]["outcome"].as_str().unwrap().to_owned()
}

#[test]
fn the_metrics_file_parses_and_names_the_outcome_after_each_kind_of_run_or_skip() {
    let fleet = Fleet::new(On::Local, "metrics");
    let prom = fleet.sandbox.path("job.prom");
    let m = ["--metrics-file", prom.to_str().unwrap()];
    let run = |args: &[&str], job: &[&str]| fleet.lw().args(&m).args(args).cmd(job).output();
    let steps: [(&[&str], &[&str], i32, &str); 5] = [
        (&["--once", "a"], &["true"], 0, "ran-ok"),
        (&["--once", "a"], &["true"], 75, "skipped-done"),
        (
            &["--once", "b", "--max-attempts", "1"],
            &["false"],
            1,
            "failed",
        ),
        (
            &["--once", "b", "--max-attempts", "1"],
            &["false"],
            75,
            "gave-up",
        ),
        (
            &["--max-runtime", "1s", "--kill-after", "100ms"],
            &["sleep", "10"],
            123,
            "timed-out",
        ),
    ];
    for (args, job, code, outcome) in steps {
        assert_exit(&run(args, job), code);
        assert_eq!(reported_outcome(&prom), outcome, "{args:?}");
    }
    let holder = Job::hold(fleet.lw().args(&m), &fleet.sandbox, "holder");
    assert_exit(&run(&["-n"], &["true"]), 75);
    assert_eq!(reported_outcome(&prom), "skipped-busy");
    fs::remove_file(fleet.sandbox.lock_file(fleet.name)).unwrap();
    let mut holder = holder;
    holder.wait(RUN_BOUND);
    assert_exit(&holder.run, 124);
    assert_eq!(reported_outcome(&prom), "lost");
}

#[test]
fn a_reader_of_the_metrics_file_never_sees_half_a_file() {
    let fleet = Fleet::new(On::Local, "reader");
    let prom = fleet.sandbox.path("job.prom");
    let m = ["--metrics-file", prom.to_str().unwrap()];
    assert_exit(&fleet.lw().args(&m).cmd(&["true"]).output(), 0);
    let writers = {
        let lw: Vec<Leasewrap> = (0..20)
            .map(|_| fleet.lw().args(&m).cmd(&["true"]))
            .collect();
        thread::spawn(move || lw.into_iter().for_each(|l| assert_exit(&l.output(), 0)))
    };
    let mut seen = std::collections::BTreeSet::new();
    while !writers.is_finished() {
        seen.insert(fs::read_to_string(&prom).expect("the file is always there"));
    }
    writers.join().unwrap();
    assert!(seen.len() > 1, "the reader saw the file change");
    for text in &seen {
        parse_metrics(text);
        assert!(
            text.ends_with('\n') && text.contains("leasewrap_last_fencing_token"),
            "{text}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Damaged records, KEYs, the local sweep and status (issue 18 section 1, issue 21 item 15).
// ---------------------------------------------------------------------------------------------

/// A run record of the fleet's name as leasewrap writes one (a success kept for a day), with
/// `end` written as the JSON number `end`.
fn record_ending(fleet: &Fleet, key: &str, end: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    format!(
        r#"{{"format":"leasewrap-run/1","name":"{}","key":"{key}","outcome":"ran-ok","attempts":1,"host":"h","pid":7,"token":3,"start":{now},"end":{end},"exit_status":0,"signal":null,"keep_until":{}}}"#,
        fleet.name,
        now + 86400
    )
}

fn a_record_with_a_time_out_of_range_exits_78_releases_the_lease_and_shows_in_status(on: On) {
    let fleet = Fleet::new(on, "times");
    for (i, end) in ["3e11", "1e20", "-1", "1e400"].iter().enumerate() {
        let key = format!("k{i}");
        fleet.plant_record(&key, &record_ending(&fleet, &key, end));
        let out = fleet
            .lw()
            .args(&["--once", &key])
            .cmd(&fleet.job("ran", 0))
            .output();
        assert_exit(&out, 78);
        assert!(out.stderr.contains("run record"), "{end}: {}", out.stderr);
        // Released at once, not left to its TTL: a -n run gets it now.
        fleet.assert_lease_free();
        let listed = fleet.status(&[]);
        assert_exit(&listed, 78);
        let row = listed
            .stdout
            .lines()
            .find(|l| l.contains("unreadable") && l.contains(&key))
            .unwrap_or_else(|| panic!("{end}: no row for {key}:\n{}", listed.stdout));
        assert!(row.contains("run record"), "{row}");
        assert_exit(&fleet.status(&["--once", &key]), 78);
    }
    assert!(fleet.runs().is_empty(), "{:?}", fleet.runs());
}

/// An outcome that is an escape sequence (the window title, a screen clear) comes back in the
/// parser's "unknown variant" message: every line leasewrap prints shows it escaped, from a run
/// and from `status --once`, as text and as JSON.
fn a_damaged_records_text_reaches_no_terminal_raw_in_any_log_format(on: On) {
    let fleet = Fleet::new(on, "escapes");
    let record = record_ending(&fleet, "k", "1700000000").replace(
        r#""outcome":"ran-ok""#,
        r#""outcome":"\u001b]0;PWNED\u0007\u001b[2J\u202e""#,
    );
    fleet.plant_record("k", &record);
    let raw = |text: &str| text.contains(['\u{1b}', '\u{7}', '\u{202e}']);
    for format in ["text", "json"] {
        let out = fleet
            .lw()
            .args(&["--log-format", format, "--once", "k"])
            .cmd(&fleet.job("ran", 0))
            .output();
        assert_exit(&out, 78);
        assert!(out.stderr.contains("PWNED"), "{format}: {:?}", out.stderr);
        assert!(
            !raw(&out.stderr),
            "{format}: a raw control: {:?}",
            out.stderr
        );
        let status = fleet.status(&["--log-format", format, "--once", "k"]);
        assert_exit(&status, 78);
        let printed = status.stdout + &status.stderr;
        assert!(!raw(&printed), "{format}: status --once: {printed:?}");
    }
    assert!(fleet.runs().is_empty(), "{:?}", fleet.runs());
}

fn status_lists_the_runs_of_names_nobody_holds_with_every_time_in_unix_seconds(on: On) {
    let fleet = Fleet::new(on, "listed");
    assert_exit(
        &fleet.lw().args(&["--once", "k"]).cmd(&["true"]).output(),
        0,
    );
    let all: Value = serde_json::from_str(&fleet.status_all(&["--json"]).stdout).unwrap();
    let lease = all
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == fleet.name)
        .unwrap_or_else(|| panic!("{} is not listed: {all}", fleet.name));
    assert_eq!(lease["runs"][0]["key"], "k", "{lease}");
    let text = fleet.status_all(&[]).stdout;
    assert!(
        text.lines()
            .any(|l| l.starts_with("listed") && l.contains("ran-ok")),
        "{text}"
    );
    let holder = Job::hold(fleet.lw(), &fleet.sandbox, "holder");
    let held: Value = serde_json::from_str(&fleet.status(&["--json"]).stdout).unwrap();
    for time in [&held["holder"]["start"], &held["runs"][0]["start"]] {
        assert!(time.is_f64(), "times are Unix seconds as a float: {held}");
    }
    holder.finish();
}

#[test]
fn a_key_with_invisible_or_bidi_characters_is_refused_with_64_and_rfc3339_keys_are_not() {
    let fleet = Fleet::new(On::Local, "keys");
    for key in [
        "k\u{200b}",
        "k\u{202e}x",
        "\u{3164}",
        "k\u{feff}",
        "k\u{2066}",
        "jöb",
    ] {
        let out = fleet.lw().args(&["--once", key]).cmd(&["true"]).output();
        assert_exit(&out, 64);
        assert_eq!(
            out.stderr.trim_end().lines().count(),
            1,
            "{key:?}: {}",
            out.stderr
        );
        assert_exit(&fleet.status(&["--once", key]), 64);
    }
    assert!(fleet.lease_state().is_empty(), "{:?}", fleet.lease_state());
    for key in [
        "2026-12-01T02:00:00Z",
        "2026-12-01T02:00:00.500Z",
        "nightly.v2@eu:1+x=y_2",
    ] {
        let out = fleet.lw().args(&["--once", key]).cmd(&["true"]).output();
        assert_exit(&out, 0);
    }
}

/// The record files of the fleet's name in the local directory `state`.
fn record_files(state: &std::path::Path, name: &str) -> Vec<String> {
    let mut files: Vec<String> = fs::read_dir(state.join("runs").join(name))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    files
}

#[test]
fn records_copied_with_new_mtimes_are_still_done_after_the_next_write() {
    let fleet = Fleet::new(On::Local, "copied");
    for key in ["a", "b", "c"] {
        assert_exit(
            &fleet.lw().args(&["--once", key]).cmd(&["true"]).output(),
            0,
        );
    }
    // cp -r gives every copy the time of the copy as its mtime.
    let copy = fleet.sandbox.path("copy");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(fleet.sandbox.state())
        .arg(&copy)
        .status();
    assert!(copied.unwrap().success());
    let lw = || Leasewrap::new().local_dir(&copy).name(fleet.name);
    assert_exit(&lw().args(&["--once", "d"]).cmd(&["true"]).output(), 0);
    assert_eq!(
        record_files(&copy, fleet.name),
        ["a.json", "b.json", "c.json", "d.json"]
    );
    let again = lw().args(&["--once", "b"]).cmd(&fleet.job("b again", 0));
    assert_exit(&again.output(), 75);
    assert!(fleet.runs().is_empty());
}

#[test]
fn a_run_with_the_clock_30_days_ahead_deletes_no_record_that_is_still_kept() {
    let fleet = Fleet::new(On::Local, "ahead");
    for key in ["a", "b"] {
        assert_exit(
            &fleet.lw().args(&["--once", key]).cmd(&["true"]).output(),
            0,
        );
    }
    let ahead = faked_wall_clock(fleet.lw(), "+30d").args(&["--once", "d"]);
    assert_exit(&ahead.cmd(&["true"]).output(), 0);
    let state = fleet.sandbox.state();
    assert_eq!(
        record_files(&state, fleet.name),
        ["a.json", "b.json", "d.json"]
    );
    // Back on the real clock, the night that ran is still done.
    let again = fleet
        .lw()
        .args(&["--once", "a"])
        .cmd(&fleet.job("a again", 0));
    assert_exit(&again.output(), 75);
    assert!(fleet.runs().is_empty());
}
