//! `--metrics-file PATH`: a node_exporter textfile-collector file for one lease name, replaced
//! whole after every run or skip (see [`super::file`]). It says how this host's last invocation
//! ended and, with --once, whether and where KEY ran, so that an alert can tell "another host
//! ran it" (`skipped-done` here, `ran-ok` there) from "nobody ran it".

use std::fmt::Write as _;
use std::path::Path;

use super::file::{self, Replace};
use super::record::{Outcome, RunRecord};
use crate::error::Error;
use crate::files::Dir;

/// One invocation, as the metrics file reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    /// The lease name: the `name` label of every series.
    pub name: &'a str,
    /// How the invocation ended.
    pub outcome: Outcome,
    /// When it started and ended, in Unix seconds.
    pub start: f64,
    pub end: f64,
    /// How long the child ran; zero when none was started.
    pub duration: f64,
    /// The child's exit status (128+n for signal n); none when no child ran.
    pub exit_status: Option<i32>,
    /// The fencing token held; none when the lease was not acquired.
    pub token: Option<u64>,
    /// With --once: KEY and its record as it stands after this invocation.
    pub once: Option<(&'a str, Option<&'a RunRecord>)>,
}

/// One series: its help text and type go before the first sample.
struct Family<'s> {
    out: &'s mut String,
}

impl Family<'_> {
    fn head(&mut self, name: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP leasewrap_{name} {help}");
        let _ = writeln!(self.out, "# TYPE leasewrap_{name} gauge");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        let _ = writeln!(self.out, "leasewrap_{name}{{{}}} {value}", labels.join(","));
    }

    fn one(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.head(name, help);
        self.sample(name, labels, value);
    }
}

/// A label value in the exposition format: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// The series that describe the last invocation: name, help, and its value (none: left out).
type Series = (&'static str, &'static str, fn(&Sample) -> Option<f64>);

const LAST: [Series; 5] = [
    (
        "last_start_timestamp_seconds",
        "When this host's last invocation started, in Unix time.",
        |s| Some(s.start),
    ),
    (
        "last_end_timestamp_seconds",
        "When this host's last invocation ended, in Unix time.",
        |s| Some(s.end),
    ),
    (
        "last_duration_seconds",
        "How long the child of the last invocation ran (0 when none was started).",
        |s| Some(s.duration),
    ),
    (
        "last_exit_status",
        "The exit status of the last child (128+n for signal n).",
        |s| s.exit_status.map(f64::from),
    ),
    (
        "last_fencing_token",
        "The fencing token the last invocation held.",
        |s| s.token.map(|t| t as f64),
    ),
];

/// The file's text for `s`.
pub fn render(s: &Sample) -> String {
    let mut out = String::new();
    let mut f = Family { out: &mut out };
    f.head(
        "outcome",
        "How this host's last invocation ended: 1 for its outcome, 0 for the others.",
    );
    for o in Outcome::ALL {
        let v = if o == s.outcome { 1.0 } else { 0.0 };
        f.sample("outcome", &[("name", s.name), ("outcome", o.as_str())], v);
    }
    for (metric, help, value) in LAST {
        if let Some(v) = value(s) {
            f.one(metric, help, &[("name", s.name)], v);
        }
    }
    if let Some((key, record)) = s.once {
        once(&mut f, s.name, key, record);
    }
    out
}

/// The --once series: attempts of KEY on any host, and when and where it succeeded.
fn once(f: &mut Family, name: &str, key: &str, record: Option<&RunRecord>) {
    let labels = [("name", name), ("key", key)];
    let attempts = record.map_or(0, |r| r.attempts);
    f.one(
        "once_attempts",
        "Runs of KEY started so far, on any host.",
        &labels,
        attempts.into(),
    );
    if let Some(r) = record.filter(|r| r.outcome == Outcome::RanOk) {
        let labels = [("name", name), ("key", key), ("host", r.host.as_str())];
        f.one(
            "once_done_timestamp_seconds",
            "When the successful run of KEY ended, and on which host; absent while KEY is not done.",
            &labels,
            r.end,
        );
    }
}

/// Refuse a PATH that another user planted or could replace (78): PATH must be absent or a
/// regular file of ours, in a folder owned by us or root that nobody else can write unless it
/// is sticky (where nobody else can remove or rename our file). Looked at through the folder's
/// descriptor, never following a link at PATH, before anything is acquired.
pub fn check_place(path: &Path) -> Result<(), Error> {
    let refused =
        |why: String| Error::Config(format!("refusing --metrics-file {}: {why}", path.display()));
    let dir = Dir::containing(path)?;
    if let Some(why) = dir.others_can_replace(true)? {
        let folder = dir.path().display();
        return Err(refused(format!("its folder {folder} {why}")));
    }
    let euid = nix::unistd::geteuid().as_raw();
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    match dir.stat(&name) {
        None => Ok(()),
        Some(f) if f.st_mode & libc::S_IFMT != libc::S_IFREG => Err(refused(
            "it is not a regular file (a directory, a link, a FIFO...); remove it".into(),
        )),
        Some(f) if f.st_uid != euid => Err(refused(format!(
            "it is owned by uid {}, not by uid {euid}; remove it",
            f.st_uid
        ))),
        Some(_) => Ok(()),
    }
}

