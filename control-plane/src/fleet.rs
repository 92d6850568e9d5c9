//! Per-proxy, per-bucket rate estimation and the fleet-wide sum.
//!
//! Pure state machine: reports are added as they arrive and [`Fleet::tick`]
//! turns what arrived since the previous tick into rates. It never reads a
//! clock; time enters only through the windows the proxies report and the
//! number of ticks a proxy has been silent.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_proto::v1::Report;

/// Identifies one gRPC stream, so that a stale stream of a proxy that has
/// reconnected cannot touch the state of its replacement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// A rate pair in requests per second.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rates {
    /// Everything the proxy saw, dropped requests included.
    pub offered_rps: f64,
    /// What it let through.
    pub admitted_rps: f64,
}

/// One proxy as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProxyStatus {
    /// Proxy id from the Hello.
    pub proxy_id: String,
    /// Zone from the Hello; empty when the proxy named none.
    pub zone: String,
    /// Instance id from the latest Hello; changes when the proxy restarts.
    pub instance_id: u64,
    /// Whether a stream of the proxy is open.
    pub connected: bool,
    /// Time since the proxy's last report (since its Hello before the
    /// first one); serialized as `since_last_report_ms`.
    #[serde(rename = "since_last_report_ms", serialize_with = "millis")]
    pub since_last_report: Duration,
    /// Cells (bucket, tenant, priority) in the proxy's current rates.
    pub cells: usize,
}

fn millis<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// Fleet-wide load of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BucketLoad {
    /// Σ over proxies of their offered rate.
    pub offered_rps: f64,
    /// Σ over proxies of their admitted rate.
    pub admitted_rps: f64,
    /// Proxies whose offered rate for the bucket is non-zero.
    pub proxies_reporting: u32,
}

/// Fleet-wide load per bucket, sorted by bucket.
pub type FleetLoad = BTreeMap<String, BucketLoad>;

/// What [`Fleet::connect`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connected {
    /// A proxy id not seen before (or forgotten after expiry).
    New,
    /// The proxy was known; `previous` is the stream now superseded, if it
    /// was still open. Its rates are kept until the new stream reports.
    Replaced {
        /// The superseded stream.
        previous: Option<StreamId>,
    },
}

/// Why a report was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReportRejected {
    /// The stream no longer speaks for the proxy: a newer stream with the
    /// same proxy id replaced it.
    #[error("stream was replaced by a newer stream of the same proxy")]
    Superseded,
    /// `window_ms` is 0, so the counts cannot be turned into a rate.
    #[error("report has window_ms = 0")]
    EmptyWindow,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    offered: u64,
    admitted: u64,
}

#[derive(Debug)]
struct Proxy {
    /// The stream that owns this proxy id; `None` once it ended.
    stream: Option<StreamId>,
    instance_id: u64,
    /// Failure domain from the Hello.
    zone: String,
    /// When the proxy last reported (its Hello before the first report).
    /// Only the operator view reads it; decisions never look at a clock.
    last_report: Instant,
    /// Σ window_ms of the reports since the previous tick.
    window_ms: u64,
    /// Σ counts of the reports since the previous tick.
    counts: HashMap<String, Counts>,
    /// Rates as of the last tick that had reports.
    rates: HashMap<String, Rates>,
    /// Ticks since the last one that had reports.
    silent_ticks: u32,
}

/// All proxies, keyed by proxy id.
#[derive(Debug)]
pub struct Fleet {
    proxies: HashMap<String, Proxy>,
    carry_ticks: u32,
}

impl Fleet {
    /// How many control intervals a silent proxy's rates are carried.
    pub const DEFAULT_CARRY_TICKS: u32 = 3;

    /// An empty fleet; silent proxies keep their rates for `carry_ticks` ticks.
    pub fn new(carry_ticks: u32) -> Self {
        Self {
            proxies: HashMap::new(),
            carry_ticks,
        }
    }

    /// A stream said Hello for `proxy_id`. The newest stream always wins: an
    /// Envoy whose leader VM changed opens a new stream before the old one
    /// is torn down.
    pub fn connect(&mut self, proxy_id: &str, instance_id: u64, stream: StreamId) -> Connected {
        self.connect_in_zone(proxy_id, instance_id, "", stream)
    }

