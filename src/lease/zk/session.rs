//! A ZooKeeper session: one task that owns the connection to one member at a time, sends each
//! request in the order it was made, matches each answer to its request, fires one-shot watches,
//! pings when nothing else was sent for a third of the timeout, and moves the session to the next
//! member when the connection is lost. [`Zk`] is the handle: every request is queued the moment
//! its method is called (so requests made one after another are pipelined, and a send time read
//! before the call is never later than the real one), and answered with the number of the
//! connection that answered it, so that a renewal can prove all its steps went over one.
//!
//! A request whose connection is lost before its answer fails with `ConnectionLoss` and is never
//! sent again: it may have been applied. Closing the session is a request of its own, and the
//! server deletes the session's ephemeral nodes with it.
//!
//! Every connection that negotiates a shorter timeout than all before it is kept in the session's
//! own record, from the first connect on, so that the timing rule sees each of them whenever it
//! looks: a state channel keeps only the latest state, and a keeper that starts late would miss
//! a move made before. An answer that is not ZooKeeper's ends the connection; -124 (the server
//! requires SASL) ends the session as refused credentials; a reconnect that another session id
//! answers ends it as lost.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::net::{self, Failure, Hello, Link, Reach};
use super::wire::{self, Acl, Body, Code, In, Mode, MultiOp, Op, Out, Reply, Stat};
use crate::clock::BootInstant;

/// What a session is opened with.
#[derive(Clone)]
pub struct Options {
    /// `host:port` each, tried in turn from a random one.
    pub members: Vec<String>,
    /// Prefixed to every path sent, taken off every path answered: `""` or `/a/b`.
    pub chroot: String,
    /// The session timeout asked for; each member clamps it to its own bounds.
    pub timeout: Duration,
    /// The bound on opening the session, shared among the members tried.
    pub dial: Duration,
    pub reach: Reach,
}

/// One connection of the session, as its task publishes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// Counts the session's connections from 1.
    pub epoch: u32,
    pub member: String,
    /// The timeout this member negotiated: the one its touches count with.
    pub timeout: Duration,
    /// When its connect request was written (read just before).
    pub sent: BootInstant,
    /// The connect request's round trip.
    pub round_trip: Duration,
}

/// Where the session is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Connected(Connection),
    /// The connection was lost; the task is moving the session to another member.
    Disconnected,
    /// A member said the session is gone.
    Expired,
    /// Closed by us.
    Closed,
    /// A member refused the credentials.
    AuthFailed(String),
}

/// Why a request got no answer of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ZkError {
    /// The server's error code.
    Server(Code),
    /// The connection was lost first (the request may have been applied), or none was up.
    ConnectionLoss(String),
    /// The session is over: expired, closed, or its credentials refused.
    Ended(State),
    Malformed(String),
}

impl ZkError {
    pub const fn is(&self, code: Code) -> bool {
        matches!(self, ZkError::Server(c) if c.0 == code.0)
    }
}

impl std::fmt::Display for ZkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ZkError::Server(code) => write!(f, "{code}"),
            ZkError::ConnectionLoss(why) => write!(f, "connection lost: {why}"),
            ZkError::Ended(State::Expired) => f.write_str("the session has expired"),
            ZkError::Ended(State::AuthFailed(why)) => write!(f, "refused the credentials: {why}"),
            ZkError::Ended(_) => f.write_str("the session is closed"),
            ZkError::Malformed(why) => f.write_str(why),
        }
    }
}

/// An answer, by the kind of request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Created(String, Stat),
    Stat(Option<Stat>),
    Data(Vec<u8>, Stat),
    Children(Vec<String>, Stat),
    Acl(Vec<Acl>, Stat),
    /// Each op's result; the reply as a whole was Ok.
    Multi(Vec<Result<(), Code>>),
    Sasl(Vec<u8>),
    Done,
}

/// An answer and the connection that gave it.
pub type Answered = (Answer, u32);

/// An `exists`: the node's Stat (none when there is no node), and the connection.
pub type Exists = Result<(Option<Stat>, u32), ZkError>;

