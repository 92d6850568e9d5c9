//! The Envoy configs of the variants. All start from `envoy/demo-a.yaml`
//! (the config users run), rewritten by the test harness for ephemeral
//! ports. Variants 1 to 7 differ only in the HTTP filter chain in front of
//! the router, so the difference between them is the cost of those filters;
//! variants 8 and 9 route to a real upstream process instead of answering
//! locally, so they show what a request that passes costs against one that
//! is rejected. Variants 14 to 21 route to the fake LLM upstream, which
//! streams a chat completion of a fixed size: with and without a cost rule
//! whose actual cost the usage parser reads from the stream (18: a rule
//! that does not read the body; 20: one charging what Envoy's
//! `sse_to_metadata` wrote into dynamic metadata).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::json;
use serde_yaml_ng::Value;
use sluice_integration_tests::envoy::{Rewrite, load_repo_config, rewrite};
use sluice_integration_tests::paths;

use super::client::{Ask, BUCKET, STREAMED_OUTPUT_TOKENS, TENANT_HEADER};

/// Default location of the empty filter's `.wasm`, relative to the workspace root.
pub const DEFAULT_EMPTY_WASM: &str = "target/wasm32-wasip1/wasm/sluice_empty_filter.wasm";

/// One filter chain under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The router alone.
    Router,
    /// Envoy's `local_ratelimit` with a bucket it never exhausts.
    LocalRateLimit,
    /// A proxy-wasm filter that does nothing.
    EmptyWasm,
    /// Sluice holding a directive for the bucket that (practically) never drops.
    SluiceNoDrop,
    /// Sluice dropping half the requests.
    SluiceHalf,
    /// Envoy's global `ratelimit` filter calling a rate limit service (its
    /// own process, on loopback) for every request; the service always
    /// answers OK.
    GlobalRateLimit,
    /// Variant 6 without its rate limit filter: the fault filter answering
    /// every request locally, as variant 6 does once the service said OK.
    FaultReply,
    /// The router forwarding every request to an HTTP/1.1 upstream process.
    UpstreamRouter,
    /// Sluice dropping half the requests in front of variant 8: the half it
    /// rejects never reaches the upstream.
    UpstreamSluiceHalf,
    /// Envoy's `rate_limit_quota` filter with the real control plane as its
    /// RLQS server, holding a token bucket assignment that never runs dry:
    /// no wasm.
    RateLimitQuota,
    /// Variant 6 with the real control plane (`sluice serve --quotas`) as
    /// the rate limit service, counting every call against a quota it never
    /// exhausts.
    SluiceRateLimitService,
    /// Variant 4 with the native dynamic module instead of the wasm filter.
    NativeNoDrop,
    /// Variant 5 with the native dynamic module.
    NativeHalf,
    /// The router to the fake LLM upstream streaming a chat completion
    /// (SSE) of a fixed size, Sluice in front holding a directive that
    /// does not drop, and no cost rule.
    SseUpstream,
    /// Variant 14 plus a cost rule for the bucket whose actual cost the
    /// usage parser reads from the stream: the parser and the charge at
    /// the stream's end are the only difference.
    SseUpstreamUsage,
    /// Variant 14 with the native dynamic module.
    NativeSseUpstream,
    /// Variant 15 with the native dynamic module.
    NativeSseUpstreamUsage,
    /// Variant 15 with the body not read: every stream is charged its
    /// estimate at its end, so 15 against 18 is the reading of the body
    /// (each chunk handed to the parser) and 18 against 14 the rule's
    /// estimate and charge.
    SseUpstreamEstimate,
    /// Variant 18 with the native dynamic module: 17 against 19 is the
    /// native module's reading of the body.
    NativeSseUpstreamEstimate,
    /// Variant 18 with Envoy's own `sse_to_metadata` filter writing each
    /// stream's usage into Envoy AI Gateway's metadata key, which the rule
    /// charges from: the usage read without the filter reading the body
    /// (20 against 15 is what that saves the wasm filter).
    SseUpstreamMetadata,
    /// Variant 20 with the native dynamic module.
    NativeSseUpstreamMetadata,
}

