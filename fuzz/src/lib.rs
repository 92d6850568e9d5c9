//! What each fuzz target checks, as plain functions of the input bytes.
//!
//! `cargo fuzz` (`just fuzz`) drives them with generated inputs; the
//! regression tests in `tests/regressions.rs` replay every input kept under
//! `fuzz/regressions/<target>/` on stable, so a finding stays fixed.
//!
//! Every check feeds untrusted bytes to the real parser or state machine and
//! asserts what must hold for any input: no panic, and the bounds the code
//! promises (key lengths, table sizes, ratios in `[0, 1]`, finite rates).

pub mod usage;

use std::borrow::Cow;

use prost::Message;
use sluice_agent::agent::Agent;
use sluice_agent::config::FilterConfig;
use sluice_agent::directives::DirectiveTable;
use sluice_agent::identity::ProxyIdentity;
use sluice_agent::metrics::Counter;
use sluice_agent::request::classify::RequestAttributes;
use sluice_agent::request::classify::{BucketKeySpec, KeyPart, KeySource};
use sluice_control_plane::config::Config;
use sluice_control_plane::fleet::{Fleet, StreamId};
use sluice_core::MAX_BUCKET_KEY_BYTES;
use sluice_proto::v1::{DirectiveBatch, ProxyMessage, proxy_message};

/// A check: panics when the input breaks an invariant.
pub type Check = fn(&[u8]);

/// Every target by name, for the regression runner.
pub const TARGETS: &[(&str, Check)] = &[
    ("filter_config", filter_config),
    ("limits_file", limits_file),
    ("directive_batch", directive_batch),
    ("bucket_key", bucket_key),
    ("report", report),
    ("header_bytes", header_bytes),
    ("usage_stream", usage::usage_stream),
    ("cost_rule", usage::cost_rule),
];

/// Directive tables in the checks hold at most this many buckets.
const TABLE_CAPACITY: usize = 64;

/// The plugin configuration parser: any bytes give a config or an error
/// naming a field, and a valid config derives bounded keys.
pub fn filter_config(data: &[u8]) {
    match FilterConfig::from_json(data) {
        Ok(config) => {
            let key = config.bucket_key.derive(&NoAttributes);
            assert!(
                key.len() <= MAX_BUCKET_KEY_BYTES,
                "key of {} bytes",
                key.len()
            );
        }
        Err(err) => assert!(!err.path.is_empty(), "error without a field: {err}"),
    }
}

/// The limits file parser: any text gives a config or a positioned error.
pub fn limits_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_yaml(text, "fuzz.yaml") {
        Ok(config) => {
            let table = config.limit_table();
            for rule in config.limits.as_slice() {
                let rate = rule.limit.rate().get();
                assert!(rate.is_finite() && rate >= 0.0);
                if let Some(budget) = rule.limit.budget() {
                    assert!(budget.amount().is_finite() && budget.amount() > 0.0);
                    assert!(!budget.unit().as_str().is_empty());
                }
            }
            let _ = table.limit_for("any");
        }
        Err(err) => assert!(err.to_string().starts_with("fuzz.yaml"), "{err}"),
    }
}

/// Directive decoding and merging: a decoded batch merges into a bounded
/// table holding only valid ratios, and the table survives its own shared
/// encoding.
pub fn directive_batch(data: &[u8]) {
    let Ok(batch) = DirectiveBatch::decode(data) else {
        return;
    };
    let buckets: Vec<String> = batch.directives.iter().map(|d| d.bucket.clone()).collect();
    let mut table = DirectiveTable::new(TABLE_CAPACITY);
    let outcome = table.merge(batch);
    assert!(table.len() <= TABLE_CAPACITY);
    assert!(outcome.applied + outcome.rejected == buckets.len());
    for bucket in &buckets {
        if let Some(ratio) = table.drop_ratio(bucket) {
            assert!((0.0..=1.0).contains(&ratio.get()), "{bucket}: {ratio:?}");
        }
    }
}

