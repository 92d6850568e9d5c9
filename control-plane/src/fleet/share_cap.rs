//! Bounds one proxy's weight in a bucket's fleet sum: a claim far above
//! what the other proxies report for the bucket counts only up to a
//! multiple of their median, and an implausible one not at all.
//!
//! Envoys behind one load balancer see similar rates for a bucket; a proxy
//! that reports 1,000× the median is lying or broken, and without a bound
//! its claim alone would make the controller drop the bucket's real traffic
//! on every Envoy. The median is the statistic one proxy cannot move: with
//! three or more proxies reporting, a single claim shifts it by at most one
//! rank. With two, the median is their mean, which the larger one moves as
//! it likes, so each is weighed against the other instead.
//!
//! Who has a say in what is plausible: the established proxies, those that
//! have been connected for [`ShareCap::probation_ticks`] without an
//! implausible claim. A proxy still on probation (new, restarted, or
//! caught claiming the implausible) is weighed against them like any
//! other, but its claim does not move the median; so identities made up
//! by the handful cannot outvote the fleet they join. When no established
//! proxy reports a bucket (all are new, as after the control plane
//! starts), every reporting proxy has its say.

/// How a bucket's per-proxy rates are capped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareCap {
    /// A proxy's rate above `cap_multiple × median` counts as that much
    /// (0 disables capping).
    pub(crate) cap_multiple: f64,
    /// A proxy's rate above `ignore_multiple × median` counts as nothing,
    /// and the proxy is not counted as reporting the bucket (0 disables).
    pub(crate) ignore_multiple: f64,
    /// Fewer proxies reporting a bucket than this: no cap (one proxy
    /// alone has nothing to be weighed against); at least 2.
    pub(crate) min_proxies: usize,
    /// Control intervals a new proxy instance spends on probation (no say
    /// in the median); 0: every proxy is established at once.
    pub(crate) probation_ticks: u32,
}

impl ShareCap {
    /// Default `cap_multiple`: load balancers rarely skew one Envoy's share
    /// of a bucket beyond 4× the median Envoy's.
    pub(crate) const DEFAULT_CAP_MULTIPLE: f64 = 4.0;
    /// Default `ignore_multiple`: 25× the median is no load balancer's skew.
    pub(crate) const DEFAULT_IGNORE_MULTIPLE: f64 = 25.0;
    /// Default `min_proxies`.
    pub(crate) const DEFAULT_MIN_PROXIES: usize = 2;
    /// Default `probation_ticks`: 30 s at the default 500 ms interval.
    pub(crate) const DEFAULT_PROBATION_TICKS: u32 = 60;

    /// No capping at all.
    pub const OFF: Self = Self {
        cap_multiple: 0.0,
        ignore_multiple: 0.0,
        min_proxies: usize::MAX,
        probation_ticks: 0,
    };

    fn enabled(&self) -> bool {
        self.cap_multiple > 0.0 || self.ignore_multiple > 0.0
    }
}

impl Default for ShareCap {
    fn default() -> Self {
        Self {
            cap_multiple: Self::DEFAULT_CAP_MULTIPLE,
            ignore_multiple: Self::DEFAULT_IGNORE_MULTIPLE,
            min_proxies: Self::DEFAULT_MIN_PROXIES,
            probation_ticks: Self::DEFAULT_PROBATION_TICKS,
        }
    }
}

/// How much of one proxy's claim counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Weight {
    /// All of it.
    Full,
    /// Scaled down by this factor (0 < factor < 1) to the cap.
    Capped(f64),
    /// Nothing: the claim is beyond any plausible skew.
    Ignored,
}

impl Weight {
    /// The factor the proxy's rates are multiplied by.
    pub(crate) fn factor(self) -> f64 {
        match self {
            Self::Full => 1.0,
            Self::Capped(factor) => factor,
            Self::Ignored => 0.0,
        }
    }
}

