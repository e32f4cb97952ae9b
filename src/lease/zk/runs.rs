//! Run records on ZooKeeper: one persistent node per (name, KEY), `ROOT/runs/NAME/KEY` (the root
//! being the prefix's path, `/leasewrap` by default), holding the record's JSON, with the ACL of
//! every node leasewrap creates. A record is written in one multi whose first op checks that the
//! writer's own lock node still exists, so a stale holder (its session expired, its node gone)
//! is refused.
//!
//! ZooKeeper deletes nothing by time here (TTL nodes need extendedTypesEnabled), so each write
//! sweeps: it reads at most `SWEEP_READS` records of its name, from a random place among them,
//! and deletes those that another record shows expired (`runs::record::confirmed_expired`, as
//! the local backend judges: never by this host's clock alone). A record whose keep_until has
//! passed counts as gone meanwhile. `status` reads a bounded number of records.
//!
//! `runs` is a valid lease name, and so its lock parent is `ROOT/runs` too: the queue
//! counts only children named as lock nodes are (`_c_` + 32 hex digits + `-lock-` + sequence),
//! which no record folder of a real lease name is.

use std::time::SystemTime;

use super::client::{self, acls, bounded};
use super::session::{Zk, ZkError};
use super::wire::{Code, MultiOp};
use crate::config::ZkConfig;
use crate::error::Error;
use crate::runs::record::{confirmed_expired, unix_seconds, SWEEP_READS};
use crate::runs::{RunRecord, Unreadable, Written};

/// The folder of every name's records.
fn records_root(cfg: &ZkConfig) -> String {
    format!("{}/runs", cfg.root)
}

/// The folder of `name`'s records.
fn folder(cfg: &ZkConfig, name: &str) -> String {
    format!("{}/{name}", records_root(cfg))
}

/// The node of the record of (`name`, `key`).
fn record_path(cfg: &ZkConfig, name: &str, key: &str) -> String {
    format!("{}/{key}", folder(cfg, name))
}

/// The record of (`name`, `key`), none before its first run or once its keep time has passed.
/// A value that is not such a record is a configuration error (78).
pub async fn read(
    cfg: &ZkConfig,
    zk: &Zk,
    name: &str,
    key: &str,
) -> Result<Option<RunRecord>, Error> {
    Ok(load(cfg, zk, name, key)
        .await?
        .filter(|r| !r.expired(SystemTime::now())))
}

/// The record of (`name`, `key`), expired or not.
async fn load(cfg: &ZkConfig, zk: &Zk, name: &str, key: &str) -> Result<Option<RunRecord>, Error> {
    let at = record_path(cfg, name, key);
    let data = match client::answered(cfg, &at, zk.get_data(&at)).await? {
        Ok((data, _)) => data,
        Err(e) if e.is(Code::NO_NODE) => return Ok(None),
        Err(e) => return Err(client::failure(cfg, &at, &e)),
    };
    let record = RunRecord::parse(&data, name, key).map_err(|why| {
        Error::Config(format!(
            "run record {at} {why}: delete it by hand (zkCli.sh delete), or use another --once KEY"
        ))
    })?;
    Ok(Some(record))
}

/// Store `record` while the lock node `lock` still exists: one multi, the check first, then a
/// setData of the record's node, or its create when it is not there yet (its folder made when
/// missing). Then the sweep.
pub async fn write(
    cfg: &ZkConfig,
    zk: &Zk,
    lock: &str,
    record: &RunRecord,
) -> Result<Written, Error> {
    let at = record_path(cfg, &record.name, &record.key);
    let data = record.to_json();
    let mut create = false;
    for _ in 0..4 {
        match guarded(cfg, zk, lock, &at, &data, create).await? {
            Guarded::Applied => {
                sweep(cfg, zk, record).await;
                return Ok(Written::Stored);
            }
            Guarded::LockGone => {
                return Ok(Written::Refused(format!(
                    "lock node {lock} is gone: the session that held the lease has ended"
                )))
            }
            Guarded::NoParent => client::ensure_path(cfg, zk, &folder(cfg, &record.name)).await?,
            // Created or deleted by someone else in between: the other way.
            Guarded::Raced => create = !create,
        }
    }
    Err(Error::Unavailable(format!(
        "run record {at} kept changing under the write"
    )))
}

/// What a guarded multi did.
pub enum Guarded {
    Applied,
    /// The check on the lock node failed.
    LockGone,
    /// The second op failed: the node was there for a create, or not there for a setData.
    Raced,
    /// A create's parent is not there.
    NoParent,
}

