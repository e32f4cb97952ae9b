//! Figure 6: peak RSS (VmHWM) and PSS (smaps_rollup) of leasewrap + its watchdog while the child
//! runs, against `etcdctl lock`, and on the local backend.
//!
//! On etcd the reading is taken once the holder has renewed: when the proxy sees a request later
//! than half the TTL after the child started (the second renewal; TTL/3 apart), the first renewal
//! with its replies is behind it. The local backend does not renew: its reading follows the start.

use std::thread;
use std::time::{Duration, Instant};

use crate::bench::{os, Bench, Child, Lock, Tool, START_BOUND};
use crate::procs::{children, kb_field};
use crate::report::{Figure, Row};
use crate::stats::{dist, median, ratio};

const TTL: u32 = 3;

/// How often the proxy's request stamps are looked at.
const LOOK: Duration = Duration::from_millis(10);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    Leasewrap,
    Etcdctl,
    LeasewrapLocal,
}

/// One reading, MiB.
struct Reading {
    /// VmHWM of each process: leasewrap then its watchdog, or etcdctl alone.
    hwm: Vec<f64>,
    /// Pss of the same processes.
    pss: Vec<f64>,
}

impl Reading {
    fn hwm(&self) -> f64 {
        self.hwm.iter().sum()
    }
    fn pss(&self) -> f64 {
        self.pss.iter().sum()
    }
}

pub fn figure(bench: &mut Bench) -> Figure {
    bench.local_dir("local-rss");
    let mut r: [Vec<Reading>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for i in 0..bench.sizes.n_memory {
        let all = [Who::Leasewrap, Who::Etcdctl, Who::LeasewrapLocal];
        for (k, who) in all.into_iter().enumerate() {
            r[k].push(once(bench, who, &format!("rss{i}")));
        }
    }
    let [lw, ec, local] = &r;
    let mib_in_mb = (1u64 << 20) as f64 / 1e6;
    let row = |id, title: &str, of: fn(&Reading) -> f64| {
        let (a, b) = (of_all(lw, of), of_all(ec, of));
        Row {
            leasewrap: dist(&a, "MiB", 1),
            baseline: format!("etcdctl lock: {}", dist(&b, "MiB", 1)),
            ..Row::new(id, title).with_ratio(ratio(median(&a), median(&b)))
        }
    };
    let rss = row(
        "rss",
        "6. peak RSS (VmHWM), leasewrap + watchdog, etcd backend",
        Reading::hwm,
    );
    let median_mb = median(&of_all(lw, Reading::hwm)).map(|m| m * mib_in_mb);
    let pss = row(
        "pss",
        "6. PSS (smaps_rollup), leasewrap + watchdog, etcd backend",
        Reading::pss,
    );
    Figure {
        rows: vec![rss.set("median_mb", median_mb), pss],
        notes: vec![note(lw, local)],
        ..Figure::default()
    }
}

fn of_all(readings: &[Reading], of: fn(&Reading) -> f64) -> Vec<f64> {
    readings.iter().map(of).collect()
}

fn note(lw: &[Reading], local: &[Reading]) -> String {
    let pairs = |of: fn(&Reading) -> &Vec<f64>| {
        let each = lw.iter().map(|r| {
            let parts: Vec<String> = of(r).iter().map(|x| format!("{x:.1}")).collect();
            format!("({})", parts.join(", "))
        });
        each.collect::<Vec<_>>().join(", ")
    };
    format!(
        "Split (leasewrap, watchdog) in MiB, VmHWM: {}; PSS: {}. Local backend, leasewrap + \
         watchdog: VmHWM {}, PSS {}. VmHWM counts the pages of the binary and of libc in both \
         processes; PSS (Pss of /proc/PID/smaps_rollup, summed, read at the same instant) counts \
         each shared page once, split between the processes that map it. Read with TTL {TTL} s \
         once the holder had renewed (etcd) or its child had started (local).",
        pairs(|r| &r.hwm),
        pairs(|r| &r.pss),
        dist(&of_all(local, Reading::hwm), "MiB", 1),
        dist(&of_all(local, Reading::pss), "MiB", 1)
    )
}

fn once(bench: &mut Bench, who: Who, name: &str) -> Reading {
    bench.events.reset();
    bench.proxy.clear_requests();
    let child = os(&[bench.child(Child::Sleep).as_os_str(), "1000".as_ref()]);
    let lock = Lock::new(name).ttl(TTL).via(bench.proxy.endpoint());
    let argv = match who {
        Who::Leasewrap => bench.argv(Tool::Leasewrap, &lock, &child),
        Who::Etcdctl => bench.argv(Tool::Etcdctl, &lock, &child),
        Who::LeasewrapLocal => bench.argv_local(&lock, &bench.path("local-rss"), &child),
    };
    let pid = bench.procs.spawn(&argv, "memory", None);
    let (started, child) = bench.started(Child::Sleep, &[pid]);
    if who != Who::LeasewrapLocal {
        wait_renewed(bench, started);
    }
    let mut pids = vec![pid];
    if who != Who::Etcdctl {
        pids.extend(children(pid).into_iter().filter(|&c| c != child));
        assert_eq!(
            pids.len(),
            2,
            "leasewrap {pid}: expected one watchdog, children {:?}",
            children(pid)
        );
    }
    let mib = |kb: u64| kb as f64 / 1024.0;
    let reading = Reading {
        hwm: pids
            .iter()
            .map(|p| mib(kb_field(&format!("/proc/{p}/status"), "VmHWM")))
            .collect(),
        pss: pids
            .iter()
            .map(|p| mib(kb_field(&format!("/proc/{p}/smaps_rollup"), "Pss")))
            .collect(),
    };
    bench.sweep();
    reading
}

/// Waits for a request later than TTL/2 after `started`: the second renewal.
#[track_caller]
fn wait_renewed(bench: &Bench, started: Instant) {
    let after = started + Duration::from_secs(u64::from(TTL)) / 2;
    let deadline = after + START_BOUND;
    while !bench.proxy.requests().iter().any(|t| *t > after) {
        assert!(
            Instant::now() < deadline,
            "no renewal within {START_BOUND:?}"
        );
        thread::sleep(LOOK);
    }
}
