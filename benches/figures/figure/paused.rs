//! Figure 12: the paused leader, the case leasewrap exists for (SPEC §9 F6), as a picture.
//!
//! A holds the lease; A's whole process tree (the lock tool and its child) is SIGSTOPped as a
//! paused host or VM would be, for 2 × TTL; B takes over and writes; then A's child resumes
//! first (the worst case: it gets its write in before its supervisor can act), tries its write,
//! and the rest of A's tree resumes. One run each of `etcdctl lock` (etcd 3.4), leasewrap on
//! etcd, a kazoo Lock that kills its child on SUSPENDED or LOST (benches/figures/kazoo_lock.py),
//! and leasewrap on ZooKeeper. leasewrap's children write through `leasewrap fenced-write`, the
//! others' with a plain write that nothing refuses.
//!
//! Instants: a child's start is the execve of a private copy of `sh` (inotify IN_OPEN), a write
//! is IN_MODIFY on the file its status goes to once the write returned, a death is the child's
//! pidfd; the pause and the resumes are the harness's own instants. The timed waits are the
//! scenario's: A holds for `HELD` before the pause, the pause lasts 2 × TTL, and the harness
//! watches `AFTER` once A's tree runs again.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{getpgid, Pid};

use super::zookeeper::argv_zk;
use crate::bench::{os, Bench, Lock, Tool, START_BOUND};
use crate::picture::{self, Lane, Panel, Span, State, Verdict, Write};
use crate::procs::{descendants, parent_of, pids_running, state_of};
use crate::report::{Figure, Row};
use crate::support::zookeeper::Zk;

/// The lease's TTL (etcd) and session timeout (ZooKeeper), for every tool.
const TTL: Duration = Duration::from_secs(2);

/// How long A's child runs before the pause.
const HELD: Duration = Duration::from_secs(1);

/// How long the harness watches once the whole of A's tree runs again.
const AFTER: Duration = Duration::from_secs(1);

/// Where the picture goes, under docs/ (`--write`) or beside the `--output` file.
pub const PICTURE: &str = "paused-leader.svg";

const A_START: &str = "paused-a-start";
const B_START: &str = "paused-b-start";
const A_WROTE: &str = "paused-a-wrote";
const B_WROTE: &str = "paused-b-wrote";
const A_EXIT: &str = "paused-a-exit";

/// A's child: wait for `go` (bounded), write the report, note the write's status, run on.
const A_SCRIPT: &str = r#"d=$1
i=0; while [ ! -e "$d/go" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i + 1)); done
if [ "$2" = plain ]; then echo 'from A' >"$d/report.csv"; rc=$?
else echo 'from A' | "$2" fenced-write "$d/report.csv"; rc=$?; fi
echo $rc >"$d/a.status"
exec sleep 1000
"#;

/// B's child: write the report at once, note the write's status, run on.
const B_SCRIPT: &str = r#"d=$1
if [ "$2" = plain ]; then echo 'from B' >"$d/report.csv"; rc=$?
else echo 'from B' | "$2" fenced-write "$d/report.csv"; rc=$?; fi
echo $rc >"$d/b.status"
exec sleep 1000
"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Subject {
    Etcdctl,
    LeasewrapEtcd,
    Kazoo,
    LeasewrapZk,
}

impl Subject {
    const ALL: [Subject; 4] = [
        Subject::Etcdctl,
        Subject::LeasewrapEtcd,
        Subject::Kazoo,
        Subject::LeasewrapZk,
    ];