impl Variant {
    /// Every variant, baseline first.
    pub const ALL: [Variant; 21] = [
        Variant::Router,
        Variant::LocalRateLimit,
        Variant::EmptyWasm,
        Variant::SluiceNoDrop,
        Variant::SluiceHalf,
        Variant::GlobalRateLimit,
        Variant::FaultReply,
        Variant::UpstreamRouter,
        Variant::UpstreamSluiceHalf,
        Variant::RateLimitQuota,
        Variant::SluiceRateLimitService,
        Variant::NativeNoDrop,
        Variant::NativeHalf,
        Variant::SseUpstream,
        Variant::SseUpstreamUsage,
        Variant::NativeSseUpstream,
        Variant::NativeSseUpstreamUsage,
        Variant::SseUpstreamEstimate,
        Variant::NativeSseUpstreamEstimate,
        Variant::SseUpstreamMetadata,
        Variant::NativeSseUpstreamMetadata,
    ];

    /// Short name for logs and file names.
    pub fn slug(self) -> &'static str {
        match self {
            Variant::Router => "router",
            Variant::LocalRateLimit => "local-ratelimit",
            Variant::EmptyWasm => "empty-wasm",
            Variant::SluiceNoDrop => "sluice-no-drop",
            Variant::SluiceHalf => "sluice-50pct",
            Variant::GlobalRateLimit => "global-ratelimit",
            Variant::FaultReply => "fault-reply",
            Variant::UpstreamRouter => "upstream",
            Variant::UpstreamSluiceHalf => "upstream-sluice-50pct",
            Variant::RateLimitQuota => "rate-limit-quota",
            Variant::SluiceRateLimitService => "sluice-rls",
            Variant::NativeNoDrop => "native-no-drop",
            Variant::NativeHalf => "native-50pct",
            Variant::SseUpstream => "sse-upstream",
            Variant::SseUpstreamUsage => "sse-upstream-usage",
            Variant::NativeSseUpstream => "native-sse-upstream",
            Variant::NativeSseUpstreamUsage => "native-sse-upstream-usage",
            Variant::SseUpstreamEstimate => "sse-upstream-estimate",
            Variant::NativeSseUpstreamEstimate => "native-sse-upstream-estimate",
            Variant::SseUpstreamMetadata => "sse-upstream-metadata",
            Variant::NativeSseUpstreamMetadata => "native-sse-upstream-metadata",
        }
    }

    /// Description for the results table.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Router => "1. router only (direct_response)",
            Variant::LocalRateLimit => "2. + local_ratelimit, never rejecting",
            Variant::EmptyWasm => "3. + empty proxy-wasm filter",
            Variant::SluiceNoDrop => "4. + Sluice, directive present, no drops",
            Variant::SluiceHalf => "5. + Sluice at 50% drop",
            Variant::GlobalRateLimit => "6. + global ratelimit, gRPC service per request",
            Variant::FaultReply => "7. fault-filter local reply (6 without ratelimit)",
            Variant::UpstreamRouter => "8. router to an HTTP/1.1 upstream",
            Variant::UpstreamSluiceHalf => "9. + Sluice at 50% drop, upstream as 8",
            Variant::RateLimitQuota => "10. + rate_limit_quota, Sluice RLQS token bucket, no drops",
            Variant::SluiceRateLimitService => {
                "11. as 6, with sluice serve --quotas as the service"
            }
            Variant::NativeNoDrop => "12. + Sluice native module, no drops (as 4)",
            Variant::NativeHalf => "13. + Sluice native module at 50% drop (as 5)",
            Variant::SseUpstream => "14. + Sluice, no drops, streamed completion upstream",
            Variant::SseUpstreamUsage => "15. as 14, + cost rule parsing the usage",
            Variant::NativeSseUpstream => "16. as 14, with the native module",
            Variant::NativeSseUpstreamUsage => "17. as 15, with the native module",
            Variant::SseUpstreamEstimate => "18. as 15, body not read, estimate charged",
            Variant::NativeSseUpstreamEstimate => "19. as 18, with the native module",
            Variant::SseUpstreamMetadata => "20. as 18, usage from Envoy's sse_to_metadata",
            Variant::NativeSseUpstreamMetadata => "21. as 20, with the native module",
        }
    }

    /// The drop ratio the stand-in control plane pushes for the bucket.
    /// Variant 4 needs a directive that is held and consulted but does not
    /// drop: a ratio of exactly 0 is a lifted limit, which the filter removes
    /// from its table, so a tiny ratio (about one request in a billion) is
    /// pushed instead.
    pub fn drop_ratio(self) -> Option<f64> {
        match self {
            Variant::SluiceNoDrop
            | Variant::NativeNoDrop
            | Variant::SseUpstream
            | Variant::SseUpstreamUsage
            | Variant::NativeSseUpstream
            | Variant::NativeSseUpstreamUsage
            | Variant::SseUpstreamEstimate
            | Variant::NativeSseUpstreamEstimate
            | Variant::SseUpstreamMetadata
            | Variant::NativeSseUpstreamMetadata => Some(1e-9),
            Variant::SluiceHalf | Variant::UpstreamSluiceHalf | Variant::NativeHalf => Some(0.5),
            _ => None,
        }
    }

    /// What each of its requests asks.
    pub fn ask(self) -> Ask {
        if self.streams_completions() {
            Ask::StreamedChat
        } else {
            Ask::Get
        }
    }

    /// Whether it routes to the fake LLM upstream (variants 14 to 21).
    pub fn streams_completions(self) -> bool {
        matches!(
            self,
            Variant::SseUpstream
                | Variant::SseUpstreamUsage
                | Variant::NativeSseUpstream
                | Variant::NativeSseUpstreamUsage
                | Variant::SseUpstreamEstimate
                | Variant::NativeSseUpstreamEstimate
                | Variant::SseUpstreamMetadata
                | Variant::NativeSseUpstreamMetadata
        )
    }

    /// Where its filter's cost rule takes each stream's charge from, named
    /// as the filter's counters name the source: `body` (variants 15 and
    /// 17), `estimate` (18 and 19), `metadata` (20 and 21), or `None`: no
    /// cost rule.
    pub fn charge_source(self) -> Option<&'static str> {
        match self {
            Variant::SseUpstreamUsage | Variant::NativeSseUpstreamUsage => Some("body"),
            Variant::SseUpstreamEstimate | Variant::NativeSseUpstreamEstimate => Some("estimate"),
            Variant::SseUpstreamMetadata | Variant::NativeSseUpstreamMetadata => Some("metadata"),
            _ => None,
        }
    }
}

