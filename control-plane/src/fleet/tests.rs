//! Rate estimation, summing, carrying and the caps of the fleet state.
#![allow(clippy::float_cmp)]

use sluice_proto::v1::BucketCount;

use super::*;

fn report(window_ms: u64, buckets: &[(&str, u64, u64)]) -> Report {
    Report {
        sequence: 0,
        window_ms,
        directive_age_ms: None,
        upstream: Vec::new(),
        buckets: buckets
            .iter()
            .map(|&(bucket, offered, admitted)| BucketCount {
                bucket: bucket.to_owned(),
                offered,
                admitted,
                ..Default::default()
            })
            .collect(),
    }
}

fn offered(load: &FleetLoad, bucket: &str) -> f64 {
    load.get(bucket).map_or(0.0, |b| b.load.offered_rps)
}

fn cell(bucket: &str, tenant: &str, priority: Priority, offered: u64) -> BucketCount {
    BucketCount {
        bucket: bucket.to_owned(),
        tenant: tenant.to_owned(),
        priority: priority.to_wire() as i32,
        offered,
        admitted: offered / 2,
        shadow_dropped: offered / 4,
        ..BucketCount::default()
    }
}

fn cells_report(window_ms: u64, cells: Vec<BucketCount>) -> Report {
    Report {
        sequence: 0,
        window_ms,
        directive_age_ms: None,
        upstream: Vec::new(),
        buckets: cells,
    }
}

#[test]
fn cells_are_summed_per_tenant_and_priority_with_bucket_totals() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    fleet.connect("b", 2, StreamId(2));
    fleet
        .report(
            "a",
            StreamId(1),
            &cells_report(
                100,
                vec![
                    cell("api", "gold", Priority::Critical, 10),
                    cell("api", "free", Priority::Bulk, 20),
                ],
            ),
        )
        .unwrap();
    fleet
        .report(
            "b",
            StreamId(2),
            &cells_report(
                100,
                vec![
                    cell("api", "gold", Priority::Critical, 30),
                    cell("api", "gold", Priority::Bulk, 4),
                ],
            ),
        )
        .unwrap();
    let load = fleet.tick();
    let api = load.get("api").unwrap();
    assert_eq!(api.load.offered_rps, 640.0);
    assert_eq!(api.load.admitted_rps, 320.0);
    assert_eq!(api.shadow_dropped_rps, 150.0);
    assert_eq!(api.load.proxies_reporting, 2, "each proxy counted once");
    let cells: Vec<(&str, Priority, f64, u32)> = api
        .cells
        .iter()
        .map(|c| {
            (
                c.tenant.as_ref(),
                c.priority,
                c.load.offered_rps,
                c.load.proxies_reporting,
            )
        })
        .collect();
    assert_eq!(
        cells,
        [
            ("free", Priority::Bulk, 200.0, 1),
            ("gold", Priority::Critical, 400.0, 2),
            ("gold", Priority::Bulk, 40.0, 1),
        ]
    );
    assert_eq!(api.cells[1].shadow_dropped_rps, 90.0);
    assert_eq!(fleet.cells(), 3);
}

#[test]
fn idle_cells_are_evicted_and_counted() {
    let mut fleet = Fleet::new(1);
    fleet.connect("a", 1, StreamId(1));
    fleet
        .report(
            "a",
            StreamId(1),
            &cells_report(
                100,
                vec![
                    cell("x", "t1", Priority::Unspecified, 1),
                    cell("y", "", Priority::Unspecified, 1),
                ],
            ),
        )
        .unwrap();
    fleet.tick();
    fleet
        .report(
            "a",
            StreamId(1),
            &cells_report(100, vec![cell("y", "", Priority::Unspecified, 1)]),
        )
        .unwrap();
    let load = fleet.tick();
    assert_eq!(load.stats.evicted_idle, 1);
    assert_eq!(load.stats.cells, 1);
    assert_eq!(load.stats.buckets, 1);
    // A silent proxy's carried cells stay until the carry ends.
    assert_eq!(fleet.tick().stats.evicted_idle, 0);
    let load = fleet.tick();
    assert_eq!(load.stats.evicted_idle, 1);
    assert_eq!(fleet.cells(), 0);
}

#[test]
fn long_keys_are_refused() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    let long = "x".repeat(FleetCaps::default().max_bucket_len + 1);
    let long_tenant = "t".repeat(FleetCaps::default().max_tenant_len + 1);
    fleet
        .report(
            "a",
            StreamId(1),
            &cells_report(
                100,
                vec![
                    cell(&long, "", Priority::Unspecified, 1),
                    cell("ok", &long_tenant, Priority::Unspecified, 1),
                    cell("ok", "", Priority::Unspecified, 1),
                ],
            ),
        )
        .unwrap();
    let load = fleet.tick();
    assert_eq!(load.stats.rejected_key_too_long, 2);
    assert_eq!(load.buckets.len(), 1);
    assert_eq!(
        fleet.tick().stats.rejected_key_too_long,
        0,
        "counts are per tick"
    );
}

#[test]
fn a_cardinality_flood_stays_within_the_caps() {
    let caps = FleetCaps {
        max_cells_per_proxy: 100,
        max_cells: 150,
        ..FleetCaps::default()
    };
    let mut fleet = Fleet::with_caps(3, caps);
    fleet.connect("flood", 1, StreamId(1));
    fleet.connect("b", 2, StreamId(2));
    fleet.connect("c", 3, StreamId(3));
    let mut rejected_proxy = 0;
    let mut rejected_fleet = 0;
    for round in 0..20 {
        // Every round the flooding proxy reports 1000 buckets never seen.
        let flood = (0..1000)
            .map(|i| cell(&format!("f{round}-{i}"), "", Priority::Unspecified, 1))
            .collect();
        fleet
            .report("flood", StreamId(1), &cells_report(100, flood))
            .unwrap();
        let steady = (0..40)
            .map(|i| cell(&format!("s{i}"), "", Priority::Unspecified, 1))
            .collect();
        fleet
            .report("b", StreamId(2), &cells_report(100, steady))
            .unwrap();
        let more = (0..40)
            .map(|i| cell(&format!("c{round}-{i}"), "", Priority::Unspecified, 1))
            .collect();
        let _ = fleet.report("c", StreamId(3), &cells_report(100, more));
        let load = fleet.tick();
        assert!(
            fleet.cells() <= 150,
            "round {round}: {} cells",
            fleet.cells()
        );
        assert!(load.buckets.len() <= 150);
        rejected_proxy += load.stats.rejected_proxy_cap;
        rejected_fleet += load.stats.rejected_fleet_cap;
        assert!(
            fleet.proxies().iter().all(|p| p.cells <= 100),
            "{:?}",
            fleet.proxies()
        );
    }
    // The flood alone sent 1000 new cells a round, and at most 100 fit.
    assert!(
        rejected_proxy + rejected_fleet >= 20 * 900,
        "{rejected_proxy} + {rejected_fleet}"
    );
    assert!(rejected_proxy > 0);
    assert!(rejected_fleet > 0, "the fleet cap was reached too");
    assert!(
        fleet.cells.slots.len() <= 150,
        "slots are reused, not grown"
    );
}

