//! The accept loop of the harness's small HTTP/1.1 servers (the capped
//! upstream, the fake LLM upstream, the module server): one task per
//! connection, each answered by the same handler, every connection task
//! owned by the loop so it ends with it.

use std::convert::Infallible;
use std::future::Future;

use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Serves HTTP/1.1 on `listener` with `handler` until the listener fails
/// (or the task running this is aborted, which drops every connection).
pub async fn serve<H, F, B>(listener: TcpListener, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connections = JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        // Finished connections are reaped as new ones arrive, so a long
        // run keeps no more tasks than it has open connections.
        while connections.try_join_next().is_some() {}
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        connections.spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(handler))
                .await;
        });
    }
}
