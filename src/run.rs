//! Where lease, child and signals meet: take the lease, start the child under the watchdog, pass
//! each new deadline on, stop the child when the lease is lost, give the lease back, and turn the
//! child's end into leasewrap's own exit. Each `select!` arm calls a named function.

use std::ffi::OsString;
use std::future::pending;

use nix::sys::signal::{SigSet, Signal};
use tokio::signal::unix::{signal, Signal as SignalStream, SignalKind};
use tracing::{debug, error, info, warn};

use crate::config::{self, Backend, Config, EtcdConfig, Wait};
use crate::error::Error;
use crate::lease::backend::{self, Lessor};
use crate::lease::report::Holder;
use crate::lease::{Held, LeaseEvent, LossReason};
use crate::notify::Notifier;
use crate::runs::book::Book;
use crate::supervise::protocol::ToWatchdog;
use crate::supervise::{self, ChildSpec, Event, Exit, Forked, Lease, Supervisor};

/// The signals leasewrap forwards to the child (or that end a wait).
struct Signals([SignalStream; 4]);

const FORWARDED: [(SignalKind, Signal); 4] = [
    (SignalKind::terminate(), Signal::SIGTERM),
    (SignalKind::interrupt(), Signal::SIGINT),
    (SignalKind::hangup(), Signal::SIGHUP),
    (SignalKind::quit(), Signal::SIGQUIT),
];

impl Signals {
    /// Hold the forwarded signals back until [`Signals::new`] has handlers for them: the child
    /// may start before the runtime does, and such a signal must reach it, not end leasewrap.
    fn hold() {
        let _ = Self::mask().thread_block();
    }

    /// Install the handlers, then let the signals held back through.
    fn new() -> Result<Self, Error> {
        let install = |k| signal(k).map_err(|e| Error::internal("installing signal handlers", e));
        let signals = Self([
            install(FORWARDED[0].0)?,
            install(FORWARDED[1].0)?,
            install(FORWARDED[2].0)?,
            install(FORWARDED[3].0)?,
        ]);
        Self::mask()
            .thread_unblock()
            .map_err(|e| Error::internal("unblocking signals", e))?;
        Ok(signals)
    }

