//! The database lease (`--database`, docs/database.md) against a real PostgreSQL 15: taking,
//! running with the row's token and fencing with it in the same database, the handover a
//! release's NOTIFY wakes, a crashed, partitioned or stopped holder taken over only after `L`,
//! another role refused, and bad input: a wrong password, a server that is not PostgreSQL, no
//! or older installed SQL, a URL that does not parse.
//!
//! Every test has a database of its own on the one shared server (`postgres::shared`, on its
//! socket and on loopback), with the SQL installed and a login role tied to the test's name.
//! The same lease on MariaDB 10.11 is in `on_mariadb`; the faults of the database itself and of
//! the hosts around it are in `faults`.

/// The scenarios both servers play, as tests of the module that invokes it: each on a fresh
/// `place(label)` of that module's; `$woken_by` is what wakes a waiter there.
macro_rules! scenarios {
    ($woken_by:expr) => {
        #[test]
        fn a_release_wakes_the_waiter_at_once() {
            $crate::database::a_release_wakes_the_waiter(&place("handover"), $woken_by);
        }

        #[test]
        fn a_waiter_s_pause_ends_at_a_release_and_lasts_its_nap_without_one() {
            $crate::database::a_pause_ends_at_a_release_only(&place("pause"), $woken_by);
        }

        #[test]
        fn a_waiter_takes_over_a_sigkilled_holder_only_l_after_its_last_renewal() {
            $crate::database::a_sigkilled_holder_is_taken_over_only_l_after_its_last_renewal(
                &place("sigkill"),
            );
        }

        #[test]
        fn a_stopped_leasewrap_loses_its_child_by_d_and_the_waiter_takes_over_after_l() {
            $crate::database::a_stopped_leasewrap_loses_its_child_by_d(&place("sigstop"));
        }

        #[test]
        fn no_wait_on_a_held_lease_exits_75_once_the_holder_is_seen_renewing_and_status_shows_it() {
            $crate::database::no_wait_is_75_and_status_shows_the_holder(&place("busy"));
        }

        #[test]
        fn once_records_the_success_in_the_same_database_and_the_next_run_of_the_key_is_skipped() {
            $crate::database::once_records_the_success_and_skips_the_next_run(&place("once"));
        }
    };
}

mod faults;
mod on_mariadb;

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::etcd::{
    fault_through_proxy, ms, now_ns, read_ns, stop_for_two_ttls_while_c_takes_over, Stopped,
    TAKEOVER_BOUND, TTL, TTL_ARG,
};
use crate::postgres::{install, role};
use crate::support::etcd::{self, Version};
use crate::support::pgbouncer::PgBouncer;
use crate::support::postgres::{self, Postgres};
use crate::support::proxy::{Mode, Proxy};
use crate::support::*;
use leasewrap::config::database::{db_config, Given};
use leasewrap::lease::db::{connect, Conn};

/// A test's database, the login role tied to its lease name, and the name.
struct Place<'a> {
    pg: &'a Postgres,
    db: String,
    role: String,
    name: String,
}

/// A fresh database with the SQL installed and a role tied to its lease name.
fn place(label: &str) -> Place<'static> {
    place_on(postgres::shared(), label)
}

/// The same on `pg`, a server of the test's own.
fn place_on<'a>(pg: &'a Postgres, label: &str) -> Place<'a> {
    let db = pg.database(&format!("lease_{label}"));
    install(pg, &db);
    let role = role(pg, &db, "job");
    let name = format!("{db}.job");
    pg.psql_ok(&db, &format!("SELECT leasewrap.allow('{role}', '{name}')"));
    Place { pg, db, role, name }
}

