//! How fresh the directive table is. The leader stamps every batch's
//! arrival (heartbeats included) with its own clock in a small shared key;
//! every VM reads it on its short tick, so all VMs of a process agree on the
//! table's age without comparing clocks of different hosts.

use sluice_core::regime::{Fallback, Regime};

/// A VM's view of the table's freshness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Freshness {
    /// The last batch's arrival, if any arrived.
    pub received_at_ms: Option<u64>,
    /// The TTL in force (the batch's, else the configured default).
    pub ttl_ms: u64,
}

impl Freshness {
    /// Milliseconds since the last batch; 0 before the first.
    pub(crate) fn age_ms(&self, now_ms: u64) -> u64 {
        self.received_at_ms
            .map_or(0, |at| now_ms.saturating_sub(at))
    }

    /// Milliseconds since the last batch, or `None` before the first: what
    /// a report tells the control plane, which must tell "no table yet"
    /// from "just refreshed".
    pub(crate) fn table_age_ms(&self, now_ms: u64) -> Option<u64> {
        self.received_at_ms.map(|at| now_ms.saturating_sub(at))
    }

    /// Whether the table is past its TTL. A table that never received a
    /// batch is not stale: it is empty, and new-bucket rules apply.
    pub(crate) fn is_stale(&self, now_ms: u64) -> bool {
        self.received_at_ms.is_some() && self.age_ms(now_ms) > self.ttl_ms
    }

    /// Takes the TTL a batch named, else (`batch_ttl_ms` 0) the
    /// configured one.
    pub(crate) fn set_ttl(&mut self, batch_ttl_ms: u64, configured_ms: u64) {
        self.ttl_ms = if batch_ttl_ms == 0 {
            configured_ms
        } else {
            batch_ttl_ms
        };
    }

    /// The regime of the request path.
    pub(crate) fn regime(&self, now_ms: u64, fallback: Fallback) -> Regime {
        if self.is_stale(now_ms) {
            Regime::Stale(fallback)
        } else {
            Regime::Fresh
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn staleness() {
        let never = Freshness {
            received_at_ms: None,
            ttl_ms: 100,
        };
        assert!(!never.is_stale(1_000_000));
        assert_eq!(never.age_ms(5), 0);
        assert_eq!(never.table_age_ms(5), None, "no table is not a fresh one");
        let fresh = Freshness {
            received_at_ms: Some(1000),
            ttl_ms: 100,
        };
        assert_eq!(fresh.regime(1100, Fallback::Allow), Regime::Fresh);
        assert_eq!(
            fresh.regime(1101, Fallback::Allow),
            Regime::Stale(Fallback::Allow)
        );
        assert_eq!(fresh.age_ms(900), 0, "a clock going back saturates");
        assert_eq!(fresh.table_age_ms(1250), Some(250));
        assert_eq!(fresh.table_age_ms(900), Some(0));
    }
}
