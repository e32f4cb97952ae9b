//! The generated and packaged files stay true to the code: the man pages and shell completions
//! are regenerated from the clap definitions and compared with the committed ones, the systemd
//! units pass `systemd-analyze verify`, and both packages list files that exist, every user doc
//! among them (tests/it/release.rs builds them and runs lintian and rpmlint). `examples` runs
//! every shell example of the README, docs/ and the man pages.
//!
//! A stale generated file fails its test;
//! `LEASEWRAP_BLESS=1 cargo test --test integration docs::` rewrites it.

mod clients;
pub(crate) mod examples;
mod man;
mod picture;
mod readme;
mod systemd;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory;
use clap_complete::Shell;

const BLESS: &str = "LEASEWRAP_BLESS";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compares the files in `dir` whose names `ours` selects with `expected` (name, text). With
/// LEASEWRAP_BLESS=1 rewrites them (and removes the extra ones) instead of failing.
#[track_caller]
fn check_generated(dir: &str, ours: impl Fn(&str) -> bool, expected: &[(String, String)]) {
    let dir = root().join(dir);
    let bless = std::env::var(BLESS).is_ok_and(|v| v == "1");
    let present: BTreeSet<String> = fs::read_dir(&dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| ours(n))
                .collect()
        })
        .unwrap_or_default();
    let wanted: BTreeSet<String> = expected.iter().map(|(n, _)| n.clone()).collect();
    let mut stale = Vec::new();
    for (name, text) in expected {
        let path = dir.join(name);
        if fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            stale.push(name.clone());
            if bless {
                fs::create_dir_all(&dir).unwrap();
                fs::write(&path, text).unwrap();
            }
        }
    }
    for extra in present.difference(&wanted) {
        stale.push(format!("{extra} (no longer generated)"));
        if bless {
            fs::remove_file(dir.join(extra)).unwrap();
        }
    }
    assert!(
        bless || stale.is_empty(),
        "stale in {}: {}\nThe clap definitions or the docs generator changed. Regenerate with\n    \
         {BLESS}=1 cargo test --test integration docs::\nand commit the result.",
        dir.display(),
        stale.join(", ")
    );
}

#[test]
fn man_pages_match_the_clap_definitions() {
    check_generated("man", |n| n.ends_with(".1"), &man::pages());
}

fn completions() -> Vec<(String, String)> {
    [Shell::Bash, Shell::Zsh, Shell::Fish]
        .into_iter()
        .map(|shell| {
            let mut out = Vec::new();
            let mut cmd = leasewrap::cli::Cli::command();
            clap_complete::generate(shell, &mut cmd, "leasewrap", &mut out);
            let name = clap_complete::Generator::file_name(&shell, "leasewrap");
            (name, String::from_utf8(out).unwrap())
        })
        .collect()
}

#[test]
fn shell_completions_match_the_clap_definitions() {
    check_generated("packaging/completions", |_| true, &completions());
    let bash = root().join("packaging/completions/leasewrap.bash");
    let out = Command::new("bash").arg("-n").arg(&bash).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The names of environment variables quoted in the Rust sources under `dir`.
fn variables_in_sources(dir: &Path, found: &mut BTreeSet<String>) {
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            variables_in_sources(&path, found);
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        for quoted in text.split('"').skip(1).step_by(2) {
            let is_name = quoted.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && ["LEASEWRAP_", "ETCDCTL_", "ETCD_"]
                    .iter()
                    .any(|p| quoted.starts_with(p));
            if is_name {
                found.insert(quoted.to_owned());
            }
        }
    }
}

