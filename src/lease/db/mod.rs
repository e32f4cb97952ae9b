//! The database backend (`--database URL`), behind [`crate::lease::backend`]:
//!
//! - [`postgres`]: one connection to PostgreSQL and the lease's statements on it;
//! - [`mariadb`]: the same on MariaDB;
//! - [`runs`]: the run records of `--once`, in the same database;
//! - [`status`]: `leasewrap status` on the lease's row.
//!
//! This file ties them into taking and holding a lease by the rule of `timing::db`
//! (docs/database.md): a waiter watches the row's version and takes it over only once it has
//! not moved for `L` since a read's answer arrived; the holder renews by the token, and counts
//! `D` from each renewal's send. Every change is one statement through a function the installer
//! made; nothing here reads a clock of the server's. Nothing here touches a process.

pub mod mariadb;
pub mod postgres;
pub mod runs;
pub mod status;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::backend::{self, Boxed};
use super::keeper::{extend, lose, trouble, KeeperState};
use super::timing::db::{DbSchedule, Renewal, RowSeen, Watch, WatchNext};
use super::timing::{KeySeen, Next, Params, Verdict};
use super::{Held, LeaseEvent, LossReason};
use crate::clock::BootInstant;
use crate::config::database::{DbConfig, Server};
use crate::error::Error;
use crate::runs::{RunRecord, Written};

/// The version of the installed SQL (`leasewrap fence-sql postgres`) this leasewrap needs.
pub const SQL_VERSION: i32 = 5;

/// The version of the installed SQL (`leasewrap fence-sql mariadb`) this leasewrap needs.
pub const SQL_VERSION_MARIADB: i32 = 3;

/// How long giving the lease back may take before it is left for a waiter to take over.
const RELEASE_WITHIN: Duration = Duration::from_secs(1);

/// A future of a connection's, boxed and `Send`, so that the keeper can run as a task.
pub type SendBoxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The lease's row, as a read found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowState {
    pub version: u64,
    pub token: u64,
    pub held: bool,
    /// The holder's `L`, as its take recorded it.
    pub ttl: Duration,
    /// Who holds it (JSON), as its take recorded it.
    pub holder: String,
}

impl RowState {
    fn seen(&self) -> RowSeen {
        RowSeen {
            version: self.version,
            held: self.held,
            ttl: self.ttl,
        }
    }
}

/// The lease's statements on one connection, each one call of an installed function.
pub trait Statements: Send {
    fn read<'a>(&'a mut self, name: &'a str) -> SendBoxed<'a, Result<RowState, Error>>;
    /// The compare-and-set on `seen`: the new token, none when the version moved.
    fn take<'a>(
        &'a mut self,
        name: &'a str,
        seen: u64,
        ttl: Duration,
        holder: &'a str,
    ) -> SendBoxed<'a, Result<Option<u64>, Error>>;
    fn renew<'a>(&'a mut self, name: &'a str, token: u64) -> SendBoxed<'a, Result<Renewal, Error>>;
    fn release<'a>(&'a mut self, name: &'a str, token: u64) -> SendBoxed<'a, Result<(), Error>>;
    /// A waiter's pause of `nap` at most: over early when the server hints that NAME was
    /// released since a read found it at version `seen`.
    fn pause<'a>(
        &'a mut self,
        name: &'a str,
        seen: u64,
        nap: Duration,
    ) -> SendBoxed<'a, Result<(), Error>>;
    /// Ask the server, over a connection of its own, to cancel the statement in flight here.
    fn cancel(&self) -> SendBoxed<'static, ()>;
    /// The run record of (NAME, KEY) as stored (JSON), none before its first run.
    fn run_read<'a>(
        &'a mut self,
        name: &'a str,
        key: &'a str,
    ) -> SendBoxed<'a, Result<Option<String>, Error>>;
    /// Store (none: delete) the record of (NAME, KEY) while NAME is held under `token`; false,
    /// and nothing changed, for a stale holder.
    fn run_write<'a>(
        &'a mut self,
        name: &'a str,
        token: u64,
        key: &'a str,
        record: Option<&'a str>,
    ) -> SendBoxed<'a, Result<bool, Error>>;
    /// The names (at most 1000) with a row or a record that this role or user may use.
    fn names(&mut self) -> SendBoxed<'_, Result<Vec<String>, Error>>;
    /// At most `max` records of NAME (KEY and JSON), the last keys first or the first.
    fn runs<'a>(
        &'a mut self,
        name: &'a str,
        max: usize,
        oldest_first: bool,
    ) -> SendBoxed<'a, Result<Vec<(String, String)>, Error>>;
}

