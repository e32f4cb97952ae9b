//! The deadline rules of the lease (SPEC §4), as pure functions of instants and replies.
//!
//! Nothing here reads a clock, sleeps or does I/O: the caller passes the instant a request was sent
//! and the TTL its reply carried, and gets back the deadline `D` and what to do next. That is what
//! lets the unit tests below drive every rule with made-up instants.
//!
//! `D = t_send + TTL / (1 + drift) - margin`, where `t_send` is taken just before the request was
//! written and only a reply with TTL > 0 moves `D`, and never backwards.

use std::fmt;
use std::time::Duration;

use super::LossReason;
use crate::clock::BootInstant;

/// The timing options of one run, before a TTL is granted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// TTL asked for; the server may grant more.
    pub ttl: Duration,
    /// Time between the stop signal and SIGKILL; `None` means min(2 s, TTL/5).
    pub kill_after: Option<Duration>,
    /// Slack for kill latency and scheduling; `None` means min(1 s, TTL/10).
    pub margin: Option<Duration>,
    /// Bound on how much faster the server's clock may run than ours.
    pub drift: f64,
}

/// The timing in force for one granted TTL: every value the deadline rules use.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Effective {
    pub ttl: Duration,
    pub kill_after: Duration,
    pub margin: Duration,
    pub drift: f64,
}

/// The validation rule `TTL/3 + kill_after + margin < TTL/(1+drift)` did not hold.
#[derive(Clone, Debug, PartialEq)]
pub struct DoesNotFit(Effective);

impl fmt::Display for DoesNotFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.0;
        let left = e.renew_every() + e.kill_after + e.margin;
        write!(
            f,
            "timing does not fit: TTL/3 ({}) + kill-after ({}) + margin ({}) = {} must be less than \
             TTL/(1+drift) ({} with --ttl {} and --drift {}); raise --ttl or lower --kill-after, --margin or --drift",
            secs(e.renew_every()),
            secs(e.kill_after),
            secs(e.margin),
            secs(left),
            secs(e.server_bound()),
            secs(e.ttl),
            e.drift
        )
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// When the stop signal goes to the child: `kill_after` before `D`, so SIGKILL at `D` comes
/// after the child had its chance to stop in order.
pub fn stop_time(deadline: BootInstant, kill_after: Duration) -> BootInstant {
    deadline - kill_after
}

impl Params {
    /// The values in force once the server granted `ttl`, checked against the validation rule.
    pub fn effective(&self, ttl: Duration) -> Result<Effective, DoesNotFit> {
        let e = Effective {
            ttl,
            kill_after: self
                .kill_after
                .unwrap_or_else(|| (ttl / 5).min(Duration::from_secs(2))),
            margin: self
                .margin
                .unwrap_or_else(|| (ttl / 10).min(Duration::from_secs(1))),
            drift: self.drift,
        };
        if e.renew_every() + e.kill_after + e.margin < e.server_bound() {
            Ok(e)
        } else {
            Err(DoesNotFit(e))
        }
    }
}

impl Effective {
    /// Renewal period after a successful send.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// Retry period after a second failure in a row.
    pub fn retry_every(&self) -> Duration {
        self.ttl / 10
    }

    /// The lease's life as our clock may measure it, when the server's clock runs fast by `drift`.
    fn server_bound(&self) -> Duration {
        Duration::from_secs_f64(self.ttl.as_secs_f64() / (1.0 + self.drift))
    }

    /// `D` for a request sent at `t_send` whose reply granted this TTL.
    pub fn deadline(&self, t_send: BootInstant) -> BootInstant {
        t_send + self.server_bound() - self.margin
    }
}

/// What the renewer should do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Send a keepalive now (take `t_send` first, then call [`Schedule::sent`]).
    Send,
    /// Nothing to send before this instant.
    SleepUntil(BootInstant),
    /// A keepalive is in flight; if its reply has not come by this instant, call [`Schedule::failed`].
    AwaitReplyUntil(BootInstant),
    /// The stop time has come: the lease must be treated as lost.
    Lost,
}

