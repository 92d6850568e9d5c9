//! The rate limit service on a listener of its own (`--rls-listen`), served
//! by threads of its own, each running a one-thread runtime.
//!
//! Why threads of its own: on the control plane's multi-threaded runtime
//! the tasks of one ShouldRateLimit call (the connection's, the call's)
//! wake one another across worker threads, which cost more CPU per call
//! than the quota itself (BENCHMARKS.md, "Rate limit service"); on one
//! thread they never leave it, and the control loop never queues behind a
//! burst of quota calls. With the counters on Redis each thread has a
//! connection of its own for the same reason. Every thread accepts from
//! the same listener and a connection stays on the thread that accepted
//! it: Envoy opens one connection per worker, so `--rls-threads` spreads
//! connections, not calls.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::thread::JoinHandle;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::ServerTlsConfig;

use super::drain::DRAIN_TIMEOUT;
use super::{KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT};
use crate::quotas::{Quotas, RateLimitGrpc};

/// Where and how the rate limit service is served apart.
#[derive(Debug)]
pub struct RlsListener {
    /// The bound listener.
    pub(crate) listener: TcpListener,
    /// Server TLS (the gRPC listener's); `None` serves plaintext.
    pub(crate) tls: Option<ServerTlsConfig>,
    /// How many threads serve it.
    pub(crate) threads: NonZeroUsize,
}

/// Why a thread of the rate limit service stopped.
#[derive(Debug, thiserror::Error)]
pub enum RlsError {
    /// The thread or its runtime could not start.
    #[error("rate limit service: cannot start a thread: {0}")]
    Start(#[source] std::io::Error),
    /// The listener could not be handed to the thread.
    #[error("rate limit service: {0}")]
    Listener(#[source] std::io::Error),
    /// The server failed.
    #[error("rate limit service: {0}")]
    Serve(#[source] tonic::transport::Error),
    /// The thread panicked.
    #[error("rate limit service: a thread panicked")]
    Panicked,
}

impl RlsListener {
    /// Starts the threads, which serve `quotas` until `shutdown` fires:
    /// a handle per thread, whose thread ends then (or when its server
    /// fails), or why that thread could not start.
    pub(crate) fn spawn(
        self,
        quotas: &Arc<Quotas>,
        shutdown: &CancellationToken,
    ) -> Vec<Result<JoinHandle<Result<(), RlsError>>, RlsError>> {
        let listener = match self.listener.into_std() {
            Ok(listener) => listener,
            Err(err) => return vec![Err(RlsError::Listener(err))],
        };
        (0..self.threads.get())
            .map(|index| {
                let listener = listener.try_clone().map_err(RlsError::Listener)?;
                let tls = self.tls.clone();
                let quotas = Arc::clone(quotas);
                let shutdown = shutdown.clone();
                std::thread::Builder::new()
                    .name(format!("sluice-rls-{index}"))
                    .spawn(move || serve_on_this_thread(listener, tls, quotas, shutdown))
                    .map_err(RlsError::Start)
            })
            .collect()
    }
}

/// One thread's runtime and server.
fn serve_on_this_thread(
    listener: std::net::TcpListener,
    tls: Option<ServerTlsConfig>,
    quotas: Arc<Quotas>,
    shutdown: CancellationToken,
) -> Result<(), RlsError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RlsError::Start)?;
    runtime.block_on(async move {
        // Registered with this thread's runtime, so its accepts wake it.
        let listener = TcpListener::from_std(listener).map_err(RlsError::Listener)?;
        // With the counters on Redis, a connection of this runtime's own:
        // its round trips then never wake another thread either.
        let connection = quotas.open_connection().await;
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).map_err(RlsError::Serve)?;
        }
        let serve = builder
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
            .add_service(RateLimitServiceServer::new(RateLimitGrpc::on_connection(
                quotas, connection,
            )))
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(listener),
                shutdown.clone().cancelled_owned(),
            );
        // What is still open after the drain closes with this runtime.
        super::drain::bounded("rate limit service", serve, &shutdown, DRAIN_TIMEOUT)
            .await
            .map_err(RlsError::Serve)
    })
}
