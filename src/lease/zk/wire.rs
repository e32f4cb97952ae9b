//! ZooKeeper's wire format (jute, big-endian, each packet behind a 4-byte length): the records
//! of the requests leasewrap sends and of their answers, as pure functions of bytes. Nothing here
//! does I/O; `conn` frames and sends what this builds.
//!
//! The layouts are those of `zookeeper.jute` in ZooKeeper 3.5 and later; only what the backend
//! uses is here (create2, delete, exists, getData, setData, getChildren2, getACL, sync, check
//! and multi, auth, SASL, ping, closeSession, and watch events).

use std::fmt;

/// The most a packet from the server may hold: ZooKeeper's own `jute.maxbuffer` default, 1 MiB,
/// plus its header. A longer length is a broken or hostile stream, never allocated.
pub const MAX_PACKET: usize = 1024 * 1024 + 1024;

/// The bytes of a reply's header (xid, zxid, error code), before its body.
pub const REPLY_HEADER: usize = 16;

/// Request types (`ZooDefs.OpCode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Create2,
    Delete,
    Exists,
    GetData,
    SetData,
    GetAcl,
    GetChildren2,
    Sync,
    Ping,
    Check,
    Multi,
    Auth,
    Sasl,
    CloseSession,
}

impl Op {
    pub const fn code(self) -> i32 {
        match self {
            Op::Delete => 2,
            Op::Exists => 3,
            Op::GetData => 4,
            Op::SetData => 5,
            Op::GetAcl => 6,
            Op::Sync => 9,
            Op::Ping => 11,
            Op::GetChildren2 => 12,
            Op::Check => 13,
            Op::Multi => 14,
            Op::Create2 => 15,
            Op::Auth => 100,
            Op::Sasl => 102,
            Op::CloseSession => -11,
        }
    }
}

/// The xids of packets that are not answers to a numbered request.
pub const WATCH_XID: i32 = -1;
pub const PING_XID: i32 = -2;
pub const AUTH_XID: i32 = -4;

/// A server error code (`KeeperException.Code`), as the reply header carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code(pub i32);

impl Code {
    pub const OK: Code = Code(0);
    pub const RUNTIME_INCONSISTENCY: Code = Code(-2);
    pub const CONNECTION_LOSS: Code = Code(-4);
    pub const NO_NODE: Code = Code(-101);
    pub const NO_AUTH: Code = Code(-102);
    pub const BAD_VERSION: Code = Code(-103);
    pub const NODE_EXISTS: Code = Code(-110);
    pub const NOT_EMPTY: Code = Code(-111);
    pub const SESSION_EXPIRED: Code = Code(-112);
    pub const INVALID_ACL: Code = Code(-114);
    pub const AUTH_FAILED: Code = Code(-115);
    pub const SESSION_MOVED: Code = Code(-118);
    pub const SASL_REQUIRED: Code = Code(-124);

    /// What the code means, in ZooKeeper's own words where it has them.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "ok",
            -1 => "system error",
            -2 => "runtime inconsistency",
            -4 => "connection loss",
            -5 => "marshalling error",
            -6 => "unimplemented",
            -7 => "operation timeout",
            -8 => "bad arguments",
            -13 => "new config has no quorum",
            -14 => "reconfiguration in progress",
            -101 => "no node",
            -102 => "not authorised (no permission)",
            -103 => "bad version",
            -108 => "ephemeral nodes may not have children",
            -110 => "node exists",
            -111 => "node not empty",
            -112 => "session expired",
            -114 => "invalid ACL",
            -115 => "authentication failed",
            -118 => "session moved",
            -119 => "not a read-only call",
            -124 => "session closed: the server requires SASL authentication",
            -125 => "quota exceeded",
            -127 => "request throttled",
            _ => "unknown error",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Permissions of an ACL entry (`ZooDefs.Perms`).
pub mod perms {
    pub const READ: i32 = 1;
    pub const WRITE: i32 = 2;
    pub const CREATE: i32 = 4;
    pub const DELETE: i32 = 8;
    pub const ADMIN: i32 = 16;
    pub const ALL: i32 = READ | WRITE | CREATE | DELETE | ADMIN;
}

/// One ACL entry: who (scheme and id) may do what (perms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    pub perms: i32,
    pub scheme: String,
    pub id: String,
}

impl Acl {
    /// Everyone, with `perms`.
    pub fn anyone(perms: i32) -> Acl {
        Acl {
            perms,
            scheme: "world".into(),
            id: "anyone".into(),
        }
    }

