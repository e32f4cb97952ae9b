//! A second, unprivileged user for the tests of what another user can do (plant a link, a FIFO or
//! a directory; share a state directory). Created once with useradd, idempotently, so that every
//! test binary and every run finds the same one.
//!
//! Needs root: without it the test fails with a message saying so, never skips.

use std::os::unix::fs::{chown, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

/// The account's name.
pub const OTHER: &str = "leasewrap-test";

/// A local account.
#[derive(Debug, Clone, Copy)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

/// The second user, created if missing.
#[track_caller]
pub fn other() -> User {
    static USER: OnceLock<User> = OnceLock::new();
    *USER.get_or_init(|| {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root, to create the user {OTHER} and act as it"
        );
        if let Some(user) = lookup() {
            return user;
        }
        let out = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(OTHER)
            .output()
            .expect("run useradd (Debian package passwd)");
        // 9: another test process created it first.
        assert!(
            out.status.success() || out.status.code() == Some(9),
            "useradd {OTHER}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        lookup().unwrap_or_else(|| panic!("useradd made no user {OTHER}"))
    })
}

fn lookup() -> Option<User> {
    let user = nix::unistd::User::from_name(OTHER).ok()??;
    Some(User {
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
    })
}

impl User {
    /// Gives `path` to this user.
    #[track_caller]
    pub fn owns(&self, path: &Path) {
        chown(path, Some(self.uid), Some(self.gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
}

/// Sets the permission bits of `path`.
#[track_caller]
pub fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}