/// One connection's statements, whichever server it is.
pub type Conn = Box<dyn Statements>;

/// A connection to the database `cfg` names, its installed SQL's version checked.
pub async fn connect(cfg: &DbConfig) -> Result<Conn, Error> {
    Ok(match cfg.server {
        Server::Postgres => Box::new(postgres::connect(cfg).await?),
        Server::Mariadb => Box::new(mariadb::connect(cfg).await?),
    })
}

/// Where `cfg` points, for messages.
pub fn place(cfg: &DbConfig) -> String {
    match cfg.server {
        Server::Postgres => postgres::place(cfg),
        Server::Mariadb => mariadb::place(cfg),
    }
}

/// The database, prepared for a run: connected, the installed SQL checked.
pub struct Db {
    cfg: DbConfig,
    params: Params,
    conn: Option<Conn>,
    /// Why the last read or take failed, while a waiter rides out a database that does not
    /// answer: a wait that runs out then is 69, not 75.
    unavailable: Option<String>,
    /// The cancel of the take in flight, for a wait abandoned meanwhile.
    cancel: Option<SendBoxed<'static, ()>>,
}

impl Db {
    /// Connect now, so that a bad URL, password or a missing SQL fails before any wait.
    pub async fn connect(cfg: &DbConfig, params: Params) -> Result<Self, Error> {
        super::timing::db::timing(&params).map_err(|e| Error::Usage(e.to_string()))?;
        let conn = connect(cfg).await?;
        Ok(Db {
            cfg: cfg.clone(),
            params,
            conn: Some(conn),
            unavailable: None,
            cancel: None,
        })
    }

    /// How often a waiter reads the row when no wake-up comes: at most every 500 ms, and ten
    /// times per `L`.
    fn poll_every(&self) -> Duration {
        (self.params.ttl / 10).min(Duration::from_millis(500))
    }

    /// Take the lease: a free row at once, a held one once the rule allows a takeover. Without
    /// a wait (`-n`), a held row is busy as soon as a renewal shows its holder alive; a holder
    /// that renews nothing for `L` is taken over, as by a waiter.
    async fn acquire(&mut self, name: &str, record: &str, block: bool) -> Result<DbHeld, Error> {
        let mut watch = Watch::new();
        let (mut first, mut told, mut version) = (None, false, 0);
        loop {
            if let Some(seen) = watch.may_take(BootInstant::now()) {
                match self.take(name, seen, record).await {
                    Ok(Some(held)) => return Ok(held),
                    Ok(None) => self.unavailable = None,
                    // A take not answered in time may still commit: read the row again.
                    Err(Error::Unavailable(why)) if block => {
                        tracing::debug!(error = %why, "taking the lease failed; reading it again");
                        self.unavailable = Some(why);
                    }
                    Err(e) => return Err(e),
                }
                watch.forget();
                continue;
            }
            if let WatchNext::TakeOverAt(at) = watch.next() {
                if block && !std::mem::replace(&mut told, true) {
                    tracing::info!(name = %name, "waiting for the lease");
                }
                self.wait(name, version, at).await;
            }
            let Some(row) = self.read(name, &mut watch, block).await? else {
                continue;
            };
            version = row.version;
            if !block && row.held && *first.get_or_insert(row.version) != row.version {
                return Err(Error::Busy { name: name.into() });
            }
        }
    }

