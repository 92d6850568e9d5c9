//! The hash map of the request path's tables (directives, counters, pacing,
//! new cells).
//!
//! Every request probes them with its cell key, so the hash is a large part
//! of the decision's cost: the standard library's SipHash-1-3 took about
//! half of it. foldhash is several times faster on short strings. Its keys
//! come from request headers, i.e. from clients, so two things bound what a
//! client choosing colliding keys can do: each map's hasher is seeded per
//! process (from addresses and, where there is one, the clock) and per map,
//! so collisions cannot be computed offline (foldhash is not a keyed
//! cryptographic hash, but a client sees no hash values to learn from); and
//! each map is capped at `max_buckets` entries, so even a flood of collisions
//! costs bounded probes.

use std::collections::HashMap;

/// A `HashMap` with a randomly seeded foldhash.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// An empty [`FastMap`].
pub(crate) fn new<K, V>() -> FastMap<K, V> {
    FastMap::with_hasher(foldhash::fast::RandomState::default())
}