fn documented_variables() -> BTreeSet<String> {
    man::READ
        .iter()
        .chain(man::GIVEN)
        .flat_map(|(names, _)| names.split(", "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn man_page_environment_names_every_variable_the_code_reads_or_sets() {
    let mut used = BTreeSet::new();
    variables_in_sources(&root().join("src"), &mut used);
    for extra in ["NOTIFY_SOCKET", "XDG_STATE_HOME", "HOME", "PATH"] {
        used.insert(extra.to_owned());
    }
    let documented = documented_variables();
    let missing: Vec<&String> = used.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "not in the man page's ENVIRONMENT (tests/it/docs/man.rs READ or GIVEN): {missing:?}"
    );
    let page = fs::read_to_string(root().join("man/leasewrap.1")).unwrap();
    for name in &documented {
        assert!(
            page.contains(name.as_str()),
            "{name} is not in man/leasewrap.1"
        );
    }
}

#[test]
fn environment_file_example_names_only_real_variables() {
    let text = fs::read_to_string(root().join("packaging/leasewrap.env")).unwrap();
    let documented = documented_variables();
    let mut named = 0;
    for line in text.lines() {
        let setting = line.trim_start_matches('#');
        let Some((key, _)) = setting.split_once('=') else {
            continue;
        };
        if key.starts_with("LEASEWRAP_") && !key.contains(' ') {
            named += 1;
            assert!(
                documented.contains(key),
                "{key} is not a variable leasewrap reads"
            );
        }
        if !line.starts_with('#') && !line.is_empty() {
            // Read by systemd's EnvironmentFile= and by sh alike: no quotes, no spaces, no export.
            assert!(!line.contains(['"', '\'', ' ']), "{line}");
        }
    }
    assert!(named >= 10, "{named} settings");
}

/// The unit files, each copied into `dir` with ExecStart pointing at the built binary (verify
/// wants an executable there).
fn units_for_verify(dir: &Path) -> Vec<PathBuf> {
    let units = root().join("packaging/systemd");
    let mut copies = Vec::new();
    for entry in fs::read_dir(units).unwrap().flatten() {
        let text = fs::read_to_string(entry.path()).unwrap();
        let copy = dir.join(entry.file_name());
        fs::write(
            &copy,
            text.replace("/usr/bin/leasewrap", env!("CARGO_BIN_EXE_leasewrap")),
        )
        .unwrap();
        copies.push(copy);
    }
    copies.sort();
    copies
}

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    let dir = tempfile::tempdir().unwrap();
    let units = units_for_verify(dir.path());
    let names: Vec<String> = units
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "leasewrap-job@.service",
            "leasewrap-job@.timer",
            "leasewrap-singleton@.service"
        ]
    );
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&units)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run systemd-analyze ({e}): install the systemd package (scripts/test.sh does)")
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Unknown keys and bad values are only warnings: any output at all is a failure.
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

#[test]
fn systemd_units_say_what_the_spec_asks() {
    let unit =
        |name: &str| fs::read_to_string(root().join("packaging/systemd").join(name)).unwrap();
    let has = |text: &str, line: &str| text.lines().any(|l| l == line);
    let job = unit("leasewrap-job@.service");
    for line in ["Type=oneshot", "SuccessExitStatus=75", "KillMode=mixed"] {
        assert!(has(&job, line), "job: {line}");
    }
    let singleton = unit("leasewrap-singleton@.service");
    for line in [
        "Type=notify",
        "KillMode=mixed",
        "Restart=always",
        "TimeoutStartSec=infinity",
    ] {
        assert!(has(&singleton, line), "singleton: {line}");
    }
    assert!(has(&unit("leasewrap-job@.timer"), "WantedBy=timers.target"));
}

#[test]
fn cron_example_lines_are_settings_or_five_fields_a_user_and_a_command() {
    let text = fs::read_to_string(root().join("packaging/cron/leasewrap.cron")).unwrap();
    let mut jobs = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() == 1 && line.contains('=') {
            continue;
        }
        assert!(fields.len() > 6, "{line}");
        assert_eq!(fields[5], "root", "{line}");
        assert!(line.contains("leasewrap ") && !line.contains('%'), "{line}");
        jobs += 1;
    }
    assert!(jobs >= 1);
}

