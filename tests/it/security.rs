//! The attacks of a security review, replayed from outside: another user who can write the state
//! directory or DEST's directory plants links, FIFOs, hard links, odd token files and temp file
//! names; lease and file names that print like others or carry escape sequences. Each test shows
//! the attack doing nothing: one clear line, the documented status, nothing run, nothing the
//! attacker pointed at touched, nothing leaked into the message.
//!
//! Runs as root (the review's case) and, where it matters, as the second user of
//! `support::user`; every run is bounded.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

use crate::support::user::{self, chmod};
use crate::support::{assert_exit, wait_until, Finished, Leasewrap, Output, Sandbox, RUN_BOUND};

/// A run of lease `job` whose child would leave `ran` behind.
fn job(sb: &Sandbox) -> Leasewrap {
    let ran = sb.path("ran");
    sb.leasewrap()
        .name("job")
        .cmd(&["touch", ran.to_str().unwrap()])
}

/// Asserts a refusal: status 78, an error line naming `what`, the child never ran.
#[track_caller]
fn assert_refused(sb: &Sandbox, out: &Output, what: &str) {
    assert_exit(out, 78);
    let errors: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("leasewrap: "))
        .collect();
    assert_eq!(errors.len(), 1, "one error line{}", out.context());
    assert!(errors[0].contains(what), "names {what}{}", out.context());
    assert!(!sb.path("ran").exists(), "the child ran{}", out.context());
}

#[track_caller]
fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o666))
        .unwrap_or_else(|e| panic!("mkfifo {}: {e}", path.display()));
}

// ---------------------------------------------------------------------------------------------
// The local backend's state directory (items 4, 5, 6, 7).

#[test]
fn a_planted_link_as_lock_or_token_file_is_refused_and_its_target_is_untouched() {
    for file in ["job.lock", "job.token"] {
        let sb = Sandbox::new();
        let victim = sb.path("victim");
        fs::write(&victim, "3\n").unwrap();
        symlink(&victim, sb.state().join(file)).unwrap();
        let out = job(&sb).output();
        assert_refused(&sb, &out, file);
        assert_eq!(fs::read_to_string(&victim).unwrap(), "3\n", "{file}");

        // A dangling link does not create the file it names.
        let sb = Sandbox::new();
        let created = sb.path("nologin");
        symlink(&created, sb.state().join(file)).unwrap();
        let out = job(&sb).output();
        assert_refused(&sb, &out, file);
        assert!(!created.exists(), "{file} -> a missing file created it");
    }
}

#[test]
fn a_hard_linked_token_file_is_refused_and_the_other_name_keeps_its_content() {
    let sb = Sandbox::new();
    let victim = sb.path("victim");
    fs::write(&victim, "41\n").unwrap();
    fs::hard_link(&victim, sb.token_file("job")).unwrap();
    let out = job(&sb).output();
    assert_refused(&sb, &out, "job.token");
    assert_eq!(fs::read_to_string(&victim).unwrap(), "41\n");
}

#[test]
fn a_fifo_as_lock_or_token_file_is_refused_at_once_and_status_does_not_hang() {
    for file in ["job.lock", "job.token"] {
        let sb = Sandbox::new();
        mkfifo(&sb.state().join(file));
        let out = job(&sb).output();
        assert_refused(&sb, &out, file);
    }
    let sb = Sandbox::new();
    mkfifo(&sb.lock_file("job"));
    let out = Leasewrap::subcommand("status")
        .local_dir(sb.state())
        .args(&["job"])
        .output();
    assert_exit(&out, 78);
    assert!(out.stderr.contains("job.lock"), "{}", out.context());
}

#[test]
fn a_state_directory_others_can_write_or_another_user_owns_is_refused() {
    let other = user::other();
    for (mode, owner) in [(0o1777, None), (0o775, None), (0o755, Some(other))] {
        let sb = Sandbox::new();
        chmod(&sb.state(), mode);
        if let Some(user) = owner {
            user.owns(&sb.state());
        }
        let out = job(&sb).output();
        let what = sb.state().display().to_string();
        assert_refused(&sb, &out, &what);
        assert!(
            sb.token_files().is_empty() && !sb.lock_file("job").exists(),
            "mode {mode:o}: files were made in the refused directory"
        );
    }
}

