//! Test support: a builder over the built `leasewrap` binary, bounded waits on observable
//! events, and `/proc` readers for checking what is left of a process tree. The servers the
//! tests run against live in `etcd`, `postgres`, `mariadb` and `zookeeper`.
//!
//! Nothing here sleeps to "let things settle": every wait polls for an event and panics with
//! what it was waiting for once its bound runs out.

pub mod dbserver;
pub mod elf;
pub mod etcd;
pub mod http;
mod job;
pub mod mariadb;
pub mod neighbour;
pub mod pgbouncer;
pub mod postgres;
pub mod proxy;
pub mod release;
pub mod seccomp;
pub mod stallfs;
mod tree;
pub mod user;
pub mod zkfake;
pub mod zookeeper;

pub use job::{Job, Marks};
pub use tree::{daemon_script, start_tree, TREE_KILL_AFTER};

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_leasewrap");

/// How long `output()` lets a run take before calling it hung.
pub const RUN_BOUND: Duration = Duration::from_secs(10);

/// Time for leasewrap to take a free lease and start its child (or exit) on a loaded 2-core box.
pub const STARTUP: Duration = Duration::from_secs(10);

/// How often bounded waits look again (also the resolution of an observed takeover).
pub const POLL: Duration = Duration::from_millis(2);

/// How long to wait for a pipe's EOF once the process is gone (a leaked descendant may hold it).
const PIPE_EOF_BOUND: Duration = Duration::from_secs(1);

/// One test's private corner of the file system: markers and scripts in the root, the local
/// backend's state in `state/`.
pub struct Sandbox {
    /// Removed on drop, with everything the test wrote.
    root: TempDir,
}

impl Sandbox {
    pub fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("leasewrap-test-")
            .tempdir()
            .expect("create temp dir");
        let state = root.path().join("state");
        fs::create_dir(&state).expect("create state dir");
        // Whatever the umask: leasewrap refuses a state directory that group or others can write.
        fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).expect("chmod state dir");
        Sandbox { root }
    }

    /// A path for a marker or script file of this test.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    /// The `--local-dir` of every leasewrap this sandbox builds.
    pub fn state(&self) -> PathBuf {
        self.path("state")
    }

    pub fn lock_file(&self, name: &str) -> PathBuf {
        self.state().join(format!("{name}.lock"))
    }

    pub fn token_file(&self, name: &str) -> PathBuf {
        self.state().join(format!("{name}.token"))
    }

    /// The counter of the local backend, or None while no run has ever taken the lease.
    #[track_caller]
    pub fn token(&self, name: &str) -> Option<u64> {
        let path = self.token_file(name);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("read {}: {e}", path.display()),
        };
        let token = text.trim().parse().unwrap_or_else(|e| {
            panic!(
                "{} holds {text:?}, not a decimal token: {e}",
                path.display()
            )
        });
        Some(token)
    }

    /// Every `*.token` file under the state dir: empty as long as nothing was acquired.
    pub fn token_files(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
            for entry in fs::read_dir(dir).expect("read state dir").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, found);
                } else if path.to_string_lossy().ends_with(".token") {
                    found.push(path);
                }
            }
        }
        let mut found = Vec::new();
        walk(&self.state(), &mut found);
        found
    }

    /// A leasewrap whose `--local-dir` is this sandbox's state dir.
    pub fn leasewrap(&self) -> Leasewrap {
        Leasewrap::new().local_dir(self.state())
    }

    /// Writes `password` and a newline to `rel`, readable by its owner only (as a password file
    /// should be, or leasewrap warns), and returns its path.
    pub fn password_file(&self, rel: &str, password: &str) -> PathBuf {
        let path = self.path(rel);
        fs::write(&path, format!("{password}\n")).expect("write the password file");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod 600");
        path
    }

    /// Writes an executable `#!/bin/sh` script and returns its path.
    pub fn script(&self, rel: &str, body: &str) -> PathBuf {
        let path = self.path(rel);
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod script");
        path
    }
}

