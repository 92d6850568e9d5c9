//! The token usage of LLM responses, read from the body as it streams past
//! (OpenAI, Anthropic, Gemini; JSON or server-sent events), and the rule
//! that turns a usage or an estimate into a charge. Pure: no host calls,
//! bounded memory per stream; the request path applies them
//! ([`crate::request::charge`]).

pub mod cost;
pub mod parser;
pub mod rules;
mod scanner;
mod tokens;

pub use cost::{Charge, ChargeSource, CostRule, CostRuleError, Estimate, WithoutUsage};
pub use parser::{Format, Outcome, UsageParser};
pub use tokens::Usage;
