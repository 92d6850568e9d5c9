//! A closed-loop HTTP/1.1 load client: `concurrency` keep-alive connections,
//! each sending its next request as soon as the previous answer is read,
//! until `requests` answers are in. It uses hyper's connection API directly
//! rather than a pooled client, so the client spends as little CPU per
//! request as possible on the shared machine.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The header the benchmark's bucket key is built from, and its value.
pub const TENANT_HEADER: &str = "x-tenant";
/// The one bucket every request falls into.
pub const BUCKET: &str = "bench";
/// One request may take at most this long (a stuck Envoy fails the run).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What one load run saw.
#[derive(Debug, Clone, Default)]
pub struct LoadOutcome {
    /// Wall time from the first request to the last answer.
    pub elapsed: Duration,
    /// Latency of every request, in microseconds.
    pub latencies_us: Vec<u32>,
    /// Answers with status 200.
    pub ok: u64,
    /// Answers with status 429 (dropped by Sluice).
    pub limited: u64,
    /// Any other status.
    pub other: u64,
}

/// Sends `requests` GETs to `addr` over `concurrency` connections.
pub async fn run(addr: SocketAddr, requests: usize, concurrency: usize) -> Result<LoadOutcome> {
    let remaining = Arc::new(AtomicUsize::new(requests));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        tasks.spawn(connection(addr, remaining.clone()));
    }
    let mut total = LoadOutcome {
        latencies_us: Vec::with_capacity(requests),
        ..LoadOutcome::default()
    };
    while let Some(joined) = tasks.join_next().await {
        let part = joined.context("load task failed")??;
        total.latencies_us.extend(part.latencies_us);
        total.ok += part.ok;
        total.limited += part.limited;
        total.other += part.other;
    }
    total.elapsed = started.elapsed();
    Ok(total)
}

async fn connection(addr: SocketAddr, remaining: Arc<AtomicUsize>) -> Result<LoadOutcome> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_nodelay(true).context("cannot set TCP_NODELAY")?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP/1.1 handshake failed")?;
    let driver = tokio::spawn(conn);
    let mut outcome = LoadOutcome::default();
    // Claim one request at a time so the connections share the fixed count.
    while remaining
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
    {
        let request = Request::get("/")
            .header(hyper::header::HOST, "bench.local")
            .header(TENANT_HEADER, BUCKET)
            .body(Empty::<Bytes>::new())
            .context("cannot build the request")?;
        let sent = Instant::now();
        let response = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let response = sender.send_request(request).await?;
            let status = response.status();
            response.into_body().collect().await?;
            Ok::<_, hyper::Error>(status)
        })
        .await
        .context("request timed out")?
        .context("request failed")?;
        let micros = u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX);
        outcome.latencies_us.push(micros);
        match response.as_u16() {
            200 => outcome.ok += 1,
            429 => outcome.limited += 1,
            _ => outcome.other += 1,
        }
    }
    drop(sender);
    driver.abort();
    Ok(outcome)
}