/// The `assets` array of `[package.metadata.deb]`: (source, destination, mode) triples.
fn deb_assets() -> Vec<[String; 3]> {
    let toml = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let deb = toml
        .split("[package.metadata.deb]")
        .nth(1)
        .expect("Cargo.toml has [package.metadata.deb]");
    let assets = deb.split("assets = [").nth(1).expect("deb assets");
    let assets = &assets[..assets.find("\n]").expect("end of the assets array")];
    assets
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('['))
        .map(|l| {
            let quoted: Vec<String> = l.split('"').skip(1).step_by(2).map(String::from).collect();
            quoted
                .try_into()
                .unwrap_or_else(|q| panic!("not a triple: {q:?}"))
        })
        .collect()
}

/// What both packages must ship: every man page, completion, unit, SQL file and user doc.
fn shipped() -> Vec<String> {
    let mut shipped: Vec<String> = man::pages()
        .into_iter()
        .map(|(n, _)| format!("man/{n}"))
        .collect();
    shipped.extend(
        completions()
            .into_iter()
            .map(|(n, _)| format!("packaging/completions/{n}")),
    );
    shipped.extend(files_in("packaging/systemd"));
    shipped.push("packaging/cron/leasewrap.cron".into());
    shipped.push("packaging/leasewrap.env".into());
    shipped.extend(files_in("sql"));
    shipped.extend(files_in("docs"));
    shipped.push("README.md".into());
    shipped
}

#[test]
fn debian_package_installs_files_that_exist_and_every_page_completion_unit_and_doc() {
    let assets = deb_assets();
    let sources: BTreeSet<&str> = assets.iter().map(|[s, _, _]| s.as_str()).collect();
    for [source, dest, mode] in &assets {
        if source != "target/release/leasewrap" {
            assert!(root().join(source).is_file(), "{source} does not exist");
        }
        assert!(
            !dest.starts_with('/'),
            "{dest}: cargo-deb wants relative destinations"
        );
        assert!(
            ["644", "755"].contains(&mode.as_str()),
            "{source}: mode {mode}"
        );
    }
    assert!(sources.contains("target/release/leasewrap"));
    for file in &shipped() {
        assert!(
            sources.contains(file.as_str()),
            "{file} is not in the package"
        );
    }
    let toml = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(
        !toml.contains("systemd-units"),
        "units are installed, never enabled"
    );
}

#[test]
fn rpm_package_installs_every_page_completion_unit_and_doc_the_debian_one_does() {
    let rpm = rpm_sources();
    for file in &shipped() {
        // The man pages as scripts/release.sh gzips them for it.
        let source = match file.strip_prefix("man/") {
            Some(page) => format!("target/release/man/{page}.gz"),
            None => file.clone(),
        };
        assert!(rpm.contains(&source), "{file} is not in the RPM package");
    }
    assert!(rpm.contains("target/release/leasewrap"));
    for source in rpm.iter().filter(|s| !s.starts_with("target/")) {
        assert!(root().join(source).is_file(), "{source} does not exist");
    }
}

/// The `source` of each asset of `[package.metadata.generate-rpm]`.
fn rpm_sources() -> BTreeSet<String> {
    let toml = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let rpm = toml
        .split("[package.metadata.generate-rpm]")
        .nth(1)
        .expect("Cargo.toml has [package.metadata.generate-rpm]");
    let assets = &rpm[..rpm.find("\n]").expect("end of the rpm assets")];
    let sources = assets.lines().filter_map(|l| l.split("source = \"").nth(1));
    sources
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// The files of the repository's `dir`, as `dir/name`.
fn files_in(dir: &str) -> Vec<String> {
    let entries = fs::read_dir(root().join(dir)).unwrap().flatten();
    entries
        .map(|e| format!("{dir}/{}", e.file_name().to_string_lossy()))
        .collect()
}
