//! The one deadline clock: CLOCK_BOOTTIME, which keeps counting while the machine is suspended and
//! never jumps when the wall clock is stepped. Every lease deadline is a [`BootInstant`].

use std::ops::{Add, Sub};
use std::time::Duration;

/// A reading of CLOCK_BOOTTIME, as time since boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// The current reading.
    pub fn now() -> Self {
        // CLOCK_BOOTTIME cannot fail on Linux >= 2.6.39; a failure here would be a broken kernel.
        let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
            .expect("CLOCK_BOOTTIME is readable");
        Self(Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32))
    }

    /// An instant given as time since boot (for tests and for the watchdog pipe).
    pub const fn from_since_boot(d: Duration) -> Self {
        Self(d)
    }

    /// Time since boot, as sent to the watchdog.
    pub const fn since_boot(self) -> Duration {
        self.0
    }

    /// Time from `self` until `later`, zero when `later` has already passed.
    pub fn until(self, later: BootInstant) -> Duration {
        later.0.saturating_sub(self.0)
    }
}

impl Add<Duration> for BootInstant {
    type Output = BootInstant;
    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0 + d)
    }
}

impl Sub<Duration> for BootInstant {
    type Output = BootInstant;
    fn sub(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_sub(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boottime_moves_forward() {
        let a = BootInstant::now();
        let b = BootInstant::now();
        assert!(b >= a);
        assert_eq!(b.until(a), Duration::ZERO);
    }
}