#[test]
fn rate_is_counts_over_summed_windows() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    // 150 + 50 requests over 250 + 250 ms = 400 rps; uneven windows are
    // weighted by their length, not averaged per report.
    fleet
        .report("a", StreamId(1), &report(250, &[("acme", 150, 100)]))
        .unwrap();
    fleet
        .report("a", StreamId(1), &report(250, &[("acme", 50, 50)]))
        .unwrap();
    let load = fleet.tick();
    let acme = load.get("acme").unwrap().load;
    assert_eq!(acme.offered_rps, 400.0);
    assert_eq!(acme.admitted_rps, 300.0);
    assert_eq!(acme.proxies_reporting, 1);
}

#[test]
fn proxies_are_summed() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    fleet.connect("b", 2, StreamId(2));
    fleet
        .report("a", StreamId(1), &report(500, &[("acme", 225, 225)]))
        .unwrap();
    fleet
        .report(
            "b",
            StreamId(2),
            &report(250, &[("acme", 37, 37), ("x", 1, 1)]),
        )
        .unwrap();
    let load = fleet.tick();
    assert_eq!(offered(&load, "acme"), 450.0 + 148.0);
    assert_eq!(load.get("acme").unwrap().load.proxies_reporting, 2);
    assert_eq!(load.get("x").unwrap().load.proxies_reporting, 1);
}

#[test]
fn silent_proxy_is_carried_then_expires() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    fleet
        .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
        .unwrap();
    assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
    for _ in 0..3 {
        assert_eq!(offered(&fleet.tick(), "acme"), 100.0, "carried");
    }
    let load = fleet.tick();
    assert!(
        load.is_empty(),
        "expired after three silent ticks: {load:?}"
    );
    assert_eq!(fleet.len(), 1, "still connected, so still known");

    fleet
        .report("a", StreamId(1), &report(100, &[("acme", 5, 5)]))
        .unwrap();
    assert_eq!(offered(&fleet.tick(), "acme"), 50.0, "fresh again");
}

#[test]
fn an_empty_report_means_zero_traffic() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    fleet
        .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
        .unwrap();
    fleet.tick();
    fleet.report("a", StreamId(1), &report(100, &[])).unwrap();
    assert!(fleet.tick().is_empty());
}

#[test]
fn bucket_missing_from_a_fresh_window_drops_to_zero() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    fleet
        .report(
            "a",
            StreamId(1),
            &report(100, &[("acme", 10, 10), ("x", 1, 1)]),
        )
        .unwrap();
    fleet.tick();
    fleet
        .report("a", StreamId(1), &report(100, &[("x", 2, 2)]))
        .unwrap();
    let load = fleet.tick();
    assert!(load.get("acme").is_none());
    assert_eq!(offered(&load, "x"), 20.0);
}

#[test]
fn a_newer_stream_of_the_same_instance_replaces_the_older_one() {
    let mut fleet = Fleet::new(3);
    assert_eq!(fleet.connect("a", 1, StreamId(1)), Connected::New);
    fleet
        .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
        .unwrap();
    fleet.tick();
    assert_eq!(
        fleet.connect("a", 1, StreamId(2)),
        Connected::Replaced {
            previous: Some(StreamId(1)),
            previous_instance: 1,
        }
    );
    assert_eq!(fleet.instance_id("a"), Some(1));
    assert_eq!(fleet.len(), 1);
    assert_eq!(
        fleet.report("a", StreamId(1), &report(100, &[("acme", 99, 99)])),
        Err(ReportRejected::Superseded)
    );
    assert!(
        !fleet.disconnect("a", StreamId(1)),
        "old stream cannot unregister the new one"
    );
    // Rates carry over the replacement until the new stream reports.
    assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
    fleet
        .report("a", StreamId(2), &report(100, &[("acme", 20, 20)]))
        .unwrap();
    assert_eq!(offered(&fleet.tick(), "acme"), 200.0, "not double counted");
}

#[test]
fn disconnected_proxy_is_carried_then_forgotten() {
    let mut fleet = Fleet::new(2);
    fleet.connect("a", 1, StreamId(1));
    fleet
        .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
        .unwrap();
    assert!(fleet.disconnect("a", StreamId(1)));
    assert_eq!(
        offered(&fleet.tick(), "acme"),
        100.0,
        "window before disconnect counts"
    );
    assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
    assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
    assert!(fleet.tick().is_empty());
    assert!(fleet.is_empty());
}

#[test]
fn zero_window_and_unknown_proxy_are_rejected() {
    let mut fleet = Fleet::new(3);
    assert_eq!(
        fleet.report("a", StreamId(1), &report(100, &[])),
        Err(ReportRejected::Superseded)
    );
    fleet.connect("a", 1, StreamId(1));
    assert_eq!(
        fleet.report("a", StreamId(1), &report(0, &[("acme", 1, 1)])),
        Err(ReportRejected::EmptyWindow)
    );
    assert!(fleet.tick().is_empty());
}

#[test]
fn proxies_view_shows_zone_instance_and_connection() {
    let mut fleet = Fleet::new(3);
    fleet.connect_in_zone("b", 2, "eu-1", StreamId(2));
    fleet.connect("a", 1, StreamId(1));
    fleet
        .report("b", StreamId(2), &report(100, &[("acme", 10, 10)]))
        .unwrap();
    fleet.tick();
    fleet.disconnect("a", StreamId(1));
    let proxies = fleet.proxies();
    let ids: Vec<&str> = proxies.iter().map(|p| p.proxy_id.as_str()).collect();
    assert_eq!(ids, ["a", "b"], "sorted by proxy id");
    assert!(!proxies[0].connected);
    assert_eq!(proxies[1].zone, "eu-1");
    assert_eq!(proxies[1].instance_id, 2);
    assert!(proxies[1].connected);
    assert_eq!(proxies[1].cells, 1);
    assert!(proxies[1].since_last_report < Duration::from_secs(5));
    let json = serde_json::to_value(&proxies[1]).unwrap();
    assert!(json["since_last_report_ms"].is_u64(), "{json}");
}

