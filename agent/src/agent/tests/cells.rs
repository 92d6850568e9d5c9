//! Cells, modes and fallbacks: what each VM decides once directives arrive.

use super::*;
use crate::metrics::{Counter, Gauge};
use crate::request::new_cells::NewBucketPolicy;
use crate::shared::DIRECTIVES_META_KEY;
use crate::shared::DirectivesMeta;
use crate::testing::request::FakeRequest;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_core::allowance::Engage;
use sluice_core::directive::DirectiveTtl;
use sluice_core::regime::Fallback;
use sluice_core::{DropReason, Priority};
use sluice_proto::v1::{Mode, ModePolicy, Reason};
use std::sync::Arc;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

impl Fleet {
    /// The control plane sends this batch on the current stream.
    fn push_batch(&mut self, batch: DirectiveBatch) {
        let (token, vm) = self.the_stream();
        let message = ControlMessage {
            kind: Some(control_message::Kind::Directives(batch)),
        };
        let now_ms = self.now_ms;
        let (host, agent) = &mut self.vms[vm];
        agent.on_stream_message(host, token, &message.encode_to_vec(), now_ms);
    }

    /// Ticks one VM at an arbitrary time (the clock does not move).
    fn tick_vm_at(&mut self, vm: usize, now_ms: u64) {
        let (host, agent) = &mut self.vms[vm];
        agent.on_tick(host, now_ms);
    }

    fn cell_decisions(
        &mut self,
        vm: usize,
        cell: (&str, &str, Priority),
        n: usize,
    ) -> (usize, Option<Arc<crate::request::reject::RejectResponse>>) {
        let mut rejected = 0;
        let mut last = None;
        for _ in 0..n {
            let agent = &mut self.vms[vm].1;
            if agent.admit_cell(cell.0, cell.1, cell.2).outcome == Outcome::Dropped {
                rejected += 1;
                last = agent.rejection().cloned();
            }
        }
        (rejected, last)
    }

    fn logs_containing(&self, text: &str) -> Vec<(usize, LogLevel)> {
        self.process
            .borrow()
            .logs
            .iter()
            .filter(|(_, _, line)| line.contains(text))
            .map(|(vm, level, _)| (*vm, *level))
            .collect()
    }
}

fn batch(directives: Vec<Directive>) -> DirectiveBatch {
    DirectiveBatch {
        epoch: 1,
        version: 1,
        directives,
        ..Default::default()
    }
}

fn cell(bucket: &str, tenant: &str, priority: Priority, drop_ratio: f64) -> Directive {
    Directive {
        bucket: bucket.into(),
        tenant: tenant.into(),
        priority: priority as i32,
        drop_ratio,
        limit_rps: Some(100.0),
        ..Default::default()
    }
}

#[test]
fn short_ticks_bring_a_directive_to_every_vm_within_one_poll() {
    let mut fleet = Fleet::new(3);
    fleet.ticks(2);
    let leader = fleet.leaders()[0];
    let start = fleet.now_ms;
    let follower = (leader + 1) % 3;
    // Followers are mid-way between slow ticks: the short tick alone
    // must pick the table up.
    fleet.tick_vm_at(follower, start + 20);
    fleet.push(1, 1, &[("acme", 1.0)]);
    assert_eq!(
        fleet.admit_n(follower, "acme", 10),
        0,
        "not before its tick"
    );
    fleet.tick_vm_at(follower, start + 40);
    assert_eq!(fleet.admit_n(follower, "acme", 10), 10);
    // The slow work keeps its cadence: one hand-off per ~100 ms with
    // continuous traffic and one per report window the leader closes
    // (250 ms), not one per short tick.
    let enqueued = |fleet: &Fleet| fleet.process.borrow().enqueued();
    let before = enqueued(&fleet);
    for step in 3..=52u64 {
        fleet.admit_n(follower, "free", 1);
        fleet.tick_vm_at(follower, start + step * 20);
        if step % 5 == 0 {
            fleet.tick_vm_at(leader, start + step * 20);
        }
    }
    let handoffs = enqueued(&fleet) - before;
    assert!((13..=18).contains(&handoffs), "{handoffs} hand-offs in 1 s");
}

#[test]
fn requests_are_classified_into_their_cells() {
    let config = crate::config::FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp",
             "bucket_key": [{"source": "authority"}],
             "tenant": {"source": "header", "name": "x-tenant"},
             "priority": {"header": "x-priority", "values": {"batch": "bulk"}}}"#,
    )
    .unwrap();
    let mut fleet = Fleet::new(1);
    fleet.ticks(2);
    fleet.push_batch(batch(vec![cell("api", "acme", Priority::Bulk, 1.0)]));
    fleet.tick();
    let agent = &mut fleet.vms[0].1;
    let bulk = FakeRequest::with_headers(&[
        (":authority", "API"),
        ("x-tenant", "acme"),
        ("x-priority", "Batch"),
    ]);
    let plain = FakeRequest::with_headers(&[(":authority", "api"), ("x-tenant", "acme")]);
    let anonymous = FakeRequest::with_headers(&[(":authority", "api")]);
    assert_eq!(
        agent.admit_request(&config.classifier, &bulk).outcome,
        Outcome::Dropped
    );
    assert!(agent.admit_request(&config.classifier, &plain).admits());
    assert!(agent.admit_request(&config.classifier, &anonymous).admits());
    let mut cells = agent.path.cells.clone().drain();
    cells.sort_by(|a, b| (&a.tenant, a.priority).cmp(&(&b.tenant, b.priority)));
    let seen: Vec<(&str, i32, u64, u64)> = cells
        .iter()
        .map(|c| (c.tenant.as_str(), c.priority, c.offered, c.admitted))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("acme", Priority::BestEffort as i32, 1, 1),
            ("acme", Priority::Bulk as i32, 1, 0),
            ("default", Priority::BestEffort as i32, 1, 1),
        ]
    );
}

