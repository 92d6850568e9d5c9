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
use sluice_proto::v1::{BucketCount, Directive, Priority};
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
        max_buckets: 100,
        ..AgentSettings::new(CLUSTER, "envoy-a")
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
        let now_ms = self.now_ms;
        agent.on_stream_message(host, token, &message.encode_to_vec(), now_ms);
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

    /// Marks the shared table as rewritten, as the leader does.
    fn bump_directives_sequence(&mut self) {
        let mut process = self.process.borrow_mut();
        let mut meta =
            DirectivesMeta::decode(&process.get(DIRECTIVES_META_KEY).unwrap().bytes).unwrap();
        meta.sequence += 1;
        process.set(DIRECTIVES_META_KEY, &meta.encode());
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
fn reports_carry_the_age_of_the_enforced_directives() {
    let mut fleet = Fleet::new(2);
    // Ticks one at a time and returns the reports each tick sent, with the
    // time it sent them.
    let sent_over = |fleet: &mut Fleet, token: u32, ticks: usize| {
        let mut seen = fleet.reports(token).len();
        let mut sent = Vec::new();
        for _ in 0..ticks {
            fleet.admit_n(0, "acme", 1);
            fleet.tick();
            let reports = fleet.reports(token);
            sent.extend(reports[seen..].iter().map(|r| (fleet.now_ms, r.clone())));
            seen = reports.len();
        }
        assert!(!sent.is_empty(), "no report in {ticks} ticks");
        sent
    };
    fleet.ticks(2);
    let (token, _) = fleet.the_stream();
    for (_, report) in sent_over(&mut fleet, token, 6) {
        assert_eq!(report.directive_age_ms, None, "no table yet");
    }

    fleet.push(1, 1, &[("acme", 0.0)]);
    let pushed_at = fleet.now_ms;
    let sent = sent_over(&mut fleet, token, 12);
    for (at, report) in &sent {
        assert_eq!(report.directive_age_ms, Some(at - pushed_at), "{report:?}");
    }
    assert!(sent.len() >= 2, "the age grows report by report: {sent:?}");

    // A heartbeat (an empty batch) makes the whole table current again.
    fleet.push(1, 2, &[]);
    let heartbeat_at = fleet.now_ms;
    for (at, report) in sent_over(&mut fleet, token, 6) {
        assert_eq!(report.directive_age_ms, Some(at - heartbeat_at));
    }
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
    fleet.bump_directives_sequence();
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
    agent.on_stream_message(host, 9999, &message.encode_to_vec(), START_MS);
    agent.on_stream_message(host, 1, b"\xff\xff not protobuf", START_MS);
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
}

mod cells {
    use super::*;
    use crate::decision::Fallback;
    use crate::freshness::DirectivesMeta;
    use crate::metrics::{Counter, Gauge};
    use crate::new_cells::NewBucketPolicy;
    use crate::reject::DropReason;
    use crate::shared_keys::DIRECTIVES_META_KEY;
    use sluice_proto::v1::{Mode, ModePolicy, Priority, Reason};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    impl Fleet {
        /// The control plane sends this batch on the current stream.
        fn push_batch(&mut self, batch: DirectiveBatch) {
            let (token, vm) = self.the_stream();
            let message = ControlMessage {
                kind: Some(control_message::Kind::Directives(batch)),
            };
            let now_ms = self.now_ms;
            let (host, agent) = &mut self.vms[vm];
            agent.on_stream_message(host, token, &message.encode_to_vec(), now_ms);
        }

        /// Ticks one VM at an arbitrary time (the clock does not move).
        fn tick_vm_at(&mut self, vm: usize, now_ms: u64) {
            let (host, agent) = &mut self.vms[vm];
            agent.on_tick(host, now_ms);
        }

        fn cell_decisions(
            &mut self,
            vm: usize,
            cell: (&str, &str, Priority),
            n: usize,
        ) -> (usize, Option<Arc<crate::reject::RejectResponse>>) {
            let mut rejected = 0;
            let mut last = None;
            for _ in 0..n {
                if let Decision::Reject(response) =
                    self.vms[vm].1.admit_cell(cell.0, cell.1, cell.2)
                {
                    rejected += 1;
                    last = Some(response);
                }
            }
            (rejected, last)
        }

        fn logs_containing(&self, text: &str) -> Vec<(usize, LogLevel)> {
            self.process
                .borrow()
                .logs
                .iter()
                .filter(|(_, _, line)| line.contains(text))
                .map(|(vm, level, _)| (*vm, *level))
                .collect()
        }
    }

    fn batch(directives: Vec<Directive>) -> DirectiveBatch {
        DirectiveBatch {
            epoch: 1,
            version: 1,
            directives,
            ..Default::default()
        }
    }

    fn cell(bucket: &str, tenant: &str, priority: Priority, drop_ratio: f64) -> Directive {
        Directive {
            bucket: bucket.into(),
            tenant: tenant.into(),
            priority: priority as i32,
            drop_ratio,
            limit_rps: 100.0,
            ..Default::default()
        }
    }

    fn header<'a>(response: &'a crate::reject::RejectResponse, name: &str) -> Option<&'a str> {
        response
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn short_ticks_bring_a_directive_to_every_vm_within_one_poll() {
        let mut fleet = Fleet::new(3);
        fleet.ticks(2);
        let leader = fleet.leaders()[0];
        let start = fleet.now_ms;
        let follower = (leader + 1) % 3;
        // Followers are mid-way between slow ticks: the short tick alone
        // must pick the table up.
        fleet.tick_vm_at(follower, start + 20);
        fleet.push(1, 1, &[("acme", 1.0)]);
        assert_eq!(
            fleet.admit_n(follower, "acme", 10),
            0,
            "not before its tick"
        );
        fleet.tick_vm_at(follower, start + 40);
        assert_eq!(fleet.admit_n(follower, "acme", 10), 10);
        // The slow work keeps its cadence: one hand-off per ~100 ms with
        // continuous traffic, not one per short tick.
        let enqueued = |fleet: &Fleet| fleet.process.borrow().enqueued.values().sum::<usize>();
        let before = enqueued(&fleet);
        for step in 3..=52u64 {
            fleet.admit_n(follower, "free", 1);
            fleet.tick_vm_at(follower, start + step * 20);
            if step % 5 == 0 {
                fleet.tick_vm_at(leader, start + step * 20);
            }
        }
        let handoffs = enqueued(&fleet) - before;
        assert!((10..=13).contains(&handoffs), "{handoffs} hand-offs in 1 s");
    }

    struct Request(&'static [(&'static str, &'static str)]);

    impl crate::bucket_key::RequestAttributes for Request {
        fn header(&self, name: &str) -> Option<String> {
            self.0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
        fn route_name(&self) -> Option<String> {
            None
        }
    }

    #[test]
    fn requests_are_classified_into_their_cells() {
        let config = crate::config::FilterConfig::from_json(
            br#"{"control_plane_cluster": "cp",
                 "bucket_key": [{"source": "authority"}],
                 "tenant": {"source": "header", "name": "x-tenant"},
                 "priority": {"header": "x-priority", "values": {"batch": "bulk"}}}"#,
        )
        .unwrap();
        let mut fleet = Fleet::new(1);
        fleet.ticks(2);
        fleet.push_batch(batch(vec![cell("api", "acme", Priority::Bulk, 1.0)]));
        fleet.tick();
        let agent = &mut fleet.vms[0].1;
        let bulk = Request(&[
            (":authority", "API"),
            ("x-tenant", "acme"),
            ("x-priority", "Batch"),
        ]);
        let plain = Request(&[(":authority", "api"), ("x-tenant", "acme")]);
        let anonymous = Request(&[(":authority", "api")]);
        assert!(matches!(
            agent.admit_request(&config.classifier, &bulk),
            Decision::Reject(_)
        ));
        assert_eq!(
            agent.admit_request(&config.classifier, &plain),
            Decision::Admit
        );
        assert_eq!(
            agent.admit_request(&config.classifier, &anonymous),
            Decision::Admit
        );
        let mut cells = agent.local.clone().drain();
        cells.sort_by(|a, b| (&a.tenant, a.priority).cmp(&(&b.tenant, b.priority)));
        let seen: Vec<(&str, i32, u64, u64)> = cells
            .iter()
            .map(|c| (c.tenant.as_str(), c.priority, c.offered, c.admitted))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("acme", Priority::BestEffort as i32, 1, 1),
                ("acme", Priority::Bulk as i32, 1, 0),
                ("default", Priority::BestEffort as i32, 1, 1),
            ]
        );
    }

    #[test]
    fn the_exact_cell_wins_then_the_bucket_wide_directive() {
        let mut fleet = Fleet::new(1);
        fleet.ticks(2);
        fleet.push_batch(batch(vec![
            cell("api", "", Priority::Unspecified, 0.0),
            cell("api", "acme", Priority::Bulk, 1.0),
        ]));
        fleet.tick();
        assert_eq!(
            fleet
                .cell_decisions(0, ("api", "acme", Priority::Bulk), 50)
                .0,
            50
        );
        assert_eq!(
            fleet
                .cell_decisions(0, ("api", "acme", Priority::Critical), 50)
                .0,
            0
        );
        assert_eq!(
            fleet
                .cell_decisions(0, ("api", "globex", Priority::Bulk), 50)
                .0,
            0
        );
    }

    #[test]
    fn reports_carry_counts_per_cell() {
        let mut fleet = Fleet::new(2);
        fleet.ticks(2);
        let (token, _) = fleet.the_stream();
        fleet.push_batch(batch(vec![Directive {
            mode: Mode::Shadow as i32,
            ..cell("api", "acme", Priority::Bulk, 1.0)
        }]));
        fleet.tick();
        for vm in 0..2 {
            fleet.cell_decisions(vm, ("api", "acme", Priority::Bulk), 7);
            fleet.cell_decisions(vm, ("api", "globex", Priority::Critical), 3);
            fleet.admit_n(vm, "api", 2);
        }
        fleet.ticks(6);
        let mut counts: Vec<BucketCount> = fleet
            .reports(token)
            .into_iter()
            .flat_map(|r| r.buckets)
            .collect();
        let mut merged = crate::counters::BucketCounters::new(100);
        merged.merge(counts.drain(..));
        let mut cells = merged.drain();
        cells.sort_by(|a, b| (&a.tenant, a.priority).cmp(&(&b.tenant, b.priority)));
        let summary: Vec<(&str, i32, u64, u64, u64)> = cells
            .iter()
            .map(|c| {
                (
                    c.tenant.as_str(),
                    c.priority,
                    c.offered,
                    c.admitted,
                    c.shadow_dropped,
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("", Priority::Unspecified as i32, 4, 4, 0),
                ("acme", Priority::Bulk as i32, 14, 14, 14),
                ("globex", Priority::Critical as i32, 6, 6, 0),
            ]
        );
    }

    #[test]
    fn shadow_drops_predict_enforced_drops() {
        let mut fleet = Fleet::new(1);
        fleet.ticks(2);
        fleet.push_batch(batch(vec![
            Directive {
                mode: Mode::Shadow as i32,
                ..cell("shadowed", "", Priority::Unspecified, 0.3)
            },
            Directive {
                mode: Mode::Enforce as i32,
                ..cell("enforced", "", Priority::Unspecified, 0.3)
            },
        ]));
        fleet.tick();
        let n = 20_000;
        let (shadow_rejected, _) =
            fleet.cell_decisions(0, ("shadowed", "", Priority::Unspecified), n);
        let (enforce_rejected, _) =
            fleet.cell_decisions(0, ("enforced", "", Priority::Unspecified), n);
        assert_eq!(shadow_rejected, 0, "shadow never rejects");
        fleet.tick();
        let shadow = fleet
            .metric(Counter::DecisionsShadowDrop(DropReason::ClusterOverload).name())
            .unwrap();
        assert_eq!(
            fleet.metric(Counter::DecisionsDropClusterOverload.name()),
            Some(enforce_rejected as u64)
        );
        // Both are Binomial(20000, 0.3): their difference has a standard
        // deviation of about 92; allow five.
        let difference = (shadow as f64 - enforce_rejected as f64).abs();
        assert!(
            difference < 460.0,
            "shadow {shadow} vs enforce {enforce_rejected}"
        );
        assert!(
            (5_500..6_500).contains(&enforce_rejected),
            "{enforce_rejected}"
        );
    }

    #[test]
    fn the_kill_switch_and_the_canary_decide_who_enforces() {
        let mut fleet = Fleet::new(1);
        fleet.ticks(2);
        let always = vec![cell("api", "", Priority::Unspecified, 1.0)];
        let with_modes = |modes: Option<ModePolicy>| DirectiveBatch {
            modes,
            ..batch(always.clone())
        };
        let api = ("api", "", Priority::Unspecified);
        fleet.push_batch(with_modes(Some(ModePolicy {
            kill_switch: true,
            default_mode: Mode::Enforce as i32,
            canary_fraction: Some(1.0),
        })));
        fleet.tick();
        assert_eq!(fleet.cell_decisions(0, api, 10).0, 0);
        // "envoy-a" hashes to 0.276 (see modes.rs).
        fleet.push_batch(with_modes(Some(ModePolicy {
            canary_fraction: Some(0.25),
            ..Default::default()
        })));
        assert_eq!(fleet.cell_decisions(0, api, 10).0, 0, "outside the canary");
        fleet.push_batch(with_modes(Some(ModePolicy {
            canary_fraction: Some(0.3),
            ..Default::default()
        })));
        assert_eq!(fleet.cell_decisions(0, api, 10).0, 10, "inside the canary");
        fleet.push_batch(with_modes(Some(ModePolicy {
            default_mode: Mode::Shadow as i32,
            ..Default::default()
        })));
        assert_eq!(fleet.cell_decisions(0, api, 10).0, 0, "shadow by default");
        fleet.push_batch(with_modes(None));
        assert_eq!(fleet.cell_decisions(0, api, 10).0, 10, "no policy: enforce");
    }

    fn fallback_fleet(fallback: Fallback) -> Fleet {
        let mut fleet = Fleet::with_settings(
            2,
            AgentSettings {
                directive_ttl_ms: 1_000,
                fallback,
                ..settings()
            },
        );
        fleet.ticks(2);
        fleet.push_batch(batch(vec![Directive {
            reporting_proxies: 4,
            reason: Reason::TenantQuotaExceeded as i32,
            share_rps: 40.0,
            ..cell("api", "acme", Priority::Unspecified, 1.0)
        }]));
        fleet.tick();
        fleet
    }

    #[test]
    fn after_the_ttl_the_local_limit_applies_loudly_until_a_heartbeat() {
        let mut fleet = fallback_fleet(Fallback::LocalLimit);
        let acme = ("api", "acme", Priority::Unspecified);
        let (rejected, response) = fleet.cell_decisions(0, acme, 20);
        assert_eq!(rejected, 20);
        assert_eq!(
            header(&response.unwrap(), "x-ratelimit-reason"),
            Some("tenant_quota_exceeded")
        );
        fleet.ticks(10);
        assert!(fleet.vms.iter().all(|(_, a)| a.in_fallback()));
        let leader = fleet.leaders()[0];
        let entered = fleet.logs_containing("fallback local_limit applies");
        assert_eq!(
            entered.iter().filter(|(_, l)| *l == LogLevel::Warn).count(),
            1,
            "{entered:?}"
        );
        assert_eq!(
            entered
                .iter()
                .find(|(_, l)| *l == LogLevel::Warn)
                .unwrap()
                .0,
            leader
        );
        assert_eq!(fleet.metric(Gauge::FallbackActive.name()), Some(1));
        assert_eq!(fleet.metric(Counter::FallbackEntered.name()), Some(1));
        assert!(fleet.metric(Gauge::DirectiveAgeMs.name()).unwrap() > 1_000);
        // 40 rps share over 4 proxies: 10 rps for this proxy, held by one
        // worker so far; a second's burst, then nothing within the tick.
        let (rejected, response) = fleet.cell_decisions(leader, acme, 30);
        assert_eq!(rejected, 20);
        let response = response.unwrap();
        assert_eq!(
            header(&response, "x-ratelimit-reason"),
            Some("local_fallback_limit")
        );
        assert_eq!(header(&response, "x-ratelimit-limit"), Some("40"));
        // An empty heartbeat makes the table fresh again.
        fleet.push_batch(batch(vec![]));
        fleet.tick();
        assert!(fleet.vms.iter().all(|(_, a)| !a.in_fallback()));
        assert_eq!(fleet.metric(Gauge::FallbackActive.name()), Some(0));
        assert_eq!(fleet.metric(Gauge::DirectiveAgeMs.name()), Some(TICK_MS));
        assert_eq!(fleet.logs_containing("leaving the fallback").len(), 2);
        assert_eq!(fleet.cell_decisions(0, acme, 10).0, 10);
    }

    #[test]
    fn other_fallbacks_keep_the_last_directive_or_allow() {
        let acme = ("api", "acme", Priority::Unspecified);
        let mut keep = fallback_fleet(Fallback::KeepLast);
        keep.ticks(12);
        assert!(keep.vms[0].1.in_fallback());
        assert_eq!(keep.cell_decisions(0, acme, 10).0, 10);
        let mut allow = fallback_fleet(Fallback::Allow);
        allow.ticks(12);
        assert_eq!(allow.cell_decisions(0, acme, 10).0, 0);
    }

    #[test]
    fn the_batch_ttl_overrides_the_configured_one() {
        let mut fleet = fallback_fleet(Fallback::Allow);
        fleet.push_batch(DirectiveBatch {
            ttl_ms: 5_000,
            ..batch(vec![])
        });
        fleet.ticks(20);
        assert!(!fleet.vms[0].1.in_fallback());
        let meta = DirectivesMeta::decode(
            &fleet
                .process
                .borrow()
                .get(DIRECTIVES_META_KEY)
                .unwrap()
                .bytes,
        )
        .unwrap();
        assert_eq!(meta.ttl_ms, 5_000);
        fleet.ticks(40);
        assert!(fleet.vms[0].1.in_fallback());
    }

    #[test]
    fn new_buckets_get_the_configured_local_limit_until_directed() {
        let mut fleet = Fleet::with_settings(
            1,
            AgentSettings {
                new_bucket: NewBucketPolicy::LocalLimit {
                    fleet_limit_rps: 20.0,
                    expected_proxies: 2,
                },
                ..settings()
            },
        );
        fleet.ticks(2);
        let fresh = ("fresh", "t", Priority::Bulk);
        // 10 rps for this proxy: a second's burst, then nothing in the tick.
        let (rejected, response) = fleet.cell_decisions(0, fresh, 25);
        assert_eq!(rejected, 15);
        let response = response.unwrap();
        assert_eq!(
            header(&response, "x-ratelimit-reason"),
            Some("new_bucket_limit")
        );
        assert_eq!(header(&response, "x-ratelimit-limit"), Some("20"));
        fleet.tick();
        assert_eq!(
            fleet.metric(Counter::DecisionsDrop(DropReason::NewBucketLimit).name()),
            Some(15)
        );
        // Once the control plane directs the bucket, its directive rules.
        fleet.push_batch(batch(vec![cell("fresh", "", Priority::Unspecified, 0.0)]));
        assert_eq!(fleet.cell_decisions(0, fresh, 50).0, 0);
    }

    #[test]
    fn new_buckets_are_allowed_by_default() {
        let mut fleet = Fleet::new(1);
        fleet.ticks(2);
        assert_eq!(
            fleet.cell_decisions(0, ("x", "", Priority::Bulk), 1000).0,
            0
        );
    }

    /// Followers tick out of phase with the leader's report window; steady
    /// traffic must still give steady reports (the control plane divides
    /// each report's counts by its window).
    #[test]
    fn reports_of_steady_load_are_steady_whatever_the_tick_phases() {
        let mut fleet = Fleet::new(3);
        fleet.ticks(2);
        let (token, leader) = fleet.the_stream();
        let followers: Vec<usize> = (0..3).filter(|vm| *vm != leader).collect();
        // Timers drift: followers tick every 97 and 104 ms, the leader
        // every 100 ms, so a window holds two to four hand-offs.
        let periods = [97u64, 104];
        let start = fleet.now_ms;
        for ms in 1..6_000u64 {
            let now = start + ms;
            if ms % 100 == 0 {
                fleet.tick_vm_at(leader, now);
            }
            for (follower, period) in followers.iter().zip(periods) {
                if ms % period == 0 {
                    // 6 requests per 10 ms: 600 rps per follower.
                    fleet.admit_n(*follower, "steady", (6 * period / 10) as usize);
                    fleet.tick_vm_at(*follower, now);
                }
            }
        }
        let reports = fleet.reports(token);
        assert!(reports.len() >= 15, "{} reports", reports.len());
        for report in reports.iter().skip(2) {
            let offered: u64 = report.buckets.iter().map(|c| c.offered).sum();
            let rate = offered as f64 * 1000.0 / report.window_ms as f64;
            assert!(
                (rate - 1200.0).abs() < 1200.0 * 0.03,
                "rate {rate} in {report:?}"
            );
        }
        assert_eq!(fleet.vms[leader].1.workers(), 2);
        // Followers learn the worker count on their slow tick.
        assert!(followers.iter().all(|f| fleet.vms[*f].1.workers() == 2));
    }
}

