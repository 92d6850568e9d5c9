//! Several agents sharing one fake process, driven tick by tick.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use super::*;
use crate::host::{HostError, LogLevel};
use crate::identity::ProxyIdentity;
use crate::settings::{AgentSettings, TICK_MS};
use crate::shared::DirectivesMeta;
use crate::shared::{
    COUNTS_QUEUE, DIRECTIVES_KEY, DIRECTIVES_META_KEY, LEASE_KEY, WINDOW_END_KEY, WindowEnd,
};
use crate::testing::host::{FakeHost, FakeProcess};
use prost::Message;
use sluice_core::Priority;
use sluice_core::decision::DecisionMode;
use sluice_proto::v1::{
    BucketCount, ControlMessage, Directive, DirectiveBatch, ProxyMessage, Report, control_message,
    proxy_message,
};
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

/// The plain drop-ratio path these tests compare against: coin flips, no
/// allowance (tests of the credit and the allowance set them).
fn settings() -> AgentSettings {
    AgentSettings {
        max_buckets: 100,
        decision: DecisionMode::Coin,
        allowance: None,
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
                let host = FakeProcess::host(&process, vm);
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

    /// Ticks every VM `n` times, `step_ms` apart (Envoy's directive poll),
    /// each VM at its own offset within the step as workers' timers are.
    fn ticks_every(&mut self, step_ms: u64, n: usize) {
        let vms = self.vms.len() as u64;
        for _ in 0..n {
            self.now_ms += step_ms;
            for (index, (host, agent)) in self.vms.iter_mut().enumerate() {
                agent.on_tick(host, self.now_ms + index as u64 * step_ms / vms);
            }
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
                    limit_rps: Some(1.0),
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
            .filter(|_| !self.vms[vm].1.admit(bucket).admits())
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

/// The Hello of the first stream the process opened.
fn first_hello(fleet: &Fleet) -> sluice_proto::v1::Hello {
    let process = fleet.process.borrow();
    let (_, stream) = process.streams.iter().next().expect("a stream was opened");
    match ProxyMessage::decode(stream.sent[0].as_slice())
        .unwrap()
        .kind
    {
        Some(proxy_message::Kind::Hello(hello)) => hello,
        other => panic!("first message is not a Hello: {other:?}"),
    }
}

#[test]
fn unnamed_proxies_are_named_after_their_process_in_every_vm() {
    let unnamed = AgentSettings {
        proxy_id: ProxyIdentity::PerProcess,
        ..settings()
    };
    let mut a = Fleet::with_settings(3, unnamed.clone());
    // Another Envoy: its VMs draw other seeds, as random_get gives them.
    let mut b = Fleet::with_settings(3, unnamed.clone());
    for (vm, (_, agent)) in b.vms.iter_mut().enumerate() {
        *agent = Agent::new(unnamed.clone(), 5000 + vm as u64);
    }
    a.ticks(3);
    b.ticks(3);
    let (hello_a, hello_b) = (first_hello(&a), first_hello(&b));
    assert_eq!(
        hello_a.proxy_id,
        crate::identity::process_proxy_id(hello_a.instance_id)
    );
    assert_ne!(hello_a.proxy_id, hello_b.proxy_id);
    for (_, agent) in &a.vms {
        assert_eq!(agent.proxy_name(), Some(hello_a.proxy_id.as_str()));
    }
    let warned = |fleet: &Fleet| {
        fleet
            .process
            .borrow()
            .logs
            .iter()
            .filter(|(_, level, line)| *level == LogLevel::Warn && line.contains("no proxy_id"))
            .count()
    };
    assert_eq!(warned(&a), 1, "the leader warns once");
    // A reconnect and a new leader keep the name.
    a.server_closes(14);
    a.ticks(40);
    let leader = a.leaders()[0];
    let survivors: Vec<usize> = (0..3).filter(|vm| *vm != leader).collect();
    for _ in 0..10 {
        a.tick_only(&survivors);
    }
    let open = a.process.borrow().open_streams();
    let (token, _) = *open
        .iter()
        .find(|(_, vm)| *vm != leader)
        .expect("another VM took over");
    let Some(proxy_message::Kind::Hello(hello)) = &a.sent(token)[0].kind else {
        panic!("no Hello on the new leader's stream");
    };
    assert_eq!(hello.proxy_id, hello_a.proxy_id);
    assert_eq!(hello.instance_id, hello_a.instance_id);
}

#[test]
fn a_named_proxy_keeps_its_name_and_does_not_warn() {
    let mut fleet = Fleet::new(2);
    assert_eq!(fleet.vms[1].1.proxy_name(), Some("envoy-a"));
    fleet.ticks(3);
    assert_eq!(first_hello(&fleet).proxy_id, "envoy-a");
    assert!(
        !fleet
            .process
            .borrow()
            .logs
            .iter()
            .any(|(_, _, line)| line.contains("no proxy_id"))
    );
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

/// Appends a field this build's protocol does not define: what a newer
/// control plane would send.
fn with_unknown_field(mut encoded: Vec<u8>, field: u32, value: &str) -> Vec<u8> {
    prost::encoding::string::encode(field, &value.to_owned(), &mut encoded);
    encoded
}

/// Upgrades: a control plane one minor ahead may add fields anywhere (the
/// protocol only ever adds fields); this filter ignores them and applies
/// what it knows.
#[test]
fn directives_with_fields_this_build_does_not_know_apply() {
    let mut fleet = Fleet::new(2);
    fleet.ticks(2);
    let directive = Directive {
        bucket: "acme".into(),
        drop_ratio: 1.0,
        limit_rps: Some(1.0),
        ..Default::default()
    };
    let directive = with_unknown_field(directive.encode_to_vec(), 1000, "future directive field");
    let batch = DirectiveBatch {
        epoch: 1,
        version: 1,
        ..Default::default()
    };
    let mut batch = with_unknown_field(batch.encode_to_vec(), 1001, "future batch field");
    // `repeated Directive directives = 4`, written by hand to keep the
    // unknown field inside it.
    prost::encoding::bytes::encode(4, &directive, &mut batch);
    let mut message = Vec::new();
    prost::encoding::bytes::encode(1, &batch, &mut message);
    let message = with_unknown_field(message, 1002, "future message field");
    let (token, vm) = fleet.the_stream();
    let (host, agent) = &mut fleet.vms[vm];
    agent.on_stream_message(host, token, &message, START_MS);
    fleet.tick();
    for vm in 0..2 {
        assert_eq!(
            fleet.admit_n(vm, "acme", 50),
            50,
            "vm {vm} did not apply the directive"
        );
        assert_eq!(fleet.admit_n(vm, "other", 50), 0);
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

/// With the default 20 ms poll the slow tick comes every 80 ms; a report
/// window still closes on the first tick after its 250 ms, not on the slow
/// tick at 320 ms, and no count is lost on the way.
#[test]
fn report_windows_last_the_interval_between_slow_ticks() {
    let mut fleet = Fleet::new(2);
    fleet.ticks_every(20, 10);
    let (token, _) = fleet.the_stream();
    fleet.push(1, 1, &[("acme", 1.0)]);
    fleet.ticks_every(20, 1);
    let already = fleet.reports(token).len();
    for _ in 0..100 {
        for vm in 0..2 {
            fleet.admit_n(vm, "acme", 3);
        }
        fleet.ticks_every(20, 1);
    }
    // Long enough for the followers' last hand-off and its window.
    fleet.ticks_every(20, 40);
    let reports: Vec<Report> = fleet.reports(token).into_iter().skip(already).collect();
    assert!(reports.len() >= 8, "{reports:?}");
    let windows: Vec<u64> = reports.iter().map(|r| r.window_ms).collect();
    assert!(
        windows.iter().all(|&w| (250..=260).contains(&w)),
        "{windows:?}"
    );
    assert_eq!(total(&reports, "acme"), (600, 0));
}

/// Followers hand their counts over on the short tick after the leader
/// closed a window (an idle one too), so every report leaves within two
/// short ticks of its window's end, not at the followers' next slow tick.
#[test]
fn reports_leave_within_two_short_ticks_of_their_window() {
    let mut fleet = Fleet::new(3);
    fleet.ticks_every(20, 10);
    let (token, _) = fleet.the_stream();
    fleet.push(1, 1, &[("acme", 1.0)]);
    let mut sent = fleet.reports(token).len();
    let mut closed_at = None;
    let mut delays = Vec::new();
    for tick in 0..150 {
        for vm in 0..2 {
            fleet.admit_n(vm, "acme", 2);
        }
        // VM 2 is mostly idle, so its slow ticks often have nothing to
        // hand off: the leader must not wait for it.
        if tick % 17 == 0 {
            fleet.admit_n(2, "acme", 1);
        }
        fleet.ticks_every(20, 1);
        let end = fleet.process.borrow().get(WINDOW_END_KEY);
        if let Some(WindowEnd(end_ms)) = end.and_then(|v| WindowEnd::decode(&v.bytes))
            && closed_at != Some(end_ms)
        {
            closed_at = Some(end_ms);
        }
        let now_sent = fleet.reports(token).len();
        if now_sent > sent {
            delays.push(fleet.now_ms - closed_at.unwrap_or(0));
            sent = now_sent;
        }
    }
    assert!(delays.len() >= 10, "{delays:?}");
    assert!(delays.iter().all(|&d| d <= 40), "{delays:?}");
}

/// Every VM follows one admitted request in `upstream_sample_every` to its
/// response; followers hand the signals to the leader with their counts
/// and the leader reports the process's sum per bucket.
#[test]
fn reports_carry_the_upstream_signals_of_every_vm() {
    let mut fleet = Fleet::with_settings(
        2,
        AgentSettings {
            upstream_sample_every: 2,
            ..settings()
        },
    );
    fleet.ticks(2);
    let (token, _) = fleet.the_stream();
    for vm in 0..2 {
        for n in 0..10u32 {
            let (_, agent) = &mut fleet.vms[vm];
            assert!(agent.admit("acme").admits());
            if let Some(bucket) = agent.follow_response() {
                assert_eq!(bucket, "acme");
                // Every other followed response is a 503 after 80 ms.
                let (status, latency_us) = if n % 4 == 1 {
                    (503, 80_000)
                } else {
                    (200, 2_000)
                };
                agent.observe_response(&bucket, status, Some(latency_us));
            }
        }
    }
    fleet.ticks(5);
    let signals: Vec<_> = fleet
        .reports(token)
        .into_iter()
        .flat_map(|r| r.upstream)
        .collect();
    let responses: u64 = signals.iter().map(|s| s.responses).sum();
    let errors: u64 = signals.iter().map(|s| s.errors).sum();
    assert_eq!(responses, 10, "one in two of 20 admitted requests");
    assert_eq!(errors, 6, "{signals:?}");
    let mut latency = sluice_core::histogram::LatencyHistogram::default();
    for signal in &signals {
        assert_eq!(signal.bucket, "acme");
        latency.merge_wire(&signal.latency);
    }
    assert_eq!(latency.count(), 10);
    let p99 = latency.quantile_us(0.99).unwrap();
    assert!((80_000.0..=80_000.0 * 1.19).contains(&p99), "{p99}");
    // A dropped request is never followed; with 0 nothing is.
    let mut off = Agent::new(
        AgentSettings {
            upstream_sample_every: 0,
            ..settings()
        },
        7,
    );
    off.admit("acme");
    assert_eq!(off.follow_response(), None);
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
        // Unlimited cells leave a quarter of max_buckets to limited ones.
        assert_eq!(
            fleet.vms[vm].1.path.cells.len(),
            crate::request::cell_table::unlimited_cap(3)
        );
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
                limit_rps: Some(1.0),
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

mod metrics;

mod cells;

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
                limit_rps: Some(10.0),
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
                limit_rps: Some(10.0),
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
        assert!(agent.admit("acme").admits());
    }
    agent.load_directives(table_of(&[("acme", "", Priority::Unspecified, 1.0)]));
    assert_eq!(agent.admit("acme").outcome, Outcome::Dropped);
    assert_eq!(agent.admit("acme").outcome, Outcome::Dropped);
    // Another layout: the remembered index now holds another bucket's.
    agent.load_directives(table_of(&[
        ("other", "", Priority::Unspecified, 1.0),
        ("acme", "", Priority::Unspecified, 0.0),
    ]));
    assert!(agent.admit("acme").admits());
}

#[test]
fn a_cell_given_its_own_directive_mid_window_leaves_the_bucket_wide_one() {
    let mut agent = Agent::new(settings(), 7);
    agent.load_directives(table_of(&[("acme", "", Priority::Unspecified, 0.0)]));
    for _ in 0..3 {
        let decision = agent.admit_cell("acme", "t1", Priority::Bulk);
        assert!(decision.admits());
    }
    let mut batch_table = agent.directives().clone();
    batch_table.merge(DirectiveBatch {
        directives: vec![Directive {
            bucket: "acme".into(),
            tenant: "t1".into(),
            priority: Priority::Bulk as i32,
            drop_ratio: 1.0,
            limit_rps: Some(10.0),
            ..Default::default()
        }],
        ..Default::default()
    });
    agent.load_directives(batch_table);
    assert_eq!(
        agent.admit_cell("acme", "t1", Priority::Bulk).outcome,
        Outcome::Dropped
    );
    // Other cells of the bucket keep the bucket-wide directive.
    assert!(agent.admit_cell("acme", "t2", Priority::Bulk).admits());
    // The counts are those of every request, remembered lookup or not.
    let counts = agent.path.cells.drain();
    let t1 = counts.iter().find(|c| c.tenant == "t1").unwrap();
    assert_eq!((t1.offered, t1.admitted), (4, 3));
}
