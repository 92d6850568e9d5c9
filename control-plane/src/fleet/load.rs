//! What a tick hands the controller: fleet-wide rates per bucket and per
//! cell, and what the fleet refused or evicted.

use std::sync::Arc;

use sluice_core::Priority;

/// One proxy's rates for one cell: requests per second, and the cost its
/// filter counted per second (0 without a cost rule).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rates {
    /// Everything the proxy saw, dropped requests included.
    pub(crate) offered_rps: f64,
    /// What it let through.
    pub(crate) admitted_rps: f64,
    /// What it would have dropped but shadow mode let through.
    pub(crate) shadow_dropped_rps: f64,
    /// The estimated cost of what it saw.
    pub(crate) offered_cost: f64,
    /// The estimated cost of what it let through.
    pub(crate) admitted_cost: f64,
    /// The actual cost charged at stream end.
    pub(crate) charged_cost: f64,
    /// The estimated cost counted for the streams charged.
    pub(crate) settled_cost: f64,
}

impl Rates {
    /// Counts at most `per_request` of estimated cost for each request,
    /// offered or admitted: what a filter counts of one estimate under a
    /// cost directive ([`sluice_core::directive::COUNTED_BUDGET_S`] of the
    /// budget), applied to every proxy, so a cell no directive reached
    /// yet cannot bring one claim of any size into the sums. The charged
    /// cost, the usage of streams that ended, is a measure, not a claim,
    /// and is left as reported.
    ///
    /// The usage a stream reported above what its request was counted is
    /// added to both when the stream ends, in a window that may hold none
    /// of the cell's requests: that much more is counted, at most what
    /// the window's streams were charged and at most their settled
    /// estimates (a stated estimate is never lifted by a usage it did
    /// not have).
    pub(crate) fn bound_cost(&mut self, per_request: f64) {
        let late = self.charged_cost.min(self.settled_cost).max(0.0);
        self.offered_cost = self.offered_cost.min(self.offered_rps * per_request + late);
        self.admitted_cost = self
            .admitted_cost
            .min(self.admitted_rps * per_request + late);
    }

    /// The rates a bucket is steered on: requests, or for a bucket whose
    /// limit is a budget, cost. Shadow drops are counted in requests only,
    /// so their cost is estimated at the cell's mean offered cost.
    pub(crate) fn steering(&self, cost: bool) -> (f64, f64, f64) {
        if !cost {
            return (self.offered_rps, self.admitted_rps, self.shadow_dropped_rps);
        }
        let mean_cost = if self.offered_rps > 0.0 {
            self.offered_cost / self.offered_rps
        } else {
            0.0
        };
        (
            self.offered_cost,
            self.admitted_cost,
            self.shadow_dropped_rps * mean_cost,
        )
    }
}

/// A bucket's cost rates beside its request rates, fleet-wide (per
/// second, each proxy's claim counted as far as the share cap lets it).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct BucketCost {
    /// Whether the bucket's limit is a budget: its [`BucketLoad`] and
    /// cells then hold cost rates, which the controller steers on.
    pub(crate) steered: bool,
    /// Σ estimated cost offered per second.
    pub(crate) offered_per_s: f64,
    /// Σ estimated cost admitted per second.
    pub(crate) admitted_per_s: f64,
    /// Σ actual cost charged per second at stream end.
    pub(crate) charged_per_s: f64,
    /// Σ requests offered per second.
    pub(crate) offered_rps: f64,
    /// Σ requests admitted per second.
    pub(crate) admitted_rps: f64,
    /// Under a budget, the cells whose proxies report requests but no
    /// cost (no cost rule of the filter applies to them): nothing steers
    /// them. Summed over replicas, a cell some of each replica's proxies
    /// report counts once per replica.
    pub(crate) cells_without_cost: u32,
}

