//! The fence against the database's other roles and the job's own client (issue 26's findings,
//! each played for real on the shared server): operators planted in public, another job's role
//! writing the fence's table or fencing a name it was not given, a schema leasewrap made first
//! by another role, a holder whose backend is stuck sending it rows, savepoints, and a psqlrc.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::{install, pg, role, FENCE_SQL, FENCE_TABLE};
use crate::dbfence::{self, Server, BOUND};
use crate::support::postgres::{Postgres, PSQL};
use crate::support::{q, run_bounded, wait_until, Sandbox};

/// What the planted functions leave behind when they run: they record who ran them.
const PLANT: &str = "
GRANT CREATE ON SCHEMA public TO DB_hostile;
SET ROLE DB_hostile;
CREATE TABLE public.ran (who text NOT NULL DEFAULT current_user);
GRANT INSERT, SELECT ON public.ran TO PUBLIC;
CREATE FUNCTION public.lt(numeric, integer) RETURNS boolean LANGUAGE sql
    AS $$ INSERT INTO public.ran DEFAULT VALUES; SELECT false $$;
CREATE FUNCTION public.ge(numeric, integer) RETURNS boolean LANGUAGE sql
    AS $$ INSERT INTO public.ran DEFAULT VALUES; SELECT true $$;
CREATE FUNCTION public.ne(text, text) RETURNS boolean LANGUAGE sql
    AS $$ INSERT INTO public.ran DEFAULT VALUES; SELECT true $$;
CREATE OPERATOR public.< (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.lt);
CREATE OPERATOR public.> (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.lt);
CREATE OPERATOR public.>= (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.ge);
CREATE OPERATOR public.<= (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.ge);
CREATE OPERATOR public.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = public.ne);
RESET ROLE;";

/// A role of the test's database that may create objects in public, as every role could
/// before PostgreSQL 15; `sql` (PLANT) run as it on the database.
fn plant(db: &str) -> String {
    format!(
        "CREATE ROLE {db}_hostile LOGIN; {}",
        PLANT.replace("DB", db)
    )
}

/// The job fences the recorded token's holder out: a stale token and a negative one are refused.
#[track_caller]
fn stale_and_negative_tokens_are_refused(db: &dbfence::Db) {
    let pg = pg();
    let job = |token: &str| {
        pg.0.psql_as(
            &db.job,
            &db.name,
            &format!("SELECT leasewrap.fence('{}', {token})", db.lease),
        )
    };
    assert!(job("100").status.success());
    let stale = job("50");
    assert!(
        stale.stderr.contains("LWF01"),
        "a stale token is refused: {}",
        stale.stderr
    );
    let negative = job("-5");
    assert!(
        negative.stderr.contains("LWF02"),
        "a negative token is refused: {}",
        negative.stderr
    );
    assert_eq!(dbfence::recorded(&pg, db), "100");
    let ran = pg.0.psql_ok(&db.name, "SELECT count(*) FROM public.ran");
    assert_eq!(ran, "0", "a planted operator ran inside the fence");
}

#[test]
fn operators_planted_in_public_after_the_install_are_never_resolved_by_the_fence() {
    let pg = pg();
    let db = pg.report_db("planted_after");
    pg.0.psql_ok(&db.name, &plant(&db.name));
    stale_and_negative_tokens_are_refused(&db);
}

/// The installer's CHECKs are made with its own pinned search_path: no operator of public is
/// baked into them, where it would run as every role that fences.
#[test]
fn operators_planted_in_public_before_the_install_are_not_baked_into_its_checks() {
    let pg = pg();
    let db = pg.report_db_with("planted_before", &plant("DB"));
    let foreign =
        "SELECT count(*) FROM pg_depend AS d JOIN pg_operator AS o ON o.oid = d.refobjid \
        WHERE d.refclassid = 'pg_operator'::regclass AND d.classid = 'pg_constraint'::regclass \
        AND o.oprnamespace <> 'pg_catalog'::regnamespace";
    assert_eq!(
        pg.0.psql_ok(&db.name, foreign),
        "0",
        "a CHECK uses a planted operator"
    );
    stale_and_negative_tokens_are_refused(&db);
}