/// The filter configuration keys of `variant`: one bucket from the tenant
/// header and, for the variants with a cost rule, a rule for it with a
/// constant estimate that reads the actual cost from the body only (no
/// dynamic metadata, no header), from nothing (variants 18 and 19), or
/// from Envoy AI Gateway's metadata key, the rule's default, alone
/// (variants 20 and 21).
fn filter_keys(variant: Variant) -> serde_json::Value {
    let mut keys = json!({
        "proxy_id": "bench",
        "bucket_key": [{"source": "header", "name": TENANT_HEADER, "default": "anonymous"}],
    });
    if let (Some(source), Some(keys)) = (variant.charge_source(), keys.as_object_mut()) {
        keys.insert(
            "cost_rules".to_owned(),
            json!([{
                "bucket": BUCKET,
                "cost": {"estimate": {"source": "constant", "value": STREAMED_OUTPUT_TOKENS}},
                "actual": if source == "metadata" {
                    json!({"body": {"parse": false}})
                } else {
                    json!({"metadata": null, "body": {"parse": source == "body"}})
                },
            }]),
        );
    }
    keys
}

/// Where the empty filter is: `$EMPTY_FILTER_WASM`, else [`DEFAULT_EMPTY_WASM`].
pub fn empty_wasm() -> Result<PathBuf> {
    let path = match std::env::var_os("EMPTY_FILTER_WASM") {
        Some(value) if !value.is_empty() => paths::from_root(PathBuf::from(value))?,
        _ => paths::from_root(DEFAULT_EMPTY_WASM)?,
    };
    anyhow::ensure!(
        path.is_file(),
        "EMPTY_FILTER_WASM: {} does not exist: run \
         `cargo build -p sluice-empty-filter --target wasm32-wasip1 --profile wasm`",
        path.display()
    );
    Ok(path)
}

