//! Leases: taking one, keeping it, and giving it back, on either backend. Knows nothing of
//! processes: while a lease is held it reports new deadlines and loss as [`LeaseEvent`]s, and the
//! run loop passes them on to the watchdog.

pub mod etcd;
pub mod local;
pub mod timing;

use std::time::Duration;

use tokio::time::{interval, Interval, MissedTickBehavior};

use crate::clock::BootInstant;
use crate::config::{Backend, Config};
use crate::error::Error;

/// What a held lease has to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// A renewal moved `D` to this instant.
    Renewed(BootInstant),
    /// Renewals started failing, for this reason; `D` (the latest, which may have moved just
    /// before) is not moving until they recover.
    Trouble(String, BootInstant),
    /// The lease is gone, for this reason: stop the child now.
    Lost(LossReason),
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
            LossReason::NotRenewed => f.write_str("no keepalive reply came before the stop time"),
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

/// A connection to the backend, before and while taking a lease.
pub enum Lessor {
    Local {
        dir: std::path::PathBuf,
        /// The timing of the TTL asked for, which on this backend is the one in force.
        timing: timing::Effective,
    },
    Etcd(Box<etcd::Etcd>),
}

/// A lease that is ours.
pub struct Held {
    /// Fencing token: grows with every new holder.
    pub token: u64,
    /// The lock key (etcd) or lock file path (local).
    pub key: String,
    /// etcd lease id; none on the local backend.
    pub lease_id: Option<i64>,
    /// `D` at the moment of acquiring; none when the lease cannot lapse while we live.
    pub deadline: Option<BootInstant>,
    /// Time between the stop signal and SIGKILL, for the TTL granted (etcd may grant more).
    pub kill_after: Duration,
    /// Backend-specific state.
    inner: HeldInner,
}

enum HeldInner {
    Local {
        lock: local::LocalLock,
        /// How often the lock file's identity is checked: the renewal period.
        every: Duration,
        /// That schedule, from the first wait for an event (the lock may be taken before the
        /// runtime exists).
        check: Option<Interval>,
    },
    Etcd(Box<etcd::EtcdHeld>),
}

impl Lessor {
    /// Prepare the backend `cfg` names. The local backend needs nothing; etcd is dialled.
    pub async fn connect(cfg: &Config) -> Result<Self, Error> {
        match &cfg.backend {
            Backend::Local { dir } => Ok(Lessor::Local {
                dir: dir.clone(),
                timing: local_timing(cfg)?,
            }),
            Backend::Etcd(e) => Ok(Lessor::Etcd(Box::new(
                etcd::Etcd::connect(e, cfg.params).await?,
            ))),
        }
    }

    /// Take the lease named `name`, waiting for it unless `block` is false; `record` says who
    /// holds it. Dropping this future part-way is allowed; call [`Lessor::abandon`] afterwards.
    pub async fn acquire(&mut self, name: &str, record: &[u8], block: bool) -> Result<Held, Error> {
        match self {
            Lessor::Etcd(etcd) => {
                let held = etcd.acquire(name, record, block).await?;
                Ok(Held {
                    token: held.token(),
                    key: held.key().to_owned(),
                    lease_id: Some(held.lease_id()),
                    deadline: Some(held.deadline()),
                    kill_after: held.kill_after(),
                    inner: HeldInner::Etcd(Box::new(held)),
                })
            }
            Lessor::Local { dir, timing } => {
                let lock = local::acquire(dir, name, block).await?;
                Ok(Held::local(lock, timing, record))
            }
        }
    }

    /// On etcd, read `key` in the transactions that take the lease and confirm it ours
    /// ([`Held::along`]); the local backend reads nothing along.
    pub fn read_along(&mut self, key: Option<String>) {
        if let (Lessor::Etcd(etcd), Some(key)) = (self, key) {
            etcd.read_along(key);
        }
    }

    /// Undo what an abandoned [`Lessor::acquire`] left behind (a queued waiter's key and lease).
    pub async fn abandon(&mut self) {
        if let Lessor::Etcd(etcd) = self {
            etcd.abandon().await;
        }
    }
}

