//! The resource side of fencing (SPEC §7). `fenced-write` replaces a file only for a token at
//! least as high as any it has recorded; `fenced-put` puts an etcd key only while the lock key
//! still has the token as its create revision. A stale token is refused with
//! [`Error::StaleToken`] (status 73), and then nothing has changed.
//!
//! fenced-write keeps the highest token in `DEST.fence` and serialises writers with `flock` on
//! that file: check, replacement and record happen under one lock, so a stale writer can never
//! slip its rename in after a newer one. DEST is never written in place: a reader, or a crash,
//! sees the old file or the new one, never a mix. Nothing here touches a lease or a process.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use etcd_client::TxnOp;
use nix::fcntl::{Flock, FlockArg};

use crate::cli::{FencedPutArgs, FencedWriteArgs};
use crate::config::{self, Backend, Env};
use crate::error::Error;
use crate::lease::etcd::client::{self, Conn, Guarded};

/// `leasewrap fenced-write`: DEST from stdin.
pub fn write(args: &FencedWriteArgs) -> Result<(), Error> {
    write_from(&args.dest, args.token, &mut io::stdin().lock())
}

/// Replace `dest` with what `data` yields, unless `DEST.fence` has recorded a token above `token`.
/// The token is recorded after the new data is durable and before the rename.
pub fn write_from(dest: &Path, token: u64, data: &mut impl Read) -> Result<(), Error> {
    let target = Target::new(dest)?;
    let fence = target.lock_fence()?;
    let seen = target.recorded(&fence)?;
    if let Some(seen) = stale(token, seen) {
        let fence = target.fence.display();
        return Err(Error::StaleToken {
            given: token,
            seen: format!("{fence} records token {seen}"),
        });
    }
    target.remove_stale_temps();
    let temp = target.spool(data)?;
    // Recorded once the new data is durable, and before it replaces DEST: a crash in between
    // leaves the fence ahead of the data, which only refuses writers that are stale anyway. The
    // other order would let a stale writer overwrite data whose token was never recorded.
    if seen != Some(token) {
        target.record(&fence, token)?;
    }
    target.replace_with(temp)?;
    tracing::debug!(dest = %dest.display(), token, "replaced");
    Ok(())
}

/// `Some(seen)` when `token` is lower than the token already recorded: the write is refused.
/// An equal token passes, so one holder may write many times.
fn stale(token: u64, recorded: Option<u64>) -> Option<u64> {
    recorded.filter(|&seen| token < seen)
}

/// The text of a fence file: nothing yet, or one decimal token.
fn parse_fence(text: &str) -> Result<Option<u64>, String> {
    match text.trim() {
        "" => Ok(None),
        t => t
            .parse()
            .map(Some)
            .map_err(|_| format!("holds {t:?}, not a token: fix or remove it by hand")),
    }
}

/// The hidden temp file a writer with `pid` spools into, beside DEST.
fn temp_name(name: &str, pid: u32) -> String {
    format!(".{name}.fenced-write-{pid}.tmp")
}