/// What a one-shot watch saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    /// The event's type (NodeCreated 1, NodeDeleted 2, NodeDataChanged 3).
    Event(i32),
    /// The connection was lost: the watch may have been lost with it; look again.
    Disconnected,
}

/// A watch set by a request that succeeded.
pub struct Watch(oneshot::Receiver<Watched>);

impl Watch {
    pub async fn changed(self) -> Watched {
        self.0.await.unwrap_or(Watched::Disconnected)
    }
}

struct Call {
    op: Op,
    body: Body,
    reply: oneshot::Sender<Result<Answered, ZkError>>,
    watch: Option<oneshot::Sender<Watched>>,
}

/// A session's handle. Clones share the session.
#[derive(Clone)]
pub struct Zk {
    calls: mpsc::UnboundedSender<Call>,
    state: watch::Receiver<State>,
    chroot: Arc<str>,
    session_id: i64,
    /// The connections that negotiated a shorter timeout than every one before them.
    shorter: Shorter,
    /// The number of a connection to drop (a step stuck on it), for the session's task.
    drop: Arc<watch::Sender<u32>>,
}

/// The connections whose negotiated timeout was shorter than every earlier one's, oldest first
/// (the first connection always): a few at most, since each is shorter than the last.
type Shorter = Arc<std::sync::Mutex<Vec<Connection>>>;

/// Keep `c` when its timeout is shorter than every one kept.
fn keep_if_shorter(shorter: &Shorter, c: &Connection) {
    let mut kept = shorter
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !matches!(kept.last(), Some(last) if c.timeout >= last.timeout) {
        kept.push(c.clone());
    }
}

/// How long a session whose every handle is gone waits for its closeSession to be written.
const CLOSE_WRITTEN_WITHIN: Duration = Duration::from_secs(1);

/// What the server's -124 means, to the user.
pub const SASL_REQUIRED: &str = "the ensemble requires SASL authentication of every client \
     (zookeeper.enforce.auth): give --zk-auth sasl with --user and --password-file";

/// Why no member gave a session: each member tried, and what it did.
pub type Refusals = Vec<(String, Failure)>;

/// Open a session: members are tried in turn, each within its share of the dial bound (what the
/// earlier ones left, divided among the rest), so a hung member costs only its share.
pub async fn open(opts: Options) -> Result<Zk, Refusals> {
    let n = opts.members.len();
    let start = (crate::files::random_u64() as usize) % n.max(1);
    let until = Instant::now() + opts.dial;
    let hello = Hello {
        timeout: opts.timeout,
        session_id: 0,
        password: &[],
        last_zxid: 0,
    };
    let mut refusals = Vec::new();
    for i in 0..n {
        let member = &opts.members[(start + i) % n];
        let share = until.saturating_duration_since(Instant::now()) / (n - i) as u32;
        match net::link(member, &opts.reach, &hello, share).await {
            Ok(link) => return Ok(Zk::start(link, opts, (start + i + 1) % n)),
            Err(why) => refusals.push((member.clone(), why)),
        }
    }
    Err(refusals)
}

impl Zk {
    fn start(link: Link, opts: Options, next: usize) -> Zk {
        let (calls, rx) = mpsc::unbounded_channel();
        let first = connection(&link, 1);
        let shorter = Shorter::default();
        keep_if_shorter(&shorter, &first);
        let (tx, state) = watch::channel(State::Connected(first));
        let (drop, dropped) = watch::channel(0);
        let zk = Zk {
            calls,
            state,
            chroot: opts.chroot.clone().into(),
            session_id: link.connected.session_id,
            shorter: shorter.clone(),
            drop: Arc::new(drop),
        };
        let task = Task {
            password: link.connected.password.clone(),
            session_id: link.connected.session_id,
            opts,
            calls: rx,
            state: tx,
            shorter,
            dropped,
            last_zxid: 0,
            epoch: 1,
            next,
        };
        tokio::spawn(task.run(link));
        zk
    }

    /// The same session, its paths under `chroot` (`""`: none).
    pub fn with_chroot(&self, chroot: &str) -> Zk {
        Zk {
            chroot: chroot.into(),
            ..self.clone()
        }
    }

