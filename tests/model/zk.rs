//! The ZooKeeper model: a leader and two followers as ZooKeeper 3.8's source says they behave
//! (docs/zookeeper.md §0-§7), two holders whose renewals are leasewrap's own
//! `timing::zk::ZkSchedule`, each connected to a follower of its own.
//!
//! The leader's session tracker keeps one expiry per session, rounded up to the next tickTime and
//! replaced at each touch. A follower touches a session only in its own table and relays the
//! table in its reply to the leader's next PING (one every tickTime/2, here every tick); the
//! follower-leader links are FIFO both ways. A write (the Check) is checked at the leader, never
//! touched. A follower cut off from the leader goes on answering reads for syncLimit × tickTime,
//! then closes its clients' connections. No election: a leader change only lengthens sessions
//! (docs/zookeeper.md §7). A holder's connection is FIFO both ways; its requests and answers may be
//! held back to the instant before its stop time; its session may move to the other follower,
//! which negotiates a shorter timeout that the leader applies at once.

use std::time::Duration;

use leasewrap::clock::BootInstant;
use leasewrap::lease::timing::zk::{Answer, Step, ZkNext, ZkSchedule};
use leasewrap::lease::timing::{Effective, Twin, Verdict};
use leasewrap::lease::LossReason;
use stateright::{Model, Property};

use crate::common::{
    arrives_by, at, next_instant, next_tick, params, ticks, World, DRIFT, EPSILON, NAMES, TTL,
};

/// tickTime, in ticks (T = 5 tickTimes, within ZooKeeper's default 2..20).
const TICK_TIME: f64 = 2.0;

/// syncLimit × tickTime: how long a cut-off follower keeps its clients.
const SYNC_LIMIT: Duration = Duration::from_secs(10);

/// The session timeout a member negotiates when a session moves to it, in ticks: shorter than
/// `TTL`, and one the rule still holds for.
pub const SHORT: u64 = 7;

/// Which deadline rule the holders follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// leasewrap's: Look, Sync Δ later, Check; D from the Look's send.
    LookSyncCheck,
    /// Counted from the latest successful write: a Check every TTL/4, D from its send.
    LatestWrite,
}

/// The faults the model may inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults {
    pub most: u8,
    /// A follower's links to the leader cut, both ways, for good.
    pub cuts: bool,
    /// The leader paused, any number of ticks.
    pub leader_pauses: bool,
    /// A holder's leasewrap paused (its watchdog runs on).
    pub processes: bool,
    /// A holder's session moved to the other follower, which negotiates `SHORT`.
    pub moves: bool,
    /// How many of the holders' requests and answers may come late: up to the instant before
    /// the holder gives up on them (its stop time). Counted apart from `most`.
    pub slow: u8,
    /// How many follower-leader packets may come up to a tick late (the link is FIFO: what is
    /// behind waits too). Counted apart from `most`.
    pub links: u8,
}

#[derive(Clone, Debug)]
pub struct Zk {
    pub rule: Rule,
    /// The broken twin of leasewrap's rule the holders follow, if any.
    pub twin: Option<Twin>,
    pub faults: Faults,
    /// The longest a message between a holder and its follower takes, in ticks.
    pub delay: u32,
    /// The longest a packet between a follower and the leader takes, in ticks.
    pub link_delay: u32,
    /// The holders are told tickTime; else `ZkSchedule` takes it as T/2.
    pub tick_known: bool,
    pub horizon: u32,
}

/// A session at the leader: its holder's token, its expiry in the holders' time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Session {
    pub token: u8,
    pub expiry: BootInstant,
    /// The session timeout the last connect negotiated, in ticks.
    pub timeout: u64,
}

/// The lock node: whose session (the token) created it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lock {
    pub client: usize,
    pub token: u8,
}

/// What goes between a follower and the leader, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Packet {
    Ping,
    /// The follower's touch table (each holder's session, if touched), in its reply to a PING.
    PingReply([Option<u8>; 2]),
    /// A client's `sync` or multi-with-check, forwarded.
    Sync(usize),
    Check(usize, u8),
    SyncDone(usize),
    /// The leader's answer to a Check: its one op's result (the reply's header is OK).
    Committed(usize, Result<(), i32>),
    /// The lock node as the leader now has it (a create or a closeSession committed).
    Node(Option<Lock>),
}

