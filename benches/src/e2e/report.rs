//! Per-run numbers, their median and range per variant, ratios to the
//! baseline variant, and the Markdown the benchmark writes.

use std::fmt::Write as _;

use super::client::LoadOutcome;
use super::config::Variant;
use super::measure::Machine;

/// The CPU chart's file name (the chart module's), next to `BENCHMARKS.md`,
/// which links it.
pub const CHART_FILE_NAME: &str = "benchmarks-cpu-per-request.svg";

/// One measured run of one variant.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Requests answered per second of wall time.
    pub throughput: f64,
    /// Envoy's CPU time (user + system) per request, in microseconds.
    pub cpu_us: f64,
    /// The stand-in service's CPU time per request: the rate limit service
    /// (variant 6), the upstream (variants 8 and 9) or the fake LLM upstream
    /// (variants 14 to 21).
    pub service_cpu_us: Option<f64>,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th-percentile latency, microseconds.
    pub p99_us: f64,
    /// Share of answers that were 429.
    pub limited_share: f64,
    /// Answers that were neither 200 nor 429.
    pub other: u64,
}

impl Run {
    /// The numbers of one load run that used `cpu_us_total` of Envoy CPU
    /// and `service_cpu_us_total` of the stand-in service's CPU, if one was
    /// used.
    pub fn new(
        mut outcome: LoadOutcome,
        cpu_us_total: f64,
        service_cpu_us_total: Option<f64>,
    ) -> Self {
        let answered = outcome.latencies_us.len().max(1) as f64;
        outcome.latencies_us.sort_unstable();
        Self {
            throughput: answered / outcome.elapsed.as_secs_f64().max(1e-9),
            cpu_us: cpu_us_total / answered,
            service_cpu_us: service_cpu_us_total.map(|total| total / answered),
            p50_us: quantile(&outcome.latencies_us, 0.50),
            p99_us: quantile(&outcome.latencies_us, 0.99),
            limited_share: outcome.limited as f64 / answered,
            other: outcome.other,
        }
    }

    /// Envoy's plus the stand-in service's CPU per request.
    pub fn total_cpu_us(&self) -> f64 {
        self.cpu_us + self.service_cpu_us.unwrap_or(0.0)
    }
}

/// The value at quantile `q` of sorted `values` (nearest rank).
fn quantile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).map_or(0.0, |v| f64::from(*v))
}

/// Median, minimum and maximum of one metric over the rounds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spread {
    /// Median (mean of the middle two for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (all zero when empty).
    pub fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let at = |i: usize| values.get(i).copied().unwrap_or(0.0);
        let median = if n % 2 == 1 {
            at(n / 2)
        } else {
            (at(n / 2) + at((n / 2).saturating_sub(1))) / 2.0
        };
        Self {
            median,
            min: at(0),
            max: at(n.saturating_sub(1)),
        }
    }
}

/// Every metric of one variant over the rounds.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// Which variant.
    pub variant: Variant,
    /// Requests per second.
    pub throughput: Spread,
    /// Envoy CPU µs per request.
    pub cpu_us: Spread,
    /// Stand-in service CPU µs per request, for the variants that have one.
    pub service_cpu_us: Option<Spread>,
    /// Envoy plus service CPU µs per request (each round's sum).
    pub total_cpu_us: Spread,
    /// p50 latency, µs.
    pub p50_us: Spread,
    /// p99 latency, µs.
    pub p99_us: Spread,
    /// Share of 429 answers.
    pub limited_share: Spread,
    /// Answers neither 200 nor 429, over all rounds.
    pub other: u64,
}

impl Summary {
    /// Summarises the runs of `variant`.
    pub fn of(variant: Variant, runs: &[Run]) -> Self {
        let metric = |f: fn(&Run) -> f64| Spread::of(runs.iter().map(f).collect());
        Self {
            variant,
            throughput: metric(|r| r.throughput),
            cpu_us: metric(|r| r.cpu_us),
            service_cpu_us: runs
                .iter()
                .map(|r| r.service_cpu_us)
                .collect::<Option<Vec<f64>>>()
                .filter(|values| !values.is_empty())
                .map(Spread::of),
            total_cpu_us: metric(Run::total_cpu_us),
            p50_us: metric(|r| r.p50_us),
            p99_us: metric(|r| r.p99_us),
            limited_share: metric(|r| r.limited_share),
            other: runs.iter().map(|r| r.other).sum(),
        }
    }
}

