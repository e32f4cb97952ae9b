//! The database model: one server that keeps no clock and serves each statement atomically, two
//! clients whose holders follow leasewrap's own `timing::db::DbSchedule` and whose waiters follow
//! its `timing::db::Watch` (docs/database.md, "The model").
//!
//! The row is a version, a token and a holder. A renewal is a compare-and-set on the holder's
//! token; a take is a compare-and-set on the version the waiter watched. A holder's statement or
//! its answer may be held back until just before the holder gives up on it, or lost (a
//! partition); a waiter's read or take, or its answer, may be held back a few ticks (a late commit,
//! a slow network). leasewrap may be paused (its watchdog kills on time), or a whole host.

use std::time::Duration;

use leasewrap::clock::BootInstant;
use leasewrap::lease::timing::db::{DbSchedule, Renewal, RowSeen, Watch};
use leasewrap::lease::timing::{KeySeen, Next, Twin, Verdict};
use stateright::{Model, Property};

use crate::common::{
    arrives_by, at, next_instant, params, set_pause, ticks, Pause, World, EPSILON, NAMES, TTL,
};

/// How often a waiter reads the row, in ticks (the poll; a NOTIFY only makes it sooner).
const POLL: u64 = 2;

/// How late a waiter's statement or its answer may come, in ticks.
const WAITER_LATE: u64 = 3;

/// The faults the model may inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults {
    /// How many pauses in one run.
    pub most: u8,
    /// A client's leasewrap paused (its watchdog runs on).
    pub processes: bool,
    /// A client's whole host paused, watchdog and child included.
    pub hosts: bool,
    /// How many statements or answers may come late (or, a holder's, never).
    pub slow: u8,
}

/// One configuration of the model.
#[derive(Clone, Debug)]
pub struct Db {
    /// The broken twin of the rule the clients follow, if any.
    pub twin: Option<Twin>,
    pub faults: Faults,
    /// A message arrives by the `delay`-th whole tick after its send (0: at once).
    pub delay: u32,
    /// The last tick explored.
    pub horizon: u32,
}

/// The row as the server holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub version: u8,
    pub token: u8,
    pub holder: Option<usize>,
}

/// What a client is doing.
#[derive(Clone, Debug, Hash)]
pub enum Role {
    /// Holding the row with this token.
    Holding { token: u8, schedule: DbSchedule },
    /// Watching the row; a read or take is in flight since `asked`, or the next read is due at
    /// `next_read`.
    Waiting {
        watch: Watch,
        asked: Option<BootInstant>,
        next_read: BootInstant,
    },
}

#[derive(Clone, Debug, Hash)]
pub struct Client {
    pub pause: Option<Pause>,
    pub role: Role,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Body {
    Renew { token: u8 },
    Read,
    Take { version: u8 },
    Renewed { ok: bool, free: bool },
    Row { version: u8, held: bool },
    Taken { token: Option<u8> },
}

/// A statement or its answer, in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    pub client: usize,
    pub body: Body,
    /// Delivered by this instant at the latest (unless its receiver is paused).
    pub due: BootInstant,
    /// When the waiter's statement it belongs to was sent.
    pub asked: BootInstant,
    /// Its answer is read: the client still waits for it.
    pub heeded: bool,
    /// Held back: it arrives by `due` (a waiter's), or by `due` or never (a holder's: `lost`).
    pub late: bool,
    /// It may never arrive: a holder's, held back.
    pub lost: bool,
}

#[derive(Clone, Debug, Hash)]
pub struct State {
    pub now: BootInstant,
    pub row: Row,
    pub clients: [Client; 2],
    pub net: Vec<Msg>,
    pub faults: u8,
    /// Messages made late so far.
    pub slowed: u8,
    pub world: World,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// Client `c` does what its schedule or watch says is due now.
    Act(usize),
    /// The message at this index of `net` arrives.
    Deliver(usize),
    /// The message at this index of `net` is held back.
    Slow(usize),
    /// Client `c` is paused, or (none) runs again.
    Pause(usize, Option<Pause>),
    Write(usize),
}

