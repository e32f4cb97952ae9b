//! The machine and the run, as the report's last section states them: CPUs, kernel, tool
//! versions, the binary measured, load before and after, and how busy the machine was.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::bench::FLOCK;
use super::procs::CHILD_PATH;
use super::support::etcd::Version;

/// A 1-minute load below this when the run begins counts as a quiet machine.
pub const QUIET_LOAD: f64 = 0.7;

pub struct Machine {
    facts: Vec<String>,
    started: Instant,
    load_start: String,
    busy_start: (u64, u64),
    /// Set by `finish`.
    end: Vec<String>,
}

impl Machine {
    pub fn start(binary: &Path, root: &Path) -> Machine {
        let cpu = first_line_with("/proc/cpuinfo", "model name")
            .and_then(|l| Some(l.split_once(':')?.1.trim().to_owned()))
            .unwrap_or_else(|| "?".into());
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let etcd = Version::V3_4.etcd();
        let facts = vec![
            format!("CPUs: {cpus} × {cpu}; kernel {}", kernel.trim()),
            format!(
                "etcd: {} (`{}`, one member started by tests/support, default fsync); {}; {}",
                first_output_line(&etcd, &["--version"]),
                etcd.display(),
                first_output_line(&Version::V3_4.etcdctl(), &["version"]),
                first_output_line(Path::new(FLOCK), &["--version"]),
            ),
            format!("leasewrap: {}", binary_facts(binary, root)),
            format!(
                "children run with PATH={CHILD_PATH}; the tools' stderr goes to log files in the temp dir"
            ),
        ];
        Machine {
            facts,
            started: Instant::now(),
            load_start: loadavg(),
            busy_start: cpu_busy(),
            end: Vec::new(),
        }
    }

    pub fn finish(&mut self) {
        let (busy, total) = cpu_busy();
        let share = (busy - self.busy_start.0) as f64 / (total - self.busy_start.1).max(1) as f64;
        let quiet = self
            .load_start
            .split_whitespace()
            .next()
            .and_then(|l| l.parse::<f64>().ok())
            .is_some_and(|l| l < QUIET_LOAD);
        let date = Command::new("date").args(["-u", "+%F %T UTC"]).output();
        let date = date.map_or_else(
            |_| "?".into(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        );
        self.end = vec![
            format!(
                "date: {date}; duration {:.0} s",
                self.started.elapsed().as_secs_f64()
            ),
            format!(
                "load average (1, 5, 15 min) at the start: {}, at the end: {}",
                self.load_start,
                loadavg()
            ),
            format!(
                "machine CPU busy during the run (all processes, /proc/stat): {:.0} % of all CPUs",
                share * 100.0
            ),
            format!(
                "quiet machine: {}",
                if quiet {
                    format!("yes: the 1-minute load was below {QUIET_LOAD} when the run began")
                } else {
                    format!("NO: the 1-minute load was at or above {QUIET_LOAD} when the run began")
                }
            ),
        ];
    }

    pub fn lines(&self) -> Vec<String> {
        self.facts.iter().chain(&self.end).cloned().collect()
    }
}

/// `target/release/leasewrap, 3.8 MiB, sha256 cd5e2888…, built from 33dfe24`.
fn binary_facts(binary: &Path, root: &Path) -> String {
    let size = fs::metadata(binary).map_or(0, |m| m.len());
    let sha = first_output_line(
        Path::new("sha256sum"),
        &[binary.as_os_str().to_str().unwrap_or("")],
    );
    let sha: String = sha.chars().take(16).collect();
    let git = |args: &[&str]| {
        let out = Command::new("git").arg("-C").arg(root).args(args).output();
        out.map_or_else(
            |_| String::new(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        )
    };
    let commit = git(&["rev-parse", "--short", "HEAD"]);
    let dirty = !git(&[
        "status",
        "--porcelain",
        "--",
        "src",
        "Cargo.toml",
        "Cargo.lock",
    ])
    .is_empty();
    let shown = binary.strip_prefix(root).unwrap_or(binary);
    format!(
        "`{}`, {:.1} MiB, sha256 {sha}…, built from {commit}{}",
        shown.display(),
        size as f64 / (1u64 << 20) as f64,
        if dirty {
            " with uncommitted changes"
        } else {
            ""
        }
    )
}

fn first_line_with(path: &str, prefix: &str) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_owned)
}

fn first_output_line(program: &Path, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("?")
            .to_owned(),
        Err(_) => "?".into(),
    }
}

pub fn loadavg() -> String {
    let text = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Busy and total jiffies of all CPUs since boot.
fn cpu_busy() -> (u64, u64) {
    let text = fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).unwrap_or(&0) + v.get(4).unwrap_or(&0);
    (total - idle, total)
}
