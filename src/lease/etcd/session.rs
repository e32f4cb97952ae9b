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

use super::client::Conn;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::lease::timing::{GrantError, Next, Params, Schedule, Verdict};
use crate::lease::LossReason;

/// What the keeper and the own-key watch know about the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeeperState {
    /// The current `D`.
    pub deadline: BootInstant,
    /// Stop time `D - kill_after`: past it the lease is as good as lost.
    pub stop_at: BootInstant,
    /// Why the lease is gone, once it is; never unset.
    pub lost: Option<LossReason>,
    /// Why renewals are failing, from the first failure until the next good reply.
    pub trouble: Option<String>,
}

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

/// A granted lease and the tasks that keep it (the keeper, and once held, the own-key watch).
pub struct Session {
    id: i64,
    state: watch::Receiver<KeeperState>,
    /// Kept so that the channel never closes, and handed to the tasks that publish.
    tx: watch::Sender<KeeperState>,
    tasks: Vec<JoinHandle<()>>,
}

impl Session {
    /// Grant a lease of `params.ttl` and start keeping it. A granted TTL the timing rules cannot
    /// work with is revoked at once and reported as bad usage.
    pub async fn grant(conn: &Conn, within: Duration, params: Params) -> Result<Self, Error> {
        let t_send = BootInstant::now();
        let ttl = ttl_secs(params.ttl);
        let grant = conn
            .retrying(|mut c| async move { c.lease_grant(ttl, None).await })
            .await?;
        match Schedule::granted(params, t_send, grant.ttl()) {
            Ok(schedule) => Ok(Self::keep(conn.client(), grant.id(), schedule)),
            Err(GrantError::Expired) => {
                Err(Error::Unavailable("etcd granted a lease with TTL 0".into()))
            }
            Err(GrantError::DoesNotFit(e)) => {
                let id = grant.id();
                let _ = conn
                    .call(within, |mut c| async move { c.lease_revoke(id).await })
                    .await;
                Err(Error::Usage(e.to_string()))
            }
        }
    }

    fn keep(client: Client, id: i64, schedule: Schedule) -> Self {
        let (tx, state) = watch::channel(KeeperState::granted(&schedule));
        let keeper = Keeper {
            lease: id,
            link: EtcdLink::new(client, id),
            clock: Boot,
            schedule,
            tx: tx.clone(),
        };
        let task = tokio::spawn(async move {
            keeper.run().await;
        });
        Self {
            id,
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
        let id = self.id;
        let revoked = conn
            .retrying_within(within, |mut c| async move { c.lease_revoke(id).await })
            .await;
        if let Err(e) = revoked {
            tracing::debug!(error = %e, "revoking the lease failed; it will expire by its TTL");
        }
    }
}

/// Record the loss; the first reason stays.
pub fn lose(tx: &watch::Sender<KeeperState>, why: LossReason) {
    tx.send_modify(|s| {
        s.lost.get_or_insert(why);
    });
}

/// Report the first failure of a run of them; the next good reply clears it.
fn trouble(tx: &watch::Sender<KeeperState>, why: &str) {
    tx.send_if_modified(|s| {
        let first = s.trouble.is_none();
        if first {
            s.trouble = Some(why.to_owned());
        }
        first
    });
}

/// etcd takes whole seconds: round up, so the lease is never shorter than asked.
fn ttl_secs(ttl: Duration) -> i64 {
    ttl.as_secs_f64().ceil().max(1.0) as i64
}

/// A keepalive stream, as the keeper uses it.
trait Link {
    /// Open the stream. The client sends its first keepalive and reads the reply itself,
    /// telling only whether the lease lives.
    async fn open(&mut self) -> Result<(), LinkError>;
    /// Write one keepalive on the open stream.
    async fn send(&mut self) -> Result<(), LinkError>;
    /// The next reply's TTL.
    async fn reply(&mut self) -> Result<i64, LinkError>;
    fn is_open(&self) -> bool;
    /// Drop the stream, so that a reply to an abandoned keepalive cannot arrive on the next one.
    fn close(&mut self);
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

/// The keepalive stream of one lease on an etcd client.
struct EtcdLink {
    client: Client,
    id: i64,
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

impl EtcdLink {
    fn new(client: Client, id: i64) -> Self {
        Self {
            client,
            id,
            stream: None,
        }
    }
}

impl Link for EtcdLink {
    async fn open(&mut self) -> Result<(), LinkError> {
        match self.client.lease_keep_alive(self.id).await {
            Ok(pair) => {
                self.stream = Some(pair);
                Ok(())
            }
            // "lease not found": the first reply carried TTL <= 0.
            Err(etcd_client::Error::LeaseKeepAliveError(_)) => Err(LinkError::Expired),
            Err(e) => Err(LinkError::Broken(format!(
                "opening the keepalive stream failed: {e}"
            ))),
        }
    }

