//! Status of local leases, and the local backend as `status` reads it ([`Reader`]). A lease is held when a non-blocking shared `flock` on its lock file
//! fails; the holder record is the lock file's content and the token the counter in its token
//! file. Waiters are the blocked flock requests that `/proc/locks` lists (marked `->`) under the
//! holder's lock on the same inode. Opens files read-only and creates nothing.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::{lock_name, runs, token_name};
use crate::error::Error;
use crate::files::{self, Dir, RECORD_MAX};
use crate::lease::backend::{self, Boxed};
use crate::lease::report::{Holder, LeaseStatus};
use crate::runs::{RunRecord, Unreadable};

const BACKEND: &str = "local";

/// The lease `name`, or every `*.lock` in `dir` by name. A missing `dir` holds no leases.
pub fn leases(dir: &Path, name: Option<&str>) -> Result<Vec<LeaseStatus>, Error> {
    let Some(dir) = Dir::to_read(dir)? else {
        let free = |n: &str| LeaseStatus::free(n, BACKEND);
        return Ok(name.map(free).into_iter().collect());
    };
    let names = match name {
        Some(n) => vec![n.to_owned()],
        None => lock_names(&dir)?,
    };
    names.iter().map(|n| lease_or_refused(&dir, n)).collect()
}

/// The lease `name`, or a row saying why its lock file was refused.
fn lease_or_refused(dir: &Dir, name: &str) -> Result<LeaseStatus, Error> {
    match lease(dir, name) {
        Err(Error::Config(why)) => Ok(LeaseStatus::refused(name, BACKEND, why)),
        other => other,
    }
}

/// The names of the `*.lock` files in `dir`, read through its descriptor.
fn lock_names(dir: &Dir) -> Result<Vec<String>, Error> {
    let entries = dir
        .names()
        .map_err(|e| Error::Config(format!("--local-dir {}: {e}", dir.path().display())))?;
    let mut names: Vec<String> = entries
        .into_iter()
        .filter_map(|file| {
            let file = file.into_string().ok()?;
            Some(file.strip_suffix(".lock")?.to_owned())
        })
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    Ok(names)
}

fn lease(dir: &Dir, name: &str) -> Result<LeaseStatus, Error> {
    let path = dir.join(lock_name(name));
    // No link followed, no FIFO waited on: anything but a regular file is refused.
    let Some(file) = dir.open_read(&lock_name(name))? else {
        return Ok(LeaseStatus::free(name, BACKEND));
    };
    let file = match Flock::lock(file, FlockArg::LockSharedNonblock) {
        // Dropping the Flock unlocks at once.
        Ok(_free) => return Ok(LeaseStatus::free(name, BACKEND)),
        Err((file, Errno::EWOULDBLOCK)) => file,
        Err((_, e)) => return Err(Error::internal(format!("flock {}", path.display()), e)),
    };
    let record = files::read_bounded(&file, &path, RECORD_MAX)?;
    let waiters = file
        .metadata()
        .ok()
        .and_then(|m| blocked_waiters(&read_proc_locks()?, m.dev(), m.ino()));
    Ok(LeaseStatus {
        held: true,
        holder: Holder::parse(&record),
        token: read_token(dir, &token_name(name)),
        waiters,
        key: Some(path.display().to_string()),
        ..LeaseStatus::free(name, BACKEND)
    })
}

/// The last token handed out, which is the holder's once it has started its child.
fn read_token(dir: &Dir, name: &str) -> Option<u64> {
    let file: File = dir.open_read(name).ok()??;
    files::read_token(&file, &dir.join(name)).ok()?
}

fn read_proc_locks() -> Option<String> {
    std::fs::read_to_string("/proc/locks").ok()
}

