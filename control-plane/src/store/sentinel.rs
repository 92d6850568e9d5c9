//! A store behind Redis Sentinel: the master's address is asked of the
//! sentinels at start, and again (in the background) whenever a call fails
//! the way a failover makes calls fail: the old master gone (I/O errors,
//! refused connections, timeouts) or demoted to a replica (`READONLY`).
//! Until the new master is found, calls fail and their callers apply their
//! failure policy, as for a single server that is down.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use tokio::task::JoinHandle;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, Pipeline, RedisError, RedisFuture, RedisResult, TlsCertificates, TlsMode,
    Value,
};

/// Where the sentinels are and what they are asked.
#[derive(Clone)]
pub(crate) struct SentinelSettings {
    /// Every sentinel's host and port, tried in order.
    pub(crate) sentinels: Vec<(String, u16)>,
    /// TLS to the sentinels and to the master (`rediss+sentinel://`).
    pub(crate) tls: bool,
    /// The CA to trust and the client certificate to present, to the
    /// sentinels and the master alike; `None`: the system's roots.
    pub(crate) certificates: Option<TlsCertificates>,
    /// The sentinels' own password (their `requirepass`), if they have one.
    pub(crate) sentinel_password: Option<String>,
    /// The master's name in the sentinels' configuration.
    pub(crate) service: String,
    /// The master's credentials and database.
    pub(crate) master: redis::RedisConnectionInfo,
}

/// Shows no password and no certificate.
impl std::fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelSettings")
            .field("sentinels", &self.sentinels)
            .field("tls", &self.tls)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

/// A connection to the current master; cheap to clone (clones share it
/// and see the same master).
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    settings: SentinelSettings,
    config: ConnectionManagerConfig,
    /// The master's address (as the sentinels name it) and a connection to
    /// it.
    current: RwLock<(String, ConnectionManager)>,
    /// The lookup under way, if any: failures meanwhile start no other.
    lookup: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(lookup) = self
            .lookup
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            lookup.abort();
        }
    }
}

impl SentinelConnection {
    /// Asks the sentinels for the master and connects to it.
    pub(crate) async fn connect(
        settings: SentinelSettings,
        config: ConnectionManagerConfig,
    ) -> RedisResult<Self> {
        let (address, client) = find_master(&settings).await?;
        let connection = connect(client, &config).await?;
        tracing::info!(service = %settings.service, master = %address, "store master found by the sentinels");
        Ok(Self {
            shared: Arc::new(Shared {
                settings,
                config,
                current: RwLock::new((address, connection)),
                lookup: Mutex::new(None),
            }),
        })
    }

    /// The connection to the master as last found.
    fn current(&self) -> ConnectionManager {
        self.shared
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }

    /// After a failed call: looks the master up again if the failure says
    /// it may have moved (one lookup at a time, in the background).
    fn after(&self, error: &RedisError) {
        let moved = error.is_io_error()
            || error.is_connection_refusal()
            || error.is_connection_dropped()
            || error.is_timeout()
            || error.code() == Some("READONLY");
        if !moved {
            return;
        }
        let mut lookup = self
            .shared
            .lookup
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if lookup.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let shared = Arc::clone(&self.shared);
        *lookup = Some(tokio::spawn(async move { shared.look_up().await }));
    }
}

impl Shared {
    async fn look_up(&self) {
        // Sentinels take a moment to agree on a new master: a few tries,
        // a little apart, within a bounded time.
        for _ in 0..LOOKUP_ATTEMPTS {
            match self.follow().await {
                Ok(()) => return,
                Err(err) => {
                    tracing::warn!(service = %self.settings.service, %err, "the sentinels name no reachable master yet");
                }
            }
            tokio::time::sleep(LOOKUP_PAUSE).await;
        }
    }

    /// Asks the sentinels once; connects to the master they name only if
    /// it is not the one in use (a slow master is not replaced by itself).
    async fn follow(&self) -> RedisResult<()> {
        let (address, client) = find_master(&self.settings).await?;
        let from = {
            let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
            if current.0 == address {
                return Ok(());
            }
            current.0.clone()
        };
        let connection = connect(client, &self.config).await?;
        tracing::warn!(service = %self.settings.service, %from, to = %address, "store master moved: following it");
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = (address, connection);
        Ok(())
    }
}

/// Lookups after one failed call.
const LOOKUP_ATTEMPTS: u32 = 20;
/// Between two lookups.
const LOOKUP_PAUSE: Duration = Duration::from_millis(250);

/// Bound on asking the sentinels (who check the master they name answers
/// as one), and on connecting to it.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

fn too_slow(what: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::Io, what))
}

/// The master the sentinels name now: its address and a client for it.
async fn find_master(settings: &SentinelSettings) -> RedisResult<(String, redis::Client)> {
    let ask = async {
        let sentinels = settings.sentinels.iter().map(|(host, port)| {
            if settings.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        });
        let master = &settings.master;
        let mut builder =
            SentinelClientBuilder::new(sentinels, &settings.service, SentinelServerType::Master)?
                .set_client_to_redis_db(master.db());
        if let Some(user) = master.username() {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = master.password() {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(password) = &settings.sentinel_password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if settings.tls {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(certificates) = &settings.certificates {
                builder = builder
                    .set_client_to_redis_certificates(certificates.clone())
                    .set_client_to_sentinel_certificates(certificates.clone());
            }
        }
        builder.build()?.async_get_client().await
    };
    let client = tokio::time::timeout(LOOKUP_TIMEOUT, ask)
        .await
        .map_err(|_| too_slow("no sentinel named a reachable master in time"))??;
    let address = client.get_connection_info().addr().to_string();
    Ok((address, client))
}

/// A reconnecting connection to `client`'s server.
async fn connect(
    client: redis::Client,
    config: &ConnectionManagerConfig,
) -> RedisResult<ConnectionManager> {
    tokio::time::timeout(
        LOOKUP_TIMEOUT,
        ConnectionManager::new_with_config(client, config.clone()),
    )
    .await
    .map_err(|_| too_slow("the master did not accept a connection in time"))?
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.current().req_packed_command(cmd).await;
            if let Err(error) = &result {
                self.after(error);
            }
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self
                .current()
                .req_packed_commands(pipeline, offset, count)
                .await;
            if let Err(error) = &result {
                self.after(error);
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.settings.master.db()
    }
}
