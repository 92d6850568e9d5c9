//! Running the control plane on listeners the caller bound: the filters'
//! gRPC server, the admin API, the control loop and the watchers, stopped
//! together by one shutdown signal.
//!
//! The caller binds (tests use port 0; `sluice serve` writes its ready
//! file before serving) and builds the admin API, which holds the
//! configuration in force and through it the shared state.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::control_loop;
use super::drain::{self, DRAIN_TIMEOUT};
use super::grpc::{self, GrpcEndpoint};
use super::rls_listener::RlsError;
use crate::admin::{Admin, admin_router};
use crate::control::controller::Controller;
use crate::replicas::Replica;
use crate::state::AppState;

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

/// The listeners [`run`] serves on, bound by the caller.
#[derive(Debug)]
pub struct Listeners {
    /// The filters' gRPC API (and with it RLQS and the exact quotas).
    pub(crate) grpc: GrpcEndpoint,
    /// The admin API.
    pub(crate) admin: TcpListener,
}

impl Listeners {
    /// `grpc` (a bare listener: plaintext, default limits) and `admin`.
    pub fn new(grpc: impl Into<GrpcEndpoint>, admin: TcpListener) -> Self {
        Self {
            grpc: grpc.into(),
            admin,
        }
    }
}

/// What [`run`] runs: the admin API (the configuration in force and the
/// shared state), how often it looks for edits of the limits file and of
/// the quota files, and whether it is one of several replicas.
#[derive(Debug)]
pub struct RunOptions {
    /// The admin API; its shared state is what the servers serve.
    pub(crate) admin: Admin,
    /// How often the limits file (if the admin API has one) and the quota
    /// files are checked for edits.
    pub(crate) reload_poll: Duration,
    /// With a replica: one of the replicas sharing a store
    /// ([`crate::replicas`]).
    pub(crate) replica: Option<Replica>,
}

impl RunOptions {
    /// `admin`, files polled every [`crate::config::reload::DEFAULT_POLL`],
    /// not a replica.
    pub fn new(admin: Admin) -> Self {
        Self {
            admin,
            reload_poll: crate::config::reload::DEFAULT_POLL,
            replica: None,
        }
    }

    /// An open admin API over `state` whose changes live in memory only.
    pub fn in_memory(state: AppState) -> Self {
        Self::new(Admin::in_memory(state))
    }

    /// Files polled every `poll`.
    #[must_use]
    pub fn reload_poll(mut self, poll: Duration) -> Self {
        self.reload_poll = poll;
        self
    }

    /// As `replica`, when there is one.
    #[must_use]
    pub(crate) fn replica(mut self, replica: Option<Replica>) -> Self {
        self.replica = replica;
        self
    }
}

/// Runs the gRPC server, the admin server, the control loop and the
/// configuration watchers until `shutdown` completes (or one of them
/// fails), then stops them all and waits for them and for every open
/// stream.
pub async fn run(
    listeners: Listeners,
    options: RunOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let Listeners {
        grpc: mut grpc_endpoint,
        admin: admin_listener,
    } = listeners;
    let RunOptions {
        admin,
        reload_poll,
        replica,
    } = options;
    let state = admin.state().clone();
    // One token stops everything: both servers, the control loop and each
    // gRPC stream task (tonic's graceful shutdown waits for open streams).
    let token = CancellationToken::new();
    let streams = TaskTracker::new();
    let mut tasks: JoinSet<(&'static str, Result<(), RunError>)> = JoinSet::new();

    tasks.spawn({
        let controller = Controller::tracking(state.control_interval());
        let run = control_loop::run(state.clone(), controller, replica, token.clone());
        async move {
            run.await;
            ("control loop", Ok(()))
        }
    });
    if let Some(quotas) = grpc_endpoint.quotas.as_ref() {
        tasks.spawn({
            let live = Arc::clone(admin.live());
            let section = move || live.config().quotas;
            let watch =
                crate::quotas::watch(Arc::clone(quotas), section, reload_poll, token.clone());
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
        let serve = grpc::serve(grpc_endpoint, state.clone(), streams.clone(), token.clone());
        let token = token.clone();
        async move {
            let serve = drain::bounded("gRPC", serve, &token, DRAIN_TIMEOUT);
            ("gRPC server", serve.await.map_err(RunError::Grpc))
        }
    });
    if admin.live().is_shared() {
        tasks.spawn({
            let sync = crate::config::live::follow_store(
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
            let watch =
                crate::config::reload::run(Arc::clone(admin.live()), reload_poll, token.clone());
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
            let serve = drain::bounded("admin", serve, &token, DRAIN_TIMEOUT);
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
