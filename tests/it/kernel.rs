//! On a kernel without what the supervisor needs (pidfd_open, a CLOCK_BOOTTIME timerfd,
//! PR_SET_CHILD_SUBREAPER), a run is refused before anything is acquired: one line naming the
//! missing feature and the Linux release that has it, status 71 (README, "Install"), and no
//! fallback with a weaker guarantee. The older kernel is played by a seccomp filter that gives
//! the errno such a kernel gives (tests/support/seccomp.rs). `status`, `fenced-write` and
//! `fence-sql` start no tree, and need none of it.

use crate::support::seccomp::Missing;
use crate::support::*;

/// The status of a run refused for the kernel's sake (EX_OSERR).
const KERNEL_REFUSED: i32 = 71;

/// A run of `name` on a kernel without `missing` ends 71 with one line naming `what` and
/// `since`, starts nothing and takes nothing: the next run on this kernel gets token 1.
#[track_caller]
fn refused_on_a_kernel_without(missing: Missing, what: &str, since: &str) {
    let sb = Sandbox::new();
    let marker = sb.path("ran");
    let out = sb
        .leasewrap()
        .name("old-kernel")
        .on_a_kernel_without(&[missing])
        .cmd(&["sh", "-c", &format!("touch {}", q(&marker))])
        .output();
    assert_exit(&out, KERNEL_REFUSED);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {:?}", out.stderr);
    let want = format!("has no {what} (");
    assert!(
        lines[0].starts_with("leasewrap: this kernel (Linux ")
            && lines[0].contains(&want)
            && lines[0].contains(&format!("needs Linux {since} or later")),
        "{}",
        lines[0]
    );
    assert!(!marker.exists(), "the child ran on a kernel without {what}");
    assert!(sb.token_files().is_empty(), "a token was taken");
    let next = sb
        .leasewrap()
        .name("old-kernel")
        .args(&["-n"])
        .cmd(&["sh", "-c", "echo $LEASEWRAP_FENCING_TOKEN"])
        .output();
    assert_exit(&next, 0);
    assert_eq!(
        next.stdout.trim(),
        "1",
        "the refused run left the lease taken"
    );
}

#[test]
fn a_kernel_without_pidfd_open_is_refused_with_71_before_anything_is_taken() {
    refused_on_a_kernel_without(Missing::PidfdOpen, "pidfd_open", "5.3");
}

#[test]
fn a_kernel_without_a_boottime_timerfd_is_refused_with_71_before_anything_is_taken() {
    refused_on_a_kernel_without(Missing::BoottimeTimer, "CLOCK_BOOTTIME timerfd", "3.15");
}

#[test]
fn a_kernel_without_child_subreapers_is_refused_with_71_before_anything_is_taken() {
    refused_on_a_kernel_without(Missing::Subreaper, "PR_SET_CHILD_SUBREAPER", "3.4");
}

#[test]
fn status_fenced_write_and_fence_sql_run_on_a_kernel_without_any_of_it() {
    let all = [
        Missing::PidfdOpen,
        Missing::BoottimeTimer,
        Missing::Subreaper,
    ];
    let sb = Sandbox::new();
    let status = Leasewrap::subcommand("status")
        .local_dir(sb.state())
        .args(&["--once", "k", "nightly"])
        .on_a_kernel_without(&all)
        .output();
    assert_exit(&status, 1);
    let dest = sb.path("report.csv");
    let write = Leasewrap::subcommand("fenced-write")
        .args(&["--token", "3"])
        .args(&[&dest])
        .stdin("a,b\n")
        .on_a_kernel_without(&all)
        .output();
    assert_exit(&write, 0);
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "a,b\n");
    let sql = Leasewrap::subcommand("fence-sql")
        .args(&["postgres"])
        .on_a_kernel_without(&all)
        .output();
    assert_exit(&sql, 0);
}
