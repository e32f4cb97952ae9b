//! `--database URL`: where the lease's database is and how to log in, as a psql user expects.
//! Parsing only, like the rest of `config`; the one thing read from disk is the password (the
//! file `--password-file` names, else `.pgpass` / PGPASSFILE) and the CA file TLS names.
//!
//! `postgresql://[user@][host][:port][/dbname][?param=value&...]` (or `postgres://`), with the
//! parameters host (a socket directory when it starts with `/`), port, dbname, user, sslmode,
//! sslrootcert, application_name and connect_timeout. `mariadb://` (or `mysql://`) takes the
//! same form and parameters, with `socket` (the socket file) for host; its password comes from
//! `--password-file` or the `[client]` group of `~/.my.cnf`, as the mariadb client's does. A
//! password in the URL is refused: the command line is readable by every user of the host.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::Error;

use super::{read_config_file, read_config_file_mode, Env};

/// Which server the URL's scheme names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    Postgres,
    Mariadb,
}

/// How to reach the lease's database.
#[derive(Clone)]
pub struct DbConfig {
    pub server: Server,
    /// The URL as given, for messages (it holds no password).
    pub url: String,
    /// A TCP host, or a Unix socket (PostgreSQL: its directory; MariaDB: the file).
    pub host: Host,
    pub port: u16,
    pub dbname: String,
    pub user: String,
    /// From `--password-file` or `.pgpass`; never logged nor passed to the child.
    pub password: Option<String>,
    /// Verify the server against this CA (PEM) and its host name; none: no TLS.
    pub tls: Option<Vec<u8>>,
    /// Shown in `pg_stat_activity`.
    pub application_name: String,
    /// Bound on connecting and logging in before giving up with 69.
    pub dial_timeout: Duration,
}

impl std::fmt::Debug for DbConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbConfig")
            .field("url", &self.url)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    Tcp(String),
    /// PostgreSQL: the directory holding `.s.PGSQL.PORT`; MariaDB: the socket itself.
    Socket(PathBuf),
}

impl Host {
    /// The host name `.pgpass` matches: a socket is `localhost`, as libpq has it.
    fn pgpass_name(&self) -> &str {
        match self {
            Host::Tcp(h) => h,
            Host::Socket(_) => "localhost",
        }
    }
}

/// The socket directory Debian's and Red Hat's PostgreSQL use.
const SOCKET_DIR: &str = "/var/run/postgresql";

/// The socket Debian's and Red Hat's MariaDB use.
const MARIADB_SOCKET: &str = "/run/mysqld/mysqld.sock";

impl Server {
    fn default_socket(self) -> &'static str {
        match self {
            Server::Postgres => SOCKET_DIR,
            Server::Mariadb => MARIADB_SOCKET,
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Server::Postgres => 5432,
            Server::Mariadb => 3306,
        }
    }
}

/// What the URL says, before the password and TLS files are read.
#[derive(Debug, Default, PartialEq, Eq)]
struct Parts {
    server: Option<Server>,
    user: Option<String>,
    host: Option<String>,
    port: Option<String>,
    dbname: Option<String>,
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    application_name: Option<String>,
    connect_timeout: Option<String>,
}

/// What `--database` needs besides the URL: the CA file, the password file and the bound.
pub struct Given<'a> {
    pub cacert: Option<&'a Path>,
    pub password_file: Option<(&'a str, PathBuf)>,
    pub dial_timeout: Duration,
}

