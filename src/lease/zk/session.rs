//! The keeper of a ZooKeeper session's lease: a task that follows `timing::zk::ZkSchedule` one
//! step at a time (Look, wait Δ, Sync, Check, all on the one connection) and publishes each new
//! `D`, trouble and the loss, as etcd's keeper does, through a [`KeeperState`] channel.
//!
//! It starts as soon as the own node exists, so that a waiter's `D` is as fresh as a holder's
//! when its turn comes. Any error, and any change of the session's state (Disconnected, connected
//! again), is a failure: `D` does not move and the triple starts over, since the chain proves
//! something only on one connection. Expired or a refused authentication lose the lease at once,
//! whenever the client says so (never later than `D`).

use tokio::sync::watch;
use tokio::task::JoinHandle;
use zookeeper_client as zkc;

use crate::clock::BootInstant;
use crate::lease::keeper::{lose, trouble, KeeperState};
use crate::lease::timing::zk::{Answer, Step, ZkNext, ZkSchedule};
use crate::lease::timing::{KeySeen, Verdict};
use crate::lease::LossReason;

/// The keeper task (and once held, the own node's watch) and the state they publish.
pub struct Keeper {
    state: watch::Receiver<KeeperState>,
    /// Kept for the own node's watch, which also publishes.
    tx: watch::Sender<KeeperState>,
    tasks: Vec<JoinHandle<()>>,
}

impl Keeper {
    /// Start renewing the lease of the session `zk`, whose own node is `path` with `czxid`.
    pub fn start(zk: zkc::Client, path: String, czxid: i64, schedule: ZkSchedule) -> Self {
        let (tx, state) = watch::channel(KeeperState {
            deadline: schedule.deadline(),
            stop_at: schedule.stop_at(),
            lost: None,
            trouble: None,
        });
        let task = tokio::spawn(run(zk, path, czxid, schedule, tx.clone()));
        Keeper {
            state,
            tx,
            tasks: vec![task],
        }
    }

    /// Watch the own node from now on, so that its deletion or replacement is a loss at once,
    /// not at the next renewal's Look. A member shows a deletion only once it is committed, so
    /// a stale member can delay this, never make it up.
    pub fn watch_own(&mut self, zk: zkc::Client, path: String, czxid: i64) {
        let tx = self.tx.clone();
        self.tasks
            .push(tokio::spawn(watch_own(zk, path, czxid, tx)));
    }

    /// The state as last published.
    pub fn now(&self) -> KeeperState {
        self.state.borrow().clone()
    }

    /// The next change of the state. Cancel-safe.
    pub async fn changed(&mut self) -> KeeperState {
        if self.state.changed().await.is_err() {
            // The task ended without a loss: it cannot, but the stop time still holds.
            std::future::pending::<()>().await;
        }
        self.state.borrow_and_update().clone()
    }

