//! A checked `Config` built from the command line and the environment. Parsing only: nothing here
//! takes a lock, connects or starts a process; the one thing read from disk is what the options
//! name (certificates, password file), so that a bad one fails before anything is acquired.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;

use crate::cli::{parse_duration, ConnArgs, RunArgs};
use crate::error::{Error, ExitCodes};
use crate::lease::timing::Params;
use crate::runs::{file, slot, Once};

pub mod database;

use database::DbConfig;

/// Everything a run needs, checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// Lease name, checked by [`check_name`].
    pub name: String,
    /// argv of the child; `-c` becomes `/bin/sh -c STRING`.
    pub command: Vec<OsString>,
    /// Timing options, already checked against the validation rule for the asked TTL.
    pub params: Params,
    /// How long to wait for a held lease.
    pub wait: Wait,
    /// Signal that starts a stop.
    pub signal: Signal,
    /// The user's choice of conflict and lost statuses.
    pub codes: ExitCodes,
    /// Which backend and how to reach it.
    pub backend: Backend,
    /// With --once or --once-per: KEY, how long its record is kept, the attempt limit.
    pub once: Option<Once>,
    /// --max-runtime: the child's tree is stopped after this long.
    pub max_runtime: Option<Duration>,
    /// --metrics-file, in a folder that was writable at startup.
    pub metrics_file: Option<PathBuf>,
}

/// How long to wait for a lease someone else holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    Forever,
    No,
    For(Duration),
}

/// The lease service.
#[derive(Debug, Clone)]
pub enum Backend {
    /// flock on this host; the directory holds lock and token files.
    Local {
        dir: PathBuf,
    },
    Etcd(EtcdConfig),
    /// ZooKeeper, reached with the same TLS and auth settings as etcd would be.
    Zk(ZkConfig),
    /// A lease row in PostgreSQL (`--database`).
    Db(DbConfig),
}

/// How to reach ZooKeeper.
#[derive(Debug, Clone)]
pub struct ZkConfig {
    /// The connect string as ZooKeeper tools spell it: `host:port,host:port[/chroot]`.
    pub connect: String,
    /// Its members, `host:port` each, tried in turn.
    pub members: Vec<String>,
    /// The chroot of the connect string (`/a/b`), or empty.
    pub chroot: String,
    /// --zk-auth sasl: the user and password are SASL DIGEST-MD5's, not the digest scheme's.
    pub sasl: bool,
    /// Where the lock parents `ROOT/NAME` and the records `ROOT/runs` are: `/` and the prefix
    /// without its trailing `/` (`/leasewrap` by default; empty with `--prefix ''`).
    pub root: String,
    /// TLS files, user and password, the bound on reaching it: as for etcd.
    pub conn: EtcdConfig,
}

impl ZkConfig {
    /// Whether the sessions authenticate as someone (a user, or a client certificate), who then
    /// owns what leasewrap creates.
    pub fn has_identity(&self) -> bool {
        self.conn.auth.is_some() || self.conn.identity.is_some()
    }
}

/// How to reach etcd.
#[derive(Clone, Default)]
pub struct EtcdConfig {
    /// URLs as given, each with a scheme.
    pub endpoints: Vec<String>,
    /// Key prefix; the lock keys are `PREFIX NAME/<lease id hex>`.
    pub prefix: String,
    /// PEM of the CA bundle, read at startup.
    pub ca: Option<Vec<u8>>,
    /// PEM of the client certificate and key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// User and password; the password is never logged nor passed to the child.
    pub auth: Option<(String, String)>,
    /// Bound on reaching etcd before giving up with 69.
    pub dial_timeout: Duration,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("tls", &self.ca.is_some())
            .field("user", &self.auth.as_ref().map(|(u, _)| u))
            .finish_non_exhaustive()
    }
}

/// A way to read environment variables, so tests need not touch the process environment.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment.
pub fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// First variable of `keys` that is set and not empty. (Only LEASEWRAP_PREFIX, read directly, is
/// meaningful when empty: `--prefix ''` passes on to a child's nested leasewrap.)
fn first(env: Env, keys: &[&str]) -> Option<String> {
    first_named(env, keys).map(|(_, v)| v)
}

/// [`first`], with the variable's name, which messages about its value give.
fn first_named<'k>(env: Env, keys: &[&'k str]) -> Option<(&'k str, String)> {
    keys.iter()
        .find_map(|k| env(k).filter(|v| !v.is_empty()).map(|v| (*k, v)))
}

/// A file an option names: from its `flag`, else from the first of `keys` that is set, with
/// the name of the one it came from (`--cacert`, `ETCDCTL_CACERT`) for messages.
fn file_option<'k>(
    given: &Option<PathBuf>,
    flag: &'k str,
    env: Env,
    keys: &[&'k str],
) -> Option<(&'k str, PathBuf)> {
    match given {
        Some(path) => Some((flag, path.clone())),
        None => first_named(env, keys).map(|(key, path)| (key, PathBuf::from(path))),
    }
}

