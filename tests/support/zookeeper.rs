//! Real ZooKeeper 3.8 servers for the integration tests (Debian's jars, the image's JRE): one
//! standalone server (`Zk`) or a three-member `Ensemble`, each in its own temp dir on free loopback
//! ports, with a small tickTime so that session timeouts of 2 s to 4 s are in range.
//!
//! In an ensemble every member-to-member link (quorum and election port, each direction) goes
//! through a `Proxy` of its own: member i's zoo.cfg names member j at the proxy i→j. So one member
//! can be cut off from the other two (`isolate`) while its own clients keep their connections to
//! it, as a follower behind a network partition does. Reconfiguration stays off (ZooKeeper's
//! default), so no member ever adopts another member's view of those addresses.
//!
//! Owns every server process it starts: each is killed by its own pid (SIGKILL) and reaped on
//! drop, and dies with the test process (PR_SET_PDEATHSIG) even when never dropped, as the
//! `shared` server is. It never skips: a missing JRE or jar is a panic naming the Debian packages.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Once, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::etcd::{free_port, spawn_tied_to_process};
use super::proxy::{Mode, Proxy};

/// ZooKeeper's tick. Sessions are clamped to [2, 20] ticks: 0.4 s to 4 s, so that leasewrap's
/// `--ttl 2s`..`4s` are granted as asked; a follower cut off from the leader serves its stale
/// view for up to `SYNC_LIMIT` ticks.
pub const TICK: Duration = Duration::from_millis(200);
/// Ticks a follower may lag (and a cut-off one keeps serving) before it drops out: 2 s.
pub const SYNC_LIMIT: u32 = 10;
/// Ticks a follower has to connect and sync to a new leader: 5 s.
const INIT_LIMIT: u32 = 25;
/// The jars of Debian's `zookeeper` package (3.8) the server and the CLI run from.
const JARS: [&str; 3] = [
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/slf4j-simple.jar",
    "/usr/share/java/servlet-api.jar",
];
/// Netty, for the secure client port (Debian's libnetty-java; its netty-all.jar is empty).
const NETTY_JARS: [&str; 7] = [
    "/usr/share/java/netty-buffer.jar",
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-common.jar",
    "/usr/share/java/netty-handler.jar",
    "/usr/share/java/netty-resolver.jar",
    "/usr/share/java/netty-transport.jar",
    "/usr/share/java/netty-transport-native-unix-common.jar",
];
/// The CLI logs nothing (slf4j-nop) so that its stdout is only the command's answer.
const CLI_JARS: [&str; 2] = [
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/slf4j-nop.jar",
];
/// A small heap and the serial collector: about half the resident memory of the defaults, and
/// no concurrent GC threads competing for the test box's two cores.
const SERVER_JVM: [&str; 4] = [
    "-Xms16m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-Djava.net.preferIPv4Stack=true",
];
/// How long a server may take to serve (a JVM start takes ~1.5 s on an idle box).
const START_BOUND: Duration = Duration::from_secs(40);
/// How often a starting server is asked again.
const POLL: Duration = Duration::from_millis(20);
/// Tries with fresh ports when a port found free was taken before the server could bind it.
const START_TRIES: u32 = 3;
/// Bound on one four-letter-word exchange (a stopped member never answers).
const FOUR_LETTER_BOUND: Duration = Duration::from_millis(1000);

/// How long a member link holds a new connection while the member it leads to does not listen
/// yet (a new leader opens its quorum port only once elected); under initLimit x tickTime, the
/// time a follower has to sync.
const LINK_PATIENCE: Duration = Duration::from_secs(3);

/// The Debian packages the ZooKeeper tests need, for every message about a missing piece.
pub const INSTALL_HINT: &str = "install the Debian packages zookeeper and default-jre-headless \
                                (scripts/test.sh does)";

/// What keeps a ZooKeeper from starting here: a missing `java` or jar, in words naming the
/// packages; None when everything is in place.
pub fn missing(java: &Path, jars: &[&str]) -> Option<String> {
    if !java.is_file() {
        return Some(format!(
            "ZooKeeper tests: no Java runtime at {}; {INSTALL_HINT}",
            java.display()
        ));
    }
    let absent: Vec<&str> = jars
        .iter()
        .copied()
        .filter(|j| !Path::new(j).is_file())
        .collect();
    (!absent.is_empty()).then(|| {
        format!(
            "ZooKeeper tests: {} missing; {INSTALL_HINT}",
            absent.join(", ")
        )
    })
}

