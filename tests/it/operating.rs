//! Black-box tests of what an operator sees: `leasewrap status` on every backend (etcd 3.4 and
//! 3.5, ZooKeeper 3.8 under a chroot of the test's own), the sd_notify messages systemd receives, and log lines: quiet on success, JSON, the
//! journal's entries, and errors that end a run.
//!
//! Holders are real leasewrap runs whose child waits for a release file; every wait polls an
//! observable event with a bound.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::Command;

use crate::support::etcd::{self, Version};
use crate::support::zookeeper;
use crate::support::*;
use serde_json::Value;

/// Where `status` looks: a local directory, or etcd endpoints and a prefix.
#[derive(Clone)]
enum Store {
    Local(PathBuf),
    Etcd {
        endpoint: String,
        prefix: String,
    },
    /// The shared ZooKeeper server, under a chroot no other test uses.
    Zk(String),
}

impl Store {
    fn etcd(version: Version, test: &str) -> Store {
        Store::Etcd {
            endpoint: etcd::shared(version).endpoint(),
            prefix: etcd::unique_prefix(test),
        }
    }

    fn zk(test: &str) -> Store {
        let server = zookeeper::shared();
        Store::Zk(format!(
            "{}/{}",
            server.connect(),
            zookeeper::unique_name(test)
        ))
    }

    /// A leasewrap run of `name` on this store.
    fn leasewrap(&self, name: &str) -> Leasewrap {
        self.point(Leasewrap::new().name(name))
    }

    /// Points `lw` (a run or a subcommand) at this store.
    fn point(&self, lw: Leasewrap) -> Leasewrap {
        match self {
            Store::Local(dir) => lw.local_dir(dir),
            Store::Etcd { endpoint, prefix } => lw.on_etcd(endpoint, prefix),
            Store::Zk(connect) => lw.on_zookeeper(connect),
        }
    }

    /// `leasewrap status EXTRA...`, bounded by `RUN_BOUND`; returns (exit code, stdout, stderr).
    #[track_caller]
    fn status(&self, extra: &[&str]) -> (i32, String, String) {
        let out = self
            .point(Leasewrap::subcommand("status"))
            .args(extra)
            .output();
        (out.status.code().unwrap_or(-1), out.stdout, out.stderr)
    }

    /// `status --json EXTRA...`, parsed, asserting the exit code.
    #[track_caller]
    fn status_json(&self, extra: &[&str], code: i32) -> Value {
        let args: Vec<&str> = std::iter::once("--json")
            .chain(extra.iter().copied())
            .collect();
        let (got, stdout, stderr) = self.status(&args);
        assert_eq!(got, code, "status {extra:?}: {stdout}{stderr}");
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("status --json printed no JSON ({e}): {stdout}{stderr}"))
    }
}

/// A leasewrap holding `name` (TTL 6 s) while its child waits for `finish()`.
#[track_caller]
fn hold(sb: &Sandbox, store: &Store, name: &str) -> Job {
    Job::hold(store.leasewrap(name).args(&["--ttl", "6s"]), sb, name)
}

/// A leasewrap queued behind a holder of `name`; it runs `true` once its turn comes.
fn queue(store: &Store, name: &str) -> Running {
    store.leasewrap(name).cmd(&["true"]).spawn()
}

/// Polls `status --json NAME` until it shows `waiters` waiters; returns that object.
#[track_caller]
fn status_with_waiters(store: &Store, name: &str, waiters: u64) -> Value {
    let mut last = Value::Null;
    wait_until(STARTUP, &format!("{waiters} waiter(s) on {name}"), || {
        last = store.status_json(&[name], 0);
        last["waiters"] == waiters
    });
    last
}

