//! Talking to etcd: dialling, bounded and retried requests, the reading of transaction answers,
//! and the one place that tells "etcd is unreachable" (69) from "etcd refused us" (77).
//!
//! Failures are sorted by their type and gRPC code, never by their text: an answer etcd gives
//! (a gRPC status) is final unless its code says the member could not serve it; a transport or
//! I/O failure is one endpoint's and may be tried on another, as is a status made of one (an
//! endpoint that does not speak HTTP/2, such as a plain HTTP server); a TLS failure anywhere in
//! the cause chain is a refusal. When every endpoint fails, each one's reason is said. Every failure is said in words, naming the endpoint ("etcd at
//! 127.0.0.1:1: connection refused"), never as the libraries' Debug output. Nothing here knows
//! of leases or processes.

use std::error::Error as StdError;
use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, Identity, KeyValue, TlsOptions, Txn,
    TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::time::timeout;
use tonic::Code;

use crate::config::EtcdConfig;
use crate::error::Error;

/// A client and what sorting and saying its failures needs.
#[derive(Clone)]
pub struct Conn {
    client: Client,
    peer: Peer,
    /// Bound on each request ([`Conn::retrying`]): the dial timeout.
    within: Duration,
    /// The settings and endpoints it was dialled with, to ask each endpoint alone why it failed.
    dialled: std::sync::Arc<(EtcdConfig, Vec<String>)>,
}

/// Who a client talks to, as its failures need it.
#[derive(Clone, Debug)]
pub struct Peer {
    /// A connection closed by the peer is a TLS refusal only when TLS is on.
    tls: bool,
    /// The endpoints as messages name them: `127.0.0.1:2379, 10.0.0.2:2379`.
    at: String,
}

impl Peer {
    fn of(endpoints: &[String]) -> Peer {
        let bare = |u: &String| {
            let u = u
                .trim_start_matches("http://")
                .trim_start_matches("https://");
            u.trim_end_matches('/').to_owned()
        };
        Peer {
            tls: endpoints.iter().any(|u| u.starts_with("https://")),
            at: endpoints.iter().map(bare).collect::<Vec<_>>().join(", "),
        }
    }
}

impl Conn {
    /// A client for every endpoint of `cfg` (it balances over them), authenticated when a user
    /// is given. It connects lazily: unreachable endpoints show at the first request.
    pub async fn dial(cfg: &EtcdConfig) -> Result<Conn, Error> {
        Conn::dial_to(cfg, &cfg.endpoints).await
    }

    /// A client for these `endpoints` only, with the TLS, auth and dial settings of `cfg`.
    pub async fn dial_to(cfg: &EtcdConfig, endpoints: &[String]) -> Result<Conn, Error> {
        let peer = Peer::of(endpoints);
        let opts = connect_options(cfg);
        let connect = async { Client::connect(endpoints, Some(opts)).await };
        let client = bounded(cfg.dial_timeout, &peer, connect).await?;
        Ok(Conn {
            client,
            peer,
            within: cfg.dial_timeout,
            dialled: std::sync::Arc::new((cfg.clone(), endpoints.to_vec())),
        })
    }

