//! LLM token quotas on the exact path, through real Envoy 1.40
//! (`envoy/llm-tokens.yaml`): Envoy's `ratelimit` filter configured as
//! Envoy AI Gateway users configure it, in front of the fake LLM upstream
//! (`llm_upstream`, OpenAI JSON and SSE with `include_usage`), Envoy's
//! `json_to_metadata` and `sse_to_metadata` writing each response's usage
//! into `io.envoy.ai_gateway:llm_total_token`, and the control plane's
//! rate limit service counting.
//!
//! - A check with `hits_addend: {number: 0}` before each request, the
//!   response's tokens charged when the stream ends: after every request
//!   the count in Sluice is exactly the tokens the upstream reported, the
//!   charge that overruns the quota included; the next check is refused.
//! - A reservation of `x-estimated-tokens` before, given back when the
//!   stream ends (`is_negative_hits`) beside the charge of what was used:
//!   the count is again exactly what the upstream reported, and a
//!   reservation that does not fit is refused (and given back when its
//!   stream ends: Envoy sends the stream-done descriptors of a refused
//!   request too).
//!
//! - A stream the upstream cuts before its usage is charged nothing (Envoy
//!   has no value to send), and a reservation is given back: the count
//!   stays what the upstream reported.
//!
//! In the control plane's memory, and on Redis with the local cache of
//! full windows (`--quota-local-cache-bytes`), whose answers' hits are
//! written behind rather than dropped.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use hyper::header::HeaderName;
use serde_json::json;
use sluice_integration_tests::control_plane::{AdminClient, ControlPlaneOptions};
use sluice_integration_tests::envoy::{self, Envoy, EnvoyOptions, Rewrite};
use sluice_integration_tests::llm_upstream::{LlmUpstream, LlmUpstreamOptions, TokenDistribution};
use sluice_integration_tests::quotas::{self, Store};
use sluice_integration_tests::redis::RedisServer;
use sluice_integration_tests::wait;

/// Tokens per tenant per hour (an hour: no window ends during the test).
const QUOTA: u64 = 3_000;
const QUOTAS: &str = "domain: llm\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 3000}\n";

/// Sends one chat completion for `tenant` (streamed or not, with
/// `estimate` in `x-estimated-tokens` when given) and reads the whole
/// answer: its status.
async fn complete(
    http: &reqwest::Client,
    base: &str,
    tenant: &str,
    stream: bool,
    estimate: Option<u64>,
) -> u16 {
    complete_or_cut(http, base, tenant, stream, estimate, false)
        .await
        .unwrap()
}

