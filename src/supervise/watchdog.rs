//! The watchdog: a process forked from leasewrap before the async runtime (or any other thread)
//! exists, parent and subreaper of the child. It never execs: it shares leasewrap's pages and
//! pays no start-up of its own, and it never returns into leasewrap's code (it ends by `_exit`).
//!
//! It takes each new deadline `D` over its socket and enforces it on its own CLOCK_BOOTTIME timer,
//! so the kill does not depend on leasewrap being scheduled: the stop signal goes to the child's
//! process group at `D - kill_after`, SIGKILL to the group and every descendant at `D`. When the
//! socket closes (leasewrap died) it kills everything at once. It is single-threaded on purpose:
//! the child's PR_SET_PDEATHSIG fires when the thread that forked it ends, which is this one.
//! It never touches the network, runs no async code, and never waits on anything but its own
//! three descriptors; every other descriptor of leasewrap's is closed first thing.
//! It runs in a session of its own, so that no signal meant for leasewrap's process group
//! reaches it, and it reaps the child last, so that no pid it signals can name a stranger.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::sys::wait::WaitStatus;
use nix::unistd::{ForkResult, Pid};

use super::protocol::{decode_env, unframe, FromWatchdog, ToWatchdog, ENV_TAG, FRAME};
use super::tree::{Tree, SWEEP_AGAIN};
use crate::clock::BootInstant;
use crate::error::{Error, ExitCodes};
use crate::lease::timing::stop_time;

/// The watchdog's name in `ps` and `pgrep` (PR_SET_NAME); its command line is leasewrap's.
pub const NAME: &std::ffi::CStr = c"leasewrap-wd";

/// What the watchdog takes from leasewrap's memory at the fork.
pub struct Plan {
    /// Its end of the socket to leasewrap (close-on-exec, so the child never sees it).
    pub socket: OwnedFd,
    /// The signal that starts an orderly stop (`--signal`).
    pub stop_signal: Signal,
    /// What the child runs.
    pub program: Program,
}

/// The command to run, as leasewrap resolved it before the fork.
pub struct Program {
    /// The program found by `supervise::resolve`.
    pub path: PathBuf,
    /// argv as the user gave it; argv\[0\] stays as written.
    pub argv: Vec<OsString>,
    /// The child's environment before the lease's variables (the watchdog's own is leasewrap's).
    pub env: Vec<(OsString, OsString)>,
}

/// What leasewrap sends once the lease is ours (see `Supervisor::start`): the child may start.
struct Start {
    /// The lease's variables for the child's environment.
    env: Vec<(String, String)>,
    /// Time between the stop signal and SIGKILL, for the TTL granted.
    kill_after: Duration,
    /// The first `D`; none on the local backend.
    deadline: Option<BootInstant>,
    /// The local backend's lock file, held until this process exits.
    lock: Option<OwnedFd>,
}

/// Where the child's tree is in its life. Before the start message there is no child and no
/// [`Watchdog`]: that wait is [`wait_for_start`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lifecycle {
    /// The child's tree runs under `D`.
    Running,
    /// The stop signal went out; SIGKILL goes to everything at this instant (never after `D`).
    StoppingUntil(BootInstant),
    /// SIGKILL went to everything: only sweeping and reaping are left.
    Killing,
    /// The whole tree is reaped and leasewrap was told how the child ended.
    Exited,
}

impl Lifecycle {
    const fn is_running(self) -> bool {
        matches!(self, Lifecycle::Running)
    }

    const fn is_killing(self) -> bool {
        matches!(self, Lifecycle::Killing)
    }

    const fn is_exited(self) -> bool {
        matches!(self, Lifecycle::Exited)
    }

    /// The SIGKILL time of a stop under way.
    const fn kill_at(self) -> Option<BootInstant> {
        match self {
            Lifecycle::StoppingUntil(t) => Some(t),
            _ => None,
        }
    }
}

