//! Leases: taking one, keeping it, and giving it back, on any backend ([`backend`] says how). Knows nothing of
//! processes: while a lease is held it reports new deadlines and loss as [`LeaseEvent`]s, and the
//! run loop passes them on to the watchdog.

pub mod backend;
pub mod db;
pub mod etcd;
pub mod keeper;
pub mod local;
pub mod report;
pub mod timing;
pub mod zk;

use std::time::Duration;

use crate::clock::BootInstant;
use crate::error::Error;
use crate::runs::{RunRecord, Written};

/// What a held lease has to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// A renewal moved `D` to this instant.
    Renewed(BootInstant),
    /// Renewals started failing, for this reason; `D` (the latest, which may have moved just
    /// before) is not moving until they recover.
    Trouble(String, BootInstant),
    /// The lease is gone, for this reason: stop the child now, and kill it by `D` at the latest
    /// (which may have come down with the loss; none where the lease cannot lapse).
    Lost(LossReason, Option<BootInstant>),
}

/// Why a held lease is gone, as etcd's `ErrSessionExpired` names its one reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// etcd answered a keepalive with TTL 0: the lease expired or was revoked.
    Expired,
    /// The stop time came before a renewal did.
    NotRenewed,
    /// The watchdog reached `D - kill_after` with no renewal passed on to it.
    DeadlinePassed,
    /// A renewal granted this TTL (seconds), which the timing rules cannot work with.
    TtlDoesNotFit(i64),
    /// The own lock key was deleted.
    KeyDeleted(String),
    /// The own lock key now belongs to another holder (another create revision).
    KeyReplaced(String),
    /// A read found the own lock key missing.
    KeyGone(String),
    /// The local lock file was deleted or replaced; the text says how.
    LockFile(String),
    /// ZooKeeper says the session has expired or was closed.
    SessionExpired,
    /// A reconnect negotiated a shorter session timeout than the one the rule counts with.
    TimeoutShortened(Duration),
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::Expired => f.write_str("etcd says the lease has expired (TTL 0)"),
            LossReason::NotRenewed => f.write_str("no renewal succeeded before the stop time"),
            LossReason::DeadlinePassed => f.write_str("no renewal came before the deadline"),
            LossReason::TtlDoesNotFit(ttl) => write!(
                f,
                "etcd renewed the lease with TTL {ttl}s, too short for the timing rules"
            ),
            LossReason::KeyDeleted(key) => write!(f, "lock key {key} was deleted"),
            LossReason::KeyReplaced(key) => write!(f, "lock key {key} was replaced"),
            LossReason::KeyGone(key) => write!(f, "lock key {key} is gone"),
            LossReason::LockFile(why) => f.write_str(why),
            LossReason::SessionExpired => f.write_str("ZooKeeper says the session has expired"),
            LossReason::TimeoutShortened(t) => write!(
                f,
                "ZooKeeper renegotiated a shorter session timeout ({} ms) on reconnecting",
                t.as_millis()
            ),
        }
    }
}

/// A lease that is ours.
pub struct Held {
    /// Fencing token: grows with every new holder.
    pub token: u64,
    /// The lock key (etcd), lock node (ZooKeeper) or lock file path (local).
    pub key: String,
    /// etcd lease id; none on the other backends.
    pub lease_id: Option<i64>,
    /// `D` at the moment of acquiring; none when the lease cannot lapse while we live.
    pub deadline: Option<BootInstant>,
    /// Time between the stop signal and SIGKILL, for the TTL granted (etcd may grant more).
    pub kill_after: Duration,
    /// The backend's side of it.
    inner: Box<dyn backend::Lease>,
}

impl Held {
    /// A lease of a backend's, with what the run loop reads of it.
    pub fn new(
        token: u64,
        key: String,
        lease_id: Option<i64>,
        deadline: Option<BootInstant>,
        kill_after: Duration,
        inner: Box<dyn backend::Lease>,
    ) -> Held {
        Held {
            token,
            key,
            lease_id,
            deadline,
            kill_after,
            inner,
        }
    }

    /// What the watchdog must hold open while the child's tree lives: the local lock file, whose
    /// lock the kernel would otherwise hand on the moment leasewrap dies.
    pub fn keep_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.keep_fd()
    }

    /// The next renewal or loss. Cancel-safe.
    pub async fn next_event(&mut self) -> LeaseEvent {
        self.inner.next_event().await
    }

    /// Give the lease back at once, so the next holder need not wait for a TTL.
    pub async fn release(self) {
        self.inner.release().await;
    }

    /// The run record of (`name`, `key`), as it was when the lease became ours where the
    /// backend read it along.
    pub async fn read_record(&self, name: &str, key: &str) -> Result<Option<RunRecord>, Error> {
        self.inner.read_record(name, key).await
    }

    /// The child is starting; its run will be recorded, kept for `keep`.
    pub fn child_started(&mut self, keep: Duration) {
        self.inner.child_started(keep);
    }

    /// Store `record` under the fencing token.
    pub async fn write_record(
        &mut self,
        record: &RunRecord,
        keep: Duration,
    ) -> Result<Written, Error> {
        self.inner.write_record(record, keep).await
    }

    /// No record will be written after all.
    pub fn record_unused(&mut self) {
        self.inner.record_unused();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_reasons_name_what_happened() {
        let key = "lw/job/1f".to_owned();
        let cases = [
            (LossReason::Expired, "expired (TTL 0)"),
            (LossReason::NotRenewed, "before the stop time"),
            (LossReason::TtlDoesNotFit(1), "TTL 1s"),
            (LossReason::KeyDeleted(key.clone()), "lw/job/1f was deleted"),
            (
                LossReason::KeyReplaced(key.clone()),
                "lw/job/1f was replaced",
            ),
            (LossReason::KeyGone(key), "lw/job/1f is gone"),
            (
                LossReason::LockFile("lock file replaced".into()),
                "lock file replaced",
            ),
            (LossReason::SessionExpired, "session has expired"),
            (
                LossReason::TimeoutShortened(Duration::from_millis(2_400)),
                "shorter session timeout (2400 ms)",
            ),
        ];
        for (reason, says) in cases {
            assert!(reason.to_string().contains(says), "{reason}");
        }
    }
}
