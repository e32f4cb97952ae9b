//! Figure 2: `-- true` on the local backend against `flock(1)` on the same lock file, and what
//! one fdatasync costs there.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use super::whole_run::{alternate, Run};
use crate::bench::{os, Bench, FLOCK};
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
