//! Request classification: which cell (bucket, tenant, priority) a request
//! falls into, read through the one rule for a request's attribute bytes.
//!
//! In file order: the attributes as the host hands them over; the bucket
//! key (a list of parts joined by a separator); the cell key every counter
//! and directive is found by; the classifier that puts the three together.

use sluice_core::{MAX_BUCKET_KEY_BYTES, MAX_TENANT_BYTES, Priority, cut};
use sluice_proto::v1::BucketCount;
use std::borrow::Cow;

// ---- Attributes ----
//
// A request's attributes as the classification reads them: the bytes the
// host hands over, and the one rule that turns them into text.
//
// Envoy passes header values on as bytes, and HTTP allows any byte above
// 0x7f in one (obs-text): `x-tenant: \xff` reaches the filter. A value
// that is not valid UTF-8 is treated as absent. The key part's configured
// default applies (for the priority header: the route's class, else the
// default class), so bytes like these can neither trap the filter nor mint
// cells or tenants of their own, and every such value read is counted
// (`sluice.header_values_invalid`, [`crate::metrics::Counter`]). Both data
// planes read through here: the proxy-wasm binding and the native module
// only fetch bytes. Checking UTF-8 is the work decoding a value into text
// did before, so the rule adds nothing to the request path.

/// The request attributes a cell can be built from, as the host holds
/// them: raw bytes, borrowed from the host (the native module) or copied
/// out of it (a proxy-wasm host call returns a copy).
pub trait RequestAttributes {
    /// A request header's value by lower-case name, pseudo-headers such as
    /// `:authority` and `:path` included.
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>>;
    /// The name of the route the request matched.
    fn route_name(&self) -> Option<Cow<'_, [u8]>>;
}

/// What one attribute read from the host is, by the rule above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attribute<'a> {
    /// The host has no such attribute.
    Absent,
    /// The host's bytes are not UTF-8: as if absent, and counted.
    Invalid,
    /// The attribute's value.
    Text(Cow<'a, str>),
}

impl<'a> Attribute<'a> {
    /// What the host's bytes mean. A valid value is not copied.
    pub fn from_host(bytes: Option<Cow<'a, [u8]>>) -> Self {
        match bytes {
            None => Self::Absent,
            Some(Cow::Borrowed(bytes)) => match std::str::from_utf8(bytes) {
                Ok(text) => Self::Text(Cow::Borrowed(text)),
                Err(_) => Self::Invalid,
            },
            Some(Cow::Owned(bytes)) => match String::from_utf8(bytes) {
                Ok(text) => Self::Text(Cow::Owned(text)),
                Err(_) => Self::Invalid,
            },
        }
    }
}

/// Reads a request's attributes as text by the rule above, counting the
/// values it had to treat as absent.
#[derive(Debug)]
pub struct AttributeReader<'r, R: RequestAttributes + ?Sized> {
    request: &'r R,
    invalid: u32,
}

impl<'r, R: RequestAttributes + ?Sized> AttributeReader<'r, R> {
    /// A reader of `request` that has read nothing yet.
    pub fn new(request: &'r R) -> Self {
        Self {
            request,
            invalid: 0,
        }
    }

    /// A header's value; `None` when absent or not UTF-8.
    pub fn header(&mut self, name: &str) -> Option<Cow<'r, str>> {
        let bytes = self.request.header(name);
        self.text(bytes)
    }

    /// The matched route's name; `None` when absent or not UTF-8 (Envoy's
    /// configuration cannot name a route so, but the rule is the same).
    pub fn route_name(&mut self) -> Option<Cow<'r, str>> {
        let bytes = self.request.route_name();
        self.text(bytes)
    }

    /// How many of the values read were not UTF-8.
    pub fn invalid(&self) -> u32 {
        self.invalid
    }

    fn text(&mut self, bytes: Option<Cow<'r, [u8]>>) -> Option<Cow<'r, str>> {
        match Attribute::from_host(bytes) {
            Attribute::Text(text) => Some(text),
            Attribute::Absent => None,
            Attribute::Invalid => {
                self.invalid = self.invalid.saturating_add(1);
                None
            }
        }
    }
}

