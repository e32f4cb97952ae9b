//! The session: a granted lease and the task that keeps it, as etcd's `concurrency.Session` is.
//!
//! The keeper follows `timing::Schedule` one step at a time: each step reads the clock once,
//! judges what the previous step's I/O came to at that instant, and does the one thing the
//! schedule says (sleep, send, wait for a reply). One keepalive is in flight at a time; a reply
//! that misses its time, or a stream that breaks, gets the stream rebuilt. The keepalive stream
//! and the clock sit behind two small traits so that the loop itself is unit-tested with made-up
//! instants. Nothing here touches a process, and nothing on the kill path waits for this module.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::timeout;

use super::client::{Conn, Members};
use crate::clock::BootInstant;
use crate::config::EtcdConfig;
use crate::error::Error;
use crate::lease::keeper::{extend, trouble};
pub use crate::lease::keeper::{lose, KeeperState};
use crate::lease::timing::{GrantError, Kept, KeySeen, Next, Params, Read, Schedule, Verdict};
use crate::lease::LossReason;

impl KeeperState {
    /// The state right after the grant.
    fn granted(schedule: &Schedule) -> Self {
        Self {
            deadline: schedule.deadline(),
            stop_at: schedule.stop_at(),
            lost: None,
            trouble: None,
        }
    }
}

/// A granted lease, not kept yet: the keeper's confirming reads need the key queued next.
pub struct Grant {
    pub id: i64,
    schedule: Schedule,
}

impl Grant {
    /// Grant a lease of `params.ttl`. A granted TTL the timing rules cannot work with is revoked
    /// at once and reported as bad usage.
    pub async fn ask(conn: &Conn, within: Duration, params: Params) -> Result<Self, Error> {
        let t_send = BootInstant::now();
        let ttl = ttl_secs(params.ttl);
        let grant = conn
            .retrying(|mut c| async move { c.lease_grant(ttl, None).await })
            .await?;
        match Schedule::granted(params, t_send, grant.ttl()) {
            Ok(schedule) => Ok(Self {
                id: grant.id(),
                schedule,
            }),
            Err(GrantError::Expired) => {
                Err(Error::Unavailable("etcd granted a lease with TTL 0".into()))
            }
            Err(GrantError::DoesNotFit(e)) => {
                revoke(conn, grant.id(), within).await;
                Err(Error::Usage(e.to_string()))
            }
        }
    }

    /// How often the TTL granted is renewed: a waiter looks at its queue as often.
    pub fn renew_every(&self) -> Duration {
        self.schedule.timing().renew_every()
    }
}

/// The own lock key and its create revision, as the confirming read checks them.
#[derive(Clone, Debug)]
pub struct OwnKey {
    pub key: String,
    pub revision: i64,
}

/// A granted lease and the tasks that keep it (the keeper, and once held, the own-key watch).
pub struct Session {
    id: i64,
    state: watch::Receiver<KeeperState>,
    /// Kept so that the channel never closes, and handed to the tasks that publish.
    tx: watch::Sender<KeeperState>,
    tasks: Vec<JoinHandle<()>>,
}

impl Session {
    /// Start keeping `grant`, whose key is `own`, renewing through `members`.
    pub fn keep(grant: Grant, members: Members, own: OwnKey) -> Self {
        let (tx, state) = watch::channel(KeeperState::granted(&grant.schedule));
        let schedule = match members.several() {
            false => grant.schedule,
            true => grant.schedule.through_several_members(),
        };
        let keeper = Keeper {
            lease: grant.id,
            link: EtcdLink::new(members, grant.id, own.clone()),
            own,
            clock: Boot,
            schedule,
            tx: tx.clone(),
        };
        let task = tokio::spawn(async move {
            keeper.run().await;
        });
        Self {
            id: grant.id,
            state,
            tx,
            tasks: vec![task],
        }
    }

    pub fn id(&self) -> i64 {
        self.id
    }

    /// The state as last published.
    pub fn now(&self) -> KeeperState {
        self.state.borrow().clone()
    }

    /// A receiver of the state, for waiting on the loss.
    pub fn watch(&self) -> watch::Receiver<KeeperState> {
        self.state.clone()
    }

    /// Run `task` as part of the session, aborted with it; it may publish through `tx`.
    pub fn spawn<F, Fut>(&mut self, task: F)
    where
        F: FnOnce(watch::Sender<KeeperState>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tasks.push(tokio::spawn(task(self.tx.clone())));
    }

