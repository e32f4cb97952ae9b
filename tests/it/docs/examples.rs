//! Every shell example of README.md, docs/*.md and the man pages is run as its text says: on
//! the local backend, on etcd when it names endpoints, and on several "hosts" where it speaks of
//! several. A crontab line is run through its command, a unit through its `ExecStart=`.
//!
//! How the text tells the test what an example is: a marker just before the block, invisible
//! where the text is read (`<!-- example: WORDS -->` in Markdown, `.\" example: WORDS` in roff):
//!
//! - `not run: WHY`: output, a formula, SQL, a unit file's text; the reason is required;
//! - `cron`: a crontab line (five fields, and a user in the /etc/cron.d form), run as cron would;
//! - `unit`: `systemctl` lines for the packaged units, with drop-in lines: the unit's `ExecStart=`;
//! - `child`: a fragment that runs as the child of leasewrap (it reads `LEASEWRAP_*`);
//! - `etcd`: on etcd although the text names no endpoint (they come from the environment file);
//! - `hosts`: two hosts at once, then a third after them, each with its own state directory;
//! - `once`: with `hosts`, the job runs once in all;
//! - `status N`: it ends with N, not 0;
//! - `release`: `scripts/release.sh`, which the tests run once for all (tests/support/release.rs);
//! - `install`: as root of a host whose working folder holds that release's files: `dpkg -i` and
//!   `rpm -U` install into the host's own root (its packages' dependencies not checked there), and
//!   `leasewrap` is only what the example installed; with `source`, in the source tree.
//!
//! packaging/cron/leasewrap.cron is run as `cron, etcd, hosts, once`, as its comments say.
//!
//! An unmarked block is run as a shell script, and fails the test when it does not end with 0:
//! a block that cannot run must say so. Programs the examples name (`/usr/local/bin/nightly-report`,
//! `make-report`, ...) are stand-ins in a private root: paths under `/usr/local`, `/opt` and `/srv`
//! are rewritten into it, `/etc/leasewrap` and `/var/lib` into each host's own part of it, and
//! endpoints to the tests' own etcd.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::Duration;

use crate::support::etcd::{self, Etcd, Version};
use crate::support::release;
use crate::support::{clean_env, niced, run_bounded, without_cargo_env, Output, BIN};

use super::root;

/// How long one example may run (a `-w 1h` that never gets its turn must not hold up the suite).
const EXAMPLE_BOUND: Duration = Duration::from_secs(20);

/// The dial timeout of the hosts' environment (the default is 2 s).
const EXAMPLE_DIAL_TIMEOUT: &str = "10s";

/// One example: where it is, what it says, and how it is marked.
#[derive(Debug, Clone)]
pub struct Example {
    /// `README.md:120`, for messages.
    pub place: String,
    /// The block, dedented, with roff escapes undone.
    pub text: String,
    /// The marker's words, empty when unmarked.
    pub marks: Vec<String>,
}

impl Example {
    pub fn has(&self, word: &str) -> bool {
        self.marks.iter().any(|m| m == word)
    }

    /// The reason of `not run: WHY`, if so marked.
    fn not_run(&self) -> Option<String> {
        let joined = self.marks.join(" ");
        joined.strip_prefix("not run:").map(|r| r.trim().to_owned())
    }

    /// The status the example ends with: 0 unless marked `status N`.
    fn expected_status(&self) -> i32 {
        let at = self.marks.iter().position(|m| m == "status");
        at.and_then(|i| self.marks.get(i + 1))
            .map(|n| n.parse().expect("status N"))
            .unwrap_or(0)
    }
}

const MARK: &str = "<!-- example:";
const ROFF_MARK: &str = ".\\\" example:";

fn words(marker: &str) -> Vec<String> {
    let words = marker.split(|c: char| c.is_whitespace() || c == ',');
    words.filter(|w| !w.is_empty()).map(str::to_owned).collect()
}