// ---- Bucket keys ----
//
// How a request maps to a bucket: a list of parts (header, authority, path
// prefix, route name, literal) joined by a separator.

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
/// empty or not UTF-8 (the attribute rule at the top of this file).
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

// ---- Cell keys ----
//
// A cell is what the filter counts and the control plane directs: a
// (bucket, tenant, priority) triple.
//
// Counters and directives are keyed by one string per cell, so a lookup is
// one hash probe with a borrowed `&str` and no allocation. The key is built
// in a reused buffer ([`CellKeyBuf`]) as
// `priority digit ‖ tenant length (3 decimal digits) ‖ tenant ‖ bucket`:
// the fixed-width prefix makes it unambiguous whatever bytes the bucket and
// tenant hold, and the whole key stays valid UTF-8.

const PREFIX_BYTES: usize = 4;

/// The prefix of a bucket-wide cell's key (no tenant, unspecified
/// priority): its key is this followed by the bucket.
pub const BUCKET_WIDE_PREFIX: &str = "0000";
/// [`BUCKET_WIDE_PREFIX`] as bytes.
pub const BUCKET_WIDE_PREFIX_BYTES: [u8; PREFIX_BYTES] = *b"0000";

// The tenant's length is written as three decimal digits.
const _: () = assert!(MAX_TENANT_BYTES < 1000);

fn priority_digit(priority: Priority) -> u8 {
    match priority {
        Priority::Unspecified => b'0',
        Priority::Critical => b'1',
        Priority::Degraded => b'2',
        Priority::BestEffort => b'3',
        Priority::Bulk => b'4',
    }
}

fn priority_of_digit(digit: u8) -> Option<Priority> {
    Some(match digit {
        b'0' => Priority::Unspecified,
        b'1' => Priority::Critical,
        b'2' => Priority::Degraded,
        b'3' => Priority::BestEffort,
        b'4' => Priority::Bulk,
        _ => return None,
    })
}

/// Writes the key of (`bucket`, `tenant`, `priority`) into `out`, replacing
/// its contents. No allocation once `out` has grown to the longest key.
/// Callers cut bucket and tenant to their limits first; a longer tenant is
/// cut here so the length prefix always fits three digits.
pub fn write_key(out: &mut String, bucket: &str, tenant: &str, priority: Priority) {
    let tenant = cut(tenant, MAX_TENANT_BYTES);
    // Every request builds a key: the prefix is pushed as four ASCII
    // characters, with no UTF-8 validation and one capacity check.
    let len = tenant.len();
    let digit = |n: usize| char::from(b'0' + u8::try_from(n % 10).unwrap_or(0));
    out.clear();
    out.reserve(PREFIX_BYTES + tenant.len() + bucket.len());
    out.push(char::from(priority_digit(priority)));
    out.push(digit(len / 100));
    out.push(digit(len / 10));
    out.push(digit(len));
    out.push_str(tenant);
    out.push_str(bucket);
}

/// The key of a cell, allocated: for the tick path and tests.
pub fn key_of(bucket: &str, tenant: &str, priority: Priority) -> String {
    let mut key = String::with_capacity(PREFIX_BYTES + tenant.len() + bucket.len());
    write_key(&mut key, bucket, tenant, priority);
    key
}

/// The cell key of a wire record's cell.
pub(crate) fn key_of_count(count: &BucketCount) -> String {
    key_of(
        &count.bucket,
        &count.tenant,
        Priority::from_wire(count.priority),
    )
}

/// Splits a key back into (bucket, tenant, priority); `None` if malformed.
pub fn parse_key(key: &str) -> Option<(&str, &str, Priority)> {
    let bytes = key.as_bytes();
    let priority = priority_of_digit(*bytes.first()?)?;
    let digits = key.get(1..PREFIX_BYTES)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: usize = digits.parse().ok()?;
    let tenant = key.get(PREFIX_BYTES..PREFIX_BYTES.checked_add(len)?)?;
    let bucket = key.get(PREFIX_BYTES + len..)?;
    Some((bucket, tenant, priority))
}

/// The reused buffers of a VM's request path: the request's bucket, tenant
/// and priority, and its cell key.
#[derive(Debug, Default, Clone)]
pub struct CellKeyBuf {
    /// The request's bucket, derived in place.
    pub bucket: String,
    /// The request's tenant, derived in place (empty: none).
    pub tenant: String,
    /// The request's priority.
    pub priority: Priority,
    exact: String,
}

