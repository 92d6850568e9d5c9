//! The token-budget example as shipped: real Envoy 1.40 running
//! `envoy/llm-budget.yaml` (the wasm filter's cost rule, nothing else on
//! the request path) and the control plane serving
//! `control-plane/examples/llm-budget.yaml` (1,200,000 tokens a minute,
//! tenants weighted 3:2:1), in front of the fake LLM upstream.
//!
//! - OpenAI and Anthropic answers, streamed and not, are charged from the
//!   body exactly the tokens the upstream reported, per tenant's requests
//!   summed;
//! - three tenants each offering the whole budget (3x together) are held
//!   to it: the tokens admitted after the first directives are the
//!   budget's within ±30 %, gold (weight 3) gets more than bronze
//!   (weight 1), and their 429s say the unit and the window
//!   (`ratelimit-policy: "sluice";q=…;w=60;qu="tokens"`, `retry-after`),
//!   and the control plane shows each tenant's balance in tokens.
//!
//! Every request of the load asks for the same number of tokens, so what
//! is admitted varies only with the coin: ±30 % is several times that.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hyper::header::{HeaderMap, HeaderName};
use serde_json::json;
use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::envoy::{self, Envoy, EnvoyOptions, Rewrite, counter_total};
use sluice_integration_tests::llm_upstream::{LlmUpstream, LlmUpstreamOptions};
use sluice_integration_tests::wait;

/// The limits file, as shipped.
const LIMITS: &str = include_str!("../../control-plane/examples/llm-budget.yaml");
/// Its budget, in tokens a second.
const BUDGET_PER_S: f64 = 20_000.0;
/// The header the fake upstream takes the output tokens from.
const OUTPUT_TOKENS: &str = "x-output-tokens";
/// The example's estimate header.
const ESTIMATE: &str = "x-estimated-tokens";
/// Output tokens of each request of the load.
const LOAD_TOKENS: u64 = 2_000;
/// Requests a second per tenant: the whole budget each.
const LOAD_RPS: f64 = BUDGET_PER_S / LOAD_TOKENS as f64;
/// How long the load runs, and when its measure starts.
const LOAD: Duration = Duration::from_secs(10);
const MEASURE_FROM: Duration = Duration::from_secs(3);
const TENANTS: [&str; 3] = ["gold", "silver", "bronze"];

#[derive(Debug)]
struct Answer {
    tenant: &'static str,
    sent: Duration,
    status: u16,
    headers: HeaderMap,
    /// The usage's total tokens, for a 200.
    tokens: u64,
}