    /// The next change of the state: a later `D`, trouble, or the loss. Cancel-safe.
    pub async fn changed(&mut self) -> KeeperState {
        // Never an error: the session itself holds a sender, so the channel cannot close.
        let _ = self.state.changed().await;
        self.state.borrow_and_update().clone()
    }

    /// Stop keeping the lease and revoke it, which deletes its key, within `within`.
    pub async fn revoke(self, conn: &Conn, within: Duration) {
        for t in &self.tasks {
            t.abort();
        }
        revoke(conn, self.id, within).await;
    }
}

/// Revoke lease `id` within `within`; a failure only means it ends by its TTL.
pub async fn revoke(conn: &Conn, id: i64, within: Duration) {
    let revoked = conn
        .retrying_within(within, |mut c| async move { c.lease_revoke(id).await })
        .await;
    if let Err(e) = revoked {
        tracing::debug!(error = %e, "revoking the lease failed; it will expire by its TTL");
    }
}

/// etcd takes whole seconds: round up, so the lease is never shorter than asked.
fn ttl_secs(ttl: Duration) -> i64 {
    ttl.as_secs_f64().ceil().max(1.0) as i64
}

/// A keepalive stream and the member it runs to, as the keeper uses them.
trait Link {
    /// Open the stream. The client sends its first keepalive and reads the reply itself,
    /// telling only whether the lease lives.
    async fn open(&mut self) -> Result<(), LinkError>;
    /// Write one keepalive on the open stream.
    async fn send(&mut self) -> Result<(), LinkError>;
    /// The next reply: its TTL and raft term.
    async fn reply(&mut self) -> Result<Kept, LinkError>;
    /// A linearizable read of the own key through the same member.
    async fn read(&mut self) -> Result<Read, LinkError>;
    fn is_open(&self) -> bool;
    /// Drop the stream, so that a reply to an abandoned keepalive cannot arrive on the next
    /// one, and move on to the next member where there are several.
    fn leave(&mut self);
}

/// How a keepalive stream failed.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LinkError {
    /// etcd does not know the lease (the stream's first reply had TTL <= 0).
    Expired,
    /// The stream could not be opened, written or read; the text says which.
    Broken(String),
}

/// The keeper's time source: CLOCK_BOOTTIME for real, made-up instants in the tests.
trait Clock {
    fn now(&self) -> BootInstant;
    async fn sleep_until(&self, t: BootInstant);
    /// `f`'s output if it comes before `t`.
    async fn by<F: Future>(&self, t: BootInstant, f: F) -> Option<F::Output>;
}

/// The real clock. Sleeps are tokio's, measured from a CLOCK_BOOTTIME reading.
struct Boot;

impl Clock for Boot {
    fn now(&self) -> BootInstant {
        BootInstant::now()
    }

    async fn sleep_until(&self, t: BootInstant) {
        tokio::time::sleep(BootInstant::now().until(t)).await;
    }

    async fn by<F: Future>(&self, t: BootInstant, f: F) -> Option<F::Output> {
        tokio::time::timeout(BootInstant::now().until(t), f)
            .await
            .ok()
    }
}

/// The keepalive stream of one lease, through one member at a time.
struct EtcdLink {
    members: Members,
    id: i64,
    own: OwnKey,
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    /// Keepalives to the other members; none with one endpoint.
    echoes: Option<Echoes>,
}

/// A keepalive to every other member with each renewal, replies unheeded. A leader whose raft
/// loop was stuck revokes, when it runs again, every lease its stale lessor thinks expired, the
/// ones the quorum renewed meanwhile included (etcd before 3.5.13 and 3.4.31). A stuck lessor
/// still answers keepalives, so these keep its view of the lease fresh, whether or not the
/// holder ever renewed through that member (docs/quorum.md). Each member has a task of its own,
/// so one that does not answer never delays a renewal.
struct Echoes {
    /// Bumped with each renewal, with the member it went through (which needs no echo).
    renewed: watch::Sender<(u64, usize)>,
    tasks: Vec<JoinHandle<()>>,
}

impl Echoes {
    fn start(cfg: &EtcdConfig, id: i64) -> Self {
        let (renewed, rx) = watch::channel((0, usize::MAX));
        let tasks = (0..cfg.endpoints.len())
            .map(|m| tokio::spawn(echo(cfg.clone(), m, id, rx.clone())))
            .collect();
        Self { renewed, tasks }
    }

