//! Counters known to be over their limit until their window ends, answered
//! in this process without a round trip to the shared store
//! (`--quota-local-cache-bytes`, envoyproxy/ratelimit's local cache).
//!
//! Only fixed windows are cached: a fixed-window counter that has reached
//! its limit refuses every hit until its window ends, so the cached answer
//! is the one Redis would give. A sliding window's estimate falls during
//! the window and a GCRA schedule admits again before it is whole, so their
//! refusals say nothing exact about the next hit. What is not sent is not
//! counted in Redis either (envoyproxy/ratelimit skips it too): refused
//! hits of a fixed window change no later answer.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Bytes counted per entry besides its key (the map's own share).
const ENTRY_OVERHEAD: usize = 48;

#[derive(Debug, Default)]
struct Entries {
    /// Counter key → when its window ends (the service's clock, ms).
    until_ms: HashMap<String, u64>,
    bytes: usize,
}

/// Over-limit fixed-window counters, within a byte budget.
#[derive(Debug)]
pub struct OverLimitCache {
    entries: Mutex<Entries>,
    max_bytes: usize,
}

impl OverLimitCache {
    /// A cache of at most `max_bytes`; `None` for 0 (off).
    pub fn new(max_bytes: usize) -> Option<Self> {
        (max_bytes > 0).then(|| Self {
            entries: Mutex::default(),
            max_bytes,
        })
    }

    /// Milliseconds until `counter`'s window ends, if it is known to be
    /// over its limit at `now_ms`.
    pub fn over_for(&self, counter: &str, now_ms: u64) -> Option<u64> {
        let entries = self.lock();
        let until = *entries.until_ms.get(counter)?;
        (until > now_ms).then(|| until - now_ms)
    }

    /// Notes that `counter` is over its limit for `for_ms` from `now_ms`.
    /// When the budget is spent, expired entries go first; if it is still
    /// spent the entry is not kept (a flood of keys over their limit then
    /// costs a round trip each, as without the cache).
    pub fn insert(&self, counter: &str, for_ms: u64, now_ms: u64) {
        if for_ms == 0 {
            return;
        }
        let until = now_ms.saturating_add(for_ms);
        let mut entries = self.lock();
        if let Some(existing) = entries.until_ms.get_mut(counter) {
            *existing = until;
            return;
        }
        let cost = counter.len() + ENTRY_OVERHEAD;
        if entries.bytes + cost > self.max_bytes {
            let Entries { until_ms, bytes } = &mut *entries;
            until_ms.retain(|key, until| {
                let live = *until > now_ms;
                if !live {
                    *bytes = bytes.saturating_sub(key.len() + ENTRY_OVERHEAD);
                }
                live
            });
            if entries.bytes + cost > self.max_bytes {
                return;
            }
        }
        entries.until_ms.insert(counter.to_owned(), until);
        entries.bytes += cost;
    }

    /// Entries held (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.lock().until_ms.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_at_zero_bytes() {
        assert!(OverLimitCache::new(0).is_none());
    }

    #[test]
    fn a_counter_is_over_until_its_window_ends() {
        let cache = OverLimitCache::new(1 << 10).unwrap();
        assert_eq!(cache.over_for("a", 1_000), None);
        cache.insert("a", 400, 1_000);
        assert_eq!(cache.over_for("a", 1_000), Some(400));
        assert_eq!(cache.over_for("a", 1_399), Some(1));
        assert_eq!(cache.over_for("a", 1_400), None);
        assert_eq!(cache.over_for("b", 1_100), None);
        // Nothing is cached for a window already over.
        cache.insert("c", 0, 1_000);
        assert_eq!(cache.over_for("c", 1_000), None);
    }

    #[test]
    fn the_budget_holds_and_expired_entries_make_room() {
        // Room for two entries of one-byte keys.
        let cache = OverLimitCache::new(2 * (1 + ENTRY_OVERHEAD)).unwrap();
        cache.insert("a", 100, 0);
        cache.insert("b", 1_000, 0);
        cache.insert("c", 1_000, 0);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.over_for("c", 10), None, "no room: not kept");
        // `a` has expired by 200: it makes room for `c`.
        cache.insert("c", 1_000, 200);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.over_for("c", 300), Some(900));
        assert_eq!(cache.over_for("b", 300), Some(700));
        // Renewing an entry costs nothing more.
        cache.insert("b", 5_000, 300);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.over_for("b", 300), Some(5_000));
    }
}