    /// [`Fleet::connect`] with the zone the Hello named.
    pub fn connect_in_zone(
        &mut self,
        proxy_id: &str,
        instance_id: u64,
        zone: &str,
        stream: StreamId,
    ) -> Connected {
        let now = Instant::now();
        match self.proxies.get_mut(proxy_id) {
            Some(proxy) => {
                let previous = proxy.stream.replace(stream);
                proxy.instance_id = instance_id;
                zone.clone_into(&mut proxy.zone);
                proxy.last_report = now;
                Connected::Replaced { previous }
            }
            None => {
                self.proxies.insert(
                    proxy_id.to_owned(),
                    Proxy {
                        stream: Some(stream),
                        instance_id,
                        zone: zone.to_owned(),
                        last_report: now,
                        window_ms: 0,
                        counts: HashMap::new(),
                        rates: HashMap::new(),
                        silent_ticks: 0,
                    },
                );
                Connected::New
            }
        }
    }

    /// Adds a report's counts to the proxy's current window.
    pub fn report(
        &mut self,
        proxy_id: &str,
        stream: StreamId,
        report: &Report,
    ) -> Result<(), ReportRejected> {
        let proxy = self
            .proxies
            .get_mut(proxy_id)
            .filter(|proxy| proxy.stream == Some(stream))
            .ok_or(ReportRejected::Superseded)?;
        if report.window_ms == 0 {
            return Err(ReportRejected::EmptyWindow);
        }
        proxy.window_ms = proxy.window_ms.saturating_add(report.window_ms);
        proxy.last_report = Instant::now();
        for bucket in &report.buckets {
            let counts = proxy.counts.entry(bucket.bucket.clone()).or_default();
            counts.offered = counts.offered.saturating_add(bucket.offered);
            counts.admitted = counts.admitted.saturating_add(bucket.admitted);
        }
        Ok(())
    }

    /// The stream ended. Only the owning stream can disconnect a proxy; its
    /// rates are carried like those of any silent proxy, so a quick
    /// reconnect does not make the fleet rate dip.
    pub fn disconnect(&mut self, proxy_id: &str, stream: StreamId) -> bool {
        match self.proxies.get_mut(proxy_id) {
            Some(proxy) if proxy.stream == Some(stream) => {
                proxy.stream = None;
                true
            }
            _ => false,
        }
    }

    /// Instance id the proxy announced in its latest Hello.
    pub fn instance_id(&self, proxy_id: &str) -> Option<u64> {
        self.proxies.get(proxy_id).map(|proxy| proxy.instance_id)
    }

    /// Every tracked proxy, sorted by proxy id: connected ones and
    /// disconnected ones whose rates are still carried.
    pub fn proxies(&self) -> Vec<ProxyStatus> {
        let now = Instant::now();
        let mut proxies: Vec<ProxyStatus> = self
            .proxies
            .iter()
            .map(|(proxy_id, proxy)| ProxyStatus {
                proxy_id: proxy_id.clone(),
                zone: proxy.zone.clone(),
                instance_id: proxy.instance_id,
                connected: proxy.stream.is_some(),
                since_last_report: now.saturating_duration_since(proxy.last_report),
                cells: proxy.rates.len(),
            })
            .collect();
        proxies.sort_unstable_by(|a, b| a.proxy_id.cmp(&b.proxy_id));
        proxies
    }

    /// Number of proxies still tracked (connected, or disconnected but
    /// still carried).
    pub fn len(&self) -> usize {
        self.proxies.len()
    }

    /// Whether no proxy is tracked.
    pub fn is_empty(&self) -> bool {
        self.proxies.is_empty()
    }

