//! Tests of the controller: fair division, reasons, modes, change
//! detection and the drop policy.

#![allow(clippy::float_cmp)]

use proptest::prelude::*;

use sluice_proto::v1;

use super::retry::MAX_RETRY_AFTER_MS;
use super::*;
use crate::config::limits::{LimitRule, Selector};
use crate::config::policy::{BurstMultiplier, TenantPolicy, Weight};
use crate::control::drop_policy::drop_ratio;
use crate::fleet::BucketLoad;
use sluice_core::directive::is_lift;

fn limit(rps: f64) -> LimitRps {
    LimitRps::new(rps).unwrap()
}

fn load(entries: &[(&str, f64)]) -> FleetLoad {
    FleetLoad::new(
        entries
            .iter()
            .map(|&(bucket, offered_rps)| {
                let load = BucketLoad {
                    offered_rps,
                    admitted_rps: offered_rps / 2.0,
                    proxies_reporting: 1,
                    stale_share: 0.0,
                    requests_rps: 0.0,
                };
                BucketTraffic::single(bucket, load)
            })
            .collect(),
    )
}

fn table(rules: &[(&str, f64)]) -> LimitTable {
    LimitTable::from_rules(
        None,
        rules.iter().map(|&(bucket, rps)| LimitRule {
            selector: Selector::Bucket(bucket.to_owned()),
            limit: limit(rps).into(),
        }),
    )
}

fn buckets(directives: &[Directive]) -> Vec<(&str, f64)> {
    directives
        .iter()
        .map(|d| (d.bucket.as_str(), d.drop_ratio))
        .collect()
}

fn tenant_cell(tenant: &str, priority: Priority, offered_rps: f64) -> CellLoad {
    CellLoad {
        tenant: Arc::from(tenant),
        priority,
        load: BucketLoad {
            offered_rps,
            admitted_rps: offered_rps,
            proxies_reporting: 2,
            stale_share: 0.0,
            requests_rps: 0.0,
        },
        shadow_dropped_rps: 0.0,
        charges: None,
    }
}

fn policy(limit_rps: f64, tenants: &[(&str, f64, f64, f64)]) -> Policy {
    let mut table = Tenants::default();
    for &(name, weight, burst, floor) in tenants {
        table.insert(
            name.to_owned(),
            TenantPolicy {
                weight: Weight::new(weight).unwrap(),
                burst: BurstMultiplier::new(burst).unwrap(),
                min_floor_rps: limit(floor),
            },
        );
    }
    Policy {
        limits: table_for("api", limit_rps),
        tenants: table,
        modes: Modes::default(),
        ..Policy::default()
    }
}

fn table_for(bucket: &str, rps: f64) -> LimitTable {
    table(&[(bucket, rps)])
}

/// The status of `bucket` in `decision`.
fn find_bucket<'a>(decision: &'a IntervalOutcome, bucket: &str) -> &'a BucketStatus {
    decision
        .buckets
        .iter()
        .find(|status| status.bucket.as_ref() == bucket)
        .unwrap_or_else(|| panic!("no status for {bucket}: {decision:?}"))
}

fn find<'a>(directives: &'a [Directive], tenant: &str, priority: Priority) -> &'a Directive {
    directives
        .iter()
        .find(|d| d.tenant == tenant && d.priority == priority.to_wire() as i32)
        .unwrap_or_else(|| panic!("no directive for {tenant} {priority:?}: {directives:?}"))
}

fn admitted(d: &Directive, offered: f64) -> f64 {
    offered * (1.0 - d.drop_ratio)
}

#[test]
fn weighted_tenants_are_admitted_within_five_percent_of_their_fair_share() {
    // Limit 1000, weights 4 / 1 / 0.25. `light` offers 30, under its
    // share, so the other 970 is split 4:1: 776 and 194.
    let policy = policy(
        1000.0,
        &[
            ("gold", 4.0, 2.0, 0.0),
            ("silver", 1.0, 1.0, 0.0),
            ("light", 0.25, 1.0, 0.0),
        ],
    );
    let offered = [("gold", 2000.0), ("silver", 900.0), ("light", 30.0)];
    let load = FleetLoad::new(vec![BucketTraffic::from_cells(
        "api",
        offered
            .iter()
            .map(|&(t, rps)| tenant_cell(t, Priority::Unspecified, rps))
            .collect(),
    )]);
    let mut controller = Controller::default();
    let decision = controller.decide(&load, &policy);
    let fair = [("gold", 776.0), ("silver", 194.0), ("light", 30.0)];
    let mut total = 0.0;
    for ((tenant, offered), (_, fair)) in offered.iter().zip(fair) {
        let d = find(&decision.changed, tenant, Priority::Unspecified);
        let got = admitted(d, *offered);
        assert!(
            (got - fair).abs() <= 0.05 * fair,
            "{tenant}: {got} vs {fair}"
        );
        total += got;
        assert_eq!(d.limit_rps, Some(1000.0));
        assert_eq!(d.reporting_proxies, 2);
    }
    assert!(
        (total - 1000.0).abs() < 1e-6,
        "the limit is used exactly: {total}"
    );
    let gold = find(&decision.changed, "gold", Priority::Unspecified);
    assert!((gold.share_rps - 776.0).abs() < 1e-6);
    assert_eq!(gold.burst, 2.0);
    assert_eq!(gold.reason, v1::Reason::TenantQuotaExceeded as i32);
    assert!(gold.retry_after_ms >= 1_000);
    let light = find(&decision.changed, "light", Priority::Unspecified);
    assert_eq!(light.drop_ratio, 0.0);
    assert_eq!(light.reason, 0);
    assert_eq!(light.retry_after_ms, 0);
    assert!(light.share_rps >= 30.0);

    let api = &decision.buckets[0];
    assert_eq!(api.cells.len(), 3);
    assert_eq!(api.cells[0].tenant.as_ref(), "gold", "sorted by tenant");
    assert_eq!(api.cells[0].reason, Some(Reason::TenantQuotaExceeded));
}