    pub fn session_id(&self) -> i64 {
        self.session_id
    }

    pub fn state(&self) -> State {
        self.state.borrow().clone()
    }

    /// The connections after connection `epoch` that negotiated a shorter timeout than every
    /// one before them, in order: each lowers what the timing rule counts with.
    pub fn shorter_after(&self, epoch: u32) -> Vec<Connection> {
        let kept = self
            .shorter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.iter().filter(|c| c.epoch > epoch).cloned().collect()
    }

    /// Drop connection `epoch`, if the session is still on it, and move to the next member: a
    /// request on it has waited too long (a follower cut off from its leader answers reads and
    /// pings, never a sync or a write). With one member there is no next one: the connection is
    /// kept.
    pub fn drop_connection(&self, epoch: u32) {
        self.drop.send_replace(epoch);
    }

    /// After a request failed with `ConnectionLoss`: wait, at most `within`, until the session
    /// is on a connection newer than the one that was lost (the state may not say Disconnected
    /// yet), or has ended.
    pub async fn reconnected(&self, within: Duration) {
        let mut states = self.state.clone();
        let lost = match &*states.borrow() {
            State::Connected(c) => c.epoch,
            _ => 0,
        };
        let moved = states.wait_for(|s| match s {
            State::Connected(c) => c.epoch > lost,
            State::Disconnected => false,
            _ => true,
        });
        let _ = tokio::time::timeout(within, moved).await;
    }

    /// The session's states from now on.
    pub fn states(&self) -> watch::Receiver<State> {
        let mut rx = self.state.clone();
        rx.mark_unchanged();
        rx
    }

    /// The path as the server knows it.
    fn full(&self, path: &str) -> String {
        match (self.chroot.is_empty(), path) {
            (true, _) => path.to_owned(),
            (false, "/") => self.chroot.to_string(),
            (false, _) => format!("{}{path}", self.chroot),
        }
    }

