//! One connection to one ZooKeeper member: resolving its name, TCP, TLS when configured, the
//! framing of packets, and the handshake that opens or moves a session on it (the connect
//! request, `addauth digest`, SASL). What failed is said in words, one reason per member, so
//! that the caller can tell a typo (refused, unknown host) from a member that is busy (no answer,
//! no quorum) and refused credentials (77) from the rest (69).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::sasl;
use super::wire::{self, In, Reply, AUTH_XID};
use crate::clock::BootInstant;

/// A byte stream to a member: plain TCP or TLS over it.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Credentials a session presents on every connection it makes.
#[derive(Clone)]
pub enum Auth {
    /// `addauth digest user:password`: the ACL id is `digest:user:base64(sha1(user:password))`.
    Digest { user: String, password: String },
    /// SASL DIGEST-MD5 against the server's JAAS users: the ACL id is `sasl:user`.
    Sasl { user: String, password: String },
}

/// How to reach members: the transport and the credentials.
#[derive(Clone, Default)]
pub struct Reach {
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub auth: Option<Auth>,
}

/// Why one member gave no session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    UnknownHost(String),
    Refused,
    /// No answer within the bound: a member that is stopped, hung or far.
    NoAnswer(Duration),
    /// It accepted the connection and closed it before answering the connect request: it has no
    /// quorum (an election), or our last seen zxid is ahead of it.
    NotServing,
    Tls(String),
    /// It refused the credentials (77).
    AuthFailed(String),
    /// The session is gone: the member answered with timeout 0.
    Expired,
    Io(String),
}

impl Failure {
    /// A member that may give a session if asked again soon: busy, electing, or hung.
    pub const fn is_transient(&self) -> bool {
        matches!(
            self,
            Failure::NoAnswer(_) | Failure::NotServing | Failure::Io(_)
        )
    }

    /// Refused credentials or a failed TLS handshake: exit 77, not 69.
    pub const fn is_refusal(&self) -> bool {
        matches!(self, Failure::Tls(_) | Failure::AuthFailed(_))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::UnknownHost(why) => write!(f, "unknown host ({why})"),
            Failure::Refused => f.write_str("connection refused"),
            Failure::NoAnswer(within) => write!(f, "no answer within {within:?}"),
            Failure::NotServing => f.write_str(
                "closed the connection before answering: not serving (no quorum, or behind what this client has seen)",
            ),
            Failure::Tls(why) => write!(f, "TLS handshake failed: {why}"),
            Failure::AuthFailed(why) => write!(f, "refused the credentials: {why}"),
            Failure::Expired => f.write_str("the session has expired"),
            Failure::Io(why) => f.write_str(why),
        }
    }
}

/// What opens a session or moves one to a member.
pub struct Hello<'a> {
    pub timeout: Duration,
    /// Zero for a new session.
    pub session_id: i64,
    pub password: &'a [u8],
    pub last_zxid: i64,
}

/// A connection with a session on it.
pub struct Link {
    pub io: Box<dyn Io>,
    pub connected: wire::Connected,
    /// When the connect request was written (read just before): the session's expiry at the
    /// leader was set after it.
    pub sent: BootInstant,
    /// The connect request's round trip, the session's creation or move included.
    pub round_trip: Duration,
    pub member: String,
}

/// Connect to `member` and open or move a session there, all within `within`.
pub async fn link(
    member: &str,
    reach: &Reach,
    hello: &Hello<'_>,
    within: Duration,
) -> Result<Link, Failure> {
    match tokio::time::timeout(within, link_unbounded(member, reach, hello)).await {
        Ok(link) => link,
        Err(_) => Err(Failure::NoAnswer(within)),
    }
}

async fn link_unbounded(member: &str, reach: &Reach, hello: &Hello<'_>) -> Result<Link, Failure> {
    let (host, _) = split_host(member);
    let tcp = dial(member).await?;
    let _ = tcp.set_nodelay(true);
    let mut io: Box<dyn Io> = match &reach.tls {
        Some(config) => Box::new(super::tls::handshake(config, host, tcp).await?),
        None => Box::new(tcp),
    };
    let mut request = wire::connect_request(
        hello.last_zxid,
        hello.timeout.as_millis().min(i32::MAX as u128) as i32,
        hello.session_id,
        hello.password,
    );
    if let Some(Auth::Digest { user, password }) = &reach.auth {
        request.extend(wire::auth_request(
            "digest",
            format!("{user}:{password}").as_bytes(),
        ));
    }
    let sent = BootInstant::now();
    io.write_all(&request).await.map_err(io_failure)?;
    let frame = read_frame(&mut io).await.map_err(|e| match e {
        Closed::Eof => Failure::NotServing,
        Closed::Io(why) => Failure::Io(why),
    })?;
    let round_trip = sent.until(BootInstant::now());
    let connected = In::new(&frame)
        .connected()
        .map_err(|e| Failure::Io(e.to_string()))?;
    if connected.timeout_ms <= 0 {
        return Err(Failure::Expired);
    }
    match &reach.auth {
        Some(Auth::Digest { .. }) => digest_answer(&mut io).await?,
        Some(Auth::Sasl { user, password }) => sasl::authenticate(&mut io, user, password).await?,
        None => {}
    }
    Ok(Link {
        io,
        connected,
        sent,
        round_trip,
        member: member.to_owned(),
    })
}

