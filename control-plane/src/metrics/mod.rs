//! Prometheus metrics, served by `GET /metrics` in the OpenMetrics text
//! format.
//!
//! One [`ControlPlaneMetrics`] per process, held by the `AppState`. The other modules
//! call its small typed API; none of them sees the registry. Everything a
//! per-report or per-push path touches is a plain atomic: counters, gauges,
//! label children resolved once at start-up, and [`AtomicHistogram`]
//! (prometheus-client's own histogram takes a mutex on every observation,
//! which all streams would share).

mod cost;
mod histogram;
mod labels;
mod proxies;
pub(crate) mod quotas;
mod replicas;
mod rlqs;
mod staleness;
mod trust;
mod upstream;

pub(crate) use histogram::AtomicHistogram;
pub(crate) use proxies::ProxyGuard;
pub(crate) use quotas::QuotaMetrics;
pub(crate) use replicas::ReplicaMetrics;
pub(crate) use upstream::UpstreamMetrics;

use labels::{BucketLabels, F64Gauge, KindLabels, ReasonLabels, TenantLabels};
use proxies::Proxies;
use rlqs::RlqsMetrics;
use staleness::Staleness;
use trust::TrustMetrics;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use crate::control::controller::BucketStatus;
use crate::fleet::{FleetStats, ReportRejected, StreamId};
use crate::trust::plausibility::Checked;

/// Most (bucket, tenant) series of the per-tenant gauges; tenants beyond
/// this many (in bucket order) have none, and
/// `tenant_series_omitted` says how many were left out.
pub(crate) const MAX_TENANT_SERIES: usize = 1_000;

/// Most buckets with per-bucket series: limited buckets first, then the
/// busiest unlimited ones. A flood of one-off bucket keys would otherwise
/// add four series per key to every scrape; `bucket_series_omitted` says
/// how many were left out.
pub(crate) const MAX_BUCKET_SERIES: usize = 2_000;

/// The `Content-Type` of [`ControlPlaneMetrics::encode`]'s output. Prometheus negotiates
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

/// What a stream handed to its transport.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sent {
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
pub struct ControlPlaneMetrics {
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
    budget_cells_without_cost: Gauge,
    cells_rejected_key: Counter,
    cells_rejected_proxy_cap: Counter,
    cells_rejected_fleet_cap: Counter,
    cells_rejected_unlimited_share: Counter,
    cells_evicted_idle: Counter,
    sent_snapshots: Counter,
    sent_deltas: Counter,
    push_latency: AtomicHistogram,
    tick_duration: AtomicHistogram,
    trust: TrustMetrics,
    rlqs: RlqsMetrics,
    quotas: QuotaMetrics,
    replicas: ReplicaMetrics,
    upstream: UpstreamMetrics,
    cost: cost::CostMetrics,
}

/// Per-bucket gauges and the set of buckets that currently have series.
#[derive(Debug, Default)]
struct BucketMetrics {
    offered: Family<BucketLabels, F64Gauge>,
    admitted: Family<BucketLabels, F64Gauge>,
    limit: Family<BucketLabels, F64Gauge>,
    drop_ratio: Family<BucketLabels, F64Gauge>,
    proxies_reporting: Family<BucketLabels, Gauge>,
    proxy_cap: Family<BucketLabels, F64Gauge>,
    proxies_capped: Family<BucketLabels, Gauge>,
    tracked: Gauge,
    tenant_admitted: Family<TenantLabels, F64Gauge>,
    tenant_share: Family<TenantLabels, F64Gauge>,
    tenant_omitted: Gauge,
    bucket_omitted: Gauge,
    /// Buckets of the previous control interval. Only the control loop
    /// touches it, so the lock is never contended.
    previous: Mutex<BTreeSet<String>>,
    /// (bucket, tenant) series of the previous control interval.
    previous_tenants: Mutex<BTreeSet<TenantLabels>>,
}

