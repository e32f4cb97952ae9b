//! Run records (`--once`, `--once-per`) in the lease's own database: one row per (NAME, KEY) of
//! the installed SQL's run table, holding the record's JSON, read and written only through its
//! functions. A write (and a sweep's delete) checks, in the same transaction, that NAME is still
//! held under the writer's token, so a stale holder's record is refused.
//!
//! Nothing deletes a record by time on the server, so each write sweeps as ZooKeeper's does: it
//! reads at most `SWEEP_READS` of its name's records, the oldest keys first, and deletes those
//! that another record shows expired (`runs::record::confirmed_expired`: never by this host's
//! clock alone). A record whose keep_until has passed counts as gone meanwhile.

use std::time::SystemTime;

use super::Statements;
use crate::error::Error;
use crate::runs::record::{confirmed_expired, unix_seconds, SWEEP_READS};
use crate::runs::{RunRecord, Unreadable, Written};

/// The record of (`name`, `key`), none before its first run or once its keep time has passed.
/// A value that is not such a record is a configuration error (78).
pub async fn read(
    conn: &mut dyn Statements,
    name: &str,
    key: &str,
) -> Result<Option<RunRecord>, Error> {
    let Some(text) = conn.run_read(name, key).await? else {
        return Ok(None);
    };
    let record = parse(name, key, &text).map_err(|u| Error::Config(u.why))?;
    Ok(Some(record).filter(|r| !r.expired(SystemTime::now())))
}

/// A stored record of (`name`, `key`), or why it is not one.
fn parse(name: &str, key: &str, text: &str) -> Result<RunRecord, Unreadable> {
    RunRecord::parse(text.as_bytes(), name, key).map_err(|why| Unreadable {
        key: key.to_owned(),
        why: format!(
            "the run record of {name:?} and {key:?} {why}: an administrator deletes it from the run table, or use another --once KEY"
        ),
    })
}

/// Store `record` while its name is held under `token`; then the sweep.
pub async fn write(
    conn: &mut dyn Statements,
    token: u64,
    record: &RunRecord,
) -> Result<Written, Error> {
    let json = String::from_utf8_lossy(&record.to_json()).into_owned();
    let stored = conn
        .run_write(&record.name, token, &record.key, Some(&json))
        .await?;
    if !stored {
        return Ok(Written::Refused(format!(
            "the lease's row of {:?} is no longer held under token {token}",
            record.name
        )));
    }
    sweep(conn, token, record).await;
    Ok(Written::Stored)
}

/// After `written` was stored: read the oldest of its name's other records and delete those that
/// the records show expired. Best effort: a failure leaves them for the next write.
async fn sweep(conn: &mut dyn Statements, token: u64, written: &RunRecord) {
    let Ok(stored) = conn.runs(&written.name, SWEEP_READS, true).await else {
        return;
    };
    let records: Vec<(String, RunRecord)> = stored
        .iter()
        .filter(|(key, _)| *key != written.key)
        .filter_map(|(key, text)| Some((key.clone(), parse(&written.name, key, text).ok()?)))
        .collect();
    for key in confirmed_expired(&records, unix_seconds(SystemTime::now())) {
        if conn
            .run_write(&written.name, token, key, None)
            .await
            .is_err()
        {
            return;
        }
    }
}

/// At most `last` records of `name`, the last keys first (a --once-per slot's key is its time,
/// so those are the newest), and what stands at a record's place and is not one.
pub async fn list(
    conn: &mut dyn Statements,
    name: &str,
    last: usize,
) -> Result<Vec<Result<RunRecord, Unreadable>>, Error> {
    let stored = conn.runs(name, last, false).await?;
    Ok(stored
        .iter()
        .map(|(key, text)| parse(name, key, text))
        .collect())
}
