//! The database fence (SPEC §7, sql/postgres-fence.sql) against a real PostgreSQL 15: the
//! scenarios of `dbfence` (the seed's paused holder replayed inside a transaction, SPEC §9 F16;
//! eight holders in turn; jobs run by leasewrap), a holder's session ended by
//! idle_in_transaction_session_timeout, isolation levels, bad input and `fence-sql`. The
//! database's other roles are in `neighbours`, installing and upgrading in `install`.
//!
//! Every test has a database of its own on the one shared server, and its jobs log in as a
//! role of their own that may fence the test's lease name only.

mod install;
mod locks;
mod neighbours;
mod rights;

use std::fs;
use std::path::Path;

use crate::dbfence::{self, wait_for_lock_wait, Db, Lease, Replay, Resume, Server, BOUND};
use crate::support::etcd::{self, Version};
use crate::support::postgres::{self, Postgres, PSQL};
use crate::support::{assert_exit, q, wait_for_file, Leasewrap, Output, Sandbox};

/// The shipped file that `fence-sql postgres` prints.
pub const FENCE_SQL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/postgres-fence.sql");

/// Where the fence's rows are, in a schema no job may use.
pub const FENCE_TABLE: &str = "leasewrap_data.fence";

/// The job's tables (see `dbfence::Db`).
const REPORT_TABLES: &str = "
CREATE TABLE report (id int PRIMARY KEY, total int NOT NULL, who text NOT NULL, token numeric NOT NULL);
INSERT INTO report VALUES (1, 0, 'nobody', 0);
CREATE TABLE report_log (seq bigserial PRIMARY KEY, who text NOT NULL, token numeric NOT NULL, total int NOT NULL);";

/// The shared server, as the scenarios see it.
pub struct Pg(pub &'static Postgres);

pub fn pg() -> Pg {
    Pg(postgres::shared())
}

/// Installs the fence from the shipped file in `db`, as the superuser.
#[track_caller]
pub fn install(pg: &Postgres, db: &str) {
    let out = pg.psql_file(db, &[], Path::new(FENCE_SQL));
    assert!(out.status.success(), "installing the fence: {}", out.stderr);
}

/// The fence table of `db`, wherever the installed version keeps it (leasewrap_data.fence; an
/// earlier version's leasewrap.fence), for attacks that must reach it on any version.
pub fn fence_table_of(pg: &Postgres, db: &str) -> String {
    let sql =
        "SELECT coalesce(to_regclass('leasewrap_data.fence'), to_regclass('leasewrap.fence'))";
    pg.psql_ok(db, sql)
}

/// A login role of the test's own (roles are the server's, not the database's).
#[track_caller]
pub fn role(pg: &Postgres, db: &str, suffix: &str) -> String {
    let role = format!("{db}_{suffix}");
    pg.psql_ok(db, &format!("CREATE ROLE {role} LOGIN"));
    role
}

impl Pg {
    /// `report_db`, with `before_install` run on the new database (as the superuser) first.
    pub fn report_db_with(&self, label: &str, before_install: &str) -> Db {
        let name = self.0.database(label);
        if !before_install.is_empty() {
            self.0.psql_ok(&name, &before_install.replace("DB", &name));
        }
        install(self.0, &name);
        self.0.psql_ok(&name, REPORT_TABLES);
        let job = role(self.0, &name, "job");
        self.0.psql_ok(
            &name,
            &format!(
                "GRANT SELECT, INSERT, UPDATE ON report, report_log TO {job};
                 GRANT USAGE ON SEQUENCE report_log_seq_seq TO {job};
                 SELECT leasewrap.allow('{job}', '{name}');"
            ),
        );
        Db {
            lease: name.clone(),
            name,
            job,
        }
    }
}

impl Server for Pg {
    fn report_db(&self, label: &str) -> Db {
        self.report_db_with(label, "")
    }

    fn holder_script(&self, label: &str, add: u32, before: &str, after: &str) -> String {
        format!(
            "{before}
BEGIN;
SELECT leasewrap.fence(:'name', :'token');
SELECT total FROM report WHERE id = 1 \\gset
{after}
UPDATE report SET total = :total + {add}, who = '{label}', token = :'token' WHERE id = 1;
INSERT INTO report_log (who, token, total) VALUES ('{label}', :'token', :total + {add});
COMMIT;
"
        )
    }

    fn job_line(&self, db: &Db, script: &Path, err: &Path) -> String {
        let env: Vec<String> = self
            .0
            .env(&db.name)
            .iter()
            .map(|(k, v)| format!("{k}={}", q(Path::new(v))))
            .collect();
        format!(
            "{} PGUSER={} {PSQL} -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose \
             -v name=\"$LEASEWRAP_NAME\" -v token=\"$LEASEWRAP_FENCING_TOKEN\" -f {} 2>{}",
            env.join(" "),
            db.job,
            q(script),
            q(err)
        )
    }

    fn rows(&self, db: &str, sql: &str) -> Vec<Vec<String>> {
        let out = self.0.psql_ok(db, sql);
        let fields = |l: &str| l.split('|').map(str::to_owned).collect();
        out.lines().filter(|l| !l.is_empty()).map(fields).collect()
    }

    fn lock_waiters(&self, db: &str, fragment: &str) -> usize {
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND strpos(query, '{}') > 0",
            fragment.replace('\'', "''")
        );
        self.0.psql_ok(db, &sql).parse().unwrap()
    }

    fn failed_status(&self) -> &'static str {
        "3"
    }

    fn fence_table(&self) -> &'static str {
        FENCE_TABLE
    }
}