/// Status of a held lease with one waiter, in JSON, text, and in the listing; then free.
fn status_shows_holder_token_and_waiters(store: &Store, sb: &Sandbox) {
    let name = "nightly-report";
    let holder = hold(sb, store, name);
    let mut waiter = queue(store, name);
    let lease = status_with_waiters(store, name, 1);
    let host = nix::unistd::gethostname().unwrap();
    let host = host.to_str().unwrap();
    assert_json_shows_the_holder(store, &lease, &holder, host);
    assert_text_shows_the_holder(store, name, &holder, host);

    let all = store.status_json(&[], 0);
    let listed: Vec<&Value> = all.as_array().expect("an array").iter().collect();
    assert_eq!(listed.len(), 1, "{all}");
    assert_eq!(listed[0]["token"], holder.token());

    holder.finish();
    waiter.wait_timeout(STARTUP);
    assert_exit(&waiter, 0);
    let free = store.status_json(&[name], 1);
    assert_eq!(free["held"], false, "{free}");
    assert_eq!(free["token"], Value::Null, "{free}");
    assert_eq!(free["waiters"], 0, "{free}");
    let (code, text, _) = store.status(&[name]);
    assert_eq!(code, 1);
    assert!(text
        .lines()
        .nth(1)
        .unwrap()
        .starts_with("nightly-report  free"));
}

/// `status --json NAME` of the held lease: name, token and holder, and what each backend adds.
#[track_caller]
fn assert_json_shows_the_holder(store: &Store, lease: &Value, holder: &Job, host: &str) {
    assert_eq!(lease["name"], "nightly-report");
    assert_eq!(lease["held"], true);
    assert_eq!(lease["token"], holder.token(), "{lease}");
    assert_eq!(lease["holder"]["pid"], holder.run.pid(), "{lease}");
    // The record keeps the program, not its arguments (they may hold a secret).
    let argv = holder.command();
    assert_eq!(lease["holder"]["command"], serde_json::json!([argv[0]]));
    assert_eq!(lease["holder"]["args"], argv.len() - 1, "{lease}");
    assert_eq!(lease["holder"]["host"], host);
    match store {
        Store::Local(dir) => {
            assert_eq!(lease["backend"], "local");
            assert_eq!(lease["time_left_s"], Value::Null, "{lease}");
            assert_eq!(
                lease["key"],
                dir.join("nightly-report.lock").to_str().unwrap()
            );
        }
        Store::Zk(_) => {
            assert_eq!(lease["backend"], "zookeeper");
            assert_eq!(lease["time_left_s"], Value::Null, "{lease}");
            let key = lease["key"].as_str().expect("the lock node");
            assert!(key.starts_with("/leasewrap/nightly-report/_c_"), "{lease}");
        }
        Store::Etcd { .. } => {
            assert_eq!(lease["backend"], "etcd");
            let left = lease["time_left_s"].as_i64().expect("time left");
            assert!((1..=6).contains(&left), "time left {left}: {lease}");
            assert_eq!(lease["ttl_s"], 6, "{lease}");
        }
    }
}

