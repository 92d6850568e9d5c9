//! Per-proxy, per-cell rate estimation and the fleet-wide sum.
//!
//! A cell is a (bucket, tenant, priority) triple as the filter reports it.
//! Reports are added as they arrive and [`Fleet::tick`] turns what arrived
//! since the previous tick into rates. Decisions never read a clock; time
//! enters only through the windows the proxies report and the number of
//! ticks a proxy has been silent (the proxies view alone notes when a proxy
//! last reported).
//!
//! The state is bounded whatever the proxies send: keys longer than
//! [`FleetCaps`] allows are refused, each proxy may hold a bounded number of
//! cells per window and the fleet a bounded number in total, and a cell that
//! no proxy's rates mention any more is evicted at the next tick. Every
//! refusal and eviction is counted in [`FleetStats`].
//!
//! A proxy is one instance (one Envoy process) of a proxy id. A new stream
//! of the same instance replaces its old one; an instance whose process is
//! gone (no stream, or one silent past its carry) is replaced by the next
//! instance of its id; two live instances of one id are two proxies, each
//! counted, flagged as a conflict.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::v1::Report;

use sluice_core::Priority;
use sluice_core::directive::COUNTED_BUDGET_S;

pub mod health;
mod interner;
mod load;
mod share_cap;
mod status;

pub(crate) use load::MAX_CHARGE_RATIO;
pub use load::{
    BucketCost, BucketLoad, BucketTraffic, CappedProxy, CellCharges, CellLoad, FleetLoad,
    FleetStats, PartCharges, ProxyCap, Rates,
};
pub use share_cap::{ShareCap, Weight};
pub(crate) use status::ProxyStatus;

use share_cap::ClaimWeights;

use interner::{CellId, IdMap, Interner, NO_CELL};

/// Identifies one gRPC stream, so that a stale stream of a proxy that has
/// reconnected cannot touch the state of its replacement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// How many of `cap` cells unlimited buckets may fill: three quarters; the
/// last quarter is kept for cells with a limit (as in the filter).
pub(crate) fn unlimited_share(cap: usize) -> usize {
    cap.saturating_sub(cap.div_ceil(4))
        .max(usize::from(cap >= 2))
}

/// Bounds on the state reports can create.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetCaps {
    /// Longest accepted bucket key, in bytes.
    pub max_bucket_len: usize,
    /// Longest accepted tenant, in bytes.
    pub max_tenant_len: usize,
    /// Distinct cells one proxy may report in one window.
    pub max_cells_per_proxy: usize,
    /// Distinct cells tracked fleet-wide.
    pub max_cells: usize,
    /// How much one proxy's claim for a bucket may weigh.
    pub share_cap: ShareCap,
}

impl Default for FleetCaps {
    /// Bucket keys and tenants as long as the filter builds them (and the
    /// admin API accepts); per proxy 5× the filter's default `max_buckets`;
    /// 250k cells in total (a few hundred bytes each).
    fn default() -> Self {
        Self {
            max_bucket_len: crate::types::MAX_BUCKET_LEN,
            max_tenant_len: crate::types::MAX_TENANT_LEN,
            max_cells_per_proxy: 50_000,
            max_cells: 250_000,
            share_cap: ShareCap::default(),
        }
    }
}

/// What [`Fleet::connect`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connected {
    /// A proxy id not seen before (or forgotten after expiry).
    New,
    /// The stream speaks for a known proxy: a new stream of the same
    /// instance (its leader VM changed, or its old stream broke), or a new
    /// instance of the id whose previous process is gone (its stream
    /// closed, or silent past its carry). `previous` is the stream now
    /// superseded, if it was still open: it must be closed. The rates are
    /// kept until the new stream reports.
    Replaced {
        /// The superseded stream.
        previous: Option<StreamId>,
        /// The instance it replaced (the same one for a reconnect).
        previous_instance: u64,
    },
    /// Another instance of the proxy id holds a live stream and reports:
    /// two processes share one proxy id. Both count, as two proxies.
    Conflict {
        /// The instance already there.
        holder: u64,
    },
}

/// A live stream of another identity holds the proxy id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("proxy id is held by a live stream of {}", holder.as_deref().unwrap_or("a client without identity"))]
pub(crate) struct HeldByAnother {
    /// The principal of the stream that holds it.
    pub(crate) holder: Option<Arc<str>>,
}

/// Why a report was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReportRejected {
    /// The stream no longer speaks for the proxy: a newer stream with the
    /// same proxy id replaced it.
    #[error("stream was replaced by a newer stream of the same proxy")]
    Superseded,
    /// `window_ms` is 0, so the counts cannot be turned into a rate.
    #[error("report has window_ms = 0")]
    EmptyWindow,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    offered: u64,
    admitted: u64,
    shadow_dropped: u64,
    offered_cost: f64,
    admitted_cost: f64,
    charged_cost: f64,
    settled_cost: f64,
}

/// The most cost one report entry may count: far above any real window
/// (a billion units a second for a day), low enough that sums of many
/// stay finite and precise.
const MAX_REPORTED_COST: f64 = 1e14;

/// A reported cost as a number the sums can take: NaN, infinite and
/// negative values count as 0, huge ones as [`MAX_REPORTED_COST`].
fn reported_cost(cost: f64) -> f64 {
    if cost.is_finite() && cost > 0.0 {
        cost.min(MAX_REPORTED_COST)
    } else {
        0.0
    }
}

/// Whether a wire record holds any cost the sums can take.
fn reports_cost(count: &sluice_proto::v1::BucketCount) -> bool {
    [
        count.offered_cost,
        count.admitted_cost,
        count.charged_cost,
        count.settled_cost,
    ]
    .into_iter()
    .any(|cost| reported_cost(cost) > 0.0)
}

impl Counts {
    fn add(&mut self, count: &sluice_proto::v1::BucketCount) {
        self.offered = self.offered.saturating_add(count.offered);
        self.admitted = self.admitted.saturating_add(count.admitted);
        self.shadow_dropped = self.shadow_dropped.saturating_add(count.shadow_dropped);
        self.offered_cost += reported_cost(count.offered_cost);
        self.admitted_cost += reported_cost(count.admitted_cost);
        self.charged_cost += reported_cost(count.charged_cost);
        self.settled_cost += reported_cost(count.settled_cost);
    }
}

