//! Prometheus metrics, served by `GET /metrics` in the OpenMetrics text
//! format.
//!
//! One [`Metrics`] per process, held by the `AppState`. The other modules
//! call its small typed API; none of them sees the registry. Everything a
//! per-report or per-push path touches is a plain atomic: counters, gauges,
//! label children resolved once at start-up, and [`AtomicHistogram`]
//! (prometheus-client's own histogram takes a mutex on every observation,
//! which all streams would share).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

use crate::controller::BucketStatus;
use crate::fleet::{FleetStats, ReportRejected, StreamId};

/// Most (bucket, tenant) series of the per-tenant gauges; tenants beyond
/// this many (in bucket order) have none, and
/// `tenant_series_omitted` says how many were left out.
pub const MAX_TENANT_SERIES: usize = 1_000;

/// The `Content-Type` of [`Metrics::encode`]'s output. Prometheus negotiates
/// OpenMetrics by default, and it is what prometheus-client's encoder writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric name starts with this.
const PREFIX: &str = "sluice";

/// Push latency buckets in seconds: a push normally takes well under a
/// millisecond; a stream whose proxy stalls can take up to its whole buffer,
/// and an overloaded control plane seconds.
const PUSH_LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Control loop tick buckets in seconds: microseconds for a handful of
/// buckets, milliseconds for tens of thousands; above the control interval
/// (500 ms by default) the loop falls behind, which these must show.
const TICK_BUCKETS: [f64; 18] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