    /// Queue `op` now; its answer later.
    pub fn request(
        &self,
        op: Op,
        body: Body,
        watch: bool,
    ) -> (
        impl Future<Output = Result<Answered, ZkError>> + Send + 'static,
        Option<Watch>,
    ) {
        let (reply, answer) = oneshot::channel();
        let (watch, watched) = match watch {
            true => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(Watch(rx)))
            }
            false => (None, None),
        };
        let _ = self.calls.send(Call {
            op,
            body,
            reply,
            watch,
        });
        let ended = self.state.clone();
        let answer = async move {
            match answer.await {
                Ok(result) => result,
                Err(_) => Err(ZkError::Ended(ended.borrow().clone())),
            }
        };
        (answer, watched)
    }

    /// Create the node `path` (create2: with its Stat); the path made, as the client sees it.
    pub fn create(
        &self,
        path: &str,
        data: &[u8],
        acls: &[Acl],
        mode: Mode,
    ) -> impl Future<Output = Result<(String, Stat), ZkError>> + Send + 'static {
        let body = Body::Create {
            path: self.full(path),
            data: data.to_vec(),
            acls: acls.to_vec(),
            mode,
        };
        let chroot = self.chroot.clone();
        let answer = self.typed(Op::Create2, body, |a| match a {
            Answer::Created(made, stat) => Ok((made, stat)),
            other => Err(other),
        });
        async move {
            let ((made, stat), _) = answer.await?;
            let made = made.strip_prefix(&*chroot).filter(|p| !p.is_empty());
            Ok((made.unwrap_or("/").to_owned(), stat))
        }
    }

    pub fn delete(&self, path: &str) -> impl Future<Output = Result<(), ZkError>> + Send + 'static {
        let answer = self.typed(Op::Delete, Body::Delete(self.full(path)), |_| Ok(()));
        async move { answer.await.map(|_| ()) }
    }

    /// The node's Stat, none when there is no node; with `watch`, a watch on it either way.
    pub fn exists(
        &self,
        path: &str,
        watch: bool,
    ) -> (impl Future<Output = Exists> + Send + 'static, Option<Watch>) {
        let body = Body::Read {
            op: Op::Exists,
            path: self.full(path),
            watch,
        };
        let (answer, watched) = self.request(Op::Exists, body, watch);
        let answer = of_kind(answer, |a| match a {
            Answer::Stat(stat) => Ok(stat),
            other => Err(other),
        });
        (answer, watched)
    }

    pub fn get_data(
        &self,
        path: &str,
    ) -> impl Future<Output = Result<(Vec<u8>, Stat), ZkError>> + Send + 'static {
        let answer = self.typed(Op::GetData, self.read(Op::GetData, path), |a| match a {
            Answer::Data(data, stat) => Ok((data, stat)),
            other => Err(other),
        });
        async move { answer.await.map(|(a, _)| a) }
    }

    /// The names of the node's children, and its Stat.
    pub fn children(
        &self,
        path: &str,
    ) -> impl Future<Output = Result<(Vec<String>, Stat), ZkError>> + Send + 'static {
        let body = self.read(Op::GetChildren2, path);
        let answer = self.typed(Op::GetChildren2, body, |a| match a {
            Answer::Children(names, stat) => Ok((names, stat)),
            other => Err(other),
        });
        async move { answer.await.map(|(a, _)| a) }
    }

    pub fn get_acl(
        &self,
        path: &str,
    ) -> impl Future<Output = Result<Vec<Acl>, ZkError>> + Send + 'static {
        let answer = self.typed(Op::GetAcl, Body::GetAcl(self.full(path)), |a| match a {
            Answer::Acl(acls, _) => Ok(acls),
            other => Err(other),
        });
        async move { answer.await.map(|(a, _)| a) }
    }

    /// A read of `path` without a watch.
    fn read(&self, op: Op, path: &str) -> Body {
        Body::Read {
            op,
            path: self.full(path),
            watch: false,
        }
    }

    /// Queue `op` now (no watch); its answer, of the kind `pick` takes, and the connection.
    fn typed<T: Send + 'static>(
        &self,
        op: Op,
        body: Body,
        pick: fn(Answer) -> Result<T, Answer>,
    ) -> impl Future<Output = Result<(T, u32), ZkError>> + Send + 'static {
        of_kind(self.request(op, body, false).0, pick)
    }

    /// A `sync`: answered once the leader's answer to it reached the member.
    pub fn sync(&self, path: &str) -> impl Future<Output = Result<u32, ZkError>> + Send + 'static {
        let (answer, _) = self.request(Op::Sync, Body::Sync(self.full(path)), false);
        async move { answer.await.map(|(_, epoch)| epoch) }
    }

    /// A multi (a transaction through the leader): each op's result, and the connection.
    pub fn multi(
        &self,
        ops: Vec<MultiOp>,
    ) -> impl Future<Output = Result<(Vec<Result<(), Code>>, u32), ZkError>> + Send + 'static {
        let ops = ops
            .into_iter()
            .map(|op| match op {
                MultiOp::Check(p) => MultiOp::Check(self.full(&p)),
                MultiOp::Create { path, data, acls } => MultiOp::Create {
                    path: self.full(&path),
                    data,
                    acls,
                },
                MultiOp::SetData { path, data } => MultiOp::SetData {
                    path: self.full(&path),
                    data,
                },
            })
            .collect();
        self.typed(Op::Multi, Body::Multi(ops), |a| match a {
            Answer::Multi(results) => Ok(results),
            other => Err(other),
        })
    }

    /// Close the session, waiting up to `within` for the server's answer: the server deletes
    /// the session's ephemeral nodes. A session that cannot be reached is left to expire.
    pub async fn close(&self, within: Duration) {
        let (answer, _) = self.request(Op::CloseSession, Body::Empty, false);
        if let Err(e) = tokio::time::timeout(within, answer)
            .await
            .unwrap_or(Ok((Answer::Done, 0)))
        {
            tracing::debug!(error = %e, "closing the ZooKeeper session");
        }
    }
}

