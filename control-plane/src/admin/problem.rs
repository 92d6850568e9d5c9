//! RFC 9457 problem details: every admin API error is one of these, served
//! as `application/problem+json`.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The media type of problem details.
pub(crate) const CONTENT_TYPE: &str = "application/problem+json";

/// An error response body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Problem {
    /// `about:blank`: the status code says it all and `detail` explains.
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    /// The status code's reason phrase, as RFC 9457 asks for `about:blank`.
    pub(crate) title: String,
    /// The HTTP status code.
    pub(crate) status: u16,
    /// What was wrong with this request.
    pub(crate) detail: String,
}

impl Problem {
    /// A problem with the given status and explanation.
    pub(crate) fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            kind: "about:blank",
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
        }
    }

    /// 404 with an explanation.
    pub(crate) fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, detail)
    }

    /// 422: well-formed but unacceptable.
    pub(crate) fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, detail)
    }

    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status_code();
        let mut response = (status, axum::Json(self)).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        response
    }
}

// axum's own rejections are plain text; keep their status code (400 syntax,
// 413 too large, 415 wrong content type, 422 wrong shape) and message.
impl From<JsonRejection> for Problem {
    fn from(rejection: JsonRejection) -> Self {
        Self::new(rejection.status(), rejection.body_text())
    }
}

impl From<PathRejection> for Problem {
    fn from(rejection: PathRejection) -> Self {
        Self::new(rejection.status(), rejection.body_text())
    }
}