#[test]
fn proxies_view_shows_the_directive_age_of_the_last_report() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    let age = |fleet: &Fleet| fleet.proxies()[0].directive_age;
    let json = |fleet: &Fleet| serde_json::to_value(&fleet.proxies()[0]).unwrap();
    assert_eq!(age(&fleet), None, "unknown before a report");
    assert!(json(&fleet)["directive_age_ms"].is_null());

    let aged = |ms| Report {
        directive_age_ms: Some(ms),
        upstream: Vec::new(),
        ..report(100, &[])
    };
    fleet.report("a", StreamId(1), &aged(1_250)).unwrap();
    assert_eq!(age(&fleet), Some(Duration::from_millis(1_250)));
    assert_eq!(json(&fleet)["directive_age_ms"], 1_250);
    fleet.report("a", StreamId(1), &aged(40)).unwrap();
    assert_eq!(age(&fleet), Some(Duration::from_millis(40)), "latest wins");
    // A proxy without directives (or of an older build) names none.
    fleet.report("a", StreamId(1), &report(100, &[])).unwrap();
    assert_eq!(age(&fleet), None);

    fleet.report("a", StreamId(1), &aged(40)).unwrap();
    fleet.connect("a", 1, StreamId(2));
    assert_eq!(age(&fleet), None, "a new stream has not reported yet");
    assert_eq!(
        fleet.report("a", StreamId(1), &aged(7)),
        Err(ReportRejected::Superseded)
    );
    assert_eq!(age(&fleet), None, "a replaced stream cannot set it");
}

#[test]
fn proxies_reporting_counts_only_non_zero_rates() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    fleet.connect("b", 2, StreamId(2));
    fleet
        .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
        .unwrap();
    // A filter should not list zero buckets, but tolerate it.
    fleet
        .report("b", StreamId(2), &report(100, &[("acme", 0, 0)]))
        .unwrap();
    assert_eq!(fleet.tick().get("acme").unwrap().load.proxies_reporting, 1);
}

#[test]
fn one_proxys_absurd_claim_is_ignored_and_a_heavy_one_capped() {
    let mut fleet = Fleet::new(3);
    for (i, proxy) in ["a", "b", "c", "liar", "heavy"].iter().enumerate() {
        fleet.connect(proxy, i as u64, StreamId(i as u64));
    }
    for (i, (proxy, offered)) in [
        ("a", 100),
        ("b", 100),
        ("c", 100),
        ("liar", 100_000),
        ("heavy", 600),
    ]
    .iter()
    .enumerate()
    {
        fleet
            .report(
                proxy,
                StreamId(i as u64),
                &report(1_000, &[("x", *offered, *offered)]),
            )
            .unwrap();
    }
    let load = fleet.tick();
    let bucket = load.get("x").unwrap();
    // The median is 100: the heavy proxy counts 400, the liar nothing.
    assert!((bucket.load.offered_rps - 700.0).abs() < 1e-6, "{bucket:?}");
    assert_eq!(
        bucket.load.proxies_reporting, 4,
        "the liar is not reporting"
    );
    let cap = bucket.proxy_cap.as_ref().unwrap();
    assert_eq!(cap.cap_rps, 400.0);
    let cut: Vec<(&str, f64)> = cap
        .capped
        .iter()
        .map(|c| (c.proxy_id.as_ref(), c.counted_rps))
        .collect();
    assert_eq!(cut, [("heavy", 400.0), ("liar", 0.0)]);
    assert_eq!(
        (load.stats.claims_capped, load.stats.claims_ignored),
        (1, 1)
    );
}

#[test]
fn two_proxies_are_weighed_against_each_other() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    fleet.connect("b", 2, StreamId(2));
    fleet
        .report(
            "a",
            StreamId(1),
            &report(1_000, &[("x", 30, 30), ("y", 30, 30)]),
        )
        .unwrap();
    // Beside one Envoy at 30 rps: 1,000,000 rps (the ceilings' most) for
    // x, ignored; 9× for y, capped at 4×.
    fleet
        .report(
            "b",
            StreamId(2),
            &report(1_000, &[("x", 1_000_000, 1_000_000), ("y", 270, 270)]),
        )
        .unwrap();
    let load = fleet.tick();
    assert_eq!(offered(&load, "x"), 30.0);
    assert_eq!(load.get("x").unwrap().load.proxies_reporting, 1);
    assert_eq!(offered(&load, "y"), 30.0 + 120.0);
    let cap = load.get("y").unwrap().proxy_cap.as_ref().unwrap();
    assert_eq!(cap.capped.len(), 1);
    assert_eq!(cap.capped[0].proxy_id.as_ref(), "b");
    assert_eq!(cap.capped[0].counted_rps, 120.0);
}

#[test]
fn a_second_live_instance_of_a_proxy_id_is_a_proxy_of_its_own() {
    let mut fleet = Fleet::new(3);
    assert_eq!(fleet.connect("twin", 1, StreamId(1)), Connected::New);
    fleet
        .report("twin", StreamId(1), &report(100, &[("acme", 15, 15)]))
        .unwrap();
    // Another process says Hello as "twin" while the first reports.
    assert_eq!(
        fleet.connect("twin", 2, StreamId(2)),
        Connected::Conflict { holder: 1 }
    );
    fleet
        .report("twin", StreamId(2), &report(100, &[("acme", 15, 15)]))
        .unwrap();
    fleet
        .report("twin", StreamId(1), &report(100, &[("acme", 15, 15)]))
        .unwrap();
    let load = fleet.tick();
    assert_eq!(offered(&load, "acme"), 300.0, "both count");
    // One report of the holder since the Hello may have been on its way
    // when it froze; the second confirms two live processes.
    assert!(fleet.take_conflicts().is_empty());
    fleet
        .report("twin", StreamId(1), &report(100, &[("acme", 15, 15)]))
        .unwrap();
    fleet.tick();
    assert_eq!(
        fleet.take_conflicts(),
        [ProxyIdConflict {
            proxy_id: "twin".to_owned(),
            holder: 1,
            newcomer: 2
        }]
    );
    fleet
        .report("twin", StreamId(1), &report(100, &[("acme", 15, 15)]))
        .unwrap();
    fleet.tick();
    assert!(fleet.take_conflicts().is_empty(), "counted once");
    assert_eq!(load.get("acme").unwrap().load.proxies_reporting, 2);
    let proxies = fleet.proxies();
    assert_eq!(proxies.len(), 2);
    assert!(proxies.iter().all(|p| p.connected && p.conflict));
    assert_eq!(fleet.connected_proxy_ids(), ["twin"]);
    // Each reconnects as itself.
    assert!(matches!(
        fleet.connect("twin", 2, StreamId(3)),
        Connected::Replaced {
            previous: Some(StreamId(2)),
            previous_instance: 2
        }
    ));
    assert!(fleet.disconnect("twin", StreamId(1)));
    let proxies = fleet.proxies();
    assert!(!proxies.iter().any(|p| p.conflict), "{proxies:?}");
    assert!(fleet.take_superseded().is_empty());
}

