//! `/v1/tenants`: weights, bursts and floors of tenants.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::Serialize;

use super::context::Admin;
use super::etag::{ETag, IfMatch};
use super::extract::{Json, Path};
use super::problem::Problem;
use super::write;
use crate::config::Config;
use crate::config::overrides::TenantOverride;
use crate::config::policy::TenantPolicy;

/// `GET /v1/tenants` reply.
#[derive(Debug, Serialize)]
pub(crate) struct TenantsReply {
    /// Policies in force (overrides included) by tenant; the `default`
    /// entry applies to tenants not listed.
    pub(crate) tenants: BTreeMap<String, TenantPolicy>,
    /// Temporary tenant values, with their deadlines.
    pub(crate) overrides: BTreeMap<String, TenantOverride>,
}

/// `GET /v1/tenants`.
pub(crate) async fn list(State(admin): State<Admin>) -> axum::Json<TenantsReply> {
    let overrides = admin.live().config().overrides.tenants;
    let policy = admin.state().policy();
    let tenants = policy
        .tenants
        .iter()
        .map(|(name, policy)| (name.clone(), *policy))
        .collect();
    axum::Json(TenantsReply { tenants, overrides })
}

/// `PUT /v1/tenants/{tenant}` and `GET /v1/tenants/{tenant}` reply.
#[derive(Debug, Serialize)]
pub(crate) struct TenantReply {
    /// The tenant.
    pub(crate) tenant: String,
    /// Its base policy now.
    #[serde(flatten)]
    pub(crate) policy: TenantPolicy,
}

/// `GET /v1/tenants/{tenant}`: the tenant's own policy (404 if it has
/// none and follows `default`), with its `ETag`.
pub(crate) async fn get(
    State(admin): State<Admin>,
    Path(tenant): Path<String>,
) -> Result<(HeaderMap, axum::Json<TenantReply>), Problem> {
    let config = admin.live().config();
    let policy = config
        .tenants
        .get(&tenant)
        .ok_or_else(|| Problem::not_found(format!("no tenant {tenant:?} configured")))?;
    let tag = tenant_tag(&config, &tenant);
    Ok((
        tag.map(|t| t.header()).unwrap_or_default(),
        axum::Json(TenantReply { tenant, policy }),
    ))
}

/// `PUT /v1/tenants/{tenant}`: sets the tenant's whole policy (fields left
/// out take their defaults: weight 1, burst 1, floor 0). With `If-Match`,
/// only if the tenant's entity tag matches.
pub(crate) async fn put(
    State(admin): State<Admin>,
    Path(tenant): Path<String>,
    if_match: IfMatch,
    Json(policy): Json<TenantPolicy>,
) -> Result<(HeaderMap, axum::Json<TenantReply>), Problem> {
    write::tenant(&tenant)?;
    let name = tenant.clone();
    let tag = write::change(&admin, move |config| {
        if_match.check(tenant_tag(config, &name).as_ref())?;
        config.tenants.insert(name.clone(), policy);
        Ok(tenant_tag(config, &name))
    })
    .await?;
    tracing::info!(tenant, ?policy, "tenant set");
    Ok((
        tag.map(|t| t.header()).unwrap_or_default(),
        axum::Json(TenantReply { tenant, policy }),
    ))
}

/// `DELETE /v1/tenants/{tenant}`: the tenant falls back to `default`.
/// With `If-Match`, only if the tenant's entity tag matches.
pub(crate) async fn delete(
    State(admin): State<Admin>,
    Path(tenant): Path<String>,
    if_match: IfMatch,
) -> Result<StatusCode, Problem> {
    let name = tenant.clone();
    write::change(&admin, move |config| {
        if_match.check(tenant_tag(config, &name).as_ref())?;
        if config.tenants.remove(&name) {
            Ok(())
        } else {
            Err(Problem::not_found(format!("no tenant {name:?} configured")))
        }
    })
    .await?;
    tracing::info!(tenant, "tenant removed");
    Ok(StatusCode::NO_CONTENT)
}

/// The tag of `tenant`'s configured policy, if it has one.
fn tenant_tag(config: &Config, tenant: &str) -> Option<ETag> {
    config.tenants.get(tenant).map(|policy| {
        ETag::of(&TenantReply {
            tenant: tenant.to_owned(),
            policy,
        })
    })
}
