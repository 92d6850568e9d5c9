//! Sluice's fleet-wide adaptive limit against Envoy's own per-instance
//! `adaptive_concurrency` and `admission_control`, in the same scenario as
//! `adaptive_limits.rs`:
//! three Envoys carrying 60/30/10 of about 3x a capped upstream's capacity
//! (150 rps, halved to 75 at 15 s), mostly BULK and a little CRITICAL.
//!
//! A measurement, not part of `just test` (three 30 s runs): `just
//! bench-adaptive` prints the table that docs/adaptive.md and BENCHMARKS.md
//! quote. It asserts only that every run served traffic without connection
//! errors; which one does better is what it reports.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::fmt::Write as _;
use std::time::Duration;

use sluice_integration_tests::adaptive::{
    SKEW, capacity, fleet_options, ok_latency_ms, skewed_streams,
};
use sluice_integration_tests::capped_upstream::{CappedUpstream, Served};
use sluice_integration_tests::envoy::Envoy;
use sluice_integration_tests::fleet::{ControlPlaneTarget, EnvoySpec, Fleet, TestDir};
use sluice_integration_tests::load::{LoadPlan, LoadResult, LoadRun, Window, rate};

const DURATION_S: u64 = 30;
const HALVED_AT_S: u64 = 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Sluice,
    AdaptiveConcurrency,
    AdmissionControl,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Self::Sluice => "Sluice adaptive limit (fleet-wide)",
            Self::AdaptiveConcurrency => "Envoy adaptive_concurrency (per instance)",
            Self::AdmissionControl => "Envoy admission_control (per instance)",
        }
    }

    /// The config in `envoy/` of a variant without Sluice.
    fn envoy_config(self) -> Option<&'static str> {
        match self {
            Self::Sluice => None,
            Self::AdaptiveConcurrency => Some("adaptive-concurrency.yaml"),
            Self::AdmissionControl => Some("admission-control.yaml"),
        }
    }
}

/// The proxies of one run, kept alive until it ends.
enum Proxies {
    Sluice(Box<Fleet>),
    Envoy {
        envoys: Vec<Envoy>,
        /// Their configs and logs, removed when the run ends.
        _dir: TestDir,
    },
}

impl Proxies {
    async fn start(variant: Variant, upstream: &CappedUpstream) -> Self {
        match variant.envoy_config() {
            None => Self::Sluice(Box::new(
                Fleet::start(fleet_options(upstream.addr())).await.unwrap(),
            )),
            Some(file) => {
                let dir = TestDir::new("sluice-it-", "test").unwrap();
                let mut envoys = Vec::new();
                for index in 0..SKEW.len() {
                    let spec = EnvoySpec::repo(&format!("envoy-{index}"), file)
                        .data_plane(None)
                        .upstream(upstream.addr())
                        .concurrency(1);
                    envoys.push(
                        spec.start(dir.path(), &ControlPlaneTarget::None)
                            .await
                            .unwrap(),
                    );
                }
                Self::Envoy { envoys, _dir: dir }
            }
        }
    }

    fn urls(&self) -> Vec<String> {
        match self {
            Self::Sluice(fleet) => (0..SKEW.len()).map(|i| fleet.url(i).unwrap()).collect(),
            Self::Envoy { envoys, .. } => envoys.iter().map(Envoy::base_url).collect(),
        }
    }

    fn print_logs(&self) {
        match self {
            Self::Sluice(fleet) => fleet.print_logs(),
            Self::Envoy { envoys, .. } => envoys.iter().for_each(Envoy::print_log),
        }
    }
}

/// One phase of one run, as the clients saw it.
struct Phase {
    goodput_rps: f64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    critical_ok: f64,
    bulk_ok: f64,
    /// Of every request sent: answered 5xx (the upstream's queue full, or
    /// Envoy's own filters shedding, which answer 503).
    server_errors: f64,
    /// Of each Envoy's requests, answered 200: what fleet-wide fairness
    /// means under skew.
    ok_by_envoy: Vec<f64>,
}