    fn renewed_through(&self, member: usize) {
        self.renewed.send_modify(|(n, at)| {
            *n += 1;
            *at = member;
        });
    }
}

impl Drop for Echoes {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

/// Member `m`'s echo: one keepalive, on a stream of its own, for each renewal made through
/// another member. A stream that cannot take one at once is opened again at the next renewal.
async fn echo(cfg: EtcdConfig, m: usize, id: i64, mut renewed: watch::Receiver<(u64, usize)>) {
    let mut stream: Option<Echo> = None;
    while renewed.changed().await.is_ok() {
        let (_, at) = *renewed.borrow_and_update();
        if at == m {
            continue;
        }
        if stream.is_none() {
            stream = Echo::open(&cfg, m, id).await;
        }
        if let Some(s) = stream.as_mut() {
            if !s.nudge().await {
                stream = None;
            }
        }
    }
}

/// One echo stream, and the task that reads and drops its replies, so that the server never
/// waits to send one.
struct Echo {
    keeper: LeaseKeeper,
    drain: JoinHandle<()>,
}

impl Echo {
    /// The stream to member `m`, if it opens within the dial timeout.
    async fn open(cfg: &EtcdConfig, m: usize, id: i64) -> Option<Self> {
        let within = cfg.dial_timeout;
        let conn = timeout(within, Conn::dial_to(cfg, &cfg.endpoints[m..=m]))
            .await
            .ok()?
            .ok()?;
        let mut client = conn.client();
        let (keeper, mut replies) = timeout(within, client.lease_keep_alive(id))
            .await
            .ok()?
            .ok()?;
        let drain = tokio::spawn(async move { while let Ok(Some(_)) = replies.message().await {} });
        Some(Self { keeper, drain })
    }

    /// One keepalive, if it can be written at once; false when the stream is no use any more.
    async fn nudge(&mut self) -> bool {
        let sent = timeout(Duration::ZERO, self.keeper.keep_alive()).await;
        matches!(sent, Ok(Ok(())))
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.drain.abort();
    }
}

impl EtcdLink {
    fn new(members: Members, id: i64, own: OwnKey) -> Self {
        let echoes = members
            .several()
            .then(|| Echoes::start(members.config(), id));
        Self {
            members,
            id,
            own,
            stream: None,
            echoes,
        }
    }

    async fn client(&mut self) -> Result<Client, LinkError> {
        match self.members.current().await {
            Ok(conn) => Ok(conn.client()),
            Err(e) => Err(LinkError::Broken(format!(
                "dialling {} failed: {e}",
                self.members.endpoint()
            ))),
        }
    }
}

impl Link for EtcdLink {
    async fn open(&mut self) -> Result<(), LinkError> {
        let mut client = self.client().await?;
        match client.lease_keep_alive(self.id).await {
            Ok(pair) => {
                self.stream = Some(pair);
                Ok(())
            }
            // "lease not found": the first reply carried TTL <= 0.
            Err(etcd_client::Error::LeaseKeepAliveError(_)) => Err(LinkError::Expired),
            Err(e) => Err(LinkError::Broken(format!(
                "opening the keepalive stream to {} failed: {e}",
                self.members.endpoint()
            ))),
        }
    }

    async fn send(&mut self) -> Result<(), LinkError> {
        let broken = || LinkError::Broken("the keepalive stream broke".into());
        let (keeper, _) = self.stream.as_mut().ok_or_else(broken)?;
        keeper.keep_alive().await.map_err(|_| broken())?;
        if let Some(echoes) = &self.echoes {
            echoes.renewed_through(self.members.at());
        }
        Ok(())
    }

    async fn reply(&mut self) -> Result<Kept, LinkError> {
        let ended = || LinkError::Broken("the keepalive stream ended".into());
        let (_, replies) = self.stream.as_mut().ok_or_else(ended)?;
        match replies.message().await {
            Ok(Some(r)) => Ok(Kept {
                ttl: r.ttl(),
                term: r.header().map_or(0, |h| h.raft_term()),
            }),
            Ok(None) => Err(ended()),
            Err(e) => Err(LinkError::Broken(format!(
                "the keepalive stream failed: {e}"
            ))),
        }
    }

