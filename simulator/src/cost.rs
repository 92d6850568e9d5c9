//! Costed requests: the filter's cost rule, the requests and responses its
//! request handler reads, and the token counts drawn for them.
//!
//! A budget scenario's proxies decide through the filter's own request
//! handler ([`sluice_agent::request::handler`]) with a cost rule: each
//! request names its estimate in a header before the decision, and its
//! response names the tokens it used in a response header that the handler
//! reads when the stream ends, one response time later. The token counts
//! are log-normal, drawn from the simulator's seeded generator.

use std::borrow::Cow;

use rand::Rng;
use rand::rngs::SmallRng;
use sluice_agent::config::{FilterConfig, RequestPolicy};
use sluice_agent::host::{HostError, Log, LogLevel};
use sluice_agent::identity::ProxyIdentity;
use sluice_agent::request::classify::RequestAttributes;
use sluice_agent::request::handler::HttpRequest;
use sluice_agent::request::reject::RejectResponse;

/// The request header naming the tenant (the filter's `tenant` key part).
pub const TENANT_HEADER: &str = "x-tenant";
/// The request header carrying the client's estimate.
pub const ESTIMATE_HEADER: &str = "x-estimated-tokens";
/// The response header carrying the tokens the response used.
pub const USAGE_HEADER: &str = "x-usage-tokens";
/// The estimate of a request without [`ESTIMATE_HEADER`].
const DEFAULT_ESTIMATE: u64 = 500;

/// The 99th percentile of the standard normal distribution.
const Z_99: f64 = 2.326_347_874;

/// Most tokens one response is drawn to use: far beyond any percentile
/// that matters, well within the cost rule's 10⁹.
const MAX_TOKENS: f64 = 1_000_000.0;

/// What a budget scenario's requests cost and how long their responses
/// take.
#[derive(Debug, Clone, PartialEq)]
pub struct CostSpec {
    /// The budget's unit, as the limits file names it.
    pub unit: String,
    /// Median tokens a response uses.
    pub median: f64,
    /// Their 99th percentile.
    pub p99: f64,
    /// From the decision to the response's first token.
    pub first_token_ms: u64,
    /// How fast a response streams its tokens.
    pub tokens_per_s: f64,
}

impl CostSpec {
    /// The log-normal's σ: `ln(p99 / median) / z₀.₉₉`.
    fn sigma(&self) -> f64 {
        if self.median > 0.0 && self.p99 > self.median {
            (self.p99 / self.median).ln() / Z_99
        } else {
            0.0
        }
    }

    /// Mean tokens per response: `median · e^(σ²/2)`.
    pub fn mean(&self) -> f64 {
        let sigma = self.sigma();
        self.median * (sigma * sigma / 2.0).exp()
    }

    /// Tokens of the next response, from `rng`: at least 1.
    pub fn draw(&self, rng: &mut SmallRng) -> u64 {
        // Box–Muller; 1 − u is in (0, 1], so its logarithm is finite.
        let radius = (-2.0 * (1.0 - uniform(rng)).ln()).sqrt();
        let normal = radius * (std::f64::consts::TAU * uniform(rng)).cos();
        let tokens = self.median * (self.sigma() * normal).exp();
        tokens.round().clamp(1.0, MAX_TOKENS) as u64
    }

    /// How long a response of `tokens` takes, from its decision to its
    /// stream's end.
    pub fn response_ms(&self, tokens: u64) -> u64 {
        let streaming = if self.tokens_per_s > 0.0 {
            (tokens as f64 * 1000.0 / self.tokens_per_s).round() as u64
        } else {
            0
        };
        self.first_token_ms + streaming
    }
}

/// Uniform in `[0, 1)` from the top 53 bits.
fn uniform(rng: &mut SmallRng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1_u64 << 53) as f64
}

/// The request side of the filter's configuration for a budget on
/// `bucket`: the bucket from `:authority`, the tenant from
/// [`TENANT_HEADER`], and a cost rule whose estimate is
/// [`ESTIMATE_HEADER`] and whose actual cost is [`USAGE_HEADER`] (no
/// metadata, no body parsing).
pub fn request_policy(bucket: &str) -> Result<RequestPolicy, String> {
    let config = format!(
        r#"{{"control_plane_cluster": "sluice-control-plane",
            "tenant": {{"source": "header", "name": "{TENANT_HEADER}"}},
            "decision_record": "off",
            "undirected_header": null,
            "cost_rules": [{{
                "bucket": "{bucket}",
                "cost": {{"estimate": {{"source": "request_header",
                    "name": "{ESTIMATE_HEADER}", "default": {DEFAULT_ESTIMATE}}}}},
                "actual": {{"metadata": null, "response_header": "{USAGE_HEADER}",
                    "body": {{"parse": false}}}}
            }}]}}"#
    );
    let parts = FilterConfig::from_json(config.as_bytes())
        .map_err(|err| err.to_string())?
        .into_parts(|| ProxyIdentity::PerProcess, String::new);
    Ok(parts.request)
}

