//! The database fence (SPEC §7, sql/mariadb-fence.sql) against a real MariaDB 10.11: the
//! scenarios of `dbfence` (the seed's paused holder replayed inside a transaction, SPEC §9 F16;
//! eight holders in turn; jobs run by leasewrap), REPEATABLE READ and READ COMMITTED, a holder
//! stuck while the server sends it rows, bad input, `fence-sql`, and the client pattern of
//! docs/fencing.md. The server's other users, and installing, are in `neighbours`.
//!
//! The fence is the server's (the database leasewrap), installed once on the shared server;
//! every test has a database, a job user and a lease name of its own. Tests that install or
//! must change the server's own state start a server of their own.

mod commits;
mod install;
mod neighbours;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::dbfence::{self, wait_for_lock_wait, Db, Lease, Resume, Server, BOUND};
use crate::support::etcd::{self, Version};
use crate::support::mariadb::{self, Mariadb, CLIENT};
use crate::support::{
    assert_exit, q, run_bounded, wait_for_file, wait_until, Leasewrap, Output, Sandbox,
};

/// The shipped file that `fence-sql mariadb` prints.
pub const FENCE_SQL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/mariadb-fence.sql");

/// The job's tables (see `dbfence::Db`).
const REPORT_TABLES: &str = "
CREATE TABLE report (id INT PRIMARY KEY, total INT NOT NULL, who VARCHAR(64) NOT NULL, token BIGINT UNSIGNED NOT NULL) ENGINE = InnoDB;
INSERT INTO report VALUES (1, 0, 'nobody', 0);
CREATE TABLE report_log (seq BIGINT AUTO_INCREMENT PRIMARY KEY, who VARCHAR(64) NOT NULL, token BIGINT UNSIGNED NOT NULL, total INT NOT NULL) ENGINE = InnoDB;";

/// A server, as the scenarios see it.
pub struct Maria<'a>(pub &'a Mariadb);

/// The shared server, with the fence installed from the shipped file once.
pub fn maria() -> Maria<'static> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let server = mariadb::shared();
    INSTALLED.get_or_init(|| install(server));
    Maria(server)
}

/// Installs the fence from the shipped file, as root.
#[track_caller]
pub fn install(server: &Mariadb) {
    let out = server.run_file(None, Path::new(FENCE_SQL));
    assert!(out.status.success(), "installing the fence: {}", out.stderr);
}

/// A user of the test's own (users are the server's): `DB_SUFFIX`@localhost, no password.
#[track_caller]
pub fn user(server: &Mariadb, db: &str, suffix: &str) -> String {
    let user = format!("{db}_{suffix}");
    server.sql_ok("", &format!("CREATE USER '{user}'@'localhost'"));
    user
}

