//! State shared by the gRPC streams, the control loop and the admin API.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{oneshot, watch};

use crate::config::Config;
use crate::config::policy::Policy;
use crate::control::adaptive::{AdaptiveLimits, AdaptiveStatus};
use crate::control::controller::BucketStatus;
use crate::control::history::{self, History, Recorded};
use crate::fleet::health::{HealthWindow, UpstreamHealth};
use crate::fleet::{Fleet, FleetCaps, FleetLoad, ReportRejected, StreamId};
use crate::metrics::ControlPlaneMetrics;
use crate::serve::push::Publisher;
use crate::serve::warmup::Warmup;
use crate::types::{ControlInterval, DirectiveTtl};

/// Everything needed to start a control plane.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// How often the controller runs.
    pub(crate) control_interval: ControlInterval,
    /// Initial limits, tenants and modes; the admin API changes them at run
    /// time.
    pub(crate) policy: Policy,
    /// TTL stamped on every directive batch.
    pub(crate) directive_ttl: DirectiveTtl,
    /// Bounds on the cells reports can create.
    pub fleet_caps: FleetCaps,
    /// Longest start-up hold ([`crate::serve::warmup`]); zero: none.
    pub(crate) startup_grace: Duration,
}

impl Settings {
    /// Settings from a limits file; `control_interval` (the command line)
    /// overrides the file's interval. No start-up hold: `sluice serve`
    /// sets one ([`crate::serve::warmup::DEFAULT_GRACE`] unless configured).
    pub fn from_config(config: &Config, control_interval: Option<ControlInterval>) -> Self {
        Self {
            control_interval: control_interval
                .or(config.control_interval_ms)
                .unwrap_or_default(),
            policy: config.policy(),
            directive_ttl: config.directive_ttl_ms.unwrap_or_default(),
            fleet_caps: FleetCaps::default(),
            startup_grace: Duration::ZERO,
        }
    }
}

/// Handle to the shared state; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    control_interval: ControlInterval,
    policy: RwLock<Policy>,
    fleet: Mutex<Fleet>,
    buckets: RwLock<Arc<[BucketStatus]>>,
    publisher: Publisher,
    next_stream: AtomicU64,
    metrics: ControlPlaneMetrics,
    warmup: Warmup,
    /// Whether this process takes proxies' streams: false while a replica
    /// is cut off from its store past its grace.
    accepting_streams: watch::Sender<bool>,
    /// The fleet totals of the last minutes, for what-if replays.
    history: Mutex<History>,
    /// Upstream signals reported since the last control interval.
    health: Mutex<HealthWindow>,
    /// The adaptive buckets' limits.
    adaptive: Mutex<AdaptiveLimits>,
    /// How to tell each open proxy stream to end.
    closers: Mutex<HashMap<StreamId, oneshot::Sender<tonic::Status>>>,
}

impl AppState {
    /// Fresh state with a random epoch.
    pub fn new(settings: Settings) -> Self {
        Self::with_epoch(settings, random_epoch())
    }