/// A costed request as the filter's handler sees it: its headers, and at
/// its stream's end a 200 naming the tokens it used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostedRequest {
    bucket: String,
    tenant: String,
    estimate: String,
    usage: String,
}

impl CostedRequest {
    /// A request of `bucket` for `tenant` (empty: none) announcing
    /// `estimate`, whose response will use `tokens`.
    pub fn new(bucket: &str, tenant: &str, estimate: u64, tokens: u64) -> Self {
        Self {
            bucket: bucket.to_owned(),
            tenant: tenant.to_owned(),
            estimate: estimate.to_string(),
            usage: tokens.to_string(),
        }
    }
}

impl RequestAttributes for CostedRequest {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let value = match name {
            ":authority" => &self.bucket,
            TENANT_HEADER if !self.tenant.is_empty() => &self.tenant,
            ESTIMATE_HEADER => &self.estimate,
            _ => return None,
        };
        Some(Cow::Borrowed(value.as_bytes()))
    }

    fn route_name(&self) -> Option<Cow<'_, [u8]>> {
        None
    }
}

impl Log for CostedRequest {
    // Nobody reads a simulated request's logs.
    fn log(&self, _level: LogLevel, _message: &str) {}
}

impl HttpRequest for CostedRequest {
    fn set_decision_record(&mut self, _record: &str) -> Result<(), HostError> {
        Ok(())
    }

    fn add_request_header(&mut self, _name: &str, _value: &str) -> Result<(), HostError> {
        Ok(())
    }

    fn send_rejection(&mut self, _response: &RejectResponse) -> Result<(), HostError> {
        Ok(())
    }

    fn response_status(&self) -> Option<Cow<'_, [u8]>> {
        Some(Cow::Borrowed(b"200"))
    }

    fn clock_ns(&self) -> Option<u64> {
        None
    }

    fn metadata_number(&self, _namespace: &str, _key: &str) -> Option<f64> {
        None
    }

    fn response_header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        (name == USAGE_HEADER).then_some(Cow::Borrowed(self.usage.as_bytes()))
    }

    fn response_trailer(&self, _name: &str) -> Option<Cow<'_, [u8]>> {
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rand::SeedableRng;

    use super::*;

    fn tokens() -> CostSpec {
        CostSpec {
            unit: "tokens".to_owned(),
            median: 500.0,
            p99: 8_000.0,
            first_token_ms: 200,
            tokens_per_s: 1_000.0,
        }
    }

    #[test]
    fn draws_are_log_normal_with_the_given_median_and_p99() {
        let spec = tokens();
        let mut rng = SmallRng::seed_from_u64(5);
        let mut draws: Vec<u64> = (0..100_000).map(|_| spec.draw(&mut rng)).collect();
        draws.sort_unstable();
        let median = draws[50_000] as f64;
        let p99 = draws[99_000] as f64;
        assert!((median / 500.0 - 1.0).abs() < 0.03, "median {median}");
        assert!((p99 / 8_000.0 - 1.0).abs() < 0.10, "p99 {p99}");
        let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
        assert!((mean / spec.mean() - 1.0).abs() < 0.05, "mean {mean}");
        assert_eq!(spec.response_ms(500), 700);
    }

    #[test]
    fn the_handler_reads_the_estimate_and_the_usage() {
        let policy = request_policy("llm").unwrap();
        assert!(!policy.costs.is_empty());
        let request = CostedRequest::new("llm", "gold", 300, 1_234);
        assert_eq!(
            request.header(ESTIMATE_HEADER).as_deref(),
            Some(&b"300"[..])
        );
        assert_eq!(request.header(TENANT_HEADER).as_deref(), Some(&b"gold"[..]));
        assert_eq!(
            request.response_header(USAGE_HEADER).as_deref(),
            Some(&b"1234"[..])
        );
        assert!(
            CostedRequest::new("llm", "", 1, 1)
                .header(TENANT_HEADER)
                .is_none()
        );
    }
}