/// The `java` to run: `LEASEWRAP_TEST_JAVA`, else the first on PATH (else /usr/bin/java).
pub fn java() -> PathBuf {
    if let Some(java) = std::env::var_os("LEASEWRAP_TEST_JAVA") {
        return java.into();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|dir| dir.join("java"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| PathBuf::from("/usr/bin/java"))
}

/// `java`, once everything it needs is known to be there; panics with the install hint.
#[track_caller]
fn checked_java(jars: &[&str]) -> PathBuf {
    let java = java();
    let all: Vec<&str> = jars.iter().chain(&NETTY_JARS).copied().collect();
    if let Some(why) = missing(&java, &all) {
        panic!("{why}");
    }
    java
}

/// How a test server differs from the harness's default (tickTime 200 ms, every four-letter
/// word allowed).
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// `4lw.commands.whitelist`; None: every word (`*`). `Some("srvr")` is ZooKeeper's default.
    pub whitelist: Option<&'static str>,
    /// tickTime; None: [`TICK`].
    pub tick: Option<Duration>,
    /// More zoo.cfg lines (`maxSessionTimeout=1000`, ...).
    pub extra: Vec<String>,
}

/// One standalone server for a whole test binary; never stopped by drop, it dies with the
/// process. Tests sharing it keep to their own `unique_name` and must not kill or pause it.
pub fn shared() -> &'static Zk {
    static SHARED: OnceLock<Zk> = OnceLock::new();
    SHARED.get_or_init(Zk::start)
}

/// A lease name no other test in this process uses: `TEST-N` (names hold no '/').
pub fn unique_name(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{test}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A standalone ZooKeeper server.
pub struct Zk {
    member: Member,
    /// Last, so it is removed only after the process is dead.
    _dir: TempDir,
}

impl Zk {
    /// Starts a standalone server and waits until it serves.
    #[track_caller]
    pub fn start() -> Zk {
        Zk::start_with(&Setup::default())
    }

    /// Starts a standalone server set up as `setup` says.
    #[track_caller]
    pub fn start_with(setup: &Setup) -> Zk {
        Zk::launch(setup, &[], &[])
    }

    /// A server with `setup`, more zoo.cfg lines `extra`, and JVM options `jvm`.
    #[track_caller]
    fn launch(setup: &Setup, extra: &[String], jvm: &[String]) -> Zk {
        let java = checked_java(&JARS);
        let dir = scratch_dir();
        for attempt in 1..=START_TRIES {
            let mut member = Member::new(dir.path(), 0);
            member.write_config(setup, &[extra, &setup.extra[..]].concat());
            member.jvm = jvm.to_vec();
            member.launch(&java);
            match member.wait_serving() {
                Ok(()) => return Zk { member, _dir: dir },
                Err(why) if attempt < START_TRIES && member.port_taken() => {
                    member.kill();
                    let _ = why;
                }
                Err(why) => panic!("{}", member.report(&why)),
            }
        }
        unreachable!("the last try panics or returns")
    }

    /// `127.0.0.1:PORT`, a connect string for `--zookeeper`.
    pub fn connect(&self) -> String {
        self.member.connect()
    }

    pub fn addr(&self) -> SocketAddr {
        self.member.addr()
    }

    /// The client port, for four-letter words.
    pub fn port(&self) -> u16 {
        self.member.client
    }

    /// The server's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.member.child.as_ref().map(Child::id)
    }

    /// Its answer to `srvr`.
    pub fn srvr(&self) -> Result<String, String> {
        four_letter(self.member.client, "srvr")
    }

    /// SIGKILL now, and reap.
    pub fn kill(&mut self) {
        self.member.kill();
    }

    /// Everything the server logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.member.log()).unwrap_or_default()
    }

    /// Its answer to the four-letter word `word`.
    pub fn four_letter(&self, word: &str) -> Result<String, String> {
        four_letter(self.member.client, word)
    }
}