    async fn read(&mut self) -> Result<Read, LinkError> {
        let mut client = self.client().await?;
        let resp = client
            .get(self.own.key.as_str(), None)
            .await
            .map_err(|e| LinkError::Broken(format!("the confirming read failed: {e}")))?;
        let key = match resp.kvs().first().map(|kv| kv.create_revision()) {
            Some(rev) if rev == self.own.revision => KeySeen::Ours,
            Some(_) => KeySeen::Replaced,
            None => KeySeen::Gone,
        };
        let term = resp.header().map_or(0, |h| h.raft_term());
        Ok(Read { term, key })
    }

    fn is_open(&self) -> bool {
        self.stream.is_some()
    }

    fn leave(&mut self) {
        self.stream = None;
        self.members.leave();
    }
}

/// What one step's I/O came to, for the next step to judge at its own instant.
#[derive(Debug)]
enum Outcome {
    /// Nothing to judge (slept, or a keepalive was written).
    Nothing,
    /// The stream opened.
    Opened,
    /// A keepalive reply came.
    Kept(Kept),
    /// The confirming read came back.
    Read(Read),
    /// The stream or the read failed, or no answer came in time.
    Failed(String),
    /// etcd does not know the lease.
    Expired,
}

/// The renewal task's state: the schedule, the stream, and where to publish.
struct Keeper<L, C> {
    /// The lease id, for the logs.
    lease: i64,
    link: L,
    /// The own key, for the reasons of a loss.
    own: OwnKey,
    clock: C,
    schedule: Schedule,
    tx: watch::Sender<KeeperState>,
}

impl<L: Link, C: Clock> Keeper<L, C> {
    /// Follow the schedule until the lease is lost; publish every new `D` and the loss.
    async fn run(mut self) -> LossReason {
        let mut outcome = Outcome::Nothing;
        loop {
            let now = self.clock.now();
            if let Err(why) = self.judge(now, outcome) {
                return self.lost(why);
            }
            outcome = match self.schedule.next(now) {
                Next::Lost => return self.lost(LossReason::NotRenewed),
                Next::SleepUntil(t) => {
                    self.clock.sleep_until(t).await;
                    Outcome::Nothing
                }
                Next::Send => self.send(now).await,
                Next::AwaitReplyUntil(due) => self.receive(due).await,
                Next::ConfirmBy(due) | Next::AwaitReadUntil(due) => self.confirm(due).await,
            };
        }
    }

    /// Apply the previous step's outcome, seen at `now`.
    fn judge(&mut self, now: BootInstant, outcome: Outcome) -> Result<(), LossReason> {
        let verdict = match outcome {
            Outcome::Nothing => return Ok(()),
            Outcome::Opened => {
                self.schedule.opened();
                return Ok(());
            }
            Outcome::Failed(why) => {
                self.schedule.failed(now);
                self.leave(&why);
                return Ok(());
            }
            Outcome::Expired => return Err(LossReason::Expired),
            Outcome::Kept(kept) => {
                let verdict = self.schedule.replied(now, kept);
                tracing::debug!(
                    lease = format!("{:x}", self.lease),
                    ?kept,
                    ?verdict,
                    "keepalive reply"
                );
                verdict
            }
            Outcome::Read(read) => {
                let verdict = self.schedule.confirmed(now, read);
                tracing::debug!(
                    lease = format!("{:x}", self.lease),
                    ?read,
                    ?verdict,
                    "confirming read"
                );
                verdict
            }
        };
        match verdict {
            Verdict::Extended(d) => self.publish(d),
            Verdict::Lost(why) => return Err(why),
            Verdict::KeyLost(KeySeen::Replaced) => {
                return Err(LossReason::KeyReplaced(self.own.key.clone()))
            }
            Verdict::KeyLost(_) => return Err(LossReason::KeyGone(self.own.key.clone())),
            Verdict::Failed => self.leave("the renewal was not confirmed in time or in its term"),
            Verdict::ToConfirm | Verdict::Ignored => {}
        }
        Ok(())
    }

    /// A renewal failed: say so once, and try the next one through another member.
    fn leave(&mut self, why: &str) {
        tracing::warn!(lease = format!("{:x}", self.lease), reason = %why, "renewal failed");
        trouble(&self.tx, why);
        self.link.leave();
    }

