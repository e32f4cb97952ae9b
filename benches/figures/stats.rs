//! The statistics of the benchmark report: median, percentiles, ratios, and how a sample is
//! written down (median, then p10–p90 and min–max, then n).
//!
//! Pure functions of numbers: no clock, no I/O, so `cargo test` checks them (the integration test
//! binary compiles this file too, since a `harness = false` bench has no test runner).

/// Linear interpolation between the two nearest ranks, as numpy's default and Python's
/// `statistics.quantiles(method="inclusive")`: p0 is the minimum, p100 the maximum.
/// None for an empty sample or a NaN in it.
pub fn percentile(sample: &[f64], p: f64) -> Option<f64> {
    if sample.is_empty() || sample.iter().any(|x| x.is_nan()) {
        return None;
    }
    let mut sorted = sample.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (sorted.len() - 1) as f64 * p.clamp(0.0, 100.0) / 100.0;
    let lo = rank.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// The middle value; the mean of the two middle values for an even count.
pub fn median(sample: &[f64]) -> Option<f64> {
    percentile(sample, 50.0)
}

/// `a / b`, None when either is missing or `b` is not a positive number.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() => Some(a / b),
        _ => None,
    }
}

/// A sample reduced to what the report shows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// None for an empty sample.
    pub fn of(sample: &[f64]) -> Option<Summary> {
        let at = |p| percentile(sample, p);
        Some(Summary {
            n: sample.len(),
            median: at(50.0)?,
            p10: at(10.0)?,
            p90: at(90.0)?,
            p99: at(99.0)?,
            min: at(0.0)?,
            max: at(100.0)?,
        })
    }
}

/// `1.94 ms (p10–p90 1.53–2.67, min–max 1.20–4.03, n=40)`; `—` for an empty sample.
pub fn dist(sample: &[f64], unit: &str, digits: usize) -> String {
    let Some(s) = Summary::of(sample) else {
        return "—".into();
    };
    let f = |x: f64| format!("{x:.digits$}");
    format!(
        "{} {unit} (p10–p90 {}–{}, min–max {}–{}, n={})",
        f(s.median),
        f(s.p10),
        f(s.p90),
        f(s.min),
        f(s.max),
        s.n
    )
}

/// A ratio with two decimals, `—` when there is none.
pub fn show_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "—".into(), |r| format!("{r:.2}"))
}

#[cfg(test)]
mod tests {
    // A `harness = false` bench compiles this module too (with --cfg test), without its #[test]
    // functions: what only they use is unused there.
    #![allow(unused_imports, dead_code)]

    use super::*;

    #[test]
    fn median_of_an_odd_count_is_the_middle_value() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    }

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn statistics_of_an_empty_sample_are_none() {
        assert_eq!(median(&[]), None);
        assert_eq!(percentile(&[], 90.0), None);
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(dist(&[], "ms", 2), "—");
    }

    #[test]
    fn a_nan_in_the_sample_gives_no_statistic() {
        assert_eq!(median(&[1.0, f64::NAN, 3.0]), None);
    }

    #[test]
    fn percentiles_interpolate_between_neighbouring_ranks() {
        let sample: Vec<f64> = (1..=11).map(f64::from).collect();
        assert_eq!(percentile(&sample, 10.0), Some(2.0));
        assert_eq!(percentile(&sample, 90.0), Some(10.0));
        // rank 0.99 * 10 = 9.9: between the 10th (10) and 11th (11) value
        let p99 = percentile(&sample, 99.0).unwrap();
        assert!((p99 - 10.9).abs() < 1e-9, "{p99}");
        assert_eq!(percentile(&[1.0, 2.0], 25.0), Some(1.25));
    }

    #[test]
    fn p0_and_p100_are_the_extremes_and_a_single_value_is_every_percentile() {
        let sample = [5.0, -1.0, 7.0];
        assert_eq!(percentile(&sample, 0.0), Some(-1.0));
        assert_eq!(percentile(&sample, 100.0), Some(7.0));
        assert_eq!(percentile(&[4.2], 37.0), Some(4.2));
    }

    #[test]
    fn percentiles_do_not_depend_on_the_order_of_the_sample() {
        let a = [9.0, 1.0, 5.0, 3.0, 7.0];
        let mut b = a;
        b.sort_by(f64::total_cmp);
        assert_eq!(percentile(&a, 30.0), percentile(&b, 30.0));
    }

    #[test]
    fn ratio_needs_both_values_and_a_positive_denominator() {
        assert_eq!(ratio(Some(1.0), Some(4.0)), Some(0.25));
        assert_eq!(ratio(None, Some(4.0)), None);
        assert_eq!(ratio(Some(1.0), None), None);
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(Some(1.0), Some(-2.0)), None);
        assert_eq!(show_ratio(Some(0.354)), "0.35");
        assert_eq!(show_ratio(None), "—");
    }

    #[test]
    fn a_summary_reads_median_then_ranges_then_count() {
        let sample = [1.0, 2.0, 3.0, 4.0, 5.0];
        let s = Summary::of(&sample).unwrap();
        assert_eq!((s.n, s.median, s.min, s.max), (5, 3.0, 1.0, 5.0));
        assert_eq!(
            dist(&sample, "ms", 2),
            "3.00 ms (p10–p90 1.40–4.60, min–max 1.00–5.00, n=5)"
        );
    }
}