    /// Every identity the creating session has authenticated as (digest, SASL, x509), with
    /// `perms`: the server writes the session's own ids in place of this entry.
    pub fn creator(perms: i32) -> Acl {
        Acl {
            perms,
            scheme: "auth".into(),
            id: String::new(),
        }
    }

    /// Whether this entry lets a client that is not the creator change the node or its children:
    /// anything beyond READ to the world, or to an address.
    pub fn is_open(&self) -> bool {
        let anybody = matches!(self.scheme.as_str(), "world" | "ip");
        anybody && self.perms & !perms::READ != 0
    }
}

/// A node's metadata (`Stat`), the parts leasewrap reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub czxid: i64,
    pub mzxid: i64,
    pub ctime: i64,
    pub mtime: i64,
    pub version: i32,
    pub cversion: i32,
    pub aversion: i32,
    /// The session that owns an ephemeral node; 0 for a persistent one.
    pub ephemeral_owner: i64,
    pub data_length: i32,
    pub num_children: i32,
    pub pzxid: i64,
}

/// How a node is created (`CreateMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Persistent,
    EphemeralSequential,
}

impl Mode {
    const fn flags(self) -> i32 {
        match self {
            Mode::Persistent => 0,
            Mode::EphemeralSequential => 3,
        }
    }
}

/// A watch event (`WatcherEvent`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// NodeCreated 1, NodeDeleted 2, NodeDataChanged 3, NodeChildrenChanged 4; -1 for a
    /// change of the session's state.
    pub kind: i32,
    pub state: i32,
    pub path: String,
}

pub const NODE_DELETED: i32 = 2;

/// A record being written.
#[derive(Default)]
pub struct Out(Vec<u8>);

impl Out {
    /// A request packet: the length is filled in by [`Out::finish`].
    pub fn request(xid: i32, op: Op) -> Out {
        let mut out = Out(vec![0; 4]);
        out.int(xid).int(op.code());
        out
    }

    /// The packet, its length in front.
    pub fn finish(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_be_bytes());
        self.0
    }

    pub fn int(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn long(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.0.push(u8::from(v));
        self
    }

    pub fn buffer(&mut self, v: &[u8]) -> &mut Self {
        self.int(v.len() as i32);
        self.0.extend_from_slice(v);
        self
    }

    pub fn string(&mut self, v: &str) -> &mut Self {
        self.buffer(v.as_bytes())
    }

    pub fn acls(&mut self, acls: &[Acl]) -> &mut Self {
        self.int(acls.len() as i32);
        for a in acls {
            self.int(a.perms).string(&a.scheme).string(&a.id);
        }
        self
    }
}

/// What one op of a multi does.
#[derive(Clone, Debug)]
pub enum MultiOp {
    /// The node at the path exists (any version).
    Check(String),
    Create {
        path: String,
        data: Vec<u8>,
        acls: Vec<Acl>,
    },
    SetData {
        path: String,
        data: Vec<u8>,
    },
}

impl MultiOp {
    fn write(&self, out: &mut Out) {
        let header = |out: &mut Out, op: Op| {
            out.int(op.code()).bool(false).int(-1);
        };
        match self {
            MultiOp::Check(path) => {
                header(out, Op::Check);
                out.string(path).int(-1);
            }
            MultiOp::Create { path, data, acls } => {
                header(out, Op::Create2);
                out.string(path)
                    .buffer(data)
                    .acls(acls)
                    .int(Mode::Persistent.flags());
            }
            MultiOp::SetData { path, data } => {
                header(out, Op::SetData);
                out.string(path).buffer(data).int(-1);
            }
        }
    }
}

/// The body of a request (after its header), as the server reads it.
#[derive(Clone, Debug)]
pub enum Body {
    Create {
        path: String,
        data: Vec<u8>,
        acls: Vec<Acl>,
        mode: Mode,
    },
    Delete(String),
    /// `exists` or `getData` of a path, with a watch or not.
    Read {
        op: Op,
        path: String,
        watch: bool,
    },
    GetAcl(String),
    Sync(String),
    Multi(Vec<MultiOp>),
    Sasl(Vec<u8>),
    Empty,
}

