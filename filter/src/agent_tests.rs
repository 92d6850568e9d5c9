//! Several agents sharing one fake process, driven tick by tick.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use super::*;
use crate::fake_host::{FakeHost, FakeProcess};
use crate::host_api::{HostError, LogLevel};
use sluice_proto::v1::{BucketCount, Directive};
use std::cell::RefCell;
use std::rc::Rc;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const CLUSTER: &str = "sluice_control_plane";
const START_MS: u64 = 1_700_000_000_000;

struct Fleet {
    process: Rc<RefCell<FakeProcess>>,
    vms: Vec<(FakeHost, Agent)>,
    now_ms: u64,
}

fn settings() -> AgentSettings {
    AgentSettings {
        control_plane_cluster: CLUSTER.into(),
        proxy_id: "envoy-a".into(),
        report_interval_ms: 250,
        max_buckets: 100,
        decision: DecisionMode::Coin,
        allowance: None,
    }
}

impl Fleet {
    fn new(vms: usize) -> Self {
        Self::with_settings(vms, settings())
    }

    fn with_settings(vms: usize, settings: AgentSettings) -> Self {
        let process = FakeProcess::new(CLUSTER);
        let vms = (0..vms)
            .map(|vm| {
                let host = FakeHost {
                    vm,
                    process: Rc::clone(&process),
                };
                (host, Agent::new(settings.clone(), 1000 + vm as u64))
            })
            .collect();
        Self {
            process,
            vms,
            now_ms: START_MS,
        }
    }

    /// Advances the clock one tick and ticks the given VMs.
    fn tick_only(&mut self, which: &[usize]) {
        self.now_ms += TICK_MS;
        for vm in which {
            let (host, agent) = &mut self.vms[*vm];
            agent.on_tick(host, self.now_ms);
        }
    }

    fn tick(&mut self) {
        let all: Vec<usize> = (0..self.vms.len()).collect();
        self.tick_only(&all);
    }

    fn ticks(&mut self, n: usize) {
        for _ in 0..n {
            self.tick();
        }
    }

    fn leaders(&self) -> Vec<usize> {
        (0..self.vms.len())
            .filter(|vm| self.vms[*vm].1.is_leader())
            .collect()
    }

    fn the_stream(&self) -> (u32, usize) {
        let open = self.process.borrow().open_streams();
        assert_eq!(open.len(), 1, "expected exactly one open stream: {open:?}");
        open[0]
    }

    fn sent(&self, token: u32) -> Vec<ProxyMessage> {
        self.process.borrow().streams[&token]
            .sent
            .iter()
            .map(|bytes| ProxyMessage::decode(bytes.as_slice()).unwrap())
            .collect()
    }

    fn reports(&self, token: u32) -> Vec<Report> {
        self.sent(token)
            .into_iter()
            .filter_map(|m| match m.kind {
                Some(proxy_message::Kind::Report(report)) => Some(report),
                _ => None,
            })
            .collect()
    }