/// A standalone server that also speaks TLS on a secure client port (Netty), takes a client
/// certificate as an x509 identity, and SASL DIGEST-MD5 users from a JAAS file: `bob` (with
/// [`Secure::SASL_PASSWORD`]) for leasewrap and `eve` for a neighbour. Its CA signed a client
/// certificate for leasewrap (`tls.cert`, CN `leasewrap-test-client`) and one for another
/// application (`other_cert`, CN `other-app`).
pub struct Secure {
    pub zk: Zk,
    pub tls: super::etcd::Tls,
    pub other_cert: (PathBuf, PathBuf),
    pub secure_port: u16,
    /// Holds the certificates and the JAAS file.
    _files: TempDir,
}

impl Secure {
    pub const SASL_USER: &'static str = "bob";
    pub const SASL_PASSWORD: &'static str = "bob-secret";
    /// A JAAS user whose password is not ASCII, but fits ISO 8859-1.
    pub const LATIN1_USER: &'static str = "carl";
    pub const LATIN1_PASSWORD: &'static str = "pässwort";

    /// `127.0.0.1:SECURE_PORT`: a connect string for TLS.
    pub fn tls_connect(&self) -> String {
        format!("127.0.0.1:{}", self.secure_port)
    }
}

/// The secure server for a whole test binary (see [`Secure`]).
pub fn shared_secure() -> &'static Secure {
    static SHARED: OnceLock<Secure> = OnceLock::new();
    SHARED.get_or_init(start_secure)
}

#[track_caller]
fn start_secure() -> Secure {
    let files = scratch_dir();
    let dir = files.path();
    let tls = super::etcd::Tls::generate(dir, true);
    super::etcd::Tls::leaf(dir, "client", "/CN=other-app");
    let other = (dir.join("other.crt"), dir.join("other.key"));
    fs::rename(dir.join("client.crt"), &other.0).expect("keep the other certificate");
    fs::rename(dir.join("client.key"), &other.1).expect("keep the other key");
    super::etcd::Tls::leaf(dir, "client", "/CN=leasewrap-test-client");
    let (pem, jaas) = write_server_files(dir, &tls);
    let secure_port = free_port();
    let extra = vec![
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory".into(),
        format!("secureClientPort={secure_port}"),
        "secureClientPortAddress=127.0.0.1".into(),
        format!("ssl.keyStore.location={}", pem.display()),
        "ssl.keyStore.type=PEM".into(),
        format!("ssl.trustStore.location={}", tls.ca.display()),
        "ssl.trustStore.type=PEM".into(),
        "ssl.clientAuth=need".into(),
        "authProvider.x509=org.apache.zookeeper.server.auth.X509AuthenticationProvider".into(),
        "authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider".into(),
    ];
    let jvm = vec![format!(
        "-Djava.security.auth.login.config={}",
        jaas.display()
    )];
    let zk = Zk::launch(&Setup::default(), &extra, &jvm);
    Secure {
        zk,
        tls,
        other_cert: other,
        secure_port,
        _files: files,
    }
}

/// The server's key and certificate in one PEM, and the JAAS file of its SASL users.
fn write_server_files(dir: &Path, tls: &super::etcd::Tls) -> (PathBuf, PathBuf) {
    let key_and_cert = [&tls.server_key, &tls.server_cert]
        .iter()
        .map(|p| fs::read_to_string(p).expect("read the server's PEM"))
        .collect::<String>();
    let pem = dir.join("server.pem");
    fs::write(&pem, key_and_cert).expect("write the server's PEM");
    (pem, write_jaas(dir))
}

/// The JAAS file of the SASL users: `bob`, `carl` and `eve`, in UTF-8.
fn write_jaas(dir: &Path) -> PathBuf {
    let jaas = dir.join("jaas.conf");
    let users = [
        (Secure::SASL_USER, Secure::SASL_PASSWORD),
        (Secure::LATIN1_USER, Secure::LATIN1_PASSWORD),
        ("eve", "eve-secret"),
    ];
    let lines: Vec<String> = users
        .iter()
        .map(|(user, password)| format!("  user_{user}=\"{password}\""))
        .collect();
    let text = format!(
        "Server {{\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n{};\n}};\n",
        lines.join("\n")
    );
    fs::write(&jaas, text).expect("write the JAAS file");
    jaas
}