/// How the numbers were produced, for the report header.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Machine facts.
    pub machine: Machine,
    /// Rounds (runs per variant).
    pub rounds: usize,
    /// Measured requests per run.
    pub requests: usize,
    /// Unmeasured requests before each run.
    pub warmup: usize,
    /// Connections.
    pub concurrency: usize,
    /// The command that produced the report.
    pub command: String,
}

/// The results as a Markdown table, one row per variant.
pub fn table(summaries: &[Summary]) -> String {
    let base = summaries.first().copied();
    let ratio = |value: f64, base: Option<f64>| match base {
        Some(base) if base > 0.0 => format!("{:.2}", value / base),
        _ => "–".to_owned(),
    };
    let cell = |s: Spread, digits: usize| {
        format!("{:.d$} ({:.d$}–{:.d$})", s.median, s.min, s.max, d = digits)
    };
    let mut out = String::from(
        "| variant | req/s median (min–max) | ×1 | Envoy CPU µs/req | service CPU µs/req \
         | total CPU µs/req | ×1 | p50 µs | ×1 | p99 µs | ×1 | 429 share |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for s in summaries {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.3} |",
            s.variant.label(),
            cell(s.throughput, 0),
            ratio(s.throughput.median, base.map(|b| b.throughput.median)),
            cell(s.cpu_us, 1),
            s.service_cpu_us
                .map_or_else(|| "–".to_owned(), |service| cell(service, 1)),
            cell(s.total_cpu_us, 1),
            ratio(s.total_cpu_us.median, base.map(|b| b.total_cpu_us.median)),
            cell(s.p50_us, 0),
            ratio(s.p50_us.median, base.map(|b| b.p50_us.median)),
            cell(s.p99_us, 0),
            ratio(s.p99_us.median, base.map(|b| b.p99_us.median)),
            s.limited_share.median,
        );
    }
    out
}

/// Where the end-to-end section starts and ends in `BENCHMARKS.md`.
pub const SECTION_START: &str = "<!-- bench_envoy:start -->";
/// See [`SECTION_START`].
pub const SECTION_END: &str = "<!-- bench_envoy:end -->";

/// `existing` (the current `BENCHMARKS.md`, if any) with the end-to-end
/// section replaced by `section`; the rest of the file, such as the
/// controller numbers, is kept.
pub fn replace_section(existing: Option<&str>, section: &str) -> String {
    replace_marked(existing, "bench_envoy", section)
}

/// `existing` with the section between `<!-- {name}:start -->` and
/// `<!-- {name}:end -->` replaced by `section`; a missing section is
/// appended (or starts a new file).
pub fn replace_marked(existing: Option<&str>, name: &str, section: &str) -> String {
    let start = format!("<!-- {name}:start -->");
    let end = format!("<!-- {name}:end -->");
    let section = format!("{start}\n{section}{end}\n");
    let split = existing.and_then(|text| {
        let (before, rest) = text.split_once(&start)?;
        let (_, after) = rest.split_once(&end)?;
        Some((before, after.strip_prefix('\n').unwrap_or(after)))
    });
    match (split, existing) {
        (Some((before, after)), _) => format!("{before}{section}{after}"),
        (None, Some(text)) => format!("{}\n\n{section}", text.trim_end()),
        (None, None) => format!("# Benchmarks\n\n{section}"),
    }
}

