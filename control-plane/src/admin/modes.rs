//! `/v1/modes`, `/v1/kill-switch`, `/v1/canary`: the rollout state.
//!
//! Every write answers with the modes now configured.

use axum::extract::State;
use serde::Deserialize;

use super::extract::{Json, Path};
use super::problem::Problem;
use super::{Admin, write};
use crate::policy::{Fraction, Mode, Modes};

/// `GET /v1/modes`.
pub async fn get(State(admin): State<Admin>) -> axum::Json<Modes> {
    axum::Json(admin.state().policy().modes.clone())
}

/// `PUT /v1/modes`: replaces the whole rollout state (fields left out take
/// their defaults: enforce, no per-bucket modes, kill switch off, no canary).
pub async fn put(
    State(admin): State<Admin>,
    Json(modes): Json<Modes>,
) -> Result<axum::Json<Modes>, Problem> {
    for bucket in modes.buckets.keys() {
        write::bucket(bucket)?;
    }
    let reply = modes.clone();
    write::change(&admin, move |config| {
        config.modes = modes;
        Ok(())
    })
    .await?;
    tracing::info!(modes = ?reply, "modes set");
    Ok(axum::Json(reply))
}

/// `PUT /v1/modes/buckets/{bucket}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutBucketMode {
    /// `shadow` or `enforce`.
    pub mode: Mode,
}

/// `PUT /v1/modes/buckets/{bucket}`.
pub async fn put_bucket(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
    Json(body): Json<PutBucketMode>,
) -> Result<axum::Json<Modes>, Problem> {
    write::bucket(&bucket)?;
    tracing::info!(bucket, mode = ?body.mode, "bucket mode set");
    modify(&admin, move |modes| {
        modes.buckets.insert(bucket, body.mode);
        Ok(())
    })
    .await
}

/// `DELETE /v1/modes/buckets/{bucket}`: the bucket follows the default mode.
pub async fn delete_bucket(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
) -> Result<axum::Json<Modes>, Problem> {
    tracing::info!(bucket, "bucket mode removed");
    modify(&admin, move |modes| {
        modes
            .buckets
            .remove(&bucket)
            .map(drop)
            .ok_or_else(|| Problem::not_found(format!("no mode set for bucket {bucket:?}")))
    })
    .await
}

/// `PUT /v1/kill-switch` (no body): every proxy shadows every bucket.
pub async fn kill_switch_on(State(admin): State<Admin>) -> Result<axum::Json<Modes>, Problem> {
    tracing::warn!("kill switch on: proxies stop rejecting");
    set_kill_switch(&admin, true).await
}

/// `DELETE /v1/kill-switch`: the configured modes apply again.
pub async fn kill_switch_off(State(admin): State<Admin>) -> Result<axum::Json<Modes>, Problem> {
    tracing::warn!("kill switch off: configured modes apply");
    set_kill_switch(&admin, false).await
}

async fn set_kill_switch(admin: &Admin, on: bool) -> Result<axum::Json<Modes>, Problem> {
    modify(admin, move |modes| {
        modes.kill_switch = on;
        Ok(())
    })
    .await
}

/// `PUT /v1/canary` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutCanary {
    /// Fraction of proxies that enforce, `0 ..= 1`.
    pub canary_fraction: Fraction,
}

/// `PUT /v1/canary`.
pub async fn put_canary(
    State(admin): State<Admin>,
    Json(body): Json<PutCanary>,
) -> Result<axum::Json<Modes>, Problem> {
    tracing::info!(fraction = body.canary_fraction.get(), "canary fraction set");
    modify(&admin, move |modes| {
        modes.canary_fraction = Some(body.canary_fraction);
        Ok(())
    })
    .await
}

/// `DELETE /v1/canary`: every proxy follows the modes.
pub async fn delete_canary(State(admin): State<Admin>) -> Result<axum::Json<Modes>, Problem> {
    tracing::info!("canary fraction removed");
    modify(&admin, |modes| {
        modes.canary_fraction = None;
        Ok(())
    })
    .await
}

async fn modify(
    admin: &Admin,
    change: impl FnOnce(&mut Modes) -> Result<(), Problem> + Send + 'static,
) -> Result<axum::Json<Modes>, Problem> {
    let modes = write::change(admin, move |config| {
        change(&mut config.modes)?;
        Ok(config.modes.clone())
    })
    .await?;
    Ok(axum::Json(modes))
}