impl Body {
    const fn is_request(&self) -> bool {
        matches!(self, Body::Renew { .. } | Body::Read | Body::Take { .. })
    }
}

impl State {
    /// Client `c` has something to do now.
    fn due(&self, c: usize) -> bool {
        let cl = &self.clients[c];
        if cl.pause.is_some() {
            return false;
        }
        match &cl.role {
            Role::Holding { schedule, .. } => match schedule.next(self.now) {
                Next::Lost | Next::Send => true,
                Next::AwaitReplyUntil(t) => self.now >= t,
                _ => false,
            },
            Role::Waiting {
                watch,
                asked: None,
                next_read,
            } => {
                let child_dead = self.world.children[c].is_none();
                let take = watch.may_take(self.now).is_some() && child_dead;
                take || self.now >= *next_read
            }
            Role::Waiting { .. } => false,
        }
    }

    /// A message can arrive now: its receiver is not a paused client.
    fn deliverable(&self, m: &Msg) -> bool {
        m.body.is_request() || self.clients[m.client].pause.is_none()
    }

    /// The latest instant message `m` may be held back to, if it may be.
    fn slow_until(&self, m: &Msg) -> Option<BootInstant> {
        match &self.clients[m.client].role {
            Role::Holding { schedule, .. } if m.heeded => match schedule.next(self.now) {
                Next::AwaitReplyUntil(t) => Some(t - EPSILON),
                _ => None,
            },
            Role::Waiting { .. } => Some(m.asked + Duration::from_secs(WAITER_LATE)),
            Role::Holding { .. } => None,
        }
        .filter(|t| *t > m.due && !m.late)
    }

    fn may_tick(&self, horizon: u32) -> bool {
        self.now < at(horizon)
            && (0..2).all(|c| !self.due(c))
            && self
                .net
                .iter()
                .all(|m| m.due > self.now || m.lost || !self.deliverable(m))
    }

    /// The next instant something may happen.
    fn next_instant(&self, horizon: u32) -> BootInstant {
        let mut times = Vec::new();
        for cl in self.clients.iter().filter(|c| c.pause.is_none()) {
            match &cl.role {
                Role::Holding { schedule, .. } => match schedule.next(self.now) {
                    Next::SleepUntil(t) | Next::AwaitReplyUntil(t) => times.push(t),
                    _ => {}
                },
                Role::Waiting {
                    watch, next_read, ..
                } => {
                    times.push(*next_read);
                    if let leasewrap::lease::timing::db::WatchNext::TakeOverAt(t) = watch.next() {
                        times.push(t);
                    }
                }
            }
        }
        let due = self
            .net
            .iter()
            .filter(|m| self.deliverable(m))
            .map(|m| m.due);
        next_instant(self.now, horizon, times.into_iter().chain(due))
    }

    fn send(&mut self, c: usize, body: Body, asked: BootInstant, delay: u32) {
        self.net.push(Msg {
            client: c,
            body,
            due: arrives_by(self.now, delay),
            asked,
            heeded: true,
            late: false,
            lost: false,
        });
        self.net.sort();
    }
}

