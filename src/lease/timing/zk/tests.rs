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
fn an_answer_after_the_renewals_due_time_is_a_failure() {
    let mut s = session();
    s.sent(Step::Look, at(1_000));
    // Due Δ + TTL/4 after the Look.
    assert_eq!(s.next(at(1_001)), ZkNext::AwaitUntil(at(2_210)));
    assert_eq!(s.answered(at(2_210), Answer::Ok), Verdict::Failed);
    assert_near(s.deadline(), d(0));
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
fn a_longer_timeout_on_reconnecting_changes_nothing_a_shorter_one_loses() {
    let mut s = session();
    assert_eq!(s.renegotiated(Duration::from_secs(6)), Ok(()));
    assert_near(s.deadline(), d(0));
    assert_eq!(
        s.renegotiated(ms(3_000)),
        Err(LossReason::TimeoutShortened(ms(3_000)))
    );
    assert_eq!(
        s.renegotiated(Duration::ZERO),
        Err(LossReason::SessionExpired)
    );
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
