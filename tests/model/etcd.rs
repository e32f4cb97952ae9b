//! The etcd model: three members as their source says they behave (docs/quorum.md, "Why it is
//! sound"), two holders whose renewals are leasewrap's own `timing::Schedule`, driven the way the
//! keeper in `lease::etcd::session` drives it.
//!
//! Raft is abstracted to what the rule depends on: one term and leader agreed by the healthy
//! members, each member's applied term (the header's raft_term), each member's lessor (primary or
//! not, and when it thinks each lease expires), and the lock key as the quorum committed it. A
//! member stuck in fsync answers keepalives from its lessor with its old term and serves no
//! linearizable read; a paused member answers nothing; both come back with their lessor still
//! primary, and before etcd 3.5.13 that lessor revokes every lease it thinks expired.
//!
//! A renewal's keepalive, read and their replies may be held back to the instant before the holder
//! gives up on them; each gRPC stream is FIFO, streams are not ordered among themselves.

use leasewrap::clock::BootInstant;
use leasewrap::lease::timing::{Kept, KeySeen, Next, Read, Schedule, Twin, Verdict};
use stateright::{Model, Property};

use crate::common::{
    arrives_by, at, next_instant, params, server_ticks, set_pause, ticks, Pause, World, EPSILON,
    NAMES, TTL,
};

/// etcd's election timeout, in ticks (its default, 1 s).
const ELECTION: u64 = 1;

/// Which members the holder's keeper sends keepalives to besides the one it renews through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keeper {
    /// F14's first rule alone: a member is simply left.
    FirstRule,
    /// The keeper before the model: one keepalive with every renewal, replies unheeded, to the
    /// last member it left while that member's lessor still answered.
    Sidecar,
    /// As shipped (`lease::etcd::session`'s echoes): a keepalive to every other member with every
    /// renewal, replies unheeded.
    EveryMember,
}

/// Which etcd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Before 3.5.13 and 3.4.31: a stale leader that comes back revokes what it thinks expired.
    Old,
    /// 3.5.13, 3.4.31 and later: the old leader's revokes are ignored.
    Fixed,
}

/// The faults the model may inject, each any number of ticks long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults {
    /// How many in one run.
    pub most: u8,
    /// A member's raft loop stuck in fsync.
    pub stuck: bool,
    /// A whole member paused.
    pub paused: bool,
    /// A holder's leasewrap paused (its watchdog runs on).
    pub processes: bool,
    /// A holder's whole host paused, watchdog and child included.
    pub hosts: bool,
    /// How many of the renewals' requests and replies may come late: up to the instant before
    /// the holder gives up on them. Counted apart from `most`.
    pub slow: u8,
}

/// One configuration of the model.
#[derive(Clone, Debug)]
pub struct Etcd {
    pub keeper: Keeper,
    pub release: Release,
    /// The broken twin of the rule the holders follow, if any.
    pub twin: Option<Twin>,
    pub faults: Faults,
    /// A message arrives by the `delay`-th whole tick after its send (0: at once).
    pub delay: u32,
    /// The last tick explored.
    pub horizon: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemberFault {
    Stuck,
    Paused,
}

/// A lessor's view of one holder's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseView {
    pub token: u8,
    /// When this lessor, as primary, would revoke it; none while it is not primary.
    pub expiry: Option<BootInstant>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    pub fault: Option<MemberFault>,
    /// The term of the last entry it applied: its headers' raft_term.
    pub applied: u8,
    /// Its lessor believes it is the leader's.
    pub primary: bool,
    /// The leader it forwards renewals to.
    pub believes: usize,
    /// Each holder's lease as its lessor knows it.
    pub leases: [Option<LeaseView>; 2],
}

/// The lock key as committed: whose, under which lease (the token).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lock {
    pub client: usize,
    pub token: u8,
}

/// A holder's keeper, around leasewrap's own schedule.
#[derive(Clone, Debug, Hash)]
pub struct Holding {
    pub token: u8,
    pub schedule: Schedule,
    /// The member it renews through.
    pub member: usize,
    /// That member answered a keepalive with TTL > 0.
    pub answered: bool,
    /// The member left while its lessor answered, nudged with every renewal.
    pub sidecar: Option<usize>,
}