    /// A keepalive is due: write it on the open stream, or open one (which sends its own).
    async fn send(&mut self, t_send: BootInstant) -> Outcome {
        self.schedule.sent(t_send);
        if !self.link.is_open() {
            return Outcome::Nothing;
        }
        match self.link.send().await {
            Ok(()) => Outcome::Nothing,
            Err(e) => e.into(),
        }
    }

    /// Wait, until `due` at the latest, for the reply (or for the stream to open).
    async fn receive(&mut self, due: BootInstant) -> Outcome {
        if self.link.is_open() {
            match self.clock.by(due, self.link.reply()).await {
                Some(Ok(kept)) => Outcome::Kept(kept),
                Some(Err(e)) => e.into(),
                None => late("keepalive reply"),
            }
        } else {
            match self.clock.by(due, self.link.open()).await {
                Some(Ok(())) => Outcome::Opened,
                Some(Err(e)) => e.into(),
                None => late("opened keepalive stream"),
            }
        }
    }

    /// Read the own key through the member that answered the keepalive, by `due`.
    async fn confirm(&mut self, due: BootInstant) -> Outcome {
        self.schedule.reading();
        match self.clock.by(due, self.link.read()).await {
            Some(Ok(read)) => Outcome::Read(read),
            Some(Err(e)) => e.into(),
            None => late("confirming read"),
        }
    }

    fn publish(&self, deadline: BootInstant) {
        extend(&self.tx, deadline, self.schedule.stop_at());
    }

