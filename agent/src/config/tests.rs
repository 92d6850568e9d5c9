//! Parsing and validation of the plugin configuration.

use super::*;
use crate::request::classify::{KeyPart, KeySource};
use sluice_core::Priority;
use sluice_core::allowance::Engage;
use sluice_core::directive::DirectiveTtl;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn decision_and_allowance() {
    let config = FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp", "decision": "credit",
             "allowance": {"headroom": 0.05, "burst_ms": 20}}"#,
    )
    .unwrap();
    assert_eq!(config.decision, DecisionMode::Credit);
    assert_eq!(
        config.allowance,
        Some(AllowanceSettings {
            headroom: 0.05,
            burst_ms: 20,
            engage: Engage::WhenLost,
        })
    );
    // The defaults hold a limit through a surge without a control plane.
    let config = FilterConfig::from_json(br#"{"control_plane_cluster": "cp"}"#).unwrap();
    assert_eq!(config.decision, DecisionMode::Credit);
    assert_eq!(
        config.allowance,
        Some(AllowanceSettings {
            headroom: 0.0,
            burst_ms: 20,
            engage: Engage::WhenLost,
        })
    );
    // The seed's coin flips, without an allowance.
    let config = FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp", "decision": "coin", "allowance": null}"#,
    )
    .unwrap();
    assert_eq!(config.decision, DecisionMode::Coin);
    assert_eq!(config.allowance, None);
    // Given partly, the rest of the allowance takes its defaults.
    let config = FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp", "allowance": {"headroom": 0.1}}"#,
    )
    .unwrap();
    assert_eq!(
        config.allowance,
        Some(AllowanceSettings {
            headroom: 0.1,
            burst_ms: 20,
            engage: Engage::WhenLost,
        })
    );
    let config = FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp", "allowance": {"engage": "always"}}"#,
    )
    .unwrap();
    assert_eq!(config.allowance.map(|a| a.engage), Some(Engage::Always));
    assert!(
        error_of(r#"{"control_plane_cluster": "cp", "decision": "dice"}"#)
            .starts_with("decision: unknown variant")
    );
    assert_eq!(
        error_of(r#"{"control_plane_cluster": "cp", "allowance": {"headroom": 2}}"#),
        "allowance.headroom: must be between 0 and 1, got 2"
    );
    assert!(
        error_of(r#"{"control_plane_cluster": "cp", "allowance": {"burst": 2}}"#)
            .starts_with("allowance.burst: unknown field")
    );
}

#[test]
fn decision_record_and_undirected_header() {
    let config = FilterConfig::from_json(br#"{"control_plane_cluster": "cp"}"#).unwrap();
    assert_eq!(config.decision_record, RecordMode::Drops);
    assert_eq!(
        config.undirected_header.as_deref(),
        Some("x-sluice-undirected")
    );
    let config = FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp", "decision_record": "all",
             "undirected_header": "X-RateLimit-Error"}"#,
    )
    .unwrap();
    assert_eq!(config.decision_record, RecordMode::All);
    assert_eq!(
        config.undirected_header.as_deref(),
        Some("x-ratelimit-error")
    );
    let config = FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp", "decision_record": "off", "undirected_header": null}"#,
    )
    .unwrap();
    assert_eq!(config.decision_record, RecordMode::Off);
    assert_eq!(config.undirected_header, None);
    assert!(
        error_of(r#"{"control_plane_cluster": "cp", "undirected_header": "bad header"}"#)
            .starts_with("undirected_header: ")
    );
    assert!(
        error_of(r#"{"control_plane_cluster": "cp", "decision_record": "some"}"#)
            .starts_with("decision_record: unknown variant")
    );
}

fn error_of(json: &str) -> String {
    FilterConfig::from_json(json.as_bytes())
        .unwrap_err()
        .to_string()
}

#[test]
fn a_configuration_with_every_field_parses() {
    let config = FilterConfig::from_json(
        br#"{
          "control_plane_cluster": "sluice_control_plane",
          "proxy_id": "envoy-a",
          "zone": "eu-west-1a",
          "bucket_key": [
            {"source": "header", "name": "X-Tenant", "default": "anonymous"},
            {"source": "authority"},
            {"source": "path_prefix", "segments": 1},
            {"source": "route_name"},
            {"source": "literal", "value": "api"}
          ],
          "bucket_separator": "/",
          "report_interval_ms": 250,
          "retry_after_seconds": 1,
          "max_buckets": 10000
        }"#,
    )
    .unwrap();
    assert_eq!(config.control_plane_cluster, "sluice_control_plane");
    assert_eq!(config.proxy_id.as_deref(), Some("envoy-a"));
    assert_eq!(config.zone.as_deref(), Some("eu-west-1a"));
    assert!(config.bucket_key.uses_route_name());
    let expected = BucketKeySpec::new(
        vec![
            KeyPart {
                source: KeySource::Header("x-tenant".into()),
                default: "anonymous".into(),
            },
            KeyPart {
                source: KeySource::Authority,
                default: "-".into(),
            },
            KeyPart {
                source: KeySource::PathPrefix(1),
                default: "-".into(),
            },
            KeyPart {
                source: KeySource::RouteName,
                default: "-".into(),
            },
            KeyPart {
                source: KeySource::Literal("api".into()),
                default: String::new(),
            },
        ],
        "/".into(),
    );
    assert_eq!(config.bucket_key, expected);
}

#[test]
fn defaults_apply() {
    let config = FilterConfig::from_json(br#"{"control_plane_cluster": "cp"}"#).unwrap();
    assert_eq!(config.proxy_id, None);
    assert_eq!(config.zone, None);
    assert_eq!(config.report_interval_ms, 250);
    assert_eq!(config.retry_after_seconds, 1);
    assert_eq!(config.max_buckets, 10_000);
    let authority = BucketKeySpec::new(
        vec![KeyPart {
            source: KeySource::Authority,
            default: "-".into(),
        }],
        "/".into(),
    );
    assert_eq!(config.bucket_key, authority);
}

#[test]
fn range_errors_name_the_field() {
    assert_eq!(
        error_of(r#"{"control_plane_cluster": "cp", "report_interval_ms": 10}"#),
        "report_interval_ms: must be between 50 and 60000, got 10"
    );
    assert_eq!(
        error_of(r#"{"control_plane_cluster": "cp", "retry_after_seconds": 0}"#),
        "retry_after_seconds: must be between 1 and 3600, got 0"
    );
    assert_eq!(
        error_of(r#"{"control_plane_cluster": "cp", "max_buckets": 1000001}"#),
        "max_buckets: must be between 1 and 1000000, got 1000001"
    );
    assert_eq!(
        error_of(
            r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "path_prefix", "segments": 0}]}"#
        ),
        "bucket_key[0].segments: must be between 1 and 32, got 0"
    );
    assert_eq!(
        error_of(r#"{"control_plane_cluster": "cp", "zone": " "}"#),
        "zone: must be between 1 and 128 bytes when set"
    );
}

#[test]
fn type_errors_name_the_field() {
    let err = error_of(r#"{"control_plane_cluster": "cp", "report_interval_ms": "fast"}"#);
    assert!(err.starts_with("report_interval_ms: invalid type"), "{err}");
    let err = error_of(
        r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "authority"}, {"source": "header"}]}"#,
    );
    assert!(
        err.starts_with("bucket_key[1]: missing field `name`"),
        "{err}"
    );
}

#[test]
fn unknown_fields_and_sources_are_rejected() {
    let err = error_of(r#"{"control_plane_cluster": "cp", "report_interval": 100}"#);
    assert!(err.contains("unknown field `report_interval`"), "{err}");
    let err = error_of(r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "cookie"}]}"#);
    assert!(
        err.starts_with("bucket_key[0].source: unknown variant `cookie`"),
        "{err}"
    );
    let err = error_of(
        r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "authority", "nme": "x"}]}"#,
    );
    assert!(err.contains("unknown field `nme`"), "{err}");
}

