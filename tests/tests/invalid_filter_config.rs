//! An invalid plugin configuration is refused when Envoy loads the filter,
//! with a log line that names the offending field; the same config with the
//! field fixed starts and serves.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::json;
use sluice_integration_tests::envoy;

#[tokio::test]
async fn invalid_plugin_config_is_refused_naming_the_field() {
    let cases = [
        (json!({"report_interval_ms": 10}), "report_interval_ms"),
        (
            json!({"retry_after_seconds": "soon"}),
            "retry_after_seconds",
        ),
        (
            json!({"bucket_key": [{"source": "header"}]}),
            "bucket_key[0]",
        ),
        (json!({"rate_limit": 5}), "rate_limit"),
    ];
    for (index, (patch, field)) in cases.into_iter().enumerate() {
        envoy::refuses_config_naming(patch, field, &format!("bad-{index}"))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn the_same_config_with_valid_fields_serves() {
    let (started, log) =
        envoy::start_patched_without_control_plane(json!({"report_interval_ms": 100}), "good")
            .await;
    let envoy = started.unwrap_or_else(|err| panic!("valid config refused: {err:#}\n{log}"));
    let response = reqwest::get(format!("{}/", envoy.base_url()))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}