/// The watchdog's whole state once the child runs.
struct Watchdog {
    /// Connection to leasewrap; `None` once it closed.
    socket: Option<UnixStream>,
    /// The child, which leads its own process group, and every other descendant.
    tree: Tree,
    /// Where the tree is in its life.
    lifecycle: Lifecycle,
    /// `D`, the SIGKILL instant; none on the local backend.
    deadline: Option<BootInstant>,
    /// Time between the stop signal and SIGKILL.
    kill_after: Duration,
    /// The signal that starts an orderly stop.
    stop_signal: Signal,
    /// Wakes the loop at the next instant that matters.
    timer: TimerFd,
    /// The local backend's lock file: the lock must outlive every process of the tree.
    _lock: Option<OwnedFd>,
}

/// Fork the watchdog, which runs `plan` and exits; leasewrap gets its pid. Only while leasewrap
/// has one thread: a fork copies only the calling thread, and a lock (malloc's, stdio's) held by
/// another would stay locked forever in the copy.
pub fn fork(plan: Plan) -> io::Result<Pid> {
    let threads = std::fs::read_dir("/proc/self/task").map_or(1, Iterator::count);
    if threads != 1 {
        return Err(io::Error::other(format!(
            "leasewrap has {threads} threads: the watchdog is forked before any other starts"
        )));
    }
    // SAFETY: this process has one thread (checked above), so the copy holds no lock that a
    // thread it lacks would release; the copy runs only `main`, which never returns.
    match unsafe { nix::unistd::fork() }? {
        ForkResult::Parent { child } => Ok(child),
        ForkResult::Child => main(plan),
    }
}

/// The forked process: the watchdog's whole life, then `_exit`.
fn main(plan: Plan) -> ! {
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(plan)));
    let e = match ran {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(Error::internal("leasewrap watchdog", e)),
        Err(_) => Some(Error::Internal("leasewrap watchdog panicked".into())),
    };
    if let Some(e) = &e {
        eprintln!("{e}");
    }
    let code = e.map_or(0, |e| e.code(ExitCodes::default()));
    // SAFETY: _exit ends the process at once: no atexit handler, destructor or flush of the
    // stdio buffers copied from leasewrap runs a second time here.
    unsafe { libc::_exit(code.into()) }
}

/// Leave leasewrap's descriptors behind: every close-on-exec one but `keep` is leasewrap's own
/// (its end of our socket among them, whose copy here would hide leasewrap's death). The others
/// were given to leasewrap by its parent for the child, which inherits them as it did before.
fn close_leasewrap_s_descriptors(keep: RawFd) -> io::Result<()> {
    let listed: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // The listing's own descriptor is in the list, and closed by now: F_GETFD fails on it.
    for fd in listed.into_iter().filter(|fd| *fd != keep) {
        // SAFETY: F_GETFD reads a descriptor's flags and touches no memory.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags >= 0 && flags & libc::FD_CLOEXEC != 0 {
            // SAFETY: nothing the watchdog runs uses this descriptor: the objects of leasewrap
            // that own it are never dropped here, since the process ends by _exit.
            unsafe { libc::close(fd) };
        }
    }
    Ok(())
}

/// Leave leasewrap behind, stand apart, mask, handshake, start the child (unless the stop time
/// has passed), then the event loop until the whole tree is gone.
fn run(plan: Plan) -> io::Result<()> {
    nix::sys::prctl::set_name(NAME)?;
    close_leasewrap_s_descriptors(plan.socket.as_raw_fd())?;
    stand_apart()?;
    let sigfd = block_signals()?;
    let mut socket = UnixStream::from(plan.socket);
    // leasewrap closing the socket first means it never got the lease: nothing to start.
    let Some(mut start) = wait_for_start(&mut socket)? else {
        return Ok(());
    };
    let Some(child) = start_child(&mut socket, plan.program, &mut start) else {
        return Ok(());
    };
    let mut w = Watchdog {
        socket: Some(socket),
        tree: Tree::new(Some(child)),
        lifecycle: Lifecycle::Running,
        deadline: start.deadline,
        kill_after: start.kill_after,
        stop_signal: plan.stop_signal,
        timer: TimerFd::new(ClockId::CLOCK_BOOTTIME, TimerFlags::TFD_CLOEXEC)?,
        _lock: start.lock,
    };
    w.event_loop(&sigfd)
}