/// A standalone server that requires SASL of every client (`zookeeper.enforce.auth`), with the
/// JAAS users of [`Secure`]: any other client's first request is answered with -124 and its
/// connection closed. The temp dir holds the JAAS file.
pub fn start_enforcing_sasl() -> (Zk, TempDir) {
    let files = scratch_dir();
    let jaas = write_jaas(files.path());
    let extra = vec![
        "authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider".into(),
    ];
    let jvm = vec![
        format!("-Djava.security.auth.login.config={}", jaas.display()),
        "-Dzookeeper.enforce.auth.enabled=true".into(),
        "-Dzookeeper.enforce.auth.schemes=sasl".into(),
    ];
    (Zk::launch(&Setup::default(), &extra, &jvm), files)
}

/// Member `from`'s way to member `to`: a proxy for each of `to`'s quorum and election ports.
struct Link {
    from: usize,
    to: usize,
    quorum: Proxy,
    election: Proxy,
}

impl Link {
    fn start(from: usize, to: &Member) -> Link {
        let local = |port: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        Link {
            from,
            to: to.index,
            quorum: Proxy::start_patient(local(to.quorum), LINK_PATIENCE),
            election: Proxy::start_patient(local(to.election), LINK_PATIENCE),
        }
    }

    fn touches(&self, i: usize) -> bool {
        self.from == i || self.to == i
    }
}

/// Three ZooKeeper members on loopback forming one ensemble, every link between two members
/// through a proxy.
pub struct Ensemble {
    members: Vec<Member>,
    links: Vec<Link>,
    /// Last, so it is removed only after the processes are dead.
    _dir: TempDir,
}

impl Ensemble {
    pub const SIZE: usize = 3;

    /// Starts all members and waits until each serves, with one leader.
    #[track_caller]
    pub fn start() -> Ensemble {
        Ensemble::start_with(&Setup::default(), |_| Vec::new())
    }

    /// Starts all members set up as `setup` says, member `i` with the zoo.cfg lines `own(i)`
    /// too (`maxSessionTimeout=1000` on one of them, say).
    #[track_caller]
    pub fn start_with(setup: &Setup, own: impl Fn(usize) -> Vec<String>) -> Ensemble {
        let java = checked_java(&JARS);
        let dir = scratch_dir();
        for attempt in 1..=START_TRIES {
            let (mut members, links) = Ensemble::configure(dir.path(), setup, &own);
            members.iter_mut().for_each(|m| m.launch(&java));
            match wait_all_serving(&mut members) {
                Ok(()) => {
                    return Ensemble {
                        members,
                        links,
                        _dir: dir,
                    }
                }
                Err(_) if attempt < START_TRIES && members.iter().any(Member::port_taken) => {
                    members.iter_mut().for_each(Member::discard);
                }
                Err(report) => panic!("{report}"),
            }
        }
        unreachable!("the last try panics or returns")
    }

    /// Fresh ports, the proxies between them, and each member's zoo.cfg naming the others at
    /// its own proxies.
    fn configure(
        dir: &Path,
        setup: &Setup,
        own: &dyn Fn(usize) -> Vec<String>,
    ) -> (Vec<Member>, Vec<Link>) {
        let mut members: Vec<Member> = (0..Ensemble::SIZE)
            .map(|i| Member::new(dir, i + 1))
            .collect();
        let mut links = Vec::new();
        for from in 0..Ensemble::SIZE {
            for to in (0..Ensemble::SIZE).filter(|&to| to != from) {
                links.push(Link::start(from, &members[to]));
            }
        }
        for (i, member) in members.iter_mut().enumerate() {
            let servers: Vec<String> = (0..Ensemble::SIZE)
                .map(|j| {
                    let link = links.iter().find(|l| l.from == i && l.to == j);
                    let (quorum, election) = match link {
                        Some(l) => (l.quorum.addr().port(), l.election.addr().port()),
                        None => (member.quorum, member.election),
                    };
                    format!("server.{}=127.0.0.1:{quorum}:{election}", j + 1)
                })
                .collect();
            member.write_config(setup, &[servers, setup.extra.clone(), own(i)].concat());
        }
        (members, links)
    }

