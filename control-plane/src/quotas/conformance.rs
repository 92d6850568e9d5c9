//! Conformance with envoyproxy/ratelimit's loader and lookup
//! (`test/config/config_test.go` on `src/config/config_impl.go`) and its
//! service's global modes (`test/service/ratelimit_test.go`): every shape
//! its loader accepts or refuses, the limit each descriptor finds and the
//! key its statistics count under. Each case names the test it mirrors;
//! the configurations are written here, in its format.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use super::engine::Quotas;
use super::lookup::{self, MetricKey};
use super::settings::QuotaSettings;
use crate::config::quota_file::{LoadOptions, QuotaConfig, Unit};

fn load(files: &[(&str, &str)], options: LoadOptions) -> Result<QuotaConfig, String> {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(name, text)| ((*name).to_owned(), (*text).to_owned()))
        .collect();
    QuotaConfig::from_files_with(&files, options).map_err(|err| err.to_string())
}

fn one(yaml: &str) -> Result<QuotaConfig, String> {
    load(&[("test.yaml", yaml)], LoadOptions::default())
}

/// What a descriptor finds: its quota (`None`: unlimited), the metrics key
/// and the patterns it shares its counter under.
type Found = (Option<(u32, Unit)>, String, Option<Vec<Option<String>>>);

fn find(config: &QuotaConfig, domain: &str, entries: &[(&str, &str)]) -> Option<Found> {
    let root = config.domains.get(domain)?;
    lookup::find(root, domain, entries).map(|m| {
        let key = match m.metric_key {
            MetricKey::Configured(key) => key.to_owned(),
            MetricKey::PerValue(key) => key,
        };
        let shared = m
            .shared
            .map(|s| s.into_iter().map(|p| p.map(str::to_owned)).collect());
        (m.limit.quota, key, shared)
    })
}

fn quota(config: &QuotaConfig, domain: &str, entries: &[(&str, &str)]) -> Option<(u32, Unit)> {
    find(config, domain, entries).and_then(|(quota, _, _)| quota)
}

fn key(config: &QuotaConfig, domain: &str, entries: &[(&str, &str)]) -> String {
    find(config, domain, entries)
        .unwrap_or_else(|| panic!("no limit for {entries:?}"))
        .1
}

const BASIC: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
"#;

/// `TestBasicConfig`: defaults and values at two levels, a value without a
/// limit (allow-listed), unlimited, a named limit, a detailed metric.
#[test]
fn basic_config() {
    let c = one(BASIC).unwrap();
    let d = "test-domain";
    assert_eq!(find(&c, "foo_domain", &[("key1", "value1")]), None);
    assert_eq!(find(&c, d, &[]), None);
    assert_eq!(find(&c, d, &[("key1", "something")]), None);
    assert_eq!(find(&c, d, &[("key1", "value1")]), None);
    assert_eq!(
        find(&c, d, &[("key2", "value2"), ("subkey", "subvalue")]),
        None
    );
    assert_eq!(
        find(&c, d, &[("key5", "value5"), ("subkey5", "subvalue")]),
        None
    );
    let sub = [("key1", "value1"), ("subkey1", "something")];
    assert_eq!(quota(&c, d, &sub), Some((5, Unit::Second)));
    assert_eq!(key(&c, d, &sub), "test-domain.key1_value1.subkey1");
    let subvalue = [("key1", "value1"), ("subkey1", "subvalue1")];
    assert_eq!(quota(&c, d, &subvalue), Some((10, Unit::Second)));
    assert_eq!(
        key(&c, d, &subvalue),
        "test-domain.key1_value1.subkey1_subvalue1"
    );
    assert_eq!(
        quota(&c, d, &[("key2", "something")]),
        Some((20, Unit::Minute))
    );
    assert_eq!(key(&c, d, &[("key2", "something")]), "test-domain.key2");
    assert_eq!(
        quota(&c, d, &[("key2", "value2")]),
        Some((30, Unit::Minute))
    );
    assert_eq!(key(&c, d, &[("key2", "value2")]), "test-domain.key2_value2");
    assert_eq!(find(&c, d, &[("key2", "value3")]), None);
    assert_eq!(quota(&c, d, &[("key3", "foo")]), Some((1, Unit::Hour)));
    let root = &c.domains[d];
    let named = lookup::find(root, d, &[("key4", "foo")]).unwrap();
    assert_eq!(named.limit.name, "key4_rate_limit");
    assert_eq!(named.limit.quota, Some((1, Unit::Day)));
    assert_eq!(
        lookup::find(root, d, &[("key3", "foo")])
            .unwrap()
            .limit
            .name,
        ""
    );
    let unlimited = find(&c, d, &[("key6", "foo")]).unwrap();
    assert_eq!(
        (unlimited.0, unlimited.1.as_str()),
        (None, "test-domain.key6")
    );
    assert_eq!(
        key(&c, d, &[("key7", "unspecified_value")]),
        "test-domain.key7_unspecified_value"
    );
    assert_eq!(
        key(&c, d, &[("key7", "another_value")]),
        "test-domain.key7_another_value"
    );
}