impl BucketCost {
    /// The same with every rate made finite and non-negative (`clean`
    /// maps one rate), as read from another process.
    pub(crate) fn cleaned(self, clean: impl Fn(f64) -> f64) -> Self {
        Self {
            steered: self.steered,
            offered_per_s: clean(self.offered_per_s),
            admitted_per_s: clean(self.admitted_per_s),
            charged_per_s: clean(self.charged_per_s),
            offered_rps: clean(self.offered_rps),
            admitted_rps: clean(self.admitted_rps),
            cells_without_cost: self.cells_without_cost,
        }
    }

    /// Adds another part of the fleet (a replica's share).
    pub(crate) fn add(&mut self, other: &Self) {
        self.steered |= other.steered;
        self.offered_per_s += other.offered_per_s;
        self.admitted_per_s += other.admitted_per_s;
        self.charged_per_s += other.charged_per_s;
        self.offered_rps += other.offered_rps;
        self.admitted_rps += other.admitted_rps;
        self.cells_without_cost = self
            .cells_without_cost
            .saturating_add(other.cells_without_cost);
    }
}

/// Fleet-wide load of one bucket or one cell: what a
/// [`crate::control::drop_policy::DropPolicy`] looks at.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BucketLoad {
    /// Σ over proxies of their offered rate.
    pub offered_rps: f64,
    /// Σ over proxies of their admitted rate.
    pub admitted_rps: f64,
    /// Proxies whose offered rate is non-zero.
    pub proxies_reporting: u32,
    /// Share of `offered_rps` carried from earlier ticks (proxies that did
    /// not report this tick, such as Envoy's `rate_limit_quota` filter
    /// between its 5 s reports): 0 when every proxy reported afresh.
    /// Feedback must not learn from a carried number twice.
    pub stale_share: f64,
    /// For a load in cost per second (a budget's): the requests per second
    /// offered behind `offered_rps`, so the cost rate can be estimated as a
    /// request rate times a mean cost per request; 0 for a load in
    /// requests, or when not known (a replica's older share).
    pub requests_rps: f64,
}

/// Fleet-wide load of one cell of a bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct CellLoad {
    /// Tenant; empty when the filter derives none.
    pub tenant: Arc<str>,
    /// Priority as reported.
    pub priority: Priority,
    /// Offered and admitted rates and the proxies reporting the cell.
    pub load: BucketLoad,
    /// Σ over proxies of their shadow-dropped rate.
    pub shadow_dropped_rps: f64,
    /// For a cell of a bucket whose limit is a budget (its rates are
    /// estimates), what its streams were charged, this interval and over
    /// the long run of the proxies reporting it; `None` when not known (a
    /// bucket limited in requests, or a replica's share written before
    /// cells carried their charges).
    pub charges: Option<PartCharges>,
}

/// The most one proxy's charges may run from their estimates over its long
/// run, either way, as far as they count for a budget's charge factor.
pub(crate) const MAX_CHARGE_RATIO: f64 = 8.0;
/// The most estimated cost one proxy's settled streams count for in a
/// window, as a multiple of the estimated cost it counts as offering.
const SETTLED_PER_OFFERED: f64 = 2.0;

/// The most one proxy's window may be charged, as a multiple of its
/// settled estimates: beyond any response against any estimate, only so
/// that sums of charges stay finite.
const WINDOW_CHARGE_RATIO: f64 = 1e6;

/// How far one proxy's long-run charge ratio may stray from the median
/// proxy's of the same cell, either way, before its charges count at the
/// edge of that band: wide enough for honest proxies whose long runs
/// differ by chance (a few heavy responses) or by their clients.
pub(crate) const CHARGE_RATIO_SPREAD: f64 = 2.0;

/// What a budget cell's streams were charged when they ended, as far as
/// the proxies' claims are plausible ([`CellCharges::plausible`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CellCharges {
    /// Σ actual cost charged per second.
    pub charged_per_s: f64,
    /// Σ estimated cost counted for the same streams per second.
    pub settled_per_s: f64,
}