/// Single-quotes a path for a shell script (temp dir paths hold no quote).
pub fn q(path: &Path) -> String {
    let text = path.to_str().expect("utf-8 path");
    assert!(!text.contains('\''), "path with a quote: {text}");
    format!("'{text}'")
}

/// A shell snippet that writes the output of `producer` (`echo $$`, `env`, ...) to `path` in one
/// step (temp file, then rename), so a reader never sees half of it.
pub fn atomically(producer: &str, path: &Path) -> String {
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    format!(
        "{producer} > {tmp} && mv {tmp} {dst}",
        tmp = q(&tmp),
        dst = q(path)
    )
}

/// What a run reads on stdin.
enum Input {
    /// /dev/null.
    Null,
    /// These bytes, then EOF.
    Bytes(Vec<u8>),
    /// A pipe the test writes itself (`Running::take_stdin`).
    Pipe,
}

/// Builder for one run of the binary: a supervised run, or a subcommand.
pub struct Leasewrap {
    /// `status`, `fenced-write`, ...; None for a supervised run.
    subcommand: Option<&'static str>,
    /// `--local-dir`; for a supervised run a fresh temp dir when not given.
    local_dir: Option<PathBuf>,
    /// Options before COMMAND, in order.
    args: Vec<OsString>,
    /// `-- COMMAND...` or `-c STRING`; empty for "no command at all".
    tail: Vec<OsString>,
    /// Variables set on top of the cleaned environment.
    envs: Vec<(OsString, OsString)>,
    /// Run it as `sh -c '"$@"; echo $?'` so stdout carries the status a shell sees.
    via_shell: bool,
    input: Input,
    /// Run as this user instead of the test's own.
    user: Option<user::User>,
    /// Start it in a process group of its own, as a job-control shell starts a job.
    own_group: bool,
    /// Start it with these signals ignored, as `nohup` or a shell's background job does.
    ignored: Vec<Signal>,
    /// Run it as on a kernel that lacks these system calls (a seccomp filter).
    missing: Vec<seccomp::Missing>,
}

impl Default for Leasewrap {
    fn default() -> Self {
        Self::new()
    }
}

impl Leasewrap {
    pub fn new() -> Self {
        Leasewrap {
            subcommand: None,
            local_dir: None,
            args: Vec::new(),
            tail: Vec::new(),
            envs: Vec::new(),
            via_shell: false,
            input: Input::Null,
            own_group: false,
            user: None,
            ignored: Vec::new(),
            missing: Vec::new(),
        }
    }

    /// Runs as `user` (uid, gid, no supplementary groups).
    pub fn run_as(mut self, user: user::User) -> Self {
        self.user = Some(user);
        self
    }

    /// `leasewrap SUBCOMMAND ...`: `--local-dir` only when given.
    pub fn subcommand(subcommand: &'static str) -> Self {
        Leasewrap {
            subcommand: Some(subcommand),
            ..Leasewrap::new()
        }
    }

    /// The etcd backend at `endpoints`, under `prefix`.
    pub fn on_etcd(self, endpoints: &str, prefix: &str) -> Self {
        self.args(&["--endpoints", endpoints, "--prefix", prefix])
    }

    /// The ZooKeeper backend at `connect` (`host:port,...[/chroot]`).
    pub fn on_zookeeper(self, connect: &str) -> Self {
        self.args(&["--zookeeper", connect])
    }

