//! Run records of the local backend: one file per (name, KEY), `DIR/runs/NAME/KEY.json`, beside
//! the lock and token files but never named like them. A record is written whole (temp file,
//! fsync, rename, fsync of the folder) while the lock NAME is held and still names its file, and
//! is opened without following symlinks. Its modification time is set to its `keep_until`, so
//! the sweep that each write makes removes only records whose keep time has passed.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::file::{self, Replace};
use super::{RunRecord, Written};
use crate::error::Error;

/// The folder of the records of `name`.
pub fn name_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join("runs").join(name)
}

/// The record file of (`name`, `key`).
pub fn record_path(dir: &Path, name: &str, key: &str) -> PathBuf {
    name_dir(dir, name).join(format!("{key}.json"))
}

/// The record of (`name`, `key`), none before its first run or once its keep time has passed
/// (as etcd's lease would have removed it). A file that is not such a record is a configuration
/// error (78): it is never taken for "done" nor overwritten.
pub fn read(dir: &Path, name: &str, key: &str) -> Result<Option<RunRecord>, Error> {
    let path = record_path(dir, name, key);
    let bytes = file::read_nofollow(&path)
        .map_err(|e| Error::Config(format!("run record {}: {e}", path.display())))?;
    let record = bytes
        .map(|b| RunRecord::parse(&b, name, key))
        .transpose()
        .map_err(|why| foreign(&path, &why))?;
    Ok(record.filter(|r| !r.expired(SystemTime::now())))
}

fn foreign(path: &Path, why: &str) -> Error {
    Error::Config(format!(
        "run record {} {why}: move it away by hand, or use another --once KEY",
        path.display()
    ))
}

/// Store `record` if `still_ours` says the lock is still held, then sweep expired records.
pub fn write(
    dir: &Path,
    record: &RunRecord,
    still_ours: impl FnOnce() -> Result<(), String>,
) -> Result<Written, Error> {
    let folder = name_dir(dir, &record.name);
    crate::lease::local::ensure_dir(&folder)?;
    if let Err(why) = still_ours() {
        return Ok(Written::Refused(why));
    }
    let path = record_path(dir, &record.name, &record.key);
    let keep_until = UNIX_EPOCH + Duration::from_secs_f64(record.keep_until.max(0.0));
    let how = Replace {
        durable: true,
        mtime: Some(keep_until),
    };
    file::replace(&path, &record.to_json(), how)
        .map_err(|e| Error::internal(format!("writing run record {}", path.display()), e))?;
    let keep = Duration::from_secs_f64((record.keep_until - record.end).max(0.0));
    if sweep_due(&folder, keep, SystemTime::now()) {
        sweep(&folder, SystemTime::now());
        // Marked after the sweep: one that failed half way is done again next time.
        let _ = file::replace(&folder.join(SWEPT), b"", Replace::PLAIN);
    }
    Ok(Written::Stored)
}

/// The file whose modification time says when the records of a name were last swept.
pub const SWEPT: &str = ".swept";

/// How many sweeps a record's keep time holds: a sweep reads the whole folder, which holds the
/// records of one keep time's writes, so each write pays for this many entries on average, however
/// many records there are (`--once-per 1m` keeps ten thousand a week).
const SWEEPS_PER_KEEP: u32 = 8;

/// Whether the last sweep of `folder` is older than its share of `keep` (or in the future: a
/// clock that was set back), or there was none.
fn sweep_due(folder: &Path, keep: Duration, now: SystemTime) -> bool {
    let last = fs::symlink_metadata(folder.join(SWEPT)).and_then(|m| m.modified());
    let Ok(last) = last else { return true };
    now.duration_since(last)
        .map_or(true, |age| age >= keep / SWEEPS_PER_KEEP)
}

