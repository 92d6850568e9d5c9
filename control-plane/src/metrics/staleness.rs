//! The age of the last directive batch, computed at scrape time.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// Time since the last directive batch was broadcast, computed at scrape
/// time: if the control loop stalls, the gauge keeps growing. A healthy
/// control plane keeps it below the heartbeat interval, and with it every
/// connected proxy's directive age.
#[derive(Debug)]
pub(super) struct Staleness {
    pub(super) origin: Instant,
    /// Milliseconds since `origin` of the last batch; `u64::MAX` before the
    /// first one.
    pub(super) last_batch_ms: AtomicU64,
}

impl Default for Staleness {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_batch_ms: AtomicU64::new(u64::MAX),
        }
    }
}

impl Staleness {
    pub(super) fn batch_sent(&self) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last_batch_ms.store(now, Ordering::Relaxed);
    }
}

impl Collector for Staleness {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let last = self.last_batch_ms.load(Ordering::Relaxed);
        // Before the first batch there is nothing to be stale about; the
        // process start time covers that case.
        let since = if last == u64::MAX {
            self.origin.elapsed()
        } else {
            self.origin
                .elapsed()
                .saturating_sub(Duration::from_millis(last))
        };
        let metric = encoder.encode_descriptor(
            "directive_batch_age",
            "Time since the last directive batch (delta or heartbeat) was broadcast.",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        ConstGauge::new(since.as_secs_f64()).encode(metric)
    }
}