    /// All members' client addresses, comma-joined: a connect string for `--zookeeper`.
    pub fn connect(&self) -> String {
        let all: Vec<String> = self.members.iter().map(Member::connect).collect();
        all.join(",")
    }

    /// Member `i`'s client address.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.members[i].addr()
    }

    /// Member `i`'s client address alone: a connect string that pins a client to it.
    pub fn endpoint(&self, i: usize) -> String {
        self.members[i].connect()
    }

    /// Member `i`'s client port, for four-letter words.
    pub fn port(&self, i: usize) -> u16 {
        self.members[i].client
    }

    /// Member `i`'s pid while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Member `i`'s answer to `srvr` (or why there was none).
    pub fn srvr(&self, i: usize) -> Result<String, String> {
        four_letter(self.members[i].client, "srvr")
    }

    /// Member `i`'s answer to the four-letter word `word` (`mntr`, `conf`, `cons`, ...).
    pub fn four_letter(&self, i: usize, word: &str) -> Result<String, String> {
        four_letter(self.members[i].client, word)
    }

    /// The index of the member whose `srvr` says "Mode: leader", once one does and the others
    /// that are running and not cut off follow (bounded wait: an election takes a few ticks).
    #[track_caller]
    pub fn leader_index(&self) -> usize {
        let deadline = Instant::now() + START_BOUND;
        loop {
            let modes: Vec<Option<String>> = (0..Ensemble::SIZE).map(|i| self.mode(i)).collect();
            let leaders: Vec<usize> = (0..Ensemble::SIZE)
                .filter(|&i| modes[i].as_deref() == Some("leader"))
                .collect();
            if let [leader] = leaders[..] {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no single leader among the ZooKeeper members in {START_BOUND:?}: modes {modes:?}"
            );
            thread::sleep(POLL);
        }
    }

    /// A running member other than `not`, by index: (leader + 1) % 3 and the like, made explicit.
    pub fn other_than(&self, not: &[usize]) -> usize {
        let found = (0..Ensemble::SIZE).find(|i| !not.contains(i));
        found.expect("three members")
    }

    /// "leader", "follower" or "standalone" from member `i`'s `srvr`; None if it does not serve
    /// (stopped, killed, cut off from the quorum) or is stopped.
    pub fn mode(&self, i: usize) -> Option<String> {
        let member = &self.members[i];
        if member.child.is_none() || member.stopped {
            return None;
        }
        let text = four_letter(member.client, "srvr").ok()?;
        let line = text.lines().find_map(|l| l.strip_prefix("Mode: "))?;
        Some(line.trim().to_owned())
    }

    /// Cuts member `i` off from the other two: every byte on its quorum and election links, both
    /// ways, is dropped from now on. Its clients stay connected to it.
    pub fn isolate(&self, i: usize) {
        for link in self.links.iter().filter(|l| l.touches(i)) {
            link.quorum.set_mode(Mode::Blackhole);
            link.election.set_mode(Mode::Blackhole);
        }
    }

    /// Cuts member `i` off one way: every byte it sends to the other two is dropped from now on,
    /// while theirs still reach it. A follower so cut keeps hearing its leader (proposals, commits,
    /// pings) and serving what they tell it, while the leader hears nothing of it or of its
    /// clients until it drops it after syncLimit ticks.
    pub fn isolate_one_way(&self, i: usize) {
        for link in self.links.iter().filter(|l| l.touches(i)) {
            let mode = if link.from == i {
                Mode::DropFromClient
            } else {
                Mode::DropFromUpstream
            };
            link.quorum.set_mode(mode);
            link.election.set_mode(mode);
        }
    }

    /// Ends `isolate(i)` or `isolate_one_way(i)`: its links' connections are closed and new ones
    /// pass.
    pub fn heal(&self, i: usize) {
        for link in self.links.iter().filter(|l| l.touches(i)) {
            link.quorum.heal();
            link.election.heal();
        }
    }

    /// Stop (SIGSTOP) or continue (SIGCONT) member `i`'s process.
    #[track_caller]
    pub fn signal(&mut self, i: usize, sig: Signal) {
        let member = &mut self.members[i];
        let child = member.child.as_ref().expect("member is not running");
        kill(Pid::from_raw(child.id() as i32), sig).expect("cannot signal the ZooKeeper member");
        match sig {
            Signal::SIGSTOP => member.stopped = true,
            Signal::SIGCONT => member.stopped = false,
            _ => {}
        }
    }

    /// SIGKILL member `i` now, and reap.
    pub fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Starts member `i` again on its data dir and ports; waits until it serves (needs a quorum).
    #[track_caller]
    pub fn restart(&mut self, i: usize) {
        let java = checked_java(&JARS);
        let member = &mut self.members[i];
        member.kill();
        member.launch(&java);
        if let Err(why) = member.wait_serving() {
            panic!("{}", member.report(&why));
        }
    }

    /// Resident memory of member `i` in KiB (VmRSS), and its peak (VmHWM).
    pub fn rss_kib(&self, i: usize) -> Option<(u64, u64)> {
        rss_kib(self.pid(i)?)
    }
}