    /// Closes the current window of every proxy and returns the fleet load.
    ///
    /// For each proxy, `rate_b = Σcounts_b / Σwindow` over the reports since
    /// the previous tick. A proxy without reports keeps its previous rates
    /// for `carry_ticks` ticks, then contributes nothing; a disconnected one
    /// is forgotten at that point.
    pub fn tick(&mut self) -> FleetLoad {
        let carry_ticks = self.carry_ticks;
        self.proxies.retain(|_, proxy| {
            proxy.close_window(carry_ticks);
            proxy.stream.is_some() || !proxy.rates.is_empty()
        });

        let mut load = FleetLoad::new();
        for proxy in self.proxies.values() {
            for (bucket, rates) in &proxy.rates {
                let entry = load.entry(bucket.clone()).or_default();
                entry.offered_rps += rates.offered_rps;
                entry.admitted_rps += rates.admitted_rps;
                if rates.offered_rps > 0.0 {
                    entry.proxies_reporting += 1;
                }
            }
        }
        load
    }
}

impl Proxy {
    fn close_window(&mut self, carry_ticks: u32) {
        if self.window_ms > 0 {
            let seconds = self.window_ms as f64 / 1000.0;
            // Buckets absent from every report of the window had no traffic:
            // reports list only buckets with offered > 0 (zero entries a
            // filter might still send are dropped here for the same reason).
            self.rates = self
                .counts
                .drain()
                .filter(|(_, counts)| counts.offered > 0)
                .map(|(bucket, counts)| {
                    let rates = Rates {
                        offered_rps: counts.offered as f64 / seconds,
                        admitted_rps: counts.admitted as f64 / seconds,
                    };
                    (bucket, rates)
                })
                .collect();
            self.window_ms = 0;
            self.silent_ticks = 0;
        } else {
            self.silent_ticks = self.silent_ticks.saturating_add(1);
            if self.silent_ticks > carry_ticks {
                self.rates.clear();
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use sluice_proto::v1::BucketCount;

    use super::*;

    fn report(window_ms: u64, buckets: &[(&str, u64, u64)]) -> Report {
        Report {
            sequence: 0,
            window_ms,
            buckets: buckets
                .iter()
                .map(|&(bucket, offered, admitted)| BucketCount {
                    bucket: bucket.to_owned(),
                    offered,
                    admitted,
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn offered(load: &FleetLoad, bucket: &str) -> f64 {
        load.get(bucket).map_or(0.0, |b| b.offered_rps)
    }

    #[test]
    fn rate_is_counts_over_summed_windows() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        // 150 + 50 requests over 250 + 250 ms = 400 rps; uneven windows are
        // weighted by their length, not averaged per report.
        fleet
            .report("a", StreamId(1), &report(250, &[("acme", 150, 100)]))
            .unwrap();
        fleet
            .report("a", StreamId(1), &report(250, &[("acme", 50, 50)]))
            .unwrap();
        let load = fleet.tick();
        let acme = load["acme"];
        assert_eq!(acme.offered_rps, 400.0);
        assert_eq!(acme.admitted_rps, 300.0);
        assert_eq!(acme.proxies_reporting, 1);
    }

    #[test]
    fn proxies_are_summed() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        fleet.connect("b", 2, StreamId(2));
        fleet
            .report("a", StreamId(1), &report(500, &[("acme", 225, 225)]))
            .unwrap();
        fleet
            .report(
                "b",
                StreamId(2),
                &report(250, &[("acme", 37, 37), ("x", 1, 1)]),
            )
            .unwrap();
        let load = fleet.tick();
        assert_eq!(offered(&load, "acme"), 450.0 + 148.0);
        assert_eq!(load["acme"].proxies_reporting, 2);
        assert_eq!(load["x"].proxies_reporting, 1);
    }

    #[test]
    fn silent_proxy_is_carried_then_expires() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
        for _ in 0..3 {
            assert_eq!(offered(&fleet.tick(), "acme"), 100.0, "carried");
        }
        let load = fleet.tick();
        assert!(
            load.is_empty(),
            "expired after three silent ticks: {load:?}"
        );
        assert_eq!(fleet.len(), 1, "still connected, so still known");

        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 5, 5)]))
            .unwrap();
        assert_eq!(offered(&fleet.tick(), "acme"), 50.0, "fresh again");
    }

