//! What one invocation does about --once and --metrics-file: before the child starts, read KEY's
//! record and decide; after it ends, record the run under the fencing token; at the very end,
//! write the metrics file. The run loop calls these three steps and knows nothing else of runs.

use std::time::SystemTime;

use super::metrics::{self, Sample};
use super::record::{time_text, unix_seconds, Decision, Outcome, Run, RunRecord};
use super::Written;
use crate::config::Config;
use crate::error::Error;
use crate::lease::Held;
use crate::supervise::Exit;
use crate::text::printable;

/// The account of one invocation.
pub struct Book<'a> {
    cfg: &'a Config,
    /// When leasewrap started.
    start: SystemTime,
    /// The token held, once the lease was taken.
    token: Option<u64>,
    /// When the child was started, if it was.
    child_start: Option<SystemTime>,
    /// KEY's record as read before the child started.
    prior: Option<RunRecord>,
    /// KEY's record as it stands at the end: the one written, or the prior one.
    now: Option<RunRecord>,
}

impl<'a> Book<'a> {
    /// Open the account as leasewrap starts.
    pub fn open(cfg: &'a Config) -> Self {
        Book {
            cfg,
            start: SystemTime::now(),
            token: None,
            child_start: None,
            prior: None,
            now: None,
        }
    }

    /// The lease is ours: with --once, read KEY's record; an error ends the invocation before
    /// anything starts (KEY done or given up, a record that is not ours, etcd failing).
    pub async fn before_start(&mut self, held: &Held) -> Result<(), Error> {
        self.token = Some(held.token);
        let Some(once) = &self.cfg.once else {
            return Ok(());
        };
        self.prior = held.read_record(&self.cfg.name, &once.key).await?;
        self.now.clone_from(&self.prior);
        let Some(prior) = &self.prior else {
            return Ok(());
        };
        let (name, key) = (self.cfg.name.clone(), once.key.clone());
        match Decision::of(Some(prior), once.max_attempts) {
            Decision::Run => Ok(()),
            Decision::Done => Err(Error::Done {
                name,
                key,
                by: ran_by(prior),
            }),
            Decision::GaveUp => Err(Error::GaveUp {
                name,
                key,
                attempts: prior.attempts,
            }),
        }
    }

    /// With --once, the KEY whose record the backend may read along with taking the lease,
    /// so that [`Book::before_start`] needs no read of its own.
    pub fn once_key(&self) -> Option<&str> {
        self.cfg.once.as_ref().map(|o| o.key.as_str())
    }

    /// The child is being started now. With --once, the backend prepares the record's write
    /// while it runs (on etcd, the record's lease is asked for).
    pub fn child_started(&mut self, held: &mut Held) {
        self.child_start = Some(SystemTime::now());
        if let Some(once) = &self.cfg.once {
            held.child_started(once.keep);
        }
    }

    /// The child's tree is gone and the lease still ours: with --once, record how the run went.
    /// A success that cannot be recorded is not one: the lease was lost, or the write failed.
    pub async fn after_run(
        &mut self,
        held: &mut Held,
        ended: Result<Exit, Error>,
    ) -> Result<Exit, Error> {
        let (Some(once), Some(start)) = (&self.cfg.once, self.child_start) else {
            return ended;
        };
        // A lost lease's token can write nothing; trying would only delay the exit.
        if matches!(ended, Err(Error::Lost { .. })) {
            held.record_unused();
            return ended;
        }
        let run = run_of(held.token, start, &ended);
        let record = run.record(&self.cfg.name, &once.key, self.prior.as_ref(), once.keep);
        let success = run.outcome == Outcome::RanOk;
        match held.write_record(&record, once.keep).await {
            Ok(Written::Stored) => {
                self.now = Some(record);
                ended
            }
            Ok(Written::Refused(why)) if success => {
                let why = format!("the success of KEY {:?} was not recorded: {why}", once.key);
                tracing::error!(name = %self.cfg.name, token = held.token, reason = %why, "lease lost");
                Err(Error::Lost {
                    name: self.cfg.name.clone(),
                    why,
                })
            }
            Ok(Written::Refused(why)) => {
                tracing::warn!(name = %self.cfg.name, key = %once.key, reason = %why, "the failed run's record was refused");
                ended
            }
            Err(e) if success => {
                tracing::error!(name = %self.cfg.name, key = %once.key, error = %e, "the success could not be recorded: the next holder runs KEY again");
                Err(e)
            }
            Err(e) => {
                tracing::warn!(name = %self.cfg.name, key = %once.key, error = %e, "the failed run could not be recorded");
                ended
            }
        }
    }

