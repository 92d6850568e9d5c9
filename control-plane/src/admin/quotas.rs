//! `GET /v1/quotas/{domain}?KEY=VALUE&…`: where a descriptor's exact quota
//! stands, read without counting a hit.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;

use super::context::Admin;
use super::extract::Path;
use super::problem::Problem;
use crate::quotas::{QuotaRead, ReadError};

/// `GET /v1/quotas/{domain}`: the query's parameters, in order, are the
/// descriptor's entries (`?plan=free&user=bob`).
pub(super) async fn read(
    State(admin): State<Admin>,
    Path(domain): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<axum::Json<QuotaRead>, Problem> {
    let Query(entries) =
        query.map_err(|err| Problem::new(StatusCode::BAD_REQUEST, err.body_text()))?;
    let Some(quotas) = admin.quotas() else {
        return Err(Problem::not_found(
            "this control plane serves no exact quotas (start it with --quotas)",
        ));
    };
    match quotas.read(&domain, &entries).await {
        Ok(read) => Ok(axum::Json(read)),
        Err(err @ (ReadError::UnknownDomain(_) | ReadError::NoLimit(_))) => {
            Err(Problem::not_found(err.to_string()))
        }
        Err(err @ ReadError::Entries { .. }) => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            format!("{err}: give them as query parameters, ?KEY=VALUE&…"),
        )),
        Err(ReadError::Store(err)) => Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read the counter: {err}"),
        )),
    }
}