type F64Gauge = Gauge<f64, AtomicU64>;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BucketLabels {
    bucket: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
struct TenantLabels {
    bucket: String,
    tenant: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ProxyLabels {
    proxy: String,
}

/// What a stream handed to its transport.
#[derive(Debug, Clone, Copy)]
pub enum Sent {
    /// A full snapshot (on connect, or to resynchronise a stream that fell
    /// behind); it was not decided by a control interval, so it has no
    /// latency to report.
    Snapshot,
    /// A delta the control loop published at `decided_at`.
    Delta {
        /// When the control loop published it.
        decided_at: Instant,
    },
}

/// The control plane's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    buckets: BucketMetrics,
    proxies: Arc<Proxies>,
    reports_received: Counter,
    rejected_superseded: Counter,
    rejected_empty_window: Counter,
    report_sequence_gaps: Counter,
    streams_rejected: Counter,
    batches_published: Counter,
    heartbeats_published: Counter,
    staleness: Arc<Staleness>,
    cells_tracked: Gauge,
    cells_rejected_key: Counter,
    cells_rejected_proxy_cap: Counter,
    cells_rejected_fleet_cap: Counter,
    cells_evicted_idle: Counter,
    sent_snapshots: Counter,
    sent_deltas: Counter,
    push_latency: AtomicHistogram,
    tick_duration: AtomicHistogram,
}

/// Per-bucket gauges and the set of buckets that currently have series.
#[derive(Debug, Default)]
struct BucketMetrics {
    offered: Family<BucketLabels, F64Gauge>,
    admitted: Family<BucketLabels, F64Gauge>,
    limit: Family<BucketLabels, F64Gauge>,
    drop_ratio: Family<BucketLabels, F64Gauge>,
    proxies_reporting: Family<BucketLabels, Gauge>,
    tracked: Gauge,
    tenant_admitted: Family<TenantLabels, F64Gauge>,
    tenant_share: Family<TenantLabels, F64Gauge>,
    tenant_omitted: Gauge,
    /// Buckets of the previous control interval. Only the control loop
    /// touches it, so the lock is never contended.
    previous: Mutex<BTreeSet<String>>,
    /// (bucket, tenant) series of the previous control interval.
    previous_tenants: Mutex<BTreeSet<TenantLabels>>,
}

impl Metrics {
    /// Metrics for a process with `epoch`, all at zero.
    pub fn new(epoch: u64) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        registry.register(
            "build",
            "Version of the running control plane",
            Info::new([("version", env!("CARGO_PKG_VERSION"))]),
        );
        // The epoch is a label, not a value: it is a random 64-bit id that a
        // float sample would round, and a change of it marks a restart.
        registry.register(
            "epoch",
            "Epoch this process stamps on every directive batch",
            Info::new([("epoch", epoch.to_string())]),
        );
        let start_time = ConstGauge::new(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        registry.register_with_unit(
            "start_time",
            "When this process started, in seconds since the Unix epoch",
            Unit::Seconds,
            start_time,
        );

        let buckets = BucketMetrics::default();
        registry.register(
            "bucket_offered_rps",
            "Fleet-wide offered rate of a bucket in requests per second",
            buckets.offered.clone(),
        );
        registry.register(
            "bucket_admitted_rps",
            "Fleet-wide admitted rate of a bucket in requests per second, as reported",
            buckets.admitted.clone(),
        );
        registry.register(
            "bucket_limit_rps",
            "Limit of a limited bucket in requests per second",
            buckets.limit.clone(),
        );
        registry.register(
            "bucket_drop_ratio",
            "Drop ratio pushed to proxies for a bucket",
            buckets.drop_ratio.clone(),
        );
        registry.register(
            "bucket_proxies_reporting",
            "Proxies with traffic for a bucket",
            buckets.proxies_reporting.clone(),
        );
        registry.register(
            "buckets_tracked",
            "Buckets with traffic as of the last control interval",
            buckets.tracked.clone(),
        );
        registry.register(
            "tenant_admitted_rps",
            "Fleet-wide admitted rate of a tenant in a limited bucket, as reported",
            buckets.tenant_admitted.clone(),
        );
        registry.register(
            "tenant_share_rps",
            "Share of a limited bucket's limit a tenant may use before it is dropped",
            buckets.tenant_share.clone(),
        );
        registry.register(
            "tenant_series_omitted",
            "Tenants of limited buckets without per-tenant series, beyond the series cap",
            buckets.tenant_omitted.clone(),
        );
        let cells_tracked = Gauge::default();
        registry.register(
            "cells_tracked",
            "Distinct (bucket, tenant, priority) cells tracked",
            cells_tracked.clone(),
        );
        let cells_rejected = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "cells_rejected",
            "Report entries not counted because of a cap, by reason (key_too_long, proxy_cap, fleet_cap)",
            cells_rejected.clone(),
        );
        let cells_evicted = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "cells_evicted",
            "Cells forgotten, by reason (idle: no proxy reports them any more)",
            cells_evicted.clone(),
        );

        let proxies = Arc::new(Proxies::default());
        registry.register(
            "connected_proxies",
            "Proxies with an open stream",
            proxies.connected.clone(),
        );
        registry.register_collector(Box::new(Arc::clone(&proxies)));

        let reports_received = Counter::default();
        registry.register(
            "reports_received",
            "Reports received from proxies, rejected ones included",
            reports_received.clone(),
        );
        let reports_rejected = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "reports_rejected",
            "Reports not counted, by reason",
            reports_rejected.clone(),
        );
        let report_sequence_gaps = Counter::default();
        registry.register(
            "report_sequence_gaps",
            "Reports whose sequence number did not follow the previous one on the stream",
            report_sequence_gaps.clone(),
        );
        let streams_rejected = Counter::default();
        registry.register(
            "streams_rejected",
            "Streams closed because they did not start with a valid Hello",
            streams_rejected.clone(),
        );

        let batches_published = Counter::default();
        registry.register(
            "directive_batches_published",
            "Directive deltas the control loop broadcast to all streams",
            batches_published.clone(),
        );
        let heartbeats_published = Counter::default();
        registry.register(
            "heartbeats_published",
            "Empty directive batches broadcast because nothing changed for the heartbeat interval",
            heartbeats_published.clone(),
        );
        let staleness = Arc::new(Staleness::default());
        registry.register_collector(Box::new(Arc::clone(&staleness)));
        let batches_pushed = Family::<KindLabels, Counter>::default();
        registry.register(
            "directive_batches_pushed",
            "Directive batches handed to a stream's transport, by kind (snapshot or delta)",
            batches_pushed.clone(),
        );
        let push_latency = AtomicHistogram::new(&PUSH_LATENCY_BUCKETS);
        registry.register_with_unit(
            "push_latency",
            "Time from the control loop publishing a delta to a stream handing it to its transport",
            Unit::Seconds,
            push_latency.clone(),
        );
        let tick_duration = AtomicHistogram::new(&TICK_BUCKETS);
        registry.register_with_unit(
            "control_loop_tick_duration",
            "Time one control interval's work took",
            Unit::Seconds,
            tick_duration.clone(),
        );

        // Label children are resolved once, so counting never looks up the
        // family (which takes its lock).
        let reason = |reason| reports_rejected.get_or_create_owned(&ReasonLabels { reason });
        let kind = |kind| batches_pushed.get_or_create_owned(&KindLabels { kind });
        let rejected = |reason| cells_rejected.get_or_create_owned(&ReasonLabels { reason });
        Self {
            cells_rejected_key: rejected("key_too_long"),
            cells_rejected_proxy_cap: rejected("proxy_cap"),
            cells_rejected_fleet_cap: rejected("fleet_cap"),
            cells_evicted_idle: cells_evicted.get_or_create_owned(&ReasonLabels { reason: "idle" }),
            cells_tracked,
            heartbeats_published,
            staleness,
            rejected_superseded: reason("superseded"),
            rejected_empty_window: reason("empty_window"),
            sent_snapshots: kind("snapshot"),
            sent_deltas: kind("delta"),
            registry,
            buckets,
            proxies,
            reports_received,
            report_sequence_gaps,
            streams_rejected,
            batches_published,
            push_latency,
            tick_duration,
        }
    }

    /// The exposition, in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// Sets the per-bucket gauges from one control interval's buckets and
    /// removes the series of buckets no longer tracked, so the number of
    /// series follows the number of buckets with traffic.
    pub fn observe_buckets(&self, buckets: &[BucketStatus]) {
        let metrics = &self.buckets;
        let mut previous = metrics
            .previous
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut current = BTreeSet::new();
        for status in buckets {
            let labels = BucketLabels {
                bucket: status.bucket.to_string(),
            };
            metrics
                .offered
                .get_or_create(&labels)
                .set(status.offered_rps);
            metrics
                .admitted
                .get_or_create(&labels)
                .set(status.admitted_rps);
            metrics
                .drop_ratio
                .get_or_create(&labels)
                .set(status.drop_ratio.get());
            metrics
                .proxies_reporting
                .get_or_create(&labels)
                .set(i64::from(status.proxies_reporting));
            match status.limit_rps {
                Some(limit) => {
                    metrics.limit.get_or_create(&labels).set(limit.get());
                }
                // A bucket that became unlimited has no limit series.
                None => {
                    metrics.limit.remove(&labels);
                }
            }
            previous.remove(status.bucket.as_ref());
            current.insert(labels.bucket);
        }
        for bucket in std::mem::replace(&mut *previous, current) {
            let labels = BucketLabels { bucket };
            metrics.offered.remove(&labels);
            metrics.admitted.remove(&labels);
            metrics.limit.remove(&labels);
            metrics.drop_ratio.remove(&labels);
            metrics.proxies_reporting.remove(&labels);
        }
        metrics
            .tracked
            .set(i64::try_from(buckets.len()).unwrap_or(i64::MAX));
        drop(previous);
        self.observe_tenants(buckets);
    }

    /// Per-tenant admitted rate and share of limited buckets with tenants,
    /// at most [`MAX_TENANT_SERIES`] series.
    fn observe_tenants(&self, buckets: &[BucketStatus]) {
        let metrics = &self.buckets;
        let mut previous = metrics
            .previous_tenants
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut current = BTreeSet::new();
        let mut omitted = 0_usize;
        for status in buckets.iter().filter(|s| s.limit_rps.is_some()) {
            // A tenant's cells are adjacent (sorted by tenant).
            let mut cells = status
                .cells
                .iter()
                .filter(|c| !c.tenant.is_empty())
                .peekable();
            while let Some(first) = cells.next() {
                let mut admitted = first.admitted_rps;
                let mut share = first.share_rps.unwrap_or(0.0);
                while let Some(next) = cells.next_if(|c| c.tenant == first.tenant) {
                    admitted += next.admitted_rps;
                    share += next.share_rps.unwrap_or(0.0);
                }
                if current.len() >= MAX_TENANT_SERIES {
                    omitted += 1;
                    continue;
                }
                let labels = TenantLabels {
                    bucket: status.bucket.to_string(),
                    tenant: first.tenant.to_string(),
                };
                metrics.tenant_admitted.get_or_create(&labels).set(admitted);
                metrics.tenant_share.get_or_create(&labels).set(share);
                previous.remove(&labels);
                current.insert(labels);
            }
        }
        for labels in std::mem::replace(&mut *previous, current) {
            metrics.tenant_admitted.remove(&labels);
            metrics.tenant_share.remove(&labels);
        }
        metrics
            .tenant_omitted
            .set(i64::try_from(omitted).unwrap_or(i64::MAX));
    }

    /// Cells tracked, refused and evicted, from one fleet tick.
    pub fn observe_fleet(&self, stats: &FleetStats) {
        self.cells_tracked
            .set(i64::try_from(stats.cells).unwrap_or(i64::MAX));
        self.cells_rejected_key.inc_by(stats.rejected_key_too_long);
        self.cells_rejected_proxy_cap
            .inc_by(stats.rejected_proxy_cap);
        self.cells_rejected_fleet_cap
            .inc_by(stats.rejected_fleet_cap);
        self.cells_evicted_idle.inc_by(stats.evicted_idle);
    }

    /// A proxy said Hello on `stream`. Its staleness series and its share of
    /// the connected gauge last as long as the returned guard, or until a
    /// newer stream of the same proxy replaces it.
    pub fn proxy_connected(&self, proxy_id: &str, stream: StreamId) -> ProxyGuard {
        let last_report = Arc::new(AtomicU64::new(self.proxies.now_ms()));
        let directive_age_ms = Arc::new(AtomicU64::new(NO_DIRECTIVE_AGE));
        let mut connections = self.proxies.lock();
        connections.insert(
            proxy_id.to_owned(),
            Connection {
                stream,
                last_report: Arc::clone(&last_report),
                directive_age_ms: Arc::clone(&directive_age_ms),
            },
        );
        self.proxies.update_connected(&connections);
        drop(connections);
        ProxyGuard {
            proxies: Arc::clone(&self.proxies),
            proxy_id: proxy_id.to_owned(),
            stream,
            last_report,
            directive_age_ms,
        }
    }

    /// A report arrived (whether or not it is counted).
    pub fn report_received(&self) {
        self.reports_received.inc();
    }

    /// A report was not counted.
    pub fn report_rejected(&self, reason: ReportRejected) {
        match reason {
            ReportRejected::Superseded => self.rejected_superseded.inc(),
            ReportRejected::EmptyWindow => self.rejected_empty_window.inc(),
        };
    }

    /// A report's sequence number skipped or went back.
    pub fn report_sequence_gap(&self) {
        self.report_sequence_gaps.inc();
    }

    /// A stream was closed for not starting with a valid Hello.
    pub fn stream_rejected(&self) {
        self.streams_rejected.inc();
    }

    /// The control loop broadcast a delta.
    pub fn batch_published(&self) {
        self.batches_published.inc();
        self.staleness.batch_sent();
    }

    /// The control loop broadcast a heartbeat.
    pub fn heartbeat_published(&self) {
        self.heartbeats_published.inc();
        self.staleness.batch_sent();
    }

    /// A stream handed a batch to its transport.
    pub fn batch_pushed(&self, sent: Sent) {
        match sent {
            Sent::Snapshot => {
                self.sent_snapshots.inc();
            }
            Sent::Delta { decided_at } => {
                self.sent_deltas.inc();
                self.push_latency.observe(decided_at.elapsed());
            }
        }
    }

    /// One control interval's work took `duration`.
    pub fn control_tick(&self, duration: Duration) {
        self.tick_duration.observe(duration);
    }
}

