//! Metrics a fleet of VMs flushes: decisions, reports, batches, gauges.

use super::*;
use crate::metrics::{Counter, Gauge};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const PASS: &str = Counter::DecisionsPass.name();
const DROP: &str = Counter::DecisionsDropClusterOverload.name();

impl Fleet {
    pub(super) fn metric(&self, name: &str) -> Option<u64> {
        self.process.borrow().metric(name)
    }

    fn metric_calls(&self) -> usize {
        self.process.borrow().metric_calls.values().sum()
    }

    fn metric_warnings(&self) -> usize {
        self.process
            .borrow()
            .logs
            .iter()
            .filter(|(_, level, line)| *level == LogLevel::Warn && line.contains("metric"))
            .count()
    }
}

#[test]
fn decisions_flushed_on_tick_match_admits_exactly_without_host_calls_per_request() {
    let mut fleet = Fleet::new(3);
    fleet.ticks(2);
    fleet.push(1, 1, &[("hot", 0.5)]);
    fleet.tick();
    let calls_before = fleet.metric_calls();
    let mut dropped = 0;
    for vm in 0..3 {
        dropped += fleet.admit_n(vm, "hot", 1000);
        dropped += fleet.admit_n(vm, "cold", 100);
    }
    assert_eq!(
        fleet.metric_calls(),
        calls_before,
        "admit() must not call the host"
    );
    assert!(dropped > 1000 && dropped < 2000, "dropped {dropped}");
    assert_eq!(
        fleet
            .vms
            .iter()
            .map(|(_, a)| a.metrics().pending(Counter::DecisionsDropClusterOverload))
            .sum::<u64>(),
        dropped as u64
    );

    fleet.tick();
    assert_eq!(fleet.metric(DROP), Some(dropped as u64));
    assert_eq!(fleet.metric(PASS), Some(3300 - dropped as u64));
    for (_, agent) in &fleet.vms {
        assert_eq!(agent.metrics().pending(Counter::DecisionsPass), 0);
    }
    // Flushed once: quiet ticks add nothing.
    fleet.ticks(3);
    assert_eq!(fleet.metric(PASS), Some(3300 - dropped as u64));
    assert_eq!(fleet.metric(DROP), Some(dropped as u64));
}

#[test]
fn every_metric_is_defined_once_per_vm() {
    let mut fleet = Fleet::new(3);
    fleet.ticks(10);
    let per_vm = Counter::ALL.len() + Gauge::ALL.len();
    assert_eq!(fleet.process.borrow().metric_definitions(), 3 * per_vm);
    for name in Counter::ALL
        .map(Counter::name)
        .iter()
        .chain(&Gauge::ALL.map(Gauge::name))
    {
        assert!(fleet.metric(name).is_some(), "{name} not defined");
    }
}

#[test]
fn reports_sent_and_failed_are_counted() {
    let mut fleet = Fleet::new(2);
    fleet.ticks(2);
    let (token, _) = fleet.the_stream();
    fleet.ticks(10);
    let sent = fleet.reports(token).len() as u64;
    assert!(sent >= 3, "{sent} reports");
    assert_eq!(fleet.metric(Counter::ReportsSent.name()), Some(sent));
    assert_eq!(fleet.metric(Counter::ReportsFailed.name()), Some(0));

    fleet.server_closes(14);
    fleet.tick();
    assert_eq!(fleet.metric(Counter::ReportsFailed.name()), Some(1));
}

#[test]
fn batches_and_rejected_directives_are_counted() {
    let mut fleet = Fleet::new(2);
    fleet.ticks(2);
    fleet.push(1, 1, &[("a", 0.5), ("b", 1.5), ("", 0.5)]);
    fleet.push(1, 2, &[("c", 0.25)]);
    fleet.tick();
    assert_eq!(fleet.metric(Counter::DirectiveBatches.name()), Some(2));
    assert_eq!(fleet.metric(Counter::DirectivesRejected.name()), Some(2));
}

#[test]
fn the_leader_records_directive_age_and_buckets() {
    let mut fleet = Fleet::new(3);
    fleet.ticks(2);
    let age = Gauge::DirectiveAgeMs.name();
    let buckets = Gauge::DirectiveBuckets.name();
    assert_eq!(fleet.metric(age), Some(0), "no directive yet");
    assert_eq!(fleet.metric(buckets), Some(0));

    fleet.push(1, 1, &[("a", 0.5), ("b", 0.5)]);
    fleet.ticks(3);
    assert_eq!(fleet.metric(age), Some(3 * TICK_MS));
    assert_eq!(fleet.metric(buckets), Some(2));

    // Only the leader writes the gauges.
    let leader = fleet.leaders()[0];
    let calls_by_vm = fleet.process.borrow().metric_calls.clone();
    fleet.tick();
    let after = fleet.process.borrow().metric_calls.clone();
    for vm in 0..3 {
        let made = after[&vm] - calls_by_vm[&vm];
        let expected = if vm == leader { Gauge::ALL.len() } else { 0 };
        assert_eq!(made, expected, "vm {vm}");
    }

    // A lifted limit stays a known cell but no longer sheds.
    fleet.push(1, 2, &[("a", 0.0), ("c", 0.0)]);
    fleet.tick();
    assert_eq!(fleet.metric(age), Some(TICK_MS));
    assert_eq!(fleet.metric(buckets), Some(1));
    assert_eq!(fleet.metric(Gauge::DirectiveCells.name()), Some(3));
}

#[test]
fn failing_metric_calls_warn_once_and_lose_no_count() {
    let mut fleet = Fleet::new(1);
    fleet.process.borrow_mut().metric_error = Some(HostError::InternalFailure);
    fleet.ticks(2);
    let dropped = fleet.admit_n(0, "x", 50);
    assert_eq!(dropped, 0);
    fleet.ticks(5);
    assert_eq!(fleet.metric_warnings(), 1);
    assert_eq!(fleet.metric(PASS), None);

    fleet.process.borrow_mut().metric_error = None;
    fleet.tick();
    assert_eq!(fleet.metric(PASS), Some(50));
    assert_eq!(fleet.metric_warnings(), 1);
    let per_vm = Counter::ALL.len() + Gauge::ALL.len();
    assert_eq!(fleet.process.borrow().metric_definitions(), per_vm);
}