#[test]
fn a_silent_stream_is_given_up_and_reopened() {
    let mut fleet = Fleet::with_settings(
        2,
        AgentSettings {
            stream_idle_timeout_ms: 2_000,
            ..settings()
        },
    );
    fleet.ticks(2);
    let (first, _) = fleet.the_stream();
    // A heartbeat every second keeps the stream, however long it lasts.
    for _ in 0..5 {
        fleet.ticks(10);
        fleet.push(1, 1, &[]);
    }
    assert_eq!(fleet.the_stream().0, first);
    // Then silence: given up once 2 s pass without a message.
    fleet.ticks(19);
    assert_eq!(fleet.the_stream().0, first, "not before the timeout");
    fleet.ticks(2);
    assert!(
        !fleet.process.borrow().streams[&first].open,
        "the silent stream is closed"
    );
    assert_eq!(
        fleet.process.borrow().metric("sluice.streams_abandoned"),
        Some(1)
    );
    // And a new one opens after the backoff, starting with a Hello.
    fleet.ticks(4);
    let (second, _) = fleet.the_stream();
    assert_ne!(first, second);
    assert!(matches!(
        fleet.sent(second)[0].kind,
        Some(proxy_message::Kind::Hello(_))
    ));
}

#[test]
fn a_reconnecting_proxy_tells_the_fleet_it_last_saw() {
    let mut fleet = Fleet::with_settings(
        2,
        AgentSettings {
            zone: "zone-a".into(),
            ..settings()
        },
    );
    fleet.ticks(2);
    let (first, vm) = fleet.the_stream();
    let Some(proxy_message::Kind::Hello(hello)) = &fleet.sent(first)[0].kind else {
        panic!("first message is not a Hello");
    };
    assert_eq!((hello.zone.as_str(), hello.known_proxies), ("zone-a", 0));
    let batch = DirectiveBatch {
        epoch: 1,
        version: 1,
        issued_at_unix_ms: fleet.now_ms,
        directives: [("acme", 3), ("other", 2)]
            .iter()
            .map(|(bucket, proxies)| Directive {
                bucket: (*bucket).into(),
                drop_ratio: 0.5,
                limit_rps: 10.0,
                reporting_proxies: *proxies,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let message = ControlMessage {
        kind: Some(control_message::Kind::Directives(batch)),
    };
    let now_ms = fleet.now_ms;
    let (host, agent) = &mut fleet.vms[vm];
    agent.on_stream_message(host, first, &message.encode_to_vec(), now_ms);
    fleet.server_closes(14);
    fleet.ticks(60);
    let (second, _) = fleet.the_stream();
    assert_ne!(first, second);
    let Some(proxy_message::Kind::Hello(hello)) = &fleet.sent(second)[0].kind else {
        panic!("first message is not a Hello");
    };
    assert_eq!((hello.zone.as_str(), hello.known_proxies), ("zone-a", 3));
}

/// A table of `(bucket, tenant, priority, drop ratio)` directives.
fn table_of(directives: &[(&str, &str, Priority, f64)]) -> DirectiveTable {
    let mut table = DirectiveTable::new(100);
    table.merge(DirectiveBatch {
        directives: directives
            .iter()
            .map(|(bucket, tenant, priority, drop_ratio)| Directive {
                bucket: (*bucket).into(),
                tenant: (*tenant).into(),
                priority: *priority as i32,
                drop_ratio: *drop_ratio,
                limit_rps: 10.0,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    table
}

#[test]
fn a_directive_arriving_mid_window_applies_to_the_next_request() {
    // The request path remembers a cell's directive lookup for the window;
    // a new table must void it at once, not at the next window.
    let mut agent = Agent::new(settings(), 7);
    for _ in 0..3 {
        assert_eq!(agent.admit("acme"), Verdict::Admit);
    }
    agent.load_directives(table_of(&[("acme", "", Priority::Unspecified, 1.0)]));
    assert_eq!(agent.admit("acme"), Verdict::Drop);
    assert_eq!(agent.admit("acme"), Verdict::Drop);
    // Another layout: the remembered index now holds another bucket's.
    agent.load_directives(table_of(&[
        ("other", "", Priority::Unspecified, 1.0),
        ("acme", "", Priority::Unspecified, 0.0),
    ]));
    assert_eq!(agent.admit("acme"), Verdict::Admit);
}

#[test]
fn a_cell_given_its_own_directive_mid_window_leaves_the_bucket_wide_one() {
    let mut agent = Agent::new(settings(), 7);
    agent.load_directives(table_of(&[("acme", "", Priority::Unspecified, 0.0)]));
    for _ in 0..3 {
        let decision = agent.admit_cell("acme", "t1", Priority::Bulk);
        assert_eq!(decision, Decision::Admit);
    }
    let mut batch_table = agent.directives().clone();
    batch_table.merge(DirectiveBatch {
        directives: vec![Directive {
            bucket: "acme".into(),
            tenant: "t1".into(),
            priority: Priority::Bulk as i32,
            drop_ratio: 1.0,
            limit_rps: 10.0,
            ..Default::default()
        }],
        ..Default::default()
    });
    agent.load_directives(batch_table);
    assert!(matches!(
        agent.admit_cell("acme", "t1", Priority::Bulk),
        Decision::Reject(_)
    ));
    // Other cells of the bucket keep the bucket-wide directive.
    assert_eq!(
        agent.admit_cell("acme", "t2", Priority::Bulk),
        Decision::Admit
    );
    // The counts are those of every request, remembered lookup or not.
    let counts = agent.local.drain();
    let t1 = counts.iter().find(|c| c.tenant == "t1").unwrap();
    assert_eq!((t1.offered, t1.admitted), (4, 3));
}
