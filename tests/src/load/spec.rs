//! One paced stream of requests: where it goes, for which tenant, how fast.

/// One paced stream of requests.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSpec {
    /// Short name for summaries (e.g. `A/acme`).
    pub label: String,
    /// `http://host:port`; requests go to `<base_url>/`.
    pub base_url: String,
    /// Value of the tenant header; `None` sends no header.
    pub tenant: Option<String>,
    /// Requests per second.
    pub rps: f64,
    /// Whether every request carries its own tenant value,
    /// `<tenant>-<request index>` (a flood of one-off bucket keys).
    pub unique_tenants: bool,
}

impl StreamSpec {
    /// A stream of `rps` requests per second to `base_url` for `tenant`.
    pub fn new(label: &str, base_url: &str, tenant: &str, rps: f64) -> Self {
        Self {
            label: label.to_owned(),
            base_url: base_url.to_owned(),
            tenant: Some(tenant.to_owned()),
            rps,
            unique_tenants: false,
        }
    }

    /// A stream of `rps` requests per second to `base_url`, each with a
    /// tenant value never sent before (`<prefix>-<n>`): a key flood.
    pub fn unique(label: &str, base_url: &str, prefix: &str, rps: f64) -> Self {
        Self {
            unique_tenants: true,
            ..Self::new(label, base_url, prefix, rps)
        }
    }
}
