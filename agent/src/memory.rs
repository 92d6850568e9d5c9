//! What a proxy keeps per process for its agents, kept in memory: shared
//! data with compare-and-swap and named queues ([`ProcessStore`], what
//! Envoy keeps for proxy-wasm VMs), and metrics summed over the agents
//! ([`MetricRegistry`], what Envoy does with wasm VMs' metrics). The native
//! module's agents meet here, and so do the simulator's and the tests'.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::host::{HostError, MetricId, MetricKind, MetricSink, SharedData, SharedValue};

/// Most messages a queue holds; the oldest are dropped beyond it (a leader
/// drains every tick, so this only bounds a process without a leader).
const MAX_QUEUE_LEN: usize = 4_096;

#[derive(Debug, Default)]
struct Store {
    data: HashMap<String, SharedValue>,
    /// Process-wide, like Envoy's: a CAS only ever compares for equality.
    next_cas: u32,
    queue_ids: HashMap<String, u32>,
    queues: Vec<VecDeque<Vec<u8>>>,
    /// Messages ever enqueued, all queues together.
    enqueued: usize,
}

/// Shared data and queues of one process's agents.
#[derive(Debug, Default)]
pub struct ProcessStore {
    inner: Mutex<Store>,
}

impl ProcessStore {
    fn lock(&self) -> MutexGuard<'_, Store> {
        // Nothing panics while the lock is held; a poisoned lock still holds
        // consistent data.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads a key.
    pub fn get(&self, key: &str) -> Option<SharedValue> {
        self.lock().data.get(key).cloned()
    }

    /// Writes a key; with `cas`, only if it is unchanged since read (a key
    /// that does not exist yet takes any write, as in Envoy).
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
        inner.enqueued = inner.enqueued.saturating_add(1);
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

    /// Messages waiting in the named queue.
    pub fn queue_len(&self, name: &str) -> usize {
        let inner = self.lock();
        inner
            .queue_ids
            .get(name)
            .and_then(|id| usize::try_from(*id).ok())
            .and_then(|index| inner.queues.get(index))
            .map_or(0, VecDeque::len)
    }

    /// Messages ever enqueued, all queues together.
    pub fn enqueued(&self) -> usize {
        self.lock().enqueued
    }
}

impl SharedData for Arc<ProcessStore> {
    fn get_shared_data(&self, key: &str) -> Result<Option<SharedValue>, HostError> {
        Ok(self.get(key))
    }

    fn set_shared_data(
        &mut self,
        key: &str,
        value: &[u8],
        cas: Option<u32>,
    ) -> Result<(), HostError> {
        self.set(key, value, cas)
    }

    fn register_shared_queue(&mut self, name: &str) -> Result<u32, HostError> {
        Ok(self.register_queue(name))
    }

    fn enqueue_shared_queue(&mut self, queue_id: u32, message: &[u8]) -> Result<(), HostError> {
        self.enqueue(queue_id, message)
    }

    fn dequeue_shared_queue(&mut self, queue_id: u32) -> Result<Option<Vec<u8>>, HostError> {
        self.dequeue(queue_id)
    }
}

/// One metric and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricValue {
    /// Counter or gauge.
    pub kind: MetricKind,
    /// The name the agent defined, e.g. `sluice.reports_sent`.
    pub name: String,
    /// Current value.
    pub value: u64,
}

/// Every metric of one process's agents, by name: counters summed over
/// every agent, gauges at the value last recorded.
#[derive(Debug, Default)]
pub struct MetricRegistry {
    metrics: Mutex<Vec<MetricValue>>,
}

impl MetricRegistry {
    fn lock(&self) -> MutexGuard<'_, Vec<MetricValue>> {
        // Nothing panics while the lock is held.
        self.metrics.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The id of `name`, defined on first use (one id for every agent).
    pub fn define(&self, kind: MetricKind, name: &str) -> u32 {
        let mut metrics = self.lock();
        let index = match metrics.iter().position(|m| m.name == name) {
            Some(index) => index,
            None => {
                metrics.push(MetricValue {
                    kind,
                    name: name.to_owned(),
                    value: 0,
                });
                metrics.len() - 1
            }
        };
        u32::try_from(index).unwrap_or(u32::MAX)
    }

