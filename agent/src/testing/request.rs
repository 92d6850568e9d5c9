//! A request held in memory: its attributes for the classification, and
//! what the request handler did to it, for tests of both.

use crate::host::{HostError, Log, LogLevel};
use crate::request::classify::RequestAttributes;
use crate::request::handler::HttpRequest;
use crate::request::reject::RejectResponse;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;

/// A request's headers (lower-case names) and route name; `raw_headers`
/// and `raw_route`, for bytes that are not UTF-8, win over the others.
/// The effects the handler carries out are kept, and `failing` makes
/// every one of them fail.
#[derive(Debug, Default)]
pub struct FakeRequest {
    pub headers: HashMap<&'static str, &'static str>,
    pub route: Option<&'static str>,
    pub raw_headers: HashMap<&'static str, &'static [u8]>,
    pub raw_route: Option<&'static [u8]>,
    /// The response's `:status`.
    pub status: Option<&'static [u8]>,
    /// Dynamic metadata numbers by (namespace, key).
    pub metadata: HashMap<(&'static str, &'static str), f64>,
    /// Response headers (lower-case names).
    pub response_headers: HashMap<&'static str, &'static str>,
    /// Response trailers (lower-case names).
    pub response_trailers: HashMap<&'static str, &'static str>,
    /// The clock, in nanoseconds.
    pub clock_ns: Option<u64>,
    /// Whether every effect fails.
    pub failing: bool,
    /// The decision's record, as handed over.
    pub record: Option<String>,
    /// Request headers added for upstream.
    pub added: Vec<(String, String)>,
    /// The 429 sent, if any.
    pub rejection: Option<RejectResponse>,
    /// Log lines.
    pub logs: RefCell<Vec<(LogLevel, String)>>,
}

impl FakeRequest {
    /// A request with these headers and no route name.
    pub fn with_headers(headers: &[(&'static str, &'static str)]) -> Self {
        Self {
            headers: headers.iter().copied().collect(),
            ..Self::default()
        }
    }

    fn effect(&self) -> Result<(), HostError> {
        if self.failing {
            Err(HostError::InternalFailure)
        } else {
            Ok(())
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

impl Log for FakeRequest {
    fn log(&self, level: LogLevel, message: &str) {
        self.logs.borrow_mut().push((level, message.to_owned()));
    }
}

impl HttpRequest for FakeRequest {
    fn set_decision_record(&mut self, record: &str) -> Result<(), HostError> {
        self.effect()?;
        self.record = Some(record.to_owned());
        Ok(())
    }

    fn add_request_header(&mut self, name: &str, value: &str) -> Result<(), HostError> {
        self.effect()?;
        self.added.push((name.to_owned(), value.to_owned()));
        Ok(())
    }

    fn send_rejection(&mut self, response: &RejectResponse) -> Result<(), HostError> {
        self.effect()?;
        self.rejection = Some(response.clone());
        Ok(())
    }

    fn response_status(&self) -> Option<Cow<'_, [u8]>> {
        self.status.map(Cow::Borrowed)
    }

    fn clock_ns(&self) -> Option<u64> {
        self.clock_ns
    }

    fn metadata_number(&self, namespace: &str, key: &str) -> Option<f64> {
        self.metadata
            .iter()
            .find(|((ns, k), _)| *ns == namespace && *k == key)
            .map(|(_, value)| *value)
    }

    fn response_header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.response_headers
            .get(name)
            .map(|value| Cow::Borrowed(value.as_bytes()))
    }

    fn response_trailer(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.response_trailers
            .get(name)
            .map(|value| Cow::Borrowed(value.as_bytes()))
    }
}
