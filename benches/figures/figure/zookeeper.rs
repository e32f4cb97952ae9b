//! Figure 11: the ZooKeeper backend next to etcd's figures (issues 17 and 25), on a standalone
//! ZooKeeper 3.8 of the tests' harness (its settings, read back with `conf`, go in the notes):
//! - `-- true` uncontended, leasewrap on ZooKeeper against leasewrap on etcd, interleaved;
//! - the handover, exec to exit, as figure 3 measures it, on ZooKeeper and on etcd, interleaved;
//! - what holding asks of ZooKeeper: packets and transactions per second of one holder;
//! - peak RSS (VmHWM) of leasewrap + watchdog while the child runs, read after a renewal.

use std::ffi::OsString;
use std::thread;
use std::time::{Duration, Instant};

use super::handover::{exec_gap, Backend};
use super::whole_run::{alternate, Run};
use crate::bench::{os, Bench, Child, Lock, Tool, QUEUE_BOUND, START_BOUND};
use crate::procs::supervisor_hwm_kib;
use crate::report::{Figure, Row};
use crate::stats::{dist, median, ratio};
use crate::support::zookeeper::{self, Zk};

/// The session timeout asked of the holders whose cost and memory are read.
const TTL: u32 = 3;

/// How long one holder's requests are counted.
const COUNTED_FOR: Duration = Duration::from_secs(9);

/// How often ZooKeeper's four-letter words are asked again while waiting.
const LOOK: Duration = Duration::from_millis(5);

pub fn figure(bench: &mut Bench) -> Figure {
    let zk = Zk::start();
    bench.procs.spare(zk.pid().expect("ZooKeeper runs") as i32);
    let settings = settings(&zk);
    let true_row = true_row(bench, &zk);
    let handover = handover_row(bench, &zk);
    let (rss_row, packets_row, cost) = rss_and_cost(bench, &zk);
    Figure {
        rows: vec![true_row, handover, packets_row, rss_row],
        notes: vec![settings, cost],
        ..Figure::default()
    }
}

/// The server every row of the figure was measured against, as it reports itself.
fn settings(zk: &Zk) -> String {
    let conf = zk.four_letter("conf").expect("conf answers");
    let srvr = zk.srvr().expect("srvr answers");
    let version = srvr
        .lines()
        .find_map(|l| l.strip_prefix("Zookeeper version: "))
        .and_then(|v| v.split(['-', ',']).next())
        .unwrap_or("?");
    // What a standalone server's `conf` shows of the timing (syncLimit and initLimit only
    // matter, and show, in an ensemble).
    let keys = [
        "tickTime",
        "minSessionTimeout",
        "maxSessionTimeout",
        "maxClientCnxns",
    ];
    let found: Vec<String> = keys
        .iter()
        .map(|k| {
            let value = conf
                .lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='));
            format!("{k}={}", value.map_or("?", str::trim))
        })
        .collect();
    format!(
        "Figure 11's server: a standalone ZooKeeper {version} of the tests' harness \
         (tests/support/zookeeper.rs) on loopback, `conf`: {}; one JVM (-Xmx256m, serial GC), its \
         data dir on the same disk as the bench's temp dir, forceSync not set (ZooKeeper's \
         default: on). Every row of \
         the figure is against this one server, leasewrap on etcd against the etcd of figure 1, \
         interleaved in the same run.",
        found.join(", ")
    )
}

/// leasewrap's command line for `lock` on the ZooKeeper at `zk`: figure 1's, with
/// `--zookeeper CONNECT` instead of `--endpoints ENDPOINT`.
pub fn argv_zk(bench: &Bench, zk: &Zk, lock: &Lock, child: &[OsString]) -> Vec<OsString> {
    let mut argv = bench.argv(Tool::Leasewrap, lock, child);
    argv.splice(1..3, os(&["--zookeeper".to_owned(), zk.connect()]));
    argv
}