/// A packet on a link, delivered by `due` unless the link is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Queued {
    pub packet: Packet,
    pub due: BootInstant,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Follower {
    /// The instant its links to the leader were cut.
    pub cut: Option<BootInstant>,
    /// It closed its clients' connections (syncLimit × tickTime after the cut).
    pub closed: bool,
    /// Sessions touched since its last PING reply.
    pub touched: [Option<u8>; 2],
    /// The lock node as it last heard from the leader.
    pub node: Option<Lock>,
    pub to_leader: Vec<Queued>,
    pub from_leader: Vec<Queued>,
}

/// A request between a holder and its follower, or the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Msg {
    pub client: usize,
    pub token: u8,
    pub step: Step,
    /// `None`: the request; `Some`: what came back.
    pub reply: Option<Reply>,
    pub due: BootInstant,
    /// Held back: it arrives by `due`, or never.
    pub late: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    Answered(Answer),
    /// A Check's one op's result, as the server sent it.
    Checked(Result<(), i32>),
    /// The follower closed the connection.
    Disconnected,
}

/// A holder's rule in force: leasewrap's, or the one counted from the latest write.
#[derive(Clone, Debug, Hash)]
pub enum Schedule {
    Zk(ZkSchedule),
    LatestWrite(LatestWrite),
}

/// D from the send of the latest successful Check; a Check every TTL/4, retried at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LatestWrite {
    pub deadline: BootInstant,
    pub next_send: BootInstant,
    pub in_flight: Option<BootInstant>,
}

#[derive(Clone, Debug, Hash)]
pub struct Holding {
    pub token: u8,
    pub schedule: Schedule,
}

#[derive(Clone, Debug, Hash)]
pub struct Client {
    pub paused: bool,
    pub holding: Option<Holding>,
    /// The follower its session is connected to.
    pub via: usize,
}

#[derive(Clone, Debug, Hash)]
pub struct State {
    pub now: BootInstant,
    pub leader_paused: bool,
    pub sessions: [Option<Session>; 2],
    pub node: Option<Lock>,
    pub tokens: u8,
    pub followers: [Follower; 2],
    pub clients: [Client; 2],
    /// Each holder's requests and answers in flight, in the order sent.
    pub net: Vec<Msg>,
    pub faults: u8,
    /// Messages made late so far.
    pub slowed: u8,
    /// Follower-leader packets made late so far.
    pub late_links: u8,
    pub world: World,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    Acquire(usize),
    Keep(usize),
    /// Client message `i` arrives.
    Deliver(usize),
    /// The head of follower `f`'s link to the leader (true) or from it (false) arrives.
    Link(usize, bool),
    Cut(usize),
    PauseLeader,
    /// The leader runs again; its expirer first (true) or its learner handlers first.
    ResumeLeader(bool),
    PauseClient(usize),
    ResumeClient(usize),
    /// Client message `i` is held back until just before its holder gives up on it.
    Slow(usize),
    /// Holder `c`'s session moves to the other follower, which negotiates `SHORT`.
    Move(usize),
    /// The head of follower `f`'s link to the leader (true) or from it comes at the next tick.
    LateLink(usize, bool),
}

fn timing() -> Effective {
    params()
        .effective(Duration::from_secs(TTL))
        .expect("the default timing fits")
}

impl LatestWrite {
    fn stop_at(&self) -> BootInstant {
        self.deadline - timing().kill_after
    }

    fn next(&self, now: BootInstant) -> ZkNext {
        let stop = self.stop_at();
        match self.in_flight {
            _ if now >= stop => ZkNext::Lost,
            None if now >= self.next_send => ZkNext::Send(Step::Check),
            None => ZkNext::SleepUntil(self.next_send.min(stop)),
            Some(t) => ZkNext::AwaitUntil((t + timing().ttl / 4).min(stop)),
        }
    }

    fn answered(&mut self, now: BootInstant, answer: Answer) -> Verdict {
        let Some(t) = self.in_flight.take() else {
            return Verdict::Ignored;
        };
        match answer {
            Answer::Expired => Verdict::Lost(LossReason::SessionExpired),
            _ if now >= self.stop_at() => Verdict::Lost(LossReason::NotRenewed),
            Answer::Ok => {
                self.deadline = self.deadline.max(timing().deadline(t));
                self.next_send = t + timing().ttl / 4;
                Verdict::Extended(self.deadline)
            }
            _ => Verdict::Lost(LossReason::NotRenewed),
        }
    }
}

