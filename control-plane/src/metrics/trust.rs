//! Counters of the gRPC listener's trust checks: Hellos refused for their
//! identity, reports clamped to the ceilings, and (proxy, bucket) claims
//! the fleet's share cap cut.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::ReasonLabels;
use crate::trust::Checked;

/// The families, and their label children resolved once.
#[derive(Debug, Default)]
pub(super) struct TrustMetrics {
    identity_refused: Family<ReasonLabels, Counter>,
    reports_clamped: Family<ReasonLabels, Counter>,
    claims_cut: Family<ReasonLabels, Counter>,
}

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
        metrics
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