// ---------------------------------------------------------------------------------------------
// The seed's case, replayed in the database (SPEC §9 F16).

#[test]
fn a_holder_paused_inside_its_transaction_commits_first_and_the_next_builds_on_it() {
    dbfence::replay_paused_inside_its_transaction(&pg(), Resume::ChildCommits);
}

#[test]
fn a_holder_paused_inside_its_transaction_is_killed_and_the_next_loses_no_update() {
    dbfence::replay_paused_inside_its_transaction(&pg(), Resume::WatchdogKills);
}

#[test]
fn a_holder_paused_before_its_fence_is_refused_and_the_next_holder_s_data_stays() {
    dbfence::replay_paused_before_its_fence(&pg());
}

/// A frozen holder whose connection stays open (its whole tree stopped, as a host that froze or
/// lost its network) holds its row lock only until idle_in_transaction_session_timeout ends its
/// session; then the next holder goes on, and A's update never lands.
#[test]
fn idle_in_transaction_session_timeout_ends_a_frozen_holder_s_transaction_and_the_next_goes_on() {
    // Longer than B needs to take the lease (the 2 s TTL), so that B is seen waiting first.
    let timeout = "ALTER DATABASE DB SET idle_in_transaction_session_timeout = '8s'";
    let pg = pg();
    let mut r = Replay::start(&pg, "idle_timeout", dbfence::Pause::AfterFence, timeout);
    wait_for_lock_wait(&pg, &r.db.name, "leasewrap.fence", 2 * BOUND);
    r.b_succeeds();
    assert_ne!(
        r.resume_child(),
        "0",
        "A's session was ended: its commit fails"
    );
    let err = r.a_err();
    assert!(
        err.contains("idle-in-transaction timeout"),
        "A's error: {err}"
    );
    r.resume_lease();
    r.only_b_landed();
}

#[test]
fn eight_holders_queued_on_the_local_backend_commit_in_token_order_and_a_stale_one_is_refused() {
    dbfence::eight_holders_queued_on_the_local_backend(&pg());
}

#[test]
fn eight_holders_on_etcd_paused_at_random_commit_non_decreasing_tokens_and_no_stale_commit_lands() {
    dbfence::eight_holders_on_etcd_paused_at_random(&pg());
}

#[test]
fn a_job_run_by_leasewrap_on_the_local_backend_fences_with_its_token() {
    dbfence::jobs_run_by_leasewrap_record_their_tokens(&pg(), Lease::Local);
}

#[test]
fn a_job_run_by_leasewrap_on_etcd_fences_with_its_token() {
    let etcd = etcd::shared(Version::V3_5);
    let prefix = etcd::unique_prefix("pg_run_by_leasewrap");
    dbfence::jobs_run_by_leasewrap_record_their_tokens(&pg(), Lease::Etcd(etcd, &prefix));
}

// ---------------------------------------------------------------------------------------------
// The fence's own rules.