/// The blocked flock requests on inode `ino` of device `dev`, from `/proc/locks` text. None when
/// the granted lock on that inode is not listed: the holder is then in another pid namespace
/// (the kernel hides its lock and its waiters) or the file system names the device otherwise.
fn blocked_waiters(proc_locks: &str, dev: u64, ino: u64) -> Option<u64> {
    let inode = format!(
        "{:02x}:{:02x}:{ino}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    );
    let (mut granted, mut blocked) = (false, 0);
    for line in proc_locks.lines() {
        // "1: FLOCK  ADVISORY  WRITE 9915 fe:00:10011518 0 EOF", waiters with "->" after "1:".
        let mut fields = line.split_whitespace().skip(1).peekable();
        let waiting = fields.next_if_eq(&"->").is_some();
        let fields: Vec<&str> = fields.collect();
        if fields.first() != Some(&"FLOCK") || fields.get(4) != Some(&inode.as_str()) {
            continue;
        }
        if waiting {
            blocked += 1;
        } else {
            granted = true;
        }
    }
    granted.then_some(blocked)
}

/// The state directory as `status` reads it.
pub struct Reader<'a> {
    dir: &'a Path,
}

impl<'a> Reader<'a> {
    pub fn new(dir: &'a Path) -> Self {
        Reader { dir }
    }
}

impl backend::Reader for Reader<'_> {
    fn label(&self) -> &'static str {
        BACKEND
    }

    fn leases<'a>(&'a self, name: Option<&'a str>) -> Boxed<'a, Result<Vec<LeaseStatus>, Error>> {
        Box::pin(async move { leases(self.dir, name) })
    }

    fn runs<'a>(
        &'a self,
        name: &'a str,
        _last: usize,
    ) -> Boxed<'a, Result<Vec<Result<RunRecord, Unreadable>>, Error>> {
        Box::pin(async move { Ok(runs::list(self.dir, name)) })
    }

    fn run<'a>(
        &'a self,
        name: &'a str,
        key: &'a str,
    ) -> Boxed<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move { runs::look(self.dir, name, key) })
    }

    fn names(&self) -> Boxed<'_, Result<Vec<String>, Error>> {
        Box::pin(async move { Ok(runs::names(self.dir)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCKS: &str = "\
1: FLOCK  ADVISORY  WRITE 9915 fe:00:10011518 0 EOF
1: -> FLOCK  ADVISORY  WRITE 10064 fe:00:10011518 0 EOF
1: -> FLOCK  ADVISORY  WRITE 10070 fe:00:10011518 0 EOF
2: OFDLCK ADVISORY  WRITE -1 fe:00:10011518 0 EOF
3: FLOCK  ADVISORY  WRITE 7194 fe:00:10043407 0 EOF
4: -> POSIX  ADVISORY  WRITE 7195 fe:00:10043407 0 EOF
";

    #[test]
    fn blocked_flock_requests_on_the_inode_are_the_waiters() {
        let dev = nix::sys::stat::makedev(0xfe, 0);
        assert_eq!(blocked_waiters(LOCKS, dev, 10011518), Some(2));
        assert_eq!(blocked_waiters(LOCKS, dev, 10043407), Some(0));
    }

    #[test]
    fn waiters_are_unknown_when_the_holders_lock_is_not_listed() {
        let dev = nix::sys::stat::makedev(0xfe, 0);
        assert_eq!(blocked_waiters(LOCKS, dev, 1), None);
        assert_eq!(
            blocked_waiters(LOCKS, nix::sys::stat::makedev(8, 1), 10011518),
            None
        );
    }

    #[test]
    fn a_missing_directory_holds_no_leases_and_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert_eq!(leases(&missing, None).unwrap(), vec![]);
        let free = leases(&missing, Some("x")).unwrap();
        assert!(!free[0].held);
        assert!(!missing.exists());
    }

    #[test]
    fn a_lock_held_by_this_process_shows_held_with_its_record_and_token() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("job.lock");
        std::fs::write(&lock, br#"{"host":"h","pid":1,"command":["x"],"start":2}"#).unwrap();
        std::fs::write(dir.path().join("job.token"), "5\n").unwrap();
        std::fs::write(dir.path().join("idle.lock"), "").unwrap();
        let file = File::open(&lock).unwrap();
        let _held = Flock::lock(file, FlockArg::LockExclusiveNonblock).unwrap();
        let all = leases(dir.path(), None).unwrap();
        let names: Vec<&str> = all.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["idle", "job"]);
        assert!(!all[0].held);
        assert!(all[1].held);
        assert_eq!(all[1].token, Some(5));
        assert_eq!(all[1].holder.as_ref().map(|h| h.pid), Some(1));
    }
}