#[test]
fn a_state_directory_is_one_users_a_second_user_gets_78_and_changes_nothing() {
    let other = user::other();
    let sb = Sandbox::new();
    chmod(&sb.path(""), 0o755);
    let out = job(&sb).output();
    assert_exit(&out, 0);
    assert_eq!(sb.token("job"), Some(1));
    fs::remove_file(sb.path("ran")).unwrap();

    // root's directory (0755): the second user may read it, not use it.
    let out = job(&sb).run_as(other).output();
    assert_exit(&out, 78);
    assert!(out.stderr.contains("job.lock"), "{}", out.context());
    assert!(!sb.path("ran").exists());
    assert_eq!(sb.token("job"), Some(1));

    // Its own directory works for it, and root refuses to follow it there.
    let theirs = sb.path("theirs");
    fs::create_dir(&theirs).unwrap();
    chmod(&theirs, 0o755);
    other.owns(&theirs);
    let ran = theirs.join("ran");
    let run = |lw: Leasewrap| {
        lw.local_dir(&theirs)
            .name("job")
            .cmd(&["touch", ran.to_str().unwrap()])
            .output()
    };
    assert_exit(&run(Leasewrap::new().run_as(other)), 0);
    let out = run(Leasewrap::new());
    assert_exit(&out, 78);
    assert!(out.stderr.contains("owned by uid"), "{}", out.context());
}

/// Runs `job` with `text` in its token file: the exit, and what the file holds afterwards.
fn with_token_file(text: &[u8]) -> (Sandbox, Output, Vec<u8>) {
    let sb = Sandbox::new();
    fs::write(sb.token_file("job"), text).unwrap();
    let out = job(&sb).output();
    let after = fs::read(sb.token_file("job")).unwrap();
    (sb, out, after)
}

#[test]
fn the_token_file_holds_one_canonical_token_and_is_never_echoed() {
    // At the top of u64 there is no next token: refused before the child starts.
    let max = u64::MAX.to_string();
    let (sb, out, after) = with_token_file(max.as_bytes());
    assert_refused(&sb, &out, "highest token");
    assert_eq!(after, max.as_bytes());

    for bad in [&b"007\n"[..], b"", b"12abc", b"-1\n"] {
        let (sb, out, after) = with_token_file(bad);
        assert_refused(&sb, &out, "job.token");
        assert_eq!(after, bad, "a refused token file was changed");
    }

    // 20 MiB: read no further than a token can reach, and none of it in the message.
    let huge = vec![b'7'; 20 << 20];
    let (sb, out, _) = with_token_file(&huge);
    assert_refused(&sb, &out, "job.token");
    assert!(
        out.stderr.len() < 1000,
        "{} bytes of stderr",
        out.stderr.len()
    );
    assert!(!out.stderr.contains("7777"), "{}", out.context());

    // A shorter new text leaves nothing of the old one behind.
    let (_, out, after) = with_token_file(b"9\n");
    assert_exit(&out, 0);
    assert_eq!(after, b"10\n");
}

// ---------------------------------------------------------------------------------------------
// fenced-write (items 0, 8, 9, 10, 11).

/// `fenced-write --token TOKEN DEST [-- COMMAND...]` fed `input`.
fn fenced_write(dest: &Path, token: u64, input: &[u8], command: &[&str]) -> Output {
    let lw = Leasewrap::subcommand("fenced-write")
        .args(&["--token", &token.to_string()])
        .args(&[dest]);
    let lw = if command.is_empty() {
        lw
    } else {
        lw.cmd(command)
    };
    lw.stdin(input).output()
}

