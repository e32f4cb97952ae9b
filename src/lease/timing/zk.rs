//! ZooKeeper's deadline rule (docs/zookeeper.md §4), as pure functions of instants and answers,
//! like the rest of `timing`: nothing here reads a clock, sleeps or does I/O.
//!
//! A follower touches a session in its own table and tells the leader only in its reply to the
//! leader's next PING; a write it forwards is checked at the leader, never touched. So the send
//! time of the latest successful write proves nothing about the leader's expiry clock. What does:
//! on one connection, a request R answered by the member (it touched the session there), then a
//! `sync` X sent at least Δ later, where Δ bounds the leader's PING spacing, then a successful
//! multi Y with a check on the own lock node. The leader queued a PING between R's answer and X's
//! send; the member wrote that PING's reply (listing the session) before it handled X's answer
//! from the leader; the leader read that reply before Y, and Y found the session alive. So the
//! leader's expiry is at least `t_send(R) + T`, and
//!
//! `D = t_send(Look) + T_min / (1 + drift) - margin`
//!
//! where T_min is the smallest session timeout negotiated in this session. Each renewal is that
//! triple: [`Step::Look`] (a read of the own node), [`Step::Sync`] no sooner than Δ after the
//! Look's answer, and [`Step::Check`]. Any error, timeout or disconnection between them starts
//! the triple over; `D` never moves backwards and never moves on anything but a Check.

use std::fmt;
use std::time::Duration;

use super::{stop_time, Effective, KeySeen, Params, Twin, Twins, Verdict};
use crate::clock::BootInstant;
use crate::lease::LossReason;

/// One request of a renewal, in the order they are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// A read of the own lock node (`exists` or `getData`), answered by the member itself.
    Look,
    /// A `sync`, answered only after the leader's reply to it reached the member.
    Sync,
    /// A multi with one check op on the own lock node, which goes through the leader.
    Check,
}

/// What the server said to a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// Answered without error; for Look and Check, the own node is there and ours (its czxid).
    Ok,
    /// The own node is not there.
    NodeGone,
    /// A node is at the own path with another czxid: another holder's.
    Replaced,
    /// The session has expired (or was closed).
    Expired,
    /// Answered with an error that says nothing of the session or the node (a Check whose op
    /// failed otherwise): a failed step.
    Failed,
}

/// ZooKeeper's error code for a session the leader has expired or is closing.
const SESSION_EXPIRED: i32 = -112;
/// ZooKeeper's error code for a node that is not there.
const NO_NODE: i32 = -101;

/// What the renewer should do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZkNext {
    /// Send this step now (take `t_send` first, then call [`ZkSchedule::sent`]).
    Send(Step),
    /// Nothing to send before this instant.
    SleepUntil(BootInstant),
    /// A step is in flight; if its answer has not come by this instant, call [`ZkSchedule::failed`].
    AwaitUntil(BootInstant),
    /// The stop time has come: the lease must be treated as lost.
    Lost,
}

/// The timing in force for one negotiated session timeout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZkTiming {
    /// TTL is the negotiated session timeout; kill-after, margin and drift as on etcd.
    pub effective: Effective,
    /// Δ: on our clock, the longest the leader may take between two PINGs to a follower.
    pub relay: Duration,
    /// Room for a renewal's three round trips (Look, Sync, Check): a rule that leaves none
    /// would lose the lease on a healthy ensemble. It counts in the check only, never in `D`.
    pub round_trips: Duration,
}

/// The room a renewal's three round trips need, for a connect request (a session's creation:
/// a write through the leader, as the Check is) that took `measured`: each as long as that, and
/// at least 100 ms (a write's fsync on a busy ensemble, a busy client host).
pub fn round_trip_allowance(measured: Duration) -> Duration {
    measured.max(Duration::from_millis(100)) * 3
}

/// The rule `TTL/4 + Δ + round trips + kill_after + margin < TTL/(1+drift)` did not hold.
#[derive(Clone, Debug, PartialEq)]
pub struct DoesNotFit(ZkTiming);

