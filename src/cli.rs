//! The command line, as clap definitions and the small value parsers they use. Nothing here reads
//! the environment beyond clap's own `env` fallbacks, and nothing here touches the system:
//! `config.rs` turns these values into a checked `Config`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use nix::sys::signal::Signal;

/// Run a command as the only holder of a named lease.
#[derive(Parser, Debug)]
#[command(
    name = "leasewrap",
    version,
    // The commit it was built from and the glibc it was linked for (build.rs).
    long_version = env!("LONG_VERSION"),
    about = "Run a command as the only holder of a named lease, and stop it before the lease can lapse",
    long_about = "Run COMMAND as the only holder of the lease NAME: on etcd when endpoints are given, \
on ZooKeeper when a connect string is, in a PostgreSQL or MariaDB database when --database is, otherwise with a lock file on this host. The lease is renewed against a monotonic clock counted from \
when each renewal was sent; the child gets a fencing token in LEASEWRAP_FENCING_TOKEN, and its whole \
process tree is stopped before the lease can lapse. Everything after -- belongs to COMMAND, which is \
run directly, never through a shell unless -c is given.",
    after_help = "Exit status: the child's own, or 75 when the lease is held (or with --once, KEY is done), 124 when it was lost, 123 after --max-runtime; see the man page.",
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true,
    allow_negative_numbers = true,
    subcommand_value_name = "SUBCOMMAND",
    override_usage = "leasewrap [OPTIONS] -- <COMMAND>...\n       \
leasewrap [OPTIONS] -c <SHELL STRING>\n       \
leasewrap <SUBCOMMAND> ..."
)]
pub struct Cli {
    #[command(subcommand)]
    pub sub: Option<Sub>,

    #[command(flatten)]
    pub run: RunArgs,
}

