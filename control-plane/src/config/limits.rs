//! Which limit applies to a bucket: exact key, then glob patterns in order,
//! then the default.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::types::LimitRps;

/// A glob where `*` matches any run of characters (including none and
/// including separators); every other character matches itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    source: String,
}

impl Glob {
    /// Any string is a valid pattern.
    pub fn new(pattern: impl Into<String>) -> Self {
        Self {
            source: pattern.into(),
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        let mut parts = self.source.split('*');
        // `split` always yields at least one item; no `*` means an exact match.
        let Some(first) = parts.next() else {
            return text.is_empty();
        };
        let Some(mut rest) = text.strip_prefix(first) else {
            return false;
        };
        let mut middle: Vec<&str> = parts.collect();
        let Some(last) = middle.pop() else {
            return rest.is_empty();
        };
        // Taking each middle literal at its leftmost occurrence is optimal:
        // it leaves the longest possible remainder for what follows.
        for literal in middle {
            match rest.find(literal) {
                Some(at) => rest = rest.get(at + literal.len()..).unwrap_or_default(),
                None => return false,
            }
        }
        rest.ends_with(last)
    }
}

/// One configured limit, as listed by `GET /v1/limits`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Selector {
    /// An exact bucket key.
    Bucket(String),
    /// A glob over bucket keys.
    Pattern(String),
}

/// A limit rule: a selector and its limit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitRule {
    /// What the rule applies to.
    #[serde(flatten)]
    pub selector: Selector,
    /// The fleet-wide limit.
    pub limit_rps: LimitRps,
}

/// The limits in force. Pure data: lookups never allocate or lock.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimitTable {
    default: Option<LimitRps>,
    exact: BTreeMap<String, LimitRps>,
    patterns: Vec<(Glob, LimitRps)>,
}

impl LimitTable {
    /// A table with only a default (`None` = unknown buckets are unlimited).
    pub fn new(default: Option<LimitRps>) -> Self {
        Self {
            default,
            ..Self::default()
        }
    }

    /// Builds a table from rules in file order.
    pub fn from_rules(
        default: Option<LimitRps>,
        rules: impl IntoIterator<Item = LimitRule>,
    ) -> Self {
        let mut table = Self::new(default);
        for rule in rules {
            match rule.selector {
                Selector::Bucket(bucket) => {
                    table.exact.insert(bucket, rule.limit_rps);
                }
                Selector::Pattern(pattern) => {
                    table.patterns.push((Glob::new(pattern), rule.limit_rps))
                }
            }
        }
        table
    }

    /// The limit for `bucket`; `None` means unlimited.
    pub fn limit_for(&self, bucket: &str) -> Option<LimitRps> {
        if let Some(limit) = self.exact.get(bucket) {
            return Some(*limit);
        }
        self.patterns
            .iter()
            .find(|(glob, _)| glob.matches(bucket))
            .map(|(_, limit)| *limit)
            .or(self.default)
    }

    /// The default for buckets no rule names.
    pub fn default_limit(&self) -> Option<LimitRps> {
        self.default
    }

    /// Sets (or replaces) an exact limit; returns the previous one.
    pub fn set_exact(&mut self, bucket: String, limit: LimitRps) -> Option<LimitRps> {
        self.exact.insert(bucket, limit)
    }

    /// Removes an exact limit; returns it if there was one.
    pub fn remove_exact(&mut self, bucket: &str) -> Option<LimitRps> {
        self.exact.remove(bucket)
    }

    /// All rules: exact keys sorted, then patterns in file order.
    pub fn rules(&self) -> Vec<LimitRule> {
        let exact = self.exact.iter().map(|(bucket, limit)| LimitRule {
            selector: Selector::Bucket(bucket.clone()),
            limit_rps: *limit,
        });
        let patterns = self.patterns.iter().map(|(glob, limit)| LimitRule {
            selector: Selector::Pattern(glob.as_str().to_owned()),
            limit_rps: *limit,
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
    fn glob_matching() {
        let cases = [
            ("acme", "acme", true),
            ("acme", "acme2", false),
            ("free-*", "free-", true),
            ("free-*", "free-abc/def", true),
            ("free-*", "xfree-a", false),
            ("*-eu", "a-eu", true),
            ("*-eu", "a-eu-x", false),
            ("*", "", true),
            ("*", "anything", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxcyyb", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("**", "x", true),
            ("", "", true),
            ("", "x", false),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(
                Glob::new(pattern).matches(text),
                expected,
                "{pattern:?} vs {text:?}"
            );
        }
    }

    #[test]
    fn exact_beats_pattern_beats_default() {
        let table = LimitTable::from_rules(
            Some(limit(100.0)),
            [
                LimitRule {
                    selector: Selector::Pattern("acme*".into()),
                    limit_rps: limit(50.0),
                },
                LimitRule {
                    selector: Selector::Bucket("acme".into()),
                    limit_rps: limit(200.0),
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
                    limit_rps: limit(50.0),
                },
                LimitRule {
                    selector: Selector::Pattern("free-eu-*".into()),
                    limit_rps: limit(10.0),
                },
            ],
        );
        assert_eq!(table.limit_for("free-eu-1"), Some(limit(50.0)));
        assert_eq!(table.limit_for("paid"), None, "no default means unlimited");
    }

    #[test]
    fn set_and_remove_exact() {
        let mut table = LimitTable::new(None);
        assert_eq!(table.set_exact("acme".into(), limit(1.0)), None);
        assert_eq!(table.set_exact("acme".into(), limit(2.0)), Some(limit(1.0)));
        assert_eq!(table.limit_for("acme"), Some(limit(2.0)));
        assert_eq!(table.remove_exact("acme"), Some(limit(2.0)));
        assert_eq!(table.remove_exact("acme"), None);
        assert_eq!(table.limit_for("acme"), None);
    }

    #[test]
    fn rules_serialize_as_bucket_or_pattern() {
        let table = LimitTable::from_rules(
            None,
            [
                LimitRule {
                    selector: Selector::Pattern("p*".into()),
                    limit_rps: limit(5.0),
                },
                LimitRule {
                    selector: Selector::Bucket("b".into()),
                    limit_rps: limit(7.0),
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