#[derive(Clone, Debug, Hash)]
pub struct Client {
    pub pause: Option<Pause>,
    pub holding: Option<Holding>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Body {
    KeepAlive,
    Read,
    Kept { ttl: i64, term: u8 },
    Answer { term: u8, seen: Seen },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Seen {
    Ours,
    Gone,
    Replaced,
}

/// A request to a member or its reply, in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    pub client: usize,
    pub member: usize,
    /// The lease it is about.
    pub token: u8,
    pub body: Body,
    /// Delivered by this instant at the latest (unless its receiver is paused).
    pub due: BootInstant,
    /// Its reply is read: the keeper still waits for it on that member.
    pub heeded: bool,
    /// Held back: it arrives by `due`, or never.
    pub late: bool,
}

#[derive(Clone, Debug, Hash)]
pub struct State {
    pub now: BootInstant,
    pub term: u8,
    pub leader: usize,
    pub members: [Member; 3],
    pub key: Option<Lock>,
    pub tokens: u8,
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
    /// Client `c` takes the free lock key, through the leader.
    Acquire(usize),
    /// Client `c`'s keeper does what its schedule says is due now.
    Keep(usize),
    /// The message at this index of `net` arrives.
    Deliver(usize),
    /// The message at this index of `net` is held back until just before its holder gives up.
    Slow(usize),
    Elect(usize),
    Fault(usize, MemberFault),
    Recover(usize),
    PauseClient(usize, Pause),
    ResumeClient(usize),
    Write(usize),
}

impl State {
    fn healthy(&self, m: usize) -> bool {
        self.members[m].fault.is_none()
    }

    /// Client `c`'s keeper acts now: its schedule has something due, or a reply came late.
    fn due(&self, c: usize) -> Option<Next> {
        let cl = &self.clients[c];
        let h = cl.holding.as_ref().filter(|_| cl.pause.is_none())?;
        let now = self.now;
        match h.schedule.next(now) {
            n @ (Next::Lost | Next::Send | Next::ConfirmBy(_)) => Some(n),
            n @ (Next::AwaitReplyUntil(t) | Next::AwaitReadUntil(t)) if now >= t => Some(n),
            _ => None,
        }
    }

    /// A message can arrive now: its receiver is not a paused client, and no message sent
    /// before it on its gRPC stream is still in flight. Only a stream of keepalives to another
    /// member, replies unheeded, ever has more than one; streams are not ordered among themselves.
    fn deliverable(&self, m: &Msg) -> bool {
        let to_client = matches!(m.body, Body::Kept { .. } | Body::Answer { .. });
        let echo = |x: &Msg| x.body == Body::KeepAlive && !x.heeded;
        let behind = echo(m)
            && self
                .net
                .iter()
                .any(|x| echo(x) && (x.client, x.member) == (m.client, m.member) && x.due < m.due);
        !behind && (!to_client || self.clients[m.client].pause.is_none())
    }

    /// The instant before which holder `c` gives up on message `m`, if it awaits it.
    fn gives_up(&self, m: &Msg) -> Option<BootInstant> {
        let cl = &self.clients[m.client];
        let h = cl
            .holding
            .as_ref()
            .filter(|h| m.heeded && h.token == m.token)?;
        match h.schedule.next(self.now) {
            Next::AwaitReplyUntil(t) | Next::AwaitReadUntil(t) => Some(t),
            _ => None,
        }
    }

    /// Client `c` may take the lock key now: it is free, the leader can commit, and `c`'s
    /// last child is dead.
    fn may_acquire(&self, c: usize) -> bool {
        let cl = &self.clients[c];
        let free = self.key.is_none() && self.healthy(self.leader);
        free && cl.pause.is_none() && cl.holding.is_none() && self.world.children[c].is_none()
    }

    /// Nothing is due before time may move on. A waiter takes a free key at once: a later
    /// start could only overlap less with the child before it.
    fn may_tick(&self, horizon: u32) -> bool {
        self.now < at(horizon)
            && (0..2).all(|c| self.due(c).is_none() && !self.may_acquire(c))
            && self
                .net
                .iter()
                .all(|m| m.due > self.now || m.late || !self.deliverable(m))
    }

