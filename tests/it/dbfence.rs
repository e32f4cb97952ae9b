//! The database fence's scenarios (SPEC §7, §9 F16), the same on every server: the seed's
//! paused holder replayed inside a transaction, eight holders in turn on the local backend,
//! eight holders on etcd paused at random, a stale fence that waits and is refused, and jobs
//! run by leasewrap. `postgres` and `mariadb` run them on their server, through `Server`.
//!
//! A holder's job is the server's own client running a script file, as the job's user (which
//! may fence only its test's lease name); where the test must act in the middle of it, the
//! script writes a marker file (`\!`, in both clients) and waits for the test's `go` file, with
//! a bound.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::support::etcd::{self, Etcd, Version};
use crate::support::{
    assert_exit, atomically, comm, is_stopped, ppid_of, q, read_line_file, read_pid, run_bounded,
    wait_for_file, wait_until, Leasewrap, Output, Running, Sandbox, STARTUP,
};

/// Bound on anything that should take about a TTL or less, generous for a loaded 2-core machine.
pub const BOUND: Duration = Duration::from_secs(15);

/// One test's database: the fence installed, the report tables (`report`: one row whose total
/// each holder adds to after reading it; `report_log`: every committed update in commit order),
/// and a job user that may fence `lease` only.
#[derive(Clone)]
pub struct Db {
    pub name: String,
    /// The user (role) the holders' jobs log in as.
    pub job: String,
    /// The lease name of the test's holders: unique on the server.
    pub lease: String,
}

/// What the scenarios need of a server.
pub trait Server: Sync {
    /// A database for one test, as `Db` says.
    fn report_db(&self, label: &str) -> Db;
    /// A holder's script: `before` (a client line), the transaction with the fence, the read of
    /// the total, `after`, then the total plus `add` written and logged under `label`, commit.
    fn holder_script(&self, label: &str, add: u32, before: &str, after: &str) -> String;
    /// The shell line (run as leasewrap's child) that runs `script` as the job on `db`, with
    /// the child's LEASEWRAP_NAME and LEASEWRAP_FENCING_TOKEN, its stderr to `err`.
    fn job_line(&self, db: &Db, script: &Path, err: &Path) -> String;
    /// The rows of `sql` on `db`, as the administrator; fields in order.
    fn rows(&self, db: &str, sql: &str) -> Vec<Vec<String>>;
    /// How many sessions of `db` wait for a lock in a statement that contains `fragment`.
    fn lock_waiters(&self, db: &str, fragment: &str) -> usize;
    /// The client's exit status when a statement of its script fails.
    fn failed_status(&self) -> &'static str;
    /// The fence's table, as the administrator names it.
    fn fence_table(&self) -> &'static str;
}

/// Waits until a session of `db` waits on a lock in a statement that contains `fragment`.
#[track_caller]
pub fn wait_for_lock_wait(server: &dyn Server, db: &str, fragment: &str, bound: Duration) {
    let what = format!("a session of {db} waiting on a lock in {fragment}");
    wait_until(bound, &what, || server.lock_waiters(db, fragment) > 0);
}

/// Where a holder's job stops for the test: it writes `LABEL.paused`, then waits for `LABEL.go`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    Nowhere,
    BeforeFence,
    AfterFence,
    /// Sleeps this many milliseconds after its fence, and waits for nothing.
    Sleep(u64),
}

/// The client line that writes `LABEL.paused` and waits (at most a minute) for `LABEL.go`: a
/// script of its own, since the mariadb client ends a `\!` line at its first `;`.
pub fn wait_line(sb: &Sandbox, label: &str) -> String {
    let script = sb.path(&format!("{label}.wait.sh"));
    let text = format!(
        "touch {paused}; i=0; while [ ! -e {go} ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i + 1)); done\n",
        paused = q(&sb.path(&format!("{label}.paused"))),
        go = q(&sb.path(&format!("{label}.go"))),
    );
    fs::write(&script, text).unwrap();
    format!("\\! sh {}", q(&script))
}

