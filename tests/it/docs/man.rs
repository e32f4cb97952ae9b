//! The man pages: what clap_mangen makes of the clap definitions, with the sections clap does not
//! know added by hand (EXIT STATUS from the code's own tables, ENVIRONMENT, FILES, EXAMPLES).
//! One page per command: `leasewrap.1` and `leasewrap-SUBCOMMAND.1`.

use clap::CommandFactory;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;

/// Variables leasewrap reads, and what for.
pub const READ: &[(&str, &str)] = &[
    (
        "LEASEWRAP_ENDPOINTS, ETCDCTL_ENDPOINTS",
        "etcd endpoints, comma separated (--endpoints). When none is set anywhere, the local backend is used.",
    ),
    ("LEASEWRAP_PREFIX", "key prefix of the lock keys (--prefix); default leasewrap/."),
    ("LEASEWRAP_CACERT, ETCDCTL_CACERT", "CA bundle to verify etcd's certificate (--cacert)."),
    ("LEASEWRAP_CERT, ETCDCTL_CERT", "client certificate for TLS (--cert)."),
    (
        "LEASEWRAP_KEY_FILE, ETCDCTL_KEY",
        "client key for TLS (--key). Not LEASEWRAP_KEY, which is the lock key given to COMMAND.",
    ),
    ("LEASEWRAP_USER, ETCDCTL_USER", "etcd user, or USER:PASSWORD (--user)."),
    ("LEASEWRAP_PASSWORD_FILE", "file whose first line is the etcd password (--password-file)."),
    (
        "LEASEWRAP_PASSWORD, ETCDCTL_PASSWORD",
        "the etcd password itself, when neither --password-file nor USER:PASSWORD gives it.",
    ),
    (
        "LEASEWRAP_DIAL_TIMEOUT, ETCDCTL_DIAL_TIMEOUT",
        "how long to wait for etcd before giving up with status 69 (--dial-timeout).",
    ),
    ("LEASEWRAP_TTL", "lease TTL to ask for (--ttl)."),
    ("LEASEWRAP_LOCAL_DIR", "local backend state directory (--local-dir)."),
    (
        "XDG_STATE_HOME, HOME",
        "the default local directory when not root: $XDG_STATE_HOME/leasewrap, else $HOME/.local/state/leasewrap.",
    ),
    ("LEASEWRAP_LOG_FORMAT", "log line format on stderr, text or json (--log-format)."),
    (
        "LEASEWRAP_LOG",
        "a filter for log lines, such as debug or leasewrap=debug; it overrides -q and -v (see LOGS).",
    ),
    (
        "NOTIFY_SOCKET",
        "set by systemd: leasewrap sends STATUS= while waiting and holding, READY=1 once COMMAND has started, and STOPPING=1 on the way out.",
    ),
    ("PATH", "where COMMAND is looked up when it has no slash."),
    ("LEASEWRAP_FENCING_TOKEN", "the default --token of fenced-write and fenced-put."),
    ("LEASEWRAP_KEY", "the default --lock-key of fenced-put."),
];

/// Variables COMMAND gets on top of leasewrap's own environment.
pub const GIVEN: &[(&str, &str)] = &[
    (
        "LEASEWRAP_FENCING_TOKEN",
        "the fencing token (decimal): it grows with every new holder of the lease.",
    ),
    ("LEASEWRAP_NAME", "the lease name."),
    (
        "LEASEWRAP_KEY",
        "the lock key (etcd) or the lock file (local).",
    ),
    (
        "LEASEWRAP_LEASE_ID",
        "the etcd lease id, in hex (etcd only).",
    ),
    (
        "LEASEWRAP_ENDPOINTS, LEASEWRAP_PREFIX",
        "where the lease lives, so that COMMAND can call leasewrap fenced-put (etcd only).",
    ),
    (
        "LEASEWRAP_LOCAL_DIR",
        "the local backend's directory (local only).",
    ),
    (
        "ETCD_LOCK_KEY, ETCD_LOCK_REV",
        "the lock key, and its create revision (the fencing token), for scripts written for etcdctl lock; etcdctl itself gives the revision at which it acquired, which also grows with each holder (etcd only).",
    ),
];

