//! Figures 1 and 2, and the cost of `--once`: the wall time of a whole uncontended run of
//! `-- true`, from just before the spawn to waitpid's return, the tools interleaved run by run.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use crate::bench::{os, Bench, Lock, Tool, FLOCK};
use crate::report::{Figure, Row};
use crate::stats::{self, dist, median};

/// Runs discarded before each measured series (page cache, etcd's first connections).
const WARMUP: usize = 3;

/// fdatasync probes for the note on the local backend.
const FSYNC_PROBES: usize = 50;

/// One command line per iteration, under a label.
type Run<'a> = (&'static str, Box<dyn Fn(usize) -> Vec<OsString> + 'a>);

/// Milliseconds of each run, per label; the order of the labels flips every iteration.
fn alternate(bench: &mut Bench, runs: &[Run], n: usize) -> Vec<Vec<f64>> {
    let mut out = vec![Vec::new(); runs.len()];
    for i in 0..WARMUP + n {
        let mut order: Vec<usize> = (0..runs.len()).collect();
        if i % 2 == 1 {
            order.reverse();
        }
        for k in order {
            let (label, argv) = &runs[k];
            let took = bench.procs.timed(&argv(i), label);
            if i >= WARMUP {
                out[k].push(took.as_secs_f64() * 1e3);
            }
        }
    }
    out
}

/// Figure 1: `-- true` on etcd, leasewrap against `etcdctl lock`, and the harness's floor.
pub fn on_etcd(bench: &mut Bench) -> Figure {
    let lock = Lock::new("x");
    let lw = bench.argv(Tool::Leasewrap, &lock, &os(&["true"]));
    let ec = bench.argv(Tool::Etcdctl, &lock, &os(&["true"]));
    let runs: Vec<Run> = vec![
        ("leasewrap", Box::new(|_| lw.clone())),
        ("etcdctl", Box::new(|_| ec.clone())),
        ("true", Box::new(|_| os(&["/bin/true"]))),
    ];
    let r = alternate(bench, &runs, bench.sizes.n);
    let row = Row::new(
        "true-etcd",
        "1. `-- true` uncontended, etcd (whole process)",
    );
    let row = Row {
        leasewrap: dist(&r[0], "ms", 2),
        baseline: format!("etcdctl lock: {}", dist(&r[1], "ms", 2)),
        ..row.with_ratio(stats::ratio(median(&r[0]), median(&r[1])))
    };
    let floor = format!(
        "Harness floor for the whole-process figures (posix_spawn + waitpid of `/bin/true`): {}.",
        dist(&r[2], "ms", 2)
    );
    let asked = requests_per_run(bench, &lw, &ec);
    Figure {
        rows: vec![row],
        notes: vec![floor, asked],
    }
}

/// Runs counted for the requests a `-- true` asks of etcd.
const COUNTED_RUNS: usize = 10;

/// What one uncontended `-- true` asks of etcd, per tool: etcd's counters over `COUNTED_RUNS`
/// runs of that tool alone, divided by the number of runs.
fn requests_per_run(bench: &mut Bench, lw: &[OsString], ec: &[OsString]) -> String {
    let mut per_tool = Vec::new();
    for (label, argv) in [("leasewrap", lw), ("etcdctl", ec)] {
        let before = bench.scrape();
        for _ in 0..COUNTED_RUNS {
            bench.procs.timed(argv, label);
        }
        let delta = bench.scrape().counters_since(&before);
        per_tool.push(delta);
    }
    let keys: std::collections::BTreeSet<&String> =
        per_tool.iter().flat_map(|d| d.keys()).collect();
    let mut lines = vec![
        format!(
            "What one uncontended `-- true` asks of etcd (its /metrics over {COUNTED_RUNS} runs of \
             each tool alone, per run):"
        ),
        String::new(),
        "| etcd counter, per run | leasewrap | etcdctl lock |".into(),
        "|---|---|---|".into(),
    ];
    for k in keys {
        let at = |i: usize| per_tool[i].get(k).copied().unwrap_or(0.0) / COUNTED_RUNS as f64;
        lines.push(format!("| `{k}` | {:.2} | {:.2} |", at(0), at(1)));
    }
    lines.join("\n")
}

