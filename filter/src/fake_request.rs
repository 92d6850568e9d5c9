//! Request attributes held in memory, for tests of the classification code.

use crate::bucket_key::RequestAttributes;
use std::collections::HashMap;

/// A request's headers (lower-case names) and route name.
#[derive(Debug, Default)]
pub struct FakeRequest {
    pub headers: HashMap<&'static str, &'static str>,
    pub route: Option<&'static str>,
}

impl FakeRequest {
    /// A request with these headers and no route name.
    pub fn with_headers(headers: &[(&'static str, &'static str)]) -> Self {
        Self {
            headers: headers.iter().copied().collect(),
            route: None,
        }
    }
}

impl RequestAttributes for FakeRequest {
    fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| (*v).to_owned())
    }
    fn route_name(&self) -> Option<String> {
        self.route.map(str::to_owned)
    }
}