impl CellCharges {
    /// One proxy's window of `rates`, whose claims count `factor` of
    /// themselves (the share cap's): its settled estimates (with their
    /// charges, in proportion) no more than [`SETTLED_PER_OFFERED`] times
    /// the estimated cost it counts as offering, so a proxy sways a
    /// budget's charge factor no more than its claims sway the budget. Its
    /// charges are bounded only by [`WINDOW_CHARGE_RATIO`] here: a window
    /// of a few requests may well be charged dozens of times its estimates
    /// (one long response against a constant), and cutting such windows
    /// would cut the heavy tail every honest proxy has; how far charges
    /// may run from estimates is a matter of each proxy's long run
    /// ([`CellCharges::weighed`]). Charges without settled estimates (older
    /// filters) count up to [`MAX_CHARGE_RATIO`] times as much on the
    /// charged side alone.
    pub(crate) fn plausible(rates: &Rates, factor: f64) -> Self {
        let most = SETTLED_PER_OFFERED * rates.offered_cost * factor.clamp(0.0, 1.0);
        let (charged, settled) = (rates.charged_cost, rates.settled_cost);
        if !(charged.is_finite() && settled.is_finite() && most.is_finite()) {
            return Self::default();
        }
        if settled <= 0.0 {
            return Self {
                charged_per_s: charged.clamp(0.0, MAX_CHARGE_RATIO * most),
                settled_per_s: 0.0,
            };
        }
        let charged = charged.clamp(0.0, settled * WINDOW_CHARGE_RATIO);
        let scale = if settled > most { most / settled } else { 1.0 };
        Self {
            charged_per_s: charged * scale,
            settled_per_s: settled * scale,
        }
    }

    /// The proxies' `parts` of one cell summed. Each proxy's settled
    /// estimates (with its charges, in proportion) count at most the lower
    /// median proxy's, so no one proxy weighs more than the median one
    /// (with three proxies, a third of the weight; with two, a half). And
    /// each proxy's charges count at the ratio of its long run, kept within
    /// [`CHARGE_RATIO_SPREAD`] of the cell's median proxy's long run
    /// ([`ratio_band`]) and within [`MAX_CHARGE_RATIO`] of its estimates
    /// either way: an honest proxy's windows pass as reported, heavy ones
    /// included, while one that reports charges far from the others' moves
    /// the cell's ratio by its weight times that spread. Charges without
    /// settled estimates are added as they are.
    pub(crate) fn weighed(parts: impl Iterator<Item = PartCharges> + Clone) -> Self {
        let median = lower_median(parts.clone().map(|part| part.window.settled_per_s));
        let band = ratio_band(parts.clone());
        parts.fold(Self::default(), |sum, part| {
            let window = part.window;
            // Windows are finite as read (`plausible`, a share's decoding);
            // one that is not is no claim at all.
            if !(window.charged_per_s.is_finite() && window.settled_per_s.is_finite()) {
                return sum;
            }
            let scale = if window.settled_per_s > median {
                median / window.settled_per_s
            } else {
                1.0
            };
            let charged = match (band, part.long_run.ratio()) {
                (Some((low, high)), Some(ratio)) => {
                    let counted = if ratio.is_finite() {
                        ratio.clamp(low, high)
                    } else {
                        high
                    }
                    .clamp(1.0 / MAX_CHARGE_RATIO, MAX_CHARGE_RATIO);
                    if ratio > 0.0 && ratio.is_finite() {
                        window.charged_per_s * counted / ratio
                    } else {
                        // Nothing charged over its long run (or sums past
                        // what a float holds): its estimates at the ratio
                        // that counts.
                        window.settled_per_s * counted
                    }
                }
                _ => window.charged_per_s,
            };
            sum.add(Self {
                charged_per_s: charged * scale,
                settled_per_s: window.settled_per_s * scale,
            })
        })
    }

    /// Charged over settled, when something settled.
    pub(crate) fn ratio(self) -> Option<f64> {
        (self.settled_per_s > 0.0).then(|| self.charged_per_s / self.settled_per_s)
    }

