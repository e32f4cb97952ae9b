//! Run records in `leasewrap status`: the last runs of each lease listed, and `status --once KEY`.
//! Reads only, like the rest of `status`.

use super::{align, json_line, print};
use crate::config::check_key;
use crate::error::Error;
use crate::lease::backend::Reader;
use crate::lease::report::LeaseStatus;
use crate::runs::{time_text, Outcome, RunRecord, Unreadable};
use crate::text::printable;

/// How many runs are shown per lease.
pub const LAST: usize = 10;

/// The last runs of `name`, newest first, and what is there but is not a record.
async fn last(reader: &dyn Reader, name: &str) -> Result<(Vec<RunRecord>, Vec<Unreadable>), Error> {
    let all = reader.runs(name, LAST).await?;
    let (mut good, mut bad): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
    for r in all {
        match r {
            Ok(r) => good.push(r),
            Err(u) => bad.push(u),
        }
    }
    good.sort_by(|a, b| b.end.total_cmp(&a.end));
    good.truncate(LAST);
    bad.sort_by(|a, b| a.key.cmp(&b.key));
    bad.truncate(LAST);
    Ok((good, bad))
}

/// Give each lease its last runs. For a `listing` (no NAME), a name that has records but no
/// lease now is listed too, as a free lease with its runs.
pub async fn fill(
    reader: &dyn Reader,
    leases: &mut Vec<LeaseStatus>,
    listing: bool,
) -> Result<(), Error> {
    if listing {
        for name in reader.names().await? {
            if !leases.iter().any(|l| l.name == name) {
                leases.push(LeaseStatus::free(&name, reader.label()));
            }
        }
        leases.sort_by(|a, b| a.name.cmp(&b.name));
    }
    for lease in leases {
        (lease.runs, lease.unreadable_runs) = last(reader, &lease.name).await?;
    }
    Ok(())
}

/// `status --once KEY NAME`: one line (or JSON) saying whether KEY is done; 0 when it is.
pub async fn once(reader: &dyn Reader, name: &str, key: &str, json: bool) -> Result<u8, Error> {
    check_key(key)?;
    let record = reader.run(name, key).await?;
    let done = record.as_ref().is_some_and(|r| r.outcome == Outcome::RanOk);
    let text = match json {
        true => json_line(&serde_json::json!({
            "name": name, "key": key, "done": done, "record": record,
        }))?,
        false => format!("{}\n", printable(&once_line(name, key, record.as_ref()))),
    };
    print(&text)?;
    Ok(if done { 0 } else { 1 })
}

fn once_line(name: &str, key: &str, record: Option<&RunRecord>) -> String {
    let Some(r) = record else {
        return format!("{name} {key}: not run yet");
    };
    let state = match r.outcome {
        Outcome::RanOk => "done".to_owned(),
        other => format!("not done, last run {}", other.as_str()),
    };
    format!(
        "{name} {key}: {state} (host {}, pid {}, token {}, ended {}, status {}), {} runs",
        r.host,
        r.pid,
        r.token,
        time_text(r.end),
        status(r),
        r.attempts
    )
}

const HEADER: [&str; 10] = [
    "NAME", "KEY", "OUTCOME", "RUNS", "TOKEN", "HOST", "PID", "START", "END", "STATUS",
];

/// The runs of every lease under a header, after a blank line; nothing when there are none.
/// Every cell is [`printable`]: keys, hosts and reasons come from files and keys others write.
pub fn table(leases: &[LeaseStatus]) -> String {
    let runs: Vec<[String; 10]> = leases
        .iter()
        .flat_map(|l| {
            let good = l.runs.iter().map(move |r| row(&l.name, r));
            good.chain(
                l.unreadable_runs
                    .iter()
                    .map(move |u| unreadable_row(&l.name, u)),
            )
        })
        .map(|row| row.map(|cell| printable(&cell)))
        .collect();
    if runs.is_empty() {
        return String::new();
    }
    let header = HEADER.map(str::to_owned);
    format!("\n{}", align(&[vec![header], runs].concat()))
}

fn row(name: &str, r: &RunRecord) -> [String; 10] {
    [
        name.to_owned(),
        r.key.clone(),
        r.outcome.as_str().to_owned(),
        r.attempts.to_string(),
        r.token.to_string(),
        r.host.clone(),
        r.pid.to_string(),
        time_text(r.start),
        time_text(r.end),
        status(r),
    ]
}

/// A row for what is at KEY's place and is not a record: why, in the last column.
fn unreadable_row(name: &str, u: &Unreadable) -> [String; 10] {
    let q = || "?".to_owned();
    [
        name.to_owned(),
        u.key.clone(),
        "unreadable".into(),
        q(),
        q(),
        q(),
        q(),
        q(),
        q(),
        u.why.clone(),
    ]
}

/// The exit status, or the signal, of a recorded run.
fn status(r: &RunRecord) -> String {
    match (&r.exit_status, &r.signal) {
        (Some(code), _) => code.to_string(),
        (None, Some(sig)) => sig.clone(),
        (None, None) => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::Run;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn runs_show_under_the_leases_with_their_status_or_signal() {
        let run = Run {
            token: 9,
            start: UNIX_EPOCH + Duration::from_secs(1_796_090_400),
            end: UNIX_EPOCH + Duration::from_secs(1_796_090_431),
            outcome: Outcome::RanOk,
            exit_status: Some(0),
            signal: None,
        };
        let ok = RunRecord {
            host: "web2".into(),
            pid: 77,
            attempts: 2,
            ..run.record("job", "2026-12-01T02:00:00Z", None, Duration::ZERO)
        };
        let mut lease = LeaseStatus::free("job", "etcd");
        lease.runs = vec![ok.clone()];
        let text = table(&[lease]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "");
        assert_eq!(
            lines[1],
            "NAME  KEY                   OUTCOME  RUNS  TOKEN  HOST  PID  START                 END                   STATUS"
        );
        assert_eq!(
            lines[2],
            "job   2026-12-01T02:00:00Z  ran-ok   2     9      web2  77   2026-12-01T02:00:00Z  2026-12-01T02:00:31Z  0"
        );
        assert_eq!(table(&[LeaseStatus::free("job", "etcd")]), "");
        assert!(once_line("job", "k", Some(&ok)).starts_with("job k: done (host web2"));
        let killed = RunRecord {
            outcome: Outcome::Failed,
            exit_status: None,
            signal: Some("SIGKILL".into()),
            ..ok
        };
        let line = once_line("job", "k", Some(&killed));
        assert!(
            line.contains("not done, last run failed") && line.contains("status SIGKILL"),
            "{line}"
        );
        assert_eq!(once_line("job", "k", None), "job k: not run yet");
    }

    #[test]
    fn what_is_not_a_record_is_a_row_saying_why_with_every_cell_escaped() {
        let mut lease = LeaseStatus::free("job", "local");
        lease.unreadable_runs = vec![Unreadable {
            key: "x\u{1b}[2Jy".into(),
            why: "run record d/runs/job/k.json is damaged\r".into(),
        }];
        let text = table(&[lease]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[2],
            r"job   x\u{1b}[2Jy  unreadable  ?     ?      ?     ?    ?      ?    run record d/runs/job/k.json is damaged\u{d}"
        );
    }
}
