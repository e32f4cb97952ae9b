//! What every figure shares: the etcd (tests/support's launcher) and the fault proxy in front of
//! it, the two tools' command lines, private copies of the children's binaries (an exec of one is
//! a start the harness can see), and bounded waits on etcd's own gauges.
//!
//! It owns every process a figure starts (through `Procs`) and leaves none behind a figure.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::observe::Events;
use super::procs::Procs;
use super::prom::Scrape;
use super::support::etcd::{Etcd, Version};
use super::support::proxy::Proxy;

pub const FLOCK: &str = "/usr/bin/flock";

/// How often a wait on etcd's gauges scrapes /metrics again.
const SCRAPE_POLL: Duration = Duration::from_millis(10);

/// How long queued waiters may take to be registered (a batch of 20 on a busy box).
pub const QUEUE_BOUND: Duration = Duration::from_secs(60);

/// How long a child may take to start once its turn has come.
pub const START_BOUND: Duration = Duration::from_secs(15);

/// The two lock tools compared run by run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    Leasewrap,
    /// `etcdctl lock` of etcd 3.4.
    Etcdctl,
}

impl Tool {
    pub fn name(self) -> &'static str {
        match self {
            Tool::Leasewrap => "leasewrap",
            Tool::Etcdctl => "etcdctl",
        }
    }

    /// Both tools, the order flipped every iteration so that a drift in load hits both alike.
    pub fn interleaved(iteration: usize) -> [Tool; 2] {
        if iteration % 2 == 0 {
            [Tool::Leasewrap, Tool::Etcdctl]
        } else {
            [Tool::Etcdctl, Tool::Leasewrap]
        }
    }

    /// Watches a holder keeps open: leasewrap watches its own key, etcdctl nothing.
    fn holder_watches(self) -> f64 {
        match self {
            Tool::Leasewrap => 1.0,
            Tool::Etcdctl => 0.0,
        }
    }
}

/// The children the tools run: private copies of system binaries, watched for exec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Child {
    /// `cat FIFO`, the holder of the handover figure: writes what the harness sends, then exits.
    Hold,
    /// `echo`, the waiter of the handover figure: writes at once and exits.
    Next,
    /// `sleep`, the holder of the takeover and overlap figures.
    HolderSleep,
    /// `sleep`, the waiter of the takeover and overlap figures.
    WaiterSleep,
    /// `cat FIFO`, every member of a waiter chain.
    Chain,
    /// `sleep`, a lease held for memory or CPU readings.
    Sleep,
}

impl Child {
    const ALL: [Child; 6] = [
        Child::Hold,
        Child::Next,
        Child::HolderSleep,
        Child::WaiterSleep,
        Child::Chain,
        Child::Sleep,
    ];

    /// The label of its exec events, and its file name.
    pub fn label(self) -> &'static str {
        match self {
            Child::Hold => "hold",
            Child::Next => "next",
            Child::HolderSleep => "hsleep",
            Child::WaiterSleep => "wsleep",
            Child::Chain => "chain",
            Child::Sleep => "lsleep",
        }
    }

    fn original(self) -> &'static str {
        match self {
            Child::Hold | Child::Chain => "/bin/cat",
            Child::Next => "/bin/echo",
            _ => "/bin/sleep",
        }
    }
}

/// Sizes of a full run, or of a `--quick` one.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Iterations of the whole-process and handover figures.
    pub n: usize,
    /// Iterations per TTL and tool of the takeover figure.
    pub n_takeover: usize,
    /// Iterations per fault and tool of the overlap figure.
    pub n_overlap: usize,
    /// Iterations per tool of the memory figure.
    pub n_memory: usize,
    /// Waiters of the small and the large chain.
    pub chains: (usize, usize),
    /// Leases held at once, and for how long their CPU is counted.
    pub leases: usize,
    pub window: Duration,
}

