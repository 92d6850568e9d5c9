//! Which configured limit a request descriptor hits, with
//! envoyproxy/ratelimit's matching order: at each level the exact
//! `key_value`, else a `key_value*` prefix (in file order), else the bare
//! `key` (the default for any value). The limit applies only when the
//! descriptor's last entry lands on a node that has one.
//!
//! envoyproxy/ratelimit looks wildcards up in the domain's top-level list
//! at every depth; here each level has its own, so a wildcard applies
//! where it is written.

use super::config::{Limit, Node};

/// The limit for `entries` under `root`, if any.
pub fn find<'a>(root: &'a Node, entries: &[(&str, &str)]) -> Option<&'a Limit> {
    let mut level = root;
    let mut found = None;
    let mut composite = String::new();
    for (index, (key, value)) in entries.iter().enumerate() {
        composite.clear();
        composite.push_str(key);
        composite.push('_');
        composite.push_str(value);
        let next = level
            .children
            .get(&composite)
            .or_else(|| {
                level
                    .wildcards
                    .iter()
                    .find(|w| composite.starts_with(w.trim_end_matches('*')))
                    .and_then(|w| level.children.get(w))
            })
            .or_else(|| level.children.get(*key));
        let Some(next) = next else {
            break;
        };
        if index + 1 == entries.len() {
            found = next.limit.as_ref();
        }
        if next.children.is_empty() {
            break;
        }
        level = next;
    }
    found
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::quotas::config::{QuotaConfig, Unit};

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
        find(&config.domains["d"], entries).and_then(|l| l.quota)
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
