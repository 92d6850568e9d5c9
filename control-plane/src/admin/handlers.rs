//! Admin API handlers.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};

use super::context::Admin;
use super::etag::{ETag, IfMatch};
use super::extract::{Json, Path};
use super::problem::Problem;
use super::write;
use crate::config::Config;
use crate::config::budget::Budget;
use crate::config::limits::{Limit, LimitRule};
use crate::config::overrides::LimitOverride;
use crate::control::controller::BucketStatus;
use crate::metrics;
use crate::state::AppState;
use crate::types::LimitRps;

/// The OpenAPI 3 description of this API (`control-plane/openapi.json`).
pub const OPENAPI_JSON: &str = include_str!("../../openapi.json");

/// `GET /healthz` reply.
#[derive(Debug, Serialize)]
pub(crate) struct Health {
    /// Always `"ok"`: answering at all is the signal.
    pub(crate) status: &'static str,
}

/// `GET /healthz`.
pub(crate) async fn healthz() -> axum::Json<Health> {
    axum::Json(Health { status: "ok" })
}

/// `GET /metrics`: the Prometheus exposition (OpenMetrics text).
pub(crate) async fn metrics(State(admin): State<Admin>) -> Result<impl IntoResponse, Problem> {
    let encoded = admin.state().metrics().encode().and_then(|main| {
        // Two registries, one exposition: a single `# EOF`, at the end.
        let reloads = admin.live().reload_metrics().encode()?;
        let main = main.strip_suffix("# EOF\n").unwrap_or(&main);
        Ok(format!("{main}{reloads}"))
    });
    let text = encoded.map_err(|err| {
        // Encoding into a String only fails if a metric's own encoder does.
        tracing::error!(%err, "encoding metrics");
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "could not encode metrics",
        )
    })?;
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text))
}

/// `GET /v1/openapi.json`: the description of this API.
pub(crate) async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON)
}

/// `GET /v1/buckets` reply.
#[derive(Debug, Serialize)]
pub struct BucketsReply {
    /// This process's epoch.
    pub(crate) epoch: u64,
    /// The control interval.
    pub(crate) control_interval_ms: u64,
    /// Buckets with traffic, sorted by bucket.
    pub(crate) buckets: std::sync::Arc<[BucketStatus]>,
}

/// `GET /v1/buckets`.
pub(crate) async fn buckets(State(state): State<AppState>) -> axum::Json<BucketsReply> {
    axum::Json(BucketsReply {
        epoch: state.epoch(),
        control_interval_ms: state.control_interval().as_millis(),
        buckets: state.buckets(),
    })
}

/// `GET /v1/limits` reply.
#[derive(Debug, Serialize)]
pub struct LimitsReply {
    /// Limit for buckets no rule names; null = unlimited (or a budget).
    pub(crate) default_limit_rps: Option<LimitRps>,
    /// Budget for buckets no rule names, when the default is one; left
    /// out otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) default_budget: Option<Budget>,
    /// Limits in force (overrides included): exact limits sorted by bucket,
    /// then patterns in file order.
    pub(crate) limits: Vec<LimitRule>,
    /// Temporary limits by bucket, with their deadlines; left out when
    /// there are none.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub(crate) overrides: std::collections::BTreeMap<String, LimitOverride>,
}

/// `GET /v1/limits`.
pub(crate) async fn limits(State(admin): State<Admin>) -> axum::Json<LimitsReply> {
    let overrides = admin.live().config().overrides.limits;
    let policy = admin.state().policy();
    let limits = &policy.limits;
    let default = limits.default_limit();
    axum::Json(LimitsReply {
        default_limit_rps: match default {
            Some(Limit::Rps(rps)) => Some(*rps),
            _ => None,
        },
        default_budget: default.and_then(Limit::budget).cloned(),
        limits: limits.rules(),
        overrides,
    })
}

/// `PUT /v1/limits/{bucket}` body: `limit_rps` or `budget`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutLimit {
    /// A limit in requests per second.
    #[serde(default)]
    pub(crate) limit_rps: Option<LimitRps>,
    /// A cost budget instead.
    #[serde(default)]
    pub(crate) budget: Option<Budget>,
}