#[test]
fn a_restarted_proxy_takes_over_from_an_instance_that_is_gone_or_silent() {
    let mut fleet = Fleet::new(3);
    fleet.connect("edge", 1, StreamId(1));
    fleet
        .report("edge", StreamId(1), &report(100, &[("acme", 10, 10)]))
        .unwrap();
    fleet.tick();
    // The process exited: its stream closed.
    assert!(fleet.disconnect("edge", StreamId(1)));
    assert_eq!(
        fleet.connect("edge", 2, StreamId(2)),
        Connected::Replaced {
            previous: None,
            previous_instance: 1
        }
    );
    assert_eq!(fleet.instance_id("edge"), Some(2));
    // Its rates are carried until the new one reports.
    assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
    // The next process froze with its connection open: once silent for
    // longer than its rates are carried, the next instance takes over.
    for _ in 0..4 {
        fleet.tick();
    }
    assert_eq!(
        fleet.connect("edge", 3, StreamId(3)),
        Connected::Replaced {
            previous: Some(StreamId(2)),
            previous_instance: 2
        }
    );
    assert_eq!(fleet.len(), 1);
}

#[test]
fn a_frozen_instance_beside_a_live_one_is_let_go() {
    let mut fleet = Fleet::new(3);
    fleet.connect("edge", 1, StreamId(1));
    fleet
        .report("edge", StreamId(1), &report(100, &[("acme", 10, 10)]))
        .unwrap();
    // A new process says Hello before the old one is known to be silent.
    assert_eq!(
        fleet.connect("edge", 2, StreamId(2)),
        Connected::Conflict { holder: 1 }
    );
    // Silent for longer than its rates are carried (3 ticks), it is let go.
    for tick in 0..6 {
        fleet
            .report("edge", StreamId(2), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        fleet.tick();
        assert!(fleet.take_conflicts().is_empty(), "tick {tick}: a restart");
        let superseded = fleet.take_superseded();
        if tick < 4 {
            assert!(superseded.is_empty(), "tick {tick}: {superseded:?}");
        } else if tick == 4 {
            assert_eq!(superseded, [StreamId(1)], "tick {tick}");
        } else {
            assert!(superseded.is_empty(), "tick {tick}: once");
        }
    }
    let proxies = fleet.proxies();
    assert_eq!(proxies.len(), 1, "{proxies:?}");
    assert_eq!(proxies[0].instance_id, 2);
    assert!(!proxies[0].conflict);
}

/// A fleet whose share cap puts new proxies on probation for `ticks`.
fn on_probation(ticks: u32) -> Fleet {
    Fleet::with_caps(
        3,
        FleetCaps {
            share_cap: ShareCap {
                probation_ticks: ticks,
                ..ShareCap::default()
            },
            ..FleetCaps::default()
        },
    )
}

/// Every proxy of `claims` reports `x` once, then the fleet ticks.
fn claim_x(fleet: &mut Fleet, claims: &[(&str, u64, u64)]) -> FleetLoad {
    for &(proxy, stream, offered) in claims {
        fleet
            .report(
                proxy,
                StreamId(stream),
                &report(1_000, &[("x", offered, offered)]),
            )
            .unwrap();
    }
    fleet.tick()
}

#[test]
fn new_identities_have_no_say_in_what_is_plausible() {
    let mut fleet = on_probation(2);
    let honest = [("a", 1, 200), ("b", 2, 210), ("c", 3, 190)];
    for &(proxy, stream, _) in &honest {
        fleet.connect(proxy, stream, StreamId(stream));
    }
    for _ in 0..2 {
        claim_x(&mut fleet, &honest);
    }
    assert!(fleet.proxies().iter().all(|p| p.established));
    // Five identities made up on the spot claim 1,000,000 rps each: the
    // majority of the bucket's reporters, and the median if they counted.
    let mut claims = honest.to_vec();
    let rogues: Vec<String> = (1..=5).map(|i| format!("rogue-{i}")).collect();
    for (i, rogue) in rogues.iter().enumerate() {
        let stream = 10 + i as u64;
        fleet.connect(rogue, stream, StreamId(stream));
        claims.push((rogue.as_str(), stream, 1_000_000));
    }
    for round in 0..10 {
        let load = claim_x(&mut fleet, &claims);
        let bucket = load.get("x").unwrap();
        assert_eq!(offered(&load, "x"), 600.0, "round {round}: {bucket:?}");
        assert_eq!(bucket.load.proxies_reporting, 3);
        assert_eq!(load.stats.claims_ignored, 5);
        // Caught claiming the implausible, they stay on probation.
        assert_eq!(load.stats.proxies_on_probation, 5, "round {round}");
    }
    // A newcomer that claims what its peers do counts in full, and is
    // established after its probation.
    fleet.connect("d", 4, StreamId(4));
    claims.push(("d", 4, 205));
    let load = claim_x(&mut fleet, &claims);
    assert_eq!(offered(&load, "x"), 805.0);
    claim_x(&mut fleet, &claims);
    assert!(
        fleet
            .proxies()
            .iter()
            .filter(|p| p.proxy_id == "d")
            .all(|p| p.established)
    );
}

#[test]
fn plausible_newcomers_count_at_most_the_cap_each() {
    let mut fleet = on_probation(100);
    let mut claims = vec![("a", 1, 200), ("b", 2, 200), ("c", 3, 200)];
    for &(proxy, stream, _) in &claims {
        fleet.connect(proxy, stream, StreamId(stream));
    }
    // All new at once (as after a start): everyone has a say.
    let load = claim_x(&mut fleet, &claims);
    assert_eq!(offered(&load, "x"), 600.0);
    assert_eq!(load.stats.proxies_on_probation, 3);
    let mut fleet = on_probation(1);
    for &(proxy, stream, _) in &claims {
        fleet.connect(proxy, stream, StreamId(stream));
    }
    claim_x(&mut fleet, &claims);
    // Five newcomers each claim 2,000 rps: 10× the established median,
    // implausible for an Envoy of this fleet but below the ignore
    // multiple. Each counts 4× the median.
    let rogues: Vec<String> = (1..=5).map(|i| format!("rogue-{i}")).collect();
    for (i, rogue) in rogues.iter().enumerate() {
        let stream = 10 + i as u64;
        fleet.connect(rogue, stream, StreamId(stream));
        claims.push((rogue.as_str(), stream, 2_000));
    }
    let load = claim_x(&mut fleet, &claims);
    assert_eq!(offered(&load, "x"), 600.0 + 5.0 * 800.0);
}

#[test]
fn a_live_proxy_id_is_only_superseded_by_the_same_principal() {
    let mut fleet = Fleet::new(3);
    let edge: Arc<str> = Arc::from("spiffe://test/edge");
    let rogue: Arc<str> = Arc::from("spiffe://test/rogue");
    assert_eq!(
        fleet.connect_as("edge-1", Arc::clone(&edge), 1, "", StreamId(1)),
        Ok(Connected::New)
    );
    let refused = fleet
        .connect_as("edge-1", Arc::clone(&rogue), 9, "", StreamId(2))
        .unwrap_err();
    assert_eq!(refused.holder.as_deref(), Some("spiffe://test/edge"));
    // The holder keeps reporting on its stream.
    fleet
        .report("edge-1", StreamId(1), &report(1_000, &[("x", 5, 5)]))
        .unwrap();
    assert_eq!(
        fleet.connect_as("edge-1", Arc::clone(&edge), 1, "", StreamId(3)),
        Ok(Connected::Replaced {
            previous: Some(StreamId(1)),
            previous_instance: 1,
        })
    );
    // Once no stream holds it, another principal may take it.
    assert!(fleet.disconnect("edge-1", StreamId(3)));
    assert!(
        fleet
            .connect_as("edge-1", rogue, 9, "", StreamId(4))
            .is_ok()
    );
}

#[test]
fn a_flood_of_unlimited_cells_leaves_room_for_limited_ones() {
    let caps = FleetCaps {
        max_cells_per_proxy: 100,
        max_cells: 40,
        ..FleetCaps::default()
    };
    let mut fleet = Fleet::with_caps(3, caps);
    fleet.connect("flood", 1, StreamId(1));
    fleet.connect("b", 2, StreamId(2));
    let limited = |bucket: &str| bucket.starts_with("limited");
    for round in 0..10 {
        let flood = (0..200)
            .map(|i| cell(&format!("f{round}-{i}"), "", Priority::Unspecified, 1))
            .collect();
        fleet
            .report_classified("flood", StreamId(1), &cells_report(100, flood), &limited)
            .unwrap();
        // A limited bucket seen for the first time while the flood runs.
        let own = (0..5)
            .map(|i| {
                cell(
                    &format!("limited-{round}-{i}"),
                    "",
                    Priority::Unspecified,
                    3,
                )
            })
            .collect();
        fleet
            .report_classified("b", StreamId(2), &cells_report(100, own), &limited)
            .unwrap();
        let load = fleet.tick();
        assert!(
            fleet.cells() <= 40,
            "round {round}: {} cells",
            fleet.cells()
        );
        for i in 0..5 {
            let bucket = format!("limited-{round}-{i}");
            assert!(
                load.get(&bucket).is_some(),
                "round {round}: {bucket} not tracked under the flood"
            );
        }
        assert!(load.stats.rejected_unlimited_share > 0, "round {round}");
    }
}

#[test]
fn unlimited_share_keeps_a_quarter() {
    assert_eq!(unlimited_share(0), 0);
    assert_eq!(unlimited_share(1), 0);
    assert_eq!(unlimited_share(2), 1);
    assert_eq!(unlimited_share(4), 3);
    assert_eq!(unlimited_share(40), 30);
    assert_eq!(unlimited_share(250_000), 187_500);
}

#[test]
fn a_capped_proxys_admissions_count_in_full_up_to_its_counted_part() {
    let mut fleet = Fleet::new(3);
    for (i, proxy) in ["a", "b", "c", "heavy"].iter().enumerate() {
        fleet.connect(proxy, i as u64, StreamId(i as u64));
    }
    // The heavy proxy offers 900 (counted 400) and admits 300, as it does
    // when it applies its directive to its counted part only: its 300 are
    // real admissions, not scaled down to 133.
    for (i, (proxy, offered, admitted)) in [
        ("a", 100, 50),
        ("b", 100, 50),
        ("c", 100, 50),
        ("heavy", 900, 300),
    ]
    .iter()
    .enumerate()
    {
        fleet
            .report(
                proxy,
                StreamId(i as u64),
                &report(1_000, &[("x", *offered, *admitted)]),
            )
            .unwrap();
    }
    let load = fleet.tick();
    let bucket = load.get("x").unwrap();
    assert!((bucket.load.offered_rps - 700.0).abs() < 1e-6, "{bucket:?}");
    assert!(
        (bucket.load.admitted_rps - 450.0).abs() < 1e-6,
        "{bucket:?}"
    );
    // A claim of admitting more than its counted part counts as that part.
    fleet
        .report("heavy", StreamId(3), &report(1_000, &[("x", 900, 900)]))
        .unwrap();
    for (i, proxy) in ["a", "b", "c"].iter().enumerate() {
        fleet
            .report(proxy, StreamId(i as u64), &report(1_000, &[("x", 100, 50)]))
            .unwrap();
    }
    let load = fleet.tick();
    let bucket = load.get("x").unwrap();
    assert!(
        (bucket.load.admitted_rps - 550.0).abs() < 1e-6,
        "{bucket:?}"
    );
}

fn cost_count(bucket: &str, offered: u64, admitted: u64, costs: [f64; 3]) -> BucketCount {
    BucketCount {
        bucket: bucket.to_owned(),
        offered,
        admitted,
        offered_cost: costs[0],
        admitted_cost: costs[1],
        charged_cost: costs[2],
        ..BucketCount::default()
    }
}

/// A budget whose proxies offer requests but count no cost (no cost rule
/// applies to them) has nothing to steer on: its cells are counted for
/// the operator, and a warning is due at the first tick that finds any,
/// then at most every `UNCOSTED_WARNING_TICKS`. A cell counts when any of
/// its proxies counts no cost (another proxy's cost steers it, without
/// this one's requests). Cells with cost, and a request limit's cells
/// without, are not counted.
#[test]
fn a_budgets_cells_without_cost_are_counted_and_warned_about() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    fleet.connect("b", 1, StreamId(2));
    let llm = |tenant: &str, cost: f64| BucketCount {
        tenant: tenant.to_owned(),
        ..cost_count("llm", 10, 5, [cost, cost / 2.0, 0.0])
    };
    let budget = |bucket: &str| (bucket == "llm").then_some(20_000.0);
    let mut tick = |uncosted_cost: f64| {
        let report = Report {
            window_ms: 500,
            buckets: vec![
                llm("beta", uncosted_cost),
                llm("alpha", uncosted_cost),
                llm("", 5000.0),
                cost_count("api", 10, 5, [0.0, 0.0, 0.0]),
            ],
            ..Report::default()
        };
        fleet.report("a", StreamId(1), &report).unwrap();
        let costed = Report {
            window_ms: 500,
            buckets: vec![llm("beta", 5000.0)],
            ..Report::default()
        };
        fleet.report("b", StreamId(2), &costed).unwrap();
        let load = fleet.tick_with(&budget);
        let listed = load
            .get("llm")
            .and_then(|llm| llm.cost)
            .map(|cost| cost.cells_without_cost);
        let counted = u32::try_from(load.stats.uncosted_budget_cells).unwrap();
        assert_eq!(listed, Some(counted));
        (
            load.stats.uncosted_budget_cells,
            fleet.take_uncosted_warning(),
        )
    };
    let (cells, warning) = tick(0.0);
    assert_eq!(cells, 2);
    let warning = warning.unwrap();
    assert_eq!(
        (
            warning.cells,
            warning.bucket.as_ref(),
            warning.tenant.as_ref()
        ),
        (2, "llm", "alpha")
    );
    for _ in 1..UNCOSTED_WARNING_TICKS {
        assert_eq!(tick(0.0), (2, None));
    }
    assert!(tick(0.0).1.is_some(), "reminded");
    // Once the proxies count cost, nothing is counted or due.
    for _ in 0..=UNCOSTED_WARNING_TICKS {
        assert_eq!(tick(500.0), (0, None));
    }
}