/// A holder's job as a script file of the server's client.
pub fn holder_sql(
    server: &dyn Server,
    sb: &Sandbox,
    label: &str,
    add: u32,
    pause: Pause,
) -> PathBuf {
    let at = |here: Pause| match pause {
        Pause::Sleep(ms) if here == Pause::AfterFence => {
            format!("\\! sleep {}", ms as f64 / 1000.0)
        }
        _ if pause == here => wait_line(sb, label),
        _ => String::new(),
    };
    let script = server.holder_script(label, add, &at(Pause::BeforeFence), &at(Pause::AfterFence));
    let path = sb.path(&format!("{label}.sql"));
    fs::write(&path, script).unwrap();
    path
}

/// The lease a holder takes.
#[derive(Clone, Copy)]
pub enum Lease<'a> {
    Local,
    /// etcd, under this prefix, with a 2 s TTL.
    Etcd(&'a Etcd, &'a str),
}

/// leasewrap --name LEASE running `script` as the job on `db`: the child writes LABEL.pid and
/// LABEL.token first, the client's stderr goes to LABEL.err and its status to LABEL.status.
pub fn holder(
    server: &dyn Server,
    (sb, db): (&Sandbox, &Db),
    lease: Lease,
    label: &str,
    script: &Path,
) -> Leasewrap {
    let p = |ext: &str| sb.path(&format!("{label}.{ext}"));
    let shell = format!(
        "{pid}; {token}
         {job}
         {status}",
        pid = atomically("echo $$", &p("pid")),
        token = atomically("echo $LEASEWRAP_FENCING_TOKEN", &p("token")),
        job = server.job_line(db, script, &p("err")),
        status = atomically("echo $?", &p("status")),
    );
    let lw = match lease {
        Lease::Local => sb.leasewrap(),
        Lease::Etcd(etcd, prefix) => sb
            .leasewrap()
            .on_etcd(&etcd.endpoint(), prefix)
            .args(&["--ttl", "2s"]),
    };
    lw.name(&db.lease).shell(&shell)
}

/// The job's line run by the test itself (not under leasewrap), with `token`.
pub fn run_job(server: &dyn Server, db: &Db, script: &Path, token: &str, err: &Path) -> Output {
    let mut sh = Command::new("/bin/sh");
    sh.args(["-c", &server.job_line(db, script, err)])
        .env("LEASEWRAP_NAME", &db.lease)
        .env("LEASEWRAP_FENCING_TOKEN", token);
    run_bounded(sh, BOUND)
}

/// The lines of the README, docs/, the man pages and `sql_file`'s comments that run a client
/// (`runs`) but do not `say` what every such line must, as `file:line: text`.
pub fn documented_lines_without(
    sql_file: &str,
    runs: impl Fn(&str) -> bool,
    say: impl Fn(&str) -> bool,
) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md"), root.join(sql_file)];
    for dir in ["docs", "man"] {
        let entries = fs::read_dir(root.join(dir)).unwrap().flatten();
        files.extend(entries.map(|e| e.path()));
    }
    let mut wrong = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap().replace("\\-", "-");
        let lines = text.lines().enumerate();
        let bad = lines.filter(|(_, l)| runs(l) && !say(l));
        wrong.extend(bad.map(|(n, l)| format!("{}:{}: {l}", file.display(), n + 1)));
    }
    wrong
}

