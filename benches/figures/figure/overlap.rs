//! Figure 5: overlap of the old and the new holder's children while the holder is SIGSTOPped
//! (leasewrap alone, not its watchdog; etcdctl itself) or partitioned from etcd (the proxy passes
//! no byte) for 2 × TTL, TTL 2 s, both tools interleaved.
//!
//! The fault begins as soon as the waiter is queued; the harness waits for the new child and the
//! old child's exit, bounded by the fault's length, heals, waits up to `AFTER_HEAL` more, and
//! kills both: an old child still running then has an overlap that was cut short, not bounded.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::bench::{Bench, Child, Pair, Tool};
use crate::report::{Figure, Row};
use crate::stats::dist;
use crate::support::proxy::Mode;

const TTL: u32 = 2;
const OLD_EXIT: &str = "old-exit";
/// How long the harness still watches once the fault has ended.
const AFTER_HEAL: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    Stop,
    Partition,
}

/// One run, in seconds from the start of the fault.
struct Run {
    overlap: f64,
    /// The old child was still running when the harness killed it.
    unbounded: bool,
    new_started: Option<f64>,
    old_killed: Option<f64>,
    holder_exit: Option<i32>,
}

pub fn figure(bench: &mut Bench) -> Figure {
    let mut figure = Figure::default();
    for fault in [Fault::Stop, Fault::Partition] {
        let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
        for i in 0..bench.sizes.n_overlap {
            for tool in Tool::interleaved(i) {
                let name = format!("ov{}{i}", fault.short());
                runs[tool as usize].push(once(bench, tool, &name, fault));
            }
        }
        let [lw, ec] = &runs;
        let worst = lw.iter().map(|r| r.overlap * 1e3).fold(0.0, f64::max);
        let row = Row {
            leasewrap: show(lw),
            baseline: format!("etcdctl lock: {}", show(ec)),
            ..Row::new(
                fault.row(),
                format!(
                    "5. overlap of old and new child, {}, TTL {TTL} s",
                    fault.what()
                ),
            )
            .set("worst_ms", (!lw.is_empty()).then_some(worst))
        };
        figure.rows.push(row);
        figure.notes.push(note(fault, lw, ec));
    }
    figure
}

impl Fault {
    fn short(self) -> &'static str {
        match self {
            Fault::Stop => "stop",
            Fault::Partition => "part",
        }
    }

    fn row(self) -> &'static str {
        match self {
            Fault::Stop => "overlap-stop",
            Fault::Partition => "overlap-partition",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Fault::Stop => {
                "holder SIGSTOPped for 2 × TTL (leasewrap only, not its watchdog; etcdctl itself)"
            }
            Fault::Partition => {
                "holder partitioned from etcd for 2 × TTL (the proxy passes no byte)"
            }
        }
    }

    fn begin(self, bench: &Bench, holder: i32) {
        match self {
            Fault::Stop => kill(Pid::from_raw(holder), Signal::SIGSTOP).expect("SIGSTOP"),
            Fault::Partition => bench.proxy.set_mode(Mode::Blackhole),
        }
    }

    fn end(self, bench: &Bench, holder: i32) {
        match self {
            Fault::Stop => kill(Pid::from_raw(holder), Signal::SIGCONT).expect("SIGCONT"),
            Fault::Partition => bench.proxy.set_mode(Mode::Pass),
        }
    }
}

fn show(runs: &[Run]) -> String {
    let worst = runs.iter().map(|r| r.overlap * 1e3).fold(0.0, f64::max);
    let unbounded = runs.iter().filter(|r| r.unbounded).count();
    if unbounded > 0 {
        format!(
            "old child never killed in {unbounded}/{} runs: overlap ≥ {worst:.0} ms, cut short when \
             the harness killed both {:.0} s after the fault ended",
            runs.len(),
            AFTER_HEAL.as_secs_f64()
        )
    } else {
        format!("max {worst:.0} ms over {} runs", runs.len())
    }
}

fn note(fault: Fault, lw: &[Run], ec: &[Run]) -> String {
    let of = |rs: &[Run], f: fn(&Run) -> Option<f64>| {
        dist(&rs.iter().filter_map(f).collect::<Vec<_>>(), "s", 3)
    };
    let codes = |rs: &[Run]| format!("{:?}", rs.iter().map(|r| r.holder_exit).collect::<Vec<_>>());
    format!(
        "{}: leasewrap's old child was killed {} after the fault began, the new child started {} \
         after it; leasewrap holder exit codes {}; etcdctl's new child started {} after the fault, \
         etcdctl holder exit codes {} (None: still running when the harness killed it).",
        if fault == Fault::Stop {
            "SIGSTOP"
        } else {
            "partition"
        },
        of(lw, |r| r.old_killed),
        of(lw, |r| r.new_started),
        codes(lw),
        of(ec, |r| r.new_started),
        codes(ec)
    )
}

fn once(bench: &mut Bench, tool: Tool, name: &str, fault: Fault) -> Run {
    bench.events.reset();
    let log = format!("{}-overlap", tool.name());
    let Pair {
        holder,
        child,
        started: _,
    } = bench.hold_and_queue(tool, name, TTL, &log);
    bench.events.watch_exit(child, OLD_EXIT);
    let labels = [Child::WaiterSleep.label(), OLD_EXIT];
    let began = Instant::now();
    fault.begin(bench, holder);
    let mut got = bench
        .events
        .wait_all(&labels, Duration::from_secs(u64::from(2 * TTL)));
    fault.end(bench, holder);
    let missing: Vec<&'static str> = labels
        .into_iter()
        .filter(|l| !got.contains_key(l))
        .collect();
    got.extend(bench.events.wait_all(&missing, AFTER_HEAL));
    let ended = Instant::now();
    let holder_exit = bench.procs.wait(holder, Duration::from_secs(3));
    bench.sweep();
    let since = |t: Instant| t.duration_since(began).as_secs_f64();
    let new = got.get(Child::WaiterSleep.label()).copied();
    let old = got.get(OLD_EXIT).copied();
    let overlap = new.map_or(0.0, |n| {
        old.unwrap_or(ended)
            .saturating_duration_since(n)
            .as_secs_f64()
    });
    Run {
        overlap,
        unbounded: new.is_some() && old.is_none(),
        new_started: new.map(since),
        old_killed: old.map(since),
        holder_exit,
    }
}