#[derive(Debug)]
struct Proxy {
    /// The stream that speaks for this instance; `None` once it ended.
    stream: Option<StreamId>,
    /// The certificate name the owning stream proved; `None` without
    /// client certificates.
    principal: Option<Arc<str>>,
    instance_id: u64,
    /// Failure domain from the Hello.
    zone: String,
    /// When the proxy last reported (its Hello before the first report).
    /// Only the operator view reads it.
    last_report: Instant,
    /// Directive age (ms) named by the last report of the current stream.
    /// Only the operator view reads it.
    directive_age_ms: Option<u64>,
    /// Σ window_ms of the reports since the previous tick.
    window_ms: u64,
    /// Σ counts of the reports since the previous tick.
    counts: IdMap<Counts>,
    /// The cell of each entry of the previous report: a proxy lists the
    /// same cells in the same order report after report, so checking the
    /// hint's key is enough and the strings need no hashing.
    hints: Vec<CellId>,
    /// Rates as of the last tick that had reports.
    rates: Vec<(CellId, Rates)>,
    /// The long run of its charges of each budget cell it reports.
    charge_history: IdMap<ChargeHistory>,
    /// Ticks since the last one that had reports.
    silent_ticks: u32,
    /// Ticks since the last one that had reports or a Hello of its current
    /// stream: how long the process has been silent.
    quiet_ticks: u32,
    /// How many silent ticks its rates are carried; `None`: the fleet's.
    carry_ticks: Option<u32>,
    /// Ticks of probation left (see [`ShareCap::probation_ticks`]): 0 once
    /// established.
    unproven_ticks: u32,
    /// Reports accepted from this instance.
    reports: u64,
    /// Set when this instance said Hello beside a live one: which, and how
    /// many reports it had then. See [`Fleet::take_conflicts`].
    unconfirmed_conflict: Option<UnconfirmedConflict>,
}

/// The mean age, in ticks, of a proxy's long run of a budget cell's
/// charges: the charge factor's horizon at the default control interval
/// (`charge_ratio::HORIZON_S`), so a proxy's long run and the factor it is
/// weighed into rest on the same streams.
const CHARGE_HISTORY_TICKS: f64 = 60.0;
/// A long run not added to for this many ticks (four mean ages: it weighs
/// a fiftieth of what it did) is dropped.
const CHARGE_HISTORY_KEPT_TICKS: u64 = 240;

/// A proxy's long run of one budget cell's charges: exponential sums of
/// its windows' plausible charges, a mean age of [`CHARGE_HISTORY_TICKS`].
#[derive(Debug, Clone, Copy)]
struct ChargeHistory {
    sums: CellCharges,
    /// The tick it began at: it speaks for the cell only if the cell's id
    /// was not handed out again since ([`interner::Slot::born`]).
    started: u64,
    /// The tick of its last window.
    updated: u64,
}

impl ChargeHistory {
    /// Adds the window of `tick` to the sums, after decaying them for the
    /// ticks since the last window.
    fn add(&mut self, window: CellCharges, tick: u64) -> CellCharges {
        let ticks = i32::try_from(tick.saturating_sub(self.updated)).unwrap_or(i32::MAX);
        let decay = (1.0 - 1.0 / CHARGE_HISTORY_TICKS).powi(ticks);
        self.sums = CellCharges {
            charged_per_s: self.sums.charged_per_s * decay + window.charged_per_s,
            settled_per_s: self.sums.settled_per_s * decay + window.settled_per_s,
        };
        self.updated = tick;
        self.sums
    }
}

/// A Hello beside a live instance of the same proxy id, not yet known to be
/// two processes: a restarted Envoy says Hello while the connection of its
/// frozen predecessor lingers, and that is no conflict.
#[derive(Debug, Clone, Copy)]
struct UnconfirmedConflict {
    holder: u64,
    holder_reports: u64,
}

/// Two live processes that share one proxy id: both reported after the
/// second one's Hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProxyIdConflict {
    /// The shared proxy id.
    pub(crate) proxy_id: String,
    /// The instance that held the id first.
    pub(crate) holder: u64,
    /// The instance that said Hello beside it.
    pub(crate) newcomer: u64,
}

impl Proxy {
    fn new(
        stream: StreamId,
        principal: Option<Arc<str>>,
        instance_id: u64,
        zone: &str,
        probation_ticks: u32,
    ) -> Self {
        Self {
            stream: Some(stream),
            principal,
            instance_id,
            zone: zone.to_owned(),
            last_report: Instant::now(),
            directive_age_ms: None,
            window_ms: 0,
            counts: IdMap::default(),
            hints: Vec::new(),
            rates: Vec::new(),
            charge_history: IdMap::default(),
            silent_ticks: 0,
            quiet_ticks: 0,
            carry_ticks: None,
            unproven_ticks: probation_ticks,
            reports: 0,
            unconfirmed_conflict: None,
        }
    }

    /// Whether its stream is open but nothing came on it for longer than
    /// its rates are carried: the process froze or vanished without the
    /// connection closing.
    fn is_silent(&self, fleet_carry_ticks: u32) -> bool {
        self.stream.is_some()
            && self.window_ms == 0
            && self.quiet_ticks > self.carry_ticks.unwrap_or(fleet_carry_ticks)
    }

    fn established(&self) -> bool {
        self.unproven_ticks == 0
    }
}

/// A proxy's mean cost per request within this factor of the bucket's
/// median counts as the median's in the share cap's weighing.
const MEAN_COST_SPREAD: f64 = 4.0;

/// What a proxy's claim on a bucket weighs in the share cap: its offered
/// rate, or for a bucket steered on cost whose median cost per request is
/// known, its requests at that median, scaled up by how far its own mean
/// cost per request exceeds [`MEAN_COST_SPREAD`] times the median.
fn cost_claim(
    mean_costs: &[Vec<f64>],
    cost_bounds: &[Option<f64>],
    bucket: u32,
    rates: &Rates,
) -> f64 {
    claim_at(
        cost_spread(mean_costs, bucket, rates),
        cost_bounds,
        bucket,
        rates,
    )
}

/// [`cost_claim`] from the proxy's [`cost_spread`], already computed.
fn claim_at(
    spread: Option<(f64, f64)>,
    cost_bounds: &[Option<f64>],
    bucket: u32,
    rates: &Rates,
) -> f64 {
    match spread {
        Some((median, spread)) => rates.offered_rps * median * spread,
        None => rates.steering(steers_on_cost(cost_bounds, bucket)).0,
    }
}

