//! Applying a change to the configuration from a handler.

use axum::http::StatusCode;

use super::context::Admin;
use super::problem::Problem;
use crate::config::Config;
use crate::config::live::PersistError;
use crate::config::overrides::unix_now;
use crate::config::shared::SharedConfigError;
use crate::types::{validate_bucket, validate_tenant};

impl From<PersistError> for Problem {
    fn from(err: PersistError) -> Self {
        tracing::error!(%err, "admin change not applied");
        let status = match err {
            PersistError::FileInvalid(_)
            | PersistError::FileChanging
            | PersistError::Store(SharedConfigError::Conflict) => StatusCode::CONFLICT,
            PersistError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
            PersistError::Render(_)
            | PersistError::Write { .. }
            | PersistError::StoredInvalid(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Problem::new(status, format!("the change was not applied: {err}"))
    }
}

/// Runs `change` on a copy of the configuration; persists and applies it if
/// it succeeds. File I/O runs off the async workers.
pub(crate) async fn change<T: Send + 'static>(
    admin: &Admin,
    change: impl FnOnce(&mut Config) -> Result<T, Problem> + Send + 'static,
) -> Result<T, Problem> {
    let live = std::sync::Arc::clone(admin.live());
    tokio::task::spawn_blocking(move || live.update(unix_now(), change))
        .await
        .map_err(|err| {
            tracing::error!(%err, "admin change task failed");
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the change was not applied",
            )
        })?
}

/// Checks a bucket key from a path.
pub(crate) fn bucket(bucket: &str) -> Result<(), Problem> {
    validate_bucket(bucket).map_err(|err| Problem::unprocessable(format!("bucket {err}")))
}

/// Checks a tenant name from a path.
pub(crate) fn tenant(tenant: &str) -> Result<(), Problem> {
    validate_tenant(tenant).map_err(|err| Problem::unprocessable(format!("tenant {err}")))
}
