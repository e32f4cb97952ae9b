//! The `User=` drop-in of docs/operating.md, under a real systemd as PID 1 of private PID,
//! mount and UTS namespaces: the user gets a state directory of its own, and root's
//! `/var/lib/leasewrap` stays root's.
//!
//! Nothing reaches the machine: /run, /tmp, /var/tmp, /var/log/journal and /etc/systemd/system
//! are each a tmpfs of the namespace (so systemd-tmpfiles, were it started, would clean those,
//! not the machine's), /var/lib is a directory of the test's, early-boot services are masked,
//! and the units started have no default dependencies, so nothing but them is started.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::examples::markdown;
use super::root;
use crate::support::{run_bounded, BIN};

/// How long the whole boot, the three jobs and the exit may take.
const BOOT_BOUND: Duration = Duration::from_secs(120);

/// Units a boot would start that have no business in the test's namespace.
const MASKED: &[&str] = &[
    "systemd-tmpfiles-setup.service",
    "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-clean.service",
    "systemd-tmpfiles-clean.timer",
    "systemd-journald.service",
    "systemd-journald.socket",
    "systemd-journald-dev-log.socket",
    "systemd-udevd.service",
    "systemd-remount-fs.service",
    "systemd-sysusers.service",
    "systemd-random-seed.service",
    "systemd-update-utmp.service",
    "systemd-networkd-wait-online.service",
];

/// Run in the namespaces: the private mounts, the units, then systemd as PID 1.
/// `$KEEP`, the target dir (the binary and `$D` are in it), is held on /mnt while the tmpfs go on,
/// then put back at its own path: a checkout under /tmp (as a CI clone may be) would be hidden by
/// the namespace's /tmp otherwise.
const INNER: &str = r#"set -e
mount --make-rprivate /
mkdir -p /mnt
mount --bind "$KEEP" /mnt
for d in /run /tmp /var/tmp /var/log/journal /etc/systemd/system; do mount -t tmpfs tmpfs "$d"; done
mkdir -p "$KEEP"
mount --bind /mnt "$KEEP"
mount --bind "$D/varlib" /var/lib
cp -r "$D/units/." /etc/systemd/system/
for u in $MASKED; do ln -s /dev/null "/etc/systemd/system/$u"; done
exec env container=leasewrap-test /lib/systemd/systemd --system --unit=probe.service
"#;

/// What the probe does once systemd runs: a root job, the drop-in's job as nobody, another
/// root job on root's directory; then it records owners and modes, and ends the manager.
const PROBE: &str = r#"#!/bin/sh
cd "$D/out"
systemctl start leasewrap-job@root-report.service; echo $? > root-report.status
systemctl start leasewrap-job@nightly-report.service; echo $? > nightly-report.status
systemctl start leasewrap-job@root-later.service; echo $? > root-later.status
stat -c '%n %U %a' /var/lib/leasewrap /var/lib/leasewrap-nobody > dirs 2>&1 || true
systemctl --no-block exit 0
"#;

/// The job every instance runs: who it runs as, and the state directory it was given.
const JOB: &str = r#"#!/bin/sh
echo "$(id -un) $LEASEWRAP_LOCAL_DIR" > "$D/out/$LEASEWRAP_NAME.ran"
"#;

/// docs/operating.md's `User=` drop-in, as the unit file text systemctl edit would save.
fn documented_drop_in() -> String {
    let examples = markdown("docs/operating.md");
    let block = examples.iter().find(|e| e.text.contains("User="));
    let block = block.expect("docs/operating.md has a User= drop-in");
    let lines = block.text.lines().map(str::trim);
    let unit: Vec<&str> = lines.skip_while(|l| !l.starts_with('[')).collect();
    assert!(unit.contains(&"User=nobody"), "{}: {unit:?}", block.place);
    unit.join("\n") + "\n"
}