impl Drop for Ensemble {
    /// A failing test shows what the members logged last (their files go with the temp dir).
    fn drop(&mut self) {
        if thread::panicking() {
            for member in &self.members {
                eprintln!("{}", member.report("at the end of a failed test"));
            }
        }
    }
}

/// Waits until every running member serves (a member serves once it follows or leads).
fn wait_all_serving(members: &mut [Member]) -> Result<(), String> {
    for member in members.iter_mut().filter(|m| m.child.is_some()) {
        member.wait_serving().map_err(|why| member.report(&why))?;
    }
    Ok(())
}

/// VmRSS and VmHWM of `pid`, in KiB.
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// One ZooKeeper process. Id, files and ports survive kill and restart; `child` is the process.
struct Member {
    /// Index in the ensemble (0 standalone); its server id (myid) is index + 1.
    index: usize,
    dir: PathBuf,
    client: u16,
    quorum: u16,
    election: u16,
    child: Option<Child>,
    /// SIGSTOPped by the test: `srvr` would only time out.
    stopped: bool,
    /// More JVM options (a JAAS file).
    jvm: Vec<String>,
}

impl Member {
    /// `id` 0 for a standalone server, else the server id (1..=3).
    fn new(root: &Path, id: usize) -> Member {
        let client = free_port();
        let dir = root.join(format!("zk{id}-{client}"));
        fs::create_dir_all(dir.join("data")).expect("create a ZooKeeper data dir");
        if id > 0 {
            fs::write(dir.join("data/myid"), format!("{id}\n")).expect("write myid");
        }
        Member {
            index: id.saturating_sub(1),
            dir,
            client,
            quorum: free_port(),
            election: free_port(),
            child: None,
            stopped: false,
            jvm: Vec::new(),
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client))
    }

    fn connect(&self) -> String {
        format!("127.0.0.1:{}", self.client)
    }

    fn log(&self) -> PathBuf {
        self.dir.join("zookeeper.log")
    }

    /// zoo.cfg: the test timing, 4lw on, no admin server, then `lines` (the ensemble's members,
    /// or none for standalone; more settings).
    fn write_config(&self, setup: &Setup, lines: &[String]) {
        let mut cfg = format!(
            "tickTime={}\ninitLimit={INIT_LIMIT}\nsyncLimit={SYNC_LIMIT}\n\
             dataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n4lw.commands.whitelist={}\n\
             maxClientCnxns=0\npreAllocSize=1024\nreconfigEnabled=false\n",
            setup.tick.unwrap_or(TICK).as_millis(),
            self.dir.join("data").display(),
            self.client,
            setup.whitelist.unwrap_or("*"),
        );
        for line in lines {
            cfg.push_str(line);
            cfg.push('\n');
        }
        fs::write(self.dir.join("zoo.cfg"), cfg).expect("write zoo.cfg");
    }

    /// Spawns the server, its stdout and stderr appended to the member's log.
    fn launch(&mut self, java: &Path) {
        let open = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log());
        let log = open.unwrap_or_else(|e| panic!("cannot open {}: {e}", self.log().display()));
        let mut cmd = Command::new(java);
        let jars: Vec<&str> = JARS.iter().chain(&NETTY_JARS).copied().collect();
        cmd.args(SERVER_JVM)
            .args(&self.jvm)
            .arg("-cp")
            .arg(jars.join(":"))
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(self.dir.join("zoo.cfg"))
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        cmd.stdout(log.try_clone().expect("cannot clone the log file"))
            .stderr(log);
        let child = spawn_tied_to_process(cmd);
        let child =
            child.unwrap_or_else(|e| panic!("cannot start ZooKeeper ({e}); {INSTALL_HINT}"));
        self.child = Some(child);
        self.stopped = false;
    }

    /// Polls `srvr` until it names a mode, the process exits, or `START_BOUND` passes.
    fn wait_serving(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_BOUND;
        loop {
            let child = self
                .child
                .as_mut()
                .expect("wait_serving on a stopped member");
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("exited with {status}"));
            }
            let srvr = four_letter(self.client, "srvr");
            if srvr.as_deref().is_ok_and(|t| t.contains("Mode: ")) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("did not serve within {START_BOUND:?}: {srvr:?}"));
            }
            thread::sleep(POLL);
        }
    }

    /// Whether the log says a port was taken (by another process between `free_port` and bind).
    fn port_taken(&self) -> bool {
        let text = fs::read_to_string(self.log()).unwrap_or_default();
        text.contains("Address already in use")
    }

    /// Why the member failed, with the tail of its log.
    fn report(&self, why: &str) -> String {
        let text = fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        format!(
            "ZooKeeper member {} ({}) {why}\n--- last lines of {} ---\n{tail}",
            self.index,
            self.connect(),
            self.log().display()
        )
    }

    /// SIGKILL by its own pid (a SIGSTOPped process dies of it too), then reap.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.stopped = false;
    }

    /// Kills and removes the data of a failed try.
    fn discard(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends a four-letter word to 127.0.0.1:`port` and reads the answer to its end (the server
/// closes), within `FOUR_LETTER_BOUND` per step.
pub fn four_letter(port: u16, word: &str) -> Result<String, String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let fail = |e: std::io::Error| format!("{word} on port {port}: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, FOUR_LETTER_BOUND).map_err(fail)?;
    stream
        .set_read_timeout(Some(FOUR_LETTER_BOUND))
        .map_err(fail)?;
    stream.write_all(word.as_bytes()).map_err(fail)?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).map_err(fail)?;
    Ok(reply)
}

/// The ephemeral nodes under `parent` (sorted), from the `dump` four-letter word of the server on
/// `port`, which must be the leader or a standalone server (a follower's dump lists none). No JVM
/// to start: cheap enough to poll.
pub fn ephemerals_under(port: u16, parent: &str) -> Result<Vec<String>, String> {
    let dump = four_letter(port, "dump")?;
    let prefix = format!("{}/", parent.trim_end_matches('/'));
    let mut nodes: Vec<String> = dump
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&prefix))
        .filter(|rest| !rest.contains('/'))
        .map(str::to_owned)
        .collect();
    nodes.sort();
    Ok(nodes)
}

