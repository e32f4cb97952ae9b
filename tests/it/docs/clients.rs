//! The Python examples of docs/fencing.md, run as their text says against the tests' real
//! servers: psycopg on PostgreSQL, PyMySQL on MariaDB. Each commits with its token, and exits
//! 73 with a stale one, writing nothing; psycopg's, once its connection is in a transaction
//! before `conn.transaction()` (a savepoint then), and PyMySQL's, with autocommit off, are
//! refused with LWF03.

use std::process::Command;

use super::examples::markdown;
use crate::dbfence::{self, Db, Server, BOUND};
use crate::support::{run_bounded, Output, Sandbox};

/// The block of docs/fencing.md that imports `module`.
fn python_example(module: &str) -> String {
    let found = markdown("docs/fencing.md")
        .into_iter()
        .find(|e| e.text.contains(&format!("import {module}\n")));
    found
        .unwrap_or_else(|| panic!("docs/fencing.md has a Python example with {module}"))
        .text
}

/// `code` run by python3 with `env`, as leasewrap's child would be with `token`.
fn run_python(sb: &Sandbox, code: &str, db: &Db, token: &str, env: &[(String, String)]) -> Output {
    let file = sb.path("job.py");
    std::fs::write(&file, code).unwrap();
    let mut python = Command::new("python3");
    python
        .arg(&file)
        .envs(env.iter().cloned())
        .env("LEASEWRAP_NAME", &db.lease)
        .env("LEASEWRAP_FENCING_TOKEN", token);
    run_bounded(python, BOUND)
}

#[track_caller]
fn python_has(module: &str) {
    let out = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output();
    assert!(
        out.is_ok_and(|o| o.status.success()),
        "python3 cannot import {module}: scripts/test.sh installs it from PyPI (psycopg[binary], PyMySQL)"
    );
}

/// With its token the example commits (the total goes up by one); with a lower one it exits 73
/// and the total stays.
#[track_caller]
fn commits_then_refuses_a_stale_token(server: &dyn Server, db: &Db, run: impl Fn(&str) -> Output) {
    let out = run("5");
    assert_eq!(out.status.code(), Some(0), "{}{}", out.stdout, out.stderr);
    assert_eq!(dbfence::report(server, &db.name), "1 by nobody");
    assert_eq!(dbfence::recorded(server, db), "5");
    let stale = run("3");
    assert_eq!(
        stale.status.code(),
        Some(73),
        "{}{}",
        stale.stdout,
        stale.stderr
    );
    assert_eq!(
        dbfence::report(server, &db.name),
        "1 by nobody",
        "a stale write landed"
    );
}

#[test]
fn the_psycopg_example_commits_with_its_token_and_exits_73_when_stale() {
    python_has("psycopg");
    let (pg, sb) = (crate::postgres::pg(), Sandbox::new());
    let db = pg.report_db("psycopg");
    let code = python_example("psycopg").replace("dbname=reports", &format!("dbname={}", db.name));
    let mut env = pg.0.env(&db.name);
    env.push(("PGUSER".into(), db.job.clone()));
    commits_then_refuses_a_stale_token(&pg, &db, |token| run_python(&sb, &code, &db, token, &env));
    let in_a_transaction = code.replace("autocommit=True", "autocommit=False").replace(
        "    try:\n",
        "    conn.execute(\"SET statement_timeout = '1min'\")\n    try:\n",
    );
    let out = run_python(&sb, &in_a_transaction, &db, "6", &env);
    let refusal = "leasewrap.fence: called inside a savepoint";
    assert!(
        out.stderr.contains(refusal),
        "a savepoint is refused: {}",
        out.stderr
    );
}

#[test]
fn the_pymysql_example_commits_with_its_token_and_exits_73_when_stale() {
    python_has("pymysql");
    let (maria, sb) = (crate::mariadb::maria(), Sandbox::new());
    let db = maria.report_db("pymysql");
    let socket = maria.0.socket().display().to_string();
    let code = python_example("pymysql")
        .replace("/run/mysqld/mysqld.sock", &socket)
        .replace("user=\"report_job\"", &format!("user=\"{}\"", db.job))
        .replace("database=\"reports\"", &format!("database=\"{}\"", db.name));
    commits_then_refuses_a_stale_token(&maria, &db, |token| {
        run_python(&sb, &code, &db, token, &[])
    });
    let autocommit_off = code.replace("autocommit=True", "autocommit=False");
    let out = run_python(&sb, &autocommit_off, &db, "6", &[]);
    let refusal = "leasewrap.fence: called with autocommit off";
    assert!(
        out.stderr.contains(refusal),
        "autocommit off is refused: {}",
        out.stderr
    );
}
