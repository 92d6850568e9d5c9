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
use sluice_agent::agent::Agent;
use sluice_agent::config::FilterConfig;
use sluice_agent::directives::DirectiveTable;
use sluice_agent::host::{HostError, Log, LogLevel};
use sluice_agent::identity::ProxyIdentity;
use sluice_agent::leader::counters::BucketCounters;
use sluice_agent::request::classify::RequestAttributes;
use sluice_agent::request::handler::{self, HeadersAction, HttpRequest};
use sluice_agent::request::new_cells::NewBucketPolicy;
use sluice_agent::request::reject::RejectResponse;
use sluice_agent::settings::AgentSettings;
use sluice_benches::{bench_settings, bucket_names, table_with};
use sluice_core::Priority;
use sluice_core::coin;
use sluice_core::decision::Outcome;
use sluice_proto::v1::{Directive, DirectiveBatch, Mode};
use std::alloc::{GlobalAlloc, Layout, System};
use std::borrow::Cow;
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
            let drops = coin::flip(table.threshold(black_box(bucket)), &mut rng);
            counters.record(bucket, !drops);
            dropped += usize::from(drops);
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
            report_interval_ms: 1_000,
            max_buckets: 1_000,
            ..bench_settings()
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

/// The cell path: tenant and priority cells with their own directives
/// (enforced and shadowed), cells falling back to the bucket-wide
/// directive, and new cells under a local limit; rejections hand out the
/// prepared response without copying it.
#[test]
fn warm_cell_admit_does_not_allocate() {
    let mut agent = Agent::new(
        AgentSettings {
            max_buckets: 1_000,
            new_bucket: NewBucketPolicy::LocalLimit {
                fleet_limit_rps: 10.0,
                expected_proxies: 1,
            },
            ..bench_settings()
        },
        7,
    );
    let buckets = bucket_names(20);
    let mut directives = Vec::new();
    for (i, bucket) in buckets.iter().enumerate().take(10) {
        directives.push(Directive {
            bucket: bucket.clone(),
            drop_ratio: 0.5,
            limit_rps: Some(100.0),
            ..Default::default()
        });
        directives.push(Directive {
            bucket: bucket.clone(),
            tenant: "acme".into(),
            priority: Priority::Bulk as i32,
            drop_ratio: 0.9,
            share_rps: 10.0,
            mode: if i % 2 == 0 {
                Mode::Shadow
            } else {
                Mode::Enforce
            } as i32,
            ..Default::default()
        });
    }
    let mut table = DirectiveTable::new(1_000);
    table.merge(DirectiveBatch {
        directives,
        ..Default::default()
    });
    agent.load_directives(table);
    let cells: Vec<(String, &str, Priority)> = buckets
        .iter()
        .flat_map(|bucket| {
            [
                (bucket.clone(), "acme", Priority::Bulk),
                (bucket.clone(), "globex", Priority::Critical),
                (bucket.clone(), "", Priority::Unspecified),
            ]
        })
        .collect();
    for (bucket, tenant, priority) in &cells {
        agent.admit_cell(bucket, tenant, *priority);
    }

    let mut rejected = 0usize;
    let allocations = allocations_in(|| {
        for i in 0..REQUESTS {
            let (bucket, tenant, priority) = &cells[i % cells.len()];
            let decision = agent.admit_cell(black_box(bucket), tenant, *priority);
            rejected += usize::from(decision.outcome == Outcome::Dropped);
            black_box(decision);
        }
    });

    assert_eq!(allocations, 0, "{REQUESTS} warm cell admits allocated");
    assert!(rejected > 0 && rejected < REQUESTS, "rejected {rejected}");
}

/// The probe can fail: a bucket seen for the first time allocates its key.
#[test]
fn first_seen_bucket_allocates() {
    let names = bucket_names(100);
    // Room for every one of them, none having a directive.
    let mut counters = BucketCounters::new(names.len() * 2);

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

/// The agent as a VM in Envoy runs it: directives on every bucket, counters
/// and per-cell decision state warmed by a tick.
#[test]
fn warm_ticked_agent_does_not_allocate() {
    let names = bucket_names(1_000);
    let mut agent = sluice_benches::warm_agent(&names, 0.5);

    let mut dropped = 0usize;
    let allocations = allocations_in(|| {
        for i in 0..REQUESTS {
            let decision = agent.admit(black_box(&names[i % names.len()]));
            dropped += usize::from(decision.outcome == Outcome::Dropped);
        }
    });

    assert_eq!(allocations, 0, "{REQUESTS} warm admits allocated");
    assert!(
        dropped > REQUESTS / 3 && dropped < REQUESTS * 2 / 3,
        "dropped {dropped}"
    );
}

/// A request whose effects only count: the handler's own work, as a host
/// with no-op effects would see it.
#[derive(Default)]
struct CountingRequest<'a> {
    authority: &'a [u8],
    records: usize,
    flags: usize,
    rejections: usize,
}

impl RequestAttributes for CountingRequest<'_> {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        (name == ":authority").then_some(Cow::Borrowed(self.authority))
    }

    fn route_name(&self) -> Option<Cow<'_, [u8]>> {
        None
    }
}

impl Log for CountingRequest<'_> {
    fn log(&self, _level: LogLevel, _message: &str) {}
}