    fn name(self) -> &'static str {
        match self {
            Subject::Etcdctl => "etcdctl lock (etcd 3.4)",
            Subject::LeasewrapEtcd => "leasewrap on etcd",
            Subject::Kazoo => "kazoo Lock, killing on SUSPENDED",
            Subject::LeasewrapZk => "leasewrap on ZooKeeper",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Subject::Etcdctl => "etcdctl",
            Subject::LeasewrapEtcd => "lw-etcd",
            Subject::Kazoo => "kazoo",
            Subject::LeasewrapZk => "lw-zk",
        }
    }

    /// What stops A's child, if anything does.
    fn supervisor(self) -> &'static str {
        match self {
            Subject::Etcdctl => "etcdctl",
            Subject::Kazoo => "kazoo",
            _ => "its watchdog",
        }
    }

    fn fenced(self) -> bool {
        matches!(self, Subject::LeasewrapEtcd | Subject::LeasewrapZk)
    }
}

/// One run, instants in seconds from the pause.
struct Case {
    subject: Subject,
    a_started: f64,
    /// A's child's SIGCONT, and the rest of A's tree's, once the child's write was answered.
    child_resumed: f64,
    rest_resumed: f64,
    a_wrote: f64,
    a_status: String,
    /// None: still running when the harness ended the run.
    a_died: Option<f64>,
    b_started: f64,
    b_wrote: f64,
    b_status: String,
    ended: f64,
    /// What the report file held at the end.
    report: String,
    /// A's lock tool's exit status (None: still running when the harness ended the run).
    holder_exit: Option<i32>,
}

pub fn figure(bench: &mut Bench) -> Figure {
    let zk = Zk::start();
    bench.procs.spare(zk.pid().expect("ZooKeeper runs") as i32);
    let python = kazoo_python();
    let cases: Vec<Case> = Subject::ALL
        .into_iter()
        .map(|s| once(bench, &zk, &python, s))
        .collect();
    let by = |s: Subject| {
        cases
            .iter()
            .find(|c| c.subject == s)
            .expect("every subject ran")
    };
    let rows = vec![
        row(
            "paused-etcd",
            "etcd 3.4",
            by(Subject::LeasewrapEtcd),
            by(Subject::Etcdctl),
        ),
        row(
            "paused-zk",
            "ZooKeeper",
            by(Subject::LeasewrapZk),
            by(Subject::Kazoo),
        ),
    ];
    let svg = picture::timelines(
        "The paused leader: A's whole tree is paused past the TTL, B takes over and writes, \
         A wakes and writes",
        "seconds since A's whole tree was paused (SIGSTOP); TTL 2 s",
        axis(&cases),
        &cases.iter().map(Case::panel).collect::<Vec<_>>(),
    );
    Figure {
        rows,
        notes: vec![note(&cases, &zk)],
        pictures: vec![(PICTURE, svg)],
    }
}

fn row(id: &'static str, backend: &str, lw: &Case, other: &Case) -> Row {
    Row {
        leasewrap: lw.facts(),
        baseline: other.facts(),
        ..Row::new(
            id,
            format!(
                "12. the paused leader, {backend}: A's whole tree SIGSTOPped for 2 × TTL (TTL 2 s), \
                 B takes over and writes, A's child resumes first and writes"
            ),
        )
        .set("stale_accepted", Some(f64::from(u8::from(lw.stale_accepted()))))
    }
}

/// The interpreter of the python3 on the harness's PATH, which must have kazoo.
fn kazoo_python() -> PathBuf {
    let asked = std::process::Command::new("python3")
        .args(["-c", "import kazoo, sys; print(sys.executable)"])
        .output();
    match asked {
        Ok(out) if out.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
        _ => panic!(
            "figure 12 needs kazoo for the python3 on PATH: scripts/test.sh installs it \
             (pip install kazoo)"
        ),
    }
}

