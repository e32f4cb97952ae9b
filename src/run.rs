//! Where lease, child and signals meet: take the lease, start the child under the watchdog, pass
//! each new deadline on, stop the child when the lease is lost, give the lease back, and turn the
//! child's end into leasewrap's own exit. Each `select!` arm calls a named function.

use std::ffi::OsString;
use std::future::pending;

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, Signal as SignalStream, SignalKind};
use tracing::{debug, error, info, warn};

use crate::config::{Backend, Config, Wait};
use crate::error::Error;
use crate::lease::{Held, LeaseEvent, Lessor};
use crate::notify::Notifier;
use crate::supervise::protocol::ToWatchdog;
use crate::supervise::{self, ChildSpec, Event, Supervisor};

/// How leasewrap ends when it ends the way its child did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exit with this status.
    Code(u8),
    /// Die of this signal, as the child did.
    Signal(Signal),
}

/// The signals leasewrap forwards to the child (or that end a wait).
struct Signals([SignalStream; 4]);

const FORWARDED: [(SignalKind, Signal); 4] = [
    (SignalKind::terminate(), Signal::SIGTERM),
    (SignalKind::interrupt(), Signal::SIGINT),
    (SignalKind::hangup(), Signal::SIGHUP),
    (SignalKind::quit(), Signal::SIGQUIT),
];

impl Signals {
    fn new() -> Result<Self, Error> {
        let install = |k| signal(k).map_err(|e| Error::internal("installing signal handlers", e));
        Ok(Self([
            install(FORWARDED[0].0)?,
            install(FORWARDED[1].0)?,
            install(FORWARDED[2].0)?,
            install(FORWARDED[3].0)?,
        ]))
    }

    /// The next signal. Cancel-safe.
    async fn recv(&mut self) -> Signal {
        let [t, i, h, q] = &mut self.0;
        tokio::select! {
            _ = t.recv() => Signal::SIGTERM,
            _ = i.recv() => Signal::SIGINT,
            _ = h.recv() => Signal::SIGHUP,
            _ = q.recv() => Signal::SIGQUIT,
        }
    }
}

/// Run the child of `cfg` under its lease.
pub async fn run(cfg: &Config) -> Result<Exit, Error> {
    let program = supervise::resolve(&cfg.command[0])?;
    let mut signals = Signals::new()?;
    let notifier = Notifier::from_env();
    // The watchdog starts now and waits: its exec overlaps the work of taking the lease.
    let mut sup = Supervisor::spawn(ChildSpec {
        program: &program,
        argv: &cfg.command,
        env: base_env(),
        stop_signal: cfg.signal,
        kill_after: cfg
            .params
            .effective(cfg.params.ttl)
            .map(|e| e.kill_after)
            .unwrap_or_default(),
    })?;
    let mut lessor = Lessor::connect(cfg).await?;
    notifier.send(&format!("STATUS=waiting for lease {}", cfg.name));
    let mut held = acquire(cfg, &mut lessor, &mut signals).await?;
    sup.start(&lease_env(cfg, &held), held.deadline, held.keep_fd());
    info!(name = %cfg.name, token = held.token, "acquired");
    let outcome = hold(cfg, &mut held, &mut sup, &mut signals, &notifier).await;
    notifier.send("STOPPING=1");
    let token = held.token;
    held.release().await;
    info!(name = %cfg.name, token, "released");
    outcome
}

/// Wait for the lease as `-n`/`-w` say; a signal ends the wait and starts nothing.
async fn acquire(cfg: &Config, lessor: &mut Lessor, signals: &mut Signals) -> Result<Held, Error> {
    let limit = async {
        match cfg.wait {
            Wait::For(d) => tokio::time::sleep(d).await,
            Wait::Forever | Wait::No => pending().await,
        }
    };
    let record = holder_record(cfg);
    let result = tokio::select! {
        r = lessor.acquire(&cfg.name, &record, cfg.wait != Wait::No) => r,
        sig = signals.recv() => Err(Error::Interrupted(sig)),
        () = limit => Err(Error::WaitTimedOut {
            name: cfg.name.clone(),
            waited: format!("{:?}", match cfg.wait { Wait::For(d) => d, _ => Default::default() }),
        }),
    };
    if result.is_err() {
        lessor.abandon().await;
    }
    result
}

/// What the lost lease and the child's end add up to.
#[derive(Default)]
struct Ending {
    /// Why the lease was lost, if it was.
    lost: Option<String>,
}

impl Ending {
    /// The lease is lost: the one log line that says so.
    fn lose(&mut self, cfg: &Config, token: u64, why: String) {
        error!(name = %cfg.name, token, reason = %why, "lease lost: stopping the child");
        self.lost = Some(why);
    }
}

/// Hold the lease while the child runs; return how leasewrap should end.
async fn hold(
    cfg: &Config,
    held: &mut Held,
    sup: &mut Supervisor,
    signals: &mut Signals,
    notifier: &Notifier,
) -> Result<Exit, Error> {
    let mut ending = Ending::default();
    loop {
        tokio::select! {
            biased;
            ev = sup.next() => {
                if let Event::Started(_) = ev {
                    notifier.send(&format!("READY=1\nSTATUS=holding lease {} (token {})", cfg.name, held.token));
                }
                if let Some(done) = on_child(cfg, held.token, ev, &mut ending) { return done }
            }
            sig = signals.recv() => on_signal(sup, sig),
            ev = held.next_event(), if ending.lost.is_none() => on_lease(cfg, held.token, sup, ev, &mut ending),
        }
    }
}

