//! Token costs in real Envoy 1.40, for the wasm filter and the native
//! module, in front of the fake LLM upstream (`llm_upstream`): every
//! admitted request with a cost rule is charged at the end of its stream,
//! and what the filter charged (its `sluice.source=….cost_charged`
//! counters) equals what the upstream reported, per source:
//!
//! - `body`: OpenAI and Anthropic answers, streamed (SSE) and not, read
//!   by the filter's streaming parser;
//! - `header`: the usage header the upstream adds;
//! - `metadata`: the same number put into dynamic metadata by Envoy's
//!   `header_to_metadata` filter (as a number), read back by the filter;
//! - `estimate`: streams the upstream cuts midway (no usage) are charged
//!   their estimate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use hyper::header::HeaderName;
use serde_json::json;
use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::envoy::{self, Envoy, EnvoyOptions, Rewrite, counter_total};
use sluice_integration_tests::llm_upstream::{LlmUpstream, LlmUpstreamOptions};
use sluice_integration_tests::prometheus::Exposition;

const LIMITS: &str = "limits:\n  - bucket: unused\n    limit_rps: 1000\n";
/// The estimate of every costed request.
const ESTIMATE: u64 = 777;
/// The response header the upstream puts its total tokens in.
const USAGE_HEADER: &str = "x-usage-total";
/// The request header that makes the upstream cut a stream.
const ABORT_HEADER: &str = "x-abort";
/// Where `header_to_metadata` puts the usage header's number.
const METADATA_NAMESPACE: &str = "sluice.test";
const METADATA_KEY: &str = "total_tokens";

