//! The exact quotas in force: their configuration (the quota directory's
//! and the limits file's `quotas:` section, merged), their counters (in
//! memory or in the shared store) and how a request's hits are decided.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use super::algorithm::{self, Algorithm, Direction};
use super::over_limit_cache::OverLimitCache;
use super::redis_store::{self, RedisCounters};
use super::settings::QuotaSettings;
use super::store::{CountError, MemoryStore};
use crate::config::quota_file::QuotaConfig;
use crate::config::quota_section::{self as native, NativeQuotas};
use crate::metrics::QuotaMetrics;
use crate::store::StoreConnection;

/// Milliseconds since the Unix epoch (fixed windows align to it, as
/// envoyproxy/ratelimit's do); injected so tests control time.
pub(crate) type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock.
pub(crate) fn system_clock() -> Clock {
    Arc::new(crate::config::overrides::unix_now_ms)
}

/// The configuration, the store and how to answer.
pub struct Quotas {
    config: RwLock<Arc<QuotaConfig>>,
    /// What the configuration in force is made of.
    sources: Mutex<Sources>,
    /// Where the configuration was read from, for hot reload.
    pub(crate) path: Option<PathBuf>,
    pub(super) counters: Counters,
    pub(super) settings: QuotaSettings,
    pub(super) clock: Clock,
    pub(super) metrics: QuotaMetrics,
}

impl std::fmt::Debug for Quotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quotas")
            .field("path", &self.path)
            .field("settings", &self.settings)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// The quota directory's domains and the limits file's `quotas:` section.
