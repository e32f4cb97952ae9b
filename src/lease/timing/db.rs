//! The database lease's rule (docs/database.md), as pure functions of instants and answers,
//! like the rest of `timing`: nothing here reads a clock, sleeps or does I/O.
//!
//! The server keeps no clock at all. A NAME's row holds a version, bumped by every change, the
//! token (how many times the row was taken) and `L`, the TTL its holder asked for. Every change is
//! one compare-and-set, so the row's history is a single sequence of versions.
//!
//! - The holder counts `D = t_send + L / (1 + drift) - margin` from the send of the last renewal
//!   whose success it saw ([`DbSchedule`]), exactly as on etcd.
//! - A waiter takes over only when the version is unchanged since a read whose answer *arrived*
//!   at least `L` ago on its own clock ([`Watch`]); the takeover is a compare-and-set on that
//!   version.
//!
//! Why that is enough: a takeover at `T` on version `v` succeeds only if no renewal committed
//! after the read that saw `v`; so the holder's last successful renewal was sent before it
//! committed, before that read was answered, at least `L` (waiter's clock), so at least
//! `L / (1 + drift)` (holder's clock) before `T`: the holder's `D` is `margin` before `T`.

use std::time::Duration;

use super::{stop_time, DoesNotFit, Effective, KeySeen, Next, Params, Twin, Twins, Verdict};
use crate::clock::BootInstant;
use crate::lease::LossReason;

/// What the server said to a renewal (a compare-and-set on the holder's token).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Renewal {
    /// The row still had our token: its version moved on.
    Renewed,
    /// The row has another token (taken over) or is free (released by us or no one): lost.
    Refused(KeySeen),
}

/// The holder's renewal state, from the take on.
#[derive(Clone, Debug)]
pub struct DbSchedule {
    /// The values in force: `L` is the TTL asked for, which the row records for the waiters.
    timing: Effective,
    /// `D`: SIGKILL time; the stop signal goes out `kill_after` before.
    deadline: BootInstant,
    /// When the next renewal is due, if none is in flight.
    next_send: BootInstant,
    /// The send instant of the renewal in flight.
    in_flight: Option<BootInstant>,
    /// Failures since the last good answer, for the retry schedule.
    failures: u32,
    /// The broken twin the model checker runs instead of the rule.
    twins: Twins,
}

/// The state a model checker tells apart (tests/model): every field but the timing, the same in
/// all of its states and holding a float.
impl std::hash::Hash for DbSchedule {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.deadline, self.next_send, self.in_flight, self.failures).hash(h);
    }
}

/// Validation: `L/3 + kill_after + margin < L/(1+drift)`, as on etcd.
pub fn timing(params: &Params) -> Result<Effective, DoesNotFit> {
    params.effective(params.ttl)
}

impl DbSchedule {
    /// The schedule after the take (a compare-and-set) sent at `t_send` succeeded.
    pub fn taken(params: &Params, t_send: BootInstant) -> Result<Self, DoesNotFit> {
        let timing = timing(params)?;
        Ok(Self {
            timing,
            deadline: timing.deadline(t_send),
            next_send: t_send + timing.renew_every(),
            in_flight: None,
            failures: 0,
            twins: Twins::default(),
        })
    }

    /// The same schedule, following a broken twin of the rule (tests/model).
    #[cfg(feature = "model-twins")]
    pub fn twin(mut self, twin: Twin) -> Self {
        self.twins = Twins::of(twin);
        self
    }

    /// When the stop signal goes to the child: `D - kill_after`.
    pub fn stop_at(&self) -> BootInstant {
        stop_time(self.deadline, self.timing.kill_after)
    }

    /// `D`, the instant by which the child must be dead.
    pub fn deadline(&self) -> BootInstant {
        self.deadline
    }

    /// What to do at `now`.
    pub fn next(&self, now: BootInstant) -> Next {
        if now >= self.stop_at() {
            return Next::Lost;
        }
        match self.in_flight {
            Some(t_send) => Next::AwaitReplyUntil(self.reply_due(t_send)),
            None if now >= self.next_send => Next::Send,
            None => Next::SleepUntil(self.next_send.min(self.stop_at())),
        }
    }

    /// An answer later than this is a failure: one renewal period after the send, or the stop
    /// time if that comes first.
    fn reply_due(&self, t_send: BootInstant) -> BootInstant {
        (t_send + self.timing.renew_every()).min(self.stop_at())
    }

    /// A renewal was written; `t_send` was read just before.
    pub fn sent(&mut self, t_send: BootInstant) {
        self.in_flight = Some(t_send);
    }

