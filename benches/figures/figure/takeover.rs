//! Figure 4: takeover after the holder is SIGKILLed, TTL 2 s and 5 s, both tools interleaved.
//!
//! The holder talks to etcd through the proxy, which stamps each request it sends: the last one
//! before the kill is its last renewal, from which the takeover is counted (etcd expires the
//! lease TTL after the last keepalive it received). The kill falls at a random phase of the
//! renewal period, at least one renewal after the child started.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::bench::{Bench, Child, Pair, Tool};
use crate::report::{Figure, Row};
use crate::stats::{dist, median, ratio};

const OLD_EXIT: &str = "old-exit";

/// One takeover, in seconds.
struct Takeover {
    from_kill: f64,
    /// None when the proxy saw no request before the kill.
    from_renewal: Option<f64>,
    kill_after_renewal: Option<f64>,
    /// None while the old child still ran when the new one started.
    old_exit_after_kill: Option<f64>,
    orphan_at_takeover: bool,
}

pub fn figure(bench: &mut Bench) -> Figure {
    let mut figure = Figure::default();
    for ttl in [2, 5] {
        let mut runs: [Vec<Takeover>; 2] = [Vec::new(), Vec::new()];
        for i in 0..bench.sizes.n_takeover {
            for tool in Tool::interleaved(i) {
                runs[tool as usize].push(once(bench, tool, &format!("to{ttl}-{i}"), ttl));
            }
        }
        let (row, note) = report(ttl, &runs[0], &runs[1]);
        figure.rows.push(row);
        figure.notes.push(note);
    }
    figure
}

fn report(ttl: u32, lw: &[Takeover], ec: &[Takeover]) -> (Row, String) {
    let from_renewal =
        |rs: &[Takeover]| -> Vec<f64> { rs.iter().filter_map(|r| r.from_renewal).collect() };
    let orphans = |rs: &[Takeover]| rs.iter().filter(|r| r.orphan_at_takeover).count();
    let (lw_r, ec_r) = (from_renewal(lw), from_renewal(ec));
    let worst = lw_r
        .iter()
        .copied()
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    let id = if ttl == 2 { "takeover-2" } else { "takeover-5" };
    let row = Row {
        leasewrap: format!(
            "{}; old child alive at takeover {}/{}",
            dist(&lw_r, "s", 3),
            orphans(lw),
            lw.len()
        ),
        baseline: format!(
            "etcdctl lock: {}; old child alive at takeover {}/{}",
            dist(&ec_r, "s", 3),
            orphans(ec),
            ec.len()
        ),
        ..Row::new(
            id,
            format!("4. takeover after holder SIGKILL, TTL {ttl} s (from last renewal)"),
        )
        .with_ratio(ratio(median(&lw_r), median(&ec_r)))
        .set("worst_over_ttl_s", worst.map(|w| w - f64::from(ttl)))
        .set("orphans", Some(orphans(lw) as f64))
    };
    (row, note(ttl, lw, ec))
}

fn note(ttl: u32, lw: &[Takeover], ec: &[Takeover]) -> String {
    let all: Vec<&Takeover> = lw.iter().chain(ec).collect();
    format!(
        "Takeover TTL {ttl} s measured from the kill instant instead: leasewrap {}; etcdctl {}. \
         The holder was killed {} after its last renewal (both tools). leasewrap's old child died \
         {} after the kill (its watchdog saw leasewrap's socket close); etcdctl's old children \
         still running when the new child started: {}/{}.",
        dist(&lw.iter().map(|r| r.from_kill).collect::<Vec<_>>(), "s", 3),
        dist(&ec.iter().map(|r| r.from_kill).collect::<Vec<_>>(), "s", 3),
        dist(
            &all.iter()
                .filter_map(|r| r.kill_after_renewal)
                .collect::<Vec<_>>(),
            "s",
            3
        ),
        dist(
            &lw.iter()
                .filter_map(|r| r.old_exit_after_kill.map(|s| s * 1e3))
                .collect::<Vec<_>>(),
            "ms",
            2
        ),
        ec.iter()
            .filter(|r| r.old_exit_after_kill.is_none())
            .count(),
        ec.len()
    )
}

fn once(bench: &mut Bench, tool: Tool, name: &str, ttl: u32) -> Takeover {
    bench.events.reset();
    bench.proxy.clear_requests();
    let log = format!("{}-takeover", tool.name());
    let Pair {
        holder,
        child,
        started,
    } = bench.hold_and_queue(tool, name, ttl, &log);
    bench.events.watch_exit(child, OLD_EXIT);
    let period = Duration::from_secs(u64::from(ttl)) / 3;
    let kill_at = started + period + Duration::from_millis(100) + period.mul_f64(bench.random());
    std::thread::sleep(kill_at.saturating_duration_since(Instant::now()));
    let killed = Instant::now();
    kill(Pid::from_raw(holder), Signal::SIGKILL).expect("SIGKILL the holder");
    let bound = Duration::from_secs(u64::from(ttl) + 6);
    let new = bench.events.wait_for(Child::WaiterSleep.label(), bound);
    let Some(new) = new else {
        panic!("{} TTL {ttl}: no takeover within {bound:?}", tool.name());
    };
    // An old child still running when the new one started is an orphan: what came by then counts.
    let old = bench.events.wait_for(OLD_EXIT, Duration::ZERO);
    let last = bench
        .proxy
        .requests()
        .into_iter()
        .filter(|t| *t <= killed)
        .max();
    bench.sweep();
    let secs = |a: Instant, b: Instant| b.duration_since(a).as_secs_f64();
    Takeover {
        from_kill: secs(killed, new),
        from_renewal: last.map(|l| secs(l, new)),
        kill_after_renewal: last.map(|l| secs(l, killed)),
        old_exit_after_kill: old.map(|o| secs(killed, o)),
        orphan_at_takeover: old.is_none_or(|o| o > new),
    }
}