/// Keeps a connected proxy's series alive; see [`Metrics::proxy_connected`].
#[derive(Debug)]
pub struct ProxyGuard {
    proxies: Arc<Proxies>,
    proxy_id: String,
    stream: StreamId,
    last_report: Arc<AtomicU64>,
    directive_age_ms: Arc<AtomicU64>,
}

impl ProxyGuard {
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
        let mut connections = self.proxies.lock();
        // A newer stream of the same proxy owns the entry now; leave it.
        if connections
            .get(&self.proxy_id)
            .is_some_and(|c| c.stream == self.stream)
        {
            connections.remove(&self.proxy_id);
            self.proxies.update_connected(&connections);
        }
    }
}

/// Connected proxies; a collector so that report ages are computed at
/// scrape time instead of being refreshed on a timer.
#[derive(Debug)]
struct Proxies {
    /// Report times are milliseconds since this instant, so they fit an
    /// atomic.
    origin: Instant,
    connections: Mutex<HashMap<String, Connection>>,
    connected: Gauge,
}

#[derive(Debug)]
struct Connection {
    stream: StreamId,
    last_report: Arc<AtomicU64>,
    /// Directive age in the proxy's last report; [`NO_DIRECTIVE_AGE`] when
    /// it named none.
    directive_age_ms: Arc<AtomicU64>,
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
    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Connection>> {
        // Nothing panics while holding the lock, and the map is consistent
        // after every operation.
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn update_connected(&self, connections: &HashMap<String, Connection>) {
        self.connected
            .set(i64::try_from(connections.len()).unwrap_or(i64::MAX));
    }
}

impl Collector for Proxies {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let now = self.now_ms();
        let mut report_ages: Vec<(ProxyLabels, f64)> = Vec::new();
        let mut directive_ages: Vec<(ProxyLabels, f64)> = Vec::new();
        for (proxy, connection) in self.lock().iter() {
            let labels = ProxyLabels {
                proxy: proxy.clone(),
            };
            let directive_age_ms = connection.directive_age_ms.load(Ordering::Relaxed);
            if directive_age_ms != NO_DIRECTIVE_AGE {
                directive_ages.push((labels.clone(), directive_age_ms as f64 / 1000.0));
            }
            let last = connection.last_report.load(Ordering::Relaxed);
            report_ages.push((labels, now.saturating_sub(last) as f64 / 1000.0));
        }
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
        )
    }
}

