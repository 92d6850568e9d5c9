//! A minimal HTTP/1.1 upstream answering `200 ok` to every request, so the
//! end-to-end benchmark can show what a request that reaches a real upstream
//! costs Envoy, and what a 429 saves. A real application does strictly more
//! work per request: the upstream's CPU is a lower bound.

use std::convert::Infallible;

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Serves on `listener` until `shutdown` resolves; every connection is
/// keep-alive and is dropped at shutdown.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<()> {
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, _) = accepted.context("accept failed")?;
                stream.set_nodelay(true).context("cannot set TCP_NODELAY")?;
                connections.spawn(
                    http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service_fn(answer)),
                );
            }
            // Reap finished connections; their errors (a client that went
            // away) are not the benchmark's.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
    Ok(())
}

async fn answer(
    _request: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[tokio::test]
    async fn answers_ok_over_keep_alive() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, async {
            let _ = stopped.await;
        }));
        let client = reqwest::Client::new();
        for _ in 0..3 {
            let response = client
                .get(format!("http://{addr}/anything"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            assert_eq!(response.text().await.unwrap(), "ok");
        }
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