/// Posts one completion; a non-streamed answer's usage is read back.
async fn complete(
    http: &reqwest::Client,
    base: &str,
    tenant: &str,
    api: Api,
    tokens: u64,
) -> (u16, HeaderMap, u64) {
    let (path, body) = match api {
        Api::OpenAiJson | Api::OpenAiStream => (
            "/v1/chat/completions",
            json!({"model": "gpt", "stream": api == Api::OpenAiStream,
                   "stream_options": {"include_usage": true},
                   "messages": [{"role": "user", "content": "hello"}]}),
        ),
        Api::AnthropicStream => (
            "/v1/messages",
            json!({"model": "claude", "max_tokens": 4096, "stream": true,
                   "messages": [{"role": "user", "content": "hello"}]}),
        ),
    };
    let response = http
        .post(format!("{base}{path}"))
        .header("x-tenant", tenant)
        .header(ESTIMATE, tokens)
        .header(OUTPUT_TOKENS, tokens)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().await.unwrap();
    let tokens = if status == 200 && api == Api::OpenAiJson {
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
        answer["usage"]["total_tokens"].as_u64().unwrap()
    } else {
        0
    };
    (status, headers, tokens)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Api {
    OpenAiJson,
    OpenAiStream,
    AnthropicStream,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llm_budget_example_charges_the_body_and_holds_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = LlmUpstream::start(LlmUpstreamOptions {
        output_tokens_header: Some(HeaderName::from_static(OUTPUT_TOKENS)),
        ..LlmUpstreamOptions::default()
    })
    .await
    .unwrap();
    let control_plane = ControlPlane::start(ControlPlaneOptions::new(LIMITS, dir.path()))
        .await
        .unwrap();
    let mut config = envoy::load_repo_config("llm-budget.yaml").unwrap();
    let rewrite = Rewrite::for_test(
        control_plane.grpc_addr(),
        json!({"report_interval_ms": 100}),
    )
    .unwrap();
    envoy::rewrite(&mut config, &rewrite).unwrap();
    envoy::point_cluster(&mut config, "llm", upstream.addr()).unwrap();
    let envoy = Envoy::start(&config, &EnvoyOptions::new("llm-budget", dir.path()))
        .await
        .unwrap();
    let base = envoy.base_url();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    // Charged from the body, whatever the API and framing.
    let apis = [Api::OpenAiJson, Api::OpenAiStream, Api::AnthropicStream];
    for tenant in TENANTS {
        for api in apis {
            let (status, headers, _) = complete(&http, &base, tenant, api, 40).await;
            assert_eq!(status, 200, "{tenant} {api:?}: {headers:?}");
        }
    }
    let reported: u64 = TENANTS
        .iter()
        .map(|tenant| upstream.tenant(tenant).usage.total())
        .sum();
    let requests = (TENANTS.len() * apis.len()) as u64;
    let charged = wait::until(
        "every answer charged from its body",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let stats = envoy.stats("sluice.source=").await?;
            let charges = counter_total(&stats, "sluice.source=body.charges");
            Ok((charges >= requests).then_some(stats))
        },
    )
    .await;
    let stats = match charged {
        Ok(stats) => stats,
        Err(err) => {
            envoy.print_log();
            panic!("{err:#}");
        }
    };
    assert_eq!(
        (
            counter_total(&stats, "sluice.source=body.cost_charged"),
            counter_total(&stats, "sluice.source=body.charges"),
            counter_total(&stats, "sluice.source=estimate.charges"),
        ),
        (reported, requests, 0),
        "{stats}"
    );

    // Three tenants, each offering the whole budget.
    let started = Instant::now();
    let mut load = tokio::task::JoinSet::new();
    let gap = Duration::from_secs_f64(1.0 / LOAD_RPS);
    let mut at = Duration::ZERO;
    while at < LOAD {
        tokio::time::sleep_until((started + at).into()).await;
        for tenant in TENANTS {
            let http = http.clone();
            let base = base.clone();
            load.spawn(async move {
                let (status, headers, tokens) =
                    complete(&http, &base, tenant, Api::OpenAiJson, LOAD_TOKENS).await;
                Answer {
                    tenant,
                    sent: at,
                    status,
                    headers,
                    tokens,
                }
            });
        }
        at += gap;
    }
    let answers: Vec<Answer> = load.join_all().await;
    let buckets = control_plane.admin().buckets().await.unwrap();

    let mut admitted: BTreeMap<&str, u64> = BTreeMap::new();
    let mut refused: BTreeMap<&str, u64> = BTreeMap::new();
    for answer in answers.iter().filter(|a| a.sent >= MEASURE_FROM) {
        match answer.status {
            200 => *admitted.entry(answer.tenant).or_default() += answer.tokens,
            429 => *refused.entry(answer.tenant).or_default() += 1,
            other => panic!("{}: status {other}", answer.tenant),
        }
    }
    let total: u64 = admitted.values().sum();
    let expected = BUDGET_PER_S * (LOAD - MEASURE_FROM).as_secs_f64();
    let error = total as f64 / expected - 1.0;
    eprintln!(
        "admitted {admitted:?} ({total} tokens, {:+.1} % of the budget), refused {refused:?}",
        error * 100.0
    );
    if error.abs() > 0.3 {
        envoy.print_log();
        control_plane.print_log();
    }
    assert!(
        error.abs() <= 0.3,
        "admitted {total} tokens against {expected}: {admitted:?}"
    );
    assert!(
        admitted.get("gold") > admitted.get("bronze"),
        "weights 3:1, admitted {admitted:?}"
    );
    for tenant in TENANTS {
        assert!(
            refused.get(tenant).is_some_and(|n| *n > 0),
            "{tenant} was never refused: {refused:?}"
        );
    }
    let refusal = answers.iter().find(|a| a.status == 429).unwrap();
    let policy = refusal
        .headers
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(
        policy.starts_with("\"sluice\";")
            && policy.contains(";w=60")
            && policy.ends_with(";qu=\"tokens\""),
        "{policy:?}"
    );
    assert!(
        refusal.headers.contains_key("retry-after"),
        "{:?}",
        refusal.headers
    );
    let llm = buckets.bucket("llm").unwrap();
    assert_eq!(llm.limit_rps, Some(BUDGET_PER_S), "{llm:?}");
    assert!(llm.cost.is_some() && llm.drop_ratio > 0.0, "{llm:?}");
    // Each tenant's cell shows its balance in tokens.
    for tenant in TENANTS {
        let cell = llm.cells.iter().find(|c| c.tenant == tenant).unwrap();
        assert!(cell.balance.is_some_and(f64::is_finite), "{cell:?}");
    }
}
