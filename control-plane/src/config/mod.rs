//! The limits file: YAML parsed straight into validated types, and the
//! configuration as the control plane holds it at run time.
//!
//! Validation happens inside deserialization (`try_from` on each type), so
//! every error, including "negative limit", carries the YAML position and the
//! field path of the offending value.

pub(crate) mod budget;
mod error;
pub mod limits;
pub mod live;
pub(crate) mod nesting;
pub mod overrides;
pub(crate) mod persist;
pub mod policy;
pub(crate) mod quota_file;
pub(crate) mod quota_section;
pub(crate) mod reload;
pub(crate) mod shared;

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::config::budget::Budget;
pub use crate::config::error::{ConfigError, InvalidConfig};
use crate::config::limits::{BOTH_LIMITS, Limit, LimitRule, LimitTable, Selector};
use crate::config::overrides::Overrides;
use crate::config::policy::{Modes, Policy, Tenants};
use crate::control::adaptive::spec::AdaptiveSpecs;
use crate::types::{BucketName, ControlInterval, DirectiveTtl, LimitRps};

/// A parsed, valid limits file.
///
/// It also serializes back to the same schema: the admin API persists its
/// changes by rewriting the whole file ([`Config::to_yaml`]).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Control interval from the file; the command line may override it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) control_interval_ms: Option<ControlInterval>,
    /// How long proxies trust directives without hearing from the control
    /// plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) directive_ttl_ms: Option<DirectiveTtl>,
    /// Limit for buckets no rule names; `None` = unlimited.
    #[serde(default)]
    pub(crate) default_limit_rps: Option<LimitRps>,
    /// A cost budget for buckets no rule names, instead of
    /// `default_limit_rps` (not both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) default_budget: Option<Budget>,
    /// Rules in file order.
    #[serde(default)]
    pub limits: Rules,
    /// Tenant weights, bursts and floors; `default` applies to the rest.
    #[serde(default, skip_serializing_if = "tenants_empty")]
    pub tenants: Tenants,
    /// Rollout modes: shadow or enforce, kill switch, canary.
    #[serde(default)]
    pub modes: Modes,
    /// Temporary limit and tenant overrides with their deadlines.
    #[serde(default, skip_serializing_if = "Overrides::is_empty")]
    pub overrides: Overrides,
    /// The shared store (`redis://…`) replicas share; `--store` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) store: Option<crate::store::StoreSetting>,
    /// Exact quotas in buckets and tenants, served through the rate limit
    /// service as the domain `sluice`.
    #[serde(
        default,
        skip_serializing_if = "crate::config::quota_section::NativeQuotas::is_empty"
    )]
    pub(crate) quotas: crate::config::quota_section::NativeQuotas,
    /// Buckets whose limit follows the upstream's health.
    #[serde(default, skip_serializing_if = "AdaptiveSpecs::is_empty")]
    pub(crate) adaptive: AdaptiveSpecs,
}

fn tenants_empty(tenants: &Tenants) -> bool {
    tenants.iter().next().is_none()
}

/// First lines of a limits file written by the control plane.
pub(crate) const WRITTEN_HEADER: &str = "\
# Sluice limits file. The control plane rewrites it when its admin API
# changes something, so comments and formatting are not preserved; edits
# made by hand are picked up within seconds.
";

impl Config {
    /// Reads and validates a limits file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// Parses and validates YAML; `file` names the source in errors.
    pub fn from_yaml(text: &str, file: &str) -> Result<Self, ConfigError> {
        // An empty file (or one with only comments) is a valid "no limits"
        // configuration rather than a type error about a null document.
        if text
            .lines()
            .all(|line| line.trim().is_empty() || line.trim_start().starts_with('#'))
        {
            return Ok(Self::default());
        }
        // Before the parser, whose time grows with the square of the depth.
        nesting::check(text).map_err(|err| {
            ConfigError::Invalid(InvalidConfig {
                file: file.to_owned(),
                location: err.location,
                field: String::new(),
                message: err.message,
            })
        })?;
        let deserializer = serde_yaml_ng::Deserializer::from_str(text);
        let config: Self = serde_path_to_error::deserialize(deserializer)
            .map_err(|err| ConfigError::invalid(file, err))?;
        if config.default_limit_rps.is_some() && config.default_budget.is_some() {
            return Err(ConfigError::Invalid(InvalidConfig {
                file: file.to_owned(),
                location: top_level_key(text, "default_budget"),
                field: "default_budget".to_owned(),
                message: BOTH_LIMITS.to_owned(),
            }));
        }
        Ok(config)
    }

