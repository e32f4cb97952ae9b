//! What the etcd and ZooKeeper models share: made-up time in integer ticks, the children and
//! what the watchdog does to them, the fencing resource, and the properties checked on them.
//!
//! One tick is one second of the holders' clocks. Every member's clock runs the full `--drift`
//! fast against them, the worst case the rule allows: a TTL the server counts from `t` ends, in
//! the holders' time, at `t + TTL/(1+drift)`. Deadlines computed by leasewrap's rules are
//! fractions of a tick; the model keeps them exact and compares them with exact instants.

use std::time::Duration;

use leasewrap::clock::BootInstant;
use leasewrap::lease::timing::Params;

/// The lease's TTL (etcd) or session timeout (ZooKeeper), in ticks.
pub const TTL: u64 = 10;

/// `--drift`: every member's clock runs this much faster than the holders'.
pub const DRIFT: f64 = 0.1;

/// Tick 0, far enough from boot that no subtraction saturates.
const BASE: u64 = 1_000;

/// The instant of tick `t` on every holder's clock.
pub fn at(t: u32) -> BootInstant {
    BootInstant::from_since_boot(Duration::from_secs(BASE + u64::from(t)))
}

/// An instant as ticks, for the timeline.
pub fn ticks(i: BootInstant) -> f64 {
    i.since_boot().as_secs_f64() - BASE as f64
}

/// The smallest step of time: a message that comes this much before its receiver gives up on
/// it still counts.
pub const EPSILON: Duration = Duration::from_nanos(1);

/// The first whole tick after `now`.
pub fn next_tick(now: BootInstant) -> BootInstant {
    at(ticks(now).floor() as u32 + 1)
}

/// The latest instant a message sent at `now` arrives, unless held back: the `delay`-th whole
/// tick after `now` (0: at once). Whole ticks keep the instants to explore few.
pub fn arrives_by(now: BootInstant, delay: u32) -> BootInstant {
    match delay {
        0 => now,
        d => next_tick(now) + Duration::from_secs(u64::from(d - 1)),
    }
}

/// Where time may go next: the earliest of `candidates` after `now`, the next whole tick, and
/// the horizon. Between two of these instants nothing can happen that is not also possible at
/// the first of them.
pub fn next_instant(
    now: BootInstant,
    horizon: u32,
    candidates: impl IntoIterator<Item = BootInstant>,
) -> BootInstant {
    candidates
        .into_iter()
        .filter(|t| *t > now)
        .fold(next_tick(now).min(at(horizon)), BootInstant::min)
}

/// `n` ticks counted by a member's clock, as the holders' clocks measure them.
pub fn server_ticks(n: u64) -> Duration {
    Duration::from_secs_f64(n as f64 / (1.0 + DRIFT))
}

/// leasewrap's options in every model: `--ttl 10s --drift 0.1`, kill-after and margin by default.
pub fn params() -> Params {
    Params {
        ttl: Duration::from_secs(TTL),
        kill_after: None,
        margin: None,
        drift: DRIFT,
    }
}

/// Kill-after for the TTL in force (min(2 s, TTL/5)).
pub fn kill_after() -> Duration {
    params()
        .effective(Duration::from_secs(TTL))
        .expect("the default timing fits")
        .kill_after
}

/// What a fault pauses of a holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pause {
    /// leasewrap is stopped; its watchdog is not.
    Process,
    /// The whole host is stopped.
    Host,
}

/// Client `c`, whose pause is `slot`, is paused (`to` is some) or runs again at `now`; a whole
/// host's child is frozen with it, and on its return stale if a newer holder runs.
pub fn set_pause(
    slot: &mut Option<Pause>,
    world: &mut World,
    c: usize,
    to: Option<Pause>,
    now: BootInstant,
) {
    let was = std::mem::replace(slot, to);
    if to == Some(Pause::Host) || was == Some(Pause::Host) {
        world.freeze(c, to.is_some(), now);
    }
}

/// The holders, as the timelines name them.
pub const NAMES: [&str; 2] = ["A", "B"];

/// A holder's child: its fencing token, and the instant by which it is surely dead.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Child {
    pub token: u8,
    /// The watchdog's SIGKILL time: `D`, or earlier once a stop began.
    pub end: BootInstant,
    /// Its whole host is paused: it runs no code, and its watchdog kills nothing.
    pub frozen: bool,
    /// It ran again after its host was paused past its deadline, while a newer holder ran.
    pub stale: bool,
    /// It wrote to the fenced resource.
    pub wrote: bool,
}

