//! The limits file's `adaptive:` section: which buckets follow the
//! upstream's health, on which signal, within which hard bounds.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::types::{MAX_LIMIT_RPS, validate_bucket};

/// What says the upstream is congested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// The p99 latency over `target_p99_ms`.
    Latency,
    /// The 5xx ratio over `max_error_ratio`.
    Errors,
    /// Either.
    #[default]
    Both,
}

/// How the limit moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Additive increase while healthy and in use, multiplicative
    /// decrease when congested.
    #[default]
    Aimd,
    /// Scaled by how far the p99 is over target (Netflix's gradient
    /// limiter with the target as its baseline), smoothed.
    Gradient,
}

/// One bucket's adaptive limit, validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawSpec", into = "RawSpec")]
pub struct AdaptiveSpec {
    /// The bucket key (exact).
    pub(crate) bucket: String,
    /// What says congested.
    pub signal: Signal,
    /// Latency target (with `latency` or `both`).
    pub target_p99_ms: Option<f64>,
    /// Highest healthy 5xx ratio (with `errors` or `both`).
    pub(crate) max_error_ratio: f64,
    /// Hard lower bound.
    pub min_rps: f64,
    /// Hard upper bound: the limit never climbs over it, whatever the
    /// signal says.
    pub max_rps: f64,
    /// How it moves.
    pub(crate) algorithm: Algorithm,
    /// AIMD: added per healthy interval while the limit is in use.
    pub(crate) increase_rps: f64,
    /// AIMD: the limit is multiplied by this when congested.
    pub(crate) decrease_factor: f64,
    /// Gradient: weight of each interval's new estimate.
    pub(crate) smoothing: f64,
}

/// Default [`AdaptiveSpec::max_error_ratio`].
pub(crate) const DEFAULT_MAX_ERROR_RATIO: f64 = 0.05;
/// Default [`AdaptiveSpec::decrease_factor`].
pub(crate) const DEFAULT_DECREASE_FACTOR: f64 = 0.8;
/// Default [`AdaptiveSpec::smoothing`].
pub(crate) const DEFAULT_SMOOTHING: f64 = 0.3;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    bucket: String,
    #[serde(default)]
    signal: Signal,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_error_ratio: Option<f64>,
    min_rps: f64,
    max_rps: f64,
    #[serde(default)]
    algorithm: Algorithm,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    increase_rps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    decrease_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    smoothing: Option<f64>,
}

fn in_open_unit(name: &str, value: f64) -> Result<f64, String> {
    if value.is_finite() && value > 0.0 && value < 1.0 {
        Ok(value)
    } else {
        Err(format!(
            "{name}: must be between 0 and 1 (exclusive), got {value}"
        ))
    }
}

impl TryFrom<RawSpec> for AdaptiveSpec {
    type Error = String;

    fn try_from(raw: RawSpec) -> Result<Self, String> {
        validate_bucket(&raw.bucket).map_err(|err| format!("bucket: {err}"))?;
        let rate = |name: &str, value: f64| {
            if value.is_finite() && (0.0..=MAX_LIMIT_RPS).contains(&value) {
                Ok(value)
            } else {
                Err(format!(
                    "{name}: must be a number from 0 to {MAX_LIMIT_RPS}, got {value}"
                ))
            }
        };
        let min_rps = rate("min_rps", raw.min_rps)?;
        let max_rps = rate("max_rps", raw.max_rps)?;
        if max_rps <= min_rps {
            return Err(format!(
                "max_rps ({max_rps}) must be above min_rps ({min_rps})"
            ));
        }
        let target_p99_ms = match (raw.signal, raw.target_p99_ms) {
            (Signal::Latency | Signal::Both, None) => {
                return Err("target_p99_ms: needed with signal latency or both".to_owned());
            }
            (_, Some(target)) if !(target.is_finite() && target > 0.0) => {
                return Err(format!("target_p99_ms: must be above 0, got {target}"));
            }
            (_, target) => target,
        };
        let max_error_ratio = in_open_unit(
            "max_error_ratio",
            raw.max_error_ratio.unwrap_or(DEFAULT_MAX_ERROR_RATIO),
        )?;
        let increase_rps = match raw.increase_rps {
            Some(step) => {
                let step = rate("increase_rps", step)?;
                if step == 0.0 {
                    return Err("increase_rps: must be above 0".to_owned());
                }
                step
            }
            None => (max_rps - min_rps) / 20.0,
        };
        let decrease_factor = in_open_unit(
            "decrease_factor",
            raw.decrease_factor.unwrap_or(DEFAULT_DECREASE_FACTOR),
        )?;
        let smoothing = raw.smoothing.unwrap_or(DEFAULT_SMOOTHING);
        if !(smoothing.is_finite() && smoothing > 0.0 && smoothing <= 1.0) {
            return Err(format!("smoothing: must be in (0, 1], got {smoothing}"));
        }
        Ok(Self {
            bucket: raw.bucket,
            signal: raw.signal,
            target_p99_ms,
            max_error_ratio,
            min_rps,
            max_rps,
            algorithm: raw.algorithm,
            increase_rps,
            decrease_factor,
            smoothing,
        })
    }
}