/// `status NAME` as text: the header and one row naming the holder, the command column last.
#[track_caller]
fn assert_text_shows_the_holder(store: &Store, name: &str, holder: &Job, host: &str) {
    let (code, text, stderr) = store.status(&[name]);
    assert_eq!(code, 0, "{text}{stderr}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "header and one lease: {text}");
    let header = ["NAME", "STATE", "TOKEN", "TIME", "LEFT", "WAITERS", "HOST"];
    assert!(lines[0].split_whitespace().take(7).eq(header), "{text}");
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    let pid = holder.run.pid().to_string();
    let left = if matches!(store, Store::Local(_) | Store::Zk(_)) {
        "-"
    } else {
        row[3]
    };
    let token = holder.token().to_string();
    assert_eq!(row[..7], [name, "held", &token, left, "1", host, &pid]);
    // The command column is last and unpadded: the program, and how many arguments the record
    // left out (the script, which may hold a secret, is not shown).
    let argv = holder.command();
    let shown = format!("{} ({} arguments not recorded)", argv[0], argv.len() - 1);
    assert!(lines[1].ends_with(&shown), "{shown:?} in {text}");
    assert_eq!(
        lines[0].find("COMMAND"),
        lines[1].find(&shown),
        "columns are not aligned:\n{text}"
    );
}

#[test]
fn status_on_the_local_backend_shows_holder_token_and_waiters_then_free() {
    let sb = Sandbox::new();
    status_shows_holder_token_and_waiters(&Store::Local(sb.state()), &sb);
}

#[test]
fn status_on_etcd_3_4_shows_holder_token_time_left_and_waiters_then_free() {
    let sb = Sandbox::new();
    let store = Store::etcd(Version::V3_4, "status_held");
    status_shows_holder_token_and_waiters(&store, &sb);
}

#[test]
fn status_on_etcd_3_5_shows_holder_token_time_left_and_waiters_then_free() {
    let sb = Sandbox::new();
    let store = Store::etcd(Version::V3_5, "status_held");
    status_shows_holder_token_and_waiters(&store, &sb);
}

#[test]
fn status_on_zookeeper_shows_holder_token_and_waiters_then_free() {
    let sb = Sandbox::new();
    status_shows_holder_token_and_waiters(&Store::zk("status_held"), &sb);
}

/// A lease never taken is free (exit 1); with nothing anywhere the listing is empty (exit 0).
fn status_of_a_lease_never_taken(store: &Store) {
    let free = store.status_json(&["never-taken"], 1);
    assert_eq!(free["name"], "never-taken");
    assert_eq!(free["held"], false);
    assert_eq!(free["holder"], Value::Null);
    assert_eq!(store.status_json(&[], 0), serde_json::json!([]));
    let (code, text, stderr) = store.status(&["never-taken"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(text.contains("never-taken  free"), "{text}");
}

#[test]
fn status_of_a_free_local_lease_exits_1_and_creates_nothing() {
    let sb = Sandbox::new();
    let missing = sb.path("no-such-dir");
    status_of_a_lease_never_taken(&Store::Local(missing.clone()));
    assert!(!missing.exists(), "status created the local directory");
    assert!(!sb.lock_file("never-taken").exists());
}

#[test]
fn status_of_a_free_etcd_lease_exits_1_on_3_4_and_3_5() {
    for version in Version::ALL {
        status_of_a_lease_never_taken(&Store::etcd(version, "status_free"));
    }
}

#[test]
fn status_of_a_free_zookeeper_lease_exits_1_under_a_chroot_never_made() {
    status_of_a_lease_never_taken(&Store::zk("status_free"));
}

#[test]
fn status_shows_an_etcdctl_lock_holder_under_the_empty_prefix() {
    let server = etcd::shared(Version::V3_5);
    let name = format!("etcdctl-lock-{}", std::process::id());
    let mut lock = Version::V3_5.etcdctl_for(&server.endpoint());
    lock.args(["lock", &name]);
    lock.stdout(std::process::Stdio::piped());
    let mut child = lock.spawn().expect("run etcdctl lock");
    let _kill = KillOnDrop(vec![child.id() as i32]);
    let store = Store::Etcd {
        endpoint: server.endpoint(),
        prefix: String::new(),
    };
    wait_until(STARTUP, "etcdctl lock to hold the lease", || {
        store.status(&[&name]).0 == 0
    });
    let lease = store.status_json(&[&name], 0);
    assert_eq!(lease["held"], true, "{lease}");
    assert_eq!(
        lease["holder"],
        Value::Null,
        "etcdctl records no holder: {lease}"
    );
    let key = lease["key"].as_str().unwrap();
    let rev = server.etcdctl_ok(&["get", key, "-w", "json"]);
    let rev: Value = serde_json::from_str(&rev).unwrap();
    assert_eq!(lease["token"], rev["kvs"][0]["create_revision"], "{lease}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn status_exits_69_when_etcd_is_unreachable_and_64_for_a_bad_name() {
    let dead = Store::Etcd {
        endpoint: "http://127.0.0.1:1".into(),
        prefix: "x/".into(),
    };
    let (code, _, stderr) = dead.status(&["--dial-timeout", "300ms", "job"]);
    assert_eq!(code, 69, "{stderr}");
    assert!(
        stderr.contains("etcd at 127.0.0.1:1: connection refused"),
        "{stderr}"
    );
    let sb = Sandbox::new();
    let (code, _, stderr) = Store::Local(sb.state()).status(&["a/b"]);
    assert_eq!(code, 64, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// Every datagram that arrives on `socket` until one says STOPPING=1 (bounded).
#[track_caller]
fn notifications_until_stopping(socket: &UnixDatagram) -> Vec<String> {
    socket.set_read_timeout(Some(STARTUP)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.iter().any(|m: &String| m.contains("STOPPING=1")) {
        let n = socket
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no STOPPING=1 within {STARTUP:?} ({e}); got {got:?}"));
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    got
}

/// Runs `env` under leasewrap with NOTIFY_SOCKET=`address`; returns the child's environment.
fn run_env_with_notify_socket(sb: &Sandbox, address: &str) -> String {
    let out = sb
        .leasewrap()
        .name("notified")
        .env("NOTIFY_SOCKET", address)
        .cmd(&["env"])
        .output();
    assert_exit(&out, 0);
    out.stdout
}

#[track_caller]
fn assert_waiting_ready_stopping(got: &[String], token: u64) {
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0], "STATUS=waiting for lease notified");
    let ready: Vec<&str> = got[1].lines().collect();
    let holding = format!("STATUS=holding lease notified (token {token})");
    assert_eq!(ready, ["READY=1", holding.as_str()], "{got:?}");
    assert_eq!(got[2], "STOPPING=1");
}

#[test]
fn sd_notify_sends_waiting_ready_stopping_in_order_and_the_child_never_sees_notify_socket() {
    let sb = Sandbox::new();
    let path = sb.path("notify.sock");
    let socket = UnixDatagram::bind(&path).expect("bind notify socket");
    let env = run_env_with_notify_socket(&sb, path.to_str().unwrap());
    assert_waiting_ready_stopping(&notifications_until_stopping(&socket), 1);
    assert!(
        !env.contains("NOTIFY_SOCKET"),
        "NOTIFY_SOCKET reached the child:\n{env}"
    );
    assert!(env.contains("LEASEWRAP_FENCING_TOKEN=1"), "{env}");

    // systemd may name an abstract socket, written with a leading '@'.
    use std::os::linux::net::SocketAddrExt;
    let name = format!("leasewrap-test-notify-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let socket = UnixDatagram::bind_addr(&addr).expect("bind abstract notify socket");
    let env = run_env_with_notify_socket(&sb, &format!("@{name}"));
    assert_waiting_ready_stopping(&notifications_until_stopping(&socket), 2);
    assert!(!env.contains("NOTIFY_SOCKET"), "{env}");
}

/// The JSON log line whose message is `message`, from `stderr`, every line parsed.
#[track_caller]
fn log_line(stderr: &str, message: &str) -> Value {
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let found = lines.iter().find(|l| l["message"] == message);
    found
        .unwrap_or_else(|| panic!("no {message:?} line in:\n{stderr}"))
        .clone()
}

fn json_logs_carry_name_and_token(store: &Store) {
    let out = store
        .leasewrap("logged")
        .args(&["--log-format", "json", "-v"])
        .cmd(&["sh", "-c", "echo $LEASEWRAP_FENCING_TOKEN"])
        .output();
    assert_exit(&out, 0);
    let token: u64 = out.stdout.trim().parse().expect("token");
    for message in ["acquired", "released"] {
        let line = log_line(&out.stderr, message);
        assert_eq!(line["name"], "logged", "{line}");
        assert_eq!(line["token"], token, "{line}");
        assert_eq!(line["level"], "INFO", "{line}");
        assert!(line["timestamp"].is_string(), "{line}");
    }
}

#[test]
fn json_log_lines_parse_and_acquired_and_released_carry_name_and_token() {
    let sb = Sandbox::new();
    json_logs_carry_name_and_token(&Store::Local(sb.state()));
    json_logs_carry_name_and_token(&Store::etcd(Version::V3_5, "json_logs"));
}

#[test]
fn json_log_format_also_comes_from_the_environment_and_errors_are_json_too() {
    let sb = Sandbox::new();
    let out = sb
        .leasewrap()
        .env("LEASEWRAP_LOG_FORMAT", "json")
        .name("missing")
        .cmd(&["leasewrap-test-no-such-command"])
        .output();
    assert_exit(&out, 127);
    let line = log_line(
        &out.stderr,
        "leasewrap-test-no-such-command: command not found",
    );
    assert_eq!(line["level"], "ERROR", "{line}");
}

// ---------------------------------------------------------------------------------------------
// Logs (docs/operating.md "Logs").

/// The lines of `stderr` at `level` (text format) that contain `message`.
fn lines_at<'a>(stderr: &'a str, level: &str, message: &str) -> Vec<&'a str> {
    stderr
        .lines()
        .filter(|l| l.contains(&format!(" {level} ")) && l.contains(message))
        .collect()
}

#[test]
fn an_error_that_ends_the_run_is_one_bare_leasewrap_line() {
    let sb = Sandbox::new();
    let missing = sb
        .leasewrap()
        .name("missing")
        .cmd(&["leasewrap-test-no-such-command"])
        .output();
    assert_exit(&missing, 127);
    assert_eq!(
        missing.stderr,
        "leasewrap: leasewrap-test-no-such-command: command not found\n"
    );
}

#[test]
fn a_successful_run_prints_nothing_on_stderr_and_v_brings_the_info_lines_back() {
    let sb = Sandbox::new();
    let quiet = sb.leasewrap().name("silent").cmd(&["true"]).output();
    assert_exit(&quiet, 0);
    assert_eq!(quiet.stderr, "", "a successful run wrote on stderr");

    let verbose = sb
        .leasewrap()
        .name("silent")
        .args(&["-v"])
        .cmd(&["true"])
        .output();
    assert_exit(&verbose, 0);
    let first = verbose.stderr.lines().next().unwrap_or_default();
    assert_eq!(
        lines_at(first, "INFO", "using the local backend").len(),
        1,
        "the first line says the local backend is used:\n{}",
        verbose.stderr
    );
    for message in ["acquired", "released"] {
        let found = lines_at(&verbose.stderr, "INFO", message);
        assert_eq!(found.len(), 1, "{message}:\n{}", verbose.stderr);
        assert!(found[0].contains("token=2"), "{}", found[0]);
    }
}

#[test]
fn a_held_lease_is_quiet_unless_v_and_q_still_shows_the_error_that_ends_the_run() {
    let sb = Sandbox::new();
    let holder = hold(&sb, &Store::Local(sb.state()), "busy");
    let skipped = sb
        .leasewrap()
        .name("busy")
        .args(&["-n"])
        .cmd(&["true"])
        .output();
    assert_exit(&skipped, 75);
    assert_eq!(skipped.stderr, "", "a skip was not quiet by default");
    let shown = sb
        .leasewrap()
        .name("busy")
        .args(&["-n", "-v"])
        .cmd(&["true"])
        .output();
    assert_exit(&shown, 75);
    assert!(
        shown
            .stderr
            .contains("leasewrap: lease \"busy\" is held by another process"),
        "{}",
        shown.stderr
    );
    holder.finish();
    let missing = sb
        .leasewrap()
        .name("missing")
        .args(&["-q"])
        .cmd(&["leasewrap-test-no-such-command"])
        .output();
    assert_exit(&missing, 127);
    assert!(
        missing.stderr.contains("command not found"),
        "{}",
        missing.stderr
    );
}

#[test]
fn the_waiter_s_line_says_its_number_is_the_token_it_gets_once_acquired() {
    let sb = Sandbox::new();
    let store = Store::etcd(Version::V3_5, "waiter_line");
    let holder = hold(&sb, &store, "queued");
    let waiter = store
        .leasewrap("queued")
        .args(&["-v", "-w", "300ms"])
        .cmd(&["true"])
        .output();
    assert_exit(&waiter, 75);
    let line = lines_at(&waiter.stderr, "INFO", "waiting for the lease");
    assert_eq!(line.len(), 1, "{}", waiter.stderr);
    assert!(line[0].contains("token_once_acquired="), "{}", line[0]);
    assert!(
        !line[0].contains(" token="),
        "reads as the holder's token: {}",
        line[0]
    );
    holder.finish();
}

/// Runs `script` by sh in a mount namespace of its own whose /run (and /var/log/journal) is an
/// empty tmpfs, so that no journald but the script's own can be reached. In it `lw ARGS...`
/// runs leasewrap on the sandbox's state directory with JOURNAL_STREAM naming its stderr.
#[track_caller]
fn with_private_run(sb: &Sandbox, script: &str) -> Output {
    let setup = "mount -t tmpfs tmpfs /run || exit 90\n\
                 mount -t tmpfs tmpfs /var/log/journal 2>/dev/null\n\
                 lw() { JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2) \"$LW\" --local-dir \"$DIR\" \"$@\"; }\n";
    let mut command = Command::new("unshare");
    command.args(["-m", "sh", "-c", &format!("{setup}{script}")]);
    clean_env(&mut command);
    command.env("LW", BIN).env("DIR", sb.state());
    let out = run_bounded(command, 2 * RUN_BOUND);
    assert_ne!(
        out.status.code(),
        Some(90),
        "unshare -m and a tmpfs on /run are needed (run as root){}",
        out.context()
    );
    out
}

#[test]
fn with_stderr_the_journal_and_no_journald_lines_carry_priority_prefixes_and_no_timestamp() {
    let sb = Sandbox::new();
    let out = with_private_run(
        &sb,
        "lw --name demo -- true; lw --name demo -- leasewrap-test-no-such-command; echo $?\n\
         lw --ttl 0s --name demo -- true; echo $?",
    );
    assert_eq!(out.stdout, "127\n64\n", "{}", out.context());
    let mut lines: Vec<&str> = out.stderr.lines().collect();
    let usage = lines.pop().unwrap_or_default();
    assert!(
        usage.starts_with("<3>--ttl: \"0s\""),
        "a usage error: {usage}"
    );
    let dir = sb.state();
    let want = [
        format!(
            "<6>using the local backend (no etcd endpoints configured) dir={}",
            dir.display()
        ),
        "<6>acquired name=demo token=1".to_owned(),
        "<6>released name=demo token=1".to_owned(),
        // COMMAND is looked up before the backend is chosen.
        "<3>leasewrap-test-no-such-command: command not found".to_owned(),
    ];
    assert_eq!(
        lines, want,
        "the default on the journal is INFO; no timestamps"
    );
}

/// The script's part that starts systemd-journald and waits (bounded) for its socket.
const JOURNALD: &str = "mkdir -p /run/systemd/journal\n\
    /lib/systemd/systemd-journald & jd=$!\n\
    trap 'kill $jd' EXIT\n\
    n=0; until [ -S /run/systemd/journal/socket ]; do n=$((n+1)); [ $n -lt 1000 ] || exit 91; sleep 0.01; done\n";

/// Polls journalctl (bounded) until an entry says `last`, then prints leasewrap's entries as
/// JSON, one a line.
const READ_BACK: &str = "n=0; until journalctl -D /run/log/journal -o cat SYSLOG_IDENTIFIER=leasewrap | grep -q \"$LAST\"; do\n\
    n=$((n+1)); [ $n -lt 1000 ] || exit 92; sleep 0.01; done\n\
    journalctl -D /run/log/journal -o json SYSLOG_IDENTIFIER=leasewrap\n";

#[test]
fn with_stderr_the_journal_entries_are_native_with_priority_and_the_lease_s_fields() {
    let sb = Sandbox::new();
    let script = format!(
        "{JOURNALD}lw --name demo -- true\n\
         LAST='command not found'; lw --name demo -- leasewrap-test-no-such-command\n{READ_BACK}"
    );
    let out = with_private_run(&sb, &script);
    assert_exit(&out, 0);
    assert_eq!(out.stderr, "", "entries went to the journal, not to stderr");
    let entries: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let entry = |message: &str| {
        let found = entries.iter().find(|e| e["MESSAGE"] == message);
        found
            .unwrap_or_else(|| panic!("no {message:?} entry in {entries:#?}"))
            .clone()
    };
    let acquired = entry("acquired name=demo token=1");
    assert_eq!(acquired["PRIORITY"], "6", "{acquired}");
    assert_eq!(acquired["LEASEWRAP_NAME"], "demo", "{acquired}");
    assert_eq!(acquired["LEASEWRAP_FENCING_TOKEN"], "1", "{acquired}");
    let error = entry("leasewrap-test-no-such-command: command not found");
    assert_eq!(error["PRIORITY"], "3", "{error}");
    assert_eq!(
        error["LEASEWRAP_NAME"], "demo",
        "the run's name on its last entry: {error}"
    );
    for e in &entries {
        let message = e["MESSAGE"].as_str().unwrap_or_default();
        assert!(!message.starts_with("20"), "a timestamp of its own: {e}");
    }
}

#[test]
fn a_bad_value_from_the_environment_is_reported_under_the_variable_s_name() {
    let sb = Sandbox::new();
    let run = |var: &str, value: &str| {
        sb.leasewrap()
            .name("env")
            .env(var, value)
            .cmd(&["true"])
            .output()
    };
    for (var, value) in [("LEASEWRAP_LOG_FORMAT", "JSON"), ("LEASEWRAP_TTL", "ten")] {
        let out = run(var, value);
        assert_exit(&out, 64);
        let want = format!("leasewrap: {var}: invalid value '{value}'");
        assert!(out.stderr.starts_with(&want), "{var}: {}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
        assert!(!out.stderr.contains("--"), "names a flag: {}", out.stderr);
    }
    let put = Leasewrap::subcommand("fenced-write")
        .env("LEASEWRAP_FENCING_TOKEN", "x1")
        .args(&[sb.path("dest")])
        .stdin("data")
        .output();
    assert_exit(&put, 64);
    assert!(
        put.stderr
            .starts_with("leasewrap: LEASEWRAP_FENCING_TOKEN: invalid value 'x1'"),
        "{}",
        put.stderr
    );
    // Typed as a flag, it is the flag that is named, even with the variable set too.
    let typed = sb
        .leasewrap()
        .name("env")
        .env("LEASEWRAP_LOG_FORMAT", "json")
        .args(&["--log-format", "JSON"])
        .cmd(&["true"])
        .output();
    assert_exit(&typed, 64);
    assert!(typed.stderr.contains("--log-format"), "{}", typed.stderr);
}

#[test]
fn a_bad_leasewrap_log_warns_once_naming_it_and_the_default_applies() {
    let sb = Sandbox::new();
    let out = sb
        .leasewrap()
        .name("filter")
        .env("LEASEWRAP_LOG", "verbose")
        .cmd(&["true"])
        .output();
    assert_exit(&out, 0);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one warning, then the quiet default: {lines:?}"
    );
    assert!(lines[0].contains(" WARN "), "{}", lines[0]);
    assert!(
        lines[0].contains("LEASEWRAP_LOG: \"verbose\""),
        "{}",
        lines[0]
    );
    let verbose = sb
        .leasewrap()
        .name("filter")
        .env("LEASEWRAP_LOG", "leasewrap=loud")
        .args(&["-v"])
        .cmd(&["true"])
        .output();
    assert_exit(&verbose, 0);
    assert_eq!(
        lines_at(&verbose.stderr, "WARN", "LEASEWRAP_LOG").len(),
        1,
        "{}",
        verbose.stderr
    );
    assert_eq!(
        lines_at(&verbose.stderr, "INFO", "acquired").len(),
        1,
        "-v applies: {}",
        verbose.stderr
    );
}

#[test]
fn a_bad_dial_timeout_or_tls_file_from_the_environment_is_reported_under_the_variable_s_name() {
    let sb = Sandbox::new();
    let missing = sb.path("no-such-ca.pem");
    for (var, value, code) in [
        ("LEASEWRAP_DIAL_TIMEOUT", "soon", 64),
        ("ETCDCTL_DIAL_TIMEOUT", "0s", 64),
        ("ETCDCTL_CACERT", missing.to_str().unwrap(), 78),
    ] {
        let out = sb
            .leasewrap()
            .on_etcd("http://127.0.0.1:1", "lw/")
            .name("env")
            .env(var, value)
            .cmd(&["true"])
            .output();
        assert_exit(&out, code);
        assert!(
            out.stderr.starts_with(&format!("leasewrap: {var}")),
            "{var}: {}",
            out.stderr
        );
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    }
}
