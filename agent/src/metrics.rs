//! The filter's own metrics, exported through Envoy's stats.
//!
//! The request path only adds to plain per-VM fields: a host call per
//! request would cost more than the decision itself. Each VM flushes the
//! deltas on its tick with `increment_metric`, and Envoy sums the counters of
//! every VM of the process. Gauges are process-wide values that only the
//! leader records (see [`crate::agent`]), so VMs never overwrite each other
//! with different readings.
//!
//! Labels are encoded in the names as `key=value` segments, which Envoy's
//! `stats_config.stats_tags` regexes turn into Prometheus labels (see
//! `envoy/README.md`): `sluice.result=drop.reason=cluster_overload.decisions`
//! becomes `sluice_decisions{result="drop",reason="cluster_overload"}`.

use crate::host::{Host, HostError, LogLevel, MetricId, MetricKind};
use crate::usage::{Charge, ChargeSource};
use sluice_core::DropReason;
use sluice_core::decision::Outcome;

/// Counters, each flushed as a delta on every tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// Requests let through (shadow drops not included).
    DecisionsPass,
    /// Requests answered with 429, by reason.
    DecisionsDrop(DropReason),
    /// Requests the decision would have dropped but shadow mode let
    /// through, by reason.
    DecisionsShadowDrop(DropReason),
    /// Reports handed to the control-plane stream.
    ReportsSent,
    /// Reports that could not be sent, plus closes of the live stream (which
    /// may lose reports in flight).
    ReportsFailed,
    /// Directive batches received from the control plane and merged.
    DirectiveBatches,
    /// Directives in those batches that were invalid and ignored.
    DirectivesRejected,
    /// Times the directives went stale and the fallback took over.
    FallbackEntered,
    /// Control-plane streams given up because nothing arrived on them for
    /// `stream_idle_timeout_ms`.
    StreamsAbandoned,
    /// Requests of cells that did not fit the bounded counters (more cells
    /// than `max_buckets`, or unlimited cells beyond their share of it).
    RequestsUncounted,
    /// Header values (and route names) the classification read that were
    /// not UTF-8, each taken as absent ([`crate::request::classify`]).
    HeaderValuesInvalid,
    /// Actual cost charged at stream ends, by where it was read
    /// ([`crate::request::charge`]).
    CostCharged(ChargeSource),
    /// Streams charged, by where their cost was read.
    Charges(ChargeSource),
    /// Charges lost because their cell found no room in the counts.
    ChargesUncounted,
}

/// The old name of the overload drop counter.
#[allow(non_upper_case_globals)]
impl Counter {
    /// Requests answered with 429 because their bucket sheds load.
    pub const DecisionsDropClusterOverload: Self = Self::DecisionsDrop(DropReason::ClusterOverload);
}

const REASONS: usize = DropReason::ALL.len();
const SOURCES: usize = 5;

impl Counter {
    /// Every counter, in definition order.
    pub const ALL: [Self; 10 + 2 * REASONS + 2 * SOURCES] = [
        Self::DecisionsPass,
        Self::DecisionsDrop(DropReason::ClusterOverload),
        Self::DecisionsDrop(DropReason::TenantQuotaExceeded),
        Self::DecisionsDrop(DropReason::PriorityShed),
        Self::DecisionsDrop(DropReason::FallbackLimit),
        Self::DecisionsDrop(DropReason::NewBucketLimit),
        Self::DecisionsShadowDrop(DropReason::ClusterOverload),
        Self::DecisionsShadowDrop(DropReason::TenantQuotaExceeded),
        Self::DecisionsShadowDrop(DropReason::PriorityShed),
        Self::DecisionsShadowDrop(DropReason::FallbackLimit),
        Self::DecisionsShadowDrop(DropReason::NewBucketLimit),
        Self::ReportsSent,
        Self::ReportsFailed,
        Self::DirectiveBatches,
        Self::DirectivesRejected,
        Self::FallbackEntered,
        Self::StreamsAbandoned,
        Self::RequestsUncounted,
        Self::HeaderValuesInvalid,
        Self::CostCharged(ChargeSource::Metadata),
        Self::CostCharged(ChargeSource::Header),
        Self::CostCharged(ChargeSource::Trailer),
        Self::CostCharged(ChargeSource::Body),
        Self::CostCharged(ChargeSource::Estimate),
        Self::Charges(ChargeSource::Metadata),
        Self::Charges(ChargeSource::Header),
        Self::Charges(ChargeSource::Trailer),
        Self::Charges(ChargeSource::Body),
        Self::Charges(ChargeSource::Estimate),
        Self::ChargesUncounted,
    ];

