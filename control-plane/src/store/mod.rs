//! The shared store's connection settings.
//!
//! `sluice serve --store redis://HOST:PORT[/DB]` (or `rediss://` for TLS)
//! names a Redis server that several control-plane processes can share;
//! `redis+cluster://HOST:PORT` (or `rediss+cluster://`) names one node of a
//! Redis Cluster instead ([`connection`]), and
//! `redis+sentinel://HOST:PORT[,…]/MASTER` (or `rediss+sentinel://`) the
//! sentinels of a master ([`sentinel`]).
//! Today it holds the exact quotas' counters
//! ([`crate::quotas::redis_store`]); what else the fleet shares (counts,
//! directives, configuration) is meant to use the same [`Store`] handle
//! and its own keys beside them.
//!
//! The password comes from `--store-password-file` or the environment
//! variable `SLUICE_STORE_PASSWORD` (or the URL itself); the URL is only
//! ever shown with its password redacted.

pub(crate) mod connection;
pub(crate) mod keys;
pub(crate) mod sentinel;
pub(crate) mod url;

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::{Client, ConnectionInfo, IntoConnectionInfo, TlsCertificates};

pub(crate) use connection::StoreConnection;
pub use keys::Keys;
pub(crate) use url::{StoreSetting, StoreUrl, UrlError};

/// Default bound on one store call on a request path.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// Bound on opening a connection (at start and on every reconnect).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Environment variable holding the store's password.
pub(crate) const PASSWORD_ENV: &str = "SLUICE_STORE_PASSWORD";
/// Environment variable holding the sentinels' own password (their
/// `requirepass`), for a `redis[s]+sentinel://` store.
pub(crate) const SENTINEL_PASSWORD_ENV: &str = "SLUICE_STORE_SENTINEL_PASSWORD";

/// How to reach the store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Where (its password shown redacted).
    pub(crate) url: StoreUrl,
    /// Bound on one call made while answering a request.
    pub(crate) timeout: Duration,
    /// `rediss://` only: trust this CA (PEM) instead of the system's roots.
    pub(crate) tls_ca: Option<PathBuf>,
    /// `rediss://` only: present this client certificate and key (PEM),
    /// for a server that authenticates clients (`tls-auth-clients yes`).
    pub(crate) tls_client: Option<ClientCert>,
    /// `redis[s]+sentinel://` only: the sentinels' own password (the URL's
    /// credentials are the master's).
    pub(crate) sentinel_password: Option<String>,
}

/// A client certificate and its private key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientCert {
    /// The certificate (chain).
    pub(crate) cert: PathBuf,
    /// Its private key.
    pub(crate) key: PathBuf,
}

/// Why the store cannot be used; every message names the redacted URL.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// `--store` does not parse.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// `--store-tls-ca` with a `redis://` URL.
    #[error("--store-tls-ca needs a rediss:// store URL, not {url}")]
    CaWithoutTls {
        /// The redacted URL.
        url: String,
    },
    /// `--store-tls-cert`/`--store-tls-key` with a `redis://` URL, or only
    /// one of them.
    #[error("{reason}")]
    ClientCert {
        /// What is wrong.
        reason: String,
    },
    /// A TLS file (`--store-tls-ca`, `-cert`, `-key`) cannot be read.
    #[error("store TLS file {path}: {source}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `--store-sentinel-password-file` with a store that is not behind
    /// sentinels.
    #[error(
        "--store-sentinel-password-file needs a redis+sentinel:// or rediss+sentinel:// store URL, not {url}"
    )]
    SentinelPasswordWithoutSentinel {
        /// The redacted URL.
        url: String,
    },
    /// `--store-password-file` cannot be read.
    #[error("store password file {path}: {source}")]
    PasswordFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The server cannot be reached or refuses the connection.
    #[error("cannot connect to the store at {url}: {reason}")]
    Connect {
        /// The redacted URL.
        url: String,
        /// Why (the client's message, which holds no password).
        reason: String,
    },
}

