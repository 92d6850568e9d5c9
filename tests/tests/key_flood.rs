//! A flood of one-off bucket keys beside a limited bucket, in real Envoy.
//!
//! `max_buckets` is small (100) so that a flood this machine can send
//! (1,000 distinct keys a second, 10× `max_buckets`) overflows every bounded
//! table of the filter. The flood starts 3 s ahead; then the limited
//! bucket, offered 4× its limit for 17 s, must stay within ±10 % of its
//! limit throughout: unlimited buckets get no
//! directive (the directive table holds only the limited one) and never
//! take the slots kept for cells with a directive in the counters and the
//! pacer. The overflow is visible in `sluice.requests_uncounted`. The same
//! holds for an aggregate pattern whose members are all distinct: the
//! filters count them as the one bucket the pattern names.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use sluice_integration_tests::envoy::Envoy;
use sluice_integration_tests::fleet::{Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window, rate, within};

const LIMITS: &str = r#"
limits:
  - bucket: "limited"
    limit_rps: 100
  - aggregate_pattern: "free-*"
    limit_rps: 100
"#;
const LIMIT_RPS: f64 = 100.0;
const MAX_BUCKETS: u64 = 100;
const FLOOD_RPS: f64 = 1_000.0;
/// How long the limited bucket is offered, after the flood's lead.
const RUN_S: u64 = 17;
const FLOOD_LEAD_S: u64 = 3;
/// Time for the first directive and the smoothing to settle.
const SETTLE_S: f64 = 4.0;
const WINDOW_S: f64 = 4.0;

/// The value of the first `/stats` line whose name contains `name`.
async fn stat(envoy: &Envoy, name: &str) -> Option<f64> {
    let text = envoy.stats(name).await.ok()?;
    text.lines()
        .find(|line| line.contains(name))
        .and_then(|line| line.rsplit(": ").next())
        .and_then(|value| value.trim().parse().ok())
}