    /// A handle on the client, for a request or a stream.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// One request, bounded by `within`, its failure sorted into the statuses of SPEC §3.
    pub async fn call<T, Fut>(
        &self,
        within: Duration,
        request: impl FnOnce(Client) -> Fut,
    ) -> Result<T, Error>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        bounded(within, &self.peer, request(self.client())).await
    }

    /// [`Conn::retrying_within`] the dial timeout.
    pub async fn retrying<T, Fut>(&self, request: impl Fn(Client) -> Fut) -> Result<T, Error>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.retrying_within(self.within, request).await
    }

    /// Like [`Conn::call`], but a failure that may be one endpoint's (refused, closed, no
    /// answer, not etcd) is tried again on a fresh handle, so that another endpoint can answer,
    /// until `within` has passed: at once, then at pauses that double up to 50 ms (a balanced
    /// client picks the failed endpoint again as often as not). When the last failure was one
    /// endpoint's and there are several, each endpoint's own reason is asked for and said.
    pub async fn retrying_within<T, Fut>(
        &self,
        within: Duration,
        request: impl Fn(Client) -> Fut,
    ) -> Result<T, Error>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let until = tokio::time::Instant::now() + within;
        let mut last = None;
        for tries in 0u32.. {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let e = match timeout(left, request(self.client())).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => e,
                // Out of time: the last failure says more than the timeout does.
                Err(_) => break,
            };
            let failure = Failure::of(&e, self.peer.tls);
            let pause = match tries {
                0 => Duration::ZERO,
                n => RETRY_PAUSE.min(Duration::from_millis(1 << n.min(6))),
            };
            if failure != Failure::Transient {
                return Err(failure.into_error(&e, &self.peer));
            }
            last = Some(failure.into_error(&e, &self.peer));
            if left <= pause {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        let last = last.unwrap_or_else(|| no_answer(&self.peer, within));
        Err(self.each_reason(last).await)
    }

    /// `failure` with each endpoint's own reason, asked of each alone within its share of the
    /// dial timeout, when there are several (one: it is already that endpoint's).
    async fn each_reason(&self, failure: Error) -> Error {
        let (cfg, endpoints) = &*self.dialled;
        if endpoints.len() < 2 || !matches!(failure, Error::Unavailable(_)) {
            return failure;
        }
        let share = cfg.dial_timeout / endpoints.len() as u32;
        let mut asks = tokio::task::JoinSet::new();
        for (i, url) in endpoints.iter().enumerate() {
            let cfg = EtcdConfig {
                dial_timeout: share,
                ..cfg.clone()
            };
            let url = url.clone();
            asks.spawn(async move { (i, endpoint_reason(&cfg, &url).await) });
        }
        let mut reasons = vec![String::new(); endpoints.len()];
        while let Some(Ok((i, why))) = asks.join_next().await {
            reasons[i] = format!("{}: {why}", endpoints[i]);
        }
        Error::Unavailable(format!(
            "etcd: no endpoint served within {:?} (--dial-timeout): {}",
            self.within,
            reasons.join("; ")
        ))
    }
}

/// Why the endpoint `url` alone does not serve, asked with a status request.
async fn endpoint_reason(cfg: &EtcdConfig, url: &str) -> String {
    let asked = async {
        let conn = Conn::dial_to(cfg, &[url.to_owned()]).await?;
        let within = cfg.dial_timeout;
        conn.call(within, |mut c| async move { c.status().await })
            .await
    };
    match asked.await {
        Ok(_) => "answers now".into(),
        Err(e) => {
            let text = e.to_string();
            // "etcd at HOST:PORT: why": the endpoint is named already.
            text.split_once(": ")
                .map_or(text.clone(), |(_, why)| why.to_owned())
        }
    }
}

/// One client per endpoint, each dialled when first used, so that a renewal and the read that
/// confirms it go through the same member, and a failed renewal can leave that member for the
/// next: the balancing client cannot tell a member whose raft loop is stuck from a healthy one.
pub struct Members {
    cfg: EtcdConfig,
    conns: Vec<Option<Conn>>,
    at: usize,
}

impl Members {
    /// The members of `cfg`'s endpoints. With one endpoint, `conn` (already dialled) is it.
    pub fn new(cfg: &EtcdConfig, conn: &Conn) -> Self {
        let mut conns: Vec<Option<Conn>> = vec![None; cfg.endpoints.len()];
        if let [only] = conns.as_mut_slice() {
            *only = Some(conn.clone());
        }
        Self {
            cfg: cfg.clone(),
            conns,
            at: 0,
        }
    }

    /// The member in use, dialled now if it was not yet.
    pub async fn current(&mut self) -> Result<&Conn, Error> {
        let at = self.at;
        let conn = match self.conns[at].take() {
            Some(conn) => conn,
            None => Conn::dial_to(&self.cfg, &self.cfg.endpoints[at..=at]).await?,
        };
        Ok(self.conns[at].insert(conn))
    }