/// Weighs each of a bucket's per-proxy offered rates (all > 0) into
/// `weights` (same order) and returns the cap in requests per second, or
/// `None` when no cap applies to this bucket. `established[i]` says
/// whether proxy `i` has a say in what is plausible (see the module).
pub(crate) fn weigh(
    rates: &[f64],
    established: &[bool],
    cap: &ShareCap,
    scratch: &mut Vec<f64>,
    weights: &mut Vec<Weight>,
) -> Option<f64> {
    weights.clear();
    weights.resize(rates.len(), Weight::Full);
    if !cap.enabled() || rates.len() < cap.min_proxies.max(2) {
        return None;
    }
    let any_established = established.iter().take(rates.len()).any(|&e| e);
    let votes = |i: usize| !any_established || established.get(i).copied().unwrap_or(false);
    scratch.clear();
    scratch.extend(
        rates
            .iter()
            .enumerate()
            .filter(|&(i, _)| votes(i))
            .map(|(_, rate)| *rate),
    );
    let median = median(scratch)?;
    // Sorted by `median`.
    let (lowest, highest) = (
        scratch.first().copied().unwrap_or(median),
        scratch.last().copied().unwrap_or(median),
    );
    let voters = scratch.len();
    for (i, (rate, weight)) in rates.iter().zip(weights.iter_mut()).enumerate() {
        let reference = match (votes(i), voters) {
            // Alone, it has no one to be weighed against.
            (true, 1) => continue,
            // Two: each against the other.
            (true, 2) if *rate >= highest => lowest,
            (true, 2) => highest,
            _ => median,
        };
        *weight = judge(*rate, reference, cap);
    }
    let multiple = if cap.cap_multiple > 0.0 {
        cap.cap_multiple
    } else {
        cap.ignore_multiple
    };
    // With two, the larger one is held to the smaller one's multiple.
    let reference = if voters == 2 { lowest } else { median };
    Some(multiple * reference)
}

/// How much of `rate` counts against a plausible `reference` rate.
fn judge(rate: f64, reference: f64, cap: &ShareCap) -> Weight {
    if !(reference > 0.0 && reference.is_finite()) {
        return Weight::Full;
    }
    if cap.ignore_multiple > 0.0 && rate > cap.ignore_multiple * reference {
        return Weight::Ignored;
    }
    let capped = cap.cap_multiple * reference;
    if cap.cap_multiple > 0.0 && rate > capped {
        return Weight::Capped(capped / rate);
    }
    Weight::Full
}

/// The median of positive finite rates (mean of the middle two for an even
/// count), sorting `sorted` in place; `None` when it is not a positive
/// finite number.
fn median(sorted: &mut [f64]) -> Option<f64> {
    sorted.sort_unstable_by(f64::total_cmp);
    let n = sorted.len();
    let upper = *sorted.get(n / 2)?;
    let median = if n.is_multiple_of(2) {
        (sorted.get(n / 2 - 1).copied().unwrap_or(upper) + upper) / 2.0
    } else {
        upper
    };
    (median > 0.0 && median.is_finite()).then_some(median)
}

/// One proxy's offered rate for one bucket in the current tick.
#[derive(Debug, Clone, Copy)]
struct Claim {
    bucket: u32,
    offered: f64,
    factor: f64,
    /// Whether the proxy is established (has a say in the median).
    established: bool,
}

/// A bucket id, its cap, and the claims the cap cut as (proxy index,
/// claimed, counted).
pub(super) type BucketCap = (u32, f64, Vec<(usize, f64, f64)>);

/// The per-tick weighing of every (proxy, bucket) claim, with the arrays
/// kept between ticks so they are allocated once.
#[derive(Debug, Default)]
pub(super) struct ClaimWeights {
    active: bool,
    /// The proxy whose factors the scratch holds.
    loaded: Option<usize>,
    /// Scratch indexed by bucket id: a proxy's sum, then its factor.
    per_bucket: Vec<f64>,
    touched: Vec<u32>,
    /// Proxy-major: proxy `i`'s claims are `claims[starts[i]..starts[i + 1]]`.
    claims: Vec<Claim>,
    starts: Vec<usize>,
    /// (bucket, index into `claims`), grouped by bucket.
    order: Vec<(u32, usize)>,
    /// Where each bucket's group starts in `order` (one more entry than
    /// buckets), and a scratch copy of it.
    bucket_starts: Vec<usize>,
    cursor: Vec<usize>,
    rates: Vec<f64>,
    established: Vec<bool>,
    weights: Vec<Weight>,
    scratch: Vec<f64>,
    /// Per bucket id with a cap in force: the cap and the claims it cut as
    /// (proxy index, claimed, counted).
    caps: Vec<BucketCap>,
}

