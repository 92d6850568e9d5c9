//! Which requests a cost rule applies to (a route name and/or a bucket
//! glob, the first match wins) and where their actual cost is read at
//! stream end (dynamic metadata, a response header or trailer, the body's
//! usage), validated from the filter configuration's `cost_rules`.

use serde::Deserialize;
use sluice_core::glob::Glob;

use super::cost::{CostRule, MAX_COST};

/// Most cost rules in one configuration: every request with a rule is
/// matched against them in order.
pub const MAX_COST_RULES: usize = 32;
/// Largest per-stream cap of the body parser.
pub const MAX_BODY_CAP_BYTES: usize = 65_536;
/// The body parser's per-stream cap unless configured.
pub const DEFAULT_BODY_CAP_BYTES: usize = 4_096;
/// Envoy AI Gateway's dynamic metadata namespace.
pub const AI_GATEWAY_NAMESPACE: &str = "io.envoy.ai_gateway";
/// Envoy AI Gateway's usual key for a request's total tokens.
pub const AI_GATEWAY_TOTAL_KEY: &str = "llm_total_token";
/// Longest metadata namespace, key or header name.
const MAX_NAME_BYTES: usize = 256;

/// A dynamic metadata entry: namespace and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataKey {
    /// E.g. `io.envoy.ai_gateway`.
    pub namespace: String,
    /// E.g. `llm_total_token`.
    pub key: String,
}

/// Where the actual cost of a stream is read, in order of preference:
/// metadata, header, trailer, body. Metadata, header and trailer carry the
/// cost itself; the body's usage is priced by the rule's weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActualSources {
    /// Dynamic metadata holding the cost; `None`: not read.
    pub metadata: Option<MetadataKey>,
    /// A response header holding the cost (lower case).
    pub response_header: Option<String>,
    /// A response trailer holding the cost (lower case).
    pub response_trailer: Option<String>,
    /// The body parser's per-stream cap; `None`: the body is not parsed.
    pub body_cap: Option<usize>,
}

/// One configured cost rule and the requests it applies to.
#[derive(Debug, Clone, PartialEq)]
pub struct CostRoute {
    /// The route name it applies to (all routes if `None`).
    pub route: Option<String>,
    /// The buckets it applies to (all buckets if `None`).
    pub bucket: Option<Glob>,
    /// How a usage or an estimate becomes a charge.
    pub rule: CostRule,
    /// Where the actual cost is read.
    pub actual: ActualSources,
}

impl CostRoute {
    fn matches(&self, route: Option<&[u8]>, bucket: &str) -> bool {
        let route_matches = match &self.route {
            None => true,
            Some(name) => route == Some(name.as_bytes()),
        };
        route_matches && self.bucket.as_ref().is_none_or(|glob| glob.matches(bucket))
    }
}

/// The configured cost rules, in order; empty: no request has a cost.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CostRules {
    routes: Vec<CostRoute>,
    /// Whether any rule names a route (else the route name is not read).
    reads_route: bool,
}

impl CostRules {
    /// Rules in order of preference.
    pub fn new(routes: Vec<CostRoute>) -> Self {
        let reads_route = routes.iter().any(|route| route.route.is_some());
        Self {
            routes,
            reads_route,
        }
    }

    /// Whether no rule is configured.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Whether any rule names a route.
    pub fn reads_route(&self) -> bool {
        self.reads_route
    }

    /// The index of the first rule for a request of `bucket` on the route
    /// `route` (read only if [`Self::reads_route`]).
    pub fn find(&self, route: Option<&[u8]>, bucket: &str) -> Option<usize> {
        self.routes
            .iter()
            .position(|rule| rule.matches(route, bucket))
    }

    /// The rule at `index`.
    pub fn get(&self, index: usize) -> Option<&CostRoute> {
        self.routes.get(index)
    }
}

/// A cost rule that does not validate: the field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostRouteError {
    /// Path below the rule, e.g. `actual.response_header`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// One element of `cost_rules` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCostRoute {
    #[serde(default)]
    route: Option<String>,
    #[serde(default)]
    bucket: Option<String>,
    cost: serde_json::Value,
    #[serde(default)]
    actual: RawActual,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawActual {
    // Absent: Envoy AI Gateway's total; `null`: not read.
    #[serde(default = "default_metadata")]
    metadata: Option<RawMetadataKey>,
    #[serde(default)]
    response_header: Option<String>,
    #[serde(default)]
    response_trailer: Option<String>,
    #[serde(default)]
    body: RawBody,
}

