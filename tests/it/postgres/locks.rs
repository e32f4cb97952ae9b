//! Locks on the fence's tables, played for real while a long job is inside its fence: a tied role
//! that asks for a table lock before its rights are checked (CREATE TRIGGER, a foreign key,
//! PREPARE), a re-run of the install, and an upgrade that has to move the tables. None of them
//! may make another name's fence wait longer than the install's own bound (3 s), and an install
//! that cannot go on changes nothing and says who held the tables.

use std::fs;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{fence_table_of, install, pg, role, session_holding, FENCE_SQL};
use crate::dbfence::{self, wait_line, Server, BOUND};
use crate::support::postgres::Postgres;
use crate::support::{wait_for_file, wait_until, Output, Sandbox};

/// leasewrap's fence version 2, as it shipped (tables in the schema leasewrap).
const VERSION_2: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/it/postgres/fence-v2.sql"
);

/// How long another name's fence may take while a job holds its own: well below the fence's
/// lock_timeout (2 min) and the job's hold, above the install's own bound (3 s).
const ANOTHER_NAME: Duration = Duration::from_secs(8);

/// `sql` as `role` on `db`, in a thread of its own.
fn as_role_in_thread(pg: &'static Postgres, role: &str, db: &str, sql: &str) -> JoinHandle<Output> {
    let (role, db, sql) = (role.to_owned(), db.to_owned(), sql.to_owned());
    std::thread::spawn(move || pg.psql_as(&role, &db, &sql))
}

/// The thread's output, once it has ended within `bound`.
#[track_caller]
fn ended_within(thread: JoinHandle<Output>, bound: Duration, what: &str) -> Output {
    wait_until(bound, what, || thread.is_finished());
    thread.join().unwrap()
}

