//! The man pages: what clap_mangen makes of the clap definitions, with the sections clap does not
//! know added by hand (EXIT STATUS from the code's own tables, ENVIRONMENT, FILES, EXAMPLES).
//! One page per command: `leasewrap.1` and `leasewrap-SUBCOMMAND.1`.

use clap::CommandFactory;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;

/// Variables leasewrap reads, and what for.
pub const READ: &[(&str, &str)] = &[
    (
        "LEASEWRAP_ENDPOINTS, ETCDCTL_ENDPOINTS",
        "etcd endpoints, comma separated (--endpoints). When none is set anywhere, the local backend is used.",
    ),
    (
        "LEASEWRAP_ZOOKEEPER",
        "ZooKeeper instead of etcd: host:port,host:port[/chroot] (--zookeeper). An --endpoints on the command line wins over it; beside LEASEWRAP_ENDPOINTS it is bad usage (64).",
    ),
    (
        "LEASEWRAP_DATABASE",
        "PostgreSQL or MariaDB instead of etcd: postgresql://[USER@][HOST][:PORT][/DBNAME][?PARAM=VALUE&...] or mariadb://... (--database). Beside --endpoints or --zookeeper on the command line it is not used.",
    ),
    (
        "PGPASSFILE",
        "with --database postgresql:// and no --password-file, the password is the first matching line of $PGPASSFILE, else $HOME/.pgpass, as libpq reads it; a file group or others may read is not used.",
    ),
    (
        "HOME",
        "with --database mariadb:// and no --password-file, the password is the last password= of the [client] or [client-mariadb] group of $HOME/.my.cnf, as the mariadb client reads it; a file others may write is not used.",
    ),
    (
        "USER",
        "with --database, the user when the URL names none, as libpq and the mariadb client take it.",
    ),
    ("LEASEWRAP_PREFIX", "key prefix of the lock keys (--prefix); default leasewrap/."),
    ("LEASEWRAP_CACERT, ETCDCTL_CACERT", "CA bundle to verify the server's certificate (--cacert)."),
    ("LEASEWRAP_CERT, ETCDCTL_CERT", "client certificate for TLS (--cert)."),
    (
        "LEASEWRAP_KEY_FILE, ETCDCTL_KEY",
        "client key for TLS (--key). Not LEASEWRAP_KEY, which is the lock key given to COMMAND.",
    ),
    ("LEASEWRAP_USER, ETCDCTL_USER", "etcd or ZooKeeper user, or USER:PASSWORD (--user)."),
    ("LEASEWRAP_PASSWORD_FILE", "file whose first line is the password (--password-file)."),
    (
        "LEASEWRAP_ZK_AUTH",
        "how --user authenticates to ZooKeeper: digest (the default) or sasl (--zk-auth).",
    ),
    (
        "LEASEWRAP_PASSWORD, ETCDCTL_PASSWORD",
        "the password itself, when neither --password-file nor USER:PASSWORD gives it.",
    ),
    (
        "LEASEWRAP_DIAL_TIMEOUT, ETCDCTL_DIAL_TIMEOUT",
        "how long to wait for etcd or ZooKeeper before giving up with status 69 (--dial-timeout).",
    ),
    ("LEASEWRAP_TTL", "lease TTL to ask for (--ttl)."),
    ("LEASEWRAP_LOCAL_DIR", "local backend state directory (--local-dir)."),
    (
        "XDG_STATE_HOME, HOME",
        "the default local directory when not root: $XDG_STATE_HOME/leasewrap, else $HOME/.local/state/leasewrap.",
    ),
    ("LEASEWRAP_LOG_FORMAT", "log line format on stderr, text or json (--log-format)."),
    (
        "LEASEWRAP_LOG",
        "a filter for log lines, such as debug or leasewrap=debug; it overrides -q and -v (see LOGS).",
    ),
    (
        "NOTIFY_SOCKET",
        "set by systemd: leasewrap sends STATUS= while waiting and holding, READY=1 once COMMAND has started, and STOPPING=1 on the way out.",
    ),
    ("PATH", "where COMMAND is looked up when it has no slash."),
    ("LEASEWRAP_FENCING_TOKEN", "the default --token of fenced-write and fenced-put."),
    ("LEASEWRAP_KEY", "the default --lock-key of fenced-put."),
];

