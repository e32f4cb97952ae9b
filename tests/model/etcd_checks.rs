//! The etcd model's runs: what must hold, and the rules that must be found broken.

use leasewrap::lease::timing::Twin;

use crate::etcd::{Etcd, Faults, Keeper, Release};
use crate::{check, deep, twin_breaks, HANDED_OVER, HEALTHY, OVERLAP, RENEWED};

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
    slow: 0,
};

/// Members stuck in fsync only: what a keepalive to every member covers, and the rules before it
/// did not (a paused member no client covers, docs/quorum.md).
const STUCK: Faults = Faults {
    paused: false,
    ..MEMBERS
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
        etcd(Keeper::FirstRule, Release::Old, STUCK, 24),
    );
    let timeline = run.breaks(OVERLAP);
    assert!(timeline.contains("revoked"), "{timeline}");
}

/// The rule itself (no keepalives to the other members: on a fixed release they only make a
/// lessor's view fresher), against a member stuck or paused, or the holder's leasewrap paused,
/// and a renewal's request or reply held back to the edge of its due time.
#[test]
fn etcd_the_rule_never_runs_two_children_at_once() {
    let faults = Faults {
        most: if deep() { 2 } else { 1 },
        processes: true,
        slow: 1,
        ..MEMBERS
    };
    let horizon = 14;
    let run = check(
        "etcd rule, etcd >= 3.5.13",
        etcd(Keeper::FirstRule, Release::Fixed, faults, horizon),
    );
    run.holds(OVERLAP);
    run.reaches(RENEWED);
    run.reaches(HANDED_OVER);
}

#[test]
fn etcd_the_former_sidecar_alone_runs_two_children_at_once_when_a_stuck_leader_comes_back() {
    let run = check(
        "etcd sidecar, etcd < 3.5.13",
        etcd(Keeper::Sidecar, Release::Old, STUCK, 24),
    );
    let timeline = run.breaks(OVERLAP);
    assert!(timeline.contains("revoked"), "{timeline}");
}

#[test]
fn etcd_a_keepalive_to_every_member_never_runs_two_children_at_once_when_one_is_stuck() {
    let run = check(
        "etcd every member, etcd < 3.5.13, stuck members",
        etcd(
            Keeper::EveryMember,
            Release::Old,
            STUCK,
            if deep() { 18 } else { 14 },
        ),
    );
    run.holds(OVERLAP);
    run.reaches(HANDED_OVER);
}

/// D counted from the confirming read's arrival: a reply held back to the edge of its due time
/// moves D past the leader's expiry by more than the margin. The rule holds with these faults
/// (`etcd_the_rule_never_runs_two_children_at_once` has them all, and more).
#[test]
fn etcd_d_counted_from_the_reads_arrival_runs_two_children_at_once() {
    let faults = Faults {
        most: 1,
        stuck: false,
        paused: false,
        processes: true,
        slow: 1,
        ..MEMBERS
    };
    let model = etcd(Keeper::FirstRule, Release::Fixed, faults, 14);
    let timeline = twin_breaks("etcd D from the read's arrival", model, Twin::DFromArrival);
    assert!(timeline.contains("held back"), "{timeline}");
}

/// No term check: a stuck leader's lessor answers a keepalive the new leader never sees, and
/// the read, served once it runs again, comes back in the new term.
#[test]
fn etcd_without_the_term_check_a_deposed_leaders_keepalive_runs_two_children_at_once() {
    let faults = Faults {
        most: 2,
        paused: false,
        processes: true,
        ..MEMBERS
    };
    let model = etcd(Keeper::FirstRule, Release::Fixed, faults, 11);
    check("etcd two faults", model.clone()).holds(OVERLAP);
    let timeline = twin_breaks("etcd without the term check", model, Twin::NoTermCheck);
    assert!(
        timeline.contains("term 1") && timeline.contains("term 2"),
        "{timeline}"
    );
}
