//! The ZooKeeper backend, behind [`crate::lease::backend`]:
//!
//! - [`wire`]: the packets (jute), as pure functions of bytes;
//! - [`net`], [`tls`], [`sasl`]: one connection to one member, and its handshake;
//! - [`session`]: a session over one member at a time, its requests, watches and moves;
//! - [`client`]: sessions from the configuration, bounds, 69/77, ACLs, `conf`;
//! - [`lock`]: the lock recipe (ephemeral sequential nodes, predecessor watch, czxid token);
//! - [`keeper`]: the keeper that renews `D` by `timing::zk::ZkSchedule`;
//! - [`runs`], [`status`], [`fence`]: run records, `status` and `fenced-put`.
//!
//! This file ties them into taking and holding a lease. Each attempt is a new session: a
//! waiter whose session or node is lost while queued starts over, and its child never starts.
//! Every session is closed when leasewrap is done with it, which deletes its lock node: the
//! release is one request. Nothing here touches a process, and nothing on the kill path waits
//! for it.

pub mod client;
pub mod fence;
pub mod runs;
mod sasl;
pub mod status;
pub(crate) mod tls;

/// Modules of the backend's own, public only to the tests of their seams (the `seams` feature,
/// which no build a user runs turns on).
macro_rules! seams {
    ($($module:ident),*) => {$(
        #[cfg(feature = "seams")]
        pub mod $module;
        #[cfg(not(feature = "seams"))]
        mod $module;
    )*};
}

seams!(keeper, lock, net, session, wire);

use std::time::Duration;

use tokio::task::JoinHandle;

use self::client::{Conf, Learned, NotOpened};
use self::keeper::Keeper;
use self::lock::{Own, Place};
use self::session::{Connection, Watch, Zk as Session};
use super::backend::{self, Boxed};
use super::timing::zk::{round_trip_allowance, ZkSchedule};
use super::timing::Params;
use super::{Held, LeaseEvent};
use crate::clock::BootInstant;
use crate::config::ZkConfig;
use crate::error::Error;
use crate::runs::{RunRecord, Written};

/// How long closing a session may take before it is left to expire.
const CLOSE_WITHIN: Duration = Duration::from_secs(1);

/// ZooKeeper, prepared for a run.
pub struct Zk {
    cfg: ZkConfig,
    params: Params,
    /// What the ensemble tells of its timing, asked while the first session is opened.
    asking: Option<JoinHandle<Learned>>,
    learned: Learned,
    /// The attempt in progress, to undo if it is abandoned.
    attempt: Option<Attempt>,
    /// Why no session could be opened yet, while a waiter waits for the ensemble to serve.
    unavailable: Option<String>,
    /// When a waiter last said it is waiting for the ensemble to serve.
    told: Option<tokio::time::Instant>,
}

/// How often a waiter riding out an ensemble that does not serve says so again.
const TELL_EVERY: Duration = Duration::from_secs(60);

/// A session with its own node queued and its lease kept.
struct Attempt {
    zk: Session,
    own: Option<Own>,
    /// The parent's children, listed right behind the own node's create, for the first look.
    listing: Option<Vec<String>>,
    keeper: Option<Keeper>,
}

impl Zk {
    /// Ask the members for `conf` in the background; the session is opened by each attempt.
    pub async fn connect(cfg: &ZkConfig, params: Params) -> Result<Self, Error> {
        client::reach(cfg)?;
        let for_conf = cfg.clone();
        let asking = tokio::spawn(async move { client::learn(&for_conf).await });
        Ok(Zk {
            cfg: cfg.clone(),
            params,
            asking: Some(asking),
            learned: Learned::default(),
            attempt: None,
            unavailable: None,
            told: None,
        })
    }

    /// Take the lease. A waiter rides out an ensemble that does not serve (an election, a hung
    /// member) until its wait runs out, and once queued, the ensemble's trouble too, queueing
    /// again with a new session if its own was lost. Without a wait, or when every member
    /// refuses (no such host or port, refused credentials), the first failure ends it.
    async fn acquire(&mut self, name: &str, record: &[u8], block: bool) -> Result<ZkHeld, Error> {
        // Until a session is opened, a wait that runs out ran out on the ensemble, not on a
        // holder.
        self.unavailable = Some(format!(
            "ZooKeeper at {}: no member has given a session yet",
            self.cfg.connect
        ));
        loop {
            match self.queue(name, record).await {
                Ok(()) => self.unavailable = None,
                Err(Queued::NotOpened(n)) if block && n.transient => {
                    self.ride_out(&n.error);
                    tokio::time::sleep(self.retry_every()).await;
                    continue;
                }
                Err(Queued::NotOpened(n)) => return Err(n.error),
                Err(Queued::Failed(e)) if block && transient(&e) => {
                    self.ride_out(&e);
                    self.abandon().await;
                    tokio::time::sleep(self.retry_every()).await;
                    continue;
                }
                Err(Queued::Failed(e)) => {
                    self.abandon().await;
                    return Err(e);
                }
            }
            if self.wait_turn(name, block).await? {
                if let Some(held) = self.confirmed() {
                    return Ok(held);
                }
            }
            tracing::warn!(name = %name, "own session or node lost while acquiring: queueing again");
            self.abandon().await;
        }
    }

