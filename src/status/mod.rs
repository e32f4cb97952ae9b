//! `leasewrap status`: who holds a lease, with which token, for how long still, and how many
//! wait. Reads only: it never takes, changes or creates a lease, a key, a file or a directory.
//!
//! Each backend turns what it stores into `lease::report::LeaseStatus` values (its
//! `lease::backend::Reader`); this module prints them as aligned text or JSON and chooses the
//! exit status.

mod runs;

use std::io::Write;

use serde::Serialize;

use crate::cli::StatusArgs;
use crate::config::{self, Env};
use crate::error::Error;
use crate::lease::backend::Reader;
use crate::lease::report::{Holder, LeaseStatus};
use crate::text::{printable, shell_words};

/// How `status` ends, beside the errors every subcommand shares; the man page prints this table.
pub const EXIT_STATUS_TABLE: &[(&str, &str)] = &[
    (
        "0",
        "NAME is held; without NAME, always (the listing itself is the answer); with --once KEY, KEY is done; with --once-per DUR, the KEY a run now would use is done",
    ),
    ("1", "NAME is free; with --once KEY (or --once-per DUR), KEY is not done"),
    ("64", "bad usage: a lease name, option, duration or URL is wrong"),
    ("69", "etcd or ZooKeeper is unreachable"),
    (
        "77",
        "etcd or ZooKeeper refused the authentication, or the TLS handshake failed; on ZooKeeper also a lease whose nodes this identity may not read (the listing is printed whole first, with a row saying so)",
    ),
    (
        "78",
        "bad configuration: a certificate, password file or the local directory is unreadable; or a lock file, a run record or a folder of them was refused (a link, a FIFO, damaged): the listing is printed whole, with a row saying why, and then status exits 78",
    ),
    ("125", "leasewrap itself failed"),
];

/// Print the status; exit 0 when NAME is held, 1 when it is free, 0 for a listing. With
/// `--once KEY` (or `--once-per DUR`, the KEY a run would use now): exit 0 when KEY of NAME is
/// done, 1 when it is not. Anything refused (a lock file, a record) is a row of the listing, and
/// then the error (78) once all is printed.
pub async fn run(args: &StatusArgs, env: Env<'_>) -> Result<u8, Error> {
    let name = args.lease_name();
    if let Some(name) = name {
        let given_as = if args.name.is_some() {
            "NAME"
        } else {
            "--name"
        };
        config::check_name_given_as(name, given_as)?;
    }
    let backend = config::backend(&args.conn, args.local_dir.as_deref(), env)?;
    let reader = crate::lease::backend::reader(&backend);
    let shown = show(args, name, &*reader).await;
    reader.close().await;
    shown
}

/// [`run`], once the backend is known.
async fn show(args: &StatusArgs, name: Option<&str>, reader: &dyn Reader) -> Result<u8, Error> {
    if let Some(key) = once_key(args)? {
        let name = name.ok_or_else(|| Error::Usage("status --once KEY needs NAME".into()))?;
        return runs::once(reader, name, &key, args.json).await;
    }
    let mut leases = reader.leases(name).await?;
    runs::fill(reader, &mut leases, name.is_none()).await?;
    let text = match (args.json, name) {
        (true, Some(_)) => json_line(&leases[0])?,
        (true, None) => json_line(&leases)?,
        (false, _) => table(&leases) + &ignored(&leases) + &runs::table(&leases),
    };
    print(&text)?;
    refusals(&leases)?;
    Ok(match name {
        Some(_) if !leases[0].held => 1,
        _ => 0,
    })
}

/// A line for each node that has a lock node's name and is not one.
fn ignored(leases: &[LeaseStatus]) -> String {
    let lines: Vec<String> = leases
        .iter()
        .flat_map(|l| l.ignored.iter().map(move |n| (l, n)))
        .map(|(l, node)| {
            printable(&format!(
                "{}: {node} is not a lock node (no session owns it): never waited for\n",
                l.name
            ))
        })
        .collect();
    lines.concat()
}

/// Everything the listing shows as refused or unreadable, as one error line: 77 when the server
/// denied a read, else 78.
fn refusals(leases: &[LeaseStatus]) -> Result<(), Error> {
    let whys: Vec<&str> = leases
        .iter()
        .flat_map(|l| {
            let runs = l.unreadable_runs.iter().map(|u| u.why.as_str());
            l.refused.as_deref().into_iter().chain(runs)
        })
        .collect();
    let text = printable(&format!("shown in the listing: {}", whys.join("; ")));
    match (whys.is_empty(), leases.iter().any(|l| l.denied)) {
        (true, _) => Ok(()),
        (false, true) => Err(Error::Auth(text)),
        (false, false) => Err(Error::Config(text)),
    }
}

/// The KEY of --once KEY, or the slot a --once-per DUR run would take now.
fn once_key(args: &StatusArgs) -> Result<Option<String>, Error> {
    match (&args.once, args.once_per) {
        (Some(key), _) => Ok(Some(key.clone())),
        (None, Some(per)) => {
            crate::runs::slot::check_period(per).map_err(Error::Usage)?;
            Ok(Some(crate::runs::slot::slot_key(
                std::time::SystemTime::now(),
                per,
            )))
        }
        (None, None) => Ok(None),
    }
}

