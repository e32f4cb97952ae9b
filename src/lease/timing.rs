//! The deadline rules of the lease (SPEC §4), as pure functions of instants and replies.
//!
//! Nothing here reads a clock, sleeps or does I/O: the caller passes the instant a request was sent
//! and the TTL its reply carried, and gets back the deadline `D` and what to do next. That is what
//! lets the unit tests below drive every rule with made-up instants.
//!
//! `D = t_send + TTL / (1 + drift) - margin`, where `t_send` is taken just before the request was
//! written and only a reply with TTL > 0 moves `D`, and never backwards. A keepalive reply counts
//! only once the quorum vouches for it: a linearizable read of the own key, sent through the same
//! member after the reply, must come back in the same raft term and show the key still ours
//! (docs/quorum.md says why that is enough, and why one member's lessor is not).

use std::fmt;
use std::time::Duration;

use super::LossReason;
use crate::clock::BootInstant;

pub mod db;
pub mod zk;

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
        let e = self.effective_unchecked(ttl);
        if e.renew_every() + e.kill_after + e.margin < e.server_bound() {
            Ok(e)
        } else {
            Err(DoesNotFit(e))
        }
    }

    /// The values in force for `ttl`, before any backend's rule has checked them.
    fn effective_unchecked(&self, ttl: Duration) -> Effective {
        Effective {
            ttl,
            kill_after: self
                .kill_after
                .unwrap_or_else(|| (ttl / 5).min(Duration::from_secs(2))),
            margin: self
                .margin
                .unwrap_or_else(|| (ttl / 10).min(Duration::from_secs(1))),
            drift: self.drift,
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
    /// Its reply came: send the confirming read through the same member now (call
    /// [`Schedule::reading`]); if its answer has not come by this instant, call [`Schedule::failed`].
    ConfirmBy(BootInstant),
    /// The confirming read is in flight, due by this instant.
    AwaitReadUntil(BootInstant),
    /// The stop time has come: the lease must be treated as lost.
    Lost,
}

/// A keepalive reply: the TTL, and the raft term in its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kept {
    pub ttl: i64,
    pub term: u64,
}

/// The answer to the confirming read: the raft term in its header, and the own key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    pub term: u64,
    pub key: KeySeen,
}

/// What the confirming read found at the own key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeySeen {
    /// There, with the create revision it was given.
    Ours,
    /// Not there: deleted, or its lease ended.
    Gone,
    /// There with another create revision: another holder's.
    Replaced,
}

/// What a reply did to the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The deadline is now this instant.
    Extended(BootInstant),
    /// The keepalive was answered; `D` moves once the read confirms it ([`Next::ConfirmBy`]).
    ToConfirm,
    /// The server says the lease is gone (TTL <= 0), the reply came after the stop time, or it
    /// granted a TTL the rules cannot work with.
    Lost(LossReason),
    /// The confirming read found the own key gone or replaced: lost.
    KeyLost(KeySeen),
    /// Counted as a failure: the reply came late, or the read's term differs from the
    /// keepalive's. Retry, through another member where there is one.
    Failed,
    /// No request was in flight: a late or duplicate reply, which never moves the deadline.
    Ignored,
}

/// Where the renewal in progress is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// Nothing in flight; the next keepalive is due at `next_send`.
    Idle,
    /// A keepalive sent at `t_send` awaits its reply.
    Sent { t_send: BootInstant },
    /// Its reply came; the confirming read is to be sent.
    Replied { t_send: BootInstant, kept: Kept },
    /// The confirming read is in flight.
    Reading { t_send: BootInstant, kept: Kept },
}

/// A broken twin of a deadline rule (docs/development.md, "Broken twins"): the model checker
/// (tests/model) runs the rules with each, to show it finds each one broken. Only a build with
/// the `model-twins` feature, which only the tests turn on, can pick one.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Twin {
    /// etcd: `D` counted from the confirming read's arrival instead of the keepalive's send.
    DFromArrival,
    /// etcd: the read's raft term not compared with the keepalive's.
    NoTermCheck,
    /// ZooKeeper: the Sync sent as soon as the Look is answered, without waiting Δ.
    NoRelayWait,
    /// ZooKeeper: `D` counted from the Check's send instead of the Look's.
    DFromCheck,
    /// ZooKeeper: a reconnect that negotiates a shorter timeout leaves `D` where it was.
    MoveKeepsD,
    /// Database: the holder counts `D` from its renewal's answer instead of its send.
    DbDFromAnswer,
    /// Database: the waiter counts `L` from its read's send instead of its answer's arrival.
    DbWatchFromSend,
}