/// The total of watches the server on `port` holds, from `wchs`.
pub fn total_watches(port: u16) -> Result<u64, String> {
    let wchs = four_letter(port, "wchs")?;
    let total = wchs
        .lines()
        .find_map(|l| l.trim().strip_prefix("Total watches:"));
    let total = total.ok_or_else(|| format!("no total in wchs: {wchs}"))?;
    total
        .trim()
        .parse()
        .map_err(|e| format!("wchs total {total:?}: {e}"))
}

/// Runs ZooKeeper's own CLI (`ZooKeeperMain -server CONNECT ARGS...`): one command, its answer on
/// stdout, within `bound`.
pub fn cli(connect: &str, args: &[&str]) -> Output {
    let java = checked_java(&CLI_JARS);
    let mut cmd = Command::new(java);
    // A quick JIT tier: the CLI runs one command and exits.
    cmd.args([
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        "-Xshare:auto",
    ])
    .arg("-cp")
    .arg(CLI_JARS.join(":"))
    .arg("org.apache.zookeeper.ZooKeeperMain")
    .args(["-server", connect])
    .args(args);
    let out = super::run_bounded(cmd, Duration::from_secs(30));
    Output {
        status: out.status,
        stdout: out.stdout.into_bytes(),
        stderr: out.stderr.into_bytes(),
    }
}

