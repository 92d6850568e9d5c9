//! The filter's per-request work without the host: directive lookup, the
//! coin flip and counting, for one bucket and across 10k buckets, both as
//! the bare table operations and through a warm agent (what a VM runs per
//! request, with coin flips and with the credit), also for a tenant's cell
//! among 10k and for a request under a token budget's cost rule; following
//! a response
//! for the upstream signals, and for the members of an aggregate pattern;
//! bucket-key derivation; and a VM re-reading a
//! 10k-cell shared table after one cell changed.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use sluice_agent::agent::Agent;
use sluice_agent::directives::DirectiveTable;
use sluice_agent::leader::counters::BucketCounters;
use sluice_agent::request::classify::{BucketKeySpec, KeyPart, KeySource};
use sluice_agent::usage::rules::CostRules;
use sluice_benches::{
    Request, bucket_names, table_with, warm_agent, warm_agent_following, warm_aggregate_agent,
    warm_budget_agent, warm_credit_agent, warm_tenant_agent,
};
use sluice_core::Priority;
use sluice_core::coin;
use sluice_proto::v1::{Directive, DirectiveBatch};
use std::hint::black_box;

/// A warm agent for the given buckets and drop ratio.
type WarmAgent = fn(&[String], f64) -> Agent;

fn decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    for (name, buckets) in [("one_bucket", 1), ("keyed_10k_buckets", 10_000)] {
        let names = bucket_names(buckets);
        let table = table_with(&names, 0.5);
        let mut counters = BucketCounters::new(buckets);
        let mut rng = SmallRng::seed_from_u64(7);
        let mut next = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                next = (next + 1) % names.len();
                let bucket = names.get(next).map_or("", String::as_str);
                let drops = coin::flip(table.threshold(black_box(bucket)), &mut rng);
                counters.record(bucket, !drops);
                drops
            })
        });
    }
    // The whole request path of a VM after classification: the cell key,
    // the directive lookup, the per-cell decision state, the counter and
    // the metric; coin flips, then the credit (the default mode), whose
    // per-cell state is read and written on every request.
    let agents: [(&str, usize, WarmAgent); 4] = [
        ("agent_one_bucket", 1, warm_agent),
        ("agent_keyed_10k_buckets", 10_000, warm_agent),
        ("agent_one_bucket_credit", 1, warm_credit_agent),
        ("agent_keyed_10k_buckets_credit", 10_000, warm_credit_agent),
    ];
    for (name, buckets, warm) in agents {
        let names = bucket_names(buckets);
        let mut agent = warm(&names, 0.5);
        let mut next = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                next = (next + 1) % names.len();
                let bucket = names.get(next).map_or("", String::as_str);
                agent.admit(black_box(bucket))
            })
        });
    }
    // The upstream signals' share of a followed request (every request
    // followed, `upstream_sample_every: 1`): after the decision, pick it and
    // copy its bucket; at its response headers, count the status and the
    // latency into the bucket's histogram. The host's two clock reads and
    // the `:status` read are not in it.
    let names = bucket_names(1);
    let mut agent = warm_agent_following(&names, 0.0, 1);
    let mut latency_us = 0u64;
    group.bench_function("agent_observe_response", |b| {
        b.iter(|| {
            latency_us = (latency_us + 997) % 2_000_000;
            if let Some(bucket) = agent.follow_response() {
                agent.observe_response(black_box(&bucket), 200, Some(latency_us));
            }
        })
    });
    // A fairness deployment: one bucket, 10k tenants, each with its own
    // directive; the cell key carries tenant and priority.
    let tenants = bucket_names(10_000);
    let mut agent = warm_tenant_agent("api", &tenants, 0.5);
    let mut next = 0usize;
    group.bench_function("agent_tenant_of_10k", |b| {
        b.iter(|| {
            next = (next + 1) % tenants.len();
            let tenant = tenants.get(next).map_or("", String::as_str);
            agent.admit_cell("api", black_box(tenant), Priority::BestEffort)
        })
    });
    // An aggregate pattern (`free-*`) and 10k distinct members: the glob
    // match and the copy of the pattern's name into the cell, then the
    // one cell's path.
    let members: Vec<String> = (0..10_000).map(|i| format!("free-{i:05}")).collect();
    let mut agent = warm_aggregate_agent(&members, 0.5);
    let mut next = 0usize;
    group.bench_function("agent_aggregate_of_10k_members", |b| {
        b.iter(|| {
            next = (next + 1) % members.len();
            let member = members.get(next).map_or("", String::as_str);
            agent.admit(black_box(member))
        })
    });
    group.finish();
}