#[test]
fn classification_and_behaviour_keys_parse() {
    let config = FilterConfig::from_json(
        br#"{
          "control_plane_cluster": "cp",
          "tenant": {"source": "header", "name": "X-Tenant"},
          "priority": {
            "header": "X-Priority",
            "values": {"high": "critical", "batch": "bulk"},
            "routes": {"checkout": "critical"},
            "default": "degraded"
          },
          "directive_ttl_ms": 5000,
          "fallback": "local_limit",
          "new_bucket": {"action": "local_limit", "fleet_limit_rps": 100, "expected_proxies": 4},
          "response": {"reason_header": "X-Shed-Reason", "x_ratelimit_headers": false, "ietf_headers": true, "policy_name": "edge"},
          "directive_poll_ms": 10
        }"#,
    )
    .unwrap();
    let tenant = config.classifier.tenant.clone().unwrap();
    assert_eq!(tenant.source, KeySource::Header("x-tenant".into()));
    assert_eq!(tenant.default, "default");
    let priority = config.classifier.priority.clone().unwrap();
    assert_eq!(priority.header.as_deref(), Some("x-priority"));
    assert_eq!(
        priority.values,
        vec![
            ("batch".to_owned(), Priority::Bulk),
            ("high".to_owned(), Priority::Critical)
        ]
    );
    assert_eq!(
        priority.routes,
        vec![("checkout".to_owned(), Priority::Critical)]
    );
    assert_eq!(priority.default, Priority::Degraded);
    assert_eq!(config.directive_ttl.as_millis(), 5000);
    assert_eq!(config.fallback, Fallback::LocalLimit);
    assert_eq!(
        config.new_bucket,
        NewBucketPolicy::LocalLimit {
            fleet_limit_rps: 100.0,
            expected_proxies: 4
        }
    );
    assert_eq!(config.response.reason_header, "x-shed-reason");
    assert!(!config.response.x_ratelimit_headers);
    assert_eq!(config.response.policy_name, "edge");
    assert_eq!(config.directive_poll_ms, 10);
}

