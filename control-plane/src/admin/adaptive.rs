//! `GET /v1/adaptive`: where every adaptive bucket's limit stands and why
//! it last moved.

use axum::extract::State;
use serde::Serialize;

use crate::control::adaptive::AdaptiveStatus;
use crate::serve::state::AppState;

/// `GET /v1/adaptive` reply.
#[derive(Debug, Serialize)]
pub struct AdaptiveReply {
    /// Per adaptive bucket, by bucket.
    pub buckets: Vec<AdaptiveStatus>,
}

/// `GET /v1/adaptive`.
pub async fn list(State(state): State<AppState>) -> axum::Json<AdaptiveReply> {
    axum::Json(AdaptiveReply {
        buckets: state.adaptive_status(),
    })
}
