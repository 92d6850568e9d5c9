//! The classification, staleness, new-bucket and response keys are checked
//! like the others: an invalid value is refused when Envoy loads the filter,
//! with a log line naming the field; valid values serve.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::json;
use sluice_integration_tests::envoy;

#[tokio::test]
async fn invalid_cell_keys_are_refused_naming_the_field() {
    let cases = [
        (json!({"directive_ttl_ms": 5}), "directive_ttl_ms"),
        (json!({"fallback": "fail_open"}), "fallback"),
        (
            json!({"new_bucket": {"action": "local_limit", "fleet_limit_rps": 10}}),
            "new_bucket",
        ),
        (
            json!({"priority": {"header": "x-p", "values": {"a": "vip"}}}),
            "priority.values.a",
        ),
        (json!({"tenant": {"source": "header"}}), "tenant"),
        (
            json!({"response": {"reason_header": ""}}),
            "response.reason_header",
        ),
    ];
    for (index, (patch, field)) in cases.into_iter().enumerate() {
        envoy::refuses_config_naming(patch, field, &format!("bad-cell-{index}"))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn valid_cell_keys_serve() {
    let (started, log) = envoy::start_patched_without_control_plane(
        json!({
            "tenant": {"source": "header", "name": "x-tenant"},
            "priority": {"header": "x-priority", "routes": {"local_route": "critical"}},
            "directive_ttl_ms": 5000,
            "fallback": "local_limit",
            "new_bucket": {"action": "local_limit", "fleet_limit_rps": 1000, "expected_proxies": 2},
            "response": {"reason_header": "x-shed-reason", "ietf_headers": false},
            "directive_poll_ms": 10
        }),
        "good-cell",
    )
    .await;
    let envoy = started.unwrap_or_else(|err| panic!("valid config refused: {err:#}\n{log}"));
    let response = reqwest::get(format!("{}/", envoy.base_url()))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}
