//! The etcd backend, in the layout of etcd's own mutex recipe so that `--prefix ''` excludes
//! `etcdctl lock NAME` and back: a lease, a key `PREFIX NAME/<lease id hex>` created under a
//! `create_revision == 0` guard, the owner being the lowest create revision under `PREFIX NAME/`,
//! and a waiter watching only the key just ahead of it. The fencing token is the own key's create
//! revision.
//!
//! Renewal runs in a task of its own that follows `timing::Schedule`: one keepalive in flight,
//! `t_send` read before each send, the stream rebuilt when a reply misses its time. A second task
//! watches the own key. Both publish one [`KeeperState`]; nothing here touches a process, and
//! nothing on the kill path waits for this module.

use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    KeyValue, LeaseKeepAliveStream, LeaseKeeper, PutOptions, SortOrder, SortTarget, TlsOptions,
    Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::timeout;

use super::timing::{GrantError, Next, Params, Schedule, Verdict};
use crate::clock::BootInstant;
use crate::config::EtcdConfig;
use crate::error::Error;

/// What the renewal and watch tasks know about the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeeperState {
    /// The current `D`.
    pub deadline: BootInstant,
    /// Stop time `D - kill_after`: past it the lease is as good as lost.
    pub stop_at: BootInstant,
    /// Why the lease is gone, once it is; never unset.
    pub lost: Option<String>,
    /// Why renewals are failing, from the first failure until the next good reply.
    pub trouble: Option<String>,
}

/// A dialled etcd and the lease attempt in progress.
pub struct Etcd {
    client: Client,
    cfg: EtcdConfig,
    params: Params,
    /// The lease being waited on or held, so an abandoned wait can be undone.
    attempt: Option<Attempt>,
}

/// One granted lease, its key, and the tasks that keep it.
struct Attempt {
    lease_id: i64,
    key: String,
    /// Create revision of `key`: the fencing token.
    revision: i64,
    state: watch::Receiver<KeeperState>,
    state_tx: watch::Sender<KeeperState>,
    tasks: Vec<JoinHandle<()>>,
}

/// A lease that is ours, as the run loop sees it.
pub struct EtcdHeld {
    client: Client,
    attempt: Attempt,
    /// Bound on the revoke at release.
    release_within: Duration,
}