impl fmt::Display for DoesNotFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (z, e) = (&self.0, &self.0.effective);
        let left = z.needs();
        write!(
            f,
            "timing does not fit: on ZooKeeper, TTL/4 ({}) + the leader's PING bound ({}) + a renewal's round trips ({}) + \
             kill-after ({}) + margin ({}) = {} must be less than TTL/(1+drift) ({} with a session timeout of {} and --drift {}); \
             raise --ttl or lower --kill-after, --margin or --drift",
            secs(z.renew_every()),
            secs(z.relay),
            secs(z.round_trips),
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

impl ZkTiming {
    /// The values in force for the negotiated `timeout`, given the servers' tickTime when an
    /// ensemble told it (`conf`). Without it, tickTime is taken as TTL/2: ZooKeeper's lower
    /// bound on session timeouts is 2 × tickTime unless minSessionTimeout is set lower.
    pub fn new(
        params: &Params,
        timeout: Duration,
        tick: Option<Duration>,
    ) -> Result<Self, DoesNotFit> {
        Self::checked(params.effective_unchecked(timeout), tick, Duration::ZERO)
    }

    /// The values in force once a reconnect negotiated the shorter `timeout`: kill-after and
    /// margin stay as they were (the watchdog already counts with them), only the TTL shrinks.
    pub fn shortened(&self, timeout: Duration, tick: Option<Duration>) -> Result<Self, DoesNotFit> {
        let effective = Effective {
            ttl: timeout,
            ..self.effective
        };
        Self::checked(effective, tick, self.round_trips)
    }

    /// The timing for `effective`, if the rule holds for it with `round_trips` of room.
    fn checked(
        effective: Effective,
        tick: Option<Duration>,
        round_trips: Duration,
    ) -> Result<Self, DoesNotFit> {
        let timeout = effective.ttl;
        let tick = tick.unwrap_or(timeout / 2);
        let pings = Duration::from_secs_f64((tick / 2).as_secs_f64() * (1.0 + effective.drift));
        let z = ZkTiming {
            effective,
            relay: pings + leader_slack(timeout),
            round_trips,
        };
        if z.needs() < effective.server_bound() {
            Ok(z)
        } else {
            Err(DoesNotFit(z))
        }
    }

    /// What the rule adds up: TTL/4 + Δ + round trips + kill-after + margin.
    fn needs(&self) -> Duration {
        let e = &self.effective;
        self.renew_every() + self.relay + self.round_trips + e.kill_after + e.margin
    }

    /// Time from one renewal's Look to the next one's.
    pub fn renew_every(&self) -> Duration {
        self.effective.ttl / 4
    }

    /// Retry period after a second failure in a row.
    pub fn retry_every(&self) -> Duration {
        self.effective.ttl / 10
    }

    /// `D` for a renewal whose Look was sent at `t_look`.
    fn deadline(&self, t_look: BootInstant) -> BootInstant {
        self.effective.deadline(t_look)
    }
}

/// Room for the leader's own scheduling between PINGs: TTL/40, from 10 ms to 250 ms.
fn leader_slack(timeout: Duration) -> Duration {
    (timeout / 40).clamp(Duration::from_millis(10), Duration::from_millis(250))
}

/// Where the renewal in progress is. Every phase but `Idle` carries the Look's send time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// Nothing in flight; the next Look is due at `next_send`.
    Idle,
    /// The Look is in flight.
    Looking { t_look: BootInstant },
    /// The Look was answered at `answered`; the Sync waits until Δ after that.
    Relaying {
        t_look: BootInstant,
        answered: BootInstant,
    },
    /// The Sync is in flight.
    Syncing { t_look: BootInstant },
    /// The Sync was answered; the Check is to be sent.
    Synced { t_look: BootInstant },
    /// The Check is in flight.
    Checking { t_look: BootInstant },
}

impl Phase {
    const fn is_idle(&self) -> bool {
        matches!(self, Phase::Idle)
    }

    /// The step whose answer this phase awaits.
    const fn awaits(&self) -> Option<Step> {
        match self {
            Phase::Looking { .. } => Some(Step::Look),
            Phase::Syncing { .. } => Some(Step::Sync),
            Phase::Checking { .. } => Some(Step::Check),
            _ => None,
        }
    }

    const fn t_look(&self) -> Option<BootInstant> {
        match *self {
            Phase::Idle => None,
            Phase::Looking { t_look }
            | Phase::Relaying { t_look, .. }
            | Phase::Syncing { t_look }
            | Phase::Synced { t_look }
            | Phase::Checking { t_look } => Some(t_look),
        }
    }
}

/// The renewal state of one ZooKeeper session.
#[derive(Clone, Debug)]
pub struct ZkSchedule {
    /// The values in force for the timeout negotiated.
    timing: ZkTiming,
    /// `D`: SIGKILL time; the stop signal goes out `kill_after` before.
    deadline: BootInstant,
    /// When the next Look is due, if nothing is in flight.
    next_send: BootInstant,
    /// The renewal in progress.
    phase: Phase,
    /// Failures since the last good renewal, for the retry schedule.
    failures: u32,
    /// The ensemble's tickTime, when it told it: the PING bound of a shortened timeout.
    tick: Option<Duration>,
    /// The broken twin the model checker runs instead of the rule.
    twins: Twins,
}

