//! Figure 3: the handover from a holder to its one queued waiter, for both tools, interleaved,
//! measured two ways in the same run:
//! - exec to exit: from the holder's child's exit (its pidfd turns readable) to the waiter's
//!   child's execve (inotify IN_OPEN on its binary);
//! - write to write: from the holder's child's last write to the waiter's child's first write
//!   (IN_MODIFY on the files their stdout goes to).

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::path::Path;

use crate::bench::{os, Bench, Child, Fifo, Lock, Tool, START_BOUND};
use crate::report::{Figure, Row};
use crate::stats::{dist, median, ratio};

const EXIT: &str = "exit";
const LAST_WRITE: &str = "last-write";
const FIRST_WRITE: &str = "first-write";

/// One handover, in ms.
struct Gaps {
    exec: f64,
    write: f64,
    /// Holder's child: its last write to its exit.
    write_to_exit: f64,
    /// Waiter's child: its exec to its first write.
    exec_to_write: f64,
}

/// Per tool: every handover, and how many had two events stamped by one wakeup.
#[derive(Default)]
struct Series {
    gaps: Vec<Gaps>,
    together: usize,
}

impl Series {
    fn of(&self, f: impl Fn(&Gaps) -> f64) -> Vec<f64> {
        self.gaps.iter().map(f).collect()
    }
}

pub fn figure(bench: &mut Bench) -> Figure {
    let hold_out = bench.path("hold.out");
    let next_out = bench.path("next.out");
    for path in [&hold_out, &next_out] {
        File::create(path).expect("create a child's output file");
    }
    bench.events.watch_write(&hold_out, LAST_WRITE);
    bench.events.watch_write(&next_out, FIRST_WRITE);
    let mut series = [Series::default(), Series::default()];
    for i in 0..bench.sizes.n {
        for tool in Tool::interleaved(i) {
            let s = &mut series[tool as usize];
            let gaps = once(bench, tool, &format!("ho{i}"), s);
            s.gaps.push(gaps);
        }
    }
    let [lw, ec] = &series;
    let exec = |s: &Series| s.of(|g| g.exec);
    let write = |s: &Series| s.of(|g| g.write);
    let exec_row = Row {
        leasewrap: dist(&exec(lw), "ms", 2),
        baseline: format!("etcdctl lock: {}", dist(&exec(ec), "ms", 2)),
        ..Row::new(
            "handover-exec",
            "3. handover: holder's child exits → waiter's child execs",
        )
        .with_ratio(ratio(median(&exec(lw)), median(&exec(ec))))
        .set("median_ms", median(&exec(lw)))
    };
    let write_row = Row {
        leasewrap: dist(&write(lw), "ms", 2),
        baseline: format!("etcdctl lock: {}", dist(&write(ec), "ms", 2)),
        ..Row::new(
            "handover-write",
            "3. handover: holder's child's last write → waiter's child's first write",
        )
        .with_ratio(ratio(median(&write(lw)), median(&write(ec))))
    };
    Figure {
        rows: vec![exec_row, write_row],
        notes: vec![how(lw, ec, bench.sizes.n)],
        ..Figure::default()
    }
}

