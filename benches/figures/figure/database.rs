//! Figure 13: the database lease (issue 33) next to leasewrap on etcd, on servers figure 10
//! starts (fence and lease installed, the user `bench_job` tied to `bench`), each on its Unix
//! socket, and PgBouncer in transaction pooling mode in front of the PostgreSQL:
//! - `-- true` uncontended on PostgreSQL, through PgBouncer and on MariaDB, against leasewrap on
//!   etcd, the four interleaved;
//! - figure 3's exec-to-exit handover on PostgreSQL and on MariaDB, interleaved with etcd's;
//! - peak RSS (VmHWM) of leasewrap + watchdog holding a lease on each, read after a renewal.

use std::ffi::OsString;
use std::thread;
use std::time::{Duration, Instant};

use super::fence_sql::{Maria, Pg};
use super::handover::{exec_gap, Backend};
use super::whole_run::{alternate, Run};
use crate::bench::{os, Bench, Child, Lock, Tool, QUEUE_BOUND, START_BOUND};
use crate::procs::supervisor_hwm_kib;
use crate::report::{Figure, Row};
use crate::stats::{dist, median, ratio};
use crate::support::pgbouncer::PgBouncer;

const NOTE: &str =
    "Figure 13 (the database lease, issue 33): as a user tied to `bench`, on figure \
    10's servers (PostgreSQL 15 with fsync=off, trust authentication; MariaDB 10.11 with \
    innodb_flush_log_at_trx_commit=0, no password), each on its Unix socket, and PgBouncer \
    (pool_mode = transaction, trust, on loopback TCP) in front of the PostgreSQL. `-- true`: \
    whole runs of `leasewrap --database URL --name bench -- true`, interleaved with leasewrap on \
    figure 1's etcd: one connection, the installed SQL's version check, a read, the take and \
    the release. Handover: figure 3's exec to exit, the waiter queued once it logged that it \
    waits (`-v`); on PostgreSQL it is woken by NOTIFY, on MariaDB by the holder's named lock \
    (through PgBouncer a waiter polls: not measured). Peak RSS: one holder, `--ttl 3s`, read \
    once the row's version shows a renewal.";

/// The lease TTL of the holders whose memory is read.
const TTL: u32 = 3;

/// How often the row is read again while waiting for a renewal, or a waiter's log.
const LOOK: Duration = Duration::from_millis(2);

pub fn figure(bench: &mut Bench) -> Figure {
    let pg = Pg::start();
    let maria = Maria::start();
    let bouncer = PgBouncer::transaction_mode(&pg.pg, &["bench_job"]);
    bench.procs.spare_every_descendant();
    let pg_url = format!(
        "postgresql://bench_job@/{}?host={}&port={}",
        pg.db,
        encode(&pg.pg.socket_dir().display().to_string()),
        pg.pg.port()
    );
    let bouncer_url = format!(
        "postgresql://bench_job@127.0.0.1:{}/{}",
        bouncer.port(),
        pg.db
    );
    let maria_url = format!(
        "mariadb://bench_job@/?socket={}",
        encode(&maria.server.socket().display().to_string())
    );
    let mut rows = true_rows(bench, &[&pg_url, &bouncer_url, &maria_url]);
    rows.extend(handover_rows(bench, &pg_url, &maria_url));
    let pg_version = || {
        let sql = "SELECT version FROM leasewrap_data.lease WHERE name = 'bench'";
        pg.pg.psql_ok(&pg.db, sql)
    };
    let maria_version = || {
        let sql = "SELECT version FROM leasewrap.lease WHERE name = 'bench'";
        maria.server.sql_ok("", sql)
    };
    rows.push(rss_row(bench, Server::Pg, &pg_url, &pg_version));
    rows.push(rss_row(bench, Server::Maria, &maria_url, &maria_version));
    Figure {
        rows,
        notes: vec![NOTE.into()],
        ..Figure::default()
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Server {
    Pg,
    Maria,
}

impl Server {
    /// The ids of its handover and memory rows.
    fn ids(self) -> [&'static str; 2] {
        match self {
            Server::Pg => ["handover-pg", "rss-pg"],
            Server::Maria => ["handover-mariadb", "rss-mariadb"],
        }
    }

    fn title(self) -> &'static str {
        match self {
            Server::Pg => "PostgreSQL",
            Server::Maria => "MariaDB",
        }
    }
}

/// leasewrap's command line on the database `url` (on etcd when None), for `lock`.
fn argv_on(bench: &Bench, url: Option<&str>, lock: &Lock, child: &[OsString]) -> Vec<OsString> {
    let mut argv = bench.argv(Tool::Leasewrap, lock, child);
    if let Some(url) = url {
        argv.splice(1..3, os(&["--database", url]));
    }
    argv
}

/// `-- true` on PostgreSQL, through PgBouncer and on MariaDB (`urls` in that order), each
/// against leasewrap on etcd, the four interleaved.
fn true_rows(bench: &mut Bench, urls: &[&str; 3]) -> Vec<Row> {
    let lock = Lock::new("bench");
    let [on_pg, on_bouncer, on_maria] =
        urls.map(|url| argv_on(bench, Some(url), &lock, &os(&["true"])));
    let on_etcd = argv_on(bench, None, &lock, &os(&["true"]));
    let runs: Vec<Run> = vec![
        ("leasewrap-pg", Box::new(|_| on_pg.clone())),
        ("leasewrap-pgbouncer", Box::new(|_| on_bouncer.clone())),
        ("leasewrap-mariadb", Box::new(|_| on_maria.clone())),
        ("leasewrap-etcd", Box::new(|_| on_etcd.clone())),
    ];
    let r = alternate(bench, &runs, bench.sizes.n);
    let row = |samples: &[f64], id: &'static str, on: &str| Row {
        leasewrap: dist(samples, "ms", 2),
        baseline: format!("leasewrap on etcd: {}", dist(&r[3], "ms", 2)),
        ..Row::new(
            id,
            format!("13. `-- true` uncontended, {on} (whole process)"),
        )
        .with_ratio(ratio(median(samples), median(&r[3])))
    };
    vec![
        row(&r[0], "true-pg", "PostgreSQL lease"),
        row(
            &r[1],
            "true-pgbouncer",
            "PostgreSQL lease through PgBouncer",
        ),
        row(&r[2], "true-mariadb", "MariaDB lease"),
    ]
}

