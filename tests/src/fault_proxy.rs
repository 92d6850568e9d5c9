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
//!
//! It can also slow the path: with [`FaultProxy::delay`] every chunk from
//! the client waits that long before it is forwarded (a slow server or a
//! long link, as the client sees it).

use std::net::SocketAddr;

use anyhow::{Context, Result};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A running proxy; dropping it stops it and every connection it holds.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    delay: watch::Sender<Duration>,
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
        let (delay, delays) = watch::channel(Duration::ZERO);
        let accept = tokio::spawn(accept_loop(listener, target, cut_changes, delays));
        Ok(Self {
            addr,
            cut,
            delay,
            accept,
        })
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

    /// Holds every chunk from a client for `delay` before forwarding it
    /// (zero: forward at once).
    pub fn delay(&self, delay: Duration) {
        self.delay.send_replace(delay);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept task owns the connections' JoinSet: aborting it drops
        // the set, which aborts every connection task.
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    cut: watch::Receiver<bool>,
    delay: watch::Receiver<Duration>,
) {
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
        let delay = delay.clone();
        connections.spawn(async move {
            let Ok(upstream) = TcpStream::connect(target).await else {
                return;
            };
            let (client_read, mut client_write) = client.into_split();
            let (mut upstream_read, upstream_write) = upstream.into_split();
            tokio::select! {
                () = forward_delayed(client_read, upstream_write, delay) => {}
                _ = tokio::io::copy(&mut upstream_read, &mut client_write) => {}
                _ = cut.wait_for(|cut| *cut) => {}
            }
        });
    }
}

/// Copies `from` to `to`, holding each chunk for the current delay.
async fn forward_delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: watch::Receiver<Duration>,
) {
    let mut buffer = vec![0_u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let hold = *delay.borrow();
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        let Some(chunk) = buffer.get(..read) else {
            return;
        };
        if to.write_all(chunk).await.is_err() {
            return;
        }
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
