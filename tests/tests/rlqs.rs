//! Envoy's own `rate_limit_quota` filter with the control plane as its
//! RLQS server (`envoy/rlqs.yaml`), no wasm:
//! - three Envoys (two workers each) with 60/30/10 skew at 4× a fleet limit
//!   admit the limit ± 10 %, and follow a limit change;
//! - a mixed fleet (one Envoy with the Sluice filter, two with
//!   `rate_limit_quota`) shares one limit.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, Instant};

use sluice_integration_tests::control_plane::{ControlPlane, sample};
use sluice_integration_tests::envoy::Envoy;
use sluice_integration_tests::fleet::{Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window, rate, within};
use sluice_integration_tests::raw_grpc::RawCodec;
use sluice_integration_tests::rlqs;
use sluice_integration_tests::wait;

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 150
"#;

fn print_logs(control_plane: &ControlPlane, envoys: &[&Envoy]) {
    control_plane.print_log();
    for envoy in envoys {
        envoy.print_log();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_rlqs_envoys_share_a_fleet_limit_and_follow_a_change() {
    let mut fleet = Fleet::start(FleetOptions::control_plane_only(LIMITS))
        .await
        .unwrap();
    for (name, proxy_id) in [
        ("rlqs-a", "rlqs-a"),
        ("rlqs-b", "rlqs-b"),
        ("rlqs-c", "rlqs-c"),
    ] {
        fleet
            .start_envoy(&rlqs::envoy(name, proxy_id))
            .await
            .unwrap();
    }
    let (control_plane, envoys) = (&fleet.control_plane, &fleet.envoys);
    // An upper bound: the load stops 10 s after the new assignments leave.
    let duration = Duration::from_secs(34);
    // 600 rps, 4× the limit: 60 / 30 / 10 %.
    let streams = envoys
        .iter()
        .zip([360.0, 180.0, 60.0])
        .enumerate()
        .map(|(i, (envoy, rps))| {
            StreamSpec::new(&format!("{i}/acme"), &envoy.base_url(), "acme", rps)
        })
        .collect();
    let started = Instant::now();
    let load = LoadRun::start(LoadPlan::new(streams, duration)).unwrap();

    // Envoy reports every 5 s: by 12 s two reports of full load are in.
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(started.elapsed())).await;
    let buckets_before = control_plane.admin().buckets().await.unwrap();
    let actions_before = sample(
        &control_plane.admin().metrics().await.unwrap(),
        "sluice_rlqs_bucket_actions_sent_total",
    );
    control_plane
        .admin()
        .put_limit("acme", 300.0)
        .await
        .unwrap();
    let changed_at = started.elapsed();
    // The new assignments leave within two control intervals (plus the
    // admin write's own interval).
    let deadline = Instant::now() + Duration::from_millis(3 * 200 + 300);
    let mut actions_after = actions_before;
    while Instant::now() < deadline && actions_after <= actions_before {
        tokio::time::sleep(Duration::from_millis(50)).await;
        actions_after = sample(
            &control_plane.admin().metrics().await.unwrap(),
            "sluice_rlqs_bucket_actions_sent_total",
        );
    }
    let pushed_after = started.elapsed() - changed_at;
    // Measured for 9 s from a second after the new assignments left.
    let pushed_at = load.elapsed();
    let after = Window {
        from: pushed_at + Duration::from_secs(1),
        to: pushed_at + Duration::from_secs(10),
    };
    tokio::time::sleep(after.to.saturating_sub(load.elapsed())).await;
    load.stop();
    let result = load.finish().await.unwrap();
    let buckets_after = control_plane.admin().buckets().await.unwrap();

    let before = Window::secs(12.0, 20.0);
    let summary = format!(
        "{}{}control plane at 20 s: {buckets_before:?}\nat the end: {buckets_after:?}\nassignments pushed {pushed_after:?} after the change\n{}",
        result.summary(before),
        result.summary(after),
        result.timeline(Duration::from_secs(1))
    );
    println!("{summary}");
    let admitted_before = rate(result.tenant_counts(before, "acme").ok, before);
    let admitted_after = rate(result.tenant_counts(after, "acme").ok, after);
    let counts = result.tenant_counts(Window::secs(0.0, 3600.0), "acme");
    let ok = within(admitted_before, 150.0, 0.10)
        && within(admitted_after, 300.0, 0.10)
        && actions_after > actions_before;
    if !ok {
        print_logs(control_plane, &envoys.iter().collect::<Vec<_>>());
    }
    assert_eq!(counts.server_errors + counts.errors, 0, "{summary}");
    assert_eq!(
        counts.skipped, 0,
        "the load generator fell behind\n{summary}"
    );
    assert!(
        within(admitted_before, 150.0, 0.10),
        "admitted {admitted_before:.1} rps, limit 150\n{summary}"
    );
    assert!(
        actions_after > actions_before,
        "no assignment pushed after the change\n{summary}"
    );
    assert!(
        within(admitted_after, 300.0, 0.10),
        "admitted {admitted_after:.1} rps after the change to 300\n{summary}"
    );
    let bucket = buckets_before.bucket("acme").unwrap();
    assert_eq!(bucket.proxies_reporting, 3, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wasm_envoy_and_two_rlqs_envoys_share_one_limit() {
    let mut fleet = Fleet::start(FleetOptions::new(LIMITS, 1).proxy_ids(&["wasm-a"]))
        .await
        .unwrap();
    for name in ["rlqs-b", "rlqs-c"] {
        fleet.start_envoy(&rlqs::envoy(name, name)).await.unwrap();
    }
    let (b, c) = (&fleet.envoys[1], &fleet.envoys[2]);
    let duration = Duration::from_secs(22);
    let streams = vec![
        StreamSpec::new("wasm/acme", &fleet.url(0).unwrap(), "acme", 200.0),
        StreamSpec::new("rlqs-b/acme", &b.base_url(), "acme", 200.0),
        StreamSpec::new("rlqs-c/acme", &c.base_url(), "acme", 200.0),
    ];
    let load = LoadRun::start(LoadPlan::new(streams, duration)).unwrap();
    tokio::time::sleep(Duration::from_secs(16)).await;
    let buckets = fleet.control_plane.admin().buckets().await.unwrap();
    let result = load.finish().await.unwrap();

    let window = Window::secs(12.0, duration.as_secs_f64());
    let summary = format!(
        "{}control plane at 16 s: {buckets:?}\n{}",
        result.summary(window),
        result.timeline(Duration::from_secs(1))
    );
    println!("{summary}");
    let counts = result.tenant_counts(window, "acme");
    let admitted = rate(counts.ok, window);
    if !within(admitted, 150.0, 0.10) {
        fleet.print_logs();
    }
    assert_eq!(counts.server_errors + counts.errors, 0, "{summary}");
    assert!(
        within(admitted, 150.0, 0.10),
        "the mixed fleet admitted {admitted:.1} rps, limit 150\n{summary}"
    );
    let bucket = buckets.bucket("acme").unwrap();
    assert_eq!(bucket.proxies_reporting, 3, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assignments_outlive_a_control_plane_outage_and_resume_without_a_step() {
    // The shortest TTL, 1 s: assignments expire early in the outage, and
    // Envoy's `expired_assignment_behavior` (each Envoy's static share,
    // 75 rps) must hold for most of it and until the new control plane
    // assigns again.
    let limits = format!("directive_ttl_ms: 1000\n{LIMITS}");
    let mut fleet = Fleet::start(FleetOptions::control_plane_only(&limits))
        .await
        .unwrap();
    for name in ["rlqs-a", "rlqs-b"] {
        fleet
            .start_envoy(&rlqs::envoy_with_fallback(name, name, 75))
            .await
            .unwrap();
    }
    let (a, b, control_plane) = (&fleet.envoys[0], &fleet.envoys[1], &mut fleet.control_plane);
    // Killed at 12 s (two reports in), down for 5 s (4 s of it past the
    // TTL), then measured for 12 s after the restart.
    let outage_length = Duration::from_secs(5);
    let measured_after = Duration::from_secs(12);
    let duration = Duration::from_secs(12) + outage_length + measured_after;
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("a/acme", &a.base_url(), "acme", 450.0),
            StreamSpec::new("b/acme", &b.base_url(), "acme", 150.0),
        ],
        duration,
    ))
    .unwrap();
    tokio::time::sleep(Duration::from_secs(12).saturating_sub(load.elapsed())).await;
    control_plane.kill().unwrap();
    let killed_at = load.elapsed();
    tokio::time::sleep(outage_length).await;
    let restart_at = load.elapsed();
    control_plane.restart().await.unwrap();
    let reconnected = control_plane
        .admin()
        .wait_for_bucket(
            "acme",
            "both Envoys to report to the new control plane",
            Duration::from_secs(12),
            Duration::from_millis(200),
            |b| (b.proxies_reporting == 2).then_some(()),
        )
        .await;
    tokio::time::sleep((restart_at + measured_after).saturating_sub(load.elapsed())).await;
    load.stop();
    let stopped_at = load.elapsed().min(duration);
    let result = load.finish().await.unwrap();

    let before = Window::secs(7.0, killed_at.as_secs_f64());
    let outage = Window {
        from: killed_at,
        to: restart_at,
    };
    let after = Window {
        from: restart_at,
        to: stopped_at,
    };
    let summary = format!(
        "{}{}{}killed at {killed_at:?}, restarted at {restart_at:?}\n{}",
        result.summary(before),
        result.summary(outage),
        result.summary(after),
        result.timeline(Duration::from_secs(1))
    );
    println!("{summary}");
    let admitted = |window| rate(result.tenant_counts(window, "acme").ok, window);
    let (before_rps, outage_rps, after_rps) = (admitted(before), admitted(outage), admitted(after));
    // Every second after the restart, too: no step.
    let worst_second = (restart_at.as_secs()..stopped_at.as_secs())
        .map(|s| admitted(Window::secs(s as f64, s as f64 + 1.0)))
        .fold(0.0_f64, f64::max);
    let ok = reconnected.is_ok()
        && within(before_rps, 150.0, 0.10)
        && within(outage_rps, 150.0, 0.10)
        && within(after_rps, 150.0, 0.10)
        && worst_second <= 150.0 * 1.25;
    if !ok {
        print_logs(control_plane, &[a, b]);
    }
    reconnected.unwrap();
    assert!(
        within(before_rps, 150.0, 0.10),
        "before: {before_rps:.1}\n{summary}"
    );
    assert!(
        within(outage_rps, 150.0, 0.10),
        "outage: {outage_rps:.1}\n{summary}"
    );
    assert!(
        within(after_rps, 150.0, 0.10),
        "after: {after_rps:.1}\n{summary}"
    );
    assert!(
        worst_second <= 150.0 * 1.25,
        "a second at {worst_second:.0} rps after the restart\n{summary}"
    );
}

mod rogue {
    use std::collections::HashMap;

    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaUsageReports,
    };
    use envoy_types::pb::google::protobuf::Duration as ProtoDuration;

    /// A usage for `{bucket: name}`.
    pub(crate) fn usage(name: &str, seconds: i64, allowed: u64) -> BucketQuotaUsage {
        BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: HashMap::from([("bucket".to_owned(), name.to_owned())]),
            }),
            time_elapsed: Some(ProtoDuration { seconds, nanos: 0 }),
            num_requests_allowed: allowed,
            num_requests_denied: 0,
        }
    }

    /// Opens an RLQS stream as `proxy_id` and sends `messages`; returns the
    /// stream's first answer (or error) and keeps the stream open until
    /// the returned sender is dropped.
    pub(crate) async fn send(
        grpc: std::net::SocketAddr,
        proxy_id: &str,
        messages: Vec<Vec<BucketQuotaUsage>>,
    ) -> (
        tokio::sync::mpsc::Sender<RateLimitQuotaUsageReports>,
        Result<Option<usize>, tonic::Status>,
    ) {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://{grpc}"))
            .await
            .unwrap()
            .max_decoding_message_size(64 << 20);
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        for usages in messages {
            sender
                .send(RateLimitQuotaUsageReports {
                    domain: "rogue".to_owned(),
                    bucket_quota_usages: usages,
                })
                .await
                .unwrap();
        }
        let mut request =
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(receiver));
        request
            .metadata_mut()
            .insert("x-sluice-proxy-id", proxy_id.parse().unwrap());
        let first = match client.stream_rate_limit_quotas(request).await {
            Ok(response) => {
                let mut inbound = response.into_inner();
                tokio::time::timeout(std::time::Duration::from_secs(5), inbound.message())
                    .await
                    .map_err(|_| tonic::Status::deadline_exceeded("no answer"))
                    .and_then(|m| m.map(|m| m.map(|r| r.bucket_action.len())))
            }
            Err(status) => Err(status),
        };
        (sender, first)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_usage_reports_are_refused_and_the_state_stays_bounded() {
    let fleet = Fleet::start(FleetOptions::control_plane_only(LIMITS))
        .await
        .unwrap();
    let control_plane = &fleet.control_plane;
    let grpc = control_plane.grpc_addr();

    let mut no_id = rogue::usage("x", 5, 1);
    no_id.bucket_id = None;
    let absurd = rogue::usage("acme", 5, u64::MAX / 2);
    let negative = rogue::usage("acme", -5, 10);
    let (_bad, first) = rogue::send(grpc, "rogue-a", vec![vec![no_id, negative, absurd]]).await;
    // 100,000 distinct bucket ids in one message: twice the per-proxy cap.
    let flood: Vec<_> = (0..100_000)
        .map(|i| rogue::usage(&format!("flood-{i}"), 5, 1))
        .collect();
    let (_flood, flood_first) = rogue::send(grpc, "rogue-b", vec![flood]).await;
    // Read once every usage is counted and acme is in the fleet sum, within
    // the second the checks below always had.
    let admin = control_plane.admin();
    let counted = wait::until(
        "the refused usages counted and acme tracked",
        Duration::from_secs(1),
        Duration::from_millis(50),
        || async move {
            let exposition = admin.metrics().await?;
            let buckets = admin.buckets().await?;
            let counted = sample(
                &exposition,
                r#"sluice_rlqs_usages_refused_total{reason="over_cap"}"#,
            ) >= 50_000.0
                && sample(
                    &exposition,
                    r#"sluice_rlqs_usages_refused_total{reason="no_bucket"}"#,
                ) >= 1.0
                && sample(
                    &exposition,
                    r#"sluice_rlqs_usages_refused_total{reason="negative_elapsed"}"#,
                ) >= 1.0;
            Ok((counted && buckets.bucket("acme").is_some()).then_some((exposition, buckets)))
        },
    )
    .await;
    // Past the second, the checks below say what is missing.
    let (exposition, buckets) = match counted {
        Ok(read) => read,
        Err(err) => {
            println!("{err:#}");
            (
                admin.metrics().await.unwrap(),
                admin.buckets().await.unwrap(),
            )
        }
    };
    let healthy = control_plane.admin().healthy().await.unwrap();
    let summary = format!("first answers: {first:?} / {flood_first:?}\n");
    let refused = |reason: &str| {
        sample(
            &exposition,
            &format!("sluice_rlqs_usages_refused_total{{reason=\"{reason}\"}}"),
        )
    };
    if !(refused("no_bucket") >= 1.0 && refused("over_cap") >= 50_000.0) {
        control_plane.print_log();
    }
    assert!(healthy, "{summary}");
    assert!(
        first.is_ok(),
        "the rogue's valid usage still gets an answer\n{summary}"
    );
    assert_eq!(refused("no_bucket"), 1.0, "{summary}{exposition}");
    assert_eq!(refused("negative_elapsed"), 1.0, "{summary}{exposition}");
    assert_eq!(refused("over_cap"), 50_000.0, "{summary}{exposition}");
    assert!(
        sample(
            &exposition,
            r#"sluice_reports_clamped_total{reason="cell_ceiling"}"#
        ) >= 1.0,
        "{exposition}"
    );
    // Flood cells are unlimited: once they fill three quarters of the
    // proxy's cap (the rest is kept for limited buckets) the others are
    // refused as such.
    let rejected = |reason: &str| {
        sample(
            &exposition,
            &format!("sluice_cells_rejected_total{{reason=\"{reason}\"}}"),
        )
    };
    assert!(
        rejected("proxy_cap") + rejected("unlimited_share") >= 50_000.0,
        "{exposition}"
    );
    assert!(rejected("unlimited_share") > 0.0, "{exposition}");
    let tracked = sample(&exposition, "sluice_cells_tracked");
    assert!(tracked <= 50_001.0, "cells tracked: {tracked}");
    // The absurd claim is clamped to the per-cell ceiling (1,000,000 rps),
    // not 10^18.
    let acme = buckets.bucket("acme").expect("acme is tracked");
    assert!(acme.offered_rps <= 1_000_001.0, "{acme:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_usage_report_closes_only_its_stream() {
    let fleet = Fleet::start(FleetOptions::control_plane_only(LIMITS))
        .await
        .unwrap();
    let control_plane = &fleet.control_plane;
    let grpc = control_plane.grpc_addr();
    // A well-behaved stream first, which must survive the bad one.
    let (_good, good_first) =
        rogue::send(grpc, "good", vec![vec![rogue::usage("acme", 5, 10)]]).await;

    let channel = tonic::transport::Channel::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.unwrap();
    // Field 2 (bucket_quota_usages) as a length-delimited field that claims
    // more bytes than follow: not protobuf.
    let garbage = vec![0x12, 0xff, 0xff, 0x01, 0x02];
    let request = tonic::Request::new(tokio_stream::iter(vec![garbage]));
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
    );
    let outcome = match client.streaming(request, path, RawCodec).await {
        Ok(response) => {
            let mut inbound = response.into_inner();
            tokio::time::timeout(Duration::from_secs(5), inbound.message())
                .await
                .map(|m| m.map(|m| m.map(|b| b.len())))
        }
        Err(status) => Ok(Err(status)),
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let healthy = control_plane.admin().healthy().await.unwrap();
    let proxies = control_plane.admin().proxies().await.unwrap();
    let summary = format!("bad stream: {outcome:?}\ngood stream: {good_first:?}\n{proxies:?}");
    assert!(healthy, "{summary}");
    // The bad stream ends with a status (or is closed), not with data.
    assert!(
        !matches!(outcome, Ok(Ok(Some(_)))),
        "the malformed stream was answered\n{summary}"
    );
    assert!(good_first.is_ok(), "{summary}");
    let good = proxies.proxies.iter().find(|p| p.proxy_id == "good");
    assert!(good.is_some_and(|p| p.connected), "{summary}");
}