impl Server for Maria<'_> {
    fn report_db(&self, label: &str) -> Db {
        let name = self.0.database(label);
        self.0.sql_ok(&name, REPORT_TABLES);
        let job = user(self.0, &name, "job");
        self.0.sql_ok(
            &name,
            &format!(
                "GRANT SELECT, INSERT, UPDATE ON {name}.* TO '{job}'@'localhost';
             CALL leasewrap.allow('{job}', '{name}');"
            ),
        );
        Db {
            lease: name.clone(),
            name,
            job,
        }
    }

    fn holder_script(&self, label: &str, add: u32, before: &str, after: &str) -> String {
        format!(
            "{before}
START TRANSACTION;
CALL leasewrap.fence(@name, @token);
SELECT total INTO @total FROM report WHERE id = 1;
{after}
UPDATE report SET total = @total + {add}, who = '{label}', token = @token WHERE id = 1;
INSERT INTO report_log (who, token, total) VALUES ('{label}', @token, @total + {add});
COMMIT;
"
        )
    }

    fn job_line(&self, db: &Db, script: &Path, err: &Path) -> String {
        format!(
            "{{ printf \"SET @name = '%s', @token = '%s';\\n\" \"$LEASEWRAP_NAME\" \"$LEASEWRAP_FENCING_TOKEN\"; \
             cat {}; }} | {CLIENT} --no-defaults --socket={} --user={} {} 2>{}",
            q(script),
            q(self.0.socket()),
            db.job,
            db.name,
            q(err)
        )
    }

    fn rows(&self, db: &str, sql: &str) -> Vec<Vec<String>> {
        let out = self.0.sql_ok(db, sql);
        let fields = |l: &str| l.split('\t').map(str::to_owned).collect();
        out.lines().filter(|l| !l.is_empty()).map(fields).collect()
    }

    /// Inside the fence a session shows as its definer, in the database leasewrap, and a wait
    /// in its locking read is not always in INNODB_TRX: a test's waiters are the statements that
    /// name the test's lease (its database's name) and have run for more than 200 ms.
    fn lock_waiters(&self, db: &str, fragment: &str) -> usize {
        let like = |text: &str| text.replace('\\', "\\\\").replace('\'', "\\'");
        let sql = format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE TIME_MS > 200 \
             AND INFO LIKE '%ON DUPLICATE KEY UPDATE%' AND INFO LIKE CONCAT('%', '{}', '%') \
             AND INFO LIKE CONCAT('%', '{}', '%')",
            like(db),
            like(fragment)
        );
        self.0.sql_ok("", &sql).parse().unwrap()
    }

    fn failed_status(&self) -> &'static str {
        "1"
    }

    fn fence_table(&self) -> &'static str {
        "leasewrap.fence"
    }
}

// ---------------------------------------------------------------------------------------------
// The seed's case, replayed in the database (SPEC §9 F16).

#[test]
fn a_holder_paused_inside_its_transaction_commits_first_and_the_next_builds_on_it() {
    dbfence::replay_paused_inside_its_transaction(&maria(), Resume::ChildCommits);
}

#[test]
fn a_holder_paused_inside_its_transaction_is_killed_and_the_next_loses_no_update() {
    dbfence::replay_paused_inside_its_transaction(&maria(), Resume::WatchdogKills);
}

#[test]
fn a_holder_paused_before_its_fence_is_refused_and_the_next_holder_s_data_stays() {
    dbfence::replay_paused_before_its_fence(&maria());
}

#[test]
fn eight_holders_queued_on_the_local_backend_commit_in_token_order_and_a_stale_one_is_refused() {
    dbfence::eight_holders_queued_on_the_local_backend(&maria());
}

#[test]
fn eight_holders_on_etcd_paused_at_random_commit_non_decreasing_tokens_and_no_stale_commit_lands() {
    dbfence::eight_holders_on_etcd_paused_at_random(&maria());
}

#[test]
fn a_job_run_by_leasewrap_on_the_local_backend_fences_with_its_token() {
    dbfence::jobs_run_by_leasewrap_record_their_tokens(&maria(), Lease::Local);
}

#[test]
fn a_job_run_by_leasewrap_on_etcd_fences_with_its_token() {
    let etcd = etcd::shared(Version::V3_5);
    let prefix = etcd::unique_prefix("maria_run_by_leasewrap");
    dbfence::jobs_run_by_leasewrap_record_their_tokens(&maria(), Lease::Etcd(etcd, &prefix));
}

// ---------------------------------------------------------------------------------------------
// The fence's own rules.

