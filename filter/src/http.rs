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
use proxy_wasm::types::{Action, MapType};
use sluice_agent::agent::Agent;
use sluice_agent::config::RequestPolicy;
use sluice_agent::host::{HostError, Log, LogLevel};
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
}
