//! Figure 7: one lease, a holder and a queue of waiters (10, then 200), handed on one by one;
//! each handover timed exit to exec as in figure 3, and etcd's request counters (/metrics) over
//! the handover phase divided by the number of handovers.
//!
//! Before each handover the harness waits until etcd's watcher gauge shows the steady state
//! (the new holder watches its own key, every waiter the key ahead, none unsynced).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::handover::exit_to_exec;
use crate::bench::{os, Bench, Child, Fifo, Lock, Tool};
use crate::report::{Figure, Row};
use crate::stats::{ratio, Summary};

const EXIT: &str = "exit";

/// Waiters started before the harness waits for them to queue.
const BATCH: usize = 20;

/// The store's work per handover: what "touches O(1) keys" is judged on.
const STORE_OPS: [&str; 4] = ["mvcc_range", "mvcc_txn", "mvcc_delete", "mvcc_put"];

struct Chain {
    handovers_ms: Vec<f64>,
    per_handover: BTreeMap<String, f64>,
    seconds: f64,
    together: usize,
}

impl Chain {
    fn store_ops(&self) -> f64 {
        STORE_OPS
            .iter()
            .map(|k| self.per_handover.get(*k).unwrap_or(&0.0))
            .sum()
    }
}

pub fn figure(bench: &mut Bench) -> Figure {
    let (small, big) = bench.sizes.chains;
    let s = chain(bench, small);
    let b = chain(bench, big);
    let (ss, sb) = (Summary::of(&s.handovers_ms), Summary::of(&b.handovers_ms));
    let show = |x: Option<Summary>| {
        x.map_or("—".into(), |x| {
            format!(
                "p50 {:.2} ms, p99 {:.2} ms (min–max {:.2}–{:.2}, n={})",
                x.median, x.p99, x.min, x.max, x.n
            )
        })
    };
    let row = Row {
        leasewrap: show(sb),
        baseline: format!("leasewrap with {small} waiters: {}", show(ss)),
        ..Row::new(
            "waiters",
            format!("7. {big} waiters on one lease: handover"),
        )
        .with_ratio(ratio(sb.map(|x| x.median), ss.map(|x| x.median)))
        .set("p99_ms", sb.map(|x| x.p99))
        .set(
            "store_ops_ratio",
            ratio(Some(b.store_ops()), Some(s.store_ops())),
        )
    };
    Figure {
        rows: vec![row],
        notes: vec![counters(&s, &b, small, big)],
        ..Figure::default()
    }
}

fn counters(s: &Chain, b: &Chain, small: usize, big: usize) -> String {
    let keys: std::collections::BTreeSet<&String> =
        s.per_handover.keys().chain(b.per_handover.keys()).collect();
    let mut lines = vec![
        format!(
            "Requests per handover (etcd /metrics, deltas over the handover phase only, divided by \
             the number of handovers; keepalives of the queued waiters fall into the window, {:.1} s \
             for {big} handovers; handovers whose two events came in one wakeup: {} of {}). The \
             goal on the store's work compares the sum of {} per handover:",
            b.seconds,
            s.together + b.together,
            small + big,
            STORE_OPS.map(|k| format!("`{k}`")).join(", ")
        ),
        String::new(),
        format!("| etcd counter, per handover | {small} waiters | {big} waiters |"),
        "|---|---|---|".into(),
    ];
    for k in keys {
        let at = |c: &Chain| c.per_handover.get(k).copied().unwrap_or(0.0);
        lines.push(format!("| `{k}` | {:.2} | {:.2} |", at(s), at(b)));
    }
    lines.join("\n")
}

fn chain(bench: &mut Bench, waiters: usize) -> Chain {
    let name = format!("chain{waiters}");
    let fifo = Fifo::new(bench.path(&format!("fifo-{name}")));
    bench.events.reset();
    let argv = bench.argv(
        Tool::Leasewrap,
        &Lock::new(name.as_str()),
        &os(&[bench.child(Child::Chain).as_os_str(), fifo.0.as_os_str()]),
    );
    let first = bench.procs.spawn(&argv, "chain", None);
    bench.started(Child::Chain, &[first]);
    let mut pids = vec![first];
    while pids.len() <= waiters {
        let batch = BATCH.min(waiters + 1 - pids.len());
        pids.extend((0..batch).map(|_| bench.procs.spawn(&argv, "chain", None)));
        bench.wait_queued(Tool::Leasewrap, pids.len() - 1, &pids);
    }
    let before = bench.scrape();
    let began = Instant::now();
    let mut handovers_ms = Vec::new();
    let mut together = 0;
    for left in (0..waiters).rev() {
        handovers_ms.push(hand_on(bench, &fifo, &mut together));
        bench.wait_steady(left);
    }
    let seconds = began.elapsed().as_secs_f64();
    let after = bench.scrape();
    fifo.release(b"");
    bench.procs.finish(&pids, Duration::from_secs(30), 0);
    bench.sweep();
    let per_handover = after
        .counters_since(&before)
        .into_iter()
        .map(|(k, v)| (k, v / waiters as f64))
        .collect();
    Chain {
        handovers_ms,
        per_handover,
        seconds,
        together,
    }
}

/// Ends the holder's child and times the handover to the next, in ms.
fn hand_on(bench: &mut Bench, fifo: &Fifo, together: &mut usize) -> f64 {
    let holder_child = bench.only_runner(Child::Chain);
    let gap = exit_to_exec(bench, holder_child, (fifo, b""), Child::Chain);
    *together += usize::from(bench.events.together(EXIT, Child::Chain.label()));
    gap
}
