//! The release as `scripts/release.sh` makes it (made once, shared: tests/support/release.rs):
//! the portable binary needs nothing but glibc and no symbol version above the floor it
//! states; the .deb and the .rpm hold the same files, each where its OS family keeps them, and
//! the same binary as the tarball; lintian and rpmlint find nothing; each package installs into
//! an empty root whose binary then runs a job. Also what `--version` says, for this build and
//! for one outside git.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::elf;
use crate::support::release::{self, dist};
use crate::support::{run_bounded, Finished, Output, BIN};

/// How long a packaging tool (lintian, rpmlint, rpm, dpkg-deb, tar) may take.
const TOOL_BOUND: Duration = Duration::from_secs(120);

/// The libraries of glibc itself (its loader among them): all the binary may need at run time.
const GLIBC_LIBRARIES: &str =
    "libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1 ld-linux-x86-64.so.2";

/// Runs `program args...`, bounded; fails the test, naming the package to install, when the
/// program is missing.
#[track_caller]
fn tool(program: &str, args: &[&str], install: &str) -> Output {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "`{program}` is missing: {install} (scripts/test.sh does)"
    );
    let mut cmd = Command::new(program);
    cmd.args(args);
    run_bounded(cmd, TOOL_BOUND)
}

/// The stdout of `out`, which must have succeeded (else its status and streams, under `what`).
#[track_caller]
fn ok(out: Output, what: &str) -> String {
    let failed = (!out.status.success()).then(|| format!("{}{}", out.status, out.context()));
    assert!(failed.is_none(), "{what}: {}", failed.unwrap_or_default());
    out.stdout
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `leasewrap --version` of `binary`, in its parts: version, commit, glibc floor.
fn version_of(binary: &Path) -> (String, String, String) {
    let out = Command::new(binary).arg("--version").output().unwrap();
    let line = String::from_utf8(out.stdout).unwrap();
    let parsed = line
        .trim()
        .strip_prefix("leasewrap ")
        .and_then(|rest| rest.split_once(" (commit "))
        .and_then(|(v, rest)| {
            let (commit, rest) = rest.split_once(", for glibc ")?;
            let floor = rest.strip_suffix(" or later)")?;
            Some((v.to_owned(), commit.to_owned(), floor.to_owned()))
        });
    parsed.unwrap_or_else(|| panic!("{}: --version says {line:?}", binary.display()))
}

/// `(2, 17)` of `2.17`.
fn floor_of(text: &str) -> (u32, u32) {
    elf::glibc_version(&format!("GLIBC_{text}")).unwrap_or_else(|| panic!("floor {text:?}"))
}

/// Every library `binary` needs is glibc's, and every GLIBC_ version it needs is at most
/// `floor`; the versions it needs, highest first.
#[track_caller]
fn assert_needs_at_most(binary: &Path, floor: (u32, u32)) -> Vec<String> {
    let needs = elf::needs(binary);
    let foreign: Vec<&String> = needs
        .libraries
        .iter()
        .filter(|l| !GLIBC_LIBRARIES.split(' ').any(|g| g == l.as_str()))
        .collect();
    assert!(foreign.is_empty(), "{} needs {foreign:?}", binary.display());
    let mut glibc: Vec<((u32, u32), String)> = Vec::new();
    for (library, version) in &needs.versions {
        let parsed = elf::glibc_version(version);
        assert!(
            parsed.is_some(),
            "{} needs {version} of {library}, not a glibc release",
            binary.display()
        );
        glibc.push((parsed.unwrap(), version.clone()));
    }
    glibc.sort();
    let highest = glibc.last().expect("versioned glibc symbols");
    assert!(
        highest.0 <= floor,
        "{} needs {} above its floor {floor:?}",
        binary.display(),
        highest.1
    );
    glibc.into_iter().rev().map(|(_, v)| v).collect()
}

#[test]
fn the_portable_binary_needs_only_glibc_and_no_symbol_version_above_the_floor_it_states() {
    let dist = dist();
    let (version, _, stated) = version_of(&dist.binary);
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        stated, dist.glibc_floor,
        "--version states another floor than scripts/release.sh builds for"
    );
    let needed = assert_needs_at_most(&dist.binary, floor_of(&stated));
    eprintln!("the portable binary needs at most {}", needed[0]);
}

#[test]
fn a_native_build_states_its_build_hosts_glibc_and_needs_no_newer() {
    let host = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .unwrap();
    let host = String::from_utf8(host.stdout).unwrap();
    let host = host.trim().strip_prefix("glibc ").unwrap().to_owned();
    let (_, _, stated) = version_of(Path::new(BIN));
    assert_eq!(stated, host);
    assert_needs_at_most(Path::new(BIN), floor_of(&stated));
}