#[test]
fn priorities_shed_bulk_first_with_priority_shed_as_the_reason() {
    let policy = policy(500.0, &[]);
    let load = FleetLoad::new(vec![BucketTraffic::from_cells(
        "api",
        vec![
            tenant_cell("a", Priority::Critical, 300.0),
            tenant_cell("a", Priority::Unspecified, 100.0),
            tenant_cell("b", Priority::BestEffort, 300.0),
            tenant_cell("b", Priority::Bulk, 400.0),
        ],
    )]);
    let mut controller = Controller::default();
    let decision = controller.decide(&load, &policy);
    let critical = find(&decision.changed, "a", Priority::Critical);
    assert_eq!(critical.drop_ratio, 0.0);
    // 200 left for BEST_EFFORT + unclassified (400 offered, equal
    // weights: 100 for `a`, 100 for `b`'s 300); BULK gets nothing.
    let unclassified = find(&decision.changed, "a", Priority::Unspecified);
    assert_eq!(unclassified.drop_ratio, 0.0);
    let best_effort = find(&decision.changed, "b", Priority::BestEffort);
    assert!((admitted(best_effort, 300.0) - 100.0).abs() < 1e-6);
    assert_eq!(best_effort.reason, v1::Reason::TenantQuotaExceeded as i32);
    let bulk = find(&decision.changed, "b", Priority::Bulk);
    assert_eq!(bulk.drop_ratio, 1.0);
    assert_eq!(bulk.reason, v1::Reason::PriorityShed as i32);
    assert_eq!(bulk.share_rps, 0.0);
}

#[test]
fn critical_is_dropped_only_when_nothing_else_covers_the_excess() {
    let policy = policy(100.0, &[]);
    let load = FleetLoad::new(vec![BucketTraffic::from_cells(
        "api",
        vec![
            tenant_cell("", Priority::Critical, 200.0),
            tenant_cell("", Priority::Bulk, 50.0),
        ],
    )]);
    let decision = Controller::default().decide(&load, &policy);
    let critical = find(&decision.changed, "", Priority::Critical);
    assert!((critical.drop_ratio - 0.5).abs() < 1e-12);
    assert_eq!(critical.reason, v1::Reason::ClusterOverload as i32);
    assert_eq!(find(&decision.changed, "", Priority::Bulk).drop_ratio, 1.0);
}

#[test]
fn floors_are_never_dropped() {
    let policy = policy(100.0, &[("small", 0.01, 1.0, 40.0)]);
    let load = FleetLoad::new(vec![BucketTraffic::from_cells(
        "api",
        vec![
            tenant_cell("big", Priority::Unspecified, 1000.0),
            tenant_cell("small", Priority::Bulk, 35.0),
        ],
    )]);
    let decision = Controller::default().decide(&load, &policy);
    assert_eq!(
        find(&decision.changed, "small", Priority::Bulk).drop_ratio,
        0.0
    );
    let big = find(&decision.changed, "big", Priority::Unspecified);
    assert!((admitted(big, 1000.0) - 65.0).abs() < 1e-6);
}

#[test]
fn floors_above_the_limit_win_visibly_and_admit_nothing_beyond_them() {
    // Limit 100; `a` and `b` are promised 80 each, `c` nothing. The floors
    // of what they offer (80 + 60) exceed the limit by 40.
    let mut policy = policy(
        100.0,
        &[
            ("a", 1.0, 1.0, 80.0),
            ("b", 1.0, 1.0, 80.0),
            ("c", 4.0, 1.0, 0.0),
        ],
    );
    let offered = [("a", 100.0), ("b", 60.0), ("c", 50.0)];
    let load = FleetLoad::new(vec![BucketTraffic::from_cells(
        "api",
        offered
            .iter()
            .map(|&(t, rps)| tenant_cell(t, Priority::Unspecified, rps))
            .collect(),
    )]);
    let mut controller = Controller::default();
    let decision = controller.decide(&load, &policy);
    assert!(decision.buckets[0].floors_exceed_limit, "flagged");
    let admitted_rps: Vec<f64> = offered
        .iter()
        .map(|&(t, rps)| admitted(find(&decision.changed, t, Priority::Unspecified), rps))
        .collect();
    // Each tenant gets min(offered, floor) and nothing beyond it, whatever
    // its weight; the bucket admits the limit plus the floors' excess.
    assert!((admitted_rps[0] - 80.0).abs() < 1e-6, "{admitted_rps:?}");
    assert!((admitted_rps[1] - 60.0).abs() < 1e-6, "{admitted_rps:?}");
    assert!(admitted_rps[2].abs() < 1e-6, "{admitted_rps:?}");
    let total: f64 = admitted_rps.iter().sum();
    assert!((total - (100.0 + 40.0)).abs() < 1e-6, "{total}");

    // Floors that fit: no flag, and the limit holds exactly again.
    for tenant in ["a", "b"] {
        policy.tenants.insert(
            tenant.into(),
            TenantPolicy {
                min_floor_rps: limit(30.0),
                ..TenantPolicy::default()
            },
        );
    }
    let decision = controller.decide(&load, &policy);
    assert!(!decision.buckets[0].floors_exceed_limit);
    let total: f64 = offered
        .iter()
        .map(|&(t, rps)| admitted(find(&controller.snapshot(), t, Priority::Unspecified), rps))
        .sum();
    assert!((total - 100.0).abs() < 1e-6, "{total}");
}

#[test]
fn a_floor_on_default_is_shared_by_the_names_clients_invent() {
    // `min_floor_rps: 5` on `default`, limit 10, and 20 tenant names no
    // one configured at 3 rps each: with a floor per name the bucket
    // admitted 60. `gold`, configured, keeps its own floor.
    let policy = policy(10.0, &[("default", 1.0, 1.0, 5.0), ("gold", 1.0, 1.0, 2.0)]);
    let names: Vec<String> = (0..20).map(|i| format!("org-{i:02}")).collect();
    let mut cells: Vec<CellLoad> = names
        .iter()
        .map(|t| tenant_cell(t, Priority::Unspecified, 3.0))
        .collect();
    cells.push(tenant_cell("gold", Priority::Unspecified, 3.0));
    cells.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    let load = FleetLoad::new(vec![BucketTraffic::from_cells("api", cells)]);
    let mut controller = Controller::default();
    let decision = controller.decide(&load, &policy);
    assert!(!decision.buckets[0].floors_exceed_limit);
    let invented: f64 = names
        .iter()
        .map(|t| admitted(find(&decision.changed, t, Priority::Unspecified), 3.0))
        .sum();
    let gold = admitted(find(&decision.changed, "gold", Priority::Unspecified), 3.0);
    assert!((invented + gold - 10.0).abs() < 1e-6, "{invented} + {gold}");
    assert!(gold >= 2.0 - 1e-9, "gold keeps its floor: {gold}");
}

/// What a proxy holds after every batch so far, as the publisher applies
/// a decision: `changed` in order (a lift removes), then `retired`.
#[derive(Default)]
struct Pushed(std::collections::BTreeMap<(String, String, i32), Directive>);

