//! What the binary learns, and how it is laid out, at build time:
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
//! - The order of the functions in a release binary: the ones runs execute first (`hot_first`).

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
    hot_first();
}

/// The functions that runs execute, first in the binary's text (build/hot-functions.txt, made by
/// scripts/hot-functions.sh), on a release build linked by the toolchain's own lld: a run then
/// touches about 1 MiB of the text, packed, where the same functions spread over 3.5 MiB of it.
/// The kernel maps the 64 KiB around each page a run touches, so a holder's resident size is
/// mostly where its code lies (BENCHMARKS.md, "Peak RSS"). Names not in the binary are skipped;
/// with another linker (a portable build's zig, an older toolchain's GNU ld), nothing changes.
fn hot_first() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let file = Path::new(&dir).join("build/hot-functions.txt");
    println!("cargo:rerun-if-changed={}", file.display());
    for var in ["PROFILE", "CARGO_ENCODED_RUSTFLAGS", LINKER_VAR, MAP_VAR] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if std::env::var("PROFILE").as_deref() != Ok("release") || !links_with_lld() {
        return;
    }
    if file.is_file() {
        let ordering = format!("-Wl,--symbol-ordering-file={}", file.display());
        println!("cargo:rustc-link-arg-bins={ordering}");
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
    // Where each function of the (stripped) binary lies, for scripts/hot-functions.sh.
    if let Some(map) = std::env::var_os(MAP_VAR) {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,-Map={}",
            Path::new(&map).display()
        );
    }
}

/// The link map scripts/hot-functions.sh asks for: the file the linker writes it to.
const MAP_VAR: &str = "LEASEWRAP_LINK_MAP";

/// The variable that names another linker for the one target `links_with_lld` knows.
const LINKER_VAR: &str = "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER";

/// Whether rustc links this build with its own lld: its default on x86_64 Linux (glibc) since
/// Rust 1.90, unless a linker or linker flags are given (cargo-zigbuild gives its own).
fn links_with_lld() -> bool {
    let target = std::env::var("TARGET").unwrap_or_default();
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if target != "x86_64-unknown-linux-gnu" || flags.contains("link") {
        return false;
    }
    if std::env::var_os(LINKER_VAR).is_some() || zig_target(&target).is_some() {
        return false;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc).arg("--version").output().ok();
    let version = version.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let minor = version
        .as_deref()
        .and_then(|v| v.split('.').nth(1)?.parse::<u32>().ok());
    minor.is_some_and(|m| m >= 90)
}

/// The glibc the binary is linked against, on a glibc target: cargo-zigbuild's (it names the
/// target it builds for, `x86_64-linux-gnu.2.17`, in a variable of the build), else the build
/// host's, when the build is for the host.
fn glibc_floor(target: &str) -> Option<String> {
    if std::env::var("CARGO_CFG_TARGET_ENV").ok()? != "gnu" {
        return None;
    }
    if let Some(zig_target) = zig_target(target) {
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

/// The target cargo-zigbuild builds for (`x86_64-linux-gnu.2.17`), when it runs this build.
fn zig_target(target: &str) -> Option<String> {
    let zig = format!("CARGO_ZIGBUILD_TARGET_{}", target.replace('-', "_"));
    println!("cargo:rerun-if-env-changed={zig}");
    std::env::var(&zig).ok()
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