/// Variables COMMAND gets on top of leasewrap's own environment.
pub const GIVEN: &[(&str, &str)] = &[
    (
        "LEASEWRAP_FENCING_TOKEN",
        "the fencing token (decimal): it grows with every new holder of the lease.",
    ),
    ("LEASEWRAP_NAME", "the lease name."),
    (
        "LEASEWRAP_KEY",
        "the lock key (etcd), the lock node's path (ZooKeeper) or the lock file (local).",
    ),
    (
        "LEASEWRAP_LEASE_ID",
        "the etcd lease id, or the ZooKeeper session id, in hex.",
    ),
    (
        "LEASEWRAP_ENDPOINTS, LEASEWRAP_PREFIX",
        "where the lease lives, so that COMMAND can call leasewrap fenced-put (LEASEWRAP_ENDPOINTS on etcd only, LEASEWRAP_PREFIX on ZooKeeper too). leasewrap sets no ETCDCTL_* variable: etcdctl exits when a variable and its flag are both given, so an etcdctl that COMMAND runs is given --endpoints \"$LEASEWRAP_ENDPOINTS\". What leasewrap's own environment had, ETCDCTL_* included, reaches COMMAND unchanged.",
    ),
    (
        "LEASEWRAP_ZOOKEEPER",
        "the connect string, so that COMMAND can call leasewrap fenced-put (ZooKeeper only).",
    ),
    (
        "LEASEWRAP_DATABASE",
        "the --database URL (it holds no password), so that COMMAND can reach the same database, where leasewrap.fence(NAME, TOKEN) takes the lease's token (--database only).",
    ),
    (
        "LEASEWRAP_LOCAL_DIR",
        "the local backend's directory (local only).",
    ),
    (
        "ETCD_LOCK_KEY, ETCD_LOCK_REV",
        "the lock key, and its create revision (the fencing token), for scripts written for etcdctl lock; etcdctl itself gives the revision at which it acquired, which also grows with each holder (etcd only).",
    ),
];

/// Exit statuses of fenced-write and fenced-put beyond those of leasewrap(1).
const FENCED_EXIT: &[(&str, &str)] = &[
    ("0", "written"),
    ("73", "refused: the token is lower than one already seen (fenced-write) or the lock key no longer has it (fenced-put); nothing was written"),
];

/// Every page, as (file name, roff text).
pub fn pages() -> Vec<(String, String)> {
    let mut cmd = leasewrap::cli::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = vec![("leasewrap.1".to_owned(), main_page(&cmd))];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let man = page_of(sub.clone());
        let text = match sub.get_name() {
            "status" => status_page(&man),
            "fence-sql" => fence_sql_page(&man),
            _ => fenced_page(&man),
        };
        pages.push((man.get_filename(), text));
    }
    pages
}

/// The forms of the main command, for its SYNOPSIS (clap's own lists options without values).
pub const FORMS: &[&str] = &[
    "[OPTIONS] -- COMMAND [ARG]...",
    "[OPTIONS] -c 'SHELL STRING'",
    "status [OPTIONS] [NAME]",
    "status [OPTIONS] --once KEY NAME",
    "status [OPTIONS] --once-per DUR NAME",
    "fenced-write [--token N] DEST -- COMMAND [ARG]...",
    "fenced-write [--token N] DEST",
    "fenced-put [OPTIONS] [--token N] [--lock-key KEY] KEY VALUE",
    "fence-sql postgres",
];

/// The sections clap_mangen renders, less its EXTRA (the --help pointer to this page); the main
/// page has its own SYNOPSIS and the SUBCOMMANDS list.
fn generated(man: &Man, main: bool) -> String {
    let mut title = Vec::new();
    man.render_title(&mut title).unwrap();
    let mut out = String::from_utf8(title).unwrap();
    out += &body(|w| man.render_name_section(w));
    if main {
        let mut synopsis = Sections::new();
        synopsis.heading("SYNOPSIS");
        for form in FORMS {
            synopsis
                .0
                .text([bold("leasewrap"), roman(format!(" {form}"))]);
            synopsis.0.control("br", []);
        }
        out += &synopsis.render();
    } else {
        out += &body(|w| man.render_synopsis_section(w));
    }
    out += &body(|w| man.render_description_section(w));
    out += &body(|w| man.render_options_section(w));
    if main {
        out += &body(|w| man.render_subcommands_section(w));
    }
    out
}

