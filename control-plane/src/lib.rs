//! Sluice control plane.
//!
//! Envoy proxies running the Sluice filter open one gRPC stream each
//! ([`grpc`]), report per-bucket request counts, and receive drop ratios.
//! Every control interval ([`control_loop`]) the per-proxy rates are summed
//! over the fleet ([`fleet`]), compared with the limits ([`limits`]) and turned
//! into directives ([`controller`]); the ones that changed are broadcast to
//! every stream ([`push`]). Operators read and change limits through the admin
//! API ([`admin`]), which also serves Prometheus [`metrics`].
//!
//! [`run`] wires these together on listeners the caller has bound, which lets
//! tests use port 0 and lets the binary write its ready file before serving.

pub mod admin;
pub mod cli;
pub mod config;
pub mod control_loop;
pub mod controller;
pub mod estimator;
pub mod fleet;
pub mod grpc;
pub mod limits;
pub mod metrics;
pub mod policy;
pub mod push;
pub mod simulate;
pub mod state;
pub mod types;

use std::future::Future;

use tokio::net::TcpListener;
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use admin::router;
pub use config::{Config, ConfigError};
pub use controller::Controller;
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
    /// A component stopped although no shutdown was requested.
    #[error("{0} stopped unexpectedly")]
    Stopped(&'static str),
    /// A component panicked.
    #[error("task failed: {0}")]
    Task(#[source] JoinError),
}

/// Runs the gRPC server, the admin server and the control loop until
/// `shutdown` completes (or one of them fails), then stops all three and
/// waits for them and for every open stream.
pub async fn run(
    grpc_listener: TcpListener,
    admin_listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    // One token stops everything: both servers, the control loop and each
    // gRPC stream task (tonic's graceful shutdown waits for open streams).
    let token = CancellationToken::new();
    let streams = TaskTracker::new();
    let mut tasks: JoinSet<(&'static str, Result<(), RunError>)> = JoinSet::new();

    tasks.spawn({
        // The tracking policy beats the proportional baseline in every
        // simulated scenario (`sluice simulate`); see `estimator`.
        let controller = Controller::new(estimator::Tracking::new());
        let run = control_loop::run(state.clone(), controller, token.clone());
        async move {
            run.await;
            ("control loop", Ok(()))
        }
    });
    tasks.spawn({
        let serve = grpc::serve(grpc_listener, state.clone(), streams.clone(), token.clone());
        async move { ("gRPC server", serve.await.map_err(RunError::Grpc)) }
    });
    tasks.spawn({
        let serve = axum::serve(admin_listener, router(state))
            .with_graceful_shutdown(token.clone().cancelled_owned());
        async move { ("admin server", serve.await.map_err(RunError::Admin)) }
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