/// As [`complete`], the stream cut midway by the upstream when `cut`: the
/// status, or the error reading the body.
async fn complete_or_cut(
    http: &reqwest::Client,
    base: &str,
    tenant: &str,
    stream: bool,
    estimate: Option<u64>,
    cut: bool,
) -> Result<u16, reqwest::Error> {
    let body = json!({
        "model": "fake-model",
        "messages": [{"role": "user", "content": "Count the tokens of this question, please."}],
        "stream": stream,
        "stream_options": {"include_usage": true},
    });
    let mut request = http
        .post(format!("{base}/v1/chat/completions"))
        .header("x-tenant", tenant)
        .json(&body);
    if let Some(estimate) = estimate {
        request = request.header("x-estimated-tokens", estimate.to_string());
    }
    if cut {
        request = request.header("x-test-abort", "1");
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    response.bytes().await?;
    Ok(status)
}

/// Waits until the quota count of `tenant` is `expected` (charges arrive
/// after the response, fire and forget); the count last read.
async fn count_reaches(admin: &AdminClient, tenant: &str, expected: u64) -> u64 {
    let reached = wait::until(
        &format!("{tenant}'s count at {expected}"),
        Duration::from_secs(3),
        Duration::from_millis(10),
        || async {
            let used = admin.quota_used("llm", &[("tenant", tenant)]).await?;
            Ok((used == expected).then_some(used))
        },
    )
    .await;
    match reached {
        Ok(used) => used,
        Err(err) => {
            let used = admin
                .quota_used("llm", &[("tenant", tenant)])
                .await
                .unwrap();
            panic!("{err:#}: the count is {used}, the upstream reported {expected}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_done_charges_count_exactly_what_the_upstream_reported() {
    let dir = tempfile::tempdir().unwrap();
    check_then_charge_and_reserve_then_settle(dir.path(), Store::Memory, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_with_the_local_cache_no_charge_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(dir.path()).await.unwrap();
    let url = redis.url();
    check_then_charge_and_reserve_then_settle(
        dir.path(),
        Store::Redis(&url),
        &["--quota-local-cache-bytes", "4096"],
    )
    .await;
}

async fn check_then_charge_and_reserve_then_settle(
    dir: &std::path::Path,
    store: Store<'_>,
    args: &[&str],
) {
    let upstream = LlmUpstream::start(LlmUpstreamOptions {
        output_tokens: TokenDistribution::new(150.0, 1_500.0).unwrap(),
        seed: 37,
        tokens_per_chunk: 8,
        abort_header: Some(HeaderName::from_static("x-test-abort")),
        ..LlmUpstreamOptions::default()
    })
    .await
    .unwrap();
    let (control_plane, _) = quotas::control_plane_with_files(
        dir,
        ControlPlaneOptions::new("limits: []\n", dir).args(args.iter().map(|a| (*a).to_owned())),
        &[("llm.yaml", QUOTAS)],
        store,
    )
    .await
    .unwrap();
    let mut config = envoy::load_repo_config("llm-tokens.yaml").unwrap();
    let rewrite = Rewrite::for_test(
        control_plane.grpc_addr(),
        json!({ "proxy_id": "llm-tokens" }),
    )
    .unwrap();
    envoy::rewrite(&mut config, &rewrite).unwrap();
    envoy::point_cluster(&mut config, "llm", upstream.addr()).unwrap();
    let envoy = Envoy::start(&config, &EnvoyOptions::new("llm-tokens", dir))
        .await
        .unwrap();
    let base = envoy.base_url();
    let admin = control_plane.admin();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    // The hour's window must not end during the test.
    let into_hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 3_600_000;
    if into_hour > 3_540_000 {
        tokio::time::sleep(Duration::from_millis(
            u64::try_from(3_600_100 - into_hour).unwrap(),
        ))
        .await;
    }

    // Check, then charge: every response counted in full, the one that
    // overruns the quota too; then refused.
    let mut admitted = 0;
    let mut refused_after = None;
    for i in 0..60 {
        let status = complete(&http, &base, "acme", i % 2 == 1, None).await;
        if status == 429 {
            refused_after = Some(i);
            break;
        }
        assert_eq!(status, 200, "request {i}");
        admitted += 1;
        let reported = upstream.tenant("acme").usage.total();
        count_reaches(admin, "acme", reported).await;
    }
    let acme = upstream.tenant("acme");
    println!("check then charge: {admitted} admitted, {acme:?}");
    assert!(
        refused_after.is_some(),
        "the quota was never spent: {acme:?}"
    );
    assert_eq!(acme.reported, admitted, "{acme:?}");
    assert_eq!(
        acme.requests, admitted,
        "the refused request never reached it"
    );
    assert!(
        acme.usage.total() > QUOTA,
        "the last charge overran the quota: {acme:?}"
    );
    // The refused check counted nothing: still exactly what was reported.
    assert_eq!(
        count_reaches(admin, "acme", acme.usage.total()).await,
        acme.usage.total()
    );
    assert_eq!(complete(&http, &base, "acme", false, None).await, 429);

    // Reserve, then settle.
    let estimate = 400;
    let mut admitted = 0;
    let mut refused = false;
    for i in 0..60 {
        let status = complete(&http, &base, "umbrella", i % 2 == 0, Some(estimate)).await;
        let reported = upstream.tenant("umbrella").usage.total();
        if status == 429 {
            refused = true;
            println!("reservation refused at {reported} reported");
            assert!(
                reported + estimate > QUOTA,
                "{reported} + {estimate} fits in {QUOTA}"
            );
            break;
        }
        assert_eq!(status, 200, "request {i}");
        admitted += 1;
        count_reaches(admin, "umbrella", reported).await;
    }
    let umbrella = upstream.tenant("umbrella");
    println!("reserve then settle: {admitted} admitted, {umbrella:?}");
    assert!(refused, "the quota was never spent: {umbrella:?}");
    assert_eq!(umbrella.reported, admitted);
    assert_eq!(umbrella.requests, admitted);
    // The refused reservation was counted (a fixed window counts what it
    // refuses), and given back when its stream ended.
    count_reaches(admin, "umbrella", umbrella.usage.total()).await;

    // Streams cut before their usage: no metadata, so Envoy sends no
    // charge; a reservation is still given back. Both count nothing, as
    // the upstream reported nothing.
    for (tenant, estimate) in [("wayne", None), ("stark", Some(estimate))] {
        for _ in 0..2 {
            let cut = complete_or_cut(&http, &base, tenant, true, estimate, true).await;
            assert!(cut.is_err(), "{tenant}: the stream was cut: {cut:?}");
        }
        let record = upstream.tenant(tenant);
        assert_eq!((record.aborted, record.reported), (2, 0), "{record:?}");
        // The reservation is counted at first, then given back.
        count_reaches(admin, tenant, 0).await;
        let status = complete(&http, &base, tenant, false, estimate).await;
        assert_eq!(status, 200);
        count_reaches(admin, tenant, upstream.tenant(tenant).usage.total()).await;
    }

    let metrics = control_plane.admin().metrics().await.unwrap();
    println!(
        "{}",
        metrics
            .lines()
            .filter(|line| line.starts_with("sluice_quota_") && line.contains("llm"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
