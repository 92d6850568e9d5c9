//! Simulated filter streams: each is its own tonic client on its own HTTP/2
//! connection, says Hello, sends a Report of its buckets every interval and
//! records every directive batch it receives with the batch's
//! `issued_at_unix_ms` and the local receive time (same host, same clock).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use sluice_proto::v1::directive_service_client::DirectiveServiceClient;
use sluice_proto::v1::{BucketCount, Hello, ProxyMessage, Report, control_message, proxy_message};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_stream::wrappers::ReceiverStream;

/// Offered requests of bucket `bucket` (an index into the stream's buckets)
/// in report number `sequence` (from 1).
pub type LoadFn = Arc<dyn Fn(usize, u64) -> u64 + Send + Sync>;

/// What every simulated stream does.
#[derive(Clone)]
pub struct FleetSpec {
    /// Streams to open.
    pub streams: usize,
    /// `proxy_id` prefix; stream `i` is `<prefix>-<i>`.
    pub proxy_prefix: String,
    /// Buckets each stream reports (the same for every stream); empty: the
    /// stream only listens.
    pub buckets: Arc<Vec<String>>,
    /// Report interval (the filter's `report_interval_ms`).
    pub report_interval: Duration,
    /// Offered counts per report.
    pub load: LoadFn,
    /// The bucket whose drop ratio each [`Received`] carries, if any.
    pub watch: Option<String>,
}

/// One batch as one stream received it.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// Which stream.
    pub stream: usize,
    /// The batch's version.
    pub version: u64,
    /// First batch on the stream (the snapshot).
    pub first: bool,
    /// When the control plane made the batch, Unix ms.
    pub issued_at_unix_ms: u64,
    /// When this stream decoded it, Unix µs.
    pub received_unix_us: u64,
    /// Directives in the batch.
    pub directives: usize,
    /// The watched bucket's drop ratio, if the batch names it (the
    /// bucket-wide directive: empty tenant, unspecified priority).
    pub watched: Option<f64>,
}

impl Received {
    /// From issue to receipt, milliseconds. `issued_at` has millisecond
    /// resolution (truncated), so this reads up to 1 ms high.
    pub fn latency_ms(&self) -> f64 {
        (self.received_unix_us as f64 - self.issued_at_unix_ms as f64 * 1000.0) / 1000.0
    }
}

/// Counters of the whole simulated fleet.
#[derive(Debug, Default)]
pub struct FleetCounters {
    /// Streams that received their snapshot.
    pub connected: AtomicU64,
    /// Reports sent.
    pub reports: AtomicU64,
    /// Batches received.
    pub batches: AtomicU64,
    /// Streams that failed (connect error, stream error, closed by the server).
    pub errors: AtomicU64,
}

/// The running streams; [`Fleet::stop`] ends them.
pub struct Fleet {
    /// Live counters.
    pub counters: Arc<FleetCounters>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<Result<()>>,
}

impl Fleet {
    /// Opens `spec.streams` streams to the control plane's gRPC address and
    /// returns the fleet and the channel every [`Received`] goes to.
    pub fn start(spec: &FleetSpec, grpc: SocketAddr) -> (Self, mpsc::UnboundedReceiver<Received>) {
        let (events, receiver) = mpsc::unbounded_channel();
        let (stop, stopped) = watch::channel(false);
        let counters = Arc::new(FleetCounters::default());
        let mut tasks = JoinSet::new();
        for index in 0..spec.streams {
            let spec = spec.clone();
            let events = events.clone();
            let stopped = stopped.clone();
            let counters = counters.clone();
            tasks.spawn(async move {
                let result = run_stream(index, &spec, grpc, &events, stopped, &counters).await;
                if result.is_err() {
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                }
                result.with_context(|| format!("{}-{index}", spec.proxy_prefix))
            });
        }
        (
            Self {
                counters,
                stop,
                tasks,
            },
            receiver,
        )
    }

    /// Streams that received their snapshot so far.
    pub fn connected(&self) -> u64 {
        self.counters.connected.load(Ordering::Relaxed)
    }

