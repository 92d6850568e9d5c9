//! Per-proxy series: connected proxies, the age of their last report and of
//! the directives they enforce, computed at scrape time.
//!
//! One series per proxy id (a second live instance of an id has none of
//! its own), and at most [`MAX_PROXY_SERIES`] of them, in proxy id order:
//! like the bucket and tenant series, their number does not follow what
//! clients invent.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Unit;

use super::labels::ProxyLabels;
use crate::fleet::StreamId;

/// Most proxy ids with per-proxy series; `proxy_series_omitted` says how
/// many more are connected.
pub(crate) const MAX_PROXY_SERIES: usize = 1_000;

/// Keeps a connected proxy's series alive; see [`super::ControlPlaneMetrics::proxy_connected`].
#[derive(Debug)]
pub struct ProxyGuard {
    proxies: Arc<Proxies>,
    proxy_id: String,
    stream: StreamId,
    last_report: Arc<AtomicU64>,
    directive_age_ms: Arc<AtomicU64>,
    reports_clamped: Arc<AtomicU64>,
}

impl ProxyGuard {
    /// One of the proxy's reports was clamped to what is plausible.
    pub(crate) fn report_clamped(&self) {
        self.reports_clamped.fetch_add(1, Ordering::Relaxed);
    }

    /// The proxy reported just now, with the age of the directives it
    /// enforces (`None`: it holds none, or predates the field).
    pub fn report_received(&self, directive_age_ms: Option<u64>) {
        self.last_report
            .store(self.proxies.now_ms(), Ordering::Relaxed);
        self.directive_age_ms.store(
            directive_age_ms.map_or(NO_DIRECTIVE_AGE, |age| age.min(NO_DIRECTIVE_AGE - 1)),
            Ordering::Relaxed,
        );
    }
}

impl Drop for ProxyGuard {
    fn drop(&mut self) {
        self.proxies.connected.dec();
        let mut connections = self.proxies.lock();
        // A newer stream of the same proxy owns the entry now; leave it.
        if connections
            .get(&self.proxy_id)
            .is_some_and(|c| c.stream == self.stream)
        {
            connections.remove(&self.proxy_id);
        }
    }
}

/// Connected proxies; a collector so that report ages are computed at
/// scrape time instead of being refreshed on a timer.
#[derive(Debug)]
pub(super) struct Proxies {
    /// Report times are milliseconds since this instant, so they fit an
    /// atomic.
    origin: Instant,
    connections: Mutex<BTreeMap<String, Connection>>,
    /// Open proxy streams.
    pub(super) connected: Gauge,
}

#[derive(Debug)]
struct Connection {
    stream: StreamId,
    last_report: Arc<AtomicU64>,
    /// Directive age in the proxy's last report; [`NO_DIRECTIVE_AGE`] when
    /// it named none.
    directive_age_ms: Arc<AtomicU64>,
    /// Reports of this stream clamped to what is plausible.
    reports_clamped: Arc<AtomicU64>,
    /// (proxy, bucket) claims of this stream the fleet's share cap cut.
    claims_cut: AtomicU64,
}

/// A [`Connection`]'s directive age before a report names one.
const NO_DIRECTIVE_AGE: u64 = u64::MAX;

impl Default for Proxies {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            connections: Mutex::default(),
            connected: Gauge::default(),
        }
    }
}

impl Proxies {
    /// Counts the stream as connected and, when `owns_series` or no live
    /// stream holds the proxy id's series, gives it the series (replacing
    /// a superseded stream's); the guard removes them when dropped.
    pub(super) fn connect(
        proxies: &Arc<Self>,
        proxy_id: &str,
        stream: StreamId,
        owns_series: bool,
    ) -> ProxyGuard {
        let last_report = Arc::new(AtomicU64::new(proxies.now_ms()));
        let directive_age_ms = Arc::new(AtomicU64::new(NO_DIRECTIVE_AGE));
        let reports_clamped = Arc::new(AtomicU64::new(0));
        proxies.connected.inc();
        let mut connections = proxies.lock();
        if owns_series || !connections.contains_key(proxy_id) {
            connections.insert(
                proxy_id.to_owned(),
                Connection {
                    stream,
                    last_report: Arc::clone(&last_report),
                    directive_age_ms: Arc::clone(&directive_age_ms),
                    reports_clamped: Arc::clone(&reports_clamped),
                    claims_cut: AtomicU64::new(0),
                },
            );
        }
        drop(connections);
        ProxyGuard {
            proxies: Arc::clone(proxies),
            proxy_id: proxy_id.to_owned(),
            stream,
            last_report,
            directive_age_ms,
            reports_clamped,
        }
    }

