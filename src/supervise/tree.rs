//! A process tree seen from its subreaper: find every descendant in /proc, signal them all, reap.
//!
//! With PR_SET_CHILD_SUBREAPER every orphaned descendant is re-parented to us, so "some descendant
//! is alive" is the same as "waitpid(-1) has a child to wait for", and ECHILD means the tree is gone.
//!
//! A pid is a name that the kernel hands out again once its process is reaped, so nothing here
//! signals a pid that may have been reaped: the leader of the child's process group is reaped
//! last (until then its zombie keeps its pid, and so its group id, from being reused), and a
//! descendant found in /proc is signalled through a pidfd opened while its parent link is seen.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{getpid, Pid};

/// How often to look again for descendants that escaped a SIGKILL sweep by forking during it.
pub const SWEEP_AGAIN: std::time::Duration = std::time::Duration::from_millis(20);

/// Every living descendant of `root` with its parent, from the parent links in /proc.
fn descendants(root: Pid) -> Vec<(Pid, Pid)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let links: Vec<(i32, i32)> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect();
    let mut found = vec![(root.as_raw(), 0)];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i].0;
        found.extend(links.iter().filter(|(_, pp)| *pp == parent));
        i += 1;
    }
    found[1..]
        .iter()
        .map(|(p, pp)| (Pid::from_raw(*p), Pid::from_raw(*pp)))
        .collect()
}

/// The parent pid from /proc/PID/stat; the command name may hold spaces and parentheses, so the
/// fields are read after the last ')'.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The children of this process, from /proc/self/task/*/children (a reparented orphan joins
/// any of our threads); the scan of every parent link where that file does not exist.
fn children() -> Vec<Pid> {
    let me = getpid();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return scan_children(me);
    };
    let mut found = Vec::new();
    for task in tasks.flatten() {
        let Ok(list) = std::fs::read_to_string(task.path().join("children")) else {
            return scan_children(me);
        };
        found.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    found.into_iter().map(Pid::from_raw).collect()
}

fn scan_children(me: Pid) -> Vec<Pid> {
    descendants(me)
        .into_iter()
        .filter(|(_, parent)| *parent == me)
        .map(|(pid, _)| pid)
        .collect()
}

/// `sig` to `pid`, but only while it is still the child of `parent`: the pidfd names this very
/// process, so a pid reaped and handed to a stranger since /proc was read is not signalled.
fn signal_descendant(pid: Pid, parent: Pid, sig: Signal) {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        // ESRCH is normal: it is gone already. A kernel without pidfd_open was refused before
        // anything started (supervise::kernel).
        return;
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if parent_of(pid.as_raw()) != Some(parent.as_raw()) {
        return;
    }
    // SAFETY: pidfd_send_signal with our pidfd, a signal number and no siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig as i32,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

/// A subreaper's tree: every descendant, and the child that leads the process group leasewrap
/// signals. The leader is reaped last, so that its pid, which names the group, stays reserved
/// for as long as the group is signalled.
#[derive(Debug)]
pub struct Tree {
    /// The group leader while it is ours to reap; none once reaped (or never ours).
    leader: Option<Pid>,
    /// How the leader ended, once it did; its zombie waits for the rest of the tree.
    leader_status: Option<WaitStatus>,
}

impl Tree {
    /// The tree under this process; `leader` must be a child of ours not yet reaped.
    pub fn new(leader: Option<Pid>) -> Tree {
        Tree {
            leader,
            leader_status: None,
        }
    }

    /// The tree that a dead watchdog left to us: its child leads the group only if the watchdog
    /// had not reaped it (then it came to us, and it is ours to reap).
    pub fn inherited(child: Option<Pid>) -> Tree {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        // ECHILD: not our child, so its pid may already name a stranger.
        Tree::new(child.filter(|c| waitid(Id::Pid(*c), flags).is_ok()))
    }

    /// How the leader ended, once it did.
    pub fn leader_status(&self) -> Option<WaitStatus> {
        self.leader_status
    }

    /// Send `sig` to the leader's group and to every descendant, in that group or not.
    /// ESRCH is normal: the group or a process may already be gone.
    pub fn signal(&self, sig: Signal) {
        if let Some(leader) = self.leader {
            let _ = killpg(leader, sig);
        }
        for (pid, parent) in descendants(getpid()) {
            signal_descendant(pid, parent, sig);
        }
    }

    /// Reap every child that has ended, without blocking, the leader last: true once the whole
    /// tree is gone.
    pub fn reap(&mut self) -> nix::Result<bool> {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        if let (Some(leader), None) = (self.leader, self.leader_status) {
            // WNOWAIT: its status is read and its zombie stays.
            self.leader_status = match waitid(Id::Pid(leader), flags)? {
                WaitStatus::StillAlive => None,
                status => Some(status),
            };
        }
        let mut others_left = false;
        for pid in children().into_iter().filter(|p| Some(*p) != self.leader) {
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => others_left = true,
                // ECHILD: reaped by a wait of ours that raced this listing.
                Ok(_) | Err(Errno::ECHILD) => {}
                Err(e) => return Err(e),
            }
        }
        if others_left || (self.leader.is_some() && self.leader_status.is_none()) {
            return Ok(false);
        }
        self.reap_last()
    }

    /// Only the leader's zombie is left: reap it, and then nothing may be left at all.
    fn reap_last(&mut self) -> nix::Result<bool> {
        if let Some(leader) = self.leader.take() {
            waitpid(leader, None)?;
        }
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            // No child left: the whole tree is gone.
            Err(Errno::ECHILD) => Ok(true),
            // One that the listing missed: the next round sweeps and reaps it.
            Ok(_) | Err(Errno::EINTR) => Ok(false),
            Err(e) => Err(e),
        }
    }
}
