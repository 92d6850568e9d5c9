//! One handle on the store, whether it is a single server or a Redis
//! Cluster: callers issue the same commands, scripts and pipelines through
//! it. Every call's keys share one hash tag (`{fleet}`, `{q:<domain>}`), so
//! a cluster routes each call, scripts and pipelines included, to the one
//! node that owns its slot.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::sentinel::SentinelConnection;

/// A connection to the store; cheap to clone (clones share it).
#[derive(Clone)]
pub enum StoreConnection {
    /// One server, reconnecting by itself.
    Single(ConnectionManager),
    /// A Redis Cluster: the client follows the slots and reconnects to
    /// each node by itself.
    Cluster(ClusterConnection),
    /// The master Redis Sentinel names, followed across failovers.
    Sentinel(SentinelConnection),
}

impl ConnectionLike for StoreConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(connection) => connection.req_packed_command(cmd),
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
            Self::Single(connection) => connection.req_packed_commands(pipeline, offset, count),
            Self::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
            Self::Sentinel(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(connection) => connection.get_db(),
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
