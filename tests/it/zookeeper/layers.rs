//! The ZooKeeper client's own layers, each at its seam, against the scripted server
//! (`support::zkfake`): the session (requests, answers out of order, moves, -124, a move
//! answered with another session id, its record of shorter timeouts) and the keeper (a Check
//! whose op failed, a move made before it started). The `seams` feature makes these modules
//! public to the tests alone.

use std::time::Duration;

use leasewrap::clock::BootInstant;
use leasewrap::lease::timing::zk::{round_trip_allowance, ZkSchedule};
use leasewrap::lease::timing::Params;
use leasewrap::lease::zk::keeper::Keeper;
use leasewrap::lease::zk::lock::Own;
use leasewrap::lease::zk::net::Reach;
use leasewrap::lease::zk::session::{self, Options, State, Zk, ZkError};
use leasewrap::lease::zk::wire::{Acl, Mode};
use leasewrap::lease::LossReason;

use crate::support::block_on;
use crate::support::zkfake::{Cue, FakeZk};

const MIN: i32 = 400;
const MAX: i32 = 8000;
const BOUND: Duration = Duration::from_secs(10);

/// A session on the fake's members in order from a random one, asking `timeout`.
async fn open(fake: &FakeZk, members: usize, timeout: Duration) -> Zk {
    let opts = Options {
        members: (0..members).map(|i| fake.addr(i)).collect(),
        chroot: String::new(),
        timeout,
        dial: Duration::from_secs(2),
        reach: Reach::default(),
    };
    match session::open(opts).await {
        Ok(zk) => zk,
        Err(refusals) => panic!("no session: {refusals:?}"),
    }
}

/// Wait, without blocking the session's task, until `cond` holds of the session's state.
async fn until_state(zk: &Zk, what: &str, cond: impl Fn(&State) -> bool) -> State {
    let mut states = zk.states();
    let wait = async {
        loop {
            let now = zk.state();
            if cond(&now) {
                return now;
            }
            let _ = states.changed().await;
        }
    };
    match tokio::time::timeout(BOUND, wait).await {
        Ok(state) => state,
        Err(_) => panic!("timed out waiting for {what}: {:?}", zk.state()),
    }
}

fn epoch(state: &State) -> Option<(u32, Duration)> {
    match state {
        State::Connected(c) => Some((c.epoch, c.timeout)),
        _ => None,
    }
}

/// Answers out of order end the connection: every request in flight fails with ConnectionLoss
/// (none gets another's answer), the session moves, and serves again.
#[test]
fn answers_out_of_order_end_the_connection_and_no_request_gets_anothers_answer() {
    let fake = FakeZk::start(1, MIN, MAX);
    block_on(async {
        let zk = open(&fake, 1, Duration::from_secs(4)).await;
        fake.cue(0, Cue::OutOfOrder);
        let (root, _) = zk.exists("/", false);
        let (none, _) = zk.exists("/none", false);
        let (root, none) = tokio::join!(root, none);
        assert!(matches!(root, Err(ZkError::ConnectionLoss(_))), "{root:?}");
        assert!(matches!(none, Err(ZkError::ConnectionLoss(_))), "{none:?}");
        fake.lift(0);
        until_state(&zk, "the session back", |s| {
            epoch(s).is_some_and(|e| e.0 == 2)
        })
        .await;
        let (root, _) = zk.exists("/", false);
        assert!(root.await.expect("answered").0.is_some());
    });
}

/// The session's own record of the connections that negotiated a shorter timeout than every
/// one before them: a move to 4 s is in it, the move back to 8 s is not, the second move to 4 s
/// neither (no shorter than the first).
#[test]
fn the_session_keeps_every_connection_that_shortened_its_timeout() {
    let fake = FakeZk::start(2, MIN, MAX);
    fake.bounds(1, MIN, 4000);
    fake.cue(1, Cue::NotServing);
    block_on(async {
        let zk = open(&fake, 2, Duration::from_secs(8)).await;
        fake.lift(1);
        for (on, timeout) in [(1, 4000), (0, 8000), (1, 4000)] {
            let epoch_now = epoch(&zk.state()).expect("connected").0;
            fake.drop_connections(1 - on);
            let want = Duration::from_millis(timeout);
            until_state(&zk, "the move", |s| epoch(s) == Some((epoch_now + 1, want))).await;
        }
        let shorter: Vec<_> = zk
            .shorter_after(0)
            .iter()
            .map(|c| (c.epoch, c.timeout))
            .collect();
        assert_eq!(
            shorter,
            [(1, Duration::from_secs(8)), (2, Duration::from_secs(4))]
        );
        assert_eq!(zk.shorter_after(2), []);
    });
}

