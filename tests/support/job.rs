//! A leasewrap whose child reports through files (`Marks`): its pid, environment and wall-clock
//! start and end, then waits until the test creates its release file.
//!
//! The one "holder" of every area's tests. It never sleeps to let things settle: each accessor
//! waits, with a bound, for the file the child writes.

use std::collections::HashMap;
use std::fs::{self, File};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use super::{
    assert_exit, atomically, pid_alive, q, read_pid, wait_for_file, Leasewrap, Running, Sandbox,
    STARTUP,
};

/// The files one child reports through, and the one the test creates to let it finish.
pub struct Marks {
    /// The child's pid (`$$` of its shell, which is the process leasewrap started).
    pub pid: PathBuf,
    /// Its whole environment, as `env` prints it.
    pub env: PathBuf,
    /// Wall-clock ns at its start.
    pub start: PathBuf,
    /// Wall-clock ns just before it exits.
    pub end: PathBuf,
    /// Created by the test: the child may finish.
    pub release: PathBuf,
    /// One wall-clock ns line per 20 ms while it waits, when asked for.
    pub beat: PathBuf,
}

impl Marks {
    pub fn new(sb: &Sandbox, label: &str) -> Marks {
        let path = |what: &str| sb.path(&format!("{label}.{what}"));
        Marks {
            pid: path("pid"),
            env: path("env"),
            start: path("start"),
            end: path("end"),
            release: path("release"),
            beat: path("beat"),
        }
    }

    /// Reports start time, pid and environment; waits for `release`; reports its end time.
    pub fn script(&self, heartbeat: bool) -> String {
        let beat = if heartbeat {
            format!("date +%s%N >> {}; ", q(&self.beat))
        } else {
            String::new()
        };
        format!(
            "{start}; {pid}; {env}; while [ ! -e {release} ]; do {beat}sleep 0.02; done; {end}",
            start = atomically("date +%s%N", &self.start),
            pid = atomically("echo $$", &self.pid),
            env = atomically("env", &self.env),
            release = q(&self.release),
            end = atomically("date +%s%N", &self.end),
        )
    }

    pub fn started(&self) -> bool {
        self.start.exists()
    }
}

/// A leasewrap whose child reports through `Marks`. On drop, kills what is left of the child.
pub struct Job {
    pub run: Running,
    pub marks: Marks,
    /// The `sh -c` script the child runs, as the holder record shows it.
    script: String,
}

impl Job {
    /// Starts `lw` with the `Marks` child; does not wait for the lease.
    pub fn spawn(lw: Leasewrap, marks: Marks, heartbeat: bool) -> Job {
        let script = marks.script(heartbeat);
        Job::with_script(lw, marks, script)
    }

    /// Starts `lw` with `script` as the child, which must report through `marks`.
    pub fn with_script(lw: Leasewrap, marks: Marks, script: String) -> Job {
        let run = lw.cmd(&["sh", "-c", &script]).spawn();
        Job { run, marks, script }
    }

    /// Starts a holder (child label `label`) and returns once its child runs.
    #[track_caller]
    pub fn hold(lw: Leasewrap, sb: &Sandbox, label: &str) -> Job {
        let job = Job::spawn(lw, Marks::new(sb, label), false);
        job.child();
        job
    }

    /// The child's argv: `sh -c SCRIPT`.
    pub fn command(&self) -> Vec<String> {
        vec!["sh".into(), "-c".into(), self.script.clone()]
    }

    /// Waits for the child to run; returns its pid.
    #[track_caller]
    pub fn child(&self) -> i32 {
        read_pid(&self.marks.pid, STARTUP)
    }

    /// The child's environment (waits for it).
    #[track_caller]
    pub fn env(&self) -> HashMap<String, String> {
        wait_for_file(&self.marks.env, STARTUP);
        let text = fs::read_to_string(&self.marks.env).expect("read env file");
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[track_caller]
    pub fn var(&self, name: &str) -> String {
        let env = self.env();
        let value = env.get(name);
        value
            .unwrap_or_else(|| panic!("the child's environment has no {name}"))
            .clone()
    }

    #[track_caller]
    pub fn token(&self) -> u64 {
        let token = self.var("LEASEWRAP_FENCING_TOKEN");
        token
            .parse()
            .unwrap_or_else(|e| panic!("LEASEWRAP_FENCING_TOKEN={token:?}: {e}"))
    }

    pub fn release(&self) {
        File::create(&self.marks.release).expect("create release file");
    }

    /// Waits for leasewrap to exit, panicking with its stderr after `bound`.
    #[track_caller]
    pub fn wait(&mut self, bound: Duration) -> ExitStatus {
        self.run.wait_timeout(bound)
    }

    #[track_caller]
    pub fn finish_with(&mut self, code: i32) {
        self.wait(STARTUP);
        assert_exit(&self.run, code);
    }

    /// Lets the child finish and asserts that leasewrap then exits 0.
    #[track_caller]
    pub fn finish(mut self) {
        self.release();
        self.finish_with(0);
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let pid = fs::read_to_string(&self.marks.pid).ok();
        if let Some(pid) = pid.and_then(|p| p.trim().parse::<i32>().ok()) {
            if pid_alive(pid) {
                let _ = signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}
