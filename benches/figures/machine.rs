//! The machine and the run, as the report's last section states them: CPUs, kernel, tool
//! versions, the binary measured, load before and after, and how busy the machine was.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::bench::FLOCK;
use super::procs::CHILD_PATH;
use super::support::etcd::Version;

/// A machine whose CPUs were busier than this share, over `QUIET_SAMPLE` just before the run,
/// is not quiet. (The load average lags by minutes: right after the build it is still high.)
pub const QUIET_BUSY: f64 = 0.10;

/// How long the CPUs are watched to judge whether the machine is quiet.
pub const QUIET_SAMPLE: Duration = Duration::from_secs(5);

pub struct Machine {
    facts: Vec<String>,
    started: Instant,
    load_start: String,
    /// Share of all CPUs busy over `QUIET_SAMPLE` before the run.
    busy_before: f64,
    busy_start: (u64, u64),
    /// Set by `finish`.
    end: Vec<String>,
}

impl Machine {
    /// Waits up to `wait` for a quiet machine (none: judges it once), then notes the facts.
    pub fn start(binary: &Path, root: &Path, wait: Duration) -> Machine {
        let deadline = Instant::now() + wait;
        let mut busy_before = busy_over(QUIET_SAMPLE);
        while busy_before >= QUIET_BUSY && Instant::now() < deadline {
            println!(
                "machine {:.0} % busy, waiting for < {:.0} %",
                busy_before * 100.0,
                QUIET_BUSY * 100.0
            );
            busy_before = busy_over(QUIET_SAMPLE);
        }
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
            busy_before,
            busy_start: cpu_busy(),
            end: Vec::new(),
        }
    }

    pub fn finish(&mut self) {
        let (busy, total) = cpu_busy();
        let share = (busy - self.busy_start.0) as f64 / (total - self.busy_start.1).max(1) as f64;
        let quiet = self.busy_before < QUIET_BUSY;
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
                format!(
                    "{}: all CPUs {:.0} % busy over the {} s before the run (quiet: below {:.0} %)",
                    if quiet { "yes" } else { "NO" },
                    self.busy_before * 100.0,
                    QUIET_SAMPLE.as_secs(),
                    QUIET_BUSY * 100.0
                )
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

/// The share of all CPUs busy over the next `span`.
fn busy_over(span: Duration) -> f64 {
    let (b0, t0) = cpu_busy();
    std::thread::sleep(span); // the sample itself
    let (b1, t1) = cpu_busy();
    (b1 - b0) as f64 / (t1 - t0).max(1) as f64
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