/// -124 (the ensemble requires SASL) ends the session as refused credentials, naming the flag.
#[test]
fn minus_124_ends_the_session_as_refused_credentials() {
    let fake = FakeZk::start(1, MIN, MAX);
    block_on(async {
        let zk = open(&fake, 1, Duration::from_secs(4)).await;
        fake.cue(0, Cue::RequireSasl);
        let (root, _) = zk.exists("/", false);
        let e = root.await.expect_err("refused");
        assert!(e.to_string().contains("--zk-auth sasl"), "{e}");
        let state = until_state(&zk, "the end", |s| matches!(s, State::AuthFailed(_))).await;
        assert!(matches!(state, State::AuthFailed(why) if why.contains("SASL")));
    });
}

/// A move answered with another session id: ours is lost.
#[test]
fn a_move_answered_with_another_session_id_is_an_expired_session() {
    let fake = FakeZk::start(2, MIN, MAX);
    fake.cue(1, Cue::NotServing);
    block_on(async {
        let zk = open(&fake, 2, Duration::from_secs(4)).await;
        fake.lift(1);
        fake.cue(1, Cue::OtherSessionId);
        fake.cue(0, Cue::NotServing);
        fake.drop_connections(0);
        until_state(&zk, "the session's end", |s| *s == State::Expired).await;
    });
}

/// The lease of a session on the fake with its own node made: the schedule counted from its
/// first connection, as `Zk::queue` makes it (tickTime 200 ms, a round trip's room).
async fn lease(zk: &Zk, ttl: Duration) -> (Own, ZkSchedule) {
    let first = zk.shorter_after(0).remove(0);
    let params = Params {
        ttl,
        kill_after: Some(Duration::from_millis(500)),
        margin: Some(Duration::from_millis(300)),
        drift: 0.1,
    };
    let tick = Some(Duration::from_millis(200));
    let room = round_trip_allowance(Duration::ZERO);
    let schedule = ZkSchedule::connected_within(params, first.sent, first.timeout, tick, room)
        .expect("the rule fits");
    let all = [Acl::anyone(31)];
    let (path, stat) = zk
        .create("/lock-", b"", &all, Mode::EphemeralSequential)
        .await
        .expect("the own node");
    let own = Own {
        path,
        czxid: stat.czxid,
    };
    (own, schedule)
}

/// A move to a member with a shorter timeout made before the keeper started (while the probe
/// for tickTime was out) lowers `D` the moment the keeper starts.
#[test]
fn a_keeper_started_after_a_move_counts_with_its_shorter_timeout() {
    let fake = FakeZk::start(2, MIN, MAX);
    fake.bounds(1, MIN, 4000);
    fake.cue(1, Cue::NotServing);
    block_on(async {
        let zk = open(&fake, 2, Duration::from_secs(8)).await;
        let (own, schedule) = lease(&zk, Duration::from_secs(8)).await;
        let counted = schedule.deadline();
        fake.lift(1);
        fake.drop_connections(0);
        let moved = until_state(&zk, "the move", |s| epoch(s).is_some_and(|e| e.0 == 2)).await;
        let State::Connected(c) = moved else {
            unreachable!()
        };
        let keeper = Keeper::start(zk.clone(), own, schedule, 1);
        let bound = c.sent + Duration::from_secs_f64(4.0 / 1.1) - Duration::from_millis(300);
        let d = keeper.now().deadline;
        assert!(d < counted, "D was not lowered");
        assert!(d <= bound + Duration::from_micros(1), "{d:?} > {bound:?}");
        keeper.stop();
    });
}

/// Only a Check whose op succeeded renews: -112 inside the multi (the header OK) loses the
/// lease as an expired session; -2 is a failed step, `D` unmoved and trouble said.
#[test]
fn a_keeper_renews_only_on_a_checks_own_success() {
    let fake = FakeZk::start(1, MIN, MAX);
    block_on(async {
        let zk = open(&fake, 1, Duration::from_secs(4)).await;
        let (own, schedule) = lease(&zk, Duration::from_secs(4)).await;
        fake.cue(0, Cue::FailChecks(-2));
        let mut keeper = Keeper::start(zk.clone(), own.clone(), schedule, 1);
        let first = keeper.now().deadline;
        let troubled = tokio::time::timeout(BOUND, async {
            loop {
                let state = keeper.changed().await;
                if state.trouble.is_some() || state.lost.is_some() {
                    return state;
                }
            }
        });
        let state = troubled.await.expect("trouble within the bound");
        assert_eq!(state.deadline, first, "{state:?}");
        assert!(state.lost.is_none(), "{state:?}");
        fake.lift(0);
        fake.cue(0, Cue::FailChecks(-112));
        let lost = tokio::time::timeout(BOUND, async {
            loop {
                if let Some(why) = keeper.changed().await.lost {
                    return why;
                }
            }
        });
        assert_eq!(
            lost.await.expect("lost within the bound"),
            LossReason::SessionExpired
        );
        assert!(
            BootInstant::now() < keeper.now().stop_at,
            "lost at its stop time, not at -112"
        );
    });
}
