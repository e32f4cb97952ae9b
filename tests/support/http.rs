//! A real HTTP server (Python's `http.server`) on a free loopback port: what sits at a wrong port
//! or a health endpoint where etcd or ZooKeeper should be. Killed by its own pid on drop.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use tempfile::TempDir;

use super::etcd::free_port;
use super::{wait_until, STARTUP};

pub struct HttpServer {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl HttpServer {
    /// Start it, serving an empty temp dir, and wait until it listens.
    pub fn start() -> HttpServer {
        let port = free_port();
        let dir = tempfile::tempdir().expect("a temp dir");
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m http.server: install python3 (scripts/test.sh does)");
        wait_until(STARTUP, "the HTTP server to listen", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        HttpServer {
            child,
            port,
            _dir: dir,
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