fn on_child(
    cfg: &Config,
    token: u64,
    ev: Event,
    ending: &mut Ending,
) -> Option<Result<Exit, Error>> {
    match ev {
        Event::Started(pid) => {
            debug!(pid = pid.as_raw(), "child started");
            None
        }
        Event::DeadlinePassed => {
            if ending.lost.is_none() {
                ending.lose(cfg, token, "no renewal came before the deadline".into());
            }
            None
        }
        Event::Exited(status) => Some(match ending.lost.take() {
            Some(why) => Err(Error::Lost {
                name: cfg.name.clone(),
                why,
            }),
            None => Ok(exit_of(status)),
        }),
        Event::SpawnFailed(errno) => Some(Err(match errno {
            libc::ENOENT => Error::NotFound(cfg.command[0].clone().into()),
            _ => Error::NotExecutable(cfg.command[0].clone().into()),
        })),
        Event::WatchdogDied => Some(Err(Error::Internal(
            "the watchdog died: the child's whole process tree was killed".into(),
        ))),
    }
}

fn on_signal(sup: &mut Supervisor, sig: Signal) {
    info!(signal = %sig, "forwarding to the child's process group");
    sup.send(ToWatchdog::Forward(sig as i32));
}

fn on_lease(cfg: &Config, token: u64, sup: &mut Supervisor, ev: LeaseEvent, ending: &mut Ending) {
    match ev {
        LeaseEvent::Renewed(d) => sup.send(ToWatchdog::Deadline(Some(d))),
        LeaseEvent::Trouble(why, d) => {
            sup.send(ToWatchdog::Deadline(Some(d)));
            warn!(name = %cfg.name, token, reason = %why, "renewal trouble");
        }
        LeaseEvent::Lost(why) => {
            sup.send(ToWatchdog::Stop);
            ending.lose(cfg, token, why);
        }
    }
}

/// leasewrap's end for the child's raw wait status.
fn exit_of(status: i32) -> Exit {
    if libc::WIFSIGNALED(status) {
        match Signal::try_from(libc::WTERMSIG(status)) {
            Ok(sig) => Exit::Signal(sig),
            Err(_) => Exit::Code(128u8.wrapping_add(libc::WTERMSIG(status) as u8)),
        }
    } else {
        Exit::Code(libc::WEXITSTATUS(status) as u8)
    }
}

/// The lease's variables for the child (SPEC §2).
fn lease_env(cfg: &Config, held: &Held) -> Vec<(String, String)> {
    let mut set = vec![
        ("LEASEWRAP_FENCING_TOKEN", held.token.to_string()),
        ("LEASEWRAP_NAME", cfg.name.clone()),
        ("LEASEWRAP_KEY", held.key.clone()),
    ];
    match &cfg.backend {
        Backend::Local { dir } => set.push(("LEASEWRAP_LOCAL_DIR", dir.display().to_string())),
        Backend::Etcd(e) => {
            set.push(("LEASEWRAP_ENDPOINTS", e.endpoints.join(",")));
            set.push(("LEASEWRAP_PREFIX", e.prefix.clone()));
            set.push(("ETCD_LOCK_KEY", held.key.clone()));
            set.push(("ETCD_LOCK_REV", held.token.to_string()));
        }
    }
    if let Some(id) = held.lease_id {
        set.push(("LEASEWRAP_LEASE_ID", format!("{id:x}")));
    }
    set.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// Variables that a leasewrap of ours may set in the child: never passed on from our own
/// environment (a nested leasewrap must not leak its parent's values where it sets none).
const LEASE_VARS: &[&str] = &[
    "LEASEWRAP_FENCING_TOKEN",
    "LEASEWRAP_KEY",
    "LEASEWRAP_LEASE_ID",
    "ETCD_LOCK_KEY",
    "ETCD_LOCK_REV",
];

/// The child's environment before the lease is known: ours, less passwords (also those written
/// as USER:PASSWORD), NOTIFY_SOCKET and the lease's own variables.
fn base_env() -> Vec<(OsString, OsString)> {
    let removed = |k: &OsString| {
        let k = k.to_string_lossy();
        k.ends_with("_PASSWORD") || k == "NOTIFY_SOCKET" || LEASE_VARS.contains(&k.as_ref())
    };
    std::env::vars_os()
        .filter(|(k, _)| !removed(k))
        .map(|(k, v)| {
            // USER:PASSWORD, as etcdctl takes it, keeps its user and loses its password.
            let user_var = k == "LEASEWRAP_USER" || k == "ETCDCTL_USER";
            match v.to_str().and_then(|v| v.split_once(':')) {
                Some((user, _)) if user_var => (k, user.into()),
                _ => (k, v),
            }
        })
        .collect()
}

/// Who holds the lease, as JSON: host, pid, command, start time.
fn holder_record(cfg: &Config) -> Vec<u8> {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let command: Vec<String> = cfg
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "host": host,
        "pid": std::process::id(),
        "command": command,
        "start": start,
    }))
    .unwrap_or_default()
}