#[test]
fn values_that_are_not_utf8_get_the_defaults_and_are_counted() {
    let config = crate::config::FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp",
             "bucket_key": [{"source": "header", "name": "x-key", "default": "api"}],
             "tenant": {"source": "header", "name": "x-tenant"},
             "priority": {"header": "x-priority", "values": {"batch": "bulk"}}}"#,
    )
    .unwrap();
    let mut fleet = Fleet::new(1);
    fleet.ticks(2);
    // Only the default cell is limited: a request that invented a cell of
    // its own from bytes that are not UTF-8 would pass.
    fleet.push_batch(batch(vec![cell(
        "api",
        "default",
        Priority::BestEffort,
        1.0,
    )]));
    fleet.tick();
    let agent = &mut fleet.vms[0].1;
    let mut garbage = FakeRequest::default();
    garbage.raw_headers.insert("x-key", b"api\xff");
    garbage.raw_headers.insert("x-tenant", b"\xfe\xff");
    garbage.raw_headers.insert("x-priority", b"batch\xc3");
    for _ in 0..3 {
        assert_eq!(
            agent.admit_request(&config.classifier, &garbage).outcome,
            Outcome::Dropped
        );
    }
    let good = FakeRequest::with_headers(&[("x-key", "api"), ("x-tenant", "acme")]);
    assert!(agent.admit_request(&config.classifier, &good).admits());
    assert_eq!(agent.metrics().pending(Counter::HeaderValuesInvalid), 9);
    fleet.tick();
    assert_eq!(fleet.metric(Counter::HeaderValuesInvalid.name()), Some(9));
}

#[test]
fn the_exact_cell_wins_then_the_bucket_wide_directive() {
    let mut fleet = Fleet::new(1);
    fleet.ticks(2);
    fleet.push_batch(batch(vec![
        cell("api", "", Priority::Unspecified, 0.0),
        cell("api", "acme", Priority::Bulk, 1.0),
    ]));
    fleet.tick();
    assert_eq!(
        fleet
            .cell_decisions(0, ("api", "acme", Priority::Bulk), 50)
            .0,
        50
    );
    assert_eq!(
        fleet
            .cell_decisions(0, ("api", "acme", Priority::Critical), 50)
            .0,
        0
    );
    assert_eq!(
        fleet
            .cell_decisions(0, ("api", "globex", Priority::Bulk), 50)
            .0,
        0
    );
}

#[test]
fn each_drop_answers_with_its_own_cells_429() {
    let mut fleet = Fleet::new(1);
    fleet.ticks(2);
    fleet.push_batch(batch(vec![
        cell("api", "acme", Priority::Unspecified, 1.0),
        cell("api", "globex", Priority::Unspecified, 1.0),
    ]));
    fleet.tick();
    let agent = &mut fleet.vms[0].1;
    let names_its_tenant = |agent: &Agent, tenant: &str| {
        let response = agent.rejection().expect("a 429");
        let body = String::from_utf8_lossy(&response.body).into_owned();
        assert!(body.contains(tenant), "{body}");
        Arc::strong_count(response)
    };
    agent.admit_cell("api", "acme", Priority::Unspecified);
    let held = names_its_tenant(agent, "acme");
    // Drops in a row of one cell keep the 429 already held.
    agent.admit_cell("api", "acme", Priority::Unspecified);
    assert_eq!(names_its_tenant(agent, "acme"), held);
    // Cells taking turns each get their own.
    for _ in 0..3 {
        agent.admit_cell("api", "globex", Priority::Unspecified);
        names_its_tenant(agent, "globex");
        agent.admit_cell("api", "acme", Priority::Unspecified);
        assert_eq!(names_its_tenant(agent, "acme"), held);
    }
}

#[test]
fn an_aggregate_patterns_buckets_are_one_cell_on_every_vm() {
    let mut fleet = Fleet::new(2);
    fleet.ticks(2);
    let (token, _) = fleet.the_stream();
    fleet.push_batch(DirectiveBatch {
        aggregate_patterns: vec!["free-*".into()],
        ..batch(vec![cell("free-*", "", Priority::Unspecified, 1.0)])
    });
    fleet.tick();
    for vm in 0..2 {
        // Every member meets the pattern's directive, on every VM.
        for member in ["free-a", "free-b", "free-c"] {
            let (rejected, response) =
                fleet.cell_decisions(vm, (member, "", Priority::Unspecified), 5);
            assert_eq!(rejected, 5, "{member} on VM {vm}");
            assert!(response.is_some());
        }
        assert_eq!(
            fleet.vms[vm].1.last_decision().reason,
            Some(DropReason::ClusterOverload)
        );
        assert_eq!(
            fleet
                .cell_decisions(vm, ("paid", "", Priority::Unspecified), 5)
                .0,
            0
        );
    }
    fleet.ticks(6);
    let mut buckets: Vec<(String, u64)> = fleet
        .reports(token)
        .into_iter()
        .flat_map(|r| r.buckets)
        .map(|c| (c.bucket, c.offered))
        .collect();
    buckets.sort();
    let mut merged: Vec<(String, u64)> = Vec::new();
    for (bucket, offered) in buckets {
        match merged.last_mut() {
            Some((last, sum)) if *last == bucket => *sum += offered,
            _ => merged.push((bucket, offered)),
        }
    }
    // One cell for the pattern, none per member.
    assert_eq!(merged, [("free-*".to_owned(), 30), ("paid".to_owned(), 10)]);
}