/// Runs a documented job `line` as a stale holder (token 3, below the one recorded), with the
/// sandbox as HOME (where the test put the user's rc or option file) and `env`: the client stops
/// at the refused fence, and the stale write never lands.
#[track_caller]
pub fn a_stale_documented_line_writes_nothing(
    server: &dyn Server,
    (db, sb): (&Db, &Sandbox),
    line: &str,
    env: &[(String, String)],
) {
    let mut sh = Command::new("/bin/sh");
    sh.args(["-c", line])
        .envs(env.iter().cloned())
        .env("HOME", sb.path(""))
        .env("LEASEWRAP_NAME", &db.lease)
        .env("LEASEWRAP_FENCING_TOKEN", "3");
    let out = run_bounded(sh, BOUND);
    let status = server.failed_status().parse().ok();
    assert_eq!(
        out.status.code(),
        status,
        "{line}: {}{}",
        out.stdout,
        out.stderr
    );
    let refusal = format!("stale fencing token 3 for \"{}\"", db.lease);
    assert!(out.stderr.contains(&refusal), "{}", out.stderr);
    let log = report_log(server, &db.name);
    assert!(log.is_empty(), "the stale write landed: {log:?}");
}

/// What a holder's child wrote in LABEL.EXT, once complete.
pub fn mark(sb: &Sandbox, label: &str, ext: &str) -> String {
    read_line_file(&sb.path(&format!("{label}.{ext}")), BOUND)
}

/// A holder's client's stderr.
pub fn mark_err(sb: &Sandbox, label: &str) -> String {
    fs::read_to_string(sb.path(&format!("{label}.err"))).unwrap_or_default()
}

/// (who, token, total) of every committed update, in commit order.
pub fn report_log(server: &dyn Server, db: &str) -> Vec<(String, u64, i64)> {
    let rows = server.rows(db, "SELECT who, token, total FROM report_log ORDER BY seq");
    let row = |f: Vec<String>| (f[0].clone(), f[1].parse().unwrap(), f[2].parse().unwrap());
    rows.into_iter().map(row).collect()
}

/// The report row: total and who wrote it last.
pub fn report(server: &dyn Server, db: &str) -> String {
    let rows = server.rows(db, "SELECT total, who FROM report WHERE id = 1");
    format!("{} by {}", rows[0][0], rows[0][1])
}

/// The token the fence records for `lease`, empty when none.
pub fn recorded(server: &dyn Server, db: &Db) -> String {
    let sql = format!(
        "SELECT token FROM {} WHERE name = '{}'",
        server.fence_table(),
        db.lease
    );
    let rows = server.rows(&db.name, &sql);
    rows.first().map_or(String::new(), |r| r[0].clone())
}

// ---------------------------------------------------------------------------------------------
// The seed's case, replayed in the database (SPEC §9 F16).

/// How the paused holder A is resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// Its child first, told to go on: it commits at once, before its watchdog runs again.
    ChildCommits,
    /// Its watchdog and leasewrap with the child: the child is killed before it goes on.
    WatchdogKills,
}

/// The seed's two holders on etcd (2 s TTL) and one database: A, its whole tree stopped where
/// its job pauses, and B, started once A is stopped; A adds 1 to the report's total, B 10.
pub struct Replay<'s> {
    pub server: &'s dyn Server,
    pub db: Db,
    /// The holders' scripts and marks.
    pub sb: Sandbox,
    a: Running,
    /// A's leasewrap and watchdog, stopped.
    a_lease: (i32, i32),
    /// A's child (the leader of its process group), stopped.
    a_child: i32,
    b: Running,
}

impl<'s> Replay<'s> {
    /// `db_setup` runs on the database (as the administrator) before A starts.
    pub fn start(server: &'s dyn Server, label: &str, a_pause: Pause, db_setup: &str) -> Self {
        let db = server.report_db(label);
        if !db_setup.is_empty() {
            server.rows(&db.name, &db_setup.replace("DB", &db.name));
        }
        let etcd = etcd::shared(Version::V3_5);
        let prefix = etcd::unique_prefix(&format!("db_{label}"));
        let (sb, lease) = (Sandbox::new(), Lease::Etcd(etcd, &prefix));
        let a_sql = holder_sql(server, &sb, "A", 1, a_pause);
        let a = holder(server, (&sb, &db), lease, "A", &a_sql).spawn();
        wait_for_file(&sb.path("A.paused"), STARTUP + BOUND);
        let (a_lease, a_child) = stop_tree(&sb, "A", &a);
        let b_sql = holder_sql(server, &sb, "B", 10, Pause::Nowhere);
        let b = holder(server, (&sb, &db), lease, "B", &b_sql).spawn();
        Replay {
            server,
            db,
            sb,
            a,
            a_lease,
            a_child,
            b,
        }
    }