    /// Adds another part of the fleet (a replica's share).
    pub(crate) fn add(self, other: Self) -> Self {
        Self {
            charged_per_s: self.charged_per_s + other.charged_per_s,
            settled_per_s: self.settled_per_s + other.settled_per_s,
        }
    }
}

/// One part's charges of a budget cell (a proxy's, or a replica's share
/// of the fleet): this tick's window, and its long run (exponential sums
/// of its windows, kept by the fleet).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PartCharges {
    /// This tick's plausible charges ([`CellCharges::plausible`]).
    pub window: CellCharges,
    /// Its windows' charges summed with a decay, this one included.
    pub long_run: CellCharges,
}

impl PartCharges {
    /// A part whose long run is not known (a replica's share written
    /// before shares carried it): its window stands for it.
    pub(crate) fn window_only(window: CellCharges) -> Self {
        Self {
            window,
            long_run: window,
        }
    }

    /// The `parts` of one cell weighed against each other
    /// ([`CellCharges::weighed`]), the window and the long run alike: a
    /// proxy's parts into its replica's share, and the replicas' shares
    /// into the fleet's, so that a proxy alone on its replica is held to
    /// the band of the other replicas' long runs as if they were one.
    pub(crate) fn weighed(parts: impl Iterator<Item = Self> + Clone) -> Self {
        let long_runs = parts.clone().map(|part| Self::window_only(part.long_run));
        Self {
            window: CellCharges::weighed(parts),
            long_run: CellCharges::weighed(long_runs),
        }
    }
}

/// The lower median of the positive `values`, 0 without any.
fn lower_median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.filter(|value| *value > 0.0).collect();
    values.sort_unstable_by(f64::total_cmp);
    values
        .get(values.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0.0)
}

/// The first of `voters` (ratio, weight) at which their weights reach
/// `half`.
fn weighted_median<'a>(voters: impl Iterator<Item = &'a (f64, f64)>, half: f64) -> Option<f64> {
    let mut below = 0.0;
    for (ratio, weight) in voters {
        below += weight;
        if below >= half {
            return Some(*ratio);
        }
    }
    None
}

/// The band a proxy's long-run charge ratio counts within: from the lower
/// weighted median of the proxies' long-run ratios over
/// [`CHARGE_RATIO_SPREAD`] to the upper one times it, each proxy weighing
/// its long-run settled estimates, at most the lower median proxy's. A
/// proxy that carries more than half the weight is thus never the median
/// on its own; with two proxies of equal weight the band spans both
/// (neither can tell which one is wrong), and with one, its own ratio.
/// `None` when no proxy has a long run.
fn ratio_band(parts: impl Iterator<Item = PartCharges> + Clone) -> Option<(f64, f64)> {
    let cap = lower_median(parts.clone().map(|part| part.long_run.settled_per_s));
    let mut voters: Vec<(f64, f64)> = parts
        .filter_map(|part| {
            let ratio = part.long_run.ratio()?;
            ratio
                .is_finite()
                .then_some((ratio, part.long_run.settled_per_s.min(cap)))
        })
        .collect();
    voters.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let half = voters.iter().map(|(_, weight)| weight).sum::<f64>() / 2.0;
    let low = weighted_median(voters.iter(), half)?;
    let high = weighted_median(voters.iter().rev(), half)?;
    // The lower median is never above the upper one; kept ordered all the
    // same, since `clamp` wants it.
    let low = low / CHARGE_RATIO_SPREAD;
    Some((low, (high * CHARGE_RATIO_SPREAD).max(low)))
}

/// Fleet-wide load of one bucket: totals and cells.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketTraffic {
    /// Bucket key.
    pub(crate) bucket: Arc<str>,
    /// Totals over the cells; `proxies_reporting` counts each proxy once.
    pub load: BucketLoad,
    /// Σ over the cells of their shadow-dropped rate.
    pub(crate) shadow_dropped_rps: f64,
    /// Cells with a non-zero offered rate, sorted by tenant then priority.
    pub cells: Vec<CellLoad>,
    /// The cap on one proxy's share of the bucket, when enough proxies
    /// report it for one to apply ([`super::ShareCap`]).
    pub(crate) proxy_cap: Option<ProxyCap>,
    /// Cost and request rates side by side, when the bucket's limit is a
    /// budget or its proxies count cost.
    pub(crate) cost: Option<BucketCost>,
}