impl Etcd {
    /// Dial etcd. The client connects lazily, so unreachable endpoints show at the first call;
    /// with a user it authenticates here, and a refused password is status 77.
    pub async fn connect(cfg: &EtcdConfig, params: Params) -> Result<Self, Error> {
        let client = connect(cfg).await?;
        Ok(Self {
            client,
            cfg: cfg.clone(),
            params,
            attempt: None,
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
            let (owner_rev, seen_rev) = self.enqueue(name, record).await?;
            let attempt = self.attempt.as_mut().expect("enqueued");
            let read_at = if owner_rev == attempt.revision {
                seen_rev
            } else {
                if !block {
                    return Err(Error::Busy {
                        name: name.to_owned(),
                    });
                }
                tracing::info!(name = %name, token = attempt.revision, "waiting for the lease");
                match wait_turn(&mut self.client, &self.cfg, name, attempt).await? {
                    Some(rev) => rev,
                    None => {
                        tracing::warn!(name = %name, "own lease or key lost while waiting: queueing again");
                        self.abandon().await;
                        continue;
                    }
                }
            };
            if self.confirm(read_at) {
                let attempt = self.attempt.take().expect("enqueued");
                return Ok(EtcdHeld {
                    client: self.client.clone(),
                    attempt,
                    release_within: self.cfg.dial_timeout.min(Duration::from_secs(1)),
                });
            }
            tracing::warn!(name = %name, "lease lapsed while acquiring: queueing again");
            self.abandon().await;
        }
    }

    /// Grant a lease, start keeping it, and put our key behind the others. Returns the owner's
    /// create revision and the revision the answer was read at.
    async fn enqueue(&mut self, name: &str, record: &[u8]) -> Result<(i64, i64), Error> {
        let within = self.cfg.dial_timeout;
        let t_send = BootInstant::now();
        let ttl = ttl_secs(self.params.ttl);
        let grant = call_retrying(within, &self.client, |mut c| async move {
            c.lease_grant(ttl, None).await
        })
        .await
        .map_err(|e| tls_refusal(&self.cfg, e))?;
        let schedule = match Schedule::granted(self.params, t_send, grant.ttl()) {
            Ok(s) => s,
            Err(GrantError::Expired) => {
                return Err(Error::Unavailable("etcd granted a lease with TTL 0".into()))
            }
            Err(GrantError::DoesNotFit(e)) => {
                let id = grant.id();
                let _ = call(within, self.client.lease_revoke(id)).await;
                return Err(Error::Usage(e.to_string()));
            }
        };
        let lease_id = grant.id();
        let initial = KeeperState {
            deadline: schedule.deadline(),
            stop_at: schedule.stop_at(),
            lost: None,
            trouble: None,
        };
        let (state_tx, state) = watch::channel(initial);
        let keeper = tokio::spawn(keep_alive(
            self.client.clone(),
            lease_id,
            schedule,
            state_tx.clone(),
        ));
        let key = format!("{}{name}/{lease_id:x}", self.cfg.prefix);
        self.attempt = Some(Attempt {
            lease_id,
            key: key.clone(),
            revision: 0,
            state,
            state_tx,
            tasks: vec![keeper],
        });
        let prefix = format!("{}{name}/", self.cfg.prefix);
        let owner = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.clone(),
                    record,
                    Some(PutOptions::new().with_lease(lease_id)),
                ),
                TxnOp::get(prefix.clone(), Some(owner.clone())),
            ])
            .or_else([
                TxnOp::get(key.clone(), None),
                TxnOp::get(prefix, Some(owner)),
            ]);
        let resp = call_retrying(within, &self.client, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await?;
        let firsts = txn_first_kvs(&resp);
        let create_rev =
            |kv: Option<&Option<KeyValue>>| kv?.as_ref().map(|kv| kv.create_revision());
        let revision = if resp.succeeded() {
            resp.header().map(|h| h.revision())
        } else {
            create_rev(firsts.first())
        };
        let (Some(revision), Some(owner_rev)) = (revision, create_rev(firsts.last())) else {
            return Err(Error::Internal(format!(
                "etcd answered the lock transaction for {key} without the keys"
            )));
        };
        self.attempt.as_mut().expect("set above").revision = revision;
        Ok((owner_rev, resp.header().map_or(revision, |h| h.revision())))
    }

    /// After our turn came: the key must still be ours and `D` still ahead (etcd 3.4 does not
    /// re-check after a wait). The key was read at `read_at`, by the lock transaction itself when
    /// there was no wait, else by the last look of [`wait_turn`]; `D` is checked now. Starts the
    /// watch on the own key from that revision on.
    fn confirm(&mut self, read_at: i64) -> bool {
        let attempt = self.attempt.as_mut().expect("enqueued");
        let ahead = {
            let s = attempt.state.borrow();
            s.lost.is_none() && BootInstant::now() < s.stop_at
        };
        if ahead {
            attempt.tasks.push(tokio::spawn(watch_own_key(
                self.client.clone(),
                attempt.key.clone(),
                attempt.revision,
                read_at + 1,
                attempt.state_tx.clone(),
            )));
        }
        ahead
    }

    /// Undo an attempt: stop keeping its lease and revoke it, which deletes its key.
    pub async fn abandon(&mut self) {
        if let Some(attempt) = self.attempt.take() {
            revoke(&mut self.client, attempt, self.cfg.dial_timeout).await;
        }
    }
}

impl EtcdHeld {
    pub fn token(&self) -> u64 {
        self.attempt.revision as u64
    }

    pub fn key(&self) -> &str {
        &self.attempt.key
    }

    pub fn lease_id(&self) -> i64 {
        self.attempt.lease_id
    }

    pub fn deadline(&self) -> BootInstant {
        self.attempt.state.borrow().deadline
    }

    /// Time between the stop signal and SIGKILL for the TTL etcd granted.
    pub fn kill_after(&self) -> Duration {
        let s = self.attempt.state.borrow();
        s.stop_at.until(s.deadline)
    }

