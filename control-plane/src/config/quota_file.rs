//! Quota configuration in envoyproxy/ratelimit's format, loaded as its
//! loader (`src/config/config_impl.go`) loads it: one `domain` per file
//! with nested `descriptors` (`key`, optional `value`, optional
//! `rate_limit`, `shadow_mode`, `quota_mode`, `detailed_metric`,
//! `value_to_metric`, `share_threshold`, `metadata`, nested
//! `descriptors`), several files in a directory.
//!
//! Every shape it refuses is refused here, with the file, the line and
//! column and the field: an unknown key, a bad unit (units are read in any
//! case, as it upper-cases them), `unlimited` with a unit, an empty key or
//! domain, a duplicate descriptor at one level, an empty or self-naming
//! `replaces`, `share_threshold` on a value without `*`, a domain in two
//! files (unless domains are merged, as `MERGE_DOMAIN_CONFIG` merges
//! them). Scalars are read as its YAML 1.1 parser reads them (`yes` is a
//! boolean, `value: 42` the string `"42"`, `1_000` a number). A file with
//! several YAML documents is refused: it would read only the first.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::config::error::{ConfigError, InvalidConfig};

/// A time unit of envoyproxy/ratelimit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Unit {
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

/// The unit names, as written in a configuration (any case).
const UNIT_NAMES: &[&str] = &["second", "minute", "hour", "day", "week", "month", "year"];

impl Unit {
    /// The window in milliseconds.
    pub(crate) fn window_ms(self) -> u64 {
        const SECOND: u64 = 1_000;
        SECOND
            * match self {
                Unit::Second => 1,
                Unit::Minute => 60,
                Unit::Hour => 3_600,
                Unit::Day => 86_400,
                Unit::Week => 7 * 86_400,
                Unit::Month => 30 * 86_400,
                Unit::Year => 365 * 86_400,
            }
    }