fn true_row(bench: &mut Bench, zk: &Zk) -> Row {
    let lock = Lock::new("zk-true");
    let on_zk = argv_zk(bench, zk, &lock, &os(&["true"]));
    let on_etcd = bench.argv(Tool::Leasewrap, &lock, &os(&["true"]));
    let runs: Vec<Run> = vec![
        ("leasewrap-zk", Box::new(|_| on_zk.clone())),
        ("leasewrap-etcd", Box::new(|_| on_etcd.clone())),
    ];
    let r = alternate(bench, &runs, bench.sizes.n);
    Row {
        leasewrap: dist(&r[0], "ms", 2),
        baseline: format!("leasewrap on etcd: {}", dist(&r[1], "ms", 2)),
        ..Row::new(
            "true-zk",
            "11. `-- true` uncontended, ZooKeeper (whole process)",
        )
        .with_ratio(ratio(median(&r[0]), median(&r[1])))
    }
}

/// Figure 3's exec-to-exit handover on ZooKeeper, and on etcd interleaved with it: the
/// holder's child (`cat FIFO`) exits, the waiter's child (`echo`) execs.
fn handover_row(bench: &mut Bench, zk: &Zk) -> Row {
    let mut gaps: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for i in 0..bench.sizes.n {
        let mut order = [Some(zk), None];
        if i % 2 == 1 {
            order.reverse();
        }
        for on in order {
            let gap = handover_once(bench, on, &format!("zk-ho{i}"));
            gaps[usize::from(on.is_none())].push(gap);
        }
    }
    let [on_zk, on_etcd] = &gaps;
    Row {
        leasewrap: dist(on_zk, "ms", 2),
        baseline: format!("leasewrap on etcd: {}", dist(on_etcd, "ms", 2)),
        ..Row::new(
            "handover-zk",
            "11. handover on ZooKeeper: holder's child exits → waiter's child execs",
        )
        .with_ratio(ratio(median(on_zk), median(on_etcd)))
        .set("median_ms", median(on_zk))
    }
}

/// One handover on the ZooKeeper `zk`, or on etcd when None; its exec-to-exit gap in ms.
fn handover_once(bench: &mut Bench, zk: Option<&Zk>, name: &str) -> f64 {
    let mut on = OnZk {
        zk,
        lock: Lock::new(name),
        watches: 0,
    };
    exec_gap(bench, &mut on, name)
}

/// ZooKeeper (or etcd, when None) for figure 3's measure, and the watches it had with the
/// holder alone.
struct OnZk<'a> {
    zk: Option<&'a Zk>,
    lock: Lock,
    watches: u64,
}

impl Backend for OnZk<'_> {
    fn argv(&self, bench: &Bench, child: &[OsString]) -> Vec<OsString> {
        match self.zk {
            Some(zk) => argv_zk(bench, zk, &self.lock, child),
            None => bench.argv(Tool::Leasewrap, &self.lock, child),
        }
    }

    fn holder_started(&mut self, _bench: &mut Bench) {
        if let Some(zk) = self.zk {
            self.watches = zookeeper::total_watches(zk.port()).expect("wchs answers");
        }
    }

    fn wait_queued(&mut self, bench: &mut Bench, pids: &[i32], _waiter_log: &str) {
        match self.zk {
            Some(zk) => wait_queued(zk, &self.lock.name, self.watches),
            None => bench.wait_queued(Tool::Leasewrap, 1, pids),
        }
    }
}

/// Waits until lease `name` has its holder's and one waiter's node, and the waiter's watch on
/// the node ahead is set (one watch more than with the holder alone).
#[track_caller]
fn wait_queued(zk: &Zk, name: &str, watches_before: u64) {
    let parent = format!("/leasewrap/{name}");
    let deadline = Instant::now() + QUEUE_BOUND;
    loop {
        let nodes = zookeeper::ephemerals_under(zk.port(), &parent).expect("dump answers");
        let watches = zookeeper::total_watches(zk.port()).expect("wchs answers");
        if nodes.len() == 2 && watches > watches_before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "ZooKeeper: {nodes:?} queued, {watches} watches, after {QUEUE_BOUND:?}"
        );
        thread::sleep(LOOK);
    }
}