    /// Resumes A's child, telling it to go on, and returns its client's status.
    pub fn resume_child(&self) -> String {
        fs::write(self.sb.path("A.go"), "").unwrap();
        killpg(Pid::from_raw(self.a_child), Signal::SIGCONT).unwrap();
        mark(&self.sb, "A", "status")
    }

    /// Resumes A's watchdog and leasewrap (and its child, if still stopped); A then ends.
    pub fn resume_lease(&mut self) {
        resume_tree(self.a_lease, self.a_child);
        self.a.wait_timeout(BOUND);
    }

    #[track_caller]
    pub fn b_succeeds(&mut self) {
        self.b.wait_timeout(2 * BOUND);
        assert_exit(&self.b, 0);
    }

    pub fn a_err(&self) -> String {
        mark_err(&self.sb, "A")
    }

    /// Only B's update landed, on the report's initial 0.
    #[track_caller]
    pub fn only_b_landed(&self) {
        assert_eq!(report(self.server, &self.db.name), "10 by B");
        let log = report_log(self.server, &self.db.name);
        assert_eq!(log.len(), 1, "only B's update landed: {log:?}");
    }
}

/// Stops the whole tree of `label`'s holder, whose leasewrap is `lw`; returns (leasewrap,
/// watchdog) and the child.
pub fn stop_tree(sb: &Sandbox, label: &str, lw: &Running) -> ((i32, i32), i32) {
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
pub fn resume_tree((leasewrap, watchdog): (i32, i32), child: i32) {
    killpg(Pid::from_raw(child), Signal::SIGCONT).unwrap();
    kill(Pid::from_raw(watchdog), Signal::SIGCONT).unwrap();
    kill(Pid::from_raw(leasewrap), Signal::SIGCONT).unwrap();
}

/// A fences and reads, then its tree is stopped past its TTL; B takes the lease and its fence
/// waits for A's row; A is resumed as `resume` says; B commits. B's update is built on whatever
/// A committed.
pub fn replay_paused_inside_its_transaction(server: &dyn Server, resume: Resume) {
    let mut r = Replay::start(server, "paused_inside", Pause::AfterFence, "");
    wait_for_lock_wait(server, &r.db.name, "leasewrap.fence", 2 * BOUND);
    if resume == Resume::ChildCommits {
        assert_eq!(r.resume_child(), "0", "A's commit: {}", r.a_err());
    }
    r.resume_lease();
    r.b_succeeds();
    let log = report_log(server, &r.db.name);
    let a_committed = log.iter().any(|(who, _, _)| who == "A");
    assert_eq!(a_committed, resume == Resume::ChildCommits, "log: {log:?}");
    let total = 10 + i64::from(a_committed);
    let b_token: u64 = mark(&r.sb, "B", "token").parse().unwrap();
    let b_update = ("B".to_owned(), b_token, total);
    assert_eq!(log.last(), Some(&b_update), "log: {log:?}");
    assert_eq!(report(server, &r.db.name), format!("{total} by B"));
}

/// A is stopped before its fence; B commits; A, resumed, is refused with LWF01 naming both
/// tokens, and only B's update is there.
pub fn replay_paused_before_its_fence(server: &dyn Server) {
    let mut r = Replay::start(server, "paused_before", Pause::BeforeFence, "");
    r.b_succeeds();
    let status = r.resume_child();
    assert_eq!(
        status,
        server.failed_status(),
        "A's client stops at its refused fence"
    );
    r.resume_lease();
    let (a_token, b_token) = (mark(&r.sb, "A", "token"), mark(&r.sb, "B", "token"));
    let err = r.a_err();
    assert!(
        err.contains("LWF01"),
        "A's error has the fence's SQLSTATE: {err}"
    );
    let lease = &r.db.lease;
    let stale = format!("stale fencing token {a_token} for \"{lease}\": {b_token} is recorded");
    assert!(err.contains(&stale), "A's error names both tokens: {err}");
    r.only_b_landed();
}

/// Names and tokens, as text, that the fence refuses with LWF02 on either server, with the
/// message it gives: (name, token, message).
pub fn bad_text_input(lease: &str) -> Vec<(String, String, String)> {
    let not_a_name = |shown: &str| {
        format!("leasewrap.fence: the lease name {shown} is not 1 to 128 ASCII letters, digits and ._-@:+=")
    };
    let not_a_token = |shown: &str| {
        format!("leasewrap.fence: fencing token {shown} for \"{lease}\" is not a whole number from 0 to 18446744073709551615")
    };
    let tokens = [
        "abc",
        "",
        "1e1000000",
        "18446744073709551616",
        "-1",
        "1.5",
        " 5",
        "NaN",
        "Infinity",
    ];
    let mut cases: Vec<_> = tokens
        .iter()
        .map(|t| {
            (
                lease.to_owned(),
                t.to_string(),
                not_a_token(&format!("\"{t}\"")),
            )
        })
        .collect();
    cases.push((lease.into(), "5\n".into(), not_a_token("\"5\\n\"")));
    for (name, shown) in [
        ("", "\"\""),
        (" ", "\" \""),
        ("a\n", "\"a\\n\""),
        ("é", "\"é\""),
        // Letters only a case-insensitive comparison takes for K and s.
        ("a\u{212A}", "\"a\u{212A}\""),
        ("a\u{17F}", "\"a\u{17F}\""),
    ] {
        cases.push((name.into(), "7".into(), not_a_name(shown)));
    }
    for (c, n) in [('x', 3000), ('y', 70000)] {
        let long = c.to_string().repeat(n);
        let shown = format!("\"{}\" ({n} characters)", &long[..64]);
        cases.push((long, "7".into(), not_a_name(&shown)));
    }
    cases
}

/// Runs `call` (a fenced transaction that would log a write) for each of `bad_text_input`:
/// each fails with LWF02 and its message, and nothing is written.
#[track_caller]
pub fn bad_text_input_gets_lwf02(
    server: &dyn Server,
    db: &Db,
    call: impl Fn(&str, &str) -> Output,
) {
    for (name, token, message) in bad_text_input(&db.lease) {
        let out = call(&name, &token);
        let what = format!("name {:?} token {token:?}", &name[..name.len().min(20)]);
        assert_eq!(
            out.status.code(),
            server.failed_status().parse().ok(),
            "{what}: {}",
            out.stderr
        );
        assert!(out.stderr.contains("LWF02"), "{what}: {}", out.stderr);
        assert!(out.stderr.contains(&message), "{what}: {}", out.stderr);
    }
    assert!(
        report_log(server, &db.name).is_empty(),
        "a refused fence's write landed"
    );
}

// ---------------------------------------------------------------------------------------------
// Holders in turn, and leasewrap itself.

/// A number below `n`, different in each run.
pub fn random_below(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    h.finish() % n
}

/// Tokens never go down in commit order, and each update built on the one before.
#[track_caller]
fn assert_in_token_order_and_none_lost(log: &[(String, u64, i64)]) {
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
}

/// Eight holders queued on the local backend, each sleeping a random while after its fence,
/// commit in token order; then the first one's script again, with its token, is refused.
pub fn eight_holders_queued_on_the_local_backend(server: &dyn Server) {
    let (db, sb) = (server.report_db("eight_holders"), Sandbox::new());
    let holders: Vec<_> = (0..8u64)
        .map(|i| {
            let label = format!("h{i}");
            let sql = holder_sql(server, &sb, &label, 1, Pause::Sleep(random_below(200)));
            holder(server, (&sb, &db), Lease::Local, &label, &sql).spawn()
        })
        .collect();
    for (i, mut h) in holders.into_iter().enumerate() {
        h.wait_timeout(8 * BOUND);
        assert_exit(&h, 0);
        let label = format!("h{i}");
        assert_eq!(
            mark(&sb, &label, "status"),
            "0",
            "{}",
            mark_err(&sb, &label)
        );
    }
    let log = report_log(server, &db.name);
    assert_eq!(log.len(), 8, "every holder committed: {log:?}");
    assert_in_token_order_and_none_lost(&log);
    let (script, err) = (sb.path("h0.sql"), sb.path("stale.err"));
    let out = run_job(server, &db, &script, &log[0].1.to_string(), &err);
    assert_eq!(out.status.code(), server.failed_status().parse().ok());
    let err = fs::read_to_string(sb.path("stale.err")).unwrap_or_default();
    assert!(err.contains("LWF01"), "{err}");
    assert_eq!(
        report_log(server, &db.name).len(),
        8,
        "no stale commit landed"
    );
}

/// Eight holders on etcd (2 s TTL), each stopping at a random point of its job (before or after
/// its fence) for the test, which at random lets it go on or stops its whole tree past its TTL,
/// and resumes it once the next holder has come (its pause, or its fence waiting on the row).
struct Fleet<'s> {
    server: &'s dyn Server,
    db: Db,
    sb: Sandbox,
    holders: Vec<Running>,
    /// The labels whose pause the test has seen.
    seen: Vec<String>,
    /// Holders stopped by the test: (leasewrap, watchdog), child, label.
    stopped: Vec<((i32, i32), i32, String)>,
}

