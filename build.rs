//! Link gcc's unwinder statically (libgcc_eh.a), as `gcc -static-libgcc` does for C programs,
//! so that leasewrap does not load libgcc_s.so.1 at each start: that is one more library for
//! the dynamic loader to map and relocate, and its constructor runs CPUID, which traps to the
//! hypervisor in a virtual machine (0.1 ms per start measured on one; see BENCHMARKS.md).
//! The static unwinder comes first on the link line, so the linker (`--as-needed`) finds no
//! symbol left for libgcc_s.so.1 and drops it. With a compiler that has no libgcc_eh.a (not
//! gcc), nothing changes: libgcc_s.so.1 is linked as before.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    let target_env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let static_crt = std::env::var("CARGO_CFG_TARGET_FEATURE")
        .is_ok_and(|f| f.split(',').any(|f| f == "crt-static"));
    // A static build links libgcc_eh already; other targets have no libgcc_s.
    if target_os != "linux" || target_env != "gnu" || static_crt {
        return;
    }
    if let Some(dir) = libgcc_eh_dir() {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
    }
}

/// The folder of the C compiler's libgcc_eh.a, if it has one.
fn libgcc_eh_dir() -> Option<PathBuf> {
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
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
