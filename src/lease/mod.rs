//! Leases: taking one, keeping it, and giving it back, on either backend. Knows nothing of
//! processes: while a lease is held it reports new deadlines and loss as [`LeaseEvent`]s, and the
//! run loop passes them on to the watchdog.

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
    /// The lease is gone, for this reason: stop the child now.
    Lost(String),
}

/// A connection to the backend, before and while taking a lease.
pub enum Lessor {
    Local {
        dir: std::path::PathBuf,
        ttl: Duration,
    },
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
    /// Backend-specific state.
    inner: HeldInner,
}

enum HeldInner {
    Local {
        lock: local::LocalLock,
        /// The renewal schedule on which the lock file's identity is checked.
        check: Interval,
    },
}

impl Lessor {
    /// Prepare the backend `cfg` names. The local backend needs nothing; etcd is dialled.
    pub async fn connect(cfg: &Config) -> Result<Self, Error> {
        match &cfg.backend {
            Backend::Local { dir } => {
                tracing::info!(dir = %dir.display(), "using the local backend (no etcd endpoints configured)");
                Ok(Lessor::Local {
                    dir: dir.clone(),
                    ttl: cfg.params.ttl,
                })
            }
            Backend::Etcd(_) => Err(Error::Internal(
                "the etcd backend is not built into this binary".into(),
            )),
        }
    }

    /// Take the lease named `name`, waiting for it unless `block` is false. Dropping this future
    /// part-way is allowed; call [`Lessor::abandon`] afterwards.
    pub async fn acquire(&mut self, name: &str, block: bool) -> Result<Held, Error> {
        match self {
            Lessor::Local { dir, ttl } => {
                let lock = local::acquire(dir, name, block).await?;
                let mut check = interval(local::LocalLock::check_every(*ttl));
                check.set_missed_tick_behavior(MissedTickBehavior::Delay);
                check.reset();
                Ok(Held {
                    token: lock.token,
                    key: lock.path().display().to_string(),
                    lease_id: None,
                    deadline: None,
                    inner: HeldInner::Local { lock, check },
                })
            }
        }
    }

    /// Undo what an abandoned [`Lessor::acquire`] left behind (a queued waiter's key and lease).
    pub async fn abandon(&mut self) {}
}

impl Held {
    /// Record who holds the lease (host, pid, command, start), for `leasewrap status`.
    pub async fn record_holder(&mut self, record: &[u8]) {
        match &mut self.inner {
            HeldInner::Local { lock, .. } => lock.record_holder(record),
        }
    }

    /// The next renewal or loss. Cancel-safe.
    pub async fn next_event(&mut self) -> LeaseEvent {
        match &mut self.inner {
            HeldInner::Local { lock, check } => loop {
                check.tick().await;
                if let Some(why) = lock.check() {
                    return LeaseEvent::Lost(why);
                }
            },
        }
    }

    /// Give the lease back at once, so the next holder need not wait for a TTL.
    pub async fn release(self) {
        match self.inner {
            HeldInner::Local { lock, .. } => lock.release(),
        }
    }
}