    #[test]
    fn an_empty_report_means_zero_traffic() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        fleet.tick();
        fleet.report("a", StreamId(1), &report(100, &[])).unwrap();
        assert!(fleet.tick().is_empty());
    }

    #[test]
    fn bucket_missing_from_a_fresh_window_drops_to_zero() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        fleet
            .report(
                "a",
                StreamId(1),
                &report(100, &[("acme", 10, 10), ("x", 1, 1)]),
            )
            .unwrap();
        fleet.tick();
        fleet
            .report("a", StreamId(1), &report(100, &[("x", 2, 2)]))
            .unwrap();
        let load = fleet.tick();
        assert!(!load.contains_key("acme"));
        assert_eq!(offered(&load, "x"), 20.0);
    }

    #[test]
    fn newer_stream_replaces_older_one() {
        let mut fleet = Fleet::new(3);
        assert_eq!(fleet.connect("a", 1, StreamId(1)), Connected::New);
        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        fleet.tick();
        assert_eq!(
            fleet.connect("a", 2, StreamId(2)),
            Connected::Replaced {
                previous: Some(StreamId(1))
            }
        );
        assert_eq!(fleet.instance_id("a"), Some(2));
        assert_eq!(
            fleet.report("a", StreamId(1), &report(100, &[("acme", 99, 99)])),
            Err(ReportRejected::Superseded)
        );
        assert!(
            !fleet.disconnect("a", StreamId(1)),
            "old stream cannot unregister the new one"
        );
        // Rates carry over the replacement until the new stream reports.
        assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
        fleet
            .report("a", StreamId(2), &report(100, &[("acme", 20, 20)]))
            .unwrap();
        assert_eq!(offered(&fleet.tick(), "acme"), 200.0, "not double counted");
    }

    #[test]
    fn disconnected_proxy_is_carried_then_forgotten() {
        let mut fleet = Fleet::new(2);
        fleet.connect("a", 1, StreamId(1));
        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        assert!(fleet.disconnect("a", StreamId(1)));
        assert_eq!(
            offered(&fleet.tick(), "acme"),
            100.0,
            "window before disconnect counts"
        );
        assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
        assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
        assert!(fleet.tick().is_empty());
        assert!(fleet.is_empty());
    }

    #[test]
    fn zero_window_and_unknown_proxy_are_rejected() {
        let mut fleet = Fleet::new(3);
        assert_eq!(
            fleet.report("a", StreamId(1), &report(100, &[])),
            Err(ReportRejected::Superseded)
        );
        fleet.connect("a", 1, StreamId(1));
        assert_eq!(
            fleet.report("a", StreamId(1), &report(0, &[("acme", 1, 1)])),
            Err(ReportRejected::EmptyWindow)
        );
        assert!(fleet.tick().is_empty());
    }

    #[test]
    fn proxies_view_shows_zone_instance_and_connection() {
        let mut fleet = Fleet::new(3);
        fleet.connect_in_zone("b", 2, "eu-1", StreamId(2));
        fleet.connect("a", 1, StreamId(1));
        fleet
            .report("b", StreamId(2), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        fleet.tick();
        fleet.disconnect("a", StreamId(1));
        let proxies = fleet.proxies();
        let ids: Vec<&str> = proxies.iter().map(|p| p.proxy_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"], "sorted by proxy id");
        assert!(!proxies[0].connected);
        assert_eq!(proxies[1].zone, "eu-1");
        assert_eq!(proxies[1].instance_id, 2);
        assert!(proxies[1].connected);
        assert_eq!(proxies[1].cells, 1);
        assert!(proxies[1].since_last_report < Duration::from_secs(5));
        let json = serde_json::to_value(&proxies[1]).unwrap();
        assert!(json["since_last_report_ms"].is_u64(), "{json}");
    }

    #[test]
    fn proxies_reporting_counts_only_non_zero_rates() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        fleet.connect("b", 2, StreamId(2));
        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        // A filter should not list zero buckets, but tolerate it.
        fleet
            .report("b", StreamId(2), &report(100, &[("acme", 0, 0)]))
            .unwrap();
        assert_eq!(fleet.tick()["acme"].proxies_reporting, 1);
    }
}
