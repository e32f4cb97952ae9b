//! The lock recipe: under the persistent parent `/leasewrap/NAME` (never a container node, which
//! ZooKeeper deletes once empty), each contender creates an ephemeral sequential child named
//! `_c_<random>-lock-<sequence>`; the lowest sequence holds the lock, and each waiter watches
//! only its predecessor. The random part (Curator's "protected" mode) finds a child again whose
//! create was answered by a lost connection, so that no orphan blocks the queue.
//!
//! A child counts as a lock node only with that name and an ephemeral owner: a persistent node
//! of the same shape (planted by another client) is never waited for. A sequence past 2^31, which
//! ZooKeeper writes negative, still sorts after the ones before it.
//!
//! A waiter's own member may be a follower cut off from the leader, serving a stale view: once it
//! has waited, each look lists the queue behind a `sync`, which only the leader answers, and the
//! turn counts only on that listing, with the waiter's own deadline still ahead (its session is
//! then alive at the leader). The fencing token is the own node's czxid: 64 bits, and
//! growing with every create, across leader changes and restarts (not the 32-bit sequence, which
//! restarts with the parent, nor the session id, which is not ordered).

use std::time::Duration;

use super::client::{self, acls, bounded};
use super::session::{Watch, Zk, ZkError};
use super::wire::{Code, Mode, Stat};
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

/// The sequence of a lock node's name, if it has the shape of one (`_c_<32 hex>-lock-` and ten
/// digits, or `-` and ten digits once the parent's counter passed 2^31), as an unsigned number
/// that keeps counting past 2^31.
pub fn sequence(child: &str) -> Option<u32> {
    let (random, seq) = child.strip_prefix("_c_")?.split_once("-lock-")?;
    let random_ok = random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit());
    let digits = seq.strip_prefix('-').unwrap_or(seq);
    let seq_ok = digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit());
    (random_ok && seq_ok)
        .then(|| seq.parse::<i32>().ok())
        .flatten()
        .map(|s| s as u32)
}

/// The children shaped as lock nodes, lowest sequence first.
pub fn queue(mut children: Vec<String>) -> Vec<String> {
    children.retain(|c| sequence(c).is_some());
    children.sort_by_key(|c| sequence(c));
    children
}

/// Whether `stat` is a lock node's: an ephemeral node, owned by a session.
pub const fn is_lock_node(stat: &Stat) -> bool {
    stat.ephemeral_owner != 0
}

/// Create the own node under `name`'s parent, holding `record`: the parent is made only when the
/// create says it is missing. A create whose answer was lost is looked for by its random prefix
/// (and this session as its owner) before it is tried again. With an identity, the parent's and
/// the root's ACLs are read beside the create, and an open one is reported. The parent's children
/// are asked for right behind the create, on the same connection (so the listing comes after it):
/// the first look at the queue costs no round trip of its own.
pub async fn enqueue(
    cfg: &ZkConfig,
    zk: &Zk,
    name: &str,
    record: &[u8],
) -> Result<(Own, Option<Vec<String>>), Error> {
    let parent = parent(cfg, name);
    let prefix = format!(
        "_c_{:016x}{:016x}-lock-",
        crate::files::random_u64(),
        crate::files::random_u64()
    );
    let path = format!("{parent}/{prefix}");
    let acl = acls(cfg.has_identity());
    let mut last = None;
    for _ in 0..3 {
        let create = zk.create(&path, record, &acl, Mode::EphemeralSequential);
        let listing = zk.children(&parent);
        let looks = report_open_parents(cfg, zk, &parent);
        let (made, ()) = tokio::join!(client::answered(cfg, &path, create), looks);
        match made {
            Ok(Ok((made, stat))) => {
                let listing = client::answered(cfg, &parent, listing).await;
                let own = Own {
                    path: made,
                    czxid: stat.czxid,
                };
                return Ok((own, listing.ok().and_then(Result::ok).map(|(c, _)| c)));
            }
            Ok(Err(e)) if e.is(Code::NO_NODE) => client::ensure_path(cfg, zk, &parent).await?,
            Ok(Err(e @ ZkError::ConnectionLoss(_))) => {
                last = Some(client::failure(cfg, &path, &e));
                // Where the create went is asked on the session's next connection.
                zk.reconnected(cfg.conn.dial_timeout).await;
            }
            Ok(Err(e)) => return Err(client::failure(cfg, &parent, &e)),
            Err(late) => last = Some(late),
        }
        if let Some(own) = find(cfg, zk, &parent, &prefix).await? {
            return Ok((own, None));
        }
    }
    Err(last.unwrap_or_else(|| client::no_answer(cfg, &path, cfg.conn.dial_timeout)))
}

/// With an identity: the lock parent's and the root's ACLs, an open one reported. Errors are
/// the create's to tell.
async fn report_open_parents(cfg: &ZkConfig, zk: &Zk, parent: &str) {
    if !cfg.has_identity() {
        return;
    }
    let root = (!cfg.root.is_empty()).then(|| cfg.root.clone());
    let nodes: Vec<String> = root.into_iter().chain([parent.to_owned()]).collect();
    let asks: Vec<_> = nodes.iter().map(|n| zk.get_acl(n)).collect();
    for (node, ask) in nodes.iter().zip(asks) {
        if let Ok(Ok(acl)) = tokio::time::timeout(cfg.conn.dial_timeout, ask).await {
            client::warn_if_open(cfg, node, &acl);
        }
    }
}

