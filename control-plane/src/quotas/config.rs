//! Quota configuration in envoyproxy/ratelimit's format, loaded unchanged:
//! one `domain` per file with nested `descriptors` (`key`, optional
//! `value`, optional `rate_limit`, `shadow_mode`, `detailed_metric`,
//! nested `descriptors`), several files in a directory.
//!
//! Unknown keys, bad units, an `unlimited` limit with a unit, an empty
//! key, duplicate keys at one level or a domain in two files are errors
//! naming the file, the line and the field.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, InvalidConfig};

/// A time unit of envoyproxy/ratelimit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days (envoyproxy/ratelimit's month).
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The window in milliseconds.
    pub fn window_ms(self) -> u64 {
        const SECOND: u64 = 1_000;
        match self {
            Unit::Second => SECOND,
            Unit::Minute => 60 * SECOND,
            Unit::Hour => 3_600 * SECOND,
            Unit::Day => 86_400 * SECOND,
            Unit::Week => 7 * 86_400 * SECOND,
            Unit::Month => 30 * 86_400 * SECOND,
            Unit::Year => 365 * 86_400 * SECOND,
        }
    }

    /// From the wire enum of `envoy.service.ratelimit.v3` (0 = unknown).
    pub fn from_wire(unit: i32) -> Option<Self> {
        Some(match unit {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }

    /// As written in a configuration file (`second`, `minute`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// To that wire enum.
    pub fn to_wire(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    domain: String,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: String,
    #[serde(default)]
    value: String,
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    #[serde(default)]
    requests_per_unit: u32,
    unit: Option<Unit>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: String,
    #[serde(default)]
    replaces: Vec<RawReplaces>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplaces {
    name: String,
}

/// A configured limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// `None`: unlimited.
    pub quota: Option<(u32, Unit)>,
    /// Over-limit requests are counted but answered OK.
    pub shadow_mode: bool,
    /// The limit's name (for `replaces`).
    pub name: String,
    /// Names of limits this one replaces in the same request.
    pub replaces: Vec<String>,
    /// Metrics per value, not per configured key.
    pub detailed_metric: bool,
    /// The configured key path (`domain.key_value.key`), for metrics.
    pub full_key: String,
}

/// One level of the descriptor tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    /// Children by `key` or `key_value` (a `value` ending in `*` is a
    /// prefix).
    pub children: HashMap<String, Node>,
    /// Children whose composite key ends in `*`, in file order.
    pub wildcards: Vec<String>,
    /// The limit at this node.
    pub limit: Option<Limit>,
}

/// Every domain's tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaConfig {
    /// Domain → root node.
    pub domains: HashMap<String, Node>,
}

impl QuotaConfig {
    /// Reads a file, or every `*.yaml` / `*.yml` file of a directory (in
    /// name order).
    pub fn from_path(path: &Path) -> Result<Self, ConfigError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        let mut files = Vec::new();
        if path.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            let mut names: Vec<_> = entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
                .collect();
            names.sort();
            for name in names {
                let text = read(&name)?;
                files.push((name.display().to_string(), text));
            }
        } else {
            files.push((path.display().to_string(), read(path)?));
        }
        Self::from_files(&files)
    }

    /// Builds the configuration from `(file name, YAML)` pairs.
    pub fn from_files(files: &[(String, String)]) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        for (file, text) in files {
            let deserializer = serde_yaml_ng::Deserializer::from_str(text);
            let raw: RawFile = serde_path_to_error::deserialize(deserializer)
                .map_err(|err| ConfigError::invalid(file, err))?;
            if raw.domain.is_empty() {
                return Err(invalid(file, "domain", "must not be empty"));
            }
            if config.domains.contains_key(&raw.domain) {
                return Err(invalid(
                    file,
                    "domain",
                    &format!(
                        "domain {:?} is already configured by another file",
                        raw.domain
                    ),
                ));
            }
            let mut root = Node::default();
            load(&mut root, file, "descriptors", &raw.domain, raw.descriptors)?;
            config.domains.insert(raw.domain, root);
        }
        Ok(config)
    }
}

fn invalid(file: &str, field: &str, message: &str) -> ConfigError {
    ConfigError::Invalid(InvalidConfig {
        file: file.to_owned(),
        location: None,
        field: field.to_owned(),
        message: message.to_owned(),
    })
}

