//! `sluice serve`: its flags, then reading the limits (and the quotas),
//! connecting to the store, checking what the listeners would expose,
//! binding, announcing (the ready file) and serving ([`super::run`]) until
//! SIGINT or SIGTERM.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Args;
use tokio::net::TcpListener;
use tonic::transport::ServerTlsConfig;

use super::grpc::GrpcEndpoint;
use super::rls_listener::RlsListener;
use super::run::{Listeners, RunError, RunOptions, run};
use super::tls::{GrpcTlsFiles, TlsError};
use crate::admin::Admin;
use crate::admin::auth::{AuthPolicy, Token, TokenError};
use crate::config::live::LiveConfig;
use crate::config::{Config, ConfigError};
use crate::fleet::{FleetCaps, ShareCap};
use crate::state::{AppState, Settings};
use crate::trust::{
    Ceilings, Exposure, HelloLimits, IdentityPolicy, IdentityRule, ListenerRefused, PeerLimits,
    Transport, check_listener,
};
use crate::types::ControlInterval;

/// `sluice serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Limits file (YAML).
    #[arg(long, value_name = "FILE")]
    pub(crate) config: PathBuf,
    /// Address for the filters' gRPC streams (port 0 picks a free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:50051")]
    pub(crate) grpc_listen: SocketAddr,
    /// Address for the admin HTTP API (port 0 picks a free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub(crate) admin_listen: SocketAddr,
    /// Control interval in milliseconds (50-60000); overrides the file.
    #[arg(long, value_name = "MS", value_parser = parse_interval)]
    pub(crate) control_interval_ms: Option<ControlInterval>,
    /// Once the listeners are bound, write `{"grpc": ADDR, "admin": ADDR}`
    /// here (and `"rls": ADDR` with `--rls-listen`).
    #[arg(long, value_name = "PATH")]
    pub(crate) ready_file: Option<PathBuf>,
    /// File holding the admin API's bearer token. Without a token (from
    /// here or `--admin-token-env`) the admin API is unauthenticated, which
    /// is only allowed on a loopback address.
    #[arg(long, value_name = "FILE", conflicts_with = "admin_token_env")]
    pub(crate) admin_token_file: Option<PathBuf>,
    /// Environment variable holding the admin API's bearer token.
    #[arg(long, value_name = "NAME")]
    pub(crate) admin_token_env: Option<String>,
    /// Let GET requests through without the token (writes still need it).
    #[arg(long)]
    pub(crate) admin_open_reads: bool,
    /// Let `GET /metrics` through without the token, for scrapers that
    /// cannot send one (its labels name buckets, tenants and proxies).
    #[arg(long)]
    pub(crate) admin_open_metrics: bool,
    /// How often the limits file is checked for changes, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub(crate) reload_poll_ms: u64,
    /// Longest start-up hold, in milliseconds: after a start, no directives
    /// are pushed until as many proxies have reported as the proxies' last
    /// directives counted, or this long (0: push from the first interval).
    #[arg(long, value_name = "MS", default_value_t = crate::serve::warmup::DEFAULT_GRACE.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub(crate) startup_grace_ms: u64,
    /// Serve gRPC over TLS with this certificate chain (PEM); needs
    /// `--grpc-tls-key`.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_key")]
    pub(crate) grpc_tls_cert: Option<PathBuf>,
    /// Private key (PEM) of `--grpc-tls-cert`.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_cert")]
    pub(crate) grpc_tls_key: Option<PathBuf>,
    /// Require proxies to present a client certificate issued by this CA
    /// (PEM): mutual TLS.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_cert")]
    pub(crate) grpc_tls_client_ca: Option<PathBuf>,
    /// With client certificates: a certificate whose URI or DNS SAN
    /// matches IDENTITY may claim a proxy_id matching PROXY_IDS (globs,
    /// `*` matches anything). Repeatable. Without any, a certificate may
    /// claim only a proxy_id equal to one of its SANs.
    #[arg(
        long = "grpc-identity",
        value_name = "IDENTITY=PROXY_IDS",
        requires = "grpc_tls_client_ca"
    )]
    pub(crate) grpc_identity: Vec<IdentityRule>,
    /// Serve the filters' gRPC API off loopback without client
    /// certificates: anyone who reaches the port can report counts and
    /// so drop any tenant's traffic. Only behind a network that already
    /// authenticates every peer.
    #[arg(long)]
    pub(crate) grpc_insecure_accept_any_proxy: bool,
    /// Most requests per second one proxy's report may claim in total;
    /// larger claims are scaled down.
    #[arg(long, value_name = "RPS", default_value_t = Ceilings::DEFAULT_MAX_RPS, value_parser = parse_positive)]
    pub(crate) max_proxy_rps: f64,
    /// Most requests per second one proxy's report may claim for one cell.
    #[arg(long, value_name = "RPS", default_value_t = Ceilings::DEFAULT_MAX_RPS, value_parser = parse_positive)]
    pub(crate) max_cell_rps: f64,
    /// In a bucket reported by 2 or more proxies, one proxy's offered rate
    /// counts at most this multiple of the median proxy's (of the other
    /// one's, with two) (0: no cap).
    #[arg(long, value_name = "MULTIPLE", default_value_t = ShareCap::DEFAULT_CAP_MULTIPLE, value_parser = parse_multiple)]
    pub(crate) proxy_share_cap: f64,
    /// Exact quotas: serve Envoy's rate limit service API
    /// (ShouldRateLimit) on the gRPC listener, configured by this file or
    /// directory in envoyproxy/ratelimit's format (hot-reloaded).
    #[arg(long, value_name = "PATH")]
    pub(crate) quotas: Option<PathBuf>,
    /// Serve the rate limit service on this address of its own instead of
    /// the gRPC listener, on threads of its own (`--rls-threads`), with
    /// the gRPC listener's TLS options (port 0 picks a free port).
    #[arg(long, value_name = "ADDR")]
    pub(crate) rls_listen: Option<SocketAddr>,
    /// With `--rls-listen`: how many threads serve it, each with the
    /// connections it accepted.
    #[arg(long, value_name = "N", default_value = "1", requires = "rls_listen")]
    pub(crate) rls_threads: std::num::NonZeroUsize,
    /// How exact quotas count and answer.
    #[command(flatten)]
    pub(crate) quota: crate::quotas::cli::QuotaArgs,
    /// Shared store: `redis://HOST:PORT[/DB]` or `rediss://…` (TLS), or one
    /// node of a Redis Cluster, `redis+cluster://HOST:PORT` (or
    /// `rediss+cluster://…`), or the sentinels of a master,
    /// `redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER[/DB]`. Every
    /// `sluice serve` given the same store is a replica of one control
    /// plane: they add up their proxies' load there, one of them (the
    /// leader) decides, and all push its directives; the quotas' counters
    /// live there too. The password comes from `--store-password-file`,
    /// else the environment variable SLUICE_STORE_PASSWORD.
    #[arg(long, value_name = "URL")]
    pub(crate) store: Option<String>,
    /// This replica's name in the store (unique among the replicas);
    /// default: the process's epoch in hex.
    #[arg(long, value_name = "NAME")]
    pub(crate) replica_id: Option<String>,
    /// With a `rediss://` store: trust this CA (PEM) instead of the
    /// system's roots.
    #[arg(long, value_name = "FILE")]
    pub(crate) store_tls_ca: Option<PathBuf>,
    /// With a `rediss://` store that authenticates clients: this client
    /// certificate (PEM; with `--store-tls-key`).
    #[arg(long, value_name = "FILE", requires = "store_tls_key")]
    pub(crate) store_tls_cert: Option<PathBuf>,
    /// The private key of `--store-tls-cert` (PEM).
    #[arg(long, value_name = "FILE", requires = "store_tls_cert")]
    pub(crate) store_tls_key: Option<PathBuf>,
    /// File holding the store's password (a trailing newline is ignored).
    #[arg(long, value_name = "FILE")]
    pub(crate) store_password_file: Option<PathBuf>,
    /// With a `redis[s]+sentinel://` store whose sentinels require a
    /// password (`requirepass` in sentinel.conf): the file holding it, else
    /// the environment variable SLUICE_STORE_SENTINEL_PASSWORD. The URL's
    /// credentials are the master's.
    #[arg(long, value_name = "FILE")]
    pub(crate) store_sentinel_password_file: Option<PathBuf>,
    /// Longest wait for the store while answering a request, in
    /// milliseconds; past it the failure policy answers.
    #[arg(long, value_name = "MS", default_value_t = crate::store::DEFAULT_TIMEOUT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(crate) store_timeout_ms: u64,
    /// With replicas: how long a replica cut off from the store keeps
    /// serving its proxies the last directives before it closes their
    /// streams so they move to a replica that reaches the store, in
    /// milliseconds. The other replicas count its proxies at their last
    /// rates meanwhile. Every replica should run the same.
    #[arg(long, value_name = "MS", default_value_t = crate::replicas::DEFAULT_STORE_GRACE.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub(crate) store_grace_ms: u64,
    /// ... and above this multiple it counts for nothing (0: never).
    #[arg(long, value_name = "MULTIPLE", default_value_t = ShareCap::DEFAULT_IGNORE_MULTIPLE, value_parser = parse_multiple)]
    pub(crate) proxy_share_ignore: f64,
    /// How long a new proxy instance is on probation, in milliseconds: its
    /// claims are weighed against the established proxies' and do not move
    /// the median they are weighed by; an implausible claim starts it
    /// again (0: no probation).
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_PROBATION_MS,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub(crate) proxy_probation_ms: u64,
    /// Most proxy streams (Sluice's and RLQS) one HTTP/2 connection may
    /// hold at once; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "N", default_value_t = PeerLimits::DEFAULT_STREAMS_PER_CONNECTION,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub(crate) grpc_max_streams_per_connection: usize,
    /// Most connections to the gRPC listener one client address may hold
    /// at once; more are closed as they are accepted.
    #[arg(long, value_name = "N", default_value_t = PeerLimits::DEFAULT_CONNECTIONS_PER_PEER,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub(crate) grpc_max_connections_per_ip: usize,
    /// With client certificates: most connections holding a proxy stream
    /// one certificate identity may have at once; streams on more are
    /// refused with RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "N", default_value_t = PeerLimits::DEFAULT_CONNECTIONS_PER_PEER,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000),
          requires = "grpc_tls_client_ca")]
    pub(crate) grpc_max_connections_per_identity: usize,
    /// Longest proxy id a Hello (or an RLQS stream's x-sluice-proxy-id)
    /// may name, in bytes; longer ones are refused with INVALID_ARGUMENT.
    #[arg(long, value_name = "BYTES", default_value_t = HelloLimits::DEFAULT_MAX_PROXY_ID_LEN,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65_536))]
    pub(crate) grpc_max_proxy_id_len: usize,
    /// Longest zone a Hello may name, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = HelloLimits::DEFAULT_MAX_ZONE_LEN,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=65_536))]
    pub(crate) grpc_max_zone_len: usize,
}