impl ClaimWeights {
    /// Starts a tick with `buckets` bucket ids and `proxies` proxies; a
    /// fleet too small for any cap skips the weighing.
    pub(super) fn begin(&mut self, cap: &ShareCap, buckets: usize, proxies: usize) {
        self.active = cap.enabled() && proxies >= cap.min_proxies.max(2);
        self.claims.clear();
        self.starts.clear();
        self.caps.clear();
        if self.active {
            self.per_bucket.clear();
            self.per_bucket.resize(buckets, 0.0);
            self.starts.push(0);
        }
    }

    /// Adds the next proxy's rates as (bucket id, offered rps) pairs, and
    /// whether it is established.
    pub(super) fn add_proxy(&mut self, established: bool, rates: impl Iterator<Item = (u32, f64)>) {
        if !self.active {
            return;
        }
        for (bucket, offered) in rates {
            if let Some(sum) = self.per_bucket.get_mut(bucket as usize) {
                if *sum == 0.0 {
                    self.touched.push(bucket);
                }
                *sum += offered;
            }
        }
        for bucket in self.touched.drain(..) {
            if let Some(sum) = self.per_bucket.get_mut(bucket as usize) {
                if *sum > 0.0 {
                    self.claims.push(Claim {
                        bucket,
                        offered: *sum,
                        factor: 1.0,
                        established,
                    });
                }
                *sum = 0.0;
            }
        }
        self.starts.push(self.claims.len());
    }

    /// Weighs every bucket's claims against its median. Returns how many
    /// claims were capped and how many ignored.
    pub(super) fn weigh(&mut self, cap: &ShareCap) -> (u64, u64) {
        if !self.active {
            return (0, 0);
        }
        let Self {
            per_bucket,
            claims,
            starts,
            order,
            rates,
            established,
            weights,
            scratch,
            caps,
            loaded,
            bucket_starts,
            cursor,
            ..
        } = self;
        // Claims grouped by bucket with a counting sort: bucket ids are
        // small and dense, and a comparison sort of every claim would cost
        // more than the rest of the tick.
        bucket_starts.clear();
        bucket_starts.resize(per_bucket.len() + 1, 0);
        for claim in claims.iter() {
            if let Some(count) = bucket_starts.get_mut(claim.bucket as usize + 1) {
                *count += 1;
            }
        }
        for at in 1..bucket_starts.len() {
            let previous = bucket_starts.get(at - 1).copied().unwrap_or(0);
            if let Some(start) = bucket_starts.get_mut(at) {
                *start += previous;
            }
        }
        order.clear();
        order.resize(claims.len(), (0, 0));
        cursor.clear();
        cursor.extend_from_slice(bucket_starts);
        for (at, claim) in claims.iter().enumerate() {
            if let Some(next) = cursor.get_mut(claim.bucket as usize)
                && let Some(slot) = order.get_mut(*next)
            {
                *slot = (claim.bucket, at);
                *next += 1;
            }
        }
        let (mut capped, mut ignored) = (0, 0);
        for window in bucket_starts.windows(2) {
            let (start, end) = (
                window.first().copied().unwrap_or(0),
                window.get(1).copied().unwrap_or(0),
            );
            let group = order.get(start..end).unwrap_or_default();
            let Some(&(bucket, _)) = group.first() else {
                continue;
            };
            rates.clear();
            established.clear();
            for claim in group.iter().filter_map(|&(_, at)| claims.get(at)) {
                rates.push(claim.offered);
                established.push(claim.established);
            }
            let Some(cap_rps) = weigh(rates, established, cap, scratch, weights) else {
                continue;
            };
            let mut cut = Vec::new();
            for (&(_, at), weight) in group.iter().zip(weights.iter()) {
                let Some(claim) = claims.get_mut(at) else {
                    continue;
                };
                claim.factor = weight.factor();
                match weight {
                    Weight::Full => continue,
                    Weight::Capped(_) => capped += 1,
                    Weight::Ignored => ignored += 1,
                }
                // The proxy whose range of claims holds `at`.
                let proxy = starts
                    .partition_point(|&start| start <= at)
                    .saturating_sub(1);
                cut.push((proxy, claim.offered, claim.offered * claim.factor));
            }
            caps.push((bucket, cap_rps, cut));
        }
        // From here the scratch holds factors, 1 where no claim says else.
        per_bucket.fill(1.0);
        *loaded = None;
        (capped, ignored)
    }

