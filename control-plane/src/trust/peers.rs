//! How much of the gRPC listener one peer may hold: connections per client
//! address, proxy streams per HTTP/2 connection, and under mutual TLS
//! connections per certificate identity.
//!
//! An Envoy holds one proxy stream (Sluice's or RLQS) on one of a handful
//! of connections; a client that opens a thousand streams on one
//! connection, or a thousand connections, is not an Envoy, and each stream
//! it holds costs a task, buffers and an entry in the fleet.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerLimits {
    /// Proxy streams (Sluice's and RLQS) open at once on one connection.
    pub(crate) max_streams_per_connection: usize,
    /// Connections open at once from one client address.
    pub(crate) max_connections_per_ip: usize,
    /// Under mutual TLS: connections holding a proxy stream at once for
    /// one certificate identity.
    pub(crate) max_connections_per_identity: usize,
}

impl PeerLimits {
    /// Default `max_streams_per_connection`: an Envoy opens one proxy
    /// stream, two while its leader VM changes.
    pub(crate) const DEFAULT_STREAMS_PER_CONNECTION: usize = 16;
    /// Default `max_connections_per_ip` and `max_connections_per_identity`:
    /// room for many Envoys behind one address (a NAT) or sharing one
    /// identity (every pod of an Istio deployment does).
    pub(crate) const DEFAULT_CONNECTIONS_PER_PEER: usize = 1_024;
}

impl Default for PeerLimits {
    fn default() -> Self {
        Self {
            max_streams_per_connection: Self::DEFAULT_STREAMS_PER_CONNECTION,
            max_connections_per_ip: Self::DEFAULT_CONNECTIONS_PER_PEER,
            max_connections_per_identity: Self::DEFAULT_CONNECTIONS_PER_PEER,
        }
    }
}

/// Why a proxy stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StreamsRefusal {
    /// The connection holds its maximum of proxy streams.
    #[error(
        "too many streams on this connection: {max} are open (--grpc-max-streams-per-connection); an Envoy needs one"
    )]
    PerConnection {
        /// The cap.
        max: usize,
    },
    /// The identity holds its maximum of connections.
    #[error(
        "client certificate {identity} already holds streams on {max} connections (--grpc-max-connections-per-identity)"
    )]
    PerIdentity {
        /// The identity's label.
        identity: String,
        /// The cap.
        max: usize,
    },
}

impl StreamsRefusal {
    /// The metric label.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::PerConnection { .. } => "streams_per_connection",
            Self::PerIdentity { .. } => "connections_per_identity",
        }
    }
}

/// Who holds what right now; shared by the listener and its streams.
#[derive(Debug, Default)]
pub(crate) struct PeerLedger {
    limits: PeerLimits,
    connections: Mutex<HashMap<IpAddr, usize>>,
    streams: Mutex<Streams>,
}

#[derive(Debug, Default)]
struct Streams {
    /// Proxy streams per connection (its client's address and port).
    per_connection: HashMap<SocketAddr, usize>,
    /// Per identity, the connections holding its proxy streams, and how
    /// many on each.
    per_identity: HashMap<String, HashMap<SocketAddr, usize>>,
}

impl PeerLedger {
    /// A ledger enforcing `limits`.
    pub(crate) fn new(limits: PeerLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            ..Self::default()
        })
    }

    /// The caps.
    pub(crate) fn limits(&self) -> PeerLimits {
        self.limits
    }

    /// A place for a new connection from `ip`, held until the slot drops;
    /// `None` when the address holds its maximum.
    pub(crate) fn accept(self: &Arc<Self>, ip: IpAddr) -> Option<ConnectionSlot> {
        let mut connections = lock(&self.connections);
        let held = connections.entry(ip).or_insert(0);
        if *held >= self.limits.max_connections_per_ip {
            if *held == 0 {
                connections.remove(&ip);
            }
            return None;
        }
        *held += 1;
        Some(ConnectionSlot {
            ledger: Arc::clone(self),
            ip,
        })
    }

    /// A place for a new proxy stream on `connection`, held until the slot
    /// drops; `identity` is the client certificate's label under mutual
    /// TLS. Without a known connection (not TCP) nothing is counted.
    pub(crate) fn open_stream(
        self: &Arc<Self>,
        connection: Option<SocketAddr>,
        identity: Option<&str>,
    ) -> Result<StreamSlot, StreamsRefusal> {
        let Some(connection) = connection else {
            return Ok(StreamSlot {
                ledger: Arc::clone(self),
                connection: None,
                identity: None,
            });
        };
        let mut streams = lock(&self.streams);
        let on_connection = streams
            .per_connection
            .get(&connection)
            .copied()
            .unwrap_or(0);
        if on_connection >= self.limits.max_streams_per_connection {
            return Err(StreamsRefusal::PerConnection {
                max: self.limits.max_streams_per_connection,
            });
        }
        if let Some(identity) = identity {
            let held = streams.per_identity.get(identity);
            let known = held.is_some_and(|held| held.contains_key(&connection));
            let connections = held.map_or(0, HashMap::len);
            if !known && connections >= self.limits.max_connections_per_identity {
                return Err(StreamsRefusal::PerIdentity {
                    identity: identity.to_owned(),
                    max: self.limits.max_connections_per_identity,
                });
            }
            *streams
                .per_identity
                .entry(identity.to_owned())
                .or_default()
                .entry(connection)
                .or_insert(0) += 1;
        }
        *streams.per_connection.entry(connection).or_insert(0) += 1;
        Ok(StreamSlot {
            ledger: Arc::clone(self),
            connection: Some(connection),
            identity: identity.map(str::to_owned),
        })
    }

    /// Connections open from `ip`.
    #[cfg(test)]
    pub(crate) fn connections_from(&self, ip: IpAddr) -> usize {
        lock(&self.connections).get(&ip).copied().unwrap_or(0)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks, and every update leaves the
    // maps consistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts one connection from an address until dropped.
#[derive(Debug)]
pub(crate) struct ConnectionSlot {
    ledger: Arc<PeerLedger>,
    ip: IpAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut connections = lock(&self.ledger.connections);
        if let Some(held) = connections.get_mut(&self.ip) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                connections.remove(&self.ip);
            }
        }
    }
}

