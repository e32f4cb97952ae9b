//! A process tree seen from its subreaper: find every descendant in /proc, signal them all, reap.
//!
//! With PR_SET_CHILD_SUBREAPER every orphaned descendant is re-parented to us, so "some descendant
//! is alive" is the same as "waitpid(-1) has a child to wait for", and ECHILD means the tree is gone.

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Every living descendant of `root`, from the parent links in /proc.
pub fn descendants(root: Pid) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let links: Vec<(i32, i32)> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect();
    let mut found = vec![root.as_raw()];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            links
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found[1..].iter().map(|p| Pid::from_raw(*p)).collect()
}

/// The parent pid from /proc/PID/stat; the command name may hold spaces and parentheses, so the
/// fields are read after the last ')'.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Send `sig` to the group `pgid` and to every descendant of `root`, in or out of that group.
/// ESRCH is normal: the group or a process may already be gone.
pub fn signal_tree(root: Pid, pgid: Option<Pid>, sig: Signal) {
    if let Some(pgid) = pgid {
        let _ = killpg(pgid, sig);
    }
    for pid in descendants(root) {
        let _ = kill(pid, sig);
    }
}

/// What one round of reaping found.
#[derive(Debug, Default)]
pub struct Reaped {
    /// Processes that ended, with their status.
    pub ended: Vec<(Pid, WaitStatus)>,
    /// ECHILD: no descendant is left.
    pub none_left: bool,
}

/// Reap every child that has ended, without blocking.
pub fn reap() -> nix::Result<Reaped> {
    let mut reaped = Reaped::default();
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return Ok(reaped),
            Ok(status) => match status.pid() {
                Some(pid) => reaped.ended.push((pid, status)),
                None => return Ok(reaped),
            },
            Err(Errno::EINTR) => continue,
            // Nothing left to wait for: the whole tree is gone.
            Err(Errno::ECHILD) => {
                reaped.none_left = true;
                return Ok(reaped);
            }
            Err(e) => return Err(e),
        }
    }
}