/// The bucket's median cost per request and how far a proxy's own mean
/// cost per request exceeds [`MEAN_COST_SPREAD`] times it (1 within the
/// spread), when the median is known and the proxy offered requests.
fn cost_spread(mean_costs: &[Vec<f64>], bucket: u32, rates: &Rates) -> Option<(f64, f64)> {
    let median = mean_costs
        .get(bucket as usize)
        .and_then(|m| m.first().copied())
        .filter(|m| *m > 0.0)?;
    (rates.offered_rps > 0.0).then(|| {
        let mean = rates.offered_cost / rates.offered_rps;
        (median, (mean / (MEAN_COST_SPREAD * median)).max(1.0))
    })
}

/// Whether the bucket `bucket` steers on cost: it has a bound per request
/// in `cost_bounds` ([`Sums::cost_bounds`]).
fn steers_on_cost(cost_bounds: &[Option<f64>], bucket: u32) -> bool {
    cost_bounds
        .get(bucket as usize)
        .is_some_and(Option::is_some)
}

/// Per-tick sums, kept between ticks so the arrays are allocated once.
#[derive(Debug, Default)]
struct Sums {
    /// Per cell id: the steering load, its shadow-dropped rate, and the
    /// cost and request rates side by side.
    /// And what its streams were charged, as far as it counts.
    cells: Vec<(BucketLoad, f64, BucketCost, PartCharges)>,
    /// Per bucket id: the most estimated cost one request counts
    /// ([`Rates::bound_cost`]) when the bucket steers on cost, else `None`.
    cost_bounds: Vec<Option<f64>>,
    /// Each proxy's plausible charges of a budget's cell this tick, and
    /// their long run, by cell id: weighed against each other before they
    /// are summed.
    charges: Vec<(u32, PartCharges)>,
    /// Per bucket id steered on cost: the mean cost per request of each
    /// (proxy, cell) this tick, then their median in the first place.
    mean_costs: Vec<Vec<f64>>,
    /// Per bucket id: the last proxy (index + 1) counted as reporting it.
    last_proxy: Vec<usize>,
    proxies_reporting: Vec<u32>,
    /// Per bucket id: the share cap in force, when one applies.
    caps: Vec<Option<ProxyCap>>,
    /// Per proxy (tick order): whether a claim of it was ignored.
    ignored: Vec<bool>,
    /// Per cell id: whether a proxy offered requests of a budget's cell
    /// but no cost (no cost rule applies to them on that proxy).
    uncosted: Vec<bool>,
}

/// All proxies, keyed by proxy id: usually one instance each, more when
/// live processes share an id.
#[derive(Debug)]
pub struct Fleet {
    /// Ordered by proxy id, so every tick sums the proxies' rates in one
    /// order: floating-point sums in another order differ in their last
    /// bits, enough to move a drop ratio across a threshold, and the
    /// simulator's runs would then differ from process to process.
    proxies: BTreeMap<String, Vec<Proxy>>,
    carry_ticks: u32,
    caps: FleetCaps,
    cells: Interner,
    stats: FleetStats,
    tick: u64,
    sums: Sums,
    weights: ClaimWeights,
    /// Streams of silent instances closed by the last tick.
    superseded: Vec<StreamId>,
    /// Conflicts the last tick confirmed.
    conflicts: Vec<ProxyIdConflict>,
    /// Budget cells without cost the last tick found, when a warning is
    /// due.
    uncosted: Option<UncostedBudget>,
    /// The tick of the last warning about them.
    uncosted_warned: Option<u64>,
}

/// Cells of a budget whose proxies count no cost, as the log names them
/// ([`Fleet::take_uncosted_warning`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UncostedBudget {
    /// How many cells, this tick.
    pub(crate) cells: usize,
    /// The first of them, by bucket then tenant.
    pub(crate) bucket: Arc<str>,
    /// Its tenant.
    pub(crate) tenant: Arc<str>,
}

/// Ticks between two warnings about budget cells without cost (a minute
/// at the default interval): `sluice_budget_cells_without_cost` shows
/// them at every tick, the log only reminds.
const UNCOSTED_WARNING_TICKS: u64 = 120;

/// Reports a holder must send after a newcomer's Hello before the two are
/// a conflict: one may have been on its way when its process froze.
pub(crate) const CONFLICT_HOLDER_REPORTS: u64 = 2;

/// Settles the unconfirmed conflicts of one proxy id's instances: confirmed
/// ones go to `conflicts`; those whose holder has no live stream any more
/// (it closed, or was superseded as silent) were a restart.
fn confirm_conflicts(
    proxy_id: &str,
    instances: &mut [Proxy],
    conflicts: &mut Vec<ProxyIdConflict>,
) {
    let holders: Vec<(u64, u64)> = instances
        .iter()
        .filter(|proxy| proxy.stream.is_some())
        .map(|proxy| (proxy.instance_id, proxy.reports))
        .collect();
    for proxy in instances.iter_mut() {
        let Some(pending) = proxy.unconfirmed_conflict else {
            continue;
        };
        let holder_reports = holders
            .iter()
            .find(|(instance, _)| *instance == pending.holder)
            .map(|(_, reports)| *reports);
        match holder_reports {
            None => proxy.unconfirmed_conflict = None,
            Some(_) if proxy.stream.is_none() => proxy.unconfirmed_conflict = None,
            Some(reports)
                if proxy.reports > 0
                    && reports
                        >= pending
                            .holder_reports
                            .saturating_add(CONFLICT_HOLDER_REPORTS) =>
            {
                proxy.unconfirmed_conflict = None;
                conflicts.push(ProxyIdConflict {
                    proxy_id: proxy_id.to_owned(),
                    holder: pending.holder,
                    newcomer: proxy.instance_id,
                });
            }
            Some(_) => {}
        }
    }
}

impl Fleet {
    /// How many control intervals a silent proxy's rates are carried.
    pub const DEFAULT_CARRY_TICKS: u32 = 3;

    /// An empty fleet with the default caps; silent proxies keep their rates
    /// for `carry_ticks` ticks.
    pub fn new(carry_ticks: u32) -> Self {
        Self::with_caps(carry_ticks, FleetCaps::default())
    }

