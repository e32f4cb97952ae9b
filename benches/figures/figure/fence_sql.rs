//! Figure 10: the database fence's cost per transaction (issues 19, 26 and 32), on a PostgreSQL 15
//! and a MariaDB 10.11 of the tests' harness (tests/support): one client on a Unix socket, a
//! transaction that updates one row, with the fence first, without it, and with `SELECT 1` in
//! its place (the cost of one more statement round trip), the three interleaved. The client logs
//! in as a job role (user) that may fence the name, as a job would.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::bench::Bench;
use crate::report::{Figure, Row};
use crate::stats::{self, dist, median};
use crate::support::mariadb::Mariadb;
use crate::support::postgres::{Postgres, BIN_DIR};

/// Transactions of one run.
const TRANSACTIONS: usize = 1000;

const FENCE_NOTE: &str = "Figure 10 (the database fence, issues 19, 26 and 32): one client on \
    a Unix socket, each run 1000 transactions of `BEGIN; UPDATE report SET total = total + 1 WHERE \
    id = 1; COMMIT` (one row; `START TRANSACTION READ WRITE` on MariaDB, since after a fence a \
    session's later transactions are read-only), against the same with the fence first (`SELECT \
    leasewrap.fence('bench', '1')` on PostgreSQL, `CALL leasewrap.fence('bench', '1')` on MariaDB: \
    one more statement, the function's checks, the lookup of the caller's tie, and an upsert of the \
    fence row with its WAL or redo) and with `SELECT 1` first (the round trip alone), the three \
    alternating; the client logs in as a job role that may fence the name. PostgreSQL's sample is \
    pgbench's latency average; MariaDB's is the wall time of one `mariadb` client fed the 1000 \
    transactions, over 1000. \"Round trips\" is the fence's cost over the plain transaction \
    divided by SELECT 1's. The servers are the tests' harness's (tests/support): PostgreSQL 15 \
    (Debian's postgresql-15) made by initdb, its defaults but fsync=off, on a Unix socket alone; \
    MariaDB 10.11 (Debian's mariadb-server) started with --no-defaults, its defaults but \
    --skip-networking and innodb_flush_log_at_trx_commit=0. Without durable commits a commit costs \
    less than on a durable server, and the fence's share is larger than it would be there.";

/// The transaction, after `first` (empty: nothing first).
fn transaction(first: &str) -> String {
    let update = "UPDATE report SET total = total + 1 WHERE id = 1;";
    format!("BEGIN;\n{first}\n{update}\nCOMMIT;\n")
}

/// One server's three transactions, and how to time a run of one.
trait Server {
    fn fence(&self) -> &'static str;
    /// ms per transaction of one run of `text`, repeated.
    fn latency(&self, bench: &Bench, text: &str) -> f64;
}

pub fn figure(bench: &mut Bench) -> Figure {
    let pg = Pg::start();
    let pg_row = measure(
        bench,
        &pg,
        "fence-sql",
        "10. a PostgreSQL transaction with `leasewrap.fence` first, against without",
    );
    drop(pg);
    let maria = Maria::start();
    let maria_row = measure(
        bench,
        &maria,
        "fence-sql-mariadb",
        "10. a MariaDB transaction with `CALL leasewrap.fence` first, against without",
    );
    Figure {
        rows: vec![pg_row, maria_row],
        notes: vec![FENCE_NOTE.into()],
        ..Figure::default()
    }
}

/// The row of one server: fenced against plain, and against SELECT 1 first.
fn measure(bench: &Bench, server: &dyn Server, id: &'static str, title: &str) -> Row {
    let texts = [
        transaction(server.fence()),
        transaction(""),
        transaction("SELECT 1;"),
    ];
    let mut samples = [Vec::new(), Vec::new(), Vec::new()];
    for i in 0..bench.sizes.n + 1 {
        // A different one first each round; the first round warms the server up.
        for k in 0..3 {
            let which = (i + k) % 3;
            let ms = server.latency(bench, &texts[which]);
            if i > 0 {
                samples[which].push(ms);
            }
        }
    }
    let [fenced, plain, select1] = [0, 1, 2].map(|k| median(&samples[k]));
    let diff = |a: Option<f64>| a.zip(plain).map(|(a, b)| a - b);
    let round_trips = diff(fenced).zip(diff(select1)).map(|(f, s)| f / s);
    let row = Row {
        leasewrap: dist(&samples[0], "ms", 3),
        baseline: format!(
            "the same transaction without the fence: {}; difference of medians {:.3} ms; with SELECT 1 in its place: {}, {:.3} ms more; the fence = {:.1} round trips",
            dist(&samples[1], "ms", 3),
            diff(fenced).unwrap_or(f64::NAN),
            dist(&samples[2], "ms", 3),
            diff(select1).unwrap_or(f64::NAN),
            round_trips.unwrap_or(f64::NAN),
        ),
        ..Row::new(id, title).with_ratio(stats::ratio(fenced, plain))
    };
    row.set("round_trips", round_trips)
}

