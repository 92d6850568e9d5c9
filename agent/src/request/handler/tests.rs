//! The request handler's effects, host-neutral: what a decision leads to.

use super::*;
use crate::config::FilterConfig;
use crate::directives::DirectiveTable;
use crate::identity::ProxyIdentity;
use crate::testing::request::FakeRequest;
use sluice_core::Priority;
use sluice_proto::v1::{Directive, DirectiveBatch};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// An agent and its request policy from the configuration `extra` adds
/// to (the bucket is the request's authority).
fn configured(extra: &str) -> (Agent, RequestPolicy) {
    let json = format!(r#"{{"control_plane_cluster": "cp"{extra}}}"#);
    let parts = FilterConfig::from_json(json.as_bytes())
        .unwrap()
        .into_parts(|| ProxyIdentity::Named("p".into()), String::new);
    (Agent::new(parts.agent, 7), parts.request)
}

/// A fresh table with one bucket-wide directive of `drop_ratio`.
fn directed(agent: &mut Agent, bucket: &str, drop_ratio: f64) {
    let mut table = DirectiveTable::new(100);
    table.merge(DirectiveBatch {
        version: 3,
        directives: vec![Directive {
            bucket: bucket.into(),
            priority: Priority::Unspecified as i32,
            drop_ratio,
            limit_rps: Some(10.0),
            ..Default::default()
        }],
        ..Default::default()
    });
    agent.load_directives(table);
}

fn request_to(authority: &'static str) -> FakeRequest {
    FakeRequest::with_headers(&[(":authority", authority)])
}

#[test]
fn a_dropped_request_is_recorded_and_answered_with_its_429() {
    let (mut agent, policy) = configured("");
    directed(&mut agent, "acme", 1.0);
    let mut request = request_to("acme");
    let mut followed = None;
    let rejection = decide(&mut agent, &policy, &mut request, &mut followed, &mut None);
    assert_eq!(answer(&mut request, rejection), HeadersAction::Stop);
    let sent = request.rejection.unwrap();
    assert!(sent.headers.iter().any(|(name, _)| name == "retry-after"));
    let record = request.record.unwrap();
    assert!(record.contains("bucket=acme"), "{record}");
    assert!(record.contains("result=drop"), "{record}");
    assert!(request.added.is_empty());
    assert_eq!(followed, None);
}

#[test]
fn a_directed_admitted_request_passes_untouched_by_default() {
    let (mut agent, policy) = configured("");
    directed(&mut agent, "acme", 0.0);
    let mut request = request_to("acme");
    let mut followed = None;
    let rejection = decide(&mut agent, &policy, &mut request, &mut followed, &mut None);
    assert_eq!(answer(&mut request, rejection), HeadersAction::Continue);
    assert_eq!(request.record, None);
    assert!(request.added.is_empty());
    assert!(request.rejection.is_none());
}

#[test]
fn every_request_is_recorded_when_configured() {
    let (mut agent, policy) = configured(r#", "decision_record": "all""#);
    directed(&mut agent, "acme", 0.0);
    let mut request = request_to("acme");
    let rejection = decide(&mut agent, &policy, &mut request, &mut None, &mut None);
    assert_eq!(answer(&mut request, rejection), HeadersAction::Continue);
    let record = request.record.unwrap();
    assert!(record.contains("result=pass"), "{record}");
}

#[test]
fn an_undirected_admitted_request_is_flagged_upstream() {
    let (mut agent, policy) = configured("");
    let mut request = request_to("acme");
    let rejection = decide(&mut agent, &policy, &mut request, &mut None, &mut None);
    assert_eq!(answer(&mut request, rejection), HeadersAction::Continue);
    assert_eq!(
        request.added,
        vec![("x-sluice-undirected".to_owned(), "no_directives".to_owned())]
    );
    // Undirected, so recorded under the default mode too.
    assert!(request.record.unwrap().contains("source=no_directives"));

    let (mut agent, policy) = configured(r#", "undirected_header": null"#);
    let mut request = request_to("acme");
    decide(&mut agent, &policy, &mut request, &mut None, &mut None);
    assert!(request.added.is_empty());
}

#[test]
fn failed_effects_are_logged_and_a_429_that_cannot_be_sent_lets_the_request_pass() {
    let (mut agent, policy) = configured("");
    directed(&mut agent, "acme", 1.0);
    let mut request = request_to("acme");
    request.failing = true;
    let rejection = decide(&mut agent, &policy, &mut request, &mut None, &mut None);
    assert!(rejection.is_some());
    assert_eq!(answer(&mut request, rejection), HeadersAction::Continue);
    let logs = request.logs.borrow();
    assert_eq!(logs.len(), 2, "{logs:?}");
    assert!(
        logs.iter().any(|(level, line)| *level == LogLevel::Debug
            && line.starts_with("cannot record the decision"))
    );
    assert!(logs.iter().any(|(level, line)| *level == LogLevel::Warn
        && line.starts_with("cannot send 429, letting the request pass")));
}

#[test]
fn a_followed_request_brings_its_status_and_latency_to_the_signals() {
    let (mut agent, policy) = configured(r#", "upstream_sample_every": 1"#);
    directed(&mut agent, "acme", 0.0);
    let mut request = request_to("acme");
    request.clock_ns = Some(5_000_000);
    let mut followed = None;
    decide(&mut agent, &policy, &mut request, &mut followed, &mut None);
    let followed = followed.unwrap();
    assert_eq!(followed.bucket, "acme");
    assert_eq!(followed.started_ns, Some(5_000_000));
    request.clock_ns = Some(7_500_999);
    request.status = Some(b"503");
    let observed = observe_response(&followed, &request);
    // Read before the agent is at hand: a later clock does not count.
    request.clock_ns = Some(9_000_000);
    observed.count(&mut agent);
    let signals = agent.path.responses.signals.drain();
    assert_eq!(signals.len(), 1);
    let signal = signals.first().unwrap();
    assert_eq!((signal.responses, signal.errors), (1, 1));
    assert_eq!(signal.latency.iter().sum::<u32>(), 1);
}

#[test]
fn latency_needs_both_readings_and_a_clock_that_did_not_go_back() {
    let followed = |started_ns| FollowedRequest {
        bucket: "a".into(),
        started_ns,
    };
    assert_eq!(
        followed(Some(1_000)).latency_us(Some(3_001_999)),
        Some(3_000)
    );
    assert_eq!(followed(Some(1_000)).latency_us(Some(1_000)), Some(0));
    assert_eq!(followed(Some(1_000)).latency_us(Some(999)), None);
    assert_eq!(followed(None).latency_us(Some(1_000)), None);
    assert_eq!(followed(Some(1_000)).latency_us(None), None);
}