    /// An empty fleet with the given caps.
    pub(crate) fn with_caps(carry_ticks: u32, caps: FleetCaps) -> Self {
        Self {
            proxies: BTreeMap::new(),
            carry_ticks,
            caps,
            cells: Interner::default(),
            stats: FleetStats::default(),
            tick: 0,
            sums: Sums::default(),
            weights: ClaimWeights::default(),
            superseded: Vec::new(),
            conflicts: Vec::new(),
            uncosted: None,
            uncosted_warned: None,
        }
    }

    /// The caps in force.
    pub(crate) fn caps(&self) -> FleetCaps {
        self.caps
    }

    /// Changes how much one proxy's claim for a bucket may weigh, from the
    /// next tick.
    pub fn set_share_cap(&mut self, share_cap: ShareCap) {
        self.caps.share_cap = share_cap;
    }

    /// A stream said Hello for `proxy_id` as `instance_id`. A new stream of
    /// a known instance replaces its old one (an Envoy whose leader VM
    /// changed opens a new stream before the old one is torn down); a new
    /// instance replaces one whose process is gone, and is a proxy of its
    /// own beside a live one ([`Connected::Conflict`]).
    pub fn connect(&mut self, proxy_id: &str, instance_id: u64, stream: StreamId) -> Connected {
        self.connect_in_zone(proxy_id, instance_id, "", stream)
    }

    /// [`Fleet::connect`] with the zone the Hello named, for a stream
    /// without an identity (a listener without client certificates).
    pub fn connect_in_zone(
        &mut self,
        proxy_id: &str,
        instance_id: u64,
        zone: &str,
        stream: StreamId,
    ) -> Connected {
        self.attach(proxy_id, None, instance_id, zone, stream)
    }

    /// [`Fleet::connect_in_zone`] for a stream whose client certificate
    /// proved `principal`: it is refused while a live stream of another
    /// principal holds the proxy id.
    pub(crate) fn connect_as(
        &mut self,
        proxy_id: &str,
        principal: Arc<str>,
        instance_id: u64,
        zone: &str,
        stream: StreamId,
    ) -> Result<Connected, HeldByAnother> {
        if let Some(held) = self.proxies.get(proxy_id).and_then(|instances| {
            instances.iter().find(|proxy| {
                proxy.stream.is_some() && proxy.principal.as_deref() != Some(principal.as_ref())
            })
        }) {
            return Err(HeldByAnother {
                holder: held.principal.clone(),
            });
        }
        Ok(self.attach(proxy_id, Some(principal), instance_id, zone, stream))
    }

    fn attach(
        &mut self,
        proxy_id: &str,
        principal: Option<Arc<str>>,
        instance_id: u64,
        zone: &str,
        stream: StreamId,
    ) -> Connected {
        let probation_ticks = self.caps.share_cap.probation_ticks;
        let carry_ticks = self.carry_ticks;
        let Some(instances) = self.proxies.get_mut(proxy_id) else {
            self.proxies.insert(
                proxy_id.to_owned(),
                vec![Proxy::new(
                    stream,
                    principal,
                    instance_id,
                    zone,
                    probation_ticks,
                )],
            );
            return Connected::New;
        };
        // The same process, else one that is gone: its id passes on.
        let taken = instances
            .iter()
            .position(|proxy| proxy.instance_id == instance_id)
            .or_else(|| instances.iter().position(|proxy| proxy.stream.is_none()))
            .or_else(|| {
                instances
                    .iter()
                    .position(|proxy| proxy.is_silent(carry_ticks))
            });
        let Some(proxy) = taken.and_then(|at| instances.get_mut(at)) else {
            let (holder, holder_reports) = instances
                .first()
                .map_or((0, 0), |proxy| (proxy.instance_id, proxy.reports));
            let mut newcomer = Proxy::new(stream, principal, instance_id, zone, probation_ticks);
            newcomer.unconfirmed_conflict = Some(UnconfirmedConflict {
                holder,
                holder_reports,
            });
            instances.push(newcomer);
            return Connected::Conflict { holder };
        };
        let previous = proxy.stream.replace(stream);
        let previous_instance = proxy.instance_id;
        if previous_instance != instance_id {
            // A new process earns its weight anew.
            proxy.instance_id = instance_id;
            proxy.unproven_ticks = probation_ticks;
            proxy.reports = 0;
            proxy.unconfirmed_conflict = None;
        }
        proxy.principal = principal;
        zone.clone_into(&mut proxy.zone);
        proxy.last_report = Instant::now();
        proxy.directive_age_ms = None;
        proxy.quiet_ticks = 0;
        Connected::Replaced {
            previous,
            previous_instance,
        }
    }

    /// Adds a report's counts to the proxy's current window, every bucket
    /// treated as limited. Entries the caps refuse are skipped and counted;
    /// the rest of the report counts.
    pub fn report(
        &mut self,
        proxy_id: &str,
        stream: StreamId,
        report: &Report,
    ) -> Result<(), ReportRejected> {
        self.report_classified(proxy_id, stream, report, &|_| true)
    }