    pub fn local_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.local_dir = Some(dir.into());
        self
    }

    pub fn name(self, name: &str) -> Self {
        self.args(&["--name", name])
    }

    pub fn args<S: AsRef<OsStr>>(mut self, args: &[S]) -> Self {
        self.args.extend(args.iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        self.envs.push((key.into(), value.as_ref().to_owned()));
        self
    }

    /// `-- COMMAND [ARG]...`
    pub fn cmd<S: AsRef<OsStr>>(mut self, argv: &[S]) -> Self {
        self.tail = std::iter::once(OsString::from("--"))
            .chain(argv.iter().map(|a| a.as_ref().to_owned()))
            .collect();
        self
    }

    /// `-c 'SHELL STRING'`
    pub fn shell(mut self, script: &str) -> Self {
        self.tail = vec!["-c".into(), script.into()];
        self
    }

    /// Runs leasewrap under `sh -c '"$@"; echo $?'`: stdout then ends with the status a shell saw.
    pub fn via_shell(mut self) -> Self {
        self.via_shell = true;
        self
    }

    /// Starts leasewrap in a process group of its own (its pid names it), as a job-control
    /// shell starts a job, so that the test can signal the group as `kill %1` would.
    pub fn own_process_group(mut self) -> Self {
        self.own_group = true;
        self
    }

    /// Starts leasewrap with `signals` ignored, as `nohup` (SIGHUP) and a shell's background job
    /// (SIGINT, SIGQUIT) start a command: an ignored signal stays ignored across exec.
    pub fn ignoring(mut self, signals: &[Signal]) -> Self {
        self.ignored.extend_from_slice(signals);
        self
    }

    /// Runs leasewrap as on an older kernel that lacks `missing` (tests/support/seccomp.rs).
    pub fn on_a_kernel_without(mut self, missing: &[seccomp::Missing]) -> Self {
        self.missing.extend_from_slice(missing);
        self
    }

    /// Feeds `input` on stdin, then EOF (a run that exits before reading it all is fine).
    pub fn stdin(mut self, input: impl Into<Vec<u8>>) -> Self {
        self.input = Input::Bytes(input.into());
        self
    }

    /// Gives stdin a pipe that the test writes through `Running::take_stdin`.
    pub fn stdin_pipe(mut self) -> Self {
        self.input = Input::Pipe;
        self
    }

    pub fn spawn(self) -> Running {
        let (argv, owned_dir) = self.argv();
        let mut command = if self.via_shell {
            let mut c = Command::new("/bin/sh");
            c.args(["-c", "\"$@\"; echo $?", "sh"]).args(&argv);
            c
        } else {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        };
        clean_env(&mut command);
        command.envs(self.envs.iter().map(|(k, v)| (k, v)));
        if self.own_group {
            command.process_group(0);
        }
        if let Some(user) = self.user {
            command.uid(user.uid).gid(user.gid);
        }
        ignore_in_child(&mut command, self.ignored.clone());
        if !self.missing.is_empty() {
            seccomp::without(&mut command, &self.missing);
        }
        let mut running = Running::start(command, !matches!(self.input, Input::Null));
        running._local_dir = owned_dir;
        if let Input::Bytes(bytes) = self.input {
            let mut stdin = running.take_stdin();
            // A run that refuses before reading its input closes the pipe: that is normal.
            thread::spawn(move || {
                let _ = stdin.write_all(&bytes);
            });
        }
        running
    }

    /// `BIN [SUBCOMMAND] [--local-dir DIR] ARGS... TAIL...`, and the temp dir made for DIR.
    fn argv(&self) -> (Vec<OsString>, Option<TempDir>) {
        let mut argv: Vec<OsString> = vec![BIN.into()];
        argv.extend(self.subcommand.map(OsString::from));
        let (local_dir, owned_dir) = match (&self.local_dir, self.subcommand) {
            (Some(dir), _) => (Some(dir.clone()), None),
            (None, Some(_)) => (None, None),
            (None, None) => {
                let dir = tempfile::tempdir().expect("create temp local dir");
                // Whatever the umask: leasewrap refuses a directory others can write.
                fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700))
                    .expect("chmod temp local dir");
                (Some(dir.path().to_owned()), Some(dir))
            }
        };
        if let Some(dir) = local_dir {
            argv.extend(["--local-dir".into(), dir.into()]);
        }
        argv.extend(self.args.iter().cloned());
        argv.extend(self.tail.iter().cloned());
        (argv, owned_dir)
    }

    /// Runs to the end (bounded by `RUN_BOUND`) and collects both streams.
    #[track_caller]
    pub fn output(self) -> Output {
        output_within(self.spawn(), RUN_BOUND)
    }
}

