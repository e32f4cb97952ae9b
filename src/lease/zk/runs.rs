//! Run records on ZooKeeper: one persistent node per (name, KEY), `ROOT/runs/NAME/KEY` (the root
//! being the prefix's path, `/leasewrap` by default),
//! holding the record's JSON. A record is written in one multi whose first op checks that the
//! writer's own lock node still exists, so a stale holder (its session expired, its node gone)
//! is refused. ZooKeeper deletes nothing by time here (TTL nodes need extendedTypesEnabled): a
//! record whose keep_until has passed counts as gone, as on the local backend.
//!
//! `runs` is a valid lease name, and so its lock parent is `ROOT/runs` too: the queue
//! counts only children named as lock nodes are (`_c_` + 32 hex digits + `-lock-` + sequence),
//! which no record folder of a real lease name is.

use std::time::SystemTime;

use zookeeper_client as zkc;

use super::client::{self, bounded};
use crate::config::ZkConfig;
use crate::error::Error;
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
    zk: &zkc::Client,
    name: &str,
    key: &str,
) -> Result<Option<RunRecord>, Error> {
    let at = record_path(cfg, name, key);
    let data = match bounded(cfg, cfg.conn.dial_timeout, zk.get_data(&at)).await {
        Ok((data, _)) => data,
        Err(_) if !exists(cfg, zk, &at).await? => return Ok(None),
        Err(e) => return Err(e),
    };
    let record = RunRecord::parse(&data, name, key).map_err(|why| {
        Error::Config(format!(
            "run record {at} {why}: delete it by hand (zkCli.sh delete), or use another --once KEY"
        ))
    })?;
    Ok(Some(record).filter(|r| !r.expired(SystemTime::now())))
}

async fn exists(cfg: &ZkConfig, zk: &zkc::Client, path: &str) -> Result<bool, Error> {
    Ok(bounded(cfg, cfg.conn.dial_timeout, zk.check_stat(path))
        .await?
        .is_some())
}

/// Store `record` while the lock node `lock` still exists: one multi, the check first, then a
/// setData of the record's node, or its create when it is not there yet.
pub async fn write(
    cfg: &ZkConfig,
    zk: &zkc::Client,
    lock: &str,
    record: &RunRecord,
) -> Result<Written, Error> {
    let at = record_path(cfg, &record.name, &record.key);
    client::ensure_path(cfg, zk, &folder(cfg, &record.name)).await?;
    let data = record.to_json();
    let create = !exists(cfg, zk, &at).await?;
    match guarded(cfg, zk, lock, &at, &data, create).await? {
        Guarded::Applied => Ok(Written::Stored),
        Guarded::LockGone => Ok(Written::Refused(format!(
            "lock node {lock} is gone: the session that held the lease has ended"
        ))),
        // Created or deleted by someone else in between: try the other way once.
        Guarded::Raced => match guarded(cfg, zk, lock, &at, &data, !create).await? {
            Guarded::Applied => Ok(Written::Stored),
            Guarded::LockGone => Ok(Written::Refused(format!("lock node {lock} is gone"))),
            Guarded::Raced => Err(Error::Unavailable(format!(
                "run record {at} kept changing under the write"
            ))),
        },
    }
}

/// What a guarded multi did.
pub enum Guarded {
    Applied,
    /// The check on the lock node failed.
    LockGone,
    /// The second op failed: the node was there for a create, or not there for a setData.
    Raced,
}

/// The multi: check `lock`, then create or set `at` to `data`.
pub async fn guarded(
    cfg: &ZkConfig,
    zk: &zkc::Client,
    lock: &str,
    at: &str,
    data: &[u8],
    create: bool,
) -> Result<Guarded, Error> {
    let bad = |e: zkc::Error| Error::Usage(format!("{at}: {e}"));
    let mut multi = zk.new_multi_writer();
    multi.add_check_version(lock, -1).map_err(bad)?;
    let persistent = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    match create {
        true => multi.add_create(at, data, &persistent).map_err(bad)?,
        false => multi.add_set_data(at, data, None).map_err(bad)?,
    }
    let within = cfg.conn.dial_timeout;
    match tokio::time::timeout(within, multi.commit()).await {
        Ok(Ok(_)) => Ok(Guarded::Applied),
        Ok(Err(zkc::MultiWriteError::OperationFailed { index: 0, .. })) => Ok(Guarded::LockGone),
        Ok(Err(zkc::MultiWriteError::OperationFailed {
            source: zkc::Error::NodeExists | zkc::Error::NoNode,
            ..
        })) => Ok(Guarded::Raced),
        Ok(Err(e)) => Err(client::failure(cfg, &e.into())),
        Err(_) => Err(Error::Unavailable(format!(
            "ZooKeeper at {}: no answer to a guarded write within {within:?}",
            cfg.connect
        ))),
    }
}

/// Every record of `name` still kept, and what is at a record's place and is not one.
pub async fn list(
    cfg: &ZkConfig,
    zk: &zkc::Client,
    name: &str,
) -> Result<Vec<Result<RunRecord, Unreadable>>, Error> {
    let keys = children(cfg, zk, &folder(cfg, name)).await?;
    let mut out = Vec::new();
    for key in keys {
        match read(cfg, zk, name, &key).await {
            Ok(Some(r)) => out.push(Ok(r)),
            Ok(None) => {}
            Err(Error::Config(why)) => out.push(Err(Unreadable { key, why })),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The names that have records.
pub async fn names(cfg: &ZkConfig, zk: &zkc::Client) -> Result<Vec<String>, Error> {
    children(cfg, zk, &records_root(cfg)).await
}

/// The children of `path`; none when it does not exist.
pub async fn children(cfg: &ZkConfig, zk: &zkc::Client, path: &str) -> Result<Vec<String>, Error> {
    match bounded(cfg, cfg.conn.dial_timeout, zk.list_children(path)).await {
        Ok(c) => Ok(c),
        Err(_) if !exists(cfg, zk, path).await? => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}