impl ControlPlaneMetrics {
    /// Metrics for a process with `epoch`, all at zero.
    pub(crate) fn new(epoch: u64) -> Self {
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
            "bucket_proxy_cap_rps",
            "Most one proxy's offered rate counts for in a bucket's fleet sum; no series while no cap applies",
            buckets.proxy_cap.clone(),
        );
        registry.register(
            "bucket_proxies_capped",
            "Proxies whose claim for a bucket was capped or ignored in the last control interval",
            buckets.proxies_capped.clone(),
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
            "bucket_series_omitted",
            "Buckets without per-bucket series, beyond the series cap (limited buckets come first)",
            buckets.bucket_omitted.clone(),
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
        let budget_cells_without_cost = Gauge::default();
        registry.register(
            "budget_cells_without_cost",
            "Cells of buckets under a cost budget that a proxy offered requests of but no cost (no cost rule applies to them there), so nothing steers those requests",
            budget_cells_without_cost.clone(),
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
            "Proxy streams open (a second live instance of a proxy id counts too)",
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

        let trust = TrustMetrics::register(&mut registry);
        let rlqs = RlqsMetrics::register(&mut registry);
        let quotas = QuotaMetrics::register(&mut registry);
        let replicas = ReplicaMetrics::register(&mut registry);
        let upstream = UpstreamMetrics::register(&mut registry);
        let cost = cost::CostMetrics::register(&mut registry);

        // Label children are resolved once, so counting never looks up the
        // family (which takes its lock).
        let reason = |reason| reports_rejected.get_or_create_owned(&ReasonLabels { reason });
        let kind = |kind| batches_pushed.get_or_create_owned(&KindLabels { kind });
        let rejected = |reason| cells_rejected.get_or_create_owned(&ReasonLabels { reason });
        Self {
            cells_rejected_key: rejected("key_too_long"),
            cells_rejected_proxy_cap: rejected("proxy_cap"),
            cells_rejected_fleet_cap: rejected("fleet_cap"),
            cells_rejected_unlimited_share: rejected("unlimited_share"),
            cells_evicted_idle: cells_evicted.get_or_create_owned(&ReasonLabels { reason: "idle" }),
            cells_tracked,
            budget_cells_without_cost,
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
            trust,
            rlqs,
            quotas,
            replicas,
            upstream,
            cost,
        }
    }

    /// The exact quotas' counters.
    pub(crate) fn quotas(&self) -> QuotaMetrics {
        self.quotas.clone()
    }

    /// The upstream's health per limited bucket.
    pub(crate) fn upstream(&self) -> &UpstreamMetrics {
        &self.upstream
    }

    /// The replica's metrics (all zero without a store).
    pub(crate) fn replicas(&self) -> &ReplicaMetrics {
        &self.replicas
    }

    /// The exposition, in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub(crate) fn encode(&self) -> Result<String, fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// Sets the per-bucket gauges from one control interval's buckets and
    /// removes the series of buckets no longer tracked, so the number of
    /// series follows the number of buckets with traffic.
    pub(crate) fn observe_buckets(&self, buckets: &[BucketStatus]) {
        let metrics = &self.buckets;
        let mut previous = metrics
            .previous
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut current = BTreeSet::new();
        let shown = with_series(buckets);
        self.cost.observe(shown.iter().copied());
        metrics
            .bucket_omitted
            .set(i64::try_from(buckets.len() - shown.len()).unwrap_or(i64::MAX));
        for status in shown {
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
            match &status.proxy_cap {
                Some(cap) => {
                    for cut in &cap.capped {
                        self.proxies.claim_cut(&cut.proxy_id);
                    }
                    metrics.proxy_cap.get_or_create(&labels).set(cap.cap_rps);
                    metrics
                        .proxies_capped
                        .get_or_create(&labels)
                        .set(i64::try_from(cap.capped.len()).unwrap_or(i64::MAX));
                }
                None => {
                    metrics.proxy_cap.remove(&labels);
                    metrics.proxies_capped.remove(&labels);
                }
            }
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
            metrics.proxy_cap.remove(&labels);
            metrics.proxies_capped.remove(&labels);
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

    /// Cells tracked, refused, evicted and left without cost, from one
    /// fleet tick.
    pub(crate) fn observe_fleet(&self, stats: &FleetStats) {
        self.cells_tracked
            .set(i64::try_from(stats.cells).unwrap_or(i64::MAX));
        self.budget_cells_without_cost
            .set(i64::try_from(stats.uncosted_budget_cells).unwrap_or(i64::MAX));
        self.cells_rejected_key.inc_by(stats.rejected_key_too_long);
        self.cells_rejected_proxy_cap
            .inc_by(stats.rejected_proxy_cap);
        self.cells_rejected_fleet_cap
            .inc_by(stats.rejected_fleet_cap);
        self.cells_rejected_unlimited_share
            .inc_by(stats.rejected_unlimited_share);
        self.cells_evicted_idle.inc_by(stats.evicted_idle);
        self.trust
            .claims_cut(stats.claims_capped, stats.claims_ignored);
        self.trust.observe_probation(stats.proxies_on_probation);
    }

    /// A proxy stream was refused (`reason`: see
    /// [`crate::trust::hello::HelloRefusal::reason`]; `streams_per_connection`,
    /// `connections_per_identity`).
    pub(crate) fn stream_refused(&self, reason: &'static str) {
        self.trust.stream_refused(reason);
    }

    /// A connection was closed as it was accepted (`reason`: `per_ip`).
    pub(crate) fn connection_refused(&self, reason: &'static str) {
        self.trust.connection_refused(reason);
    }

    /// A superseded proxy stream was closed.
    pub(crate) fn stream_superseded(&self) {
        self.trust.stream_superseded();
    }

    /// Two live processes report with one proxy id.
    pub(crate) fn proxy_id_conflict(&self) {
        self.trust.proxy_id_conflict();
    }

    /// A Hello was refused for its identity (`reason`: see
    /// [`crate::trust::identity::Refusal::as_str`], or `no_client_certificate`).
    pub(crate) fn identity_refused(&self, reason: &'static str) {
        self.trust.identity_refused(reason);
    }

    /// RLQS usages refused: without a bucket, or with a negative elapsed
    /// time.
    pub(crate) fn rlqs_usages_refused(&self, no_bucket: u32, negative_elapsed: u32) {
        self.rlqs.usages_refused(no_bucket, negative_elapsed);
    }

    /// A new RLQS bucket id beyond the per-proxy cell cap was not tracked.
    pub(crate) fn rlqs_bucket_over_cap(&self) {
        self.rlqs.over_cap();
    }

    /// RLQS bucket actions sent.
    pub(crate) fn rlqs_actions_sent(&self, count: usize) {
        self.rlqs.actions_sent(count);
    }

    /// A report was clamped ([`crate::trust::Ceilings::check`]).
    pub(crate) fn report_clamped(&self, checked: &Checked) {
        self.trust.report_clamped(checked);
    }

    /// A proxy said Hello on `stream`. Its share of the connected gauge
    /// lasts as long as the returned guard; its per-proxy series too, or
    /// until a newer stream of the same proxy replaces them. A stream that
    /// does not `own_series` (a second live instance of the proxy id) gets
    /// them only while no other stream holds them.
    pub fn proxy_connected(
        &self,
        proxy_id: &str,
        stream: StreamId,
        owns_series: bool,
    ) -> ProxyGuard {
        Proxies::connect(&self.proxies, proxy_id, stream, owns_series)
    }

    /// A report arrived (whether or not it is counted).
    pub(crate) fn report_received(&self) {
        self.reports_received.inc();
    }

    /// A report was not counted.
    pub(crate) fn report_rejected(&self, reason: ReportRejected) {
        match reason {
            ReportRejected::Superseded => self.rejected_superseded.inc(),
            ReportRejected::EmptyWindow => self.rejected_empty_window.inc(),
        };
    }

    /// A report's sequence number skipped or went back.
    pub(crate) fn report_sequence_gap(&self) {
        self.report_sequence_gaps.inc();
    }

    /// A stream was closed for not starting with a valid Hello.
    pub(crate) fn stream_rejected(&self) {
        self.streams_rejected.inc();
    }

    /// The control loop broadcast a delta.
    pub(crate) fn batch_published(&self) {
        self.batches_published.inc();
        self.staleness.batch_sent();
    }

    /// The control loop broadcast a heartbeat.
    pub(crate) fn heartbeat_published(&self) {
        self.heartbeats_published.inc();
        self.staleness.batch_sent();
    }

    /// A stream handed a batch to its transport.
    pub(crate) fn batch_pushed(&self, sent: Sent) {
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
    pub(crate) fn control_tick(&self, duration: Duration) {
        self.tick_duration.observe(duration);
    }
}

/// The buckets that get per-bucket series: all of them up to
/// [`MAX_BUCKET_SERIES`], else the limited ones first, then by offered rate.
fn with_series(buckets: &[BucketStatus]) -> Vec<&BucketStatus> {
    let mut chosen: Vec<&BucketStatus> = buckets.iter().collect();
    if chosen.len() > MAX_BUCKET_SERIES {
        chosen.sort_by(|a, b| {
            b.limit_rps
                .is_some()
                .cmp(&a.limit_rps.is_some())
                .then(b.offered_rps.total_cmp(&a.offered_rps))
        });
        chosen.truncate(MAX_BUCKET_SERIES);
    }
    chosen
}

#[cfg(test)]
mod tests;
