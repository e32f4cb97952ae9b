//! Opening ZooKeeper sessions from the configuration, bounding each request, telling 69 from 77,
//! the ACL every node leasewrap creates gets, making missing parents, and the `conf`
//! four-letter word that tells a member's tickTime and session bounds where it is allowed.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::net::{self, Auth, Reach};
use super::session::{self, Connection, Refusals, Zk, ZkError};
use super::wire::{perms, Acl, Code, Mode};
use crate::config::ZkConfig;
use crate::error::Error;

/// A session and its first connection.
pub struct Session {
    pub zk: Zk,
    pub first: Connection,
}

/// Why no session was opened: the error to end with, and whether asking again may give one.
pub struct NotOpened {
    pub error: Error,
    /// Some member was busy, electing or hung (rather than refusing, unknown or refusing us).
    pub transient: bool,
}

/// Open a session asking for `ttl` as its timeout, the members tried in turn within the dial
/// timeout. With `make_chroot`, the chroot of the connect string is made first when missing (as
/// ZooKeeper's own tools need it made by hand); `status` makes nothing, and reads a missing
/// chroot as empty.
pub async fn connect(
    cfg: &ZkConfig,
    ttl: Duration,
    make_chroot: bool,
) -> Result<Session, NotOpened> {
    let refused = |error| NotOpened {
        error,
        transient: false,
    };
    let opts = session::Options {
        members: cfg.members.clone(),
        chroot: String::new(),
        timeout: ttl,
        dial: cfg.conn.dial_timeout,
        reach: reach(cfg).map_err(refused)?,
    };
    let zk = session::open(opts).await.map_err(|r| not_opened(cfg, r))?;
    let first = match zk.state() {
        session::State::Connected(c) => c,
        _ => return Err(not_opened(cfg, Vec::new())),
    };
    if make_chroot && !cfg.chroot.is_empty() {
        // A connection lost meanwhile is the ensemble's trouble, which a waiter rides out.
        ensure_path(cfg, &zk, &cfg.chroot)
            .await
            .map_err(|error| NotOpened {
                transient: matches!(error, Error::Unavailable(_)),
                error,
            })?;
    }
    Ok(Session {
        zk: zk.with_chroot(&cfg.chroot),
        first,
    })
}

/// Every member's reason, in one line; 77 when one of them refused the credentials or the TLS
/// handshake, else 69.
fn not_opened(cfg: &ZkConfig, refusals: Refusals) -> NotOpened {
    let each: Vec<String> = refusals
        .iter()
        .map(|(m, why)| format!("{m}: {why}"))
        .collect();
    let transient = refusals.iter().any(|(_, why)| why.is_transient());
    let text = format!(
        "ZooKeeper at {}: no session within {:?} (--dial-timeout): {}",
        cfg.connect,
        cfg.conn.dial_timeout,
        each.join("; ")
    );
    let error = match refusals.iter().any(|(_, why)| why.is_refusal()) {
        true => Error::Auth(text),
        false => Error::Unavailable(text),
    };
    NotOpened { error, transient }
}

/// How sessions reach the members: TLS from the PEM files given, and the credentials. A file
/// that holds no certificate or key is a configuration error (78).
pub fn reach(cfg: &ZkConfig) -> Result<Reach, Error> {
    let tls = match &cfg.conn.ca {
        Some(ca) => {
            let identity = cfg
                .conn
                .identity
                .as_ref()
                .map(|(c, k)| (c.as_slice(), k.as_slice()));
            Some(super::tls::config(ca, identity).map_err(Error::Config)?)
        }
        None => None,
    };
    let auth = cfg
        .conn
        .auth
        .clone()
        .map(|(user, password)| match cfg.sasl {
            true => Auth::Sasl { user, password },
            false => Auth::Digest { user, password },
        });
    Ok(Reach { tls, auth })
}

/// What a failed request means for the exit status: a refused identity or permission is 77, the
/// rest 69. `path` is the node the request was about.
pub fn failure(cfg: &ZkConfig, path: &str, e: &ZkError) -> Error {
    match e {
        ZkError::Server(code) if *code == Code::NO_AUTH => Error::Auth(match cfg.has_identity() {
            true => format!(
                "ZooKeeper at {}: the identity leasewrap was given may not do this to {path} (its ACL admits other identities)",
                cfg.connect
            ),
            false => format!(
                "ZooKeeper at {}: {path} admits only certain identities, and leasewrap was given none: give it --user and --password-file, or --cert and --key",
                cfg.connect
            ),
        }),
        ZkError::Server(code) if *code == Code::INVALID_ACL => Error::Auth(format!(
            "ZooKeeper at {}: creating {path}: the server gave this session no identity to own it \
             (a client certificate needs authProvider.x509 on the servers; SASL needs authProvider.sasl)",
            cfg.connect
        )),
        ZkError::Server(code) if *code == Code::AUTH_FAILED => Error::Auth(format!(
            "ZooKeeper at {} refused the credentials",
            cfg.connect
        )),
        ZkError::Ended(session::State::AuthFailed(why)) => Error::Auth(format!(
            "ZooKeeper at {} refused the credentials: {why}",
            cfg.connect
        )),
        _ => Error::Unavailable(format!("ZooKeeper at {}: {path}: {e}", cfg.connect)),
    }
}

