//! The token counts one response reported.

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
