//! The child's process tree: resolving COMMAND, starting it under the watchdog, and hearing how it
//! ended. Knows nothing of leases: it is told deadlines and stops, and reports exits.
//!
//! leasewrap is a subreaper too, so that if the watchdog itself is killed, the descendants it
//! leaves behind come to leasewrap, which kills them before it exits; and it looks in on the
//! watchdog whenever the watchdog must act, standing in for one that is stopped ([`oversight`]).

pub mod kernel;
pub mod oversight;
pub mod protocol;
pub mod spawn;
pub mod tree;
pub mod watchdog;

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::net::UnixStream;

use crate::clock::BootInstant;
use crate::error::Error;
use protocol::{FromWatchdog, ToWatchdog, FRAME};

/// Find COMMAND the way execvp does, and check it can be run: 127 when missing, 126 when not
/// executable. Done before the lease is taken.
pub fn resolve(program: &OsStr) -> Result<PathBuf, Error> {
    let p = Path::new(program);
    if program.as_bytes().contains(&b'/') {
        return check_executable(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let mut not_executable = None;
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(p);
        match check_executable(&candidate) {
            Ok(found) => return Ok(found),
            Err(Error::NotExecutable(_)) => not_executable = not_executable.or(Some(candidate)),
            Err(_) => {}
        }
    }
    Err(match not_executable {
        Some(c) => Error::NotExecutable(c),
        None => Error::NotFound(p.to_owned()),
    })
}

fn check_executable(p: &Path) -> Result<PathBuf, Error> {
    let meta = std::fs::metadata(p).map_err(|_| Error::NotFound(p.to_owned()))?;
    let executable = nix::unistd::access(p, nix::unistd::AccessFlags::X_OK).is_ok();
    if meta.is_file() && executable {
        Ok(p.to_owned())
    } else {
        Err(Error::NotExecutable(p.to_owned()))
    }
}

/// What the child is and what it is given before the lease is known.
pub struct ChildSpec<'a> {
    /// The program found by [`resolve`].
    pub program: &'a Path,
    /// argv as the user gave it; argv\[0\] stays as written.
    pub argv: &'a [OsString],
    /// The child's environment, less the lease's variables (given by [`Supervisor::start`]).
    pub env: Vec<(OsString, OsString)>,
    /// The signal that starts an orderly stop (`--signal`).
    pub stop_signal: Signal,
}

/// How the child ended, which is how leasewrap ends when the lease held to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exit with this status.
    Code(u8),
    /// Die of this signal, as the child did.
    Signal(Signal),
}

impl Exit {
    /// The status a shell shows for this end: N, or 128+n for signal n.
    pub fn status(self) -> u8 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(sig) => crate::error::signal_status(sig as i32),
        }
    }

    /// The end a raw wait status (as waitpid(2) fills it in) describes.
    pub fn from_wait_status(status: i32) -> Exit {
        if !libc::WIFSIGNALED(status) {
            return Exit::Code(libc::WEXITSTATUS(status) as u8);
        }
        let signo = libc::WTERMSIG(status);
        match Signal::try_from(signo) {
            Ok(sig) => Exit::Signal(sig),
            // A real-time signal has no `Signal`: its status is what a shell would show.
            Err(_) => Exit::Code(crate::error::signal_status(signo)),
        }
    }
}

/// The error for a child that could not be executed with `errno`.
fn spawn_error(command: &OsStr, errno: i32) -> Error {
    match errno {
        libc::ENOENT => Error::NotFound(command.into()),
        _ => Error::NotExecutable(command.into()),
    }
}

/// How the child's tree is doing, as the watchdog reports it.
#[derive(Debug)]
pub enum Event {
    /// The child runs with this pid (and process group).
    Started(Pid),
    /// The watchdog began stopping the child because `D - kill_after` came.
    DeadlinePassed,
    /// The child ended so, and the whole tree is gone.
    Exited(Exit),
    /// The child could not be executed: 127 or 126.
    SpawnFailed(Error),
    /// The watchdog died; leasewrap killed what was left of the tree.
    WatchdogDied,
    /// The watchdog was stopped when it had to act: leasewrap killed it and the whole tree;
    /// `deadline_passed` when that was at or after the stop time of the last `D`.
    WatchdogStopped { deadline_passed: bool },
}

/// The watchdog's process while it is ours to reap: reaped on drop, after the socket closed
/// (a watchdog that never got its start ends then), so that nothing of ours outlives leasewrap.
struct Process {
    pid: Pid,
    /// Whether it has been reaped, after which its pid may name a stranger.
    reaped: bool,
}

impl Process {
    /// SIGKILL; its pid stays ours until [`Process::wait`].
    fn kill(&self) {
        if !self.reaped {
            let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
        }
    }

