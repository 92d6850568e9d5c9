//! Counters of the gRPC listener's trust checks: connections and streams
//! refused for what their peer already holds or what their Hello names,
//! Hellos refused for their identity, streams superseded, proxy ids two
//! processes share, reports clamped to the ceilings, and (proxy, bucket)
//! claims the fleet's share cap cut.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::ReasonLabels;
use crate::trust::hello::HelloRefusal;
use crate::trust::plausibility::Checked;

/// The families, and their label children resolved once.
#[derive(Debug, Default)]
pub(super) struct TrustMetrics {
    identity_refused: Family<ReasonLabels, Counter>,
    reports_clamped: Family<ReasonLabels, Counter>,
    claims_cut: Family<ReasonLabels, Counter>,
    streams_refused: Family<ReasonLabels, Counter>,
    connections_refused: Family<ReasonLabels, Counter>,
    streams_superseded: Counter,
    proxy_id_conflicts: Counter,
    proxies_on_probation: Gauge,
}

/// Every `reason` label of `streams_refused` besides the Hello's.
const STREAM_REFUSALS: [&str; 2] = ["streams_per_connection", "connections_per_identity"];

/// Every `reason` label of `identity_refused`, so the series exist at 0.
const REFUSALS: [&str; 3] = [
    "no_client_certificate",
    "proxy_id_not_allowed",
    "proxy_id_held_by_another_identity",
];

impl TrustMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "identity_refused",
            "Streams refused because the client certificate may not claim the Hello's proxy_id, by reason",
            metrics.identity_refused.clone(),
        );
        registry.register(
            "reports_clamped",
            "Reports cut to what is plausible, by reason (window: shorter than the time that passed; cell_ceiling, proxy_ceiling: more requests per second than allowed)",
            metrics.reports_clamped.clone(),
        );
        registry.register(
            "claims_cut",
            "(proxy, bucket) claims that counted less than reported in the fleet sum, by reason (capped: above the multiple of the bucket's median proxy; ignored: implausible)",
            metrics.claims_cut.clone(),
        );
        for reason in REFUSALS {
            let _ = metrics
                .identity_refused
                .get_or_create_owned(&ReasonLabels { reason });
        }
        for reason in ["window", "cell_ceiling", "proxy_ceiling"] {
            let _ = metrics
                .reports_clamped
                .get_or_create_owned(&ReasonLabels { reason });
        }
        for reason in ["capped", "ignored"] {
            let _ = metrics
                .claims_cut
                .get_or_create_owned(&ReasonLabels { reason });
        }
        registry.register(
            "streams_refused",
            "Proxy streams refused, by reason (streams_per_connection, connections_per_identity: the peer holds its maximum; proxy_id_* and zone_*: the Hello names something too long or unprintable)",
            metrics.streams_refused.clone(),
        );
        for reason in HelloRefusal::REASONS.into_iter().chain(STREAM_REFUSALS) {
            let _ = metrics
                .streams_refused
                .get_or_create_owned(&ReasonLabels { reason });
        }
        registry.register(
            "connections_refused",
            "Connections to the gRPC listener closed as they were accepted, by reason (per_ip: the client address holds its maximum)",
            metrics.connections_refused.clone(),
        );
        let _ = metrics
            .connections_refused
            .get_or_create_owned(&ReasonLabels { reason: "per_ip" });
        registry.register(
            "streams_superseded",
            "Proxy streams closed with ABORTED because a newer stream speaks for their proxy (a reconnect, or a restart taking over from a silent instance)",
            metrics.streams_superseded.clone(),
        );
        registry.register(
            "proxy_id_conflicts",
            "Proxy ids found held by two live processes (both reported after the second one's Hello); both are counted, as proxies of their own",
            metrics.proxy_id_conflicts.clone(),
        );
        registry.register(
            "proxies_on_probation",
            "Connected proxies still on probation: their claims have no say in what is plausible",
            metrics.proxies_on_probation.clone(),
        );
        metrics
    }

    pub(super) fn stream_refused(&self, reason: &'static str) {
        self.streams_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub(super) fn connection_refused(&self, reason: &'static str) {
        self.connections_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub(super) fn stream_superseded(&self) {
        self.streams_superseded.inc();
    }

    pub(super) fn proxy_id_conflict(&self) {
        self.proxy_id_conflicts.inc();
    }

    pub(super) fn observe_probation(&self, proxies: usize) {
        self.proxies_on_probation
            .set(i64::try_from(proxies).unwrap_or(i64::MAX));
    }

    pub(super) fn identity_refused(&self, reason: &'static str) {
        self.identity_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub(super) fn report_clamped(&self, checked: &Checked) {
        let count = |reason, yes: bool| {
            if yes {
                self.reports_clamped
                    .get_or_create(&ReasonLabels { reason })
                    .inc();
            }
        };
        count("window", checked.window_stretched);
        count("cell_ceiling", checked.cells_clamped > 0);
        count("proxy_ceiling", checked.proxy_clamped);
    }

    pub(super) fn claims_cut(&self, capped: u64, ignored: u64) {
        if capped > 0 {
            self.claims_cut
                .get_or_create(&ReasonLabels { reason: "capped" })
                .inc_by(capped);
        }
        if ignored > 0 {
            self.claims_cut
                .get_or_create(&ReasonLabels { reason: "ignored" })
                .inc_by(ignored);
        }
    }
}