impl HttpRequest for CountingRequest<'_> {
    fn set_decision_record(&mut self, record: &str) -> Result<(), HostError> {
        self.records += usize::from(!black_box(record).is_empty());
        Ok(())
    }

    fn add_request_header(&mut self, _name: &str, _value: &str) -> Result<(), HostError> {
        self.flags += 1;
        Ok(())
    }

    fn send_rejection(&mut self, response: &RejectResponse) -> Result<(), HostError> {
        self.rejections += usize::from(!black_box(&response.body).is_empty());
        Ok(())
    }

    fn response_status(&self) -> Option<Cow<'_, [u8]>> {
        None
    }

    fn clock_ns(&self) -> Option<u64> {
        None
    }

    fn metadata_number(&self, _namespace: &str, _key: &str) -> Option<f64> {
        None
    }

    fn response_header(&self, _name: &str) -> Option<Cow<'_, [u8]>> {
        None
    }

    fn response_trailer(&self, _name: &str) -> Option<Cow<'_, [u8]>> {
        None
    }
}

/// The request handler every host calls, from the request's header to
/// its effects: classification, decision, the record of each drop and the
/// 429, for buckets with and without a directive.
/// Following a response copies its bucket, so none is followed here.
#[test]
fn warm_request_handler_does_not_allocate() {
    let parts = FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp", "decision": "coin", "allowance": null,
             "upstream_sample_every": 0}"#,
    )
    .unwrap()
    .into_parts(|| ProxyIdentity::Named("bench".into()), String::new);
    let names = bucket_names(200);
    let (limited, _) = names.split_at(names.len() / 2);
    let agent_settings = parts.agent.clone();
    let mut agent = Agent::new(parts.agent, 7);
    agent.load_directives(table_with(limited, 0.5));
    let policy = parts.request;
    let mut followed = None;
    let mut charge = None;
    let mut requests: Vec<CountingRequest> = names
        .iter()
        .map(|name| CountingRequest {
            authority: name.as_bytes(),
            ..CountingRequest::default()
        })
        .collect();
    for request in &mut requests {
        let rejection = handler::decide(&mut agent, &policy, request, &mut followed, &mut charge);
        handler::answer(request, rejection);
    }

    let mut stopped = 0usize;
    let allocations = allocations_in(|| {
        for i in 0..REQUESTS {
            let request = &mut requests[i % names.len()];
            let rejection =
                handler::decide(&mut agent, &policy, request, &mut followed, &mut charge);
            stopped += usize::from(handler::answer(request, rejection) == HeadersAction::Stop);
        }
    });

    assert_eq!(allocations, 0, "{REQUESTS} warm requests allocated");
    assert!(stopped > 0 && stopped < REQUESTS, "stopped {stopped}");
    let sum = |count: fn(&CountingRequest) -> usize| requests.iter().map(count).sum::<usize>();
    assert!(sum(|r| r.rejections) > 0);
    assert!(sum(|r| r.records) >= sum(|r| r.rejections));
    // Fresh directives: no request is flagged as undirected.
    assert_eq!(sum(|r| r.flags), 0);
    assert!(followed.is_none());

    // No directives yet: every request is recorded and flagged upstream.
    let mut agent = Agent::new(agent_settings, 7);
    for request in &mut requests {
        handler::decide(&mut agent, &policy, request, &mut followed, &mut charge);
    }
    let allocations = allocations_in(|| {
        for i in 0..REQUESTS {
            let request = &mut requests[i % names.len()];
            let rejection =
                handler::decide(&mut agent, &policy, request, &mut followed, &mut charge);
            black_box(handler::answer(request, rejection));
        }
    });
    assert_eq!(allocations, 0, "{REQUESTS} undirected requests allocated");
    assert_eq!(sum_flags(&requests), REQUESTS + names.len());
    assert!(charge.is_none());
}

/// A filter with cost rules: requests no rule applies to allocate nothing
/// more than without them.
#[test]
fn warm_requests_without_a_cost_rule_do_not_allocate_beside_cost_rules() {
    let parts = FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp", "decision": "coin", "allowance": null,
             "upstream_sample_every": 0,
             "cost_rules": [{"bucket": "llm/*", "cost": {"estimate": {"source": "constant", "value": 500}}}]}"#,
    )
    .unwrap()
    .into_parts(|| ProxyIdentity::Named("bench".into()), String::new);
    let names = bucket_names(200);
    let (limited, _) = names.split_at(names.len() / 2);
    let mut agent = Agent::new(parts.agent, 7);
    agent.load_directives(table_with(limited, 0.5));
    let policy = parts.request;
    let mut followed = None;
    let mut charge = None;
    let mut requests: Vec<CountingRequest> = names
        .iter()
        .map(|name| CountingRequest {
            authority: name.as_bytes(),
            ..CountingRequest::default()
        })
        .collect();
    for request in &mut requests {
        let rejection = handler::decide(&mut agent, &policy, request, &mut followed, &mut charge);
        handler::answer(request, rejection);
    }
    let allocations = allocations_in(|| {
        for i in 0..REQUESTS {
            let request = &mut requests[i % names.len()];
            let rejection =
                handler::decide(&mut agent, &policy, request, &mut followed, &mut charge);
            black_box(handler::answer(request, rejection));
        }
    });
    assert_eq!(allocations, 0, "{REQUESTS} warm requests allocated");
    assert!(charge.is_none());
}

fn sum_flags(requests: &[CountingRequest]) -> usize {
    requests.iter().map(|r| r.flags).sum()
}
