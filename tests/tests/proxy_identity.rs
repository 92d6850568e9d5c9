//! Who speaks for a proxy id, against the real control plane and real
//! Envoys:
//! - a rogue Hello with a live proxy's id and another instance id neither
//!   silences the real proxy nor outlives itself: the real proxy keeps
//!   reporting and the limit holds while the rogue is there and after it
//!   left;
//! - a stream superseded by a newer one of the same instance is closed
//!   with `ABORTED`; the filter reconnects (with backoff) and takes its id
//!   back, so a newcomer cannot silence an established proxy for longer
//!   than one reconnect;
//! - the same under mutual TLS, with a second stream from the Envoy's own
//!   certificate;
//! - a restarted Envoy takes its proxy id over at once, even while the old
//!   process's connection is still open;
//! - two Envoys configured with the same `proxy_id` are counted as two
//!   proxies, loudly (a warning, a metric, `conflict` in `/v1/proxies`),
//!   and hold the limit.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, Instant};

use sluice_integration_tests::certs;
use sluice_integration_tests::control_plane::{AdminClient, ProxiesReply, sample};
use sluice_integration_tests::fake_proxy::{ClientTls, FakeProxy};
use sluice_integration_tests::fleet::{Fleet, FleetOptions};
use sluice_integration_tests::load::{LoadPlan, LoadResult, LoadRun, StreamSpec, Window, rate};
use sluice_integration_tests::wait;
use sluice_proto::v1::Hello;

/// The shape, 3× a limit offered, at a rate where the fleet is
/// accurate: at the 10 rps the counts of a 100 ms report window
/// are a handful of requests, and one Envoy admits 11.0-12.7 rps with no
/// fault at all (at 50 rps, 50.0-50.5; measured on 55a6388). The failures
/// this file guards against admit 2-3× the limit.
const LIMIT_RPS: f64 = 50.0;
const OFFERED_RPS: f64 = 150.0;
const LIMITS: &str = "limits:\n  - bucket: \"acme\"\n    limit_rps: 50\n";
/// How far the admitted rate may be from the limit.
const TOLERANCE: f64 = 0.10;
/// How long the admitted rate is measured.
const MEASURED: Duration = Duration::from_secs(6);

/// The proxies named `proxy_id`.
fn named<'a>(
    proxies: &'a ProxiesReply,
    proxy_id: &'a str,
) -> impl Iterator<Item = &'a sluice_integration_tests::control_plane::ProxyStatus> + 'a {
    proxies
        .proxies
        .iter()
        .filter(move |p| p.proxy_id == proxy_id)
}

/// The instance id the only proxy named `proxy_id` said Hello with.
async fn instance_of(admin: &AdminClient, proxy_id: &str) -> u64 {
    let proxies = admin.proxies().await.unwrap();
    let found: Vec<u64> = named(&proxies, proxy_id).map(|p| p.instance_id).collect();
    assert_eq!(found.len(), 1, "{proxies:?}");
    found[0]
}