/// Job A has what the docs give a job; job B fences B's own name. A can neither reset, poison
/// nor rename B's row, nor give itself B's name, nor replace the fence.
#[test]
fn another_job_s_role_cannot_reset_poison_or_rename_a_name_it_was_not_given() {
    let pg = pg();
    let db = pg.report_db("other_job");
    let b_name = format!("{}.b", db.lease);
    let b = role(pg.0, &db.name, "b");
    pg.0.psql_ok(
        &db.name,
        &format!("SELECT leasewrap.allow('{b}', '{b_name}')"),
    );
    let as_b = |sql: &str| pg.0.psql_as(&b, &db.name, sql);
    assert!(as_b(&format!("SELECT leasewrap.fence('{b_name}', 10)"))
        .status
        .success());
    let attacks = [
        format!("UPDATE {FENCE_TABLE} SET token = 0 WHERE name = '{b_name}'"),
        format!("SELECT leasewrap.fence('{b_name}', 18446744073709551615)"),
        format!("UPDATE {FENCE_TABLE} SET name = 'elsewhere' WHERE name = '{b_name}'"),
        format!("DELETE FROM {FENCE_TABLE} WHERE name = '{b_name}'"),
        format!("INSERT INTO leasewrap_data.allowed VALUES ('{}', '*')", db.job),
        format!("SELECT leasewrap.allow('{}', '*')", db.job),
        "CREATE OR REPLACE FUNCTION leasewrap.fence(name text, token text) RETURNS numeric LANGUAGE sql AS 'SELECT 0::numeric'".into(),
        "ALTER FUNCTION leasewrap.fence(text, text) RESET lock_timeout".into(),
        "CREATE FUNCTION leasewrap.planted() RETURNS int LANGUAGE sql AS 'SELECT 1'".into(),
        "SET ROLE leasewrap_fence".into(),
    ];
    for attack in &attacks {
        let out = pg.0.psql_as(&db.job, &db.name, attack);
        assert!(
            out.stderr.contains("42501"),
            "{attack}: {}{}",
            out.stdout,
            out.stderr
        );
    }
    let stale = as_b(&format!("SELECT leasewrap.fence('{b_name}', 9)"));
    assert!(
        stale.stderr.contains("LWF01: stale fencing token 9"),
        "{}",
        stale.stderr
    );
    assert!(as_b(&format!("SELECT leasewrap.fence('{b_name}', 11)"))
        .status
        .success());
}

/// A role that may create schemas made `leasewrap` first, with a fence of its own in it: the
/// install refuses, says why, and makes nothing.
#[test]
fn a_schema_leasewrap_made_first_by_another_role_is_refused_and_nothing_is_installed() {
    let pg = pg();
    let db = pg.0.database("schema_first");
    let hostile = role(pg.0, &db, "hostile");
    pg.0.psql_ok(&db, &format!(
        "GRANT CREATE ON DATABASE {db} TO {hostile}; SET ROLE {hostile}; CREATE SCHEMA leasewrap;
         CREATE FUNCTION leasewrap.fence(name text, token text) RETURNS numeric LANGUAGE sql AS 'SELECT 0::numeric';
         RESET ROLE;"
    ));
    let out = pg.0.psql_file(&db, &[], Path::new(FENCE_SQL));
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    let refusal =
        format!("the schema leasewrap belongs to the role {hostile}, not to leasewrap_fence");
    assert!(out.stderr.contains(&refusal), "{}", out.stderr);
    let made = "SELECT count(*) FROM pg_class WHERE relnamespace = 'leasewrap'::regnamespace";
    assert_eq!(pg.0.psql_ok(&db, made), "0", "nothing installed");
}

