//! The mutex, as etcd's `concurrency.Mutex` is: the key `PREFIX NAME/<lease id hex>` is put
//! under a `create_revision == 0` guard in one transaction that also reads the owner (the
//! lowest create revision under `PREFIX NAME/`); a waiter watches only the key just ahead of its
//! own; and the own key is watched while held. Every look is a transaction (a linearizable read),
//! so no answer of a member that has fallen behind is acted on. Each look may read one more key
//! (`along`, a run record) at the same revision, so the caller learns it with no request of its
//! own. Knows nothing of renewals.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget,
    Txn, TxnOp, TxnResponse, WatchOptions, WatchStream,
};
use tokio::sync::watch;
use tokio::time::timeout;

use super::client::{first_kvs, read_at, Conn, Members};
use super::session::{lose, KeeperState};
use crate::config::EtcdConfig;
use crate::error::Error;
use crate::lease::LossReason;

/// The own key, queued.
#[derive(Clone, Debug)]
pub struct Queued {
    /// The lock key `PREFIX NAME/<lease id hex>`.
    pub key: String,
    /// Its create revision: the fencing token.
    pub revision: i64,
    /// The key was the owner at once (no key ahead of it).
    pub owned: bool,
    /// The revision the lock transaction read at.
    pub read_at: i64,
    /// The value of the `along` key at that revision, if it was asked for and is there.
    pub along: Option<Vec<u8>>,
}

/// How waiting for the turn ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Every key ahead is gone and the own key is still ours, as read at this revision, when
    /// the `along` key had this value.
    Ours {
        read_at: i64,
        along: Option<Vec<u8>>,
    },
    /// The own lease or key was lost first.
    Lost,
}

/// Pause before looking again after a failed look or watch.
const PAUSE: Duration = Duration::from_millis(100);

fn queue_of(cfg: &EtcdConfig, name: &str) -> String {
    format!("{}{name}/", cfg.prefix)
}

