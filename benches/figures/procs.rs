//! Every process the benchmarks start, and what /proc says about them.
//!
//! A process the harness starts runs in a session of its own, and the harness is a child
//! subreaper, so orphans (an `etcdctl lock` child whose parent was SIGKILLed) come back to it.
//! `sweep` SIGKILLs and reaps every descendant of the harness but etcd's (a watchdog may have a
//! session of its own); `Drop` sweeps too, so a failed figure leaves nothing behind. It never
//! signals a process that does not descend from the harness.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::observe;

/// PATH of every child the tools start.
pub const CHILD_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// How long a sweep may take before a process that survives SIGKILL is reported.
const SWEEP_BOUND: Duration = Duration::from_secs(10);

/// How often a sweep looks again while SIGKILLed processes are still dying.
const SWEEP_POLL: Duration = Duration::from_millis(2);

pub struct Procs {
    /// Descendants of these are never swept (etcd).
    spared: BTreeSet<i32>,
    /// Exit codes of processes a sweep reaped before anyone waited for them.
    reaped: HashMap<i32, i32>,
    /// Where each process's stderr goes: `LOGS/<name>.log`.
    logs: PathBuf,
}

impl Procs {
    /// Makes this process a child subreaper; logs go under `logs`.
    pub fn new(logs: PathBuf) -> Procs {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes one integer argument.
        let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) };
        assert_eq!(
            r,
            0,
            "prctl(PR_SET_CHILD_SUBREAPER): {}",
            io::Error::last_os_error()
        );
        fs::create_dir_all(&logs).expect("create the log dir");
        Procs {
            spared: BTreeSet::new(),
            reaped: HashMap::new(),
            logs,
        }
    }

    /// Keeps `pid` and its descendants out of every sweep.
    pub fn spare(&mut self, pid: i32) {
        self.spared.insert(pid);
    }

    /// Keeps every process that descends from the harness now (servers a figure started) out
    /// of every sweep.
    pub fn spare_every_descendant(&mut self) {
        let table = proc_table();
        let ours: Vec<i32> = self.ours(&table).map(|p| p.pid).collect();
        self.spared.extend(ours);
    }

    /// The file the log `name` is written to.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.logs.join(format!("{name}.log"))
    }

    pub fn log(&self, name: &str) -> File {
        let path = self.log_path(name);
        let open = OpenOptions::new().create(true).append(true).open(&path);
        open.unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
    }

    /// Starts `argv` in a session of its own, stdin /dev/null, stdout to `stdout` (or the log),
    /// stderr to the log `log`; returns its pid.
    pub fn spawn(&mut self, argv: &[OsString], log: &str, stdout: Option<File>) -> i32 {
        let mut cmd = command(argv);
        let out = stdout.unwrap_or_else(|| self.log(log));
        cmd.stdin(Stdio::null()).stdout(out).stderr(self.log(log));
        // SAFETY: setsid is async-signal-safe and the hook touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // Reaped by pid: `wait`, or `sweep` once it is a zombie of ours.
        #[allow(clippy::zombie_processes)]
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"));
        child.id() as i32
    }

    /// Runs `argv` to its end (spawned the cheapest way: posix_spawn, a process group of its own)
    /// and returns the wall time from just before the spawn to the wakeup from waitpid.
    pub fn timed(&mut self, argv: &[OsString], log: &str) -> Duration {
        let mut cmd = command(argv);
        cmd.stdin(Stdio::null())
            .stdout(self.log(log))
            .stderr(self.log(log))
            .process_group(0);
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"));
        let status = child.wait().expect("waitpid");
        let took = started.elapsed();
        let log_path = self.logs.join(format!("{log}.log"));
        assert!(
            status.success(),
            "{argv:?} exited with {status}; see {}",
            log_path.display()
        );
        took
    }

    /// The exit code (128 + n for a signal) of our child `pid`, or None while it runs after `bound`.
    pub fn wait(&mut self, pid: i32, bound: Duration) -> Option<i32> {
        if let Some(code) = self.reaped.remove(&pid) {
            return Some(code);
        }
        if !observe::wait_exit(pid, bound) {
            return None;
        }
        reap(pid, 0).or_else(|| self.reaped.remove(&pid))
    }

    /// Waits for each of `pids` to end within `bound`; panics unless each exits with `expect`.
    #[track_caller]
    pub fn finish(&mut self, pids: &[i32], bound: Duration, expect: i32) {
        for &pid in pids {
            let code = self.wait(pid, bound);
            assert_eq!(
                code,
                Some(expect),
                "pid {pid}: exit {code:?} (None: still running)"
            );
        }
    }

    /// SIGKILLs and reaps every process left that descends from us (etcd's spared).
    pub fn sweep(&mut self) {
        let deadline = Instant::now() + SWEEP_BOUND;
        loop {
            let table = proc_table();
            let live: Vec<i32> = self
                .ours(&table)
                .filter(|p| p.state != 'Z')
                .map(|p| p.pid)
                .collect();
            for &pid in &live {
                // SAFETY: kill takes a pid and a signal; the pid is one of our own descendants.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            self.reap_zombies();
            if live.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "processes {live:?} survive SIGKILL"
            );
            thread::sleep(SWEEP_POLL);
        }
    }

    /// The processes of `table` that descend from us, not from a spared one, and are not us.
    fn ours<'a>(&'a self, table: &'a [ProcStat]) -> impl Iterator<Item = &'a ProcStat> + 'a {
        let parent: HashMap<i32, i32> = table.iter().map(|p| (p.pid, p.ppid)).collect();
        let descends = move |mut pid: i32| {
            // a chain longer than this is not one the harness made
            for _ in 0..64 {
                if self.spared.contains(&pid) {
                    return false;
                }
                match parent.get(&pid) {
                    Some(&ppid) if ppid == me() => return true,
                    Some(&ppid) if ppid > 1 => pid = ppid,
                    _ => return false,
                }
            }
            false
        };
        table
            .iter()
            .filter(move |p| p.pid != me() && descends(p.pid))
    }

    /// Reaps every zombie whose parent we are (our children and the orphans we adopted).
    fn reap_zombies(&mut self) {
        for p in proc_table() {
            if p.ppid == me() && p.state == 'Z' && !self.spared.contains(&p.pid) {
                if let Some(code) = reap(p.pid, libc::WNOHANG) {
                    self.reaped.insert(p.pid, code);
                }
            }
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.sweep();
    }
}