/// One section as clap_mangen renders it, without the preamble every render starts with.
fn body(render: impl Fn(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut text = Vec::new();
    render(&mut text).unwrap();
    String::from_utf8(text).unwrap()[Roff::new().render().len()..].to_owned()
}

/// clap_mangen's page for `cmd`, with leasewrap's version as the source in the footer.
fn page_of(cmd: clap::Command) -> Man {
    Man::new(cmd).source(concat!("leasewrap ", env!("CARGO_PKG_VERSION")))
}

/// Hand-written sections, rendered without a second preamble.
struct Sections(Roff);

impl Sections {
    fn new() -> Self {
        Sections(Roff::new())
    }

    fn heading(&mut self, title: &str) -> &mut Self {
        self.0.control("SH", [title]);
        self
    }

    fn para(&mut self, text: &str) -> &mut Self {
        self.0.control("PP", []).text([roman(text)]);
        self
    }

    /// A tagged paragraph: `term` in bold, `text` indented below it.
    fn item(&mut self, term: &str, text: &str) -> &mut Self {
        self.0
            .control("TP", [])
            .text([bold(term)])
            .text([roman(text)]);
        self
    }

    fn items(&mut self, rows: &[(&str, &str)]) -> &mut Self {
        rows.iter().for_each(|(t, d)| {
            self.item(t, d);
        });
        self
    }

    /// A roff comment before the next example, telling tests/it/docs/examples.rs how to run it
    /// (`hosts once`, `not run: WHY`, ...); the reader of the page never sees it.
    fn mark(&mut self, words: &str) -> &mut Self {
        self.0
            .control("\\\"", ["example:"].into_iter().chain(words.split(' ')));
        self
    }

    /// `intro`, then `lines` as an indented literal block.
    fn example(&mut self, intro: &str, lines: &[&str]) -> &mut Self {
        self.para(intro);
        self.0.control("RS", ["4"]).control("nf", []);
        lines.iter().for_each(|l| {
            self.0.text([roman(*l)]);
        });
        self.0.control("fi", []).control("RE", []);
        self
    }

    fn see_also(&mut self, refs: &[(&str, &str)]) -> &mut Self {
        self.heading("SEE ALSO");
        let mut inlines = Vec::new();
        for (i, (page, section)) in refs.iter().enumerate() {
            let sep = if i + 1 < refs.len() { ", " } else { "" };
            inlines.push(bold(*page));
            inlines.push(roman(format!("({section}){sep}")));
        }
        self.0.text(inlines);
        self
    }

    /// The version, last, as clap_mangen writes it on the main page.
    fn version(&mut self) -> &mut Self {
        self.heading("VERSION");
        self.0
            .text([roman(concat!("v", env!("CARGO_PKG_VERSION")))]);
        self
    }

    fn render(&self) -> String {
        body(|w| self.0.to_writer(w))
    }
}

fn main_page(cmd: &clap::Command) -> String {
    let man = page_of(cmd.clone());
    let mut s = Sections::new();
    s.heading("EXIT STATUS")
        .para("leasewrap ends with its child's status, or says why it did not:")
        .items(leasewrap::error::EXIT_STATUS_TABLE)
        .para("leasewrap status has statuses of its own: see leasewrap-status(1).");
    requirements(&mut s);
    s.heading("ENVIRONMENT")
        .para("Options given on the command line win over the environment; a LEASEWRAP_ variable wins over its ETCDCTL_ twin. An empty variable counts as unset, except LEASEWRAP_PREFIX, where empty means the empty prefix (so a child of --prefix '' that runs leasewrap again stays on it). --name never comes from the environment: a child that runs leasewrap again must not queue behind itself. A bad value in a variable is reported under the variable's name (LEASEWRAP_LOG_FORMAT: invalid value 'JSON' ...), not as the option it stands for.")
        .items(READ)
        .para("COMMAND gets leasewrap's environment less every variable whose name ends in _PASSWORD, the password part of a USER:PASSWORD in LEASEWRAP_USER or ETCDCTL_USER, and NOTIFY_SOCKET, plus:")
        .items(GIVEN)
        .para("No file descriptor of leasewrap's (lock files, sockets) is passed on to COMMAND.");
    s.heading("ONCE PER SCHEDULED RUN")
        .para("A lease gives mutual exclusion; --once gives a job that runs once per schedule on a fleet, and retries on another host when a run fails.")
        .items(leasewrap::runs::MAN_SECTION);
    s.heading("LOGS").items(leasewrap::log::MAN_SECTION);
    s.heading("CAVEATS").items(leasewrap::cli::CAVEATS);
    s.heading("SECURITY").items(leasewrap::cli::SECURITY_NOTES);
    s.heading("FILES")
        .item("DIR/NAME.lock", "the local backend's lock file, locked with flock(2) while the lease is held; it holds the holder's record (JSON: host, pid, command (the program only), args (how many arguments it left out), start). DIR is --local-dir, by default /var/lib/leasewrap as root.")
        .item("DIR/NAME.token", "the local backend's fencing token counter. It must survive reboots: never delete it.")
        .item("DIR/runs/NAME/KEY.json", "the local backend's run record of KEY (--once, --once-per): JSON with format, name, key, outcome, attempts, host, pid, token, start, end, exit_status, signal and keep_until (times in seconds since the epoch, from 1970 to 9999). Removed by a later write once other records show its keep_until passed (see ONCE PER SCHEDULED RUN); its modification time means nothing.");
    examples_main(&mut s);
    s.see_also(&[
        ("leasewrap-status", "1"),
        ("leasewrap-fenced-write", "1"),
        ("leasewrap-fenced-put", "1"),
        ("flock", "1"),
        ("etcdctl", "1"),
        ("systemd.service", "5"),
        ("sd_notify", "3"),
    ]);
    s.version();
    generated(&man, true) + &s.render()
}

/// What the binary needs of the system: the glibc floor scripts/release.sh builds for, and
/// the kernel features that supervise::kernel tries.
fn requirements(s: &mut Sections) {
    let floor = crate::support::release::glibc_floor();
    s.heading("REQUIREMENTS")
        .para(&format!("The released binary (scripts/release.sh, and the .deb and .rpm packages made from it) runs on x86_64 Linux with glibc {floor} or later, and needs no other library. A binary built from source needs its build host's glibc or later. leasewrap --version names the version, the commit it was built from (commit unknown outside git) and the oldest glibc it runs on."))
        .para("Running a command needs these kernel features. leasewrap tries each one itself before it takes the lease (a kernel that has one backported passes); on a kernel without one it starts nothing and exits 71, with one line naming the feature and the Linux release that has it:")
        .items(leasewrap::supervise::kernel::FEATURES)
        .para("leasewrap status, fenced-write, fenced-put and fence-sql start no process tree and need none of them.");
}

fn examples_main(s: &mut Sections) {
    s.heading("EXAMPLES")
        .example(
            "Keep runs of a job on this host from overlapping (the local backend): a run that finds the lease held ends at once with status 0:",
            &["leasewrap --no-wait -E 0 --name nightly-report -- /usr/local/bin/nightly-report"],
        )
        .example(
            "The same across every host of a fleet, on etcd over TLS with the endpoints from the environment:",
            &[
                "export LEASEWRAP_ENDPOINTS=https://etcd1:2379,https://etcd2:2379,https://etcd3:2379",
                "export LEASEWRAP_CACERT=/etc/leasewrap/ca.crt",
                "leasewrap --no-wait -E 0 --name nightly-report -- /usr/local/bin/nightly-report",
            ],
        )
        .example(
            "The child replaces /srv/report.html with make-report's output only if make-report exits 0, and only while its token is the newest (the stdin form, make-report | leasewrap fenced-write DEST, would commit the output of a make-report that died half way):",
            &["leasewrap --name report -- leasewrap fenced-write /srv/report.html -- make-report"],
        )
        .example(
            "Share a lock with etcdctl lock (the same key layout without a prefix):",
            &["leasewrap --prefix '' --name db-migrate -- ./migrate"],
        )
        .mark("hosts once")
        .example(
            "From cron on every host of a fleet: the nightly report runs once a night, on whichever host fires first; the others, and any that catch up late, end with status 0:",
            &["leasewrap -q -w 1h -E 0 --once-per 1d --endpoints http://etcd1:2379,http://etcd2:2379,http://etcd3:2379 --metrics-file /var/lib/node_exporter/textfile/nightly-report.prom --name nightly-report -- /usr/local/bin/nightly-report"],
        )
        .mark("etcd status 1")
        .example(
            "Before trying that job by hand: which KEY a run now would use, and whether it is done:",
            &["leasewrap status --once-per 1d --endpoints http://etcd1:2379,http://etcd2:2379,http://etcd3:2379 nightly-report"],
        )
        .example(
            "Who holds what, for people and for scripts:",
            &[
                "leasewrap status",
                "leasewrap status --json nightly-report | jq .token",
            ],
        );
}

fn status_page(man: &Man) -> String {
    let mut s = Sections::new();
    s.heading("OUTPUT")
        .para("One line per lease under a header, in aligned columns: NAME, STATE (held or free), TOKEN (the holder's fencing token), TIME LEFT, WAITERS, and the holder's HOST, PID (of its leasewrap) and COMMAND (the program, with the number of arguments the record leaves out: no backend records an argument, which may hold a secret). A - means the column does not apply (a free lease; time left on the local backend, where the lock lasts as long as its holder process); a ? means it is not known (an etcdctl lock holder records no host or command).")
        .para("Without NAME every lease is listed: each NAME with a key under the prefix on etcd, each NAME.lock in the local directory, and each NAME that has run records (as free when nobody holds it). A free lease that was never taken is shown only when named.")
        .para("On etcd, TIME LEFT is the server's time to live of the holder's lease: the holder stops its child before it runs out. WAITERS counts the keys queued behind the holder's. On the local backend WAITERS counts the processes blocked in flock(2) on the lock file, from /proc/locks; it is ? when the holder's lock is not listed there (a holder in another PID namespace).");
    s.para("A lock file that is refused (a symbolic link, a FIFO, not a regular file, longer than a record) is a row of its own, STATE refused, with why in the COMMAND column; the other leases are listed as usual. Every field that comes from a file, a key or a record is shown with each character that does not print as itself (ESC, CR, BEL, bidirectional and other format characters) written as \\u{..}.");
    s.para("With --json: one JSON object when NAME is given, else an array of them, each with the fields name, backend (etcd or local), held, holder (null, or host, pid, command (the program, as an array of one), args (how many arguments were left out), start), token, time_left_s, ttl_s (the granted TTL), waiters, key (the holder's lock key or lock file), refused (null, or why the lock file was refused), runs and unreadable_runs; null where the text shows - or ?. Every time in it (holder.start; start, end and keep_until of a run) is a number of seconds since the epoch, with a fraction.");
    s.para("Run records (--once, --once-per) follow the leases, after a blank line, when there are any: the last 10 runs of each lease listed, newest first, with NAME, KEY, OUTCOME (ran-ok, failed, lost or timed-out), RUNS (runs of KEY so far, on every host), TOKEN, HOST and PID of the leasewrap that ran it, START, END (RFC 3339, UTC) and STATUS (the exit status, or the signal). In --json each lease has them as runs, an array of the records as stored (format, name, key, outcome, attempts, host, pid, token, start, end, exit_status, signal, keep_until). What stands at a record's place and is not a record of it (a FIFO, a link, a foreign value, a damaged record such as one with a time outside 1970 to 9999) is a row with OUTCOME unreadable and why in STATUS (naming the field and its number as stored, never the file's whole contents); in --json, unreadable_runs, an array of objects with key and why.");
    s.para("Whatever was refused or unreadable, the whole listing is printed first; then status writes one line naming all of it and exits 78.");
    s.para("With --once KEY NAME, status prints one line saying whether KEY is done, by whom and after how many runs, and exits 0 when it is done and 1 when it is not; with --json, one object with name, key, done and record (null before the first run). With --once-per DUR NAME, KEY is the slot a leasewrap --once-per DUR run would take if it started now: a run by hand would use it up (see CAVEATS in leasewrap(1)).");
    s.para("NAME may also be given as --name NAME, as the run form spells it.");
    s.para("status only reads: it creates no key, file or directory. On the local backend it tries a shared flock(2) on each lock file without waiting and lets go at once; a leasewrap --no-wait that tries to take the same lease in that instant is told that the lease is held.");
    s.heading("EXIT STATUS")
        .items(leasewrap::status::EXIT_STATUS_TABLE);
    s.heading("EXAMPLES")
        .example(
            "Alert when no host runs the singleton daemon scheduler:",
            &["leasewrap status scheduler >/dev/null || echo 'no scheduler is running' | mail -s alert ops"],
        )
        .example(
            "The token of the current holder:",
            &["leasewrap status --json nightly-report | jq .token"],
        );
    s.see_also(&[("leasewrap", "1")]);
    s.version();
    generated(man, false) + &s.render()
}

fn fenced_page(man: &Man) -> String {
    let mut s = Sections::new();
    s.heading("EXIT STATUS")
        .items(FENCED_EXIT)
        .para("Other statuses (64, 69, 77, 78, 125) as in leasewrap(1).");
    s.see_also(&[("leasewrap", "1")]);
    s.version();
    generated(man, false) + &s.render()
}

/// fence-sql(1)'s THE FENCE: how a job calls it, and what it answers.
fn fence_section(s: &mut Sections) {
    s.heading("THE FENCE")
        .para("The job calls the fence as the first statement of each transaction that writes: SELECT leasewrap.fence(NAME, TOKEN) on PostgreSQL, CALL leasewrap.fence(NAME, TOKEN) on MariaDB, with a client that reads no rc or option file (psql's -X, the mariadb client's --no-defaults) and stops at the first error (psql's ON_ERROR_STOP=1, status 3; the mariadb client fed a script, status 1), so that a refusal ends the client and rolls the transaction back. A token equal to the recorded one is allowed (one holder, many transactions). A job's role (user) may fence only the names an administrator tied to it with leasewrap.allow(ROLE, NAME or PREFIX*), and has no right on the fence's tables.")
        .items(&[
            ("LWF01", "stale fencing token N for \"NAME\": M is recorded: a newer holder has written; roll back and stop, do not retry (MariaDB error 9101)"),
            ("LWF02", "NAME is not a lease name, or the token is not a decimal from 0 to 18446744073709551615 (9102)"),
            ("LWF03", "PostgreSQL: called inside a savepoint, whose rollback would undo the fence; MariaDB: called outside a transaction, with autocommit off, or in a read-only transaction (9103)"),
            ("25006", "MariaDB: a write after a statement that committed on its own (DDL, TRUNCATE, LOCK TABLES, a second START TRANSACTION), which ended the fence (1792): roll back and stop"),
            ("42501, 42000", "the role (user, 9104) may not fence NAME"),
            ("55P03, 1205", "the fence waited longer than its bound (PostgreSQL: the function's lock_timeout, 2min; MariaDB: innodb_lock_wait_timeout): nothing was written"),
            ("40001, 40P01", "a serialization failure (PostgreSQL under REPEATABLE READ or SERIALIZABLE) or a deadlock (names fenced in different orders): nothing was written; retry the whole transaction"),
        ])
        .para("Running the SQL again upgrades an older fence and keeps the ties, the grants they give and the fence's settings; every other right on what it made is taken back (PostgreSQL), and it refuses, naming it and changing nothing, what it did not make, what would run as the fence's owner, a schema (database) leasewrap that another role owns, and (MariaDB) another account's right on the database leasewrap but EXECUTE. It waits at most 3 s for a lock, then changes nothing and says who held it. A holder paused inside its transaction keeps NAME's row locked until its session ends: idle_in_transaction_session_timeout, tcp_user_timeout (PostgreSQL), idle_transaction_timeout, net_write_timeout (MariaDB); docs/fencing.md says which covers which state. Only the fenced transaction is guarded: writes outside it are not. MySQL has no fence: the MariaDB SQL uses MariaDB's own statements.");
}

fn fence_sql_page(man: &Man) -> String {
    let mut s = Sections::new();
    s.heading("EXIT STATUS").items(&[
        ("0", "the SQL was printed"),
        (
            "64",
            "DATABASE is missing or not one fence-sql knows (postgres, mariadb)",
        ),
        ("125", "standard output could not take it"),
    ]);
    fence_section(&mut s);
    s.heading("FILES")
        .item(
            "/usr/share/leasewrap/sql/postgres-fence.sql",
            "the PostgreSQL SQL, installed with the package",
        )
        .item(
            "/usr/share/leasewrap/sql/mariadb-fence.sql",
            "the MariaDB SQL, installed with the package",
        );
    s.heading("EXAMPLES")
        .mark("not run: needs a database server (postgres::neighbours::the_readme_s_install_line_exits_non_zero_when_the_install_fails and postgres::a_job_run_by_leasewrap_on_the_local_backend_fences_with_its_token run them)")
        .example(
            "Install the fence in the database the job writes, let the job's role fence its name, then run the job with it:",
            &[
                "leasewrap fence-sql postgres | psql -X -v ON_ERROR_STOP=1 -d reports -f -",
                "psql -X -v ON_ERROR_STOP=1 -d reports -c \"SELECT leasewrap.allow('report_job', 'report')\"",
                "leasewrap --name report -- sh -c 'psql -X -v ON_ERROR_STOP=1 -d reports -v name=\"$LEASEWRAP_NAME\" -v token=\"$LEASEWRAP_FENCING_TOKEN\" -f /usr/local/lib/report.sql'",
            ],
        )
        .mark("not run: needs a MariaDB server (mariadb::neighbours::the_install_refuses_a_database_another_user_may_change_or_made_first_and_a_re_run_keeps_grants runs the SQL)")
        .example(
            "The same on MariaDB, as root:",
            &[
                "leasewrap fence-sql mariadb | mariadb --no-defaults --user=root",
                "mariadb --no-defaults --user=root -e \"CALL leasewrap.allow('report_job', 'report')\"",
            ],
        );
    s.see_also(&[("leasewrap", "1"), ("psql", "1"), ("mariadb", "1")]);
    s.version();
    generated(man, false) + &s.render()
}

// ---------------------------------------------------------------------------------------------
// Facts the pages must keep saying (issue 21 item 14, and the examples of items 1, 3 and 4).
// ---------------------------------------------------------------------------------------------

/// The page `file` as pages() makes it, with roff's escapes for - and ' undone.
fn page_text(file: &str) -> String {
    let (_, roff) = pages()
        .into_iter()
        .find(|(name, _)| name == file)
        .unwrap_or_else(|| panic!("no page {file}"));
    roff.replace("\\-", "-").replace("\\*(Aq", "'")
}

/// The lines of `page` between `.SH TITLE` and the next section.
fn section(page: &str, title: &str) -> String {
    let start = page
        .find(&format!(".SH {title}\n"))
        .unwrap_or_else(|| panic!("no section {title}"));
    let rest = &page[start + 5 + title.len()..];
    rest[..rest.find("\n.SH ").unwrap_or(rest.len())].to_owned()
}

/// Each example of `page`: its introduction and its lines.
fn examples(page: &str) -> Vec<(String, Vec<String>)> {
    let text = section(page, "EXAMPLES");
    text.split(".PP\n")
        .skip(1)
        .map(|block| {
            let (intro, rest) = block
                .split_once("\n.RS 4\n.nf\n")
                .expect("an example block");
            let lines = rest.split("\n.fi").next().unwrap().lines();
            (intro.to_owned(), lines.map(str::to_owned).collect())
        })
        .collect()
}

#[test]
fn fenced_pages_show_token_and_lock_key_as_optional_and_name_their_variables() {
    for (file, options) in [
        ("leasewrap-fenced-write.1", &["--token"][..]),
        ("leasewrap-fenced-put.1", &["--token", "--lock-key"][..]),
    ] {
        let page = page_text(file);
        let synopsis = section(&page, "SYNOPSIS");
        for option in options {
            assert!(
                synopsis.contains(&format!("[\\fB{option}\\fR]")),
                "{file}: {option} is not shown as optional: {synopsis}"
            );
        }
    }
    let write = section(&page_text("leasewrap-fenced-write.1"), "OPTIONS");
    assert!(
        write.contains("[default: $LEASEWRAP_FENCING_TOKEN"),
        "{write}"
    );
    let put = section(&page_text("leasewrap-fenced-put.1"), "OPTIONS");
    assert!(put.contains("[default: $LEASEWRAP_FENCING_TOKEN"), "{put}");
    assert!(put.contains("[default: $LEASEWRAP_KEY"), "{put}");
}

#[test]
fn fenced_put_page_says_it_needs_etcd_and_not_that_no_endpoints_means_local() {
    let page = page_text("leasewrap-fenced-put.1");
    assert!(!page.contains("none means the local backend"), "{page}");
    assert!(section(&page, "DESCRIPTION").contains("fenced-put needs etcd"));
    assert!(section(&page, "OPTIONS").contains("fenced-put needs etcd"));
}

#[test]
fn main_synopsis_has_fenced_writes_command_form_and_the_status_forms() {
    let synopsis = section(&page_text("leasewrap.1"), "SYNOPSIS");
    for form in [
        "fenced-write [--token N] DEST -- COMMAND [ARG]...",
        "status [OPTIONS] --once KEY NAME",
        "status [OPTIONS] --once-per DUR NAME",
    ] {
        assert!(synopsis.contains(form), "no {form:?} in {synopsis}");
    }
}

#[test]
fn help_shows_the_command_after_dash_dash_as_required() {
    let mut help = std::process::Command::new(crate::support::BIN);
    help.arg("--help");
    let out = crate::support::run_bounded(help, crate::support::RUN_BOUND);
    crate::support::assert_exit(&out, 0);
    let usage: Vec<&str> = out
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Usage:"))
        .take(3)
        .map(str::trim)
        .collect();
    assert_eq!(
        usage,
        [
            "Usage: leasewrap [OPTIONS] -- <COMMAND>...",
            "leasewrap [OPTIONS] -c <SHELL STRING>",
            "leasewrap <SUBCOMMAND> ..."
        ],
        "{}",
        out.stdout
    );
}

#[test]
fn man_examples_write_with_a_command_and_say_several_hosts_only_with_endpoints() {
    let page = page_text("leasewrap.1");
    let all = examples(&page);
    assert!(all.len() >= 6, "{all:?}");
    for (intro, lines) in &all {
        let text = lines.join("\n");
        assert!(
            !text.contains("| leasewrap fenced-write"),
            "the stdin form of fenced-write commits a dead producer's half output: {text}"
        );
        let fleet = ["fleet", "many", "several hosts", "every host"]
            .iter()
            .any(|w| intro.contains(w));
        assert!(
            !fleet || text.contains("--endpoints") || text.contains("LEASEWRAP_ENDPOINTS"),
            "{intro:?} speaks of many hosts, but gives no endpoints: {text}"
        );
        assert!(
            !text.contains("-E 0")
                || ["--no-wait", "-n ", "--once-per"]
                    .iter()
                    .any(|o| text.contains(o)),
            "-E 0 without --no-wait or --once-per waits its turn and runs again: {text}"
        );
    }
    let writes: Vec<&String> = all
        .iter()
        .flat_map(|(_, l)| l)
        .filter(|l| l.contains("fenced-write"))
        .collect();
    assert!(
        writes
            .iter()
            .any(|l| l.contains("fenced-write /srv/report.html -- ")),
        "{writes:?}"
    );
    let cron = all
        .iter()
        .find(|(intro, _)| intro.starts_with("From cron"))
        .expect("a cron example");
    assert!(cron.1[0].contains("-w 1h -E 0 --once-per 1d"), "{cron:?}");
}
