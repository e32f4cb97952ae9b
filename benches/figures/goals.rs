//! The goals, each written once, as data: the report prints its text from the same entry it
//! judges the row's number with.
//!
//! Pure data and two functions of it, so `cargo test` checks them (the integration test binary
//! compiles this file too).

/// How a goal's number is written.
#[derive(Clone, Copy, Debug)]
pub enum Unit {
    /// A ratio to the named baseline, measured in the same run.
    Times(&'static str),
    Ms,
    /// Seconds beyond the TTL.
    OverTtl,
    /// 10⁶ bytes.
    Mb,
    /// Per cent of one core.
    CorePercent,
    /// A count of the named things.
    Count(&'static str),
}

#[derive(Clone, Copy, Debug)]
pub enum Bound {
    AtMost(f64),
    Below(f64),
}

/// One goal: row `row`'s value `value` must keep within `bound`.
pub struct Goal {
    pub row: &'static str,
    pub value: &'static str,
    pub bound: Bound,
    pub unit: Unit,
    /// Where the goal is set (SPEC §11, or the issue that asked for it).
    pub from: &'static str,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// The row does not carry the value (the figure was not run, or had no sample).
    NotMeasured,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "MISSED",
            Verdict::NotMeasured => "not measured",
        }
    }
}

const SPEC: &str = "SPEC §11";
const ISSUE: &str = "issue 13";

const fn goal(row: &'static str, value: &'static str, bound: Bound, unit: Unit) -> Goal {
    Goal {
        row,
        value,
        bound,
        unit,
        from: SPEC,
    }
}

const fn asked(row: &'static str, value: &'static str, bound: Bound, unit: Unit) -> Goal {
    Goal {
        row,
        value,
        bound,
        unit,
        from: ISSUE,
    }
}

/// A goal of issue 17 (the ZooKeeper backend).
const fn zk(row: &'static str, value: &'static str, bound: Bound, unit: Unit) -> Goal {
    Goal {
        row,
        value,
        bound,
        unit,
        from: "issue 17",
    }
}

/// A goal of issue 25 (ZooKeeper with leasewrap's own client: fewer round trips).
const fn zk_own(row: &'static str, value: &'static str, bound: Bound, unit: Unit) -> Goal {
    Goal {
        row,
        value,
        bound,
        unit,
        from: "issue 25",
    }
}

/// A goal of issue 33 (the database lease).
const fn db(row: &'static str, value: &'static str, bound: Bound, unit: Unit) -> Goal {
    Goal {
        row,
        value,
        bound,
        unit,
        from: "issue 33",
    }
}

/// What the database lease's goals compare with.
const ON_ETCD: &str = "leasewrap on etcd";

/// What the database fence's goal compares with: the same one-row transaction without it.
const PLAIN_TRANSACTION: &str = "the plain transaction";

use Bound::{AtMost, Below};
use Unit::{CorePercent, Count, Mb, Ms, OverTtl, Times};

pub const GOALS: &[Goal] = &[
    goal("true-etcd", "ratio", AtMost(0.4), Times("etcdctl")),
    goal("true-local", "ratio", AtMost(2.0), Times("flock")),
    asked("true-local", "ratio", AtMost(1.5), Times("flock")),
    goal("handover-exec", "median_ms", AtMost(2.0), Ms),
    asked("handover-exec", "ratio", AtMost(1.0), Times("etcdctl")),
    asked("handover-write", "ratio", AtMost(1.0), Times("etcdctl")),
    goal("takeover-2", "worst_over_ttl_s", AtMost(0.6), OverTtl),
    goal("takeover-2", "orphans", AtMost(0.0), Count("orphans")),
    goal("takeover-5", "worst_over_ttl_s", AtMost(0.6), OverTtl),
    goal("takeover-5", "orphans", AtMost(0.0), Count("orphans")),
    goal("overlap-stop", "worst_ms", AtMost(0.0), Ms),
    goal("overlap-partition", "worst_ms", AtMost(0.0), Ms),
    goal("rss", "median_mb", AtMost(8.0), Mb),
    goal("waiters", "p99_ms", AtMost(10.0), Ms),
    goal(
        "waiters",
        "store_ops_ratio",
        AtMost(1.25),
        Times("the small chain's"),
    ),
    goal("many", "per_lease_pct", Below(0.1), CorePercent),
    goal("fence-sql", "ratio", AtMost(2.5), Times(PLAIN_TRANSACTION)),
    goal(
        "fence-sql-mariadb",
        "ratio",
        AtMost(2.5),
        Times(PLAIN_TRANSACTION),
    ),
    goal("true-zk", "ratio", AtMost(1.2), Times("leasewrap on etcd")),
    goal(
        "handover-zk",
        "ratio",
        AtMost(1.2),
        Times("leasewrap on etcd"),
    ),
    zk_own(
        "handover-zk",
        "ratio",
        AtMost(1.0),
        Times("leasewrap on etcd"),
    ),
    // What one holder sent with the former client (zookeeper-client, at c2fe871).
    zk_own(
        "packets-zk",
        "median",
        AtMost(5.33),
        Count("packets a second"),
    ),
    zk("rss-zk", "median_mb", AtMost(8.0), Mb),
    db("true-pg", "ratio", AtMost(1.0), Times(ON_ETCD)),
    db("true-mariadb", "ratio", AtMost(1.0), Times(ON_ETCD)),
    db("handover-pg", "ratio", AtMost(1.2), Times(ON_ETCD)),
    db("handover-mariadb", "ratio", AtMost(1.2), Times(ON_ETCD)),
    db("rss-pg", "median_mb", AtMost(8.0), Mb),
    db("rss-mariadb", "median_mb", AtMost(8.0), Mb),
    goal("paused-etcd", "stale_accepted", AtMost(0.0), Count(STALE)),
    goal("paused-zk", "stale_accepted", AtMost(0.0), Count(STALE)),
];