/// `request`'s answer if it comes within `within`; a late one is a failure (69).
pub async fn bounded<T>(
    cfg: &ZkConfig,
    path: &str,
    within: Duration,
    request: impl Future<Output = Result<T, ZkError>>,
) -> Result<T, Error> {
    match tokio::time::timeout(within, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(failure(cfg, path, &e)),
        Err(_) => Err(no_answer(cfg, path, within)),
    }
}

/// `request`'s own result, server errors and all, if it comes within the dial timeout; a late
/// one is a failure (69).
pub async fn answered<T>(
    cfg: &ZkConfig,
    path: &str,
    request: impl Future<Output = Result<T, ZkError>>,
) -> Result<Result<T, ZkError>, Error> {
    let within = cfg.conn.dial_timeout;
    tokio::time::timeout(within, request)
        .await
        .map_err(|_| no_answer(cfg, path, within))
}

/// The failure of a request about `path` that got no answer `within`.
pub fn no_answer(cfg: &ZkConfig, path: &str, within: Duration) -> Error {
    Error::Unavailable(format!(
        "ZooKeeper at {}: {path}: no answer within {within:?}",
        cfg.connect
    ))
}

/// The ACL of every node leasewrap creates: with an identity (digest, SASL or a client
/// certificate), all rights to that identity alone and READ to everyone, so that `status` works
/// without credentials and nothing else can write, delete or re-ACL what leasewrap made;
/// without one, all rights to everyone (what any client can then do is in the README).
pub fn acls(has_identity: bool) -> Vec<Acl> {
    match has_identity {
        true => vec![Acl::creator(perms::ALL), Acl::anyone(perms::READ)],
        false => vec![Acl::anyone(perms::ALL)],
    }
}

/// Make the persistent node `path` and its parents: all creates sent at once, those that exist
/// already are fine. Never a container node: a container is deleted once empty, and a lock's
/// parent must never be recreated. A create whose answer a moving connection lost is sent again
/// once the session is on its next member. Parents that were there with an open ACL are reported.
pub async fn ensure_path(cfg: &ZkConfig, zk: &Zk, path: &str) -> Result<(), Error> {
    let acl = acls(cfg.has_identity());
    let make = |node: &str| zk.create(node, b"", &acl, Mode::Persistent);
    let mut at = String::new();
    let mut creates = Vec::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at.push('/');
        at.push_str(part);
        creates.push((at.clone(), make(&at)));
    }
    for (node, create) in creates {
        let mut answer = answered(cfg, &node, create).await?;
        if let Err(ZkError::ConnectionLoss(_)) = answer {
            // Asked again on the session's next connection: a create whose answer was lost and
            // that made the node is then answered NodeExists.
            zk.reconnected(cfg.conn.dial_timeout).await;
            answer = answered(cfg, &node, make(&node)).await?;
        }
        match answer {
            Ok(_) => {}
            // There already (NodeExists, or NoAuth when its parent admits no creates of ours).
            Err(e) => match exists(cfg, zk, &node).await? {
                true => check_open(cfg, zk, &node).await,
                false => return Err(failure(cfg, &node, &e)),
            },
        }
    }
    Ok(())
}

async fn exists(cfg: &ZkConfig, zk: &Zk, path: &str) -> Result<bool, Error> {
    let (stat, _) = zk.exists(path, false);
    Ok(bounded(cfg, path, cfg.conn.dial_timeout, stat)
        .await?
        .0
        .is_some())
}

/// Warn, once per node and run, when a node leasewrap relies on lets anybody change it.
pub async fn check_open(cfg: &ZkConfig, zk: &Zk, path: &str) {
    if !cfg.has_identity() {
        return;
    }
    if let Ok(Ok(acls)) = tokio::time::timeout(cfg.conn.dial_timeout, zk.get_acl(path)).await {
        warn_if_open(cfg, path, &acls);
    }
}

/// The warning for an open ACL of `path`, once per node and process.
pub fn warn_if_open(cfg: &ZkConfig, path: &str, acls: &[Acl]) {
    static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let Some(open) = acls.iter().find(|a| a.is_open()) else {
        return;
    };
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !warned
        .get_or_insert_with(HashSet::new)
        .insert(path.to_owned())
    {
        return;
    }
    tracing::warn!(
        node = %format!("{}{path}", cfg.chroot),
        acl = %format!("{}:{}:{}", open.scheme, open.id, perms_text(open.perms)),
        "this ZooKeeper node lets any client change it (delete the lock nodes or records under it, or re-ACL it): \
         setAcl it to leasewrap's identity, as the README's ZooKeeper section says"
    );
}

/// Permissions as zkCli writes them: `cdrwa`.
fn perms_text(p: i32) -> String {
    [
        (perms::CREATE, 'c'),
        (perms::DELETE, 'd'),
        (perms::READ, 'r'),
        (perms::WRITE, 'w'),
        (perms::ADMIN, 'a'),
    ]
    .iter()
    .filter(|(bit, _)| p & bit != 0)
    .map(|(_, c)| *c)
    .collect()
}

