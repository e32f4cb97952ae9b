//! etcd's /metrics (Prometheus text format) as numbers: one sample per series, and the change of
//! the request counters between two scrapes, keyed as the report shows them.
//!
//! Pure text in, numbers out (no I/O), so `cargo test` checks it (the integration test binary
//! compiles this file too).

use std::collections::BTreeMap;

/// Every sample of one scrape: `name{labels}` exactly as etcd wrote it -> value.
#[derive(Clone, Debug, Default)]
pub struct Scrape(pub BTreeMap<String, f64>);

/// The counters a handover or a renewal costs: gRPC requests by method, and etcd's store work.
const COUNTERS: [(&str, Option<&str>); 7] = [
    ("grpc_server_started_total", Some("grpc_method")),
    ("grpc_server_msg_received_total", Some("grpc_method")),
    ("etcd_debugging_mvcc_range_total", None),
    ("etcd_debugging_mvcc_put_total", None),
    ("etcd_debugging_mvcc_delete_total", None),
    ("etcd_debugging_mvcc_txn_total", None),
    ("etcd_debugging_mvcc_events_total", None),
];

impl Scrape {
    /// Skips comments, blank lines and lines whose value is not a number.
    pub fn parse(text: &str) -> Scrape {
        let samples = text
            .lines()
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                Some((series.trim().to_owned(), value.parse().ok()?))
            })
            .collect();
        Scrape(samples)
    }

    /// A series without labels (a gauge such as `etcd_debugging_mvcc_watcher_total`); 0 if absent.
    pub fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }

    /// How much each request counter grew since `before`, keyed `msg_received[LeaseKeepAlive]`,
    /// `mvcc_range`, ...; counters that did not move are left out.
    pub fn counters_since(&self, before: &Scrape) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (series, after) in &self.0 {
            let Some(key) = counter_key(series) else {
                continue;
            };
            let delta = after - before.0.get(series).copied().unwrap_or(0.0);
            if delta != 0.0 {
                *out.entry(key).or_insert(0.0) += delta;
            }
        }
        out
    }
}

/// The report's key for a series of one of `COUNTERS`, None for any other series.
fn counter_key(series: &str) -> Option<String> {
    let name = series_name(series);
    let (_, label) = COUNTERS.iter().find(|(n, _)| *n == name)?;
    match label {
        Some(label) => {
            let short = name.trim_start_matches("grpc_server_");
            let short = short.trim_end_matches("_total");
            Some(format!("{short}[{}]", label_value(series, label)?))
        }
        None => {
            let short = name.trim_start_matches("etcd_debugging_");
            Some(short.trim_end_matches("_total").to_owned())
        }
    }
}

fn series_name(series: &str) -> &str {
    series.split('{').next().unwrap_or(series)
}

/// The value of `label` in `name{a="x",b="y"}`.
fn label_value<'a>(series: &'a str, label: &str) -> Option<&'a str> {
    let labels = series.split_once('{')?.1.strip_suffix('}')?;
    labels.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == label).then(|| v.trim().trim_matches('"'))
    })
}

#[cfg(test)]
mod tests {
    // A `harness = false` bench compiles this module too (with --cfg test), without its #[test]
    // functions: what only they use is unused there.
    #![allow(unused_imports, dead_code)]

    use super::*;

    const BEFORE: &str = r#"# HELP grpc_server_started_total Total number of RPCs started on the server.
# TYPE grpc_server_started_total counter
grpc_server_started_total{grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 10
grpc_server_msg_received_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"} 5
etcd_debugging_mvcc_range_total 100
etcd_debugging_mvcc_watcher_total 3
"#;

    const AFTER: &str = r#"grpc_server_started_total{grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 14
grpc_server_msg_received_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"} 9
grpc_server_msg_received_total{grpc_method="Txn",grpc_service="etcdserverpb.KV",grpc_type="unary"} 2
etcd_debugging_mvcc_range_total 104
etcd_debugging_mvcc_watcher_total 7
process_start_time_seconds 1.7e+09
"#;

    #[test]
    fn parse_reads_series_and_values_and_skips_comments() {
        let s = Scrape::parse(BEFORE);
        assert_eq!(s.0.len(), 4);
        assert_eq!(s.get("etcd_debugging_mvcc_watcher_total"), 3.0);
        assert_eq!(s.get("no_such_series"), 0.0);
        assert_eq!(
            Scrape::parse(AFTER).get("process_start_time_seconds"),
            1.7e9
        );
    }

    #[test]
    fn a_line_whose_value_is_not_a_number_is_skipped() {
        let s = Scrape::parse("good 1\nbad x\n\nlone\n");
        assert_eq!(s.0.len(), 1);
    }

    #[test]
    fn counters_since_keys_by_method_and_leaves_out_gauges_and_unmoved_counters() {
        let delta = Scrape::parse(AFTER).counters_since(&Scrape::parse(BEFORE));
        let expected: BTreeMap<String, f64> = [
            ("msg_received[LeaseKeepAlive]", 4.0),
            ("msg_received[Txn]", 2.0),
            ("mvcc_range", 4.0),
            ("started[Range]", 4.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(delta, expected);
    }

    #[test]
    fn label_value_finds_a_label_anywhere_in_the_set() {
        let series = r#"m{a="1",grpc_method="Put",b="2"}"#;
        assert_eq!(label_value(series, "grpc_method"), Some("Put"));
        assert_eq!(label_value(series, "c"), None);
        assert_eq!(label_value("m", "a"), None);
    }
}
