//! The per-request filter: derive the bucket, flip the coin, answer 429 or
//! continue. Reads only the headers the bucket key names; never touches
//! shared data, the clock or the network.

use super::envoy_host::log;
use crate::agent::Agent;
use crate::bucket_key::{BucketKeySpec, RequestAttributes};
use crate::decision::Verdict;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel, MapType};
use std::cell::RefCell;
use std::rc::Rc;

const RESPONSE_BODY: &[u8] = b"rate limited: cluster overload\n";

/// What every request of a plugin shares, fixed at configuration time.
#[derive(Debug)]
pub(super) struct RequestPolicy {
    pub bucket_key: BucketKeySpec,
    /// The `retry-after` header value, formatted once.
    pub retry_after: String,
}

pub(super) struct SluiceHttp {
    pub agent: Rc<RefCell<Agent>>,
    pub policy: Rc<RequestPolicy>,
}

impl Context for SluiceHttp {}

impl HttpContext for SluiceHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let bucket = self.policy.bucket_key.derive(&EnvoyRequest);
        // The agent is never borrowed across host callbacks, so this cannot
        // fail; if it somehow did, the request passes.
        let verdict = match self.agent.try_borrow_mut() {
            Ok(mut agent) => agent.admit(&bucket),
            Err(_) => Verdict::Admit,
        };
        if verdict == Verdict::Admit {
            return Action::Continue;
        }
        let headers = vec![
            ("retry-after", self.policy.retry_after.as_str()),
            ("x-ratelimit-reason", "cluster_overload"),
            ("content-type", "text/plain"),
        ];
        match hostcalls::send_http_response(429, headers, Some(RESPONSE_BODY)) {
            Ok(()) => Action::Pause,
            Err(status) => {
                log(
                    LogLevel::Warn,
                    &format!("cannot send 429, letting the request pass: {status:?}"),
                );
                Action::Continue
            }
        }
    }
}

/// A root context that could not be configured still has to hand Envoy an
/// HTTP context; this one lets everything through.
pub(super) struct PassThrough;

impl Context for PassThrough {}
impl HttpContext for PassThrough {}

/// The current request, read through host calls on demand.
struct EnvoyRequest;

impl RequestAttributes for EnvoyRequest {
    fn header(&self, name: &str) -> Option<String> {
        hostcalls::get_map_value(MapType::HttpRequestHeaders, name)
            .ok()
            .flatten()
    }

    fn route_name(&self) -> Option<String> {
        let bytes = hostcalls::get_property(vec!["xds", "route_name"])
            .ok()
            .flatten()?;
        String::from_utf8(bytes).ok()
    }
}
