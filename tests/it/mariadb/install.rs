//! Installing the MariaDB fence again, on servers of their own (grants and definers are the
//! server's): what another account's rights on the database leasewrap let it do, and what the
//! install then refuses by name (a column's grant, a routine's, SELECT on the table, a procedure
//! elsewhere that runs as the fence's definer); the accounts with global rights, which it cannot
//! refuse, named; the upgrade from version 1, which keeps the ties and makes a reader's SELECT
//! EXECUTE on fences(); and a re-run while a job is inside its fence.

use std::path::Path;

use super::{install, user, Maria, FENCE_SQL};
use crate::dbfence::{self, Server as _};
use crate::support::mariadb::Mariadb;
use crate::support::Output;

/// leasewrap's first MariaDB fence, as it shipped.
const VERSION_1: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/mariadb/fence-v1.sql");

fn install_output(server: &Mariadb, file: &str) -> Output {
    server.run_file(None, Path::new(file))
}

/// The install on `server`, refused with `named` in its one error line.
#[track_caller]
fn install_refuses_naming(server: &Mariadb, named: &str) {
    let out = install_output(server, FENCE_SQL);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains(named), "{named}: {}", out.stderr);
}

/// mallory, given SELECT (name, token) and UPDATE (token) on the fence table, resets the job's
/// token; the re-run refuses that grant by name, and then, one after the other, ALTER ROUTINE
/// on the fence (with it, ALTER PROCEDURE ... SQL SECURITY INVOKER breaks every job), SELECT on
/// the table (with it, SELECT ... FOR UPDATE holds every name's row), and a procedure elsewhere
/// whose definer is leasewrap_fence.
#[test]
fn the_install_refuses_by_name_every_right_on_the_database_leasewrap_but_execute() {
    let server = &Mariadb::start();
    install(server);
    let maria = Maria(server);
    let db = maria.report_db("rights");
    let mallory = user(server, &db.name, "mallory");
    server.sql_ok("", &format!("GRANT SELECT (name, token), UPDATE (token) ON leasewrap.fence TO '{mallory}'@'localhost'"));
    let fenced = format!(
        "START TRANSACTION; CALL leasewrap.fence('{}', 100); COMMIT",
        db.lease
    );
    assert!(server.sql_as(&db.job, &db.name, &fenced).status.success());
    let reset = format!(
        "UPDATE leasewrap.fence SET token = 0 WHERE name = '{}'",
        db.lease
    );
    assert!(server.sql_as(&mallory, "", &reset).status.success());
    assert_eq!(
        dbfence::recorded(&maria, &db),
        "0",
        "mallory reset the job's token"
    );
    install_refuses_naming(
        server,
        &format!("'{mallory}'@'localhost' on leasewrap.fence(token)"),
    );
    server.sql_ok("", &format!("REVOKE SELECT (name, token), UPDATE (token) ON leasewrap.fence FROM '{mallory}'@'localhost'"));
    let rights = [
        (
            "ALTER ROUTINE ON PROCEDURE leasewrap.fence",
            "on procedure leasewrap.fence",
        ),
        ("SELECT ON leasewrap.fence", "on leasewrap.fence"),
    ];
    for (right, named) in rights {
        server.sql_ok("", &format!("GRANT {right} TO '{mallory}'@'localhost'"));
        install_refuses_naming(server, &format!("'{mallory}'@'localhost' {named}"));
        server.sql_ok("", &format!("REVOKE {right} FROM '{mallory}'@'localhost'"));
    }
    let backdoor = format!(
        "CREATE DEFINER = 'leasewrap_fence'@'localhost' PROCEDURE {}.backdoor() SQL SECURITY DEFINER UPDATE leasewrap.fence SET token = 0",
        db.name
    );
    server.sql_ok("", &backdoor);
    install_refuses_naming(server, &format!("procedure {}.backdoor", db.name));
    server.sql_ok("", &format!("DROP PROCEDURE {}.backdoor", db.name));
    install(server);
}