/// Waits until the one proxy named `proxy_id` is connected and reported
/// within the last second, and returns the reply that showed it.
async fn reporting(
    admin: &AdminClient,
    proxy_id: &str,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<ProxiesReply> {
    wait::until(what, timeout, Duration::from_millis(50), || async {
        let proxies = admin.proxies().await?;
        let live: Vec<_> = named(&proxies, proxy_id).collect();
        Ok(
            (live.len() == 1 && live[0].connected && live[0].since_last_report_ms < 1_000)
                .then_some(proxies.clone()),
        )
    })
    .await
}

/// The admitted rate of acme in `window`, and a summary for messages.
fn admitted(result: &LoadResult, window: Window) -> (f64, String) {
    let counts = result.tenant_counts(window, "acme");
    assert_eq!(counts.server_errors + counts.errors, 0, "{counts}");
    assert_eq!(
        counts.skipped, 0,
        "the load generator fell behind: {counts}"
    );
    (rate(counts.ok, window), format!("{window:?}: {counts}"))
}

fn near_the_limit(rps: f64) -> bool {
    (rps - LIMIT_RPS).abs() <= LIMIT_RPS * TOLERANCE
}

/// An empty report every 100 ms: a live proxy without traffic.
fn idle(proxy: &mut FakeProxy) {
    proxy.report_every(Duration::from_millis(100), Vec::new());
}

/// A measured window from `at` on.
fn window_from(at: Duration) -> Window {
    Window {
        from: at,
        to: at + MEASURED,
    }
}

async fn sleep_until(load: &LoadRun, at: Duration) {
    tokio::time::sleep(at.saturating_sub(load.elapsed())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rogue_hello_with_a_live_proxys_id_does_not_silence_it() {
    let mut options = FleetOptions::new(LIMITS, 1);
    options.proxy_ids = vec!["victim".to_owned()];
    let fleet = Fleet::start(options).await.unwrap();
    let admin = fleet.control_plane.admin().clone();
    let load = LoadRun::start(LoadPlan::new(
        vec![StreamSpec::new(
            "victim/acme",
            &fleet.url(0).unwrap(),
            "acme",
            OFFERED_RPS,
        )],
        Duration::from_secs(30),
    ))
    .unwrap();
    let converged = admin
        .wait_for_convergence("acme", LIMIT_RPS, 0.2, 1, Duration::from_secs(8))
        .await;
    if converged.is_err() {
        fleet.print_logs();
    }
    converged.unwrap();

    let before = window_from(load.elapsed() + Duration::from_secs(1));
    sleep_until(&load, before.to).await;

    // A client says Hello as the victim, as another instance, and keeps
    // its stream alive (on loopback anyone may; nothing proves who is
    // who). A second one says Hello and nothing more.
    let grpc = fleet.control_plane.grpc_addr();
    let mut rogue = FakeProxy::connect(grpc, "victim", None).await.unwrap();
    let accepted = rogue.first_reply(Duration::from_secs(5)).await.unwrap();
    idle(&mut rogue);
    let mut mute = FakeProxy::connect_with(
        grpc,
        Hello {
            proxy_id: "victim".to_owned(),
            instance_id: 0xbad,
            ..Hello::default()
        },
        None,
    )
    .await
    .unwrap();
    let during = window_from(load.elapsed() + Duration::from_secs(1));
    // A live instance that says nothing is let go once silent for longer
    // than its rates would be carried.
    let mute_ended = mute.ended(Duration::from_secs(5)).await;
    sleep_until(&load, during.to).await;
    let proxies_during = admin.proxies().await.unwrap();
    drop(rogue);
    let after = window_from(load.elapsed() + Duration::from_secs(1));
    sleep_until(&load, after.to).await;
    let proxies_after = admin.proxies().await.unwrap();
    let exposition = admin.metrics().await.unwrap();
    load.stop();
    let result = load.finish().await.unwrap();

    let (admitted_before, counts_before) = admitted(&result, before);
    let (admitted_during, counts_during) = admitted(&result, during);
    let (admitted_after, counts_after) = admitted(&result, after);
    let summary = format!(
        "rogue accepted: {accepted:?}\nmute rogue's stream ended: {mute_ended:?}\n\
         before the rogue: {admitted_before:.1} rps {counts_before}\n\
         with the rogue: {admitted_during:.1} rps {counts_during}\n\
         after it left: {admitted_after:.1} rps {counts_after}\n\
         proxies with the rogue: {proxies_during:?}\nproxies after: {proxies_after:?}\n{}",
        result.timeline(Duration::from_secs(1))
    );
    println!("{summary}");
    let steady = near_the_limit(admitted_before)
        && near_the_limit(admitted_during)
        && near_the_limit(admitted_after);
    if !steady {
        fleet.print_logs();
    }
    assert!(
        near_the_limit(admitted_after),
        "after the rogue left, the victim admitted {admitted_after:.1} rps against {LIMIT_RPS} \
         ({admitted_before:.1} before the rogue)\n{summary}"
    );
    assert!(
        near_the_limit(admitted_during),
        "beside the rogue, the victim admitted {admitted_during:.1} rps against {LIMIT_RPS} \
         ({admitted_before:.1} before the rogue)\n{summary}"
    );
    assert!(near_the_limit(admitted_before), "{summary}");
    let mute_ended = mute_ended.unwrap();
    assert_eq!(mute_ended.code(), tonic::Code::Aborted, "{summary}");
    // Both were counted while the rogue was there, as two instances of one
    // id, and said so; the victim's entry kept reporting throughout.
    let both: Vec<_> = named(&proxies_during, "victim").collect();
    assert_eq!(both.len(), 2, "{summary}");
    assert!(both.iter().all(|p| p.connected && p.conflict), "{summary}");
    let victim: Vec<_> = named(&proxies_after, "victim").collect();
    assert_eq!(victim.len(), 1, "{summary}");
    assert!(
        victim[0].connected && !victim[0].conflict && victim[0].since_last_report_ms < 1_000,
        "{summary}"
    );
    // The rogue that reports is a conflict; the mute one never proved to
    // be a live process.
    assert_eq!(
        sample(&exposition, "sluice_proxy_id_conflicts_total"),
        1.0,
        "{exposition}"
    );
    assert_eq!(
        sample(&exposition, "sluice_streams_superseded_total"),
        1.0,
        "the mute one\n{exposition}"
    );
    accepted.expect("the rogue's stream is served, as a proxy of its own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_superseded_by_its_own_instance_is_closed_and_the_envoy_takes_its_id_back() {
    let mut options = FleetOptions::new(LIMITS, 1);
    options.proxy_ids = vec!["victim".to_owned()];
    let fleet = Fleet::start(options).await.unwrap();
    let admin = fleet.control_plane.admin().clone();
    let load = LoadRun::start(LoadPlan::new(
        vec![StreamSpec::new(
            "victim/acme",
            &fleet.url(0).unwrap(),
            "acme",
            OFFERED_RPS,
        )],
        Duration::from_secs(30),
    ))
    .unwrap();
    let converged = admin
        .wait_for_convergence("acme", LIMIT_RPS, 0.2, 1, Duration::from_secs(8))
        .await;
    if converged.is_err() {
        fleet.print_logs();
    }
    converged.unwrap();
    let instance = instance_of(&admin, "victim").await;
    let before = window_from(load.elapsed() + Duration::from_secs(1));
    sleep_until(&load, before.to).await;

    // The worst a client on loopback can do: say Hello as the victim's own
    // instance (the admin API shows its id). It supersedes the victim's
    // stream, which is closed; the victim reconnects and supersedes it.
    let mut rogue = FakeProxy::connect_with(
        fleet.control_plane.grpc_addr(),
        Hello {
            proxy_id: "victim".to_owned(),
            instance_id: instance,
            ..Hello::default()
        },
        None,
    )
    .await
    .unwrap();
    let accepted = rogue.first_reply(Duration::from_secs(5)).await.unwrap();
    let ended = rogue.ended(Duration::from_secs(8)).await;
    let back = reporting(
        &admin,
        "victim",
        "the victim to report on its own stream again",
        Duration::from_secs(5),
    )
    .await;
    let after = window_from(load.elapsed() + Duration::from_secs(1));
    sleep_until(&load, after.to).await;
    let exposition = admin.metrics().await.unwrap();
    load.stop();
    let result = load.finish().await.unwrap();
    let envoy_log = std::fs::read_to_string(fleet.envoys[0].log_path()).unwrap_or_default();

    let (admitted_before, counts_before) = admitted(&result, before);
    let (admitted_after, counts_after) = admitted(&result, after);
    let summary = format!(
        "rogue accepted: {accepted:?}\nrogue's stream ended: {ended:?}\nvictim back: {back:?}\n\
         before: {admitted_before:.1} rps {counts_before}\nafter: {admitted_after:.1} rps {counts_after}\n{}",
        result.timeline(Duration::from_secs(1))
    );
    println!("{summary}");
    if ended.is_err() || back.is_err() || !near_the_limit(admitted_after) {
        fleet.print_logs();
    }
    let ended = ended
        .unwrap_or_else(|err| panic!("the rogue still holds the victim's id: {err:#}\n{summary}"));
    assert_eq!(ended.code(), tonic::Code::Aborted, "{summary}");
    assert!(
        ended.message().contains("superseded"),
        "a status that says why: {ended:?}"
    );
    let back = back.unwrap();
    assert_eq!(
        named(&back, "victim").next().map(|p| p.instance_id),
        Some(instance),
        "{summary}"
    );
    // The filter saw its stream closed with ABORTED (10) and reconnected
    // after a backoff delay.
    let closed = envoy_log
        .lines()
        .find(|line| line.contains("control-plane stream closed with gRPC status 10"))
        .unwrap_or_else(|| panic!("no close in the Envoy log\n{envoy_log}"));
    assert!(closed.contains("retrying in"), "{closed}");
    assert!(
        near_the_limit(admitted_after) && near_the_limit(admitted_before),
        "the victim admitted {admitted_after:.1} rps against {LIMIT_RPS} \
         ({admitted_before:.1} before)\n{summary}"
    );
    // The victim's stream, then the rogue's.
    assert_eq!(
        sample(&exposition, "sluice_streams_superseded_total"),
        2.0,
        "{exposition}"
    );
    assert_eq!(
        sample(&exposition, "sluice_proxy_id_conflicts_total"),
        0.0,
        "{exposition}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_mutual_tls_a_second_stream_of_the_same_certificate_cannot_silence_the_envoy() {
    let fleet = Fleet::start(
        FleetOptions::new(LIMITS, 1)
            .mutual_tls()
            .proxy_ids(&["edge-a"]),
    )
    .await
    .unwrap();
    let (control_plane, envoy) = (&fleet.control_plane, &fleet.envoys[0]);
    let certs = fleet.certs().unwrap();
    let grpc = control_plane.grpc_addr();
    let admin = control_plane.admin().clone();
    let load = LoadRun::start(LoadPlan::new(
        vec![StreamSpec::new(
            "edge-a/acme",
            &envoy.base_url(),
            "acme",
            OFFERED_RPS,
        )],
        Duration::from_secs(30),
    ))
    .unwrap();
    let converged = admin
        .wait_for_convergence("acme", LIMIT_RPS, 0.2, 1, Duration::from_secs(8))
        .await;
    if converged.is_err() {
        control_plane.print_log();
        envoy.print_log();
    }
    converged.unwrap();
    let instance = instance_of(&admin, "edge-a").await;
    // The Envoy's own certificate, as a process that holds a copy of it
    // (every pod of an Istio deployment shares its identity).
    let own = ClientTls {
        ca: &certs.path(certs::CA),
        cert: &certs.path(certs::CLIENT_CERT),
        key: &certs.path(certs::CLIENT_KEY),
    };

    let before = window_from(load.elapsed() + Duration::from_secs(1));
    sleep_until(&load, before.to).await;

    // Another instance: a proxy of its own, beside the Envoy.
    let mut twin = FakeProxy::connect(grpc, "edge-a", Some(own)).await.unwrap();
    let twin_accepted = twin.first_reply(Duration::from_secs(5)).await.unwrap();
    idle(&mut twin);
    let during = window_from(load.elapsed() + Duration::from_secs(1));
    sleep_until(&load, during.to).await;
    let twin_open = twin.ended(Duration::ZERO).await.is_err();
    let proxies_during = admin.proxies().await.unwrap();
    drop(twin);

    // The Envoy's own instance id: it supersedes the Envoy once, and the
    // Envoy takes its id back.
    let mut same = FakeProxy::connect_with(
        grpc,
        Hello {
            proxy_id: "edge-a".to_owned(),
            instance_id: instance,
            ..Hello::default()
        },
        Some(own),
    )
    .await
    .unwrap();
    let same_ended = same.ended(Duration::from_secs(8)).await;
    let back = reporting(
        &admin,
        "edge-a",
        "the Envoy to report on its own stream again",
        Duration::from_secs(5),
    )
    .await;
    let after = window_from(load.elapsed() + Duration::from_secs(1));
    sleep_until(&load, after.to).await;
    load.stop();
    let result = load.finish().await.unwrap();

    let (admitted_before, counts_before) = admitted(&result, before);
    let (admitted_during, counts_during) = admitted(&result, during);
    let (admitted_after, counts_after) = admitted(&result, after);
    let summary = format!(
        "twin accepted: {twin_accepted:?}, open after the window: {twin_open}\n\
         before the twin: {admitted_before:.1} rps {counts_before}\n\
         beside the twin: {admitted_during:.1} rps {counts_during}\n\
         same instance ended: {same_ended:?}\nEnvoy back: {back:?}\n\
         after: {admitted_after:.1} rps {counts_after}\nproxies beside the twin: {proxies_during:?}\n{}",
        result.timeline(Duration::from_secs(1))
    );
    println!("{summary}");
    let failed = !near_the_limit(admitted_before)
        || !near_the_limit(admitted_during)
        || !near_the_limit(admitted_after)
        || same_ended.is_err()
        || back.is_err();
    if failed {
        control_plane.print_log();
        envoy.print_log();
    }
    assert!(near_the_limit(admitted_before), "{summary}");
    assert!(
        near_the_limit(admitted_during),
        "beside the twin the Envoy admitted {admitted_during:.1} rps against {LIMIT_RPS} \
         ({admitted_before:.1} before)\n{summary}"
    );
    assert!(twin_open, "the twin is served, not flapped\n{summary}");
    let both: Vec<_> = named(&proxies_during, "edge-a").collect();
    assert_eq!(both.len(), 2, "{summary}");
    assert!(both.iter().all(|p| p.connected && p.conflict), "{summary}");
    let same_ended = same_ended
        .unwrap_or_else(|err| panic!("the second stream still holds the id: {err:#}\n{summary}"));
    assert_eq!(same_ended.code(), tonic::Code::Aborted, "{summary}");
    back.unwrap();
    assert!(
        near_the_limit(admitted_after),
        "after, the Envoy admitted {admitted_after:.1} rps against {LIMIT_RPS} \
         ({admitted_before:.1} before)\n{summary}"
    );
    twin_accepted.expect("the twin is served as a proxy of its own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_envoy_takes_over_its_proxy_id_while_the_old_connection_lingers() {
    let mut options = FleetOptions::new(LIMITS, 1);
    options.proxy_ids = vec!["edge".to_owned(), "edge".to_owned()];
    let mut fleet = Fleet::start(options).await.unwrap();
    let admin = fleet.control_plane.admin().clone();
    let first = reporting(
        &admin,
        "edge",
        "the first Envoy to report",
        Duration::from_secs(5),
    )
    .await;
    if first.is_err() {
        fleet.print_logs();
    }
    first.unwrap();
    let old_instance = instance_of(&admin, "edge").await;
    // The old process freezes with its connection open (a host that hung
    // or fell off the network keeps it open until keepalive gives up), and
    // a new process with the same proxy id starts.
    fleet.envoys[0].pause().unwrap();
    fleet.add_envoy().await.unwrap();
    let ready = Instant::now();
    let taken = wait::until(
        "the new process to hold the proxy id alone",
        Duration::from_secs(3),
        Duration::from_millis(50),
        || async {
            let proxies = admin.proxies().await?;
            let live: Vec<_> = named(&proxies, "edge").collect();
            Ok((live.len() == 1
                && live[0].instance_id != old_instance
                && live[0].connected
                && !live[0].conflict
                && live[0].since_last_report_ms < 1_000)
                .then_some(proxies.clone()))
        },
    )
    .await;
    let took = ready.elapsed();
    let exposition = admin.metrics().await.unwrap();
    fleet.envoys[0].kill().unwrap();
    if taken.is_err() {
        fleet.print_logs();
    }
    let taken = taken.unwrap();
    println!("taken over {took:?} after the new Envoy was ready: {taken:?}");
    assert_eq!(
        sample(&exposition, "sluice_proxy_id_conflicts_total"),
        0.0,
        "a restart is not a conflict\n{exposition}"
    );
    assert!(
        sample(&exposition, "sluice_streams_superseded_total") >= 1.0,
        "the old stream was closed\n{exposition}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_with_one_proxy_id_are_counted_as_two_and_hold_the_limit() {
    let mut options = FleetOptions::new(LIMITS, 2);
    options.proxy_ids = vec!["twin".to_owned(), "twin".to_owned()];
    let fleet = Fleet::start(options).await.unwrap();
    let admin = fleet.control_plane.admin().clone();
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &fleet.url(0).unwrap(), "acme", OFFERED_RPS / 2.0),
            StreamSpec::new("B/acme", &fleet.url(1).unwrap(), "acme", OFFERED_RPS / 2.0),
        ],
        Duration::from_secs(30),
    ))
    .unwrap();
    // Not waited for by convergence: the failure this guards against never
    // counts two proxies.
    let window = Window::secs(5.0, 13.0);
    sleep_until(&load, window.from + Duration::from_secs(4)).await;
    let proxies = admin.proxies().await.unwrap();
    let buckets = admin.buckets().await.unwrap();
    sleep_until(&load, window.to).await;
    let exposition = admin.metrics().await.unwrap();
    load.stop();
    let result = load.finish().await.unwrap();
    let log = std::fs::read_to_string(fleet.control_plane.log_path()).unwrap_or_default();

    let (fleet_admitted, counts) = admitted(&result, window);
    let summary = format!(
        "fleet admitted {fleet_admitted:.1} rps {counts}\nproxies: {proxies:?}\nbuckets: {buckets:?}\n{}\n{}",
        result.summary(window),
        result.timeline(Duration::from_secs(1))
    );
    println!("{summary}");
    if !near_the_limit(fleet_admitted) {
        fleet.print_logs();
    }
    assert!(
        near_the_limit(fleet_admitted),
        "two Envoys named twin admitted {fleet_admitted:.1} rps against {LIMIT_RPS}\n{summary}"
    );
    let twins: Vec<_> = named(&proxies, "twin").collect();
    assert_eq!(twins.len(), 2, "{summary}");
    assert!(twins.iter().all(|p| p.connected && p.conflict), "{summary}");
    assert_ne!(twins[0].instance_id, twins[1].instance_id, "{summary}");
    assert_eq!(
        buckets.bucket("acme").map(|b| b.proxies_reporting),
        Some(2),
        "{summary}"
    );
    assert!(
        sample(&exposition, "sluice_proxy_id_conflicts_total") >= 1.0,
        "{exposition}"
    );
    assert!(
        log.lines().any(|line| line.contains("WARN")
            && line.contains("twin")
            && line.contains("share one proxy id")),
        "a warning names the conflict\n{log}"
    );
}
