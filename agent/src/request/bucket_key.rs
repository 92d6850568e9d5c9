//! How a request maps to a bucket: a list of parts (header, authority, path
//! prefix, route name, literal) joined by a separator.

use crate::request::attributes::{AttributeReader, RequestAttributes};
use sluice_core::{MAX_BUCKET_KEY_BYTES, cut};

/// Where one part of the key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A request header (lower-case name).
    Header(String),
    /// The `:authority` pseudo-header, lower-cased.
    Authority,
    /// The first `n` non-empty segments of the path, without the query.
    PathPrefix(usize),
    /// The matched route's name.
    RouteName,
    /// A fixed string.
    Literal(String),
}

/// One part of the key and the value used when its attribute is absent,
/// empty or not UTF-8 ([`crate::request::attributes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPart {
    /// Where the value comes from.
    pub source: KeySource,
    /// The value when the attribute is absent, empty or not UTF-8.
    pub default: String,
}

/// A validated bucket-key specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketKeySpec {
    parts: Vec<KeyPart>,
    separator: String,
}

impl BucketKeySpec {
    /// Builds a spec; [`crate::config`] validates the parts first.
    pub fn new(parts: Vec<KeyPart>, separator: String) -> Self {
        Self { parts, separator }
    }

    /// Whether a part needs the route name, which costs a property read.
    pub fn uses_route_name(&self) -> bool {
        self.parts
            .iter()
            .any(|part| part.source == KeySource::RouteName)
    }

    /// The bucket of a request. Reads only the attributes the spec names.
    pub fn derive(&self, request: &impl RequestAttributes) -> String {
        let mut key = String::new();
        self.derive_into(&mut AttributeReader::new(request), &mut key);
        key
    }

    /// Writes the bucket of a request into `key`, replacing its contents:
    /// the request path reuses one buffer, so no key is allocated once it
    /// has grown to the longest key.
    pub fn derive_into<R: RequestAttributes + ?Sized>(
        &self,
        request: &mut AttributeReader<'_, R>,
        key: &mut String,
    ) {
        key.clear();
        for (index, part) in self.parts.iter().enumerate() {
            if index > 0 {
                key.push_str(&self.separator);
            }
            part.append_to(request, key);
        }
        truncate_at_char_boundary(key, MAX_BUCKET_KEY_BYTES);
    }
}

impl KeyPart {
    /// Appends this part's value (or its default, when the attribute is
    /// absent, empty or not UTF-8) to `out`.
    pub fn append_to<R: RequestAttributes + ?Sized>(
        &self,
        request: &mut AttributeReader<'_, R>,
        out: &mut String,
    ) {
        let start = out.len();
        match &self.source {
            KeySource::Literal(value) => {
                out.push_str(value);
                return;
            }
            KeySource::Header(name) => {
                if let Some(value) = request.header(name) {
                    out.push_str(&value);
                }
            }
            KeySource::Authority => {
                if let Some(authority) = request.header(":authority") {
                    out.push_str(&authority);
                    if let Some(appended) = out.get_mut(start..) {
                        appended.make_ascii_lowercase();
                    }
                }
            }
            KeySource::PathPrefix(segments) => {
                if let Some(path) = request.header(":path") {
                    write_path_prefix(&path, *segments, out);
                }
            }
            KeySource::RouteName => {
                if let Some(route) = request.route_name() {
                    out.push_str(&route);
                }
            }
        }
        if out.len() == start {
            out.push_str(&self.default);
        }
    }

    /// Whether this part needs the route name.
    pub fn uses_route_name(&self) -> bool {
        self.source == KeySource::RouteName
    }
}

/// Appends the first `segments` non-empty segments of `path` without its
/// query: `/a/b/c?x=1` with 2 segments is `/a/b`; a path without segments
/// is `/`.
fn write_path_prefix(path: &str, segments: usize, out: &mut String) {
    let without_query = path.split(['?', '#']).next().unwrap_or_default();
    let start = out.len();
    for segment in without_query
        .split('/')
        .filter(|s| !s.is_empty())
        .take(segments)
    {
        out.push('/');
        out.push_str(segment);
    }
    if out.len() == start {
        out.push('/');
    }
}