impl Place<'_> {
    /// The URL of the database over the server's socket, as `role`.
    fn url_as(&self, role: &str) -> String {
        let dir = self
            .pg
            .socket_dir()
            .display()
            .to_string()
            .replace('/', "%2F");
        format!(
            "postgresql://{role}@/{}?host={dir}&port={}",
            self.db,
            self.pg.port()
        )
    }

    fn url(&self) -> String {
        self.url_as(&self.role)
    }

    /// The same over TCP, through `addr`.
    fn url_at(&self, addr: &str) -> String {
        format!("postgresql://{}@{addr}/{}", self.role, self.db)
    }

    /// A leasewrap on the lease, with the tests' TTL and debug logs (shown when a test fails).
    fn job(&self, url: &str) -> Leasewrap {
        self.quiet(url).args(&["-vv"])
    }

    /// The same with the default logs: an error is its one line.
    fn quiet(&self, url: &str) -> Leasewrap {
        self.quiet_with_ttl(url, TTL_ARG)
    }

    /// A leasewrap on the lease with `--ttl ttl` and debug logs.
    fn job_with_ttl(&self, url: &str, ttl: &str) -> Leasewrap {
        self.quiet_with_ttl(url, ttl).args(&["-vv"])
    }

    fn quiet_with_ttl(&self, url: &str, ttl: &str) -> Leasewrap {
        Leasewrap::new()
            .args(&["--database", url, "--ttl", ttl])
            .name(&self.name)
    }

    /// The lease's row: `version|token|held`.
    fn row(&self) -> String {
        let sql = format!(
            "SELECT version || '|' || token || '|' || held FROM leasewrap_data.lease WHERE name = '{}'",
            self.name
        );
        self.pg.psql_ok(&self.db, &sql)
    }
}

#[test]
fn a_run_takes_the_row_with_a_token_the_fence_of_the_same_database_accepts() {
    let p = place("take");
    let sb = Sandbox::new();
    let fence = format!(
        "{} -X -q -A -t -v ON_ERROR_STOP=1 -h {} -p {} -U {} -d {} -c \"SELECT leasewrap.fence('$LEASEWRAP_NAME', $LEASEWRAP_FENCING_TOKEN)\" > {}",
        postgres::PSQL,
        q(p.pg.socket_dir()),
        p.pg.port(),
        p.role,
        p.db,
        q(&sb.path("fenced"))
    );
    for (run, token) in [(1, "1"), (2, "2")] {
        let out = p.job(&p.url()).shell(&fence).output();
        assert_exit(&out, 0);
        let fenced = std::fs::read_to_string(sb.path("fenced")).unwrap();
        assert_eq!(fenced.trim(), token, "run {run}: {}", out.stderr);
    }
    // Taken twice, renewed or not, released twice: free, with the last token.
    assert!(p.row().ends_with("|2|false"), "{}", p.row());
}

/// A lease on either server, as the scenarios both servers' tests play use it.
pub(crate) trait Lease {
    /// A leasewrap on the lease over the server's socket, with the tests' TTL and debug logs.
    fn holder(&self) -> Leasewrap;
    /// The URL of the server's socket, as the test's role or user.
    fn lease_url(&self) -> String;
    fn lease_name(&self) -> &str;
    /// Which server, for the figures printed.
    fn server(&self) -> &'static str;
    /// A leasewrap on the lease with the default logs: an error is its one line.
    fn quiet_run(&self) -> Leasewrap;
    /// The lease's row: `version|token|held`.
    fn lease_row(&self) -> String;
    /// Plays what a promoted asynchronous replica that lost the holder's take (or a restore)
    /// leaves once another run took the row again: the same token held under another holder
    /// record, the version moved; then ends every session of the test's role, as the failover
    /// ends the holder's connection.
    fn bring_back_under_another_run(&self);
}

/// The holder record of a run on another host, for `Lease::bring_back_under_another_run`.
const ANOTHER_RUN: &str = r#"{"host":"elsewhere","pid":1,"command":["job"],"args":0,"start":1.5}"#;

impl Lease for Place<'_> {
    fn holder(&self) -> Leasewrap {
        self.job(&self.url())
    }

    fn lease_url(&self) -> String {
        self.url()
    }

    fn lease_name(&self) -> &str {
        &self.name
    }

    fn server(&self) -> &'static str {
        "PostgreSQL"
    }

    fn quiet_run(&self) -> Leasewrap {
        self.quiet(&self.url())
    }

    fn lease_row(&self) -> String {
        self.row()
    }

    fn bring_back_under_another_run(&self) {
        let sql = format!(
            "UPDATE leasewrap_data.lease SET version = version + 1, holder = '{ANOTHER_RUN}' WHERE name = '{}'",
            self.name
        );
        self.pg.psql_ok(&self.db, &sql);
        let sql = format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = '{}'",
            self.role
        );
        self.pg.psql_ok(&self.db, &sql);
    }
}