/// The state a model checker tells apart (tests/model): every field but the timing, which is
/// the same in all of its states and holds a float.
impl std::hash::Hash for ZkSchedule {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.timing.effective.ttl, self.deadline, self.next_send).hash(h);
        (self.phase, self.failures).hash(h);
    }
}

impl ZkSchedule {
    /// The schedule of a session whose connect request was sent no earlier than `t_connect`
    /// and answered with the negotiated `timeout`. A new session is created through the leader,
    /// which starts its expiry clock after `t_connect`.
    pub fn connected(
        params: Params,
        t_connect: BootInstant,
        timeout: Duration,
        tick: Option<Duration>,
    ) -> Result<Self, DoesNotFit> {
        Self::connected_within(params, t_connect, timeout, tick, Duration::ZERO)
    }

    /// [`ZkSchedule::connected`], the rule checked with `round_trips` of room for a renewal's
    /// three round trips (see [`round_trip_allowance`]).
    pub fn connected_within(
        params: Params,
        t_connect: BootInstant,
        timeout: Duration,
        tick: Option<Duration>,
        round_trips: Duration,
    ) -> Result<Self, DoesNotFit> {
        let effective = params.effective_unchecked(timeout);
        let timing = ZkTiming::checked(effective, tick, round_trips)?;
        Ok(Self {
            timing,
            deadline: timing.deadline(t_connect),
            next_send: t_connect + timing.renew_every(),
            phase: Phase::Idle,
            failures: 0,
            tick,
            twins: Twins::default(),
        })
    }

    /// How long the Sync waits after the Look's answer: Δ.
    fn relay(&self) -> Duration {
        if self.twins.are(Twin::NoRelayWait) {
            Duration::ZERO
        } else {
            self.timing.relay
        }
    }

    /// `D`, the instant by which the child must be dead.
    pub fn deadline(&self) -> BootInstant {
        self.deadline
    }

    /// When the stop signal goes to the child: `D - kill_after`.
    pub fn stop_at(&self) -> BootInstant {
        stop_time(self.deadline, self.timing.effective.kill_after)
    }

    /// The values in force.
    pub fn timing(&self) -> &ZkTiming {
        &self.timing
    }

    /// What to do at `now`.
    pub fn next(&self, now: BootInstant) -> ZkNext {
        if now >= self.stop_at() {
            return ZkNext::Lost;
        }
        match self.phase {
            Phase::Idle if now >= self.next_send => ZkNext::Send(Step::Look),
            Phase::Idle => ZkNext::SleepUntil(self.next_send.min(self.stop_at())),
            Phase::Relaying { answered, .. } => {
                let sync_at = answered + self.relay();
                if now >= sync_at {
                    ZkNext::Send(Step::Sync)
                } else {
                    ZkNext::SleepUntil(sync_at.min(self.stop_at()))
                }
            }
            Phase::Synced { .. } => ZkNext::Send(Step::Check),
            Phase::Looking { .. } | Phase::Syncing { .. } | Phase::Checking { .. } => {
                ZkNext::AwaitUntil(self.stop_at())
            }
        }
    }

    /// What a Check said, from the result of its multi's one op (none: the server sent no
    /// result). The reply's header is OK even when the op failed, so only the op's own success
    /// renews: -112, the leader closing the session, ends it; the own node missing is `NodeGone`;
    /// any other error is a failed step.
    pub fn check_answer(&self, op: Option<Result<(), i32>>) -> Answer {
        match op {
            Some(Ok(())) => Answer::Ok,
            Some(Err(NO_NODE)) => Answer::NodeGone,
            Some(Err(SESSION_EXPIRED)) => Answer::Expired,
            _ => Answer::Failed,
        }
    }

    /// When the step sent at `sent` is given up, its connection dropped and the renewal started
    /// over on another member (a follower cut off from its leader answers the Look and never the
    /// Sync): once it has run past its share of the round-trip room, and waiting longer would
    /// leave too little time before the stop time for a fresh renewal there (a reconnect, a Look,
    /// Δ, a Sync and a Check, each round trip within its share). Never after the stop time.
    pub fn give_up_at(&self, sent: BootInstant) -> BootInstant {
        let each = self.timing.round_trips / 3;
        let retry = self.relay() + each * 4;
        let latest = self.stop_at() - retry;
        (sent + each).max(latest).min(self.stop_at())
    }

