//! A scripted ZooKeeper, for the tests of leasewrap's own client at its seams (session, keeper,
//! handshake): members on free loopback ports that speak the client protocol (jute) over one
//! small tree in memory, and misbehave on cue ([`Cue`]) as a healthy server rarely does: close
//! a connection during authentication, fail a multi's op, require SASL (-124), answer a move with
//! another session id, send what is not ZooKeeper's, stop reading, answer out of order, never
//! answer a step (a follower cut off from its leader, which still answers PINGs).
//!
//! It is not a ZooKeeper: no quorum, no ACLs enforced (any credentials pass), no expiry but a
//! close. What leasewrap asks of it is what a run asks: connect and move, `conf`, create2,
//! delete, exists (with watches), getData, getChildren2, getACL, sync, a multi of checks, ping,
//! addauth, closeSession. Every connect and request is recorded ([`Seen`]), so that a test waits
//! for what happened instead of sleeping. Threads, one a connection; each dies with its socket.
//! Its jute is its own, not the client's (src/lease/zk/wire.rs): a mistake in one is not copied
//! into the other.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// What a member does, set by the test at any time; each takes effect from the next packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cue {
    /// Close every connection that asks for a session, before answering it (no quorum).
    NotServing,
    /// Answer every connect request with these bytes, then close.
    Answer(Vec<u8>),
    /// Answer every connect request with these bytes, one every 50 ms.
    Drip(Vec<u8>),
    /// Hold a connect request that asks for this timeout (ms) until the cue is lifted.
    HoldAsking(i32),
    /// Close the connection when an `addauth` or a SASL token comes.
    CloseDuringAuth,
    /// Answer the first request that is not authentication with -124, then close.
    RequireSasl,
    /// Fail each check op of a multi with this code (the reply's header stays OK).
    FailChecks(i32),
    /// Never answer requests of this type (9: sync, 14: multi); PINGs are still answered.
    Stall(i32),
    /// Stop reading every connection's requests.
    StopReading,
    /// Answer two requests that came together in the reverse order.
    OutOfOrder,
    /// Answer a session being moved here with another session id.
    OtherSessionId,
    /// Close the connection when a request of this type comes (15: create2), unanswered.
    CloseOn(i32),
    /// Close the connection when a create2 of this path comes, unanswered: once, on whichever
    /// member cued so sees it first (the cue is then lifted from every member).
    CloseOnCreateOf(String),
}

/// What a member saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A connect request asking for `asked` ms, for `session` (0: a new one), answered with this
    /// session id and negotiated timeout (none when not answered).
    Connect {
        member: usize,
        asked: i32,
        session: i64,
        given: Option<(i64, i32)>,
    },
    /// A request of type `op` in `session`.
    Request {
        member: usize,
        session: i64,
        op: i32,
    },
}

/// Members sharing one tree.
pub struct FakeZk {
    shared: Arc<Shared>,
    addrs: Vec<SocketAddr>,
}

struct Shared {
    state: Mutex<Tree>,
    changed: Condvar,
}

#[derive(Default)]
struct Tree {
    nodes: BTreeMap<String, Node>,
    sessions: BTreeMap<i64, (Vec<u8>, i32)>,
    /// Each member's cues and session timeout bounds (ms).
    members: Vec<(Vec<Cue>, (i32, i32))>,
    /// Each open connection's socket, its member and its session, to close on cue.
    conns: Vec<(usize, i64, TcpStream)>,
    watches: Vec<(String, TcpStream)>,
    seen: Vec<Seen>,
    zxid: i64,
    next_session: i64,
}

struct Node {
    data: Vec<u8>,
    czxid: i64,
    owner: i64,
    seq: i32,
}

impl FakeZk {
    /// `n` members, each granting session timeouts in [`min`, `max`] ms.
    pub fn start(n: usize, min: i32, max: i32) -> FakeZk {
        let mut tree = Tree {
            next_session: 0x5eed_0000_0000,
            ..Tree::default()
        };
        tree.nodes.insert("/".into(), node(Vec::new(), 0, 0));
        tree.members = vec![(Vec::new(), (min, max)); n];
        let shared = Arc::new(Shared {
            state: Mutex::new(tree),
            changed: Condvar::new(),
        });
        let addrs = (0..n)
            .map(|member| {
                let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind loopback");
                let addr = listener.local_addr().expect("a bound address");
                let shared = shared.clone();
                thread::spawn(move || accept(&listener, member, &shared));
                addr
            })
            .collect();
        FakeZk { shared, addrs }
    }

