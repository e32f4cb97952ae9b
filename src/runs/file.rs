//! Small files written whole: a new temp file beside the target, opened without following
//! symlinks and never reused (`O_EXCL`), then renamed over the target. A reader sees the old file
//! or the new one, never a mix; a symlink planted at either name is replaced, never written through.

use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// How a replacement is made.
#[derive(Debug, Clone, Copy)]
pub struct Replace {
    /// Sync the data and the directory before returning: the file must survive a crash.
    pub durable: bool,
    /// The modification time to give the file; now when none.
    pub mtime: Option<SystemTime>,
}

impl Replace {
    /// Atomic for readers, not synced: for a file that is rewritten on every run anyway.
    pub const PLAIN: Replace = Replace {
        durable: false,
        mtime: None,
    };
}

use crate::files::{parent, random_u64};

/// How many names [`create_temp`] tries before giving up: a clash with a planted or leftover
/// file is all that makes one fail, and each try draws a new random name.
const TEMP_TRIES: usize = 8;

/// A temp file name for `path` with `random` in it: hidden, and not ending like `path`, so that
/// a collector reading `*.prom` or a lister of `*.json` skips it; unguessable, so that another
/// user who can write the directory cannot plant it ahead of us.
fn temp_path(path: &Path, random: u64) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    parent(path).join(format!(".{name}.tmp-{random:016x}"))
}

/// Whether `file_name` is a temp file of [`temp_path`]'s making.
pub fn is_temp(file_name: &str) -> bool {
    file_name.starts_with('.')
        && file_name
            .rsplit_once(".tmp-")
            .is_some_and(|(_, hex)| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Create a new temp file for `path` under a fresh random name, never following a symlink and
/// never reusing a file that exists (EEXIST: draw another name).
fn create_temp(path: &Path) -> io::Result<(File, PathBuf)> {
    let mut last = io::Error::from(ErrorKind::AlreadyExists);
    for _ in 0..TEMP_TRIES {
        let tmp = temp_path(path, random_u64());
        let opened = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp);
        match opened {
            Ok(file) => return Ok((file, tmp)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// Replace `path` with `bytes` as `how` says.
pub fn replace(path: &Path, bytes: &[u8], how: Replace) -> io::Result<()> {
    let (mut file, tmp) = create_temp(path)?;
    let written = (|| {
        file.write_all(bytes)?;
        if let Some(t) = how.mtime {
            file.set_modified(t)?;
        }
        if how.durable {
            file.sync_all()?;
        }
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    if how.durable {
        File::open(parent(path))?.sync_all()?;
    }
    Ok(())
}

/// Whether a file can be made beside `path` now: one is made and removed again.
pub fn check_writable(path: &Path) -> io::Result<()> {
    let (_, tmp) = create_temp(path)?;
    fs::remove_file(&tmp)
}

/// The contents of `path`, none when it does not exist; a symlink there is an error (ELOOP).
pub fn read_nofollow(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    let mut file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_writes_whole_files_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.prom");
        let how = Replace {
            durable: true,
            mtime: None,
        };
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
        assert_eq!(
            read_nofollow(&path).unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );
        replace(&path, b"new", Replace::PLAIN).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        assert!(!fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn temp_names_are_unguessable_and_a_file_planted_at_a_pid_name_is_left_alone() {
        let path = Path::new("/d/x.prom");
        assert_ne!(temp_path(path, random_u64()), temp_path(path, random_u64()));
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
        let t = temp_path(Path::new("/d/k.json"), 0xdead_beef);
        assert!(is_temp(&t.file_name().unwrap().to_string_lossy()));
        assert!(!is_temp("k.json"));
        assert!(!is_temp(".k.json.tmp-"));
        assert!(!is_temp(".k.json.tmp-12345"));
        assert_eq!(read_nofollow(Path::new("/nonexistent/x")).unwrap(), None);
    }
}