/// What the ensemble told of its timing: each member's `conf` where it answers, and where none
/// does, the smallest session timeout one member grants (a session asked for 1 ms gets the
/// member's minSessionTimeout, 2 x tickTime unless set otherwise).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Learned {
    pub conf: Vec<(String, Conf)>,
    pub min_session: Option<Duration>,
}

impl Learned {
    /// The tickTime the rule counts with: the largest any member told, or half the smallest
    /// session timeout (ZooKeeper's sessions last 2 ticks at the least, unless its
    /// minSessionTimeout is set below that, which the README's precondition excludes).
    pub fn tick(&self) -> Option<Duration> {
        let told = self.conf.iter().map(|(_, c)| c.tick).max();
        told.or(self.min_session.map(|m| m / 2))
    }
}

/// What the ensemble tells of its timing (see [`Learned`]), asked without delaying anything.
pub async fn learn(cfg: &ZkConfig) -> Learned {
    let conf = conf(cfg).await;
    let min_session = match conf.is_empty() {
        true => min_session(cfg).await,
        false => None,
    };
    Learned { conf, min_session }
}

/// A member's smallest session timeout: a session asked for 1 ms, closed at once (its handle
/// dropped: its task writes the close, and nothing waits for the answer).
async fn min_session(cfg: &ZkConfig) -> Option<Duration> {
    let probe = connect(cfg, Duration::from_millis(1), false).await.ok()?;
    Some(probe.first.timeout)
}

/// What `conf` says of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conf {
    pub tick: Duration,
    pub sync_limit: Option<u32>,
    pub min_session: Option<Duration>,
    pub max_session: Option<Duration>,
}

/// Ask every member at once for `conf` (over the same transport as the sessions, bounded):
/// each answer that has a tickTime. `conf` is not in ZooKeeper's default four-letter-word
/// whitelist, so there may be none.
pub async fn conf(cfg: &ZkConfig) -> Vec<(String, Conf)> {
    let within = cfg.conn.dial_timeout.min(Duration::from_secs(1));
    let Ok(reach) = reach(cfg) else {
        return Vec::new();
    };
    let mut asks = tokio::task::JoinSet::new();
    for member in cfg.members.clone() {
        let reach = reach.clone();
        asks.spawn(async move {
            let text = tokio::time::timeout(within, four_letters(&member, &reach, b"conf")).await;
            (member, text.ok().flatten().as_deref().and_then(parse_conf))
        });
    }
    let mut out = Vec::new();
    while let Some(Ok((member, conf))) = asks.join_next().await {
        if let Some(conf) = conf {
            out.push((member, conf));
        }
    }
    out
}

async fn four_letters(member: &str, reach: &Reach, word: &[u8]) -> Option<String> {
    let mut io = net::open(member, reach).await.ok()?;
    io.write_all(word).await.ok()?;
    let mut text = Vec::new();
    (&mut io)
        .take(64 * 1024)
        .read_to_end(&mut text)
        .await
        .ok()?;
    String::from_utf8(text).ok()
}

/// tickTime, syncLimit and the session bounds from `conf`'s `key=value` lines; none without a
/// tickTime.
pub fn parse_conf(text: &str) -> Option<Conf> {
    let value = |key: &str| {
        text.lines()
            .filter_map(|l| l.trim().split_once('='))
            .find(|(k, _)| k.trim() == key)
            .and_then(|(_, v)| v.trim().parse::<i64>().ok())
    };
    let ms = |key: &str| {
        value(key)
            .filter(|&v| v > 0)
            .map(|v| Duration::from_millis(v as u64))
    };
    Some(Conf {
        tick: ms("tickTime")?,
        sync_limit: value("syncLimit").and_then(|s| u32::try_from(s).ok()),
        min_session: ms("minSessionTimeout"),
        max_session: ms("maxSessionTimeout"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_gives_tick_time_sync_limit_and_session_bounds_and_a_refusal_gives_none() {
        let text = "clientPort=2181\ndataDir=/tmp/zk\ntickTime=1000\ninitLimit=10\nsyncLimit=8\n\
                    minSessionTimeout=2000\nmaxSessionTimeout=20000\n";
        assert_eq!(
            parse_conf(text),
            Some(Conf {
                tick: Duration::from_millis(1000),
                sync_limit: Some(8),
                min_session: Some(Duration::from_secs(2)),
                max_session: Some(Duration::from_secs(20)),
            })
        );
        let refused = "conf is not executed because it is not in the whitelist.\n";
        assert_eq!(parse_conf(refused), None);
    }

    #[test]
    fn with_an_identity_only_it_may_change_what_leasewrap_creates_and_anyone_may_read() {
        assert!(acls(true).iter().all(|a| !a.is_open()));
        assert!(acls(true)
            .iter()
            .any(|a| a.scheme == "world" && a.perms == perms::READ));
        assert!(acls(false).iter().any(Acl::is_open));
        assert_eq!(perms_text(perms::ALL), "cdrwa");
    }
}
