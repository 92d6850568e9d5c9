//! The admin HTTP API (JSON; errors as RFC 9457 problem details).

mod extract;
mod handlers;
pub mod problem;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, put};

pub use handlers::{BucketsReply, LimitReply, LimitsReply, PutLimit};

use crate::state::AppState;

/// Request bodies are tiny JSON objects; anything larger is refused (413).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The admin API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(handlers::healthz))
        .route("/metrics", get(handlers::metrics))
        .route("/v1/buckets", get(handlers::buckets))
        .route("/v1/limits", get(handlers::limits))
        .route(
            "/v1/limits/{bucket}",
            put(handlers::put_limit).delete(handlers::delete_limit),
        )
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