    /// The invocation is over: write the metrics file, if asked for, for a run or a skip.
    pub fn close(&self, ended: &Result<Exit, Error>) {
        let Some(path) = &self.cfg.metrics_file else {
            return;
        };
        let Some(outcome) = self.outcome(ended) else {
            return;
        };
        let end = SystemTime::now();
        let duration = self.child_start.map_or(0.0, |s| {
            end.duration_since(s).unwrap_or_default().as_secs_f64()
        });
        let sample = Sample {
            name: &self.cfg.name,
            outcome,
            start: unix_seconds(self.start),
            end: unix_seconds(end),
            duration,
            exit_status: self.child_start.and(status_of(ended)),
            token: self.token,
            once: self
                .cfg
                .once
                .as_ref()
                .map(|o| (o.key.as_str(), self.now.as_ref())),
        };
        // An error, shown even under -q, but the child's status stands: the run happened.
        if let Err(e) = metrics::write(path, &sample) {
            tracing::error!(path = %path.display(), error = %e, "writing the metrics file failed: it does not describe this invocation");
        }
    }

    /// The outcome to report; none for an invocation that neither ran nor skipped (bad input,
    /// etcd unreachable, a signal while waiting).
    fn outcome(&self, ended: &Result<Exit, Error>) -> Option<Outcome> {
        let skipped = match ended {
            Err(Error::Busy { .. } | Error::WaitTimedOut { .. }) => Some(Outcome::SkippedBusy),
            Err(Error::Done { .. }) => Some(Outcome::SkippedDone),
            Err(Error::GaveUp { .. }) => Some(Outcome::GaveUp),
            _ => None,
        };
        match self.child_start {
            Some(_) => Some(outcome_of(ended)),
            None => skipped,
        }
    }
}

/// How a run ended, for its record.
fn run_of(token: u64, start: SystemTime, ended: &Result<Exit, Error>) -> Run {
    Run {
        token,
        start,
        end: SystemTime::now(),
        outcome: outcome_of(ended),
        exit_status: match ended {
            Ok(Exit::Code(c)) => Some((*c).into()),
            _ => None,
        },
        signal: match ended {
            Ok(Exit::Signal(s)) => Some(s.as_str().to_owned()),
            _ => None,
        },
    }
}

/// The outcome of an invocation whose child was started.
fn outcome_of(ended: &Result<Exit, Error>) -> Outcome {
    match ended {
        Ok(Exit::Code(0)) => Outcome::RanOk,
        Err(Error::Lost { .. }) => Outcome::Lost,
        Err(Error::TimedOut { .. }) => Outcome::TimedOut,
        _ => Outcome::Failed,
    }
}

/// The child's status as a shell shows it (128+n for signal n); none when it is not known.
fn status_of(ended: &Result<Exit, Error>) -> Option<i32> {
    match ended {
        Ok(exit) => Some(exit.status().into()),
        Err(_) => None,
    }
}

/// Who ran KEY and when, for the log line of a skip: the host as another host wrote it, so
/// [`printable`].
fn ran_by(r: &RunRecord) -> String {
    format!(
        "host {}, pid {}, token {}, ended {}",
        printable(&r.host),
        r.pid,
        r.token,
        time_text(r.end)
    )
}
