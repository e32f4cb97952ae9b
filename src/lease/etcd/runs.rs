//! Run records on etcd: one key per (name, KEY), `PREFIX/runs/NAME/KEY`. Its first segment after
//! the prefix is empty, a name no lease can have, so the key is never under a lock's queue prefix
//! `PREFIX NAME/` (any key there would take part in the mutex). With `--prefix ''` that is
//! `/runs/NAME/KEY`, which `etcdctl lock` touches only for a lock name starting with `/runs/`.
//!
//! A record is put in one transaction guarded by the writer's own lock key: it succeeds only
//! while that key still has the writer's fencing token as its create revision, so a stale holder
//! is refused. Each record is attached to a lease of its own with TTL --keep, granted or renewed
//! as the record is written: etcd deletes it --keep after the run's end, and nothing else ever
//! deletes one.

use std::time::Duration;

use etcd_client::{
    GetOptions, PutOptions, SortOrder, SortTarget, TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::task::JoinHandle;

use super::client::{guarded_txn, Conn, Guarded};
use crate::error::Error;
use crate::runs::{RunRecord, Unreadable, Written};

/// Where the records of every name live.
pub fn records_prefix(prefix: &str) -> String {
    format!("{prefix}/runs/")
}

/// Where the records of `name` live.
pub fn name_prefix(prefix: &str, name: &str) -> String {
    format!("{}{name}/", records_prefix(prefix))
}

/// The key of the record of (`name`, `key`).
pub fn record_key(prefix: &str, name: &str, key: &str) -> String {
    format!("{}{key}", name_prefix(prefix, name))
}

/// The record of (`name`, `key`), none before its first run. A value that is not such a record
/// is a configuration error (78): it is never taken for "done".
pub async fn read(
    conn: &Conn,
    prefix: &str,
    name: &str,
    key: &str,
) -> Result<Option<RunRecord>, Error> {
    let at = record_key(prefix, name, key);
    let resp = conn
        .retrying(|mut c| {
            let at = at.clone();
            async move { c.get(at, None).await }
        })
        .await?;
    parse(prefix, name, key, resp.kvs().first().map(|kv| kv.value()))
}

/// The record of (`name`, `key`) in `value`, read at its key; none before its first run.
pub fn parse(
    prefix: &str,
    name: &str,
    key: &str,
    value: Option<&[u8]>,
) -> Result<Option<RunRecord>, Error> {
    value
        .map(|v| RunRecord::parse(v, name, key))
        .transpose()
        .map_err(|why| {
            let at = record_key(prefix, name, key);
            Error::Config(format!(
                "run record {at} {why}: delete it by hand (etcdctl del), or use another --once KEY"
            ))
        })
}

/// The lease a run's record will be attached to, asked for while the child runs, so that
/// recording the run needs no grant after it ends. It is renewed as the record is written, so
/// that --keep counts from the end of the run, not from the start of the child.
pub struct RecordLease(JoinHandle<Result<i64, Error>>);

impl RecordLease {
    /// Ask etcd for a lease of TTL `keep`, in the background.
    pub fn ask(conn: &Conn, keep: Duration) -> RecordLease {
        let conn = conn.clone();
        RecordLease(tokio::spawn(async move { grant(&conn, keep).await }))
    }

    /// The lease's id, if the early request got one.
    async fn granted(self) -> Option<i64> {
        self.0.await.ok()?.ok()
    }

    /// Not needed after all (a lost run records nothing). Nothing waits for etcd on that path:
    /// a lease already granted has no key and runs out by its TTL.
    pub fn drop_unused(self) {
        self.0.abort();
    }
}

/// A lease of TTL `keep` (whole seconds, rounded up).
async fn grant(conn: &Conn, keep: Duration) -> Result<i64, Error> {
    let ttl = keep.as_secs_f64().ceil().max(1.0) as i64;
    let grant = conn
        .retrying(|mut c| async move { c.lease_grant(ttl, None).await })
        .await?;
    Ok(grant.id())
}

/// Renew lease `id` to its full TTL from now; false when it has run out (a child that ran
/// longer than --keep) or etcd did not say.
async fn renew(conn: &Conn, id: i64) -> bool {
    conn.retrying(|mut c| async move { c.lease_keep_alive(id).await.map(drop) })
        .await
        .is_ok()
}

/// Store `record` under the fencing token: only while `lock` (key, token) still has the token
/// as its create revision, attached to a lease that --keep counts from now. The early `lease`
/// is renewed in the same moment as the guarded put is sent, so neither waits for the other: a
/// lease alive when its renewal arrives was alive when the put arrived, whichever came first.
/// Only when it had run out is a new lease granted, and the record put again. The lease of the
/// record it replaces, or the one refused, is revoked.
pub async fn write(
    conn: &Conn,
    prefix: &str,
    lock: (&str, u64),
    record: &RunRecord,
    lease: RecordLease,
    keep: Duration,
) -> Result<Written, Error> {
    let mut replaced = None;
    if let Some(id) = lease.granted().await {
        let (alive, put) = tokio::join!(renew(conn, id), put(conn, prefix, lock, record, id));
        match put {
            Ok(put @ Guarded::Refused { .. }) => return settle(conn, lock, put, id, None).await,
            Ok(put) if alive => return settle(conn, lock, put, id, None).await,
            Err(e) if alive => return Err(e),
            // The lease ran out (the child ran longer than --keep): the put failed, or its
            // record goes with the lease; what it replaced is still to be revoked.
            Ok(Guarded::Applied(resp)) => replaced = previous_lease(&resp),
            Err(_) => {}
        }
    }
    let id = grant(conn, keep).await?;
    let put = put(conn, prefix, lock, record, id).await?;
    settle(conn, lock, put, id, replaced).await
}

/// The guarded put of `record` on lease `id`, reading the record it replaces.
async fn put(
    conn: &Conn,
    prefix: &str,
    (lock_key, token): (&str, u64),
    record: &RunRecord,
    id: i64,
) -> Result<Guarded, Error> {
    let at = record_key(prefix, &record.name, &record.key);
    let put = PutOptions::new().with_lease(id);
    let ops = vec![
        TxnOp::get(at.clone(), None),
        TxnOp::put(at, record.to_json(), Some(put)),
    ];
    guarded_txn(conn, lock_key, token as i64, ops).await
}

/// What the guarded put did: on success the replaced record's lease (`replaced` when an earlier
/// put replaced it) is revoked; when refused, `id` is.
async fn settle(
    conn: &Conn,
    (lock_key, token): (&str, u64),
    put: Guarded,
    id: i64,
    replaced: Option<i64>,
) -> Result<Written, Error> {
    match put {
        Guarded::Applied(resp) => {
            if let Some(old) = replaced.or_else(|| previous_lease(&resp)) {
                revoke(conn, old).await;
            }
            Ok(Written::Stored)
        }
        Guarded::Refused { create_revision } => {
            revoke(conn, id).await;
            let now = create_revision.map_or("none".into(), |r| r.to_string());
            Ok(Written::Refused(format!(
                "lock key {lock_key} has create revision {now}, not {token}: another holder owns the lease"
            )))
        }
    }
}

/// The lease of the record that the guarded put replaced, if it had one.
fn previous_lease(resp: &TxnResponse) -> Option<i64> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()).filter(|&l| l != 0),
        _ => None,
    })
}

