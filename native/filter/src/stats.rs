//! The agents' metrics, exported to Envoy's stats: counters as the deltas
//! since the last export, gauges at their value. The metric names are the
//! wasm filter's (`sluice_agent::metrics`), so dashboards and the stats
//! tags regexes of `envoy/README.md` work for both builds.

use std::collections::HashMap;

use sluice_agent::host::MetricKind;
use sluice_agent::metrics::{Counter, Gauge};

use sluice_agent::memory::MetricValue;

/// Where exported metrics go: Envoy's stats, through the module boundary.
pub trait StatsSink: Send + Sync {
    /// Adds `delta` to the counter `name`.
    fn add_counter(&self, name: &str, delta: u64);
    /// Sets the gauge `name`.
    fn set_gauge(&self, name: &str, value: u64);
}

/// Requests whose hook panicked in the module and went on unfiltered.
pub const HOOK_PANICS: &str = "sluice.native_hook_panics";

/// Every metric name the module may export, with its kind: the agents' and
/// [`HOOK_PANICS`]; what the module defines in Envoy when the configuration
/// is created (Envoy accepts no new stats after that).
pub fn metric_names() -> impl Iterator<Item = (MetricKind, &'static str)> {
    Counter::ALL
        .into_iter()
        .map(|counter| (MetricKind::Counter, counter.name()))
        .chain(
            Gauge::ALL
                .into_iter()
                .map(|gauge| (MetricKind::Gauge, gauge.name())),
        )
        .chain(std::iter::once((MetricKind::Counter, HOOK_PANICS)))
}

/// What was exported so far, to turn counter totals into deltas.
#[derive(Debug, Default)]
pub struct Exporter {
    exported: HashMap<String, u64>,
}

impl Exporter {
    /// Exports `metrics` (current totals and gauge values) to `sink`.
    pub fn export(&mut self, metrics: &[MetricValue], sink: &dyn StatsSink) {
        for metric in metrics {
            match metric.kind {
                MetricKind::Counter => {
                    let exported = self.exported.entry(metric.name.clone()).or_insert(0);
                    let delta = metric.value.saturating_sub(*exported);
                    if delta > 0 {
                        sink.add_counter(&metric.name, delta);
                        *exported = metric.value;
                    }
                }
                MetricKind::Gauge => {
                    if self.exported.get(&metric.name) != Some(&metric.value) {
                        sink.set_gauge(&metric.name, metric.value);
                        self.exported.insert(metric.name.clone(), metric.value);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(String, u64)>>);

    impl StatsSink for Recorder {
        fn add_counter(&self, name: &str, delta: u64) {
            if let Ok(mut calls) = self.0.lock() {
                calls.push((format!("+{name}"), delta));
            }
        }
        fn set_gauge(&self, name: &str, value: u64) {
            if let Ok(mut calls) = self.0.lock() {
                calls.push((format!("={name}"), value));
            }
        }
    }

    fn metric(kind: MetricKind, name: &str, value: u64) -> MetricValue {
        MetricValue {
            kind,
            name: name.to_owned(),
            value,
        }
    }

    #[test]
    fn counters_export_deltas_and_gauges_changes() {
        let sink = Recorder::default();
        let mut exporter = Exporter::default();
        exporter.export(
            &[
                metric(MetricKind::Counter, "c", 5),
                metric(MetricKind::Gauge, "g", 2),
            ],
            &sink,
        );
        exporter.export(
            &[
                metric(MetricKind::Counter, "c", 5),
                metric(MetricKind::Gauge, "g", 2),
            ],
            &sink,
        );
        exporter.export(
            &[
                metric(MetricKind::Counter, "c", 8),
                metric(MetricKind::Gauge, "g", 1),
            ],
            &sink,
        );
        let calls = sink.0.lock().map(|c| c.clone()).unwrap_or_default();
        assert_eq!(
            calls,
            vec![
                ("+c".to_owned(), 5),
                ("=g".to_owned(), 2),
                ("+c".to_owned(), 3),
                ("=g".to_owned(), 1),
            ]
        );
    }

    #[test]
    fn every_agent_metric_has_a_name_to_define() {
        let names: Vec<_> = metric_names().collect();
        assert_eq!(names.len(), Counter::ALL.len() + Gauge::ALL.len() + 1);
        assert!(
            names
                .iter()
                .any(|(_, n)| *n == "sluice.result=pass.decisions")
        );
    }
}