/// The code blocks of a Markdown file: indented by four spaces more than the list item they are
/// in (or than the margin), after a blank line.
pub fn markdown(rel: &str) -> Vec<Example> {
    let text = fs::read_to_string(root().join(rel)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let (mut list_indent, mut marks, mut i) = (0, Vec::new(), 0);
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        let after_blank = i > 0 && lines[i - 1].trim().is_empty();
        if after_blank && !line.trim().is_empty() && indent >= list_indent + 4 {
            let end = block_end(&lines, i, indent);
            let text = dedent(&lines[i..end], indent);
            let place = format!("{rel}:{}", i + 1);
            found.push(Example {
                place,
                text,
                marks: std::mem::take(&mut marks),
            });
            i = end;
            continue;
        }
        if let Some(m) = line.trim().strip_prefix(MARK) {
            marks = words(m.trim_end_matches("-->"));
        }
        list_indent = list_context(line, indent, list_indent);
        i += 1;
    }
    found
}

/// The first line after the block that starts at `start` with `indent`.
fn block_end(lines: &[&str], start: usize, indent: usize) -> usize {
    let mut end = start;
    let mut last = start;
    while end < lines.len() {
        let l = lines[end];
        if !l.trim().is_empty() && l.len() - l.trim_start().len() < indent {
            break;
        }
        if !l.trim().is_empty() {
            last = end;
        }
        end += 1;
    }
    last + 1
}

fn dedent(lines: &[&str], indent: usize) -> String {
    let cut = |l: &&str| l.get(indent..).unwrap_or("").to_owned();
    lines.iter().map(cut).collect::<Vec<_>>().join("\n") + "\n"
}

/// The indent a code block in the current list item needs beyond four spaces: the item's text
/// column, kept while the item's paragraphs go on, dropped at a line back at the margin.
fn list_context(line: &str, indent: usize, current: usize) -> usize {
    let body = line.trim_start();
    let item = ["- ", "* "].iter().any(|m| body.starts_with(m))
        || body
            .split_once(". ")
            .is_some_and(|(n, _)| n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty());
    if item {
        return indent + body.find(' ').unwrap() + 1;
    }
    if !line.trim().is_empty() && indent == 0 {
        return 0;
    }
    current
}

/// The literal blocks of a generated man page (`.RS 4` `.nf` ... `.fi` `.RE`), with the marks
/// written before the paragraph that introduces them.
pub fn man_page(rel: &str) -> Vec<Example> {
    let text = fs::read_to_string(root().join(rel)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut marks = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if let Some(m) = line.strip_prefix(ROFF_MARK) {
            marks = words(m);
        }
        if *line == ".nf" && i > 0 && lines[i - 1].starts_with(".RS") {
            let end = i + lines[i..].iter().position(|l| *l == ".fi").unwrap();
            let block: Vec<String> = lines[i + 1..end].iter().map(|l| unroff(l)).collect();
            let place = format!("{rel}:{}", i + 2);
            let text = block.join("\n") + "\n";
            found.push(Example {
                place,
                text,
                marks: std::mem::take(&mut marks),
            });
        }
    }
    found
}

/// Undoes the escapes roff's writer makes in a text line.
fn unroff(line: &str) -> String {
    let line = line.strip_prefix("\\&").unwrap_or(line);
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find('\\') {
        out += &rest[..at];
        let esc = &rest[at..];
        let (plain, len) = match esc.get(..2) {
            Some("\\-") => ("-", 2),
            Some("\\\\") => ("\\", 2),
            Some("\\&") => ("", 2),
            _ if esc.starts_with("\\*(Aq") => ("'", 5),
            _ => panic!("a roff escape the examples test does not know: {line}"),
        };
        out += plain;
        rest = &esc[len..];
    }
    out + rest
}

