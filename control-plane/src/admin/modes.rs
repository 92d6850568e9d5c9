//! `/v1/modes`, `/v1/kill-switch`, `/v1/canary`: the rollout state.
//!
//! Every write answers with the modes now configured and their `ETag`;
//! with `If-Match`, a write goes ahead only if the rollout state's entity
//! tag matches (the kill switch and the canary are part of it).

use axum::extract::State;
use axum::http::HeaderMap;
use serde::Deserialize;

use super::context::Admin;
use super::etag::{ETag, IfMatch};
use super::extract::{Json, Path};
use super::problem::Problem;
use super::write;
use crate::config::Config;
use crate::config::policy::{Fraction, Mode, Modes};

/// Modes with their entity tag.
type Reply = (HeaderMap, axum::Json<Modes>);

/// `GET /v1/modes`, with its `ETag`.
pub(crate) async fn get(State(admin): State<Admin>) -> Reply {
    let config = admin.live().config();
    (modes_tag(&config).header(), axum::Json(config.modes))
}

/// `PUT /v1/modes`: replaces the whole rollout state (fields left out take
/// their defaults: enforce, no per-bucket modes, kill switch off, no canary).
pub(crate) async fn put(
    State(admin): State<Admin>,
    if_match: IfMatch,
    Json(modes): Json<Modes>,
) -> Result<Reply, Problem> {
    for bucket in modes.buckets.keys() {
        write::bucket(bucket)?;
    }
    let reply = modify(&admin, if_match, move |current| {
        *current = modes;
        Ok(())
    })
    .await?;
    // Audit lines follow the write: a refused one changed nothing.
    tracing::info!(modes = ?reply.1.0, "modes set");
    Ok(reply)
}

/// `PUT /v1/modes/buckets/{bucket}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PutBucketMode {
    /// `shadow` or `enforce`.
    pub(crate) mode: Mode,
}

/// `PUT /v1/modes/buckets/{bucket}`.
pub(crate) async fn put_bucket(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
    if_match: IfMatch,
    Json(body): Json<PutBucketMode>,
) -> Result<Reply, Problem> {
    write::bucket(&bucket)?;
    let key = bucket.clone();
    let reply = modify(&admin, if_match, move |modes| {
        modes.buckets.insert(key, body.mode);
        Ok(())
    })
    .await?;
    tracing::info!(bucket, mode = ?body.mode, "bucket mode set");
    Ok(reply)
}

/// `DELETE /v1/modes/buckets/{bucket}`: the bucket follows the default mode.
pub(crate) async fn delete_bucket(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
    if_match: IfMatch,
) -> Result<Reply, Problem> {
    let key = bucket.clone();
    let reply = modify(&admin, if_match, move |modes| {
        modes
            .buckets
            .remove(&key)
            .map(drop)
            .ok_or_else(|| Problem::not_found(format!("no mode set for bucket {key:?}")))
    })
    .await?;
    tracing::info!(bucket, "bucket mode removed");
    Ok(reply)
}

/// `PUT /v1/kill-switch` (no body): every proxy shadows every bucket.
pub(crate) async fn kill_switch_on(
    State(admin): State<Admin>,
    if_match: IfMatch,
) -> Result<Reply, Problem> {
    let reply = set_kill_switch(&admin, if_match, true).await?;
    tracing::warn!("kill switch on: proxies stop rejecting");
    Ok(reply)
}

/// `DELETE /v1/kill-switch`: the configured modes apply again.
pub(crate) async fn kill_switch_off(
    State(admin): State<Admin>,
    if_match: IfMatch,
) -> Result<Reply, Problem> {
    let reply = set_kill_switch(&admin, if_match, false).await?;
    tracing::warn!("kill switch off: configured modes apply");
    Ok(reply)
}

async fn set_kill_switch(admin: &Admin, if_match: IfMatch, on: bool) -> Result<Reply, Problem> {
    modify(admin, if_match, move |modes| {
        modes.kill_switch = on;
        Ok(())
    })
    .await
}

/// `PUT /v1/canary` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PutCanary {
    /// Fraction of proxies that enforce, `0 ..= 1`.
    pub(crate) canary_fraction: Fraction,
}

/// `PUT /v1/canary`.
pub(crate) async fn put_canary(
    State(admin): State<Admin>,
    if_match: IfMatch,
    Json(body): Json<PutCanary>,
) -> Result<Reply, Problem> {
    let reply = modify(&admin, if_match, move |modes| {
        modes.canary_fraction = Some(body.canary_fraction);
        Ok(())
    })
    .await?;
    tracing::info!(fraction = body.canary_fraction.get(), "canary fraction set");
    Ok(reply)
}

/// `DELETE /v1/canary`: every proxy follows the modes.
pub(crate) async fn delete_canary(
    State(admin): State<Admin>,
    if_match: IfMatch,
) -> Result<Reply, Problem> {
    let reply = modify(&admin, if_match, |modes| {
        modes.canary_fraction = None;
        Ok(())
    })
    .await?;
    tracing::info!("canary fraction removed");
    Ok(reply)
}

async fn modify(
    admin: &Admin,
    if_match: IfMatch,
    change: impl FnOnce(&mut Modes) -> Result<(), Problem> + Send + 'static,
) -> Result<Reply, Problem> {
    let (modes, tag) = write::change(admin, move |config| {
        if_match.check(Some(&modes_tag(config)))?;
        change(&mut config.modes)?;
        Ok((config.modes.clone(), modes_tag(config)))
    })
    .await?;
    Ok((tag.header(), axum::Json(modes)))
}

/// The tag of the rollout state (always present).
fn modes_tag(config: &Config) -> ETag {
    ETag::of(&config.modes)
}
