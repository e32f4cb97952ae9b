//! A fault-injecting TCP proxy for the tests: it forwards one loopback port to an upstream (an etcd,
//! a ZooKeeper member's client, quorum or election port) and, on command, blackholes traffic or
//! delays replies, on live connections as well as new ones.
//!
//! It also stamps each gRPC request a client sends (an HTTP/2 DATA frame bound upstream), so a
//! benchmark can tell when a holder last renewed.
//!
//! Owns its listener, its connections and their threads (one acceptor, two pumps per connection);
//! dropping it closes them all. It never reorders bytes, and never blocks the test that drives it.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long a pump holding delayed bytes blocks in `read` before looking at its queue and the mode
/// again, so that a mode change reaches bytes already queued.
const RECHECK: Duration = Duration::from_millis(5);

/// What the proxy does to the bytes it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways at once.
    Pass,
    /// Connections stay open (new ones are accepted) but every byte, either way, is dropped, as in
    /// a network partition. Only a close still passes.
    Blackhole,
    /// Bytes from the client are dropped, bytes from upstream pass: a one-way partition (a
    /// ZooKeeper follower still hears its leader, which no longer hears it).
    DropFromClient,
    /// Bytes from upstream are dropped, bytes from the client pass: the other way round.
    DropFromUpstream,
    /// Bytes from upstream reach the client this much later than they reached the proxy, in order;
    /// bytes from the client pass at once.
    DelayReplies(Duration),
}

/// A running proxy; stops on drop.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Joined on drop, so the listener is closed when `drop` returns.
    acceptor: Option<JoinHandle<()>>,
}

/// State the test and all proxy threads see.
struct Shared {
    mode: Mutex<Mode>,
    /// Both ends of every connection, for shutdown on drop; behind one lock with the stop flag so
    /// that no connection is added after the shutdown.
    conns: Mutex<Conns>,
    /// When the proxy read each DATA frame a client sent upstream.
    requests: Mutex<Vec<Instant>>,
    /// How long a new connection waits for an upstream that refuses it.
    patience: Duration,
}

struct Conns {
    stopping: bool,
    sockets: Vec<TcpStream>,
}

/// Which way a pump carries bytes; only replies are ever delayed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToUpstream,
    ToClient,
}

impl Proxy {
    /// Listens on a free 127.0.0.1 port, forwarding to `upstream`, in `Mode::Pass`.
    pub fn start(upstream: SocketAddr) -> Proxy {
        Proxy::start_patient(upstream, Duration::ZERO)
    }