/// The forms other than running a command.
#[derive(Subcommand, Debug)]
pub enum Sub {
    /// Who holds NAME (or every lease under the prefix): holder, token, time left, waiters
    Status(StatusArgs),
    /// Atomically replace DEST with COMMAND's output or stdin, refusing a token lower than one DEST has seen
    #[command(
        long_about = "Atomically replace DEST with the standard output of COMMAND (only if it exits 0), \
or with standard input, refusing a token lower than the highest one DEST.fence records. The new \
content is spooled to an unnamed temp file beside DEST first, with no lock held; then, under flock on \
DEST.fence, the token is checked and recorded and the temp file renamed over DEST. The token is \
--token N, or LEASEWRAP_FENCING_TOKEN, which leasewrap sets for its child: a child need not give it.",
        after_help = "The stdin form commits whatever arrived before EOF: a producer that dies half way \
(`make-report | leasewrap fenced-write DEST`) leaves its partial output, so prefer \
`leasewrap fenced-write DEST -- make-report`. A DEST that is a symbolic link or a directory is \
refused (64); DEST.fence is never followed through a link or waited on as a FIFO, must be a regular \
file of this user with one link holding one decimal token, and is never echoed (78)."
    )]
    FencedWrite(FencedWriteArgs),
    /// Put KEY VALUE in etcd or ZooKeeper only while the lock key still has the given token
    #[command(
        long_about = "Put KEY VALUE in etcd or ZooKeeper in one transaction that succeeds only while the lock key \
(--lock-key, or LEASEWRAP_KEY) still has the fencing token (--token, or LEASEWRAP_FENCING_TOKEN) as its \
create revision: a holder whose lease has ended, or that was replaced, writes nothing. fenced-put \
needs etcd or ZooKeeper: it has no local form. On ZooKeeper (--zookeeper) the lock key is the lock node's path, \
the token its czxid, and KEY a node path outside /leasewrap, written in one multi that first checks the lock node. Run by a child of leasewrap on etcd, it needs neither option nor \
--endpoints, since the child's environment has all three. KEY must lie outside leasewrap's own keys, else fenced-put refuses it with status 64: not under PREFIX/runs/ (the run records, which only leasewrap writes, under the lease of their own NAME), not under the lock key's own queue PREFIX NAME/, and with a non-empty prefix not under any PREFIX NAME/ (a key there takes part in that lock, and without a lease would hold it for ever). The guard proves only that the lock key had the token when the put was applied; which key a holder may write is up to etcd's permissions.",
        mut_arg("endpoints", |a| a.help(
            "etcd endpoints, comma separated; fenced-put needs etcd or ZooKeeper, it has no local backend [env: LEASEWRAP_ENDPOINTS, ETCDCTL_ENDPOINTS]"
        ))
    )]
    FencedPut(FencedPutArgs),
    /// Print the SQL that installs the database fence a job calls first in its transaction
    #[command(
        long_about = "Print the SQL that installs the database fence of DATABASE: on PostgreSQL the schema \
leasewrap with the function leasewrap.fence(name, token) that jobs call, and the schema leasewrap_data, \
on which jobs have no right, with the table fence (one row per lease NAME with the highest fencing token \
committed under it); on MariaDB the database leasewrap (the same table, and the procedure \
leasewrap.fence(name, token)). Beside the fence it installs the lease of leasewrap --database: the \
table lease (one row per NAME) and the functions (procedures) that alone change it. Install it as a superuser (root on MariaDB), \
with a client that reads no rc or option file and stops at the first error: \
leasewrap fence-sql postgres | psql -X -v ON_ERROR_STOP=1 -d DB -f -, or \
leasewrap fence-sql mariadb | mariadb --no-defaults --user=root. Running it again upgrades an older \
fence, keeps the ties, the grants they give and the function's lock_timeout, takes back every other \
right on what it made (PostgreSQL) and refuses, naming it and changing nothing, what it did not make, \
what would run as the fence's owner, and (MariaDB) another account's right on the database leasewrap. The package also ships \
both as /usr/share/leasewrap/sql/postgres-fence.sql and mariadb-fence.sql. Jobs get no rights on the \
tables: an administrator lets a job's role (user) fence a NAME or a PREFIX* with \
SELECT leasewrap.allow('report_job', 'report') (CALL on MariaDB), which also grants EXECUTE. A job \
calls the fence first in its own transaction: BEGIN; SELECT leasewrap.fence(:'name', :'token'); the \
writes; COMMIT; with psql -X -v ON_ERROR_STOP=1 -v name=\"$LEASEWRAP_NAME\" \
-v token=\"$LEASEWRAP_FENCING_TOKEN\". The fence locks NAME's row until the transaction ends, so a \
newer holder waits for an older one's transaction (bounded: PostgreSQL's lock_timeout of the function, \
2min; MariaDB's innodb_lock_wait_timeout) and then sees what it committed; a lower token than the one \
recorded is refused with SQLSTATE LWF01 before the transaction writes anything; bad input (a NAME that \
is not a lease name, a token that is not a decimal from 0 to 2^64-1) with LWF02; a NAME the role may \
not fence with 42501 (42000 on MariaDB); a call inside a savepoint (PostgreSQL), or outside a \
transaction or with autocommit off (MariaDB), with LWF03. On MariaDB a statement that commits on its \
own (DDL, TRUNCATE, LOCK TABLES) ends the fence: the session's later transactions are then read-only, \
so that the job's writes after it fail.",
        after_help = "fence-sql connects to nothing. MySQL has no fence: the MariaDB script uses MariaDB's own \
statements. See docs/fencing.md for psql, psycopg, the mariadb client and PyMySQL, isolation levels, \
savepoints, several names in one transaction, and which timeout frees the row of a paused holder in \
which state (idle_in_transaction_session_timeout, tcp_user_timeout, net_write_timeout)."
    )]
    FenceSql(FenceSqlArgs),
}

/// `leasewrap status`.
#[derive(Args, Debug, Clone)]
#[command(group = clap::ArgGroup::new("lease").args(["name", "name_option"]))]
pub struct StatusArgs {
    /// Lease name; every lease under the prefix (or in the local directory) when left out
    #[arg(value_name = "NAME")]
    pub name: Option<String>,