/// The per-proxy cap in force for a bucket and the proxies it cut.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProxyCap {
    /// Most a proxy's offered rate counts for, in requests per second.
    pub(crate) cap_rps: f64,
    /// Proxies whose claim was capped or ignored, sorted by proxy id.
    pub(crate) capped: Vec<CappedProxy>,
}

/// One proxy's claim for a bucket that the cap cut.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CappedProxy {
    /// The proxy.
    pub(crate) proxy_id: Arc<str>,
    /// The offered rate it reported.
    pub(crate) claimed_rps: f64,
    /// What of it counts in the fleet sum (0: ignored).
    pub(crate) counted_rps: f64,
}

impl BucketTraffic {
    /// The charges of the cells that carry them, summed: the bucket's
    /// charges beside the estimates of the same streams.
    pub(crate) fn cell_charges(&self) -> CellCharges {
        self.cells
            .iter()
            .filter_map(|cell| cell.charges.map(|charges| charges.window))
            .fold(CellCharges::default(), CellCharges::add)
    }

    /// A bucket with one cell (no tenant, unclassified), as a filter that
    /// derives neither reports it.
    pub fn single(bucket: &str, load: BucketLoad) -> Self {
        Self {
            bucket: Arc::from(bucket),
            load,
            shadow_dropped_rps: 0.0,
            cells: vec![CellLoad {
                tenant: Arc::from(""),
                priority: Priority::Unspecified,
                load,
                shadow_dropped_rps: 0.0,
                charges: None,
            }],
            proxy_cap: None,
            cost: None,
        }
    }

    /// A bucket from its cells; totals are computed, `proxies_reporting` is
    /// the largest of the cells' (the proxies view of a real tick counts
    /// distinct proxies instead).
    pub fn from_cells(bucket: &str, mut cells: Vec<CellLoad>) -> Self {
        cells.sort_by(|a, b| (&a.tenant, a.priority).cmp(&(&b.tenant, b.priority)));
        let mut load = BucketLoad::default();
        let mut shadow_dropped_rps = 0.0;
        for cell in &cells {
            load.offered_rps += cell.load.offered_rps;
            load.admitted_rps += cell.load.admitted_rps;
            load.proxies_reporting = load.proxies_reporting.max(cell.load.proxies_reporting);
            load.requests_rps += cell.load.requests_rps;
            shadow_dropped_rps += cell.shadow_dropped_rps;
        }
        Self {
            bucket: Arc::from(bucket),
            load,
            shadow_dropped_rps,
            cells,
            proxy_cap: None,
            cost: None,
        }
    }
}

/// What one tick saw: the load per bucket and what the fleet refused or
/// evicted since the previous tick.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FleetLoad {
    /// Buckets with traffic, sorted by bucket.
    pub buckets: Vec<BucketTraffic>,
    /// Counts since the previous tick.
    pub(crate) stats: FleetStats,
}

impl FleetLoad {
    /// A load from buckets in any order.
    pub fn new(mut buckets: Vec<BucketTraffic>) -> Self {
        buckets.sort_unstable_by(|a, b| a.bucket.cmp(&b.bucket));
        Self {
            buckets,
            stats: FleetStats::default(),
        }
    }

    /// The bucket's traffic, if it has any.
    pub fn get(&self, bucket: &str) -> Option<&BucketTraffic> {
        self.buckets
            .binary_search_by(|b| b.bucket.as_ref().cmp(bucket))
            .ok()
            .and_then(|at| self.buckets.get(at))
    }

