//! The MariaDB fence against the server's other users, each played for real: another job's
//! user writing the fence's table, fencing a name it was not given or replacing the fence; and,
//! on a server of their own, a user with rights on the database leasewrap (by a wildcard) or
//! one that made it first, which the install refuses, changing nothing; then what a re-run
//! keeps.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{install, maria, user, Maria, FENCE_SQL};
use crate::dbfence::{self, Server};
use crate::support::mariadb::Mariadb;
use crate::support::Sandbox;

/// What another job's user tries on `b_name`'s row and the fence, and how MariaDB refuses it.
fn attacks(b_name: &str, job: &str) -> [(String, &'static str); 9] {
    let denied = "ERROR 1142 (42000)";
    [
        (
            format!("UPDATE leasewrap.fence SET token = 0 WHERE name = '{b_name}'"),
            denied,
        ),
        (
            format!("START TRANSACTION; CALL leasewrap.fence('{b_name}', 18446744073709551615)"),
            "may not fence",
        ),
        (
            format!("UPDATE leasewrap.fence SET name = 'elsewhere' WHERE name = '{b_name}'"),
            denied,
        ),
        (
            format!("DELETE FROM leasewrap.fence WHERE name = '{b_name}'"),
            denied,
        ),
        (
            format!("INSERT INTO leasewrap.allowed VALUES ('{job}', '*')"),
            denied,
        ),
        (
            format!("CALL leasewrap.allow('{job}', '*')"),
            "ERROR 1370 (42000)",
        ),
        (
            "CREATE OR REPLACE PROCEDURE leasewrap.fence(IN a TEXT, IN b TEXT) BEGIN END".into(),
            "ERROR 1044 (42000)",
        ),
        (
            "DROP PROCEDURE leasewrap.fence".into(),
            "ERROR 1370 (42000)",
        ),
        ("CREATE TABLE leasewrap.planted (id INT)".into(), denied),
    ]
}

#[test]
fn another_job_s_user_cannot_reset_poison_or_rename_a_name_it_was_not_given() {
    let maria = maria();
    let db = maria.report_db("other_job");
    let b_name = format!("{}.b", db.lease);
    let b = user(maria.0, &db.name, "b");
    maria
        .0
        .sql_ok("", &format!("CALL leasewrap.allow('{b}', '{b_name}')"));
    let as_b = |sql: &str| {
        maria
            .0
            .sql_as(&b, "", &format!("START TRANSACTION; {sql}; COMMIT"))
    };
    let first = as_b(&format!("CALL leasewrap.fence('{b_name}', 10)"));
    assert!(first.status.success(), "{}", first.stderr);
    for (attack, refusal) in &attacks(&b_name, &db.job) {
        let out = maria.0.sql_as(&db.job, &db.name, attack);
        assert!(
            out.stderr.contains(refusal),
            "{attack}: {}{}",
            out.stdout,
            out.stderr
        );
    }
    let stale = as_b(&format!("CALL leasewrap.fence('{b_name}', 9)")).stderr;
    assert!(
        stale.contains("(LWF01) at line 1: stale fencing token 9"),
        "{stale}"
    );
    let next = as_b(&format!("CALL leasewrap.fence('{b_name}', 11)"));
    assert!(next.status.success(), "{}", next.stderr);
}

/// The install from the shipped file on `server`, as the client ended.
fn install_output(server: &Mariadb) -> crate::support::Output {
    server.run_file(None, Path::new(FENCE_SQL))
}

/// On a server of its own: a user with rights on `leas%` (which matches leasewrap), then one
/// that made the database leasewrap first; each is refused, nothing is made; once both are gone,
/// the install goes on, and a re-run keeps an administrator's grant and the job's tie.
#[test]
fn the_install_refuses_a_database_another_user_may_change_or_made_first_and_a_re_run_keeps_grants()
{
    let server = &Mariadb::start();
    server.sql_ok(
        "",
        "CREATE USER 'hostile'@'localhost'; GRANT ALL ON `leas%`.* TO 'hostile'@'localhost'",
    );
    let out = install_output(server);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let refusal = "the account 'hostile'@'localhost' on leas%.* may change the database leasewrap";
    assert!(out.stderr.contains(refusal), "{}", out.stderr);
    let made = "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = 'leasewrap'";
    assert_eq!(server.sql_ok("", made), "0", "nothing made");
    let first = "CREATE DATABASE leasewrap; CREATE PROCEDURE leasewrap.fence(IN a TEXT, IN b TEXT) BEGIN END";
    let out = server.sql_as("hostile", "", first);
    assert!(out.status.success(), "{}", out.stderr);
    server.sql_ok("", "REVOKE ALL ON `leas%`.* FROM 'hostile'@'localhost'");
    let out = install_output(server);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("a database leasewrap exists that this script did not make"),
        "{}",
        out.stderr
    );
    server.sql_ok("", "DROP DATABASE leasewrap");
    install(server);
    re_run_keeps_grants(Maria(server));
}