    /// [`Self::report`], where `limited` says which buckets have a limit:
    /// new cells of the others may fill only [`unlimited_share`] of the
    /// fleet's and of the proxy's cap, so a flood of one-off keys cannot
    /// keep a limited bucket's cells from being tracked.
    pub(crate) fn report_classified(
        &mut self,
        proxy_id: &str,
        stream: StreamId,
        report: &Report,
        limited: &dyn Fn(&str) -> bool,
    ) -> Result<(), ReportRejected> {
        let Self {
            proxies,
            caps,
            cells,
            stats,
            tick,
            ..
        } = self;
        let proxy = proxies
            .get_mut(proxy_id)
            .and_then(|instances| {
                instances
                    .iter_mut()
                    .find(|proxy| proxy.stream == Some(stream))
            })
            .ok_or(ReportRejected::Superseded)?;
        if report.window_ms == 0 {
            return Err(ReportRejected::EmptyWindow);
        }
        proxy.window_ms = proxy.window_ms.saturating_add(report.window_ms);
        proxy.reports = proxy.reports.saturating_add(1);
        proxy.last_report = Instant::now();
        proxy.directive_age_ms = report.directive_age_ms;
        proxy.hints.resize(report.buckets.len(), NO_CELL);
        for (count, hint) in report.buckets.iter().zip(proxy.hints.iter_mut()) {
            // Reports list only cells with traffic; a zero entry would only
            // create state. A cost is traffic: a stream that ends in a
            // window without new requests of its cell is charged in it,
            // and one its provider charged nothing still settles its
            // estimate.
            if count.offered == 0 && !reports_cost(count) {
                continue;
            }
            if count.bucket.len() > caps.max_bucket_len || count.tenant.len() > caps.max_tenant_len
            {
                stats.rejected_key_too_long += 1;
                continue;
            }
            let priority = Priority::from_wire(count.priority);
            let known = if cells.matches(*hint, &count.bucket, &count.tenant, priority) {
                Some(*hint)
            } else {
                cells.find(&count.bucket, &count.tenant, priority)
            };
            if let Some(id) = known
                && let Some(counts) = proxy.counts.get_mut(&id)
            {
                *hint = id;
                counts.add(count);
                continue;
            }
            if proxy.counts.len() >= caps.max_cells_per_proxy {
                stats.rejected_proxy_cap += 1;
                continue;
            }
            let unlimited_full =
                |used: usize, cap: usize| used >= unlimited_share(cap) && !limited(&count.bucket);
            if unlimited_full(proxy.counts.len(), caps.max_cells_per_proxy) {
                stats.rejected_unlimited_share += 1;
                continue;
            }
            let id = match known {
                Some(id) => id,
                None if cells.live >= caps.max_cells => {
                    stats.rejected_fleet_cap += 1;
                    continue;
                }
                None if unlimited_full(cells.live, caps.max_cells) => {
                    stats.rejected_unlimited_share += 1;
                    continue;
                }
                // Marked seen now so a tick cannot evict it before the
                // window that holds it closes.
                None => cells.insert(&count.bucket, &count.tenant, priority, *tick),
            };
            *hint = id;
            proxy.counts.entry(id).or_default().add(count);
        }
        Ok(())
    }

    /// Carries the rates of the proxy `stream` speaks for for `ticks`
    /// silent ticks instead of the fleet's default: a proxy that reports
    /// less often than every control interval (Envoy's `rate_limit_quota`
    /// filter reports every 5 s) must not drop out of the sum between its
    /// reports.
    pub(crate) fn set_carry_ticks(&mut self, proxy_id: &str, stream: StreamId, ticks: u32) {
        if let Some(proxy) = self.instance_mut(proxy_id, stream) {
            proxy.carry_ticks = Some(ticks);
        }
    }

    /// The stream ended. Only the stream that speaks for a proxy can
    /// disconnect it; its rates are carried like those of any silent proxy,
    /// so a quick reconnect does not make the fleet rate dip.
    pub fn disconnect(&mut self, proxy_id: &str, stream: StreamId) -> bool {
        match self.instance_mut(proxy_id, stream) {
            Some(proxy) => {
                proxy.stream = None;
                true
            }
            None => false,
        }
    }

    fn instance_mut(&mut self, proxy_id: &str, stream: StreamId) -> Option<&mut Proxy> {
        self.proxies.get_mut(proxy_id).and_then(|instances| {
            instances
                .iter_mut()
                .find(|proxy| proxy.stream == Some(stream))
        })
    }

    /// Instance id of the proxy id's first instance, as its latest Hello
    /// announced it.
    #[cfg(test)]
    pub(crate) fn instance_id(&self, proxy_id: &str) -> Option<u64> {
        self.proxies
            .get(proxy_id)
            .and_then(|instances| instances.first())
            .map(|proxy| proxy.instance_id)
    }

    /// Streams of silent instances the last [`Fleet::tick`] let go, because
    /// another live instance of their proxy id reports: they must be
    /// closed. Taken once.
    pub(crate) fn take_superseded(&mut self) -> Vec<StreamId> {
        std::mem::take(&mut self.superseded)
    }

    /// Proxy ids the last [`Fleet::tick`] found held by two live processes:
    /// an instance that said Hello beside another is a conflict once it
    /// has reported and the other has reported [`CONFLICT_HOLDER_REPORTS`]
    /// times since that Hello (a frozen predecessor's stream, superseded
    /// meanwhile, is not one). Taken once.
    pub(crate) fn take_conflicts(&mut self) -> Vec<ProxyIdConflict> {
        std::mem::take(&mut self.conflicts)
    }

    /// The budget cells whose proxies offered requests but no cost at the
    /// last tick, when it is time to warn about them: at the first tick
    /// that finds any, then at most every [`UNCOSTED_WARNING_TICKS`].
    pub(crate) fn take_uncosted_warning(&mut self) -> Option<UncostedBudget> {
        self.uncosted.take()
    }

    /// Every tracked proxy, sorted by proxy id then instance: connected ones
    /// and disconnected ones whose rates are still carried.
    pub(crate) fn proxies(&self) -> Vec<ProxyStatus> {
        let now = Instant::now();
        let mut proxies: Vec<ProxyStatus> = self
            .proxies
            .iter()
            .flat_map(|(proxy_id, instances)| {
                let live = instances.iter().filter(|p| p.stream.is_some()).count();
                instances.iter().map(move |proxy| ProxyStatus {
                    proxy_id: proxy_id.clone(),
                    zone: proxy.zone.clone(),
                    instance_id: proxy.instance_id,
                    connected: proxy.stream.is_some(),
                    conflict: proxy.stream.is_some() && live > 1,
                    established: proxy.established(),
                    since_last_report: now.saturating_duration_since(proxy.last_report),
                    cells: proxy.rates.len(),
                    directive_age: proxy.directive_age_ms.map(Duration::from_millis),
                })
            })
            .collect();
        proxies.sort_unstable_by(|a, b| {
            (&a.proxy_id, a.instance_id).cmp(&(&b.proxy_id, b.instance_id))
        });
        proxies
    }

    /// The ids of the proxies with an open stream, sorted, each once.
    pub(crate) fn connected_proxy_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .proxies
            .iter()
            .filter(|(_, instances)| instances.iter().any(|proxy| proxy.stream.is_some()))
            .map(|(proxy_id, _)| proxy_id.clone())
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Number of proxies still tracked (connected, or disconnected but
    /// still carried); two instances of one id count twice.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.proxies.values().map(Vec::len).sum()
    }

