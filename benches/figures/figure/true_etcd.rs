//! Figure 1: `-- true` on etcd, leasewrap against `etcdctl lock`, the harness's floor, and what
//! one run asks of etcd.

use std::ffi::OsString;

use super::whole_run::{alternate, Run};
use crate::bench::{os, Bench, Lock, Tool};
use crate::report::{Figure, Row};
use crate::stats::{self, dist, median};

pub fn figure(bench: &mut Bench) -> Figure {
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
    let (refusing, cost) = refusing_endpoint(bench, &r[0]);
    Figure {
        rows: vec![row, refusing],
        notes: vec![floor, asked, cost],
        ..Figure::default()
    }
}

/// An endpoint that refuses (a port nothing listens on) listed before etcd: leasewrap's `-- true`
/// against `etcdctl put` with the same endpoints, and what the refusing endpoint costs each over
/// its run with etcd alone (leasewrap's from `alone`, measured above).
fn refusing_endpoint(bench: &mut Bench, alone: &[f64]) -> (Row, String) {
    let etcd = bench.etcd.endpoint();
    let both = format!("http://127.0.0.1:1,{etcd}");
    let lock = Lock::new("x").via(both.clone());
    let lw = bench.argv(Tool::Leasewrap, &lock, &os(&["true"]));
    let put = |endpoints: &str| {
        let etcdctl = crate::support::etcd::Version::V3_4.etcdctl();
        let at = format!("--endpoints={endpoints}");
        os(&[
            etcdctl.as_os_str(),
            at.as_ref(),
            "put".as_ref(),
            "x-put".as_ref(),
            "v".as_ref(),
        ])
    };
    let (put_both, put_alone) = (put(&both), put(&etcd));
    let runs: Vec<Run> = vec![
        ("leasewrap", Box::new(|_| lw.clone())),
        ("etcdctl", Box::new(|_| put_both.clone())),
        ("etcdctl", Box::new(|_| put_alone.clone())),
    ];
    let r = alternate(bench, &runs, bench.sizes.n);
    let row = Row::new(
        "true-etcd-refusing",
        "1. `-- true`, etcd listed after an endpoint that refuses (`--endpoints http://127.0.0.1:1,ETCD`)",
    );
    let row = Row {
        leasewrap: dist(&r[0], "ms", 2),
        baseline: format!("etcdctl put, the same endpoints: {}", dist(&r[1], "ms", 2)),
        ..row.with_ratio(stats::ratio(median(&r[0]), median(&r[1])))
    };
    let less = |a: &[f64], b: &[f64]| median(a).zip(median(b)).map_or(f64::NAN, |(a, b)| a - b);
    let cost = format!(
        "What the refusing endpoint listed first costs a run, over the same run with etcd alone \
         (difference of medians): leasewrap {:.2} ms, etcdctl put {:.2} ms ({} alone).",
        less(&r[0], alone),
        less(&r[1], &r[2]),
        dist(&r[2], "ms", 2)
    );
    (row, cost)
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