/// The run of `subject`: A holds, is paused whole, B takes over, A resumes child first.
fn once(bench: &mut Bench, zk: &Zk, python: &Path, subject: Subject) -> Case {
    let dir = bench.path(&format!("paused-{}", subject.short()));
    let setup = Setup::new(bench, &dir);
    bench.events.reset();
    let holder = bench
        .procs
        .spawn(&setup.argv(bench, zk, python, subject, 'a'), "paused", None);
    let a_started = wait(bench, A_START, START_BOUND, subject);
    let child = one_pid(&setup.sh('a'));
    bench.events.watch_exit(child, A_EXIT);
    thread::sleep((a_started + HELD).saturating_duration_since(Instant::now()));
    let tree = stop_tree(holder, child);
    let paused = Instant::now();
    let _b = bench
        .procs
        .spawn(&setup.argv(bench, zk, python, subject, 'b'), "paused", None);
    let b_started = wait(bench, B_START, 2 * TTL + START_BOUND, subject);
    let b_wrote = wait(bench, B_WROTE, START_BOUND, subject);
    thread::sleep((paused + 2 * TTL).saturating_duration_since(Instant::now()));
    fs::write(dir.join("go"), "").expect("write go");
    let child_resumed = Instant::now();
    signal_group(child, Signal::SIGCONT);
    let a_wrote = wait(bench, A_WROTE, START_BOUND, subject);
    let rest_resumed = Instant::now();
    for &pid in &tree {
        let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
    }
    let a_died = bench.events.wait_for(A_EXIT, AFTER);
    thread::sleep((rest_resumed + AFTER).saturating_duration_since(Instant::now()));
    let ended = Instant::now();
    let holder_exit = bench.procs.wait(holder, Duration::ZERO);
    let s = |t: Instant| secs_since(paused, t);
    let case = Case {
        subject,
        a_started: s(a_started),
        child_resumed: s(child_resumed),
        rest_resumed: s(rest_resumed),
        a_wrote: s(a_wrote),
        a_status: read(&dir.join("a.status")),
        a_died: a_died.map(s),
        b_started: s(b_started),
        b_wrote: s(b_wrote),
        b_status: read(&dir.join("b.status")),
        ended: s(ended),
        report: read(&dir.join("report.csv")),
        holder_exit,
    };
    bench.sweep();
    case
}

/// Signed seconds from `from` to `to`.
fn secs_since(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_secs_f64(),
        None => -from.duration_since(to).as_secs_f64(),
    }
}

/// The next `label` event within `bound`, or a panic naming the subject.
#[track_caller]
fn wait(bench: &mut Bench, label: &'static str, bound: Duration, subject: Subject) -> Instant {
    let got = bench.events.wait_for(label, bound);
    got.unwrap_or_else(|| panic!("{}: no {label} within {bound:?}", subject.name()))
}

/// The one process running `binary` whose parent does not (the script's own forks run it too,
/// until they exec `sleep`), once it shows in /proc.
#[track_caller]
fn one_pid(binary: &Path) -> i32 {
    let deadline = Instant::now() + START_BOUND;
    loop {
        let all = pids_running(binary);
        let first: Vec<i32> = all
            .iter()
            .copied()
            .filter(|&p| parent_of(p).is_none_or(|pp| !all.contains(&pp)))
            .collect();
        match first[..] {
            [pid] => return pid,
            [] if Instant::now() < deadline => thread::yield_now(),
            ref many => panic!("{}: run by {many:?}", binary.display()),
        }
    }
}

/// SIGSTOPs `holder` and every process below it, then the child's process group; returns the
/// processes stopped besides the child's group, once every one of them shows as stopped.
#[track_caller]
fn stop_tree(holder: i32, child: i32) -> Vec<i32> {
    let mut tree = vec![holder];
    tree.extend(descendants(holder));
    let group = getpgid(Some(Pid::from_raw(child))).expect("the child's group");
    for &pid in &tree {
        let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
    }
    killpg(group, Signal::SIGSTOP).expect("SIGSTOP the child's group");
    let deadline = Instant::now() + START_BOUND;
    while !tree.iter().all(|&p| state_of(p).is_none_or(|s| s == 'T')) {
        assert!(Instant::now() < deadline, "A's tree {tree:?} did not stop");
        thread::yield_now();
    }
    let in_group = |p: i32| getpgid(Some(Pid::from_raw(p))).is_ok_and(|g| g == group);
    tree.into_iter().filter(|&p| !in_group(p)).collect()
}

