//! Why a request was decided the way it was, for access logs.
//!
//! The request path keeps what it decided (the core's
//! [`sluice_core::decision::Decision`]); the host hands its record to Envoy as per-request state (`wasm.sluice` filter state, which
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

use sluice_core::decision::{Decision, Outcome};
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

impl RecordMode {
    /// Whether a request decided as `decision` is recorded.
    #[inline]
    pub fn records(self, decision: &Decision) -> bool {
        match self {
            Self::Off => false,
            Self::All => true,
            Self::Drops => decision.outcome != Outcome::Admitted || decision.source.is_undirected(),
        }
    }
}

/// The directive table a decision was made under: its batch version and
/// its age (both 0 before the first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStatus {
    /// Batch version of the directive table in force (0: none).
    pub version: u64,
    /// Age of the directive table in ms (0 before the first).
    pub age_ms: u64,
}

/// Writes the record of `decision` for the cell (`bucket`, `tenant`,
/// `priority`), decided under `table`, into `out`, replacing what it held.
pub fn write(
    out: &mut String,
    decision: &Decision,
    table: TableStatus,
    (bucket, tenant, priority): (&str, &str, Priority),
) {
    out.clear();
    out.push_str("bucket=");
    escape_into(out, bucket);
    out.push_str(" tenant=");
    escape_into(out, tenant);
    out.push_str(" priority=");
    out.push_str(priority.name());
    out.push_str(" result=");
    out.push_str(match decision.outcome {
        Outcome::Admitted => "pass",
        Outcome::ShadowDropped => "shadow_drop",
        Outcome::Dropped => "drop",
    });
    out.push_str(" reason=");
    out.push_str(decision.reason.map_or("none", DropReason::name));
    // Writing into a String cannot fail.
    let _ = write!(
        out,
        " drop_ratio={:.3} version={} age_ms={} source={}",
        decision.drop_ratio,
        table.version,
        table.age_ms,
        decision.source.name()
    );
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
    use sluice_core::decision::Source;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_drop_is_written_as_one_logfmt_line() {
        let decision = Decision {
            outcome: Outcome::Dropped,
            reason: Some(DropReason::ClusterOverload),
            drop_ratio: 2.0 / 3.0,
            source: Source::Directive,
            new_cell: false,
        };
        let table = TableStatus {
            version: 42,
            age_ms: 130,
        };
        let mut out = String::new();
        write(
            &mut out,
            &decision,
            table,
            ("acme", "gold", Priority::BestEffort),
        );
        assert_eq!(
            out,
            "bucket=acme tenant=gold priority=best_effort result=drop reason=cluster_overload \
             drop_ratio=0.667 version=42 age_ms=130 source=directive"
        );
    }

    #[test]
    fn client_chosen_values_cannot_add_fields() {
        let mut out = String::new();
        write(
            &mut out,
            &Decision::default(),
            TableStatus::default(),
            ("a b=c\"\n", "", Priority::Unspecified),
        );
        assert!(out.starts_with("bucket=a%20b%3Dc%22%0A tenant=- "), "{out}");
        assert_eq!(out.matches('=').count(), 9, "{out}");
    }

    #[test]
    fn the_modes_pick_what_is_recorded() {
        let pass = Decision::default();
        let drop = Decision {
            outcome: Outcome::Dropped,
            ..pass
        };
        let stale = Decision {
            source: Source::Fallback,
            ..pass
        };
        assert!(!RecordMode::Drops.records(&pass));
        assert!(RecordMode::Drops.records(&drop));
        assert!(RecordMode::Drops.records(&stale));
        assert!(RecordMode::All.records(&pass));
        assert!(!RecordMode::Off.records(&drop));
    }

    #[test]
    fn rewriting_the_buffer_does_not_grow_it() {
        let mut out = String::new();
        let cell = ("acme", "gold", Priority::Bulk);
        write(&mut out, &Decision::default(), TableStatus::default(), cell);
        let capacity = out.capacity();
        for _ in 0..100 {
            write(&mut out, &Decision::default(), TableStatus::default(), cell);
        }
        assert_eq!(out.capacity(), capacity);
    }
}