/// A client session as the job, in a thread, that runs `lines` in a transaction and then waits
/// for the file LABEL.go before it commits.
fn session_holding(
    sb: &Sandbox,
    (server, db): (&'static Mariadb, &Db),
    label: &str,
    lines: &str,
) -> std::thread::JoinHandle<Output> {
    let script = format!(
        "START TRANSACTION;\n{lines}\n{}\nCOMMIT;\n",
        dbfence::wait_line(sb, label)
    );
    let thread = as_job_in_thread(server, db, &script);
    wait_for_file(&sb.path(&format!("{label}.paused")), BOUND);
    thread
}

/// `script` as the job, on the client's standard input, in a thread of its own.
fn as_job_in_thread(
    server: &'static Mariadb,
    db: &Db,
    script: &str,
) -> std::thread::JoinHandle<Output> {
    let mut cmd = Command::new("/bin/sh");
    let client = format!(
        "{CLIENT} --no-defaults --socket={} --user={} {}",
        q(server.socket()),
        db.job,
        db.name
    );
    cmd.args(["-c", &format!("printf '%s\\n' \"$SCRIPT\" | {client}")])
        .env("SCRIPT", script);
    std::thread::spawn(move || run_bounded(cmd, 2 * BOUND))
}

#[test]
fn a_stale_fence_waits_for_the_holder_s_transaction_then_is_refused_naming_both_tokens() {
    let maria = maria();
    let (db, sb) = (maria.report_db("stale_waits"), Sandbox::new());
    let fence = |token: u32| format!("CALL leasewrap.fence('{}', {token});", db.lease);
    let holding = session_holding(&sb, (maria.0, &db), "S", &fence(5));
    let stale = as_job_in_thread(
        maria.0,
        &db,
        &format!("START TRANSACTION; {} COMMIT;", fence(3)),
    );
    wait_for_lock_wait(&maria, &db.name, "leasewrap.fence", BOUND);
    fs::write(sb.path("S.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
    let out = stale.join().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let refusal = format!(
        "(LWF01) at line 1: stale fencing token 3 for \"{}\": 5 is recorded",
        db.lease
    );
    assert!(out.stderr.contains(&refusal), "{}", out.stderr);
}

/// Under REPEATABLE READ (InnoDB's default) and READ COMMITTED a newer holder's fence that
/// waited for an older holder's commit reads the row as committed (a locking read), and its
/// transaction's first plain read comes after it: the newer holder builds on the older's update.
fn a_waiting_fence_builds_on_the_older_commit_under(level: &str) {
    let maria = maria();
    let (db, sb) = (maria.report_db(&level.replace(' ', "_")), Sandbox::new());
    let fence = |token: u32| format!("CALL leasewrap.fence('{}', {token});", db.lease);
    let older = format!(
        "{} UPDATE report SET total = total + 1, who = 'older' WHERE id = 1;",
        fence(5)
    );
    let holding = session_holding(&sb, (maria.0, &db), "S", &older);
    let newer = format!(
        "SET SESSION TRANSACTION ISOLATION LEVEL {level}; START TRANSACTION; {}
         SELECT total INTO @total FROM report WHERE id = 1;
         UPDATE report SET total = @total + 10, who = 'newer' WHERE id = 1; COMMIT;",
        fence(6)
    );
    let waiting = as_job_in_thread(maria.0, &db, &newer);
    wait_for_lock_wait(&maria, &db.name, "leasewrap.fence", BOUND);
    fs::write(sb.path("S.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
    let out = waiting.join().unwrap();
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(dbfence::report(&maria, &db.name), "11 by newer", "{level}");
    assert_eq!(dbfence::recorded(&maria, &db), "6");
}

#[test]
fn under_repeatable_read_a_fence_that_waited_builds_on_the_older_holder_s_commit() {
    a_waiting_fence_builds_on_the_older_commit_under("REPEATABLE READ");
}

#[test]
fn under_read_committed_a_fence_that_waited_builds_on_the_older_holder_s_commit() {
    a_waiting_fence_builds_on_the_older_commit_under("READ COMMITTED");
}

/// A holder whose client stopped reading while the server sends it rows (its process stopped;
/// the client in --quick mode, so that the socket fills): the server gives up on it after
/// net_write_timeout, its transaction rolls back, and the next holder's fence goes on.
#[test]
fn a_holder_stuck_while_the_server_sends_it_rows_is_cut_off_by_net_write_timeout() {
    let maria = maria();
    let db = maria.report_db("net_write");
    let script = format!(
        "SET SESSION net_write_timeout = 2; START TRANSACTION; CALL leasewrap.fence('{}', 1);
         UPDATE report SET total = 99, who = 'stuck' WHERE id = 1;
         SELECT REPEAT('x', 1000) FROM seq_1_to_1000000; COMMIT;",
        db.lease
    );
    let mut stuck = maria.0.client_as(&db.job, Some(&db.name));
    // Its standard output is never read.
    let mut stuck = stuck
        .arg("--quick")
        .arg("-e")
        .arg(&script)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let writing = format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = '{}' AND STATE = 'Writing to net'", db.job);
    wait_until(BOUND, "the server writing to the stuck holder", || {
        maria.0.sql_ok("", &writing) == "1"
    });
    kill(Pid::from_raw(stuck.id() as i32), Signal::SIGSTOP).unwrap();
    let next = maria.0.sql_as(
        &db.job,
        &db.name,
        &format!(
            "START TRANSACTION; CALL leasewrap.fence('{}', 2); COMMIT;",
            db.lease
        ),
    );
    assert!(
        next.status.success(),
        "the next fence goes on: {}",
        next.stderr
    );
    assert_eq!(
        dbfence::report(&maria, &db.name),
        "0 by nobody",
        "the stuck holder's update rolled back"
    );
    let _ = kill(Pid::from_raw(stuck.id() as i32), Signal::SIGKILL);
    let _ = stuck.wait();
}

/// A MariaDB string literal of `text`.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Each bad call fails with LWF02 (or a documented SQLSTATE) and a clear line; the client
/// stops there, and nothing is written.
#[test]
fn bad_input_gets_lwf02_or_a_documented_sqlstate_and_nothing_is_written() {
    let maria = maria();
    let db = maria.report_db("bad_input");
    let fenced = |args: &str| {
        let sql = format!("START TRANSACTION; CALL leasewrap.fence({args}); INSERT INTO report_log (who, token, total) VALUES ('bad', 0, 0); COMMIT;");
        maria.0.sql_as(&db.job, &db.name, &sql)
    };
    let call = |name: &str, token: &str| fenced(&format!("{}, {}", literal(name), literal(token)));
    dbfence::bad_text_input_gets_lwf02(&maria, &db, call);
    let lease = db.lease.as_str();
    let typed = [
        (
            format!("'{lease}', 1.5"),
            "(LWF02) at line 1: leasewrap.fence: fencing token \"1.5\"",
        ),
        (
            format!("'{lease}', NULL"),
            "(LWF02) at line 1: leasewrap.fence: fencing token NULL",
        ),
        (
            "NULL, 7".into(),
            "(LWF02) at line 1: leasewrap.fence: the lease name NULL",
        ),
        ("_binary X'FF', 7".into(), "ERROR 1366 (22007)"),
        (format!("'{lease}'"), "ERROR 1318 (42000)"),
    ];
    for (args, error) in &typed {
        let out = fenced(args);
        assert_eq!(out.status.code(), Some(1), "{args}: {}", out.stderr);
        assert!(out.stderr.contains(error), "{args}: {}", out.stderr);
    }
    let autocommit = maria.0.sql_as(
        &db.job,
        &db.name,
        &format!("CALL leasewrap.fence('{lease}', 1)"),
    );
    let outside = "(LWF03) at line 1: leasewrap.fence: called outside a transaction";
    assert!(autocommit.stderr.contains(outside), "{}", autocommit.stderr);
    assert_eq!(dbfence::recorded(&maria, &db), "0", "as allow() made it");
    let top = format!(
        "START TRANSACTION; CALL leasewrap.fence('{lease}', 18446744073709551615); COMMIT;"
    );
    let out = maria.0.sql_as(&db.job, &db.name, &top);
    assert!(
        out.status.success(),
        "the highest u64 is a token: {}",
        out.stderr
    );
    assert_eq!(dbfence::recorded(&maria, &db), "18446744073709551615");
}

#[test]
fn fence_sql_mariadb_prints_the_shipped_file() {
    let out = Leasewrap::subcommand("fence-sql")
        .args(&["mariadb"])
        .output();
    assert_exit(&out, 0);
    assert_eq!(out.stdout, fs::read_to_string(FENCE_SQL).unwrap());
}

/// The lines of docs/fencing.md that run the job with the mariadb client.
fn documented_job_line() -> String {
    let text = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/fencing.md")).unwrap();
    let start = text
        .find("{ printf \"SET @name")
        .expect("docs/fencing.md runs the job with mariadb");
    let end = "--user=report_job reports";
    let len = text[start..].find(end).expect("the job's client line") + end.len();
    text[start..start + len].to_owned()
}

/// The documented job line, pointed at `db` as its job, running `script`.
fn documented_job_line_for(maria: &Maria<'_>, db: &Db, script: &Path) -> String {
    let client = format!(
        "--socket={} --user={} {}",
        q(maria.0.socket()),
        db.job,
        db.name
    );
    documented_job_line()
        .replace("--user=report_job reports", &client)
        .replace("/usr/local/lib/report.sql", &q(script))
}

/// The job fences its lease with `token` and commits.
#[track_caller]
fn fenced_with(maria: &Maria<'_>, db: &Db, token: u64) {
    let sql = format!(
        "START TRANSACTION; CALL leasewrap.fence('{}', {token}); COMMIT;",
        db.lease
    );
    let out = maria.0.sql_as(&db.job, &db.name, &sql);
    assert!(out.status.success(), "{}", out.stderr);
}

/// A user's option file that says `force` (go on after an error) does not reach the documented
/// job line (--no-defaults): a stale holder's client stops at its refused fence, writing
/// nothing, where with `force` it would go on, write and commit.
#[test]
fn an_option_file_with_force_does_not_defeat_the_documented_job_line() {
    let maria = maria();
    let (db, sb) = (maria.report_db("my_cnf"), Sandbox::new());
    fs::write(sb.path(".my.cnf"), "[client]\nforce\n[mariadb]\nforce\n").unwrap();
    let script = dbfence::holder_sql(&maria, &sb, "stale", 1, dbfence::Pause::Nowhere);
    fenced_with(&maria, &db, 9);
    let line = documented_job_line_for(&maria, &db, &script);
    dbfence::a_stale_documented_line_writes_nothing(&maria, (&db, &sb), &line, &[]);
}

/// Every mariadb (or mysql) command line of the README, docs/, the man pages and the SQL
/// file's comments reads no option file: --no-defaults, first.
#[test]
fn every_documented_mariadb_line_reads_no_option_file() {
    let clients = ["mariadb -", "mysql -", "| mariadb", "| mysql"];
    let runs = |l: &str| clients.iter().any(|c| l.contains(c));
    let say = |l: &str| l.contains("mariadb --no-defaults") || l.contains("mysql --no-defaults");
    let wrong = dbfence::documented_lines_without("sql/mariadb-fence.sql", runs, say);
    assert!(
        wrong.is_empty(),
        "client lines without --no-defaults:\n{}",
        wrong.join("\n")
    );
}

/// docs/fencing.md's job transaction, fed to the client by the documented job line with a stale
/// token, prints on standard error what the documentation shows, word for word (the lease name
/// is the test's).
#[test]
fn the_refusal_docs_fencing_md_shows_is_what_the_client_prints() {
    let maria = maria();
    let (db, sb) = (maria.report_db("refusal"), Sandbox::new());
    fenced_with(&maria, &db, 3);
    let script = dbfence::documented_transaction(&sb, "START TRANSACTION");
    let line = documented_job_line_for(&maria, &db, &script);
    let mut sh = Command::new("/bin/sh");
    sh.args(["-c", &line])
        .env("LEASEWRAP_NAME", &db.lease)
        .env("LEASEWRAP_FENCING_TOKEN", "2");
    let out = run_bounded(sh, BOUND);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let test = "the_refusal_docs_fencing_md_shows_is_what_the_client_prints";
    let shown = &dbfence::documented_blocks(test)[0];
    let expected = shown.replace("\"report\"", &format!("\"{}\"", db.lease));
    assert_eq!(out.stderr, expected);
}