/// Beside a proxy that counts cost, one that counts none (an older filter
/// during a rollout) adds no requests behind the cell's cost: its mean
/// cost per request, and the estimate cap derived from it, stay the
/// costed proxy's. Its requests still show among the bucket's.
#[test]
fn a_proxy_without_cost_does_not_thin_a_cells_mean_cost() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    fleet.connect("b", 1, StreamId(2));
    let window = |cost: f64| Report {
        window_ms: 500,
        buckets: vec![cost_count("llm", 10, 5, [cost, cost / 2.0, 0.0])],
        ..Report::default()
    };
    fleet.report("a", StreamId(1), &window(5_000.0)).unwrap();
    fleet.report("b", StreamId(2), &window(0.0)).unwrap();
    let load = fleet.tick_with(&|bucket: &str| (bucket == "llm").then_some(20_000.0));
    let llm = load.get("llm").unwrap();
    let cell = &llm.cells[0].load;
    assert_eq!(cell.offered_rps, 10_000.0);
    assert_eq!(cell.requests_rps, 20.0, "{cell:?}");
    let cost = llm.cost.unwrap();
    assert_eq!(cost.offered_rps, 40.0, "{cost:?}");
    assert_eq!(cost.cells_without_cost, 1);
}

#[test]
fn a_budget_whose_every_cell_counts_no_cost_is_listed_without_cells() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    let report = Report {
        window_ms: 500,
        buckets: vec![
            cost_count("llm", 10, 5, [0.0, 0.0, 0.0]),
            // Not a budget: a request limit's bucket is listed as before.
            cost_count("api", 10, 5, [0.0, 0.0, 0.0]),
        ],
        ..Report::default()
    };
    fleet.report("a", StreamId(1), &report).unwrap();
    let load = fleet.tick_with(&|bucket: &str| (bucket == "llm").then_some(20_000.0));
    let llm = load.get("llm").expect("listed");
    assert!(llm.cells.is_empty());
    assert_eq!(llm.load.offered_rps, 0.0);
    assert_eq!(llm.load.stale_share, 0.0);
    assert_eq!(llm.load.proxies_reporting, 1);
    let cost = llm.cost.unwrap();
    assert_eq!(cost.cells_without_cost, 1);
    assert_eq!(cost.offered_rps, 20.0);
    assert_eq!(load.get("api").unwrap().cells.len(), 1);
}

