//! An older kernel, played for real: a seccomp filter, installed in the process between fork
//! and exec, answers the system calls such a kernel lacks with the errno that kernel gives.
//! The filter is the kernel's own mechanism (no wrapper, no preload), and it holds for the
//! process and everything it starts.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// A system call that an older kernel lacks, as that kernel answers it.
#[derive(Clone, Copy, Debug)]
pub enum Missing {
    /// pidfd_open before Linux 5.3: ENOSYS.
    PidfdOpen,
    /// timerfd_create(CLOCK_BOOTTIME, ...) before Linux 3.15: EINVAL.
    BoottimeTimer,
    /// prctl(PR_SET_CHILD_SUBREAPER) and PR_GET_CHILD_SUBREAPER before Linux 3.4: EINVAL.
    Subreaper,
}

/// One rule: system call `nr`, with its first argument `arg0` when given, fails with `errno`.
struct Rule {
    nr: libc::c_long,
    arg0: Option<u32>,
    errno: i32,
}

impl Missing {
    fn rules(self) -> Vec<Rule> {
        let rule = |nr, arg0, errno| Rule { nr, arg0, errno };
        match self {
            Missing::PidfdOpen => vec![rule(libc::SYS_pidfd_open, None, libc::ENOSYS)],
            Missing::BoottimeTimer => vec![rule(
                libc::SYS_timerfd_create,
                Some(libc::CLOCK_BOOTTIME as u32),
                libc::EINVAL,
            )],
            Missing::Subreaper => [libc::PR_SET_CHILD_SUBREAPER, libc::PR_GET_CHILD_SUBREAPER]
                .into_iter()
                .map(|op| rule(libc::SYS_prctl, Some(op as u32), libc::EINVAL))
                .collect(),
        }
    }
}

/// `AUDIT_ARCH_X86_64` of <linux/audit.h>: EM_X86_64 (62), 64-bit, little-endian.
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;

/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0_LOW: u32 = 16;

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    jump(code, k, 0, 0)
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The BPF program: on x86_64, each rule's call fails with its errno; everything else passes.
fn program(missing: &[Missing]) -> Vec<libc::sock_filter> {
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let equals = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    let mut prog = vec![stmt(load, ARCH), jump(equals, AUDIT_ARCH_X86_64, 1, 0)];
    prog.push(stmt(ret, libc::SECCOMP_RET_ALLOW));
    for rule in missing.iter().flat_map(|m| m.rules()) {
        prog.push(stmt(load, NR));
        let fail = stmt(ret, libc::SECCOMP_RET_ERRNO | rule.errno as u32);
        match rule.arg0 {
            None => prog.extend([jump(equals, rule.nr as u32, 0, 1), fail]),
            Some(arg) => prog.extend([
                jump(equals, rule.nr as u32, 0, 3),
                stmt(load, ARG0_LOW),
                jump(equals, arg, 0, 1),
                fail,
            ]),
        }
    }
    prog.push(stmt(ret, libc::SECCOMP_RET_ALLOW));
    prog
}

/// `command` runs as on a kernel that lacks `missing`.
pub fn without(command: &mut Command, missing: &[Missing]) {
    let filter = program(missing);
    // SAFETY: between fork and exec the closure makes two prctl calls, which are
    // async-signal-safe, on a program built (and moved in) before the fork; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr().cast_mut(),
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
