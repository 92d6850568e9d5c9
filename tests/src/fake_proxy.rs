//! A hand-driven client of the control plane's gRPC stream: says Hello as
//! any proxy id and instance, with any client certificate, on a connection
//! of its own or on one shared with other streams, and reports whatever
//! counts a test asks for. It plays the rogue client the trust checks are
//! for.

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

/// The instance id [`FakeProxy::connect`] says Hello with.
pub const FAKE_INSTANCE_ID: u64 = 0xf00d;

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
    ended: Option<oneshot::Receiver<tonic::Status>>,
    reader: JoinHandle<()>,
    reporter: Option<JoinHandle<()>>,
}

/// One HTTP/2 connection to `addr` (TLS with `localhost` as the server
/// name when `tls` is given); every stream opened on it with
/// [`FakeProxy::open`] shares it.
pub async fn channel(addr: SocketAddr, tls: Option<ClientTls<'_>>) -> Result<Channel> {
    match tls {
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
    .with_context(|| format!("cannot connect to {addr}"))
}

/// A Hello as `proxy_id`, of instance [`FAKE_INSTANCE_ID`], without a zone.
pub fn hello(proxy_id: &str) -> Hello {
    Hello {
        proxy_id: proxy_id.to_owned(),
        instance_id: FAKE_INSTANCE_ID,
        ..Hello::default()
    }
}

impl FakeProxy {
    /// Connects to `addr` (see [`channel`]) and says Hello as `proxy_id`
    /// (instance [`FAKE_INSTANCE_ID`]).
    pub async fn connect(
        addr: SocketAddr,
        proxy_id: &str,
        tls: Option<ClientTls<'_>>,
    ) -> Result<Self> {
        Self::connect_with(addr, hello(proxy_id), tls).await
    }

    /// [`Self::connect`] with a Hello of the test's own.
    pub async fn connect_with(
        addr: SocketAddr,
        hello: Hello,
        tls: Option<ClientTls<'_>>,
    ) -> Result<Self> {
        let channel = channel(addr, tls).await?;
        Self::open(&channel, hello).await
    }

    /// Opens a stream on `channel`'s connection and says `hello`.
    pub async fn open(channel: &Channel, hello: Hello) -> Result<Self> {
        let (outbound, receiver) = mpsc::channel(16);
        outbound
            .send(ProxyMessage {
                kind: Some(proxy_message::Kind::Hello(hello)),
            })
            .await
            .context("stream closed before Hello")?;
        let mut client = DirectiveServiceClient::new(channel.clone())
            .max_decoding_message_size(64 * 1024 * 1024);
        let (first_tx, first_reply) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel();
        // Directives must be read, or the control plane's sends back up and
        // it stops reading this stream's reports.
        let reader = tokio::spawn(async move {
            let mut inbound = match client.stream(ReceiverStream::new(receiver)).await {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    let _ = first_tx.send(Err(status.clone()));
                    let _ = ended_tx.send(status);
                    return;
                }
            };
            let mut first_tx = Some(first_tx);
            loop {
                let message = inbound.message().await;
                let end = match message {
                    Ok(Some(_)) => None,
                    Ok(None) => Some(tonic::Status::ok("stream closed")),
                    Err(status) => Some(status),
                };
                if let Some(tx) = first_tx.take() {
                    let _ = tx.send(end.clone().map_or(Ok(()), Err));
                }
                if let Some(status) = end {
                    let _ = ended_tx.send(status);
                    return;
                }
            }
        });
        Ok(Self {
            outbound,
            first_reply: Some(first_reply),
            ended: Some(ended),
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

    /// The status the stream ended with (code `Ok` when the server closed
    /// it without one); an error if it is still open after `timeout`.
    pub async fn ended(&mut self, timeout: Duration) -> Result<tonic::Status> {
        let receiver = self.ended.as_mut().context("end already taken")?;
        let status = tokio::time::timeout(timeout, receiver)
            .await
            .context("the stream is still open")?
            .context("the stream reader stopped")?;
        self.ended = None;
        Ok(status)
    }

    /// Sends one report as it is (any window, any counts).
    pub async fn send_report(&self, report: Report) -> Result<()> {
        self.outbound
            .send(ProxyMessage {
                kind: Some(proxy_message::Kind::Report(report)),
            })
            .await
            .context("the stream is closed")
    }

    /// Reports `counts` every `interval` (as a window of that length) until
    /// dropped.
    pub fn report_every(&mut self, interval: Duration, counts: Vec<BucketCount>) {
        self.report_every_with_upstream(interval, counts, Vec::new());
    }

    /// Reports `counts` every `interval`, each claiming a window of
    /// `window_ms` whatever time passed, until dropped.
    pub fn report_every_as_window(
        &mut self,
        interval: Duration,
        window_ms: u64,
        counts: Vec<BucketCount>,
    ) {
        self.spawn_reporter(interval, window_ms, counts, Vec::new());
    }

    /// [`Self::report_every`], each report also carrying `upstream`
    /// signals (what the upstream answered in the window).
    pub fn report_every_with_upstream(
        &mut self,
        interval: Duration,
        counts: Vec<BucketCount>,
        upstream: Vec<UpstreamSignal>,
    ) {
        let window_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        self.spawn_reporter(interval, window_ms, counts, upstream);
    }

    fn spawn_reporter(
        &mut self,
        interval: Duration,
        window_ms: u64,
        counts: Vec<BucketCount>,
        upstream: Vec<UpstreamSignal>,
    ) {
        let outbound = self.outbound.clone();
        if let Some(previous) = self.reporter.take() {
            previous.abort();
        }
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