impl Schedule {
    fn connected(rule: Rule, start: BootInstant, tick_known: bool, twin: Option<Twin>) -> Self {
        let tick = tick_known.then(|| Duration::from_secs_f64(TICK_TIME));
        let timeout = Duration::from_secs(TTL);
        match rule {
            Rule::LookSyncCheck => {
                let z =
                    ZkSchedule::connected(params(), start, timeout, tick).expect("the timing fits");
                Schedule::Zk(match twin {
                    Some(t) => z.twin(t),
                    None => z,
                })
            }
            Rule::LatestWrite => Schedule::LatestWrite(LatestWrite {
                deadline: timing().deadline(start),
                next_send: start + timing().ttl / 4,
                in_flight: None,
            }),
        }
    }

    pub fn deadline(&self) -> BootInstant {
        match self {
            Schedule::Zk(z) => z.deadline(),
            Schedule::LatestWrite(w) => w.deadline,
        }
    }

    fn next(&self, now: BootInstant) -> ZkNext {
        match self {
            Schedule::Zk(z) => z.next(now),
            Schedule::LatestWrite(w) => w.next(now),
        }
    }

    fn sent(&mut self, step: Step, now: BootInstant) {
        match self {
            Schedule::Zk(z) => z.sent(step, now),
            Schedule::LatestWrite(w) => w.in_flight = Some(now),
        }
    }

    fn answered(&mut self, now: BootInstant, answer: Answer) -> Verdict {
        match self {
            Schedule::Zk(z) => z.answered(now, answer),
            Schedule::LatestWrite(w) => w.answered(now, answer),
        }
    }

    /// What a Check's op said: leasewrap's reading, or for the latest write, any failure is one.
    fn check_answer(&self, op: Option<Result<(), i32>>) -> Answer {
        match self {
            Schedule::Zk(z) => z.check_answer(op),
            Schedule::LatestWrite(_) => match op {
                Some(Ok(())) => Answer::Ok,
                Some(Err(-112)) => Answer::Expired,
                _ => Answer::NodeGone,
            },
        }
    }

    fn failed(&mut self, now: BootInstant) {
        match self {
            Schedule::Zk(z) => z.failed(now),
            Schedule::LatestWrite(w) => {
                w.in_flight = None;
                w.next_send = now;
            }
        }
    }

    /// The session moved by a connect sent at `now` that negotiated `timeout` (the keeper's
    /// `changed`): `D` comes down, and the renewal starts over, or the lease is lost.
    fn moved(&mut self, now: BootInstant, timeout: u64) -> Result<(), LossReason> {
        let Schedule::Zk(z) = self else {
            return Err(LossReason::NotRenewed);
        };
        z.reconnected(now, Duration::from_secs(timeout))?;
        z.failed(now);
        Ok(())
    }
}

/// The leader's session expiry for a touch at `now` (holders' time) with `timeout` ticks: its
/// own clock runs `DRIFT` fast, and `ExpiryQueue.update` rounds `now + T` up to the next tickTime.
fn expiry_after_touch(now: BootInstant, timeout: u64) -> BootInstant {
    let leader_now = ticks(now) * (1.0 + DRIFT);
    let rounded = ((leader_now + timeout as f64) / TICK_TIME).floor() * TICK_TIME + TICK_TIME;
    at(0) + Duration::from_secs_f64(rounded / (1.0 + DRIFT))
}

/// The leader's PINGs go out at whole ticks.
fn whole(t: BootInstant) -> bool {
    t.since_boot().subsec_nanos() == 0
}

impl State {
    fn due(&self, c: usize) -> Option<ZkNext> {
        let cl = &self.clients[c];
        let h = cl.holding.as_ref().filter(|_| !cl.paused)?;
        let now = self.now;
        match h.schedule.next(now) {
            n @ (ZkNext::Lost | ZkNext::Send(_)) => Some(n),
            n @ ZkNext::AwaitUntil(t) if now >= t => Some(n),
            _ => None,
        }
    }

    fn may_acquire(&self, c: usize) -> bool {
        let cl = &self.clients[c];
        let free = self.node.is_none() && !self.leader_paused;
        free && !cl.paused && cl.holding.is_none() && self.world.children[c].is_none()
    }

    /// Client message `i` can arrive now: its receiver is not a paused holder, and nothing sent
    /// before it on its connection, the same way, is still in flight (a ZooKeeper connection
    /// is FIFO both ways).
    fn deliverable(&self, i: usize) -> bool {
        let m = &self.net[i];
        let way = |x: &Msg| (x.client, x.reply.is_some());
        let first = self.net.iter().position(|x| way(x) == way(m)) == Some(i);
        first && (m.reply.is_none() || !self.clients[m.client].paused)
    }

