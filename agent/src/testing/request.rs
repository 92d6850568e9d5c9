//! Request attributes held in memory, for tests of the classification code.

use crate::request::attributes::RequestAttributes;
use std::borrow::Cow;
use std::collections::HashMap;

/// A request's headers (lower-case names) and route name; `raw_headers`
/// and `raw_route`, for bytes that are not UTF-8, win over the others.
#[derive(Debug, Default)]
pub struct FakeRequest {
    pub headers: HashMap<&'static str, &'static str>,
    pub route: Option<&'static str>,
    pub raw_headers: HashMap<&'static str, &'static [u8]>,
    pub raw_route: Option<&'static [u8]>,
}

impl FakeRequest {
    /// A request with these headers and no route name.
    pub fn with_headers(headers: &[(&'static str, &'static str)]) -> Self {
        Self {
            headers: headers.iter().copied().collect(),
            ..Self::default()
        }
    }
}

impl RequestAttributes for FakeRequest {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.raw_headers
            .get(name)
            .copied()
            .or_else(|| self.headers.get(name).map(|value| value.as_bytes()))
            .map(Cow::Borrowed)
    }

    fn route_name(&self) -> Option<Cow<'_, [u8]>> {
        self.raw_route
            .or(self.route.map(str::as_bytes))
            .map(Cow::Borrowed)
    }
}
