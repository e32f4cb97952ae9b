//! Two things the binary learns at build time:
//!
//! - What `leasewrap --version` says beside the version: the commit it was built from (git, or
//!   the `.cargo_vcs_info.json` of a packaged crate; "commit unknown" outside both), and the
//!   glibc it was linked for. A portable build (scripts/release.sh: cargo-zigbuild with a
//!   `TRIPLE.2.17` target) is linked against that glibc; a native build against the build
//!   host's, which is then the oldest it is sure to run on.
//! - gcc's unwinder, linked statically (libgcc_eh.a), as `gcc -static-libgcc` does for C
//!   programs, so that leasewrap does not load libgcc_s.so.1 at each start: that is one more
//!   library for the dynamic loader to map and relocate, and its constructor runs CPUID, which
//!   traps to the hypervisor in a virtual machine (0.1 ms per start measured on one; see
//!   BENCHMARKS.md). The static unwinder comes first on the link line, so the linker
//!   (`--as-needed`) finds no symbol left for libgcc_s.so.1 and drops it. With a compiler that
//!   has no libgcc_eh.a (not gcc: zig's cc brings its own unwinder), nothing changes.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    let cc_var = format!("CC_{}", target.replace('-', "_"));
    for var in ["CC", "TARGET_CC", &cc_var] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let glibc = glibc_floor(&target);
    let commit = commit().map_or_else(|| "commit unknown".to_owned(), |c| format!("commit {c}"));
    let built = match glibc {
        Some(floor) => format!("{commit}, for glibc {floor} or later"),
        None => commit,
    };
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=LONG_VERSION={version} ({built})");
    static_unwinder(&cc_var);
}

/// The glibc the binary is linked against, on a glibc target: cargo-zigbuild's (it names the
/// target it builds for, `x86_64-linux-gnu.2.17`, in a variable of the build), else the build
/// host's, when the build is for the host.
fn glibc_floor(target: &str) -> Option<String> {
    if std::env::var("CARGO_CFG_TARGET_ENV").ok()? != "gnu" {
        return None;
    }
    let zig = format!("CARGO_ZIGBUILD_TARGET_{}", target.replace('-', "_"));
    println!("cargo:rerun-if-env-changed={zig}");
    if let Ok(zig_target) = std::env::var(&zig) {
        // `x86_64-linux-gnu.2.17`; without a version, zig's default, which it does not name.
        let version = zig_target.split_once("gnu.").map(|(_, v)| v.to_owned());
        let numeric = |v: &String| v.split('.').all(|n| n.parse::<u32>().is_ok());
        return version.filter(numeric);
    }
    if std::env::var("HOST").ok()? != target {
        return None;
    }
    // "glibc 2.36"
    let out = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.trim().strip_prefix("glibc ").map(str::to_owned)
}

/// The commit being built, shortened: from git when the package is the top of a work tree,
/// else from the `.cargo_vcs_info.json` that `cargo package` writes.
fn commit() -> Option<String> {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    git_commit(&dir).or_else(|| packaged_commit(&dir))
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

fn git_commit(dir: &Path) -> Option<String> {
    // A source tree unpacked inside some other repository is not that repository's commit.
    let top = git(dir, &["rev-parse", "--show-toplevel"])?;
    if Path::new(&top).canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    // Built again when HEAD moves: HEAD itself, the branch it names, and the packed refs.
    let git_dir = PathBuf::from(git(dir, &["rev-parse", "--absolute-git-dir"])?);
    let common = PathBuf::from(git(dir, &["rev-parse", "--git-common-dir"])?);
    let common = if common.is_absolute() {
        common
    } else {
        dir.join(common)
    };
    let mut watched = vec![git_dir.join("HEAD"), common.join("packed-refs")];
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(common.join(branch));
    }
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    git(dir, &["rev-parse", "--short=12", "HEAD"])
}

/// `"sha1": "..."` of `.cargo_vcs_info.json`, shortened.
fn packaged_commit(dir: &Path) -> Option<String> {
    let info = dir.join(".cargo_vcs_info.json");
    println!("cargo:rerun-if-changed={}", info.display());
    let text = std::fs::read_to_string(info).ok()?;
    let after = text.split("\"sha1\"").nth(1)?;
    let sha: String = after
        .chars()
        .skip_while(|c| !c.is_ascii_hexdigit())
        .take_while(char::is_ascii_hexdigit)
        .take(12)
        .collect();
    (sha.len() == 12).then_some(sha)
}

fn static_unwinder(cc_var: &str) {
    let target_env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let static_crt = std::env::var("CARGO_CFG_TARGET_FEATURE")
        .is_ok_and(|f| f.split(',').any(|f| f == "crt-static"));
    // A static build links libgcc_eh already; other targets have no libgcc_s.
    if target_os != "linux" || target_env != "gnu" || static_crt {
        return;
    }
    if let Some(dir) = libgcc_eh_dir(cc_var) {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
    }
}

/// The folder of the target's C compiler's libgcc_eh.a, if it has one.
fn libgcc_eh_dir(cc_var: &str) -> Option<PathBuf> {
    let cc = [cc_var, "TARGET_CC", "CC"]
        .iter()
        .find_map(std::env::var_os)
        .unwrap_or_else(|| "cc".into());
    let out = Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    // Without the file, gcc prints the bare name back.
    if !out.status.success() || !path.is_absolute() || !path.is_file() {
        return None;
    }
    path.parent().map(PathBuf::from)
}