    /// The instant before which holder `c` gives up on its message `m`, if it awaits it.
    fn gives_up(&self, m: &Msg) -> Option<BootInstant> {
        let h = self.clients[m.client].holding.as_ref()?;
        match h.schedule.next(self.now) {
            ZkNext::AwaitUntil(t) if h.token == m.token => Some(t),
            _ => None,
        }
    }

    /// The next instant something may happen: a holder's schedule acts, a packet or message is
    /// due, the leader expires a session, a cut-off follower closes its connections.
    fn next_instant(&self, horizon: u32) -> BootInstant {
        let holders = self.clients.iter().filter(|c| !c.paused);
        let schedules =
            holders
                .flat_map(|c| &c.holding)
                .filter_map(|h| match h.schedule.next(self.now) {
                    ZkNext::SleepUntil(t) | ZkNext::AwaitUntil(t) => Some(t),
                    _ => None,
                });
        let expiries = self.sessions.iter().flatten().map(|x| x.expiry);
        let expiries = expiries.filter(|_| !self.leader_paused);
        let links = (0..2).flat_map(|f| {
            let fo = &self.followers[f];
            let heads = [&fo.to_leader, &fo.from_leader].map(|q| q.first().map(|p| p.due));
            let closes = fo.cut.map(|t| t + SYNC_LIMIT).filter(|_| !fo.closed);
            heads.into_iter().flatten().chain(closes)
        });
        let messages = (0..self.net.len())
            .filter(|i| self.deliverable(*i))
            .map(|i| self.net[i].due);
        let all = schedules.chain(expiries).chain(links).chain(messages);
        next_instant(self.now, horizon, all)
    }

    /// The head of a link can arrive: the link is up and the leader runs.
    fn link_ready(&self, f: usize, up: bool) -> bool {
        let fo = &self.followers[f];
        let queue = if up { &fo.to_leader } else { &fo.from_leader };
        fo.cut.is_none() && !self.leader_paused && !queue.is_empty()
    }

    fn may_tick(&self, horizon: u32) -> bool {
        let overdue = |f: usize, up: bool| {
            let fo = &self.followers[f];
            let q = if up { &fo.to_leader } else { &fo.from_leader };
            self.link_ready(f, up) && q[0].due <= self.now
        };
        self.now < at(horizon)
            && !(0..2).any(|f| overdue(f, true) || overdue(f, false))
            && (0..2).all(|c| self.due(c).is_none() && !self.may_acquire(c))
            && (0..self.net.len())
                .all(|i| self.net[i].due > self.now || self.net[i].late || !self.deliverable(i))
    }

    fn answer_client(&mut self, c: usize, step: Step, reply: Reply, delay: u32) {
        let token = self.clients[c].holding.as_ref().map_or(0, |h| h.token);
        let due = arrives_by(self.now, delay);
        let reply = Some(reply);
        self.net.push(Msg {
            client: c,
            token,
            step,
            reply,
            due,
            late: false,
        });
    }

    /// Queue `packet` on follower `f`'s link to (`up`) or from the leader, unless it is cut.
    fn queue(&mut self, f: usize, up: bool, packet: Packet, delay: u32) {
        let due = arrives_by(self.now, delay);
        let fo = &mut self.followers[f];
        if fo.cut.is_none() {
            let q = if up {
                &mut fo.to_leader
            } else {
                &mut fo.from_leader
            };
            q.push(Queued { packet, due });
        }
    }

    /// The leader's expirer: every session whose expiry passed is closed, its node deleted.
    fn expire(&mut self, delay: u32) {
        for c in 0..2 {
            let Some(sess) = self.sessions[c].filter(|x| x.expiry <= self.now) else {
                continue;
            };
            self.sessions[c] = None;
            if self.node
                == Some(Lock {
                    client: c,
                    token: sess.token,
                })
            {
                self.node = None;
                (0..2).for_each(|f| self.queue(f, false, Packet::Node(None), delay));
            }
        }
    }
}

