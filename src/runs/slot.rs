//! `--once-per DUR`: the KEY of a scheduled run is the slot boundary nearest to the wall-clock
//! start, counted in UTC from the Unix epoch (so `1d` slots begin at 00:00 UTC) and written in
//! RFC 3339. Hosts whose clocks or cron wake-ups differ by less than DUR/2 from the boundary
//! agree on the key; a job started near the half-way point between two boundaries can land on
//! either side. A run well ahead of its slot (by more than DUR/20) is told so, since it uses up
//! the slot of a scheduled run yet to come. Pure: the caller passes the time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The shortest --once-per: a slot has whole seconds at least.
pub const MIN_PERIOD: Duration = Duration::from_secs(1);

/// The slot key for a run starting at `now`: the nearest multiple of `per` since the epoch,
/// half-way rounding to the later one. `per` must be at least [`MIN_PERIOD`].
pub fn slot_key(now: SystemTime, per: Duration) -> String {
    let at = slot_start(now, per);
    let whole_seconds = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_millis()
        == 0;
    if whole_seconds {
        humantime::format_rfc3339_seconds(at).to_string()
    } else {
        humantime::format_rfc3339_millis(at).to_string()
    }
}

/// The boundary that [`slot_key`] names.
fn slot_start(now: SystemTime, per: Duration) -> SystemTime {
    let now_ms = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let per_ms = per.as_millis().max(1);
    let slot_ms = (now_ms + per_ms / 2) / per_ms * per_ms;
    UNIX_EPOCH + Duration::from_millis(slot_ms as u64)
}

/// How long before its slot a run starting at `now` is, when that is more than `per`/20 (72
/// minutes for 1d): such a run is most likely one by hand, and uses up the slot of a scheduled
/// run yet to come. A scheduled run, woken a little early or late, is within the tolerance.
pub fn ahead(now: SystemTime, per: Duration) -> Option<Duration> {
    let early = slot_start(now, per).duration_since(now).ok()?;
    (early > per / 20).then_some(early)
}

/// A time to go, as in the --once-per warning: `4h21m`, `1d2h`, `24m10s`; rounded to the
/// minute from an hour on, else to the second.
pub fn starts_in(d: Duration) -> String {
    let unit: u128 = if d >= Duration::from_secs(3600) {
        60
    } else {
        1
    };
    let secs = ((d.as_millis() + unit * 500) / (unit * 1000) * unit) as u64;
    let units = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    let text: String = units
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if text.is_empty() {
        "0s".to_owned()
    } else {
        text
    }
}