/// `answer`, of the kind `pick` takes; another kind is malformed.
async fn of_kind<T>(
    answer: impl Future<Output = Result<Answered, ZkError>>,
    pick: fn(Answer) -> Result<T, Answer>,
) -> Result<(T, u32), ZkError> {
    let (answer, epoch) = answer.await?;
    let kind = pick(answer)
        .map_err(|other| ZkError::Malformed(format!("an answer of the wrong kind: {other:?}")))?;
    Ok((kind, epoch))
}

fn connection(link: &Link, epoch: u32) -> Connection {
    Connection {
        epoch,
        member: link.member.clone(),
        timeout: Duration::from_millis(link.connected.timeout_ms as u64),
        sent: link.sent,
        round_trip: link.round_trip,
    }
}

/// The session's task.
struct Task {
    opts: Options,
    calls: mpsc::UnboundedReceiver<Call>,
    state: watch::Sender<State>,
    /// The handles' record of shorter timeouts, kept as each connection is made.
    shorter: Shorter,
    /// The number of a connection the handles asked to drop.
    dropped: watch::Receiver<u32>,
    session_id: i64,
    password: Vec<u8>,
    last_zxid: i64,
    epoch: u32,
    /// The member to try first when the connection is lost.
    next: usize,
}

/// How a connection ended.
enum End {
    /// Lost: move the session.
    Lost(String),
    /// The session is over.
    Over(State),
}

impl Task {
    async fn run(mut self, first: Link) {
        let mut link = first;
        loop {
            let end = Served::new(&mut self, link).serve().await;
            match end {
                End::Over(state) => return self.end(state),
                End::Lost(why) => {
                    tracing::debug!(reason = %why, "ZooKeeper connection lost; moving the session");
                    self.state.send_replace(State::Disconnected);
                }
            }
            link = match self.reconnect().await {
                Ok(link) => link,
                Err(state) => return self.end(state),
            };
            self.epoch += 1;
            let now = connection(&link, self.epoch);
            keep_if_shorter(&self.shorter, &now);
            self.state.send_replace(State::Connected(now));
        }
    }

    /// The session is over: every request from now on fails with `state`.
    fn end(mut self, state: State) {
        self.state.send_replace(state.clone());
        self.calls.close();
        while let Ok(call) = self.calls.try_recv() {
            let _ = call.reply.send(Err(ZkError::Ended(state.clone())));
        }
    }

    /// Move the session to the next member that takes it, each tried within the timeout's
    /// share (as ZooKeeper's own client does), round after round. Requests made meanwhile fail
    /// with `ConnectionLoss`; a close ends the session here.
    async fn reconnect(&mut self) -> Result<Link, State> {
        let n = self.opts.members.len();
        let share = (self.opts.timeout / n as u32).max(Duration::from_millis(100));
        let mut round = 0u32;
        loop {
            for i in 0..n {
                let at = (self.next + i) % n;
                let member = self.opts.members[at].clone();
                let password = self.password.clone();
                let hello = Hello {
                    timeout: self.opts.timeout,
                    session_id: self.session_id,
                    password: &password,
                    last_zxid: self.last_zxid,
                };
                let reach = self.opts.reach.clone();
                let linking = net::link(&member, &reach, &hello, share);
                match self.meanwhile(linking).await? {
                    Ok(link) => {
                        self.next = (at + 1) % n;
                        return Ok(link);
                    }
                    Err(Failure::Expired | Failure::NotOurs(_)) => return Err(State::Expired),
                    Err(Failure::AuthFailed(why)) => return Err(State::AuthFailed(why)),
                    Err(why) => {
                        tracing::debug!(member = %member, reason = %why, "ZooKeeper member gave no session")
                    }
                }
            }
            round += 1;
            let pause = (self.opts.timeout / 10).min(Duration::from_millis(100 * round as u64));
            self.meanwhile(tokio::time::sleep(pause)).await?;
        }
    }

    /// `work`'s output, answering the requests made meanwhile: none can be sent now.
    async fn meanwhile<T>(&mut self, work: impl Future<Output = T>) -> Result<T, State> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return Ok(out),
                call = self.calls.recv() => match call {
                    None => return Err(State::Closed),
                    Some(call) if call.op == Op::CloseSession => {
                        let _ = call.reply.send(Ok((Answer::Done, self.epoch)));
                        return Err(State::Closed);
                    }
                    Some(call) => {
                        let why = "not connected: the session is moving to another member";
                        let _ = call.reply.send(Err(ZkError::ConnectionLoss(why.into())));
                    }
                },
            }
        }
    }
}

