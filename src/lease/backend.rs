//! The one interface every backend implements, and the one place that picks the implementation
//! for a configured [`Backend`]. The run loop, `status`, the run records and `fenced-put` go
//! through these traits only; each backend's folder (`lease::local`, `lease::etcd`, `lease::zk`,
//! `lease::db`) holds its lock, its run records and its status reading behind them.
//!
//! The futures are boxed and not `Send`: leasewrap runs one current-thread runtime, and a trait
//! object cannot name its futures' types otherwise.

use std::future::Future;
use std::os::fd::BorrowedFd;
use std::pin::Pin;
use std::time::Duration;

use super::report::LeaseStatus;
use super::{Held, LeaseEvent};
use crate::config::{Backend, Config};
use crate::error::Error;
use crate::runs::{RunRecord, Unreadable, Written};

/// A future of a backend's, boxed.
pub type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// A backend prepared for a run: takes the lease.
pub trait Lessor {
    /// With --once, read the record of (`name`, `key`) along with taking the lease where the
    /// backend can do so at no cost ([`Lease::read_record`] then needs no request).
    fn read_along(&mut self, _name: &str, _key: &str) {}

    /// Take the lease `name`, waiting for it unless `block` is false; `record` says who holds
    /// it. Dropping this future part-way is allowed; call [`Lessor::abandon`] afterwards.
    fn acquire<'a>(
        &'a mut self,
        name: &'a str,
        record: &'a [u8],
        block: bool,
    ) -> Boxed<'a, Result<Held, Error>>;

    /// Undo what an abandoned [`Lessor::acquire`] left behind (a queued waiter's key, node or
    /// lease).
    fn abandon(&mut self) -> Boxed<'_, ()> {
        Box::pin(async {})
    }

    /// Why an abandoned wait got nowhere, when it was not the lease being held: the service
    /// did not serve (an election). Running out of the wait is then that error (69), not a
    /// conflict (75).
    fn unavailable(&self) -> Option<Error> {
        None
    }
}

/// A lease that is ours, as its backend keeps it.
pub trait Lease {
    /// The next renewal or loss. Cancel-safe.
    fn next_event(&mut self) -> Boxed<'_, LeaseEvent>;

    /// Give the lease back at once, so the next holder need not wait for a TTL.
    fn release(self: Box<Self>) -> Boxed<'static, ()>;

    /// What the watchdog must hold open while the child's tree lives (the local lock file).
    fn keep_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// The run record of (`name`, `key`), none before its first run.
    fn read_record<'a>(
        &'a self,
        name: &'a str,
        key: &'a str,
    ) -> Boxed<'a, Result<Option<RunRecord>, Error>>;

    /// The child is starting, and its run will be recorded with --keep `keep`: prepare what
    /// the write will need, in the background.
    fn child_started(&mut self, _keep: Duration) {}

    /// Store `record` under the fencing token, kept for `keep`.
    fn write_record<'a>(
        &'a mut self,
        record: &'a RunRecord,
        keep: Duration,
    ) -> Boxed<'a, Result<Written, Error>>;

    /// No record will be written after all (the lease was lost).
    fn record_unused(&mut self) {}
}

/// A backend as `status` reads it: reads only.
pub trait Reader {
    /// The backend's name in a status row (`etcd`, `local`, ...).
    fn label(&self) -> &'static str;

    /// The lease `name`, or every lease, by name.
    fn leases<'a>(&'a self, name: Option<&'a str>) -> Boxed<'a, Result<Vec<LeaseStatus>, Error>>;

    /// At most `last` of the records of `name`, the most recently written, and what stands at
    /// a record's place and is not one.
    fn runs<'a>(
        &'a self,
        name: &'a str,
        last: usize,
    ) -> Boxed<'a, Result<Vec<Result<RunRecord, Unreadable>>, Error>>;

    /// The record of (`name`, `key`), none before its first run.
    fn run<'a>(
        &'a self,
        name: &'a str,
        key: &'a str,
    ) -> Boxed<'a, Result<Option<RunRecord>, Error>>;

    /// The names that have run records.
    fn names(&self) -> Boxed<'_, Result<Vec<String>, Error>>;

    /// Done reading: give back what was opened (a ZooKeeper session).
    fn close(&self) -> Boxed<'_, ()> {
        Box::pin(async {})
    }
}

/// A write of `fenced-put`: `value` at `key`, only while `lock_key` is still the lock of the
/// holder of `token`.
pub struct GuardedPut<'a> {
    pub lock_key: &'a str,
    pub token: u64,
    pub key: &'a str,
    pub value: &'a str,
}

/// A backend as `fenced-put` writes to it.
pub trait Fence {
    /// Put, or refuse with [`Error::StaleToken`] saying what the lock holds now.
    fn put<'a>(&'a self, put: &'a GuardedPut<'a>) -> Boxed<'a, Result<(), Error>>;
}

/// The backend `cfg` names, prepared for a run (etcd is dialled).
pub async fn lessor(cfg: &Config) -> Result<Box<dyn Lessor>, Error> {
    Ok(match &cfg.backend {
        Backend::Local { dir } => Box::new(super::local::Lessor::new(dir, cfg)?),
        Backend::Etcd(e) => Box::new(super::etcd::Etcd::connect(e, cfg.params).await?),
        Backend::Zk(z) => Box::new(super::zk::Zk::connect(z, cfg.params).await?),
        Backend::Db(d) => Box::new(super::db::Db::connect(d, cfg.params).await?),
    })
}

/// The lease of `cfg`, if the backend can take it this moment without a runtime and it is free
/// (a local lock); `None` otherwise, and then [`lessor`] takes it.
pub fn take_now(cfg: &Config, record: &[u8]) -> Result<Option<Held>, Error> {
    match &cfg.backend {
        Backend::Local { dir } => super::local::take_now(dir, cfg, record),
        _ => Ok(None),
    }
}

/// The backend's first log line, where it has one (the local backend says that no remote one
/// was configured).
pub fn announce(cfg: &Config) {
    if let Backend::Local { dir } = &cfg.backend {
        tracing::info!(dir = %dir.display(), "using the local backend (no etcd endpoints configured)");
    }
}

/// The backend `backend` names, as `status` reads it. Nothing is dialled before the first read.
pub fn reader(backend: &Backend) -> Box<dyn Reader + '_> {
    match backend {
        Backend::Local { dir } => Box::new(super::local::status::Reader::new(dir)),
        Backend::Etcd(e) => Box::new(super::etcd::status::Reader::new(e)),
        Backend::Zk(z) => Box::new(super::zk::status::Reader::new(z)),
        Backend::Db(d) => Box::new(super::db::status::Reader::new(d)),
    }
}

/// The backend `backend` names, as `fenced-put` writes to it; the local backend has no such
/// writes.
pub fn fence(backend: &Backend) -> Result<Box<dyn Fence + '_>, Error> {
    match backend {
        Backend::Local { .. } => Err(Error::Usage(
            "fenced-put needs etcd or ZooKeeper: give --endpoints or --zookeeper, or set LEASEWRAP_ENDPOINTS or LEASEWRAP_ZOOKEEPER".into(),
        )),
        Backend::Etcd(e) => Ok(Box::new(super::etcd::fence::Fence::new(e))),
        Backend::Zk(z) => Ok(Box::new(super::zk::fence::Fence::new(z))),
        Backend::Db(_) => Err(Error::Usage(
            "fenced-put writes to etcd or ZooKeeper; in the lease's database, call leasewrap.fence(NAME, TOKEN) first in the job's own transaction (docs/fencing.md)".into(),
        )),
    }
}