    /// The Envoy stat name (Envoy prefixes it with `wasmcustom.`).
    pub const fn name(self) -> &'static str {
        use DropReason as R;
        match self {
            Self::DecisionsPass => "sluice.result=pass.decisions",
            Self::DecisionsDrop(R::ClusterOverload) => {
                "sluice.result=drop.reason=cluster_overload.decisions"
            }
            Self::DecisionsDrop(R::TenantQuotaExceeded) => {
                "sluice.result=drop.reason=tenant_quota_exceeded.decisions"
            }
            Self::DecisionsDrop(R::PriorityShed) => {
                "sluice.result=drop.reason=priority_shed.decisions"
            }
            Self::DecisionsDrop(R::FallbackLimit) => {
                "sluice.result=drop.reason=local_fallback_limit.decisions"
            }
            Self::DecisionsDrop(R::NewBucketLimit) => {
                "sluice.result=drop.reason=new_bucket_limit.decisions"
            }
            Self::DecisionsShadowDrop(R::ClusterOverload) => {
                "sluice.result=shadow_drop.reason=cluster_overload.decisions"
            }
            Self::DecisionsShadowDrop(R::TenantQuotaExceeded) => {
                "sluice.result=shadow_drop.reason=tenant_quota_exceeded.decisions"
            }
            Self::DecisionsShadowDrop(R::PriorityShed) => {
                "sluice.result=shadow_drop.reason=priority_shed.decisions"
            }
            Self::DecisionsShadowDrop(R::FallbackLimit) => {
                "sluice.result=shadow_drop.reason=local_fallback_limit.decisions"
            }
            Self::DecisionsShadowDrop(R::NewBucketLimit) => {
                "sluice.result=shadow_drop.reason=new_bucket_limit.decisions"
            }
            Self::ReportsSent => "sluice.reports_sent",
            Self::ReportsFailed => "sluice.reports_failed",
            Self::DirectiveBatches => "sluice.directive_batches",
            Self::DirectivesRejected => "sluice.directives_rejected",
            Self::FallbackEntered => "sluice.fallback_entered",
            Self::StreamsAbandoned => "sluice.streams_abandoned",
            Self::RequestsUncounted => "sluice.requests_uncounted",
            Self::HeaderValuesInvalid => "sluice.header_values_invalid",
            Self::CostCharged(ChargeSource::Metadata) => "sluice.source=metadata.cost_charged",
            Self::CostCharged(ChargeSource::Header) => "sluice.source=header.cost_charged",
            Self::CostCharged(ChargeSource::Trailer) => "sluice.source=trailer.cost_charged",
            Self::CostCharged(ChargeSource::Body) => "sluice.source=body.cost_charged",
            Self::CostCharged(ChargeSource::Estimate) => "sluice.source=estimate.cost_charged",
            Self::Charges(ChargeSource::Metadata) => "sluice.source=metadata.charges",
            Self::Charges(ChargeSource::Header) => "sluice.source=header.charges",
            Self::Charges(ChargeSource::Trailer) => "sluice.source=trailer.charges",
            Self::Charges(ChargeSource::Body) => "sluice.source=body.charges",
            Self::Charges(ChargeSource::Estimate) => "sluice.source=estimate.charges",
            Self::ChargesUncounted => "sluice.charges_uncounted",
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::DecisionsPass => 0,
            Self::DecisionsDrop(reason) => 1 + reason.index(),
            Self::DecisionsShadowDrop(reason) => 1 + REASONS + reason.index(),
            Self::ReportsSent => 1 + 2 * REASONS,
            Self::ReportsFailed => 2 + 2 * REASONS,
            Self::DirectiveBatches => 3 + 2 * REASONS,
            Self::DirectivesRejected => 4 + 2 * REASONS,
            Self::FallbackEntered => 5 + 2 * REASONS,
            Self::StreamsAbandoned => 6 + 2 * REASONS,
            Self::RequestsUncounted => 7 + 2 * REASONS,
            Self::HeaderValuesInvalid => 8 + 2 * REASONS,
            Self::CostCharged(source) => 9 + 2 * REASONS + source_index(source),
            Self::Charges(source) => 9 + 2 * REASONS + SOURCES + source_index(source),
            Self::ChargesUncounted => 9 + 2 * REASONS + 2 * SOURCES,
        }
    }
}