/// Bucket-key derivation: the input is split into header values for a spec
/// using every kind of part; keys stay within the byte cap and valid UTF-8.
pub fn bucket_key(data: &[u8]) {
    let mut fields = data.split(|&b| b == 0);
    let mut next = || {
        fields
            .next()
            .map(|field| String::from_utf8_lossy(field).into_owned())
    };
    let request = FuzzRequest {
        tenant: next(),
        authority: next(),
        path: next(),
        route: next(),
    };
    let separator = next().unwrap_or_default();
    let default = next().unwrap_or_default();
    let part = |source| KeyPart {
        source,
        default: default.clone(),
    };
    let spec = BucketKeySpec::new(
        vec![
            part(KeySource::Header("x-tenant".into())),
            part(KeySource::Authority),
            part(KeySource::PathPrefix(3)),
            part(KeySource::RouteName),
            part(KeySource::Literal("v1".into())),
        ],
        separator,
    );
    let key = spec.derive(&request);
    assert!(
        key.len() <= MAX_BUCKET_KEY_BYTES,
        "key of {} bytes",
        key.len()
    );
}

/// The filter's configuration in [`header_bytes`]: every kind of key part
/// reading a header, the authority, the path and the route name, a tenant
/// and a priority from headers, and a priority by route.
const HEADER_BYTES_CONFIG: &[u8] = br#"{
    "control_plane_cluster": "cp",
    "proxy_id": "fuzz",
    "bucket_key": [
        {"source": "header", "name": "x-key", "default": "key"},
        {"source": "authority", "default": "host"},
        {"source": "path_prefix", "segments": 2, "default": "path"},
        {"source": "route_name", "default": "route"},
        {"source": "literal", "value": "v1"}
    ],
    "tenant": {"source": "header", "name": "x-tenant", "default": "default"},
    "priority": {"header": "x-priority", "values": {"batch": "bulk"},
                 "routes": {"checkout": "critical"}, "default": "best_effort"},
    "decision_record": "all"
}"#;

/// Header bytes as a host hands them over, through the request path: the
/// input is split at NUL bytes into `x-key`, `:authority`, `:path`, the
/// route name, `x-tenant` and `x-priority`, read as raw bytes (no field is
/// cleaned up first), converted by the one rule for bytes that are not
/// UTF-8 (`request_attributes`), classified and decided by an agent. No
/// panic; the cell within its caps; each value that is not UTF-8 counted
/// and classified exactly as if the header were absent.
pub fn header_bytes(data: &[u8]) {
    let mut fields = data.split(|&b| b == 0).map(<[u8]>::to_vec);
    let request = RawRequest {
        key: fields.next(),
        authority: fields.next(),
        path: fields.next(),
        route: fields.next(),
        tenant: fields.next(),
        priority: fields.next(),
    };
    let config = FilterConfig::from_json(HEADER_BYTES_CONFIG);
    assert!(config.is_ok(), "the check's own configuration: {config:?}");
    let Ok(config) = config else {
        return;
    };
    // The same request with every value that is not UTF-8 left out.
    let absent = request.without_invalid();
    let always_read = [
        &request.key,
        &request.authority,
        &request.path,
        &request.route,
        &request.tenant,
        &request.priority,
    ]
    .into_iter()
    .filter(|field| {
        field
            .as_deref()
            .is_some_and(|b| std::str::from_utf8(b).is_err())
    })
    .count() as u64;

    let bucket = config.bucket_key.derive(&request);
    assert!(
        bucket.len() <= MAX_BUCKET_KEY_BYTES,
        "key of {} bytes",
        bucket.len()
    );
    assert_eq!(bucket, config.bucket_key.derive(&absent));

    let parts = config.into_parts(|| ProxyIdentity::Named("fuzz".into()), String::new);
    let classifier = parts.request.classifier;
    let mut agent = Agent::new(parts.agent.clone(), 1);
    let mut reference = Agent::new(parts.agent, 1);
    let decided = agent.admit_request(&classifier, &request);
    let expected = reference.admit_request(&classifier, &absent);
    assert_eq!(decided, expected);
    assert_eq!(agent.last_record(), reference.last_record());
    let counted = agent.metrics().pending(Counter::HeaderValuesInvalid);
    assert_eq!(reference.metrics().pending(Counter::HeaderValuesInvalid), 0);
    // The route name is read again for the priority when the header does
    // not decide it.
    let route_invalid = u64::from(
        request
            .route
            .as_deref()
            .is_some_and(|b| std::str::from_utf8(b).is_err()),
    );
    assert!(
        (always_read..=always_read + route_invalid).contains(&counted),
        "{counted} counted, {always_read} invalid fields"
    );
}

