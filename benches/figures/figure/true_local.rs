//! Figure 2: `-- true` on the local backend against `flock(1)` on the same lock file, and what
//! one fdatasync costs there.

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::whole_run::{alternate, Run};
use crate::bench::{os, Bench, FLOCK, START_BOUND};
use crate::report::{Figure, Row};
use crate::stats::{self, dist, median};

/// fdatasync probes for the note on the local backend.
const FSYNC_PROBES: usize = 50;

pub fn figure(bench: &mut Bench) -> Figure {
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
    let back_to_back = fsync_cost(bench, &dir, None);
    let spaced = fsync_cost(bench, &dir, Some(flock.as_slice()));
    let fsync = format!(
        "fdatasync of a 2-byte rewrite in the local dir (leasewrap makes one per run, before the \
         child starts; flock(1) none): one after each run of flock(1), as far apart as \
         leasewrap's own in the runs above, {}; back to back, {}.",
        dist(&spaced, "ms", 3),
        dist(&back_to_back, "ms", 3)
    );
    let split = split(bench, &dir);
    Figure {
        rows: vec![row],
        notes: vec![fsync, split],
        ..Figure::default()
    }
}

const LW_EXEC: &str = "split-leasewrap";
const TRUE_EXEC: &str = "split-true";
const LW_EXIT: &str = "split-exit";

/// Where a local `-- true` spends its time: a private copy of leasewrap runs a private copy of
/// `true`, so inotify sees leasewrap's execve, its watchdog's if it is re-executed (through
/// /proc/self/exe, the copy), and the child's; the exit is leasewrap's pidfd.
fn split(bench: &mut Bench, dir: &Path) -> String {
    let bin = bench.path("split");
    fs::create_dir(&bin).expect("create the split dir");
    let (lw, child) = (bin.join("leasewrap"), bin.join("true"));
    fs::copy(&bench.lw, &lw).expect("copy leasewrap");
    fs::copy("/bin/true", &child).expect("copy true");
    bench.events.watch_exec(&lw, LW_EXEC);
    bench.events.watch_exec(&child, TRUE_EXEC);
    let argv = os(&[
        lw.as_os_str(),
        "--local-dir".as_ref(),
        dir.as_os_str(),
        "--name".as_ref(),
        "split".as_ref(),
        "--".as_ref(),
        child.as_os_str(),
    ]);
    let mut pieces: [Vec<f64>; 4] = Default::default();
    let mut no_watchdog_exec = 0;
    for _ in 0..bench.sizes.n {
        bench.events.reset();
        let spawned = Instant::now();
        let pid = bench.procs.spawn(&argv, "split", None);
        bench.events.watch_exit(pid, LW_EXIT);
        let got = bench.events.wait_all(&[TRUE_EXEC, LW_EXIT], START_BOUND);
        assert_eq!(got.len(), 2, "split: saw only {:?}", got.keys());
        bench.procs.finish(&[pid], START_BOUND, 0);
        let started = bench
            .events
            .wait_for(LW_EXEC, Duration::ZERO)
            .unwrap_or(spawned);
        let watchdog = bench
            .events
            .wait_for(LW_EXEC, Duration::ZERO)
            .filter(|w| *w <= got[TRUE_EXEC]);
        no_watchdog_exec += usize::from(watchdog.is_none());
        let watchdog = watchdog.unwrap_or(started);
        let marks = [spawned, started, watchdog, got[TRUE_EXEC], got[LW_EXIT]];
        for (k, w) in marks.windows(2).enumerate() {
            pieces[k].push(w[1].duration_since(w[0]).as_secs_f64() * 1e3);
        }
    }
    split_note(&pieces, no_watchdog_exec)
}

fn split_note(pieces: &[Vec<f64>; 4], no_watchdog_exec: usize) -> String {
    let med = |v: &[f64]| median(v).map_or("—".into(), |m| format!("{m:.2} ms"));
    let names = [
        "the harness's fork and exec → leasewrap's execve",
        "→ the watchdog's execve",
        "→ the child's execve",
        "→ leasewrap's exit",
    ];
    let mut lines = vec![
        format!(
            "Where a local `-- true` spends its time ({} runs of a private copy of leasewrap, \
             started by fork, so the first piece is slower than posix_spawn; inotify sees each \
             execve of the copy and of its child; runs with no watchdog execve seen: {no_watchdog_exec}):",
            pieces[0].len()
        ),
        String::new(),
        "| piece (medians) | time |".into(),
        "|---|---|".into(),
    ];
    for (k, (name, v)) in names.iter().zip(pieces).enumerate() {
        // A watchdog that is forked, not re-executed, has no execve of its own to see.
        if k == 1 && no_watchdog_exec == v.len() {
            lines.push(format!(
                "| {name} | none: the watchdog is forked, not re-executed |"
            ));
        } else {
            lines.push(format!("| {name} | {} |", med(v)));
        }
    }
    lines.join("\n")
}

/// fdatasync after a rewrite of a small file in `dir`, each after a run of `spacer` if given.
fn fsync_cost(bench: &mut Bench, dir: &Path, spacer: Option<&[OsString]>) -> Vec<f64> {
    let path = dir.join("fsync-probe");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path);
    let mut file = file.expect("create the fsync probe");
    let mut out = Vec::new();
    for i in 0..FSYNC_PROBES {
        if let Some(argv) = spacer {
            bench.procs.timed(argv, "fsync-spacer");
        }
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