impl From<AdaptiveSpec> for RawSpec {
    fn from(spec: AdaptiveSpec) -> Self {
        Self {
            bucket: spec.bucket,
            signal: spec.signal,
            target_p99_ms: spec.target_p99_ms,
            max_error_ratio: Some(spec.max_error_ratio),
            min_rps: spec.min_rps,
            max_rps: spec.max_rps,
            algorithm: spec.algorithm,
            increase_rps: Some(spec.increase_rps),
            decrease_factor: Some(spec.decrease_factor),
            smoothing: Some(spec.smoothing),
        }
    }
}

impl AdaptiveSpec {
    /// `value` within the hard bounds.
    pub(crate) fn bound(&self, value: f64) -> f64 {
        if value.is_finite() {
            value.clamp(self.min_rps, self.max_rps)
        } else {
            self.min_rps
        }
    }
}

/// The section: at most one spec per bucket.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "Vec<AdaptiveSpec>", into = "Vec<AdaptiveSpec>")]
pub struct AdaptiveSpecs(Vec<AdaptiveSpec>);

impl TryFrom<Vec<AdaptiveSpec>> for AdaptiveSpecs {
    type Error = String;

    fn try_from(specs: Vec<AdaptiveSpec>) -> Result<Self, String> {
        let mut seen = HashSet::new();
        for (index, spec) in specs.iter().enumerate() {
            if !seen.insert(spec.bucket.as_str()) {
                return Err(format!(
                    "[{index}]: bucket {:?} is adaptive already",
                    spec.bucket
                ));
            }
        }
        Ok(Self(specs))
    }
}

impl From<AdaptiveSpecs> for Vec<AdaptiveSpec> {
    fn from(specs: AdaptiveSpecs) -> Self {
        specs.0
    }
}

impl AdaptiveSpecs {
    /// Whether no bucket is adaptive.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The specs, in file order.
    pub fn iter(&self) -> impl Iterator<Item = &AdaptiveSpec> {
        self.0.iter()
    }

    /// Whether `bucket` is adaptive.
    pub fn contains(&self, bucket: &str) -> bool {
        self.get(bucket).is_some()
    }

    /// The spec of `bucket`, if it is adaptive.
    pub(crate) fn get(&self, bucket: &str) -> Option<&AdaptiveSpec> {
        self.0.iter().find(|spec| spec.bucket == bucket)
    }

    /// Sets the spec of its bucket: replaces the one in place, else adds
    /// it at the end (one spec per bucket holds by construction).
    pub(crate) fn set(&mut self, spec: AdaptiveSpec) {
        match self.0.iter_mut().find(|s| s.bucket == spec.bucket) {
            Some(existing) => *existing = spec,
            None => self.0.push(spec),
        }
    }

    /// Removes the spec of `bucket`; whether there was one.
    pub(crate) fn remove(&mut self, bucket: &str) -> bool {
        let before = self.0.len();
        self.0.retain(|spec| spec.bucket != bucket);
        self.0.len() != before
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parse(yaml: &str) -> Result<AdaptiveSpecs, String> {
        serde_yaml_ng::from_str(yaml).map_err(|err| err.to_string())
    }

    #[test]
    fn defaults_fill_in_and_it_writes_back_as_read() {
        let specs =
            parse("- {bucket: api, target_p99_ms: 250, min_rps: 10, max_rps: 1010}").unwrap();
        let spec = specs.iter().next().unwrap();
        assert_eq!(spec.signal, Signal::Both);
        assert_eq!(spec.algorithm, Algorithm::Aimd);
        assert_eq!(spec.increase_rps, 50.0);
        assert_eq!(spec.max_error_ratio, DEFAULT_MAX_ERROR_RATIO);
        let written = serde_yaml_ng::to_string(&specs).unwrap();
        assert_eq!(parse(&written).unwrap(), specs);
        assert_eq!(spec.bound(5.0), 10.0);
        assert_eq!(
            spec.bound(f64::INFINITY),
            10.0,
            "no infinity from the bound"
        );
        assert_eq!(spec.bound(2e3), 1010.0);
    }

    #[test]
    fn bad_specs_name_the_field() {
        for (yaml, expected) in [
            (
                "- {bucket: a, target_p99_ms: 1, min_rps: 10, max_rps: 10}",
                "must be above min_rps",
            ),
            ("- {bucket: a, target_p99_ms: 1, min_rps: 10}", "max_rps"),
            (
                "- {bucket: a, min_rps: 1, max_rps: 10}",
                "target_p99_ms: needed",
            ),
            (
                "- {bucket: a, signal: errors, min_rps: 1, max_rps: 10, max_error_ratio: 1.5}",
                "max_error_ratio",
            ),
            (
                "- {bucket: a, target_p99_ms: -3, min_rps: 1, max_rps: 10}",
                "target_p99_ms",
            ),
            (
                "- {bucket: a, target_p99_ms: 1, min_rps: 1, max_rps: 10, decrease_factor: 1}",
                "decrease_factor",
            ),
            (
                "- {bucket: a, target_p99_ms: 1, min_rps: 1, max_rps: 10, algorithm: pid}",
                "unknown variant",
            ),
            (
                "- {bucket: a, target_p99_ms: 1, min_rps: 1, max_rps: 10, speed: 3}",
                "unknown field",
            ),
            (
                "- {bucket: a, target_p99_ms: 1, min_rps: 1, max_rps: 10}\n- {bucket: a, target_p99_ms: 1, min_rps: 1, max_rps: 10}",
                "adaptive already",
            ),
        ] {
            let err = parse(yaml).unwrap_err();
            assert!(err.contains(expected), "{yaml}: {err}");
        }
    }
}
