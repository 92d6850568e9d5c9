//! Request classification: which cell (bucket, tenant, priority) a request
//! falls into. The bucket comes from `bucket_key`, the tenant from an
//! optional key part, the priority from an optional header and/or route
//! name mapping with a configured default class.

use crate::bucket_key::{BucketKeySpec, KeyPart, RequestAttributes};
use crate::cell::CellKeyBuf;
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
    /// The class of a request.
    pub fn classify(&self, request: &impl RequestAttributes) -> Priority {
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
            && let Some((_, class)) = self.routes.iter().find(|(name, _)| *name == route)
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
    /// reusing its buffers.
    pub fn classify_into(&self, request: &impl RequestAttributes, buf: &mut CellKeyBuf) {
        self.bucket_key.derive_into(request, &mut buf.bucket);
        buf.tenant.clear();
        if let Some(tenant) = &self.tenant {
            tenant.append_to(request, &mut buf.tenant);
            crate::bucket_key::truncate_at_char_boundary(&mut buf.tenant, MAX_TENANT_BYTES);
        }
        buf.priority = self
            .priority
            .as_ref()
            .map_or(Priority::Unspecified, |spec| spec.classify(request));
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
    use crate::bucket_key::KeySource;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use crate::fake_request::FakeRequest as Request;

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
        classifier().classify_into(request, &mut buf);
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
    fn absent_tenant_takes_the_default_and_no_spec_means_none() {
        let request = Request::default();
        assert_eq!(classify(&request).1, "default");
        let bare = Classifier {
            tenant: None,
            priority: None,
            ..classifier()
        };
        let mut buf = CellKeyBuf::default();
        bare.classify_into(&request, &mut buf);
        assert_eq!(buf.tenant, "");
        assert_eq!(buf.priority, Priority::Unspecified);
        assert!(buf.is_bucket_wide());
        assert!(!bare.uses_route_name());
        assert!(classifier().uses_route_name());
    }
}
