//! The per-request context: proxy-wasm's HTTP hooks handed to the agent's
//! request handler ([`sluice_agent::request::handler`]), with the request
//! read and answered through host calls. Reads only the headers the
//! classification names; never touches shared data or the network.
//!
//! The decision's record goes to Envoy as `wasm.sluice` filter state
//! (proxy-wasm cannot write Envoy's dynamic metadata: `set_property` is
//! Envoy's only per-request write, and it lands in filter state, which
//! access logs read with `%FILTER_STATE(wasm.sluice:PLAIN)%`).

use crate::envoy_host::EnvoyHost;
use crate::status::host_error;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use sluice_agent::agent::Agent;
use sluice_agent::config::RequestPolicy;
use sluice_agent::host::{HostError, Log, LogLevel};
use sluice_agent::request::charge::PendingCharge;
use sluice_agent::request::classify::RequestAttributes;
use sluice_agent::request::handler::{
    self, FollowedRequest, HeadersAction, HttpRequest, REJECT_STATUS,
};
use sluice_agent::request::reject::RejectResponse;
use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::UNIX_EPOCH;

pub(super) struct SluiceHttp {
    pub agent: Rc<RefCell<Agent>>,
    pub policy: Rc<RequestPolicy>,
    /// A request followed to its response.
    pub followed: Option<FollowedRequest>,
    /// An admitted request with a cost rule, charged in `on_log`.
    pub charge: Option<PendingCharge>,
}

impl Context for SluiceHttp {}

impl HttpContext for SluiceHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        // The agent is never borrowed across host callbacks, so this cannot
        // fail; if it somehow did, the request passes. The borrow ends
        // before the 429 is sent: Envoy runs the response hooks at once.
        let rejection = match self.agent.try_borrow_mut() {
            Ok(mut agent) => handler::decide(
                &mut agent,
                &self.policy,
                &mut EnvoyRequest,
                &mut self.followed,
                &mut self.charge,
            ),
            Err(_) => None,
        };
        match handler::answer(&mut EnvoyRequest, rejection) {
            HeadersAction::Continue => Action::Continue,
            HeadersAction::Stop => Action::Pause,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(followed) = self.followed.take() {
            let observed = handler::observe_response(&followed, &EnvoyRequest);
            if let Ok(mut agent) = self.agent.try_borrow_mut() {
                observed.count(&mut agent);
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(pending) = &self.charge else {
            return Action::Continue;
        };
        // Continue exposes only this chunk, which passes on at once: the
        // parser copies at most its usage object, never the body.
        let chunk = if pending.reads_body() {
            hostcalls::get_buffer(BufferType::HttpResponseBody, 0, body_size)
                .ok()
                .flatten()
        } else {
            None
        };
        handler::response_body(
            &mut self.charge,
            chunk.as_deref().unwrap_or_default(),
            end_of_stream,
        );
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        handler::response_trailers(&mut self.charge);
        Action::Continue
    }

    // Envoy calls it once the stream is over, whatever ended it (its end,
    // a reset, the client going away): the place to charge the request.
    fn on_log(&mut self) {
        let Some(pending) = self.charge.take() else {
            return;
        };
        let Some(settled) = handler::stream_end(&self.policy, &EnvoyRequest, pending) else {
            return;
        };
        if let Ok(mut agent) = self.agent.try_borrow_mut() {
            settled.count(&mut agent);
        }
    }
}

/// The filter-state key of a decision's record; Envoy prefixes `wasm.`.
const RECORD_KEY: &str = "sluice";

/// A root context that could not be configured still has to hand Envoy an
/// HTTP context; this one lets everything through.
pub(super) struct PassThrough;

impl Context for PassThrough {}
impl HttpContext for PassThrough {}

/// The current request, read and answered through host calls (the host
/// knows which request is current). Read as bytes: the SDK's
/// `get_map_value` unwraps its UTF-8 decoding, so a header value that is
/// not UTF-8 would trap the VM. What the bytes mean is decided outside the
/// binding ([`sluice_agent::request::classify`]).
struct EnvoyRequest;

impl RequestAttributes for EnvoyRequest {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name)
            .ok()
            .flatten()
            .map(Cow::Owned)
    }

    fn route_name(&self) -> Option<Cow<'_, [u8]>> {
        hostcalls::get_property(vec!["xds", "route_name"])
            .ok()
            .flatten()
            .map(Cow::Owned)
    }
}

impl Log for EnvoyRequest {
    fn log(&self, level: LogLevel, message: &str) {
        EnvoyHost.log(level, message);
    }
}

impl HttpRequest for EnvoyRequest {
    fn set_decision_record(&mut self, record: &str) -> Result<(), HostError> {
        hostcalls::set_property(vec![RECORD_KEY], Some(record.as_bytes())).map_err(host_error)
    }

    fn add_request_header(&mut self, name: &str, value: &str) -> Result<(), HostError> {
        hostcalls::add_map_value(MapType::HttpRequestHeaders, name, value).map_err(host_error)
    }

    fn send_rejection(&mut self, response: &RejectResponse) -> Result<(), HostError> {
        let headers = response
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        hostcalls::send_http_response(u32::from(REJECT_STATUS), headers, Some(&response.body))
            .map_err(host_error)
    }

    fn response_status(&self) -> Option<Cow<'_, [u8]>> {
        hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, ":status")
            .ok()
            .flatten()
            .map(Cow::Owned)
    }

    fn clock_ns(&self) -> Option<u64> {
        let now = hostcalls::get_current_time().ok()?;
        u64::try_from(now.duration_since(UNIX_EPOCH).ok()?.as_nanos()).ok()
    }

    fn metadata_number(&self, namespace: &str, key: &str) -> Option<f64> {
        let bytes = hostcalls::get_property(vec!["metadata", "filter_metadata", namespace, key])
            .ok()
            .flatten()?;
        metadata_number_of(&bytes)
    }

    fn response_header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name)
            .ok()
            .flatten()
            .map(Cow::Owned)
    }

    fn response_trailer(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        hostcalls::get_map_value_bytes(MapType::HttpResponseTrailers, name)
            .ok()
            .flatten()
            .map(Cow::Owned)
    }
}

/// A metadata value as Envoy's `get_property` serialises it: a number as
/// the 8 bytes of an f64 (little-endian, as wasm is); a string holding a
/// decimal number as its text, which is what it is taken for whenever every
/// byte is a digit, a sign or a point.
fn metadata_number_of(bytes: &[u8]) -> Option<f64> {
    let textual = !bytes.is_empty()
        && bytes
            .iter()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'));
    if textual {
        return std::str::from_utf8(bytes).ok()?.parse().ok();
    }
    let raw: [u8; 8] = bytes.try_into().ok()?;
    Some(f64::from_le_bytes(raw))
}

#[cfg(test)]
mod tests {
    use super::metadata_number_of;

    #[test]
    fn metadata_numbers_are_read_as_envoy_serialises_them() {
        assert_eq!(metadata_number_of(&157.0f64.to_le_bytes()), Some(157.0));
        assert_eq!(metadata_number_of(b"157"), Some(157.0));
        assert_eq!(metadata_number_of(b"12345678"), Some(12_345_678.0));
        assert_eq!(metadata_number_of(b"abc"), None);
        assert_eq!(metadata_number_of(b""), None);
    }
}