impl Model for Db {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let client = || Client {
            pause: None,
            role: waiting(self.twin, at(0)),
        };
        let row = Row {
            version: 0,
            token: 0,
            holder: None,
        };
        let (faults, slowed, net) = (0, 0, Vec::new());
        let world = World::default();
        vec![State {
            now: at(0),
            row,
            clients: [client(), client()],
            net,
            faults,
            slowed,
            world,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        if s.world.broken.is_some() {
            return;
        }
        if s.may_tick(self.horizon) {
            out.push(Action::Tick);
        }
        for (i, m) in s.net.iter().enumerate() {
            if s.deliverable(m) {
                out.push(Action::Deliver(i));
            }
            if s.slowed < self.faults.slow && s.slow_until(m).is_some() {
                out.push(Action::Slow(i));
            }
        }
        for c in 0..2 {
            if s.due(c) {
                out.push(Action::Act(c));
            }
            if self.faults.hosts && s.world.can_write(c) {
                out.push(Action::Write(c));
            }
        }
        self.pause_actions(s, out);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => tick(&mut s, last.next_instant(self.horizon)),
            Action::Act(c) => act(&mut s, c, self),
            Action::Deliver(i) => deliver(&mut s, i, self),
            Action::Slow(i) => {
                s.slowed += 1;
                s.net[i].due = last.slow_until(&last.net[i]).expect("slowable");
                s.net[i].late = true;
                s.net[i].lost =
                    matches!(last.clients[last.net[i].client].role, Role::Holding { .. });
                s.net.sort();
            }
            Action::Pause(c, to) => {
                s.faults += u8::from(to.is_some());
                set_pause(&mut s.clients[c].pause, &mut s.world, c, to, s.now);
            }
            Action::Write(c) => s.world.write(c),
        }
        Some(s)
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= at(self.horizon)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        crate::properties()
    }
}

impl Db {
    fn pause_actions(&self, s: &State, out: &mut Vec<Action>) {
        for c in 0..2 {
            match s.clients[c].pause {
                Some(_) => out.push(Action::Pause(c, None)),
                None if s.faults < self.faults.most => {
                    if self.faults.processes {
                        out.push(Action::Pause(c, Some(Pause::Process)));
                    }
                    if self.faults.hosts {
                        out.push(Action::Pause(c, Some(Pause::Host)));
                    }
                }
                None => {}
            }
        }
    }
}

/// Time moves on to `to`: a holder's late message not there by then never comes.
fn tick(s: &mut State, to: BootInstant) {
    s.now = to;
    s.net.retain(|m| !m.lost || m.due >= to);
    s.world.reap(s.now);
}

/// Client `c` does what is due: a holder renews or gives up, a waiter reads or takes.
fn act(s: &mut State, c: usize, model: &Db) {
    let now = s.now;
    let dead = s.world.children[c].is_none();
    let step = match &mut s.clients[c].role {
        Role::Holding { token, schedule } => match schedule.next(now) {
            Next::Lost => Err(true),
            Next::Send => {
                schedule.sent(now);
                Ok(Body::Renew { token: *token })
            }
            _ => {
                schedule.failed(now);
                Err(false)
            }
        },
        Role::Waiting { watch, asked, .. } => {
            *asked = Some(now);
            Ok(match watch.may_take(now).filter(|_| dead) {
                Some(v) => Body::Take { version: v as u8 },
                None => Body::Read,
            })
        }
    };
    match step {
        Ok(body) => s.send(c, body, now, model.delay),
        Err(true) => lose(s, c, model.twin),
        Err(false) => forget_replies(s, c),
    }
}

/// The lease is lost: leasewrap stops the child and waits again.
fn lose(s: &mut State, c: usize, twin: Option<Twin>) {
    s.world.stop(c, s.now);
    s.clients[c].role = waiting(twin, s.now);
    forget_replies(s, c);
}

/// A waiter that has read nothing, its first read due at `now`.
fn waiting(twin: Option<Twin>, now: BootInstant) -> Role {
    Role::Waiting {
        watch: watch(twin),
        asked: None,
        next_read: now,
    }
}

/// A waiter's watch, following the twin if the model says so.
fn watch(twin: Option<Twin>) -> Watch {
    match twin {
        Some(t @ Twin::DbWatchFromSend) => Watch::new().twin(t),
        _ => Watch::new(),
    }
}

/// Client `c` waits for no answer it asked for: the requests may still be served.
fn forget_replies(s: &mut State, c: usize) {
    s.net.retain(|m| m.client != c || m.body.is_request());
    for m in s.net.iter_mut().filter(|m| m.client == c) {
        m.heeded = false;
    }
    s.net.sort();
}