/// The multi: check `lock`, then create or set `at` to `data`.
pub async fn guarded(
    cfg: &ZkConfig,
    zk: &Zk,
    lock: &str,
    at: &str,
    data: &[u8],
    create: bool,
) -> Result<Guarded, Error> {
    let write = match create {
        true => MultiOp::Create {
            path: at.to_owned(),
            data: data.to_vec(),
            acls: acls(cfg.has_identity()),
        },
        false => MultiOp::SetData {
            path: at.to_owned(),
            data: data.to_vec(),
        },
    };
    let multi = zk.multi(vec![MultiOp::Check(lock.to_owned()), write]);
    let (results, _) = bounded(cfg, at, cfg.conn.dial_timeout, multi).await?;
    let failed = results.iter().enumerate().find_map(|(i, r)| {
        r.err()
            .filter(|c| *c != Code::OK && *c != Code::RUNTIME_INCONSISTENCY)
            .map(|c| (i, c))
    });
    Ok(match failed {
        None => Guarded::Applied,
        Some((0, _)) => Guarded::LockGone,
        Some((_, Code::NODE_EXISTS)) => Guarded::Raced,
        Some((_, Code::NO_NODE)) if create => Guarded::NoParent,
        Some((_, Code::NO_NODE)) => Guarded::Raced,
        Some((_, code)) => return Err(client::failure(cfg, at, &ZkError::Server(code))),
    })
}

/// After `written` was stored: read a window of its name's other records and delete those that
/// the records show expired. Best effort: a failure leaves them for the next write.
async fn sweep(cfg: &ZkConfig, zk: &Zk, written: &RunRecord) {
    let Ok(mut keys) = children(cfg, zk, &folder(cfg, &written.name)).await else {
        return;
    };
    keys.retain(|k| *k != written.key);
    keys.sort_unstable();
    let start = (crate::files::random_u64() as usize)
        .checked_rem(keys.len())
        .unwrap_or(0);
    let window: Vec<&String> = keys
        .iter()
        .cycle()
        .skip(start)
        .take(keys.len().min(SWEEP_READS))
        .collect();
    let loads: Vec<_> = window
        .iter()
        .map(|k| load(cfg, zk, &written.name, k))
        .collect();
    let mut records = Vec::new();
    for (key, load) in window.into_iter().zip(loads) {
        if let Ok(Some(record)) = load.await {
            records.push((key.clone(), record));
        }
    }
    let expired = confirmed_expired(&records, unix_seconds(SystemTime::now()));
    let deletes: Vec<_> = expired
        .iter()
        .map(|key| zk.delete(&record_path(cfg, &written.name, key)))
        .collect();
    for delete in deletes {
        let _ = tokio::time::timeout(cfg.conn.dial_timeout, delete).await;
    }
}

/// At most `SWEEP_READS` records of `name` still kept, the last keys in order (a --once-per
/// slot's key is its time, so those are the newest), and what is at a record's place and is not
/// one.
pub async fn list(
    cfg: &ZkConfig,
    zk: &Zk,
    name: &str,
) -> Result<Vec<Result<RunRecord, Unreadable>>, Error> {
    let mut keys = children(cfg, zk, &folder(cfg, name)).await?;
    keys.sort_unstable_by(|a, b| b.cmp(a));
    keys.truncate(SWEEP_READS);
    let loads: Vec<_> = keys.iter().map(|k| read(cfg, zk, name, k)).collect();
    let mut out = Vec::new();
    for (key, load) in keys.iter().zip(loads) {
        match load.await {
            Ok(Some(r)) => out.push(Ok(r)),
            Ok(None) => {}
            Err(Error::Config(why)) => out.push(Err(Unreadable {
                key: key.clone(),
                why,
            })),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The names that have records.
pub async fn names(cfg: &ZkConfig, zk: &Zk) -> Result<Vec<String>, Error> {
    children(cfg, zk, &records_root(cfg)).await
}

/// The children of `path`; none when it does not exist.
pub async fn children(cfg: &ZkConfig, zk: &Zk, path: &str) -> Result<Vec<String>, Error> {
    match client::answered(cfg, path, zk.children(path)).await? {
        Ok((names, _)) => Ok(names),
        Err(e) if e.is(Code::NO_NODE) => Ok(Vec::new()),
        Err(e) => Err(client::failure(cfg, path, &e)),
    }
}
