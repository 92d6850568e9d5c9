//! The per-request filter: classify the request into its cell, decide,
//! answer with the cell's prepared 429 or continue. Reads only the headers
//! the classification names; never touches shared data or the network.
//!
//! One admitted request in `upstream_sample_every` is followed to its
//! response headers: two clock reads and the `:status` read, for the
//! upstream signals ([`sluice_agent::upstream`]).
//!
//! Two more host calls when configured and only for the requests they
//! concern: the decision's record as `wasm.sluice` filter state (proxy-wasm
//! cannot write Envoy's dynamic metadata: `set_property` is Envoy's only
//! per-request write, and it lands in filter state, which access logs read
//! with `%FILTER_STATE(wasm.sluice:PLAIN)%`), and the undirected header on
//! a request passed upstream without a fresh directive.

use crate::envoy_host::log;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel, MapType};
use sluice_agent::agent::Agent;
use sluice_agent::config::RequestPolicy;
use sluice_agent::request::attributes::RequestAttributes;
use sluice_agent::request::reject::RejectResponse;
use sluice_agent::upstream::status_of;
use sluice_core::decision::Decision;
use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::SystemTime;

pub(super) struct SluiceHttp {
    pub agent: Rc<RefCell<Agent>>,
    pub policy: Rc<RequestPolicy>,
    /// A request followed to its response: its bucket and when its
    /// headers arrived.
    pub followed: Option<(String, Option<SystemTime>)>,
}

impl Context for SluiceHttp {}

impl HttpContext for SluiceHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        // The agent is never borrowed across host callbacks, so this cannot
        // fail; if it somehow did, the request passes.
        let rejection = match self.agent.try_borrow_mut() {
            Ok(mut agent) => {
                let decision = agent.admit_request(&self.policy.classifier, &EnvoyRequest);
                self.note(&mut agent, &decision);
                if decision.admits()
                    && let Some(bucket) = agent.follow_response()
                {
                    self.followed = Some((bucket, hostcalls::get_current_time().ok()));
                }
                agent.rejection().cloned()
            }
            Err(_) => None,
        };
        let Some(response) = rejection else {
            return Action::Continue;
        };
        let response: &RejectResponse = &response;
        let headers = response
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        match hostcalls::send_http_response(429, headers, Some(&response.body)) {
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

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.observe_response();
        Action::Continue
    }
}

impl SluiceHttp {
    /// The upstream's answer to a followed request: its status and the time
    /// since the request headers.
    fn observe_response(&mut self) {
        let Some((bucket, started)) = self.followed.take() else {
            return;
        };
        // Bytes, never `get_map_value`: the SDK unwraps its UTF-8 decoding,
        // and a panic would take the worker's VM down.
        let status = hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, ":status")
            .ok()
            .flatten();
        let status = status_of(status.as_deref());
        let latency_us = started.and_then(|started| {
            let now = hostcalls::get_current_time().ok()?;
            let elapsed = now.duration_since(started).ok()?;
            u64::try_from(elapsed.as_micros()).ok()
        });
        if let Ok(mut agent) = self.agent.try_borrow_mut() {
            agent.observe_response(&bucket, status, latency_us);
        }
    }

    /// Hands the decision's record to Envoy and flags an undirected request
    /// for upstream, as configured. A failing host call only costs the
    /// record or the flag: the decision stands.
    fn note(&self, agent: &mut Agent, decision: &Decision) {
        if self.policy.decision_record.records(decision) {
            let record = agent.last_record();
            if let Err(status) = hostcalls::set_property(vec![RECORD_KEY], Some(record.as_bytes()))
            {
                log(
                    LogLevel::Debug,
                    &format!("cannot record the decision: {status:?}"),
                );
            }
        }
        if decision.admits()
            && decision.source.is_undirected()
            && let Some(header) = self.policy.undirected_header.as_deref()
            && let Err(status) = hostcalls::add_map_value(
                MapType::HttpRequestHeaders,
                header,
                decision.source.name(),
            )
        {
            log(
                LogLevel::Debug,
                &format!("cannot flag the request upstream: {status:?}"),
            );
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

/// The current request, read through host calls on demand, as bytes: the
/// SDK's `get_map_value` unwraps its UTF-8 decoding, so a header value that
/// is not UTF-8 would trap the VM. What the bytes mean is decided outside
/// the binding ([`sluice_agent::request::attributes`]).
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