/// Exit statuses of fenced-write and fenced-put beyond those of leasewrap(1).
const FENCED_EXIT: &[(&str, &str)] = &[
    ("0", "written"),
    ("73", "refused: the token is lower than one already seen (fenced-write) or the lock key no longer has it (fenced-put); nothing was written"),
];

/// Every page, as (file name, roff text).
pub fn pages() -> Vec<(String, String)> {
    let mut cmd = leasewrap::cli::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = vec![("leasewrap.1".to_owned(), main_page(&cmd))];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let man = page_of(sub.clone());
        let text = match sub.get_name() {
            "status" => status_page(&man),
            _ => fenced_page(&man),
        };
        pages.push((man.get_filename(), text));
    }
    pages
}

/// The forms of the main command, for its SYNOPSIS (clap's own lists options without values).
const FORMS: &[&str] = &[
    "[OPTIONS] -- COMMAND [ARG]...",
    "[OPTIONS] -c 'SHELL STRING'",
    "status [OPTIONS] [NAME]",
    "fenced-write [--token N] DEST",
    "fenced-put [OPTIONS] [--token N] [--lock-key KEY] KEY VALUE",
];

/// The sections clap_mangen renders, less its EXTRA (the --help pointer to this page); the main
/// page has its own SYNOPSIS and the SUBCOMMANDS list.
fn generated(man: &Man, main: bool) -> String {
    let mut title = Vec::new();
    man.render_title(&mut title).unwrap();
    let mut out = String::from_utf8(title).unwrap();
    out += &body(|w| man.render_name_section(w));
    if main {
        let mut synopsis = Sections::new();
        synopsis.heading("SYNOPSIS");
        for form in FORMS {
            synopsis
                .0
                .text([bold("leasewrap"), roman(format!(" {form}"))]);
            synopsis.0.control("br", []);
        }
        out += &synopsis.render();
    } else {
        out += &body(|w| man.render_synopsis_section(w));
    }
    out += &body(|w| man.render_description_section(w));
    out += &body(|w| man.render_options_section(w));
    if main {
        out += &body(|w| man.render_subcommands_section(w));
    }
    out
}