    /// Whether no bucket has traffic.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

/// Cells refused and evicted since the previous tick, and cells tracked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FleetStats {
    /// Cells tracked after the tick.
    pub(crate) cells: usize,
    /// Buckets tracked after the tick.
    pub(crate) buckets: usize,
    /// Report entries refused: bucket or tenant longer than allowed.
    pub(crate) rejected_key_too_long: u64,
    /// Report entries refused: the proxy already had its maximum of cells
    /// in the window.
    pub(crate) rejected_proxy_cap: u64,
    /// Report entries refused: the fleet already tracked its maximum of
    /// cells.
    pub(crate) rejected_fleet_cap: u64,
    /// Report entries of unlimited buckets refused: such cells already
    /// filled their share ([`super::unlimited_share`]) of a cap, the rest being
    /// kept for cells with a limit.
    pub(crate) rejected_unlimited_share: u64,
    /// Cells forgotten because no proxy's rates mentioned them any more.
    pub(crate) evicted_idle: u64,
    /// (proxy, bucket) claims counted only up to the bucket's cap.
    pub(crate) claims_capped: u64,
    /// (proxy, bucket) claims ignored as implausible.
    pub(crate) claims_ignored: u64,
    /// Connected proxies still on probation after the tick.
    pub(crate) proxies_on_probation: usize,
    /// Cells of buckets under a budget that a proxy offered requests of
    /// but no cost: no cost rule applies to their requests there, so
    /// nothing steers them (or, beside proxies that count cost, they are
    /// steered without that proxy's requests).
    pub(crate) uncosted_budget_cells: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(offered_cost: f64, charged_cost: f64, settled_cost: f64) -> Rates {
        Rates {
            offered_cost,
            charged_cost,
            settled_cost,
            ..Rates::default()
        }
    }

    fn charges(charged_per_s: f64, settled_per_s: f64) -> CellCharges {
        CellCharges {
            charged_per_s,
            settled_per_s,
        }
    }

