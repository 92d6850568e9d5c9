//! A small client for the admin API.

use std::path::Path;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::admin::auth::{Token, TokenError};

/// Why a `sluice ctl` command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CtlError {
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// The token could not be loaded.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The admin API could not be reached or answered garbage.
    #[error("{0}")]
    Http(String),
    /// The admin API refused the request.
    #[error("{status}: {detail}")]
    Refused {
        /// The status code.
        status: StatusCode,
        /// The problem's `detail` (or the body).
        detail: String,
    },
}

/// Environment variable holding the admin token for `sluice ctl`.
const TOKEN_ENV: &str = "SLUICE_ADMIN_TOKEN";

/// How long one call may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Admin API client.
#[derive(Debug)]
pub(crate) struct Client {
    base: String,
    token: Option<Token>,
    http: HttpClient<HttpConnector, Full<Bytes>>,
    /// Sent as `If-Match` with every write (`sluice ctl --if-match`).
    if_match: Option<String>,
}

impl Client {
    /// A client for the API at `url`, with the token from `token_file` or,
    /// without one, from `SLUICE_ADMIN_TOKEN` if set.
    pub(super) fn new(url: &str, token_file: Option<&Path>) -> Result<Self, CtlError> {
        let token = match token_file {
            Some(path) => Some(Token::from_file(path)?),
            None if std::env::var_os(TOKEN_ENV).is_some() => Some(Token::from_env(TOKEN_ENV)?),
            None => None,
        };
        let base = url.trim_end_matches('/');
        match base.parse::<Uri>() {
            Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
            _ => {
                return Err(CtlError::Usage(format!(
                    "--url {url:?}: expected http://HOST:PORT (the admin API speaks plain HTTP)"
                )));
            }
        }
        let http = HttpClient::builder(TokioExecutor::new()).build_http();
        Ok(Self {
            base: base.to_owned(),
            token,
            http,
            if_match: None,
        })
    }

    /// Every write from now on carries `If-Match: tag` (412 if the
    /// resource changed since the tag was read).
    #[must_use]
    pub(crate) fn with_if_match(mut self, tag: Option<String>) -> Self {
        self.if_match = tag;
        self
    }

    /// GET; the reply body.
    pub(super) async fn get(&self, path: &str) -> Result<Option<Value>, CtlError> {
        Ok(self.call(Method::GET, path, None, None).await?.0)
    }

    /// GET; the reply body and its `ETag`.
    pub(crate) async fn get_tagged(
        &self,
        path: &str,
    ) -> Result<(Option<Value>, Option<String>), CtlError> {
        self.call(Method::GET, path, None, None).await
    }

    /// PUT with an optional JSON body.
    pub(super) async fn put(
        &self,
        path: &str,
        body: Option<Value>,
    ) -> Result<Option<Value>, CtlError> {
        let tag = self.if_match.as_deref();
        Ok(self.call(Method::PUT, path, body, tag).await?.0)
    }

    /// PUT with `If-Match: tag` (a read-modify-write of one resource).
    pub(crate) async fn put_if(
        &self,
        path: &str,
        body: Option<Value>,
        tag: Option<&str>,
    ) -> Result<Option<Value>, CtlError> {
        Ok(self.call(Method::PUT, path, body, tag).await?.0)
    }

    /// POST with a JSON body (a question, not a change: no `If-Match`).
    pub(super) async fn post(&self, path: &str, body: Value) -> Result<Option<Value>, CtlError> {
        Ok(self.call(Method::POST, path, Some(body), None).await?.0)
    }

    /// DELETE.
    pub(super) async fn delete(&self, path: &str) -> Result<Option<Value>, CtlError> {
        let tag = self.if_match.as_deref();
        Ok(self.call(Method::DELETE, path, None, tag).await?.0)
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        if_match: Option<&str>,
    ) -> Result<(Option<Value>, Option<String>), CtlError> {
        let url = format!("{}{path}", self.base);
        let uri: Uri = url
            .parse()
            .map_err(|err| CtlError::Usage(format!("{url}: {err}")))?;
        let mut request = Request::builder().method(method.clone()).uri(uri);
        if let Some(token) = &self.token {
            let mut value = b"Bearer ".to_vec();
            value.extend_from_slice(token.expose());
            let mut header = HeaderValue::from_bytes(&value)
                .map_err(|_| CtlError::Usage("the token is not a valid header value".into()))?;
            header.set_sensitive(true);
            request = request.header(header::AUTHORIZATION, header);
        }
        if let Some(tag) = if_match {
            request = request.header(header::IF_MATCH, tag);
        }
        let body = match body {
            Some(body) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                let bytes = serde_json::to_vec(&body)
                    .map_err(|err| CtlError::Usage(format!("cannot encode the body: {err}")))?;
                Full::new(Bytes::from(bytes))
            }
            None => Full::new(Bytes::new()),
        };
        let request = request
            .body(body)
            .map_err(|err| CtlError::Usage(format!("{method} {url}: {err}")))?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|err| CtlError::Http(format!("{method} {url}: {err}")))?;
            let status = response.status();
            let etag = response
                .headers()
                .get(header::ETAG)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|err| CtlError::Http(format!("{method} {url}: {err}")))?
                .to_bytes();
            Ok::<_, CtlError>((status, etag, bytes))
        };
        let (status, etag, bytes) =
            tokio::time::timeout(TIMEOUT, exchange)
                .await
                .map_err(|_| {
                    CtlError::Http(format!("{method} {url}: no answer within {TIMEOUT:?}"))
                })??;
        if !status.is_success() {
            let detail = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|problem| problem.get("detail")?.as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            return Err(CtlError::Refused { status, detail });
        }
        if bytes.is_empty() {
            return Ok((None, etag));
        }
        serde_json::from_slice(&bytes)
            .map(|value| (Some(value), etag))
            .map_err(|err| CtlError::Http(format!("{method} {url}: not JSON: {err}")))
    }
}

/// Percent-encodes one path segment: everything but letters, digits, `-`,
/// `_` and `~` (a bucket key may contain `/`, and one named `.` or `..`
/// must not read as a step up the path).
pub(crate) fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded() {
        assert_eq!(segment("acme"), "acme");
        assert_eq!(segment("acme/api v2"), "acme%2Fapi%20v2");
        assert_eq!(segment("free-*"), "free-%2A");
        assert_eq!(segment("é"), "%C3%A9");
        assert_eq!(segment(".."), "%2E%2E");
        assert_eq!(segment("%2E%2E"), "%252E%252E");
        assert_eq!(segment("a.b"), "a%2Eb");
    }
}
