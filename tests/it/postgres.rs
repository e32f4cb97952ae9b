//! The database fence (SPEC §7, sql/postgres-fence.sql) against a real PostgreSQL 15: the
//! seed's paused holder replayed inside a transaction (SPEC §9 F16), a holder's session ended by
//! idle_in_transaction_session_timeout, eight holders in turn, bad input, `fence-sql`, and jobs
//! run by leasewrap on the local backend and on etcd.
//!
//! Every test has a database of its own on the one shared server. A holder's job is psql
//! running a script file; where the test must act in the middle of it, the script writes a
//! marker file (`\!`) and waits for the test's `go` file, with a bound.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::support::etcd::{self, Etcd, Version};
use crate::support::postgres::{self, Postgres, PSQL};
use crate::support::{
    assert_exit, atomically, comm, is_stopped, ppid_of, q, read_line_file, read_pid, wait_for_file,
    wait_until, Leasewrap, Running, Sandbox, STARTUP,
};

/// Bound on anything that should take about a TTL or less, generous for a loaded 2-core machine.
const BOUND: Duration = Duration::from_secs(15);

/// The shipped file that `fence-sql postgres` prints.
const FENCE_SQL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/postgres-fence.sql");

/// The job's table: one row whose total each holder adds to after reading it, and a log of
/// every committed update, in commit order.
const REPORT_TABLES: &str = "
CREATE TABLE report (id int PRIMARY KEY, total int NOT NULL, by text NOT NULL, token numeric NOT NULL);
INSERT INTO report VALUES (1, 0, 'nobody', 0);
CREATE TABLE report_log (seq bigserial PRIMARY KEY, who text NOT NULL, token numeric NOT NULL, total int NOT NULL);";

/// A database for one test, with the fence installed from the shipped file and the report tables.
#[track_caller]
fn report_db(pg: &Postgres, label: &str) -> String {
    let db = pg.database(label);
    let out = pg.psql_file(&db, &[], Path::new(FENCE_SQL));
    assert!(out.status.success(), "installing the fence: {}", out.stderr);
    pg.psql_ok(&db, REPORT_TABLES);
    db
}

/// Where a holder's job stops for the test: it writes `LABEL.paused`, then waits for `LABEL.go`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    Nowhere,
    BeforeFence,
    AfterFence,
    /// Sleeps this many milliseconds after its fence, and waits for nothing.
    Sleep(u64),
}

/// A holder's job as a psql script: fence, read the total, add `add` to it, log it, commit.
fn holder_sql(sb: &Sandbox, label: &str, add: u32, pause: Pause) -> PathBuf {
    let wait = format!(
        "\\! touch {paused}; i=0; while [ ! -e {go} ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i + 1)); done",
        paused = q(&sb.path(&format!("{label}.paused"))),
        go = q(&sb.path(&format!("{label}.go"))),
    );
    let at = |here: Pause| match pause {
        Pause::Sleep(ms) if here == Pause::AfterFence => {
            format!("\\! sleep {}", ms as f64 / 1000.0)
        }
        _ if pause == here => wait.clone(),
        _ => String::new(),
    };
    let script = format!(
        "{before}
BEGIN;
SELECT leasewrap.fence(:'name', :'token');
SELECT total FROM report WHERE id = 1 \\gset
{after}
UPDATE report SET total = :total + {add}, by = '{label}', token = :'token' WHERE id = 1;
INSERT INTO report_log (who, token, total) VALUES ('{label}', :'token', :total + {add});
COMMIT;
",
        before = at(Pause::BeforeFence),
        after = at(Pause::AfterFence),
    );
    let path = sb.path(&format!("{label}.sql"));
    fs::write(&path, script).unwrap();
    path
}

/// The lease a holder takes.
#[derive(Clone, Copy)]
enum Lease<'a> {
    Local,
    /// etcd, under this prefix, with a 2 s TTL.
    Etcd(&'a Etcd, &'a str),
}

