//! Counters known to be over their limit until their window ends, answered
//! in this process without waiting for the shared store
//! (`--quota-local-cache-bytes`, envoyproxy/ratelimit's local cache).
//!
//! Only fixed windows are cached: a fixed-window counter that has reached
//! its limit refuses every hit until its window ends, so the cached answer
//! is the one Redis would give. A sliding window's estimate falls during
//! the window and a GCRA schedule admits again before it is whole, so their
//! refusals say nothing exact about the next hit.
//!
//! Unlike envoyproxy/ratelimit's, this cache never swallows a hit: the
//! hits it answers are owed to the store and written behind, one call per
//! counter at a time however many arrive meanwhile (see [`OverLimitCache::answer`]), so
//! that a charge made after the fact (a stream's tokens) is counted even on
//! a window already full, and a later refund subtracts from the true
//! count. A refund (`is_negative_hits`) is never answered here: it goes to
//! the store and the counter leaves the cache, as it may be under its limit
//! again.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::task::JoinHandle;

/// Bytes counted per entry besides its key (the map's own share).
const ENTRY_OVERHEAD: usize = 48;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// When its window ends (the service's clock, ms); 0 once refunded.
    until_ms: u64,
    /// Hits answered here that the store has not counted yet.
    owed: u64,
    /// Whether a write-behind of the owed hits is under way.
    flushing: bool,
}

impl Entry {
    /// Whether the entry still has work: hits to hand to the store.
    fn busy(&self) -> bool {
        self.owed > 0 || self.flushing
    }
}

#[derive(Debug, Default)]
struct Entries {
    by_counter: HashMap<String, Entry>,
    bytes: usize,
}

/// Over-limit fixed-window counters, within a byte budget.
#[derive(Debug)]
pub(crate) struct OverLimitCache {
    entries: Mutex<Entries>,
    max_bytes: usize,
    /// The write-behind tasks still running.
    flushes: Mutex<Vec<JoinHandle<()>>>,
}

impl OverLimitCache {
    /// A cache of at most `max_bytes`; `None` for 0 (off).
    pub(crate) fn new(max_bytes: usize) -> Option<Self> {
        (max_bytes > 0).then(|| Self {
            entries: Mutex::default(),
            max_bytes,
            flushes: Mutex::default(),
        })
    }

    /// Milliseconds until `counter`'s window ends, if it is known to be
    /// over its limit at `now_ms`.
    #[cfg(test)]
    pub(crate) fn over_for(&self, counter: &str, now_ms: u64) -> Option<u64> {
        let entries = self.lock();
        let until = entries.by_counter.get(counter)?.until_ms;
        (until > now_ms).then(|| until - now_ms)
    }

    /// Notes that `counter` is over its limit for `for_ms` from `now_ms`.
    /// When the budget is spent, expired entries with nothing owed go
    /// first; if it is still spent the entry is not kept (a flood of keys
    /// over their limit then costs a round trip each, as without the
    /// cache).
    pub(crate) fn insert(&self, counter: &str, for_ms: u64, now_ms: u64) {
        if for_ms == 0 {
            return;
        }
        let until = now_ms.saturating_add(for_ms);
        let mut entries = self.lock();
        if let Some(existing) = entries.by_counter.get_mut(counter) {
            existing.until_ms = until;
            return;
        }
        let cost = counter.len() + ENTRY_OVERHEAD;
        if entries.bytes + cost > self.max_bytes {
            let Entries { by_counter, bytes } = &mut *entries;
            by_counter.retain(|key, entry| {
                let keep = entry.until_ms > now_ms || entry.busy();
                if !keep {
                    *bytes = bytes.saturating_sub(key.len() + ENTRY_OVERHEAD);
                }
                keep
            });
            if entries.bytes + cost > self.max_bytes {
                return;
            }
        }
        entries.by_counter.insert(
            counter.to_owned(),
            Entry {
                until_ms: until,
                owed: 0,
                flushing: false,
            },
        );
        entries.bytes += cost;
    }

    /// If `counter` is over its limit at `now_ms`: the time left, with
    /// `hits` noted as owed to the store in the same step (a refund that
    /// takes the counter out of the cache meanwhile cannot lose them), and
    /// whether the caller is to start the write-behind (none is under way for
    /// this counter): it then calls [`Self::take_owed`] until that answers 0.
    pub(crate) fn answer(&self, counter: &str, now_ms: u64, hits: u64) -> Option<(u64, bool)> {
        let mut entries = self.lock();
        let entry = entries.by_counter.get_mut(counter)?;
        if entry.until_ms <= now_ms {
            return None;
        }
        entry.owed = entry.owed.saturating_add(hits);
        let start = !entry.flushing && entry.owed > 0;
        if start {
            entry.flushing = true;
        }
        Some((entry.until_ms - now_ms, start))
    }

    /// Notes `hits` answered from the cache for `counter`, owed to the
    /// store. True when the caller is to start the write-behind (none is
    /// under way for this counter): it then calls [`Self::take_owed`] until
    /// that answers 0.
    #[cfg(test)]
    pub(crate) fn owe(&self, counter: &str, hits: u64) -> bool {
        let mut entries = self.lock();
        let Some(entry) = entries.by_counter.get_mut(counter) else {
            return false;
        };
        entry.owed = entry.owed.saturating_add(hits);
        if entry.flushing || entry.owed == 0 {
            return false;
        }
        entry.flushing = true;
        true
    }