    /// Member `i`'s `host:port`.
    pub fn addr(&self, i: usize) -> String {
        self.addrs[i].to_string()
    }

    /// Every member, as a connect string.
    pub fn connect(&self) -> String {
        (0..self.addrs.len())
            .map(|i| self.addr(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Give member `i` this cue too.
    pub fn cue(&self, i: usize, cue: Cue) {
        self.lock().members[i].0.push(cue);
    }

    /// Lift every cue of member `i`.
    pub fn lift(&self, i: usize) {
        self.lock().members[i].0.clear();
        self.shared.changed.notify_all();
    }

    /// Member `i` grants timeouts in [`min`, `max`] ms from now on.
    pub fn bounds(&self, i: usize, min: i32, max: i32) {
        self.lock().members[i].1 = (min, max);
    }

    /// Close every connection member `i` has: its clients move elsewhere.
    pub fn drop_connections(&self, i: usize) {
        let mut tree = self.lock();
        for (_, _, s) in tree.conns.iter().filter(|c| c.0 == i) {
            let _ = s.shutdown(Shutdown::Both);
        }
        tree.conns.retain(|c| c.0 != i);
    }

    /// Everything seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// Wait until `what` holds of what was seen, within `bound`.
    #[track_caller]
    pub fn wait_for(&self, bound: Duration, what: &str, cond: impl Fn(&[Seen]) -> bool) {
        if !self.saw_within(bound, cond) {
            panic!(
                "timed out after {bound:?} waiting for {what}: saw {:?}",
                self.seen()
            );
        }
    }

    /// Whether `cond` comes to hold of what was seen within `bound`.
    pub fn saw_within(&self, bound: Duration, cond: impl Fn(&[Seen]) -> bool) -> bool {
        let until = Instant::now() + bound;
        let mut tree = self.lock();
        while !cond(&tree.seen) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            tree = self
                .shared
                .changed
                .wait_timeout(tree, left)
                .expect("the fake's lock")
                .0;
        }
        true
    }

    /// The lock nodes under `parent`, by name.
    pub fn children(&self, parent: &str) -> Vec<String> {
        self.lock().children(parent)
    }

    fn lock(&self) -> MutexGuard<'_, Tree> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn node(data: Vec<u8>, czxid: i64, owner: i64) -> Node {
    Node {
        data,
        czxid,
        owner,
        seq: 0,
    }
}

fn accept(listener: &TcpListener, member: usize, shared: &Arc<Shared>) {
    for stream in listener.incoming().flatten() {
        let shared = shared.clone();
        thread::spawn(move || {
            let mut conn = Conn {
                member,
                shared,
                stream,
                session: 0,
            };
            let _ = conn.serve();
            // The socket's clones (kept to close on cue, or for watches) must not keep it open.
            let _ = conn.stream.shutdown(Shutdown::Both);
        });
    }
}

/// One client connection.
struct Conn {
    member: usize,
    shared: Arc<Shared>,
    stream: TcpStream,
    session: i64,
}

type Io<T> = std::io::Result<T>;

impl Conn {
    fn state(&self) -> MutexGuard<'_, Tree> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cued(&self, want: impl Fn(&Cue) -> bool) -> Option<Cue> {
        self.state().members[self.member]
            .0
            .iter()
            .find(|c| want(c))
            .cloned()
    }

    fn record(&self, seen: Seen) {
        self.state().seen.push(seen);
        self.shared.changed.notify_all();
    }

    fn serve(&mut self) -> Io<()> {
        let mut head = [0u8; 4];
        self.stream.read_exact(&mut head)?;
        if head.iter().all(u8::is_ascii_lowercase) {
            // A four-letter word: `conf` is not in the default whitelist.
            let refusal = format!(
                "{} is not executed because it is not in the whitelist.\n",
                String::from_utf8_lossy(&head)
            );
            return self.stream.write_all(refusal.as_bytes());
        }
        let len = i32::from_be_bytes(head) as usize;
        let mut body = vec![0; len];
        self.stream.read_exact(&mut body)?;
        if !self.connect(&body)? {
            return Ok(());
        }
        let mut held: Option<Vec<u8>> = None;
        loop {
            while self.cued(|c| *c == Cue::StopReading).is_some() {
                thread::sleep(Duration::from_millis(20));
            }
            let frame = read_frame(&mut self.stream)?;
            if self.cued(|c| *c == Cue::OutOfOrder).is_some() && frame_xid(&frame) > 0 {
                match held.take() {
                    None => {
                        held = Some(frame);
                        continue;
                    }
                    Some(first) => {
                        self.request(&frame)?;
                        self.request(&first)?;
                        continue;
                    }
                }
            }
            if !self.request(&frame)? {
                return Ok(());
            }
        }
    }

    /// Answer the connect request in `body`: false when the connection ends here.
    fn connect(&mut self, body: &[u8]) -> Io<bool> {
        let mut r = Reader(body);
        let (_, _, asked, session, password) = (r.int(), r.long(), r.int(), r.long(), r.buffer());
        let mut seen = Seen::Connect {
            member: self.member,
            asked,
            session,
            given: None,
        };
        while self.cued(|c| *c == Cue::HoldAsking(asked)).is_some() {
            thread::sleep(Duration::from_millis(10));
        }
        match self.cued(|c| matches!(c, Cue::NotServing | Cue::Answer(_) | Cue::Drip(_))) {
            Some(Cue::Answer(bytes)) => self.stream.write_all(&bytes)?,
            Some(Cue::Drip(bytes)) => {
                for b in bytes {
                    self.stream.write_all(&[b])?;
                    thread::sleep(Duration::from_millis(50));
                }
            }
            Some(_) => {}
            None => {
                let (id, timeout) = self.session_for(asked, session, &password);
                if let Seen::Connect { given, .. } = &mut seen {
                    *given = Some((id, timeout));
                }
                let password = self
                    .state()
                    .sessions
                    .get(&id)
                    .map(|s| s.0.clone())
                    .unwrap_or_default();
                let mut out = Writer::default();
                out.int(0)
                    .int(timeout)
                    .long(id)
                    .buffer(&password)
                    .bool(false);
                // Seen once answered: a test that acts on it acts on a session the client has.
                let written = self.stream.write_all(&out.framed());
                self.record(seen);
                written?;
                return Ok(timeout > 0);
            }
        }
        self.record(seen);
        Ok(false)
    }

    /// The session this connect opens or moves here, and its timeout (0: it is gone).
    fn session_for(&mut self, asked: i32, session: i64, password: &[u8]) -> (i64, i32) {
        let other = self.cued(|c| *c == Cue::OtherSessionId).is_some();
        let mut tree = self.state();
        let (min, max) = tree.members[self.member].1;
        let timeout = asked.clamp(min, max);
        let known = tree.sessions.get(&session).is_some_and(|s| s.0 == password);
        let id = match (session, known, other) {
            (0, _, _) | (_, true, true) => {
                tree.next_session += 1;
                tree.next_session
            }
            (_, true, false) => session,
            (_, false, _) => return (0, 0),
        };
        tree.sessions
            .insert(id, (id.to_be_bytes().repeat(2), timeout));
        tree.conns.push((
            self.member,
            id,
            self.stream.try_clone().expect("a socket clone"),
        ));
        drop(tree);
        self.session = id;
        (id, timeout)
    }

    /// Answer one request: false when the connection ends here.
    fn request(&mut self, frame: &[u8]) -> Io<bool> {
        let mut r = Reader(frame);
        let (xid, op) = (r.int(), r.int());
        let auth = op == 100 || op == 102;
        if auth && self.cued(|c| *c == Cue::CloseDuringAuth).is_some() {
            return Ok(false);
        }
        if op != 11 {
            self.record(Seen::Request {
                member: self.member,
                session: self.session,
                op,
            });
        }
        if !auth && self.cued(|c| *c == Cue::RequireSasl).is_some() {
            self.reply(xid, -124, &Writer::default())?;
            return Ok(false);
        }
        if self.cued(|c| *c == Cue::Stall(op)).is_some() {
            return Ok(true);
        }
        if self.cued(|c| *c == Cue::CloseOn(op)).is_some() {
            return Ok(false);
        }
        if op == 15 {
            let cue = Cue::CloseOnCreateOf(Reader(r.0).string());
            if self.cued(|c| *c == cue).is_some() {
                for (cues, _) in &mut self.state().members {
                    cues.retain(|c| *c != cue);
                }
                return Ok(false);
            }
        }
        let (err, out) = self.answer(op, &mut r);
        self.reply(xid, err, &out)?;
        Ok(op != -11)
    }

    fn reply(&mut self, xid: i32, err: i32, body: &Writer) -> Io<()> {
        let zxid = self.state().zxid;
        let mut out = Writer::default();
        out.int(xid).long(zxid).int(err);
        out.0.extend_from_slice(&body.0);
        self.stream.write_all(&out.framed())
    }

    /// The error code and body of the answer to request `op`.
    fn answer(&mut self, op: i32, r: &mut Reader) -> (i32, Writer) {
        let mut out = Writer::default();
        let fail_checks = self.cued(|c| matches!(c, Cue::FailChecks(_)));
        let session = self.session;
        let mut tree = self.state();
        let err = match op {
            15 => tree.create_asked(r, session, &mut out),
            2 => tree.delete(&r.string()),
            3 | 4 | 6 | 12 => {
                let path = r.string();
                let watch = op != 6 && r.bool();
                let found = tree.read(op, &path, &mut out);
                if watch {
                    let stream = self.stream.try_clone().expect("a socket clone");
                    tree.watches.push((path, stream));
                }
                found
            }
            9 => {
                out.string(&r.string());
                Ok(())
            }
            14 => {
                tree.multi(r, &mut out, fail_checks);
                Ok(())
            }
            -11 => {
                tree.close(session);
                Ok(())
            }
            102 => {
                out.buffer(b"");
                Ok(())
            }
            _ => Ok(()),
        };
        drop(tree);
        self.shared.changed.notify_all();
        (err.err().unwrap_or(0), out)
    }
}

/// What a node's Stat says, as the tree has it.
struct Stat {
    czxid: i64,
    owner: i64,
    data_len: i32,
    children: i32,
}

impl Stat {
    fn write(&self, out: &mut Writer) {
        out.long(self.czxid)
            .long(self.czxid)
            .long(0)
            .long(0)
            .int(0)
            .int(0)
            .int(0);
        out.long(self.owner)
            .int(self.data_len)
            .int(self.children)
            .long(self.czxid);
    }
}

impl Tree {
    fn children(&self, parent: &str) -> Vec<String> {
        let prefix = if parent == "/" {
            "/".to_owned()
        } else {
            format!("{parent}/")
        };
        self.nodes
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|rest| !rest.is_empty() && !rest.contains('/'))
            .map(str::to_owned)
            .collect()
    }

