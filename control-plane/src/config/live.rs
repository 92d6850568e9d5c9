//! The limits file as the control plane holds it at run time.
//!
//! Three things change it: admin API writes ([`LiveConfig::update`]), edits
//! of the file on disk ([`LiveConfig::poll`] picks them up) and overrides
//! reaching their deadline (also [`LiveConfig::poll`]). After each change the
//! effective policy (base values plus the overrides in force) replaces the
//! one in [`AppState`], which the control loop reads on its next interval.
//!
//! Writes are persisted before they take effect, atomically, and the bytes
//! written are remembered: the next poll finds the file unchanged and does
//! not reload what the control plane wrote itself.
//!
//! Readers never wait on a writer: the configuration in force is a snapshot
//! swapped whole ([`arc_swap`]), while writers take turns on a lock of their
//! own that they hold across the file's write and fsyncs. A changed file is
//! parsed with no lock held at all.
//!
//! With replicas ([`LiveConfig::shared`]) the configuration lives in the
//! store instead ([`crate::config::shared`]): a write goes to the
//! store first (or fails with nothing changed), and every replica adopts
//! a newer stored version on its next [`LiveConfig::sync_from_store`]. The
//! file is then only read once, to seed an empty store.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use arc_swap::ArcSwap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::config::persist;
use crate::config::shared::{SharedConfig, SharedConfigError};
use crate::config::{Config, ConfigError};
use crate::state::AppState;