/// The commit of the work tree, as build.rs shortens it.
fn head() -> String {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn version_names_the_version_the_commit_and_the_glibc_floor_of_both_builds() {
    let (version, commit, _) = version_of(Path::new(BIN));
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    assert_eq!(commit, head(), "the test build");
    let (_, commit, _) = version_of(&dist().binary);
    assert_eq!(commit, head(), "the portable build");
}

/// The compiled build script of this build (the newest, if the target folder has several).
fn build_script() -> PathBuf {
    let dir = release::target_dir().join("debug/build");
    let scripts = fs::read_dir(&dir).unwrap().flatten().filter_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let script = e.path().join("build-script-build");
        (name.starts_with("leasewrap-") && script.is_file()).then_some(script)
    });
    let newest = scripts.max_by_key(|s| fs::metadata(s).and_then(|m| m.modified()).ok());
    newest.unwrap_or_else(|| panic!("no leasewrap build script under {}", dir.display()))
}

/// What build.rs tells rustc `--version` says, run on a source tree at `dir` with `extra`.
fn long_version_from_build_script(dir: &Path, extra: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(build_script());
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .env("CARGO_MANIFEST_DIR", dir)
        .env("CARGO_PKG_VERSION", env!("CARGO_PKG_VERSION"))
        .env("TARGET", "x86_64-unknown-linux-gnu")
        .env("HOST", "x86_64-unknown-linux-gnu")
        .env("CARGO_CFG_TARGET_ENV", "gnu")
        .env("CARGO_CFG_TARGET_OS", "linux")
        .envs(extra.iter().copied());
    let out = ok(run_bounded(cmd, TOOL_BOUND), "the build script");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("cargo:rustc-env=LONG_VERSION="));
    line.expect("LONG_VERSION").to_owned()
}

#[test]
fn a_build_outside_git_says_commit_unknown_and_a_packaged_crate_names_its_commit() {
    let tree = tempfile::tempdir().unwrap();
    let v = env!("CARGO_PKG_VERSION");
    let zig = [(
        "CARGO_ZIGBUILD_TARGET_x86_64_unknown_linux_gnu",
        "x86_64-linux-gnu.2.17",
    )];
    assert_eq!(
        long_version_from_build_script(tree.path(), &zig),
        format!("{v} (commit unknown, for glibc 2.17 or later)")
    );
    let info =
        r#"{"git": {"sha1": "0123456789abcdef0123456789abcdef01234567"}, "path_in_vcs": ""}"#;
    fs::write(tree.path().join(".cargo_vcs_info.json"), info).unwrap();
    assert_eq!(
        long_version_from_build_script(tree.path(), &zig),
        format!("{v} (commit 0123456789ab, for glibc 2.17 or later)")
    );
}

/// The files of the .deb, as `dpkg-deb -c` lists them (no folders).
fn deb_files(deb: &Path) -> BTreeSet<String> {
    let listing = ok(
        tool("dpkg-deb", &["-c", path(deb)], "apt-get install dpkg"),
        "dpkg-deb -c",
    );
    listing
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| p.trim_start_matches('.').to_owned())
        .collect()
}

/// The files of the .rpm, as `rpm -qlp` lists them.
fn rpm_files(rpm: &Path) -> BTreeSet<String> {
    let listing = ok(
        tool("rpm", &["-qlp", path(rpm)], "apt-get install rpm"),
        "rpm -qlp",
    );
    listing.lines().map(str::to_owned).collect()
}

/// Only in the .deb: its copyright and changelog, which Debian requires there, and the lintian
/// overrides.
const DEB_ONLY: &[&str] = &[
    "/usr/share/doc/leasewrap/copyright",
    "/usr/share/doc/leasewrap/changelog.Debian.gz",
    "/usr/share/lintian/overrides/leasewrap",
];

/// Where the RHEL family keeps a file the .deb puts at `deb`: units under /usr/lib, zsh
/// completions in site-functions.
fn rpm_place(deb: &str) -> String {
    let moved = [
        ("/lib/systemd/system/", "/usr/lib/systemd/system/"),
        (
            "/usr/share/zsh/vendor-completions/",
            "/usr/share/zsh/site-functions/",
        ),
    ];
    let mut place = deb.to_owned();
    for (from, to) in moved {
        if let Some(rest) = deb.strip_prefix(from) {
            place = format!("{to}{rest}");
        }
    }
    place
}

