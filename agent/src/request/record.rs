//! Why a request was decided the way it was, for access logs.
//!
//! The request path notes what it decided ([`LastDecision`]); the host
//! hands it to Envoy as per-request state (`wasm.sluice` filter state, which
//! an access log prints with `%FILTER_STATE(wasm.sluice:PLAIN)%`) when the
//! configured [`RecordMode`] asks for it. The record is one logfmt line,
//! written into a buffer the VM reuses, so recording allocates nothing once
//! the buffer has grown to the longest record:
//!
//! `bucket=acme tenant=gold priority=best_effort result=drop
//! reason=cluster_overload drop_ratio=0.667 version=42 age_ms=130 source=directive`
//!
//! Bucket and tenant come from request headers, so every byte outside
//! `[A-Za-z0-9._:/-]` is percent-encoded: a client cannot inject fields or
//! break the line.

use crate::leader::counters::Outcome;
use sluice_core::{DropReason, Priority};
use std::fmt::Write;

/// Which decisions are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecordMode {
    /// None: no host call per request.
    Off,
    /// Drops, shadow drops and decisions without fresh directives: one host
    /// call on the requests someone will ask about.
    #[default]
    Drops,
    /// Every request (one host call each, about a microsecond in V8).
    All,
}

/// Where a decision came from when the directives were not fresh (the
/// value of the configured upstream header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undirected {
    /// No directive table has arrived yet.
    NoDirectives,
    /// The directives are older than their TTL: the fallback decided.
    Fallback,
    /// The cell has no directive yet: the `new_bucket` behaviour decided.
    NewBucket,
}

impl Undirected {
    /// The wire name (header value and record field).
    pub const fn name(self) -> &'static str {
        match self {
            Self::NoDirectives => "no_directives",
            Self::Fallback => "fallback",
            Self::NewBucket => "new_bucket",
        }
    }
}

/// What the request path decided for the last request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LastDecision {
    /// Admitted, shadow-dropped or dropped.
    pub outcome: Outcome,
    /// Why it was (or would have been) dropped.
    pub reason: Option<DropReason>,
    /// The governing directive's drop ratio (0 without one).
    pub drop_ratio: f64,
    /// Set when no fresh directive decided.
    pub undirected: Option<Undirected>,
    /// Batch version of the directive table in force (0: none).
    pub version: u64,
    /// Age of the directive table in ms (0 before the first).
    pub age_ms: u64,
}

impl Default for LastDecision {
    fn default() -> Self {
        Self {
            outcome: Outcome::Admitted,
            reason: None,
            drop_ratio: 0.0,
            undirected: None,
            version: 0,
            age_ms: 0,
        }
    }
}

impl LastDecision {
    /// Whether `mode` asks for this decision to be recorded.
    pub fn recorded_under(&self, mode: RecordMode) -> bool {
        match mode {
            RecordMode::Off => false,
            RecordMode::All => true,
            RecordMode::Drops => self.outcome != Outcome::Admitted || self.undirected.is_some(),
        }
    }

    /// Writes the record for the cell (`bucket`, `tenant`, `priority`) into
    /// `out`, replacing what it held.
    pub fn write(&self, out: &mut String, bucket: &str, tenant: &str, priority: Priority) {
        out.clear();
        out.push_str("bucket=");
        escape_into(out, bucket);
        out.push_str(" tenant=");
        escape_into(out, tenant);
        out.push_str(" priority=");
        out.push_str(priority.name());
        out.push_str(" result=");
        out.push_str(match self.outcome {
            Outcome::Admitted => "pass",
            Outcome::ShadowDropped => "shadow_drop",
            Outcome::Dropped => "drop",
        });
        out.push_str(" reason=");
        out.push_str(self.reason.map_or("none", DropReason::name));
        // Writing into a String cannot fail.
        let _ = write!(
            out,
            " drop_ratio={:.3} version={} age_ms={} source={}",
            self.drop_ratio,
            self.version,
            self.age_ms,
            self.undirected.map_or("directive", Undirected::name)
        );
    }
}

/// Appends `value`, percent-encoding every byte a log parser could take for
/// structure; an empty value is written as `-`.
fn escape_into(out: &mut String, value: &str) {
    if value.is_empty() {
        out.push('-');
        return;
    }
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b':' | b'/' | b'-') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_drop_is_written_as_one_logfmt_line() {
        let decision = LastDecision {
            outcome: Outcome::Dropped,
            reason: Some(DropReason::ClusterOverload),
            drop_ratio: 2.0 / 3.0,
            undirected: None,
            version: 42,
            age_ms: 130,
        };
        let mut out = String::new();
        decision.write(&mut out, "acme", "gold", Priority::BestEffort);
        assert_eq!(
            out,
            "bucket=acme tenant=gold priority=best_effort result=drop reason=cluster_overload \
             drop_ratio=0.667 version=42 age_ms=130 source=directive"
        );
    }

    #[test]
    fn client_chosen_values_cannot_add_fields() {
        let mut out = String::new();
        LastDecision::default().write(&mut out, "a b=c\"\n", "", Priority::Unspecified);
        assert!(out.starts_with("bucket=a%20b%3Dc%22%0A tenant=- "), "{out}");
        assert_eq!(out.matches('=').count(), 9, "{out}");
    }

    #[test]
    fn the_modes_pick_what_is_recorded() {
        let pass = LastDecision::default();
        let drop = LastDecision {
            outcome: Outcome::Dropped,
            ..pass
        };
        let stale = LastDecision {
            undirected: Some(Undirected::Fallback),
            ..pass
        };
        assert!(!pass.recorded_under(RecordMode::Drops));
        assert!(drop.recorded_under(RecordMode::Drops));
        assert!(stale.recorded_under(RecordMode::Drops));
        assert!(pass.recorded_under(RecordMode::All));
        assert!(!drop.recorded_under(RecordMode::Off));
    }

    #[test]
    fn rewriting_the_buffer_does_not_grow_it() {
        let mut out = String::new();
        let decision = LastDecision::default();
        decision.write(&mut out, "acme", "gold", Priority::Bulk);
        let capacity = out.capacity();
        for _ in 0..100 {
            decision.write(&mut out, "acme", "gold", Priority::Bulk);
        }
        assert_eq!(out.capacity(), capacity);
    }
}