    /// Takes up to `at_most` of the hits owed for `counter`, for the
    /// write-behind to send; 0 ends it (the next hits owed start
    /// another).
    pub(crate) fn take_owed(&self, counter: &str, at_most: u64) -> u64 {
        let mut entries = self.lock();
        let Some(entry) = entries.by_counter.get_mut(counter) else {
            return 0;
        };
        let taken = entry.owed.min(at_most);
        entry.owed -= taken;
        if taken == 0 {
            entry.flushing = false;
        }
        taken
    }

    /// Hits owed for `counter` not taken yet.
    #[cfg(test)]
    pub(crate) fn owed(&self, counter: &str) -> u64 {
        self.lock().by_counter.get(counter).map_or(0, |e| e.owed)
    }

    /// `counter` may be under its limit again (a refund reached the
    /// store): it is no longer answered here; hits it still owes are still
    /// written behind.
    pub(crate) fn forget(&self, counter: &str) {
        let mut entries = self.lock();
        let Some(entry) = entries.by_counter.get_mut(counter) else {
            return;
        };
        if entry.busy() {
            entry.until_ms = 0;
        } else {
            entries.by_counter.remove(counter);
            entries.bytes = entries.bytes.saturating_sub(counter.len() + ENTRY_OVERHEAD);
        }
    }

    /// Keeps a write-behind task's handle (finished ones are let go).
    pub(crate) fn track(&self, flush: JoinHandle<()>) {
        let mut flushes = self.flushes.lock().unwrap_or_else(PoisonError::into_inner);
        flushes.retain(|flush| !flush.is_finished());
        flushes.push(flush);
    }

    /// Entries held (expired ones included until swept).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().by_counter.len()
    }

    /// Whether no entry is held.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

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

    /// Hits answered here are owed, one write-behind at a time takes them
    /// all, and an expired entry that still owes hits is not swept.
    #[test]
    fn answered_hits_are_owed_until_written_behind() {
        let cache = OverLimitCache::new(2 * (1 + ENTRY_OVERHEAD)).unwrap();
        cache.insert("a", 100, 0);
        assert!(cache.owe("a", 3), "the first owed hits start a flush");
        assert!(!cache.owe("a", 4), "one flush at a time");
        assert_eq!(cache.owed("a"), 7);
        assert_eq!(cache.take_owed("a", 5), 5);
        assert!(!cache.owe("a", 1), "still flushing");
        assert_eq!(cache.take_owed("a", u64::MAX), 3);
        // Expired, but flushing: kept when room is needed.
        cache.insert("b", 1_000, 0);
        cache.insert("c", 100, 500);
        assert_eq!(cache.over_for("c", 500), None, "no room: `a` is busy");
        assert_eq!(cache.take_owed("a", u64::MAX), 0, "done");
        assert!(cache.owe("a", 1), "a new flush");
        assert_eq!(cache.take_owed("a", u64::MAX), 1);
        assert_eq!(cache.take_owed("a", u64::MAX), 0);
        cache.insert("c", 100, 500);
        assert_eq!(cache.over_for("c", 500), Some(100), "`a` made room");
        // An unknown counter owes nothing and starts nothing.
        assert!(!cache.owe("zzz", 5));
    }

    /// An answer from the cache owes its hits in the same step; an
    /// expired or forgotten counter is not answered (its hits go to the
    /// store).
    #[test]
    fn an_answer_owes_its_hits_at_once() {
        let cache = OverLimitCache::new(1 << 10).unwrap();
        cache.insert("a", 1_000, 0);
        assert_eq!(
            cache.answer("a", 100, 0),
            Some((900, false)),
            "a check owes nothing"
        );
        assert_eq!(cache.answer("a", 100, 7), Some((900, true)));
        assert_eq!(
            cache.answer("a", 200, 5),
            Some((800, false)),
            "one flush at a time"
        );
        assert_eq!(cache.owed("a"), 12);
        assert_eq!(cache.answer("a", 1_000, 5), None, "expired");
        cache.forget("a");
        assert_eq!(cache.answer("a", 300, 5), None, "forgotten");
        assert_eq!(cache.take_owed("a", u64::MAX), 12, "still written behind");
        assert_eq!(cache.answer("zzz", 0, 5), None);
    }

    #[test]
    fn a_refunded_counter_is_no_longer_answered_here() {
        let cache = OverLimitCache::new(1 << 10).unwrap();
        cache.insert("a", 1_000, 0);
        cache.forget("a");
        assert_eq!(cache.over_for("a", 10), None);
        assert!(cache.is_empty());
        // One that still owes hits keeps them for its flush.
        cache.insert("b", 1_000, 0);
        assert!(cache.owe("b", 2));
        cache.forget("b");
        assert_eq!(cache.over_for("b", 10), None);
        assert_eq!(cache.take_owed("b", u64::MAX), 2);
    }
}