#[test]
fn the_rpm_holds_what_the_deb_holds_each_where_its_family_keeps_it() {
    let dist = dist();
    let deb = deb_files(&dist.deb());
    let rpm = rpm_files(&dist.rpm());
    let wanted: BTreeSet<String> = deb
        .iter()
        .filter(|f| !DEB_ONLY.contains(&f.as_str()))
        .map(|f| rpm_place(f))
        .collect();
    let missing: Vec<&String> = wanted.difference(&rpm).collect();
    let extra: Vec<&String> = rpm.difference(&wanted).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the .rpm lacks {missing:?} and has {extra:?} beyond the .deb's"
    );
    for doc in ["quorum.md", "zookeeper.md", "internals.md", "README.md"] {
        assert!(
            rpm.contains(&format!("/usr/share/doc/leasewrap/{doc}")),
            "{doc}"
        );
    }
    assert!(rpm.contains("/usr/share/leasewrap/sql/mariadb-fence.sql"));
}

#[test]
fn the_deb_is_lintian_clean() {
    let deb = dist().deb();
    let out = tool(
        "lintian",
        &["--fail-on", "warning", path(&deb)],
        "apt-get install lintian",
    );
    let tags: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("E:") || l.starts_with("W:"))
        .collect();
    assert!(
        out.status.success() && tags.is_empty(),
        "lintian ({}):\n{}{}",
        out.status,
        out.stdout,
        out.stderr
    );
}

#[test]
fn the_rpm_is_rpmlint_clean_but_for_the_filters_that_say_why() {
    let rpm = dist().rpm();
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("packaging/rpm/rpmlint.toml");
    let out = tool(
        "rpmlint",
        &["-c", path(&config), path(&rpm)],
        "apt-get install rpmlint",
    );
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(
        out.status.success() && text.contains(" 0 errors, 0 warnings"),
        "rpmlint ({}):\n{text}",
        out.status
    );
    let settings = fs::read_to_string(&config).unwrap();
    let lines: Vec<&str> = settings.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("Filters = ["))
        .unwrap();
    let mut filters = 0;
    for (i, line) in lines.iter().enumerate().skip(start + 1) {
        if line.trim_start().starts_with('"') {
            filters += 1;
            let why = lines[i - 1].trim_start();
            assert!(why.starts_with("# "), "rpmlint.toml: {line} says not why");
        }
    }
    assert!(filters > 0);
}

/// A job on the local backend, run by `binary`: it gets the first fencing token.
#[track_caller]
fn assert_runs_a_local_job(binary: &Path) {
    let state = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(binary);
    cmd.args([
        "--local-dir",
        path(state.path()),
        "--name",
        "packaged",
        "--",
    ])
    .args(["sh", "-c", "echo token $LEASEWRAP_FENCING_TOKEN"]);
    let out = ok(run_bounded(cmd, TOOL_BOUND), "a local job");
    assert_eq!(out.trim(), "token 1");
    let (version, _, _) = version_of(binary);
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
}

/// The .rpm installed by rpm itself into an empty root (no dependencies there to check).
fn rpm_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let rpm = dist().rpm();
    let args = ["--root", path(root.path()), "-i", "--nodeps", path(&rpm)];
    ok(tool("rpm", &args, "apt-get install rpm"), "rpm -i");
    root
}

/// The .deb unpacked by dpkg-deb into an empty root.
fn deb_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let deb = dist().deb();
    let args = ["-x", path(&deb), path(root.path())];
    ok(
        tool("dpkg-deb", &args, "apt-get install dpkg"),
        "dpkg-deb -x",
    );
    root
}

#[test]
fn the_rpm_installs_into_an_empty_root_whose_binary_runs_a_local_job() {
    let root = rpm_root();
    let queried = tool(
        "rpm",
        &["--root", path(root.path()), "-q", "leasewrap"],
        "apt-get install rpm",
    );
    let queried = ok(queried, "rpm -q");
    assert!(queried.starts_with("leasewrap-"), "{queried}");
    assert_runs_a_local_job(&root.path().join("usr/bin/leasewrap"));
    let page = root.path().join("usr/share/man/man1/leasewrap.1.gz");
    assert!(page.is_file(), "no man page in the root");
}

#[test]
fn the_deb_unpacks_into_an_empty_root_whose_binary_runs_a_local_job() {
    let root = deb_root();
    assert_runs_a_local_job(&root.path().join("usr/bin/leasewrap"));
}

#[test]
fn both_packages_and_the_tarball_hold_the_one_binary_that_was_built() {
    let dist = dist();
    let built = fs::read(&dist.binary).unwrap();
    let (rpm, deb, tar) = (rpm_root(), deb_root(), tar_root());
    for (what, binary) in [
        ("the .rpm", rpm.path().join("usr/bin/leasewrap")),
        ("the .deb", deb.path().join("usr/bin/leasewrap")),
        (
            "the tarball",
            tar.path().join(dist.tarball_top()).join("leasewrap"),
        ),
    ] {
        assert!(
            fs::read(&binary).unwrap() == built,
            "{what} holds another binary"
        );
    }
}

