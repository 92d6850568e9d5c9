//! Which configured limit a request descriptor hits, as
//! envoyproxy/ratelimit's `GetLimit` finds it: the entries are walked down
//! the tree; at each level the exact `key_value` wins, else the level's
//! first wildcard (`*` anywhere in the value, in file order) that matches
//! `key_value`, else the bare `key`. Each level has its own wildcards
//! (envoyproxy/ratelimit looked at the domain's top level only until 2023,
//! its #420). The limit applies only when the descriptor's last entry
//! lands on a node that has one.
//!
//! The match also says how the limit is counted and named: entries matched
//! by a `share_threshold` wildcard count under the pattern (every value it
//! matches shares one counter), and `detailed_metric` / `value_to_metric`
//! name the request's values in metrics.

use crate::config::quota_file::{Limit, Node, Wildcard};

/// Most entries a descriptor may have to be matched.
pub(crate) const MAX_ENTRIES: usize = 16;
/// Longest request value kept in a metrics key path (longer ones are cut,
/// so two values alike in their first bytes share a series).
pub(crate) const MAX_METRIC_VALUE_BYTES: usize = 64;

/// How one entry found its node.
#[derive(Debug, Clone, Copy)]
enum How<'a> {
    /// By `key_value`.
    Exact,
    /// By a wildcard.
    Wildcard(&'a Wildcard),
    /// By the bare `key`.
    Default,
}

/// A limit a descriptor hits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Match<'a> {
    /// The limit.
    pub(crate) limit: &'a Limit,
    /// The key path metrics count it under.
    pub(crate) metric_key: MetricKey<'a>,
    /// Per entry, the pattern its counter uses instead of its value
    /// (`share_threshold`); `None` when no entry shares.
    pub(crate) shared: Option<Vec<Option<&'a str>>>,
}

/// The key path of a match's metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MetricKey<'a> {
    /// The configured path (`domain.key_value.key`): bounded by the
    /// configuration.
    Configured(&'a str),
    /// A path naming request values (`detailed_metric`,
    /// `value_to_metric`): bounded by the metrics when counted.
    PerValue(String),
}

/// The limit for `entries` of `domain` under `root`, if any.
pub(crate) fn find<'a>(
    root: &'a Node,
    domain: &str,
    entries: &[(&str, &str)],
) -> Option<Match<'a>> {
    if entries.is_empty() || entries.len() > MAX_ENTRIES {
        return None;
    }
    let mut walked: [Option<(&'a Node, How<'a>)>; MAX_ENTRIES] = [None; MAX_ENTRIES];
    let mut level = root;
    let mut found = None;
    let mut composite = String::new();
    for (index, (key, value)) in entries.iter().enumerate() {
        composite.clear();
        composite.push_str(key);
        composite.push('_');
        composite.push_str(value);
        let next = match level.children.get(&composite) {
            Some(node) => Some((node, How::Exact)),
            None => level
                .wildcards
                .iter()
                .find(|w| w.matches(&composite))
                .and_then(|w| {
                    level
                        .children
                        .get(&w.composite)
                        .map(|n| (n, How::Wildcard(w)))
                })
                .or_else(|| level.children.get(*key).map(|n| (n, How::Default))),
        };
        let Some((node, how)) = next else {
            break;
        };
        if let Some(slot) = walked.get_mut(index) {
            *slot = Some((node, how));
        }
        if index + 1 == entries.len() {
            found = node.limit.as_ref();
        }
        if node.children.is_empty() {
            break;
        }
        level = node;
    }
    let limit = found?;
    let walked = walked.get(..entries.len())?;
    let shared_pattern = |key: &str, node: &'a Node, how: How<'a>| -> Option<&'a str> {
        match how {
            How::Wildcard(w) if node.share_threshold => Some(trim_key(&w.composite, key)),
            _ => None,
        }
    };
    let mut shared: Option<Vec<Option<&'a str>>> = None;
    for (index, ((key, _), step)) in entries.iter().zip(walked).enumerate() {
        if let Some((node, how)) = step
            && let Some(pattern) = shared_pattern(key, node, *how)
        {
            let per_entry = shared.get_or_insert_with(|| vec![None; entries.len()]);
            if let Some(slot) = per_entry.get_mut(index) {
                *slot = Some(pattern);
            }
        }
    }
    let metric_key = if limit.detailed_metric {
        // Every entry with its value; a shared entry with its pattern.
        let mut key_path = domain.to_owned();
        for (index, (key, value)) in entries.iter().enumerate() {
            key_path.push('.');
            key_path.push_str(key);
            let pattern = shared
                .as_ref()
                .and_then(|s| s.get(index).copied().flatten());
            match pattern {
                Some(pattern) => {
                    key_path.push('_');
                    key_path.push_str(pattern);
                }
                None if shared.is_some() => {
                    if !value.is_empty() {
                        key_path.push('_');
                        key_path.push_str(cut(value));
                    }
                }
                None => {
                    key_path.push('_');
                    key_path.push_str(cut(value));
                }
            }
        }
        MetricKey::PerValue(key_path)
    } else if walked
        .iter()
        .any(|step| step.is_some_and(|(node, _)| node.value_to_metric))
    {
        let mut key_path = domain.to_owned();
        for ((key, value), step) in entries.iter().zip(walked) {
            key_path.push('.');
            key_path.push_str(key);
            let shown = match step {
                Some((node, How::Wildcard(w))) => {
                    if node.share_threshold {
                        trim_key(&w.composite, key)
                    } else if node.value_to_metric {
                        value
                    } else {
                        trim_key(&w.composite, key)
                    }
                }
                Some((_, How::Exact)) => value,
                Some((node, How::Default)) if node.value_to_metric => value,
                _ => "",
            };
            if !shown.is_empty() {
                key_path.push('_');
                key_path.push_str(cut(shown));
            }
        }
        MetricKey::PerValue(key_path)
    } else {
        MetricKey::Configured(&limit.full_key)
    };
    Some(Match {
        limit,
        metric_key,
        shared,
    })
}