    /// From the wire enum of `envoy.service.ratelimit.v3` (0 = unknown).
    pub(crate) fn from_wire(unit: i32) -> Option<Self> {
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
    pub(crate) fn as_str(self) -> &'static str {
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

    /// A unit name in any case (`second`, `SECOND`, `Minute`), as
    /// envoyproxy/ratelimit reads it.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// To that wire enum.
    pub(crate) fn to_wire(self) -> i32 {
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

impl<'de> Deserialize<'de> for Unit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Unit::parse(&name).ok_or_else(|| de::Error::unknown_variant(&name, UNIT_NAMES))
    }
}

/// How files are combined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LoadOptions {
    /// Files naming the same domain are merged into one tree (a
    /// descriptor in two of them is still an error), as
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG=true`; otherwise a
    /// domain in two files is an error.
    pub(crate) merge_domains: bool,
}

/// A configured limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Limit {
    /// `None`: unlimited.
    pub(crate) quota: Option<(u32, Unit)>,
    /// Over-limit requests are counted but answered OK.
    pub(crate) shadow_mode: bool,
    /// Over limit, this descriptor refuses the request only when every
    /// quota-mode descriptor of the request is over its limit.
    pub(crate) quota_mode: bool,
    /// The limit's name (for `replaces`).
    pub(crate) name: String,
    /// Names of limits this one replaces in the same request.
    pub(crate) replaces: Vec<String>,
    /// Metrics per value, not per configured key.
    pub(crate) detailed_metric: bool,
    /// The configured key path (`domain.key_value.key`), for metrics.
    pub(crate) full_key: String,
    /// The descriptor's `metadata`, returned in the response's dynamic
    /// metadata when the descriptor passes (if enabled).
    pub(crate) metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A `value` (or `key`) with `*` in it: matches the composite `key_value`
/// of a request entry, each `*` standing for any run of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wildcard {
    /// The composite as configured (`path_/api/*`), the child's name.
    pub(crate) composite: String,
    /// It split on `*`.
    parts: Vec<String>,
}

impl Wildcard {
    /// The wildcard of a child named `composite` (which holds a `*`).
    pub(crate) fn new(composite: &str) -> Self {
        Self {
            composite: composite.to_owned(),
            parts: composite.split('*').map(str::to_owned).collect(),
        }
    }

    /// Whether `composite` (`key_value` of a request entry) matches: the
    /// literal parts in order, the first at the start, the last at the end.
    pub(crate) fn matches(&self, composite: &str) -> bool {
        let [first, middle @ .., last] = self.parts.as_slice() else {
            return self.parts.first().is_some_and(|only| only == composite);
        };
        let fixed: usize = self.parts.iter().map(String::len).sum();
        if composite.len() < fixed || !composite.starts_with(first.as_str()) {
            return false;
        }
        if !composite.ends_with(last.as_str()) {
            return false;
        }
        let Some(mut rest) = composite.get(first.len()..composite.len() - last.len()) else {
            return false;
        };
        for part in middle {
            let Some(at) = rest.find(part.as_str()) else {
                return false;
            };
            rest = rest.get(at + part.len()..).unwrap_or_default();
        }
        true
    }
}

/// One level of the descriptor tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Node {
    /// Children by `key` or `key_value` (wildcards by their composite).
    pub(crate) children: HashMap<String, Node>,
    /// Children whose composite holds a `*`, in file order.
    pub(crate) wildcards: Vec<Wildcard>,
    /// The limit at this node.
    pub(crate) limit: Option<Limit>,
    /// Metrics name this level by the request's value.
    pub(crate) value_to_metric: bool,
    /// Requests matching this wildcard share one counter (and metrics
    /// name the pattern).
    pub(crate) share_threshold: bool,
}

/// Every domain's tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct QuotaConfig {
    /// Domain → root node.
    pub(crate) domains: HashMap<String, Node>,
}

impl QuotaConfig {
    /// Reads a file, or every `*.yaml` / `*.yml` file of a directory (in
    /// name order), a domain in two files being an error.
    #[cfg(test)]
    pub(crate) fn from_path(path: &Path) -> Result<Self, ConfigError> {
        Self::load(path, LoadOptions::default())
    }

    /// Reads a file, or every `*.yaml` / `*.yml` file of a directory (in
    /// name order), with `options`; a domain in two files is an error.
    pub(crate) fn load(path: &Path, options: LoadOptions) -> Result<Self, ConfigError> {
        Self::from_files_with(&Self::read_files(path)?, options)
    }

    /// The files [`Self::load`] reads: `path` itself, or the `*.yaml` and
    /// `*.yml` files in the directory `path` and its subdirectories, in
    /// path order, as `(name, text)`. envoyproxy/ratelimit loads every
    /// file under its configuration directory, so a file there that is
    /// neither is refused (naming it) rather than left out: its limits
    /// would silently not apply. Entries whose name starts with `.` are
    /// skipped, as ratelimit does with `RUNTIME_IGNOREDOTFILES=true`: a
    /// Kubernetes ConfigMap volume keeps its files twice, in `..data/` and
    /// a timestamped `..<date>/` beside the links at the top.
    pub(crate) fn read_files(path: &Path) -> Result<Vec<(String, String)>, ConfigError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        if !path.is_dir() {
            return Ok(vec![(path.display().to_string(), read(path)?)]);
        }
        let mut names = Vec::new();
        collect_config_files(path, 0, &mut names)?;
        names.sort();
        names
            .into_iter()
            .map(|name| Ok((name.display().to_string(), read(&name)?)))
            .collect()
    }

    /// Builds the configuration from `(file name, YAML)` pairs, a domain
    /// in two files being an error.
    #[cfg(test)]
    pub(crate) fn from_files(files: &[(String, String)]) -> Result<Self, ConfigError> {
        Self::from_files_with(files, LoadOptions::default())
    }

    /// Builds the configuration from `(file name, YAML)` pairs with
    /// `options`, a domain in two files being an error.
    pub(crate) fn from_files_with(
        files: &[(String, String)],
        options: LoadOptions,
    ) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        for (file, text) in files {
            let raw = parse_file(file, text)?;
            if raw.domain.0.is_empty() {
                return Err(invalid(
                    file,
                    find_line(text, "domain"),
                    "domain",
                    "config file cannot have empty domain",
                ));
            }
            let domain = raw.domain.0;
            match config.domains.get_mut(&domain) {
                Some(_) if !options.merge_domains => {
                    return Err(invalid(
                        file,
                        find_line(text, "domain"),
                        "domain",
                        &format!(
                            "duplicate domain {domain:?}: another file configures it (MERGE_DOMAIN_CONFIG: --quota-merge-domains)"
                        ),
                    ));
                }
                Some(root) => {
                    let location = find_line(text, "descriptors");
                    build_level(
                        root,
                        file,
                        location,
                        "descriptors",
                        &domain,
                        raw.descriptors.0,
                    )?;
                }
                None => {
                    let mut root = Node::default();
                    build_level(
                        &mut root,
                        file,
                        None,
                        "descriptors",
                        &domain,
                        raw.descriptors.0,
                    )?;
                    config.domains.insert(domain, root);
                }
            }
        }
        Ok(config)
    }
}

/// Parses one file, refusing one with several documents.
fn parse_file(file: &str, text: &str) -> Result<RawFile, ConfigError> {
    let mut documents = serde_yaml_ng::Deserializer::from_str(text);
    let Some(first) = documents.next() else {
        return Err(invalid(file, None, "", "empty file: no domain"));
    };
    let raw: Option<RawFile> =
        serde_path_to_error::deserialize(first).map_err(|err| yaml_error(file, err))?;
    if documents.next().is_some() {
        return Err(invalid(
            file,
            None,
            "",
            "the file holds several YAML documents (`---`); envoyproxy/ratelimit reads only the first: give each domain a file of its own",
        ));
    }
    Ok(raw.unwrap_or_default())
}

/// A parse or validation error as `file:line:column: field: message`:
/// the parser's own path prefix is dropped from its message (the field
/// says it), and an unknown key's field is the map it is in (the message
/// names the key).
fn yaml_error(file: &str, err: serde_path_to_error::Error<serde_yaml_ng::Error>) -> ConfigError {
    let mut field = err.path().to_string();
    if field == "." {
        field.clear();
    }
    let inner = err.into_inner();
    let location = inner.location().map(|l| (l.line(), l.column()));
    let mut message = inner.to_string();
    if let Some((line, column)) = location
        && let Some(stripped) = message.strip_suffix(&format!(" at line {line} column {column}"))
    {
        message = stripped.to_owned();
    }
    if let Some((prefix, rest)) = message.split_once(": ")
        && !prefix.is_empty()
        && !prefix.contains(' ')
    {
        message = rest.to_owned();
    }
    if let Some(unknown) = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next())
        && let Some(parent) = field.strip_suffix(unknown)
    {
        field = parent.trim_end_matches('.').to_owned();
    }
    ConfigError::Invalid(InvalidConfig {
        file: file.to_owned(),
        location,
        field,
        message,
    })
}

/// The 1-based line and column of the first line starting with `field:`.
fn find_line(text: &str, field: &str) -> Option<(usize, usize)> {
    let prefix = format!("{field}:");
    text.lines()
        .position(|line| line.starts_with(&prefix))
        .map(|index| (index + 1, 1))
}

fn invalid(
    file: &str,
    location: Option<(usize, usize)>,
    field: &str,
    message: &str,
) -> ConfigError {
    ConfigError::Invalid(InvalidConfig {
        file: file.to_owned(),
        location,
        field: field.to_owned(),
        message: message.to_owned(),
    })
}

/// Adds `descriptors` (already validated one by one) under `node`.
fn build_level(
    node: &mut Node,
    file: &str,
    location: Option<(usize, usize)>,
    path: &str,
    parent_key: &str,
    descriptors: Vec<Descriptor>,
) -> Result<(), ConfigError> {
    for (index, descriptor) in descriptors.into_iter().enumerate() {
        let composite = descriptor.composite();
        if node.children.contains_key(&composite) {
            return Err(invalid(
                file,
                location,
                &format!("{path}[{index}]"),
                &format!("duplicate descriptor composite key '{parent_key}.{composite}'"),
            ));
        }
        let full_key = format!("{parent_key}.{composite}");
        let limit = descriptor.rate_limit.map(|rate| Limit {
            quota: rate.quota,
            shadow_mode: descriptor.shadow_mode,
            quota_mode: descriptor.quota_mode,
            name: rate.name,
            replaces: rate.replaces,
            detailed_metric: descriptor.detailed_metric,
            full_key: full_key.clone(),
            metadata: descriptor.metadata.clone(),
        });
        let mut child = Node {
            limit,
            value_to_metric: descriptor.value_to_metric,
            share_threshold: descriptor.share_threshold,
            ..Node::default()
        };
        build_level(
            &mut child,
            file,
            location,
            &format!("{path}[{index}].descriptors"),
            &full_key,
            descriptor.descriptors.0,
        )?;
        if composite.contains('*') {
            node.wildcards.push(Wildcard::new(&composite));
        }
        node.children.insert(composite, child);
    }
    Ok(())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    domain: Text,
    #[serde(default)]
    descriptors: Descriptors,
}

/// One level's descriptors; a composite key twice is refused where the
/// second one is (so the error has its line).
#[derive(Debug, Default)]
struct Descriptors(Vec<Descriptor>);

impl<'de> Deserialize<'de> for Descriptors {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Level;
        impl<'de> Visitor<'de> for Level {
            type Value = Descriptors;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of descriptors")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Descriptors, E> {
                Ok(Descriptors::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Descriptors, E> {
                Ok(Descriptors::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Descriptors, D::Error> {
                d.deserialize_any(self)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Descriptors, A::Error> {
                let mut level: Vec<Descriptor> = Vec::new();
                while let Some(descriptor) = seq.next_element_seed(Unique(&level))? {
                    level.push(descriptor);
                }
                Ok(Descriptors(level))
            }
        }
        deserializer.deserialize_any(Level)
    }
}

/// A descriptor whose composite key is none of these (refused inside its
/// own deserialization, so that the error has its position).
struct Unique<'a>(&'a [Descriptor]);

impl<'de> de::DeserializeSeed<'de> for Unique<'_> {
    type Value = Descriptor;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Descriptor, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Unique<'_> {
    type Value = Descriptor;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a descriptor (a map with a key)")
    }

    /// Validates inside the map, where the parser knows its position.
    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Descriptor, A::Error> {
        let raw = RawDescriptor::deserialize(de::value::MapAccessDeserializer::new(map))?;
        let descriptor = Descriptor::try_from(raw).map_err(de::Error::custom)?;
        let composite = descriptor.composite();
        if self.0.iter().any(|d| d.composite() == composite) {
            return Err(de::Error::custom(format!(
                "duplicate descriptor composite key '{composite}' at this level"
            )));
        }
        Ok(descriptor)
    }
}

/// A descriptor, validated.
#[derive(Debug)]
struct Descriptor {
    key: String,
    value: String,
    rate_limit: Option<RateLimitSpec>,
    descriptors: Descriptors,
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
    value_to_metric: bool,
    share_threshold: bool,
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

impl Descriptor {
    /// `key`, or `key_value` when it has a value (its name at its level).
    fn composite(&self) -> String {
        if self.value.is_empty() {
            self.key.clone()
        } else {
            format!("{}_{}", self.key, self.value)
        }
    }
}

#[derive(Debug)]
struct RateLimitSpec {
    quota: Option<(u32, Unit)>,
    name: String,
    replaces: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    #[serde(default)]
    key: Text,
    #[serde(default)]
    value: Text,
    #[serde(default)]
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    descriptors: Descriptors,
    #[serde(default)]
    shadow_mode: Flag,
    #[serde(default)]
    quota_mode: Flag,
    #[serde(default)]
    detailed_metric: Flag,
    #[serde(default)]
    value_to_metric: Flag,
    #[serde(default)]
    share_threshold: Flag,
    #[serde(default)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    #[serde(default)]
    requests_per_unit: Count,
    #[serde(default)]
    unit: Text,
    #[serde(default)]
    unlimited: Flag,
    #[serde(default)]
    name: Text,
    #[serde(default)]
    replaces: Option<Vec<RawReplaces>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplaces {
    #[serde(default)]
    name: Text,
}

impl TryFrom<RawDescriptor> for Descriptor {
    type Error = String;

    fn try_from(raw: RawDescriptor) -> Result<Self, String> {
        let key = raw.key.0;
        let value = raw.value.0;
        if key.is_empty() {
            return Err("descriptor has empty key".to_owned());
        }
        let rate_limit = match raw.rate_limit {
            None => None,
            Some(rate) => {
                let unit = Unit::parse(&rate.unit.0);
                let quota = match (rate.unlimited.0, unit) {
                    (true, Some(_)) => {
                        return Err(
                            "rate_limit.unit: should not specify rate limit unit when unlimited"
                                .to_owned(),
                        );
                    }
                    (true, None) => None,
                    (false, None) => {
                        return Err(format!(
                            "rate_limit.unit: invalid rate limit unit '{}' (second, minute, hour, day, week, month or year, in any case)",
                            rate.unit.0
                        ));
                    }
                    (false, Some(unit)) => Some((rate.requests_per_unit.0, unit)),
                };
                let name = rate.name.0;
                let mut replaces = Vec::new();
                for replaced in rate.replaces.unwrap_or_default() {
                    if replaced.name.0.is_empty() {
                        return Err(
                            "rate_limit.replaces: should not have an empty replaces entry"
                                .to_owned(),
                        );
                    }
                    if replaced.name.0 == name {
                        return Err(
                            "rate_limit.replaces: replaces should not contain name of same descriptor"
                                .to_owned(),
                        );
                    }
                    replaces.push(replaced.name.0);
                }
                Some(RateLimitSpec {
                    quota,
                    name,
                    replaces,
                })
            }
        };
        let descriptor = Descriptor {
            key,
            value,
            rate_limit,
            descriptors: raw.descriptors,
            shadow_mode: raw.shadow_mode.0,
            quota_mode: raw.quota_mode.0,
            detailed_metric: raw.detailed_metric.0,
            value_to_metric: raw.value_to_metric.0,
            share_threshold: raw.share_threshold.0,
            metadata: raw.metadata.filter(|m| !m.is_empty()),
        };
        if descriptor.share_threshold && !descriptor.composite().contains('*') {
            return Err(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{}'",
                descriptor.composite()
            ));
        }
        Ok(descriptor)
    }
}

/// A scalar read as a string, as a YAML 1.1 loader fills a string field:
/// a number or a boolean becomes its text, null the empty string. Floats,
/// lists and maps are refused (envoyproxy/ratelimit refuses them too).
#[derive(Debug, Default)]
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Scalar;
        impl<'de> Visitor<'de> for Scalar {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text, E> {
                Ok(Text(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Text, E> {
                Ok(Text::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Text, E> {
                Ok(Text::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Text, D::Error> {
                d.deserialize_any(self)
            }
        }
        deserializer.deserialize_any(Scalar)
    }
}

/// A boolean as YAML 1.1 reads one: `true`/`false` and also `yes`, `no`,
/// `on`, `off`, `y`, `n` in their usual cases; null is false.
#[derive(Debug, Default)]
struct Flag(bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Boolean;
        impl<'de> Visitor<'de> for Boolean {
            type Value = Flag;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a boolean (true, false, yes, no, on, off)")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Flag, E> {
                Ok(Flag(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Flag, E> {
                match v {
                    "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On"
                    | "ON" => Ok(Flag(true)),
                    "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off"
                    | "Off" | "OFF" => Ok(Flag(false)),
                    _ => Err(de::Error::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_unit<E: de::Error>(self) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_none<E: de::Error>(self) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Flag, D::Error> {
                d.deserialize_any(self)
            }
        }
        deserializer.deserialize_any(Boolean)
    }
}

/// `requests_per_unit`: an integer from 0 to 4,294,967,295, as YAML 1.1
/// writes one (`1_000`, `0x10`, `0o17`, `0b101`); null is 0.
#[derive(Debug, Default)]
struct Count(u32);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Integer;
        impl<'de> Visitor<'de> for Integer {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer from 0 to 4294967295")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
                u32::try_from(v)
                    .map(Count)
                    .map_err(|_| de::Error::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
                u32::try_from(v)
                    .map(Count)
                    .map_err(|_| de::Error::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Count, E> {
                yaml11_integer(v)
                    .and_then(|n| u32::try_from(n).ok())
                    .map(Count)
                    .ok_or_else(|| de::Error::invalid_value(de::Unexpected::Str(v), &self))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Count, E> {
                Ok(Count(0))
            }
            fn visit_none<E: de::Error>(self) -> Result<Count, E> {
                Ok(Count(0))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Count, D::Error> {
                d.deserialize_any(self)
            }
        }
        deserializer.deserialize_any(Integer)
    }
}

/// A plain scalar a YAML 1.1 loader reads as an integer and YAML 1.2 as a
/// string: digits with `_`, `0x`/`0o`/`0b` prefixes, a leading `0` octal.
fn yaml11_integer(text: &str) -> Option<u64> {
    let plain: String = text.chars().filter(|c| *c != '_').collect();
    let plain = plain.strip_prefix('+').unwrap_or(&plain);
    let (digits, radix) = if let Some(hex) = plain.strip_prefix("0x") {
        (hex, 16)
    } else if let Some(octal) = plain.strip_prefix("0o") {
        (octal, 8)
    } else if let Some(binary) = plain.strip_prefix("0b") {
        (binary, 2)
    } else if plain.len() > 1 && plain.starts_with('0') {
        (plain.get(1..)?, 8)
    } else {
        (plain, 10)
    };
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// How deep [`QuotaConfig::read_files`] follows subdirectories: far more
/// than any configuration tree, and a bound on a link that loops.
const MAX_CONFIG_DEPTH: usize = 16;

/// Adds the configuration files under `dir` to `files` (see
/// [`QuotaConfig::read_files`]).
fn collect_config_files(
    dir: &Path,
    depth: usize,
    files: &mut Vec<std::path::PathBuf>,
) -> Result<(), ConfigError> {
    let unreadable = |source| ConfigError::Read {
        path: dir.to_path_buf(),
        source,
    };
    if depth > MAX_CONFIG_DEPTH {
        return Err(unreadable(std::io::Error::other(format!(
            "more than {MAX_CONFIG_DEPTH} levels of subdirectories (a link that loops?)"
        ))));
    }
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        let hidden = path
            .file_name()
            .is_some_and(|name| name.as_encoded_bytes().starts_with(b"."));
        if hidden {
            continue;
        }
        if path.is_dir() {
            collect_config_files(&path, depth + 1, files)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            files.push(path);
        } else if path.is_file() {
            return Err(ConfigError::Read {
                path,
                source: std::io::Error::other(
                    "not a .yaml or .yml file, so not read; envoyproxy/ratelimit would load it as configuration: rename it to .yaml or move it out of the directory",
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;

    fn load_one(yaml: &str) -> Result<QuotaConfig, String> {
        QuotaConfig::from_files(&[("quotas.yaml".to_owned(), yaml.to_owned())])
            .map_err(|err| err.to_string())
    }

    /// envoyproxy/ratelimit loads every file under its directory; one in a
    /// subdirectory used to be left out, its limits silently not applied.
    #[test]
    fn a_directory_is_read_with_its_subdirectories_and_without_dot_entries() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, domain: &str| {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(
                path,
                format!(
                    "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
                ),
            )
            .unwrap();
        };
        write("top.yaml", "top");
        write("team/nested.yml", "nested");
        write("team/deeper/deepest.yaml", "deepest");
        // A ConfigMap volume: the files again under `..data/` and a
        // timestamped directory, with links at the top.
        write("..data/top.yaml", "top");
        write("..2026_11_28_12_00_00.1/top.yaml", "top");
        write(".hidden.yaml", "top");
        let config = QuotaConfig::from_path(dir.path()).unwrap();
        let mut domains: Vec<_> = config.domains.keys().cloned().collect();
        domains.sort();
        assert_eq!(domains, ["deepest", "nested", "top"]);

        std::fs::write(dir.path().join("team/notes"), "domain: x\n").unwrap();
        let err = QuotaConfig::from_path(dir.path()).unwrap_err().to_string();
        assert!(err.contains("team/notes"), "{err}");
        assert!(err.contains("not a .yaml or .yml file"), "{err}");
    }

    #[test]
    fn the_shipped_example_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quotas");
        let config = QuotaConfig::from_path(&dir).unwrap();
        assert!(config.domains["api"].children.contains_key("tenant_gold"));
    }

    #[test]
    fn the_documented_example_loads() {
        let doc = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/quotas.md"),
        )
        .unwrap();
        let from = doc.find("## Configuration").unwrap();
        let start = from + doc[from..].find("```yaml\n").unwrap() + "```yaml\n".len();
        let end = start + doc[start..].find("```").unwrap();
        let config = load_one(&doc[start..end]).unwrap();
        let api = &config.domains["api"];
        assert!(api.children.contains_key("path_/api/*/export"));
        assert!(
            api.children["service_checkout"]
                .limit
                .as_ref()
                .unwrap()
                .quota_mode
        );
    }

    #[test]
    fn wildcards_match_as_envoyproxy_ratelimit_matches_them() {
        let w = Wildcard::new("midWild_bar*b");
        assert!(w.matches("midWild_barab") && w.matches("midWild_barb"));
        assert!(!w.matches("midWild_bara") && !w.matches("xmidWild_barb"));
        let multi = Wildcard::new("m_foo*bar*baz");
        assert!(multi.matches("m_foo123bar456baz") && multi.matches("m_foobarbaz"));
        assert!(!multi.matches("m_foo123baz") && !multi.matches("m_bar456baz"));
        // The fixed parts may not overlap: "ab*ba" does not match "aba".
        assert!(!Wildcard::new("ab*ba").matches("aba"));
        assert!(Wildcard::new("ab*ba").matches("abba"));
        let trailing = Wildcard::new("k_foo*");
        assert!(trailing.matches("k_foo") && trailing.matches("k_foo1"));
        assert!(!trailing.matches("k_fo"));
        assert!(Wildcard::new("*").matches("anything"));
    }

    #[test]
    fn yaml_1_1_scalars() {
        assert_eq!(yaml11_integer("1_000"), Some(1_000));
        assert_eq!(yaml11_integer("0x10"), Some(16));
        assert_eq!(yaml11_integer("010"), Some(8));
        assert_eq!(yaml11_integer("0b101"), Some(5));
        assert_eq!(yaml11_integer("ten"), None);
        let config = load_one(
            "domain: 42\ndescriptors:\n  - key: k\n    value: 7\n    shadow_mode: yes\n    rate_limit: {unit: SECOND, requests_per_unit: 1_000}\n",
        )
        .unwrap();
        let node = &config.domains["42"].children["k_7"];
        let limit = node.limit.as_ref().unwrap();
        assert_eq!(limit.quota, Some((1_000, Unit::Second)));
        assert!(limit.shadow_mode);
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_field() {
        let err = load_one("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n").unwrap_err();
        assert!(err.starts_with("quotas.yaml:3:5: descriptors[0]: rate_limit.unit: invalid rate limit unit 'fortnight'"), "{err}");
        let err = load_one("domain: d\ndescriptors:\n  - key: k\n    ratelimit: {}\n").unwrap_err();
        assert!(err.contains("unknown field `ratelimit`"), "{err}");
        assert!(err.starts_with("quotas.yaml:4:"), "{err}");
        let err = load_one("domain: d\ndescriptors:\n  - key: k\n  - key: k\n").unwrap_err();
        assert!(
            err.starts_with(
                "quotas.yaml:4:5: descriptors[1]: duplicate descriptor composite key 'k'"
            ),
            "{err}"
        );
        let err = QuotaConfig::from_files(&[
            ("a.yaml".to_owned(), "domain: d\n".to_owned()),
            ("b.yaml".to_owned(), "# b\ndomain: d\n".to_owned()),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("b.yaml:2:1: domain:"), "{err}");
    }
}