    fn stat(&self, path: &str) -> Option<Stat> {
        let n = self.nodes.get(path)?;
        Some(Stat {
            czxid: n.czxid,
            owner: n.owner,
            data_len: n.data.len() as i32,
            children: self.children(path).len() as i32,
        })
    }

    /// The create2 request in `r`, by `session`: the path made and its Stat into `out`.
    fn create_asked(&mut self, r: &mut Reader, session: i64, out: &mut Writer) -> Result<(), i32> {
        let (path, data) = (r.string(), r.buffer());
        let _acls = (0..r.int())
            .map(|_| (r.int(), r.string(), r.string()))
            .count();
        let flags = r.int();
        let (made, stat) = self.create(&path, data, flags, session)?;
        out.string(&made);
        stat.write(out);
        Ok(())
    }

    fn create(
        &mut self,
        path: &str,
        data: Vec<u8>,
        flags: i32,
        session: i64,
    ) -> Result<(String, Stat), i32> {
        let parent = match path.rsplit_once('/') {
            Some(("", _)) => "/".to_owned(),
            Some((p, _)) => p.to_owned(),
            None => return Err(-8),
        };
        let seq = self.nodes.get_mut(&parent).ok_or(-101)?;
        let made = match flags & 2 {
            0 => path.to_owned(),
            _ => {
                seq.seq += 1;
                format!("{path}{:010}", seq.seq - 1)
            }
        };
        if self.nodes.contains_key(&made) {
            return Err(-110);
        }
        self.zxid += 1;
        let owner = if flags & 1 == 1 { session } else { 0 };
        self.nodes
            .insert(made.clone(), node(data, self.zxid, owner));
        let stat = self.stat(&made).expect("just made");
        Ok((made, stat))
    }