impl Pushed {
    fn apply(&mut self, decision: &IntervalOutcome) {
        for d in &decision.changed {
            let key = (d.bucket.clone(), d.tenant.clone(), d.priority);
            if is_lift(d) {
                self.0.remove(&key);
            } else {
                self.0.insert(key, d.clone());
            }
        }
        for cell in &decision.retired {
            self.0.remove(&(
                cell.bucket.to_string(),
                cell.tenant.to_string(),
                cell.priority.to_wire() as i32,
            ));
        }
    }

    /// The bucket-wide directive of `bucket`, if the proxy holds one.
    fn wide(&self, bucket: &str) -> Option<&Directive> {
        self.0.get(&(bucket.to_owned(), String::new(), 0))
    }

    fn matches_snapshot(&self, controller: &Controller) {
        let snapshot: Vec<Directive> = controller.snapshot();
        let held: Vec<&Directive> = self.0.values().collect();
        assert_eq!(
            held,
            snapshot.iter().collect::<Vec<_>>(),
            "what was pushed is not what a new stream gets"
        );
    }
}

fn is_block(d: &Directive) -> bool {
    d.drop_ratio == 1.0 && d.limit_rps == Some(0.0) && d.share_rps == 0.0
}

#[test]
fn a_blocked_bucket_keeps_a_standing_block_for_cells_not_seen_yet() {
    // A cell the filters meet first (a new tenant name) finds no directive
    // of its own: the bucket-wide one must block it, traffic or not.
    let rule = |selector, rps| LimitRule {
        selector,
        limit: limit(rps).into(),
    };
    let limits = |shut: f64| {
        LimitTable::from_rules(
            None,
            [
                rule(Selector::Bucket("shut".into()), shut),
                rule(Selector::Bucket("open".into()), 10.0),
                rule(Selector::Pattern("free-*".into()), 0.0),
                rule(Selector::AggregatePattern("bulk-*".into()), 0.0),
            ],
        )
    };
    let mut policy = policy(10.0, &[("gold", 1.0, 1.0, 5.0), ("default", 1.0, 1.0, 5.0)]);
    policy.limits = limits(0.0);
    let mut controller = Controller::default();
    let mut proxy = Pushed::default();

    // No traffic yet: the exact key and the aggregate pattern are blocked.
    let decision = controller.decide(&FleetLoad::default(), &policy);
    proxy.apply(&decision);
    proxy.matches_snapshot(&controller);
    assert!(proxy.wide("shut").is_some_and(is_block), "{decision:?}");
    assert!(proxy.wide("bulk-*").is_some_and(is_block), "{decision:?}");
    assert_eq!(proxy.0.len(), 2, "{:?}", proxy.0);
    // Unchanged: nothing is pushed again.
    assert!(
        controller
            .decide(&FleetLoad::default(), &policy)
            .changed
            .is_empty()
    );

    // Traffic: tenants of the blocked bucket (floors included, its own and
    // the shared one on `default`) are all dropped; its bucket-wide cell
    // keeps the standing block; a pattern's member gets one of its own.
    let shut = |wide: f64| {
        let mut cells = vec![
            tenant_cell("gold", Priority::Unspecified, 3.0),
            tenant_cell("org-1", Priority::Bulk, 3.0),
        ];
        if wide > 0.0 {
            cells.push(tenant_cell("", Priority::Unspecified, wide));
        }
        BucketTraffic::from_cells("shut", cells)
    };
    let free = || {
        BucketTraffic::from_cells(
            "free-x",
            vec![tenant_cell("gold", Priority::Unspecified, 3.0)],
        )
    };
    let busy = FleetLoad::new(vec![free(), shut(4.0)]);
    let decision = controller.decide(&busy, &policy);
    proxy.apply(&decision);
    proxy.matches_snapshot(&controller);
    assert!(
        !decision
            .changed
            .iter()
            .any(|d| d.bucket == "shut" && d.tenant.is_empty()),
        "the standing block is the bucket-wide cell's directive: {decision:?}"
    );
    for (bucket, tenant, priority) in [
        ("shut", "gold", Priority::Unspecified),
        ("shut", "org-1", Priority::Bulk),
        ("free-x", "gold", Priority::Unspecified),
    ] {
        let held = proxy
            .0
            .get(&(bucket.into(), tenant.into(), priority.to_wire() as i32))
            .unwrap_or_else(|| panic!("{bucket} {tenant}: {:?}", proxy.0));
        assert!(is_block(held), "{held:?}");
    }
    assert!(proxy.wide("free-x").is_some_and(is_block));
    let status = decision
        .buckets
        .iter()
        .find(|b| &*b.bucket == "shut")
        .unwrap();
    assert!(!status.floors_exceed_limit);

    // The bucket-wide cell stops: its retirement must not take the
    // standing block out of what a new stream gets. The pattern's member
    // keeps its block while it has traffic.
    let decision = controller.decide(&FleetLoad::new(vec![free(), shut(0.0)]), &policy);
    proxy.apply(&decision);
    proxy.matches_snapshot(&controller);
    assert!(proxy.wide("shut").is_some_and(is_block));
    assert!(proxy.wide("free-x").is_some_and(is_block));

    // A mode for a blocked bucket travels with its standing block.
    policy.modes.buckets.insert("shut".into(), Mode::Shadow);
    let decision = controller.decide(&FleetLoad::new(vec![free(), shut(0.0)]), &policy);
    proxy.apply(&decision);
    proxy.matches_snapshot(&controller);
    assert_eq!(
        proxy.wide("shut").map(|d| d.mode),
        Some(v1::Mode::Shadow as i32)
    );
    policy.modes.buckets.clear();

    // All traffic stops: once its cells have been quiet for the hold, the
    // pattern's member is forgotten, the exact key keeps its block.
    for _ in 0..quiet_intervals() {
        let decision = controller.decide(&FleetLoad::default(), &policy);
        proxy.apply(&decision);
        proxy.matches_snapshot(&controller);
    }
    assert!(proxy.wide("free-x").is_none());
    assert!(proxy.wide("shut").is_some_and(is_block));
    assert_eq!(proxy.0.len(), 2, "{:?}", proxy.0);

    // Unblocked while its bucket-wide cell has traffic: that cell's own
    // directive replaces the block (and is not lifted after it).
    policy.limits = limits(5.0);
    let decision = controller.decide(&FleetLoad::new(vec![shut(4.0)]), &policy);
    proxy.apply(&decision);
    proxy.matches_snapshot(&controller);
    let wide = proxy.wide("shut").unwrap();
    assert_eq!(wide.limit_rps, Some(5.0));
    assert!(wide.drop_ratio < 1.0, "{wide:?}");

    // Blocked again, then unblocked without traffic: lifted.
    policy.limits = limits(0.0);
    proxy.apply(&controller.decide(&FleetLoad::default(), &policy));
    proxy.matches_snapshot(&controller);
    assert!(proxy.wide("shut").is_some_and(is_block));
    policy.limits = limits(7.0);
    proxy.apply(&controller.decide(&FleetLoad::default(), &policy));
    proxy.matches_snapshot(&controller);
    assert!(proxy.wide("shut").is_none());
    assert!(proxy.wide("bulk-*").is_some_and(is_block));
}

