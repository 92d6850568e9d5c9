//! Exact quotas: Envoy's rate limit service API
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) on the
//! filters' gRPC listener, configured in envoyproxy/ratelimit's format, for
//! the quotas that must count exactly (billing, API plans), layered behind
//! the Sluice filter that sheds the overload without per-request I/O.

pub mod algorithm;
pub mod config;
pub mod lookup;
pub mod native;
mod read;
pub mod redis_store;
mod reload;
mod service;
pub mod store;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

pub use algorithm::Algorithm;
pub use config::QuotaConfig;
pub use read::{QuotaRead, ReadError};
pub use redis_store::RedisCounters;
pub use reload::watch;
pub use service::{MAX_DESCRIPTORS, MAX_ENTRIES, RateLimitGrpc};
pub use store::{CountError, MemoryStore};

use crate::metrics::QuotaMetrics;

/// Default byte budget of the in-memory store's counter keys.
pub const DEFAULT_STORE_BYTES: usize = 256 << 20;

/// Milliseconds since the Unix epoch (fixed windows align to it, as
/// envoyproxy/ratelimit's do); injected so tests control time.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(crate::config::overrides::unix_now_ms)
}

/// The configuration, the store and how to answer.
pub struct Quotas {
    config: RwLock<Arc<QuotaConfig>>,
    /// What the configuration in force is made of.
    sources: Mutex<Sources>,
    /// Where the configuration was read from, for hot reload.
    pub path: Option<PathBuf>,
    counters: Counters,
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
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// The quota directory's domains and the limits file's `quotas:` section.
#[derive(Debug, Default)]
struct Sources {
    directory: QuotaConfig,
    native: native::NativeQuotas,
}

impl Sources {
    /// The directory's domains with the section's as [`native::DOMAIN`].
    fn merged(&self) -> Result<QuotaConfig, String> {
        let mut merged = self.directory.clone();
        if let Some(root) = self.native.domain() {
            if merged.domains.contains_key(native::DOMAIN) {
                return Err(format!(
                    "the quota configuration defines domain {:?}, which the limits file's quotas: section serves; rename one",
                    native::DOMAIN
                ));
            }
            merged.domains.insert(native::DOMAIN.to_owned(), root);
        }
        Ok(merged)
    }
}

/// How [`Quotas`] answers.
#[derive(Debug, Clone, Copy)]
pub struct QuotaSettings {
    /// The algorithm of every quota.
    pub algorithm: Algorithm,
    /// When a hit cannot be counted (the store is full, down or slow):
    /// answer over limit instead of OK.
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
            config: RwLock::new(Arc::new(config.clone())),
            sources: Mutex::new(Sources {
                directory: config,
                native: native::NativeQuotas::default(),
            }),
            path,
            counters: Counters::Memory(MemoryStore::new(settings.store_bytes)),
            algorithm: settings.algorithm,
            fail_closed: settings.fail_closed,
            clock,
            metrics,
        }
    }

    /// Keeps the counters in the shared store instead of in memory.
    pub fn with_redis(mut self, counters: RedisCounters) -> Self {
        self.counters = Counters::Redis(Box::new(counters));
        self
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<QuotaConfig> {
        Arc::clone(&self.config.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the quota directory's configuration (counters are kept: a
    /// key that still exists keeps counting). Refused, changing nothing,
    /// if it clashes with the limits file's `quotas:` section.
    pub fn replace(&self, config: QuotaConfig) -> Result<bool, String> {
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = std::mem::replace(&mut sources.directory, config);
        self.apply(&mut sources, |sources| sources.directory = previous)
    }

    /// Serves the limits file's `quotas:` section (as the domain
    /// `sluice`). Refused, changing nothing, if it clashes with the quota
    /// directory.
    pub fn set_native(&self, section: &native::NativeQuotas) -> Result<bool, String> {
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        if sources.native == *section {
            return Ok(false);
        }
        let previous = std::mem::replace(&mut sources.native, section.clone());
        self.apply(&mut sources, |sources| sources.native = previous)
    }

    /// Puts the merged sources in force if they changed it; on a clash
    /// `undo` restores them.
    fn apply(
        &self,
        sources: &mut Sources,
        undo: impl FnOnce(&mut Sources),
    ) -> Result<bool, String> {
        match sources.merged() {
            Ok(merged) => {
                let mut config = self.config.write().unwrap_or_else(PoisonError::into_inner);
                if **config == merged {
                    return Ok(false);
                }
                *config = Arc::new(merged);
                Ok(true)
            }
            Err(err) => {
                undo(sources);
                Err(err)
            }
        }
    }
}

/// Where the counters live; both answer through the same service.
enum Counters {
    /// In this process (the embedded default).
    Memory(MemoryStore),
    /// In the shared store, one round trip per request (boxed: the
    /// store's client is much larger than the in-memory store's handle).
    Redis(Box<RedisCounters>),
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Counters::Memory(_) => f.write_str("Memory"),
            Counters::Redis(redis) => write!(f, "Redis({redis:?})"),
        }
    }
}

impl Counters {
    /// What `count` would answer with no hits, changing nothing it admits
    /// (in memory nothing is stored; on Redis the script runs with zero
    /// hits, which only refreshes the key's expiry).
    async fn peek(
        &self,
        domain: &str,
        algorithm: Algorithm,
        count: redis_store::Count,
        now_ms: u64,
    ) -> Result<algorithm::Decision, CountError> {
        match self {
            Counters::Memory(memory) => {
                Ok(memory.peek(&count.counter, algorithm, count.quota, now_ms))
            }
            Counters::Redis(redis) => {
                let zero = redis_store::Count { hits: 0, ..count };
                redis
                    .decide(domain, algorithm, std::slice::from_ref(&zero))
                    .await?
                    .into_iter()
                    .next()
                    .ok_or_else(|| CountError::Unavailable("no answer for the counter".to_owned()))
            }
        }
    }

    /// Decides every count of a request of `domain`, in order.
    async fn decide(
        &self,
        domain: &str,
        algorithm: Algorithm,
        counts: &[redis_store::Count],
        now_ms: u64,
    ) -> Vec<Result<algorithm::Decision, CountError>> {
        match self {
            Counters::Memory(memory) => counts
                .iter()
                .map(|count| {
                    memory.decide(&count.counter, algorithm, count.quota, now_ms, count.hits)
                })
                .collect(),
            Counters::Redis(redis) => match redis.decide(domain, algorithm, counts).await {
                Ok(decisions) => decisions.into_iter().map(Ok).collect(),
                Err(err) => vec![Err(err); counts.len()],
            },
        }
    }
}
