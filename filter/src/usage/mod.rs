//! The token usage of LLM responses, read from the body as it streams past
//! (OpenAI, Anthropic, Gemini; JSON or server-sent events), and the rule
//! that turns a usage or an estimate into a charge. Pure: no host calls,
//! bounded memory per stream, nothing on the request path yet.

pub mod cost;
pub mod parser;
mod scanner;

pub use cost::{Charge, ChargeSource, CostRule, CostRuleError, Estimate, WithoutUsage};
pub use parser::{Format, Outcome, UsageParser};

/// Token counts of one response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, the cached ones included.
    pub input: u64,
    /// Of `input`, those read from the provider's prompt cache.
    pub cached_input: u64,
    /// Generated tokens (reasoning included).
    pub output: u64,
    /// The total the provider reported, or `input + output`.
    pub total: u64,
}
