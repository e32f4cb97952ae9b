//! Bad usage, said in one line (exit 64): clap's error rephrased where its first line alone does
//! not say what to do (a command without `--`, a misspelt option, a value clap took for an
//! option, a value the parser refused). It touches nothing: the error and argv in, the line out,
//! with argv parsed again (a `--` inserted, a value joined to its option) to find what was meant.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::Parser;

use crate::cli::Cli;
use crate::text::{printable, shell_words};

/// The line for `e`, which clap gave for `args` (argv, program name first), when it has a better
/// one than clap's own first line.
pub fn line(e: &clap::Error, args: &[OsString]) -> Option<String> {
    match e.kind() {
        ErrorKind::UnknownArgument => unknown(e, args),
        ErrorKind::ValueValidation => bad_value(e),
        _ => None,
    }
}

/// A context value of `e` that is one string.
fn context(e: &clap::Error, kind: ContextKind) -> Option<&str> {
    match e.get(kind)? {
        ContextValue::String(s) => Some(s),
        _ => None,
    }
}

/// An argument clap does not know: a misspelt option, a value that begins with `-`, or the
/// command's first word, given without `--`.
fn unknown(e: &clap::Error, args: &[OsString]) -> Option<String> {
    let arg = context(e, ContextKind::InvalidArg)?;
    if let Some(similar) = context(e, ContextKind::SuggestedArg) {
        return Some(format!(
            "unexpected argument '{}': did you mean {similar}?",
            printable(arg)
        ));
    }
    if arg.starts_with('-') {
        return hyphen_value(args, arg);
    }
    let at = (1..args.len()).find(|&i| args[i] == arg && parses(&dash_dash_at(args, i)))?;
    let fixed = command_line(&dash_dash_at(args, at));
    let arg = printable(arg);
    Some(match at {
        1 => format!(
            "'{arg}' is not a subcommand (status, fenced-write, fenced-put): to run it, put it after --: {fixed}"
        ),
        _ => format!("unexpected argument '{arg}': put the command after --: {fixed}"),
    })
}

/// `args` with `--` inserted before `args[at]`.
fn dash_dash_at(args: &[OsString], at: usize) -> Vec<OsString> {
    let mut fixed = args.to_vec();
    fixed.insert(at, "--".into());
    fixed
}

fn parses(args: &[OsString]) -> bool {
    Cli::try_parse_from(args).is_ok()
}

/// A value that starts with `-` (`--ttl -1s`), which clap took for options of its own: what the
/// option's parser says of it, or how to give it.
fn hyphen_value(args: &[OsString], arg: &str) -> Option<String> {
    let at = (2..args.len()).find(|&i| {
        let (option, value) = (args[i - 1].to_string_lossy(), args[i].to_string_lossy());
        option.starts_with('-') && option != "--" && value.starts_with(arg)
    })?;
    let (option, value) = (args[at - 1].to_string_lossy(), args[at].to_string_lossy());
    let mut joined = args[..at - 1].to_vec();
    joined.push(format!("{option}={value}").into());
    joined.extend_from_slice(&args[at + 1..]);
    match Cli::try_parse_from(&joined) {
        Err(e) if e.kind() == ErrorKind::ValueValidation => bad_value(&e),
        Ok(_) => Some(format!(
            "{option} {value}: a value that starts with - is taken for an option; write {option}={value}",
            option = printable(&option),
            value = printable(&value)
        )),
        Err(_) => None,
    }
}

/// A value its parser refused: the option, and the parser's own reason (which names the value).
fn bad_value(e: &clap::Error) -> Option<String> {
    let option = context(e, ContextKind::InvalidArg)?.split(' ').next()?;
    let value = context(e, ContextKind::InvalidValue)?;
    let why = std::error::Error::source(e)?.to_string();
    Some(match why.contains(value) {
        true => format!("{option}: {why}"),
        false => format!("{option} {:?}: {why}", printable(value)),
    })
}

/// argv as it would be typed, program name as `leasewrap`.
fn command_line(args: &[OsString]) -> String {
    let words: Vec<String> = std::iter::once("leasewrap".to_owned())
        .chain(args[1..].iter().map(|a| a.to_string_lossy().into_owned()))
        .collect();
    printable(&shell_words(&words))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line for `argv` (after `leasewrap`), which must be bad usage.
    fn said(argv: &str) -> Option<String> {
        let args: Vec<OsString> = std::iter::once("leasewrap")
            .chain(argv.split(' '))
            .map(OsString::from)
            .collect();
        let e = Cli::try_parse_from(&args).expect_err(argv);
        line(&e, &args)
    }

    #[test]
    fn a_command_without_dash_dash_is_shown_with_it() {
        assert_eq!(
            said("--name x sleep 1").unwrap(),
            "unexpected argument 'sleep': put the command after --: leasewrap --name x -- sleep 1"
        );
        assert_eq!(
            said("--name sleep sleep 1").unwrap(),
            "unexpected argument 'sleep': put the command after --: leasewrap --name sleep -- sleep 1"
        );
        assert_eq!(
            said("fenced-write --token 1 /tmp/dest make-report").unwrap(),
            "unexpected argument 'make-report': put the command after --: leasewrap fenced-write --token 1 /tmp/dest -- make-report"
        );
        assert!(said("stauts")
            .unwrap()
            .starts_with("'stauts' is not a subcommand"));
        // No -- makes it a command line: clap's own line stands.
        assert_eq!(said("--name x -c true extra"), None);
    }

    #[test]
    fn misspelt_options_get_the_similar_one() {
        assert_eq!(
            said("--tll 5s -- true").unwrap(),
            "unexpected argument '--tll': did you mean --ttl?"
        );
        assert_eq!(
            said("--nowait -- true").unwrap(),
            "unexpected argument '--nowait': did you mean --no-wait?"
        );
    }

    #[test]
    fn a_value_starting_with_a_hyphen_is_judged_as_the_value() {
        let line = said("--ttl -1s -- true").unwrap();
        assert!(
            line.starts_with("--ttl: \"-1s\" is not a duration"),
            "{line}"
        );
        let line = said("--name x -w -5m -- true").unwrap();
        assert!(
            line.starts_with("--wait: \"-5m\" is not a duration"),
            "{line}"
        );
        assert_eq!(
            said("--prefix -x -- true").unwrap(),
            "--prefix -x: a value that starts with - is taken for an option; write --prefix=-x"
        );
    }

    #[test]
    fn a_refused_value_names_the_option_and_the_parsers_reason() {
        let line = said("--ttl abc -- true").unwrap();
        assert!(
            line.starts_with("--ttl: \"abc\" is not a duration"),
            "{line}"
        );
        assert_eq!(
            said("-E 300 -- true").unwrap(),
            "--conflict-exit-code: 300 is not in 0..=255"
        );
    }
}