    #[test]
    fn a_proxy_s_charges_count_within_its_claims() {
        // As reported, within the bounds.
        let honest = CellCharges::plausible(&rates(30_000.0, 12_000.0, 10_000.0), 1.0);
        assert_eq!(honest, charges(12_000.0, 10_000.0));
        // A window far from its estimates either way is kept (one long
        // response against a constant can be dozens of times its
        // estimate); only beyond a million times is it cut, so that sums
        // stay finite. Its long run is held to the others' in `weighed`.
        let heavy_tail = CellCharges::plausible(&rates(30_000.0, 400_000.0, 10_000.0), 1.0);
        assert_eq!(heavy_tail, charges(400_000.0, 10_000.0));
        let high = CellCharges::plausible(&rates(30_000.0, 1e300, 10_000.0), 1.0);
        assert_eq!(high, charges(1e10, 10_000.0));
        let low = CellCharges::plausible(&rates(30_000.0, 0.0, 10_000.0), 1.0);
        assert_eq!(low, charges(0.0, 10_000.0));
        // Settled beyond twice what it counts as offering: both scaled
        // down alike (the share cap's factor included).
        let heavy = CellCharges::plausible(&rates(30_000.0, 2e9, 1e9), 0.5);
        assert_eq!(heavy, charges(60_000.0, 30_000.0));
        // Charges without settled estimates (older filters), bounded too.
        let older = CellCharges::plausible(&rates(30_000.0, 1e12, 0.0), 1.0);
        assert_eq!(older, charges(480_000.0, 0.0));
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let read = CellCharges::plausible(&rates(30_000.0, bad, bad), 1.0);
            assert!(read.charged_per_s >= 0.0 && read.settled_per_s >= 0.0);
            assert!(read.charged_per_s.is_finite() && read.settled_per_s.is_finite());
        }
    }

    /// A proxy's window without a long run (its first, as far as the
    /// band goes).
    fn window(charged_per_s: f64, settled_per_s: f64) -> PartCharges {
        PartCharges {
            window: charges(charged_per_s, settled_per_s),
            long_run: CellCharges::default(),
        }
    }

    /// A proxy's window of 10,000 settled charged at `ratio`, beside a
    /// long run of `settled` at the same ratio.
    fn proxy(ratio: f64, settled: f64) -> PartCharges {
        PartCharges {
            window: charges(10_000.0 * ratio, 10_000.0),
            long_run: charges(settled * ratio, settled),
        }
    }

    #[test]
    fn no_proxy_weighs_more_than_the_median_one() {
        // Three proxies; the third reports ten times the others' weight at
        // a ratio of 1/8: it counts as much as the median one.
        let parts = [
            window(10_000.0, 10_000.0),
            window(12_000.0, 12_000.0),
            window(12_500.0, 100_000.0),
        ];
        let sum = CellCharges::weighed(parts.into_iter());
        assert_eq!(sum.settled_per_s, 34_000.0);
        assert_eq!(sum.charged_per_s, 10_000.0 + 12_000.0 + 1_500.0);
        // One proxy alone is itself; charges without settled estimates are
        // added as they are.
        let alone = CellCharges::weighed([window(5.0, 4.0)].into_iter());
        assert_eq!(alone, charges(5.0, 4.0));
        let older = CellCharges::weighed([window(5.0, 4.0), window(7.0, 0.0)].into_iter());
        assert_eq!(older, charges(12.0, 4.0));
        assert_eq!(
            CellCharges::weighed(std::iter::empty()),
            CellCharges::default()
        );
    }

    /// Charges of three proxies of one cell, each settling 10,000 a
    /// window.
    fn charged(parts: [PartCharges; 3]) -> f64 {
        CellCharges::weighed(parts.into_iter()).charged_per_s
    }

    #[test]
    fn a_proxy_s_charges_count_within_twice_the_median_proxy_s_ratio() {
        // Honest proxies whose long runs differ within the band pass as
        // reported.
        let honest = charged([proxy(1.0, 1e5), proxy(1.5, 1e5), proxy(1.9, 1e5)]);
        assert!((honest - 44_000.0).abs() < 1e-6, "{honest}");
        // One proxy charged 8x its estimates over its long run, the others
        // 1 and 1.2: it counts at twice the median (1.2), either way.
        let high = charged([proxy(1.0, 1e5), proxy(1.2, 1e5), proxy(8.0, 1e5)]);
        assert!(
            (high - (10_000.0 + 12_000.0 + 24_000.0)).abs() < 1e-6,
            "{high}"
        );
        let low = charged([proxy(1.0, 1e5), proxy(1.2, 1e5), proxy(0.125, 1e5)]);
        assert!(
            (low - (10_000.0 + 12_000.0 + 5_000.0)).abs() < 1e-6,
            "{low}"
        );
        // A long run ten times the others' weighs as much as the median
        // one's: the proxy is not the median on its own.
        let heavy = charged([proxy(1.0, 1e5), proxy(1.0, 1e5), proxy(8.0, 1e6)]);
        assert!((heavy - 40_000.0).abs() < 1e-6, "{heavy}");
        // Neither of two proxies can tell which one is wrong, and one
        // proxy is itself: both as reported, as before.
        let pair =
            CellCharges::weighed([proxy(1.0, 1e5), proxy(8.0, 1e5)].into_iter()).charged_per_s;
        assert!((pair - 90_000.0).abs() < 1e-6, "{pair}");
        let alone = CellCharges::weighed([proxy(8.0, 1e5)].into_iter()).charged_per_s;
        assert!((alone - 80_000.0).abs() < 1e-6, "{alone}");
        // Whatever the band, a long run counts within 8x of its estimates
        // either way, and one charged nothing at the band's floor.
        let lone = CellCharges::weighed([proxy(40.0, 1e5)].into_iter()).charged_per_s;
        assert!((lone - 80_000.0).abs() < 1e-6, "{lone}");
        let none = charged([proxy(1.0, 1e5), proxy(1.0, 1e5), proxy(0.0, 1e5)]);
        assert!((none - 25_000.0).abs() < 1e-6, "{none}");
        let tiny = CellCharges::weighed([proxy(1e-3, 1e5)].into_iter()).charged_per_s;
        assert!((tiny - 1_250.0).abs() < 1e-6, "{tiny}");
        // A proxy that just connected (a long run of its first window,
        // charged 8x) is held to the band at once: it cannot reset its
        // way out of it.
        let fresh = charged([proxy(1.0, 1e5), proxy(1.0, 1e5), proxy(8.0, 1e4)]);
        assert!((fresh - 40_000.0).abs() < 1e-6, "{fresh}");
        // A window of one long response (40x its estimate) from a proxy
        // whose long run is like the others' counts whole.
        let long_response = PartCharges {
            window: charges(400_000.0, 10_000.0),
            long_run: charges(1.3e5, 1e5),
        };
        let whole = charged([proxy(1.0, 1e5), proxy(1.0, 1e5), long_response]);
        assert!((whole - 420_000.0).abs() < 1e-6, "{whole}");
        // A long run past what a float holds counts its estimates at the
        // band's top, never as a NaN in the sums.
        for sums in [f64::INFINITY, f64::NAN] {
            let broken = PartCharges {
                window: charges(1e10, 10_000.0),
                long_run: charges(sums, 1e5),
            };
            let held = charged([proxy(1.0, 1e5), proxy(1.0, 1e5), broken]);
            assert!((held - 40_000.0).abs() < 1e-6, "{sums}: {held}");
        }
    }

    /// A rate as a share or a proxy may report it: finite or not.
    fn any_rate() -> impl proptest::strategy::Strategy<Value = f64> {
        use proptest::prelude::*;
        prop_oneof![
            8 => 0.0..1e7f64,
            1 => Just(0.0),
            1 => prop_oneof![Just(f64::INFINITY), Just(f64::NAN), Just(1e300)],
        ]
    }

    proptest::proptest! {
        /// Whatever the parts (proxies, or replicas' shares), the weighed
        /// charges are finite and non-negative, settle no more than the
        /// parts did, and, where every part settled something, count
        /// within the bounds of a ratio; parts that agree on a ratio pass
        /// it as it is.
        #[test]
        fn weighed_charges_stay_within_the_bounds(
            parts in proptest::collection::vec(
                (any_rate(), 1.0..1e7f64, any_rate(), 1.0..1e7f64),
                1..6,
            ),
            agreed in 0.125..8.0f64,
        ) {
            let parts: Vec<PartCharges> = parts
                .into_iter()
                .map(|(charged, settled, long_charged, long_settled)| PartCharges {
                    window: charges(charged, settled),
                    long_run: charges(long_charged, long_settled),
                })
                .collect();
            let sum = PartCharges::weighed(parts.iter().copied());
            for side in [sum.window, sum.long_run] {
                proptest::prop_assert!(side.charged_per_s.is_finite() && side.charged_per_s >= 0.0);
                proptest::prop_assert!(side.settled_per_s.is_finite() && side.settled_per_s >= 0.0);
            }
            let settled: f64 = parts.iter().map(|part| part.window.settled_per_s).sum();
            proptest::prop_assert!(sum.window.settled_per_s <= settled * (1.0 + 1e-12));
            if let Some(ratio) = sum.long_run.ratio() {
                proptest::prop_assert!(
                    (1.0 / MAX_CHARGE_RATIO - 1e-9..=MAX_CHARGE_RATIO + 1e-9).contains(&ratio),
                    "{ratio}"
                );
            }
            let agreeing = parts.iter().map(|part| PartCharges {
                window: charges(part.window.settled_per_s * agreed, part.window.settled_per_s),
                long_run: charges(part.long_run.settled_per_s * agreed, part.long_run.settled_per_s),
            });
            let ratio = PartCharges::weighed(agreeing).window.ratio().unwrap();
            proptest::prop_assert!((ratio - agreed).abs() <= 1e-9 * agreed, "{ratio} vs {agreed}");
        }
    }
}