/// One section as clap_mangen renders it, without the preamble every render starts with.
fn body(render: impl Fn(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut text = Vec::new();
    render(&mut text).unwrap();
    String::from_utf8(text).unwrap()[Roff::new().render().len()..].to_owned()
}

/// clap_mangen's page for `cmd`, with leasewrap's version as the source in the footer.
fn page_of(cmd: clap::Command) -> Man {
    Man::new(cmd).source(concat!("leasewrap ", env!("CARGO_PKG_VERSION")))
}

/// Hand-written sections, rendered without a second preamble.
struct Sections(Roff);

impl Sections {
    fn new() -> Self {
        Sections(Roff::new())
    }

    fn heading(&mut self, title: &str) -> &mut Self {
        self.0.control("SH", [title]);
        self
    }

    fn para(&mut self, text: &str) -> &mut Self {
        self.0.control("PP", []).text([roman(text)]);
        self
    }

    /// A tagged paragraph: `term` in bold, `text` indented below it.
    fn item(&mut self, term: &str, text: &str) -> &mut Self {
        self.0
            .control("TP", [])
            .text([bold(term)])
            .text([roman(text)]);
        self
    }

    fn items(&mut self, rows: &[(&str, &str)]) -> &mut Self {
        rows.iter().for_each(|(t, d)| {
            self.item(t, d);
        });
        self
    }

    /// `intro`, then `lines` as an indented literal block.
    fn example(&mut self, intro: &str, lines: &[&str]) -> &mut Self {
        self.para(intro);
        self.0.control("RS", ["4"]).control("nf", []);
        lines.iter().for_each(|l| {
            self.0.text([roman(*l)]);
        });
        self.0.control("fi", []).control("RE", []);
        self
    }

    fn see_also(&mut self, refs: &[(&str, &str)]) -> &mut Self {
        self.heading("SEE ALSO");
        let mut inlines = Vec::new();
        for (i, (page, section)) in refs.iter().enumerate() {
            let sep = if i + 1 < refs.len() { ", " } else { "" };
            inlines.push(bold(*page));
            inlines.push(roman(format!("({section}){sep}")));
        }
        self.0.text(inlines);
        self
    }

    /// The version, last, as clap_mangen writes it on the main page.
    fn version(&mut self) -> &mut Self {
        self.heading("VERSION");
        self.0
            .text([roman(concat!("v", env!("CARGO_PKG_VERSION")))]);
        self
    }

    fn render(&self) -> String {
        body(|w| self.0.to_writer(w))
    }
}

fn main_page(cmd: &clap::Command) -> String {
    let man = page_of(cmd.clone());
    let mut s = Sections::new();
    s.heading("EXIT STATUS")
        .para("leasewrap ends with its child's status, or says why it did not:")
        .items(leasewrap::error::EXIT_STATUS_TABLE)
        .para("leasewrap status has statuses of its own: see leasewrap-status(1).");
    s.heading("ENVIRONMENT")
        .para("Options given on the command line win over the environment; a LEASEWRAP_ variable wins over its ETCDCTL_ twin. An empty variable counts as unset, except LEASEWRAP_PREFIX, where empty means the empty prefix (so a child of --prefix '' that runs leasewrap again stays on it). --name never comes from the environment: a child that runs leasewrap again must not queue behind itself. A bad value in a variable is reported under the variable's name (LEASEWRAP_LOG_FORMAT: invalid value 'JSON' ...), not as the option it stands for.")
        .items(READ)
        .para("COMMAND gets leasewrap's environment less every variable whose name ends in _PASSWORD, the password part of a USER:PASSWORD in LEASEWRAP_USER or ETCDCTL_USER, and NOTIFY_SOCKET, plus:")
        .items(GIVEN)
        .para("No file descriptor of leasewrap's (lock files, sockets) is passed on to COMMAND.");
    s.heading("ONCE PER SCHEDULED RUN")
        .para("A lease gives mutual exclusion; --once gives a job that runs once per schedule on a fleet, and retries on another host when a run fails.")
        .items(leasewrap::runs::MAN_SECTION);
    s.heading("LOGS").items(leasewrap::log::MAN_SECTION);
    s.heading("SECURITY").items(leasewrap::cli::SECURITY_NOTES);
    s.heading("FILES")
        .item("DIR/NAME.lock", "the local backend's lock file, locked with flock(2) while the lease is held; it holds the holder's record (JSON: host, pid, command, start). DIR is --local-dir, by default /var/lib/leasewrap as root.")
        .item("DIR/NAME.token", "the local backend's fencing token counter. It must survive reboots: never delete it.")
        .item("DIR/runs/NAME/KEY.json", "the local backend's run record of KEY (--once, --once-per): JSON with format, name, key, outcome, attempts, host, pid, token, start, end, exit_status, signal and keep_until (times in seconds since the epoch).");
    examples_main(&mut s);
    s.see_also(&[
        ("leasewrap-status", "1"),
        ("leasewrap-fenced-write", "1"),
        ("leasewrap-fenced-put", "1"),
        ("flock", "1"),
        ("etcdctl", "1"),
        ("systemd.service", "5"),
        ("sd_notify", "3"),
    ]);
    s.version();
    generated(&man, true) + &s.render()
}

fn examples_main(s: &mut Sections) {
    s.heading("EXAMPLES")
        .example(
            "Run a nightly job on one host of many; the others end at once with status 0:",
            &["leasewrap --no-wait -E 0 --name nightly-report -- /usr/local/bin/nightly-report"],
        )
        .example(
            "The same on etcd over TLS, endpoints from the environment:",
            &[
                "export LEASEWRAP_ENDPOINTS=https://etcd1:2379,https://etcd2:2379,https://etcd3:2379",
                "export LEASEWRAP_CACERT=/etc/leasewrap/ca.crt",
                "leasewrap --name nightly-report -- /usr/local/bin/nightly-report",
            ],
        )
        .example(
            "A shell string needs a name; the child writes its result only while its token is the newest:",
            &["leasewrap --name report -c 'make-report | leasewrap fenced-write /srv/report.html'"],
        )
        .example(
            "Share a lock with etcdctl lock (the same key layout without a prefix):",
            &["leasewrap --prefix '' --name db-migrate -- ./migrate"],
        )
        .example(
            "Run the nightly report once a night on a fleet, whichever host fires first; the others, and any that catch up late, end with status 0:",
            &["leasewrap -w 10m -E 0 --once-per 1d --metrics-file /var/lib/node_exporter/textfile/nightly-report.prom --name nightly-report -- /usr/local/bin/nightly-report"],
        )
        .example(
            "Who holds what, for people and for scripts:",
            &[
                "leasewrap status",
                "leasewrap status --json nightly-report | jq .token",
            ],
        );
}

fn status_page(man: &Man) -> String {
    let mut s = Sections::new();
    s.heading("OUTPUT")
        .para("One line per lease under a header, in aligned columns: NAME, STATE (held or free), TOKEN (the holder's fencing token), TIME LEFT, WAITERS, and the holder's HOST, PID (of its leasewrap) and COMMAND. A - means the column does not apply (a free lease; time left on the local backend, where the lock lasts as long as its holder process); a ? means it is not known (an etcdctl lock holder records no host or command).")
        .para("Without NAME every lease is listed: each NAME with a key under the prefix on etcd, each NAME.lock in the local directory. A free lease that was never taken is shown only when named.")
        .para("On etcd, TIME LEFT is the server's time to live of the holder's lease: the holder stops its child before it runs out. WAITERS counts the keys queued behind the holder's. On the local backend WAITERS counts the processes blocked in flock(2) on the lock file, from /proc/locks; it is ? when the holder's lock is not listed there (a holder in another PID namespace).");
    s.para("With --json: one JSON object when NAME is given, else an array of them, each with the fields name, backend (etcd or local), held, holder (null, or host, pid, command as an array, start in seconds since the epoch), token, time_left_s, ttl_s (the granted TTL), waiters and key (the holder's lock key or lock file); null where the text shows - or ?.");
    s.para("Run records (--once, --once-per) follow the leases, after a blank line, when there are any: the last 10 runs of each lease listed, newest first, with NAME, KEY, OUTCOME (ran-ok, failed, lost or timed-out), RUNS (runs of KEY so far, on every host), TOKEN, HOST and PID of the leasewrap that ran it, START, END (RFC 3339, UTC) and STATUS (the exit status, or the signal). In --json each lease has them as runs, an array of the records as stored (format, name, key, outcome, attempts, host, pid, token, start, end, exit_status, signal, keep_until; times in seconds since the epoch). A stored value that is not a run record is logged and left out.");
    s.para("With --once KEY NAME, status prints one line saying whether KEY is done, by whom and after how many runs, and exits 0 when it is done and 1 when it is not; with --json, one object with name, key, done and record (null before the first run).");
    s.para("status only reads: it creates no key, file or directory. On the local backend it tries a shared flock(2) on each lock file without waiting and lets go at once; a leasewrap --no-wait that tries to take the same lease in that instant is told that the lease is held.");
    s.heading("EXIT STATUS")
        .items(leasewrap::status::EXIT_STATUS_TABLE);
    s.heading("EXAMPLES")
        .example(
            "Alert when no host runs the singleton daemon scheduler:",
            &["leasewrap status scheduler >/dev/null || echo 'no scheduler is running' | mail -s alert ops"],
        )
        .example(
            "The token of the current holder:",
            &["leasewrap status --json nightly-report | jq .token"],
        );
    s.see_also(&[("leasewrap", "1")]);
    s.version();
    generated(man, false) + &s.render()
}

fn fenced_page(man: &Man) -> String {
    let mut s = Sections::new();
    s.heading("EXIT STATUS")
        .items(FENCED_EXIT)
        .para("Other statuses (64, 69, 77, 78, 125) as in leasewrap(1).");
    s.see_also(&[("leasewrap", "1")]);
    s.version();
    generated(man, false) + &s.render()
}