    /// The control plane sends a batch on the current stream.
    fn push(&mut self, epoch: u64, version: u64, directives: &[(&str, f64)]) {
        let (token, vm) = self.the_stream();
        let batch = DirectiveBatch {
            epoch,
            version,
            issued_at_unix_ms: self.now_ms,
            directives: directives
                .iter()
                .map(|(bucket, drop_ratio)| Directive {
                    bucket: (*bucket).into(),
                    drop_ratio: *drop_ratio,
                    limit_rps: 1.0,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let message = ControlMessage {
            kind: Some(control_message::Kind::Directives(batch)),
        };
        let (host, agent) = &mut self.vms[vm];
        agent.on_stream_message(host, token, &message.encode_to_vec());
    }

    /// The host closes the current stream, as Envoy does when the control
    /// plane goes away.
    fn server_closes(&mut self, status: u32) {
        let (token, vm) = self.the_stream();
        self.process
            .borrow_mut()
            .streams
            .get_mut(&token)
            .unwrap()
            .open = false;
        let now_ms = self.now_ms;
        let (host, agent) = &mut self.vms[vm];
        agent.on_stream_close(host, token, status, now_ms);
    }

    fn admit_n(&mut self, vm: usize, bucket: &str, n: usize) -> usize {
        (0..n)
            .filter(|_| self.vms[vm].1.admit(bucket) == Verdict::Drop)
            .count()
    }

    fn warnings(&self) -> usize {
        self.process
            .borrow()
            .logs
            .iter()
            .filter(|(_, level, _)| *level == LogLevel::Warn)
            .count()
    }
}

fn total(reports: &[Report], bucket: &str) -> (u64, u64) {
    reports
        .iter()
        .flat_map(|r| &r.buckets)
        .filter(|c| c.bucket == bucket)
        .fold((0, 0), |(o, a), c: &BucketCount| {
            (o + c.offered, a + c.admitted)
        })
}

#[test]
fn one_vm_leads_opens_the_stream_and_says_hello() {
    let mut fleet = Fleet::new(1);
    fleet.tick(); // writes the lease
    assert!(fleet.leaders().is_empty());
    fleet.tick(); // reads it back: leads, opens
    assert_eq!(fleet.leaders(), [0]);
    let (token, vm) = fleet.the_stream();
    assert_eq!(vm, 0);
    let sent = fleet.sent(token);
    let Some(proxy_message::Kind::Hello(hello)) = &sent[0].kind else {
        panic!("first message is not a Hello: {sent:?}");
    };
    assert_eq!(hello.proxy_id, "envoy-a");
    assert_ne!(hello.instance_id, 0);
}

#[test]
fn exactly_one_of_many_vms_leads_even_after_a_racy_first_write() {
    let mut fleet = Fleet::new(5);
    fleet.ticks(2);
    assert_eq!(fleet.leaders().len(), 1);
    fleet.ticks(20);
    assert_eq!(fleet.leaders().len(), 1);
    assert_eq!(
        fleet.process.borrow().streams.len(),
        1,
        "no stream churn in steady state"
    );
}

#[test]
fn directives_reach_every_vm_within_one_tick() {
    let mut fleet = Fleet::new(3);
    fleet.ticks(2);
    fleet.push(1, 1, &[("acme", 1.0)]);
    fleet.tick();
    for vm in 0..3 {
        assert_eq!(fleet.admit_n(vm, "acme", 100), 100, "vm {vm} did not drop");
        assert_eq!(fleet.admit_n(vm, "other", 100), 0);
    }
    fleet.push(1, 2, &[("acme", 0.0)]);
    fleet.tick();
    for vm in 0..3 {
        assert_eq!(fleet.admit_n(vm, "acme", 100), 0, "vm {vm} still drops");
    }
}

#[test]
fn reports_add_up_the_counts_of_every_vm() {
    let mut fleet = Fleet::new(3);
    fleet.ticks(2);
    let (token, _) = fleet.the_stream();
    fleet.push(1, 1, &[("acme", 1.0)]);
    fleet.tick();
    for vm in 0..3 {
        fleet.admit_n(vm, "acme", 10);
        fleet.admit_n(vm, "free", 5);
    }
    // Followers enqueue on the next tick; the leader sends within an interval.
    fleet.ticks(5);
    let reports = fleet.reports(token);
    assert!(!reports.is_empty());
    assert_eq!(total(&reports, "acme"), (30, 0));
    assert_eq!(total(&reports, "free"), (15, 15));
    let sequences: Vec<u64> = reports.iter().map(|r| r.sequence).collect();
    assert_eq!(sequences, (1..=reports.len() as u64).collect::<Vec<_>>());
    assert!(
        reports
            .iter()
            .all(|r| r.window_ms >= 250 && r.window_ms <= 300),
        "{reports:?}"
    );
    assert!(
        reports
            .iter()
            .flat_map(|r| &r.buckets)
            .all(|c| c.offered > 0)
    );
}

#[test]
fn a_dead_leader_is_replaced_and_no_count_is_lost() {
    let mut fleet = Fleet::new(3);
    fleet.ticks(2);
    let (old_token, old_leader) = fleet.the_stream();
    let others: Vec<usize> = (0..3).filter(|vm| *vm != old_leader).collect();
    for vm in 0..3 {
        fleet.admit_n(vm, "acme", 7);
    }
    // The leader stops ticking (stuck or gone); the others carry on.
    for _ in 0..10 {
        fleet.tick_only(&others);
        for vm in &others {
            fleet.admit_n(*vm, "acme", 1);
        }
        // The queue never holds more than one message per VM per lease TTL.
        assert!(fleet.process.borrow().queue_len(COUNTS_QUEUE) <= 2 * LEASE_TTL_TICKS as usize);
    }
    let leaders = fleet.leaders();
    assert_eq!(
        leaders.len(),
        2,
        "old leader has not noticed yet: {leaders:?}"
    );
    let open = fleet.process.borrow().open_streams();
    let (new_token, new_leader) = *open.iter().find(|(t, _)| *t != old_token).unwrap();
    assert_ne!(new_leader, old_leader);
    // The old leader comes back, sees the new lease and gives up its stream.
    fleet.tick();
    assert_eq!(fleet.leaders(), [new_leader]);
    assert_eq!(fleet.the_stream().0, new_token);
    fleet.ticks(6);
    let mut reports = fleet.reports(old_token);
    reports.extend(fleet.reports(new_token));
    let offered = total(&reports, "acme").0;
    assert_eq!(offered, 3 * 7 + 2 * 10, "counts were lost or doubled");
}

#[test]
fn a_closed_stream_reopens_with_backoff_and_a_new_hello() {
    let mut fleet = Fleet::new(2);
    fleet.ticks(2);
    let (first, _) = fleet.the_stream();
    fleet.ticks(3);
    fleet.server_closes(14);
    assert!(fleet.process.borrow().open_streams().is_empty());
    // The first retry waits at most 250 ms (plus a tick of granularity).
    fleet.ticks(4);
    let (second, _) = fleet.the_stream();
    assert_ne!(first, second);
    let sent = fleet.sent(second);
    assert!(matches!(sent[0].kind, Some(proxy_message::Kind::Hello(_))));
    fleet.ticks(3);
    assert_eq!(fleet.reports(second)[0].sequence, 1);
}

#[test]
fn an_unreachable_control_plane_backs_off_without_flooding_the_log() {
    let mut fleet = Fleet::new(2);
    fleet.ticks(2);
    let mut streams_opened = 0;
    for _ in 0..600 {
        if let Some((_, _)) = fleet.process.borrow().open_streams().first() {
            streams_opened += 1;
        }
        if !fleet.process.borrow().open_streams().is_empty() {
            fleet.server_closes(14);
        }
        fleet.tick();
    }
    // 60 s with retries capped at 5 s (mean 2.5 s): far fewer than 600.
    assert!(streams_opened < 80, "{streams_opened} attempts");
    assert!(fleet.warnings() <= 5, "{} warnings", fleet.warnings());
}

#[test]
fn an_unknown_cluster_is_retried_not_fatal() {
    let mut fleet = Fleet::with_settings(
        1,
        AgentSettings {
            control_plane_cluster: "nope".into(),
            ..settings()
        },
    );
    fleet.ticks(50);
    assert_eq!(fleet.leaders(), [0]);
    assert!(fleet.process.borrow().streams.is_empty());
    assert_eq!(fleet.warnings(), 1);
}

#[test]
fn a_restarted_control_plane_merges_into_what_the_proxy_holds() {
    let mut fleet = Fleet::new(2);
    fleet.ticks(2);
    fleet.push(41, 17, &[("a", 0.5), ("b", 0.5)]);
    fleet.server_closes(13);
    fleet.ticks(4);
    // New process, new epoch, version counter back at 1, knows only "b".
    fleet.push(99, 1, &[("b", 1.0)]);
    fleet.tick();
    for vm in 0..2 {
        let table = fleet.vms[vm].1.directives();
        assert_eq!(table.drop_ratio("a").map(|r| r.get()), Some(0.5));
        assert_eq!(table.drop_ratio("b").map(|r| r.get()), Some(1.0));
        assert_eq!(table.provenance().epoch, 99);
    }
}

#[test]
fn without_a_leader_counts_stay_local_and_bounded() {
    let mut fleet = Fleet::with_settings(
        2,
        AgentSettings {
            max_buckets: 3,
            ..settings()
        },
    );
    // Every VM reads an unreadable lease, so every tick is an Acquire whose
    // write is clobbered before anyone reads it back: nobody ever leads.
    for _ in 0..20 {
        for vm in 0..2 {
            fleet.process.borrow_mut().set(LEASE_KEY, b"garbage");
            fleet.tick_only(&[vm]);
        }
        for vm in 0..2 {
            for bucket in ["a", "b", "c", "d", "e"] {
                fleet.admit_n(vm, bucket, 1);
            }
        }
    }
    assert!(fleet.leaders().is_empty());
    assert_eq!(fleet.process.borrow().queue_len(COUNTS_QUEUE), 0);
    for vm in 0..2 {
        assert_eq!(fleet.vms[vm].1.local.len(), 3);
    }
}

#[test]
fn a_corrupt_directive_blob_keeps_the_last_known_table() {
    let mut fleet = Fleet::new(2);
    fleet.ticks(2);
    fleet.push(1, 1, &[("acme", 1.0)]);
    fleet.tick();
    fleet.process.borrow_mut().set(DIRECTIVES_KEY, &[0xff; 7]);
    let before = fleet.warnings();
    fleet.ticks(10);
    // One warning per VM for the bad blob, not one per tick.
    assert_eq!(fleet.warnings() - before, 2);
    for vm in 0..2 {
        assert_eq!(fleet.admit_n(vm, "acme", 10), 10);
    }
}

#[test]
fn messages_on_abandoned_streams_are_ignored() {
    let mut fleet = Fleet::new(1);
    fleet.ticks(2);
    let message = ControlMessage {
        kind: Some(control_message::Kind::Directives(DirectiveBatch {
            epoch: 1,
            version: 1,
            issued_at_unix_ms: 0,
            directives: vec![Directive {
                bucket: "acme".into(),
                drop_ratio: 1.0,
                limit_rps: 1.0,
                ..Default::default()
            }],
            ..Default::default()
        })),
    };
    let (host, agent) = &mut fleet.vms[0];
    agent.on_stream_message(host, 9999, &message.encode_to_vec());
    agent.on_stream_message(host, 1, b"\xff\xff not protobuf");
    assert!(agent.directives().is_empty());
}

mod metrics {
    use super::*;
    use crate::metrics::{Counter, Gauge};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const PASS: &str = Counter::DecisionsPass.name();
    const DROP: &str = Counter::DecisionsDropClusterOverload.name();

    impl Fleet {
        fn metric(&self, name: &str) -> Option<u64> {
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

        fleet.push(1, 2, &[("a", 0.0)]);
        fleet.tick();
        assert_eq!(fleet.metric(age), Some(TICK_MS));
        assert_eq!(fleet.metric(buckets), Some(1));
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
}
