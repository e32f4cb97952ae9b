//! Once per scheduled run (SPEC §10): the run record of each (name, KEY), the decision taken from
//! it before a child starts, the --once-per slot key, and the --metrics-file textfile. The records
//! are written only by the holder of the lease NAME, under its fencing token, so a stale holder's
//! record is refused; nothing here takes a lease or touches a process.

pub mod file;
pub mod metrics;
pub mod record;
pub mod slot;

pub use record::{time_text, Decision, Outcome, Run, RunRecord};

use std::time::Duration;

/// The longest --keep: ten years of humantime's (365.25 days each, so `--keep 10y` is taken).
/// Both backends store it with room to spare: etcd's lease TTLs go up to 9,000,000,000 s (285
/// years), and a record's end plus its keep stays far inside what `SystemTime` holds and the
/// years 1970 to 9999 that a record's times must fall in.
pub const MAX_KEEP: Duration = Duration::from_secs(10 * 31_557_600);

/// The shortest --keep: etcd counts lease TTLs in whole seconds.
pub const MIN_KEEP: Duration = Duration::from_secs(1);

/// --keep when none is given and no --once-per slot asks for more.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a record is kept: `given` (--keep), checked against its bounds and against the
/// --once-per slot `per`, which it must cover (a record gone before its slot is over lets that
/// slot run again); without --keep, [`DEFAULT_KEEP`] or twice the slot, whichever is longer
/// (the second slot's worth is the margin for hosts whose clocks differ), at most [`MAX_KEEP`].
pub fn keep_of(given: Option<Duration>, per: Option<Duration>) -> Result<Duration, String> {
    let show = |d: Duration| humantime::format_duration(d).to_string();
    let Some(keep) = given else {
        let slots = per.map_or(Duration::ZERO, |p| p.saturating_mul(2));
        return Ok(DEFAULT_KEEP.max(slots).min(MAX_KEEP));
    };
    if keep < MIN_KEEP {
        return Err(format!(
            "--keep {} is too short: run records are kept for 1s at least",
            show(keep)
        ));
    }
    if keep > MAX_KEEP {
        return Err(format!(
            "--keep {} is too long: run records are kept for {} at most",
            show(keep),
            show(MAX_KEEP)
        ));
    }
    match per {
        Some(per) if keep < per => Err(format!(
            "--keep {} is shorter than the --once-per slot ({}): the record would be gone before its slot is over, and the slot would run again; give --keep {} or more, or leave --keep out",
            show(keep),
            show(per),
            show(per)
        )),
        _ => Ok(keep),
    }
}

/// What --once or --once-per asks for, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Once {
    /// The KEY whose success is recorded: given, or the --once-per slot of the start time.
    pub key: String,
    /// How long its record is kept (--keep).
    pub keep: Duration,
    /// Runs of KEY after which it is given up (--max-attempts); none: never.
    pub max_attempts: Option<u32>,
}
pub mod book;

/// What stands at a record's place and is not a record of it (a FIFO, a link, another layout,
/// a damaged value), for `status` to show.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unreadable {
    /// The KEY whose place it is; `-` when a whole folder was refused.
    pub key: String,
    /// Why it is not a record, naming the file or etcd key.
    pub why: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn keep_defaults_to_seven_days_or_twice_a_longer_slot_within_the_bound() {
        assert_eq!(keep_of(None, None), Ok(DEFAULT_KEEP));
        assert_eq!(keep_of(None, Some(DAY)), Ok(DEFAULT_KEEP));
        assert_eq!(keep_of(None, Some(DAY * 30)), Ok(DAY * 60));
        assert_eq!(keep_of(None, Some(MAX_KEEP)), Ok(MAX_KEEP));
        assert_eq!(keep_of(Some(DAY), Some(DAY)), Ok(DAY));
        assert_eq!(keep_of(Some(MAX_KEEP), None), Ok(MAX_KEEP));
    }

    #[test]
    fn keep_beyond_its_bounds_or_shorter_than_the_slot_is_refused_naming_the_bound() {
        let too_long = keep_of(Some(Duration::from_secs(i64::MAX as u64)), None).unwrap_err();
        assert!(too_long.contains("10years at most"), "{too_long}");
        let short = keep_of(Some(Duration::from_secs(1)), Some(DAY)).unwrap_err();
        assert!(
            short.contains("shorter than the --once-per slot (1day)"),
            "{short}"
        );
        let zero = keep_of(Some(Duration::ZERO), None).unwrap_err();
        assert!(zero.contains("1s at least"), "{zero}");
    }
}

/// Whether a record was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Stored under the fencing token.
    Stored,
    /// Refused, for this reason: the lease is no longer ours (a stale holder).
    Refused(String),
}

