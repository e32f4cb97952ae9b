//! The release that `scripts/release.sh` makes, made once per test binary and shared by every
//! test that reads it (tests/it/release.rs, the README's Install examples): the portable
//! binary, the .deb, the .rpm, the tarball and SHA256SUMS in the target folder's `dist/`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::{niced, run_bounded, without_cargo_env, BIN};

/// The command that makes a release, as the README gives it.
pub const RELEASE_COMMAND: &str = "scripts/release.sh";

/// A cold release build (fat LTO) and both packages, on a loaded 2-core machine.
const RELEASE_BOUND: Duration = Duration::from_secs(30 * 60);

/// What one run of `scripts/release.sh` made.
pub struct Dist {
    /// The folder it all went into.
    pub dir: PathBuf,
    /// The portable binary the packages and the tarball were made from.
    pub binary: PathBuf,
    /// The floor it was linked for: `GLIBC_FLOOR` of scripts/release.sh.
    pub glibc_floor: String,
}

impl Dist {
    fn named(&self, name: String) -> PathBuf {
        self.dir.join(name)
    }

    pub fn deb(&self) -> PathBuf {
        self.named(format!("leasewrap_{}-1_amd64.deb", version()))
    }

    pub fn rpm(&self) -> PathBuf {
        self.named(format!("leasewrap-{}-1.x86_64.rpm", version()))
    }

    /// The tarball's name without `.tar.gz`: the folder it unpacks into.
    pub fn tarball_top(&self) -> String {
        format!("leasewrap-{}-x86_64-linux-gnu", version())
    }

    pub fn tarball(&self) -> PathBuf {
        self.named(format!("{}.tar.gz", self.tarball_top()))
    }
}

fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The target folder of the build under test: the one the release goes into too.
pub fn target_dir() -> PathBuf {
    let bin = Path::new(BIN);
    bin.parent().and_then(Path::parent).unwrap().to_owned()
}

/// `GLIBC_FLOOR=2.17` of scripts/release.sh: the one place the floor is chosen.
pub fn glibc_floor() -> String {
    let script = std::fs::read_to_string(root().join(RELEASE_COMMAND)).unwrap();
    let line = script.lines().find_map(|l| l.strip_prefix("GLIBC_FLOOR="));
    line.expect("scripts/release.sh sets GLIBC_FLOOR")
        .to_owned()
}

/// The release, made on first use; every later caller gets the same one, or the same failure.
pub fn dist() -> &'static Dist {
    static DIST: OnceLock<Result<Dist, String>> = OnceLock::new();
    let made = DIST.get_or_init(|| {
        std::panic::catch_unwind(make).unwrap_or_else(|_| Err("the release run panicked".into()))
    });
    match made {
        Ok(dist) => dist,
        Err(e) => panic!("{e}"),
    }
}

fn make() -> Result<Dist, String> {
    let target = target_dir();
    let mut cmd = Command::new("bash");
    without_cargo_env(&mut cmd);
    cmd.arg(RELEASE_COMMAND)
        .current_dir(root())
        .env("CARGO_TARGET_DIR", &target);
    niced(&mut cmd);
    let out = run_bounded(cmd, RELEASE_BOUND);
    if !out.status.success() {
        let lines: Vec<&str> = out.stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        return Err(format!(
            "{RELEASE_COMMAND} failed ({}):\n{tail}",
            out.status
        ));
    }
    Ok(Dist {
        dir: target.join("dist"),
        binary: target.join("x86_64-unknown-linux-gnu/release/leasewrap"),
        glibc_floor: glibc_floor(),
    })
}