    fn delete(&mut self, path: &str) -> Result<(), i32> {
        self.nodes.remove(path).ok_or(-101)?;
        self.zxid += 1;
        let event = {
            let mut out = Writer::default();
            out.int(-1)
                .long(self.zxid)
                .int(0)
                .int(2)
                .int(3)
                .string(path);
            out.framed()
        };
        for (_, mut s) in self.watches.extract_if_path(path) {
            let _ = s.write_all(&event);
        }
        Ok(())
    }

    fn read(&self, op: i32, path: &str, out: &mut Writer) -> Result<(), i32> {
        let stat = self.stat(path).ok_or(-101)?;
        match op {
            4 => {
                out.buffer(&self.nodes[path].data);
            }
            6 => {
                out.int(1).int(31).string("world").string("anyone");
            }
            12 => {
                let names = self.children(path);
                out.int(names.len() as i32);
                for n in &names {
                    out.string(n);
                }
            }
            _ => {}
        }
        stat.write(out);
        Ok(())
    }

    /// A multi of checks: each op's result, failed with `fail` when cued.
    fn multi(&mut self, r: &mut Reader, out: &mut Writer, fail: Option<Cue>) {
        loop {
            let (op, done, _) = (r.int(), r.bool(), r.int());
            if done {
                break;
            }
            let path = r.string();
            let _version = r.int();
            let err = match (&fail, self.nodes.contains_key(&path)) {
                (Some(Cue::FailChecks(code)), _) => *code,
                (_, true) => 0,
                (_, false) => -101,
            };
            match err {
                0 => out.int(op).bool(false).int(0),
                e => out.int(-1).bool(false).int(e).int(e),
            };
        }
        out.int(-1).bool(true).int(-1);
    }

