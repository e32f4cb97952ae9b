//! Log entries for the journal, when stderr is the journal (`JOURNAL_STREAM` names fd 2's device
//! and inode, systemd.exec(5)): native entries on journald's socket (its native protocol, with
//! the memfd fallback for an entry too big for one datagram), or, when that socket cannot be
//! reached, `<N>`-prefixed lines on stderr (sd-daemon(3)). Either way the priority is the
//! level's and there is no timestamp of leasewrap's own: the journal keeps its own.
//!
//! Each entry carries the lease's fields where known, from the event or from what the run
//! noted before it ([`super::note`]): LEASEWRAP_NAME, LEASEWRAP_FENCING_TOKEN and
//! LEASEWRAP_LEASE_ID, so that `journalctl LEASEWRAP_NAME=demo` finds a lease's lines.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;

use super::Known;

/// journald's socket for native entries.
const SOCKET: &str = "/run/systemd/journal/socket";

/// The journal as a tracing layer.
pub struct Journal {
    /// Connected to journald; None when it could not be reached (then `<N>` lines on stderr).
    socket: Option<UnixDatagram>,
}

impl Journal {
    /// The journal, when fd 2 is the stream `JOURNAL_STREAM` names.
    pub fn for_stderr() -> Option<Journal> {
        let stream = std::env::var("JOURNAL_STREAM").ok()?;
        let (dev, ino) = stream.split_once(':')?;
        let st = nix::sys::stat::fstat(std::io::stderr()).ok()?;
        let ours = dev.parse() == Ok(st.st_dev) && ino.parse() == Ok(st.st_ino);
        ours.then(|| Journal {
            socket: connect(Path::new(SOCKET)),
        })
    }
}

fn connect(path: &Path) -> Option<UnixDatagram> {
    let socket = UnixDatagram::unbound().ok()?;
    socket.connect(path).ok()?;
    Some(socket)
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for Journal {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let priority = priority(*event.metadata().level());
        let entry = entry(priority, &fields, &super::known());
        let sent = self
            .socket
            .as_ref()
            .is_some_and(|s| send(s, &entry).is_ok());
        if !sent {
            // One write, so that a line is not split among other writers of the stream.
            let line = format!("<{priority}>{}\n", crate::text::printable(&fields.text()));
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

/// syslog's priorities: ERROR 3, WARN 4, INFO 6, DEBUG and TRACE 7.
const fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// An event's message and its other fields, as text.
#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.rest.push((field.name(), format!("{value:?}")));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.rest.push((field.name(), value.to_owned()));
        }
    }
}

impl Fields {
    /// The message and `key=value` for each other field, as the text format writes them.
    fn text(&self) -> String {
        let mut text = self.message.clone();
        for (key, value) in &self.rest {
            let _ = write!(text, " {key}={value}");
        }
        text
    }

    fn get(&self, key: &str) -> Option<&str> {
        let found = self.rest.iter().find(|(k, _)| *k == key);
        found.map(|(_, v)| v.as_str())
    }
}

/// `text` by the one escaping rule, its lines kept: the journal stores a message of several
/// lines as it is, and shows each line as a line.
fn journal_printable(text: &str) -> String {
    let lines: Vec<String> = text.split('\n').map(crate::text::printable).collect();
    lines.join("\n")
}

/// The entry in journald's native format: `KEY=value` lines, or for a value with a newline
/// `KEY`, a newline, its length as 64-bit little endian, the value and a newline.
fn entry(priority: u8, fields: &Fields, known: &Known) -> Vec<u8> {
    let mut out = Vec::new();
    let mut field = |key: &str, value: &str| {
        out.extend_from_slice(key.as_bytes());
        if value.contains('\n') {
            out.push(b'\n');
            out.extend_from_slice(&(value.len() as u64).to_le_bytes());
        } else {
            out.push(b'=');
        }
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    };
    field("PRIORITY", &priority.to_string());
    field("SYSLOG_IDENTIFIER", "leasewrap");
    field("MESSAGE", &journal_printable(&fields.text()));
    let token = known.token.map(|t| t.to_string());
    let lease = known.lease.map(|l| format!("{l:x}"));
    let ours = [
        ("LEASEWRAP_NAME", fields.get("name"), known.name.as_deref()),
        (
            "LEASEWRAP_FENCING_TOKEN",
            fields.get("token"),
            token.as_deref(),
        ),
        ("LEASEWRAP_LEASE_ID", fields.get("lease"), lease.as_deref()),
    ];
    for (key, from_event, noted) in ours {
        if let Some(value) = from_event.or(noted) {
            field(key, value);
        }
    }
    out
}

