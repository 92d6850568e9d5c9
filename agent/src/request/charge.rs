//! A costed request from its decision to its stream's end: the little it
//! keeps between the hooks (its cell, its rule, its estimate, the body
//! parser when the rule reads the body) and the charge its end settles,
//! read from the first source that has one: dynamic metadata, a response
//! header, a response trailer, the body's usage; else the estimate (or the
//! configured amount), never zero. A request that ends without a 2xx
//! response (client abort, reset, error answer) is charged that way too.

use crate::request::classify::RequestAttributes;
use crate::request::handler::HttpRequest;
use crate::usage::rules::{CostRoute, cost_of_number, cost_of_text};
use crate::usage::{Charge, ChargeSource, Estimate, UsageParser};

/// What a host keeps of an admitted request with a cost rule, from its
/// request headers to its stream's end.
#[derive(Debug, Clone)]
pub struct PendingCharge {
    /// The cell it was counted in.
    pub(crate) key: String,
    /// Its rule in the configuration's [`crate::usage::rules::CostRules`].
    pub(crate) rule: usize,
    /// Its estimate, counted as offered (and admitted) cost.
    pub(crate) estimate: u64,
    /// The body's usage so far, when the rule reads the body.
    pub(crate) parser: Option<UsageParser>,
}

impl PendingCharge {
    /// Its estimate.
    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    /// Reads the next chunk of the response body (nothing if the rule does
    /// not read the body). Never holds more than the rule's cap.
    pub fn feed_body(&mut self, chunk: &[u8]) {
        if let Some(parser) = &mut self.parser {
            parser.feed(chunk);
        }
    }

    /// Whether the host needs to hand over the response body's chunks.
    pub fn reads_body(&self) -> bool {
        self.parser.is_some()
    }
}

/// The charge of a stream that ended: from the first source of `route`'s
/// that has a cost, else its estimate (or the configured amount).
pub fn settle(route: &CostRoute, pending: &PendingCharge, end: &impl HttpRequest) -> Charge {
    let without_usage = route.rule.charge(None, pending.estimate);
    let succeeded = end
        .response_status()
        .is_some_and(|status| status.len() == 3 && status.first() == Some(&b'2'));
    if !succeeded {
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
    if let Some(usage) = pending.parser.as_ref().and_then(UsageParser::usage) {
        return route
            .rule
            .charge(Some((usage, ChargeSource::Body)), pending.estimate);
    }
    without_usage
}

/// The estimate of a request of `route`, from its headers (the rule's
/// header, or `content-length` for its size).
pub(crate) fn estimate_of(route: &CostRoute, request: &impl RequestAttributes) -> u64 {
    match route.rule.estimate_source() {
        Estimate::Constant(value) => value.get(),
        Estimate::RequestHeader { name, .. } => {
            route.rule.estimate(request.header(name).as_deref(), 0)
        }
        Estimate::RequestSize { .. } => {
            let bytes = request
                .header("content-length")
                .and_then(|value| std::str::from_utf8(&value).ok()?.trim().parse::<u64>().ok())
                .unwrap_or(0);
            route.rule.estimate(None, bytes)
        }
    }
}