    /// The lease name, spelled as in the run form: the same as NAME
    #[arg(
        long = "name",
        id = "name_option",
        value_name = "NAME",
        conflicts_with = "name"
    )]
    pub name_option: Option<String>,

    /// Print JSON for scripts
    #[arg(long)]
    pub json: bool,

    /// Say whether KEY of NAME is done (exit 0) or not (exit 1), as --once KEY would find it
    #[arg(long, value_name = "KEY", requires = "lease")]
    pub once: Option<String>,

    /// Say which KEY a run with --once-per DUR would use now, and whether it is done (exit 0) or not (exit 1)
    #[arg(long, value_name = "DUR", value_parser = parse_duration, requires = "lease", conflicts_with = "once")]
    pub once_per: Option<Duration>,

    #[command(flatten)]
    pub conn: ConnArgs,

    /// Local backend state directory [default: /var/lib/leasewrap as root, else $XDG_STATE_HOME/leasewrap, or ~/.local/state/leasewrap without XDG_STATE_HOME]
    #[arg(long, value_name = "DIR", env = "LEASEWRAP_LOCAL_DIR")]
    pub local_dir: Option<PathBuf>,

    #[command(flatten)]
    pub log: LogArgs,
}

impl StatusArgs {
    /// NAME, given as the positional NAME or as --name NAME.
    pub fn lease_name(&self) -> Option<&str> {
        self.name.as_deref().or(self.name_option.as_deref())
    }
}

/// `leasewrap fenced-write`.
#[derive(Args, Debug, Clone)]
pub struct FencedWriteArgs {
    /// Fencing token of this write [default: $LEASEWRAP_FENCING_TOKEN, which leasewrap sets for its child]
    #[arg(long, value_name = "N", env = "LEASEWRAP_FENCING_TOKEN")]
    pub token: Option<u64>,

    /// File to replace; the highest token seen is kept in DEST.fence
    #[arg(value_name = "DEST")]
    pub dest: PathBuf,

    /// Write COMMAND's standard output instead of stdin, and replace DEST only if it exits 0
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,

    #[command(flatten)]
    pub log: LogArgs,
}

/// `leasewrap fenced-put`.
#[derive(Args, Debug, Clone)]
pub struct FencedPutArgs {
    /// Fencing token of this write [default: $LEASEWRAP_FENCING_TOKEN, which leasewrap sets for its child]
    #[arg(long, value_name = "N", env = "LEASEWRAP_FENCING_TOKEN")]
    pub token: Option<u64>,

    /// The lock key whose create revision must equal the token [default: $LEASEWRAP_KEY, which leasewrap sets for its child]
    #[arg(long, value_name = "KEY", env = "LEASEWRAP_KEY")]
    pub lock_key: Option<String>,

    /// Key to put
    #[arg(value_name = "KEY")]
    pub put_key: String,

    /// Value to put
    #[arg(value_name = "VALUE")]
    pub value: String,

    #[command(flatten)]
    pub conn: ConnArgs,

    #[command(flatten)]
    pub log: LogArgs,
}

/// `leasewrap fence-sql`.
#[derive(Args, Debug, Clone)]
pub struct FenceSqlArgs {
    /// The database whose fence to print
    #[arg(value_name = "DATABASE", value_enum)]
    pub database: FenceSqlDatabase,
}

/// The databases `fence-sql` has a fence for.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceSqlDatabase {
    /// PostgreSQL 9.5 or later
    Postgres,
    /// MariaDB 10.4 or later (not MySQL)
    Mariadb,
}