impl StoreOptions {
    /// Options from `--store`, with the password from `password_file`, else
    /// from `SLUICE_STORE_PASSWORD`, else from the URL.
    pub fn from_args(
        url: &str,
        password_file: Option<&Path>,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let mut url = StoreUrl::parse(url)?;
        let password = match password_file {
            Some(path) => Some(read_password(path)?),
            None => std::env::var(PASSWORD_ENV).ok().filter(|p| !p.is_empty()),
        };
        if password.is_some() {
            url.password = password;
        }
        Ok(Self {
            url,
            timeout,
            tls_ca: None,
            tls_client: None,
            sentinel_password: None,
        })
    }

    /// The sentinels' password for a `redis[s]+sentinel://` store: from
    /// `file`, else from `SLUICE_STORE_SENTINEL_PASSWORD`. A file given for
    /// another kind of store is an error; the variable is then ignored.
    pub(crate) fn with_sentinel_password(
        mut self,
        file: Option<&Path>,
    ) -> Result<Self, StoreError> {
        let sentinel = matches!(self.url.topology, url::Topology::Sentinel { .. });
        self.sentinel_password = match file {
            Some(_) if !sentinel => {
                return Err(StoreError::SentinelPasswordWithoutSentinel {
                    url: self.url.to_string(),
                });
            }
            Some(path) => Some(read_password(path)?),
            None if sentinel => std::env::var(SENTINEL_PASSWORD_ENV)
                .ok()
                .filter(|p| !p.is_empty()),
            None => None,
        };
        Ok(self)
    }

    /// Presents a client certificate to a `rediss://` store; `cert` and
    /// `key` come together.
    pub(crate) fn with_tls_client(
        mut self,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> Result<Self, StoreError> {
        let fail = |reason: String| Err(StoreError::ClientCert { reason });
        self.tls_client = match (cert, key) {
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return fail("--store-tls-cert and --store-tls-key go together".to_owned());
            }
            (Some(_), Some(_)) if !self.url.tls => {
                return fail(format!(
                    "--store-tls-cert needs a rediss:// store URL, not {}",
                    self.url
                ));
            }
            (Some(cert), Some(key)) => Some(ClientCert { cert, key }),
        };
        Ok(self)
    }

    /// Trusts `ca` (PEM) for a `rediss://` store.
    pub(crate) fn with_tls_ca(mut self, ca: Option<PathBuf>) -> Result<Self, StoreError> {
        if ca.is_some() && !self.url.tls {
            return Err(StoreError::CaWithoutTls {
                url: self.url.to_string(),
            });
        }
        self.tls_ca = ca;
        Ok(self)
    }
}

/// The client's message, with where to look when sentinels refused it:
/// their password is not the master's.
fn explain(url: &StoreUrl, err: &redis::RedisError) -> String {
    let refused = matches!(err.code(), Some("NOAUTH" | "WRONGPASS"))
        || err.kind() == redis::ErrorKind::AuthenticationFailed;
    if refused && matches!(url.topology, url::Topology::Sentinel { .. }) {
        format!(
            "{err} (the URL's credentials are the master's; the sentinels' own password \
             comes from --store-sentinel-password-file or {SENTINEL_PASSWORD_ENV})"
        )
    } else {
        err.to_string()
    }
}

fn read_password(path: &Path) -> Result<String, StoreError> {
    let text = std::fs::read_to_string(path).map_err(|source| StoreError::PasswordFile {
        path: path.to_path_buf(),
        source,
    })?;
    // Files written by `echo` end in a newline that is not part of it.
    Ok(text.trim_end_matches(['\r', '\n']).to_owned())
}

/// A connected store: one multiplexed connection that reconnects by
/// itself; cheap to clone.
#[derive(Clone)]
pub struct Store {
    url: StoreUrl,
    client: StoreClient,
    connection: StoreConnection,
    timeout: Duration,
}

/// What opens connections: to one server, or to a cluster's nodes.
#[derive(Clone)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per store handle, built once at start"
)]
enum StoreClient {
    Single(Client),
    Cluster(ClusterClient),
    Sentinel(sentinel::SentinelSettings),
}