/// The tarball unpacked.
fn tar_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let tarball = dist().tarball();
    let args = ["-xzf", path(&tarball), "-C", path(root.path())];
    ok(tool("tar", &args, "apt-get install tar"), "tar -x");
    root
}

#[test]
fn the_tarball_holds_every_file_name_the_deb_holds_and_its_sums_check() {
    let dist = dist();
    let root = tar_root();
    let top = root.path().join(dist.tarball_top());
    let mut cmd = Command::new("sha256sum");
    cmd.args(["--strict", "-c", "SHA256SUMS"]).current_dir(&top);
    ok(run_bounded(cmd, TOOL_BOUND), "sha256sum -c in the tarball");
    let mut names = BTreeSet::new();
    let mut dirs = vec![top.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(dir).unwrap().flatten() {
            match entry.path() {
                p if p.is_dir() => dirs.push(p),
                _ => drop(names.insert(entry.file_name().to_string_lossy().into_owned())),
            }
        }
    }
    for file in deb_files(&dist.deb()) {
        if DEB_ONLY.contains(&file.as_str()) {
            continue;
        }
        let place = rpm_place(&file);
        let base = Path::new(&place).file_name().unwrap().to_string_lossy();
        // The packages' man pages are gzipped, the tarball's are not.
        let base = base.trim_end_matches(".gz");
        // The bash completion is installed as `leasewrap`: its source is leasewrap.bash.
        let ok = names.contains(base) || names.contains(&format!("{base}.bash"));
        assert!(ok, "the tarball lacks {file}");
    }
}

#[test]
fn sha256sums_names_every_file_of_the_release_and_each_checks() {
    let dist = dist();
    let sums = fs::read_to_string(dist.dir.join("SHA256SUMS")).unwrap();
    let named: BTreeSet<String> = sums
        .lines()
        .filter_map(|l| l.split_once("  ").map(|(_, f)| f.to_owned()))
        .collect();
    let present: BTreeSet<String> = fs::read_dir(&dist.dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "SHA256SUMS")
        .collect();
    assert_eq!(named, present);
    assert_eq!(present.len(), 3, "{present:?}");
    let mut cmd = Command::new("sha256sum");
    cmd.args(["--strict", "-c", "SHA256SUMS"])
        .current_dir(&dist.dir);
    ok(run_bounded(cmd, TOOL_BOUND), "sha256sum -c");
}

/// The field `name` of the release's .deb (`dpkg-deb -f`).
fn deb_field(name: &str) -> String {
    let deb = dist().deb();
    let out = tool(
        "dpkg-deb",
        &["-f", path(&deb), name],
        "apt-get install dpkg",
    );
    ok(out, "dpkg-deb -f")
}

/// `rpm -qp QUERY...` of the release's .rpm.
fn rpm_query(query: &[&str]) -> String {
    let rpm = dist().rpm();
    let args: Vec<&str> = ["-qp"]
        .iter()
        .chain(query)
        .copied()
        .chain([path(&rpm)])
        .collect();
    ok(tool("rpm", &args, "apt-get install rpm"), "rpm -qp")
}

#[test]
fn the_packages_say_what_leasewrap_is_zookeeper_and_the_database_fences_included() {
    let deb = deb_field("Description");
    for word in [
        "etcd",
        "ZooKeeper",
        "PostgreSQL",
        "MariaDB",
        "fencing token",
    ] {
        assert!(
            deb.contains(word),
            "the .deb's description lacks {word}:\n{deb}"
        );
    }
    let rpm = rpm_query(&["--qf", "%{SUMMARY}"]);
    assert!(rpm.contains("ZooKeeper"), "the .rpm's summary: {rpm}");
}

#[test]
fn both_packages_ask_for_no_newer_glibc_than_the_floor() {
    let dist = dist();
    let depends = deb_field("Depends");
    assert_eq!(
        depends.trim(),
        format!("libc6 (>= {})", dist.glibc_floor),
        "the .deb's Depends"
    );
    let requires = rpm_query(&["--requires"]);
    let floor = floor_of(&dist.glibc_floor);
    let versions = requires.lines().filter_map(|r| {
        let inner = r.split_once('(')?.1.split_once(')')?.0;
        elf::glibc_version(inner)
    });
    let above: Vec<(u32, u32)> = versions.filter(|v| *v > floor).collect();
    assert!(
        above.is_empty(),
        "the .rpm requires glibc {above:?}:\n{requires}"
    );
    assert!(
        requires.contains(&format!("(GLIBC_{})", dist.glibc_floor)),
        "{requires}"
    );
}
