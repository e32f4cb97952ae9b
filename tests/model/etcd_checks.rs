//! The etcd model's runs: what must hold, and the rules that must be found broken.

use crate::etcd::{Etcd, Faults, Keeper, Release};
use crate::{check, deep, HANDED_OVER, HEALTHY, OVERLAP, RENEWED};

fn etcd(keeper: Keeper, release: Release, faults: Faults, horizon: u32) -> Etcd {
    Etcd {
        keeper,
        release,
        twin: None,
        faults,
        delay: 1,
        horizon,
    }
}

const MEMBERS: Faults = Faults {
    most: 1,
    stuck: true,
    paused: true,
    processes: false,
    hosts: false,
};

#[test]
fn etcd_holders_through_a_healthy_cluster_never_lose_the_lease() {
    let model = Etcd {
        delay: 0,
        ..etcd(
            Keeper::EveryMember,
            Release::Fixed,
            Faults { most: 0, ..MEMBERS },
            30,
        )
    };
    let run = check("etcd healthy", model);
    run.holds(HEALTHY);
    run.reaches(RENEWED);
}

#[test]
fn etcd_f14_first_rule_runs_two_children_at_once_when_a_stuck_leader_comes_back() {
    let run = check(
        "etcd first rule, etcd < 3.5.13",
        etcd(Keeper::FirstRule, Release::Old, MEMBERS, 24),
    );
    let timeline = run.breaks(OVERLAP);
    assert!(timeline.contains("revoked"), "{timeline}");
}

#[test]
fn etcd_the_rule_never_runs_two_children_at_once() {
    let faults = Faults {
        most: if deep() { 2 } else { 1 },
        processes: true,
        ..MEMBERS
    };
    let run = check(
        "etcd rule, etcd >= 3.5.13",
        etcd(
            Keeper::Sidecar,
            Release::Fixed,
            faults,
            if deep() { 20 } else { 24 },
        ),
    );
    run.holds(OVERLAP);
    run.reaches(RENEWED);
    run.reaches(HANDED_OVER);
}

#[test]
fn etcd_the_former_sidecar_alone_runs_two_children_at_once_when_a_stuck_leader_comes_back() {
    let run = check(
        "etcd sidecar, etcd < 3.5.13",
        etcd(Keeper::Sidecar, Release::Old, MEMBERS, 24),
    );
    let timeline = run.breaks(OVERLAP);
    assert!(timeline.contains("revoked"), "{timeline}");
}

#[test]
fn etcd_a_keepalive_to_every_member_never_runs_two_children_at_once_when_one_is_stuck() {
    let faults = Faults {
        paused: false,
        ..MEMBERS
    };
    let run = check(
        "etcd every member, etcd < 3.5.13, stuck members",
        etcd(
            Keeper::EveryMember,
            Release::Old,
            faults,
            if deep() { 20 } else { 14 },
        ),
    );
    run.holds(OVERLAP);
    run.reaches(HANDED_OVER);
}

#[test]
fn zz_twin_arrival() {
    let faults = Faults { most: 2, processes: true, ..MEMBERS };
    let m = Etcd { twin: Some(leasewrap::lease::timing::Twin::DFromArrival), ..etcd(Keeper::FirstRule, Release::Fixed, faults, 20) };
    let run = check("twin arrival", m);
    run.breaks(OVERLAP);
}

#[test]
fn zz_twin_term() {
    let faults = Faults { most: 2, processes: true, ..MEMBERS };
    let m = Etcd { twin: Some(leasewrap::lease::timing::Twin::NoTermCheck), ..etcd(Keeper::FirstRule, Release::Fixed, faults, 20) };
    let run = check("twin term", m);
    run.breaks(OVERLAP);
}