impl Body {
    pub fn write(&self, out: &mut Out) {
        match self {
            Body::Create {
                path,
                data,
                acls,
                mode,
            } => {
                out.string(path).buffer(data).acls(acls).int(mode.flags());
            }
            Body::Delete(path) => {
                out.string(path).int(-1);
            }
            Body::Read { path, watch, .. } => {
                out.string(path).bool(*watch);
            }
            Body::GetAcl(path) | Body::Sync(path) => {
                out.string(path);
            }
            Body::Multi(ops) => {
                ops.iter().for_each(|op| op.write(out));
                out.int(-1).bool(true).int(-1);
            }
            Body::Sasl(token) => {
                out.buffer(token);
            }
            Body::Empty => {}
        }
    }

    /// The path the request names, if it names one (for chroots and watches).
    pub fn path(&self) -> Option<&str> {
        match self {
            Body::Create { path, .. }
            | Body::Delete(path)
            | Body::Read { path, .. }
            | Body::GetAcl(path)
            | Body::Sync(path) => Some(path),
            _ => None,
        }
    }
}

/// The connect request of a new session (`session_id` 0) or of one being moved here.
pub fn connect_request(
    last_zxid: i64,
    timeout_ms: i32,
    session_id: i64,
    password: &[u8],
) -> Vec<u8> {
    let mut out = Out(vec![0; 4]);
    out.int(0)
        .long(last_zxid)
        .int(timeout_ms)
        .long(session_id)
        .buffer(password)
        .bool(false);
    out.finish()
}

/// An `addauth`: `scheme` with its credentials.
pub fn auth_request(scheme: &str, auth: &[u8]) -> Vec<u8> {
    let mut out = Out::request(AUTH_XID, Op::Auth);
    out.int(0).string(scheme).buffer(auth);
    out.finish()
}

/// The server's answer to a connect request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connected {
    /// The negotiated session timeout; 0 when the session is gone (expired or closed).
    pub timeout_ms: i32,
    pub session_id: i64,
    pub password: Vec<u8>,
}

/// Why a packet could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a malformed packet from the server: {}", self.0)
    }
}

/// A record being read, from the start of a packet's body.
pub struct In<'a>(&'a [u8]);

impl<'a> In<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        In(bytes)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.0.len() < n {
            return Err(Malformed("it ends early"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub fn int(&mut self) -> Result<i32, Malformed> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn long(&mut self) -> Result<i64, Malformed> {
        let b = self.take(8)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }

    pub fn bool(&mut self) -> Result<bool, Malformed> {
        Ok(self.take(1)?[0] != 0)
    }

    /// A buffer; -1 (null) reads as empty.
    pub fn buffer(&mut self) -> Result<Vec<u8>, Malformed> {
        let len = self.int()?;
        if len < 0 {
            return Ok(Vec::new());
        }
        Ok(self.take(len as usize)?.to_vec())
    }

    pub fn string(&mut self) -> Result<String, Malformed> {
        String::from_utf8(self.buffer()?).map_err(|_| Malformed("a string is not UTF-8"))
    }

    /// A vector's length: never more than the bytes left could hold, at `each` bytes an item.
    fn count(&mut self, each: usize) -> Result<usize, Malformed> {
        let n = self.int()?;
        match usize::try_from(n) {
            Ok(n) if n * each <= self.0.len() => Ok(n),
            Ok(_) => Err(Malformed("a vector longer than its packet")),
            Err(_) => Ok(0),
        }
    }

    pub fn strings(&mut self) -> Result<Vec<String>, Malformed> {
        let n = self.count(4)?;
        (0..n).map(|_| self.string()).collect()
    }

    pub fn stat(&mut self) -> Result<Stat, Malformed> {
        Ok(Stat {
            czxid: self.long()?,
            mzxid: self.long()?,
            ctime: self.long()?,
            mtime: self.long()?,
            version: self.int()?,
            cversion: self.int()?,
            aversion: self.int()?,
            ephemeral_owner: self.long()?,
            data_length: self.int()?,
            num_children: self.int()?,
            pzxid: self.long()?,
        })
    }

    pub fn acls(&mut self) -> Result<Vec<Acl>, Malformed> {
        let n = self.count(12)?;
        (0..n)
            .map(|_| {
                Ok(Acl {
                    perms: self.int()?,
                    scheme: self.string()?,
                    id: self.string()?,
                })
            })
            .collect()
    }

    pub fn event(&mut self) -> Result<Event, Malformed> {
        Ok(Event {
            kind: self.int()?,
            state: self.int()?,
            path: self.string()?,
        })
    }

    pub fn connected(&mut self) -> Result<Connected, Malformed> {
        let _protocol = self.int()?;
        let timeout_ms = self.int()?;
        let session_id = self.long()?;
        let password = self.buffer()?;
        // A read-only flag may follow; leasewrap never asks for read-only sessions.
        Ok(Connected {
            timeout_ms,
            session_id,
            password,
        })
    }

    /// The results of a multi: for each op, Ok or the code it failed with.
    pub fn multi(&mut self) -> Result<Vec<Result<(), Code>>, Malformed> {
        let mut out = Vec::new();
        loop {
            let (kind, done, _err) = (self.int()?, self.bool()?, self.int()?);
            if done {
                return Ok(out);
            }
            match kind {
                -1 => out.push(Err(Code(self.int()?))),
                k if k == Op::Create2.code() => {
                    self.string()?;
                    self.stat()?;
                    out.push(Ok(()));
                }
                1 => {
                    self.string()?;
                    out.push(Ok(()));
                }
                k if k == Op::SetData.code() => {
                    self.stat()?;
                    out.push(Ok(()));
                }
                k if k == Op::Check.code() || k == Op::Delete.code() => out.push(Ok(())),
                _ => return Err(Malformed("an unknown op in a multi's results")),
            }
        }
    }
}

/// The reply header: which request, the zxid the server had reached, and the error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub xid: i32,
    pub zxid: i64,
    pub err: Code,
}