fn signal_group(member: i32, sig: Signal) {
    let group = getpgid(Some(Pid::from_raw(member))).expect("the child's group");
    killpg(group, sig).expect("signal the child's group");
}

fn read(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// A run's folder: the report, the status files, the scripts and the private copies of `sh`.
struct Setup {
    dir: PathBuf,
}

impl Setup {
    fn new(bench: &mut Bench, dir: &Path) -> Setup {
        fs::create_dir(dir).expect("create the run's dir");
        fs::write(dir.join("report.csv"), "v1 (before)\n").expect("write the report");
        let setup = Setup {
            dir: dir.to_owned(),
        };
        for (who, script, start, wrote) in [
            ('a', A_SCRIPT, A_START, A_WROTE),
            ('b', B_SCRIPT, B_START, B_WROTE),
        ] {
            fs::write(setup.script(who), script).expect("write a script");
            fs::copy("/bin/sh", setup.sh(who)).expect("copy sh");
            let status = dir.join(format!("{who}.status"));
            fs::write(&status, "").expect("create a status file");
            bench.events.watch_exec(&setup.sh(who), start);
            bench.events.watch_write(&status, wrote);
        }
        setup
    }

    fn sh(&self, who: char) -> PathBuf {
        self.dir.join(format!("{who}-sh"))
    }

    fn script(&self, who: char) -> PathBuf {
        self.dir.join(format!("{who}.sh"))
    }

    /// The command line of worker `who` ('a' or 'b') under `subject`'s lock.
    fn argv(
        &self,
        bench: &Bench,
        zk: &Zk,
        python: &Path,
        subject: Subject,
        who: char,
    ) -> Vec<OsString> {
        let mode: OsString = if subject.fenced() {
            bench.lw.clone().into()
        } else {
            "plain".into()
        };
        let child = vec![
            self.sh(who).into(),
            self.script(who).into(),
            self.dir.clone().into(),
            mode,
        ];
        let name = format!("paused-{}", subject.short());
        let lock = Lock::new(&name).ttl(TTL.as_secs() as u32);
        match subject {
            Subject::Etcdctl => bench.argv(Tool::Etcdctl, &lock, &child),
            Subject::LeasewrapEtcd => bench.argv(Tool::Leasewrap, &lock, &child),
            Subject::LeasewrapZk => argv_zk(bench, zk, &lock, &child),
            Subject::Kazoo => {
                let script =
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/figures/kazoo_lock.py");
                let timeout = TTL.as_secs().to_string();
                let mut argv = os(&[python.as_os_str(), script.as_os_str()]);
                argv.extend(os(&[
                    zk.connect(),
                    format!("/kazoo-bench/{name}"),
                    timeout,
                    "--".into(),
                ]));
                argv.extend(child);
                argv
            }
        }
    }
}

/// `1.2 ms`, or `1.23 s` from a second on.
fn span(secs: f64) -> String {
    if secs < 1.0 {
        format!("{:.1} ms", secs * 1e3)
    } else {
        format!("{secs:.2} s")
    }
}

impl Case {
    fn stale_accepted(&self) -> bool {
        self.a_status == "0"
    }

    /// The case in one line, the table's cell: its name, then what the picture writes under it.
    fn facts(&self) -> String {
        format!("{}: {}", self.subject.name(), self.outcome())
    }

    fn outcome(&self) -> String {
        let write = match self.a_status.as_str() {
            "0" => "accepted".to_owned(),
            code => format!("refused ({code})"),
        };
        let kept = match self.report.as_str() {
            "from B" => "B's data kept",
            "from A" => "B's data lost",
            _ => "the report holds neither's data",
        };
        let ran = self.a_died.unwrap_or(self.ended) - self.child_resumed;
        let end = match self.a_died {
            Some(died) => format!(
                "killed {} after {} resumed",
                span(died - self.rest_resumed),
                self.subject.supervisor()
            ),
            None => "never killed (the harness ended the run)".to_owned(),
        };
        format!(
            "B's child started {:.2} s into the pause; A's stale write {write}, {kept}; A's child \
             ran {} beside B's child, {end}",
            self.b_started,
            span(ran)
        )
    }

    fn panel(&self) -> Panel {
        let a_end = self.a_died.unwrap_or(self.ended);
        let a = Lane {
            name: "A's child".into(),
            spans: vec![
                running(self.a_started, 0.0),
                Span {
                    from: 0.0,
                    to: self.child_resumed,
                    state: State::Paused,
                    label: Some(format!("paused {:.2} s", self.child_resumed)),
                },
                running(self.child_resumed, a_end),
            ],
            writes: vec![Write {
                at: self.a_wrote,
                verdict: if self.stale_accepted() {
                    Verdict::StaleAccepted
                } else {
                    Verdict::StaleRefused
                },
            }],
            end: Some(
                if self.a_died.is_some() {
                    "killed"
                } else {
                    "never killed"
                }
                .into(),
            ),
        };
        let b = Lane {
            name: "B's child".into(),
            spans: vec![running(self.b_started, self.ended)],
            writes: (self.b_status == "0")
                .then_some(Write {
                    at: self.b_wrote,
                    verdict: Verdict::Accepted,
                })
                .into_iter()
                .collect(),
            end: None,
        };
        Panel {
            title: self.subject.name().into(),
            facts: self.outcome(),
            lanes: vec![a, b],
            marks: vec![(self.b_started, "B takes over".into())],
        }
    }
}

fn running(from: f64, to: f64) -> Span {
    Span {
        from,
        to,
        state: State::Running,
        label: None,
    }
}

/// One time axis for every panel: from the earliest start to the latest end, with room.
fn axis(cases: &[Case]) -> (f64, f64) {
    let from = cases.iter().map(|c| c.a_started).fold(0.0, f64::min);
    let to = cases.iter().map(|c| c.ended).fold(0.0, f64::max);
    let half = |t: f64| t * 2.0;
    (
        half(from - 0.25).floor() / 2.0,
        half(to + 0.25).ceil() / 2.0,
    )
}

fn note(cases: &[Case], zk: &Zk) -> String {
    let exits: Vec<String> = cases
        .iter()
        .map(|c| {
            let exit = c
                .holder_exit
                .map_or("still running".into(), |e| format!("exit {e}"));
            format!(
                "{} {exit}, B's write {}, A's tree resumed {} after A's child",
                c.subject.name(),
                if c.b_status == "0" {
                    "accepted"
                } else {
                    "refused"
                },
                span(c.rest_resumed - c.child_resumed)
            )
        })
        .collect();
    let tick = zk
        .four_letter("conf")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("tickTime=").map(|t| t.trim().to_owned()))
        })
        .unwrap_or_else(|| "?".into());
    format!(
        "Figure 12 (the paused leader, SPEC §9 F6; the picture is docs/{PICTURE}): one run per \
         tool, TTL and session timeout 2 s (ZooKeeper: the harness's standalone server, tickTime \
         {tick} ms). A's child runs {HELD:?}, then the harness SIGSTOPs A's lock tool and every \
         process below it, and the child's process group; B is started, takes the lease once \
         A's lapses, and writes at once; 2 × TTL after the pause, A's child (etcdctl's shares \
         etcdctl's process group, so they resume together) is resumed first and writes, and once \
         that write returned the rest of A's tree is resumed; the run ends {AFTER:?} later. \
         leasewrap's children write with `leasewrap fenced-write` (the token from their \
         environment), the others with a plain write to the same file. In the run: {}.",
        exits.join("; ")
    )
}
