//! Bearer-token authentication for the admin API.
//!
//! Writes always need the token once one is configured; reads need it too
//! unless the operator opened them (`--admin-open-reads`). `/healthz` is
//! always open; `/metrics` needs the token too unless it is opened
//! (`--admin-open-metrics`, or `--admin-open-reads`), since its labels name
//! buckets, tenants and proxies.
//!
//! Without a token (allowed only on a loopback listener) every request must
//! name a loopback host: a web page the operator's browser opens could
//! otherwise reach the API through a DNS name it rebinds to 127.0.0.1.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::problem::Problem;

/// A bearer token. Its `Debug` output never shows it, so it cannot end up
/// in a log line by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Vec<u8>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Why no token could be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token file could not be read.
    #[error("cannot read admin token file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The environment variable is not set or not Unicode.
    #[error("admin token variable {0} is not set")]
    Unset(String),
    /// The token is empty after trimming whitespace.
    #[error("admin token from {0} is empty")]
    Empty(String),
}

impl Token {
    /// A token from a string; surrounding whitespace (a trailing newline in
    /// a file) is not part of it.
    pub fn new(text: &str, source: &str) -> Result<Self, TokenError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(TokenError::Empty(source.to_owned()));
        }
        Ok(Self(text.as_bytes().to_vec()))
    }

    /// Reads the token from a file.
    pub(crate) fn from_file(path: &Path) -> Result<Self, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::new(&text, &path.display().to_string())
    }

    /// Reads the token from an environment variable.
    pub(crate) fn from_env(name: &str) -> Result<Self, TokenError> {
        let text = std::env::var(name).map_err(|_| TokenError::Unset(name.to_owned()))?;
        Self::new(&text, name)
    }

    /// Compares in time that depends only on the lengths, not on where the
    /// first differing byte is.
    pub(crate) fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(&self.0, presented)
    }

    /// The token as text, for a client's `Authorization` header.
    #[cfg(any(test, feature = "ctl"))]
    pub(crate) fn expose(&self) -> &[u8] {
        &self.0
    }
}

fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    // Every byte of the presented value is looked at; the length difference
    // is folded in instead of returning early.
    let mut diff = u8::from(expected.len() != presented.len());
    for (i, byte) in presented.iter().enumerate() {
        let wanted = expected.get(i).copied().unwrap_or(!byte);
        diff |= wanted ^ byte;
    }
    std::hint::black_box(diff) == 0
}

/// Who may do what.
#[derive(Debug, Clone, Default)]
pub struct AuthPolicy {
    /// `None`: no authentication (only allowed on a loopback listener),
    /// and only loopback host names are answered.
    pub token: Option<Token>,
    /// Whether GET requests work without the token.
    pub open_reads: bool,
    /// Whether `GET /metrics` works without the token.
    pub open_metrics: bool,
}

/// The path anyone may read: liveness says nothing.
const HEALTH: &str = "/healthz";

/// The Prometheus exposition.
const METRICS: &str = "/metrics";

/// Middleware: answers 401 (no or malformed credentials) or 403 (wrong
/// token, or without a token a host that is not loopback) before the
/// handler runs, so a refused request never reads its body.
pub(crate) async fn require_token(
    State(policy): State<Arc<AuthPolicy>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &policy.token else {
        if let Some(host) = foreign_host(&request) {
            tracing::warn!(host, method = %request.method(), path = request.uri().path(), "admin request for a host that is not loopback refused");
            return Problem::new(
                StatusCode::FORBIDDEN,
                format!(
                    "host {host:?} is not a loopback name: without an admin token only localhost, 127.0.0.1 and [::1] are answered"
                ),
            )
            .into_response();
        }
        return next.run(request).await;
    };
    let read = matches!(*request.method(), Method::GET | Method::HEAD);
    let path = request.uri().path();
    if path == HEALTH
        || (read && policy.open_reads)
        || (read && path == METRICS && policy.open_metrics)
    {
        return next.run(request).await;
    }
    match bearer(request.headers()) {
        None => {
            let mut response = Problem::new(
                StatusCode::UNAUTHORIZED,
                "this endpoint needs an `Authorization: Bearer <token>` header",
            )
            .into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sluice\""),
            );
            response
        }
        Some(presented) if token.matches(presented) => next.run(request).await,
        Some(_) => {
            tracing::warn!(method = %request.method(), path = request.uri().path(), "admin request with a wrong token");
            Problem::new(StatusCode::FORBIDDEN, "the bearer token is not valid").into_response()
        }
    }
}