    /// `step` was written; `t_send` was read just before.
    pub fn sent(&mut self, step: Step, t_send: BootInstant) {
        self.phase = match (step, self.phase) {
            (Step::Look, Phase::Idle) => Phase::Looking { t_look: t_send },
            (Step::Sync, Phase::Relaying { t_look, answered })
                if t_send >= answered + self.relay() =>
            {
                Phase::Syncing { t_look }
            }
            (Step::Check, Phase::Synced { .. }) if self.twins.are(Twin::DFromCheck) => {
                Phase::Checking { t_look: t_send }
            }
            (Step::Check, Phase::Synced { t_look }) => Phase::Checking { t_look },
            // Out of order: the chain is broken, so this renewal proves nothing.
            _ => Phase::Idle,
        };
    }

    /// The step in flight was answered at `now`.
    pub fn answered(&mut self, now: BootInstant, answer: Answer) -> Verdict {
        let (Some(step), Some(t_look)) = (self.phase.awaits(), self.phase.t_look()) else {
            return Verdict::Ignored;
        };
        match answer {
            Answer::Expired => return Verdict::Lost(LossReason::SessionExpired),
            Answer::NodeGone => return Verdict::KeyLost(KeySeen::Gone),
            Answer::Replaced => return Verdict::KeyLost(KeySeen::Replaced),
            Answer::Failed => {
                self.failed(now);
                return Verdict::Failed;
            }
            Answer::Ok => {}
        }
        if now >= self.stop_at() {
            return Verdict::Lost(LossReason::NotRenewed);
        }
        self.phase = match step {
            Step::Look => Phase::Relaying {
                t_look,
                answered: now,
            },
            Step::Sync => Phase::Synced { t_look },
            Step::Check => return self.renewed(t_look),
        };
        Verdict::ToConfirm
    }

    /// The Check of the renewal whose Look went out at `t_look` succeeded.
    fn renewed(&mut self, t_look: BootInstant) -> Verdict {
        self.deadline = self.deadline.max(self.timing.deadline(t_look));
        self.next_send = t_look + self.timing.renew_every();
        self.phase = Phase::Idle;
        self.failures = 0;
        Verdict::Extended(self.deadline)
    }

    /// The step in flight failed, or the connection dropped or changed (seen at `now`): `D` stays,
    /// and a new renewal starts with a Look at once, then every TTL/10.
    pub fn failed(&mut self, now: BootInstant) {
        self.phase = Phase::Idle;
        self.failures += 1;
        self.next_send = match self.failures {
            1 => now,
            _ => now + self.timing.retry_every(),
        };
    }

    /// The session is on a new connection, seen at `now`: a renewal in progress (or failed) is
    /// over, and the next starts at once rather than after the retry spacing, since what it
    /// waited for went with the old connection. A session whose last renewal was good keeps its
    /// schedule.
    pub fn restart(&mut self, now: BootInstant) {
        if !(self.phase.is_idle() && self.failures == 0) {
            self.next_send = now;
        }
        self.phase = Phase::Idle;
    }

    /// The session was moved (or reconnected) by a connect request sent at `t_send` and answered
    /// with the negotiated `timeout` (zero: the session is gone). A longer timeout changes nothing:
    /// the leader's expiry only grew. A shorter one replaced the leader's expiry when the member
    /// revalidated the session (at or after `t_send`), and every later touch counts with it: `D`
    /// comes down to `t_send + timeout/(1+drift) - margin` if that is sooner, and the renewals go
    /// on with the shorter timeout, or the lease is lost when the rule does not hold for it. The
    /// lowered `D` stands either way: the watchdog must kill by it.
    pub fn reconnected(
        &mut self,
        t_send: BootInstant,
        timeout: Duration,
    ) -> Result<(), LossReason> {
        if timeout.is_zero() {
            return Err(LossReason::SessionExpired);
        }
        if timeout >= self.timing.effective.ttl {
            return Ok(());
        }
        let lost = LossReason::TimeoutShortened(timeout);
        let (timing, fits) = match self.timing.shortened(timeout, self.tick) {
            Ok(t) => (t, true),
            Err(DoesNotFit(t)) => (t, false),
        };
        if !self.twins.are(Twin::MoveKeepsD) {
            self.deadline = self.deadline.min(timing.deadline(t_send));
        }
        // Renewals keep the shorter spacing from the reconnect on, or the lowered D would run
        // out before the next one: none may be due later than a quarter of the new timeout.
        self.next_send = self.next_send.min(t_send + timing.renew_every());
        self.timing = timing;
        if fits {
            Ok(())
        } else {
            Err(lost)
        }
    }