/// How to take the lease and run the child.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Lease name: 1-128 ASCII letters, digits and . _ - @ : + = [default: file name of COMMAND; required with -c and when COMMAND is a shell or interpreter, such as sh, bash, env or python3: see CAVEATS in leasewrap(1)]
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// Run SHELL STRING through /bin/sh -c instead of COMMAND
    #[arg(short = 'c', value_name = "SHELL STRING", conflicts_with = "command")]
    pub shell: Option<String>,

    /// Lease TTL to ask for, at least 1s; the server may grant more (etcd: at least 2s)
    #[arg(long, value_name = "DUR", env = "LEASEWRAP_TTL", default_value = "10s", value_parser = parse_ttl)]
    pub ttl: Duration,

    /// Fail at once if the lease is held
    #[arg(short = 'n', long)]
    pub no_wait: bool,

    /// Give up waiting for the lease after DUR (0 = --no-wait) [default: wait forever]
    #[arg(short = 'w', long, value_name = "DUR", value_parser = parse_duration, conflicts_with = "no_wait")]
    pub wait: Option<Duration>,

    /// Exit status when the lease was not acquired (held, or the wait ran out)
    #[arg(short = 'E', long, value_name = "N", default_value_t = 75)]
    pub conflict_exit_code: u8,

    /// Time between the stop signal and SIGKILL [default: min(2s, TTL/5)]
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub kill_after: Option<Duration>,

    /// The stop signal sent to the child's process group
    #[arg(short = 's', long, value_name = "SIG", default_value = "TERM", value_parser = parse_signal)]
    pub signal: Signal,

    /// Slack for kill latency and scheduling [default: min(1s, TTL/10)]
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub margin: Option<Duration>,

    /// Bound on how much faster the server's clock may run than ours (0.1 = 10 %)
    #[arg(long, value_name = "F", default_value = "0.1", value_parser = parse_drift)]
    pub drift: f64,

    /// Exit status after the lease was lost and the child stopped
    #[arg(long, value_name = "N", default_value_t = 124)]
    pub lost_exit_code: u8,

    /// Stop the child's whole tree after DUR (stop signal, --kill-after, SIGKILL), release the lease and exit 123
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub max_runtime: Option<Duration>,

    /// Run COMMAND at most once successfully per KEY, across every host of the backend; a holder that finds KEY done starts nothing and exits with the conflict status
    #[arg(long, value_name = "KEY", conflicts_with = "once_per")]
    pub once: Option<String>,

    /// As --once, with KEY the slot boundary nearest to the start time (UTC, RFC 3339): `--once-per 1d` runs once a day
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub once_per: Option<Duration>,

    /// How long a run record is kept after its run ends (only with --once or --once-per; without them it is refused, 64): 1s to 10y, and at least the --once-per slot [default: 7d, or twice the --once-per slot when that is longer]
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub keep: Option<Duration>,

    /// Give KEY up after N failed runs: later holders start nothing and exit with the conflict status [default: unlimited]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: Option<u32>,

    /// After every run or skip, replace PATH with a node_exporter textfile-collector file (name it *.prom)
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,

    #[command(flatten)]
    pub conn: ConnArgs,

    /// Local backend state directory, owned by you or root and writable by nobody else [default: /var/lib/leasewrap as root, else $XDG_STATE_HOME/leasewrap, or ~/.local/state/leasewrap without XDG_STATE_HOME]
    #[arg(long, value_name = "DIR", env = "LEASEWRAP_LOCAL_DIR")]
    pub local_dir: Option<PathBuf>,

    #[command(flatten)]
    pub log: LogArgs,

    /// The command to run and its arguments, after --
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// Where etcd is and how to talk to it. The ETCDCTL_* fallbacks are applied in config.rs.
#[derive(Args, Debug, Clone, Default)]
pub struct ConnArgs {
    /// etcd endpoints, comma separated; none means the local backend [env: LEASEWRAP_ENDPOINTS, ETCDCTL_ENDPOINTS]
    #[arg(long, value_name = "URLS")]
    pub endpoints: Option<String>,

    /// ZooKeeper instead of etcd: host:port,host:port[/chroot], as ZooKeeper tools take it [env: LEASEWRAP_ZOOKEEPER]
    #[arg(long, value_name = "CONNECT")]
    pub zookeeper: Option<String>,

    /// PostgreSQL or MariaDB instead of etcd: postgresql://[USER@][HOST][:PORT][/DBNAME][?sslmode=verify-full&...] or mariadb://...; the password from --password-file, ~/.pgpass or ~/.my.cnf, never in the URL [env: LEASEWRAP_DATABASE]
    #[arg(long, value_name = "URL")]
    pub database: Option<String>,

    /// Key prefix; '' shares locks with `etcdctl lock NAME` [env: LEASEWRAP_PREFIX] [default: leasewrap/]
    #[arg(long, value_name = "P")]
    pub prefix: Option<String>,

