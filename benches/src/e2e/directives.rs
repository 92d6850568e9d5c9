//! A stand-in control plane: a gRPC `DirectiveService` that answers every
//! stream with one fixed `DirectiveBatch`, then heartbeats, and drains
//! reports.
//! Deterministic, unlike the real controller, whose drop ratio follows the
//! measured load: the benchmark needs exactly 0 or 0.5 from the first request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result};
use sluice_proto::v1::directive_service_server::{DirectiveService, DirectiveServiceServer};
use sluice_proto::v1::{ControlMessage, Directive, DirectiveBatch, ProxyMessage, control_message};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// How often each stream gets an empty batch that keeps its table fresh.
const HEARTBEAT: std::time::Duration = std::time::Duration::from_millis(500);

/// The directive pushed to the next streams, and how many were pushed.
#[derive(Debug, Default)]
struct Shared {
    /// `(epoch, bucket, drop_ratio)`; `None` pushes an empty batch.
    directive: Mutex<Option<(u64, String, f64)>>,
    pushed: AtomicU64,
}

/// The running server; aborted on drop.
#[derive(Debug)]
pub struct DirectiveServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl DirectiveServer {
    /// Listens on an ephemeral loopback port.
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the directive server")?;
        let addr = listener.local_addr().context("no local address")?;
        let shared = Arc::new(Shared::default());
        let service = Service {
            shared: shared.clone(),
        };
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .add_service(DirectiveServiceServer::new(service))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
            if let Err(err) = served {
                eprintln!("directive server stopped: {err}");
            }
        });
        Ok(Self { addr, shared, task })
    }

    /// Where Envoy's `sluice_control_plane` cluster must point.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Streams opened from now on receive `drop_ratio` for `bucket` (or no
    /// directive), under `epoch`.
    pub fn set_directive(&self, epoch: u64, bucket: &str, drop_ratio: Option<f64>) {
        let mut directive = self
            .shared
            .directive
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *directive = drop_ratio.map(|ratio| (epoch, bucket.to_owned(), ratio));
    }

    /// Batches pushed so far (one per stream).
    pub fn pushed(&self) -> u64 {
        self.shared.pushed.load(Ordering::Relaxed)
    }
}

impl Drop for DirectiveServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug, Clone)]
struct Service {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl DirectiveService for Service {
    type StreamStream = ReceiverStream<Result<ControlMessage, Status>>;

    async fn stream(
        &self,
        request: Request<Streaming<ProxyMessage>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let directive = self
            .shared
            .directive
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let (epoch, directives) = match directive {
            Some((epoch, bucket, drop_ratio)) => (
                epoch,
                vec![Directive {
                    bucket,
                    drop_ratio,
                    limit_rps: Some(1.0),
                    ..Default::default()
                }],
            ),
            None => (1, Vec::new()),
        };
        let batch = DirectiveBatch {
            epoch,
            version: 1,
            issued_at_unix_ms: 0,
            directives,
            ..Default::default()
        };
        let (outbound, receiver) = mpsc::channel(1);
        let message = ControlMessage {
            kind: Some(control_message::Kind::Directives(batch)),
        };
        outbound
            .send(Ok(message))
            .await
            .map_err(|_| Status::internal("stream closed"))?;
        self.shared.pushed.fetch_add(1, Ordering::Relaxed);
        // Read reports until the proxy goes away, holding the sender so the
        // response stream stays open (a closed stream makes the filter
        // reconnect), and send an empty batch every `HEARTBEAT` as the real
        // control plane does: without one the filter takes the control
        // plane for lost after 2.5 s and its allowance decides instead of
        // the directive (a run on a slow machine lasts longer than that).
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            let mut heartbeat = tokio::time::interval(HEARTBEAT);
            heartbeat.tick().await;
            let mut version = 1_u64;
            loop {
                tokio::select! {
                    message = inbound.message() => {
                        if !matches!(message, Ok(Some(_))) {
                            break;
                        }
                    }
                    _ = heartbeat.tick() => {
                        version += 1;
                        let batch = DirectiveBatch {
                            epoch,
                            version,
                            ..Default::default()
                        };
                        let message = ControlMessage {
                            kind: Some(control_message::Kind::Directives(batch)),
                        };
                        if outbound.send(Ok(message)).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }
}