    /// Like `start`, but a connection accepted while `upstream` refuses is held for up to
    /// `patience` while the proxy tries again (a ZooKeeper member's quorum port listens only
    /// while it leads).
    pub fn start_patient(upstream: SocketAddr, patience: Duration) -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("proxy cannot bind");
        let addr = listener
            .local_addr()
            .expect("proxy listener has no address");
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Pass),
            conns: Mutex::new(Conns {
                stopping: false,
                sockets: Vec::new(),
            }),
            requests: Mutex::new(Vec::new()),
            patience,
        });
        let state = Arc::clone(&shared);
        let acceptor = thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || accept_loop(listener, upstream, state))
            .expect("cannot start the proxy thread");
        Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (a TLS upstream is reached as `https://` on the same address).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Applies at once, to live connections too.
    pub fn set_mode(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// Closes every connection it carries, then passes bytes again: the end of a partition long
    /// enough for TCP to give up. A stream that lost bytes to a blackhole never resumes mid-message
    /// (ZooKeeper's peers would read garbage); both ends see a close and connect again.
    pub fn heal(&self) {
        // Under the connections' lock: a connection is either closed here, or tracked after the
        // mode is Pass, so none that lost bytes survives.
        let mut conns = self.shared.conns.lock().unwrap();
        for socket in conns.sockets.drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        *self.shared.mode.lock().unwrap() = Mode::Pass;
    }

    /// The instants at which the proxy read each gRPC request message (an HTTP/2 DATA frame) a
    /// client sent upstream since the last `clear_requests`; bytes dropped by a blackhole are not
    /// counted.
    pub fn requests(&self) -> Vec<Instant> {
        self.shared.requests.lock().unwrap().clone()
    }

    pub fn clear_requests(&self) {
        self.shared.requests.lock().unwrap().clear();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let mut conns = self.shared.conns.lock().unwrap();
        conns.stopping = true;
        for socket in conns.sockets.drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        drop(conns);
        // Wakes the acceptor, which sees `stopping` and returns, closing the listener.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

impl Shared {
    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap()
    }

    /// How long bytes going `direction` are held now.
    fn delay(&self, direction: Direction) -> Duration {
        match self.mode() {
            Mode::DelayReplies(delay) if direction == Direction::ToClient => delay,
            _ => Duration::ZERO,
        }
    }

    /// Whether bytes going `direction` are dropped now.
    fn drops(&self, direction: Direction) -> bool {
        match self.mode() {
            Mode::Blackhole => true,
            Mode::DropFromClient => direction == Direction::ToUpstream,
            Mode::DropFromUpstream => direction == Direction::ToClient,
            Mode::Pass | Mode::DelayReplies(_) => false,
        }
    }

    /// Registers both ends for shutdown on drop; false once the proxy is stopping.
    fn track(&self, client: &TcpStream, server: &TcpStream) -> bool {
        let mut conns = self.conns.lock().unwrap();
        if conns.stopping {
            return false;
        }
        for socket in [client, server] {
            if let Ok(clone) = socket.try_clone() {
                conns.sockets.push(clone);
            }
        }
        true
    }
}

fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.conns.lock().unwrap().stopping {
            return;
        }
        let Ok(client) = client else { continue };
        // Upstream down: dropping the client closes it, as a refused connection would.
        let Ok(server) = connect_within(upstream, shared.patience) else {
            continue;
        };
        if shared.track(&client, &server) {
            connect_pumps(client, server, &shared);
        }
    }
}

/// Connects to `upstream`, trying again for up to `patience` while it refuses. The client is
/// already accepted, so a refusal cannot be passed on as one: a ZooKeeper follower that connects
/// to a new leader a moment before the leader listens would see its connection accepted and then
/// closed, give up following and start a new election, where a refused connect is retried.
fn connect_within(upstream: SocketAddr, patience: Duration) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + patience;
    loop {
        match TcpStream::connect(upstream) {
            Ok(server) => return Ok(server),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => thread::sleep(RECHECK),
        }
    }
}

fn connect_pumps(client: TcpStream, server: TcpStream, shared: &Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let ends = (client.try_clone(), server.try_clone());
    let (Ok(client_out), Ok(server_out)) = ends else {
        return;
    };
    for (from, to, direction) in [
        (client, server_out, Direction::ToUpstream),
        (server, client_out, Direction::ToClient),
    ] {
        let shared = Arc::clone(shared);
        thread::spawn(move || Pump::new(from, to, direction, shared).run());
    }
}

/// Carries one direction of one connection, holding chunks until they are due.
struct Pump {
    from: TcpStream,
    to: TcpStream,
    direction: Direction,
    shared: Arc<Shared>,
    /// Chunks read but not yet written, with the instant each arrived.
    queue: VecDeque<(Instant, Vec<u8>)>,
    /// Finds the requests in what a client sends (None for replies).
    frames: Option<Frames>,
}

impl Pump {
    fn new(from: TcpStream, to: TcpStream, direction: Direction, shared: Arc<Shared>) -> Pump {
        let queue = VecDeque::new();
        let frames = (direction == Direction::ToUpstream).then(Frames::new);
        Pump {
            from,
            to,
            direction,
            shared,
            queue,
            frames,
        }
    }