/// Runs `command` (stdin /dev/null) to its end within `bound`, and collects both streams;
/// panics with its stderr after `bound` (and kills it on the way out).
#[track_caller]
/// `command` starts with `signals` ignored.
fn ignore_in_child(command: &mut Command, signals: Vec<Signal>) {
    if signals.is_empty() {
        return;
    }
    // SAFETY: between fork and exec the closure only calls sigaction, which is
    // async-signal-safe, and allocates nothing (the list was moved in before the fork).
    unsafe {
        command.pre_exec(move || {
            for &sig in &signals {
                nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn)?;
            }
            Ok(())
        });
    }
}

pub fn run_bounded(command: Command, bound: Duration) -> Output {
    output_within(Running::start(command, false), bound)
}

#[track_caller]
fn output_within(mut running: Running, bound: Duration) -> Output {
    let started = Instant::now();
    let status = running.wait_timeout(bound);
    Output {
        status,
        stdout: running.stdout(),
        stderr: running.stderr(),
        elapsed: started.elapsed(),
    }
}

/// `command` gets no variable that cargo sets for a test (CARGO_PKG_NAME, CARGO_MANIFEST_DIR,
/// OUT_DIR, ...): build scripts (ring's, cc's) watch them, so a build started with them would
/// redo what a build from the shell made.
pub fn without_cargo_env(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        let set_by_cargo = (k.starts_with("CARGO_") && k != "CARGO_HOME") || k == "CARGO";
        if set_by_cargo || k == "OUT_DIR" {
            command.env_remove(&key);
        }
    }
}

/// `command` runs niced, so that a build it makes slows the tests that measure time less.
pub fn niced(command: &mut Command) {
    // SAFETY: between fork and exec the closure calls nice(2) alone, which is async-signal-safe
    // and allocates nothing.
    unsafe {
        command.pre_exec(|| {
            libc::nice(10);
            Ok(())
        });
    }
}

/// Takes away everything that could point leasewrap at etcd or leak in from the test runner.
pub fn clean_env(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("LEASEWRAP_") || k.starts_with("ETCDCTL_") || k == "NOTIFY_SOCKET" {
            command.env_remove(&key);
        }
    }
}

/// A finished run.
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// From just before spawning to the observed exit.
    pub elapsed: Duration,
}

/// A pipe drained by a thread, readable at any time.
struct Capture {
    /// What has arrived so far.
    buf: Arc<Mutex<Vec<u8>>>,
    /// Disconnected once the pipe reached EOF.
    eof: mpsc::Receiver<()>,
}

impl Capture {
    fn start(mut pipe: impl Read + Send + 'static) -> Self {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let (tx, eof) = mpsc::channel::<()>();
        let sink = Arc::clone(&buf);
        thread::spawn(move || {
            let _tx = tx;
            let mut chunk = [0u8; 4096];
            // Err (EINTR is retried by std) or 0 both end the stream.
            while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                sink.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        });
        Capture { buf, eof }
    }

    /// Everything up to EOF, or what came within `PIPE_EOF_BOUND` if a leaked process holds
    /// the pipe open.
    fn text(&self) -> String {
        let _ = self.eof.recv_timeout(PIPE_EOF_BOUND);
        String::from_utf8_lossy(&self.buf.lock().unwrap()).into_owned()
    }

    /// What has arrived so far, without waiting.
    fn so_far(&self) -> String {
        String::from_utf8_lossy(&self.buf.lock().unwrap()).into_owned()
    }
}

