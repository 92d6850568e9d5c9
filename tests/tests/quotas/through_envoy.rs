//! Through real Envoy's `ratelimit` filter (`envoy/quotas.yaml`, Envoy
//! 1.40): a store that cannot count is a gRPC error, so Envoy's own
//! `failure_mode_deny` decides (every request refused with it, every one
//! let through without it, an exhausted tenant's included); and with
//! `enable_x_ratelimit_headers` each rate limit header reaches the client
//! once, in Envoy's format.

use std::time::Duration;

use sluice_integration_tests::control_plane::{ControlPlaneOptions, sample};
use sluice_integration_tests::quotas::{self, Store};
use sluice_integration_tests::redis::RedisServer;

const QUOTAS: &str = "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: tenant\n    value: spent\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

/// What a client got: the status and the values of each rate limit
/// header (every occurrence).
async fn get(http: &reqwest::Client, base: &str, tenant: &str) -> (u16, Vec<(String, String)>) {
    let reply = http
        .get(format!("{base}/"))
        .header("x-tenant", tenant)
        .send()
        .await
        .unwrap();
    let headers = reply
        .headers()
        .iter()
        .filter(|(name, _)| {
            name.as_str().starts_with("x-ratelimit") || name.as_str().starts_with("ratelimit")
        })
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.to_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    (reply.status().as_u16(), headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_failure_mode_decides_and_headers_come_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start(dir.path()).await.unwrap();
    let url = redis.url();
    let control_plane = quotas::control_plane(
        dir.path(),
        ControlPlaneOptions::new("limits: []\n", dir.path()),
        QUOTAS,
        None,
        Store::Redis(&url),
    )
    .await
    .unwrap();
    let grpc = control_plane.grpc_addr();
    let mut envoys = Vec::new();
    for (name, deny) in [("deny", true), ("allow", false)] {
        let envoy = quotas::start_with(grpc, name, dir.path(), |config| {
            let filter = quotas::ratelimit_filter(config)?;
            filter["failure_mode_deny"] = deny.into();
            filter["enable_x_ratelimit_headers"] = "DRAFT_VERSION_03".into();
            Ok(())
        })
        .await
        .unwrap();
        envoys.push(envoy);
    }
    let (deny, allow) = (envoys[0].base_url(), envoys[1].base_url());
    // The exhausted tenant's two a minute within one minute.
    let into_minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 60_000;
    if into_minute > 50_000 {
        tokio::time::sleep(Duration::from_millis(
            u64::try_from(60_100 - into_minute).unwrap(),
        ))
        .await;
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    // Counted: each header once, as Envoy writes it (DRAFT_VERSION_03).
    let (status, headers) = get(&http, &deny, "fresh").await;
    assert_eq!(status, 200, "{headers:?}");
    let names: Vec<&str> = headers.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset"
        ],
        "each rate limit header once: {headers:?}"
    );
    assert_eq!(headers[0].1, "100, 100;w=60", "{headers:?}");
    assert_eq!(headers[1].1, "99", "{headers:?}");
    // An exhausted tenant.
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(get(&http, &deny, "spent").await.0);
    }
    assert_eq!(codes, [200, 200, 429]);

    redis.kill().unwrap();
    let mut denied = Vec::new();
    let mut allowed = Vec::new();
    for i in 0..15 {
        let tenant = if i % 3 == 0 { "spent" } else { "fresh" };
        denied.push(get(&http, &deny, tenant).await.0);
        allowed.push(get(&http, &allow, tenant).await.0);
    }
    println!("Redis killed: failure_mode_deny {denied:?}, without {allowed:?}");
    assert!(
        denied.iter().all(|code| *code == 500),
        "failure_mode_deny: true refuses every request: {denied:?}"
    );
    assert!(
        allowed.iter().all(|code| *code == 200),
        "failure_mode_deny: false lets every request through: {allowed:?}"
    );
    let metrics = control_plane.admin().metrics().await.unwrap();
    let errors = sample(
        &metrics,
        r#"sluice_quota_should_rate_limit_error_total{err_type="redis_error"}"#,
    );
    assert!(errors >= 30.0, "{errors} calls answered with an error");
}
