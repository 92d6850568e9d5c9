//! A gRPC server that speaks Sluice's service name but never answers: it
//! accepts every stream, never reads what the proxy sends and never sends
//! anything back. It stands for a control plane that is wedged (a deadlock,
//! a full disk, a GC pause that never ends) while its port still accepts.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context as TaskContext, Poll};

use anyhow::{Context, Result};
use sluice_proto::v1::directive_service_server::{DirectiveService, DirectiveServiceServer};
use sluice_proto::v1::{ControlMessage, ProxyMessage};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};

/// A running stalled server; dropping it stops it.
#[derive(Debug)]
pub struct StalledControlPlane {
    addr: SocketAddr,
    streams: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl StalledControlPlane {
    /// Binds `127.0.0.1:0` and serves.
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the stalled control plane")?;
        let addr = listener.local_addr()?;
        let streams = Arc::new(AtomicUsize::new(0));
        let service = Stalled {
            streams: streams.clone(),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(DirectiveServiceServer::new(service))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(err) = served {
                eprintln!("stalled control plane: {err}");
            }
        });
        Ok(Self {
            addr,
            streams,
            stop: Some(stop),
            task,
        })
    }

    /// The gRPC address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Streams opened so far (a proxy that gives up on a stalled stream and
    /// reconnects opens another).
    pub fn streams_opened(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }
}

impl Drop for StalledControlPlane {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

struct Stalled {
    streams: Arc<AtomicUsize>,
}

/// The response stream: never yields, and holds the unread inbound half
/// for as long as it lives, so HTTP/2 flow control pushes back on the proxy
/// once its window is full.
struct Silence {
    _inbound: Streaming<ProxyMessage>,
}

impl Stream for Silence {
    type Item = Result<ControlMessage, Status>;

    fn poll_next(self: Pin<&mut Self>, _cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        Poll::Pending
    }
}

#[tonic::async_trait]
impl DirectiveService for Stalled {
    type StreamStream = Silence;

    async fn stream(
        &self,
        request: Request<Streaming<ProxyMessage>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        self.streams.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(Silence {
            _inbound: request.into_inner(),
        }))
    }
}
