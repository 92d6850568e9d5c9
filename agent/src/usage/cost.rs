//! The cost rule: how a usage becomes a charge (weights per kind of token
//! and a scale), the estimate known before the decision, and what a stream
//! that ends without usage is charged (never zero). Parsed from JSON, then
//! validated into types that cannot hold bad values; errors name the
//! field.

use std::num::NonZeroU64;

use serde::Deserialize;

use super::tokens::Usage;

/// Largest estimate or charge (what Envoy's own `hits_addend` accepts).
pub const MAX_COST: u64 = 1_000_000_000;
/// Longest header name an estimate may read.
const MAX_HEADER_NAME: usize = 256;

/// Where a charge's amount came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChargeSource {
    /// Envoy dynamic metadata.
    Metadata,
    /// A response header.
    Header,
    /// A response trailer.
    Trailer,
    /// The usage parsed from the response body.
    Body,
    /// No usage: the estimate (or the configured amount).
    Estimate,
}

impl ChargeSource {
    /// The label in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ChargeSource::Metadata => "metadata",
            ChargeSource::Header => "header",
            ChargeSource::Trailer => "trailer",
            ChargeSource::Body => "body",
            ChargeSource::Estimate => "estimate",
        }
    }
}

/// An amount charged, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// In the budget's unit.
    pub cost: u64,
    /// Its source.
    pub source: ChargeSource,
}

/// The cost known before the decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Estimate {
    /// The same for every request.
    Constant(NonZeroU64),
    /// A request header's decimal value, `default` when it is missing or
    /// not a number in `1..=MAX_COST`.
    RequestHeader {
        /// Lower-case header name.
        name: String,
        /// Used without a valid header.
        default: NonZeroU64,
    },
    /// `base + per_byte × request body bytes` (from `content-length`).
    RequestSize {
        /// Added to every request.
        base: u64,
        /// Per byte of the request body (finite, ≥ 0).
        per_byte: f64,
    },
}

/// What a stream that ends without usage is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithoutUsage {
    /// Its estimate.
    Estimate,
    /// This amount.
    Amount(NonZeroU64),
}

/// A validated cost rule.
#[derive(Debug, Clone, PartialEq)]
pub struct CostRule {
    input: f64,
    cached_input: f64,
    output: f64,
    scale: f64,
    estimate: Estimate,
    without_usage: WithoutUsage,
}

