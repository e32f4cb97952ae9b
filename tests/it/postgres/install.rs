//! Installing the PostgreSQL fence again: the version it records, the upgrade from leasewrap's
//! first fence (version 1, tests/it/postgres/fence-v1.sql as it shipped), what a re-run keeps
//! of an administrator's changes, and what it refuses, changing nothing: a bigint token column,
//! a newer version, a fence owner role that can log in, an installer that is not a superuser.

use std::path::Path;

use super::{install, pg, role, FENCE_SQL, FENCE_TABLE};
use crate::dbfence::Server as _;
use crate::dbfence::BOUND;
use crate::support::postgres::{self, Postgres};
use crate::support::run_bounded;

/// leasewrap's first fence, as it shipped (SECURITY INVOKER, jobs with table rights).
const VERSION_1: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/it/postgres/fence-v1.sql"
);

/// The install from the shipped file, as psql ended.
fn install_output(pg: &Postgres, db: &str) -> crate::support::Output {
    pg.psql_file(db, &[], Path::new(FENCE_SQL))
}

/// Version 3 installed, with the fence's lock_timeout `lock_timeout`.
fn version_3(lock_timeout: &str) -> (String, String) {
    let settings = format!("search_path=pg_catalog, pg_temp;lock_timeout={lock_timeout}");
    ("3".to_owned(), settings)
}

/// The installed version and the function's settings.
fn installed(pg: &Postgres, db: &str) -> (String, String) {
    let version = pg.psql_ok(
        db,
        "SELECT string_agg(version::text, ',') FROM leasewrap_data.installed",
    );
    let settings = "SELECT array_to_string(proconfig, ';') FROM pg_proc \
                    WHERE oid = 'leasewrap.fence(text, text)'::regprocedure";
    (version, pg.psql_ok(db, settings))
}

/// A database with version 1 installed, a job role with the rights its docs gave (USAGE, and
/// SELECT, INSERT, UPDATE on the table) that fenced `report` with 7, and a monitoring role that
/// may read the table: (database, job, monitor).
fn version_1_in_use(pg: &Postgres) -> (String, String, String) {
    let db = pg.database("from_v1");
    let out = pg.psql_file(&db, &[], Path::new(VERSION_1));
    assert!(out.status.success(), "{}", out.stderr);
    let (job, monitor) = (role(pg, &db, "job"), role(pg, &db, "monitor"));
    pg.psql_ok(
        &db,
        &format!(
            "GRANT USAGE ON SCHEMA leasewrap TO {job}, {monitor};
         GRANT SELECT, INSERT, UPDATE ON leasewrap.fence TO {job};
         GRANT SELECT ON leasewrap.fence TO {monitor};"
        ),
    );
    let fenced = pg.psql_as(&job, &db, "SELECT leasewrap.fence('report', 7)");
    assert!(fenced.status.success(), "{}", fenced.stderr);
    (db, job, monitor)
}

#[test]
fn the_upgrade_from_version_1_keeps_tokens_and_reads_but_takes_the_jobs_table_writes() {
    let pg = postgres::shared();
    let (db, job, monitor) = version_1_in_use(pg);
    let out = install_output(pg, &db);
    assert!(out.status.success(), "{}", out.stderr);
    let warned = format!(
        "role {job} may no longer write the fence table, and may fence every name: \
         tie it to its own with leasewrap.allow('{job}', NAME) and leasewrap.disallow('{job}', '*')"
    );
    assert!(out.stderr.contains(&warned), "{}", out.stderr);
    assert_eq!(installed(pg, &db), version_3("2min"));
    let as_job = |sql: &str| pg.psql_as(&job, &db, sql);
    let stale = as_job("SELECT leasewrap.fence('report', 6)").stderr;
    assert!(
        stale.contains("LWF01: stale fencing token 6 for \"report\": 7 is recorded"),
        "{stale}"
    );
    assert_eq!(
        as_job("SELECT leasewrap.fence('report', 8)").stdout.trim(),
        "8"
    );
    let write = as_job(&format!("UPDATE {FENCE_TABLE} SET token = 0"));
    assert!(write.stderr.contains("42501"), "{}", write.stderr);
    let read = pg.psql_as(&monitor, &db, "SELECT token FROM leasewrap.fences()");
    assert_eq!(
        read.stdout.trim(),
        "8",
        "the administrator's reader reads with fences(): {}",
        read.stderr
    );
    let owner = "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'leasewrap'";
    assert_eq!(pg.psql_ok(&db, owner), "leasewrap_fence");
}