    /// A claim of `proxy_id` was cut by a bucket's share cap.
    pub(super) fn claim_cut(&self, proxy_id: &str) {
        if let Some(connection) = self.lock().get(proxy_id) {
            connection.claims_cut.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Connection>> {
        // Nothing panics while holding the lock, and the map is consistent
        // after every operation.
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Collector for Proxies {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let now = self.now_ms();
        let mut report_ages: Vec<(ProxyLabels, f64)> = Vec::new();
        let mut directive_ages: Vec<(ProxyLabels, f64)> = Vec::new();
        let mut clamped: Vec<(ProxyLabels, u64)> = Vec::new();
        let mut cut: Vec<(ProxyLabels, u64)> = Vec::new();
        let connections = self.lock();
        let omitted = connections.len().saturating_sub(MAX_PROXY_SERIES);
        for (proxy, connection) in connections.iter().take(MAX_PROXY_SERIES) {
            let labels = ProxyLabels {
                proxy: proxy.clone(),
            };
            clamped.push((
                labels.clone(),
                connection.reports_clamped.load(Ordering::Relaxed),
            ));
            cut.push((
                labels.clone(),
                connection.claims_cut.load(Ordering::Relaxed),
            ));
            let directive_age_ms = connection.directive_age_ms.load(Ordering::Relaxed);
            if directive_age_ms != NO_DIRECTIVE_AGE {
                directive_ages.push((labels.clone(), directive_age_ms as f64 / 1000.0));
            }
            let last = connection.last_report.load(Ordering::Relaxed);
            report_ages.push((labels, now.saturating_sub(last) as f64 / 1000.0));
        }
        drop(connections);
        let omitted_family = encoder.encode_descriptor(
            "proxy_series_omitted",
            "Proxy ids connected without per-proxy series, beyond the series cap (the first in proxy id order have them)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::try_from(omitted).unwrap_or(i64::MAX)).encode(omitted_family)?;
        // Registered metrics get the final period from the registry; a
        // collector writes its help verbatim.
        encode_proxy_gauges(
            &mut encoder,
            "proxy_report_age",
            "Time since a connected proxy's last report, or its Hello before the first one.",
            &report_ages,
        )?;
        encode_proxy_gauges(
            &mut encoder,
            "proxy_directive_age",
            "Age of the directives a connected proxy enforces, on its own clock, as of its last report; no series while it holds none.",
            &directive_ages,
        )?;
        encode_proxy_counters(
            &mut encoder,
            "proxy_reports_clamped",
            "Reports of a connected proxy's current stream cut to what is plausible (window or rate ceilings).",
            &clamped,
        )?;
        encode_proxy_counters(
            &mut encoder,
            "proxy_claims_cut",
            "Bucket claims of a connected proxy's current stream that counted less than reported in the fleet sum (share cap).",
            &cut,
        )
    }
}

/// One per-proxy gauge family in seconds. Like an empty Family: no
/// proxies, no descriptor.
pub(super) fn encode_proxy_gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(ProxyLabels, f64)],
) -> Result<(), fmt::Error> {
    if values.is_empty() {
        return Ok(());
    }
    let mut family =
        encoder.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Gauge)?;
    for (labels, value) in values {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// One per-proxy counter family; no proxies, no descriptor.
fn encode_proxy_counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(ProxyLabels, u64)],
) -> Result<(), fmt::Error> {
    if values.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in values {
        ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}