    /// The next change of the keeper state: a later `D`, or the loss. Cancel-safe.
    pub async fn next_change(&mut self) -> KeeperState {
        // Never an error: the attempt itself holds a sender, so the channel cannot close.
        let _ = self.attempt.state.changed().await;
        self.attempt.state.borrow_and_update().clone()
    }

    /// Revoke the lease at once, so the next waiter starts within milliseconds.
    pub async fn release(mut self) {
        revoke(&mut self.client, self.attempt, self.release_within).await;
    }
}

async fn revoke(client: &mut Client, attempt: Attempt, within: Duration) {
    for t in &attempt.tasks {
        t.abort();
    }
    let id = attempt.lease_id;
    if let Err(e) = call_retrying(
        within,
        client,
        |mut c| async move { c.lease_revoke(id).await },
    )
    .await
    {
        tracing::debug!(error = %e, "revoking the lease failed; it will expire by its TTL");
    }
}

/// Wait until every key created before ours is gone. Each look reads, in one transaction, the
/// newest key ahead of ours and our own key, so the read that finds the way clear also confirms
/// the key is still ours: returns the revision of that read, or `None` when our lease or key was
/// lost first.
async fn wait_turn(
    client: &mut Client,
    cfg: &EtcdConfig,
    name: &str,
    attempt: &mut Attempt,
) -> Result<Option<i64>, Error> {
    let prefix = format!("{}{name}/", cfg.prefix);
    let ahead = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(attempt.revision - 1)
        .with_limit(1);
    let look = Txn::new().and_then([
        TxnOp::get(prefix, Some(ahead)),
        TxnOp::get(attempt.key.clone(), None),
    ]);
    loop {
        if attempt.state.borrow().lost.is_some() {
            return Ok(None);
        }
        let resp = match call(cfg.dial_timeout, client.txn(look.clone())).await {
            Ok(r) => r,
            Err(_) => {
                lost_or_pause(&mut attempt.state, Duration::from_millis(100)).await;
                continue;
            }
        };
        let read_at = resp.header().map_or(0, |h| h.revision());
        let firsts = txn_first_kvs(&resp);
        let first = |i: usize| firsts.get(i).and_then(Option::as_ref);
        if !first(1).is_some_and(|kv| kv.create_revision() == attempt.revision) {
            return Ok(None);
        }
        let Some(kv) = first(0) else {
            return Ok(Some(read_at));
        };
        let watch = client.watch(
            kv.key().to_vec(),
            Some(WatchOptions::new().with_start_revision(read_at + 1)),
        );
        let mut stream = match timeout(cfg.dial_timeout, watch).await {
            Ok(Ok(s)) => s,
            _ => {
                lost_or_pause(&mut attempt.state, Duration::from_millis(100)).await;
                continue;
            }
        };
        loop {
            tokio::select! {
                msg = stream.message() => match msg {
                    Ok(Some(resp)) if resp.canceled() || resp.events().iter().any(|e| e.event_type() == EventType::Delete) => break,
                    Ok(Some(_)) => {}
                    _ => break,
                },
                _ = attempt.state.changed() => if attempt.state.borrow().lost.is_some() { return Ok(None) },
            }
        }
    }
}

/// The first key of each get of a transaction, in order.
fn txn_first_kvs(resp: &etcd_client::TxnResponse) -> Vec<Option<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().first().cloned()),
            _ => None,
        })
        .collect()
}

/// Sleep up to `pause`, waking early if the lease is lost.
async fn lost_or_pause(state: &mut watch::Receiver<KeeperState>, pause: Duration) {
    let _ = timeout(pause, state.wait_for(|s| s.lost.is_some())).await;
}