    /// True while no renewal is in progress.
    pub fn is_idle(&self) -> bool {
        self.phase.is_idle()
    }

    /// The same session, renewed by a broken twin of the rule (tests/model).
    #[cfg(feature = "model-twins")]
    pub fn twin(self, twin: Twin) -> Self {
        let twins = Twins::of(twin);
        Self { twins, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_secs(1000) + Duration::from_millis(ms))
    }

    fn params() -> Params {
        Params {
            ttl: Duration::from_secs(4),
            kill_after: None,
            margin: None,
            drift: 0.1,
        }
    }

    /// A session negotiated at 4 s (`at(0)` the connect) on an ensemble whose tickTime is 200 ms:
    /// Δ = 100 ms × 1.1 + 100 ms of leader slack = 210 ms.
    fn session() -> ZkSchedule {
        ZkSchedule::connected(params(), at(0), Duration::from_secs(4), Some(TICK)).unwrap()
    }

    const TICK: Duration = Duration::from_millis(200);

    /// D of a renewal whose Look was sent at `ms`: 4 s / 1.1 - 400 ms of margin.
    fn d(ms: u64) -> BootInstant {
        at(ms) + Duration::from_nanos(3_636_363_636) - Duration::from_millis(400)
    }

    #[track_caller]
    fn assert_near(a: BootInstant, b: BootInstant) {
        let gap = a.until(b).max(b.until(a));
        assert!(gap < Duration::from_micros(1), "{a:?} != {b:?}");
    }