impl Config {
    /// Check the run options.
    pub fn from_args(args: &RunArgs, env: Env) -> Result<Config, Error> {
        let command = child_argv(args)?;
        let name = match &args.name {
            Some(n) => {
                check_name(n)?;
                n.clone()
            }
            None => default_name(&command[0])?,
        };
        let params = Params {
            ttl: args.ttl,
            kill_after: args.kill_after,
            margin: args.margin,
            drift: args.drift,
        };
        let effective = params
            .effective(args.ttl)
            .map_err(|e| Error::Usage(e.to_string()))?;
        let wait = match (args.no_wait, args.wait) {
            (true, _) | (false, Some(Duration::ZERO)) => Wait::No,
            (false, Some(d)) => Wait::For(d),
            (false, None) => Wait::Forever,
        };
        let now = SystemTime::now();
        let cfg = Config {
            name,
            command,
            params,
            wait,
            signal: args.signal,
            codes: ExitCodes {
                conflict: args.conflict_exit_code,
                lost: args.lost_exit_code,
            },
            backend: backend(&args.conn, args.local_dir.as_deref(), env)?,
            once: once(args, now)?,
            max_runtime: max_runtime(args.max_runtime, effective.kill_after)?,
            metrics_file: metrics_file(args.metrics_file.as_deref())?,
        };
        warn_if_ahead_of_its_slot(args, now);
        Ok(cfg)
    }
}

/// A --once-per run whose slot starts well after it is likely a run by hand that uses up
/// tonight's slot: say so, once every option is known to be good.
fn warn_if_ahead_of_its_slot(args: &RunArgs, now: SystemTime) {
    let Some(per) = args.once_per.filter(|_| args.once.is_none()) else {
        return;
    };
    if let Some(ahead) = slot::ahead(now, per) {
        tracing::warn!(
            "this run counts for slot {}, which starts in {}; a run by hand now uses up that slot (pass --once KEY to choose another)",
            slot::slot_key(now, per),
            slot::starts_in(ahead)
        );
    }
}

/// --once KEY, or the --once-per slot of `now`, with --keep and --max-attempts.
fn once(args: &RunArgs, now: SystemTime) -> Result<Option<Once>, Error> {
    let key = match (&args.once, args.once_per) {
        (Some(key), _) => {
            check_key(key)?;
            key.clone()
        }
        (None, Some(per)) => {
            slot::check_period(per).map_err(Error::Usage)?;
            slot::slot_key(now, per)
        }
        (None, None) if args.max_attempts.is_some() => {
            return Err(Error::Usage(
                "--max-attempts counts the runs of a KEY: give --once KEY or --once-per DUR".into(),
            ))
        }
        (None, None) if args.keep.is_some() => {
            return Err(Error::Usage(
                "--keep says how long a KEY's run record is kept: give --once KEY or --once-per DUR, or leave --keep out".into(),
            ))
        }
        (None, None) => return Ok(None),
    };
    let keep = crate::runs::keep_of(args.keep, args.once_per).map_err(Error::Usage)?;
    Ok(Some(Once {
        key,
        keep,
        max_attempts: args.max_attempts,
    }))
}

/// --max-runtime must leave the child its --kill-after to stop in.
fn max_runtime(limit: Option<Duration>, kill_after: Duration) -> Result<Option<Duration>, Error> {
    match limit {
        Some(d) if d.is_zero() => Err(Error::Usage("--max-runtime must be more than zero".into())),
        Some(d) if d <= kill_after => Err(Error::Usage(format!(
            "--max-runtime {d:?} is too short: it must be longer than --kill-after ({kill_after:?}), the time the child is given to stop"
        ))),
        other => Ok(other),
    }
}

/// --metrics-file must name a file in a folder where one can be made now (64), and where no
/// other user planted it or can replace it (78).
fn metrics_file(path: Option<&Path>) -> Result<Option<PathBuf>, Error> {
    let Some(path) = path else { return Ok(None) };
    let bad = |why: String| Error::Usage(format!("--metrics-file {}: {why}", path.display()));
    let names_a_file =
        path.file_name().is_some() && !path.as_os_str().as_encoded_bytes().ends_with(b"/");
    if !names_a_file {
        return Err(bad(
            "does not name a file (give one like /var/lib/node_exporter/textfile/job.prom)".into(),
        ));
    }
    let dir = crate::files::parent(path);
    file::check_writable(path)
        .map_err(|e| bad(format!("cannot write in {}: {e}", dir.display())))?;
    crate::runs::metrics::check_place(path)?;
    Ok(Some(path.to_owned()))
}

fn child_argv(args: &RunArgs) -> Result<Vec<OsString>, Error> {
    if let Some(script) = &args.shell {
        if args.name.is_none() {
            return Err(Error::Usage(
                "-c needs --name: a shell string has no file name to use".into(),
            ));
        }
        return Ok(vec!["/bin/sh".into(), "-c".into(), script.into()]);
    }
    if args.command.is_empty() {
        return Err(Error::Usage(
            "no COMMAND given: write it after --, as in `leasewrap --name job -- ./job.sh`".into(),
        ));
    }
    Ok(args.command.clone())
}

/// The lease name of a run without --name: COMMAND's file name, unless many unrelated jobs share
/// that name (a shell, an interpreter, a command that runs another).
fn default_name(program: &OsString) -> Result<String, Error> {
    let name = Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| {
            Error::Usage(format!(
                "cannot make a lease name from {program:?}: give --name"
            ))
        })?;
    if needs_a_name(name) {
        return Err(Error::Usage(format!(
            "--name is required when COMMAND is {name}: every unnamed {name} job on this host or fleet would share the lease \"{name}\""
        )));
    }
    check_name_given_as(name, "the lease name taken from COMMAND (give --name)")?;
    Ok(name.to_owned())
}