    fn run(mut self) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if self.deliver_due().is_err() {
                return self.close_both();
            }
            let wake = self.next_wake();
            if self.from.set_read_timeout(wake).is_err() {
                return self.close_both();
            }
            match self.from.read(&mut buf) {
                Ok(0) => return self.finish(),
                Ok(n) => self.take(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.close_both(),
            }
        }
    }

    /// Queues a chunk just read, unless bytes going its way are dropped now.
    fn take(&mut self, chunk: &[u8]) {
        if !self.shared.drops(self.direction) {
            let now = Instant::now();
            if let Some(frames) = &mut self.frames {
                let requests = frames.data_frames_in(chunk);
                let mut stamps = self.shared.requests.lock().unwrap();
                stamps.extend(std::iter::repeat_n(now, requests));
            }
            self.queue.push_back((now, chunk.to_vec()));
        }
    }

    /// Writes every queued chunk whose time has come; drops them all while its way is cut.
    fn deliver_due(&mut self) -> std::io::Result<()> {
        if self.shared.drops(self.direction) {
            self.queue.clear();
            return Ok(());
        }
        let delay = self.shared.delay(self.direction);
        while let Some((arrived, chunk)) = self.queue.front() {
            if *arrived + delay > Instant::now() {
                break;
            }
            self.to.write_all(chunk)?;
            self.queue.pop_front();
        }
        Ok(())
    }

    /// When `read` must return without input: when the first queued chunk is due, or sooner to
    /// look at the mode again; never while nothing is queued.
    fn next_wake(&self) -> Option<Duration> {
        let (arrived, _) = self.queue.front()?;
        let due = *arrived + self.shared.delay(self.direction);
        let left = due.saturating_duration_since(Instant::now());
        Some(left.clamp(Duration::from_millis(1), RECHECK))
    }

    /// The sender closed its side: deliver what is still queued on schedule, then pass the EOF on.
    fn finish(mut self) {
        while !self.queue.is_empty() {
            if self.deliver_due().is_err() {
                return self.close_both();
            }
            thread::sleep(RECHECK);
        }
        let _ = self.to.shutdown(Shutdown::Write);
    }

    fn close_both(self) {
        let _ = self.from.shutdown(Shutdown::Both);
        let _ = self.to.shutdown(Shutdown::Both);
    }
}

/// Splits the bytes a client sends into HTTP/2 frames (after the connection preface) and counts
/// the DATA frames that carry bytes: each is a gRPC request message (PING, SETTINGS, HEADERS and
/// WINDOW_UPDATE frames are not).
struct Frames {
    /// Bytes of the client preface still to skip.
    preface_left: usize,
    /// The start of a frame whose end has not arrived yet.
    partial: Vec<u8>,
}

impl Frames {
    /// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`
    const PREFACE_LEN: usize = 24;
    /// Length (3 bytes), type, flags, stream id (4 bytes).
    const HEADER_LEN: usize = 9;
    const DATA: u8 = 0;

    fn new() -> Frames {
        Frames {
            preface_left: Self::PREFACE_LEN,
            partial: Vec::new(),
        }
    }

    /// How many non-empty DATA frames end in `chunk`.
    fn data_frames_in(&mut self, chunk: &[u8]) -> usize {
        let skip = self.preface_left.min(chunk.len());
        self.preface_left -= skip;
        self.partial.extend_from_slice(&chunk[skip..]);
        let mut count = 0;
        let mut at = 0;
        while let Some(header) = self.partial.get(at..at + Self::HEADER_LEN) {
            let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let end = at + Self::HEADER_LEN + length;
            if end > self.partial.len() {
                break;
            }
            if header[3] == Self::DATA && length > 0 {
                count += 1;
            }
            at = end;
        }
        self.partial.drain(..at);
        count
    }
}

#[cfg(test)]
mod tests {
    // A `harness = false` bench compiles this module too (with --cfg test), without its #[test]
    // functions: what only they use is unused there.
    #![allow(unused_imports, dead_code)]

    use super::Frames;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, 0, 0, 0, 0, 1];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn frames_count_non_empty_data_frames_after_the_preface() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(4, &[0; 6])); // SETTINGS
        bytes.extend(frame(0, b"request one"));
        bytes.extend(frame(6, &[0; 8])); // PING
        bytes.extend(frame(0, b"")); // empty DATA with END_STREAM: no message
        bytes.extend(frame(0, b"request two"));
        assert_eq!(Frames::new().data_frames_in(&bytes), 2);
    }

    #[test]
    fn a_frame_split_across_reads_counts_once_in_the_read_that_ends_it() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(0, &[7; 300]));
        let mut frames = Frames::new();
        let counts: Vec<usize> = bytes.chunks(10).map(|c| frames.data_frames_in(c)).collect();
        assert_eq!(counts.iter().sum::<usize>(), 1);
        assert_eq!(counts.last(), Some(&1));
    }
}
