//! The messages between leasewrap and its watchdog: fixed 9-byte frames (a tag and a u64) over a
//! unix stream socket, so either side can read them without allocation or framing state.

use std::time::Duration;

use crate::clock::BootInstant;

/// Bytes in one frame.
pub const FRAME: usize = 9;

/// Tag of the one variable-length message: the lease's variables for the child's environment,
/// as `KEY=VALUE` entries ended by NUL, sent before the first deadline.
pub const ENV_TAG: u8 = b'V';

/// The frame and payload that give the child these extra variables.
pub fn encode_env(vars: &[(String, String)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (k, v) in vars {
        payload.extend_from_slice(format!("{k}={v}\0").as_bytes());
    }
    let mut out = frame(ENV_TAG, payload.len() as u64).to_vec();
    out.extend_from_slice(&payload);
    out
}

/// The variables of an env payload.
pub fn decode_env(payload: &[u8]) -> Vec<(String, String)> {
    payload
        .split(|b| *b == 0)
        .filter_map(|entry| std::str::from_utf8(entry).ok()?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// leasewrap -> watchdog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToWatchdog {
    /// Time between the stop signal and SIGKILL for the TTL granted; sent with the first `D`.
    KillAfter(Duration),
    /// The new `D`, or none (local backend: the lock cannot lapse while leasewrap lives).
    Deadline(Option<BootInstant>),
    /// The lease is lost: stop the child now.
    Stop,
    /// Forward this signal to the child's group, then escalate after kill-after.
    Forward(i32),
}

/// watchdog -> leasewrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FromWatchdog {
    /// The child runs with this pid, which is also its process group.
    Started(i32),
    /// The child could not be started: this errno.
    SpawnFailed(i32),
    /// The deadline's stop time came: the child is being stopped.
    DeadlinePassed,
    /// The child ended with this raw wait status, and every descendant has been reaped.
    Exited(i32),
}

const NO_DEADLINE: u64 = u64::MAX;

impl ToWatchdog {
    pub fn encode(self) -> [u8; FRAME] {
        match self {
            ToWatchdog::Deadline(d) => frame(
                b'D',
                d.map_or(NO_DEADLINE, |d| d.since_boot().as_nanos() as u64),
            ),
            ToWatchdog::KillAfter(d) => frame(b'K', d.as_nanos() as u64),
            ToWatchdog::Stop => frame(b'S', 0),
            ToWatchdog::Forward(sig) => frame(b'F', sig as u64),
        }
    }

    pub fn decode(f: [u8; FRAME]) -> Option<Self> {
        let (tag, v) = unframe(f);
        Some(match tag {
            b'D' if v == NO_DEADLINE => ToWatchdog::Deadline(None),
            b'D' => {
                ToWatchdog::Deadline(Some(BootInstant::from_since_boot(Duration::from_nanos(v))))
            }
            b'K' => ToWatchdog::KillAfter(Duration::from_nanos(v)),
            b'S' => ToWatchdog::Stop,
            b'F' => ToWatchdog::Forward(v as i32),
            _ => return None,
        })
    }
}

impl FromWatchdog {
    pub fn encode(self) -> [u8; FRAME] {
        match self {
            FromWatchdog::Started(pid) => frame(b'P', pid as u64),
            FromWatchdog::SpawnFailed(errno) => frame(b'E', errno as u64),
            FromWatchdog::DeadlinePassed => frame(b'L', 0),
            FromWatchdog::Exited(status) => frame(b'X', status as u32 as u64),
        }
    }

    pub fn decode(f: [u8; FRAME]) -> Option<Self> {
        let (tag, v) = unframe(f);
        Some(match tag {
            b'P' => FromWatchdog::Started(v as i32),
            b'E' => FromWatchdog::SpawnFailed(v as i32),
            b'L' => FromWatchdog::DeadlinePassed,
            b'X' => FromWatchdog::Exited(v as u32 as i32),
            _ => return None,
        })
    }
}

fn frame(tag: u8, v: u64) -> [u8; FRAME] {
    let mut f = [0; FRAME];
    f[0] = tag;
    f[1..].copy_from_slice(&v.to_le_bytes());
    f
}

/// The tag and number of a frame, for the watchdog to tell an env header from the rest.
pub fn unframe(f: [u8; FRAME]) -> (u8, u64) {
    let mut v = [0; 8];
    v.copy_from_slice(&f[1..]);
    (f[0], u64::from_le_bytes(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_payload_survives_a_round_trip() {
        let vars = vec![
            ("LEASEWRAP_FENCING_TOKEN".to_owned(), "42".to_owned()),
            ("LEASEWRAP_KEY".to_owned(), "leasewrap/a=b/1f".to_owned()),
        ];
        let bytes = encode_env(&vars);
        assert_eq!(
            unframe(bytes[..FRAME].try_into().unwrap()),
            (ENV_TAG, (bytes.len() - FRAME) as u64)
        );
        assert_eq!(decode_env(&bytes[FRAME..]), vars);
    }

    #[test]
    fn every_message_survives_a_round_trip() {
        let d = BootInstant::from_since_boot(Duration::new(12345, 678));
        for m in [
            ToWatchdog::Deadline(Some(d)),
            ToWatchdog::Deadline(None),
            ToWatchdog::KillAfter(Duration::from_millis(400)),
            ToWatchdog::Stop,
            ToWatchdog::Forward(15),
        ] {
            assert_eq!(ToWatchdog::decode(m.encode()), Some(m));
        }
        for m in [
            FromWatchdog::Started(4242),
            FromWatchdog::SpawnFailed(2),
            FromWatchdog::DeadlinePassed,
            FromWatchdog::Exited(0x8b),
            FromWatchdog::Exited(-1),
        ] {
            assert_eq!(FromWatchdog::decode(m.encode()), Some(m));
        }
    }
}
