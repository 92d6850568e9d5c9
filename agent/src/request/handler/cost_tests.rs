//! Costed requests through the handler: the estimate counted before the
//! decision, the charge at the stream's end from each source in order.

use super::*;
use crate::config::FilterConfig;
use crate::directives::DirectiveTable;
use crate::identity::ProxyIdentity;
use crate::metrics::Counter;
use crate::testing::request::FakeRequest;
use crate::usage::ChargeSource;
use sluice_core::Priority;
use sluice_core::decision::DecisionMode;
use sluice_core::regime::{Fallback, Regime};
use sluice_proto::v1::{BucketCount, Directive, DirectiveBatch};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const RULES: &str = r#", "cost_rules": [
    {"bucket": "llm", "cost": {"estimate": {"source": "request_header", "name": "x-estimate", "default": 100}},
     "actual": {"metadata": {"namespace": "io.envoy.ai_gateway", "key": "llm_total_token"},
                "response_header": "x-usage", "response_trailer": "x-usage-trailer"}},
    {"bucket": "sized", "cost": {"estimate": {"source": "request_size", "base": 10, "per_byte": 0.25}}}
]"#;

fn configured() -> (Agent, RequestPolicy) {
    let json = format!(r#"{{"control_plane_cluster": "cp"{RULES}}}"#);
    let parts = FilterConfig::from_json(json.as_bytes())
        .unwrap()
        .into_parts(|| ProxyIdentity::Named("p".into()), String::new);
    (Agent::new(parts.agent, 7), parts.request)
}

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

fn request(authority: &'static str, estimate: &'static str) -> FakeRequest {
    FakeRequest::with_headers(&[(":authority", authority), ("x-estimate", estimate)])
}

fn drained(agent: &mut Agent, bucket: &str) -> BucketCount {
    agent
        .path
        .cells
        .drain()
        .into_iter()
        .find(|count| count.bucket == bucket)
        .unwrap_or_default()
}

/// Decides `request`, feeds `body`, ends the stream: the charge counted.
fn run(
    agent: &mut Agent,
    policy: &RequestPolicy,
    request: &mut FakeRequest,
    body: &[u8],
) -> Option<Charge> {
    let mut charge = None;
    let _ = decide(agent, policy, request, &mut None, &mut charge);
    response_body(&mut charge, body, true);
    let settled = stream_end(policy, request, charge?)?;
    let charged = settled.charge();
    settled.count(agent);
    Some(charged)
}

const OPENAI: &[u8] =
    b"{\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":37,\"total_tokens\":157}}";

#[test]
fn the_estimate_is_counted_before_the_decision_and_a_drop_is_charged_nothing() {
    let (mut agent, policy) = configured();
    directed(&mut agent, "llm", 1.0);
    let mut dropped = request("llm", "300");
    let mut charge = None;
    let rejection = decide(&mut agent, &policy, &mut dropped, &mut None, &mut charge);
    assert!(rejection.is_some());
    assert!(charge.is_none(), "a dropped request is charged nothing");
    let count = drained(&mut agent, "llm");
    assert_eq!(
        (
            count.offered,
            count.offered_cost,
            count.admitted_cost,
            count.charged_cost
        ),
        (1, 300.0, 0.0, 0.0)
    );
    // Admitted: offered and admitted cost, and a charge at its end.
    directed(&mut agent, "llm", 0.0);
    let mut admitted = request("llm", "300");
    admitted.status = Some(b"200");
    let charged = run(&mut agent, &policy, &mut admitted, OPENAI).unwrap();
    assert_eq!(
        charged,
        Charge {
            cost: 157,
            source: ChargeSource::Body
        }
    );
    let count = drained(&mut agent, "llm");
    assert_eq!(
        (count.offered_cost, count.admitted_cost, count.charged_cost),
        (300.0, 300.0, 157.0)
    );
}

#[test]
fn the_charge_comes_from_the_first_source_that_has_one() {
    let (mut agent, policy) = configured();
    let mut all = request("llm", "300");
    all.status = Some(b"200");
    all.metadata
        .insert(("io.envoy.ai_gateway", "llm_total_token"), 11.0);
    all.response_headers.insert("x-usage", "22");
    all.response_trailers.insert("x-usage-trailer", "33");
    let source = |request: &mut FakeRequest, agent: &mut Agent| {
        run(agent, &policy, request, OPENAI).unwrap()
    };
    assert_eq!(
        source(&mut all, &mut agent),
        Charge {
            cost: 11,
            source: ChargeSource::Metadata
        }
    );
    all.metadata.clear();
    assert_eq!(
        source(&mut all, &mut agent),
        Charge {
            cost: 22,
            source: ChargeSource::Header
        }
    );
    // A header that is no number is skipped.
    all.response_headers.insert("x-usage", "many");
    assert_eq!(
        source(&mut all, &mut agent),
        Charge {
            cost: 33,
            source: ChargeSource::Trailer
        }
    );
    all.response_trailers.clear();
    assert_eq!(
        source(&mut all, &mut agent),
        Charge {
            cost: 157,
            source: ChargeSource::Body
        }
    );
    let mut no_usage = request("llm", "300");
    no_usage.status = Some(b"200");
    let charged = run(
        &mut agent,
        &policy,
        &mut no_usage,
        b"data: {\"choices\":[]}\n\n",
    )
    .unwrap();
    assert_eq!(
        charged,
        Charge {
            cost: 300,
            source: ChargeSource::Estimate
        }
    );
    assert_eq!(
        agent
            .metrics()
            .pending(Counter::CostCharged(ChargeSource::Metadata)),
        11
    );
    assert_eq!(
        agent
            .metrics()
            .pending(Counter::Charges(ChargeSource::Body)),
        1
    );
    assert_eq!(
        agent
            .metrics()
            .pending(Counter::CostCharged(ChargeSource::Estimate)),
        300
    );
    assert_eq!(
        drained(&mut agent, "llm").charged_cost,
        (11 + 22 + 33 + 157 + 300) as f64
    );
}

#[test]
fn a_stream_cut_before_its_end_is_charged_its_estimate() {
    let (mut agent, policy) = configured();
    let mut cut = request("llm", "250");
    cut.status = Some(b"200");
    let mut charge = None;
    let _ = decide(&mut agent, &policy, &mut cut, &mut None, &mut charge);
    // Anthropic's first event carries a usage: not what a cut stream costs.
    response_body(
        &mut charge,
        b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n",
        false,
    );
    let settled = stream_end(&policy, &cut, charge.unwrap()).unwrap();
    assert_eq!(
        settled.charge(),
        Charge {
            cost: 250,
            source: ChargeSource::Estimate
        }
    );
    // The same stream ended by its trailers is charged its usage.
    let mut charge = None;
    let _ = decide(&mut agent, &policy, &mut cut, &mut None, &mut charge);
    response_body(&mut charge, OPENAI, false);
    response_trailers(&mut charge);
    let settled = stream_end(&policy, &cut, charge.unwrap()).unwrap();
    assert_eq!(
        settled.charge(),
        Charge {
            cost: 157,
            source: ChargeSource::Body
        }
    );
}

#[test]
fn a_stream_without_a_2xx_response_is_charged_its_estimate() {
    let (mut agent, policy) = configured();
    // Aborted before its response: no status at all.
    let mut aborted = request("llm", "250");
    let charged = run(
        &mut agent,
        &policy,
        &mut aborted,
        b"data: {\"choices\":[{\"delta\":",
    )
    .unwrap();
    assert_eq!(
        charged,
        Charge {
            cost: 250,
            source: ChargeSource::Estimate
        }
    );
    // An error answer, even one with a usage header.
    let mut failed = request("llm", "250");
    failed.status = Some(b"503");
    failed.response_headers.insert("x-usage", "5");
    let charged = run(&mut agent, &policy, &mut failed, OPENAI).unwrap();
    assert_eq!(charged.source, ChargeSource::Estimate);
    assert_eq!(drained(&mut agent, "llm").charged_cost, 500.0);
}

#[test]
fn estimates_read_the_configured_header_or_the_size_and_other_buckets_have_none() {
    let (mut agent, policy) = configured();
    let mut sized =
        FakeRequest::with_headers(&[(":authority", "sized"), ("content-length", "400")]);
    let mut charge = None;
    let _ = decide(&mut agent, &policy, &mut sized, &mut None, &mut charge);
    assert_eq!(charge.as_ref().map(PendingCharge::estimate), Some(110));
    // The default when the header is missing.
    let mut plain = FakeRequest::with_headers(&[(":authority", "llm")]);
    let _ = decide(&mut agent, &policy, &mut plain, &mut None, &mut charge);
    assert_eq!(charge.as_ref().map(PendingCharge::estimate), Some(100));
    // No rule: no charge, no cost counted.
    let mut web = FakeRequest::with_headers(&[(":authority", "web")]);
    let mut none = None;
    let _ = decide(&mut agent, &policy, &mut web, &mut None, &mut none);
    assert!(none.is_none());
    let count = drained(&mut agent, "web");
    assert_eq!((count.offered, count.offered_cost), (1, 0.0));
}

#[test]
fn a_charge_after_the_drain_is_reported_in_the_next_window() {
    let (mut agent, policy) = configured();
    let mut admitted = request("llm", "40");
    admitted.status = Some(b"200");
    let mut charge = None;
    let _ = decide(&mut agent, &policy, &mut admitted, &mut None, &mut charge);
    // The window closes while the stream runs.
    assert_eq!(drained(&mut agent, "llm").offered_cost, 40.0);
    let settled = stream_end(&policy, &admitted, charge.unwrap()).unwrap();
    settled.count(&mut agent);
    let count = drained(&mut agent, "llm");
    assert_eq!((count.offered, count.charged_cost), (0, 40.0));
}

/// A directive of `drop_ratio` on `bucket`, a cost budget in `unit` when
/// one is given; the cell is then paced (its credit made on a tick).
fn paced_directive(
    agent: &mut Agent,
    policy: &RequestPolicy,
    bucket: &'static str,
    drop_ratio: f64,
    unit: &str,
) {
    paced_capped_directive(agent, policy, bucket, drop_ratio, unit, 0);
}

/// [`paced_directive`] with an estimate cap (0: none).
fn paced_capped_directive(
    agent: &mut Agent,
    policy: &RequestPolicy,
    bucket: &'static str,
    drop_ratio: f64,
    unit: &str,
    estimate_cap: u64,
) {
    let mut table = DirectiveTable::new(100);
    table.merge(DirectiveBatch {
        version: 4,
        directives: vec![Directive {
            bucket: bucket.into(),
            priority: Priority::Unspecified as i32,
            drop_ratio,
            limit_rps: Some(1_000_000.0),
            cost_unit: unit.into(),
            budget_period_s: 60,
            estimate_cap,
            ..Default::default()
        }],
        ..Default::default()
    });
    agent.load_directives(table);
    let _ = decide(
        agent,
        policy,
        &mut request(bucket, "1"),
        &mut None,
        &mut None,
    );
    let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(5);
    for now_ms in [1_000, 1_100] {
        agent.path.close_pacer_window(now_ms, &mut rng);
    }
}

/// Estimates repeating 3,000, 10, 10: a credit that counts requests at a
/// ratio of 2/3 admits the same position of every three.
const PERIODIC: [&str; 3] = ["3000", "10", "10"];

/// A costed request takes the coin under the credit's mode (the
/// default), so every size is admitted at the same rate: a third of the
/// estimated cost, within the coin's noise (one standard deviation is
/// about 1.4 % of it here).
#[test]
fn a_cost_directive_admits_its_share_of_the_estimated_cost() {
    let (mut agent, policy) = configured();
    assert_eq!(agent.path.pacer.mode(), DecisionMode::Credit);
    paced_directive(&mut agent, &policy, "llm", 2.0 / 3.0, "tokens");
    let (mut offered, mut admitted) = (0u64, 0u64);
    for i in 0..30_000 {
        let estimate = PERIODIC[i % 3];
        let cost: u64 = estimate.parse().unwrap();
        offered += cost;
        let rejection = decide(
            &mut agent,
            &policy,
            &mut request("llm", estimate),
            &mut None,
            &mut None,
        );
        if rejection.is_none() {
            admitted += cost;
        }
    }
    let error = admitted as f64 / (offered as f64 / 3.0) - 1.0;
    assert!(error.abs() <= 0.05, "admitted {admitted} of {offered}");
}

/// A client stating a billion tokens in the estimate's header, in a
/// bucket of 1,000,000 tokens a second: the request counts (offered and
/// admitted) and, ending without a usage, is charged ten seconds of the
/// budget at most. The controller steers on the counts: one claim
/// counted whole would shut the cell for seconds.
#[test]
fn an_estimate_beyond_ten_seconds_of_the_budget_counts_ten_seconds() {
    let (mut agent, policy) = configured();
    paced_directive(&mut agent, &policy, "llm", 0.0, "tokens");
    let _ = drained(&mut agent, "llm");
    let mut claim = request("llm", "1000000000");
    claim.status = Some(b"200");
    let charged = run(&mut agent, &policy, &mut claim, b"").unwrap();
    let ten_seconds = 10_000_000;
    assert_eq!(
        charged,
        Charge {
            cost: ten_seconds,
            source: ChargeSource::Estimate
        }
    );
    let count = drained(&mut agent, "llm");
    assert_eq!(
        (count.offered_cost, count.admitted_cost, count.charged_cost),
        (ten_seconds as f64, ten_seconds as f64, ten_seconds as f64)
    );
    // Under a limit in requests the estimate steers nothing and is
    // counted as stated.
    paced_directive(&mut agent, &policy, "llm", 0.0, "");
    let _ = drained(&mut agent, "llm");
    let charged = run(&mut agent, &policy, &mut claim, b"").unwrap();
    assert_eq!(charged.cost, 1_000_000_000);
    assert_eq!(drained(&mut agent, "llm").offered_cost, 1e9);
}

/// Under the directive's estimate cap a claim counts the cap when it is
/// decided, and weighs it. A usage reported at the stream's end adds what
/// the cap left out, up to the estimate; a usage below the count takes
/// nothing back; a stream without a usage is charged what it was counted.
#[test]
fn an_estimate_counts_up_to_the_cap_and_a_usage_beyond_it_the_rest_later() {
    let (mut agent, policy) = configured();
    paced_capped_directive(&mut agent, &policy, "llm", 0.0, "tokens", 1_000);
    let _ = drained(&mut agent, "llm");
    // Each stream's settled cost is what it was counted in all: the
    // charge is compared with it.
    let counts = |agent: &mut Agent| {
        let count = drained(agent, "llm");
        (
            count.offered_cost,
            count.admitted_cost,
            count.charged_cost,
            count.settled_cost,
        )
    };
    let ended = |estimate: &'static str, usage: Option<&'static str>| {
        let mut request = request("llm", estimate);
        request.status = Some(b"200");
        if let Some(usage) = usage {
            request.response_headers.insert("x-usage", usage);
        }
        request
    };
    // A false claim: counted the cap, its usage of 22 takes nothing back.
    let charged = run(
        &mut agent,
        &policy,
        &mut ended("1000000000", Some("22")),
        b"",
    );
    assert_eq!(charged.map(|c| c.cost), Some(22));
    assert_eq!(counts(&mut agent), (1_000.0, 1_000.0, 22.0, 1_000.0));
    // An honest heavy request: the cap now, the rest at its end.
    let _ = run(&mut agent, &policy, &mut ended("5000", Some("4000")), b"");
    assert_eq!(counts(&mut agent), (4_000.0, 4_000.0, 4_000.0, 4_000.0));
    // A usage beyond the estimate adds up to the estimate only, as an
    // uncapped estimate counts.
    let _ = run(&mut agent, &policy, &mut ended("3000", Some("9000")), b"");
    assert_eq!(counts(&mut agent), (3_000.0, 3_000.0, 9_000.0, 3_000.0));
    // Below the cap nothing changes.
    let _ = run(&mut agent, &policy, &mut ended("300", Some("900")), b"");
    assert_eq!(counts(&mut agent), (300.0, 300.0, 900.0, 300.0));
    // Without a usage: charged, and counted, the cap.
    let charged = run(&mut agent, &policy, &mut ended("1000000000", None), b"");
    assert_eq!(
        charged,
        Some(Charge {
            cost: 1_000,
            source: ChargeSource::Estimate
        })
    );
    assert_eq!(counts(&mut agent), (1_000.0, 1_000.0, 1_000.0, 1_000.0));
}

#[test]
fn a_request_limit_decides_as_if_no_request_had_an_estimate() {
    // The same agent and requests, with and without cost rules, under a
    // directive in requests: the same decisions, request for request.
    let decisions = |costed: bool| {
        let (mut agent, mut policy) = configured();
        if !costed {
            policy.costs = Default::default();
        }
        paced_directive(&mut agent, &policy, "llm", 0.6, "");
        (0..600)
            .map(|i| {
                let mut request = request("llm", PERIODIC[i % 3]);
                decide(&mut agent, &policy, &mut request, &mut None, &mut None).is_none()
            })
            .collect::<Vec<bool>>()
    };
    let with_costs = decisions(true);
    assert_eq!(with_costs, decisions(false));
    let admitted = with_costs.iter().filter(|admits| **admits).count();
    assert!((239..=241).contains(&admitted), "{admitted}");
}

/// Loads one directive for the bucket `llm` (bucket-wide).
fn llm_directive(agent: &mut Agent, directive: Directive) {
    let mut table = DirectiveTable::new(100);
    table.merge(DirectiveBatch {
        version: 5,
        directives: vec![Directive {
            bucket: "llm".into(),
            priority: Priority::Unspecified as i32,
            ..directive
        }],
        ..Default::default()
    });
    agent.load_directives(table);
}

/// A budget of 100 tokens a second, written per minute, that drops every
/// request, its streams charged `charge_factor` tokens for each estimated
/// one (0: not said).
fn shut_budget(charge_factor: f64) -> Directive {
    Directive {
        drop_ratio: 1.0,
        limit_rps: Some(100.0),
        share_rps: 100.0,
        cost_unit: "tokens".into(),
        budget_period_s: 60,
        charge_factor,
        ..Default::default()
    }
}

/// The 429 a request of `estimate` tokens to `llm` gets.
fn rejection(
    agent: &mut Agent,
    policy: &RequestPolicy,
    estimate: &'static str,
) -> Arc<RejectResponse> {
    decide(
        agent,
        policy,
        &mut request("llm", estimate),
        &mut None,
        &mut None,
    )
    .unwrap_or_else(|| panic!("{estimate} was admitted"))
}

#[test]
fn a_cost_directive_429_names_the_unit_and_waits_for_the_estimate() {
    let (mut agent, policy) = configured();
    llm_directive(&mut agent, shut_budget(0.0));
    for (estimate, wait) in [
        ("50", "1"),
        ("150", "2"),
        ("1000", "16"),
        ("99999999", "30"),
    ] {
        let rejection = rejection(&mut agent, &policy, estimate);
        assert_eq!(rejection.header("retry-after"), Some(wait), "{estimate}");
        assert_eq!(
            rejection.header("ratelimit-policy"),
            Some("\"sluice\";q=6000;w=60;qu=\"tokens\"")
        );
        assert_eq!(rejection.header("x-ratelimit-limit"), Some("6000"));
    }
}

/// A budget whose streams are charged 4 tokens for each estimated one:
/// the 429's wait counts each estimate at what it will be charged, while
/// the limit it states stays the budget's.
#[test]
fn a_cost_directive_429_waits_for_what_the_estimate_will_be_charged() {
    let (mut agent, policy) = configured();
    llm_directive(&mut agent, shut_budget(4.0));
    for (estimate, wait) in [("25", "1"), ("50", "2"), ("150", "8"), ("1000", "30")] {
        let rejection = rejection(&mut agent, &policy, estimate);
        assert_eq!(rejection.header("retry-after"), Some(wait), "{estimate}");
        assert_eq!(rejection.header("x-ratelimit-limit"), Some("6000"));
    }
}

/// Once the directives are stale, a budget's local limit (its share over
/// the reporting proxies, a second's burst) holds estimates to the
/// budget's rate over the charge factor: 1,000 charged tokens a second
/// over two proxies, each estimated token charged 4, is 125 estimated
/// tokens here, five requests of 25 at once (twenty taken at their word).
#[test]
fn a_stale_budget_limits_estimates_at_its_rate_over_the_charge_factor() {
    for (charge_factor, expected) in [(4.0, 5), (1.0, 20), (0.0, 20)] {
        let (mut agent, policy) = configured();
        llm_directive(
            &mut agent,
            Directive {
                limit_rps: Some(1_000.0),
                reporting_proxies: 2,
                cost_unit: "tokens".into(),
                charge_factor,
                ..Default::default()
            },
        );
        agent.path.rules.regime = Regime::Stale(Fallback::LocalLimit);
        let admitted = (0..40)
            .filter(|_| {
                decide(
                    &mut agent,
                    &policy,
                    &mut request("llm", "25"),
                    &mut None,
                    &mut None,
                )
                .is_none()
            })
            .count();
        assert!(
            (expected..=expected + 1).contains(&admitted),
            "factor {charge_factor}: admitted {admitted}"
        );
    }
}