    async fn send(&mut self) -> Result<(), LinkError> {
        let broken = || LinkError::Broken("the keepalive stream broke: rebuilding it".into());
        let (keeper, _) = self.stream.as_mut().ok_or_else(broken)?;
        keeper.keep_alive().await.map_err(|_| broken())
    }

    async fn reply(&mut self) -> Result<i64, LinkError> {
        let ended = || LinkError::Broken("the keepalive stream ended: rebuilding it".into());
        let (_, replies) = self.stream.as_mut().ok_or_else(ended)?;
        match replies.message().await {
            Ok(Some(r)) => Ok(r.ttl()),
            Ok(None) => Err(ended()),
            Err(e) => Err(LinkError::Broken(format!(
                "the keepalive stream failed: {e}"
            ))),
        }
    }

    fn is_open(&self) -> bool {
        self.stream.is_some()
    }

    fn close(&mut self) {
        self.stream = None;
    }
}

/// What one step's I/O came to, for the next step to judge at its own instant.
#[derive(Debug)]
enum Outcome {
    /// Nothing to judge (slept, or a keepalive was written).
    Nothing,
    /// The stream opened.
    Opened,
    /// A reply came with this TTL.
    Replied(i64),
    /// The stream failed, or no reply came in time.
    Failed(String),
    /// etcd does not know the lease.
    Expired,
}

/// The renewal task's state: the schedule, the stream, and where to publish.
struct Keeper<L, C> {
    /// The lease id, for the logs.
    lease: i64,
    link: L,
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
            };
        }
    }

    /// Apply the previous step's outcome, seen at `now`.
    fn judge(&mut self, now: BootInstant, outcome: Outcome) -> Result<(), LossReason> {
        match outcome {
            Outcome::Nothing => {}
            Outcome::Opened => self.schedule.opened(),
            Outcome::Failed(why) => {
                tracing::warn!(lease = format!("{:x}", self.lease), reason = %why, "renewal failed");
                trouble(&self.tx, &why);
                self.link.close();
                self.schedule.failed(now);
            }
            Outcome::Expired => return Err(LossReason::Expired),
            Outcome::Replied(ttl) => {
                let verdict = self.schedule.replied(now, ttl);
                tracing::debug!(
                    lease = format!("{:x}", self.lease),
                    ?verdict,
                    "keepalive reply"
                );
                match verdict {
                    Verdict::Extended(d) => self.publish(d),
                    Verdict::Lost(why) => return Err(why),
                    Verdict::Ignored => {}
                }
            }
        }
        Ok(())
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
        let late = || Outcome::Failed("no keepalive reply in time: rebuilding the stream".into());
        if self.link.is_open() {
            match self.clock.by(due, self.link.reply()).await {
                Some(Ok(ttl)) => Outcome::Replied(ttl),
                Some(Err(e)) => e.into(),
                None => late(),
            }
        } else {
            match self.clock.by(due, self.link.open()).await {
                Some(Ok(())) => Outcome::Opened,
                Some(Err(e)) => e.into(),
                None => late(),
            }
        }
    }

    fn publish(&self, deadline: BootInstant) {
        let stop_at = self.schedule.stop_at();
        self.tx.send_modify(|s| {
            s.deadline = deadline;
            s.stop_at = stop_at;
            s.trouble = None;
        });
    }

    fn lost(&self, why: LossReason) -> LossReason {
        lose(&self.tx, why.clone());
        why
    }
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

    /// Made-up time: it moves only when the keeper sleeps, times out, or a reply takes time.
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

    /// One scripted answer of the fake stream.
    #[derive(Clone, Debug)]
    enum Answer {
        /// Comes after this long, with this TTL.
        Ttl(u64, i64),
        /// Never comes.
        Hang,
        Broken,
        Expired,
    }

