//! What a backend reports of a lease (its holder, token, time left, waiters, refusals), below
//! both the backends, which fill it in, and `status`, which renders it; and the holder record a
//! run leaves in its lock key, node or file.

use std::ffi::OsString;

use serde::{Deserialize, Serialize};

/// One lease as `status` reports it; the JSON object of `--json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseStatus {
    /// The lease name.
    pub name: String,
    /// "etcd" or "local", so a script reading a mixed list knows what time_left_s means.
    pub backend: &'static str,
    /// Whether someone holds it now.
    pub held: bool,
    /// Who holds it, as the holder recorded itself; none when free or not recorded (etcdctl lock).
    pub holder: Option<Holder>,
    /// The holder's fencing token; none when free.
    pub token: Option<u64>,
    /// Seconds until etcd expires the holder's lease; none on the local backend and when free.
    pub time_left_s: Option<i64>,
    /// The TTL etcd granted the holder's lease, for reading `time_left_s`.
    pub ttl_s: Option<i64>,
    /// Processes queued behind the holder; none when they cannot be counted.
    pub waiters: Option<u64>,
    /// The holder's lock key (etcd) or the lock file (local).
    pub key: Option<String>,
    /// Why the lock file was refused (a link, a FIFO, ...), or the lease could not be read (its
    /// ACL admits other identities); then nothing else is known.
    pub refused: Option<String>,
    /// Whether `refused` is a permission the server denied (77) rather than a file refused (78).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub denied: bool,
    /// Nodes under the lock parent shaped as lock nodes that are not (no session owns them):
    /// never waited for, never the holder.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<String>,
    /// The last runs recorded by --once, newest first (at most `status`'s LAST).
    pub runs: Vec<crate::runs::RunRecord>,
    /// What stands at a record's place and is not a record (at most `status`'s LAST).
    pub unreadable_runs: Vec<crate::runs::Unreadable>,
}

/// The record a holder leaves in its lock key, lock node or lock file: written by `run`, read by
/// `status`. On a shared etcd or ZooKeeper every client may read it, so it keeps the program the
/// holder runs but none of its arguments, which may hold a secret (`--db-password=...`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    /// Host name of the holding leasewrap.
    pub host: String,
    /// Pid of the holding leasewrap (not of its child).
    pub pid: u32,
    /// The program it runs (argv[0] as given); a record of an earlier release may hold all of argv.
    pub command: Vec<String>,
    /// How many arguments the program was given that the record leaves out.
    #[serde(default)]
    pub args: u32,
    /// When it took the lease, in seconds since the Unix epoch (as every time `status` gives).
    pub start: f64,
}

impl Holder {
    /// This process, about to hold a lease to run `command`.
    pub fn this_process(command: &[OsString]) -> Holder {
        let host = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        let start = crate::runs::record::unix_seconds(std::time::SystemTime::now());
        let program = command.first().map(|p| p.to_string_lossy().into_owned());
        Holder {
            host,
            pid: std::process::id(),
            command: program.into_iter().collect(),
            args: command.len().saturating_sub(1) as u32,
            start,
        }
    }

    /// The record as stored: one JSON object. (Strings and numbers always serialize.)
    pub fn to_record(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The record in `bytes`, if it is one; an `etcdctl lock` key holds an empty value.
    pub fn parse(bytes: &[u8]) -> Option<Holder> {
        serde_json::from_slice(bytes).ok()
    }
}

impl LeaseStatus {
    /// A lease that nobody holds.
    pub fn free(name: &str, backend: &'static str) -> LeaseStatus {
        LeaseStatus {
            name: name.to_owned(),
            backend,
            held: false,
            holder: None,
            token: None,
            time_left_s: None,
            ttl_s: None,
            waiters: Some(0),
            key: None,
            refused: None,
            denied: false,
            ignored: Vec::new(),
            runs: Vec::new(),
            unreadable_runs: Vec::new(),
        }
    }

    /// A lease that the server would not let this identity read.
    pub fn denied(name: &str, backend: &'static str, why: String) -> LeaseStatus {
        LeaseStatus {
            denied: true,
            ..LeaseStatus::refused(name, backend, why)
        }
    }

    /// A lease whose lock file was refused, for `why`.
    pub fn refused(name: &str, backend: &'static str, why: String) -> LeaseStatus {
        LeaseStatus {
            waiters: None,
            refused: Some(why),
            ..LeaseStatus::free(name, backend)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_records_parse_and_other_values_do_not() {
        let rec = br#"{"host":"h","pid":7,"command":["a","b"],"start":1700000000}"#;
        assert_eq!(Holder::parse(rec).map(|h| h.pid), Some(7));
        let me = Holder::this_process(&["./job".into(), "x y".into()]);
        assert_eq!(Holder::parse(&me.to_record()), Some(me));
        assert_eq!(Holder::parse(b""), None);
        assert_eq!(Holder::parse(b"not json"), None);
    }

    #[test]
    fn a_holder_record_keeps_the_program_and_no_argument() {
        let argv = [
            "./report.sh".into(),
            "--db-password=hunter2".into(),
            "x".into(),
        ];
        let me = Holder::this_process(&argv);
        assert_eq!(me.command, ["./report.sh"]);
        assert_eq!(me.args, 2);
        let stored = String::from_utf8(me.to_record()).unwrap();
        assert!(!stored.contains("hunter2"), "{stored}");
    }
}