/// A psql session of the test's own, as the superuser, in a thread, that runs `lines` and then
/// waits for the file LABEL.go before it commits.
pub fn session_holding(
    sb: &Sandbox,
    (pg, db): (&'static Postgres, &str),
    label: &str,
    lines: &str,
) -> std::thread::JoinHandle<Output> {
    let script = format!(
        "BEGIN;\n{lines}\n{}\nCOMMIT;\n",
        dbfence::wait_line(sb, label)
    );
    let path = sb.path(&format!("{label}.sql"));
    fs::write(&path, script).unwrap();
    let db = db.to_owned();
    let thread = std::thread::spawn(move || pg.psql_file(&db, &[], &path));
    wait_for_file(&sb.path(&format!("{label}.paused")), BOUND);
    thread
}

/// `sql` on the shared server in a thread of its own.
fn in_thread(pg: &'static Postgres, db: &str, sql: &str) -> std::thread::JoinHandle<Output> {
    let (db, sql) = (db.to_owned(), sql.to_owned());
    std::thread::spawn(move || pg.psql(&db, &sql))
}

/// PostgreSQL's INSERT docs: with ON CONFLICT DO UPDATE ... WHERE, "only rows for which this
/// expression returns true will be updated, although all rows will be locked". The fence relies
/// on it: a stale fence's statement locks the row just as a fresh one's does.
#[test]
fn on_conflict_do_update_locks_the_row_even_when_its_where_is_false() {
    let pg = pg();
    let (db, sb) = (pg.report_db("locks_on_false_where"), Sandbox::new());
    let (name, lease) = (&db.name, &db.lease);
    pg.0.psql_ok(name, &format!("SELECT leasewrap.fence('{lease}', 5)"));
    let stale_upsert = format!(
        "INSERT INTO leasewrap_data.fence AS f (name, token) VALUES ('{lease}', 3) \
         ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token;"
    );
    let holding = session_holding(&sb, (pg.0, name), "S", &stale_upsert);
    let locked =
        format!("SELECT token FROM {FENCE_TABLE} WHERE name = '{lease}' FOR UPDATE NOWAIT");
    let out = pg.0.psql(name, &locked);
    assert!(
        out.stderr.contains("55P03"),
        "the row is locked: {}",
        out.stderr
    );
    fs::write(sb.path("S.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
    assert_eq!(dbfence::recorded(&pg, &db), "5");
}

#[test]
fn a_stale_fence_waits_for_the_holder_s_transaction_then_is_refused_naming_both_tokens() {
    let pg = pg();
    let (db, sb) = (pg.report_db("stale_waits"), Sandbox::new());
    let fence = |token: u32| format!("SELECT leasewrap.fence('{}', {token});", db.lease);
    let holding = session_holding(&sb, (pg.0, &db.name), "S", &fence(5));
    let stale = in_thread(pg.0, &db.name, &fence(3));
    wait_for_lock_wait(&pg, &db.name, &fence(3)[..30], BOUND);
    fs::write(sb.path("S.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
    let out = stale.join().unwrap();
    assert!(!out.status.success());
    let refusal = format!(
        "LWF01: stale fencing token 3 for \"{}\": 5 is recorded",
        db.lease
    );
    assert!(out.stderr.contains(&refusal), "{}", out.stderr);
}

/// Under REPEATABLE READ (and SERIALIZABLE) a newer holder's fence that waited for an older
/// holder's commit cannot build on a snapshot taken before it: it fails with a serialization
/// failure (40001), a safe refusal, and the whole transaction is to be retried.
#[test]
fn a_fence_that_waited_under_repeatable_read_fails_to_serialize_and_its_retry_goes_on() {
    let pg = pg();
    let (db, sb) = (pg.report_db("repeatable_read"), Sandbox::new());
    let fence = |token: u32| format!("SELECT leasewrap.fence('{}', {token});", db.lease);
    pg.0.psql_ok(&db.name, &fence(4));
    let holding = session_holding(&sb, (pg.0, &db.name), "S", &fence(5));
    let newer = format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; {} COMMIT;",
        fence(6)
    );
    let waiting = in_thread(pg.0, &db.name, &newer);
    wait_for_lock_wait(&pg, &db.name, "REPEATABLE READ", BOUND);
    fs::write(sb.path("S.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
    let out = waiting.join().unwrap();
    assert!(
        out.stderr.contains("40001"),
        "a serialization failure: {}",
        out.stderr
    );
    assert_eq!(dbfence::recorded(&pg, &db), "5");
    pg.0.psql_ok(&db.name, &newer);
    assert_eq!(dbfence::recorded(&pg, &db), "6");
}

/// Two transactions that fence two names in opposite orders deadlock; PostgreSQL ends one with
/// 40P01 (nothing written: retry it) and the other goes on.
#[test]
fn two_names_fenced_in_opposite_orders_deadlock_and_one_transaction_gets_40p01() {
    let pg = pg();
    let (db, sb) = (pg.report_db("two_names"), Sandbox::new());
    let (a, b) = (db.lease.clone(), format!("{}.b", db.lease));
    pg.0.psql_ok(
        &db.name,
        &format!("SELECT leasewrap.allow('{}', '{b}')", db.job),
    );
    let fence = |name: &str| format!("SELECT leasewrap.fence('{name}', 1);");
    let in_order = format!(
        "{}\n{}\n{}",
        fence(&a),
        dbfence::wait_line(&sb, "S"),
        fence(&b)
    );
    let first = session_holding(&sb, (pg.0, &db.name), "S", &in_order);
    let opposite = format!("BEGIN; {} {} COMMIT;", fence(&b), fence(&a));
    let second = in_thread(pg.0, &db.name, &opposite);
    wait_for_lock_wait(&pg, &db.name, &format!("fence('{b}', 1); SELECT"), BOUND);
    fs::write(sb.path("S.go"), "").unwrap();
    let outs = [first.join().unwrap(), second.join().unwrap()];
    let failed: Vec<&Output> = outs.iter().filter(|o| !o.status.success()).collect();
    assert_eq!(
        failed.len(),
        1,
        "one of the two: {:?}",
        outs.iter().map(|o| &o.stderr).collect::<Vec<_>>()
    );
    assert!(failed[0].stderr.contains("40P01"), "{}", failed[0].stderr);
}

/// Each bad call fails with LWF02 (or a documented SQLSTATE) and a clear line, and the
/// transaction it opens writes nothing.
#[test]
fn bad_input_gets_lwf02_or_a_documented_sqlstate_and_nothing_is_written() {
    let pg = pg();
    let (db, sb) = (pg.report_db("bad_input"), Sandbox::new());
    let script = sb.path("bad.sql");
    let job = "BEGIN;\nSELECT leasewrap.fence(:'name', :'token');\n\
               INSERT INTO report_log (who, token, total) VALUES ('bad', 0, 0);\nCOMMIT;\n";
    fs::write(&script, job).unwrap();
    let call = |name: &str, token: &str| {
        pg.0.psql_file(&db.name, &[("name", name), ("token", token)], &script)
    };
    dbfence::bad_text_input_gets_lwf02(&pg, &db, call);
    let lease = db.lease.as_str();
    let typed = [
        (format!("'{lease}', 1.5"), "LWF02"),
        (format!("'{lease}', 'NaN'::numeric"), "LWF02"),
        (
            format!("'{lease}', NULL"),
            "LWF02: leasewrap.fence: fencing token NULL",
        ),
        (
            "NULL, 5".into(),
            "LWF02: leasewrap.fence: the lease name NULL",
        ),
        (format!("'{lease}', 1.5::float8"), "42883"),
        ("5, 5".into(), "42883"),
    ];
    for (args, error) in &typed {
        let out =
            pg.0.psql(&db.name, &format!("SELECT leasewrap.fence({args})"));
        assert!(out.stderr.contains(error), "{args}: {}", out.stderr);
    }
    assert_eq!(dbfence::recorded(&pg, &db), "", "nothing recorded");
    let top = format!("SELECT leasewrap.fence('{lease}', 18446744073709551615)");
    assert_eq!(
        pg.0.psql_ok(&db.name, &top),
        "18446744073709551615",
        "the highest u64 is a token"
    );
}

#[test]
fn fence_sql_postgres_prints_the_shipped_file_and_installing_it_twice_works() {
    let out = Leasewrap::subcommand("fence-sql")
        .args(&["postgres"])
        .output();
    assert_exit(&out, 0);
    assert_eq!(out.stdout, fs::read_to_string(FENCE_SQL).unwrap());
    let pg = postgres::shared();
    let (db, sb) = (pg.database("installed_twice"), Sandbox::new());
    let printed = sb.path("printed.sql");
    fs::write(&printed, &out.stdout).unwrap();
    for _ in 0..2 {
        let install = pg.psql_file(&db, &[], &printed);
        assert!(install.status.success(), "{}", install.stderr);
    }
    let job = role(pg, &db, "job");
    pg.psql_ok(&db, &format!("SELECT leasewrap.allow('{job}', 'report')"));
    let fenced = pg.psql_as(&job, &db, "SELECT leasewrap.fence('report', 4)");
    assert_eq!(fenced.stdout.trim(), "4", "{}", fenced.stderr);
}

#[test]
fn fence_sql_with_an_unknown_database_is_64_naming_the_known_ones() {
    let out = Leasewrap::subcommand("fence-sql").args(&["mysql"]).output();
    assert_exit(&out, 64);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("postgres"), "{}", out.stderr);
    assert!(out.stderr.contains("mariadb"), "{}", out.stderr);
    assert!(out.stdout.is_empty());
}