    /// A waiter rides out an ensemble that does not serve: it says so once when it starts, then
    /// at most once a minute, with each member's last reason (the error names them).
    fn ride_out(&mut self, error: &Error) {
        self.unavailable = Some(error.to_string());
        let now = tokio::time::Instant::now();
        if self.told.is_some_and(|at| now < at + TELL_EVERY) {
            tracing::debug!(error = %error, "the ensemble still does not serve; trying again");
            return;
        }
        self.told = Some(now);
        tracing::warn!(error = %error, "waiting for the ZooKeeper ensemble to serve");
    }

    /// How long a waiter waits before it tries again after a failed request.
    fn retry_every(&self) -> Duration {
        self.params.ttl / 10
    }

    /// Open a session, create the own node while the ensemble's timing is still being learned
    /// (the rule needs it only to keep the lease), check the timing and start keeping the lease.
    /// A timing the rule refuses closes the session, and the node with it.
    async fn queue(&mut self, name: &str, record: &[u8]) -> Result<(), Queued> {
        let session = client::connect(&self.cfg, self.params.ttl, true)
            .await
            .map_err(Queued::NotOpened)?;
        self.attempt = Some(Attempt {
            zk: session.zk.clone(),
            own: None,
            listing: None,
            keeper: None,
        });
        let learning = learn_timing(&self.cfg, self.asking.take(), self.learned.clone());
        let queueing = lock::enqueue(&self.cfg, &session.zk, name, record);
        tokio::pin!(learning, queueing);
        // The timing is judged as soon as it is known, the node's create going on meanwhile.
        let mut queued = None;
        self.learned = loop {
            tokio::select! {
                learned = &mut learning => break learned,
                done = &mut queueing, if queued.is_none() => queued = Some(done),
            }
        };
        let schedule = self.schedule(&session.first).map_err(Queued::Failed)?;
        let queued = match queued {
            Some(done) => done,
            None => queueing.await,
        };
        let (own, listing) = queued.map_err(Queued::Failed)?;
        let keeper = Keeper::start(
            session.zk.clone(),
            own.clone(),
            schedule,
            session.first.epoch,
        );
        if let Some(a) = self.attempt.as_mut() {
            a.own = Some(own);
            a.listing = listing;
            a.keeper = Some(keeper);
        }
        Ok(())
    }

    /// The schedule of a session whose first connection is `first`: the timeout in force is the
    /// smallest any member may negotiate (those whose `conf` answered), tickTime the largest any
    /// member told, and the rule must leave room for a renewal's round trips: at least 100 ms each
    /// (else 64, bad usage), and as long as this session's connect took (else 69: the ensemble
    /// answers too slowly now for this TTL, which a waiter rides out).
    fn schedule(&self, first: &Connection) -> Result<ZkSchedule, Error> {
        let timeout = in_force(self.params.ttl, first.timeout, &self.learned.conf);
        let tick = self.learned.tick();
        say_what_counts(first, timeout, &self.learned, self.cfg.members.len());
        let at = |room| ZkSchedule::connected_within(self.params, first.sent, timeout, tick, room);
        let schedule =
            at(round_trip_allowance(Duration::ZERO)).map_err(|e| Error::Usage(e.to_string()))?;
        if let Err(e) = at(round_trip_allowance(first.round_trip)) {
            return Err(Error::Unavailable(format!(
                "ZooKeeper at {} answers too slowly for this TTL now (the session's connect took {:.0} ms, \
                 and a renewal makes three such round trips): {e}",
                self.cfg.connect,
                first.round_trip.as_secs_f64() * 1e3
            )));
        }
        Ok(schedule)
    }