    fn wait(&mut self) {
        while !self.reaped {
            match nix::sys::wait::waitpid(self.pid, None) {
                Err(nix::errno::Errno::EINTR) => {}
                // ECHILD: not ours to wait for any more.
                _ => self.reaped = true,
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.wait();
    }
}

/// The watchdog, forked before the runtime exists and waiting for its start; driven from the
/// runtime once it is a [`Supervisor`].
pub struct Forked {
    /// Our end of the socket to the watchdog (dropped first, so that a watchdog never started
    /// ends before it is reaped).
    socket: std::os::unix::net::UnixStream,
    process: Process,
    /// COMMAND as the user wrote it, to name it when it cannot be executed.
    command: OsString,
    /// The signal that starts an orderly stop.
    stop_signal: Signal,
    /// What the watchdog was given, once the start is sent from here.
    oversight: oversight::Oversight,
}

impl Forked {
    /// Start the child now, before the runtime exists, as [`Supervisor::start`] does.
    pub fn start(&mut self, lease: &Lease<'_>) {
        send_start(self.socket.as_raw_fd(), lease);
        self.oversight.started(lease.kill_after, lease.deadline);
    }
}

/// What the child is started under: the lease's variables for its environment, the kill-after
/// for the TTL granted, the first `D`, and the local backend's lock file for the watchdog to hold.
pub struct Lease<'a> {
    pub env: &'a [(String, String)],
    pub kill_after: Duration,
    pub deadline: Option<BootInstant>,
    pub keep: Option<BorrowedFd<'a>>,
}

/// leasewrap's handle on the watchdog and, through it, the child.
pub struct Supervisor {
    /// Our end of the socket to the watchdog.
    socket: UnixStream,
    /// Bytes of a frame read so far; reading is cancel-safe because it keeps them here.
    partial: Vec<u8>,
    watchdog: Process,
    /// The child's pid, which is its process group, once started.
    child: Option<Pid>,
    /// COMMAND as the user wrote it, to name it when it cannot be executed.
    command: OsString,
    /// The signal that starts an orderly stop, for when leasewrap must send it itself.
    stop_signal: Signal,
    /// When to look whether the watchdog can still do its work.
    oversight: oversight::Oversight,
}

impl Supervisor {
    /// Fork the watchdog, which waits for [`Supervisor::start`] to start the child. Before the
    /// lease is taken, so that the fork overlaps nothing the child waits for, and before the
    /// tokio runtime or any other thread exists (see [`watchdog::fork`]).
    pub fn fork(spec: ChildSpec<'_>) -> Result<Forked, Error> {
        kernel::check()?;
        nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| Error::internal("becoming a subreaper", e))?;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| Error::internal("making the watchdog socket", e))?;
        let plan = watchdog::Plan {
            socket: OwnedFd::from(theirs),
            stop_signal: spec.stop_signal,
            program: watchdog::Program {
                path: spec.program.to_owned(),
                argv: spec.argv.to_vec(),
                env: spec.env,
            },
        };
        // Returns only here, in leasewrap; the plan (the watchdog's end among it) is dropped.
        let pid = watchdog::fork(plan).map_err(|e| Error::internal("forking the watchdog", e))?;
        Ok(Forked {
            socket: ours,
            process: Process { pid, reaped: false },
            command: spec.argv[0].clone(),
            stop_signal: spec.stop_signal,
            oversight: oversight::Oversight::default(),
        })
    }

    /// Drive the forked watchdog. Inside the tokio runtime.
    pub fn new(forked: Forked) -> Result<Self, Error> {
        let Forked {
            socket,
            process,
            command,
            stop_signal,
            oversight,
        } = forked;
        let socket = socket
            .set_nonblocking(true)
            .and_then(|()| UnixStream::from_std(socket))
            .map_err(|e| Error::internal("watchdog socket", e))?;
        Ok(Self {
            socket,
            partial: Vec::with_capacity(FRAME),
            watchdog: process,
            child: None,
            command,
            stop_signal,
            oversight,
        })
    }

    /// Start the child, with the lease's variables added to its environment, under its first
    /// deadline.
    pub fn start(&mut self, lease: &Lease<'_>) {
        send_start(self.socket.as_raw_fd(), lease);
        self.oversight.started(lease.kill_after, lease.deadline);
    }

    /// Tell the watchdog something. A full or closed socket means the watchdog is dead, which
    /// [`Supervisor::next`] reports.
    pub fn send(&mut self, msg: ToWatchdog) {
        // A plain write: tokio's try_write refuses until the reactor has seen the socket writable.
        let _ = nix::unistd::write(&self.socket, &msg.encode());
        self.oversight.sent(msg, BootInstant::now());
    }

    /// The next event. Cancel-safe.
    pub async fn next(&mut self) -> Event {
        loop {
            if self.partial.len() == FRAME {
                let mut f = [0; FRAME];
                f.copy_from_slice(&self.partial);
                self.partial.clear();
                match FromWatchdog::decode(f) {
                    Some(msg) => return self.on_message(msg),
                    None => continue,
                }
            }
            let check = self.oversight.next_check();
            tokio::select! {
                biased;
                ready = self.socket.readable() => if ready.is_err() {
                    return self.watchdog_died();
                },
                () = sleep_until(check) => {
                    if let Some(event) = self.look_at_the_watchdog(check) {
                        return event;
                    }
                    continue;
                }
            }
            let mut buf = [0; FRAME];
            let want = FRAME - self.partial.len();
            match self.socket.try_read(&mut buf[..want]) {
                Ok(0) => return self.watchdog_died(),
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return self.watchdog_died(),
            }
        }
    }

    fn on_message(&mut self, msg: FromWatchdog) -> Event {
        match msg {
            FromWatchdog::Started(pid) => {
                self.child = Some(Pid::from_raw(pid));
                Event::Started(Pid::from_raw(pid))
            }
            FromWatchdog::DeadlinePassed => Event::DeadlinePassed,
            // The watchdog exits right after either; it is reaped on drop, after the lease has
            // been given back, so that the next holder does not wait for it.
            FromWatchdog::SpawnFailed(errno) => {
                Event::SpawnFailed(spawn_error(&self.command, errno))
            }
            FromWatchdog::Exited(status) => Event::Exited(Exit::from_wait_status(status)),
        }
    }

    /// A moment at which the watchdog must act (see [`oversight`]): if it is stopped, it cannot,
    /// so leasewrap does as it would. Before the kill time, the stop signal to the child's group
    /// (whose pid the stopped watchdog keeps from being reused); from it on, SIGKILL to the
    /// watchdog, which SIGKILLs the child (PR_SET_PDEATHSIG), and a sweep of the rest.
    fn look_at_the_watchdog(&mut self, at: Option<BootInstant>) -> Option<Event> {
        if let Some(at) = at {
            self.oversight.checked(at);
        }
        if !oversight::is_stopped(self.watchdog.pid.as_raw() as u32) {
            return None;
        }
        let now = BootInstant::now();
        if !self.oversight.kill_due(now) {
            let forwarded = self.oversight.forwarded().map(Signal::try_from);
            let sig = forwarded.and_then(Result::ok).unwrap_or(self.stop_signal);
            tracing::error!(signal = %sig, "the watchdog is stopped: sending the stop signal to the child's process group");
            if let Some(child) = self.child {
                let _ = nix::sys::signal::killpg(child, sig);
            }
            return None;
        }
        tracing::error!("the watchdog is stopped and cannot stop the child: killing it, and the child's whole tree with it");
        let deadline_passed = self.oversight.past_stop_time(now);
        self.watchdog_died();
        Some(Event::WatchdogStopped { deadline_passed })
    }

    /// The watchdog is gone without a final report: the child got SIGKILL from its
    /// PR_SET_PDEATHSIG; kill the group and every descendant that came to us, and reap them,
    /// the child last (see [`tree::Tree`]).
    fn watchdog_died(&mut self) -> Event {
        self.watchdog.kill();
        // Once the watchdog is reaped, every process it left is a child of ours.
        self.watchdog.wait();
        let mut tree = tree::Tree::inherited(self.child);
        // Each sweep may miss a process forked during it; the next one gets it.
        loop {
            tree.signal(Signal::SIGKILL);
            match tree.reap() {
                Ok(true) => return Event::WatchdogDied,
                Ok(false) => std::thread::sleep(tree::SWEEP_AGAIN),
                Err(e) => {
                    tracing::error!(error = %e, "reaping what the watchdog left");
                    return Event::WatchdogDied;
                }
            }
        }
    }
}

