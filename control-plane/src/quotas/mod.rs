//! Exact quotas: Envoy's rate limit service API
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) on the
//! filters' gRPC listener, configured in envoyproxy/ratelimit's format, for
//! the quotas that must count exactly (billing, API plans), layered behind
//! the Sluice filter that sheds the overload without per-request I/O.

pub mod algorithm;
pub mod config;
pub mod lookup;
mod reload;
mod service;
pub mod store;

use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};

pub use algorithm::Algorithm;
pub use config::QuotaConfig;
pub use reload::watch;
pub use service::{MAX_DESCRIPTORS, MAX_ENTRIES, RateLimitGrpc};
pub use store::MemoryStore;

use crate::metrics::QuotaMetrics;

/// Default byte budget of the in-memory store's counter keys.
pub const DEFAULT_STORE_BYTES: usize = 256 << 20;

/// Milliseconds since the Unix epoch (fixed windows align to it, as
/// envoyproxy/ratelimit's do); injected so tests control time.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(crate::overrides::unix_now_ms)
}

/// The configuration, the store and how to answer.
pub struct Quotas {
    config: RwLock<Arc<QuotaConfig>>,
    /// Where the configuration was read from, for hot reload.
    pub path: Option<PathBuf>,
    store: MemoryStore,
    algorithm: Algorithm,
    fail_closed: bool,
    clock: Clock,
    metrics: QuotaMetrics,
}

impl std::fmt::Debug for Quotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quotas")
            .field("path", &self.path)
            .field("algorithm", &self.algorithm)
            .field("fail_closed", &self.fail_closed)
            .finish_non_exhaustive()
    }
}

/// How [`Quotas`] answers.
#[derive(Debug, Clone, Copy)]
pub struct QuotaSettings {
    /// The algorithm of every quota.
    pub algorithm: Algorithm,
    /// When a hit cannot be counted (the store is full): answer over limit
    /// instead of OK.
    pub fail_closed: bool,
    /// The store's byte budget.
    pub store_bytes: usize,
}

impl Default for QuotaSettings {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::default(),
            fail_closed: false,
            store_bytes: DEFAULT_STORE_BYTES,
        }
    }
}

impl Quotas {
    /// Quotas from a loaded configuration.
    pub fn new(
        config: QuotaConfig,
        path: Option<PathBuf>,
        settings: QuotaSettings,
        clock: Clock,
        metrics: QuotaMetrics,
    ) -> Self {
        Self {
            config: RwLock::new(Arc::new(config)),
            path,
            store: MemoryStore::new(settings.store_bytes),
            algorithm: settings.algorithm,
            fail_closed: settings.fail_closed,
            clock,
            metrics,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<QuotaConfig> {
        Arc::clone(&self.config.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the configuration (counters are kept: a key that still
    /// exists keeps counting).
    pub fn replace(&self, config: QuotaConfig) {
        *self.config.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
    }
}
