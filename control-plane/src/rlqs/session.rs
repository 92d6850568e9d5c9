//! One Envoy's RLQS stream: usage reports in, assignments out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use sluice_core::proxy_cap;
use sluice_agent::directives::DirectiveTable;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use super::action::{assignment_for, proto_duration, refresh_every, strategy};
use super::assignment::Assignment;
use super::bucket_id::CellOfBucket;
use super::usage::{SeenBucket, convert, is_periodic};
use super::{ENVOY_REPORT_INTERVAL, PROXY_ID_HEADER};
use crate::fleet::{Connected, StreamId};
use crate::metrics::ProxyGuard;
use crate::state::{AppState, StreamCloser};
use crate::trust::{Claim, PeerIdentity, StreamGate, StreamSlot, WindowLedger};

/// Responses buffered per stream before the stream task waits for Envoy.
const OUTBOUND_BUFFER: usize = 8;
/// A bucket id that reported no requests this many times in a row is
/// abandoned: Envoy forgets it and stops reporting it.
const IDLE_REPORTS_BEFORE_ABANDON: u32 = 3;

/// The RLQS gRPC service.
#[derive(Debug, Clone)]
pub(crate) struct RlqsService {
    state: AppState,
    streams: TaskTracker,
    shutdown: CancellationToken,
    gate: Arc<StreamGate>,
}

impl RlqsService {
    /// A service whose streams run on `streams` until `shutdown`.
    pub(crate) fn new(
        state: AppState,
        streams: TaskTracker,
        shutdown: CancellationToken,
        gate: Arc<StreamGate>,
    ) -> Self {
        Self {
            state,
            streams,
            shutdown,
            gate,
        }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let peer = request.remote_addr();
        let identity = request
            .peer_certs()
            .and_then(|certs| certs.first().map(|leaf| PeerIdentity::from_der(leaf)));
        let named = request
            .metadata()
            .get(PROXY_ID_HEADER)
            .and_then(|value| value.to_str().ok())
            .filter(|id| !id.is_empty())
            .map(str::to_owned);
        let proxy_id = named.unwrap_or_else(|| match peer {
            Some(addr) => format!("rlqs@{addr}"),
            None => "rlqs@unknown".to_owned(),
        });
        let slot = self
            .gate
            .open_stream(&self.state, peer, identity.as_ref())?;
        let stream = self.state.next_stream_id();
        // Registered before the proxy id is taken, so that a newer stream
        // that supersedes this one at once can close it.
        let closer = self.state.register_stream(stream);
        // RLQS names no instance: a new stream of the same name replaces
        // the old one, which is closed.
        let claim = Claim {
            proxy_id: &proxy_id,
            instance_id: 0,
            zone: "",
        };
        let connected = self
            .gate
            .admit(&self.state, identity.as_ref(), claim, stream)?;
        let (outbound, receiver) = mpsc::channel(OUTBOUND_BUFFER);
        let span = tracing::info_span!("rlqs", id = stream.0, peer = ?peer, proxy_id);
        let session = Session {
            state: self.state.clone(),
            gate: Arc::clone(&self.gate),
            stream,
            proxy_id,
            inbound: request.into_inner(),
            outbound,
            shutdown: self.shutdown.clone(),
            buckets: HashMap::new(),
            sequence: 0,
            last_periodic: None,
            closer,
            owns_series: !matches!(connected, Connected::Conflict { .. }),
            _slot: slot,
        };
        self.streams
            .spawn(tracing::Instrument::instrument(session.run(), span));
        Ok(Response::new(ReceiverStream::new(receiver)))
    }
}

/// What the session knows of one bucket id.
#[derive(Debug)]
struct Known {
    id: HashMap<String, String>,
    local: Option<sluice_core::allowance::LocalRate>,
    sent: Option<Assignment>,
    idle_reports: u32,
}

struct Session {
    state: AppState,
    gate: Arc<StreamGate>,
    stream: StreamId,
    proxy_id: String,
    inbound: Streaming<RateLimitQuotaUsageReports>,
    outbound: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    shutdown: CancellationToken,
    buckets: HashMap<CellOfBucket, Known>,
    sequence: u64,
    /// When the previous periodic usage report arrived.
    last_periodic: Option<Instant>,
    /// How the stream learns it was superseded.
    closer: StreamCloser,
    /// Whether the proxy's per-proxy series are this stream's.
    owns_series: bool,
    /// The stream's place on its connection, held while it is open.
    _slot: StreamSlot,
}

impl Session {
    async fn run(mut self) {
        let interval = self.state.control_interval().as_duration();
        // Rates of a proxy that reports every 5 s must last until its next
        // report, with a report's worth of slack.
        let carry = (2 * ENVOY_REPORT_INTERVAL).as_millis() / interval.as_millis().max(1);
        self.state.fleet().set_carry_ticks(
            &self.proxy_id,
            self.stream,
            u32::try_from(carry).unwrap_or(u32::MAX),
        );
        let proxy_metrics =
            self.state
                .metrics()
                .proxy_connected(&self.proxy_id, self.stream, self.owns_series);
        tracing::info!(proxy_id = self.proxy_id, "RLQS stream opened");
        let end = self.forward(&proxy_metrics).await;
        self.state.fleet().disconnect(&self.proxy_id, self.stream);
        tracing::info!(proxy_id = self.proxy_id, end, "RLQS stream closed");
    }

