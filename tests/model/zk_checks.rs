//! The ZooKeeper model's runs: what must hold, and the rules that must be found broken.

use leasewrap::lease::timing::Twin;

use crate::zk::{Faults, Rule, Zk};
use crate::{check, deep, twin_breaks, HANDED_OVER, HEALTHY, OVERLAP, RENEWED};

const CUTS: Faults = Faults {
    most: 1,
    cuts: true,
    leader_pauses: false,
    processes: false,
    moves: false,
    slow: 0,
    links: 0,
};

fn zk(rule: Rule, faults: Faults, horizon: u32) -> Zk {
    Zk {
        rule,
        twin: None,
        faults,
        delay: 1,
        link_delay: 0,
        tick_known: true,
        horizon,
    }
}

#[test]
fn zk_holders_through_a_healthy_ensemble_never_lose_the_lease() {
    let model = Zk {
        delay: 0,
        link_delay: 0,
        ..zk(Rule::LookSyncCheck, Faults { most: 0, ..CUTS }, 30)
    };
    let run = check("zk healthy", model);
    run.holds(HEALTHY);
    run.reaches(RENEWED);
}

#[test]
fn zk_counting_d_from_the_latest_write_runs_two_children_at_once() {
    let run = check("zk latest write", zk(Rule::LatestWrite, CUTS, 24));
    let timeline = run.breaks(OVERLAP);
    assert!(
        timeline.contains("F1's links to the leader are cut"),
        "{timeline}"
    );
}

/// A follower cut off or a holder's leasewrap paused, and a Look, Sync or Check (or its answer)
/// held back until just before the stop time.
#[test]
fn zk_the_rule_never_runs_two_children_at_once() {
    let faults = Faults {
        processes: true,
        slow: 1,
        ..CUTS
    };
    let faults = Faults {
        links: if deep() { 2 } else { 0 },
        ..faults
    };
    let run = check("zk rule", zk(Rule::LookSyncCheck, faults, 14));
    run.holds(OVERLAP);
    run.reaches(RENEWED);
    run.reaches(HANDED_OVER);
}

/// docs/zookeeper.md §9 names the leader's PING cadence as the rule's one timing assumption,
/// which a paused leader breaks. The model finds no overlap all the same: a renewal must be done
/// within Δ + TTL/4 of its Look, so a pause long enough to let the leader expire the session on
/// a touch older than the Look fails the renewal instead.
#[test]
fn zk_a_paused_leader_never_runs_two_children_at_once() {
    let faults = Faults {
        leader_pauses: true,
        cuts: false,
        links: if deep() { 2 } else { 0 },
        ..CUTS
    };
    for tick_known in [true, false] {
        let model = Zk {
            tick_known,
            ..zk(Rule::LookSyncCheck, faults, 14)
        };
        let run = check(
            &format!("zk rule, leader paused, tickTime known: {tick_known}"),
            model,
        );
        run.holds(OVERLAP);
        run.reaches(HANDED_OVER);
    }
}

/// A session moved to a member that negotiates a shorter timeout, and a renewal held back
/// until the stop time: `D` must come down to the reconnect plus the new timeout.
#[test]
fn zk_a_move_to_a_shorter_timeout_that_keeps_d_runs_two_children_at_once() {
    let faults = Faults {
        cuts: false,
        moves: true,
        slow: 1,
        links: if deep() { 2 } else { 0 },
        ..CUTS
    };
    let model = zk(Rule::LookSyncCheck, faults, 12);
    check("zk move", model.clone()).holds(OVERLAP);
    let timeline = twin_breaks("zk move, D kept", model, Twin::MoveKeepsD);
    assert!(timeline.contains("negotiates a timeout"), "{timeline}");
}

/// The Sync sent as soon as the Look is answered: the leader's PING that carries the Look's
/// touch may come after the Check, and never, once the follower is cut off. The rule holds
/// with these faults (`zk_the_rule_never_runs_two_children_at_once` has them, and more).
#[test]
fn zk_a_sync_sent_without_waiting_for_the_leaders_ping_runs_two_children_at_once() {
    let model = zk(Rule::LookSyncCheck, CUTS, 14);
    let timeline = twin_breaks("zk Sync without Δ", model, Twin::NoRelayWait);
    assert!(timeline.contains("cut"), "{timeline}");
}

/// D counted from the Check's send: the Look's touch is the last the leader is sure to have.
/// The rule holds with these faults, as above.
#[test]
fn zk_d_counted_from_the_check_runs_two_children_at_once() {
    let model = zk(Rule::LookSyncCheck, CUTS, 14);
    let timeline = twin_breaks("zk D from the Check", model, Twin::DFromCheck);
    assert!(timeline.contains("cut"), "{timeline}");
}