/// Where the stand-in services listen.
#[derive(Debug, Clone, Copy)]
pub struct Services {
    /// The rate limit service (variant 6).
    pub rls: SocketAddr,
    /// The HTTP/1.1 upstream (variants 8 and 9).
    pub upstream: SocketAddr,
    /// The fake LLM upstream (variants 14 to 21).
    pub llm: SocketAddr,
    /// The real control plane's gRPC listener, as RLQS server (variant 10)
    /// and rate limit service (variant 11).
    pub rlqs: SocketAddr,
}

/// The Envoy config for `variant`, its control-plane cluster pointing at
/// `control_plane` and its service clusters at `services`.
pub fn envoy_config(
    variant: Variant,
    control_plane: SocketAddr,
    services: Services,
    empty_wasm: &Path,
) -> Result<Value> {
    let mut config = load_repo_config("demo-a.yaml")?;
    // `for_test` also points every wasm filter at the built Sluice filter
    // (`SLUICE_WASM`), as the integration tests do.
    let rw = Rewrite::for_test(control_plane, filter_keys(variant))?;
    rewrite(&mut config, &rw)?;

    let filters = http_filters(&mut config)?;
    let (sluice, router) = match filters.as_slice() {
        [sluice, router] => (sluice.clone(), router.clone()),
        _ => anyhow::bail!("demo-a.yaml: expected [sluice, router] as HTTP filters"),
    };
    *filters = match variant {
        Variant::Router => vec![router],
        Variant::LocalRateLimit => vec![local_ratelimit()?, router],
        Variant::EmptyWasm => vec![empty_filter(sluice, empty_wasm)?, router],
        Variant::SluiceNoDrop
        | Variant::SluiceHalf
        | Variant::UpstreamSluiceHalf
        | Variant::SseUpstream
        | Variant::SseUpstreamUsage
        | Variant::SseUpstreamEstimate => vec![sluice, router],
        Variant::SseUpstreamMetadata => vec![sluice, sse_to_metadata()?, router],
        Variant::GlobalRateLimit => vec![global_ratelimit()?, fault_reply()?, router],
        Variant::FaultReply => vec![fault_reply()?, router],
        Variant::UpstreamRouter => vec![router],
        Variant::RateLimitQuota => vec![rate_limit_quota()?, router],
        Variant::SluiceRateLimitService => vec![global_ratelimit()?, fault_reply()?, router],
        Variant::NativeNoDrop
        | Variant::NativeHalf
        | Variant::NativeSseUpstream
        | Variant::NativeSseUpstreamUsage
        | Variant::NativeSseUpstreamEstimate => {
            vec![native_module(control_plane, variant)?, router]
        }
        Variant::NativeSseUpstreamMetadata => vec![
            native_module(control_plane, variant)?,
            sse_to_metadata()?,
            router,
        ],
    };
    if variant == Variant::SluiceRateLimitService {
        // The control plane, as the rate limit service of variant 11.
        add_cluster(&mut config, RLS_CLUSTER, services.rlqs, true)?;
        route_to_cluster(&mut config, RLS_CLUSTER)?;
    }
    if variant == Variant::RateLimitQuota {
        add_cluster(&mut config, RLQS_CLUSTER, services.rlqs, true)?;
    }
    if matches!(variant, Variant::GlobalRateLimit | Variant::FaultReply) {
        add_cluster(&mut config, RLS_CLUSTER, services.rls, true)?;
        route_to_cluster(&mut config, RLS_CLUSTER)?;
    }
    if matches!(
        variant,
        Variant::UpstreamRouter | Variant::UpstreamSluiceHalf
    ) {
        add_cluster(&mut config, UPSTREAM_CLUSTER, services.upstream, false)?;
        route_to_cluster(&mut config, UPSTREAM_CLUSTER)?;
    }
    if variant.streams_completions() {
        add_cluster(&mut config, LLM_CLUSTER, services.llm, false)?;
        route_to_cluster(&mut config, LLM_CLUSTER)?;
    }
    Ok(config)
}