/// A leasewrap started with `spawn()`; SIGKILLed and reaped on drop if still running.
pub struct Running {
    child: Child,
    stdout: Capture,
    stderr: Capture,
    /// Set once `wait_timeout` saw the exit.
    status: Option<ExitStatus>,
    /// Keeps a builder-made `--local-dir` alive as long as the process.
    _local_dir: Option<TempDir>,
}

impl Running {
    /// Spawns `command` with stdout and stderr captured; stdin a pipe or /dev/null.
    fn start(mut command: Command, piped_stdin: bool) -> Running {
        let stdin = if piped_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        command
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
        let stdout = Capture::start(child.stdout.take().expect("stdout pipe"));
        let stderr = Capture::start(child.stderr.take().expect("stderr pipe"));
        Running {
            child,
            stdout,
            stderr,
            status: None,
            _local_dir: None,
        }
    }

    /// The write end of a `stdin_pipe()` run's stdin (once).
    pub fn take_stdin(&mut self) -> ChildStdin {
        self.child
            .stdin
            .take()
            .expect("a run built with stdin_pipe()")
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn kill(&self, sig: Signal) {
        signal::kill(Pid::from_raw(self.pid()), sig)
            .unwrap_or_else(|e| panic!("kill({}, {sig}): {e}", self.pid()));
    }

    /// The exit status if the process has ended, without waiting.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }

    /// Waits for the exit, panicking with stderr so far once `bound` has passed.
    #[track_caller]
    pub fn wait_timeout(&mut self, bound: Duration) -> ExitStatus {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.try_status() {
                return status;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{} (pid {}) still running after {bound:?}\n--- stderr so far ---\n{}",
                    cmdline(self.pid()),
                    self.pid(),
                    self.stderr.so_far()
                );
            }
            thread::sleep(POLL);
        }
    }

    /// Everything leasewrap (and its child) wrote to stderr; complete once it has exited.
    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    pub fn stdout(&self) -> String {
        self.stdout.text()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.try_status().is_some() {
            return;
        }
        let _ = self.child.kill();
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            thread::sleep(POLL);
        }
    }
}

/// Something that ended with an exit status, and what to show when it was the wrong one.
pub trait Finished {
    fn exit_status(&self) -> ExitStatus;
    fn context(&self) -> String;
}

impl Finished for ExitStatus {
    fn exit_status(&self) -> ExitStatus {
        *self
    }
    fn context(&self) -> String {
        String::new()
    }
}

impl Finished for Output {
    fn exit_status(&self) -> ExitStatus {
        self.status
    }
    fn context(&self) -> String {
        format!(
            "\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout, self.stderr
        )
    }
}

impl Finished for Running {
    fn exit_status(&self) -> ExitStatus {
        self.status
            .expect("assert on a Running before wait_timeout saw it exit")
    }
    fn context(&self) -> String {
        format!("\n--- stderr ---\n{}", self.stderr())
    }
}

#[track_caller]
pub fn assert_exit(run: &impl Finished, code: i32) {
    let status = run.exit_status();
    assert_eq!(
        status.code(),
        Some(code),
        "expected exit {code}, got {status}{}",
        run.context()
    );
}

#[track_caller]
pub fn assert_signaled(run: &impl Finished, sig: Signal) {
    let status = run.exit_status();
    assert_eq!(
        status.signal(),
        Some(sig as i32),
        "expected death by {sig}, got {status}{}",
        run.context()
    );
}