    /// A keepalive stream that answers from a script and logs when each keepalive was written.
    struct FakeLink {
        clock: FakeClock,
        answers: Rc<RefCell<VecDeque<Answer>>>,
        /// The instants at which a keepalive went out ("open" or "send").
        log: Rc<RefCell<Vec<(&'static str, BootInstant)>>>,
        open: bool,
    }

    impl FakeLink {
        /// The next answer; an empty script hangs.
        async fn answer(&mut self) -> Result<i64, LinkError> {
            let next = self.answers.borrow_mut().pop_front();
            match next.unwrap_or(Answer::Hang) {
                Answer::Ttl(ms, ttl) => {
                    self.clock.advance(Duration::from_millis(ms));
                    Ok(ttl)
                }
                Answer::Hang => std::future::pending().await,
                Answer::Broken => Err(LinkError::Broken("broken".into())),
                Answer::Expired => Err(LinkError::Expired),
            }
        }
    }

    impl Link for FakeLink {
        async fn open(&mut self) -> Result<(), LinkError> {
            self.log.borrow_mut().push(("open", self.clock.now()));
            self.answer().await?;
            self.open = true;
            Ok(())
        }

        async fn send(&mut self) -> Result<(), LinkError> {
            self.log.borrow_mut().push(("send", self.clock.now()));
            Ok(())
        }

        async fn reply(&mut self) -> Result<i64, LinkError> {
            self.answer().await
        }

        fn is_open(&self) -> bool {
            self.open
        }

        fn close(&mut self) {
            self.open = false;
        }
    }

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_secs(1000) + Duration::from_millis(ms))
    }

    /// `D` of a keepalive sent at `ms` with TTL 10 s (drift 0.1, margin 1 s).
    fn d(ms: u64) -> BootInstant {
        at(ms) + Duration::from_nanos(8_090_909_090)
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
                answers: Rc::new(RefCell::new(answers.iter().cloned().collect())),
                log: log.clone(),
                open: false,
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

    #[test]
    fn renews_every_third_of_the_ttl_and_the_opening_reply_moves_nothing() {
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
                ("send", t2),
                ("send", t3)
            ],
            "the stream opens when the first renewal is due, and a keepalive follows at once"
        );
        // The keepalive sent at t2 renewed; the one at t3 hangs until the stop time.
        assert_near(r.state.deadline, t2 + Duration::from_nanos(8_090_909_090));
        assert_eq!(r.lost, LossReason::NotRenewed);
        assert_eq!(r.state.lost, Some(LossReason::NotRenewed));
        assert_eq!(r.at, r.state.stop_at, "gives up exactly at the stop time");
    }

    #[test]
    fn a_reply_with_ttl_zero_is_lost_at_once() {
        let r = run(&[Answer::Ttl(5, 10), Answer::Ttl(5, 0)]);
        assert_eq!(r.lost, LossReason::Expired);
        assert_eq!(r.at, thirds(1) + ms(10));
        assert_near(r.state.deadline, d(0));
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
            r.log,
            [
                ("open", thirds(1)),
                ("send", thirds(1)),
                ("send", thirds(2)),
                ("open", thirds(2)),
                ("send", thirds(2)),
                ("send", thirds(3)),
            ]
        );
        // The send at 3/3 hangs: D stays where the resend at 2/3 put it.
        assert_near(
            r.state.deadline,
            thirds(2) + Duration::from_nanos(8_090_909_090),
        );
    }

    #[test]
    fn a_late_reply_does_not_move_the_deadline() {
        // The stream opens at once, then the reply takes longer than the rest of the time.
        let r = run(&[Answer::Ttl(0, 10), Answer::Ttl(3_400, 10)]);
        assert_near(r.state.deadline, d(0));
        assert_eq!(r.lost, LossReason::NotRenewed);
    }

    #[test]
    fn a_broken_stream_is_trouble_and_is_retried_at_once_then_every_tenth() {
        use Answer::Broken;
        let r = run(&[Broken, Broken, Broken]);
        let opens: Vec<BootInstant> = r.log.iter().map(|(_, t)| *t).collect();
        assert_eq!(opens[..3], [thirds(1), thirds(1), thirds(1) + ms(1_000)]);
        assert!(r.state.trouble.is_some());
        assert_eq!(r.lost, LossReason::NotRenewed);
    }
}