/// The checked database configuration of `url`.
pub fn db_config(url: &str, given: &Given, env: Env) -> Result<DbConfig, Error> {
    let parts = parse(url)?;
    let server = parts.server.unwrap_or(Server::Postgres);
    let host = match parts.host.as_deref() {
        None | Some("") => Host::Socket(PathBuf::from(server.default_socket())),
        Some(h) if h.starts_with('/') => Host::Socket(PathBuf::from(h)),
        Some(h) => Host::Tcp(h.to_owned()),
    };
    let port = match parts.port.as_deref() {
        None | Some("") => server.default_port(),
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad(url, &format!("port {p:?} is not 1 to 65535")))?,
    };
    let user = match parts.user.clone() {
        Some(u) if !u.is_empty() => u,
        _ => env("USER").unwrap_or_else(|| "postgres".into()),
    };
    let dbname = parts.dbname.clone().filter(|d| !d.is_empty());
    // MariaDB's client connects to no database unless one is named; the lease's is leasewrap.
    let dbname = match server {
        Server::Postgres => dbname.unwrap_or_else(|| user.clone()),
        Server::Mariadb => dbname.unwrap_or_default(),
    };
    let tls = tls(url, &parts, &host, given.cacert)?;
    let password = match &given.password_file {
        Some((from, path)) => Some(first_line(path, from)?),
        None if server == Server::Postgres => pgpass(&host, port, &dbname, &user, env),
        None => my_cnf_password(env),
    };
    let dial_timeout = match parts.connect_timeout.as_deref() {
        None => given.dial_timeout,
        Some(s) => connect_timeout(url, s)?,
    };
    Ok(DbConfig {
        server,
        url: url.to_owned(),
        host,
        port,
        dbname,
        user,
        password,
        tls,
        application_name: parts.application_name.unwrap_or_else(|| "leasewrap".into()),
        dial_timeout,
    })
}

fn bad(url: &str, why: &str) -> Error {
    Error::Usage(format!(
        "bad --database {url:?}: {why}; write it like postgresql://job@db.example:5432/app?sslmode=verify-full or mariadb://job@db.example:3306/app?sslmode=verify-full"
    ))
}

/// The URL's parts, percent-decoded.
fn parse(url: &str) -> Result<Parts, Error> {
    let (server, rest) = match url.split_once("://") {
        Some(("postgresql" | "postgres", rest)) => (Server::Postgres, rest),
        Some(("mariadb" | "mysql", rest)) => (Server::Mariadb, rest),
        _ => {
            return Err(bad(
                url,
                "the scheme is not postgresql://, postgres://, mariadb:// or mysql://",
            ))
        }
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if userinfo.is_some_and(|u| u.contains(':')) {
        return Err(bad(
            url,
            "it holds a password, which every user of this host could read on the command line: put it in ~/.pgpass (~/.my.cnf) or a --password-file",
        ));
    }
    let (host, port) = split_host_port(url, hostport)?;
    let mut parts = Parts {
        server: Some(server),
        user: userinfo.map(|u| decode(url, u)).transpose()?,
        host: host.map(|h| decode(url, h)).transpose()?,
        port: port.map(str::to_owned),
        dbname: Some(decode(url, path)?).filter(|d| !d.is_empty()),
        ..Parts::default()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        param(url, &mut parts, pair)?;
    }
    Ok(parts)
}

/// `host`, `host:port`, `[v6]:port` or nothing.
fn split_host_port<'a>(
    url: &str,
    hostport: &'a str,
) -> Result<(Option<&'a str>, Option<&'a str>), Error> {
    if hostport.is_empty() {
        return Ok((None, None));
    }
    if let Some(v6) = hostport.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| bad(url, "an IPv6 address lacks its ]"))?;
        return Ok((Some(host), after.strip_prefix(':')));
    }
    if hostport.contains(',') {
        return Err(bad(url, "one host only"));
    }
    Ok(match hostport.split_once(':') {
        Some((h, p)) => (Some(h), Some(p)),
        None => (Some(hostport), None),
    })
}