/// Remove the records of one name whose keep time has passed, and temp files of writers that
/// died: only the lock holder writes here, so under the lock every temp file is garbage.
fn sweep(folder: &Path, now: SystemTime) {
    let Ok(entries) = fs::read_dir(folder) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Ok(meta) = entry.metadata() else { continue };
        let expired = name.ends_with(".json")
            && meta.is_file()
            && meta.modified().is_ok_and(|keep_until| keep_until < now);
        if expired || file::is_temp(&name) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Every record of `name`, and the files there that are not records (with why), for `status`.
/// Reads only.
pub fn list(dir: &Path, name: &str) -> Vec<Result<RunRecord, String>> {
    let folder = name_dir(dir, name);
    let Ok(entries) = fs::read_dir(&folder) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(key) = file_name.strip_suffix(".json") else {
            continue;
        };
        let path = entry.path();
        let parsed = match file::read_nofollow(&path) {
            Ok(Some(b)) => RunRecord::parse(&b, name, key),
            Ok(None) => continue,
            Err(e) => Err(e.to_string()),
        };
        if parsed.as_ref().is_ok_and(|r| r.expired(SystemTime::now())) {
            continue;
        }
        out.push(parsed.map_err(|why| format!("{} {why}", path.display())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::{Outcome, Run};

    fn record(key: &str, keep: Duration) -> RunRecord {
        let run = Run {
            token: 3,
            start: SystemTime::now(),
            end: SystemTime::now(),
            outcome: Outcome::Failed,
            exit_status: Some(3),
            signal: None,
        };
        run.record("job", key, None, keep)
    }

    #[test]
    fn a_written_record_reads_back_and_a_refused_one_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path(), "job", "k").unwrap(), None);
        let r = record("k", Duration::from_secs(60));
        let w = write(dir.path(), &r, || Ok(())).unwrap();
        assert_eq!(w, Written::Stored);
        assert_eq!(read(dir.path(), "job", "k").unwrap(), Some(r.clone()));
        let other = record("k2", Duration::from_secs(60));
        let w = write(dir.path(), &other, || Err("lock file replaced".into())).unwrap();
        assert_eq!(w, Written::Refused("lock file replaced".into()));
        assert_eq!(read(dir.path(), "job", "k2").unwrap(), None);
        assert_eq!(list(dir.path(), "job"), vec![Ok(r)]);
    }

    #[test]
    fn a_write_sweeps_records_past_their_keep_time_only() {
        let dir = tempfile::tempdir().unwrap();
        let old = record("old", Duration::ZERO);
        write(dir.path(), &old, || Ok(())).unwrap();
        let kept = record("kept", Duration::from_secs(3600));
        write(dir.path(), &kept, || Ok(())).unwrap();
        let stale_temp = name_dir(dir.path(), "job").join(".x.json.tmp-00000000000f423f");
        fs::write(&stale_temp, b"half").unwrap();
        let swept = name_dir(dir.path(), "job").join(SWEPT);
        let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
        fs::File::options()
            .write(true)
            .open(&swept)
            .unwrap()
            .set_modified(an_hour_ago)
            .unwrap();
        write(dir.path(), &record("new", Duration::from_secs(60)), || {
            Ok(())
        })
        .unwrap();
        assert_eq!(read(dir.path(), "job", "old").unwrap(), None);
        assert!(read(dir.path(), "job", "kept").unwrap().is_some());
        assert!(!stale_temp.exists());
    }

    #[test]
    fn a_sweep_is_due_once_per_eighth_of_keep_or_when_its_mark_is_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let (keep, now) = (Duration::from_secs(80), SystemTime::now());
        assert!(sweep_due(dir.path(), keep, now), "never swept");
        fs::write(dir.path().join(SWEPT), b"").unwrap();
        assert!(!sweep_due(dir.path(), keep, now + Duration::from_secs(9)));
        assert!(sweep_due(dir.path(), keep, now + Duration::from_secs(11)));
        assert!(
            sweep_due(dir.path(), keep, now - Duration::from_secs(60)),
            "mark ahead"
        );
    }

    #[test]
    fn a_foreign_file_is_a_configuration_error_not_done() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(name_dir(dir.path(), "job")).unwrap();
        fs::write(record_path(dir.path(), "job", "k"), b"done\n").unwrap();
        let err = read(dir.path(), "job", "k").unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(
            err.to_string().contains("not a leasewrap run record"),
            "{err}"
        );
    }
}