/// The commands whose file name is no lease name: shells, interpreters and commands that run
/// another, which every unnamed job of theirs would share. `python3.N` stands for any minor version.
pub const NAME_REQUIRED: &[&str] = &[
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "mksh",
    "fish",
    "busybox",
    "env",
    "python",
    "python2",
    "python3",
    "python3.N",
    "perl",
    "ruby",
    "node",
    "nodejs",
    "php",
    "lua",
    "tclsh",
    "java",
    "sudo",
    "nice",
    "nohup",
    "timeout",
    "xargs",
];

/// Whether a COMMAND of this file name needs --name.
fn needs_a_name(file_name: &str) -> bool {
    let minor = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
    NAME_REQUIRED.contains(&file_name) || file_name.strip_prefix("python3.").is_some_and(minor)
}

/// A lease name is 1-128 bytes of ASCII letters, digits and `._-@:+=`, and not `.` or `..`:
/// nothing that prints like another name or not at all (no Unicode, no spaces, no controls), and
/// nothing a path, a key prefix or a shell treats specially.
pub fn check_name(name: &str) -> Result<(), Error> {
    check_name_given_as(name, "--name")
}

/// [`check_name`], with the refusal naming the name as the user gave it (`--name`, `NAME`).
pub fn check_name_given_as(name: &str, given_as: &str) -> Result<(), Error> {
    name_rule(name, "a lease name")
        .map_err(|why| Error::Usage(format!("{given_as} {name:?}: {why}")))
}

/// A --once KEY follows the rule of lease names (so an RFC 3339 key of --once-per, as
/// `2026-12-01T02:00:00.500Z`, is one): nothing invisible, bidirectional or control in a log
/// line, a `status` row or a record's file name.
pub fn check_key(key: &str) -> Result<(), Error> {
    name_rule(key, "a KEY").map_err(|why| Error::Usage(format!("bad --once KEY {key:?}: {why}")))
}

/// Why `text` is not a lease name or KEY (`what`), if it is not.
fn name_rule(text: &str, what: &str) -> Result<(), String> {
    if text.is_empty() || text.len() > 128 {
        return Err(format!("{what} is 1 to 128 bytes long"));
    }
    if let Some(c) = text.chars().find(|&c| !is_name_char(c)) {
        return Err(format!(
            "{c:?} is not allowed: {what} holds only ASCII letters, digits and . _ - @ : + ="
        ));
    }
    if text == "." || text == ".." {
        return Err(format!("{what} is not . or .."));
    }
    Ok(())
}

/// The characters of a lease name.
const fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | ':' | '+' | '=')
}

/// The backend: ZooKeeper or etcd when configured anywhere, the local one otherwise.
pub fn backend(conn: &ConnArgs, local_dir: Option<&Path>, env: Env) -> Result<Backend, Error> {
    if let Some(url) = database(conn, env)? {
        return db(&url, conn, env).map(Backend::Db);
    }
    if let Some(connect) = zookeeper(conn, env)? {
        return zk_config(&connect, conn, env).map(Backend::Zk);
    }
    if conn.zk_auth.is_some() {
        return Err(Error::Usage(
            "--zk-auth is for ZooKeeper (--zookeeper); etcd and the local backend have one way to authenticate".into(),
        ));
    }
    let endpoints = conn
        .endpoints
        .clone()
        .or_else(|| first(env, &["LEASEWRAP_ENDPOINTS", "ETCDCTL_ENDPOINTS"]));
    match endpoints {
        Some(urls) if !urls.trim().is_empty() => Ok(Backend::Etcd(etcd_config(&urls, conn, env)?)),
        _ => {
            // Options given on the command line are checked even when unused, so a typo is
            // seen now rather than on the day endpoints are configured.
            let no_env = |_: &str| None;
            etcd_config("127.0.0.1:2379", conn, &no_env)?;
            local(local_dir, env)
        }
    }
}

/// The ZooKeeper connect string, if one is configured: --zookeeper, or LEASEWRAP_ZOOKEEPER when
/// no --endpoints is given. Both options on the command line is a usage error, and so is
/// LEASEWRAP_ZOOKEEPER beside LEASEWRAP_ENDPOINTS.
fn zookeeper(conn: &ConnArgs, env: Env) -> Result<Option<String>, Error> {
    let set = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.trim().is_empty());
    let both = |what: &str| {
        Error::Usage(format!(
            "{what}: one lease service at a time, etcd or ZooKeeper"
        ))
    };
    if set(&conn.zookeeper) && set(&conn.endpoints) {
        return Err(both("--zookeeper and --endpoints exclude each other"));
    }
    if set(&conn.zookeeper) {
        return Ok(conn.zookeeper.clone());
    }
    let from_env = env("LEASEWRAP_ZOOKEEPER").filter(|v| !v.trim().is_empty());
    if from_env.is_some() && set(&conn.endpoints) {
        return Ok(None);
    }
    if from_env.is_some() && set(&env("LEASEWRAP_ENDPOINTS")) {
        return Err(both(
            "LEASEWRAP_ZOOKEEPER and LEASEWRAP_ENDPOINTS are both set",
        ));
    }
    Ok(from_env)
}