impl Zk {
    fn fault_actions(&self, s: &State, out: &mut Vec<Action>) {
        let left = s.faults < self.faults.most;
        if s.leader_paused {
            out.extend([Action::ResumeLeader(true), Action::ResumeLeader(false)]);
        } else if left && self.faults.leader_pauses {
            out.push(Action::PauseLeader);
        }
        for i in 0..2 {
            if left && self.faults.cuts && s.followers[i].cut.is_none() {
                out.push(Action::Cut(i));
            }
            if s.clients[i].paused {
                out.push(Action::ResumeClient(i));
            } else if left && self.faults.processes {
                out.push(Action::PauseClient(i));
            }
            let other = &s.followers[1 - s.clients[i].via];
            let reaches = other.cut.is_none() && !s.leader_paused;
            let runs = s.clients[i].holding.is_some() && !s.clients[i].paused;
            if left && self.faults.moves && runs && reaches {
                out.push(Action::Move(i));
            }
        }
        for (f, up) in [(0, true), (0, false), (1, true), (1, false)] {
            let fo = &s.followers[f];
            let q = if up { &fo.to_leader } else { &fo.from_leader };
            let now = q.first().is_some_and(|p| p.due <= s.now);
            if s.late_links < self.faults.links && s.link_ready(f, up) && now {
                out.push(Action::LateLink(f, up));
            }
        }
        if s.slowed < self.faults.slow {
            for (i, m) in s.net.iter().enumerate() {
                if s.gives_up(m).is_some_and(|t| t - EPSILON > m.due) {
                    out.push(Action::Slow(i));
                }
            }
        }
    }
}