    /// Fresh state with a given epoch.
    pub(crate) fn with_epoch(settings: Settings, epoch: u64) -> Self {
        let modes = settings.policy.modes.to_wire();
        Self {
            inner: Arc::new(Shared {
                control_interval: settings.control_interval,
                policy: RwLock::new(settings.policy),
                fleet: Mutex::new(Fleet::with_caps(
                    Fleet::DEFAULT_CARRY_TICKS,
                    settings.fleet_caps,
                )),
                buckets: RwLock::new(Arc::from([])),
                publisher: Publisher::new(epoch, settings.directive_ttl, modes),
                next_stream: AtomicU64::new(1),
                metrics: ControlPlaneMetrics::new(epoch),
                warmup: Warmup::new(Instant::now(), settings.startup_grace),
                accepting_streams: watch::Sender::new(true),
                health: Mutex::new(HealthWindow::default()),
                adaptive: Mutex::new(AdaptiveLimits::default()),
                history: Mutex::new(History::new(
                    history::DEFAULT_SPAN,
                    settings.control_interval.as_duration(),
                )),
                closers: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Lets [`AppState::close_stream`] reach `stream` until the returned
    /// closer drops.
    pub(crate) fn register_stream(&self, stream: StreamId) -> StreamCloser {
        let (sender, receiver) = oneshot::channel();
        self.closers().insert(stream, sender);
        StreamCloser {
            state: self.clone(),
            stream,
            receiver,
        }
    }

    /// Tells the task of `stream` to end it with `status` (a superseded
    /// stream is closed with `ABORTED`, so its proxy reconnects); returns
    /// whether the stream was still open.
    pub(crate) fn close_stream(&self, stream: StreamId, status: tonic::Status) -> bool {
        let closer = self.closers().remove(&stream);
        closer.is_some_and(|closer| closer.send(status).is_ok())
    }

    fn closers(&self) -> MutexGuard<'_, HashMap<StreamId, oneshot::Sender<tonic::Status>>> {
        self.inner
            .closers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the fleet's report windows (one control interval), then the
    /// streams of frozen instances the fleet let go (see
    /// [`Fleet::take_superseded`]); `then` reads the fleet under the same
    /// lock.
    pub(crate) fn tick_fleet_and<T>(&self, then: impl FnOnce(&Fleet) -> T) -> (FleetLoad, T) {
        let (load, read, superseded, conflicts, uncosted) = {
            // The policy's lock before the fleet's, as `report` takes them.
            let policy = self.policy();
            let limits = &policy.limits;
            let budgets = limits.has_budgets();
            let costed = |bucket: &str| budgets.then(|| limits.budget_rate(bucket)).flatten();
            let mut fleet = self.fleet();
            let load = fleet.tick_with(&costed);
            drop(policy);
            let read = then(&fleet);
            let uncosted = fleet.take_uncosted_warning();
            (
                load,
                read,
                fleet.take_superseded(),
                fleet.take_conflicts(),
                uncosted,
            )
        };
        if let Some(uncosted) = uncosted {
            tracing::warn!(
                cells = uncosted.cells,
                bucket = %uncosted.bucket,
                tenant = %uncosted.tenant,
                "cells of a cost budget whose proxies offer requests but no cost are not limited: no cost rule of the filter applies to their requests (see sluice_budget_cells_without_cost)"
            );
        }
        for conflict in conflicts {
            self.metrics().proxy_id_conflict();
            tracing::warn!(
                proxy_id = conflict.proxy_id,
                holder = format_args!("{:#018x}", conflict.holder),
                newcomer = format_args!("{:#018x}", conflict.newcomer),
                "two live processes share one proxy id (both report): both are counted, as proxies of their own; give each Envoy a unique proxy_id"
            );
        }
        for stream in superseded {
            self.metrics().stream_superseded();
            tracing::info!(
                superseded_stream = stream.0,
                "closing the stream of a silent instance: another instance of its proxy id reports"
            );
            self.close_stream(
                stream,
                tonic::Status::aborted(
                    "superseded: this instance was silent while another instance of its proxy id reports",
                ),
            );
        }
        (load, read)
    }

    /// [`AppState::tick_fleet_and`] without reading the fleet.
    pub(crate) fn tick_fleet(&self) -> FleetLoad {
        self.tick_fleet_and(|_| ()).0
    }

    /// Records one interval's fleet total and upstream signals for what-if
    /// replays.
    pub fn record_history(&self, load: &FleetLoad, health: &HashMap<String, UpstreamHealth>) {
        self.inner
            .history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(load, health);
    }

    /// The last `intervals` intervals recorded, oldest first.
    pub(crate) fn history(&self, intervals: usize) -> Vec<Recorded> {
        self.inner
            .history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last(intervals)
    }

    /// Moves the adaptive limits on one interval's `health` and `load`;
    /// returns `policy` with them in place of the configured limits, or
    /// `None` when no bucket is adaptive.
    pub(crate) fn adapt(
        &self,
        policy: &Policy,
        load: &FleetLoad,
        health: &HashMap<String, UpstreamHealth>,
    ) -> Option<Policy> {
        let mut adaptive = self
            .inner
            .adaptive
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let adapted = adaptive.adapt(policy, health, |bucket| {
            load.get(bucket).map_or(0.0, |b| b.load.offered_rps)
        })?;
        self.metrics()
            .upstream()
            .observe_adaptive(&adaptive.status());
        Some(adapted)
    }

    /// Where every adaptive bucket stands.
    pub(crate) fn adaptive_status(&self) -> Vec<AdaptiveStatus> {
        self.inner
            .adaptive
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .status()
    }

    /// Watches whether this process takes proxies' streams.
    pub(crate) fn accepting_streams(&self) -> watch::Receiver<bool> {
        self.inner.accepting_streams.subscribe()
    }

    /// Opens or closes this process to proxies' streams (closing ends the
    /// open ones); returns whether that changed anything.
    pub(crate) fn set_accepting_streams(&self, accepting: bool) -> bool {
        self.inner.accepting_streams.send_if_modified(|current| {
            let changed = *current != accepting;
            *current = accepting;
            changed
        })
    }

    /// This process's epoch.
    pub fn epoch(&self) -> u64 {
        self.inner.publisher.epoch()
    }

    /// The control interval.
    pub(crate) fn control_interval(&self) -> ControlInterval {
        self.inner.control_interval
    }

    /// The start-up hold.
    pub(crate) fn warmup(&self) -> &Warmup {
        &self.inner.warmup
    }

    /// Read access to the policy (limits, tenants, modes).
    pub fn policy(&self) -> RwLockReadGuard<'_, Policy> {
        // Poisoning is ignored throughout: no code panics while holding a
        // lock, and every critical section leaves the data consistent.
        self.inner
            .policy
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Write access to the policy.
    pub fn policy_mut(&self) -> RwLockWriteGuard<'_, Policy> {
        self.inner
            .policy
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The fleet's per-proxy state.
    pub fn fleet(&self) -> MutexGuard<'_, Fleet> {
        self.inner
            .fleet
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a proxy's report to the fleet, telling the fleet which buckets
    /// have a limit so that unlimited ones cannot crowd them out. Takes the
    /// policy's read lock, then the fleet's (no other path holds the fleet
    /// lock while it takes the policy's).
    pub(crate) fn report(
        &self,
        proxy_id: &str,
        stream: StreamId,
        report: &sluice_proto::v1::Report,
    ) -> Result<(), ReportRejected> {
        let policy = self.policy();
        let limited = |bucket: &str| policy.limits.limit_for(bucket).is_some();
        self.fleet()
            .report_classified(proxy_id, stream, report, &limited)?;
        if !report.upstream.is_empty() {
            self.inner
                .health
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .add(&report.upstream);
        }
        Ok(())
    }

    /// The upstream's health per bucket since the last call (one control
    /// interval), fleet-wide as this process heard it.
    pub(crate) fn take_upstream_health(&self) -> HashMap<String, UpstreamHealth> {
        self.inner
            .health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// The buckets as of the last control interval.
    pub(crate) fn buckets(&self) -> Arc<[BucketStatus]> {
        self.inner
            .buckets
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the buckets view.
    pub(crate) fn set_buckets(&self, buckets: Vec<BucketStatus>) {
        *self
            .inner
            .buckets
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::from(buckets);
    }

    /// Where directive batches are published.
    pub(crate) fn publisher(&self) -> &Publisher {
        &self.inner.publisher
    }

    /// The Prometheus metrics.
    pub fn metrics(&self) -> &ControlPlaneMetrics {
        &self.inner.metrics
    }

    /// A new, unique stream id.
    pub(crate) fn next_stream_id(&self) -> StreamId {
        StreamId(self.inner.next_stream.fetch_add(1, Ordering::Relaxed))
    }
}

/// A random epoch, so that a restarted control plane never reuses one.
pub(crate) fn random_epoch() -> u64 {
    getrandom::u64().unwrap_or_else(|err| {
        tracing::warn!(%err, "no OS randomness; deriving the epoch from time and pid");
        // `RandomState` is seeded per process; mixing in time and pid keeps
        // epochs distinct even if that seeding were weak.
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        RandomState::new().hash_one((now, std::process::id()))
    })
}

/// How a stream's task learns that it must end; see
/// [`AppState::close_stream`]. Dropping it forgets the stream.
#[derive(Debug)]
pub(crate) struct StreamCloser {
    state: AppState,
    stream: StreamId,
    receiver: oneshot::Receiver<tonic::Status>,
}

impl StreamCloser {
    /// The status to end the stream with, once someone closes it; never
    /// resolves otherwise. Cancel-safe.
    pub(crate) async fn closed(&mut self) -> tonic::Status {
        match (&mut self.receiver).await {
            Ok(status) => status,
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for StreamCloser {
    fn drop(&mut self) {
        self.state.closers().remove(&self.stream);
    }
}
