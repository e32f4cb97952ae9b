//! Figure 8: 500 leases held at once on one etcd (default TTL 10 s): the CPU each costs, and
//! what one renewal asks of etcd (its /metrics over the same window, per LeaseKeepAlive).
//!
//! CPU is the run time of every thread of every leasewrap and watchdog (schedstat, ns) over a
//! fixed window that begins once every lease runs its child and has opened its keepalive stream
//! (etcd counts the streams started); etcd's is utime + stime in ticks.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::bench::{os, Bench, Child, Lock, Tool};
use crate::procs::{children, cpu_ns, cpu_ticks, pids_running};
use crate::prom::Scrape;
use crate::report::{Figure, Row};

/// Leases started before the harness waits for their children.
const BATCH: usize = 25;

/// How often the harness counts the started children.
const LOOK: Duration = Duration::from_millis(50);

/// How long one batch may take to start.
const BATCH_BOUND: Duration = Duration::from_secs(60);

const KEEPALIVE: &str = "msg_received[LeaseKeepAlive]";
const STREAMS: &str = "started[LeaseKeepAlive]";

/// How long the leases may take to open their keepalive streams (the first renewal, TTL/3).
const STREAM_BOUND: Duration = Duration::from_secs(30);

/// How often etcd's counters are read while the streams open.
const SCRAPE_EVERY: Duration = Duration::from_millis(100);

/// What the window measured.
struct Window {
    secs: f64,
    /// CPU seconds of the leasewraps, and of their watchdogs.
    leasewrap: f64,
    watchdogs: f64,
    threads: usize,
    /// etcd's CPU seconds.
    etcd: f64,
    /// etcd's counters over the window.
    counters: BTreeMap<String, f64>,
}

pub fn figure(bench: &mut Bench) -> Figure {
    let count = bench.sizes.leases;
    bench.events.reset();
    let began = Instant::now();
    let opened = bench.scrape();
    let pids = start(bench, count);
    wait_streams(bench, &opened, count);
    let startup = began.elapsed().as_secs_f64();
    let watchdogs = watchdogs(bench, &pids);
    let w = measure(bench, &pids, &watchdogs);
    bench.sweep();
    let per_lease = (w.leasewrap + w.watchdogs) / count as f64 / w.secs * 100.0;
    let row = Row {
        leasewrap: format!(
            "{per_lease:.4} % of a core (leasewrap {:.0} ms + watchdogs {:.0} ms of CPU over {:.1} s)",
            w.leasewrap * 1e3,
            w.watchdogs * 1e3,
            w.secs
        ),
        baseline: format!("etcd: {:.1} % of a core", w.etcd / w.secs * 100.0),
        ..Row::new("many", format!("8. {count} leases held at once on one etcd: CPU per lease"))
            .set("per_lease_pct", Some(per_lease))
    };
    let how = format!(
        "{count} leases: starting them (batches of {BATCH}, each waiting for its children) took \
         {startup:.1} s, until etcd had started a keepalive stream for each; leasewrap CPU is the \
         run time in /proc/PID/task/TID/schedstat (ns), summed over all {} leasewrap and {} \
         watchdog processes ({} threads), default TTL 10 s; etcd's is utime+stime from \
         /proc/PID/stat (tick {:.0} ms).",
        pids.len(),
        watchdogs.len(),
        w.threads,
        1e3 / tick()
    );
    let (renewal_row, renewal_note) = per_renewal(&w.counters, count, w.secs);
    Figure {
        rows: vec![row, renewal_row],
        notes: vec![how, renewal_note],
        ..Figure::default()
    }
}

/// CPU of `pids` and `watchdogs`, and etcd's CPU and counters, over `bench.sizes.window`.
fn measure(bench: &Bench, pids: &[i32], watchdogs: &[i32]) -> Window {
    let watched: Vec<i32> = pids.iter().chain(watchdogs).copied().collect();
    let etcd = bench.etcd.pid().expect("etcd runs") as i32;
    let counters = bench.scrape();
    let before: Vec<_> = watched.iter().map(|&p| cpu_ns(p)).collect();
    let etcd_before = cpu_ticks(etcd);
    let t0 = Instant::now();
    thread::sleep(bench.sizes.window); // the measuring window itself
    let after: Vec<_> = watched.iter().map(|&p| cpu_ns(p)).collect();
    let etcd_after = cpu_ticks(etcd);
    let secs = t0.elapsed().as_secs_f64();
    let counters = bench.scrape().counters_since(&counters);
    let mut cpu = [0.0f64; 2];
    let mut threads = 0;
    for (i, (a, b)) in before.iter().zip(&after).enumerate() {
        let (Some((a, ta)), Some((b, tb))) = (a, b) else {
            panic!("a leasewrap or watchdog ended during the window");
        };
        let lost = "a thread came or went during the window: its time would be lost";
        assert_eq!(ta, tb, "{lost}");
        cpu[usize::from(i >= pids.len())] += (b - a) as f64 / 1e9;
        threads += ta;
    }
    let etcd_ticks = etcd_after.zip(etcd_before).map(|(b, a)| b - a);
    Window {
        secs,
        leasewrap: cpu[0],
        watchdogs: cpu[1],
        threads,
        etcd: etcd_ticks.map_or(f64::NAN, |t| t as f64 / tick()),
        counters,
    }
}

