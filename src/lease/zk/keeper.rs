//! The keeper of a ZooKeeper session's lease: a task that follows `timing::zk::ZkSchedule` one
//! step at a time (Look, wait Δ, Sync, Check, all on one connection) and publishes each new `D`,
//! trouble and the loss, as etcd's keeper does, through a [`KeeperState`] channel.
//!
//! It starts as soon as the own node exists, so that a waiter's `D` is as fresh as a holder's
//! when its turn comes. Any error, any step answered on another connection than the Look, and
//! any change of the session's state (Disconnected, moved to another member) is a failure: `D`
//! does not move and the triple starts over, since the chain proves something only on one
//! connection. Every connection since the one the schedule was counted from that negotiated a
//! shorter timeout brings `D` down, from the session's own record of them: those made before the
//! keeper started too, and however many the state channel folded into one. A step that waits
//! past the time a fresh renewal needs (a follower cut off from its leader never answers a Sync)
//! drops its connection, so the renewal starts over on the next member. Expired, closed or
//! refused credentials lose the lease, whenever the session says so (never later than `D`).

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::lock::Own;
use super::session::{State, Watched, Zk, ZkError};
use super::wire::{Code, MultiOp};
use crate::clock::BootInstant;
use crate::lease::keeper::{extend, lose, trouble, KeeperState};
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
    /// Start renewing the lease of the session `zk`, whose own node is `own`, by `schedule`,
    /// which counted with connection `counted_from`: the later connections that negotiated a
    /// shorter timeout are applied first.
    pub fn start(zk: Zk, own: Own, mut schedule: ZkSchedule, counted_from: u32) -> Self {
        // Subscribed before the record is read: a move after the read changes the state.
        let states = zk.states();
        let epoch = connected_epoch(&zk.state());
        let mut counted_to = counted_from;
        let lost = shorten(&zk, &mut schedule, &mut counted_to);
        let (tx, state) = watch::channel(KeeperState {
            deadline: schedule.deadline(),
            stop_at: schedule.stop_at(),
            lost,
            trouble: None,
        });
        let renewer = Renewer {
            states,
            epoch,
            zk,
            own,
            schedule,
            tx: tx.clone(),
            look_epoch: None,
            counted_to,
        };
        let task = tokio::spawn(renewer.run());
        Keeper {
            state,
            tx,
            tasks: vec![task],
        }
    }

    /// Watch the own node from now on, so that its deletion or replacement is a loss at once,
    /// not at the next renewal's Look. A member shows a deletion only once it is committed, so
    /// a stale member can delay this, never make it up.
    pub fn watch_own(&mut self, zk: Zk, own: Own) {
        let tx = self.tx.clone();
        self.tasks.push(tokio::spawn(watch_own(zk, own, tx)));
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

async fn watch_own(zk: Zk, own: Own, tx: watch::Sender<KeeperState>) {
    let path = own.path;
    loop {
        let (stat, watch) = zk.exists(&path, true);
        match stat.await {
            Ok((None, _)) => return lose(&tx, LossReason::KeyDeleted(path)),
            Ok((Some(s), _)) if s.czxid != own.czxid => {
                return lose(&tx, LossReason::KeyReplaced(path))
            }
            Ok((Some(_), _)) => {
                let watch = watch.expect("a watch was asked for");
                if watch.changed().await == Watched::Event(super::wire::NODE_DELETED) {
                    return lose(&tx, LossReason::KeyDeleted(path));
                }
            }
            // The keeper judges failures; this only looks again a little later.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
}

/// Apply to `schedule` the connections of `zk` after `counted_to` that negotiated a shorter
/// timeout: `D` comes down to each one's bound. The loss, when the rule no longer holds.
fn shorten(zk: &Zk, schedule: &mut ZkSchedule, counted_to: &mut u32) -> Option<LossReason> {
    for c in zk.shorter_after(*counted_to) {
        *counted_to = c.epoch;
        if let Err(why) = schedule.reconnected(c.sent, c.timeout) {
            return Some(why);
        }
    }
    None
}

/// The number of the connection a state says the session is on.
fn connected_epoch(state: &State) -> u32 {
    match state {
        State::Connected(c) => c.epoch,
        _ => 0,
    }
}

/// The renewal task's state.
struct Renewer {
    zk: Zk,
    own: Own,
    schedule: ZkSchedule,
    tx: watch::Sender<KeeperState>,
    states: watch::Receiver<State>,
    /// The connection the session is on, as last seen.
    epoch: u32,
    /// The connection that answered this renewal's Look.
    look_epoch: Option<u32>,
    /// The last connection whose timeout the schedule has counted with.
    counted_to: u32,
}

impl Renewer {
    async fn run(mut self) {
        if self.tx.borrow().lost.is_some() {
            return;
        }
        loop {
            let now = BootInstant::now();
            let outcome = match self.schedule.next(now) {
                ZkNext::Lost => return lose(&self.tx, LossReason::NotRenewed),
                ZkNext::Send(step) => {
                    self.schedule.sent(step, now);
                    let give_up = self.schedule.give_up_at(now);
                    let answer = send(&self.zk, step, &self.own);
                    unless_changed(&mut self.states, bounded(give_up, answer)).await
                }
                ZkNext::SleepUntil(t) | ZkNext::AwaitUntil(t) => {
                    unless_changed(&mut self.states, async move {
                        sleep_until(t).await;
                        None
                    })
                    .await
                }
            };
            let verdict = match outcome {
                Ok(None) => Verdict::Ignored,
                Ok(Some(answered)) => self.judge(answered),
                Err(state) => self.changed(state),
            };
            if publish(&self.tx, &self.schedule, verdict, &self.own.path) {
                return;
            }
        }
    }

    /// The verdict on a step's answer: a step answered on another connection than its Look
    /// breaks the chain.
    fn judge(&mut self, answered: Answered) -> Verdict {
        let at = BootInstant::now();
        match answered {
            Answered::Late if at >= self.schedule.stop_at() => {
                Verdict::Lost(LossReason::NotRenewed)
            }
            Answered::Late => {
                self.zk.drop_connection(self.epoch);
                self.schedule.failed(at);
                trouble(
                    &self.tx,
                    "a renewal's step was not answered in time: trying the next member (with one, the same again)",
                );
                Verdict::Failed
            }
            Answered::Failed(why) => {
                self.schedule.failed(at);
                trouble(&self.tx, &why);
                Verdict::Failed
            }
            Answered::On(_, Said::Is(Answer::Expired), _) => {
                self.schedule.answered(at, Answer::Expired)
            }
            Answered::On(step, answer, epoch) => self.on(at, step, answer, epoch),
        }
    }

    /// A step answered on connection `epoch` at `at`: it counts only on its Look's connection.
    fn on(&mut self, at: BootInstant, step: Step, answer: Said, epoch: u32) -> Verdict {
        if step == Step::Look {
            self.look_epoch = Some(epoch);
        }
        if self.look_epoch != Some(epoch) || epoch != self.epoch {
            self.schedule.failed(at);
            trouble(
                &self.tx,
                "a renewal's steps were answered on two connections",
            );
            return Verdict::Failed;
        }
        let (answer, op) = match answer {
            Said::Is(answer) => (answer, None),
            Said::Checked(op) => (self.schedule.check_answer(op), Some(op)),
        };
        let verdict = self.schedule.answered(at, answer);
        if let (Verdict::Failed, Some(op)) = (&verdict, op) {
            let said = op.map_or("no result".into(), |r| match r {
                Ok(()) => "ok".into(),
                Err(code) => Code(code).to_string(),
            });
            trouble(&self.tx, &format!("the renewal's Check failed: {said}"));
        }
        verdict
    }

    /// The three steps prove something only on one connection: a change of the session's
    /// state breaks the chain, and the renewal starts over. A move to a member that negotiated a
    /// shorter timeout brings `D` down (or loses the lease); an ended session loses it.
    fn changed(&mut self, state: State) -> Verdict {
        if let State::Connected(c) = &state {
            self.epoch = c.epoch;
        }
        // Every connection made since the last look, not only the one the state shows now.
        let shorter = shorten(&self.zk, &mut self.schedule, &mut self.counted_to);
        let lost = match &state {
            State::Expired | State::Closed | State::AuthFailed(_) => {
                Some(LossReason::SessionExpired)
            }
            State::Connected(_) | State::Disconnected => shorter,
        };
        self.look_epoch = None;
        // A shorter timeout brought D down: the watchdog must have it now, loss or not.
        let (d, stop_at) = (self.schedule.deadline(), self.schedule.stop_at());
        self.tx.send_if_modified(|s| {
            let lower = d < s.deadline;
            s.deadline = s.deadline.min(d);
            s.stop_at = s.stop_at.min(stop_at);
            lower
        });
        if let Some(why) = lost {
            return Verdict::Lost(why);
        }
        match state {
            State::Connected(_) => self.schedule.restart(BootInstant::now()),
            _ => self.schedule.failed(BootInstant::now()),
        }
        let text = match state {
            State::Connected(c) => format!(
                "the ZooKeeper session moved to {} (timeout {} ms)",
                c.member,
                c.timeout.as_millis()
            ),
            _ => "the connection to ZooKeeper was lost".into(),
        };
        trouble(&self.tx, &text);
        Verdict::Failed
    }
}

/// A step's outcome.
enum Answered {
    /// Answered on connection number `u32`.
    On(Step, Said, u32),
    Failed(String),
    /// No answer by the time it is given up.
    Late,
}

/// What a step's answer said.
enum Said {
    Is(Answer),
    /// A Check's one op's result, which the schedule reads.
    Checked(Option<Result<(), i32>>),
}

/// `answer`, unless the stop time comes first.
async fn bounded(
    stop_at: BootInstant,
    answer: impl std::future::Future<Output = Answered>,
) -> Option<Answered> {
    Some(
        tokio::time::timeout_at(instant(stop_at), answer)
            .await
            .unwrap_or(Answered::Late),
    )
}

/// `work`'s output, unless the session's state changes first: then that state.
async fn unless_changed<T>(
    states: &mut watch::Receiver<State>,
    work: impl std::future::Future<Output = T>,
) -> Result<T, State> {
    tokio::select! {
        out = work => Ok(out),
        changed = states.changed() => match changed {
            Ok(()) => Err(states.borrow_and_update().clone()),
            Err(_) => Err(State::Closed),
        },
    }
}

/// Send one step (marked sent already) and read what it says.
async fn send(zk: &Zk, step: Step, own: &Own) -> Answered {
    let result = match step {
        Step::Look => {
            let (stat, _) = zk.exists(&own.path, false);
            stat.await.map(|(stat, epoch)| match stat {
                Some(s) if s.czxid == own.czxid => (Said::Is(Answer::Ok), epoch),
                Some(_) => (Said::Is(Answer::Replaced), epoch),
                None => (Said::Is(Answer::NodeGone), epoch),
            })
        }
        Step::Sync => zk
            .sync(&own.path)
            .await
            .map(|epoch| (Said::Is(Answer::Ok), epoch)),
        Step::Check => {
            zk.multi(vec![MultiOp::Check(own.path.clone())])
                .await
                .map(|(results, epoch)| {
                    let op = results.first().map(|r| r.map_err(|c| c.0));
                    (Said::Checked(op), epoch)
                })
        }
    };
    match result {
        Ok((said, epoch)) => Answered::On(step, said, epoch),
        Err(ZkError::Ended(State::Expired)) => Answered::On(step, Said::Is(Answer::Expired), 0),
        Err(e) => Answered::Failed(format!("{step:?}: {e}")),
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
            extend(tx, d, schedule.stop_at());
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

/// The tokio instant of a CLOCK_BOOTTIME instant, measured from now.
fn instant(t: BootInstant) -> tokio::time::Instant {
    tokio::time::Instant::now() + BootInstant::now().until(t)
}

async fn sleep_until(t: BootInstant) {
    tokio::time::sleep_until(instant(t)).await;
}