/// One `name=value` of the query string.
fn param(url: &str, parts: &mut Parts, pair: &str) -> Result<(), Error> {
    let (name, value) = pair
        .split_once('=')
        .ok_or_else(|| bad(url, &format!("{pair:?} is not name=value")))?;
    let value = Some(decode(url, value)?);
    let mariadb = parts.server == Some(Server::Mariadb);
    let slot = match name {
        "host" => &mut parts.host,
        "socket" if mariadb => &mut parts.host,
        "port" => &mut parts.port,
        "dbname" => &mut parts.dbname,
        "user" => &mut parts.user,
        "sslmode" => &mut parts.sslmode,
        "sslrootcert" => &mut parts.sslrootcert,
        "application_name" => &mut parts.application_name,
        "connect_timeout" => &mut parts.connect_timeout,
        "password" => {
            return Err(bad(
                url,
                "it holds a password, which every user of this host could read on the command line: put it in ~/.pgpass (~/.my.cnf) or a --password-file",
            ))
        }
        "socket" => return Err(bad(url, "socket is MariaDB's: PostgreSQL's is host=DIRECTORY")),
        other => return Err(bad(url, &format!("unknown parameter {other:?}"))),
    };
    *slot = value;
    Ok(())
}

/// `%XX` decoded; the result must be UTF-8 with no control character.
fn decode(url: &str, text: &str) -> Result<String, Error> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            out.push(hex.ok_or_else(|| bad(url, "a % is not followed by two hex digits"))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .ok()
        .filter(|s| !s.chars().any(char::is_control))
        .ok_or_else(|| bad(url, "a part is not UTF-8 text"))
}

/// sslmode: `disable`, or (the default) `prefer`, which leasewrap takes as TLS when a CA is
/// given and none otherwise; `require`, `verify-ca` and `verify-full` all verify the server's
/// certificate and host name against the CA (sslrootcert, or --cacert), which they need:
/// leasewrap never encrypts without knowing whom to.
fn tls(
    url: &str,
    parts: &Parts,
    host: &Host,
    cacert: Option<&Path>,
) -> Result<Option<Vec<u8>>, Error> {
    let ca_path = parts.sslrootcert.as_deref().map(Path::new).or(cacert);
    let ca = || {
        match ca_path {
        Some(p) => read_config_file(p, "sslrootcert").map(Some),
        None => Err(bad(
            url,
            "sslmode require, verify-ca and verify-full need the CA that signed the server's certificate: sslrootcert=FILE or --cacert FILE",
        )),
    }
    };
    let socket = matches!(host, Host::Socket(_));
    match parts.sslmode.as_deref() {
        Some("disable") => Ok(None),
        None | Some("prefer") if ca_path.is_none() || socket => Ok(None),
        None | Some("prefer") => ca(),
        Some("require" | "verify-ca" | "verify-full") if socket => {
            Err(bad(url, "TLS is for a TCP host, not a Unix socket"))
        }
        Some("require" | "verify-ca" | "verify-full") => ca(),
        Some(other) => Err(bad(
            url,
            &format!("sslmode {other:?} is not disable, prefer, require, verify-ca or verify-full"),
        )),
    }
}

fn connect_timeout(url: &str, secs: &str) -> Result<Duration, Error> {
    secs.parse::<u64>()
        .ok()
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .ok_or_else(|| {
            bad(
                url,
                "connect_timeout is a whole number of seconds, at least 1",
            )
        })
}

/// The first line of `--password-file`.
fn first_line(path: &Path, from: &str) -> Result<String, Error> {
    let (text, _) = read_config_file_mode(path, from)?;
    let text = String::from_utf8_lossy(&text);
    Ok(text.lines().next().unwrap_or("").to_owned())
}

