//! A TCP proxy on an ephemeral loopback port that can cut the path to its
//! target: a network partition between one process and a server (here, one
//! control-plane replica and Redis) without root or network namespaces.
//!
//! While cut, open connections are closed and new ones are accepted and
//! closed at once. Closing (rather than holding connections silently) is
//! what a client sees of a partition after its TCP keepalive or request
//! timeout; it gets there at once instead of after those timers, which
//! keeps the test short, and the client's own reconnect loop then fails
//! until [`FaultProxy::heal`].

use std::net::SocketAddr;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A running proxy; dropping it stops it and every connection it holds.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to
    /// `target`.
    pub async fn start(target: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the fault proxy")?;
        let addr = listener.local_addr()?;
        let (cut, cut_changes) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(listener, target, cut_changes));
        Ok(Self { addr, cut, accept })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every connection and refuses new ones until [`Self::heal`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards again.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept task owns the connections' JoinSet: aborting it drops
        // the set, which aborts every connection task.
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, cut: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors or the like: nothing to forward.
            break;
        };
        while connections.try_join_next().is_some() {}
        if *cut.borrow() {
            drop(client);
            continue;
        }
        let mut cut = cut.clone();
        connections.spawn(async move {
            let mut client = client;
            let Ok(mut upstream) = TcpStream::connect(target).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                _ = cut.wait_for(|cut| *cut) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn forwards_cuts_and_heals() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap();
        let server = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = echo.accept().await else {
                    break;
                };
                tokio::spawn(async move {
                    let mut buffer = [0_u8; 64];
                    while let Ok(n) = socket.read(&mut buffer).await {
                        if n == 0 || socket.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = FaultProxy::start(target).await.unwrap();
        let round_trip = |addr| async move {
            let mut stream = TcpStream::connect(addr).await.ok()?;
            stream.write_all(b"ping").await.ok()?;
            let mut reply = [0_u8; 4];
            stream.read_exact(&mut reply).await.ok()?;
            Some(reply)
        };
        assert_eq!(round_trip(proxy.addr()).await, Some(*b"ping"));
        let mut held = TcpStream::connect(proxy.addr()).await.unwrap();
        held.write_all(b"x").await.unwrap();
        let mut one = [0_u8; 1];
        held.read_exact(&mut one).await.unwrap();
        proxy.cut();
        assert_eq!(
            round_trip(proxy.addr()).await,
            None,
            "new connections closed"
        );
        let mut rest = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            held.read_to_end(&mut rest),
        )
        .await
        .unwrap();
        assert!(
            matches!(read, Ok(0)) || read.is_err(),
            "open connection closed"
        );
        proxy.heal();
        assert_eq!(round_trip(proxy.addr()).await, Some(*b"ping"));
        server.abort();
    }
}
