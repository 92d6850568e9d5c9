//! Envoys that use their own `rate_limit_quota` filter with the control
//! plane as RLQS server: `envoy/rlqs.yaml` pointed at a control plane.

use anyhow::Result;
use serde_yaml_ng::Value;

use crate::envoy;
use crate::fleet::EnvoySpec;

/// An RLQS Envoy named `name` (two workers) on `envoy/rlqs.yaml` with
/// `proxy_id` sent as the stream's `x-sluice-proxy-id`, and the fallback
/// for expired assignments at [`DEFAULT_FALLBACK_RPS`] per bucket id;
/// `SLUICE_RLQS_ENVOY_LOG` sets its log level.
pub fn envoy(name: &str, proxy_id: &str) -> EnvoySpec {
    envoy_with_fallback(name, proxy_id, DEFAULT_FALLBACK_RPS)
}

/// [`envoy()`] with the fallback for expired assignments at `fallback_rps`.
pub fn envoy_with_fallback(name: &str, proxy_id: &str, fallback_rps: u32) -> EnvoySpec {
    let proxy_id = proxy_id.to_owned();
    let mut spec = EnvoySpec::repo(name, "rlqs.yaml")
        .data_plane(None)
        .edit(move |config| name_the_stream(config, &proxy_id))
        .edit(move |config| set_fallback(config, fallback_rps));
    if let Ok(level) = std::env::var("SLUICE_RLQS_ENVOY_LOG") {
        spec = spec.log_level(&level);
    }
    spec
}

/// Sends `proxy_id` as the RLQS stream's `x-sluice-proxy-id`.
fn name_the_stream(config: &mut Value, proxy_id: &str) -> Result<()> {
    let mut named = 0;
    envoy::visit_mappings(config, &mut |mapping| {
        if mapping.get("key").and_then(Value::as_str) == Some("x-sluice-proxy-id") {
            mapping.insert("value".into(), proxy_id.into());
            named += 1;
        }
    });
    anyhow::ensure!(
        named == 1,
        "rlqs.yaml names x-sluice-proxy-id once, found {named}"
    );
    Ok(())
}

/// Sets the fallback token bucket for expired assignments.
fn set_fallback(config: &mut Value, fallback_rps: u32) -> Result<()> {
    let mut fallbacks = 0;
    envoy::visit_mappings(config, &mut |mapping| {
        if let Some(bucket) = mapping
            .get_mut("fallback_rate_limit")
            .and_then(|f| f.get_mut("token_bucket"))
            .and_then(Value::as_mapping_mut)
        {
            bucket.insert("tokens_per_fill".into(), fallback_rps.into());
            fallbacks += 1;
        }
    });
    anyhow::ensure!(
        fallbacks == 1,
        "rlqs.yaml has one fallback token bucket, found {fallbacks}"
    );
    Ok(())
}

/// The fallback of [`envoy()`]: generous enough never to bind in a test
/// that does not stop the control plane.
pub const DEFAULT_FALLBACK_RPS: u32 = 10_000;