/// The first matching line of PGPASSFILE or `~/.pgpass` (ignored, as libpq does, when group or
/// others may read it); none when it has none.
fn pgpass(host: &Host, port: u16, db: &str, user: &str, env: Env) -> Option<String> {
    let path = match (env("PGPASSFILE"), env("HOME")) {
        (Some(p), _) if !p.is_empty() => PathBuf::from(p),
        (_, Some(home)) => Path::new(&home).join(".pgpass"),
        _ => return None,
    };
    let (text, mode) = read_config_file_mode(&path, "PGPASSFILE").ok()?;
    if mode & 0o077 != 0 {
        tracing::warn!(
            "{}: group or others may read it (mode {:o}), so it is not used: chmod 600 it",
            path.display(),
            mode & 0o7777
        );
        return None;
    }
    let want = [host.pgpass_name(), &port.to_string(), db, user];
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| pgpass_line(line, &want))
}

/// The `password` of the `[client]` (or `[client-mariadb]`) group of `~/.my.cnf` (ignored, as
/// the mariadb client ignores it, when others may write it); none when it has none.
fn my_cnf_password(env: Env) -> Option<String> {
    let path = Path::new(&env("HOME")?).join(".my.cnf");
    let (text, mode) = read_config_file_mode(&path, "~/.my.cnf").ok()?;
    if mode & 0o002 != 0 {
        tracing::warn!(
            "{}: others may write it (mode {:o}), so it is not used: chmod 600 it",
            path.display(),
            mode & 0o7777
        );
        return None;
    }
    my_cnf_client_password(&String::from_utf8_lossy(&text))
}

/// The last `password=` of the client's groups in an option file's text, unquoted.
fn my_cnf_client_password(text: &str) -> Option<String> {
    let mut in_client = false;
    let mut found = None;
    for line in text.lines().map(str::trim) {
        if let Some(group) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_client = matches!(group.trim(), "client" | "client-mariadb");
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if in_client && key.trim() == "password" {
            let value = value.trim();
            let unquoted = ['"', '\'']
                .iter()
                .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)));
            found = Some(unquoted.unwrap_or(value).to_owned());
        }
    }
    found
}

