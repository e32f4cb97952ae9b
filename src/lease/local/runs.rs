//! Run records of the local backend: one file per (name, KEY), `DIR/runs/NAME/KEY.json`, beside
//! the lock and token files but never named like them. `runs/` and `runs/NAME` are reached
//! through the state directory's descriptor, never through a link, and each is checked as the
//! state directory is (ours or root's, writable by nobody else); a record is opened as the token
//! file is (no link, no FIFO, a regular file of ours with one link, read no further than
//! [`RECORD_MAX`]). A record is written whole (temp file, fsync, rename, fsync of the folder)
//! while the lock NAME is held and still names its file.
//!
//! The sweep that each write makes goes by the `keep_until` inside the records, never by a
//! file's modification time, and never by this host's clock alone (see `runs::record::confirmed_expired`).

use std::path::Path;
use std::time::SystemTime;

use crate::error::Error;
use crate::files::{self, Dir, RECORD_MAX};
use crate::runs::file::{self, Replace};
use crate::runs::record::{confirmed_expired, unix_seconds, SWEEP_READS};
use crate::runs::{RunRecord, Unreadable, Written};

/// Who reaches the records, and so how far they are trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// A run, under the lease: folders checked as the state directory is, and made when a
    /// record is written; a record must be a regular file of ours with one link.
    Run,
    /// `status`, of any user's directory: no link followed, no FIFO waited on, nothing made;
    /// a record must be a regular file.
    Status,
}

/// A record's file name in its folder.
fn file_name(key: &str) -> String {
    format!("{key}.json")
}

/// The folder of `name`'s records, `DIR/runs/NAME`, reached from the state directory `dir`
/// through descriptors; made when `create`, else none when missing.
fn folder(dir: &Path, name: &str, access: Access, create: bool) -> Result<Option<Dir>, Error> {
    let state = match (access, create) {
        (Access::Run, true) => Some(Dir::state(dir)?),
        (Access::Run, false) => Dir::existing_state(dir)?,
        (Access::Status, _) => Dir::to_read(dir)?,
    };
    let Some(runs) = state.map(|s| sub(&s, "runs", access, create)).transpose()? else {
        return Ok(None);
    };
    runs.map(|r| sub(&r, name, access, create))
        .transpose()
        .map(Option::flatten)
}

fn sub(dir: &Dir, name: &str, access: Access, create: bool) -> Result<Option<Dir>, Error> {
    match access {
        Access::Run => dir.sub(name, create),
        Access::Status => dir.sub_to_read(name),
    }
}

/// The record of (`name`, `key`) in `folder`, expired or not; none when there is no file.
fn load(folder: &Dir, name: &str, key: &str, access: Access) -> Result<Option<RunRecord>, Error> {
    let file_name = file_name(key);
    let opened = match access {
        Access::Run => folder.open_own_read(&file_name)?,
        Access::Status => folder.open_read(&file_name)?,
    };
    let Some(file) = opened else {
        return Ok(None);
    };
    let path = folder.join(&file_name);
    let bytes = files::read_bounded(&file, &path, RECORD_MAX)?;
    RunRecord::parse(&bytes, name, key)
        .map(Some)
        .map_err(|why| foreign(&path, &why))
}

/// The record of (`name`, `key`), none before its first run or once its keep time has passed
/// (as etcd's lease would have removed it). A file that is not such a record, or that is not
/// opened as a record must be, is a configuration error (78): it is never taken for "done" nor
/// overwritten.
pub fn read(dir: &Path, name: &str, key: &str) -> Result<Option<RunRecord>, Error> {
    read_as(dir, name, key, Access::Run)
}

/// The record of (`name`, `key`) as [`read`] gives it, for `status` (of any user's directory).
pub fn look(dir: &Path, name: &str, key: &str) -> Result<Option<RunRecord>, Error> {
    read_as(dir, name, key, Access::Status)
}

