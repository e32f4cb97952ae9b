//! F14: renewals the quorum vouches for (docs/quorum.md), on 3-member etcd 3.4 and 3.5 clusters
//! whose members keep their data on FUSE stall filesystems.
//!
//! A member "stuck in fdatasync" (etcd#15247) keeps answering keepalives from its stale lessor
//! while the other two elect a leader that expires the lease. Each scenario runs holder A (its
//! child beats every 20 ms) and waiter B, puts the fault on half a TTL into A's second renewal
//! interval, and keeps it for 2 x TTL and, when A's child is dead by then, until B's child starts:
//! the fault lasts over the whole window in which the two could overlap. The assertion is the
//! one of F2: A's child is dead before B's starts (every beat of A's precedes B's start), and the
//! overlap check runs on every poll while the fault lasts and after.

use super::*;

/// The TTL of the fault scenarios: that of the reproduction in the issue, long enough that an
/// election (1 s of etcd's defaults) fits in one renewal's slack.
const F14_TTL: Duration = Duration::from_secs(5);

/// How long a fault may have to last before B's child starts (election, TTL, 1 s of etcd's
/// promotion extension, on a loaded box).
const FAULT_BOUND: Duration = Duration::from_secs(30);

on_both_versions!(
    holder_on_a_stalled_leader_alone_is_dead_before_the_waiter_on_a_follower_starts,
    holder_on_every_member_leaves_a_stalled_leader_and_never_overlaps,
    holder_on_a_stalled_follower_alone_is_dead_before_the_waiter_starts,
    holder_on_a_stopped_leader_alone_is_dead_before_the_waiter_on_a_follower_starts,
    holders_through_each_member_of_a_healthy_cluster_never_lose_the_lease,
    waiter_watching_a_stalled_follower_takes_over_while_it_stays_stalled,
    every_member_gets_a_keepalive_with_each_renewal,
);

/// leasewrap on `endpoints` for lease `job` under `prefix`, at the scenarios' TTL, logging INFO.
fn f14_job(endpoints: &str, prefix: &str) -> Leasewrap {
    let ttl = format!("{}s", F14_TTL.as_secs());
    Leasewrap::new()
        .on_etcd(endpoints, prefix)
        .name("job")
        .args(&["--ttl", &ttl, "-vv"])
}

/// What happens to the member A talks to first.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The leader's disk sticks in fsync.
    StallLeader,
    /// A follower's disk sticks in fsync.
    StallFollower,
    /// The leader is SIGSTOPped.
    StopLeader,
}

/// Which endpoints A is given.
#[derive(Clone, Copy, Debug)]
enum Reach {
    /// Only the faulty member's.
    Alone,
    /// Every member's, the faulty one first (the one leasewrap renews through first).
    All,
}

/// How the scenario ended for A.
enum Ending {
    /// A's child was stopped and B's started after it: the gap between A's last beat and B's
    /// start, in ms.
    TakenOver { gap_ms: f64, exit: Option<i32> },
    /// A kept the lease through the fault (renewing through another member), then ended so.
    KeptHolding { exit: Option<i32> },
}

struct Scenario {
    cluster: Cluster,
    faulty: usize,
    fault: Fault,
    a: Job,
    b: Job,
}