/// Message `i` arrives: the server serves a statement, or a client reads an answer.
fn deliver(s: &mut State, i: usize, model: &Db) {
    let msg = s.net.remove(i);
    let reply = match msg.body {
        Body::Renew { token } => Some(renew(s, token)),
        Body::Read => Some(Body::Row {
            version: s.row.version,
            held: s.row.holder.is_some(),
        }),
        Body::Take { version } => Some(take(s, msg.client, version)),
        _ => {
            if msg.heeded {
                answered(s, &msg, model);
            }
            None
        }
    };
    if let Some(body) = reply.filter(|_| msg.heeded) {
        s.net.push(Msg {
            body,
            due: arrives_by(s.now, model.delay),
            late: false,
            lost: false,
            ..msg
        });
        s.net.sort();
    }
}

/// The renewal's compare-and-set on the token.
fn renew(s: &mut State, token: u8) -> Body {
    let ok = s.row.holder.is_some() && s.row.token == token;
    if ok {
        s.row.version += 1;
    }
    Body::Renewed {
        ok,
        free: s.row.holder.is_none(),
    }
}

/// The take's compare-and-set on the version.
fn take(s: &mut State, c: usize, version: u8) -> Body {
    if s.row.version != version {
        return Body::Taken { token: None };
    }
    s.row = Row {
        version: version + 1,
        token: s.row.token + 1,
        holder: Some(c),
    };
    Body::Taken {
        token: Some(s.row.token),
    }
}

/// An answer reaches client `c`.
fn answered(s: &mut State, msg: &Msg, model: &Db) {
    let (c, now) = (msg.client, s.now);
    match (&mut s.clients[c].role, msg.body) {
        (Role::Holding { schedule, .. }, Body::Renewed { ok, free }) => {
            let renewal = match (ok, free) {
                (true, _) => Renewal::Renewed,
                (false, true) => Renewal::Refused(KeySeen::Gone),
                (false, false) => Renewal::Refused(KeySeen::Replaced),
            };
            match schedule.answered(now, renewal) {
                Verdict::Extended(d) => s.world.extend(c, d),
                Verdict::Lost(_) | Verdict::KeyLost(_) => lose(s, c, model.twin),
                Verdict::Failed => forget_replies(s, c),
                _ => {}
            }
        }
        (Role::Waiting { .. }, Body::Row { version, held }) => seen(s, msg, version, held),
        (Role::Waiting { .. }, Body::Taken { token }) => taken(s, msg, token, model),
        _ => {}
    }
}

/// A waiter's read came back.
fn seen(s: &mut State, msg: &Msg, version: u8, held: bool) {
    let now = s.now;
    if let Role::Waiting {
        watch,
        asked,
        next_read,
    } = &mut s.clients[msg.client].role
    {
        let row = RowSeen {
            version: u64::from(version),
            held,
            ttl: Duration::from_secs(TTL),
        };
        watch.read(msg.asked, now, row);
        *asked = None;
        // On whole ticks: the poll's phase is arbitrary, and few instants keep the states few.
        *next_read = at(ticks(now).floor() as u32 + POLL as u32);
    }
}

/// A waiter's take came back: it holds, from the take's send, or reads again (also when the
/// answer came after the stop time the take would set).
fn taken(s: &mut State, msg: &Msg, token: Option<u8>, model: &Db) {
    let c = msg.client;
    let Some(token) = token else {
        s.clients[c].role = waiting(model.twin, s.now);
        return;
    };
    let mut schedule = DbSchedule::taken(&params(), msg.asked).expect("the timing fits");
    if let Some(t @ Twin::DbDFromAnswer) = model.twin {
        schedule = schedule.twin(t);
    }
    if s.now >= schedule.stop_at() {
        // Answered too late to run anything: leasewrap gives the row back (here: leaves it to
        // be taken over) and watches again.
        s.clients[c].role = waiting(model.twin, s.now);
        return;
    }
    s.world.start(c, token, s.now, schedule.deadline());
    s.clients[c].role = Role::Holding { token, schedule };
}