    /// The configuration the members were dialled with.
    pub fn config(&self) -> &EtcdConfig {
        &self.cfg
    }

    /// Whether there are other members to leave for.
    pub fn several(&self) -> bool {
        self.conns.len() > 1
    }

    /// Which member is in use.
    pub fn at(&self) -> usize {
        self.at
    }

    /// The URL of the member in use.
    pub fn endpoint(&self) -> &str {
        &self.cfg.endpoints[self.at]
    }

    /// Move on to the next member (the same one when there is only one).
    pub fn leave(&mut self) {
        self.at = (self.at + 1) % self.conns.len();
    }
}

fn connect_options(cfg: &EtcdConfig) -> ConnectOptions {
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
    opts
}

async fn bounded<T>(
    within: Duration,
    peer: &Peer,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, Error> {
    match timeout(within, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Failure::of(&e, peer.tls).into_error(&e, peer)),
        Err(_) => Err(no_answer(peer, within)),
    }
}

fn no_answer(peer: &Peer, within: Duration) -> Error {
    Error::Unavailable(format!("etcd at {}: no answer within {within:?}", peer.at))
}

/// Pause between tries of a request that failed the way a dead endpoint fails.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// How a failed request failed, as far as the exit status and a retry are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The member could not serve it (down, no leader, timed out): another one may (69).
    Transient,
    /// etcd answered and the answer stands, such as "lease not found" (69 before acquiring).
    Final,
    /// Credentials or certificates were refused (77).
    Refused,
}

impl Failure {
    /// The one decision, from the error's type and gRPC code and its cause chain. `tls`: TLS is
    /// configured, so a connection the server closed is taken as a refusal (etcd 3.4 closes it
    /// after the handshake when it wants a client certificate and got none).
    pub fn of(e: &etcd_client::Error, tls: bool) -> Failure {
        use etcd_client::Error as E;
        let refused = |c: &(dyn StdError + 'static)| is_tls(c) || (tls && closed_by_peer(c));
        if inner(e).is_some_and(|inner| causes(inner).any(refused) || (tls && handshake_cut(inner)))
        {
            return Failure::Refused;
        }
        match e {
            E::TransportError(_) | E::IoError(_) => Failure::Transient,
            // Made by the transport, not said by etcd: that endpoint's failure.
            E::GRpcStatus(s) if causes(s).any(|c| c.is::<tonic::transport::Error>()) => {
                Failure::Transient
            }
            E::GRpcStatus(s) => Failure::of_code(s.code()),
            _ => Failure::Final,
        }
    }

    /// etcd's codes (its `rpctypes`): a bad or expired token is Unauthenticated, a missing role
    /// PermissionDenied, and a wrong password or an empty user name InvalidArgument, which no
    /// other request of leasewrap's can earn. Unknown, DeadlineExceeded, Unavailable and
    /// Cancelled mean this member could not serve the request now.
    const fn of_code(code: Code) -> Failure {
        match code {
            Code::Unauthenticated | Code::PermissionDenied | Code::InvalidArgument => {
                Failure::Refused
            }
            Code::Unknown | Code::DeadlineExceeded | Code::Unavailable | Code::Cancelled => {
                Failure::Transient
            }
            _ => Failure::Final,
        }
    }

    fn into_error(self, e: &etcd_client::Error, peer: &Peer) -> Error {
        let at = &peer.at;
        match self {
            Failure::Refused => Error::Auth(refusal(e, peer)),
            Failure::Transient | Failure::Final => {
                Error::Unavailable(format!("etcd at {at}: {}", in_words(e)))
            }
        }
    }
}

/// The error under an etcd-client error: a gRPC status, a transport or an I/O error.
fn inner(e: &etcd_client::Error) -> Option<&(dyn StdError + 'static)> {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(s) => Some(s),
        E::TransportError(t) => Some(t),
        E::IoError(io) => Some(io),
        _ => None,
    }
}

