//! One request handler for every host: a request's attributes in, its
//! effects out. The host implements [`HttpRequest`] over its own calls
//! (proxy-wasm host calls, the native module's Envoy callbacks, an
//! in-memory request in tests) and calls [`decide`], then [`answer`]; a
//! request picked for the upstream signals comes back at its response
//! through [`observe_response`]; a request a cost rule applies to passes
//! its response body through [`response_body`] and is charged at
//! [`stream_end`].
//!
//! What a decision leads to, in order: the decision's record when the
//! configured [`crate::request::record::RecordMode`] asks for it, the
//! undirected header on an admitted request no fresh directive decided,
//! the response to follow, and the cell's prepared 429 for a dropped
//! request. A failing effect costs only that effect: the decision stands,
//! and a 429 that cannot be sent lets the request pass.

use crate::agent::Agent;
use crate::config::RequestPolicy;
use crate::host::{HostError, Log, LogLevel};
use crate::request::charge::PendingCharge;
use crate::request::classify::RequestAttributes;
use crate::request::reject::RejectResponse;
use crate::upstream::status_of;
use crate::usage::rules::{CostRoute, cost_of_number, cost_of_text};
use crate::usage::{Charge, ChargeSource};
use std::borrow::Cow;
use std::sync::Arc;

/// Status of a dropped request.
pub const REJECT_STATUS: u16 = 429;

/// What the handler needs of the proxy for one request: its attributes
/// ([`RequestAttributes`]), the effects of its decision, a clock for a
/// followed request's latency and the log for an effect that failed.
pub trait HttpRequest: RequestAttributes + Log {
    /// Hands the decision's record to the proxy for access logs.
    fn set_decision_record(&mut self, record: &str) -> Result<(), HostError>;
    /// Adds a request header that goes upstream.
    fn add_request_header(&mut self, name: &str, value: &str) -> Result<(), HostError>;
    /// Answers the request with `response` and [`REJECT_STATUS`] instead
    /// of the upstream.
    fn send_rejection(&mut self, response: &RejectResponse) -> Result<(), HostError>;
    /// The response's `:status` value, in the response headers.
    fn response_status(&self) -> Option<Cow<'_, [u8]>>;
    /// Nanoseconds on the host's clock (any origin, one per process);
    /// `None` when the host cannot tell.
    fn clock_ns(&self) -> Option<u64>;
    /// A number in the request's dynamic metadata (namespace, key), read
    /// at the stream's end; `None` if absent or not a number.
    fn metadata_number(&self, namespace: &str, key: &str) -> Option<f64>;
    /// A response header's first value, read at the stream's end.
    fn response_header(&self, name: &str) -> Option<Cow<'_, [u8]>>;
    /// A response trailer's first value, read at the stream's end.
    fn response_trailer(&self, name: &str) -> Option<Cow<'_, [u8]>>;
}

/// Whether the proxy goes on with the request after its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadersAction {
    /// On to the next filter.
    Continue,
    /// The filter answered the request.
    Stop,
}

/// An admitted request followed to its response for the upstream signals,
/// held by the host's per-request state between the two hooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowedRequest {
    /// The bucket the request was decided in.
    pub bucket: String,
    /// When its request headers arrived ([`HttpRequest::clock_ns`]).
    pub started_ns: Option<u64>,
}

impl FollowedRequest {
    /// Microseconds from the request headers to `now_ns`; `None` when
    /// either reading is missing or the clock went back.
    pub fn latency_us(&self, now_ns: Option<u64>) -> Option<u64> {
        let elapsed = now_ns?.checked_sub(self.started_ns?)?;
        Some(elapsed / 1_000)
    }
}

/// The request headers are complete: classify, decide and carry out what
/// the decision leads to while the agent is at hand (record, header,
/// follow). Returns the 429 to send, if the request is dropped; the host
/// lets go of the agent before [`answer`] sends it, since a proxy may run
/// the response hooks of a local reply at once.
///
/// An admitted request a cost rule applies to comes back in `charge`, for
/// [`response_body`] and [`stream_end`]; a dropped one is charged nothing.
pub fn decide(
    agent: &mut Agent,
    policy: &RequestPolicy,
    request: &mut impl HttpRequest,
    followed: &mut Option<FollowedRequest>,
    charge: &mut Option<PendingCharge>,
) -> Option<Arc<RejectResponse>> {
    let decision = if policy.costs.is_empty() {
        agent.admit_request(&policy.classifier, request)
    } else {
        let (decision, pending) =
            agent.admit_costed_request(&policy.classifier, &policy.costs, request);
        *charge = pending;
        decision
    };
    if policy.decision_record.records(&decision)
        && let Err(err) = request.set_decision_record(agent.last_record())
    {
        request.log(
            LogLevel::Debug,
            &format!("cannot record the decision: {err}"),
        );
    }
    if decision.admits()
        && decision.source.is_undirected()
        && let Some(header) = policy.undirected_header.as_deref()
        && let Err(err) = request.add_request_header(header, decision.source.name())
    {
        request.log(
            LogLevel::Debug,
            &format!("cannot flag the request upstream: {err}"),
        );
    }
    if decision.admits()
        && let Some(bucket) = agent.follow_response()
    {
        *followed = Some(FollowedRequest {
            bucket,
            started_ns: request.clock_ns(),
        });
    }
    agent.rejection().cloned()
}

