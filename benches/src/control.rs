//! Fixtures for the controller benchmarks: reports as a fleet of proxies
//! sends them, and fleet loads as the control loop hands them on.

use sluice_control_plane::config::limits::LimitTable;
use sluice_control_plane::fleet::{BucketLoad, BucketTraffic, Fleet, FleetLoad, StreamId};
use sluice_control_plane::types::LimitRps;
use sluice_proto::v1::{BucketCount, Report};

/// Proxy ids `proxy-0` … `proxy-{n-1}`.
pub fn proxy_ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("proxy-{i}")).collect()
}

/// A 250 ms report with `offered` requests for every bucket, a tenth dropped.
pub fn report(buckets: &[String], offered: u64) -> Report {
    Report {
        sequence: 1,
        window_ms: 250,
        directive_age_ms: None,
        upstream: Vec::new(),
        buckets: buckets
            .iter()
            .map(|bucket| BucketCount {
                bucket: bucket.clone(),
                offered,
                admitted: offered - offered / 10,
                ..Default::default()
            })
            .collect(),
    }
}

/// A fleet where every proxy in `proxies` is connected; proxy `i` on stream `i`.
pub fn connected_fleet(proxies: &[String]) -> Fleet {
    let mut fleet = Fleet::new(Fleet::DEFAULT_CARRY_TICKS);
    for (i, proxy) in proxies.iter().enumerate() {
        fleet.connect(proxy, 1, StreamId(i as u64));
    }
    fleet
}

/// A fleet load where bucket `i` offers `i % 400` requests/s (never 0), so
/// against [`limits`] some buckets are limited and most are not.
pub fn fleet_load(buckets: &[String]) -> FleetLoad {
    FleetLoad::new(
        buckets
            .iter()
            .enumerate()
            .map(|(i, bucket)| {
                let offered_rps = (i % 400 + 1) as f64;
                let load = BucketLoad {
                    offered_rps,
                    admitted_rps: offered_rps,
                    proxies_reporting: 3,
                    stale_share: 0.0,
                    requests_rps: 0.0,
                };
                BucketTraffic::single(bucket, load)
            })
            .collect(),
    )
}

/// A default limit of 200 requests/s for every bucket.
pub fn limits() -> LimitTable {
    LimitTable::new(LimitRps::new(200.0).ok())
}
