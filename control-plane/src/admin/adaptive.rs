//! `/v1/adaptive`: where every adaptive bucket's limit stands and why it
//! last moved, and the adaptive specs themselves (the limits file's
//! `adaptive:` entries), one bucket at a time.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::Serialize;
use serde_json::{Map, Value};

use super::context::Admin;
use super::etag::{ETag, IfMatch};
use super::extract::{Json, Path};
use super::problem::Problem;
use super::write;
use crate::config::Config;
use crate::control::adaptive::AdaptiveStatus;
use crate::control::adaptive::spec::AdaptiveSpec;
use crate::state::AppState;

/// `GET /v1/adaptive` reply.
#[derive(Debug, Serialize)]
pub(crate) struct AdaptiveReply {
    /// Per adaptive bucket, by bucket.
    pub(crate) buckets: Vec<AdaptiveStatus>,
}

/// `GET /v1/adaptive`.
pub(crate) async fn list(State(state): State<AppState>) -> axum::Json<AdaptiveReply> {
    axum::Json(AdaptiveReply {
        buckets: state.adaptive_status(),
    })
}

/// `GET /v1/adaptive/{bucket}` reply.
#[derive(Debug, Serialize)]
pub(crate) struct AdaptiveBucketReply {
    /// The spec as the limits file holds it (defaults filled in).
    pub(crate) spec: AdaptiveSpec,
    /// Where its limit stands; `null` until a control interval ran with it.
    pub(crate) status: Option<AdaptiveStatus>,
}

/// `GET /v1/adaptive/{bucket}`: the bucket's spec and status (404 if it
/// is not adaptive), with the spec's `ETag`.
pub(crate) async fn get(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
) -> Result<(HeaderMap, axum::Json<AdaptiveBucketReply>), Problem> {
    let config = admin.live().config();
    let spec = config
        .adaptive
        .get(&bucket)
        .cloned()
        .ok_or_else(|| Problem::not_found(format!("bucket {bucket:?} is not adaptive")))?;
    let tag = adaptive_tag(&config, &bucket);
    let status = admin
        .state()
        .adaptive_status()
        .into_iter()
        .find(|status| status.bucket == bucket);
    Ok((
        tag.map(|t| t.header()).unwrap_or_default(),
        axum::Json(AdaptiveBucketReply { spec, status }),
    ))
}

/// `PUT /v1/adaptive/{bucket}`: makes the bucket adaptive, or replaces its
/// spec. The body holds the fields of a limits-file entry (`bucket` may be
/// left out; fields left out take their defaults) and is validated like
/// the file. With `If-Match`, only if the spec's entity tag matches.
pub(crate) async fn put(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
    if_match: IfMatch,
    Json(body): Json<Map<String, Value>>,
) -> Result<(HeaderMap, axum::Json<AdaptiveSpec>), Problem> {
    write::bucket(&bucket)?;
    let spec = parse_spec(&bucket, body)?;
    let name = bucket.clone();
    let stored = spec.clone();
    let tag = write::change(&admin, move |config| {
        if_match.check(adaptive_tag(config, &name).as_ref())?;
        config.adaptive.set(stored);
        Ok(adaptive_tag(config, &name))
    })
    .await?;
    tracing::info!(bucket, ?spec, "adaptive spec set");
    Ok((
        tag.map(|t| t.header()).unwrap_or_default(),
        axum::Json(spec),
    ))
}

/// `DELETE /v1/adaptive/{bucket}`: the bucket's limit is its configured one
/// again from the next control interval. With `If-Match`, only if the
/// spec's entity tag matches.
pub(crate) async fn delete(
    State(admin): State<Admin>,
    Path(bucket): Path<String>,
    if_match: IfMatch,
) -> Result<StatusCode, Problem> {
    let name = bucket.clone();
    write::change(&admin, move |config| {
        if_match.check(adaptive_tag(config, &name).as_ref())?;
        if config.adaptive.remove(&name) {
            Ok(())
        } else {
            Err(Problem::not_found(format!(
                "bucket {name:?} is not adaptive"
            )))
        }
    })
    .await?;
    tracing::info!(bucket, "adaptive spec removed");
    Ok(StatusCode::NO_CONTENT)
}

/// The spec a `PUT` body describes for `bucket`, validated as a limits-file
/// entry; a `bucket` field naming another bucket is refused.
fn parse_spec(bucket: &str, mut body: Map<String, Value>) -> Result<AdaptiveSpec, Problem> {
    match body.get("bucket") {
        None => {
            body.insert("bucket".to_owned(), Value::String(bucket.to_owned()));
        }
        Some(Value::String(named)) if named == bucket => {}
        Some(other) => {
            return Err(Problem::unprocessable(format!(
                "bucket: {other} is not the path's bucket {bucket:?}; leave it out"
            )));
        }
    }
    serde_json::from_value(Value::Object(body))
        .map_err(|err| Problem::unprocessable(err.to_string()))
}

/// The tag of bucket `bucket`'s adaptive spec, if it is adaptive.
fn adaptive_tag(config: &Config, bucket: &str) -> Option<ETag> {
    config.adaptive.get(bucket).map(ETag::of)
}
