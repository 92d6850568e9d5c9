//! The dynamic metadata of an answer (`RESPONSE_DYNAMIC_METADATA`,
//! `--quota-response-dynamic-metadata`), as envoyproxy/ratelimit builds it:
//! the domain, each descriptor's entries (`key=value`), limit override and
//! `hitsAddend`, the request's `hitsAddend`, and under `metadata` the
//! `metadata` of every limit that passed, merged (the first one's value
//! wins; maps merge key by key).

use std::collections::HashMap;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

use crate::config::quota_file::Unit;

/// The metadata of an answer to `request`, with the `metadata` of the
/// limits that passed, in request order.
pub(super) fn response<'a>(
    request: &RateLimitRequest,
    passed: impl Iterator<Item = &'a serde_json::Map<String, serde_json::Value>>,
) -> Struct {
    let mut fields = HashMap::new();
    fields.insert("domain".to_owned(), string(&request.domain));
    let descriptors = request
        .descriptors
        .iter()
        .map(|descriptor| {
            let mut fields = HashMap::new();
            let entries = descriptor
                .entries
                .iter()
                .map(|entry| string(&format!("{}={}", entry.key, entry.value)))
                .collect();
            fields.insert("entries".to_owned(), list(entries));
            if let Some(limit) = &descriptor.limit {
                let unit = Unit::from_wire(limit.unit).map_or_else(
                    || limit.unit.to_string(),
                    |u| u.as_str().to_ascii_uppercase(),
                );
                fields.insert(
                    "limit".to_owned(),
                    string(&format!(
                        "requests_per_unit:{} unit:{unit}",
                        limit.requests_per_unit
                    )),
                );
            }
            if let Some(hits) = descriptor.hits_addend {
                fields.insert("hitsAddend".to_owned(), number(hits.value as f64));
            }
            structure(Struct { fields })
        })
        .collect();
    fields.insert("descriptors".to_owned(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            number(f64::from(request.hits_addend)),
        );
    }
    let mut merged = Struct::default();
    for metadata in passed {
        merge(&mut merged, &from_json_map(metadata));
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_owned(), structure(merged));
    }
    Struct { fields }
}

/// Adds `source`'s fields `into` lacks; where both hold a struct, merges
/// them the same way.
fn merge(into: &mut Struct, source: &Struct) {
    for (key, value) in &source.fields {
        match into.fields.get_mut(key) {
            Some(Value {
                kind: Some(Kind::StructValue(existing)),
            }) => {
                if let Some(Kind::StructValue(incoming)) = &value.kind {
                    merge(existing, incoming);
                }
            }
            Some(_) => {}
            None => {
                into.fields.insert(key.clone(), value.clone());
            }
        }
    }
}

fn from_json_map(map: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map
            .iter()
            .map(|(key, value)| (key.clone(), from_json(value)))
            .collect(),
    }
}

fn from_json(value: &serde_json::Value) -> Value {
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(values) => Kind::ListValue(ListValue {
            values: values.iter().map(from_json).collect(),
        }),
        serde_json::Value::Object(map) => Kind::StructValue(from_json_map(map)),
    };
    Value { kind: Some(kind) }
}

fn string(text: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(text.to_owned())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(fields: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(fields)),
    }
}