/// The key path envoyproxy/ratelimit names a descriptor with a limit
/// override by: `domain.key_value.key…` (a key without `_` when its value
/// is empty), values cut at [`MAX_METRIC_VALUE_BYTES`].
pub(crate) fn descriptor_key<'a>(
    domain: &str,
    entries: impl Iterator<Item = (&'a str, &'a str)>,
) -> String {
    let mut key_path = domain.to_owned();
    for (key, value) in entries {
        key_path.push('.');
        key_path.push_str(key);
        if !value.is_empty() {
            key_path.push('_');
            key_path.push_str(cut(value));
        }
    }
    key_path
}

/// `text` cut to at most [`MAX_METRIC_VALUE_BYTES`] on a character
/// boundary.
fn cut(text: &str) -> &str {
    if text.len() <= MAX_METRIC_VALUE_BYTES {
        return text;
    }
    let mut end = MAX_METRIC_VALUE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// A wildcard composite without its `key_` (`files_files/*` → `files/*`).
fn trim_key<'a>(composite: &'a str, key: &str) -> &'a str {
    composite
        .strip_prefix(key)
        .and_then(|rest| rest.strip_prefix('_'))
        .unwrap_or(composite)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::quota_file::{QuotaConfig, Unit};

    fn config() -> QuotaConfig {
        QuotaConfig::from_files(&[(
            "q.yaml".to_owned(),
            r#"
domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tenant
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: tenant
    value: free-*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    descriptors:
      - key: method
        value: POST
        rate_limit: {unit: second, requests_per_unit: 2}
"#
            .to_owned(),
        )])
        .unwrap()
    }

    fn quota(entries: &[(&str, &str)]) -> Option<(u32, Unit)> {
        let config = config();
        find(&config.domains["d"], "d", entries).and_then(|m| m.limit.quota)
    }

    #[test]
    fn exact_then_wildcard_then_default() {
        assert_eq!(quota(&[("tenant", "gold")]), Some((1000, Unit::Minute)));
        assert_eq!(quota(&[("tenant", "free-42")]), Some((5, Unit::Minute)));
        assert_eq!(quota(&[("tenant", "acme")]), Some((10, Unit::Minute)));
        assert_eq!(quota(&[("other", "x")]), None);
    }

    #[test]
    fn only_the_last_entry_takes_a_limit() {
        assert_eq!(
            quota(&[("path", "/a"), ("method", "POST")]),
            Some((2, Unit::Second))
        );
        // The path node has no limit of its own.
        assert_eq!(quota(&[("path", "/a")]), None);
        // More entries than the tree is deep: no limit.
        assert_eq!(quota(&[("tenant", "gold"), ("extra", "x")]), None);
        assert_eq!(quota(&[("path", "/a"), ("method", "GET")]), None);
    }
}