/// A release hands the lease on at once: the waiter takes the next token after the holder's
/// child ended and long before a TTL (it saw the release, and did not wait out the holder).
/// Whether `woken by a release` (`$woken_by`) or a poll's read that happened to come first found
/// the row free is timing: on a loaded machine either can win, so the log only tells which.
pub(crate) fn a_release_wakes_the_waiter(p: &impl Lease, by: &str) {
    let sb = Sandbox::new();
    let mut a = Job::hold(p.holder(), &sb, "a");
    let mut b = Job::spawn(p.holder(), Marks::new(&sb, "b"), false);
    wait_until(STARTUP, "the waiter to wait", || {
        b.run.stderr().contains("waiting for the lease")
    });
    a.release();
    let a_end = read_ns(&a.marks.end);
    let b_start = read_ns(&b.marks.start);
    a.finish_with(0);
    let gap = ms(b_start - a_end);
    let woken = b.run.stderr().contains("woken by a release");
    eprintln!(
        "handover {}: {gap:.1} ms from the holder's child's last act to the next child's first ({})",
        p.server(),
        if woken { by } else { "a poll's read" }
    );
    assert!(
        gap > 0.0,
        "the next child started before the holder's ended"
    );
    assert!(
        gap < ms(TTL.as_nanos() as i128),
        "the waiter took {gap:.0} ms, as if it waited out the holder:\n{}\nthe holder's log:\n{}",
        b.run.stderr(),
        a.run.stderr()
    );
    assert_eq!(b.token(), a.token() + 1);
    b.release();
    b.finish_with(0);
}

