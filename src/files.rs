//! leasewrap's own small files (lock, token, fence, run records) in directories that someone
//! else may be able to write: opened relative to a directory descriptor, never through a
//! symbolic link, never blocking on a FIFO, read no further than a bound, and written only when
//! they are a regular file of ours with one link. Their contents are never echoed in a message:
//! a planted link must not turn an error line into a copy of some other file.
//!
//! A state directory (`--local-dir`) must also be owned by the effective user or root and be
//! writable by nobody else: one user per directory. It never decides what the files mean.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

use crate::error::Error;

/// The most a token or fence file may hold: a u64 in decimal and a newline, with room to spare.
pub const TOKEN_FILE_MAX: usize = 32;

/// The most of a record (a run record, a holder record in a lock file) that is read: one is a
/// few hundred bytes.
pub const RECORD_MAX: usize = 64 * 1024;

/// An open directory, the anchor of every file opened in it.
pub struct Dir {
    /// Opened with O_DIRECTORY (and O_NOFOLLOW for a state directory).
    fd: OwnedFd,
    /// For messages, and for the paths handed to others (the lock key).
    path: PathBuf,
}

impl Dir {
    /// The state directory `path`, created as [`ensure_dir`] does if missing, and checked.
    pub fn state(path: &Path) -> Result<Dir, Error> {
        ensure_dir(path)?;
        Dir::existing_state(path)?.ok_or_else(|| {
            Error::Config(format!(
                "--local-dir {}: removed while opening",
                path.display()
            ))
        })
    }

    /// The state directory `path` if it exists, checked; never creates anything.
    pub fn existing_state(path: &Path) -> Result<Option<Dir>, Error> {
        let Some(dir) = Dir::to_read(path)? else {
            return Ok(None);
        };
        dir.check_state()?;
        Ok(Some(dir))
    }

