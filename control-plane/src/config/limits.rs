//! Which limit applies to a bucket: exact key, then glob patterns in order,
//! then the default. An aggregate pattern is one cell: the filters count
//! every bucket it matches under the pattern itself, and that cell takes the
//! pattern's limit. A limit is a request rate or a cost budget
//! ([`Limit`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::config::budget::Budget;
use crate::types::LimitRps;
pub(crate) use sluice_core::glob::Glob;

/// What an entry or the default with both a rate and a budget is told.
pub(crate) const BOTH_LIMITS: &str =
    "has both `limit_rps` and `budget`: a limit is one or the other";

/// A bucket's limit: requests per second, or a cost budget. Serialized as
/// the limits file writes it: `limit_rps: N` or `budget: {…}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Limit {
    /// Fleet-wide requests per second.
    #[serde(rename = "limit_rps")]
    Rps(LimitRps),
    /// Fleet-wide cost per period.
    #[serde(rename = "budget")]
    Budget(Budget),
}

impl Limit {
    /// The rate the controller steers to: requests per second, or the
    /// budget's cost units per second.
    pub fn rate(&self) -> LimitRps {
        match self {
            Self::Rps(rps) => *rps,
            Self::Budget(budget) => budget.rate(),
        }
    }

    /// The budget, when the limit is one.
    pub fn budget(&self) -> Option<&Budget> {
        match self {
            Self::Rps(_) => None,
            Self::Budget(budget) => Some(budget),
        }
    }

    /// Whether the limit admits nothing (a rate of 0; a budget is never 0).
    pub(crate) fn is_blocked(&self) -> bool {
        matches!(self, Self::Rps(rps) if rps.is_blocked())
    }
}

impl From<LimitRps> for Limit {
    fn from(rps: LimitRps) -> Self {
        Self::Rps(rps)
    }
}

impl From<Budget> for Limit {
    fn from(budget: Budget) -> Self {
        Self::Budget(budget)
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rps(rps) => write!(f, "{rps} rps"),
            Self::Budget(budget) => budget.fmt(f),
        }
    }
}

/// One configured limit, as listed by `GET /v1/limits`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Selector {
    /// An exact bucket key.
    Bucket(String),
    /// A glob over bucket keys; each matching bucket has the limit.
    Pattern(String),
    /// A glob over bucket keys whose matching buckets share the limit: the
    /// filters count them all as one bucket named by the pattern.
    AggregatePattern(String),
}

/// A limit rule: a selector and its limit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitRule {
    /// What the rule applies to.
    #[serde(flatten)]
    pub selector: Selector,
    /// The fleet-wide limit.
    #[serde(flatten)]
    pub limit: Limit,
}

/// The limits in force. Pure data: lookups never allocate or lock.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimitTable {
    default: Option<Limit>,
    exact: BTreeMap<String, Limit>,
    patterns: Vec<(Glob, Limit)>,
    /// The aggregate patterns among `patterns`, in file order.
    aggregates: Vec<String>,
    /// Exact keys whose limit is 0, sorted.
    blocked_exact: Vec<String>,
}

impl LimitTable {
    /// A table with only a default rate (`None` = unknown buckets are
    /// unlimited).
    pub fn new(default: Option<LimitRps>) -> Self {
        Self::with_default(default.map(Limit::Rps))
    }

    /// A table with only a default limit, a rate or a budget.
    pub(crate) fn with_default(default: Option<Limit>) -> Self {
        Self {
            default,
            ..Self::default()
        }
    }

    /// Builds a table from rules in file order.
    pub fn from_rules(default: Option<Limit>, rules: impl IntoIterator<Item = LimitRule>) -> Self {
        let mut table = Self::with_default(default);
        for rule in rules {
            match rule.selector {
                Selector::Bucket(bucket) => {
                    table.set_exact(bucket, rule.limit);
                }
                Selector::Pattern(pattern) => table.patterns.push((Glob::new(pattern), rule.limit)),
                Selector::AggregatePattern(pattern) => {
                    table.aggregates.push(pattern.clone());
                    table.patterns.push((Glob::new(pattern), rule.limit))
                }
            }
        }
        table
    }

    /// The rate `bucket` is limited to (requests per second, or a
    /// budget's units per second); `None` means unlimited.
    pub fn limit_for(&self, bucket: &str) -> Option<LimitRps> {
        self.rule_for(bucket).map(Limit::rate)
    }