/// Writes `section` into its marked place in the Markdown file at `path`.
pub fn write_marked(path: &std::path::Path, name: &str, section: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let existing = std::fs::read_to_string(path).ok();
    let text = replace_marked(existing.as_deref(), name, section);
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// The end-to-end section of `BENCHMARKS.md`.
pub fn markdown(setup: &Setup, summaries: &[Summary]) -> String {
    let m = &setup.machine;
    let mut out = String::new();
    let _ = write!(
        out,
        "## End to end: Envoy with and without Sluice\n\n\
         Envoy `--concurrency 1`, a `direct_response` route (variants 1 to 7), \
         HTTP/1.1 on loopback. \
         Each run starts a fresh Envoy, sends {warmup} unmeasured requests, then \
         {requests} requests over {concurrency} keep-alive connections (closed loop: \
         each connection sends its next request when the previous answer is in); \
         the streamed variants (14 to 21) send a tenth as many, each a streamed \
         completion. \
         The variants are interleaved over {rounds} rounds, in a rotated order each \
         round, and each cell is the median with the min–max over the rounds; `×1` \
         is the median's ratio to variant 1.\n\n\
         Envoy CPU is the `utime + stime` of the Envoy process from \
         `/proc/<pid>/stat` across the measured requests, divided by their number: \
         it excludes the load client, which runs in the benchmark process. \
         Service CPU is the same for the stand-in service process: the rate \
         limit service of variant 6, the upstream of variants 8 and 9; \
         total CPU is Envoy's plus the service's (per round, then the median). \
         Throughput and latency include the client, which shares the machine; \
         compare CPU per request first. The machine is noisy: treat differences \
         under about 10% as noise.\n\n\
         Variants 4 and 5 run the built Sluice filter (bucket from the `x-tenant` \
         header, every request in one bucket) against a stand-in control plane \
         that pushes one directive for that bucket: drop ratio 1e-9 (held and \
         consulted, but no drops; 0 would remove it) or 0.5.\n\n\
         Variant 6 is Envoy's global `envoy.filters.http.ratelimit` filter with \
         one descriptor (`tenant` from `x-tenant`) per request, calling a minimal \
         Rust implementation of Envoy's rate limit service API \
         (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, tonic, \
         one thread, its own process on loopback) that answers OK without any \
         counting or storage: a lower bound for a real service with Redis. The \
         filter fails closed, so an unanswered call would show as a failed run.\n\n\
         Variants 8 and 9 route to a real upstream instead: a minimal HTTP/1.1 \
         server (hyper, one thread, its own process on loopback) answering \
         `200 ok`, reached through Envoy's connection pool as in production. \
         Variant 9 puts Sluice at 50% drop in front of it: a rejected request \
         never reaches the upstream, so 9 against 8 is what a 429 saves over a \
         request that passes. Variants 10 to 21 have sections of their own \
         below.\n\n\
         ![CPU per request by variant]({chart})\n\n\
         - Machine: {cpus} CPUs, {model}\n\
         - Envoy: {envoy}\n\
         - Date: {date}\n\
         - Command: `{command}`\n\
         - Reproduce: `just bench-envoy` (builds the filters, then about twenty \
         minutes on 2 cores) or `just bench-envoy --quick` (a few minutes); \
         `just bench-envoy --variants empty-wasm,sluice-no-drop --output -` \
         prints a subset\n\n",
        warmup = setup.warmup,
        requests = setup.requests,
        concurrency = setup.concurrency,
        rounds = setup.rounds,
        cpus = m.cpus,
        model = m.cpu_model,
        envoy = m.envoy_version,
        date = m.date,
        command = setup.command,
        chart = CHART_FILE_NAME,
    );
    out.push_str(&table(summaries));
    out
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_median_and_range() {
        let s = Spread::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of(vec![1.0, 2.0, 3.0, 10.0]).median, 2.5);
    }

    #[test]
    fn only_the_marked_section_is_replaced() {
        let first = replace_section(None, "old\n");
        assert!(first.starts_with("# Benchmarks"));
        let edited = format!("{first}\n## Controller\n\nkept\n");
        let second = replace_section(Some(&edited), "new\n");
        assert!(second.contains("new\n") && !second.contains("old"));
        assert!(second.ends_with("## Controller\n\nkept\n"), "{second}");
    }

    #[test]
    fn quantile_is_nearest_rank() {
        let values: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile(&values, 0.5), 50.0);
        assert_eq!(quantile(&values, 0.99), 99.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