    /// Wait for the own node's turn: true once it is first on a listing the leader vouches for,
    /// false when the session or the node was lost on the way. A failed request is tried
    /// again (the keeper's loss ends the wait); only refused credentials and `-n` end it.
    /// First at the first look needs no `sync`, as on etcd: the listing came after the own
    /// create's answer on the same connection, so the member had applied everything up to that
    /// create, which the leader had just accepted from a live session.
    async fn wait_turn(&mut self, name: &str, block: bool) -> Result<bool, Error> {
        let (cfg, every, retry) = (&self.cfg, self.params.ttl / 4, self.params.ttl / 10);
        let Some(Attempt {
            zk,
            own: Some(own),
            listing,
            keeper: Some(keeper),
        }) = self.attempt.as_mut()
        else {
            return Ok(false);
        };
        let (mut logged, mut waited) = (false, false);
        loop {
            if keeper.now().lost.is_some() {
                return Ok(false);
            }
            let step = look(cfg, zk, own, listing.take(), waited, block, name).await;
            waited = true;
            let watch = match step {
                Ok(Look::Ended(turn)) => return Ok(turn),
                Ok(Look::Behind(w)) => w,
                Err(e) if transient(&e) => {
                    tracing::debug!(error = %e, "looking at the queue failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(retry) => {}
                        _ = keeper.changed() => {}
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !std::mem::replace(&mut logged, true) {
                tracing::info!(name = %name, token_once_acquired = own.czxid, "waiting for the lease");
            }
            tokio::select! {
                () = lock::wait_gone(watch, every) => {}
                _ = keeper.changed() => {}
            }
        }
    }

    /// After the turn came: `D` must still be ahead and the lease not lost.
    fn confirmed(&mut self) -> Option<ZkHeld> {
        let a = self.attempt.as_ref()?;
        let state = a.keeper.as_ref()?.now();
        if state.lost.is_some() || BootInstant::now() >= state.stop_at {
            return None;
        }
        let a = self.attempt.take()?;
        let (own, mut keeper) = (a.own?, a.keeper?);
        keeper.watch_own(a.zk.clone(), own.clone());
        Some(ZkHeld {
            zk: a.zk,
            cfg: self.cfg.clone(),
            own,
            keeper,
        })
    }

    /// Undo an attempt: stop keeping its lease and close its session, which deletes its node
    /// (also one whose create was still in flight).
    async fn abandon(&mut self) {
        if let Some(a) = self.attempt.take() {
            if let Some(k) = a.keeper {
                k.stop();
            }
            a.zk.close(CLOSE_WITHIN).await;
        }
    }
}

/// What the ensemble tells of its timing: what was asked in the background (`asking`), else
/// what was learned before; asked again when no member told a tickTime (an election then).
async fn learn_timing(
    cfg: &ZkConfig,
    asking: Option<JoinHandle<Learned>>,
    mut learned: Learned,
) -> Learned {
    if let Some(asking) = asking {
        learned = asking.await.unwrap_or_default();
    }
    if learned.tick().is_none() {
        learned = client::learn(cfg).await;
    }
    learned
}

/// What stopped an attempt to queue.
enum Queued {
    NotOpened(NotOpened),
    Failed(Error),
}

/// The session timeout the rule counts with: the negotiated one, or the smallest that any member
/// whose `conf` answered would negotiate for `asked` on a reconnect, if smaller.
fn in_force(asked: Duration, negotiated: Duration, conf: &[(String, Conf)]) -> Duration {
    let clamp = |c: &Conf| {
        let low = c.min_session.unwrap_or(c.tick * 2);
        let high = c.max_session.unwrap_or(c.tick * 20).max(low);
        asked.clamp(low, high)
    };
    conf.iter()
        .map(|(_, c)| clamp(c))
        .fold(negotiated, Duration::min)
}

/// One line (INFO) on the figures the rule counts with, and where each comes from.
fn say_what_counts(first: &Connection, timeout: Duration, learned: &Learned, members: usize) {
    let (tick, conf) = (learned.tick(), &learned.conf);
    let tick_from = match (conf.is_empty(), learned.min_session) {
        (false, _) => "conf",
        (true, Some(_)) => {
            "half the smallest session timeout (conf is not in 4lw.commands.whitelist)"
        }
        (true, None) => "unknown (no conf, no session timeout told): taken as the timeout/2",
    };
    tracing::info!(
        member = %first.member,
        negotiated_ms = first.timeout.as_millis() as u64,
        timeout_ms = timeout.as_millis() as u64,
        tick_time_ms = tick.map(|t| t.as_millis() as u64),
        tick_time = tick_from,
        members_with_conf = conf.len(),
        members,
        connect_round_trip_ms = first.round_trip.as_secs_f64() * 1e3,
        "ZooKeeper session: the timing rule counts with this timeout and tickTime"
    );
}

/// A failure that a waiter waits out: the ensemble not answering, as against refused
/// credentials or bad usage.
/// What one look at the queue found.
enum Look {
    /// The wait is over: the turn came (true) or the own node is gone (false).
    Ended(bool),
    /// A lock node is ahead; this watch fires when it changes.
    Behind(Watch),
}

/// One look at the queue. After a wait, the queue is listed behind a `sync`, so that the turn
/// counts only on what the leader had (`confirmed` then checks that `D` is still ahead, so the
/// own session is alive there); behind another with `-n` is `Busy`.
async fn look(
    cfg: &ZkConfig,
    zk: &Session,
    own: &Own,
    listing: Option<Vec<String>>,
    waited: bool,
    block: bool,
    name: &str,
) -> Result<Look, Error> {
    let listing = match (listing, waited) {
        (None, true) => Some(lock::synced_listing(cfg, zk, own).await?),
        (listing, _) => listing,
    };
    match lock::place(cfg, zk, own, listing).await? {
        Place::Gone => Ok(Look::Ended(false)),
        Place::First => Ok(Look::Ended(true)),
        Place::Behind(..) if !block => Err(Error::Busy { name: name.into() }),
        Place::Behind(ahead, watch) => {
            tracing::debug!(ahead = %ahead, "waiting for the lock node ahead");
            Ok(Look::Behind(watch))
        }
    }
}

fn transient(e: &Error) -> bool {
    matches!(e, Error::Unavailable(_))
}

impl backend::Lessor for Zk {
    fn acquire<'a>(
        &'a mut self,
        name: &'a str,
        record: &'a [u8],
        block: bool,
    ) -> Boxed<'a, Result<Held, Error>> {
        Box::pin(async move {
            let held = Zk::acquire(self, name, record, block).await?;
            let state = held.keeper.now();
            Ok(Held::new(
                held.own.czxid as u64,
                held.own.path.clone(),
                Some(held.zk.session_id()),
                Some(state.deadline),
                state.stop_at.until(state.deadline),
                Box::new(held),
            ))
        })
    }

    fn abandon(&mut self) -> Boxed<'_, ()> {
        Box::pin(Zk::abandon(self))
    }