/// Cuts `value` to at most `max_bytes`, on a character boundary.
pub(crate) fn truncate_at_char_boundary(value: &mut String, max_bytes: usize) {
    let kept = cut(value, max_bytes).len();
    value.truncate(kept);
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use crate::testing::request::FakeRequest as Request;

    fn part(source: KeySource) -> KeyPart {
        KeyPart {
            source,
            default: "-".into(),
        }
    }

    fn request(headers: &[(&'static str, &'static str)]) -> Request {
        Request::with_headers(headers)
    }

    #[test]
    fn joins_all_sources_with_the_separator() {
        let spec = BucketKeySpec::new(
            vec![
                part(KeySource::Header("x-tenant".into())),
                part(KeySource::Authority),
                part(KeySource::PathPrefix(1)),
                part(KeySource::RouteName),
                part(KeySource::Literal("api".into())),
            ],
            "/".into(),
        );
        let mut req = request(&[
            ("x-tenant", "acme"),
            (":authority", "Shop.Example"),
            (":path", "/v1/items?q=1"),
        ]);
        req.route = Some("catalog");
        assert_eq!(spec.derive(&req), "acme/shop.example//v1/catalog/api");
    }

    #[test]
    fn absent_or_empty_attributes_use_the_default() {
        let spec = BucketKeySpec::new(
            vec![
                KeyPart {
                    source: KeySource::Header("x-tenant".into()),
                    default: "anonymous".into(),
                },
                part(KeySource::RouteName),
            ],
            ":".into(),
        );
        assert_eq!(spec.derive(&request(&[])), "anonymous:-");
        assert_eq!(spec.derive(&request(&[("x-tenant", "")])), "anonymous:-");
    }

    #[test]
    fn values_that_are_not_utf8_use_the_default_and_are_counted() {
        let spec = BucketKeySpec::new(
            vec![
                part(KeySource::Header("x-tenant".into())),
                part(KeySource::Authority),
                part(KeySource::PathPrefix(1)),
                part(KeySource::RouteName),
            ],
            "/".into(),
        );
        let mut req = request(&[]);
        req.raw_headers.insert("x-tenant", b"ac\xffme");
        req.raw_headers.insert(":authority", b"Shop\xc3");
        req.raw_headers.insert(":path", b"/v1\x80/items");
        req.raw_route = Some(b"\xfe");
        let mut reader = AttributeReader::new(&req);
        let mut key = String::new();
        spec.derive_into(&mut reader, &mut key);
        assert_eq!(key, "-/-/-/-");
        assert_eq!(reader.invalid(), 4);
    }

    #[test]
    fn only_the_authority_is_lower_cased() {
        let spec = BucketKeySpec::new(
            vec![
                part(KeySource::Header("x-tenant".into())),
                part(KeySource::Authority),
            ],
            "/".into(),
        );
        let req = request(&[("x-tenant", "ACME"), (":authority", "Shop.Example")]);
        assert_eq!(spec.derive(&req), "ACME/shop.example");
    }

    fn path_prefix(path: &str, segments: usize) -> String {
        let mut prefix = String::from("kept:");
        write_path_prefix(path, segments, &mut prefix);
        prefix.split_off("kept:".len())
    }

    #[test]
    fn path_prefix_takes_non_empty_segments_without_query() {
        assert_eq!(path_prefix("/a/b/c?x=/y", 2), "/a/b");
        assert_eq!(path_prefix("//a//b", 1), "/a");
        assert_eq!(path_prefix("/a#frag", 3), "/a");
        assert_eq!(path_prefix("/", 1), "/");
        assert_eq!(path_prefix("/?q", 1), "/");
    }

    #[test]
    fn long_keys_are_cut_at_a_char_boundary() {
        let spec = BucketKeySpec::new(vec![part(KeySource::Header("x".into()))], "/".into());
        let long: &'static str = Box::leak("é".repeat(MAX_BUCKET_KEY_BYTES).into_boxed_str());
        let key = spec.derive(&request(&[("x", long)]));
        assert!(key.len() <= MAX_BUCKET_KEY_BYTES);
        assert!(key.len() >= MAX_BUCKET_KEY_BYTES - 1);
        assert!(key.chars().all(|c| c == 'é'));
    }

    #[test]
    fn route_name_use_is_reported() {
        let with = BucketKeySpec::new(vec![part(KeySource::RouteName)], "/".into());
        let without = BucketKeySpec::new(vec![part(KeySource::Authority)], "/".into());
        assert!(with.uses_route_name());
        assert!(!without.uses_route_name());
    }
}