#[test]
fn a_bucket_mode_reaches_its_directives_and_a_mode_change_is_pushed() {
    let mut policy = policy(100.0, &[]);
    let load = load(&[("api", 50.0)]);
    let mut controller = Controller::default();
    let first = controller.decide(&load, &policy);
    assert_eq!(
        first.changed[0].mode,
        v1::Mode::Unspecified as i32,
        "inherits"
    );
    policy.modes.buckets.insert("api".into(), Mode::Shadow);
    let decision = controller.decide(&load, &policy);
    assert_eq!(decision.changed.len(), 1);
    assert_eq!(decision.changed[0].mode, v1::Mode::Shadow as i32);
    assert!(controller.decide(&load, &policy).changed.is_empty());
}

#[test]
fn share_reason_and_burst_changes_are_pushed() {
    let mut policy = policy(1000.0, &[("gold", 1.0, 1.0, 0.0)]);
    let two = |gold: f64, other: f64| {
        FleetLoad::new(vec![BucketTraffic::from_cells(
            "api",
            vec![
                tenant_cell("gold", Priority::Unspecified, gold),
                tenant_cell("other", Priority::Unspecified, other),
            ],
        )])
    };
    let mut controller = Controller::default();
    controller.decide(&two(800.0, 100.0), &policy);
    // Still under the limit, but `other` takes more: gold's share (what
    // it may send) shrinks, although no ratio moves.
    let decision = controller.decide(&two(800.0, 150.0), &policy);
    let gold = find(&decision.changed, "gold", Priority::Unspecified);
    assert_eq!(gold.drop_ratio, 0.0);
    assert!((gold.share_rps - 850.0).abs() < 1e-6);
    policy.tenants.insert(
        "gold".into(),
        TenantPolicy {
            burst: BurstMultiplier::new(3.0).unwrap(),
            ..TenantPolicy::default()
        },
    );
    let decision = controller.decide(&two(800.0, 150.0), &policy);
    assert_eq!(decision.changed.len(), 1);
    assert_eq!(decision.changed[0].burst, 3.0);
}

#[test]
fn a_stopped_cell_is_lifted_and_retired_while_its_bucket_stays() {
    let policy = policy(100.0, &[]);
    let mut controller = Controller::default();
    let api = |cells: Vec<CellLoad>| FleetLoad::new(vec![BucketTraffic::from_cells("api", cells)]);
    controller.decide(
        &api(vec![
            tenant_cell("a", Priority::Unspecified, 300.0),
            tenant_cell("b", Priority::Unspecified, 10.0),
        ]),
        &policy,
    );
    let only_b = || api(vec![tenant_cell("b", Priority::Unspecified, 10.0)]);
    // `a` shed: its ratio stands while it is quiet, then it is lifted.
    for _ in 1..quiet_intervals() {
        let decision = controller.decide(&only_b(), &policy);
        assert!(decision.retired.is_empty(), "{decision:?}");
        assert!(
            decision.changed.iter().all(|d| d.tenant != "a"),
            "{decision:?}"
        );
        assert_eq!(controller.snapshot().len(), 2);
    }
    let decision = controller.decide(&only_b(), &policy);
    let lifted = find(&decision.changed, "a", Priority::Unspecified);
    assert!(is_lift(lifted));
    assert_eq!(decision.retired.len(), 1);
    assert_eq!(decision.retired[0].tenant.as_ref(), "a");
    assert_eq!(controller.snapshot().len(), 1);
}

/// Control intervals of the default controller in [`QUIET_HOLD_S`].
fn quiet_intervals() -> usize {
    let interval = ControlInterval::default().as_duration().as_secs_f64();
    (QUIET_HOLD_S / interval).ceil() as usize
}

/// A cell of a few requests an interval often has an interval without
/// one. Lifting its ratio then let the next interval through unshed (a
/// budget's smallest tenant ran far over its share, and at a control
/// interval of 100 ms the whole budget a quarter over).
#[test]
fn a_shedding_cell_keeps_its_ratio_through_a_quiet_interval() {
    let policy = policy(100.0, &[]);
    let mut controller = Controller::default();
    let api = |cells: Vec<CellLoad>| FleetLoad::new(vec![BucketTraffic::from_cells("api", cells)]);
    let both = || {
        api(vec![
            tenant_cell("a", Priority::Unspecified, 100.0),
            tenant_cell("b", Priority::Unspecified, 100.0),
        ])
    };
    controller.decide(&both(), &policy);
    controller.decide(&both(), &policy);
    let before = controller.snapshot();
    assert!(before.iter().all(|d| d.drop_ratio > 0.0), "{before:?}");
    // `b` offers nothing for an interval, then comes back.
    let quiet = controller.decide(
        &api(vec![tenant_cell("a", Priority::Unspecified, 100.0)]),
        &policy,
    );
    assert!(quiet.retired.is_empty(), "{quiet:?}");
    assert!(quiet.changed.iter().all(|d| d.tenant != "b"), "{quiet:?}");
    let held = find(&controller.snapshot(), "b", Priority::Unspecified).clone();
    assert_eq!(
        held.drop_ratio,
        find(&before, "b", Priority::Unspecified).drop_ratio
    );
    // The status shows the held cell, and for how long it has been quiet.
    let cells = &quiet.buckets[0].cells;
    let shown: Vec<(&str, Option<f64>)> = cells
        .iter()
        .map(|c| (c.tenant.as_ref(), c.quiet_s))
        .collect();
    assert_eq!(shown, [("a", None), ("b", Some(0.5))], "{cells:?}");
    assert_eq!(cells[1].drop_ratio.get(), held.drop_ratio, "{cells:?}");
    assert_eq!(cells[1].offered_rps, 0.0, "{cells:?}");
    let back = controller.decide(&both(), &policy);
    assert!(back.retired.is_empty(), "{back:?}");
    assert!(back.changed.iter().all(|d| !is_lift(d)), "{back:?}");
    // The same for a bucket whose only cell is quiet, and a cell that
    // never shed is lifted at once.
    let limits = table(&[("acme", 200.0), ("calm", 200.0)]);
    let mut controller = Controller::default();
    controller.tick(&load(&[("acme", 400.0), ("calm", 100.0)]), &limits);
    let quiet = controller.tick(&load(&[("calm", 100.0)]), &limits);
    assert!(quiet.changed.is_empty(), "{quiet:?}");
    assert!(quiet.retired.is_empty(), "{quiet:?}");
    // The status still lists the quiet bucket, with what its proxies hold.
    let acme = find_bucket(&quiet, "acme");
    assert_eq!(acme.offered_rps, 0.0, "{acme:?}");
    assert_eq!(acme.limit_rps.map(LimitRps::get), Some(200.0), "{acme:?}");
    assert!(acme.drop_ratio.get() > 0.0, "{acme:?}");
    assert_eq!(acme.cells.len(), 1, "{acme:?}");
    assert_eq!(acme.cells[0].quiet_s, Some(0.5), "{acme:?}");
    assert_eq!(acme.cells[0].drop_ratio, acme.drop_ratio, "{acme:?}");
    let back = controller.tick(&load(&[("acme", 400.0), ("calm", 100.0)]), &limits);
    assert!(back.changed.iter().all(|d| !is_lift(d)), "{back:?}");
}