#[test]
fn a_costed_bucket_is_summed_and_steered_in_cost_per_second() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    fleet.connect("b", 1, StreamId(2));
    let report = |counts| Report {
        window_ms: 500,
        buckets: counts,
        ..Report::default()
    };
    fleet
        .report(
            "a",
            StreamId(1),
            &report(vec![
                cost_count("llm", 10, 4, [6000.0, 2000.0, 2500.0]),
                cost_count("api", 10, 5, [100.0, 50.0, 60.0]),
            ]),
        )
        .unwrap();
    fleet
        .report(
            "b",
            StreamId(2),
            &report(vec![
                cost_count("llm", 5, 2, [3000.0, 1000.0, 900.0]),
                // A stream that ended in a window without new requests is
                // still charged; bad numbers count as nothing.
                cost_count("llm-idle", 0, 0, [0.0, 0.0, 400.0]),
                cost_count("api", 10, 2, [f64::NAN, -1.0, f64::INFINITY]),
            ]),
        )
        .unwrap();
    let load = fleet.tick_with(&|bucket| (bucket == "llm").then_some(20_000.0));
    let llm = load.get("llm").unwrap();
    // Steered on cost: 9,000 offered and 3,000 admitted per 0.5 s.
    assert_eq!(llm.load.offered_rps, 18_000.0);
    assert_eq!(llm.load.admitted_rps, 6_000.0);
    assert_eq!(llm.load.proxies_reporting, 2);
    assert_eq!(llm.cells[0].load.offered_rps, 18_000.0);
    let cost = llm.cost.unwrap();
    assert!(cost.steered);
    assert_eq!(cost.offered_per_s, 18_000.0);
    assert_eq!(cost.charged_per_s, 6_800.0);
    assert_eq!(cost.offered_rps, 30.0);
    assert_eq!(cost.admitted_rps, 12.0);
    // A request limit's bucket keeps its request rates, its cost beside.
    let api = load.get("api").unwrap();
    assert_eq!(api.load.offered_rps, 40.0);
    let cost = api.cost.unwrap();
    assert!(!cost.steered);
    assert_eq!(cost.offered_per_s, 200.0);
    assert_eq!(cost.charged_per_s, 120.0);
    // Charged only: no load to steer, so no cells and no bucket.
    assert!(load.get("llm-idle").is_none());
    // The plain tick steers everything on requests (b's carried).
    fleet
        .report(
            "a",
            StreamId(1),
            &report(vec![cost_count("llm", 10, 4, [6000.0, 2000.0, 0.0])]),
        )
        .unwrap();
    let load = fleet.tick();
    assert_eq!(load.get("llm").unwrap().load.offered_rps, 30.0);
}