/// How once per scheduled run works, as the man page's ONCE PER SCHEDULED RUN section says it:
/// each option and what it does.
pub const MAN_SECTION: &[(&str, &str)] = &[
    (
        "--once KEY",
        "After taking the lease and before starting COMMAND, leasewrap reads the run record of (NAME, KEY): on etcd in the very transaction that takes the lease, or that finds the way clear after a wait, so --once costs no request of its own. If a run of KEY succeeded, on any host of the backend, it starts nothing, gives the lease back, logs who ran it (host, pid, token, end) and exits with the conflict status (75, or -E N); waiters queued with --wait see the record as their turn comes. KEY follows the rule of lease names: 1-128 ASCII letters, digits and . _ - @ : + =, not . or .. (so every --once-per key, as 2026-12-01T02:00:00Z, is one); nothing invisible, bidirectional or control, which could make one KEY print like another or drive a terminal, is accepted (64).",
    ),
    (
        "success",
        "When COMMAND exits 0 the success is recorded under the fencing token: on etcd in one transaction that succeeds only while the own lock key still has the token as its create revision; on the local backend written and fsynced while the lock is held and its file is still the one its path names. A success that cannot be recorded (the lease was lost: a paused or cut-off holder) is not one: leasewrap exits with the lost status (124) and the next holder runs KEY again; one that etcd did not answer for exits 69, and likewise counts for nothing.",
    ),
    (
        "failure",
        "A run that exits non-zero, dies of a signal or runs past --max-runtime records a failed attempt, so the next holder, on any host and at once with --wait, runs KEY again. A run whose lease was lost, and a leasewrap that is itself killed, record nothing: the next holder runs KEY again, and such runs do not count toward --max-attempts. After --max-attempts N recorded runs KEY is given up: later holders start nothing and exit with the conflict status.",
    ),
    (
        "--once-per DUR",
        "KEY is the slot boundary nearest to the wall-clock start, counted from the Unix epoch in UTC and written in RFC 3339: --once-per 1h at 01:59:58 gives 2026-12-01T02:00:00Z, and 1d slots begin at 00:00 UTC. Hosts whose clocks or wake-ups differ from the boundary by less than DUR/2 agree on the key. A schedule near the half-way point between two boundaries (02:30 with --once-per 1h) can land on either side: schedule the job at a boundary. With a systemd timer and Persistent=true, a host that boots late and catches up finds the slot done. DUR is 1s at least; --once-per and --once exclude each other.",
    ),
    (
        "--keep DUR",
        "How long KEY's record is kept, counted from the end of the run that wrote it: 1s to 10y (ten years of 365.25 days; etcd's lease TTLs go up to 285 years, so both backends hold it). With --once-per, --keep must be at least the slot (a record gone before its slot is over would let the slot run again): a shorter one is refused with status 64 before anything is acquired. Without --keep, a record is kept 7d, or twice the --once-per slot when that is longer (--once-per 30d keeps 60d): the second slot's worth covers hosts whose clocks differ.",
    ),
    (
        "records",
        "On etcd, PREFIX/runs/NAME/KEY: the segment after the prefix is empty, a name no lease can have, so a record is never under a lock's queue prefix PREFIX NAME/ (any key there would take part in the mutex). With --prefix '' that is /runs/NAME/KEY, which etcdctl lock touches only for a lock name starting with /runs/. Each record has a lease of its own, of TTL --keep, which runs from the moment the record is written at the end of the run: etcd deletes it then, and a leader change restarts the count, as for every etcd lease. On the local backend, DIR/runs/NAME/KEY.json: runs/ and runs/NAME are reached through the state directory's descriptor, never through a link, and like it must be owned by the user or root and writable by nobody else; a record is opened as the token file is (never through a link, never waiting on a FIFO, a regular file of the user with one link, read no further than 64 KiB). A record counts as gone once its keep_until has passed. Each write removes the temp files of writers that died and, among at most 64 records of NAME read from a random place on, every record whose keep_until lies before the end of another one read, which ended no later than now (the record just written aside): the records show that the keep time is over, never the clock alone, so a run under a clock far ahead (faked, or mis-set) deletes no record that is still kept, and modification times (cp -r, a restore from backup) play no part. A value that is not a leasewrap run record, a record with a time outside 1970 to 9999, a record file or folder that is refused: each ends a run with status 78 before anything starts (the lease is given back at once) and is never taken for done; status shows it as a row saying why.",
    ),
    (
        "--max-runtime DUR",
        "After DUR the child's whole tree is stopped as for a lost lease (the stop signal, --kill-after, SIGKILL), the lease is released, and leasewrap exits 123 (timeout(1)'s 124 is leasewrap's lost status). DUR must be longer than --kill-after.",
    ),
    (
        "--metrics-file PATH",
        "After every run or skip, PATH is replaced whole (a temp file in the same folder, opened without following symlinks, then renamed) with a node_exporter textfile-collector file: leasewrap_outcome{name,outcome} is 1 for this host's last outcome (ran-ok, failed, lost, timed-out, skipped-busy, skipped-done or gave-up) and 0 for the others; leasewrap_last_start_timestamp_seconds, leasewrap_last_end_timestamp_seconds, leasewrap_last_duration_seconds, leasewrap_last_exit_status and leasewrap_last_fencing_token describe it; with --once, leasewrap_once_attempts{name,key} counts the runs of KEY on every host and leasewrap_once_done_timestamp_seconds{name,key,host} says when and where KEY succeeded, so an alert can tell another host having run it from nobody having run it. Name the file *.prom in the collector's directory. At startup, before anything is acquired, its folder must exist and be writable (else 64), and PATH is refused with status 78 when another user planted it or could replace it: PATH must be absent or a regular file of the user leasewrap runs as, in a folder owned by that user or root that group and others cannot write unless it is sticky (as /tmp is: then nobody else can remove or rename the file). A write that fails after the run (a file planted since, a full disk) is an error line, shown even with -q, and leasewrap still exits with the child's status: the run happened, and its record says so. An invocation that neither ran nor skipped (bad usage, etcd unreachable, a signal while waiting) leaves the file as it was.",
    ),
];