/// What the paused leader's goal counts (SPEC §11: a whole-host pause: stale writes refused).
const STALE: &str = "stale writes accepted";

impl Goal {
    /// `≤ 0.4 × etcdctl`, `< 0.1 % of a core`, `0 orphans` ...; then where it is set.
    pub fn text(&self) -> String {
        let (sign, x) = match self.bound {
            AtMost(x) => ("≤ ", x),
            Below(x) => ("< ", x),
        };
        let sign = if x == 0.0 { "" } else { sign };
        let body = match self.unit {
            Times(base) => format!("{sign}{x} × {base}"),
            Ms => format!("{sign}{x} ms"),
            OverTtl => format!("{sign}TTL + {x} s"),
            Mb => format!("{sign}{x} MB"),
            CorePercent => format!("{sign}{x} % of a core"),
            Count(what) => format!("{sign}{x} {what}"),
        };
        format!("{body} ({})", self.from)
    }

    /// Judges `value`, the row's number named `self.value` (None: the row does not have it).
    pub fn judge(&self, value: Option<f64>) -> Verdict {
        let Some(v) = value else {
            return Verdict::NotMeasured;
        };
        let met = match self.bound {
            AtMost(x) => v <= x,
            Below(x) => v < x,
        };
        if met {
            Verdict::Met
        } else {
            Verdict::Missed
        }
    }
}

/// The goals of row `id`, in table order.
pub fn of(id: &str) -> impl Iterator<Item = &'static Goal> + '_ {
    GOALS.iter().filter(move |g| g.row == id)
}

#[cfg(test)]
mod tests {
    // A `harness = false` bench compiles this module too (with --cfg test), without its #[test]
    // functions: what only they use is unused there.
    #![allow(unused_imports, dead_code)]

    use super::*;

    #[test]
    fn a_goal_reads_as_its_bound_unit_and_source() {
        let text = |row| of(row).map(Goal::text).collect::<Vec<_>>();
        assert_eq!(text("true-etcd"), ["≤ 0.4 × etcdctl (SPEC §11)"]);
        assert_eq!(
            text("true-local"),
            ["≤ 2 × flock (SPEC §11)", "≤ 1.5 × flock (issue 13)"]
        );
        assert_eq!(text("many"), ["< 0.1 % of a core (SPEC §11)"]);
        assert_eq!(
            text("takeover-2"),
            ["≤ TTL + 0.6 s (SPEC §11)", "0 orphans (SPEC §11)"]
        );
        assert_eq!(text("overlap-stop"), ["0 ms (SPEC §11)"]);
        assert!(text("no-such-row").is_empty());
    }

    #[test]
    fn at_most_includes_its_bound_and_below_excludes_it() {
        let at_most = goal("r", "v", AtMost(2.0), Ms);
        assert_eq!(at_most.judge(Some(2.0)), Verdict::Met);
        assert_eq!(at_most.judge(Some(2.01)), Verdict::Missed);
        let below = goal("r", "v", Below(0.1), CorePercent);
        assert_eq!(below.judge(Some(0.099)), Verdict::Met);
        assert_eq!(below.judge(Some(0.1)), Verdict::Missed);
    }

    #[test]
    fn a_missing_value_is_not_measured_rather_than_met() {
        assert_eq!(GOALS[0].judge(None), Verdict::NotMeasured);
        assert_eq!(Verdict::NotMeasured.word(), "not measured");
    }

    #[test]
    fn every_goal_has_a_row_and_a_value_name() {
        for g in GOALS {
            assert!(!g.row.is_empty() && !g.value.is_empty(), "{}", g.text());
        }
    }
}
