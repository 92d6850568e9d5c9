//! `/v1/overrides`: temporary limits (a rate or a budget) and tenant values. Each target has at
//! most one override; a new one replaces it. At the deadline the override is
//! removed and the base value applies again.
//!
//! The overrides are one resource for `If-Match`: `GET /v1/overrides`
//! answers with its `ETag`, every write may name it.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;

use super::context::Admin;
use super::etag::{ETag, IfMatch};
use super::extract::{Json, Path};
use super::problem::Problem;
use super::write;
use crate::config::Config;
use crate::config::budget::Budget;
use crate::config::overrides::{
    LimitOverride, OverrideTtl, Overrides, TenantOverride, one_limit, unix_now,
};
use crate::config::policy::{BurstMultiplier, Weight};
use crate::types::LimitRps;

/// `GET /v1/overrides`: those in force (expired ones are removed within a
/// second or so of their deadline).
pub(crate) async fn list(State(admin): State<Admin>) -> (HeaderMap, axum::Json<Overrides>) {
    let mut config = admin.live().config();
    config.overrides.remove_expired(unix_now());
    (
        overrides_tag(&config).header(),
        axum::Json(config.overrides),
    )
}

/// `PUT /v1/overrides/limits/{bucket}` body: `limit_rps` or `budget`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PutLimitOverride {
    /// The limit while the override lasts, in requests per second.
    #[serde(default)]
    pub(crate) limit_rps: Option<LimitRps>,
    /// A cost budget while the override lasts, instead.
    #[serde(default)]
    pub(crate) budget: Option<Budget>,
    /// How long it lasts, in seconds (at most 30 days).
    pub(crate) ttl_s: OverrideTtl,
}

/// `PUT /v1/overrides/limits/{bucket}`.
pub(crate) async fn put_limit(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
    if_match: IfMatch,
    Json(body): Json<PutLimitOverride>,
) -> Result<(HeaderMap, axum::Json<LimitOverride>), Problem> {
    write::bucket(&bucket)?;
    let limit = one_limit(body.limit_rps, body.budget).map_err(Problem::unprocessable)?;
    let over = LimitOverride {
        limit,
        expires_at_unix_s: body.ttl_s.expires_at(unix_now()),
    };
    let key = bucket.clone();
    let set = over.clone();
    let tag = write::change(&admin, move |config| {
        if_match.check(Some(&overrides_tag(config)))?;
        config.overrides.limits.insert(key, set);
        Ok(overrides_tag(config))
    })
    .await?;
    tracing::info!(bucket, limit = %over.limit, ttl_s = body.ttl_s.as_secs(), "limit override set");
    Ok((tag.header(), axum::Json(over)))
}

/// `DELETE /v1/overrides/limits/{bucket}`: the base limit applies at once.
pub(crate) async fn delete_limit(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
    if_match: IfMatch,
) -> Result<StatusCode, Problem> {
    let key = bucket.clone();
    write::change(&admin, move |config| {
        if_match.check(Some(&overrides_tag(config)))?;
        config
            .overrides
            .limits
            .remove(&key)
            .map(drop)
            .ok_or_else(|| Problem::not_found(format!("no override for bucket {key:?}")))
    })
    .await?;
    tracing::info!(bucket, "limit override removed");
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /v1/overrides/tenants/{tenant}` body: at least one value.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PutTenantOverride {
    /// Weight while the override lasts.
    #[serde(default)]
    pub(crate) weight: Option<Weight>,
    /// Burst multiplier while the override lasts.
    #[serde(default)]
    pub(crate) burst: Option<BurstMultiplier>,
    /// Floor while the override lasts.
    #[serde(default)]
    pub(crate) min_floor_rps: Option<LimitRps>,
    /// How long it lasts, in seconds (at most 30 days).
    pub(crate) ttl_s: OverrideTtl,
}

/// `PUT /v1/overrides/tenants/{tenant}`.
pub(crate) async fn put_tenant(
    State(admin): State<Admin>,
    Path(tenant): Path<String>,
    if_match: IfMatch,
    Json(body): Json<PutTenantOverride>,
) -> Result<(HeaderMap, axum::Json<TenantOverride>), Problem> {
    write::tenant(&tenant)?;
    if body.weight.is_none() && body.burst.is_none() && body.min_floor_rps.is_none() {
        return Err(Problem::unprocessable(
            "needs at least one of `weight`, `burst` or `min_floor_rps`",
        ));
    }
    let over = TenantOverride {
        weight: body.weight,
        burst: body.burst,
        min_floor_rps: body.min_floor_rps,
        expires_at_unix_s: body.ttl_s.expires_at(unix_now()),
    };
    let key = tenant.clone();
    let tag = write::change(&admin, move |config| {
        if_match.check(Some(&overrides_tag(config)))?;
        config.overrides.tenants.insert(key, over);
        Ok(overrides_tag(config))
    })
    .await?;
    tracing::info!(
        tenant,
        ?over,
        ttl_s = body.ttl_s.as_secs(),
        "tenant override set"
    );
    Ok((tag.header(), axum::Json(over)))
}

/// `DELETE /v1/overrides/tenants/{tenant}`: the base values apply at once.
pub(crate) async fn delete_tenant(
    State(admin): State<Admin>,
    Path(tenant): Path<String>,
    if_match: IfMatch,
) -> Result<StatusCode, Problem> {
    let key = tenant.clone();
    write::change(&admin, move |config| {
        if_match.check(Some(&overrides_tag(config)))?;
        config
            .overrides
            .tenants
            .remove(&key)
            .map(drop)
            .ok_or_else(|| Problem::not_found(format!("no override for tenant {key:?}")))
    })
    .await?;
    tracing::info!(tenant, "tenant override removed");
    Ok(StatusCode::NO_CONTENT)
}

/// The tag of the overrides (always present).
fn overrides_tag(config: &Config) -> ETag {
    ETag::of(&config.overrides)
}
