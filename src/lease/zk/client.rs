//! Dialling ZooKeeper, bounding each request, telling 69 from 77, and the `conf` four-letter
//! word that tells the ensemble's tickTime and syncLimit when it is allowed.
//!
//! The client crate keeps one session over one connection at a time and moves it to another
//! member by itself; its own Expired verdict comes at 7/5 of the timeout, too late for a lease,
//! so nothing here relies on it: the deadline rule does.

use std::future::Future;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zookeeper_client as zkc;

use crate::clock::BootInstant;
use crate::config::ZkConfig;
use crate::error::Error;

/// A connected session and when its connect request was sent.
pub struct Session {
    pub client: zkc::Client,
    /// Sent no earlier than this: the session's expiry clock at the leader started after it.
    pub t_connect: BootInstant,
    /// The timeout the server negotiated (clamped to [2, 20] × tickTime): the TTL in force.
    pub timeout: Duration,
}

/// Open a session asking for `ttl` as its timeout, within the dial timeout. With `make_chroot`,
/// the chroot of the connect string is made first when missing (as ZooKeeper's own tools need
/// it made by hand); `status` makes nothing, and reads a missing chroot as empty.
pub async fn connect(cfg: &ZkConfig, ttl: Duration, make_chroot: bool) -> Result<Session, Error> {
    let mut connector = zkc::Client::connector()
        .with_session_timeout(ttl)
        .with_connection_timeout(cfg.conn.dial_timeout);
    if let Some((user, password)) = &cfg.conn.auth {
        connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
    }
    let (hosts, chroot) = split_chroot(&cfg.connect);
    let at = if make_chroot {
        hosts
    } else {
        cfg.connect.as_str()
    };
    let t_connect = BootInstant::now();
    let client = match tokio::time::timeout(cfg.conn.dial_timeout, connector.connect(at)).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => return Err(failure(cfg, &e)),
        Err(_) => {
            return Err(Error::Unavailable(format!(
                "ZooKeeper at {}: no session within {:?} (--dial-timeout)",
                cfg.connect, cfg.conn.dial_timeout
            )))
        }
    };
    let client = match (make_chroot, chroot) {
        (true, Some(chroot)) => {
            ensure_path(cfg, &client, chroot).await?;
            client
                .chroot(chroot)
                .map_err(|_| Error::Usage(format!("bad chroot {chroot:?} in --zookeeper")))?
        }
        _ => client,
    };
    let timeout = client.session_timeout();
    Ok(Session {
        client,
        t_connect,
        timeout,
    })
}

/// The members and the chroot (none: `/`) of a connect string.
fn split_chroot(connect: &str) -> (&str, Option<&str>) {
    match connect.find('/') {
        Some(i) => (&connect[..i], Some(&connect[i..])),
        None => (connect, None),
    }
}

/// What a failed request means for the exit status: refused credentials are 77, the rest 69.
pub fn failure(cfg: &ZkConfig, e: &zkc::Error) -> Error {
    match e {
        zkc::Error::AuthFailed | zkc::Error::NoAuth => Error::Auth(format!(
            "ZooKeeper at {} refused the credentials: {e}",
            cfg.connect
        )),
        _ => Error::Unavailable(format!("ZooKeeper at {}: {e}", cfg.connect)),
    }
}

/// `request`'s answer if it comes within `within`; a late one is the dial timeout's failure.
pub async fn bounded<T>(
    cfg: &ZkConfig,
    within: Duration,
    request: impl Future<Output = Result<T, zkc::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(within, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(failure(cfg, &e)),
        Err(_) => Err(Error::Unavailable(format!(
            "ZooKeeper at {}: no answer within {within:?}",
            cfg.connect
        ))),
    }
}

/// Make the persistent node `path` and its parents if missing (one read when it is there).
/// Never a container node: a container is deleted once empty, and a lock's parent must never
/// be recreated.
pub async fn ensure_path(cfg: &ZkConfig, client: &zkc::Client, path: &str) -> Result<(), Error> {
    if path.is_empty() || exists(cfg, client, path).await? {
        return Ok(());
    }
    let acl = zkc::Acls::anyone_all();
    let persistent = zkc::CreateMode::Persistent.with_acls(acl);
    let mut at = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at.push('/');
        at.push_str(part);
        match bounded(
            cfg,
            cfg.conn.dial_timeout,
            client.create(&at, b"", &persistent),
        )
        .await
        {
            Ok(_) => {}
            Err(_) if exists(cfg, client, &at).await? => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn exists(cfg: &ZkConfig, client: &zkc::Client, path: &str) -> Result<bool, Error> {
    let stat = bounded(cfg, cfg.conn.dial_timeout, client.check_stat(path)).await?;
    Ok(stat.is_some())
}

/// What `conf` says of the ensemble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conf {
    pub tick: Duration,
    pub sync_limit: Option<u32>,
}

/// Ask every member at once for `conf` (plain TCP, bounded); the first answer that has a
/// tickTime, or none when no member gives one (`conf` is not in ZooKeeper's default
/// four-letter-word whitelist).
pub async fn conf(cfg: &ZkConfig) -> Option<Conf> {
    let within = cfg.conn.dial_timeout.min(Duration::from_secs(1));
    let mut asks = tokio::task::JoinSet::new();
    for member in cfg.members.clone() {
        asks.spawn(async move {
            let text = tokio::time::timeout(within, four_letters(&member, b"conf")).await;
            (member, text.ok().flatten().as_deref().and_then(parse_conf))
        });
    }
    while let Some(Ok((member, conf))) = asks.join_next().await {
        if let Some(conf) = conf {
            tracing::info!(
                member = %member,
                tick_time_ms = conf.tick.as_millis() as u64,
                sync_limit = conf.sync_limit,
                "ZooKeeper's conf"
            );
            return Some(conf);
        }
    }
    None
}

async fn four_letters(member: &str, word: &[u8]) -> Option<String> {
    let mut stream = TcpStream::connect(member).await.ok()?;
    stream.write_all(word).await.ok()?;
    let mut text = Vec::new();
    (&mut stream)
        .take(64 * 1024)
        .read_to_end(&mut text)
        .await
        .ok()?;
    String::from_utf8(text).ok()
}

/// tickTime and syncLimit from `conf`'s `key=value` lines; none without a tickTime.
pub fn parse_conf(text: &str) -> Option<Conf> {
    let value = |key: &str| {
        text.lines()
            .filter_map(|l| l.trim().split_once('='))
            .find(|(k, _)| k.trim() == key)
            .and_then(|(_, v)| v.trim().parse::<u64>().ok())
    };
    let tick = value("tickTime").filter(|&t| t > 0)?;
    Some(Conf {
        tick: Duration::from_millis(tick),
        sync_limit: value("syncLimit").map(|s| s as u32),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_gives_tick_time_and_sync_limit_and_a_refusal_gives_none() {
        let text = "clientPort=2181\ndataDir=/tmp/zk\ntickTime=1000\ninitLimit=10\nsyncLimit=8\n";
        assert_eq!(
            parse_conf(text),
            Some(Conf {
                tick: Duration::from_millis(1000),
                sync_limit: Some(8)
            })
        );
        let refused = "conf is not executed because it is not in the whitelist.\n";
        assert_eq!(parse_conf(refused), None);
    }
}
