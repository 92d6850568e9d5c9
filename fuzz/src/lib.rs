//! What each fuzz target checks, as plain functions of the input bytes.
//!
//! `cargo fuzz` (`just fuzz`) drives them with generated inputs; the
//! regression tests in `tests/regressions.rs` replay every input kept under
//! `fuzz/regressions/<target>/` on stable, so a finding stays fixed.
//!
//! Every check feeds untrusted bytes to the real parser or state machine and
//! asserts what must hold for any input: no panic, and the bounds the code
//! promises (key lengths, table sizes, ratios in `[0, 1]`, finite rates).

use prost::Message;
use sluice_control_plane::config::Config;
use sluice_control_plane::fleet::{Fleet, StreamId};
use sluice_core::MAX_BUCKET_KEY_BYTES;
use sluice_filter::bucket_key::{BucketKeySpec, KeyPart, KeySource, RequestAttributes};
use sluice_filter::config::FilterConfig;
use sluice_filter::directives::DirectiveTable;
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
                assert!(rule.limit_rps.get().is_finite() && rule.limit_rps.get() >= 0.0);
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
    fn header(&self, _name: &str) -> Option<String> {
        None
    }

    fn route_name(&self) -> Option<String> {
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
    fn header(&self, name: &str) -> Option<String> {
        match name {
            "x-tenant" => self.tenant.clone(),
            ":authority" => self.authority.clone(),
            ":path" => self.path.clone(),
            _ => None,
        }
    }

    fn route_name(&self) -> Option<String> {
        self.route.clone()
    }
}
