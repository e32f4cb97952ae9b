//! The ZooKeeper backend, behind [`crate::lease::backend`]:
//!
//! - [`client`]: dialling, bounded requests, telling 69 from 77, and `conf`;
//! - [`lock`]: the lock recipe (ephemeral sequential nodes, predecessor watch, czxid token);
//! - [`session`]: the keeper that renews `D` by `timing::zk::ZkSchedule`;
//! - [`runs`], [`status`], [`fence`]: run records, `status` and `fenced-put`.
//!
//! This file ties them into taking and holding a lease. Each attempt is a new session: a
//! waiter whose session or node is lost while queued starts over, and its child never starts.
//! Nothing here touches a process, and nothing on the kill path waits for it.

pub mod client;
pub mod fence;
mod lock;
pub mod runs;
mod session;
pub mod status;

use std::time::Duration;

use tokio::task::JoinHandle;
use zookeeper_client as zkc;

use self::lock::{Own, Place};
use self::session::Keeper;
use super::backend::{self, Boxed};
use super::timing::zk::ZkSchedule;
use super::timing::Params;
use super::{Held, LeaseEvent};
use crate::clock::BootInstant;
use crate::config::ZkConfig;
use crate::error::Error;
use crate::runs::{RunRecord, Written};

/// ZooKeeper, prepared for a run.
pub struct Zk {
    cfg: ZkConfig,
    params: Params,
    /// The ensemble's answer to `conf`, asked while the first session is opened.
    conf: Option<JoinHandle<Option<client::Conf>>>,
    /// tickTime, when the ensemble told it.
    tick: Option<Duration>,
    /// The attempt in progress, to undo if it is abandoned.
    attempt: Option<Attempt>,
}

/// A session with its own node queued and its lease kept.
struct Attempt {
    zk: zkc::Client,
    own: Own,
    keeper: Keeper,
}

impl Zk {
    /// Ask the ensemble for its tickTime, in the background; the session is opened by each
    /// attempt.
    pub async fn connect(cfg: &ZkConfig, params: Params) -> Result<Self, Error> {
        let asking = cfg.clone();
        let conf = tokio::spawn(async move { client::conf(&asking).await });
        Ok(Zk {
            cfg: cfg.clone(),
            params,
            conf: Some(conf),
            tick: None,
            attempt: None,
        })
    }

