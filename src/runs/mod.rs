//! Once per scheduled run (SPEC §10): the run record of each (name, KEY), the decision taken from
//! it before a child starts, the --once-per slot key, and the --metrics-file textfile. The records
//! are written only by the holder of the lease NAME, under its fencing token, so a stale holder's
//! record is refused; nothing here takes a lease or touches a process.

pub mod file;
pub mod metrics;
pub mod record;
pub mod slot;

pub use record::{check_key, Decision, Outcome, Run, RunRecord};

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

/// Whether a record was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Stored under the fencing token.
    Stored,
    /// Refused, for this reason: the lease is no longer ours (a stale holder).
    Refused(String),
}