    /// Whether no proxy is tracked.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.proxies.is_empty()
    }

    /// Cells tracked right now.
    #[cfg(test)]
    pub(crate) fn cells(&self) -> usize {
        self.cells.live
    }

    /// Closes the current window of every proxy and returns the fleet load,
    /// every bucket steered on requests.
    pub fn tick(&mut self) -> FleetLoad {
        self.tick_with(&|_| None)
    }

    /// Closes the current window of every proxy and returns the fleet load.
    ///
    /// For each proxy, `rate_c = Σcounts_c / Σwindow` over the reports since
    /// the previous tick. A proxy without reports keeps its previous rates
    /// for `carry_ticks` ticks, then contributes nothing; a disconnected one
    /// is forgotten at that point. Cells no proxy's rates mention are
    /// evicted.
    ///
    /// Buckets for which `costed` answers a rate (their limit is a budget
    /// of that many cost units a second) are summed, each request counting
    /// at most [`COUNTED_BUDGET_S`] of the budget ([`Rates::bound_cost`]),
    /// weighed by the share cap and handed on in cost per second
    /// (`offered_cost`, `admitted_cost`) instead of requests: the
    /// controller, the share cap and the replicas then treat cost rates
    /// exactly as request rates, and [`BucketTraffic::cost`] keeps the
    /// request rates beside them.
    pub fn tick_with(&mut self, costed: &dyn Fn(&str) -> Option<f64>) -> FleetLoad {
        let carry_ticks = self.carry_ticks;
        let superseded = &mut self.superseded;
        superseded.clear();
        let conflicts = &mut self.conflicts;
        conflicts.clear();
        self.proxies.retain(|proxy_id, instances| {
            for proxy in instances.iter_mut() {
                proxy.close_window(proxy.carry_ticks.unwrap_or(carry_ticks));
            }
            // A frozen process keeps its connection open until keepalive
            // gives up; once another instance of its id reports, let it go.
            if instances.len() > 1
                && instances
                    .iter()
                    .any(|proxy| proxy.stream.is_some() && !proxy.is_silent(carry_ticks))
            {
                for proxy in instances.iter_mut() {
                    if proxy.is_silent(carry_ticks)
                        && let Some(stream) = proxy.stream.take()
                    {
                        superseded.push(stream);
                    }
                }
            }
            confirm_conflicts(proxy_id, instances, conflicts);
            instances.retain(|proxy| proxy.stream.is_some() || !proxy.rates.is_empty());
            !instances.is_empty()
        });
        self.tick += 1;
        let tick = self.tick;

        let sums = &mut self.sums;
        sums.charges.clear();
        sums.uncosted.clear();
        sums.uncosted.resize(self.cells.slots.len(), false);
        sums.cells.clear();
        sums.cells.resize(
            self.cells.slots.len(),
            (
                BucketLoad::default(),
                0.0,
                BucketCost::default(),
                PartCharges::default(),
            ),
        );
        let buckets = self.cells.next_bucket as usize;
        sums.cost_bounds.clear();
        sums.cost_bounds.resize(buckets, None);
        for (name, cells) in &self.cells.buckets {
            if let Some(bound) = sums.cost_bounds.get_mut(cells.id as usize) {
                *bound = costed(name).map(|rate| rate * COUNTED_BUDGET_S);
            }
        }
        for proxy in self.proxies.values_mut().flatten() {
            for (id, rates) in &mut proxy.rates {
                let bound = self
                    .cells
                    .slots
                    .get(*id as usize)
                    .and_then(Option::as_ref)
                    .and_then(|slot| sums.cost_bounds.get(slot.bucket as usize).copied())
                    .flatten();
                if let Some(per_request) = bound {
                    rates.bound_cost(per_request);
                }
            }
        }
        sums.last_proxy.clear();
        sums.last_proxy.resize(buckets, 0);
        sums.proxies_reporting.clear();
        sums.proxies_reporting.resize(buckets, 0);
        // A cost claim is weighed by its requests at the bucket's median
        // cost per request: a few heavy requests make one interval's cost
        // of a proxy several times its usual (and a few cheap ones a
        // fraction), which is no sign of a lie, while its request count is
        // Poisson. A mean cost beyond MEAN_COST_SPREAD times the median
        // counts beyond it, so inflated costs are still capped.
        let mean_costs = &mut sums.mean_costs;
        mean_costs.resize_with(buckets, Vec::new);
        mean_costs.iter_mut().for_each(Vec::clear);
        for proxy in self.proxies.values().flatten() {
            for &(id, rates) in &proxy.rates {
                let Some(Some(slot)) = self.cells.slots.get(id as usize) else {
                    continue;
                };
                if steers_on_cost(&sums.cost_bounds, slot.bucket)
                    && rates.offered_rps > 0.0
                    && let Some(means) = mean_costs.get_mut(slot.bucket as usize)
                {
                    means.push(rates.offered_cost / rates.offered_rps);
                }
            }
        }
        for means in mean_costs.iter_mut() {
            means.sort_unstable_by(f64::total_cmp);
            let median = means.get(means.len() / 2).copied();
            means.clear();
            means.extend(median);
        }
        let weights = &mut self.weights;
        let proxy_count = self.proxies.values().map(Vec::len).sum();
        weights.begin(&self.caps.share_cap, buckets, proxy_count);
        for proxy in self.proxies.values().flatten() {
            let slots = &self.cells.slots;
            weights.add_proxy(
                proxy.established(),
                proxy.rates.iter().filter_map(|&(id, rates)| {
                    let slot = slots.get(id as usize)?.as_ref()?;
                    let claim = cost_claim(mean_costs, &sums.cost_bounds, slot.bucket, &rates);
                    Some((slot.bucket, claim))
                }),
            );
        }
        let (capped, ignored) = weights.weigh(&self.caps.share_cap);
        sums.ignored.clear();
        sums.ignored.resize(proxy_count, false);
        for (index, proxy) in self.proxies.values_mut().flatten().enumerate() {
            weights.load_proxy(index);
            // Long runs of cells whose ids were handed out again, or that
            // the proxy stopped reporting long ago, are another cell's or
            // nobody's.
            let slots = &self.cells.slots;
            proxy.charge_history.retain(|&id, history| {
                tick.saturating_sub(history.updated) <= CHARGE_HISTORY_KEPT_TICKS
                    && slots
                        .get(id as usize)
                        .and_then(Option::as_ref)
                        .is_some_and(|slot| slot.born <= history.started)
            });
            for &(id, rates) in &proxy.rates {
                let Some(Some(slot)) = self.cells.slots.get_mut(id as usize) else {
                    continue;
                };
                slot.seen = tick;
                let bucket = slot.bucket as usize;
                let share = weights.factor(slot.bucket);
                let mut factor = share;
                // Whether what it admits counts by its requests (below).
                let mut admissions_by_requests = false;
                if factor < 1.0 && factor > 0.0 {
                    // The cap cut the claim as weighed; of the cost it
                    // counts no more than that.
                    let spread = cost_spread(&sums.mean_costs, slot.bucket, &rates);
                    let claim = claim_at(spread, &sums.cost_bounds, slot.bucket, &rates);
                    let steered = steers_on_cost(&sums.cost_bounds, slot.bucket);
                    let (offered, _, _) = rates.steering(steered);
                    if offered > 0.0 {
                        factor = (claim * factor / offered).min(1.0);
                    }
                    admissions_by_requests =
                        steered && spread.is_some_and(|(_, spread)| spread <= 1.0);
                }
                // An ignored claim counts for nothing, not even as a
                // reporting proxy (the filters split allowances by that).
                if factor <= 0.0 {
                    if let Some(ignored) = sums.ignored.get_mut(index) {
                        *ignored = true;
                    }
                    continue;
                }
                let steered = steers_on_cost(&sums.cost_bounds, slot.bucket);
                let uncosted_here = steered && rates.offered_rps > 0.0 && rates.offered_cost <= 0.0;
                if uncosted_here && let Some(uncosted) = sums.uncosted.get_mut(id as usize) {
                    *uncosted = true;
                }
                if let Some((sum, shadow, cost, _)) = sums.cells.get_mut(id as usize) {
                    let (offered, admitted, shadow_dropped) = rates.steering(steered);
                    sum.offered_rps += offered * factor;
                    // A capped proxy admits as if it offered its counted
                    // part (the directives list it), so what it admits
                    // counts in full up to that part: scaling it down as
                    // well would hide real admissions from the estimator.
                    // On a budget, when its mean cost per request is
                    // plausible, the part is its counted share of the
                    // requests: the claim weighed its cost at the median,
                    // and an honest interval whose few heavy requests
                    // happened to be admitted would otherwise hide most
                    // of their cost from the balance, which then lets the
                    // budget run over by what it did not see.
                    let admitted_share = if admissions_by_requests && rates.admitted_rps > 0.0 {
                        (rates.offered_rps * share / rates.admitted_rps).min(1.0)
                    } else {
                        1.0
                    };
                    let counted = |admitted: f64, offered: f64| {
                        if admissions_by_requests {
                            admitted * admitted_share
                        } else if factor < 1.0 {
                            admitted.min(offered * factor)
                        } else {
                            admitted
                        }
                    };
                    sum.admitted_rps += counted(admitted, offered);
                    if steered && !uncosted_here {
                        // The requests behind the cost, weighed alike: a
                        // proxy that counts none (an older filter during
                        // a rollout) has no requests behind it, and would
                        // only thin the cell's mean cost per request, and
                        // with it the estimate cap the proxies are given.
                        sum.requests_rps += rates.offered_rps * factor;
                    }
                    sum.proxies_reporting += 1;
                    *shadow += shadow_dropped * factor;
                    if proxy.silent_ticks > 0 {
                        // Absolute here; a share once the cell is summed.
                        sum.stale_share += offered * factor;
                    }
                    cost.steered = steered;
                    cost.offered_per_s += rates.offered_cost * factor;
                    cost.admitted_per_s += counted(rates.admitted_cost, rates.offered_cost);
                    cost.charged_per_s += counted(rates.charged_cost, rates.offered_cost);
                    if steered {
                        let window = CellCharges::plausible(&rates, factor);
                        let history = proxy.charge_history.entry(id).or_insert(ChargeHistory {
                            sums: CellCharges::default(),
                            started: tick,
                            updated: tick,
                        });
                        // Carried rates (a silent proxy) are not a new
                        // window of its long run.
                        let long_run = if proxy.silent_ticks == 0 {
                            history.add(window, tick)
                        } else {
                            history.sums
                        };
                        sums.charges.push((id, PartCharges { window, long_run }));
                    }
                    cost.offered_rps += rates.offered_rps * factor;
                    cost.admitted_rps += counted(rates.admitted_rps, rates.offered_rps);
                }
                if let (Some(last), Some(reporting)) = (
                    sums.last_proxy.get_mut(bucket),
                    sums.proxies_reporting.get_mut(bucket),
                ) && *last != index + 1
                {
                    *last = index + 1;
                    *reporting += 1;
                }
            }
            // Cells in a window still open (reports since this tick began
            // cannot exist, but a proxy that has counts keeps them alive).
            for &id in proxy.counts.keys() {
                if let Some(Some(slot)) = self.cells.slots.get_mut(id as usize) {
                    slot.seen = tick;
                }
            }
        }
        // Probation: every tick connected counts, unless a claim was
        // ignored as implausible, which starts it again.
        let probation_ticks = self.caps.share_cap.probation_ticks;
        for (proxy, ignored) in self.proxies.values_mut().flatten().zip(&sums.ignored) {
            if proxy.established() || proxy.stream.is_none() {
                continue;
            }
            proxy.unproven_ticks = if *ignored {
                probation_ticks
            } else {
                proxy.unproven_ticks.saturating_sub(1)
            };
        }
        let caps = &mut sums.caps;
        caps.clear();
        if !weights.caps().is_empty() {
            caps.resize(buckets, None);
            let names: Vec<&String> = self
                .proxies
                .iter()
                .flat_map(|(proxy_id, instances)| instances.iter().map(move |_| proxy_id))
                .collect();
            for (bucket, cap_rps, cut) in weights.caps() {
                let mut capped: Vec<CappedProxy> = cut
                    .iter()
                    .filter_map(|&(proxy, claimed_rps, counted_rps)| {
                        Some(CappedProxy {
                            proxy_id: Arc::from(names.get(proxy)?.as_str()),
                            claimed_rps,
                            counted_rps,
                        })
                    })
                    .collect();
                capped.sort_unstable_by(|a, b| a.proxy_id.cmp(&b.proxy_id));
                if let Some(slot) = caps.get_mut(*bucket as usize) {
                    *slot = Some(ProxyCap {
                        cap_rps: *cap_rps,
                        capped,
                    });
                }
            }
        }
        let mut stats = std::mem::take(&mut self.stats);
        stats.proxies_on_probation = self
            .proxies
            .values()
            .flatten()
            .filter(|proxy| proxy.stream.is_some() && !proxy.established())
            .count();
        stats.evicted_idle = self.cells.evict_unseen(tick);
        stats.claims_capped = capped;
        stats.claims_ignored = ignored;
        // Each budget cell's charges, no proxy's weighing more than the
        // median proxy's.
        sums.charges.sort_unstable_by_key(|(id, _)| *id);
        for group in sums.charges.chunk_by(|a, b| a.0 == b.0) {
            let id = group.first().map_or(u32::MAX, |(id, _)| *id);
            if let Some(cell) = sums.cells.get_mut(id as usize) {
                cell.3 = PartCharges::weighed(group.iter().map(|(_, charges)| *charges));
            }
        }

        let mut load = Vec::with_capacity(self.cells.buckets.len());
        let mut uncosted: Option<(Arc<str>, Arc<str>)> = None;
        for (bucket, cells) in &self.cells.buckets {
            let mut traffic = BucketTraffic {
                bucket: Arc::clone(bucket),
                load: BucketLoad {
                    proxies_reporting: sums
                        .proxies_reporting
                        .get(cells.id as usize)
                        .copied()
                        .unwrap_or(0),
                    ..BucketLoad::default()
                },
                shadow_dropped_rps: 0.0,
                cells: Vec::new(),
                proxy_cap: sums.caps.get_mut(cells.id as usize).and_then(Option::take),
                cost: None,
            };
            let steered = steers_on_cost(&sums.cost_bounds, cells.id);
            let mut bucket_cost = BucketCost {
                steered,
                ..BucketCost::default()
            };
            for (tenant, priorities) in &cells.tenants {
                for (&id, priority) in priorities.iter().zip(Priority::ALL) {
                    let Some(&(sum, shadow, cost, charges)) = sums.cells.get(id as usize) else {
                        continue;
                    };
                    // A budget's cell whose proxies count no cost has
                    // nothing to steer (beside proxies that count some, the
                    // others' requests go uncounted): it shows in the
                    // request rates only, and is counted for the operator.
                    bucket_cost.add(&cost);
                    if steered && sums.uncosted.get(id as usize).copied().unwrap_or(false) {
                        stats.uncosted_budget_cells += 1;
                        bucket_cost.cells_without_cost =
                            bucket_cost.cells_without_cost.saturating_add(1);
                        let first = uncosted.as_ref().is_none_or(|(b, t)| {
                            (bucket.as_ref(), tenant.as_ref()) < (b.as_ref(), t.as_ref())
                        });
                        if first {
                            uncosted = Some((Arc::clone(bucket), Arc::clone(tenant)));
                        }
                    }
                    if sum.offered_rps <= 0.0 {
                        continue;
                    }
                    traffic.load.offered_rps += sum.offered_rps;
                    traffic.load.admitted_rps += sum.admitted_rps;
                    traffic.load.stale_share += sum.stale_share;
                    traffic.load.requests_rps += sum.requests_rps;
                    traffic.shadow_dropped_rps += shadow;
                    traffic.cells.push(CellLoad {
                        tenant: Arc::clone(tenant),
                        priority,
                        load: BucketLoad {
                            stale_share: (sum.stale_share / sum.offered_rps).clamp(0.0, 1.0),
                            ..sum
                        },
                        shadow_dropped_rps: shadow,
                        charges: steered.then_some(charges),
                    });
                }
            }
            if steered || bucket_cost.offered_per_s > 0.0 || bucket_cost.charged_per_s > 0.0 {
                traffic.cost = Some(bucket_cost);
            }
            // A budget whose every cell counts no cost is still listed
            // (with no cells), for the operator to see why it is not held.
            let uncosted_only = traffic.cost.is_some_and(|cost| cost.cells_without_cost > 0);
            if traffic.cells.is_empty() && !uncosted_only {
                continue;
            }
            traffic.load.stale_share = if traffic.load.offered_rps > 0.0 {
                (traffic.load.stale_share / traffic.load.offered_rps).clamp(0.0, 1.0)
            } else {
                0.0
            };
            if traffic.cells.len() > 1 {
                traffic
                    .cells
                    .sort_unstable_by(|a, b| (&a.tenant, a.priority).cmp(&(&b.tenant, b.priority)));
            }
            load.push(traffic);
        }
        stats.cells = self.cells.live;
        stats.buckets = self.cells.buckets.len();
        self.uncosted = None;
        if let Some((bucket, tenant)) = uncosted {
            let due = self
                .uncosted_warned
                .is_none_or(|at| tick.saturating_sub(at) >= UNCOSTED_WARNING_TICKS);
            if due {
                self.uncosted_warned = Some(tick);
                self.uncosted = Some(UncostedBudget {
                    cells: stats.uncosted_budget_cells,
                    bucket,
                    tenant,
                });
            }
        }
        let mut load = FleetLoad::new(load);
        load.stats = stats;
        load
    }
}

impl Proxy {
    fn close_window(&mut self, carry_ticks: u32) {
        if self.window_ms > 0 {
            let seconds = self.window_ms as f64 / 1000.0;
            // Cells absent from every report of the window had no traffic.
            self.rates.clear();
            self.rates.extend(self.counts.drain().map(|(id, counts)| {
                let rates = Rates {
                    offered_rps: counts.offered as f64 / seconds,
                    admitted_rps: counts.admitted as f64 / seconds,
                    shadow_dropped_rps: counts.shadow_dropped as f64 / seconds,
                    offered_cost: counts.offered_cost / seconds,
                    admitted_cost: counts.admitted_cost / seconds,
                    charged_cost: counts.charged_cost / seconds,
                    settled_cost: counts.settled_cost / seconds,
                };
                (id, rates)
            }));
            self.window_ms = 0;
            self.silent_ticks = 0;
            self.quiet_ticks = 0;
        } else {
            self.silent_ticks = self.silent_ticks.saturating_add(1);
            self.quiet_ticks = self.quiet_ticks.saturating_add(1);
            if self.silent_ticks > carry_ticks {
                self.rates.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests;