/// Counts one proxy stream on a connection (and for an identity) until
/// dropped.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    ledger: Arc<PeerLedger>,
    connection: Option<SocketAddr>,
    identity: Option<String>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let Some(connection) = self.connection else {
            return;
        };
        let mut streams = lock(&self.ledger.streams);
        let Streams {
            per_connection,
            per_identity,
        } = &mut *streams;
        release(per_connection, &connection);
        if let Some(identity) = &self.identity
            && let Some(held) = per_identity.get_mut(identity)
        {
            release(held, &connection);
            if held.is_empty() {
                per_identity.remove(identity);
            }
        }
    }
}

/// One less at `key`, forgetting it at 0.
fn release(counts: &mut HashMap<SocketAddr, usize>, key: &SocketAddr) {
    if let Some(count) = counts.get_mut(key) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            counts.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn ledger(streams: usize, ips: usize, identities: usize) -> Arc<PeerLedger> {
        PeerLedger::new(PeerLimits {
            max_streams_per_connection: streams,
            max_connections_per_ip: ips,
            max_connections_per_identity: identities,
        })
    }

    #[test]
    fn connections_per_address_are_capped_and_released() {
        let ledger = ledger(16, 2, 2);
        let ip = addr(1).ip();
        let first = ledger.accept(ip).unwrap();
        let _second = ledger.accept(ip).unwrap();
        assert!(ledger.accept(ip).is_none());
        assert!(ledger.accept("10.0.0.1".parse().unwrap()).is_some());
        drop(first);
        assert_eq!(ledger.connections_from(ip), 1);
        assert!(ledger.accept(ip).is_some());
    }

    #[test]
    fn streams_per_connection_are_capped_and_released() {
        let ledger = ledger(2, 16, 16);
        let a = ledger.open_stream(Some(addr(1)), None).unwrap();
        let _b = ledger.open_stream(Some(addr(1)), None).unwrap();
        let refused = ledger.open_stream(Some(addr(1)), None).unwrap_err();
        assert_eq!(refused.reason(), "streams_per_connection");
        assert!(
            refused
                .to_string()
                .contains("--grpc-max-streams-per-connection")
        );
        // Another connection has its own.
        ledger.open_stream(Some(addr(2)), None).unwrap();
        drop(a);
        ledger.open_stream(Some(addr(1)), None).unwrap();
        // Without a TCP address nothing is counted.
        for _ in 0..10 {
            ledger.open_stream(None, None).unwrap();
        }
    }

    #[test]
    fn connections_per_identity_are_capped_and_released() {
        let ledger = ledger(16, 16, 2);
        let spiffe = "spiffe://cluster.local/ns/edge/sa/envoy";
        let a = ledger.open_stream(Some(addr(1)), Some(spiffe)).unwrap();
        let a2 = ledger.open_stream(Some(addr(1)), Some(spiffe)).unwrap();
        let _b = ledger.open_stream(Some(addr(2)), Some(spiffe)).unwrap();
        let refused = ledger.open_stream(Some(addr(3)), Some(spiffe)).unwrap_err();
        assert_eq!(refused.reason(), "connections_per_identity");
        assert!(refused.to_string().contains(spiffe));
        // Another identity, and more streams on a connection it holds.
        ledger.open_stream(Some(addr(3)), Some("other")).unwrap();
        ledger.open_stream(Some(addr(2)), Some(spiffe)).unwrap();
        // The connection is released with its last stream only.
        drop(a);
        assert!(ledger.open_stream(Some(addr(3)), Some(spiffe)).is_err());
        drop(a2);
        ledger.open_stream(Some(addr(3)), Some(spiffe)).unwrap();
    }
}