/// Every example of the documentation.
pub fn all() -> Vec<Example> {
    let mut files = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = fs::read_dir(root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| format!("docs/{}", e.file_name().to_string_lossy()))
        .filter(|n| n.ends_with(".md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut found: Vec<Example> = files.iter().flat_map(|f| markdown(f)).collect();
    let mut pages: Vec<String> = fs::read_dir(root().join("man"))
        .unwrap()
        .flatten()
        .map(|e| format!("man/{}", e.file_name().to_string_lossy()))
        .collect();
    pages.sort();
    found.extend(pages.iter().flat_map(|p| man_page(p)));
    found.push(packaged_cron_file());
    found
}

/// packaging/cron/leasewrap.cron, which says it goes on every host and runs the job once a
/// night, with the endpoints in the environment file.
fn packaged_cron_file() -> Example {
    let rel = "packaging/cron/leasewrap.cron";
    let text = fs::read_to_string(root().join(rel)).unwrap();
    let marks = words("cron etcd hosts once");
    Example {
        place: rel.to_owned(),
        text,
        marks,
    }
}

// ---------------------------------------------------------------------------------------------
// The private root the examples run in.

/// Programs the examples name, made into stand-ins that record their run.
const JOBS: &[&str] = &[
    "/usr/local/bin/nightly-report",
    "/opt/report/run.sh",
    "/etc/leasewrap/jobs/nightly-report",
    "/etc/leasewrap/daemons/scheduler",
    "bin/make-report",
    "bin/mail",
    "cwd/nightly-report.sh",
    "cwd/migrate",
    "cwd/scheduler",
];

/// Path prefixes the examples use that are rewritten into the private root.
const ROOTED: &[&str] = &["/usr/local/", "/opt/", "/srv/"];

/// Path prefixes each host has one of its own: its state and its configuration.
const HOST_ROOTED: &[&str] = &["/var/lib/", "/etc/leasewrap/"];

/// A stand-in job: refuses to run beside another (the hosts share this root), records its run,
/// prints a line, and takes a moment (the job's own work) so that an overlap would show.
const JOB: &str = r#"#!/bin/sh
mkdir "$WORLD/busy" 2>/dev/null || { echo "overlap: $0 ran beside another job" >&2; exit 99; }
echo "$0 ${LEASEWRAP_FENCING_TOKEN:-}" >> "$WORLD/ran"
echo "output of $0"
sleep 0.1
rmdir "$WORLD/busy"
"#;

/// The root the examples of one test share: stand-in programs, rewritten paths, the hosts'
/// state directories.
pub struct World {
    dir: tempfile::TempDir,
    /// The etcd the examples talk to; None on the local backend.
    etcd: Option<&'static Etcd>,
    prefix: String,
}

impl World {
    pub fn new(etcd: Option<&'static Etcd>) -> World {
        let dir = tempfile::Builder::new()
            .prefix("leasewrap-examples-")
            .tempdir()
            .unwrap();
        let world = World {
            dir,
            etcd,
            prefix: etcd::unique_prefix("examples"),
        };
        for sub in ["bin", "cwd", "srv"] {
            fs::create_dir_all(world.path(sub)).unwrap();
        }
        for job in JOBS.iter().filter(|j| !j.starts_with("/etc/leasewrap/")) {
            world.write_exec(&world.path(job.trim_start_matches('/')), JOB);
        }
        symlink(BIN, world.path("bin/leasewrap")).unwrap();
        world
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write_exec(&self, path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Host `host`'s own root: its state directory, /var/lib, and /etc/leasewrap with the jobs
    /// and the environment file, as the packaged example would be filled in on this world.
    fn host_root(&self, host: &str) -> PathBuf {
        let home = self.path(&format!("hosts/{host}"));
        for sub in ["state", "var/lib/node_exporter/textfile", "etc/leasewrap"] {
            fs::create_dir_all(home.join(sub)).unwrap();
        }
        fs::set_permissions(home.join("state"), fs::Permissions::from_mode(0o755)).unwrap();
        for job in JOBS.iter().filter(|j| j.starts_with("/etc/leasewrap/")) {
            self.write_exec(&home.join(job.trim_start_matches('/')), JOB);
        }
        let etc = home.join("etc/leasewrap");
        let mut text = String::new();
        if let Some(etcd) = self.etcd {
            text += &format!(
                "LEASEWRAP_ENDPOINTS={}\nLEASEWRAP_PREFIX={}\nLEASEWRAP_DIAL_TIMEOUT={EXAMPLE_DIAL_TIMEOUT}\n",
                etcd.endpoint(),
                self.prefix
            );
            if let Some(tls) = etcd.tls() {
                fs::copy(&tls.ca, etc.join("ca.crt")).unwrap();
                text += &format!("LEASEWRAP_CACERT={}\n", etc.join("ca.crt").display());
            }
        }
        fs::write(etc.join("leasewrap.env"), text).unwrap();
        home
    }

    /// The example's text with its paths and endpoints pointed into this world, as `host`.
    pub fn rewrite(&self, text: &str, host: &str) -> String {
        let mut out = text.replace("/usr/bin/leasewrap", BIN);
        let host_root = self.path(&format!("hosts/{host}"));
        let roots = ROOTED.iter().map(|p| (p, self.dir.path()));
        for (prefix, root) in roots.chain(HOST_ROOTED.iter().map(|p| (p, host_root.as_path()))) {
            let at = format!("{}/{}", root.display(), prefix.trim_start_matches('/'));
            out = replace_paths(&out, prefix, &at);
        }
        match self.etcd {
            Some(etcd) => replace_urls(&out, &etcd.endpoint()),
            None => out,
        }
    }

    /// The runs of stand-in jobs so far, one line each.
    pub fn ran(&self) -> Vec<String> {
        let text = fs::read_to_string(self.path("ran")).unwrap_or_default();
        text.lines().map(str::to_owned).collect()
    }

    /// `sh -e -c SCRIPT` as host `host` of this world: its own state directory and home.
    pub fn shell(&self, host: &str, script: &str) -> Command {
        let home = self.host_root(host);
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-e", "-c", script]).current_dir(self.path("cwd"));
        clean_env(&mut cmd);
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap()
        );
        cmd.env("PATH", path)
            .env("HOME", &home)
            .env("WORLD", self.dir.path());
        cmd.env("LEASEWRAP_LOCAL_DIR", home.join("state"));
        // As the environment file of a host on etcd would have it. The examples say nothing of
        // the dial timeout: a loose one keeps a loaded test machine from making them 69.
        if let Some(etcd) = self.etcd {
            cmd.env("LEASEWRAP_DIAL_TIMEOUT", EXAMPLE_DIAL_TIMEOUT);
            cmd.env("LEASEWRAP_PREFIX", &self.prefix)
                .env("LEASEWRAP_ENDPOINTS", etcd.endpoint());
            if let Some(tls) = etcd.tls() {
                cmd.env("LEASEWRAP_CACERT", &tls.ca);
            }
        }
        cmd
    }
}

/// `text` with every path that starts with `prefix` (at a word's start) moved under `to`.
fn replace_paths(text: &str, prefix: &str, to: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let starts_word = rest[..at]
            .chars()
            .last()
            .is_none_or(|c| " \t\n'\"=:(".contains(c));
        out += &rest[..at];
        out += if starts_word { to } else { prefix };
        rest = &rest[at + prefix.len()..];
    }
    out + rest
}

/// `text` with every list of `http://` or `https://` URLs replaced by `endpoint`.
fn replace_urls(text: &str, endpoint: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("http") {
        let tail = &rest[at..];
        if !(tail.starts_with("http://") || tail.starts_with("https://")) {
            out += &rest[..at + 4];
            rest = &rest[at + 4..];
            continue;
        }
        let len = tail
            .find(|c: char| c.is_whitespace() || "'\"".contains(c))
            .unwrap_or(tail.len());
        out += &rest[..at];
        out += endpoint;
        rest = &tail[len..];
    }
    out + rest
}

/// Runs `script` (its paths rewritten for each) as each host of `hosts` at once, bounded.
pub fn run_hosts(world: &World, hosts: &[&str], script: &str) -> Vec<Output> {
    thread::scope(|s| {
        let runs: Vec<_> = hosts
            .iter()
            .map(|h| {
                let cmd = world.shell(h, &world.rewrite(script, h));
                s.spawn(move || run_bounded(cmd, EXAMPLE_BOUND))
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

/// The etcd an example needs: a TLS one for `https://` endpoints, none without endpoints.
fn etcd_for(example: &Example) -> Option<&'static Etcd> {
    let text = &example.text;
    let on_etcd =
        example.has("etcd") || text.contains("--endpoints") || text.contains("ENDPOINTS=");
    if !on_etcd {
        return None;
    }
    if text.contains("https://") {
        static TLS: std::sync::OnceLock<Etcd> = std::sync::OnceLock::new();
        return Some(TLS.get_or_init(|| Etcd::start_tls(Version::V3_5)));
    }
    Some(etcd::shared(Version::V3_5))
}

/// The command a crontab line runs: after five time fields, and the user in the cron.d form.
fn cron_command(line: &str) -> String {
    let mut rest = line.trim_start();
    for _ in 0..5 {
        rest = rest
            .split_once(char::is_whitespace)
            .expect("five time fields")
            .1
            .trim_start();
    }
    if let Some(after) = rest.strip_prefix("root ") {
        rest = after.trim_start();
    }
    rest.to_owned()
}

/// The script a `cron` example runs: each job line's command, in turn (not comments, not the
/// `NAME=value` settings of a cron file).
fn cron_script(text: &str) -> String {
    let setting = |l: &str| l.split_whitespace().count() == 1 && l.contains('=');
    let jobs = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#') && !setting(l));
    jobs.map(cron_command).collect::<Vec<_>>().join("\n")
}

/// Whether `line` is a unit file's `Key=value` line.
fn is_setting(line: &str) -> bool {
    line.split_once('=')
        .is_some_and(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric()))
}

/// The script a `unit` example runs: its shell lines, then the packaged unit's `ExecStart=` with
/// the drop-in's settings applied and `%i` named by the `systemctl` line.
fn unit_script(text: &str) -> String {
    let mut instance = None;
    let mut script = String::new();
    let mut drop_in = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(args) = line.strip_prefix("systemctl ") {
            instance = args
                .split_whitespace()
                .find(|a| a.contains('@'))
                .map(str::to_owned);
        } else if is_setting(line) {
            drop_in.push(line.to_owned());
        } else if !line.is_empty() && !line.starts_with('[') {
            script += &format!("{line}\n");
        }
    }
    let instance = instance.expect("a unit example names its unit in a systemctl line");
    let (template, name) = instance.split_once('@').unwrap();
    let name = name.split('.').next().unwrap();
    let unit = root().join(format!("packaging/systemd/{template}@.service"));
    let unit = fs::read_to_string(unit).unwrap();
    let settings = unit
        .lines()
        .map(str::trim)
        .chain(drop_in.iter().map(String::as_str));
    let exec = exec_start(settings.filter(|l| is_setting(l)));
    script + &exec.replace("%i", name).replace("%S", "/var/lib")
}

/// What systemd would run for these settings, as a shell line: the environment file, the
/// `Environment=` list (an empty one clears it) and the last `ExecStart=`, whose
/// `SuccessExitStatus=` counts as 0.
fn exec_start<'a>(settings: impl Iterator<Item = &'a str>) -> String {
    let (mut exec, mut env, mut files) = (String::new(), Vec::new(), String::new());
    let mut success = String::from("0");
    for line in settings {
        let (key, value) = line.split_once('=').unwrap();
        match key {
            "ExecStart" => exec = value.to_owned(),
            "Environment" if value.is_empty() => env.clear(),
            "Environment" => env.push(value.to_owned()),
            "EnvironmentFile" => {
                let file = value.trim_start_matches('-');
                files += &format!("set -a; if [ -e {file} ]; then . {file}; fi; set +a\n");
            }
            "SuccessExitStatus" => success += &format!("|{}", value.replace(' ', "|")),
            _ => {}
        }
    }
    let counted = format!("|| {{ s=$?; case $s in {success}) ;; *) exit $s ;; esac; }}");
    files + &format!("env {} {exec} {counted}", env.join(" "))
}

/// A leasewrap line (with `options`) whose child runs the shell `fragment`.
fn as_child(fragment: &str, options: &str) -> String {
    let quoted = fragment.replace('\'', r"'\''");
    format!("leasewrap {options} --name example -- sh -e -c '{quoted}'")
}

/// What the example runs, before its paths are rewritten.
fn script_of(example: &Example) -> String {
    if example.has("cron") {
        cron_script(&example.text)
    } else if example.has("unit") {
        unit_script(&example.text)
    } else if example.has("after-build") {
        let run = example.text.rsplit("&& ").next().unwrap();
        run.replace("target/release/leasewrap", "leasewrap")
    } else if example.has("child") {
        as_child(&example.text, "")
    } else {
        example.text.clone()
    }
}

/// Runs one example as its text says; what went otherwise than it says, if anything.
pub fn run(example: &Example) -> Vec<String> {
    if example.has("release") {
        assert_eq!(
            example.text.trim(),
            release::RELEASE_COMMAND,
            "{}",
            example.place
        );
        // Made once for every test that needs it; it panics, with the script's errors, if it failed.
        release::dist();
        return Vec::new();
    }
    if example.has("install") {
        return run_install(example);
    }
    let world = World::new(etcd_for(example));
    let script = script_of(example);
    let hosts: &[&str] = if example.has("hosts") {
        &["a", "b"]
    } else {
        &["a"]
    };
    let mut outs = run_hosts(&world, hosts, &script);
    if example.has("hosts") {
        outs.extend(run_hosts(&world, &["c"], &script));
    }
    let mut wrong: Vec<String> = outs
        .iter()
        .filter_map(|o| not_as_said(example, &script, o))
        .collect();
    let ran = world.ran();
    if example.has("once") && ran.len() != 1 {
        wrong.push(format!(
            "{}: said to run once on all the hosts, ran {ran:?}\n{script}",
            example.place
        ));
    }
    wrong
}

/// Why `out` is not what the example says, if it is not: its status, or an error on stderr.
fn not_as_said(example: &Example, script: &str, out: &Output) -> Option<String> {
    let want = example.expected_status();
    let error =
        |l: &&str| l.starts_with("leasewrap:") || l.contains(" ERROR ") || l.starts_with("overlap");
    let errors = out.stderr.lines().filter(error).count();
    if out.status.code() == Some(want) && (want != 0 || errors == 0) {
        return None;
    }
    Some(format!(
        "{}: the example ended with {} (expected {want}); if it cannot run in a test, mark it \
         `not run: WHY` (see tests/it/docs/examples.rs)\n--- as run ---\n{script}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        example.place, out.status, out.stdout, out.stderr
    ))
}

/// Runs an `install` example; what went otherwise than it says, and whether it left a leasewrap
/// where it says it installs one.
fn run_install(example: &Example) -> Vec<String> {
    let world = World::new(None);
    let out = run_bounded(install_shell(example, &world), install_bound(example));
    let mut wrong: Vec<String> = not_as_said(example, &example.text, &out)
        .into_iter()
        .collect();
    let places = ["hosts/a/usr/bin/leasewrap", "usr/local/bin/leasewrap"];
    if !places.iter().any(|p| world.path(p).is_file()) {
        wrong.push(format!(
            "{}: installed no leasewrap\n{}",
            example.place, out.stderr
        ));
    }
    wrong
}

/// The bound of an install example: one that builds from source may build the release profile.
fn install_bound(example: &Example) -> Duration {
    if example.has("source") {
        Duration::from_secs(30 * 60)
    } else {
        EXAMPLE_BOUND
    }
}

/// The shell an `install` example runs in: host "a" of a world, as root, its working folder the
/// release's or the source tree, `leasewrap` only what the example installs, and the packaging
/// tools pointed at the host's own root.
fn install_shell(example: &Example, world: &World) -> Command {
    let host = world.host_root("a");
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "usr/bin"] {
        fs::create_dir_all(host.join(dir)).unwrap();
    }
    for file in ["var/lib/dpkg/status", "var/lib/dpkg/available"] {
        fs::write(host.join(file), "").unwrap();
    }
    let dist = release::dist();
    for entry in fs::read_dir(&dist.dir).unwrap().flatten() {
        symlink(entry.path(), world.path("cwd").join(entry.file_name())).unwrap();
    }
    let at = host.display();
    // `--root /usr/local`, which the paths' rewriting (prefixes that end in `/`) would miss.
    let local = format!("--root {}", world.path("usr/local").display());
    let script = world
        .rewrite(&example.text.replace("--root /usr/local", &local), "a")
        .replace("dpkg -i ", &format!("dpkg --root={at} --force-depends -i "))
        .replace("rpm -U", &format!("rpm --root {at} --nodeps -U"));
    let mut cmd = world.shell("a", &script);
    let path = format!(
        "{at}/usr/bin:{}:{}",
        world.path("usr/local/bin").display(),
        std::env::var("PATH").unwrap()
    );
    cmd.env("PATH", path);
    if example.has("source") {
        source_build(&mut cmd);
    }
    cmd
}

/// `cmd` builds in the source tree, into the target folder of the build under test, with the
/// toolchain of the test's own user (the host's HOME is the world's), at a lower priority than
/// the tests that measure time.
fn source_build(cmd: &mut Command) {
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    let cargo_home = std::env::var_os("CARGO_HOME").map_or(home.join(".cargo"), PathBuf::from);
    let rustup_home = std::env::var_os("RUSTUP_HOME").map_or(home.join(".rustup"), PathBuf::from);
    without_cargo_env(cmd);
    cmd.current_dir(root())
        .env("CARGO_TARGET_DIR", release::target_dir())
        .env("CARGO_HOME", cargo_home)
        .env("RUSTUP_HOME", rustup_home);
    niced(cmd);
}

#[test]
fn every_shell_example_of_the_readme_the_docs_and_the_man_pages_runs_as_its_text_says() {
    let examples = all();
    assert!(
        examples.len() > 20,
        "{} examples found: is the extraction broken?",
        examples.len()
    );
    let mut wrong = Vec::new();
    let mut ran = 0;
    for example in &examples {
        match example.not_run() {
            Some(why) if why.is_empty() => {
                wrong.push(format!("{}: `not run:` without a reason", example.place))
            }
            Some(_) => {}
            None => {
                wrong.extend(run(example));
                ran += 1;
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} examples:\n\n{}",
        wrong.len(),
        examples.len(),
        wrong.join("\n\n")
    );
    assert!(ran > 10, "only {ran} examples ran");
}

/// The example of docs/fencing.md that deletes a key with etcdctl under the token's guard.
fn etcdctl_txn_example() -> Example {
    let found = markdown("docs/fencing.md").into_iter().find(|e| {
        e.text
            .contains("etcdctl --endpoints \"$LEASEWRAP_ENDPOINTS\" txn")
    });
    found.expect("docs/fencing.md has an etcdctl txn example")
}

/// Runs `fragment` as the child of a leasewrap on `version`'s etcd, with that version's
/// etcdctl first on PATH.
fn run_child_on(world: &World, version: Version, fragment: &str) -> Output {
    let etcd = etcd::shared(version);
    let script = as_child(fragment, &format!("--endpoints {}", etcd.endpoint()));
    let mut cmd = world.shell("a", &script);
    let etcdctl = version.etcdctl();
    let bin = world.path("bin");
    let path = format!(
        "{}:{}:/usr/bin:/bin",
        bin.display(),
        etcdctl.parent().unwrap().display()
    );
    cmd.env("PATH", path);
    run_bounded(cmd, EXAMPLE_BOUND)
}

#[test]
fn fencing_md_etcdctl_txn_example_reaches_the_leases_etcd_in_the_child_and_a_stale_token_keeps_the_key(
) {
    let example = etcdctl_txn_example();
    assert!(example.has("child"), "{}: marked child", example.place);
    let key = "config/scheduler/lock-hint";
    for version in Version::ALL {
        let etcd = etcd::shared(version);
        let world = World::new(Some(etcd));
        let present = || !etcd.etcdctl_ok(&["get", key]).trim().is_empty();
        let v = version.number();
        etcd.etcdctl_ok(&["put", key, "hint"]);

        let stale = run_child_on(
            &world,
            version,
            &format!("LEASEWRAP_FENCING_TOKEN=1\n{}", example.text),
        );
        assert_eq!(
            stale.status.code(),
            Some(1),
            "etcd {v}: a stale token's txn answers FAILURE{}",
            stale.stderr
        );
        assert!(present(), "etcd {v}: a stale token deleted the key");

        let current = run_child_on(&world, version, &example.text);
        assert_eq!(
            current.status.code(),
            Some(0),
            "etcd {v}: {}{}",
            current.stdout,
            current.stderr
        );
        assert!(
            !present(),
            "etcd {v}: the holder's txn did not delete the key"
        );
    }
}