pub(crate) fn json_line(value: &impl Serialize) -> Result<String, Error> {
    let mut text = serde_json::to_string(value).map_err(|e| Error::internal("writing JSON", e))?;
    text.push('\n');
    Ok(text)
}

/// Write to stdout; a reader that went away (`| head`) is not a failure.
pub(crate) fn print(text: &str) -> Result<(), Error> {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::internal("writing to stdout", e))
        }
        _ => Ok(()),
    }
}

const HEADER: [&str; 8] = [
    "NAME",
    "STATE",
    "TOKEN",
    "TIME LEFT",
    "WAITERS",
    "HOST",
    "PID",
    "COMMAND",
];

/// One line per lease under a header, in columns padded to the widest cell; the command, last,
/// is not padded. "-" means "does not apply", "?" means "not known".
pub fn table(leases: &[LeaseStatus]) -> String {
    let rows: Vec<[String; 8]> = std::iter::once(HEADER.map(str::to_owned))
        .chain(leases.iter().map(|l| row(l).map(|cell| printable(&cell))))
        .collect();
    align(&rows)
}

/// Rows as lines, each column padded to its widest cell but the last, which is not padded.
pub(crate) fn align<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 < row.len() {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            } else {
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The holder's command as recorded: the program, and how many arguments it left out.
fn command(h: &Holder) -> String {
    match h.args {
        0 => shell_words(&h.command),
        1 => format!("{} (1 argument not recorded)", shell_words(&h.command)),
        n => format!("{} ({n} arguments not recorded)", shell_words(&h.command)),
    }
}

fn row(l: &LeaseStatus) -> [String; 8] {
    if let Some(why) = &l.refused {
        let q = || "?".to_owned();
        return [
            l.name.clone(),
            "refused".into(),
            q(),
            q(),
            q(),
            q(),
            q(),
            why.clone(),
        ];
    }
    let dash = || "-".to_owned();
    let or_dash = |v: Option<String>| v.unwrap_or_else(dash);
    let time_left = match (l.held, l.backend, l.time_left_s) {
        (true, "etcd", Some(s)) => format!("{s}s"),
        (true, "etcd", None) => "?".into(),
        _ => dash(),
    };
    let holder = match (&l.holder, l.held) {
        (Some(h), true) => [h.host.clone(), h.pid.to_string(), command(h)],
        (None, true) => ["?".into(), "?".into(), "?".into()],
        _ => [dash(), dash(), dash()],
    };
    let [host, pid, command] = holder;
    [
        l.name.clone(),
        if l.held { "held" } else { "free" }.into(),
        or_dash(l.token.map(|t| t.to_string())),
        time_left,
        l.waiters.map_or_else(|| "?".into(), |w| w.to_string()),
        host,
        pid,
        command,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(name: &str, backend: &'static str, holder: Option<Holder>) -> LeaseStatus {
        LeaseStatus {
            held: true,
            holder,
            token: Some(42),
            time_left_s: (backend == "etcd").then_some(7),
            ttl_s: (backend == "etcd").then_some(10),
            waiters: None,
            key: Some("k".into()),
            ..LeaseStatus::free(name, backend)
        }
    }

    #[test]
    fn table_aligns_columns_and_marks_what_does_not_apply() {
        let holder = Holder {
            host: "web1".into(),
            pid: 4242,
            command: vec!["./my report.sh".into()],
            args: 2,
            start: 0.0,
        };
        let leases = [
            held("nightly-report", "etcd", Some(holder)),
            LeaseStatus::free("b", "etcd"),
            held("c", "local", None),
        ];
        let text = table(&leases);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "NAME            STATE  TOKEN  TIME LEFT  WAITERS  HOST  PID   COMMAND",
                "nightly-report  held   42     7s         ?        web1  4242  './my report.sh' (2 arguments not recorded)",
                "b               free   -      -          0        -     -     -",
                "c               held   42     -          ?        ?     ?     ?",
            ]
        );
    }

    #[test]
    fn a_refused_lock_file_is_a_row_saying_why_and_the_listing_then_fails_with_78() {
        let why = "refusing d.lock: it is not a regular file\u{1b}[2J";
        let leases = [
            LeaseStatus::free("b", "local"),
            LeaseStatus::refused("d", "local", why.into()),
        ];
        let text = table(&leases);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[2],
            r"d     refused  ?      ?          ?        ?     ?    refusing d.lock: it is not a regular file\u{1b}[2J"
        );
        let err = refusals(&leases).unwrap_err();
        assert_eq!(err.code(crate::error::ExitCodes::default()), 78);
        assert!(!err.to_string().contains('\u{1b}'), "{err}");
        assert!(refusals(&leases[..1]).is_ok());
    }

    #[test]
    fn every_error_status_can_end_with_is_in_its_table() {
        let errors = [
            Error::Usage(String::new()),
            Error::Config(String::new()),
            Error::Unavailable(String::new()),
            Error::Auth(String::new()),
            Error::Internal(String::new()),
        ];
        for e in errors {
            let c = e.code(crate::error::ExitCodes::default()).to_string();
            assert!(EXIT_STATUS_TABLE.iter().any(|(s, _)| *s == c), "{c}");
        }
    }
}