    /// Take the lease. Only the first session's failure to connect ends the attempt (69, 77);
    /// once queued, a waiter rides out the ensemble's trouble (a leader election, a member cut
    /// off) and queues again with a new session if its own was lost.
    async fn acquire(&mut self, name: &str, record: &[u8], block: bool) -> Result<ZkHeld, Error> {
        let mut first = true;
        loop {
            match self.queue(name, record).await {
                Ok(()) => first = false,
                Err(e) if first || !transient(&e) => return Err(e),
                Err(e) => {
                    tracing::debug!(error = %e, "queueing again failed; retrying");
                    tokio::time::sleep(self.retry_every()).await;
                    continue;
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

    /// How long a waiter waits before it tries again after a failed request.
    fn retry_every(&self) -> Duration {
        self.params.ttl / 10
    }

    /// Open a session, check its negotiated timeout against the timing rules, create the own
    /// node and start keeping the lease.
    async fn queue(&mut self, name: &str, record: &[u8]) -> Result<(), Error> {
        let session = client::connect(&self.cfg, self.params.ttl, true).await?;
        if let Some(conf) = self.conf.take() {
            self.tick = conf.await.ok().flatten().map(|c| c.tick);
        }
        let schedule =
            ZkSchedule::connected(self.params, session.t_connect, session.timeout, self.tick)
                .map_err(|e| Error::Usage(e.to_string()))?;
        tracing::debug!(timeout = ?session.timeout, "ZooKeeper session opened");
        let own = lock::enqueue(&self.cfg, &session.client, name, record).await?;
        let keeper = Keeper::start(
            session.client.clone(),
            own.path.clone(),
            own.czxid,
            schedule,
        );
        self.attempt = Some(Attempt {
            zk: session.client,
            own,
            keeper,
        });
        Ok(())
    }

    /// Wait for the own node's turn: true once it is first and confirmed through the leader,
    /// false when the session or the node was lost on the way. A failed request is tried
    /// again (the keeper's loss ends the wait); only refused credentials and `-n` end it.
    /// First at the first look needs no confirmation, as on etcd: the listing came after the
    /// own create's answer on the same connection, so the member had applied everything up to
    /// that create, which the leader had just accepted from a live session.
    async fn wait_turn(&mut self, name: &str, block: bool) -> Result<bool, Error> {
        let (cfg, every, retry) = (&self.cfg, self.params.ttl / 4, self.params.ttl / 10);
        let Some(a) = self.attempt.as_mut() else {
            return Ok(false);
        };
        let (mut logged, mut waited) = (false, false);
        loop {
            if a.keeper.now().lost.is_some() {
                return Ok(false);
            }
            let step = match lock::place(cfg, &a.zk, &a.own).await {
                Ok(Place::Gone) => return Ok(false),
                Ok(Place::First) if !waited => return Ok(true),
                Ok(Place::First) => match lock::confirm(cfg, &a.zk, &a.own).await {
                    Ok(confirmed) => return Ok(confirmed),
                    Err(e) => Err(e),
                },
                Ok(Place::Behind(_)) if !block => return Err(Error::Busy { name: name.into() }),
                Ok(Place::Behind(p)) => Ok(p),
                Err(e) => Err(e),
            };
            waited = true;
            let predecessor = match step {
                Ok(p) => p,
                Err(e) if transient(&e) => {
                    tracing::debug!(error = %e, "looking at the queue failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(retry) => {}
                        _ = a.keeper.changed() => {}
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !std::mem::replace(&mut logged, true) {
                tracing::info!(name = %name, token_once_acquired = a.own.czxid, "waiting for the lease");
            }
            tokio::select! {
                r = lock::wait_gone(cfg, &a.zk, &predecessor, every) => if let Err(e) = r {
                    tracing::debug!(error = %e, "watching the node before ours failed; looking again");
                    tokio::time::sleep(retry).await;
                },
                _ = a.keeper.changed() => {}
            }
        }
    }

    /// After the turn came: `D` must still be ahead and the lease not lost.
    fn confirmed(&mut self) -> Option<ZkHeld> {
        let a = self.attempt.as_ref()?;
        let state = a.keeper.now();
        if state.lost.is_some() || BootInstant::now() >= state.stop_at {
            return None;
        }
        let mut a = self.attempt.take()?;
        a.keeper
            .watch_own(a.zk.clone(), a.own.path.clone(), a.own.czxid);
        Some(ZkHeld {
            cfg: self.cfg.clone(),
            zk: a.zk,
            own: a.own,
            keeper: a.keeper,
        })
    }

    /// Undo an attempt: stop keeping its lease and delete its node.
    async fn abandon(&mut self) {
        if let Some(a) = self.attempt.take() {
            a.keeper.stop();
            lock::delete(&self.cfg, &a.zk, &a.own.path, self.cfg.conn.dial_timeout).await;
        }
    }
}

/// A failure that a waiter waits out: the ensemble not answering, as against refused
/// credentials or bad usage.
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
                Some(held.zk.session_id().0),
                Some(state.deadline),
                state.stop_at.until(state.deadline),
                Box::new(held),
            ))
        })
    }

    fn abandon(&mut self) -> Boxed<'_, ()> {
        Box::pin(Zk::abandon(self))
    }
}

/// A lease that is ours: the session, the own node, and the keeper.
struct ZkHeld {
    cfg: ZkConfig,
    zk: zkc::Client,
    own: Own,
    keeper: Keeper,
}

impl backend::Lease for ZkHeld {
    fn next_event(&mut self) -> Boxed<'_, LeaseEvent> {
        Box::pin(async move { self.keeper.changed().await.event() })
    }

    /// Delete the own node at once, so that the next waiter starts within milliseconds; the
    /// session closes as the client is dropped.
    fn release(self: Box<Self>) -> Boxed<'static, ()> {
        Box::pin(async move {
            self.keeper.stop();
            let within = self.cfg.conn.dial_timeout.min(Duration::from_secs(1));
            lock::delete(&self.cfg, &self.zk, &self.own.path, within).await;
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