const fn source_index(source: ChargeSource) -> usize {
    match source {
        ChargeSource::Metadata => 0,
        ChargeSource::Header => 1,
        ChargeSource::Trailer => 2,
        ChargeSource::Body => 3,
        ChargeSource::Estimate => 4,
    }
}

/// Gauges, recorded by the leader on every tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gauge {
    /// Milliseconds since the last directive batch (a heartbeat included)
    /// arrived, on this proxy's clock; 0 before the first one.
    DirectiveAgeMs,
    /// Cells whose directive has a non-zero drop ratio.
    DirectiveBuckets,
    /// Cells that have a directive (zero drop ratios included).
    DirectiveCells,
    /// 1 while the directives are older than their TTL and the configured
    /// fallback applies, else 0.
    FallbackActive,
    /// VMs of this proxy serving requests, which share local limits.
    Workers,
}

impl Gauge {
    /// Every gauge, in definition order.
    pub const ALL: [Self; 5] = [
        Self::DirectiveAgeMs,
        Self::DirectiveBuckets,
        Self::DirectiveCells,
        Self::FallbackActive,
        Self::Workers,
    ];

    /// The Envoy stat name (Envoy prefixes it with `wasmcustom.`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::DirectiveAgeMs => "sluice.directive_age_ms",
            Self::DirectiveBuckets => "sluice.directive_buckets",
            Self::DirectiveCells => "sluice.directive_cells",
            Self::FallbackActive => "sluice.fallback_active",
            Self::Workers => "sluice.workers",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// One VM's metric ids and the counts it has not flushed yet.
#[derive(Debug, Default)]
pub struct Metrics {
    pending: [u64; Counter::ALL.len()],
    counter_ids: [Option<MetricId>; Counter::ALL.len()],
    gauge_ids: [Option<MetricId>; Gauge::ALL.len()],
    /// A failing metric call is warned about once per VM; it would
    /// otherwise repeat every tick.
    failure_logged: bool,
}

impl Metrics {
    /// Counts one request decision. The request path: no host call.
    pub fn count_decision(&mut self, outcome: Outcome, reason: Option<DropReason>) {
        let reason = reason.unwrap_or(DropReason::ClusterOverload);
        self.add(
            match outcome {
                Outcome::Admitted => Counter::DecisionsPass,
                Outcome::Dropped => Counter::DecisionsDrop(reason),
                Outcome::ShadowDropped => Counter::DecisionsShadowDrop(reason),
            },
            1,
        );
    }

    /// Counts a stream's charge: its cost and one charge, by source.
    pub fn count_charge(&mut self, charge: Charge) {
        self.add(Counter::CostCharged(charge.source), charge.cost);
        self.add(Counter::Charges(charge.source), 1);
    }

    /// Adds `n` to a counter, to be flushed on the next tick.
    pub fn add(&mut self, counter: Counter, n: u64) {
        if let Some(pending) = self.pending.get_mut(counter.index()) {
            *pending = pending.saturating_add(n);
        }
    }