/// The local backend's first log line, which says that no endpoints were configured.
pub fn announce(cfg: &Config) {
    if let Backend::Local { dir } = &cfg.backend {
        tracing::info!(dir = %dir.display(), "using the local backend (no etcd endpoints configured)");
    }
}

/// The timing of the TTL asked for, which on the local backend is the one in force.
fn local_timing(cfg: &Config) -> Result<timing::Effective, Error> {
    cfg.params
        .effective(cfg.params.ttl)
        .map_err(|e| Error::Usage(e.to_string()))
}

impl Held {
    /// The local lock of `cfg`, if it is free at this moment: taken without waiting and without
    /// a runtime, so that the child can start before the runtime does. `None` when another
    /// process holds it, or on etcd; then [`Lessor::acquire`] takes the lease.
    pub fn take_local_now(cfg: &Config, record: &[u8]) -> Result<Option<Held>, Error> {
        let Backend::Local { dir } = &cfg.backend else {
            return Ok(None);
        };
        let timing = local_timing(cfg)?;
        let lock = local::try_acquire(dir, &cfg.name)?;
        Ok(lock.map(|lock| Held::local(lock, &timing, record)))
    }

    fn local(mut lock: local::LocalLock, timing: &timing::Effective, record: &[u8]) -> Held {
        lock.record_holder(record);
        Held {
            token: lock.token,
            key: lock.path().display().to_string(),
            lease_id: None,
            deadline: None,
            kill_after: timing.kill_after,
            inner: HeldInner::Local {
                lock,
                every: local::LocalLock::check_every(timing.ttl),
                check: None,
            },
        }
    }

    /// The etcd connection of this lease, for writes guarded by its lock key; none on local.
    pub fn etcd_conn(&self) -> Option<&etcd::client::Conn> {
        match &self.inner {
            HeldInner::Etcd(held) => Some(held.conn()),
            HeldInner::Local { .. } => None,
        }
    }

    /// The value of the key [`Lessor::read_along`] named, as it was when the lease became ours
    /// (none inside: not there); none when no key was read along.
    pub fn along(&self) -> Option<Option<&[u8]>> {
        match &self.inner {
            HeldInner::Etcd(held) => held.along(),
            HeldInner::Local { .. } => None,
        }
    }

    /// Why the local lock is no longer ours, if its file was removed or replaced. etcd's check
    /// is the guard of the transaction that writes under the token.
    pub fn local_check(&self) -> Result<(), String> {
        match &self.inner {
            HeldInner::Local { lock, .. } => lock.check().map_or(Ok(()), Err),
            HeldInner::Etcd(_) => Ok(()),
        }
    }

    /// What the watchdog must hold open while the child's tree lives: the local lock file, whose
    /// lock the kernel would otherwise hand on the moment leasewrap dies.
    pub fn keep_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        match &self.inner {
            HeldInner::Local { lock, .. } => Some(lock.fd()),
            HeldInner::Etcd(_) => None,
        }
    }

    /// The next renewal or loss. Cancel-safe.
    pub async fn next_event(&mut self) -> LeaseEvent {
        match &mut self.inner {
            HeldInner::Local { lock, every, check } => loop {
                let check = check.get_or_insert_with(|| {
                    let mut check = interval(*every);
                    check.set_missed_tick_behavior(MissedTickBehavior::Delay);
                    check.reset();
                    check
                });
                check.tick().await;
                if let Some(why) = lock.check() {
                    return LeaseEvent::Lost(LossReason::LockFile(why));
                }
            },
            HeldInner::Etcd(held) => {
                let state = held.next_change().await;
                match (state.lost, state.trouble) {
                    (Some(why), _) => LeaseEvent::Lost(why),
                    (None, Some(why)) => LeaseEvent::Trouble(why, state.deadline),
                    (None, None) => LeaseEvent::Renewed(state.deadline),
                }
            }
        }
    }

    /// Give the lease back at once, so the next holder need not wait for a TTL.
    pub async fn release(self) {
        match self.inner {
            HeldInner::Local { lock, .. } => lock.release(),
            HeldInner::Etcd(held) => held.release().await,
        }
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
