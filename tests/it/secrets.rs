//! Secrets (issue: hardening, "Secrets and output"): what a process of the same user, the child
//! included, can learn of leasewrap's password, and the warnings for passwords others can read.
//!
//! Run as root; the tests that need a process of another user than root run leasewrap as the
//! test support's second user.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;

use crate::support::*;

const SECRET: &str = "s3cret-of-leasewrap";

#[test]
fn a_child_of_the_same_user_cannot_read_leasewrap_s_environment() {
    let user = user::other();
    let sb = Sandbox::new();
    user.owns(&sb.path(""));
    user.owns(&sb.state());
    let (seen, owner) = (sb.path("seen"), sb.path("owner"));
    // The child's parent is the watchdog, whose parent is leasewrap. It lists every one of the
    // two whose environment it can read the password from, and says who owns its own
    // /proc/PID (its own uid while it is dumpable, root's when not).
    let script = format!(
        "wd=$PPID; lw=$(cut -d' ' -f4 /proc/$wd/stat)\n\
         for p in $lw $wd; do\n\
           if tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -q {SECRET}; then echo $p; fi\n\
         done > {seen}.tmp; mv {seen}.tmp {seen}\n\
         stat -c %u /proc/$$ > {owner}.tmp; mv {owner}.tmp {owner}",
        seen = q(&seen),
        owner = q(&owner),
    );
    let out = sb
        .leasewrap()
        .name("environ")
        .run_as(user)
        .env("LEASEWRAP_PASSWORD", SECRET)
        .env("ETCDCTL_PASSWORD", SECRET)
        .cmd(&["sh", "-c", &script])
        .output();
    assert_exit(&out, 0);
    assert_eq!(
        fs::read_to_string(&seen).expect("the child's report"),
        "",
        "the child read the password from /proc/PID/environ of leasewrap or the watchdog"
    );
    assert_eq!(
        fs::read_to_string(&owner)
            .expect("the child's report")
            .trim(),
        user.uid.to_string(),
        "the child is not dumpable: it inherited leasewrap's PR_SET_DUMPABLE 0"
    );
}

/// The warning lines of a run's stderr that mention `what`.
fn warnings_about(out: &Output, what: &str) -> usize {
    out.stderr
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(what))
        .count()
}

#[test]
fn user_colon_password_on_the_command_line_gets_one_warning_pointing_to_password_file() {
    let sb = Sandbox::new();
    let out = sb
        .leasewrap()
        .name("cmdline")
        .args(&["--user", &format!("alice:{SECRET}")])
        .cmd(&["true"])
        .output();
    assert_exit(&out, 0);
    assert_eq!(
        warnings_about(&out, "--password-file"),
        1,
        "one warning naming --password-file:\n{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains(SECRET),
        "the warning echoes the password"
    );
}

#[test]
fn a_password_file_others_may_read_gets_a_warning_and_a_private_one_none() {
    let sb = Sandbox::new();
    let file = sb.path("password");
    fs::write(&file, format!("{SECRET}\n")).expect("write the password file");
    for (mode, warnings) in [(0o644, 1), (0o640, 1), (0o600, 0), (0o400, 0)] {
        fs::set_permissions(&file, fs::Permissions::from_mode(mode)).expect("chmod");
        let out = sb
            .leasewrap()
            .name("pwfile")
            .args(&["--user", "alice", "--password-file", file.to_str().unwrap()])
            .cmd(&["true"])
            .output();
        assert_exit(&out, 0);
        assert_eq!(
            warnings_about(&out, "password-file"),
            warnings,
            "mode {mode:o}:\n{}",
            out.stderr
        );
    }
}

#[test]
fn a_non_utf8_user_colon_password_loses_its_password_in_the_childs_environment() {
    let sb = Sandbox::new();
    let value = OsStr::from_bytes(b"al\xffce:pa\xfess");
    let (leasewrap_user, etcdctl_user) = (sb.path("lw.user"), sb.path("ctl.user"));
    let script = format!(
        "printf %s \"$LEASEWRAP_USER\" > {}; printf %s \"$ETCDCTL_USER\" > {}",
        q(&leasewrap_user),
        q(&etcdctl_user)
    );
    let out = sb
        .leasewrap()
        .name("bytes")
        .env("LEASEWRAP_USER", value)
        .env("ETCDCTL_USER", value)
        .cmd(&["sh", "-c", &script])
        .output();
    assert_exit(&out, 0);
    for file in [&leasewrap_user, &etcdctl_user] {
        assert_eq!(
            fs::read(file).expect("the child's report"),
            b"al\xffce",
            "{}: the user kept its password",
            file.display()
        );
    }
}

/// The strings of /proc/`pid`/environ.
#[track_caller]
fn environ(pid: i32) -> Vec<String> {
    let bytes = fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/environ (as root): {e}"));
    bytes
        .split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

#[test]
fn proc_environ_of_leasewrap_and_the_watchdog_shows_no_password_even_to_root() {
    let sb = Sandbox::new();
    let lw = sb
        .leasewrap()
        .name("wiped")
        .env("LEASEWRAP_PASSWORD", SECRET)
        .env("ETCDCTL_PASSWORD", SECRET)
        .env("MYSQL_PASSWORD", SECRET)
        .env("LEASEWRAP_USER", format!("alice:{SECRET}"))
        .env("ETCDCTL_USER", format!("bob:{SECRET}"));
    let job = Job::hold(lw, &sb, "child");
    let watchdog = ppid_of(job.child()).expect("the child's parent, the watchdog");
    for (who, pid) in [("leasewrap", job.run.pid()), ("the watchdog", watchdog)] {
        let env = environ(pid);
        let leaked: Vec<&String> = env.iter().filter(|e| e.contains(SECRET)).collect();
        assert!(leaked.is_empty(), "{who}'s /proc/PID/environ: {leaked:?}");
        assert!(
            env.iter().any(|e| e.starts_with("LEASEWRAP_USER=alice:")),
            "{who}: the user is kept: {env:?}"
        );
    }
    job.finish();
}