/// What a reply did to the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The deadline is now this instant.
    Extended(BootInstant),
    /// The server says the lease is gone (TTL <= 0), the reply came after the stop time, or it
    /// granted a TTL the rules cannot work with.
    Lost(LossReason),
    /// No request was in flight: a late or duplicate reply, which never moves the deadline.
    Ignored,
}

/// The renewal state of one granted lease.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// The options, to recompute the effective values when a reply grants another TTL.
    params: Params,
    /// The values in force for the last granted TTL.
    timing: Effective,
    /// `D`: SIGKILL time; the stop signal goes out `kill_after` before.
    deadline: BootInstant,
    /// When the next keepalive is due, if none is in flight.
    next_send: BootInstant,
    /// `t_send` of the keepalive awaiting its reply.
    in_flight: Option<BootInstant>,
    /// Failures since the last good reply, for the retry schedule.
    failures: u32,
}

impl Schedule {
    /// The schedule after a grant sent at `t_send` was answered with `ttl_secs`.
    pub fn granted(params: Params, t_send: BootInstant, ttl_secs: i64) -> Result<Self, GrantError> {
        if ttl_secs <= 0 {
            return Err(GrantError::Expired);
        }
        let timing = params
            .effective(Duration::from_secs(ttl_secs as u64))
            .map_err(GrantError::DoesNotFit)?;
        Ok(Self {
            params,
            timing,
            deadline: timing.deadline(t_send),
            next_send: t_send + timing.renew_every(),
            in_flight: None,
            failures: 0,
        })
    }

    /// `D`, the instant by which the child must be dead.
    pub fn deadline(&self) -> BootInstant {
        self.deadline
    }

    /// When the stop signal goes to the child: `D - kill_after`.
    pub fn stop_at(&self) -> BootInstant {
        stop_time(self.deadline, self.timing.kill_after)
    }

    /// The values in force.
    pub fn timing(&self) -> &Effective {
        &self.timing
    }

    /// What to do at `now`.
    pub fn next(&self, now: BootInstant) -> Next {
        if now >= self.stop_at() {
            Next::Lost
        } else if let Some(t_send) = self.in_flight {
            Next::AwaitReplyUntil(self.reply_due(t_send))
        } else if now >= self.next_send {
            Next::Send
        } else {
            Next::SleepUntil(self.next_send.min(self.stop_at()))
        }
    }

    /// A reply later than this is a failure: by the stop time, and at most one renewal period, so
    /// that a hung stream is rebuilt while there is still time to renew over another connection.
    fn reply_due(&self, t_send: BootInstant) -> BootInstant {
        (t_send + self.timing.renew_every()).min(self.stop_at())
    }

    /// A keepalive was written; `t_send` was read just before.
    pub fn sent(&mut self, t_send: BootInstant) {
        self.in_flight = Some(t_send);
    }

    /// A reply arrived at `now` carrying `ttl_secs`.
    pub fn replied(&mut self, now: BootInstant, ttl_secs: i64) -> Verdict {
        let Some(t_send) = self.in_flight.take() else {
            return Verdict::Ignored;
        };
        if ttl_secs <= 0 {
            return Verdict::Lost(LossReason::Expired);
        }
        if now >= self.stop_at() {
            return Verdict::Lost(LossReason::NotRenewed);
        }
        if now >= self.reply_due(t_send) {
            self.failed(now);
            return Verdict::Ignored;
        }
        // A TTL the rules cannot work with (a server that shortened the lease) is not renewal.
        match self.params.effective(Duration::from_secs(ttl_secs as u64)) {
            Ok(timing) => self.timing = timing,
            Err(_) => return Verdict::Lost(LossReason::TtlDoesNotFit(ttl_secs)),
        }
        self.deadline = self.deadline.max(self.timing.deadline(t_send));
        self.next_send = t_send + self.timing.renew_every();
        self.failures = 0;
        Verdict::Extended(self.deadline)
    }