/// ZooKeeper's CLI reading commands from a pipe: one session, kept while this lives (killed and
/// reaped on drop, which ends the session at once).
pub struct CliSession {
    child: Child,
}

impl CliSession {
    /// Sends command lines; their answers go to /dev/null.
    pub fn write_all(&mut self, commands: &[u8]) {
        let stdin = self.child.stdin.as_mut().expect("the CLI's stdin");
        stdin.write_all(commands).expect("write to the CLI");
        stdin.flush().expect("flush the CLI's stdin");
    }
}

impl Drop for CliSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the CLI on `connect`, reading commands from a pipe (`CliSession::write_all`).
pub fn cli_session(connect: &str) -> CliSession {
    let java = checked_java(&CLI_JARS);
    let mut cmd = Command::new(java);
    cmd.args(["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"])
        .arg("-cp")
        .arg(CLI_JARS.join(":"))
        .arg("org.apache.zookeeper.ZooKeeperMain")
        .args(["-server", connect])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run ZooKeeper's CLI: {e}"));
    CliSession { child }
}

/// The children of `path` (sorted), or None if it does not exist.
#[track_caller]
pub fn children(connect: &str, path: &str) -> Option<Vec<String>> {
    let out = cli(connect, &["ls", path]);
    let (stdout, stderr) = texts(&out);
    if stdout.contains("Node does not exist") || stderr.contains("Node does not exist") {
        return None;
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('[') && l.ends_with(']'));
    let line = line.unwrap_or_else(|| panic!("ls {path}: no list in\n{stdout}\n{stderr}"));
    let inner = &line[1..line.len() - 1];
    let mut names: Vec<String> = inner
        .split(", ")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    names.sort();
    Some(names)
}

/// The czxid and ephemeral owner of `path`, or None if it does not exist.
#[track_caller]
pub fn stat(connect: &str, path: &str) -> Option<Stat> {
    let out = cli(connect, &["stat", path]);
    let (stdout, stderr) = texts(&out);
    if stdout.contains("Node does not exist") || stderr.contains("Node does not exist") {
        return None;
    }
    let hex = |name: &str| -> u64 {
        let prefix = format!("{name} = 0x");
        let line = stdout.lines().find_map(|l| l.strip_prefix(&prefix));
        let line = line.unwrap_or_else(|| panic!("stat {path}: no {name} in\n{stdout}\n{stderr}"));
        u64::from_str_radix(line.trim(), 16).expect("hex in stat")
    };
    Some(Stat {
        czxid: hex("cZxid"),
        ephemeral_owner: hex("ephemeralOwner"),
    })
}

/// What the tests read of a node's Stat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub czxid: u64,
    /// The owning session of an ephemeral node; 0 for a persistent one.
    pub ephemeral_owner: u64,
}

/// Runs a CLI command that must succeed (`create`, `delete`, ...); returns its stdout.
#[track_caller]
pub fn cli_ok(connect: &str, args: &[&str]) -> String {
    let out = cli(connect, args);
    let (stdout, stderr) = texts(&out);
    let failed =
        !out.status.success() || stderr.contains("Exception") || stdout.contains("Exception");
    assert!(
        !failed,
        "zkCli {} failed ({}):\n{stdout}\n{stderr}",
        args.join(" "),
        out.status
    );
    stdout
}

fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fresh temp dir for one server or ensemble. Dirs are named `<pid>-...` under one root, and
/// those whose test process is gone are removed first (the `shared` server is never dropped).
fn scratch_dir() -> TempDir {
    static SWEEP: Once = Once::new();
    let root = std::env::temp_dir().join("leasewrap-zookeeper");
    fs::create_dir_all(&root).unwrap_or_else(|e| panic!("cannot create {}: {e}", root.display()));
    SWEEP.call_once(|| {
        for dir in super::dirs_of_dead_processes(&root) {
            let _ = fs::remove_dir_all(dir);
        }
    });
    let prefix = format!("{}-", std::process::id());
    let dir = tempfile::Builder::new().prefix(&prefix).tempdir_in(&root);
    dir.unwrap_or_else(|e| panic!("cannot create a temp dir in {}: {e}", root.display()))
}