#[test]
fn a_re_run_keeps_the_administrator_s_grants_ties_and_lock_timeout() {
    let pg = pg();
    let db = pg.report_db("re_run");
    let monitor = role(pg.0, &db.name, "monitor");
    pg.0.psql_ok(
        &db.name,
        &format!(
        "GRANT USAGE ON SCHEMA leasewrap TO {monitor}; GRANT EXECUTE ON FUNCTION leasewrap.fences() TO {monitor};
         ALTER FUNCTION leasewrap.fence(text, text) SET lock_timeout = '7s';
         SELECT leasewrap.fence('{}', 3);", db.lease
    ),
    );
    install(pg.0, &db.name);
    assert_eq!(installed(pg.0, &db.name), version_3("7s"));
    let fence = pg.0.psql_as(
        &db.job,
        &db.name,
        &format!("SELECT leasewrap.fence('{}', 4)", db.lease),
    );
    assert_eq!(
        fence.stdout.trim(),
        "4",
        "the job's tie is kept: {}",
        fence.stderr
    );
    let read =
        pg.0.psql_as(&monitor, &db.name, "SELECT token FROM leasewrap.fences()");
    assert_eq!(read.stdout.trim(), "4", "{}", read.stderr);
    let public =
        "SELECT has_function_privilege('public', 'leasewrap.fence(text, text)', 'EXECUTE')";
    assert_eq!(pg.0.psql_ok(&db.name, public), "f");
}

/// A leasewrap.fence whose token is bigint (made by hand, or by an older recipe) is refused
/// with the statement that fixes it; nothing is changed.
#[test]
fn a_bigint_token_column_is_refused_with_the_statement_that_fixes_it() {
    let pg = postgres::shared();
    let db = pg.database("bigint");
    pg.psql_ok(&db, "CREATE SCHEMA leasewrap; CREATE TABLE leasewrap.fence (name text PRIMARY KEY, token bigint NOT NULL, fenced_at timestamptz NOT NULL DEFAULT now())");
    let out = install_output(pg, &db);
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("the fence table's token is bigint, not numeric(20,0)"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("ALTER TABLE leasewrap.fence ALTER COLUMN token TYPE numeric(20,0)"),
        "{}",
        out.stderr
    );
    let made = "SELECT count(*) FROM pg_proc WHERE pronamespace = 'leasewrap'::regnamespace";
    assert_eq!(pg.psql_ok(&db, made), "0", "nothing was installed");
    pg.psql_ok(
        &db,
        "ALTER TABLE leasewrap.fence ALTER COLUMN token TYPE numeric(20,0)",
    );
    install(pg, &db);
}

#[test]
fn a_newer_installed_version_is_refused() {
    let pg = pg();
    let db = pg.report_db("newer");
    pg.0.psql_ok(&db.name, "UPDATE leasewrap_data.installed SET version = 4");
    let out = install_output(pg.0, &db.name);
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("version 4 is installed, and this script is version 3"),
        "{}",
        out.stderr
    );
}

#[test]
fn an_installer_that_is_not_a_superuser_is_refused() {
    let pg = postgres::shared();
    let db = pg.database("not_superuser");
    let admin = role(pg, &db, "admin");
    pg.psql_ok(&db, &format!("GRANT CREATE ON DATABASE {db} TO {admin}"));
    let mut cmd = pg.psql_command(&db);
    cmd.env("PGUSER", &admin).arg("-f").arg(FENCE_SQL);
    let out = run_bounded(cmd, BOUND);
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("install it as a superuser (this is {admin})")),
        "{}",
        out.stderr
    );
}

/// The fence's owner, on a server of its own (roles are the server's): it owns the schema
/// leasewrap and what is in it, nothing else; a leasewrap_fence that can log in is refused.
#[test]
fn the_fence_owner_owns_only_the_fence_and_one_that_can_log_in_is_refused() {
    let pg = Postgres::start();
    let db = pg.database("owner");
    install(&pg, &db);
    let elsewhere =
        "SELECT count(*) FROM pg_shdepend AS s, pg_identify_object(s.classid, s.objid, 0) AS o \
        WHERE s.refobjid = 'leasewrap_fence'::regrole AND s.deptype = 'o' \
        AND coalesce(o.schema, o.identity) NOT IN ('leasewrap', 'leasewrap_data')";
    assert_eq!(
        pg.psql_ok(&db, elsewhere),
        "0",
        "leasewrap_fence owns something else"
    );
    let owned = "SELECT count(*) FROM pg_shdepend WHERE refobjid = 'leasewrap_fence'::regrole AND deptype = 'o'";
    assert_ne!(pg.psql_ok(&db, owned), "0");
    pg.psql_ok(&db, "ALTER ROLE leasewrap_fence LOGIN PASSWORD 'known'");
    let out = install_output(&pg, &db);
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("the role leasewrap_fence exists and is not the plain NOLOGIN role"),
        "{}",
        out.stderr
    );
}
