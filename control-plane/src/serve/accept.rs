//! The gRPC listener's accept loop: a connection from an address that
//! already holds its maximum (`--grpc-max-connections-per-ip`) is closed
//! as it is accepted, before any TLS or HTTP/2 work; the others are
//! counted until they close.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::{Stream, StreamExt, wrappers::TcpListenerStream};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::state::AppState;
use crate::trust::{ConnectionSlot, PeerLedger, RefusalLog};

/// A connection counted against its address while it is open.
#[derive(Debug)]
pub(crate) struct CountedConnection {
    io: TcpStream,
    _slot: ConnectionSlot,
}

/// The connections `listener` accepts, those over the per-address cap
/// closed at once, counted and logged (once per address at warning
/// level).
pub(crate) fn limited(
    listener: TcpListener,
    peers: Arc<PeerLedger>,
    state: AppState,
) -> impl Stream<Item = io::Result<CountedConnection>> {
    let refusals = RefusalLog::default();
    TcpListenerStream::new(listener).filter_map(move |accepted| {
        let io = match accepted {
            Ok(io) => io,
            Err(err) => return Some(Err(err)),
        };
        // Without a peer address there is nothing to count it against.
        let ip = io
            .peer_addr()
            .map_or(IpAddr::from([0, 0, 0, 0]), |addr| addr.ip());
        match peers.accept(ip) {
            Some(slot) => Some(Ok(CountedConnection { io, _slot: slot })),
            None => {
                state.metrics().connection_refused("per_ip");
                let max = peers.limits().max_connections_per_ip;
                if refusals.first(&ip.to_string()) {
                    tracing::warn!(%ip, max, "closing a connection: the address already holds its maximum (--grpc-max-connections-per-ip)");
                } else {
                    tracing::debug!(%ip, max, "closing a connection: the address already holds its maximum");
                }
                None
            }
        }
    })
}

impl Connected for CountedConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for CountedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::state::Settings;
    use crate::trust::PeerLimits;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn connections_over_the_cap_are_closed_as_they_are_accepted() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let peers = PeerLedger::new(PeerLimits {
            max_connections_per_ip: 2,
            ..PeerLimits::default()
        });
        let state = AppState::new(Settings::from_config(
            &crate::config::Config::from_yaml("limits: []\n", "limits.yaml").unwrap(),
            None,
        ));
        let incoming = limited(listener, Arc::clone(&peers), state.clone());
        tokio::pin!(incoming);
        let a = TcpStream::connect(addr).await.unwrap();
        let first = incoming.next().await.unwrap().unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        let _second = incoming.next().await.unwrap().unwrap();
        assert_eq!(first.connect_info().remote_addr, a.local_addr().ok());
        // The third is closed unseen; the fourth waits for a free place.
        let mut third = TcpStream::connect(addr).await.unwrap();
        let next = tokio::time::timeout(std::time::Duration::from_millis(200), incoming.next());
        assert!(next.await.is_err(), "nothing over the cap is yielded");
        let mut byte = [0_u8; 1];
        assert_eq!(third.read(&mut byte).await.unwrap(), 0, "closed");
        let exposition = state.metrics().encode().unwrap();
        assert!(
            exposition.contains(r#"sluice_connections_refused_total{reason="per_ip"} 1"#),
            "{exposition}"
        );
        drop(first);
        let _d = TcpStream::connect(addr).await.unwrap();
        let _fourth = incoming.next().await.unwrap().unwrap();
        assert_eq!(peers.connections_from(addr.ip()), 2);
    }
}