/// Send one entry: in a datagram, or when it is too big for one, in a sealed memfd passed
/// along (as sd_journal_send does).
fn send(socket: &UnixDatagram, entry: &[u8]) -> std::io::Result<()> {
    match socket.send(entry) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMSGSIZE | libc::ENOBUFS)) => {
            send_memfd(socket, entry)
        }
        sent => sent.map(drop),
    }
}

fn send_memfd(socket: &UnixDatagram, entry: &[u8]) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let mut file = std::fs::File::from(memfd(c"leasewrap-journal")?);
    file.write_all(entry)?;
    let seals = SealFlag::F_SEAL_SHRINK
        | SealFlag::F_SEAL_GROW
        | SealFlag::F_SEAL_WRITE
        | SealFlag::F_SEAL_SEAL;
    fcntl(&file, FcntlArg::F_ADD_SEALS(seals))?;
    let fds = [file.as_raw_fd()];
    let rights = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(socket.as_raw_fd(), &[], &rights, MsgFlags::empty(), None)?;
    Ok(())
}

/// A sealable memfd, by the system call itself (Linux 3.17): glibc's wrapper came only with
/// 2.27, and the portable binary is linked against an older glibc (README, "Install").
fn memfd(name: &std::ffi::CStr) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd as _;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: memfd_create takes a NUL-terminated name and flags, and returns a new
    // descriptor or -1; the name outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_memfd_create, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(message: &str, rest: &[(&'static str, &str)]) -> Fields {
        Fields {
            message: message.into(),
            rest: rest.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
        }
    }

    #[test]
    fn an_entry_has_priority_identifier_message_and_the_lease_s_fields() {
        let f = fields("acquired", &[("name", "demo"), ("token", "7")]);
        let known = Known {
            lease: Some(0xabc),
            ..Known::default()
        };
        let text = String::from_utf8(entry(6, &f, &known)).unwrap();
        assert_eq!(
            text,
            "PRIORITY=6\nSYSLOG_IDENTIFIER=leasewrap\nMESSAGE=acquired name=demo token=7\n\
             LEASEWRAP_NAME=demo\nLEASEWRAP_FENCING_TOKEN=7\nLEASEWRAP_LEASE_ID=abc\n"
        );
    }

    #[test]
    fn a_value_with_a_newline_is_sent_with_its_length() {
        let f = fields("two\nlines", &[]);
        let got = entry(3, &f, &Known::default());
        let mut want = b"PRIORITY=3\nSYSLOG_IDENTIFIER=leasewrap\nMESSAGE\n".to_vec();
        want.extend_from_slice(&9u64.to_le_bytes());
        want.extend_from_slice(b"two\nlines\n");
        assert_eq!(got, want);
    }

    #[test]
    fn an_entry_sent_in_a_memfd_arrives_whole_and_sealed() {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        use std::io::Read;
        use std::os::fd::{FromRawFd, OwnedFd};
        let dir = std::env::temp_dir().join(format!("leasewrap-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("socket");
        let _ = std::fs::remove_file(&path);
        let server = UnixDatagram::bind(&path).unwrap();
        let entry = b"PRIORITY=6\nMESSAGE=big\n".repeat(1000);
        send_memfd(&connect(&path).unwrap(), &entry).unwrap();
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let msg = recvmsg::<()>(
            server.as_raw_fd(),
            &mut [],
            Some(&mut space),
            MsgFlags::empty(),
        )
        .unwrap();
        let fd = match msg.cmsgs().unwrap().next() {
            Some(ControlMessageOwned::ScmRights(fds)) => fds[0],
            other => panic!("no fd passed: {other:?}"),
        };
        // SAFETY: the fd was just received and is owned by nothing else.
        let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut got = Vec::new();
        std::io::Seek::rewind(&mut file).unwrap();
        file.read_to_end(&mut got).unwrap();
        assert_eq!(got, entry);
        assert!(
            std::io::Write::write_all(&mut file, b"x").is_err(),
            "not sealed"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn levels_map_to_syslog_priorities() {
        let got = [
            Level::ERROR,
            Level::WARN,
            Level::INFO,
            Level::DEBUG,
            Level::TRACE,
        ]
        .map(priority);
        assert_eq!(got, [3, 4, 6, 7, 7]);
    }
}