/// An administrator's read grant and a job's tie and EXECUTE survive a re-run; the version is
/// recorded once.
fn re_run_keeps_grants(maria: Maria<'_>) {
    let db = maria.report_db("re_run");
    let monitor = user(maria.0, &db.name, "monitor");
    maria.0.sql_ok(
        "",
        &format!("GRANT EXECUTE ON PROCEDURE leasewrap.fences TO '{monitor}'@'localhost'"),
    );
    install(maria.0);
    assert_eq!(
        maria
            .0
            .sql_ok("", "SELECT GROUP_CONCAT(version) FROM leasewrap.installed"),
        "3"
    );
    let fence = format!(
        "START TRANSACTION; CALL leasewrap.fence('{}', 4); COMMIT",
        db.lease
    );
    let out = maria.0.sql_as(&db.job, &db.name, &fence);
    assert!(
        out.status.success(),
        "the job's tie and EXECUTE are kept: {}",
        out.stderr
    );
    let read = maria.0.sql_as(&monitor, "", "CALL leasewrap.fences()");
    assert!(
        read.stdout.contains(&format!("{}\t4\t", db.lease)),
        "the administrator's grant is kept: {}",
        read.stderr
    );
    assert_eq!(dbfence::recorded(&maria, &db), "4");
}

/// One team holds its first fence of a new name under its prefix (the row is made in its
/// transaction); another team's first fence of a new name next to it in the index goes on: the
/// fence locks no gap.
#[test]
fn a_first_fence_of_a_new_name_waits_for_no_other_team_s_new_name() {
    let maria = maria();
    let (db, sb) = (maria.report_db("gap"), Sandbox::new());
    let (lease, other) = (&db.lease, user(maria.0, &db.name, "other"));
    maria.0.sql_ok(
        "",
        &format!(
        "CALL leasewrap.allow('{}', '{lease}.a*'); CALL leasewrap.allow('{other}', '{lease}.b*')",
        db.job
    ),
    );
    let fence = format!("CALL leasewrap.fence('{lease}.azzzz', 1);");
    let holding = super::session_holding(&sb, (maria.0, &db), "A", &fence);
    let started = Instant::now();
    let next = format!("START TRANSACTION; CALL leasewrap.fence('{lease}.b', 1); COMMIT;");
    let out = maria.0.sql_as(&other, "", &next);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    fs::write(sb.path("A.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
}

/// A fenced transaction prepared with XA keeps NAME's row past its session; any account, one
/// with no right at all included, may end it with XA ROLLBACK (the job's update is undone) or
/// XA COMMIT, as docs/fencing.md says.
#[test]
fn any_account_may_end_a_prepared_fenced_transaction_as_the_docs_say() {
    let maria = maria();
    let db = maria.report_db("xa");
    let stranger = user(maria.0, &db.name, "stranger");
    let xid = format!("'{}'", db.name);
    let prepared = format!(
        "XA START {xid}; CALL leasewrap.fence('{}', 5); UPDATE report SET total = 1, who = 'xa' WHERE id = 1;
         XA END {xid}; XA PREPARE {xid};",
        db.lease
    );
    let out = maria.0.sql_as(&db.job, &db.name, &prepared);
    assert!(out.status.success(), "{}", out.stderr);
    let ended = maria.0.sql_as(&stranger, "", &format!("XA ROLLBACK {xid}"));
    assert!(ended.status.success(), "{}", ended.stderr);
    assert_eq!(dbfence::report(&maria, &db.name), "0 by nobody");
    let text = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/fencing.md")).unwrap();
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let said = "any account may end it with `XA COMMIT` or `XA ROLLBACK`";
    assert!(text.contains(said), "docs/fencing.md says: {said}");
}

/// Two users whose ties cover one name (a* and ab): each may record a token that stops the
/// other's holders, and allow() says so when the second tie is made; ties that cover no common
/// name get no warning.
#[test]
fn allow_warns_when_another_user_s_tie_covers_a_name_of_the_new_one() {
    let maria = maria();
    let db = maria.report_db("overlap");
    let (a, b) = (user(maria.0, &db.name, "a"), user(maria.0, &db.name, "b"));
    let lease = &db.lease;
    let allow = |user: &str, names: &str| {
        maria
            .0
            .sql_ok("", &format!("CALL leasewrap.allow('{user}', '{names}')"))
    };
    assert_eq!(
        allow(&a, &format!("{lease}.a*")),
        "",
        "the first tie overlaps nothing"
    );
    let warned = allow(&b, &format!("{lease}.ab"));
    let both =
        format!("user {b} ({lease}.ab) and these users may both fence a name: {a} ({lease}.a*)");
    assert!(warned.contains(&both), "{warned}");
    assert_eq!(
        allow(&b, &format!("{lease}.b*")),
        "",
        "b* and a* cover no common name"
    );
}
