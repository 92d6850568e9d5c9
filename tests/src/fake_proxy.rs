//! A hand-driven client of the control plane's gRPC stream: says Hello as
//! any proxy id, with any client certificate, and reports whatever counts
//! a test asks for. It plays the rogue client the trust checks are for.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use sluice_proto::v1::directive_service_client::DirectiveServiceClient;
use sluice_proto::v1::{BucketCount, Hello, ProxyMessage, Report, UpstreamSignal, proxy_message};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A client certificate, its key and the CA that signed the server's.
#[derive(Debug, Clone, Copy)]
pub struct ClientTls<'a> {
    /// CA bundle (PEM) for the server certificate.
    pub ca: &'a Path,
    /// Client certificate (PEM).
    pub cert: &'a Path,
    /// Its private key (PEM).
    pub key: &'a Path,
}

/// One open stream. Dropping it closes the stream and stops its tasks.
#[derive(Debug)]
pub struct FakeProxy {
    outbound: mpsc::Sender<ProxyMessage>,
    first_reply: Option<oneshot::Receiver<Result<(), tonic::Status>>>,
    reader: JoinHandle<()>,
    reporter: Option<JoinHandle<()>>,
}

impl FakeProxy {
    /// Connects to `addr` (TLS with `localhost` as the server name when
    /// `tls` is given) and says Hello as `proxy_id`.
    pub async fn connect(
        addr: SocketAddr,
        proxy_id: &str,
        tls: Option<ClientTls<'_>>,
    ) -> Result<Self> {
        let channel = match tls {
            None => {
                Channel::from_shared(format!("http://{addr}"))?
                    .connect()
                    .await
            }
            Some(tls) => {
                let read = |path: &Path| {
                    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
                };
                let config = ClientTlsConfig::new()
                    .domain_name("localhost")
                    .ca_certificate(Certificate::from_pem(read(tls.ca)?))
                    .identity(Identity::from_pem(read(tls.cert)?, read(tls.key)?));
                Channel::from_shared(format!("https://localhost:{}", addr.port()))?
                    .tls_config(config)?
                    .connect()
                    .await
            }
        }
        .with_context(|| format!("cannot connect to {addr}"))?;
        let (outbound, receiver) = mpsc::channel(16);
        outbound
            .send(ProxyMessage {
                kind: Some(proxy_message::Kind::Hello(Hello {
                    proxy_id: proxy_id.to_owned(),
                    instance_id: 0xf00d,
                    ..Hello::default()
                })),
            })
            .await
            .context("stream closed before Hello")?;
        let mut client = DirectiveServiceClient::new(channel);
        let response = client.stream(ReceiverStream::new(receiver)).await;
        let (first_tx, first_reply) = oneshot::channel();
        // Directives must be read, or the control plane's sends back up and
        // it stops reading this stream's reports.
        let reader = tokio::spawn(async move {
            let mut inbound = match response {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    let _ = first_tx.send(Err(status));
                    return;
                }
            };
            let mut first_tx = Some(first_tx);
            loop {
                let message = inbound.message().await;
                let reply = match &message {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err(tonic::Status::cancelled("stream closed")),
                    Err(status) => Err(status.clone()),
                };
                let done = reply.is_err();
                if let Some(tx) = first_tx.take() {
                    let _ = tx.send(reply);
                }
                if done {
                    return;
                }
            }
        });
        Ok(Self {
            outbound,
            first_reply: Some(first_reply),
            reader,
            reporter: None,
        })
    }

    /// The first thing the control plane answered: `Ok` for a directive
    /// batch, the status if it refused the stream.
    pub async fn first_reply(&mut self, timeout: Duration) -> Result<Result<(), tonic::Status>> {
        let receiver = self
            .first_reply
            .take()
            .context("first reply already taken")?;
        tokio::time::timeout(timeout, receiver)
            .await
            .context("no reply from the control plane")?
            .context("the stream reader stopped")
    }

    /// Reports `counts` every `interval` (as a window of that length) until
    /// dropped.
    pub fn report_every(&mut self, interval: Duration, counts: Vec<BucketCount>) {
        self.report_every_with_upstream(interval, counts, Vec::new());
    }

    /// [`Self::report_every`], each report also carrying `upstream`
    /// signals (what the upstream answered in the window).
    pub fn report_every_with_upstream(
        &mut self,
        interval: Duration,
        counts: Vec<BucketCount>,
        upstream: Vec<UpstreamSignal>,
    ) {
        let outbound = self.outbound.clone();
        let window_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        self.reporter = Some(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.tick().await;
            for sequence in 1_u64.. {
                ticker.tick().await;
                let report = Report {
                    sequence,
                    window_ms,
                    buckets: counts.clone(),
                    directive_age_ms: None,
                    upstream: upstream.clone(),
                };
                let message = ProxyMessage {
                    kind: Some(proxy_message::Kind::Report(report)),
                };
                if outbound.send(message).await.is_err() {
                    return;
                }
            }
        }));
    }
}

impl Drop for FakeProxy {
    fn drop(&mut self) {
        self.reader.abort();
        if let Some(reporter) = &self.reporter {
            reporter.abort();
        }
    }
}
