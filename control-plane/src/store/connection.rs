//! One handle on the store, whether it is a single server or a Redis
//! Cluster: callers issue the same commands, scripts and pipelines through
//! it. Every call's keys share one hash tag (`{fleet}`, a descriptor's),
//! so a cluster routes each call, scripts and pipelines included, to the
//! one node that owns its slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

use super::sentinel::SentinelConnection;

/// How long calls are refused at once after the server was found down
/// (then one call tries to reconnect).
const DOWN_FOR: Duration = Duration::from_millis(100);

/// A single server's connection that answers calls at once, with an error,
/// for [`DOWN_FOR`] after a call found the server down (refused, dropped,
/// unreachable), instead of letting each wait on a reconnect.
#[derive(Clone)]
pub struct Gated {
    manager: ConnectionManager,
    /// When the gate was made: the origin of `down_until_us`.
    origin: Instant,
    /// Microseconds after `origin` until which calls are refused (0: open).
    down_until_us: Arc<AtomicU64>,
}

impl Gated {
    /// A gate over `manager`, open.
    pub(crate) fn new(manager: ConnectionManager) -> Self {
        Self {
            manager,
            origin: Instant::now(),
            down_until_us: Arc::new(AtomicU64::new(0)),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Whether calls are refused now.
    fn closed(&self) -> bool {
        self.now_us() < self.down_until_us.load(Ordering::Relaxed)
    }

    /// Notes the outcome of a call: a server found down closes the gate (a
    /// slow one does not: it may answer the next call).
    fn note<T>(&self, result: &Result<T, RedisError>) {
        if let Err(err) = result
            && !err.is_timeout()
            && (err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal())
        {
            let until = self
                .now_us()
                .saturating_add(u64::try_from(DOWN_FOR.as_micros()).unwrap_or(u64::MAX));
            self.down_until_us.store(until, Ordering::Relaxed);
        }
    }

    fn refused() -> RedisError {
        RedisError::from((
            ErrorKind::Io,
            "the store is down",
            "a call found it down less than 100 ms ago".to_owned(),
        ))
    }
}

/// A connection to the store; cheap to clone (clones share it).
#[derive(Clone)]
pub enum StoreConnection {
    /// One server, reconnecting by itself.
    Single(Gated),
    /// A Redis Cluster: the client follows the slots and reconnects to
    /// each node by itself.
    Cluster(ClusterConnection),
    /// The master Redis Sentinel names, followed across failovers.
    Sentinel(SentinelConnection),
}

impl ConnectionLike for StoreConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(gated) => {
                if gated.closed() {
                    return Box::pin(async { Err(Gated::refused()) });
                }
                Box::pin(async move {
                    let result = gated.manager.req_packed_command(cmd).await;
                    gated.note(&result);
                    result
                })
            }
            Self::Cluster(connection) => connection.req_packed_command(cmd),
            Self::Sentinel(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(gated) => {
                if gated.closed() {
                    return Box::pin(async { Err(Gated::refused()) });
                }
                Box::pin(async move {
                    let result = gated
                        .manager
                        .req_packed_commands(pipeline, offset, count)
                        .await;
                    gated.note(&result);
                    result
                })
            }
            Self::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
            Self::Sentinel(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(gated) => gated.manager.get_db(),
            Self::Cluster(connection) => connection.get_db(),
            Self::Sentinel(connection) => connection.get_db(),
        }
    }
}

impl std::fmt::Debug for StoreConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "StoreConnection::Single",
            Self::Cluster(_) => "StoreConnection::Cluster",
            Self::Sentinel(_) => "StoreConnection::Sentinel",
        })
    }
}