/// A holder (psql on `env`, as `db`'s job, with the session settings `set`) that fences, then
/// stops while its backend sends it rows: its standard output is never read, so psql stops
/// reading the socket once the pipe is full, and is then stopped. Returns it once its backend
/// waits in ClientWrite.
fn stuck_in_client_write(
    pg: &Postgres,
    db: &dbfence::Db,
    env: &[(String, String)],
    set: &str,
) -> Stuck {
    let rows = "COPY (SELECT repeat('x', 1000) FROM generate_series(1, 1000000)) TO STDOUT";
    let sql = format!(
        "{set} BEGIN; SELECT leasewrap.fence('{}', 1); {rows}; COMMIT;",
        db.lease
    );
    let mut stuck = Command::new(PSQL);
    stuck.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", &sql]);
    stuck
        .envs(env.iter().cloned())
        .env("PGUSER", &db.job)
        .stdout(Stdio::piped());
    let stuck = Stuck(stuck.spawn().unwrap());
    wait_until(BOUND, "the stuck holder's backend in ClientWrite", || {
        backends_writing(pg, db) == "1"
    });
    kill(Pid::from_raw(stuck.0.id() as i32), Signal::SIGSTOP).unwrap();
    stuck
}

/// The stuck holder's psql, killed and reaped on drop.
struct Stuck(Child);

impl Drop for Stuck {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How many of the job's backends wait to send (ClientWrite).
fn backends_writing(pg: &Postgres, db: &dbfence::Db) -> String {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = '{}' AND wait_event = 'ClientWrite'",
        db.job
    );
    pg.psql_ok(&db.name, &sql)
}

/// The holder's backend is stuck sending rows to a client that stopped reading (its process
/// stopped: the socket's buffers full), on a Unix socket. No timeout of the session frees it
/// (both are set, at 1 s); the next holder's fence gives up after the function's lock_timeout
/// (55P03, nothing written), as an administrator set it.
#[test]
fn a_holder_stuck_while_its_backend_sends_rows_is_bounded_by_the_fence_s_lock_timeout() {
    let pg = pg();
    let db = pg.report_db("client_write");
    let timeout = "ALTER FUNCTION leasewrap.fence(text, text) SET lock_timeout = '1s'";
    pg.0.psql_ok(&db.name, timeout);
    let set = "SET idle_in_transaction_session_timeout = '1s'; SET statement_timeout = '1s';";
    let _stuck = stuck_in_client_write(pg.0, &db, &pg.0.env(&db.name), set);
    let next = pg.0.psql_as(
        &db.job,
        &db.name,
        &format!("SELECT leasewrap.fence('{}', 2)", db.lease),
    );
    assert!(
        next.stderr.contains("55P03"),
        "the next fence gives up: {}",
        next.stderr
    );
    assert_eq!(
        backends_writing(pg.0, &db),
        "1",
        "still stuck, past both session timeouts"
    );
}

/// The same holder over TCP, with tcp_user_timeout in its session (as libpq's option, or the
/// server's setting, gives it): the server drops the connection once its data has gone
/// unacknowledged that long, the transaction rolls back, and the next holder's fence goes on
/// well before the function's lock_timeout.
#[test]
fn over_tcp_tcp_user_timeout_ends_a_holder_stuck_while_its_backend_sends_rows() {
    let pg = Postgres::start_on_loopback();
    let db = pg.database("tcp_user_timeout");
    install(&pg, &db);
    let job = role(&pg, &db, "job");
    pg.psql_ok(&db, &format!("SELECT leasewrap.allow('{job}', 'report')"));
    let db = dbfence::Db {
        name: db,
        job,
        lease: "report".into(),
    };
    let _stuck = stuck_in_client_write(
        &pg,
        &db,
        &pg.tcp_env(&db.name),
        "SET tcp_user_timeout = 2000;",
    );
    let next = pg.psql_as(&db.job, &db.name, "SELECT leasewrap.fence('report', 2)");
    assert_eq!(
        next.stdout.trim(),
        "2",
        "the next fence goes on: {}",
        next.stderr
    );
    assert_eq!(backends_writing(&pg, &db), "0");
}

