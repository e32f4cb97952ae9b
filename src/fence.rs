//! The resource side of fencing (SPEC §7). `fenced-write` replaces a file only for a token at
//! least as high as any it has recorded; `fenced-put` puts an etcd key only while the lock key
//! still has the token as its create revision. A stale token is refused with
//! [`Error::StaleToken`] (status 73), and then nothing has changed.
//!
//! fenced-write spools the new content into an unnamed temp file beside DEST (O_TMPFILE) first,
//! without any lock, so a slow or paused producer never holds up another writer. Only then does
//! it take `flock` on `DEST.fence`, check the token, record it, link the temp file under a random
//! name and rename it over DEST, and unlock: a stale writer can never slip its rename in after a
//! newer one, and the lock is held only while committing. DEST is never written in place: a
//! reader, or a crash, sees the old file or the new one, never a mix. DEST.fence is opened as
//! `files` says (no link, no FIFO, a regular file of ours); a DEST that is a symbolic link is
//! refused, so that every writer of one file shares one fence. Nothing here touches a lease or a
//! process other than COMMAND of `fenced-write DEST -- COMMAND`.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, Flock, FlockArg, OFlag};
use nix::sys::stat::{Mode, SFlag};

use crate::cli::{FencedPutArgs, FencedWriteArgs};
use crate::config::{self, Env};
use crate::error::Error;
use crate::files::{self, Dir};
use crate::lease::backend::GuardedPut;
use crate::supervise::{self, Exit};

/// `leasewrap fenced-write`: DEST from stdin, or from COMMAND's stdout; the status to exit with.
pub fn write(args: &FencedWriteArgs) -> Result<u8, Error> {
    let token = given(
        "fenced-write",
        args.token,
        "a fencing token: give --token N",
        TOKEN_VAR,
    )?;
    let target = Target::new(&args.dest)?;
    // Refused before reading anything or running COMMAND when the token is already stale.
    target.refuse_if_stale(token, target.peek()?)?;
    let temp = match args.command.split_first() {
        None => target.spool(&mut io::stdin().lock())?,
        Some((program, rest)) => match target.spool_command(program, rest)? {
            Ok(temp) => temp,
            Err(status) => return Ok(status),
        },
    };
    target.commit(temp, token)?;
    Ok(0)
}

/// The variables a child of leasewrap has, which clap reads in place of --token and --lock-key.
const TOKEN_VAR: &str = "LEASEWRAP_FENCING_TOKEN";
const KEY_VAR: &str = "LEASEWRAP_KEY";

/// An option that defaults to a variable of the child's environment, or why it is missing.
fn given<T>(command: &str, value: Option<T>, what: &str, var: &str) -> Result<T, Error> {
    value.ok_or_else(|| {
        Error::Usage(format!(
            "{command} needs {what}, or run it as a child of leasewrap, which sets {var}"
        ))
    })
}

/// Replace `dest` with what `data` yields, unless `DEST.fence` has recorded a token above `token`.
pub fn write_from(dest: &Path, token: u64, data: &mut impl Read) -> Result<(), Error> {
    let target = Target::new(dest)?;
    let temp = target.spool(data)?;
    target.commit(temp, token)
}

/// `Some(seen)` when `token` is lower than the token already recorded: the write is refused.
/// An equal token passes, so one holder may write many times.
fn stale(token: u64, recorded: Option<u64>) -> Option<u64> {
    recorded.filter(|&seen| token < seen)
}

/// The name a committing writer links its temp file under, beside DEST: random, so nobody can
/// take it in advance, and hidden.
fn temp_name(name: &str, random: u64) -> String {
    format!(".{name}.fenced-write-{random:016x}.tmp")
}