impl Scenario {
    #[track_caller]
    fn start(v: Version, fault: Fault, reach: Reach, label: &str) -> (Scenario, Sandbox) {
        let cluster = Cluster::start_stallable(v);
        let leader = cluster.leader_index();
        let faulty = match fault {
            Fault::StallFollower => (leader + 1) % Cluster::SIZE,
            Fault::StallLeader | Fault::StopLeader => leader,
        };
        let waiter_on = (0..Cluster::SIZE).find(|&i| i != faulty && i != leader);
        let waiter_on = waiter_on.expect("three members");
        let holder_on = match reach {
            Reach::Alone => cluster.endpoint(faulty),
            Reach::All => {
                let rest = (1..Cluster::SIZE).map(|k| cluster.endpoint((faulty + k) % 3));
                std::iter::once(cluster.endpoint(faulty))
                    .chain(rest)
                    .collect::<Vec<_>>()
                    .join(",")
            }
        };
        let prefix = etcd::unique_prefix(label);
        let sb = Sandbox::new();
        let lw = |endpoints: &str| f14_job(endpoints, &prefix);
        let a = Job::spawn(lw(&holder_on), Marks::new(&sb, "a"), true);
        a.child();
        let b = lw(&cluster.endpoint(waiter_on)).args(&["-w", "120s"]);
        let b = Job::spawn(b, Marks::new(&sb, "b"), false);
        wait_for_key_count(&cluster, &prefix, 2, STARTUP);
        let s = Scenario {
            cluster,
            faulty,
            fault,
            a,
            b,
        };
        (s, sb)
    }

    fn fault_on(&self) {
        match self.fault {
            Fault::StallLeader | Fault::StallFollower => self.cluster.stall(self.faulty),
            Fault::StopLeader => self.cluster.signal(self.faulty, Signal::SIGSTOP),
        }
    }

    fn fault_off(&self) {
        match self.fault {
            Fault::StallLeader | Fault::StallFollower => self.cluster.release(self.faulty),
            Fault::StopLeader => self.cluster.signal(self.faulty, Signal::SIGCONT),
        }
    }

    /// Panics, with both holders' stderr, if B's child has started while A's runs.
    #[track_caller]
    fn assert_no_overlap(&self, a_child: i32) {
        assert_no_overlap(&self.a, &self.b, a_child, &format!("{:?}", self.fault));
    }

    /// Keeps the fault on for 2 x TTL, and longer while A's child is dead and B's not started
    /// yet (bounded), checking for overlap on every poll.
    #[track_caller]
    fn through_the_fault(&self, a_child: i32) {
        let began = Instant::now();
        loop {
            self.assert_no_overlap(a_child);
            let settled = self.b.marks.started() || pid_alive(a_child);
            if began.elapsed() >= 2 * F14_TTL && settled {
                return;
            }
            assert!(
                began.elapsed() < FAULT_BOUND,
                "{:?}: A's child is dead and B's has not started {FAULT_BOUND:?} into the fault\n\
                 --- B's stderr ---\n{}",
                self.fault,
                self.b.run.stderr()
            );
            thread::sleep(POLL);
        }
    }

    /// After the fault: B took over, or A kept the lease; either way A's child never beat after
    /// B's started.
    #[track_caller]
    fn ending(&mut self, a_child: i32) -> Ending {
        let kept = pid_alive(a_child) && !self.b.marks.started();
        if kept {
            // Let A's run end; B then takes over, after A's child's last beat.
            let watch_until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < watch_until {
                self.assert_no_overlap(a_child);
                thread::sleep(POLL);
            }
            self.a.release();
        }
        let exit = self.a.wait(STARTUP).code();
        wait_until(FAULT_BOUND, "B's child to start", || self.b.marks.started());
        let b_start = read_ns(&self.b.marks.start);
        let last_beat = last_beat_ns(&self.a.marks.beat);
        assert!(
            last_beat < b_start,
            "A's child beat {:.1} ms after B's child started",
            ms(last_beat - b_start)
        );
        assert!(!pid_alive(a_child), "A's child outlived A");
        if kept {
            // 124 too: when a stuck leader of etcd < 3.5.8 resumes, it revokes every lease it
            // thinks expired (etcd#15247, #12528), and the holder then stops its child.
            let ok = matches!(exit, Some(0 | 124));
            assert!(ok, "A exited {exit:?}{}", self.a.run.stderr());
            return Ending::KeptHolding { exit };
        }
        assert_eq!(
            exit,
            Some(124),
            "A's lease was lost: 124\n{}",
            self.a.run.stderr()
        );
        Ending::TakenOver {
            gap_ms: ms(b_start - last_beat),
            exit,
        }
    }
}