impl PutLimit {
    /// The one limit the body gives.
    fn limit(self) -> Result<Limit, Problem> {
        match (self.limit_rps, self.budget) {
            (Some(rps), None) => Ok(Limit::Rps(rps)),
            (None, Some(budget)) => Ok(Limit::Budget(budget)),
            (Some(_), Some(_)) => Err(Problem::unprocessable(
                "give `limit_rps` or `budget`, not both",
            )),
            (None, None) => Err(Problem::unprocessable(
                "needs `limit_rps` (requests per second) or `budget` (a cost budget)",
            )),
        }
    }
}

/// `PUT /v1/limits/{bucket}` and `GET /v1/limits/{bucket}` reply.
#[derive(Debug, Serialize)]
pub struct LimitReply {
    /// The bucket.
    pub(crate) bucket: String,
    /// Its limit now: `limit_rps` or `budget`.
    #[serde(flatten)]
    pub(crate) limit: Limit,
}

/// `GET /v1/limits/{bucket}`: the bucket's exact limit (404 if it has
/// none; a pattern's limit belongs to the pattern), with its `ETag`.
pub(crate) async fn get_limit(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
) -> Result<(HeaderMap, axum::Json<LimitReply>), Problem> {
    let config = admin.live().config();
    let limit = config
        .limits
        .exact(&bucket)
        .cloned()
        .ok_or_else(|| Problem::not_found(format!("no exact limit for bucket {bucket:?}")))?;
    let tag = limit_tag(&config, &bucket);
    Ok((
        tag.map(|t| t.header()).unwrap_or_default(),
        axum::Json(LimitReply { bucket, limit }),
    ))
}

/// `PUT /v1/limits/{bucket}`: persisted, and in force from the next control
/// interval (unless an override for the bucket is in force). With
/// `If-Match`, only if the limit's entity tag matches.
pub(crate) async fn put_limit(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
    if_match: IfMatch,
    Json(body): Json<PutLimit>,
) -> Result<(HeaderMap, axum::Json<LimitReply>), Problem> {
    write::bucket(&bucket)?;
    let limit = body.limit()?;
    let key = bucket.clone();
    let set = limit.clone();
    let (previous, tag) = write::change(&admin, move |config| {
        if_match.check(limit_tag(config, &key).as_ref())?;
        let previous = config.limits.set_exact(key.clone(), set);
        Ok((previous, limit_tag(config, &key)))
    })
    .await?;
    tracing::info!(bucket, limit = %limit, previous = ?previous.map(|p| p.to_string()), "limit set");
    Ok((
        tag.map(|t| t.header()).unwrap_or_default(),
        axum::Json(LimitReply { bucket, limit }),
    ))
}

/// `DELETE /v1/limits/{bucket}`: only exact limits can be removed. With
/// `If-Match`, only if the limit's entity tag matches.
pub(crate) async fn delete_limit(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
    if_match: IfMatch,
) -> Result<StatusCode, Problem> {
    let key = bucket.clone();
    let previous = write::change(&admin, move |config| {
        if_match.check(limit_tag(config, &key).as_ref())?;
        config
            .limits
            .remove_exact(&key)
            .ok_or_else(|| Problem::not_found(format!("no exact limit for bucket {key:?}")))
    })
    .await?;
    tracing::info!(bucket, previous = %previous, "limit removed");
    Ok(StatusCode::NO_CONTENT)
}

/// Unknown paths.
pub(crate) async fn not_found() -> impl IntoResponse {
    Problem::not_found("no such resource")
}

/// Known paths with an unsupported method.
pub(crate) async fn method_not_allowed() -> impl IntoResponse {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed for this resource",
    )
}

/// The tag of bucket `bucket`'s exact limit, if it has one.
fn limit_tag(config: &Config, bucket: &str) -> Option<ETag> {
    config.limits.exact(bucket).map(|limit| {
        ETag::of(&LimitReply {
            bucket: bucket.to_owned(),
            limit: limit.clone(),
        })
    })
}
