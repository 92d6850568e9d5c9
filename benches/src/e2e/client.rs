//! A closed-loop HTTP/1.1 load client: `concurrency` keep-alive connections,
//! each sending its next request as soon as the previous answer is read,
//! until `requests` answers are in. It uses hyper's connection API directly
//! rather than a pooled client, so the client spends as little CPU per
//! request as possible on the shared machine. Every request of a run is the
//! same: a `GET /`, or a streamed chat completion whose answer is read to
//! its end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Either, Empty, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use sluice_integration_tests::token_fleet::OUTPUT_TOKENS_HEADER;
use tokio::net::TcpStream;

/// The header the benchmark's bucket key is built from, and its value.
pub const TENANT_HEADER: &str = "x-tenant";
/// The one bucket every request falls into.
pub const BUCKET: &str = "bench";
/// One request may take at most this long (a stuck Envoy fails the run).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The output tokens every streamed completion asks the fake upstream for:
/// in its chunks of 16 tokens, 32 content events and 4 others (the role,
/// the finish, the usage, `[DONE]`), as in the `usage_parser` criterion
/// bench.
pub const STREAMED_OUTPUT_TOKENS: u64 = 500;
/// Where a streamed completion is asked for.
const CHAT_PATH: &str = "/v1/chat/completions";
/// The body of every streamed completion: OpenAI's API with the usage in
/// the stream's last chunk.
const CHAT_BODY: &str = r#"{"model":"bench","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}"#;

/// What every request of a run asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// `GET /`.
    Get,
    /// `POST` of `CHAT_BODY` to `CHAT_PATH`, asking the fake LLM
    /// upstream for [`STREAMED_OUTPUT_TOKENS`] output tokens (its
    /// `x-output-tokens` header): the same stream every time.
    StreamedChat,
}

type RequestBody = Either<Empty<Bytes>, Full<Bytes>>;

impl Ask {
    fn request(self) -> Result<Request<RequestBody>> {
        let request = match self {
            Ask::Get => Request::get("/")
                .header(hyper::header::HOST, "bench.local")
                .header(TENANT_HEADER, BUCKET)
                .body(Either::Left(Empty::new())),
            Ask::StreamedChat => Request::post(CHAT_PATH)
                .header(hyper::header::HOST, "bench.local")
                .header(TENANT_HEADER, BUCKET)
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .header(OUTPUT_TOKENS_HEADER, STREAMED_OUTPUT_TOKENS)
                .body(Either::Right(Full::new(Bytes::from_static(
                    CHAT_BODY.as_bytes(),
                )))),
        };
        request.context("cannot build the request")
    }
}

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

/// Sends `requests` requests as `ask` says to `addr` over `concurrency`
/// connections.
pub async fn run(
    addr: SocketAddr,
    requests: usize,
    concurrency: usize,
    ask: Ask,
) -> Result<LoadOutcome> {
    let remaining = Arc::new(AtomicUsize::new(requests));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        tasks.spawn(connection(addr, remaining.clone(), ask));
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

async fn connection(
    addr: SocketAddr,
    remaining: Arc<AtomicUsize>,
    ask: Ask,
) -> Result<LoadOutcome> {
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
        let request = ask.request()?;
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
