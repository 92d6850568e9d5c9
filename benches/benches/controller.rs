//! The control plane's per-interval work: adding reports into the fleet
//! state, closing the window into a fleet load, and turning the load of 100k
//! buckets into directives. Throughput is in bucket entries per second.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use sluice_benches::bucket_names;
use sluice_benches::control::{connected_fleet, fleet_load, limits, proxy_ids, report};
use sluice_control_plane::Controller;
use sluice_control_plane::config::limits::{LimitRule, LimitTable, Selector};
use sluice_control_plane::config::policy::{Policy, TenantPolicy, Tenants, Weight};
use sluice_control_plane::control::estimator::Tracking;
use sluice_control_plane::control::fairness::{Allocation, Scratch, TenantDemand, allocate_into};
use sluice_control_plane::fleet::{
    BucketLoad, BucketTraffic, CellLoad, FleetLoad, ShareCap, StreamId,
};
use sluice_control_plane::types::LimitRps;
use sluice_core::{CLASSES, Priority};

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

/// Closing the window: per-proxy rates, then the sum over proxies; with
/// the default share cap (every bucket's per-proxy rates weighed against
/// their median) and, as the baseline of the same run, without it.
fn fleet_tick(c: &mut Criterion) {
    let mut group = c.benchmark_group("fleet_tick");
    group.sample_size(20);
    for (proxies, buckets) in [(10, 1_000), (10, 10_000)] {
        let names = bucket_names(buckets);
        let proxies = proxy_ids(proxies);
        let report = report(&names, 25);
        group.throughput(Throughput::Elements((proxies.len() * buckets) as u64));
        for (suffix, share_cap) in [("", ShareCap::default()), ("_no_share_cap", ShareCap::OFF)] {
            group.bench_function(
                format!("{}_proxies_x_{buckets}_buckets{suffix}", proxies.len()),
                |b| {
                    b.iter_batched(
                        || {
                            let mut fleet = connected_fleet(&proxies);
                            fleet.set_share_cap(share_cap);
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
    // Like `iter_batched` above, the returned `IntervalOutcome` is freed outside the
    // timed section, so the two benchmarks compare the tick itself.
    group.bench_function("100k_buckets_steady", |b| {
        b.iter_with_large_drop(|| controller.tick(black_box(&load), &limits))
    });
    // The tracking policy, `sluice serve`'s default, keeps an estimate per
    // cell: one more hash probe per cell and tick.
    let mut tracking = Controller::new(Tracking::new());
    tracking.tick(&load, &limits);
    group.bench_function("100k_buckets_steady_tracking", |b| {
        b.iter_with_large_drop(|| tracking.tick(black_box(&load), &limits))
    });
    group.finish();
}

/// 10k tenants of one bucket: weights 1–7, a floor for every third, offered
/// 1–100 requests/s, spread over the four priority classes, against a limit
/// of a third of what is offered (so every class up to BEST_EFFORT is
/// water-filled or shed).
fn tenant_demands(n: usize) -> Vec<TenantDemand> {
    (0..n)
        .map(|i| {
            let mut offered = [0.0; CLASSES];
            if let Some(slot) = offered.get_mut(i % CLASSES) {
                *slot = (i % 100 + 1) as f64;
            }
            TenantDemand {
                weight: (i % 7 + 1) as f64,
                floor: if i % 3 == 0 { 5.0 } else { 0.0 },
                offered,
            }
        })
        .collect()
}

/// The fair division of one bucket among 10k tenants, alone and through the
/// controller (tenant policy lookups, per-cell ratios, change detection).
fn fair_shares(c: &mut Criterion) {
    const TENANTS: usize = 10_000;
    let mut group = c.benchmark_group("fair_shares");
    group.throughput(Throughput::Elements(TENANTS as u64));
    let demands = tenant_demands(TENANTS);
    let offered: f64 = demands.iter().flat_map(|d| d.offered.iter()).sum();
    let limit = offered / 3.0;
    let mut allocation = Allocation::default();
    let mut scratch = Scratch::default();
    group.bench_function("10k_tenants_allocate", |b| {
        b.iter(|| {
            allocate_into(black_box(limit), &demands, &mut allocation, &mut scratch);
        })
    });

    let names: Vec<Arc<str>> = (0..TENANTS)
        .map(|i| Arc::from(format!("t{i:05}")))
        .collect();
    let cells = demands
        .iter()
        .zip(&names)
        .enumerate()
        .map(|(i, (demand, tenant))| {
            let offered_rps: f64 = demand.offered.iter().sum();
            CellLoad {
                tenant: Arc::clone(tenant),
                priority: match i % CLASSES {
                    0 => Priority::Critical,
                    1 => Priority::Degraded,
                    2 => Priority::BestEffort,
                    _ => Priority::Bulk,
                },
                load: BucketLoad {
                    offered_rps,
                    admitted_rps: offered_rps,
                    proxies_reporting: 3,
                    stale_share: 0.0,
                    requests_rps: 0.0,
                },
                shadow_dropped_rps: 0.0,
                charges: None,
            }
        })
        .collect();
    let load = FleetLoad::new(vec![BucketTraffic::from_cells("api", cells)]);
    let mut tenants = Tenants::default();
    for (i, name) in names.iter().enumerate().step_by(2) {
        let policy = TenantPolicy {
            weight: Weight::new((i % 7 + 1) as f64).unwrap_or_default(),
            min_floor_rps: if i % 3 == 0 {
                LimitRps::new(5.0).unwrap_or(LimitRps::ZERO)
            } else {
                LimitRps::ZERO
            },
            ..TenantPolicy::default()
        };
        tenants.insert(name.to_string(), policy);
    }
    let policy = Policy {
        limits: LimitTable::from_rules(
            None,
            [LimitRule {
                selector: Selector::Bucket("api".into()),
                limit: LimitRps::new(limit).unwrap_or(LimitRps::ZERO).into(),
            }],
        ),
        tenants,
        ..Policy::default()
    };
    let mut controller = Controller::default();
    controller.decide(&load, &policy);
    group.bench_function("10k_tenants_controller_steady", |b| {
        b.iter_with_large_drop(|| controller.decide(black_box(&load), &policy))
    });
    let mut tracking = Controller::new(Tracking::new());
    tracking.decide(&load, &policy);
    group.bench_function("10k_tenants_controller_steady_tracking", |b| {
        b.iter_with_large_drop(|| tracking.decide(black_box(&load), &policy))
    });
    group.finish();
}

criterion_group!(
    benches,
    fleet_report,
    fleet_tick,
    controller_tick,
    fair_shares
);
criterion_main!(benches);
