//! Entity tags of the admin API's resources and `If-Match` preconditions:
//! a write that would lose someone else's update answers 412 and changes
//! nothing.
//!
//! A tag is a hash of the resource's JSON representation, not a counter:
//! replicas that hold the same configuration give the same tag without
//! agreeing on anything, and a write that changes nothing keeps the tag.
//! Resources, each tagged by its own handlers' module: one exact limit
//! (`/v1/limits/{bucket}`), one tenant (`/v1/tenants/{tenant}`), one
//! adaptive bucket (`/v1/adaptive/{bucket}`), the rollout state
//! (`/v1/modes`, which the kill switch and the canary are part of) and the
//! overrides (`/v1/overrides`).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::Serialize;

use super::problem::Problem;

/// A strong entity tag, quoted as it goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ETag(String);

impl ETag {
    /// The tag of `value`'s JSON representation.
    pub(crate) fn of<T: Serialize>(value: &T) -> Self {
        // Serialising the admin API's own types cannot fail; an empty body
        // would still give a stable tag.
        let bytes = serde_json::to_vec(value).unwrap_or_default();
        Self(format!("\"{:016x}\"", fnv1a(&bytes)))
    }

    /// The quoted form.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The `ETag` header carrying it.
    pub(crate) fn header(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(&self.0) {
            headers.insert(header::ETAG, value);
        }
        headers
    }
}

/// FNV-1a, 64 bits: stable across processes and builds, which `std`'s
/// hasher does not promise.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A request's `If-Match` header: the write goes ahead only if the
/// resource's current tag is one of those listed (`*`: if it exists).
/// Without the header every write goes ahead, as before.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct IfMatch(Option<Condition>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Condition {
    Any,
    Tags(Vec<String>),
}

impl IfMatch {
    /// Parses the header's values (comma-separated lists, possibly over
    /// several header lines).
    pub(crate) fn parse(headers: &HeaderMap) -> Result<Self, Problem> {
        let mut tags = Vec::new();
        let mut any = false;
        let mut present = false;
        for value in headers.get_all(header::IF_MATCH) {
            present = true;
            let text = value
                .to_str()
                .map_err(|_| bad_header("If-Match is not visible ASCII"))?;
            for item in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                if item == "*" {
                    any = true;
                } else if item.starts_with("W/") {
                    // RFC 9110: If-Match compares strongly; a weak tag never matches.
                    tags.push(String::new());
                } else if item.len() >= 2 && item.starts_with('"') && item.ends_with('"') {
                    tags.push(item.to_owned());
                } else {
                    return Err(bad_header(
                        "If-Match must be * or a list of quoted entity tags",
                    ));
                }
            }
        }
        Ok(Self(match (present, any) {
            (false, _) => None,
            (true, true) => Some(Condition::Any),
            (true, false) => Some(Condition::Tags(tags)),
        }))
    }

    /// 412 unless the precondition holds for a resource whose current tag
    /// is `current` (`None`: it does not exist).
    pub(crate) fn check(&self, current: Option<&ETag>) -> Result<(), Problem> {
        let holds = match (&self.0, current) {
            (None, _) => true,
            (Some(Condition::Any), current) => current.is_some(),
            (Some(Condition::Tags(_)), None) => false,
            (Some(Condition::Tags(tags)), Some(current)) => {
                tags.iter().any(|tag| tag == current.as_str())
            }
        };
        if holds {
            return Ok(());
        }
        Err(Problem::new(
            StatusCode::PRECONDITION_FAILED,
            match current {
                Some(tag) => format!(
                    "the resource changed: its entity tag is now {}; read it again and retry",
                    tag.as_str()
                ),
                None => {
                    "the resource does not exist (any more); read it again and retry".to_owned()
                }
            },
        ))
    }
}

fn bad_header(detail: &str) -> Problem {
    Problem::new(StatusCode::BAD_REQUEST, detail)
}

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Self::parse(&parts.headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn if_match(values: &[&str]) -> IfMatch {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(header::IF_MATCH, HeaderValue::from_str(value).unwrap());
        }
        IfMatch::parse(&headers).unwrap()
    }

    #[test]
    fn a_tag_follows_the_content_only() {
        assert_eq!(ETag::of(&[1, 2]), ETag::of(&[1, 2]));
        assert_ne!(ETag::of(&[1, 2]), ETag::of(&[2, 1]));
        let tag = ETag::of(&"x");
        assert!(tag.as_str().starts_with('"') && tag.as_str().ends_with('"'));
        assert_eq!(tag.as_str().len(), 18);
    }

    #[test]
    fn preconditions_follow_rfc_9110() {
        let tag = ETag::of(&1);
        let other = ETag::of(&2);
        assert!(IfMatch::default().check(None).is_ok());
        assert!(if_match(&["*"]).check(Some(&tag)).is_ok());
        assert!(if_match(&["*"]).check(None).is_err());
        assert!(if_match(&[tag.as_str()]).check(Some(&tag)).is_ok());
        let list = format!("{}, {}", other.as_str(), tag.as_str());
        assert!(if_match(&[&list]).check(Some(&tag)).is_ok());
        assert!(
            if_match(&[other.as_str(), tag.as_str()])
                .check(Some(&tag))
                .is_ok()
        );
        let failed = if_match(&[other.as_str()]).check(Some(&tag)).unwrap_err();
        assert_eq!(failed.status, 412);
        assert!(failed.detail.contains(tag.as_str()), "{}", failed.detail);
        assert!(if_match(&[tag.as_str()]).check(None).is_err());
        let weak = format!("W/{}", tag.as_str());
        assert!(if_match(&[&weak]).check(Some(&tag)).is_err());
    }

    #[test]
    fn a_malformed_header_is_a_bad_request() {
        let mut headers = HeaderMap::new();
        headers.insert(header::IF_MATCH, HeaderValue::from_static("abc"));
        assert_eq!(IfMatch::parse(&headers).unwrap_err().status, 400);
    }
}