impl Phase {
    fn of(result: &LoadResult, window: Window) -> Self {
        let share = |tenant: &str| {
            let counts = result.tenant_counts(window, tenant);
            counts.ok as f64 / counts.sent.max(1) as f64
        };
        Self {
            goodput_rps: rate(result.counts(window, |_| true).ok, window),
            p50_ms: ok_latency_ms(result, window, 0.5),
            p99_ms: ok_latency_ms(result, window, 0.99),
            critical_ok: share("critical"),
            bulk_ok: share("bulk"),
            ok_by_envoy: (0..SKEW.len())
                .map(|envoy| {
                    let prefix = format!("{envoy}/");
                    let counts = result.counts(window, |s| s.label.starts_with(&prefix));
                    counts.ok as f64 / counts.sent.max(1) as f64
                })
                .collect(),
            server_errors: {
                let all = result.counts(window, |_| true);
                all.server_errors as f64 / all.sent.max(1) as f64
            },
        }
    }

    fn row(&self, variant: Variant, capacity: &str) -> String {
        let ms = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.0}"));
        format!(
            "| {} | {capacity} | {:.1} | {} | {} | {:.1} % | {:.1} % | {:.1} % | {} |",
            variant.name(),
            self.goodput_rps,
            ms(self.p50_ms),
            ms(self.p99_ms),
            self.critical_ok * 100.0,
            self.bulk_ok * 100.0,
            self.server_errors * 100.0,
            self.ok_by_envoy
                .iter()
                .map(|ok| format!("{:.0} %", ok * 100.0))
                .collect::<Vec<_>>()
                .join(" / "),
        )
    }
}

struct Run {
    full: Phase,
    halved: Phase,
    served: Served,
    errors: u64,
    /// CRITICAL requests answered 429 (only Sluice answers 429).
    critical_limited: u64,
    timeline: String,
}

async fn run(variant: Variant) -> Run {
    let upstream = CappedUpstream::start(capacity(150.0)).await.unwrap();
    let proxies = Proxies::start(variant, &upstream).await;
    let duration = Duration::from_secs(DURATION_S);
    let load = LoadRun::start(LoadPlan::new(skewed_streams(&proxies.urls()), duration)).unwrap();
    tokio::time::sleep(Duration::from_secs(HALVED_AT_S).saturating_sub(load.elapsed())).await;
    upstream.set_capacity(capacity(75.0));
    let halved_at = load.elapsed();
    let result = load.finish().await.unwrap();
    let whole = Window::secs(0.0, 3600.0);
    let errors = result.counts(whole, |_| true).errors;
    let critical_limited = result.tenant_counts(whole, "critical").limited;
    if errors > 0 {
        proxies.print_logs();
    }
    Run {
        // After the first 8 s of adapting, and 7 s after the halving.
        full: Phase::of(&result, Window::secs(8.0, HALVED_AT_S as f64)),
        halved: Phase::of(
            &result,
            Window {
                from: halved_at + Duration::from_secs(7),
                to: duration,
            },
        ),
        served: upstream.served(),
        errors,
        critical_limited,
        timeline: result.timeline(Duration::from_secs(1)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (three 30 s runs): just bench-adaptive"]
async fn sluice_and_envoys_own_overload_filters_side_by_side() {
    let mut table = String::from(
        "| variant | upstream capacity | goodput rps | p50 ms | p99 ms | CRITICAL answered 200 | BULK answered 200 | answered 5xx | answered 200 per Envoy (60/30/10 of the load) |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let mut details = String::new();
    let mut runs = Vec::new();
    for variant in [
        Variant::Sluice,
        Variant::AdaptiveConcurrency,
        Variant::AdmissionControl,
    ] {
        let run = run(variant).await;
        writeln!(table, "{}", run.full.row(variant, "150 rps")).unwrap();
        writeln!(table, "{}", run.halved.row(variant, "75 rps")).unwrap();
        writeln!(
            details,
            "{}: upstream answered {} (200) and {} (503, queue full); CRITICAL answered 429: {}; {} connection errors\n{}",
            variant.name(),
            run.served.ok,
            run.served.rejected,
            run.critical_limited,
            run.errors,
            run.timeline
        )
        .unwrap();
        runs.push(run);
    }
    println!("{table}\n{details}");
    for run in &runs {
        assert_eq!(run.errors, 0, "{table}\n{details}");
        assert!(run.full.goodput_rps > 0.0 && run.halved.goodput_rps > 0.0);
    }
}