/// A token budget's request path from the request's headers: the
/// classification and decision of a request no cost rule applies to, then
/// the same request under the filter's cost rule (its estimate read from a
/// header, counted within the directive's bounds, and the charge its
/// stream's end settles, with the usage parser, made for each request let
/// through).
fn costed_decision(c: &mut Criterion) {
    let request = Request {
        headers: vec![
            (":path".into(), "/v1/chat/completions".into()),
            ("x-estimated-tokens".into(), "1200".into()),
        ],
    };
    let (mut agent, policy) = match warm_budget_agent(0.5) {
        Ok(warm) => warm,
        Err(err) => {
            eprintln!("decision/agent_budget_*: the filter configuration: {err}");
            return;
        }
    };
    let mut group = c.benchmark_group("decision");
    let uncosted = CostRules::default();
    group.bench_function("agent_budget_request_no_cost_rule", |b| {
        b.iter(|| {
            agent
                .admit_costed_request(&policy.classifier, &uncosted, black_box(&request))
                .0
        })
    });
    group.bench_function("agent_budget_request_costed", |b| {
        b.iter(|| {
            agent.admit_costed_request(&policy.classifier, &policy.costs, black_box(&request))
        })
    });
    group.finish();
}

fn bucket_key(c: &mut Criterion) {
    let spec = BucketKeySpec::new(
        vec![
            KeyPart {
                source: KeySource::Header("x-tenant".into()),
                default: "anonymous".into(),
            },
            KeyPart {
                source: KeySource::PathPrefix(1),
                default: "-".into(),
            },
        ],
        "/".into(),
    );
    let request = Request {
        headers: vec![
            (":authority".into(), "api.example.com".into()),
            (":path".into(), "/orders/42?expand=items".into()),
            ("x-tenant".into(), "acme".into()),
        ],
    };
    c.bench_function("bucket_key/header_and_path_prefix", |b| {
        b.iter_batched(
            || request.clone(),
            |request| spec.derive(black_box(&request)),
            BatchSize::SmallInput,
        )
    });
}

/// What a VM does when the leader rewrote the shared table because one of
/// 10k cells changed its ratio: decode it, rendering every cell's 429s
/// again (`render_all`, the way before responses were reused) or only the
/// changed ones (`reuse`).
fn shared_table(c: &mut Criterion) {
    let names = bucket_names(10_000);
    let held = table_with(&names, 0.5);
    let mut written = held.clone();
    written.merge(DirectiveBatch {
        epoch: 1,
        version: 2,
        directives: vec![Directive {
            bucket: names.first().cloned().unwrap_or_default(),
            drop_ratio: 0.75,
            limit_rps: Some(100.0),
            ..Default::default()
        }],
        ..Default::default()
    });
    let bytes = written.encode();
    let mut group = c.benchmark_group("shared_table");
    group.bench_function("reread_10k_cells_render_all", |b| {
        b.iter(|| {
            black_box(DirectiveTable::decode_with(
                black_box(&bytes),
                held.empty_like(),
            ))
        });
    });
    group.bench_function("reread_10k_cells_reuse", |b| {
        b.iter(|| black_box(DirectiveTable::decode_replacing(black_box(&bytes), &held)));
    });
    // What the leader pays to write the table after each change.
    group.bench_function("write_10k_cells", |b| {
        b.iter(|| black_box(black_box(&written).encode()));
    });
    group.finish();
}

criterion_group!(benches, decision, costed_decision, bucket_key, shared_table);
criterion_main!(benches);