impl Sizes {
    pub const FULL: Sizes = Sizes {
        n: 40,
        n_takeover: 5,
        n_overlap: 3,
        n_memory: 5,
        chains: (10, 200),
        leases: 500,
        window: Duration::from_secs(20),
    };
    pub const QUICK: Sizes = Sizes {
        n: 5,
        n_takeover: 1,
        n_overlap: 1,
        n_memory: 1,
        chains: (3, 20),
        leases: 50,
        window: Duration::from_secs(5),
    };
}

pub struct Bench {
    pub sizes: Sizes,
    /// The leasewrap binary measured: a copy of the one built, in `tmp` (see [`Bench::new`]).
    pub lw: PathBuf,
    pub etcd: Etcd,
    /// In front of `etcd`: stamps a holder's requests, and partitions it.
    pub proxy: Proxy,
    pub events: Events,
    pub procs: Procs,
    /// etcd's watcher count with none of ours running.
    watch_base: f64,
    /// State of `random` (the kill phase of the takeover figure).
    rng: u64,
    /// Last: removed once every process is gone.
    pub tmp: TempDir,
}

impl Bench {
    pub fn new(sizes: Sizes, lw: PathBuf) -> Bench {
        let tmp = tempfile::Builder::new()
            .prefix("leasewrap-bench-")
            .tempdir()
            .expect("create the bench temp dir");
        let mut events = Events::new();
        let bin = tmp.path().join("bin");
        fs::create_dir(&bin).expect("create bin dir");
        for child in Child::ALL {
            let path = bin.join(child.label());
            fs::copy(child.original(), &path).expect("copy a child binary");
            events.watch_exec(&path, child.label());
        }
        // leasewrap runs from a copy too, as installing one makes (cargo install, dpkg), like
        // flock and etcdctl, which dpkg installed. The linker's own output starts slower: its
        // file reached the page cache through a shared mapping, a page at a time, and an exec
        // of it takes more page faults than of a file written with write() (about 0.1 ms more
        // for `-- true` here).
        let copy = bin.join("leasewrap");
        fs::copy(&lw, &copy).expect("copy the leasewrap binary");
        let lw = copy;
        // Written back now, so that the kernel's flusher is not writing 4 MB of it back while
        // the runs measure leasewrap's fdatasync, which waits for the device.
        fs::File::open(&lw)
            .and_then(|f| f.sync_all())
            .expect("sync the copies");
        let mut procs = Procs::new(tmp.path().join("logs"));
        let etcd = Etcd::start(Version::V3_4);
        procs.spare(etcd.pid().expect("etcd runs") as i32);
        let proxy = Proxy::start(etcd.addr());
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let seed = since_epoch.map_or(0, |d| d.as_nanos() as u64) ^ u64::from(std::process::id());
        let mut bench = Bench {
            sizes,
            lw,
            etcd,
            proxy,
            events,
            procs,
            watch_base: 0.0,
            rng: seed,
            tmp,
        };
        bench.watch_base = bench.scrape().get("etcd_debugging_mvcc_watcher_total");
        bench
    }