    /// Not yet flushed.
    pub fn pending(&self, counter: Counter) -> u64 {
        self.pending.get(counter.index()).copied().unwrap_or(0)
    }

    /// Defines what is not defined yet, adds the pending deltas to the
    /// host's counters and records `gauges`. A delta the host refuses stays
    /// pending for the next tick, so no count is lost to a transient error.
    pub fn flush(&mut self, host: &mut impl Host, gauges: &[(Gauge, u64)]) {
        self.define_missing(host);
        for counter in Counter::ALL {
            let index = counter.index();
            let (Some(pending), Some(Some(id))) = (
                self.pending.get(index).copied(),
                self.counter_ids.get(index).copied(),
            ) else {
                continue;
            };
            if pending == 0 {
                continue;
            }
            let result = host.increment_metric(id, pending);
            match result {
                Ok(()) => {
                    if let Some(slot) = self.pending.get_mut(index) {
                        *slot = 0;
                    }
                }
                Err(err) => self.failed(host, "increment", counter.name(), err),
            }
        }
        for (gauge, value) in gauges {
            let Some(Some(id)) = self.gauge_ids.get(gauge.index()).copied() else {
                continue;
            };
            if let Err(err) = host.record_metric(id, *value) {
                self.failed(host, "record", gauge.name(), err);
            }
        }
    }

    /// Defines every metric this VM has no id for. Envoy hands out a new id
    /// on every `define_metric`, so each name is defined once per VM; one
    /// that failed is retried on the next tick.
    fn define_missing(&mut self, host: &mut impl Host) {
        for counter in Counter::ALL {
            let index = counter.index();
            if self.counter_ids.get(index).is_some_and(Option::is_none) {
                match host.define_metric(MetricKind::Counter, counter.name()) {
                    Ok(id) => {
                        if let Some(slot) = self.counter_ids.get_mut(index) {
                            *slot = Some(id);
                        }
                    }
                    Err(err) => self.failed(host, "define", counter.name(), err),
                }
            }
        }
        for gauge in Gauge::ALL {
            let index = gauge.index();
            if self.gauge_ids.get(index).is_some_and(Option::is_none) {
                match host.define_metric(MetricKind::Gauge, gauge.name()) {
                    Ok(id) => {
                        if let Some(slot) = self.gauge_ids.get_mut(index) {
                            *slot = Some(id);
                        }
                    }
                    Err(err) => self.failed(host, "define", gauge.name(), err),
                }
            }
        }
    }

    fn failed(&mut self, host: &impl Host, what: &str, name: &str, err: HostError) {
        let level = if self.failure_logged {
            LogLevel::Debug
        } else {
            LogLevel::Warn
        };
        self.failure_logged = true;
        host.log(level, &format!("cannot {what} metric {name}: {err}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn names_are_unique_and_indices_match_order() {
        let mut names: Vec<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
        names.extend(Gauge::ALL.iter().map(|g| g.name()));
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
        for (i, counter) in Counter::ALL.iter().enumerate() {
            assert_eq!(counter.index(), i);
        }
        for (i, gauge) in Gauge::ALL.iter().enumerate() {
            assert_eq!(gauge.index(), i);
        }
    }

    #[test]
    fn decisions_count_by_outcome_and_reason() {
        let mut metrics = Metrics::default();
        metrics.count_decision(Outcome::Admitted, None);
        metrics.count_decision(Outcome::Admitted, None);
        metrics.count_decision(Outcome::Dropped, Some(DropReason::ClusterOverload));
        metrics.count_decision(Outcome::ShadowDropped, Some(DropReason::PriorityShed));
        assert_eq!(metrics.pending(Counter::DecisionsPass), 2);
        assert_eq!(metrics.pending(Counter::DecisionsDropClusterOverload), 1);
        assert_eq!(
            metrics.pending(Counter::DecisionsShadowDrop(DropReason::PriorityShed)),
            1
        );
    }
}