fn write_exec(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// The packaged job unit, pointed at the built binary and the test's jobs, with the documented
/// drop-in for nightly-report and, for every instance, no default dependencies.
fn write_units(dir: &Path) {
    let units = dir.join("units");
    let unit = fs::read_to_string(root().join("packaging/systemd/leasewrap-job@.service")).unwrap();
    let jobs = format!("{}/", dir.join("jobs").display());
    let unit = unit
        .replace("/usr/bin/leasewrap", BIN)
        .replace("/etc/leasewrap/jobs/", &jobs);
    fs::write(units.join("leasewrap-job@.service"), unit).unwrap();
    let drop_in = units.join("leasewrap-job@nightly-report.service.d");
    fs::create_dir_all(&drop_in).unwrap();
    fs::write(drop_in.join("override.conf"), documented_drop_in()).unwrap();
    let test_only = units.join("leasewrap-job@.service.d");
    fs::create_dir_all(&test_only).unwrap();
    fs::write(
        test_only.join("test.conf"),
        "[Unit]\nDefaultDependencies=no\n",
    )
    .unwrap();
    let probe = format!(
        "[Unit]\nDefaultDependencies=no\n[Service]\nType=oneshot\nEnvironment=D={}\nExecStart={}\n",
        dir.display(),
        dir.join("probe.sh").display()
    );
    fs::write(units.join("probe.service"), probe).unwrap();
}

/// A scratch directory under the target dir (which [`INNER`] keeps visible inside the namespace),
/// readable by nobody, with the jobs, the units and a world-writable `out/`.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for sub in ["units", "jobs", "varlib", "out"] {
        fs::create_dir(dir.path().join(sub)).unwrap();
    }
    fs::set_permissions(dir.path().join("out"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::set_permissions(dir.path().join("varlib"), fs::Permissions::from_mode(0o755)).unwrap();
    for name in ["root-report", "nightly-report", "root-later"] {
        let job = JOB.replace("$D", &dir.path().display().to_string());
        write_exec(&dir.path().join("jobs").join(name), &job);
    }
    write_exec(&dir.path().join("probe.sh"), PROBE);
    write_units(dir.path());
    dir
}

/// Boots systemd in private namespaces over `dir` until the probe ends it.
fn boot(dir: &Path) {
    let systemd = Path::new("/lib/systemd/systemd");
    assert!(
        systemd.exists(),
        "{} is missing: apt-get install systemd (scripts/test.sh does)",
        systemd.display()
    );
    let mut unshare = Command::new("unshare");
    unshare.args([
        "--pid",
        "--fork",
        "--mount",
        "--mount-proc",
        "--uts",
        "sh",
        "-c",
        INNER,
    ]);
    let keep = Path::new(env!("CARGO_TARGET_TMPDIR")).parent();
    let keep = keep.expect("the target dir holds CARGO_TARGET_TMPDIR");
    assert!(
        dir.starts_with(keep) && Path::new(BIN).starts_with(keep),
        "{} and {BIN} must be in {}",
        dir.display(),
        keep.display()
    );
    unshare.env("D", dir).env("KEEP", keep);
    unshare.env("MASKED", MASKED.join(" "));
    let out = run_bounded(unshare, BOOT_BOUND);
    assert!(
        out.status.success(),
        "systemd in namespaces: {}\n{}{}",
        out.status,
        out.stdout,
        out.stderr
    );
}

fn read(dir: &Path, name: &str) -> String {
    let path = dir.join("out").join(name);
    let text = fs::read_to_string(&path);
    text.unwrap_or_else(|e| panic!("{}: {e} (the probe did not get that far)", path.display()))
        .trim()
        .to_owned()
}

#[test]
fn documented_user_drop_in_gives_the_user_its_own_state_directory_and_leaves_roots_to_root() {
    let dir = scratch();
    boot(dir.path());
    let d = dir.path();
    let varlib = d.join("varlib");
    assert_eq!(read(d, "root-report.status"), "0", "root's job before");
    assert_eq!(read(d, "nightly-report.status"), "0", "the User=nobody job");
    assert_eq!(
        read(d, "nightly-report.ran"),
        "nobody /var/lib/leasewrap-nobody"
    );
    assert_eq!(
        read(d, "root-later.status"),
        "0",
        "root's job after the user's: its directory is still root's"
    );
    assert_eq!(read(d, "root-later.ran"), "root /var/lib/leasewrap");
    let dirs = read(d, "dirs");
    assert!(
        dirs.contains("/var/lib/leasewrap root 755")
            && dirs.contains("/var/lib/leasewrap-nobody nobody 755"),
        "owners and modes: {dirs}"
    );
    assert!(
        varlib
            .join("leasewrap-nobody/nightly-report.token")
            .exists(),
        "nobody's token is in its own directory"
    );
}