    async fn forward(&mut self, proxy_metrics: &ProxyGuard) -> &'static str {
        let (snapshot, mut subscription) = self.state.publisher().subscribe();
        let max_cells = self.state.fleet().caps().max_cells_per_proxy;
        let mut table = DirectiveTable::with_settings(max_cells, Arc::default(), &self.proxy_id);
        let mut snapshot = snapshot;
        // The table holds the ratios this Envoy applies: one whose usage
        // counted only in part is assigned that part.
        proxy_cap::resolve_batch(&mut snapshot, &self.proxy_id);
        table.merge(snapshot);
        let opened = Instant::now();
        let mut ledger = WindowLedger::default();
        let mut refresh = tokio::time::interval(refresh_every(table.ttl_ms()));
        refresh.tick().await;
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return "shutdown",
                () = self.outbound.closed() => return "envoy gone",
                status = self.closer.closed() => {
                    let _ = self.outbound.send(Err(status)).await;
                    return "superseded by a newer stream of the same name";
                }
                message = self.inbound.message() => match message {
                    Ok(Some(reports)) => {
                        proxy_metrics.report_received(None);
                        self.receive(&reports, proxy_metrics, opened, &mut ledger);
                        if self.push(&table, false).await.is_err() {
                            return "envoy gone";
                        }
                    }
                    Ok(None) => return "envoy closed the stream",
                    Err(status) => {
                        tracing::info!(%status, "RLQS stream error");
                        return "stream error";
                    }
                },
                batch = subscription.next() => match batch {
                    Some(outgoing) => {
                        let mut batch = outgoing.batch.clone();
                        proxy_cap::resolve_batch(&mut batch, &self.proxy_id);
                        table.merge(batch);
                        if self.push(&table, false).await.is_err() {
                            return "envoy gone";
                        }
                    }
                    None => return "shutdown",
                },
                _ = refresh.tick() => {
                    // Assignments carry a TTL: renew them before it runs out.
                    if self.push(&table, true).await.is_err() {
                        return "envoy gone";
                    }
                }
            }
        }
    }

    /// Counts a usage report and remembers its bucket ids.
    fn receive(
        &mut self,
        reports: &RateLimitQuotaUsageReports,
        proxy_metrics: &ProxyGuard,
        opened: Instant,
        ledger: &mut WindowLedger,
    ) {
        let metrics = self.state.metrics();
        metrics.report_received();
        self.sequence += 1;
        let usages = &reports.bucket_quota_usages;
        let since_previous = self.last_periodic.map(|at| at.elapsed());
        if is_periodic(usages) {
            self.last_periodic = Some(Instant::now());
        }
        let converted = convert(usages, self.sequence, since_previous);
        metrics.rlqs_usages_refused(
            converted.refused.no_bucket,
            converted.refused.negative_elapsed,
        );
        let max_cells = self.state.fleet().caps().max_cells_per_proxy;
        for SeenBucket { cell, id, local } in converted.seen {
            let idle = local.is_some_and(|l| l.requests == 0);
            let full = self.buckets.len() >= max_cells;
            match self.buckets.get_mut(&cell) {
                Some(known) => {
                    known.local = local.or(known.local);
                    known.idle_reports = if idle { known.idle_reports + 1 } else { 0 };
                }
                None if full => metrics.rlqs_bucket_over_cap(),
                None => {
                    self.buckets.insert(
                        cell,
                        Known {
                            id,
                            local,
                            sent: None,
                            idle_reports: 0,
                        },
                    );
                }
            }
        }
        let Some(mut report) = converted.report else {
            return;
        };
        self.gate.check_report(
            &self.state,
            proxy_metrics,
            &mut report,
            opened.elapsed(),
            ledger,
        );
        match self.state.report(&self.proxy_id, self.stream, &report) {
            Ok(()) => self.state.warmup().reported(&self.proxy_id),
            Err(err) => {
                metrics.report_rejected(err);
                tracing::debug!(%err, "ignoring RLQS usage report");
            }
        }
    }

    /// Sends the assignments that changed (all of them when `renew`), and
    /// abandons idle bucket ids.
    async fn push(&mut self, table: &DirectiveTable, renew: bool) -> Result<(), ()> {
        let ttl =
            (table.ttl_ms() > 0).then(|| proto_duration(Duration::from_millis(table.ttl_ms())));
        let mut actions = Vec::new();
        let mut abandoned = Vec::new();
        for (cell, known) in &mut self.buckets {
            if known.idle_reports >= IDLE_REPORTS_BEFORE_ABANDON {
                actions.push(BucketAction {
                    bucket_id: Some(BucketId {
                        bucket: known.id.clone(),
                    }),
                    bucket_action: Some(Action::AbandonAction(AbandonAction {})),
                });
                abandoned.push(cell.clone());
                continue;
            }
            let assignment = match assignment_for(table, cell, known.local) {
                Some(assignment) => assignment,
                // No directive for the cell: nothing to say unless a limit
                // was assigned before (lift it). A new stream after a
                // restart therefore leaves Envoy's last assignment in force
                // until the new control plane has decided.
                None if known.sent.is_some_and(|sent| sent != Assignment::AllowAll) => {
                    Assignment::AllowAll
                }
                None => continue,
            };
            if !renew && known.sent.is_some_and(|sent| sent.close_to(&assignment)) {
                continue;
            }
            known.sent = Some(assignment);
            actions.push(BucketAction {
                bucket_id: Some(BucketId {
                    bucket: known.id.clone(),
                }),
                bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                    assignment_time_to_live: ttl,
                    rate_limit_strategy: Some(strategy(assignment)),
                })),
            });
        }
        for cell in abandoned {
            self.buckets.remove(&cell);
        }
        if actions.is_empty() {
            return Ok(());
        }
        let metrics = self.state.metrics();
        metrics.rlqs_actions_sent(actions.len());
        let response = RateLimitQuotaResponse {
            bucket_action: actions,
        };
        tokio::select! {
            () = self.shutdown.cancelled() => Err(()),
            sent = self.outbound.send(Ok(response)) => sent.map_err(|_| ()),
        }
    }
}