    /// The keepalive stream opened. The client sent its first keepalive and read the reply
    /// itself, telling only that the lease lives (no TTL, no header), so it moves nothing: the
    /// renewal is sent again at once on the open stream.
    pub fn opened(&mut self) {
        self.in_flight = None;
    }

    /// The request in flight failed or its reply is late (seen at `now`): retry at once, then
    /// every TTL/10. A reply to the abandoned request must not arrive on the rebuilt stream.
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

/// Why a grant did not give a usable lease.
#[derive(Clone, Debug, PartialEq)]
pub enum GrantError {
    /// The grant came back with TTL <= 0.
    Expired,
    /// The granted TTL breaks the validation rule.
    DoesNotFit(DoesNotFit),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_secs(1000) + Duration::from_millis(ms))
    }

    fn params(ttl_s: u64) -> Params {
        Params {
            ttl: Duration::from_secs(ttl_s),
            kill_after: None,
            margin: None,
            drift: 0.1,
        }
    }

    /// Equal within a microsecond (the float division of the formula rounds).
    #[track_caller]
    fn assert_near(a: BootInstant, b: BootInstant) {
        let gap = a.until(b).max(b.until(a));
        assert!(gap < Duration::from_micros(1), "{a:?} != {b:?}");
    }

    fn granted_at(ms: u64) -> Schedule {
        Schedule::granted(params(10), at(ms), 10).unwrap()
    }

    #[test]
    fn deadline_counts_from_the_send_not_the_reply() {
        let mut s = granted_at(0);
        // D = 0 + 10 s / 1.1 - 1 s = 8090.909 ms
        assert_near(s.deadline(), at(0) + Duration::from_nanos(8_090_909_090));
        s.sent(at(3_000));
        let Verdict::Extended(d) = s.replied(at(3_400), 10) else {
            panic!("a timely reply extends the lease")
        };
        assert_near(d, at(3_000) + Duration::from_nanos(8_090_909_090));
    }

    #[test]
    fn defaults_scale_with_small_ttls_and_cap_at_large_ones() {
        let small = params(2).effective(Duration::from_secs(2)).unwrap();
        assert_eq!(small.kill_after, Duration::from_millis(400));
        assert_eq!(small.margin, Duration::from_millis(200));
        let large = params(60).effective(Duration::from_secs(60)).unwrap();
        assert_eq!(large.kill_after, Duration::from_secs(2));
        assert_eq!(large.margin, Duration::from_secs(1));
    }

    #[test]
    fn granted_ttl_larger_than_asked_is_the_one_used() {
        let s = Schedule::granted(params(1), at(0), 2).unwrap();
        assert_eq!(s.timing().ttl, Duration::from_secs(2));
        assert_eq!(
            s.next(at(0)),
            Next::SleepUntil(at(0) + Duration::from_secs(2) / 3)
        );
    }

    #[test]
    fn a_reply_with_ttl_zero_or_less_means_stop_now() {
        let mut s = granted_at(0);
        s.sent(at(3_333));
        assert_eq!(s.replied(at(3_400), 0), Verdict::Lost(LossReason::Expired));
        let mut s = granted_at(0);
        s.sent(at(3_333));
        assert_eq!(s.replied(at(3_400), -1), Verdict::Lost(LossReason::Expired));
        assert_eq!(
            Schedule::granted(params(10), at(0), 0).unwrap_err(),
            GrantError::Expired
        );
    }

    #[test]
    fn a_reply_with_nothing_in_flight_never_extends_the_deadline() {
        let mut s = granted_at(0);
        let before = s.deadline();
        assert_eq!(s.replied(at(100), 10), Verdict::Ignored);
        s.sent(at(3_333));
        s.failed(at(3_400));
        assert_eq!(s.replied(at(3_500), 10), Verdict::Ignored);
        assert_eq!(s.deadline(), before);
    }

    #[test]
    fn a_late_reply_is_a_failure_and_does_not_extend_the_deadline() {
        let mut s = granted_at(0);
        let before = s.deadline();
        s.sent(at(1_000));
        // due by t_send + TTL/3, which comes before the stop time here
        let due = at(1_000) + Duration::from_secs(10) / 3;
        assert_eq!(s.next(at(2_000)), Next::AwaitReplyUntil(due));
        assert_eq!(s.replied(due, 10), Verdict::Ignored);
        assert_eq!(s.deadline(), before);
        assert_eq!(s.next(due), Next::Send, "retry at once after a failure");
    }

    #[test]
    fn a_reply_is_due_by_the_stop_time_at_the_latest() {
        let mut s = granted_at(0);
        s.sent(at(3_333));
        assert_eq!(s.next(at(4_000)), Next::AwaitReplyUntil(s.stop_at()));
    }

    #[test]
    fn a_shorter_ttl_for_a_later_send_never_moves_the_deadline_backwards() {
        let mut s = granted_at(5_000);
        let before = s.deadline();
        // a reply granting a shorter TTL for a later send must not shorten D either
        s.sent(at(5_100));
        let Verdict::Extended(d) = s.replied(at(5_200), 2) else {
            panic!("extended")
        };
        assert_eq!(d, before);
    }

    #[test]
    fn stop_signal_goes_kill_after_before_the_deadline() {
        let s = granted_at(0);
        assert_eq!(s.stop_at(), s.deadline() - Duration::from_secs(2));
        assert_eq!(s.next(s.stop_at()), Next::Lost);
        assert_ne!(s.next(s.stop_at() - Duration::from_nanos(1)), Next::Lost);
    }

    #[test]
    fn a_reply_after_the_stop_time_is_lost_not_renewed() {
        let mut s = granted_at(0);
        s.sent(at(5_000));
        assert_eq!(
            s.replied(s.stop_at(), 10),
            Verdict::Lost(LossReason::NotRenewed)
        );
    }

    #[test]
    fn retries_at_once_after_a_failure_then_every_tenth_of_the_ttl() {
        let mut s = granted_at(0);
        assert_eq!(s.next(at(3_334)), Next::Send);
        s.sent(at(3_334));
        s.failed(at(3_350));
        assert_eq!(s.next(at(3_350)), Next::Send);
        s.sent(at(3_350));
        s.failed(at(3_360));
        assert_eq!(s.next(at(3_360)), Next::SleepUntil(at(4_360)));
        s.sent(at(4_360));
        assert!(matches!(s.replied(at(4_370), 10), Verdict::Extended(_)));
        assert_eq!(
            s.next(at(4_370)),
            Next::SleepUntil(at(4_360) + Duration::from_nanos(3_333_333_333))
        );
    }

    #[test]
    fn validation_rule_holds_at_its_edge_and_fails_past_it() {
        // TTL 9 s, drift 0: TTL/3 + ka + margin < 9 s. With margin 1 s: ka < 5 s.
        let p = |ka_ms| Params {
            ttl: Duration::from_secs(9),
            kill_after: Some(Duration::from_millis(ka_ms)),
            margin: Some(Duration::from_secs(1)),
            drift: 0.0,
        };
        let ttl = Duration::from_secs(9);
        assert!(p(4_999).effective(ttl).is_ok());
        let err = p(5_000).effective(ttl).unwrap_err();
        assert!(err.to_string().contains("3.000s"), "{err}");
        assert!(err.to_string().contains("= 9.000s"), "{err}");
    }

    #[test]
    fn default_timing_fits_every_ttl_from_one_second() {
        for ttl in [1, 2, 3, 5, 10, 30, 600] {
            assert!(
                params(ttl).effective(Duration::from_secs(ttl)).is_ok(),
                "{ttl}"
            );
        }
    }
}