    /// CA bundle to verify etcd's certificate, or ZooKeeper's on its secure client port [env: LEASEWRAP_CACERT, ETCDCTL_CACERT]
    #[arg(long, value_name = "FILE")]
    pub cacert: Option<PathBuf>,

    /// Client certificate for TLS; on ZooKeeper also the identity (x509) that owns what leasewrap creates [env: LEASEWRAP_CERT, ETCDCTL_CERT]
    #[arg(long, value_name = "FILE")]
    pub cert: Option<PathBuf>,

    /// Client key for TLS [env: LEASEWRAP_KEY_FILE, ETCDCTL_KEY]
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,

    /// etcd or ZooKeeper user, or USER:PASSWORD as etcdctl takes it; on ZooKeeper the identity that owns what leasewrap creates [env: LEASEWRAP_USER, ETCDCTL_USER]
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,

    /// File whose first line is the password [env: LEASEWRAP_PASSWORD_FILE; LEASEWRAP_PASSWORD, ETCDCTL_PASSWORD hold it directly]
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,

    /// How --user and --password-file authenticate to ZooKeeper: digest (addauth digest; ACL id digest:USER:HASH) or sasl (SASL DIGEST-MD5 with the servers' JAAS users; ACL id sasl:USER) [env: LEASEWRAP_ZK_AUTH] [default: digest]
    #[arg(long, value_name = "SCHEME", value_parser = ["digest", "sasl"])]
    pub zk_auth: Option<String>,

    /// Time to wait for etcd or ZooKeeper to answer before giving up with status 69 (each endpoint or member gets its share) [env: LEASEWRAP_DIAL_TIMEOUT, ETCDCTL_DIAL_TIMEOUT] [default: 2s]
    #[arg(long, value_name = "DUR")]
    pub dial_timeout: Option<String>,
}

/// Where log lines go and how they look. They always go to stderr.
#[derive(Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Log line format on stderr
    #[arg(
        long,
        value_name = "FORMAT",
        env = "LEASEWRAP_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// Log errors only
    #[arg(short = 'q', long, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Log more: -v what leasewrap does (INFO: acquired, released, waiting; a successful run is otherwise silent), -vv DEBUG, -vvv everything
    #[arg(short = 'v', long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// Log line format.
#[derive(ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The SECURITY section of the man page: what leasewrap guards against, and what it cannot.
pub const SECURITY_NOTES: &[(&str, &str)] = &[
    (
        "Process group",
        "The watchdog, the process that kills the child at the deadline, runs in a session of its own: a signal to leasewrap's process group (kill -- -PGID, kill %1, the terminal's keys) never reaches it. SIGTERM, SIGINT, SIGHUP or SIGQUIT sent to the watchdog itself, as pkill -f leasewrap does, stops the tree in order. The child has no controlling terminal.",
    ),
    (
        "Pid reuse",
        "The child is reaped last, so its pid and process group cannot be given to another process while they are signalled; other descendants are signalled through pidfds.",
    ),
    (
        "Passwords",
        "They never reach the child's environment and leave leasewrap's own once read. leasewrap and the watchdog are not dumpable (PR_SET_DUMPABLE 0): no other process of the same user, the child included, can read their /proc/PID/environ or trace them, and once read, the passwords of the environment leasewrap was started with (every *_PASSWORD, and the password of a USER:PASSWORD in LEASEWRAP_USER or ETCDCTL_USER) are overwritten with * where /proc/PID/environ reads them, so that not even root sees them there, in leasewrap or in the watchdog. A warning comes for --user NAME:PASSWORD on the command line (world-readable in /proc/PID/cmdline) and for a password file group or others may read.",
    ),
    (
        "State directory",
        "--local-dir belongs to one user: it must be owned by that user or root and be writable by nobody else, and it is refused (78) otherwise, even by root. Lock and token files are opened in it without following links or waiting on FIFOs, and used only when they are a regular file of that user with one link; a token file must hold one decimal token, is read no further than 32 bytes and is never echoed. runs/ and runs/NAME, the folders of the run records, are reached through the state directory's descriptor without following links and are checked as it is; the records in them are opened as a lock file is and read no further than 64 KiB. A unit given User= needs a StateDirectory= of its own.",
    ),
    (
        "fenced-write",
        "DEST.fence follows the same rules as a lock file; a DEST that is a symbolic link is refused (64), so that every writer of a file shares one fence. The new content is spooled to an unnamed file before any lock is taken, and committed under a random name: no other user can block a writer by taking its temp file name.",
    ),
    (
        "Names and output",
        "A lease name and a --once KEY hold only ASCII letters, digits and . _ - @ : + =, so that no two print alike. status (its tables and its --once line) and the \"already ran\" log line show every character that does not print as itself (controls such as ESC, CR and BEL, bidirectional and other format characters) as \\u{..}, so that no file name, etcd key or field of a holder or run record drives the terminal.",
    ),
    (
        "What remains",
        "root and the user leasewrap runs as (its child included) can still kill every process by name at once (pkill -9 -f leasewrap): a daemonized descendant then outlives the lease. Pausing every process at once is what fencing tokens are for.",
    ),
];