/// One per-proxy gauge family in seconds. Like an empty Family: no
/// proxies, no descriptor.
fn encode_proxy_gauges(
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

/// Time since the last directive batch was broadcast, computed at scrape
/// time: if the control loop stalls, the gauge keeps growing. A healthy
/// control plane keeps it below the heartbeat interval, and with it every
/// connected proxy's directive age.
#[derive(Debug)]
struct Staleness {
    origin: Instant,
    /// Milliseconds since `origin` of the last batch; `u64::MAX` before the
    /// first one.
    last_batch_ms: AtomicU64,
}

impl Default for Staleness {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_batch_ms: AtomicU64::new(u64::MAX),
        }
    }
}

impl Staleness {
    fn batch_sent(&self) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last_batch_ms.store(now, Ordering::Relaxed);
    }
}

impl Collector for Staleness {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let last = self.last_batch_ms.load(Ordering::Relaxed);
        // Before the first batch there is nothing to be stale about; the
        // process start time covers that case.
        let since = if last == u64::MAX {
            self.origin.elapsed()
        } else {
            self.origin
                .elapsed()
                .saturating_sub(Duration::from_millis(last))
        };
        let metric = encoder.encode_descriptor(
            "directive_batch_age",
            "Time since the last directive batch (delta or heartbeat) was broadcast.",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        ConstGauge::new(since.as_secs_f64()).encode(metric)
    }
}

