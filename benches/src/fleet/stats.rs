//! Quantiles of latency samples and the control plane's push-latency
//! histogram from `GET /metrics`.

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

/// Value of the first sample line of `name` (exact series name, labels
/// included, e.g. `sluice_connected_proxies` or
/// `sluice_directive_batches_pushed_total{kind="snapshot"}`), summed over
/// every line that starts with it.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(name))
        .filter(|rest| rest.starts_with(' ') || (rest.starts_with('{') && !name.contains('{')))
        .filter_map(|rest| {
            let value = rest.rsplit(' ').next()?;
            value.parse::<f64>().ok()
        })
        .sum()
}

/// The cumulative `(upper bound in seconds, count)` buckets of histogram
/// `name` (e.g. `sluice_push_latency_seconds`), `+Inf` last.
pub fn histogram(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (labels, value) = rest.split_once("} ")?;
            let le = labels.split(',').find_map(|l| l.strip_prefix("le=\""))?;
            let le = le.trim_end_matches('"');
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, value.split(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
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
    use super::*;

    const METRICS: &str = "\
# TYPE sluice_push_latency_seconds histogram
sluice_push_latency_seconds_bucket{le=\"0.0001\"} 10
sluice_push_latency_seconds_bucket{le=\"0.001\"} 95
sluice_push_latency_seconds_bucket{le=\"0.01\"} 100
sluice_push_latency_seconds_bucket{le=\"+Inf\"} 100
sluice_push_latency_seconds_count 100
sluice_connected_proxies 1000
sluice_directive_batches_pushed_total{kind=\"snapshot\"} 3
sluice_directive_batches_pushed_total{kind=\"delta\"} 40
";

    #[test]
    fn reads_counters_gauges_and_histograms() {
        assert_eq!(metric(METRICS, "sluice_connected_proxies"), 1000.0);
        assert_eq!(
            metric(
                METRICS,
                "sluice_directive_batches_pushed_total{kind=\"snapshot\"}"
            ),
            3.0
        );
        assert_eq!(
            metric(METRICS, "sluice_directive_batches_pushed_total"),
            43.0
        );
        let buckets = histogram(METRICS, "sluice_push_latency_seconds");
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