/// Every shape the loader refuses, with its message (`TestEmptyDomain`,
/// `TestDuplicateDomain`, `TestEmptyKey`, `TestDuplicateKey`,
/// `TestBadLimitUnit`, `TestReplacesSelf`, `TestReplacesEmpty`,
/// `TestBadYaml`, `TestMisspelledKey`, `TestNonStringKey`,
/// `TestNonMapList`, `TestUnlimitedWithRateLimitUnit`, and
/// `share_threshold` without a wildcard) and where it is.
#[test]
fn refused_shapes() {
    for (mirrors, yaml, expected) in [
        (
            "TestEmptyDomain",
            "descriptors:\n",
            "test.yaml: domain: config file cannot have empty domain",
        ),
        (
            "TestEmptyDomain (empty file)",
            "",
            "config file cannot have empty domain",
        ),
        (
            "TestEmptyKey",
            "domain: test-domain\ndescriptors:\n  - value: value1\n",
            "test.yaml:3:5: descriptors[0]: descriptor has empty key",
        ),
        (
            "TestDuplicateKey",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n",
            "test.yaml:6:5: descriptors[1]: duplicate descriptor composite key 'key1_value1'",
        ),
        (
            "TestBadLimitUnit",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
            "test.yaml:3:5: descriptors[0]: rate_limit.unit: invalid rate limit unit 'foo'",
        ),
        (
            "TestBadLimitUnit (no unit)",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 5}\n",
            "invalid rate limit unit ''",
        ),
        (
            "TestBadLimitUnit (UNKNOWN)",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 5}\n",
            "invalid rate limit unit 'unknown'",
        ),
        (
            "TestReplacesSelf",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name: self\n          unit: second\n          requests_per_unit: 5\n",
            "test.yaml:6:9: descriptors[0].descriptors[0]: rate_limit.replaces: replaces should not contain name of same descriptor",
        ),
        (
            "TestReplacesEmpty",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n",
            "rate_limit.replaces: should not have an empty replaces entry",
        ),
        ("TestBadYaml", "'''\n", "test.yaml"),
        (
            "TestMisspelledKey",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
            "test.yaml:5:5: descriptors[0]: unknown field `ratelimit`",
        ),
        (
            "TestMisspelledKey (2)",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
            "unknown field `requestsperunit`",
        ),
        (
            "TestNonStringKey",
            "0.25: test-domain\ndescriptors:\n  - key: key1\n",
            "test.yaml:1:1",
        ),
        (
            "TestNonMapList",
            "domain: test-domain\ndescriptors:\n  - a\n  - b\n  - c\n",
            "test.yaml:3:5: descriptors[0]: invalid type: string \"a\"",
        ),
        (
            "TestUnlimitedWithRateLimitUnit",
            "domain: test-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
            "test.yaml:3:5: descriptors[0]: rate_limit.unit: should not specify rate limit unit when unlimited",
        ),
        (
            "share_threshold without a wildcard",
            "domain: d\ndescriptors:\n  - key: files\n    value: files\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
            "share_threshold can only be used with wildcard values (containing '*'), but found key 'files_files'",
        ),
        (
            "validateYamlKeys: a float value",
            "domain: d\ndescriptors:\n  - key: k\n    value: 1.5\n",
            "descriptors[0].value",
        ),
        (
            "validateYamlKeys: a float limit",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
            "requests_per_unit",
        ),
        (
            "a negative limit",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
            "requests_per_unit",
        ),
        (
            "several documents",
            "domain: a\n---\ndomain: b\n",
            "several YAML documents",
        ),
    ] {
        let err = one(yaml).map(|_| ()).unwrap_err();
        assert!(
            err.contains(expected),
            "{mirrors}: expected {expected:?} in\n{err}"
        );
    }
    // TestDuplicateDomain: a second file naming the domain.
    let err = load(
        &[
            ("basic.yaml", BASIC),
            (
                "duplicate_domain.yaml",
                "domain: test-domain\ndescriptors:\n",
            ),
        ],
        LoadOptions::default(),
    )
    .unwrap_err();
    assert!(
        err.starts_with("duplicate_domain.yaml:1:1: domain: duplicate domain \"test-domain\""),
        "{err}"
    );
}