/// Runs one fault scenario to its end and reports the figures.
#[track_caller]
fn no_overlap_under(v: Version, fault: Fault, reach: Reach, label: &str) {
    let started = Instant::now();
    let (mut s, _sb) = Scenario::start(v, fault, reach, label);
    let a_child = s.a.child();
    into_the_second_renewal_interval_of(&s.a, F14_TTL);
    s.fault_on();
    s.through_the_fault(a_child);
    s.fault_off();
    let ending = s.ending(a_child);
    // A holder that can reach only the faulty member has no member left to vouch for it: had
    // it kept the lease, the fault never took effect and the scenario proved nothing.
    if matches!(reach, Reach::Alone) {
        assert!(
            matches!(ending, Ending::TakenOver { .. }),
            "{fault:?}: A, alone on the faulty member, kept its lease: the fault did not take effect\n{}",
            s.a.run.stderr()
        );
    }
    s.b.release();
    // B may lose its lease to the resumed stale leader (etcd#15247): then it stops its child.
    let b_exit = s.b.wait(STARTUP).code();
    assert!(
        matches!(b_exit, Some(0 | 124)),
        "B exited {b_exit:?}{}",
        s.b.run.stderr()
    );
    let how = match ending {
        Ending::TakenOver { gap_ms, exit } => format!(
            "A's child stopped (exit {exit:?}), B's started {gap_ms:.0} ms after A's last beat"
        ),
        Ending::KeptHolding { exit } => {
            format!("A kept the lease through the fault (then exit {exit:?}); no overlap")
        }
    };
    eprintln!(
        "F14 etcd {} {fault:?} {reach:?}: {how}; B exit {b_exit:?}; scenario took {:.1} s",
        v.number(),
        started.elapsed().as_secs_f64()
    );
}

/// Half a TTL into the child's second renewal interval (as `into_the_second_renewal_interval`,
/// for another TTL): a point in the scenario, not a wait for calm.
fn into_the_second_renewal_interval_of(job: &Job, ttl: Duration) {
    let at = read_ns(&job.marks.start) + ttl.as_nanos() as i128 / 2;
    let left = u64::try_from(at - now_ns()).unwrap_or(0);
    thread::sleep(Duration::from_nanos(left));
}

fn holder_on_a_stalled_leader_alone_is_dead_before_the_waiter_on_a_follower_starts(v: Version) {
    no_overlap_under(v, Fault::StallLeader, Reach::Alone, "f14_leader");
}

fn holder_on_every_member_leaves_a_stalled_leader_and_never_overlaps(v: Version) {
    no_overlap_under(v, Fault::StallLeader, Reach::All, "f14_all");
}

fn holder_on_a_stalled_follower_alone_is_dead_before_the_waiter_starts(v: Version) {
    no_overlap_under(v, Fault::StallFollower, Reach::Alone, "f14_follower");
}

fn holder_on_a_stopped_leader_alone_is_dead_before_the_waiter_on_a_follower_starts(v: Version) {
    no_overlap_under(v, Fault::StopLeader, Reach::Alone, "f14_stopped");
}