    /// The next instant something may happen: a holder's schedule acts, a message is due, the
    /// leader's lessor expires a lease.
    fn next_instant(&self, horizon: u32) -> BootInstant {
        let holders = self.clients.iter().filter(|c| c.pause.is_none());
        let schedules =
            holders
                .flat_map(|c| &c.holding)
                .filter_map(|h| match h.schedule.next(self.now) {
                    Next::SleepUntil(t) | Next::AwaitReplyUntil(t) | Next::AwaitReadUntil(t) => {
                        Some(t)
                    }
                    _ => None,
                });
        let leader = &self.members[self.leader];
        let expiries = leader.leases.iter().flatten().filter_map(|l| l.expiry);
        let expiries = expiries.filter(|_| self.healthy(self.leader));
        let late = self
            .net
            .iter()
            .filter(|m| self.deliverable(m))
            .map(|m| m.due);
        next_instant(self.now, horizon, schedules.chain(expiries).chain(late))
    }

    fn send(&mut self, c: usize, member: usize, token: u8, body: Body, delay: u32, heeded: bool) {
        self.net.push(Msg {
            client: c,
            member,
            token,
            body,
            due: arrives_by(self.now, delay),
            heeded,
            late: false,
        });
        self.net.sort();
    }

    /// The revoke of client `c`'s lease `token` is committed: every member that applies it
    /// forgets the lease, and the key goes if it is that lease's.
    fn revoke(&mut self, c: usize, token: u8) {
        for m in 0..3 {
            let applies = self.members[m].fault.is_none();
            if applies && self.members[m].leases[c].is_some_and(|l| l.token == token) {
                self.members[m].leases[c] = None;
            }
        }
        if self.key == Some(Lock { client: c, token }) {
            self.key = None;
        }
    }

    /// Member `m`'s lessor, primary and with its raft loop running, revokes now what it
    /// thinks expired.
    fn expire(&mut self, m: usize) {
        for c in 0..2 {
            let Some(l) = self.members[m].leases[c] else {
                continue;
            };
            if l.expiry.is_some_and(|e| e <= self.now) {
                self.revoke(c, l.token);
            }
        }
    }
}

impl Etcd {
    fn faults_left(&self, s: &State) -> bool {
        s.faults < self.faults.most
    }

    fn fault_actions(&self, s: &State, out: &mut Vec<Action>) {
        for m in 0..3 {
            match s.members[m].fault {
                Some(_) => out.push(Action::Recover(m)),
                None if self.faults_left(s) => {
                    if self.faults.stuck {
                        out.push(Action::Fault(m, MemberFault::Stuck));
                    }
                    if self.faults.paused {
                        out.push(Action::Fault(m, MemberFault::Paused));
                    }
                }
                None => {}
            }
            // Two healthy members elect a new leader when theirs stopped answering.
            let others = (0..3).filter(|o| *o != m && s.healthy(*o)).count();
            if !s.healthy(s.leader) && s.healthy(m) && others >= 1 {
                out.push(Action::Elect(m));
            }
        }
        for c in 0..2 {
            match s.clients[c].pause {
                Some(_) => out.push(Action::ResumeClient(c)),
                None if self.faults_left(s) => {
                    if self.faults.processes {
                        out.push(Action::PauseClient(c, Pause::Process));
                    }
                    if self.faults.hosts {
                        out.push(Action::PauseClient(c, Pause::Host));
                    }
                }
                None => {}
            }
        }
    }

    /// A message on a renewal's path is held back, while the budget for that lasts.
    fn slow_actions(&self, s: &State, out: &mut Vec<Action>) {
        if s.slowed >= self.faults.slow {
            return;
        }
        for (i, m) in s.net.iter().enumerate() {
            if s.gives_up(m).is_some_and(|t| t - EPSILON > m.due) {
                out.push(Action::Slow(i));
            }
        }
    }