/// A refusal (77) in words: which handshake failed and why, or what etcd said of the
/// credentials.
fn refusal(e: &etcd_client::Error, peer: &Peer) -> String {
    let at = &peer.at;
    let Some(inner) = inner(e) else {
        return format!("etcd at {at} refused the credentials: {}", in_words(e));
    };
    if let Some(tls) = causes(inner).find_map(|c| c.downcast_ref::<rustls::Error>()) {
        return format!("TLS handshake with {at} failed: {tls}");
    }
    if peer.tls && handshake_cut(inner) {
        return format!("TLS handshake with {at} failed: the server does not speak TLS?");
    }
    if peer.tls && causes(inner).any(closed_by_peer) {
        return format!(
            "etcd at {at} closed the TLS connection: does it want a client certificate (--cert, --key)?"
        );
    }
    format!("etcd at {at} refused the credentials: {}", in_words(e))
}

/// What went wrong, in words: the I/O failure or TLS error under it, or etcd's own message;
/// never the libraries' Debug output.
fn in_words(e: &etcd_client::Error) -> String {
    if let Some(inner) = inner(e) {
        if let Some(tls) = causes(inner).find_map(|c| c.downcast_ref::<rustls::Error>()) {
            return format!("TLS: {tls}");
        }
        let io = causes(inner).filter_map(|c| c.downcast_ref::<std::io::Error>());
        if let Some(io) = io.last() {
            return io_words(io);
        }
        if causes(inner).any(closed_by_peer) {
            return "the connection was closed".into();
        }
    }
    match e {
        etcd_client::Error::GRpcStatus(s) if s.message().is_empty() => {
            s.code().description().to_owned()
        }
        etcd_client::Error::GRpcStatus(s) => s.message().to_owned(),
        other => other.to_string(),
    }
}

/// An I/O failure as the system says it, lower case: "connection refused".
fn io_words(io: &std::io::Error) -> String {
    let text = match io.raw_os_error() {
        Some(n) => nix::errno::Errno::from_raw(n).desc().to_owned(),
        None if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            "the connection was closed".to_owned()
        }
        None => io.to_string(),
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

/// The connection was made, then ended or was reset before its TLS handshake was through: a
/// server that does not speak TLS (a plain-HTTP etcd) answers a ClientHello so. Only a
/// failure while connecting counts; a refused TCP connection is not one.
fn handshake_cut(inner: &(dyn StdError + 'static)) -> bool {
    use std::io::ErrorKind::{ConnectionReset, UnexpectedEof};
    let connecting = causes(inner).any(|c| c.is::<tonic::ConnectError>());
    let cut = causes(inner).any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| matches!(io.kind(), UnexpectedEof | ConnectionReset))
    });
    connecting && cut
}

/// `e` and every error it was caused by, looking inside I/O errors too (their `source` skips
/// the error they wrap).
pub(crate) fn causes<'a>(
    e: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    let mut next = Some(e);
    std::iter::from_fn(move || {
        let here = next?;
        next = match here
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => here.source(),
        };
        Some(here)
    })
}

/// A certificate or handshake failure.
pub(crate) fn is_tls(e: &(dyn StdError + 'static)) -> bool {
    e.downcast_ref::<rustls::Error>().is_some()
}

/// The server closed the connection under the request.
fn closed_by_peer(e: &(dyn StdError + 'static)) -> bool {
    e.downcast_ref::<hyper::Error>()
        .is_some_and(|h| h.is_canceled() || h.is_closed() || h.is_incomplete_message())
}

/// The first key of each get of a transaction, in order.
pub fn first_kvs(resp: &TxnResponse) -> Vec<Option<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().first().cloned()),
            _ => None,
        })
        .collect()
}

/// The revision a response was read at, from its header.
pub fn read_at(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision())
}