    /// The renewal in flight was answered at `now`.
    pub fn answered(&mut self, now: BootInstant, renewal: Renewal) -> Verdict {
        let Some(t_send) = self.in_flight else {
            return Verdict::Ignored;
        };
        if let Renewal::Refused(seen) = renewal {
            return Verdict::KeyLost(seen);
        }
        if now >= self.stop_at() {
            return Verdict::Lost(LossReason::NotRenewed);
        }
        if now >= self.reply_due(t_send) {
            self.failed(now);
            return Verdict::Failed;
        }
        let from = if self.twins.are(Twin::DbDFromAnswer) {
            now
        } else {
            t_send
        };
        self.deadline = self.deadline.max(self.timing.deadline(from));
        self.next_send = t_send + self.timing.renew_every();
        self.in_flight = None;
        self.failures = 0;
        Verdict::Extended(self.deadline)
    }

    /// The renewal in flight failed or is late (seen at `now`): retry at once, then every L/10.
    /// Its answer, should it still come, is never read: the connection is rebuilt.
    pub fn failed(&mut self, now: BootInstant) {
        self.in_flight = None;
        self.failures += 1;
        self.next_send = if self.failures == 1 {
            now
        } else {
            now + self.timing.retry_every()
        };
    }
}

/// What a waiter's read found in the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowSeen {
    /// The row's version: every change moves it.
    pub version: u64,
    /// Someone holds it; a free row is taken at once.
    pub held: bool,
    /// The holder's `L`, as its take recorded it.
    pub ttl: Duration,
}

/// What the waiter should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchNext {
    /// Take the row now, with a compare-and-set on this version.
    Take(u64),
    /// Take it over at this instant unless a read shows the version moved.
    TakeOverAt(BootInstant),
    /// Nothing read yet: read the row.
    Read,
}

/// A waiter's view of the row: the version it watches, and since when.
#[derive(Clone, Copy, Debug, Default, Hash)]
pub struct Watch {
    /// The last row read, and the arrival of the first answer that showed its version.
    seen: Option<(RowSeen, BootInstant)>,
    /// The broken twin the model checker runs instead of the rule.
    twins: Twins,
}

impl Watch {
    /// A waiter that has read nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same watch, following a broken twin of the rule (tests/model).
    #[cfg(feature = "model-twins")]
    pub fn twin(mut self, twin: Twin) -> Self {
        self.twins = Twins::of(twin);
        self
    }

    /// A read sent at `sent` was answered at `arrived` with `row`. Only a version not seen
    /// before starts the count of `L`, from the arrival of the answer that showed it.
    pub fn read(&mut self, sent: BootInstant, arrived: BootInstant, row: RowSeen) {
        let since = match self.seen {
            Some((old, since)) if old.version == row.version => since,
            _ if self.twins.are(Twin::DbWatchFromSend) => sent,
            _ => arrived,
        };
        self.seen = Some((row, since));
    }

    /// A take on the version watched failed: the row moved, read it again.
    pub fn forget(&mut self) {
        self.seen = None;
    }

    /// What to do next.
    pub fn next(&self) -> WatchNext {
        match self.seen {
            None => WatchNext::Read,
            Some((row, _)) if !row.held => WatchNext::Take(row.version),
            Some((row, since)) => WatchNext::TakeOverAt(since + row.ttl),
        }
    }