const FLEET: usize = 8;

impl<'s> Fleet<'s> {
    fn start(server: &'s dyn Server, etcd: &Etcd, prefix: &str) -> Self {
        let (db, sb) = (server.report_db("fleet"), Sandbox::new());
        let holders = (0..FLEET)
            .map(|i| {
                let label = format!("h{i}");
                let at = [Pause::BeforeFence, Pause::AfterFence][random_below(2) as usize];
                let sql = holder_sql(server, &sb, &label, 1, at);
                holder(server, (&sb, &db), Lease::Etcd(etcd, prefix), &label, &sql).spawn()
            })
            .collect();
        let (seen, stopped) = (Vec::new(), Vec::new());
        Fleet {
            server,
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

    /// Handles the next event: a holder's pause, or a fence waiting behind a stopped holder.
    fn step(&mut self) {
        let mut next = None;
        let last = self.seen.len() == FLEET;
        wait_until(4 * BOUND, "a holder's pause, or a fence waiting", || {
            next = self.next_paused();
            let waits = || self.server.lock_waiters(&self.db.name, "leasewrap.fence") > 0;
            next.is_some() || last || (!self.stopped.is_empty() && waits())
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

    /// Each holder's client either committed (status 0), was refused by the fence (LWF01), or
    /// was killed by its watchdog (no status: before its commit, or just after it).
    #[track_caller]
    fn assert_each_committed_was_refused_or_was_killed(&self, log: &[(String, u64, i64)]) {
        for i in 0..FLEET {
            let (label, err) = (format!("h{i}"), mark_err(&self.sb, &format!("h{i}")));
            let committed = log.iter().any(|(who, _, _)| *who == label);
            let status = fs::read_to_string(self.sb.path(&format!("{label}.status")));
            match status.as_deref().map(str::trim) {
                Ok("0") => assert!(committed, "{label} exited 0 without its commit: {log:?}"),
                Ok(s) if s == self.server.failed_status() => {
                    assert!(err.contains("LWF01"), "{label} was refused: {err}")
                }
                Ok(other) => panic!("{label}'s client exited {other}: {err}"),
                Err(_) => {}
            }
        }
    }
}

/// Tells a stopped holder's job to go on and resumes its tree: its child alone until its client
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
            // The watchdog, running first, may have killed the child's group already (its
            // deadline passed during the pause): then there is nothing left to resume.
            let resumed = killpg(Pid::from_raw(child), Signal::SIGCONT);
            assert!(
                matches!(resumed, Ok(()) | Err(nix::errno::Errno::ESRCH)),
                "{resumed:?}"
            );
        }
    }
}

/// The fleet, to its end: tokens never go down in commit order, no update is lost, every
/// holder committed, was refused or was killed, and the fence records the last commit's token.
pub fn eight_holders_on_etcd_paused_at_random(server: &dyn Server) {
    let etcd = etcd::shared(Version::V3_5);
    let prefix = etcd::unique_prefix("db_fleet");
    let mut fleet = Fleet::start(server, etcd, &prefix);
    while fleet.seen.len() < FLEET || !fleet.stopped.is_empty() {
        fleet.step();
    }
    for h in &mut fleet.holders {
        h.wait_timeout(4 * BOUND);
    }
    let log = report_log(server, &fleet.db.name);
    assert_in_token_order_and_none_lost(&log);
    fleet.assert_each_committed_was_refused_or_was_killed(&log);
    let last = log.last().map_or(String::new(), |(_, t, _)| t.to_string());
    assert_eq!(recorded(server, &fleet.db), last);
    let refused = (0..FLEET).filter(|i| mark_err(&fleet.sb, &format!("h{i}")).contains("LWF01"));
    eprintln!(
        "fleet: {} of {FLEET} committed, {} refused: {log:?}",
        log.len(),
        refused.count()
    );
}

/// `leasewrap --name LEASE -- sh -c 'CLIENT ... $LEASEWRAP_FENCING_TOKEN ...'`, twice: each
/// job's fence records its token, and the second builds on the first.
pub fn jobs_run_by_leasewrap_record_their_tokens(server: &dyn Server, lease: Lease) {
    let (db, sb) = (server.report_db("run_by_leasewrap"), Sandbox::new());
    let mut tokens = Vec::new();
    for label in ["first", "second"] {
        let sql = holder_sql(server, &sb, label, 1, Pause::Nowhere);
        let out = holder(server, (&sb, &db), lease, label, &sql).output();
        assert_exit(&out, 0);
        assert_eq!(mark(&sb, label, "status"), "0", "{}", mark_err(&sb, label));
        tokens.push(mark(&sb, label, "token").parse::<u64>().unwrap());
    }
    assert!(tokens[0] < tokens[1], "{tokens:?}");
    assert_eq!(recorded(server, &db), tokens[1].to_string());
    assert_eq!(report(server, &db.name), "2 by second");
}

/// The block of docs/fencing.md whose marker names `test` (the test that checks it), or each
/// of them in order.
pub fn documented_blocks(test: &str) -> Vec<String> {
    let blocks = crate::docs::examples::markdown("docs/fencing.md").into_iter();
    let named = blocks.filter(|e| e.marks.iter().any(|m| m.contains(test)));
    let found: Vec<String> = named.map(|e| e.text).collect();
    assert!(
        !found.is_empty(),
        "docs/fencing.md has no block marked for {test}"
    );
    found
}

/// The fenced transaction of docs/fencing.md that starts with `first` (BEGIN or START
/// TRANSACTION), written to a script file of `sb`.
pub fn documented_transaction(sb: &Sandbox, first: &str) -> PathBuf {
    let blocks = crate::docs::examples::markdown("docs/fencing.md").into_iter();
    let found = blocks
        .map(|e| e.text)
        .find(|t| t.starts_with(&format!("{first};\n")) && t.contains("leasewrap.fence("));
    let path = sb.path("documented.sql");
    fs::write(
        &path,
        found.expect("docs/fencing.md has the job's transaction"),
    )
    .unwrap();
    path
}
