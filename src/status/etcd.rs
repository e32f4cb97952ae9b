//! Status of etcd leases, in the mutex layout of `lease::etcd`: the keys `PREFIX NAME/<lease id
//! hex>`, the owner being the one with the lowest create revision. One range read gives every
//! name at one revision; one `LeaseTimeToLive` per held lease gives the time left.

use std::collections::BTreeMap;

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};

use super::{Holder, LeaseStatus};
use crate::config::EtcdConfig;
use crate::error::Error;
use crate::lease::etcd::client::Conn;

const BACKEND: &str = "etcd";

/// The lease `name`, or every lease under the prefix by name.
pub async fn leases(cfg: &EtcdConfig, name: Option<&str>) -> Result<Vec<LeaseStatus>, Error> {
    let conn = Conn::dial(cfg).await?;
    let range = match name {
        Some(n) => format!("{}{n}/", cfg.prefix),
        None => cfg.prefix.clone(),
    };
    let opts = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let resp = conn
        .retrying(|mut c| {
            let (range, opts) = (range.clone(), opts.clone());
            async move { c.get(range, Some(opts)).await }
        })
        .await?;
    // Sorted by create revision, so the first key seen of a name is its owner.
    let mut queues: BTreeMap<&str, (&KeyValue, u64)> = BTreeMap::new();
    for kv in resp.kvs() {
        if let Some(n) = lease_name(&cfg.prefix, kv.key()) {
            queues.entry(n).or_insert((kv, 0)).1 += 1;
        }
    }
    let mut out = Vec::with_capacity(queues.len().max(1));
    for (n, (owner, keys)) in &queues {
        out.push(held(&conn, n, owner, keys - 1).await?);
    }
    if let (Some(n), true) = (name, out.is_empty()) {
        out.push(LeaseStatus::free(n, BACKEND));
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

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