/// The broken twin a schedule follows: none, but in the model checker's builds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Twins {
    #[cfg(feature = "model-twins")]
    twin: Option<Twin>,
}

impl Twins {
    #[cfg(feature = "model-twins")]
    fn of(twin: Twin) -> Self {
        Self { twin: Some(twin) }
    }

    /// The schedule follows `twin` (never, in a build without the feature).
    fn are(&self, _twin: Twin) -> bool {
        #[cfg(feature = "model-twins")]
        return self.twin == Some(_twin);
        #[cfg(not(feature = "model-twins"))]
        false
    }
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
    /// The renewal in progress.
    phase: Phase,
    /// Failures since the last good reply, for the retry schedule.
    failures: u32,
    /// There are other members to renew through: an attempt may use only half the time left,
    /// so that the next one, through another member, still has the other half.
    others: bool,
    /// The broken twin the model checker runs instead of the rule.
    twins: Twins,
}

/// The state a model checker tells apart (tests/model): every field but the options, which are
/// the same in all of its states and hold a float.
impl std::hash::Hash for Schedule {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.timing.ttl, self.deadline, self.next_send).hash(h);
        (self.phase, self.failures, self.others).hash(h);
    }
}

impl Schedule {
    /// The schedule after a grant sent at `t_send` was answered with `ttl_secs`. A grant goes
    /// through raft, so the quorum has vouched for it already.
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
            phase: Phase::Idle,
            failures: 0,
            others: false,
            twins: Twins::default(),
        })
    }

    /// The same schedule, following a broken twin of the rule (tests/model).
    #[cfg(feature = "model-twins")]
    pub fn twin(mut self, twin: Twin) -> Self {
        self.twins = Twins::of(twin);
        self
    }

    /// The same schedule, renewing through one of several members.
    pub fn through_several_members(self) -> Self {
        Self {
            others: true,
            ..self
        }
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
            return Next::Lost;
        }
        match self.phase {
            Phase::Idle if now >= self.next_send => Next::Send,
            Phase::Idle => Next::SleepUntil(self.next_send.min(self.stop_at())),
            Phase::Sent { t_send } => Next::AwaitReplyUntil(self.reply_due(t_send)),
            Phase::Replied { t_send, .. } => Next::ConfirmBy(self.reply_due(t_send)),
            Phase::Reading { t_send, .. } => Next::AwaitReadUntil(self.reply_due(t_send)),
        }
    }

    /// A renewal (keepalive and confirming read) answered later than this is a failure: by the
    /// stop time, at most one renewal period after the send, and with other members to try, by
    /// half the time left, so that a hung member is left while there is time to renew through
    /// another.
    fn reply_due(&self, t_send: BootInstant) -> BootInstant {
        let stop = self.stop_at();
        let left = t_send.until(stop);
        let share = if self.others { left / 2 } else { left };
        (t_send + self.timing.renew_every().min(share)).min(stop)
    }

    /// A keepalive was written; `t_send` was read just before.
    pub fn sent(&mut self, t_send: BootInstant) {
        self.phase = Phase::Sent { t_send };
    }

    /// The keepalive stream opened. The client sent its first keepalive and read the reply
    /// itself, telling only that the lease lives (no TTL, no header), so it moves nothing: the
    /// renewal is sent again at once on the open stream.
    pub fn opened(&mut self) {
        self.phase = Phase::Idle;
    }

    /// A keepalive reply arrived at `now`. It moves nothing yet: a member whose raft loop is
    /// stuck still answers from its stale lessor, so the read must confirm it.
    pub fn replied(&mut self, now: BootInstant, kept: Kept) -> Verdict {
        let Phase::Sent { t_send } = self.phase else {
            return Verdict::Ignored;
        };
        if kept.ttl <= 0 {
            return Verdict::Lost(LossReason::Expired);
        }
        if let Some(v) = self.too_late(now, t_send) {
            return v;
        }
        // A TTL the rules cannot work with (a server that shortened the lease) is not renewal.
        if self.params.effective(ttl_of(kept)).is_err() {
            return Verdict::Lost(LossReason::TtlDoesNotFit(kept.ttl));
        }
        self.phase = Phase::Replied { t_send, kept };
        Verdict::ToConfirm
    }

    /// The confirming read is being sent.
    pub fn reading(&mut self) {
        if let Phase::Replied { t_send, kept } = self.phase {
            self.phase = Phase::Reading { t_send, kept };
        }
    }

    /// The confirming read answered at `now`. The keepalive counts, from its own `t_send`, when
    /// the read came back in the keepalive's raft term and shows the own key (docs/quorum.md).
    pub fn confirmed(&mut self, now: BootInstant, read: Read) -> Verdict {
        let Phase::Reading { t_send, kept } = self.phase else {
            return Verdict::Ignored;
        };
        if read.key != KeySeen::Ours {
            return Verdict::KeyLost(read.key);
        }
        if let Some(v) = self.too_late(now, t_send) {
            return v;
        }
        if read.term != kept.term && !self.twins.are(Twin::NoTermCheck) {
            self.failed(now);
            return Verdict::Failed;
        }
        match self.params.effective(ttl_of(kept)) {
            Ok(timing) => self.timing = timing,
            Err(_) => return Verdict::Lost(LossReason::TtlDoesNotFit(kept.ttl)),
        }
        let from = if self.twins.are(Twin::DFromArrival) {
            now
        } else {
            t_send
        };
        self.deadline = self.deadline.max(self.timing.deadline(from));
        self.next_send = t_send + self.timing.renew_every();
        self.phase = Phase::Idle;
        self.failures = 0;
        Verdict::Extended(self.deadline)
    }

    /// An answer at `now` to the renewal sent at `t_send` that comes too late to count.
    fn too_late(&mut self, now: BootInstant, t_send: BootInstant) -> Option<Verdict> {
        if now >= self.stop_at() {
            return Some(Verdict::Lost(LossReason::NotRenewed));
        }
        if now >= self.reply_due(t_send) {
            self.failed(now);
            return Some(Verdict::Failed);
        }
        None
    }

    /// The renewal in progress failed or is late (seen at `now`): retry at once, then every
    /// TTL/10. A reply to the abandoned request must not arrive on the rebuilt stream.
    pub fn failed(&mut self, now: BootInstant) {
        self.phase = Phase::Idle;
        self.failures += 1;
        self.next_send = if self.failures == 1 {
            now
        } else {
            now + self.timing.retry_every()
        };
    }
}