/// Bytes written into the pipe and not read yet.
fn unread(pipe: &impl std::os::fd::AsRawFd) -> libc::c_int {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into `n`, which outlives the call.
    let r = unsafe { libc::ioctl(pipe.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(
        r,
        0,
        "FIONREAD on the pipe: {}",
        std::io::Error::last_os_error()
    );
    n
}

#[test]
fn a_stalled_stale_writer_does_not_delay_a_newer_writer_and_the_newer_data_survives() {
    let sb = Sandbox::new();
    let dest = sb.path("report.csv");
    let mut stale = Leasewrap::subcommand("fenced-write")
        .args(&["--token", "5"])
        .args(&[&dest])
        .stdin_pipe()
        .spawn();
    let mut producer = stale.take_stdin();
    std::io::Write::write_all(&mut producer, b"stale from A, half of it").unwrap();
    // Spooling: past its first look at the fence, which would refuse it once B has written.
    wait_until(
        RUN_BOUND,
        "the stale writer to read what it was given",
        || unread(&producer) == 0,
    );

    // The stale writer's producer stalls (as a paused holder's does); the newer one must pass.
    let fresh = fenced_write(&dest, 6, b"fresh from B\n", &[]);
    assert_exit(&fresh, 0);
    assert!(
        stale.try_status().is_none(),
        "the stale writer ended before the newer one was through: {}",
        stale.stderr()
    );
    std::io::Write::write_all(&mut producer, b"\n").unwrap();
    drop(producer);
    stale.wait_timeout(RUN_BOUND);
    assert_exit(&stale, 73);
    assert_eq!(fs::read_to_string(&dest).unwrap(), "fresh from B\n");
    assert_eq!(
        fs::read_to_string(sb.path("report.csv.fence")).unwrap(),
        "6\n"
    );
}

#[test]
fn a_planted_fence_link_is_refused_never_followed_and_never_echoed() {
    let sb = Sandbox::new();
    let dest = sb.path("a.csv");
    let fence = sb.path("a.csv.fence");
    let shadow = sb.path("shadow");
    let secret = "root:$6$do-not-print-me:19000:0:99999:7:::\n";
    fs::write(&shadow, secret).unwrap();
    chmod(&shadow, 0o600);
    symlink(&shadow, &fence).unwrap();
    let out = fenced_write(&dest, 999, b"data\n", &[]);
    assert_exit(&out, 78);
    assert!(!out.stderr.contains("do-not-print-me"), "{}", out.context());
    assert!(out.stderr.contains("a.csv.fence"), "{}", out.context());
    assert_eq!(fs::read_to_string(&shadow).unwrap(), secret);
    assert!(!dest.exists());

    // A link to a file holding a token is not rewritten; a dangling one creates nothing.
    fs::write(&shadow, "3\n").unwrap();
    assert_exit(&fenced_write(&dest, 999, b"data\n", &[]), 78);
    assert_eq!(fs::read_to_string(&shadow).unwrap(), "3\n");
    fs::remove_file(&fence).unwrap();
    let nologin = sb.path("nologin");
    symlink(&nologin, &fence).unwrap();
    assert_exit(&fenced_write(&dest, 999, b"data\n", &[]), 78);
    assert!(!nologin.exists());

    // A FIFO as the fence does not hang the writer.
    fs::remove_file(&fence).unwrap();
    mkfifo(&fence);
    assert_exit(&fenced_write(&dest, 999, b"data\n", &[]), 78);
}

#[test]
fn a_symlinked_dest_is_refused_so_its_target_cannot_get_a_second_fence() {
    let sb = Sandbox::new();
    fs::create_dir(sb.path("releases")).unwrap();
    let target = sb.path("releases/report.csv");
    let link = sb.path("current.csv");
    symlink(&target, &link).unwrap();
    assert_exit(&fenced_write(&target, 6, b"from B\n", &[]), 0);
    let out = fenced_write(&link, 5, b"stale from A\n", &[]);
    assert_exit(&out, 64);
    assert!(out.stderr.contains("symbolic link"), "{}", out.context());
    assert_eq!(fs::read_to_string(&target).unwrap(), "from B\n");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!sb.path("current.csv.fence").exists());
}

#[test]
fn temp_names_taken_in_advance_by_another_user_do_not_block_a_writer() {
    let other = user::other();
    let sb = Sandbox::new();
    let shared = sb.path("shared");
    fs::create_dir(&shared).unwrap();
    chmod(&sb.path(""), 0o755);
    chmod(&shared, 0o1777);
    let dest = shared.join("report.csv");
    // The names the next few thousand pids would have used, taken as directories.
    let last: u32 = fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut squat = Command::new("mkdir");
    for pid in last..last + 3000 {
        squat.arg(shared.join(format!(".report.csv.fenced-write-{pid}.tmp")));
    }
    use std::os::unix::process::CommandExt;
    squat.uid(other.uid).gid(other.gid);
    let out = crate::support::run_bounded(squat, RUN_BOUND);
    assert!(out.status.success(), "squatting: {}", out.stderr);
    for token in 1..=5 {
        let out = fenced_write(&dest, token, format!("{token}\n").as_bytes(), &[]);
        assert_exit(&out, 0);
    }
    assert_eq!(fs::read_to_string(&dest).unwrap(), "5\n");
}

#[test]
fn fenced_write_with_a_command_commits_only_when_it_exits_0() {
    let sb = Sandbox::new();
    let dest = sb.path("rep.csv");
    assert_exit(&fenced_write(&dest, 3, b"", &["sh", "-c", "echo whole"]), 0);
    assert_eq!(fs::read_to_string(&dest).unwrap(), "whole\n");

    let failed = fenced_write(&dest, 4, b"", &["sh", "-c", "echo 'partial li'; exit 3"]);
    assert_exit(&failed, 3);
    let killed = fenced_write(
        &dest,
        4,
        b"",
        &["sh", "-c", "echo 'partial li'; kill -9 $$"],
    );
    assert_exit(&killed, 137);
    let missing = fenced_write(&dest, 4, b"", &["leasewrap-test-no-such-command"]);
    assert_exit(&missing, 127);
    assert_eq!(fs::read_to_string(&dest).unwrap(), "whole\n");
    assert_eq!(fs::read_to_string(sb.path("rep.csv.fence")).unwrap(), "3\n");

    // A stale token is refused before COMMAND runs.
    let ran = sb.path("ran");
    let touch = format!("touch {}", ran.display());
    assert_exit(&fenced_write(&dest, 2, b"", &["sh", "-c", &touch]), 73);
    assert!(!ran.exists(), "COMMAND ran for a stale token");
}

#[test]
fn a_write_that_cannot_replace_dest_leaves_the_fence_where_it_was() {
    let sb = Sandbox::new();
    let dest = sb.path("rep.csv");
    assert_exit(&fenced_write(&dest, 6, b"six\n", &[]), 0);
    fs::remove_file(&dest).unwrap();
    fs::create_dir(&dest).unwrap();
    let out = fenced_write(&dest, 7, b"seven\n", &[]);
    assert_exit(&out, 64);
    assert!(out.stderr.contains("directory"), "{}", out.context());
    assert_eq!(fs::read_to_string(sb.path("rep.csv.fence")).unwrap(), "6\n");
}

/// Makes a file immutable (`chattr +i`: even root cannot rename over it) until dropped.
struct Immutable<'a>(&'a Path);