    fn client_actions(&self, s: &State, out: &mut Vec<Action>) {
        for c in 0..2 {
            if s.may_acquire(c) {
                out.push(Action::Acquire(c));
            }
            if s.due(c).is_some() {
                out.push(Action::Keep(c));
            }
            if self.faults.hosts && s.world.can_write(c) {
                out.push(Action::Write(c));
            }
        }
    }
}

impl Model for Etcd {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let member = |m: usize| Member {
            fault: None,
            applied: 1,
            primary: m == 0,
            believes: 0,
            leases: [None, None],
        };
        vec![State {
            now: at(0),
            term: 1,
            leader: 0,
            members: [member(0), member(1), member(2)],
            key: None,
            tokens: 0,
            clients: [0, 1].map(|_| Client {
                pause: None,
                holding: None,
            }),
            net: Vec::new(),
            faults: 0,
            slowed: 0,
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
        for (i, m) in s.net.iter().enumerate() {
            if s.deliverable(m) {
                out.push(Action::Deliver(i));
            }
        }
        self.client_actions(s, out);
        self.fault_actions(s, out);
        self.slow_actions(s, out);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => tick(&mut s, last.next_instant(self.horizon)),
            Action::Acquire(c) => acquire(&mut s, c, self.twin),
            Action::Keep(c) => keep(&mut s, c, self),
            Action::Deliver(i) => deliver(&mut s, i, self),
            Action::Slow(i) => {
                s.slowed += 1;
                let until = last.gives_up(&last.net[i]).expect("a renewal's message");
                s.net[i].due = until - EPSILON;
                s.net[i].late = true;
                s.net.sort();
            }
            Action::Elect(m) => elect(&mut s, m),
            Action::Fault(m, f) => {
                s.faults += 1;
                s.members[m].fault = Some(f);
            }
            Action::Recover(m) => recover(&mut s, m, self.release),
            Action::PauseClient(c, p) => {
                s.faults += 1;
                set_pause(&mut s.clients[c].pause, &mut s.world, c, Some(p), s.now);
            }
            Action::ResumeClient(c) => {
                set_pause(&mut s.clients[c].pause, &mut s.world, c, None, s.now);
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

/// Time moves on to `to`; the leader's lessor revokes what expired then.
fn tick(s: &mut State, to: BootInstant) {
    s.now = to;
    s.net.retain(|m| !m.late || m.due >= to);
    s.world.reap(s.now);
    if s.healthy(s.leader) {
        s.expire(s.leader);
    }
}

/// Client `c` finds the key free and takes it, with a lease granted through raft: at the very
/// instant the key went, if it went now.
fn acquire(s: &mut State, c: usize, twin: Option<Twin>) {
    s.tokens += 1;
    let token = s.tokens;
    let start = s.now;
    s.key = Some(Lock { client: c, token });
    for m in 0..3 {
        if s.healthy(m) {
            let expiry = (m == s.leader).then(|| start + server_ticks(TTL));
            s.members[m].leases[c] = Some(LeaseView { token, expiry });
        }
    }
    let mut schedule = Schedule::granted(params(), start, TTL as i64)
        .expect("the grant fits")
        .through_several_members();
    if let Some(t) = twin {
        schedule = schedule.twin(t);
    }
    s.world.start(c, token, start, schedule.deadline());
    s.clients[c].holding = Some(Holding {
        token,
        schedule,
        // Each holder lists the members in its own order, starting with a different one.
        member: c,
        answered: false,
        sidecar: None,
    });
}

/// What the keeper's loop does when its schedule says something is due (session.rs, `run`).
fn keep(s: &mut State, c: usize, model: &Etcd) {
    let now = s.now;
    let Some(next) = s.due(c) else { return };
    let h = holding(s, c);
    let (token, member, sidecar) = (h.token, h.member, h.sidecar);
    match next {
        Next::Lost => lose(s, c),
        Next::Send => {
            holding(s, c).schedule.sent(now);
            s.send(c, member, token, Body::KeepAlive, model.delay, true);
            let others = match model.keeper {
                Keeper::FirstRule => vec![],
                Keeper::Sidecar => sidecar.into_iter().collect(),
                Keeper::EveryMember => (0..3).filter(|m| *m != member).collect(),
            };
            for other in others {
                s.send(c, other, token, Body::KeepAlive, model.delay, false);
            }
        }
        Next::ConfirmBy(_) => {
            holding(s, c).schedule.reading();
            s.send(c, member, token, Body::Read, model.delay, true);
        }
        _ => {
            holding(s, c).schedule.failed(now);
            leave(s, c, model.keeper);
        }
    }
}

fn holding(s: &mut State, c: usize) -> &mut Holding {
    s.clients[c]
        .holding
        .as_mut()
        .expect("a keeper acts only while holding")
}

/// The lease is lost: leasewrap stops the child, and may queue again once it is dead.
fn lose(s: &mut State, c: usize) {
    s.world.stop(c, s.now);
    s.clients[c].holding = None;
    forget_replies(s, c);
}

/// What is in flight for client `c` is no longer waited for: its stream and read are dropped,
/// and with them the replies on their way (the requests may still reach their members).
fn forget_replies(s: &mut State, c: usize) {
    s.net.retain(|m| m.client != c || m.body.is_request());
    for m in s.net.iter_mut().filter(|m| m.client == c) {
        m.heeded = false;
    }
    s.net.sort();
}

impl Body {
    const fn is_request(&self) -> bool {
        matches!(self, Body::KeepAlive | Body::Read)
    }
}

/// The renewal failed: on to the next member (session.rs, `EtcdLink::leave`).
fn leave(s: &mut State, c: usize, keeper: Keeper) {
    forget_replies(s, c);
    let h = holding(s, c);
    if h.answered && keeper == Keeper::Sidecar {
        h.sidecar = Some(h.member);
    }
    h.answered = false;
    h.member = (h.member + 1) % 3;
    if h.sidecar == Some(h.member) {
        h.sidecar = None;
    }
}

/// Two healthy members elect `m`: its lessor is promoted, giving every lease it knows a full
/// TTL plus an election timeout from now. The old leader, stopped, still thinks it leads.
fn elect(s: &mut State, m: usize) {
    s.term += 1;
    s.leader = m;
    let now = s.now;
    for o in 0..3 {
        if s.healthy(o) {
            s.members[o].applied = s.term;
            s.members[o].believes = m;
        }
    }
    let me = &mut s.members[m];
    me.primary = true;
    for l in me.leases.iter_mut().flatten() {
        l.expiry = Some(now + server_ticks(TTL + ELECTION));
    }
}

/// Member `m` runs again. A lessor still primary revokes what it thinks expired before its raft
/// loop demotes it: legitimately on the leader, and on a deposed leader before etcd 3.5.13.
fn recover(s: &mut State, m: usize, release: Release) {
    s.members[m].fault = None;
    let deposed = s.members[m].primary && s.leader != m;
    if s.members[m].primary && (!deposed || release == Release::Old) {
        s.expire(m);
    }
    if s.leader == m {
        return;
    }
    let leader = s.members[s.leader].clone();
    let me = &mut s.members[m];
    me.primary = false;
    me.applied = s.term;
    me.believes = s.leader;
    me.leases = leader
        .leases
        .map(|l| l.map(|l| LeaseView { expiry: None, ..l }));
}

/// Message `i` arrives: a member serves a request, or a keeper reads a reply.
fn deliver(s: &mut State, i: usize, model: &Etcd) {
    let msg = s.net.remove(i);
    // A request whose reply nobody awaits is still served; the reply goes nowhere.
    let reply = match msg.body {
        Body::KeepAlive => keepalive(s, &msg),
        Body::Read => read(s, &msg),
        Body::Kept { .. } | Body::Answer { .. } => {
            if msg.heeded {
                answered(s, &msg, model.keeper);
            }
            None
        }
    };
    if let Some(body) = reply.filter(|_| msg.heeded) {
        s.send(
            msg.client,
            msg.member,
            msg.token,
            body,
            model.delay,
            msg.heeded,
        );
    }
}

/// A keepalive at member `m`: the header's term is filled first, then the renewal is done by
/// the member's lessor if it is primary, else forwarded to the leader it believes in
/// (etcdserver's LeaseRenew). A lessor that thinks the lease expired waits for its revoke
/// and never answers; one that does not know the lease answers TTL 0.
fn keepalive(s: &mut State, msg: &Msg) -> Option<Body> {
    let me = &s.members[msg.member];
    if me.fault == Some(MemberFault::Paused) {
        return None;
    }
    let term = me.applied;
    let renewer = if me.primary { msg.member } else { me.believes };
    let r = &mut s.members[renewer];
    if !r.primary || r.fault == Some(MemberFault::Paused) {
        return None;
    }
    let now = s.now;
    let lease = r.leases[msg.client]
        .as_mut()
        .filter(|l| l.token == msg.token);
    let ttl = match lease {
        None => 0,
        Some(l) if l.expiry.is_some_and(|e| e <= now) => return None,
        Some(l) => {
            l.expiry = Some(now + server_ticks(TTL));
            TTL as i64
        }
    };
    Some(Body::Kept { ttl, term })
}

/// A linearizable read of the own key at member `m`: only once the leader confirmed its
/// read index with a quorum, so never while the member or the leader is stopped.
fn read(s: &mut State, msg: &Msg) -> Option<Body> {
    if !s.healthy(msg.member) || !s.healthy(s.leader) {
        return None;
    }
    let seen = match s.key {
        Some(l) if l.client == msg.client && l.token == msg.token => Seen::Ours,
        Some(_) => Seen::Replaced,
        None => Seen::Gone,
    };
    Some(Body::Answer {
        term: s.members[msg.member].applied,
        seen,
    })
}

/// A reply reaches the keeper, which hands it to its schedule (session.rs, `judge`).
fn answered(s: &mut State, msg: &Msg, keeper: Keeper) {
    let now = s.now;
    let Some(h) = s.clients[msg.client].holding.as_mut() else {
        return;
    };
    let verdict = match msg.body {
        Body::Kept { ttl, term } => {
            h.answered |= ttl > 0;
            let term = u64::from(term);
            h.schedule.replied(now, Kept { ttl, term })
        }
        Body::Answer { term, seen } => {
            let key = match seen {
                Seen::Ours => KeySeen::Ours,
                Seen::Gone => KeySeen::Gone,
                Seen::Replaced => KeySeen::Replaced,
            };
            let term = u64::from(term);
            h.schedule.confirmed(now, Read { term, key })
        }
        _ => return,
    };
    match verdict {
        Verdict::Extended(d) => s.world.extend(msg.client, d),
        Verdict::Lost(_) | Verdict::KeyLost(_) => lose(s, msg.client),
        Verdict::Failed => leave(s, msg.client, keeper),
        Verdict::ToConfirm | Verdict::Ignored => {}
    }
}

impl crate::Twinned for Etcd {
    fn with_twin(self, twin: Twin) -> Self {
        Self {
            twin: Some(twin),
            ..self
        }
    }
}

impl crate::Checked for Etcd {
    fn world(s: &State) -> &World {
        &s.world
    }

    fn healthy(&self) -> bool {
        self.faults.most == 0 && self.faults.slow == 0 && self.delay == 0
    }

    fn now(s: &State) -> f64 {
        ticks(s.now)
    }

    fn describe(&self, s: &State, action: &Action) -> String {
        let after = self.next_state(s, *action).expect("a step of the trace");
        let what = match *action {
            Action::Tick => return effects(s, &after).trim_start_matches("; ").into(),
            Action::Deliver(i) => delivered(s, &s.net[i]),
            other => step(s, &after, other),
        };
        format!("{what}{}", effects(s, &after))
    }
}

fn step(s: &State, after: &State, action: Action) -> String {
    let c = |c: usize| NAMES[c];
    match action {
        Action::Acquire(x) => {
            let h = after.clients[x].holding.as_ref().expect("acquired");
            let start = ticks(s.now);
            let dl = d(&h.schedule);
            format!(
                "{} takes the lock (token {}) at {start:.2}, D = {dl:.2}",
                c(x),
                h.token
            )
        }
        Action::Keep(x) => match s.due(x) {
            Some(Next::Send) => {
                let h = s.clients[x].holding.as_ref().expect("holding");
                let side = h.sidecar.map(|m| format!(" (and, unheeded, to m{m})"));
                format!(
                    "{} sends a keepalive to m{}{}",
                    c(x),
                    h.member,
                    side.unwrap_or_default()
                )
            }
            Some(Next::ConfirmBy(_)) => {
                let h = s.clients[x].holding.as_ref().expect("holding");
                format!("{} sends the confirming read to m{}", c(x), h.member)
            }
            Some(Next::Lost) => format!("{} reaches its stop time: lease lost", c(x)),
            _ => format!("{}'s renewal is late: a failure", c(x)),
        },
        Action::Elect(m) => format!("m{m} is elected leader of term {}", after.term),
        Action::Fault(m, MemberFault::Stuck) => format!("m{m}'s raft loop is stuck in fsync"),
        Action::Fault(m, MemberFault::Paused) => format!("m{m} is paused"),
        Action::Recover(m) => format!("m{m} runs again"),
        Action::PauseClient(x, Pause::Process) => format!("{}'s leasewrap is paused", c(x)),
        Action::PauseClient(x, Pause::Host) => format!("{}'s whole host is paused", c(x)),
        Action::ResumeClient(x) => format!("{} runs again", c(x)),
        Action::Write(x) => format!("{}'s child writes to the fenced resource", c(x)),
        Action::Slow(i) => held_back(&s.net[i]),
        Action::Tick | Action::Deliver(_) => String::new(),
    }
}

fn held_back(m: &Msg) -> String {
    let who = NAMES[m.client];
    let what = what(m);
    format!("{what} {who} is held back: it comes just before {who} gives up on it, or never")
}

/// What a message is, for the timeline.
fn what(m: &Msg) -> String {
    match m.body {
        Body::KeepAlive => format!("the keepalive to m{} of", m.member),
        Body::Read => format!("the confirming read to m{} of", m.member),
        Body::Kept { .. } => format!("m{}'s keepalive reply to", m.member),
        Body::Answer { .. } => format!("m{}'s answer to the read of", m.member),
    }
}

fn delivered(s: &State, m: &Msg) -> String {
    let who = NAMES[m.client];
    let unheeded = if m.heeded { "" } else { " (unheeded)" };
    match m.body {
        Body::KeepAlive => {
            let answered = keepalive(&mut s.clone(), m).is_some();
            let how = if answered {
                "answers"
            } else {
                "does not answer"
            };
            format!("m{} {how} {who}'s keepalive{unheeded}", m.member)
        }
        Body::Read => {
            let answered = read(&mut s.clone(), m).is_some();
            let how = if answered { "serves" } else { "cannot serve" };
            format!("m{} {how} {who}'s linearizable read{unheeded}", m.member)
        }
        Body::Kept { ttl, term } => {
            format!(
                "{who} gets m{}'s keepalive reply: TTL {ttl}, term {term}{unheeded}",
                m.member
            )
        }
        Body::Answer { term, seen } => {
            format!(
                "{who} gets m{}'s read: key {seen:?}, term {term}{unheeded}",
                m.member
            )
        }
    }
}

/// What a step changed that the timeline must show: deadlines, revokes, children.
fn effects(s: &State, after: &State) -> String {
    let mut out = String::new();
    for (c, name) in NAMES.iter().enumerate() {
        let before = s.clients[c].holding.as_ref().map(|h| h.schedule.deadline());
        let now = after.clients[c]
            .holding
            .as_ref()
            .map(|h| h.schedule.deadline());
        if let (Some(b), Some(n)) = (before, now) {
            if n > b {
                out.push_str(&format!("; {}'s D moves to {:.2}", name, ticks(n)));
            }
        }
        if before.is_some() && now.is_none() {
            let end = after.world.children[c].as_ref().map(|ch| ticks(ch.end));
            let end = end.map(|e| format!(", its child dead by {e:.2}"));
            out.push_str(&format!(
                "; {} stops its child{}",
                name,
                end.unwrap_or_default()
            ));
        }
    }
    if s.key.is_some() && after.key.is_none() {
        out.push_str("; the lease is revoked, the lock key deleted");
    }
    out.push_str(&s.world.newly_broken(&after.world));
    out
}

fn d(s: &Schedule) -> f64 {
    ticks(s.deadline())
}