    /// One read of the row into `watch`; a waiter rides out a failed one, or a connection that
    /// cannot be opened again (none then).
    async fn read(
        &mut self,
        name: &str,
        watch: &mut Watch,
        block: bool,
    ) -> Result<Option<RowState>, Error> {
        let sent = BootInstant::now();
        let answer = match self.open().await {
            Ok(mut conn) => {
                let answer = bounded(&self.cfg, self.cfg.dial_timeout, conn.read(name)).await;
                self.conn = answer.is_ok().then_some(conn);
                answer
            }
            Err(e) => Err(e),
        };
        match answer {
            Ok(row) => {
                // A free row stays unavailable while no take of it is answered (another
                // session's lock on the row): a wait that runs out then is 69, not 75.
                if row.held {
                    self.unavailable = None;
                }
                watch.read(sent, BootInstant::now(), row.seen());
                Ok(Some(row))
            }
            Err(Error::Unavailable(why)) if block => {
                tracing::debug!(error = %why, "reading the lease's row failed; retrying");
                self.unavailable = Some(why);
                tokio::time::sleep(self.poll_every()).await;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Sleep until `at`, the next poll, or a wake-up, whichever comes first. A pause that
    /// fails drops the connection: the next read opens another.
    async fn wait(&mut self, name: &str, seen: u64, at: BootInstant) {
        let nap = BootInstant::now().until(at).min(self.poll_every());
        let Some(mut conn) = self.conn.take() else {
            return tokio::time::sleep(nap).await;
        };
        let within = nap + self.cfg.dial_timeout;
        match bounded(&self.cfg, within, conn.pause(name, seen, nap)).await {
            Ok(()) => self.conn = Some(conn),
            Err(e) => tracing::debug!(error = %e, "waiting for a release failed"),
        }
    }

    /// The compare-and-set on `seen`; on success the lease is ours from the take's send.
    async fn take(&mut self, name: &str, seen: u64, record: &str) -> Result<Option<DbHeld>, Error> {
        let mut conn = self.open().await?;
        let t_send = BootInstant::now();
        let token = match self.take_within(&mut conn, name, seen, record).await? {
            Some(token) => token,
            None => {
                self.conn = Some(conn);
                return Ok(None);
            }
        };
        let schedule =
            DbSchedule::taken(&self.params, t_send).map_err(|e| Error::Usage(e.to_string()))?;
        let own = Own {
            name: name.to_owned(),
            token,
            record: record.to_owned(),
        };
        let keeper = Keeper::start(self.cfg.clone(), own, schedule, Some(conn));
        if BootInstant::now() >= keeper.now().stop_at {
            // The take came back too late to run anything: give it back and watch again.
            DbHeld::give_back(&self.cfg, keeper, name, token).await;
            return Ok(None);
        }
        Ok(Some(DbHeld {
            cfg: self.cfg.clone(),
            name: name.to_owned(),
            token,
            keeper,
            records: tokio::sync::Mutex::new(None),
        }))
    }

    /// The take's statement, bounded by L/3. One not answered in time, or whose wait is
    /// abandoned meanwhile, is cancelled: queued behind another session's lock on the row, it
    /// would commit once the lock goes, holding the row for no one for `L`. After a cancel its
    /// own answer, within the dial timeout, says whether it committed first (the row is then
    /// ours, from its send) or was cancelled.
    async fn take_within(
        &mut self,
        conn: &mut Conn,
        name: &str,
        seen: u64,
        record: &str,
    ) -> Result<Option<u64>, Error> {
        let (ttl, bound) = (self.params.ttl, self.params.ttl / 3);
        self.cancel = Some(conn.cancel());
        let mut taking = conn.take(name, seen, ttl, record);
        let answer = tokio::time::timeout(bound, &mut taking).await;
        let cancel = self.cancel.take();
        if let Ok(answer) = answer {
            return answer;
        }
        // Unavailable from now on, even if a wait that runs out drops this before the answer.
        self.unavailable = Some(no_answer(&self.cfg, bound).to_string());
        let late = async move {
            if let Some(cancel) = cancel {
                cancel.await;
            }
            taking.await
        };
        match tokio::time::timeout(self.cfg.dial_timeout, late).await {
            Ok(Ok(taken)) => Ok(taken),
            _ => Err(no_answer(&self.cfg, bound)),
        }
    }

    /// The connection, opened again if a failure dropped it.
    async fn open(&mut self) -> Result<Conn, Error> {
        match self.conn.take() {
            Some(c) => Ok(c),
            None => connect(&self.cfg).await,
        }
    }
}

/// A statement's answer, or 69 if none came `within`.
async fn bounded<T>(
    cfg: &DbConfig,
    within: Duration,
    answer: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(within, answer).await {
        Ok(answer) => answer,
        Err(_) => Err(no_answer(cfg, within)),
    }
}

/// A statement not answered `within`: 69.
fn no_answer(cfg: &DbConfig, within: Duration) -> Error {
    Error::Unavailable(format!(
        "{}: no answer within {} ms",
        place(cfg),
        within.as_millis()
    ))
}

/// Sends `cancel`, if there is one, for at most the dial timeout.
async fn cancel_within(cfg: &DbConfig, cancel: Option<SendBoxed<'static, ()>>) {
    if let Some(cancel) = cancel {
        if tokio::time::timeout(cfg.dial_timeout, cancel)
            .await
            .is_err()
        {
            tracing::debug!("cancelling the take got no answer in time");
        }
    }
}

/// A failure of the connection itself, not an answer of the server's: TLS refused is 77,
/// anything else (no answer, a server that is not the one the scheme names) 69. `at` says which
/// server it was meant to be.
fn not_answered(at: &str, e: &(dyn std::error::Error + 'static)) -> Error {
    use crate::lease::etcd::client::{causes, is_tls};
    let text: Vec<String> = causes(e).map(ToString::to_string).collect();
    if causes(e).any(is_tls) {
        return Error::Auth(format!("{at}: TLS refused: {}", text.join(": ")));
    }
    let server = at.split(" at ").next().unwrap_or(at);
    Error::Unavailable(format!(
        "{at}: {} (is it {server}, and does it listen there?)",
        text.join(": ")
    ))
}

impl backend::Lessor for Db {
    fn acquire<'a>(
        &'a mut self,
        name: &'a str,
        record: &'a [u8],
        block: bool,
    ) -> Boxed<'a, Result<Held, Error>> {
        Box::pin(async move {
            let record = String::from_utf8_lossy(record).into_owned();
            let held = Db::acquire(self, name, &record, block).await?;
            let state = held.keeper.now();
            Ok(Held::new(
                held.token,
                held.name.clone(),
                None,
                Some(state.deadline),
                state.stop_at.until(state.deadline),
                Box::new(held),
            ))
        })
    }

    fn abandon(&mut self) -> Boxed<'_, ()> {
        Box::pin(async move { cancel_within(&self.cfg, self.cancel.take()).await })
    }

    fn unavailable(&self) -> Option<Error> {
        self.unavailable.clone().map(Error::Unavailable)
    }
}

/// A lease that is ours: its name, token and keeper, and the connection of its run records
/// (the keeper's carries the renewals alone), opened at the first record read or written.
struct DbHeld {
    cfg: DbConfig,
    name: String,
    token: u64,
    keeper: Keeper,
    records: tokio::sync::Mutex<Option<Conn>>,
}

impl DbHeld {
    /// Stop renewing and set the row free, so that the next waiter starts within milliseconds.
    async fn give_back(cfg: &DbConfig, keeper: Keeper, name: &str, token: u64) {
        let lost = keeper.now().lost;
        let conn = keeper.stop().await;
        if let Some(LossReason::KeyReplaced(_) | LossReason::KeyGone(_)) = lost {
            // Another run's now, or free: nothing of ours to set free, and a run that holds it
            // under our token (`Renewer::renew`) must keep it.
            return;
        }
        let release = async move {
            let mut conn = match conn {
                Some(c) => c,
                None => connect(cfg).await?,
            };
            conn.release(name, token).await
        };
        match tokio::time::timeout(RELEASE_WITHIN, release).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "releasing the lease failed: a waiter takes it over after its TTL")
            }
            Err(_) => tracing::warn!(
                "releasing the lease took too long: a waiter takes it over after its TTL"
            ),
        }
    }
}

