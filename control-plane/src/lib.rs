//! Sluice control plane.
//!
//! Envoy proxies running the Sluice filter open one gRPC stream each
//! (`serve::grpc`), report per-bucket request counts, and receive drop
//! ratios. Every control interval ([`serve::control_loop`]) the per-proxy
//! rates are summed over the fleet ([`fleet`]), compared with the limits
//! ([`config::limits`]) and turned into directives ([`control`]); the ones
//! that changed are broadcast to every stream (`serve::push`). Operators
//! read and change limits through the admin API ([`admin`]), which also
//! serves Prometheus [`metrics`], persists every change to the limits file
//! ([`config::live`]) and picks up edits of that file (`config::reload`);
//! `sluice ctl` (`ctl`) is its command-line client. With a shared store
//! ([`store`]) several processes run as [`replicas`] of one control plane.
//! The same listener serves Envoy's own APIs: RLQS (`rlqs`) and the rate
//! limit service for exact quotas ([`quotas`]); `trust` bounds what one
//! proxy can claim.
//!
//! The modules, by job: [`config`] (the limits file and the configuration
//! in force), [`control`] (deciding), [`serve`] (streams, fan-out, the
//! control loop), [`fleet`] (aggregation), [`replicas`] and [`store`]
//! (running as several processes), [`admin`], [`metrics`], [`cli`],
//! `ctl` and `simulate` (tools).
//!
//! [`run`] wires these together on listeners the caller has bound, which lets
//! tests use port 0 and lets the binary write its ready file before serving.

// The library's public surface is what the binary, the benchmarks, the
// fuzzers and the integration tests use; the rest is `pub(crate)` so that
// dead code shows. Its docs link into the private modules and are meant to
// be read with `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub mod admin;
pub(crate) mod cell;
pub mod cli;
pub mod config;
pub mod control;
#[cfg(feature = "ctl")]
pub(crate) mod ctl;
pub mod fleet;
pub mod metrics;
pub mod quotas;
pub mod replicas;
pub(crate) mod rlqs;
pub mod serve;
#[cfg(feature = "simulate")]
pub(crate) mod simulate;
pub(crate) mod state;
pub mod store;
pub(crate) mod trust;
pub mod types;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use admin::{Admin, admin_router, router};
pub use config::{Config, ConfigError};
pub use control::controller::Controller;
pub use serve::drain::DRAIN_TIMEOUT;
pub use serve::grpc::GrpcEndpoint;
pub use serve::rls_listener::{RlsError, RlsListener};
pub use state::{AppState, Settings};

