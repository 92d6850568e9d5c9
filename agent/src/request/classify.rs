//! Request classification: which cell (bucket, tenant, priority) a request
//! falls into. The bucket comes from `bucket_key`, the tenant from an
//! optional key part, the priority from an optional header and/or route
//! name mapping with a configured default class.

use crate::request::attributes::{AttributeReader, RequestAttributes};
use crate::request::bucket_key::{BucketKeySpec, KeyPart};
use crate::request::cell::CellKeyBuf;
use sluice_core::{MAX_TENANT_BYTES, Priority};

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
    /// UTF-8 is as if absent ([`crate::request::attributes`]).
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
    /// ([`crate::request::attributes`]).
    pub fn classify_into(&self, request: &impl RequestAttributes, buf: &mut CellKeyBuf) -> u32 {
        let mut request = AttributeReader::new(request);
        self.bucket_key.derive_into(&mut request, &mut buf.bucket);
        buf.tenant.clear();
        if let Some(tenant) = &self.tenant {
            tenant.append_to(&mut request, &mut buf.tenant);
            crate::request::bucket_key::truncate_at_char_boundary(
                &mut buf.tenant,
                MAX_TENANT_BYTES,
            );
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
mod tests {
    use super::*;
    use crate::request::bucket_key::KeySource;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use crate::testing::request::FakeRequest as Request;

    fn classifier() -> Classifier {
        Classifier {
            bucket_key: BucketKeySpec::new(
                vec![KeyPart {
                    source: KeySource::Authority,
                    default: "-".into(),
                }],
                "/".into(),
            ),
            tenant: Some(KeyPart {
                source: KeySource::Header("x-tenant".into()),
                default: "default".into(),
            }),
            priority: Some(PrioritySpec {
                header: Some("x-priority".into()),
                values: vec![
                    ("critical".into(), Priority::Critical),
                    ("batch".into(), Priority::Bulk),
                ],
                routes: vec![("checkout".into(), Priority::Critical)],
                default: Priority::BestEffort,
            }),
        }
    }

    fn classify(request: &Request) -> (String, String, Priority) {
        let mut buf = CellKeyBuf::default();
        let invalid = classifier().classify_into(request, &mut buf);
        assert_eq!(invalid, 0);
        (buf.bucket.clone(), buf.tenant.clone(), buf.priority)
    }

    #[test]
    fn header_then_route_then_default() {
        let mut request = Request::default();
        request.headers.insert(":authority", "api");
        request.headers.insert("x-tenant", "acme");
        request.headers.insert("x-priority", "BATCH");
        request.route = Some("checkout");
        assert_eq!(
            classify(&request),
            ("api".into(), "acme".into(), Priority::Bulk)
        );
        request.headers.insert("x-priority", "unknown");
        assert_eq!(classify(&request).2, Priority::Critical);
        request.route = Some("browse");
        assert_eq!(classify(&request).2, Priority::BestEffort);
    }

    #[test]
    fn values_that_are_not_utf8_are_absent_and_counted() {
        let mut request = Request::default();
        request.raw_headers.insert(":authority", b"api\xff");
        request.raw_headers.insert("x-tenant", b"\xff");
        request.raw_headers.insert("x-priority", b"batch\xc3");
        request.route = Some("checkout");
        let mut buf = CellKeyBuf::default();
        let invalid = classifier().classify_into(&request, &mut buf);
        assert_eq!(invalid, 3);
        // Every part falls back as if the header were not there: the
        // bucket and tenant defaults, the route's class.
        assert_eq!(
            (buf.bucket.as_str(), buf.tenant.as_str(), buf.priority),
            ("-", "default", Priority::Critical)
        );
        request.raw_route = Some(b"check\xffout");
        assert_eq!(classifier().classify_into(&request, &mut buf), 4);
        assert_eq!(buf.priority, Priority::BestEffort);
    }

    #[test]
    fn absent_tenant_takes_the_default_and_no_spec_means_none() {
        let request = Request::default();
        assert_eq!(classify(&request).1, "default");
        let bare = Classifier {
            tenant: None,
            priority: None,
            ..classifier()
        };
        let mut buf = CellKeyBuf::default();
        assert_eq!(bare.classify_into(&request, &mut buf), 0);
        assert_eq!(buf.tenant, "");
        assert_eq!(buf.priority, Priority::Unspecified);
        assert!(buf.is_bucket_wide());
        assert!(!bare.uses_route_name());
        assert!(classifier().uses_route_name());
    }
}