#[derive(Debug, Default)]
struct Sources {
    directory: QuotaConfig,
    native: NativeQuotas,
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

impl Quotas {
    /// Quotas from a loaded configuration.
    pub(crate) fn new(
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
                native: NativeQuotas::default(),
            }),
            path,
            counters: Counters::Memory(MemoryStore::new(settings.store_bytes)),
            settings,
            clock,
            metrics,
        }
    }

    /// How it counts and answers.
    pub(crate) fn settings(&self) -> &QuotaSettings {
        &self.settings
    }

    /// Keeps the counters in the shared store instead of in memory.
    pub(crate) fn with_redis(mut self, counters: RedisCounters) -> Self {
        self.counters = Counters::Redis {
            counters: Box::new(counters),
            over_limit: OverLimitCache::new(self.settings.local_cache_bytes).map(Arc::new),
        };
        self
    }

    /// With the counters on Redis: a connection of the calling runtime's
    /// own for [`Self::answer_on`]. `None` in memory, or when Redis cannot
    /// be reached now (the store's shared connection serves then, and
    /// follows Redis back by itself).
    pub(crate) async fn open_connection(&self) -> Option<StoreConnection> {
        let Counters::Redis { counters, .. } = &self.counters else {
            return None;
        };
        match counters.open_connection().await {
            Ok(connection) => Some(connection),
            Err(err) => {
                tracing::warn!(%err, "no connection of this thread's own to the store: quotas use the shared one");
                None
            }
        }
    }

    /// The configuration in force.
    pub(crate) fn config(&self) -> Arc<QuotaConfig> {
        Arc::clone(&self.config.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the quota directory's configuration (counters are kept: a
    /// key that still exists keeps counting). Refused, changing nothing,
    /// if it clashes with the limits file's `quotas:` section.
    pub(crate) fn replace(&self, config: QuotaConfig) -> Result<bool, String> {
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = std::mem::replace(&mut sources.directory, config);
        self.apply(&mut sources, |sources| sources.directory = previous)
    }

    /// Serves the limits file's `quotas:` section (as the domain
    /// `sluice`). Refused, changing nothing, if it clashes with the quota
    /// directory.
    pub(crate) fn set_native(&self, section: &NativeQuotas) -> Result<bool, String> {
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
pub(super) enum Counters {
    /// In this process (the embedded default).
    Memory(MemoryStore),
    /// In the shared store, one round trip per request (boxed: the
    /// store's client is much larger than the in-memory store's handle),
    /// unless every counted descriptor is a fixed window known to be over
    /// its limit (`over_limit`: their hits are then written behind).
    Redis {
        counters: Box<RedisCounters>,
        over_limit: Option<Arc<OverLimitCache>>,
    },
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Counters::Memory(_) => f.write_str("Memory"),
            Counters::Redis { counters, .. } => write!(f, "Redis({counters:?})"),
        }
    }
}

impl Counters {
    /// What `count` would answer with no hits, changing nothing it admits
    /// (in memory nothing is stored; on Redis the script runs with zero
    /// hits, which only refreshes the key's expiry).
    pub(super) async fn peek(
        &self,
        algorithm: Algorithm,
        count: redis_store::Count,
        now_ms: u64,
    ) -> Result<algorithm::QuotaOutcome, CountError> {
        match self {
            Counters::Memory(memory) => {
                Ok(memory.peek(&count.counter, algorithm, count.quota, now_ms))
            }
            Counters::Redis { counters, .. } => {
                let zero = redis_store::Count {
                    hits: 0,
                    direction: Direction::Take,
                    ..count
                };
                counters
                    .decide(algorithm, std::slice::from_ref(&zero), false, None)
                    .await?
                    .into_iter()
                    .next()
                    .ok_or_else(|| CountError::Unavailable("no answer for the counter".to_owned()))
            }
        }
    }

    /// Decides every count of a request, in order; on Redis over
    /// `connection` when given, else the store's. `Cached` marks a
    /// decision the local cache made.
    pub(super) async fn decide(
        &self,
        settings: &QuotaSettings,
        counts: &[redis_store::Count],
        now_ms: u64,
        connection: Option<&StoreConnection>,
    ) -> Vec<Result<Decided, CountError>> {
        let algorithm = settings.algorithm;
        let stop = settings.stop_increment_when_over_limit && algorithm == Algorithm::FixedWindow;
        match self {
            Counters::Memory(memory) => {
                let mut hits: Vec<u32> = counts.iter().map(|count| count.hits).collect();
                if stop {
                    let over: Vec<bool> = counts
                        .iter()
                        .map(|count| {
                            let now = memory.peek(&count.counter, algorithm, count.quota, now_ms);
                            count.adds()
                                && now.used + u64::from(count.hits) > u64::from(count.quota.limit)
                        })
                        .collect();
                    stop_increment(&mut hits, &over, counts);
                }
                counts
                    .iter()
                    .zip(hits)
                    .map(|(count, hits)| {
                        memory
                            .apply(
                                &count.counter,
                                algorithm,
                                count.quota,
                                now_ms,
                                hits,
                                count.direction,
                            )
                            .map(Decided::Counted)
                    })
                    .collect()
            }
            Counters::Redis {
                counters,
                over_limit,
            } => {
                let cache = over_limit
                    .as_ref()
                    .filter(|_| algorithm == Algorithm::FixedWindow);
                match cache {
                    Some(cache) => {
                        let cached = Cached {
                            counters,
                            connection,
                            cache,
                        };
                        cached.decide(counts, stop, now_ms).await
                    }
                    None => match counters.decide(algorithm, counts, stop, connection).await {
                        Ok(decisions) => decisions
                            .into_iter()
                            .map(|d| Ok(Decided::Counted(d)))
                            .collect(),
                        Err(err) => vec![Err(err); counts.len()],
                    },
                }
            }
        }
    }
}

/// A decision, and who made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decided {
    /// The store counted the hits.
    Counted(algorithm::QuotaOutcome),
    /// The local cache knew the window full: over limit until it ends.
    Cached(algorithm::QuotaOutcome),
}

/// With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: when a count would go
/// over its limit (`over`), the hits of the others that add are not
/// counted (a refund is always given).
fn stop_increment(hits: &mut [u32], over: &[bool], counts: &[redis_store::Count]) {
    if over.iter().any(|over| *over) {
        for ((hits, over), count) in hits.iter_mut().zip(over).zip(counts) {
            if !over && count.adds() {
                *hits = 0;
            }
        }
    }
}

