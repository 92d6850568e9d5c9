//! The 429 contract: why a request is dropped and the response it gets.
//!
//! Responses are rendered once per cell when a directive (or a local limit)
//! is applied, never per request, so rejecting costs a lookup and the host
//! call that sends the prepared bytes.
//!
//! A rejected request gets:
//! - `retry-after: S` and `x-ratelimit-reset: S`, S = the directive's
//!   `retry_after_ms` rounded up to whole seconds, else the configured
//!   `retry_after_seconds`;
//! - `x-ratelimit-limit` (the cell's `share_rps`, else the bucket's
//!   `limit_rps`), `x-ratelimit-remaining: 0` and the reason header
//!   (`x-ratelimit-reason` by default), unless the X- headers are switched
//!   off (the reason header stays: operators name it);
//! - the IETF fields of draft-ietf-httpapi-ratelimit-headers:
//!   `ratelimit-policy: "<policy>";q=<quota>;w=<window s>` and
//!   `ratelimit: "<policy>";r=0;t=<S>`;
//! - an RFC 9457 `application/problem+json` body with `type`, `title`,
//!   `status`, `detail`, `bucket`, `tenant`, `retry_after_seconds` and
//!   `reason`.
//!
//! Under a cost budget (the directive's `cost_unit`, over its
//! `budget_period_s` P) the limit is stated in the unit over the period:
//! `x-ratelimit-limit: <share × P>` and
//! `ratelimit-policy: "<policy>";q=<share × P>;w=<P>;qu="<unit>"`. The wait
//! is the time until the request's estimate fits at the cell's share
//! (`estimate × k / share` seconds, k the directive's `charge_factor`: the
//! charged cost of one unit of estimate), never less than the directive's and at
//! most [`MAX_COST_RETRY_SECONDS`]. To keep formatting off the request
//! path a cost cell's 429 is rendered in a few variants
//! ([`BudgetResponses`]), waits of 1, 2, 4, 8, 16 and 30 seconds from the
//! directive's up, and a request takes the shortest that covers its
//! estimate.

use sluice_core::DropReason;
use std::sync::Arc;

/// The longest wait a cost budget's 429 names: the control plane's longest
/// `retry_after_ms`.
pub const MAX_COST_RETRY_SECONDS: u64 = 30;

/// The waits a cost cell's 429 is rendered with, in seconds: powers of two
/// up to [`MAX_COST_RETRY_SECONDS`], so a request is told at most twice
/// the wait its estimate needs.
const COST_RETRY_STEPS: [u64; 6] = [1, 2, 4, 8, 16, MAX_COST_RETRY_SECONDS];

/// The sentence a 429's body gives for `reason`.
fn detail(reason: DropReason) -> &'static str {
    match reason {
        DropReason::ClusterOverload => "The service is over its request limit; retry later.",
        DropReason::TenantQuotaExceeded => {
            "Your tenant is sending more than its share of the limit; retry later."
        }
        DropReason::PriorityShed => {
            "Requests of this priority are being shed to protect more important traffic."
        }
        DropReason::FallbackLimit => {
            "The rate limiter is running on its local fallback limit; retry later."
        }
        DropReason::NewBucketLimit => "This client is over the limit for new buckets; retry later.",
    }
}

/// How responses are rendered; from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseSettings {
    /// Header carrying the reason (lower case).
    pub reason_header: String,
    /// Whether to send `x-ratelimit-limit/-remaining/-reset`.
    pub x_ratelimit_headers: bool,
    /// Whether to send the IETF `ratelimit-policy` and `ratelimit` fields.
    pub ietf_headers: bool,
    /// Policy name in the IETF fields.
    pub policy_name: String,
    /// `Retry-After` when a directive gives none.
    pub default_retry_after_seconds: u32,
}

impl Default for ResponseSettings {
    fn default() -> Self {
        Self {
            reason_header: "x-ratelimit-reason".into(),
            x_ratelimit_headers: true,
            ietf_headers: true,
            policy_name: "sluice".into(),
            default_retry_after_seconds: 1,
        }
    }
}

/// A rendered 429: header pairs and body, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectResponse {
    /// Header (name, value) pairs, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The problem+json body.
    pub body: Vec<u8>,
}

/// What a rejection says about its cell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RejectFacts<'a> {
    /// Bucket of the cell.
    pub bucket: &'a str,
    /// Tenant of the cell (empty: none).
    pub tenant: &'a str,
    /// Why.
    pub reason: DropReason,
    /// The limit to state, requests per second (0: unknown).
    pub limit_rps: f64,
    /// The directive's retry hint in ms (0: the configured default).
    pub retry_after_ms: u64,
    /// The cost budget the limit is in (`None`: requests per second).
    pub budget: Option<BudgetFacts<'a>>,
}