/// A session (and so a process group) of its own, before any child exists: a signal meant for
/// leasewrap's group (`kill -- -PGID`, `kill %1`, the terminal's keys) must not stop or kill the
/// one process that enforces the deadline. A session rather than a group, so that leasewrap's
/// death does not orphan the group and make the kernel send it SIGHUP and SIGCONT; the child, in
/// a group of its own in this session, has no controlling terminal. Subreaper, so that every
/// orphaned descendant comes to us (the flag is not inherited across fork); not dumpable, so
/// that no process of the same user (the child included) can trace us or take our descriptors
/// (inherited from leasewrap, and set again here all the same). The child is dumpable again once
/// it execs an ordinary binary, as the kernel resets the flag.
fn stand_apart() -> io::Result<()> {
    nix::unistd::setsid()?;
    nix::sys::prctl::set_child_subreaper(true)?;
    nix::sys::prctl::set_dumpable(false)?;
    Ok(())
}

/// Start the child and tell leasewrap so, or tell it why not: its pid, or none. The stop time
/// may already have passed while leasewrap was sending (it checked just before): then the child
/// must not start at all.
fn start_child(socket: &mut UnixStream, program: Program, start: &mut Start) -> Option<Pid> {
    let late = start
        .deadline
        .is_some_and(|d| BootInstant::now() >= stop_time(d, start.kill_after));
    let report = |socket: &mut UnixStream, msg: FromWatchdog| {
        let _ = socket.write_all(&msg.encode());
    };
    if late {
        report(socket, FromWatchdog::DeadlinePassed);
        report(socket, FromWatchdog::Exited(libc::SIGKILL));
        return None;
    }
    match super::spawn::spawn(program, std::mem::take(&mut start.env)) {
        Ok(pid) => {
            report(socket, FromWatchdog::Started(pid.as_raw()));
            Some(pid)
        }
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            report(socket, FromWatchdog::SpawnFailed(errno));
            None
        }
    }
}

/// Block the signals the watchdog must outlive, and read SIGCHLD and the stop signals from a
/// signalfd. INT, QUIT, HUP and TERM sent to the watchdog itself start an orderly stop. TSTP, TTIN and TTOU stay blocked, so that no
/// stop of that kind keeps it from killing at D. The child unblocks them all before exec.
fn block_signals() -> io::Result<SignalFd> {
    let set = |signals: &[Signal]| {
        let mut set = SigSet::empty();
        signals.iter().for_each(|s| set.add(*s));
        set
    };
    let read = [
        Signal::SIGCHLD,
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGHUP,
        Signal::SIGTERM,
    ];
    let terminal_stops = [Signal::SIGTSTP, Signal::SIGTTIN, Signal::SIGTTOU];
    let mut blocked = set(&read);
    blocked.extend(&set(&terminal_stops));
    blocked.thread_set_mask()?;
    Ok(SignalFd::with_flags(
        &set(&read),
        SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
    )?)
}

/// Started before the lease is ours: read the lease's variables, the kill-after and the first
/// deadline. `None` when leasewrap closes the socket first (it never got the lease).
fn wait_for_start(socket: &mut UnixStream) -> io::Result<Option<Start>> {
    let mut start = Start {
        env: Vec::new(),
        kill_after: Duration::ZERO,
        deadline: None,
        lock: None,
    };
    loop {
        let mut f = [0; FRAME];
        match recv_exact_with_fd(socket, &mut f)? {
            Received::Closed => return Ok(None),
            Received::Data(fd) => start.lock = start.lock.or(fd),
        }
        match unframe(f) {
            (ENV_TAG, len) => {
                let mut payload = vec![0; len as usize];
                socket.read_exact(&mut payload)?;
                start.env = decode_env(&payload);
            }
            _ => match ToWatchdog::decode(f) {
                Some(ToWatchdog::KillAfter(d)) => start.kill_after = d,
                Some(ToWatchdog::Deadline(d)) => {
                    start.deadline = d;
                    return Ok(Some(start));
                }
                _ => return Ok(None),
            },
        }
    }
}