    fn lost(&self, why: LossReason) -> LossReason {
        lose(&self.tx, why.clone());
        why
    }
}

fn late(what: &str) -> Outcome {
    Outcome::Failed(format!("no {what} in time"))
}

impl From<LinkError> for Outcome {
    fn from(e: LinkError) -> Self {
        match e {
            LinkError::Expired => Outcome::Expired,
            LinkError::Broken(why) => Outcome::Failed(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;
    use std::rc::Rc;

    use super::*;

    /// Made-up time: it moves only when the keeper sleeps, times out, or an answer takes time.
    #[derive(Clone)]
    struct FakeClock(Rc<Cell<BootInstant>>);

    impl FakeClock {
        fn advance(&self, d: Duration) {
            self.0.set(self.0.get() + d);
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> BootInstant {
            self.0.get()
        }

        async fn sleep_until(&self, t: BootInstant) {
            self.0.set(self.0.get().max(t));
        }

        /// A fake future is ready at once or never: one that is not is timed out at `t`.
        async fn by<F: Future>(&self, t: BootInstant, f: F) -> Option<F::Output> {
            tokio::select! {
                biased;
                v = f => Some(v),
                () = std::future::ready(()) => {
                    self.0.set(self.0.get().max(t));
                    None
                }
            }
        }
    }

    const TERM: u64 = 4;

    /// One scripted answer of the fake member.
    #[derive(Clone, Copy, Debug)]
    enum Answer {
        /// A keepalive reply (or an opened stream) after this many ms, with this TTL.
        Ttl(u64, i64),
        /// A read after this many ms, in this raft term, finding the own key so.
        Read(u64, u64, KeySeen),
        /// A read that never comes back.
        NoRead,
        /// Never comes.
        Hang,
        Broken,
        Expired,
    }

    /// A member that answers from a script, and logs what the keeper did when. A read takes the
    /// script's next answer only when that is a read's; otherwise it answers at once, in
    /// [`TERM`], with the key ours. A stream with its script run out hangs.
    struct FakeLink {
        clock: FakeClock,
        answers: VecDeque<Answer>,
        log: Rc<RefCell<Vec<(&'static str, BootInstant)>>>,
        open: bool,
    }

    impl FakeLink {
        fn note(&self, what: &'static str) {
            self.log.borrow_mut().push((what, self.clock.now()));
        }

        /// The next answer, after its delay; an empty script hangs.
        async fn answer(&mut self, empty: Answer) -> Result<Answer, LinkError> {
            let next = self.answers.pop_front().unwrap_or(empty);
            match next {
                Answer::Ttl(ms, _) | Answer::Read(ms, _, _) => {
                    self.clock.advance(Duration::from_millis(ms));
                    Ok(next)
                }
                Answer::Hang | Answer::NoRead => std::future::pending().await,
                Answer::Broken => Err(LinkError::Broken("broken".into())),
                Answer::Expired => Err(LinkError::Expired),
            }
        }
    }

    impl Link for FakeLink {
        async fn open(&mut self) -> Result<(), LinkError> {
            self.note("open");
            self.answer(Answer::Hang).await?;
            self.open = true;
            Ok(())
        }

        async fn send(&mut self) -> Result<(), LinkError> {
            self.note("send");
            Ok(())
        }

        async fn reply(&mut self) -> Result<Kept, LinkError> {
            match self.answer(Answer::Hang).await? {
                Answer::Ttl(_, ttl) => Ok(Kept { ttl, term: TERM }),
                other => panic!("script: {other:?} where a keepalive reply was due"),
            }
        }

        async fn read(&mut self) -> Result<Read, LinkError> {
            self.note("read");
            let scripted = matches!(
                self.answers.front(),
                Some(Answer::Read(..) | Answer::NoRead)
            );
            if !scripted {
                return Ok(Read {
                    term: TERM,
                    key: KeySeen::Ours,
                });
            }
            match self.answer(Answer::NoRead).await? {
                Answer::Read(_, term, key) => Ok(Read { term, key }),
                other => panic!("script: {other:?} where a read was due"),
            }
        }

        fn is_open(&self) -> bool {
            self.open
        }

        fn leave(&mut self) {
            self.note("leave");
            self.open = false;
        }
    }

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_secs(1000) + Duration::from_millis(ms))
    }

    /// `D` of a keepalive sent at `t` with TTL 10 s (drift 0.1, margin 1 s).
    fn d(t: BootInstant) -> BootInstant {
        t + Duration::from_nanos(8_090_909_090)
    }

    /// The instant `n` thirds of the TTL after the grant.
    fn thirds(n: u32) -> BootInstant {
        at(0) + Duration::from_nanos(3_333_333_333) * n
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[track_caller]
    fn assert_near(a: BootInstant, b: BootInstant) {
        assert!(
            a.until(b).max(b.until(a)) < Duration::from_micros(1),
            "{a:?} != {b:?}"
        );
    }

    struct Run {
        lost: LossReason,
        /// When the keeper gave up.
        at: BootInstant,
        state: KeeperState,
        log: Vec<(&'static str, BootInstant)>,
    }

    /// Run a keeper granted TTL 10 s at 0 ms against `answers`, until it loses the lease.
    fn run(answers: &[Answer]) -> Run {
        let clock = FakeClock(Rc::new(Cell::new(at(0))));
        let log = Rc::new(RefCell::new(Vec::new()));
        let params = Params {
            ttl: Duration::from_secs(10),
            kill_after: None,
            margin: None,
            drift: 0.1,
        };
        let schedule = Schedule::granted(params, at(0), 10).unwrap();
        let (tx, rx) = watch::channel(KeeperState::granted(&schedule));
        let keeper = Keeper {
            lease: 1,
            link: FakeLink {
                clock: clock.clone(),
                answers: answers.iter().copied().collect(),
                log: log.clone(),
                open: false,
            },
            own: OwnKey {
                key: "lw/job/1".into(),
                revision: 7,
            },
            clock: clock.clone(),
            schedule,
            tx,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let lost = rt.block_on(keeper.run());
        let state = rx.borrow().clone();
        let log = log.borrow().clone();
        Run {
            lost,
            at: clock.now(),
            state,
            log,
        }
    }

    fn events(r: &Run) -> Vec<&'static str> {
        r.log.iter().map(|(what, _)| *what).collect()
    }

    #[test]
    fn renews_every_third_of_the_ttl_each_keepalive_confirmed_by_a_read() {
        use Answer::Ttl;
        let r = run(&[Ttl(5, 10), Ttl(10, 10), Ttl(10, 10)]);
        let t1 = thirds(1) + ms(5);
        let t2 = t1 + Duration::from_nanos(3_333_333_333);
        let t3 = t2 + Duration::from_nanos(3_333_333_333);
        assert_eq!(
            r.log,
            vec![
                ("open", thirds(1)),
                ("send", t1),
                ("read", t1 + ms(10)),
                ("send", t2),
                ("read", t2 + ms(10)),
                ("send", t3),
                ("leave", r.state.stop_at),
            ],
            "the stream opens when the first renewal is due, its opening reply moves nothing, \
             and a keepalive follows at once"
        );
        assert_near(r.state.deadline, d(t2));
        assert_eq!(r.lost, LossReason::NotRenewed);
        assert_eq!(r.state.lost, Some(LossReason::NotRenewed));
        assert_eq!(r.at, r.state.stop_at, "gives up exactly at the stop time");
    }

    #[test]
    fn a_stale_member_that_answers_keepalives_but_not_reads_never_renews() {
        use Answer::{NoRead, Ttl};
        // Its lessor says TTL 10 to every keepalive; its linearizable reads never return.
        let script: Vec<Answer> = [Ttl(0, 10), Ttl(1, 10), NoRead].repeat(20);
        let r = run(&script);
        assert_near(r.state.deadline, d(at(0)));
        assert_eq!(r.lost, LossReason::NotRenewed);
        assert_eq!(r.at, r.state.stop_at);
        assert!(events(&r).contains(&"leave"), "{:?}", r.log);
    }

    #[test]
    fn a_read_in_another_term_leaves_the_member_and_the_next_one_renews() {
        use Answer::{Read, Ttl};
        let r = run(&[
            Ttl(0, 10),
            Ttl(1, 10),
            Read(1, TERM - 1, KeySeen::Ours),
            Ttl(0, 10),
            Ttl(1, 10),
        ]);
        assert_eq!(
            events(&r)[..7],
            ["open", "send", "read", "leave", "open", "send", "read"]
        );
        // The retry went out at once, and it is the one that counted.
        let retry = r.log[4].1;
        assert_eq!(retry, thirds(1) + ms(2));
        assert_near(r.state.deadline, d(retry));
    }

    #[test]
    fn a_read_that_finds_the_key_gone_loses_the_lease_at_once() {
        use Answer::{Read, Ttl};
        let r = run(&[Ttl(0, 10), Ttl(1, 10), Read(1, TERM + 3, KeySeen::Gone)]);
        assert_eq!(r.lost, LossReason::KeyGone("lw/job/1".into()));
        assert_eq!(r.at, thirds(1) + ms(2));
        let r = run(&[Ttl(0, 10), Ttl(1, 10), Read(1, TERM, KeySeen::Replaced)]);
        assert_eq!(r.lost, LossReason::KeyReplaced("lw/job/1".into()));
    }

    #[test]
    fn a_reply_with_ttl_zero_is_lost_at_once() {
        let r = run(&[Answer::Ttl(5, 10), Answer::Ttl(5, 0)]);
        assert_eq!(r.lost, LossReason::Expired);
        assert_eq!(r.at, thirds(1) + ms(10));
        assert_near(r.state.deadline, d(at(0)));
    }

    #[test]
    fn a_stream_that_opens_on_an_unknown_lease_is_lost() {
        let r = run(&[Answer::Expired]);
        assert_eq!(r.lost, LossReason::Expired);
        assert_eq!(r.at, thirds(1));
    }

    #[test]
    fn a_broken_stream_is_rebuilt_at_once_and_the_resend_renews() {
        use Answer::{Broken, Ttl};
        let r = run(&[Ttl(0, 10), Ttl(0, 10), Broken, Ttl(0, 10), Ttl(0, 10)]);
        assert_eq!(
            r.log[..8],
            [
                ("open", thirds(1)),
                ("send", thirds(1)),
                ("read", thirds(1)),
                ("send", thirds(2)),
                ("leave", thirds(2)),
                ("open", thirds(2)),
                ("send", thirds(2)),
                ("read", thirds(2)),
            ]
        );
        assert_near(r.state.deadline, d(thirds(2)));
    }

    #[test]
    fn a_late_reply_does_not_move_the_deadline() {
        // The stream opens at once, then the reply takes longer than the rest of the time.
        let r = run(&[Answer::Ttl(0, 10), Answer::Ttl(3_400, 10)]);
        assert_near(r.state.deadline, d(at(0)));
        assert_eq!(r.lost, LossReason::NotRenewed);
    }

    #[test]
    fn a_broken_stream_is_trouble_and_is_retried_at_once_then_every_tenth() {
        use Answer::Broken;
        let r = run(&[Broken, Broken, Broken]);
        let opens: Vec<BootInstant> = r
            .log
            .iter()
            .filter(|(what, _)| *what == "open")
            .map(|(_, t)| *t)
            .collect();
        assert_eq!(opens[..3], [thirds(1), thirds(1), thirds(1) + ms(1_000)]);
        assert!(r.state.trouble.is_some());
        assert_eq!(r.lost, LossReason::NotRenewed);
    }
}
