//! Statements that commit on their own (DDL, TRUNCATE, LOCK TABLES, a second START
//! TRANSACTION, SET autocommit = 1 where autocommit was off): each ends the job's transaction
//! and releases the fence's row, and MariaDB cannot be stopped from doing so. What the fence
//! makes of it: the session's later transactions are read-only, so that the job's writes after
//! such a commit fail instead of landing unfenced over a newer holder's (a session that fences
//! again starts with START TRANSACTION READ WRITE); and it runs only with autocommit on, where
//! SET autocommit = 1 commits nothing.

use std::fs;

use super::{as_job_in_thread, maria, Maria};
use crate::dbfence::{self, Db, Server, BOUND};
use crate::support::{wait_until, Sandbox};

/// A report database whose job may also change the tables (DROP, for TRUNCATE; CREATE; LOCK
/// TABLES), with a table `staging` to truncate.
fn commit_db(maria: &Maria<'_>, label: &str) -> Db {
    let db = maria.report_db(label);
    maria.0.sql_ok(
        &db.name,
        &format!(
            "CREATE TABLE staging (n INT) ENGINE = InnoDB;
             GRANT ALL ON {}.* TO '{}'@'localhost'",
            db.name, db.job
        ),
    );
    db
}

/// A fences with 30; its TRUNCATE commits the transaction and so releases the fence's row; B
/// fences with 31 and commits; A's later UPDATE must fail, not land over B's.
#[test]
fn a_truncate_after_the_fence_ends_it_and_the_holder_s_later_update_fails() {
    let maria = maria();
    let (db, sb) = (commit_db(&maria, "truncate"), Sandbox::new());
    let lease = &db.lease;
    let a_script = format!(
        "START TRANSACTION;\nCALL leasewrap.fence('{lease}', '30');\nTRUNCATE TABLE staging;\n{}\n\
         UPDATE report SET total = 1, who = 'A' WHERE id = 1;\nCOMMIT;",
        dbfence::wait_line(&sb, "A")
    );
    let a = as_job_in_thread(maria.0, &db, &a_script);
    wait_until(BOUND, "A past its TRUNCATE", || {
        sb.path("A.paused").exists() || a.is_finished()
    });
    let b = format!(
        "START TRANSACTION; CALL leasewrap.fence('{lease}', '31');
         UPDATE report SET total = 10, who = 'B' WHERE id = 1; COMMIT;"
    );
    let b = maria.0.sql_as(&db.job, &db.name, &b);
    assert!(b.status.success(), "{}", b.stderr);
    fs::write(sb.path("A.go"), "").unwrap();
    let a = a.join().unwrap();
    assert_eq!(a.status.code(), Some(1), "{}", a.stderr);
    assert!(a.stderr.contains("ERROR 1792 (25006)"), "{}", a.stderr);
    assert_eq!(dbfence::report(&maria, &db.name), "10 by B");
    assert_eq!(dbfence::recorded(&maria, &db), "31");
}

/// Each statement that commits on its own, after the fence: the write after it fails (1792),
/// and the client stops there. A second fenced transaction in one session, started as the
/// documentation says, goes on.
#[test]
fn each_statement_that_commits_on_its_own_leaves_the_writes_after_it_failing() {
    let maria = maria();
    let db = commit_db(&maria, "implicit");
    let statements = [
        "CREATE TABLE made (n INT)",
        "TRUNCATE TABLE staging",
        "LOCK TABLES report WRITE",
        "START TRANSACTION",
        "BEGIN",
    ];
    let update = "UPDATE report SET total = total + 1 WHERE id = 1";
    for (token, statement) in statements.iter().enumerate() {
        let sql = format!(
            "START TRANSACTION; CALL leasewrap.fence('{}', '{token}'); {statement}; {update}; COMMIT;",
            db.lease
        );
        let out = maria.0.sql_as(&db.job, &db.name, &sql);
        assert_eq!(out.status.code(), Some(1), "{statement}: {}", out.stderr);
        assert!(
            out.stderr.contains("ERROR 1792 (25006)"),
            "{statement}: {}",
            out.stderr
        );
        let report = dbfence::report(&maria, &db.name);
        assert_eq!(
            report, "0 by nobody",
            "{statement}: the write after it landed"
        );
    }
    let fenced = format!(
        "CALL leasewrap.fence('{}', '9'); {update}; COMMIT;",
        db.lease
    );
    let twice = format!("START TRANSACTION; {fenced} START TRANSACTION READ WRITE; {fenced}");
    let out = maria.0.sql_as(&db.job, &db.name, &twice);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(dbfence::report(&maria, &db.name), "2 by nobody");
}

/// SET autocommit = 1 commits only where autocommit was off, and then MariaDB runs the one
/// statement after it read-write still: the fence refuses to run with autocommit off, and with
/// autocommit on the statement leaves the fenced transaction as it was.
#[test]
fn set_autocommit_1_cannot_end_a_fenced_transaction() {
    let maria = maria();
    let db = commit_db(&maria, "autocommit");
    let fence = format!("CALL leasewrap.fence('{}', '1')", db.lease);
    let off = maria
        .0
        .sql_as(&db.job, &db.name, &format!("SET autocommit = 0; {fence}"));
    assert!(
        off.stderr
            .contains("(LWF03) at line 1: leasewrap.fence: called with autocommit off"),
        "{}",
        off.stderr
    );
    let on =
        format!("START TRANSACTION; {fence}; SET autocommit = 1; SELECT @@in_transaction; COMMIT;");
    let out = maria.0.sql_as(&db.job, &db.name, &on);
    assert_eq!(
        out.stdout.trim(),
        "1",
        "still in the fenced transaction: {}",
        out.stderr
    );
}