    fn unavailable(&self) -> Option<Error> {
        self.unavailable.clone().map(Error::Unavailable)
    }
}

/// A lease that is ours: the session, the own node, and the keeper.
struct ZkHeld {
    zk: Session,
    cfg: ZkConfig,
    own: Own,
    keeper: Keeper,
}

impl backend::Lease for ZkHeld {
    fn next_event(&mut self) -> Boxed<'_, LeaseEvent> {
        Box::pin(async move { self.keeper.changed().await.event() })
    }

    /// Close the session: ZooKeeper deletes the own node with it, so that the next waiter
    /// starts within milliseconds.
    fn release(self: Box<Self>) -> Boxed<'static, ()> {
        Box::pin(async move {
            self.keeper.stop();
            self.zk.close(CLOSE_WITHIN).await;
        })
    }

    fn read_record<'a>(
        &'a self,
        name: &'a str,
        key: &'a str,
    ) -> Boxed<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(runs::read(&self.cfg, &self.zk, name, key))
    }

    fn write_record<'a>(
        &'a mut self,
        record: &'a RunRecord,
        _keep: Duration,
    ) -> Boxed<'a, Result<Written, Error>> {
        Box::pin(runs::write(&self.cfg, &self.zk, &self.own.path, record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(tick: u64, min: Option<u64>, max: Option<u64>) -> (String, Conf) {
        let ms = Duration::from_millis;
        let c = Conf {
            tick: ms(tick),
            sync_limit: None,
            min_session: min.map(ms),
            max_session: max.map(ms),
        };
        ("m:1".into(), c)
    }

    #[test]
    fn the_timeout_in_force_is_the_smallest_any_member_would_negotiate() {
        let s = Duration::from_secs;
        // Negotiated 4 s; one member would give at most 1 s on a reconnect.
        let members = [conf(200, None, Some(1_000)), conf(200, None, None)];
        assert_eq!(in_force(s(4), s(4), &members), s(1));
        // Defaults: [2, 20] x tickTime.
        assert_eq!(in_force(s(10), s(4), &[conf(100, None, None)]), s(2));
        assert_eq!(in_force(s(4), s(4), &[]), s(4));
    }
}
