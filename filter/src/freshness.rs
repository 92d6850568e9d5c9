//! How fresh the directive table is. The leader stamps every batch's
//! arrival (heartbeats included) with its own clock in a small shared key;
//! every VM reads it on its short tick, so all VMs of a process agree on the
//! table's age without comparing clocks of different hosts.

use sluice_core::decision::{Fallback, Regime};

const ENCODED_LEN: usize = 32;
/// The form written before `stream_lost` existed, still read.
const OLD_ENCODED_LEN: usize = 24;

/// The shared freshness record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectivesMeta {
    /// Increments whenever the table blob is rewritten.
    pub sequence: u64,
    /// When the last batch arrived (Unix ms, this proxy's clock).
    pub received_at_ms: u64,
    /// The TTL of that batch (0: the configured default).
    pub ttl_ms: u64,
    /// Whether the leader's stream to the control plane closed since.
    pub stream_lost: bool,
}

impl DirectivesMeta {
    /// The stored form.
    pub fn encode(&self) -> [u8; ENCODED_LEN] {
        let mut bytes = [0; ENCODED_LEN];
        for (chunk, value) in bytes.chunks_exact_mut(8).zip([
            self.sequence,
            self.received_at_ms,
            self.ttl_ms,
            u64::from(self.stream_lost),
        ]) {
            chunk.copy_from_slice(&value.to_le_bytes());
        }
        bytes
    }

    /// Parses the stored form; `None` for anything malformed.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != ENCODED_LEN && bytes.len() != OLD_ENCODED_LEN {
            return None;
        }
        let mut values = bytes
            .chunks_exact(8)
            .map(|chunk| <[u8; 8]>::try_from(chunk).ok().map(u64::from_le_bytes));
        Some(Self {
            sequence: values.next()??,
            received_at_ms: values.next()??,
            ttl_ms: values.next()??,
            stream_lost: values.next().flatten().is_some_and(|lost| lost != 0),
        })
    }
}

/// A VM's view of the table's freshness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    /// The last batch's arrival, if any arrived.
    pub received_at_ms: Option<u64>,
    /// The TTL in force (the batch's, else the configured default).
    pub ttl_ms: u64,
}

impl Freshness {
    /// Milliseconds since the last batch; 0 before the first.
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        self.received_at_ms
            .map_or(0, |at| now_ms.saturating_sub(at))
    }

    /// Milliseconds since the last batch, or `None` before the first: what
    /// a report tells the control plane, which must tell "no table yet"
    /// from "just refreshed".
    pub fn table_age_ms(&self, now_ms: u64) -> Option<u64> {
        self.received_at_ms.map(|at| now_ms.saturating_sub(at))
    }

    /// Whether the table is past its TTL. A table that never received a
    /// batch is not stale: it is empty, and new-bucket rules apply.
    pub fn is_stale(&self, now_ms: u64) -> bool {
        self.received_at_ms.is_some() && self.age_ms(now_ms) > self.ttl_ms
    }

    /// The regime of the request path.
    pub fn regime(&self, now_ms: u64, fallback: Fallback) -> Regime {
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
    fn meta_round_trips() {
        let meta = DirectivesMeta {
            sequence: 7,
            received_at_ms: 1_700_000_000_000,
            ttl_ms: 90_000,
            stream_lost: true,
        };
        assert_eq!(DirectivesMeta::decode(&meta.encode()), Some(meta));
        assert_eq!(DirectivesMeta::decode(&[0; 23]), None);
        // The form without `stream_lost` (another module version's leader).
        let old = &meta.encode()[..24];
        assert_eq!(
            DirectivesMeta::decode(old),
            Some(DirectivesMeta {
                stream_lost: false,
                ..meta
            })
        );
    }

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