/// The database URL, if one is configured: --database, or LEASEWRAP_DATABASE when no other
/// service is given on the command line. With another service on the command line it is a usage
/// error.
fn database(conn: &ConnArgs, env: Env) -> Result<Option<String>, Error> {
    let set = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.trim().is_empty());
    let other = set(&conn.endpoints) || set(&conn.zookeeper);
    if set(&conn.database) && other {
        return Err(Error::Usage(
            "--database excludes --endpoints and --zookeeper: one lease service at a time".into(),
        ));
    }
    if set(&conn.database) {
        return Ok(conn.database.clone());
    }
    Ok(env("LEASEWRAP_DATABASE").filter(|v| !v.trim().is_empty() && !other))
}

/// The checked `--database` URL, and what it needs of the other options: the CA file, the
/// password file, the dial timeout. The etcd and ZooKeeper options that cannot apply are refused.
fn db(url: &str, conn: &ConnArgs, env: Env) -> Result<DbConfig, Error> {
    let unused = [
        (
            conn.cert.is_some() || conn.key.is_some(),
            "--cert and --key",
        ),
        (conn.user.is_some(), "--user (the URL names the user)"),
        (conn.zk_auth.is_some(), "--zk-auth"),
        (conn.prefix.is_some(), "--prefix"),
    ];
    if let Some((_, what)) = unused.iter().find(|(given, _)| *given) {
        return Err(Error::Usage(format!("{what} cannot apply to --database")));
    }
    let keys = ["LEASEWRAP_PASSWORD_FILE"];
    let password_file = file_option(&conn.password_file, "--password-file", env, &keys);
    let given = database::Given {
        cacert: conn.cacert.as_deref(),
        password_file,
        dial_timeout: dial_timeout(conn, env)?,
    };
    database::db_config(url.trim(), &given, env)
}

/// A checked connect string `host:port,host:port[/chroot]` and the etcd-style settings.
fn zk_config(connect: &str, conn: &ConnArgs, env: Env) -> Result<ZkConfig, Error> {
    let bad = |why: &str| {
        Error::Usage(format!(
            "bad --zookeeper {connect:?}: {why}; write it like zk1:2181,zk2:2181/chroot"
        ))
    };
    let connect = connect.trim();
    let (hosts, chroot) = match connect.find('/') {
        Some(i) => connect.split_at(i),
        None => (connect, ""),
    };
    if chroot == "/" || (!chroot.is_empty() && !zk_path_ok(chroot)) {
        return Err(bad(
            "the chroot is a path like /apps/jobs: no empty, . or .. segment, no trailing /",
        ));
    }
    let members = hosts
        .split(',')
        .map(|h| check_member(h.trim()).ok_or_else(|| bad(&format!("{h:?} is not host:port"))))
        .collect::<Result<Vec<_>, _>>()?;
    let sasl = zk_auth(conn, env)? == "sasl";
    let conn = etcd_config("127.0.0.1:2379", conn, env)?;
    if conn.identity.is_some() && conn.ca.is_none() {
        return Err(Error::Usage(
            "--cert and --key with --zookeeper need --cacert, the CA that signed the members' certificates (TLS to ZooKeeper is on its secure client port)".into(),
        ));
    }
    if sasl && conn.auth.is_none() {
        return Err(Error::Usage(
            "--zk-auth sasl authenticates --user with its password: give --user and --password-file".into(),
        ));
    }
    let root = zk_root(&conn.prefix).ok_or_else(|| {
        Error::Usage(format!(
            "--prefix {:?} is not a ZooKeeper path: write it like leasewrap/ or apps/leasewrap/",
            conn.prefix
        ))
    })?;
    Ok(ZkConfig {
        connect: format!("{}{chroot}", members.join(",")),
        members,
        chroot: chroot.to_owned(),
        sasl,
        root,
        conn,
    })
}

/// The node path of a key prefix: `leasewrap/` is `/leasewrap`; none when a segment is empty,
/// `.` or `..`, or holds a control character.
fn zk_root(prefix: &str) -> Option<String> {
    let path = prefix.trim_start_matches('/');
    let path = path.strip_suffix('/').unwrap_or(path);
    if path.is_empty() {
        return Some(String::new());
    }
    let bad = |s: &str| s.is_empty() || s == "." || s == ".." || s.chars().any(char::is_control);
    (!path.split('/').any(bad)).then(|| format!("/{path}"))
}

/// --zk-auth, or LEASEWRAP_ZK_AUTH: `digest` (the default) or `sasl`.
fn zk_auth(conn: &ConnArgs, env: Env) -> Result<String, Error> {
    let given = conn
        .zk_auth
        .clone()
        .or_else(|| first(env, &["LEASEWRAP_ZK_AUTH"]));
    match given.as_deref() {
        None | Some("digest") => Ok("digest".into()),
        Some("sasl") => Ok("sasl".into()),
        Some(other) => Err(Error::Usage(format!(
            "LEASEWRAP_ZK_AUTH: {other:?} is not digest or sasl"
        ))),
    }
}