    fn mask() -> SigSet {
        let mut set = SigSet::empty();
        FORWARDED.iter().for_each(|(_, s)| set.add(*s));
        set
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

/// Run the child of `cfg` under its lease, and account for it (--once, --metrics-file). The
/// watchdog is forked first, while this is leasewrap's only thread; then a free local lock is
/// taken and the child started; then the runtime starts.
pub fn run(cfg: &Config) -> Result<Exit, Error> {
    Signals::hold();
    let book = Book::open(cfg);
    let notifier = Notifier::from_env();
    notifier.send(&format!("STATUS=waiting for lease {}", cfg.name));
    let early = fork_watchdog(cfg).and_then(|mut watchdog| {
        backend::announce(cfg);
        let held = start_early(cfg, &mut watchdog)?;
        Ok((watchdog, held))
    });
    crate::block_on(async {
        let mut book = book;
        let ended = match early {
            Ok((watchdog, held)) => run_in(cfg, &mut book, &notifier, watchdog, held).await,
            Err(e) => Err(e),
        };
        book.close(&ended);
        ended
    })
}

/// A local lock that is free needs no runtime to take: take it and start the child at once, so
/// that the runtime starts while the child does. Not with --once, whose record is read before
/// the child may start; `None` when the lease must be waited for (or is on etcd).
fn start_early(cfg: &Config, watchdog: &mut Forked) -> Result<Option<Held>, Error> {
    if cfg.once.is_some() {
        return Ok(None);
    }
    let record = Holder::this_process(&cfg.command).to_record();
    let held = backend::take_now(cfg, &record)?;
    if let Some(held) = &held {
        watchdog.start(&child_lease(&lease_env(cfg, held), held));
    }
    Ok(held)
}

/// What the child is started under.
fn child_lease<'a>(env: &'a [(String, String)], held: &'a Held) -> Lease<'a> {
    Lease {
        env,
        kill_after: held.kill_after,
        deadline: held.deadline,
        keep: held.keep_fd(),
    }
}

/// Find COMMAND (127 or 126 before anything is taken) and fork the watchdog, which then waits
/// while the lease is taken.
fn fork_watchdog(cfg: &Config) -> Result<Forked, Error> {
    let program = supervise::resolve(&cfg.command[0])?;
    Supervisor::fork(ChildSpec {
        program: &program,
        argv: &cfg.command,
        env: base_env(),
        stop_signal: cfg.signal,
    })
}

async fn run_in(
    cfg: &Config,
    book: &mut Book<'_>,
    notifier: &Notifier,
    watchdog: Forked,
    early: Option<Held>,
) -> Result<Exit, Error> {
    let mut sup = Supervisor::new(watchdog)?;
    let mut signals = Signals::new()?;
    let mut held = match early {
        // Without --once, before_start only notes the token: it cannot refuse.
        Some(held) => book.before_start(&held).await.map(|()| held)?,
        None => take_and_start(cfg, book, &mut sup, &mut signals).await?,
    };
    book.child_started(&mut held);
    crate::log::note(None, Some(held.token), None);
    info!(name = %cfg.name, token = held.token, "acquired");
    let outcome = hold(cfg, &mut held, &mut sup, &mut signals, notifier).await;
    let outcome = book.after_run(&mut held, outcome).await;
    notifier.send("STOPPING=1");
    let token = held.token;
    held.release().await;
    info!(name = %cfg.name, token, "released");
    outcome
}

/// Take the lease (waiting as `-n`/`-w` say), check --once's record, and start the child.
async fn take_and_start(
    cfg: &Config,
    book: &mut Book<'_>,
    sup: &mut Supervisor,
    signals: &mut Signals,
) -> Result<Held, Error> {
    let mut lessor = backend::lessor(cfg).await?;
    if let Some(key) = book.once_key() {
        lessor.read_along(&cfg.name, key);
    }
    let held = acquire(cfg, &mut *lessor, signals).await?;
    if let Err(skip) = book.before_start(&held).await {
        held.release().await;
        return Err(skip);
    }
    sup.start(&child_lease(&lease_env(cfg, &held), &held));
    Ok(held)
}

/// Wait for the lease as `-n`/`-w` say; a signal ends the wait and starts nothing.
async fn acquire(
    cfg: &Config,
    lessor: &mut dyn Lessor,
    signals: &mut Signals,
) -> Result<Held, Error> {
    let limit = async {
        match cfg.wait {
            Wait::For(d) => tokio::time::sleep(d).await,
            Wait::Forever | Wait::No => pending().await,
        }
    };
    let record = Holder::this_process(&cfg.command).to_record();
    let result = tokio::select! {
        r = lessor.acquire(&cfg.name, &record, cfg.wait != Wait::No) => r,
        sig = signals.recv() => Err(Error::Interrupted(sig)),
        () = limit => Err(Error::WaitTimedOut {
            name: cfg.name.clone(),
            waited: format!("{:?}", match cfg.wait { Wait::For(d) => d, _ => Default::default() }),
        }),
    };
    match result {
        Err(Error::WaitTimedOut { name, waited }) => {
            let unavailable = lessor.unavailable();
            lessor.abandon().await;
            Err(match unavailable {
                Some(Error::Unavailable(why)) => Error::Unavailable(format!(
                    "gave up waiting for lease {name:?} after {waited} (-w): {why}"
                )),
                _ => Error::WaitTimedOut { name, waited },
            })
        }
        Err(e) => {
            lessor.abandon().await;
            Err(e)
        }
        ok => ok,
    }
}

/// What the lost lease, --max-runtime and the child's end add up to.
#[derive(Default)]
struct Ending {
    /// Why the lease was lost, if it was.
    lost: Option<String>,
    /// Whether --max-runtime ran out and the child's tree is being stopped.
    timed_out: bool,
}

impl Ending {
    /// The lease is lost: the one log line that says so.
    fn lose(&mut self, cfg: &Config, token: u64, why: LossReason) {
        error!(name = %cfg.name, token, reason = %why, "lease lost: stopping the child");
        self.lost = Some(why.to_string());
    }

    /// The watchdog's deadline came: the lease is lost, unless it already was for another reason.
    fn deadline_passed(&mut self, cfg: &Config, token: u64) {
        if self.lost.is_none() {
            self.lose(cfg, token, LossReason::DeadlinePassed);
        }
    }

    /// --max-runtime ran out: stop the whole tree as for a lost lease, keeping the lease.
    fn time_out(&mut self, cfg: &Config, token: u64, sup: &mut Supervisor) {
        error!(name = %cfg.name, token, max_runtime = ?cfg.max_runtime.unwrap_or_default(), "--max-runtime ran out: stopping the child");
        sup.send(ToWatchdog::Stop);
        self.timed_out = true;
    }

    /// How leasewrap ends once leasewrap itself killed the tree, the watchdog having `what`:
    /// as for a lost lease if it was lost, else as its own failure.
    fn without_watchdog(&mut self, cfg: &Config, what: &str) -> Result<Exit, Error> {
        match self.lost.take() {
            Some(why) => Err(Error::Lost {
                name: cfg.name.clone(),
                why,
            }),
            None => Err(Error::Internal(format!(
                "the watchdog {what}: the child's whole process tree was killed"
            ))),
        }
    }

    /// How leasewrap ends once the child's tree is gone.
    fn finish(&mut self, cfg: &Config, exit: Exit) -> Result<Exit, Error> {
        let name = cfg.name.clone();
        match (self.lost.take(), self.timed_out) {
            (Some(why), _) => Err(Error::Lost { name, why }),
            (None, true) => Err(Error::TimedOut {
                name,
                after: format!("{:?}", cfg.max_runtime.unwrap_or_default()),
            }),
            (None, false) => Ok(exit),
        }
    }
}

/// Done when --max-runtime has passed since the child was started; never without it.
async fn runtime_limit(limit: Option<std::time::Duration>) {
    match limit {
        Some(d) => tokio::time::sleep(d).await,
        None => pending().await,
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
    let limit = runtime_limit(cfg.max_runtime);
    tokio::pin!(limit);
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
            () = &mut limit, if !ending.timed_out => ending.time_out(cfg, held.token, sup),
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
            ending.deadline_passed(cfg, token);
            None
        }
        Event::Exited(exit) => Some(ending.finish(cfg, exit)),
        Event::SpawnFailed(e) => Some(Err(e)),
        Event::WatchdogDied => Some(ending.without_watchdog(cfg, "died")),
        Event::WatchdogStopped { deadline_passed } => {
            if deadline_passed {
                ending.deadline_passed(cfg, token);
            }
            Some(ending.without_watchdog(cfg, "was stopped"))
        }
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
        LeaseEvent::Lost(why, deadline) => {
            if let Some(d) = deadline {
                // A loss can bring D down (a shorter session timeout): the SIGKILL comes by it.
                sup.send(ToWatchdog::Deadline(Some(d)));
            }
            sup.send(ToWatchdog::Stop);
            ending.lose(cfg, token, why);
        }
    }
}

/// One variable the child gets from its lease (SPEC §2).
struct LeaseVar {
    name: &'static str,
    /// It describes this very lease, not how to reach the backend: never passed on from our
    /// own environment, so a nested leasewrap does not leak its parent's value where it sets none.
    own: bool,
    /// Its value for this lease; none where it does not apply to the backend.
    value: fn(&Config, &Held) -> Option<String>,
}

/// Every variable of the lease, the one list of them.
const LEASE_VARS: &[LeaseVar] = &[
    LeaseVar {
        name: "LEASEWRAP_FENCING_TOKEN",
        own: true,
        value: |_, held| Some(held.token.to_string()),
    },
    LeaseVar {
        name: "LEASEWRAP_NAME",
        own: false,
        value: |cfg, _| Some(cfg.name.clone()),
    },
    LeaseVar {
        name: "LEASEWRAP_KEY",
        own: true,
        value: |_, held| Some(held.key.clone()),
    },
    LeaseVar {
        name: "LEASEWRAP_LOCAL_DIR",
        own: false,
        value: |cfg, _| match &cfg.backend {
            Backend::Local { dir } => Some(dir.display().to_string()),
            _ => None,
        },
    },
    LeaseVar {
        name: "LEASEWRAP_ENDPOINTS",
        own: false,
        value: |cfg, _| etcd(cfg).map(|e| e.endpoints.join(",")),
    },
    LeaseVar {
        name: "LEASEWRAP_ZOOKEEPER",
        own: false,
        value: |cfg, _| match &cfg.backend {
            Backend::Zk(z) => Some(z.connect.clone()),
            _ => None,
        },
    },
    LeaseVar {
        name: "LEASEWRAP_DATABASE",
        own: false,
        value: |cfg, _| match &cfg.backend {
            Backend::Db(d) => Some(d.url.clone()),
            _ => None,
        },
    },
    LeaseVar {
        name: "LEASEWRAP_PREFIX",
        own: false,
        value: |cfg, _| match &cfg.backend {
            Backend::Etcd(e) => Some(e.prefix.clone()),
            Backend::Zk(z) => Some(z.conn.prefix.clone()),
            Backend::Local { .. } | Backend::Db(_) => None,
        },
    },
    LeaseVar {
        name: "ETCD_LOCK_KEY",
        own: true,
        value: |cfg, held| etcd(cfg).map(|_| held.key.clone()),
    },
    LeaseVar {
        name: "ETCD_LOCK_REV",
        own: true,
        value: |cfg, held| etcd(cfg).map(|_| held.token.to_string()),
    },
    LeaseVar {
        name: "LEASEWRAP_LEASE_ID",
        own: true,
        value: |_, held| held.lease_id.map(|id| format!("{id:x}")),
    },
];

fn etcd(cfg: &Config) -> Option<&EtcdConfig> {
    match &cfg.backend {
        Backend::Etcd(e) => Some(e),
        _ => None,
    }
}

/// The lease's variables for the child.
fn lease_env(cfg: &Config, held: &Held) -> Vec<(String, String)> {
    LEASE_VARS
        .iter()
        .filter_map(|v| Some((v.name.to_owned(), (v.value)(cfg, held)?)))
        .collect()
}

/// The child's environment before the lease is known: ours, less passwords (also those written
/// as USER:PASSWORD), NOTIFY_SOCKET and the lease's own variables.
fn base_env() -> Vec<(OsString, OsString)> {
    let removed = |k: &OsString| {
        let k = k.to_string_lossy();
        k.ends_with("_PASSWORD")
            || k == "NOTIFY_SOCKET"
            || LEASE_VARS.iter().any(|v| v.own && v.name == k)
    };
    std::env::vars_os()
        .filter(|(k, _)| !removed(k))
        .map(|(k, v)| {
            // USER:PASSWORD, as etcdctl takes it, keeps its user and loses its password.
            if config::USER_VARS.iter().any(|u| k == *u) {
                let user = config::user_part(&v).to_owned();
                (k, user)
            } else {
                (k, v)
            }
        })
        .collect()
}