impl<'a> Immutable<'a> {
    #[track_caller]
    fn set(path: &'a Path) -> Self {
        let out = Command::new("chattr").arg("+i").arg(path).output();
        let out = out.expect("run chattr (Debian package e2fsprogs)");
        assert!(
            out.status.success(),
            "chattr +i {}: {} (the test needs a file system with the immutable flag, as ext4)",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Immutable(path)
    }
}

impl Drop for Immutable<'_> {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(self.0).status();
    }
}

#[test]
fn a_rename_that_fails_after_the_token_was_recorded_puts_the_old_record_back() {
    // In the build's own temp dir: /tmp may be a file system without the immutable flag.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dest = dir.path().join("rep.csv");
    let fence = dir.path().join("rep.csv.fence");
    assert_exit(&fenced_write(&dest, 6, b"six\n", &[]), 0);
    let out = {
        let _frozen = Immutable::set(&dest);
        fenced_write(&dest, 7, b"seven\n", &[])
    };
    assert_exit(&out, 125);
    assert!(out.stderr.contains("replacing"), "{}", out.context());
    assert_eq!(fs::read_to_string(&dest).unwrap(), "six\n");
    assert_eq!(
        fs::read_to_string(&fence).unwrap(),
        "6\n",
        "the fence ran ahead"
    );
    let left: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert_eq!(left.len(), 2, "a temp file was left: {left:?}");
}

// ---------------------------------------------------------------------------------------------
// Output and names (items 13, 14).