impl Default for RawActual {
    fn default() -> Self {
        Self {
            metadata: default_metadata(),
            response_header: None,
            response_trailer: None,
            body: RawBody::default(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadataKey {
    namespace: String,
    key: String,
}

fn default_metadata() -> Option<RawMetadataKey> {
    Some(RawMetadataKey {
        namespace: AI_GATEWAY_NAMESPACE.to_owned(),
        key: AI_GATEWAY_TOTAL_KEY.to_owned(),
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBody {
    #[serde(default = "default_true")]
    parse: bool,
    #[serde(default = "default_body_cap")]
    max_bytes: usize,
}

impl Default for RawBody {
    fn default() -> Self {
        Self {
            parse: true,
            max_bytes: DEFAULT_BODY_CAP_BYTES,
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_body_cap() -> usize {
    DEFAULT_BODY_CAP_BYTES
}

fn invalid(field: &str, message: impl Into<String>) -> CostRouteError {
    CostRouteError {
        field: field.to_owned(),
        message: message.into(),
    }
}

fn check_name(field: &str, name: &str, header: bool) -> Result<(), CostRouteError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !(header && b == b':'));
    if valid {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{name:?} must be 1 to {MAX_NAME_BYTES} visible ASCII characters"),
        ))
    }
}

impl RawCostRoute {
    /// Validates the rule; errors name the field below the rule.
    pub fn validate(self) -> Result<CostRoute, CostRouteError> {
        if self.route.is_none() && self.bucket.is_none() {
            return Err(invalid(
                "route",
                "a rule needs `route`, `bucket` or both (`\"bucket\": \"*\"` matches every request)",
            ));
        }
        if let Some(route) = &self.route {
            check_name("route", route, false)?;
        }
        if let Some(bucket) = &self.bucket
            && (bucket.is_empty() || bucket.len() > sluice_core::MAX_BUCKET_KEY_BYTES)
        {
            return Err(invalid(
                "bucket",
                format!(
                    "must be a glob of 1 to {} bytes",
                    sluice_core::MAX_BUCKET_KEY_BYTES
                ),
            ));
        }
        let json =
            serde_json::to_vec(&self.cost).map_err(|err| invalid("cost", err.to_string()))?;
        let rule = CostRule::from_json(&json).map_err(|err| CostRouteError {
            field: err.field,
            message: err.message,
        })?;
        let metadata = match self.actual.metadata {
            None => None,
            Some(raw) => {
                check_name("actual.metadata.namespace", &raw.namespace, false)?;
                check_name("actual.metadata.key", &raw.key, false)?;
                Some(MetadataKey {
                    namespace: raw.namespace,
                    key: raw.key,
                })
            }
        };
        let header = |field: &str, name: Option<String>| -> Result<_, CostRouteError> {
            match name {
                None => Ok(None),
                Some(name) => {
                    check_name(field, &name, true)?;
                    Ok(Some(name.to_ascii_lowercase()))
                }
            }
        };
        let response_header = header("actual.response_header", self.actual.response_header)?;
        let response_trailer = header("actual.response_trailer", self.actual.response_trailer)?;
        let body_cap = if self.actual.body.parse {
            let cap = self.actual.body.max_bytes;
            if !(64..=MAX_BODY_CAP_BYTES).contains(&cap) {
                return Err(invalid(
                    "actual.body.max_bytes",
                    format!("must be between 64 and {MAX_BODY_CAP_BYTES}, got {cap}"),
                ));
            }
            Some(cap)
        } else {
            None
        };
        Ok(CostRoute {
            route: self.route,
            bucket: self.bucket.map(Glob::new),
            rule,
            actual: ActualSources {
                metadata,
                response_header,
                response_trailer,
                body_cap,
            },
        })
    }
}

/// A cost read from metadata, a header or a trailer: a finite number in
/// `0..=MAX_COST` (rounded up); `None` for anything else, and then the
/// next source is asked.
pub fn cost_of_number(value: f64) -> Option<u64> {
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    Some((value.ceil() as u64).min(MAX_COST))
}

/// A cost written as decimal text (`"157"`, `" 157.0 "`).
pub fn cost_of_text(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?.trim();
    if text.is_empty() || text.len() > 32 {
        return None;
    }
    cost_of_number(text.parse::<f64>().ok()?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn route(json: &str) -> Result<CostRoute, CostRouteError> {
        serde_json::from_str::<RawCostRoute>(json)
            .unwrap()
            .validate()
    }

    #[test]
    fn the_first_matching_rule_wins() {
        let chat =
            route(r#"{"route": "chat", "cost": {"estimate": {"source": "constant", "value": 5}}}"#)
                .unwrap();
        let llm = route(
            r#"{"bucket": "llm/*", "cost": {"estimate": {"source": "constant", "value": 7}}}"#,
        )
        .unwrap();
        let rules = CostRules::new(vec![chat, llm]);
        assert!(rules.reads_route());
        assert_eq!(rules.find(Some(b"chat"), "llm/a"), Some(0));
        assert_eq!(rules.find(Some(b"other"), "llm/a"), Some(1));
        assert_eq!(rules.find(None, "web/a"), None);
        assert!(CostRules::default().is_empty());
    }

    #[test]
    fn defaults_read_the_ai_gateway_total_and_the_body() {
        let rule =
            route(r#"{"bucket": "*", "cost": {"estimate": {"source": "constant", "value": 5}}}"#)
                .unwrap();
        assert_eq!(
            rule.actual,
            ActualSources {
                metadata: Some(MetadataKey {
                    namespace: AI_GATEWAY_NAMESPACE.into(),
                    key: AI_GATEWAY_TOTAL_KEY.into()
                }),
                response_header: None,
                response_trailer: None,
                body_cap: Some(DEFAULT_BODY_CAP_BYTES),
            }
        );
        let off = route(
            r#"{"bucket": "*", "cost": {"estimate": {"source": "constant", "value": 5}},
                "actual": {"metadata": null, "response_header": "X-Usage", "body": {"parse": false}}}"#,
        )
        .unwrap();
        assert_eq!(off.actual.metadata, None);
        assert_eq!(off.actual.response_header.as_deref(), Some("x-usage"));
        assert_eq!(off.actual.body_cap, None);
    }

    #[test]
    fn bad_rules_name_their_field() {
        for (json, field) in [
            (
                r#"{"cost": {"estimate": {"source": "constant", "value": 5}}}"#,
                "route",
            ),
            (
                r#"{"bucket": "*", "cost": {"estimate": {"source": "constant", "value": 0}}}"#,
                "cost.estimate.value",
            ),
            (
                r#"{"bucket": "*", "cost": {"estimate": {"source": "constant", "value": 5}},
                    "actual": {"response_header": "a b"}}"#,
                "actual.response_header",
            ),
            (
                r#"{"bucket": "*", "cost": {"estimate": {"source": "constant", "value": 5}},
                    "actual": {"body": {"max_bytes": 1}}}"#,
                "actual.body.max_bytes",
            ),
            (
                r#"{"bucket": "*", "cost": {"estimate": {"source": "constant", "value": 5}},
                    "actual": {"metadata": {"namespace": "", "key": "k"}}}"#,
                "actual.metadata.namespace",
            ),
        ] {
            assert_eq!(route(json).unwrap_err().field, field, "{json}");
        }
    }

    #[test]
    fn numbers_and_text_become_costs() {
        assert_eq!(cost_of_number(157.0), Some(157));
        assert_eq!(cost_of_number(0.2), Some(1));
        assert_eq!(cost_of_number(0.0), Some(0));
        assert_eq!(cost_of_number(1e30), Some(MAX_COST));
        assert_eq!(cost_of_number(-1.0), None);
        assert_eq!(cost_of_number(f64::NAN), None);
        assert_eq!(cost_of_text(b" 157 "), Some(157));
        assert_eq!(cost_of_text(b"157.5"), Some(158));
        assert_eq!(cost_of_text(b"lots"), None);
        assert_eq!(cost_of_text(b""), None);
        assert_eq!(cost_of_text(b"\xff"), None);
    }
}