/// The Redis counters behind a local cache of full fixed windows.
struct Cached<'a> {
    counters: &'a RedisCounters,
    connection: Option<&'a StoreConnection>,
    cache: &'a Arc<OverLimitCache>,
}

impl Cached<'_> {
    /// Fixed-window counts: those the cache knows to be over their limit
    /// are refused here and their hits written behind (never dropped);
    /// the rest go to Redis in one call (with `stop_increment` and a
    /// descriptor refused here, the others' hits not counted, as
    /// envoyproxy/ratelimit sends them). Counters Redis finds full are
    /// noted until their window ends; a refund always goes to Redis and
    /// takes its counter out of the cache.
    async fn decide(
        &self,
        counts: &[redis_store::Count],
        stop_increment: bool,
        now_ms: u64,
    ) -> Vec<Result<Decided, CountError>> {
        let cache = self.cache;
        let mut answers: Vec<Option<Result<Decided, CountError>>> =
            Vec::with_capacity(counts.len());
        let mut sent = Vec::new();
        for count in counts {
            // Answered here only if its hits are owed in the same step.
            let cached = count
                .adds()
                .then(|| cache.answer(&count.counter, now_ms, u64::from(count.hits)))
                .flatten();
            match cached {
                Some((left_ms, start_flush)) => {
                    if start_flush {
                        self.write_behind(count);
                    }
                    answers.push(Some(Ok(Decided::Cached(algorithm::QuotaOutcome {
                        admitted: false,
                        remaining: 0,
                        reset_ms: left_ms,
                        used: u64::from(count.quota.limit).saturating_add(u64::from(count.hits)),
                    }))));
                }
                None => {
                    answers.push(None);
                    sent.push(count.clone());
                }
            }
        }
        let any_cached = sent.len() < counts.len();
        if stop_increment && any_cached {
            for count in sent.iter_mut().filter(|count| count.adds()) {
                count.hits = 0;
            }
        }
        let decided = self
            .counters
            .decide(
                Algorithm::FixedWindow,
                &sent,
                stop_increment,
                self.connection,
            )
            .await;
        let mut decided = match decided {
            Ok(decisions) => decisions.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(err) => vec![Err(err); sent.len()],
        }
        .into_iter()
        .zip(sent);
        answers
            .into_iter()
            .map(|answer| match answer {
                Some(answer) => answer,
                None => match decided.next() {
                    Some((decision, count)) => decision.map(|d| {
                        if count.direction == Direction::Refund {
                            // It may be under its limit again.
                            cache.forget(&count.counter);
                        } else if !d.admitted {
                            // A refused fixed window stays full until it
                            // ends (unless a refund comes).
                            cache.insert(&count.counter, d.reset_ms, now_ms);
                        }
                        Decided::Counted(d)
                    }),
                    None => Err(CountError::Unavailable(
                        "no answer for the counter".to_owned(),
                    )),
                },
            })
            .collect()
    }

    /// Starts writing the hits `count`'s counter owes to Redis: one call
    /// at a time, each taking every hit owed when it starts, until none
    /// is left. Hits that cannot be written (Redis down) are lost as any
    /// hit is while the store fails.
    fn write_behind(&self, count: &redis_store::Count) {
        let counters = self.counters.clone();
        let connection = self.connection.cloned();
        let cache = Arc::clone(self.cache);
        let template = redis_store::Count {
            hits: 0,
            direction: Direction::Take,
            ..count.clone()
        };
        let flush = tokio::spawn(async move {
            loop {
                let owed = cache.take_owed(&template.counter, u64::from(u32::MAX));
                if owed == 0 {
                    break;
                }
                let hits = u32::try_from(owed).unwrap_or(u32::MAX);
                let owed_count = redis_store::Count {
                    hits,
                    ..template.clone()
                };
                if let Err(err) = counters
                    .decide(
                        Algorithm::FixedWindow,
                        std::slice::from_ref(&owed_count),
                        false,
                        connection.as_ref(),
                    )
                    .await
                {
                    tracing::warn!(%err, hits, "hits answered by the local cache could not be written to the quota store");
                }
            }
        });
        self.cache.track(flush);
    }
}