/// The CAVEATS section of the man page: the traps a new user falls into, and how leasewrap helps.
pub const CAVEATS: &[(&str, &str)] = &[
    (
        "Everything after -- is COMMAND",
        "leasewrap --name job ./job.sh is refused (64) with the line to type instead: leasewrap --name job -- ./job.sh. A misspelt option gets the similar one (--tll: did you mean --ttl?), and a value that starts with - is judged as the value, not taken for options (--ttl -1s: \"-1s\" is not a duration: it is negative).",
    ),
    (
        "Shells and interpreters need --name",
        "Without --name the lease is named after COMMAND's file name. For sh, bash, dash, zsh, ksh, mksh, fish, busybox, env, python, python2, python3, python3.N (any minor version), perl, ruby, node, nodejs, php, lua, tclsh, java, sudo, nice, nohup, timeout and xargs, --name is required (64): every unnamed sh -c job on a host or fleet would otherwise share the one lease \"sh\", and wait for or skip each other.",
    ),
    (
        "A run by hand uses up a --once-per slot",
        "--once-per counts a run by hand like a scheduled one: run at 19:39 UTC, --once-per 1d takes the slot 2026-12-02T00:00:00Z, the nearest boundary, and the scheduled run at 02:30 that night finds it done and starts nothing. A run whose slot starts more than DUR/20 after it (72 minutes for 1d) says so in a warning: \"this run counts for slot KEY, which starts in 4h21m; a run by hand now uses up that slot (pass --once KEY to choose another)\". Before trying the job by hand, leasewrap status --once-per 1d NAME prints the KEY a run would use now and whether it is done; to try it without using up a slot, give it a KEY of its own (--once try-1) instead of --once-per.",
    ),
    (
        "-E 0 alone hides nothing",
        "-E 0 only silences the hosts that do not run the job. Without --no-wait or --once-per each host waits its turn and then runs the job too (with --wait, unless the wait runs out first): a nightly cron line on a fleet needs the fleet's etcd or ZooKeeper (--endpoints or --zookeeper, or LEASEWRAP_ENDPOINTS or LEASEWRAP_ZOOKEEPER) and -w 1h -E 0 --once-per 1d, so that the first host runs it and the others end with status 0. Without endpoints the local backend excludes only runs on the same host.",
    ),
];

/// How the name of every variable that clap reads begins (all are LEASEWRAP_*).
pub const ENV_PREFIX: &str = "LEASEWRAP";

/// The variables clap reads as fallbacks for arguments (`env = ...`), in every subcommand.
pub fn env_fallbacks() -> Vec<String> {
    fn walk(cmd: &clap::Command, found: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if let Some(name) = arg.get_env() {
                found.push(name.to_string_lossy().into_owned());
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, found);
        }
    }
    let mut found = Vec::new();
    walk(&<Cli as clap::CommandFactory>::command(), &mut found);
    found.sort();
    found.dedup();
    found
}

