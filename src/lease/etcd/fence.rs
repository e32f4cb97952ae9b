//! `fenced-put` on etcd: one transaction, the put only if the lock key's create revision is
//! still the token; otherwise the lock key's current state, for the message. Keys that are
//! leasewrap's own (run records, lock queues) are never written.

use etcd_client::TxnOp;

use super::client::{guarded_txn, Conn, Guarded};
use crate::config::{self, EtcdConfig};
use crate::error::Error;
use crate::lease::backend::{self, Boxed, GuardedPut};

/// etcd, for guarded puts.
pub struct Fence<'a> {
    cfg: &'a EtcdConfig,
}

impl<'a> Fence<'a> {
    pub fn new(cfg: &'a EtcdConfig) -> Self {
        Fence { cfg }
    }
}

impl backend::Fence for Fence<'_> {
    fn put<'a>(&'a self, put: &'a GuardedPut<'a>) -> Boxed<'a, Result<(), Error>> {
        Box::pin(async move {
            let revision = i64::try_from(put.token).map_err(|_| {
                Error::Usage(format!("--token {} is beyond any etcd revision", put.token))
            })?;
            reserved(put.key, put.lock_key, &self.cfg.prefix).map_err(Error::Usage)?;
            let op = TxnOp::put(put.key, put.value, None);
            let conn = Conn::dial(self.cfg).await?;
            match guarded_txn(&conn, put.lock_key, revision, vec![op]).await? {
                Guarded::Applied(_) => Ok(()),
                Guarded::Refused { create_revision } => Err(Error::StaleToken {
                    given: put.token,
                    seen: lock_key_state(put.lock_key, create_revision),
                }),
            }
        })
    }
}

/// Why fenced-put must not write `key`, if it must not: it is leasewrap's own. Under the
/// prefix's run records (`PREFIX/runs/`) a put would forge another job's record, which only
/// leasewrap writes, under the lease of the record's NAME; under a lock's queue (`PREFIX NAME/`)
/// a key without a lease would take part in that mutex and hold it for ever once it came first.
/// The own queue is known from the lock key (`PREFIX NAME/<lease id hex>`) and always refused;
/// any other queue only under a non-empty prefix, since with `--prefix ''` every `a/b` key of
/// other applications looks like one.
fn reserved(key: &str, lock_key: &str, prefix: &str) -> Result<(), String> {
    let records = super::runs::records_prefix(prefix);
    if key.starts_with(&records) {
        return Err(format!(
            "fenced-put does not write {key:?}: keys under {records:?} are leasewrap's run records, written only under the lease of their own NAME"
        ));
    }
    let own_queue = lock_key
        .rsplit_once('/')
        .filter(|(_, id)| {
            !id.is_empty() && id.len() <= 16 && id.bytes().all(|b| b.is_ascii_hexdigit())
        })
        .map(|(queue, _)| format!("{queue}/"));
    let in_a_queue = !prefix.is_empty()
        && key
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(name, _)| config::check_name(name).is_ok());
    if in_a_queue || own_queue.is_some_and(|q| key.starts_with(&q)) {
        return Err(format!(
            "fenced-put does not write {key:?}: it is under a lock's queue (PREFIX NAME/), where any key takes part in the lock; write outside the prefix {prefix:?}"
        ));
    }
    Ok(())
}

/// What a refused fenced-put found at the lock key: another holder's key, or none.
fn lock_key_state(lock_key: &str, create_revision: Option<i64>) -> String {
    match create_revision {
        Some(rev) => format!("lock key {lock_key} has create revision {rev} (another holder)"),
        None => format!("lock key {lock_key} does not exist (its lease has ended)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_put_refuses_run_records_and_lock_queues_only() {
        let lock = "leasewrap/job/694d8a1c2b";
        for refused in [
            "leasewrap//runs/other/k",
            "leasewrap//runs/job/k",
            "leasewrap/job/694d8a1c2b",
            "leasewrap/job/x",
            "leasewrap/other/1f",
        ] {
            assert!(reserved(refused, lock, "leasewrap/").is_err(), "{refused}");
        }
        for allowed in ["app/config", "leasewrap/notes", "leasewrap", "t/data"] {
            assert_eq!(reserved(allowed, lock, "leasewrap/"), Ok(()), "{allowed}");
        }
        // With --prefix '' only the records and the own queue are known to be leasewrap's.
        let lock = "job/694d8a1c2b";
        assert!(reserved("/runs/job/k", lock, "").is_err());
        assert!(reserved("job/data", lock, "").is_err());
        assert_eq!(reserved("app/config", lock, ""), Ok(()));
        // A lock key not in the mutex layout has no queue to protect.
        assert_eq!(reserved("t/1/data", "t/1/lock", "leasewrap/"), Ok(()));
    }

    #[test]
    fn a_refused_put_says_what_the_lock_key_holds() {
        let s = lock_key_state("leasewrap/job/694d", Some(9));
        assert!(s.contains("create revision 9"), "{s}");
        let s = lock_key_state("leasewrap/job/694d", None);
        assert!(s.contains("does not exist"), "{s}");
    }
}
