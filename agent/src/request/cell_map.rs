//! The map from cell key to a value that the request path probes on every
//! request (the counters).
//!
//! A cell key ([`crate::request::cell`]) is hashed as its 4-byte prefix (one integer)
//! and the rest of its bytes. That lets a bucket-wide cell be found from the
//! bare bucket name, hashing and comparing `BUCKET_WIDE_PREFIX ‖ bucket`
//! without first copying the two into a key buffer. The hasher is foldhash,
//! seeded per map; [`crate::fast_map`] says why that bounds what clients
//! choosing colliding keys can do (the map's owner caps its size).

use crate::request::cell::{BUCKET_WIDE_PREFIX, BUCKET_WIDE_PREFIX_BYTES};
use foldhash::fast::RandomState;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use std::hash::{BuildHasher, Hasher};

/// Values by cell key, hashed in parts.
#[derive(Debug, Clone)]
pub struct CellMap<V> {
    table: HashTable<(String, V)>,
    hasher: RandomState,
}

impl<V> Default for CellMap<V> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            hasher: RandomState::default(),
        }
    }
}

/// The bucket-wide prefix as the integer it is hashed as.
const BUCKET_WIDE: u32 = u32::from_le_bytes(BUCKET_WIDE_PREFIX_BYTES);

fn hash_parts(state: &RandomState, prefix: u32, rest: &[u8]) -> u64 {
    let mut hasher = state.build_hasher();
    hasher.write_u32(prefix);
    hasher.write(rest);
    hasher.finish()
}

/// The hash of a whole key: the same as [`hash_parts`] of its prefix and
/// rest, so both kinds of lookup find the same entries. A key too short to
/// have a prefix (not one [`crate::request::cell`] builds) hashes as prefix 0 and
/// all its bytes.
fn hash_key(state: &RandomState, key: &str) -> u64 {
    match key.as_bytes().split_first_chunk::<4>() {
        Some((head, rest)) => hash_parts(state, u32::from_le_bytes(*head), rest),
        None => hash_parts(state, 0, key.as_bytes()),
    }
}

impl<V> CellMap<V> {
    /// The value of the cell key `key`.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let hash = hash_key(&self.hasher, key);
        self.table.find_mut(hash, |(k, _)| k == key).map(|(_, v)| v)
    }

    /// The value of the bucket-wide cell of `bucket`, without building its
    /// key.
    pub fn get_bucket_wide_mut(&mut self, bucket: &str) -> Option<&mut V> {
        let hash = hash_parts(&self.hasher, BUCKET_WIDE, bucket.as_bytes());
        self.table
            .find_mut(hash, |(k, _)| {
                k.strip_prefix(BUCKET_WIDE_PREFIX) == Some(bucket)
            })
            .map(|(_, v)| v)
    }

    /// Inserts `value` for `key`, replacing any value it had.
    pub fn insert(&mut self, key: String, value: V) {
        let hash = hash_key(&self.hasher, &key);
        match self.table.find_mut(hash, |(k, _)| *k == key) {
            Some((_, existing)) => *existing = value,
            None => {
                let hasher = &self.hasher;
                self.table
                    .insert_unique(hash, (key, value), |(k, _)| hash_key(hasher, k));
            }
        }
    }

    /// The value of `key`, or the value `make` returns inserted for it;
    /// `None` if the key is absent and `make` returns `None`. One hash of
    /// the key either way, and a copy of it only when inserting.
    pub fn get_or_try_insert(
        &mut self,
        key: &str,
        make: impl FnOnce() -> Option<V>,
    ) -> Option<&mut V> {
        let hash = hash_key(&self.hasher, key);
        let hasher = &self.hasher;
        match self
            .table
            .entry(hash, |(k, _)| k == key, |(k, _)| hash_key(hasher, k))
        {
            Entry::Occupied(entry) => Some(&mut entry.into_mut().1),
            Entry::Vacant(entry) => {
                let value = make()?;
                Some(&mut entry.insert((key.to_owned(), value)).into_mut().1)
            }
        }
    }

    /// Keeps the entries `keep` says to keep (it may change them).
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &mut V) -> bool) {
        self.table.retain(|(k, v)| keep(k, v));
    }

    /// Every entry, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut V)> {
        self.table.iter_mut().map(|(k, v)| (k.as_str(), v))
    }

    /// Takes every entry, keeping the capacity.
    pub fn drain(&mut self) -> impl Iterator<Item = (String, V)> + '_ {
        self.table.drain()
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.table.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::cell::key_of;
    use sluice_core::Priority;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_bucket_wide_cell_is_found_by_key_and_by_bucket() {
        let mut map = CellMap::default();
        map.insert(key_of("acme", "", Priority::Unspecified), 1);
        map.insert(key_of("acme", "t", Priority::Unspecified), 2);
        map.insert(key_of("acme", "", Priority::Bulk), 3);
        map.insert("x".to_owned(), 4);
        assert_eq!(map.get_bucket_wide_mut("acme"), Some(&mut 1));
        assert_eq!(
            map.get_mut(&key_of("acme", "", Priority::Unspecified)),
            Some(&mut 1)
        );
        assert_eq!(
            map.get_mut(&key_of("acme", "t", Priority::Unspecified)),
            Some(&mut 2)
        );
        assert_eq!(
            map.get_mut(&key_of("acme", "", Priority::Bulk)),
            Some(&mut 3)
        );
        assert_eq!(map.get_mut("x"), Some(&mut 4));
        assert_eq!(map.get_bucket_wide_mut("acm"), None);
        assert_eq!(map.get_bucket_wide_mut("t"), None);
        map.insert(key_of("acme", "", Priority::Unspecified), 5);
        assert_eq!(map.get_bucket_wide_mut("acme"), Some(&mut 5));
        assert_eq!(map.len(), 4);
    }

    #[test]
    fn many_cells_stay_findable_across_growth() {
        let mut map = CellMap::default();
        for i in 0..1000 {
            map.insert(key_of(&format!("b{i}"), "", Priority::Unspecified), i);
        }
        for i in 0..1000 {
            assert_eq!(map.get_bucket_wide_mut(&format!("b{i}")).copied(), Some(i));
        }
        assert_eq!(map.drain().count(), 1000);
        assert!(map.is_empty());
    }
}