#[test]
fn retry_after_grows_with_the_overload_and_is_capped() {
    let interval = ControlInterval::from_millis(500).unwrap();
    assert_eq!(retry_after_ms(interval, 0), 1_000);
    assert_eq!(retry_after_ms(interval, 1), 1_000, "whole seconds");
    assert_eq!(retry_after_ms(interval, 19), 1_000);
    assert_eq!(
        retry_after_ms(interval, 20),
        2_000,
        "10 s of overload: +1 s"
    );
    assert_eq!(retry_after_ms(interval, 1_000), MAX_RETRY_AFTER_MS);
    let slow = ControlInterval::from_millis(5_000).unwrap();
    assert_eq!(retry_after_ms(slow, 0), 10_000, "two control intervals");
    // A budget cell's debt: whole seconds up, within the longest wait.
    assert_eq!(retry::with_debt(1_000, 0.0), 1_000);
    assert_eq!(retry::with_debt(1_000, f64::NAN), 1_000);
    assert_eq!(retry::with_debt(1_000, 2.1), 4_000);
    assert_eq!(retry::with_debt(1_000, 0.3), 1_000);
    assert_eq!(retry::with_debt(5_000, 2.1), 5_000);
    assert_eq!(retry::with_debt(1_000, 17.0), MAX_RETRY_AFTER_MS);
    assert_eq!(retry::with_debt(1_000, 1e30), MAX_RETRY_AFTER_MS);

    // Through the controller: the same bucket, longer overloaded.
    let limits = table(&[("acme", 100.0)]);
    let mut controller = Controller::default().with_interval(interval);
    let first = controller.tick(&load(&[("acme", 200.0)]), &limits);
    let first_wait = first.changed[0].retry_after_ms;
    let mut later = first_wait;
    for _ in 0..60 {
        if let Some(d) = controller
            .tick(&load(&[("acme", 200.0)]), &limits)
            .changed
            .first()
        {
            later = d.retry_after_ms;
        }
    }
    assert!(later > first_wait, "{later} after {first_wait}");
    let calm = controller.tick(&load(&[("acme", 50.0)]), &limits);
    assert_eq!(calm.changed[0].retry_after_ms, 0);
}

#[test]
fn formula() {
    assert_eq!(drop_ratio(600.0, Some(limit(200.0))).get(), 2.0 / 3.0);
    assert_eq!(drop_ratio(200.0, Some(limit(200.0))).get(), 0.0);
    assert_eq!(drop_ratio(100.0, Some(limit(200.0))).get(), 0.0);
    assert_eq!(drop_ratio(0.0, Some(limit(200.0))).get(), 0.0);
    assert_eq!(drop_ratio(600.0, None).get(), 0.0);
    assert_eq!(drop_ratio(5.0, Some(limit(0.0))).get(), 1.0);
    assert_eq!(drop_ratio(0.0, Some(limit(0.0))).get(), 0.0);
}

fn arbitrary_load(cells: &[(u8, u8, u8, u16)]) -> FleetLoad {
    let mut buckets: std::collections::BTreeMap<String, Vec<CellLoad>> = Default::default();
    for &(bucket, tenant, priority, offered) in cells {
        let cells = buckets.entry(format!("b{}", bucket % 6)).or_default();
        let tenant = format!("t{}", tenant % 4);
        let priority = Priority::ALL[usize::from(priority) % Priority::ALL.len()];
        if cells
            .iter()
            .any(|c| c.tenant.as_ref() == tenant && c.priority == priority)
        {
            continue;
        }
        cells.push(tenant_cell(&tenant, priority, f64::from(offered) + 1.0));
    }
    FleetLoad::new(
        buckets
            .into_iter()
            .map(|(bucket, cells)| BucketTraffic::from_cells(&bucket, cells))
            .collect(),
    )
}