#[test]
fn status_escapes_control_characters_in_names_it_lists() {
    let sb = Sandbox::new();
    fs::write(sb.state().join("evil\x1b]0;owned\x07\x1b[2J.lock"), "").unwrap();
    let out = Leasewrap::subcommand("status")
        .local_dir(sb.state())
        .output();
    assert_exit(&out, 0);
    assert!(!out.stdout.contains('\x1b'), "{:?}", out.stdout);
    assert!(!out.stdout.contains('\x07'), "{:?}", out.stdout);
    assert!(out.stdout.contains(r"evil\u{1b}]0;owned"), "{}", out.stdout);
}

#[test]
fn lease_names_outside_letters_digits_and_a_few_marks_are_refused_with_64() {
    let sb = Sandbox::new();
    for name in [
        "job\u{200b}",
        "jo\u{202e}b",
        "\u{3164}",
        "job name",
        "jöb",
        "a\tb",
    ] {
        let out = sb.leasewrap().name(name).cmd(&["true"]).output();
        assert_exit(&out, 64);
        assert!(out.stderr.contains("--name"), "{name:?}{}", out.context());
        let status = Leasewrap::subcommand("status")
            .local_dir(sb.state())
            .args(&[name])
            .output();
        assert_exit(&status, 64);
    }
    assert!(sb.token_files().is_empty(), "a refused name took a lease");
    let out = sb
        .leasewrap()
        .name("nightly.report_v2-eu@host:1+x=y")
        .cmd(&["true"])
        .output();
    assert_exit(&out, 0);
}

// ---------------------------------------------------------------------------------------------
// Run records of the local backend (issue 18, section 1).

/// `leasewrap status ARGS...` on the sandbox's state directory.
fn status(sb: &Sandbox, args: &[&str]) -> Output {
    Leasewrap::subcommand("status")
        .local_dir(sb.state())
        .args(args)
        .output()
}

/// The folder of lease `job`'s run records, created.
fn records_of_job(sb: &Sandbox) -> std::path::PathBuf {
    let folder = sb.state().join("runs/job");
    fs::create_dir_all(&folder).unwrap();
    folder
}

/// A run record of lease `job` as leasewrap writes one: a success of `key` on `host` that ended
/// now, kept until `keep` seconds from now.
fn record_text(key: &str, host: &str, keep: f64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    serde_json::json!({
        "format": "leasewrap-run/1", "name": "job", "key": key, "outcome": "ran-ok",
        "attempts": 1, "host": host, "pid": 7, "token": 3, "start": now - 60.0, "end": now,
        "exit_status": 0, "signal": null, "keep_until": now + keep,
    })
    .to_string()
}

/// The line of `text` that mentions `what`.
#[track_caller]
fn line_with<'a>(text: &'a str, what: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line mentions {what:?}:\n{text}"))
}

#[test]
fn a_fifo_at_a_record_path_is_refused_at_once_and_status_shows_why() {
    let sb = Sandbox::new();
    mkfifo(&records_of_job(&sb).join("kf.json"));
    let out = job(&sb).args(&["--once", "kf"]).output();
    assert_refused(&sb, &out, "kf.json");
    let listed = status(&sb, &[]);
    assert_exit(&listed, 78);
    let row = line_with(&listed.stdout, "kf");
    assert!(row.contains("not a regular file"), "{}", listed.context());
    assert!(listed.stderr.contains("kf.json"), "{}", listed.context());
    let once = status(&sb, &["--once", "kf", "job"]);
    assert_exit(&once, 78);
    assert!(once.stderr.contains("kf.json"), "{}", once.context());
}

/// What a terminal would act on: ESC, BEL, CR and the right-to-left override.
#[track_caller]
fn assert_nothing_drives_the_terminal(text: &str) {
    for c in ['\u{1b}', '\u{7}', '\r', '\u{202e}'] {
        assert!(!text.contains(c), "{c:?} printed raw: {text:?}");
    }
}