/// The password of a `.pgpass` line whose four fields match `want` (`*` matches anything;
/// `\:` and `\\` are a colon and a backslash).
fn pgpass_line(line: &str, want: &[&str; 4]) -> Option<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut()?.push(chars.next().unwrap_or('\\')),
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut()?.push(c),
        }
    }
    let [h, p, d, u, pw]: [String; 5] = fields.try_into().ok()?;
    let matches = [h, p, d, u]
        .iter()
        .zip(want)
        .all(|(f, w)| f == "*" || f.as_str() == *w);
    matches.then_some(pw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given() -> Given<'static> {
        Given {
            cacert: None,
            password_file: None,
            dial_timeout: Duration::from_secs(2),
        }
    }

    fn config(url: &str) -> Result<DbConfig, Error> {
        let env = |k: &str| (k == "USER").then(|| "alice".to_owned());
        db_config(url, &given(), &env)
    }

    fn usage(url: &str) -> String {
        match config(url) {
            Err(Error::Usage(why)) => why,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn a_url_names_host_port_database_user_and_application_name() {
        let c = config("postgresql://job@db.example:6432/app?application_name=nightly").unwrap();
        assert_eq!(c.host, Host::Tcp("db.example".into()));
        assert_eq!(
            (c.port, c.dbname.as_str(), c.user.as_str()),
            (6432, "app", "job")
        );
        assert_eq!(c.application_name, "nightly");
        assert!(c.tls.is_none());
        let c = config("postgres://").unwrap();
        assert_eq!(c.host, Host::Socket(SOCKET_DIR.into()));
        assert_eq!(
            (c.port, c.dbname.as_str(), c.user.as_str()),
            (5432, "alice", "alice")
        );
        let c = config("postgresql:///app?host=%2Ftmp%2Fpg&port=5433").unwrap();
        assert_eq!(c.host, Host::Socket("/tmp/pg".into()));
        assert_eq!((c.port, c.dbname.as_str()), (5433, "app"));
        let c = config("postgresql://[::1]:5/d?connect_timeout=7").unwrap();
        assert_eq!(c.host, Host::Tcp("::1".into()));
        assert_eq!(c.dial_timeout, Duration::from_secs(7));
    }

    #[test]
    fn a_password_in_the_url_and_bad_urls_are_refused_in_one_line() {
        assert!(usage("postgresql://job:secret@db/app").contains(".pgpass"));
        assert!(usage("postgresql://db/app?password=secret").contains(".pgpass"));
        assert!(usage("http://db/app").contains("scheme"));
        assert!(usage("postgresql://db/app?socket=%2Ftmp%2Fs").contains("MariaDB's"));
        assert!(usage("postgresql://db:0/app").contains("port"));
        assert!(usage("postgresql://db:99999/app").contains("port"));
        assert!(usage("postgresql://db/app?sslmode=sometimes").contains("sslmode"));
        assert!(usage("postgresql://db/app?sslmode=verify-full").contains("sslrootcert"));
        assert!(usage("postgresql://db/app?colour=blue").contains("unknown parameter"));
        assert!(usage("postgresql://db/a%zz").contains("hex"));
        assert!(usage("postgresql://a,b/app").contains("one host"));
        for url in ["postgresql://db/app?sslmode=verify-full", "http://x"] {
            assert!(!usage(url).contains('\n'), "{url}");
        }
    }

    #[test]
    fn a_mariadb_url_names_its_socket_file_or_host_and_its_defaults() {
        let c = config("mariadb://job@/app?socket=%2Ftmp%2Fm.sock").unwrap();
        assert_eq!(c.server, Server::Mariadb);
        assert_eq!(c.host, Host::Socket("/tmp/m.sock".into()));
        assert_eq!((c.dbname.as_str(), c.user.as_str()), ("app", "job"));
        let c = config("mysql://").unwrap();
        assert_eq!(c.host, Host::Socket(MARIADB_SOCKET.into()));
        assert_eq!(
            (c.port, c.dbname.as_str(), c.user.as_str()),
            (3306, "", "alice")
        );
        let c = config("mariadb://db.example:3307").unwrap();
        assert_eq!((c.host, c.port), (Host::Tcp("db.example".into()), 3307));
        assert!(usage("mariadb://job:pw@db/app").contains("~/.my.cnf"));
    }

    #[test]
    fn my_cnf_gives_the_password_of_its_client_groups_only() {
        let text = "[mysqld]\npassword=server\n[client]\nuser = job\npassword = \"se same\"\n[mysql]\npassword=other\n";
        assert_eq!(my_cnf_client_password(text), Some("se same".into()));
        assert_eq!(
            my_cnf_client_password("[client-mariadb]\npassword='x'\n"),
            Some("x".into())
        );
        assert_eq!(my_cnf_client_password("[mysqld]\npassword=server\n"), None);
    }

    #[test]
    fn pgpass_lines_match_field_by_field_with_wildcards_and_escapes() {
        let want = ["db", "5432", "app", "job"];
        assert_eq!(pgpass_line("db:5432:app:job:pw", &want), Some("pw".into()));
        assert_eq!(
            pgpass_line("*:*:*:job:p\\:w\\\\", &want),
            Some("p:w\\".into())
        );
        assert_eq!(pgpass_line("db:5432:app:other:pw", &want), None);
        assert_eq!(pgpass_line("db:5432:app", &want), None);
        assert_eq!(
            pgpass_line("db:5432:app:job:p:w", &want),
            Some("p:w".into())
        );
    }

    #[test]
    fn the_password_comes_from_pgpassfile_only_when_no_one_else_may_read_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(&file, "# comment\nlocalhost:5432:app:job:sesame\n").unwrap();
        let path = file.to_str().unwrap().to_owned();
        let env = move |k: &str| (k == "PGPASSFILE").then(|| path.clone());
        let read = || {
            db_config("postgresql://job@/app", &given(), &env)
                .unwrap()
                .password
        };
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(), Some("sesame".into()));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read(), None);
    }
}
