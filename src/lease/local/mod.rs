//! The local backend: one host, no service. The lease is `flock` on `DIR/NAME.lock`, confirmed to
//! be the inode that the path names; the fencing token is a counter in `DIR/NAME.token`, raised and
//! made durable under the lock before the child starts. Both files are opened as `files` says:
//! no links, no FIFOs, only regular files of ours in a directory only we can write. The kernel
//! drops the lock when its last holder (the watchdog, which outlives leasewrap) dies, so there is
//! no TTL to renew: only the lock file's identity is checked on the renewal schedule, and a
//! deleted or replaced lock file means the lease is lost.

mod held;
pub mod runs;
pub mod status;

pub use held::{take_now, Lessor};

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

use crate::error::Error;
pub use crate::files::ensure_dir;
use crate::files::{self, Dir};

/// A held local lock.
pub struct LocalLock {
    /// The locked lock file; closing it releases the lock.
    lock: Flock<File>,
    /// The state directory, to notice through it when the lock file is deleted or replaced.
    dir: Dir,
    /// The lock file's name in `dir`.
    lock_name: String,
    /// Its path: the lock key the child is told.
    path: PathBuf,
    /// Fencing token of this hold.
    pub token: u64,
}

/// The lock file's name.
pub fn lock_name(name: &str) -> String {
    format!("{name}.lock")
}

/// The token file's name.
pub fn token_name(name: &str) -> String {
    format!("{name}.token")
}

/// Take the lock, waiting for it when `block`, or failing with `Busy`. A blocking wait runs on a
/// thread of its own: if the caller gives up, the process exits and the kernel drops the attempt.
pub async fn acquire(dir: &Path, name: &str, block: bool) -> Result<LocalLock, Error> {
    let dir = Dir::state(dir)?;
    let lock_name = lock_name(name);
    let lock = loop {
        let lock = match try_lock(&dir, &lock_name)? {
            Try::Locked(lock) => lock,
            Try::Busy(_) if !block => {
                return Err(Error::Busy {
                    name: name.to_owned(),
                })
            }
            Try::Busy(file) => wait_for(file, &dir, &lock_name, name).await?,
        };
        // Someone may have removed or replaced the file between our open and our lock.
        if still_named(&lock, &dir, &lock_name) {
            break lock;
        }
    };
    LocalLock::new(dir, lock_name, lock, name)
}

/// Take the lock if it is free at this moment: never waiting, and needing no runtime. `None`
/// when another process holds it.
pub fn try_acquire(dir: &Path, name: &str) -> Result<Option<LocalLock>, Error> {
    let dir = Dir::state(dir)?;
    let lock_name = lock_name(name);
    loop {
        match try_lock(&dir, &lock_name)? {
            Try::Busy(_) => return Ok(None),
            Try::Locked(lock) if still_named(&lock, &dir, &lock_name) => {
                return LocalLock::new(dir, lock_name, lock, name).map(Some)
            }
            // Removed or replaced between our open and our lock: try the file now named.
            Try::Locked(_) => {}
        }
    }
}

/// One try at the lock, without waiting.
enum Try {
    Locked(Flock<File>),
    /// Another process holds it; the file, to wait on.
    Busy(File),
}

fn try_lock(dir: &Dir, lock_name: &str) -> Result<Try, Error> {
    let (file, _) = dir.open_own(lock_name)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Try::Locked(lock)),
        Err((file, nix::errno::Errno::EWOULDBLOCK)) => Ok(Try::Busy(file)),
        Err((_, e)) => Err(flock_failed(dir, lock_name, e)),
    }
}

/// Wait for the lock on a thread of its own (flock has no asynchronous form).
async fn wait_for(
    file: File,
    dir: &Dir,
    lock_name: &str,
    name: &str,
) -> Result<Flock<File>, Error> {
    tracing::info!(name = %name, "waiting for the lease");
    tokio::task::spawn_blocking(move || Flock::lock(file, FlockArg::LockExclusive))
        .await
        .map_err(|e| Error::internal("waiting for the lock", e))?
        .map_err(|(_, e)| flock_failed(dir, lock_name, e))
}

fn flock_failed(dir: &Dir, lock_name: &str, e: nix::errno::Errno) -> Error {
    let path = dir.join(lock_name);
    Error::internal(format!("flock {}", path.display()), e)
}

/// Whether `name` in `dir` still names the locked inode (a link put in its place does not).
fn still_named(lock: &Flock<File>, dir: &Dir, name: &str) -> bool {
    dir.stat(name)
        .is_some_and(|st| files::same_inode(lock, &st))
}

/// Raise the counter and make it durable before anyone can act on it. A token file that exists
/// but is empty was truncated by someone: restarting at 1 would hand out old tokens again.
fn next_token(dir: &Dir, name: &str) -> Result<u64, Error> {
    let path = dir.join(name);
    let fail = |e: std::io::Error| Error::internal(format!("token file {}", path.display()), e);
    let (file, created) = dir.open_own(name)?;
    let last = match files::read_token(&file, &path)? {
        Some(last) => last,
        None if created => 0,
        None => {
            return Err(Error::Config(format!(
                "token file {} is empty: write the last token handed out into it, or remove it \
                 to start again at 1",
                path.display()
            )))
        }
    };
    let token = last.checked_add(1).ok_or_else(|| {
        Error::Config(format!(
            "token file {} is at the highest token ({last}): fencing tokens cannot grow further",
            path.display()
        ))
    })?;
    files::write_token(&file, token).map_err(fail)?;
    if created {
        dir.sync().map_err(fail)?;
    }
    Ok(token)
}

impl LocalLock {
    /// The lock is ours: raise the token under it.
    fn new(dir: Dir, lock_name: String, lock: Flock<File>, name: &str) -> Result<Self, Error> {
        let token = next_token(&dir, &token_name(name))?;
        let path = dir.join(&lock_name);
        Ok(LocalLock {
            lock,
            dir,
            lock_name,
            path,
            token,
        })
    }

    /// Record who holds the lock in the lock file, for `leasewrap status`. The file is cut only
    /// when it was longer than the record (a release leaves it empty): a truncate, even of an
    /// empty file, runs ext4's truncate path and marks the inode for writeback, just before the
    /// child starts (as `files::write_token` says of the token file).
    pub fn record_holder(&mut self, record: &[u8]) {
        use std::os::unix::fs::FileExt;
        let _ = self.lock.write_all_at(record, 0);
        if self
            .lock
            .metadata()
            .is_ok_and(|m| m.len() > record.len() as u64)
        {
            let _ = self.lock.set_len(record.len() as u64);
        }
    }

    /// The locked file, for the watchdog to hold until the child's tree is gone.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.lock.as_fd()
    }

    /// The lock file's path: the lock key the child is told.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the lock is no longer ours, if it is not.
    pub fn check(&self) -> Option<String> {
        if still_named(&self.lock, &self.dir, &self.lock_name) {
            None
        } else {
            Some(format!(
                "lock file {} was removed or replaced",
                self.path.display()
            ))
        }
    }

    /// How often to check the lock file: the renewal period of the asked TTL.
    pub fn check_every(ttl: Duration) -> Duration {
        ttl / 3
    }

    /// Drop the lock (closing the file releases it), clearing the holder record first so the
    /// file never names a holder that is gone.
    pub fn release(self) {
        let _ = self.lock.set_len(0);
    }
}