/// A histogram with fixed buckets kept in atomics: observing is lock-free.
#[derive(Debug, Clone)]
pub struct AtomicHistogram {
    inner: Arc<HistogramInner>,
}

#[derive(Debug)]
struct HistogramInner {
    /// Upper bounds, ascending; an implicit `+Inf` bucket follows.
    bounds: Vec<f64>,
    /// Per-bucket (not cumulative) counts, one more than `bounds`.
    counts: Vec<AtomicU64>,
    /// Sum of observations in nanoseconds; integer, so it can be added
    /// atomically.
    sum_ns: AtomicU64,
}

impl AtomicHistogram {
    /// A histogram with these upper bounds, in seconds, ascending.
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            inner: Arc::new(HistogramInner {
                bounds: bounds.to_vec(),
                counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                sum_ns: AtomicU64::new(0),
            }),
        }
    }

    /// Records one duration.
    pub fn observe(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        let inner = &self.inner;
        let index = inner.bounds.partition_point(|&bound| bound < seconds);
        if let Some(count) = inner.counts.get(index) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        inner.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let inner = &self.inner;
        let buckets: Vec<(f64, u64)> = inner
            .bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(inner.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        // The count is the buckets' total, so a scrape racing an
        // observation never shows a count that disagrees with the buckets.
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = inner.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DropRatio, LimitRps};

    fn status(bucket: &str, limit: Option<f64>) -> BucketStatus {
        BucketStatus {
            bucket: Arc::from(bucket),
            floors_exceed_limit: false,
            limit_rps: limit.map(|l| LimitRps::new(l).unwrap()),
            offered_rps: 600.0,
            admitted_rps: 200.0,
            drop_ratio: DropRatio::saturating(2.0 / 3.0),
            proxies_reporting: 1,
            shadow_dropped_rps: 0.0,
            cells: Vec::new(),
        }
    }

    fn samples(metrics: &Metrics, prefix: &str) -> Vec<String> {
        metrics
            .encode()
            .unwrap()
            .lines()
            .filter(|line| line.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn bucket_series_follow_the_tracked_buckets() {
        let metrics = Metrics::new(1);
        metrics.observe_buckets(&[status("a", Some(200.0)), status("b", None)]);
        assert_eq!(
            samples(&metrics, "sluice_bucket_limit_rps{"),
            [r#"sluice_bucket_limit_rps{bucket="a"} 200.0"#]
        );
        assert_eq!(samples(&metrics, "sluice_bucket_offered_rps{").len(), 2);

        // `a` loses its limit, `b` stops: only `a` is left, without a limit.
        metrics.observe_buckets(&[status("a", None)]);
        assert!(samples(&metrics, "sluice_bucket_limit_rps{").is_empty());
        assert_eq!(
            samples(&metrics, "sluice_bucket_offered_rps{"),
            [r#"sluice_bucket_offered_rps{bucket="a"} 600.0"#]
        );
        assert_eq!(
            samples(&metrics, "sluice_buckets_tracked "),
            ["sluice_buckets_tracked 1"]
        );

        metrics.observe_buckets(&[]);
        assert!(samples(&metrics, "sluice_bucket_").is_empty());
    }

    #[test]
    fn a_replaced_stream_does_not_remove_its_successor() {
        let metrics = Metrics::new(1);
        let old = metrics.proxy_connected("envoy-a", StreamId(1));
        let new = metrics.proxy_connected("envoy-a", StreamId(2));
        assert_eq!(
            samples(&metrics, "sluice_connected_proxies "),
            ["sluice_connected_proxies 1"]
        );
        drop(old);
        assert_eq!(
            samples(&metrics, "sluice_proxy_report_age_seconds{").len(),
            1
        );
        new.report_received(None);
        drop(new);
        assert!(samples(&metrics, "sluice_proxy_report_age_seconds{").is_empty());
        assert_eq!(
            samples(&metrics, "sluice_connected_proxies "),
            ["sluice_connected_proxies 0"]
        );
    }

    #[test]
    fn a_proxy_directive_age_follows_its_reports() {
        let metrics = Metrics::new(1);
        let guard = metrics.proxy_connected("envoy-a", StreamId(1));
        let series = "sluice_proxy_directive_age_seconds{";
        assert!(
            samples(&metrics, series).is_empty(),
            "unknown before a report"
        );
        guard.report_received(Some(1_250));
        assert_eq!(
            samples(&metrics, series),
            [r#"sluice_proxy_directive_age_seconds{proxy="envoy-a"} 1.25"#]
        );
        // A proxy that lost its table (a restart) has no age to show.
        guard.report_received(None);
        assert!(samples(&metrics, series).is_empty());
        guard.report_received(Some(0));
        assert_eq!(samples(&metrics, series).len(), 1);
        drop(guard);
        assert!(samples(&metrics, series).is_empty(), "gone with the stream");
    }

    #[test]
    fn histogram_buckets_are_cumulative_in_the_exposition() {
        let metrics = Metrics::new(1);
        metrics.batch_pushed(Sent::Snapshot);
        metrics.control_tick(Duration::from_micros(30));
        metrics.control_tick(Duration::from_secs(5));
        let text = metrics.encode().unwrap();
        for line in [
            "# TYPE sluice_control_loop_tick_duration_seconds histogram",
            r#"sluice_control_loop_tick_duration_seconds_bucket{le="0.000025"} 0"#,
            r#"sluice_control_loop_tick_duration_seconds_bucket{le="0.00005"} 1"#,
            r#"sluice_control_loop_tick_duration_seconds_bucket{le="0.1"} 1"#,
            r#"sluice_control_loop_tick_duration_seconds_bucket{le="+Inf"} 2"#,
            "sluice_control_loop_tick_duration_seconds_count 2",
            r#"sluice_directive_batches_pushed_total{kind="snapshot"} 1"#,
            r#"sluice_directive_batches_pushed_total{kind="delta"} 0"#,
            "sluice_push_latency_seconds_count 0",
            r#"sluice_build_info{version=""#,
            r#"sluice_epoch_info{epoch="1"} 1"#,
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