/// Holder A on the leader alone; waiter B on every member but the leader, a follower first, so
/// its watch on the key ahead sits on that follower. The follower's disk sticks, then A is
/// SIGKILLed: the leader expires A's lease, and the stuck follower never tells B's watch. B must
/// still take over while the follower stays stuck, by looking through the other member.
fn waiter_watching_a_stalled_follower_takes_over_while_it_stays_stalled(v: Version) {
    let cluster = Cluster::start_stallable(v);
    let leader = cluster.leader_index();
    let stuck = (leader + 1) % Cluster::SIZE;
    let sb = Sandbox::new();
    let (mut a, mut b) = holder_and_waiter(&cluster, &sb, leader, stuck);
    let a_child = a.child();
    cluster.stall(stuck);
    let killed_at = now_ns();
    signal::kill(Pid::from_raw(a.run.pid()), Signal::SIGKILL).expect("SIGKILL A");
    let starting = "B's child to start while the follower is stuck";
    wait_until(FAULT_BOUND, starting, || b.marks.started());
    let b_start = read_ns(&b.marks.start);
    assert!(!pid_alive(a_child), "A's child outlived A into B's run");
    let left = format!("no look at the queue through {}", cluster.endpoint(stuck));
    assert!(
        b.run.stderr().contains(&left),
        "B never gave up the stuck follower (so the fault proved nothing)\n{}",
        b.run.stderr()
    );
    cluster.release(stuck);
    let took = ms(b_start - killed_at);
    eprintln!(
        "F14 etcd {} waiter on a stuck follower: B's child started {took:.0} ms after A was \
         SIGKILLed (TTL {F14_TTL:?})",
        v.number()
    );
    // A's lease outlives its last renewal by at most a TTL; B then looks within one renewal
    // interval, and a look through the stuck member gives up after another.
    let bound = F14_TTL + 2 * F14_TTL / 3;
    assert!(
        took < ms(bound.as_nanos() as i128),
        "B took over {took:.0} ms after A died, not within TTL + two renewal intervals ({bound:?})"
    );
    a.wait(STARTUP);
    b.release();
    let b_exit = b.wait(STARTUP).code();
    let ok = matches!(b_exit, Some(0 | 124));
    assert!(ok, "B exited {b_exit:?}{}", b.run.stderr());
}

/// Holder A through member `a_on` alone, and waiter B queued behind it through `b_first` and
/// then the third member; returns once B is waiting.
#[track_caller]
fn holder_and_waiter(cluster: &Cluster, sb: &Sandbox, a_on: usize, b_first: usize) -> (Job, Job) {
    let third = (0..Cluster::SIZE).find(|&i| i != a_on && i != b_first);
    let third = third.expect("three members");
    let prefix = etcd::unique_prefix("f14_waiter");
    let lw = |endpoints: &str| f14_job(endpoints, &prefix);
    let a = Job::hold(lw(&cluster.endpoint(a_on)), sb, "a");
    let b_on = format!("{},{}", cluster.endpoint(b_first), cluster.endpoint(third));
    let b = Job::spawn(lw(&b_on).args(&["-w", "120s"]), Marks::new(sb, "b"), false);
    wait_for_key_count(cluster, &prefix, 2, STARTUP);
    wait_until(STARTUP, "B to wait for the lease", || {
        b.run.stderr().contains("waiting for the lease")
    });
    (a, b)
}

/// How long the healthy cluster is watched.
const HEALTHY_FOR: Duration = Duration::from_secs(30);

