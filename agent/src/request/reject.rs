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

use sluice_core::DropReason;

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
        let seconds = self.retry_after_seconds(facts.retry_after_ms);
        let seconds_text = seconds.to_string();
        let mut headers = vec![("retry-after".to_owned(), seconds_text.clone())];
        if self.x_ratelimit_headers {
            headers.push(("x-ratelimit-limit".into(), format_limit(facts.limit_rps)));
            headers.push(("x-ratelimit-remaining".into(), "0".into()));
            headers.push(("x-ratelimit-reset".into(), seconds_text.clone()));
        }
        headers.push((self.reason_header.clone(), facts.reason.name().into()));
        if self.ietf_headers {
            let policy = sf_string(&self.policy_name);
            if facts.limit_rps > 0.0 && facts.limit_rps.is_finite() {
                let (quota, window) = quota_and_window(facts.limit_rps);
                headers.push((
                    "ratelimit-policy".into(),
                    format!("{policy};q={quota};w={window}"),
                ));
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