/// leasewrap --name report running `script` with psql on `db`: the child writes LABEL.pid and
/// LABEL.token first, psql's stderr goes to LABEL.err and its status to LABEL.status.
fn holder(
    sb: &Sandbox,
    pg: &Postgres,
    db: &str,
    lease: Lease,
    label: &str,
    script: &Path,
) -> Leasewrap {
    let p = |ext: &str| sb.path(&format!("{label}.{ext}"));
    let shell = format!(
        "{pid}; {token}
         {PSQL} -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -v name=\"$LEASEWRAP_NAME\" \
           -v token=\"$LEASEWRAP_FENCING_TOKEN\" -f {script} 2>{err}
         {status}",
        pid = atomically("echo $$", &p("pid")),
        token = atomically("echo $LEASEWRAP_FENCING_TOKEN", &p("token")),
        script = q(script),
        err = q(&p("err")),
        status = atomically("echo $?", &p("status")),
    );
    let lw = match lease {
        Lease::Local => sb.leasewrap(),
        Lease::Etcd(etcd, prefix) => sb
            .leasewrap()
            .on_etcd(&etcd.endpoint(), prefix)
            .args(&["--ttl", "2s"]),
    };
    let lw = pg.env(db).into_iter().fold(lw, |lw, (k, v)| lw.env(&k, v));
    lw.name("report").shell(&shell)
}

/// What a holder's child wrote in LABEL.EXT, once complete.
fn mark(sb: &Sandbox, label: &str, ext: &str) -> String {
    read_line_file(&sb.path(&format!("{label}.{ext}")), BOUND)
}

/// A holder's psql's stderr.
fn mark_err(sb: &Sandbox, label: &str) -> String {
    fs::read_to_string(sb.path(&format!("{label}.err"))).unwrap_or_default()
}

