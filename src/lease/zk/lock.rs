//! The lock recipe: under the persistent parent `/leasewrap/NAME` (never a container node, which
//! ZooKeeper deletes once empty), each contender creates an ephemeral sequential child named
//! `_c_<random>-lock-<sequence>`; the lowest sequence holds the lock, and each waiter watches
//! only its predecessor. The random part (Curator's "protected" mode) finds a child again whose
//! create was answered by a lost connection, so that no orphan blocks the queue.
//!
//! A waiter's own member may be a follower cut off from the leader, serving a stale view: the
//! turn counts as come only after a `sync` and a multi with a check on the own node, which goes
//! through the leader, both succeed. The fencing token is the own node's czxid: 64 bits, and
//! growing with every create, across leader changes and restarts (not the 32-bit sequence, which
//! restarts with the parent, nor the session id, which is not ordered).

use std::time::Duration;

use zookeeper_client as zkc;

use super::client::{self, bounded};
use crate::config::ZkConfig;
use crate::error::Error;

/// The own node, once created.
#[derive(Clone, Debug)]
pub struct Own {
    /// Its full path.
    pub path: String,
    /// Its czxid: the fencing token once the lock is ours.
    pub czxid: i64,
}

/// The parent of the lock nodes of `name`: `ROOT/NAME`, the root being the prefix's path.
pub fn parent(cfg: &ZkConfig, name: &str) -> String {
    format!("{}/{name}", cfg.root)
}

/// The sequence of a lock node's name, if it is one (`_c_<32 hex>-lock-0000000042`).
pub fn sequence(child: &str) -> Option<i64> {
    let (random, seq) = child.strip_prefix("_c_")?.split_once("-lock-")?;
    let random_ok = random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit());
    let seq_ok = seq.len() >= 10 && seq.bytes().all(|b| b.is_ascii_digit());
    (random_ok && seq_ok).then(|| seq.parse().ok()).flatten()
}

/// The lock nodes among `children`, lowest sequence first.
pub fn queue(mut children: Vec<String>) -> Vec<String> {
    children.retain(|c| sequence(c).is_some());
    children.sort_by_key(|c| sequence(c));
    children
}

/// Create the own node under `name`'s parent, holding `record`; a create whose answer was lost
/// is looked for by its random prefix before it is tried again.
pub async fn enqueue(
    cfg: &ZkConfig,
    zk: &zkc::Client,
    name: &str,
    record: &[u8],
) -> Result<Own, Error> {
    let parent = parent(cfg, name);
    client::ensure_path(cfg, zk, &parent).await?;
    let prefix = format!(
        "_c_{:016x}{:016x}-lock-",
        crate::files::random_u64(),
        crate::files::random_u64()
    );
    let ephemeral = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    let path = format!("{parent}/{prefix}");
    let mut last = None;
    for _ in 0..3 {
        match bounded(
            cfg,
            cfg.conn.dial_timeout,
            zk.create(&path, record, &ephemeral),
        )
        .await
        {
            Ok((stat, seq)) if !stat.is_invalid() => {
                return Ok(Own {
                    path: format!("{path}{seq}"),
                    czxid: stat.czxid,
                })
            }
            Ok(_) => {
                last = Some(Error::Unavailable(
                    "ZooKeeper answered a create with an invalid Stat (3.4 or earlier)".into(),
                ))
            }
            Err(e) => last = Some(e),
        }
        if let Some(own) = find(cfg, zk, &parent, &prefix).await? {
            return Ok(own);
        }
    }
    Err(last.unwrap_or_else(|| Error::Internal("creating the lock node".into())))
}

/// The child of `parent` whose name starts with `prefix`, if the create made it.
async fn find(
    cfg: &ZkConfig,
    zk: &zkc::Client,
    parent: &str,
    prefix: &str,
) -> Result<Option<Own>, Error> {
    let children = bounded(cfg, cfg.conn.dial_timeout, zk.list_children(parent)).await?;
    let Some(child) = children.into_iter().find(|c| c.starts_with(prefix)) else {
        return Ok(None);
    };
    let path = format!("{parent}/{child}");
    let stat = bounded(cfg, cfg.conn.dial_timeout, zk.check_stat(&path)).await?;
    Ok(stat.map(|s| Own {
        path,
        czxid: s.czxid,
    }))
}