/// A ZooKeeper path as ZooKeeper takes it (`PathUtils.validatePath`): absolute, no trailing
/// `/`, no empty, `.` or `..` segment, none of the characters it refuses.
pub fn zk_path_ok(path: &str) -> bool {
    let refused = |c: char| matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{f000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}');
    let segment_ok = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.chars().any(refused);
    path == "/" || (path.starts_with('/') && path[1..].split('/').all(segment_ok))
}

/// `host:port` of one member, as given.
fn check_member(member: &str) -> Option<String> {
    let (host, port) = member.rsplit_once(':')?;
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-.[]:_".contains(c));
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    (host_ok && port_ok).then(|| member.to_owned())
}

fn local(local_dir: Option<&Path>, env: Env) -> Result<Backend, Error> {
    let dir = match local_dir {
        Some(d) => d.to_owned(),
        None => default_local_dir(env)?,
    };
    Ok(Backend::Local { dir })
}

fn default_local_dir(env: Env) -> Result<PathBuf, Error> {
    if nix::unistd::geteuid().is_root() {
        return Ok("/var/lib/leasewrap".into());
    }
    if let Some(state) = first(env, &["XDG_STATE_HOME"]) {
        return Ok(Path::new(&state).join("leasewrap"));
    }
    match first(env, &["HOME"]) {
        Some(home) => Ok(Path::new(&home).join(".local/state/leasewrap")),
        None => Err(Error::Usage(
            "no --local-dir, and neither XDG_STATE_HOME nor HOME is set".into(),
        )),
    }
}

fn etcd_config(urls: &str, conn: &ConnArgs, env: Env) -> Result<EtcdConfig, Error> {
    let prefix = conn
        .prefix
        .clone()
        .or_else(|| env("LEASEWRAP_PREFIX"))
        .unwrap_or_else(|| "leasewrap/".into());
    let dial_timeout = dial_timeout(conn, env)?;
    let (ca, identity) = tls_files(conn, env)?;
    let tls = ca.is_some() || identity.is_some();
    let endpoints = urls
        .split(',')
        .map(|u| check_endpoint(u.trim(), tls))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(EtcdConfig {
        endpoints,
        prefix,
        ca,
        identity,
        auth: auth(conn, env)?,
        dial_timeout,
    })
}

fn dial_timeout(conn: &ConnArgs, env: Env) -> Result<Duration, Error> {
    let keys = ["LEASEWRAP_DIAL_TIMEOUT", "ETCDCTL_DIAL_TIMEOUT"];
    let given = conn.dial_timeout.clone().map(|d| ("--dial-timeout", d));
    let dial = given.or_else(|| first_named(env, &keys));
    match dial {
        Some((from, d)) => match parse_duration(&d) {
            Ok(d) if !d.is_zero() => Ok(d),
            Ok(_) => Err(Error::Usage(format!("{from} must be more than zero"))),
            Err(e) => Err(Error::Usage(format!("{from}: {e}"))),
        },
        None => Ok(Duration::from_secs(2)),
    }
}

/// PEM of a client certificate and its key.
type Identity = (Vec<u8>, Vec<u8>);