/// Three holders of three leases, each through one member, for 30 s at TTL 2 s: none loses its
/// lease, each exits 0. Also counts what one renewal costs the cluster, from etcd's /metrics.
fn holders_through_each_member_of_a_healthy_cluster_never_lose_the_lease(v: Version) {
    let cluster = Cluster::start(v);
    let prefix = etcd::unique_prefix("f14_healthy");
    let sb = Sandbox::new();
    let holders: Vec<Job> = (0..Cluster::SIZE)
        .map(|i| {
            let lw = Leasewrap::new()
                .on_etcd(&cluster.endpoint(i), &prefix)
                .name(&format!("job{i}"))
                .args(&FAULT_ARGS);
            Job::hold(lw, &sb, &format!("h{i}"))
        })
        .collect();
    let before = Requests::of(&cluster);
    let began = Instant::now();
    while began.elapsed() < HEALTHY_FOR {
        for (i, h) in holders.iter().enumerate() {
            assert!(
                !h.marks.end.exists() && pid_alive(h.child()),
                "holder {i}'s child stopped on a healthy cluster\n{}",
                h.run.stderr()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    let spent = Requests::of(&cluster).since(&before);
    let mut renewals = 0;
    for mut h in holders {
        h.release();
        h.finish_with(0);
        renewals += h.run.stderr().matches("confirming read").count();
    }
    spent.report(v, renewals);
}

/// How long the holder of the keepalive count renews.
const ECHOED_FOR: Duration = Duration::from_secs(6);

/// A holder given every member renews through the first, and sends each of the others one
/// keepalive with each renewal, so that every lessor that still answers sees every renewal: a
/// stuck leader that comes back then has nothing to revoke (docs/quorum.md). Counted from each
/// member's /metrics: every member received at least one keepalive per renewal, but the first
/// renewals while its stream opened.
fn every_member_gets_a_keepalive_with_each_renewal(v: Version) {
    let cluster = Cluster::start(v);
    let prefix = etcd::unique_prefix("echoes");
    let sb = Sandbox::new();
    let received = |i: usize| {
        let label = "grpc_method=\"LeaseKeepAlive\"";
        cluster.metric(i, "grpc_server_msg_received_total", &[label])
    };
    let before: Vec<f64> = (0..Cluster::SIZE).map(received).collect();
    let lw = Leasewrap::new()
        .on_etcd(&cluster.endpoints(), &prefix)
        .name("job")
        .args(&FAULT_ARGS);
    let mut h = Job::hold(lw, &sb, "h");
    let began = Instant::now();
    while began.elapsed() < ECHOED_FOR {
        assert!(
            pid_alive(h.child()),
            "the holder's child stopped\n{}",
            h.run.stderr()
        );
        thread::sleep(Duration::from_millis(50));
    }
    h.release();
    h.finish_with(0);
    let renewals = h.run.stderr().matches("confirming read").count() as f64;
    assert!(
        renewals >= 4.0,
        "only {renewals} renewals\n{}",
        h.run.stderr()
    );
    for (i, before) in before.iter().enumerate() {
        let got = received(i) - before;
        eprintln!(
            "etcd {} member {i}: {got} keepalives for {renewals} renewals",
            v.number()
        );
        assert!(
            got >= renewals - 2.0,
            "member {i} got {got} keepalives for {renewals} renewals"
        );
    }
}

/// Requests the whole cluster has served, by kind, from each member's /metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Requests {
    keepalives: f64,
    ranges: f64,
    txns: f64,
}

impl Requests {
    fn of(cluster: &Cluster) -> Requests {
        let sum = |name: &str, method: &str| -> f64 {
            let label = format!("grpc_method=\"{method}\"");
            (0..Cluster::SIZE)
                .map(|i| cluster.metric(i, name, &[&label]))
                .sum()
        };
        Requests {
            keepalives: sum("grpc_server_msg_received_total", "LeaseKeepAlive"),
            ranges: sum("grpc_server_handled_total", "Range"),
            txns: sum("grpc_server_handled_total", "Txn"),
        }
    }

    fn since(&self, before: &Requests) -> Requests {
        Requests {
            keepalives: self.keepalives - before.keepalives,
            ranges: self.ranges - before.ranges,
            txns: self.txns - before.txns,
        }
    }

    /// Prints the cost of a renewal; a renewal is one keepalive and one read, so no more than
    /// one read per renewal may show (none of the holders does anything else meanwhile).
    #[track_caller]
    fn report(&self, v: Version, renewals: usize) {
        assert!(renewals > 0, "no renewal was logged");
        let per = |n: f64| n / renewals as f64;
        eprintln!(
            "F14 etcd {} healthy: {renewals} renewals in {HEALTHY_FOR:?} by 3 holders; per renewal \
             {:.2} keepalives, {:.2} Range, {:.2} Txn",
            v.number(),
            per(self.keepalives),
            per(self.ranges),
            per(self.txns)
        );
        assert!(
            self.ranges <= renewals as f64 + 3.0,
            "{} Range requests for {renewals} renewals",
            self.ranges
        );
    }
}