    /// Stop renewing and watching.
    pub fn stop(&self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn watch_own(zk: zkc::Client, path: String, czxid: i64, tx: watch::Sender<KeeperState>) {
    loop {
        match zk.check_and_watch_stat(&path).await {
            Ok((None, _)) => return lose(&tx, LossReason::KeyDeleted(path)),
            Ok((Some(s), _)) if s.czxid != czxid => {
                return lose(&tx, LossReason::KeyReplaced(path))
            }
            Ok((Some(_), watcher)) => {
                if watcher.changed().await.event_type == zkc::EventType::NodeDeleted {
                    return lose(&tx, LossReason::KeyDeleted(path));
                }
            }
            // The keeper judges failures; this only looks again a little later.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
}

async fn run(
    zk: zkc::Client,
    path: String,
    czxid: i64,
    mut schedule: ZkSchedule,
    tx: watch::Sender<KeeperState>,
) {
    let mut states = zk.state_watcher();
    loop {
        let now = BootInstant::now();
        let outcome = match schedule.next(now) {
            ZkNext::Lost => return lose(&tx, LossReason::NotRenewed),
            ZkNext::Send(step) => {
                schedule.sent(step, now);
                let answer = answer_of(&zk, step, &path, czxid, &mut schedule, &tx);
                unless_changed(&mut states, answer).await
            }
            ZkNext::SleepUntil(t) | ZkNext::AwaitUntil(t) => {
                unless_changed(&mut states, async move {
                    sleep_until(t).await;
                    Verdict::Ignored
                })
                .await
            }
        };
        let verdict = outcome.unwrap_or_else(|state| changed(&mut schedule, &tx, state));
        if publish(&tx, &schedule, verdict, &path) {
            return;
        }
    }
}

/// `work`'s verdict, unless the session's state changes first: then that state.
async fn unless_changed(
    states: &mut zkc::StateWatcher,
    work: impl std::future::Future<Output = Verdict>,
) -> Result<Verdict, zkc::SessionState> {
    tokio::select! {
        verdict = work => Ok(verdict),
        state = states.changed() => Err(state),
    }
}

/// The three steps prove something only on one connection: a change of the session's state
/// (Disconnected, then connected again, maybe to another member) breaks the chain, and the
/// renewal starts over; a terminal state loses the lease.
fn changed(
    schedule: &mut ZkSchedule,
    tx: &watch::Sender<KeeperState>,
    state: zkc::SessionState,
) -> Verdict {
    if let Some(why) = session_lost(state) {
        return Verdict::Lost(why);
    }
    schedule.failed(BootInstant::now());
    trouble(
        tx,
        &format!("the connection to ZooKeeper changed ({state:?})"),
    );
    Verdict::Failed
}

/// Send `step` (marked sent already) and judge its answer, by the stop time at the latest.
async fn answer_of(
    zk: &zkc::Client,
    step: Step,
    path: &str,
    czxid: i64,
    schedule: &mut ZkSchedule,
    tx: &watch::Sender<KeeperState>,
) -> Verdict {
    let answer =
        tokio::time::timeout_at(instant(schedule.stop_at()), send(zk, step, path, czxid)).await;
    let at = BootInstant::now();
    match answer {
        Ok(Ok(answer)) => schedule.answered(at, answer),
        Ok(Err(why)) => {
            schedule.failed(at);
            trouble(tx, &format!("{step:?}: {why}"));
            Verdict::Failed
        }
        Err(_) => Verdict::Lost(LossReason::NotRenewed),
    }
}

/// Send one step and read what it says; an error that is not the session's end is a failure.
async fn send(zk: &zkc::Client, step: Step, path: &str, czxid: i64) -> Result<Answer, String> {
    let result = match step {
        Step::Look => zk.check_stat(path).await.map(|stat| match stat {
            Some(s) if s.czxid == czxid => Answer::Ok,
            Some(_) => Answer::Replaced,
            None => Answer::NodeGone,
        }),
        Step::Sync => zk.sync(path).await.map(|()| Answer::Ok),
        Step::Check => {
            let mut multi = zk.new_multi_writer();
            multi
                .add_check_version(path, -1)
                .map_err(|e| e.to_string())?;
            match multi.commit().await {
                Ok(_) => Ok(Answer::Ok),
                Err(zkc::MultiWriteError::OperationFailed {
                    source: zkc::Error::NoNode,
                    ..
                }) => Ok(Answer::NodeGone),
                Err(e) => Err(e.into()),
            }
        }
    };
    match result {
        Ok(answer) => Ok(answer),
        Err(zkc::Error::SessionExpired) => Ok(Answer::Expired),
        Err(e) => Err(e.to_string()),
    }
}

/// Publish what `verdict` says; true when the lease is lost (the keeper ends).
fn publish(
    tx: &watch::Sender<KeeperState>,
    schedule: &ZkSchedule,
    verdict: Verdict,
    path: &str,
) -> bool {
    match verdict {
        Verdict::Extended(d) => {
            tx.send_modify(|s| {
                s.deadline = d;
                s.stop_at = schedule.stop_at();
                s.trouble = None;
            });
            false
        }
        Verdict::Lost(why) => {
            lose(tx, why);
            true
        }
        Verdict::KeyLost(KeySeen::Gone) => {
            lose(tx, LossReason::KeyGone(path.to_owned()));
            true
        }
        Verdict::KeyLost(KeySeen::Replaced) => {
            lose(tx, LossReason::KeyReplaced(path.to_owned()));
            true
        }
        _ => false,
    }
}

/// Why the session state means the lease is gone, if it does.
fn session_lost(state: zkc::SessionState) -> Option<LossReason> {
    match state {
        zkc::SessionState::Expired | zkc::SessionState::Closed => Some(LossReason::SessionExpired),
        zkc::SessionState::AuthFailed => Some(LossReason::SessionExpired),
        _ => None,
    }
}

/// The tokio instant of a CLOCK_BOOTTIME instant, measured from now.
fn instant(t: BootInstant) -> tokio::time::Instant {
    tokio::time::Instant::now() + BootInstant::now().until(t)
}

async fn sleep_until(t: BootInstant) {
    tokio::time::sleep_until(instant(t)).await;
}
