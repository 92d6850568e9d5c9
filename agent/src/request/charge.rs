//! A costed request from its decision to its stream's end: the little it
//! keeps between the hooks (its cell, its rule, its estimate, the body
//! parser when the rule reads the body, whether its response ended); the
//! handler settles its charge from it ([`crate::request::handler::stream_end`]).

use crate::request::classify::RequestAttributes;
use crate::usage::rules::CostRoute;
use crate::usage::{Charge, ChargeSource, Estimate, UsageParser};

/// What a host keeps of an admitted request with a cost rule, from its
/// request headers to its stream's end.
#[derive(Debug, Clone)]
pub struct PendingCharge {
    /// The cell it was counted in.
    pub(crate) key: String,
    /// Its rule in the configuration's [`crate::usage::rules::CostRules`].
    pub(crate) rule: usize,
    /// Its estimate as counted in offered (and admitted) cost.
    pub(crate) estimate: u64,
    /// Its estimate within the budget's bound: a usage above `estimate`
    /// is counted the rest, up to this, when the stream ends.
    pub(crate) claimed: u64,
    /// The body's usage so far, when the rule reads the body.
    pub(crate) parser: Option<UsageParser>,
    /// Whether a chunk of the response body arrived.
    pub(crate) body_started: bool,
    /// Whether the response arrived to its end (its last body chunk or
    /// its trailers).
    pub(crate) complete: bool,
}

impl PendingCharge {
    /// Its estimate.
    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    /// What a stream's `charge` adds to its cell's offered and admitted
    /// cost when it ends: the part of a reported usage above what the
    /// request was counted, up to its claimed estimate. A request counted
    /// at the estimate cap is so counted whole, only later; a claim the
    /// usage shows false adds nothing; a charge without a usage (the
    /// estimate, or the configured amount) adds nothing either.
    pub(crate) fn uncounted_usage(&self, charge: Charge) -> u64 {
        if charge.source == ChargeSource::Estimate {
            return 0;
        }
        charge.cost.min(self.claimed).saturating_sub(self.estimate)
    }

    /// Its rule's index.
    pub(crate) fn rule(&self) -> usize {
        self.rule
    }

    /// Whether its response's body started but never ended (the upstream
    /// reset it, the client went away).
    pub(crate) fn was_cut(&self) -> bool {
        self.body_started && !self.complete
    }

    /// The body's usage so far, when the rule reads the body.
    pub(crate) fn body_usage(&self) -> Option<crate::usage::Usage> {
        self.parser.as_ref().and_then(UsageParser::usage)
    }

    /// Reads the next chunk of the response body (nothing if the rule does
    /// not read the body), the last one if `end_of_stream`. Never holds
    /// more than the rule's cap.
    pub fn feed_body(&mut self, chunk: &[u8], end_of_stream: bool) {
        self.body_started = true;
        self.complete |= end_of_stream;
        if let Some(parser) = &mut self.parser {
            parser.feed(chunk);
        }
    }

    /// The response's trailers arrived: the response is complete.
    pub fn trailers_arrived(&mut self) {
        self.complete = true;
    }

    /// Whether the host needs to hand over the response body's chunks.
    pub fn reads_body(&self) -> bool {
        self.parser.is_some()
    }
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