/// The state letter and the rest of `/proc/PID/stat` after the command name.
fn proc_stat(pid: i32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The state letter of `/proc/PID/stat` ('T' when stopped, 'Z' a zombie), None once it is gone.
pub fn proc_state(pid: i32) -> Option<char> {
    proc_stat(pid)?.first()?.chars().next()
}

/// Whether PID is stopped (SIGSTOP, or a tracer), or as good as stopped: waiting (state D) for a
/// vforked child that was stopped before it could exec, as dash's parent shell then does.
pub fn is_stopped(pid: i32) -> bool {
    match proc_state(pid) {
        Some('T' | 't') => true,
        Some('D') => children_of(pid).into_iter().any(is_stopped),
        _ => false,
    }
}

/// The children of PID's main thread.
fn children_of(pid: i32) -> Vec<i32> {
    let text = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    text.split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// True while PID runs; a zombie counts as dead (PID 1 here may never reap orphans).
pub fn pid_alive(pid: i32) -> bool {
    !matches!(proc_state(pid), Some('Z' | 'X' | 'x') | None)
}

pub fn ppid_of(pid: i32) -> Option<i32> {
    proc_stat(pid)?.get(1)?.parse().ok()
}

/// True if PID has an open file descriptor on `path`.
pub fn has_open(pid: i32, path: &Path) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| fs::read_link(fd.path()).is_ok_and(|target| target == path))
}

/// The dirs under `root` named `<pid>-...` whose test process is gone: the scratch dirs of
/// servers that a test binary never dropped.
pub fn dirs_of_dead_processes(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    let dead = |name: &str| {
        let pid = name.split('-').next().map(str::parse::<i32>);
        matches!(pid, Some(Ok(pid)) if signal::kill(Pid::from_raw(pid), None) == Err(nix::errno::Errno::ESRCH))
    };
    entries
        .flatten()
        .filter(|e| dead(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect()
}

/// Runs `f` to its end on a runtime of its own (one thread), for the tests of a layer that is
/// async.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    rt.expect("a runtime").block_on(f)
}

/// Polls `cond` every few milliseconds; panics naming `what` once `bound` has passed.
#[track_caller]
pub fn wait_until(bound: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !cond() {
        if Instant::now() >= deadline {
            panic!("timed out after {bound:?} waiting for {what}");
        }
        thread::sleep(POLL);
    }
}

#[track_caller]
pub fn wait_for_file(path: &Path, bound: Duration) {
    wait_until(bound, &format!("{} to appear", path.display()), || {
        path.exists()
    });
}

/// Waits for a file whose content is complete (ends in a newline) and returns it trimmed.
#[track_caller]
pub fn read_line_file(path: &Path, bound: Duration) -> String {
    let mut text = String::new();
    wait_until(
        bound,
        &format!("a complete line in {}", path.display()),
        || {
            text = fs::read_to_string(path).unwrap_or_default();
            text.ends_with('\n')
        },
    );
    text.trim().to_owned()
}

#[track_caller]
pub fn read_pid(path: &Path, bound: Duration) -> i32 {
    let text = read_line_file(path, bound);
    text.parse()
        .unwrap_or_else(|e| panic!("{} holds {text:?}, not a pid: {e}", path.display()))
}

/// SIGKILLs the listed pids on drop if still alive, so a failed test leaves no sleeper behind.
pub struct KillOnDrop(pub Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if pid_alive(pid) {
                let _ = signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// Waits until none of the named pids runs; on timeout names the survivors and their command lines.
#[track_caller]
pub fn assert_all_die_within(bound: Duration, procs: &[(&str, i32)]) {
    let deadline = Instant::now() + bound;
    loop {
        let alive: Vec<String> = procs
            .iter()
            .filter(|(_, pid)| pid_alive(*pid))
            .map(|(what, pid)| format!("{what} (pid {pid}: {})", cmdline(*pid)))
            .collect();
        if alive.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("still alive {bound:?} later: {}", alive.join(", "));
        }
        thread::sleep(POLL);
    }
}

/// The name of PID (its comm, as `ps` and `pgrep` show it).
pub fn comm(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim_end()
        .to_owned()
}

/// The command line of PID, for messages.
pub fn cmdline(pid: i32) -> String {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .replace('\0', " ")
        .trim_end()
        .to_owned()
}