proptest! {
    /// Applying each tick's `changed` and `retired` to what proxies hold
    /// always yields the controller's snapshot, and a limited bucket
    /// with more offered than its limit admits its limit.
    #[test]
    fn deltas_reproduce_the_snapshot_and_shares_use_the_limit(
        ticks in prop::collection::vec(
            prop::collection::vec((0u8..6, 0u8..4, 0u8..5, 0u16..500), 0..20),
            1..8,
        ),
    ) {
        let policy = Policy {
            limits: LimitTable::new(Some(limit(300.0))),
            tenants: Tenants::default(),
            modes: Modes::default(),
            ..Policy::default()
        };
        let mut controller = Controller::default();
        let mut held: std::collections::BTreeMap<(String, String, i32), Directive> =
            Default::default();
        for cells in &ticks {
            let load = arbitrary_load(cells);
            let decision = controller.decide(&load, &policy);
            for d in decision.changed {
                held.insert((d.bucket.clone(), d.tenant.clone(), d.priority), d);
            }
            for r in decision.retired {
                held.remove(&(r.bucket.to_string(), r.tenant.to_string(), r.priority.to_wire() as i32));
            }
            let held_now: Vec<Directive> = held.values().cloned().collect();
            prop_assert_eq!(held_now, controller.snapshot());
            for traffic in &load.buckets {
                let admitted: f64 = traffic
                    .cells
                    .iter()
                    .map(|c| {
                        let d = held
                            .get(&(traffic.bucket.to_string(), c.tenant.to_string(), c.priority.to_wire() as i32))
                            .unwrap();
                        c.load.offered_rps * (1.0 - d.drop_ratio)
                    })
                    .sum();
                let expected = traffic.load.offered_rps.min(300.0);
                // Pushed ratios lag by at most the change threshold.
                prop_assert!(
                    (admitted - expected).abs() <= CHANGE_THRESHOLD * traffic.load.offered_rps + 1e-6,
                    "{}: {} vs {}", traffic.bucket, admitted, expected
                );
            }
        }
    }

    #[test]
    fn ratio_is_a_probability(offered in 0.0..1e12f64, rps in 0.0..=1e9f64) {
        let ratio = drop_ratio(offered, Some(limit(rps))).get();
        prop_assert!((0.0..=1.0).contains(&ratio));
    }

    #[test]
    fn admitted_share_respects_the_limit(offered in 0.0..1e12f64, rps in 0.0..=1e9f64) {
        let ratio = drop_ratio(offered, Some(limit(rps))).get();
        let admitted = offered * (1.0 - ratio);
        if offered > rps {
            prop_assert!(admitted <= rps + 1e-6 * rps.max(1.0), "{admitted} > {rps}");
        } else {
            prop_assert_eq!(ratio, 0.0);
            prop_assert_eq!(admitted, offered);
        }
    }

    #[test]
    fn unlimited_never_drops(offered in 0.0..1e12f64) {
        prop_assert_eq!(drop_ratio(offered, None), DropRatio::NEVER);
    }
}

#[test]
fn the_first_interval_lifts_unlimited_cells_then_they_get_no_directive() {
    let limits = table(&[("acme", 200.0)]);
    let mut controller = Controller::default();
    let decision = controller.tick(&load(&[("acme", 600.0), ("free", 10.0)]), &limits);
    // A previous process may have left a directive for `free` on the
    // proxies: the first interval lifts it.
    assert_eq!(
        buckets(&decision.changed),
        [("acme", 2.0 / 3.0), ("free", 0.0)]
    );
    assert_eq!(decision.changed[0].limit_rps, Some(200.0));
    assert!(is_lift(&decision.changed[1]));
    assert!(!is_lift(&decision.changed[0]));
    assert_eq!(controller.snapshot(), decision.changed[..1]);
    assert_eq!(decision.buckets.len(), 2);
    assert_eq!(decision.buckets[0].limit_rps, Some(limit(200.0)));
    assert_eq!(decision.buckets[1].limit_rps, None);
    // Later, unlimited cells, new or not, cost nothing.
    let decision = controller.tick(
        &load(&[("acme", 600.0), ("free", 10.0), ("other", 5.0)]),
        &limits,
    );
    assert!(decision.changed.is_empty());
    assert_eq!(decision.buckets.len(), 3, "still shown in the status");
}

#[test]
fn a_flood_of_unlimited_keys_pushes_only_the_limited_bucket() {
    let limits = table(&[("acme", 200.0)]);
    let mut controller = Controller::default();
    controller.tick(&load(&[("acme", 800.0)]), &limits);
    for round in 0..20 {
        let names: Vec<String> = (0..500).map(|i| format!("flood-{round}-{i}")).collect();
        let mut entries: Vec<(&str, f64)> = names.iter().map(|n| (n.as_str(), 1.0)).collect();
        entries.push(("acme", 800.0 + f64::from(round) * 10.0));
        entries.sort_by(|a, b| a.0.cmp(b.0));
        let decision = controller.tick(&load(&entries), &limits);
        assert!(
            decision.changed.iter().all(|d| d.bucket == "acme"),
            "round {round}: {:?}",
            buckets(&decision.changed)
        );
        assert_eq!(controller.snapshot().len(), 1);
    }
}

#[test]
fn a_mode_alone_is_something_to_enforce() {
    let mut policy = policy(100.0, &[]);
    policy.limits = table(&[]);
    policy.modes.buckets.insert("api".into(), Mode::Shadow);
    let mut controller = Controller::default();
    controller.decide(&load(&[("api", 10.0)]), &policy);
    let decision = controller.decide(&load(&[("api", 10.0), ("bare", 10.0)]), &policy);
    assert!(decision.changed.is_empty());
    assert_eq!(controller.snapshot().len(), 1);
    assert_eq!(controller.snapshot()[0].bucket, "api");
}

#[test]
fn small_changes_are_not_pushed_but_accumulate() {
    let limits = table(&[("acme", 200.0)]);
    let mut controller = Controller::default();
    controller.tick(&load(&[("acme", 400.0)]), &limits); // 0.5
    // 0.5 → 0.5006: below the threshold, nothing to push, view keeps 0.5.
    let decision = controller.tick(&load(&[("acme", 400.48)]), &limits);
    assert!(decision.changed.is_empty());
    assert_eq!(decision.buckets[0].drop_ratio.get(), 0.5);
    // Compared against what was pushed, not the previous tick: drifting
    // in small steps still ends up pushed.
    let decision = controller.tick(&load(&[("acme", 401.0)]), &limits);
    assert_eq!(decision.changed.len(), 1);
    assert!((decision.changed[0].drop_ratio - (1.0 - 200.0 / 401.0)).abs() < 1e-12);
}

#[test]
fn an_offered_rate_climbing_under_the_limit_is_pushed_each_tenth() {
    let limits = table(&[("acme", 1000.0)]);
    let mut controller = Controller::default();
    let first = controller.tick(&load(&[("acme", 500.0)]), &limits);
    assert_eq!(first.changed[0].offered_rps, 500.0);
    // Proxies cap themselves at their rate times limit / 500: up to 10 %
    // more is noise, and falling is never a reason.
    for offered in [540.0, 550.0, 300.0, 520.0] {
        let decision = controller.tick(&load(&[("acme", offered)]), &limits);
        assert!(decision.changed.is_empty(), "{offered} rps pushed");
    }
    // Grown by more than a tenth since the push: the caps need it.
    let decision = controller.tick(&load(&[("acme", 551.0)]), &limits);
    assert_eq!(buckets(&decision.changed), [("acme", 0.0)]);
    assert_eq!(decision.changed[0].offered_rps, 551.0);
    // Measured from that push now.
    assert!(
        controller
            .tick(&load(&[("acme", 600.0)]), &limits)
            .changed
            .is_empty()
    );
    // Over the limit the ratio moves and is pushed as ever; an unlimited
    // bucket gets nothing however its load grows.
    let decision = controller.tick(&load(&[("acme", 2000.0)]), &limits);
    assert_eq!(buckets(&decision.changed), [("acme", 0.5)]);
    let unlimited = table(&[]);
    let mut controller = Controller::default();
    controller.tick(&load(&[("free", 100.0)]), &unlimited);
    for offered in [200.0, 400.0] {
        let decision = controller.tick(&load(&[("free", offered)]), &unlimited);
        assert!(decision.changed.is_empty(), "{offered} rps pushed");
    }
}