    /// One whole renewal: Look sent at `look`, each answer `rtt` ms after its send, the Sync sent as
    /// soon as the rule allows.
    fn renew(s: &mut ZkSchedule, look: u64, rtt: u64) -> Verdict {
        s.sent(Step::Look, at(look));
        assert_eq!(s.answered(at(look + rtt), Answer::Ok), Verdict::ToConfirm);
        let ZkNext::SleepUntil(sync_at) = s.next(at(look + rtt)) else {
            panic!("the Sync waits for the leader's next PING")
        };
        assert_eq!(s.next(sync_at), ZkNext::Send(Step::Sync));
        s.sent(Step::Sync, sync_at);
        assert_eq!(
            s.answered(sync_at + ms(rtt), Answer::Ok),
            Verdict::ToConfirm
        );
        assert_eq!(s.next(sync_at + ms(rtt)), ZkNext::Send(Step::Check));
        s.sent(Step::Check, sync_at + ms(rtt));
        s.answered(sync_at + ms(2 * rtt), Answer::Ok)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_deadline_counts_from_the_connect_request() {
        let s = session();
        assert_near(s.deadline(), d(0));
        assert_eq!(s.next(at(10)), ZkNext::SleepUntil(at(1_000)));
        assert_eq!(s.next(at(1_000)), ZkNext::Send(Step::Look));
    }

    #[test]
    fn deadline_counts_from_the_look_not_from_the_successful_check() {
        let mut s = session();
        let Verdict::Extended(dl) = renew(&mut s, 1_000, 5) else {
            panic!("a timely triple renews")
        };
        // The Check went out 220 ms after the Look; D counts from the Look.
        assert_near(dl, d(1_000));
        assert_eq!(s.next(at(1_300)), ZkNext::SleepUntil(at(2_000)));
    }

    #[test]
    fn the_sync_waits_the_leaders_ping_bound_after_the_looks_answer() {
        let mut s = session();
        s.sent(Step::Look, at(1_000));
        s.answered(at(1_030), Answer::Ok);
        assert_eq!(s.timing().relay, ms(210));
        assert_eq!(s.next(at(1_100)), ZkNext::SleepUntil(at(1_240)));
        assert_eq!(s.next(at(1_240)), ZkNext::Send(Step::Sync));
    }

    #[test]
    fn a_sync_sent_too_soon_breaks_the_chain_and_its_check_moves_nothing() {
        let mut s = session();
        s.sent(Step::Look, at(1_000));
        s.answered(at(1_005), Answer::Ok);
        s.sent(Step::Sync, at(1_100));
        assert_eq!(s.answered(at(1_105), Answer::Ok), Verdict::Ignored);
        s.sent(Step::Check, at(1_106));
        assert_eq!(s.answered(at(1_110), Answer::Ok), Verdict::Ignored);
        assert_near(s.deadline(), d(0));
    }

    #[test]
    fn a_check_without_a_look_and_a_sync_before_it_moves_nothing() {
        let mut s = session();
        s.sent(Step::Check, at(1_000));
        assert_eq!(s.answered(at(1_005), Answer::Ok), Verdict::Ignored);
        assert_near(s.deadline(), d(0));
    }

    #[test]
    fn a_failure_or_disconnection_between_steps_keeps_d_and_starts_over_with_a_look() {
        let mut s = session();
        s.sent(Step::Look, at(1_000));
        s.answered(at(1_005), Answer::Ok);
        s.sent(Step::Sync, at(1_215));
        s.failed(at(1_300));
        assert_near(s.deadline(), d(0));
        assert_eq!(s.next(at(1_300)), ZkNext::Send(Step::Look));
        s.sent(Step::Look, at(1_300));
        s.failed(at(1_310));
        // The second failure in a row waits TTL/10.
        assert_eq!(s.next(at(1_310)), ZkNext::SleepUntil(at(1_710)));
    }

    #[test]
    fn a_slow_renewal_still_counts_until_the_stop_time() {
        // Requests on one connection are answered in order, so a second renewal sent behind a
        // slow one would wait for it: the step in flight has until the stop time.
        let mut s = session();
        s.sent(Step::Look, at(1_000));
        assert_eq!(s.next(at(1_001)), ZkNext::AwaitUntil(s.stop_at()));
        assert_eq!(s.answered(at(1_900), Answer::Ok), Verdict::ToConfirm);
        assert_eq!(s.next(at(1_900)), ZkNext::SleepUntil(at(2_110)));
        s.sent(Step::Sync, at(2_110));
        s.answered(at(2_200), Answer::Ok);
        s.sent(Step::Check, at(2_200));
        // The stop time of the connect's D is at 2.436 s.
        assert_eq!(
            s.answered(at(2_300), Answer::Ok),
            Verdict::Extended(s.timing().deadline(at(1_000)))
        );
    }

    #[test]
    fn only_a_checks_own_success_renews_and_minus_112_ends_the_session() {
        let s = session();
        assert_eq!(s.check_answer(Some(Ok(()))), Answer::Ok);
        assert_eq!(s.check_answer(Some(Err(-112))), Answer::Expired);
        assert_eq!(s.check_answer(Some(Err(-101))), Answer::NodeGone);
        assert_eq!(s.check_answer(Some(Err(-2))), Answer::Failed);
        assert_eq!(s.check_answer(Some(Err(-118))), Answer::Failed);
        assert_eq!(s.check_answer(None), Answer::Failed);
    }

    #[test]
    fn a_check_that_failed_otherwise_keeps_d_and_starts_over() {
        let mut s = session();
        s.sent(Step::Look, at(1_000));
        s.answered(at(1_005), Answer::Ok);
        s.sent(Step::Sync, at(1_215));
        s.answered(at(1_220), Answer::Ok);
        s.sent(Step::Check, at(1_220));
        assert_eq!(s.answered(at(1_225), Answer::Failed), Verdict::Failed);
        assert_near(s.deadline(), d(0));
        assert_eq!(s.next(at(1_225)), ZkNext::Send(Step::Look));
        s.sent(Step::Look, at(1_225));
        assert_eq!(
            s.answered(at(1_230), Answer::Expired),
            Verdict::Lost(LossReason::SessionExpired)
        );
    }

    /// With 100 ms a round trip: a step is given up 100 ms after its send, or later while a
    /// fresh renewal (a reconnect and Look, Δ, Sync and Check: Δ + 400 ms) still fits before
    /// the stop time; never after it.
    #[test]
    fn a_stuck_step_is_given_up_while_a_fresh_renewal_still_fits() {
        let room = super::round_trip_allowance(Duration::ZERO);
        let s =
            ZkSchedule::connected_within(params(), at(0), Duration::from_secs(4), Some(TICK), room)
                .unwrap();
        let stop = s.stop_at();
        let latest = stop - (ms(210) + ms(400));
        assert_eq!(s.give_up_at(at(1_000)), latest);
        assert_eq!(s.give_up_at(latest), latest + ms(100));
        assert_eq!(s.give_up_at(stop - ms(50)), stop);
    }

    #[test]
    fn on_a_new_connection_a_failed_or_unfinished_renewal_starts_over_at_once() {
        let mut s = session();
        s.restart(at(500));
        assert_eq!(s.next(at(500)), ZkNext::SleepUntil(at(1_000)));
        s.sent(Step::Look, at(1_000));
        s.failed(at(1_100));
        s.sent(Step::Look, at(1_100));
        s.failed(at(1_150));
        assert_eq!(s.next(at(1_150)), ZkNext::SleepUntil(at(1_550)));
        s.restart(at(1_200));
        assert_eq!(s.next(at(1_200)), ZkNext::Send(Step::Look));
        s.sent(Step::Look, at(1_200));
        s.restart(at(1_210));
        assert_eq!(s.next(at(1_210)), ZkNext::Send(Step::Look));
    }

    #[test]
    fn an_answer_after_the_stop_time_loses_the_lease() {
        let mut s = session();
        let stop = s.stop_at();
        s.sent(Step::Look, stop - ms(500));
        assert_eq!(
            s.answered(stop, Answer::Ok),
            Verdict::Lost(LossReason::NotRenewed)
        );
        assert_eq!(s.next(stop), ZkNext::Lost);
    }

    #[test]
    fn expiry_a_missing_node_and_another_holders_node_each_end_the_lease() {
        let cases = [
            (Answer::Expired, Verdict::Lost(LossReason::SessionExpired)),
            (Answer::NodeGone, Verdict::KeyLost(KeySeen::Gone)),
            (Answer::Replaced, Verdict::KeyLost(KeySeen::Replaced)),
        ];
        for (answer, verdict) in cases {
            let mut s = session();
            s.sent(Step::Look, at(1_000));
            assert_eq!(s.answered(at(1_005), answer), verdict);
        }
    }

    #[test]
    fn an_answer_with_nothing_in_flight_is_ignored() {
        let mut s = session();
        assert_eq!(s.answered(at(500), Answer::Ok), Verdict::Ignored);
        assert_eq!(s.answered(at(500), Answer::Expired), Verdict::Ignored);
    }

    #[test]
    fn without_ticktime_the_ping_bound_is_a_quarter_of_the_timeout() {
        let s = ZkSchedule::connected(params(), at(0), Duration::from_secs(4), None).unwrap();
        // tickTime taken as TTL/2 = 2 s: PINGs every 1 s × 1.1, plus 100 ms of slack.
        assert_eq!(s.timing().relay, ms(1_200));
    }

    #[test]
    fn a_longer_timeout_on_reconnecting_changes_nothing() {
        let mut s = session();
        assert_eq!(s.reconnected(at(1_000), Duration::from_secs(6)), Ok(()));
        assert_near(s.deadline(), d(0));
        assert_eq!(s.timing().effective.ttl, Duration::from_secs(4));
        assert_eq!(
            s.reconnected(at(1_000), Duration::ZERO),
            Err(LossReason::SessionExpired)
        );
    }

    #[test]
    fn a_shorter_timeout_on_reconnecting_brings_d_down_to_the_reconnect_and_goes_on_with_it() {
        let mut s = session();
        assert_eq!(renew(&mut s, 1_000, 5), Verdict::Extended(d(1_000)));
        // Reconnected at 1.5 s with 2.5 s: the leader's expiry is now 1.5 s + 2.5 s at the least,
        // sooner than 1 s + 4 s. D = 1.5 s + 2.5 s / 1.1 - 400 ms (the margin stays).
        assert_eq!(s.reconnected(at(1_500), ms(2_500)), Ok(()));
        let lowered = at(1_500) + Duration::from_nanos(2_272_727_272) - ms(400);
        assert_near(s.deadline(), lowered);
        assert_eq!(s.timing().effective.ttl, ms(2_500));
        assert_eq!(s.timing().effective.kill_after, ms(800));
        // The next renewal is due by a quarter of 2.5 s after the reconnect (2.125 s), and was
        // due sooner already (2 s).
        assert_eq!(s.next(at(1_600)), ZkNext::SleepUntil(at(2_000)));
        // The keeper sees the state change as a failure, and the next Look goes out at once;
        // that renewal counts with 2.5 s: D from its Look + 2.5 s / 1.1 - 400 ms.
        s.failed(at(1_510));
        assert_eq!(s.next(at(1_510)), ZkNext::Send(Step::Look));
        let extended = at(1_510) + Duration::from_nanos(2_272_727_272) - ms(400);
        let Verdict::Extended(renewed) = renew(&mut s, 1_510, 5) else {
            panic!("the renewal after the reconnect extends D")
        };
        assert_near(renewed, extended);
    }

    #[test]
    fn after_a_shorter_timeout_the_next_renewal_is_due_a_quarter_of_it_after_the_reconnect() {
        let mut s = session();
        assert_eq!(renew(&mut s, 1_000, 5), Verdict::Extended(d(1_000)));
        assert_eq!(s.next(at(1_100)), ZkNext::SleepUntil(at(2_000)));
        assert_eq!(s.reconnected(at(1_100), ms(2_500)), Ok(()));
        assert_eq!(s.next(at(1_200)), ZkNext::SleepUntil(at(1_725)));
    }

    #[test]
    fn a_shorter_timeout_the_rule_cannot_work_with_loses_and_still_brings_d_down() {
        let mut s = session();
        assert_eq!(
            s.reconnected(at(1_000), ms(1_000)),
            Err(LossReason::TimeoutShortened(ms(1_000)))
        );
        // 1 s + 1 s / 1.1 - 400 ms: before the child's stop is done, SIGKILL comes at this D.
        let lowered = at(1_000) + Duration::from_nanos(909_090_909) - ms(400);
        assert_near(s.deadline(), lowered);
    }

    #[test]
    fn the_rule_holds_at_its_edge_and_fails_past_it() {
        // TTL 10 s, drift 0: TTL/4 2.5 + Δ (1 s + 0.25) + kill-after + margin 1 < 10.
        let p = |kill: u64| Params {
            ttl: Duration::from_secs(10),
            kill_after: Some(ms(kill)),
            margin: Some(ms(1_000)),
            drift: 0.0,
        };
        let tick = Some(Duration::from_secs(2));
        assert!(ZkTiming::new(&p(5_249), Duration::from_secs(10), tick).is_ok());
        let err = ZkTiming::new(&p(5_250), Duration::from_secs(10), tick).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("on ZooKeeper"), "{text}");
        assert!(text.contains("raise --ttl"), "{text}");
        // Each term and the sum, in seconds: 2.5 + 1.25 + 0 + 5.25 + 1 = 10.
        for term in [
            "TTL/4 (2.500s)",
            "bound (1.250s)",
            "kill-after (5.250s)",
            "= 10.000s",
        ] {
            assert!(text.contains(term), "{term} in {text}");
        }
    }

