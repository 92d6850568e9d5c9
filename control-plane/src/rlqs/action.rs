//! From the directive table to what one Envoy is told for one bucket id:
//! the assignment, and its wire form.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};
use sluice_agent::directives::DirectiveTable;
use sluice_core::Priority;
use sluice_core::allowance::{AllowanceSettings, DirectiveRates, LocalRate, allowance_rps};

use super::assignment::Assignment;
use super::bucket_id::CellOfBucket;

/// The burst of a token bucket, as milliseconds of its rate (the wasm
/// filter's default `burst_ms`).
pub(super) const BURST_MS: u64 = 20;

/// The assignment for a cell on this Envoy: what the wasm filter's
/// allowance would be, from the directive that governs the cell; `None`
/// when no directive does.
pub(super) fn assignment_for(
    table: &DirectiveTable,
    cell: &CellOfBucket,
    local: Option<LocalRate>,
) -> Option<Assignment> {
    let entry = table
        .cell(&cell.bucket, &cell.tenant, cell.priority)
        .or_else(|| table.cell(&cell.bucket, "", Priority::Unspecified))?;
    if !entry.enforce {
        return Some(Assignment::AllowAll);
    }
    let directive = &entry.directive;
    if directive.drop_ratio.get() >= 1.0 {
        return Some(Assignment::DenyAll);
    }
    let rates = DirectiveRates {
        drop_ratio: directive.drop_ratio,
        limit_rps: directive.limit_in_weight_rps(),
        fleet_offered_rps: directive.offered_rps,
    };
    // Envoy's token bucket is the only decision on this path: the cap
    // always applies.
    let settings = AllowanceSettings {
        headroom: 0.0,
        burst_ms: BURST_MS,
        engage: sluice_core::allowance::Engage::Always,
    };
    let rate = local
        .and_then(|local| allowance_rps(local, rates, settings))
        .or_else(|| directive.per_proxy_rps());
    Some(Assignment::for_rate(rate, BURST_MS))
}

pub(super) fn strategy(assignment: Assignment) -> RateLimitStrategy {
    let strategy = match assignment {
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_s,
        } => Strategy::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: tokens_per_fill,
            }),
            // N s + N ns: see `assignment` for why the nanoseconds.
            fill_interval: Some(ProtoDuration {
                seconds: i64::from(fill_interval_s),
                nanos: i32::try_from(fill_interval_s).unwrap_or(0),
            }),
        }),
    };
    RateLimitStrategy {
        strategy: Some(strategy),
    }
}

pub(super) fn proto_duration(duration: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}

/// Assignments are renewed at a third of their TTL (every 30 s with the
/// default 90 s), and at least every minute.
pub(super) fn refresh_every(ttl_ms: u64) -> Duration {
    let third = Duration::from_millis(ttl_ms / 3);
    if third.is_zero() {
        Duration::from_secs(60)
    } else {
        third.min(Duration::from_secs(60))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use sluice_proto::v1::{Directive, DirectiveBatch, Mode, ModePolicy};

    use std::sync::Arc;

    use super::*;
    use sluice_core::Priority;

    fn cell(bucket: &str) -> CellOfBucket {
        CellOfBucket {
            bucket: bucket.to_owned(),
            tenant: String::new(),
            priority: Priority::Unspecified,
        }
    }

    fn table(directives: Vec<Directive>, modes: Option<ModePolicy>) -> DirectiveTable {
        let mut table = DirectiveTable::with_settings(100, Arc::default(), "rlqs-a");
        table.merge(DirectiveBatch {
            epoch: 1,
            version: 1,
            directives,
            ttl_ms: 90_000,
            modes,
            ..DirectiveBatch::default()
        });
        table
    }

    fn shedding(bucket: &str, drop_ratio: f64) -> Directive {
        Directive {
            bucket: bucket.to_owned(),
            drop_ratio,
            limit_rps: Some(150.0),
            offered_rps: 600.0,
            ..Directive::default()
        }
    }

    const LOCAL: Option<LocalRate> = Some(LocalRate {
        requests: 1_800,
        window_ms: 5_000,
    });

    #[test]
    fn a_shedding_cell_gets_the_wasm_filters_allowance() {
        let table = table(vec![shedding("acme", 0.75)], None);
        // 360 rps offered here, 75 % dropped: 90 rps.
        let assignment = assignment_for(&table, &cell("acme"), LOCAL).unwrap();
        assert_eq!(assignment.rate_rps(), Some(90.0));
        assert_eq!(assignment_for(&table, &cell("other"), LOCAL), None);
    }

    #[test]
    fn shadow_kill_switch_and_full_drops() {
        let mut shadow = shedding("acme", 0.75);
        shadow.mode = Mode::Shadow as i32;
        let table1 = table(vec![shadow, shedding("blocked", 1.0)], None);
        assert_eq!(
            assignment_for(&table1, &cell("acme"), LOCAL),
            Some(Assignment::AllowAll)
        );
        assert_eq!(
            assignment_for(&table1, &cell("blocked"), LOCAL),
            Some(Assignment::DenyAll)
        );
        let killed = table(
            vec![shedding("acme", 0.75)],
            Some(ModePolicy {
                kill_switch: true,
                ..ModePolicy::default()
            }),
        );
        assert_eq!(
            assignment_for(&killed, &cell("acme"), LOCAL),
            Some(Assignment::AllowAll)
        );
    }

    #[test]
    fn strategies_on_the_wire() {
        let bucket = strategy(Assignment::for_rate(Some(37.5), BURST_MS));
        let Some(Strategy::TokenBucket(bucket)) = bucket.strategy else {
            panic!("{bucket:?}");
        };
        assert_eq!(bucket.tokens_per_fill.unwrap().value, 75);
        let interval = bucket.fill_interval.unwrap();
        assert_eq!((interval.seconds, interval.nanos), (2, 2));
        assert_eq!(
            strategy(Assignment::DenyAll).strategy,
            Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32))
        );
        assert_eq!(refresh_every(90_000), Duration::from_secs(30));
        assert_eq!(refresh_every(0), Duration::from_secs(60));
    }
}