#[test]
fn behaviour_defaults_are_explicit() {
    let config = FilterConfig::from_json(br#"{"control_plane_cluster": "cp"}"#).unwrap();
    assert_eq!(config.classifier.tenant, None);
    assert_eq!(config.classifier.priority, None);
    assert_eq!(config.directive_ttl, DirectiveTtl::DEFAULT);
    assert_eq!(config.fallback, Fallback::KeepLast);
    assert_eq!(config.new_bucket, NewBucketPolicy::Allow);
    assert_eq!(config.response, ResponseSettings::default());
    assert_eq!(config.directive_poll_ms, 20);
    // A priority header alone maps the class names themselves.
    let config = FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp", "priority": {"header": "x-priority"}}"#,
    )
    .unwrap();
    let priority = config.classifier.priority.unwrap();
    assert_eq!(priority.values.len(), 4);
    assert_eq!(priority.default, Priority::BestEffort);
}

#[test]
fn new_keys_name_the_field_in_errors() {
    let cases = [
        (
            r#""directive_ttl_ms": 10"#,
            "directive_ttl_ms: must be between 1000 and 86400000, got 10",
        ),
        // The control plane's rule: below a second, proxies would fall
        // back between two heartbeats.
        (
            r#""directive_ttl_ms": 999"#,
            "directive_ttl_ms: must be between 1000 and 86400000, got 999",
        ),
        (
            r#""directive_poll_ms": 1"#,
            "directive_poll_ms: must be between 4 and 100, got 1",
        ),
        (
            r#""new_bucket": {"action": "local_limit", "fleet_limit_rps": -1, "expected_proxies": 2}"#,
            "new_bucket.fleet_limit_rps: must be a finite number between 0 and 1e9, got -1",
        ),
        (
            r#""new_bucket": {"action": "local_limit", "fleet_limit_rps": 1, "expected_proxies": 0}"#,
            "new_bucket.expected_proxies: must be between 1 and 100000, got 0",
        ),
        (
            r#""priority": {"default": "bulk"}"#,
            "priority: needs `header` or `routes` (or both)",
        ),
        (
            r#""priority": {"routes": {"r": "bulk"}, "values": {"a": "bulk"}}"#,
            "priority.values: needs `header`",
        ),
        (
            r#""response": {"reason_header": "bad header"}"#,
            "response.reason_header: must be a header name of 1 to 64 bytes without whitespace or ':'",
        ),
        (
            r#""tenant": {"source": "header", "name": "x", "default": ""}"#,
            "tenant.default: must be between 1 and 256 bytes",
        ),
    ];
    for (field, expected) in cases {
        assert_eq!(
            error_of(&format!(r#"{{"control_plane_cluster": "cp", {field}}}"#)),
            expected
        );
    }
    let prefixed = [
        (
            r#""fallback": "panic""#,
            "fallback: unknown variant `panic`",
        ),
        (r#""fallback": 3"#, "fallback: "),
        (
            r#""new_bucket": {"action": "deny"}"#,
            "new_bucket.action: unknown variant `deny`",
        ),
        (
            r#""new_bucket": {"action": "allow", "rps": 1}"#,
            "new_bucket: unknown field `rps`",
        ),
        (
            r#""priority": {"header": "x", "values": {"a": "urgent"}}"#,
            "priority.values.a: unknown variant `urgent`",
        ),
        (
            r#""priority": {"header": "x", "colour": 1}"#,
            "priority.colour: unknown field `colour`",
        ),
        (
            r#""response": {"x_ratelimit_headers": "no"}"#,
            "response.x_ratelimit_headers: invalid type",
        ),
        (
            r#""tenant": {"source": "cookie"}"#,
            "tenant.source: unknown variant `cookie`",
        ),
    ];
    for (field, expected) in prefixed {
        let err = error_of(&format!(r#"{{"control_plane_cluster": "cp", {field}}}"#));
        assert!(err.starts_with(expected), "{field}: {err}");
    }
}

#[test]
fn structural_errors_are_reported() {
    assert!(error_of("").starts_with("configuration: is empty"));
    assert!(error_of("{}").contains("missing field `control_plane_cluster`"));
    assert_eq!(
        error_of(r#"{"control_plane_cluster": " "}"#),
        "control_plane_cluster: must not be empty"
    );
    assert_eq!(
        error_of(r#"{"control_plane_cluster": "cp", "bucket_key": []}"#),
        "bucket_key: must have between 1 and 8 parts"
    );
    assert_eq!(
        error_of(
            r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "header", "name": "x", "default": ""}]}"#
        ),
        "bucket_key[0].default: must be between 1 and 256 bytes"
    );
    assert_eq!(
        error_of(
            r#"{"control_plane_cluster": "cp", "bucket_key": [{"source": "header", "name": "a b"}]}"#
        ),
        "bucket_key[0].name: must be a non-empty header name without whitespace"
    );
}

#[test]
fn parts_carry_every_setting_and_name_the_proxy_only_when_unnamed() {
    let config = FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp", "zone": "z1", "report_interval_ms": 500,
             "max_buckets": 300, "decision": "coin", "allowance": null,
             "upstream_sample_every": 0, "directive_poll_ms": 40,
             "undirected_header": null}"#,
    )
    .unwrap();
    let expected = config.clone();
    let parts = config.into_parts(
        || ProxyIdentity::Named("node".to_owned()),
        || "node-zone".to_owned(),
    );
    assert_eq!(parts.agent.control_plane_cluster, "cp");
    assert_eq!(
        parts.agent.proxy_id,
        ProxyIdentity::Named("node".to_owned())
    );
    assert_eq!(parts.agent.zone, "z1");
    assert_eq!(parts.agent.report_interval_ms, 500);
    assert_eq!(parts.agent.max_buckets, 300);
    assert_eq!(parts.agent.directive_ttl, expected.directive_ttl);
    assert_eq!(parts.agent.fallback, expected.fallback);
    assert_eq!(parts.agent.new_bucket, expected.new_bucket);
    assert_eq!(*parts.agent.responses, expected.response);
    assert_eq!(
        parts.agent.stream_idle_timeout_ms,
        expected.stream_idle_timeout_ms
    );
    assert_eq!(parts.agent.decision, DecisionMode::Coin);
    assert_eq!(parts.agent.allowance, None);
    assert_eq!(parts.agent.upstream_sample_every, 0);
    assert_eq!(parts.request.classifier, expected.classifier);
    assert_eq!(parts.request.decision_record, expected.decision_record);
    assert_eq!(parts.request.undirected_header, None);
    assert_eq!(parts.directive_poll_ms, 40);

    let named = FilterConfig::from_json(br#"{"control_plane_cluster": "cp", "proxy_id": "p"}"#)
        .unwrap()
        .into_parts(|| unreachable!("named"), || "node-zone".to_owned());
    assert_eq!(named.agent.proxy_id, ProxyIdentity::Named("p".to_owned()));

    let unnamed = FilterConfig::from_json(br#"{"control_plane_cluster": "cp", "proxy_id": null}"#)
        .unwrap()
        .into_parts(|| ProxyIdentity::PerProcess, String::new);
    assert_eq!(unnamed.agent.proxy_id, ProxyIdentity::PerProcess);
    assert_eq!(named.agent.zone, "node-zone");
}

#[test]
fn a_configuration_of_defaults_gives_the_agents_defaults() {
    // `AgentSettings::new` and the configuration share their defaults; this
    // keeps either from drifting from the other.
    let parts = FilterConfig::from_json(br#"{"control_plane_cluster": "cp", "proxy_id": "p"}"#)
        .unwrap()
        .into_parts(|| unreachable!("named"), String::new);
    assert_eq!(parts.agent, AgentSettings::new("cp", "p"));
}

#[test]
fn cost_rules_are_validated_with_their_field_named() {
    let config = FilterConfig::from_json(
        br#"{"control_plane_cluster": "cp", "cost_rules": [
            {"route": "chat", "bucket": "llm/*", "cost": {"estimate": {"source": "constant", "value": 500}}}
        ]}"#,
    )
    .unwrap();
    assert_eq!(config.costs.find(Some(b"chat"), "llm/a"), Some(0));
    assert!(
        FilterConfig::from_json(br#"{"control_plane_cluster": "cp"}"#)
            .unwrap()
            .costs
            .is_empty()
    );
    assert!(
        error_of(
            r#"{"control_plane_cluster": "cp", "cost_rules": [{"bucket": "*",
                "cost": {"estimate": {"source": "constant", "value": 0}}}]}"#
        )
        .starts_with("cost_rules[0].cost.estimate.value: ")
    );
    assert!(
        error_of(
            r#"{"control_plane_cluster": "cp", "cost_rules": [{"bucket": "*",
                "cost": {"estimate": {"source": "constant", "value": 5}},
                "actual": {"response_header": "x:y"}}]}"#
        )
        .starts_with("cost_rules[0].actual.response_header: ")
    );
    assert!(
        error_of(r#"{"control_plane_cluster": "cp", "cost_rules": [{"bucket": "*", "costs": 1}]}"#)
            .starts_with("cost_rules[0].costs: unknown field")
    );
}