impl Reply {
    pub fn read(input: &mut In<'_>) -> Result<Reply, Malformed> {
        Ok(Reply {
            xid: input.int()?,
            zxid: input.long()?,
            err: Code(input.int()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_its_length_then_xid_type_and_body() {
        let mut out = Out::request(7, Op::Exists);
        Body::Read {
            op: Op::Exists,
            path: "/a".into(),
            watch: true,
        }
        .write(&mut out);
        let bytes = out.finish();
        assert_eq!(
            bytes,
            [0, 0, 0, 15, 0, 0, 0, 7, 0, 0, 0, 3, 0, 0, 0, 2, b'/', b'a', 1]
        );
    }

    #[test]
    fn a_connect_request_names_the_session_and_its_password() {
        let bytes = connect_request(0x10, 4000, 0x55, &[9; 16]);
        let mut r = In::new(&bytes[4..]);
        assert_eq!(r.int().unwrap(), 0, "protocol version");
        assert_eq!(r.long().unwrap(), 0x10, "last zxid seen");
        assert_eq!(r.int().unwrap(), 4000);
        assert_eq!(r.long().unwrap(), 0x55);
        assert_eq!(r.buffer().unwrap(), [9; 16]);
        assert!(!r.bool().unwrap(), "not read-only");
        assert_eq!(bytes.len(), 4 + 4 + 8 + 4 + 8 + 4 + 16 + 1);
    }

    #[test]
    fn a_multi_reads_each_ops_result_and_the_failed_ones_code() {
        let mut out = Out::default();
        out.int(13).bool(false).int(0);
        out.int(-1).bool(false).int(-101).int(-101);
        out.int(-1).bool(true).int(-1);
        let results = In::new(&out.0).multi().unwrap();
        assert_eq!(results, [Ok(()), Err(Code::NO_NODE)]);
    }

    #[test]
    fn a_vector_longer_than_its_packet_is_refused_before_anything_is_allocated() {
        let mut out = Out::default();
        out.int(i32::MAX);
        assert_eq!(
            In::new(&out.0).strings(),
            Err(Malformed("a vector longer than its packet"))
        );
        assert_eq!(In::new(&[0, 0]).int(), Err(Malformed("it ends early")));
    }

    #[test]
    fn a_stat_reads_back_in_jute_order() {
        let mut out = Out::default();
        out.long(1).long(2).long(3).long(4).int(5).int(6).int(7);
        out.long(8).int(9).int(10).long(11);
        let stat = In::new(&out.0).stat().unwrap();
        assert_eq!(stat.czxid, 1);
        assert_eq!(stat.ephemeral_owner, 8);
        assert_eq!(stat.pzxid, 11);
    }

    #[test]
    fn only_write_delete_create_or_admin_to_anybody_is_an_open_acl() {
        assert!(Acl::anyone(perms::ALL).is_open());
        assert!(!Acl::anyone(perms::READ).is_open());
        assert!(!Acl::creator(perms::ALL).is_open());
        let ip = Acl {
            perms: perms::DELETE,
            scheme: "ip".into(),
            id: "10.0.0.0/8".into(),
        };
        assert!(ip.is_open());
    }
}