/// `TestDomainMerge`, `TestDuplicateKeyDomainMerge`: with
/// `MERGE_DOMAIN_CONFIG`, files naming one domain merge; a descriptor in
/// both is still refused.
#[test]
fn domain_merge() {
    let first = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n";
    let second = "domain: test-domain\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n";
    let merge = LoadOptions {
        merge_domains: true,
    };
    let c = load(&[("one.yaml", first), ("two.yaml", second)], merge).unwrap();
    assert_eq!(
        quota(&c, "test-domain", &[("key1", "value1")]),
        Some((10, Unit::Minute))
    );
    assert_eq!(
        quota(&c, "test-domain", &[("key2", "value2")]),
        Some((20, Unit::Minute))
    );
    let err = load(&[("one.yaml", first), ("again.yaml", first)], merge).unwrap_err();
    assert!(
        err.contains("duplicate descriptor composite key 'test-domain.key1_value1'"),
        "{err}"
    );
}

/// `TestShadowModeConfig`, and the fields added to the format since 2025
/// (`quota_mode`, `metadata`, units in any case) on
/// `examples/ratelimit/config/example.yaml`'s shapes.
#[test]
fn fields_of_the_current_format() {
    let c = one(r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: SECOND, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: Second, requests_per_unit: 10}
        shadow_mode: true
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: MiNuTe, requests_per_unit: 1}
    metadata:
      service_with_quota:
        name: "service_1"
      weight: 2
"#)
    .unwrap();
    let root = &c.domains["test-domain"];
    let shadow = lookup::find(
        root,
        "test-domain",
        &[("key1", "value1"), ("subkey1", "subvalue1")],
    )
    .unwrap();
    assert!(shadow.limit.shadow_mode);
    assert_eq!(shadow.limit.quota, Some((10, Unit::Second)));
    let plain = lookup::find(root, "test-domain", &[("key1", "value1"), ("subkey1", "x")]).unwrap();
    assert!(!plain.limit.shadow_mode);
    let service = lookup::find(root, "test-domain", &[("service", "service_1")]).unwrap();
    assert!(service.limit.quota_mode);
    assert_eq!(service.limit.quota, Some((1, Unit::Minute)));
    let metadata = service.limit.metadata.as_ref().unwrap();
    assert_eq!(metadata["service_with_quota"]["name"], "service_1");
    assert_eq!(metadata["weight"], 2);
}

const WILDCARDS: &str = r#"
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noVal
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20}
"#;

/// `TestWildcardConfig`: trailing, middle and several `*`; wildcards of a
/// nested level; the pattern in the statistics' key.
#[test]
fn wildcards() {
    let c = one(WILDCARDS).unwrap();
    let d = "test-domain";
    assert_eq!(key(&c, d, &[("noVal", "foo1")]), "test-domain.noVal");
    assert_eq!(key(&c, d, &[("wild", "foo1")]), "test-domain.wild_foo*");
    assert_eq!(key(&c, d, &[("wild", "foo2")]), "test-domain.wild_foo*");
    assert_eq!(
        key(&c, d, &[("nestedWild", "val1"), ("wild", "goo2")]),
        "test-domain.nestedWild_val1.wild_goo*"
    );
    assert_eq!(find(&c, d, &[("wild", "bar")]), None);
    assert_eq!(find(&c, d, &[("noWild", "foo1")]), None, "no eager match");
    for value in ["barab", "bar123b", "barb"] {
        assert_eq!(
            key(&c, d, &[("midWild", value)]),
            "test-domain.midWild_bar*b",
            "{value}"
        );
    }
    for value in ["bara", "xbarb"] {
        assert_eq!(find(&c, d, &[("midWild", value)]), None, "{value}");
    }
    for value in ["foo123bar456baz", "foobarbaz"] {
        assert_eq!(
            quota(&c, d, &[("multiWild", value)]),
            Some((10, Unit::Minute))
        );
        assert_eq!(
            key(&c, d, &[("multiWild", value)]),
            "test-domain.multiWild_foo*bar*baz"
        );
    }
    for value in ["foo123baz", "bar456baz"] {
        assert_eq!(find(&c, d, &[("multiWild", value)]), None, "{value}");
    }
    // A wildcard is its own level's: `goo*` is not found at the top.
    assert_eq!(find(&c, d, &[("wild", "goo1")]), None);
}