/// The renewal task: follows the schedule until the lease is lost, publishing every new `D`.
async fn keep_alive(
    mut client: Client,
    id: i64,
    mut schedule: Schedule,
    tx: watch::Sender<KeeperState>,
) {
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    loop {
        let now = BootInstant::now();
        let verdict = match schedule.next(now) {
            Next::Lost => return lose(&tx, "no keepalive reply came before the stop time"),
            Next::SleepUntil(t) => {
                tokio::time::sleep(now.until(t)).await;
                continue;
            }
            Next::Send => {
                let t_send = BootInstant::now();
                let sent = match stream.as_mut() {
                    Some((keeper, _)) => Some(keeper.keep_alive().await.is_ok()),
                    None => None,
                };
                match sent {
                    None => {
                        open_stream(&mut client, id, &mut schedule, t_send, &mut stream, &tx).await
                    }
                    Some(true) => {
                        schedule.sent(t_send);
                        continue;
                    }
                    Some(false) => {
                        trouble(&tx, "the keepalive stream broke: rebuilding it");
                        stream = None;
                        schedule.failed(BootInstant::now());
                        continue;
                    }
                }
            }
            Next::AwaitReplyUntil(due) => {
                let Some((_, replies)) = stream.as_mut() else {
                    schedule.failed(now);
                    continue;
                };
                match timeout(now.until(due), replies.message()).await {
                    Ok(Ok(Some(r))) => schedule.replied(BootInstant::now(), r.ttl()),
                    _ => {
                        tracing::warn!(
                            lease = format!("{id:x}"),
                            "keepalive reply missing: rebuilding the stream"
                        );
                        stream = None;
                        schedule.failed(BootInstant::now());
                        continue;
                    }
                }
            }
        };
        tracing::debug!(lease = format!("{id:x}"), ?verdict, "keepalive reply");
        match verdict {
            Verdict::Extended(d) => tx.send_modify(|s| {
                s.deadline = d;
                s.stop_at = schedule.stop_at();
                s.trouble = None;
            }),
            Verdict::Lost => return lose(&tx, "etcd says the lease has expired (TTL 0)"),
            Verdict::Ignored => {}
        }
    }
}

/// Open the keepalive stream. The client sends the first keepalive and reads its reply itself,
/// answering only whether its TTL was above zero; that TTL is the granted one.
async fn open_stream(
    client: &mut Client,
    id: i64,
    schedule: &mut Schedule,
    t_send: BootInstant,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    tx: &watch::Sender<KeeperState>,
) -> Verdict {
    schedule.sent(t_send);
    // Due like any reply: within TTL/3 of the send, and by the stop time at the latest.
    let due = match schedule.next(t_send) {
        Next::AwaitReplyUntil(due) => due,
        _ => schedule.stop_at(),
    };
    let within = BootInstant::now().until(due);
    match timeout(within, client.lease_keep_alive(id)).await {
        Ok(Ok(pair)) => {
            *stream = Some(pair);
            schedule.replied(BootInstant::now(), schedule.timing().ttl.as_secs() as i64)
        }
        // "lease not found": the reply carried TTL <= 0.
        Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
            schedule.replied(BootInstant::now(), 0)
        }
        Ok(Err(e)) => {
            trouble(tx, &format!("opening the keepalive stream failed: {e}"));
            schedule.failed(BootInstant::now());
            Verdict::Ignored
        }
        Err(_) => {
            trouble(tx, "opening the keepalive stream took too long");
            schedule.failed(BootInstant::now());
            Verdict::Ignored
        }
    }
}