/// Whether `candidate` is a temp file of some writer of `name` (and not of another DEST whose
/// name starts like it).
fn is_temp_of(name: &str, candidate: &str) -> bool {
    candidate
        .strip_prefix(&format!(".{name}.fenced-write-"))
        .and_then(|rest| rest.strip_suffix(".tmp"))
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// DEST and the directory it is in.
struct Target {
    /// DEST's directory: the fence and the temp file live there, so the rename stays on one
    /// file system.
    dir: Dir,
    /// DEST's file name.
    name: String,
    /// `DEST.fence`'s file name: the lock, and the highest token recorded.
    fence: String,
}

impl Target {
    fn new(dest: &Path) -> Result<Self, Error> {
        let name = dest
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|_| !dest.as_os_str().as_encoded_bytes().ends_with(b"/"))
            .ok_or_else(|| {
                Error::Usage(format!(
                    "fenced-write: {} does not name a file (give a path like /srv/report.csv)",
                    dest.display()
                ))
            })?;
        let target = Self {
            dir: Dir::containing(dest)?,
            name: name.to_owned(),
            fence: format!("{name}.fence"),
        };
        target.check_dest()?;
        Ok(target)
    }

    fn dest(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    fn fence_path(&self) -> PathBuf {
        self.dir.join(&self.fence)
    }

    /// DEST may be missing or a file; a link would give its target a second fence, and a
    /// directory cannot be replaced.
    fn check_dest(&self) -> Result<(), Error> {
        let Some(st) = self.dir.stat(&self.name) else {
            return Ok(());
        };
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        let why = match kind {
            SFlag::S_IFLNK => {
                "is a symbolic link: give the file it points to, so that every \
                               writer shares one DEST.fence"
            }
            SFlag::S_IFDIR => "is a directory",
            _ => return Ok(()),
        };
        let dest = self.dest();
        Err(Error::Usage(format!(
            "fenced-write: {} {why}",
            dest.display()
        )))
    }

    /// The recorded token as it is now (for an early refusal only), under a shared lock so that
    /// a record being rewritten is never seen half done. The lock is held only for the read.
    fn peek(&self) -> Result<Option<u64>, Error> {
        let Some(file) = self.dir.open_read(&self.fence)? else {
            return Ok(None);
        };
        let fence = Flock::lock(file, FlockArg::LockShared).map_err(|(_, e)| {
            let fence = self.fence_path();
            Error::internal(format!("fenced-write: flock {}", fence.display()), e)
        })?;
        files::read_token(&fence, &self.fence_path())
    }

    fn refuse_if_stale(&self, token: u64, recorded: Option<u64>) -> Result<(), Error> {
        match stale(token, recorded) {
            Some(seen) => Err(Error::StaleToken {
                given: token,
                seen: format!("{} records token {seen}", self.fence_path().display()),
            }),
            None => Ok(()),
        }
    }

    /// Copy `data` into a new temp file with DEST's owner and mode, and make it durable.
    fn spool(&self, data: &mut impl Read) -> Result<Temp, Error> {
        let mut temp = self.temp()?;
        io::copy(data, &mut temp.file).map_err(|e| self.failed("writing", e))?;
        temp.file
            .sync_all()
            .map_err(|e| self.failed("syncing", e))?;
        Ok(temp)
    }

    /// Run COMMAND with its stdout in a new temp file: the temp file if it exited 0, else the
    /// status to exit with (DEST untouched).
    fn spool_command(
        &self,
        program: &OsString,
        args: &[OsString],
    ) -> Result<Result<Temp, u8>, Error> {
        let path = supervise::resolve(program)?;
        let temp = self.temp()?;
        let stdout = temp
            .file
            .try_clone()
            .map_err(|e| self.failed("writing", e))?;
        let status = Command::new(&path)
            .arg0(program)
            .args(args)
            .stdout(stdout)
            .status()
            .map_err(|e| Error::internal(format!("fenced-write: running {}", path.display()), e))?;
        let exit = Exit::from_wait_status(status.into_raw());
        if exit != Exit::Code(0) {
            let code = match exit {
                Exit::Code(n) => n,
                Exit::Signal(sig) => crate::error::signal_status(sig as i32),
            };
            let dest = self.dest();
            let why = format!(
                "COMMAND ended with {code}; {} was left as it was",
                dest.display()
            );
            crate::log::end(&why, crate::log::Ending::Error);
            return Ok(Err(code));
        }
        temp.file
            .sync_all()
            .map_err(|e| self.failed("syncing", e))?;
        Ok(Ok(temp))
    }

    /// A new unnamed file in DEST's directory, mode 0600 (or DEST's, owner too as root).
    fn temp(&self) -> Result<Temp, Error> {
        let old = fs::symlink_metadata(self.dest()).ok();
        let mode = Mode::from_bits_truncate(if old.is_some() { 0o600 } else { 0o644 });
        let flags = OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::openat(self.dir.fd(), ".", flags, mode).map_err(|e| {
            Error::Config(format!(
                "fenced-write: an unnamed temp file in {} (O_TMPFILE): {e}",
                self.dir.path().display()
            ))
        })?;
        let file = File::from(fd);
        if let Some(old) = old {
            // Keeping the owner needs privilege; without it the new file is ours, as with sed -i.
            let _ = std::os::unix::fs::fchown(&file, Some(old.uid()), Some(old.gid()));
            let mode = fs::Permissions::from_mode(old.mode() & 0o7777);
            file.set_permissions(mode)
                .map_err(|e| self.failed("setting the mode of", e))?;
        }
        Ok(Temp { file })
    }

    /// Under the fence's lock: check the token, record it, and put the temp file in DEST's place.
    /// A failure after the record puts the old record back, so the fence never runs ahead of
    /// data that did not land.
    fn commit(&self, temp: Temp, token: u64) -> Result<(), Error> {
        let (file, _) = self.dir.open_own(&self.fence)?;
        let fence = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| {
            let fence = self.fence_path();
            Error::internal(format!("fenced-write: flock {}", fence.display()), e)
        })?;
        let seen = files::read_token(&fence, &self.fence_path())?;
        self.refuse_if_stale(token, seen)?;
        self.check_dest()?;
        self.remove_stale_temps();
        if seen != Some(token) {
            self.record(&fence, Some(token))?;
        }
        // Recorded before the rename: a crash in between leaves the fence ahead of the data,
        // which only refuses writers that are stale anyway. The other order would let a stale
        // writer overwrite data whose token was never recorded.
        if let Err(e) = self.replace_with(&temp) {
            if seen != Some(token) {
                self.record(&fence, seen)?;
            }
            return Err(e);
        }
        tracing::debug!(dest = %self.dest().display(), token, "replaced");
        Ok(())
    }

    /// Link the temp file under a fresh random name, rename that over DEST, make it durable.
    fn replace_with(&self, temp: &Temp) -> Result<(), Error> {
        let linked = self.link(temp)?;
        let renamed = nix::fcntl::renameat(
            self.dir.fd(),
            linked.as_str(),
            self.dir.fd(),
            self.name.as_str(),
        );
        if let Err(e) = renamed {
            let _ = nix::unistd::unlinkat(
                self.dir.fd(),
                linked.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return Err(self.failed("replacing", io::Error::from(e)));
        }
        self.dir
            .sync()
            .map_err(|e| self.failed("syncing the directory of", e))
    }

    /// linkat(2) the unnamed temp file into the directory; retried on the (unlikely) clash.
    fn link(&self, temp: &Temp) -> Result<String, Error> {
        let proc_fd = format!("/proc/self/fd/{}", temp.file.as_raw_fd());
        for _ in 0..8 {
            let name = temp_name(&self.name, files::random_u64());
            let follow = AtFlags::AT_SYMLINK_FOLLOW;
            match nix::unistd::linkat(
                nix::fcntl::AT_FDCWD,
                proc_fd.as_str(),
                self.dir.fd(),
                name.as_str(),
                follow,
            ) {
                Ok(()) => return Ok(name),
                Err(Errno::EEXIST) => continue,
                Err(e) => {
                    return Err(self.failed("linking the temp file beside", io::Error::from(e)))
                }
            }
        }
        Err(Error::Internal(format!(
            "fenced-write: no free temp file name beside {}",
            self.dest().display()
        )))
    }

    /// Temp files of writers killed between link and rename. Only a writer holding the lock
    /// links one and renames it away before unlocking, so under the lock every one is garbage.
    fn remove_stale_temps(&self) {
        let Ok(entries) = fs::read_dir(self.dir.path()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_str().is_some_and(|n| is_temp_of(&self.name, n)) {
                let flag = nix::unistd::UnlinkatFlags::NoRemoveDir;
                let _ = nix::unistd::unlinkat(self.dir.fd(), name.as_os_str(), flag);
            }
        }
    }

    /// Record `token` (None: nothing recorded) in the locked fence file.
    fn record(&self, fence: &File, token: Option<u64>) -> Result<(), Error> {
        let done = match token {
            Some(token) => files::write_token(fence, token),
            None => fence.set_len(0).and_then(|()| fence.sync_data()),
        };
        done.map_err(|e| self.failed("recording the token in", e))
    }

    fn failed(&self, doing: &str, e: io::Error) -> Error {
        let dest = self.dest();
        Error::internal(format!("fenced-write: {doing} {}", dest.display()), e)
    }
}

/// The new content, in a file with no name until it is committed: a writer that dies while
/// spooling leaves nothing behind.
struct Temp {
    file: File,
}

/// `leasewrap fenced-put`: the put only while the lock is still the token's, in one request
/// of the backend's (`lease::backend::Fence`); otherwise what the lock holds now, for the message.
pub async fn put(args: &FencedPutArgs, env: Env<'_>) -> Result<(), Error> {
    let backend = config::backend(&args.conn, None, env)?;
    let fence = crate::lease::backend::fence(&backend)?;
    let token = given(
        "fenced-put",
        args.token,
        "a fencing token: give --token N",
        TOKEN_VAR,
    )?;
    let lock_key = given(
        "fenced-put",
        args.lock_key.as_deref(),
        "the lock key: give --lock-key KEY",
        KEY_VAR,
    )?;
    let put = GuardedPut {
        lock_key,
        token,
        key: &args.put_key,
        value: &args.value,
    };
    fence.put(&put).await?;
    tracing::debug!(key = %args.put_key, token, "put");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_token_is_stale_an_equal_or_higher_one_is_not() {
        assert_eq!(stale(4, Some(5)), Some(5));
        assert_eq!(stale(5, Some(5)), None);
        assert_eq!(stale(6, Some(5)), None);
        assert_eq!(stale(0, None), None);
    }

    #[test]
    fn temp_files_are_recognised_only_for_their_own_dest() {
        let mine = temp_name("report.csv", 42);
        assert!(is_temp_of("report.csv", &mine));
        assert!(!is_temp_of("report", &mine));
        let other = temp_name("report.csv.fenced-write-0000000000000001.tmp", 7);
        assert!(!is_temp_of("report.csv", &other));
        for not in [
            "report.csv",
            ".report.csv.fenced-write-.tmp",
            ".report.csv.fenced-write-1.tmp",
            ".report.csv.fenced-write-000000000000000g.tmp",
            ".report.csv.fenced-write-0000000000000001",
        ] {
            assert!(!is_temp_of("report.csv", not), "{not}");
        }
    }

    #[test]
    fn fence_and_temp_files_sit_beside_dest() {
        let d = dir();
        let t = Target::new(&d.path().join("report.csv")).unwrap();
        assert_eq!(t.fence_path(), d.path().join("report.csv.fence"));
        assert_eq!(t.dir.path(), d.path());
        let t = Target::new(Path::new("report.csv")).unwrap();
        assert_eq!(t.dir.path(), Path::new("."));
        for bad in ["/", "dir/", ".."] {
            assert!(
                matches!(Target::new(Path::new(bad)), Err(Error::Usage(_))),
                "{bad}"
            );
        }
    }

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().expect("temp dir")
    }

    #[test]
    fn writes_record_the_token_and_refuse_a_lower_one() {
        let d = dir();
        let dest = d.path().join("report.csv");
        write_from(&dest, 5, &mut &b"five"[..]).unwrap();
        write_from(&dest, 5, &mut &b"five again"[..]).unwrap();
        let refused = write_from(&dest, 4, &mut &b"four"[..]);
        let Err(Error::StaleToken { given: 4, seen }) = refused else {
            panic!("accepted: {refused:?}")
        };
        assert!(seen.contains("records token 5"), "{seen}");
        assert_eq!(fs::read(&dest).unwrap(), b"five again");
        write_from(&dest, 12, &mut &b"twelve"[..]).unwrap();
        assert_eq!(
            fs::read_to_string(d.path().join("report.csv.fence")).unwrap(),
            "12\n"
        );
        let names: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 2, "only DEST and DEST.fence: {names:?}");
    }

    #[test]
    fn the_mode_of_an_existing_dest_is_kept() {
        let d = dir();
        let dest = d.path().join("secret");
        fs::write(&dest, "old").unwrap();
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o640)).unwrap();
        write_from(&dest, 1, &mut &b"new"[..]).unwrap();
        assert_eq!(fs::metadata(&dest).unwrap().mode() & 0o7777, 0o640);
    }

    #[test]
    fn a_failed_read_leaves_dest_and_no_temp_file() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("producer died"))
            }
        }
        let d = dir();
        let dest = d.path().join("report.csv");
        fs::write(&dest, "old").unwrap();
        assert!(matches!(
            write_from(&dest, 3, &mut Broken),
            Err(Error::Internal(_))
        ));
        assert_eq!(fs::read(&dest).unwrap(), b"old");
        assert!(
            !d.path().join("report.csv.fence").exists(),
            "the fence is not even touched before the input is complete"
        );
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn temp_files_of_killed_writers_are_removed_by_the_next_write() {
        let d = dir();
        let dest = d.path().join("report.csv");
        let left = d.path().join(temp_name("report.csv", 999_999));
        fs::write(&left, "half of it").unwrap();
        write_from(&dest, 1, &mut &b"whole"[..]).unwrap();
        assert!(!left.exists());
    }
}