/// The children, the resource they write to, and what went wrong, for both models.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct World {
    pub children: [Option<Child>; 2],
    /// The highest token the fenced resource accepted.
    pub fence: u8,
    /// A property broke: what happened, for the timeline.
    pub broken: Option<Broken>,
    /// A holder lost its lease (the healthy-cluster property).
    pub lost: bool,
    /// A renewal moved a deadline (the models cannot pass by never renewing).
    pub renewed: bool,
    /// A second holder started after a first (the lease changes hands).
    pub handed_over: bool,
    /// The resource refused a stale child's write.
    pub refused: bool,
}

/// A broken property.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Broken {
    /// Two children ran at one instant, neither of them on a paused host.
    Overlap { old: u8, new: u8 },
    /// The resource accepted a write older than one it had accepted.
    StaleWrite { token: u8 },
}

impl World {
    /// Client `c`'s child starts at `start` with `token`: no other may be running then.
    pub fn start(&mut self, c: usize, token: u8, start: BootInstant, end: BootInstant) {
        if let Some(o) = self.children[1 - c].as_ref() {
            if !o.frozen && !o.stale && o.end > start {
                self.broken = Some(Broken::Overlap {
                    old: o.token,
                    new: token,
                });
            }
            self.handed_over = true;
        }
        self.handed_over |= token > 1;
        self.children[c] = Some(Child {
            token,
            end,
            frozen: false,
            stale: false,
            wrote: false,
        });
    }

    /// Client `c`'s lease has a new deadline `d` (the watchdog kills at `d`).
    pub fn extend(&mut self, c: usize, d: BootInstant) {
        self.renewed = true;
        if let Some(ch) = self.children[c].as_mut() {
            ch.end = ch.end.max(d);
        }
    }

    /// Client `c`'s deadline came down to `d` (a ZooKeeper session moved): the watchdog kills
    /// by then.
    pub fn lower(&mut self, c: usize, d: BootInstant) {
        if let Some(ch) = self.children[c].as_mut() {
            ch.end = ch.end.min(d);
        }
    }

    /// Client `c`'s leasewrap stops the child at `now`: dead by `now + kill_after`, or by `D`.
    pub fn stop(&mut self, c: usize, now: BootInstant) {
        self.lost = true;
        if let Some(ch) = self.children[c].as_mut() {
            ch.end = ch.end.min(now + kill_after());
        }
    }

    /// Client `c`'s whole host stops (`frozen`) or goes on at `now`, where its watchdog, past
    /// the deadline, kills the child at once: it may still run for a moment, a stale holder.
    pub fn freeze(&mut self, c: usize, frozen: bool, now: BootInstant) {
        let mine = self.children[c].as_ref().map_or(0, |ch| ch.token);
        let newer_runs = self.children[1 - c]
            .as_ref()
            .is_some_and(|o| o.token > mine && o.end > now);
        if let Some(ch) = self.children[c].as_mut() {
            ch.frozen = frozen;
            if !frozen {
                ch.end = ch.end.max(now);
                ch.stale |= newer_runs;
            }
        }
    }

    /// The timeline's line for a property that broke between `self` and `after`, if one did.
    pub fn newly_broken(&self, after: &World) -> String {
        match after.broken.filter(|_| self.broken.is_none()) {
            Some(b) => format!("\n         BROKEN: {b:?}"),
            None => String::new(),
        }
    }

    /// The children dead by `now` are gone.
    pub fn reap(&mut self, now: BootInstant) {
        for ch in &mut self.children {
            if ch.as_ref().is_some_and(|x| !x.frozen && x.end < now) {
                *ch = None;
            }
        }
    }

    /// Client `c`'s child may write to the fenced resource: it is running, and stale or the
    /// newest holder.
    pub fn can_write(&self, c: usize) -> bool {
        self.children[c].as_ref().is_some_and(|ch| !ch.frozen)
    }

    /// Client `c`'s child writes with its token: the resource refuses a token older than one it
    /// accepted (leasewrap's fenced-write). A stale child's write accepted after a newer
    /// holder's would break fencing; refused, it is the case the fencing property is about.
    pub fn write(&mut self, c: usize) {
        let newer_wrote = self.children[1 - c].as_ref().is_some_and(|o| o.wrote);
        let Some(ch) = self.children[c].as_mut() else {
            return;
        };
        ch.wrote = true;
        if ch.token >= self.fence {
            if ch.stale && newer_wrote {
                self.broken = Some(Broken::StaleWrite { token: ch.token });
            }
            self.fence = ch.token;
        } else if ch.stale {
            self.refused = true;
        }
    }
}
