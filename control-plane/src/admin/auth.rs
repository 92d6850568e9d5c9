//! Bearer-token authentication for the admin API.
//!
//! Writes always need the token once one is configured; reads need it too
//! unless the operator opened them (`--admin-open-reads`). `/healthz` and
//! `/metrics` are always open: probes and scrapers carry no secrets.

use std::fmt;
use std::path::{Path, PathBuf};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Admin;
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
    pub fn from_file(path: &Path) -> Result<Self, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::new(&text, &path.display().to_string())
    }

    /// Reads the token from an environment variable.
    pub fn from_env(name: &str) -> Result<Self, TokenError> {
        let text = std::env::var(name).map_err(|_| TokenError::Unset(name.to_owned()))?;
        Self::new(&text, name)
    }

    /// Compares in time that depends only on the lengths, not on where the
    /// first differing byte is.
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(&self.0, presented)
    }

    /// The token as text, for a client's `Authorization` header.
    pub fn expose(&self) -> &[u8] {
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
    /// `None`: no authentication (only allowed on a loopback listener).
    pub token: Option<Token>,
    /// Whether GET requests work without the token.
    pub open_reads: bool,
}

/// Paths anyone may read.
const PUBLIC: [&str; 2] = ["/healthz", "/metrics"];

/// Middleware: answers 401 (no or malformed credentials) or 403 (wrong
/// token) before the handler runs, so a refused request never reads its body.
pub async fn require_token(State(admin): State<Admin>, request: Request, next: Next) -> Response {
    let policy = admin.auth();
    let Some(token) = &policy.token else {
        return next.run(request).await;
    };
    let read = matches!(*request.method(), Method::GET | Method::HEAD);
    if PUBLIC.contains(&request.uri().path()) || (read && policy.open_reads) {
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