#[test]
fn limit_change_is_pushed_even_without_ratio_change() {
    let mut controller = Controller::default();
    controller.tick(&load(&[("acme", 100.0)]), &table(&[("acme", 200.0)]));
    let decision = controller.tick(&load(&[("acme", 100.0)]), &table(&[("acme", 300.0)]));
    assert_eq!(buckets(&decision.changed), [("acme", 0.0)]);
    assert_eq!(decision.changed[0].limit_rps, Some(300.0));
    let decision = controller.tick(&load(&[("acme", 100.0)]), &table(&[]));
    assert!(is_lift(&decision.changed[0]), "limit removed: lifted");
    assert!(controller.snapshot().is_empty());
    let decision = controller.tick(&load(&[("acme", 100.0)]), &table(&[]));
    assert!(decision.changed.is_empty(), "lifted once");
}

#[test]
fn limit_change_that_changes_the_ratio() {
    let mut controller = Controller::default();
    controller.tick(&load(&[("acme", 600.0)]), &table(&[("acme", 200.0)]));
    let decision = controller.tick(&load(&[("acme", 600.0)]), &table(&[("acme", 300.0)]));
    assert_eq!(buckets(&decision.changed), [("acme", 0.5)]);
}

proptest! {
    /// Cells of one bucket come and go at random, every one shedding:
    /// what was pushed is what a new stream gets, no cell is listed
    /// twice, every cell with traffic has its directive, a cell quiet
    /// for the hold has been lifted, once, and the status lists each
    /// cell with traffic and each held one, in order.
    #[test]
    fn quiet_cells_are_held_then_lifted_once(
        presence in proptest::collection::vec(proptest::collection::vec(any::<bool>(), 6), 1..40),
    ) {
        let policy = policy(10.0, &[]);
        let mut controller = Controller::default();
        let mut proxy = Pushed::default();
        let tenants = ["a", "b", "c", "d", "e", "f"];
        let mut quiet_for = [usize::MAX; 6];
        let hold = quiet_intervals();
        for present in &presence {
            let cells: Vec<CellLoad> = tenants
                .iter()
                .zip(present)
                .filter(|(_, here)| **here)
                .map(|(tenant, _)| tenant_cell(tenant, Priority::Unspecified, 100.0))
                .collect();
            let load = if cells.is_empty() {
                FleetLoad::default()
            } else {
                FleetLoad::new(vec![BucketTraffic::from_cells("api", cells)])
            };
            let decision = controller.decide(&load, &policy);
            proxy.apply(&decision);
            proxy.matches_snapshot(&controller);
            let snapshot = controller.snapshot();
            let mut keys: Vec<&str> = snapshot.iter().map(|d| d.tenant.as_str()).collect();
            keys.dedup();
            prop_assert_eq!(keys.len(), snapshot.len(), "{:?}", snapshot);
            let shown: Vec<(&str, bool)> = decision
                .buckets
                .iter()
                .flat_map(|b| b.cells.iter().map(|c| (c.tenant.as_ref(), c.quiet_s.is_some())))
                .collect();
            let mut expected = Vec::new();
            for (index, tenant) in tenants.iter().enumerate() {
                let quiet = if present[index] { 0 } else { quiet_for[index].saturating_add(1) };
                if present[index] || quiet < hold {
                    expected.push((*tenant, !present[index]));
                }
            }
            prop_assert_eq!(shown, expected);
            for (index, tenant) in tenants.iter().enumerate() {
                let lifts = decision
                    .changed
                    .iter()
                    .filter(|d| d.tenant == *tenant && is_lift(d))
                    .count();
                if present[index] {
                    quiet_for[index] = 0;
                    prop_assert!(proxy.0.keys().any(|k| k.1 == *tenant), "{} not held", tenant);
                    prop_assert_eq!(lifts, 0);
                } else {
                    quiet_for[index] = quiet_for[index].saturating_add(1);
                    let held = proxy.0.keys().any(|k| k.1 == *tenant);
                    if quiet_for[index] < hold {
                        prop_assert!(held, "{} lifted after {} quiet", tenant, quiet_for[index]);
                    } else {
                        prop_assert!(!held, "{} held after {} quiet", tenant, quiet_for[index]);
                    }
                    prop_assert_eq!(lifts, usize::from(quiet_for[index] == hold));
                }
            }
        }
    }
}

/// A flood of one-off keys that each shed once parks at most
/// `MAX_QUIET_CELLS` of them; the rest are lifted at once, as before.
#[test]
fn quiet_cells_of_a_bucket_are_bounded() {
    let policy = policy(10.0, &[]);
    let mut controller = Controller::default();
    let flood = MAX_QUIET_CELLS + 904;
    let cells = (0..flood)
        .map(|i| tenant_cell(&format!("t{i:05}"), Priority::Unspecified, 100.0))
        .collect();
    controller.decide(
        &FleetLoad::new(vec![BucketTraffic::from_cells("api", cells)]),
        &policy,
    );
    let gone = controller.decide(&FleetLoad::default(), &policy);
    assert_eq!(gone.changed.iter().filter(|d| is_lift(d)).count(), 904);
    assert_eq!(controller.snapshot().len(), MAX_QUIET_CELLS);
    for _ in 1..quiet_intervals() {
        controller.decide(&FleetLoad::default(), &policy);
    }
    assert!(controller.snapshot().is_empty());
}

