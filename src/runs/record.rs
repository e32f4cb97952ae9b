//! The run record of one (name, KEY): what every host of the backend knows about the runs of KEY,
//! and the pure decision taken from it before a child starts. No I/O here: the stores in
//! each backend's `runs` module move the bytes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The `format` of every record this version writes; a value without it is not ours.
pub const FORMAT: &str = "leasewrap-run/1";

/// The latest time a record may hold, 9999-12-31T23:59:59Z: the last second RFC 3339 can
/// write. A time outside 1970..=this makes the record damaged.
pub const LATEST: f64 = 253_402_300_799.0;

/// How one invocation ended, as the metrics file and the run records name it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The child exited 0 (and, with --once, its success was recorded).
    RanOk,
    /// The child exited non-zero or died of a signal, or its success could not be recorded.
    Failed,
    /// The lease was lost and the child stopped.
    Lost,
    /// --max-runtime ran out and the child was stopped.
    TimedOut,
    /// The lease was held elsewhere (-n) or the wait ran out (-w): nothing was started.
    SkippedBusy,
    /// KEY had already succeeded: nothing was started.
    SkippedDone,
    /// KEY had failed --max-attempts times: nothing was started.
    GaveUp,
}

impl Outcome {
    /// Every outcome, in the order the metrics file lists them.
    pub const ALL: [Outcome; 7] = [
        Outcome::RanOk,
        Outcome::Failed,
        Outcome::Lost,
        Outcome::TimedOut,
        Outcome::SkippedBusy,
        Outcome::SkippedDone,
        Outcome::GaveUp,
    ];

    /// The outcome's name: `ran-ok`, `timed-out`, ...
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::RanOk => "ran-ok",
            Outcome::Failed => "failed",
            Outcome::Lost => "lost",
            Outcome::TimedOut => "timed-out",
            Outcome::SkippedBusy => "skipped-busy",
            Outcome::SkippedDone => "skipped-done",
            Outcome::GaveUp => "gave-up",
        }
    }

    /// Whether a child was started: only such outcomes are ever stored in a record.
    pub const fn is_run(self) -> bool {
        matches!(
            self,
            Outcome::RanOk | Outcome::Failed | Outcome::Lost | Outcome::TimedOut
        )
    }
}

/// What is stored for (name, KEY), written by the holder of the lease NAME under its fencing
/// token and read by the next holders. One struct for writing and reading.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// Marks the value as a leasewrap run record of this layout ([`FORMAT`]).
    pub format: String,
    /// The lease name.
    pub name: String,
    /// The --once KEY (or the --once-per slot).
    pub key: String,
    /// How the latest run of KEY ended; `ran-ok` means KEY is done.
    pub outcome: Outcome,
    /// Runs of KEY started so far, on any host, the latest included.
    pub attempts: u32,
    /// Host name of the latest run's leasewrap.
    pub host: String,
    /// Pid of the latest run's leasewrap.
    pub pid: u32,
    /// Fencing token the latest run held; the record was written under it.
    pub token: u64,
    /// When the latest run's child started, in Unix seconds.
    pub start: f64,
    /// When it ended, in Unix seconds.
    pub end: f64,
    /// Its exit status, when it exited.
    pub exit_status: Option<i32>,
    /// The signal it died of (`SIGKILL`), when it did.
    pub signal: Option<String>,
    /// Unix seconds after which the record may be removed: --keep after `end`.
    pub keep_until: f64,
}

/// What the run record says to do once the lease is ours.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start the child: KEY is not done, and attempts are left.
    Run,
    /// KEY already succeeded: start nothing.
    Done,
    /// KEY failed --max-attempts times: start nothing.
    GaveUp,
}

impl Decision {
    /// The decision for KEY given its record (none yet) and the --max-attempts limit.
    pub fn of(prior: Option<&RunRecord>, max_attempts: Option<u32>) -> Decision {
        match prior {
            Some(r) if r.outcome == Outcome::RanOk => Decision::Done,
            Some(r) if max_attempts.is_some_and(|n| r.attempts >= n) => Decision::GaveUp,
            _ => Decision::Run,
        }
    }

    /// The outcome of an invocation that stops at this decision; none for [`Decision::Run`].
    pub const fn skip_outcome(&self) -> Option<Outcome> {
        match self {
            Decision::Run => None,
            Decision::Done => Some(Outcome::SkippedDone),
            Decision::GaveUp => Some(Outcome::GaveUp),
        }
    }
}

/// Only the marker, read first so that a record of another layout is named as such.
#[derive(Deserialize)]
struct Marker {
    format: Option<String>,
}