/// The child of `parent` whose name starts with `prefix` and that this session owns, if an
/// earlier create made it.
async fn find(cfg: &ZkConfig, zk: &Zk, parent: &str, prefix: &str) -> Result<Option<Own>, Error> {
    let listing = client::answered(cfg, parent, zk.children(parent)).await?;
    let children = match listing {
        Ok((children, _)) => children,
        // No parent yet: the create that was lost did not make the node either.
        Err(e) if e.is(Code::NO_NODE) => return Ok(None),
        Err(e) => return Err(client::failure(cfg, parent, &e)),
    };
    let Some(child) = children.into_iter().find(|c| c.starts_with(prefix)) else {
        return Ok(None);
    };
    let path = format!("{parent}/{child}");
    let (stat, _) = zk.exists(&path, false);
    let (stat, _) = bounded(cfg, &path, cfg.conn.dial_timeout, stat).await?;
    Ok(stat
        .filter(|s| s.ephemeral_owner == zk.session_id())
        .map(|s| Own {
            path,
            czxid: s.czxid,
        }))
}

/// Where the own node stands in its queue.
pub enum Place {
    /// No lock node ahead: the lock is ours once confirmed.
    First,
    /// Behind this lock node (its full path), watched.
    Behind(String, Watch),
    /// The own node is gone (the session expired, or someone deleted it).
    Gone,
}

/// The own node's place, from one listing of the parent (by the own member: maybe stale; `listing`
/// when one came right behind the own create) and a
/// look at the nodes ahead of it, nearest first, until one is a lock node (ephemeral), which is
/// then watched. Another node of the own random prefix is an earlier create of ours whose answer
/// was lost and that a stale listing did not show: it is deleted, never waited for.
pub async fn place(
    cfg: &ZkConfig,
    zk: &Zk,
    own: &Own,
    listing: Option<Vec<String>>,
) -> Result<Place, Error> {
    let (parent, me) = own.path.rsplit_once('/').unwrap_or(("", &own.path));
    let children = match listing {
        Some(children) => children,
        None => bounded(cfg, parent, cfg.conn.dial_timeout, zk.children(parent)).await?.0,
    };
    let prefix = me.split_once("-lock-").map_or(me, |(p, _)| p);
    let (orphans, queue): (Vec<String>, Vec<String>) = queue(children)
        .into_iter()
        .partition(|c| c != me && c.starts_with(prefix));
    for orphan in orphans {
        delete(cfg, zk, &format!("{parent}/{orphan}")).await;
    }
    let Some(at) = queue.iter().position(|c| c == me) else {
        return Ok(Place::Gone);
    };
    for ahead in queue[..at].iter().rev() {
        let path = format!("{parent}/{ahead}");
        let (stat, watch) = zk.exists(&path, true);
        let (stat, _) = bounded(cfg, &path, cfg.conn.dial_timeout, stat).await?;
        match stat {
            Some(s) if is_lock_node(&s) => {
                let watch = watch.expect("a watch was asked for");
                return Ok(Place::Behind(path, watch));
            }
            Some(_) => {
                tracing::debug!(node = %path, "not a lock node (persistent): not waited for")
            }
            // Gone since the listing: whatever was ahead of it is the next to look at.
            None => {}
        }
    }
    Ok(Place::First)
}

/// Wait until the watched node ahead changes (is deleted), or `every` has passed.
pub async fn wait_gone(watch: Watch, every: Duration) {
    let _ = tokio::time::timeout(every, watch.changed()).await;
}

/// The children of the own node's parent as the leader had them when it answered a `sync` sent
/// just before: the member answers a session's requests in order, the listing only after the
/// sync, so nothing older than the leader's state at the sync (ZooKeeper's up-to-date read, as a
/// waiter's look on etcd is a linearizable read). A member cut off from its leader answers
/// neither: a waiter never acts on its view.
pub async fn synced_listing(cfg: &ZkConfig, zk: &Zk, own: &Own) -> Result<Vec<String>, Error> {
    let (parent, _) = own.path.rsplit_once('/').unwrap_or(("", &own.path));
    let within = cfg.conn.dial_timeout;
    let (sync, listing) = (zk.sync(parent), zk.children(parent));
    let (synced, listed) = tokio::join!(
        bounded(cfg, parent, within, sync),
        bounded(cfg, parent, within, listing)
    );
    synced?;
    Ok(listed?.0)
}

/// Delete a node of ours; a failure only means it goes with its session.
pub async fn delete(cfg: &ZkConfig, zk: &Zk, path: &str) {
    if let Err(e) = bounded(cfg, path, cfg.conn.dial_timeout, zk.delete(path)).await {
        tracing::debug!(node = %path, error = %e, "deleting a lock node failed; it goes with its session");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(r: char, seq: &str) -> String {
        format!("_c_{}-lock-{seq}", r.to_string().repeat(32))
    }

    #[test]
    fn the_queue_is_the_lock_nodes_by_sequence_and_nothing_named_otherwise() {
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
    }

    /// ZooKeeper writes the parent's 32-bit counter with %010d: past 2^31 it is negative.
    #[test]
    fn a_sequence_past_two_to_the_31_sorts_after_the_ones_before_it() {
        let children = vec![
            node('c', "-2147483647"),
            node('a', "2147483646"),
            node('b', "2147483647"),
            node('d', "-2147483648"),
        ];
        let want = [
            node('a', "2147483646"),
            node('b', "2147483647"),
            node('d', "-2147483648"),
            node('c', "-2147483647"),
        ];
        assert_eq!(queue(children), want);
        assert_eq!(sequence(&node('d', "-2147483648")), Some(1 << 31));
        assert_eq!(sequence(&node('d', "-0000000001x")), None);
    }
}
