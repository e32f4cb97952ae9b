//! The hardest tree to stop: a child that ignores SIGTERM and has started a daemon, in a session
//! of its own, that ignores it too. Used by the tests of every way the tree must still die
//! (leasewrap or the watchdog killed or stopped, --max-runtime).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{
    assert_all_die_within, atomically, ppid_of, q, read_pid, KillOnDrop, Leasewrap, Running,
    Sandbox, STARTUP,
};

/// A leasewrap running the tree, and the pids of its parts.
pub struct Tree {
    pub leasewrap: Running,
    pub child: i32,
    pub watchdog: i32,
    pub daemon: i32,
    /// Kills the child and the daemon should the test fail before they are gone.
    _guard: KillOnDrop,
}

/// --kill-after of every tree.
pub const TREE_KILL_AFTER: Duration = Duration::from_millis(500);

/// kill-after + 1 s, as the spec promises for a SIGKILLed leasewrap or watchdog.
const TREE_DEATH_BOUND: Duration = Duration::from_millis(1500);

/// The daemon's script: it ignores SIGTERM, writes its pid to `daemon.pid` and sleeps.
pub fn daemon_script(sb: &Sandbox) -> PathBuf {
    sb.script(
        "daemon.sh",
        &format!(
            "trap '' TERM\n{}\nexec sleep 60",
            atomically("echo $$", &sb.path("daemon.pid"))
        ),
    )
}

/// Starts `lw` (named, not yet given a command, nor --kill-after) on the tree.
pub fn start_tree(sb: &Sandbox, lw: Leasewrap) -> Tree {
    let daemon = daemon_script(sb);
    let child = sb.script(
        "child.sh",
        &format!(
            "setsid sh -c '\"$0\" &' {} </dev/null >/dev/null 2>&1\ntrap '' TERM\n{}\nexec sleep 60",
            q(&daemon),
            atomically("echo $$", &sb.path("child.pid")),
        ),
    );
    let kill_after = format!("{}ms", TREE_KILL_AFTER.as_millis());
    let leasewrap = lw
        .args(&["--kill-after", &kill_after])
        .cmd(&[utf8(&child)])
        .spawn();
    let child = read_pid(&sb.path("child.pid"), STARTUP);
    let daemon = read_pid(&sb.path("daemon.pid"), STARTUP);
    let _guard = KillOnDrop(vec![child, daemon]);
    let watchdog = ppid_of(child).expect("the child's parent");
    assert_ne!(
        watchdog,
        leasewrap.pid(),
        "the child's parent is leasewrap itself, not a watchdog"
    );
    assert_eq!(
        ppid_of(watchdog),
        Some(leasewrap.pid()),
        "the watchdog is not leasewrap's child"
    );
    Tree {
        leasewrap,
        child,
        watchdog,
        daemon,
        _guard,
    }
}

impl Tree {
    /// Child, watchdog and daemon are all gone within `TREE_DEATH_BOUND`.
    #[track_caller]
    pub fn assert_gone(&self) {
        self.assert_gone_within(TREE_DEATH_BOUND);
    }

    /// Child, watchdog and daemon are all gone within `bound`.
    #[track_caller]
    pub fn assert_gone_within(&self, bound: Duration) {
        assert_all_die_within(
            bound,
            &[
                ("child", self.child),
                ("watchdog", self.watchdog),
                ("daemon", self.daemon),
            ],
        );
    }
}

fn utf8(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}
