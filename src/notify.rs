//! sd_notify for systemd: READY=1 once the child runs, STATUS= while waiting and holding,
//! STOPPING=1 on the way out. A no-op when NOTIFY_SOCKET is not set; failures are ignored, as
//! systemd's own sd_notify does.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// A connection to systemd's notification socket, if there is one.
pub struct Notifier {
    /// Unbound datagram socket and the address to send to.
    target: Option<(UnixDatagram, SocketAddr)>,
}

impl Notifier {
    /// From `NOTIFY_SOCKET`: a path, or an abstract name written with a leading '@'.
    pub fn from_env() -> Self {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|p| {
            let p = p.to_string_lossy().into_owned();
            let addr = match p.strip_prefix('@') {
                Some(abs) => SocketAddr::from_abstract_name(abs.as_bytes()).ok()?,
                None => SocketAddr::from_pathname(&p).ok()?,
            };
            Some((UnixDatagram::unbound().ok()?, addr))
        });
        Self { target }
    }

    /// Send one notification (newline-separated assignments).
    pub fn send(&self, state: &str) {
        if let Some((sock, addr)) = &self.target {
            let _ = sock.send_to_addr(state.as_bytes(), addr);
        }
    }
}
