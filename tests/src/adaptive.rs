//! The overload scenario of the adaptive-limit tests: three Envoys carrying
//! 60/30/10 of the load in front of one [`CappedUpstream`](crate::capped_upstream::CappedUpstream), offered about
//! 3x its capacity, mostly BULK and a little CRITICAL (the `x-tenant`
//! header names the class).

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;

use crate::capped_upstream::Capacity;
use crate::fleet::FleetOptions;
use crate::load::{Counts, LoadResult, Outcome, StreamSpec, Window};

/// Each Envoy's part of the load.
pub const SKEW: [f64; 3] = [0.6, 0.3, 0.1];
/// The fleet's BULK load, requests per second (about 3x 150).
pub const BULK_RPS: f64 = 420.0;
/// The fleet's CRITICAL load, below the adaptive limit's floor.
pub const CRITICAL_RPS: f64 = 15.0;

/// The bucket's limit: adaptive on latency (the fleet's sampled p99 over
/// 100 ms lowers it, a healthy signal under demand raises it), with a floor
/// (40 rps) above the CRITICAL traffic.
pub const LIMITS: &str = r#"
limits:
  - bucket: "api"
    limit_rps: 1000
adaptive:
  - bucket: "api"
    signal: latency
    target_p99_ms: 100
    min_rps: 40
    max_rps: 1000
    algorithm: aimd
    increase_rps: 10
    decrease_factor: 0.8
"#;

/// Three Envoys with the Sluice filter in front of `upstream`, one worker
/// each: every request in bucket `api`, its class from `x-tenant`, every
/// response observed.
pub fn fleet_options(upstream: SocketAddr) -> FleetOptions {
    let mut options = FleetOptions::new(LIMITS, SKEW.len());
    options.upstream = Some(upstream);
    options.concurrency = 1;
    options.filter = json!({
        "bucket_key": [{"source": "literal", "value": "api"}],
        "priority": {"header": "x-tenant"},
        "upstream_sample_every": 1,
    });
    options
}

/// A capacity of `rps` with a queue of 0.2 s: latency climbs to about 200 ms
/// when overloaded, then the excess gets 503s.
pub fn capacity(rps: f64) -> Capacity {
    Capacity {
        rps,
        queue: (rps * 0.2) as u32,
        base_latency: Duration::from_millis(5),
    }
}

/// The BULK and CRITICAL streams of each Envoy (`urls` in [`SKEW`] order).
pub fn skewed_streams(urls: &[String]) -> Vec<StreamSpec> {
    let mut streams = Vec::new();
    for (envoy, (url, share)) in urls.iter().zip(SKEW).enumerate() {
        streams.push(StreamSpec::new(
            &format!("{envoy}/bulk"),
            url,
            "bulk",
            BULK_RPS * share,
        ));
        streams.push(StreamSpec::new(
            &format!("{envoy}/critical"),
            url,
            "critical",
            CRITICAL_RPS * share,
        ));
    }
    streams
}

/// Requests that got past the proxies' own shedding and were answered by
/// the upstream (its 503s included). Only for a proxy that sheds with 429s.
pub fn passed(counts: Counts) -> u64 {
    counts.ok + counts.server_errors
}

/// The latency of the `quantile` (0–1) of the requests sent in `window`
/// and answered 200, in milliseconds; `None` if there were none.
pub fn ok_latency_ms(result: &LoadResult, window: Window, quantile: f64) -> Option<f64> {
    let mut latencies: Vec<Duration> = result
        .samples
        .iter()
        .filter(|s| s.outcome == Outcome::Ok && window.contains(s.sent_at))
        .map(|s| s.done_at.saturating_sub(s.sent_at))
        .collect();
    if latencies.is_empty() {
        return None;
    }
    latencies.sort_unstable();
    let rank =
        (latencies.len().saturating_sub(1) as f64 * quantile.clamp(0.0, 1.0)).round() as usize;
    latencies.get(rank).map(|d| d.as_secs_f64() * 1000.0)
}
