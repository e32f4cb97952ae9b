//! The database model's runs: what must hold, and the twins that must be found broken.

use leasewrap::lease::timing::Twin;

use crate::db::{Db, Faults};
use crate::{check, deep, twin_breaks, FENCED, HANDED_OVER, HEALTHY, OVERLAP, REFUSED, RENEWED};

/// leasewrap paused once, and one statement or answer late (a holder's: or lost).
const PAUSED: Faults = Faults {
    most: 1,
    processes: true,
    hosts: false,
    slow: 1,
};

/// Messages come at once unless held back.
fn db(faults: Faults, horizon: u32) -> Db {
    Db {
        twin: None,
        faults,
        delay: 0,
        horizon,
    }
}

#[test]
fn db_holders_on_a_healthy_server_never_lose_the_lease() {
    let model = Db {
        delay: 0,
        ..db(
            Faults {
                most: 0,
                slow: 0,
                ..PAUSED
            },
            30,
        )
    };
    let run = check("db healthy", model);
    run.holds(HEALTHY);
    run.reaches(RENEWED);
}

/// A holder paused or partitioned, statements and answers late: the waiter takes over only
/// after the holder's child is dead.
#[test]
fn db_the_rule_never_runs_two_children_at_once() {
    let run = check("db rule", db(PAUSED, 24));
    run.holds(OVERLAP);
    run.reaches(HANDED_OVER);
}

/// The same with two messages late, or with a delay of a tick on every message (deep sizes).
#[test]
fn db_the_rule_never_runs_two_children_at_once_with_more_delays() {
    let slower = Db {
        delay: u32::from(deep()),
        ..db(Faults { slow: 2, ..PAUSED }, 24)
    };
    let run = check("db rule, more delays", slower);
    run.holds(OVERLAP);
    run.reaches(HANDED_OVER);
}

/// A whole host paused past its deadline: its child runs on a moment when it resumes, and the
/// fence refuses what it writes after the newer holder.
#[test]
fn db_a_paused_host_is_refused_by_the_fence() {
    let faults = Faults {
        processes: false,
        hosts: true,
        slow: 0,
        ..PAUSED
    };
    let run = check("db host paused", db(faults, 24));
    run.holds(OVERLAP);
    run.holds(FENCED);
    run.reaches(REFUSED);
}

#[test]
fn db_a_holder_counting_d_from_the_answer_runs_two_children_at_once() {
    let timeline = twin_breaks("db D from the answer", db(PAUSED, 24), Twin::DbDFromAnswer);
    assert!(timeline.contains("gets its renewal's answer"), "{timeline}");
}

#[test]
fn db_a_waiter_counting_from_its_reads_send_runs_two_children_at_once() {
    let model = db(PAUSED, 24);
    let timeline = twin_breaks("db watch from the send", model, Twin::DbWatchFromSend);
    assert!(timeline.contains("read is held back"), "{timeline}");
}
