//! A new user's command line (issue 21 items 7, 10, 11): every mistake gets one line on stderr
//! that says what to type instead, exit 64, and nothing is acquired or run.

use std::path::Path;

use crate::local::rejection;
use crate::support::*;

/// The one stderr line of a run refused with 64 that starts nothing; panics with what was wrong.
#[track_caller]
fn refused(args: &[&str]) -> String {
    rejection(args, false, 64).unwrap_or_else(|problems| panic!("{problems}"))
}

#[test]
fn a_command_without_dash_dash_is_refused_with_the_line_to_type_instead() {
    let line = refused(&["--name", "x", "sleep", "1"]);
    assert!(
        line.starts_with("leasewrap: unexpected argument 'sleep': put the command after --: leasewrap --local-dir "),
        "{line}"
    );
    assert!(line.ends_with(" --name x -- sleep 1"), "{line}");
}

#[test]
fn misspelt_options_get_the_option_they_resemble() {
    for (typo, meant) in [("--tll", "--ttl"), ("--nowait", "--no-wait")] {
        let line = refused(&["--name", "x", typo, "5s", "--", "true"]);
        assert!(
            line.ends_with(&format!(
                "unexpected argument '{typo}': did you mean {meant}?"
            )),
            "{line}"
        );
    }
}

#[test]
fn a_negative_duration_is_refused_as_a_duration_not_taken_for_an_option() {
    for option in ["--ttl", "--wait", "--kill-after", "--once-per", "--keep"] {
        let line = refused(&["--name", "x", option, "-1s", "--", "true"]);
        assert!(
            line.ends_with(&format!("{option}: \"-1s\" is not a duration: it is negative (write it like 500ms, 10s, 1h30m, 7d)")),
            "{line}"
        );
    }
}

#[test]
fn shells_and_interpreters_without_name_are_refused_saying_why() {
    let sb = Sandbox::new();
    let marker = sb.path("ran");
    let touch = format!("touch {}", q(&marker));
    let marker_arg = marker.to_str().expect("utf-8 path");
    let cases: [(&str, Vec<&str>); 5] = [
        ("sh", vec!["sh", "-c", &touch]),
        ("bash", vec!["/bin/bash", "-c", &touch]),
        ("env", vec!["env", "touch", marker_arg]),
        (
            "python3",
            vec![
                "python3",
                "-c",
                "open(__import__('sys').argv[1], 'w')",
                marker_arg,
            ],
        ),
        ("nice", vec!["nice", "touch", marker_arg]),
    ];
    for (name, argv) in cases {
        let args: Vec<&str> = std::iter::once("--").chain(argv).collect();
        let line = refused(&args);
        // The line's start ("leasewrap: ") is how every error that ends a run begins.
        let why = format!("--name is required when COMMAND is {name}: every unnamed {name} job on this host or fleet would share the lease \"{name}\"");
        assert!(line.ends_with(&why), "{line}");
        assert!(!marker.exists(), "{name}: the command ran");
    }
}

#[test]
fn a_named_shell_and_an_unnamed_script_run() {
    let sb = Sandbox::new();
    let out = sb
        .leasewrap()
        .name("greet")
        .cmd(&["sh", "-c", "echo hi"])
        .output();
    assert_exit(&out, 0);
    assert_eq!(out.stdout, "hi\n");
    let script = sb.script("nightly-report", "echo $LEASEWRAP_NAME");
    let out = sb.leasewrap().cmd(&[&script]).output();
    assert_exit(&out, 0);
    assert_eq!(out.stdout, "nightly-report\n");
}

/// `leasewrap status ARGS...` on the local directory `dir`.
fn status(dir: &Path, args: &[&str]) -> Output {
    Leasewrap::subcommand("status")
        .local_dir(dir)
        .args(args)
        .output()
}

#[test]
fn status_takes_the_name_as_dash_dash_name_too() {
    let sb = Sandbox::new();
    let out = sb.leasewrap().name("spelled").cmd(&["true"]).output();
    assert_exit(&out, 0);
    let positional = status(&sb.state(), &["spelled"]);
    let option = status(&sb.state(), &["--name", "spelled"]);
    assert_exit(&positional, 1);
    assert_exit(&option, 1);
    assert_eq!(option.stdout, positional.stdout);
    assert!(option.stdout.contains("spelled"), "{}", option.stdout);
    let both = status(&sb.state(), &["--name", "a", "b"]);
    assert_exit(&both, 64);
}

#[test]
fn status_names_a_bad_name_as_the_user_gave_it() {
    let sb = Sandbox::new();
    let out = status(&sb.state(), &["a/b"]);
    assert_exit(&out, 64);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("NAME \"a/b\""), "{}", out.stderr);
    assert!(!out.stderr.contains("--name"), "{}", out.stderr);
    let out = status(&sb.state(), &["--name", "a/b"]);
    assert_exit(&out, 64);
    assert!(out.stderr.contains("--name \"a/b\""), "{}", out.stderr);
}

#[test]
fn fenced_write_without_a_token_says_where_the_token_comes_from() {
    let sb = Sandbox::new();
    let dest = sb.path("dest");
    let out = Leasewrap::subcommand("fenced-write")
        .args(&[&dest])
        .stdin("data")
        .output();
    assert_exit(&out, 64);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("--token N") && out.stderr.contains("LEASEWRAP_FENCING_TOKEN"),
        "{}",
        out.stderr
    );
    assert!(!dest.exists(), "written without a token");
    let out = Leasewrap::subcommand("fenced-write")
        .env("LEASEWRAP_FENCING_TOKEN", "3")
        .args(&[&dest])
        .stdin("data")
        .output();
    assert_exit(&out, 0);
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "data");
}

/// LEASEWRAP_LOG=off silences leasewrap's logs, not its refusals: a usage error (64) or a
/// configuration error (78) starts nothing, and nothing else would say why.
#[test]
fn usage_and_configuration_errors_reach_stderr_even_with_leasewrap_log_off() {
    let sb = Sandbox::new();
    let missing = sb.path("no-such-password");
    let cases: [(&[&str], i32); 2] = [
        (&["--tll", "3", "--", "true"], 64),
        (
            &[
                "--endpoints",
                "http://127.0.0.1:1",
                "--password-file",
                missing.to_str().expect("utf-8 path"),
                "--user",
                "u",
                "--",
                "true",
            ],
            78,
        ),
    ];
    for (args, code) in cases {
        let out = sb
            .leasewrap()
            .name("x")
            .env("LEASEWRAP_LOG", "off")
            .args(args)
            .output();
        assert_exit(&out, code);
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "{args:?}: one line on stderr: {:?}",
            out.stderr
        );
        assert!(
            lines[0].starts_with("leasewrap: "),
            "{args:?}: {:?}",
            lines[0]
        );
    }
}

/// --keep says how long a run record is kept; without --once or --once-per there is none, and an
/// option that cannot apply is refused, never ignored.
#[test]
fn keep_without_once_or_once_per_is_refused() {
    let line = refused(&["--name", "x", "--keep", "1d", "--", "true"]);
    assert!(
        line.contains("--keep") && line.contains("--once"),
        "the line names --keep and what it needs: {line}"
    );
}