impl Model for Zk {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let follower = Follower {
            cut: None,
            closed: false,
            touched: [None, None],
            node: None,
            to_leader: Vec::new(),
            from_leader: Vec::new(),
        };
        let client = |via| Client {
            paused: false,
            holding: None,
            via,
        };
        vec![State {
            now: at(0),
            leader_paused: false,
            sessions: [None, None],
            node: None,
            tokens: 0,
            followers: [follower.clone(), follower],
            clients: [client(0), client(1)],
            net: Vec::new(),
            faults: 0,
            slowed: 0,
            late_links: 0,
            world: World::default(),
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        if s.world.broken.is_some() {
            return;
        }
        if s.may_tick(self.horizon) {
            out.push(Action::Tick);
        }
        for i in 0..s.net.len() {
            if s.deliverable(i) {
                out.push(Action::Deliver(i));
            }
        }
        for i in 0..2 {
            for up in [true, false] {
                if s.link_ready(i, up) {
                    out.push(Action::Link(i, up));
                }
            }
            if s.may_acquire(i) {
                out.push(Action::Acquire(i));
            }
            if s.due(i).is_some() {
                out.push(Action::Keep(i));
            }
        }
        self.fault_actions(s, out);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let (d, l) = (self.delay, self.link_delay);
        match action {
            Action::Tick => tick(&mut s, last.next_instant(self.horizon), d, l),
            Action::Acquire(c) => acquire(&mut s, c, self, l),
            Action::Keep(c) => keep(&mut s, c, d),
            Action::Deliver(i) => deliver(&mut s, i, d, l),
            Action::Link(f, true) => at_leader(&mut s, f, l),
            Action::Link(f, false) => at_follower(&mut s, f, d, l),
            Action::Cut(f) => cut(&mut s, f),
            Action::PauseLeader => {
                s.faults += 1;
                s.leader_paused = true;
            }
            Action::ResumeLeader(expirer_first) => {
                s.leader_paused = false;
                if expirer_first {
                    s.expire(l);
                }
            }
            Action::PauseClient(c) => {
                s.faults += 1;
                s.clients[c].paused = true;
            }
            Action::ResumeClient(c) => s.clients[c].paused = false,
            Action::Slow(i) => hold_back(&mut s, i),
            Action::Move(c) => {
                s.faults += 1;
                moved(&mut s, c);
            }
            Action::LateLink(f, up) => late_link(&mut s, f, up),
        }
        // Each holder's messages stay in the order sent (a stable sort).
        s.net.sort_by_key(|m| m.client);
        Some(s)
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= at(self.horizon)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        crate::properties()
    }
}

/// Time moves on to `to`: the leader's expirer runs, then, at a whole tick, its PING to each
/// follower; a follower cut off for syncLimit × tickTime closes its clients' connections.
fn tick(s: &mut State, to: BootInstant, d: u32, l: u32) {
    s.now = to;
    s.net.retain(|m| !m.late || m.due >= to);
    s.world.reap(s.now);
    if !s.leader_paused {
        s.expire(l);
        if whole(s.now) {
            (0..2).for_each(|f| s.queue(f, false, Packet::Ping, l));
        }
    }
    for f in 0..2 {
        let fo = &mut s.followers[f];
        if fo.cut.is_some_and(|t| s.now >= t + SYNC_LIMIT) && !fo.closed {
            fo.closed = true;
            for c in 0..2 {
                if s.clients[c].via == f && s.clients[c].holding.is_some() {
                    s.answer_client(c, Step::Look, Reply::Disconnected, d);
                }
            }
        }
    }
}

/// Follower `f`'s links to the leader are cut, both ways, for good.
fn cut(s: &mut State, f: usize) {
    s.faults += 1;
    let fo = &mut s.followers[f];
    fo.cut = Some(s.now);
    fo.to_leader.clear();
    fo.from_leader.clear();
}

/// Client message `i` is held back: it comes by just before its holder gives up, or never.
fn hold_back(s: &mut State, i: usize) {
    s.slowed += 1;
    let until = s.gives_up(&s.net[i]).expect("a renewal's message");
    s.net[i].due = until - EPSILON;
    s.net[i].late = true;
}

/// The head of follower `f`'s link to the leader (`up`) or from it comes at the next tick, and
/// what is behind it waits.
fn late_link(s: &mut State, f: usize, up: bool) {
    s.late_links += 1;
    let fo = &mut s.followers[f];
    let q = if up {
        &mut fo.to_leader
    } else {
        &mut fo.from_leader
    };
    q[0].due = next_tick(s.now);
}

/// Holder `c`'s session moves to the other follower, which revalidates it with the leader at
/// once: the leader's expiry now counts `SHORT` from this instant, and so does every later
/// touch. The old connection and what was in flight on it are gone.
fn moved(s: &mut State, c: usize) {
    let from = s.clients[c].via;
    s.clients[c].via = 1 - from;
    s.net.retain(|m| m.client != c);
    let fo = &mut s.followers[from];
    for q in [&mut fo.to_leader, &mut fo.from_leader] {
        q.retain(|p| !p.packet.is_for(c));
    }
    let now = s.now;
    let Some(h) = s.clients[c].holding.as_mut() else {
        return;
    };
    let token = h.token;
    let Some(sess) = s.sessions[c].as_mut().filter(|x| x.token == token) else {
        return lose(s, c);
    };
    sess.timeout = SHORT;
    sess.expiry = expiry_after_touch(now, SHORT);
    let moved = h.schedule.moved(now, SHORT);
    let d = h.schedule.deadline();
    s.world.lower(c, d);
    if moved.is_err() {
        lose(s, c);
    }
}

impl Packet {
    /// A client's request or its answer, which belongs to that client's connection.
    const fn is_for(&self, c: usize) -> bool {
        match *self {
            Packet::Sync(x)
            | Packet::Check(x, _)
            | Packet::SyncDone(x)
            | Packet::Committed(x, _) => x == c,
            _ => false,
        }
    }
}

/// Client `c` takes the free lock node in a new session, as soon as it could.
fn acquire(s: &mut State, c: usize, model: &Zk, d: u32) {
    s.tokens += 1;
    let token = s.tokens;
    let start = s.now;
    let lock = Lock { client: c, token };
    s.sessions[c] = Some(Session {
        token,
        expiry: expiry_after_touch(start, TTL),
        timeout: TTL,
    });
    s.node = Some(lock);
    (0..2).for_each(|f| s.queue(f, false, Packet::Node(Some(lock)), d));
    let schedule = Schedule::connected(model.rule, start, model.tick_known, model.twin);
    s.world.start(c, token, start, schedule.deadline());
    s.clients[c].holding = Some(Holding { token, schedule });
}

/// The keeper does what its schedule says is due now.
fn keep(s: &mut State, c: usize, d: u32) {
    let now = s.now;
    let Some(next) = s.due(c) else { return };
    let h = s.clients[c]
        .holding
        .as_mut()
        .expect("due only while holding");
    let token = h.token;
    match next {
        ZkNext::Lost => lose(s, c),
        ZkNext::Send(step) => {
            h.schedule.sent(step, now);
            let due = arrives_by(now, d);
            s.net.push(Msg {
                client: c,
                token,
                step,
                reply: None,
                due,
                late: false,
            });
        }
        _ => h.schedule.failed(now),
    }
}

fn lose(s: &mut State, c: usize) {
    s.world.stop(c, s.now);
    s.clients[c].holding = None;
    s.net.retain(|m| m.client != c || m.reply.is_none());
}

/// A holder's request reaches its follower, or an answer reaches the holder.
fn deliver(s: &mut State, i: usize, d: u32, l: u32) {
    let m = s.net.remove(i);
    let c = m.client;
    match m.reply {
        None if s.followers[s.clients[c].via].closed => {
            s.answer_client(c, m.step, Reply::Disconnected, d)
        }
        None => request(s, &m, d, l),
        Some(reply) => answered(s, &m, reply),
    }
}

/// Every request touches the session in the follower's own table (`submitRequestNow`), before
/// it is answered there (a read) or forwarded to the leader (a sync or a write).
fn request(s: &mut State, m: &Msg, d: u32, l: u32) {
    let c = m.client;
    let f = s.clients[c].via;
    s.followers[f].touched[c] = Some(m.token);
    match m.step {
        Step::Look => {
            let answer = seen(s.followers[f].node, c, m.token);
            s.answer_client(c, Step::Look, Reply::Answered(answer), d);
        }
        Step::Sync => s.queue(f, true, Packet::Sync(c), l),
        Step::Check => s.queue(f, true, Packet::Check(c, m.token), l),
    }
}

fn seen(node: Option<Lock>, c: usize, token: u8) -> Answer {
    match node {
        Some(l) if l == (Lock { client: c, token }) => Answer::Ok,
        Some(_) => Answer::Replaced,
        None => Answer::NodeGone,
    }
}

fn answered(s: &mut State, m: &Msg, reply: Reply) {
    let now = s.now;
    let Some(h) = s.clients[m.client].holding.as_mut() else {
        return;
    };
    if h.token != m.token {
        return;
    }
    let verdict = match reply {
        Reply::Answered(a) => h.schedule.answered(now, a),
        Reply::Checked(op) => {
            let a = h.schedule.check_answer(Some(op));
            h.schedule.answered(now, a)
        }
        Reply::Disconnected => {
            h.schedule.failed(now);
            Verdict::Failed
        }
    };
    match verdict {
        Verdict::Extended(dl) => s.world.extend(m.client, dl),
        Verdict::Lost(_) | Verdict::KeyLost(_) => lose(s, m.client),
        _ => {}
    }
}

/// The leader reads the next packet from follower `f`: touches from a PING reply (a session
/// closing is not touched), a forwarded sync, or a Check that validates the session and the node.
fn at_leader(s: &mut State, f: usize, d: u32) {
    let p = s.followers[f].to_leader.remove(0).packet;
    let now = s.now;
    match p {
        Packet::PingReply(touched) => {
            for (c, t) in touched.iter().enumerate() {
                if let Some(sess) = s.sessions[c].as_mut().filter(|x| Some(x.token) == *t) {
                    sess.expiry = expiry_after_touch(now, sess.timeout);
                }
            }
        }
        Packet::Sync(c) => s.queue(f, false, Packet::SyncDone(c), d),
        Packet::Check(c, token) => {
            let alive = s.sessions[c].is_some_and(|x| x.token == token);
            // A session the leader expired fails the op with -112 (SESSIONEXPIRED); a node
            // not there, with -101 (NONODE): the multi's own header stays OK.
            let op = match (alive, seen(s.node, c, token)) {
                (false, _) => Err(-112),
                (true, Answer::Ok) => Ok(()),
                (true, _) => Err(-101),
            };
            s.queue(f, false, Packet::Committed(c, op), d);
        }
        _ => {}
    }
}

/// Follower `f` handles the next packet from the leader, in order.
fn at_follower(s: &mut State, f: usize, d: u32, l: u32) {
    let p = s.followers[f].from_leader.remove(0).packet;
    match p {
        Packet::Ping => {
            let table = std::mem::take(&mut s.followers[f].touched);
            s.queue(f, true, Packet::PingReply(table), l);
        }
        Packet::SyncDone(c) => s.answer_client(c, Step::Sync, Reply::Answered(Answer::Ok), d),
        Packet::Committed(c, op) => s.answer_client(c, Step::Check, Reply::Checked(op), d),
        Packet::Node(n) => s.followers[f].node = n,
        _ => {}
    }
}

impl crate::Twinned for Zk {
    fn with_twin(self, twin: Twin) -> Self {
        Self {
            twin: Some(twin),
            ..self
        }
    }
}

impl crate::Checked for Zk {
    fn world(s: &State) -> &World {
        &s.world
    }