/// A request written and not yet answered.
struct Pending {
    xid: i32,
    op: Op,
    reply: oneshot::Sender<Result<Answered, ZkError>>,
    /// The watch to set once answered, on this server path.
    watch: Option<(String, oneshot::Sender<Watched>)>,
}

/// One connection being served.
struct Served<'t> {
    task: &'t mut Task,
    link: Option<Link>,
    pending: VecDeque<Pending>,
    watches: HashMap<String, Vec<oneshot::Sender<Watched>>>,
    next_xid: i32,
}

/// The two tasks that move a connection's bytes: one reads whole frames into a channel, one
/// writes what the session queues, in order, each packet flushed (TLS may keep a record back
/// until then). Both end with the connection: a writer blocked on a member that stopped reading
/// holds nothing open after it.
struct Pumps {
    reader: tokio::task::JoinHandle<()>,
    frames: mpsc::Receiver<Result<Vec<u8>, net::Closed>>,
    out: mpsc::UnboundedSender<Vec<u8>>,
    writer: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Pumps {
    fn start(io: Box<dyn net::Io>) -> Self {
        let (mut rd, mut wr) = tokio::io::split(io);
        let (frames_tx, frames) = mpsc::channel(16);
        let reader = tokio::spawn(async move {
            loop {
                let frame = net::read_frame(&mut rd).await;
                let end = frame.is_err();
                if frames_tx.send(frame).await.is_err() || end {
                    return;
                }
            }
        });
        let (out, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let writer = tokio::spawn(async move {
            while let Some(bytes) = out_rx.recv().await {
                wr.write_all(&bytes).await?;
                wr.flush().await?;
            }
            Ok(())
        });
        Pumps {
            reader,
            frames,
            out,
            writer,
        }
    }

    /// Every handle is gone: close the session, and see the close written.
    async fn close_session(&mut self) -> End {
        let _ = self.out.send(Out::request(0, Op::CloseSession).finish());
        self.drain(CLOSE_WRITTEN_WITHIN).await;
        End::Over(State::Closed)
    }

    /// Let the writer write what is queued, within `within`.
    async fn drain(&mut self, within: Duration) {
        drop(std::mem::replace(&mut self.out, mpsc::unbounded_channel().0));
        let _ = tokio::time::timeout(within, &mut self.writer).await;
    }

    /// Stop both tasks: the connection closes, though the writer be blocked on it.
    fn stop(&self) {
        self.reader.abort();
        self.writer.abort();
    }
}

impl<'t> Served<'t> {
    fn new(task: &'t mut Task, link: Link) -> Self {
        Served {
            task,
            link: Some(link),
            pending: VecDeque::new(),
            watches: HashMap::new(),
            next_xid: 1,
        }
    }

    async fn serve(mut self) -> End {
        let link = self.link.take().expect("a link to serve");
        let timeout = Duration::from_millis(link.connected.timeout_ms as u64);
        let mut pumps = Pumps::start(link.io);
        let (ping_every, silent_for) = (timeout / 3, timeout * 2 / 3);
        let (mut last_send, mut last_recv) = (Instant::now(), Instant::now());
        let epoch = self.task.epoch;
        let mut dropped = self.task.dropped.clone();
        let end = loop {
            tokio::select! {
                call = self.task.calls.recv() => match call {
                    Some(call) => {
                        self.send(&pumps.out, call);
                        last_send = Instant::now();
                    }
                    None => break pumps.close_session().await,
                },
                frame = pumps.frames.recv() => match frame {
                    Some(Ok(frame)) => {
                        last_recv = Instant::now();
                        if let Some(end) = self.received(&frame) {
                            break end;
                        }
                    }
                    Some(Err(e)) => break End::Lost(e.to_string()),
                    None => break End::Lost("the connection's reader ended".into()),
                },
                _ = tokio::time::sleep_until(last_send + ping_every) => {
                    let _ = pumps.out.send(Out::request(wire::PING_XID, Op::Ping).finish());
                    last_send = Instant::now();
                }
                _ = tokio::time::sleep_until(last_recv + silent_for) => {
                    break End::Lost(format!("nothing heard from the member for {silent_for:?}"));
                }
                // With one member there is none to move to: the step waits on, and a reconnect
                // to a follower behind what the session has seen would only be refused.
                Ok(()) = dropped.changed() => if *dropped.borrow_and_update() == epoch
                    && self.task.opts.members.len() > 1
                {
                    break End::Lost("a request on it waited too long: trying the next member".into());
                },
                written = &mut pumps.writer => break End::Lost(write_failed(written)),
            }
        };
        pumps.stop();
        self.fail_all(&end);
        end
    }

    /// Write `call` and wait for its answer in order.
    fn send(&mut self, out: &mpsc::UnboundedSender<Vec<u8>>, call: Call) {
        let xid = match call.op {
            Op::CloseSession => 0,
            _ => self.xid(),
        };
        let mut packet = Out::request(xid, call.op);
        call.body.write(&mut packet);
        let path = call.body.path().map(str::to_owned);
        let _ = out.send(packet.finish());
        self.pending.push_back(Pending {
            xid,
            op: call.op,
            reply: call.reply,
            watch: call.watch.zip(path).map(|(w, p)| (p, w)),
        });
    }

    fn xid(&mut self) -> i32 {
        let xid = self.next_xid;
        self.next_xid = if xid == i32::MAX { 1 } else { xid + 1 };
        xid
    }

    /// Handle one packet; the connection's end if it ends it.
    fn received(&mut self, frame: &[u8]) -> Option<End> {
        let mut input = In::new(frame);
        let reply = match Reply::read(&mut input) {
            Ok(r) => r,
            Err(e) => return Some(End::Lost(e.to_string())),
        };
        if reply.zxid > 0 {
            self.task.last_zxid = self.task.last_zxid.max(reply.zxid);
        }
        if reply.err == Code::SASL_REQUIRED {
            // Sent to any request, a PING included, before the server closes the connection:
            // every member will say the same.
            return Some(End::Over(State::AuthFailed(SASL_REQUIRED.into())));
        }
        match reply.xid {
            wire::WATCH_XID => {
                if let Ok(event) = input.event() {
                    self.fire(&event);
                }
                None
            }
            wire::PING_XID => None,
            wire::AUTH_XID if reply.err != Code::OK => {
                Some(End::Over(State::AuthFailed(format!("{}", reply.err))))
            }
            wire::AUTH_XID => None,
            xid => self.answered(xid, reply.err, &mut input),
        }
    }

    fn answered(&mut self, xid: i32, err: Code, input: &mut In<'_>) -> Option<End> {
        let Some(pending) = self.pending.pop_front() else {
            return Some(End::Lost(format!(
                "an answer to request {xid}, which is not in flight"
            )));
        };
        if pending.xid != xid {
            let why = format!("answer {xid} out of order (waiting for {})", pending.xid);
            // It fails with the rest, with the connection lost.
            self.pending.push_front(pending);
            return Some(End::Lost(why));
        }
        let result = answer(pending.op, err, input);
        if let (Some((path, watch)), true) = (pending.watch, sets_watch(pending.op, &result)) {
            self.watches.entry(path).or_default().push(watch);
        }
        let closed = pending.op == Op::CloseSession;
        let _ = pending.reply.send(result.map(|a| (a, self.task.epoch)));
        closed.then_some(End::Over(State::Closed))
    }

    fn fire(&mut self, event: &wire::Event) {
        if (1..=3).contains(&event.kind) {
            for watch in self.watches.remove(&event.path).unwrap_or_default() {
                let _ = watch.send(Watched::Event(event.kind));
            }
        }
    }

    /// Every request in flight fails, every watch says Disconnected (dropped).
    fn fail_all(&mut self, end: &End) {
        for pending in self.pending.drain(..) {
            let error = match end {
                End::Lost(why) => ZkError::ConnectionLoss(why.clone()),
                End::Over(State::Closed) if pending.op == Op::CloseSession => {
                    let _ = pending.reply.send(Ok((Answer::Done, self.task.epoch)));
                    continue;
                }
                End::Over(state) => ZkError::Ended(state.clone()),
            };
            let _ = pending.reply.send(Err(error));
        }
        for (_, watches) in self.watches.drain() {
            for watch in watches {
                let _ = watch.send(Watched::Disconnected);
            }
        }
    }
}

/// Why the writer ended before its connection did.
fn write_failed(written: Result<std::io::Result<()>, tokio::task::JoinError>) -> String {
    let why = match written {
        Ok(Ok(())) => String::new(),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    format!("writing to the member failed: {why}")
}

/// Whether a request with a watch set one: `exists` also does when there is no node.
fn sets_watch(op: Op, result: &Result<Answer, ZkError>) -> bool {
    match result {
        Ok(_) => true,
        Err(e) => op == Op::Exists && e.is(Code::NO_NODE),
    }
}

/// The answer to `op` with error code `err`, from the rest of its packet.
fn answer(op: Op, err: Code, input: &mut In<'_>) -> Result<Answer, ZkError> {
    if op == Op::Exists && err == Code::NO_NODE {
        return Ok(Answer::Stat(None));
    }
    if err != Code::OK {
        return match err {
            Code::SESSION_EXPIRED => Err(ZkError::Ended(State::Expired)),
            code => Err(ZkError::Server(code)),
        };
    }
    let malformed = |e: wire::Malformed| ZkError::Malformed(e.to_string());
    let answer = match op {
        Op::Create2 => {
            let path = input.string().map_err(malformed)?;
            Answer::Created(path, input.stat().map_err(malformed)?)
        }
        Op::Exists | Op::SetData => Answer::Stat(Some(input.stat().map_err(malformed)?)),
        Op::GetData => {
            let data = input.buffer().map_err(malformed)?;
            Answer::Data(data, input.stat().map_err(malformed)?)
        }
        Op::GetChildren2 => {
            let names = input.strings().map_err(malformed)?;
            Answer::Children(names, input.stat().map_err(malformed)?)
        }
        Op::GetAcl => {
            let acls = input.acls().map_err(malformed)?;
            Answer::Acl(acls, input.stat().map_err(malformed)?)
        }
        Op::Multi => Answer::Multi(input.multi().map_err(malformed)?),
        Op::Sasl => Answer::Sasl(input.buffer().map_err(malformed)?),
        _ => Answer::Done,
    };
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, BufWriter};

    fn block_on<F: Future>(f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
        rt.expect("a runtime").block_on(f)
    }

    /// A stream that sends nothing until flushed (as TLS may hold a record back): each packet
    /// reaches the member all the same.
    #[test]
    fn each_packet_is_flushed_as_it_is_written() {
        block_on(async {
            let (ours, mut theirs) = tokio::io::duplex(1 << 16);
            let held = BufWriter::with_capacity(1 << 12, ours);
            let pumps = Pumps::start(Box::new(held));
            pumps.out.send(vec![1, 2, 3]).expect("the writer runs");
            let mut got = [0u8; 3];
            let read = tokio::time::timeout(Duration::from_secs(5), theirs.read_exact(&mut got));
            read.await.expect("the packet came").expect("read it");
            assert_eq!(got, [1, 2, 3]);
            pumps.stop();
        });
    }

    /// A member that stops reading blocks the writer; stopping the pumps closes the connection
    /// all the same, and the member reads what was sent, then the end.
    #[test]
    fn a_writer_blocked_on_a_member_that_stops_reading_ends_with_its_connection() {
        block_on(async {
            let (ours, mut theirs) = tokio::io::duplex(16);
            let pumps = Pumps::start(Box::new(ours));
            pumps.out.send(vec![7; 1000]).expect("the writer runs");
            tokio::task::yield_now().await;
            pumps.stop();
            let mut all = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), theirs.read_to_end(&mut all));
            read.await.expect("the connection ended").expect("read to the end");
            assert!(all.len() < 1000, "{} bytes", all.len());
        });
    }
}
