//! An HTTP/1.1 upstream with a capacity: it serves `capacity` requests per
//! second one after another, queues the rest up to a bound (so latency
//! grows with the queue, as a saturated service's does) and answers 503 at
//! once when the queue is full. The capacity can change while it runs, to
//! model an upstream that loses half its instances.
//!
//! The server is deterministic (each request takes `1 / capacity` of one
//! server's time, in arrival order), so a test can predict what it sees:
//! below capacity, latency is `base_latency + 1 / capacity`; above it, the
//! queue fills, latency approaches `queue / capacity` and the excess gets
//! 503s.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::http_server;
use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What the upstream can take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    /// Requests served per second.
    pub rps: f64,
    /// Requests that may wait; one more gets a 503.
    pub queue: u32,
    /// Added to every request's time (fixed work, the network): a request
    /// that does not wait takes `base_latency + 1 / rps`.
    pub base_latency: Duration,
}

/// Counts of what the upstream answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// Answered 200.
    pub ok: u64,
    /// Answered 503 (queue full).
    pub rejected: u64,
}

#[derive(Debug)]
struct Server {
    capacity: Capacity,
    /// When the server is next free.
    free_at: Instant,
    served: Served,
}

/// A running capped upstream; dropping it stops it.
#[derive(Debug)]
pub struct CappedUpstream {
    addr: SocketAddr,
    server: Arc<Mutex<Server>>,
    accept: JoinHandle<()>,
}

impl CappedUpstream {
    /// Listens on a free loopback port.
    pub async fn start(capacity: Capacity) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the capped upstream")?;
        let addr = listener.local_addr()?;
        let server = Arc::new(Mutex::new(Server {
            capacity,
            free_at: Instant::now(),
            served: Served::default(),
        }));
        let accept = {
            let server = Arc::clone(&server);
            tokio::spawn(http_server::serve(listener, move |request| {
                answer(Arc::clone(&server), request)
            }))
        };
        Ok(Self {
            addr,
            server,
            accept,
        })
    }

    /// Where Envoy sends requests.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes the capacity from now on (requests already queued keep
    /// their place).
    pub fn set_capacity(&self, capacity: Capacity) {
        lock(&self.server).capacity = capacity;
    }

    /// What it answered so far.
    pub fn served(&self) -> Served {
        lock(&self.server).served
    }
}

impl Drop for CappedUpstream {
    fn drop(&mut self) {
        // The accept task owns the connections: aborting it ends them.
        self.accept.abort();
    }
}

fn lock(server: &Mutex<Server>) -> std::sync::MutexGuard<'_, Server> {
    server.lock().unwrap_or_else(PoisonError::into_inner)
}

/// When a request arriving at `now` is done, or `None` if the queue is
/// full.
fn admit(server: &mut Server, now: Instant) -> Option<Instant> {
    let capacity = server.capacity;
    let service = Duration::from_secs_f64(1.0 / capacity.rps.max(0.001));
    let start = server.free_at.max(now);
    let waiting = start.saturating_duration_since(now).as_secs_f64() * capacity.rps;
    if waiting > f64::from(capacity.queue) {
        server.served.rejected += 1;
        return None;
    }
    server.free_at = start + service;
    server.served.ok += 1;
    Some(start + service + capacity.base_latency)
}

async fn answer(
    server: Arc<Mutex<Server>>,
    _request: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let done = admit(&mut lock(&server), Instant::now());
    let Some(done) = done else {
        let mut response = Response::new(Full::new(Bytes::from_static(b"queue full")));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        return Ok(response);
    };
    tokio::time::sleep_until(done).await;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(rps: f64, queue: u32) -> Server {
        Server {
            capacity: Capacity {
                rps,
                queue,
                base_latency: Duration::from_millis(5),
            },
            free_at: Instant::now(),
            served: Served::default(),
        }
    }

    #[test]
    fn under_capacity_nothing_waits_over_it_the_queue_fills_then_rejects() {
        let mut upstream = server(100.0, 10);
        let start = Instant::now();
        // One request every 20 ms at 100 rps capacity: no waiting.
        for i in 0..10 {
            let now = start + Duration::from_millis(20 * i);
            let done = admit(&mut upstream, now).unwrap();
            assert_eq!(done - now, Duration::from_millis(15), "service and base");
        }
        // 30 at once: 11 are taken (one served, ten queued), 19 rejected,
        // and the last one taken waits for the ten before it.
        let burst = start + Duration::from_secs(1);
        let taken: Vec<Instant> = (0..30)
            .filter_map(|_| admit(&mut upstream, burst))
            .collect();
        assert_eq!(taken.len(), 11);
        assert_eq!(upstream.served.rejected, 19);
        let last = taken.last().copied().unwrap();
        assert_eq!(last - burst, Duration::from_millis(115));
    }

    #[tokio::test]
    async fn serves_http_and_follows_a_capacity_change() {
        let capacity = Capacity {
            rps: 1_000.0,
            queue: 0,
            base_latency: Duration::ZERO,
        };
        let upstream = CappedUpstream::start(capacity).await.unwrap();
        let client = reqwest::Client::new();
        let url = format!("http://{}/", upstream.addr());
        let first = client.get(&url).send().await.unwrap();
        assert_eq!(first.status(), 200);
        upstream.set_capacity(Capacity {
            rps: 0.5,
            ..capacity
        });
        // 2 s per request now, and no queue: the next two at once cannot
        // both be taken.
        let (a, b) = tokio::join!(client.get(&url).send(), client.get(&url).send());
        let statuses = [a.unwrap().status(), b.unwrap().status()];
        assert!(
            statuses.contains(&StatusCode::SERVICE_UNAVAILABLE),
            "{statuses:?}"
        );
        assert!(upstream.served().rejected >= 1);
    }
}
