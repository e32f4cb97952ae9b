//! The local backend behind [`crate::lease::backend`]: the lock of `lease::local` as a
//! [`Lessor`], its hold as a lease whose only check is the lock file's identity, and its run
//! records in `runs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::{interval, Interval, MissedTickBehavior};

use super::{runs, LocalLock};
use crate::config::Config;
use crate::error::Error;
use crate::lease::backend::{self, Boxed};
use crate::lease::{timing, Held, LeaseEvent, LossReason};
use crate::runs::{RunRecord, Written};

/// The state directory, prepared for a run.
pub struct Lessor {
    dir: PathBuf,
    /// The timing of the TTL asked for, which on this backend is the one in force.
    timing: timing::Effective,
}

impl Lessor {
    pub fn new(dir: &Path, cfg: &Config) -> Result<Self, Error> {
        Ok(Lessor {
            dir: dir.to_owned(),
            timing: local_timing(cfg)?,
        })
    }
}

impl backend::Lessor for Lessor {
    fn acquire<'a>(
        &'a mut self,
        name: &'a str,
        record: &'a [u8],
        block: bool,
    ) -> Boxed<'a, Result<Held, Error>> {
        Box::pin(async move {
            let lock = super::acquire(&self.dir, name, block).await?;
            Ok(held(lock, &self.dir, &self.timing, record))
        })
    }
}

/// The timing of the TTL asked for, which on the local backend is the one in force.
fn local_timing(cfg: &Config) -> Result<timing::Effective, Error> {
    cfg.params
        .effective(cfg.params.ttl)
        .map_err(|e| Error::Usage(e.to_string()))
}

/// The local lock of `cfg` in `dir`, if it is free at this moment: taken without waiting and
/// without a runtime, so that the child can start before the runtime does.
pub fn take_now(dir: &Path, cfg: &Config, record: &[u8]) -> Result<Option<Held>, Error> {
    let timing = local_timing(cfg)?;
    let lock = super::try_acquire(dir, &cfg.name)?;
    Ok(lock.map(|lock| held(lock, dir, &timing, record)))
}

fn held(mut lock: LocalLock, dir: &Path, timing: &timing::Effective, record: &[u8]) -> Held {
    lock.record_holder(record);
    let (token, key) = (lock.token, lock.path().display().to_string());
    let inner = LocalHeld {
        lock,
        dir: dir.to_owned(),
        every: LocalLock::check_every(timing.ttl),
        check: None,
    };
    Held::new(token, key, None, None, timing.kill_after, Box::new(inner))
}

/// A held local lock.
struct LocalHeld {
    lock: LocalLock,
    /// The state directory, where the run records are.
    dir: PathBuf,
    /// How often the lock file's identity is checked: the renewal period.
    every: Duration,
    /// That schedule, from the first wait for an event (the lock may be taken before the
    /// runtime exists).
    check: Option<Interval>,
}

impl backend::Lease for LocalHeld {
    fn next_event(&mut self) -> Boxed<'_, LeaseEvent> {
        Box::pin(async move {
            let every = self.every;
            let check = self.check.get_or_insert_with(|| {
                let mut check = interval(every);
                check.set_missed_tick_behavior(MissedTickBehavior::Delay);
                check.reset();
                check
            });
            loop {
                check.tick().await;
                if let Some(why) = self.lock.check() {
                    return LeaseEvent::Lost(LossReason::LockFile(why), None);
                }
            }
        })
    }

    fn release(self: Box<Self>) -> Boxed<'static, ()> {
        self.lock.release();
        Box::pin(async {})
    }

    fn keep_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.lock.fd())
    }

    fn read_record<'a>(
        &'a self,
        name: &'a str,
        key: &'a str,
    ) -> Boxed<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move { runs::read(&self.dir, name, key) })
    }

    fn write_record<'a>(
        &'a mut self,
        record: &'a RunRecord,
        _keep: Duration,
    ) -> Boxed<'a, Result<Written, Error>> {
        let (dir, lock) = (&self.dir, &self.lock);
        Box::pin(async move { runs::write(dir, record, || lock.check().map_or(Ok(()), Err)) })
    }
}
