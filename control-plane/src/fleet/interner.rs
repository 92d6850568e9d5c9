//! Small ids for cells, so per-proxy state and the per-tick sums index
//! arrays instead of hashing strings.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cell::CellKey;
use sluice_core::Priority;

/// Index of a cell in the interner.
pub(super) type CellId = u32;

/// Hashes a [`CellId`] by one multiplication. The ids are handed out here,
/// never chosen by a proxy, so the protection a keyed hash gives string
/// keys from request headers is not needed for them.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, id: u32) {
        self.0 = u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub(super) type IdMap<V> = HashMap<CellId, V, std::hash::BuildHasherDefault<IdHasher>>;
/// Marks an empty priority slot of a tenant.
pub(super) const NO_CELL: CellId = CellId::MAX;

/// One bucket's cells: tenant → cell per priority (wire order).
#[derive(Debug)]
pub(super) struct BucketCells {
    pub(super) id: u32,
    pub(super) tenants: HashMap<Arc<str>, [CellId; 5]>,
}

#[derive(Debug)]
pub(super) struct Slot {
    pub(super) key: CellKey,
    pub(super) bucket: u32,
    /// The last tick at which some proxy's rates mentioned the cell.
    pub(super) seen: u64,
    /// The tick it was interned at: state a proxy began keeping for the
    /// id before that was another cell's.
    pub(super) born: u64,
}

/// Gives every cell a small id, so that per-proxy state and the per-tick
/// sums index arrays instead of hashing strings, and shares the strings.
#[derive(Debug, Default)]
pub(super) struct Interner {
    pub(super) buckets: HashMap<Arc<str>, BucketCells>,
    pub(super) slots: Vec<Option<Slot>>,
    pub(super) free: Vec<CellId>,
    pub(super) free_buckets: Vec<u32>,
    pub(super) next_bucket: u32,
    pub(super) live: usize,
}

impl Interner {
    /// Whether `id` is the live cell with this key.
    pub(super) fn matches(
        &self,
        id: CellId,
        bucket: &str,
        tenant: &str,
        priority: Priority,
    ) -> bool {
        self.slots.get(id as usize).is_some_and(|slot| {
            slot.as_ref().is_some_and(|slot| {
                slot.key.priority == priority
                    && slot.key.bucket.as_ref() == bucket
                    && slot.key.tenant.as_ref() == tenant
            })
        })
    }

    pub(super) fn find(&self, bucket: &str, tenant: &str, priority: Priority) -> Option<CellId> {
        let id = *self
            .buckets
            .get(bucket)?
            .tenants
            .get(tenant)?
            .get(priority.index())?;
        (id != NO_CELL).then_some(id)
    }

    pub(super) fn insert(
        &mut self,
        bucket: &str,
        tenant: &str,
        priority: Priority,
        seen: u64,
    ) -> CellId {
        let (bucket_key, cells) = match self.buckets.get_key_value(bucket) {
            Some((key, cells)) => (Arc::clone(key), cells.id),
            None => {
                let key: Arc<str> = Arc::from(bucket);
                let id = self.free_buckets.pop().unwrap_or_else(|| {
                    self.next_bucket += 1;
                    self.next_bucket - 1
                });
                self.buckets.insert(
                    Arc::clone(&key),
                    BucketCells {
                        id,
                        tenants: HashMap::new(),
                    },
                );
                (key, id)
            }
        };
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let id = CellId::try_from(self.slots.len()).unwrap_or(NO_CELL - 1);
                self.slots.push(None);
                id
            }
        };
        let Some(bucket_cells) = self.buckets.get_mut(bucket) else {
            return NO_CELL;
        };
        let tenant_key = match bucket_cells.tenants.get_key_value(tenant) {
            Some((key, _)) => Arc::clone(key),
            None => Arc::from(tenant),
        };
        let priorities = bucket_cells
            .tenants
            .entry(Arc::clone(&tenant_key))
            .or_insert([NO_CELL; 5]);
        if let Some(slot) = priorities.get_mut(priority.index()) {
            *slot = id;
        }
        if let Some(slot) = self.slots.get_mut(id as usize) {
            *slot = Some(Slot {
                key: CellKey {
                    bucket: bucket_key,
                    tenant: tenant_key,
                    priority,
                },
                bucket: cells,
                seen,
                born: seen,
            });
        }
        self.live += 1;
        id
    }

    /// Forgets every cell not seen at `tick`; returns how many.
    pub(super) fn evict_unseen(&mut self, tick: u64) -> u64 {
        let mut evicted = 0;
        for (id, slot) in self.slots.iter_mut().enumerate() {
            let Some(entry) = slot.take_if(|entry| entry.seen != tick) else {
                continue;
            };
            evicted += 1;
            self.live -= 1;
            self.free.push(CellId::try_from(id).unwrap_or(NO_CELL));
            let key = entry.key;
            let Some(cells) = self.buckets.get_mut(key.bucket.as_ref()) else {
                continue;
            };
            if let Some(priorities) = cells.tenants.get_mut(key.tenant.as_ref()) {
                if let Some(slot) = priorities.get_mut(key.priority.index()) {
                    *slot = NO_CELL;
                }
                if priorities.iter().all(|&id| id == NO_CELL) {
                    cells.tenants.remove(key.tenant.as_ref());
                }
            }
            if cells.tenants.is_empty() {
                self.free_buckets.push(cells.id);
                self.buckets.remove(key.bucket.as_ref());
            }
        }
        evicted
    }
}