    fn close(&mut self, session: i64) {
        self.sessions.remove(&session);
        let gone: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.owner == session)
            .map(|(k, _)| k.clone())
            .collect();
        for path in gone {
            let _ = self.delete(&path);
        }
    }
}

/// Watches on a path, taken out when they fire.
trait Watches {
    fn extract_if_path(&mut self, path: &str) -> Vec<(String, TcpStream)>;
}

impl Watches for Vec<(String, TcpStream)> {
    fn extract_if_path(&mut self, path: &str) -> Vec<(String, TcpStream)> {
        let (fire, keep): (Vec<_>, Vec<_>) = std::mem::take(self)
            .into_iter()
            .partition(|(p, _)| p == path);
        *self = keep;
        fire
    }
}

fn read_frame(stream: &mut TcpStream) -> Io<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let mut body = vec![0; i32::from_be_bytes(len).max(0) as usize];
    stream.read_exact(&mut body)?;
    Ok(body)
}

fn frame_xid(frame: &[u8]) -> i32 {
    Reader(frame).int()
}

/// Jute, read: a malformed request reads as zeros and empty strings.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn int(&mut self) -> i32 {
        self.take(4).try_into().map_or(0, i32::from_be_bytes)
    }
    fn long(&mut self) -> i64 {
        self.take(8).try_into().map_or(0, i64::from_be_bytes)
    }
    fn bool(&mut self) -> bool {
        self.take(1).first().is_some_and(|b| *b != 0)
    }
    fn buffer(&mut self) -> Vec<u8> {
        let n = self.int().max(0) as usize;
        self.take(n).to_vec()
    }
    fn string(&mut self) -> String {
        String::from_utf8_lossy(&self.buffer()).into_owned()
    }
}

/// Jute, written.
#[derive(Default)]
pub struct Writer(Vec<u8>);

impl Writer {
    pub fn int(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn long(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.0.push(u8::from(v));
        self
    }
    pub fn buffer(&mut self, v: &[u8]) -> &mut Self {
        self.int(v.len() as i32);
        self.0.extend_from_slice(v);
        self
    }
    pub fn string(&mut self, v: &str) -> &mut Self {
        self.buffer(v.as_bytes())
    }
    /// The record behind its 4-byte length.
    pub fn framed(&self) -> Vec<u8> {
        let mut out = (self.0.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(&self.0);
        out
    }
}

/// Member `i`'s sessions so far, in the order they were given.
pub fn sessions_given(seen: &[Seen], i: usize) -> Vec<(i64, i32)> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Connect {
                member,
                given: Some(g),
                ..
            } if *member == i => Some(*g),
            _ => None,
        })
        .collect()
}

/// Whether member `i` saw a request of type `op`.
pub fn requested(seen: &[Seen], i: usize, op: i32) -> bool {
    seen.iter()
        .any(|s| matches!(s, Seen::Request { member, op: o, .. } if *member == i && *o == op))
}