fn ttl_of(kept: Kept) -> Duration {
    Duration::from_secs(kept.ttl.max(0) as u64)
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

    pub(super) fn at(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_secs(1000) + Duration::from_millis(ms))
    }

    pub(super) fn params(ttl_s: u64) -> Params {
        Params {
            ttl: Duration::from_secs(ttl_s),
            kill_after: None,
            margin: None,
            drift: 0.1,
        }
    }

    /// Equal within a microsecond (the float division of the formula rounds).
    #[track_caller]
    pub(super) fn assert_near(a: BootInstant, b: BootInstant) {
        let gap = a.until(b).max(b.until(a));
        assert!(gap < Duration::from_micros(1), "{a:?} != {b:?}");
    }

    fn granted_at(ms: u64) -> Schedule {
        Schedule::granted(params(10), at(ms), 10).unwrap()
    }

    /// D of a renewal sent at `ms` with TTL 10 s: t_send + 10 s / 1.1 - 1 s.
    fn d(ms: u64) -> BootInstant {
        at(ms) + Duration::from_nanos(8_090_909_090)
    }

    const TERM: u64 = 4;

    fn kept(ttl: i64) -> Kept {
        Kept { ttl, term: TERM }
    }

    fn read(term: u64, key: KeySeen) -> Read {
        Read { term, key }
    }

    /// A keepalive sent at `send`, answered with `ttl` at `reply`, confirmed in the same term
    /// with the own key at `confirm`.
    fn renew(s: &mut Schedule, send: u64, reply: u64, confirm: u64, ttl: i64) -> Verdict {
        s.sent(at(send));
        match s.replied(at(reply), kept(ttl)) {
            Verdict::ToConfirm => {}
            other => return other,
        }
        s.reading();
        s.confirmed(at(confirm), read(TERM, KeySeen::Ours))
    }

    #[test]
    fn deadline_counts_from_the_keepalive_send_not_the_reply_nor_the_read() {
        let mut s = granted_at(0);
        assert_near(s.deadline(), d(0));
        let Verdict::Extended(dl) = renew(&mut s, 3_000, 3_400, 3_450, 10) else {
            panic!("a timely, confirmed reply extends the lease")
        };
        assert_near(dl, d(3_000));
    }

    #[test]
    fn a_keepalive_reply_alone_moves_nothing_until_the_read_confirms_it() {
        let mut s = granted_at(5_000);
        s.sent(at(6_000));
        assert_eq!(s.replied(at(6_010), kept(10)), Verdict::ToConfirm);
        assert_near(s.deadline(), d(5_000));
        // The read is due by the same time as the keepalive's reply: TTL/3 after the send.
        let due = at(6_000) + Duration::from_nanos(3_333_333_333);
        assert_eq!(s.next(at(6_010)), Next::ConfirmBy(due));
        s.reading();
        assert_eq!(s.next(at(6_020)), Next::AwaitReadUntil(due));
    }

    #[test]
    fn a_read_in_another_raft_term_is_a_failure_and_the_renewal_is_retried_at_once() {
        let mut s = granted_at(0);
        s.sent(at(3_000));
        s.replied(at(3_010), kept(10));
        s.reading();
        assert_eq!(
            s.confirmed(at(3_020), read(TERM + 1, KeySeen::Ours)),
            Verdict::Failed
        );
        assert_near(s.deadline(), d(0));
        assert_eq!(s.next(at(3_020)), Next::Send);
    }

    #[test]
    fn a_stale_member_never_moves_the_deadline_and_the_stop_time_loses_the_lease() {
        // Its lessor answers every keepalive; its reads never come back in time.
        let mut s = granted_at(0);
        let mut now = 3_334;
        while let Next::Send = s.next(at(now)) {
            s.sent(at(now));
            assert_eq!(s.replied(at(now + 5), kept(10)), Verdict::ToConfirm);
            s.reading();
            let Next::AwaitReadUntil(due) = s.next(at(now + 5)) else {
                panic!("the read is in flight")
            };
            s.failed(due);
            now = at(0).until(due).as_millis() as u64 + 1_000;
        }
        assert_eq!(s.next(s.stop_at()), Next::Lost);
        assert_near(s.deadline(), d(0));
    }

    #[test]
    fn an_election_between_keepalive_and_read_costs_one_retry_not_the_lease() {
        let mut s = granted_at(0);
        s.sent(at(3_334));
        s.replied(at(3_340), kept(10));
        s.reading();
        assert_eq!(
            s.confirmed(at(3_350), read(TERM + 1, KeySeen::Ours)),
            Verdict::Failed
        );
        // Retried at once through another member, now in the new term.
        s.sent(at(3_350));
        s.replied(
            at(3_360),
            Kept {
                ttl: 10,
                term: TERM + 1,
            },
        );
        s.reading();
        let Verdict::Extended(dl) = s.confirmed(at(3_370), read(TERM + 1, KeySeen::Ours)) else {
            panic!("the retry in the new term renews")
        };
        assert_near(dl, d(3_350));
    }

    #[test]
    fn a_read_that_finds_the_own_key_gone_or_replaced_loses_the_lease() {
        for seen in [KeySeen::Gone, KeySeen::Replaced] {
            let mut s = granted_at(0);
            s.sent(at(3_000));
            s.replied(at(3_010), kept(10));
            s.reading();
            assert_eq!(
                s.confirmed(at(3_020), read(TERM + 7, seen)),
                Verdict::KeyLost(seen)
            );
        }
    }

    #[test]
    fn a_confirming_read_after_its_due_time_is_a_failure_after_the_stop_time_lost() {
        let mut s = granted_at(5_000);
        s.sent(at(6_000));
        s.replied(at(6_010), kept(10));
        s.reading();
        let due = at(6_000) + Duration::from_nanos(3_333_333_333);
        assert_eq!(s.confirmed(due, read(TERM, KeySeen::Ours)), Verdict::Failed);
        assert_near(s.deadline(), d(5_000));
        let mut s = granted_at(0);
        s.sent(at(5_000));
        s.replied(at(5_010), kept(10));
        s.reading();
        let stop = s.stop_at();
        assert_eq!(
            s.confirmed(stop, read(TERM, KeySeen::Ours)),
            Verdict::Lost(LossReason::NotRenewed)
        );
    }

    #[test]
    fn a_read_answer_with_no_read_in_flight_is_ignored() {
        let mut s = granted_at(0);
        assert_eq!(
            s.confirmed(at(100), read(TERM, KeySeen::Ours)),
            Verdict::Ignored
        );
        s.sent(at(3_000));
        assert_eq!(
            s.confirmed(at(3_100), read(TERM, KeySeen::Ours)),
            Verdict::Ignored,
            "the keepalive's reply has not come yet"
        );
        assert_near(s.deadline(), d(0));
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
        for ttl in [0, -1] {
            let mut s = granted_at(0);
            s.sent(at(3_333));
            assert_eq!(
                s.replied(at(3_400), kept(ttl)),
                Verdict::Lost(LossReason::Expired)
            );
        }
        assert_eq!(
            Schedule::granted(params(10), at(0), 0).unwrap_err(),
            GrantError::Expired
        );
    }

    #[test]
    fn a_reply_with_nothing_in_flight_never_extends_the_deadline() {
        let mut s = granted_at(0);
        let before = s.deadline();
        assert_eq!(s.replied(at(100), kept(10)), Verdict::Ignored);
        s.sent(at(3_333));
        s.failed(at(3_400));
        assert_eq!(s.replied(at(3_500), kept(10)), Verdict::Ignored);
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
        assert_eq!(s.replied(due, kept(10)), Verdict::Failed);
        assert_eq!(s.deadline(), before);
        assert_eq!(s.next(due), Next::Send, "retry at once after a failure");
    }

    #[test]
    fn with_other_members_an_attempt_gets_half_the_time_left() {
        let mut s = granted_at(0).through_several_members();
        // Stop time 6090.9 ms; a send at 3333 ms leaves 2757.6 ms, of which half is its own.
        s.sent(at(3_333));
        let half = at(3_333).until(s.stop_at()) / 2;
        assert_eq!(s.next(at(3_400)), Next::AwaitReplyUntil(at(3_333) + half));
        s.failed(at(3_333) + half);
        assert_eq!(
            s.next(at(3_333) + half),
            Next::Send,
            "retried at once elsewhere"
        );
        // Early in a renewal period the renewal period itself is the bound.
        let mut s = granted_at(0).through_several_members();
        s.sent(at(100));
        let third = Duration::from_nanos(3_333_333_333);
        assert_eq!(
            s.next(at(200)),
            Next::AwaitReplyUntil(at(100) + third.min(at(100).until(s.stop_at()) / 2))
        );
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
        let Verdict::Extended(dl) = renew(&mut s, 5_100, 5_200, 5_210, 2) else {
            panic!("extended")
        };
        assert_eq!(dl, before);
    }

    #[test]
    fn a_ttl_too_short_for_the_rules_is_lost() {
        let p = Params {
            kill_after: Some(Duration::from_secs(4)),
            ..params(10)
        };
        let mut s = Schedule::granted(p, at(0), 10).unwrap();
        s.sent(at(1_000));
        assert_eq!(
            s.replied(at(1_010), kept(2)),
            Verdict::Lost(LossReason::TtlDoesNotFit(2))
        );
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
        let stop = s.stop_at();
        assert_eq!(
            s.replied(stop, kept(10)),
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
        assert!(matches!(
            renew(&mut s, 4_360, 4_370, 4_380, 10),
            Verdict::Extended(_)
        ));
        assert_eq!(
            s.next(at(4_380)),
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

    /// What the model checker (tests/model) hashes a schedule to: the same for the same state.
    pub(crate) fn hash_of(x: &impl std::hash::Hash) -> u64 {
        use std::hash::Hasher;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        x.hash(&mut h);
        h.finish()
    }

    #[test]
    fn schedules_in_different_states_hash_apart_for_the_model_checker() {
        let base = granted_at(0);
        let mut sent = granted_at(0);
        sent.sent(at(3_000));
        let mut failed = granted_at(0);
        failed.failed(at(0));
        let mut renewed = granted_at(0);
        renew(&mut renewed, 3_000, 3_010, 3_020, 10);
        let others = granted_at(0).through_several_members();
        let longer = Schedule::granted(params(10), at(0), 20).unwrap();
        let states = [&base, &sent, &failed, &renewed, &others, &longer];
        for (i, a) in states.iter().enumerate() {
            for b in &states[i + 1..] {
                assert_ne!(hash_of(*a), hash_of(*b), "{a:?} and {b:?}");
            }
        }
        assert_eq!(hash_of(&base), hash_of(&granted_at(0)));
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
