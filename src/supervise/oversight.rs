//! leasewrap's check on its watchdog. The watchdog enforces every deadline on its own, so that
//! a stopped leasewrap still loses its child on time; the reverse case is this module's: a
//! watchdog stopped on its own (SIGSTOP to its pid) cannot stop the child, so at each moment it
//! must act, leasewrap looks whether it can. Those moments are the stop time and `D` of the last
//! deadline it was given, and a stop asked for (at once, and kill-after later). Before the kill
//! time leasewrap sends the stop signal to the child's group itself; from it on, it kills.
//!
//! The rule is pure (instants in, the next instant to look out); only [`is_stopped`] reads /proc.

use std::time::Duration;

use super::protocol::ToWatchdog;
use crate::clock::BootInstant;
use crate::lease::timing::stop_time;

/// When leasewrap must look at its watchdog next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Oversight {
    /// Time between the stop signal and SIGKILL, as the watchdog was given it.
    kill_after: Duration,
    /// The last `D` the watchdog was given; none before the start and on the local backend.
    deadline: Option<BootInstant>,
    /// When a stop (a lost lease, a signal, --max-runtime) was first asked for.
    stop_asked: Option<BootInstant>,
    /// The signal forwarded by the first stop asked for, if that was a forward.
    forwarded: Option<i32>,
    /// Every moment up to this one has been looked at.
    checked: Option<BootInstant>,
}

impl Oversight {
    /// The child starts under `deadline`, with `kill_after`.
    pub fn started(&mut self, kill_after: Duration, deadline: Option<BootInstant>) {
        self.kill_after = kill_after;
        self.deadline = deadline;
    }

    /// `msg` went to the watchdog at `now`. A stop under way is never called off, so a later
    /// deadline no longer matters once one was asked for.
    pub fn sent(&mut self, msg: ToWatchdog, now: BootInstant) {
        match msg {
            ToWatchdog::Deadline(d) if self.stop_asked.is_none() => self.deadline = d,
            ToWatchdog::Stop if self.stop_asked.is_none() => self.stop_asked = Some(now),
            ToWatchdog::Forward(sig) if self.stop_asked.is_none() => {
                self.stop_asked = Some(now);
                self.forwarded = Some(sig);
            }
            _ => {}
        }
    }

    /// The next moment at which the watchdog must be able to act, if any is left.
    pub fn next_check(&self) -> Option<BootInstant> {
        let stop = self.deadline.map(|d| stop_time(d, self.kill_after));
        let kill = self.stop_asked.map(|s| s + self.kill_after);
        [stop, self.deadline, self.stop_asked, kill]
            .into_iter()
            .flatten()
            .filter(|t| self.checked.is_none_or(|c| *t > c))
            .min()
    }

    /// The signal forwarded by the first stop asked for, if a forward asked for it; the
    /// configured stop signal stops the child in order otherwise.
    pub fn forwarded(&self) -> Option<i32> {
        self.forwarded
    }

    /// Whether SIGKILL is due at `now`: `D` has come, or kill-after has passed since a stop
    /// was asked for.
    pub fn kill_due(&self, now: BootInstant) -> bool {
        let kill = self.stop_asked.map(|s| s + self.kill_after);
        [self.deadline, kill]
            .into_iter()
            .flatten()
            .any(|t| now >= t)
    }

    /// Whether the stop time of the last deadline has come at `now`: the lease is then as good
    /// as lost, whatever else was asked.
    pub fn past_stop_time(&self, now: BootInstant) -> bool {
        self.deadline
            .is_some_and(|d| now >= stop_time(d, self.kill_after))
    }

    /// The moment `at` has been looked at.
    pub fn checked(&mut self, at: BootInstant) {
        self.checked = Some(self.checked.map_or(at, |c| c.max(at)));
    }
}

/// Whether `pid` is stopped by a signal, from /proc/PID/stat (a tracer's stop, 't', comes and
/// goes with every traced system call: `strace -f` must not look like a stopped watchdog). The
/// command name may hold spaces and parentheses, so the state is read after the last ')'.
pub fn is_stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    state == Some("T")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_secs(1000) + Duration::from_millis(ms))
    }

    /// Every moment it asks to be looked at, in order, as a loop that looks at each would.
    fn checks(mut o: Oversight) -> Vec<BootInstant> {
        let mut seen = Vec::new();
        while let Some(t) = o.next_check() {
            seen.push(t);
            o.checked(t);
        }
        seen
    }

    #[test]
    fn nothing_to_look_at_before_the_start_or_without_a_deadline() {
        let mut o = Oversight::default();
        assert_eq!(o.next_check(), None);
        o.started(Duration::from_millis(400), None);
        assert_eq!(o.next_check(), None);
    }

    #[test]
    fn looks_at_the_stop_time_and_at_d_of_the_latest_deadline() {
        let mut o = Oversight::default();
        o.started(Duration::from_millis(400), Some(at(2_000)));
        o.sent(ToWatchdog::Deadline(Some(at(2_700))), at(700));
        assert_eq!(checks(o), [at(2_300), at(2_700)]);
    }

    #[test]
    fn a_stop_is_looked_at_at_once_and_kill_after_later_and_freezes_the_deadline() {
        let mut o = Oversight::default();
        o.started(Duration::from_millis(400), Some(at(2_000)));
        o.checked(at(400));
        o.sent(ToWatchdog::Stop, at(500));
        o.sent(ToWatchdog::Deadline(Some(at(9_000))), at(600));
        o.sent(ToWatchdog::Forward(15), at(700));
        assert_eq!(checks(o), [at(500), at(900), at(1_600), at(2_000)]);
        let mut o = Oversight::default();
        o.started(Duration::from_millis(400), None);
        o.sent(ToWatchdog::Forward(15), at(500));
        assert_eq!(checks(o), [at(500), at(900)]);
    }

    #[test]
    fn sigkill_is_due_at_d_or_kill_after_a_stop_asked_for() {
        let mut o = Oversight::default();
        o.started(Duration::from_millis(400), Some(at(2_000)));
        assert!(!o.kill_due(at(1_999)));
        assert!(o.kill_due(at(2_000)));
        o.sent(ToWatchdog::Forward(2), at(100));
        o.sent(ToWatchdog::Forward(15), at(200));
        assert_eq!(o.forwarded(), Some(2));
        assert!(!o.kill_due(at(499)));
        assert!(o.kill_due(at(500)));
    }

    #[test]
    fn the_stop_time_is_kill_after_before_d() {
        let mut o = Oversight::default();
        assert!(!o.past_stop_time(at(5_000)));
        o.started(Duration::from_millis(400), Some(at(2_000)));
        assert!(!o.past_stop_time(at(1_599)));
        assert!(o.past_stop_time(at(1_600)));
    }

    #[test]
    fn a_moment_looked_at_is_not_looked_at_again() {
        let mut o = Oversight::default();
        o.started(Duration::from_millis(400), Some(at(2_000)));
        o.checked(at(1_600));
        assert_eq!(o.next_check(), Some(at(2_000)));
        o.checked(at(2_000));
        assert_eq!(o.next_check(), None);
    }

    #[test]
    fn this_process_is_not_stopped() {
        assert!(!is_stopped(std::process::id()));
        assert!(!is_stopped(u32::MAX));
    }
}