    fn healthy(&self) -> bool {
        let late = self.faults.slow + self.faults.links;
        self.faults.most == 0 && late == 0 && self.delay == 0 && self.link_delay == 0
    }

    fn now(s: &State) -> f64 {
        ticks(s.now)
    }

    fn describe(&self, s: &State, action: &Action) -> String {
        let after = self.next_state(s, *action).expect("a step of the trace");
        let what = match *action {
            Action::Tick => return effects(s, &after).trim_start_matches("; ").into(),
            Action::Acquire(c) => format!(
                "{} takes the lock (session {}) at {:.2}, D = {:.2}",
                NAMES[c],
                after.tokens,
                ticks(s.now),
                ticks(
                    after.clients[c]
                        .holding
                        .as_ref()
                        .expect("held")
                        .schedule
                        .deadline()
                )
            ),
            Action::Keep(c) => match s.due(c) {
                Some(ZkNext::Send(step)) => {
                    format!("{} sends {step:?} to F{}", NAMES[c], s.clients[c].via + 1)
                }
                Some(ZkNext::Lost) => format!("{} reaches its stop time: lease lost", NAMES[c]),
                _ => format!("{}'s step is late: a failure", NAMES[c]),
            },
            Action::Deliver(i) => delivered(s, &s.net[i]),
            Action::Link(f, up) => return link(s, &after, f, up),
            Action::Cut(f) => format!("F{}'s links to the leader are cut", f + 1),
            Action::PauseLeader => "the leader is paused".into(),
            Action::ResumeLeader(true) => "the leader runs again, its expirer first".into(),
            Action::ResumeLeader(false) => "the leader runs again".into(),
            Action::PauseClient(c) => format!("{}'s leasewrap is paused", NAMES[c]),
            Action::ResumeClient(c) => format!("{}'s leasewrap runs again", NAMES[c]),
            Action::Slow(i) => {
                let c = NAMES[s.net[i].client];
                let what = delivered(s, &s.net[i]).replacen(" gets ", " will get ", 1);
                format!("held back, to come just before {c} gives up or never: {what}")
            }
            Action::LateLink(f, true) => format!("F{}'s next packet to L comes a tick late", f + 1),
            Action::LateLink(f, false) => {
                format!("L's next packet to F{} comes a tick late", f + 1)
            }
            Action::Move(c) => format!(
                "{}'s session moves to F{}, which negotiates a timeout of {SHORT}",
                NAMES[c],
                2 - s.clients[c].via
            ),
        };
        format!("{what}{}", effects(s, &after))
    }
}

/// A packet between a follower and the leader, shown only when it carries a touch or a
/// client's request: the PINGs, every tick, would drown the rest.
fn link(s: &State, after: &State, f: usize, up: bool) -> String {
    let fo = &s.followers[f];
    let p = if up {
        fo.to_leader[0].packet
    } else {
        fo.from_leader[0].packet
    };
    let line = match p {
        Packet::Ping | Packet::PingReply([None, None]) => return effects(s, after),
        Packet::PingReply(t) => {
            let who: Vec<&str> = (0..2)
                .filter(|c| t[*c].is_some())
                .map(|c| NAMES[c])
                .collect();
            format!(
                "L reads F{}'s PING reply, touching {}",
                f + 1,
                who.join(" and ")
            )
        }
        Packet::Sync(c) => format!("L reads {}'s sync from F{}", NAMES[c], f + 1),
        Packet::Check(c, _) => format!("L reads {}'s Check from F{}", NAMES[c], f + 1),
        Packet::SyncDone(c) => format!("F{} reads L's answer to {}'s sync", f + 1, NAMES[c]),
        Packet::Committed(c, a) => {
            format!("F{} reads L's commit of {}'s Check: {a:?}", f + 1, NAMES[c])
        }
        Packet::Node(n) => format!("F{} learns the lock node is {n:?}", f + 1),
    };
    format!("{line}{}", effects(s, after))
}

fn delivered(s: &State, m: &Msg) -> String {
    let who = NAMES[m.client];
    let f = s.clients[m.client].via + 1;
    match m.reply {
        None => format!("F{f} gets {who}'s {:?}", m.step),
        Some(r) => format!("{who} gets F{f}'s answer to {:?}: {r:?}", m.step),
    }
}

fn effects(s: &State, after: &State) -> String {
    let mut out = String::new();
    for (c, name) in NAMES.iter().enumerate() {
        let dl = |st: &State| {
            st.clients[c]
                .holding
                .as_ref()
                .map(|h| h.schedule.deadline())
        };
        match (dl(s), dl(after)) {
            (Some(b), Some(n)) if n > b => {
                out.push_str(&format!("; {}'s D moves to {:.2}", name, ticks(n)));
            }
            (Some(_), None) => {
                let end = after.world.children[c]
                    .as_ref()
                    .map_or(0.0, |ch| ticks(ch.end));
                out.push_str(&format!("; {} stops its child, dead by {end:.2}", name));
            }
            _ => {}
        }
        if let (Some(b), Some(n)) = (s.sessions[c], after.sessions[c]) {
            if n.expiry != b.expiry {
                out.push_str(&format!(
                    "; L's expiry of {}'s session: {:.2}",
                    name,
                    ticks(n.expiry)
                ));
            }
        }
    }
    if s.node.is_some() && after.node.is_none() {
        out.push_str("; L expires the session, the lock node goes");
    }
    out.push_str(&s.world.newly_broken(&after.world));
    out
}