/// Whether `candidate` is a temp file of some writer of `name` (and not of another DEST whose
/// name starts like it).
fn is_temp_of(name: &str, candidate: &str) -> bool {
    candidate
        .strip_prefix(&format!(".{name}.fenced-write-"))
        .and_then(|rest| rest.strip_suffix(".tmp"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// DEST and the paths beside it.
struct Target {
    dest: PathBuf,
    /// `DEST.fence`: the lock, and the highest token recorded.
    fence: PathBuf,
    /// DEST's directory, where the temp file goes so that the rename stays on one file system.
    dir: PathBuf,
    /// DEST's file name, the stem of the temp file names.
    name: String,
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
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        let mut fence = OsString::from(dest.as_os_str());
        fence.push(".fence");
        Ok(Self {
            dest: dest.to_owned(),
            fence: fence.into(),
            dir,
            name: name.to_owned(),
        })
    }

    /// Open (creating) and lock `DEST.fence`; waits for a writer holding it.
    fn lock_fence(&self) -> Result<Flock<File>, Error> {
        let file = crate::lease::local::open_state_file(&self.fence)
            .map_err(|e| Error::Config(format!("fenced-write: {}: {e}", self.fence.display())))?;
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| {
            Error::internal(format!("fenced-write: flock {}", self.fence.display()), e)
        })
    }

    fn recorded(&self, fence: &File) -> Result<Option<u64>, Error> {
        let mut text = String::new();
        (&*fence)
            .read_to_string(&mut text)
            .map_err(|e| self.failed("reading", &self.fence, e))?;
        parse_fence(&text)
            .map_err(|why| Error::Config(format!("fenced-write: {} {why}", self.fence.display())))
    }

    /// Temp files left by writers killed mid-stream. Only a writer holding the lock makes one
    /// and renames it away before unlocking, so under the lock every one found is garbage.
    fn remove_stale_temps(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| is_temp_of(&self.name, n))
            {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// Copy `data` into a new temp file beside DEST with DEST's owner and mode (0644 less the
    /// umask for a new DEST), and make it durable.
    fn spool(&self, data: &mut impl Read) -> Result<Temp, Error> {
        let old = fs::metadata(&self.dest).ok();
        let path = self.dir.join(temp_name(&self.name, std::process::id()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(if old.is_some() { 0o600 } else { 0o644 })
            .open(&path)
            .map_err(|e| Error::Config(format!("fenced-write: {}: {e}", path.display())))?;
        let mut temp = Temp {
            path,
            file: Some(file),
        };
        let file = temp.file.as_mut().expect("just opened");
        if let Some(old) = old {
            // Keeping the owner needs privilege; without it the new file is ours, as with sed -i.
            let _ = std::os::unix::fs::fchown(&*file, Some(old.uid()), Some(old.gid()));
            let mode = fs::Permissions::from_mode(old.mode() & 0o7777);
            file.set_permissions(mode)
                .map_err(|e| self.failed("setting the mode of", &temp.path, e))?;
        }
        io::copy(data, file).map_err(|e| self.failed("writing", &temp.path, e))?;
        file.sync_all()
            .map_err(|e| self.failed("syncing", &temp.path, e))?;
        Ok(temp)
    }

    /// Rename the temp file over DEST and make the rename durable.
    fn replace_with(&self, mut temp: Temp) -> Result<(), Error> {
        temp.file = None;
        fs::rename(&temp.path, &self.dest).map_err(|e| self.failed("replacing", &self.dest, e))?;
        temp.path = PathBuf::new();
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| self.failed("syncing", &self.dir, e))
    }

    /// Record `token` in the locked fence file. A token only grows, so the text never shrinks.
    fn record(&self, fence: &File, token: u64) -> Result<(), Error> {
        let text = format!("{token}\n");
        fence
            .write_all_at(text.as_bytes(), 0)
            .and_then(|()| fence.set_len(text.len() as u64))
            .and_then(|()| fence.sync_data())
            .map_err(|e| self.failed("recording the token in", &self.fence, e))
    }

    fn failed(&self, doing: &str, path: &Path, e: io::Error) -> Error {
        Error::internal(format!("fenced-write: {doing} {}", path.display()), e)
    }
}

/// A temp file being written; removed on drop unless it was renamed into place.
struct Temp {
    /// Empty once renamed.
    path: PathBuf,
    file: Option<File>,
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// `leasewrap fenced-put`: one transaction, the put only if the lock key's create revision is
/// still the token; otherwise the lock key's current state, for the message.
pub async fn put(args: &FencedPutArgs, env: Env<'_>) -> Result<(), Error> {
    let cfg = match config::backend(&args.conn, None, env)? {
        Backend::Etcd(cfg) => cfg,
        Backend::Local { .. } => {
            return Err(Error::Usage(
                "fenced-put needs etcd: give --endpoints or set LEASEWRAP_ENDPOINTS".into(),
            ))
        }
    };
    let revision = i64::try_from(args.token).map_err(|_| {
        Error::Usage(format!(
            "--token {} is beyond any etcd revision",
            args.token
        ))
    })?;
    let lock_key = args.lock_key.as_str();
    let put = TxnOp::put(args.put_key.as_str(), args.value.as_str(), None);
    let conn = Conn::dial(&cfg).await?;
    match client::guarded_txn(&conn, lock_key, revision, vec![put]).await? {
        Guarded::Applied(_) => {
            tracing::debug!(key = %args.put_key, token = args.token, "put");
            Ok(())
        }
        Guarded::Refused { create_revision } => Err(Error::StaleToken {
            given: args.token,
            seen: lock_key_state(lock_key, create_revision),
        }),
    }
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
    fn a_lower_token_is_stale_an_equal_or_higher_one_is_not() {
        assert_eq!(stale(4, Some(5)), Some(5));
        assert_eq!(stale(5, Some(5)), None);
        assert_eq!(stale(6, Some(5)), None);
        assert_eq!(stale(0, None), None);
    }

    #[test]
    fn fence_text_is_empty_or_one_token() {
        assert_eq!(parse_fence(""), Ok(None));
        assert_eq!(parse_fence("17\n"), Ok(Some(17)));
        assert_eq!(parse_fence(" 18 "), Ok(Some(18)));
        for bad in ["x", "-1", "1 2", "18446744073709551616"] {
            assert!(parse_fence(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn temp_files_are_recognised_only_for_their_own_dest() {
        let mine = temp_name("report.csv", 42);
        assert!(is_temp_of("report.csv", &mine));
        assert!(!is_temp_of("report", &mine));
        let other = temp_name("report.csv.fenced-write-1.tmp", 7);
        assert!(!is_temp_of("report.csv", &other));
        for not in [
            "report.csv",
            ".report.csv.fenced-write-.tmp",
            ".report.csv.fenced-write-1",
        ] {
            assert!(!is_temp_of("report.csv", not), "{not}");
        }
    }

    #[test]
    fn fence_and_temp_files_sit_beside_dest() {
        let t = Target::new(Path::new("/srv/data/report.csv")).unwrap();
        assert_eq!(t.fence, Path::new("/srv/data/report.csv.fence"));
        assert_eq!(t.dir, Path::new("/srv/data"));
        let t = Target::new(Path::new("report.csv")).unwrap();
        assert_eq!(t.dir, Path::new("."));
        for bad in ["/", "dir/", ".."] {
            assert!(
                matches!(Target::new(Path::new(bad)), Err(Error::Usage(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_refused_put_says_what_the_lock_key_holds() {
        let s = lock_key_state("leasewrap/job/694d", Some(9));
        assert!(s.contains("create revision 9"), "{s}");
        let s = lock_key_state("leasewrap/job/694d", None);
        assert!(s.contains("does not exist"), "{s}");
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
        let fence = fs::read_to_string(d.path().join("report.csv.fence")).unwrap();
        assert_eq!(
            fence, "",
            "no token recorded for a write that did not happen"
        );
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 2);
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