#[test]
fn record_fields_and_keys_are_escaped_in_status_and_in_the_already_ran_line() {
    let sb = Sandbox::new();
    let folder = records_of_job(&sb);
    let host = "h\u{1b}]0;owned\u{7}\u{1b}[2J\r\u{202e}";
    fs::write(folder.join("k.json"), record_text("k", host, 86400.0)).unwrap();
    let key = "x\u{1b}[2Jy";
    fs::write(
        folder.join(format!("{key}.json")),
        record_text(key, "h", 86400.0),
    )
    .unwrap();
    let listed = status(&sb, &["job"]);
    assert_nothing_drives_the_terminal(&listed.stdout);
    assert!(
        listed
            .stdout
            .contains(r"h\u{1b}]0;owned\u{7}\u{1b}[2J\u{d}\u{202e}"),
        "{}",
        listed.context()
    );
    assert!(
        listed.stdout.contains(r"x\u{1b}[2Jy"),
        "{}",
        listed.context()
    );
    let once = status(&sb, &["--once", "k", "job"]);
    assert_exit(&once, 0);
    assert_nothing_drives_the_terminal(&once.stdout);
    assert!(
        once.stdout.contains(r"\u{1b}]0;owned"),
        "{}",
        once.context()
    );
    let skipped = job(&sb).args(&["--once", "k", "-v"]).output();
    assert_exit(&skipped, 75);
    assert_nothing_drives_the_terminal(&skipped.stderr);
    assert!(
        skipped.stderr.contains("already ran"),
        "{}",
        skipped.context()
    );
    assert!(!sb.path("ran").exists());
}

#[test]
fn a_symlinked_runs_or_runs_name_folder_is_refused_and_nothing_behind_it_is_deleted() {
    for link in ["runs", "runs/job"] {
        let sb = Sandbox::new();
        let elsewhere = sb.path("elsewhere");
        let behind = match link {
            "runs" => elsewhere.join("job"),
            _ => elsewhere.clone(),
        };
        fs::create_dir_all(&behind).unwrap();
        fs::create_dir_all(sb.state().join("runs")).unwrap();
        // An expired record, a temp file's name and a file of the other folder's own.
        let expired = record_text("old", "h", -30.0 * 86400.0);
        let planted = [
            ("old.json", expired.as_str()),
            (".x.json.tmp-00000000000f423f", "half"),
            ("notes.txt", "mine"),
        ];
        for (file, text) in planted {
            fs::write(behind.join(file), text).unwrap();
        }
        let aged = Command::new("touch")
            .args(["-d", "2001-01-01"])
            .args(planted.map(|(f, _)| behind.join(f)))
            .status();
        assert!(aged.unwrap().success());
        if link == "runs" {
            fs::remove_dir(sb.state().join("runs")).unwrap();
        }
        symlink(&elsewhere, sb.state().join(link)).unwrap();
        let out = job(&sb).args(&["--once", "k"]).output();
        assert_refused(&sb, &out, link);
        let left: Vec<_> = fs::read_dir(&behind).unwrap().flatten().collect();
        assert_eq!(left.len(), 3, "{link}: {left:?}");
        let listed = status(&sb, &["job"]);
        assert_exit(&listed, 78);
        assert!(
            line_with(&listed.stdout, "unreadable").contains("symbolic link"),
            "{}",
            listed.context()
        );
    }
}

#[test]
fn a_refused_lock_file_is_a_row_of_the_listing_and_status_exits_78() {
    let sb = Sandbox::new();
    assert_exit(&job(&sb).output(), 0);
    mkfifo(&sb.lock_file("fifo"));
    symlink(sb.path("elsewhere"), sb.lock_file("link")).unwrap();
    let out = status(&sb, &[]);
    assert_exit(&out, 78);
    assert!(
        line_with(&out.stdout, "job").contains("free"),
        "{}",
        out.context()
    );
    for (name, why) in [("fifo", "not a regular file"), ("link", "symbolic link")] {
        let row = line_with(&out.stdout, name);
        assert!(
            row.contains("refused") && row.contains(why),
            "{}",
            out.context()
        );
        assert!(
            out.stderr.contains(&format!("{name}.lock")),
            "{}",
            out.context()
        );
    }
    let json: serde_json::Value = serde_json::from_str(&status(&sb, &["--json"]).stdout).unwrap();
    let refused: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["refused"].as_str())
        .collect();
    assert_eq!(refused.len(), 2, "{json}");
}

