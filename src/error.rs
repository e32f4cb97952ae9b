//! The one error type of leasewrap and the one mapping from errors to exit statuses (SPEC §3).

use std::path::PathBuf;

/// Exit statuses the user can choose (`-E`, `--lost-exit-code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitCodes {
    /// Status when the lease was not acquired (busy, or the wait ran out).
    pub conflict: u8,
    /// Status after the lease was lost and the child stopped.
    pub lost: u8,
}

impl Default for ExitCodes {
    fn default() -> Self {
        Self {
            conflict: 75,
            lost: 124,
        }
    }
}

/// Every way a leasewrap invocation can end other than the child's own status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Config(String),
    #[error("lease {name:?} is held by another process")]
    Busy { name: String },
    #[error("gave up waiting for lease {name:?} after {waited}")]
    WaitTimedOut { name: String, waited: String },
    #[error("lease {name:?} was lost ({why}); the child was stopped")]
    Lost { name: String, why: String },
    /// Says which endpoint and what failed, as in "etcd at 127.0.0.1:1: connection refused".
    #[error("{0}")]
    Unavailable(String),
    /// Says what was refused: the credentials, or the TLS handshake with which endpoint.
    #[error("{0}")]
    Auth(String),
    #[error("{}: command not found", .0.display())]
    NotFound(PathBuf),
    #[error("{}: not executable", .0.display())]
    NotExecutable(PathBuf),
    /// `seen` says what the resource holds instead, as in "report.csv.fence records token 9".
    #[error("stale fencing token {given}: {seen}; nothing was written")]
    StaleToken { given: u64, seen: String },
    #[error("interrupted by {0} while waiting for the lease; nothing was started")]
    Interrupted(nix::sys::signal::Signal),
    /// `by` says who ran KEY and when, as in "host web2, token 41, ended 2026-12-01T02:00:31Z".
    #[error("KEY {key:?} of {name:?} already ran ({by}); nothing was started")]
    Done {
        name: String,
        key: String,
        by: String,
    },
    #[error("KEY {key:?} of {name:?} was given up after {attempts} runs (--max-attempts); nothing was started")]
    GaveUp {
        name: String,
        key: String,
        attempts: u32,
    },
    #[error("the child of {name:?} ran past --max-runtime {after}; its whole tree was stopped")]
    TimedOut { name: String, after: String },
    /// Names what the kernel lacks and the Linux release that has it (supervise::kernel).
    #[error("{0}")]
    Kernel(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// The exit status for this error: the only place that decides it.
    pub fn code(&self, codes: ExitCodes) -> u8 {
        match self {
            Error::Usage(_) => 64,
            Error::Config(_) => 78,
            Error::Busy { .. }
            | Error::WaitTimedOut { .. }
            | Error::Done { .. }
            | Error::GaveUp { .. } => codes.conflict,
            Error::TimedOut { .. } => 123,
            Error::Lost { .. } => codes.lost,
            Error::Unavailable(_) => 69,
            Error::Auth(_) => 77,
            Error::StaleToken { .. } => 73,
            Error::NotExecutable(_) => 126,
            Error::NotFound(_) => 127,
            Error::Interrupted(sig) => signal_status(*sig as i32),
            Error::Kernel(_) => 71,
            Error::Internal(_) => 125,
        }
    }

    /// Whether this ends a run that started nothing because another holder has the lease or
    /// KEY already ran: the everyday case of a fleet, logged as a warning (hidden by `-q`).
    pub const fn is_skip(&self) -> bool {
        matches!(
            self,
            Error::Busy { .. } | Error::WaitTimedOut { .. } | Error::Done { .. }
        )
    }

    /// Wrap an I/O failure of leasewrap's own, naming what it was doing.
    pub fn internal(doing: impl std::fmt::Display, err: impl std::fmt::Display) -> Self {
        Error::Internal(format!("{doing}: {err}"))
    }
}

/// The status a shell shows for a process killed by signal `signo`: 128+n.
pub const fn signal_status(signo: i32) -> u8 {
    128u8.wrapping_add(signo as u8)
}