/// Default `--proxy-probation-ms`: long enough that identities made up on
/// the spot cannot outvote the fleet within a few control intervals,
/// short enough that a restarted Envoy has its say again soon.
pub(crate) const DEFAULT_PROBATION_MS: u64 = 30_000;

fn parse_positive(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err("expected a positive number".to_owned()),
    }
}

fn parse_multiple(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v == 0.0 || (v >= 1.0 && v.is_finite()) => Ok(v),
        _ => Err("expected 0 (off) or a number of at least 1".to_owned()),
    }
}

fn parse_interval(value: &str) -> Result<ControlInterval, String> {
    let ms: u64 = value.parse().map_err(|err| format!("{err}"))?;
    ControlInterval::from_millis(ms).map_err(|err| err.to_string())
}

/// Why `sluice serve` failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    /// The limits file is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The admin token could not be loaded.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// An unauthenticated admin API on a non-loopback address.
    #[error(
        "refusing an unauthenticated admin API on {0}: pass --admin-token-file or --admin-token-env, or listen on a loopback address"
    )]
    Unauthenticated(SocketAddr),
    /// The gRPC TLS files are unusable.
    #[error("gRPC TLS: {0}")]
    Tls(#[from] TlsError),
    /// The gRPC listener would trust anyone who reaches it.
    #[error(transparent)]
    Exposed(#[from] ListenerRefused),
    /// The share cap's two multiples contradict each other.
    #[error("--proxy-share-ignore ({ignore}) must be 0 or above --proxy-share-cap ({cap})")]
    ShareCap {
        /// `--proxy-share-cap`.
        cap: f64,
        /// `--proxy-share-ignore`.
        ignore: f64,
    },
    /// The signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    /// The ready file could not be written.
    #[error("cannot write ready file {}: {source}", path.display())]
    ReadyFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The shared store is unusable.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The shared configuration cannot be read or seeded.
    #[error("shared configuration: {0}")]
    SharedConfig(String),
    /// The quota directory and the limits file's `quotas:` section clash.
    #[error("{0}")]
    Quotas(String),
    /// The shared store holds state this replica cannot use.
    #[error("store {url}: {source}")]
    Replica {
        /// The store (password redacted).
        url: String,
        /// Why.
        source: crate::replicas::ReplicaError,
    },
    /// The servers failed.
    #[error(transparent)]
    Run(#[from] RunError),
}

/// `sluice serve`: load the limits, bind, announce, serve until SIGINT or
/// SIGTERM.
pub(crate) async fn serve(args: ServeArgs) -> Result<(), ServeError> {
    let text = std::fs::read_to_string(&args.config).map_err(|source| ConfigError::Read {
        path: args.config.clone(),
        source,
    })?;
    let config = Config::from_yaml(&text, &args.config.display().to_string())?;
    let mut share_cap = share_cap(&args)?;
    // Exact quotas are served with a quota directory, a `quotas:` section
    // in the limits file, or both.
    let native_quotas = config.quotas.clone();
    let quota_config = match (&args.quotas, native_quotas.is_empty()) {
        (Some(path), _) => Some(crate::quotas::QuotaConfig::load(
            path,
            args.quota.settings().load,
        )?),
        (None, false) => Some(crate::quotas::QuotaConfig::default()),
        (None, true) => None,
    };
    if args.rls_listen.is_some() && quota_config.is_none() {
        return Err(ServeError::Quotas(
            "--rls-listen serves quotas: give --quotas or a `quotas:` section in the limits file"
                .to_owned(),
        ));
    }
    // `--store` wins over `store:` in the file.
    let store_url = args
        .store
        .clone()
        .or_else(|| config.store.as_ref().map(|s| s.as_str().to_owned()));
    if store_url.is_none()
        && (args.replica_id.is_some()
            || args.store_tls_ca.is_some()
            || args.store_tls_cert.is_some()
            || args.store_password_file.is_some()
            || args.store_sentinel_password_file.is_some())
    {
        return Err(ServeError::SharedConfig(
            "--replica-id, --store-tls-ca, --store-tls-cert, --store-password-file and --store-sentinel-password-file need a store (--store or `store:` in the limits file)".to_owned(),
        ));
    }
    let store = match &store_url {
        Some(url) => Some(connect_store(url, &args).await?),
        None => None,
    };
    let quota_counters = match (&store, &quota_config) {
        (Some(store), Some(_)) => Some(crate::quotas::RedisCounters::new(store.clone()).await?),
        _ => None,
    };
    let defaults = Settings::from_config(&config, args.control_interval_ms);
    share_cap.probation_ticks = probation_ticks(args.proxy_probation_ms, defaults.control_interval);
    let settings = Settings {
        startup_grace: std::time::Duration::from_millis(args.startup_grace_ms),
        fleet_caps: FleetCaps {
            share_cap,
            ..defaults.fleet_caps
        },
        ..defaults
    };
    let auth = auth_policy(&args)?;
    let grpc_tls = grpc_tls(&args)?;
    if auth.token.is_none() && !args.admin_listen.ip().is_loopback() {
        return Err(ServeError::Unauthenticated(args.admin_listen));
    }
    let transport = match (&grpc_tls, &args.grpc_tls_client_ca) {
        (None, _) => Transport::Plaintext,
        (Some(_), None) => Transport::ServerTls,
        (Some(_), Some(_)) => Transport::MutualTls,
    };
    let exposure = check_listener(
        args.grpc_listen,
        transport,
        args.grpc_insecure_accept_any_proxy,
    )?;
    // Installed before the ready file exists: whoever reads it may signal
    // right away, and an unhandled SIGTERM would kill the process uncleanly.
    let shutdown = shutdown_signal().map_err(ServeError::Signals)?;

    let grpc = bind("gRPC", args.grpc_listen).await?;
    let admin_listener = bind("admin", args.admin_listen).await?;
    let rls_listener = match args.rls_listen {
        Some(addr) => Some((addr, bind("rate limit service", addr).await?)),
        None => None,
    };
    let grpc_addr = local_addr("gRPC", args.grpc_listen, &grpc)?;
    let admin_addr = local_addr("admin", args.admin_listen, &admin_listener)?;
    let rls_addr = match &rls_listener {
        Some((addr, listener)) => Some(local_addr("rate limit service", *addr, listener)?),
        None => None,
    };

    let state = AppState::new(settings);
    let shared_config = store
        .as_ref()
        .map(|store| crate::config::shared::SharedConfig::new(store.clone()));
    let replica = match store {
        Some(store) => {
            let url = store.url().to_string();
            let options = crate::replicas::ReplicaOptions {
                id: args
                    .replica_id
                    .clone()
                    .unwrap_or_else(|| format!("{:016x}", state.epoch())),
                control_interval: state.control_interval().as_duration(),
                store_grace: std::time::Duration::from_millis(args.store_grace_ms),
            };
            let replica = crate::replicas::Replica::join(store, options)
                .await
                .map_err(|source| ServeError::Replica {
                    url: url.clone(),
                    source,
                })?;
            tracing::info!(replica = replica.id(), store = %url, "a replica of the control plane sharing this store");
            Some(replica)
        }
        None => None,
    };
    if auth.token.is_none() {
        tracing::warn!("admin API without a token: anyone on this host can change limits");
    }
    if exposure == Exposure::Unauthenticated {
        tracing::warn!(
            grpc = %grpc_addr,
            %transport,
            "--grpc-insecure-accept-any-proxy: the filters' gRPC API accepts any client on the network; one of them can report counts that drop every tenant's traffic"
        );
    }
    let live = match shared_config {
        None => LiveConfig::with_file(
            state.clone(),
            config,
            args.config.clone(),
            text.into_bytes(),
        ),
        Some(shared) => {
            let (config, version) = shared_configuration(&shared, config, &text, &args).await?;
            LiveConfig::shared(
                state.clone(),
                config,
                version,
                shared,
                tokio::runtime::Handle::current(),
            )
        }
    };
    let quotas = match quota_config {
        Some(quota_config) => {
            let quotas = crate::quotas::Quotas::new(
                quota_config,
                args.quotas.clone(),
                args.quota.settings(),
                crate::quotas::system_clock(),
                state.metrics().quotas(),
            );
            let quotas = match quota_counters {
                Some(counters) => quotas.with_redis(counters),
                None => quotas,
            };
            quotas
                .set_native(&native_quotas)
                .map_err(ServeError::Quotas)?;
            Some(std::sync::Arc::new(quotas))
        }
        None => None,
    };
    let admin = Admin::new(std::sync::Arc::new(live), auth).with_quotas(quotas.clone());
    tracing::info!(
        grpc = %grpc_addr,
        admin = %admin_addr,
        rls = rls_addr.map(tracing::field::display),
        epoch = state.epoch(),
        control_interval_ms = state.control_interval().as_millis(),
        config = %args.config.display(),
        "listening"
    );
    if let Some(path) = &args.ready_file {
        write_ready_file(path, grpc_addr, admin_addr, rls_addr)
            .await
            .map_err(|source| ServeError::ReadyFile {
                path: path.clone(),
                source,
            })?;
    }
    let poll = std::time::Duration::from_millis(args.reload_poll_ms);
    let rls = rls_listener.map(|(_, listener)| RlsListener {
        listener,
        tls: grpc_tls.clone(),
        threads: args.rls_threads,
    });
    let grpc = GrpcEndpoint {
        listener: grpc,
        tls: grpc_tls,
        identity: (transport == Transport::MutualTls)
            .then(|| IdentityPolicy::new(args.grpc_identity.clone())),
        ceilings: Ceilings {
            max_proxy_rps: args.max_proxy_rps,
            max_cell_rps: args.max_cell_rps,
        },
        hello: HelloLimits {
            max_proxy_id_len: args.grpc_max_proxy_id_len,
            max_zone_len: args.grpc_max_zone_len,
        },
        peers: PeerLimits {
            max_streams_per_connection: args.grpc_max_streams_per_connection,
            max_connections_per_ip: args.grpc_max_connections_per_ip,
            max_connections_per_identity: args.grpc_max_connections_per_identity,
        },
        rls,
        quotas,
    };
    let options = RunOptions::new(admin).reload_poll(poll).replica(replica);
    run(Listeners::new(grpc, admin_listener), options, shutdown).await?;
    Ok(())
}

/// The configuration replicas share: the store's if it holds one (the
/// file is then not read again), else the file's, stored as version 1.
async fn shared_configuration(
    shared: &crate::config::shared::SharedConfig,
    file_config: Config,
    text: &str,
    args: &ServeArgs,
) -> Result<(Config, u64), ServeError> {
    let shared_error = |detail: String| ServeError::SharedConfig(detail);
    let stored = shared
        .seed(text)
        .await
        .map_err(|err| shared_error(format!("cannot read or seed it: {err}")))?;
    if stored.yaml == text {
        tracing::info!(version = stored.version, file = %args.config.display(), "shared configuration: this file's");
        return Ok((file_config, stored.version));
    }
    let config = Config::from_yaml(&stored.yaml, "<store>")
        .map_err(|err| shared_error(format!("the stored configuration is invalid: {err}")))?;
    tracing::info!(
        version = stored.version,
        file = %args.config.display(),
        "shared configuration from the store; the file is not read again (`sluice config import` replaces the stored one)"
    );
    Ok((config, stored.version))
}

/// Connects to `--store` (a start that cannot reach it fails, rather than
/// answering every request by the failure policy from the first one).
async fn connect_store(
    url: &str,
    args: &ServeArgs,
) -> Result<crate::store::Store, crate::store::StoreError> {
    let options = crate::store::StoreOptions::from_args(
        url,
        args.store_password_file.as_deref(),
        std::time::Duration::from_millis(args.store_timeout_ms),
    )?
    .with_tls_ca(args.store_tls_ca.clone())?
    .with_tls_client(args.store_tls_cert.clone(), args.store_tls_key.clone())?
    .with_sentinel_password(args.store_sentinel_password_file.as_deref())?;
    crate::store::Store::connect(&options).await
}

fn grpc_tls(args: &ServeArgs) -> Result<Option<ServerTlsConfig>, TlsError> {
    let (Some(cert), Some(key)) = (&args.grpc_tls_cert, &args.grpc_tls_key) else {
        return Ok(None);
    };
    let files = GrpcTlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: args.grpc_tls_client_ca.clone(),
    };
    files.load().map(Some)
}

fn share_cap(args: &ServeArgs) -> Result<ShareCap, ServeError> {
    let (cap, ignore) = (args.proxy_share_cap, args.proxy_share_ignore);
    if cap > 0.0 && ignore > 0.0 && ignore <= cap {
        return Err(ServeError::ShareCap { cap, ignore });
    }
    Ok(ShareCap {
        cap_multiple: cap,
        ignore_multiple: ignore,
        ..ShareCap::default()
    })
}

/// `--proxy-probation-ms` in control intervals, rounded up.
pub(crate) fn probation_ticks(probation_ms: u64, interval: ControlInterval) -> u32 {
    let ticks = probation_ms.div_ceil(interval.as_millis().max(1));
    u32::try_from(ticks).unwrap_or(u32::MAX)
}

fn auth_policy(args: &ServeArgs) -> Result<AuthPolicy, TokenError> {
    let token = match (&args.admin_token_file, &args.admin_token_env) {
        (Some(path), _) => Some(Token::from_file(path)?),
        (None, Some(name)) => Some(Token::from_env(name)?),
        (None, None) => None,
    };
    Ok(AuthPolicy {
        token,
        open_reads: args.admin_open_reads,
        open_metrics: args.admin_open_metrics,
    })
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { what, addr, source })
}

