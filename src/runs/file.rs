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

use crate::files::parent;

/// The temp file a writer with our pid uses for `path`: hidden, and not ending like `path`, so
/// that a collector reading `*.prom` or a lister of `*.json` skips it.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    parent(path).join(format!(".{name}.tmp-{}", std::process::id()))
}

/// Whether `file_name` is a temp file of [`temp_path`]'s making, by any pid.
pub fn is_temp(file_name: &str) -> bool {
    file_name.starts_with('.')
        && file_name
            .rsplit_once(".tmp-")
            .is_some_and(|(_, pid)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// Create the temp file for `path` afresh, refusing to follow a symlink.
fn create_temp(tmp: &Path) -> io::Result<File> {
    // Ours from a killed earlier process with the same pid: under our name, so only ours.
    let _ = fs::remove_file(tmp);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)
}

/// Replace `path` with `bytes` as `how` says.
pub fn replace(path: &Path, bytes: &[u8], how: Replace) -> io::Result<()> {
    let tmp = temp_path(path);
    let written = (|| {
        let mut file = create_temp(&tmp)?;
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
    let tmp = temp_path(path);
    create_temp(&tmp)?;
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
    fn a_symlink_at_the_temp_name_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        let path = dir.path().join("x.json");
        std::os::unix::fs::symlink(&victim, temp_path(&path)).unwrap();
        replace(&path, b"new", Replace::PLAIN).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        assert_eq!(fs::read(&path).unwrap(), b"new");
    }

    #[test]
    fn temp_names_are_recognised() {
        let t = temp_path(Path::new("/d/k.json"));
        assert!(is_temp(&t.file_name().unwrap().to_string_lossy()));
        assert!(!is_temp("k.json"));
        assert!(!is_temp(".k.json.tmp-"));
        assert_eq!(read_nofollow(Path::new("/nonexistent/x")).unwrap(), None);
    }
}
