//! Quantiles of latency samples and of the control plane's histograms
//! (read from `GET /metrics` with [`sluice_integration_tests::prometheus`]).

/// Nearest-rank quantile `q` of `sorted` (0 when empty).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).copied().unwrap_or(0.0)
}

/// p50, p99 and max of `values` (sorted in place).
pub fn summary(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        quantile(values, 0.5),
        quantile(values, 0.99),
        values.last().copied().unwrap_or(0.0),
    )
}

/// The smallest bucket bound at or above quantile `q` of a cumulative
/// histogram: "p99 <= this".
pub fn histogram_quantile_bound(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, count)| *count >= total * q)
        .map(|(bound, _)| *bound)
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use sluice_integration_tests::prometheus::Exposition;

    use super::*;

    const METRICS: &str = "\
# TYPE sluice_push_latency_seconds histogram
sluice_push_latency_seconds_bucket{le=\"0.0001\"} 10
sluice_push_latency_seconds_bucket{le=\"0.001\"} 95
sluice_push_latency_seconds_bucket{le=\"0.01\"} 100
sluice_push_latency_seconds_bucket{le=\"+Inf\"} 100
sluice_push_latency_seconds_count 100
";

    #[test]
    fn bounds_the_quantiles_of_a_histogram() {
        let page = Exposition::parse(METRICS).unwrap();
        let buckets = page.histogram("sluice_push_latency_seconds", &[]);
        assert_eq!(buckets.len(), 4);
        assert_eq!(histogram_quantile_bound(&buckets, 0.5), Some(0.001));
        assert_eq!(histogram_quantile_bound(&buckets, 0.99), Some(0.01));
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut values: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(summary(&mut values), (50.0, 99.0, 100.0));
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