    /// The limit of `bucket` as configured; `None` means unlimited.
    pub(crate) fn rule_for(&self, bucket: &str) -> Option<&Limit> {
        if let Some(limit) = self.exact.get(bucket) {
            return Some(limit);
        }
        // The cell an aggregate pattern's buckets are counted in is named by
        // the pattern: it takes that rule even when an earlier pattern
        // would match the name too.
        if self.aggregates.iter().any(|pattern| pattern == bucket)
            && let Some((_, limit)) = self
                .patterns
                .iter()
                .find(|(glob, _)| glob.as_str() == bucket)
        {
            return Some(limit);
        }
        self.patterns
            .iter()
            .find(|(glob, _)| glob.matches(bucket))
            .map(|(_, limit)| limit)
            .or(self.default.as_ref())
    }

    /// Whether any rule or the default is a budget: only then does a tick
    /// ask which buckets steer on cost.
    /// The budget's rate of `bucket`, in cost units a second, when its
    /// limit is a budget: what the fleet's sums steer it on.
    pub fn budget_rate(&self, bucket: &str) -> Option<f64> {
        self.rule_for(bucket)?
            .budget()
            .map(|budget| budget.rate().get())
    }

    pub(crate) fn has_budgets(&self) -> bool {
        self.default.iter().any(|l| l.budget().is_some())
            || self.exact.values().any(|l| l.budget().is_some())
            || self.patterns.iter().any(|(_, l)| l.budget().is_some())
    }

    /// The aggregate patterns, in file order: what the filters are told to
    /// count as one bucket each.
    pub(crate) fn aggregate_patterns(&self) -> &[String] {
        &self.aggregates
    }