/// Why [`run`] returned an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Grpc(#[source] tonic::transport::Error),
    /// The admin server failed.
    #[error("admin server: {0}")]
    Admin(#[source] std::io::Error),
    /// The rate limit service's own listener failed.
    #[error(transparent)]
    Rls(#[from] RlsError),
    /// A component stopped although no shutdown was requested.
    #[error("{0} stopped unexpectedly")]
    Stopped(&'static str),
    /// A component panicked.
    #[error("task failed: {0}")]
    Task(#[source] JoinError),
}

/// Runs the gRPC server, the admin server and the control loop until
/// `shutdown` completes (or one of them fails), then stops all three and
/// waits for them and for every open stream. The admin API is open and its
/// changes live in memory; [`run_with`] serves a limits file.
pub async fn run(
    grpc_listener: impl Into<GrpcEndpoint>,
    admin_listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    run_with(
        grpc_listener,
        admin_listener,
        Admin::in_memory(state),
        config::reload::DEFAULT_POLL,
        shutdown,
    )
    .await
}

/// Like [`run`], with a configured admin API; if it has a limits file, the
/// file is also watched every `reload_poll`.
pub async fn run_with(
    grpc_listener: impl Into<GrpcEndpoint>,
    admin_listener: TcpListener,
    admin: Admin,
    reload_poll: Duration,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    run_replicated(
        grpc_listener,
        admin_listener,
        admin,
        reload_poll,
        None,
        shutdown,
    )
    .await
}

/// Like [`run_with`]; with `replica`, as one of the replicas sharing a
/// store ([`replicas`]).
pub async fn run_replicated(
    grpc_listener: impl Into<GrpcEndpoint>,
    admin_listener: TcpListener,
    admin: Admin,
    reload_poll: Duration,
    replica: Option<replicas::Replica>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let state = admin.state().clone();
    // One token stops everything: both servers, the control loop and each
    // gRPC stream task (tonic's graceful shutdown waits for open streams).
    let token = CancellationToken::new();
    let streams = TaskTracker::new();
    let mut tasks: JoinSet<(&'static str, Result<(), RunError>)> = JoinSet::new();

    tasks.spawn({
        let controller = Controller::tracking(state.control_interval());
        let run = serve::control_loop::run(state.clone(), controller, replica, token.clone());
        async move {
            run.await;
            ("control loop", Ok(()))
        }
    });
    let mut grpc_endpoint: GrpcEndpoint = grpc_listener.into();
    if let Some(quotas) = grpc_endpoint.quotas.as_ref() {
        tasks.spawn({
            let live = Arc::clone(admin.live());
            let section = move || live.config().quotas;
            let watch = quotas::watch(Arc::clone(quotas), section, reload_poll, token.clone());
            async move {
                watch.await;
                ("quota configuration watcher", Ok(()))
            }
        });
    }
    // Quotas served on a listener of their own leave the gRPC listener's.
    if let Some(rls) = grpc_endpoint.rls.take() {
        match grpc_endpoint.quotas.take() {
            Some(quotas) => {
                for thread in rls.spawn(&quotas, &token) {
                    tasks.spawn(async move {
                        // A thread that could not start fails as a task
                        // does: everything else stops in order.
                        let outcome = match thread {
                            Ok(thread) => {
                                match tokio::task::spawn_blocking(move || thread.join()).await {
                                    Ok(Ok(outcome)) => outcome.map_err(RunError::Rls),
                                    Ok(Err(_panic)) => Err(RunError::Rls(RlsError::Panicked)),
                                    Err(err) => Err(RunError::Task(err)),
                                }
                            }
                            Err(err) => Err(RunError::Rls(err)),
                        };
                        ("rate limit service", outcome)
                    });
                }
            }
            None => tracing::warn!("a rate limit service listener without quotas serves nothing"),
        }
    }
    tasks.spawn({
        let serve =
            serve::grpc::serve(grpc_endpoint, state.clone(), streams.clone(), token.clone());
        let token = token.clone();
        async move {
            let serve = serve::drain::bounded("gRPC", serve, &token, DRAIN_TIMEOUT);
            ("gRPC server", serve.await.map_err(RunError::Grpc))
        }
    });
    if admin.live().is_shared() {
        tasks.spawn({
            let sync = config::live::follow_store(
                Arc::clone(admin.live()),
                state.control_interval().as_duration(),
                token.clone(),
            );
            async move {
                sync.await;
                ("shared configuration watcher", Ok(()))
            }
        });
    }
    if admin.live().file().is_some() {
        tasks.spawn({
            let watch = config::reload::run(Arc::clone(admin.live()), reload_poll, token.clone());
            async move {
                watch.await;
                ("limits file watcher", Ok(()))
            }
        });
    }
    tasks.spawn({
        let serve = axum::serve(admin_listener, admin_router(admin))
            .with_graceful_shutdown(token.clone().cancelled_owned())
            .into_future();
        let token = token.clone();
        async move {
            let serve = serve::drain::bounded("admin", serve, &token, DRAIN_TIMEOUT);
            ("admin server", serve.await.map_err(RunError::Admin))
        }
    });

    let mut result = Ok(());
    tokio::select! {
        () = shutdown => tracing::info!("shutting down"),
        Some(joined) = tasks.join_next() => {
            // Before shutdown nothing may stop, not even successfully.
            let err = match joined {
                Ok((name, Ok(()))) => RunError::Stopped(name),
                Ok((_, Err(err))) => err,
                Err(err) => RunError::Task(err),
            };
            tracing::error!(%err, "shutting down after a failure");
            result = Err(err);
        }
    }
    token.cancel();

    while let Some(joined) = tasks.join_next().await {
        let outcome = match joined {
            Ok((_, outcome)) => outcome,
            Err(err) => Err(RunError::Task(err)),
        };
        if let Err(err) = outcome {
            tracing::error!(%err, "error during shutdown");
            if result.is_ok() {
                result = Err(err);
            }
        }
    }
    streams.close();
    streams.wait().await;
    tracing::info!("stopped");
    result
}
