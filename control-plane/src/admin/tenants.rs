//! `/v1/tenants`: weights, bursts and floors of tenants.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;

use super::extract::{Json, Path};
use super::problem::Problem;
use super::{Admin, write};
use crate::overrides::TenantOverride;
use crate::policy::TenantPolicy;

/// `GET /v1/tenants` reply.
#[derive(Debug, Serialize)]
pub struct TenantsReply {
    /// Policies in force (overrides included) by tenant; the `default`
    /// entry applies to tenants not listed.
    pub tenants: BTreeMap<String, TenantPolicy>,
    /// Temporary tenant values, with their deadlines.
    pub overrides: BTreeMap<String, TenantOverride>,
}

/// `GET /v1/tenants`.
pub async fn list(State(admin): State<Admin>) -> axum::Json<TenantsReply> {
    let overrides = admin.live().config().overrides.tenants;
    let policy = admin.state().policy();
    let tenants = policy
        .tenants
        .iter()
        .map(|(name, policy)| (name.clone(), *policy))
        .collect();
    axum::Json(TenantsReply { tenants, overrides })
}

/// `PUT /v1/tenants/{tenant}` reply.
#[derive(Debug, Serialize)]
pub struct TenantReply {
    /// The tenant.
    pub tenant: String,
    /// Its base policy now.
    #[serde(flatten)]
    pub policy: TenantPolicy,
}

/// `PUT /v1/tenants/{tenant}`: sets the tenant's whole policy (fields left
/// out take their defaults: weight 1, burst 1, floor 0).
pub async fn put(
    State(admin): State<Admin>,
    Path(tenant): Path<String>,
    Json(policy): Json<TenantPolicy>,
) -> Result<axum::Json<TenantReply>, Problem> {
    write::tenant(&tenant)?;
    let name = tenant.clone();
    write::change(&admin, move |config| {
        config.tenants.insert(name, policy);
        Ok(())
    })
    .await?;
    tracing::info!(tenant, ?policy, "tenant set");
    Ok(axum::Json(TenantReply { tenant, policy }))
}

/// `DELETE /v1/tenants/{tenant}`: the tenant falls back to `default`.
pub async fn delete(
    State(admin): State<Admin>,
    Path(tenant): Path<String>,
) -> Result<StatusCode, Problem> {
    let name = tenant.clone();
    write::change(&admin, move |config| {
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
