//! The Prometheus text format as the tests read it: one parser for the
//! control plane's `/metrics` (OpenMetrics) and Envoy's
//! `/stats/prometheus`, used by every test crate and the benchmarks.

use std::collections::BTreeMap;
use std::fmt;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series name (`sluice_proxies_connected`, `…_bucket`, `…_total`).
    pub name: String,
    /// Its labels, unescaped.
    pub labels: BTreeMap<String, String>,
    /// Its value (`+Inf`, `-Inf` and `NaN` included).
    pub value: f64,
}

/// A line that is neither a comment nor a sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// The line as written.
    pub text: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: not a sample: {:?}", self.line, self.text)
    }
}

impl std::error::Error for ParseError {}

/// A parsed page: the `# TYPE` of each family and every sample, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

impl Exposition {
    /// Parses a page; any line that is not a comment, blank or a sample is
    /// an error naming it.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let mut exposition = Self::default();
        for (index, line) in text.lines().enumerate() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((family, kind)) = rest.split_once(' ') {
                    exposition
                        .types
                        .insert(family.to_owned(), kind.trim().to_owned());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let sample = parse_sample(line).ok_or_else(|| ParseError {
                line: index + 1,
                text: line.to_owned(),
            })?;
            exposition.samples.push(sample);
        }
        Ok(exposition)
    }

    /// Every sample, in page order.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// The `# TYPE` of `family` (`counter`, `gauge`, `histogram`, …).
    pub fn kind(&self, family: &str) -> Option<&str> {
        self.types.get(family).map(String::as_str)
    }

    /// Samples of `name` whose labels include `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> {
        self.samples.iter().filter(move |sample| {
            sample.name == name
                && labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(*value))
        })
    }

    /// The value of the sample of `name` with exactly `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels)
            .find(|sample| sample.labels.len() == labels.len())
            .map(|sample| sample.value)
    }

    /// The sum of every sample of `name` whose labels include `labels`
    /// (0 when there is none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|sample| sample.value).sum()
    }

    /// The sum of the samples a series selects, written as the page writes
    /// it: `sluice_streams_rejected_total` sums every label set,
    /// `sluice_store_failures_total{op="share"}` those with that label
    /// (0 when there is none, or `series` is not a series).
    pub fn total(&self, series: &str) -> f64 {
        let Some((name, labels)) = parse_series(series) else {
            return 0.0;
        };
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str()))
            .collect();
        self.sum(&name, &labels)
    }

    /// The value of one series written as the page writes it, e.g.
    /// `sluice_directive_batches_pushed_total{kind="snapshot"}` (labels in
    /// any order).
    pub fn series(&self, series: &str) -> Option<f64> {
        let wanted = parse_series(series)?;
        self.samples
            .iter()
            .find(|sample| sample.name == wanted.0 && sample.labels == wanted.1)
            .map(|sample| sample.value)
    }

    /// The cumulative `(upper bound, count)` buckets of histogram `family`
    /// whose other labels include `labels`, `+Inf` last.
    pub fn histogram(&self, family: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
        let name = format!("{family}_bucket");
        let mut buckets: Vec<(f64, f64)> = self
            .matching(&name, labels)
            .filter_map(|sample| {
                let bound = parse_value(sample.labels.get("le")?)?;
                Some((bound, sample.value))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        buckets
    }
}

/// `name{labels} value [timestamp]`.
fn parse_sample(line: &str) -> Option<Sample> {
    let (name, labels, rest) = split_series(line)?;
    let value = rest.split_whitespace().next()?;
    Some(Sample {
        name: name.to_owned(),
        labels,
        value: parse_value(value)?,
    })
}

/// `name{labels}` alone.
fn parse_series(series: &str) -> Option<(String, BTreeMap<String, String>)> {
    let (name, labels, rest) = split_series(series)?;
    rest.trim().is_empty().then(|| (name.to_owned(), labels))
}

/// The name, the labels and what follows them.
fn split_series(line: &str) -> Option<(&str, BTreeMap<String, String>, &str)> {
    let line = line.trim_start();
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let (name, mut rest) = line.split_at(name_end);
    if name.is_empty() {
        return None;
    }
    let mut labels = BTreeMap::new();
    if let Some(body) = rest.strip_prefix('{') {
        rest = body;
        loop {
            rest = rest.trim_start_matches([' ', ',']);
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after_key) = rest.split_once('=')?;
            let (value, after_value) = unquote(after_key.strip_prefix('"')?)?;
            labels.insert(key.trim().to_owned(), value);
            rest = after_value;
        }
    }
    Some((name, labels, rest))
}

/// Reads a label value up to its closing quote, undoing `\\`, `\"` and
/// `\n`; returns it and what follows the quote.
fn unquote(text: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Some((value, text.get(at + 1..)?)),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                other => value.push(other),
            },
            other => value.push(other),
        }
    }
    None
}

fn parse_value(value: &str) -> Option<f64> {
    match value {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        value => value.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const PAGE: &str = r#"# HELP sluice_pushes Directive batches pushed.
# TYPE sluice_pushes counter
sluice_pushes_total{kind="snapshot"} 2
sluice_pushes_total{kind="delta"} 40
# TYPE sluice_proxies gauge
sluice_proxies 3
sluice_rule{bucket="a,b=\"c\"\\d",zone="z"} 1.5 1700000000
# TYPE sluice_latency_seconds histogram
sluice_latency_seconds_bucket{le="0.5"} 7
sluice_latency_seconds_bucket{le="+Inf"} 9
sluice_latency_seconds_bucket{le="0.1"} 4
# EOF
"#;

    #[test]
    fn reads_samples_types_and_escaped_labels() {
        let page = Exposition::parse(PAGE).unwrap();
        assert_eq!(page.samples().len(), 7);
        assert_eq!(page.kind("sluice_pushes"), Some("counter"));
        assert_eq!(page.kind("sluice_latency_seconds"), Some("histogram"));
        assert_eq!(page.value("sluice_proxies", &[]), Some(3.0));
        assert_eq!(
            page.value("sluice_pushes_total", &[("kind", "delta")]),
            Some(40.0)
        );
        assert_eq!(page.value("sluice_pushes_total", &[]), None);
        assert_eq!(page.sum("sluice_pushes_total", &[]), 42.0);
        assert_eq!(
            page.value("sluice_rule", &[("bucket", r#"a,b="c"\d"#), ("zone", "z")]),
            Some(1.5)
        );
        assert_eq!(
            page.series(r#"sluice_pushes_total{kind="snapshot"}"#),
            Some(2.0)
        );
        assert_eq!(page.series("sluice_proxies"), Some(3.0));
        assert_eq!(page.series("sluice_missing"), None);
        assert_eq!(page.total("sluice_pushes_total"), 42.0);
        assert_eq!(page.total(r#"sluice_pushes_total{kind="delta"}"#), 40.0);
        assert_eq!(page.total("sluice_missing"), 0.0);
        assert_eq!(
            page.histogram("sluice_latency_seconds", &[]),
            vec![(0.1, 4.0), (0.5, 7.0), (f64::INFINITY, 9.0)]
        );
    }

    #[test]
    fn names_a_line_it_cannot_read() {
        let err = Exposition::parse("a 1\nb{x=\"1\" 2\n").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(Exposition::parse("a one\n").is_err());
        assert!(Exposition::parse("{x=\"1\"} 1\n").is_err());
    }
}