/// Where the own node stands in its queue.
pub enum Place {
    /// No lower node: the lock is ours once confirmed.
    First,
    /// Behind this node (the full path of the one just before).
    Behind(String),
    /// The own node is gone (the session expired, or someone deleted it).
    Gone,
}

/// The own node's place, from one listing of the parent (by the own member: maybe stale).
pub async fn place(cfg: &ZkConfig, zk: &zkc::Client, own: &Own) -> Result<Place, Error> {
    let (parent, me) = own.path.rsplit_once('/').unwrap_or(("", &own.path));
    let children = bounded(cfg, cfg.conn.dial_timeout, zk.list_children(parent)).await?;
    let queue = queue(children);
    let Some(at) = queue.iter().position(|c| c == me) else {
        return Ok(Place::Gone);
    };
    Ok(match at {
        0 => Place::First,
        _ => Place::Behind(format!("{parent}/{}", queue[at - 1])),
    })
}

/// Wait until `predecessor` is gone, or `every` has passed (to look at the queue again).
pub async fn wait_gone(
    cfg: &ZkConfig,
    zk: &zkc::Client,
    predecessor: &str,
    every: Duration,
) -> Result<(), Error> {
    let (stat, watcher) = bounded(
        cfg,
        cfg.conn.dial_timeout,
        zk.check_and_watch_stat(predecessor),
    )
    .await?;
    if stat.is_none() {
        return Ok(());
    }
    let _ = tokio::time::timeout(every, watcher.changed()).await;
    Ok(())
}

/// Through the leader: a `sync`, then a multi whose one op checks that the own node exists.
/// Ok(false) when the node is gone.
pub async fn confirm(cfg: &ZkConfig, zk: &zkc::Client, own: &Own) -> Result<bool, Error> {
    bounded(cfg, cfg.conn.dial_timeout, zk.sync(&own.path)).await?;
    check(cfg, zk, &own.path, cfg.conn.dial_timeout).await
}

/// A multi with one check op on `path` (any version): a write that goes through the leader.
/// Ok(false) when the node is not there.
pub async fn check(
    cfg: &ZkConfig,
    zk: &zkc::Client,
    path: &str,
    within: Duration,
) -> Result<bool, Error> {
    let mut multi = zk.new_multi_writer();
    multi
        .add_check_version(path, -1)
        .map_err(|e| Error::Internal(format!("a check of {path}: {e}")))?;
    match tokio::time::timeout(within, multi.commit()).await {
        Ok(Ok(_)) => Ok(true),
        Ok(Err(zkc::MultiWriteError::OperationFailed {
            source: zkc::Error::NoNode,
            ..
        })) => Ok(false),
        Ok(Err(e)) => Err(client::failure(cfg, &e.into())),
        Err(_) => Err(Error::Unavailable(format!(
            "ZooKeeper at {}: no answer to a check within {within:?}",
            cfg.connect
        ))),
    }
}

/// Delete the own node, so that the next waiter goes on at once; a failure only means it goes
/// with the session.
pub async fn delete(cfg: &ZkConfig, zk: &zkc::Client, path: &str, within: Duration) {
    if let Err(e) = bounded(cfg, within, zk.delete(path, None)).await {
        tracing::debug!(node = %path, error = %e, "deleting the lock node failed; it goes with the session");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_the_lock_nodes_by_sequence_and_nothing_named_otherwise() {
        let node = |r: char, seq: &str| format!("_c_{}-lock-{seq}", r.to_string().repeat(32));
        let children = vec![
            node('b', "0000000012"),
            "not-a-lock".to_owned(),
            node('a', "0000000003"),
            node('c', "12"),
            "a-lock-0000000001".to_owned(),
            node('f', "0000000100"),
        ];
        let want = [
            node('a', "0000000003"),
            node('b', "0000000012"),
            node('f', "0000000100"),
        ];
        assert_eq!(queue(children), want);
        assert_eq!(sequence(&node('0', "2147483648")), Some(2_147_483_648));
    }
}
