//! Small files written whole: a new temp file beside the target, opened through the folder's
//! descriptor without following symlinks and never reused (`O_EXCL`), then renamed over the
//! target. A reader sees the old file or the new one, never a mix; a symlink planted at either
//! name is replaced, never written through.

use std::fs::File;
use std::io::{self, ErrorKind, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::files::{parent, random_u64, remove_at};

/// How a replacement is made.
#[derive(Debug, Clone, Copy)]
pub struct Replace {
    /// Sync the data and the directory before returning: the file must survive a crash.
    pub durable: bool,
}

impl Replace {
    /// Atomic for readers, not synced: for a file that is rewritten on every run anyway.
    pub const PLAIN: Replace = Replace { durable: false };
}

/// How many names [`create_temp`] tries before giving up: a clash with a planted or leftover
/// file is all that makes one fail, and each try draws a new random name.
const TEMP_TRIES: usize = 8;

/// A temp file name for `name` with `random` in it: hidden, and not ending like `name`, so that
/// a collector reading `*.prom` or a lister of `*.json` skips it; unguessable, so that another
/// user who can write the directory cannot plant it ahead of us.
fn temp_name(name: &str, random: u64) -> String {
    format!(".{name}.tmp-{random:016x}")
}

/// Whether `file_name` is a temp file of [`temp_name`]'s making.
pub fn is_temp(file_name: &str) -> bool {
    file_name.starts_with('.')
        && file_name
            .rsplit_once(".tmp-")
            .is_some_and(|(_, hex)| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Create a new temp file for `name` in `dir` under a fresh random name, never following a
/// symlink and never reusing a file that exists (EEXIST: draw another name).
fn create_temp(dir: BorrowedFd, name: &str) -> io::Result<(File, String)> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    for _ in 0..TEMP_TRIES {
        let tmp = temp_name(name, random_u64());
        match nix::fcntl::openat(dir, tmp.as_str(), flags, Mode::from_bits_truncate(0o644)) {
            Ok(fd) => return Ok((File::from(fd), tmp)),
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::from(ErrorKind::AlreadyExists))
}

/// Replace `path` with `bytes` as `how` says.
pub fn replace(path: &Path, bytes: &[u8], how: Replace) -> io::Result<()> {
    let dir = File::open(parent(path))?;
    replace_in(dir.as_fd(), &file_name(path)?, bytes, how)
}

/// Replace the file `name` of the open directory `dir` with `bytes` as `how` says.
pub fn replace_in(dir: BorrowedFd, name: &str, bytes: &[u8], how: Replace) -> io::Result<()> {
    let (mut file, tmp) = create_temp(dir, name)?;
    let written = (|| {
        file.write_all(bytes)?;
        if how.durable {
            file.sync_all()?;
        }
        nix::fcntl::renameat(dir, tmp.as_str(), dir, name).map_err(io::Error::from)
    })();
    if written.is_err() {
        let _ = remove_at(dir, &tmp);
    }
    written?;
    if how.durable {
        nix::unistd::fsync(dir)?;
    }
    Ok(())
}

/// Whether a file can be made beside `path` now: one is made and removed again.
pub fn check_writable(path: &Path) -> io::Result<()> {
    let dir = File::open(parent(path))?;
    let (_, tmp) = create_temp(dir.as_fd(), &file_name(path)?)?;
    remove_at(dir.as_fd(), &tmp)
}

/// The last component of `path`, as a name in its folder.
fn file_name(path: &Path) -> io::Result<String> {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| io::Error::new(ErrorKind::InvalidInput, "no file name"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn replace_writes_whole_files_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.prom");
        let how = Replace { durable: true };
        replace(&path, b"one", how).unwrap();
        replace(&path, b"two", how).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_symlink_at_the_target_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        let path = dir.path().join("x.json");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        replace(&path, b"new", Replace::PLAIN).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        assert!(!fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn temp_names_are_unguessable_and_a_file_planted_at_a_pid_name_is_left_alone() {
        assert_ne!(
            temp_name("x.prom", random_u64()),
            temp_name("x.prom", random_u64())
        );
        // A name derived from our pid, as another user could guess it: neither removed (in a
        // sticky directory that would fail, and block the write) nor written through.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.prom");
        let planted = dir
            .path()
            .join(format!(".x.prom.tmp-{}", std::process::id()));
        std::os::unix::fs::symlink(dir.path().join("victim"), &planted).unwrap();
        replace(&path, b"new", Replace::PLAIN).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert!(fs::symlink_metadata(&planted).is_ok());
        assert!(!dir.path().join("victim").exists());
    }

    #[test]
    fn temp_names_are_recognised() {
        assert!(is_temp(&temp_name("k.json", 0xdead_beef)));
        assert!(!is_temp("k.json"));
        assert!(!is_temp(".k.json.tmp-"));
        assert!(!is_temp(".k.json.tmp-12345"));
    }
}