fn load(
    node: &mut Node,
    file: &str,
    path: &str,
    parent_key: &str,
    descriptors: Vec<RawDescriptor>,
) -> Result<(), ConfigError> {
    for (index, raw) in descriptors.into_iter().enumerate() {
        let here = format!("{path}[{index}]");
        if raw.key.is_empty() {
            return Err(invalid(file, &format!("{here}.key"), "must not be empty"));
        }
        let composite = if raw.value.is_empty() {
            raw.key.clone()
        } else {
            format!("{}_{}", raw.key, raw.value)
        };
        if node.children.contains_key(&composite) {
            return Err(invalid(
                file,
                &here,
                &format!("duplicate descriptor {composite:?} at this level"),
            ));
        }
        let full_key = format!("{parent_key}.{composite}");
        let limit = match raw.rate_limit {
            None => None,
            Some(rate) => {
                let quota = match (rate.unlimited, rate.unit) {
                    (true, Some(_)) => {
                        return Err(invalid(
                            file,
                            &format!("{here}.rate_limit.unit"),
                            "an unlimited limit has no unit",
                        ));
                    }
                    (true, None) => None,
                    (false, None) => {
                        return Err(invalid(
                            file,
                            &format!("{here}.rate_limit.unit"),
                            "missing (second, minute, hour, day, week, month or year)",
                        ));
                    }
                    (false, Some(unit)) => Some((rate.requests_per_unit, unit)),
                };
                let mut replaces = Vec::with_capacity(rate.replaces.len());
                for (r, replaced) in rate.replaces.into_iter().enumerate() {
                    if replaced.name.is_empty() || replaced.name == rate.name {
                        return Err(invalid(
                            file,
                            &format!("{here}.rate_limit.replaces[{r}].name"),
                            "must name another limit",
                        ));
                    }
                    replaces.push(replaced.name);
                }
                Some(Limit {
                    quota,
                    shadow_mode: raw.shadow_mode,
                    name: rate.name,
                    replaces,
                    detailed_metric: raw.detailed_metric,
                    full_key: full_key.clone(),
                })
            }
        };
        let mut child = Node {
            limit,
            ..Node::default()
        };
        load(
            &mut child,
            file,
            &format!("{here}.descriptors"),
            &full_key,
            raw.descriptors,
        )?;
        if composite.ends_with('*') {
            node.wildcards.push(composite.clone());
        }
        node.children.insert(composite, child);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn load_one(yaml: &str) -> Result<QuotaConfig, String> {
        QuotaConfig::from_files(&[("quotas.yaml".to_owned(), yaml.to_owned())])
            .map_err(|err| err.to_string())
    }

    #[test]
    fn the_envoyproxy_ratelimit_example_loads() {
        let config = load_one(
            r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 10
    descriptors:
      - key: path
        value: /health*
        rate_limit:
          unlimited: true
        shadow_mode: true
        detailed_metric: true
"#,
        )
        .unwrap();
        let root = &config.domains["mongo_cps"];
        assert_eq!(
            root.children["database_users"]
                .limit
                .as_ref()
                .unwrap()
                .quota,
            Some((500, Unit::Second))
        );
        let nested = &root.children["remote_address"].children["path_/health*"];
        assert_eq!(nested.limit.as_ref().unwrap().quota, None);
        assert_eq!(root.children["remote_address"].wildcards, ["path_/health*"]);
    }

    #[test]
    fn the_shipped_example_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quotas");
        let config = QuotaConfig::from_path(&dir).unwrap();
        assert!(config.domains["api"].children.contains_key("tenant_gold"));
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_field() {
        let err = load_one("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n").unwrap_err();
        assert!(err.starts_with("quotas.yaml:5:"), "{err}");
        assert!(err.contains("descriptors[0].rate_limit.unit"), "{err}");
        let err = load_one("domain: d\ndescriptors:\n  - key: k\n    ratelimit: {}\n").unwrap_err();
        assert!(err.contains("unknown field `ratelimit`"), "{err}");
        let err = load_one("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n").unwrap_err();
        assert!(
            err.contains("descriptors[0].rate_limit.unit: an unlimited limit has no unit"),
            "{err}"
        );
        let err = load_one("domain: d\ndescriptors:\n  - key: k\n  - key: k\n").unwrap_err();
        assert!(err.contains("duplicate descriptor"), "{err}");
        let err = QuotaConfig::from_files(&[
            ("a.yaml".to_owned(), "domain: d\n".to_owned()),
            ("b.yaml".to_owned(), "domain: d\n".to_owned()),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("b.yaml: domain:"), "{err}");
    }
}
