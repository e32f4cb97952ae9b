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

/// The shipped version (5) installed, with the fence's lock_timeout `lock_timeout`.
fn shipped_version(lock_timeout: &str) -> (String, String) {
    let settings = format!("search_path=pg_catalog, pg_temp;lock_timeout={lock_timeout}");
    ("5".to_owned(), settings)
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
    assert_eq!(installed(pg, &db), shipped_version("2min"));
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
    assert_eq!(installed(pg.0, &db.name), shipped_version("7s"));
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
    pg.0.psql_ok(&db.name, "UPDATE leasewrap_data.installed SET version = 6");
    let out = install_output(pg.0, &db.name);
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("version 6 is installed, and this script is version 5"),
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

/// Version 1 with what its jobs could do through `GRANT ALL` and column grants: `all` made a
/// trigger on the table with its TRIGGER right; `columns` may insert (name, token) and update
/// (token, fenced_at).
fn version_1_with_write_paths(pg: &Postgres) -> (String, String, String) {
    let db = pg.database("v1_paths");
    let out = pg.psql_file(&db, &[], Path::new(VERSION_1));
    assert!(out.status.success(), "{}", out.stderr);
    let (all, columns) = (role(pg, &db, "all"), role(pg, &db, "columns"));
    pg.psql_ok(
        &db,
        &format!(
        "GRANT USAGE ON SCHEMA leasewrap TO {all}, {columns}; GRANT ALL ON leasewrap.fence TO {all};
         GRANT INSERT (name, token), UPDATE (token, fenced_at) ON leasewrap.fence TO {columns};
         CREATE SCHEMA jobs AUTHORIZATION {all};"
    ),
    );
    let trigger = "CREATE FUNCTION jobs.zero() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN NEW.token := 0; RETURN NEW; END';
                   CREATE TRIGGER zero BEFORE UPDATE ON leasewrap.fence FOR EACH ROW EXECUTE FUNCTION jobs.zero();";
    let made = pg.psql_as(&all, &db, trigger);
    assert!(made.status.success(), "{}", made.stderr);
    (db, all, columns)
}

/// The upgrade refuses the version 1 job's trigger by name (it would fire inside every fence,
/// as the fence's owner); once it is dropped, every right of the jobs on the table goes, column
/// grants included, and each role that could write is tied to * with a warning whose statements
/// run as printed.
#[test]
fn the_upgrade_from_version_1_refuses_its_trigger_and_leaves_no_write_path() {
    let pg = postgres::shared();
    let (db, all, columns) = version_1_with_write_paths(pg);
    let out = install_output(pg, &db);
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    assert!(
        out.stderr.contains("trigger zero on leasewrap.fence"),
        "{}",
        out.stderr
    );
    pg.psql_ok(&db, "DROP TRIGGER zero ON leasewrap.fence");
    let out = install_output(pg, &db);
    assert!(out.status.success(), "{}", out.stderr);
    for role in [&all, &columns] {
        let tie = format!("leasewrap.allow('{role}', NAME) and leasewrap.disallow('{role}', '*')");
        assert!(out.stderr.contains(&tie), "{tie}: {}", out.stderr);
        let fence = super::fence_table_of(pg, &db);
        for write in [
            format!("UPDATE {fence} SET token = 0"),
            format!("INSERT INTO {fence} (name, token) VALUES ('planted', 1)"),
        ] {
            let refused = pg.psql_as(role, &db, &write);
            assert!(
                refused.stderr.contains("42501"),
                "{role}: {write}: {}",
                refused.stderr
            );
        }
    }
    assert_eq!(
        super::rights::rights(pg, &db),
        super::rights::documented(&[&all, &columns])
    );
}

/// A role dropped after it was tied (DROP OWNED BY, DROP ROLE) leaves its tie behind: disallow()
/// takes it by the role's OID, and a re-run removes the others, naming them.
#[test]
fn a_tie_to_a_dropped_role_goes_with_disallow_and_with_a_re_run() {
    let pg = pg();
    let db = pg.report_db("dropped");
    let (gone, gone_too) = (
        role(pg.0, &db.name, "gone"),
        role(pg.0, &db.name, "gone_too"),
    );
    let ties = format!("SELECT leasewrap.allow('{gone}', 'x'), leasewrap.allow('{gone_too}', 'y')");
    pg.0.psql_ok(&db.name, &ties);
    let oids = format!("SELECT '{gone}'::regrole::oid || ' ' || '{gone_too}'::regrole::oid");
    let oids = pg.0.psql_ok(&db.name, &oids);
    let (oid, oid_too) = oids.split_once(' ').unwrap();
    pg.0.psql_ok(
        &db.name,
        &format!("DROP OWNED BY {gone}, {gone_too}; DROP ROLE {gone}, {gone_too}"),
    );
    let out = pg.0.psql(
        &db.name,
        &format!("SELECT leasewrap.disallow('{oid}', 'x')"),
    );
    assert!(out.status.success(), "{}", out.stderr);
    let out = install_output(pg.0, &db.name);
    assert!(out.status.success(), "{}", out.stderr);
    let removed =
        format!("the role whose OID was {oid_too} has been dropped; its tie to y is removed");
    assert!(out.stderr.contains(&removed), "{}", out.stderr);
    let ties = pg.0.psql_ok(
        &db.name,
        "SELECT string_agg(names, ',') FROM leasewrap_data.allowed",
    );
    assert_eq!(ties, db.lease, "only the job's tie is left");
    let last = format!("SELECT leasewrap.disallow('{}', '{}')", db.job, db.lease);
    pg.0.psql_ok(&db.name, &last);
    assert_eq!(
        super::rights::rights(pg.0, &db.name),
        super::rights::documented(&[]),
        "the grants went with the last tie"
    );
}