    pub fn child(&self, child: Child) -> PathBuf {
        self.tmp.path().join("bin").join(child.label())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// A fresh `--local-dir` (0700 whatever the umask: leasewrap refuses one others can write).
    pub fn local_dir(&self, name: &str) -> PathBuf {
        let dir = self.path(name);
        let made = fs::DirBuilder::new().mode(0o700).create(&dir);
        made.unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        dir
    }

    /// `tool`'s command line for lock `name` on `endpoint` (etcd itself when None), running `child`.
    pub fn argv(&self, tool: Tool, lock: &Lock, child: &[OsString]) -> Vec<OsString> {
        let endpoint = lock
            .endpoint
            .clone()
            .unwrap_or_else(|| self.etcd.endpoint());
        let mut argv: Vec<OsString> = match tool {
            Tool::Leasewrap => vec![
                self.lw.clone().into(),
                "--endpoints".into(),
                endpoint.into(),
                "--name".into(),
                lock.name.clone().into(),
            ],
            Tool::Etcdctl => vec![
                Version::V3_4.etcdctl().into(),
                format!("--endpoints={endpoint}").into(),
                "lock".into(),
            ],
        };
        match (tool, lock.ttl) {
            (Tool::Leasewrap, Some(ttl)) => argv.extend(["--ttl".into(), format!("{ttl}s").into()]),
            (Tool::Etcdctl, Some(ttl)) => argv.push(format!("--ttl={ttl}").into()),
            (_, None) => {}
        }
        match tool {
            Tool::Leasewrap => argv.extend(lock.extra.iter().cloned().chain(["--".into()])),
            Tool::Etcdctl => argv.push(lock.name.clone().into()),
        }
        argv.extend(child.iter().cloned());
        argv
    }

    /// leasewrap's command line for lock `name` on the local backend in `dir`.
    pub fn argv_local(&self, lock: &Lock, dir: &Path, child: &[OsString]) -> Vec<OsString> {
        let mut argv = self.argv(Tool::Leasewrap, lock, child);
        // the same command line, with --local-dir DIR instead of --endpoints ENDPOINT
        argv.splice(1..3, os(&["--local-dir".as_ref(), dir.as_os_str()]));
        argv
    }

    pub fn scrape(&self) -> Scrape {
        Scrape::parse(&self.etcd.metrics())
    }

    /// Waits until etcd has `waiters` watches of queued waiters (plus the holder's own) and none
    /// of them is unsynced. A watch from a revision etcd already has (etcdctl's) is unsynced until
    /// etcd's sync loop catches it up, every 100 ms; an event in the meantime waits for that loop.
    /// A waiter queued for long is synced: the figures compare that steady state.
    #[track_caller]
    pub fn wait_queued(&mut self, tool: Tool, waiters: usize, pids: &[i32]) {
        self.wait_watchers(tool, waiters, pids, |total, want| total >= want);
    }

    /// Waits until a leasewrap holder and `waiters` queued behind it hold exactly their watches,
    /// all synced: the old holder's are gone, the new holder watches its own key. (Holders that
    /// handed on exit: nobody's exit is an error here.)
    #[track_caller]
    pub fn wait_steady(&mut self, waiters: usize) {
        self.wait_watchers(Tool::Leasewrap, waiters, &[], |total, want| total == want);
    }

    #[track_caller]
    fn wait_watchers(
        &mut self,
        tool: Tool,
        waiters: usize,
        pids: &[i32],
        done: fn(f64, f64) -> bool,
    ) {
        let want = self.watch_base + tool.holder_watches() + waiters as f64;
        let deadline = Instant::now() + QUEUE_BOUND;
        loop {
            let m = self.scrape();
            let total = m.get("etcd_debugging_mvcc_watcher_total");
            let slow = m.get("etcd_debugging_mvcc_slow_watcher_total");
            if done(total, want) && slow == 0.0 {
                return;
            }
            for &pid in pids {
                if let Some(code) = self.procs.wait(pid, Duration::ZERO) {
                    panic!("{}: pid {pid} exited {code} while queueing", tool.name());
                }
            }
            assert!(
                Instant::now() < deadline,
                "{}: {total} watchers ({slow} unsynced), not {want}, after {QUEUE_BOUND:?}",
                tool.name()
            );
            thread::sleep(SCRAPE_POLL);
        }
    }

    /// A holder of lock `name` talking to etcd through the proxy (child `HolderSleep`) and one
    /// waiter on etcd itself (child `WaiterSleep`), once the waiter is queued.
    #[track_caller]
    pub fn hold_and_queue(&mut self, tool: Tool, name: &str, ttl: u32, log: &str) -> Pair {
        let sleep = |b: &Bench, c: Child| os(&[b.child(c).as_os_str(), "1000".as_ref()]);
        let via = Lock::new(name).ttl(ttl).via(self.proxy.endpoint());
        let argv = self.argv(tool, &via, &sleep(self, Child::HolderSleep));
        let holder = self.procs.spawn(&argv, log, None);
        let (started, child) = self.started(Child::HolderSleep, &[holder]);
        let direct = Lock::new(name).ttl(ttl);
        let argv = self.argv(tool, &direct, &sleep(self, Child::WaiterSleep));
        let waiter = self.procs.spawn(&argv, log, None);
        self.wait_queued(tool, 1, &[holder, waiter]);
        Pair {
            holder,
            child,
            started,
        }
    }

    /// Waits for the exec of `child`; returns its instant and the one pid running it.
    #[track_caller]
    pub fn started(&mut self, child: Child, supervisors: &[i32]) -> (Instant, i32) {
        let Some(at) = self.events.wait_for(child.label(), START_BOUND) else {
            for &pid in supervisors {
                if let Some(code) = self.procs.wait(pid, Duration::ZERO) {
                    panic!("{}: its supervisor exited {code} first", child.label());
                }
            }
            panic!("{} did not start within {START_BOUND:?}", child.label());
        };
        (at, self.only_runner(child))
    }

    /// The one process running `child` (an exec is seen before /proc shows the new image).
    #[track_caller]
    pub fn only_runner(&self, child: Child) -> i32 {
        let path = self.child(child);
        let deadline = Instant::now() + START_BOUND;
        loop {
            match super::procs::pids_running(&path)[..] {
                [pid] => return pid,
                [] if Instant::now() < deadline => thread::yield_now(),
                ref many => panic!("{}: run by {many:?} at once", child.label()),
            }
        }
    }

    /// Kills what the last iteration left, and waits until etcd has dropped its watchers.
    pub fn sweep(&mut self) {
        self.events.reset();
        self.procs.sweep();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.scrape().get("etcd_debugging_mvcc_watcher_total") > self.watch_base
            && Instant::now() < deadline
        {
            thread::sleep(SCRAPE_POLL);
        }
    }

    /// A number in [0, 1) (splitmix64: even its first outputs are spread, whatever the seed).
    pub fn random(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The holder of `hold_and_queue`.
pub struct Pair {
    pub holder: i32,
    /// The holder's child.
    pub child: i32,
    /// When the holder's child started.
    pub started: Instant,
}

/// A FIFO a `cat` child reads: `release` ends that child (removed on drop).
pub struct Fifo(pub PathBuf);

impl Fifo {
    pub fn new(path: PathBuf) -> Fifo {
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        Fifo(path)
    }

    /// Writes `line` (the child copies it to its stdout) and closes: the child sees EOF and exits.
    /// Blocks until the child has the FIFO open.
    pub fn release(&self, line: &[u8]) {
        let open = std::fs::OpenOptions::new().write(true).open(&self.0);
        let mut w = open.expect("open the fifo");
        std::io::Write::write_all(&mut w, line).expect("write the fifo");
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// One lock as a figure uses it.
pub struct Lock {
    pub name: String,
    /// Through the proxy, or None for etcd itself.
    pub endpoint: Option<String>,
    pub ttl: Option<u32>,
    /// leasewrap options beyond the common ones (`--once KEY`).
    pub extra: Vec<OsString>,
}

impl Lock {
    pub fn new(name: impl Into<String>) -> Lock {
        Lock {
            name: name.into(),
            endpoint: None,
            ttl: None,
            extra: Vec::new(),
        }
    }

    pub fn ttl(mut self, ttl: u32) -> Lock {
        self.ttl = Some(ttl);
        self
    }

    pub fn via(mut self, endpoint: String) -> Lock {
        self.endpoint = Some(endpoint);
        self
    }
}

/// `OsString`s of `args`, for a child's argv.
pub fn os<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Vec<OsString> {
    args.iter().map(|a| a.as_ref().to_owned()).collect()
}