impl RunRecord {
    /// The record for (`name`, `key`) in `bytes`, or why they are not one: not JSON, another
    /// layout, another name or key, or an outcome that is never stored. Never guessed at.
    pub fn parse(bytes: &[u8], name: &str, key: &str) -> Result<RunRecord, String> {
        let marker: Marker = serde_json::from_slice(bytes)
            .map_err(|e| format!("is not a leasewrap run record ({e})"))?;
        match marker.format.as_deref() {
            Some(FORMAT) => {}
            Some(other) => return Err(format!("has format {other:?}, not {FORMAT:?}")),
            None => return Err("is not a leasewrap run record (no \"format\")".into()),
        }
        let r: RunRecord = serde_json::from_slice(bytes)
            .map_err(|e| format!("is a damaged leasewrap run record ({e})"))?;
        if r.name != name || r.key != key {
            return Err(format!(
                "belongs to name {:?} and key {:?}, not {name:?} and {key:?}",
                r.name, r.key
            ));
        }
        if !r.outcome.is_run() {
            return Err(format!(
                "records outcome {:?}, which is never stored",
                r.outcome.as_str()
            ));
        }
        r.check_times()?;
        Ok(r)
    }

    /// Every time in the record is one that can be written as a date: from 1970 to 9999.
    fn check_times(&self) -> Result<(), String> {
        let times = [
            ("start", self.start),
            ("end", self.end),
            ("keep_until", self.keep_until),
        ];
        match times.iter().find(|(_, t)| !(0.0..=LATEST).contains(t)) {
            Some((field, t)) => Err(format!(
                "is a damaged leasewrap run record ({field} {t} is not a time from 1970 to 9999)"
            )),
            None => Ok(()),
        }
    }

    /// The JSON that is stored.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a run record always serializes")
    }

    /// Whether its keep time has passed at `now`: then it counts as gone.
    pub fn expired(&self, now: SystemTime) -> bool {
        unix_seconds(now) > self.keep_until
    }

    /// When the child ran, in seconds.
    pub fn duration(&self) -> f64 {
        (self.end - self.start).max(0.0)
    }
}

/// Who ran the child and how it went: the parts of a new record that the run loop knows.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The fencing token held.
    pub token: u64,
    /// When the child started.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// How it ended; must be one of [`Outcome::is_run`].
    pub outcome: Outcome,
    /// Its exit status, when it exited.
    pub exit_status: Option<i32>,
    /// The signal it died of, when it did.
    pub signal: Option<String>,
}