    /// The state directory `path` if it exists, to read only (`status`, of any user's directory).
    pub fn to_read(path: &Path) -> Result<Option<Dir>, Error> {
        let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
        let fd = match open_dir(path, flags) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                return Err(refused(path, "is a symbolic link or not a directory"))
            }
            Err(e) => {
                return Err(Error::Config(format!(
                    "--local-dir {}: {e}",
                    path.display()
                )))
            }
        };
        let path = path.to_owned();
        Ok(Some(Dir { fd, path }))
    }

    /// The directory that holds `file` (following links on the way, as any path lookup does).
    pub fn containing(file: &Path) -> Result<Dir, Error> {
        let path = parent(file);
        let fd = open_dir(&path, OFlag::O_DIRECTORY)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Ok(Dir { fd, path })
    }

    /// Owned by us or root, and writable by nobody else: nobody else can plant or swap files.
    fn check_state(&self) -> Result<(), Error> {
        match self.others_can_replace(false)? {
            Some(why) => Err(refused(&self.path, &why)),
            None => Ok(()),
        }
    }

    /// Why another user could plant or swap a file in this directory, if one could: it is owned
    /// by someone other than us or root, or writable by group or others. With `sticky_will_do`,
    /// a sticky directory (/tmp) is writable by all the same: there nobody else can remove or
    /// rename a file of ours. The one rule for every directory leasewrap writes in.
    pub fn others_can_replace(&self, sticky_will_do: bool) -> Result<Option<String>, Error> {
        let st = nix::sys::stat::fstat(&self.fd).map_err(|e| self.config(e))?;
        let euid = nix::unistd::geteuid().as_raw();
        let mode = st.st_mode & 0o7777;
        let sticky = sticky_will_do && mode & 0o1000 != 0;
        Ok(if st.st_uid != euid && st.st_uid != 0 {
            Some(format!(
                "is owned by uid {}, not by uid {euid} or root",
                st.st_uid
            ))
        } else if mode & 0o022 != 0 && !sticky {
            let fix = if sticky_will_do {
                "chmod +t or go-w"
            } else {
                "chmod go-w"
            };
            let not_sticky = if sticky_will_do {
                " and not sticky"
            } else {
                ""
            };
            Some(format!(
                "is writable by group or others{not_sticky} (mode {mode:o}); {fix} it"
            ))
        } else {
            None
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside this directory, for messages and for others to open.
    pub fn join(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    /// Open (creating, mode 0644) the file `name` for reading and writing; true if it was created
    /// now. Refused unless it is a regular file owned by the effective user with one link.
    pub fn open_own(&self, name: &str) -> Result<(File, bool), Error> {
        let base = OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let mode = Mode::from_bits_truncate(0o644);
        let excl = base | OFlag::O_CREAT | OFlag::O_EXCL;
        let mut tries = 0;
        let (fd, created) = loop {
            tries += 1;
            match nix::fcntl::openat(&self.fd, name, excl, mode) {
                Ok(fd) => break (fd, true),
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(self.open_failed(name, e)),
            }
            match nix::fcntl::openat(&self.fd, name, base, Mode::empty()) {
                Ok(fd) => break (fd, false),
                // Removed between the two opens: create it after all.
                Err(Errno::ENOENT) if tries < 3 => {}
                Err(e) => return Err(self.open_failed(name, e)),
            }
        };
        let file = File::from(fd);
        let st = nix::sys::stat::fstat(&file).map_err(|e| self.open_failed(name, e))?;
        self.check_own(name, &st)?;
        Ok((file, created))
    }

    /// Open `name` read-only if it is a regular file (of anyone); None if it does not exist.
    pub fn open_read(&self, name: &str) -> Result<Option<File>, Error> {
        let Some((file, st)) = self.open_existing(name)? else {
            return Ok(None);
        };
        if !is_regular(&st) {
            return Err(refused(&self.join(name), "is not a regular file"));
        }
        Ok(Some(file))
    }

    /// Open `name` read-only if it is a regular file of the effective user with one link, as
    /// [`Dir::open_own`] would use it; None if it does not exist. Creates nothing.
    pub fn open_own_read(&self, name: &str) -> Result<Option<File>, Error> {
        let Some((file, st)) = self.open_existing(name)? else {
            return Ok(None);
        };
        self.check_own(name, &st)?;
        Ok(Some(file))
    }

    /// `name`, which `st` describes, is a regular file of the effective user with one link:
    /// nobody else made it or can reach it by another name.
    fn check_own(&self, name: &str, st: &FileStat) -> Result<(), Error> {
        let euid = nix::unistd::geteuid().as_raw();
        if !is_regular(st) || st.st_uid != euid || st.st_nlink != 1 {
            let why = "is not a regular file of this user with one link; remove it";
            return Err(refused(&self.join(name), why));
        }
        Ok(())
    }

    /// `name` opened read-only, without following a link or waiting on a FIFO, and what it is.
    fn open_existing(&self, name: &str) -> Result<Option<(File, FileStat)>, Error> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = match nix::fcntl::openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(self.open_failed(name, e)),
        };
        let file = File::from(fd);
        let st = nix::sys::stat::fstat(&file).map_err(|e| self.open_failed(name, e))?;
        Ok(Some((file, st)))
    }

    /// The directory `name` in this one, reached through this one's descriptor and never
    /// through a link, checked as a state directory is (owned by us or root, writable by nobody
    /// else); created as [`ensure_dir`] would when `create`. None when missing and not created.
    pub fn sub(&self, name: &str, create: bool) -> Result<Option<Dir>, Error> {
        if create {
            let mode = Mode::from_bits_truncate(dir_mode());
            match nix::sys::stat::mkdirat(&self.fd, name, mode) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(self.open_failed(name, e)),
            }
        }
        let Some(dir) = self.sub_to_read(name)? else {
            return Ok(None);
        };
        dir.check_state()?;
        Ok(Some(dir))
    }

    /// The directory `name` in this one, to read only: never through a link, of any owner.
    pub fn sub_to_read(&self, name: &str) -> Result<Option<Dir>, Error> {
        let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        match nix::fcntl::openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => Ok(Some(Dir {
                fd,
                path: self.join(name),
            })),
            Err(Errno::ENOENT) => Ok(None),
            Err(Errno::ELOOP | Errno::ENOTDIR) => Err(refused(
                &self.join(name),
                "is a symbolic link or not a directory; remove it",
            )),
            Err(e) => Err(self.open_failed(name, e)),
        }
    }

    /// The names in this directory, read through its descriptor (`/proc/self/fd/N` names the
    /// open directory itself, whatever its path names now).
    pub fn names(&self) -> io::Result<Vec<std::ffi::OsString>> {
        use std::os::fd::AsRawFd;
        let here = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        let entries = std::fs::read_dir(here)?;
        Ok(entries.flatten().map(|e| e.file_name()).collect())
    }

    /// Remove the file `name` of this directory (never a directory, never through a link).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        remove_at(self.fd(), name)
    }

    /// What `name` is now, without following a link; None if nothing has that name.
    pub fn stat(&self, name: &str) -> Option<FileStat> {
        nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()
    }

    /// Make the directory's entries (a created or renamed file) durable.
    pub fn sync(&self) -> io::Result<()> {
        nix::unistd::fsync(&self.fd).map_err(io::Error::from)
    }

    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn open_failed(&self, name: &str, e: Errno) -> Error {
        match e {
            // O_NOFOLLOW on a link.
            Errno::ELOOP => refused(&self.join(name), "is a symbolic link; remove it"),
            e => Error::Config(format!("{}: {e}", self.join(name).display())),
        }
    }

    fn config(&self, e: Errno) -> Error {
        Error::Config(format!("{}: {e}", self.path.display()))
    }
}

/// Create the directory `path` (and its parents) owner-only, 0755 for root, unless it exists.
pub fn ensure_dir(path: &Path) -> Result<(), Error> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(dir_mode())
        .create(path)
        .map_err(|e| Error::Config(format!("--local-dir {}: {e}", path.display())))
}

/// The mode of a directory leasewrap makes: owner-only, 0755 for root (so that `status` run by
/// anyone can read root's leases).
fn dir_mode() -> u32 {
    if nix::unistd::geteuid().is_root() {
        0o755
    } else {
        0o700
    }
}