fn read_as(dir: &Path, name: &str, key: &str, access: Access) -> Result<Option<RunRecord>, Error> {
    let Some(folder) = folder(dir, name, access, false)? else {
        return Ok(None);
    };
    let record = load(&folder, name, key, access)?;
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
    let folder = folder(dir, &record.name, Access::Run, true)?
        .ok_or_else(|| Error::Internal(format!("{}: removed while opening", dir.display())))?;
    if let Err(why) = still_ours() {
        return Ok(Written::Refused(why));
    }
    let name = file_name(&record.key);
    file::replace_in(
        folder.fd(),
        &name,
        &record.to_json(),
        Replace { durable: true },
    )
    .map_err(|e| {
        Error::internal(
            format!("writing run record {}", folder.join(&name).display()),
            e,
        )
    })?;
    sweep(&folder, record, SystemTime::now());
    Ok(Written::Stored)
}

/// Remove the records of one name that [`confirmed_expired`] finds among [`SWEEP_READS`] of
/// them, and temp files of writers that died: only the lock holder writes here, so under the
/// lock every temp file is garbage. `written` (just stored) is not weighed: its `end` is this
/// host's clock, which is in question.
fn sweep(folder: &Dir, written: &RunRecord, now: SystemTime) {
    sweep_from(folder, written, now, files::random_u64() as usize);
}

/// [`sweep`], reading the records from the `start`th (modulo their number) in name order.
fn sweep_from(folder: &Dir, written: &RunRecord, now: SystemTime, start: usize) {
    let Ok(names) = folder.names() else {
        return;
    };
    let mut keys = Vec::new();
    for name in names.iter().filter_map(|n| n.to_str()) {
        if file::is_temp(name) {
            let _ = folder.remove(name);
        } else if let Some(key) = name.strip_suffix(".json").filter(|k| *k != written.key) {
            keys.push(key);
        }
    }
    keys.sort_unstable();
    let first = start.checked_rem(keys.len()).unwrap_or(0);
    let window = keys
        .iter()
        .cycle()
        .skip(first)
        .take(keys.len().min(SWEEP_READS));
    let records: Vec<(String, RunRecord)> = window
        .filter_map(|key| {
            let record = load(folder, &written.name, key, Access::Run).ok()??;
            Some((file_name(key), record))
        })
        .collect();
    for name in confirmed_expired(&records, unix_seconds(now)) {
        let _ = folder.remove(name);
    }
}

/// Every record of `name`, and what stands at a record's place and is not one, for `status`.
/// Reads only.
pub fn list(dir: &Path, name: &str) -> Vec<Result<RunRecord, Unreadable>> {
    let unreadable = |key: &str, e: Error| Unreadable {
        key: key.to_owned(),
        why: e.to_string(),
    };
    let folder = match folder(dir, name, Access::Status, false) {
        Ok(Some(folder)) => folder,
        Ok(None) => return Vec::new(),
        Err(e) => return vec![Err(unreadable("-", e))],
    };
    let names = folder.names().unwrap_or_default();
    let keys = names
        .iter()
        .filter_map(|n| n.to_str())
        .filter(|n| !file::is_temp(n))
        .filter_map(|n| n.strip_suffix(".json"));
    let mut out = Vec::new();
    for key in keys {
        match load(&folder, name, key, Access::Status) {
            Ok(Some(r)) if r.expired(SystemTime::now()) => {}
            Ok(Some(r)) => out.push(Ok(r)),
            Ok(None) => {}
            Err(e) => out.push(Err(unreadable(key, e))),
        }
    }
    out
}