/// Sends the 429 [`decide`] returned, if any: the request stops there,
/// unless the proxy cannot send it, and then it passes.
pub fn answer(
    request: &mut impl HttpRequest,
    rejection: Option<Arc<RejectResponse>>,
) -> HeadersAction {
    let Some(response) = rejection else {
        return HeadersAction::Continue;
    };
    match request.send_rejection(&response) {
        Ok(()) => HeadersAction::Stop,
        Err(err) => {
            request.log(
                LogLevel::Warn,
                &format!("cannot send 429, letting the request pass: {err}"),
            );
            HeadersAction::Continue
        }
    }
}

/// The response headers of a request [`decide`] followed, read from the
/// host before the agent is at hand, so that waiting for it is not counted
/// as the upstream's latency; [`ObservedResponse::count`] then adds it to
/// the upstream signals ([`crate::upstream`]).
pub fn observe_response<'f>(
    followed: &'f FollowedRequest,
    response: &impl HttpRequest,
) -> ObservedResponse<'f> {
    ObservedResponse {
        bucket: &followed.bucket,
        status: status_of(response.response_status().as_deref()),
        latency_us: followed.latency_us(response.clock_ns()),
    }
}

/// What a followed request's response said: its HTTP status and the time
/// since its request headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObservedResponse<'f> {
    bucket: &'f str,
    status: u32,
    latency_us: Option<u64>,
}

impl ObservedResponse<'_> {
    /// Counts the response in the agent that followed its request.
    pub fn count(self, agent: &mut Agent) {
        agent.observe_response(self.bucket, self.status, self.latency_us);
    }
}

/// A chunk of the response body as it passes (the host never holds it),
/// the last one if `end_of_stream`: read for the usage when the request's
/// cost rule reads the body. The host hands over the chunk only if
/// [`PendingCharge::reads_body`], and calls this for every chunk, so that
/// a stream cut before its end is known as such.
pub fn response_body(charge: &mut Option<PendingCharge>, chunk: &[u8], end_of_stream: bool) {
    if let Some(pending) = charge {
        pending.feed_body(chunk, end_of_stream);
    }
}

/// The response's trailers arrived (its body, if any, is complete).
pub fn response_trailers(charge: &mut Option<PendingCharge>) {
    if let Some(pending) = charge {
        pending.trailers_arrived();
    }
}

/// The stream of a costed request ended: its charge, read from the host
/// ([`settle`]) before the agent is at hand;
/// [`SettledCharge::count`] adds it to the cell's charged cost.
pub fn stream_end(
    policy: &RequestPolicy,
    request: &impl HttpRequest,
    pending: PendingCharge,
) -> Option<SettledCharge> {
    let route = policy.costs.get(pending.rule())?;
    let charge = settle(route, &pending, request);
    Some(SettledCharge { pending, charge })
}

/// The charge of a stream that ended: from the first source of `route`'s
/// that has a cost, else its estimate (or the configured amount). A
/// response that is not 2xx, or whose body started but never ended (the
/// upstream reset it, the client went away), is charged the estimate
/// whatever it reported so far: a cut stream's partial usage (Anthropic's
/// first event carries one) is not what the provider bills.
fn settle(route: &CostRoute, pending: &PendingCharge, end: &impl HttpRequest) -> Charge {
    let without_usage = route.rule.charge(None, pending.estimate);
    let succeeded = end
        .response_status()
        .is_some_and(|status| status.len() == 3 && status.first() == Some(&b'2'));
    if !succeeded || pending.was_cut() {
        return without_usage;
    }
    let actual = &route.actual;
    let reported = |cost: Option<u64>, source| cost.map(|cost| Charge { cost, source });
    if let Some(metadata) = &actual.metadata
        && let Some(charge) = reported(
            end.metadata_number(&metadata.namespace, &metadata.key)
                .and_then(cost_of_number),
            ChargeSource::Metadata,
        )
    {
        return charge;
    }
    if let Some(name) = &actual.response_header
        && let Some(charge) = reported(
            end.response_header(name)
                .and_then(|value| cost_of_text(&value)),
            ChargeSource::Header,
        )
    {
        return charge;
    }
    if let Some(name) = &actual.response_trailer
        && let Some(charge) = reported(
            end.response_trailer(name)
                .and_then(|value| cost_of_text(&value)),
            ChargeSource::Trailer,
        )
    {
        return charge;
    }
    if let Some(usage) = pending.body_usage() {
        return route
            .rule
            .charge(Some((usage, ChargeSource::Body)), pending.estimate);
    }
    without_usage
}

/// A stream's charge, to be counted in the agent that decided its request.
#[derive(Debug, Clone)]
pub struct SettledCharge {
    pending: PendingCharge,
    charge: Charge,
}

impl SettledCharge {
    /// The amount and its source.
    pub fn charge(&self) -> Charge {
        self.charge
    }

    /// Counts it in the agent.
    pub fn count(self, agent: &mut Agent) {
        agent.charge(&self.pending, self.charge);
    }
}

#[cfg(test)]
mod cost_tests;
#[cfg(test)]
mod tests;