/// The start message: the lease's variables, kill-after and first deadline in one send.
fn send_start(socket: RawFd, lease: &Lease<'_>) {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let mut msg = protocol::encode_env(lease.env);
    msg.extend_from_slice(&ToWatchdog::KillAfter(lease.kill_after).encode());
    msg.extend_from_slice(&ToWatchdog::Deadline(lease.deadline).encode());
    // `keep` (the local backend's locked lock file) rides along with the first byte: the
    // watchdog holds it until the whole tree is gone, so the kernel cannot hand the lock to
    // the next holder while a child of ours still runs, even if leasewrap is SIGKILLed.
    let fds = lease.keep.map(|fd| [fd.as_raw_fd()]);
    let cmsgs: Vec<ControlMessage> = fds.iter().map(|f| ControlMessage::ScmRights(f)).collect();
    let mut sent = 0;
    // A few hundred bytes into an empty socket buffer: one call in practice. EAGAIN would
    // mean a watchdog that reads nothing, which next() then reports as dead.
    while sent < msg.len() {
        let iov = [std::io::IoSlice::new(&msg[sent..])];
        let cmsgs = if sent == 0 { &cmsgs[..] } else { &[] };
        match sendmsg::<()>(socket, &iov, cmsgs, MsgFlags::empty(), None) {
            Ok(n) => sent += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
    }
}

/// Done at `t`; never without one.
async fn sleep_until(t: Option<BootInstant>) {
    match t {
        Some(t) => tokio::time::sleep(BootInstant::now().until(t)).await,
        None => std::future::pending().await,
    }
}

impl Drop for Supervisor {
    /// A watchdog that never got its deadline (the lease was not acquired) ends when its socket
    /// closes: close it and reap it, so nothing of ours outlives leasewrap.
    fn drop(&mut self) {
        let _ =
            nix::sys::socket::shutdown(self.socket.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        self.watchdog.wait();
    }
}
