//! The agents' metrics, by name: counters summed over every agent, gauges
//! at the value last recorded (what Envoy does for wasm VMs' metrics).

use std::sync::{Mutex, MutexGuard, PoisonError};

use sluice_agent::host::{HostError, MetricKind};

/// One metric and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricValue {
    /// Counter or gauge.
    pub kind: MetricKind,
    /// The name the agent defined, e.g. `sluice.requests_dropped`.
    pub name: String,
    /// Current value.
    pub value: u64,
}

/// Every metric of one configuration's agents.
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

    /// Every metric and its value.
    pub fn snapshot(&self) -> Vec<MetricValue> {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_share_a_name_and_its_sum() {
        let registry = MetricRegistry::default();
        let a = registry.define(MetricKind::Counter, "sluice.requests_dropped");
        let b = registry.define(MetricKind::Counter, "sluice.requests_dropped");
        assert_eq!(a, b);
        assert_eq!(registry.increment(a, 2), Ok(()));
        assert_eq!(registry.increment(b, 3), Ok(()));
        assert_eq!(registry.snapshot().first().map(|m| m.value), Some(5));
        assert_eq!(registry.increment(9, 1), Err(HostError::NotFound));
    }
}