/// Report handling in the control plane: any decoded message from a proxy
/// leaves the fleet with finite, non-negative rates.
pub fn report(data: &[u8]) {
    let Ok(message) = ProxyMessage::decode(data) else {
        return;
    };
    let mut fleet = Fleet::new(Fleet::DEFAULT_CARRY_TICKS);
    let stream = StreamId(1);
    fleet.connect("fuzz", 1, stream);
    if let Some(proxy_message::Kind::Report(report)) = message.kind {
        let _ = fleet.report("fuzz", stream, &report);
    }
    for traffic in fleet.tick().buckets {
        let loads = std::iter::once(traffic.load).chain(traffic.cells.iter().map(|c| c.load));
        for load in loads {
            assert!(load.offered_rps.is_finite() && load.offered_rps >= 0.0);
            assert!(load.admitted_rps.is_finite() && load.admitted_rps >= 0.0);
        }
    }
}

struct NoAttributes;

impl RequestAttributes for NoAttributes {
    fn header(&self, _name: &str) -> Option<Cow<'_, [u8]>> {
        None
    }

    fn route_name(&self) -> Option<Cow<'_, [u8]>> {
        None
    }
}

struct FuzzRequest {
    tenant: Option<String>,
    authority: Option<String>,
    path: Option<String>,
    route: Option<String>,
}

impl RequestAttributes for FuzzRequest {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let value = match name {
            "x-tenant" => &self.tenant,
            ":authority" => &self.authority,
            ":path" => &self.path,
            _ => &None,
        };
        value
            .as_deref()
            .map(|value| Cow::Borrowed(value.as_bytes()))
    }

    fn route_name(&self) -> Option<Cow<'_, [u8]>> {
        self.route
            .as_deref()
            .map(|route| Cow::Borrowed(route.as_bytes()))
    }
}

/// A request's values as raw bytes: headers borrowed (as the native module
/// reads them), the route name copied out (as a proxy-wasm host call
/// returns it).
struct RawRequest {
    key: Option<Vec<u8>>,
    authority: Option<Vec<u8>>,
    path: Option<Vec<u8>>,
    route: Option<Vec<u8>>,
    tenant: Option<Vec<u8>>,
    priority: Option<Vec<u8>>,
}

impl RawRequest {
    /// The request with every value that is not UTF-8 removed.
    fn without_invalid(&self) -> Self {
        let valid = |field: &Option<Vec<u8>>| {
            field
                .clone()
                .filter(|bytes| std::str::from_utf8(bytes).is_ok())
        };
        Self {
            key: valid(&self.key),
            authority: valid(&self.authority),
            path: valid(&self.path),
            route: valid(&self.route),
            tenant: valid(&self.tenant),
            priority: valid(&self.priority),
        }
    }
}

impl RequestAttributes for RawRequest {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let value = match name {
            "x-key" => &self.key,
            ":authority" => &self.authority,
            ":path" => &self.path,
            "x-tenant" => &self.tenant,
            "x-priority" => &self.priority,
            _ => &None,
        };
        value.as_deref().map(Cow::Borrowed)
    }

    fn route_name(&self) -> Option<Cow<'_, [u8]>> {
        self.route.clone().map(Cow::Owned)
    }
}