/// Give back a lease nothing needs; failing that, it runs out by its TTL (--keep) alone.
async fn revoke(conn: &Conn, id: i64) {
    let revoked = conn
        .retrying(|mut c| async move { c.lease_revoke(id).await })
        .await;
    if let Err(e) = revoked {
        tracing::debug!(lease = format!("{id:x}"), error = %e, "revoking an unused record lease failed");
    }
}

/// The `last` records of `name` written most recently, and the values among them that are not
/// records (with why), for `status`: one sorted, limited range, so that a name with thousands
/// of records (`--once-per 1m` keeps ten thousand a week) costs what one with ten does.
pub async fn list(
    conn: &Conn,
    prefix: &str,
    name: &str,
    last: usize,
) -> Result<Vec<Result<RunRecord, Unreadable>>, Error> {
    let under = name_prefix(prefix, name);
    let newest = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Mod, SortOrder::Descend)
        .with_limit(last as i64);
    let resp = conn
        .retrying(|mut c| {
            let (under, newest) = (under.clone(), newest.clone());
            async move { c.get(under, Some(newest)).await }
        })
        .await?;
    Ok(resp
        .kvs()
        .iter()
        .map(|kv| {
            let at = String::from_utf8_lossy(kv.key()).into_owned();
            let key = at.strip_prefix(&under).unwrap_or(&at);
            RunRecord::parse(kv.value(), name, key).map_err(|why| Unreadable {
                key: key.to_owned(),
                why: format!("run record {at} {why}"),
            })
        })
        .collect())
}

/// The names that have records under `prefix`, for a `status` listing: one keys-only read of one
/// key per name, each starting past the last name's records (`NAME/` ends in `/`, and `0` is the
/// byte after it), so that a name's thousands of records cost what one does.
pub async fn names(conn: &Conn, prefix: &str) -> Result<Vec<String>, Error> {
    let under = format!("{prefix}/runs/");
    let end = format!("{prefix}/runs0");
    let mut names = Vec::new();
    let mut from = under.clone();
    loop {
        let opts = GetOptions::new()
            .with_range(end.as_str())
            .with_keys_only()
            .with_limit(1);
        let resp = conn
            .retrying(|mut c| {
                let (from, opts) = (from.clone(), opts.clone());
                async move { c.get(from, Some(opts)).await }
            })
            .await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(names);
        };
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let rest = key.strip_prefix(&under).unwrap_or_default();
        match rest.split_once('/') {
            Some((name, _)) => {
                from = format!("{under}{name}0");
                names.push(name.to_owned());
            }
            // Not a record's key (no KEY after the name): look on past it.
            None => from = format!("{key}\0"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_never_under_a_locks_queue_prefix() {
        for prefix in ["leasewrap/", "", "lw"] {
            let at = record_key(prefix, "nightly", "2026-12-01T00:00:00Z");
            // A lock's queue is PREFIX NAME/ for a valid (non-empty, '/'-free) NAME.
            let rest = at.strip_prefix(prefix).unwrap();
            let (first, _) = rest.split_once('/').unwrap();
            assert!(crate::config::check_name(first).is_err(), "{at}");
        }
        assert_eq!(
            record_key("leasewrap/", "nightly", "k"),
            "leasewrap//runs/nightly/k"
        );
    }
}