/// The CA bundle and the client certificate and key, read now.
fn tls_files(conn: &ConnArgs, env: Env) -> Result<(Option<Vec<u8>>, Option<Identity>), Error> {
    let path = |given, flag, keys| file_option(given, flag, env, keys);
    let read = |(from, p): (&str, PathBuf)| read_config_file(&p, from);
    let ca = path(
        &conn.cacert,
        "--cacert",
        &["LEASEWRAP_CACERT", "ETCDCTL_CACERT"],
    )
    .map(read)
    .transpose()?;
    let cert = path(&conn.cert, "--cert", &["LEASEWRAP_CERT", "ETCDCTL_CERT"]);
    let key = path(&conn.key, "--key", &["LEASEWRAP_KEY_FILE", "ETCDCTL_KEY"]);
    let identity = match (cert, key) {
        (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
        (None, None) => None,
        _ => {
            return Err(Error::Usage(
                "--cert and --key go together: give both or neither".into(),
            ))
        }
    };
    Ok((ca, identity))
}

/// `http://host:port`, `https://host:port`, or `host:port` (https when TLS files are given, else
/// http). TLS files with an explicit http:// endpoint are a contradiction, not a silent upgrade.
fn check_endpoint(url: &str, tls: bool) -> Result<String, Error> {
    let bad = || {
        Error::Usage(format!(
            "bad endpoint {url:?}: write it like http://10.0.0.5:2379 or https://etcd.example:2379"
        ))
    };
    let (scheme, rest) = match url.split_once("://") {
        Some((s @ ("http" | "https"), rest)) => (s, rest),
        Some(_) => return Err(bad()),
        None if tls => ("https", url),
        None => ("http", url),
    };
    if tls && scheme == "http" {
        return Err(Error::Usage(format!(
            "endpoint {url:?} is plain http but TLS files are given: write https://"
        )));
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-.[]:_".contains(c));
    if !host_ok || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    Ok(format!("{scheme}://{rest}"))
}

/// The variables that may hold `USER` or `USER:PASSWORD`, first found first used.
pub const USER_VARS: [&str; 2] = ["LEASEWRAP_USER", "ETCDCTL_USER"];

/// The variables that may hold the password itself.
pub const PASSWORD_VARS: [&str; 2] = ["LEASEWRAP_PASSWORD", "ETCDCTL_PASSWORD"];

/// The user of a `USER:PASSWORD` value: the bytes before the first ':', whatever the encoding.
pub fn user_part(value: &OsStr) -> &OsStr {
    let bytes = value.as_bytes();
    let end = bytes.iter().position(|b| *b == b':').unwrap_or(bytes.len());
    OsStr::from_bytes(&bytes[..end])
}

fn auth(conn: &ConnArgs, env: Env) -> Result<Option<(String, String)>, Error> {
    let from_file = password_file(conn, env)?;
    if conn.user.as_deref().is_some_and(|u| u.contains(':')) {
        // Once: the options are checked once per process.
        tracing::warn!(
            "--user NAME:PASSWORD puts the password in /proc/PID/cmdline, which every user of \
             this host can read: give it with --password-file instead",
        );
    }
    let Some(user) = conn.user.clone().or_else(|| first(env, &USER_VARS)) else {
        return Ok(None);
    };
    let (user, inline) = match user.split_once(':') {
        Some((u, p)) => (u.to_owned(), Some(p.to_owned())),
        None => (user, None),
    };
    let password = from_file
        .or(inline)
        .or_else(|| first(env, &PASSWORD_VARS))
        .ok_or_else(|| {
            Error::Usage(format!(
                "user {user:?} has no password: give --password-file or set LEASEWRAP_PASSWORD"
            ))
        })?;
    Ok(Some((user, password)))
}

/// The first line of the password file, if one is named; a warning when others may read it.
fn password_file(conn: &ConnArgs, env: Env) -> Result<Option<String>, Error> {
    let keys = ["LEASEWRAP_PASSWORD_FILE"];
    let Some((from, path)) = file_option(&conn.password_file, "--password-file", env, &keys) else {
        return Ok(None);
    };
    let (text, mode) = read_config_file_mode(&path, from)?;
    if mode & 0o077 != 0 {
        tracing::warn!(
            "{from} {}: group or others may read it (mode {:o}): chmod go= it",
            path.display(),
            mode & 0o7777
        );
    }
    let text = String::from_utf8_lossy(&text);
    Ok(Some(text.lines().next().unwrap_or("").to_owned()))
}

fn read_config_file(path: &Path, flag: &str) -> Result<Vec<u8>, Error> {
    read_config_file_mode(path, flag).map(|(bytes, _)| bytes)
}

/// The contents of a file an option names, and its permission bits (of the file read, not of
/// whatever the path names a moment later).
fn read_config_file_mode(path: &Path, flag: &str) -> Result<(Vec<u8>, u32), Error> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let bad = |e: std::io::Error| Error::Config(format!("{flag} {}: {e}", path.display()));
    let mut file = std::fs::File::open(path).map_err(bad)?;
    let mode = file.metadata().map_err(bad)?.mode();
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(bad)?;
    Ok((bytes, mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<Config, Error> {
        let cli = crate::cli::Cli::try_parse_from(
            std::iter::once("leasewrap").chain(args.iter().copied()),
        )
        .map_err(|e| Error::Usage(e.to_string()))?;
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = move |k: &str| env.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        Config::from_args(&cli.run, &lookup)
    }

    #[test]
    fn name_defaults_to_the_commands_file_name() {
        let c = parse(
            &[
                "--local-dir",
                "/tmp/x",
                "--",
                "/usr/bin/nightly-report",
                "a",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.name, "nightly-report");
    }

    #[test]
    fn shells_and_interpreters_need_a_name_and_other_commands_do_not() {
        for command in [
            "sh",
            "/bin/bash",
            "env",
            "python3",
            "python3.11",
            "/usr/bin/xargs",
        ] {
            let Err(Error::Usage(msg)) = parse(&["--local-dir", "/tmp", "--", command, "x"], &[])
            else {
                panic!("{command} accepted without --name")
            };
            let name = Path::new(command).file_name().unwrap().to_str().unwrap();
            assert_eq!(
                msg,
                format!("--name is required when COMMAND is {name}: every unnamed {name} job on this host or fleet would share the lease \"{name}\"")
            );
        }
        for command in [
            "shred",
            "python3.x",
            "python4",
            "./run.sh",
            "/usr/bin/envoy",
        ] {
            let c = parse(&["--local-dir", "/tmp", "--", command], &[]).unwrap();
            assert_eq!(
                c.name,
                Path::new(command).file_name().unwrap().to_str().unwrap()
            );
        }
        let c = parse(
            &["--local-dir", "/tmp", "--name", "j", "--", "sh", "-c", "x"],
            &[],
        );
        assert_eq!(c.unwrap().name, "j");
    }

    #[test]
    fn a_default_name_that_is_no_lease_name_asks_for_name() {
        let Err(Error::Usage(msg)) = parse(&["--local-dir", "/tmp", "--", "./a b"], &[]) else {
            panic!("accepted")
        };
        assert!(
            msg.starts_with("the lease name taken from COMMAND (give --name) \"a b\""),
            "{msg}"
        );
    }

    #[test]
    fn shell_form_needs_a_name() {
        assert!(matches!(parse(&["-c", "true"], &[]), Err(Error::Usage(_))));
        let c = parse(
            &["--name", "j", "--local-dir", "/tmp", "-c", "echo hi"],
            &[],
        )
        .unwrap();
        assert_eq!(
            c.command,
            vec![OsString::from("/bin/sh"), "-c".into(), "echo hi".into()]
        );
    }

    #[test]
    fn zookeeper_paths_follow_zookeepers_rule() {
        for good in ["/", "/a", "/a/b.c", "/leasewrap/job-1"] {
            assert!(zk_path_ok(good), "{good}");
        }
        for bad in [
            "a",
            "/a/",
            "//a",
            "/a//b",
            "/a/./b",
            "/a/../b",
            "/a\u{1}b",
            "/a\u{ffff}",
        ] {
            assert!(!zk_path_ok(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_database_url_excludes_the_other_services_and_options_that_cannot_apply() {
        let usage = |args: &[&str], env: &[(&str, &str)]| match parse(args, env) {
            Err(Error::Usage(why)) => why,
            other => panic!("{args:?}: {other:?}"),
        };
        let url = "postgresql://job@db/app";
        let db = parse(&["--database", url, "--", "true"], &[]).unwrap();
        assert!(matches!(db.backend, Backend::Db(ref d) if d.user == "job"));
        let from_env = parse(&["--", "true"], &[("LEASEWRAP_DATABASE", url)]).unwrap();
        assert!(matches!(from_env.backend, Backend::Db(_)));
        let etcd = parse(
            &["--endpoints", "e:1", "--", "true"],
            &[("LEASEWRAP_DATABASE", url)],
        );
        assert!(matches!(etcd.unwrap().backend, Backend::Etcd(_)));
        let both = usage(
            &["--database", url, "--endpoints", "e:1", "--", "true"],
            &[],
        );
        assert!(both.contains("one lease service"), "{both}");
        assert!(
            usage(&["--database", url, "--prefix", "p/", "--", "true"], &[]).contains("--prefix")
        );
        let once = parse(&["--database", url, "--once", "k", "--", "true"], &[]).unwrap();
        assert_eq!(once.once.map(|o| o.key), Some("k".to_owned()));
    }

    #[test]
    fn zookeeper_connect_strings_are_checked_and_exclude_endpoints() {
        let zk = |args: &[&str], env: &[(&str, &str)]| match parse(args, env)?.backend {
            Backend::Zk(z) => Ok(z),
            other => Err(Error::Internal(format!("{other:?}"))),
        };
        let z = zk(&["--zookeeper", "a:2181, b:2182/jobs", "--", "true"], &[]).unwrap();
        assert_eq!(z.connect, "a:2181,b:2182/jobs");
        assert_eq!(z.members, ["a:2181", "b:2182"]);
        assert_eq!(z.root, "/leasewrap");
        let root = |p: &str| zk(&["--zookeeper", "a:1", "--prefix", p, "--", "true"], &[]);
        assert_eq!(root("").unwrap().root, "");
        assert_eq!(root("apps/lw/").unwrap().root, "/apps/lw");
        assert!(matches!(root("a//b"), Err(Error::Usage(_))));
        let z = zk(
            &["--", "true"],
            &[("LEASEWRAP_ZOOKEEPER", "c:1"), ("ETCDCTL_ENDPOINTS", "e:1")],
        );
        assert_eq!(z.unwrap().connect, "c:1");
        let etcd = parse(
            &["--endpoints", "e:1", "--", "true"],
            &[("LEASEWRAP_ZOOKEEPER", "c:1")],
        );
        assert!(matches!(etcd.unwrap().backend, Backend::Etcd(_)));
        let usage = |args: &[&str], env: &[(&str, &str)]| match parse(args, env) {
            Err(Error::Usage(why)) => why,
            other => panic!("{args:?}: {other:?}"),
        };
        let both = usage(
            &["--zookeeper", "a:1", "--endpoints", "e:1", "--", "true"],
            &[],
        );
        assert!(both.contains("exclude each other"), "{both}");
        let both = usage(
            &["--", "true"],
            &[
                ("LEASEWRAP_ZOOKEEPER", "a:1"),
                ("LEASEWRAP_ENDPOINTS", "e:1"),
            ],
        );
        assert!(both.contains("both set"), "{both}");
        for bad in ["a", "a:0", "a:1/", "a:1/x/", ":1", "a:1,,b:2"] {
            let why = usage(&["--zookeeper", bad, "--", "true"], &[]);
            assert!(why.contains("bad --zookeeper"), "{bad}: {why}");
        }
    }

    #[test]
    fn endpoints_fall_back_from_leasewrap_to_etcdctl_variables() {
        let c = parse(&["--", "true"], &[("ETCDCTL_ENDPOINTS", "10.0.0.5:2379")]).unwrap();
        let Backend::Etcd(e) = c.backend else {
            panic!("etcd")
        };
        assert_eq!(e.endpoints, vec!["http://10.0.0.5:2379"]);
        let c = parse(
            &["--", "true"],
            &[
                ("ETCDCTL_ENDPOINTS", "http://a:1"),
                ("LEASEWRAP_ENDPOINTS", "https://b:2,c:3"),
            ],
        )
        .unwrap();
        let Backend::Etcd(e) = c.backend else {
            panic!("etcd")
        };
        assert_eq!(e.endpoints, vec!["https://b:2", "http://c:3"]);
        assert_eq!(e.prefix, "leasewrap/");
    }

    #[test]
    fn bad_endpoints_are_usage_errors() {
        for bad in ["not a url", "ftp://a:1", "host", "http://a:0", "http://:5"] {
            assert!(
                matches!(
                    parse(&["--endpoints", bad, "--", "true"], &[]),
                    Err(Error::Usage(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn password_comes_from_user_colon_password_or_the_environment() {
        let c = parse(
            &["--endpoints", "a:1", "--user", "root:pw", "--", "true"],
            &[],
        )
        .unwrap();
        let Backend::Etcd(e) = c.backend else {
            panic!("etcd")
        };
        assert_eq!(e.auth, Some(("root".into(), "pw".into())));
        let c = parse(
            &["--endpoints", "a:1", "--user", "u", "--", "true"],
            &[("ETCDCTL_PASSWORD", "x")],
        )
        .unwrap();
        let Backend::Etcd(e) = c.backend else {
            panic!("etcd")
        };
        assert_eq!(e.auth, Some(("u".into(), "x".into())));
    }

    #[test]
    fn tls_files_make_bare_endpoints_https_and_refuse_plain_http() {
        let ca =
            std::env::temp_dir().join(format!("leasewrap-config-test-ca-{}", std::process::id()));
        std::fs::write(&ca, "pem").unwrap();
        let ca = ca.to_str().unwrap();
        let c = parse(&["--endpoints", "a:1", "--cacert", ca, "--", "true"], &[]).unwrap();
        let Backend::Etcd(e) = c.backend else {
            panic!("etcd")
        };
        assert_eq!(e.endpoints, vec!["https://a:1"]);
        let r = parse(
            &["--endpoints", "http://a:1", "--cacert", ca, "--", "true"],
            &[],
        );
        assert!(matches!(r, Err(Error::Usage(_))));
    }

    #[test]
    fn an_empty_prefix_from_the_environment_is_kept() {
        let c = parse(
            &["--endpoints", "a:1", "--", "true"],
            &[("LEASEWRAP_PREFIX", "")],
        )
        .unwrap();
        let Backend::Etcd(e) = c.backend else {
            panic!("etcd")
        };
        assert_eq!(e.prefix, "");
        let c = parse(
            &["--endpoints", "a:1", "--", "true"],
            &[("ETCDCTL_DIAL_TIMEOUT", "")],
        )
        .unwrap();
        let Backend::Etcd(e) = c.backend else {
            panic!("etcd")
        };
        assert_eq!(e.dial_timeout, Duration::from_secs(2));
    }

    #[test]
    fn unreadable_files_are_configuration_errors() {
        let r = parse(
            &[
                "--endpoints",
                "a:1",
                "--cacert",
                "/nonexistent",
                "--",
                "true",
            ],
            &[],
        );
        assert!(matches!(r, Err(Error::Config(_))));
    }

    #[test]
    fn wait_zero_means_no_wait() {
        let c = parse(&["--local-dir", "/tmp", "-w", "0", "--", "true"], &[]).unwrap();
        assert_eq!(c.wait, Wait::No);
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("nightly-report").is_ok());
        assert!(check_name("nightly.report_v2-eu@host:1+x=y").is_ok());
        let bad = [
            "",
            "a/b",
            "a b",
            "..",
            &"x".repeat(129),
            "tab\t",
            "job\u{200b}",
            "jo\u{202e}b",
        ];
        for bad in bad
            .into_iter()
            .chain(["\u{3164}", "jöb", "a*b", "a'b", "a\\b"])
        {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn keys_follow_the_rule_of_names_and_slot_keys_pass() {
        for good in [
            "2026-12-01T02:00:00Z",
            "2026-12-01T02:00:00.500Z",
            "nightly_1",
            "x",
        ] {
            assert!(check_key(good).is_ok(), "{good:?}");
        }
        let long = "k".repeat(129);
        let bad = [
            "",
            "a/b",
            "nightly 1",
            "tab\there",
            "nl\n",
            ".",
            "..",
            &long,
        ];
        for bad in bad
            .into_iter()
            .chain(["k\u{200b}", "k\u{202e}", "k\u{2066}", "jöb"])
        {
            let err = check_key(bad).unwrap_err().to_string();
            assert!(err.starts_with("bad --once KEY"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn timing_that_does_not_fit_spells_out_the_numbers() {
        let Err(Error::Usage(msg)) =
            parse(&["--ttl", "2s", "--kill-after", "2s", "--", "true"], &[])
        else {
            panic!("accepted")
        };
        assert!(msg.contains("TTL/3 (0.667s)"), "{msg}");
    }

    #[test]
    fn once_per_gives_a_slot_key_and_keep_defaults_to_seven_days() {
        let c = parse(
            &["--local-dir", "/tmp", "--once-per", "1h", "--", "true"],
            &[],
        )
        .unwrap();
        let once = c.once.unwrap();
        assert!(once.key.ends_with(":00:00Z"), "{}", once.key);
        assert_eq!(once.keep, crate::runs::DEFAULT_KEEP);
        assert_eq!(once.max_attempts, None);
        let c = parse(
            &[
                "--local-dir",
                "/tmp",
                "--max-runtime",
                "1h30m",
                "--",
                "true",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.max_runtime, Some(Duration::from_secs(5400)));
        assert_eq!(c.once, None);
    }
}
