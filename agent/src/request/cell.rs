//! A cell is what the filter counts and the control plane directs: a
//! (bucket, tenant, priority) triple.
//!
//! Counters and directives are keyed by one string per cell, so a lookup is
//! one hash probe with a borrowed `&str` and no allocation. The key is built
//! in a reused buffer ([`CellKeyBuf`]) as
//! `priority digit ‖ tenant length (3 decimal digits) ‖ tenant ‖ bucket`:
//! the fixed-width prefix makes it unambiguous whatever bytes the bucket and
//! tenant hold, and the whole key stays valid UTF-8.

use sluice_core::{MAX_TENANT_BYTES, Priority, cut};

const PREFIX_BYTES: usize = 4;

/// The prefix of a bucket-wide cell's key (no tenant, unspecified
/// priority): its key is this followed by the bucket.
pub const BUCKET_WIDE_PREFIX: &str = "0000";
/// [`BUCKET_WIDE_PREFIX`] as bytes.
pub const BUCKET_WIDE_PREFIX_BYTES: [u8; PREFIX_BYTES] = *b"0000";

// The tenant's length is written as three decimal digits.
const _: () = assert!(MAX_TENANT_BYTES < 1000);

fn priority_digit(priority: Priority) -> u8 {
    match priority {
        Priority::Unspecified => b'0',
        Priority::Critical => b'1',
        Priority::Degraded => b'2',
        Priority::BestEffort => b'3',
        Priority::Bulk => b'4',
    }
}

fn priority_of_digit(digit: u8) -> Option<Priority> {
    Some(match digit {
        b'0' => Priority::Unspecified,
        b'1' => Priority::Critical,
        b'2' => Priority::Degraded,
        b'3' => Priority::BestEffort,
        b'4' => Priority::Bulk,
        _ => return None,
    })
}

/// Writes the key of (`bucket`, `tenant`, `priority`) into `out`, replacing
/// its contents. No allocation once `out` has grown to the longest key.
/// Callers cut bucket and tenant to their limits first; a longer tenant is
/// cut here so the length prefix always fits three digits.
pub fn write_key(out: &mut String, bucket: &str, tenant: &str, priority: Priority) {
    let tenant = cut(tenant, MAX_TENANT_BYTES);
    // Every request builds a key: the prefix is pushed as four ASCII
    // characters, with no UTF-8 validation and one capacity check.
    let len = tenant.len();
    let digit = |n: usize| char::from(b'0' + u8::try_from(n % 10).unwrap_or(0));
    out.clear();
    out.reserve(PREFIX_BYTES + tenant.len() + bucket.len());
    out.push(char::from(priority_digit(priority)));
    out.push(digit(len / 100));
    out.push(digit(len / 10));
    out.push(digit(len));
    out.push_str(tenant);
    out.push_str(bucket);
}

/// The key of a cell, allocated: for the tick path and tests.
pub fn key_of(bucket: &str, tenant: &str, priority: Priority) -> String {
    let mut key = String::with_capacity(PREFIX_BYTES + tenant.len() + bucket.len());
    write_key(&mut key, bucket, tenant, priority);
    key
}

/// Splits a key back into (bucket, tenant, priority); `None` if malformed.
pub fn parse_key(key: &str) -> Option<(&str, &str, Priority)> {
    let bytes = key.as_bytes();
    let priority = priority_of_digit(*bytes.first()?)?;
    let digits = key.get(1..PREFIX_BYTES)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: usize = digits.parse().ok()?;
    let tenant = key.get(PREFIX_BYTES..PREFIX_BYTES.checked_add(len)?)?;
    let bucket = key.get(PREFIX_BYTES + len..)?;
    Some((bucket, tenant, priority))
}

/// The reused buffers of a VM's request path: the request's bucket, tenant
/// and priority, and its cell key.
#[derive(Debug, Default, Clone)]
pub struct CellKeyBuf {
    /// The request's bucket, derived in place.
    pub bucket: String,
    /// The request's tenant, derived in place (empty: none).
    pub tenant: String,
    /// The request's priority.
    pub priority: Priority,
    exact: String,
}

impl CellKeyBuf {
    /// Builds the exact key from the parts; returns it.
    pub fn exact(&mut self) -> &str {
        write_key(&mut self.exact, &self.bucket, &self.tenant, self.priority);
        &self.exact
    }

    /// Whether the exact cell is the bucket-wide cell.
    pub fn is_bucket_wide(&self) -> bool {
        self.tenant.is_empty() && self.priority == Priority::Unspecified
    }

    /// Builds the cell key; returns it with the bucket (the key of
    /// bucket-wide directives).
    pub fn keys(&mut self) -> (&str, &str) {
        write_key(&mut self.exact, &self.bucket, &self.tenant, self.priority);
        (&self.exact, &self.bucket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn keys_round_trip() {
        for (bucket, tenant, priority) in [
            ("acme", "", Priority::Unspecified),
            ("a/b", "t1", Priority::Critical),
            ("", "x", Priority::Bulk),
            ("0031abc", "003", Priority::Degraded),
        ] {
            let key = key_of(bucket, tenant, priority);
            assert_eq!(parse_key(&key), Some((bucket, tenant, priority)));
        }
    }

    #[test]
    fn distinct_cells_have_distinct_keys() {
        // Without the length prefix these two would collide.
        assert_ne!(
            key_of("bc", "a", Priority::Bulk),
            key_of("c", "ab", Priority::Bulk)
        );
        assert_ne!(
            key_of("a", "", Priority::Bulk),
            key_of("a", "", Priority::Critical)
        );
    }

    #[test]
    fn bucket_wide_keys_are_the_prefix_and_the_bucket() {
        assert_eq!(BUCKET_WIDE_PREFIX.as_bytes(), BUCKET_WIDE_PREFIX_BYTES);
        let key = key_of("acme", "", Priority::Unspecified);
        assert_eq!(key.strip_prefix(BUCKET_WIDE_PREFIX), Some("acme"));
    }

    #[test]
    fn malformed_keys_do_not_parse() {
        for bad in ["", "9000a", "0x00a", "0009ab", "0"] {
            assert_eq!(parse_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn long_tenants_are_cut() {
        let tenant = "é".repeat(MAX_TENANT_BYTES);
        let key = key_of("b", &tenant, Priority::Unspecified);
        let (bucket, parsed, _) = parse_key(&key).unwrap();
        assert_eq!(bucket, "b");
        assert!(parsed.len() <= MAX_TENANT_BYTES);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_cell_round_trips(bucket in ".{0,40}", tenant in ".{0,40}", p in 0i32..5) {
            let priority = Priority::from_wire(p);
            let key = key_of(&bucket, &tenant, priority);
            prop_assert_eq!(parse_key(&key), Some((bucket.as_str(), tenant.as_str(), priority)));
        }
    }
}