/// The dynamic-module filter of `envoy/native-module.yaml`, configured as
/// the wasm filter of the same `variant` would be and dialing
/// `control_plane`.
fn native_module(control_plane: SocketAddr, variant: Variant) -> Result<Value> {
    let mut native = load_repo_config("native-module.yaml")?;
    let rw = Rewrite::for_native(control_plane, filter_keys(variant))?;
    rewrite(&mut native, &rw)?;
    http_filters(&mut native)?
        .first()
        .cloned()
        .context("envoy/native-module.yaml: no HTTP filter")
}

fn http_filters(config: &mut Value) -> Result<&mut Vec<Value>> {
    config
        .get_mut("static_resources")
        .and_then(|v| v.get_mut("listeners"))
        .and_then(|v| v.get_mut(0))
        .and_then(|v| v.get_mut("filter_chains"))
        .and_then(|v| v.get_mut(0))
        .and_then(|v| v.get_mut("filters"))
        .and_then(|v| v.get_mut(0))
        .and_then(|v| v.get_mut("typed_config"))
        .and_then(|v| v.get_mut("http_filters"))
        .and_then(Value::as_sequence_mut)
        .context("demo-a.yaml: no http_filters in the first listener")
}

/// Envoy's `sse_to_metadata` filter as `envoy/llm-tokens.yaml` configures
/// it: OpenAI's `usage.total_tokens`, event by event, into Envoy AI
/// Gateway's `io.envoy.ai_gateway` / `llm_total_token` (variants 20 and 21).
fn sse_to_metadata() -> Result<Value> {
    let mut example = load_repo_config("llm-tokens.yaml")?;
    http_filters(&mut example)?
        .iter()
        .find(|filter| {
            filter.get("name").and_then(Value::as_str) == Some("envoy.filters.http.sse_to_metadata")
        })
        .cloned()
        .context("envoy/llm-tokens.yaml: no sse_to_metadata filter")
}

/// A token bucket far larger than any run can use, enabled and enforced for
/// every request, so the filter does its full work and never rejects.
fn local_ratelimit() -> Result<Value> {
    serde_yaml_ng::from_str(
        r#"
name: envoy.filters.http.local_ratelimit
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
  stat_prefix: bench_local_rate_limit
  token_bucket: { max_tokens: 1000000000, tokens_per_fill: 1000000000, fill_interval: 1s }
  filter_enabled:
    runtime_key: bench_local_rate_limit_enabled
    default_value: { numerator: 100, denominator: HUNDRED }
  filter_enforced:
    runtime_key: bench_local_rate_limit_enforced
    default_value: { numerator: 100, denominator: HUNDRED }
"#,
    )
    .context("local_ratelimit filter config")
}

/// Name of the cluster of the RLQS server (variant 10).
const RLQS_CLUSTER: &str = "bench_rlqs";

/// The `rate_limit_quota` filter of `envoy/rlqs.yaml` (bucket id from the
/// `x-tenant` header), talking to [`RLQS_CLUSTER`].
fn rate_limit_quota() -> Result<Value> {
    let mut rlqs = load_repo_config("rlqs.yaml")?;
    let mut filter = http_filters(&mut rlqs)?
        .first()
        .cloned()
        .context("envoy/rlqs.yaml: no HTTP filter")?;
    let cluster = filter
        .get_mut("typed_config")
        .and_then(|v| v.get_mut("rlqs_server"))
        .and_then(|v| v.get_mut("envoy_grpc"))
        .and_then(Value::as_mapping_mut)
        .context("envoy/rlqs.yaml: the first filter has no rlqs_server.envoy_grpc")?;
    cluster.insert("cluster_name".into(), RLQS_CLUSTER.into());
    Ok(filter)
}