impl backend::Lease for DbHeld {
    fn next_event(&mut self) -> Boxed<'_, LeaseEvent> {
        Box::pin(async move { self.keeper.changed().await.event() })
    }

    fn release(self: Box<Self>) -> Boxed<'static, ()> {
        let DbHeld {
            cfg,
            name,
            token,
            keeper,
            ..
        } = *self;
        Box::pin(async move { DbHeld::give_back(&cfg, keeper, &name, token).await })
    }

    fn read_record<'a>(
        &'a self,
        name: &'a str,
        key: &'a str,
    ) -> Boxed<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move {
            let mut conn = self.records.lock().await;
            let conn = match &mut *conn {
                Some(c) => c,
                slot => slot.insert(connect(&self.cfg).await?),
            };
            runs::read(conn.as_mut(), name, key).await
        })
    }

    fn write_record<'a>(
        &'a mut self,
        record: &'a RunRecord,
        _keep: Duration,
    ) -> Boxed<'a, Result<Written, Error>> {
        Box::pin(async move {
            let conn = match self.records.get_mut() {
                Some(c) => c,
                slot => slot.insert(connect(&self.cfg).await?),
            };
            runs::write(conn.as_mut(), self.token, record).await
        })
    }
}

/// The keeper task of a held lease: renews by the schedule and publishes `D`, trouble and the
/// loss. Stopped, it hands back its connection for the release.
struct Keeper {
    state: watch::Receiver<KeeperState>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Option<Conn>>,
}

impl Keeper {
    fn start(cfg: DbConfig, own: Own, schedule: DbSchedule, conn: Option<Conn>) -> Self {
        let (tx, state) = watch::channel(KeeperState {
            deadline: schedule.deadline(),
            stop_at: schedule.stop_at(),
            lost: None,
            trouble: None,
        });
        let (stop, stopped) = oneshot::channel();
        let renewer = Renewer {
            cfg,
            own,
            schedule,
            conn,
            tx,
        };
        let task = tokio::spawn(renewer.run(stopped));
        Keeper {
            state,
            stop: Some(stop),
            task,
        }
    }

