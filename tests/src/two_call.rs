//! The two-call pattern holding a token budget: Envoys with only Envoy's
//! `ratelimit` filter of `envoy/llm-tokens.yaml` (a check with
//! `hits_addend: 0` before each request, the response's tokens charged
//! when its stream ends), the control plane's rate limit service counting
//! on a real `redis-server`, and the fake LLM upstream: what
//! `bench_tokens_vs_ratelimit` sets beside a [`TokenFleet`].
//!
//! The Envoys are started as [`TokenFleet`]'s are, so the same
//! [`crate::token_fleet::TokenLoad`] drives either.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use hyper::header::HeaderName;
use serde_json::Value as Json;

use crate::fleet::{EnvoySpec, Fleet, FleetOptions, TestDir};
use crate::llm_upstream::{LlmUpstream, LlmUpstreamOptions};
use crate::redis::RedisServer;
use crate::token_fleet::{OUTPUT_TOKENS_HEADER, TokenFleet, TokenFleetOptions};

/// The Envoy configuration whose `ratelimit` filter is used.
pub const CONFIG: &str = "llm-tokens.yaml";
/// The quota file's domain (the filter's `domain` there).
pub const DOMAIN: &str = "llm";

/// The quota file: one counter of `budget_per_s` tokens a second that
/// every tenant's descriptor (`tenant` from `x-tenant`, as the config
/// sends it) shares, so the whole fleet holds one budget.
pub fn quota_yaml(budget_per_s: f64) -> String {
    format!(
        "domain: {DOMAIN}\ndescriptors:\n  - key: tenant\n    value: \"*\"\n    share_threshold: true\n    \
         rate_limit: {{unit: second, requests_per_unit: {}}}\n",
        budget_per_s.round()
    )
}

/// `envoy/llm-tokens.yaml` as the two-call pattern alone: the Sluice
/// filter taken out, the reserve-then-settle route too (the load names an
/// estimate in every request, which would pick it), the usage read from
/// `completion_tokens` instead of `total_tokens` (the output tokens the
/// token fleet's cost rule charges, so both count the same tokens), and
/// the `llm` cluster pointed at `upstream`.
pub fn envoy(name: &str, upstream: SocketAddr) -> EnvoySpec {
    EnvoySpec::repo(name, CONFIG)
        .data_plane(None)
        .log_level("warn")
        .edit_json(move |config| {
            let manager = config
                .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config")
                .context("llm-tokens.yaml: no http_connection_manager")?;
            let filters = manager
                .get_mut("http_filters")
                .and_then(Json::as_array_mut)
                .context("llm-tokens.yaml: no http_filters")?;
            let before = filters.len();
            filters.retain(|f| name_of(f) != Some("envoy.filters.http.wasm"));
            anyhow::ensure!(
                filters.len() + 1 == before,
                "llm-tokens.yaml: no Sluice wasm filter to take out"
            );
            let mut selectors = 0;
            for_each_usage_selector(manager, &mut |key| {
                *key = Json::from("completion_tokens");
                selectors += 1;
            });
            anyhow::ensure!(
                selectors == 2,
                "llm-tokens.yaml: {selectors} usage selectors, expected 2 (SSE and JSON)"
            );
            let routes = manager
                .pointer_mut("/route_config/virtual_hosts/0/routes")
                .and_then(Json::as_array_mut)
                .context("llm-tokens.yaml: no routes")?;
            let before = routes.len();
            routes.retain(|r| name_of(r) != Some("reserved"));
            anyhow::ensure!(
                routes.len() + 1 == before,
                "llm-tokens.yaml: no `reserved` route to take out"
            );
            let clusters = config
                .pointer_mut("/static_resources/clusters")
                .and_then(Json::as_array_mut)
                .context("llm-tokens.yaml: no clusters")?;
            let llm = clusters
                .iter_mut()
                .find(|c| name_of(c) == Some("llm"))
                .context("llm-tokens.yaml: no cluster `llm`")?;
            let address = llm
                .pointer_mut(
                    "/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address",
                )
                .context("llm-tokens.yaml: cluster `llm` has no socket address")?;
            address["address"] = upstream.ip().to_string().into();
            address["port_value"] = upstream.port().into();
            Ok(())
        })
}

/// Calls `f` on the `key` of every `{key: total_tokens}` selector under
/// `value`.
fn for_each_usage_selector(value: &mut Json, f: &mut dyn FnMut(&mut Json)) {
    match value {
        Json::Object(object) => {
            if object.len() == 1
                && let Some(key) = object.get_mut("key")
                && key.as_str() == Some("total_tokens")
            {
                f(key);
                return;
            }
            for child in object.values_mut() {
                for_each_usage_selector(child, f);
            }
        }
        Json::Array(items) => {
            for item in items {
                for_each_usage_selector(item, f);
            }
        }
        _ => {}
    }
}

