//! What the kernel must have for the supervisor to keep its promise, tried before anything is
//! acquired. A kernel that lacks one is refused with one line and status 71 (EX_OSERR): there
//! is no fallback that would stop the child's tree with a weaker guarantee. Each feature is
//! tried itself, not read off the release number, so a kernel that has it backported passes.

use std::os::fd::{FromRawFd, OwnedFd};

use nix::errno::Errno;

use crate::error::Error;

/// What the kernel must have, as the man page's REQUIREMENTS and the README's Install name it.
pub const FEATURES: &[(&str, &str)] = &[
    (
        "pidfd_open (Linux 5.3)",
        "a descendant found in /proc is signalled through a pidfd, so that a pid reaped and handed to another process meanwhile is never signalled",
    ),
    (
        "a CLOCK_BOOTTIME timerfd (Linux 3.15)",
        "the watchdog's deadline timer, which counts while the machine is suspended",
    ),
    (
        "PR_SET_CHILD_SUBREAPER (Linux 3.4)",
        "every orphaned descendant of the child comes back to the watchdog, which kills and reaps it",
    ),
];

/// Try each feature of [`FEATURES`]; the first one missing is an [`Error::Kernel`] naming it.
pub fn check() -> Result<(), Error> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    owned(pidfd).map_err(|e| refused(e, Errno::ENOSYS, "pidfd_open", "5.3"))?;
    let flags = libc::TFD_CLOEXEC | libc::TFD_NONBLOCK;
    // SAFETY: timerfd_create takes a clock id and flags and returns a new descriptor or -1.
    let timer = unsafe { libc::timerfd_create(libc::CLOCK_BOOTTIME, flags) };
    // Before Linux 3.15 the clock is refused with EINVAL.
    owned(timer.into()).map_err(|e| refused(e, Errno::EINVAL, "CLOCK_BOOTTIME timerfd", "3.15"))?;
    let mut reaper: libc::c_int = 0;
    // SAFETY: PR_GET_CHILD_SUBREAPER writes one int through the pointer, which outlives the call.
    let got = unsafe {
        libc::prctl(
            libc::PR_GET_CHILD_SUBREAPER,
            &mut reaper as *mut libc::c_int,
        )
    };
    if got < 0 {
        // Before Linux 3.4 the option is unknown: EINVAL.
        return Err(refused(
            Errno::last(),
            Errno::EINVAL,
            "PR_SET_CHILD_SUBREAPER",
            "3.4",
        ));
    }
    Ok(())
}

/// The descriptor a system call returned, closed when dropped; its errno when it failed.
fn owned(fd: libc::c_long) -> Result<OwnedFd, Errno> {
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// [`Error::Kernel`] when `err` is how a kernel without `what` answers, else leasewrap's own
/// failure (out of descriptors, say).
fn refused(err: Errno, missing: Errno, what: &str, since: &str) -> Error {
    if err != missing {
        return Error::internal(format!("trying the kernel's {what}"), err);
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease");
    let release = release.map_or_else(|_| "unknown".to_owned(), |r| r.trim().to_owned());
    Error::Kernel(format!(
        "this kernel (Linux {release}) has no {what} ({err}): leasewrap needs Linux {since} or later to stop the child's whole tree on time; nothing was started"
    ))
}