/// The answer to the `addauth` sent with the connect request.
async fn digest_answer(io: &mut Box<dyn Io>) -> Result<(), Failure> {
    let frame = read_frame(io).await.map_err(|e| match e {
        Closed::Eof => Failure::AuthFailed("the member closed the connection".into()),
        Closed::Io(why) => Failure::Io(why),
    })?;
    let reply = Reply::read(&mut In::new(&frame)).map_err(|e| Failure::Io(e.to_string()))?;
    match (reply.xid, reply.err) {
        (AUTH_XID, wire::Code::OK) => Ok(()),
        (AUTH_XID, err) => Err(Failure::AuthFailed(format!("digest: {err}"))),
        _ => Err(Failure::Io(
            "an answer out of order during the handshake".into(),
        )),
    }
}

/// The host and port of `host:port` or `[v6]:port` (checked by the configuration already).
pub fn split_host(member: &str) -> (&str, &str) {
    let (host, port) = member.rsplit_once(':').unwrap_or((member, "2181"));
    (host.trim_start_matches('[').trim_end_matches(']'), port)
}

/// A TCP connection to `member`, its name resolved first so that an unknown host is told apart.
async fn dial(member: &str) -> Result<TcpStream, Failure> {
    let (host, port) = split_host(member);
    let port: u16 = port
        .parse()
        .map_err(|_| Failure::UnknownHost(format!("bad port {port:?}")))?;
    let addrs: Vec<_> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| Failure::UnknownHost(e.to_string()))?
        .collect();
    let mut last = Failure::UnknownHost("no address".into());
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(tcp) => return Ok(tcp),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => last = Failure::Refused,
            Err(e) => last = io_failure(e),
        }
    }
    Err(last)
}

fn io_failure(e: std::io::Error) -> Failure {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => Failure::Refused,
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => {
            Failure::NotServing
        }
        _ => Failure::Io(e.to_string()),
    }
}

/// How a stream ended.
#[derive(Debug)]
pub enum Closed {
    /// The member closed it.
    Eof,
    Io(String),
}

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Closed::Eof => f.write_str("the member closed the connection"),
            Closed::Io(why) => f.write_str(why),
        }
    }
}

/// One packet's body; its length is bounded by [`wire::MAX_PACKET`].
pub async fn read_frame(io: &mut (impl AsyncRead + Unpin + ?Sized)) -> Result<Vec<u8>, Closed> {
    let mut len = [0u8; 4];
    io.read_exact(&mut len).await.map_err(closed)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > wire::MAX_PACKET {
        return Err(Closed::Io(format!(
            "a packet of {len} bytes from the server: more than ZooKeeper sends"
        )));
    }
    let mut body = vec![0; len];
    io.read_exact(&mut body).await.map_err(closed)?;
    Ok(body)
}

fn closed(e: std::io::Error) -> Closed {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => Closed::Eof,
        _ => Closed::Io(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_split_into_host_and_port() {
        assert_eq!(split_host("zk1:2181"), ("zk1", "2181"));
        assert_eq!(split_host("[::1]:2182"), ("::1", "2182"));
        assert_eq!(split_host("10.0.0.5:1"), ("10.0.0.5", "1"));
    }

    #[tokio::test]
    async fn a_frame_longer_than_zookeeper_sends_is_refused_unread() {
        let mut bytes: &[u8] = &[0x7f, 0xff, 0xff, 0xff, 0, 0];
        let e = read_frame(&mut bytes).await.unwrap_err();
        assert!(e.to_string().contains("more than ZooKeeper sends"), "{e}");
        let mut short: &[u8] = &[0, 0, 0, 4, 1];
        assert!(matches!(read_frame(&mut short).await, Err(Closed::Eof)));
    }
}