/// A cost rule that does not validate: the field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct CostRuleError {
    /// The field's path, e.g. `cost.weights.output`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn invalid(field: &str, message: impl Into<String>) -> CostRuleError {
    CostRuleError {
        field: format!("cost.{field}"),
        message: message.into(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCostRule {
    #[serde(default)]
    weights: RawWeights,
    #[serde(default = "one")]
    scale: f64,
    estimate: RawEstimate,
    #[serde(default)]
    without_usage: Option<RawWithoutUsage>,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWeights {
    #[serde(default = "one")]
    input: f64,
    /// Defaults to `input`'s weight.
    cached_input: Option<f64>,
    #[serde(default = "one")]
    output: f64,
}

impl Default for RawWeights {
    fn default() -> Self {
        Self {
            input: 1.0,
            cached_input: None,
            output: 1.0,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "source", rename_all = "snake_case")]
enum RawEstimate {
    Constant {
        value: u64,
    },
    RequestHeader {
        name: String,
        default: u64,
    },
    RequestSize {
        #[serde(default)]
        base: u64,
        per_byte: f64,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum RawWithoutUsage {
    Estimate,
    Amount(u64),
}

fn weight(field: &str, value: f64) -> Result<f64, CostRuleError> {
    if value.is_finite() && (0.0..=1e6).contains(&value) {
        Ok(value)
    } else {
        Err(invalid(
            field,
            format!("{value} is not a weight in 0..=1e6"),
        ))
    }
}

fn amount(field: &str, value: u64) -> Result<NonZeroU64, CostRuleError> {
    match NonZeroU64::new(value) {
        Some(value) if value.get() <= MAX_COST => Ok(value),
        _ => Err(invalid(field, format!("{value} is not in 1..={MAX_COST}"))),
    }
}

impl CostRule {
    /// Parses and validates a rule from JSON such as
    /// `{"weights": {"input": 1, "cached_input": 0.1, "output": 4},
    ///   "estimate": {"source": "constant", "value": 500}}`.
    pub fn from_json(json: &[u8]) -> Result<Self, CostRuleError> {
        let deserializer = &mut serde_json::Deserializer::from_slice(json);
        let raw: RawCostRule = serde_path_to_error::deserialize(deserializer).map_err(|err| {
            let path = err.path().to_string();
            CostRuleError {
                field: if path == "." {
                    "cost".to_owned()
                } else {
                    format!("cost.{path}")
                },
                message: err.into_inner().to_string(),
            }
        })?;
        Self::validate(raw)
    }

    fn validate(raw: RawCostRule) -> Result<Self, CostRuleError> {
        let input = weight("weights.input", raw.weights.input)?;
        let cached_input = weight(
            "weights.cached_input",
            raw.weights.cached_input.unwrap_or(input),
        )?;
        let output = weight("weights.output", raw.weights.output)?;
        if input + output == 0.0 {
            return Err(invalid(
                "weights",
                "input and output weigh nothing: every charge would be 0",
            ));
        }
        if !(raw.scale.is_finite() && raw.scale > 0.0 && raw.scale <= 1e6) {
            return Err(invalid(
                "scale",
                format!("{} is not in (0, 1e6]", raw.scale),
            ));
        }
        let estimate = match raw.estimate {
            RawEstimate::Constant { value } => Estimate::Constant(amount("estimate.value", value)?),
            RawEstimate::RequestHeader { name, default } => {
                let valid = !name.is_empty()
                    && name.len() <= MAX_HEADER_NAME
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
                if !valid {
                    return Err(invalid(
                        "estimate.name",
                        format!("{name:?} is not a header name"),
                    ));
                }
                Estimate::RequestHeader {
                    name: name.to_ascii_lowercase(),
                    default: amount("estimate.default", default)?,
                }
            }
            RawEstimate::RequestSize { base, per_byte } => {
                if base > MAX_COST {
                    return Err(invalid(
                        "estimate.base",
                        format!("{base} is over {MAX_COST}"),
                    ));
                }
                Estimate::RequestSize {
                    base,
                    per_byte: weight("estimate.per_byte", per_byte)?,
                }
            }
        };
        let without_usage = match raw.without_usage {
            None | Some(RawWithoutUsage::Estimate) => WithoutUsage::Estimate,
            Some(RawWithoutUsage::Amount(value)) => {
                WithoutUsage::Amount(amount("without_usage.amount", value)?)
            }
        };
        Ok(Self {
            input,
            cached_input,
            output,
            scale: raw.scale,
            estimate,
            without_usage,
        })
    }

    /// The estimate's source.
    pub fn estimate_source(&self) -> &Estimate {
        &self.estimate
    }

    /// The estimate of a request: from `header` (the configured header's
    /// value, if the rule reads one) or `body_bytes`; at least 1.
    pub fn estimate(&self, header: Option<&[u8]>, body_bytes: u64) -> u64 {
        match &self.estimate {
            Estimate::Constant(value) => value.get(),
            Estimate::RequestHeader { default, .. } => header
                .and_then(|value| std::str::from_utf8(value).ok())
                .and_then(|value| value.trim().parse::<u64>().ok())
                .filter(|value| (1..=MAX_COST).contains(value))
                .unwrap_or(default.get()),
            Estimate::RequestSize { base, per_byte } => {
                let cost = *base as f64 + per_byte * body_bytes as f64;
                to_cost(cost).max(1)
            }
        }
    }

    /// What `usage` costs: `scale × (input weight × uncached input +
    /// cached weight × cached input + output weight × output)`, rounded
    /// up; a usage with a total only counts the total as output.
    pub fn cost_of(&self, usage: &Usage) -> u64 {
        let (input, output) = if usage.input == 0 && usage.output == 0 {
            (0, usage.total)
        } else {
            (usage.input, usage.output)
        };
        let cached = usage.cached_input.min(input);
        let weighted = self.input * (input - cached) as f64
            + self.cached_input * cached as f64
            + self.output * output as f64;
        to_cost(weighted * self.scale)
    }

    /// The charge of a finished stream: its usage's cost with its source,
    /// or, without usage, its estimate or the configured amount (never 0).
    pub fn charge(&self, usage: Option<(Usage, ChargeSource)>, estimate: u64) -> Charge {
        match usage {
            Some((usage, source)) => Charge {
                cost: self.cost_of(&usage),
                source,
            },
            None => Charge {
                cost: match self.without_usage {
                    WithoutUsage::Estimate => estimate.clamp(1, MAX_COST),
                    WithoutUsage::Amount(amount) => amount.get(),
                },
                source: ChargeSource::Estimate,
            },
        }
    }
}

/// Rounds up into `0..=MAX_COST` (NaN is 0).
fn to_cost(value: f64) -> u64 {
    if value.is_nan() || value <= 0.0 {
        return 0;
    }
    // Saturating float-to-int, then capped.
    (value.ceil() as u64).min(MAX_COST)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn rule(json: &str) -> Result<CostRule, CostRuleError> {
        CostRule::from_json(json.as_bytes())
    }

    const USAGE: Usage = Usage {
        input: 120,
        cached_input: 20,
        output: 37,
        total: 157,
    };

    #[test]
    fn weights_and_scale_price_each_kind() {
        let plain = rule(r#"{"estimate": {"source": "constant", "value": 500}}"#).unwrap();
        assert_eq!(plain.cost_of(&USAGE), 157);
        let weighted = rule(
            r#"{"weights": {"input": 1, "cached_input": 0.1, "output": 4}, "scale": 0.5,
                "estimate": {"source": "constant", "value": 500}}"#,
        )
        .unwrap();
        // (100 + 0.1 × 20 + 4 × 37) / 2 = 125.
        assert_eq!(weighted.cost_of(&USAGE), 125);
        // Rounded up; a total alone counts as output.
        let total_only = Usage {
            total: 10,
            ..Usage::default()
        };
        assert_eq!(weighted.cost_of(&total_only), 20);
        assert_eq!(plain.cost_of(&Usage::default()), 0);
    }

    #[test]
    fn estimates_come_from_a_constant_a_header_or_the_size() {
        let constant = rule(r#"{"estimate": {"source": "constant", "value": 500}}"#).unwrap();
        assert_eq!(constant.estimate(None, 10_000), 500);
        let header = rule(
            r#"{"estimate": {"source": "request_header", "name": "X-Estimated-Tokens", "default": 300}}"#,
        )
        .unwrap();
        assert_eq!(
            header.estimate_source(),
            &Estimate::RequestHeader {
                name: "x-estimated-tokens".to_owned(),
                default: NonZeroU64::new(300).unwrap()
            }
        );
        assert_eq!(header.estimate(Some(b" 42 "), 0), 42);
        for bad in [&b"0"[..], b"-1", b"lots", b"\xff", b"1000000001"] {
            assert_eq!(header.estimate(Some(bad), 0), 300);
        }
        assert_eq!(header.estimate(None, 0), 300);
        let size =
            rule(r#"{"estimate": {"source": "request_size", "base": 100, "per_byte": 0.25}}"#)
                .unwrap();
        assert_eq!(size.estimate(None, 400), 200);
        let tiny = rule(r#"{"estimate": {"source": "request_size", "per_byte": 0}}"#).unwrap();
        assert_eq!(tiny.estimate(None, 400), 1, "never 0");
    }

    #[test]
    fn a_stream_without_usage_is_charged_never_zero() {
        let by_estimate = rule(r#"{"estimate": {"source": "constant", "value": 500}}"#).unwrap();
        assert_eq!(
            by_estimate.charge(None, 500),
            Charge {
                cost: 500,
                source: ChargeSource::Estimate
            }
        );
        assert_eq!(by_estimate.charge(None, 0).cost, 1);
        let fixed = rule(
            r#"{"estimate": {"source": "constant", "value": 500}, "without_usage": {"amount": 2000}}"#,
        )
        .unwrap();
        assert_eq!(fixed.charge(None, 500).cost, 2_000);
        assert_eq!(
            fixed.charge(Some((USAGE, ChargeSource::Body)), 500),
            Charge {
                cost: 157,
                source: ChargeSource::Body
            }
        );
        assert_eq!(ChargeSource::Metadata.as_str(), "metadata");
    }

    #[test]
    fn bad_rules_name_their_field() {
        for (json, field) in [
            (r#"{}"#, "cost"),
            (
                r#"{"estimate": {"source": "constant", "value": 0}}"#,
                "cost.estimate.value",
            ),
            (
                r#"{"estimate": {"source": "constant", "value": 5}, "weights": {"output": -1}}"#,
                "cost.weights.output",
            ),
            (
                r#"{"estimate": {"source": "constant", "value": 5}, "weights": {"input": 0, "output": 0}}"#,
                "cost.weights",
            ),
            (
                r#"{"estimate": {"source": "constant", "value": 5}, "scale": 0}"#,
                "cost.scale",
            ),
            (
                r#"{"estimate": {"source": "request_header", "name": "a b", "default": 5}}"#,
                "cost.estimate.name",
            ),
            (
                r#"{"estimate": {"source": "constant", "value": 5}, "without_usage": {"amount": 0}}"#,
                "cost.without_usage.amount",
            ),
            (
                r#"{"estimate": {"source": "constant", "value": 5}, "weights": {"inptu": 1}}"#,
                "cost.weights.inptu",
            ),
            (
                r#"{"estimate": {"source": "request_size", "per_byte": 1e300}}"#,
                "cost.estimate.per_byte",
            ),
        ] {
            let err = rule(json).unwrap_err();
            assert_eq!(err.field, field, "{json}: {err}");
            assert!(err.to_string().starts_with(field), "{err}");
        }
    }
}