/// The unit and period of a cost budget, as its 429 states them, and what
/// one unit of estimate is charged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetFacts<'a> {
    /// The cost unit (`tokens`).
    pub unit: &'a str,
    /// The period the budget was configured over, seconds (at least 1).
    pub period_s: u64,
    /// The charged cost of one unit of estimate (positive, finite): an
    /// estimate `e` needs `e × charge_factor` of the stated rate.
    pub charge_factor: f64,
}

/// The 429s of a cost cell, one per wait: a request of estimate `e` takes
/// the first whose `fits` is at least `e`, else the last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetResponses {
    /// (the largest estimate the wait covers, the response), by wait.
    variants: Box<[(u64, Arc<RejectResponse>)]>,
}

impl BudgetResponses {
    /// The response for a request of estimate `estimate`; `None` only when
    /// there are no variants.
    #[inline]
    pub fn for_estimate(&self, estimate: u64) -> Option<&Arc<RejectResponse>> {
        self.variants
            .iter()
            .find(|(fits, _)| estimate <= *fits)
            .or_else(|| self.variants.last())
            .map(|(_, response)| response)
    }
}

impl ResponseSettings {
    /// Seconds a client should wait: `retry_after_ms` rounded up, else the
    /// default; at least 1.
    pub fn retry_after_seconds(&self, retry_after_ms: u64) -> u64 {
        if retry_after_ms == 0 {
            u64::from(self.default_retry_after_seconds).max(1)
        } else {
            retry_after_ms.div_ceil(1000).max(1)
        }
    }

    /// Renders the response of a cell.
    pub fn render(&self, facts: &RejectFacts<'_>) -> RejectResponse {
        self.render_waiting(facts, self.retry_after_seconds(facts.retry_after_ms))
    }

    /// Renders the variants of a cost cell's response ([`BudgetResponses`]):
    /// waits from the directive's (or the default) up to
    /// [`MAX_COST_RETRY_SECONDS`], each covering the estimates that fit in
    /// it at `facts.limit_rps` (in estimates: over the budget's charge
    /// factor). Without a known rate, the one wait.
    pub fn render_budget(&self, facts: &RejectFacts<'_>) -> BudgetResponses {
        let base = self.retry_after_seconds(facts.retry_after_ms);
        let rate = match facts.budget {
            Some(budget) => facts.limit_rps / budget.charge_factor,
            None => facts.limit_rps,
        };
        let known = rate.is_finite() && rate > 0.0;
        let waits = std::iter::once(base).chain(
            COST_RETRY_STEPS
                .into_iter()
                .filter(|wait| known && *wait > base),
        );
        let variants = waits
            .map(|wait| {
                // Saturating: a rate of 1e300 covers every estimate.
                let fits = (wait as f64 * rate).floor() as u64;
                (fits, Arc::new(self.render_waiting(facts, wait)))
            })
            .collect();
        BudgetResponses { variants }
    }

    /// Renders the response of a cell telling the client to wait `seconds`.
    fn render_waiting(&self, facts: &RejectFacts<'_>, seconds: u64) -> RejectResponse {
        let seconds_text = seconds.to_string();
        let mut headers = vec![("retry-after".to_owned(), seconds_text.clone())];
        let stated = match facts.budget {
            Some(budget) => facts.limit_rps * budget.period_s as f64,
            None => facts.limit_rps,
        };
        if self.x_ratelimit_headers {
            headers.push(("x-ratelimit-limit".into(), format_limit(stated)));
            headers.push(("x-ratelimit-remaining".into(), "0".into()));
            headers.push(("x-ratelimit-reset".into(), seconds_text.clone()));
        }
        headers.push((self.reason_header.clone(), facts.reason.name().into()));
        if self.ietf_headers {
            let policy = sf_string(&self.policy_name);
            match facts.budget {
                Some(budget) if stated > 0.0 && stated.is_finite() => {
                    // A budget below one unit over its period states one.
                    let quota = (stated.round() as u64).max(1);
                    headers.push((
                        "ratelimit-policy".into(),
                        format!(
                            "{policy};q={quota};w={};qu={}",
                            budget.period_s,
                            sf_string(budget.unit)
                        ),
                    ));
                }
                None if facts.limit_rps > 0.0 && facts.limit_rps.is_finite() => {
                    let (quota, window) = quota_and_window(facts.limit_rps);
                    headers.push((
                        "ratelimit-policy".into(),
                        format!("{policy};q={quota};w={window}"),
                    ));
                }
                _ => {}
            }
            headers.push(("ratelimit".into(), format!("{policy};r=0;t={seconds_text}")));
        }
        headers.push(("content-type".into(), "application/problem+json".into()));
        let body = serde_json::json!({
            "type": format!("urn:sluice:problem:{}", facts.reason.name()),
            "title": "Too Many Requests",
            "status": 429,
            "detail": detail(facts.reason),
            "reason": facts.reason.name(),
            "bucket": facts.bucket,
            "tenant": facts.tenant,
            "retry_after_seconds": seconds,
        });
        RejectResponse {
            headers,
            body: body.to_string().into_bytes(),
        }
    }
}