/// One holder with `--ttl 3s`: its VmHWM (leasewrap + watchdog) once it has renewed, and what it
/// asked of ZooKeeper over `COUNTED_FOR`.
fn rss_and_cost(bench: &mut Bench, zk: &Zk) -> (Row, Row, String) {
    let mut hwm = Vec::new();
    let mut cost = Vec::new();
    for i in 0..bench.sizes.n_memory {
        let (mib, spent) = hold_and_read(bench, zk, &format!("zk-rss{i}"));
        hwm.push(mib);
        cost.push(spent);
    }
    let mib_in_mb = (1u64 << 20) as f64 / 1e6;
    let row = Row {
        leasewrap: dist(&hwm, "MiB", 1),
        ..Row::new(
            "rss-zk",
            "11. peak RSS (VmHWM), leasewrap + watchdog, ZooKeeper backend",
        )
        .set("median_mb", median(&hwm).map(|m| m * mib_in_mb))
    };
    let per_s = |f: fn(&Cost) -> f64| -> Vec<f64> {
        cost.iter()
            .map(|c| f(c) / COUNTED_FOR.as_secs_f64())
            .collect()
    };
    let packets = per_s(|c| c.packets);
    let packets_row = Row {
        leasewrap: dist(&packets, "packets/s", 2),
        ..Row::new(
            "packets-zk",
            format!(
                "11. one ZooKeeper holder, session timeout {TTL} s: packets the server received \
                 per second of holding (`mntr` zk_packets_received over {COUNTED_FOR:?})"
            ),
        )
        .set("median", median(&packets))
    };
    let note = format!(
        "What one ZooKeeper holder asks (session timeout {TTL} s, counted over {COUNTED_FOR:?} \
         of holding, no other client): packets received by the server {}, transactions (the \
         zxid's counter) {}. Every renewal is a read of the own node, a sync and a multi with a \
         check of it (docs/zookeeper.md §4.5), every TTL/4; the session pings only after a third of \
         the timeout with nothing sent.",
        dist(&packets, "/s", 2),
        dist(&per_s(|c| c.txns), "/s", 2)
    );
    (row, packets_row, note)
}

/// Packets and transactions ZooKeeper counted.
struct Cost {
    packets: f64,
    txns: f64,
}

impl Cost {
    fn of(zk: &Zk) -> Cost {
        let mntr = zookeeper::four_letter(zk.port(), "mntr").expect("mntr answers");
        let packets = mntr
            .lines()
            .find_map(|l| l.strip_prefix("zk_packets_received"));
        let srvr = zk.srvr().expect("srvr answers");
        let zxid = srvr.lines().find_map(|l| l.strip_prefix("Zxid: 0x"));
        Cost {
            packets: packets.and_then(|p| p.trim().parse().ok()).unwrap_or(0.0),
            txns: zxid.map_or(0.0, |z| {
                u64::from_str_radix(z.trim(), 16).unwrap_or(0) as f64
            }),
        }
    }
}

/// Holds `name` (child `Sleep`) until it renewed, reads its VmHWM, then counts `COUNTED_FOR` of
/// its requests.
fn hold_and_read(bench: &mut Bench, zk: &Zk, name: &str) -> (f64, Cost) {
    bench.events.reset();
    let child = os(&[bench.child(Child::Sleep).as_os_str(), "1000".as_ref()]);
    let argv = argv_zk(bench, zk, &Lock::new(name).ttl(TTL), &child);
    let pid = bench.procs.spawn(&argv, "zk-memory", None);
    let (started, child) = bench.started(Child::Sleep, &[pid]);
    // The first renewal is behind it once a request came after half the timeout: a point in the
    // scenario, as figure 6 reads etcd's holders.
    let after = started + Duration::from_secs(u64::from(TTL)) / 2;
    thread::sleep(after.saturating_duration_since(Instant::now()));
    let half = Cost::of(zk);
    while Cost::of(zk).packets <= half.packets {
        assert!(after.elapsed() < START_BOUND, "no request from the holder");
        thread::sleep(LOOK);
    }
    let kib = supervisor_hwm_kib(pid, child);
    let before = Cost::of(zk);
    thread::sleep(COUNTED_FOR);
    let now = Cost::of(zk);
    bench.sweep();
    let spent = Cost {
        packets: now.packets - before.packets,
        txns: now.txns - before.txns,
    };
    (kib as f64 / 1024.0, spent)
}