/// The wake-up at its own seam: `Statements::pause` of a waiter's connection, against the real
/// server, with a holder's connection beside it. Without a release the pause lasts its nap; a
/// release (by `woken_by`) ends a pause of 20 s within a fraction of it.
#[track_caller]
pub(crate) fn a_pause_ends_at_a_release_only(p: &impl Lease, woken_by: &str) {
    let given = Given {
        cacert: None,
        password_file: None,
        dial_timeout: Duration::from_secs(5),
    };
    let cfg = db_config(&p.lease_url(), &given, &|_| None).expect("the lease's URL");
    let name = p.lease_name();
    let (nap, long) = (Duration::from_millis(300), Duration::from_secs(20));
    let (napped, woken) = block_on(async {
        let mut holder = connect(&cfg).await.expect("the holder's connection");
        let mut waiter = connect(&cfg).await.expect("the waiter's connection");
        let free = holder.read(name).await.expect("a read");
        let taken = holder.take(name, free.version, long, r#"{"seam":true}"#);
        let token = taken.await.expect("a take").expect("the free row taken");
        let seen = waiter.read(name).await.expect("a read");
        assert!(seen.held && seen.token == token, "{seen:?}");
        let napped = timed_pause(&mut waiter, (name, seen.version), nap).await;
        let pause = timed_pause(&mut waiter, (name, seen.version), long);
        let (woken, released) = tokio::join!(pause, holder.release(name, token));
        released.expect("the release");
        (napped, woken)
    });
    eprintln!(
        "{}: a pause of {nap:?} without a release lasted {napped:?}; one of {long:?} ended {woken:?} after it began, at the release ({woken_by})",
        p.server()
    );
    assert!(napped >= nap, "the pause ended early: {napped:?}");
    assert!(
        woken < long / 4,
        "the release did not end the pause: {woken:?}"
    );
}

/// A pause of `nap` on `waiter` of NAME last read at a version: how long it lasted.
async fn timed_pause(waiter: &mut Conn, (name, seen): (&str, u64), nap: Duration) -> Duration {
    let started = Instant::now();
    waiter.pause(name, seen, nap).await.expect("a pause");
    started.elapsed()
}

/// A SIGKILLed holder's row is taken over only `L` after its last renewal.
pub(crate) fn a_sigkilled_holder_is_taken_over_only_l_after_its_last_renewal(p: &impl Lease) {
    let sb = Sandbox::new();
    let a = Job::hold(p.holder(), &sb, "a");
    let mut b = Job::spawn(p.holder(), Marks::new(&sb, "b"), false);
    wait_until(STARTUP, "the waiter to wait", || {
        b.run.stderr().contains("waiting for the lease")
    });
    let waited = sigkill_and_time_the_takeover(a, &b);
    eprintln!(
        "{} SIGKILL: B's child started {waited:.0} ms after the kill (L {TTL:?})",
        p.server()
    );
    b.release();
    b.finish_with(0);
}

/// SIGKILLs the holder `a` (its child dies with it) and times the takeover of the waiter `b`
/// from the kill: at least 2L/3, within `TAKEOVER_BOUND`, with the next token. The ms it took.
#[track_caller]
fn sigkill_and_time_the_takeover(mut a: Job, b: &Job) -> f64 {
    let a_token = a.token();
    let killed_ns = now_ns();
    let a_child = a.child();
    a.run.kill(Signal::SIGKILL);
    assert_all_die_within(Duration::from_secs(1), &[("A's child", a_child)]);
    a.wait(STARTUP);
    let waited = ms(read_ns(&b.marks.start) - killed_ns);
    // A renewed at most L/3 before the kill; B counts L from a read after that renewal (on
    // MariaDB the named lock A's end lets go wakes B, which must not take the row then).
    let at_least = ms(TTL.as_nanos() as i128) * 2.0 / 3.0;
    assert!(
        waited >= at_least,
        "B started {waited:.0} ms after the kill"
    );
    assert!(waited < ms(TAKEOVER_BOUND.as_nanos() as i128));
    assert_eq!(b.token(), a_token + 1);
    waited
}

/// A SIGSTOPped leasewrap's child dies by D (status 124 once resumed); the waiter takes over
/// only after `L`, and its child is left alone.
pub(crate) fn a_stopped_leasewrap_loses_its_child_by_d(p: &impl Lease) {
    let sb = Sandbox::new();
    let mut a = Job::spawn(p.holder().own_process_group(), Marks::new(&sb, "a"), true);
    a.child();
    let mut c = Job::spawn(p.holder(), Marks::new(&sb, "c"), false);
    let takeover = stop_for_two_ttls_while_c_takes_over(Stopped::Leasewrap, &a, &c);
    a.wait(Duration::from_secs(5));
    assert_exit(&a.run, 124);
    eprintln!(
        "{} leasewrap SIGSTOPped: {}",
        p.server(),
        takeover.describe()
    );
    assert!(
        pid_alive(c.child()),
        "the next holder's child was disturbed"
    );
    c.release();
    c.finish_with(0);
}

/// `--once KEY`: the first run runs and records its success in the database; the next is
/// skipped (75) without running; `status --once KEY NAME` says done (0) and the listing shows the
/// record with the first run's token; a failed run of another KEY is recorded and runs again;
/// `status` without a NAME lists the lease and its records.
pub(crate) fn once_records_the_success_and_skips_the_next_run(p: &impl Lease) {
    let sb = Sandbox::new();
    let ran = sb.path("ran");
    let append = format!("echo x >> {}", q(&ran));
    let once = |key: &str, script: &str| p.holder().args(&["--once", key]).shell(script).output();
    assert_exit(&once("nightly", &append), 0);
    assert_exit(&once("nightly", &append), 75);
    assert_eq!(
        std::fs::read_to_string(&ran).unwrap(),
        "x\n",
        "the second run ran"
    );
    assert_exit(&once("other", "exit 3"), 3);
    assert_exit(&once("other", &append), 0);
    let status = |args: &[&str]| {
        Leasewrap::subcommand("status")
            .args(&["--database", &p.lease_url()])
            .args(args)
            .args(&[p.lease_name()])
            .output()
    };
    assert_exit(&status(&["--once", "nightly"]), 0);
    assert_exit(&status(&["--once", "never"]), 1);
    let listing = status(&[]);
    assert_exit(&listing, 1); // NAME is free.
    let nightly = listing.stdout.lines().find(|l| l.contains(" nightly "));
    assert!(
        nightly.is_some_and(|l| l.contains("ran-ok") && l.contains(" 1 ")),
        "{}",
        listing.stdout
    );
    let other = listing.stdout.lines().find(|l| l.contains(" other "));
    assert!(
        other.is_some_and(|l| l.contains("ran-ok") && l.contains(" 2 ")),
        "the failed run and the one after it: {}",
        listing.stdout
    );
    // Without a NAME: every name the role may use, here its one, with its records.
    let all = Leasewrap::subcommand("status")
        .args(&["--database", &p.lease_url()])
        .output();
    assert_exit(&all, 0);
    let rows = all.stdout.lines().filter(|l| l.starts_with(p.lease_name()));
    assert_eq!(
        rows.count(),
        3,
        "the lease and its two records:\n{}",
        all.stdout
    );
}

/// `-n` on a held lease is 75 once it sees the holder renew, within a TTL, and runs nothing;
/// `status NAME` shows the holder's token.
pub(crate) fn no_wait_is_75_and_status_shows_the_holder(p: &impl Lease) {
    let sb = Sandbox::new();
    let mut a = Job::hold(p.holder(), &sb, "a");
    let started = Instant::now();
    let ran = sb.path("ran");
    let out = p
        .holder()
        .args(&["-n"])
        .shell(&format!("touch {}", q(&ran)))
        .output();
    assert_exit(&out, 75);
    assert!(started.elapsed() < TTL, "-n took {:?}", started.elapsed());
    assert!(!ran.exists());
    let status = Leasewrap::subcommand("status")
        .args(&["--database", &p.lease_url(), "--json", p.lease_name()])
        .output();
    assert_exit(&status, 0);
    let token = format!("\"token\":{}", a.token());
    assert!(
        status.stdout.contains("\"held\":true") && status.stdout.contains(&token),
        "{}",
        status.stdout
    );
    a.release();
    a.finish_with(0);
}

scenarios!("the release's NOTIFY");

#[test]
fn a_holder_cut_off_from_the_database_is_dead_before_the_waiter_takes_over() {
    let p = place("partition");
    let proxy = Proxy::start(format!("127.0.0.1:{}", p.pg.port()).parse().unwrap());
    let through = p.job(&p.url_at(&proxy.addr().to_string()));
    cut_off(&p, &proxy, through, Mode::Blackhole);
}

/// The holder's renewals reach the server but their answers come 0.6 L late: it cannot see a
/// renewal succeed before D, so its child dies first; the waiter takes over after.
#[test]
fn a_holder_whose_answers_are_delayed_past_d_is_dead_before_the_waiter_takes_over() {
    let p = place("delayed");
    let proxy = Proxy::start(format!("127.0.0.1:{}", p.pg.port()).parse().unwrap());
    let through = p.job(&p.url_at(&proxy.addr().to_string()));
    cut_off(&p, &proxy, through, Mode::DelayReplies(TTL.mul_f64(0.6)));
}

/// A holder on the lease `p` through `proxy` (`through`), its link turned to `fault` for 2 × L:
/// its child is dead before a waiter on the server itself takes over with a newer token.
#[track_caller]
pub(crate) fn cut_off(p: &impl Lease, proxy: &Proxy, through: Leasewrap, fault: Mode) {
    let sb = Sandbox::new();
    let mut a = Job::spawn(through, Marks::new(&sb, "a"), true);
    a.child();
    let mut c = Job::spawn(p.holder(), Marks::new(&sb, "c"), false);
    let takeover = fault_through_proxy(proxy, fault, &mut a, &c);
    eprintln!(
        "{} holder, link {fault:?}: {}",
        p.server(),
        takeover.describe()
    );
    assert!(c.token() > a.token());
    c.release();
    c.finish_with(0);
}

#[test]
fn a_bounded_wait_on_a_held_lease_exits_75_after_the_wait_and_changes_nothing() {
    let p = place("wait");
    let sb = Sandbox::new();
    let mut a = Job::hold(p.job(&p.url()), &sb, "a");
    let ran = sb.path("ran");
    let (out, waited) = wait_one_second(p.job(&p.url()), &ran);
    assert_exit(&out, 75);
    assert!(
        waited >= Duration::from_secs(1) && waited < TTL,
        "waited {waited:?}"
    );
    assert!(!ran.exists());
    assert!(
        p.row().ends_with(&format!("|{}|true", a.token())),
        "{}",
        p.row()
    );
    a.release();
    a.finish_with(0);
}

/// A run of `lw` with `-w 1s` whose child would create `ran`: its output, and how long it took.
fn wait_one_second(lw: Leasewrap, ran: &Path) -> (Output, Duration) {
    let started = Instant::now();
    let out = lw
        .args(&["-w", "1s"])
        .shell(&format!("touch {}", q(ran)))
        .output();
    (out, started.elapsed())
}

/// PgBouncer in transaction pooling mode keeps no session for a client: a waiter cannot count
/// on a NOTIFY there and reads the row every min(L/10, 500 ms) (200 ms here); take, renew,
/// release and the fence all go through it, each statement a transaction of its own.
#[test]
fn through_pgbouncer_in_transaction_mode_the_waiter_polls_and_the_fence_takes_the_token() {
    let p = place("bouncer");
    let sb = Sandbox::new();
    let bouncer = PgBouncer::transaction_mode(p.pg, &[&p.role]);
    let url = p.url_at(&format!("127.0.0.1:{}", bouncer.port()));
    let mut a = Job::hold(p.job(&url), &sb, "a");
    let mut b = Job::spawn(p.job(&url), Marks::new(&sb, "b"), false);
    wait_until(STARTUP, "the waiter to wait", || {
        b.run.stderr().contains("waiting for the lease")
    });
    a.release();
    let gap = ms(read_ns(&b.marks.start) - read_ns(&a.marks.end));
    a.finish_with(0);
    eprintln!("handover through PgBouncer (transaction mode): {gap:.1} ms");
    assert!(
        gap > 0.0 && gap < ms(TTL.as_nanos() as i128),
        "handover {gap:.1} ms"
    );
    assert_eq!(b.token(), a.token() + 1);
    let mut fence = p.pg.psql_command(&p.db);
    fence
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", bouncer.port().to_string());
    fence.env("PGUSER", &p.role).arg("-c").arg(format!(
        "SELECT leasewrap.fence('{}', {})",
        p.name,
        b.token()
    ));
    let fenced = run_bounded(fence, STARTUP);
    assert_eq!(
        fenced.stdout.trim(),
        b.token().to_string(),
        "{}",
        fenced.stderr
    );
    b.release();
    b.finish_with(0);
}

/// A holder connected directly, and a fault proxy to the same server for a waiter.
fn held_and_a_proxy(label: &str) -> (Place<'static>, Sandbox, Proxy, String, Job) {
    let p = place(label);
    let sb = Sandbox::new();
    let proxy = Proxy::start(format!("127.0.0.1:{}", p.pg.port()).parse().unwrap());
    let through = p.url_at(&proxy.addr().to_string());
    let a = Job::hold(p.job(&p.url()), &sb, "a");
    (p, sb, proxy, through, a)
}

/// A waiter cut off from the database rides it out, and takes the lease once it answers again.
#[test]
fn a_waiter_rides_out_a_database_that_does_not_answer_and_takes_the_lease_after() {
    let (p, sb, proxy, through, mut a) = held_and_a_proxy("ride_out");
    let lw = p.job(&through).args(&["--dial-timeout", "1s"]);
    let mut b = Job::spawn(lw, Marks::new(&sb, "b"), false);
    wait_until(STARTUP, "the waiter to wait", || {
        b.run.stderr().contains("waiting for the lease")
    });
    proxy.set_mode(Mode::Blackhole);
    wait_until(STARTUP, "a read to fail", || {
        b.run.stderr().contains("reading the lease's row failed")
    });
    a.release();
    a.finish_with(0);
    proxy.heal();
    assert_eq!(b.token(), a.token() + 1, "{}", b.run.stderr());
    b.release();
    b.finish_with(0);
}

/// A bounded wait that runs out while the database does not answer is 69, not 75.
#[test]
fn a_bounded_wait_that_runs_out_while_the_database_does_not_answer_is_69() {
    let (p, sb, proxy, through, mut a) = held_and_a_proxy("wait_69");
    let ran = sb.path("ran");
    let lw = p.job(&through).args(&["--dial-timeout", "1s", "-w", "3s"]);
    let mut b = lw.shell(&format!("touch {}", q(&ran))).spawn();
    wait_until(STARTUP, "the waiter to wait", || {
        b.stderr().contains("waiting for the lease")
    });
    proxy.set_mode(Mode::Blackhole);
    b.wait_timeout(STARTUP);
    assert_exit(&b, 69);
    assert!(b.stderr().contains("gave up waiting"), "{}", b.stderr());
    assert!(!ran.exists());
    proxy.heal();
    a.release();
    a.finish_with(0);
}

#[test]
fn another_role_may_not_take_a_name_it_is_not_tied_to() {
    let p = place("other_role");
    let other = role(p.pg, &p.db, "other");
    let out = p.quiet(&p.url_as(&other)).shell("exit 3").output();
    assert_exit(&out, 77);
    assert!(
        out.stderr.contains("is tied to no lease name"),
        "{}",
        out.stderr
    );
    // Tied to a name of its own, it may still not take the test's.
    let own = format!("{}.other", p.db);
    p.pg.psql_ok(
        &p.db,
        &format!("SELECT leasewrap.allow('{other}', '{own}')"),
    );
    let out = p.quiet(&p.url_as(&other)).shell("exit 3").output();
    refused_in_one_line(
        &out,
        &format!("role {other} may not use the lease \"{}\"", p.name),
    );
    assert_eq!(p.row(), "", "the other role's run left a row");
}

/// A run refused with 77 and the one line `refused` is in.
#[track_caller]
pub(crate) fn refused_in_one_line(out: &Output, refused: &str) {
    assert_exit(out, 77);
    assert!(out.stderr.contains(refused), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
}

#[test]
fn a_wrong_password_is_refused_with_77_and_nothing_taken() {
    let p = place("password");
    let sb = Sandbox::new();
    require_a_password(p.pg, &p.db, &p.role);
    let url = p.url_at(&format!("127.0.0.1:{}", p.pg.port()));
    let wrong = sb.password_file("wrong", "not-it");
    let out = p
        .quiet(&url)
        .args(&["--password-file"])
        .args(&[&wrong])
        .shell("exit 3")
        .output();
    assert_exit(&out, 77);
    assert!(
        out.stderr.contains("password authentication failed"),
        "{}",
        out.stderr
    );
    let right = sb.password_file("right", "sesame");
    let out = p
        .quiet(&url)
        .args(&["--password-file"])
        .args(&[&right])
        .shell("exit 3")
        .output();
    assert_exit(&out, 3);
}

/// `role` logs in over TCP with the password `sesame` only (the shared server trusts the rest).
fn require_a_password(pg: &Postgres, db: &str, role: &str) {
    pg.psql_ok(db, &format!("ALTER ROLE {role} PASSWORD 'sesame'"));
    let hba = pg.psql_ok(db, "SHOW hba_file");
    let old = std::fs::read_to_string(&hba).unwrap();
    let line = format!("host all {role} 127.0.0.1/32 scram-sha-256\n");
    std::fs::write(&hba, format!("{line}{old}")).unwrap();
    pg.psql_ok(db, "SELECT pg_reload_conf()");
    wait_until(STARTUP, "the server to ask for the password", || {
        let mut cmd = pg.psql_command(db);
        cmd.env("PGHOST", "127.0.0.1")
            .env("PGUSER", role)
            .env("PGPASSWORD", "x");
        cmd.args(["-c", "SELECT 1"]);
        !run_bounded(cmd, Duration::from_secs(10)).status.success()
    });
}

#[test]
fn a_server_that_is_not_postgresql_is_69_in_one_line() {
    let etcd = etcd::shared(Version::V3_5);
    let addr = etcd.endpoint().trim_start_matches("http://").to_owned();
    let out = Leasewrap::new()
        .args(&[
            "--database",
            &format!("postgresql://job@{addr}/app"),
            "--name",
            "x",
        ])
        .shell("exit 3")
        .output();
    assert_exit(&out, 69);
    assert!(out.stderr.contains("is it PostgreSQL"), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
}

#[test]
fn a_database_without_the_sql_or_with_an_older_one_is_78_naming_fence_sql() {
    let pg = postgres::shared();
    let db = pg.database("lease_nosql");
    let url = format!(
        "postgresql://{}@/{db}?host={}&port={}",
        user::OTHER,
        pg.socket_dir().display().to_string().replace('/', "%2F"),
        pg.port()
    );
    let run = || {
        Leasewrap::new()
            .args(&["--database", &url, "--name", "x"])
            .shell("exit 3")
            .output()
    };
    let out = run();
    assert_exit(&out, 78);
    assert!(
        out.stderr.contains("leasewrap fence-sql postgres"),
        "{}",
        out.stderr
    );
    install(pg, &db);
    pg.psql_ok(&db, "CREATE OR REPLACE FUNCTION leasewrap.lease_sql() RETURNS integer LANGUAGE sql AS 'SELECT 4'");
    let out = run();
    assert_exit(&out, 78);
    assert!(
        out.stderr.contains("version 4, older than the 5"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_url_that_does_not_parse_is_64_in_one_line_and_contacts_nothing() {
    for url in [
        "postgresql://job:secret@db/app",
        "postgresql://db:99999/app",
        "pg://db",
    ] {
        let out = Leasewrap::new()
            .args(&["--database", url, "--name", "x"])
            .shell("exit 3")
            .output();
        assert_exit(&out, 64);
        assert_eq!(
            out.stderr.trim().lines().count(),
            1,
            "{url}: {}",
            out.stderr
        );
    }
}