    fn now(&self) -> KeeperState {
        self.state.borrow().clone()
    }

    /// The next change of the state (cancel-safe).
    async fn changed(&mut self) -> KeeperState {
        let _ = self.state.changed().await;
        self.now()
    }

    /// Stop renewing; the connection back, if it is still open.
    async fn stop(mut self) -> Option<Conn> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.ok().flatten()
    }
}

/// What the holder took: NAME, its token, and the holder record its take wrote in the row.
struct Own {
    name: String,
    token: u64,
    record: String,
}

/// The renewing side of [`Keeper`].
struct Renewer {
    cfg: DbConfig,
    own: Own,
    schedule: DbSchedule,
    conn: Option<Conn>,
    tx: watch::Sender<KeeperState>,
}

impl Renewer {
    async fn run(mut self, mut stopped: oneshot::Receiver<()>) -> Option<Conn> {
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                go_on = self.step() => if !go_on { break },
            }
        }
        self.conn
    }

    /// One step of the schedule: false once the lease is lost.
    async fn step(&mut self) -> bool {
        let now = BootInstant::now();
        match self.schedule.next(now) {
            Next::Lost => {
                lose(&self.tx, LossReason::NotRenewed);
                false
            }
            Next::SleepUntil(t) => {
                tokio::time::sleep(now.until(t)).await;
                true
            }
            _ => self.renew().await,
        }
    }

    /// One renewal, bounded by its due time; a failure drops the connection. On a new connection
    /// the row is read first: a run that holds it under our token, with another holder record,
    /// means the row was brought back (a promoted asynchronous replica or a restore lost our
    /// take, and a take since counted to our token again). The renewal's compare-and-set on the
    /// token alone would renew that run's row for us: the lease is lost instead.
    async fn renew(&mut self) -> bool {
        let due = |s: &DbSchedule, t: BootInstant| match s.next(t) {
            Next::AwaitReplyUntil(d) => d,
            _ => t,
        };
        let (cfg, own) = (&self.cfg, &self.own);
        let schedule = &mut self.schedule;
        let mut conn = self.conn.take();
        let within = BootInstant::now().until(schedule.stop_at());
        let attempt = async {
            let c = match conn.as_mut() {
                Some(c) => c,
                None => {
                    let c = conn.insert(connect(cfg).await?);
                    let row = c.read(&own.name).await?;
                    if row.held && row.token == own.token && row.holder != own.record {
                        return Ok(None);
                    }
                    c
                }
            };
            let t_send = BootInstant::now();
            schedule.sent(t_send);
            let left = t_send.until(due(schedule, t_send));
            bounded(cfg, left, c.renew(&own.name, own.token))
                .await
                .map(Some)
        };
        let answer = tokio::time::timeout(within, attempt).await;
        let answer = answer.unwrap_or_else(|_| Err(Error::Unavailable("no connection".into())));
        // No renewal: the row was brought back.
        let Some(answer) = answer.transpose() else {
            let why = format!(
                "the row of {:?} (held by another run under our token {}: the row was brought back)",
                own.name, own.token
            );
            lose(&self.tx, LossReason::KeyReplaced(why));
            return false;
        };
        self.judge(answer, conn)
    }

    /// What a renewal's answer does to the lease.
    fn judge(&mut self, answer: Result<Renewal, Error>, conn: Option<Conn>) -> bool {
        let now = BootInstant::now();
        let renewal = match answer {
            Ok(r) => r,
            Err(e) => {
                self.schedule.failed(now);
                trouble(&self.tx, &format!("renewing the lease failed: {e}"));
                return true;
            }
        };
        self.conn = conn;
        match self.schedule.answered(now, renewal) {
            Verdict::Extended(d) => {
                extend(&self.tx, d, self.schedule.stop_at());
                true
            }
            Verdict::KeyLost(seen) => {
                lose(&self.tx, loss(&self.own.name, seen));
                false
            }
            Verdict::Lost(why) => {
                lose(&self.tx, why);
                false
            }
            _ => {
                trouble(&self.tx, "a renewal was answered too late");
                true
            }
        }
    }
}

/// Why the row is no longer ours.
fn loss(name: &str, seen: KeySeen) -> LossReason {
    match seen {
        KeySeen::Replaced => LossReason::KeyReplaced(format!("the row of {name:?} (taken over)")),
        _ => LossReason::KeyGone(format!("the row of {name:?} (set free)")),
    }
}
