//! Admin API handlers.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};

use super::extract::{Json, Path};
use super::problem::Problem;
use crate::controller::BucketStatus;
use crate::limits::LimitRule;
use crate::metrics;
use crate::state::AppState;
use crate::types::{LimitRps, validate_bucket};

/// `GET /healthz` reply.
#[derive(Debug, Serialize)]
pub struct Health {
    /// Always `"ok"`: answering at all is the signal.
    pub status: &'static str,
}

/// `GET /healthz`.
pub async fn healthz() -> axum::Json<Health> {
    axum::Json(Health { status: "ok" })
}

/// `GET /metrics`: the Prometheus exposition (OpenMetrics text).
pub async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, Problem> {
    let text = state.metrics().encode().map_err(|err| {
        // Encoding into a String only fails if a metric's own encoder does.
        tracing::error!(%err, "encoding metrics");
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "could not encode metrics",
        )
    })?;
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text))
}

/// `GET /v1/buckets` reply.
#[derive(Debug, Serialize)]
pub struct BucketsReply {
    /// This process's epoch.
    pub epoch: u64,
    /// The control interval.
    pub control_interval_ms: u64,
    /// Buckets with traffic, sorted by bucket.
    pub buckets: std::sync::Arc<[BucketStatus]>,
}

/// `GET /v1/buckets`.
pub async fn buckets(State(state): State<AppState>) -> axum::Json<BucketsReply> {
    axum::Json(BucketsReply {
        epoch: state.epoch(),
        control_interval_ms: state.control_interval().as_millis(),
        buckets: state.buckets(),
    })
}

/// `GET /v1/limits` reply.
#[derive(Debug, Serialize)]
pub struct LimitsReply {
    /// Limit for buckets no rule names; null = unlimited.
    pub default_limit_rps: Option<LimitRps>,
    /// Exact limits sorted by bucket, then patterns in file order.
    pub limits: Vec<LimitRule>,
}

/// `GET /v1/limits`.
pub async fn limits(State(state): State<AppState>) -> axum::Json<LimitsReply> {
    let policy = state.policy();
    let limits = &policy.limits;
    axum::Json(LimitsReply {
        default_limit_rps: limits.default_limit(),
        limits: limits.rules(),
    })
}

/// `PUT /v1/limits/{bucket}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutLimit {
    /// The new limit.
    pub limit_rps: LimitRps,
}

/// `PUT /v1/limits/{bucket}` reply.
#[derive(Debug, Serialize)]
pub struct LimitReply {
    /// The bucket.
    pub bucket: String,
    /// Its limit now.
    pub limit_rps: LimitRps,
}

/// `PUT /v1/limits/{bucket}`: in force from the next control interval.
pub async fn put_limit(
    State(state): State<AppState>,
    Path(bucket): Path<String>,
    Json(body): Json<PutLimit>,
) -> Result<axum::Json<LimitReply>, Problem> {
    validate_bucket(&bucket).map_err(|err| Problem::unprocessable(format!("bucket {err}")))?;
    let previous = state
        .policy_mut()
        .limits
        .set_exact(bucket.clone(), body.limit_rps);
    tracing::info!(bucket, limit_rps = %body.limit_rps, previous = ?previous.map(LimitRps::get), "limit set");
    Ok(axum::Json(LimitReply {
        bucket,
        limit_rps: body.limit_rps,
    }))
}

/// `DELETE /v1/limits/{bucket}`: only exact limits can be removed.
pub async fn delete_limit(
    State(state): State<AppState>,
    Path(bucket): Path<String>,
) -> Result<StatusCode, Problem> {
    match state.policy_mut().limits.remove_exact(&bucket) {
        Some(previous) => {
            tracing::info!(bucket, previous = %previous, "limit removed");
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(Problem::not_found(format!(
            "no exact limit for bucket {bucket:?}"
        ))),
    }
}

/// Unknown paths.
pub async fn not_found() -> impl IntoResponse {
    Problem::not_found("no such resource")
}

/// Known paths with an unsupported method.
pub async fn method_not_allowed() -> impl IntoResponse {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed for this resource",
    )
}