/// A claim beyond ten seconds of the budget a request (a filter with no
/// directive for the cell yet counts an estimate as stated) counts ten
/// seconds, offered and admitted; the charged usage is a measure and is
/// summed as reported.
#[test]
fn a_requests_cost_claim_counts_at_most_ten_seconds_of_the_budget() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    let report = Report {
        window_ms: 1000,
        buckets: vec![
            cost_count("llm", 2, 1, [1e9 + 500.0, 1e9, 3e6]),
            cost_count("api", 1, 1, [1e9, 1e9, 0.0]),
        ],
        ..Report::default()
    };
    fleet.report("a", StreamId(1), &report).unwrap();
    let budget = |bucket: &str| (bucket == "llm").then_some(20_000.0);
    let load = fleet.tick_with(&budget);
    let cost = load.get("llm").unwrap().cost.unwrap();
    // Two requests of at most 200,000 tokens a second, one admitted.
    assert_eq!(cost.offered_per_s, 400_000.0);
    assert_eq!(cost.admitted_per_s, 200_000.0);
    assert_eq!(cost.charged_per_s, 3e6);
    assert_eq!(load.get("llm").unwrap().load.offered_rps, 400_000.0);
    // A bucket limited in requests has no budget to bound by.
    assert_eq!(load.get("api").unwrap().cost.unwrap().offered_per_s, 1e9);
}

/// A stream's usage above what its request was counted comes with its
/// charge, often in a window without a request of the cell: it counts, up
/// to what was charged and settled, and lifts no claim beyond that.
#[test]
fn usage_counted_late_is_admitted_in_a_window_without_requests() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    // Two proxies with requests keep the median claim a proxy's with
    // requests (the share cap is not what is tested).
    fleet.connect("b", 1, StreamId(2));
    fleet.connect("c", 1, StreamId(3));
    let report = |count: BucketCount| Report {
        window_ms: 1000,
        buckets: vec![count],
        ..Report::default()
    };
    let budget = |bucket: &str| (bucket == "llm").then_some(20_000.0);
    // Counted 4,000 at its decision, charged 12,000: 8,000 more now.
    let late = |charged: f64, settled: f64| BucketCount {
        bucket: "llm".to_owned(),
        offered_cost: 8_000.0,
        admitted_cost: 8_000.0,
        charged_cost: charged,
        settled_cost: settled,
        ..BucketCount::default()
    };
    let mut requests = charged_cell("", 10_000.0);
    requests.tenant.clear();
    for (charged, settled, admitted) in [
        (12_000.0, 12_000.0, 28_000.0),
        // No more than was charged, nor than was settled.
        (3_000.0, 12_000.0, 23_000.0),
        (12_000.0, 1_000.0, 21_000.0),
    ] {
        fleet
            .report("a", StreamId(1), &report(late(charged, settled)))
            .unwrap();
        for (proxy, stream) in [("b", 2), ("c", 3)] {
            fleet
                .report(proxy, StreamId(stream), &report(requests.clone()))
                .unwrap();
        }
        let load = fleet.tick_with(&budget);
        let cost = load.get("llm").unwrap().cost.unwrap();
        assert_eq!(cost.admitted_per_s, admitted, "{charged} {settled}");
    }
}

/// A fleet with the default share cap whose proxies have their say in
/// the median from their first report (no probation).
fn established_at_once() -> Fleet {
    Fleet::with_caps(
        3,
        FleetCaps {
            share_cap: ShareCap {
                probation_ticks: 0,
                ..ShareCap::default()
            },
            ..FleetCaps::default()
        },
    )
}

#[test]
fn the_share_cap_weighs_cost_claims_on_a_costed_bucket() {
    // Five proxies each offering the same requests, one claiming 100× the
    // cost of the others: on a budget its claim is what is capped.
    let mut fleet = established_at_once();
    for i in 0..5_u64 {
        let id = format!("p{i}");
        fleet.connect(&id, 1, StreamId(i));
        let cost = if i == 0 { 100_000.0 } else { 1_000.0 };
        let report = Report {
            window_ms: 1000,
            buckets: vec![cost_count("llm", 10, 10, [cost, cost, cost])],
            ..Report::default()
        };
        fleet.report(&id, StreamId(i), &report).unwrap();
    }
    let load = fleet.tick_with(&|_| Some(20_000.0));
    let llm = load.get("llm").unwrap();
    assert!(
        llm.load.offered_rps < 10_000.0,
        "the outlier's cost claim counted: {llm:?}"
    );
    assert!(llm.proxy_cap.is_some(), "{llm:?}");
}