/// (who, token, total) of every committed update, in commit order.
fn report_log(pg: &Postgres, db: &str) -> Vec<(String, u64, i64)> {
    let rows = pg.psql_ok(db, "SELECT who, token, total FROM report_log ORDER BY seq");
    rows.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (
                f[0].to_owned(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

/// The report row: total and who wrote it last.
fn report(pg: &Postgres, db: &str) -> String {
    pg.psql_ok(db, "SELECT total || ' by ' || by FROM report WHERE id = 1")
}

// ---------------------------------------------------------------------------------------------
// The seed's case, replayed in the database (SPEC §9 F16).

/// How the paused holder A is resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resume {
    /// Its child first, told to go on: it commits at once, before its watchdog runs again.
    ChildCommits,
    /// Its watchdog and leasewrap with the child: the child is killed before it goes on.
    WatchdogKills,
}

/// The seed's two holders on etcd (2 s TTL) and one database: A, its whole tree stopped where
/// its job pauses, and B, started once A is stopped; A adds 1 to the report's total, B 10.
struct Replay {
    pg: &'static Postgres,
    db: String,
    /// The holders' scripts and marks.
    sb: Sandbox,
    a: Running,
    /// A's leasewrap and watchdog, stopped.
    a_lease: (i32, i32),
    /// A's child (the leader of its process group), stopped.
    a_child: i32,
    b: Running,
}

impl Replay {
    /// `db_setup` runs on the database before A starts.
    fn start(label: &str, a_pause: Pause, db_setup: &str) -> Replay {
        let (pg, etcd) = (postgres::shared(), etcd::shared(Version::V3_5));
        let db = report_db(pg, label);
        if !db_setup.is_empty() {
            pg.psql_ok(&db, &db_setup.replace("DB", &db));
        }
        let prefix = etcd::unique_prefix(&format!("pg_{label}"));
        let (sb, lease) = (Sandbox::new(), Lease::Etcd(etcd, &prefix));
        let a_sql = holder_sql(&sb, "A", 1, a_pause);
        let a = holder(&sb, pg, &db, lease, "A", &a_sql).spawn();
        wait_for_file(&sb.path("A.paused"), STARTUP + BOUND);
        let (a_lease, a_child) = stop_tree(&sb, "A", &a);
        let b_sql = holder_sql(&sb, "B", 10, Pause::Nowhere);
        let b = holder(&sb, pg, &db, lease, "B", &b_sql).spawn();
        Replay {
            pg,
            db,
            sb,
            a,
            a_lease,
            a_child,
            b,
        }
    }

    /// Resumes A's child, telling it to go on, and returns its psql's status.
    fn resume_child(&self) -> String {
        fs::write(self.sb.path("A.go"), "").unwrap();
        killpg(Pid::from_raw(self.a_child), Signal::SIGCONT).unwrap();
        mark(&self.sb, "A", "status")
    }

    /// Resumes A's watchdog and leasewrap (and its child, if still stopped); A then ends.
    fn resume_lease(&mut self) {
        resume_tree(self.a_lease, self.a_child);
        self.a.wait_timeout(BOUND);
    }

    #[track_caller]
    fn b_succeeds(&mut self) {
        self.b.wait_timeout(2 * BOUND);
        assert_exit(&self.b, 0);
    }

    fn a_err(&self) -> String {
        mark_err(&self.sb, "A")
    }

    /// Only B's update landed, on the report's initial 0.
    #[track_caller]
    fn only_b_landed(&self) {
        assert_eq!(report(self.pg, &self.db), "10 by B");
        assert_eq!(
            report_log(self.pg, &self.db).len(),
            1,
            "only B's update landed"
        );
    }
}

/// Stops the whole tree of `label`'s holder, whose leasewrap is `lw`; returns (leasewrap,
/// watchdog) and the child.
fn stop_tree(sb: &Sandbox, label: &str, lw: &Running) -> ((i32, i32), i32) {
    let child = read_pid(&sb.path(&format!("{label}.pid")), BOUND);
    let watchdog = ppid_of(child).expect("the child has a parent");
    assert_eq!(
        comm(watchdog),
        "leasewrap-wd",
        "the child's parent is the watchdog"
    );
    for pid in [lw.pid(), watchdog] {
        kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
    }
    killpg(Pid::from_raw(child), Signal::SIGSTOP).unwrap();
    wait_until(BOUND, &format!("{label}'s tree to be stopped"), || {
        [lw.pid(), watchdog, child]
            .iter()
            .all(|&pid| is_stopped(pid))
    });
    ((lw.pid(), watchdog), child)
}

/// SIGCONT to a stopped holder's child (its process group), watchdog and leasewrap.
fn resume_tree((leasewrap, watchdog): (i32, i32), child: i32) {
    killpg(Pid::from_raw(child), Signal::SIGCONT).unwrap();
    kill(Pid::from_raw(watchdog), Signal::SIGCONT).unwrap();
    kill(Pid::from_raw(leasewrap), Signal::SIGCONT).unwrap();
}

/// A fences and reads, then its tree is stopped past its TTL; B takes the lease and its fence
/// waits for A's row; A is resumed as `resume` says; B commits. B's update is built on whatever
/// A committed.
fn replay_paused_inside_its_transaction(resume: Resume) {
    let mut r = Replay::start("paused_inside", Pause::AfterFence, "");
    r.pg.wait_for_lock_wait(&r.db, "leasewrap.fence", 2 * BOUND);
    if resume == Resume::ChildCommits {
        assert_eq!(r.resume_child(), "0", "A's commit: {}", r.a_err());
    }
    r.resume_lease();
    r.b_succeeds();
    let log = report_log(r.pg, &r.db);
    let a_committed = log.iter().any(|(who, _, _)| who == "A");
    assert_eq!(a_committed, resume == Resume::ChildCommits, "log: {log:?}");
    let total = 10 + i64::from(a_committed);
    let b_token: u64 = mark(&r.sb, "B", "token").parse().unwrap();
    let b_update = ("B".to_owned(), b_token, total);
    assert_eq!(log.last(), Some(&b_update), "log: {log:?}");
    assert_eq!(report(r.pg, &r.db), format!("{total} by B"));
}

#[test]
fn a_holder_paused_inside_its_transaction_commits_first_and_the_next_builds_on_it() {
    replay_paused_inside_its_transaction(Resume::ChildCommits);
}

#[test]
fn a_holder_paused_inside_its_transaction_is_killed_and_the_next_loses_no_update() {
    replay_paused_inside_its_transaction(Resume::WatchdogKills);
}

#[test]
fn a_holder_paused_before_its_fence_is_refused_and_the_next_holder_s_data_stays() {
    let mut r = Replay::start("paused_before", Pause::BeforeFence, "");
    r.b_succeeds();
    assert_eq!(r.resume_child(), "3", "A's psql stops at its refused fence");
    r.resume_lease();
    let (a_token, b_token) = (mark(&r.sb, "A", "token"), mark(&r.sb, "B", "token"));
    let err = r.a_err();
    assert!(
        err.contains("LWF01"),
        "A's error has the fence's SQLSTATE: {err}"
    );
    let stale = format!("stale fencing token {a_token} for \"report\": {b_token} is recorded");
    assert!(err.contains(&stale), "A's error names both tokens: {err}");
    r.only_b_landed();
}

/// A frozen holder whose connection stays open (its whole tree stopped, as a host that froze or
/// lost its network) holds its row lock only until idle_in_transaction_session_timeout ends its
/// session; then the next holder goes on, and A's update never lands.
#[test]
fn idle_in_transaction_session_timeout_ends_a_frozen_holder_s_transaction_and_the_next_goes_on() {
    // Longer than B needs to take the lease (the 2 s TTL), so that B is seen waiting first.
    let timeout = "ALTER DATABASE DB SET idle_in_transaction_session_timeout = '8s'";
    let mut r = Replay::start("idle_timeout", Pause::AfterFence, timeout);
    r.pg.wait_for_lock_wait(&r.db, "leasewrap.fence", 2 * BOUND);
    r.b_succeeds();
    assert_ne!(
        r.resume_child(),
        "0",
        "A's session was ended: its commit fails"
    );
    let err = r.a_err();
    assert!(
        err.contains("idle-in-transaction timeout"),
        "A's error: {err}"
    );
    r.resume_lease();
    r.only_b_landed();
}

// ---------------------------------------------------------------------------------------------
// The fence's own rules.

/// A psql session of the test's own, in a thread, that runs `lines` and then waits for the file
/// LABEL.go before it commits.
fn session_holding(
    sb: &Sandbox,
    (pg, db): (&'static Postgres, &str),
    label: &str,
    lines: &str,
) -> std::thread::JoinHandle<crate::support::Output> {
    let go = q(&sb.path(&format!("{label}.go")));
    let script = format!(
        "BEGIN;\n{lines}\n\\! touch {paused}; i=0; while [ ! -e {go} ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i + 1)); done\nCOMMIT;\n",
        paused = q(&sb.path(&format!("{label}.paused"))),
    );
    let path = sb.path(&format!("{label}.sql"));
    fs::write(&path, script).unwrap();
    let db = db.to_owned();
    let thread = std::thread::spawn(move || pg.psql_file(&db, &[], &path));
    wait_for_file(&sb.path(&format!("{label}.paused")), BOUND);
    thread
}

/// PostgreSQL's INSERT docs: with ON CONFLICT DO UPDATE ... WHERE, "only rows for which this
/// expression returns true will be updated, although all rows will be locked". The fence relies
/// on it: a stale fence's statement locks the row just as a fresh one's does.
#[test]
fn on_conflict_do_update_locks_the_row_even_when_its_where_is_false() {
    let pg = postgres::shared();
    let (db, sb) = (report_db(pg, "locks_on_false_where"), Sandbox::new());
    pg.psql_ok(&db, "SELECT leasewrap.fence('report', 5)");
    let stale_upsert = "INSERT INTO leasewrap.fence AS f (name, token) VALUES ('report', 3) \
        ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token;";
    let holding = session_holding(&sb, (pg, &db), "S", stale_upsert);
    let out = pg.psql(
        &db,
        "SELECT token FROM leasewrap.fence WHERE name = 'report' FOR UPDATE NOWAIT",
    );
    assert!(
        out.stderr.contains("55P03"),
        "the row is locked: {}",
        out.stderr
    );
    fs::write(sb.path("S.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
    assert_eq!(pg.psql_ok(&db, "SELECT token FROM leasewrap.fence"), "5");
}

#[test]
fn a_stale_fence_waits_for_the_holder_s_transaction_then_is_refused_naming_both_tokens() {
    let pg = postgres::shared();
    let (db, sb) = (report_db(pg, "stale_waits"), Sandbox::new());
    let holding = session_holding(&sb, (pg, &db), "S", "SELECT leasewrap.fence('report', 5);");
    let stale = std::thread::spawn({
        let db = db.clone();
        move || pg.psql(&db, "SELECT leasewrap.fence('report', 3)")
    });
    pg.wait_for_lock_wait(&db, "leasewrap.fence('report', 3)", BOUND);
    fs::write(sb.path("S.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
    let out = stale.join().unwrap();
    assert!(!out.status.success());
    assert!(
        out.stderr
            .contains("LWF01: stale fencing token 3 for \"report\": 5 is recorded"),
        "{}",
        out.stderr
    );
}

/// Under REPEATABLE READ (and SERIALIZABLE) a newer holder's fence that waited for an older
/// holder's commit cannot build on a snapshot taken before it: it fails with a serialization
/// failure (40001), a safe refusal, and the whole transaction is to be retried.
#[test]
fn a_fence_that_waited_under_repeatable_read_fails_to_serialize_and_its_retry_goes_on() {
    let pg = postgres::shared();
    let (db, sb) = (report_db(pg, "repeatable_read"), Sandbox::new());
    pg.psql_ok(&db, "SELECT leasewrap.fence('report', 4)");
    let holding = session_holding(&sb, (pg, &db), "S", "SELECT leasewrap.fence('report', 5);");
    let newer =
        "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT leasewrap.fence('report', 6); COMMIT;";
    let waiting = std::thread::spawn({
        let db = db.clone();
        move || pg.psql(&db, newer)
    });
    pg.wait_for_lock_wait(&db, "leasewrap.fence('report', 6)", BOUND);
    fs::write(sb.path("S.go"), "").unwrap();
    assert!(holding.join().unwrap().status.success());
    let out = waiting.join().unwrap();
    assert!(
        out.stderr.contains("40001"),
        "a serialization failure: {}",
        out.stderr
    );
    assert_eq!(pg.psql_ok(&db, "SELECT token FROM leasewrap.fence"), "5");
    pg.psql_ok(&db, newer);
    assert_eq!(pg.psql_ok(&db, "SELECT token FROM leasewrap.fence"), "6");
}

/// Each bad call fails with a clear error, and the transaction it opens writes nothing.
#[test]
fn bad_input_gets_a_clear_error_and_nothing_is_written() {
    let pg = postgres::shared();
    let (db, sb) = (report_db(pg, "bad_input"), Sandbox::new());
    let script = sb.path("bad.sql");
    fs::write(
        &script,
        "BEGIN;\nSELECT leasewrap.fence(:'name', :'token');\n\
         INSERT INTO report_log (who, token, total) VALUES ('bad', 0, 0);\nCOMMIT;\n",
    )
    .unwrap();
    let cases = [
        ("report", "abc", "22P02: invalid input syntax for type numeric: \"abc\""),
        ("report", "", "22P02: invalid input syntax for type numeric: \"\""),
        ("", "7", "LWF02: leasewrap.fence: the lease NAME is empty or NULL"),
        ("report", "18446744073709551616", "LWF02: leasewrap.fence: fencing token 18446744073709551616 for \"report\" is not a whole number from 0 to 18446744073709551615"),
        ("report", "-1", "LWF02: leasewrap.fence: fencing token -1 for \"report\""),
        ("report", "1.5", "LWF02: leasewrap.fence: fencing token 1.5 for \"report\""),
        // numeric takes these too; they compare above every number.
        ("report", "NaN", "LWF02: leasewrap.fence: fencing token NaN for \"report\""),
        ("report", "Infinity", "LWF02: leasewrap.fence: fencing token Infinity for \"report\""),
    ];
    for (name, token, error) in cases {
        let out = pg.psql_file(&db, &[("name", name), ("token", token)], &script);
        assert_eq!(
            out.status.code(),
            Some(3),
            "name {name:?} token {token:?}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(error),
            "name {name:?} token {token:?}: {}",
            out.stderr
        );
    }
    assert_eq!(pg.psql_ok(&db, "SELECT count(*) FROM report_log"), "0");
    assert_eq!(pg.psql_ok(&db, "SELECT count(*) FROM leasewrap.fence"), "0");
    let top = pg.psql_ok(
        &db,
        "SELECT leasewrap.fence('report', 18446744073709551615)",
    );
    assert_eq!(top, "18446744073709551615", "the highest u64 is a token");
}

// ---------------------------------------------------------------------------------------------
// Holders in turn, and leasewrap itself.

/// A number below `n`, different in each run.
fn random_below(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    h.finish() % n
}

#[test]
fn eight_holders_queued_on_the_local_backend_commit_in_token_order_and_a_stale_one_is_refused() {
    let pg = postgres::shared();
    let (db, sb) = (report_db(pg, "eight_holders"), Sandbox::new());
    let holders: Vec<_> = (0..8u64)
        .map(|i| {
            let label = format!("h{i}");
            let sql = holder_sql(&sb, &label, 1, Pause::Sleep(random_below(200)));
            holder(&sb, pg, &db, Lease::Local, &label, &sql).spawn()
        })
        .collect();
    for (i, mut h) in holders.into_iter().enumerate() {
        h.wait_timeout(8 * BOUND);
        assert_exit(&h, 0);
        assert_eq!(mark(&sb, &format!("h{i}"), "status"), "0");
    }
    let log = report_log(pg, &db);
    assert_eq!(log.len(), 8, "every holder committed: {log:?}");
    let tokens: Vec<u64> = log.iter().map(|(_, t, _)| *t).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "tokens in commit order: {tokens:?}"
    );
    let totals: Vec<i64> = log.iter().map(|(_, _, n)| *n).collect();
    assert_eq!(
        totals,
        (1..=8).collect::<Vec<i64>>(),
        "each built on the one before"
    );
    let first = sb.path("h-stale.sql");
    fs::copy(sb.path("h0.sql"), &first).unwrap();
    let stale = pg.psql_file(
        &db,
        &[("name", "report"), ("token", &tokens[0].to_string())],
        &first,
    );
    assert!(stale.stderr.contains("LWF01"), "{}", stale.stderr);
    assert_eq!(report_log(pg, &db).len(), 8, "no stale commit landed");
}

/// Eight holders on etcd (2 s TTL), each stopping at a random point of its job (before or after
/// its fence) for the test, which at random lets it go on or stops its whole tree past its TTL,
/// and resumes it once the next holder has come (its pause, or its fence waiting on the row).
struct Fleet {
    pg: &'static Postgres,
    db: String,
    sb: Sandbox,
    holders: Vec<Running>,
    /// The labels whose pause the test has seen.
    seen: Vec<String>,
    /// Holders stopped by the test: (leasewrap, watchdog), child, label.
    stopped: Vec<((i32, i32), i32, String)>,
}

const FLEET: usize = 8;

impl Fleet {
    fn start(etcd: &Etcd, prefix: &str) -> Fleet {
        let pg = postgres::shared();
        let (db, sb) = (report_db(pg, "fleet"), Sandbox::new());
        let holders = (0..FLEET)
            .map(|i| {
                let label = format!("h{i}");
                let at = [Pause::BeforeFence, Pause::AfterFence][random_below(2) as usize];
                let sql = holder_sql(&sb, &label, 1, at);
                holder(&sb, pg, &db, Lease::Etcd(etcd, prefix), &label, &sql).spawn()
            })
            .collect();
        let (seen, stopped) = (Vec::new(), Vec::new());
        Fleet {
            pg,
            db,
            sb,
            holders,
            seen,
            stopped,
        }
    }

    /// A holder whose pause has not been seen yet and has come.
    fn next_paused(&self) -> Option<usize> {
        (0..FLEET).find(|i| {
            let label = format!("h{i}");
            !self.seen.contains(&label) && self.sb.path(&format!("{label}.paused")).exists()
        })
    }

    /// Whether a fence waits on the row (then a stopped holder holds it).
    fn a_fence_waits(&self) -> bool {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND wait_event_type = 'Lock' AND strpos(query, 'leasewrap.fence') > 0";
        self.pg.psql_ok(&self.db, sql) != "0"
    }

    /// Handles the next event: a holder's pause, or a fence waiting behind a stopped holder.
    fn step(&mut self) {
        let mut next = None;
        let last = self.seen.len() == FLEET;
        wait_until(4 * BOUND, "a holder's pause, or a fence waiting", || {
            next = self.next_paused();
            next.is_some() || last || (!self.stopped.is_empty() && self.a_fence_waits())
        });
        let earlier = std::mem::take(&mut self.stopped);
        if let Some(i) = next {
            let label = format!("h{i}");
            self.seen.push(label.clone());
            if random_below(2) == 0 {
                let (lease, child) = stop_tree(&self.sb, &label, &self.holders[i]);
                self.stopped.push((lease, child, label));
            } else {
                fs::write(self.sb.path(&format!("{label}.go")), "").unwrap();
            }
        }
        // A child resumed alone may wait on the row of the holder just stopped: then its
        // watchdog must run too, or it would wait for ever.
        let may_wait = self.stopped.is_empty();
        for (lease, child, label) in earlier {
            resume_in_random_order(&self.sb, &label, (lease, child), may_wait);
        }
    }

    /// Each holder's psql either committed (status 0), was refused by the fence (3, LWF01), or
    /// was killed by its watchdog (no status: before its commit, or just after it).
    #[track_caller]
    fn assert_each_committed_was_refused_or_was_killed(&self, log: &[(String, u64, i64)]) {
        for i in 0..FLEET {
            let (label, err) = (format!("h{i}"), mark_err(&self.sb, &format!("h{i}")));
            let committed = log.iter().any(|(who, _, _)| *who == label);
            let status = fs::read_to_string(self.sb.path(&format!("{label}.status")));
            match status.as_deref().map(str::trim) {
                Ok("0") => assert!(committed, "{label} exited 0 without its commit: {log:?}"),
                Ok("3") => assert!(err.contains("LWF01"), "{label} was refused: {err}"),
                Ok(other) => panic!("{label}'s psql exited {other}: {err}"),
                Err(_) => {}
            }
        }
    }
}

/// Tells a stopped holder's job to go on and resumes its tree: its child alone until its psql
/// ends (when `may_wait`), its child first (it may commit before its watchdog runs), or its
/// watchdog and leasewrap first (the child is killed at once when its deadline has passed).
fn resume_in_random_order(
    sb: &Sandbox,
    label: &str,
    (lease, child): ((i32, i32), i32),
    may_wait: bool,
) {
    fs::write(sb.path(&format!("{label}.go")), "").unwrap();
    let (leasewrap, watchdog) = lease;
    match random_below(3) {
        0 if may_wait => {
            killpg(Pid::from_raw(child), Signal::SIGCONT).unwrap();
            mark(sb, label, "status");
            resume_tree(lease, child);
        }
        0 | 1 => resume_tree(lease, child),
        _ => {
            kill(Pid::from_raw(watchdog), Signal::SIGCONT).unwrap();
            kill(Pid::from_raw(leasewrap), Signal::SIGCONT).unwrap();
            killpg(Pid::from_raw(child), Signal::SIGCONT).unwrap();
        }
    }
}

#[test]
fn eight_holders_on_etcd_paused_at_random_commit_non_decreasing_tokens_and_no_stale_commit_lands() {
    let etcd = etcd::shared(Version::V3_5);
    let prefix = etcd::unique_prefix("pg_fleet");
    let mut fleet = Fleet::start(etcd, &prefix);
    while fleet.seen.len() < FLEET || !fleet.stopped.is_empty() {
        fleet.step();
    }
    for h in &mut fleet.holders {
        h.wait_timeout(4 * BOUND);
    }
    let log = report_log(fleet.pg, &fleet.db);
    let tokens: Vec<u64> = log.iter().map(|(_, t, _)| *t).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "tokens in commit order: {log:?}"
    );
    let totals: Vec<i64> = log.iter().map(|(_, _, n)| *n).collect();
    let expected: Vec<i64> = (1..=log.len() as i64).collect();
    assert_eq!(
        totals, expected,
        "each update built on the one before: {log:?}"
    );
    fleet.assert_each_committed_was_refused_or_was_killed(&log);
    let recorded = fleet
        .pg
        .psql_ok(&fleet.db, "SELECT token FROM leasewrap.fence");
    assert_eq!(
        recorded,
        tokens.last().map_or(String::new(), u64::to_string)
    );
    let refused = (0..FLEET).filter(|i| mark_err(&fleet.sb, &format!("h{i}")).contains("LWF01"));
    eprintln!(
        "fleet: {} of {FLEET} committed, {} refused: {log:?}",
        log.len(),
        refused.count()
    );
}

/// `leasewrap --name report -- sh -c 'psql ... -v token=$LEASEWRAP_FENCING_TOKEN ...'`, twice.
fn jobs_run_by_leasewrap_record_their_tokens(lease: Lease) {
    let pg = postgres::shared();
    let (db, sb) = (report_db(pg, "run_by_leasewrap"), Sandbox::new());
    let mut tokens = Vec::new();
    for label in ["first", "second"] {
        let sql = holder_sql(&sb, label, 1, Pause::Nowhere);
        let out = holder(&sb, pg, &db, lease, label, &sql).output();
        assert_exit(&out, 0);
        assert_eq!(mark(&sb, label, "status"), "0", "{}", mark_err(&sb, label));
        tokens.push(mark(&sb, label, "token").parse::<u64>().unwrap());
    }
    assert!(tokens[0] < tokens[1], "{tokens:?}");
    let fence = pg.psql_ok(&db, "SELECT name || ' ' || token FROM leasewrap.fence");
    assert_eq!(fence, format!("report {}", tokens[1]));
    assert_eq!(report(pg, &db), "2 by second");
}

#[test]
fn a_job_run_by_leasewrap_on_the_local_backend_fences_with_its_token() {
    jobs_run_by_leasewrap_record_their_tokens(Lease::Local);
}

#[test]
fn a_job_run_by_leasewrap_on_etcd_fences_with_its_token() {
    let etcd = etcd::shared(Version::V3_5);
    let prefix = etcd::unique_prefix("pg_run_by_leasewrap");
    jobs_run_by_leasewrap_record_their_tokens(Lease::Etcd(etcd, &prefix));
}

#[test]
fn fence_sql_postgres_prints_the_shipped_file_and_installing_it_twice_works() {
    let out = Leasewrap::subcommand("fence-sql")
        .args(&["postgres"])
        .output();
    assert_exit(&out, 0);
    assert_eq!(out.stdout, fs::read_to_string(FENCE_SQL).unwrap());
    let pg = postgres::shared();
    let (db, sb) = (pg.database("installed_twice"), Sandbox::new());
    let printed = sb.path("printed.sql");
    fs::write(&printed, &out.stdout).unwrap();
    for _ in 0..2 {
        let install = pg.psql_file(&db, &[], &printed);
        assert!(install.status.success(), "{}", install.stderr);
    }
    assert_eq!(pg.psql_ok(&db, "SELECT leasewrap.fence('report', 4)"), "4");
}

#[test]
fn fence_sql_with_an_unknown_database_is_64_naming_the_known_one() {
    let out = Leasewrap::subcommand("fence-sql").args(&["mysql"]).output();
    assert_exit(&out, 64);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("postgres"), "{}", out.stderr);
    assert!(out.stdout.is_empty());
}