/// The host a request names (its URI's authority, else its `Host`
/// header) when that is not a loopback name; `None` for loopback names and
/// for requests that name no host (HTTP/1.0; a browser always names one).
fn foreign_host(request: &Request) -> Option<String> {
    let named = match request.uri().authority() {
        Some(authority) => authority.host().as_bytes().to_vec(),
        None => {
            let value = request.headers().get(header::HOST)?.as_bytes();
            host_of(value).to_vec()
        }
    };
    (!is_loopback_name(&named)).then(|| String::from_utf8_lossy(&named).into_owned())
}

/// A `Host` value without its port.
fn host_of(value: &[u8]) -> &[u8] {
    if value.first() == Some(&b'[') {
        // [v6]:port
        return match value.iter().position(|&b| b == b']') {
            Some(end) => value.get(..=end).unwrap_or(value),
            None => value,
        };
    }
    match value.iter().rposition(|&b| b == b':') {
        Some(colon) => value.get(..colon).unwrap_or(value),
        None => value,
    }
}

/// `localhost` (any case, a trailing dot allowed), an IPv4 address in
/// 127.0.0.0/8 or `[::1]`: names no DNS answer can point elsewhere.
fn is_loopback_name(host: &[u8]) -> bool {
    let host = host.strip_suffix(b".").unwrap_or(host);
    if host.eq_ignore_ascii_case(b"localhost") {
        return true;
    }
    let Ok(text) = std::str::from_utf8(host) else {
        return false;
    };
    let ip = text
        .strip_prefix('[')
        .and_then(|v6| v6.strip_suffix(']'))
        .unwrap_or(text);
    ip.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let scheme = value.get(..7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| value.get(7..))
        .flatten()
        .filter(|token| !token.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparison() {
        let token = Token::new("s3cret\n", "test").unwrap();
        assert!(token.matches(b"s3cret"));
        assert!(!token.matches(b"s3cre"));
        assert!(!token.matches(b"s3cret\n"));
        assert!(!token.matches(b"S3cret"));
        assert!(!token.matches(b""));
        assert!(Token::new(" \n", "test").is_err());
        assert_eq!(format!("{token:?}"), "Token(<redacted>)");
    }

    #[test]
    fn loopback_names() {
        for host in [
            &b"localhost"[..],
            b"LocalHost.",
            b"127.0.0.1",
            b"127.8.9.10",
            b"[::1]",
        ] {
            assert!(
                is_loopback_name(host),
                "{:?}",
                String::from_utf8_lossy(host)
            );
        }
        for host in [
            &b"evil.example"[..],
            b"localhost.evil.example",
            b"10.0.0.1",
            b"0.0.0.0",
            b"[::]",
            b"127.0.0.1.nip.io",
            b"",
        ] {
            assert!(
                !is_loopback_name(host),
                "{:?}",
                String::from_utf8_lossy(host)
            );
        }
        assert_eq!(host_of(b"localhost:8080"), b"localhost");
        assert_eq!(host_of(b"[::1]:8080"), b"[::1]");
        assert_eq!(host_of(b"[::1]"), b"[::1]");
        assert_eq!(host_of(b"evil.example"), b"evil.example");
    }

    #[test]
    fn bearer_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(bearer(&headers), Some(&b"abc"[..]));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer abc"),
        );
        assert_eq!(bearer(&headers), Some(&b"abc"[..]));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer(&headers), None);
    }
}