#[test]
fn reports_carry_counts_per_cell() {
    let mut fleet = Fleet::new(2);
    fleet.ticks(2);
    let (token, _) = fleet.the_stream();
    fleet.push_batch(batch(vec![Directive {
        mode: Mode::Shadow as i32,
        ..cell("api", "acme", Priority::Bulk, 1.0)
    }]));
    fleet.tick();
    for vm in 0..2 {
        fleet.cell_decisions(vm, ("api", "acme", Priority::Bulk), 7);
        fleet.cell_decisions(vm, ("api", "globex", Priority::Critical), 3);
        fleet.admit_n(vm, "api", 2);
    }
    fleet.ticks(6);
    let mut counts: Vec<BucketCount> = fleet
        .reports(token)
        .into_iter()
        .flat_map(|r| r.buckets)
        .collect();
    let mut merged = crate::leader::counters::BucketCounters::new(100);
    merged.merge(counts.drain(..), |_| true);
    let mut cells = merged.drain();
    cells.sort_by(|a, b| (&a.tenant, a.priority).cmp(&(&b.tenant, b.priority)));
    let summary: Vec<(&str, i32, u64, u64, u64)> = cells
        .iter()
        .map(|c| {
            (
                c.tenant.as_str(),
                c.priority,
                c.offered,
                c.admitted,
                c.shadow_dropped,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("", Priority::Unspecified as i32, 4, 4, 0),
            ("acme", Priority::Bulk as i32, 14, 14, 14),
            ("globex", Priority::Critical as i32, 6, 6, 0),
        ]
    );
}

#[test]
fn shadow_drops_predict_enforced_drops() {
    let mut fleet = Fleet::new(1);
    fleet.ticks(2);
    fleet.push_batch(batch(vec![
        Directive {
            mode: Mode::Shadow as i32,
            ..cell("shadowed", "", Priority::Unspecified, 0.3)
        },
        Directive {
            mode: Mode::Enforce as i32,
            ..cell("enforced", "", Priority::Unspecified, 0.3)
        },
    ]));
    fleet.tick();
    let n = 20_000;
    let (shadow_rejected, _) = fleet.cell_decisions(0, ("shadowed", "", Priority::Unspecified), n);
    let (enforce_rejected, _) = fleet.cell_decisions(0, ("enforced", "", Priority::Unspecified), n);
    assert_eq!(shadow_rejected, 0, "shadow never rejects");
    fleet.tick();
    let shadow = fleet
        .metric(Counter::DecisionsShadowDrop(DropReason::ClusterOverload).name())
        .unwrap();
    assert_eq!(
        fleet.metric(Counter::DecisionsDropClusterOverload.name()),
        Some(enforce_rejected as u64)
    );
    // Both are Binomial(20000, 0.3): their difference has a standard
    // deviation of about 92; allow five.
    let difference = (shadow as f64 - enforce_rejected as f64).abs();
    assert!(
        difference < 460.0,
        "shadow {shadow} vs enforce {enforce_rejected}"
    );
    assert!(
        (5_500..6_500).contains(&enforce_rejected),
        "{enforce_rejected}"
    );
}

#[test]
fn the_kill_switch_and_the_canary_decide_who_enforces() {
    let mut fleet = Fleet::new(1);
    fleet.ticks(2);
    let always = vec![cell("api", "", Priority::Unspecified, 1.0)];
    let with_modes = |modes: Option<ModePolicy>| DirectiveBatch {
        modes,
        ..batch(always.clone())
    };
    let api = ("api", "", Priority::Unspecified);
    fleet.push_batch(with_modes(Some(ModePolicy {
        kill_switch: true,
        default_mode: Mode::Enforce as i32,
        canary_fraction: Some(1.0),
    })));
    fleet.tick();
    assert_eq!(fleet.cell_decisions(0, api, 10).0, 0);
    // "envoy-a" hashes to 0.276 (see modes.rs).
    fleet.push_batch(with_modes(Some(ModePolicy {
        canary_fraction: Some(0.25),
        ..Default::default()
    })));
    assert_eq!(fleet.cell_decisions(0, api, 10).0, 0, "outside the canary");
    fleet.push_batch(with_modes(Some(ModePolicy {
        canary_fraction: Some(0.3),
        ..Default::default()
    })));
    assert_eq!(fleet.cell_decisions(0, api, 10).0, 10, "inside the canary");
    fleet.push_batch(with_modes(Some(ModePolicy {
        default_mode: Mode::Shadow as i32,
        ..Default::default()
    })));
    assert_eq!(fleet.cell_decisions(0, api, 10).0, 0, "shadow by default");
    fleet.push_batch(with_modes(None));
    assert_eq!(fleet.cell_decisions(0, api, 10).0, 10, "no policy: enforce");
}

fn fallback_fleet(fallback: Fallback) -> Fleet {
    let mut fleet = Fleet::with_settings(
        2,
        AgentSettings {
            directive_ttl: DirectiveTtl::from_millis(1_000).unwrap(),
            fallback,
            ..settings()
        },
    );
    fleet.ticks(2);
    fleet.push_batch(batch(vec![Directive {
        reporting_proxies: 4,
        reason: Reason::TenantQuotaExceeded as i32,
        share_rps: 40.0,
        ..cell("api", "acme", Priority::Unspecified, 1.0)
    }]));
    fleet.tick();
    fleet
}

#[test]
fn after_the_ttl_the_local_limit_applies_loudly_until_a_heartbeat() {
    let mut fleet = fallback_fleet(Fallback::LocalLimit);
    let acme = ("api", "acme", Priority::Unspecified);
    let (rejected, response) = fleet.cell_decisions(0, acme, 20);
    assert_eq!(rejected, 20);
    assert_eq!(
        response.unwrap().header("x-ratelimit-reason"),
        Some("tenant_quota_exceeded")
    );
    fleet.ticks(10);
    assert!(fleet.vms.iter().all(|(_, a)| a.in_fallback()));
    let leader = fleet.leaders()[0];
    let entered = fleet.logs_containing("fallback local_limit applies");
    assert_eq!(
        entered.iter().filter(|(_, l)| *l == LogLevel::Warn).count(),
        1,
        "{entered:?}"
    );
    assert_eq!(
        entered
            .iter()
            .find(|(_, l)| *l == LogLevel::Warn)
            .unwrap()
            .0,
        leader
    );
    assert_eq!(fleet.metric(Gauge::FallbackActive.name()), Some(1));
    assert_eq!(fleet.metric(Counter::FallbackEntered.name()), Some(1));
    assert!(fleet.metric(Gauge::DirectiveAgeMs.name()).unwrap() > 1_000);
    // 40 rps share over 4 proxies: 10 rps for this proxy, held by one
    // worker so far; a second's burst, then nothing within the tick.
    let (rejected, response) = fleet.cell_decisions(leader, acme, 30);
    assert_eq!(rejected, 20);
    let response = response.unwrap();
    assert_eq!(
        response.header("x-ratelimit-reason"),
        Some("local_fallback_limit")
    );
    assert_eq!(response.header("x-ratelimit-limit"), Some("40"));
    // An empty heartbeat makes the table fresh again.
    fleet.push_batch(batch(vec![]));
    fleet.tick();
    assert!(fleet.vms.iter().all(|(_, a)| !a.in_fallback()));
    assert_eq!(fleet.metric(Gauge::FallbackActive.name()), Some(0));
    assert_eq!(fleet.metric(Gauge::DirectiveAgeMs.name()), Some(TICK_MS));
    assert_eq!(fleet.logs_containing("leaving the fallback").len(), 2);
    assert_eq!(fleet.cell_decisions(0, acme, 10).0, 10);
}

#[test]
fn other_fallbacks_keep_the_last_directive_or_allow() {
    let acme = ("api", "acme", Priority::Unspecified);
    let mut keep = fallback_fleet(Fallback::KeepLast);
    keep.ticks(12);
    assert!(keep.vms[0].1.in_fallback());
    assert_eq!(keep.cell_decisions(0, acme, 10).0, 10);
    let mut allow = fallback_fleet(Fallback::Allow);
    allow.ticks(12);
    assert_eq!(allow.cell_decisions(0, acme, 10).0, 0);
}

#[test]
fn the_batch_ttl_overrides_the_configured_one() {
    let mut fleet = fallback_fleet(Fallback::Allow);
    fleet.push_batch(DirectiveBatch {
        ttl_ms: 5_000,
        ..batch(vec![])
    });
    fleet.ticks(20);
    assert!(!fleet.vms[0].1.in_fallback());
    let meta = DirectivesMeta::decode(
        &fleet
            .process
            .borrow()
            .get(DIRECTIVES_META_KEY)
            .unwrap()
            .bytes,
    )
    .unwrap();
    assert_eq!(meta.ttl_ms, 5_000);
    fleet.ticks(40);
    assert!(fleet.vms[0].1.in_fallback());
}

#[test]
fn new_buckets_get_the_configured_local_limit_until_directed() {
    let mut fleet = Fleet::with_settings(
        1,
        AgentSettings {
            new_bucket: NewBucketPolicy::LocalLimit {
                fleet_limit_rps: 20.0,
                expected_proxies: 2,
            },
            ..settings()
        },
    );
    fleet.ticks(2);
    let fresh = ("fresh", "t", Priority::Bulk);
    // 10 rps for this proxy: a second's burst, then nothing in the tick.
    let (rejected, response) = fleet.cell_decisions(0, fresh, 25);
    assert_eq!(rejected, 15);
    let response = response.unwrap();
    assert_eq!(
        response.header("x-ratelimit-reason"),
        Some("new_bucket_limit")
    );
    assert_eq!(response.header("x-ratelimit-limit"), Some("20"));
    fleet.tick();
    assert_eq!(
        fleet.metric(Counter::DecisionsDrop(DropReason::NewBucketLimit).name()),
        Some(15)
    );
    // Once the control plane directs the bucket, its directive rules.
    fleet.push_batch(batch(vec![cell("fresh", "", Priority::Unspecified, 0.0)]));
    assert_eq!(fleet.cell_decisions(0, fresh, 50).0, 0);
}

#[test]
fn new_buckets_are_allowed_by_default() {
    let mut fleet = Fleet::new(1);
    fleet.ticks(2);
    assert_eq!(
        fleet.cell_decisions(0, ("x", "", Priority::Bulk), 1000).0,
        0
    );
}

/// Followers tick out of phase with the leader's report window; steady
/// traffic must still give steady reports (the control plane divides
/// each report's counts by its window).
#[test]
fn reports_of_steady_load_are_steady_whatever_the_tick_phases() {
    let mut fleet = Fleet::new(3);
    fleet.ticks(2);
    let (token, leader) = fleet.the_stream();
    let followers: Vec<usize> = (0..3).filter(|vm| *vm != leader).collect();
    // Timers drift: followers tick every 97 and 104 ms, the leader
    // every 100 ms, so a window holds two to four hand-offs.
    let periods = [97u64, 104];
    let start = fleet.now_ms;
    for ms in 1..6_000u64 {
        let now = start + ms;
        if ms % 100 == 0 {
            fleet.tick_vm_at(leader, now);
        }
        for (follower, period) in followers.iter().zip(periods) {
            if ms % period == 0 {
                // 6 requests per 10 ms: 600 rps per follower.
                fleet.admit_n(*follower, "steady", (6 * period / 10) as usize);
                fleet.tick_vm_at(*follower, now);
            }
        }
    }
    let reports = fleet.reports(token);
    assert!(reports.len() >= 15, "{} reports", reports.len());
    for report in reports.iter().skip(2) {
        let offered: u64 = report.buckets.iter().map(|c| c.offered).sum();
        let rate = offered as f64 * 1000.0 / report.window_ms as f64;
        assert!(
            (rate - 1200.0).abs() < 1200.0 * 0.03,
            "rate {rate} in {report:?}"
        );
    }
    assert_eq!(fleet.vms[leader].1.workers(), 2);
    // Followers learn the worker count on their slow tick.
    assert!(followers.iter().all(|f| fleet.vms[*f].1.workers() == 2));
}

/// Offers `per_tick` requests of a cell to `vm` for `ticks` ticks of every
/// VM; returns how many were admitted.
fn offer(fleet: &mut Fleet, vm: usize, tenant: &str, per_tick: usize, ticks: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..ticks {
        fleet.tick();
        let (rejected, _) =
            fleet.cell_decisions(vm, ("acme", tenant, Priority::Unspecified), per_tick);
        admitted += per_tick - rejected;
    }
    admitted
}

#[test]
fn every_vm_caps_a_cell_it_meets_after_the_directive() {
    let mut fleet = Fleet::with_settings(2, exact_allowance(Engage::Always));
    fleet.ticks(2);
    // Half of the fleet's 2000 rps is shed; the directive is bucket-wide.
    fleet.push_batch(batch(vec![Directive {
        limit_rps: Some(1_000.0),
        offered_rps: 2_000.0,
        ..cell("acme", "", Priority::Unspecified, 0.5)
    }]));
    fleet.tick();
    // Neither VM had seen the cells: one meets the bucket-wide cell, the
    // other a tenant's cell the bucket-wide directive governs. Each is
    // offered 200 rps for a second (its window fills and its cap freezes
    // at half of that), then 800 rps before any new directive arrives.
    for (vm, tenant) in [(0, ""), (1, "tenant-1")] {
        offer(&mut fleet, vm, tenant, 20, 10);
        let admitted = offer(&mut fleet, vm, tenant, 80, 10);
        // The drop ratio alone would admit about 400.
        assert!(
            (85..=115).contains(&admitted),
            "vm {vm} tenant {tenant:?}: {admitted}"
        );
    }
}

#[test]
fn decisions_without_fresh_directives_say_so() {
    use sluice_core::decision::Source;
    let mut fleet = Fleet::with_settings(
        1,
        AgentSettings {
            new_bucket: NewBucketPolicy::LocalLimit {
                fleet_limit_rps: 1_000.0,
                expected_proxies: 1,
            },
            ..settings()
        },
    );
    fleet.ticks(2);
    let last = |fleet: &mut Fleet, bucket: &str| {
        fleet.vms[0].1.admit_cell(bucket, "", Priority::Unspecified);
        *fleet.vms[0].1.last_decision()
    };
    assert_eq!(last(&mut fleet, "acme").source, Source::NoDirectives);
    fleet.push_batch(DirectiveBatch {
        version: 7,
        ..batch(vec![cell("acme", "", Priority::Unspecified, 0.5)])
    });
    fleet.tick();
    let directed = last(&mut fleet, "acme");
    assert_eq!(directed.source, Source::Directive);
    assert_eq!(directed.drop_ratio, 0.5);
    assert_eq!(fleet.vms[0].1.path.table.version, 7);
    let record = fleet.vms[0].1.last_record().to_owned();
    assert!(record.contains("bucket=acme "), "{record}");
    assert!(record.contains(" version=7 "), "{record}");
    assert!(record.ends_with(" source=directive"), "{record}");
    // A cell the control plane has not directed yet is new …
    assert_eq!(last(&mut fleet, "other").source, Source::NewBucket);
    // … until it had time to: then it is known to need no directive.
    fleet.ticks(60);
    fleet.push_batch(DirectiveBatch {
        version: 8,
        ..batch(vec![])
    });
    fleet.tick();
    assert_eq!(last(&mut fleet, "other").source, Source::Directive);
}

#[test]
fn a_stale_table_flags_its_decisions_as_fallback() {
    use sluice_core::decision::Source;
    let mut fleet = fallback_fleet(Fallback::KeepLast);
    fleet.ticks(12);
    assert!(fleet.vms[0].1.in_fallback());
    fleet.vms[0]
        .1
        .admit_cell("api", "acme", Priority::Unspecified);
    let last = *fleet.vms[0].1.last_decision();
    assert_eq!(last.source, Source::Fallback);
    assert_eq!(last.outcome, sluice_core::decision::Outcome::Dropped);
}

#[test]
fn a_closed_stream_engages_allowances_that_wait_for_it_on_every_vm() {
    let mut fleet = Fleet::with_settings(
        2,
        AgentSettings {
            allowance: Some(sluice_core::allowance::AllowanceSettings {
                engage: sluice_core::allowance::Engage::WhenLost,
                ..Default::default()
            }),
            ..settings()
        },
    );
    fleet.ticks(2);
    fleet.push_batch(batch(vec![cell("api", "", Priority::Unspecified, 0.5)]));
    fleet.tick();
    assert!(
        fleet
            .vms
            .iter()
            .all(|(_, vm)| !vm.path.pacer.caps_engaged())
    );
    fleet.server_closes(14);
    fleet.tick();
    assert!(fleet.vms.iter().all(|(_, vm)| vm.path.pacer.caps_engaged()));
    // The next batch (after the reconnect) disengages them again.
    fleet.ticks(40);
    fleet.push_batch(batch(vec![]));
    fleet.tick();
    assert!(
        fleet
            .vms
            .iter()
            .all(|(_, vm)| !vm.path.pacer.caps_engaged())
    );
}

#[test]
fn a_silent_control_plane_engages_them_after_a_while() {
    let mut fleet = Fleet::with_settings(
        1,
        AgentSettings {
            allowance: Some(sluice_core::allowance::AllowanceSettings {
                engage: sluice_core::allowance::Engage::WhenLost,
                ..Default::default()
            }),
            ..settings()
        },
    );
    fleet.ticks(2);
    fleet.push_batch(batch(vec![]));
    fleet.ticks(24);
    assert!(!fleet.vms[0].1.path.pacer.caps_engaged());
    fleet.ticks(2);
    assert!(fleet.vms[0].1.path.pacer.caps_engaged());
}

/// Two serving VMs (a third leads and serves nothing, like a main-thread
/// VM) share a cell at 100 rps each; the directive halves it; then the
/// control plane is lost. Returns the fleet and the serving VMs.
fn lost_with_two_workers() -> (Fleet, Vec<usize>) {
    let (mut fleet, workers) = connected_with_two_workers();
    fleet.server_closes(14);
    (fleet, workers)
}

/// [`lost_with_two_workers`] before the loss.
fn connected_with_two_workers() -> (Fleet, Vec<usize>) {
    let mut fleet = Fleet::with_settings(3, exact_allowance(Engage::WhenLost));
    fleet.ticks(2);
    let (_, leader) = fleet.the_stream();
    let workers: Vec<usize> = (0..3).filter(|vm| *vm != leader).collect();
    let acme = ("acme", "", Priority::Unspecified);
    for _ in 0..15 {
        fleet.tick();
        for worker in &workers {
            fleet.cell_decisions(*worker, acme, 10);
        }
    }
    // The control plane pushes while the ratio settles: the caps rest on
    // the VMs' rates over the last second once the second batch arrives.
    for (version, ratio) in [(1, 0.49), (2, 0.5)] {
        fleet.push_batch(DirectiveBatch {
            version,
            ..batch(vec![Directive {
                offered_rps: 200.0,
                ..cell("acme", "", Priority::Unspecified, ratio)
            }])
        });
        for _ in 0..15 {
            fleet.tick();
            for worker in &workers {
                fleet.cell_decisions(*worker, acme, 10);
            }
        }
    }
    (fleet, workers)
}

#[test]
fn a_loss_freezes_the_budget_of_the_last_heartbeat_not_of_the_last_directive() {
    let (mut fleet, workers) = connected_with_two_workers();
    // The load halves; the ratio does not move, so the control plane
    // pushes nothing new, only heartbeats.
    let acme = ("acme", "", Priority::Unspecified);
    for version in 3..6 {
        for _ in 0..10 {
            fleet.tick();
            for worker in &workers {
                fleet.cell_decisions(*worker, acme, 5);
            }
        }
        fleet.push_batch(DirectiveBatch {
            version,
            ..batch(vec![])
        });
    }
    fleet.tick();
    for worker in &workers {
        fleet.cell_decisions(*worker, acme, 5);
    }
    fleet.server_closes(14);
    // A surge after the loss: the process is held at what the ratio
    // admitted at the last heartbeat (half of 100 rps), not at the last
    // directive's (half of 200 rps).
    let rate = admitted_per_second(&mut fleet, &workers, &[30, 30], 60, 20);
    assert!((45.0..=55.0).contains(&rate), "{rate} rps");
}

#[test]
fn the_first_batch_after_an_outage_gives_caps_that_always_decide_its_budget() {
    // Two serving VMs beside a leader that serves nothing, and one VM that
    // leads and serves (one worker): each applies the batch its own way.
    for vms in [3, 1] {
        let rates = first_batch_after_an_outage(vms);
        assert!((90.0..=110.0).contains(&rates[0]), "{vms} VMs: {rates:?}");
        assert!((140.0..=160.0).contains(&rates[1]), "{vms} VMs: {rates:?}");
    }
}

/// The process's admitted rate before an outage (directive: 100 rps of
/// 200 offered) and after it, when the first batch raises the limit to
/// 150, with caps that always decide.
fn first_batch_after_an_outage(vms: usize) -> [f64; 2] {
    let mut fleet = Fleet::with_settings(vms, exact_allowance(Engage::Always));
    fleet.ticks(2);
    let (_, leader) = fleet.the_stream();
    let workers: Vec<usize> = (0..vms).filter(|vm| vms == 1 || *vm != leader).collect();
    let load: Vec<usize> = workers.iter().map(|_| 20 / workers.len()).collect();
    let acme = ("acme", "", Priority::Unspecified);
    let directive = |version, drop_ratio, limit_rps| DirectiveBatch {
        version,
        ..batch(vec![Directive {
            offered_rps: 200.0,
            limit_rps,
            ..cell("acme", "", Priority::Unspecified, drop_ratio)
        }])
    };
    for _ in 0..15 {
        fleet.tick();
        for (worker, per_tick) in workers.iter().zip(&load) {
            fleet.cell_decisions(*worker, acme, *per_tick);
        }
    }
    fleet.push_batch(directive(1, 0.5, Some(100.0)));
    let before = admitted_per_second(&mut fleet, &workers, &load, 30, 20);
    // The control plane goes away and the budget is frozen at 100 rps.
    fleet.server_closes(14);
    admitted_per_second(&mut fleet, &workers, &load, 40, 20);
    // Back with a limit raised during the outage: the first batch says
    // so, and the caps follow it, not the outage's budget.
    fleet.push_batch(DirectiveBatch {
        epoch: 2,
        ..directive(1, 0.25, Some(150.0))
    });
    let after = admitted_per_second(&mut fleet, &workers, &load, 30, 20);
    [before, after]
}

/// Agent settings whose caps have no headroom and no burst beyond a tick,
/// engaged as `engage` says.
fn exact_allowance(engage: Engage) -> AgentSettings {
    AgentSettings {
        allowance: Some(sluice_core::allowance::AllowanceSettings {
            headroom: 0.0,
            burst_ms: 0,
            engage,
        }),
        ..settings()
    }
}

/// Admitted per second over the last `measure` of `ticks` ticks, with
/// `load[i]` requests per tick offered to `workers[i]`.
fn admitted_per_second(
    fleet: &mut Fleet,
    workers: &[usize],
    load: &[usize],
    ticks: usize,
    measure: usize,
) -> f64 {
    let acme = ("acme", "", Priority::Unspecified);
    let mut admitted = 0;
    for tick in 0..ticks {
        fleet.tick();
        for (worker, per_tick) in workers.iter().zip(load) {
            let (rejected, _) = fleet.cell_decisions(*worker, acme, *per_tick);
            if tick >= ticks - measure {
                admitted += per_tick - rejected;
            }
        }
    }
    admitted as f64 * 10.0 / measure as f64
}

/// Token costs a request draws from, uniformly: a mean of 750.
const COSTS: [u64; 4] = [100, 2_000, 300, 600];

/// Offers each worker four requests of [`COSTS`] drawn by `rng` per tick,
/// 30,000 tokens a second, for `ticks` ticks under a token budget; the
/// tokens admitted per second over the last `measure`.
fn tokens_admitted_per_second(
    fleet: &mut Fleet,
    workers: &[usize],
    (ticks, measure): (usize, usize),
    rng: &mut SmallRng,
) -> f64 {
    let acme = ("acme", "", Priority::Unspecified);
    let mut admitted = 0;
    for tick in 0..ticks {
        fleet.tick();
        for worker in workers {
            for _ in 0..COSTS.len() {
                let cost = COSTS[(rng.next_u64() % COSTS.len() as u64) as usize];
                let agent = &mut fleet.vms[*worker].1;
                if agent.admit_cell_costing(acme, cost).outcome != Outcome::Dropped
                    && tick >= ticks - measure
                {
                    admitted += cost;
                }
            }
        }
    }
    admitted as f64 * 10.0 / measure as f64
}

#[test]
fn while_the_control_plane_is_lost_a_token_budget_holds_in_tokens() {
    // Two workers offer 60,000 tokens a second (80 requests); the budget
    // is 30,000. The process's budget frozen at the loss must be in
    // tokens, and a request's debt must outlive the caps' rescaling at
    // every tick: counted in requests, the budget was 40 "tokens" a
    // second, and cut to one token at each rescale, a debt of 2,000
    // tokens let about a request a tick through.
    let mut rng = SmallRng::seed_from_u64(37);
    let mut fleet = Fleet::with_settings(3, exact_allowance(Engage::WhenLost));
    fleet.ticks(2);
    let (_, leader) = fleet.the_stream();
    let workers: Vec<usize> = (0..3).filter(|vm| *vm != leader).collect();
    tokens_admitted_per_second(&mut fleet, &workers, (15, 10), &mut rng);
    for (version, ratio) in [(1, 0.49), (2, 0.5)] {
        fleet.push_batch(DirectiveBatch {
            version,
            ..batch(vec![Directive {
                limit_rps: Some(30_000.0),
                offered_rps: 60_000.0,
                cost_unit: "tokens".into(),
                budget_period_s: 1,
                ..cell("acme", "", Priority::Unspecified, ratio)
            }])
        });
        tokens_admitted_per_second(&mut fleet, &workers, (15, 10), &mut rng);
    }
    let connected = tokens_admitted_per_second(&mut fleet, &workers, (50, 50), &mut rng);
    assert!((27_000.0..=33_000.0).contains(&connected), "{connected}");
    fleet.server_closes(14);
    assert!(fleet.vms.iter().all(|(_, vm)| vm.path.pacer.caps_engaged()));
    let lost = tokens_admitted_per_second(&mut fleet, &workers, (60, 50), &mut rng);
    assert!((27_000.0..=33_000.0).contains(&lost), "{lost} tokens/s");
}

#[test]
fn a_request_claiming_a_huge_estimate_does_not_shut_its_cell_out() {
    // A budget of 1,000 tokens a second, half of 2,000 offered (requests
    // of 10 tokens) shed by the credit. A client names the largest
    // estimate a cost rule takes (10^9 tokens, in a header) on its
    // request; it weighs one period of the budget, so the honest requests
    // after it are admitted again within about a second. Weighed in full,
    // its debt shut the cell out for days.
    let mut fleet = Fleet::with_settings(
        1,
        AgentSettings {
            decision: DecisionMode::Credit,
            ..settings()
        },
    );
    fleet.ticks(2);
    fleet.push_batch(batch(vec![Directive {
        limit_rps: Some(1_000.0),
        offered_rps: 2_000.0,
        cost_unit: "tokens".into(),
        budget_period_s: 1,
        ..cell("acme", "", Priority::Unspecified, 0.5)
    }]));
    fleet.tick();
    let acme = ("acme", "", Priority::Unspecified);
    let mut admitted = 0;
    for tick in 0..40 {
        fleet.tick();
        let agent = &mut fleet.vms[0].1;
        if tick == 10 {
            // Admitted, it would owe its weight; dropped, it would leave
            // the credit its weight's share to admit: either way bounded.
            agent.admit_cell_costing(acme, 1_000_000_000);
        }
        for _ in 0..20 {
            if agent.admit_cell_costing(acme, 10).outcome != Outcome::Dropped && tick >= 20 {
                admitted += 10;
            }
        }
    }
    // The last 2 s: the credit's half of 2,000 tokens a second.
    assert!((1_800..=2_200).contains(&admitted), "{admitted} tokens");
}

#[test]
fn while_the_control_plane_is_lost_caps_follow_load_moving_between_workers() {
    let (mut fleet, workers) = lost_with_two_workers();
    // All of the load moves to one worker: its cap, frozen at its old
    // share, would admit 50 rps; the process admitted 100 at the last
    // directive.
    let rate = admitted_per_second(&mut fleet, &workers, &[20, 0], 60, 20);
    assert!((90.0..=110.0).contains(&rate), "{rate} rps");
}

#[test]
fn while_the_control_plane_is_lost_a_surge_on_every_worker_is_held() {
    let (mut fleet, workers) = lost_with_two_workers();
    // Three times the load on both workers: the shares do not move, and
    // the caps hold the process at what it admitted.
    let rate = admitted_per_second(&mut fleet, &workers, &[30, 30], 60, 20);
    assert!((90.0..=110.0).contains(&rate), "{rate} rps");
}

#[test]
fn a_proxy_the_control_plane_counted_in_part_applies_its_own_ratio_on_every_vm() {
    use sluice_proto::v1::CountedProxy;
    let mut fleet = Fleet::new(2);
    fleet.ticks(2);
    let listed = |proxy_id: &str| CountedProxy {
        proxy_id: proxy_id.into(),
        counted_fraction: 0.5,
    };
    fleet.push_batch(batch(vec![
        Directive {
            counted_proxies: vec![listed("envoy-a")],
            ..cell("hot", "", Priority::Unspecified, 0.5)
        },
        Directive {
            counted_proxies: vec![listed("envoy-b")],
            ..cell("other", "", Priority::Unspecified, 0.5)
        },
    ]));
    fleet.ticks(1);
    for (_, agent) in &fleet.vms {
        // Half of this proxy's rate counted: it admits half of what the
        // ratio admits, 0.25 instead of 0.5.
        let hot = agent.path.directives.drop_ratio("hot").unwrap().get();
        assert!((hot - 0.75).abs() < 1e-12, "{hot}");
        // Another proxy's entry: the ratio as sent.
        assert_eq!(
            agent.path.directives.drop_ratio("other").unwrap().get(),
            0.5
        );
    }
}

/// A blocked bucket's standing directive: bucket-wide, limit 0, drop all.
fn standing_block(bucket: &str) -> Directive {
    Directive {
        limit_rps: Some(0.0),
        reason: Reason::ClusterOverload as i32,
        ..cell(bucket, "", Priority::Unspecified, 1.0)
    }
}

#[test]
fn a_blocked_buckets_standing_block_refuses_cells_never_seen_in_every_regime() {
    // New tenant names and priorities in a blocked bucket have no
    // directive of their own: the bucket-wide block must refuse their
    // first request, whatever the regime, where `new_bucket: allow` would
    // let them through.
    // Eight names never seen before, each offered a request on each of
    // three ticks (so the ones met first have their pacing state, and
    // their caps, by the second); how many of the 24 were refused.
    let fresh_names = |fleet: &mut Fleet, round: usize| {
        let mut refused = 0;
        for _ in 0..3 {
            for i in 0..8 {
                let tenant = format!("org-{round}-{i}");
                let priority = if i % 2 == 0 {
                    Priority::Unspecified
                } else {
                    Priority::Bulk
                };
                refused += fleet
                    .cell_decisions(i % 2, ("shut", &tenant, priority), 1)
                    .0;
            }
            fleet.tick();
        }
        refused
    };
    let regimes = [
        (Fallback::LocalLimit, settings()),
        (Fallback::KeepLast, settings()),
        (Fallback::LocalLimit, exact_allowance(Engage::WhenLost)),
        (Fallback::LocalLimit, exact_allowance(Engage::Always)),
    ];
    for (fallback, base) in regimes {
        let label = format!("{fallback:?} {:?}", base.allowance.map(|a| a.engage));
        let mut fleet = Fleet::with_settings(
            2,
            AgentSettings {
                directive_ttl: DirectiveTtl::from_millis(1_000).unwrap(),
                fallback,
                ..base
            },
        );
        fleet.ticks(2);
        fleet.push_batch(batch(vec![standing_block("shut")]));
        fleet.tick();
        assert_eq!(fresh_names(&mut fleet, 0), 24, "connected, {label}");
        // The control plane goes away: the stream closes (the outage
        // allowance engages), then the table ages past its TTL.
        fleet.server_closes(14);
        assert!(fleet.vms.iter().all(|(_, a)| !a.in_fallback()), "{label}");
        assert_eq!(fresh_names(&mut fleet, 1), 24, "lost, {label}");
        fleet.ticks(12);
        assert!(fleet.vms.iter().all(|(_, a)| a.in_fallback()), "{label}");
        assert_eq!(fresh_names(&mut fleet, 2), 24, "stale, {label}");
        fleet.ticks(50);
        assert_eq!(fresh_names(&mut fleet, 3), 24, "long stale, {label}");
    }
}