/// Name of the cluster of the rate limit service (variant 6).
const RLS_CLUSTER: &str = "bench_rate_limit_service";
/// Name of the cluster of the upstream (variants 8 and 9).
const UPSTREAM_CLUSTER: &str = "bench_upstream";
/// Name of the cluster of the fake LLM upstream (variants 14 to 21).
const LLM_CLUSTER: &str = "bench_llm_upstream";

/// Envoy's global rate limit filter: one `ShouldRateLimit` call per request
/// with a descriptor `("tenant", <x-tenant>)`, from the `rate_limits` of the
/// filter itself (so the `direct_response` route needs no route action).
/// It fails closed and waits up to a second, so a request the service did
/// not answer shows up as a 500 (counted as "other") instead of silently
/// passing unchecked.
fn global_ratelimit() -> Result<Value> {
    serde_yaml_ng::from_str(&format!(
        r#"
name: envoy.filters.http.ratelimit
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
  domain: bench
  failure_mode_deny: true
  timeout: 1s
  rate_limits:
    - actions:
        - request_headers: {{ header_name: {TENANT_HEADER}, descriptor_key: tenant }}
  rate_limit_service:
    transport_api_version: V3
    grpc_service:
      envoy_grpc: {{ cluster_name: {RLS_CLUSTER} }}
"#
    ))
    .context("ratelimit filter config")
}

/// Replaces the `direct_response` of the first route with a route to
/// `cluster`.
///
/// Envoy's `ratelimit` filter only runs on routes with a route entry (a
/// target cluster), never on a `direct_response` route. Variants 6 and 7
/// route to the rate limit service's cluster, and the fault filter answers
/// every request with a local 200 before the router would forward it, so no
/// request leaves Envoy, as in variants 1 to 5; variant 7 measures what that
/// swap costs. Variants 8, 9 and 14 to 21 really forward to an upstream.
fn route_to_cluster(config: &mut Value, cluster: &str) -> Result<()> {
    let route = config
        .get_mut("static_resources")
        .and_then(|v| v.get_mut("listeners"))
        .and_then(|v| v.get_mut(0))
        .and_then(|v| v.get_mut("filter_chains"))
        .and_then(|v| v.get_mut(0))
        .and_then(|v| v.get_mut("filters"))
        .and_then(|v| v.get_mut(0))
        .and_then(|v| v.get_mut("typed_config"))
        .and_then(|v| v.get_mut("route_config"))
        .and_then(|v| v.get_mut("virtual_hosts"))
        .and_then(|v| v.get_mut(0))
        .and_then(|v| v.get_mut("routes"))
        .and_then(|v| v.get_mut(0))
        .and_then(Value::as_mapping_mut)
        .context("demo-a.yaml: no route in the first virtual host")?;
    route.remove("direct_response");
    route.insert(
        "route".into(),
        serde_yaml_ng::from_str(&format!("{{ cluster: {cluster} }}")).context("route action")?,
    );
    Ok(())
}

/// The fault filter aborting every request with a local `200`.
fn fault_reply() -> Result<Value> {
    serde_yaml_ng::from_str(
        r#"
name: envoy.filters.http.fault
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault
  abort:
    http_status: 200
    percentage: { numerator: 100, denominator: HUNDRED }
"#,
    )
    .context("fault filter config")
}

/// A static cluster `name` with one endpoint at `addr`, speaking HTTP/2
/// (the rate limit service's gRPC) or HTTP/1.1 (the upstream).
fn add_cluster(config: &mut Value, name: &str, addr: SocketAddr, http2: bool) -> Result<()> {
    let protocol = if http2 {
        "http2_protocol_options: {}"
    } else {
        "http_protocol_options: {}"
    };
    let cluster: Value = serde_yaml_ng::from_str(&format!(
        r#"
name: {name}
type: STATIC
connect_timeout: 1s
typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config:
      {protocol}
load_assignment:
  cluster_name: {name}
  endpoints:
    - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{ address: "{ip}", port_value: {port} }}
"#,
        ip = addr.ip(),
        port = addr.port(),
    ))
    .with_context(|| format!("cluster {name}"))?;
    config
        .get_mut("static_resources")
        .and_then(|v| v.get_mut("clusters"))
        .and_then(Value::as_sequence_mut)
        .context("demo-a.yaml: no static_resources.clusters")?
        .push(cluster);
    Ok(())
}

