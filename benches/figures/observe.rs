//! How the benchmarks see instants without slowing the processes they time: a child's start is the
//! execve of a private copy of its binary (inotify IN_OPEN), a child's write is IN_MODIFY on the file
//! its stdout goes to, and an exit is the child's pidfd turning readable.
//!
//! Every event is stamped (CLOCK_MONOTONIC, `Instant`) when poll() returns, so two events of one
//! wakeup share a stamp and their gap is unknown: `together` says when that happened.
//! Nothing here sleeps; every wait is poll() with a bound.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// One event seen but not yet taken.
struct Seen {
    label: &'static str,
    at: Instant,
    /// Which poll() wakeup stamped it.
    wakeup: u64,
}

/// Starts, writes and exits of the children being timed, each under a label.
pub struct Events {
    inotify: OwnedFd,
    /// inotify watch descriptor -> label.
    watches: HashMap<i32, &'static str>,
    /// Exits still to come.
    pidfds: Vec<(OwnedFd, &'static str)>,
    backlog: Vec<Seen>,
    wakeups: u64,
    /// The wakeup of the event last taken for each label.
    taken_in: HashMap<&'static str, u64>,
}

impl Events {
    pub fn new() -> Events {
        // SAFETY: inotify_init1 takes flags only; the result is checked before use.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1: {}", io::Error::last_os_error());
        Events {
            // SAFETY: fd was just returned by inotify_init1 and is owned by nothing else.
            inotify: unsafe { OwnedFd::from_raw_fd(fd) },
            watches: HashMap::new(),
            pidfds: Vec::new(),
            backlog: Vec::new(),
            wakeups: 0,
            taken_in: HashMap::new(),
        }
    }

    /// `label` each time a process execs `binary` (execve opens it).
    pub fn watch_exec(&mut self, binary: &Path, label: &'static str) {
        self.watch(binary, libc::IN_OPEN, label);
    }

    /// `label` each time something writes to `file`.
    pub fn watch_write(&mut self, file: &Path, label: &'static str) {
        self.watch(file, libc::IN_MODIFY, label);
    }

    fn watch(&mut self, path: &Path, mask: u32, label: &'static str) {
        let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
        // SAFETY: the inotify fd is open and c_path is a NUL-terminated string that outlives the call.
        let wd =
            unsafe { libc::inotify_add_watch(self.inotify.as_raw_fd(), c_path.as_ptr(), mask) };
        let err = io::Error::last_os_error();
        assert!(wd >= 0, "inotify_add_watch {}: {err}", path.display());
        self.watches.insert(wd, label);
    }

    /// `label` once `pid` has exited; at once if it is already gone.
    pub fn watch_exit(&mut self, pid: i32, label: &'static str) {
        match pidfd_open(pid) {
            Ok(fd) => self.pidfds.push((fd, label)),
            Err(_) => self.backlog.push(Seen {
                label,
                at: Instant::now(),
                wakeup: u64::MAX,
            }),
        }
    }

    /// Drops every event seen so far and every exit still watched.
    pub fn reset(&mut self) {
        self.pidfds.clear();
        self.poll(Duration::ZERO);
        self.backlog.clear();
    }

    /// Waits up to `bound` for anything, and stamps what came.
    fn poll(&mut self, bound: Duration) {
        let mut fds = vec![libc::pollfd {
            fd: self.inotify.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        fds.extend(self.pidfds.iter().map(|(fd, _)| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        let ms = bound.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: fds is a valid array of fds.len() pollfd structs for the whole call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        let at = Instant::now();
        self.wakeups += 1;
        if n <= 0 {
            return; // timeout, or EINTR: the caller looks again
        }
        if fds[0].revents != 0 {
            self.read_inotify(at);
        }
        let exited: Vec<usize> = (1..fds.len()).filter(|&i| fds[i].revents != 0).collect();
        for i in exited.into_iter().rev() {
            let (_fd, label) = self.pidfds.remove(i - 1);
            self.seen(label, at);
        }
    }

    fn seen(&mut self, label: &'static str, at: Instant) {
        let wakeup = self.wakeups;
        self.backlog.push(Seen { label, at, wakeup });
    }

    fn read_inotify(&mut self, at: Instant) {
        let mut buf = [0u8; 64 * 1024];
        loop {
            let fd = self.inotify.as_raw_fd();
            // SAFETY: buf is valid for buf.len() bytes; the fd is non-blocking (EAGAIN ends the loop).
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return;
            }
            for wd in inotify_watch_descriptors(&buf[..n as usize]) {
                if let Some(&label) = self.watches.get(&wd) {
                    self.seen(label, at);
                }
            }
        }
    }

    /// The oldest unclaimed `label` event, if any.
    fn take(&mut self, label: &'static str) -> Option<Instant> {
        let i = self.backlog.iter().position(|s| s.label == label)?;
        let seen = self.backlog.remove(i);
        self.taken_in.insert(label, seen.wakeup);
        Some(seen.at)
    }

    /// Whether the last `a` and `b` taken were stamped by one wakeup (their gap is then unknown).
    pub fn together(&self, a: &'static str, b: &'static str) -> bool {
        self.taken_in
            .get(a)
            .is_some_and(|w| self.taken_in.get(b) == Some(w))
    }

    /// The instant of the next `label` event, or None after `bound`.
    pub fn wait_for(&mut self, label: &'static str, bound: Duration) -> Option<Instant> {
        self.wait_all(&[label], bound).remove(label)
    }

    /// label -> instant for each of `labels` that comes within `bound`.
    pub fn wait_all(
        &mut self,
        labels: &[&'static str],
        bound: Duration,
    ) -> HashMap<&'static str, Instant> {
        let deadline = Instant::now() + bound;
        let mut got = HashMap::new();
        loop {
            for &label in labels {
                if !got.contains_key(label) {
                    if let Some(at) = self.take(label) {
                        got.insert(label, at);
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if got.len() == labels.len() || left.is_zero() {
                return got;
            }
            self.poll(left.min(Duration::from_millis(500)));
        }
    }
}

/// The watch descriptor of each `struct inotify_event` in a read's buffer.
fn inotify_watch_descriptors(buf: &[u8]) -> Vec<i32> {
    const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
    let mut out = Vec::new();
    let mut off = 0;
    while off + HEADER <= buf.len() {
        let field = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
        // wd, mask, cookie, len: four 32-bit fields, then `len` bytes of name.
        out.push(field(off) as i32);
        off += HEADER + field(off + 12) as usize;
    }
    out
}

/// A pidfd for `pid` (readable once it has exited).
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by pidfd_open and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits up to `bound` for `pid` to become readable on its pidfd (exited); false on timeout.
pub fn wait_exit(pid: i32, bound: Duration) -> bool {
    let Ok(fd) = pidfd_open(pid) else {
        return true; // already gone (reaped)
    };
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = Instant::now() + bound;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: pfd is one valid pollfd for the whole call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            return true;
        }
        if left.is_zero() {
            return false;
        }
    }
}
