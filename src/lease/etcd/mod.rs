//! The etcd backend, in the layout of etcd's own `client/v3/concurrency` so that `--prefix ''`
//! excludes `etcdctl lock NAME` and back:
//!
//! - [`client`]: dialling, bounded and retried requests, and telling 69 from 77;
//! - [`session`]: the lease and the task that keeps it, following `timing::Schedule`;
//! - [`mutex`]: the key queued behind the others, the wait for its turn, the own-key watch.
//!
//! This file ties them into taking and holding a lease. The fencing token is the own key's
//! create revision. Nothing here touches a process, and nothing on the kill path waits for it.

pub mod client;
pub mod fence;
mod mutex;
pub mod runs;
mod session;
pub mod status;

use std::time::Duration;

use tokio::sync::watch;

use self::client::{Conn, Members};
use self::mutex::{Queued, Turn};
pub use self::session::KeeperState;
use self::session::{Grant, OwnKey, Session};
use super::backend::{self, Boxed};
use super::timing::Params;
use super::{Held, LeaseEvent};
use crate::clock::BootInstant;
use crate::config::EtcdConfig;
use crate::error::Error;
use crate::runs::{RunRecord, Written};

/// A dialled etcd and the lease being waited on, if any.
pub struct Etcd {
    conn: Conn,
    cfg: EtcdConfig,
    params: Params,
    /// How far the attempt in progress got, so that an abandoned one can be undone.
    attempt: Attempt,
    /// A key to read along with the lock's own looks (a run record), at the revision that
    /// confirms the lease ours.
    along: Option<String>,
}

/// What an attempt to take the lease has made so far.
enum Attempt {
    /// Nothing to undo.
    None,
    /// A lease granted, its key not queued yet: revoke it.
    Granted(i64),
    /// The key queued and the lease kept: stop keeping it, and revoke it.
    Kept(Session),
}

/// A lease that is ours, as the run loop sees it.
pub struct EtcdHeld {
    conn: Conn,
    session: Session,
    queued: Queued,
    /// The `along` key's value when the lease was confirmed ours; none when none was asked for.
    along: Option<Option<Vec<u8>>>,
    /// Bound on the revoke at release.
    release_within: Duration,
    /// The key prefix, where the run records are.
    prefix: String,
    /// With --once, the lease for this run's record, asked for while the child runs.
    record_lease: Option<runs::RecordLease>,
}

impl Etcd {
    /// Dial etcd. The client connects lazily, so unreachable endpoints show at the first call;
    /// with a user it authenticates here, and a refused password is status 77.
    pub async fn connect(cfg: &EtcdConfig, params: Params) -> Result<Self, Error> {
        Ok(Self {
            conn: Conn::dial(cfg).await?,
            cfg: cfg.clone(),
            params,
            attempt: Attempt::None,
            along: None,
        })
    }

    /// Take the lease `name`, queueing behind earlier holders when `block`. A waiter whose own
    /// lease expires while queued starts over with a new lease: its child must not start.
    pub async fn acquire(
        &mut self,
        name: &str,
        record: &[u8],
        block: bool,
    ) -> Result<EtcdHeld, Error> {
        loop {
            let (queued, state, recheck) = self.queue(name, record).await?;
            let turn = match queued.owned {
                true => Turn::Ours {
                    read_at: queued.read_at,
                    along: queued.along.clone(),
                },
                false if !block => return Err(Error::Busy { name: name.into() }),
                false => {
                    // The waiter's own key's revision: its token once its turn comes, not the holder's.
                    tracing::info!(name = %name, token_once_acquired = queued.revision, "waiting for the lease");
                    let along = (name, self.along.as_deref());
                    let mut members = Members::new(&self.cfg, &self.conn);
                    let recheck = members.several().then_some(recheck);
                    mutex::wait_turn(&mut members, &self.cfg, along, &queued, recheck, state)
                        .await?
                }
            };
            if let Turn::Ours { read_at, along } = turn {
                if let Some(held) = self.confirm(queued, read_at, along) {
                    return Ok(held);
                }
            }
            tracing::warn!(name = %name, "own lease or key lost while acquiring: queueing again");
            self.abandon().await;
        }
    }

    /// Grant a lease, put its key behind the others, and start keeping it. Returns the key, the
    /// keeper's state, and the renewal interval of the TTL granted.
    async fn queue(
        &mut self,
        name: &str,
        record: &[u8],
    ) -> Result<(Queued, watch::Receiver<KeeperState>, Duration), Error> {
        let grant = Grant::ask(&self.conn, self.cfg.dial_timeout, self.params).await?;
        let (id, renew_every) = (grant.id, grant.renew_every());
        crate::log::note(None, None, Some(id));
        self.attempt = Attempt::Granted(id);
        let along = self.along.as_deref();
        let queued = mutex::enqueue(&self.conn, &self.cfg, name, id, record, along).await?;
        let own = OwnKey {
            key: queued.key.clone(),
            revision: queued.revision,
        };
        let members = Members::new(&self.cfg, &self.conn);
        let session = Session::keep(grant, members, own);
        let state = session.watch();
        self.attempt = Attempt::Kept(session);
        Ok((queued, state, renew_every))
    }