// ---------------------------------------------------------------------------------------------
// --metrics-file in a folder other users share (issue 18, item 9).

/// A sandbox where the second user has a state directory of its own (`theirs`), and where
/// `shared` is sticky and writable by all (1777), as /tmp or a shared textfile folder is.
struct Shared {
    sb: Sandbox,
    other: user::User,
}

impl Shared {
    fn new() -> Shared {
        let other = user::other();
        let sb = Sandbox::new();
        chmod(&sb.path(""), 0o755);
        for (dir, mode) in [("theirs", 0o755), ("shared", 0o1777), ("open", 0o777)] {
            fs::create_dir(sb.path(dir)).unwrap();
            chmod(&sb.path(dir), mode);
        }
        other.owns(&sb.path("theirs"));
        Shared { sb, other }
    }

    /// The second user's run of lease `job` with `--metrics-file prom`, whose child leaves
    /// `theirs/ran`.
    fn job(&self, prom: &Path) -> Leasewrap {
        let ran = self.sb.path("theirs/ran");
        self.script_job(prom, &format!("touch {}", ran.to_str().unwrap()))
    }

    fn script_job(&self, prom: &Path, script: &str) -> Leasewrap {
        Leasewrap::new()
            .run_as(self.other)
            .local_dir(self.sb.path("theirs"))
            .name("job")
            .args(&["--metrics-file", prom.to_str().unwrap()])
            .cmd(&["sh", "-c", script])
    }
}

#[test]
fn a_metrics_file_another_user_planted_or_could_replace_is_refused_with_78_before_anything_runs() {
    let s = Shared::new();
    let forged = "leasewrap_outcome{name=\"job\",outcome=\"ran-ok\"} 1\n";
    let planted = s.sb.path("shared/planted.prom");
    fs::write(&planted, forged).unwrap();
    let dir = s.sb.path("theirs/dir.prom");
    fs::create_dir(&dir).unwrap();
    s.other.owns(&dir);
    for (prom, says) in [
        (planted.clone(), "owned by uid 0"),
        (s.sb.path("open/job.prom"), "not sticky"),
        (dir, "not a regular file"),
    ] {
        let out = s.job(&prom).output();
        assert_exit(&out, 78);
        let lines: Vec<&str> = out.stderr.trim_end().lines().collect();
        assert_eq!(lines.len(), 1, "one line{}", out.context());
        assert!(lines[0].contains(says), "names {says}{}", out.context());
        assert!(
            !s.sb.path("theirs/ran").exists(),
            "the child ran{}",
            out.context()
        );
        assert!(!s.sb.path("theirs/job.lock").exists(), "nothing acquired");
    }
    assert_eq!(fs::read_to_string(&planted).unwrap(), forged);
    assert!(!s.sb.path("open/job.prom").exists());
    let prom = s.sb.path("shared/job.prom");
    assert_exit(&s.job(&prom).output(), 0);
    let text = fs::read_to_string(&prom).expect("a free name in a sticky folder is written");
    assert!(text.contains("leasewrap_outcome"), "{text}");
}

#[test]
fn a_metrics_file_planted_while_the_child_runs_is_an_error_line_even_with_q_and_the_status_stands()
{
    let s = Shared::new();
    let prom = s.sb.path("shared/job.prom");
    let (started, go) = (s.sb.path("theirs/started"), s.sb.path("theirs/go"));
    let script = format!(
        "touch {}; i=0; while [ ! -e {} ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; exit 3",
        started.display(),
        go.display()
    );
    let mut run = s.script_job(&prom, &script).args(&["-q"]).spawn();
    crate::support::wait_for_file(&started, crate::support::STARTUP);
    fs::write(&prom, "planted\n").unwrap();
    fs::write(&go, "").unwrap();
    run.wait_timeout(RUN_BOUND);
    assert_exit(&run, 3);
    let stderr = run.stderr();
    let lines: Vec<&str> = stderr.trim_end().lines().collect();
    assert_eq!(lines.len(), 1, "one line under -q{}", run.context());
    assert!(lines[0].contains("metrics file"), "{}", run.context());
    assert_eq!(fs::read_to_string(&prom).unwrap(), "planted\n");
}