/// Figure 3's exec-to-exit handover on PostgreSQL and on MariaDB, each against etcd's, the three
/// interleaved (each round in another order).
fn handover_rows(bench: &mut Bench, pg_url: &str, maria_url: &str) -> Vec<Row> {
    let urls = [Some(pg_url), Some(maria_url), None];
    let mut gaps: [Vec<f64>; 3] = Default::default();
    for i in 0..bench.sizes.n {
        for k in 0..3 {
            let at = (i + k) % 3;
            let mut on = OnDb { url: urls[at] };
            gaps[at].push(exec_gap(bench, &mut on, &format!("db-ho{i}-{at}")));
        }
    }
    let row = |server: Server| {
        let samples = &gaps[usize::from(server == Server::Maria)];
        Row {
            leasewrap: dist(samples, "ms", 2),
            baseline: format!("leasewrap on etcd: {}", dist(&gaps[2], "ms", 2)),
            ..Row::new(
                server.ids()[0],
                format!(
                    "13. handover on {}: holder's child exits → waiter's child execs",
                    server.title()
                ),
            )
            .with_ratio(ratio(median(samples), median(&gaps[2])))
            .set("median_ms", median(samples))
        }
    };
    vec![row(Server::Pg), row(Server::Maria)]
}

/// A database (etcd when None) for figure 3's measure; its waiters log (`-v`) when they wait.
struct OnDb<'a> {
    url: Option<&'a str>,
}

impl Backend for OnDb<'_> {
    fn argv(&self, bench: &Bench, child: &[OsString]) -> Vec<OsString> {
        let mut argv = argv_on(bench, self.url, &Lock::new("bench"), child);
        argv.insert(1, "-v".into());
        argv
    }

    fn wait_queued(&mut self, bench: &mut Bench, pids: &[i32], waiter_log: &str) {
        if self.url.is_none() {
            return bench.wait_queued(Tool::Leasewrap, 1, pids);
        }
        let log = bench.procs.log_path(waiter_log);
        let deadline = Instant::now() + QUEUE_BOUND;
        while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains("waiting for the lease")) {
            for &pid in pids {
                if let Some(code) = bench.procs.wait(pid, Duration::ZERO) {
                    panic!("handover: a leasewrap exited {code} before the waiter waited");
                }
            }
            assert!(
                Instant::now() < deadline,
                "the waiter did not wait within {QUEUE_BOUND:?}"
            );
            thread::sleep(LOOK);
        }
    }
}

/// One holder on `server` (`--ttl 3s`, child `Sleep`) per memory reading: VmHWM of leasewrap and
/// its watchdog once `version` (the row's, read by an administrator) shows a renewal.
fn rss_row(bench: &mut Bench, server: Server, url: &str, version: &dyn Fn() -> String) -> Row {
    let mut hwm = Vec::new();
    for _ in 0..bench.sizes.n_memory {
        bench.events.reset();
        let child = os(&[bench.child(Child::Sleep).as_os_str(), "1000".as_ref()]);
        let argv = argv_on(bench, Some(url), &Lock::new("bench").ttl(TTL), &child);
        let pid = bench.procs.spawn(&argv, "db-memory", None);
        let (started, child) = bench.started(Child::Sleep, &[pid]);
        let taken = version();
        while version() == taken {
            assert!(
                started.elapsed() < START_BOUND,
                "no renewal within {START_BOUND:?}"
            );
            thread::sleep(LOOK);
        }
        let kib = supervisor_hwm_kib(pid, child);
        hwm.push(kib as f64 / 1024.0);
        bench.sweep();
    }
    let mib_in_mb = (1u64 << 20) as f64 / 1e6;
    Row {
        leasewrap: dist(&hwm, "MiB", 1),
        ..Row::new(
            server.ids()[1],
            format!(
                "13. peak RSS (VmHWM), leasewrap + watchdog, {} lease",
                server.title()
            ),
        )
        .set("median_mb", median(&hwm).map(|m| m * mib_in_mb))
    }
}

/// A socket path as a URL's parameter value.
fn encode(path: &str) -> String {
    path.replace('/', "%2F")
}