fn command(argv: &[OsString]) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("LEASEWRAP_") || k.starts_with("ETCDCTL_") || k == "NOTIFY_SOCKET" {
            cmd.env_remove(&key);
        }
    }
    cmd.env("PATH", CHILD_PATH).env("ETCDCTL_API", "3");
    cmd
}

/// waitpid(pid, flags): the exit code (128 + n for a signal), None if not reaped.
fn reap(pid: i32, flags: i32) -> Option<i32> {
    let mut status = 0;
    // SAFETY: waitpid writes only to `status`, which lives across the call.
    let r = unsafe { libc::waitpid(pid, &mut status, flags) };
    if r != pid {
        return None;
    }
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else {
        Some(128 + libc::WTERMSIG(status))
    }
}

fn me() -> i32 {
    std::process::id() as i32
}

/// One line of /proc/PID/stat, the fields the harness needs.
pub struct ProcStat {
    pub pid: i32,
    pub state: char,
    pub ppid: i32,
}

fn proc_table() -> Vec<ProcStat> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter_map(proc_stat)
        .collect()
}

fn proc_stat(pid: i32) -> Option<ProcStat> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    Some(ProcStat {
        pid,
        state: rest.first()?.chars().next()?,
        ppid: rest.get(1)?.parse().ok()?,
    })
}

/// The state letter of `pid` (`R`, `S`, `T` for stopped, `Z`...), None once it is gone.
pub fn state_of(pid: i32) -> Option<char> {
    proc_stat(pid).map(|p| p.state)
}

/// The parent of `pid`, None once it is gone.
pub fn parent_of(pid: i32) -> Option<i32> {
    proc_stat(pid).map(|p| p.ppid)
}

/// Every process below `pid`, children of any of its threads included (a Go program starts
/// its child from any thread).
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        let tasks = fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten();
        for task in tasks {
            let text = fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in text.split_whitespace().filter_map(|c| c.parse().ok()) {
                out.push(child);
                next.push(child);
            }
        }
    }
    out
}

/// Pids whose /proc/PID/exe is `binary`.
pub fn pids_running(binary: &Path) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == binary))
        .collect()
}

/// The children of `pid` (its main thread's).
pub fn children(pid: i32) -> Vec<i32> {
    let text = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    text.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// CPU time of every thread of `pid` (schedstat: ns, exact, unlike the ticks of /proc/PID/stat),
/// and the number of threads; None once it is gone.
pub fn cpu_ns(pid: i32) -> Option<(u64, usize)> {
    let mut total = 0;
    let mut threads = 0;
    for task in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let stat = fs::read_to_string(task.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        threads += 1;
    }
    Some((total, threads))
}

/// utime + stime of `pid` in clock ticks.
pub fn cpu_ticks(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
}

/// VmHWM of the supervisor `pid` and its watchdog (its children but the one running `child`),
/// in KiB.
pub fn supervisor_hwm_kib(pid: i32, child: i32) -> u64 {
    let mut pids = vec![pid];
    pids.extend(children(pid).into_iter().filter(|&c| c != child));
    pids.iter()
        .map(|p| kb_field(&format!("/proc/{p}/status"), "VmHWM"))
        .sum()
}

/// A `Field:  N kB` line of a /proc file, in kB; 0 when it is missing.
pub fn kb_field(path: &str, field: &str) -> u64 {
    let text = fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