/// Clock ticks per second of /proc/PID/stat.
fn tick() -> f64 {
    // SAFETY: sysconf takes a name and returns a number.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// Requests per renewal: every counter's change over the window, per LeaseKeepAlive received.
fn per_renewal(delta: &BTreeMap<String, f64>, count: usize, secs: f64) -> (Row, String) {
    let renewals = delta.get(KEEPALIVE).copied().unwrap_or(0.0);
    let requests: f64 = delta
        .iter()
        .filter(|(k, _)| k.starts_with("msg_received["))
        .map(|(_, v)| v)
        .sum();
    let per = (renewals > 0.0).then(|| requests / renewals);
    let row = Row {
        leasewrap: per.map_or("—".into(), |p| {
            format!("{p:.2} gRPC requests per renewal ({renewals:.0} renewals)")
        }),
        ..Row::new(
            "renewal",
            format!("8. requests per renewal, {count} leases held (etcd /metrics)"),
        )
        .set("requests_per_renewal", per)
    };
    let mut lines = vec![
        format!(
            "What a renewal asks of etcd: each counter's change over the {secs:.1} s window of the \
             {count} held leases, divided by the LeaseKeepAlive messages etcd received in it:"
        ),
        String::new(),
        "| etcd counter | per renewal |".into(),
        "|---|---|".into(),
    ];
    for (k, v) in delta {
        lines.push(format!("| `{k}` | {:.2} |", v / renewals.max(1.0)));
    }
    (row, lines.join("\n"))
}

/// Waits until etcd has started `count` keepalive streams since `before`.
fn wait_streams(bench: &Bench, before: &Scrape, count: usize) {
    let deadline = Instant::now() + STREAM_BOUND;
    loop {
        let delta = bench.scrape().counters_since(before);
        let streams = delta.get(STREAMS).copied().unwrap_or(0.0);
        if streams >= count as f64 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "many: {streams} keepalive streams, not {count}, after {STREAM_BOUND:?}"
        );
        thread::sleep(SCRAPE_EVERY);
    }
}

fn start(bench: &mut Bench, count: usize) -> Vec<i32> {
    let sleep = os(&[bench.child(Child::Sleep).as_os_str(), "3600".as_ref()]);
    let mut pids = Vec::new();
    while pids.len() < count {
        let batch = BATCH.min(count - pids.len());
        for _ in 0..batch {
            let lock = Lock::new(format!("many{}", pids.len()));
            pids.push(
                bench
                    .procs
                    .spawn(&bench.argv(Tool::Leasewrap, &lock, &sleep), "many", None),
            );
        }
        // inotify merges identical events that queue up: count the children in /proc instead
        let deadline = Instant::now() + BATCH_BOUND;
        while pids_running(&bench.child(Child::Sleep)).len() < pids.len() {
            assert!(
                Instant::now() < deadline,
                "many: not {} children after {BATCH_BOUND:?}",
                pids.len()
            );
            thread::sleep(LOOK);
        }
    }
    pids
}

/// The one watchdog of each leasewrap (its child that runs the leasewrap binary).
fn watchdogs(bench: &Bench, pids: &[i32]) -> Vec<i32> {
    let child = bench.child(Child::Sleep);
    pids.iter()
        .map(|&pid| {
            let not_child =
                |c: &i32| std::fs::read_link(format!("/proc/{c}/exe")).is_ok_and(|e| e != child);
            match children(pid)
                .into_iter()
                .filter(not_child)
                .collect::<Vec<_>>()[..]
            {
                [wd] => wd,
                ref other => panic!("many: leasewrap {pid} has children {other:?}"),
            }
        })
        .collect()
}
