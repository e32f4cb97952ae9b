//! The ZooKeeper model's runs: what must hold, and the rules that must be found broken.

use crate::zk::{Faults, Rule, Zk};
use crate::{check, deep, HANDED_OVER, HEALTHY, OVERLAP, RENEWED};

const CUTS: Faults = Faults {
    most: 1,
    cuts: true,
    leader_pauses: false,
    processes: false,
};

fn zk(rule: Rule, faults: Faults, horizon: u32) -> Zk {
    Zk {
        rule,
        twin: None,
        faults,
        delay: 1,
        link_delay: u32::from(deep()),
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

#[test]
fn zk_the_rule_never_runs_two_children_at_once() {
    let faults = Faults {
        most: if deep() { 2 } else { 1 },
        processes: true,
        ..CUTS
    };
    let horizon = if deep() { 24 } else { 20 };
    let run = check("zk rule", zk(Rule::LookSyncCheck, faults, horizon));
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
        ..CUTS
    };
    for tick_known in [true, false] {
        let model = Zk {
            tick_known,
            ..zk(Rule::LookSyncCheck, faults, if deep() { 24 } else { 20 })
        };
        let run = check(
            &format!("zk rule, leader paused, tickTime known: {tick_known}"),
            model,
        );
        run.holds(OVERLAP);
        run.reaches(HANDED_OVER);
    }
}

#[test]
fn zz_twin_no_relay() {
    let faults = Faults { most: 1, processes: true, ..CUTS };
    let m = Zk { twin: Some(leasewrap::lease::timing::Twin::NoRelayWait), ..zk(Rule::LookSyncCheck, faults, 20) };
    let run = check("twin no relay", m);
    run.breaks(OVERLAP);
}

#[test]
fn zz_twin_d_from_check() {
    let faults = Faults { most: 1, processes: true, ..CUTS };
    let m = Zk { twin: Some(leasewrap::lease::timing::Twin::DFromCheck), ..zk(Rule::LookSyncCheck, faults, 20) };
    let run = check("twin d from check", m);
    run.breaks(OVERLAP);
}
