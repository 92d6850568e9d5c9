//! From an RLQS `BucketId` (the string map the `rate_limit_quota` filter's
//! `bucket_id_builder` builds) to Sluice's cell, and back.
//!
//! The rule, documented in docs/rlqs.md:
//! - `bucket`: the bucket key; `tenant`: the tenant; `priority`: one of
//!   `critical`, `degraded`, `best_effort`, `bulk` (anything else, or none,
//!   is unclassified);
//! - every other key is part of the bucket: `key=value` pairs sorted by
//!   key, joined with `;`, after the `bucket` value and a `;` (or alone
//!   when there is no `bucket` key).
//!
//! So `{bucket: acme}` is the cell a wasm filter reports for the bucket
//! `acme`, and a mixed fleet shares one limit.

use std::collections::HashMap;

use sluice_core::Priority;
use sluice_core::cell::Cell;

/// The cell a bucket id stands for: the core's cell, owned.
pub(crate) type CellOfBucket = Cell;

/// Maps a bucket id's map to its cell; `None` when it names no bucket at
/// all (an empty map).
pub(crate) fn cell_of(id: &HashMap<String, String>) -> Option<CellOfBucket> {
    let mut rest: Vec<(&String, &String)> = id
        .iter()
        .filter(|(key, _)| !matches!(key.as_str(), "bucket" | "tenant" | "priority"))
        .collect();
    rest.sort_unstable();
    let mut bucket = id.get("bucket").cloned().unwrap_or_default();
    for (key, value) in rest {
        if !bucket.is_empty() {
            bucket.push(';');
        }
        bucket.push_str(key);
        bucket.push('=');
        bucket.push_str(value);
    }
    if bucket.is_empty() {
        return None;
    }
    let priority = id
        .get("priority")
        .and_then(|name| Priority::from_name(name))
        .unwrap_or_default();
    Some(CellOfBucket {
        bucket,
        tenant: id.get("tenant").cloned().unwrap_or_default(),
        priority,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn id(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn bucket_tenant_and_priority_keys_name_the_cell() {
        let cell = cell_of(&id(&[
            ("bucket", "acme"),
            ("tenant", "gold"),
            ("priority", "bulk"),
        ]))
        .unwrap();
        assert_eq!(
            cell,
            CellOfBucket {
                bucket: "acme".to_owned(),
                tenant: "gold".to_owned(),
                priority: Priority::Bulk
            }
        );
    }

    #[test]
    fn other_keys_join_the_bucket_in_key_order() {
        let cell = cell_of(&id(&[
            ("path", "/a"),
            ("bucket", "acme"),
            ("method", "GET"),
        ]))
        .unwrap();
        assert_eq!(cell.bucket, "acme;method=GET;path=/a");
        let cell = cell_of(&id(&[("path", "/a"), ("method", "GET")])).unwrap();
        assert_eq!(cell.bucket, "method=GET;path=/a");
        assert_eq!(cell.priority, Priority::Unspecified);
        assert_eq!(cell_of(&id(&[])), None);
        assert_eq!(cell_of(&id(&[("tenant", "x")])), None);
    }
}