/// `TestDetailedMetric`: a detailed limit's key names every entry with
/// its value (even a default's, even an empty value's `_`).
#[test]
fn detailed_metric() {
    let nested = |detailed_outer: bool, detailed_inner: bool| {
        one(&format!(
            "domain: nested\ndescriptors:\n  - key: key-1\n    detailed_metric: {detailed_outer}\n    rate_limit: {{unit: minute, requests_per_unit: 100}}\n    descriptors:\n      - key: key-2\n        detailed_metric: {detailed_inner}\n        rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
        ))
        .unwrap()
    };
    let top = [("key-1", "value-1")];
    let both = [("key-1", "value-1"), ("key-2", "value-2")];
    assert_eq!(
        key(&nested(true, false), "nested", &top),
        "nested.key-1_value-1"
    );
    assert_eq!(key(&nested(false, false), "nested", &top), "nested.key-1");
    assert_eq!(
        key(&nested(true, true), "nested", &both),
        "nested.key-1_value-1.key-2_value-2"
    );
    assert_eq!(
        key(&nested(false, false), "nested", &both),
        "nested.key-1.key-2"
    );
    let empty = one("domain: d\ndescriptors:\n  - key: k\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    assert_eq!(key(&empty, "d", &[("k", "")]), "d.k_");
}

/// `TestValueToMetric_*`: levels flagged `value_to_metric` name the
/// request's value; a detailed limit still names them all.
#[test]
fn value_to_metric() {
    let c = one(r#"
domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: plain
    descriptors:
      - key: k2
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: detailed
    value_to_metric: true
    descriptors:
      - key: subject_id
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
"#)
    .unwrap();
    let d = "domain";
    assert_eq!(
        key(
            &c,
            d,
            &[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123")
            ]
        ),
        "domain.route_draw.http_method_GET.subject_id"
    );
    assert_eq!(
        key(&c, d, &[("k1", "X"), ("k2", "Y"), ("k3", "Z")]),
        "domain.k1.k2_Y.k3"
    );
    assert_eq!(
        key(&c, d, &[("plain", "X"), ("k2", "Y")]),
        "domain.plain.k2"
    );
    assert_eq!(
        key(&c, d, &[("detailed", "x"), ("subject_id", "123")]),
        "domain.detailed_x.subject_id_123"
    );
    assert_eq!(
        key(
            &c,
            d,
            &[
                ("user", "alice"),
                ("action", "readfile"),
                ("resource", "documents")
            ]
        ),
        "domain.user_alice.action_readfile.resource"
    );
    // An empty value names the key alone.
    assert_eq!(
        key(
            &c,
            d,
            &[("route", ""), ("http_method", "GET"), ("subject_id", "123")]
        ),
        "domain.route.http_method_GET.subject_id"
    );
}

const SHARE: &str = r#"
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 200}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 60}
"#;

/// `TestShareThreshold`, `TestWildcardStatsBehavior`: values matching a
/// `share_threshold` wildcard share the pattern's counter and statistics;
/// an exact value keeps its own.
#[test]
fn share_threshold() {
    let c = one(SHARE).unwrap();
    let d = "test-domain";
    let shared = |patterns: &[Option<&str>]| {
        Some(
            patterns
                .iter()
                .map(|p| p.map(str::to_owned))
                .collect::<Vec<_>>(),
        )
    };
    for value in ["files/a.pdf", "files/b.csv"] {
        let found = find(&c, d, &[("files", value)]).unwrap();
        assert_eq!(found.1, "test-domain.files_files/*");
        assert_eq!(found.2, shared(&[Some("files/*")]));
    }
    let nested = find(
        &c,
        d,
        &[("nested", "parent"), ("files", "nested/file1.txt")],
    )
    .unwrap();
    assert_eq!(nested.1, "test-domain.nested_parent.files_nested/*");
    assert_eq!(nested.2, shared(&[None, Some("nested/*")]));
    // share_threshold wins over value_to_metric and detailed_metric.
    assert_eq!(
        key(&c, d, &[("route", "api/v1"), ("method", "GET")]),
        "test-domain.route_api/*.method"
    );
    assert_eq!(
        key(&c, d, &[("service", "svc/user"), ("endpoint", "get")]),
        "test-domain.service_svc/*.endpoint_get"
    );
    let mixed = find(
        &c,
        d,
        &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
    )
    .unwrap();
    assert_eq!(mixed.1, "test-domain.path_path/*.file_file/*.type");
    assert_eq!(mixed.2, shared(&[Some("path/*"), None, None]));
    // An exact value keeps its own counter and key.
    let own = find(&c, d, &[("file", "test1")]).unwrap();
    assert_eq!(
        (own.0, own.1.as_str(), own.2),
        (Some((50, Unit::Minute)), "test-domain.file_test1", None)
    );
    for value in ["test2", "test23", "test123"] {
        let found = find(&c, d, &[("file", value)]).unwrap();
        assert_eq!(found.1, "test-domain.file_test*");
        assert_eq!(found.2, shared(&[Some("test*")]));
    }
    assert_eq!(
        key(&c, d, &[("midpath", "/api-beta-v1")]),
        "test-domain.midpath_/api*v1"
    );
    assert_eq!(find(&c, d, &[("midpath", "/api/v2")]), None);
    let both = find(&c, d, &[("tenant", "t1prod"), ("resource", "resAv2")]).unwrap();
    assert_eq!(both.1, "test-domain.tenant_t*prod.resource_res*v2");
    assert_eq!(both.2, shared(&[Some("t*prod"), Some("res*v2")]));
}