/// The watch task: the own key deleted, or replaced by another holder's, means the lease is lost.
async fn watch_own_key(
    mut client: Client,
    key: String,
    revision: i64,
    mut from: i64,
    tx: watch::Sender<KeeperState>,
) {
    loop {
        let opts = WatchOptions::new().with_start_revision(from);
        let Ok(mut stream) = client.watch(key.clone(), Some(opts)).await else {
            // etcd unreachable: the renewal deadline covers this; look again soon.
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while let Ok(Some(resp)) = stream.message().await {
            if resp.canceled() {
                // Cancelled by etcd (its start revision compacted away, say): read the key again
                // and watch on from that read, or lose the lease if the key is gone.
                match client.get(key.clone(), None).await {
                    Ok(r)
                        if r.kvs()
                            .first()
                            .is_some_and(|kv| kv.create_revision() == revision) =>
                    {
                        from = r.header().map_or(from, |h| h.revision() + 1);
                    }
                    Ok(_) => return lose(&tx, &format!("lock key {key} is gone")),
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
                break;
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                from = from.max(kv.mod_revision() + 1);
                if ev.event_type() == EventType::Delete {
                    return lose(&tx, &format!("lock key {key} was deleted"));
                }
                if kv.create_revision() != revision {
                    return lose(&tx, &format!("lock key {key} was replaced"));
                }
            }
        }
    }
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

fn lose(tx: &watch::Sender<KeeperState>, why: &str) {
    tx.send_modify(|s| {
        s.lost.get_or_insert_with(|| why.to_owned());
    });
}

/// A client for `cfg`, authenticated when a user is given.
pub async fn connect(cfg: &EtcdConfig) -> Result<Client, Error> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(cfg.dial_timeout)
        .with_keep_alive(Duration::from_secs(2), cfg.dial_timeout);
    if cfg.ca.is_some() || cfg.identity.is_some() {
        let mut tls = TlsOptions::new();
        if let Some(ca) = &cfg.ca {
            tls = tls.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &cfg.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        opts = opts.with_tls(tls);
    }
    if let Some((user, password)) = &cfg.auth {
        opts = opts.with_user(user.clone(), password.clone());
    }
    call(
        cfg.dial_timeout,
        Client::connect(cfg.endpoints.clone(), Some(opts)),
    )
    .await
}

/// One request, bounded by `within`, its failure sorted into the statuses of SPEC §3.
pub async fn call<T>(
    within: Duration,
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, Error> {
    match timeout(within, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(classify(e)),
        Err(_) => Err(Error::Unavailable(format!("no answer within {:?}", within))),
    }
}

/// Pause between tries of a request that failed the way a dead endpoint fails.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Like [`call`], but a failure that may be one endpoint's (refused, closed, no answer) is tried
/// again on a fresh handle, so that another endpoint can answer, until `within` has passed.
pub async fn call_retrying<T, Fut>(
    within: Duration,
    client: &Client,
    request: impl Fn(Client) -> Fut,
) -> Result<T, Error>
where
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let until = tokio::time::Instant::now() + within;
    let mut last = None;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        match timeout(left, request(client.clone())).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => {
                let again = transient(&e);
                let err = classify(e);
                if !(again && matches!(err, Error::Unavailable(_)) && left > RETRY_PAUSE) {
                    return Err(err);
                }
                last = Some(err);
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            // Out of time: the last failure says more than the timeout does.
            Err(_) => {
                return Err(last
                    .unwrap_or_else(|| Error::Unavailable(format!("no answer within {within:?}"))))
            }
        }
    }
}

/// A failure another endpoint might not have: transport errors and gRPC UNKNOWN (2),
/// DEADLINE_EXCEEDED (4) and UNAVAILABLE (14). An answer such as "lease not found" is final.
fn transient(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => matches!(s.code() as i32, 2 | 4 | 14),
        _ => false,
    }
}

/// A TLS server that wants a client certificate may just close the connection (etcd 3.4 does):
/// with TLS configured, that is a refusal (77), not an unreachable etcd.
pub fn tls_refusal(cfg: &EtcdConfig, e: Error) -> Error {
    let tls = cfg.endpoints.iter().any(|u| u.starts_with("https://"));
    match e {
        Error::Unavailable(text) if tls && text.contains("connection closed") => {
            Error::Auth(format!(
            "the server closed the TLS connection (does it require a client certificate?): {text}"
        ))
        }
        other => other,
    }
}

/// Refused credentials or certificates are 77; everything else is etcd being unreachable (69).
fn classify(e: etcd_client::Error) -> Error {
    let text = format!("{e}");
    let lower = text.to_lowercase();
    let auth = [
        "authentication failed",
        "permission denied",
        "invalid auth token",
        "user name is empty",
        "unauthenticated",
    ];
    let tls = ["certificate", "tls", "handshake", "unknownissuer", "alert"];
    if auth.iter().chain(tls.iter()).any(|w| lower.contains(w)) {
        Error::Auth(text)
    } else {
        Error::Unavailable(text)
    }
}
