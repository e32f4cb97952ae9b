//! Figure 10: the database fence's cost per transaction (issue 19): pgbench, one client, a
//! transaction that updates one row, with and without `SELECT leasewrap.fence(...)` first, on a
//! PostgreSQL 15 of the tests' harness (tests/support/postgres.rs).

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::bench::Bench;
use crate::report::{Figure, Row};
use crate::stats::{self, dist, median};
use crate::support::postgres::{Postgres, BIN_DIR};

/// Transactions of one pgbench run.
const TRANSACTIONS: &str = "1000";

const FENCE_NOTE: &str = "Figure 10 (the database fence, issue 19): pgbench with one client on a \
    Unix socket, each run 1000 transactions of `BEGIN; UPDATE report SET total = total + 1 WHERE \
    id = 1; COMMIT`, against the same with `SELECT leasewrap.fence('bench', 1)` first (one more \
    statement round trip, the PL/pgSQL call and an upsert of the fence row, which adds a row \
    version and its WAL to every transaction), the two alternating; each sample is pgbench's \
    latency average. The harness's server runs with fsync=off, so commits cost less than on a \
    durable server and the fence's share is larger than it would be there.";

pub fn figure(bench: &mut Bench) -> Figure {
    let pg = Postgres::start();
    let db = pg.database("bench");
    let fence = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/postgres-fence.sql");
    let installed = pg.psql_file(&db, &[], &fence);
    assert!(
        installed.status.success(),
        "installing the fence: {}",
        installed.stderr
    );
    pg.psql_ok(&db, "CREATE TABLE report (id int PRIMARY KEY, total int NOT NULL); INSERT INTO report VALUES (1, 0)");
    let update = "UPDATE report SET total = total + 1 WHERE id = 1;";
    let plain = script(bench, "plain.sql", &format!("BEGIN;\n{update}\nCOMMIT;\n"));
    let fenced = format!("BEGIN;\nSELECT leasewrap.fence('bench', 1);\n{update}\nCOMMIT;\n");
    let fenced = script(bench, "fenced.sql", &fenced);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..bench.sizes.n + 1 {
        let (first, second) = if i % 2 == 0 {
            (&fenced, &plain)
        } else {
            (&plain, &fenced)
        };
        let (a, b) = (latency(&pg, &db, first), latency(&pg, &db, second));
        // The first round warms the server up.
        if i > 0 {
            let (f, p) = if i % 2 == 0 { (a, b) } else { (b, a) };
            with.push(f);
            without.push(p);
        }
    }
    let (a, b) = (median(&with), median(&without));
    let row = Row {
        leasewrap: dist(&with, "ms", 3),
        baseline: format!(
            "the same transaction without the fence: {}; difference of medians {:.3} ms",
            dist(&without, "ms", 3),
            a.zip(b).map_or(f64::NAN, |(a, b)| a - b)
        ),
        ..Row::new(
            "fence-sql",
            "10. a PostgreSQL transaction with `leasewrap.fence` first, against without",
        )
        .with_ratio(stats::ratio(a, b))
    };
    Figure {
        rows: vec![row],
        notes: vec![FENCE_NOTE.into()],
    }
}

fn script(bench: &Bench, name: &str, text: &str) -> std::path::PathBuf {
    let path = bench.tmp.path().join(name);
    fs::write(&path, text).expect("write a pgbench script");
    path
}

/// pgbench's latency average, in ms, of TRANSACTIONS runs of `script`.
fn latency(pg: &Postgres, db: &str, script: &Path) -> f64 {
    let out = Command::new(Path::new(BIN_DIR).join("pgbench"))
        .args(["-n", "-c", "1", "-t", TRANSACTIONS, "-f"])
        .arg(script)
        .envs(pg.env(db))
        .output()
        .expect("run pgbench (Debian package postgresql-15)");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("latency average = "));
    let ms = line.and_then(|l| l.trim_end_matches(" ms").trim().parse().ok());
    ms.unwrap_or_else(|| panic!("pgbench: {text}{}", String::from_utf8_lossy(&out.stderr)))
}