/// Put our key (on `lease_id`) behind the others and read who owns the lock, and `along`, in one
/// transaction.
pub async fn enqueue(
    conn: &Conn,
    cfg: &EtcdConfig,
    name: &str,
    lease_id: i64,
    record: &[u8],
    along: Option<&str>,
) -> Result<Queued, Error> {
    let key = format!("{}{lease_id:x}", queue_of(cfg, name));
    let txn = lock_txn(&key, &queue_of(cfg, name), lease_id, record, along);
    let resp = conn
        .retrying(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await?;
    queued_from(key, &resp)
}

/// Create the key unless it exists (a retried transaction finds its own earlier put), and read
/// it, the owner and `along`.
fn lock_txn(key: &str, queue: &str, lease_id: i64, record: &[u8], along: Option<&str>) -> Txn {
    let owner = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let put = PutOptions::new().with_lease(lease_id);
    let along = || along.map(|k| TxnOp::get(k, None));
    let created = [
        TxnOp::put(key, record, Some(put)),
        TxnOp::get(queue, Some(owner.clone())),
    ];
    let there = [TxnOp::get(key, None), TxnOp::get(queue, Some(owner))];
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then(created.into_iter().chain(along()).collect::<Vec<_>>())
        .or_else(there.into_iter().chain(along()).collect::<Vec<_>>())
}

fn queued_from(key: String, resp: &TxnResponse) -> Result<Queued, Error> {
    let firsts = first_kvs(resp);
    let create_rev = |kv: Option<&Option<KeyValue>>| kv?.as_ref().map(KeyValue::create_revision);
    let read_at = read_at(resp.header());
    // The put's revision is the header's; otherwise the key was there already, and read first.
    let (revision, owner_at) = match resp.succeeded() {
        true => (Some(read_at).filter(|&r| r > 0), 0),
        false => (create_rev(firsts.first()), 1),
    };
    match (revision, create_rev(firsts.get(owner_at))) {
        (Some(revision), Some(owner)) => Ok(Queued {
            key,
            revision,
            owned: owner == revision,
            read_at,
            along: value(firsts.get(owner_at + 1)),
        }),
        _ => Err(Error::Internal(format!(
            "etcd answered the lock transaction for {key} without the keys"
        ))),
    }
}

/// The value of a key a transaction read, if it was there.
fn value(kv: Option<&Option<KeyValue>>) -> Option<Vec<u8>> {
    kv?.as_ref().map(|kv| kv.value().to_vec())
}

/// What one look at the queue found.
enum Look {
    /// Nothing ahead, and the own key ours: read at this revision, with `along`'s value.
    Clear(i64, Option<Vec<u8>>),
    /// This key is ahead; watch it from after this revision.
    Behind(Vec<u8>, i64),
    /// The own key is gone or someone else's.
    Lost,
}

/// Wait until every key created before ours is gone. Each look reads, in one transaction, the
/// newest key ahead of ours and our own key, so the read that finds the way clear also confirms
/// the key is still ours; and `along`, as it is when our turn comes. Looks and watches go through
/// one member at a time; a look that fails moves on to the next. With `recheck`, a watch is given
/// up after that long and the queue looked at again: a watch on a member whose raft loop is stuck
/// stays silent while the others expire the key ahead, and that look, through the stuck member,
/// fails and moves on.
pub async fn wait_turn(
    members: &mut Members,
    cfg: &EtcdConfig,
    (name, along): (&str, Option<&str>),
    queued: &Queued,
    recheck: Option<Duration>,
    mut state: watch::Receiver<KeeperState>,
) -> Result<Turn, Error> {
    let look = look_txn(&queue_of(cfg, name), queued, along);
    let within = recheck.map_or(cfg.dial_timeout, |r| r.min(cfg.dial_timeout));
    loop {
        if state.borrow().lost.is_some() {
            return Ok(Turn::Lost);
        }
        let (resp, client) = match look_through(members, &look, within).await {
            Ok(answer) => answer,
            Err(e) => {
                let at = members.endpoint();
                tracing::info!(name = %name, "no look at the queue through {at} ({e}): trying the next member");
                members.leave();
                lost_or_pause(&mut state).await;
                continue;
            }
        };
        match judge_look(&resp, queued.revision) {
            Look::Clear(read_at, along) => return Ok(Turn::Ours { read_at, along }),
            Look::Lost => return Ok(Turn::Lost),
            Look::Behind(ahead, read_at) => {
                let watch = Watch {
                    ahead,
                    read_at,
                    recheck,
                };
                if !wait_gone(&client, cfg, watch, &mut state).await {
                    return Ok(Turn::Lost);
                }
            }
        }
    }
}

/// One look at the queue through the member in use, and that member's client for the watch.
async fn look_through(
    members: &mut Members,
    look: &Txn,
    within: Duration,
) -> Result<(TxnResponse, Client), Error> {
    let conn = members.current().await?;
    let txn = |mut c: Client| {
        let look = look.clone();
        async move { c.txn(look).await }
    };
    Ok((conn.call(within, txn).await?, conn.client()))
}

fn look_txn(queue: &str, queued: &Queued, along: Option<&str>) -> Txn {
    let ahead = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(queued.revision - 1)
        .with_limit(1);
    let looks = [
        TxnOp::get(queue, Some(ahead)),
        TxnOp::get(queued.key.as_str(), None),
    ];
    let along = along.map(|k| TxnOp::get(k, None));
    Txn::new().and_then(looks.into_iter().chain(along).collect::<Vec<_>>())
}

fn judge_look(resp: &TxnResponse, revision: i64) -> Look {
    let firsts = first_kvs(resp);
    let first = |i: usize| firsts.get(i).and_then(Option::as_ref);
    if first(1).is_none_or(|kv| kv.create_revision() != revision) {
        return Look::Lost;
    }
    match first(0) {
        None => Look::Clear(read_at(resp.header()), value(firsts.get(2))),
        Some(kv) => Look::Behind(kv.key().to_vec(), read_at(resp.header())),
    }
}

/// The key ahead of ours, as one look found it.
struct Watch {
    ahead: Vec<u8>,
    /// The look's revision: the watch starts after it.
    read_at: i64,
    /// Give the watch up after this long and look again.
    recheck: Option<Duration>,
}

/// Watch the key ahead until it is deleted, the watch ends, or `recheck` has passed (so look
/// again). False when the own lease was lost first.
async fn wait_gone(
    client: &Client,
    cfg: &EtcdConfig,
    watch: Watch,
    state: &mut watch::Receiver<KeeperState>,
) -> bool {
    let opts = WatchOptions::new().with_start_revision(watch.read_at + 1);
    let mut client = client.clone();
    let start = client.watch(watch.ahead, Some(opts));
    let mut stream = match timeout(cfg.dial_timeout, start).await {
        Ok(Ok(s)) => s,
        _ => {
            lost_or_pause(state).await;
            return state.borrow().lost.is_none();
        }
    };
    let recheck = async {
        match watch.recheck {
            Some(after) => tokio::time::sleep(after).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(recheck);
    loop {
        tokio::select! {
            gone = deleted(&mut stream) => if gone { return true },
            () = &mut recheck => return true,
            _ = state.changed() => if state.borrow().lost.is_some() { return false },
        }
    }
}

/// The next message of a watch: true when it shows a delete or ends the watch.
async fn deleted(stream: &mut WatchStream) -> bool {
    match stream.message().await {
        Ok(Some(resp)) => {
            resp.canceled()
                || resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
        }
        _ => true,
    }
}

/// Sleep up to [`PAUSE`], waking early if the lease is lost.
async fn lost_or_pause(state: &mut watch::Receiver<KeeperState>) {
    let _ = timeout(PAUSE, state.wait_for(|s| s.lost.is_some())).await;
}

/// While held: the own key deleted, or replaced by another holder's, means the lease is lost.
/// Watches from revision `from` on.
pub async fn watch_own_key(
    client: Client,
    key: String,
    revision: i64,
    mut from: i64,
    tx: watch::Sender<KeeperState>,
) {
    loop {
        let opts = WatchOptions::new().with_start_revision(from);
        let Ok(mut stream) = client.clone().watch(key.clone(), Some(opts)).await else {
            // etcd unreachable: the renewal deadline covers this; look again soon.
            tokio::time::sleep(PAUSE).await;
            continue;
        };
        while let Ok(Some(resp)) = stream.message().await {
            if resp.canceled() {
                match reread(&client, &key, revision).await {
                    Reread::Ours(at) => from = at + 1,
                    Reread::Gone => return lose(&tx, LossReason::KeyGone(key)),
                    Reread::Failed => tokio::time::sleep(PAUSE).await,
                }
                break;
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                from = from.max(kv.mod_revision() + 1);
                if ev.event_type() == EventType::Delete {
                    return lose(&tx, LossReason::KeyDeleted(key));
                }
                if kv.create_revision() != revision {
                    return lose(&tx, LossReason::KeyReplaced(key));
                }
            }
        }
    }
}

/// What reading the own key again found.
enum Reread {
    /// Still ours, read at this revision.
    Ours(i64),
    Gone,
    Failed,
}

/// A cancelled watch (its start revision compacted away, say): read the key again, to watch on
/// from that read, or to find it gone.
async fn reread(client: &Client, key: &str, revision: i64) -> Reread {
    match client.clone().get(key, None).await {
        Ok(r) if r.kvs().first().map(KeyValue::create_revision) == Some(revision) => {
            Reread::Ours(read_at(r.header()))
        }
        Ok(_) => Reread::Gone,
        Err(_) => Reread::Failed,
    }
}
