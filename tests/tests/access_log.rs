//! "Why was this request throttled", read from a real Envoy access log:
//! `envoy/access-log.yaml` prints each request's status, the filter's
//! decision record (`%FILTER_STATE(wasm.sluice:PLAIN)%`), the header the
//! filter adds upstream when no fresh directive decided, and three of the
//! record's fields from dynamic metadata namespace `sluice`
//! (`%DYNAMIC_METADATA(sluice:result)%`, copied there by the example's Lua
//! filter).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use sluice_integration_tests::envoy::Envoy;
use sluice_integration_tests::fleet::{
    ControlPlaneTarget, EnvoySpec, Fleet, FleetOptions, TestDir, free_loopback_addr,
};
use sluice_integration_tests::load::{Counts, LoadPlan, LoadRun, StreamSpec};
use sluice_integration_tests::wait;

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 20
"#;

/// Envoy on `envoy/access-log.yaml`, its access log written to `log`.
fn access_logged(log: &Path) -> EnvoySpec {
    let log = log.display().to_string();
    EnvoySpec::repo("envoy", "access-log.yaml")
        .filter(json!({"report_interval_ms": 100}))
        // Envoy's default of 10 s would be most of each test.
        .file_flush_interval(LOG_FLUSH_INTERVAL)
        .edit(move |config| {
            let hcm = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
                [0]["typed_config"];
            hcm["access_log"][0]["typed_config"]["path"] = log.clone().into();
            Ok(())
        })
}

/// How often the Envoys under test write their access log out.
const LOG_FLUSH_INTERVAL: Duration = Duration::from_millis(100);

async fn get(envoy: &Envoy, tenant: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("{}/", envoy.base_url()))
        .header("x-tenant", tenant)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn read_lines(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().map(str::to_owned).collect()
}

/// The access log's lines, once Envoy has flushed at least `at_least` of
/// them (it writes in the background, every [`LOG_FLUSH_INTERVAL`]), or
/// those there are after 10 s.
async fn lines(log: &Path, at_least: usize) -> Vec<String> {
    let flushed = wait::until(
        "the access log's lines",
        Duration::from_secs(10),
        LOG_FLUSH_INTERVAL / 2,
        || async move {
            let lines = read_lines(log);
            Ok((lines.len() >= at_least).then_some(lines))
        },
    )
    .await;
    flushed.unwrap_or_else(|_| read_lines(log))
}

/// The requests of `counts` that got an answer, so have an access log line.
fn answered(counts: Counts) -> usize {
    usize::try_from(counts.sent - counts.errors).unwrap()
}

