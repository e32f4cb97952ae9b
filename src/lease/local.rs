//! The local backend: one host, no service. The lease is `flock` on `DIR/NAME.lock`, confirmed to
//! be the inode that the path names; the fencing token is a counter in `DIR/NAME.token`, raised and
//! made durable under the lock before the child starts. The kernel drops the lock when leasewrap
//! dies, so there is no TTL to renew: only the lock file's identity is checked on the renewal
//! schedule, and a deleted or replaced lock file means the lease is lost.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

use crate::error::Error;

/// A held local lock.
pub struct LocalLock {
    /// The locked lock file; closing it releases the lock.
    lock: Flock<File>,
    /// Its path, to notice when it is deleted or replaced.
    path: PathBuf,
    /// Fencing token of this hold.
    pub token: u64,
}

/// The lock file's path.
pub fn lock_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.lock"))
}

/// The token file's path.
pub fn token_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.token"))
}

/// Open a small state file (lock, token, fence) for reading and writing, creating it with mode
/// 0644 and never truncating it: its contents matter to whoever holds its lock.
pub fn open_state_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)
}

/// Create the state directory, owner-only unless it already exists.
pub fn ensure_dir(dir: &Path) -> Result<(), Error> {
    let mode = if nix::unistd::geteuid().is_root() {
        0o755
    } else {
        0o700
    };
    DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| Error::Config(format!("--local-dir {}: {e}", dir.display())))
}

/// Take the lock, waiting for it when `block`, or failing with `Busy`. A blocking wait runs on a
/// thread of its own: if the caller gives up, the process exits and the kernel drops the attempt.
pub async fn acquire(dir: &Path, name: &str, block: bool) -> Result<LocalLock, Error> {
    ensure_dir(dir)?;
    let path = lock_path(dir, name);
    let lock = loop {
        let file = open_state_file(&path)
            .map_err(|e| Error::Config(format!("lock file {}: {e}", path.display())))?;
        // Try without blocking first: an uncontended lock needs no thread.
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Err((file, nix::errno::Errno::EWOULDBLOCK)) if block => {
                tracing::info!(name = %name, "waiting for the lease");
                tokio::task::spawn_blocking(move || Flock::lock(file, FlockArg::LockExclusive))
                    .await
                    .map_err(|e| Error::internal("waiting for the lock", e))?
            }
            other => other,
        };
        let lock = match lock {
            Ok(lock) => lock,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(Error::Busy {
                    name: name.to_owned(),
                })
            }
            Err((_, e)) => return Err(Error::internal(format!("flock {}", path.display()), e)),
        };
        // Someone may have removed or replaced the file between our open and our lock.
        if still_named(&lock, &path) {
            break lock;
        }
    };
    let token = next_token(&token_path(dir, name))?;
    Ok(LocalLock { lock, path, token })
}

/// Whether `path` still names the locked inode.
fn still_named(lock: &Flock<File>, path: &Path) -> bool {
    match (lock.metadata(), std::fs::metadata(path)) {
        (Ok(held), Ok(named)) => held.dev() == named.dev() && held.ino() == named.ino(),
        _ => false,
    }
}

/// Raise the counter and make it durable before anyone can act on it.
fn next_token(path: &Path) -> Result<u64, Error> {
    let fail = |e: std::io::Error| Error::internal(format!("token file {}", path.display()), e);
    let existed = path.exists();
    let mut file = open_state_file(path).map_err(fail)?;
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(fail)?;
    let last: u64 = match text.trim() {
        "" => 0,
        t => t.parse().map_err(|_| {
            Error::Internal(format!(
                "token file {} holds {t:?}, not a number: fix or remove it by hand",
                path.display()
            ))
        })?,
    };
    let token = last + 1;
    // A token only grows, so the new text is never shorter than the old one.
    file.write_all_at(format!("{token}\n").as_bytes(), 0)
        .map_err(fail)?;
    file.sync_data().map_err(fail)?;
    if !existed {
        if let Some(dir) = path.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(fail)?;
        }
    }
    Ok(token)
}

impl LocalLock {
    /// Record who holds the lock in the lock file, for `leasewrap status`.
    pub fn record_holder(&mut self, record: &[u8]) {
        let _ = self.lock.set_len(0);
        let _ = self.lock.write_all_at(record, 0);
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
        if still_named(&self.lock, &self.path) {
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