/// Why `per` cannot be a --once-per period, if it cannot.
pub fn check_period(per: Duration) -> Result<(), String> {
    if per < MIN_PERIOD {
        return Err(format!(
            "--once-per {per:?} is too short: a slot must be at least 1s"
        ));
    }
    if per > super::MAX_KEEP {
        return Err(format!(
            "--once-per {} is too long: a slot's record is kept for the whole slot, and records are kept for {} at most",
            humantime::format_duration(per),
            humantime::format_duration(super::MAX_KEEP)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).unwrap()
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn the_key_is_the_nearest_boundary_in_utc() {
        assert_eq!(
            slot_key(at("2026-12-01T02:00:00Z"), HOUR),
            "2026-12-01T02:00:00Z"
        );
        assert_eq!(
            slot_key(at("2026-12-01T01:59:58Z"), HOUR),
            "2026-12-01T02:00:00Z"
        );
        assert_eq!(
            slot_key(at("2026-12-01T02:00:03Z"), HOUR),
            "2026-12-01T02:00:00Z"
        );
        let day = HOUR * 24;
        assert_eq!(
            slot_key(at("2026-12-01T02:00:00Z"), day),
            "2026-12-01T00:00:00Z"
        );
        assert_eq!(
            slot_key(at("2026-11-30T23:10:00Z"), day),
            "2026-12-01T00:00:00Z"
        );
    }

    #[test]
    fn clocks_a_quarter_period_apart_agree_and_sixty_percent_apart_do_not() {
        let boundary = at("2026-12-01T02:00:00Z");
        for per in [Duration::from_secs(60), HOUR, HOUR * 24] {
            let want = slot_key(boundary, per);
            assert_eq!(slot_key(boundary + per / 4, per), want);
            assert_eq!(slot_key(boundary - per / 4, per), want);
            assert_ne!(slot_key(boundary + per * 6 / 10, per), want);
            assert_ne!(slot_key(boundary - per * 6 / 10, per), want);
        }
    }

    #[test]
    fn half_way_rounds_to_the_later_boundary() {
        assert_eq!(
            slot_key(at("2026-12-01T02:30:00Z"), HOUR),
            "2026-12-01T03:00:00Z"
        );
        assert_eq!(
            slot_key(at("2026-12-01T02:29:59.999Z"), HOUR),
            "2026-12-01T02:00:00Z"
        );
    }

    #[test]
    fn fractional_periods_give_millisecond_keys() {
        let per = Duration::from_millis(1500);
        assert_eq!(slot_key(UNIX_EPOCH + per, per), "1970-01-01T00:00:01.500Z");
    }

    #[test]
    fn a_run_ahead_of_its_slot_by_more_than_a_twentieth_of_the_period_is_told_how_far() {
        let day = HOUR * 24;
        // By hand at 19:39 UTC: counts for tomorrow's 00:00 slot, 4h21m away.
        let by_hand = at("2026-12-01T19:39:00Z");
        assert_eq!(slot_key(by_hand, day), "2026-12-02T00:00:00Z");
        assert_eq!(
            ahead(by_hand, day),
            Some(HOUR * 4 + Duration::from_secs(21 * 60))
        );
        assert_eq!(starts_in(ahead(by_hand, day).unwrap()), "4h21m");
        // DUR/20 of 1d is 72 minutes: 23:00 is within it, 22:47 is not.
        assert_eq!(ahead(at("2026-12-01T23:00:00Z"), day), None);
        assert_eq!(ahead(at("2026-12-01T22:48:00Z"), day), None);
        assert_eq!(
            ahead(at("2026-12-01T22:47:59Z"), day),
            Some(Duration::from_secs(72 * 60 + 1))
        );
        // A scheduled run after its boundary, however late, is never ahead of it.
        assert_eq!(ahead(at("2026-12-02T02:30:00Z"), day), None);
        assert_eq!(ahead(at("2026-12-02T11:59:59Z"), day), None);
        // With 1h slots the tolerance is 3 minutes.
        assert_eq!(ahead(at("2026-12-01T01:57:00Z"), HOUR), None);
        assert_eq!(
            ahead(at("2026-12-01T01:56:59Z"), HOUR),
            Some(Duration::from_secs(181))
        );
    }

    #[test]
    fn times_to_go_drop_seconds_from_an_hour_on() {
        let s = Duration::from_secs;
        assert_eq!(starts_in(s(0)), "0s");
        assert_eq!(starts_in(s(181)), "3m1s");
        assert_eq!(starts_in(s(24 * 60)), "24m");
        assert_eq!(starts_in(s(4 * 3600 + 21 * 60 + 29)), "4h21m");
        assert_eq!(
            starts_in(s(4 * 3600 + 21 * 60) - Duration::from_millis(2)),
            "4h21m"
        );
        assert_eq!(
            starts_in(s(59 * 60 + 59) + Duration::from_millis(600)),
            "1h"
        );
        assert_eq!(starts_in(s(3 * 86_400 + 7200)), "3d2h");
    }

    #[test]
    fn periods_under_a_second_are_refused() {
        assert!(check_period(Duration::ZERO).is_err());
        assert!(check_period(Duration::from_millis(999)).is_err());
        assert!(check_period(MIN_PERIOD).is_ok());
    }
}
