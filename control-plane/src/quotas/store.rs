//! The in-memory counter store (the embedded default): sharded maps from
//! counter key to algorithm state, with expiry and a byte budget so that a
//! flood of distinct descriptor values cannot grow it without bound.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, PoisonError};

use super::algorithm::{Algorithm, Direction, Quota, QuotaOutcome, State};

const SHARDS: usize = 16;
/// Expired entries are swept from a shard every this many inserts.
const SWEEP_EVERY: u32 = 1_024;

#[derive(Debug)]
struct Entry {
    state: State,
    expires_ms: u64,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<String, Entry>,
    bytes: usize,
    inserts: u32,
}

/// Why a decision could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountError {
    /// The in-memory store holds its byte budget of live counters.
    #[error("the quota store is full")]
    Full,
    /// The shared store did not answer within `--store-timeout-ms`.
    #[error("the quota store did not answer in time")]
    Timeout,
    /// The shared store answered with an error or is unreachable.
    #[error("the quota store failed: {0}")]
    Unavailable(String),
}

impl CountError {
    /// A short name for metrics and the `x-ratelimit-error` header.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            CountError::Full => "store_full",
            CountError::Timeout => "store_timeout",
            CountError::Unavailable(_) => "store_unavailable",
        }
    }
}

/// Counters in memory.
#[derive(Debug)]
pub(crate) struct MemoryStore {
    shards: Vec<Mutex<Shard>>,
    hasher: RandomState,
    max_bytes_per_shard: usize,
}

impl MemoryStore {
    /// A store of at most `max_bytes` of counter keys (plus a fixed
    /// overhead per counter).
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            max_bytes_per_shard: max_bytes / SHARDS,
        }
    }

    /// Decides `hits` taken from the counter `key`.
    #[cfg(test)]
    pub(crate) fn decide(
        &self,
        key: &str,
        algorithm: Algorithm,
        quota: Quota,
        now_ms: u64,
        hits: u32,
    ) -> Result<QuotaOutcome, CountError> {
        self.apply(key, algorithm, quota, now_ms, hits, Direction::Take)
    }

    /// Applies `hits` in `direction` to the counter `key`. A refund to a
    /// counter that holds nothing stores nothing.
    pub(crate) fn apply(
        &self,
        key: &str,
        algorithm: Algorithm,
        quota: Quota,
        now_ms: u64,
        hits: u32,
        direction: Direction,
    ) -> Result<QuotaOutcome, CountError> {
        let index = usize::try_from(self.hasher.hash_one(key) % SHARDS as u64).unwrap_or(0);
        let Some(shard) = self.shards.get(index) else {
            return Err(CountError::Full);
        };
        // Nothing panics while the lock is held.
        let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        // Two windows: the sliding window still reads the previous one.
        let expires_ms = now_ms.saturating_add(quota.window_ms.saturating_mul(2));
        if let Some(entry) = shard.entries.get_mut(key) {
            let decision = algorithm.apply(&mut entry.state, quota, now_ms, hits, direction);
            entry.expires_ms = entry.expires_ms.max(expires_ms);
            return Ok(decision);
        }
        if direction == Direction::Refund {
            let mut state = State::default();
            return Ok(algorithm.apply(&mut state, quota, now_ms, hits, direction));
        }
        let cost = key.len() + std::mem::size_of::<Entry>() + 32;
        shard.inserts = shard.inserts.wrapping_add(1);
        if shard.inserts.is_multiple_of(SWEEP_EVERY)
            || shard.bytes + cost > self.max_bytes_per_shard
        {
            sweep(&mut shard, now_ms);
        }
        if shard.bytes + cost > self.max_bytes_per_shard {
            return Err(CountError::Full);
        }
        let mut state = State::default();
        let decision = algorithm.apply(&mut state, quota, now_ms, hits, direction);
        shard.bytes += cost;
        shard
            .entries
            .insert(key.to_owned(), Entry { state, expires_ms });
        Ok(decision)
    }

    /// What `key` would answer a request of no hits at `now_ms`, without
    /// storing anything (an unseen counter reads as whole).
    pub(crate) fn peek(
        &self,
        key: &str,
        algorithm: Algorithm,
        quota: Quota,
        now_ms: u64,
    ) -> QuotaOutcome {
        let index = usize::try_from(self.hasher.hash_one(key) % SHARDS as u64).unwrap_or(0);
        let mut state = self
            .shards
            .get(index)
            .and_then(|shard| {
                let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
                shard.entries.get(key).map(|entry| entry.state)
            })
            .unwrap_or_default();
        algorithm.decide(&mut state, quota, now_ms, 0)
    }

    /// Live counters.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entries
                    .len()
            })
            .sum()
    }
}

fn sweep(shard: &mut Shard, now_ms: u64) {
    let mut freed = 0;
    shard.entries.retain(|key, entry| {
        let keep = entry.expires_ms > now_ms;
        if !keep {
            freed += key.len() + std::mem::size_of::<Entry>() + 32;
        }
        keep
    });
    shard.bytes = shard.bytes.saturating_sub(freed);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const Q: Quota = Quota {
        limit: 2,
        window_ms: 1_000,
        burst: 2,
    };

    #[test]
    fn counts_per_key_and_expires() {
        let store = MemoryStore::new(1 << 20);
        let decide = |key: &str, now| {
            store
                .decide(key, Algorithm::FixedWindow, Q, now, 1)
                .unwrap()
                .admitted
        };
        assert!(decide("a", 0) && decide("a", 1) && !decide("a", 2));
        assert!(decide("b", 2));
        assert!(decide("a", 1_000), "a new window");
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn a_full_store_refuses_new_keys_until_old_ones_expire() {
        let store = MemoryStore::new(SHARDS * 4_096);
        let mut full = 0;
        for i in 0..10_000 {
            if store
                .decide(&format!("key-{i}"), Algorithm::FixedWindow, Q, 0, 1)
                .is_err()
            {
                full += 1;
            }
        }
        assert!(full > 9_000, "{full}");
        assert!(store.len() < 1_000);
        // After two windows everything has expired and there is room again.
        assert!(
            store
                .decide("late", Algorithm::FixedWindow, Q, 5_000, 1)
                .is_ok()
        );
    }
}
