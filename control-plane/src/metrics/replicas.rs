//! Metrics of a replica sharing a store: whether it leads, under which
//! fence, how many replicas' shares it counted, and store failures.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The store operation that failed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

/// The replica metrics; cheap to clone (clones share the series).
#[derive(Debug, Clone, Default)]
pub(crate) struct ReplicaMetrics {
    leader: Gauge,
    fence: Gauge,
    replicas: Gauge,
    orphans: Gauge,
    accepting: Gauge,
    shares_unreadable: Counter,
    store_failures: Family<OpLabels, Counter>,
}

impl ReplicaMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "replica_leader",
            "1 while this replica holds the leader lease and decides for the fleet",
            metrics.leader.clone(),
        );
        registry.register(
            "replica_fence",
            "Fence token of the lease this replica holds (0: not leading)",
            metrics.fence.clone(),
        );
        registry.register(
            "replicas_sharing",
            "Replicas whose load share counted in the last fleet total, this one included",
            metrics.replicas.clone(),
        );
        registry.register(
            "replica_orphaned_shares",
            "Vanished replicas' last shares still counted because their proxies have not shown up elsewhere yet",
            metrics.orphans.clone(),
        );
        registry.register(
            "replica_accepting_streams",
            "1 while this replica takes proxies' streams; 0 while it is cut off from the store past --store-grace-ms",
            metrics.accepting.clone(),
        );
        metrics.accepting.set(1);
        registry.register(
            "replica_shares_unreadable",
            "Other replicas' load shares ignored as unreadable (another layout or corrupt)",
            metrics.shares_unreadable.clone(),
        );
        registry.register(
            "store_failures",
            "Exchanges with the shared store that failed, by operation (share, lead, publish, follow)",
            metrics.store_failures.clone(),
        );
        for op in ["share", "lead", "publish", "follow"] {
            let _ = metrics.store_failures.get_or_create(&OpLabels { op });
        }
        metrics
    }

    /// A failed exchange.
    pub(crate) fn store_failed(&self, op: &'static str) {
        self.store_failures.get_or_create(&OpLabels { op }).inc();
    }

    /// What one exchange of shares counted.
    pub(crate) fn observe_share(&self, replicas: usize, orphans: usize, unreadable: usize) {
        self.replicas
            .set(i64::try_from(replicas).unwrap_or(i64::MAX));
        self.orphans.set(i64::try_from(orphans).unwrap_or(i64::MAX));
        self.shares_unreadable
            .inc_by(u64::try_from(unreadable).unwrap_or(u64::MAX));
    }

    /// Whether this replica takes proxies' streams.
    pub(crate) fn observe_accepting_streams(&self, accepting: bool) {
        self.accepting.set(i64::from(accepting));
    }

    /// The lease held after this interval.
    pub(crate) fn observe_leading(&self, fence: Option<u64>) {
        self.leader.set(i64::from(fence.is_some()));
        self.fence
            .set(fence.map_or(0, |f| i64::try_from(f).unwrap_or(i64::MAX)));
    }
}