/// Unix seconds as RFC 3339 UTC (`2026-12-01T02:00:31Z`); a number that is no such time (a
/// damaged record's) as the number itself, never a panic.
pub fn time_text(unix: f64) -> String {
    if !(0.0..=LATEST).contains(&unix) {
        return unix.to_string();
    }
    let at = UNIX_EPOCH + Duration::from_secs_f64(unix);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// Seconds since the Unix epoch, as the records and the metrics file write time.
pub fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

impl Run {
    /// The record to store after this run of `key`, counting it as one more attempt than
    /// `prior` had.
    pub fn record(
        &self,
        name: &str,
        key: &str,
        prior: Option<&RunRecord>,
        keep: Duration,
    ) -> RunRecord {
        RunRecord {
            format: FORMAT.into(),
            name: name.into(),
            key: key.into(),
            outcome: self.outcome,
            attempts: prior.map_or(0, |p| p.attempts).saturating_add(1),
            host: hostname(),
            pid: std::process::id(),
            token: self.token,
            start: unix_seconds(self.start),
            end: unix_seconds(self.end),
            exit_status: self.exit_status,
            signal: self.signal.clone(),
            keep_until: unix_seconds(self.end + keep),
        }
    }
}

/// This host's name, as the records and the holder record give it.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The most records one sweep reads, so that a write costs a bounded number of reads however
/// many records a name has (`--once-per 1m` keeps some 10,000 over a week's --keep). Each sweep
/// starts at a random place among them, so every record is looked at in time.
pub const SWEEP_READS: usize = 64;

/// The names (files, nodes) of `records` whose keep time had passed when another of them ended, that one
/// having ended no later than `now`: the end of a run recorded earlier, not this host's clock
/// alone, shows that the keep time is over. A clock far ahead of every record (a faked or
/// mis-set clock) then deletes nothing that the records themselves do not show expired, and a
/// record that ended "in the future" is no witness.
pub fn confirmed_expired(records: &[(String, RunRecord)], now: f64) -> Vec<&str> {
    let newest = records
        .iter()
        .map(|(_, r)| r.end)
        .filter(|&end| end <= now)
        .fold(f64::NEG_INFINITY, f64::max);
    records
        .iter()
        .filter(|(_, r)| r.keep_until < newest)
        .map(|(name, _)| name.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(outcome: Outcome) -> Run {
        Run {
            token: 7,
            start: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            end: UNIX_EPOCH + Duration::from_secs(1_800_000_060),
            outcome,
            exit_status: Some(0),
            signal: None,
        }
    }

    fn record(outcome: Outcome, attempts: u32) -> RunRecord {
        RunRecord {
            attempts,
            ..run(outcome).record("job", "k", None, Duration::from_secs(60))
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = run(Outcome::RanOk).record("job", "k", None, Duration::from_secs(3600));
        assert_eq!(RunRecord::parse(&r.to_json(), "job", "k"), Ok(r.clone()));
        assert_eq!(r.attempts, 1);
        assert_eq!(r.keep_until, r.end + 3600.0);
        assert_eq!(r.duration(), 60.0);
        let text = String::from_utf8(r.to_json()).unwrap();
        assert!(text.contains(r#""outcome":"ran-ok""#), "{text}");
    }

    #[test]
    fn attempts_count_on_from_the_prior_record() {
        let prior = record(Outcome::Failed, 2);
        let r = run(Outcome::TimedOut).record("job", "k", Some(&prior), Duration::ZERO);
        assert_eq!(r.attempts, 3);
    }

    #[test]
    fn foreign_damaged_and_misplaced_records_are_refused_not_taken_as_done() {
        let good = record(Outcome::RanOk, 1).to_json();
        let other_layout = String::from_utf8(good.clone())
            .unwrap()
            .replace(FORMAT, "leasewrap-run/9");
        let skipped = String::from_utf8(good.clone())
            .unwrap()
            .replace("ran-ok", "skipped-done");
        for (bytes, want) in [
            (&b"done"[..], "not a leasewrap run record"),
            (b"{\"done\":true}", "no \"format\""),
            (other_layout.as_bytes(), "leasewrap-run/9"),
            (br#"{"format":"leasewrap-run/1"}"#, "damaged"),
            (skipped.as_bytes(), "never stored"),
        ] {
            let err = RunRecord::parse(bytes, "job", "k").unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        let err = RunRecord::parse(&good, "job", "other").unwrap_err();
        assert!(err.contains("belongs to"), "{err}");
    }

    #[test]
    fn decision_runs_until_done_or_out_of_attempts() {
        assert_eq!(Decision::of(None, None), Decision::Run);
        assert_eq!(Decision::of(None, Some(1)), Decision::Run);
        let failed = record(Outcome::Failed, 2);
        assert_eq!(Decision::of(Some(&failed), None), Decision::Run);
        assert_eq!(Decision::of(Some(&failed), Some(3)), Decision::Run);
        assert_eq!(Decision::of(Some(&failed), Some(2)), Decision::GaveUp);
        let done = record(Outcome::RanOk, 2);
        assert_eq!(Decision::of(Some(&done), Some(2)), Decision::Done);
        assert_eq!(Decision::Done.skip_outcome(), Some(Outcome::SkippedDone));
        assert_eq!(Decision::Run.skip_outcome(), None);
    }

    #[test]
    fn a_record_with_a_time_no_date_can_show_is_damaged() {
        let good = record(Outcome::RanOk, 1);
        for (field, t) in [("end", 3e11), ("start", 1e20), ("keep_until", -1.0)] {
            let mut r = good.clone();
            match field {
                "end" => r.end = t,
                "start" => r.start = t,
                _ => r.keep_until = t,
            }
            let err = RunRecord::parse(&r.to_json(), "job", "k").unwrap_err();
            assert!(err.contains("damaged") && err.contains(field), "{err}");
        }
        assert_eq!(time_text(1_796_090_431.0), "2026-12-01T02:00:31Z");
        assert_eq!(time_text(LATEST), "9999-12-31T23:59:59Z");
        assert_eq!(time_text(3e11), "300000000000");
        assert_eq!(time_text(-1.5), "-1.5");
    }

    #[test]
    fn outcome_names_are_the_documented_ones() {
        let names: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            names,
            [
                "ran-ok",
                "failed",
                "lost",
                "timed-out",
                "skipped-busy",
                "skipped-done",
                "gave-up"
            ]
        );
        for o in Outcome::ALL {
            let json = serde_json::to_string(&o).unwrap();
            assert_eq!(json, format!("\"{}\"", o.as_str()));
        }
    }
    fn ending(key: &str, end: f64, keep_until: f64) -> RunRecord {
        RunRecord {
            key: key.into(),
            end,
            keep_until,
            ..record(Outcome::Failed, 1)
        }
    }

    #[test]
    fn only_a_record_whose_keep_time_passed_before_another_ended_is_expired() {
        let day = 86400.0;
        let records = [
            ("a.json".to_owned(), ending("a", 10.0 * day, 17.0 * day)),
            ("b.json".to_owned(), ending("b", 20.0 * day, 27.0 * day)),
            ("c.json".to_owned(), ending("c", 21.0 * day, 28.0 * day)),
        ];
        assert_eq!(confirmed_expired(&records, 22.0 * day), ["a.json"]);
        // The clock 30 days ahead: c's end is the newest witness, and a alone had expired by it.
        assert_eq!(confirmed_expired(&records, 52.0 * day), ["a.json"]);
        // A record from "the future" witnesses nothing.
        assert_eq!(
            confirmed_expired(&records[..2], 15.0 * day),
            Vec::<&str>::new()
        );
        assert_eq!(
            confirmed_expired(&records[..1], 99.0 * day),
            Vec::<&str>::new()
        );
    }
}