#[test]
fn stopped_bucket_is_lifted_once_then_forgotten() {
    let limits = table(&[("acme", 200.0), ("calm", 200.0)]);
    let mut controller = Controller::default();
    controller.tick(&load(&[("acme", 400.0), ("calm", 100.0)]), &limits);
    // calm did not shed: lifted at once (at 0 included, so the proxies
    // free its slot). acme's ratio stands while it is quiet.
    let decision = controller.tick(&load(&[]), &limits);
    assert_eq!(buckets(&decision.changed), [("calm", 0.0)]);
    assert!(decision.changed.iter().all(is_lift));
    assert_eq!(decision.retired.len(), 1);
    // The status lists acme, whose directive stands, and not calm.
    let listed: Vec<&str> = decision.buckets.iter().map(|b| b.bucket.as_ref()).collect();
    assert_eq!(listed, ["acme"], "{decision:?}");
    let held = controller.snapshot();
    assert_eq!(held.len(), 1);
    assert!(
        held[0].bucket == "acme" && held[0].drop_ratio > 0.0,
        "{held:?}"
    );
    for _ in 2..quiet_intervals() {
        let decision = controller.tick(&load(&[]), &limits);
        assert!(decision.changed.is_empty() && decision.retired.is_empty());
        assert_eq!(decision.buckets.len(), 1, "{decision:?}");
    }
    let decision = controller.tick(&load(&[]), &limits);
    assert_eq!(buckets(&decision.changed), [("acme", 0.0)]);
    assert!(decision.changed.iter().all(is_lift));
    assert_eq!(decision.retired.len(), 1);
    assert!(decision.buckets.is_empty(), "{decision:?}");
    assert!(controller.snapshot().is_empty());
    assert!(controller.tick(&load(&[]), &limits).changed.is_empty());
}

#[test]
fn unchanged_state_pushes_nothing() {
    let limits = table(&[("acme", 200.0)]);
    let mut controller = Controller::default();
    controller.tick(&load(&[("acme", 600.0)]), &limits);
    let decision = controller.tick(&load(&[("acme", 600.0)]), &limits);
    assert!(decision.changed.is_empty());
    assert_eq!(buckets(&controller.snapshot()), [("acme", 2.0 / 3.0)]);
}

#[test]
fn policy_can_be_swapped() {
    struct Halve;
    impl DropPolicy for Halve {
        fn drop_ratio(&mut self, _: &str, _: &BucketLoad, _: Option<LimitRps>) -> DropRatio {
            DropRatio::new(0.5).unwrap()
        }
    }
    let mut controller = Controller::new(Halve);
    let decision = controller.tick(&load(&[("x", 1.0)]), &table(&[("x", 100.0)]));
    assert_eq!(buckets(&decision.changed), [("x", 0.5)]);
}

#[test]
fn a_capped_proxy_is_listed_in_its_buckets_directives_and_moves_repush_them() {
    use crate::fleet::{CappedProxy, ProxyCap};
    let with_cap = |counted_rps: f64| {
        let mut load = load(&[("b", 2_000.0)]);
        load.buckets[0].proxy_cap = Some(ProxyCap {
            cap_rps: counted_rps,
            capped: vec![CappedProxy {
                proxy_id: Arc::from("hot"),
                claimed_rps: 1_000.0,
                counted_rps,
            }],
        });
        load
    };
    let limits = table(&[("b", 1_000.0)]);
    let mut controller = Controller::default();
    let first = controller.tick(&with_cap(500.0), &limits);
    let directive = &first.changed[0];
    assert_eq!(directive.counted_proxies.len(), 1);
    assert_eq!(directive.counted_proxies[0].proxy_id, "hot");
    assert_eq!(directive.counted_proxies[0].counted_fraction, 0.5);
    // Shedding: no room for the uncounted rate.
    assert_eq!(directive.uncounted_admit, 0.0);
    // The same load again: nothing to push.
    assert!(
        controller
            .tick(&with_cap(500.0), &limits)
            .changed
            .is_empty()
    );
    // The hot proxy's counted part moved though the ratio did not: pushed.
    let moved = controller.tick(&with_cap(600.0), &limits);
    assert_eq!(moved.changed.len(), 1);
    assert_eq!(moved.changed[0].counted_proxies[0].counted_fraction, 0.6);
    // The cap lifted: pushed once more with an empty list.
    let lifted = controller.tick(&load(&[("b", 2_000.0)]), &limits);
    assert_eq!(lifted.changed.len(), 1);
    assert!(lifted.changed[0].counted_proxies.is_empty());
    assert!(
        controller
            .snapshot()
            .iter()
            .all(|d| d.counted_proxies.is_empty())
    );
}

#[test]
fn critical_traffic_below_the_limit_is_not_shed_for_its_noise_while_bulk_is() {
    // CRITICAL at 12.5-17 rps from one interval to the next (counting
    // noise around 15, below the policy's step threshold), BULK far above
    // a limit of 100: the tracking policy
    // smooths CRITICAL's offered rate, so a share of exactly what it
    // offered this interval (the spare left after BULK, 0) made it drop
    // CRITICAL whenever an interval came in below the average.
    let policy = policy(100.0, &[]);
    let mut controller = Controller::tracking(ControlInterval::default());
    let noisy = [15.0, 13.0, 17.0, 14.0, 16.0, 12.5, 15.5, 13.5];
    for (interval, critical) in noisy.iter().cycle().take(40).enumerate() {
        let load = FleetLoad::new(vec![BucketTraffic::from_cells(
            "api",
            vec![
                tenant_cell("", Priority::Critical, *critical),
                tenant_cell("", Priority::Bulk, 400.0),
            ],
        )]);
        let decision = controller.decide(&load, &policy);
        let critical = decision
            .changed
            .iter()
            .find(|d| d.priority == Priority::Critical.to_wire() as i32);
        if let Some(critical) = critical {
            assert_eq!(
                critical.drop_ratio, 0.0,
                "interval {interval}: {critical:?}"
            );
        }
    }
}

#[test]
fn a_tenant_under_its_floor_is_not_shed_for_its_noise() {
    // `small` offers 30-37 rps of BULK against a floor of 40 while `big`
    // floods the bucket: BULK is shed down to the floors, and a share of
    // exactly what `small` offered this interval made the tracking policy
    // drop it whenever an interval came in below the average.
    let policy = policy(100.0, &[("small", 0.01, 1.0, 40.0)]);
    let mut controller = Controller::tracking(ControlInterval::default());
    let noisy = [35.0, 31.0, 37.0, 33.0, 36.0, 30.0, 34.5, 32.5];
    for (interval, small) in noisy.iter().cycle().take(40).enumerate() {
        let load = FleetLoad::new(vec![BucketTraffic::from_cells(
            "api",
            vec![
                tenant_cell("big", Priority::Unspecified, 1000.0),
                tenant_cell("small", Priority::Bulk, *small),
            ],
        )]);
        let decision = controller.decide(&load, &policy);
        if let Some(small) = decision.changed.iter().find(|d| d.tenant == "small") {
            assert_eq!(small.drop_ratio, 0.0, "interval {interval}: {small:?}");
        }
    }
}
