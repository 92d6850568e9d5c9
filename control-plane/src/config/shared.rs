//! The configuration replicas share: one versioned YAML document in the
//! store (the limits file's format), changed under a short lock and a
//! version check, read by every replica each control interval.
//!
//! An admin write on any replica takes the lock, reads the document,
//! applies the change (and its `If-Match` precondition) to what it read,
//! and writes it back only if the version is still the one it read. The
//! lock serialises writers, so two writes under the same `If-Match` see
//! each other and the second gets 412; the version check catches a writer
//! whose lock expired while it was paused. Without the store nothing is
//! written and the write fails: no replica's memory ever holds a change the
//! store does not.

use std::time::Duration;

use redis::Script;

use crate::store::Store;
use crate::store::keys::Keys;

/// How long a writer may hold the lock.
const LOCK_TTL: Duration = Duration::from_secs(5);
/// How long a writer waits for the lock before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// Bound on one store call.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// Why the shared configuration could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SharedConfigError {
    /// The store did not answer in time.
    #[error("the store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store answered with an error or the connection is down.
    #[error("store: {0}")]
    Store(#[from] redis::RedisError),
    /// Another writer held the lock for longer than a writer waits.
    #[error("another replica is writing the configuration; retry")]
    Busy,
    /// The version changed under the lock (a writer whose lock expired).
    #[error("the configuration changed during the write; retry")]
    Conflict,
}

/// The stored document and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    /// Incremented by every write; 1 for the first.
    pub(crate) version: u64,
    /// The limits file's YAML.
    pub(crate) yaml: String,
}

/// A held write lock; give it back with [`SharedConfig::unlock`].
#[derive(Debug)]
#[must_use]
pub(crate) struct WriteLock(String);

/// The shared configuration's keys in one store; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct SharedConfig {
    store: Store,
    document: String,
    version: String,
    lock: String,
}

/// Writes the document if the version is still the expected one.
/// KEYS: document, version; ARGV: expected version, YAML, floor.
/// The new version is above both the stored one and the floor (the
/// highest the writer has seen), so a store that lost its data never
/// hands out a version a replica already holds.
/// Returns the new version, or 0 when the version moved.
const WRITE: &str = r"
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current ~= tonumber(ARGV[1]) then
  return 0
end
local version = math.max(current, tonumber(ARGV[3])) + 1
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], version)
return version
";

/// Deletes the lock if it is still the caller's.
const UNLOCK: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

impl SharedConfig {
    /// The shared configuration in `store`.
    pub(crate) fn new(store: Store) -> Self {
        let keys = Keys::default();
        Self {
            store,
            document: keys.config,
            version: keys.config_version,
            lock: keys.config_lock,
        }
    }

    /// The version alone (one small read): `None` while nothing is stored.
    pub(crate) async fn version(&self) -> Result<Option<u64>, SharedConfigError> {
        let mut connection = self.store.connection();
        bounded(
            redis::cmd("GET")
                .arg(&self.version)
                .query_async(&mut connection),
        )
        .await
    }

    /// The document and its version, `None` while nothing is stored.
    pub(crate) async fn read(&self) -> Result<Option<Stored>, SharedConfigError> {
        let mut connection = self.store.connection();
        let (yaml, version): (Option<String>, Option<u64>) = bounded(
            redis::cmd("MGET")
                .arg(&self.document)
                .arg(&self.version)
                .query_async(&mut connection),
        )
        .await?;
        Ok(match (yaml, version) {
            (Some(yaml), Some(version)) => Some(Stored { version, yaml }),
            _ => None,
        })
    }

    /// Stores `yaml` as version 1 unless a document is stored already;
    /// returns what is stored after.
    pub(crate) async fn seed(&self, yaml: &str) -> Result<Stored, SharedConfigError> {
        let lock = self.lock().await?;
        let outcome = async {
            if let Some(stored) = self.read().await? {
                return Ok(stored);
            }
            let version = self.write(0, yaml, 0).await?;
            Ok(Stored {
                version,
                yaml: yaml.to_owned(),
            })
        }
        .await;
        self.unlock(lock).await;
        outcome
    }

    /// Takes the write lock, waiting up to two seconds for another writer.
    pub(crate) async fn lock(&self) -> Result<WriteLock, SharedConfigError> {
        let token = format!(
            "{:016x}{:016x}",
            crate::state::random_epoch(),
            crate::state::random_epoch()
        );
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        loop {
            let mut connection = self.store.connection();
            let taken: Option<String> = bounded(
                redis::cmd("SET")
                    .arg(&self.lock)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(u64::try_from(LOCK_TTL.as_millis()).unwrap_or(u64::MAX))
                    .query_async(&mut connection),
            )
            .await?;
            if taken.is_some() {
                return Ok(WriteLock(token));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(SharedConfigError::Busy);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Gives the lock back; if the store cannot be reached, it expires.
    pub(crate) async fn unlock(&self, lock: WriteLock) {
        let mut connection = self.store.connection();
        let release = Script::new(UNLOCK);
        let mut invocation = release.prepare_invoke();
        invocation.key(&self.lock).arg(&lock.0);
        if let Err(err) = bounded(invocation.invoke_async::<u8>(&mut connection)).await {
            tracing::warn!(%err, "could not release the configuration lock; it expires by itself");
        }
    }

    /// Writes `yaml` if the stored version is `expected` (0: nothing
    /// stored); returns the new version, above `floor` too.
    pub(crate) async fn write(
        &self,
        expected: u64,
        yaml: &str,
        floor: u64,
    ) -> Result<u64, SharedConfigError> {
        let mut connection = self.store.connection();
        let script = Script::new(WRITE);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(&self.document)
            .key(&self.version)
            .arg(expected)
            .arg(yaml)
            .arg(floor);
        match bounded(invocation.invoke_async::<u64>(&mut connection)).await? {
            0 => Err(SharedConfigError::Conflict),
            version => Ok(version),
        }
    }
}

async fn bounded<T>(
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, SharedConfigError> {
    Ok(tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| SharedConfigError::Timeout(CALL_TIMEOUT))??)
}