/// A script file in the bench's temp dir.
fn script(bench: &Bench, name: &str, text: &str) -> PathBuf {
    let path = bench.tmp.path().join(name);
    fs::write(&path, text).expect("write a bench script");
    path
}

pub struct Pg {
    pub pg: Postgres,
    pub db: String,
}

impl Pg {
    /// A server of the bench's own, the fence installed, and `bench_job` tied to `bench`.
    pub fn start() -> Pg {
        let pg = Postgres::start();
        let db = pg.database("bench");
        let fence = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/postgres-fence.sql");
        let installed = pg.psql_file(&db, &[], &fence);
        assert!(
            installed.status.success(),
            "installing the fence: {}",
            installed.stderr
        );
        pg.psql_ok(&db, "CREATE TABLE report (id int PRIMARY KEY, total int NOT NULL); INSERT INTO report VALUES (1, 0);
            CREATE ROLE bench_job LOGIN; GRANT SELECT, UPDATE ON report TO bench_job;
            SELECT leasewrap.allow('bench_job', 'bench');");
        Pg { pg, db }
    }
}

impl Server for Pg {
    fn fence(&self) -> &'static str {
        "SELECT leasewrap.fence('bench', '1');"
    }

    /// pgbench's latency average, in ms, of TRANSACTIONS runs of `text`.
    fn latency(&self, bench: &Bench, text: &str) -> f64 {
        let file = script(bench, "pg.sql", text);
        let out = Command::new(Path::new(BIN_DIR).join("pgbench"))
            .args(["-n", "-c", "1", "-t", &TRANSACTIONS.to_string(), "-f"])
            .arg(&file)
            .envs(self.pg.env(&self.db))
            .env("PGUSER", "bench_job")
            .output()
            .expect("run pgbench (Debian package postgresql-15)");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("latency average = "));
        let ms = line.and_then(|l| l.trim_end_matches(" ms").trim().parse().ok());
        ms.unwrap_or_else(|| panic!("pgbench: {text}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

pub struct Maria {
    pub server: Mariadb,
    db: String,
}

impl Maria {
    /// The same on MariaDB.
    pub fn start() -> Maria {
        let server = Mariadb::start();
        let fence = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/mariadb-fence.sql");
        let installed = server.run_file(None, &fence);
        assert!(
            installed.status.success(),
            "installing the fence: {}",
            installed.stderr
        );
        let db = server.database("bench");
        server.sql_ok(&db, &format!("CREATE TABLE report (id INT PRIMARY KEY, total INT NOT NULL) ENGINE = InnoDB;
            INSERT INTO report VALUES (1, 0); CREATE USER 'bench_job'@'localhost';
            GRANT SELECT, UPDATE ON {db}.* TO 'bench_job'@'localhost'; CALL leasewrap.allow('bench_job', 'bench');"));
        Maria { server, db }
    }
}

impl Server for Maria {
    fn fence(&self) -> &'static str {
        "CALL leasewrap.fence('bench', '1');"
    }

    /// The wall time of one client fed TRANSACTIONS copies of `text`, per transaction, in ms.
    fn latency(&self, _bench: &Bench, text: &str) -> f64 {
        // READ WRITE: after a fence, a session's later transactions are read-only unless they
        // say so (sql/mariadb-fence.sql); the three transactions start alike.
        let all = text
            .replace("BEGIN;", "START TRANSACTION READ WRITE;")
            .repeat(TRANSACTIONS);
        let mut client = self.server.client_as("bench_job", Some(&self.db));
        client
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = client
            .spawn()
            .expect("run the mariadb client (Debian package mariadb-client)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(all.as_bytes())
            .expect("feed the client");
        let out = child.wait_with_output().expect("wait for the client");
        let elapsed = started.elapsed();
        assert!(
            out.status.success(),
            "mariadb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        elapsed.as_secs_f64() * 1000.0 / TRANSACTIONS as f64
    }
}