/// The `key=value` fields of a record line (after its status).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_and_drop_are_explained_in_the_access_log() {
    let mut fleet = Fleet::start(FleetOptions::control_plane_only(LIMITS))
        .await
        .unwrap();
    let log = fleet.dir().join("access.log");
    let envoy = fleet.start_envoy(&access_logged(&log)).await.unwrap();
    let envoy = &fleet.envoys[envoy];
    // 5× the limit for 3 s, and an unlimited tenant beside it.
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("acme", &envoy.base_url(), "acme", 100.0),
            StreamSpec::new("free", &envoy.base_url(), "free", 10.0),
        ],
        Duration::from_secs(3),
    ))
    .unwrap();
    let result = load.finish().await.unwrap();
    let logged = answered(result.tenant_counts(whole(), "acme"))
        + answered(result.tenant_counts(whole(), "free"));
    let lines = lines(&log, logged.max(300)).await;
    let text = lines.join("\n");
    assert!(lines.len() >= 300, "{} lines:\n{text}", lines.len());

    let drop = lines
        .iter()
        .find(|line| line.starts_with("429 bucket=acme "))
        .unwrap_or_else(|| panic!("no 429 in the access log:\n{text}"));
    assert_eq!(field(drop, "result"), Some("drop"), "{drop}");
    assert_eq!(field(drop, "reason"), Some("cluster_overload"), "{drop}");
    assert_eq!(field(drop, "tenant"), Some("-"), "{drop}");
    assert_eq!(field(drop, "priority"), Some("unspecified"), "{drop}");
    assert_eq!(field(drop, "source"), Some("directive"), "{drop}");
    assert_eq!(field(drop, "undirected"), Some("-"), "{drop}");
    // The same fields, copied into dynamic metadata by the example's Lua.
    assert_eq!(
        field(drop, "metadata"),
        Some("drop/cluster_overload/acme"),
        "{drop}"
    );
    let ratio: f64 = field(drop, "drop_ratio").unwrap().parse().unwrap();
    assert!(ratio > 0.5, "{drop}");
    let version: u64 = field(drop, "version").unwrap().parse().unwrap();
    assert!(version > 0, "{drop}");
    let age: u64 = field(drop, "age_ms").unwrap().parse().unwrap();
    assert!(age < 2_000, "{drop}");

    // The last passes of the limited bucket carry its directive too.
    let pass = lines
        .iter()
        .rev()
        .find(|line| line.starts_with("200 bucket=acme "))
        .unwrap_or_else(|| panic!("no pass of acme:\n{text}"));
    assert_eq!(field(pass, "result"), Some("pass"), "{pass}");
    assert_eq!(field(pass, "reason"), Some("none"), "{pass}");
    assert_eq!(field(pass, "metadata"), Some("pass/none/acme"), "{pass}");
    assert!(field(pass, "drop_ratio").unwrap().parse::<f64>().unwrap() > 0.5);

    // The unlimited tenant has no directive and needs none: the control
    // plane is there, so it is not flagged upstream.
    let free = lines
        .iter()
        .rev()
        .find(|line| line.starts_with("200 bucket=free "))
        .unwrap_or_else(|| panic!("no pass of free:\n{text}"));
    assert_eq!(field(free, "drop_ratio"), Some("0.000"), "{free}");
    assert_eq!(field(free, "source"), Some("directive"), "{free}");
    assert_eq!(field(free, "undirected"), Some("-"), "{free}");

    println!("{drop}\n{pass}\n{free}");
    // What the client saw matches the log.
    let limited: u64 = result.tenant_counts(whole(), "acme").limited;
    let logged = lines.iter().filter(|l| l.starts_with("429 ")).count() as u64;
    assert_eq!(limited, logged, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_control_plane_requests_are_flagged_upstream() {
    let dir = TestDir::new("sluice-it-", "test").unwrap();
    // A port nobody listens on.
    let unused = ControlPlaneTarget::One(free_loopback_addr().unwrap());
    let log = dir.path().join("access.log");
    let envoy = access_logged(&log)
        .start(dir.path(), &unused)
        .await
        .unwrap();
    for _ in 0..5 {
        assert_eq!(get(&envoy, "acme").await, 200);
    }
    let lines = lines(&log, 5).await;
    let text = lines.join("\n");
    assert_eq!(lines.len(), 5, "{text}");
    println!("{}", lines[0]);
    for line in &lines {
        assert!(line.starts_with("200 bucket=acme "), "{line}");
        assert_eq!(field(line, "result"), Some("pass"), "{line}");
        assert_eq!(field(line, "source"), Some("no_directives"), "{line}");
        assert_eq!(field(line, "undirected"), Some("no_directives"), "{line}");
        assert_eq!(field(line, "version"), Some("0"), "{line}");
    }
}

fn whole() -> sluice_integration_tests::load::Window {
    sluice_integration_tests::load::Window::secs(0.0, 3600.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_drops_and_the_fallback_are_explained_in_the_access_log() {
    // acme in shadow mode: would-be drops pass and say so. The batches'
    // TTL of 1 s puts the filter in its fallback soon after the control
    // plane dies.
    let mut fleet = Fleet::start(FleetOptions::control_plane_only(
        "directive_ttl_ms: 1000\nmodes:\n  default: shadow\nlimits:\n  - bucket: acme\n    limit_rps: 20\n",
    ))
    .await
    .unwrap();
    let log = fleet.dir().join("access.log");
    let envoy = fleet.start_envoy(&access_logged(&log)).await.unwrap();
    let envoy = &fleet.envoys[envoy];
    // Long enough for both waits below; stopped once they are over.
    let load = LoadRun::start(LoadPlan::new(
        vec![StreamSpec::new("acme", &envoy.base_url(), "acme", 100.0)],
        Duration::from_secs(10),
    ))
    .unwrap();
    // The control plane dies once its shadow directive decides requests, so
    // the log has shadow drops before the fallback's decisions.
    envoy
        .wait_for_decision("shadow_drop", Duration::from_secs(3))
        .await
        .unwrap();
    fleet.control_plane.kill().unwrap();
    let log_ref = log.as_path();
    let fallback_logged = wait::until(
        "a decision of the fallback in the access log",
        Duration::from_secs(3) + LOG_FLUSH_INTERVAL * 5,
        LOG_FLUSH_INTERVAL,
        || async move {
            let lines = read_lines(log_ref);
            Ok(lines
                .iter()
                .any(|line| field(line, "source") == Some("fallback"))
                .then_some(()))
        },
    )
    .await;
    load.stop();
    let result = load.finish().await.unwrap();
    let lines = lines(&log, answered(result.tenant_counts(whole(), "acme"))).await;
    let text = lines.join("\n");
    if let Err(err) = fallback_logged {
        panic!("{err:#}\n{text}");
    }
    assert_eq!(
        result.tenant_counts(whole(), "acme").limited,
        0,
        "shadow mode answered a 429\n{text}"
    );

    let shadow = lines
        .iter()
        .find(|line| field(line, "result") == Some("shadow_drop"))
        .unwrap_or_else(|| panic!("no shadow drop logged:\n{text}"));
    assert!(shadow.starts_with("200 "), "{shadow}");
    assert_eq!(
        field(shadow, "reason"),
        Some("cluster_overload"),
        "{shadow}"
    );
    assert_eq!(field(shadow, "source"), Some("directive"), "{shadow}");
    assert_eq!(field(shadow, "undirected"), Some("-"), "{shadow}");

    // After the TTL the fallback decides, and the request goes upstream
    // flagged as decided without fresh directives.
    let fallback = lines
        .iter()
        .find(|line| field(line, "source") == Some("fallback"))
        .unwrap_or_else(|| panic!("no decision of the fallback logged:\n{text}"));
    assert_eq!(
        field(fallback, "undirected"),
        Some("fallback"),
        "{fallback}"
    );
    assert!(
        field(fallback, "age_ms")
            .and_then(|age| age.parse::<u64>().ok())
            .is_some_and(|age| age >= 1_000),
        "{fallback}"
    );
}
