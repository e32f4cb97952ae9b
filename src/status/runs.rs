//! Run records in `leasewrap status`: the last runs of each lease listed, and `status --once KEY`.
//! Reads only, like the rest of `status`.

use super::{align, json_line, print, LeaseStatus};
use crate::config::{Backend, EtcdConfig};
use crate::error::Error;
use crate::lease::etcd::client::Conn;
use crate::runs::{self, check_key, Outcome, RunRecord};

/// How many runs are shown per lease.
pub const LAST: usize = 10;

/// Where the records are read from: one etcd client for every name of a listing.
enum Reader<'a> {
    Local(&'a std::path::Path),
    Etcd(Box<Conn>, &'a EtcdConfig),
}

impl<'a> Reader<'a> {
    async fn new(backend: &'a Backend) -> Result<Reader<'a>, Error> {
        Ok(match backend {
            Backend::Local { dir } => Reader::Local(dir),
            Backend::Etcd(cfg) => Reader::Etcd(Box::new(Conn::dial(cfg).await?), cfg),
        })
    }

    /// The last runs of `name`, newest first; a value that is not a record is logged and skipped.
    async fn last(&self, name: &str) -> Result<Vec<RunRecord>, Error> {
        let all = match self {
            Reader::Local(dir) => runs::local::list(dir, name),
            Reader::Etcd(conn, cfg) => runs::etcd::list(conn, &cfg.prefix, name, LAST).await?,
        };
        let mut good: Vec<RunRecord> = all
            .into_iter()
            .filter_map(|r| r.map_err(|why| tracing::warn!("run record {why}")).ok())
            .collect();
        good.sort_by(|a, b| b.end.total_cmp(&a.end));
        good.truncate(LAST);
        Ok(good)
    }

    async fn read(&self, name: &str, key: &str) -> Result<Option<RunRecord>, Error> {
        match self {
            Reader::Local(dir) => runs::local::read(dir, name, key),
            Reader::Etcd(conn, cfg) => runs::etcd::read(conn, &cfg.prefix, name, key).await,
        }
    }
}

/// Give each lease its last runs.
pub async fn fill(backend: &Backend, leases: &mut [LeaseStatus]) -> Result<(), Error> {
    let reader = Reader::new(backend).await?;
    for lease in leases {
        lease.runs = reader.last(&lease.name).await?;
    }
    Ok(())
}

/// `status --once KEY NAME`: one line (or JSON) saying whether KEY is done; 0 when it is.
pub async fn once(backend: &Backend, name: &str, key: &str, json: bool) -> Result<u8, Error> {
    check_key(key).map_err(Error::Usage)?;
    let record = Reader::new(backend).await?.read(name, key).await?;
    let done = record.as_ref().is_some_and(|r| r.outcome == Outcome::RanOk);
    let text = match json {
        true => json_line(&serde_json::json!({
            "name": name, "key": key, "done": done, "record": record,
        }))?,
        false => format!("{}\n", once_line(name, key, record.as_ref())),
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
        time(r.end),
        status(r),
        r.attempts
    )
}

const HEADER: [&str; 10] = [
    "NAME", "KEY", "OUTCOME", "RUNS", "TOKEN", "HOST", "PID", "START", "END", "STATUS",
];

/// The runs of every lease under a header, after a blank line; nothing when there are none.
pub fn table(leases: &[LeaseStatus]) -> String {
    let runs: Vec<[String; 10]> = leases
        .iter()
        .flat_map(|l| l.runs.iter().map(move |r| row(&l.name, r)))
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
        time(r.start),
        time(r.end),
        status(r),
    ]
}

/// Unix seconds as RFC 3339 UTC.
fn time(unix: f64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(unix.max(0.0));
    humantime::format_rfc3339_seconds(at).to_string()
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
}
