//! `fenced-put` on ZooKeeper: the lock node given must still have the token as its czxid, and
//! the put is one multi whose first op checks that node, then sets the key's data (or creates
//! the key, whose parent must exist). A lock node's path is never used twice (its name has a
//! random part and a sequence), so a check of the path in the multi is a check of that very
//! node. Nodes under `/leasewrap` are leasewrap's own (queues and run records), never written.

use std::time::Duration;

use super::client::{self, bounded};
use super::runs::{self, Guarded};
use super::session::Zk;
use crate::config::ZkConfig;
use crate::error::Error;
use crate::lease::backend::{self, Boxed, GuardedPut};

/// ZooKeeper, for guarded puts.
pub struct Fence<'a> {
    cfg: &'a ZkConfig,
}

impl<'a> Fence<'a> {
    pub fn new(cfg: &'a ZkConfig) -> Self {
        Fence { cfg }
    }
}

impl backend::Fence for Fence<'_> {
    fn put<'a>(&'a self, put: &'a GuardedPut<'a>) -> Boxed<'a, Result<(), Error>> {
        Box::pin(async move {
            reserved(put.key, &self.cfg.root).map_err(Error::Usage)?;
            let zk = client::connect(self.cfg, Duration::from_secs(10), false)
                .await
                .map_err(|n| n.error)?
                .zk;
            let done = guarded_put(self.cfg, &zk, put).await;
            zk.close(Duration::from_secs(1)).await;
            done
        })
    }
}

/// The put on the session `zk`: the lock node must have the token as its czxid, then one multi
/// checks it and writes (a setData, or a create when the key is not there).
async fn guarded_put(cfg: &ZkConfig, zk: &Zk, put: &GuardedPut<'_>) -> Result<(), Error> {
    let within = cfg.conn.dial_timeout;
    let stale = |seen: String| Error::StaleToken {
        given: put.token,
        seen,
    };
    let (lock, _) = zk.exists(put.lock_key, false);
    let (key, _) = zk.exists(put.key, false);
    let (lock, key) = (
        bounded(cfg, put.lock_key, within, lock).await?.0,
        bounded(cfg, put.key, within, key).await?.0,
    );
    match lock {
        None => return Err(stale(gone(put.lock_key))),
        Some(s) if s.czxid as u64 != put.token => {
            return Err(stale(format!(
                "lock node {} has czxid {} (another holder)",
                put.lock_key, s.czxid
            )))
        }
        Some(_) => {}
    }
    let value = put.value.as_bytes();
    let create = key.is_none();
    for create in [create, !create] {
        match runs::guarded(cfg, zk, put.lock_key, put.key, value, create).await? {
            Guarded::Applied => return Ok(()),
            Guarded::LockGone => return Err(stale(gone(put.lock_key))),
            Guarded::NoParent => break,
            Guarded::Raced => {}
        }
    }
    Err(Error::Usage(format!(
        "{}: no such node to set, and its parent does not exist to create it in",
        put.key
    )))
}

fn gone(lock: &str) -> String {
    format!("lock node {lock} does not exist (its session has ended)")
}

/// Why fenced-put must not write `key`, if it must not: it is under the root (with `--prefix ''`,
/// the lock parents `/NAME` and the records `/runs` are all over the tree: then only those).
fn reserved(key: &str, root: &str) -> Result<(), String> {
    if !key.starts_with('/') || key.len() < 2 {
        return Err(format!(
            "fenced-put on ZooKeeper writes a node path like /app/config, not {key:?}"
        ));
    }
    let own = if root.is_empty() { "/runs" } else { root };
    let under = |r: &str| key == r || key.starts_with(&format!("{r}/"));
    let in_a_queue = root.is_empty()
        && key[1..]
            .split_once('/')
            .is_some_and(|(name, _)| crate::config::check_name(name).is_ok());
    if under(own) || in_a_queue {
        let whose = if root.is_empty() {
            "/runs or /NAME/"
        } else {
            root
        };
        return Err(format!(
            "fenced-put does not write {key:?}: it is under {whose}, leasewrap's lock queues and run records"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_put_on_zookeeper_refuses_leasewraps_nodes_and_relative_keys() {
        for refused in [
            "/leasewrap",
            "/leasewrap/job/x",
            "/leasewrap/runs/job/k",
            "app",
            "/",
        ] {
            assert!(reserved(refused, "/leasewrap").is_err(), "{refused}");
        }
        for allowed in ["/app/config", "/leasewrap2", "/t"] {
            assert_eq!(reserved(allowed, "/leasewrap"), Ok(()), "{allowed}");
        }
        // With --prefix '' a lock's queue is any /NAME/...
        assert!(reserved("/job/x", "").is_err());
        assert!(reserved("/runs/job/k", "").is_err());
        assert_eq!(reserved("/config", ""), Ok(()));
    }
}