impl CellKeyBuf {
    /// Builds the exact key from the parts; returns it.
    pub fn exact(&mut self) -> &str {
        write_key(&mut self.exact, &self.bucket, &self.tenant, self.priority);
        &self.exact
    }

    /// Whether the exact cell is the bucket-wide cell.
    pub fn is_bucket_wide(&self) -> bool {
        self.tenant.is_empty() && self.priority == Priority::Unspecified
    }

    /// The cell key [`Self::keys`] built last.
    pub fn exact_key(&self) -> &str {
        &self.exact
    }

    /// Builds the cell key; returns it with the bucket (the key of
    /// bucket-wide directives).
    pub fn keys(&mut self) -> (&str, &str) {
        write_key(&mut self.exact, &self.bucket, &self.tenant, self.priority);
        (&self.exact, &self.bucket)
    }
}

// ---- The classifier ----
//
// Request classification: which cell (bucket, tenant, priority) a request
// falls into. The bucket comes from `bucket_key`, the tenant from an
// optional key part, the priority from an optional header and/or route
// name mapping with a configured default class.

/// How a request's priority class is found: the header's value if it maps
/// to a class, else the route name's class, else `default`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrioritySpec {
    /// Header (lower case) whose value names the class.
    pub header: Option<String>,
    /// Header value (compared ASCII case-insensitively) → class.
    pub values: Vec<(String, Priority)>,
    /// Route name (exact) → class.
    pub routes: Vec<(String, Priority)>,
    /// Class of a request nothing else classifies.
    pub default: Priority,
}

impl PrioritySpec {
    /// The class of a request. A header value or route name that is not
    /// UTF-8 is as if absent (the attribute rule at the top of this file).
    pub fn classify<R: RequestAttributes + ?Sized>(
        &self,
        request: &mut AttributeReader<'_, R>,
    ) -> Priority {
        if let Some(header) = &self.header
            && let Some(value) = request.header(header)
            && let Some((_, class)) = self
                .values
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(value.trim()))
        {
            return *class;
        }
        if !self.routes.is_empty()
            && let Some(route) = request.route_name()
            && let Some((_, class)) = self.routes.iter().find(|(name, _)| *name == *route)
        {
            return *class;
        }
        self.default
    }

    /// Whether the spec reads the route name.
    pub fn uses_route_name(&self) -> bool {
        !self.routes.is_empty()
    }
}

/// The validated classification of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classifier {
    /// How the bucket is derived.
    pub bucket_key: BucketKeySpec,
    /// How the tenant is derived; `None`: no tenant (empty).
    pub tenant: Option<KeyPart>,
    /// How the priority is found; `None`: every request is unspecified.
    pub priority: Option<PrioritySpec>,
}

impl Classifier {
    /// Classifies a request into `buf` (bucket, tenant and priority),
    /// reusing its buffers. Returns how many of the values it read were not
    /// UTF-8: each was taken as absent, so its part's default applied
    /// (the attribute rule at the top of this file).
    pub fn classify_into(&self, request: &impl RequestAttributes, buf: &mut CellKeyBuf) -> u32 {
        let mut request = AttributeReader::new(request);
        self.bucket_key.derive_into(&mut request, &mut buf.bucket);
        buf.tenant.clear();
        if let Some(tenant) = &self.tenant {
            tenant.append_to(&mut request, &mut buf.tenant);
            truncate_at_char_boundary(&mut buf.tenant, MAX_TENANT_BYTES);
        }
        buf.priority = self
            .priority
            .as_ref()
            .map_or(Priority::Unspecified, |spec| spec.classify(&mut request));
        request.invalid()
    }

    /// Whether any part needs the route name (a property read per request).
    pub fn uses_route_name(&self) -> bool {
        self.bucket_key.uses_route_name()
            || self.tenant.as_ref().is_some_and(KeyPart::uses_route_name)
            || self
                .priority
                .as_ref()
                .is_some_and(PrioritySpec::uses_route_name)
    }
}

#[cfg(test)]
mod tests;
