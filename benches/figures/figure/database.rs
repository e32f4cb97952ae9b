//! Figure 13: the database lease (issue 33) next to leasewrap on etcd: `-- true` uncontended,
//! leasewrap on PostgreSQL and on MariaDB against leasewrap on etcd, the three interleaved, on
//! servers figure 10 starts (fence and lease installed, the user `bench_job` tied to `bench`),
//! each on its Unix socket.

use super::fence_sql::{Maria, Pg};
use super::whole_run::{alternate, Run};
use crate::bench::{os, Bench, Lock, Tool};
use crate::report::{Figure, Row};
use crate::stats::{dist, median, ratio};

const NOTE: &str = "Figure 13 (the database lease, issue 33): whole runs of `leasewrap --database URL \
    --name bench -- true` as a user tied to `bench`, on a Unix socket, interleaved with leasewrap on \
    figure 1's etcd: one connection, the installed SQL's version check, a read, the take and the \
    release. The servers are figure 10's (PostgreSQL 15 with fsync=off, trust authentication; \
    MariaDB 10.11 with innodb_flush_log_at_trx_commit=0, no password).";

pub fn figure(bench: &mut Bench) -> Figure {
    let pg = Pg::start();
    let maria = Maria::start();
    let pg_url = format!(
        "postgresql://bench_job@/{}?host={}&port={}",
        pg.db,
        encode(&pg.pg.socket_dir().display().to_string()),
        pg.pg.port()
    );
    let maria_url = format!(
        "mariadb://bench_job@/?socket={}",
        encode(&maria.server.socket().display().to_string())
    );
    let lock = Lock::new("bench");
    let on = |url: &str| {
        let mut argv = bench.argv(Tool::Leasewrap, &lock, &os(&["true"]));
        argv.splice(1..3, os(&["--database".to_owned(), url.to_owned()]));
        argv
    };
    let (on_pg, on_maria) = (on(&pg_url), on(&maria_url));
    let on_etcd = bench.argv(Tool::Leasewrap, &lock, &os(&["true"]));
    let runs: Vec<Run> = vec![
        ("leasewrap-pg", Box::new(|_| on_pg.clone())),
        ("leasewrap-mariadb", Box::new(|_| on_maria.clone())),
        ("leasewrap-etcd", Box::new(|_| on_etcd.clone())),
    ];
    let r = alternate(bench, &runs, bench.sizes.n);
    let row = |samples: &[f64], id: &'static str, title: &str| Row {
        leasewrap: dist(samples, "ms", 2),
        baseline: format!("leasewrap on etcd: {}", dist(&r[2], "ms", 2)),
        ..Row::new(id, title).with_ratio(ratio(median(samples), median(&r[2])))
    };
    Figure {
        rows: vec![
            row(
                &r[0],
                "true-pg",
                "13. `-- true` uncontended, PostgreSQL lease (whole process)",
            ),
            row(
                &r[1],
                "true-mariadb",
                "13. `-- true` uncontended, MariaDB lease (whole process)",
            ),
        ],
        notes: vec![NOTE.into()],
        ..Figure::default()
    }
}

/// A socket path as a URL's parameter value.
fn encode(path: &str) -> String {
    path.replace('/', "%2F")
}