/// A limit in requests per second as an integer when it is at least 1, else
/// with up to three decimals.
fn format_limit(rps: f64) -> String {
    if !rps.is_finite() || rps <= 0.0 {
        return "0".into();
    }
    if rps >= 1.0 {
        return format!("{}", rps.round() as u64);
    }
    let text = format!("{rps:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A rate as the IETF quota over a window: `q` per `w` seconds, integers;
/// below one request per second the window stretches instead.
fn quota_and_window(rps: f64) -> (u64, u64) {
    if rps >= 1.0 {
        (rps.round() as u64, 1)
    } else {
        (1, (1.0 / rps).round().clamp(1.0, 86_400.0) as u64)
    }
}

/// A Structured Field String: quoted, `"` and `\` escaped, characters
/// outside printable ASCII dropped.
fn sf_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
impl RejectResponse {
    /// The value of header `name`, for assertions.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn facts(reason: DropReason, limit_rps: f64, retry_after_ms: u64) -> RejectFacts<'static> {
        RejectFacts {
            bucket: "acme/\"api\"",
            tenant: "t1",
            reason,
            limit_rps,
            retry_after_ms,
            budget: None,
        }
    }

    /// 20,000 tokens a second over a minute, its streams charged
    /// `charge_factor` tokens for each estimated one.
    fn per_minute(charge_factor: f64, retry_after_ms: u64) -> RejectFacts<'static> {
        RejectFacts {
            budget: Some(BudgetFacts {
                unit: "tokens",
                period_s: 60,
                charge_factor,
            }),
            ..facts(DropReason::TenantQuotaExceeded, 20_000.0, retry_after_ms)
        }
    }

    #[test]
    fn a_cost_budget_states_its_unit_and_period_and_waits_for_the_estimate() {
        let settings = ResponseSettings::default();
        // 20,000 tokens a second over a minute: 1,200,000 per 60 s; the
        // directive's wait is 1.5 s, so 2 s.
        let minute = per_minute(1.0, 1_500);
        let variants = settings.render_budget(&minute);
        let waits: Vec<(u64, &str)> = variants
            .variants
            .iter()
            .map(|(fits, response)| (*fits, response.header("retry-after").unwrap()))
            .collect();
        assert_eq!(
            waits,
            [
                (40_000, "2"),
                (80_000, "4"),
                (160_000, "8"),
                (320_000, "16"),
                (600_000, "30")
            ]
        );
        for (estimate, wait) in [
            (0, "2"),
            (40_000, "2"),
            (40_001, "4"),
            (500_000, "30"),
            (u64::MAX, "30"),
        ] {
            let response = variants.for_estimate(estimate).unwrap();
            assert_eq!(response.header("retry-after"), Some(wait), "{estimate}");
            assert_eq!(response.header("x-ratelimit-reset"), Some(wait));
            assert_eq!(
                response.header("ratelimit"),
                Some(format!("\"sluice\";r=0;t={wait}").as_str())
            );
            assert_eq!(response.header("x-ratelimit-limit"), Some("1200000"));
            assert_eq!(
                response.header("ratelimit-policy"),
                Some("\"sluice\";q=1200000;w=60;qu=\"tokens\"")
            );
            let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
            assert_eq!(body["retry_after_seconds"].to_string(), wait);
        }
        // A share of 0.01 tokens a second over an hour: q=36; an unknown
        // rate has the one wait; a blocked cell states no policy.
        let slow = RejectFacts {
            budget: Some(BudgetFacts {
                unit: "tokens",
                period_s: 3_600,
                charge_factor: 1.0,
            }),
            ..facts(DropReason::ClusterOverload, 0.01, 0)
        };
        let response = settings.render(&slow);
        assert_eq!(
            response.header("ratelimit-policy"),
            Some("\"sluice\";q=36;w=3600;qu=\"tokens\"")
        );
        assert_eq!(response.header("x-ratelimit-limit"), Some("36"));
        let blocked = RejectFacts {
            limit_rps: 0.0,
            ..slow
        };
        let variants = settings.render_budget(&blocked);
        assert_eq!(variants.variants.len(), 1);
        let response = variants.for_estimate(5_000).unwrap();
        assert_eq!(response.header("ratelimit-policy"), None);
        assert_eq!(response.header("retry-after"), Some("1"));
        // A directive's wait beyond the steps is kept as the only one.
        let long = RejectFacts {
            retry_after_ms: 45_000,
            ..minute
        };
        let variants = settings.render_budget(&long);
        assert_eq!(variants.variants.len(), 1);
        assert_eq!(
            variants.for_estimate(1).unwrap().header("retry-after"),
            Some("45")
        );
    }

    #[test]
    fn a_cost_budget_s_wait_counts_each_estimate_at_what_it_is_charged() {
        // Streams charged 4 tokens for each estimated: an estimate of
        // 10,000 takes 40,000 of the share's 20,000 a second, 2 s (where
        // taken at its word it would fit in 1 s). The limit is still told
        // in charged tokens.
        let settings = ResponseSettings::default();
        let variants = settings.render_budget(&per_minute(4.0, 0));
        for (estimate, wait) in [(5_000, "1"), (10_000, "2"), (10_001, "4"), (40_000, "8")] {
            let response = variants.for_estimate(estimate).unwrap();
            assert_eq!(response.header("retry-after"), Some(wait), "{estimate}");
            assert_eq!(response.header("x-ratelimit-limit"), Some("1200000"));
        }
    }

    #[test]
    fn full_contract() {
        let settings = ResponseSettings::default();
        let response = settings.render(&facts(DropReason::TenantQuotaExceeded, 200.0, 1500));
        assert_eq!(response.header("retry-after"), Some("2"));
        assert_eq!(response.header("x-ratelimit-reset"), Some("2"));
        assert_eq!(response.header("x-ratelimit-limit"), Some("200"));
        assert_eq!(response.header("x-ratelimit-remaining"), Some("0"));
        assert_eq!(
            response.header("x-ratelimit-reason"),
            Some("tenant_quota_exceeded")
        );
        assert_eq!(
            response.header("ratelimit-policy"),
            Some("\"sluice\";q=200;w=1")
        );
        assert_eq!(response.header("ratelimit"), Some("\"sluice\";r=0;t=2"));
        assert_eq!(
            response.header("content-type"),
            Some("application/problem+json")
        );
        let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(body["status"], 429);
        assert_eq!(body["title"], "Too Many Requests");
        assert_eq!(body["type"], "urn:sluice:problem:tenant_quota_exceeded");
        assert_eq!(body["bucket"], "acme/\"api\"");
        assert_eq!(body["tenant"], "t1");
        assert_eq!(body["retry_after_seconds"], 2);
        assert!(body["detail"].as_str().unwrap().contains("share"));
    }

    #[test]
    fn defaults_and_switches() {
        let settings = ResponseSettings {
            reason_header: "x-shed-why".into(),
            x_ratelimit_headers: false,
            ietf_headers: false,
            policy_name: "p".into(),
            default_retry_after_seconds: 7,
        };
        let response = settings.render(&facts(DropReason::NewBucketLimit, 0.0, 0));
        assert_eq!(response.header("retry-after"), Some("7"));
        assert_eq!(response.header("x-shed-why"), Some("new_bucket_limit"));
        assert_eq!(response.header("x-ratelimit-limit"), None);
        assert_eq!(response.header("ratelimit"), None);
    }

    #[test]
    fn limits_and_windows() {
        assert_eq!(format_limit(0.5), "0.5");
        assert_eq!(format_limit(33.4), "33");
        assert_eq!(format_limit(f64::NAN), "0");
        assert_eq!(quota_and_window(0.25), (1, 4));
        assert_eq!(quota_and_window(12.6), (13, 1));
        assert_eq!(sf_string("a\"b\\c\u{1}"), "\"a\\\"b\\\\c\"");
        let settings = ResponseSettings::default();
        assert_eq!(settings.retry_after_seconds(1), 1);
        assert_eq!(settings.retry_after_seconds(1000), 1);
        assert_eq!(settings.retry_after_seconds(1001), 2);
    }
}