    /// The compare-and-set to send at `now`, if the rule allows one.
    pub fn may_take(&self, now: BootInstant) -> Option<u64> {
        match (self.next(), self.seen) {
            (WatchNext::Take(v), _) => Some(v),
            (WatchNext::TakeOverAt(at), Some((row, _))) if now >= at => Some(row.version),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_near, at, params};
    use super::*;

    /// D of a renewal sent at `ms` with L 10 s: t_send + 10 s / 1.1 - 1 s.
    fn d(ms: u64) -> BootInstant {
        at(ms) + Duration::from_nanos(8_090_909_090)
    }

    fn held(version: u64) -> RowSeen {
        RowSeen {
            version,
            held: true,
            ttl: Duration::from_secs(10),
        }
    }

    #[test]
    fn the_holders_deadline_counts_from_the_renewals_send_not_its_answer() {
        let mut s = DbSchedule::taken(&params(10), at(0)).unwrap();
        assert_near(s.deadline(), d(0));
        let third = Duration::from_secs(10) / 3;
        assert_eq!(s.next(at(3_000)), Next::SleepUntil(at(0) + third));
        assert_eq!(s.next(at(3_334)), Next::Send);
        s.sent(at(3_334));
        let Verdict::Extended(dl) = s.answered(at(5_000), Renewal::Renewed) else {
            panic!("a timely answer extends the lease")
        };
        assert_near(dl, d(3_334));
    }

    #[test]
    fn an_answer_after_a_renewal_period_is_a_failure_retried_at_once_then_every_tenth() {
        let mut s = DbSchedule::taken(&params(10), at(0)).unwrap();
        // Due L/3 after the send (before the stop time, 6.09 s).
        s.sent(at(1_000));
        assert_eq!(s.answered(at(4_400), Renewal::Renewed), Verdict::Failed);
        assert_near(s.deadline(), d(0));
        assert_eq!(s.next(at(4_400)), Next::Send);
        s.sent(at(4_400));
        s.failed(at(4_500));
        assert_eq!(s.next(at(4_500)), Next::SleepUntil(at(5_500)));
        // After the stop time, an answer is too late to renew anything.
        s.sent(at(5_500));
        let late = s.answered(at(6_100), Renewal::Renewed);
        assert_eq!(late, Verdict::Lost(LossReason::NotRenewed));
    }

    #[test]
    fn a_refused_renewal_loses_the_lease_and_the_stop_time_loses_it_without_answers() {
        let mut s = DbSchedule::taken(&params(10), at(0)).unwrap();
        s.sent(at(3_334));
        let refused = Renewal::Refused(KeySeen::Replaced);
        assert_eq!(
            s.answered(at(3_400), refused),
            Verdict::KeyLost(KeySeen::Replaced)
        );
        let s = DbSchedule::taken(&params(10), at(0)).unwrap();
        // D - kill_after: 8.09 s - 2 s.
        assert_eq!(s.next(at(6_091)), Next::Lost);
    }

    #[test]
    fn an_answer_with_nothing_in_flight_moves_nothing() {
        let mut s = DbSchedule::taken(&params(10), at(0)).unwrap();
        assert_eq!(s.answered(at(100), Renewal::Renewed), Verdict::Ignored);
        assert_near(s.deadline(), d(0));
    }

    #[test]
    fn a_waiter_takes_over_l_after_the_answer_that_first_showed_the_version() {
        let mut w = Watch::new();
        assert_eq!(w.next(), WatchNext::Read);
        w.read(at(0), at(2_000), held(7));
        w.read(at(5_000), at(5_010), held(7));
        assert_eq!(w.next(), WatchNext::TakeOverAt(at(12_000)));
        assert_eq!(w.may_take(at(11_999)), None);
        assert_eq!(w.may_take(at(12_000)), Some(7));
    }

    #[test]
    fn a_moved_version_starts_the_count_again_and_a_free_row_is_taken_at_once() {
        let mut w = Watch::new();
        w.read(at(0), at(10), held(7));
        w.read(at(9_000), at(9_010), held(8));
        assert_eq!(w.may_take(at(10_010)), None);
        assert_eq!(w.next(), WatchNext::TakeOverAt(at(19_010)));
        let free = RowSeen {
            held: false,
            ..held(9)
        };
        w.read(at(9_100), at(9_110), free);
        assert_eq!(w.may_take(at(9_110)), Some(9));
        w.forget();
        assert_eq!(w.next(), WatchNext::Read);
    }

    #[test]
    fn the_waiter_counts_the_holders_l_as_the_row_records_it() {
        let mut w = Watch::new();
        let long = RowSeen {
            ttl: Duration::from_secs(60),
            ..held(3)
        };
        w.read(at(0), at(10), long);
        assert_eq!(w.next(), WatchNext::TakeOverAt(at(60_010)));
    }

    /// The safety argument on made-up instants: the last renewal the takeover could miss was
    /// committed before the read's answer, so its `D` is before the takeover, even when the
    /// waiter's clock runs the full drift fast.
    #[test]
    fn the_holders_deadline_falls_before_a_takeover_even_with_the_drift() {
        let mut s = DbSchedule::taken(&params(10), at(0)).unwrap();
        s.sent(at(3_334));
        s.answered(at(3_400), Renewal::Renewed);
        let mut w = Watch::new();
        // The renewal committed just before the read was answered at 3 334 ms.
        w.read(at(3_000), at(3_334), held(2));
        let WatchNext::TakeOverAt(t) = w.next() else {
            panic!("the row is held")
        };
        // L on a clock running 10 % fast is 10 s / 1.1 on the holder's.
        let takeover = at(3_334) + (t.until(at(3_334)).max(at(3_334).until(t))).div_f64(1.1);
        // The margin is min(1 s, L/10).
        assert!(s.deadline() + Duration::from_secs(1) <= takeover + Duration::from_micros(1));
    }
}