/// The names that have a folder of records in the state directory `dir`, for a `status`
/// listing. Reads only.
pub fn names(dir: &Path) -> Vec<String> {
    let runs = Dir::to_read(dir)
        .ok()
        .flatten()
        .map(|d| d.sub_to_read("runs"));
    let Some(Ok(Some(runs))) = runs else {
        return Vec::new();
    };
    let names = runs.names().unwrap_or_default();
    names
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::{Outcome, Run};
    use std::time::Duration;

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

    fn folder_of(dir: &Path) -> std::path::PathBuf {
        dir.join("runs/job")
    }

    #[test]
    fn a_written_record_reads_back_and_a_refused_one_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path(), "job", "k").unwrap(), None);
        let r = record("k", Duration::from_secs(60));
        let w = write(dir.path(), &r, || Ok(())).unwrap();
        assert_eq!(w, Written::Stored);
        assert_eq!(read(dir.path(), "job", "k").unwrap(), Some(r.clone()));
        assert_eq!(look(dir.path(), "job", "k").unwrap(), Some(r.clone()));
        let other = record("k2", Duration::from_secs(60));
        let w = write(dir.path(), &other, || Err("lock file replaced".into())).unwrap();
        assert_eq!(w, Written::Refused("lock file replaced".into()));
        assert_eq!(read(dir.path(), "job", "k2").unwrap(), None);
        assert_eq!(list(dir.path(), "job"), vec![Ok(r)]);
        assert_eq!(names(dir.path()), ["job"]);
    }

    /// A record of `key` that ended at `end` and is kept until `keep_until` (Unix seconds).
    fn at(key: &str, end: f64, keep_until: f64) -> RunRecord {
        RunRecord {
            end,
            keep_until,
            ..record(key, Duration::ZERO)
        }
    }

    #[test]
    fn a_write_sweeps_confirmed_expired_records_and_temp_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let now = unix_seconds(SystemTime::now());
        write(dir.path(), &at("old", now - 100.0, now - 50.0), || Ok(())).unwrap();
        write(dir.path(), &at("kept", now - 10.0, now + 3600.0), || Ok(())).unwrap();
        let stale_temp = folder_of(dir.path()).join(".x.json.tmp-00000000000f423f");
        std::fs::write(&stale_temp, b"half").unwrap();
        let notes = folder_of(dir.path()).join("notes.json");
        std::fs::write(&notes, b"not a record").unwrap();
        write(dir.path(), &record("new", Duration::from_secs(60)), || {
            Ok(())
        })
        .unwrap();
        assert!(!folder_of(dir.path()).join("old.json").exists());
        assert!(read(dir.path(), "job", "kept").unwrap().is_some());
        assert!(!stale_temp.exists());
        assert!(
            notes.exists(),
            "a file that is not a record is not leasewrap's"
        );
    }

    #[test]
    fn a_sweep_reads_a_bounded_window_of_records_from_where_it_starts() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(folder_of(dir.path())).unwrap();
        let put = |r: RunRecord| {
            let path = folder_of(dir.path()).join(file_name(&r.key));
            std::fs::write(path, r.to_json()).unwrap();
        };
        let now = unix_seconds(SystemTime::now());
        let expired: Vec<String> = (0..100).map(|i| format!("a{i:03}")).collect();
        for key in &expired {
            put(at(key, now - 100.0, now - 50.0));
        }
        // The witness, last in name order: a sweep sees it only in a window that wraps to it.
        put(at("z", now - 10.0, now + 3600.0));
        let folder = folder(dir.path(), "job", Access::Run, false)
            .unwrap()
            .unwrap();
        let left = || {
            let mut names: Vec<String> = folder
                .names()
                .unwrap()
                .into_iter()
                .flat_map(|n| n.into_string())
                .collect();
            names.sort();
            names
        };
        let new = at("new", now, now + 60.0);
        sweep_from(&folder, &new, SystemTime::now(), 0);
        assert_eq!(left().len(), 101, "a000..a063 alone witness nothing");
        sweep_from(&folder, &new, SystemTime::now(), 40);
        let mut want: Vec<String> = expired[3..40].iter().map(|k| file_name(k)).collect();
        want.push("z.json".into());
        assert_eq!(
            left(),
            want,
            "a040..a099, z and a000..a002 were read; the expired went"
        );
    }

    #[test]
    fn a_foreign_file_is_a_configuration_error_not_done() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(folder_of(dir.path())).unwrap();
        std::fs::write(folder_of(dir.path()).join("k.json"), b"done\n").unwrap();
        let err = read(dir.path(), "job", "k").unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(
            err.to_string().contains("not a leasewrap run record"),
            "{err}"
        );
        let listed = list(dir.path(), "job");
        assert!(
            matches!(&listed[..], [Err(u)] if u.key == "k"),
            "{listed:?}"
        );
    }
}
