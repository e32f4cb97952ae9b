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
    /// It accepted the connection and closed it before answering the connect request, or during
    /// the authentication that follows: it has no quorum (an election), our last seen zxid is
    /// ahead of it, or it is shutting down.
    NotServing,
    /// What it sent is not ZooKeeper's (an HTTP server, a wrong port): asking again will not help.
    NotZooKeeper(String),
    /// It moved the session here under another session id: ours is lost.
    NotOurs(i64),
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
            Failure::NotZooKeeper(why) => write!(f, "not ZooKeeper: {why}"),
            Failure::NotOurs(id) => write!(
                f,
                "it answered with another session (0x{id:x}) than the one being moved: ours is lost"
            ),
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
    let mut io = open(member, reach).await?;
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
    let frame = read_frame(&mut io).await.map_err(Failure::from)?;
    let round_trip = sent.until(BootInstant::now());
    let connected = In::new(&frame)
        .connected()
        .map_err(|e| Failure::NotZooKeeper(format!("its answer to the connect request: {e}")))?;
    if connected.timeout_ms <= 0 {
        return Err(Failure::Expired);
    }
    if hello.session_id != 0 && connected.session_id != hello.session_id {
        return Err(Failure::NotOurs(connected.session_id));
    }
    match &reach.auth {
        Some(Auth::Digest { .. }) => handshake_answer(&mut io, AUTH_XID, "digest")
            .await
            .map(drop)?,
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

/// A stream to `member`: TCP, and TLS over it when configured.
pub async fn open(member: &str, reach: &Reach) -> Result<Box<dyn Io>, Failure> {
    let (host, _) = split_host(member);
    let tcp = dial(member).await?;
    let _ = tcp.set_nodelay(true);
    Ok(match &reach.tls {
        Some(config) => Box::new(super::tls::handshake(config, host, tcp).await?),
        None => Box::new(tcp),
    })
}

/// The answer to the handshake request `xid` (the `addauth`, or a SASL token, `what`): the body
/// after its header. A member that closes the connection here does not serve (it is shutting
/// down, or lost its quorum): that says nothing of the credentials. An error code refuses them.
pub async fn handshake_answer(
    io: &mut Box<dyn Io>,
    xid: i32,
    what: &str,
) -> Result<Vec<u8>, Failure> {
    let mut frame = read_frame(io).await.map_err(Failure::from)?;
    let reply = Reply::read(&mut In::new(&frame))
        .map_err(|e| Failure::NotZooKeeper(format!("its answer during {what}: {e}")))?;
    match (reply.xid == xid, reply.err) {
        (false, _) => Err(Failure::NotZooKeeper(format!(
            "an answer out of order during {what}"
        ))),
        (true, wire::Code::OK) => Ok(frame.split_off(wire::REPLY_HEADER)),
        (true, wire::Code::SASL_REQUIRED) => {
            Err(Failure::AuthFailed(super::session::SASL_REQUIRED.into()))
        }
        (true, err) => Err(Failure::AuthFailed(format!("{what}: {err}"))),
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
    /// The member closed it between packets.
    Eof,
    /// It ended inside a packet: no ZooKeeper does that.
    CutShort,
    /// A length no ZooKeeper sends: negative, or longer than its largest packet.
    Foreign(String),
    Io(String),
}

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Closed::Eof => f.write_str("the member closed the connection"),
            Closed::CutShort => f.write_str("the member closed the connection inside a packet"),
            Closed::Foreign(why) | Closed::Io(why) => f.write_str(why),
        }
    }
}

impl From<Closed> for Failure {
    /// During a handshake: a member that closes between packets does not serve; one whose bytes
    /// are not ZooKeeper's is not ZooKeeper.
    fn from(closed: Closed) -> Failure {
        match closed {
            Closed::Eof => Failure::NotServing,
            Closed::CutShort => Failure::NotZooKeeper(closed.to_string()),
            Closed::Foreign(why) => Failure::NotZooKeeper(why),
            Closed::Io(why) => Failure::Io(why),
        }
    }
}

/// One packet's body; its length is bounded by [`wire::MAX_PACKET`].
pub async fn read_frame(io: &mut (impl AsyncRead + Unpin + ?Sized)) -> Result<Vec<u8>, Closed> {
    let mut len = [0u8; 4];
    match io.read(&mut len[..1]).await {
        Ok(0) => return Err(Closed::Eof),
        Ok(_) => {}
        Err(e) => return Err(closed(e)),
    }
    io.read_exact(&mut len[1..]).await.map_err(cut_short)?;
    let len = i32::from_be_bytes(len);
    let Ok(len) = usize::try_from(len) else {
        return Err(Closed::Foreign(format!(
            "a packet of negative length ({len}) from the server: {}",
            looks_like(&len.to_be_bytes())
        )));
    };
    if len > wire::MAX_PACKET {
        return Err(Closed::Foreign(format!(
            "a packet of {len} bytes from the server, more than ZooKeeper sends: {}",
            looks_like(&(len as u32).to_be_bytes())
        )));
    }
    let mut body = vec![0; len];
    io.read_exact(&mut body).await.map_err(cut_short)?;
    Ok(body)
}

/// The first bytes of a stream that is not ZooKeeper's, as text when they read as text (an
/// HTTP server answers `HTTP`), else in hex.
fn looks_like(head: &[u8; 4]) -> String {
    match head.iter().all(|b| b.is_ascii_graphic()) {
        true => format!("it begins {:?}", String::from_utf8_lossy(head)),
        false => format!("it begins 0x{}", crate::text::hex(head)),
    }
}

fn closed(e: std::io::Error) -> Closed {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => Closed::Eof,
        _ => Closed::Io(e.to_string()),
    }
}

/// A read inside a packet that failed: the stream ended there, or broke.
fn cut_short(e: std::io::Error) -> Closed {
    match closed(e) {
        Closed::Eof => Closed::CutShort,
        other => other,
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
        let mut http: &[u8] = b"HTTP/1.1 400 Bad Request\r\n";
        let e = read_frame(&mut http).await.unwrap_err();
        assert!(e.to_string().contains(r#"it begins "HTTP""#), "{e}");
        let mut negative: &[u8] = &[0x80, 0, 0, 0, 1];
        let e = read_frame(&mut negative).await.unwrap_err();
        assert!(
            e.to_string().contains("negative length (-2147483648)"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_stream_that_ends_between_packets_is_closed_and_inside_one_cut_short() {
        let mut none: &[u8] = &[];
        assert!(matches!(read_frame(&mut none).await, Err(Closed::Eof)));
        let mut in_length: &[u8] = &[0, 0];
        assert!(matches!(
            read_frame(&mut in_length).await,
            Err(Closed::CutShort)
        ));
        let mut in_body: &[u8] = &[0, 0, 0, 4, 1];
        assert!(matches!(
            read_frame(&mut in_body).await,
            Err(Closed::CutShort)
        ));
        assert_eq!(Failure::from(Closed::Eof), Failure::NotServing);
        assert!(!Failure::from(Closed::CutShort).is_transient());
    }
}