/// What is offered 4× its limit beside the flood.
#[derive(Debug, Clone, Copy)]
enum Limited {
    /// The bucket `limited`.
    Bucket,
    /// Buckets `free-<n>`, each sent once, of the aggregate pattern
    /// `free-*`.
    DistinctMembers,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_does_not_lift_a_limited_bucket() {
    flood(Some(MAX_BUCKETS), FLOOD_RPS, Limited::Bucket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregate_pattern_of_distinct_members_holds_its_limit_in_a_flood() {
    flood(Some(MAX_BUCKETS), FLOOD_RPS, Limited::DistinctMembers).await;
}

/// The filter's default `max_buckets` (10,000) under the largest flood
/// this machine sends (`SLUICE_FLOOD_RPS`, 3,000 distinct keys a second by
/// default): a measurement, run by hand (`cargo test … -- --ignored`),
/// since a flood of 10× the default per second does not fit the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement at the default max_buckets; run by hand"]
async fn a_key_flood_at_the_default_max_buckets() {
    let flood_rps = std::env::var("SLUICE_FLOOD_RPS")
        .ok()
        .and_then(|rps| rps.parse().ok())
        .unwrap_or(3_000.0);
    flood(None, flood_rps, Limited::Bucket).await;
}

/// A flood of `flood_rps` one-off keys beside the `limited` load, with
/// `max_buckets` (`None`: the filter's default, 10,000).
async fn flood(max_buckets: Option<u64>, flood_rps: f64, limited: Limited) {
    let mut options = FleetOptions::new(LIMITS, 1);
    // Otherwise the filter's defaults (credit decision, allowance on).
    if let Some(max_buckets) = max_buckets {
        options.filter = serde_json::json!({"max_buckets": max_buckets});
    }
    let max_buckets = max_buckets.unwrap_or(10_000);
    let fleet = Fleet::start(options).await.unwrap();
    let url = fleet.url(0).unwrap();

    // The flood first, so that every bounded table is already full of
    // one-off keys when the limited bucket appears: before the limited
    // cells had room of their own, its directive found the filter's table
    // full and was rejected.
    let mut plan = LoadPlan::new(
        vec![StreamSpec::unique("flood", &url, "flood", flood_rps)],
        Duration::from_secs(FLOOD_LEAD_S + RUN_S),
    );
    plan.max_in_flight = 1024;
    let flood_run = LoadRun::start(plan).unwrap();
    tokio::time::sleep(Duration::from_secs(FLOOD_LEAD_S)).await;
    // Requests are told apart by their tenant header's value (its prefix
    // for distinct keys).
    let (stream, tenant) = match limited {
        Limited::Bucket => (
            StreamSpec::new("limited", &url, "limited", 4.0 * LIMIT_RPS),
            "limited",
        ),
        Limited::DistinctMembers => (
            StreamSpec::unique("limited", &url, "free", 4.0 * LIMIT_RPS),
            "free",
        ),
    };
    let run = LoadRun::start(LoadPlan::new(vec![stream], Duration::from_secs(RUN_S))).unwrap();
    // The directive table mid-run: the limited bucket (or the pattern's
    // one cell) only.
    tokio::time::sleep(Duration::from_secs(RUN_S / 2)).await;
    let directive_cells = stat(&fleet.envoys[0], "sluice.directive_cells").await;
    // The control plane's state and its scrape, mid-flood.
    let scrape = fleet.control_plane.admin().metrics().await.unwrap();
    let cells_tracked = scrape
        .lines()
        .find_map(|line| line.strip_prefix("sluice_cells_tracked "))
        .and_then(|value| value.trim().parse::<f64>().ok());
    let scrape_lines = scrape.lines().count();
    let result = run.finish().await.unwrap();
    let flood_result = flood_run.finish().await.unwrap();

    let uncounted = stat(&fleet.envoys[0], "sluice.requests_uncounted").await;
    let whole = Window::secs(SETTLE_S, RUN_S as f64);
    let flood_whole = Window::secs(
        FLOOD_LEAD_S as f64 + SETTLE_S,
        (FLOOD_LEAD_S + RUN_S) as f64,
    );
    let flood = flood_result.tenant_counts(flood_whole, "flood");
    let mut windows = Vec::new();
    let mut from = SETTLE_S;
    while from + WINDOW_S <= RUN_S as f64 + 1e-9 {
        let window = Window::secs(from, from + WINDOW_S);
        windows.push((from, rate(result.tenant_counts(window, tenant).ok, window)));
        from += WINDOW_S;
    }
    let overall = rate(result.tenant_counts(whole, tenant).ok, whole);
    let summary = format!(
        "{limited:?}: {overall:.1} rps admitted over {SETTLE_S}-{RUN_S} s (limit {LIMIT_RPS}); \
         {WINDOW_S} s windows: {windows:.1?}\n\
         flood: {} sent, {} ok, {} errors, {} skipped\n\
         directive cells mid-run: {directive_cells:?}; requests uncounted: {uncounted:?}\n\
         control plane mid-run: {cells_tracked:?} cells tracked, /metrics {scrape_lines} lines\n{}",
        flood.sent,
        flood.ok,
        flood.errors,
        flood.skipped,
        result.timeline(Duration::from_secs(1)),
    );
    println!("{summary}");
    let ok = within(overall, LIMIT_RPS, 0.10)
        && windows
            .iter()
            .all(|(_, admitted)| within(*admitted, LIMIT_RPS, 0.10));
    if !ok {
        fleet.print_logs();
    }
    // The flood really was one: most of it reached Envoy and passed.
    assert!(
        flood.ok as f64 >= 0.8 * flood_rps * flood_whole.len_secs(),
        "{summary}"
    );
    assert!(within(overall, LIMIT_RPS, 0.10), "{summary}");
    for (_, admitted) in &windows {
        assert!(within(*admitted, LIMIT_RPS, 0.10), "{summary}");
    }
    assert_eq!(directive_cells, Some(1.0), "{summary}");
    // The small table's counters overflow (a 100 ms report window meets
    // about as many new keys as `max_buckets`); at the default they hold a
    // window's keys.
    if flood_rps * 0.1 >= max_buckets as f64 {
        assert!(uncounted.is_some_and(|n| n > 0.0), "{summary}");
    }
    // About 1,000 new keys a second reach Envoy (some 10,000 by mid-run);
    // the filter reports at most `max_buckets` cells a window (three
    // quarters of them unlimited), and the control plane forgets idle ones:
    // its cells and its scrape stay small (75 cells, 459 lines measured).
    // At the default `max_buckets` the scrape is bounded by its own cap of
    // 2,000 buckets with series (966 cells, 4,063 lines measured at 3,000
    // keys a second).
    assert!(
        cells_tracked.is_some_and(|cells| cells <= 2.0 * max_buckets as f64),
        "{summary}"
    );
    let max_scrape_lines = if max_buckets <= 1_000 { 2_000 } else { 20_000 };
    assert!(scrape_lines <= max_scrape_lines, "{summary}");
}