    /// The bucket keys the filters look up that are blocked (limit 0),
    /// sorted and without repeats: exact keys and aggregate patterns (the
    /// bucket their members are counted as). A pattern's blocked members
    /// and a blocked default are not listed: no key names them before
    /// their traffic does.
    pub(crate) fn blocked_keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self.blocked_exact.iter().map(String::as_str).collect();
        let aggregates = self
            .aggregates
            .iter()
            .filter(|pattern| self.rule_for(pattern).is_some_and(Limit::is_blocked));
        let before = keys.len();
        keys.extend(aggregates.map(String::as_str));
        if keys.len() > before {
            keys.sort_unstable();
            keys.dedup();
        }
        keys
    }

    /// The default for buckets no rule names.
    pub(crate) fn default_limit(&self) -> Option<&Limit> {
        self.default.as_ref()
    }

    /// Sets (or replaces) an exact limit; returns the previous one.
    pub(crate) fn set_exact(&mut self, bucket: String, limit: Limit) -> Option<Limit> {
        match self.blocked_exact.binary_search(&bucket) {
            Ok(at) if !limit.is_blocked() => {
                self.blocked_exact.remove(at);
            }
            Err(at) if limit.is_blocked() => self.blocked_exact.insert(at, bucket.clone()),
            _ => {}
        }
        self.exact.insert(bucket, limit)
    }

    /// Removes an exact limit; returns it if there was one.
    #[cfg(test)]
    pub(crate) fn remove_exact(&mut self, bucket: &str) -> Option<Limit> {
        if let Ok(at) = self
            .blocked_exact
            .binary_search_by(|key| key.as_str().cmp(bucket))
        {
            self.blocked_exact.remove(at);
        }
        self.exact.remove(bucket)
    }

    /// All rules: exact keys sorted, then patterns in file order.
    pub fn rules(&self) -> Vec<LimitRule> {
        let exact = self.exact.iter().map(|(bucket, limit)| LimitRule {
            selector: Selector::Bucket(bucket.clone()),
            limit: limit.clone(),
        });
        let patterns = self.patterns.iter().map(|(glob, limit)| {
            let pattern = glob.as_str().to_owned();
            LimitRule {
                selector: if self.aggregates.contains(&pattern) {
                    Selector::AggregatePattern(pattern)
                } else {
                    Selector::Pattern(pattern)
                },
                limit: limit.clone(),
            }
        });
        exact.chain(patterns).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rps: f64) -> LimitRps {
        LimitRps::new(rps).unwrap()
    }

    #[test]
    fn exact_beats_pattern_beats_default() {
        let table = LimitTable::from_rules(
            Some(limit(100.0).into()),
            [
                LimitRule {
                    selector: Selector::Pattern("acme*".into()),
                    limit: limit(50.0).into(),
                },
                LimitRule {
                    selector: Selector::Bucket("acme".into()),
                    limit: limit(200.0).into(),
                },
            ],
        );
        assert_eq!(table.limit_for("acme"), Some(limit(200.0)));
        assert_eq!(table.limit_for("acme-eu"), Some(limit(50.0)));
        assert_eq!(table.limit_for("other"), Some(limit(100.0)));
    }

    #[test]
    fn first_matching_pattern_wins() {
        let table = LimitTable::from_rules(
            None,
            [
                LimitRule {
                    selector: Selector::Pattern("free-*".into()),
                    limit: limit(50.0).into(),
                },
                LimitRule {
                    selector: Selector::Pattern("free-eu-*".into()),
                    limit: limit(10.0).into(),
                },
            ],
        );
        assert_eq!(table.limit_for("free-eu-1"), Some(limit(50.0)));
        assert_eq!(table.limit_for("paid"), None, "no default means unlimited");
    }

    #[test]
    fn an_aggregate_patterns_cell_takes_its_rule() {
        let table = LimitTable::from_rules(
            None,
            [
                LimitRule {
                    selector: Selector::Pattern("f*".into()),
                    limit: limit(5.0).into(),
                },
                LimitRule {
                    selector: Selector::AggregatePattern("free-*".into()),
                    limit: limit(100.0).into(),
                },
            ],
        );
        assert_eq!(table.aggregate_patterns(), ["free-*".to_owned()]);
        // The pattern's own cell, although `f*` comes first and matches it.
        assert_eq!(table.limit_for("free-*"), Some(limit(100.0)));
        // A member counted on its own (a filter that has not heard of the
        // pattern yet) still meets the patterns in file order.
        assert_eq!(table.limit_for("free-a"), Some(limit(5.0)));
        let json = serde_json::to_value(table.rules()).unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"pattern": "f*", "limit_rps": 5.0},
                {"aggregate_pattern": "free-*", "limit_rps": 100.0},
            ])
        );
    }

    #[test]
    fn set_and_remove_exact() {
        let mut table = LimitTable::new(None);
        assert_eq!(table.set_exact("acme".into(), limit(1.0).into()), None);
        assert_eq!(
            table.set_exact("acme".into(), limit(2.0).into()),
            Some(limit(1.0).into())
        );
        assert_eq!(table.limit_for("acme"), Some(limit(2.0)));
        assert_eq!(table.remove_exact("acme"), Some(limit(2.0).into()));
        assert_eq!(table.remove_exact("acme"), None);
        assert_eq!(table.limit_for("acme"), None);
    }

    #[test]
    fn blocked_keys_are_exact_keys_and_aggregate_patterns_at_zero() {
        let rule = |selector, rps| LimitRule {
            selector,
            limit: limit(rps).into(),
        };
        let mut table = LimitTable::from_rules(
            Some(limit(0.0).into()),
            [
                rule(Selector::Bucket("open".into()), 5.0),
                rule(Selector::Bucket("shut".into()), 0.0),
                rule(Selector::Pattern("free-*".into()), 0.0),
                rule(Selector::AggregatePattern("bulk-*".into()), 0.0),
                rule(Selector::AggregatePattern("paid-*".into()), 10.0),
            ],
        );
        assert_eq!(table.blocked_keys(), ["bulk-*", "shut"]);
        table.set_exact("open".into(), limit(0.0).into());
        table.set_exact("shut".into(), limit(1.0).into());
        table.set_exact("bulk-*".into(), limit(2.0).into());
        assert_eq!(table.blocked_keys(), ["open"]);
        table.remove_exact("open");
        assert!(table.blocked_keys().is_empty());
    }

    #[test]
    fn rules_serialize_as_bucket_or_pattern() {
        let table = LimitTable::from_rules(
            None,
            [
                LimitRule {
                    selector: Selector::Pattern("p*".into()),
                    limit: limit(5.0).into(),
                },
                LimitRule {
                    selector: Selector::Bucket("b".into()),
                    limit: limit(7.0).into(),
                },
            ],
        );
        let json = serde_json::to_value(table.rules()).unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"bucket": "b", "limit_rps": 7.0},
                {"pattern": "p*", "limit_rps": 5.0},
            ])
        );
    }
}