    /// The default limit: the rate or the budget (the file never holds
    /// both).
    pub(crate) fn default_limit(&self) -> Option<Limit> {
        self.default_budget
            .clone()
            .map(Limit::Budget)
            .or(self.default_limit_rps.map(Limit::Rps))
    }

    /// The limit table the file describes.
    pub fn limit_table(&self) -> LimitTable {
        LimitTable::from_rules(self.default_limit(), self.limits.0.iter().cloned())
    }

    /// The policy (limits, tenants, modes) the file describes, with the
    /// overrides in force now.
    pub fn policy(&self) -> Policy {
        self.policy_at(crate::config::overrides::unix_now())
    }

    /// The policy with the overrides in force at `now` (seconds since the
    /// Unix epoch).
    pub(crate) fn policy_at(&self, now: u64) -> Policy {
        let mut policy = Policy {
            limits: self.limit_table(),
            tenants: self.tenants.clone(),
            modes: self.modes.clone(),
            adaptive: self.adaptive.clone(),
        };
        self.overrides.apply(&mut policy, now);
        policy
    }

    /// The file a policy would be read from (no overrides, no interval).
    pub(crate) fn from_policy(policy: &Policy) -> Self {
        let default = policy.limits.default_limit();
        Self {
            default_limit_rps: match default {
                Some(Limit::Rps(rps)) => Some(*rps),
                _ => None,
            },
            default_budget: default.and_then(Limit::budget).cloned(),
            limits: Rules(policy.limits.rules()),
            tenants: policy.tenants.clone(),
            modes: policy.modes.clone(),
            ..Self::default()
        }
    }

    /// The file's text: [`WRITTEN_HEADER`], then YAML that
    /// [`Config::from_yaml`] reads back to an equal value.
    pub(crate) fn to_yaml(&self) -> Result<String, serde_yaml_ng::Error> {
        Ok(format!(
            "{WRITTEN_HEADER}{}",
            serde_yaml_ng::to_string(self)?
        ))
    }
}

/// Line and column of a top-level `key:` in `text` (for a check made
/// after parsing, which serde cannot position).
fn top_level_key(text: &str, key: &str) -> Option<(usize, usize)> {
    text.lines().enumerate().find_map(|(index, line)| {
        line.strip_prefix(key)
            .is_some_and(|rest| rest.trim_start().starts_with(':'))
            .then_some((index + 1, 1))
    })
}

/// Rules in file order; no two entries share a bucket or a pattern.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rules(Vec<LimitRule>);

impl Rules {
    /// The rules in file order.
    pub fn as_slice(&self) -> &[LimitRule] {
        &self.0
    }

    /// Sets the exact limit of `bucket`, in place if it has an entry, else
    /// as a new last entry; returns the previous limit.
    pub fn set_exact(&mut self, bucket: String, limit: Limit) -> Option<Limit> {
        let selector = Selector::Bucket(bucket);
        match self.0.iter_mut().find(|rule| rule.selector == selector) {
            Some(rule) => Some(std::mem::replace(&mut rule.limit, limit)),
            None => {
                self.0.push(LimitRule { selector, limit });
                None
            }
        }
    }

    /// The exact limit of `bucket`, if it has one.
    pub fn exact(&self, bucket: &str) -> Option<&Limit> {
        self.0.iter().find_map(|rule| match &rule.selector {
            Selector::Bucket(b) if b == bucket => Some(&rule.limit),
            _ => None,
        })
    }

    /// Removes the exact limit of `bucket`; returns it if there was one.
    pub(crate) fn remove_exact(&mut self, bucket: &str) -> Option<Limit> {
        let index = self
            .0
            .iter()
            .position(|rule| matches!(&rule.selector, Selector::Bucket(b) if b == bucket))?;
        Some(self.0.remove(index).limit)
    }
}

