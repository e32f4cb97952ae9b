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
pub mod etcd;
pub mod local;

/// What stands at a record's place and is not a record of it (a FIFO, a link, another layout,
/// a damaged value), for `status` to show.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unreadable {
    /// The KEY whose place it is; `-` when a whole folder was refused.
    pub key: String,
    /// Why it is not a record, naming the file or etcd key.
    pub why: String,
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
        "After taking the lease and before starting COMMAND, leasewrap reads the run record of (NAME, KEY). If a run of KEY succeeded, on any host of the backend, it starts nothing, gives the lease back, logs who ran it (host, pid, token, end) and exits with the conflict status (75, or -E N); waiters queued with --wait see the record as their turn comes. KEY follows the rule of lease names: 1-128 ASCII letters, digits and . _ - @ : + =, not . or .. (so every --once-per key, as 2026-12-01T02:00:00Z, is one); nothing invisible, bidirectional or control, which could make one KEY print like another or drive a terminal, is accepted (64).",
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
        "records",
        "On etcd, PREFIX/runs/NAME/KEY: the segment after the prefix is empty, a name no lease can have, so a record is never under a lock's queue prefix PREFIX NAME/ (any key there would take part in the mutex). With --prefix '' that is /runs/NAME/KEY, which etcdctl lock touches only for a lock name starting with /runs/. Each record has a lease of its own, of TTL --keep (default 7d): etcd deletes it then, and a leader change restarts the count, as for every etcd lease. On the local backend, DIR/runs/NAME/KEY.json: runs/ and runs/NAME are reached through the state directory's descriptor, never through a link, and like it must be owned by the user or root and writable by nobody else; a record is opened as the token file is (never through a link, never waiting on a FIFO, a regular file of the user with one link, read no further than 64 KiB). A record counts as gone once its keep_until has passed. Each write removes the temp files of writers that died and, among at most 64 records of NAME read from a random place on, every record whose keep_until lies before the end of another one read, which ended no later than now (the record just written aside): the records show that the keep time is over, never the clock alone, so a run under a clock far ahead (faked, or mis-set) deletes no record that is still kept, and modification times (cp -r, a restore from backup) play no part. A value that is not a leasewrap run record, a record with a time outside 1970 to 9999, a record file or folder that is refused: each ends a run with status 78 before anything starts (the lease is given back at once) and is never taken for done; status shows it as a row saying why.",
    ),
    (
        "--max-runtime DUR",
        "After DUR the child's whole tree is stopped as for a lost lease (the stop signal, --kill-after, SIGKILL), the lease is released, and leasewrap exits 123 (timeout(1)'s 124 is leasewrap's lost status). DUR must be longer than --kill-after.",
    ),
    (
        "--metrics-file PATH",
        "After every run or skip, PATH is replaced whole (a temp file in the same folder, opened without following symlinks, then renamed) with a node_exporter textfile-collector file: leasewrap_outcome{name,outcome} is 1 for this host's last outcome (ran-ok, failed, lost, timed-out, skipped-busy, skipped-done or gave-up) and 0 for the others; leasewrap_last_start_timestamp_seconds, leasewrap_last_end_timestamp_seconds, leasewrap_last_duration_seconds, leasewrap_last_exit_status and leasewrap_last_fencing_token describe it; with --once, leasewrap_once_attempts{name,key} counts the runs of KEY on every host and leasewrap_once_done_timestamp_seconds{name,key,host} says when and where KEY succeeded, so an alert can tell another host having run it from nobody having run it. Name the file *.prom in the collector's directory; its folder must exist and be writable at startup. An invocation that neither ran nor skipped (bad usage, etcd unreachable, a signal while waiting) leaves the file as it was.",
    ),
];