/// Why a change could not be persisted; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The configuration could not be rendered as YAML.
    #[error("cannot render the limits file: {0}")]
    Render(#[from] serde_yaml_ng::Error),
    /// The file was edited by hand and the edit is invalid: writing now
    /// would throw the edit away.
    #[error("the limits file was edited and is invalid; fix it first: {0}")]
    FileInvalid(String),
    /// The file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The limits file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The shared store could not be read or written.
    #[error("the shared store: {0}")]
    Store(#[from] SharedConfigError),
    /// The stored configuration does not parse (written by hand, or by
    /// another version).
    #[error("the configuration in the store is invalid: {0}")]
    StoredInvalid(String),
    /// The file kept changing on disk while the write waited its turn.
    #[error("the limits file keeps changing on disk; retry")]
    FileChanging,
}

/// How a write reaches the disk: [`AtomicFile`] unless a test slows it down.
pub trait Persist: std::fmt::Debug + Send + Sync {
    /// Replaces `path`'s content with `bytes`, atomically.
    fn write(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()>;
}

/// The real thing: [`persist::write_atomic`].
#[derive(Debug, Clone, Copy, Default)]
pub struct AtomicFile;

impl Persist for AtomicFile {
    fn write(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        persist::write_atomic(path, bytes)
    }
}

/// What a poll of the limits file found.
#[derive(Debug)]
pub enum Reload {
    /// A new, valid file is in force.
    Applied,
    /// The file changed but is invalid (or unreadable); the previous
    /// configuration stays in force.
    Rejected(ConfigError),
}

/// The configuration in force and the file it lives in.
#[derive(Debug)]
pub struct LiveConfig {
    state: AppState,
    file: Option<PathBuf>,
    shared: Option<Shared>,
    /// What readers see: the configuration in force (base values and
    /// overrides), replaced whole by writers.
    current: ArcSwap<Config>,
    /// Writers' turn-taking and their bookkeeping; never taken by readers.
    inner: Mutex<Inner>,
    reloads: ReloadMetrics,
    persist: Arc<dyn Persist>,
}

/// The store a replica's configuration lives in.
#[derive(Debug)]
struct Shared {
    config: SharedConfig,
    /// Admin writes run on blocking threads; they reach the store through
    /// the runtime's handle.
    runtime: tokio::runtime::Handle,
}

#[derive(Debug)]
struct Inner {
    /// The file's bytes as last read or written; `None` once it could not
    /// be read. A poll that finds the same bytes does nothing.
    seen: Option<Vec<u8>>,
    /// Counts changes of `seen`: a file parsed with no lock held is put in
    /// force only if nothing was written or read in between.
    seen_generation: u64,
    /// A change read once and not yet put in force: the next poll takes it
    /// if it reads the same bytes again ([`LiveConfig::poll`]).
    candidate: Option<Vec<u8>>,
    /// Why the file on disk is invalid, while it is.
    invalid: Option<String>,
    /// The stored version held (shared configuration only; 0 otherwise).
    version: u64,
}

impl LiveConfig {
    /// A configuration persisted in `file`, whose current content is
    /// `bytes` (the text `config` was parsed from).
    pub fn with_file(state: AppState, config: Config, file: PathBuf, bytes: Vec<u8>) -> Self {
        Self::build(state, config, Some(file), Some(bytes))
    }

    /// A configuration that lives only in memory: writes take effect but
    /// are lost on restart, and nothing is watched.
    pub(crate) fn in_memory(state: AppState, config: Config) -> Self {
        Self::build(state, config, None, None)
    }

    /// A replica's configuration, shared through `store` where `config` is
    /// stored as `version`; `runtime` runs the store calls of writes.
    pub(crate) fn shared(
        state: AppState,
        config: Config,
        version: u64,
        store: SharedConfig,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        let mut live = Self::build(state, config, None, None);
        live.shared = Some(Shared {
            config: store,
            runtime,
        });
        live.lock().version = version;
        live
    }

    fn build(
        state: AppState,
        config: Config,
        file: Option<PathBuf>,
        seen: Option<Vec<u8>>,
    ) -> Self {
        let live = Self {
            state,
            file,
            shared: None,
            current: ArcSwap::from_pointee(Config::default()),
            inner: Mutex::new(Inner {
                seen,
                seen_generation: 0,
                candidate: None,
                invalid: None,
                version: 0,
            }),
            reloads: ReloadMetrics::new(),
            persist: Arc::new(AtomicFile),
        };
        live.apply(config, crate::config::overrides::unix_now());
        live
    }

    /// Writes reach the disk through `persist` (tests slow it down).
    #[must_use]
    pub fn with_persist(mut self, persist: Arc<dyn Persist>) -> Self {
        self.persist = persist;
        self
    }

    /// The limits file, if there is one.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The shared state this configuration drives.
    pub(crate) fn state(&self) -> &AppState {
        &self.state
    }

    /// A copy of the configuration in force (base values and overrides).
    /// Never waits for a writer.
    pub fn config(&self) -> Config {
        Config::clone(&self.snapshot())
    }

    /// The configuration in force, shared. Never waits for a writer.
    pub(crate) fn snapshot(&self) -> Arc<Config> {
        self.current.load_full()
    }

    /// Reload counters, for `GET /metrics`.
    pub(crate) fn reload_metrics(&self) -> &ReloadMetrics {
        &self.reloads
    }

    /// Applies `change` to a copy of the configuration; if it succeeds, the
    /// copy is persisted and then put in force. If `change` fails or the
    /// file cannot be written, nothing changes. Blocks on file I/O.
    ///
    /// A hand edit of the file that the watcher has not picked up yet is
    /// picked up first, so the write does not undo it; while the file holds
    /// an invalid edit, writes are refused ([`PersistError::FileInvalid`]).
    pub fn update<T, E>(
        &self,
        now: u64,
        change: impl FnOnce(&mut Config) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<PersistError>,
    {
        if let Some(shared) = &self.shared {
            return self.update_shared(shared, now, change);
        }
        let mut inner = self.lock_current_file(now)?;
        if let Some(why) = &inner.invalid {
            return Err(PersistError::FileInvalid(why.clone()).into());
        }
        let mut config = Config::clone(&self.snapshot());
        // Expired overrides go with any write, so the file never grows them.
        config.overrides.remove_expired(now);
        let outcome = change(&mut config)?;
        if let Some(file) = &self.file {
            let bytes = config.to_yaml().map_err(PersistError::from)?.into_bytes();
            self.persist
                .write(file, &bytes)
                .map_err(|source| PersistError::Write {
                    path: file.clone(),
                    source,
                })?;
            inner.see(Some(bytes));
            inner.invalid = None;
        }
        self.apply(config, now);
        Ok(outcome)
    }

    /// The writers' lock, taken once the file on disk is the one in force
    /// (a hand edit not yet picked up is parsed first, with no lock held).
    fn lock_current_file(&self, now: u64) -> Result<MutexGuard<'_, Inner>, PersistError> {
        let Some(file) = &self.file else {
            return Ok(self.lock());
        };
        for _ in 0..3 {
            if let Some(reload) = self.refresh_from_file(now) {
                self.count(&reload);
            }
            let inner = self.lock();
            // Reading is cheap; parsing is what must not happen here.
            match std::fs::read(file) {
                Ok(bytes) if inner.seen.as_deref() == Some(bytes.as_slice()) => return Ok(inner),
                Err(_) if inner.seen.is_none() => return Ok(inner),
                _ => {}
            }
        }
        Err(PersistError::FileChanging)
    }

    /// [`Self::update`] on the shared store: under its write lock, adopt
    /// the stored version, apply `change` to it and write it back; only
    /// then put it in force here. Blocks on the store (from a blocking
    /// thread).
    fn update_shared<T, E>(
        &self,
        shared: &Shared,
        now: u64,
        change: impl FnOnce(&mut Config) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<PersistError>,
    {
        let store = &shared.config;
        // The store's lock first: waiting for another replica's write must
        // not hold this process's own lock, which reads take too.
        let lock = shared
            .runtime
            .block_on(store.lock())
            .map_err(PersistError::from)?;
        let mut inner = self.lock();
        let outcome = (|| {
            let stored = shared
                .runtime
                .block_on(store.read())
                .map_err(PersistError::from)?;
            let expected = match stored {
                Some(stored) if stored.version != inner.version => {
                    let config = parse_stored(&stored.yaml)?;
                    self.apply(config, now);
                    inner.version = stored.version;
                    stored.version
                }
                Some(stored) => stored.version,
                // An emptied store: this replica's configuration is the
                // last one known; the write restores it.
                None => 0,
            };
            let mut config = Config::clone(&self.snapshot());
            config.overrides.remove_expired(now);
            let outcome = change(&mut config)?;
            let yaml = config.to_yaml().map_err(PersistError::from)?;
            let version = shared
                .runtime
                .block_on(store.write(expected, &yaml, inner.version))
                .map_err(PersistError::from)?;
            self.apply(config, now);
            inner.version = version;
            Ok(outcome)
        })();
        drop(inner);
        shared.runtime.block_on(store.unlock(lock));
        outcome
    }

    /// With a shared store: adopts a stored version newer than the one
    /// held (every replica calls this once per control interval). Returns
    /// whether it adopted one. A stored document that does not parse is
    /// logged and left alone; the configuration in force stays.
    pub(crate) async fn sync_from_store(&self, now: u64) -> Result<bool, PersistError> {
        let Some(shared) = &self.shared else {
            return Ok(false);
        };
        let held = self.lock().version;
        match shared.config.version().await? {
            Some(version) if version != held => {}
            _ => return Ok(false),
        }
        let Some(stored) = shared.config.read().await? else {
            return Ok(false);
        };
        let config = parse_stored(&stored.yaml)?;
        let mut inner = self.lock();
        if inner.version == stored.version {
            return Ok(false);
        }
        warn_restart_only(&self.snapshot(), &config);
        self.apply(config, now);
        inner.version = stored.version;
        tracing::info!(
            version = stored.version,
            "shared configuration changed; in force"
        );
        Ok(true)
    }

    /// Whether the configuration lives in a shared store.
    pub(crate) fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Removes overrides that expired by `now` and picks up a changed file
    /// once two polls in a row read the same change (a file caught while
    /// it is being written is not put in force). Blocks on file I/O; the
    /// reload watcher calls it every poll period.
    pub fn poll(&self, now: u64) -> Option<Reload> {
        // Reload first: expiring writes the file, which must not undo an
        // edit not yet picked up.
        let reload = self.refresh_from_file(now);
        if let Some(reload) = &reload {
            self.count(reload);
        }
        let mut inner = self.lock();
        self.expire_locked(&mut inner, now);
        reload
    }

    fn count(&self, reload: &Reload) {
        match reload {
            Reload::Applied => self.reloads.success.inc(),
            Reload::Rejected(_) => self.reloads.failure.inc(),
        };
    }

    fn expire_locked(&self, inner: &mut Inner, now: u64) {
        let mut config = Config::clone(&self.snapshot());
        if !config.overrides.remove_expired(now) {
            return;
        }
        tracing::info!("overrides expired; base values apply again");
        let yaml = config.to_yaml();
        self.apply(config, now);
        let Some(file) = &self.file else { return };
        if inner.invalid.is_some() || inner.candidate.is_some() {
            // The hand edit on disk wins once it is fixed, or once the next
            // poll reads it whole.
            return;
        }
        // The expired entries are ignored on load anyway; failing to remove
        // them from the file only leaves clutter.
        let written = yaml.map_err(PersistError::from).and_then(|yaml| {
            self.persist
                .write(file, yaml.as_bytes())
                .map(|()| yaml.into_bytes())
                .map_err(|source| PersistError::Write {
                    path: file.clone(),
                    source,
                })
        });
        match written {
            Ok(bytes) => inner.see(Some(bytes)),
            Err(err) => tracing::warn!(%err, "cannot remove expired overrides from the file"),
        }
    }

    /// Picks up a changed file: read and parsed with no lock held, put in
    /// force under the writers' lock unless a write or another poll came
    /// first (then the next poll looks again).
    fn refresh_from_file(&self, now: u64) -> Option<Reload> {
        let file = self.file.as_ref()?;
        // Taken before the file is read: bytes read while a write was on
        // its way to the disk are older than what that write put in force,
        // and must not replace it.
        let generation = self.lock().seen_generation;
        let bytes = match std::fs::read(file) {
            Ok(bytes) => bytes,
            Err(source) => {
                let mut inner = self.lock();
                // Reported once, not on every poll, until it is readable again.
                inner.seen.as_ref()?;
                if inner.seen_generation != generation {
                    return None;
                }
                inner.see(None);
                let err = ConfigError::Read {
                    path: file.clone(),
                    source,
                };
                tracing::error!(%err, "cannot read the limits file; keeping the configuration in force");
                return Some(Reload::Rejected(err));
            }
        };
        {
            let mut inner = self.lock();
            if inner.seen_generation != generation {
                return None;
            }
            if inner.seen.as_deref() == Some(bytes.as_slice()) {
                // Back to what is in force: a change seen once is forgotten.
                inner.candidate = None;
                return None;
            }
            // A change is put in force once two reads in a row find the same
            // bytes. A file read while it is being rewritten in place (an
            // editor's or `echo >`'s truncate, then write) is empty or cut
            // short, and may well parse: an empty file is a valid "no
            // limits". The next read finds the whole file instead.
            if inner.candidate.as_deref() != Some(bytes.as_slice()) {
                inner.candidate = Some(bytes);
                return None;
            }
        }
        let parsed = std::str::from_utf8(&bytes)
            .map_err(|err| ConfigError::Read {
                path: file.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, err),
            })
            .and_then(|text| Config::from_yaml(text, &file.display().to_string()));
        let mut inner = self.lock();
        if inner.seen_generation != generation {
            return None;
        }
        inner.see(Some(bytes));
        match parsed {
            Ok(config) => {
                warn_restart_only(&self.snapshot(), &config);
                self.apply(config, now);
                inner.invalid = None;
                tracing::info!(file = %file.display(), "limits file reloaded");
                Some(Reload::Applied)
            }
            Err(err) => {
                tracing::error!(%err, "invalid limits file; keeping the configuration in force");
                inner.invalid = Some(err.to_string());
                Some(Reload::Rejected(err))
            }
        }
    }

    /// Puts `config` in force: the policy the control loop reads, and the
    /// snapshot readers take.
    fn apply(&self, config: Config, now: u64) {
        *self.state.policy_mut() = config.policy_at(now);
        self.current.store(Arc::new(config));
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // No code panics while holding the lock.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Inner {
    fn see(&mut self, bytes: Option<Vec<u8>>) {
        self.seen = bytes;
        self.candidate = None;
        self.seen_generation = self.seen_generation.wrapping_add(1);
    }
}

/// Every `every`, until `shutdown`: adopt a newer shared configuration and
/// drop expired overrides. A store outage is logged once, not every time.
pub(crate) async fn follow_store(
    live: std::sync::Arc<LiveConfig>,
    every: std::time::Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = ticks.tick() => {}
        }
        let now = crate::config::overrides::unix_now();
        match live.sync_from_store(now).await {
            Ok(_) if failing => {
                failing = false;
                tracing::info!("shared configuration readable again");
            }
            Ok(_) => {}
            Err(err) if !failing => {
                failing = true;
                tracing::warn!(%err, "cannot read the shared configuration; keeping the one in force");
            }
            Err(_) => {}
        }
        let _ = live.poll(now);
    }
}

/// Parses the stored document.
fn parse_stored(yaml: &str) -> Result<Config, PersistError> {
    Config::from_yaml(yaml, "<store>").map_err(|err| PersistError::StoredInvalid(err.to_string()))
}

/// The control interval and the directive TTL are fixed at start-up.
fn warn_restart_only(old: &Config, new: &Config) {
    if old.control_interval_ms != new.control_interval_ms {
        tracing::warn!("control_interval_ms changed in the file; it applies after a restart");
    }
    if old.directive_ttl_ms != new.directive_ttl_ms {
        tracing::warn!("directive_ttl_ms changed in the file; it applies after a restart");
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// `sluice_config_reloads_total{result="success"|"failure"}`, in a registry
/// of its own that `GET /metrics` appends to the main one.
#[derive(Debug)]
pub(crate) struct ReloadMetrics {
    registry: Registry,
    success: Counter,
    failure: Counter,
}

impl ReloadMetrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Changes of the limits file picked up by the watcher, by result (success or failure)",
            reloads.clone(),
        );
        Self {
            success: reloads.get_or_create_owned(&ResultLabels { result: "success" }),
            failure: reloads.get_or_create_owned(&ResultLabels { result: "failure" }),
            registry,
        }
    }

    /// The counters in OpenMetrics text, ending with `# EOF`.
    pub(crate) fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}