impl Serialize for Rules {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Rules {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RulesVisitor;

        impl<'de> Visitor<'de> for RulesVisitor {
            type Value = Rules;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of limits")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Rules, A::Error> {
                // Checked while reading so the error points into the list; a
                // duplicate is almost certainly a typo and would otherwise be
                // silently shadowed.
                let mut seen: HashMap<Selector, usize> = HashMap::new();
                let mut rules = Vec::new();
                let mut aggregates = 0;
                while let Some(RawRule(rule)) = seq.next_element()? {
                    let index = rules.len();
                    // A pattern is one entry, aggregate or not.
                    let key = match &rule.selector {
                        Selector::AggregatePattern(name) => {
                            aggregates += 1;
                            if aggregates > MAX_AGGREGATE_PATTERNS {
                                return Err(de::Error::custom(format!(
                                    "more than {MAX_AGGREGATE_PATTERNS} aggregate patterns (entry [{index}])"
                                )));
                            }
                            Selector::Pattern(name.clone())
                        }
                        selector => selector.clone(),
                    };
                    if let Some(first) = seen.insert(key, index) {
                        let (kind, name) = match &rule.selector {
                            Selector::Bucket(name) => ("bucket", name),
                            Selector::Pattern(name) => ("pattern", name),
                            Selector::AggregatePattern(name) => ("aggregate_pattern", name),
                        };
                        return Err(de::Error::custom(format!(
                            "duplicate {kind} {name:?} in entries [{first}] and [{index}]"
                        )));
                    }
                    rules.push(rule);
                }
                Ok(Rules(rules))
            }
        }

        deserializer.deserialize_seq(RulesVisitor)
    }
}

/// Aggregate patterns a limits file may hold: the filters match each
/// request's bucket against every one of them.
pub(crate) use sluice_core::glob::MAX_AGGREGATE_PATTERNS;

/// What a limit entry names exactly one of.
const ONE_SELECTOR: &str = "needs exactly one of `bucket`, `pattern` or `aggregate_pattern`";

/// What an entry without a limit is told.
const ONE_LIMIT: &str = "needs `limit_rps` (requests per second) or `budget` (a cost budget)";

/// One list entry: exactly one of `bucket`, `pattern` or
/// `aggregate_pattern`, and one of `limit_rps` or `budget`.
///
/// A hand-written map visitor rather than a derive plus a check afterwards:
/// errors raised inside `visit_map` are positioned at the entry itself.
#[derive(Debug)]
struct RawRule(LimitRule);

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum RuleField {
    Bucket,
    Pattern,
    AggregatePattern,
    LimitRps,
    Budget,
}

