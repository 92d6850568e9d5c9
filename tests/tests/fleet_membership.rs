//! Proxies joining and leaving a running fleet: a new Envoy holds the
//! current directives as soon as its stream is open (the first message on a
//! stream is a snapshot), every Envoy's directive age shows in the proxies
//! view, and an Envoy that goes away stops counting toward the fleet rate
//! within a bounded time.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use sluice_integration_tests::control_plane::BucketStatus;
use sluice_integration_tests::envoy::Envoy;
use sluice_integration_tests::fleet::{Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window};
use sluice_integration_tests::wait;

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 100
"#;

/// The value of the first `/stats` line whose name contains `name`.
async fn stat(envoy: &Envoy, name: &str) -> Option<f64> {
    let text = envoy.stats(name).await.ok()?;
    text.lines()
        .find(|line| line.contains(name))
        .and_then(|line| line.rsplit(": ").next())
        .and_then(|value| value.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_added_mid_run_holds_the_directives_at_once() {
    let mut options = FleetOptions::new(LIMITS, 1);
    options.filter = serde_json::json!({"zone": "zone-1"});
    let mut fleet = Fleet::start(options).await.unwrap();
    let interval = fleet.options.control_interval();
    let load = LoadRun::start(LoadPlan::new(
        vec![StreamSpec::new(
            "A/acme",
            &fleet.url(0).unwrap(),
            "acme",
            300.0,
        )],
        // An upper bound: the load stops once the checks are done.
        Duration::from_secs(4),
    ))
    .unwrap();
    // Let the control plane settle on a drop ratio for acme.
    let admin = fleet.control_plane.admin().clone();
    admin
        .wait_for_bucket(
            "acme",
            "acme to be shed",
            Duration::from_secs(5),
            Duration::from_millis(100),
            |b| (b.drop_ratio > 0.5).then_some(()),
        )
        .await
        .unwrap();

    // The newcomer sends no acme traffic yet, so nothing it reports could
    // have caused a directive: whatever it holds came with the snapshot.
    let added = fleet.add_envoy().await.unwrap();
    let newcomer = &fleet.envoys[added];
    let holds = wait::until(
        "the new Envoy to hold acme's directive",
        // Stream set-up on the filter's first tick, the snapshot, and the
        // gauge flush on the next tick; a push cycle is not needed.
        interval * 2 + Duration::from_millis(800),
        Duration::from_millis(50),
        || async move {
            Ok(stat(newcomer, "sluice.directive_buckets")
                .await
                .filter(|&buckets| buckets >= 1.0)
                .map(|_| ()))
        },
    )
    .await;
    // While the control plane runs normally, a delta or a heartbeat (at
    // least every second) keeps every proxy's directives young, and each
    // proxy says how young in its reports.
    let expected = fleet.envoys.len();
    let ages = wait::until(
        "every Envoy to report the age of its directives",
        Duration::from_secs(3),
        Duration::from_millis(100),
        || {
            let admin = admin.clone();
            async move {
                let reply = admin.proxies().await?;
                let ages: Vec<(String, String, u64)> = reply
                    .proxies
                    .iter()
                    .filter(|p| p.connected)
                    .filter_map(|p| Some((p.proxy_id.clone(), p.zone.clone(), p.directive_age_ms?)))
                    .collect();
                Ok((ages.len() == expected).then_some(ages))
            }
        },
    )
    .await;
    // The load was there to make acme shed; only its answers are checked.
    load.stop();
    let result = load.finish().await.unwrap();
    if holds.is_err() || ages.is_err() {
        fleet.print_logs();
    }
    holds.unwrap();
    let ages = ages.unwrap();
    // One heartbeat period, a control interval and a report interval of
    // slack; a stalled control plane would let it grow to the TTL.
    let young = Duration::from_secs(1) + interval + Duration::from_millis(250);
    for (proxy_id, zone, age_ms) in &ages {
        assert_eq!(
            zone, "zone-1",
            "{proxy_id}: the zone from the filter config"
        );
        assert!(
            Duration::from_millis(*age_ms) <= young,
            "{proxy_id}: directives {age_ms} ms old: {ages:?}"
        );
    }
    let counts = result.tenant_counts(Window::secs(0.0, 3600.0), "acme");
    assert_eq!(counts.server_errors, 0, "{counts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_that_goes_away_stops_counting() {
    let mut fleet = Fleet::start(FleetOptions::new(LIMITS, 2)).await.unwrap();
    let interval = fleet.options.control_interval();
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &fleet.url(0).unwrap(), "acme", 150.0),
            StreamSpec::new("B/acme", &fleet.url(1).unwrap(), "acme", 150.0),
        ],
        Duration::from_secs(8),
    ))
    .unwrap();
    let admin = fleet.control_plane.admin().clone();
    let reporting = |count: u32| {
        move |b: &BucketStatus| (b.proxies_reporting == count).then_some(b.offered_rps)
    };
    // The first report of the second proxy may carry only part of an
    // interval's requests, so the fleet's rate is read once it has caught up.
    let offered_by_two = admin
        .wait_for_bucket(
            "acme",
            "both proxies' load to be counted",
            Duration::from_secs(5),
            Duration::from_millis(100),
            |b| reporting(2)(b).filter(|&rps| rps > 250.0),
        )
        .await;
    if offered_by_two.is_err() {
        load.stop();
        fleet.print_logs();
    }
    let offered_by_two = offered_by_two.unwrap();

    fleet.envoys[1].stop().unwrap();
    // A silent proxy's rates are carried for 3 control intervals (so a quick
    // reconnect does not make the fleet rate dip), then dropped.
    let offered_by_one = admin
        .wait_for_bucket(
            "acme",
            "the stopped proxy to stop counting",
            interval * 6 + Duration::from_secs(1),
            Duration::from_millis(50),
            reporting(1),
        )
        .await;
    load.stop();
    let _ = load.finish().await.unwrap();
    if offered_by_one.is_err() {
        fleet.print_logs();
    }
    let offered_by_one = offered_by_one.unwrap();
    assert!(
        offered_by_two > 250.0 && offered_by_one < 200.0,
        "offered by two {offered_by_two:.1} rps, by one {offered_by_one:.1} rps"
    );
}