/// An account with SELECT, INSERT, UPDATE and DELETE on *.* could tie itself to * and poison any
/// name: the install cannot refuse an administrator's rights, and names the account.
#[test]
fn the_install_names_the_accounts_whose_global_rights_reach_the_fence() {
    let server = &Mariadb::start();
    server.sql_ok(
        "",
        "CREATE USER 'ops'@'%'; GRANT SELECT, INSERT, UPDATE, DELETE ON *.* TO 'ops'@'%'",
    );
    let out = install_output(server, FENCE_SQL);
    assert!(out.status.success(), "{}", out.stderr);
    let named = "are as trusted as an administrator: 'ops'@'%'";
    assert!(out.stdout.contains(named), "{}", out.stdout);
    let tie = server.sql_as(
        "ops",
        "",
        "INSERT INTO leasewrap.allowed VALUES ('ops', '*')",
    );
    assert!(tie.status.success(), "as the install says: {}", tie.stderr);
}

/// Version 1 in use: a job tied to its name, and a monitor that an administrator let read the
/// fence table. The upgrade keeps the tie and the job's EXECUTE (and gives it the lease's
/// procedures), takes the monitor's SELECT (with
/// it, SELECT ... FOR UPDATE would hold every row) and gives it EXECUTE on fences(), saying so.
#[test]
fn the_upgrade_from_version_1_keeps_ties_and_makes_a_reader_s_select_execute_on_fences() {
    let server = &Mariadb::start();
    let out = install_output(server, VERSION_1);
    assert!(out.status.success(), "{}", out.stderr);
    let maria = Maria(server);
    let db = maria.report_db("from_v1");
    let monitor = user(server, &db.name, "monitor");
    server.sql_ok(
        "",
        &format!("GRANT SELECT ON leasewrap.fence TO '{monitor}'@'localhost'"),
    );
    let out = install_output(server, FENCE_SQL);
    assert!(out.status.success(), "{}", out.stderr);
    let said = format!("'{monitor}'@'localhost' may no longer read leasewrap.fence");
    assert!(out.stdout.contains(&said), "{}", out.stdout);
    let fenced = format!(
        "START TRANSACTION; CALL leasewrap.fence('{}', 4); COMMIT",
        db.lease
    );
    let out = server.sql_as(&db.job, &db.name, &fenced);
    assert!(out.status.success(), "the tie is kept: {}", out.stderr);
    // The tie gives the lease's procedures too, which version 1 did not have.
    let read = format!("CALL leasewrap.lease_read('{}')", db.lease);
    let out = server.sql_as(&db.job, &db.name, &read);
    assert!(
        out.status.success(),
        "the tie gives the lease: {}",
        out.stderr
    );
    let read = server.sql_as(&monitor, "", "SELECT token FROM leasewrap.fence");
    assert!(read.stderr.contains("ERROR 1142"), "{}", read.stderr);
    let read = server.sql_as(&monitor, "", "CALL leasewrap.fences()");
    assert!(
        read.stdout.contains(&format!("{}\t4\t", db.lease)),
        "{}{}",
        read.stdout,
        read.stderr
    );
    let version = server.sql_ok("", "SELECT GROUP_CONCAT(version) FROM leasewrap.installed");
    assert_eq!(version, "3");
}

/// A re-run (on the shared server: it changes nothing there) while a job is inside its fence:
/// replacing the procedures and granting take no lock the job holds, so the install ends at
/// once, and the job commits.
#[test]
fn a_re_run_while_a_job_is_inside_its_fence_waits_for_it_not_at_all() {
    let maria = super::maria();
    let (db, sb) = (
        maria.report_db("re_run_held"),
        crate::support::Sandbox::new(),
    );
    let fence = format!("CALL leasewrap.fence('{}', 1);", db.lease);
    let holding = super::session_holding(&sb, (maria.0, &db), "A", &fence);
    let started = std::time::Instant::now();
    let out = install_output(maria.0, FENCE_SQL);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        started.elapsed() < crate::dbfence::BOUND,
        "{:?}",
        started.elapsed()
    );
    std::fs::write(sb.path("A.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
    assert_eq!(dbfence::recorded(&maria, &db), "1");
}