/// What a transaction guarded by a lock key's create revision did.
#[derive(Debug)]
pub enum Guarded {
    /// The lock key still had the token: the operations ran; their answers are here.
    Applied(TxnResponse),
    /// The lock key has another create revision, or none: nothing ran.
    Refused { create_revision: Option<i64> },
}

/// Run `ops` in one transaction only while `lock_key`'s create revision is `token` (etcd's
/// fencing: the holder's writes fail once another holder's key, or none, is there).
pub async fn guarded_txn(
    conn: &Conn,
    lock_key: &str,
    token: i64,
    ops: Vec<TxnOp>,
) -> Result<Guarded, Error> {
    let txn = Txn::new()
        .when([Compare::create_revision(lock_key, CompareOp::Equal, token)])
        .and_then(ops)
        .or_else([TxnOp::get(lock_key, None)]);
    let resp = conn
        .retrying(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await?;
    if resp.succeeded() {
        return Ok(Guarded::Applied(resp));
    }
    let create_revision = first_kvs(&resp)
        .first()
        .and_then(|kv| kv.as_ref().map(KeyValue::create_revision));
    Ok(Guarded::Refused { create_revision })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn peer() -> Peer {
        Peer::of(&["http://127.0.0.1:2379".to_owned()])
    }

    fn status(code: Code) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, "etcdserver: something"))
    }

    #[test]
    fn refused_credentials_are_77() {
        for code in [
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::InvalidArgument,
        ] {
            assert_eq!(
                Failure::of(&status(code), false),
                Failure::Refused,
                "{code:?}"
            );
            assert!(matches!(
                Failure::Refused
                    .into_error(&status(code), &peer())
                    .code(Default::default()),
                77
            ));
        }
    }

    #[test]
    fn a_member_that_cannot_serve_now_is_retried_elsewhere() {
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Unknown,
            Code::Cancelled,
        ] {
            assert_eq!(
                Failure::of(&status(code), false),
                Failure::Transient,
                "{code:?}"
            );
        }
    }

    #[test]
    fn an_answer_such_as_lease_not_found_is_final_and_69() {
        let e = status(Code::NotFound);
        assert_eq!(Failure::of(&e, false), Failure::Final);
        assert_eq!(
            Failure::Final
                .into_error(&e, &peer())
                .code(Default::default()),
            69
        );
    }

    #[test]
    fn a_certificate_failure_under_an_unavailable_status_is_77() {
        // As tonic reports it: UNAVAILABLE, caused by an I/O error wrapping rustls's.
        let bad = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, bad);
        let mut s = tonic::Status::new(Code::Unavailable, "invalid peer certificate");
        s.set_source(Arc::new(io));
        let e = etcd_client::Error::GRpcStatus(s);
        assert_eq!(Failure::of(&e, true), Failure::Refused);
        assert_eq!(Failure::of(&e, false), Failure::Refused);
    }

    /// A real connection: a listener that accepts and closes at once, as etcd 3.4 does with a
    /// TLS client that brought no certificate.
    fn closed_connection_error() -> etcd_client::Error {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move {
                while let Ok((conn, _)) = listener.accept().await {
                    drop(conn);
                }
            });
            let mut c = Client::connect([format!("http://{addr}")], None)
                .await
                .unwrap();
            c.get("k", None).await.unwrap_err()
        })
    }

    #[test]
    fn a_closed_connection_is_a_refusal_only_under_tls() {
        let e = closed_connection_error();
        assert_eq!(Failure::of(&e, true), Failure::Refused, "{e:?}");
        assert_eq!(Failure::of(&e, false), Failure::Transient, "{e:?}");
    }

    #[test]
    fn a_refused_connection_is_transient_even_under_tls() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt.block_on(async {
            let addr = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap();
            let mut c = Client::connect([format!("http://{addr}")], None)
                .await
                .unwrap();
            c.get("k", None).await.unwrap_err()
        });
        assert_eq!(Failure::of(&e, true), Failure::Transient, "{e:?}");
    }
}
