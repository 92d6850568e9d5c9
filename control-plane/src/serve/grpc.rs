//! The filters' gRPC listener: the `sluice.v1.DirectiveService` stream
//! (one bidirectional stream per Envoy, reports in, directive batches out)
//! and, beside it, the RLQS service ([`crate::rlqs`]) and, with quotas
//! configured, Envoy's rate limit service API ([`crate::quotas`]).

use std::time::Duration;

use sluice_proto::v1::directive_service_server::{DirectiveService, DirectiveServiceServer};
use sluice_proto::v1::{
    ControlMessage, DirectiveBatch, Hello, ProxyMessage, control_message, proxy_message,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::ServerTlsConfig;
use tonic::{Request, Response, Status, Streaming};

use std::sync::Arc;
use std::time::Instant;

use crate::fleet::{Connected, ReportRejected, StreamId};
use crate::metrics::{ProxyGuard, Sent};
use crate::quotas::{Quotas, RateLimitGrpc};
use crate::rlqs::session::RlqsService;
use crate::serve::accept;
use crate::serve::rls_listener::RlsListener;
use crate::serve::{KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT};
use crate::state::{AppState, StreamCloser};
use crate::trust::{
    Ceilings, Claim, HelloLimits, IdentityPolicy, PeerIdentity, PeerLimits, StreamGate, StreamSlot,
    WindowLedger,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// A stream that has not said Hello by then is closed.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Batches buffered per stream before the stream task waits for the client.
const OUTBOUND_BUFFER: usize = 8;
/// Streams of any kind (proxy streams, rate limit calls) one HTTP/2
/// connection may have open at once, as its SETTINGS tell the client:
/// hyper's own default, which tonic turns off. Proxy streams have a lower
/// cap of their own ([`PeerLimits`]); Envoy opens another connection when
/// a busy one reaches this.
const MAX_CONCURRENT_STREAMS: u32 = 200;

/// Where the gRPC API is served: a bound listener, with TLS when
/// configured, and the checks every stream passes.
#[derive(Debug)]
pub struct GrpcEndpoint {
    /// The bound listener.
    pub(crate) listener: TcpListener,
    /// Server TLS (and client-certificate checks); `None` serves plaintext.
    pub(crate) tls: Option<ServerTlsConfig>,
    /// With client certificates: which proxy ids each may claim. `None`:
    /// streams have no identity and may claim any proxy id.
    pub(crate) identity: Option<IdentityPolicy>,
    /// Most a report may claim.
    pub(crate) ceilings: Ceilings,
    /// What a Hello may name.
    pub(crate) hello: HelloLimits,
    /// How much of the listener one peer may hold.
    pub(crate) peers: PeerLimits,
    /// Exact quotas: serves Envoy's rate limit service API when set.
    pub(crate) quotas: Option<Arc<Quotas>>,
    /// Serves the quotas on this listener of their own instead.
    pub(crate) rls: Option<RlsListener>,
}

impl From<TcpListener> for GrpcEndpoint {
    fn from(listener: TcpListener) -> Self {
        Self {
            listener,
            tls: None,
            identity: None,
            ceilings: Ceilings::default(),
            hello: HelloLimits::default(),
            peers: PeerLimits::default(),
            quotas: None,
            rls: None,
        }
    }
}

/// Serves the gRPC API on `endpoint` until `shutdown` is cancelled.
///
/// Every stream runs in a task on `streams`, and each of those tasks ends
/// when `shutdown` fires: tonic's graceful shutdown waits for open streams,
/// and a proxy never closes its stream by itself.
pub(crate) async fn serve(
    endpoint: GrpcEndpoint,
    state: AppState,
    streams: TaskTracker,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let gate = Arc::new(StreamGate::new(
        endpoint.identity,
        endpoint.ceilings,
        endpoint.hello,
        endpoint.peers,
    ));
    let incoming = accept::limited(endpoint.listener, Arc::clone(gate.peers()), state.clone());
    let rlqs = RlqsService::new(
        state.clone(),
        streams.clone(),
        shutdown.clone(),
        Arc::clone(&gate),
    );
    let service = DirectiveGrpc {
        state,
        streams,
        shutdown: shutdown.clone(),
        gate,
    };
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = endpoint.tls {
        builder = builder.tls_config(tls)?;
    }
    builder
        .tcp_nodelay(true)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(DirectiveServiceServer::new(service))
        .add_service(RateLimitQuotaServiceServer::new(rlqs))
        .add_optional_service(
            endpoint
                .quotas
                .map(|q| RateLimitServiceServer::new(RateLimitGrpc::new(q))),
        )
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
}

/// What a proxy hears when this replica lets its stream go: it lost its
/// store, so another replica should serve the proxy.
fn handed_off() -> Status {
    Status::unavailable("this control-plane replica cannot reach its store; connect to another")
}

/// The service implementation.
#[derive(Debug, Clone)]
pub(crate) struct DirectiveGrpc {
    state: AppState,
    streams: TaskTracker,
    shutdown: CancellationToken,
    gate: Arc<StreamGate>,
}

#[tonic::async_trait]
impl DirectiveService for DirectiveGrpc {
    type StreamStream = ReceiverStream<Result<ControlMessage, Status>>;

    async fn stream(
        &self,
        request: Request<Streaming<ProxyMessage>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let peer = request.remote_addr();
        // The verified chain's leaf; TLS has already checked it against the
        // client CA.
        let identity = request
            .peer_certs()
            .and_then(|certs| certs.first().map(|leaf| PeerIdentity::from_der(leaf)));
        let slot = self
            .gate
            .open_stream(&self.state, peer, identity.as_ref())?;
        let (outbound, receiver) = mpsc::channel(OUTBOUND_BUFFER);
        let stream = self.state.next_stream_id();
        let session = Session {
            state: self.state.clone(),
            stream,
            inbound: request.into_inner(),
            outbound,
            shutdown: self.shutdown.clone(),
            gate: Arc::clone(&self.gate),
            identity,
            closer: self.state.register_stream(stream),
            _slot: slot,
        };
        let span = tracing::info_span!(
            "stream",
            id = session.stream.0,
            peer = ?peer,
            proxy_id = tracing::field::Empty
        );
        self.streams
            .spawn(tracing::Instrument::instrument(session.run(), span));
        Ok(Response::new(ReceiverStream::new(receiver)))
    }
}

/// One proxy's stream.
struct Session {
    state: AppState,
    stream: StreamId,
    inbound: Streaming<ProxyMessage>,
    outbound: mpsc::Sender<Result<ControlMessage, Status>>,
    shutdown: CancellationToken,
    gate: Arc<StreamGate>,
    /// The client certificate's names; `None` without one.
    identity: Option<PeerIdentity>,
    /// How the stream learns it was superseded.
    closer: StreamCloser,
    /// The stream's place on its connection, held while it is open.
    _slot: StreamSlot,
}

/// What a stream tracks about its own reports.
struct ReportState {
    /// When the Hello arrived.
    opened: Instant,
    last_sequence: Option<u64>,
    windows: WindowLedger,
}

/// Why a session ended, for the log.
#[derive(Debug)]
enum End {
    Shutdown,
    ProxyClosed,
    ProxyGone,
    Superseded,
    Error(Status),
}

impl Session {
    async fn run(mut self) {
        let accepting = *self.state.accepting_streams().borrow();
        if !accepting {
            self.state.metrics().stream_rejected();
            // The proxy's next attempt goes to another replica.
            let _ = self.outbound.send(Err(handed_off())).await;
            return;
        }
        let hello = match self.wait_for_hello().await {
            Ok(hello) => hello,
            Err(End::Error(status)) => {
                tracing::warn!(%status, "rejecting stream");
                self.state.metrics().stream_rejected();
                // The proxy sees why; if it is already gone there is no one
                // left to tell.
                let _ = self.outbound.send(Err(status)).await;
                return;
            }
            Err(end) => {
                tracing::debug!(?end, "stream ended before hello");
                return;
            }
        };
        let proxy_id = hello.proxy_id;
        let claim = Claim {
            proxy_id: &proxy_id,
            instance_id: hello.instance_id,
            zone: &hello.zone,
        };
        let connected =
            match self
                .gate
                .admit(&self.state, self.identity.as_ref(), claim, self.stream)
            {
                Ok(connected) => connected,
                Err(status) => {
                    // The proxy sees why; if it is already gone there is no one
                    // left to tell.
                    let _ = self.outbound.send(Err(status)).await;
                    return;
                }
            };
        // Only a proxy id within the limits is worth a field of every line.
        tracing::Span::current().record("proxy_id", proxy_id.as_str());
        self.state.warmup().hello(hello.known_proxies);
        let instance_id = hello.instance_id;
        match connected {
            Connected::New => tracing::info!(proxy_id, instance_id, "proxy connected"),
            Connected::Replaced {
                previous,
                previous_instance,
            } if previous_instance == instance_id => tracing::info!(
                proxy_id,
                instance_id,
                replaced_stream = previous.map(|s| s.0),
                "proxy reconnected; the new stream replaces the old one"
            ),
            Connected::Replaced {
                previous,
                previous_instance,
            } => tracing::info!(
                proxy_id,
                instance_id,
                previous_instance,
                replaced_stream = previous.map(|s| s.0),
                "proxy restarted; the new instance takes over its proxy id"
            ),
            Connected::Conflict { holder } => tracing::info!(
                proxy_id,
                instance_id,
                holder,
                "proxy connected beside another live instance of its proxy id"
            ),
        }
        let owns_series = !matches!(connected, Connected::Conflict { .. });

        // Dropped when this function returns, however the stream ended.
        let proxy_metrics =
            self.state
                .metrics()
                .proxy_connected(&proxy_id, self.stream, owns_series);
        let end = self.forward(&proxy_id, &proxy_metrics).await;
        let owned = self.state.fleet().disconnect(&proxy_id, self.stream);
        match end {
            // Usually the proxy went away without closing (an Envoy restart).
            End::Error(status) => tracing::info!(proxy_id, %status, "stream ended with an error"),
            end => tracing::info!(proxy_id, ?end, superseded = !owned, "stream closed"),
        }
    }

    async fn wait_for_hello(&mut self) -> Result<Hello, End> {
        let first = tokio::select! {
            () = self.shutdown.cancelled() => return Err(End::Shutdown),
            first = tokio::time::timeout(HELLO_TIMEOUT, self.inbound.message()) => first,
        };
        match first {
            Err(_elapsed) => Err(End::Error(Status::deadline_exceeded("no Hello received"))),
            Ok(Err(status)) => Err(End::Error(status)),
            Ok(Ok(None)) => Err(End::ProxyClosed),
            Ok(Ok(Some(ProxyMessage {
                kind: Some(proxy_message::Kind::Hello(hello)),
            }))) => Ok(hello),
            Ok(Ok(Some(_))) => Err(End::Error(Status::failed_precondition(
                "the first message on a stream must be a Hello",
            ))),
        }
    }

    /// Sends the snapshot, then relays deltas and takes in reports until the
    /// stream or the server ends.
    async fn forward(&mut self, proxy_id: &str, proxy_metrics: &ProxyGuard) -> End {
        let (snapshot, mut subscription) = self.state.publisher().subscribe();
        if let Err(end) = self.send(snapshot, Sent::Snapshot).await {
            return end;
        }
        let mut reports = ReportState {
            opened: Instant::now(),
            last_sequence: None,
            windows: WindowLedger::default(),
        };
        let mut accepting = self.state.accepting_streams();
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return End::Shutdown,
                true = async { accepting.wait_for(|accepting| !*accepting).await.is_ok() } => {
                    let _ = self.outbound.send(Err(handed_off())).await;
                    return End::Error(handed_off());
                }
                () = self.outbound.closed() => return End::ProxyGone,
                status = self.closer.closed() => {
                    tracing::info!(%status, "closing a superseded stream");
                    let _ = self.outbound.send(Err(status)).await;
                    return End::Superseded;
                }
                message = self.inbound.message() => match message {
                    Ok(Some(message)) => {
                        self.receive(proxy_id, proxy_metrics, message, &mut reports);
                    }
                    Ok(None) => return End::ProxyClosed,
                    Err(status) => return End::Error(status),
                },
                batch = subscription.next() => match batch {
                    Some(outgoing) => {
                        let sent = match outgoing.decided_at {
                            Some(decided_at) => Sent::Delta { decided_at },
                            None => Sent::Snapshot,
                        };
                        if let Err(end) = self.send(DirectiveBatch::clone(&outgoing.batch), sent).await {
                            return end;
                        }
                    }
                    None => return End::Shutdown,
                },
            }
        }
    }

    fn receive(
        &self,
        proxy_id: &str,
        proxy_metrics: &ProxyGuard,
        message: ProxyMessage,
        reports: &mut ReportState,
    ) {
        let metrics = self.state.metrics();
        match message.kind {
            Some(proxy_message::Kind::Report(mut report)) => {
                metrics.report_received();
                proxy_metrics.report_received(report.directive_age_ms);
                let checked = self.gate.check_report(
                    &self.state,
                    proxy_metrics,
                    &mut report,
                    reports.opened.elapsed(),
                    &mut reports.windows,
                );
                if checked.changed() {
                    tracing::debug!(proxy_id, ?checked, "report clamped to what is plausible");
                }
                let last_sequence = &mut reports.last_sequence;
                if let Some(last) = *last_sequence
                    && report.sequence != last.wrapping_add(1)
                {
                    metrics.report_sequence_gap();
                    tracing::debug!(
                        proxy_id,
                        last,
                        sequence = report.sequence,
                        "report sequence gap"
                    );
                }
                *last_sequence = Some(report.sequence);
                match self.state.report(proxy_id, self.stream, &report) {
                    Ok(()) => self.state.warmup().reported(proxy_id),
                    Err(err @ ReportRejected::Superseded) => {
                        metrics.report_rejected(err);
                        tracing::debug!(proxy_id, "ignoring report from a replaced stream");
                    }
                    Err(err @ ReportRejected::EmptyWindow) => {
                        metrics.report_rejected(err);
                        tracing::warn!(proxy_id, %err, "ignoring report");
                    }
                }
            }
            Some(proxy_message::Kind::Hello(_)) => {
                tracing::warn!(proxy_id, "ignoring a second Hello on the same stream");
            }
            // A newer filter may send kinds this build does not know.
            None => tracing::debug!(proxy_id, "ignoring an empty message"),
        }
    }

    /// Queues a batch for the proxy, giving up if the proxy is gone or the
    /// server is shutting down (a stalled proxy must not hold up shutdown).
    /// Push latency is measured here, once the transport has the batch.
    async fn send(&self, batch: DirectiveBatch, sent: Sent) -> Result<(), End> {
        let message = ControlMessage {
            kind: Some(control_message::Kind::Directives(batch)),
        };
        tokio::select! {
            () = self.shutdown.cancelled() => Err(End::Shutdown),
            queued = self.outbound.send(Ok(message)) => {
                queued.map_err(|_| End::ProxyGone)?;
                self.state.metrics().batch_pushed(sent);
                Ok(())
            }
        }
    }
}