/// The exit status table of SPEC §3, as the man page and README print it.
pub const EXIT_STATUS_TABLE: &[(&str, &str)] = &[
    ("N", "the child exited with status N"),
    (
        "128+n",
        "the child was killed by signal n: leasewrap re-raises n on itself (core dumps off), so a shell sees 128+n",
    ),
    ("64", "bad usage: an option, duration, name or URL is wrong"),
    (
        "69",
        "etcd or ZooKeeper was unreachable before the lease was acquired, or a wait (--wait) ran out while it was; on ZooKeeper also an ensemble that answers too slowly for the timing rule",
    ),
    (
        "71",
        "the kernel lacks what leasewrap needs to stop the child's whole tree on time (pidfd_open, Linux 5.3; a CLOCK_BOOTTIME timerfd; PR_SET_CHILD_SUBREAPER): nothing was started",
    ),
    ("73", "fenced-write or fenced-put refused a stale fencing token"),
    (
        "75",
        "the lease is held (--no-wait) or the wait ran out (--wait), or with --once KEY is done or given up (--max-attempts): nothing was started; --conflict-exit-code changes it",
    ),
    (
        "77",
        "etcd or ZooKeeper refused the authentication or a permission, or the TLS handshake failed (a certificate not accepted, or an https:// endpoint or a ZooKeeper port that does not speak TLS)",
    ),
    (
        "78",
        "bad configuration: a certificate or password file is unreadable, or the local directory, a lock, token or fence file, a run record or its folder cannot be made or opened, or is refused (a symbolic link, a FIFO, another user's, writable by others, not one plain token, or a run record that is foreign or damaged)",
    ),
    (
        "123",
        "--max-runtime ran out: the child's whole tree was stopped and the lease released",
    ),
    (
        "124",
        "the lease was lost and the child was stopped; --lost-exit-code changes it",
    ),
    ("125", "leasewrap itself failed"),
    ("126", "COMMAND was found but is not executable"),
    ("127", "COMMAND was not found"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;

    fn code(e: Error) -> u8 {
        e.code(ExitCodes::default())
    }

    /// The variant's position in the enum. No wildcard arm: a new variant does not compile
    /// until it is numbered here, and then the test below wants an example of it.
    fn variant(e: &Error) -> usize {
        match e {
            Error::Usage(_) => 0,
            Error::Config(_) => 1,
            Error::Busy { .. } => 2,
            Error::WaitTimedOut { .. } => 3,
            Error::Lost { .. } => 4,
            Error::Unavailable(_) => 5,
            Error::Auth(_) => 6,
            Error::NotFound(_) => 7,
            Error::NotExecutable(_) => 8,
            Error::StaleToken { .. } => 9,
            Error::Interrupted(_) => 10,
            Error::Done { .. } => 11,
            Error::GaveUp { .. } => 12,
            Error::TimedOut { .. } => 13,
            Error::Kernel(_) => 14,
            Error::Internal(_) => 15,
        }
    }

    /// One example of every variant, in the order [`variant`] numbers them.
    fn one_of_each() -> Vec<Error> {
        vec![
            Error::Usage(String::new()),
            Error::Config(String::new()),
            Error::Busy { name: "x".into() },
            Error::WaitTimedOut {
                name: "x".into(),
                waited: String::new(),
            },
            Error::Lost {
                name: "x".into(),
                why: String::new(),
            },
            Error::Unavailable(String::new()),
            Error::Auth(String::new()),
            Error::NotFound("x".into()),
            Error::NotExecutable("x".into()),
            Error::StaleToken {
                given: 1,
                seen: String::new(),
            },
            Error::Interrupted(Signal::SIGTERM),
            Error::Done {
                name: "x".into(),
                key: "k".into(),
                by: String::new(),
            },
            Error::GaveUp {
                name: "x".into(),
                key: "k".into(),
                attempts: 2,
            },
            Error::TimedOut {
                name: "x".into(),
                after: String::new(),
            },
            Error::Kernel(String::new()),
            Error::Internal(String::new()),
        ]
    }

    #[test]
    fn every_error_maps_to_the_status_the_table_documents() {
        let documented = |c: u8| EXIT_STATUS_TABLE.iter().any(|(s, _)| *s == c.to_string());
        let all = one_of_each();
        let covered: Vec<usize> = all.iter().map(variant).collect();
        assert_eq!(
            covered,
            (0..=15).collect::<Vec<_>>(),
            "one example of each variant"
        );
        for e in all {
            if let Error::Interrupted(sig) = e {
                // Documented as the row "128+n".
                assert_eq!(code(Error::Interrupted(sig)), 128 + sig as u8);
                assert!(EXIT_STATUS_TABLE.iter().any(|(s, _)| *s == "128+n"));
                continue;
            }
            let c = code(e);
            assert!(documented(c), "status {c} is not in EXIT_STATUS_TABLE");
        }
        assert_eq!(code(Error::Interrupted(Signal::SIGTERM)), 143);
    }

    #[test]
    fn chosen_codes_replace_conflict_and_lost() {
        let codes = ExitCodes {
            conflict: 0,
            lost: 3,
        };
        assert_eq!(Error::Busy { name: "x".into() }.code(codes), 0);
        assert_eq!(
            Error::Lost {
                name: "x".into(),
                why: String::new()
            }
            .code(codes),
            3
        );
    }
}