    #[test]
    fn default_timing_fits_every_timeout_from_one_second_with_ticktime_unknown() {
        let p = Params {
            ttl: Duration::from_secs(1),
            ..params()
        };
        for ms_ in (1_000..=60_000).step_by(250) {
            let t = ms(ms_);
            assert!(ZkTiming::new(&p, t, None).is_ok(), "timeout {t:?}");
        }
    }

    #[test]
    fn a_renewals_round_trips_get_three_times_the_connects_and_100_ms_each_at_least() {
        assert_eq!(round_trip_allowance(Duration::ZERO), ms(300));
        assert_eq!(round_trip_allowance(ms(40)), ms(300));
        assert_eq!(round_trip_allowance(ms(250)), ms(750));
        // The room counts in the rule: a timing that fits without it may not fit with it.
        let p = Params {
            kill_after: Some(ms(1_500)),
            ..params()
        };
        let t = Duration::from_secs(4);
        assert!(ZkSchedule::connected_within(p, at(0), t, Some(TICK), ms(300)).is_ok());
        assert!(ZkSchedule::connected_within(p, at(0), t, Some(TICK), ms(750)).is_err());
    }

    #[test]
    fn sessions_in_different_states_hash_apart_for_the_model_checker() {
        use crate::lease::timing::tests::hash_of;
        let base = session();
        let mut looking = session();
        looking.sent(Step::Look, at(1_000));
        let mut failed = session();
        failed.failed(at(0));
        let mut renewed = session();
        renew(&mut renewed, 1_000, 5);
        let mut shorter = session();
        shorter.reconnected(at(0), ms(3_900)).unwrap();
        let later = ZkSchedule::connected(params(), at(1), Duration::from_secs(4), Some(TICK));
        let states = [
            &base,
            &looking,
            &failed,
            &renewed,
            &shorter,
            &later.unwrap(),
        ];
        for (i, a) in states.iter().enumerate() {
            for b in &states[i + 1..] {
                assert_ne!(hash_of(*a), hash_of(*b), "{a:?} and {b:?}");
            }
        }
        assert_eq!(hash_of(&base), hash_of(&session()));
    }

    #[test]
    fn a_healthy_session_renews_every_quarter_and_never_comes_near_its_stop_time() {
        let mut s = session();
        let mut look = 1_000;
        for _ in 0..100 {
            assert_eq!(s.next(at(look)), ZkNext::Send(Step::Look));
            assert!(matches!(renew(&mut s, look, 20), Verdict::Extended(_)));
            // Until the next renewal ends (its Look + Δ + 3 round trips), the stop time is ahead.
            let next_done = at(look + 1_000) + ms(210 + 60);
            assert!(s.stop_at() > next_done + ms(1_000), "look {look}");
            look += 1_000;
        }
    }
}
