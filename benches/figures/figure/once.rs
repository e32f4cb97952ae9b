//! Figure 9: the cost of `--once KEY` (a new KEY each run, so each runs and records its success)
//! on the uncontended `-- true` path, against plain leasewrap, on etcd and on the local backend.

use std::path::Path;

use super::whole_run::{alternate, Run};
use crate::bench::{os, Bench, Lock, Tool};
use crate::report::{Figure, Row};
use crate::stats::{self, dist, median};

const ONCE_NOTE: &str = "Figure 9 (`--once`, issue 12): a fresh KEY each iteration (`--once \
    run-N`), so every run reads the record, runs the child and records the success: on etcd one \
    range read before the child and one guarded transaction after it (the record's lease is \
    granted while the child runs); on the local backend one read, and a temp file, two fsyncs and \
    a rename. A KEY already done costs less than a plain run: the read, and no child.";

/// Whether the binary has the once-per-run flags.
fn has_once(bench: &Bench) -> bool {
    let out = std::process::Command::new(&bench.lw).arg("--help").output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--once "))
}

/// The cost of `--once KEY` (a new KEY each run, so each runs and records its success) on the
/// uncontended `-- true` path, against plain leasewrap, on etcd and on the local backend.
pub fn figure(bench: &mut Bench) -> Figure {
    if !has_once(bench) {
        let row = Row {
            leasewrap: "not available: this leasewrap has no `--once`".into(),
            ..Row::new("once", "9. `--once KEY -- true` against plain `-- true`")
        };
        return Figure {
            rows: vec![row],
            notes: Vec::new(),
            ..Figure::default()
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
        ..Figure::default()
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