/// The Sluice filter entry with the empty filter's code, its own `vm_id`
/// and no configuration: same runtime and failure policy as Sluice.
fn empty_filter(mut sluice: Value, wasm: &Path) -> Result<Value> {
    let config = sluice
        .get_mut("typed_config")
        .and_then(|v| v.get_mut("config"))
        .and_then(Value::as_mapping_mut)
        .context("sluice filter has no typed_config.config")?;
    config.insert("name".into(), "empty".into());
    config.remove("configuration");
    let vm = config
        .get_mut("vm_config")
        .and_then(Value::as_mapping_mut)
        .context("sluice filter has no vm_config")?;
    vm.insert("vm_id".into(), "empty".into());
    let local = vm
        .get_mut("code")
        .and_then(|v| v.get_mut("local"))
        .and_then(Value::as_mapping_mut)
        .context("sluice filter has no vm_config.code.local")?;
    local.insert("filename".into(), wasm.display().to_string().into());
    Ok(sluice)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use super::*;
    use sluice_agent::config::FilterConfig;

    /// `variant`'s filter keys as the filter parses and validates them.
    fn parsed(variant: Variant) -> FilterConfig {
        let mut keys = filter_keys(variant);
        keys["control_plane_cluster"] = json!("sluice_control_plane");
        FilterConfig::from_json(keys.to_string().as_bytes())
            .unwrap_or_else(|err| panic!("{}: {err}", variant.slug()))
    }

    #[test]
    fn only_the_cost_variants_have_a_rule_reading_the_body_alone_or_nothing() {
        for variant in Variant::ALL {
            let config = parsed(variant);
            let source = variant.charge_source();
            assert_eq!(
                config.costs.is_empty(),
                source.is_none(),
                "{}",
                variant.slug()
            );
            if let Some(source) = source {
                let index = config
                    .costs
                    .find(None, BUCKET)
                    .expect("a rule for the bucket");
                let actual = &config.costs.get(index).unwrap().actual;
                assert_eq!(actual.body_cap.is_some(), source == "body");
                assert_eq!(actual.metadata.is_some(), source == "metadata");
                assert_eq!(
                    (&actual.response_header, &actual.response_trailer),
                    (&None, &None)
                );
            }
        }
    }

    #[test]
    fn each_cost_variant_differs_from_its_pair_only_by_the_cost_rule() {
        for (without, with) in [
            (Variant::SseUpstream, Variant::SseUpstreamUsage),
            (Variant::NativeSseUpstream, Variant::NativeSseUpstreamUsage),
            (Variant::SseUpstream, Variant::SseUpstreamEstimate),
            (
                Variant::NativeSseUpstream,
                Variant::NativeSseUpstreamEstimate,
            ),
            (Variant::SseUpstream, Variant::SseUpstreamMetadata),
            (
                Variant::NativeSseUpstream,
                Variant::NativeSseUpstreamMetadata,
            ),
        ] {
            let mut keys = filter_keys(with);
            keys.as_object_mut().unwrap().remove("cost_rules").unwrap();
            assert_eq!(keys, filter_keys(without));
            assert_eq!(with.drop_ratio(), without.drop_ratio());
            assert_eq!(
                (with.ask(), without.ask()),
                (Ask::StreamedChat, Ask::StreamedChat)
            );
        }
        assert_eq!(Variant::UpstreamRouter.ask(), Ask::Get);
    }

    #[test]
    fn slugs_are_unique_and_numbers_follow_the_order() {
        let mut slugs: Vec<&str> = Variant::ALL.iter().map(|v| v.slug()).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), Variant::ALL.len());
        for (i, variant) in Variant::ALL.iter().enumerate() {
            assert!(
                variant.label().starts_with(&format!("{}. ", i + 1)),
                "{}",
                variant.label()
            );
        }
    }
}
