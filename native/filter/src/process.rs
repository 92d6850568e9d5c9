//! What Envoy's proxy-wasm host keeps per process for the wasm filter, kept
//! by the module instead: shared data with compare-and-swap, and named
//! queues. Every agent of one configuration uses the same store.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use sluice_agent::host::{HostError, SharedValue};

/// Most messages a queue holds; the oldest are dropped beyond it (a leader
/// drains every tick, so this only bounds a process without a leader).
const MAX_QUEUE_LEN: usize = 4_096;

#[derive(Debug, Default)]
struct Inner {
    data: HashMap<String, SharedValue>,
    /// Process-wide, like Envoy's: a CAS only ever compares for equality.
    next_cas: u32,
    queue_ids: HashMap<String, u32>,
    queues: Vec<VecDeque<Vec<u8>>>,
}

/// Shared data and queues of one configuration's agents.
#[derive(Debug, Default)]
pub struct ProcessStore {
    inner: Mutex<Inner>,
}

impl ProcessStore {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while the lock is held; a poisoned lock still holds
        // consistent data.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads a key.
    pub fn get(&self, key: &str) -> Option<SharedValue> {
        self.lock().data.get(key).cloned()
    }

    /// Writes a key; with `cas`, only if it is unchanged since read.
    pub fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        let mut inner = self.lock();
        if let Some(expected) = cas {
            let current = inner.data.get(key).map(|v| v.cas);
            if current.is_some_and(|current| current != expected) {
                return Err(HostError::CasMismatch);
            }
        }
        inner.next_cas = inner.next_cas.wrapping_add(1).max(1);
        let cas = inner.next_cas;
        inner.data.insert(
            key.to_owned(),
            SharedValue {
                bytes: value.to_vec(),
                cas,
            },
        );
        Ok(())
    }

    /// The id of a named queue, created on first use.
    pub fn register_queue(&self, name: &str) -> u32 {
        let mut inner = self.lock();
        if let Some(id) = inner.queue_ids.get(name) {
            return *id;
        }
        let id = u32::try_from(inner.queues.len()).unwrap_or(u32::MAX);
        inner.queues.push(VecDeque::new());
        inner.queue_ids.insert(name.to_owned(), id);
        id
    }

    /// Appends to a queue.
    pub fn enqueue(&self, id: u32, message: &[u8]) -> Result<(), HostError> {
        let mut inner = self.lock();
        let queue = usize::try_from(id)
            .ok()
            .and_then(|index| inner.queues.get_mut(index))
            .ok_or(HostError::NotFound)?;
        if queue.len() >= MAX_QUEUE_LEN {
            queue.pop_front();
        }
        queue.push_back(message.to_vec());
        Ok(())
    }

    /// Takes the oldest message of a queue.
    pub fn dequeue(&self, id: u32) -> Result<Option<Vec<u8>>, HostError> {
        let mut inner = self.lock();
        let queue = usize::try_from(id)
            .ok()
            .and_then(|index| inner.queues.get_mut(index))
            .ok_or(HostError::NotFound)?;
        Ok(queue.pop_front())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_and_swap_refuses_a_stale_write() {
        let store = ProcessStore::default();
        assert_eq!(store.set("k", b"1", None), Ok(()));
        let first = store.get("k").map(|v| v.cas).unwrap_or_default();
        assert_eq!(store.set("k", b"2", Some(first)), Ok(()));
        assert_eq!(
            store.set("k", b"3", Some(first)),
            Err(HostError::CasMismatch)
        );
        assert_eq!(store.get("k").map(|v| v.bytes), Some(b"2".to_vec()));
    }

    #[test]
    fn queues_are_named_and_fifo() {
        let store = ProcessStore::default();
        let id = store.register_queue("q");
        assert_eq!(store.register_queue("q"), id);
        assert_eq!(store.enqueue(id, b"a"), Ok(()));
        assert_eq!(store.enqueue(id, b"b"), Ok(()));
        assert_eq!(store.dequeue(id), Ok(Some(b"a".to_vec())));
        assert_eq!(store.dequeue(id), Ok(Some(b"b".to_vec())));
        assert_eq!(store.dequeue(id), Ok(None));
        assert_eq!(store.enqueue(id + 1, b"x"), Err(HostError::NotFound));
    }
}