/// A piece of a handover, and how to get it from one handover's gaps.
type Piece = (&'static str, fn(&Gaps) -> f64);

fn how(lw: &Series, ec: &Series, n: usize) -> String {
    let med = |s: &Series, f: fn(&Gaps) -> f64| {
        median(&s.of(f)).map_or("—".into(), |m| format!("{m:.2} ms"))
    };
    let pieces: [Piece; 4] = [
        ("holder's child's last write → its exit", |g| {
            g.write_to_exit
        }),
        (
            "holder's child's exit → waiter's child's execve (exec to exit)",
            |g| g.exec,
        ),
        ("waiter's child's execve → its first write", |g| {
            g.exec_to_write
        }),
        ("last write → first write (write to write)", |g| g.write),
    ];
    let mut lines = vec![
        format!(
            "Handover, both measures from the same {n} handovers per tool. Exec to exit: from the \
             holder's child's exit (its pidfd turns readable) to the waiter's child's execve \
             (inotify IN_OPEN on its binary). Write to write: from the holder's child's last write \
             (it is `cat` of a FIFO: the harness writes one line, then closes it) to the waiter's \
             child's first write (`echo`), both seen as IN_MODIFY on the file its stdout goes to. \
             Every instant is stamped when the harness wakes in poll(); handovers with two \
             successive events stamped by one wakeup (that gap then counts as 0): leasewrap {}, \
             etcdctl {}. The pieces, medians of each:",
            lw.together, ec.together
        ),
        String::new(),
        "| piece of the handover | leasewrap | etcdctl lock |".into(),
        "|---|---|---|".into(),
    ];
    for (what, f) in pieces {
        lines.push(format!("| {what} | {} | {} |", med(lw, f), med(ec, f)));
    }
    lines.join("\n")
}

fn once(bench: &mut Bench, tool: Tool, name: &str, series: &mut Series) -> Gaps {
    let fifo = Fifo::new(bench.path(&format!("fifo-{name}")));
    bench.events.reset();
    let log = format!("{}-handover", tool.name());
    let lock = Lock::new(name);
    let hold = bench.argv(
        tool,
        &lock,
        &os(&[bench.child(Child::Hold).as_os_str(), fifo.0.as_os_str()]),
    );
    let holder = bench
        .procs
        .spawn(&hold, &log, Some(append(&bench.path("hold.out"))));
    let (_, child) = bench.started(Child::Hold, &[holder]);
    let next = bench.argv(
        tool,
        &lock,
        &os(&[bench.child(Child::Next).as_os_str(), "first".as_ref()]),
    );
    let waiter = bench
        .procs
        .spawn(&next, &log, Some(append(&bench.path("next.out"))));
    bench.wait_queued(tool, 1, &[holder, waiter]);
    bench.events.watch_exit(child, EXIT);
    fifo.release(b"x\n");
    let labels = [LAST_WRITE, EXIT, Child::Next.label(), FIRST_WRITE];
    let got = bench.events.wait_all(&labels, START_BOUND);
    assert_eq!(
        got.len(),
        labels.len(),
        "{} handover {name}: saw only {:?}",
        tool.name(),
        got.keys()
    );
    let chain = [LAST_WRITE, EXIT, Child::Next.label(), FIRST_WRITE];
    if chain.windows(2).any(|w| bench.events.together(w[0], w[1])) {
        series.together += 1;
    }
    bench.procs.finish(&[holder, waiter], START_BOUND, 0);
    bench.sweep();
    let ms = |a: &str, b: &str| got[b].duration_since(got[a]).as_secs_f64() * 1e3;
    Gaps {
        exec: ms(EXIT, Child::Next.label()),
        write: ms(LAST_WRITE, FIRST_WRITE),
        write_to_exit: ms(LAST_WRITE, EXIT),
        exec_to_write: ms(Child::Next.label(), FIRST_WRITE),
    }
}

fn append(path: &Path) -> File {
    let file = OpenOptions::new().append(true).open(path);
    file.unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// A backend figure 3's exec-to-exit measure runs on: how its leasewrap's command line reads,
/// and when its waiter is queued.
pub trait Backend {
    /// The command line of a leasewrap on it running `child`.
    fn argv(&self, bench: &Bench, child: &[OsString]) -> Vec<OsString>;

    /// Called once the holder's child runs, before the waiter starts.
    fn holder_started(&mut self, _bench: &mut Bench) {}

    /// Returns once the waiter (whose stderr goes to `waiter_log`) waits for the lease; `pids`
    /// are both supervisors'.
    fn wait_queued(&mut self, bench: &mut Bench, pids: &[i32], waiter_log: &str);
}

/// Figure 3's exec-to-exit measure of one handover on `on`: a holder running `cat FIFO` and a
/// waiter running `echo`, released once the waiter is queued; in ms.
pub fn exec_gap(bench: &mut Bench, on: &mut dyn Backend, label: &str) -> f64 {
    let fifo = Fifo::new(bench.path(&format!("fifo-{label}")));
    bench.events.reset();
    let hold = os(&[bench.child(Child::Hold).as_os_str(), fifo.0.as_os_str()]);
    let holder = bench
        .procs
        .spawn(&on.argv(bench, &hold), &format!("{label}-holder"), None);
    let (_, child) = bench.started(Child::Hold, &[holder]);
    on.holder_started(bench);
    let next = os(&[bench.child(Child::Next).as_os_str(), "first".as_ref()]);
    let waiter_log = format!("{label}-waiter");
    let waiter = bench.procs.spawn(&on.argv(bench, &next), &waiter_log, None);
    on.wait_queued(bench, &[holder, waiter], &waiter_log);
    let gap = exit_to_exec(bench, child, (&fifo, b"x\n"), Child::Next);
    bench.procs.finish(&[holder, waiter], START_BOUND, 0);
    bench.sweep();
    gap
}

/// Ends the holder's child `child` (`cat FIFO`) by writing `line` to the FIFO and closing it,
/// and times its exit (label `exit`) to the exec of `next`, in ms.
pub fn exit_to_exec(
    bench: &mut Bench,
    child: i32,
    (fifo, line): (&Fifo, &[u8]),
    next: Child,
) -> f64 {
    bench.events.watch_exit(child, EXIT);
    fifo.release(line);
    let got = bench.events.wait_all(&[EXIT, next.label()], START_BOUND);
    assert_eq!(got.len(), 2, "handover: saw only {:?}", got.keys());
    let gap = got[next.label()].duration_since(got[EXIT]);
    gap.as_secs_f64() * 1e3
}
