//! etcd as `status` reads it ([`Reader`]). Status of etcd leases, in the mutex layout of `lease::etcd`: the keys `PREFIX NAME/<lease id
//! hex>`, the owner being the one with the lowest create revision. One range read gives every
//! name at one revision; one `LeaseTimeToLive` per held lease gives the time left.

use std::collections::BTreeMap;

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};

use crate::config::EtcdConfig;
use crate::error::Error;
use crate::lease::report::{Holder, LeaseStatus};
use tokio::sync::OnceCell;

use super::client::Conn;
use super::runs;
use crate::lease::backend::{self, Boxed};
use crate::runs::{RunRecord, Unreadable};

const BACKEND: &str = "etcd";

/// The lease `name`, or every lease under the prefix by name.
async fn leases(
    conn: &Conn,
    cfg: &EtcdConfig,
    name: Option<&str>,
) -> Result<Vec<LeaseStatus>, Error> {
    let txn = Txn::new().and_then(lock_ranges(&cfg.prefix, name));
    let resp = conn
        .retrying(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await?;
    let ranges = resp.op_responses();
    let kvs: Vec<&KeyValue> = ranges
        .iter()
        .flat_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs(),
            _ => &[],
        })
        .collect();
    // Each range sorted by create revision, and a name's keys all in one range, so the first
    // key seen of a name is its owner.
    let mut queues: BTreeMap<&str, (&KeyValue, u64)> = BTreeMap::new();
    for kv in kvs {
        if let Some(n) = lease_name(&cfg.prefix, kv.key()) {
            queues.entry(n).or_insert((kv, 0)).1 += 1;
        }
    }
    let mut out = Vec::with_capacity(queues.len().max(1));
    for (n, (owner, keys)) in &queues {
        out.push(held(conn, n, owner, keys - 1).await?);
    }
    if let (Some(n), true) = (name, out.is_empty()) {
        out.push(LeaseStatus::free(n, BACKEND));
    }
    Ok(out)
}

/// The ranges that hold the lock keys of `name`, or of every name, each sorted by create
/// revision: every name's queue `PREFIX NAME/` lies below `PREFIX /` or from `PREFIX 0` on (a name
/// has no '/'), so the run records under `PREFIX/runs/`, thousands per name, are never read.
fn lock_ranges(prefix: &str, name: Option<&str>) -> Vec<TxnOp> {
    let sorted = || GetOptions::new().with_sort(SortTarget::Create, SortOrder::Ascend);
    if let Some(n) = name {
        return vec![TxnOp::get(
            format!("{prefix}{n}/"),
            Some(sorted().with_prefix()),
        )];
    }
    // etcd takes no empty key: "\0" is the first key there is.
    let start = if prefix.is_empty() { "\0" } else { prefix };
    let records = format!("{prefix}/");
    let after = format!("{prefix}0");
    vec![
        TxnOp::get(start, Some(sorted().with_range(records))),
        TxnOp::get(after, Some(sorted().with_range(prefix_end(prefix)))),
    ]
}

/// The end of the range of every key that starts with `prefix` ("\0", every key, for '').
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The lease name of a lock key `PREFIX NAME/<hex>`; none for any other key under the prefix.
fn lease_name<'a>(prefix: &str, key: &'a [u8]) -> Option<&'a str> {
    let rest = std::str::from_utf8(key).ok()?.strip_prefix(prefix)?;
    let (name, id) = rest.split_once('/')?;
    let hex = !id.is_empty() && id.len() <= 16 && id.chars().all(|c| c.is_ascii_hexdigit());
    (!name.is_empty() && hex).then_some(name)
}

async fn held(
    conn: &Conn,
    name: &str,
    owner: &KeyValue,
    waiters: u64,
) -> Result<LeaseStatus, Error> {
    let (time_left_s, ttl_s) = match owner.lease() {
        // A key put without a lease stays until someone deletes it.
        0 => (None, None),
        id => {
            let ttl = conn
                .retrying(|mut c| async move { c.lease_time_to_live(id, None).await })
                .await?;
            // -1: the lease expired since the read; its key is gone with it.
            (Some(ttl.ttl().max(0)), Some(ttl.granted_ttl()))
        }
    };
    Ok(LeaseStatus {
        held: true,
        holder: Holder::parse(owner.value()),
        token: Some(owner.create_revision() as u64),
        time_left_s,
        ttl_s,
        waiters: Some(waiters),
        key: Some(String::from_utf8_lossy(owner.key()).into_owned()),
        ..LeaseStatus::free(name, BACKEND)
    })
}

/// etcd as `status` reads it: one client for every read of a listing, dialled at the first.
pub struct Reader<'a> {
    cfg: &'a EtcdConfig,
    conn: OnceCell<Conn>,
}

impl<'a> Reader<'a> {
    pub fn new(cfg: &'a EtcdConfig) -> Self {
        Reader {
            cfg,
            conn: OnceCell::new(),
        }
    }

    async fn conn(&self) -> Result<&Conn, Error> {
        self.conn.get_or_try_init(|| Conn::dial(self.cfg)).await
    }
}

impl backend::Reader for Reader<'_> {
    fn label(&self) -> &'static str {
        BACKEND
    }

    fn leases<'a>(&'a self, name: Option<&'a str>) -> Boxed<'a, Result<Vec<LeaseStatus>, Error>> {
        Box::pin(async move { leases(self.conn().await?, self.cfg, name).await })
    }

    fn runs<'a>(
        &'a self,
        name: &'a str,
        last: usize,
    ) -> Boxed<'a, Result<Vec<Result<RunRecord, Unreadable>>, Error>> {
        Box::pin(async move { runs::list(self.conn().await?, &self.cfg.prefix, name, last).await })
    }

    fn run<'a>(
        &'a self,
        name: &'a str,
        key: &'a str,
    ) -> Boxed<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move { runs::read(self.conn().await?, &self.cfg.prefix, name, key).await })
    }

    fn names(&self) -> Boxed<'_, Result<Vec<String>, Error>> {
        Box::pin(async move { runs::names(self.conn().await?, &self.cfg.prefix).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_ranges_cover_every_queue_and_leave_out_the_run_records() {
        assert_eq!(prefix_end("lw/"), b"lw0");
        assert_eq!(prefix_end(""), b"\0");
        // Every first character of a name falls in one of the two ranges, never between them.
        let (below, from) = ('/', '0');
        for c in (0u8..128)
            .map(char::from)
            .filter(|c| crate::config::check_name(&c.to_string()).is_ok())
        {
            assert!(c < below || c >= from, "{c:?}");
        }
    }

    #[test]
    fn lock_keys_name_their_lease_and_other_keys_are_skipped() {
        assert_eq!(lease_name("lw/", b"lw/report/694d8a1c2b"), Some("report"));
        assert_eq!(lease_name("", b"report/694d8a1c2b"), Some("report"));
        for other in [
            &b"lw/report"[..],
            b"lw/report/",
            b"lw/report/not-hex",
            b"lw/a/b/c",
            b"lw//1f",
            b"other/report/1f",
            b"lw/report/11112222333344445",
        ] {
            assert_eq!(lease_name("lw/", other), None, "{other:?}");
        }
    }
}