    /// After our turn came: the key must still be ours and `D` still ahead (etcd 3.4 does not
    /// re-check after a wait). The key was read at `read_at`, by the lock transaction itself when
    /// there was no wait, else by the last look of the wait; `D` is checked now. Starts the
    /// watch on the own key from that revision on. `along` is the value read with the key.
    fn confirm(
        &mut self,
        queued: Queued,
        read_at: i64,
        along: Option<Vec<u8>>,
    ) -> Option<EtcdHeld> {
        let Attempt::Kept(session) = &self.attempt else {
            return None;
        };
        let state = session.now();
        if state.lost.is_some() || BootInstant::now() >= state.stop_at {
            return None;
        }
        let Attempt::Kept(mut session) = std::mem::replace(&mut self.attempt, Attempt::None) else {
            return None;
        };
        let (client, key, revision) = (self.conn.client(), queued.key.clone(), queued.revision);
        session.spawn(move |tx| mutex::watch_own_key(client, key, revision, read_at + 1, tx));
        Some(EtcdHeld {
            conn: self.conn.clone(),
            session,
            queued,
            along: self.along.as_ref().map(|_| along),
            release_within: self.cfg.dial_timeout.min(Duration::from_secs(1)),
            prefix: self.cfg.prefix.clone(),
            record_lease: None,
        })
    }

    /// Undo an attempt: stop keeping its lease and revoke it, which deletes its key.
    pub async fn abandon(&mut self) {
        let within = self.cfg.dial_timeout;
        match std::mem::replace(&mut self.attempt, Attempt::None) {
            Attempt::None => {}
            Attempt::Granted(id) => session::revoke(&self.conn, id, within).await,
            Attempt::Kept(session) => session.revoke(&self.conn, within).await,
        }
    }
}

impl EtcdHeld {
    pub fn token(&self) -> u64 {
        self.queued.revision as u64
    }

    pub fn key(&self) -> &str {
        &self.queued.key
    }

    pub fn lease_id(&self) -> i64 {
        self.session.id()
    }

    /// The value the `along` key had as the lease became ours (none: it was not there); none
    /// when no key was asked for.
    fn along(&self) -> Option<Option<&[u8]>> {
        self.along.as_ref().map(Option::as_deref)
    }

    pub fn deadline(&self) -> BootInstant {
        self.session.now().deadline
    }

    /// Time between the stop signal and SIGKILL for the TTL etcd granted.
    pub fn kill_after(&self) -> Duration {
        let s = self.session.now();
        s.stop_at.until(s.deadline)
    }

    /// The next change of the keeper state: a later `D`, trouble, or the loss. Cancel-safe.
    pub async fn next_change(&mut self) -> KeeperState {
        self.session.changed().await
    }

    /// Revoke the lease at once, so the next waiter starts within milliseconds.
    pub async fn release(self) {
        self.session.revoke(&self.conn, self.release_within).await;
    }
}

impl backend::Lessor for Etcd {
    /// The record is read in the same transactions that take the lease and confirm it ours, so
    /// that its value as the lease became ours costs no request of its own.
    fn read_along(&mut self, name: &str, key: &str) {
        self.along = Some(runs::record_key(&self.cfg.prefix, name, key));
    }

    fn acquire<'a>(
        &'a mut self,
        name: &'a str,
        record: &'a [u8],
        block: bool,
    ) -> Boxed<'a, Result<Held, Error>> {
        Box::pin(async move {
            let held = Etcd::acquire(self, name, record, block).await?;
            Ok(Held::new(
                held.token(),
                held.key().to_owned(),
                Some(held.lease_id()),
                Some(held.deadline()),
                held.kill_after(),
                Box::new(held),
            ))
        })
    }

    fn abandon(&mut self) -> Boxed<'_, ()> {
        Box::pin(Etcd::abandon(self))
    }
}

impl backend::Lease for EtcdHeld {
    fn next_event(&mut self) -> Boxed<'_, LeaseEvent> {
        Box::pin(async move { self.next_change().await.event() })
    }

    fn release(self: Box<Self>) -> Boxed<'static, ()> {
        Box::pin(EtcdHeld::release(*self))
    }

    fn read_record<'a>(
        &'a self,
        name: &'a str,
        key: &'a str,
    ) -> Boxed<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move {
            match self.along() {
                Some(value) => runs::parse(&self.prefix, name, key, value),
                None => runs::read(&self.conn, &self.prefix, name, key).await,
            }
        })
    }

    fn child_started(&mut self, keep: Duration) {
        self.record_lease = Some(runs::RecordLease::ask(&self.conn, keep));
    }

    fn write_record<'a>(
        &'a mut self,
        record: &'a RunRecord,
        keep: Duration,
    ) -> Boxed<'a, Result<Written, Error>> {
        Box::pin(async move {
            let lease = self.record_lease.take().ok_or_else(|| {
                Error::Internal("an etcd run record without a record lease".into())
            })?;
            let lock = (self.queued.key.as_str(), self.token());
            runs::write(&self.conn, &self.prefix, lock, record, lease, keep).await
        })
    }

    fn record_unused(&mut self) {
        if let Some(lease) = self.record_lease.take() {
            lease.drop_unused();
        }
    }
}