fn local_addr(
    what: &'static str,
    addr: SocketAddr,
    listener: &TcpListener,
) -> Result<SocketAddr, ServeError> {
    listener
        .local_addr()
        .map_err(|source| ServeError::Bind { what, addr, source })
}

/// Writes `{"grpc": "...", "admin": "..."}` (and `"rls": "..."` when the
/// rate limit service has a listener of its own) atomically: readers poll
/// for the file and must never see it half written.
pub(crate) async fn write_ready_file(
    path: &Path,
    grpc: SocketAddr,
    admin: SocketAddr,
    rls: Option<SocketAddr>,
) -> std::io::Result<()> {
    let mut body = serde_json::Map::new();
    body.insert("grpc".to_owned(), grpc.to_string().into());
    body.insert("admin".to_owned(), admin.to_string().into());
    if let Some(rls) = rls {
        body.insert("rls".to_owned(), rls.to_string().into());
    }
    let body = serde_json::Value::Object(body);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    tokio::fs::write(&tmp, body.to_string()).await?;
    tokio::fs::rename(&tmp, path).await
}

/// Completes on the first SIGINT or SIGTERM. The handlers are installed when
/// this is called, not when the future is first polled.
#[cfg(unix)]
pub(crate) fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};

    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => tracing::info!("received SIGINT"),
            _ = terminate.recv() => tracing::info!("received SIGTERM"),
        }
    })
}

/// Completes on Ctrl-C.
#[cfg(not(unix))]
pub(crate) fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    Ok(async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(%err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ready_file_is_json_with_both_addresses() {
        let dir = std::env::temp_dir().join(format!("sluice-ready-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ready.json");
        write_ready_file(
            &path,
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
            None,
        )
        .await
        .unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"grpc": "127.0.0.1:1", "admin": "127.0.0.1:2"})
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