/// A fence inside a savepoint (psql's ON_ERROR_ROLLBACK makes one around every statement) is
/// refused with LWF03: rolling back to it would release the row while the transaction went on.
#[test]
fn a_fence_inside_a_savepoint_is_refused_with_lwf03() {
    let pg = pg();
    let (db, sb) = (pg.report_db("savepoint"), Sandbox::new());
    let fence = format!("SELECT leasewrap.fence('{}', 5);", db.lease);
    let explicit = format!("BEGIN; SAVEPOINT s; {fence} ROLLBACK TO s; COMMIT;");
    let out = pg.0.psql_as(&db.job, &db.name, &explicit);
    assert!(out.stderr.contains("LWF03"), "{}", out.stderr);
    let script = sb.path("job.sql");
    fs::write(
        &script,
        format!("\\set ON_ERROR_ROLLBACK on\nBEGIN;\n{fence}\nCOMMIT;\n"),
    )
    .unwrap();
    let mut implicit = pg.0.psql_command(&db.name);
    implicit.env("PGUSER", &db.job).arg("-f").arg(&script);
    let out = run_bounded(implicit, BOUND);
    assert!(out.stderr.contains("LWF03"), "{}", out.stderr);
    assert_eq!(dbfence::recorded(&pg, &db), "", "nothing recorded");
    let top = pg.0.psql_as(
        &db.job,
        &db.name,
        &format!("BEGIN; {fence} SAVEPOINT s; ROLLBACK TO s; COMMIT;"),
    );
    assert!(
        top.status.success(),
        "a savepoint after the fence is fine: {}",
        top.stderr
    );
}

/// The psql line in docs/fencing.md that runs the job.
fn documented_job_line() -> String {
    let text = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/fencing.md")).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("psql ") && l.contains("-f /usr/local/lib/report.sql"));
    let line = line.expect("docs/fencing.md runs the job's script with psql");
    let start = line.find("psql ").unwrap();
    line[start..].trim_end_matches('\'').to_owned()
}

/// A user's psqlrc that turns ON_ERROR_STOP off and ON_ERROR_ROLLBACK on does not reach the
/// documented job line (-X): a stale holder's psql stops at its refused fence, writing nothing.
#[test]
fn a_psqlrc_does_not_defeat_the_documented_job_line() {
    let pg = pg();
    let (db, sb) = (pg.report_db("psqlrc"), Sandbox::new());
    fs::write(
        sb.path(".psqlrc"),
        "\\set ON_ERROR_STOP off\n\\set ON_ERROR_ROLLBACK on\n",
    )
    .unwrap();
    let script = dbfence::holder_sql(&pg, &sb, "stale", 1, dbfence::Pause::Nowhere);
    pg.0.psql_ok(
        &db.name,
        &format!("SELECT leasewrap.fence('{}', 9)", db.lease),
    );
    let line = documented_job_line()
        .replace("-d reports", &format!("-d {}", db.name))
        .replace("/usr/local/lib/report.sql", &q(&script));
    let mut env = pg.0.env(&db.name);
    env.push(("PGUSER".into(), db.job.clone()));
    dbfence::a_stale_documented_line_writes_nothing(&pg, (&db, &sb), &line, &env);
}

/// Every psql command line of the README, docs/, the man pages and the SQL files' comments
/// reads no psqlrc (-X) and stops at the first error (-v ON_ERROR_STOP=1).
#[test]
fn every_documented_psql_line_reads_no_psqlrc_and_stops_on_error() {
    let runs = |l: &str| l.contains("psql -") || l.trim_end().ends_with("| psql");
    let say = |l: &str| l.contains("psql -X") && l.contains("-v ON_ERROR_STOP=1");
    let wrong = dbfence::documented_lines_without("sql/postgres-fence.sql", runs, say);
    assert!(
        wrong.is_empty(),
        "psql lines without -X -v ON_ERROR_STOP=1:\n{}",
        wrong.join("\n")
    );
}