    /// Makes [`ClaimWeights::factor`] answer for proxy `index`.
    pub(super) fn load_proxy(&mut self, index: usize) {
        if !self.active {
            return;
        }
        let Self {
            per_bucket,
            claims,
            starts,
            loaded,
            ..
        } = self;
        let claims_of = |index: usize| match (starts.get(index), starts.get(index + 1)) {
            (Some(&start), Some(&end)) => claims.get(start..end).unwrap_or_default(),
            _ => &[],
        };
        if let Some(previous) = loaded.replace(index) {
            for claim in claims_of(previous) {
                if let Some(factor) = per_bucket.get_mut(claim.bucket as usize) {
                    *factor = 1.0;
                }
            }
        }
        for claim in claims_of(index) {
            if let Some(factor) = per_bucket.get_mut(claim.bucket as usize) {
                *factor = claim.factor;
            }
        }
    }

    /// What the loaded proxy's rates for `bucket` are multiplied by.
    pub(super) fn factor(&self, bucket: u32) -> f64 {
        if !self.active {
            return 1.0;
        }
        self.per_bucket.get(bucket as usize).copied().unwrap_or(1.0)
    }

    /// The caps in force, by bucket id.
    pub(super) fn caps(&self) -> &[BucketCap] {
        &self.caps
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use proptest::prelude::*;

    fn run(rates: &[f64], cap: &ShareCap) -> (Option<f64>, Vec<Weight>) {
        run_with(rates, &vec![false; rates.len()], cap)
    }

    fn run_with(rates: &[f64], established: &[bool], cap: &ShareCap) -> (Option<f64>, Vec<Weight>) {
        let mut weights = Vec::new();
        let cap_rps = weigh(rates, established, cap, &mut Vec::new(), &mut weights);
        (cap_rps, weights)
    }

    #[test]
    fn balanced_fleets_are_untouched() {
        let (cap, weights) = run(&[100.0, 120.0, 90.0, 110.0], &ShareCap::default());
        assert_eq!(cap, Some(4.0 * 105.0));
        assert!(weights.iter().all(|w| *w == Weight::Full));
    }

    #[test]
    fn a_heavy_proxy_is_capped_at_the_multiple_of_the_median() {
        let (cap, weights) = run(&[100.0, 100.0, 1_000.0], &ShareCap::default());
        assert_eq!(cap, Some(400.0));
        assert_eq!(weights[2], Weight::Capped(0.4));
        assert_eq!(weights[0], Weight::Full);
    }

    #[test]
    fn an_implausible_claim_counts_for_nothing() {
        let (_, weights) = run(&[100.0, 100.0, 100.0, 100_000.0], &ShareCap::default());
        assert_eq!(weights[3], Weight::Ignored);
        assert_eq!(weights[3].factor(), 0.0);
    }

    #[test]
    fn one_proxy_alone_or_disabled_means_no_cap() {
        assert_eq!(run(&[1_000_000.0], &ShareCap::default()).0, None);
        let (cap, weights) = run(&[1.0, 1.0, 1_000_000.0], &ShareCap::OFF);
        assert_eq!(cap, None);
        assert!(weights.iter().all(|w| *w == Weight::Full));
        let old = ShareCap {
            min_proxies: 3,
            ..ShareCap::default()
        };
        assert_eq!(run(&[1.0, 1_000_000.0], &old).0, None);
    }

    #[test]
    fn two_proxies_are_weighed_against_each_other() {
        // The case: one real Envoy at 30 rps beside a claim of
        // 1,000,000 rps. The median of two (their mean) would let it pass.
        let (_, weights) = run(&[30.0, 1_000_000.0], &ShareCap::default());
        assert_eq!(weights, [Weight::Full, Weight::Ignored]);
        // A plausible skew passes; beyond the cap multiple, capped.
        let (cap, weights) = run(&[30.0, 90.0], &ShareCap::default());
        assert_eq!(cap, Some(4.0 * 30.0));
        assert_eq!(weights, [Weight::Full, Weight::Full]);
        let (_, weights) = run(&[30.0, 300.0], &ShareCap::default());
        assert_eq!(weights, [Weight::Full, Weight::Capped(0.4)]);
        // Equal claims pass.
        let (_, weights) = run(&[5.0, 5.0], &ShareCap::default());
        assert_eq!(weights, [Weight::Full, Weight::Full]);
    }

    #[test]
    fn newcomers_are_weighed_against_the_established_and_have_no_say() {
        // Three established Envoys at 200 rps; five new identities claim
        // 1,000,000 rps each. Counting everyone, their claims would be the
        // median; against the established, they are implausible.
        let mut rates = vec![200.0, 210.0, 190.0];
        rates.extend([1_000_000.0; 5]);
        let mut established = vec![true; 3];
        established.extend([false; 5]);
        let (cap, weights) = run_with(&rates, &established, &ShareCap::default());
        assert_eq!(cap, Some(4.0 * 200.0));
        assert!(
            weights[..3].iter().all(|w| *w == Weight::Full),
            "{weights:?}"
        );
        assert!(
            weights[3..].iter().all(|w| *w == Weight::Ignored),
            "{weights:?}"
        );
        let (_, everyone) = run(&rates, &ShareCap::default());
        assert!(everyone.iter().all(|w| *w == Weight::Full), "{everyone:?}");
        // A newcomer that claims what its peers do counts in full; one
        // established Envoy is reference enough.
        let (_, weights) = run_with(&[100.0, 120.0], &[true, false], &ShareCap::default());
        assert_eq!(weights, [Weight::Full, Weight::Full]);
        let (_, weights) = run_with(&[100.0, 800.0], &[true, false], &ShareCap::default());
        assert_eq!(weights, [Weight::Full, Weight::Capped(0.5)]);
        // Established proxies are weighed among themselves alone.
        let (_, weights) = run_with(
            &[100.0, 100.0, 1_000.0, 1.0, 1.0],
            &[true, true, true, false, false],
            &ShareCap::default(),
        );
        assert_eq!(weights[2], Weight::Capped(0.4));
        assert_eq!(&weights[3..], [Weight::Full, Weight::Full]);
    }

    proptest! {
        /// However one proxy lies, the bucket's weighted sum is at most the
        /// honest proxies' sum plus the cap, and no weight exceeds 1.
        #[test]
        fn one_liar_moves_the_sum_by_at_most_the_cap(
            honest in proptest::collection::vec(1.0_f64..1_000.0, 2..20),
            claim in 0.001_f64..1e12,
        ) {
            let mut rates = honest.clone();
            rates.push(claim);
            let (cap, weights) = run(&rates, &ShareCap::default());
            let cap = cap.unwrap();
            let weighted: f64 = rates.iter().zip(&weights).map(|(r, w)| r * w.factor()).sum();
            let honest_sum: f64 = honest.iter().sum();
            prop_assert!(weighted <= honest_sum + cap + 1e-6);
            prop_assert!(weights.iter().all(|w| (0.0..=1.0).contains(&w.factor())));
            // The cap itself cannot be pushed past the honest maximum's
            // multiple: the liar moves the median by at most one rank.
            let honest_max = honest.iter().copied().fold(0.0, f64::max);
            prop_assert!(cap <= ShareCap::DEFAULT_CAP_MULTIPLE * honest_max + 1e-6);
        }
    }
}

#[cfg(test)]
mod newcomer_tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// However many newcomers claim whatever they like beside an
        /// established fleet, each counts at most the cap multiple of the
        /// established median: the established proxies' share of the
        /// counted sum is at least n / (n + multiple · k).
        #[test]
        fn newcomers_count_at_most_the_cap_each(
            established_rates in proptest::collection::vec(1.0_f64..1_000.0, 1..10),
            newcomers in proptest::collection::vec(0.001_f64..1e12, 1..10),
        ) {
            let mut rates = established_rates.clone();
            rates.extend(&newcomers);
            let mut established = vec![true; established_rates.len()];
            established.extend(vec![false; newcomers.len()]);
            let mut weights = Vec::new();
            let cap = ShareCap::default();
            weigh(&rates, &established, &cap, &mut Vec::new(), &mut weights);
            let mut sorted = established_rates.clone();
            let median = median(&mut sorted).unwrap();
            for (rate, weight) in rates[established_rates.len()..].iter().zip(&weights[established_rates.len()..]) {
                prop_assert!(rate * weight.factor() <= cap.cap_multiple * median * (1.0 + 1e-9));
            }
        }
    }
}