    /// Adds to a counter.
    pub fn increment(&self, id: u32, delta: u64) -> Result<(), HostError> {
        let mut metrics = self.lock();
        let metric = metrics
            .get_mut(usize::try_from(id).unwrap_or(usize::MAX))
            .ok_or(HostError::NotFound)?;
        metric.value = metric.value.saturating_add(delta);
        Ok(())
    }

    /// Sets a gauge.
    pub fn record(&self, id: u32, value: u64) -> Result<(), HostError> {
        let mut metrics = self.lock();
        let metric = metrics
            .get_mut(usize::try_from(id).unwrap_or(usize::MAX))
            .ok_or(HostError::NotFound)?;
        metric.value = value;
        Ok(())
    }

    /// A metric's value, if defined.
    pub fn value(&self, name: &str) -> Option<u64> {
        self.lock()
            .iter()
            .find(|metric| metric.name == name)
            .map(|metric| metric.value)
    }

    /// Every metric and its value.
    pub fn snapshot(&self) -> Vec<MetricValue> {
        self.lock().clone()
    }
}

impl MetricSink for Arc<MetricRegistry> {
    fn define_metric(&mut self, kind: MetricKind, name: &str) -> Result<MetricId, HostError> {
        Ok(MetricId(self.define(kind, name)))
    }

    fn increment_metric(&mut self, id: MetricId, delta: u64) -> Result<(), HostError> {
        self.increment(id.0, delta)
    }

    fn record_metric(&mut self, id: MetricId, value: u64) -> Result<(), HostError> {
        self.record(id.0, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

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
        // A key that does not exist yet takes a write whatever its CAS.
        assert_eq!(store.set("new", b"x", Some(12_345)), Ok(()));
    }

    #[test]
    fn queues_are_named_bounded_and_fifo() {
        let store = ProcessStore::default();
        let id = store.register_queue("q");
        assert_eq!(store.register_queue("q"), id);
        assert_eq!(store.enqueue(id, b"a"), Ok(()));
        assert_eq!(store.enqueue(id, b"b"), Ok(()));
        assert_eq!(store.queue_len("q"), 2);
        assert_eq!(store.dequeue(id), Ok(Some(b"a".to_vec())));
        assert_eq!(store.dequeue(id), Ok(Some(b"b".to_vec())));
        assert_eq!(store.dequeue(id), Ok(None));
        assert_eq!(store.enqueue(id + 1, b"x"), Err(HostError::NotFound));
        for n in 0..MAX_QUEUE_LEN + 5 {
            assert_eq!(store.enqueue(id, &n.to_le_bytes()), Ok(()));
        }
        assert_eq!(store.queue_len("q"), MAX_QUEUE_LEN);
        assert_eq!(store.enqueued(), MAX_QUEUE_LEN + 7);
        // The oldest went first.
        assert_eq!(store.dequeue(id), Ok(Some(5usize.to_le_bytes().to_vec())));
    }

    #[test]
    fn agents_share_a_name_and_its_sum() {
        let registry = MetricRegistry::default();
        let a = registry.define(MetricKind::Counter, "sluice.reports_sent");
        let b = registry.define(MetricKind::Counter, "sluice.reports_sent");
        assert_eq!(a, b);
        assert_eq!(registry.increment(a, 2), Ok(()));
        assert_eq!(registry.increment(b, 3), Ok(()));
        assert_eq!(registry.value("sluice.reports_sent"), Some(5));
        assert_eq!(registry.snapshot().first().map(|m| m.value), Some(5));
        assert_eq!(registry.increment(9, 1), Err(HostError::NotFound));
        let gauge = registry.define(MetricKind::Gauge, "sluice.workers");
        assert_eq!(registry.record(gauge, 4), Ok(()));
        assert_eq!(registry.record(gauge, 2), Ok(()));
        assert_eq!(registry.value("sluice.workers"), Some(2));
    }
}
