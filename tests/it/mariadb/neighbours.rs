//! The MariaDB fence against the server's other users, each played for real: another job's
//! user writing the fence's table, fencing a name it was not given or replacing the fence; and,
//! on a server of their own, a user with rights on the database leasewrap (by a wildcard) or
//! one that made it first, which the install refuses, changing nothing; then what a re-run
//! keeps.

use std::path::Path;

use super::{install, maria, user, Maria, FENCE_SQL};
use crate::dbfence::{self, Server};
use crate::support::mariadb::Mariadb;

/// What another job's user tries on `b_name`'s row and the fence, and how MariaDB refuses it.
fn attacks(b_name: &str, job: &str) -> [(String, &'static str); 9] {
    let denied = "ERROR 1142 (42000)";
    [
        (
            format!("UPDATE leasewrap.fence SET token = 0 WHERE name = '{b_name}'"),
            denied,
        ),
        (
            format!("SET autocommit = 0; CALL leasewrap.fence('{b_name}', 18446744073709551615)"),
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
            .sql_as(&b, "", &format!("SET autocommit = 0; {sql}; COMMIT"))
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
        "2"
    );
    let fence = format!(
        "SET autocommit = 0; CALL leasewrap.fence('{}', 4); COMMIT",
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
