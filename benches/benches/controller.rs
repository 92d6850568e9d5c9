//! The control plane's per-interval work: adding reports into the fleet
//! state, closing the window into a fleet load, and turning the load of 100k
//! buckets into directives. Throughput is in bucket entries per second.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use sluice_benches::bucket_names;
use sluice_benches::control::{connected_fleet, fleet_load, limits, proxy_ids, report};
use sluice_control_plane::Controller;
use sluice_control_plane::fleet::StreamId;
use std::hint::black_box;

/// One proxy's report of `n` buckets, added to a window that already holds
/// those buckets (the steady state: the same tenants every report).
fn fleet_report(c: &mut Criterion) {
    let mut group = c.benchmark_group("fleet_report");
    for buckets in [1_000, 10_000] {
        let names = bucket_names(buckets);
        let proxies = proxy_ids(1);
        let mut fleet = connected_fleet(&proxies);
        let report = report(&names, 25);
        group.throughput(Throughput::Elements(buckets as u64));
        group.bench_function(format!("{buckets}_buckets"), |b| {
            b.iter(|| fleet.report("proxy-0", StreamId(0), black_box(&report)))
        });
    }
    group.finish();
}

/// Closing the window: per-proxy rates, then the sum over proxies.
fn fleet_tick(c: &mut Criterion) {
    let mut group = c.benchmark_group("fleet_tick");
    group.sample_size(20);
    for (proxies, buckets) in [(10, 1_000), (10, 10_000)] {
        let names = bucket_names(buckets);
        let proxies = proxy_ids(proxies);
        let report = report(&names, 25);
        group.throughput(Throughput::Elements((proxies.len() * buckets) as u64));
        group.bench_function(
            format!("{}_proxies_x_{buckets}_buckets", proxies.len()),
            |b| {
                b.iter_batched(
                    || {
                        let mut fleet = connected_fleet(&proxies);
                        for (i, proxy) in proxies.iter().enumerate() {
                            let _ = fleet.report(proxy, StreamId(i as u64), &report);
                        }
                        fleet
                    },
                    |mut fleet| fleet.tick(),
                    BatchSize::LargeInput,
                )
            },
        );
    }
    group.finish();
}

/// Directives for 100k buckets: the first tick (everything is new and
/// pushed) and a steady tick (same load, nothing changed).
fn controller_tick(c: &mut Criterion) {
    const BUCKETS: usize = 100_000;
    let names = bucket_names(BUCKETS);
    let load = fleet_load(&names);
    let limits = limits();
    let mut group = c.benchmark_group("controller_tick");
    group.sample_size(20);
    group.throughput(Throughput::Elements(BUCKETS as u64));
    group.bench_function("100k_buckets_first", |b| {
        b.iter_batched(
            Controller::default,
            |mut controller| controller.tick(black_box(&load), &limits),
            BatchSize::LargeInput,
        )
    });
    let mut controller = Controller::default();
    controller.tick(&load, &limits);
    // Like `iter_batched` above, the returned `Decision` is freed outside the
    // timed section, so the two benchmarks compare the tick itself.
    group.bench_function("100k_buckets_steady", |b| {
        b.iter_with_large_drop(|| controller.tick(black_box(&load), &limits))
    });
    group.finish();
}

criterion_group!(benches, fleet_report, fleet_tick, controller_tick);
criterion_main!(benches);