/// 64 bits from the operating system's secure generator (getrandom): what another user or client
/// must not guess (temp-file names planted ahead of us, SASL's cnonce, a lock node's prefix).
/// Each call draws anew. Should the kernel refuse (never on the kernels leasewrap runs on, which
/// have getrandom), std's per-process random keys stand in.
pub fn random_u64() -> u64 {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 8];
    match ring::rand::SystemRandom::new().fill(&mut bytes) {
        Ok(()) => u64::from_ne_bytes(bytes),
        Err(_) => {
            use std::hash::{BuildHasher, Hasher};
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(u64::from(std::process::id()));
            hasher.finish()
        }
    }
}

/// Remove the file `name` of the open directory `dir` (never a directory, never through a link).
pub fn remove_at(dir: std::os::fd::BorrowedFd, name: &str) -> io::Result<()> {
    let how = nix::unistd::UnlinkatFlags::NoRemoveDir;
    nix::unistd::unlinkat(dir, name, how).map_err(io::Error::from)
}

/// The directory `path` is in (`.` for a bare file name).
pub fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

fn open_dir(path: &Path, flags: OFlag) -> Result<OwnedFd, Errno> {
    nix::fcntl::open(
        path,
        flags | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

fn is_regular(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG
}

fn refused(path: &Path, why: &str) -> Error {
    Error::Config(format!("refusing {}: it {why}", path.display()))
}

/// Whether `file` is the inode that `st` describes.
pub fn same_inode(file: &File, st: &FileStat) -> bool {
    file.metadata()
        .is_ok_and(|m| m.dev() == st.st_dev && m.ino() == st.st_ino)
}

/// The contents of `file` (at `path`), at most `max` bytes: a longer file is refused, and its
/// contents are never put in the error.
pub fn read_bounded(file: &File, path: &Path, max: usize) -> Result<Vec<u8>, Error> {
    let mut buf = Vec::new();
    file.take(max as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    if buf.len() > max {
        return Err(refused(path, &format!("is longer than {max} bytes")));
    }
    Ok(buf)
}

/// The token a token or fence file holds: None when empty, else canonical decimal (no sign, no
/// leading zero, at most one trailing newline). Reads at most `TOKEN_FILE_MAX` bytes and never
/// puts the contents in its error.
pub fn read_token(file: &File, path: &Path) -> Result<Option<u64>, Error> {
    let mut buf = Vec::with_capacity(TOKEN_FILE_MAX + 1);
    file.take(TOKEN_FILE_MAX as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    parse_token(&buf).map_err(|why| {
        Error::Config(format!(
            "{} {why}: fix or remove it by hand (its contents are not shown)",
            path.display()
        ))
    })
}

/// The text of a token file: empty, or one canonical decimal u64 and an optional newline.
pub fn parse_token(bytes: &[u8]) -> Result<Option<u64>, &'static str> {
    if bytes.len() > TOKEN_FILE_MAX {
        return Err("is longer than any token");
    }
    let digits = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if bytes.is_empty() {
        return Ok(None);
    }
    let canonical = !digits.is_empty()
        && digits.iter().all(u8::is_ascii_digit)
        && (digits == b"0" || digits[0] != b'0');
    if !canonical {
        return Err("does not hold one token in plain decimal");
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|t| t.parse().ok())
        .map(Some)
        .ok_or("holds a number beyond any token")
}

/// Replace the whole content of `file` with `token` and a newline, durably. The file is cut
/// only when it was longer: a truncate, even to the same size, marks the inode for the
/// fdatasync to write, and an inode shares its block of the inode table with its neighbours
/// (the lock file's among them, rewritten on every run), so the fdatasync would then wait for
/// their writeback too: a third of a millisecond more in one run in five, measured.
pub fn write_token(file: &File, token: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let text = format!("{token}\n");
    file.write_all_at(text.as_bytes(), 0)?;
    if file.metadata()?.len() > text.len() as u64 {
        file.set_len(text.len() as u64)?;
    }
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_token_replaces_a_longer_or_shorter_one_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        for (token, text) in [(1234, "1234\n"), (7, "7\n"), (8, "8\n"), (10, "10\n")] {
            write_token(&file, token).unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        }
    }

    #[test]
    fn token_text_is_empty_or_one_canonical_decimal() {
        assert_eq!(parse_token(b""), Ok(None));
        assert_eq!(parse_token(b"0\n"), Ok(Some(0)));
        assert_eq!(parse_token(b"17\n"), Ok(Some(17)));
        assert_eq!(parse_token(b"17"), Ok(Some(17)));
        assert_eq!(parse_token(b"18446744073709551615\n"), Ok(Some(u64::MAX)));
        for bad in [
            &b"007"[..],
            b"8\n7",
            b" 18",
            b"-1",
            b"+1",
            b"\n",
            b"1\n\n",
            b"x",
            b"18446744073709551616",
            &[b'1'; 40],
        ] {
            assert!(parse_token(bad).is_err(), "{bad:?}");
        }
    }
}