/// What [`recv_exact_with_fd`] got.
enum Received {
    /// The buffer is full; with a descriptor if one came along.
    Data(Option<OwnedFd>),
    /// leasewrap closed the socket first.
    Closed,
}

/// Fill `buf` from the socket with recvmsg, keeping a descriptor passed with the data
/// (close-on-exec, so the child never sees it).
fn recv_exact_with_fd(socket: &UnixStream, buf: &mut [u8]) -> io::Result<Received> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut got = 0;
    let mut fd = None;
    while got < buf.len() {
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let mut iov = [io::IoSliceMut::new(&mut buf[got..])];
        let msg = match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if msg.bytes == 0 {
            return Ok(Received::Closed);
        }
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: the kernel just installed this descriptor in our table for us.
                    fd = fd.or(Some(unsafe { OwnedFd::from_raw_fd(raw) }));
                }
            }
        }
        got += msg.bytes;
    }
    Ok(Received::Data(fd))
}

fn read_frame(socket: &mut UnixStream) -> io::Result<Option<[u8; FRAME]>> {
    let mut f = [0; FRAME];
    match socket.read_exact(&mut f) {
        Ok(()) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

impl Watchdog {
    fn event_loop(&mut self, sigfd: &SignalFd) -> io::Result<()> {
        while !self.lifecycle.is_exited() {
            self.on_time(BootInstant::now());
            self.arm_timer()?;
            let (sock_ready, sig_ready) = self.wait(sigfd)?;
            if sock_ready {
                self.on_socket();
            }
            if sig_ready {
                self.on_signals(sigfd);
            }
            self.on_reaped()?;
        }
        Ok(())
    }

    /// A stop signal sent to the watchdog itself (`pkill -f leasewrap` matches it too) stops the
    /// tree in order, as leasewrap would on the same signal; SIGCHLD only wakes the reaping.
    fn on_signals(&mut self, sigfd: &SignalFd) {
        while let Ok(Some(info)) = sigfd.read_signal() {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGCHLD) | Err(_) => {}
                Ok(sig) => self.begin_stop(sig, BootInstant::now()),
            }
        }
    }

    /// Block until the socket, a signal or the timer has something.
    fn wait(&self, sigfd: &SignalFd) -> io::Result<(bool, bool)> {
        let mut fds = vec![
            PollFd::new(sigfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.timer.as_fd(), PollFlags::POLLIN),
        ];
        if let Some(s) = &self.socket {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
        }
        loop {
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
        if ready(&fds[1]) {
            let _ = self.timer.wait();
        }
        Ok((fds.get(2).is_some_and(ready), ready(&fds[0])))
    }

    /// The stop time of the current `D`; none on the local backend.
    fn stop_at(&self) -> Option<BootInstant> {
        self.deadline.map(|d| stop_time(d, self.kill_after))
    }

    /// Enforce the deadline and any stop under way.
    fn on_time(&mut self, now: BootInstant) {
        // Also when we slept through both the stop time and D: leasewrap must hear why. The
        // stop then ends at D, which has passed, so SIGKILL follows at once.
        if self.lifecycle.is_running() && self.stop_at().is_some_and(|s| now >= s) {
            self.notify(FromWatchdog::DeadlinePassed);
            self.begin_stop(self.stop_signal, now);
        }
        match self.lifecycle {
            Lifecycle::StoppingUntil(kill_at) if now >= kill_at => self.kill_everything(),
            Lifecycle::Killing => self.signal_all(Signal::SIGKILL),
            _ => {}
        }
    }

    /// The next instant that matters: the stop time, the SIGKILL time, or the next sweep.
    fn next_wake(&self) -> Option<BootInstant> {
        match self.lifecycle {
            Lifecycle::Running => self.stop_at(),
            Lifecycle::StoppingUntil(kill_at) => Some(kill_at),
            Lifecycle::Killing => Some(BootInstant::now() + SWEEP_AGAIN),
            Lifecycle::Exited => None,
        }
    }

    fn arm_timer(&self) -> io::Result<()> {
        // Relative, so that the timer and our readings of CLOCK_BOOTTIME always agree (even
        // under libfaketime); at least 1 ns, since zero would disarm it.
        match self.next_wake() {
            Some(t) => self.timer.set(
                Expiration::OneShot(TimeSpec::from_duration(
                    BootInstant::now().until(t).max(Duration::from_nanos(1)),
                )),
                TimerSetTimeFlags::empty(),
            )?,
            None => self.timer.unset()?,
        }
        Ok(())
    }

    /// Messages from leasewrap, or its death.
    fn on_socket(&mut self) {
        let Some(socket) = self.socket.as_mut() else {
            return;
        };
        match read_frame(socket) {
            Ok(Some(f)) => match ToWatchdog::decode(f) {
                // A stop under way is never called off.
                Some(ToWatchdog::Deadline(d)) if self.lifecycle.is_running() => self.deadline = d,
                Some(ToWatchdog::Stop) => self.begin_stop(self.stop_signal, BootInstant::now()),
                Some(ToWatchdog::Forward(sig)) => {
                    let sig = Signal::try_from(sig).unwrap_or(Signal::SIGTERM);
                    self.begin_stop(sig, BootInstant::now());
                }
                _ => {}
            },
            // leasewrap is gone: nobody renews the lease any more, kill everything now.
            Ok(None) | Err(_) => {
                self.socket = None;
                self.kill_everything();
            }
        }
    }

    /// Stop signal to the group and every descendant; SIGKILL after kill-after, or at D if sooner.
    fn begin_stop(&mut self, sig: Signal, now: BootInstant) {
        if self.lifecycle.is_killing() || self.lifecycle.is_exited() {
            return;
        }
        self.signal_all(sig);
        let kill_at = now + self.kill_after;
        let kill_at = self.deadline.map_or(kill_at, |d| d.min(kill_at));
        let kill_at = self.lifecycle.kill_at().map_or(kill_at, |k| k.min(kill_at));
        self.lifecycle = Lifecycle::StoppingUntil(kill_at);
    }

    fn kill_everything(&mut self) {
        self.lifecycle = Lifecycle::Killing;
        self.signal_all(Signal::SIGKILL);
    }

    /// `sig` to the child's group and to every descendant, in it or not.
    fn signal_all(&self, sig: Signal) {
        self.tree.signal(sig);
    }

    /// Reap what ended; once the whole tree is gone, tell leasewrap and end.
    fn on_reaped(&mut self) -> io::Result<()> {
        if self.tree.reap()? {
            let status = self.tree.leader_status().map_or(libc::SIGKILL, raw_status);
            self.notify(FromWatchdog::Exited(status));
            self.lifecycle = Lifecycle::Exited;
        } else if self.tree.leader_status().is_some() && self.lifecycle.is_running() {
            // The child is gone but left descendants behind: they go too.
            self.begin_stop(self.stop_signal, BootInstant::now());
        }
        Ok(())
    }

    fn notify(&mut self, msg: FromWatchdog) {
        if let Some(s) = self.socket.as_mut() {
            let _ = s.write_all(&msg.encode());
        }
    }
}

/// The status word as waitpid(2) gives it, for the parent to decode with the W* macros.
fn raw_status(status: WaitStatus) -> i32 {
    match status {
        WaitStatus::Exited(_, code) => (code & 0xff) << 8,
        WaitStatus::Signaled(_, sig, core) => sig as i32 | if core { 0x80 } else { 0 },
        _ => libc::SIGKILL,
    }
}