/// On a budget, a proxy capped for its share of the requests whose mean
/// cost is plausible has what it admitted counted in full up to its
/// counted share of the requests. Its cost was weighed at the median,
/// so an interval in which its few heavy requests were the ones admitted
/// would otherwise have most of their cost hidden from the balance (the
/// budget then ran over by what the controller did not see). A proxy
/// whose mean cost is beyond the spread is held to its weighed claim as
/// before.
#[test]
fn a_capped_proxys_heavy_admissions_count_in_full_on_a_budget() {
    let admitted_cost = |heavy: BucketCount| {
        let mut fleet = established_at_once();
        let counts = [
            ("a", cost_count("llm", 10, 5, [10_000.0, 5_000.0, 0.0])),
            ("b", cost_count("llm", 10, 5, [10_000.0, 5_000.0, 0.0])),
            ("c", cost_count("llm", 10, 5, [10_000.0, 5_000.0, 0.0])),
            ("heavy", heavy),
        ];
        for (i, (proxy, count)) in counts.into_iter().enumerate() {
            fleet.connect(proxy, 1, StreamId(i as u64));
            let report = Report {
                window_ms: 1000,
                buckets: vec![count],
                ..Report::default()
            };
            fleet.report(proxy, StreamId(i as u64), &report).unwrap();
        }
        let load = fleet.tick_with(&|_| Some(20_000.0));
        let llm = load.get("llm").unwrap();
        assert!(llm.proxy_cap.is_some(), "{llm:?}");
        llm.cost.unwrap().admitted_per_s
    };
    // 60 requests (6x the others: capped to 4x the median) at a mean of
    // 3,000 tokens, within 4x the median's 1,000; 20 admitted, heavy
    // ones, 100,000 tokens. It offered 40 of its 60 requests' worth.
    let plausible = admitted_cost(cost_count("llm", 60, 20, [180_000.0, 100_000.0, 0.0]));
    assert!((plausible - 115_000.0).abs() < 1e-6, "{plausible}");
    // Admitting more requests than its counted share: that share counts.
    let beyond = admitted_cost(cost_count("llm", 60, 60, [180_000.0, 180_000.0, 0.0]));
    assert!((beyond - (15_000.0 + 120_000.0)).abs() < 1e-6, "{beyond}");
    // A mean of 10,000 tokens, beyond the spread: held to its claim.
    let inflated = admitted_cost(cost_count("llm", 60, 20, [600_000.0, 200_000.0, 0.0]));
    assert!(inflated < 15_000.0 + 40_000.0 + 1e-6, "{inflated}");
}

/// The sums do not depend on the order proxies connected in (nor on a
/// hash map's per-process order): the same reports give the same bits.
#[test]
fn the_fleet_sums_proxies_in_one_order_whatever_order_they_came_in() {
    let sums = |ids: &[usize]| {
        let mut fleet = Fleet::new(3);
        for &i in ids {
            fleet.connect(&format!("proxy-{i:02}"), 1, StreamId(i as u64));
        }
        for &i in ids {
            // Rates that are no sums of powers of two: their total
            // depends on the order they are added in.
            let window_ms = [3, 7, 11, 13, 17, 19][i % 6];
            fleet
                .report(
                    &format!("proxy-{i:02}"),
                    StreamId(i as u64),
                    &report(window_ms, &[("api", 1 + i as u64, 1)]),
                )
                .unwrap();
        }
        offered(&fleet.tick(), "api").to_bits()
    };
    let ids: Vec<usize> = (0..24).collect();
    let reversed: Vec<usize> = ids.iter().rev().copied().collect();
    let shuffled: Vec<usize> = ids.iter().map(|i| (i * 7) % 24).collect();
    assert_eq!(sums(&ids), sums(&reversed));
    assert_eq!(sums(&ids), sums(&shuffled));
}

/// A costed cell's window of one tenant on bucket `llm`: 10 requests of
/// 1,000 tokens estimated, all admitted and settled, charged `charged`.
fn charged_cell(tenant: &str, charged: f64) -> BucketCount {
    BucketCount {
        bucket: "llm".to_owned(),
        tenant: tenant.to_owned(),
        offered: 10,
        admitted: 10,
        offered_cost: 10_000.0,
        admitted_cost: 10_000.0,
        charged_cost: charged,
        settled_cost: 10_000.0,
        ..BucketCount::default()
    }
}

/// A report entry with a cost and nothing else is traffic: the settled
/// estimate of a stream its provider charged nothing still weighs in the
/// cell's charges.
#[test]
fn an_entry_holding_only_a_settled_estimate_is_counted() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    let report = |count: BucketCount| Report {
        window_ms: 500,
        buckets: vec![count],
        ..Report::default()
    };
    fleet
        .report("a", StreamId(1), &report(charged_cell("t", 10_000.0)))
        .unwrap();
    let charged_nothing = BucketCount {
        bucket: "llm".to_owned(),
        tenant: "t".to_owned(),
        settled_cost: 5_000.0,
        ..BucketCount::default()
    };
    fleet
        .report("a", StreamId(1), &report(charged_nothing))
        .unwrap();
    let load = fleet.tick_with(&|bucket| (bucket == "llm").then_some(20_000.0));
    let llm = load.get("llm").unwrap();
    let cell = llm.cells.iter().find(|c| &*c.tenant == "t").unwrap();
    assert_eq!(
        cell.charges.unwrap().window,
        CellCharges {
            charged_per_s: 10_000.0,
            settled_per_s: 15_000.0
        }
    );
}

/// A proxy's long run of charges belongs to its cell: a cell charged 40x
/// its estimates counts at 8x; once it is evicted, the next cell handed
/// its id starts a long run of its own and counts as reported.
#[test]
fn a_long_run_of_charges_is_its_own_cell_s_even_when_the_id_is_reused() {
    let mut fleet = Fleet::new(3);
    fleet.connect("a", 1, StreamId(1));
    let budget = |bucket: &str| (bucket == "llm").then_some(20_000.0);
    let send = |fleet: &mut Fleet, counts: Vec<BucketCount>| {
        let report = Report {
            window_ms: 500,
            buckets: counts,
            ..Report::default()
        };
        fleet.report("a", StreamId(1), &report).unwrap();
        fleet.tick_with(&budget)
    };
    let charges = |load: &FleetLoad, tenant: &str| {
        let llm = load.get("llm").unwrap();
        let cell = llm.cells.iter().find(|c| &*c.tenant == tenant).unwrap();
        cell.charges.unwrap().window
    };
    for _ in 0..10 {
        let load = send(&mut fleet, vec![charged_cell("heavy", 400_000.0)]);
        let heavy = charges(&load, "heavy");
        assert_eq!(heavy.settled_per_s, 20_000.0);
        assert!((heavy.charged_per_s - 160_000.0).abs() < 1e-6, "{heavy:?}");
    }
    let heavy = fleet
        .cells
        .find("llm", "heavy", Priority::Unspecified)
        .unwrap();
    // A window without the cell: it is evicted.
    send(&mut fleet, vec![cost_count("api", 1, 1, [1.0, 1.0, 1.0])]);
    assert_eq!(
        fleet.cells.find("llm", "heavy", Priority::Unspecified),
        None
    );
    let load = send(&mut fleet, vec![charged_cell("fresh", 10_000.0)]);
    assert_eq!(
        fleet.cells.find("llm", "fresh", Priority::Unspecified),
        Some(heavy),
        "the id is handed out again"
    );
    assert_eq!(
        charges(&load, "fresh"),
        CellCharges {
            charged_per_s: 20_000.0,
            settled_per_s: 20_000.0
        }
    );
}
