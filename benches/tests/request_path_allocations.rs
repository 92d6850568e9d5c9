//! The per-request decision path must not allocate once warm: an allocation
//! per request would cost more than the whole lookup and coin flip, and
//! would fragment the wasm VM's linear memory over time.
//!
//! A counting global allocator tallies allocations made by the current thread
//! while a probe is open, so tests running in parallel on other threads do
//! not disturb the count.

// A global allocator can only be written as `unsafe impl GlobalAlloc`; this
// file forwards every call to the system allocator unchanged and only counts.
// The workspace denies unsafe code everywhere else.
#![allow(unsafe_code)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use rand::SeedableRng;
use rand::rngs::SmallRng;
use sluice_benches::{bucket_names, table_with};
use sluice_filter::agent::{Agent, AgentSettings};
use sluice_filter::counters::BucketCounters;
use sluice_filter::decision::{Verdict, decide};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;

struct Counting;

thread_local! {
    // `const` and a `Drop`-free type: reading it never allocates nor
    // registers a destructor, so it is safe to touch from the allocator.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note_allocation() {
    if COUNTING.with(Cell::get) {
        ALLOCATIONS.with(|count| count.set(count.get() + 1));
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments, so
// `System`'s guarantees carry over; counting touches only thread-locals.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations `work` makes on this thread.
fn allocations_in(work: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|count| count.set(0));
    COUNTING.with(|on| on.set(true));
    work();
    COUNTING.with(|on| on.set(false));
    ALLOCATIONS.with(Cell::get)
}

const REQUESTS: usize = 10_000;

#[test]
fn warm_decision_path_does_not_allocate() {
    let names = bucket_names(1_000);
    // Half the buckets have a directive, half do not: both lookups are
    // exercised, and at 0.5 both verdicts occur.
    let (limited, unlimited) = names.split_at(names.len() / 2);
    let table = table_with(limited, 0.5);
    let mut counters = BucketCounters::new(names.len());
    let mut rng = SmallRng::seed_from_u64(7);
    // Warm: every bucket seen once, so each has its counter.
    for bucket in &names {
        counters.record(bucket, true);
    }
    assert!(!unlimited.is_empty());

    let mut dropped = 0usize;
    let allocations = allocations_in(|| {
        for i in 0..REQUESTS {
            let bucket = names[i % names.len()].as_str();
            let verdict = decide(table.threshold(black_box(bucket)), &mut rng);
            counters.record(bucket, verdict == Verdict::Admit);
            dropped += usize::from(verdict == Verdict::Drop);
        }
    });

    assert_eq!(allocations, 0, "{REQUESTS} warm requests allocated");
    assert!(dropped > 0 && dropped < REQUESTS, "dropped {dropped}");
}

#[test]
fn warm_agent_admit_does_not_allocate() {
    // The public API gives no way to load directives into an `Agent` without
    // a host, so this covers the no-directive lookup, the coin flip's
    // short-cut and the counter; the test above covers thresholds.
    let mut agent = Agent::new(
        AgentSettings {
            control_plane_cluster: "sluice_control_plane".into(),
            proxy_id: "bench".into(),
            report_interval_ms: 1_000,
            max_buckets: 1_000,
            decision: sluice_filter::pacing::DecisionMode::Credit,
            allowance: Some(sluice_filter::allowance::AllowanceSettings::default()),
        },
        7,
    );
    let names = bucket_names(100);
    for bucket in &names {
        agent.admit(bucket);
    }

    let allocations = allocations_in(|| {
        for i in 0..REQUESTS {
            black_box(agent.admit(black_box(&names[i % names.len()])));
        }
    });

    assert_eq!(allocations, 0, "{REQUESTS} warm admits allocated");
}

/// The probe can fail: a bucket seen for the first time allocates its key.
#[test]
fn first_seen_bucket_allocates() {
    let names = bucket_names(100);
    let mut counters = BucketCounters::new(names.len());

    let allocations = allocations_in(|| {
        for bucket in &names {
            counters.record(bucket, true);
        }
    });

    assert!(
        allocations >= names.len() as u64,
        "{} new buckets made only {allocations} allocations",
        names.len()
    );
}

#[test]
fn warm_pacer_with_caps_does_not_allocate() {
    use sluice_filter::allowance::AllowanceSettings;
    use sluice_filter::pacing::{DecisionMode, Pacer};
    use sluice_proto::v1::Directive;

    let names = bucket_names(100);
    let mut rng = SmallRng::seed_from_u64(3);
    let mut pacer = Pacer::new(
        DecisionMode::Credit,
        Some(AllowanceSettings::default()),
        100,
        1_000,
    );
    for tick in 0..10 {
        pacer.on_tick(tick * 100, names.iter().map(String::as_str), &mut rng);
    }
    // Half the buckets get a cap, the other half decide by credit.
    let directives: Vec<Directive> = names
        .iter()
        .step_by(2)
        .map(|bucket| Directive {
            bucket: bucket.clone(),
            drop_ratio: 0.5,
            limit_rps: 100.0,
            offered_rps: 200.0,
            ..Default::default()
        })
        .collect();
    pacer.apply(&directives);
    let threshold = sluice_filter::drop_ratio::DropRatio::new(0.5)
        .unwrap()
        .threshold();

    let allocations = allocations_in(|| {
        for i in 0..REQUESTS {
            let bucket = names[i % names.len()].as_str();
            black_box(pacer.decide(black_box(bucket), threshold, &mut rng));
        }
    });

    assert_eq!(allocations, 0, "{REQUESTS} warm paced decisions allocated");
}
