//! What a backend's keeper task knows about its lease, shared by the backends whose lease can
//! lapse (etcd, ZooKeeper): the current `D`, the stop time, trouble and the loss, published
//! through one `watch` channel that the run loop reads as [`LeaseEvent`]s.

use tokio::sync::watch;

use super::{LeaseEvent, LossReason};
use crate::clock::BootInstant;

/// What the keeper (and any watch of the own key) knows about the lease.
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
    /// The event the run loop is told of this state.
    pub fn event(self) -> LeaseEvent {
        match (self.lost, self.trouble) {
            (Some(why), _) => LeaseEvent::Lost(why, Some(self.deadline)),
            (None, Some(why)) => LeaseEvent::Trouble(why, self.deadline),
            (None, None) => LeaseEvent::Renewed(self.deadline),
        }
    }
}

/// A renewal moved `D` to `deadline` (and the stop time to `stop_at`): any trouble is over.
pub fn extend(tx: &watch::Sender<KeeperState>, deadline: BootInstant, stop_at: BootInstant) {
    tx.send_modify(|s| {
        (s.deadline, s.stop_at, s.trouble) = (deadline, stop_at, None);
    });
}

/// Record the loss; the first reason stays.
pub fn lose(tx: &watch::Sender<KeeperState>, why: LossReason) {
    tx.send_modify(|s| {
        s.lost.get_or_insert(why);
    });
}

/// Report the first failure of a run of them; the next good reply clears it.
pub fn trouble(tx: &watch::Sender<KeeperState>, why: &str) {
    tx.send_if_modified(|s| {
        let first = s.trouble.is_none();
        if first {
            s.trouble = Some(why.to_owned());
        }
        first
    });
}