/// While job A is inside its fence, another team's tied role asks for the fence table's locks
/// (a trigger, a foreign key to it, a prepared query on it): each is refused at once, before it
/// can queue, and a third team's fence of its own name goes on.
#[test]
fn a_tied_role_can_neither_lock_the_fence_table_nor_make_another_name_s_fence_wait() {
    let pg = pg();
    let (db, sb) = (pg.report_db("table_locks"), Sandbox::new());
    let (b, c) = (role(pg.0, &db.name, "b"), role(pg.0, &db.name, "c"));
    pg.0.psql_ok(&db.name, &format!(
        "SELECT leasewrap.allow('{b}', 'b'), leasewrap.allow('{c}', 'c'); GRANT CREATE ON SCHEMA public TO {b}"
    ));
    let fence = fence_table_of(pg.0, &db.name);
    let holding = session_holding(
        &sb,
        (pg.0, &db.name),
        "A",
        &format!("SELECT leasewrap.fence('{}', 1);", db.lease),
    );
    let attacks = [
        format!("CREATE TRIGGER x BEFORE UPDATE ON {fence} FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()"),
        format!("CREATE TABLE public.refs (n text REFERENCES {fence} (name))"),
        format!("BEGIN; PREPARE p AS SELECT * FROM {fence}; SELECT 'prepared'; COMMIT"),
    ];
    let attacking: Vec<_> = attacks
        .iter()
        .map(|a| as_role_in_thread(pg.0, &b, &db.name, a))
        .collect();
    wait_until(BOUND, "each attack refused or queued", || {
        let queued = pg.lock_waiters(&db.name, &fence);
        attacking.iter().filter(|t| t.is_finished()).count() + queued == attacks.len()
    });
    let other = as_role_in_thread(pg.0, &c, &db.name, "SELECT leasewrap.fence('c', 1)");
    let other = ended_within(
        other,
        ANOTHER_NAME,
        "another team's fence while A holds its own",
    );
    assert_eq!(other.stdout.trim(), "1", "{}", other.stderr);
    for (attack, thread) in attacks.iter().zip(attacking) {
        let out = ended_within(thread, BOUND, attack);
        assert!(
            out.stderr.contains("42501") && !out.stdout.contains("prepared"),
            "{attack}: {}{}",
            out.stdout,
            out.stderr
        );
    }
    fs::write(sb.path("A.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
}

/// A re-run of the install while a job is inside its fence changes nothing in place, so it takes
/// no lock of the job's: it ends at once, and the job commits.
#[test]
fn a_re_run_while_a_job_is_inside_its_fence_waits_for_it_not_at_all() {
    let pg = pg();
    let (db, sb) = (pg.report_db("re_run_held"), Sandbox::new());
    let holding = session_holding(
        &sb,
        (pg.0, &db.name),
        "A",
        &format!("SELECT leasewrap.fence('{}', 1);", db.lease),
    );
    let started = Instant::now();
    let out = pg.0.psql_file(&db.name, &[], Path::new(FENCE_SQL));
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        started.elapsed() < ANOTHER_NAME,
        "the re-run took {:?}",
        started.elapsed()
    );
    fs::write(sb.path("A.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
    assert_eq!(dbfence::recorded(&pg, &db), "1");
}

/// A database with version 2 installed and the lease names `a` and `c` tied to two roles;
/// returns the database and the role of `c`.
fn version_2_in_use(pg: &Postgres) -> (String, String) {
    let db = pg.database("upgrade_held");
    let out = pg.psql_file(&db, &[], Path::new(VERSION_2));
    assert!(out.status.success(), "{}", out.stderr);
    let (a, c) = (role(pg, &db, "a"), role(pg, &db, "c"));
    pg.psql_ok(
        &db,
        &format!("SELECT leasewrap.allow('{a}', 'a'), leasewrap.allow('{c}', 'c')"),
    );
    (db, c)
}

/// Job A fences `a`, stops at S, fences `a` again (a second fence in one transaction, as when it
/// writes twice), stops at A, commits; stopped at S when this returns.
fn job_fencing_twice(pg: &'static Postgres, sb: &Sandbox, db: &str) -> JoinHandle<Output> {
    let fence = "SELECT leasewrap.fence('a', 1);";
    let script = format!(
        "BEGIN;\n{fence}\n{}\n{fence}\n{}\nCOMMIT;\n",
        wait_line(sb, "S"),
        wait_line(sb, "A")
    );
    let path = sb.path("a.sql");
    fs::write(&path, script).unwrap();
    let db = db.to_owned();
    let job = std::thread::spawn(move || pg.psql_file(&db, &[], &path));
    wait_for_file(&sb.path("S.paused"), BOUND);
    job
}

/// An upgrade from version 2 moves the tables, so it needs them to itself: with job A inside
/// its fence it waits 3 s, then changes nothing and names A's backend. Meanwhile A fences again
/// in its transaction (no deadlock), and another team's fence waits at most those 3 s.
#[test]
fn an_upgrade_that_would_wait_for_a_job_changes_nothing_after_3s_and_names_who_held_the_tables() {
    let pg = pg();
    let sb = Sandbox::new();
    let (db, c) = version_2_in_use(pg.0);
    let job = job_fencing_twice(pg.0, &sb, &db);
    let started = Instant::now();
    let upgrade = {
        let db = db.clone();
        std::thread::spawn(move || pg.0.psql_file(&db, &[], Path::new(FENCE_SQL)))
    };
    wait_until(BOUND, "the upgrade waiting for A's tables", || {
        pg.lock_waiters(&db, "LOCK TABLE") > 0
    });
    let other = as_role_in_thread(pg.0, &c, &db, "SELECT leasewrap.fence('c', 1)");
    fs::write(sb.path("S.go"), "").unwrap();
    wait_for_file(&sb.path("A.paused"), BOUND);
    let out = ended_within(upgrade, ANOTHER_NAME, "the upgrade giving up");
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    for said in [
        "held it for longer than lock_timeout (3s): pid ",
        "; nothing was changed",
    ] {
        assert!(out.stderr.contains(said), "{said}: {}", out.stderr);
    }
    assert!(started.elapsed() < ANOTHER_NAME, "{:?}", started.elapsed());
    let other = ended_within(
        other,
        ANOTHER_NAME,
        "another team's fence behind the upgrade",
    );
    assert_eq!(other.stdout.trim(), "1", "{}", other.stderr);
    let unchanged =
        "SELECT version, to_regnamespace('leasewrap_data') IS NULL FROM leasewrap.installed";
    assert_eq!(
        pg.0.psql_ok(&db, unchanged),
        "2|t",
        "still version 2, as it was"
    );
    fs::write(sb.path("A.go"), "").unwrap();
    let job = job.join().unwrap();
    assert!(job.status.success(), "{}", job.stderr);
    install(pg.0, &db);
    let fenced = "SELECT name || '=' || token FROM leasewrap.fences()";
    assert_eq!(
        pg.0.psql_ok(&db, fenced),
        "a=1\nc=1",
        "the upgrade keeps the tokens"
    );
}