impl<'de> Deserialize<'de> for RawRule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RuleVisitor;

        impl<'de> Visitor<'de> for RuleVisitor {
            type Value = RawRule;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a map with `bucket`, `pattern` or `aggregate_pattern`, and `limit_rps` or `budget`",
                )
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawRule, A::Error> {
                let mut selector = None;
                let mut limit: Option<Limit> = None;
                while let Some(field) = map.next_key::<RuleField>()? {
                    match field {
                        RuleField::Bucket | RuleField::Pattern | RuleField::AggregatePattern
                            if selector.is_some() =>
                        {
                            return Err(de::Error::custom(ONE_SELECTOR));
                        }
                        RuleField::Bucket => {
                            let BucketName(name) = map.next_value()?;
                            selector = Some(Selector::Bucket(name));
                        }
                        RuleField::Pattern => {
                            let BucketName(name) = map.next_value()?;
                            selector = Some(Selector::Pattern(name));
                        }
                        RuleField::AggregatePattern => {
                            let BucketName(name) = map.next_value()?;
                            selector = Some(Selector::AggregatePattern(name));
                        }
                        RuleField::LimitRps => {
                            let rps = map.next_value()?;
                            limit = Some(match limit {
                                None => Limit::Rps(rps),
                                Some(Limit::Rps(_)) => {
                                    return Err(de::Error::duplicate_field("limit_rps"));
                                }
                                Some(Limit::Budget(_)) => {
                                    return Err(de::Error::custom(BOTH_LIMITS));
                                }
                            });
                        }
                        RuleField::Budget => {
                            let budget = map.next_value()?;
                            limit = Some(match limit {
                                None => Limit::Budget(budget),
                                Some(Limit::Budget(_)) => {
                                    return Err(de::Error::duplicate_field("budget"));
                                }
                                Some(Limit::Rps(_)) => {
                                    return Err(de::Error::custom(BOTH_LIMITS));
                                }
                            });
                        }
                    }
                }
                let selector = selector.ok_or_else(|| de::Error::custom(ONE_SELECTOR))?;
                let limit = limit.ok_or_else(|| de::Error::custom(ONE_LIMIT))?;
                Ok(RawRule(LimitRule { selector, limit }))
            }
        }

        deserializer.deserialize_struct(
            "limit",
            &[
                "bucket",
                "pattern",
                "aggregate_pattern",
                "limit_rps",
                "budget",
            ],
            RuleVisitor,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(yaml: &str) -> InvalidConfig {
        match Config::from_yaml(yaml, "limits.yaml") {
            Err(ConfigError::Invalid(err)) => err,
            other => panic!("expected an invalid config, got {other:?}"),
        }
    }

    #[test]
    fn a_store_url_that_does_not_parse_names_its_line_and_never_its_password() {
        let err = invalid("limits: []\nstore: \"memcached://user:secret@cache:11211\"\n");
        assert_eq!(err.field, "store");
        assert_eq!(err.location.map(|(line, _)| line), Some(2), "{err}");
        assert!(err.message.contains("expected redis://"), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
        let config =
            Config::from_yaml("store: \"redis://:pw@127.0.0.1:6379/0\"\n", "limits.yaml").unwrap();
        assert!(!format!("{config:?}").contains("pw@"), "{config:?}");
        assert_eq!(
            config.store.as_ref().map(|s| s.as_str()),
            Some("redis://:pw@127.0.0.1:6379/0")
        );
    }

    const GOOD: &str = "\
# Example limits.
control_interval_ms: 250
default_limit_rps: 100
limits:
  - bucket: acme
    limit_rps: 200
  - pattern: \"free-*\"
    limit_rps: 50.5
  - bucket: blocked
    limit_rps: 0
";

    #[test]
    fn parses_a_good_file() {
        let config = Config::from_yaml(GOOD, "limits.yaml").unwrap();
        assert_eq!(config.control_interval_ms.unwrap().as_millis(), 250);
        assert_eq!(config.default_limit_rps.unwrap().get(), 100.0);
        let table = config.limit_table();
        assert_eq!(table.limit_for("acme").unwrap().get(), 200.0);
        assert_eq!(table.limit_for("free-x").unwrap().get(), 50.5);
        assert_eq!(table.limit_for("blocked").unwrap().get(), 0.0);
        assert_eq!(table.limit_for("other").unwrap().get(), 100.0);
    }

    #[test]
    fn optional_fields_may_be_absent_or_null() {
        let config = Config::from_yaml("default_limit_rps: ~\n", "l.yaml").unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.limit_table().limit_for("x"), None);
        let config = Config::from_yaml("# nothing yet\n\n", "l.yaml").unwrap();
        assert_eq!(config, Config::default());
        let config = Config::from_yaml("limits: []\n", "l.yaml").unwrap();
        assert!(config.limits.as_slice().is_empty());
    }

    #[test]
    fn negative_limit_names_file_line_column_and_field() {
        let yaml = "limits:\n  - bucket: a\n    limit_rps: 1\n  - bucket: b\n    limit_rps: -5\n";
        let err = invalid(yaml);
        assert_eq!(err.field, "limits[1].limit_rps");
        assert_eq!(err.location, Some((5, 16)));
        assert_eq!(
            err.to_string(),
            "limits.yaml:5:16: limits[1].limit_rps: must be a finite number >= 0"
        );
    }

    #[test]
    fn nan_infinite_and_huge_limits_are_rejected() {
        for (value, message) in [
            (".nan", "must be a finite number >= 0"),
            (".inf", "must be a finite number >= 0"),
            ("2e9", "must be at most 1e9"),
        ] {
            let err = invalid(&format!("default_limit_rps: {value}\n"));
            assert_eq!(err.field, "default_limit_rps");
            assert_eq!(err.location, Some((1, 20)));
            assert_eq!(err.message, message);
        }
    }

    #[test]
    fn wrong_type_is_reported_at_the_value() {
        let err = invalid("limits:\n  - bucket: a\n    limit_rps: lots\n");
        assert_eq!(err.field, "limits[0].limit_rps");
        assert_eq!(err.location, Some((3, 16)));
        assert!(err.message.contains("invalid type"), "{}", err.message);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = invalid("default_limit: 5\n");
        assert!(
            err.message.contains("unknown field `default_limit`"),
            "{}",
            err.message
        );
        assert_eq!(err.location.map(|(line, _)| line), Some(1));
        assert!(err.to_string().starts_with("limits.yaml:1:"), "{err}");

        let err = invalid("limits:\n  - bucket: a\n    limit_rps: 1\n    burst: 3\n");
        assert!(
            err.message.contains("unknown field `burst`"),
            "{}",
            err.message
        );
        assert!(err.field.starts_with("limits[0]"), "{}", err.field);
        assert_eq!(err.location.map(|(line, _)| line), Some(4));
    }

    #[test]
    fn control_interval_out_of_range() {
        let err = invalid("control_interval_ms: 10\n");
        assert_eq!(
            err.to_string(),
            "limits.yaml:1:22: control_interval_ms: must be between 50 and 60000 (milliseconds)"
        );
    }

    #[test]
    fn entry_needs_exactly_one_selector() {
        let err = invalid("limits:\n  - limit_rps: 1\n");
        assert_eq!(err.field, "limits[0]");
        assert_eq!(
            err.message,
            "needs exactly one of `bucket`, `pattern` or `aggregate_pattern`"
        );
        assert_eq!(err.location.map(|(line, _)| line), Some(2), "{err}");

        let err = invalid("limits:\n  - bucket: a\n    pattern: b*\n    limit_rps: 1\n");
        assert_eq!(err.field, "limits[0]");

        let err = invalid("limits:\n  - bucket: \"\"\n    limit_rps: 1\n");
        assert_eq!(
            err.to_string(),
            "limits.yaml:2:13: limits[0].bucket: must not be empty"
        );
    }

    #[test]
    fn aggregate_patterns_parse_and_are_bounded() {
        let config = Config::from_yaml(
            "limits:\n  - aggregate_pattern: \"free-*\"\n    limit_rps: 100\n  - pattern: \"paid-*\"\n    limit_rps: 5\n",
            "limits.yaml",
        )
        .unwrap();
        let table = config.limit_table();
        assert_eq!(table.aggregate_patterns(), ["free-*".to_owned()]);
        assert_eq!(table.limit_for("free-*").unwrap().get(), 100.0);

        let err =
            invalid("limits:\n  - aggregate_pattern: a*\n    pattern: b*\n    limit_rps: 1\n");
        assert_eq!(err.field, "limits[0]");
        assert_eq!(err.message, ONE_SELECTOR);

        let err = invalid(
            "limits:\n  - pattern: a*\n    limit_rps: 1\n  - aggregate_pattern: a*\n    limit_rps: 2\n",
        );
        assert!(
            err.message
                .contains("duplicate aggregate_pattern \"a*\" in entries [0] and [1]"),
            "{}",
            err.message
        );

        let many: String = (0..=MAX_AGGREGATE_PATTERNS)
            .map(|i| format!("  - aggregate_pattern: \"p{i}-*\"\n    limit_rps: 1\n"))
            .collect();
        let err = invalid(&format!("limits:\n{many}"));
        assert!(
            err.message.contains("more than 32 aggregate patterns"),
            "{}",
            err.message
        );
    }

    const BUDGETS: &str = "\
default_budget: {amount: 100, unit: tokens, per: second}
limits:
  - bucket: acme
    budget: {amount: 1200000, unit: tokens, per: minute}
  - aggregate_pattern: \"free-*\"
    budget:
      amount: 3600000
      unit: credits
      per: hour
  - bucket: plain
    limit_rps: 5
";

    #[test]
    fn budgets_parse_beside_request_limits_and_read_back_equal() {
        let config = Config::from_yaml(BUDGETS, "limits.yaml").unwrap();
        let table = config.limit_table();
        let acme = table.rule_for("acme").unwrap();
        let budget = acme.budget().unwrap();
        assert_eq!(budget.unit().as_str(), "tokens");
        assert_eq!(budget.per().seconds(), 60);
        assert_eq!(table.limit_for("acme").unwrap().get(), 20_000.0);
        assert_eq!(table.limit_for("free-*").unwrap().get(), 1000.0);
        assert_eq!(
            table
                .rule_for("free-*")
                .unwrap()
                .budget()
                .unwrap()
                .unit()
                .as_str(),
            "credits"
        );
        assert_eq!(table.limit_for("plain").unwrap().get(), 5.0);
        assert!(table.rule_for("plain").unwrap().budget().is_none());
        assert_eq!(table.limit_for("other").unwrap().get(), 100.0);
        assert!(table.has_budgets());
        assert!(
            !Config::from_yaml(GOOD, "l")
                .unwrap()
                .limit_table()
                .has_budgets()
        );
        let written = config.to_yaml().unwrap();
        assert_eq!(Config::from_yaml(&written, "limits.yaml").unwrap(), config);
        // And the policy's table, as the admin API rewrites the file.
        let rewritten = Config::from_policy(&config.policy_at(0));
        assert_eq!(rewritten.default_budget, config.default_budget);
        assert_eq!(rewritten.limit_table(), config.limit_table());
    }

    #[test]
    fn each_budget_error_names_its_line_and_field() {
        for (yaml, field, line, message) in [
            (
                "limits:\n  - bucket: a\n    budget: {amount: 0, unit: tokens, per: minute}\n",
                "limits[0].budget.amount",
                3,
                "must be a finite number above 0",
            ),
            (
                "limits:\n  - bucket: a\n    budget:\n      amount: 5\n      unit: \"to kens\"\n      per: minute\n",
                "limits[0].budget.unit",
                5,
                "must be ASCII letters, digits or !#$%&'*+-.^_`|~ (character 2 is not)",
            ),
            (
                "limits:\n  - bucket: a\n    budget:\n      amount: 5\n      unit: \"\"\n      per: minute\n",
                "limits[0].budget.unit",
                5,
                "must be 1 to 32 characters",
            ),
            (
                "limits:\n  - bucket: a\n    budget:\n      amount: 5\n      unit: tokens\n      per: day\n",
                "limits[0].budget.per",
                6,
                "unknown variant `day`, expected one of `second`, `minute`, `hour`",
            ),
            (
                "limits:\n  - bucket: a\n    budget: {amount: 2e9, unit: t, per: second}\n",
                "limits[0].budget",
                3,
                "amount per second (amount / per) must be at most 1e9",
            ),
            (
                "limits:\n  - bucket: a\n    budget: {amount: 5, unit: t, per: second, burst: 2}\n",
                "limits[0].budget.burst",
                3,
                "unknown field `burst`, expected one of `amount`, `unit`, `per`",
            ),
            (
                "limits:\n  - bucket: a\n    limit_rps: 5\n    budget: {amount: 5, unit: t, per: second}\n",
                "limits[0]",
                2,
                BOTH_LIMITS,
            ),
            (
                "limits:\n  - bucket: a\n    budget: {amount: 5, unit: t, per: second}\n    limit_rps: 5\n",
                "limits[0]",
                2,
                BOTH_LIMITS,
            ),
            (
                "default_budget: {amount: -1, unit: t, per: second}\n",
                "default_budget.amount",
                1,
                "must be a finite number above 0",
            ),
            (
                "default_limit_rps: 5\ndefault_budget: {amount: 1, unit: t, per: second}\n",
                "default_budget",
                2,
                BOTH_LIMITS,
            ),
        ] {
            let err = invalid(yaml);
            assert_eq!(err.field, field, "{yaml}: {err}");
            assert_eq!(err.location.map(|(l, _)| l), Some(line), "{yaml}: {err}");
            assert!(err.message.ends_with(message), "{yaml}: {err}");
            assert!(err.to_string().starts_with("limits.yaml:"), "{err}");
        }
    }

    #[test]
    fn missing_limit_is_reported() {
        let err = invalid("limits:\n  - bucket: a\n");
        assert_eq!(err.field, "limits[0]");
        assert_eq!(err.message, ONE_LIMIT);
    }

    #[test]
    fn duplicate_buckets_are_rejected() {
        let err = invalid(
            "limits:\n  - bucket: a\n    limit_rps: 1\n  - pattern: a\n    limit_rps: 1\n  - bucket: a\n    limit_rps: 2\n",
        );
        assert_eq!(err.field, "limits");
        assert_eq!(err.message, "duplicate bucket \"a\" in entries [0] and [2]");
        assert!(err.location.is_some());
    }

    #[test]
    fn syntax_errors_have_a_position() {
        let err = invalid("limits:\n  - bucket: [a\n");
        assert!(err.location.is_some(), "{err}");
        assert!(err.to_string().starts_with("limits.yaml:"), "{err}");
    }

    #[test]
    fn written_files_read_back_equal() {
        let yaml = "\
control_interval_ms: 250
directive_ttl_ms: 30000
default_limit_rps: 100
limits:
  - pattern: \"free-*\"
    limit_rps: 50.5
  - bucket: acme
    limit_rps: 200
tenants:
  default: {weight: 0.5}
  gold: {weight: 4, burst: 2, min_floor_rps: 10}
modes:
  default: shadow
  buckets: {acme: enforce}
  kill_switch: true
  canary_fraction: 0.25
overrides:
  limits:
    acme: {limit_rps: 500, expires_at_unix_s: 4000000000}
  tenants:
    gold: {weight: 8, expires_at_unix_s: 4000000000}
";
        let config = Config::from_yaml(yaml, "limits.yaml").unwrap();
        let written = config.to_yaml().unwrap();
        assert!(written.starts_with(WRITTEN_HEADER), "{written}");
        assert_eq!(Config::from_yaml(&written, "limits.yaml").unwrap(), config);
        // Overrides apply until their deadline.
        assert_eq!(
            config.policy_at(0).limits.limit_for("acme").unwrap().get(),
            500.0
        );
        let later = config.policy_at(4_000_000_000);
        assert_eq!(later.limits.limit_for("acme").unwrap().get(), 200.0);
        assert_eq!(later.tenants.policy_for("gold").weight.get(), 4.0);

        let empty = Config::default().to_yaml().unwrap();
        assert_eq!(Config::from_yaml(&empty, "l").unwrap(), Config::default());
    }

    #[test]
    fn rules_set_and_remove_exact_keep_file_order() {
        let mut config = Config::from_yaml(GOOD, "limits.yaml").unwrap();
        let limit = |v| Limit::Rps(LimitRps::new(v).unwrap());
        assert_eq!(
            config.limits.set_exact("acme".into(), limit(1.0)),
            Some(limit(200.0))
        );
        assert_eq!(config.limits.set_exact("new".into(), limit(2.0)), None);
        assert_eq!(config.limits.remove_exact("blocked"), Some(limit(0.0)));
        assert_eq!(config.limits.remove_exact("free-*"), None, "a pattern");
        let keys: Vec<_> = config
            .limits
            .as_slice()
            .iter()
            .map(|r| r.selector.clone())
            .collect();
        assert_eq!(
            keys,
            [
                Selector::Bucket("acme".into()),
                Selector::Pattern("free-*".into()),
                Selector::Bucket("new".into()),
            ]
        );
    }

    #[test]
    fn unreadable_file_names_the_path() {
        let err = Config::from_file(Path::new("/nonexistent/limits.yaml")).unwrap_err();
        assert!(
            err.to_string().starts_with("/nonexistent/limits.yaml: "),
            "{err}"
        );
    }
}