/// Parse a duration as people write it: `500ms`, `1.5s`, `2m`, `1h30m`, `1h 30m`, `7d`, `2days`
/// (humantime's units), or a bare number of seconds (`3`, `0.5`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.starts_with('-') {
        return Err(format!(
            "{s:?} is not a duration: it is negative (write it like 500ms, 10s, 1h30m, 7d)"
        ));
    }
    let bare_seconds = !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && s.bytes().filter(|&b| b == b'.').count() <= 1;
    if bare_seconds {
        return s
            .parse::<f64>()
            .ok()
            .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
            .ok_or_else(|| {
                format!("{s:?} is not a duration (write it like 500ms, 10s, 1h30m, 7d)")
            });
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration ({e}; write it like 500ms, 10s, 1h30m, 7d)"))
}

/// The shortest TTL leasewrap takes. etcd counts TTLs in whole seconds, and below a second the
/// renewal period, kill-after and margin (a third, a fifth and a tenth of it) shrink to less
/// than an ordinary host's scheduling delays.
pub const MIN_TTL: Duration = Duration::from_secs(1);

fn parse_ttl(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d < MIN_TTL => Err(format!(
            "{s:?} is shorter than the shortest lease TTL, {}s",
            MIN_TTL.as_secs()
        )),
        d => Ok(d),
    }
}

/// Parse a signal as `TERM`, `SIGTERM` or `15`.
pub fn parse_signal(s: &str) -> Result<Signal, String> {
    let bad = || format!("{s:?} is not a signal (write it like TERM, SIGINT or 9)");
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| bad());
    }
    let upper = s.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    full.parse().map_err(|_| bad())
}

fn parse_drift(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..1.0).contains(&f) => Ok(f),
        _ => Err(format!(
            "{s:?} is not a drift bound (a number from 0 to below 1, like 0.1)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_that_parsed_before_humantime_still_parse_the_same() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("500ms", ms(500)),
            ("10s", ms(10_000)),
            ("1.5s", ms(1500)),
            ("2m", ms(120_000)),
            ("1h", ms(3_600_000)),
            ("3", ms(3000)),
            ("0.5", ms(500)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            (" 10s ", ms(10_000)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn durations_take_days_and_combined_units() {
        let h = |n: u64| Duration::from_secs(n * 3600);
        assert_eq!(parse_duration("1d"), Ok(h(24)));
        assert_eq!(parse_duration("7d"), Ok(h(24 * 7)));
        assert_eq!(parse_duration("2days"), Ok(h(48)));
        assert_eq!(
            parse_duration("1h30m"),
            Ok(h(1) + Duration::from_secs(1800))
        );
        assert_eq!(
            parse_duration("1h 30m"),
            Ok(h(1) + Duration::from_secs(1800))
        );
    }

    #[test]
    fn nonsense_durations_are_refused() {
        for bad in ["", "abc", "10x", "-1s", "1e3s", "s", "1..5", ".", "1.5.5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_ttl("0s").is_err());
        assert!(parse_ttl("0.000000002s").is_err());
        assert!(parse_ttl("999ms").is_err());
        assert_eq!(parse_ttl("1s"), Ok(MIN_TTL));
    }

    #[test]
    fn signals_take_name_sig_name_or_number() {
        assert_eq!(parse_signal("TERM"), Ok(Signal::SIGTERM));
        assert_eq!(parse_signal("sigint"), Ok(Signal::SIGINT));
        assert_eq!(parse_signal("9"), Ok(Signal::SIGKILL));
        assert!(parse_signal("NOPE").is_err());
        assert!(parse_signal("99").is_err());
    }

    #[test]
    fn env_fallbacks_are_the_ones_clap_reads() {
        let names = env_fallbacks();
        for name in [
            "LEASEWRAP_TTL",
            "LEASEWRAP_LOCAL_DIR",
            "LEASEWRAP_LOG_FORMAT",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        for name in &names {
            assert!(
                name.starts_with(ENV_PREFIX),
                "{name} does not start with {ENV_PREFIX}"
            );
        }
    }

    #[test]
    fn the_caveats_name_every_command_that_needs_a_name() {
        let caveats: String = CAVEATS.iter().map(|(_, text)| *text).collect();
        for command in crate::config::NAME_REQUIRED {
            assert!(
                caveats.contains(&format!(" {command}")),
                "{command} is not in the man page's CAVEATS"
            );
        }
    }

    #[test]
    fn clap_definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