impl StoreClient {
    /// A connection whose calls fail past `response_timeout`.
    async fn connect(
        &self,
        response_timeout: Duration,
    ) -> Result<StoreConnection, redis::RedisError> {
        let response_timeout = response_timeout.max(Duration::from_millis(1));
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(response_timeout))
            // One attempt per reconnect: calls wait on a reconnect in
            // flight, so retries with a backoff would hold them all until
            // the store timeout. The connection's gate answers calls at
            // once while the server is known down, and lets a reconnect
            // through now and then.
            .set_number_of_retries(0);
        match self {
            Self::Single(client) => ConnectionManager::new_with_config(client.clone(), config)
                .await
                .map(|manager| StoreConnection::Single(connection::Gated::new(manager))),
            Self::Sentinel(settings) => {
                sentinel::SentinelConnection::connect(settings.clone(), config)
                    .await
                    .map(StoreConnection::Sentinel)
            }
            Self::Cluster(client) => {
                let config = ClusterConfig::new()
                    .set_connection_timeout(CONNECT_TIMEOUT)
                    .set_response_timeout(response_timeout);
                client
                    .get_async_connection_with_config(config)
                    .await
                    .map(StoreConnection::Cluster)
            }
        }
    }
}

/// The client for `url`: credentials, TLS files and, for a cluster, the
/// node the others are found from.
fn client_for(
    url: &StoreUrl,
    info: ConnectionInfo,
    certificates: Option<TlsCertificates>,
    sentinel_password: Option<&str>,
) -> Result<StoreClient, redis::RedisError> {
    if let url::Topology::Sentinel { service, .. } = &url.topology {
        return Ok(StoreClient::Sentinel(sentinel::SentinelSettings {
            sentinels: url.sentinels(),
            tls: url.tls,
            certificates,
            sentinel_password: sentinel_password.map(str::to_owned),
            service: service.clone(),
            master: info.redis_settings().clone().set_db(url.db),
        }));
    }
    if !url.is_cluster() {
        return match certificates {
            None => Client::open(info),
            Some(certificates) => Client::build_with_tls(info, certificates),
        }
        .map(StoreClient::Single);
    }
    let mut builder = ClusterClientBuilder::new(vec![info])
        // A call is retried on another node only within its own bound.
        .retries(1);
    if let Some(user) = &url.username {
        builder = builder.username(user);
    }
    if let Some(password) = &url.password {
        builder = builder.password(password);
    }
    if let Some(certificates) = certificates {
        builder = builder.certs(certificates);
    }
    builder.build().map(StoreClient::Cluster)
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Connects and checks the server answers (`PING`), within a bounded
    /// time.
    pub async fn connect(options: &StoreOptions) -> Result<Self, StoreError> {
        let url = &options.url;
        let fail = |reason: String| StoreError::Connect {
            url: url.to_string(),
            reason,
        };
        let mut redis_settings = url
            .without_credentials()
            .into_connection_info()
            .map_err(|err| fail(err.to_string()))?;
        let mut settings = redis_settings.redis_settings().clone();
        if let Some(user) = &url.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &url.password {
            settings = settings.set_password(password);
        }
        redis_settings = redis_settings.set_redis_settings(settings);
        let certificates = if options.tls_ca.is_none() && options.tls_client.is_none() {
            None
        } else {
            let read = |path: &PathBuf| {
                std::fs::read(path).map_err(|source| StoreError::CaFile {
                    path: path.clone(),
                    source,
                })
            };
            let root_cert = options.tls_ca.as_ref().map(read).transpose()?;
            let client_tls = match &options.tls_client {
                Some(client) => Some(redis::ClientTlsConfig {
                    client_cert: read(&client.cert)?,
                    client_key: read(&client.key)?,
                }),
                None => None,
            };
            Some(TlsCertificates {
                client_tls,
                root_cert,
            })
        };
        let client = client_for(
            url,
            redis_settings,
            certificates,
            options.sentinel_password.as_deref(),
        )
        .map_err(|err| fail(err.to_string()))?;
        // The shared connection answers requests' quota checks: a call past
        // `--store-timeout-ms` fails (and the connection notices a dead
        // server at once). Callers with a longer bound take their own
        // connection ([`Store::connection_bounded`]).
        let connect = async {
            let mut connection = client.connect(options.timeout).await?;
            redis::cmd("PING")
                .query_async::<String>(&mut connection)
                .await?;
            Ok::<_, redis::RedisError>(connection)
        };
        let connection = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| fail(format!("no answer within {CONNECT_TIMEOUT:?}")))?
            .map_err(|err| fail(explain(url, &err)))?;
        tracing::info!(store = %url, cluster = url.is_cluster(), timeout_ms = options.timeout.as_millis(), "store connected");
        Ok(Self {
            url: url.clone(),
            client,
            connection,
            timeout: options.timeout,
        })
    }

    /// A connection of its own whose calls fail past `timeout` rather than
    /// the request bound (a replica's exchanges get half a control
    /// interval); it reconnects by itself like the shared one.
    pub(crate) async fn connection_bounded(
        &self,
        timeout: Duration,
    ) -> Result<StoreConnection, redis::RedisError> {
        self.client.connect(timeout).await
    }

    /// The URL, its password redacted when shown.
    pub(crate) fn url(&self) -> &StoreUrl {
        &self.url
    }

    /// Whether the store is a Redis Cluster (a call's keys must share a
    /// slot).
    pub(crate) fn is_cluster(&self) -> bool {
        self.url.is_cluster()
    }

    /// The bound on one call made while answering a request.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A handle on the connection (clones share it).
    pub fn connection(&self) -> StoreConnection {
        self.connection.clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_password_file_wins_and_loses_its_newline_but_never_shows() {
        let path = std::env::temp_dir().join(format!("sluice-store-pw-{}", std::process::id()));
        std::fs::write(&path, "from-file\n").unwrap();
        let options =
            StoreOptions::from_args("redis://:in-url@h:1", Some(&path), DEFAULT_TIMEOUT).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(options.url.password.as_deref(), Some("from-file"));
        assert!(!format!("{options:?}").contains("from-file"));
        assert_eq!(options.url.to_string(), "redis://:***@h:1/0");
    }

    #[test]
    fn a_ca_needs_tls() {
        let plain = StoreOptions::from_args("redis://h:1", None, DEFAULT_TIMEOUT).unwrap();
        let err = plain.with_tls_ca(Some("ca.pem".into())).unwrap_err();
        assert!(err.to_string().contains("needs a rediss://"), "{err}");
        let tls = StoreOptions::from_args("rediss://h:1", None, DEFAULT_TIMEOUT).unwrap();
        assert!(tls.with_tls_ca(Some("ca.pem".into())).is_ok());
    }

    #[test]
    fn a_sentinel_password_is_for_sentinels_only() {
        let file =
            std::env::temp_dir().join(format!("sluice-sentinel-password-{}", std::process::id()));
        std::fs::write(&file, "s3cret\n").unwrap();
        let plain = StoreOptions::from_args("redis://h:1", None, DEFAULT_TIMEOUT).unwrap();
        let err = plain.with_sentinel_password(Some(&file)).unwrap_err();
        assert!(err.to_string().contains("redis+sentinel://"), "{err}");
        for url in ["redis+sentinel://h:1/main", "rediss+sentinel://h:1/main"] {
            let options = StoreOptions::from_args(url, None, DEFAULT_TIMEOUT)
                .unwrap()
                .with_sentinel_password(Some(&file))
                .unwrap();
            assert_eq!(options.sentinel_password.as_deref(), Some("s3cret"));
        }
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn a_client_certificate_needs_tls_and_its_key() {
        let plain = StoreOptions::from_args("redis://h:1", None, DEFAULT_TIMEOUT).unwrap();
        let err = plain
            .with_tls_client(Some("c.pem".into()), Some("k.pem".into()))
            .unwrap_err();
        assert!(err.to_string().contains("needs a rediss://"), "{err}");
        let tls = || StoreOptions::from_args("rediss://h:1", None, DEFAULT_TIMEOUT).unwrap();
        let err = tls()
            .with_tls_client(Some("c.pem".into()), None)
            .unwrap_err();
        assert!(err.to_string().contains("go together"), "{err}");
        let both = tls()
            .with_tls_client(Some("c.pem".into()), Some("k.pem".into()))
            .unwrap();
        assert!(both.tls_client.is_some());
    }
}