/// The README's install line, on a database where the install fails (read-only): it exits
/// non-zero, where a psql without ON_ERROR_STOP would go on and exit 0.
#[test]
fn the_readme_s_install_line_exits_non_zero_when_the_install_fails() {
    let pg = pg();
    let db = pg.0.database("readme_install");
    pg.0.psql_ok(
        &db,
        &format!("ALTER DATABASE {db} SET default_transaction_read_only = on"),
    );
    let readme = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.contains("fence-sql postgres | psql"));
    let line = line.expect("the README installs the fence with psql");
    let start = line.find("leasewrap fence-sql").unwrap();
    let end = line[start..].find('`').map_or(line.len(), |e| start + e);
    let line = line[start..end].replace("-d reports", &format!("-d {db}"));
    let mut sh = Command::new("/bin/sh");
    sh.args(["-c", &line]).envs(pg.0.env(&db));
    sh.env(
        "PATH",
        format!(
            "{}:{}",
            Path::new(crate::support::BIN).parent().unwrap().display(),
            std::env::var("PATH").unwrap()
        ),
    );
    let out = run_bounded(sh, BOUND);
    assert_ne!(out.status.code(), Some(0), "{line}: {}", out.stderr);
    assert!(
        out.stderr.contains("read-only transaction"),
        "{}",
        out.stderr
    );
}

/// Two teams whose ties cover one name (a* and ab): each may record a token that stops the
/// other's holders, and allow() says so when the second tie is made, naming both; ties that
/// cover no common name (a* and b*) get no warning.
#[test]
fn allow_warns_when_another_role_s_tie_covers_a_name_of_the_new_one() {
    let pg = pg();
    let db = pg.report_db("overlap");
    let (a, b) = (
        role(pg.0, &db.name, "team_a"),
        role(pg.0, &db.name, "team_b"),
    );
    let lease = &db.lease;
    let allow = |role: &str, names: &str| {
        let out = pg.0.psql(
            &db.name,
            &format!("SELECT leasewrap.allow('{role}', '{names}')"),
        );
        assert!(out.status.success(), "{}", out.stderr);
        out.stderr
    };
    assert_eq!(
        allow(&a, &format!("{lease}.a*")),
        "",
        "the first tie overlaps nothing"
    );
    let warned = allow(&b, &format!("{lease}.ab"));
    let both = format!("role {b} ({lease}.ab) and role {a} ({lease}.a*) may both fence a name");
    assert!(warned.contains(&both), "{warned}");
    let poison = format!("SELECT leasewrap.fence('{lease}.ab', 18446744073709551615)");
    assert!(pg.0.psql_as(&a, &db.name, &poison).status.success());
    let stopped = pg.0.psql_as(
        &b,
        &db.name,
        &format!("SELECT leasewrap.fence('{lease}.ab', 5)"),
    );
    assert!(
        stopped.stderr.contains("LWF01"),
        "team a stopped team b's name: {}",
        stopped.stderr
    );
    assert_eq!(
        allow(&b, &format!("{lease}.b*")),
        "",
        "b* and a* cover no common name"
    );
}

/// The documented job line, run on `db` as its job with `token`, its script `script`.
fn run_documented_job_line(
    pg: &super::Pg,
    db: &dbfence::Db,
    script: &Path,
    token: &str,
) -> crate::support::Output {
    let line = documented_job_line()
        .replace("-d reports", &format!("-d {}", db.name))
        .replace("/usr/local/lib/report.sql", &q(script));
    let mut sh = Command::new("/bin/sh");
    sh.args(["-c", &line])
        .envs(pg.0.env(&db.name))
        .env("PGUSER", &db.job)
        .env("LEASEWRAP_NAME", &db.lease)
        .env("LEASEWRAP_FENCING_TOKEN", token);
    run_bounded(sh, BOUND)
}

/// docs/fencing.md's job transaction, run by its psql line with a stale token, prints on
/// standard error what the documentation shows, word for word (the lease name and the script's
/// path are the test's).
#[test]
fn the_refusal_docs_fencing_md_shows_is_what_psql_prints() {
    let pg = pg();
    let (db, sb) = (pg.report_db("refusal"), Sandbox::new());
    pg.0.psql_ok(
        &db.name,
        &format!("SELECT leasewrap.fence('{}', 3)", db.lease),
    );
    let script = dbfence::documented_transaction(&sb, "BEGIN");
    let out = run_documented_job_line(&pg, &db, &script, "2");
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    let shown =
        &dbfence::documented_blocks("the_refusal_docs_fencing_md_shows_is_what_psql_prints")[0];
    let expected = shown
        .replace("\"report\"", &format!("\"{}\"", db.lease))
        .replace("/usr/local/lib/report.sql", &script.display().to_string());
    assert_eq!(out.stderr, expected);
}