fn quotas_with(settings: QuotaSettings, yaml: &str) -> Quotas {
    let config = one(yaml).unwrap();
    Quotas::new(
        config,
        None,
        settings,
        Arc::new(|| 90_000),
        crate::metrics::ControlPlaneMetrics::new(1).quotas(),
    )
}

fn answer(quotas: &Quotas, descriptors: &[&str]) -> (i32, Vec<i32>) {
    let request = RateLimitRequest {
        domain: "quota-domain".to_owned(),
        descriptors: descriptors
            .iter()
            .map(|key| RateLimitDescriptor {
                entries: vec![Entry {
                    key: (*key).to_owned(),
                    value: "x".to_owned(),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    };
    let response = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(quotas.answer(&request))
        .unwrap();
    (
        response.overall_code,
        response.statuses.iter().map(|s| s.code).collect(),
    )
}

const MODES: &str = r#"
domain: quota-domain
descriptors:
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

/// `TestServicePerDescriptorQuotaMode`, `TestServiceQuotaModeOnly*`,
/// `TestServiceGlobalQuotaMode`, `TestServiceGlobalShadowMode`,
/// `TestServiceQuotaModeWithShadowMode`: quota-mode descriptors refuse
/// only together; the global modes; statuses keep their own codes.
#[test]
fn quota_and_shadow_modes() {
    const OK: i32 = Code::Ok as i32;
    const OVER: i32 = Code::OverLimit as i32;
    // Per descriptor: one quota over of two: OK; both: over limit.
    let quotas = quotas_with(QuotaSettings::default(), MODES);
    assert_eq!(answer(&quotas, &["quota", "quota2"]), (OK, vec![OK, OK]));
    assert_eq!(answer(&quotas, &["quota"]), (OVER, vec![OVER]));
    let quotas = quotas_with(QuotaSettings::default(), MODES);
    answer(&quotas, &["quota"]);
    assert_eq!(answer(&quotas, &["quota", "quota2"]), (OK, vec![OVER, OK]));
    assert_eq!(
        answer(&quotas, &["quota", "quota2"]),
        (OVER, vec![OVER, OVER])
    );
    // A regular descriptor over refuses whatever the quotas say.
    let quotas = quotas_with(QuotaSettings::default(), MODES);
    answer(&quotas, &["regular"]);
    assert_eq!(
        answer(&quotas, &["regular", "quota"]),
        (OVER, vec![OVER, OK])
    );
    // Global quota mode: the regular descriptor is a quota too.
    let global = QuotaSettings {
        global_quota_mode: true,
        ..QuotaSettings::default()
    };
    let quotas = quotas_with(global.clone(), MODES);
    answer(&quotas, &["regular"]);
    assert_eq!(answer(&quotas, &["regular", "quota"]), (OK, vec![OVER, OK]));
    assert_eq!(
        answer(&quotas, &["regular", "quota"]),
        (OVER, vec![OVER, OVER])
    );
    // Global shadow mode: OK whatever, the statuses as counted.
    let quotas = quotas_with(
        QuotaSettings {
            global_shadow_mode: true,
            ..global
        },
        MODES,
    );
    answer(&quotas, &["regular", "quota"]);
    assert_eq!(
        answer(&quotas, &["regular", "quota"]),
        (OK, vec![OVER, OVER])
    );
}