fn name_of(value: &Json) -> Option<&str> {
    value.get("name").and_then(Json::as_str)
}

/// A running two-call fleet. Dropping it stops every process.
#[derive(Debug)]
pub struct TwoCallFleet {
    /// The control plane (serving only the quota), the Envoys and the
    /// upstream, as a [`TokenFleet`] so a `TokenLoad` can drive it.
    pub tokens: TokenFleet,
    /// The quota's counters.
    pub redis: RedisServer,
    // Last: Redis writes into it until it is stopped.
    dir: TestDir,
}

impl TwoCallFleet {
    /// Starts Redis, the upstream (as [`TokenFleet::start`] does), the
    /// control plane with [`quota_yaml`] of `options.budget_per_s` and
    /// its counters on Redis, and `options.envoys` Envoys ([`envoy`]).
    /// Only the budget, the Envoy count and the workers of `options` are
    /// used: no Sluice filter runs.
    pub async fn start(options: TokenFleetOptions) -> Result<Self> {
        let dir = TestDir::new("sluice-two-call-", "two-call fleet")?;
        let redis = RedisServer::start(dir.path()).await?;
        let upstream = LlmUpstream::start(LlmUpstreamOptions {
            output_tokens_header: Some(HeaderName::from_static(OUTPUT_TOKENS_HEADER)),
            ..LlmUpstreamOptions::default()
        })
        .await?;
        let fleet_options = FleetOptions::control_plane_only("limits: []\n")
            .quota_file(&format!("{DOMAIN}.yaml"), &quota_yaml(options.budget_per_s))
            .args(["--store".to_owned(), redis.url()]);
        let mut fleet = Fleet::start(fleet_options).await?;
        for index in 0..options.envoys {
            let letter = char::from(b'a' + u8::try_from(index % 26).unwrap_or(0));
            let spec =
                envoy(&format!("two-call-{letter}"), upstream.addr()).concurrency(options.workers);
            fleet.start_envoy(&spec).await?;
        }
        let fleet = Self {
            tokens: TokenFleet {
                fleet,
                upstream,
                options,
            },
            redis,
            dir,
        };
        fleet.wait_answering(Duration::from_secs(10)).await?;
        Ok(fleet)
    }

    /// Waits until every Envoy answers a small completion with 200
    /// (the rate limit service reachable through it).
    async fn wait_answering(&self, timeout: Duration) -> Result<()> {
        let http = reqwest::Client::new();
        for index in 0..self.tokens.fleet.envoys.len() {
            let url = format!("{}/v1/chat/completions", self.tokens.fleet.url(index)?);
            let http = &http;
            crate::wait::until(
                &format!("two-call Envoy #{index} to answer 200"),
                timeout,
                Duration::from_millis(50),
                || {
                    let url = url.clone();
                    async move {
                        let response = http
                            .post(&url)
                            .header("x-tenant", "warmup")
                            .header(OUTPUT_TOKENS_HEADER, "1")
                            .body(r#"{"model":"m","messages":[]}"#)
                            .send()
                            .await?;
                        Ok((response.status().as_u16() == 200).then_some(()))
                    }
                },
            )
            .await?;
        }
        Ok(())
    }

    /// Where its logs are.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Prints every process's log tail.
    pub fn print_logs(&self) {
        self.tokens.fleet.print_logs();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::ControlPlaneTarget;

    #[test]
    fn the_quota_is_one_counter_for_every_tenant() {
        let yaml = quota_yaml(20_000.0);
        assert!(yaml.contains("value: \"*\"") && yaml.contains("share_threshold: true"));
        assert!(yaml.contains("requests_per_unit: 20000}"), "{yaml}");
    }

    #[test]
    fn only_the_ratelimit_filter_and_the_metered_route_are_left() {
        let upstream = SocketAddr::from(([127, 0, 0, 1], 4242));
        let control_plane = SocketAddr::from(([127, 0, 0, 1], 4343));
        let config = envoy("t", upstream)
            .config(&ControlPlaneTarget::One(control_plane))
            .unwrap();
        let text = serde_yaml_ng::to_string(&config).unwrap();
        assert!(!text.contains("envoy.filters.http.wasm"), "{text}");
        assert!(!text.contains("name: reserved"), "{text}");
        assert!(text.contains("envoy.filters.http.ratelimit"));
        assert!(text.contains("apply_on_stream_done: true"));
        assert!(!text.contains("total_tokens"), "{text}");
        assert_eq!(text.matches("key: completion_tokens").count(), 2, "{text}");
        assert!(text.contains("port_value: 4242"), "{text}");
        assert!(text.contains("port_value: 4343"), "{text}");
    }
}