#[derive(Debug, Clone, Copy, PartialEq)]
enum DataPlane {
    Wasm,
    Native,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wasm_filter_charges_what_the_upstream_reported() {
    charges_what_the_upstream_reported(DataPlane::Wasm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_module_charges_what_the_upstream_reported() {
    charges_what_the_upstream_reported(DataPlane::Native).await;
}

fn cost_rules() -> serde_json::Value {
    let estimate = json!({"estimate": {"source": "constant", "value": ESTIMATE}});
    json!([
        {"bucket": "body-*", "cost": estimate, "actual": {"metadata": null}},
        {"bucket": "header", "cost": estimate,
         "actual": {"metadata": null, "response_header": USAGE_HEADER, "body": {"parse": false}}},
        {"bucket": "meta", "cost": estimate,
         "actual": {"metadata": {"namespace": METADATA_NAMESPACE, "key": METADATA_KEY},
                    "body": {"parse": false}}},
        {"bucket": "aborted", "cost": estimate},
    ])
}

/// Envoy's `header_to_metadata` filter, before the router: the usage
/// header of a response becomes a number in dynamic metadata.
fn header_to_metadata() -> serde_yaml_ng::Value {
    serde_yaml_ng::from_str(&format!(
        "name: envoy.filters.http.header_to_metadata\n\
         typed_config:\n  \
           \"@type\": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config\n  \
           response_rules:\n  \
           - header: {USAGE_HEADER}\n    \
             on_header_present: {{metadata_namespace: {METADATA_NAMESPACE}, key: {METADATA_KEY}, type: NUMBER}}\n    \
             remove: false\n"
    ))
    .unwrap()
}

/// Puts `filter` just before the router in every HTTP filter chain.
fn insert_before_router(config: &mut serde_yaml_ng::Value, filter: &serde_yaml_ng::Value) {
    let mut inserted = 0;
    envoy::visit_mappings(config, &mut |mapping| {
        if let Some(serde_yaml_ng::Value::Sequence(filters)) = mapping.get_mut("http_filters") {
            let router = filters
                .iter()
                .position(|f| {
                    f.get("name").and_then(|n| n.as_str()) == Some("envoy.filters.http.router")
                })
                .unwrap_or(filters.len());
            filters.insert(router, filter.clone());
            inserted += 1;
        }
    });
    assert!(inserted > 0, "no http_filters to add header_to_metadata to");
}

async fn charges_what_the_upstream_reported(data_plane: DataPlane) {
    let dir = tempfile::tempdir().unwrap();
    let upstream = LlmUpstream::start(LlmUpstreamOptions {
        usage_header: Some(HeaderName::from_static(USAGE_HEADER)),
        abort_header: Some(HeaderName::from_static(ABORT_HEADER)),
        ..LlmUpstreamOptions::default()
    })
    .await
    .unwrap();
    let control_plane = ControlPlane::start(ControlPlaneOptions::new(LIMITS, dir.path()))
        .await
        .unwrap();
    let patch = json!({
        "proxy_id": "tokens",
        "report_interval_ms": 100,
        "cost_rules": cost_rules(),
    });
    let (file, rewrite) = match data_plane {
        DataPlane::Wasm => (
            "demo-a.yaml",
            Rewrite::for_test(control_plane.grpc_addr(), patch).unwrap(),
        ),
        DataPlane::Native => (
            "native-module.yaml",
            Rewrite::for_native(control_plane.grpc_addr(), patch).unwrap(),
        ),
    };
    let mut config = envoy::load_repo_config(file).unwrap();
    envoy::rewrite(&mut config, &rewrite).unwrap();
    envoy::route_to_upstream(&mut config, upstream.addr()).unwrap();
    insert_before_router(&mut config, &header_to_metadata());
    let envoy = Envoy::start(&config, &EnvoyOptions::new("envoy-tokens", dir.path()))
        .await
        .unwrap();

    let client = reqwest::Client::new();
    let base = envoy.base_url();
    let mut aborted = 0u64;
    for (tenant, abort) in [
        ("body-openai", false),
        ("body-anthropic", false),
        ("header", false),
        ("meta", false),
        ("aborted", true),
    ] {
        for i in 0..6 {
            let stream = i % 2 == 0;
            let anthropic = tenant == "body-anthropic" || (tenant != "body-openai" && i % 3 == 1);
            let (path, body) = if anthropic {
                (
                    "/v1/messages",
                    json!({"model": "claude", "max_tokens": 1024, "stream": stream || abort,
                           "messages": [{"role": "user", "content": "hello there"}]}),
                )
            } else {
                (
                    "/v1/chat/completions",
                    json!({"model": "gpt", "stream": stream || abort,
                           "stream_options": {"include_usage": true},
                           "messages": [{"role": "user", "content": "hello there"}]}),
                )
            };
            let mut request = client
                .post(format!("{base}{path}"))
                .header("x-tenant", tenant)
                .json(&body);
            if abort {
                request = request.header(ABORT_HEADER, "1");
                aborted += 1;
            }
            let response = request.send().await;
            let Ok(response) = response else {
                continue;
            };
            assert_eq!(response.status(), 200, "{tenant} {path}");
            // An aborted stream ends in an error: its body is cut.
            let text = response.text().await;
            assert_eq!(text.is_err(), abort, "{tenant} {path}: {text:?}");
        }
    }

    let reported = |tenant: &str| upstream.tenant(tenant);
    for tenant in ["body-openai", "body-anthropic", "header", "meta"] {
        let record = reported(tenant);
        assert_eq!(record.reported, 6, "{tenant}: {record:?}");
    }
    assert_eq!(reported("aborted").aborted, aborted);
    let expected = [
        (
            "body",
            reported("body-openai").usage.total() + reported("body-anthropic").usage.total(),
            12,
        ),
        ("header", reported("header").usage.total(), 6),
        ("metadata", reported("meta").usage.total(), 6),
        ("estimate", aborted * ESTIMATE, aborted),
    ];
    let charged = sluice_integration_tests::wait::until(
        "the filter's charges to reach what the upstream reported",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let stats = envoy.stats("sluice.source=").await?;
            let found: Vec<(u64, u64)> = expected
                .iter()
                .map(|(source, _, _)| {
                    (
                        counter_total(&stats, &format!("sluice.source={source}.cost_charged")),
                        counter_total(&stats, &format!("sluice.source={source}.charges")),
                    )
                })
                .collect();
            let done = expected
                .iter()
                .zip(&found)
                .all(|((_, _, charges), (_, counted))| counted >= charges);
            Ok(done.then_some((found, stats)))
        },
    )
    .await;
    let (found, stats) = match charged {
        Ok(found) => found,
        Err(err) => {
            envoy.print_log();
            panic!(
                "{err:#}: {}",
                envoy.stats("sluice").await.unwrap_or_default()
            );
        }
    };
    for ((source, cost, charges), (charged_cost, counted)) in expected.iter().zip(&found) {
        assert_eq!(
            (charged_cost, counted),
            (cost, charges),
            "source {source} ({data_plane:?}): {stats}"
        );
    }
    // The repo config's `source` tag makes the source a label.
    let page = envoy.prometheus().await.unwrap();
    let exposition = Exposition::parse(&page).unwrap();
    for ((source, cost, _), _) in expected.iter().zip(&found) {
        assert_eq!(
            exposition.value("sluice_cost_charged", &[("source", source)]),
            Some(*cost as f64),
            "source {source} ({data_plane:?}): {page}"
        );
    }
}