/// Figure 2: `-- true` on the local backend against `flock(1)` on the same lock file.
pub fn local(bench: &mut Bench) -> Figure {
    let dir = bench.local_dir("local");
    let lw = vec![
        bench.lw.clone().into(),
        "--local-dir".into(),
        dir.clone().into(),
        "--name".into(),
        "x".into(),
        "--".into(),
        "true".into(),
    ];
    let flock = os(&[
        FLOCK.as_ref(),
        dir.join("x.lock").as_os_str(),
        "true".as_ref(),
    ]);
    let runs: Vec<Run> = vec![
        ("leasewrap-local", Box::new(|_| lw.clone())),
        ("flock", Box::new(|_| flock.clone())),
    ];
    let r = alternate(bench, &runs, bench.sizes.n);
    let row = Row::new("true-local", "2. `-- true` local backend (whole process)");
    let row = Row {
        leasewrap: dist(&r[0], "ms", 2),
        baseline: format!("flock(1): {}", dist(&r[1], "ms", 2)),
        ..row.with_ratio(stats::ratio(median(&r[0]), median(&r[1])))
    };
    let fsync = format!(
        "fdatasync of a 2-byte rewrite in the local dir: {}.",
        dist(&fsync_cost(&dir), "ms", 3)
    );
    Figure {
        rows: vec![row],
        notes: vec![fsync],
    }
}

fn fsync_cost(dir: &Path) -> Vec<f64> {
    let path = dir.join("fsync-probe");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path);
    let mut file = file.expect("create the fsync probe");
    let mut out = Vec::new();
    for i in 0..FSYNC_PROBES {
        let started = Instant::now();
        file.write_all_at(format!("{}\n", i % 10).as_bytes(), 0)
            .expect("write the probe");
        file.sync_data().expect("fdatasync the probe");
        out.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let _ = file.flush();
    let _ = std::fs::remove_file(&path);
    out
}

const ONCE_NOTE: &str = "Figure 9 (`--once`, issue 12): a fresh KEY each iteration (`--once \
    run-N`), so every run reads the record, runs the child and records the success: on etcd one \
    range read before the child and one guarded transaction after it (the record's lease is \
    granted while the child runs); on the local backend one read, and a temp file, two fsyncs and \
    a rename. A KEY already done costs less than a plain run: the read, and no child.";

/// Whether the binary has the once-per-run flags.
pub fn has_once(bench: &Bench) -> bool {
    let out = std::process::Command::new(&bench.lw).arg("--help").output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--once "))
}

/// The cost of `--once KEY` (a new KEY each run, so each runs and records its success) on the
/// uncontended `-- true` path, against plain leasewrap, on etcd and on the local backend.
pub fn once(bench: &mut Bench) -> Figure {
    if !has_once(bench) {
        let row = Row {
            leasewrap: "not available: this leasewrap has no `--once`".into(),
            ..Row::new("once", "9. `--once KEY -- true` against plain `-- true`")
        };
        return Figure {
            rows: vec![row],
            notes: Vec::new(),
        };
    }
    let dir = bench.local_dir("once-local");
    let rows = vec![
        once_row(bench, "etcd", None),
        once_row(bench, "local backend", Some(&dir)),
    ];
    Figure {
        rows,
        notes: vec![ONCE_NOTE.into()],
    }
}

/// `--once run-N -- true` against `-- true`, on etcd or (with `local_dir`) the local backend.
fn once_row(bench: &mut Bench, backend: &str, local_dir: Option<&Path>) -> Row {
    let argv = |once: bool| {
        let mut lock = Lock::new(if once { "once" } else { "plain" });
        if once {
            lock.extra = os(&["--once", "KEY"]);
        }
        match local_dir {
            Some(dir) => bench.argv_local(&lock, dir, &os(&["true"])),
            None => bench.argv(Tool::Leasewrap, &lock, &os(&["true"])),
        }
    };
    let (once, plain) = (argv(true), argv(false));
    let key_at = once
        .iter()
        .position(|a| a == "KEY")
        .expect("the KEY argument");
    let with_key = |i: usize| {
        let mut argv = once.clone();
        argv[key_at] = format!("run-{i}").into();
        argv
    };
    let runs: Vec<Run> = vec![
        ("once", Box::new(with_key)),
        ("plain", Box::new(|_| plain.clone())),
    ];
    let r = alternate(bench, &runs, bench.sizes.n);
    let (a, b) = (median(&r[0]), median(&r[1]));
    let title = format!(
        "9. `--once KEY -- true`, {backend}, KEY not yet done (a read and a guarded write)"
    );
    Row {
        leasewrap: dist(&r[0], "ms", 2),
        baseline: format!(
            "leasewrap without `--once`: {}; difference of medians {:.2} ms",
            dist(&r[1], "ms", 2),
            a.zip(b).map_or(f64::NAN, |(a, b)| a - b)
        ),
        ..Row::new("once", title).with_ratio(stats::ratio(a, b))
    }
}
