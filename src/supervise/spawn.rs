//! Starting the child, as posix_spawn does it: a clone that shares the watchdog's memory
//! (CLONE_VM) and suspends the watchdog until the child has exec'd or failed (CLONE_VFORK).
//! Nothing of the watchdog's address space is copied, where a fork would copy its page tables
//! and then fault on every page either process writes.
//!
//! Between the clone and the exec the child runs on a stack of its own inside the watchdog's
//! memory, while the watchdog's one thread is stopped. It calls only async-signal-safe functions
//! and allocates nothing: argv, envp and every string are built before the clone. No signal
//! handler can run in it on the watchdog's data: the watchdog installs none (it reads its signals
//! from a signalfd; leasewrap installs its own after the fork), and has only Rust's handlers for
//! SIGSEGV and SIGBUS, which report a fault and abort.

use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::sched::{clone, CloneFlags};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{getpid, getppid, Pid};

use super::watchdog::Program;

/// The child's stack until its exec: it only makes a handful of system calls.
const STACK: usize = 64 * 1024;

/// A stack mapped for the child: only the pages it touches become resident (the watchdog's
/// peak RSS counts them, the child sharing its memory), where a zeroed heap buffer would be
/// resident whole.
struct Stack {
    base: std::ptr::NonNull<libc::c_void>,
}

impl Stack {
    fn map() -> io::Result<Self> {
        // SAFETY: a fresh private anonymous mapping, at an address the kernel picks; nothing
        // else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        match std::ptr::NonNull::new(p).filter(|_| p != libc::MAP_FAILED) {
            Some(base) => Ok(Self { base }),
            None => Err(io::Error::last_os_error()),
        }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is STACK bytes, readable and writable, and lives as long as self.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().cast(), STACK) }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`, which nothing uses any more.
        unsafe { libc::munmap(self.base.as_ptr(), STACK) };
    }
}

/// What the child execs: every pointer it passes to execve, built before the clone.
struct Exec {
    path: CString,
    /// Owns the strings `argv` points to.
    _args: Vec<CString>,
    /// Owns the strings `envp` points to.
    _vars: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

impl Exec {
    /// argv as the user gave it, and the environment: `program`'s, then the lease's variables,
    /// a later value replacing an earlier one of the same name.
    fn new(program: Program, extra_env: Vec<(String, String)>) -> io::Result<Self> {
        let mut env: BTreeMap<OsString, OsString> = program.env.into_iter().collect();
        env.extend(extra_env.into_iter().map(|(k, v)| (k.into(), v.into())));
        let vars = env
            .into_iter()
            .map(|(k, v)| {
                let mut var = k.into_vec();
                var.push(b'=');
                var.extend(v.into_vec());
                c_string(var)
            })
            .collect::<io::Result<Vec<_>>>()?;
        let args = program
            .argv
            .into_iter()
            .map(|a| c_string(a.into_vec()))
            .collect::<io::Result<Vec<_>>>()?;
        let pointers = |strings: &[CString]| {
            let mut p: Vec<_> = strings.iter().map(|s| s.as_ptr()).collect();
            p.push(std::ptr::null());
            p
        };
        Ok(Self {
            path: c_string(program.path.as_os_str().as_bytes().to_vec())?,
            argv: pointers(&args),
            envp: pointers(&vars),
            _args: args,
            _vars: vars,
        })
    }
}

fn c_string(bytes: Vec<u8>) -> io::Result<CString> {
    CString::new(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Start the child in a process group of its own, dying with this thread (PR_SET_PDEATHSIG), its
/// signal mask empty and every signal's action the default; its pid once it has exec'd. The error is
/// the exec's (ENOENT, EACCES, ...) when it could not, and then the child is already reaped.
pub fn spawn(program: Program, extra_env: Vec<(String, String)>) -> io::Result<Pid> {
    let exec = Exec::new(program, extra_env)?;
    let parent = getpid();
    let failed = AtomicI32::new(0);
    let mut stack = Stack::map()?;
    let child = Box::new(|| {
        let errno = before_exec(parent).map_or_else(|e| e as i32, |()| exec_or_errno(&exec));
        failed.store(errno, Ordering::Relaxed);
        // SAFETY: _exit ends the child at once, running nothing of the watchdog's.
        unsafe { libc::_exit(127) }
    });
    // SAFETY: CLONE_VFORK stops this, the watchdog's only thread, until the child has exec'd or
    // exited, so nothing else uses the memory the child shares meanwhile; the child runs only
    // `before_exec` and execve on its own stack, which are async-signal-safe and allocate nothing.
    let pid = unsafe {
        clone(
            child,
            stack.as_mut_slice(),
            CloneFlags::CLONE_VM | CloneFlags::CLONE_VFORK,
            Some(libc::SIGCHLD),
        )
    }?;
    match failed.load(Ordering::Relaxed) {
        0 => Ok(pid),
        errno => {
            waitpid(pid, None)?;
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// The child's own settings, before it execs.
fn before_exec(parent: Pid) -> nix::Result<()> {
    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
    default_dispositions();
    // The watchdog's blocked signals would be inherited across exec: unblock them all.
    SigSet::empty().thread_set_mask()?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    // The watchdog may have died before prctl: then nobody would kill us.
    if getppid() != parent {
        return Err(nix::errno::Errno::ESRCH);
    }
    Ok(())
}

/// Every signal back to its default action, as systemd starts a service: an ignored signal stays
/// ignored across exec, and SIGPIPE is ignored in leasewrap, SIGINT and SIGHUP in one started
/// from `nohup` or a shell's background job. The signals leasewrap forwards, and the stop signal,
/// must do to the child what they say.
fn default_dispositions() {
    for sig in Signal::iterator() {
        if sig != Signal::SIGKILL && sig != Signal::SIGSTOP {
            // SAFETY: the child has a copy of the watchdog's signal actions (no CLONE_SIGHAND):
            // this changes the child's alone, and installs no handler. sigaction is
            // async-signal-safe; it cannot fail for a valid signal other than KILL and STOP.
            let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
        }
    }
}

/// execve, which returns only when it fails: then its errno.
fn exec_or_errno(exec: &Exec) -> i32 {
    // SAFETY: path, argv and envp are NUL-terminated strings and NULL-terminated arrays that
    // `exec` owns and keeps alive.
    unsafe { libc::execve(exec.path.as_ptr(), exec.argv.as_ptr(), exec.envp.as_ptr()) };
    nix::errno::Errno::last_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(env: &[(&str, &str)]) -> Program {
        Program {
            path: "/bin/true".into(),
            argv: vec!["true".into(), "x".into()],
            env: env
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        }
    }

    #[test]
    fn the_lease_s_variables_replace_those_of_the_same_name() {
        let base = program(&[("B", "2"), ("LEASEWRAP_NAME", "outer"), ("A", "1")]);
        let lease = vec![("LEASEWRAP_NAME".to_owned(), "inner".to_owned())];
        let exec = Exec::new(base, lease).expect("no NUL anywhere");
        let vars: Vec<&str> = exec._vars.iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(vars, ["A=1", "B=2", "LEASEWRAP_NAME=inner"]);
        assert_eq!(exec.envp.len(), 4);
        assert!(exec.envp[3].is_null(), "envp ends with NULL");
        assert_eq!(exec.argv.len(), 3);
        assert!(exec.argv[2].is_null(), "argv ends with NULL");
    }

    #[test]
    fn a_nul_byte_is_refused_before_anything_is_cloned() {
        let mut bad = program(&[]);
        bad.argv.push("a\0b".into());
        let e = Exec::new(bad, Vec::new()).err().expect("refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