impl crate::Checked for Db {
    fn describe(&self, s: &State, action: &Action) -> String {
        let after = self.next_state(s, *action).expect("a step of the trace");
        let what = match *action {
            Action::Tick => String::new(),
            Action::Deliver(i) => delivered(s, &s.net[i]),
            Action::Act(c) => acted(s, c),
            Action::Slow(i) => format!("{} is held back", what(&s.net[i])),
            Action::Pause(c, Some(Pause::Process)) => format!("{}'s leasewrap is paused", NAMES[c]),
            Action::Pause(c, Some(Pause::Host)) => format!("{}'s whole host is paused", NAMES[c]),
            Action::Pause(c, None) => format!("{} runs again", NAMES[c]),
            Action::Write(c) => format!("{}'s child writes to the fenced resource", NAMES[c]),
        };
        let line = format!("{what}{}", effects(s, &after));
        line.trim_start_matches("; ").to_string()
    }

    fn now(s: &State) -> f64 {
        ticks(s.now)
    }

    fn world(s: &State) -> &World {
        &s.world
    }

    /// No pause, no message late, no delay: the lease must never be lost.
    fn healthy(&self) -> bool {
        (self.faults.most, self.faults.slow, self.delay) == (0, 0, 0)
    }
}

impl crate::Twinned for Db {
    fn with_twin(mut self, twin: Twin) -> Self {
        self.twin = Some(twin);
        self
    }
}

fn acted(s: &State, c: usize) -> String {
    let who = NAMES[c];
    match &s.clients[c].role {
        Role::Holding { schedule, .. } => match schedule.next(s.now) {
            Next::Send => format!("{who} sends a renewal"),
            Next::Lost => format!("{who} reaches its stop time: lease lost"),
            _ => format!("{who}'s renewal is late: a failure"),
        },
        Role::Waiting { watch, .. } => match watch.may_take(s.now) {
            Some(v) if s.world.children[c].is_none() => {
                format!("{who} sends a take on version {v}")
            }
            _ => format!("{who} reads the row"),
        },
    }
}

/// What a message is, for the timeline.
fn what(m: &Msg) -> String {
    let who = NAMES[m.client];
    match m.body {
        Body::Renew { .. } => format!("{who}'s renewal"),
        Body::Read => format!("{who}'s read"),
        Body::Take { .. } => format!("{who}'s take"),
        _ => format!("the answer to {who}"),
    }
}

fn delivered(s: &State, m: &Msg) -> String {
    let who = NAMES[m.client];
    let row = s.row;
    match m.body {
        Body::Renew { token } => format!(
            "the server runs {who}'s renewal on token {token} (row: version {}, token {})",
            row.version, row.token
        ),
        Body::Read => format!(
            "the server reads the row for {who}: version {}",
            row.version
        ),
        Body::Take { version } => format!(
            "the server runs {who}'s take on version {version} (row: version {})",
            row.version
        ),
        Body::Renewed { ok, .. } => format!(
            "{who} gets its renewal's answer: {}",
            if ok { "renewed" } else { "refused" }
        ),
        Body::Row { version, held } => format!("{who} reads version {version} (held: {held})"),
        Body::Taken { token } => format!("{who} gets its take's answer: {token:?}"),
    }
}

/// What a step changed that the timeline must show: deadlines, children.
fn effects(s: &State, after: &State) -> String {
    let mut out = String::new();
    for (c, name) in NAMES.iter().enumerate() {
        let d = |st: &State| match &st.clients[c].role {
            Role::Holding { schedule, .. } => Some(schedule.deadline()),
            Role::Waiting { .. } => None,
        };
        match (d(s), d(after)) {
            (Some(b), Some(n)) if n > b => {
                out.push_str(&format!("; {name}'s D moves to {:.2}", ticks(n)))
            }
            (None, Some(n)) => {
                out.push_str(&format!("; {name}'s child starts, D = {:.2}", ticks(n)))
            }
            (Some(_), None) => out.push_str(&format!("; {name} stops its child")),
            _ => {}
        }
    }
    out.push_str(&s.world.newly_broken(&after.world));
    out
}
