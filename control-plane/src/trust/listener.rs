//! Whether the gRPC listener may serve on its address with the transport
//! it has: off loopback, only with mutual TLS unless the operator says
//! otherwise in so many words.

use std::fmt;
use std::net::SocketAddr;

/// What the listener authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// No TLS.
    Plaintext,
    /// TLS without client certificates: private, but anyone may connect.
    ServerTls,
    /// TLS with client certificates from the configured CA.
    MutualTls,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Plaintext => "plaintext",
            Self::ServerTls => "TLS without client certificates",
            Self::MutualTls => "mutual TLS",
        })
    }
}

/// Who can reach the listener and prove who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exposure {
    /// Only processes on this host can connect.
    Loopback,
    /// Off loopback, every client proves its identity with a certificate.
    Authenticated,
    /// Off loopback without client certificates, because the operator
    /// asked for it: anyone who reaches the port is trusted.
    Unauthenticated,
}

/// The listener would accept unauthenticated proxies from the network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing to serve the filters' gRPC API on {addr} over {transport}: any client reaching it could report counts and drop every tenant's traffic; pass --grpc-tls-cert, --grpc-tls-key and --grpc-tls-client-ca (mutual TLS), listen on a loopback address, or accept that risk with --grpc-insecure-accept-any-proxy"
)]
pub(crate) struct ListenerRefused {
    /// The address asked for.
    pub(crate) addr: SocketAddr,
    /// The transport it would have had.
    pub(crate) transport: Transport,
}

/// Checks the listener's address against its transport.
pub(crate) fn check_listener(
    addr: SocketAddr,
    transport: Transport,
    accept_any_proxy: bool,
) -> Result<Exposure, ListenerRefused> {
    if addr.ip().is_loopback() {
        return Ok(Exposure::Loopback);
    }
    match (transport, accept_any_proxy) {
        (Transport::MutualTls, _) => Ok(Exposure::Authenticated),
        (_, true) => Ok(Exposure::Unauthenticated),
        (transport, false) => Err(ListenerRefused { addr, transport }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn loopback_needs_nothing() {
        for a in ["127.0.0.1:50051", "[::1]:50051"] {
            assert_eq!(
                check_listener(addr(a), Transport::Plaintext, false),
                Ok(Exposure::Loopback)
            );
        }
    }

    #[test]
    fn off_loopback_needs_client_certificates_or_the_flag() {
        let any = addr("0.0.0.0:50051");
        for transport in [Transport::Plaintext, Transport::ServerTls] {
            let err = check_listener(any, transport, false).unwrap_err();
            let message = err.to_string();
            assert!(message.contains("0.0.0.0:50051"), "{message}");
            assert!(message.contains("--grpc-tls-client-ca"), "{message}");
            assert!(
                message.contains("--grpc-insecure-accept-any-proxy"),
                "{message}"
            );
            assert_eq!(
                check_listener(any, transport, true),
                Ok(Exposure::Unauthenticated)
            );
        }
        assert_eq!(
            check_listener(any, Transport::MutualTls, false),
            Ok(Exposure::Authenticated)
        );
    }
}
