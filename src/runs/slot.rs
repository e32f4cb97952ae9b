//! `--once-per DUR`: the KEY of a scheduled run is the slot boundary nearest to the wall-clock
//! start, counted in UTC from the Unix epoch (so `1d` slots begin at 00:00 UTC) and written in
//! RFC 3339. Hosts whose clocks or cron wake-ups differ by less than DUR/2 from the boundary
//! agree on the key; a job started near the half-way point between two boundaries can land on
//! either side. Pure: the caller passes the time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The shortest --once-per: a slot has whole seconds at least.
pub const MIN_PERIOD: Duration = Duration::from_secs(1);

/// The slot key for a run starting at `now`: the nearest multiple of `per` since the epoch,
/// half-way rounding to the later one. `per` must be at least [`MIN_PERIOD`].
pub fn slot_key(now: SystemTime, per: Duration) -> String {
    let now_ms = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let per_ms = per.as_millis().max(1);
    let slot_ms = (now_ms + per_ms / 2) / per_ms * per_ms;
    let at = UNIX_EPOCH + Duration::from_millis(slot_ms as u64);
    if slot_ms % 1000 == 0 {
        humantime::format_rfc3339_seconds(at).to_string()
    } else {
        humantime::format_rfc3339_millis(at).to_string()
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
    fn periods_under_a_second_are_refused() {
        assert!(check_period(Duration::ZERO).is_err());
        assert!(check_period(Duration::from_millis(999)).is_err());
        assert!(check_period(MIN_PERIOD).is_ok());
    }
}