    /// Failed streams so far.
    pub fn errors(&self) -> u64 {
        self.counters.errors.load(Ordering::Relaxed)
    }

    /// Ends every stream and returns the first error any of them had.
    pub async fn stop(mut self) -> Result<()> {
        let _ = self.stop.send(true);
        let mut first: Option<anyhow::Error> = None;
        while let Some(joined) = self.tasks.join_next().await {
            let result = joined.map_err(anyhow::Error::from).and_then(|r| r);
            if let (Err(err), None) = (result, &first) {
                first = Some(err);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

async fn run_stream(
    index: usize,
    spec: &FleetSpec,
    grpc: SocketAddr,
    events: &mpsc::UnboundedSender<Received>,
    mut stopped: watch::Receiver<bool>,
    counters: &FleetCounters,
) -> Result<()> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .context("bad gRPC address")?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .context("cannot connect")?;
    let mut client = DirectiveServiceClient::new(channel);
    let (outbound, outbound_rx) = mpsc::channel(4);
    let hello = ProxyMessage {
        kind: Some(proxy_message::Kind::Hello(Hello {
            proxy_id: format!("{}-{index}", spec.proxy_prefix),
            instance_id: index as u64 + 1,
            zone: String::new(),
            // A new simulated proxy holds no directives yet.
            known_proxies: 0,
        })),
    };
    outbound.send(hello).await.context("cannot queue Hello")?;
    let mut inbound = client
        .stream(ReceiverStream::new(outbound_rx))
        .await
        .context("cannot open the stream")?
        .into_inner();

    // Reports start half an interval in, spread over the streams, so 1,000
    // streams do not all report in the same millisecond.
    let offset = spec.report_interval.mul_f64((index % 100) as f64 / 100.0);
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + spec.report_interval + offset,
        spec.report_interval,
    );
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let window_ms = u64::try_from(spec.report_interval.as_millis()).unwrap_or(u64::MAX);
    let mut sequence = 0_u64;
    let mut first = true;
    loop {
        tokio::select! {
            _ = stopped.changed() => return Ok(()),
            _ = ticker.tick(), if !spec.buckets.is_empty() => {
                sequence += 1;
                let buckets = spec
                    .buckets
                    .iter()
                    .enumerate()
                    .map(|(i, bucket)| {
                        let offered = (spec.load)(i, sequence);
                        BucketCount {
                            bucket: bucket.clone(),
                            offered,
                            admitted: offered,
                            ..Default::default()
                        }
                    })
                    .collect();
                let report = ProxyMessage {
                    kind: Some(proxy_message::Kind::Report(Report {
                        sequence,
                        window_ms,
                        directive_age_ms: None,
                        buckets,
                        upstream: Vec::new(),
                    })),
                };
                if outbound.send(report).await.is_err() {
                    bail!("the request stream closed");
                }
                counters.reports.fetch_add(1, Ordering::Relaxed);
            }
            message = inbound.message() => {
                let message = match message {
                    Ok(Some(message)) => message,
                    Ok(None) => bail!("the control plane closed the stream"),
                    Err(status) => bail!("stream error: {status}"),
                };
                let received_unix_us = unix_us();
                let Some(control_message::Kind::Directives(batch)) = message.kind else {
                    continue;
                };
                let watched = spec.watch.as_deref().and_then(|bucket| {
                    batch
                        .directives
                        .iter()
                        .find(|d| d.bucket == bucket && d.tenant.is_empty() && d.priority == 0)
                        .map(|d| d.drop_ratio)
                });
                if first {
                    counters.connected.fetch_add(1, Ordering::Relaxed);
                }
                counters.batches.fetch_add(1, Ordering::Relaxed);
                // The receiver is gone only when the run is over.
                let _ = events.send(Received {
                    stream: index,
                    version: batch.version,
                    first,
                    issued_at_unix_ms: batch.issued_at_unix_ms,
                    received_unix_us,
                    directives: batch.directives.len(),
                    watched,
                });
                first = false;
            }
        }
    }
}