/// psql on `db`, printing what each statement did (UPDATE 1, ...), with `vars`, running the
/// script `file`.
fn psql_tagged(
    pg: &Postgres,
    db: &str,
    vars: &[(&str, &str)],
    file: &Path,
) -> crate::support::Output {
    let mut cmd = Command::new(PSQL);
    cmd.args(["-X", "-v", "ON_ERROR_STOP=1"]).envs(pg.env(db));
    for (name, value) in vars {
        cmd.arg("-v").arg(format!("{name}={value}"));
    }
    cmd.arg("-f").arg(file);
    run_bounded(cmd, BOUND)
}

/// The blocks of docs/fencing.md's "A SQL table, by hand", and each written to a script file.
fn by_hand_scripts(sb: &Sandbox) -> (Vec<String>, Vec<std::path::PathBuf>) {
    let blocks = dbfence::documented_blocks("the_sql_by_hand_of_docs_fencing_md_runs_as_shown");
    assert_eq!(blocks.len(), 5, "{blocks:?}");
    let write = |(i, text): (usize, &String)| {
        let path = sb.path(&format!("by-hand-{i}.sql"));
        fs::write(&path, text).unwrap();
        path
    };
    let files = blocks.iter().enumerate().map(write).collect();
    (blocks, files)
}

/// The psql scripts of docs/fencing.md's "A SQL table, by hand", each run as it is written, in
/// order, on a report table with a body: the conditional write, the guarded insert, and the
/// fences row raised first, each with a current token and then a stale one.
#[test]
fn the_sql_by_hand_of_docs_fencing_md_runs_as_shown() {
    let (pg, sb) = (pg(), Sandbox::new());
    let db = pg.0.database("by_hand");
    pg.0.psql_ok(&db, "CREATE TABLE report (id int PRIMARY KEY, body text NOT NULL); INSERT INTO report VALUES (1, 'old')");
    let (blocks, files) = by_hand_scripts(&sb);
    let run = |i: usize, vars: &[(&str, &str)]| {
        let out = psql_tagged(pg.0, &db, vars, &files[i]);
        assert!(out.status.success(), "{}: {}", blocks[i], out.stderr);
        (out.stdout.trim().to_owned(), out.stderr)
    };
    run(0, &[]);
    assert_eq!(
        run(1, &[("id", "1"), ("body", "new"), ("token", "5")]).0,
        "UPDATE 1"
    );
    assert_eq!(
        run(1, &[("id", "1"), ("body", "stale"), ("token", "4")]).0,
        "UPDATE 0"
    );
    assert_eq!(
        run(2, &[("id", "2"), ("body", "two"), ("token", "5")]).0,
        "INSERT 0 1"
    );
    assert_eq!(
        run(2, &[("id", "2"), ("body", "stale"), ("token", "3")]).0,
        "INSERT 0 0"
    );
    run(3, &[]);
    let many = [("id", "1"), ("body", "many"), ("token", "7")];
    assert_eq!(run(4, &many).0, "BEGIN\nUPDATE 1\nUPDATE 1\nCOMMIT");
    let (said, warned) = run(4, &[("id", "1"), ("body", "stale"), ("token", "6")]);
    assert_eq!(
        (said.as_str(), warned.trim()),
        (
            "BEGIN\nUPDATE 0\nROLLBACK",
            "stale fencing token 6 for report"
        )
    );
    let bodies =
        pg.0.psql_ok(&db, "SELECT string_agg(body, ',' ORDER BY id) FROM report");
    assert_eq!(bodies, "many,two", "no stale write landed");
}
