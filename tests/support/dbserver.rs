//! What the tests' database servers (PostgreSQL, MariaDB) share: a scratch dir owned by the
//! tests' unprivileged user under one root per server kind, the dirs of dead test processes
//! swept (and their servers stopped) before the first new one, commands run as that user, and
//! stopping a server by its pid.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::user::{self, User};
use super::{comm, dirs_of_dead_processes, proc_state, wait_until};

/// How long a server may take to start or stop on a loaded 2-core machine.
pub const SERVER_BOUND: Duration = Duration::from_secs(60);

/// The kind of server a scratch dir is for.
pub struct Kind {
    /// Its slot in `AT_EXIT`.
    pub slot: usize,
    /// The dir under the temp dir that holds every scratch dir of this kind.
    pub root: &'static str,
    /// The server's process name (its comm), so that a reused pid is never signalled.
    pub comm: &'static str,
    /// The server's pid in a dead test process's scratch dir, if it wrote one.
    pub pid_in: fn(&Path) -> Option<i32>,
    /// The signal that stops it at once (the data dir is thrown away anyway).
    pub stop: Signal,
}

/// A temp dir owned by `runner`, named `<pid>-...` under the kind's root; the dirs of dead test
/// processes are removed first (once per root), their servers stopped.
pub fn scratch_dir(kind: &Kind, runner: User) -> TempDir {
    static SWEPT: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let root = std::env::temp_dir().join(kind.root);
    fs::create_dir_all(&root).unwrap_or_else(|e| panic!("cannot create {}: {e}", root.display()));
    user::chmod(&root, 0o755);
    let mut swept = SWEPT.lock().unwrap();
    if !swept.contains(&kind.root) {
        swept.push(kind.root);
        sweep(kind, &root);
    }
    drop(swept);
    let prefix = format!("{}-", std::process::id());
    let dir = tempfile::Builder::new().prefix(&prefix).tempdir_in(&root);
    let dir = dir.unwrap_or_else(|e| panic!("cannot create a temp dir in {}: {e}", root.display()));
    runner.owns(dir.path());
    dir
}

fn sweep(kind: &Kind, root: &Path) {
    for dir in dirs_of_dead_processes(root) {
        // The pid may have been given to another process since.
        if let Some(server) = (kind.pid_in)(&dir).filter(|&p| comm(p) == kind.comm) {
            stop(server, kind.stop);
        }
        let _ = fs::remove_dir_all(dir);
    }
}

/// `signal` by pid, then wait until it is gone. A process that is a child subreaper (the
/// benchmarks are) or the server's parent reaps it here.
pub fn stop(pid: i32, signal: Signal) {
    if kill(Pid::from_raw(pid), signal).is_ok() {
        wait_until(SERVER_BOUND, "the database server to stop", || {
            let flag = Some(nix::sys::wait::WaitPidFlag::WNOHANG);
            let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), flag);
            kill(Pid::from_raw(pid), None).is_err() || proc_state(pid) == Some('Z')
        });
    }
}

/// `cmd` run as `runner`, from a directory it can read.
pub fn as_user(runner: User, mut cmd: Command) -> Command {
    cmd.uid(runner.uid).gid(runner.gid).current_dir("/");
    cmd
}

#[track_caller]
pub fn expect_success(what: &str, out: std::io::Result<std::process::Output>) {
    let out = out.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The shared server of each kind (its pid, and the signal that stops it), for the exit hook;
/// 0 before it starts.
static AT_EXIT: [(AtomicI32, AtomicI32); 2] = [
    (AtomicI32::new(0), AtomicI32::new(0)),
    (AtomicI32::new(0), AtomicI32::new(0)),
];

/// The server in `cell`, started by `start` (which says its pid) on first use, and stopped when
/// the test process exits: one per test binary.
pub fn shared<T>(cell: &'static OnceLock<T>, kind: &Kind, start: fn() -> (T, i32)) -> &'static T {
    cell.get_or_init(|| {
        let (server, pid) = start();
        stop_at_exit(kind, pid);
        server
    })
}

/// Stops `pid`, a server of `kind`, when the test process exits.
pub fn stop_at_exit(kind: &Kind, pid: i32) {
    static HOOK: Once = Once::new();
    let (slot_pid, slot_signal) = &AT_EXIT[kind.slot];
    slot_signal.store(kind.stop as i32, Ordering::SeqCst);
    slot_pid.store(pid, Ordering::SeqCst);
    HOOK.call_once(|| {
        // SAFETY: registers a plain extern "C" function that takes no lock and allocates nothing.
        unsafe { libc::atexit(stop_shared_at_exit) };
    });
}

extern "C" fn stop_shared_at_exit() {
    for (pid, signal) in &AT_EXIT {
        let pid = pid.load(Ordering::SeqCst);
        if let (true, Ok(signal)) = (pid > 0, Signal::try_from(signal.load(Ordering::SeqCst))) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }
}