/// Replace the file at `path` with the text for `s`. A reader never sees half a file.
pub fn write(path: &Path, s: &Sample) -> std::io::Result<()> {
    file::replace(path, render(s).as_bytes(), Replace::PLAIN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::record::{Run, RunRecord};
    use serde_json::Value;
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    use std::time::{Duration, UNIX_EPOCH};

    /// The families of `text` as Prometheus's own Python parser reads them.
    fn parse(text: &str) -> Vec<Value> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/parse-metrics.py");
        let mut child = Command::new("python3")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 is needed to parse the metrics file (scripts/test.sh installs it)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the parser refused the file ({err}; is prometheus_client installed? scripts/test.sh installs it):\n{text}"
        );
        serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
    }

    /// The value of `metric`'s sample whose labels include `label`, if there is one.
    fn value(families: &[Value], metric: &str, label: (&str, &str)) -> Option<f64> {
        let samples = families
            .iter()
            .flat_map(|f| f["samples"].as_array().unwrap());
        samples
            .filter(|s| s["name"] == metric && s["labels"][label.0] == label.1)
            .map(|s| s["value"].as_f64().unwrap())
            .next()
    }

    fn done_record() -> RunRecord {
        let run = Run {
            token: 41,
            start: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            end: UNIX_EPOCH + Duration::from_secs(1_800_000_030),
            outcome: Outcome::RanOk,
            exit_status: Some(0),
            signal: None,
        };
        RunRecord {
            host: "web\"2".into(),
            ..run.record("job", "2026-12-01T02:00:00Z", None, Duration::from_secs(60))
        }
    }

    fn sample<'a>(outcome: Outcome, once: Option<(&'a str, Option<&'a RunRecord>)>) -> Sample<'a> {
        Sample {
            name: "night\\ly",
            outcome,
            start: 1_800_000_100.5,
            end: 1_800_000_101.0,
            duration: 0.0,
            exit_status: None,
            token: Some(42),
            once,
        }
    }

    #[test]
    fn every_outcome_renders_a_file_prometheus_parses_with_one_outcome_set() {
        let record = done_record();
        for outcome in Outcome::ALL {
            let s = sample(outcome, Some(("2026-12-01T02:00:00Z", Some(&record))));
            let families = parse(&render(&s));
            for o in Outcome::ALL {
                let want = if o == outcome { 1.0 } else { 0.0 };
                assert_eq!(
                    value(&families, "leasewrap_outcome", ("outcome", o.as_str())),
                    Some(want),
                    "{outcome:?}/{o:?}"
                );
            }
            for f in &families {
                assert_eq!(f["type"], "gauge", "{f}");
                assert!(f["name"].as_str().unwrap().starts_with("leasewrap_"), "{f}");
                assert!(!f["help"].as_str().unwrap().is_empty(), "{f}");
            }
        }
    }

    #[test]
    fn the_file_says_where_and_when_key_was_done_with_labels_escaped() {
        let record = done_record();
        let s = sample(
            Outcome::SkippedDone,
            Some(("2026-12-01T02:00:00Z", Some(&record))),
        );
        let families = parse(&render(&s));
        let name = ("name", "night\\ly");
        assert_eq!(
            value(
                &families,
                "leasewrap_once_done_timestamp_seconds",
                ("host", "web\"2")
            ),
            Some(1_800_000_030.0)
        );
        assert_eq!(value(&families, "leasewrap_once_attempts", name), Some(1.0));
        assert_eq!(
            value(&families, "leasewrap_last_start_timestamp_seconds", name),
            Some(1_800_000_100.5)
        );
        assert_eq!(
            value(&families, "leasewrap_last_fencing_token", name),
            Some(42.0)
        );
        assert_eq!(value(&families, "leasewrap_last_exit_status", name), None);
    }

    #[test]
    fn nobody_having_run_key_shows_no_done_series() {
        let s = Sample {
            exit_status: Some(3),
            ..sample(Outcome::Failed, Some(("k", None)))
        };
        let families = parse(&render(&s));
        let done = value(
            &families,
            "leasewrap_once_done_timestamp_seconds",
            ("key", "k"),
        );
        assert_eq!(done, None);
        assert_eq!(
            value(&families, "leasewrap_once_attempts", ("key", "k")),
            Some(0.0)
        );
        let status = value(
            &families,
            "leasewrap_last_exit_status",
            ("name", "night\\ly"),
        );
        assert_eq!(status, Some(3.0));
    }
}
